/* arch/olmoe.c - OLMoE: q/k RMS norms over the whole projection (not per
 * head), routing weights not renormalised over the top-k (llama.cpp
 * src/models/olmoe.cpp). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_olmoe(jlm_prog *p, int moe)
{
    p->family = "olmoe";
    jlm_prog_attn_part(p, &(jlm_prog_attn){.qk_norm = 1, .qk_flags = JLM_OPF_QK_WIDE});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .act = JLM_ACT_SWIGLU, .route = JLM_K_ROUTE_RAW},
                      moe);
}
