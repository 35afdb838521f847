/* exec_attn.c - the executor's attention ops (engine/prog.h): the fused
 * Q/K/V matmul, biases, q/k norms and RoPE, the KV cache, the attention
 * itself, and their fusion into one dispatch for a decoded token. See
 * exec_int.h. */
#include "engine/exec_int.h"

#include <math.h>
#include <string.h>

/* ================================================================ attention */
/* Layer l's run of KV head 0 in cache c: keys (val 0) or values. */
static uint8_t *head0(const jlm_engine *e, void *c, int val, uint32_t l) { return jlm_kv_head(e, c, val, l, 0); }

/* jlm_k_fattn for KV head g (k, v: layer l's head 0, as head0): on the
 * cache itself when the kernel reads its types (kv_direct), else on the
 * range the rows [r0, r1) see, widened into thread tid's slab (the same
 * values as F32: jlm_k_fattn's result is that of the cache it read). */
static void fattn_run(jlm_engine *e, const jlm_k_fattn *p, const float *q, const void *k, const void *v, float *out,
                      uint32_t g, uint32_t r0, uint32_t r1, int tid)
{
    float *scratch = e->fa + (size_t)tid * e->fa_floats;
    if (e->kv_direct) {
        e->k->fattn(p, q, k, v, out, g, r0, r1, scratch);
        return;
    }
    uint32_t j0 = UINT32_MAX, j1 = 0;
    for (uint32_t r = r0; r < r1; r++)
        if (p->lo[r] < p->hi[r]) {
            if (p->lo[r] < j0) j0 = p->lo[r];
            if (p->hi[r] > j1) j1 = p->hi[r];
        }
    float *slab = jlm_kv_slab(e, tid);
    if (j0 < j1)
        jlm_kv_widen(e, (const uint8_t *)k + (uint64_t)g * e->kv_ctx * e->krow,
                     (const uint8_t *)v + (uint64_t)g * e->kv_ctx * e->vrow, j0, j1, slab);
    jlm_k_fattn sp = *p;
    sp.kh_stride = sp.vh_stride = 0;   /* the slab is head g's alone */
    sp.v_stride = e->hd_v;
    sp.kv_f16 = 0;
    e->k->fattn(&sp, q, slab, slab + (uint64_t)e->kv_ctx * e->hd, out, g, r0, r1, scratch);
}

static int is_swa_layer(const jlm_config *c, uint32_t l)
{
    return c->swa_window && c->swa_period && (l % c->swa_period) < c->swa_period - 1;
}

/* The first key a query at pos sees on layer l: 0 on a full-attention
 * layer; pos - window + 1 on a sliding-window one (llama.cpp's standard
 * SWA); the start of pos's chunk of SWAWindow positions on Llama 4's chunked
 * layers (MoEStep > 0: llama.cpp's LLAMA_SWA_TYPE_CHUNKED, docs/format.md). */
uint32_t jlm_ex_first_key(const jlm_config *c, uint32_t l, uint32_t pos)
{
    if (!is_swa_layer(c, l))
        return 0;
    if (c->arch == JLM_ARCH_LLAMA && c->moe_step)
        return pos / c->swa_window * c->swa_window;
    return pos >= c->swa_window ? pos - c->swa_window + 1 : 0;
}

/* Llama 4's attention temperature on its no-RoPE layers (n_rot 0 there):
 * q x (log(floor((pos + AttnTempOffset) / AttnTempFloor) + 1) x AttnTempScale
 * + 1), as llama.cpp's attn_temp input computes it; 1 elsewhere. */
float jlm_ex_q_temp(const jlm_config *c, const jlm_k_rope *rp, uint32_t pos)
{
    if (!c->attn_temp_floor || c->attn_temp_scale == 0.0f || rp->n_rot)
        return 1.0f;
    const float f = floorf(((float)pos + c->attn_temp_offset) / (float)c->attn_temp_floor);
    return (float)(log((double)f + 1.0) * c->attn_temp_scale + 1.0);
}

static void scale_q(float *q, uint32_t n, float s)
{
    for (uint32_t i = 0; s != 1.0f && i < n; i++)
        q[i] *= s;
}

void jlm_ex_rope_params(const jlm_engine *e, uint32_t l, jlm_k_rope *p)
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
    if (c->arch == JLM_ARCH_LLAMA && c->moe_step && c->swa_period && (l + 1) % c->swa_period == 0)
        p->n_rot = 0;   /* Llama 4: every SWAPeriod-th layer has no RoPE (docs/format.md) */
}

/* One token's attention over the cache at position pos: q -> out, heads
 * split across the pool (each thread has its own score row). */
typedef struct attn_job {
    jlm_engine *e;
    jlm_k_attn  ap;
    const float *q, *sinks;
    void       *kc, *vc;                /* the token's caches (jlm_kv_head) */
    float      *out;
    uint32_t    l, n_kv, group;
} attn_job;

/* KV heads [g0, g1), each copied once into this thread's slab as F32 rows
 * (keys then values, packed: stride hd / hd_v; the cache keeps keys in
 * tiles or Q8_0 rows and may hold F16 or Q8_0) and attended by its group of query heads, so GQA
 * reads each head once. The kernel then sees exactly the values the cache
 * holds. The per-token path (JLM_ATTN=token) only: a reference. */
static void attn_heads(void *ctx, size_t g0, size_t g1, int tid)
{
    attn_job *j = ctx;
    jlm_engine *e = j->e;
    jlm_k_attn ap = j->ap;
    float *scores = e->scores + (size_t)tid * e->n_ctx;
    float *k32 = jlm_kv_slab(e, tid), *v32 = k32 + (size_t)e->kv_ctx * e->hd;
    for (size_t g = g0; g < g1; g++) {
        const uint8_t *kh = jlm_kv_head(e, j->kc, 0, j->l, (uint32_t)g), *vh = jlm_kv_head(e, j->vc, 1, j->l, (uint32_t)g);
        for (uint32_t p = 0; p < j->n_kv; p++) {
            jlm_kv_get_key(e, kh, p, k32 + (uint64_t)p * e->hd);
            jlm_kv_get_row(e->vt, vh + p * e->vrow, v32 + (uint64_t)p * e->hd_v, e->hd_v);
        }
        for (size_t h = g * j->group; h < (g + 1) * j->group; h++) {
            ap.has_sink = j->sinks != NULL;
            ap.sink = j->sinks ? j->sinks[h] : 0.0f;
            jlm_k_attn_head(&ap, j->q + h * e->hd, k32, v32, j->n_kv, scores, j->out + h * e->hd_v);
        }
    }
}

static void attend(jlm_engine *e, uint32_t l, uint32_t t, const float *q, float *out, const float *sinks)
{
    uint32_t pos = e->bpos[t];
    const jlm_config *c = e->c;
    /* sliding window: a key at j is hidden when pos - j >= window (llama.cpp's standard SWA);
     * inside an image (bidir_end) later keys are seen too and never cut by the window */
    uint32_t n_kv = pos < e->bidir_end ? e->bidir_end : pos + 1;
    int swa = is_swa_layer(c, l);
    uint32_t lo = jlm_ex_first_key(c, l, pos);
    for (uint32_t j = 0; swa && j < n_kv; j++)
        e->mask[j] = j < lo ? -INFINITY : 0.0f;
    attn_job j = {
        .e = e, .q = q, .out = out, .l = l, .n_kv = n_kv, .group = c->n_head / c->n_kv_head,
        .kc = e->bkc[t], .vc = e->bvc[t],
        .sinks = sinks,
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
 * image), from jlm_ex_first_key on a sliding-window or chunked layer (attend's mask). */
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
    uint32_t nq = (j->n + JLM_K_FATTN_BQ - 1) / JLM_K_FATTN_BQ, nu = nq * j->n_kv_head;
    for (size_t s = s0; s < s1; s++)
        for (uint32_t u = (uint32_t)s; u < nu; u += j->nt) {
            uint32_t qt = nq - 1 - u / j->n_kv_head, g = u % j->n_kv_head;   /* costly tiles first */
            uint32_t r0 = qt * JLM_K_FATTN_BQ, r1 = r0 + JLM_K_FATTN_BQ < j->n ? r0 + JLM_K_FATTN_BQ : j->n;
            fattn_run(j->e, &j->p, j->q, j->k, j->v, j->out, g, r0, r1, tid);
        }
}

static void attend_rows(jlm_engine *e, uint32_t l, uint32_t t0, uint32_t n, const float *sinks)
{
    const jlm_config *c = e->c;
    uint32_t lo[PREFILL_MAX], hi[PREFILL_MAX];
    uint64_t work = 0;
    for (uint32_t r = 0; r < n; r++) {
        uint32_t pos = e->bpos[t0 + r];
        hi[r] = pos < e->bidir_end ? e->bidir_end : pos + 1;
        lo[r] = jlm_ex_first_key(c, l, pos);
        work += hi[r] - lo[r];
    }
    fattn_job j = {
        .e = e, .q = e->q + (uint64_t)t0 * e->q_dim, .out = e->att + (uint64_t)t0 * c->n_head * e->hd_v,
        .k = head0(e, e->bkc[t0], 0, l), .v = head0(e, e->bvc[t0], 1, l),
        .n = n, .n_kv_head = c->n_kv_head,
        .p = {.head_dim = e->hd, .head_dim_v = e->hd_v, .group = c->n_head / c->n_kv_head,
              .q_stride = e->q_dim, .o_stride = (uint64_t)c->n_head * e->hd_v,
              .k_stride = e->hd, .v_stride = e->hd_v, .kh_stride = (uint64_t)e->kv_ctx * e->hd,
              .vh_stride = (uint64_t)e->kv_ctx * e->hd_v, .k_tiled = 1, .kv_f16 = e->kt == KV_F16,
              .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)e->hd),
              .softcap = c->attn_softcap, .sinks = sinks, .lo = lo, .hi = hi},
    };
    /* short contexts are not worth a dispatch (attend's 64 keys) */
    jlm_pool *pool = work >= 64 ? e->pool : NULL;
    j.nt = pool ? (uint32_t)jlm_pool_n_threads(pool) : 1;
    unsigned long long pt = prof_begin(e);
    jlm_pool_for(pool, j.nt, 1, fattn_slice, &j);
    prof_end(e, JLM_PROF_ATTN, pt);
}

/* One token's k and v (bias, norm, RoPE) into the cache, or its q (bias,
 * norm, RoPE). Rows of jlm_ex_for_rows; layer_rows holds what they share:
 * the layer, its RoPE parameters, the bias (k's or q's), v's bias, the q/k
 * norm over the whole vector (wide) or per head (hn). */
typedef struct layer_rows { uint32_t l; jlm_k_rope rp; const float *b, *vb, *wide, *hn; } layer_rows;

/* What every head of a token's q or k gets after its bias: its RMS norm (n:
 * per head; NULL: none, or done on the whole vector, QK_WIDE), RoPE by
 * the position's cs (NULL: no position encoding). kv_row, q_row and the
 * fused decode dispatch (attn_qkv_heads) all finish heads here. */
static void head_norm_rope(const jlm_engine *e, float *x, const float *n, const jlm_k_rope *rp, const float *cs)
{
    if (e->qk_unit) {   /* Llama 4: RoPE, then a weightless norm; neither on its no-RoPE layers (n_rot 0) */
        if (cs && rp->n_rot) {
            jlm_k_rope_rotate(cs, rp, x, 1, e->hd);
            jlm_k_rmsnorm(x, x, NULL, e->hd, e->c->rms_eps);
        }
        return;
    }
    if (n)
        jlm_k_rmsnorm(x, x, n, e->hd, e->c->rms_eps);
    if (cs)
        jlm_k_rope_rotate(cs, rp, x, 1, e->hd);
}

/* The q/k norm weight of role r as the op applies it: over the whole
 * projection (JLM_OPF_QK_WIDE) or head by head. */
static void qk_norms(const jlm_engine *e, const jlm_op *op, const jlm_ex_blk *b, uint16_t r, layer_rows *j)
{
    const float *w = blk_vec(e, b, r);
    j->wide = (op->flags & JLM_OPF_QK_WIDE) ? w : NULL;
    j->hn = (op->flags & JLM_OPF_QK_WIDE) ? NULL : w;
}

static void wide_norm(const jlm_engine *e, const float *w, float *x, uint64_t n)
{
    if (w)
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
    add_bias(k, j->b, e->kv_dim);
    add_bias(v, j->vb, e->kv_dim_v);
    wide_norm(e, j->wide, k, e->kv_dim);
    const float *cs = rope_cs(e, &j->rp, e->bpos[t], csb);
    for (uint32_t g = 0; g < c->n_kv_head; g++) {   /* head-major, keys in tiles (model_int.h) */
        head_norm_rope(e, k + g * e->hd, j->hn, &j->rp, cs);
        jlm_kv_put_key(e, jlm_kv_head(e, e->bkc[t], 0, j->l, g), e->bpos[t], k + g * e->hd);
        jlm_kv_put_row(e->vt, jlm_kv_head(e, e->bvc[t], 1, j->l, g) + e->bpos[t] * e->vrow, v + g * e->hd_v, e->hd_v);
    }
}

static void q_row(jlm_engine *e, void *ctx, uint32_t t)
{
    const layer_rows *j = ctx;
    float *q = e->q + t * e->q_dim, csb[JLM_MAX_HEAD_DIM];
    add_bias(q, j->b, e->q_dim);
    wide_norm(e, j->wide, q, e->q_dim);
    const float *cs = rope_cs(e, &j->rp, e->bpos[t], csb);
    for (uint32_t h = 0; h < e->c->n_head; h++)
        head_norm_rope(e, q + h * e->hd, j->hn, &j->rp, cs);
    scale_q(q, e->q_dim, jlm_ex_q_temp(e->c, &j->rp, e->bpos[t]));
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
    const float *qb, *kb, *vb, *qn, *kn; /* biases and per-head norms (KV_STORE's and Q_ROPE's operands) */
    unsigned long long att_ns;         /* thread 0's time in the per-head part (--profile) */
} qkva_job;

static void qkva_slice(void *ctx, size_t b, size_t en, int tid)
{
    qkva_job *j = ctx;
    jlm_engine *e = j->e;
    const jlm_config *c = e->c;
    uint32_t G = c->n_head / c->n_kv_head, hd = e->hd, hv = e->hd_v;
    const float *qb = j->qb, *kb = j->kb, *vb = j->vb, *qn = j->qn, *kn = j->kn;
    uint32_t pos = e->bpos[0];
    for (size_t part = b; part < en; part++) {
        uint32_t g0 = (uint32_t)(part * c->n_kv_head / j->nparts), g1 = (uint32_t)((part + 1) * c->n_kv_head / j->nparts);
        jlm_ex_mm_slice(&j->j[0], (uint64_t)g0 * G * hd, (uint64_t)g1 * G * hd, tid);
        jlm_ex_mm_slice(&j->j[1], (uint64_t)g0 * hd, (uint64_t)g1 * hd, tid);
        jlm_ex_mm_slice(&j->j[2], (uint64_t)g0 * hv, (uint64_t)g1 * hv, tid);
        unsigned long long t0 = e->prof && tid == 0 ? prof_now() : 0;
        for (uint32_t g = g0; g < g1; g++) {
            float *k = e->kk + (uint64_t)g * hd, *v = e->vv + (uint64_t)g * hv;
            add_bias(k, kb ? kb + (uint64_t)g * hd : NULL, hd);
            add_bias(v, vb ? vb + (uint64_t)g * hv : NULL, hv);
            head_norm_rope(e, k, kn, &j->rp, j->cs);
            jlm_kv_put_key(e, jlm_kv_head(e, e->bkc[0], 0, j->l, g), pos, k);
            jlm_kv_put_row(e->vt, jlm_kv_head(e, e->bvc[0], 1, j->l, g) + pos * e->vrow, v, hv);
            for (uint32_t h = g * G; h < (g + 1) * G; h++) {
                float *q = e->q + (uint64_t)h * hd;
                add_bias(q, qb ? qb + (uint64_t)h * hd : NULL, hd);
                head_norm_rope(e, q, qn, &j->rp, j->cs);
                scale_q(q, hd, jlm_ex_q_temp(c, &j->rp, pos));
            }
            fattn_run(e, &j->p, e->q, j->k, j->v, e->att, g, 0, 1, tid);
        }
        if (t0)
            j->att_ns += prof_now() - t0;
    }
}

/* QKV, KV_STORE, Q, Q_ROPE and ATTENTION for one token (n == 1) in one
 * dispatch, where it applies: the CPU, a pool whose threads divide the KV
 * heads, the batched attention, per-head norms; 0: the caller takes the
 * general path (each op by itself). The operands are those ops' own. */
static int attn_qkv_heads(jlm_engine *e, const jlm_ex_blk *b, const jlm_k_mat *wq, const jlm_k_mat *wk,
                          const jlm_k_mat *wv)
{
    const jlm_config *c = e->c;
    const jlm_op *kv = jlm_ex_find(b->p, JLM_OP_KV_STORE), *qr = jlm_ex_find(b->p, JLM_OP_Q_ROPE);
    const jlm_op *at = jlm_ex_find(b->p, JLM_OP_ATTENTION);
    int nt = jlm_pool_n_threads(e->pool);
    if (nt < 2 || c->n_kv_head % (uint32_t)nt || e->attn_token || e->bidir_end || !kv || !qr || !at ||
        ((kv->flags | qr->flags) & JLM_OPF_QK_WIDE))
        return 0;
    uint32_t l = b->l;
    unsigned long long t0 = prof_begin(e);
    uint32_t pos = e->bpos[0];
    qkva_job j = {.e = e, .l = l, .nparts = (uint32_t)nt, .hi = pos + 1, .lo = jlm_ex_first_key(c, l, pos),
                  .k = head0(e, e->bkc[0], 0, l), .v = head0(e, e->bvc[0], 1, l),
                  .qb = blk_vec(e, b, qr->w[0]), .kb = blk_vec(e, b, kv->w[0]), .vb = blk_vec(e, b, kv->w[1]),
                  .qn = blk_vec(e, b, qr->w[1]), .kn = blk_vec(e, b, kv->w[2])};
    const jlm_k_mat *ms[3] = {wq, wk, wv};
    float *ys[3] = {e->q, e->kk, e->vv};
    int quant = 0;
    for (int i = 0; i < 3; i++) {
        j.j[i] = (mm_job){e->k->matvec[ms[i]->type], e->k->matmul[ms[i]->type], ms[i], 1, e->h, NULL, ys[i]};
        quant |= !jlm_fmt_type_traits(ms[i]->type)->is_float;
    }
    if (quant) {
        jlm_ex_quant_rows(e, e->h, wq->k, 1);
        e->xq_of = e->h;
        for (int i = 0; i < 3; i++)
            if (!jlm_fmt_type_traits(ms[i]->type)->is_float)
                j.j[i].xq = e->xq;
    }
    float csb[JLM_MAX_HEAD_DIM];   /* once for the token, not once a head */
    jlm_ex_rope_params(e, l, &j.rp);
    j.cs = rope_cs(e, &j.rp, pos, csb);
    j.p = (jlm_k_fattn){.head_dim = e->hd, .head_dim_v = e->hd_v, .group = c->n_head / c->n_kv_head,
                        .q_stride = e->q_dim, .o_stride = (uint64_t)c->n_head * e->hd_v, .k_stride = e->hd,
                        .v_stride = e->hd_v, .kh_stride = (uint64_t)e->kv_ctx * e->hd,
                        .vh_stride = (uint64_t)e->kv_ctx * e->hd_v, .k_tiled = 1, .kv_f16 = e->kt == KV_F16,
                        .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)e->hd),
                        .softcap = c->attn_softcap, .sinks = blk_vec(e, b, at->w[0]),
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

void jlm_ex_qkv(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b)
{
    uint32_t n = b->n;
    const float *x = jlm_ex_buf(e, op->src);
    jlm_k_mat wk = blk_mat(e, b, op->w[1]), wv = blk_mat(e, b, op->w[2]);
    const jlm_tensor *tq = blk_w(e, b, op->w[0]);
    b->att_done = 0;
    if (n == 1 && !e->dev_here && tq && x == e->h) {
        jlm_k_mat wq = blk_mat(e, b, op->w[0]);
        if ((b->att_done = attn_qkv_heads(e, b, &wq, &wk, &wv)))
            return;
    }
    if (tq) {
        /* Q too, for the Q op of these rows (fused dispatches; on a device,
         * one round trip) */
        jlm_k_mat wq = blk_mat(e, b, op->w[0]);
        const jlm_k_mat *ms[3] = {&wq, &wk, &wv};
        float *ys[3] = {e->q, e->kk, e->vv};
        jlm_ex_matmul_multi(e, ms, ys, 3, n, x);
        e->q_ready_x = e->x;
        e->q_ready_l = b->l;
    } else {
        jlm_ex_matmul(e, &wk, n, x, e->kk);
        jlm_ex_matmul_x(e, &wv, n, x, e->vv, 1);   /* the same quantized rows */
    }
}

void jlm_ex_kv_store(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b)
{
    if (b->att_done)
        return;   /* attn_qkv_heads stored them */
    layer_rows rj = {.l = b->l, .b = blk_vec(e, b, op->w[0]), .vb = blk_vec(e, b, op->w[1])};
    qk_norms(e, op, b, op->w[2], &rj);
    jlm_ex_rope_params(e, b->l, &rj.rp);
    jlm_ex_for_rows(e, b->n, kv_row, &rj);
}

/* q of these rows: left by QKV (or the whole attention, attn_qkv_heads) when
 * it ran on the same rows of the same layer; else norm and matmul. */
void jlm_ex_q(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b)
{
    int ready = e->q_ready_x == e->x && e->q_ready_l == b->l;
    b->att_done = e->att_ready_x == e->x && e->att_ready_l == b->l;
    e->q_ready_x = NULL;
    e->att_ready_x = NULL;
    if (ready || b->att_done)
        return;
    jlm_ex_norm_rows(e, e->h, e->x, blk_vec(e, b, op->w[0]), e->c->n_embd, b->n);
    jlm_k_mat wq = blk_mat(e, b, op->w[1]);
    jlm_ex_matmul(e, &wq, b->n, e->h, e->q);
}

void jlm_ex_q_rope(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b)
{
    if (b->att_done)
        return;
    layer_rows rj = {.l = b->l, .b = blk_vec(e, b, op->w[0])};
    qk_norms(e, op, b, op->w[1], &rj);
    jlm_ex_rope_params(e, b->l, &rj.rp);
    jlm_ex_for_rows(e, b->n, q_row, &rj);
}

/* att[t] = attention of q[t] over the cache: token t sees keys up to
 * bpos[t] (up to bidir_end inside an image). */
void jlm_ex_attention(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b)
{
    if (b->att_done)
        return;
    uint32_t n = b->n, l = b->l, A = e->c->n_head * e->hd_v;
    const float *sinks = blk_vec(e, b, op->w[0]);
    for (uint32_t t = 0; e->attn_token && t < n; t++)
        attend(e, l, t, e->q + t * e->q_dim, e->att + t * A, sinks);
    /* runs of rows of one sequence at consecutive positions: one batched
     * attention each (a prefill batch is one run, a serve batch n runs of 1) */
    for (uint32_t t = 0, t1; !e->attn_token && t < n; t = t1) {
        for (t1 = t + 1; t1 < n && e->bkc[t1] == e->bkc[t] && e->bvc[t1] == e->bvc[t] &&
                         e->bpos[t1] == e->bpos[t1 - 1] + 1; t1++)
            ;
        attend_rows(e, l, t, t1 - t, sinks);
    }
}
