/* exec_vk.c - whole blocks on a Vulkan device: a block program's ops
 * (engine/prog.h) recorded into the device's open command buffer, so the
 * blocks of a token (and the output matrix, when it is there too) make one
 * round trip (docs/vulkan.md, "Whole blocks on the device").
 *
 * The residual rows cross to the device at the first device block of a
 * forward and back only at a split point (jlm_evk_x_sync) or not at all when
 * the logits are computed here (jlm_evk_output). The engine's own sequence
 * keeps its KV cache of these blocks here (keys and values each F32, F16 or
 * Q8_0 as the engine's --kv / --cache-type-k / --cache-type-v, a buffer per
 * layer, rows of kv_dim; F16 and Q8_0 rounded as the CPU's cache rounds);
 * any other sequence (jlm_engine_seq: serve, batches) and what the shaders
 * lack (quantized weights or a Q8_0 cache without shaderFloat64; the MOE op
 * is exec_vk_moe.c's) is
 * JLM_EUNSUPPORTED, decided per model, layer and sequence before anything
 * is recorded (the walk: exec_dev.c), so a block always runs on the same
 * side. Quantized weights read int8 rows quantized on the
 * device (jlm_vk_quantize, bit-identical to the CPU's). */
#include "engine/backend_vk_int.h"
#include "engine/exec_dev.h"

#include <math.h>
#include <string.h>

#define UNSUP JLM_EUNSUPPORTED
#define width jlm_exd_width

static jlm_evk *evk(const jlm_exd *k) { return k->be; }

_Static_assert((int)KV_F32 == (int)JLM_VK_KV_F32 && (int)KV_F16 == (int)JLM_VK_KV_F16 &&
                   (int)KV_Q8_0 == (int)JLM_VK_KV_Q8_0,
               "cache types");

/* The device cache of b (K or V) has the engine's type of it; bytes of its row
 * (kv_dim elements: the CPU's rows of each head, one after another) */
static int kv_type(const jlm_engine *e, int b) { return b == JLM_B_K ? e->kt : e->vt; }
static uint64_t kv_row(const jlm_engine *e, int b) { return jlm_kv_row_bytes(kv_type(e, b), (uint32_t)width(e, b)); }

/* floats [off, off + n) of activation buffer b */
static jlm_vk_view abv(const jlm_exd *k, int b, uint64_t off, uint64_t n)
{
    return (jlm_vk_view){evk(k)->blk.ab[b], off * 4, n * 4};
}

/* The device view of a dense vector (norm weights, biases); NULL p: none. */
static int vec(jlm_evk *v, const float *p, uint64_t n, jlm_vk_view *out)
{
    *out = (jlm_vk_view){0};
    if (!p)
        return JLM_OK;
    jlm_dframe *f = jlm_dframes_frame_of(&v->dev.frames, p, n * 4, NULL);
    uint64_t off = f ? (uint64_t)((const uint8_t *)p - (const uint8_t *)f->host) : 0;
    if (!f || off % jlm_vk_offset_align(v->vk))
        return UNSUP;
    *out = (jlm_vk_view){f->buf, off, n * 4};
    return JLM_OK;
}
int jlm_evk_vec(jlm_evk *v, const float *p, uint64_t n, jlm_vk_view *out) { return vec(v, p, n, out); }

/* y (n rows) = x (n rows of m->k) times m, its planes in a device frame;
 * quantized types read x's int8 rows, quantized on the device (reuse: the
 * previous call's rows are x's). dry: only whether it can. */
static int matmul_rows(jlm_evk *v, const jlm_k_mat *m, uint32_t n, jlm_vk_view x, jlm_vk_view y, int reuse, int dry,
                       jlm_err *err)
{
    jlm_vk_mat vm;
    int fl = jlm_fmt_type_traits(m->type)->is_float;
    if ((!fl && (!jlm_vk_can_quantize(v->vk) || m->k % 32)) ||
        jlm_evk_planes(v, m, &vm, 0, NULL))
        return UNSUP;
    if (dry)
        return JLM_OK;
    uint64_t nk = (uint64_t)n * m->k;
    jlm_vk_act va = {m->k, {v->blk.aq, 0, nk}, {v->blk.ad, 0, nk / 8}, {v->blk.as, 0, nk / 8}, n};
    int rc = fl || reuse ? JLM_OK : jlm_vk_quantize(v->vk, x, nk, &va, err);
    v->st.matmuls++;
    return rc ? rc : jlm_vk_matmul(v->vk, &vm, n, fl ? x : (jlm_vk_view){0}, fl ? NULL : &va, y, err);
}

/* For exec_vk_moe.c: matmul_rows, vec and grow under their external names. */
int jlm_evk_matmul_rows(jlm_evk *v, const jlm_k_mat *m, uint32_t n, jlm_vk_view x, jlm_vk_view y, int reuse, int dry,
                        jlm_err *err)
{
    return matmul_rows(v, m, n, x, y, reuse, dry, err);
}

static int op_mm(jlm_exd *k, const jlm_k_mat *m, int src, int dst, int reuse)
{
    uint32_t n = k->b.n;
    return matmul_rows(evk(k), m, n, abv(k, src, 0, n * m->k), abv(k, dst, 0, n * m->rows), reuse, k->dry, k->err);
}

/* The n rows of b, one view */
static jlm_vk_view rows(const jlm_exd *k, int b) { return abv(k, b, 0, k->b.n * width(k->e, b)); }

static int op_bias(jlm_exd *k, int b, const float *p)
{
    jlm_vk_view bv;
    uint32_t w = (uint32_t)width(k->e, b);
    int rc = vec(evk(k), p, w, &bv);
    return rc || k->dry ? rc : jlm_vk_add_rows(evk(k)->vk, rows(k, b), rows(k, b), bv, w, k->b.n, k->err);
}

/* In place over b's rows: each group of n floats (per of them a row, at
 * g * n in it) = rmsnorm(it) * w (w: a view, or none), all in one dispatch */
static int norm_groups(const jlm_exd *k, int b, jlm_vk_view w, uint32_t n, uint32_t per)
{
    uint32_t W = (uint32_t)width(k->e, b);
    return jlm_vk_rmsnorm_rows(evk(k)->vk, rows(k, b), rows(k, b), w, n, per, k->b.n, W, k->c->rms_eps, k->err);
}

/* dst rows = rmsnorm(src rows) * w, rows of E floats (w: a view, or none) */
static int norm_rows(jlm_exd *k, int dst, int src, jlm_vk_view w)
{
    uint32_t W = (uint32_t)width(k->e, dst);
    return k->dry ? JLM_OK
                  : jlm_vk_rmsnorm_rows(evk(k)->vk, rows(k, dst), rows(k, src), w, W, 1, k->b.n, W, k->c->rms_eps,
                                        k->err);
}

/* The most rows of one dispatch (its grid's y: jlm_vk_attention_rows,
 * jlm_vk_rmsnorm_rows); every block has a norm, so a block of more runs on
 * the host (decided by the dry walk, as for any op it lacks). */
#define MAX_ROWS 65535u

static int op_norm(jlm_exd *k, int dst, int src, const float *p)
{
    if (k->b.n > MAX_ROWS)
        return UNSUP;
    jlm_vk_view w;
    int rc = vec(evk(k), p, width(k->e, dst), &w);
    return rc ? rc : norm_rows(k, dst, src, w);
}

/* Field by field (the struct's padding is not part of it). */
static int same_rope(const jlm_k_rope *a, const jlm_k_rope *b)
{
    return a->n_rot == b->n_rot && a->neox == b->neox && a->freq_base == b->freq_base &&
           a->freq_scale == b->freq_scale && a->freq_factors == b->freq_factors && a->ext_factor == b->ext_factor &&
           a->attn_factor == b->attn_factor && a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow &&
           a->orig_ctx == b->orig_ctx;
}

/* Layer l's RoPE (latent attention's: jlm_ex_mla_rope) */
static void layer_rope(const jlm_engine *e, uint32_t l, jlm_k_rope *rp)
{
    (e->c->kv_lora_rank ? jlm_ex_mla_rope : jlm_ex_rope_params)(e, l, rp);
}

/* The RoPE parameter sets whose cos/sin go up with the rows: layer 0's and
 * the first other layer's that differ (gemma3's sliding-window layers have
 * their own base), layers without RoPE (Llama 4's, n_rot 0) left out; how
 * many (1 or 2). */
static uint32_t rope_sets(const jlm_engine *e, jlm_k_rope set[2])
{
    layer_rope(e, 0, &set[0]);
    for (uint32_t l = 1; l < e->c->n_layer; l++) {
        layer_rope(e, l, &set[1]);
        if (!set[0].n_rot)
            set[0] = set[1];
        else if (set[1].n_rot && !same_rope(&set[1], &set[0]))
            return 2;
    }
    return 1;
}

/* The rows of b, head by head: each head's RMS norm (w) then RoPE by the
 * rows' cos/sin (si: which of the ns tables; none: -1); Llama 4 (qk_unit):
 * RoPE, then a weightless norm, on the layers with RoPE only. Each step one
 * dispatch over every row. */
static int heads_rows(const jlm_exd *k, int b, uint32_t n_head, jlm_vk_view w, const jlm_k_rope *rp, uint32_t ns,
                      int si)
{
    const jlm_engine *e = k->e;
    jlm_evk *v = evk(k);
    uint32_t W = (uint32_t)width(e, b), n = k->b.n;
    int unit = e->qk_unit && si >= 0, rc = JLM_OK;
    if (w.buf)
        rc = norm_groups(k, b, w, e->hd, n_head);
    if (!rc && si >= 0) {
        uint64_t per = (uint64_t)rp->n_rot * 4;
        jlm_vk_view cs = {v->blk.cs, (uint64_t)si * per, ((uint64_t)(n - 1) * ns + 1) * per};
        rc = jlm_vk_rope_rows(v->vk, rp->n_rot, rp->neox, rows(k, b), n_head, e->hd, W, cs, ns * rp->n_rot, n,
                              k->err);
    }
    if (!rc && unit)
        rc = norm_groups(k, b, (jlm_vk_view){0}, e->hd, n_head);
    return rc;
}

/* Q's rows times each row's attention temperature (Llama 4's no-RoPE
 * layers: one dispatch, a scale a row; nothing where every row's is 1, as
 * scale_q tests) */
static int q_temp(const jlm_exd *k, int b, const jlm_k_rope *rp)
{
    uint32_t n = k->b.n, any = 0;
    float *s = b == JLM_B_Q ? malloc((uint64_t)n * sizeof *s) : NULL;
    if (b == JLM_B_Q && !s)
        return jlm_errf(k->err, JLM_ENOMEM, "vulkan: out of memory");
    for (uint32_t t = 0; s && t < n; t++)
        any |= (s[t] = jlm_ex_q_temp(k->c, rp, jlm_exd_pos(k, t))) != 1.0f;
    uint32_t W = (uint32_t)width(k->e, b);
    int rc = any ? jlm_vk_scale_rows(evk(k)->vk, rows(k, b), rows(k, b), s, W, n, k->err) : JLM_OK;
    free(s);
    return rc;
}

/* Each head of each row of b (q or k): its RMS norm (p; wide: one norm over
 * the whole row, OLMoE) and RoPE at the row's position (none on a layer
 * without it); q then times the attention temperature (Llama 4's no-RoPE
 * layers; 1 elsewhere). */
static int op_heads(jlm_exd *k, int b, uint32_t n_head, const float *p, int wide)
{
    jlm_engine *e = k->e;
    jlm_evk *v = evk(k);
    jlm_vk_view w;
    jlm_k_rope rp, sets[2];
    layer_rope(e, k->b.l, &rp);
    uint32_t ns = rope_sets(e, sets), si = 0;
    while (si < ns && !same_rope(&rp, &sets[si]))
        si++;
    int rope = !(k->c->flags & JLM_F_NO_POS_ENC) && rp.n_rot, rc = vec(v, p, wide ? width(e, b) : e->hd, &w);
    uint64_t al = jlm_vk_offset_align(v->vk);
    if (!rc && ((rope && (rp.n_rot % 2 || rp.n_rot > e->hd || si == ns || (rp.n_rot * 4) % al)) ||
                ((w.buf || e->qk_unit) && (e->hd * 4) % al) || (e->qk_unit && w.buf)))
        rc = UNSUP;   /* the layer's cos/sin must be one of the tables up with the rows */
    if (rc || k->dry)
        return rc;
    if (wide && w.buf)
        rc = norm_groups(k, b, w, (uint32_t)width(e, b), 1);
    if (!rc)
        rc = heads_rows(k, b, n_head, wide ? (jlm_vk_view){0} : w, &rp, ns, rope ? (int)si : -1);
    return rc ? rc : q_temp(k, b, &rp);
}

int jlm_evk_rope_cs(const jlm_exd *k, jlm_k_rope *rp, jlm_vk_view *cs, uint32_t *cs_stride)
{
    jlm_k_rope sets[2];
    layer_rope(k->e, k->b.l, rp);
    uint32_t ns = rope_sets(k->e, sets), si = 0;
    while (si < ns && !same_rope(rp, &sets[si]))
        si++;
    if (si == ns || !rp->n_rot || rp->n_rot % 2 || (rp->n_rot * 4) % jlm_vk_offset_align(evk(k)->vk) ||
        (k->c->flags & JLM_F_NO_POS_ENC))
        return UNSUP;
    uint64_t per = (uint64_t)rp->n_rot * 4;
    *cs = (jlm_vk_view){evk(k)->blk.cs, si * per, ((uint64_t)(k->b.n - 1) * ns + 1) * per};
    *cs_stride = ns * rp->n_rot;
    return JLM_OK;
}

/* rows [t, t + m) of b (K or V) into positions [p, p + m) of the layer's
 * cache c, in one command: copied (F32), rounded to halves (F16) or
 * quantized to Q8_0 blocks, as jlm_kv_put_row does (bit-identical; the
 * cache's rows follow each other as the buffer's do). */
static int kv_put(jlm_exd *k, jlm_vk_buf *c, uint64_t p, int b, uint32_t t, uint32_t m)
{
    uint64_t n = width(k->e, b) * m, rb = kv_row(k->e, b);
    jlm_vk_view dst = {c, p * rb, m * rb}, src = abv(k, b, t * width(k->e, b), n);
    switch (kv_type(k->e, b)) {
    case KV_F32: return jlm_vk_copy(evk(k)->vk, dst, src, n * 4, k->err);
    case KV_F16: return jlm_vk_to_f16(evk(k)->vk, dst, src, (uint32_t)n, k->err);
    default: return jlm_vk_kv_q8(evk(k)->vk, dst, src, (uint32_t)n, k->err);
    }
}

/* How many rows from t on sit at consecutive positions (a prefill: all) */
uint32_t jlm_evk_run_of(const jlm_exd *k, uint32_t t)
{
    uint32_t m = 1;
    while (t + m < k->b.n && jlm_exd_pos(k, t + m) == jlm_exd_pos(k, t) + m)
        m++;
    return m;
}

/* The device cache of row t's sequence becomes blk.kc, blk.vc (buffers()
 * made it). */
static void use_seq(const jlm_exd *k, uint32_t t)
{
    jlm_evk_blk *s = &evk(k)->blk;
    jlm_exd_seqc *c = jlm_exd_seq_find(s->seqs, jlm_exd_host(k, t));
    s->kc = c->kc;
    s->vc = c->vc;
}

static int op_kv_put(jlm_exd *k)
{
    jlm_evk *v = evk(k);
    int rc = JLM_OK;
    if ((k->e->kt == KV_Q8_0 || k->e->vt == KV_Q8_0) && !jlm_vk_can_quantize(v->vk))
        return UNSUP;   /* kv_q8.comp rounds through doubles */
    for (uint32_t t = 0, m; !rc && !k->dry && t < k->b.n; t += m) {
        uint64_t p = jlm_exd_pos(k, t);
        uint32_t g = jlm_exd_group(k, t);
        m = jlm_evk_run_of(k, t);
        m = m < g ? m : g;
        use_seq(k, t);
        rc = kv_put(k, v->blk.kc[k->b.l], p, JLM_B_K, t, m);
        if (!rc)
            rc = kv_put(k, v->blk.vc[k->b.l], p, JLM_B_V, t, m);
    }
    return rc;
}

/* The most scores (floats) the attention of a block may hold: a prefill's
 * rows attend together in chunks that fit it (one row always does). */
#define SCORES_MAX (64ull << 20)
static uint64_t scores_bytes(const jlm_evk *v, const jlm_engine *e, uint64_t rows)
{
    uint64_t one = (uint64_t)e->c->n_head * e->kv_ctx * 4, cap = jlm_vk_max_binding(v->vk);
    cap = cap < SCORES_MAX ? cap : SCORES_MAX;
    return rows * one < cap ? rows * one : one > cap ? one : cap;
}

/* Rows [0, n) of the block, row t's query at q + t*qw floats over keys
 * [lh[2t], lh[2t+1]) of the caches (kc, vc: whole; kb, vb: a position's
 * bytes) -> out + t*ow: the rows attend together, in as few chunks as the
 * scores hold (one a prefill of a small model), each chunk one dispatch over
 * the union of its rows' keys. */
int jlm_evk_attend_rows(const jlm_exd *k, const jlm_k_attn *ap, uint32_t n_head, uint32_t n_kv_head,
                        const uint32_t *lh, jlm_vk_view q, uint32_t qw, jlm_evk_kv kv, const float *sinks,
                        jlm_vk_view out, uint32_t ow)
{
    jlm_evk_blk *s = &evk(k)->blk;
    uint64_t cap = jlm_vk_buf_size(s->scores) / 4 / n_head;   /* keys a row's scores may hold */
    uint32_t n = k->b.n, *span = malloc((uint64_t)n * 2 * sizeof *span);
    if (!span)
        return jlm_errf(k->err, JLM_ENOMEM, "vulkan: out of memory");
    int rc = JLM_OK;
    for (uint32_t t = 0, m; !rc && t < n; t += m) {
        uint32_t lo = lh[2 * t], hi = lh[2 * t + 1], most = hi - lo;
        for (m = 1; t + m < n; m++) {   /* the chunk [t, t + m): its rows' scores fit */
            uint32_t l2 = lh[2 * (t + m)], h2 = lh[2 * (t + m) + 1], mo = h2 - l2 > most ? h2 - l2 : most;
            if ((uint64_t)(m + 1) * mo > cap)
                break;
            most = mo, lo = l2 < lo ? l2 : lo, hi = h2 > hi ? h2 : hi;
        }
        for (uint32_t r = 0; r < m; r++) {
            span[2 * r] = lh[2 * (t + r)] - lo;
            span[2 * r + 1] = lh[2 * (t + r) + 1] - lh[2 * (t + r)];
        }
        jlm_vk_view kv_k = {kv.kc, lo * kv.kb, (hi - lo) * kv.kb}, kv_v = {kv.vc, lo * kv.vb, (hi - lo) * kv.vb},
                    sc = {s->scores, 0, (uint64_t)m * n_head * most * 4};
        rc = jlm_vk_attention_rows(evk(k)->vk, ap, n_head, n_kv_head, m,
                                   (jlm_vk_view){q.buf, q.off + (uint64_t)t * qw * 4, (uint64_t)m * qw * 4}, qw, kv_k,
                                   kv.kt, kv_v, kv.vt, span, sinks, sc,
                                   (jlm_vk_view){out.buf, out.off + (uint64_t)t * ow * 4, (uint64_t)m * ow * 4}, ow,
                                   k->err);
    }
    free(span);
    return rc;
}

/* ATT rows: each row over keys [lo, hi): a sliding window's (or a chunk's)
 * first key to its own (up to bidir_end in an image), so the hidden keys
 * are not read at all (the CPU masks them: exp(-inf) adds 0). */
static int op_attend(jlm_exd *k, const float *sinks)
{
    jlm_engine *e = k->e;
    const jlm_config *c = k->c;
    jlm_evk_blk *s = &evk(k)->blk;
    jlm_k_attn ap = {.head_dim = e->hd, .head_dim_v = e->hd_v, .k_stride = e->kv_dim, .v_stride = e->kv_dim_v,
                     .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)e->hd),
                     .softcap = c->attn_softcap};
    if (k->dry)
        return JLM_OK;
    uint32_t n = k->b.n, *lh = malloc((uint64_t)n * 2 * sizeof *lh);
    if (!lh)
        return jlm_errf(k->err, JLM_ENOMEM, "vulkan: out of memory");
    for (uint32_t t = 0; t < n; t++) {
        uint32_t pos = jlm_exd_pos(k, t);
        lh[2 * t] = jlm_ex_first_key(c, k->b.l, pos);
        lh[2 * t + 1] = pos < e->bidir_end ? e->bidir_end : pos + 1;
    }
    int rc = JLM_OK;
    uint64_t qw = width(e, JLM_B_Q), ow = width(e, JLM_B_ATT);
    for (uint32_t t = 0, m; !rc && t < n; t += m) {   /* each sequence's rows over its own cache */
        jlm_exd g = *k;
        g.b.n = m = jlm_exd_group(k, t);
        use_seq(k, t);
        jlm_evk_kv kv = {s->kc[k->b.l], kv_row(e, JLM_B_K), e->kt, s->vc[k->b.l], kv_row(e, JLM_B_V), e->vt};
        jlm_vk_view q = rows(k, JLM_B_Q), o = rows(k, JLM_B_ATT);
        q.off += t * qw * 4;
        o.off += t * ow * 4;
        rc = jlm_evk_attend_rows(&g, &ap, c->n_head, c->n_kv_head, lh + 2 * t, q, (uint32_t)qw, kv, sinks, o,
                                 (uint32_t)ow);
    }
    free(lh);
    return rc;
}

static int op_add(jlm_exd *k, int dst, int src)
{
    uint64_t n = k->b.n * width(k->e, dst);
    return k->dry ? JLM_OK
                  : jlm_vk_eltwise(evk(k)->vk, JLM_VK_ADD, abv(k, dst, 0, n), abv(k, dst, 0, n), abv(k, src, 0, n),
                                   (uint32_t)n, k->err);
}

static int op_act(jlm_exd *k, int act, uint64_t n)
{
    if (k->dry)
        return JLM_OK;   /* SwiGLU, SwiGLU-OAI and the fp16-table GELU gate: the walk's kinds */
    jlm_vk_view g = abv(k, JLM_B_G, 0, n), u = abv(k, JLM_B_U, 0, n);
    if (act == JLM_ACT_GELU_FP16)
        return jlm_vk_geglu_fp16(evk(k)->vk, g, g, u, (uint32_t)n, k->err);
    return act == JLM_ACT_SWIGLU ? jlm_vk_eltwise(evk(k)->vk, JLM_VK_SWIGLU, g, g, u, (uint32_t)n, k->err)
                                 : jlm_vk_swiglu_oai(evk(k)->vk, g, g, u, (uint32_t)n, 1.702f, 7.0f, k->err);
}

static int op_moe(jlm_exd *k, const jlm_op *op) { return jlm_evk_moe(evk(k), k->e, &k->b, op, k->dry, k->err); }

static const jlm_exd_ops VK_OPS = {op_norm,   op_mm,  op_bias, op_heads, op_kv_put,
                                   op_attend, op_add, op_act,  op_moe,   jlm_evk_mla, 1};

/* ---------------------------------------------------------------- buffers */
static int grow(jlm_evk *v, jlm_vk_buf **b, uint64_t bytes, int host, jlm_err *err)
{
    bytes = bytes ? bytes : 4;   /* a buffer of a width 0 (latent attention's V) */
    if (*b && jlm_vk_buf_size(*b) >= bytes)
        return JLM_OK;
    int rc = *b ? jlm_evk_rec_end(v, err) : JLM_OK;   /* recorded commands may read the old one */
    if (rc)
        return rc;
    jlm_vk_buf_free(v->vk, *b);
    *b = NULL;
    return host ? jlm_vk_buf_new(v->vk, bytes, b, err) : jlm_vk_buf_new_device(v->vk, bytes, b, err);
}
int jlm_evk_grow(jlm_evk *v, jlm_vk_buf **b, uint64_t bytes, int host, jlm_err *err)
{
    return grow(v, b, bytes, host, err);
}

/* Layer l's device cache of the sequence whose host cache is host (made
 * if absent), left in blk.kc, blk.vc. */
static int seq_cache(jlm_evk *v, jlm_engine *e, const void *host, uint32_t l, jlm_err *err)
{
    jlm_evk_blk *s = &v->blk;
    jlm_exd_seqc *c;
    s->n_layer = e->c->n_layer;
    int rc = jlm_exd_seq_get(&s->seqs, host, s->n_layer, sizeof *s->kc, &c, "vulkan", err);
    if (rc)
        return rc;
    s->kc = c->kc;
    s->vc = c->vc;
    /* whole words: a Q8_0 row may end inside one (jlm_vk_kv_q8 binds them) */
    rc = grow(v, &s->kc[l], ((uint64_t)e->kv_ctx * kv_row(e, JLM_B_K) + 3) / 4 * 4, 0, err);
    if (!rc && e->kv_dim_v)   /* latent attention's cache is kc's alone */
        rc = grow(v, &s->vc[l], ((uint64_t)e->kv_ctx * kv_row(e, JLM_B_V) + 3) / 4 * 4, 0, err);
    return rc ? jlm_err_prefix(err, rc, "vulkan: the KV cache of block %u", l) : JLM_OK;
}

static int seq_caches(jlm_evk *v, jlm_engine *e, const jlm_exd *k, jlm_err *err)
{
    int rc = JLM_OK;
    for (uint32_t t = 0; !rc && t < k->b.n; t += jlm_exd_group(k, t))
        rc = seq_cache(v, e, jlm_exd_host(k, t), k->b.l, err);
    return rc;
}

/* The activation buffers for n rows, the scores, and layer l's caches. */
static int buffers(jlm_evk *v, jlm_engine *e, const jlm_exd *k, jlm_err *err)
{
    jlm_evk_blk *s = &v->blk;
    uint32_t n = k->b.n;
    int rc = JLM_OK;
    if (n > s->ab_rows) {
        for (int b = 0; b < JLM_B_COUNT && !rc; b++)
            rc = grow(v, &s->ab[b], (uint64_t)n * width(e, b) * 4, b == JLM_B_X, err);
        if (!rc)
            s->ab_rows = n;
    }
    uint64_t kmax = 0;
    for (int b = 0; b < JLM_B_COUNT; b++)
        kmax = width(e, b) > kmax ? width(e, b) : kmax;
    if (!rc)
        rc = grow(v, &s->aq, (uint64_t)s->ab_rows * kmax, 0, err);
    if (!rc)
        rc = grow(v, &s->ad, (uint64_t)s->ab_rows * kmax / 8, 0, err);
    if (!rc)
        rc = grow(v, &s->as, (uint64_t)s->ab_rows * kmax / 8, 0, err);
    if (!rc)
        rc = grow(v, &s->scores, scores_bytes(v, e, s->ab_rows), 0, err);
    if (!rc)
        rc = seq_caches(v, e, k, err);
    if (!rc && e->c->kv_lora_rank)
        rc = grow(v, &s->mla, jlm_evk_mla_bytes(v, e, (uint32_t)s->ab_rows), 0, err);
    return rc;
}

static void seq_drop(jlm_evk *v, jlm_exd_seqc *c)
{
    jlm_vk_buf **kc = c->kc, **vc = c->vc;
    for (uint32_t l = 0; l < v->blk.n_layer; l++) {
        jlm_vk_buf_free(v->vk, kc[l]);
        jlm_vk_buf_free(v->vk, vc[l]);
    }
    if (v->blk.kc == c->kc)
        v->blk.kc = v->blk.vc = NULL;
    jlm_exd_seq_forget(v->blk.seqs, c);
}

static int kvx_sync(void *be, jlm_err *err) { return jlm_evk_rec_end(be, err); }
static void kvx_drop(void *be, jlm_exd_seqc *c) { seq_drop(be, c); }
static int kvx_cache(void *be, jlm_engine *e, const void *host, uint32_t l, jlm_err *err)
{
    return seq_cache(be, e, host, l, err);
}

static int kvx_stage(void *be, uint64_t bytes, uint8_t **p, jlm_err *err)
{
    jlm_evk *v = be;
    int rc = grow(v, &v->blk.stage, bytes, 1, err);
    *p = rc ? NULL : jlm_vk_buf_map(v->blk.stage);
    return rc;
}

static int kvx_copy(void *be, uint32_t l, uint64_t kb, uint64_t vb, int up, jlm_err *err)
{
    jlm_evk *v = be;
    jlm_evk_blk *s = &v->blk;
    jlm_vk_view hk = {s->stage, 0, kb}, hv = {s->stage, kb, vb}, ck = {s->kc[l], 0, kb}, cv = {s->vc[l], 0, vb};
    int rc = jlm_vk_rec_begin(v->vk, err);
    if (!rc)
        rc = jlm_vk_copy(v->vk, up ? ck : hk, up ? hk : ck, kb, err);
    if (!rc && vb)
        rc = jlm_vk_copy(v->vk, up ? cv : hv, up ? hv : cv, vb, err);
    int rc2 = jlm_evk_rec_end(v, err);
    return rc ? rc : rc2;
}

static const jlm_exd_kvx VK_KVX = {kvx_sync, kvx_drop, kvx_cache, kvx_stage, kvx_copy};

int jlm_evk_kv_xfer(jlm_dev *d, jlm_engine *e, void *kc, void *vc, uint32_t n, int up, jlm_err *err)
{
    jlm_evk *v = (jlm_evk *)d;
    return jlm_exd_kv_xfer(&VK_KVX, v, v->blk.seqs, v->blk.side, &v->st, e, kc, vc, n, up, err);
}

void jlm_evk_blk_free(jlm_evk *v)
{
    jlm_evk_blk *s = &v->blk;
    for (int b = 0; b < JLM_B_COUNT; b++)
        jlm_vk_buf_free(v->vk, s->ab[b]);
    jlm_vk_buf_free(v->vk, s->scores);
    jlm_vk_buf_free(v->vk, s->logits);
    jlm_vk_buf_free(v->vk, s->cs);
    jlm_vk_buf_free(v->vk, s->aq);
    jlm_vk_buf_free(v->vk, s->ad);
    jlm_vk_buf_free(v->vk, s->as);
    jlm_vk_buf_free(v->vk, s->mla);
    jlm_vk_buf_free(v->vk, s->stage);
    while (s->seqs && s->seqs->n)
        seq_drop(v, &s->seqs->c[0]);
    free(s->seqs ? s->seqs->c : NULL);
    free(s->seqs);
    free(s->side);
    memset(s, 0, sizeof *s);
    jlm_evk_moe_free(v);
}

/* Each row's RoPE cos/sin, a table for each of rope_sets' parameters
 * (op_heads runs only layers with one of them), into the cs buffer, with the
 * rows (no recording open). */
static int cos_sin(jlm_evk *v, jlm_engine *e, const jlm_exd *k)
{
    jlm_k_rope sets[2];
    uint32_t ns = rope_sets(e, sets);
    if ((e->c->flags & JLM_F_NO_POS_ENC) || !sets[0].n_rot)
        return JLM_OK;
    uint64_t per = (uint64_t)sets[0].n_rot * 4 * ns;
    int rc = grow(v, &v->blk.cs, k->b.n * per, 1, k->err);
    for (uint32_t t = 0; !rc && t < k->b.n * ns; t++)
        jlm_k_rope_cos_sin(&sets[t % ns], jlm_exd_pos(k, t / ns),
                           (float *)((uint8_t *)jlm_vk_buf_map(v->blk.cs) + t * (per / ns)));
    if (!rc)
        v->st.act_up += k->b.n * per;   /* the positions' cos/sin: parameters, counted with the activations */
    return rc;
}

/* ---------------------------------------------------------------- entries */
int jlm_evk_x_sync(jlm_dev *d, jlm_err *err)
{
    jlm_evk *v = (jlm_evk *)d;
    jlm_evk_blk *s = &v->blk;
    if (!s->x_host)
        return JLM_OK;
    int rc = jlm_evk_rec_end(v, err);
    uint64_t bytes = (uint64_t)s->x_rows * s->x_E * 4;
    if (!rc) {
        memcpy(s->x_host, jlm_vk_buf_map(s->ab[JLM_B_X]), bytes);
        v->st.act_down += bytes;
    }
    s->x_host = NULL;
    return rc;
}

void jlm_evk_x_drop(jlm_dev *d)
{
    jlm_evk *v = (jlm_evk *)d;
    jlm_evk_rec_end(v, NULL);
    v->blk.x_host = NULL;
}

int jlm_evk_block(jlm_dev *d, jlm_engine *e, const jlm_prog *p, uint32_t l, const uint8_t *page, float *xs,
                  uint32_t n, void *kc, uint32_t pos0, jlm_err *err)
{
    jlm_evk *v = (jlm_evk *)d;
    jlm_evk_blk *s = &v->blk;
    const jlm_config *c = e->c;
    uint64_t al = jlm_vk_offset_align(v->vk);
    for (int b = 0; b < JLM_B_COUNT; b++)
        if ((width(e, b) * 4) % al ||
            ((b == JLM_B_K || b == JLM_B_V) && kv_type(e, b) != KV_Q8_0 && kv_row(e, b) % al))
            return UNSUP;   /* rows (and F32/F16 cache rows) at aligned offsets; Q8_0's windows are aligned down */
    jlm_exd k;
    int rc = jlm_exd_plan(&k, &VK_OPS, v, e, p, l, page, n, kc, pos0, &s->side, "vulkan", err);
    if (rc)
        return rc;
    rc = buffers(v, e, &k, err);
    if (!rc && (s->x_host != xs || s->x_rows != n)) {   /* the rows go up */
        if (s->x_host)
            rc = jlm_evk_x_sync(d, err);
        if (!rc)
            rc = jlm_evk_rec_end(v, err);
        if (!rc)
            rc = cos_sin(v, e, &k);
        if (!rc && jlm_exd_group(&k, 0) < n)   /* several sequences: every row's logits, grown before recording */
            rc = grow(v, &s->logits, (uint64_t)n * c->n_vocab * 4, 1, err);
        if (!rc) {
            memcpy(jlm_vk_buf_map(s->ab[JLM_B_X]), xs, (uint64_t)n * c->n_embd * 4);
            v->st.act_up += (uint64_t)n * c->n_embd * 4;
            s->x_host = xs;
            s->x_rows = n;
            s->x_E = c->n_embd;
        }
    }
    if (!rc)
        rc = jlm_vk_rec_begin(v->vk, err);
    k.dry = 0;
    if (!rc)
        rc = jlm_exd_run(&k);
    if (rc) {
        jlm_evk_rec_end(v, NULL);
        s->x_host = NULL;
        return jlm_err_prefix(err, rc == UNSUP ? JLM_EIO : rc, "vulkan: block %u", l);
    }
    return JLM_OK;
}

int jlm_evk_output(jlm_dev *d, const float *norm, float eps, const jlm_k_mat *m, const float *x, uint32_t n,
                   uint32_t E, float *logits, jlm_err *err)
{
    jlm_evk *v = (jlm_evk *)d;
    jlm_evk_blk *s = &v->blk;
    jlm_vk_view w = {0};
    uint64_t bytes = (uint64_t)n * m->rows * 4, r0;
    if (n > MAX_ROWS || !jlm_exd_held(s->x_host, s->x_rows, s->x_E, s->ab_rows, x, n, E, &r0) || m->k != E ||
        matmul_rows(v, m, n, (jlm_vk_view){0}, (jlm_vk_view){0}, 0, 1, NULL))
        return UNSUP;
    if (vec(v, norm, E, &w))
        return UNSUP;
    int rc = grow(v, &s->logits, bytes, 1, err);
    if (!rc)
        rc = jlm_vk_rec_begin(v->vk, err);
    jlm_dev_prof_op(d, JLM_DEVP_NORM);
    if (!rc)
        rc = jlm_vk_rmsnorm_rows(v->vk, (jlm_vk_view){s->ab[JLM_B_H], 0, (uint64_t)n * E * 4},
                                 (jlm_vk_view){s->ab[JLM_B_X], r0 * E * 4, (uint64_t)n * E * 4}, w, E, 1, n, E, eps,
                                 err);
    jlm_dev_prof_op(d, JLM_DEVP_MATMUL);
    if (!rc)
        rc = matmul_rows(v, m, n, (jlm_vk_view){s->ab[JLM_B_H], 0, (uint64_t)n * E * 4},
                         (jlm_vk_view){s->logits, 0, bytes}, 0, 0, err);
    int rc2 = jlm_evk_rec_end(v, err);
    if (rc || rc2)
        return rc ? rc : rc2;
    memcpy(logits, jlm_vk_buf_map(s->logits), bytes);
    v->st.act_down += bytes;
    return JLM_OK;
}
