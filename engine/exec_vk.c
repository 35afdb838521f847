/* exec_vk.c - whole blocks on a Vulkan device: a block program's ops
 * (engine/prog.h) recorded into the device's open command buffer, so the
 * blocks of a token (and the output matrix, when it is there too) make one
 * round trip (docs/vulkan.md, "Whole blocks on the device").
 *
 * The residual rows cross to the device at the first device block of a
 * forward and back only at a split point (jlm_evk_x_sync) or not at all when
 * the logits are computed here (jlm_evk_output). The engine's own sequence
 * keeps its KV cache of these blocks here (F32 or F16 as the engine's
 * --kv, a buffer per layer, rows of kv_dim; F16 rounded as the CPU's cache
 * rounds); any other sequence (jlm_engine_seq: serve, batches) and what
 * the shaders lack (Q8_0 caches, sigmoid expert routing: the MOE op is
 * exec_vk_moe.c's; quantized weights without shaderFloat64) is
 * JLM_EUNSUPPORTED, decided per
 * model, layer and sequence before anything is recorded, so a block always
 * runs on the same side. Quantized weights read int8 rows quantized on the
 * device (jlm_vk_quantize, bit-identical to the CPU's). */
#include "engine/backend_vk_int.h"
#include "engine/exec_int.h"

#include <math.h>
#include <string.h>

/* One block being planned (dry: views only, nothing recorded) or recorded. */
typedef struct vkb {
    jlm_evk          *v;
    jlm_engine       *e;
    const jlm_config *c;
    jlm_ex_blk        b;
    void             *kc;
    uint32_t          pos0;
    int               dry, q_ready;
    jlm_err          *err;
} vkb;

#define UNSUP JLM_EUNSUPPORTED

/* bytes of one cached element: the device cache has the engine's type */
static uint64_t kv_es(const jlm_engine *e) { return e->kt == KV_F16 ? 2 : 4; }

static uint64_t width(const jlm_engine *e, int b)
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

/* floats [off, off + n) of activation buffer b */
static jlm_vk_view abv(const vkb *k, int b, uint64_t off, uint64_t n)
{
    return (jlm_vk_view){k->v->blk.ab[b], off * 4, n * 4};
}
static jlm_vk_view row(const vkb *k, int b, uint32_t t) { return abv(k, b, t * width(k->e, b), width(k->e, b)); }

static uint32_t pos_of(const vkb *k, uint32_t t) { return k->kc ? k->pos0 + t : k->e->bpos[t]; }

/* The device view of a dense vector (norm weights, biases); NULL p: none. */
static int vec(vkb *k, const float *p, uint64_t n, jlm_vk_view *out)
{
    *out = (jlm_vk_view){0};
    if (!p)
        return JLM_OK;
    jlm_dframe *f = jlm_dframes_frame_of(&k->v->dev.frames, p, n * 4, NULL);
    uint64_t off = f ? (uint64_t)((const uint8_t *)p - (const uint8_t *)f->host) : 0;
    if (!f || off % jlm_vk_offset_align(k->v->vk))
        return UNSUP;
    *out = (jlm_vk_view){f->buf, off, n * 4};
    return JLM_OK;
}

int jlm_evk_vec(jlm_evk *v, const float *p, uint64_t n, jlm_vk_view *out)
{
    vkb k = {.v = v};
    return vec(&k, p, n, out);
}

/* y (n rows) = x (n rows of m->k) times m, its planes in a device frame;
 * quantized types read x's int8 rows, quantized on the device (reuse: the
 * previous call's rows are x's). dry: only whether it can. */
static int matmul_rows(jlm_evk *v, const jlm_k_mat *m, uint32_t n, jlm_vk_view x, jlm_vk_view y, int reuse, int dry,
                       jlm_err *err)
{
    jlm_vk_mat vm;
    int fl = jlm_fmt_type_traits(m->type)->is_float;
    if ((!fl && (!jlm_vk_can_quantize(v->vk) || m->k % 32 || (m->k / 8) % jlm_vk_offset_align(v->vk))) ||
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

/* dst rows = src rows times m; reuse: the previous mm's src was this one. */
static int mm(vkb *k, const jlm_k_mat *m, int src, int dst, int reuse)
{
    uint32_t n = k->b.n;
    if (m->k != width(k->e, src) || m->rows != width(k->e, dst))
        return UNSUP;
    return matmul_rows(k->v, m, n, abv(k, src, 0, n * m->k), abv(k, dst, 0, n * m->rows), reuse, k->dry, k->err);
}

/* rows of b += bias (role r; none: nothing) */
static int bias(vkb *k, int b, uint16_t r)
{
    jlm_vk_view bv;
    int rc = vec(k, blk_vec(k->e, &k->b, r), width(k->e, b), &bv);
    for (uint32_t t = 0; !rc && bv.buf && !k->dry && t < k->b.n; t++)
        rc = jlm_vk_eltwise(k->v->vk, JLM_VK_ADD, row(k, b, t), row(k, b, t), bv, (uint32_t)width(k->e, b), k->err);
    return rc;
}

/* dst rows = rmsnorm(src rows) * w, rows of E floats (w: a view, or none) */
static int norm_rows(vkb *k, int dst, int src, jlm_vk_view w)
{
    int rc = JLM_OK;
    for (uint32_t t = 0; !rc && !k->dry && t < k->b.n; t++)
        rc = jlm_vk_rmsnorm(k->v->vk, row(k, dst, t), row(k, src, t), w, (uint32_t)width(k->e, dst), k->c->rms_eps,
                            k->err);
    return rc;
}

/* Field by field (the struct's padding is not part of it). */
static int same_rope(const jlm_k_rope *a, const jlm_k_rope *b)
{
    return a->n_rot == b->n_rot && a->neox == b->neox && a->freq_base == b->freq_base &&
           a->freq_scale == b->freq_scale && a->freq_factors == b->freq_factors && a->ext_factor == b->ext_factor &&
           a->attn_factor == b->attn_factor && a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow &&
           a->orig_ctx == b->orig_ctx;
}

/* The RoPE parameter sets whose cos/sin go up with the rows: layer 0's and
 * the first other layer's that differ (gemma3's sliding-window layers have
 * their own base); how many (1 or 2). */
static uint32_t rope_sets(const jlm_engine *e, jlm_k_rope set[2])
{
    jlm_ex_rope_params(e, 0, &set[0]);
    for (uint32_t l = 1; l < e->c->n_layer; l++) {
        jlm_ex_rope_params(e, l, &set[1]);
        if (!same_rope(&set[1], &set[0]))
            return 2;
    }
    return 1;
}

/* Each head of each row of b (q or k): its RMS norm (role r; wide: one norm
 * over the whole row, OLMoE) and RoPE at the row's position. */
static int heads(vkb *k, int b, uint32_t n_head, uint16_t r, int wide)
{
    jlm_engine *e = k->e;
    jlm_vk_view w;
    jlm_k_rope rp, sets[2];
    jlm_ex_rope_params(e, k->b.l, &rp);
    uint32_t ns = rope_sets(e, sets), si = 0;
    while (si < ns && !same_rope(&rp, &sets[si]))
        si++;
    int rope = !(k->c->flags & JLM_F_NO_POS_ENC), rc = vec(k, blk_vec(e, &k->b, r), wide ? width(e, b) : e->hd, &w);
    uint64_t al = jlm_vk_offset_align(k->v->vk);
    if (!rc && ((rope && (!rp.n_rot || rp.n_rot % 2 || rp.n_rot > e->hd || si == ns || (rp.n_rot * 4) % al)) ||
                (w.buf && (e->hd * 4) % al)))
        rc = UNSUP;   /* the layer's cos/sin must be one of the tables up with the rows */
    for (uint32_t t = 0; !rc && !k->dry && t < k->b.n; t++) {
        uint64_t base = t * width(e, b);
        if (wide && w.buf)
            rc = jlm_vk_rmsnorm(k->v->vk, row(k, b, t), row(k, b, t), w, (uint32_t)width(e, b), k->c->rms_eps, k->err);
        for (uint32_t h = 0; !rc && w.buf && !wide && h < n_head; h++)
            rc = jlm_vk_rmsnorm(k->v->vk, abv(k, b, base + h * e->hd, e->hd), abv(k, b, base + h * e->hd, e->hd), w,
                                e->hd, k->c->rms_eps, k->err);
        if (!rc && rope)
            rc = jlm_vk_rope_cs(k->v->vk, rp.n_rot, rp.neox, row(k, b, t), n_head, e->hd,
                                (jlm_vk_view){k->v->blk.cs, ((uint64_t)t * ns + si) * rp.n_rot * 4, rp.n_rot * 4ull},
                                k->err);
    }
    return rc;
}

/* Row t of b (K or V) into position p of the layer's cache c: copied (F32)
 * or rounded to halves as jlm_kv_put_row does (F16). */
static int kv_put(vkb *k, jlm_vk_buf *c, uint64_t p, int b, uint32_t t)
{
    uint64_t n = width(k->e, b), es = kv_es(k->e);
    jlm_vk_view dst = {c, p * n * es, n * es};
    return es == 4 ? jlm_vk_copy(k->v->vk, dst, row(k, b, t), n * 4, k->err)
                   : jlm_vk_to_f16(k->v->vk, dst, row(k, b, t), (uint32_t)n, k->err);
}

static int kv_store(vkb *k, const jlm_op *op)
{
    jlm_evk_blk *s = &k->v->blk;
    int rc = bias(k, JLM_B_K, op->w[0]);
    if (!rc)
        rc = bias(k, JLM_B_V, op->w[1]);
    if (!rc)
        rc = heads(k, JLM_B_K, k->c->n_kv_head, op->w[2], op->flags & JLM_OPF_QK_WIDE);
    for (uint32_t t = 0; !rc && !k->dry && t < k->b.n; t++) {
        uint64_t p = pos_of(k, t);
        rc = kv_put(k, s->kc[k->b.l], p, JLM_B_K, t);
        if (!rc)
            rc = kv_put(k, s->vc[k->b.l], p, JLM_B_V, t);
    }
    return rc;
}

static int attention(vkb *k, const jlm_op *op)
{
    jlm_engine *e = k->e;
    const jlm_config *c = k->c;
    jlm_evk_blk *s = &k->v->blk;
    uint64_t es = kv_es(e);
    jlm_k_attn ap = {.head_dim = e->hd, .head_dim_v = e->hd_v, .k_stride = e->kv_dim, .v_stride = e->kv_dim_v,
                     .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)e->hd),
                     .softcap = c->attn_softcap};
    int rc = JLM_OK;
    for (uint32_t t = 0; !rc && !k->dry && t < k->b.n; t++) {
        /* keys [lo, hi): a sliding window's (or a chunk's) first key is where the views start, so the
         * hidden keys are not read at all (the CPU masks them: exp(-inf) adds 0) */
        uint32_t pos = pos_of(k, t), hi = pos < e->bidir_end ? e->bidir_end : pos + 1;
        uint64_t lo = jlm_ex_first_key(c, k->b.l, pos), n_kv = hi - lo;
        jlm_vk_view kv = {s->kc[k->b.l], lo * e->kv_dim * es, n_kv * e->kv_dim * es},
                    vv = {s->vc[k->b.l], lo * e->kv_dim_v * es, n_kv * e->kv_dim_v * es},
                    sc = {s->scores, 0, (uint64_t)c->n_head * n_kv * 4};
        rc = (es == 2 ? jlm_vk_attention_f16 : jlm_vk_attention)(k->v->vk, &ap, c->n_head, c->n_kv_head,
                                                                 row(k, JLM_B_Q, t), kv, vv, n_kv,
                                                                 blk_vec(e, &k->b, op->w[0]), sc,
                                                                 row(k, JLM_B_ATT, t), k->err);
    }
    return rc;
}

static int run_op(vkb *k, const jlm_op *op)
{
    jlm_engine *e = k->e;
    const jlm_ex_blk *b = &k->b;
    jlm_vk_view w;
    int rc;
    switch (op->kind) {
    case JLM_OP_NORM: {
        const float *p = blk_vec(e, b, op->w[0]);
        rc = vec(k, p ? p : blk_vec(e, b, op->w[1]), k->c->n_embd, &w);
        return rc ? rc : norm_rows(k, op->dst, op->src, w);
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
    case JLM_OP_KV_STORE: return kv_store(k, op);
    case JLM_OP_KEYS_DONE: return JLM_OK;   /* every row's keys are stored before any attends: op by op */
    case JLM_OP_Q: {
        if (k->q_ready)
            return JLM_OK;
        jlm_k_mat wq = blk_mat(e, b, op->w[1]);
        rc = vec(k, blk_vec(e, b, op->w[0]), k->c->n_embd, &w);
        if (!rc)
            rc = norm_rows(k, JLM_B_H, JLM_B_X, w);
        return rc ? rc : mm(k, &wq, JLM_B_H, JLM_B_Q, 0);
    }
    case JLM_OP_Q_ROPE:
        rc = bias(k, JLM_B_Q, op->w[0]);
        return rc ? rc : heads(k, JLM_B_Q, k->c->n_head, op->w[1], op->flags & JLM_OPF_QK_WIDE);
    case JLM_OP_ATTENTION: return attention(k, op);
    case JLM_OP_MATMUL: {
        jlm_k_mat m = blk_mat(e, b, op->w[0]);
        rc = mm(k, &m, op->src, op->dst, 0);
        return rc ? rc : bias(k, op->dst, op->w[1]);
    }
    case JLM_OP_RESIDUAL: {
        uint64_t E = k->c->n_embd;
        if ((rc = bias(k, op->src, op->w[0])) || (rc = vec(k, blk_vec(e, b, op->w[1]), E, &w)))
            return rc;
        if (w.buf && (rc = norm_rows(k, op->src, op->src, w)))
            return rc;
        return k->dry ? JLM_OK
                      : jlm_vk_eltwise(k->v->vk, JLM_VK_ADD, abv(k, op->dst, 0, b->n * E), abv(k, op->dst, 0, b->n * E),
                                       abv(k, op->src, 0, b->n * E), (uint32_t)(b->n * E), k->err);
    }
    case JLM_OP_GATE_UP: {
        jlm_k_mat wg = blk_mat(e, b, op->w[0]), wu = blk_mat(e, b, op->w[1]);
        if (op->act != JLM_ACT_SWIGLU && op->act != JLM_ACT_SWIGLU_OAI && op->act != JLM_ACT_GELU_FP16)
            return UNSUP;
        if ((rc = mm(k, &wg, op->src, JLM_B_G, 0)) || (rc = mm(k, &wu, op->src, JLM_B_U, 1)) ||
            (rc = bias(k, JLM_B_G, op->w[2])) || (rc = bias(k, JLM_B_U, op->w[3])) || k->dry)
            return rc;
        uint64_t n = b->n * wg.rows;
        jlm_vk_view g = abv(k, JLM_B_G, 0, n), u = abv(k, JLM_B_U, 0, n);
        if (op->act == JLM_ACT_GELU_FP16)
            return jlm_vk_geglu_fp16(k->v->vk, g, g, u, (uint32_t)n, k->err);
        return op->act == JLM_ACT_SWIGLU ? jlm_vk_eltwise(k->v->vk, JLM_VK_SWIGLU, g, g, u, (uint32_t)n, k->err)
                                         : jlm_vk_swiglu_oai(k->v->vk, g, g, u, (uint32_t)n, 1.702f, 7.0f, k->err);
    }
    case JLM_OP_MOE: return jlm_evk_moe(k->v, e, b, op, k->dry, k->err);   /* exec_vk_moe.c */
    default: return UNSUP;   /* latent attention, the vision tower's ops */
    }
}

static int run_ops(vkb *k)
{
    int rc = JLM_OK;
    k->q_ready = 0;
    for (uint32_t i = 0; i < k->b.p->n && !rc; i++) {
        if (!k->dry)
            jlm_dev_prof_op(&k->v->dev, jlm_dev_op_class(k->b.p->op[i].kind));   /* --profile's op classes */
        rc = run_op(k, &k->b.p->op[i]);
    }
    return rc;
}

/* ---------------------------------------------------------------- buffers */
static int grow(jlm_evk *v, jlm_vk_buf **b, uint64_t bytes, int host, jlm_err *err)
{
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

/* The activation buffers for n rows, the scores, and layer l's cache. */
static int buffers(jlm_evk *v, jlm_engine *e, uint32_t l, uint32_t n, jlm_err *err)
{
    jlm_evk_blk *s = &v->blk;
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
        rc = grow(v, &s->scores, (uint64_t)e->c->n_head * e->kv_ctx * 4, 0, err);
    if (!rc && !s->kc) {
        s->kc = calloc(e->c->n_layer, sizeof *s->kc);
        s->vc = calloc(e->c->n_layer, sizeof *s->vc);
        s->n_layer = e->c->n_layer;
        if (!s->kc || !s->vc)
            rc = jlm_errf(err, JLM_ENOMEM, "vulkan: out of memory");
    }
    if (!rc)
        rc = grow(v, &s->kc[l], (uint64_t)e->kv_ctx * e->kv_dim * kv_es(e), 0, err);
    if (!rc)
        rc = grow(v, &s->vc[l], (uint64_t)e->kv_ctx * e->kv_dim_v * kv_es(e), 0, err);
    return rc;
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
    for (uint32_t l = 0; s->kc && l < s->n_layer; l++) {
        jlm_vk_buf_free(v->vk, s->kc[l]);
        jlm_vk_buf_free(v->vk, s->vc[l]);
    }
    free(s->kc);
    free(s->vc);
    free(s->side);
    memset(s, 0, sizeof *s);
    jlm_evk_moe_free(v);
}

/* Each row's RoPE cos/sin, a table for each of rope_sets' parameters (heads()
 * runs only layers with one of them), into the cs buffer, with the rows (no
 * recording open). */
static int cos_sin(jlm_evk *v, jlm_engine *e, const vkb *k)
{
    jlm_k_rope sets[2];
    uint32_t ns = rope_sets(e, sets);
    if ((e->c->flags & JLM_F_NO_POS_ENC) || !sets[0].n_rot)
        return JLM_OK;
    uint64_t per = (uint64_t)sets[0].n_rot * 4 * ns;
    int rc = grow(v, &v->blk.cs, k->b.n * per, 1, k->err);
    for (uint32_t t = 0; !rc && t < k->b.n * ns; t++)
        jlm_k_rope_cos_sin(&sets[t % ns], pos_of(k, t / ns),
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
    if ((e->kt != KV_F32 && e->kt != KV_F16) || e->vt != e->kt || e->qk_unit || (c->flags & JLM_F_NON_CAUSAL) ||
        !n)
        return UNSUP;
    for (uint32_t t = 0; t < n; t++)
        if ((kc ? kc : e->bkc[t]) != e->kc)
            return UNSUP;   /* a jlm_engine_seq's cache stays on the host */
    uint64_t al = jlm_vk_offset_align(v->vk);
    for (int b = 0; b < JLM_B_COUNT; b++)
        if ((width(e, b) * 4) % al || ((b == JLM_B_K || b == JLM_B_V) && (width(e, b) * kv_es(e)) % al))
            return UNSUP;   /* rows (and cache rows) at aligned offsets */
    vkb k = {.v = v, .e = e, .c = c, .kc = kc, .pos0 = pos0, .dry = 1, .err = err,
             .b = {.p = p, .l = l, .page = page, .page_off = e->m->hdr.data_off + (uint64_t)l * e->m->hdr.page_size,
                   .n = n}};
    if (!s->side && !(s->side = calloc(c->n_layer, 1)))
        return jlm_errf(err, JLM_ENOMEM, "vulkan: out of memory");
    /* the layer's cache holds positions on one side only: once decided, the plan must agree */
    int ok = run_ops(&k) == JLM_OK;
    if (s->side[l] == 0)
        s->side[l] = ok ? 1 : 2;
    if (s->side[l] == 2)
        return UNSUP;
    if (!ok)
        return jlm_errf(err, JLM_EIO, "vulkan: block %u can no longer run on the device (its KV cache is there)", l);
    int rc = buffers(v, e, l, n, err);
    if (!rc && (s->x_host != xs || s->x_rows != n)) {   /* the rows go up */
        if (s->x_host)
            rc = jlm_evk_x_sync(d, err);
        if (!rc)
            rc = jlm_evk_rec_end(v, err);
        if (!rc)
            rc = cos_sin(v, e, &k);
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
        rc = run_ops(&k);
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
    uint64_t bytes = (uint64_t)n * m->rows * 4;
    if (!s->x_host || E != s->x_E || n > s->ab_rows || x < s->x_host ||
        x + (uint64_t)n * E > s->x_host + (uint64_t)s->x_rows * E || m->k != E ||
        matmul_rows(v, m, n, (jlm_vk_view){0}, (jlm_vk_view){0}, 0, 1, NULL))
        return UNSUP;
    vkb k = {.v = v, .err = err};
    if (vec(&k, norm, E, &w))
        return UNSUP;
    uint64_t r0 = (uint64_t)(x - s->x_host) / E;
    int rc = grow(v, &s->logits, bytes, 1, err);
    if (!rc)
        rc = jlm_vk_rec_begin(v->vk, err);
    jlm_dev_prof_op(d, JLM_DEVP_NORM);
    for (uint32_t t = 0; !rc && t < n; t++)
        rc = jlm_vk_rmsnorm(v->vk, (jlm_vk_view){s->ab[JLM_B_H], (uint64_t)t * E * 4, E * 4ull},
                            (jlm_vk_view){s->ab[JLM_B_X], (r0 + t) * E * 4, E * 4ull}, w, E, eps, err);
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
