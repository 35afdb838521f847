/* arch/qwen3.c - Qwen3 and Qwen3-MoE: per-head q/k RMS norms before RoPE;
 * experts routed as Mixtral (llama.cpp src/models/qwen3.cpp, qwen3moe.cpp). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_qwen3(jlm_prog *p, int moe)
{
    p->family = "qwen3";
    jlm_prog_attn_part(p, &(jlm_prog_attn){.qk_norm = 1});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .act = JLM_ACT_SWIGLU, .route = JLM_K_ROUTE_NORM},
                      moe);
}
