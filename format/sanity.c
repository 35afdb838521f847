/* sanity.c - untrusted sizes (docs/security.md): bounds on every config
 * dimension and the relations between the config and the tensor shapes that
 * the planner and the engine's graph rely on. Run at conversion (before the
 * planner allocates anything) and again at container open, so a crafted GGUF
 * or an altered container is refused with the field named instead of sizing
 * an allocation, a stack array or a kernel buffer. */
#include "format/jlm_format.h"

#include <stdio.h>

#define ROLE_VISION_FIRST 64
#define ROLE_VISION_LAST  93

/* ---------------------------------------------------------------- config bounds */
typedef struct bound { const char *name; uint32_t v, max; } bound;

/* The relations between the MoE and MLA fields (deepseek2, glm4moe, llama4):
 * a count that names more layers, groups or ranks than exist is refused with
 * the field named, before any of it sizes a loop or a buffer. */
static int config_relations(const jlm_config *k, const char *what, jlm_err *err)
{
#define REFUSE(...) return jlm_errf(err, JLM_EFORMAT, __VA_ARGS__)
    if (k->n_dense_lead > k->n_layer)
        REFUSE("%s: config: n_dense_lead %u exceeds the %u blocks", what, k->n_dense_lead, k->n_layer);
    if (k->n_dense_lead && !k->n_expert)
        REFUSE("%s: config: n_dense_lead %u without experts", what, k->n_dense_lead);
    if (k->moe_step && (!k->n_expert || k->moe_step > k->n_layer))
        REFUSE("%s: config: moe_step %u with %u experts and %u blocks", what, k->moe_step, k->n_expert, k->n_layer);
    if (k->n_expert_group_used && !k->n_expert_group)
        REFUSE("%s: config: n_expert_group_used %u without n_expert_group", what, k->n_expert_group_used);
    if (k->n_expert_group) {
        if (!k->n_expert || k->n_expert % k->n_expert_group)
            REFUSE("%s: config: n_expert_group %u does not divide the %u experts", what, k->n_expert_group,
                   k->n_expert);
        if (!k->n_expert_group_used || k->n_expert_group_used > k->n_expert_group)
            REFUSE("%s: config: n_expert_group_used %u of %u groups", what, k->n_expert_group_used,
                   k->n_expert_group);
        if (k->n_expert_used > k->n_expert / k->n_expert_group * k->n_expert_group_used)
            REFUSE("%s: config: n_expert_used %u exceeds the experts of %u kept groups", what, k->n_expert_used,
                   k->n_expert_group_used);
    }
    if ((k->q_lora_rank || k->kv_lora_rank) && k->arch != JLM_ARCH_DEEPSEEK2)
        REFUSE("%s: config: q_lora_rank / kv_lora_rank (latent attention) on architecture %s", what,
               jlm_fmt_arch_name(k->arch));
    if (k->q_lora_rank && !k->kv_lora_rank)
        REFUSE("%s: config: q_lora_rank %u without kv_lora_rank", what, k->q_lora_rank);
    if (k->kv_lora_rank && (k->n_rot == 0 || k->n_rot >= k->head_dim))
        REFUSE("%s: config: kv_lora_rank %u needs 0 < n_rot %u < head_dim %u", what, k->kv_lora_rank, k->n_rot,
               k->head_dim);
    return JLM_OK;
#undef REFUSE
}

int jlm_fmt_config_bounds(const jlm_config *k, const char *what, jlm_err *err)
{
    const bound b[] = {
        {"n_layer", k->n_layer, JLM_MAX_LAYERS}, {"n_embd", k->n_embd, JLM_MAX_DIM},
        {"n_head", k->n_head, JLM_MAX_HEADS}, {"n_kv_head", k->n_kv_head, JLM_MAX_HEADS},
        {"head_dim", k->head_dim, JLM_MAX_HEAD_DIM}, {"head_dim_v", k->head_dim_v, JLM_MAX_HEAD_DIM},
        {"n_rot", k->n_rot, JLM_MAX_HEAD_DIM}, {"n_ffn", k->n_ffn, JLM_MAX_DIM},
        {"n_ffn_exp", k->n_ffn_exp, JLM_MAX_DIM}, {"n_ffn_shexp", k->n_ffn_shexp, JLM_MAX_DIM},
        {"n_vocab", k->n_vocab, JLM_MAX_VOCAB}, {"n_expert", k->n_expert, JLM_MAX_EXPERTS},
        {"n_expert_used", k->n_expert_used, JLM_MAX_EXPERTS_USED},
        {"head_dim_swa", k->head_dim_swa, JLM_MAX_HEAD_DIM},
        {"n_kv_head_swa", k->n_kv_head_swa, JLM_MAX_HEADS}, {"n_rot_swa", k->n_rot_swa, JLM_MAX_HEAD_DIM},
        {"ple_dim", k->ple_dim, JLM_MAX_DIM}, {"ssm_inner", k->ssm_inner, JLM_MAX_DIM},
        {"ssm_state", k->ssm_state, JLM_MAX_DIM}, {"ssm_n_head_v", k->ssm_n_head_v, JLM_MAX_HEADS},
        {"ssm_groups", k->ssm_groups, JLM_MAX_HEADS}, {"ssm_conv_kernel", k->ssm_conv_kernel, JLM_MAX_HEAD_DIM},
        {"q_lora_rank", k->q_lora_rank, JLM_MAX_DIM}, {"kv_lora_rank", k->kv_lora_rank, JLM_MAX_DIM},
    };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (b[i].v > b[i].max)
            return jlm_errf(err, JLM_ERANGE, "%s: config: %s is %u, at most %u is accepted", what, b[i].name,
                            b[i].v, b[i].max);
    return config_relations(k, what, err);
}

/* ---------------------------------------------------------------- shapes against the config */
typedef struct want {
    uint16_t role;
    uint64_t k, rows, sheets;   /* 0: not checked */
    uint64_t k2, rows2;         /* an accepted alternative (0: none) */
} want;

static int is_text_arch(uint16_t arch) { return arch != JLM_ARCH_NONE && arch != JLM_ARCH_CLIP; }

/* The shape the graph expects of one role, from the config; 0 if none is known. */
static int expect(const jlm_config *c, uint16_t role, want *w)
{
    uint64_t E = c->n_embd, hd = c->head_dim, hdv = c->head_dim_v ? c->head_dim_v : c->head_dim;
    /* SWA layers with their own head geometry (tail 4) are the accepted
     * alternative; 0 (no alternative) when the config has none. */
    int swa = c->head_dim_swa || c->n_kv_head_swa;
    uint64_t hds = c->head_dim_swa ? c->head_dim_swa : hd;
    uint64_t kvh_s = c->n_kv_head_swa ? c->n_kv_head_swa : c->n_kv_head;
    uint64_t q = (uint64_t)c->n_head * hd, qs = swa ? (uint64_t)c->n_head * hds : 0;
    uint64_t kv = (uint64_t)c->n_kv_head * hd, kvs = swa ? kvh_s * hds : 0, vv = (uint64_t)c->n_kv_head * hdv;
    int gate = (c->flags & JLM_F_ATTN_OUT_GATE) != 0;
    want x = {role, 0, 0, 0, 0, 0};
    switch (role) {
    case JLM_R_TOKEN_EMBD: case JLM_R_OUTPUT: x.k = E; x.rows = c->n_vocab; break;
    case JLM_R_OUTPUT_NORM: case JLM_R_ATTN_NORM: case JLM_R_FFN_NORM:
    case JLM_R_POST_ATTN_NORM: case JLM_R_POST_FFW_NORM: x.k = E; break;
    case JLM_R_ATTN_Q: x.k = E; x.rows = gate ? 2 * q : q; x.rows2 = gate ? 2 * qs : qs; break;
    case JLM_R_ATTN_K: x.k = E; x.rows = kv; x.rows2 = kvs; break;
    case JLM_R_ATTN_V: x.k = E; x.rows = vv; x.rows2 = kvs; break;
    case JLM_R_ATTN_OUT: x.k = (uint64_t)c->n_head * hdv; x.k2 = qs; x.rows = E; break;
    case JLM_R_ATTN_Q_B: x.k = gate ? 2 * q : q; x.k2 = qs; break;
    case JLM_R_ATTN_K_B: x.k = kv; x.k2 = kvs; break;
    case JLM_R_ATTN_V_B: x.k = vv; x.k2 = kvs; break;
    case JLM_R_ATTN_OUT_B: x.k = E; break;
    case JLM_R_ATTN_Q_NORM: x.k = hd; x.k2 = (c->flags & JLM_F_QK_NORM_WIDE) ? q : swa ? hds : 0; break;
    case JLM_R_ATTN_K_NORM: x.k = hd; x.k2 = (c->flags & JLM_F_QK_NORM_WIDE) ? kv : swa ? hds : 0; break;
    case JLM_R_ATTN_SINKS: x.k = c->n_head; break;
    case JLM_R_FFN_GATE: case JLM_R_FFN_UP: x.k = E; x.rows = c->n_ffn; break;
    case JLM_R_FFN_DOWN: x.k = c->n_ffn; x.rows = E; break;
    case JLM_R_ROUTER: x.k = E; x.rows = c->n_expert; break;
    case JLM_R_ROUTER_B: x.k = c->n_expert; break;
    case JLM_R_EXP_GATE: case JLM_R_EXP_UP: x.k = E; x.rows = c->n_ffn_exp; x.sheets = c->n_expert; break;
    case JLM_R_EXP_DOWN: x.k = c->n_ffn_exp; x.rows = E; x.sheets = c->n_expert; break;
    case JLM_R_EXP_GATE_B: case JLM_R_EXP_UP_B: x.k = c->n_ffn_exp; x.rows = c->n_expert; break;
    case JLM_R_EXP_DOWN_B: x.k = E; x.rows = c->n_expert; break;
    case JLM_R_SHEXP_GATE: case JLM_R_SHEXP_UP: x.k = E; x.rows = c->n_ffn_shexp; break;
    case JLM_R_SHEXP_DOWN: x.k = c->n_ffn_shexp; x.rows = E; break;
    case JLM_R_EXP_PROBS_B: x.k = c->n_expert; break;
    /* MLA: q through the q-LoRA, k and v through the latent (docs/format.md) */
    case JLM_R_ATTN_Q_A: x.k = E; x.rows = c->q_lora_rank; break;
    case JLM_R_ATTN_Q_A_NORM: x.k = c->q_lora_rank; break;
    case JLM_R_ATTN_Q_B_MAT: x.k = c->q_lora_rank; x.rows = q; break;
    case JLM_R_ATTN_KV_A_MQA: x.k = E; x.rows = (uint64_t)c->kv_lora_rank + c->n_rot; break;
    case JLM_R_ATTN_KV_A_NORM: x.k = c->kv_lora_rank; break;
    case JLM_R_ATTN_K_B_MAT: x.k = hd - c->n_rot; x.rows = c->kv_lora_rank; x.sheets = c->n_head; break;
    case JLM_R_ATTN_V_B_MAT: x.k = c->kv_lora_rank; x.rows = hdv; x.sheets = c->n_head; break;
    default: return 0;
    }
    *w = x;
    return 1;
}

static int dim_ok(uint64_t got, uint64_t a, uint64_t b) { return !a || got == a || (b && got == b); }

static int check_shape(const jlm_config *c, const jlm_tensor *t, const char *what, jlm_err *err)
{
    want w;
    if (!expect(c, t->role, &w))
        return JLM_OK;
    uint64_t k = jlm_tensor_k(t), rows = jlm_tensor_rows(t), sheets = jlm_tensor_sheets(t);
    const char *field = !dim_ok(k, w.k, w.k2) ? "width" : !dim_ok(rows, w.rows, w.rows2) ? "rows" :
                        !dim_ok(sheets, w.sheets, 0) ? "experts" : NULL;
    if (!field)
        return JLM_OK;
    uint64_t got = field[0] == 'w' ? k : field[0] == 'r' ? rows : sheets;
    uint64_t exp = field[0] == 'w' ? w.k : field[0] == 'r' ? w.rows : w.sheets;
    return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s' (%s): %s %llu disagrees with the config (expected %llu)",
                    what, t->name.s, jlm_fmt_role_name(t->role), field, (unsigned long long)got,
                    (unsigned long long)exp);
}

int jlm_fmt_shapes_check(const jlm_config *c, const jlm_tensor *ts, uint32_t n, const char *what, jlm_err *err)
{
    if (!is_text_arch(c->arch) || n == 0)
        return JLM_OK;
    if (c->n_rot > c->head_dim || c->n_rot % 2)
        return jlm_errf(err, JLM_EFORMAT, "%s: config: n_rot %u must be even and at most head_dim %u", what,
                        c->n_rot, c->head_dim);
    if (c->n_rot_swa && (c->n_rot_swa > (c->head_dim_swa ? c->head_dim_swa : c->head_dim) || c->n_rot_swa % 2))
        return jlm_errf(err, JLM_EFORMAT, "%s: config: n_rot_swa %u must be even and at most the SWA head dim", what,
                        c->n_rot_swa);
    if (n > JLM_MAX_TENSORS)
        return jlm_errf(err, JLM_ERANGE, "%s: %u tensors, at most %u are accepted", what, n, JLM_MAX_TENSORS);
    /* Every block has at least one tensor: a layer count out of proportion to
     * the tensors would otherwise size empty pages (a sparse container of any
     * size) and a KV cache for layers that do not exist. */
    uint8_t has[JLM_MAX_LAYERS / 8] = {0};
    for (uint32_t i = 0; i < n; i++) {
        const jlm_tensor *t = &ts[i];
        int rc = check_shape(c, t, what, err);
        if (rc)
            return rc;
        int text = t->block >= 0 && !(t->role >= ROLE_VISION_FIRST && t->role <= ROLE_VISION_LAST);
        if (text && (uint32_t)t->block < c->n_layer && (uint32_t)t->block < JLM_MAX_LAYERS)
            has[t->block / 8] |= (uint8_t)(1u << (t->block % 8));
    }
    for (uint32_t b = 0; b < c->n_layer && b < JLM_MAX_LAYERS; b++)
        if (!(has[b / 8] & (1u << (b % 8))))
            return jlm_errf(err, JLM_EFORMAT, "%s: config: n_layer is %u but block %u has no tensor", what,
                            c->n_layer, b);
    return JLM_OK;
}
