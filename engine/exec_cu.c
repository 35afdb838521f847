/* exec_cu.c - whole blocks on a CUDA device: a block program's ops
 * (engine/prog.h) enqueued as kernels on the compute stream, so the blocks
 * of a token (and the output matrix, when it is there too) make one round
 * trip (docs/cuda.md, "Whole blocks on the device").
 *
 * The residual rows cross to the device at the first device block of a
 * forward and back only at a split point (jlm_ecu_x_sync) or not at all when
 * the logits are computed here (jlm_ecu_output). The engine's own sequence
 * keeps its KV cache of these blocks here (keys and values each F32, F16 or
 * Q8_0 as the engine's --kv / --cache-type-k / --cache-type-v, an allocation
 * per layer each, rows of kv_dim; F16 and Q8_0 rounded as the CPU's cache
 * rounds them, jlm_kv_put_row, bit for bit; a sliding window's attention
 * reads its keys from the window's first); any other sequence
 * (jlm_engine_seq: serve, batches) and what the kernels are not wired for
 * (the routed experts are exec_cu_moe.c's, latent attention exec_cu_mla.c's)
 * is JLM_EUNSUPPORTED,
 * decided per model, layer and sequence before anything is enqueued (the
 * walk: exec_dev.c), so a block always
 * runs on the same side. --profile's stamps go on the compute stream at
 * each op class (the walk's) and before each copy of rows up or down. Quantized weights read int8 rows
 * quantized on the device (jlm_cu_quantize_block, bit-identical to the
 * CPU's). Nothing here waits for the device: the host waits at x_sync,
 * output, and when a device frame is dropped (jlm_ecu_drain). */
#include "engine/backend_cu_int.h"
#include "engine/exec_dev.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

#define UNSUP JLM_EUNSUPPORTED
#define CS JLM_CU_S_COMPUTE
#define width jlm_exd_width

static jlm_ecu *ecu(const jlm_exd *k) { return k->be; }

/* float off of activation buffer b (device memory) */
static float *abp(const jlm_exd *k, int b, uint64_t off) { return (float *)ecu(k)->blk.ab[b].p + off; }
static float *row(const jlm_exd *k, int b, uint32_t t) { return abp(k, b, t * width(k->e, b)); }

/* A launch's outcome: the seam's error named, and the stream now has work. */
static int launched(jlm_exd *k, int rc, const char *what)
{
    ecu(k)->blk.queued = 1;
    return rc ? jlm_ecu_fail(ecu(k), k->err, what) : JLM_OK;
}

/* The device's copy of the row's position when the launches may read it
 * there (one row, the position that went up with it): a decoded token's
 * launches are then the same every token (a graph, kernels/cuda/rt.h);
 * NULL: the launches take the position as an argument. */
const uint32_t *jlm_ecu_dpos(const jlm_exd *k)
{
    const jlm_ecu_blk *s = &ecu(k)->blk;
    return k->b.n == 1 && s->dpos_ok && s->dpos_at == jlm_exd_pos(k, 0) ? s->dpos.p : NULL;
}

#define vec jlm_ecu_vec
#define matmul_rows jlm_ecu_matmul_rows
#define down jlm_ecu_down

/* The device address of a dense vector (norm weights, biases, RoPE
 * factors); NULL p: none. */
int jlm_ecu_vec(jlm_ecu *v, const float *p, uint64_t n, const float **out)
{
    *out = NULL;
    if (!p)
        return JLM_OK;
    jlm_dframe *f = jlm_dframes_frame_of(&v->dev.frames, p, n * 4, NULL);
    if (!f)
        return UNSUP;
    *out = (const float *)(const void *)((const uint8_t *)f->buf + ((const uint8_t *)p - f->host));
    return JLM_OK;
}

jlm_cu_act jlm_ecu_act_at(const scratch *q, const scratch *d, const scratch *s, uint64_t k, uint64_t off)
{
    return (jlm_cu_act){k, (int8_t *)q->p + off, (float *)d->p + off / 32, (int16_t *)s->p + off / 16};
}

int jlm_ecu_records_up(jlm_ecu *v, void *dst, const jlm_cu_act *h, uint64_t count, jlm_err *err)
{
    if (jlm_cu_rt_h2d(v->rt, dst, h, count * sizeof *h, CS))   /* pageable: consumed now */
        return jlm_ecu_fail(v, err, "act records");
    v->blk.queued = 1;
    v->st.act_up += count * sizeof *h;   /* parameters, counted with the activations */
    return JLM_OK;
}

/* The act records of n rows of k int8 codes packed in aq: buffer src's
 * table when k is its width, else the table of one narrower width (rows
 * packed at their own width: glm4moe's shared expert in the n_ff-wide gate
 * buffer), made when first asked and again when aq moved. */
static int act_records(jlm_ecu *v, int src, uint64_t k, const jlm_cu_act **out, jlm_err *err)
{
    jlm_ecu_blk *s = &v->blk;
    *out = (const jlm_cu_act *)s->rec.p + (uint64_t)src * s->ab_rows;
    if (k == s->rec_k[src])
        return JLM_OK;
    int rc = JLM_OK;
    if (s->odd_k != k || s->odd_rows != s->ab_rows) {
        jlm_cu_act *h = malloc(s->ab_rows * sizeof *h);
        rc = h ? jlm_ecu_grow(v, &s->odd, s->ab_rows * sizeof *h, 0, err)
               : jlm_errf(err, JLM_ENOMEM, "cuda: out of memory");
        for (uint64_t t = 0; !rc && t < s->ab_rows; t++)
            h[t] = jlm_ecu_act_at(&s->aq, &s->ad, &s->as, k, t * k);
        if (!rc)
            rc = jlm_ecu_records_up(v, s->odd.p, h, s->ab_rows, err);
        free(h);
        s->odd_k = rc ? 0 : k;
        s->odd_rows = s->ab_rows;
    }
    *out = s->odd.p;
    return rc;
}

/* y (n rows) = x (n rows of m->k, activation buffer src) times m, its
 * planes in a device frame; quantized types read src's int8 rows, quantized
 * here (reuse: the previous call quantized src and it has not changed).
 * dry: only whether it can. */
int jlm_ecu_matmul_rows(jlm_ecu *v, const jlm_k_mat *m, uint32_t n, const float *x, int src, float *y, int reuse,
                        int dry, jlm_err *err)
{
    jlm_cu_mat cm;
    int fl = jlm_fmt_type_traits(m->type)->is_float;
    if ((!fl && m->k % 32) || n > 65535 || jlm_ecu_planes(v, m, &cm, NULL))
        return UNSUP;
    if (dry)
        return JLM_OK;
    jlm_ecu_blk *s = &v->blk;
    uint64_t nk = (uint64_t)n * m->k;
    int rc = JLM_OK;
    if (!fl && !reuse) {
        jlm_cu_act a = {nk, s->aq.p, s->ad.p, s->as.p};
        rc = jlm_cu_rt_quantize(v->rt, x, &a, CS);
    }
    if (rc)
        rc = jlm_ecu_fail(v, err, "quantize");
    const jlm_cu_act *rec = NULL;
    if (!rc && !fl)
        rc = act_records(v, src, m->k, &rec, err);
    if (!rc && jlm_cu_rt_matvec(v->rt, &cm, n, fl ? x : NULL, rec, y, CS))
        rc = jlm_ecu_fail(v, err, "matvec");
    v->blk.queued = 1;
    v->st.matmuls++;
    return rc;
}

static int op_mm(jlm_exd *k, const jlm_k_mat *m, int src, int dst, int reuse)
{
    return matmul_rows(ecu(k), m, k->b.n, abp(k, src, 0), src, abp(k, dst, 0), reuse, k->dry, k->err);
}

static int op_bias(jlm_exd *k, int b, const float *p)
{
    const float *bv;
    uint64_t w = width(k->e, b);
    int rc = vec(ecu(k), p, w, &bv);
    if (rc || k->dry)
        return rc;
    return launched(k, jlm_cu_rt_add_rows(ecu(k)->rt, abp(k, b, 0), abp(k, b, 0), bv, w, k->b.n, CS), "bias");
}

jlm_cu_rows jlm_ecu_rows(const jlm_exd *k, uint32_t t0, uint32_t m, uint64_t xw)
{
    const uint32_t *tab = ecu(k)->blk.rowt.p;
    return (jlm_cu_rows){.n = m, .x_stride = xw, .pos = tab + t0, .span = tab + k->b.n + 2ull * t0};
}

int jlm_ecu_attn_rows(jlm_exd *k, jlm_cu_attn *ap, const float *q, uint64_t qw, const void *kc, const void *vc,
                      float *out, uint64_t ow, const char *what)
{
    jlm_ecu_blk *s = &ecu(k)->blk;
    uint64_t per = (uint64_t)ap->n_head * s->rowt_most, fit = s->scores.cap / 4 / per;
    uint32_t n = k->b.n, m = fit < 1 ? 1 : fit < n ? (uint32_t)fit : n;
    int rc = JLM_OK;
    ap->n_kv = s->rowt_most;
    for (uint32_t t = 0; !rc && t < n; t += m) {
        jlm_cu_rows r = jlm_ecu_rows(k, t, n - t < m ? n - t : m, qw);
        r.o_stride = ow, r.sc_stride = per;
        r.kb = jlm_cu_kv_bytes(ap->k_type, ap->k_stride), r.vb = jlm_cu_kv_bytes(ap->v_type, ap->v_stride);
        rc = launched(k, jlm_cu_rt_attn_rows(ecu(k)->rt, ap, q + t * qw, kc, vc, k->e->kv_ctx, s->scores.p, out + t * ow,
                                             &r, CS), what);
    }
    return rc;
}

static int op_norm(jlm_exd *k, int dst, int src, const float *p)
{
    const float *w;
    uint64_t E = width(k->e, dst);
    int rc = vec(ecu(k), p, E, &w);
    if (rc || k->dry)
        return rc;
    return launched(k, jlm_cu_rt_rmsnorm(ecu(k)->rt, abp(k, dst, 0), abp(k, src, 0), w, E, k->b.n, k->c->rms_eps, CS),
                    "rmsnorm");
}

/* Each head of each row of b (q or k): its RMS norm (p; wide: one norm over
 * the whole row, OLMoE) and RoPE at the row's position (layer l's
 * parameters: the kernel computes its angles; none on a layer without it);
 * Llama 4 (qk_unit): RoPE, then a weightless norm, on the layers with RoPE
 * only; q then times the attention temperature (Llama 4's no-RoPE layers;
 * 1 elsewhere, and below position 8191: a launch a row where it is not).
 * Each a launch over every row (the rows' heads are consecutive: one norm
 * over n x n_head heads; RoPE: each row at its own position, the row
 * table's; one row: the one-row kernel, at the device's copy of a decoded
 * token's position (jlm_ecu_dpos: the same launch every token) or at the
 * position as its argument). */
static int op_heads(jlm_exd *k, int b, uint32_t n_head, const float *p, int wide)
{
    jlm_engine *e = k->e;
    jlm_ecu *v = ecu(k);
    const float *w, *ff = NULL;
    jlm_k_rope rp;
    jlm_ex_rope_params(e, k->b.l, &rp);
    uint64_t W = width(e, b);
    uint32_t n = k->b.n, heads = n_head * n;
    int rope = !(k->c->flags & JLM_F_NO_POS_ENC) && rp.n_rot, unit = e->qk_unit && rope;
    int rc = vec(v, p, wide ? W : e->hd, &w);
    if (!rc && ((rope && (rp.n_rot % 2 || rp.n_rot > e->hd)) || (e->qk_unit && w)))
        rc = UNSUP;   /* odd or over-wide rotations; a weighted norm before Llama 4's weightless one */
    if (!rc && ((w && !wide) || unit) && W != (uint64_t)n_head * e->hd)
        rc = UNSUP;   /* per-head norms over rows whose heads are not consecutive */
    if (!rc && rope)
        rc = vec(v, rp.freq_factors, rp.n_rot / 2, &ff);
    if (rc || k->dry)
        return rc;
    float eps = k->c->rms_eps, *x = abp(k, b, 0);
    if (w)   /* OLMoE's over the whole rows, or each head's */
        rc = launched(k, jlm_cu_rt_rmsnorm(v->rt, x, x, w, wide ? W : e->hd, wide ? n : heads, eps, CS), "q/k norm");
    jlm_cu_rope cr;
    jlm_cu_rope_from(&rp, &cr);
    cr.freq_factors = ff;
    cr.dpos = jlm_ecu_dpos(k);   /* a decoded row: its position read on the device (NULL for a prefill's rows) */
    if (!rc && rope) {
        jlm_cu_rows r = jlm_ecu_rows(k, 0, n, W);
        rc = launched(k, n == 1 ? jlm_cu_rt_rope(v->rt, &cr, x, n_head, e->hd, jlm_exd_pos(k, 0), CS)
                                : jlm_cu_rt_rope_rows(v->rt, &cr, x, n_head, e->hd, &r, CS), "rope");
    }
    if (!rc && unit)
        rc = launched(k, jlm_cu_rt_rmsnorm(v->rt, x, x, NULL, e->hd, heads, eps, CS), "q/k unit norm");
    for (uint32_t t = 0; !rc && b == JLM_B_Q && t < n; t++) {
        float temp = jlm_ex_q_temp(k->c, &rp, jlm_exd_pos(k, t));
        if (temp != 1.0f)
            rc = launched(k, jlm_cu_rt_elem(v->rt, JLM_CU_SCALE, row(k, b, t), row(k, b, t), NULL, W, temp, 0, CS),
                          "attention temperature");
    }
    return rc;
}

_Static_assert((int)KV_F32 == (int)JLM_CU_KV_F32 && (int)KV_F16 == (int)JLM_CU_KV_F16 &&
                   (int)KV_Q8_0 == (int)JLM_CU_KV_Q8_0,
               "cache types");

/* The device cache of b (K or V) has the engine's type of it; bytes of its
 * row (kv_dim elements: the CPU's rows of each head, one after another). */
static int kv_type(const jlm_engine *e, int b) { return b == JLM_B_K ? e->kt : e->vt; }
static uint64_t kv_row(const jlm_engine *e, int b) { return jlm_kv_row_bytes(kv_type(e, b), (uint32_t)width(e, b)); }

/* n rows of buffer b (K or V) from row t into the cache at row p: copied
 * (F32), rounded to halves (F16) or quantized to Q8_0 blocks, as
 * jlm_kv_put_row does (bit-identical). */
static int kv_rows(jlm_exd *k, int b, uint32_t t, uint64_t p, uint32_t n)
{
    jlm_ecu *v = ecu(k);
    uint64_t w = width(k->e, b);
    uint8_t *dst = (uint8_t *)(b == JLM_B_K ? v->blk.kc : v->blk.vc)[k->b.l] + p * kv_row(k->e, b);
    const char *what = b == JLM_B_K ? "the keys into the cache" : "the values into the cache";
    const float *x = row(k, b, t);
    switch (kv_type(k->e, b)) {
    case KV_F16: return launched(k, jlm_cu_rt_to_f16(v->rt, (uint16_t *)(void *)dst, x, n * w, CS), what);
    case KV_Q8_0: return launched(k, jlm_cu_rt_kv_q8(v->rt, dst, x, n * w, CS), what);
    default: return launched(k, jlm_cu_rt_d2d(v->rt, dst, x, n * w * 4, CS), what);
    }
}

/* The device cache of row t's sequence becomes blk.kc, blk.vc (buffers()
 * made it). */
static void use_seq(const jlm_exd *k, uint32_t t)
{
    jlm_ecu_blk *s = &ecu(k)->blk;
    jlm_exd_seqc *c = jlm_exd_seq_find(s->seqs, jlm_exd_host(k, t));
    s->kc = c->kc;
    s->vc = c->vc;
}

static int op_kv_put(jlm_exd *k)
{
    int rc = JLM_OK;
    jlm_ecu *v = ecu(k);
    const uint32_t *dp = jlm_ecu_dpos(k);
    if (dp && !k->dry)
        use_seq(k, 0);
    for (int b = JLM_B_K; dp && !k->dry && b <= JLM_B_V && !rc; b++) {   /* the row at the device's position */
        _Static_assert(JLM_B_V == JLM_B_K + 1, "K then V");
        uint64_t rb = kv_row(k->e, b);
        rc = launched(k, jlm_cu_rt_kv_store(v->rt, kv_type(k->e, b), (b == JLM_B_K ? v->blk.kc : v->blk.vc)[k->b.l], rb,
                                            rb * k->e->kv_ctx, dp, row(k, b, 0), width(k->e, b), CS),
                      b == JLM_B_K ? "the keys into the cache" : "the values into the cache");
    }
    if (dp)
        return rc;
    /* rows at consecutive positions (one sequence's): one copy (or conversion) each for K and V */
    uint32_t step = jlm_exd_group(k, 0) == k->b.n ? k->b.n : 1;
    for (uint32_t t = 1; t < k->b.n && step > 1; t++)
        if (jlm_exd_pos(k, t) != jlm_exd_pos(k, 0) + t)
            step = 1;
    for (uint32_t t = 0; !rc && !k->dry && t < k->b.n; t += step) {
        use_seq(k, t);
        rc = kv_rows(k, JLM_B_K, t, jlm_exd_pos(k, t), step);
        if (!rc)
            rc = kv_rows(k, JLM_B_V, t, jlm_exd_pos(k, t), step);
    }
    return rc;
}

/* p's key rule (jlm_cu_attn_at: from 0, a window's or a chunk's first key)
 * for layer k->b.l, when it gives jlm_ex_first_key's first key at the row's
 * position and the row is not one an image's keys are open to: 1 and
 * p->dpos set; else 0 (the key count goes as an argument). */
static int key_rule(const jlm_exd *k, jlm_cu_attn *p)
{
    const jlm_config *c = k->c;
    uint32_t pos = jlm_exd_pos(k, 0), far = UINT32_MAX - 1;
    p->win = p->chunk = 0;
    if (jlm_ex_first_key(c, k->b.l, far)) {
        if (c->arch == JLM_ARCH_LLAMA && c->moe_step)
            p->chunk = c->swa_window;
        else
            p->win = c->swa_window;
    }
    uint32_t lo = p->chunk ? pos / p->chunk * p->chunk : p->win && pos >= p->win ? pos - p->win + 1 : 0;
    if (pos < k->e->bidir_end || lo != jlm_ex_first_key(c, k->b.l, pos) || pos >= k->e->kv_ctx)
        return 0;
    p->dpos = jlm_ecu_dpos(k);
    return 1;
}

static int op_attend(jlm_exd *k, const float *sinks)
{
    jlm_engine *e = k->e;
    const jlm_config *c = k->c;
    jlm_ecu *v = ecu(k);
    const float *sk;
    if (vec(v, sinks, c->n_head, &sk))
        return UNSUP;
    if (!c->n_kv_head || c->n_head % c->n_kv_head || e->kv_dim != (uint64_t)c->n_kv_head * e->hd ||
        e->kv_dim_v != (uint64_t)c->n_kv_head * e->hd_v || e->q_dim != (uint64_t)c->n_head * e->hd)
        return UNSUP;
    jlm_cu_attn ap = {.n_head = c->n_head, .n_head_kv = c->n_kv_head, .head_dim = e->hd, .head_dim_v = e->hd_v,
                      .k_stride = e->kv_dim, .v_stride = e->kv_dim_v, .k_head_stride = e->hd,
                      .v_head_stride = e->hd_v, .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)e->hd),
                      .softcap = c->attn_softcap, .sinks = sk, .k_type = e->kt, .v_type = e->vt};
    uint64_t kb = kv_row(e, JLM_B_K), vb = kv_row(e, JLM_B_V);
    int rc = JLM_OK;
    /* a prefill's rows are one sequence's (together, on its cache); a batched step's one a sequence */
    if (k->b.n > 1 && !k->dry && jlm_exd_group(k, 0) == k->b.n) {
        use_seq(k, 0);
        return jlm_ecu_attn_rows(k, &ap, row(k, JLM_B_Q, 0), width(e, JLM_B_Q), v->blk.kc[k->b.l], v->blk.vc[k->b.l],
                                 row(k, JLM_B_ATT, 0), width(e, JLM_B_ATT), "attention");
    }
    if (!k->dry && jlm_ecu_dpos(k) && key_rule(k, &ap)) {   /* the keys the device's position sees, up to the cache's */
        use_seq(k, 0);
        ap.n_kv = e->kv_ctx;
        return launched(k, jlm_cu_rt_attn(v->rt, &ap, row(k, JLM_B_Q, 0), v->blk.kc[k->b.l], v->blk.vc[k->b.l],
                                          v->blk.scores.p, row(k, JLM_B_ATT, 0), CS), "attention");
    }
    for (uint32_t t = 0; !rc && !k->dry && t < k->b.n; t++) {
        /* keys [lo, hi): a sliding window's (or a chunk's) first key is where the cache's rows start, so
         * the hidden keys are not read at all (the CPU masks them: exp(-inf) adds 0) */
        uint32_t pos = jlm_exd_pos(k, t), hi = pos < e->bidir_end ? e->bidir_end : pos + 1;
        uint64_t lo = jlm_ex_first_key(c, k->b.l, pos);
        ap.n_kv = hi - lo;
        use_seq(k, t);
        rc = launched(k, jlm_cu_rt_attn(v->rt, &ap, row(k, JLM_B_Q, t), (uint8_t *)v->blk.kc[k->b.l] + lo * kb,
                                        (uint8_t *)v->blk.vc[k->b.l] + lo * vb, v->blk.scores.p,
                                        row(k, JLM_B_ATT, t), CS), "attention");
    }
    return rc;
}

static int op_add(jlm_exd *k, int dst, int src)
{
    uint64_t n = k->b.n * width(k->e, dst);
    return k->dry ? JLM_OK
                  : launched(k, jlm_cu_rt_elem(ecu(k)->rt, JLM_CU_ADD, abp(k, dst, 0), abp(k, dst, 0), abp(k, src, 0),
                                               n, 0, 0, CS), "residual add");
}

/* The gate's activation over n elements of G (times U): SwiGLU, SwiGLU-OAI,
 * or gemma3's GELU through ggml's fp16 table then times up (two kernels,
 * in jlm_ex_activate's order: bit-identical to the CPU's). */
static int op_act(jlm_exd *k, int act, uint64_t n)
{
    if (k->dry)
        return JLM_OK;   /* the walk's kinds */
    jlm_cu_rt *rt = ecu(k)->rt;
    float *g = abp(k, JLM_B_G, 0), *u = abp(k, JLM_B_U, 0);
    int rc;
    if (act == JLM_ACT_GELU_FP16) {
        rc = jlm_cu_rt_elem(rt, JLM_CU_GELU_FP16, g, g, NULL, n, 0, 0, CS);
        rc = rc ? rc : jlm_cu_rt_elem(rt, JLM_CU_MUL, g, g, u, n, 0, 0, CS);
    } else {
        int oai = act == JLM_ACT_SWIGLU_OAI;
        rc = jlm_cu_rt_elem(rt, oai ? JLM_CU_SWIGLU_OAI : JLM_CU_SWIGLU, g, g, u, n, oai ? 1.702f : 0.0f,
                            oai ? 7.0f : 0.0f, CS);
    }
    return launched(k, rc, "the gate's activation");
}

static int op_moe(jlm_exd *k, const jlm_op *op) { return jlm_ecu_moe(ecu(k), k->e, &k->b, op, k->dry, k->err); }

static const jlm_exd_ops CU_OPS = {op_norm, op_mm, op_bias, op_heads, op_kv_put, op_attend, op_add, op_act, op_moe, jlm_ecu_mla, 1};

/* ---------------------------------------------------------------- buffers */

/* The activation buffers and act records for n rows, the int8 rows, the
 * scores, and layer l's cache. Growing frees buffers queued kernels may
 * read: the caller has drained the stream (the seam's free waits too). */
/* Layer l's device cache of the sequence whose host cache is host (made
 * if absent), left in blk.kc, blk.vc. */
static int seq_cache(jlm_ecu *v, jlm_engine *e, const void *host, uint32_t l, jlm_err *err)
{
    jlm_ecu_blk *s = &v->blk;
    jlm_exd_seqc *c;
    s->n_layer = e->c->n_layer;
    int rc = jlm_exd_seq_get(&s->seqs, host, s->n_layer, sizeof *s->kc, &c, "cuda", err);
    if (rc)
        return rc;
    s->kc = c->kc;
    s->vc = c->vc;
    if (!s->kc[l] && jlm_cu_rt_alloc(v->rt, (uint64_t)e->kv_ctx * kv_row(e, JLM_B_K), &s->kc[l]))
        return jlm_ecu_fail(v, err, "the KV cache");
    if (e->kv_dim_v && !s->vc[l] && jlm_cu_rt_alloc(v->rt, (uint64_t)e->kv_ctx * kv_row(e, JLM_B_V), &s->vc[l]))
        return jlm_ecu_fail(v, err, "the KV cache");
    return JLM_OK;
}

static int buffers(jlm_ecu *v, jlm_engine *e, const jlm_exd *k, jlm_err *err)
{
    jlm_ecu_blk *s = &v->blk;
    uint32_t l = k->b.l, n = k->b.n;
    int rc = JLM_OK;
    uint64_t kmax = 0;
    for (int b = 0; b < JLM_B_COUNT; b++)
        kmax = width(e, b) > kmax ? width(e, b) : kmax;
    if (n > s->ab_rows) {
        uint64_t rows = n + n / 4;
        for (int b = 0; b < JLM_B_COUNT && !rc; b++)
            rc = jlm_ecu_grow(v, &s->ab[b], rows * width(e, b) * 4, 0, err);
        if (!rc)
            rc = jlm_ecu_grow(v, &s->aq, rows * kmax, 0, err);
        if (!rc)
            rc = jlm_ecu_grow(v, &s->ad, rows * kmax / 8, 0, err);
        if (!rc)
            rc = jlm_ecu_grow(v, &s->as, rows * kmax / 8, 0, err);
        uint64_t nrec = (uint64_t)JLM_B_COUNT * rows;
        if (!rc)
            rc = jlm_ecu_grow(v, &s->rec, nrec * sizeof(jlm_cu_act), 0, err);
        jlm_cu_act *h = rc ? NULL : malloc(nrec * sizeof *h);
        if (!rc && !h)
            rc = jlm_errf(err, JLM_ENOMEM, "cuda: out of memory");
        for (int b = 0; h && b < JLM_B_COUNT; b++)   /* buffer b's rows as int8 rows of its width */
            for (uint64_t t = 0; t < rows; t++) {
                uint64_t k = s->rec_k[b] = width(e, b);
                h[b * rows + t] = jlm_ecu_act_at(&s->aq, &s->ad, &s->as, k, t * k);
            }
        if (h)
            rc = jlm_ecu_records_up(v, s->rec.p, h, nrec, err);   /* once, at growth */
        free(h);
        if (!rc)
            s->ab_rows = rows;
    }
    if (!rc)
        rc = jlm_ecu_grow(v, &s->scores, (uint64_t)e->c->n_head * e->kv_ctx * 4, 0, err);
    for (uint32_t t = 0; !rc && t < k->b.n; t += jlm_exd_group(k, t))
        rc = seq_cache(v, e, jlm_exd_host(k, t), l, err);
    return rc;
}

/* The most scores (bytes) a prefill's attention may hold: its rows attend
 * together in launches that fit (one row always does). */
#define SCORES_MAX (64ull << 20)

/* A prefill block's row table (n > 1 rows; rows_of reads it): each row's
 * position, then its keys (the first, jlm_ex_first_key's, and how many: to
 * its own, or the image's end for bidirectional rows), up in one copy (its
 * bytes counted with the activations); the scores grown to hold the rows'
 * attention within SCORES_MAX. */
static int rows_up(jlm_ecu *v, jlm_exd *k, jlm_err *err)
{
    jlm_ecu_blk *s = &v->blk;
    const jlm_engine *e = k->e;
    uint32_t n = k->b.n, *h = malloc(3ull * n * sizeof *h);
    if (!h)
        return jlm_errf(err, JLM_ENOMEM, "cuda: out of memory");
    s->rowt_most = 1;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t pos = jlm_exd_pos(k, t), hi = pos < e->bidir_end ? e->bidir_end : pos + 1;
        h[t] = pos;
        h[n + 2 * t] = jlm_ex_first_key(k->c, k->b.l, pos);
        h[n + 2 * t + 1] = hi - h[n + 2 * t];
        s->rowt_most = h[n + 2 * t + 1] > s->rowt_most ? h[n + 2 * t + 1] : s->rowt_most;
    }
    uint64_t one = (uint64_t)e->c->n_head * s->rowt_most * 4, want = one * n;
    want = want < SCORES_MAX ? want : one > SCORES_MAX ? one : SCORES_MAX;
    int rc = jlm_ecu_grow(v, &s->rowt, 3ull * n * sizeof *h, 0, err);
    if (!rc && s->scores.cap < want)
        rc = jlm_ecu_grow(v, &s->scores, want, 0, err);
    if (!rc && jlm_cu_rt_h2d(v->rt, s->rowt.p, h, 3ull * n * sizeof *h, CS))   /* pageable: consumed now */
        rc = jlm_ecu_fail(v, err, "the rows' positions");
    s->queued = 1;
    v->st.act_up += rc ? 0 : 3ull * n * sizeof *h;
    free(h);
    return rc;
}

static void seq_drop(jlm_ecu *v, jlm_exd_seqc *c)
{
    void **kc = c->kc, **vc = c->vc;
    for (uint32_t l = 0; l < v->blk.n_layer; l++) {
        jlm_cu_rt_free(v->rt, kc[l]);
        jlm_cu_rt_free(v->rt, vc[l]);
    }
    if (v->blk.kc == c->kc)
        v->blk.kc = v->blk.vc = NULL;
    jlm_exd_seq_forget(v->blk.seqs, c);
}

static int kvx_sync(void *be, jlm_err *err) { return jlm_ecu_drain(be, err); }
static void kvx_drop(void *be, jlm_exd_seqc *c) { seq_drop(be, c); }
static int kvx_cache(void *be, jlm_engine *e, const void *host, uint32_t l, jlm_err *err)
{
    return seq_cache(be, e, host, l, err);
}

static int kvx_stage(void *be, uint64_t bytes, uint8_t **p, jlm_err *err)
{
    jlm_ecu *v = be;
    int rc = jlm_ecu_grow(v, &v->blk.stage, bytes, 1, err);
    *p = rc ? NULL : v->blk.stage.p;
    return rc;
}

static int kvx_copy(void *be, uint32_t l, uint64_t kb, uint64_t vb, int up, jlm_err *err)
{
    jlm_ecu *v = be;
    jlm_ecu_blk *s = &v->blk;
    uint8_t *st = s->stage.p;
    int rc = JLM_OK;
    jlm_dev_prof_op(&v->dev, JLM_DEVP_XFER);
    if (up ? jlm_cu_rt_h2d(v->rt, s->kc[l], st, kb, CS) || (vb && jlm_cu_rt_h2d(v->rt, s->vc[l], st + kb, vb, CS))
           : jlm_cu_rt_d2h(v->rt, st, s->kc[l], kb, CS) || (vb && jlm_cu_rt_d2h(v->rt, st + kb, s->vc[l], vb, CS)))
        rc = jlm_ecu_fail(v, err, "a sequence's KV cache");
    s->queued = 1;
    int rc2 = jlm_ecu_drain(v, err);
    return rc ? rc : rc2;
}

static const jlm_exd_kvx CU_KVX = {kvx_sync, kvx_drop, kvx_cache, kvx_stage, kvx_copy};

int jlm_ecu_kv_xfer(jlm_dev *d, jlm_engine *e, void *kc, void *vc, uint32_t n, int up, jlm_err *err)
{
    jlm_ecu *v = (jlm_ecu *)d;
    return jlm_exd_kv_xfer(&CU_KVX, v, v->blk.seqs, v->blk.side, &v->st, e, kc, vc, n, up, err);
}

void jlm_ecu_blk_free(jlm_ecu *v)
{
    jlm_ecu_blk *s = &v->blk;
    scratch *dev[] = {&s->aq, &s->ad, &s->as, &s->rec, &s->odd, &s->scores, &s->logits, &s->rowt, &s->dpos};
    jlm_ecu_moe_free(v);
    jlm_ecu_mla_free(v);
    for (int b = 0; b < JLM_B_COUNT; b++)
        jlm_ecu_scratch_free(v, &s->ab[b], 0);
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        jlm_ecu_scratch_free(v, dev[i], 0);
    jlm_ecu_scratch_free(v, &s->h_x, 1);
    jlm_ecu_scratch_free(v, &s->h_logits, 1);
    jlm_ecu_scratch_free(v, &s->stage, 1);
    jlm_ecu_scratch_free(v, &s->h_dpos, 1);
    while (s->seqs && s->seqs->n)
        seq_drop(v, &s->seqs->c[0]);
    free(s->seqs ? s->seqs->c : NULL);
    free(s->seqs);
    free(s->side);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- entries */

/* n floats of device src into host dst through the pinned buffer, after
 * everything queued: one round trip. */
int jlm_ecu_down(jlm_ecu *v, scratch *pin, float *dst, const void *src, uint64_t bytes, jlm_err *err)
{
    int rc = jlm_ecu_grow(v, pin, bytes, 1, err);
    jlm_dev_prof_op(&v->dev, JLM_DEVP_XFER);   /* the copy and the wait: no op's */
    if (!rc && jlm_cu_rt_d2h(v->rt, pin->p, src, bytes, CS))
        rc = jlm_ecu_fail(v, err, "copy to the host");
    v->blk.queued = 1;
    int rc2 = jlm_ecu_drain(v, err);
    if (!rc && !rc2) {
        memcpy(dst, pin->p, bytes);
        v->st.act_down += bytes;
    }
    return rc ? rc : rc2;
}

/* The token's device part ends (its rows or logits came down): its taping
 * stops. A MoE block's routing wait (exec_cu_moe.c) only ends a segment. */
static int token_end(jlm_ecu *v, int rc, jlm_err *err)
{
    if (jlm_cu_rt_graph(v->rt, 0) && !rc)
        rc = jlm_ecu_fail(v, err, "the token's graph");
    return rc;
}

int jlm_ecu_x_sync(jlm_dev *d, jlm_err *err)
{
    jlm_ecu *v = (jlm_ecu *)d;
    jlm_ecu_blk *s = &v->blk;
    if (!s->x_host)
        return JLM_OK;
    float *x = s->x_host;
    s->x_host = NULL;
    return token_end(v, down(v, &s->h_x, x, s->ab[JLM_B_X].p, (uint64_t)s->x_rows * s->x_E * 4, err), err);
}

void jlm_ecu_x_drop(jlm_dev *d)
{
    jlm_ecu *v = (jlm_ecu *)d;
    jlm_ecu_drain(v, NULL);   /* the pinned rows may be refilled next */
    jlm_cu_rt_graph(v->rt, 0);
    v->blk.x_host = NULL;
}

/* A decoded token's launches taped from here (a graph where they repeat:
 * kernels/cuda/rt.h) and its position into device memory for them. */
static int pos_up(jlm_ecu *v, uint32_t pos, jlm_err *err)
{
    jlm_ecu_blk *s = &v->blk;
    int rc = jlm_ecu_grow(v, &s->dpos, 4, 0, err);
    if (!rc)
        rc = jlm_ecu_grow(v, &s->h_dpos, 4, 1, err);
    if (rc)
        return rc;
    if (jlm_cu_rt_graph(v->rt, 1))
        return jlm_ecu_fail(v, err, "the token's graph");
    memcpy(s->h_dpos.p, &pos, 4);   /* pinned: the stream was drained since its last use */
    if (jlm_cu_rt_h2d(v->rt, s->dpos.p, s->h_dpos.p, 4, CS))
        return jlm_ecu_fail(v, err, "the position");
    s->queued = 1;
    v->st.act_up += 4;
    s->dpos_at = pos;
    s->dpos_ok = 1;
    return JLM_OK;
}

int jlm_ecu_block(jlm_dev *d, jlm_engine *e, const jlm_prog *p, uint32_t l, const uint8_t *page, float *xs,
                  uint32_t n, void *kc, uint32_t pos0, jlm_err *err)
{
    jlm_ecu *v = (jlm_ecu *)d;
    jlm_ecu_blk *s = &v->blk;
    jlm_exd k;
    int rc = jlm_exd_plan(&k, &CU_OPS, v, e, p, l, page, n, kc, pos0, &s->side, "cuda", err);
    if (rc)
        return rc;
    if (s->x_host && (s->x_host != xs || s->x_rows != n))
        rc = jlm_ecu_x_sync(d, err);   /* other rows: theirs back first */
    if (!rc && n > s->ab_rows && s->ab_rows)
        rc = jlm_ecu_drain(v, err);    /* growing frees what queued kernels read */
    if (!rc)
        rc = buffers(v, e, &k, err);
    if (!rc)
        rc = jlm_ecu_frames_wait(v, err);   /* the dense region or a page paged in by the plan */
    if (!rc && s->x_host != xs && jlm_exd_group(&k, 0) < n && s->logits.cap < (uint64_t)n * e->c->n_vocab * 4) {
        if (s->logits.p)   /* a batch: every row's logits, their buffer grown before its kernels */
            rc = jlm_ecu_drain(v, err);   /* queued kernels may write the old buffer */
        if (!rc)
            rc = jlm_ecu_grow(v, &s->logits, (uint64_t)n * e->c->n_vocab * 4, 0, err);
    }
    if (!rc && s->x_host != xs) {   /* the rows go up */
        uint64_t bytes = (uint64_t)n * e->c->n_embd * 4;
        rc = jlm_ecu_grow(v, &s->h_x, bytes, 1, err);
        s->dpos_ok = 0;
        if (!rc && n == 1)   /* a decoded token: taped, and its position goes up with it */
            rc = pos_up(v, jlm_exd_pos(&k, 0), err);
        if (!rc) {
            memcpy(s->h_x.p, xs, bytes);   /* pinned: the stream was drained since its last use */
            jlm_dev_prof_op(d, JLM_DEVP_XFER);
            if (jlm_cu_rt_h2d(v->rt, s->ab[JLM_B_X].p, s->h_x.p, bytes, CS))
                rc = jlm_ecu_fail(v, err, "the residual rows");
            s->queued = 1;
            v->st.act_up += bytes;
            s->x_host = xs;
            s->x_rows = n;
            s->x_E = e->c->n_embd;
        }
    }
    if (!rc && n > 1)
        rc = rows_up(v, &k, err);
    k.dry = 0;
    if (!rc)
        rc = jlm_exd_run(&k);
    if (rc) {
        jlm_ecu_drain(v, NULL);
        jlm_cu_rt_graph(v->rt, 0);
        s->x_host = NULL;
        return jlm_err_prefix(err, rc == UNSUP ? JLM_EIO : rc, "cuda: block %u", l);
    }
    return JLM_OK;
}

int jlm_ecu_output(jlm_dev *d, const float *norm, float eps, const jlm_k_mat *m, const float *x, uint32_t n,
                   uint32_t E, float *logits, jlm_err *err)
{
    jlm_ecu *v = (jlm_ecu *)d;
    jlm_ecu_blk *s = &v->blk;
    const float *w = NULL;
    uint64_t bytes = (uint64_t)n * m->rows * 4, r0;
    if (!jlm_exd_held(s->x_host, s->x_rows, s->x_E, s->ab_rows, x, n, E, &r0) || m->k != E ||
        matmul_rows(v, m, n, NULL, JLM_B_H, NULL, 0, 1, NULL) || vec(v, norm, E, &w))
        return UNSUP;
    int rc = jlm_ecu_frames_wait(v, err);
    if (!rc && s->logits.cap < bytes) {
        if (s->logits.p)
            rc = jlm_ecu_drain(v, err);   /* queued kernels may write the old buffer */
        if (!rc)
            rc = jlm_ecu_grow(v, &s->logits, bytes, 0, err);
    }
    float *h = s->ab[JLM_B_H].p, *xr = (float *)s->ab[JLM_B_X].p + r0 * E;
    jlm_dev_prof_op(d, JLM_DEVP_NORM);
    if (!rc && jlm_cu_rt_rmsnorm(v->rt, h, xr, w, E, n, eps, CS))
        rc = jlm_ecu_fail(v, err, "rmsnorm");
    jlm_dev_prof_op(d, JLM_DEVP_MATMUL);
    if (!rc)
        rc = matmul_rows(v, m, n, h, JLM_B_H, s->logits.p, 0, 0, err);
    if (rc) {
        jlm_ecu_drain(v, NULL);
        return rc;
    }
    return token_end(v, down(v, &s->h_logits, logits, s->logits.p, bytes, err), err);
}
