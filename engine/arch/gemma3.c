/* arch/gemma3.c - Gemma 3: per-head q/k norms, a norm after the attention
 * output and after the FFN output (before each residual add), GELU through
 * llama.cpp's fp16 table; its sliding-window layers and their RoPE base are
 * the config's (the executor's attention) (llama.cpp src/models/gemma3.cpp). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_gemma3(jlm_prog *p, int moe)
{
    p->family = "gemma3";
    jlm_prog_attn_part(p, &(jlm_prog_attn){.qk_norm = 1, .post_norm = JLM_R_POST_ATTN_NORM});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .post_norm = JLM_R_POST_FFW_NORM,
                                         .act = JLM_ACT_GELU_FP16, .route = JLM_K_ROUTE_NORM},
                      moe);
}
