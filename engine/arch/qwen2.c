/* arch/qwen2.c - Qwen2: Llama's block with q/k/v biases (optional operands
 * of the attention half, read where the file has them), NeoX RoPE (the
 * config's flag) (llama.cpp src/models/qwen2.cpp). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_qwen2(jlm_prog *p, int moe)
{
    p->family = "qwen2";
    jlm_prog_attn_part(p, &(jlm_prog_attn){0});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .act = JLM_ACT_SWIGLU, .route = JLM_K_ROUTE_NORM},
                      moe);
}
