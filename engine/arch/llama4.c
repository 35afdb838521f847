/* arch/llama4.c - Llama 4 (code 1 with MoEStep > 0, docs/format.md):
 * llama attention whose RoPE layers end with a weightless q/k RMS norm and
 * whose every SWAPeriod-th layer has neither (exec_attn.c: qk_unit, n_rot 0);
 * MoE blocks run the shared expert and the top-1 routed expert, the router's
 * sigmoid weight multiplying that expert's input (llama.cpp
 * src/models/llama4.cpp, build_moe_ffn's weight_before_ffn). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_llama4(jlm_prog *p, int moe)
{
    p->family = "llama4";
    jlm_prog_attn_part(p, &(jlm_prog_attn){0});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .act = JLM_ACT_SWIGLU, .route = JLM_ROUTE_SIGMOID_IN,
                                         .shared = 1},
                      moe);
}
