/* arch/gpt_oss.c - gpt-oss: q/k/v/o biases, attention sinks, its pre-FFN
 * norm named post_attention_norm, SwiGLU-OAI (alpha 1.702, limit 7) with
 * expert biases, the router's top-k of the logits then a softmax of those
 * k; SWA on even layers and YaRN RoPE are the config's (llama.cpp
 * src/models/openai-moe-iswa.cpp). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_gpt_oss(jlm_prog *p, int moe)
{
    p->family = "gpt-oss";
    jlm_prog_attn_part(p, &(jlm_prog_attn){.sinks = 1});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .norm_alt = JLM_R_POST_ATTN_NORM,
                                         .act = JLM_ACT_SWIGLU_OAI, .route = JLM_K_ROUTE_OAI},
                      moe);
}
