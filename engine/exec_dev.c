/* exec_dev.c - the walk of a block program on a device backend, shared by
 * exec_vk.c and exec_cu.c, and the MOE op's plan their exec_*_moe.c share
 * (exec_dev.h). */
#include "engine/exec_dev.h"

#include <stdlib.h>

#define UNSUP JLM_EUNSUPPORTED

uint64_t jlm_exd_width(const jlm_engine *e, int b)
{
    const jlm_config *c = e->c;
    switch (b) {
    case JLM_B_Q: return e->q_dim;
    case JLM_B_K: return e->kv_dim;
    case JLM_B_V: return e->kv_dim_v;
    case JLM_B_ATT: return (uint64_t)c->n_head * e->hd_v;
    case JLM_B_G: case JLM_B_U: return c->n_ffn;
    default: return c->n_embd;
    }
}

/* dst rows = src rows times m, the shapes checked against the buffers. The
 * gate's and up's rows (and so the down's input) may be narrower than the
 * buffers' n_ff (a shared expert's, glm4moe): the rows are then packed at
 * their own width, as the CPU packs them (the backends read and write n
 * rows of m->k and m->rows from a buffer's start). */
static int mm(jlm_exd *k, const jlm_k_mat *m, int src, int dst, int reuse)
{
    uint64_t ws = jlm_exd_width(k->e, src), wd = jlm_exd_width(k->e, dst);
    int narrow_in = src == JLM_B_G && m->k < ws, narrow_out = (dst == JLM_B_G || dst == JLM_B_U) && m->rows < wd;
    if ((m->k != ws && !narrow_in) || (m->rows != wd && !narrow_out))
        return UNSUP;
    return k->ops->mm(k, m, src, dst, reuse);
}

/* rows of b += the bias of role r (none: nothing) */
static int bias(jlm_exd *k, int b, uint16_t r)
{
    const float *p = blk_vec(k->e, &k->b, r);
    return p ? k->ops->bias(k, b, p) : JLM_OK;
}

static int run_op(jlm_exd *k, const jlm_op *op)
{
    jlm_engine *e = k->e;
    const jlm_ex_blk *b = &k->b;
    const jlm_exd_ops *o = k->ops;
    int rc;
    switch (op->kind) {
    case JLM_OP_NORM: {
        const float *p = blk_vec(e, b, op->w[0]);
        return o->norm(k, op->dst, op->src, p ? p : blk_vec(e, b, op->w[1]));
    }
    case JLM_OP_QKV: {
        const jlm_tensor *tq = blk_w(e, b, op->w[0]);
        jlm_k_mat wq, wk = blk_mat(e, b, op->w[1]), wv = blk_mat(e, b, op->w[2]);
        if (tq) {
            wq = blk_mat(e, b, op->w[0]);
            if ((rc = mm(k, &wq, op->src, JLM_B_Q, 0)))
                return rc;
        }
        k->q_ready = tq != NULL;
        rc = mm(k, &wk, op->src, JLM_B_K, tq != NULL);
        return rc ? rc : mm(k, &wv, op->src, JLM_B_V, 1);
    }
    case JLM_OP_KV_STORE:
        if ((rc = bias(k, JLM_B_K, op->w[0])) || (rc = bias(k, JLM_B_V, op->w[1])) ||
            (rc = o->heads(k, JLM_B_K, k->c->n_kv_head, blk_vec(e, b, op->w[2]), op->flags & JLM_OPF_QK_WIDE)))
            return rc;
        return o->kv_put(k);
    case JLM_OP_KEYS_DONE: return JLM_OK;   /* every row's keys are stored before any attends: op by op */
    case JLM_OP_Q: {
        if (k->q_ready)
            return JLM_OK;
        jlm_k_mat wq = blk_mat(e, b, op->w[1]);
        rc = o->norm(k, JLM_B_H, JLM_B_X, blk_vec(e, b, op->w[0]));
        return rc ? rc : mm(k, &wq, JLM_B_H, JLM_B_Q, 0);
    }
    case JLM_OP_Q_ROPE:
        rc = bias(k, JLM_B_Q, op->w[0]);
        return rc ? rc : o->heads(k, JLM_B_Q, k->c->n_head, blk_vec(e, b, op->w[1]), op->flags & JLM_OPF_QK_WIDE);
    case JLM_OP_ATTENTION: return o->attend(k, blk_vec(e, b, op->w[0]));   /* w[0]: the sinks, if any */
    case JLM_OP_MATMUL: {
        jlm_k_mat m = blk_mat(e, b, op->w[0]);
        rc = mm(k, &m, op->src, op->dst, 0);
        return rc ? rc : bias(k, op->dst, op->w[1]);
    }
    case JLM_OP_RESIDUAL: {
        const float *pn = blk_vec(e, b, op->w[1]);
        if (jlm_exd_width(e, op->src) != k->c->n_embd || jlm_exd_width(e, op->dst) != k->c->n_embd)
            return UNSUP;
        if ((rc = bias(k, op->src, op->w[0])) || (pn && (rc = o->norm(k, op->src, op->src, pn))))
            return rc;
        return o->add(k, op->dst, op->src);
    }
    case JLM_OP_GATE_UP: {
        jlm_k_mat wg = blk_mat(e, b, op->w[0]), wu = blk_mat(e, b, op->w[1]);
        if (op->act != JLM_ACT_SWIGLU && op->act != JLM_ACT_SWIGLU_OAI && op->act != JLM_ACT_GELU_FP16)
            return UNSUP;   /* the backend's act may refuse one of these too (dry) */
        if (wu.rows != wg.rows || (wg.rows != jlm_exd_width(e, JLM_B_G) && (blk_w(e, b, op->w[2]) || blk_w(e, b, op->w[3]))))
            return UNSUP;   /* narrow rows with biases: a bias op adds a buffer-wide row */
        if ((rc = mm(k, &wg, op->src, JLM_B_G, 0)) || (rc = mm(k, &wu, op->src, JLM_B_U, 1)) ||
            (rc = bias(k, JLM_B_G, op->w[2])) || (rc = bias(k, JLM_B_U, op->w[3])))
            return rc;
        return o->act(k, op->act, b->n * wg.rows);
    }
    case JLM_OP_MOE: return o->moe ? o->moe(k, op) : UNSUP;
    case JLM_OP_MLA_KV: case JLM_OP_MLA_Q: case JLM_OP_MLA_ATTN: return o->mla ? o->mla(k, op) : UNSUP;
    default: return UNSUP;   /* the vision tower's ops */
    }
}

int jlm_exd_run(jlm_exd *k)
{
    int rc = JLM_OK;
    k->q_ready = 0;
    for (uint32_t i = 0; i < k->b.p->n && !rc; i++) {
        if (!k->dry)
            jlm_dev_prof_op(k->dev, jlm_dev_op_class(k->b.p->op[i].kind));   /* --profile's op classes */
        rc = run_op(k, &k->b.p->op[i]);
    }
    return rc;
}

int jlm_exd_plan(jlm_exd *k, const jlm_exd_ops *ops, void *be, jlm_engine *e, const jlm_prog *p, uint32_t l,
                 const uint8_t *page, uint32_t n, void *kc, uint32_t pos0, uint8_t **side, const char *who,
                 jlm_err *err)
{
    const jlm_config *c = e->c;
    *k = (jlm_exd){.ops = ops, .be = be, .dev = be, .e = e, .c = c, .kc = kc, .pos0 = pos0, .dry = 1, .err = err,
                   .b = {.p = p, .l = l, .page = page,
                         .page_off = e->m->hdr.data_off + (uint64_t)l * e->m->hdr.page_size, .n = n}};
    if ((!ops->kv_any && ((e->kt != KV_F32 && e->kt != KV_F16) || e->vt != e->kt)) || (c->flags & JLM_F_NON_CAUSAL) ||
        !n)
        return UNSUP;
    for (uint32_t t = 0; c->kv_lora_rank && t < n; t++)
        if (jlm_exd_host(k, t) != e->kc)
            return UNSUP;   /* latent attention: a jlm_engine_seq's cache stays on the host */
    if (!*side && !(*side = calloc(c->n_layer, 1)))
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", who);
    /* the layer's cache holds positions on one side only: once decided, the plan must agree */
    int ok = jlm_exd_run(k) == JLM_OK;
    if ((*side)[l] == 0)
        (*side)[l] = ok ? 1 : 2;
    if ((*side)[l] == 2)
        return UNSUP;
    if (!ok)
        return jlm_errf(err, JLM_EIO, "%s: block %u can no longer run on the device (its KV cache is there)", who, l);
    return JLM_OK;
}

uint32_t jlm_exd_group(const jlm_exd *k, uint32_t t)
{
    uint32_t m = 1;
    while (t + m < k->b.n && jlm_exd_host(k, t + m) == jlm_exd_host(k, t))
        m++;
    return m;
}

jlm_exd_seqc *jlm_exd_seq_find(const jlm_exd_seqs *t, const void *host)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (t->c[i].host == host)
            return &t->c[i];
    return NULL;
}

int jlm_exd_seq_get(jlm_exd_seqs **tp, const void *host, uint32_t n_layer, size_t elem, jlm_exd_seqc **out,
                    const char *who, jlm_err *err)
{
    if (!*tp && !(*tp = calloc(1, sizeof **tp)))
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", who);
    jlm_exd_seqs *t = *tp;
    if ((*out = jlm_exd_seq_find(t, host)))
        return JLM_OK;
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 4;
        jlm_exd_seqc *c = realloc(t->c, cap * sizeof *c);
        if (!c)
            return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", who);
        t->c = c;
        t->cap = cap;
    }
    jlm_exd_seqc c = {host, calloc(n_layer ? n_layer : 1, elem), calloc(n_layer ? n_layer : 1, elem)};
    if (!c.kc || !c.vc) {
        free(c.kc);
        free(c.vc);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", who);
    }
    t->c[t->n] = c;
    *out = &t->c[t->n++];
    return JLM_OK;
}

void jlm_exd_seq_forget(jlm_exd_seqs *t, jlm_exd_seqc *c)
{
    free(c->kc);
    free(c->vc);
    *c = t->c[--t->n];
}

int jlm_exd_kv_xfer(const jlm_exd_kvx *x, void *be, jlm_exd_seqs *t, const uint8_t *side, jlm_dev_stats *st,
                    jlm_engine *e, void *kc, void *vc, uint32_t n, int up, jlm_err *err)
{
    jlm_exd_seqc *c = t ? jlm_exd_seq_find(t, kc) : NULL;
    int rc = x->sync(be, err);   /* what is recorded or queued may use the cache */
    if (!rc && c && up < 0)
        x->drop(be, c);
    if (rc || up < 0 || (!c && !up) || !n || e->c->kv_lora_rank || !side)
        return rc;   /* nothing here (latent attention's prefixes are not kept) */
    uint64_t kb = jlm_kv_row_bytes(e->kt, e->kv_dim) * n, vb = jlm_kv_row_bytes(e->vt, e->kv_dim_v) * n;
    for (uint32_t l = 0; !rc && l < e->c->n_layer; l++) {
        uint8_t *p;
        if (side[l] != 1 || (rc = x->cache(be, e, kc, l, err)) || (rc = x->stage(be, kb + vb, &p, err)))
            continue;
        if (up)
            jlm_kv_rows(e, kc, vc, l, 0, n, p, p + kb, 0);
        rc = x->copy(be, l, kb, vb, up, err);
        if (!rc && !up)
            jlm_kv_rows(e, kc, vc, l, 0, n, p, p + kb, 1);
        if (!rc)
            *(up ? &st->act_up : &st->act_down) += kb + vb;
    }
    return rc;
}

int jlm_exd_held(const float *xh, uint32_t x_rows, uint32_t x_E, uint64_t ab_rows, const float *x, uint32_t n,
                 uint32_t E, uint64_t *r0)
{
    if (!xh || E != x_E || n > ab_rows || x < xh || x + (uint64_t)n * E > xh + (uint64_t)x_rows * E)
        return 0;
    *r0 = (uint64_t)(x - xh) / E;
    return 1;
}

int jlm_exd_sheet_stride(uint64_t a0, uint64_t a1, uint64_t al, uint64_t n, uint64_t *st)
{
    if (!n || a1 < a0 || (a1 - a0) % 4 || al != a0 + (n - 1) * (a1 - a0))
        return 0;
    *st = a1 - a0;
    return 1;
}

/* A bank's shape (k x rows each expert); quantized types whole 32-blocks. */
static int bank_ok(const jlm_tensor *t, uint64_t k, uint64_t rows)
{
    return t && jlm_tensor_k(t) == k && jlm_tensor_rows(t) == rows &&
           (jlm_fmt_type_traits(t->type)->is_float || k % 32 == 0);
}

int jlm_exd_moe_plan(jlm_exd_moe *p, jlm_engine *e, const jlm_ex_blk *b, const jlm_op *op, jlm_err *err)
{
    const jlm_config *c = e->c;
    *p = (jlm_exd_moe){.e = e, .b = b, .op = op, .err = err, .E = c->n_embd, .ne = c->n_expert,
                       .nu = c->n_expert_used, .tg = blk_w(e, b, op->w[1]), .tu = blk_w(e, b, op->w[2]),
                       .td = blk_w(e, b, op->w[3])};
    if ((op->act != JLM_ACT_SWIGLU && op->act != JLM_ACT_SWIGLU_OAI) || !blk_w(e, b, op->w[0]) || !p->tg ||
        !p->ne || p->ne > JLM_MAX_EXPERTS || !p->nu || p->nu > p->ne || p->nu > JLM_MAX_EXPERTS_USED)
        return UNSUP;   /* GELU gates */
    p->nff = jlm_tensor_rows(p->tg);
    if (!bank_ok(p->tg, p->E, p->nff) || !bank_ok(p->tu, p->E, p->nff) || !bank_ok(p->td, p->nff, p->E))
        return UNSUP;
    jlm_k_mat wr = blk_mat(e, b, op->w[0]);
    if (wr.k != p->E || wr.rows != p->ne)
        return UNSUP;
    const jlm_header *hd = &e->m->hdr;
    if (!hd->n_exp_pages)
        return UNSUP;   /* banks outside an expert region: no page of expert 0 */
    p->first = bank_first(e, p->tg);
    const uint16_t role[4] = {JLM_R_ROUTER_B, JLM_R_EXP_GATE_B, JLM_R_EXP_UP_B, JLM_R_EXP_DOWN_B};
    const uint64_t n[4] = {p->ne, p->ne * p->nff, p->ne * p->nff, p->ne * p->E};
    for (int i = 0; i < 4; i++) {
        p->bias[i] = blk_vec(e, b, role[i]);
        p->bias_n[i] = n[i];
    }
    return JLM_OK;
}

void jlm_exd_moe_free(jlm_exd_moe *p)
{
    free(p->cnt);
    free(p->ord);
    free(p->row);
    p->cnt = p->ord = p->row = NULL;
}

int jlm_exd_moe_group(jlm_exd_moe *p, const int32_t *picks)
{
    uint32_t n = p->b->n, nu = p->nu, ne = p->ne, np = n * nu;
    jlm_exd_moe_free(p);
    p->cnt = calloc(ne + 2ull, sizeof *p->cnt);
    p->ord = malloc((uint64_t)np * sizeof *p->ord);
    p->row = malloc((uint64_t)np * sizeof *p->row);
    if (!p->cnt || !p->ord || !p->row)
        return jlm_errf(p->err, JLM_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < np; i++)   /* counts, then group starts, then the pairs in place */
        p->cnt[picks[i] + 1]++;
    for (uint32_t x = 0; x < ne; x++)
        p->cnt[x + 1] += p->cnt[x];
    for (uint32_t i = 0; i < np; i++)
        p->ord[p->cnt[picks[i]]++] = i;
    for (uint32_t x = ne; x > 0; x--)
        p->cnt[x] = p->cnt[x - 1];
    p->cnt[0] = 0;
    for (uint32_t i = 0; i < np; i++)
        p->row[i] = p->ord[i] / nu;
    return JLM_OK;
}

int jlm_exd_moe_each(jlm_exd_moe *p, jlm_exd_moe_fn fn, void *ctx)
{
    jlm_engine *e = p->e;
    uint32_t ne = p->ne;
    for (uint32_t x = 0; x < ne; x++) {
        uint32_t g0 = p->cnt[x], m = p->cnt[x + 1] - g0, nx = x + 1;
        if (!m)
            continue;
        const void *frame;
        int32_t xs = (int32_t)x;
        int rc = jlm_stream_experts(e, p->first, &xs, 1, &frame, p->err);
        if (rc)
            return rc;
        while (nx < ne && p->cnt[nx + 1] == p->cnt[nx])   /* the next used expert, read while this one runs */
            nx++;
        if (nx < ne)
            jlm_stream_expert_next(e, p->first + nx);
        rc = fn(ctx, x, g0, m, frame);
        jlm_stream_experts_done(e, p->first, &xs, 1);
        if (rc)
            return rc;
    }
    return JLM_OK;
}
