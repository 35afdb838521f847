/* arch/phi3.c - Phi-3: Llama's block (the converter splits the fused q/k/v
 * and gate/up; no sliding window, as llama.cpp b10359) (llama.cpp
 * src/models/phi3.cpp). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_phi3(jlm_prog *p, int moe)
{
    p->family = "phi3";
    jlm_prog_attn_part(p, &(jlm_prog_attn){0});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .act = JLM_ACT_SWIGLU, .route = JLM_K_ROUTE_NORM},
                      moe);
}
