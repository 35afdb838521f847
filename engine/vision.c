/* vision.c - the SigLIP-style tower (its block a program, engine/arch/clip.c;
 * its pages through the streamer from the pager's vision array), the
 * projectors (a table: preprocessing, tokens, projection), and an image
 * prompt fed to the text engine (decoding is image.c). See vision.h for the
 * contract and docs/vision.md for the numerics chosen. */
#include "engine/vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec_int.h"   /* the streamer */
#include "engine/pool.h"
#include "engine/prog.h"
#include "kernels/cpu/kernels.h"

/* ================================================================ the tower */
typedef struct vproj vproj;

struct jlm_vtower {
    jlm_engine       *e;
    const jlm_model  *m;
    const jlm_vision *v;
    const vproj      *proj;
    jlm_pool         *pool;       /* the engine's */
    const uint8_t    *dense;
    const jlm_k_cpu  *k;
    jlm_prog          prog;       /* the block's program (engine/arch/clip.c) */
    uint32_t side, n_patch, n_tok, n_out, E, F, hd;
    float *patch_w;            /* (E, 3, P, P) rounded to fp16 as ggml's im2col does */
    const float *patch_b, *pos, *pre_w, *pre_b, *post_w, *post_b, *mm_norm;
    float *mm_proj;            /* (E in, n_out) */
    int    mm_proj_f16;        /* round the projector input to fp16 */
    float *x, *h, *q, *kk, *vv, *att, *o, *f;   /* scratch */
    float *kt;                 /* (E, n_patch) the keys transposed: a head's scores vectorize */
    float *scores;             /* (pool threads, n_patch) */
    void  *xq_buf;
    jlm_act_q8 *xq;            /* (n_patch,) */
};

/* A projector: its tokens, its begin/end markers in the text vocabulary, its
 * preprocessing, the tensors it needs, and its projection. */
struct vproj {
    uint16_t    code;
    const char *name, *boi, *eoi;   /* begin/end-of-image token text */
    int       (*preprocess)(const jlm_vision *v, const jlm_image *img, uint8_t *u8, jlm_err *err);
    uint32_t  (*n_tokens)(const jlm_vision *v);
    int       (*open)(jlm_vtower *vt, jlm_err *err);
    void      (*project)(jlm_vtower *vt, float *out);
};

static uint32_t gemma3_tokens(const jlm_vision *v)
{
    uint32_t s = v->image_size / v->patch_size / v->scale;
    return s * s;
}
static int gemma3_open(jlm_vtower *vt, jlm_err *err);
static void gemma3_project(jlm_vtower *vt, float *out);

static const vproj projectors[] = {
    {JLM_PROJ_GEMMA3, "gemma3", "<start_of_image>", "<end_of_image>", jlm_image_fit_pad, gemma3_tokens, gemma3_open,
     gemma3_project},
};

static const vproj *find_proj(uint16_t code)
{
    for (size_t i = 0; i < sizeof projectors / sizeof projectors[0]; i++)
        if (projectors[i].code == code)
            return &projectors[i];
    return NULL;
}

int jlm_vision_preprocess(const jlm_vision *v, const jlm_image *img, uint8_t *u8, float *f32, jlm_err *err)
{
    const vproj *p = find_proj(v->projector);
    if (!p)
        return jlm_errf(err, JLM_EUNSUPPORTED, "vision projector %u has no preprocessing in this engine", v->projector);
    size_t n = (size_t)v->image_size * v->image_size * 3;
    uint8_t *buf = u8 ? u8 : malloc(n);
    if (!buf)
        return jlm_errf(err, JLM_ENOMEM, "out of memory preprocessing an image");
    int rc = p->preprocess(v, img, buf, err);
    if (!rc && f32)
        jlm_image_normalise(v, buf, f32);
    if (buf != u8)
        free(buf);
    return rc;
}

/* ---------------------------------------------------------------- tensors, checked at open */
static int need(const jlm_vtower *vt, uint16_t role, int32_t block, uint64_t k, uint64_t rows, int vec,
                const jlm_tensor **out, jlm_err *err)
{
    const jlm_tensor *t = jlm_fmt_find(vt->m, role, block, -1);
    const char *rn = jlm_fmt_role_name(role);
    if (!t)
        return jlm_errf(err, JLM_EFORMAT, "%s: the vision tower has no %s tensor%s", vt->m->path, rn,
                        block >= 0 ? " in a block" : "");
    if (jlm_tensor_k(t) != k || jlm_tensor_rows(t) != rows || jlm_tensor_sheets(t) != 1 ||
        (vec && t->type != JLM_T_F32))
        return jlm_errf(err, JLM_EFORMAT, "%s: vision tensor '%s' is %llux%llu %s, expected %llux%llu%s", vt->m->path,
                        t->name.s, (unsigned long long)jlm_tensor_k(t), (unsigned long long)jlm_tensor_rows(t),
                        jlm_fmt_type_traits(t->type)->name, (unsigned long long)k, (unsigned long long)rows,
                        vec ? " F32" : "");
    *out = t;
    return JLM_OK;
}

static const float *dense_f32(const jlm_vtower *vt, const jlm_tensor *t)
{
    return (const float *)(vt->dense + (t->qs_off - vt->m->hdr.dense_off));
}

/* A float tensor of any stored float type (F32/F16/BF16) as n owned floats. */
static float *dense_floats(const jlm_vtower *vt, const jlm_tensor *t, uint64_t n, jlm_err *err)
{
    const jlm_type_traits *tr = jlm_fmt_type_traits(t->type);
    if (!tr->is_float)
        return jlm_errf(err, JLM_EFORMAT, "%s: vision tensor '%s' must be a float type", vt->m->path, t->name.s), NULL;
    float *o = malloc(n * sizeof *o);
    if (!o)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", vt->m->path), NULL;
    const uint8_t *p = vt->dense + (t->qs_off - vt->m->hdr.dense_off);
    for (uint64_t i = 0; i < n; i++) {
        uint16_t hv;
        if (t->type == JLM_T_F32) { memcpy(&o[i], p + i * 4, 4); continue; }
        memcpy(&hv, p + i * 2, 2);
        o[i] = t->type == JLM_T_F16 ? jlm_k_fp16_to_f32(hv) : jlm_k_bf16_to_f32(hv);
    }
    return o;
}

static float fp16_round(float x) { return jlm_k_fp16_to_f32(jlm_k_f32_to_fp16(x)); }

static int open_embeddings(jlm_vtower *vt, jlm_err *err)
{
    const jlm_vision *v = vt->v;
    uint32_t P = v->patch_size, E = vt->E;
    const jlm_tensor *pw, *pb, *pos, *t;
    int rc;
    pw = jlm_fmt_find(vt->m, JLM_R_V_PATCH_EMBD, -1, -1);
    if (!pw || pw->ndim != 4 || pw->dims[0] != P || pw->dims[1] != P || pw->dims[2] != 3 || pw->dims[3] != E)
        return jlm_errf(err, JLM_EFORMAT, "%s: the vision tower's patch embedding is missing or not %ux%ux3x%u",
                        vt->m->path, P, P, E);
    if ((rc = need(vt, JLM_R_V_PATCH_EMBD_B, -1, E, 1, 1, &pb, err)) ||
        (rc = need(vt, JLM_R_V_POS_EMBD, -1, E, vt->n_patch, 0, &pos, err)))
        return rc;
    if (!(vt->patch_w = dense_floats(vt, pw, (uint64_t)P * P * 3 * E, err)))
        return err ? err->code : JLM_EFORMAT;
    for (uint64_t i = 0; i < (uint64_t)P * P * 3 * E; i++)
        vt->patch_w[i] = fp16_round(vt->patch_w[i]);
    vt->patch_b = dense_f32(vt, pb);
    if (pos->type != JLM_T_F32)
        return jlm_errf(err, JLM_EFORMAT, "%s: vision position embedding must be F32", vt->m->path);
    vt->pos = dense_f32(vt, pos);
    /* optional norms: absent is fine, present must have the right shape */
    if (jlm_fmt_find(vt->m, JLM_R_V_PRE_LN, -1, -1)) {
        if ((rc = need(vt, JLM_R_V_PRE_LN, -1, E, 1, 1, &t, err)))
            return rc;
        vt->pre_w = dense_f32(vt, t);
        if ((rc = need(vt, JLM_R_V_PRE_LN_B, -1, E, 1, 1, &t, err)))
            return rc;
        vt->pre_b = dense_f32(vt, t);
    }
    if (jlm_fmt_find(vt->m, JLM_R_V_POST_LN, -1, -1)) {
        if ((rc = need(vt, JLM_R_V_POST_LN, -1, E, 1, 1, &t, err)))
            return rc;
        vt->post_w = dense_f32(vt, t);
        if ((rc = need(vt, JLM_R_V_POST_LN_B, -1, E, 1, 1, &t, err)))
            return rc;
        vt->post_b = dense_f32(vt, t);
    }
    return JLM_OK;
}

/* Every block's tensors present with the record's shapes. */
static int check_blocks(const jlm_vtower *vt, jlm_err *err)
{
    uint32_t E = vt->E, F = vt->F;
    static const uint16_t vecE[] = {JLM_R_V_LN1, JLM_R_V_LN1_B, JLM_R_V_LN2, JLM_R_V_LN2_B, JLM_R_V_ATTN_Q_B,
                                    JLM_R_V_ATTN_K_B, JLM_R_V_ATTN_V_B, JLM_R_V_ATTN_OUT_B, JLM_R_V_FFN_DOWN_B};
    const jlm_tensor *t;
    int rc = JLM_OK;
    for (uint32_t b = 0; b < vt->v->n_layer && !rc; b++) {
        for (size_t i = 0; i < sizeof vecE / sizeof vecE[0] && !rc; i++)
            rc = need(vt, vecE[i], (int32_t)b, E, 1, 1, &t, err);
        uint16_t sq[] = {JLM_R_V_ATTN_Q, JLM_R_V_ATTN_K, JLM_R_V_ATTN_V, JLM_R_V_ATTN_OUT};
        for (size_t i = 0; i < 4 && !rc; i++)
            rc = need(vt, sq[i], (int32_t)b, E, E, 0, &t, err);
        if (!rc) rc = need(vt, JLM_R_V_FFN_UP, (int32_t)b, E, F, 0, &t, err);
        if (!rc) rc = need(vt, JLM_R_V_FFN_UP_B, (int32_t)b, F, 1, 1, &t, err);
        if (!rc) rc = need(vt, JLM_R_V_FFN_DOWN, (int32_t)b, F, E, 0, &t, err);
        if (!rc && jlm_fmt_find(vt->m, JLM_R_V_FFN_GATE, (int32_t)b, -1))
            rc = jlm_errf(err, JLM_EUNSUPPORTED, "%s: gated vision FFN (ffn_gate) is not supported yet", vt->m->path);
    }
    if (!rc && vt->m->hdr.n_vis_blocks != vt->v->n_layer)
        rc = jlm_errf(err, JLM_EFORMAT, "%s: %u vision pages for %u tower blocks", vt->m->path, vt->m->hdr.n_vis_blocks,
                      vt->v->n_layer);
    return rc;
}

static int alloc_scratch(jlm_vtower *vt, jlm_err *err)
{
    size_t n = vt->n_patch, E = vt->E, F = vt->F, kmax = (E > F ? E : F);
    float **bufs[] = {&vt->x, &vt->h, &vt->q, &vt->kk, &vt->vv, &vt->att, &vt->o, &vt->kt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        *bufs[i] = malloc(n * E * sizeof(float));
    vt->f = malloc(n * F * sizeof(float));
    vt->scores = malloc((size_t)jlm_pool_n_threads(vt->pool) * n * sizeof(float));
    size_t qb = jlm_k_act_q8_bytes(kmax);
    vt->xq_buf = malloc(n * qb);
    vt->xq = calloc(n, sizeof *vt->xq);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!*bufs[i])
            return jlm_errf(err, JLM_ENOMEM, "%s: out of memory for the vision tower", vt->m->path);
    if (!vt->f || !vt->scores || !vt->xq_buf || !vt->xq)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory for the vision tower", vt->m->path);
    for (size_t t = 0; t < n; t++) {
        int rc = jlm_k_act_q8_init(&vt->xq[t], (uint8_t *)vt->xq_buf + t * qb, kmax, err);
        if (rc)
            return rc;
    }
    return JLM_OK;
}

int jlm_vtower_open(jlm_engine *e, jlm_vtower **out, jlm_err *err)
{
    const jlm_model *m = jlm_engine_model(e);
    if (!m->has_vision)
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: no vision tower in this container (convert with --mmproj)", m->path);
    const jlm_vision *v = &m->vision;
    const vproj *p = find_proj(v->projector);
    if (!p)
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: vision projector %u has no graph in this engine", m->path, v->projector);
    if (!v->n_layer || !v->n_head || !v->patch_size || !v->scale || v->n_embd % v->n_head || v->n_embd % 32 ||
        v->n_ffn % 32 || v->image_size % v->patch_size || (v->image_size / v->patch_size) % v->scale ||
        v->image_size > 4096 || v->patch_size > 64)
        return jlm_errf(err, JLM_EFORMAT, "%s: inconsistent vision record", m->path);
    jlm_vtower *vt = calloc(1, sizeof *vt);
    if (!vt)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", m->path);
    *vt = (jlm_vtower){.e = e, .m = m, .v = v, .proj = p, .pool = jlm_engine_pool(e), .dense = jlm_engine_dense(e),
                       .k = jlm_k_cpu_get(), .side = v->image_size / v->patch_size, .E = v->n_embd, .F = v->n_ffn,
                       .hd = v->n_embd / v->n_head, .n_out = jlm_engine_model(e)->config.n_embd};
    vt->n_patch = vt->side * vt->side;
    vt->n_tok = p->n_tokens(v);
    jlm_arch_clip(&vt->prog, (v->flags & JLM_VF_QUICK_GELU) != 0);
    int rc;
    if ((rc = open_embeddings(vt, err)) || (rc = check_blocks(vt, err)) || (rc = p->open(vt, err)) ||
        (rc = alloc_scratch(vt, err))) {
        jlm_vtower_close(vt);
        return rc;
    }
    *out = vt;
    return JLM_OK;
}

void jlm_vtower_close(jlm_vtower *vt)
{
    if (!vt)
        return;
    void *bufs[] = {vt->patch_w, vt->mm_proj, vt->x, vt->h, vt->q, vt->kk, vt->vv, vt->att, vt->o, vt->kt, vt->f,
                    vt->scores, vt->xq_buf, vt->xq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(vt);
}

uint32_t jlm_vtower_n_tokens(const jlm_vtower *vt) { return vt->n_tok; }
uint32_t jlm_vtower_n_embd(const jlm_vtower *vt) { return vt->n_out; }

/* ---------------------------------------------------------------- forward */
typedef struct vmm_job {
    jlm_vtower      *vt;
    const jlm_k_mat *m;
    const float     *x;
    float           *y;
} vmm_job;

static void vmm_slice(void *ctx, size_t b, size_t e, int tid)
{
    (void)tid;
    vmm_job *j = ctx;
    j->vt->k->matmul[j->m->type](j->m, j->vt->n_patch, j->x, j->vt->xq, j->y, b, e);
}

/* Y (n, rows) = X (n, k) W^T with the engine's kernels (int8 activations for
 * quantized weights, as the text graph), rows split across the pool: each
 * output is computed by one thread, so the result does not depend on it. */
static void vmatmul(jlm_vtower *vt, const jlm_tensor *t, const uint8_t *page, uint64_t page_off, const float *x,
                    float *y)
{
    jlm_k_mat m = {.type = t->type, .k = jlm_tensor_k(t), .rows = jlm_tensor_rows(t)};
    const jlm_type_traits *tr = jlm_fmt_type_traits(t->type);
    m.qs = page + (t->qs_off - page_off);
    m.d = tr->is_float ? NULL : page + (t->d_off - page_off);
    m.sc = tr->sc_kind ? page + (t->sc_off - page_off) : NULL;
    if (!tr->is_float)
        for (uint32_t i = 0; i < vt->n_patch; i++) {
            vt->xq[i].k = m.k;
            vt->k->quantize_act(x + (uint64_t)i * m.k, &vt->xq[i]);
        }
    vmm_job j = {vt, &m, x, y};
    jlm_pool_for(vt->pool, m.rows, m.rows >= 64 ? 16 : m.rows, vmm_slice, &j);
}

static void add_rows(float *y, const float *b, uint32_t n, uint32_t w)
{
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < w; i++)
            y[(size_t)t * w + i] += b[i];
}

/* ggml's conv_2d: im2col in fp16, f32 accumulation; then + position. */
static void patch_embed(jlm_vtower *vt, const float *img)
{
    uint32_t P = vt->v->patch_size, S = vt->v->image_size, E = vt->E;
    float col[3 * 64 * 64];
    for (uint32_t p = 0; p < vt->n_patch; p++) {
        uint32_t px = p % vt->side, py = p / vt->side, n = 0;
        for (uint32_t c = 0; c < 3; c++)
            for (uint32_t ky = 0; ky < P; ky++)
                for (uint32_t kx = 0; kx < P; kx++)
                    col[n++] = fp16_round(img[((size_t)(py * P + ky) * S + px * P + kx) * 3 + c]);
        for (uint32_t o = 0; o < E; o++) {
            const float *w = vt->patch_w + (size_t)o * n;
            float s = 0;
            for (uint32_t i = 0; i < n; i++)
                s += col[i] * w[i];
            vt->x[(size_t)p * E + o] = s + vt->patch_b[o] + vt->pos[(size_t)p * E + o];
        }
    }
}

static void layernorm_rows(jlm_vtower *vt, float *out, const float *x, const float *w, const float *b)
{
    for (uint32_t t = 0; t < vt->n_patch; t++)
        jlm_k_layernorm(out + (size_t)t * vt->E, x + (size_t)t * vt->E, w, b, vt->E, vt->v->eps);
}

static const jlm_tensor *BT(const jlm_vtower *vt, uint16_t role, uint32_t b)
{
    return jlm_fmt_find(vt->m, role, (int32_t)b, -1);
}

static const float *BV(const jlm_vtower *vt, uint16_t role, uint32_t b) { return dense_f32(vt, BT(vt, role, b)); }

/* softmax(s * scale) V for one head, exactly jlm_k_attn_head's arithmetic
 * (no mask, no softcap, no sink): s holds the raw scores, v strides E. */
static void softmax_v(float *s, uint32_t n, float scale, const float *v, uint32_t E, uint32_t hd, float *out)
{
    float max = -INFINITY;
    for (uint32_t j = 0; j < n; j++) {
        s[j] = s[j] * scale + 0.0f;
        max = fmaxf(max, s[j]);
    }
    for (uint32_t i = 0; i < hd; i++)
        out[i] = 0.0f;
    double sum = 0.0;
    for (uint32_t j = 0; j < n; j++) {
        s[j] = expf(s[j] - max);
        sum += (double)s[j];
    }
    const float inv = (float)(1.0 / sum);
    for (uint32_t j = 0; j < n; j++) {
        float pj = s[j] * inv;
        if (pj == 0.0f)
            continue;
        for (uint32_t i = 0; i < hd; i++)
            out[i] += pj * v[(size_t)j * E + i];
    }
}

/* Full (unmasked) multi-head attention of patches [t0, t1) over every patch.
 * The scores run over keys in the inner loop (kt), so they vectorize; each
 * score still sums q[i]*k[i] in i order from 0, as the scalar kernel does. */
static void attn_slice(void *ctx, size_t t0, size_t t1, int tid)
{
    jlm_vtower *vt = ctx;
    uint32_t E = vt->E, n = vt->n_patch, hd = vt->hd;
    float *s = vt->scores + (size_t)tid * n, scale = 1.0f / sqrtf((float)hd);
    for (size_t t = t0; t < t1; t++)
        for (uint32_t h = 0; h < vt->v->n_head; h++) {
            const float *q = vt->q + t * E + h * hd;
            for (uint32_t j = 0; j < n; j++)
                s[j] = 0.0f;
            for (uint32_t i = 0; i < hd; i++) {
                const float qi = q[i], *kr = vt->kt + (size_t)(h * hd + i) * n;
                for (uint32_t j = 0; j < n; j++)
                    s[j] += qi * kr[j];
            }
            softmax_v(s, n, scale, vt->vv + h * hd, E, hd, vt->att + t * E + h * hd);
        }
}

static void self_attention(jlm_vtower *vt)
{
    for (uint32_t j = 0; j < vt->n_patch; j++)
        for (uint32_t c = 0; c < vt->E; c++)
            vt->kt[(size_t)c * vt->n_patch + j] = vt->kk[(size_t)j * vt->E + c];
    jlm_pool_for(vt->pool, vt->n_patch, 8, attn_slice, vt);
}

/* The vision tower's executor: buffer b (jlm_actbuf) of the patches and its
 * row width. self_attention reads q, kk, vv and writes att (the SELF_ATTN
 * op's operands). */
static float *vbuf(jlm_vtower *vt, int b, uint32_t *width)
{
    float *const bufs[JLM_B_COUNT] = {[JLM_B_X] = vt->x, [JLM_B_H] = vt->h, [JLM_B_Q] = vt->q, [JLM_B_K] = vt->kk,
                                      [JLM_B_V] = vt->vv, [JLM_B_ATT] = vt->att, [JLM_B_O] = vt->o, [JLM_B_G] = vt->f};
    *width = b == JLM_B_G ? vt->F : vt->E;
    return b < JLM_B_COUNT ? bufs[b] : NULL;
}

/* Block b's program (jlm_arch_clip) over every patch, with the tower's
 * kernels: the same operations in the same order as the block written out. */
static void block_forward(jlm_vtower *vt, uint32_t b, const uint8_t *page, uint64_t page_off)
{
    uint32_t n = vt->n_patch, wd, ws;
    for (uint32_t i = 0; i < vt->prog.n; i++) {
        const jlm_op *op = &vt->prog.op[i];
        float *dst = vbuf(vt, op->dst, &wd), *src = vbuf(vt, op->src, &ws);
        switch (op->kind) {
        case JLM_OP_LAYERNORM:
            layernorm_rows(vt, dst, src, BV(vt, op->w[0], b), BV(vt, op->w[1], b));
            break;
        case JLM_OP_MATMUL:
            vmatmul(vt, BT(vt, op->w[0], b), page, page_off, src, dst);
            if (op->w[1])
                add_rows(dst, BV(vt, op->w[1], b), n, wd);
            break;
        case JLM_OP_SELF_ATTN:
            self_attention(vt);
            break;
        case JLM_OP_RESIDUAL:
            jlm_k_add(dst, dst, src, (uint64_t)n * wd);
            break;
        case JLM_OP_ACT:
            if (op->act == JLM_ACT_GELU_QUICK)
                jlm_k_gelu_quick(dst, dst, (uint64_t)n * wd);
            else
                jlm_k_gelu_fp16(dst, dst, (uint64_t)n * wd);   /* ggml CPU's fp16 GELU table */
            break;
        default:
            break;   /* jlm_arch_clip writes no other op */
        }
    }
}

int jlm_vtower_encode(jlm_vtower *vt, const float *f32, float *out, jlm_err *err)
{
    const jlm_header *hd = &vt->m->hdr;
    patch_embed(vt, f32);
    if (vt->pre_w)
        layernorm_rows(vt, vt->x, vt->x, vt->pre_w, vt->pre_b);
    for (uint32_t b = 0; b < vt->v->n_layer; b++) {
        const uint8_t *page;
        int rc = jlm_stream_page(vt->e, JLM_PAGER_VISION, b, &page, err);
        if (rc)
            return jlm_err_prefix(err, rc, "%s: vision block %u", vt->m->path, b);
        block_forward(vt, b, page, hd->vis_data_off + (uint64_t)b * hd->vis_page_size);
        jlm_stream_page_done(vt->e, JLM_PAGER_VISION, b);
    }
    if (vt->post_w)
        layernorm_rows(vt, vt->x, vt->x, vt->post_w, vt->post_b);
    vt->proj->project(vt, out);
    return JLM_OK;
}

/* ---------------------------------------------------------------- gemma3 projector */
static int gemma3_open(jlm_vtower *vt, jlm_err *err)
{
    const jlm_tensor *nw, *pj;
    int rc = need(vt, JLM_R_MM_SOFT_EMB_NORM, -1, vt->E, 1, 1, &nw, err);
    if (rc || (rc = need(vt, JLM_R_MM_INPUT_PROJ, -1, vt->n_out, vt->E, 0, &pj, err)))   /* ne [out, in] */
        return rc;
    vt->mm_norm = dense_f32(vt, nw);
    vt->mm_proj_f16 = pj->type == JLM_T_F16;
    if (!(vt->mm_proj = dense_floats(vt, pj, (uint64_t)vt->E * vt->n_out, err)))
        return err ? err->code : JLM_EFORMAT;
    return JLM_OK;
}

/* Average-pool the patch grid by Scale, RMS-norm times soft_emb_norm, then
 * out = x @ W (W numpy (in, out), F16: x rounded to fp16 first). */
static void gemma3_project(jlm_vtower *vt, float *out)
{
    uint32_t E = vt->E, s = vt->v->scale, os = vt->side / s, N = vt->n_out;
    for (uint32_t t = 0; t < vt->n_tok; t++) {
        uint32_t tx = t % os, ty = t / os;
        float *y = vt->h + (size_t)t * E;
        for (uint32_t i = 0; i < E; i++) {
            float sum = 0;
            for (uint32_t dy = 0; dy < s; dy++)
                for (uint32_t dx = 0; dx < s; dx++)
                    sum += vt->x[((size_t)(ty * s + dy) * vt->side + tx * s + dx) * E + i];
            y[i] = sum / (float)(s * s);
        }
        jlm_k_rmsnorm(y, y, vt->mm_norm, E, vt->v->eps);
        if (vt->mm_proj_f16)
            for (uint32_t i = 0; i < E; i++)
                y[i] = fp16_round(y[i]);
        float *o = out + (size_t)t * N;
        memset(o, 0, N * sizeof *o);
        for (uint32_t i = 0; i < E; i++) {
            const float *w = vt->mm_proj + (size_t)i * N;
            for (uint32_t j = 0; j < N; j++)
                o[j] += y[i] * w[j];
        }
    }
}

/* ================================================================ what an image prompt needs */
void jlm_vtower_markers(const jlm_vtower *vt, const char **boi, const char **eoi, const char **name)
{
    *boi = vt->proj->boi;
    *eoi = vt->proj->eoi;
    *name = vt->proj->name;
}

int jlm_vtower_encode_image(jlm_vtower *vt, const jlm_image *img, float *out, jlm_err *err)
{
    size_t S = vt->v->image_size;
    float *pix = malloc(S * S * 3 * sizeof *pix);
    if (!pix)
        return jlm_errf(err, JLM_ENOMEM, "out of memory for an image");
    int rc = jlm_vision_preprocess(vt->v, img, NULL, pix, err);
    if (!rc)
        rc = jlm_vtower_encode(vt, pix, out, err);
    free(pix);
    return rc;
}
