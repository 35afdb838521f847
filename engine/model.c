/* model.c - the forward pass on the CPU, every architecture in one graph with
 * per-architecture switches, in the order the papers (and llama.cpp's
 * src/models/) apply them. See model.h for the contract. */
#include "engine/model_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "format/dequant.h"

/* ================================================================ the device split */
/* The device that runs block l's matmuls, pages and experts; NULL: the CPU.
 * The output matrix's is out_dev (after the blocks, as run_layers leaves it). */
static jlm_dev *block_dev(const jlm_engine *e, uint32_t l)
{
    for (int i = 0; i < e->n_dev; i++)
        if (l < e->dev_end[i])
            return e->devs[i];
    return NULL;
}

/* ================================================================ tensors -> kernel operands */
/* A kernel matrix over planes at base (whose file offset is base_off). For an
 * expert bank, `shift` is the expert's page offset relative to expert 0. */
static jlm_k_mat mat_at(const jlm_tensor *t, const uint8_t *base, uint64_t base_off, uint64_t shift)
{
    jlm_k_mat m = {.type = t->type, .k = jlm_tensor_k(t), .rows = jlm_tensor_rows(t)};
    m.qs = base + (t->qs_off + shift - base_off);
    const jlm_type_traits *tr = jlm_fmt_type_traits(t->type);
    m.d = tr->is_float ? NULL : base + (t->d_off + shift - base_off);
    m.sc = tr->sc_kind ? base + (t->sc_off + shift - base_off) : NULL;
    return m;
}

static jlm_k_mat mat_dense(const jlm_engine *e, const jlm_tensor *t)
{
    return mat_at(t, e->dense, e->m->hdr.dense_off, 0);
}

/* Expert xe's matrix of bank t in block l, in that expert's page frame
 * (first: the page of the block's expert 0). The bank's offsets address
 * expert 0's page: shifted to expert xe's. */
static jlm_k_mat mat_expert(const jlm_engine *e, const jlm_tensor *t, const void *frame, uint32_t first, uint32_t xe)
{
    const jlm_header *hd = &e->m->hdr;
    uint64_t pg_off = hd->exp_data_off + (uint64_t)(first + xe) * hd->exp_page_size;
    return mat_at(t, frame, pg_off, (uint64_t)xe * hd->exp_page_size);
}

static const float *vec_dense(const jlm_engine *e, const jlm_tensor *t)
{
    return t ? (const float *)(e->dense + (t->qs_off - e->m->hdr.dense_off)) : NULL;
}

/* ================================================================ profiling */
static unsigned long long prof_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* A class's start: 0 when off or inside another timed class (counted there). */
static unsigned long long prof_begin(jlm_engine *e)
{
    if (!e->prof || e->prof_in)
        return 0;
    e->prof_in = 1;
    return prof_now();
}

static void prof_end(jlm_engine *e, int cls, unsigned long long t0)
{
    if (!t0)
        return;
    e->pr.ns[cls] += prof_now() - t0;
    e->prof_in = 0;
}

/* ================================================================ threaded matvec / matmul */
typedef struct mm_job {
    jlm_k_matvec_fn mv;
    jlm_k_matmul_fn mm;
    const jlm_k_mat *m;
    uint64_t n;
    const float *x;
    const jlm_act_q8 *xq;
    float *y;
} mm_job;

static void mm_slice(void *ctx, size_t b, size_t en, int tid)
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
 * split over the pool's threads for ROWS_PAR tokens or more, on the calling
 * thread below that (a prefill batch; decode and small batches stay serial).
 * Each row is computed exactly as alone, so no result depends on the split.
 * Serial, these were ~12% of a 2-thread pp128 token (jlm bench --profile). */
enum { ROWS_PAR = 8 };
typedef void (*row_fn)(jlm_engine *e, void *ctx, uint32_t t);
typedef struct rows_job { jlm_engine *e; row_fn fn; void *ctx; } rows_job;

static void rows_slice(void *ctx, size_t t0, size_t t1, int tid)
{
    rows_job *j = ctx;
    for (size_t t = t0; t < t1; t++)
        j->fn(j->e, j->ctx, (uint32_t)t);
}

static void for_rows(jlm_engine *e, uint32_t n, row_fn fn, void *ctx)
{
    rows_job j = {e, fn, ctx};
    jlm_pool_for(n >= ROWS_PAR ? e->pool : NULL, n, 1, rows_slice, &j);
}

typedef struct quant_job { const float *x; uint64_t k; } quant_job;
static void quant_row(jlm_engine *e, void *ctx, uint32_t t)
{
    quant_job *q = ctx;
    e->xq[t].k = q->k;
    e->k->quantize_act(q->x + t * q->k, &e->xq[t]);
}

/* e->xq[t] = the int8 rows of x (n, k) */
static void quant_rows(jlm_engine *e, const float *x, uint64_t k, uint32_t n)
{
    quant_job q = {x, k};
    for_rows(e, n, quant_row, &q);
}

/* h[t] = rmsnorm(x[t]) * w, rows of E floats */
typedef struct norm_job { float *h; const float *x, *w; uint32_t E; float eps; } norm_job;
static void norm_row(jlm_engine *e, void *ctx, uint32_t t)
{
    norm_job *j = ctx;
    jlm_k_rmsnorm(j->h + (uint64_t)t * j->E, j->x + (uint64_t)t * j->E, j->w, j->E, j->eps);
}

static void norm_rows(jlm_engine *e, float *h, const float *x, const float *w, uint32_t E, uint32_t n)
{
    norm_job j = {h, x, w, E, e->c->rms_eps};
    for_rows(e, n, norm_row, &j);
}

/* The pool dispatch of a matmul of n tokens: decode (n == 1) one contiguous
 * slice per thread, as a memory-bound matvec streams best; prefill pieces
 * claimed by the threads (jlm_pool_for_claim: compute-bound, so a late or
 * preempted thread leaves its share to the others). */
static void mm_dispatch(jlm_engine *e, uint32_t n, size_t count, size_t grain, jlm_pool_fn fn, void *ctx)
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
            quant_rows(e, x, m->k, n);
        e->xq_of = x;
        j.xq = e->xq;
    }
    if (e->dev_here && jlm_dev_matmul(e->dev_here, m, n, x, j.xq, y, NULL) == 0)
        return;                   /* else (a plane over one binding): the CPU */
    size_t grain = m->rows >= 256 ? 64 : m->rows;
    mm_dispatch(e, n, m->rows, grain, mm_slice, &j);
}

static void matmul_x(jlm_engine *e, const jlm_k_mat *m, uint32_t n, const float *x, float *y, int shared)
{
    unsigned long long t0 = prof_begin(e);
    matmul_x_run(e, m, n, x, y, shared);
    prof_end(e, JLM_PROF_MATMUL, t0);
}

static void matmul(jlm_engine *e, const jlm_k_mat *m, uint32_t n, const float *x, float *y)
{
    matmul_x(e, m, n, x, y, 0);
}
static void matvec(jlm_engine *e, const jlm_k_mat *m, const float *x, float *y) { matmul(e, m, 1, x, y); }

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
                mm_slice(&mj->j[i], r0, r1, tid);
        }
}

/* Y_i = X W_i^T for matrices sharing X (n rows of k = ms[0]->k), one
 * dispatch; on the block's device one round trip (the activations up once, a
 * launch each, one wait), or, where the device cannot (a plane in no device
 * frame, a backend without it), one by one over the same quantized rows. */
static void matmul_multi(jlm_engine *e, const jlm_k_mat *const *ms, float *const *ys, int nm, uint32_t n,
                         const float *x)
{
    unsigned long long t0 = prof_begin(e);
    /* decode: one part per thread; prefill: 4 per thread to claim (mm_dispatch) */
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
        quant_rows(e, x, ms[0]->k, n);
        e->xq_of = x;
        for (int i = 0; i < nm; i++)
            if (!jlm_fmt_type_traits(ms[i]->type)->is_float)
                mj.j[i].xq = e->xq;
    }
    if (!e->dev_here)
        mm_dispatch(e, n, (size_t)mj.nparts, 1, mm_multi_slice, &mj);
    else if (jlm_dev_matmul_multi(e->dev_here, ms, nm, n, x, quant ? e->xq : NULL, ys, NULL))
        for (int i = 0; i < nm; i++)
            matmul_x_run(e, ms[i], n, x, ys[i], 1);
    prof_end(e, JLM_PROF_MATMUL, t0);
}

static void activate(const jlm_config *c, float *g, const float *u, uint64_t n);

typedef struct gu_job { mm_job g, u; const jlm_config *c; } gu_job;

static void gate_up_slice(void *ctx, size_t b, size_t en, int tid)
{
    gu_job *j = ctx;
    mm_slice(&j->g, b, en, tid);
    mm_slice(&j->u, b, en, tid);
    for (uint64_t t = 0; t < j->g.n; t++)
        activate(j->c, j->g.y + t * j->g.m->rows + b, j->u.y + t * j->u.m->rows + b, en - b);
}

/* g = act(X Wg^T) * (X Wu^T) in one dispatch (CPU only: a device block runs
 * matmul_multi and activates after). */
static void gate_up_act(jlm_engine *e, const jlm_k_mat *wg, const jlm_k_mat *wu, uint32_t n, const float *x)
{
    unsigned long long t0 = prof_begin(e);
    gu_job j = {{e->k->matvec[wg->type], e->k->matmul[wg->type], wg, n, x, NULL, e->g},
                {e->k->matvec[wu->type], e->k->matmul[wu->type], wu, n, x, NULL, e->u}, e->c};
    if (!jlm_fmt_type_traits(wg->type)->is_float || !jlm_fmt_type_traits(wu->type)->is_float) {
        quant_rows(e, x, wg->k, n);
        e->xq_of = x;
        j.g.xq = jlm_fmt_type_traits(wg->type)->is_float ? NULL : e->xq;
        j.u.xq = jlm_fmt_type_traits(wu->type)->is_float ? NULL : e->xq;
    }
    size_t grain = wg->rows >= 256 ? 64 : wg->rows;
    mm_dispatch(e, n, wg->rows, grain, gate_up_slice, &j);
    prof_end(e, JLM_PROF_MATMUL, t0);
}

static void add_bias(float *y, const float *b, uint64_t n)
{
    if (b)
        for (uint64_t i = 0; i < n; i++)
            y[i] += b[i];
}

/* ================================================================ attention */
/* KV head g of layer l in cache c (dim: hd or hd_v), layer by layer, head
 * by head, kv_ctx positions each (model_int.h); pos: where that position's
 * row starts (values; keys are tiles, key_elem). */
static uint8_t *kv_at(const jlm_engine *e, void *c, uint32_t l, uint32_t g, uint32_t pos, uint32_t dim)
{
    uint64_t head = (uint64_t)l * e->c->n_kv_head + g;
    return (uint8_t *)c + (head * e->kv_ctx + pos) * dim * e->kv_es;
}

/* Element i of key pos in its head's keys (kv_at(.., 0, hd)): tiles of
 * JLM_K_FATTN_BK positions, dimension-major (jlm_k_fattn's k_tiled). */
static uint64_t key_elem(const jlm_engine *e, uint32_t pos, uint32_t i)
{
    enum { BK = JLM_K_FATTN_BK };
    return (uint64_t)(pos / BK) * BK * e->hd + (uint64_t)i * BK + pos % BK;
}

static float kv_get(const jlm_engine *e, const uint8_t *base, uint64_t i)
{
    return e->kv_f16 ? jlm_k_fp16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static int is_swa_layer(const jlm_config *c, uint32_t l)
{
    return c->swa_window && c->swa_period && (l % c->swa_period) < c->swa_period - 1;
}

static void rope_params(const jlm_engine *e, uint32_t l, jlm_k_rope *p)
{
    const jlm_config *c = e->c;
    float base = is_swa_layer(c, l) ? c->rope_base_swa : c->rope_base;
    jlm_k_rope_defaults(p, c->n_rot, base);
    p->neox = (c->flags & JLM_F_ROPE_NEOX) != 0;
    if (c->yarn_factor > 0) {
        p->freq_scale = 1.0f / c->yarn_factor;
        p->ext_factor = 1.0f;
        p->beta_fast = c->yarn_beta_fast ? c->yarn_beta_fast : 32.0f;
        p->beta_slow = c->yarn_beta_slow ? c->yarn_beta_slow : 1.0f;
        p->orig_ctx = c->yarn_orig_ctx;
    } else if (c->rope_linear > 0) {
        p->freq_scale = 1.0f / c->rope_linear;
    }
    if (c->attn_factor > 0)
        p->attn_factor = c->attn_factor;
    const jlm_tensor *ff = W(e, -1, JLM_R_ROPE_FREQS);
    if (ff)
        p->freq_factors = vec_dense(e, ff);
}

/* One token's attention over the cache at position pos: q -> out, heads
 * split across the pool (each thread has its own score row). */
typedef struct attn_job {
    jlm_engine *e;
    jlm_k_attn  ap;
    const float *q, *sinks;
    void       *kc, *vc;                /* the token's caches (kv_at) */
    float      *out;
    uint32_t    l, n_kv, group;
} attn_job;

/* KV heads [g0, g1), each copied once into this thread's slab as F32 rows
 * (keys then values, packed: stride hd / hd_v; the cache keeps keys in
 * tiles and may hold F16) and attended by its group of query heads, so GQA
 * reads each head once. The kernel then sees exactly the values the cache
 * holds. The per-token path (JLM_ATTN=token) only: a reference. */
static void attn_heads(void *ctx, size_t g0, size_t g1, int tid)
{
    attn_job *j = ctx;
    jlm_engine *e = j->e;
    jlm_k_attn ap = j->ap;
    float *scores = e->scores + (size_t)tid * e->n_ctx;
    float *k32 = e->kv32 + (size_t)tid * e->n_ctx * (e->hd + e->hd_v), *v32 = k32 + (size_t)e->n_ctx * e->hd;
    for (size_t g = g0; g < g1; g++) {
        const uint8_t *kh = kv_at(e, j->kc, j->l, (uint32_t)g, 0, e->hd), *vh = kv_at(e, j->vc, j->l, (uint32_t)g, 0, e->hd_v);
        for (uint32_t p = 0; p < j->n_kv; p++) {
            for (uint32_t i = 0; i < e->hd; i++)
                k32[(uint64_t)p * e->hd + i] = kv_get(e, kh, key_elem(e, p, i));
            for (uint32_t i = 0; i < e->hd_v; i++)
                v32[(uint64_t)p * e->hd_v + i] = kv_get(e, vh, (uint64_t)p * e->hd_v + i);
        }
        for (size_t h = g * j->group; h < (g + 1) * j->group; h++) {
            ap.has_sink = j->sinks != NULL;
            ap.sink = j->sinks ? j->sinks[h] : 0.0f;
            jlm_k_attn_head(&ap, j->q + h * e->hd, k32, v32, j->n_kv, scores, j->out + h * e->hd_v);
        }
    }
}

static void attend(jlm_engine *e, uint32_t l, uint32_t t, const float *q, float *out)
{
    uint32_t pos = e->bpos[t];
    const jlm_config *c = e->c;
    /* sliding window: a key at j is hidden when pos - j >= window (llama.cpp's standard SWA);
     * inside an image (bidir_end) later keys are seen too and never cut by the window */
    uint32_t n_kv = pos < e->bidir_end ? e->bidir_end : pos + 1;
    int swa = is_swa_layer(c, l);
    for (uint32_t j = 0; swa && j < n_kv; j++)
        e->mask[j] = j <= pos && pos - j >= c->swa_window ? -INFINITY : 0.0f;
    attn_job j = {
        .e = e, .q = q, .out = out, .l = l, .n_kv = n_kv, .group = c->n_head / c->n_kv_head,
        .kc = e->bkc[t], .vc = e->bvc[t],
        .sinks = vec_dense(e, W(e, l, JLM_R_ATTN_SINKS)),
        .ap = {.head_dim = e->hd, .head_dim_v = e->hd_v, .k_stride = e->hd, .v_stride = e->hd_v,   /* the slab's rows */
               .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)e->hd),
               .softcap = c->attn_softcap, .mask = swa ? e->mask : NULL},
    };
    /* short contexts are not worth a dispatch */
    unsigned long long t0 = prof_begin(e);
    jlm_pool_for(n_kv >= 64 ? e->pool : NULL, c->n_kv_head, 1, attn_heads, &j);
    prof_end(e, JLM_PROF_ATTN, t0);
}

/* Rows [t0, t0+n) of the batch, one sequence at consecutive positions:
 * jlm_k_fattn over (KV head, tile of JLM_K_FATTN_BQ rows) units, dealt
 * round-robin to the pool's threads (causal rows cost more the later they
 * are). Row t sees keys [lo, hi): up to its position (up to bidir_end in an
 * image), from pos - window + 1 on a sliding-window layer (attend's mask). */
typedef struct fattn_job {
    jlm_engine        *e;
    jlm_k_fattn        p;
    const float       *q;
    const void        *k, *v;
    float             *out;
    uint32_t           n, n_kv_head, nt;   /* rows; KV heads; slices (threads) */
} fattn_job;

static void fattn_slice(void *ctx, size_t s0, size_t s1, int tid)
{
    fattn_job *j = ctx;
    float *scratch = j->e->fa + (size_t)tid * j->e->fa_floats;
    uint32_t nq = (j->n + JLM_K_FATTN_BQ - 1) / JLM_K_FATTN_BQ, nu = nq * j->n_kv_head;
    for (size_t s = s0; s < s1; s++)
        for (uint32_t u = (uint32_t)s; u < nu; u += j->nt) {
            uint32_t qt = nq - 1 - u / j->n_kv_head, g = u % j->n_kv_head;   /* costly tiles first */
            uint32_t r0 = qt * JLM_K_FATTN_BQ, r1 = r0 + JLM_K_FATTN_BQ < j->n ? r0 + JLM_K_FATTN_BQ : j->n;
            j->e->k->fattn(&j->p, j->q, j->k, j->v, j->out, g, r0, r1, scratch);
        }
}

static void attend_rows(jlm_engine *e, uint32_t l, uint32_t t0, uint32_t n)
{
    const jlm_config *c = e->c;
    uint32_t lo[PREFILL_MAX], hi[PREFILL_MAX];
    uint32_t win = is_swa_layer(c, l) ? c->swa_window : 0;
    uint64_t work = 0;
    for (uint32_t r = 0; r < n; r++) {
        uint32_t pos = e->bpos[t0 + r];
        hi[r] = pos < e->bidir_end ? e->bidir_end : pos + 1;
        lo[r] = win && pos >= win ? pos - win + 1 : 0;
        work += hi[r] - lo[r];
    }
    fattn_job j = {
        .e = e, .q = e->q + (uint64_t)t0 * e->q_dim, .out = e->att + (uint64_t)t0 * c->n_head * e->hd_v,
        .k = kv_at(e, e->bkc[t0], l, 0, 0, e->hd), .v = kv_at(e, e->bvc[t0], l, 0, 0, e->hd_v),
        .n = n, .n_kv_head = c->n_kv_head,
        .p = {.head_dim = e->hd, .head_dim_v = e->hd_v, .group = c->n_head / c->n_kv_head,
              .q_stride = e->q_dim, .o_stride = (uint64_t)c->n_head * e->hd_v,
              .k_stride = e->hd, .v_stride = e->hd_v, .kh_stride = (uint64_t)e->kv_ctx * e->hd,
              .vh_stride = (uint64_t)e->kv_ctx * e->hd_v, .k_tiled = 1, .kv_f16 = e->kv_f16,
              .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)e->hd),
              .softcap = c->attn_softcap, .sinks = vec_dense(e, W(e, l, JLM_R_ATTN_SINKS)), .lo = lo, .hi = hi},
    };
    /* short contexts are not worth a dispatch (attend's 64 keys) */
    jlm_pool *pool = work >= 64 ? e->pool : NULL;
    j.nt = pool ? (uint32_t)jlm_pool_n_threads(pool) : 1;
    unsigned long long pt = prof_begin(e);
    jlm_pool_for(pool, j.nt, 1, fattn_slice, &j);
    prof_end(e, JLM_PROF_ATTN, pt);
}

/* n floats into a cache row: copied, or kv_f16 rounded to F16 (nearest
 * even, as F16C and ggml's F16 cache do). */
static void store_kv(const jlm_engine *e, uint8_t *dst, const float *x, uint32_t n)
{
    if (!e->kv_f16) {
        memcpy(dst, x, n * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    for (uint32_t i = 0; i < n; i++)
        d[i] = jlm_k_f32_to_fp16(x[i]);
}

/* Key k (hd floats) at position pos of a head's keys kh (kv_at(.., 0, hd)):
 * one element a dimension, into its tile (key_elem), as store_kv rounds. */
static void store_key(const jlm_engine *e, uint8_t *kh, uint32_t pos, const float *k)
{
    for (uint32_t i = 0; i < e->hd; i++) {
        uint64_t at = key_elem(e, pos, i);
        if (e->kv_f16)
            ((uint16_t *)kh)[at] = jlm_k_f32_to_fp16(k[i]);
        else
            ((float *)kh)[at] = k[i];
    }
}

/* One token's k and v (bias, norm, RoPE) into the cache; its q (bias, norm,
 * RoPE); its attention output or FFN output into the residual (optional
 * bias and post-norm). Rows of for_rows; layer_rows holds what they share
 * (the layer, its RoPE parameters, the residual's bias and post-norm). */
typedef struct layer_rows { uint32_t l; jlm_k_rope rp; const float *b, *pn; } layer_rows;

/* What every head of a token's q or k gets after its bias: its RMS norm (n:
 * per head; NULL: none, or done on the whole vector, QKNormWide), RoPE by
 * the position's cs (NULL: no position encoding). kv_row, q_row and the
 * fused decode dispatch (attn_qkv_heads) all finish heads here. */
static void head_norm_rope(const jlm_engine *e, float *x, const float *n, const jlm_k_rope *rp, const float *cs)
{
    if (n)
        jlm_k_rmsnorm(x, x, n, e->hd, e->c->rms_eps);
    if (cs)
        jlm_k_rope_rotate(cs, rp, x, 1, e->hd);
}

/* The norm weight heads get one by one (NULL where there is none or it
 * applies to the whole vector: qk_wide_norm did it). */
static const float *qk_head_norm(const jlm_engine *e, uint32_t l, int role)
{
    return (e->c->flags & JLM_F_QK_NORM_WIDE) ? NULL : vec_dense(e, W(e, l, role));
}

/* QKNormWide: the RMS norm of a token's whole q (or k) of n floats. */
static void qk_wide_norm(const jlm_engine *e, uint32_t l, int role, float *x, uint64_t n)
{
    const float *w = vec_dense(e, W(e, l, role));
    if ((e->c->flags & JLM_F_QK_NORM_WIDE) && w)
        jlm_k_rmsnorm(x, x, w, n, e->c->rms_eps);
}

/* The cos/sin of position pos for layer l's RoPE into cs; NULL if the
 * model has no position encoding. */
static const float *rope_cs(const jlm_engine *e, const jlm_k_rope *rp, uint32_t pos, float *cs)
{
    if (e->c->flags & JLM_F_NO_POS_ENC)
        return NULL;
    jlm_k_rope_cos_sin(rp, pos, cs);
    return cs;
}

static void kv_row(jlm_engine *e, void *ctx, uint32_t t)
{
    const layer_rows *j = ctx;
    const jlm_config *c = e->c;
    float *k = e->kk + t * e->kv_dim, *v = e->vv + t * e->kv_dim_v, csb[JLM_MAX_HEAD_DIM];
    add_bias(k, vec_dense(e, W(e, j->l, JLM_R_ATTN_K_B)), e->kv_dim);
    add_bias(v, vec_dense(e, W(e, j->l, JLM_R_ATTN_V_B)), e->kv_dim_v);
    qk_wide_norm(e, j->l, JLM_R_ATTN_K_NORM, k, e->kv_dim);
    const float *kn = qk_head_norm(e, j->l, JLM_R_ATTN_K_NORM), *cs = rope_cs(e, &j->rp, e->bpos[t], csb);
    for (uint32_t g = 0; g < c->n_kv_head; g++) {   /* head-major, keys in tiles (model_int.h) */
        head_norm_rope(e, k + g * e->hd, kn, &j->rp, cs);
        store_key(e, kv_at(e, e->bkc[t], j->l, g, 0, e->hd), e->bpos[t], k + g * e->hd);
        store_kv(e, kv_at(e, e->bvc[t], j->l, g, e->bpos[t], e->hd_v), v + g * e->hd_v, e->hd_v);
    }
}

static void q_row(jlm_engine *e, void *ctx, uint32_t t)
{
    const layer_rows *j = ctx;
    float *q = e->q + t * e->q_dim, csb[JLM_MAX_HEAD_DIM];
    add_bias(q, vec_dense(e, W(e, j->l, JLM_R_ATTN_Q_B)), e->q_dim);
    qk_wide_norm(e, j->l, JLM_R_ATTN_Q_NORM, q, e->q_dim);
    const float *qn = qk_head_norm(e, j->l, JLM_R_ATTN_Q_NORM), *cs = rope_cs(e, &j->rp, e->bpos[t], csb);
    for (uint32_t h = 0; h < e->c->n_head; h++)
        head_norm_rope(e, q + h * e->hd, qn, &j->rp, cs);
}

static void residual_row(jlm_engine *e, void *ctx, uint32_t t)
{
    const layer_rows *j = ctx;
    uint32_t E = e->c->n_embd;
    float *o = e->o + t * E;
    add_bias(o, j->b, E);
    if (j->pn) jlm_k_rmsnorm(o, o, j->pn, E, e->c->rms_eps);
    jlm_k_add(e->x + t * E, e->x + t * E, o, E);
}

/* ---------------------------------------------------------------- decode: Q, K, V and attention in one dispatch
 * One token on several threads: thread p takes KV heads [g0, g1) (an equal
 * share), computes their rows of K and V and their query heads' rows of Q,
 * then, with no barrier between, their bias, norm and RoPE (head_norm_rope,
 * as kv_row and q_row), the cache store and jlm_k_fattn. Serial, the attention and the per-row work
 * between the dispatches were ~5% of a two-thread decode token (jlm bench
 * --profile); results are unchanged: each matmul row is one kernel call's
 * (the same int8 input rows), each head's bias/norm/RoPE are those of the
 * whole vector (per head, elementwise), and jlm_k_fattn's output per KV
 * head does not depend on the call. */
typedef struct qkva_job {
    jlm_engine *e;
    uint32_t    l, nparts, lo, hi;
    mm_job      j[3];                  /* Q, K, V */
    jlm_k_rope  rp;
    const float *cs;                   /* rp's cos/sin at the token's position (NULL: no RoPE) */
    jlm_k_fattn p;
    const void *k, *v;                 /* layer l's cache: KV head 0 */
    unsigned long long att_ns;         /* thread 0's time in the per-head part (--profile) */
} qkva_job;

static void qkva_slice(void *ctx, size_t b, size_t en, int tid)
{
    qkva_job *j = ctx;
    jlm_engine *e = j->e;
    const jlm_config *c = e->c;
    uint32_t G = c->n_head / c->n_kv_head, hd = e->hd, hv = e->hd_v;
    const float *qb = vec_dense(e, W(e, j->l, JLM_R_ATTN_Q_B)), *kb = vec_dense(e, W(e, j->l, JLM_R_ATTN_K_B));
    const float *vb = vec_dense(e, W(e, j->l, JLM_R_ATTN_V_B));
    const float *qn = qk_head_norm(e, j->l, JLM_R_ATTN_Q_NORM), *kn = qk_head_norm(e, j->l, JLM_R_ATTN_K_NORM);
    uint32_t pos = e->bpos[0];
    for (size_t part = b; part < en; part++) {
        uint32_t g0 = (uint32_t)(part * c->n_kv_head / j->nparts), g1 = (uint32_t)((part + 1) * c->n_kv_head / j->nparts);
        mm_slice(&j->j[0], (uint64_t)g0 * G * hd, (uint64_t)g1 * G * hd, tid);
        mm_slice(&j->j[1], (uint64_t)g0 * hd, (uint64_t)g1 * hd, tid);
        mm_slice(&j->j[2], (uint64_t)g0 * hv, (uint64_t)g1 * hv, tid);
        unsigned long long t0 = e->prof && tid == 0 ? prof_now() : 0;
        for (uint32_t g = g0; g < g1; g++) {
            float *k = e->kk + (uint64_t)g * hd, *v = e->vv + (uint64_t)g * hv;
            add_bias(k, kb ? kb + (uint64_t)g * hd : NULL, hd);
            add_bias(v, vb ? vb + (uint64_t)g * hv : NULL, hv);
            head_norm_rope(e, k, kn, &j->rp, j->cs);
            store_key(e, kv_at(e, e->bkc[0], j->l, g, 0, hd), pos, k);
            store_kv(e, kv_at(e, e->bvc[0], j->l, g, pos, hv), v, hv);
            for (uint32_t h = g * G; h < (g + 1) * G; h++) {
                float *q = e->q + (uint64_t)h * hd;
                add_bias(q, qb ? qb + (uint64_t)h * hd : NULL, hd);
                head_norm_rope(e, q, qn, &j->rp, j->cs);
            }
            e->k->fattn(&j->p, e->q, j->k, j->v, e->att, g, 0, 1, e->fa + (size_t)tid * e->fa_floats);
        }
        if (t0)
            j->att_ns += prof_now() - t0;
    }
}

/* attn_kv and attn_out's attention for one token (n == 1) in one dispatch,
 * where it applies: the CPU, a pool whose threads divide the KV heads, the
 * batched attention, per-head norms; 0: the caller takes the general path. */
static int attn_qkv_heads(jlm_engine *e, uint32_t l, const jlm_k_mat *wq, const jlm_k_mat *wk, const jlm_k_mat *wv)
{
    const jlm_config *c = e->c;
    int nt = jlm_pool_n_threads(e->pool);
    if (nt < 2 || c->n_kv_head % (uint32_t)nt || e->attn_token || e->bidir_end || (c->flags & JLM_F_QK_NORM_WIDE))
        return 0;
    unsigned long long t0 = prof_begin(e);
    uint32_t pos = e->bpos[0], win = is_swa_layer(c, l) ? c->swa_window : 0;
    qkva_job j = {.e = e, .l = l, .nparts = (uint32_t)nt, .hi = pos + 1, .lo = win && pos >= win ? pos - win + 1 : 0,
                  .k = kv_at(e, e->bkc[0], l, 0, 0, e->hd), .v = kv_at(e, e->bvc[0], l, 0, 0, e->hd_v)};
    const jlm_k_mat *ms[3] = {wq, wk, wv};
    float *ys[3] = {e->q, e->kk, e->vv};
    int quant = 0;
    for (int i = 0; i < 3; i++) {
        j.j[i] = (mm_job){e->k->matvec[ms[i]->type], e->k->matmul[ms[i]->type], ms[i], 1, e->h, NULL, ys[i]};
        quant |= !jlm_fmt_type_traits(ms[i]->type)->is_float;
    }
    if (quant) {
        quant_rows(e, e->h, wq->k, 1);
        e->xq_of = e->h;
        for (int i = 0; i < 3; i++)
            if (!jlm_fmt_type_traits(ms[i]->type)->is_float)
                j.j[i].xq = e->xq;
    }
    float csb[JLM_MAX_HEAD_DIM];   /* once for the token, not once a head */
    rope_params(e, l, &j.rp);
    j.cs = rope_cs(e, &j.rp, pos, csb);
    j.p = (jlm_k_fattn){.head_dim = e->hd, .head_dim_v = e->hd_v, .group = c->n_head / c->n_kv_head,
                        .q_stride = e->q_dim, .o_stride = (uint64_t)c->n_head * e->hd_v, .k_stride = e->hd,
                        .v_stride = e->hd_v, .kh_stride = (uint64_t)e->kv_ctx * e->hd,
                        .vh_stride = (uint64_t)e->kv_ctx * e->hd_v, .k_tiled = 1, .kv_f16 = e->kv_f16,
                        .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)e->hd),
                        .softcap = c->attn_softcap, .sinks = vec_dense(e, W(e, l, JLM_R_ATTN_SINKS)),
                        .lo = &j.lo, .hi = &j.hi};
    jlm_pool_for(e->pool, (size_t)nt, 1, qkva_slice, &j);
    prof_end(e, JLM_PROF_MATMUL, t0);
    if (t0) {   /* thread 0's per-head part to attention (the threads ran it side by side) */
        e->pr.ns[JLM_PROF_MATMUL] -= j.att_ns;
        e->pr.ns[JLM_PROF_ATTN] += j.att_ns;
    }
    e->att_ready_x = e->x;
    e->att_ready_l = l;
    return 1;
}

/* Keys and values of tokens t < n (rows of x) of layer l into their caches
 * bkc/bvc[t] at positions bpos[t]; page = block l's frame. */
static void attn_kv(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t n)
{
    const jlm_config *c = e->c;
    uint32_t E = c->n_embd;
    norm_rows(e, e->h, e->x, vec_dense(e, W(e, l, JLM_R_ATTN_NORM)), E, n);
    jlm_k_mat wk = mat_at(W(e, l, JLM_R_ATTN_K), page, page_off, 0);
    jlm_k_mat wv = mat_at(W(e, l, JLM_R_ATTN_V), page, page_off, 0);
    const jlm_tensor *tq = W(e, l, JLM_R_ATTN_Q);
    if (n == 1 && !e->dev_here && tq) {
        jlm_k_mat wq = mat_at(tq, page, page_off, 0);
        if (attn_qkv_heads(e, l, &wq, &wk, &wv))
            return;
    }
    if (tq) {
        /* Q too, for attn_out of these rows (fused dispatches above; on a
         * device, one round trip) */
        jlm_k_mat wq = mat_at(tq, page, page_off, 0);
        const jlm_k_mat *ms[3] = {&wq, &wk, &wv};
        float *ys[3] = {e->q, e->kk, e->vv};
        matmul_multi(e, ms, ys, 3, n, e->h);
        e->q_ready_x = e->x;
        e->q_ready_l = l;
    } else {
        matmul(e, &wk, n, e->h, e->kk);
        matmul_x(e, &wv, n, e->h, e->vv, 1);   /* the same quantized rows */
    }
    layer_rows rj = {.l = l};
    rope_params(e, l, &rj.rp);
    for_rows(e, n, kv_row, &rj);
}

/* x[t] += attention(norm(x[t])) for tokens t < n at positions bpos[t] of
 * layer l, whose keys attn_kv has cached: token t sees keys up to bpos[t]
 * (up to bidir_end inside an image). */
static void attn_out(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t n)
{
    const jlm_config *c = e->c;
    uint32_t E = c->n_embd, A = c->n_head * e->hd_v;
    int ready = e->q_ready_x == e->x && e->q_ready_l == l, done = e->att_ready_x == e->x && e->att_ready_l == l;
    e->q_ready_x = NULL;
    e->att_ready_x = NULL;
    if (done)
        goto out;   /* attn_qkv_heads */
    if (!ready) {
        norm_rows(e, e->h, e->x, vec_dense(e, W(e, l, JLM_R_ATTN_NORM)), E, n);
        jlm_k_mat wq = mat_at(W(e, l, JLM_R_ATTN_Q), page, page_off, 0);
        matmul(e, &wq, n, e->h, e->q);
    }
    layer_rows rj = {.l = l};
    rope_params(e, l, &rj.rp);
    for_rows(e, n, q_row, &rj);
    for (uint32_t t = 0; e->attn_token && t < n; t++)
        attend(e, l, t, e->q + t * e->q_dim, e->att + t * A);
    /* runs of rows of one sequence at consecutive positions: one batched
     * attention each (a prefill batch is one run, a serve batch n runs of 1) */
    for (uint32_t t = 0, t1; !e->attn_token && t < n; t = t1) {
        for (t1 = t + 1; t1 < n && e->bkc[t1] == e->bkc[t] && e->bvc[t1] == e->bvc[t] &&
                         e->bpos[t1] == e->bpos[t1 - 1] + 1; t1++)
            ;
        attend_rows(e, l, t, t1 - t);
    }
out:;
    jlm_k_mat wo = mat_at(W(e, l, JLM_R_ATTN_OUT), page, page_off, 0);
    matmul(e, &wo, n, e->att, e->o);
    layer_rows res = {.l = l, .b = vec_dense(e, W(e, l, JLM_R_ATTN_OUT_B)),
                    .pn = c->arch == JLM_ARCH_GEMMA3 ? vec_dense(e, W(e, l, JLM_R_POST_ATTN_NORM)) : NULL};
    for_rows(e, n, residual_row, &res);
}

/* ================================================================ feed-forward */
/* The pre-FFN norm: ffn_norm; gpt-oss names it post_attention_norm. */
static const float *ffn_norm_w(const jlm_engine *e, uint32_t l)
{
    const jlm_tensor *t = W(e, l, JLM_R_FFN_NORM);
    if (!t && e->c->arch == JLM_ARCH_GPTOSS)
        t = W(e, l, JLM_R_POST_ATTN_NORM);
    return vec_dense(e, t);
}

static void activate(const jlm_config *c, float *g, const float *u, uint64_t n)
{
    if (c->flags & JLM_F_SWIGLU_OAI) {
        jlm_k_swiglu_oai(g, g, u, n, 1.702f, 7.0f);
    } else if (c->flags & JLM_F_GELU) {
        jlm_k_gelu_fp16(g, g, n);   /* llama.cpp's CPU GELU reads an fp16 table */
        jlm_k_mul(g, g, u, n);
    } else {
        jlm_k_swiglu(g, g, u, n);
    }
}

static void ffn_dense(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t n)
{
    const jlm_config *c = e->c;
    uint32_t E = c->n_embd;
    norm_rows(e, e->h, e->x, ffn_norm_w(e, l), E, n);
    jlm_k_mat wg = mat_at(W(e, l, JLM_R_FFN_GATE), page, page_off, 0);
    jlm_k_mat wu = mat_at(W(e, l, JLM_R_FFN_UP), page, page_off, 0);
    jlm_k_mat wd = mat_at(W(e, l, JLM_R_FFN_DOWN), page, page_off, 0);
    uint64_t F = wg.rows;
    if (!e->dev_here) {
        gate_up_act(e, &wg, &wu, n, e->h);
    } else {
        const jlm_k_mat *ms[2] = {&wg, &wu};
        float *ys[2] = {e->g, e->u};
        matmul_multi(e, ms, ys, 2, n, e->h);   /* one round trip */
        for (uint32_t t = 0; t < n; t++)
            activate(c, e->g + t * F, e->u + t * F, F);
    }
    matmul(e, &wd, n, e->g, e->o);
    layer_rows res = {.l = l, .pn = c->arch == JLM_ARCH_GEMMA3 ? vec_dense(e, W(e, l, JLM_R_POST_FFW_NORM)) : NULL};
    for_rows(e, n, residual_row, &res);
}

/* How an architecture turns router logits into expert weights, as llama.cpp
 * does: gpt-oss takes the top-k of the logits and a softmax of those; the
 * others a softmax first, normalized over the top-k or not. */
static int route_mode(const jlm_config *c)
{
    return (c->flags & JLM_F_SWIGLU_OAI) ? JLM_K_ROUTE_OAI
           : (c->flags & JLM_F_NO_EXPERT_NORM) ? JLM_K_ROUTE_RAW : JLM_K_ROUTE_NORM;
}

/* Top-k routing of one token (normed input h) as llama.cpp does it per
 * architecture; fills e->route for block l and e->route_w. */
static void route(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off, const float *h)
{
    const jlm_config *c = e->c;
    uint32_t ne = c->n_expert, nu = c->n_expert_used;
    unsigned long long t0 = prof_begin(e);
    jlm_k_mat wr = mat_at(W(e, l, JLM_R_ROUTER), page, page_off, 0);
    matvec(e, &wr, h, e->router);
    add_bias(e->router, vec_dense(e, W(e, l, JLM_R_ROUTER_B)), ne);
    jlm_k_moe_route(e->router, ne, nu, route_mode(c), c->expert_scale, e->route + (size_t)l * nu, e->route_w);
    prof_end(e, JLM_PROF_ROUTE, t0);
}

/* x += the mixture of nu expert outputs (outs: nu rows of E) weighted by w,
 * summed from zero into mix in slot order (jlm_k_moe_combine's sum): the
 * fused decode step and each row of a grouped batch. */
static void mix_slots(float *x, float *mix, const float *w, const float *outs, uint32_t nu, uint32_t E)
{
    memset(mix, 0, E * sizeof(float));
    for (uint32_t s = 0; s < nu; s++)
        jlm_k_axpy(mix, w[s], outs + (uint64_t)s * E, E);
    jlm_k_add(x, x, mix, E);
}

/* One token's routed experts in two pool dispatches instead of two (or
 * three, with biases) per expert: gate, up, their biases and the activation
 * of every expert in one, split over the experts' rows end to end; the downs
 * of every expert in another. A decode step of a model with many small
 * experts (Qwen3-MoE: 8 of 128 a layer, 768 rows each) paid a barrier for
 * each. Each row is still one kernel call over the same int8 input row, the
 * biases are added and the activation applied per element on runs that start
 * at multiples of 64 rows (the kernels' vector alignment, as gate_up_act's
 * slices), and each expert's down reads its own quantized row: the outputs
 * are the per-expert path's bit for bit. */
#define MOE_FUSE_MAX 16
typedef struct moe_job {
    const jlm_config *c;
    uint32_t nu;
    uint64_t rows;                 /* of each expert's matrices in this dispatch */
    mm_job   a[MOE_FUSE_MAX], b[MOE_FUSE_MAX];   /* gate, up (b unused for downs) */
    const float *ba[MOE_FUSE_MAX], *bb[MOE_FUSE_MAX];   /* their bias rows, or NULL */
    int      gate_up;
} moe_job;

static void moe_slice(void *ctx, size_t b, size_t en, int tid)
{
    moe_job *j = ctx;
    for (uint32_t s = 0; s < j->nu; s++) {
        uint64_t lo = (uint64_t)s * j->rows, hi = lo + j->rows;
        if (en <= lo || b >= hi)
            continue;
        uint64_t r0 = b > lo ? b - lo : 0, r1 = (en < hi ? en : hi) - lo;
        mm_slice(&j->a[s], r0, r1, tid);
        if (!j->gate_up)
            continue;
        mm_slice(&j->b[s], r0, r1, tid);
        float *g = j->a[s].y + r0, *u = j->b[s].y + r0;
        if (j->ba[s]) add_bias(g, j->ba[s] + r0, r1 - r0);
        if (j->bb[s]) add_bias(u, j->bb[s] + r0, r1 - r0);
        activate(j->c, g, u, r1 - r0);
    }
}

static void moe_dispatch(jlm_engine *e, moe_job *j)
{
    unsigned long long t0 = prof_begin(e);
    size_t grain = j->rows >= 256 && j->rows % 64 == 0 ? 64 : j->rows;
    mm_dispatch(e, 1, (size_t)j->nu * j->rows, grain, moe_slice, j);
    prof_end(e, JLM_PROF_MATMUL, t0);
}

/* The experts of one token (input h) whose frames are frames[s]: e->o row s
 * = expert sel[s]'s output. */
static void moe_experts_fused(jlm_engine *e, uint32_t l, const void *const *frames, uint32_t first,
                              const int32_t *sel, const float *h)
{
    const jlm_config *c = e->c;
    uint32_t nu = c->n_expert_used, E = c->n_embd;
    const jlm_tensor *tg = W(e, l, JLM_R_EXP_GATE), *tu = W(e, l, JLM_R_EXP_UP), *td = W(e, l, JLM_R_EXP_DOWN);
    const float *bg = vec_dense(e, W(e, l, JLM_R_EXP_GATE_B)), *bu = vec_dense(e, W(e, l, JLM_R_EXP_UP_B));
    const float *bd = vec_dense(e, W(e, l, JLM_R_EXP_DOWN_B));
    uint64_t nff = jlm_tensor_rows(tg);
    jlm_k_mat wg[MOE_FUSE_MAX], wu[MOE_FUSE_MAX], wd[MOE_FUSE_MAX];
    moe_job gu = {.c = c, .nu = nu, .rows = nff, .gate_up = 1}, dn = {.c = c, .nu = nu, .rows = E};
    int qg = 0, qd = 0;
    for (uint32_t s = 0; s < nu; s++) {
        uint32_t xe = (uint32_t)sel[s];
        wg[s] = mat_expert(e, tg, frames[s], first, xe);
        wu[s] = mat_expert(e, tu, frames[s], first, xe);
        wd[s] = mat_expert(e, td, frames[s], first, xe);
        gu.a[s] = (mm_job){e->k->matvec[wg[s].type], e->k->matmul[wg[s].type], &wg[s], 1, h, NULL, e->g + s * nff};
        gu.b[s] = (mm_job){e->k->matvec[wu[s].type], e->k->matmul[wu[s].type], &wu[s], 1, h, NULL, e->u + s * nff};
        gu.ba[s] = bg ? bg + (uint64_t)xe * nff : NULL;
        gu.bb[s] = bu ? bu + (uint64_t)xe * nff : NULL;
        dn.a[s] = (mm_job){e->k->matvec[wd[s].type], e->k->matmul[wd[s].type], &wd[s], 1, e->g + s * nff, NULL,
                           e->o + (uint64_t)s * E};
        qg |= !jlm_fmt_type_traits(wg[s].type)->is_float || !jlm_fmt_type_traits(wu[s].type)->is_float;
        qd |= !jlm_fmt_type_traits(wd[s].type)->is_float;
    }
    if (qg) {   /* h's int8 row, shared by every expert's gate and up */
        quant_rows(e, h, wg[0].k, 1);
        for (uint32_t s = 0; s < nu; s++) {
            gu.a[s].xq = jlm_fmt_type_traits(wg[s].type)->is_float ? NULL : e->xq;
            gu.b[s].xq = jlm_fmt_type_traits(wu[s].type)->is_float ? NULL : e->xq;
        }
    }
    moe_dispatch(e, &gu);
    if (qd) {   /* row s of xq: expert s's activation */
        quant_rows(e, e->g, nff, nu);
        for (uint32_t s = 0; s < nu; s++)
            dn.a[s].xq = jlm_fmt_type_traits(wd[s].type)->is_float ? NULL : &e->xq[s];
    }
    moe_dispatch(e, &dn);
    e->xq_of = NULL;
    for (uint32_t s = 0; bd && s < nu; s++)
        add_bias(e->o + (uint64_t)s * E, bd + (uint64_t)sel[s] * E, E);
}

/* x += the routed experts' mixture for one token (row t). Pages in every
 * routed expert first: the minimum working set counts them all. */
static int moe_token(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t t, jlm_err *err)
{
    const jlm_config *c = e->c;
    const jlm_header *hd = &e->m->hdr;
    uint32_t nu = c->n_expert_used, E = c->n_embd;
    float *h = e->h + t * E, *x = e->x + t * E;
    jlm_k_rmsnorm(h, x, ffn_norm_w(e, l), E, c->rms_eps);
    route(e, l, page, page_off, h);
    const jlm_tensor *tg = W(e, l, JLM_R_EXP_GATE), *tu = W(e, l, JLM_R_EXP_UP), *td = W(e, l, JLM_R_EXP_DOWN);
    const float *bg = vec_dense(e, W(e, l, JLM_R_EXP_GATE_B)), *bu = vec_dense(e, W(e, l, JLM_R_EXP_UP_B));
    const float *bd = vec_dense(e, W(e, l, JLM_R_EXP_DOWN_B));
    uint32_t first = (uint32_t)((tg->qs_off - hd->exp_data_off) / hd->exp_page_size);
    const int32_t *sel = e->route + (size_t)l * nu;
    const void *frames[256];
    uint32_t pinned = 0;
    int rc = JLM_OK;
    for (; pinned < nu; pinned++) {
        uint32_t pg = first + (uint32_t)sel[pinned];
        if ((rc = jlm_pager_get(e->pager, JLM_PAGER_EXPERTS, pg, 0, jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg),
                                 &frames[pinned], err)))
            break;
    }
    uint32_t dpinned = 0;   /* expert pages follow their block's backend */
    for (; !rc && e->dev_here && dpinned < pinned; dpinned++) {
        uint32_t pg = first + (uint32_t)sel[dpinned];
        rc = jlm_dev_page_get(e->dev_here, JLM_PAGER_EXPERTS, pg, JLM_PAGER_EXPERT, frames[dpinned],
                              jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg), err);
        if (rc)
            break;
    }
    if (!rc && !e->dev_here && !e->moe_rows && nu <= MOE_FUSE_MAX && nu <= e->nb) {
        moe_experts_fused(e, l, frames, first, sel, h);
        mix_slots(x, e->moe, e->route_w, e->o, nu, E);
    } else if (!rc) {
        memset(e->moe, 0, E * sizeof(float));
        uint64_t nff = jlm_tensor_rows(tg);
        for (uint32_t s = 0; s < nu; s++) {
            uint32_t xe = (uint32_t)sel[s];
            jlm_k_mat wg = mat_expert(e, tg, frames[s], first, xe), wu = mat_expert(e, tu, frames[s], first, xe);
            jlm_k_mat wd = mat_expert(e, td, frames[s], first, xe);
            if (!bg && !bu && !e->dev_here) {
                gate_up_act(e, &wg, &wu, 1, h);   /* one dispatch (see matmul_multi) */
            } else {
                matvec(e, &wg, h, e->g);
                matvec(e, &wu, h, e->u);
                if (bg) add_bias(e->g, bg + (uint64_t)xe * nff, nff);
                if (bu) add_bias(e->u, bu + (uint64_t)xe * nff, nff);
                activate(c, e->g, e->u, nff);
            }
            matvec(e, &wd, e->g, e->o);
            if (bd) add_bias(e->o, bd + (uint64_t)xe * E, E);
            jlm_k_axpy(e->moe, e->route_w[s], e->o, E);   /* jlm_k_moe_combine's sum, one expert at a time */
        }
        jlm_k_add(x, x, e->moe, E);
    }
    for (uint32_t s = 0; s < dpinned; s++)
        jlm_dev_page_put(e->dev_here, JLM_PAGER_EXPERTS, first + (uint32_t)sel[s]);
    for (uint32_t s = 0; s < pinned; s++)
        jlm_pager_unpin(e->pager, JLM_PAGER_EXPERTS, first + (uint32_t)sel[s]);
    return rc;
}

/* moe_batch's routing: the router's logits of every row in one matmul (its
 * rows are each row's matvec, the kernels' invariant), then each row's bias
 * and top-k as route() (per row, over the pool). The last row's selection
 * stays in e->route, as moe_token leaves it. */
static void route_row(jlm_engine *e, void *ctx, uint32_t t)
{
    const jlm_config *c = e->c;
    const uint32_t *l = ctx;
    uint32_t ne = c->n_expert, nu = c->n_expert_used;
    float *lg = e->mrl + (uint64_t)t * ne;
    add_bias(lg, vec_dense(e, W(e, *l, JLM_R_ROUTER_B)), ne);
    jlm_k_moe_route(lg, ne, nu, route_mode(c), c->expert_scale, e->msel + (size_t)t * nu, e->mw + (size_t)t * nu);
}

static void route_rows(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t n)
{
    uint32_t nu = e->c->n_expert_used;
    unsigned long long t0 = prof_begin(e);
    jlm_k_mat wr = mat_at(W(e, l, JLM_R_ROUTER), page, page_off, 0);
    matmul(e, &wr, n, e->h, e->mrl);
    for_rows(e, n, route_row, &l);
    memcpy(e->route + (size_t)l * nu, e->msel + (size_t)(n - 1) * nu, nu * sizeof(int32_t));
    prof_end(e, JLM_PROF_ROUTE, t0);
}

/* Row t's mixture (mix_slots) into its h row (read no more), then onto x. */
static void mix_row(jlm_engine *e, void *ctx, uint32_t t)
{
    uint32_t nu = e->c->n_expert_used, E = e->c->n_embd;
    mix_slots(e->x + (uint64_t)t * E, e->h + (uint64_t)t * E, e->mw + (uint64_t)t * nu,
              e->mo + (uint64_t)t * nu * E, nu, E);
}

/* moe_batch, while expert x computes: the next expert of the batch (the
 * next group with rows) is read ahead on the pager's reader thread, so a
 * batch whose experts are not resident (a first prompt, a budget) reads
 * each while the one before it computes. Only when it fits the budget beside
 * everything resident: a read ahead that evicted would take an expert this
 * batch or the next block may still want. */
static void expert_ahead(jlm_engine *e, uint32_t first, uint32_t x)
{
    uint32_t ne = e->c->n_expert, nx = x + 1;
    while (nx < ne && e->mcnt[nx + 1] == e->mcnt[nx])
        nx++;
    if (nx >= ne)
        return;
    uint64_t ext = jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, first + nx);
    if (jlm_pager_filled(e->pager, JLM_PAGER_EXPERTS, first + nx) >= ext)
        return;
    jlm_pager_counters pc;
    jlm_pager_stats(e->pager, &pc);
    if (!pc.budget || pc.resident_bytes + ext <= pc.budget)
        jlm_pager_prefetch(e->pager, JLM_PAGER_EXPERTS, first + nx);
}

/* moe_batch's copies for expert x, whose rows are the pairs mord[g0..):
 * its input rows gathered from h, and its output rows (down bias added)
 * put back in (row, slot) order in mo. Over the pool: at 2 threads they
 * were most of a MoE prefill's serial time. */
typedef struct moe_rows { uint32_t g0, x; const float *bd; } moe_rows;
static void gather_row(jlm_engine *e, void *ctx, uint32_t i)
{
    const moe_rows *r = ctx;
    uint32_t E = e->c->n_embd;
    memcpy(e->mh + (uint64_t)i * E, e->h + (uint64_t)(e->mord[r->g0 + i] / e->c->n_expert_used) * E,
           E * sizeof(float));
}
static void scatter_row(jlm_engine *e, void *ctx, uint32_t i)
{
    const moe_rows *r = ctx;
    uint32_t E = e->c->n_embd;
    float *o = e->o + (uint64_t)i * E;
    if (r->bd)
        add_bias(o, r->bd + (uint64_t)r->x * E, E);
    memcpy(e->mo + (uint64_t)e->mord[r->g0 + i] * E, o, E * sizeof(float));
}

/* Rows [0, n) of the batch (n >= 2; the CPU or the block's device): x[t] += the routed experts'
 * mixture, as moe_token gives it row by row, with each routed expert's
 * weights read once for all the rows routed to it (one matmul of those rows)
 * instead of once per row: a prefill batch of 128 rows routed to 4 of 32
 * experts streams each expert once, not ~16 times. The same result bit for
 * bit: the routing is moe_token's per row (route_rows); every (row, expert) output is the
 * matmul's row for that input row, which is the matvec's (the kernels'
 * invariant, docs/kernels.md), with the biases added and the activation
 * applied per row as moe_token does; and each row's mixture is summed from
 * zero in its own slot order before it is added to x. One expert is pinned at
 * a time (the minimum working set counts n_expert_used). */
static int moe_batch(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t n, jlm_err *err)
{
    const jlm_config *c = e->c;
    const jlm_header *hd = &e->m->hdr;
    uint32_t nu = c->n_expert_used, ne = c->n_expert, E = c->n_embd;
    norm_rows(e, e->h, e->x, ffn_norm_w(e, l), E, n);
    route_rows(e, l, page, page_off, n);
    /* (row, slot) pairs grouped by expert, rows ascending within a group */
    memset(e->mcnt, 0, (ne + 1) * sizeof *e->mcnt);
    for (uint32_t i = 0; i < n * nu; i++)
        e->mcnt[e->msel[i] + 1]++;
    for (uint32_t x = 0; x < ne; x++)
        e->mcnt[x + 1] += e->mcnt[x];
    for (uint32_t i = 0; i < n * nu; i++)
        e->mord[e->mcnt[e->msel[i]]++] = i;
    for (uint32_t x = ne; x > 0; x--)   /* back to group starts */
        e->mcnt[x] = e->mcnt[x - 1];
    e->mcnt[0] = 0;
    const jlm_tensor *tg = W(e, l, JLM_R_EXP_GATE), *tu = W(e, l, JLM_R_EXP_UP), *td = W(e, l, JLM_R_EXP_DOWN);
    const float *bg = vec_dense(e, W(e, l, JLM_R_EXP_GATE_B)), *bu = vec_dense(e, W(e, l, JLM_R_EXP_UP_B));
    const float *bd = vec_dense(e, W(e, l, JLM_R_EXP_DOWN_B));
    uint32_t first = (uint32_t)((tg->qs_off - hd->exp_data_off) / hd->exp_page_size);
    uint64_t nff = jlm_tensor_rows(tg);
    for (uint32_t x = 0; x < ne; x++) {
        uint32_t g0 = e->mcnt[x], m = e->mcnt[x + 1] - g0, pg = first + x;
        if (!m)
            continue;
        const void *frame;
        uint64_t ext = jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg);
        int rc = jlm_pager_get(e->pager, JLM_PAGER_EXPERTS, pg, 0, ext, &frame, err);
        if (rc)
            return rc;
        if (e->dev_here && (rc = jlm_dev_page_get(e->dev_here, JLM_PAGER_EXPERTS, pg, JLM_PAGER_EXPERT, frame, ext,
                                                  err))) {
            jlm_pager_unpin(e->pager, JLM_PAGER_EXPERTS, pg);
            return rc;
        }
        expert_ahead(e, first, x);
        moe_rows mr = {g0, x, bd};
        for_rows(e, m, gather_row, &mr);
        jlm_k_mat wg = mat_expert(e, tg, frame, first, x), wu = mat_expert(e, tu, frame, first, x);
        jlm_k_mat wd = mat_expert(e, td, frame, first, x);
        if (!bg && !bu && !e->dev_here) {
            gate_up_act(e, &wg, &wu, m, e->mh);
        } else {
            const jlm_k_mat *ms[2] = {&wg, &wu};
            float *ys[2] = {e->g, e->u};
            matmul_multi(e, ms, ys, 2, m, e->mh);   /* on a device: one round trip */
            for (uint32_t i = 0; i < m; i++) {
                float *g = e->g + i * nff, *u = e->u + i * nff;
                if (bg) add_bias(g, bg + (uint64_t)x * nff, nff);
                if (bu) add_bias(u, bu + (uint64_t)x * nff, nff);
                activate(c, g, u, nff);
            }
        }
        matmul(e, &wd, m, e->g, e->o);
        for_rows(e, m, scatter_row, &mr);
        if (e->dev_here)
            jlm_dev_page_put(e->dev_here, JLM_PAGER_EXPERTS, pg);
        jlm_pager_unpin(e->pager, JLM_PAGER_EXPERTS, pg);
    }
    for_rows(e, n, mix_row, NULL);
    e->xq_of = NULL;
    return JLM_OK;
}

/* ================================================================ a batch of tokens */
static void embed(jlm_engine *e, int32_t tok, float *x)
{
    const jlm_tensor *t = W(e, -1, JLM_R_TOKEN_EMBD);
    jlm_k_mat m = mat_dense(e, t);
    jlm_k_dequant_row_ref(t->type, m.qs, m.d, m.sc, m.k, m.rows, (uint64_t)tok, x);
    if (e->c->embd_scale > 0)
        jlm_k_scale(x, x, e->c->embd_scale, e->c->n_embd);
}

/* logits (n, n_vocab) of the rows x (n, n_embd): one matmul, so the output
 * matrix is read once for a batch of sequences (each row as its matvec). */
static void output(jlm_engine *e, const float *x, uint32_t n, float *logits)
{
    const jlm_config *c = e->c;
    for (uint32_t r = 0; r < n; r++)
        jlm_k_rmsnorm(e->h + (uint64_t)r * c->n_embd, x + (uint64_t)r * c->n_embd,
                      vec_dense(e, W(e, -1, JLM_R_OUTPUT_NORM)), c->n_embd, c->rms_eps);
    const jlm_tensor *t = W(e, -1, JLM_R_OUTPUT);
    if (!t)
        t = W(e, -1, JLM_R_TOKEN_EMBD);   /* tied embeddings */
    jlm_k_mat m = mat_dense(e, t);
    matmul(e, &m, n, e->h, logits);
    if (c->final_softcap > 0)
        for (uint64_t i = 0; i < m.rows * n; i++)
            logits[i] = c->final_softcap * tanhf(logits[i] / c->final_softcap);
}

/* Token rows [i, i+b) of one sequence (cache kc/vc) at positions pos0 + i..
 * become the batch's rows [0, b). */
static void bind_rows(jlm_engine *e, void *kc, void *vc, uint32_t pos0, uint32_t b)
{
    for (uint32_t t = 0; t < b; t++) {
        e->bkc[t] = kc;
        e->bvc[t] = vc;
        e->bpos[t] = pos0 + t;
    }
}

/* ---------------------------------------------------------------- device prefetch */
/* While block l's kernels run, the next block's page goes to the device on
 * the backend's copy thread (CUDA; docs/cuda.md, "Overlap"): started here
 * when that block runs on a device (its own: with two, the next block's may
 * be the other one's), is whole in host memory already (a
 * get that would read the disk is left to its turn) and the host budget
 * can hold it pinned; the device then waits for it only before its own
 * kernels. The extra host pin is let go once block l+1's device get (or the
 * prefetch's end) has the copy done. */
void jlm_eng_prefetch_end(jlm_engine *e)
{
    if (!e || e->pf_block == NO_PF)
        return;
    jlm_dev_prefetch_end(e->pf_dev);
    jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, e->pf_block);
    e->pf_block = NO_PF;
}

static void dev_prefetch_next(jlm_engine *e, uint32_t l)
{
    uint32_t nx = l + 1 < e->c->n_layer ? l + 1 : 0;
    jlm_dev *d = block_dev(e, nx);
    if (!d || !e->dev_pf || e->pf_block != NO_PF || nx == l)
        return;
    uint64_t ext = jlm_pager_extent(e->pager, JLM_PAGER_TEXT, nx);
    const void *host;
    if (jlm_pager_filled(e->pager, JLM_PAGER_TEXT, nx) < ext ||
        jlm_pager_get(e->pager, JLM_PAGER_TEXT, nx, 0, ext, &host, NULL))
        return;
    if (jlm_dev_prefetch(d, JLM_PAGER_TEXT, nx, JLM_PAGER_BLOCK, host, ext)) {
        e->pf_block = nx;
        e->pf_dev = d;
    } else
        jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, nx);
}

/* Every layer over rows [0, n) of xs (n_embd floats each, the residual
 * stream); each block page is pinned once for all rows, which run nb at a
 * time through e->x. kc/vc non-NULL: the rows are one sequence's, at
 * positions pos0.. of that cache (any n); NULL: the batch already bound in
 * bkc/bvc/bpos (n <= nb). bidir: the rows attend to each other both ways
 * (an image, one sequence); otherwise causally. */
static int run_layers(jlm_engine *e, float *xs, uint32_t n, void *kc, void *vc, uint32_t pos0, int bidir,
                      jlm_err *err)
{
    const jlm_config *c = e->c;
    const jlm_header *hd = &e->m->hdr;
    float *x0 = e->x;
    int rc = JLM_OK;
    e->bidir_end = bidir ? pos0 + n : 0;
    for (uint32_t l = 0; l < c->n_layer && !rc; l++) {
        const void *page;
        uint64_t page_off = hd->data_off + (uint64_t)l * hd->page_size;
        rc = jlm_pager_get(e->pager, JLM_PAGER_TEXT, l, 0, jlm_pager_extent(e->pager, JLM_PAGER_TEXT, l), &page, err);
        if (rc) {
            rc = jlm_err_prefix(err, rc, "%s: block %u", e->m->path, l);
            break;
        }
        /* the block after this one (block 0 of the next pass after the last)
         * is read while this one computes (docs/pager.md, Prefetch) */
        jlm_pager_prefetch(e->pager, JLM_PAGER_TEXT, l + 1 < c->n_layer ? l + 1 : 0);
        e->dev_here = block_dev(e, l);
        if (e->pf_block != NO_PF && (e->pf_block != l || !e->dev_here))
            jlm_eng_prefetch_end(e);   /* not the block it was started for */
        if (e->dev_here)
            rc = jlm_dev_page_get(e->dev_here, JLM_PAGER_TEXT, l, JLM_PAGER_BLOCK, page,
                                  jlm_pager_extent(e->pager, JLM_PAGER_TEXT, l), err);
        if (e->pf_block == l) {   /* the device get consumed the prefetch: its host pin goes */
            jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, l);
            e->pf_block = NO_PF;
        }
        if (rc) {
            jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, l);
            rc = jlm_err_prefix(err, rc, "%s: block %u on the device", e->m->path, l);
            break;
        }
        dev_prefetch_next(e, l);   /* also from a CPU block: the device after the wrap */
        for (uint32_t i = 0; i < n; i += e->nb) {   /* every key first: later rows may see them */
            uint32_t b = n - i < e->nb ? n - i : e->nb;
            if (kc)
                bind_rows(e, kc, vc, pos0 + i, b);
            e->x = xs + (uint64_t)i * c->n_embd;
            attn_kv(e, l, page, page_off, b);
        }
        for (uint32_t i = 0; i < n && !rc; i += e->nb) {
            uint32_t b = n - i < e->nb ? n - i : e->nb;
            if (kc)
                bind_rows(e, kc, vc, pos0 + i, b);
            e->x = xs + (uint64_t)i * c->n_embd;
            attn_out(e, l, page, page_off, b);
            if (W(e, l, JLM_R_EXP_GATE)) {
                if (b > 1 && !e->moe_rows)
                    rc = moe_batch(e, l, page, page_off, b, err);
                else
                    for (uint32_t t = 0; t < b && !rc; t++)
                        rc = moe_token(e, l, page, page_off, t, err);
            } else {
                ffn_dense(e, l, page, page_off, b);
            }
        }
        if (e->dev_here)
            jlm_dev_page_put(e->dev_here, JLM_PAGER_TEXT, l);
        jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, l);
        if (rc)
            rc = jlm_err_prefix(err, rc, "%s: block %u experts", e->m->path, l);
    }
    if (rc)
        jlm_eng_prefetch_end(e);
    e->x = x0;
    e->bidir_end = 0;
    e->dev_here = e->out_dev;
    return rc;
}

/* tokens[0, n) at the caches and positions bkc/bvc/bpos[0, n), n <= nb:
 * each block page is pinned once for the whole batch. logits: after the last
 * token (n_vocab), or with all_logits after every token (n, n_vocab). */
static int forward(jlm_engine *e, const int32_t *tokens, uint32_t n, float *logits, int all_logits, jlm_err *err)
{
    const jlm_config *c = e->c;
    unsigned long long t0 = e->prof ? prof_now() : 0;
    for (uint32_t t = 0; t < n; t++)
        embed(e, tokens[t], e->x + t * c->n_embd);
    int rc = run_layers(e, e->x, n, NULL, NULL, 0, 0, err);
    if (!rc && logits)
        output(e, e->x + (uint64_t)(all_logits ? 0 : n - 1) * c->n_embd, all_logits ? n : 1, logits);
    if (t0) {
        e->pr.total_ns += prof_now() - t0;
        e->pr.evals++;
        e->pr.tokens += n;
    }
    return rc;
}

int jlm_engine_eval_embd(jlm_engine *e, const float *embd, uint32_t n, int bidir, float *logits, jlm_err *err)
{
    const jlm_config *c = e->c;
    if (n == 0 || (uint64_t)e->n_past + n > e->n_ctx)
        return jlm_errf(err, JLM_ERANGE, "context full: %u + %u embeddings exceed %u positions (-c)", e->n_past, n,
                        e->n_ctx);
    float *xs = malloc((size_t)n * c->n_embd * sizeof *xs);
    if (!xs)
        return jlm_errf(err, JLM_ENOMEM, "out of memory for %u embeddings", n);
    memcpy(xs, embd, (size_t)n * c->n_embd * sizeof *xs);   /* entered as they are: no embedding scale */
    int rc = run_layers(e, xs, n, e->kc, e->vc, e->n_past, bidir, err);
    if (!rc && logits)
        output(e, xs + (uint64_t)(n - 1) * c->n_embd, 1, logits);
    free(xs);
    if (!rc)
        e->n_past += n;
    return rc;
}

static int check_ids(const jlm_engine *e, const int32_t *tokens, uint32_t n, jlm_err *err)
{
    uint64_t nv = jlm_tensor_rows(W(e, -1, JLM_R_TOKEN_EMBD));
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint64_t)tokens[i] >= nv)
            return jlm_errf(err, JLM_ERANGE, "token id %d outside [0, %llu)", tokens[i], (unsigned long long)nv);
    return JLM_OK;
}

/* tokens[0, n) of one sequence (cache kc/vc, *n_past), nb at a time. */
static int eval_one(jlm_engine *e, void *kc, void *vc, uint32_t *n_past, const int32_t *tokens, uint32_t n,
                    float *logits, jlm_err *err)
{
    int rc = check_ids(e, tokens, n, err);
    if (rc)
        return rc;
    if ((uint64_t)*n_past + n > e->n_ctx)
        return jlm_errf(err, JLM_ERANGE, "context full: %u + %u tokens exceed %u positions (-c)", *n_past, n, e->n_ctx);
    for (uint32_t i = 0; i < n; i += e->nb) {
        uint32_t b = n - i < e->nb ? n - i : e->nb;
        bind_rows(e, kc, vc, *n_past, b);
        rc = forward(e, tokens + i, b, i + b == n ? logits : NULL, 0, err);
        if (rc)
            return rc;
        *n_past += b;
    }
    return JLM_OK;
}

int jlm_engine_eval(jlm_engine *e, const int32_t *tokens, uint32_t n, float *logits, jlm_err *err)
{
    return eval_one(e, e->kc, e->vc, &e->n_past, tokens, n, logits, err);
}

/* ================================================================ sequences */
int jlm_engine_seq_create(jlm_engine *e, jlm_engine_seq **out, jlm_err *err)
{
    uint64_t kv = (uint64_t)e->c->n_layer * e->kv_ctx;
    jlm_engine_seq *s = calloc(1, sizeof *s);
    if (s) {
        s->kc = zalloc(kv * e->kv_dim * e->kv_es);
        s->vc = zalloc(kv * e->kv_dim_v * e->kv_es);
    }
    if (!s || !s->kc || !s->vc) {
        jlm_engine_seq_destroy(s);
        return jlm_errf(err, JLM_ENOMEM, "%s: KV cache of a sequence (%u positions): out of memory", e->m->path,
                        e->n_ctx);
    }
    *out = s;
    return JLM_OK;
}

void jlm_engine_seq_destroy(jlm_engine_seq *s)
{
    if (!s) return;
    free(s->kc);
    free(s->vc);
    free(s);
}

void jlm_engine_seq_rewind(jlm_engine_seq *s, uint32_t pos) { if (pos < s->n_past) s->n_past = pos; }
uint32_t jlm_engine_seq_n_past(const jlm_engine_seq *s) { return s->n_past; }

int jlm_engine_eval_seq(jlm_engine *e, jlm_engine_seq *s, const int32_t *tokens, uint32_t n, float *logits,
                        jlm_err *err)
{
    return eval_one(e, s->kc, s->vc, &s->n_past, tokens, n, logits, err);
}

int jlm_engine_eval_batch(jlm_engine *e, jlm_engine_seq *const *seqs, const int32_t *tokens, uint32_t n,
                          float *logits, jlm_err *err)
{
    if (n == 0 || n > BATCH)
        return jlm_errf(err, JLM_EINVAL, "a batch of %u sequences (1..%d)", n, BATCH);
    int rc = check_ids(e, tokens, n, err);
    for (uint32_t t = 0; !rc && t < n; t++) {
        for (uint32_t u = 0; u < t; u++)
            if (seqs[u] == seqs[t])
                return jlm_errf(err, JLM_EINVAL, "a sequence appears twice in one batch");
        if (seqs[t]->n_past + 1 > e->n_ctx)
            return jlm_errf(err, JLM_ERANGE, "context full: sequence %u holds %u positions (-c)", t, e->n_ctx);
        e->bkc[t] = seqs[t]->kc;
        e->bvc[t] = seqs[t]->vc;
        e->bpos[t] = seqs[t]->n_past;
    }
    if (!rc) rc = forward(e, tokens, n, logits, 1, err);
    for (uint32_t t = 0; !rc && t < n; t++)
        seqs[t]->n_past++;
    return rc;
}
