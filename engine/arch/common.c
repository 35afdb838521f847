/* arch/common.c - what the family files share (engine/prog.h): the op
 * builder, the attention half and the FFN half of a block with what differs
 * between families as parameters, the op names and the family table. */
#include "engine/prog.h"

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

void jlm_prog_op(jlm_prog *p, jlm_op op)
{
    if (p->n < JLM_PROG_MAX)
        p->op[p->n] = op;
    p->n++;
}

/* Every family's attention: the biases are optional operands (llama.cpp
 * reads bq/bk/bv/bo where a file has them); the q/k norms and sinks are the
 * family's. */
void jlm_prog_attn_part(jlm_prog *p, const jlm_prog_attn *a)
{
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_NORM, .dst = JLM_B_H, .src = JLM_B_X, .w = {JLM_R_ATTN_NORM}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_QKV, .src = JLM_B_H,
                            .w = {JLM_R_ATTN_Q, JLM_R_ATTN_K, JLM_R_ATTN_V}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_KV_STORE, .flags = a->qk_flags,
                            .w = {JLM_R_ATTN_K_B, JLM_R_ATTN_V_B, a->qk_norm ? JLM_R_ATTN_K_NORM : 0}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_KEYS_DONE});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_Q, .dst = JLM_B_Q, .src = JLM_B_X, .w = {JLM_R_ATTN_NORM, JLM_R_ATTN_Q}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_Q_ROPE, .flags = a->qk_flags,
                            .w = {JLM_R_ATTN_Q_B, a->qk_norm ? JLM_R_ATTN_Q_NORM : 0}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_ATTENTION, .dst = JLM_B_ATT, .src = JLM_B_Q,
                            .w = {a->sinks ? JLM_R_ATTN_SINKS : 0}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_O, .src = JLM_B_ATT, .w = {JLM_R_ATTN_OUT}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_RESIDUAL, .dst = JLM_B_X, .src = JLM_B_O,
                            .w = {JLM_R_ATTN_OUT_B, a->post_norm}});
}

void jlm_prog_ffn_part(jlm_prog *p, const jlm_prog_ffn *f, int moe)
{
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_NORM, .dst = JLM_B_H, .src = JLM_B_X, .w = {f->norm, f->norm_alt}});
    if (moe && f->shared) {   /* before MOE, which may reuse h: x += the shared expert of h */
        jlm_prog_op(p, (jlm_op){.kind = JLM_OP_GATE_UP, .dst = JLM_B_G, .src = JLM_B_H, .act = f->act,
                                .w = {JLM_R_SHEXP_GATE, JLM_R_SHEXP_UP}});
        jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_O, .src = JLM_B_G, .w = {JLM_R_SHEXP_DOWN}});
        jlm_prog_op(p, (jlm_op){.kind = JLM_OP_RESIDUAL, .dst = JLM_B_X, .src = JLM_B_O});
    }
    if (moe) {
        jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MOE, .dst = JLM_B_X, .src = JLM_B_H, .act = f->act, .route = f->route,
                                .w = {JLM_R_ROUTER, JLM_R_EXP_GATE, JLM_R_EXP_UP, JLM_R_EXP_DOWN}});
        return;
    }
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_GATE_UP, .dst = JLM_B_G, .src = JLM_B_H, .act = f->act,
                            .w = {JLM_R_FFN_GATE, JLM_R_FFN_UP}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_MATMUL, .dst = JLM_B_O, .src = JLM_B_G, .w = {JLM_R_FFN_DOWN}});
    jlm_prog_op(p, (jlm_op){.kind = JLM_OP_RESIDUAL, .dst = JLM_B_X, .src = JLM_B_O, .w = {0, f->post_norm}});
}

const char *jlm_op_name(int kind)
{
    static const char *const names[JLM_OP_COUNT] = {
        [JLM_OP_NORM] = "norm", [JLM_OP_QKV] = "qkv", [JLM_OP_KV_STORE] = "kv_store",
        [JLM_OP_KEYS_DONE] = "keys_done", [JLM_OP_Q] = "q", [JLM_OP_Q_ROPE] = "q_rope",
        [JLM_OP_ATTENTION] = "attention", [JLM_OP_MATMUL] = "matmul", [JLM_OP_RESIDUAL] = "residual",
        [JLM_OP_GATE_UP] = "gate_up", [JLM_OP_MLA_KV] = "mla_kv", [JLM_OP_MLA_Q] = "mla_q", [JLM_OP_MLA_ATTN] = "mla_attn",
        [JLM_OP_MOE] = "moe", [JLM_OP_LAYERNORM] = "layernorm",
        [JLM_OP_SELF_ATTN] = "self_attn", [JLM_OP_ACT] = "act",
    };
    return kind >= 0 && kind < JLM_OP_COUNT ? names[kind] : "?";
}

int jlm_arch_program(uint16_t arch, int moe, jlm_prog *out, jlm_err *err)
{
    static const struct { uint16_t arch; void (*build)(jlm_prog *, int); } FAMILIES[] = {
        {JLM_ARCH_LLAMA, jlm_arch_llama},     {JLM_ARCH_QWEN2, jlm_arch_qwen2}, {JLM_ARCH_QWEN3, jlm_arch_qwen3},
        {JLM_ARCH_QWEN3MOE, jlm_arch_qwen3},  {JLM_ARCH_OLMOE, jlm_arch_olmoe}, {JLM_ARCH_GEMMA3, jlm_arch_gemma3},
        {JLM_ARCH_PHI3, jlm_arch_phi3},       {JLM_ARCH_GPTOSS, jlm_arch_gpt_oss},
        {JLM_ARCH_DEEPSEEK2, jlm_arch_glm4moe},   /* without latent attention (model_open.c refuses MLA) */
    };
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++) {
        if (FAMILIES[i].arch != arch)
            continue;
        *out = (jlm_prog){0};
        FAMILIES[i].build(out, moe);
        if (out->n > JLM_PROG_MAX)
            return jlm_errf(err, JLM_EFORMAT, "%s: a block program of %u ops (at most %d)", out->family, out->n,
                            JLM_PROG_MAX);
        return JLM_OK;
    }
    return jlm_errf(err, JLM_EFORMAT, "architecture %s: no block program (engine/arch/)", jlm_fmt_arch_name(arch));
}

int jlm_arch_program_for(const jlm_config *c, int moe, jlm_prog *out, jlm_err *err)
{
    int ds = c->arch == JLM_ARCH_DEEPSEEK2 && c->kv_lora_rank, l4 = c->arch == JLM_ARCH_LLAMA && c->moe_step;
    if (!ds && !l4)
        return jlm_arch_program(c->arch, moe, out, err);
    *out = (jlm_prog){0};
    (ds ? jlm_arch_deepseek2 : jlm_arch_llama4)(out, moe);
    return out->n > JLM_PROG_MAX ? jlm_errf(err, JLM_EFORMAT, "%s: a block program of %u ops", out->family, out->n)
                                 : JLM_OK;
}
