/* arch/deepseek2.c - DeepSeek V2/V3 (code 14 with KVLoraRank > 0):
 * multi-head latent attention in the absorbed form llama.cpp b10359 runs
 * (src/models/deepseek2.cpp): the latent and the shared RoPE key are cached,
 * each head attends over them (exec_mla.c). Leading dense blocks run the
 * dense program; MoE blocks a shared expert and the routed ones, routed as
 * glm4moe (JLM_ROUTE_SIGMOID: groups, the selection bias, norm, scale). The
 * norm before the queries is taken again after KEYS_DONE: the ops before it
 * run for every chunk of a batch first, so h does not survive them. */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_arch_deepseek2(jlm_prog *p, int moe)
{
    p->family = "deepseek2";
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_NORM, .dst = JLM_B_H, .src = JLM_B_X, .w = {JLM_R_ATTN_NORM}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MLA_KV, .src = JLM_B_H, .w = {JLM_R_ATTN_KV_A_MQA, JLM_R_ATTN_KV_A_NORM}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_KEYS_DONE});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_NORM, .dst = JLM_B_H, .src = JLM_B_X, .w = {JLM_R_ATTN_NORM}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MLA_Q, .dst = JLM_B_Q, .src = JLM_B_H,
                            .w = {JLM_R_ATTN_Q_A, JLM_R_ATTN_Q_A_NORM, JLM_R_ATTN_Q_B_MAT, JLM_R_ATTN_Q}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MLA_ATTN, .dst = JLM_B_ATT, .src = JLM_B_Q,
                            .w = {JLM_R_ATTN_K_B_MAT, JLM_R_ATTN_V_B_MAT}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_O, .src = JLM_B_ATT, .w = {JLM_R_ATTN_OUT}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_RESIDUAL, .dst = JLM_B_X, .src = JLM_B_O});
    jlm_prog_ffn_part(p, &(jlm_prog_ffn){.norm = JLM_R_FFN_NORM, .act = JLM_ACT_SWIGLU, .route = JLM_ROUTE_SIGMOID,
                                         .shared = 1},
                      moe);
}
