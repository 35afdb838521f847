/* arch/glm4moe.c - GLM-4.5 MoE (code 14 without latent attention,
 * docs/format.md): q/k/v biases and per-head q/k norms where the file has
 * them, partial NeoX RoPE (NRot < HeadDim, the kernels' rope), leading dense
 * blocks (no expert banks: the dense program), and in MoE blocks a shared
 * expert beside the routed ones, routed by sigmoid with the exp_probs_b
 * selection bias, renormalised and scaled (llama.cpp src/models/glm4-moe.cpp). */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_glm4moe(jlm_prog *p, int moe)
{
    p->family = "glm4moe";
    jlm_prog_attn_part(p, &(jlm_prog_attn){.qk_norm = 1});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .act = JLM_ACT_SWIGLU, .route = JLM_ROUTE_SIGMOID,
                                         .shared = 1},
                      moe);
}
