/* kernel_fixture.h - random packed planes and activations shared by the kernel
 * suites (tests/test_kernels.c: CPU variants; tests/test_vulkan.c: shaders).
 * Header-only (static) so each suite stays one file; needs Criterion. */
#ifndef JLM_KERNEL_FIXTURE_H
#define JLM_KERNEL_FIXTURE_H

#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

/* ---------------------------------------------------------------- random data */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static float rng_unit(uint64_t *s)   /* [-1, 1) */
{
    return (float)((rng_next(s) >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

/* A random f16 scale of magnitude in [2^-12, 2^-4), random sign if sign. */
static uint16_t rand_scale(uint64_t *s, int sign)
{
    float v = ldexpf(1.0f + 0.5f * (rng_unit(s) + 1.0f), -12 + (int)(rng_next(s) % 8));
    if (sign && (rng_next(s) & 1))
        v = -v;
    return jlm_k_f32_to_fp16(v);
}

typedef struct tmat {
    jlm_k_mat m;
    uint32_t *qs, *d, *sc;
} tmat;

/* Random packed planes: every code and field random, d slots sane, unused
 * d-word slots and the Q3_K nibbles' top bit zero (jlm-format.md 8). */
static void tmat_make(tmat *t, uint8_t type, uint64_t k, uint64_t rows, uint64_t *seed)
{
    const jlm_type_traits *tr = jlm_fmt_type_traits(type);
    uint64_t ql, dl, sl;
    cr_assert(jlm_fmt_planes(type, k, rows, &ql, &dl, &sl, NULL) == 0);
    t->qs = calloc(ql / 4 + 16, 4);
    t->d = calloc(dl / 4 + 16, 4);
    t->sc = calloc(sl / 4 + 16, 4);
    if (tr->is_float) {
        for (uint64_t i = 0; i < k * rows; i++) {
            float v = rng_unit(seed);
            if (type == JLM_T_F32)
                ((float *)t->qs)[i] = v;
            else if (type == JLM_T_F16)
                ((uint16_t *)t->qs)[i] = jlm_k_f32_to_fp16(v);
            else {
                uint32_t b;
                memcpy(&b, &v, 4);
                ((uint16_t *)t->qs)[i] = (uint16_t)(b >> 16);
            }
        }
    } else {
        for (uint64_t i = 0; i < ql / 4; i++)
            t->qs[i] = (uint32_t)rng_next(seed) & (type == JLM_T_Q3_K ? 0x77777777u : 0xffffffffu);
        uint64_t nsuper = k / ((uint64_t)tr->sub * tr->super_sub), S = tr->d_share;
        uint64_t drows = (rows + S - 1) / S;
        for (uint64_t sb = 0; sb < nsuper; sb++)
            for (uint64_t r = 0; r < rows; r++) {
                uint32_t *w = &t->d[sb * (S > 1 ? drows : rows) + (S > 1 ? r / S : r)];
                if (type == JLM_T_MXFP4)
                    *w |= (uint32_t)(110 + rng_next(seed) % 20) << (8 * (r % 4));
                else if (S == 2)
                    *w |= (uint32_t)rand_scale(seed, 1) << (16 * (r % 2));
                else if (type == JLM_T_Q5_1 || type == JLM_T_Q4_K || type == JLM_T_Q5_K)
                    *w = rand_scale(seed, type == JLM_T_Q5_1) | (uint32_t)rand_scale(seed, type == JLM_T_Q5_1) << 16;
                else
                    *w = rand_scale(seed, 1);
            }
        for (uint64_t i = 0; i < sl / 4; i++)
            t->sc[i] = (uint32_t)rng_next(seed) & (type == JLM_T_Q3_K ? 0x3f3f3f3fu : 0xffffffffu);
    }
    t->m = (jlm_k_mat){.type = type, .k = k, .rows = rows, .qs = t->qs,
                       .d = tr->is_float ? NULL : t->d, .sc = tr->sc_kind ? t->sc : NULL};
}

static void tmat_free(tmat *t)
{
    free(t->qs);
    free(t->d);
    free(t->sc);
}

/* Activations with zeros, denormals and large values mixed in. */
static void rand_act(float *x, uint64_t k, uint64_t *seed, int flavour)
{
    for (uint64_t i = 0; i < k; i++) {
        float v = rng_unit(seed);
        if (flavour == 1 && i % 5 == 0)
            v = 0.0f;
        if (flavour == 2)
            v *= 1e-39f;                       /* denormal blocks */
        if (flavour == 3 && i % 7 == 0)
            v *= 1e20f;                        /* a few huge values */
        if (flavour == 4 && (i / 32) % 2 == 0)
            v = 0.0f;                          /* whole zero blocks */
        x[i] = v;
    }
}

#endif
