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

/* The 12 stored types. */
static const uint8_t GEN_TYPES[12] = {JLM_T_F32, JLM_T_F16, JLM_T_BF16, JLM_T_Q4_0, JLM_T_Q8_0,
                                      JLM_T_Q5_0, JLM_T_Q5_1, JLM_T_MXFP4, JLM_T_Q3_K, JLM_T_Q4_K,
                                      JLM_T_Q5_K, JLM_T_Q6_K};

#endif
