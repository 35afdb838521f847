/* gen.h - random packed matrices and activations for the CUDA checks (the
 * Criterion suite `cuda` and the self-contained build/jlm-cuda-check). Every
 * qs/sc word is random; d words hold sane scales (random f16 in
 * [2^-12, 2^-4) with a random sign, or e8m0 exponents near 1 for MXFP4), so
 * results stay finite. Header-only so the device check needs no Criterion. */
#ifndef JLM_TESTS_CUDA_GEN_H
#define JLM_TESTS_CUDA_GEN_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"

static inline uint64_t gen_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static inline float gen_unit(uint64_t *s)   /* [-1, 1) */
{
    return (float)((gen_next(s) >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

static inline uint32_t gen_scale16(uint64_t *s)
{
    float v = ldexpf(1.0f + 0.5f * (gen_unit(s) + 1.0f), -12 + (int)(gen_next(s) % 8));
    return jlm_k_f32_to_fp16((gen_next(s) & 1) ? -v : v);
}

typedef struct gen_mat {
    jlm_k_mat m;
    uint32_t *qs, *d, *sc;
    uint64_t qs_bytes, d_bytes, sc_bytes;
} gen_mat;

/* 0, or -1 when the shape is invalid or memory runs out. */
static inline int gen_mat_make(gen_mat *g, uint8_t type, uint64_t k, uint64_t rows, uint64_t *seed)
{
    memset(g, 0, sizeof *g);
    if (jlm_fmt_planes(type, k, rows, &g->qs_bytes, &g->d_bytes, &g->sc_bytes, NULL))
        return -1;
    g->qs = calloc(g->qs_bytes / 4 + 1, 4);
    g->d = calloc(g->d_bytes / 4 + 1, 4);
    g->sc = calloc(g->sc_bytes / 4 + 1, 4);
    if (!g->qs || !g->d || !g->sc)
        return -1;
    const jlm_type_traits *t = jlm_fmt_type_traits(type);
    if (type == JLM_T_F32) {
        for (uint64_t i = 0; i < k * rows; i++)
            ((float *)g->qs)[i] = gen_unit(seed);
    } else if (t->is_float) {
        for (uint64_t i = 0; i < k * rows; i++) {
            float v = gen_unit(seed);
            uint32_t b;
            memcpy(&b, &v, 4);
            ((uint16_t *)g->qs)[i] = type == JLM_T_F16 ? jlm_k_f32_to_fp16(v) : (uint16_t)(b >> 16);
        }
    } else {
        for (uint64_t i = 0; i < g->qs_bytes / 4; i++)
            g->qs[i] = (uint32_t)gen_next(seed);
        for (uint64_t i = 0; i < g->sc_bytes / 4; i++)
            g->sc[i] = (uint32_t)gen_next(seed);
        for (uint64_t i = 0; i < g->d_bytes / 4; i++) {
            if (type == JLM_T_MXFP4)
                for (int b = 0; b < 4; b++)
                    g->d[i] |= (uint32_t)(118 + gen_next(seed) % 12) << (8 * b);
            else
                g->d[i] = gen_scale16(seed) | gen_scale16(seed) << 16;
        }
    }
    g->m = (jlm_k_mat){.type = type, .k = k, .rows = rows, .qs = g->qs,
                       .d = t->is_float ? NULL : g->d, .sc = t->sc_kind ? g->sc : NULL};
    return 0;
}

static inline void gen_mat_free(gen_mat *g)
{
    free(g->qs);
    free(g->d);
    free(g->sc);
}

/* n random floats in [-amp, amp). */
static inline void gen_floats(float *x, uint64_t n, float amp, uint64_t *seed)
{
    for (uint64_t i = 0; i < n; i++)
        x[i] = amp * gen_unit(seed);
}

/* A batch of nb sheets of one shape (deepseek2's per-head attn_k_b /
 * attn_v_b), back to back in each plane (q, d, s: ql, dl, sl bytes a sheet),
 * and n tokens of activations a sheet: token t of sheet h at t*tx + h*bx (tx
 * = nb*k + 32: gaps), floats and their int8 quantization laid out alike
 * (codes aq, scales ad at /32, sums as at /16); ref: each (sheet, token)'s
 * jlm_k_matvec_ref at t*ty + h*by (ty = nb*rows + 5), the gaps 0xff bytes;
 * m: sheet 0 over q, d, s. 0, or -1 when the shape is invalid or memory runs
 * out. */
typedef struct gen_batch {
    uint64_t  k, rows, nb, n, tx, ty, bx, by, ql, dl, sl;
    jlm_k_mat m;
    uint8_t  *q, *d, *s;
    float    *x, *ad, *ref;
    int8_t   *aq;
    int16_t  *as;
    void     *abuf;
} gen_batch;

static inline void gen_batch_free(gen_batch *b)
{
    void *mem[] = {b->q, b->d, b->s, b->x, b->ad, b->ref, b->aq, b->as, b->abuf};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        free(mem[i]);
}

static inline int gen_batch_make(gen_batch *b, uint8_t type, uint64_t k, uint64_t rows, uint32_t nb, uint32_t n,
                                 uint64_t *seed)
{
    memset(b, 0, sizeof *b);
    *b = (gen_batch){.k = k, .rows = rows, .nb = nb, .n = n, .tx = nb * k + 32, .ty = nb * rows + 5, .bx = k,
                     .by = rows};
    if (jlm_fmt_planes(type, k, rows, &b->ql, &b->dl, &b->sl, NULL) || b->ql % 4 || b->dl % 4 || b->sl % 4)
        return -1;
    int fl = jlm_fmt_type_traits(type)->is_float;
    jlm_act_q8 a;
    b->q = calloc(nb, b->ql + 4), b->d = calloc(nb, b->dl + 4), b->s = calloc(nb, b->sl + 4);
    b->x = calloc(n * b->tx, 4), b->ref = malloc(n * b->ty * 4), b->aq = calloc(n * b->tx, 1);
    b->ad = calloc(n * b->tx / 32 + 1, 4), b->as = calloc(n * b->tx / 16 + 1, 2);
    b->abuf = malloc(jlm_k_act_q8_bytes(k));
    if (!b->q || !b->d || !b->s || !b->x || !b->ref || !b->aq || !b->ad || !b->as || !b->abuf ||
        jlm_k_act_q8_init(&a, b->abuf, k, NULL))
        return -1;
    memset(b->ref, 0xff, n * b->ty * 4);
    for (uint32_t h = 0; h < nb; h++) {
        gen_mat g;
        if (gen_mat_make(&g, type, k, rows, seed))
            return -1;
        memcpy(b->q + h * b->ql, g.qs, b->ql), memcpy(b->d + h * b->dl, g.d, b->dl);
        memcpy(b->s + h * b->sl, g.sc, b->sl);
        for (uint32_t t = 0; t < n; t++) {
            uint64_t o = t * b->tx + h * b->bx;
            gen_floats(b->x + o, k, 2.0f, seed);
            jlm_k_quantize_act(b->x + o, &a);
            memcpy(b->aq + o, a.q, k), memcpy(b->ad + o / 32, a.d, k / 8), memcpy(b->as + o / 16, a.sum16, k / 8);
            jlm_k_matvec_ref(&g.m, b->x + o, fl ? NULL : &a, b->ref + t * b->ty + h * b->by, 0, rows);
        }
        if (h == 0) {
            b->m = g.m;
            b->m.qs = b->q;
            b->m.d = g.m.d ? (const void *)b->d : NULL;
            b->m.sc = g.m.sc ? (const void *)b->s : NULL;
        }
        gen_mat_free(&g);
    }
    return 0;
}

/* The 12 stored types. */
static const uint8_t GEN_TYPES[12] = {JLM_T_F32, JLM_T_F16, JLM_T_BF16, JLM_T_Q4_0, JLM_T_Q8_0,
                                      JLM_T_Q5_0, JLM_T_Q5_1, JLM_T_MXFP4, JLM_T_Q3_K, JLM_T_Q4_K,
                                      JLM_T_Q5_K, JLM_T_Q6_K};

#endif
