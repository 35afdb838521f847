/* exec.c - the CPU executor of block programs (engine/prog.h): the op loop
 * over a block's rows, and the ops that are matmuls, norms and residual adds
 * (attention: exec_attn.c; routed experts: exec_moe.c). See exec_int.h. */
#include "engine/exec_int.h"

#include <string.h>

#include "format/dequant.h"

/* ================================================================ threaded matvec / matmul */
/* ================================================================ threaded matvec / matmul */
void jlm_ex_mm_slice(void *ctx, size_t b, size_t en, int tid)
{
    (void)tid;
    mm_job *j = ctx;
    if (j->n == 1)
        j->mv(j->m, j->x, j->xq, j->y, b, en);
    else
        j->mm(j->m, j->n, j->x, j->xq, j->y, b, en);
}

/* Work of a batch that is per token and independent across tokens (the
 * activations' int8 rows, norms, bias + RoPE + the cache row, residual adds):
 * over the pool's threads for ROWS_PAR tokens or more, rows claimed in
 * pieces (jlm_pool_for_claim: a stalled thread leaves its share to the
 * others), on the calling thread below that (a prefill batch; decode and
 * small batches stay serial). Each row is computed exactly as alone, so no
 * result depends on the split.
 * Serial, these were ~12% of a 2-thread pp128 token (jlm bench --profile). */
enum { ROWS_PAR = 8 };
typedef struct rows_job { jlm_engine *e; jlm_ex_row_fn fn; void *ctx; } rows_job;

static void rows_slice(void *ctx, size_t t0, size_t t1, int tid)
{
    rows_job *j = ctx;
    for (size_t t = t0; t < t1; t++)
        j->fn(j->e, j->ctx, (uint32_t)t);
}

void jlm_ex_for_rows(jlm_engine *e, uint32_t n, jlm_ex_row_fn fn, void *ctx)
{
    rows_job j = {e, fn, ctx};
    jlm_pool_for_claim(n >= ROWS_PAR ? e->pool : NULL, n, 1, rows_slice, &j);
}

typedef struct quant_job { const float *x; uint64_t k; } quant_job;
static void quant_row(jlm_engine *e, void *ctx, uint32_t t)
{
    quant_job *q = ctx;
    e->xq[t].k = q->k;
    e->k->quantize_act(q->x + t * q->k, &e->xq[t]);
}

/* e->xq[t] = the int8 rows of x (n, k) */
void jlm_ex_quant_rows(jlm_engine *e, const float *x, uint64_t k, uint32_t n)
{
    quant_job q = {x, k};
    jlm_ex_for_rows(e, n, quant_row, &q);
}

/* h[t] = rmsnorm(x[t]) * w, rows of E floats */
typedef struct norm_job { float *h; const float *x, *w; uint32_t E; float eps; } norm_job;
static void norm_row(jlm_engine *e, void *ctx, uint32_t t)
{
    norm_job *j = ctx;
    jlm_k_rmsnorm(j->h + (uint64_t)t * j->E, j->x + (uint64_t)t * j->E, j->w, j->E, j->eps);
}

void jlm_ex_norm_rows(jlm_engine *e, float *h, const float *x, const float *w, uint32_t E, uint32_t n)
{
    norm_job j = {h, x, w, E, e->c->rms_eps};
    jlm_ex_for_rows(e, n, norm_row, &j);
}

/* The pool dispatch of a matmul of n tokens: decode (n == 1) one contiguous
 * slice per thread, as a memory-bound matvec streams best; prefill pieces
 * claimed by the threads (jlm_pool_for_claim: compute-bound, so a late or
 * preempted thread leaves its share to the others). */
void jlm_ex_mm_dispatch(jlm_engine *e, uint32_t n, size_t count, size_t grain, jlm_pool_fn fn, void *ctx)
{
    (n > 1 ? jlm_pool_for_claim : jlm_pool_for)(e->pool, count, grain, fn, ctx);
}

/* Y (n, rows) = X (n, k) W^T, rows split across the pool. Quantized weights
 * use int8 activations (7.7), one quantized row per token. Hot path: every
 * weight of every token goes through here. shared: x was quantized by the
 * previous matmul of this same x (wk/wv, gate/up) and has not changed since,
 * so its int8 rows are reused (bit-identical: quantization is a pure function
 * of x and k). */
static void matmul_x_run(jlm_engine *e, const jlm_k_mat *m, uint32_t n, const float *x, float *y, int shared)
{
    mm_job j = {e->k->matvec[m->type], e->k->matmul[m->type], m, n, x, NULL, y};
    if (!jlm_fmt_type_traits(m->type)->is_float) {
        if (!(shared && e->xq_of == x && e->xq[0].k == m->k))
            jlm_ex_quant_rows(e, x, m->k, n);
        e->xq_of = x;
        j.xq = e->xq;
    }
    if (e->dev_here && jlm_dev_matmul(e->dev_here, m, n, x, j.xq, y, NULL) == 0)
        return;                   /* else (a plane over one binding): the CPU */
    size_t grain = m->rows >= 256 ? 64 : m->rows;
    jlm_ex_mm_dispatch(e, n, m->rows, grain, jlm_ex_mm_slice, &j);
}

void jlm_ex_matmul_x(jlm_engine *e, const jlm_k_mat *m, uint32_t n, const float *x, float *y, int shared)
{
    unsigned long long t0 = prof_begin(e);
    matmul_x_run(e, m, n, x, y, shared);
    prof_end(e, JLM_PROF_MATMUL, t0);
}


/* ---------------------------------------------------------------- fused dispatches
 * Decode on several threads pays a barrier per dispatch (the caller waits for
 * the slowest slice) and runs the glue between dispatches on one thread. Two
 * fusions cut a layer's matmul dispatches from 7 to 4, results unchanged:
 * every row of every matmul is still one kernel call's row over the same
 * int8 input rows, and the activation is elementwise.
 *  - Q, K, V in one dispatch over their rows, split by weight bytes (Q4_K_M
 *    stores V as Q6_K: equal row counts would give one thread more bytes);
 *  - gate, up and the activation in one dispatch: each slice runs both
 *    matrices' rows [b, e) and activates them. */
#define MULTI_MAX 3
typedef struct mm_multi {
    int      nm, nparts;
    mm_job   j[MULTI_MAX];
    uint64_t rb[MULTI_MAX];        /* weight bytes per row */
    uint64_t total;                /* weight bytes of all rows */
} mm_multi;

/* Bytes a row of m occupies in its planes (for splitting work by bytes). */
static uint64_t row_bytes(const jlm_k_mat *m)
{
    const jlm_type_traits *tt = jlm_fmt_type_traits(m->type);
    if (tt->is_float)
        return m->k * tt->elem_bytes;
    uint64_t qs = 0, d = 0, sc = 0;
    if (jlm_fmt_planes(m->type, m->k, 64, &qs, &d, &sc, NULL))
        return m->k;
    return (qs + d + sc + 63) / 64;
}

/* Rows of matrix i whose first byte falls in part p's byte range, cut at
 * multiples of 64 rows (as the single-matrix split) when the matrix has
 * >= 256 rows: [*rb, *re). */
static void multi_rows(const mm_multi *mj, int i, size_t p, uint64_t *r0, uint64_t *r1)
{
    uint64_t start = 0;
    for (int a = 0; a < i; a++)
        start += mj->rb[a] * mj->j[a].m->rows;
    uint64_t rows = mj->j[i].m->rows, g = rows >= 256 ? 64 : rows;
    uint64_t cut[2];
    for (int s = 0; s < 2; s++) {
        uint64_t lo = (uint64_t)((long double)mj->total * (p + (size_t)s) / mj->nparts);
        uint64_t r = lo <= start ? 0 : (lo - start + mj->rb[i] - 1) / mj->rb[i];
        r = (r + g - 1) / g * g;
        cut[s] = r < rows ? r : rows;
    }
    *r0 = cut[0];
    *r1 = cut[1];
}

static void mm_multi_slice(void *ctx, size_t b, size_t en, int tid)
{
    mm_multi *mj = ctx;
    for (size_t p = b; p < en; p++)
        for (int i = 0; i < mj->nm; i++) {
            uint64_t r0, r1;
            multi_rows(mj, i, p, &r0, &r1);
            if (r0 < r1)
                jlm_ex_mm_slice(&mj->j[i], r0, r1, tid);
        }
}

/* Y_i = X W_i^T for matrices sharing X (n rows of k = ms[0]->k), one
 * dispatch; on the block's device one round trip (the activations up once, a
 * launch each, one wait), or, where the device cannot (a plane in no device
 * frame, a backend without it), one by one over the same quantized rows. */
void jlm_ex_matmul_multi(jlm_engine *e, const jlm_k_mat *const *ms, float *const *ys, int nm, uint32_t n,
                         const float *x)
{
    unsigned long long t0 = prof_begin(e);
    /* decode: one part per thread; prefill: 4 per thread to claim (jlm_ex_mm_dispatch) */
    int nt = jlm_pool_n_threads(e->pool);
    mm_multi mj = {.nm = nm, .nparts = n > 1 && nt > 1 ? 4 * nt : nt};
    int quant = 0;
    for (int i = 0; i < nm; i++) {
        mj.j[i] = (mm_job){e->k->matvec[ms[i]->type], e->k->matmul[ms[i]->type], ms[i], n, x, NULL, ys[i]};
        mj.rb[i] = row_bytes(ms[i]);
        mj.total += mj.rb[i] * ms[i]->rows;
        quant |= !jlm_fmt_type_traits(ms[i]->type)->is_float;
    }
    if (quant) {
        jlm_ex_quant_rows(e, x, ms[0]->k, n);
        e->xq_of = x;
        for (int i = 0; i < nm; i++)
            if (!jlm_fmt_type_traits(ms[i]->type)->is_float)
                mj.j[i].xq = e->xq;
    }
    if (!e->dev_here)
        jlm_ex_mm_dispatch(e, n, (size_t)mj.nparts, 1, mm_multi_slice, &mj);
    else if (jlm_dev_matmul_multi(e->dev_here, ms, nm, n, x, quant ? e->xq : NULL, ys, NULL))
        for (int i = 0; i < nm; i++)
            matmul_x_run(e, ms[i], n, x, ys[i], 1);
    prof_end(e, JLM_PROF_MATMUL, t0);
}

typedef struct gu_job { mm_job g, u; int act; const jlm_k_cpu *k; } gu_job;

static void gate_up_slice(void *ctx, size_t b, size_t en, int tid)
{
    gu_job *j = ctx;
    jlm_ex_mm_slice(&j->g, b, en, tid);
    jlm_ex_mm_slice(&j->u, b, en, tid);
    for (uint64_t t = 0; t < j->g.n; t++)
        jlm_ex_activate(j->k, j->act, j->g.y + t * j->g.m->rows + b, j->u.y + t * j->u.m->rows + b, en - b);
}

/* g = act(X Wg^T) * (X Wu^T) in one dispatch (CPU only: a device block runs
 * jlm_ex_matmul_multi and activates after). */
void jlm_ex_gate_up_act(jlm_engine *e, int act, const jlm_k_mat *wg, const jlm_k_mat *wu, uint32_t n, const float *x)
{
    unsigned long long t0 = prof_begin(e);
    gu_job j = {{e->k->matvec[wg->type], e->k->matmul[wg->type], wg, n, x, NULL, e->g},
                {e->k->matvec[wu->type], e->k->matmul[wu->type], wu, n, x, NULL, e->u}, act, e->k};
    if (!jlm_fmt_type_traits(wg->type)->is_float || !jlm_fmt_type_traits(wu->type)->is_float) {
        jlm_ex_quant_rows(e, x, wg->k, n);
        e->xq_of = x;
        j.g.xq = jlm_fmt_type_traits(wg->type)->is_float ? NULL : e->xq;
        j.u.xq = jlm_fmt_type_traits(wu->type)->is_float ? NULL : e->xq;
    }
    size_t grain = wg->rows >= 256 ? 64 : wg->rows;
    jlm_ex_mm_dispatch(e, n, wg->rows, grain, gate_up_slice, &j);
    prof_end(e, JLM_PROF_MATMUL, t0);
}



void jlm_ex_activate(const jlm_k_cpu *k, int act, float *g, const float *u, uint64_t n)
{
    if (act == JLM_ACT_SWIGLU_OAI) {
        jlm_k_swiglu_oai(g, g, u, n, 1.702f, 7.0f);
    } else if (act == JLM_ACT_GELU_FP16) {
        jlm_k_gelu_fp16(g, g, n);   /* llama.cpp's CPU GELU reads an fp16 table */
        jlm_k_mul(g, g, u, n);
    } else {
        k->swiglu(g, g, u, n);
    }
}

/* ================================================================ ops */
float *jlm_ex_buf(jlm_engine *e, int b)
{
    switch (b) {
    case JLM_B_X: return e->x;
    case JLM_B_H: return e->h;
    case JLM_B_Q: return e->q;
    case JLM_B_K: return e->kk;
    case JLM_B_V: return e->vv;
    case JLM_B_ATT: return e->att;
    case JLM_B_O: return e->o;
    case JLM_B_G: return e->g;
    default: return e->u;
    }
}

const jlm_op *jlm_ex_find(const jlm_prog *p, int kind)
{
    for (uint32_t i = 0; i < p->n; i++)
        if (p->op[i].kind == kind)
            return &p->op[i];
    return NULL;
}

/* x[t] += rmsnorm(o[t] + b) * pn: a sub-layer's output into the residual. */
typedef struct resid_rows { const float *o, *b, *pn; } resid_rows;
static void residual_row(jlm_engine *e, void *ctx, uint32_t t)
{
    const resid_rows *j = ctx;
    uint32_t E = e->c->n_embd;
    float *o = (float *)j->o + t * E;
    add_bias(o, j->b, E);
    if (j->pn) jlm_k_rmsnorm(o, o, j->pn, E, e->c->rms_eps);
    jlm_k_add(e->x + t * E, e->x + t * E, o, E);
}

/* g = act(src Wg + bg) * (src Wu + bu): on the CPU one dispatch with the
 * activation when there are no biases, else (or on a device) both matmuls
 * in one dispatch (one round trip) and the biases and activation per row. */
static void gate_up(jlm_engine *e, const jlm_op *op, const jlm_ex_blk *b)
{
    jlm_k_mat wg = blk_mat(e, b, op->w[0]), wu = blk_mat(e, b, op->w[1]);
    const float *bg = blk_vec(e, b, op->w[2]), *bu = blk_vec(e, b, op->w[3]), *x = jlm_ex_buf(e, op->src);
    uint64_t F = wg.rows;
    if (!bg && !bu && !e->dev_here) {
        jlm_ex_gate_up_act(e, op->act, &wg, &wu, b->n, x);
        return;
    }
    const jlm_k_mat *ms[2] = {&wg, &wu};
    float *ys[2] = {e->g, e->u};
    jlm_ex_matmul_multi(e, ms, ys, 2, b->n, x);   /* on a device: one round trip */
    for (uint32_t t = 0; t < b->n; t++) {
        add_bias(e->g + t * F, bg, F);
        add_bias(e->u + t * F, bu, F);
        jlm_ex_activate(e->k, op->act, e->g + t * F, e->u + t * F, F);
    }
}

static int run_op(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b, jlm_err *err)
{
    uint32_t E = e->c->n_embd;
    switch (op->kind) {
    case JLM_OP_NORM: {
        const float *w = blk_vec(e, b, op->w[0]);
        if (!w)
            w = blk_vec(e, b, op->w[1]);
        jlm_ex_norm_rows(e, jlm_ex_buf(e, op->dst), jlm_ex_buf(e, op->src), w, E, b->n);
        return JLM_OK;
    }
    case JLM_OP_QKV: jlm_ex_qkv(e, op, b); return JLM_OK;
    case JLM_OP_KV_STORE: jlm_ex_kv_store(e, op, b); return JLM_OK;
    case JLM_OP_KEYS_DONE: return JLM_OK;
    case JLM_OP_Q: jlm_ex_q(e, op, b); return JLM_OK;
    case JLM_OP_Q_ROPE: jlm_ex_q_rope(e, op, b); return JLM_OK;
    case JLM_OP_ATTENTION: jlm_ex_attention(e, op, b); return JLM_OK;
    case JLM_OP_MATMUL: {
        jlm_k_mat m = blk_mat(e, b, op->w[0]);
        float *y = jlm_ex_buf(e, op->dst);
        const float *bias = blk_vec(e, b, op->w[1]);
        jlm_ex_matmul(e, &m, b->n, jlm_ex_buf(e, op->src), y);
        for (uint32_t t = 0; bias && t < b->n; t++)
            add_bias(y + t * m.rows, bias, m.rows);
        return JLM_OK;
    }
    case JLM_OP_RESIDUAL: {
        resid_rows j = {jlm_ex_buf(e, op->src), blk_vec(e, b, op->w[0]), blk_vec(e, b, op->w[1])};
        jlm_ex_for_rows(e, b->n, residual_row, &j);
        return JLM_OK;
    }
    case JLM_OP_GATE_UP: gate_up(e, op, b); return JLM_OK;
    case JLM_OP_MOE: return jlm_ex_moe(e, op, b, err);
    case JLM_OP_MLA_KV: jlm_ex_mla_kv(e, op, b); return JLM_OK;
    case JLM_OP_MLA_Q: jlm_ex_mla_q(e, op, b); return JLM_OK;
    case JLM_OP_MLA_ATTN: jlm_ex_mla_attn(e, op, b); return JLM_OK;
    default: return jlm_errf(err, JLM_EINVAL, "block %u: op %u unknown", b->l, op->kind);
    }
}

/* Token rows [i, i+cnt) of one sequence (cache kc/vc) at positions pos0 + i..
 * become the batch's rows [0, cnt). */
static void bind_chunk(jlm_engine *e, float *xs, uint32_t i, uint32_t cnt, void *kc, void *vc, uint32_t pos0)
{
    for (uint32_t t = 0; kc && t < cnt; t++) {
        e->bkc[t] = kc;
        e->bvc[t] = vc;
        e->bpos[t] = pos0 + i + t;
    }
    e->x = xs + (uint64_t)i * e->c->n_embd;
}

/* The residual rows a device holds (whole blocks there) back on the host;
 * except: the device that keeps them (NULL: every one). */
int jlm_ex_x_host(jlm_engine *e, const jlm_dev *except, jlm_err *err)
{
    int rc = JLM_OK;
    for (int i = 0; i < e->n_dev && !rc; i++)
        if (e->devs[i] != except && e->devs[i]->ops->x_sync)
            rc = e->devs[i]->ops->x_sync(e->devs[i], err);
    return rc;
}

void jlm_ex_x_forget(jlm_engine *e)
{
    for (int i = 0; i < e->n_dev; i++)
        if (e->devs[i]->ops->x_drop)
            e->devs[i]->ops->x_drop(e->devs[i]);
}

int jlm_ex_block(jlm_engine *e, const jlm_prog *p, uint32_t l, const uint8_t *page, float *xs, uint32_t n,
                 void *kc, void *vc, uint32_t pos0, jlm_err *err)
{
    jlm_dev *d = e->dev_here;
    int rc = jlm_ex_x_host(e, d && d->ops->block ? d : NULL, err);
    if (!rc && d && d->ops->block) {   /* the whole block on the device, where it can */
        rc = d->ops->block(d, e, p, l, page, xs, n, kc, pos0, err);
        if (rc != JLM_EUNSUPPORTED)
            return rc;
        rc = jlm_ex_x_host(e, NULL, err);
    }
    if (rc)
        return rc;
    jlm_ex_blk b = {.p = p, .l = l, .page = page,
                    .page_off = e->m->hdr.data_off + (uint64_t)l * e->m->hdr.page_size};
    uint32_t keys = p->n;
    for (uint32_t k = 0; k < p->n; k++)
        if (p->op[k].kind == JLM_OP_KEYS_DONE) {
            keys = k;
            break;
        }
    /* the ops before KEYS_DONE for every chunk first: later rows may see their keys */
    for (uint32_t i = 0; i < n && !rc; i += e->nb) {
        b.n = n - i < e->nb ? n - i : e->nb;
        bind_chunk(e, xs, i, b.n, kc, vc, pos0);
        for (uint32_t k = 0; k < keys && !rc; k++)
            if (!(rc = e->by_op == l + 1 ? jlm_stream_op(e, p, l, k, err) : JLM_OK))
                rc = run_op(e, &p->op[k], &b, err);
    }
    for (uint32_t i = 0; keys < p->n && i < n && !rc; i += e->nb) {
        b.n = n - i < e->nb ? n - i : e->nb;
        bind_chunk(e, xs, i, b.n, kc, vc, pos0);
        for (uint32_t k = keys + 1; k < p->n && !rc; k++)
            if (!(rc = e->by_op == l + 1 ? jlm_stream_op(e, p, l, k, err) : JLM_OK))
                rc = run_op(e, &p->op[k], &b, err);
    }
    return rc;
}
