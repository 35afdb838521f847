/* exec_cu_mla.c - latent attention (deepseek2: engine/prog.h's MLA_KV,
 * MLA_Q, MLA_ATTN) enqueued on the CUDA compute stream for exec_cu.c, in
 * exec_mla.c's absorbed form and with its parameters (jlm_ex_mla_rope,
 * jlm_ex_mla_scale, jlm_ex_mla_sheet), from the kernels a block already
 * uses: matvec (over int8 rows quantized on the device, bit-identical to the
 * CPU's), rmsnorm, RoPE, copies, to_f16 and attention.
 *
 * The layer's device cache (exec_cu.c's kc, rows of kv_dim = KVLoraRank +
 * NRot, F32 or F16 as the engine's --kv) holds the normed latent and the
 * RoPE'd shared key. Each head's query (its nope part) is moved into the
 * latent space by its attn_k_b sheet; all heads attend as one KV head
 * (head_dim KVLoraRank + NRot, the values the latent part of the same rows);
 * each head's latent output is expanded by its attn_v_b sheet into the
 * attention rows. Each of those two is one batched matvec launch over all
 * heads and rows (jlm_cu_rt_matvec_batch: head h reads sheet h and its slice
 * of every row, writes its own slice), the input quantized once; where a
 * batch cannot be made (a quantized head slice off a 32-block, sheets
 * without one stride), a launch a head with its rows gathered and scattered
 * by device copies (one row: read and written in place). Nothing comes
 * down: a deepseek2 block makes the one round trip of its MoE op, if any.
 * Shapes the kernels cannot take (quantized sheets off whole 32-blocks,
 * planes outside a device frame, widths that disagree) are
 * JLM_EUNSUPPORTED in the dry walk, before anything is enqueued. */
#include "engine/backend_cu_int.h"
#include "engine/exec_dev.h"

#include <stdlib.h>

#include "kernels/cuda/cuda.h"

#define UNSUP JLM_EUNSUPPORTED
#define CS JLM_CU_S_COMPUTE

/* Float regions: q-LoRA rows, the projected queries (plus nope floats: the
 * last row's RoPE reads a head's width from its rope part), the queries in
 * the latent space [latent | rope] (row, head), the heads' latent outputs
 * (row, head), a head's gathered input and output rows. */
enum { RG_QA, RG_QF, RG_QL, RG_OL, RG_GI, RG_GO, RG_N };
/* int8 row tables: act records of the rows' width qa, nope, KVLoraRank (a
 * table of `rows` records each), then the batches' (head, row) records of
 * attn_k_b (nope wide, in the Q rows) and attn_v_b (KVLoraRank wide, in the
 * heads' latent outputs): n_head * rows each. */
enum { RC_QA, RC_NOPE, RC_R, RC_N, RC_KB = RC_N, RC_VB };

typedef struct jlm_ecu_mlabufs {
    scratch  f[RG_N];
    scratch  q, d, s, rec;   /* int8 rows and RC_N tables of `rows` act records */
    uint64_t rows, k[RC_N];  /* made for */
} mlabufs;

typedef struct mla_dims {
    uint64_t R, W, nope, rot, qa, nh, hd, hdv, E, qd, kmax;
    uint64_t xmax;   /* int8 codes a row: the widest of kmax and the batches' whole rows */
} mla_dims;

static jlm_ecu *ecu(const jlm_exd *k) { return k->be; }
static float *abp(const jlm_exd *k, int b, uint64_t off) { return (float *)ecu(k)->blk.ab[b].p + off; }
static float *reg(const jlm_exd *k, int r, uint64_t off) { return (float *)ecu(k)->blk.mla->f[r].p + off; }
static uint64_t max2(uint64_t a, uint64_t b) { return a > b ? a : b; }

static mla_dims dims(const jlm_engine *e)
{
    const jlm_config *c = e->c;
    mla_dims d = {.R = c->kv_lora_rank, .W = e->kv_dim, .rot = c->n_rot, .nope = e->hd - c->n_rot,
                  .qa = c->q_lora_rank, .nh = c->n_head, .hd = e->hd, .hdv = e->hd_v, .E = c->n_embd};
    d.qd = d.nh * d.hd;
    d.kmax = max2(max2(d.qa, d.nope), d.R);
    d.xmax = max2(d.kmax, max2(d.qd, d.nh * d.R));
    return d;
}

/* The shapes exec_mla.c computes, as the buffers hold them. */
static int shapes(const jlm_exd *k, const mla_dims *d)
{
    if (!d->R || d->W != d->R + d->rot || d->hd <= d->rot || d->rot % 2 ||
        jlm_exd_width(k->e, JLM_B_Q) != d->qd || jlm_exd_width(k->e, JLM_B_ATT) != d->nh * d->hdv ||
        jlm_exd_width(k->e, JLM_B_K) != d->W)
        return UNSUP;
    return JLM_OK;
}

void jlm_ecu_mla_free(jlm_ecu *v)
{
    mlabufs *m = v->blk.mla;
    if (!m)
        return;
    for (int r = 0; r < RG_N; r++)
        jlm_ecu_scratch_free(v, &m->f[r], 0);
    scratch *dev[] = {&m->q, &m->d, &m->s, &m->rec};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        jlm_ecu_scratch_free(v, dev[i], 0);
    free(m);
    v->blk.mla = NULL;
}

/* The regions and int8 rows for the block buffers' rows, and their act
 * records (uploaded once per shape: parameters, counted as activations).
 * Growing frees what queued kernels read: the seam's free waits for them. */
static int buffers(jlm_exd *k, const mla_dims *d)
{
    jlm_ecu *v = ecu(k);
    if (!v->blk.mla && !(v->blk.mla = calloc(1, sizeof *v->blk.mla)))
        return jlm_errf(k->err, JLM_ENOMEM, "cuda: out of memory");
    mlabufs *m = v->blk.mla;
    uint64_t n = v->blk.ab_rows, kk[RC_N] = {d->qa, d->nope, d->R};
    uint64_t len[RG_N] = {n * d->qa, n * d->qd + d->nope, n * d->nh * d->W, n * d->nh * d->R,
                          n * max2(d->nope, d->R), n * max2(d->R, d->hdv)};
    const void *at[3] = {m->q.p, m->d.p, m->s.p};
    int rc = JLM_OK;
    for (int r = 0; r < RG_N && !rc; r++)
        rc = jlm_ecu_grow(v, &m->f[r], len[r] * 4, 0, k->err);
    uint64_t nrec = (RC_N + 2 * d->nh) * n;
    if (!rc)
        rc = jlm_ecu_grow(v, &m->q, n * d->xmax, 0, k->err);
    if (!rc)
        rc = jlm_ecu_grow(v, &m->d, n * d->xmax / 8, 0, k->err);
    if (!rc)
        rc = jlm_ecu_grow(v, &m->s, n * d->xmax / 8, 0, k->err);
    if (!rc)
        rc = jlm_ecu_grow(v, &m->rec, nrec * sizeof(jlm_cu_act), 0, k->err);
    if (rc || (m->rows == n && m->k[RC_QA] == kk[RC_QA] && m->k[RC_NOPE] == kk[RC_NOPE] && m->k[RC_R] == kk[RC_R] &&
               at[0] == m->q.p && at[1] == m->d.p && at[2] == m->s.p))
        return rc;
    jlm_cu_act *h = malloc(nrec * sizeof *h);
    if (!h)
        return jlm_errf(k->err, JLM_ENOMEM, "cuda: out of memory");
    for (int t = 0; t < RC_N; t++)
        for (uint64_t i = 0; i < n; i++)
            h[t * n + i] = jlm_ecu_act_at(&m->q, &m->d, &m->s, kk[t], i * kk[t]);
    for (uint64_t hh = 0; hh < d->nh; hh++)   /* unused where hd is off a 32-block (no batch then) */
        for (uint64_t i = 0; i < n; i++) {
            h[RC_N * n + hh * n + i] = jlm_ecu_act_at(&m->q, &m->d, &m->s, d->nope, i * d->qd + hh * d->hd / 32 * 32);
            h[(RC_N + d->nh) * n + hh * n + i] = jlm_ecu_act_at(&m->q, &m->d, &m->s, d->R, (i * d->nh + hh) * d->R);
        }
    m->rows = 0;
    rc = jlm_ecu_records_up(v, m->rec.p, h, nrec, k->err);
    free(h);
    if (!rc) {
        m->rows = n;
        for (int t = 0; t < RC_N; t++)
            m->k[t] = kk[t];
    }
    return rc;
}

/* A launch's outcome: the seam's error named, and the stream now has work. */
static int launched(jlm_exd *k, int rc, const char *what)
{
    ecu(k)->blk.queued = 1;
    return rc ? jlm_ecu_fail(ecu(k), k->err, what) : JLM_OK;
}

/* y (n rows of rows) = x (n rows of kk, device memory) times m; quantized
 * types through x's int8 rows (table tab, kk wide) quantized here. */
static int mm(jlm_exd *k, const jlm_k_mat *m, uint64_t kk, uint64_t rows, const float *x, int tab, float *y)
{
    jlm_ecu *v = ecu(k);
    jlm_cu_mat cm;
    int fl = jlm_fmt_type_traits(m->type)->is_float;
    if (m->k != kk || m->rows != rows || (!fl && kk % 32) || k->b.n > 65535 || jlm_ecu_planes(v, m, &cm, NULL))
        return UNSUP;
    if (k->dry)
        return JLM_OK;
    mlabufs *mb = v->blk.mla;
    jlm_cu_act a = {(uint64_t)k->b.n * kk, mb->q.p, mb->d.p, mb->s.p};
    if (!fl && jlm_cu_rt_quantize(v->rt, x, &a, CS))
        return launched(k, 1, "quantize");
    v->st.matmuls++;
    const jlm_cu_act *rec = fl ? NULL : (const jlm_cu_act *)mb->rec.p + (uint64_t)tab * mb->rows;
    return launched(k, jlm_cu_rt_matvec(v->rt, &cm, k->b.n, fl ? x : NULL, rec, y, CS), "matvec");
}

/* y (n rows of rows) = activation buffer src's rows (n_embd wide) times m. */
static int mm_in(jlm_exd *k, const jlm_k_mat *m, int src, uint64_t rows, float *y)
{
    if (m->k != jlm_exd_width(k->e, src) || m->rows != rows)
        return UNSUP;
    return jlm_ecu_matmul_rows(ecu(k), m, k->b.n, abp(k, src, 0), src, y, 0, k->dry, k->err);
}

/* n floats from row t of src (stride ss) to row t of dst (stride ds), for every row: one strided copy. */
static int move_rows(jlm_exd *k, float *dst, uint64_t ds, const float *src, uint64_t ss, uint64_t n)
{
    return launched(k, jlm_cu_rt_d2d_rows(ecu(k)->rt, dst, ds * 4, src, ss * 4, n * 4, k->b.n, CS),
                    "latent attention's rows");
}

/* For each head h: rows (src + h * shs, stride ss, kk floats) times sheet h
 * of role -> rows (dst + h * dhs, stride ds, rows floats), through the GI
 * and GO regions (one row: in place). */
typedef struct head_io { const float *src; uint64_t ss, shs; float *dst; uint64_t ds, dhs; } head_io;

static int heads_one_by_one(jlm_exd *k, const mla_dims *d, uint16_t role, uint64_t kk, uint64_t rows, int tab,
                            head_io io)
{
    int rc = JLM_OK, one = k->b.n == 1;
    for (uint64_t h = 0; !rc && h < d->nh; h++) {
        jlm_k_mat m = jlm_ex_mla_sheet(k->e, &k->b, role, (uint32_t)h);
        if (k->dry) {
            rc = mm(k, &m, kk, rows, NULL, tab, NULL);
            continue;
        }
        ecu(k)->st.sheet_matvecs++;
        const float *x = one ? io.src + h * io.shs : reg(k, RG_GI, 0);
        float *y = one ? io.dst + h * io.dhs : reg(k, RG_GO, 0);
        if (!one)
            rc = move_rows(k, reg(k, RG_GI, 0), kk, io.src + h * io.shs, io.ss, kk);
        if (!rc)
            rc = mm(k, &m, kk, rows, x, tab, y);
        if (!rc && !one)
            rc = move_rows(k, io.dst + h * io.dhs, io.ds, y, rows, rows);
    }
    return rc;
}

/* The batch of role's sheets, if they have one stride in every plane in
 * one device frame and (quantized) every head's slice starts a 32-block:
 * sheet 0 as the kernel sees it and the strides (b->n 0: no batch). */
static int batch_of(jlm_exd *k, const mla_dims *d, uint16_t role, uint64_t kk, uint64_t rows, head_io io,
                    jlm_cu_mat *c0, jlm_cu_batch *b)
{
    jlm_ecu *v = ecu(k);
    jlm_k_mat m[3];
    jlm_cu_mat c1, cl;
    jlm_ex_mla_sheet_ends(k->e, &k->b, role, m);
    int fl = jlm_fmt_type_traits(m[0].type)->is_float;
    *b = (jlm_cu_batch){0};
    if (m[0].k != kk || m[0].rows != rows)
        return UNSUP;
    if ((!fl && (kk % 32 || io.ss % 32 || io.shs % 32)) || k->b.n > 65535 || d->nh > 65535 ||
        jlm_ecu_planes(v, &m[0], c0, NULL) || jlm_ecu_planes(v, &m[1], &c1, NULL) ||
        jlm_ecu_planes(v, &m[2], &cl, NULL))
        return JLM_OK;
    const uint8_t *p0[3] = {c0->qs, (const uint8_t *)c0->d, (const uint8_t *)c0->sc},
                  *p1[3] = {c1.qs, (const uint8_t *)c1.d, (const uint8_t *)c1.sc},
                  *pl[3] = {cl.qs, (const uint8_t *)cl.d, (const uint8_t *)cl.sc};
    uint64_t st[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        if (!p0[i])
            continue;
        if (!jlm_exd_sheet_stride((uintptr_t)p0[i], (uintptr_t)p1[i], (uintptr_t)pl[i], d->nh, &st[i]))
            return JLM_OK;
    }
    *b = (jlm_cu_batch){d->nh, io.ss, io.ds, io.shs, io.dhs, st[0], st[1], st[2], v->blk.mla ? v->blk.mla->rows : 0};
    return JLM_OK;
}

/* For each head h: rows (src + h * shs, stride ss, kk floats) times sheet h
 * of role -> rows (dst + h * dhs, stride ds, rows floats): one batched launch
 * (quantized: the source's whole rows quantized once, the batch's records
 * table tab), or a launch a head. */
static int heads_mm(jlm_exd *k, const mla_dims *d, uint16_t role, uint64_t kk, uint64_t rows, int tab, int btab,
                    head_io io)
{
    jlm_ecu *v = ecu(k);
    jlm_cu_mat cm;
    jlm_cu_batch bt;
    int rc = batch_of(k, d, role, kk, rows, io, &cm, &bt);
    if (rc || !bt.n)
        return rc ? rc : heads_one_by_one(k, d, role, kk, rows, tab, io);
    if (k->dry)
        return JLM_OK;
    mlabufs *mb = v->blk.mla;
    int fl = jlm_fmt_type_traits(cm.type)->is_float;
    jlm_cu_act a = {(uint64_t)k->b.n * io.ss, mb->q.p, mb->d.p, mb->s.p};
    if (!fl && jlm_cu_rt_quantize(v->rt, io.src, &a, CS))
        return launched(k, 1, "quantize");
    v->st.matmuls++;
    v->st.sheet_matvecs++;
    const jlm_cu_act *rec =
        fl ? NULL : (const jlm_cu_act *)mb->rec.p + (RC_N + (uint64_t)btab * d->nh) * mb->rows;
    return launched(k, jlm_cu_rt_matvec_batch(v->rt, &cm, &bt, k->b.n, fl ? io.src : NULL, rec, io.dst, CS),
                    "latent attention's batched matvec");
}

/* Layer l's RoPE (latent attention's) for the kernel, its factors on the device. */
static int rope_of(jlm_exd *k, const mla_dims *d, jlm_cu_rope *cr)
{
    jlm_k_rope rp;
    const float *ff = NULL;
    jlm_ex_mla_rope(k->e, k->b.l, &rp);
    if (rp.n_rot != d->rot || jlm_ecu_vec(ecu(k), rp.freq_factors, rp.n_rot / 2, &ff))
        return UNSUP;
    jlm_cu_rope_from(&rp, cr);
    cr->freq_factors = ff;
    return JLM_OK;
}

/* kv = h Wkv_a into the K rows; the latent normed, the shared key rotated;
 * both into the cache at the row's position (F16: rounded as jlm_kv_put_row). */
static int mla_kv(jlm_exd *k, const jlm_op *op, const mla_dims *d)
{
    jlm_ecu *v = ecu(k);
    jlm_k_mat wkv = blk_mat(k->e, &k->b, op->w[0]);
    const float *nw;
    jlm_cu_rope cr;
    int f16 = k->e->kt == KV_F16, rc = jlm_ecu_vec(v, blk_vec(k->e, &k->b, op->w[1]), d->R, &nw);
    if (!rc && (!nw || rope_of(k, d, &cr)))
        rc = UNSUP;
    if (!rc)
        rc = mm_in(k, &wkv, op->src, d->W, abp(k, JLM_B_K, 0));
    if (rc || k->dry)
        return rc;
    uint32_t n = k->b.n, p0 = jlm_exd_pos(k, 0), run = 1;   /* run: rows at consecutive positions from row 0 */
    while (run < n && jlm_exd_pos(k, run) == p0 + run)
        run++;
    float *r = abp(k, JLM_B_K, 0);
    uint64_t rb = d->W * (f16 ? 2 : 4);
    const uint32_t *dp = cr.dpos = jlm_ecu_dpos(k);   /* a decoded row: its position on the device */
    rc = launched(k, jlm_cu_rt_rmsnorm_strided(v->rt, r, r, nw, d->R, n, (uint32_t)d->W, k->c->rms_eps, CS),
                  "the latent's norm");
    jlm_cu_rows rr = n > 1 ? jlm_ecu_rows(k, 0, n, d->W) : (jlm_cu_rows){0};
    if (!rc)
        rc = launched(k, n > 1 ? jlm_cu_rt_rope_rows(v->rt, &cr, r + d->R, 1, (uint32_t)d->rot, &rr, CS)
                               : jlm_cu_rt_rope(v->rt, &cr, r + d->R, 1, (uint32_t)d->rot, p0, CS), "the key's rope");
    if (!rc && dp)
        return launched(k, jlm_cu_rt_kv_store(v->rt, f16 ? JLM_CU_KV_F16 : JLM_CU_KV_F32, v->blk.kc[k->b.l], rb,
                                              rb * k->e->kv_ctx, dp, r, d->W, CS), "the latent into the cache");
    /* into the cache: the run in one copy (a prefill: every row), any other row alone */
    for (uint32_t t = 0, m; !rc && t < n; t += m) {
        m = t ? 1 : run;
        uint8_t *dst = (uint8_t *)v->blk.kc[k->b.l] + (uint64_t)jlm_exd_pos(k, t) * rb;
        float *x = r + t * d->W;
        rc = launched(k, f16 ? jlm_cu_rt_to_f16(v->rt, (uint16_t *)(void *)dst, x, m * d->W, CS)
                             : jlm_cu_rt_d2d(v->rt, dst, x, m * d->W * 4, CS), "the latent into the cache");
    }
    return rc;
}

/* q = rmsnorm(h Wq_a) Wq_b (or h Wq) into the QF region. */
static int q_proj(jlm_exd *k, const jlm_op *op, const mla_dims *d)
{
    const jlm_ex_blk *b = &k->b;
    float *qa = k->dry ? NULL : reg(k, RG_QA, 0), *qf = k->dry ? NULL : reg(k, RG_QF, 0);
    if (!d->qa) {
        jlm_k_mat wq = blk_mat(k->e, b, op->w[3]);
        return mm_in(k, &wq, op->src, d->qd, qf);
    }
    jlm_k_mat wa = blk_mat(k->e, b, op->w[0]), wb = blk_mat(k->e, b, op->w[2]);
    const float *qn;
    int rc = jlm_ecu_vec(ecu(k), blk_vec(k->e, b, op->w[1]), d->qa, &qn);
    if (!rc && !qn)
        rc = UNSUP;
    if (!rc)
        rc = mm_in(k, &wa, op->src, d->qa, qa);
    if (!rc && !k->dry)
        rc = launched(k, jlm_cu_rt_rmsnorm(ecu(k)->rt, qa, qa, qn, d->qa, b->n, k->c->rms_eps, CS), "the q-LoRA norm");
    return rc ? rc : mm(k, &wb, d->qa, d->qd, qa, RC_QA, qf);
}

/* q projected, each head's RoPE part rotated; QL (row, head) = [nope Wk_b | rope]. */
static int mla_q(jlm_exd *k, const jlm_op *op, const mla_dims *d)
{
    jlm_ecu *v = ecu(k);
    jlm_cu_rope cr;
    int rc = op->dst != JLM_B_Q || rope_of(k, d, &cr) ? UNSUP : q_proj(k, op, d);
    const float *qf = k->dry ? NULL : reg(k, RG_QF, 0);
    float *ql = k->dry ? NULL : reg(k, RG_QL, 0);
    if (!rc && !k->dry) {   /* every row's heads rotated, their rope parts moved, in one launch each */
        uint32_t n = k->b.n;
        jlm_cu_rows rr = n > 1 ? jlm_ecu_rows(k, 0, n, d->qd) : (jlm_cu_rows){0};
        float *x = reg(k, RG_QF, d->nope);
        cr.dpos = jlm_ecu_dpos(k);   /* a decoded row: its position on the device */
        rc = launched(k, n > 1 ? jlm_cu_rt_rope_rows(v->rt, &cr, x, (uint32_t)d->nh, (uint32_t)d->hd, &rr, CS)
                               : jlm_cu_rt_rope(v->rt, &cr, x, (uint32_t)d->nh, (uint32_t)d->hd, jlm_exd_pos(k, 0), CS),
                      "the queries' rope");
        if (!rc)   /* (row, head) rows: qd = nh x hd, so head h of row t is (t nh + h) hd floats in */
            rc = launched(k, jlm_cu_rt_d2d_rows(v->rt, ql + d->R, d->W * 4, qf + d->nope, d->hd * 4, d->rot * 4,
                                                (uint64_t)n * d->nh, CS), "the queries' rope part");
    }
    if (rc)
        return rc;
    return heads_mm(k, d, JLM_R_ATTN_K_B_MAT, d->nope, d->R, RC_NOPE, 0,
                    (head_io){qf, d->qd, d->hd, ql, d->nh * d->W, d->W});
}

/* Each row: all heads over the cached rows 0..pos (one KV head, the values
 * the latents), scaled as the CPU scales; each head's latent output x Wv_b
 * into the attention rows. */
static int mla_attn(jlm_exd *k, const jlm_op *op, const mla_dims *d)
{
    jlm_ecu *v = ecu(k);
    jlm_cu_attn ap = {.n_head = (uint32_t)d->nh, .n_head_kv = 1, .head_dim = (uint32_t)d->W,
                      .head_dim_v = (uint32_t)d->R, .k_stride = d->W, .v_stride = d->W,
                      .scale = jlm_ex_mla_scale(k->e), .k_type = k->e->kt, .v_type = k->e->kt};
    int rc = op->dst != JLM_B_ATT ? UNSUP : JLM_OK;
    const void *kv = k->dry ? NULL : v->blk.kc[k->b.l];   /* made when the dry walk passed */
    if (!rc && !k->dry && k->b.n > 1)   /* a prefill: its rows together */
        rc = jlm_ecu_attn_rows(k, &ap, reg(k, RG_QL, 0), d->nh * d->W, kv, kv, reg(k, RG_OL, 0), d->nh * d->R,
                               "latent attention");
    else if (!rc && !k->dry) {
        ap.dpos = jlm_ecu_dpos(k);   /* a decoded row: keys 0..its position, read on the device */
        ap.n_kv = ap.dpos ? k->e->kv_ctx : jlm_exd_pos(k, 0) + 1ull;
        rc = launched(k, jlm_cu_rt_attn(v->rt, &ap, reg(k, RG_QL, 0), kv, kv, v->blk.scores.p, reg(k, RG_OL, 0), CS),
                      "latent attention");
    }
    if (rc)
        return rc;
    return heads_mm(k, d, op->w[1], d->R, d->hdv, RC_R, 1,
                    (head_io){k->dry ? NULL : reg(k, RG_OL, 0), d->nh * d->R, d->R, k->dry ? NULL : abp(k, JLM_B_ATT, 0),
                              d->nh * d->hdv, d->hdv});
}

int jlm_ecu_mla(jlm_exd *k, const jlm_op *op)
{
    mla_dims d = dims(k->e);
    int rc = shapes(k, &d);
    if (!rc && !k->dry)
        rc = buffers(k, &d);   /* made at the block's first latent op; the same rows after it */
    if (rc)
        return rc;
    switch (op->kind) {
    case JLM_OP_MLA_KV: return mla_kv(k, op, &d);
    case JLM_OP_MLA_Q: return mla_q(k, op, &d);
    case JLM_OP_MLA_ATTN: return mla_attn(k, op, &d);
    default: return UNSUP;
    }
}
