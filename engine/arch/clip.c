/* arch/clip.c - the vision tower's block (SigLIP / CLIP style, as
 * llama.cpp's clip graph): LayerNorm with bias before attention and MLP,
 * q/k/v/o projections with biases, full self-attention over the patches,
 * an MLP up + GELU (ggml's fp16 table, or quick GELU) + down with biases.
 * Run by the vision tower's executor (engine/vision.c). */
#include "engine/prog.h"

#include "format/jlm_format.h"

void jlm_arch_clip(jlm_prog *p, int quick_gelu)
{
    p->family = "clip";
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_LAYERNORM, .dst = JLM_B_H, .src = JLM_B_X, .w = {JLM_R_V_LN1, JLM_R_V_LN1_B}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_Q, .src = JLM_B_H,
                            .w = {JLM_R_V_ATTN_Q, JLM_R_V_ATTN_Q_B}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_K, .src = JLM_B_H,
                            .w = {JLM_R_V_ATTN_K, JLM_R_V_ATTN_K_B}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_V, .src = JLM_B_H,
                            .w = {JLM_R_V_ATTN_V, JLM_R_V_ATTN_V_B}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_SELF_ATTN, .dst = JLM_B_ATT, .src = JLM_B_Q});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_O, .src = JLM_B_ATT,
                            .w = {JLM_R_V_ATTN_OUT, JLM_R_V_ATTN_OUT_B}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_RESIDUAL, .dst = JLM_B_X, .src = JLM_B_O});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_LAYERNORM, .dst = JLM_B_H, .src = JLM_B_X, .w = {JLM_R_V_LN2, JLM_R_V_LN2_B}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_G, .src = JLM_B_H,
                            .w = {JLM_R_V_FFN_UP, JLM_R_V_FFN_UP_B}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_ACT, .dst = JLM_B_G, .act = quick_gelu ? JLM_ACT_GELU_QUICK : JLM_ACT_GELU});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_O, .src = JLM_B_G,
                            .w = {JLM_R_V_FFN_DOWN, JLM_R_V_FFN_DOWN_B}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_RESIDUAL, .dst = JLM_B_X, .src = JLM_B_O});
}
