/* arch/llama.c - Llama (and Mixtral-style MoE): RMS norm, RoPE, SwiGLU;
 * experts: softmax over the router logits, top-k, weights renormalised
 * (llama.cpp src/models/llama.cpp). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_llama(jlm_prog *p, int moe)
{
    p->family = "llama";
    jlm_prog_attn_part(p, &(jlm_prog_attn){0});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .act = JLM_ACT_SWIGLU, .route = JLM_K_ROUTE_NORM},
                      moe);
}
