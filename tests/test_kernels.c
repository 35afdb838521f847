/* test_kernels.c - suite `kernels`: every (type x variant) matvec/matmul
 * against a plain dequantize-then-dot oracle (jlm_k_dequant_row_ref, written
 * independently of the kernels), activation quantization, fp16 rounding, the
 * kernel table, and the f32 ops against plain f64 formulas. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/dequant.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/tolerances.h"
#include "tests/kernel_fixture.h"

/* random data and packed planes: tests/kernel_fixture.h */

static double tol_of(uint8_t type)
{
    switch (type) {
    case JLM_T_F32: return JLM_K_TOL_F32;
    case JLM_T_F16: return JLM_K_TOL_F16;
    case JLM_T_BF16: return JLM_K_TOL_BF16;
    case JLM_T_Q4_0: return JLM_K_TOL_Q4_0;
    case JLM_T_Q8_0: return JLM_K_TOL_Q8_0;
    case JLM_T_Q5_0: return JLM_K_TOL_Q5_0;
    case JLM_T_Q5_1: return JLM_K_TOL_Q5_1;
    case JLM_T_MXFP4: return JLM_K_TOL_MXFP4;
    case JLM_T_Q3_K: return JLM_K_TOL_Q3_K;
    case JLM_T_Q4_K: return JLM_K_TOL_Q4_K;
    case JLM_T_Q5_K: return JLM_K_TOL_Q5_K;
    default: return JLM_K_TOL_Q6_K;
    }
}

/* ---------------------------------------------------------------- oracle */

/* f64 dot of the dequantized row with the dequantized activations (float
 * types: the f32 x itself); *scale = sum |w*x|. */
static double oracle_row(const tmat *t, const float *x, const jlm_act_q8 *xq, uint64_t r, double *scale)
{
    const jlm_k_mat *m = &t->m;
    float *w = malloc(m->k * sizeof *w);
    cr_assert(jlm_k_dequant_row_ref(m->type, m->qs, m->d, m->sc, m->k, m->rows, r, w) == 0);
    int fl = jlm_fmt_type_traits(m->type)->is_float;
    double acc = 0.0, sc = 0.0;
    for (uint64_t i = 0; i < m->k; i++) {
        double xi = fl ? (double)x[i] : (double)xq->q[i] * (double)xq->d[i / 32];
        acc += (double)w[i] * xi;
        sc += fabs((double)w[i] * xi);
    }
    free(w);
    *scale = sc;
    return acc;
}

/* ---------------------------------------------------------------- matvec (type x variant) */

typedef struct mv_param {
    uint8_t type;
    int     variant;
    int     pf;        /* AVX-512: enum jlm_k_pf, each of its two builds tested */
} mv_param;

static const uint8_t ALL_TYPES[] = {JLM_T_F32, JLM_T_F16, JLM_T_BF16, JLM_T_Q4_0, JLM_T_Q8_0,
                                    JLM_T_Q5_0, JLM_T_Q5_1, JLM_T_MXFP4, JLM_T_Q3_K, JLM_T_Q4_K,
                                    JLM_T_Q5_K, JLM_T_Q6_K};
#define N_TYPES (sizeof ALL_TYPES / sizeof ALL_TYPES[0])

/* Every (variant, prefetch build) pair from variant v0 on: the AVX-512
 * kernels twice (L1 and L2 prefetch), the others once. */
static size_t variant_params(mv_param *p, int v0)
{
    static const int PFS[2] = {JLM_K_PF_L1, JLM_K_PF_L2};
    size_t n = 0;
    for (int v = v0; v < JLM_K_NVARIANT; v++) {
        int builds = v == JLM_K_AVX512 ? 2 : 1;
        for (int b = 0; b < builds; b++)
            for (size_t i = 0; i < N_TYPES; i++)
                p[n++] = (mv_param){ALL_TYPES[i], v, v == JLM_K_AVX512 ? PFS[b] : 0};
    }
    return n;
}

ParameterizedTestParameters(kernels, matvec_matches_the_dequantized_dot_for_every_type_and_variant)
{
    static mv_param p[N_TYPES * (JLM_K_NVARIANT + 1)];
    return cr_make_param_array(mv_param, p, variant_params(p, 0));
}

static const char *VNAME[JLM_K_NVARIANT] = {"ref", "avx2", "avx512"};

/* Fills *tab (the AVX-512 build of prefetch level pf) or skips the test when
 * the CPU lacks the variant; the name says which build failed. */
static void table_or_skip(int v, int pf, jlm_k_cpu *tab)
{
    jlm_err err = {0};
    if (!jlm_k_cpu_has(v))
        cr_skip_test("variant %s: not supported by this CPU", VNAME[v]);
    cr_assert(jlm_k_cpu_table_pf(v, pf, tab, &err) == 0, "%s", err.msg);
    cr_assert(tab->pf == pf, "%s: prefetch level %d, asked for %d", VNAME[v], tab->pf, pf);
    if (v == JLM_K_AVX512)
        tab->name = pf == JLM_K_PF_L1 ? "avx512-l1" : "avx512-l2";
}

/* One shape: rows [r0, r1) through the variant's matvec and (n tokens) matmul;
 * rows outside the range must keep their sentinel. */
static void check_shape(const jlm_k_cpu *tab, uint8_t type, uint64_t k, uint64_t rows,
                        uint64_t r0, uint64_t r1, int flavour, uint64_t *seed)
{
    enum { NT = 5 };
    const char *tn = jlm_fmt_type_traits(type)->name;
    tmat t;
    tmat_make(&t, type, k, rows, seed);
    float *x = malloc(NT * k * sizeof *x), *y = malloc(NT * rows * sizeof *y);
    jlm_act_q8 xq[NT];
    void *buf[NT];
    for (int i = 0; i < NT; i++) {
        rand_act(x + i * k, k, seed, (flavour + i) % 5);
        buf[i] = malloc(jlm_k_act_q8_bytes(k + 32));
        cr_assert(jlm_k_act_q8_init(&xq[i], buf[i], k % 32 ? k + 32 - k % 32 : k, NULL) == 0);
        if (k % 32 == 0)
            jlm_k_quantize_act(x + i * k, &xq[i]);
    }
    float *yr = malloc(NT * rows * sizeof *yr);
    int quant = !jlm_fmt_type_traits(type)->is_float;
    for (int pass = 0; pass < 2; pass++) {
        int nt = pass ? NT : 1;
        for (uint64_t i = 0; i < NT * rows; i++)
            y[i] = yr[i] = 12345.0f;
        if (pass) {
            tab->matmul[type](&t.m, nt, x, xq, y, r0, r1);
            jlm_k_matmul_ref(&t.m, nt, x, xq, yr, r0, r1);
        } else {
            tab->matvec[type](&t.m, x, xq, y, r0, r1);
            jlm_k_matvec_ref(&t.m, x, xq, yr, r0, r1);
        }
        /* quantized types: every variant rounds exactly like the reference */
        for (uint64_t i = 0; quant && i < (uint64_t)nt * rows; i++)
            cr_assert(!memcmp(&y[i], &yr[i], sizeof *y),
                      "%s %s %s k %llu rows %llu [%llu,%llu) token %llu row %llu: "
                      "reference %a, variant %a (must be bit-identical)",
                      tab->name, pass ? "matmul" : "matvec", tn, (unsigned long long)k,
                      (unsigned long long)rows, (unsigned long long)r0, (unsigned long long)r1,
                      (unsigned long long)(i / rows), (unsigned long long)(i % rows), (double)yr[i], (double)y[i]);
        for (int tk = 0; tk < nt; tk++)
            for (uint64_t r = 0; r < rows; r++) {
                float got = y[tk * rows + r];
                if (r < r0 || r >= r1) {
                    cr_assert(got == 12345.0f, "%s %s k %llu rows %llu: row %llu outside [%llu,%llu) written",
                              tab->name, tn, (unsigned long long)k, (unsigned long long)rows,
                              (unsigned long long)r, (unsigned long long)r0, (unsigned long long)r1);
                    continue;
                }
                double scale, want = oracle_row(&t, x + tk * k, &xq[tk], r, &scale);
                double err = fabs((double)got - want), lim = tol_of(type) * scale + 1e-30;
                cr_assert(!(err > lim) && err == err,
                          "%s %s %s k %llu rows %llu [%llu,%llu) token %d flavour %d row %llu: "
                          "expected %.9g got %.9g (err %.3g > %.3g)",
                          tab->name, pass ? "matmul" : "matvec", tn, (unsigned long long)k,
                          (unsigned long long)rows, (unsigned long long)r0, (unsigned long long)r1,
                          tk, (flavour + tk) % 5, (unsigned long long)r, want, (double)got, err, lim);
            }
    }
    for (int i = 0; i < NT; i++)
        free(buf[i]);
    free(x);
    free(y);
    free(yr);
    tmat_free(&t);
}

ParameterizedTest(mv_param *p, kernels, matvec_matches_the_dequantized_dot_for_every_type_and_variant,
                  .timeout = 60)
{
    jlm_k_cpu tab;
    table_or_skip(p->variant, p->pf, &tab);
    const jlm_type_traits *tr = jlm_fmt_type_traits(p->type);
    uint64_t sw = tr->is_float ? 32 : (uint64_t)tr->sub * tr->super_sub;
    static const uint64_t ROWS[] = {1, 3, 7, 8, 9, 16, 17, 33};
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (p->type * 131u + (unsigned)p->variant);
    int flavour = 0;
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
        uint64_t n = ROWS[i];
        check_shape(&tab, p->type, sw, n, 0, n, flavour++ % 5, &seed);
        check_shape(&tab, p->type, 3 * sw, n, 0, n, flavour++ % 5, &seed);
        if (n >= 3)
            check_shape(&tab, p->type, 2 * sw, n, 1, n - 1, flavour++ % 5, &seed);
    }
    /* a wide range with unaligned ends: vector body plus scalar head and tail */
    check_shape(&tab, p->type, tr->is_float ? 100 : 2 * sw, 70, 3, 61, 0, &seed);
    check_shape(&tab, p->type, tr->is_float ? 4 * sw : 4 * sw, 64, 16, 48, 3, &seed);
    if (tr->is_float)
        check_shape(&tab, p->type, 1, 5, 0, 5, 0, &seed);   /* k = 1: no vector body */
}

ParameterizedTestParameters(kernels, variant_equals_the_reference_bit_for_bit_on_quantized_types)
{
    static mv_param p[N_TYPES * JLM_K_NVARIANT];
    return cr_make_param_array(mv_param, p, variant_params(p, JLM_K_AVX2));
}

/* y (nt tokens x rows) of the variant against the reference: quantized types
 * bit for bit (docs/kernels.md, last section), float types within tolerance. */
static void expect_same_as_ref(const jlm_k_cpu *tab, const tmat *t, const char *what, int nt,
                               const float *x, const jlm_act_q8 *xq, const float *y, const float *yr)
{
    const jlm_type_traits *tr = jlm_fmt_type_traits(t->m.type);
    uint64_t rows = t->m.rows;
    for (uint64_t i = 0; i < (uint64_t)nt * rows; i++) {
        uint64_t tk = i / rows, r = i % rows;
        if (!tr->is_float) {
            cr_assert(!memcmp(&y[i], &yr[i], sizeof *y), "%s %s %s token %llu row %llu: reference %a, variant %a",
                      tab->name, tr->name, what, (unsigned long long)tk, (unsigned long long)r,
                      (double)yr[i], (double)y[i]);
            continue;
        }
        if (isnan(y[i]) && isnan(yr[i]))
            continue;                              /* the token with a NaN */
        double scale;
        oracle_row(t, x + tk * t->m.k, &xq[tk], r, &scale);
        double err = fabs((double)y[i] - (double)yr[i]), lim = tol_of(t->m.type) * scale;
        cr_assert(!(err > lim) && err == err, "%s %s %s token %llu row %llu: ref %.9g, variant %.9g (err %.3g > %.3g)",
                  tab->name, tr->name, what, (unsigned long long)tk, (unsigned long long)r,
                  (double)yr[i], (double)y[i], err, lim);
    }
}

/* Random planes, 6 tokens of every activation flavour (one with a NaN block),
 * 101 rows (vector body + scalar tail), through matvec and matmul; then
 * saturating operands: every code at its extreme, activations all +-127. */
ParameterizedTest(mv_param *p, kernels, variant_equals_the_reference_bit_for_bit_on_quantized_types,
                  .timeout = 60)
{
    enum { NT = 6 };
    jlm_k_cpu tab;
    table_or_skip(p->variant, p->pf, &tab);
    const jlm_type_traits *tr = jlm_fmt_type_traits(p->type);
    uint64_t k = tr->is_float ? 1000 : 1024, rows = 101, seed = 77 + p->type;
    float *x = malloc(NT * k * sizeof *x), *y = malloc(NT * rows * sizeof *y), *yr = malloc(NT * rows * sizeof *yr);
    void *buf[NT];
    jlm_act_q8 xq[NT];
    for (int i = 0; i < NT; i++) {
        buf[i] = malloc(jlm_k_act_q8_bytes(1024));
        cr_assert(jlm_k_act_q8_init(&xq[i], buf[i], 1024, NULL) == 0);
    }
    static const uint8_t FILL[] = {0xff, 0x88, 0x80, 0x7f, 0x0f, 0xf0};
    for (int round = 0; round < 3 + (int)sizeof FILL; round++) {
        tmat t;
        tmat_make(&t, p->type, k, rows, &seed);
        int sat = round >= 3;
        uint64_t ql, dl, sl;
        cr_assert(jlm_fmt_planes(p->type, k, rows, &ql, &dl, &sl, NULL) == 0);
        if (sat && tr->is_float) {
            tmat_free(&t);
            continue;
        }
        if (sat)
            memset(t.qs, FILL[round - 3], ql);
        for (int i = 0; i < NT; i++) {
            if (sat)
                for (uint64_t e = 0; e < k; e++)
                    x[i * k + e] = (i % 3 == 0) ? 1.0f : (i % 3 == 1) ? -1.0f : ((e / 32) % 2 ? 2.0f : -2.0f);
            else
                rand_act(x + i * k, k, &seed, i % 5);
            if (!sat && i == 5)
                x[i * k + 40] = NAN;
            if (!tr->is_float)
                jlm_k_quantize_act(x + i * k, &xq[i]);
        }
        tab.matvec[p->type](&t.m, x, &xq[0], y, 0, rows);
        jlm_k_matvec_ref(&t.m, x, &xq[0], yr, 0, rows);
        expect_same_as_ref(&tab, &t, "matvec", 1, x, xq, y, yr);
        tab.matmul[p->type](&t.m, NT, x, xq, y, 0, rows);
        jlm_k_matmul_ref(&t.m, NT, x, xq, yr, 0, rows);
        expect_same_as_ref(&tab, &t, "matmul", NT, x, xq, y, yr);
        tmat_free(&t);
    }
    for (int i = 0; i < NT; i++)
        free(buf[i]);
    free(x);
    free(y);
    free(yr);
}

/* ---------------------------------------------------------------- GEMM (prefill) */

ParameterizedTestParameters(kernels, gemm_equals_the_reference_bit_for_bit_for_every_token_count)
{
    static uint8_t p[N_TYPES];
    size_t n = 0;
    for (size_t i = 0; i < N_TYPES; i++)
        if (!jlm_fmt_type_traits(ALL_TYPES[i])->is_float)
            p[n++] = ALL_TYPES[i];
    return cr_make_param_array(uint8_t, p, n);
}

/* The matmul of every vector variant (the register-tiled GEMM where the
 * table has one: full tiles of 8-12 tokens, 4-token tiles, a padded last
 * tile; 128-row blocks) and its matmul4, against the reference by memcmp:
 * token counts around every tile width, 149 rows (two row blocks, a scalar
 * tail) and an unaligned row range whose outside must stay untouched, k of 3
 * super-blocks (SC chunks of the activations, a partial last one); random
 * planes with a NaN token and zero / denormal / huge activation blocks, then
 * saturating planes (every byte 0xff) with activations at +-127, then
 * every byte 0x80 (Q8_0 weights of -128: |w| = 128 in AVX2's sign trick).
 * The vector variants must have the GEMM for every quantized type. */
ParameterizedTest(uint8_t *type, kernels, gemm_equals_the_reference_bit_for_bit_for_every_token_count,
                  .timeout = 120)
{
    static const uint64_t NS[] = {1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 16, 17, 24, 25, 64};
    enum { NMAX = 64 };
    const char *tn = jlm_fmt_type_traits(*type)->name;
    uint64_t k = 768, rows = 149, seed = 1234 + *type;
    float *x = malloc(NMAX * k * sizeof *x), *y = malloc(NMAX * rows * sizeof *y);
    float *yr = malloc(NMAX * rows * sizeof *yr);
    uint8_t *buf = malloc(NMAX * jlm_k_act_q8_bytes(k));
    jlm_act_q8 xq[NMAX];
    cr_assert(x && y && yr && buf);
    for (int i = 0; i < NMAX; i++)
        cr_assert(jlm_k_act_q8_init(&xq[i], buf + i * jlm_k_act_q8_bytes(k), k, NULL) == 0);
    for (int round = 0; round < 3; round++) {
        tmat t;
        tmat_make(&t, *type, k, rows, &seed);
        if (round) {
            uint64_t ql, dl, sl;
            cr_assert(jlm_fmt_planes(*type, k, rows, &ql, &dl, &sl, NULL) == 0);
            memset(t.qs, round == 1 ? 0xff : 0x80, ql);
        }
        for (int i = 0; i < NMAX; i++) {
            if (round)
                for (uint64_t e = 0; e < k; e++)
                    x[i * k + e] = i % 2 ? 1.0f : -1.0f;
            else
                rand_act(x + i * k, k, &seed, i % 5);
            if (!round && i == 9)
                x[i * k + 100] = NAN;
            jlm_k_quantize_act(x + i * k, &xq[i]);
        }
        jlm_k_matmul_ref(&t.m, NMAX, x, xq, yr, 0, rows);
        for (int v = JLM_K_AVX2; v < JLM_K_NVARIANT; v++) {
            jlm_k_cpu tab;
            if (!jlm_k_cpu_has(v) || jlm_k_cpu_table(v, &tab, NULL))
                continue;
            cr_assert((tab.native_gemm >> *type) & 1, "%s %s: no GEMM", tab.name, tn);
            for (int f = 0; f < 2; f++) {
                jlm_k_matmul_fn mm = f ? tab.matmul4[*type] : tab.matmul[*type];
                const char *fn = f ? "matmul4" : "matmul";
                for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
                    uint64_t n = NS[ni];
                    /* whole range, then rows [3, 140) with sentinels around */
                    for (int part = 0; part < 2; part++) {
                        uint64_t r0 = part ? 3 : 0, r1 = part ? 140 : rows;
                        for (uint64_t i = 0; i < n * rows; i++)
                            y[i] = -7.0f;
                        mm(&t.m, n, x, xq, y, r0, r1);
                        for (uint64_t i = 0; i < n * rows; i++) {
                            uint64_t tk = i / rows, r = i % rows;
                            if (r < r0 || r >= r1) {
                                cr_assert(y[i] == -7.0f, "%s %s %s n %llu: row %llu outside [%llu, %llu) written",
                                          tab.name, tn, fn, (unsigned long long)n, (unsigned long long)r,
                                          (unsigned long long)r0, (unsigned long long)r1);
                                continue;
                            }
                            cr_assert(!memcmp(&y[i], &yr[tk * rows + r], sizeof *y),
                                      "%s %s %s n %llu rows [%llu, %llu) token %llu row %llu round %d: "
                                      "reference %a, got %a", tab.name, tn, fn, (unsigned long long)n,
                                      (unsigned long long)r0, (unsigned long long)r1, (unsigned long long)tk,
                                      (unsigned long long)r, round, (double)yr[tk * rows + r], (double)y[i]);
                        }
                    }
                }
            }
        }
        tmat_free(&t);
    }
    free(x);
    free(y);
    free(yr);
    free(buf);
}

/* ---------------------------------------------------------------- activations, fp16 */

Test(kernels, quantize_act_rounds_each_block_to_amax_over_127)
{
    enum { K = 256 };
    float x[K];
    uint64_t seed = 5;
    rand_act(x, K, &seed, 3);
    x[40] = -3.5f;                              /* block 1 has a clear amax */
    for (int i = 64; i < 96; i++)
        x[i] = 0.0f;                            /* block 2 all zero */
    x[100] = NAN;                               /* block 3 poisoned */
    void *buf = malloc(jlm_k_act_q8_bytes(K));
    jlm_act_q8 a;
    cr_assert(jlm_k_act_q8_init(&a, buf, K, NULL) == 0);
    jlm_k_quantize_act(x, &a);
    for (int b = 0; b < K / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[32 * b + i]));
        if (b == 3) {
            cr_assert(isnan(a.d[b]), "block 3 holds NaN: expected d NaN, got %g", (double)a.d[b]);
            continue;
        }
        cr_assert(a.d[b] == amax / 127.0f, "block %d: expected d %g got %g", b, (double)(amax / 127.0f), (double)a.d[b]);
        int s16[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            int q = a.q[32 * b + i];
            long want = a.d[b] == 0.0f ? 0 : lroundf(x[32 * b + i] / a.d[b]);
            cr_assert(q == want && q >= -127 && q <= 127, "block %d elem %d: x %g d %g: expected q %ld got %d",
                      b, i, (double)x[32 * b + i], (double)a.d[b], want, q);
            s16[i / 16] += q;
        }
        cr_assert(a.sum16[2 * b] == s16[0] && a.sum16[2 * b + 1] == s16[1],
                  "block %d: sums %d %d, expected %d %d", b, a.sum16[2 * b], a.sum16[2 * b + 1], s16[0], s16[1]);
    }
    cr_assert(a.d[2] == 0.0f, "all-zero block: expected d 0, got %g", (double)a.d[2]);
    jlm_err err = {0};
    cr_assert(jlm_k_act_q8_init(&a, buf, 48, &err) == JLM_EINVAL, "k 48 must be refused");
    free(buf);
}

Test(kernels, fp16_conversion_round_trips_and_rounds_ties_to_even)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = jlm_k_fp16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        cr_assert(jlm_k_f32_to_fp16(f) == h, "half 0x%04x -> %g -> 0x%04x", h, (double)f, jlm_k_f32_to_fp16(f));
        uint16_t nx = (uint16_t)(h + 1);
        if ((h & 0x7fff) >= 0x7bff)
            continue;                            /* next is inf or wraps sign */
        double mid = ((double)f + (double)jlm_k_fp16_to_f32(nx)) / 2.0;
        uint16_t want = (h & 1) ? nx : (uint16_t)h;
        cr_assert(jlm_k_f32_to_fp16((float)mid) == want, "midpoint %.10g after 0x%04x: expected 0x%04x got 0x%04x",
                  mid, h, want, jlm_k_f32_to_fp16((float)mid));
    }
    cr_assert(jlm_k_f32_to_fp16(65520.0f) == 0x7c00, "65520 must round to inf");
    cr_assert(jlm_k_f32_to_fp16(65519.0f) == 0x7bff, "65519 must round to 65504");
    cr_assert(jlm_k_f32_to_fp16(1e-9f) == 0, "1e-9 must round to 0");
}

/* ---------------------------------------------------------------- kernel table */

Test(kernels, jlm_cpu_ref_forces_the_reference_table)
{
    setenv("JLM_CPU", "ref", 1);
    jlm_err err = {0};
    cr_assert(jlm_k_cpu_init(&err) == 0, "%s", err.msg);
    cr_assert_str_eq(jlm_k_cpu_variant_name(), "ref");
    for (int t = 1; t < JLM_T_COUNT; t++)
        cr_assert(jlm_k_cpu_get()->matvec[t] == jlm_k_matvec_ref, "type %d: not the reference", t);
}

Test(kernels, an_unknown_jlm_cpu_is_refused_and_the_best_variant_used)
{
    setenv("JLM_CPU", "sse9", 1);
    jlm_err err = {0};
    cr_assert(jlm_k_cpu_init(&err) == JLM_EINVAL, "JLM_CPU=sse9 accepted");
    cr_assert(strstr(err.msg, "sse9"), "message does not name the value: %s", err.msg);
    int best = jlm_k_cpu_has(JLM_K_AVX512) ? JLM_K_AVX512 : jlm_k_cpu_has(JLM_K_AVX2) ? JLM_K_AVX2 : JLM_K_REF;
    cr_assert_str_eq(jlm_k_cpu_variant_name(), VNAME[best]);
}

Test(kernels, jlm_cpu_names_the_avx512_prefetch_build_and_the_default_is_the_cpus)
{
    if (!jlm_k_cpu_has(JLM_K_AVX512))
        cr_skip_test("no AVX-512 on this CPU");
    static const struct { const char *env; int pf; } C[] = {
        {"avx512-l1", JLM_K_PF_L1}, {"avx512-l2", JLM_K_PF_L2}, {"avx512", 0}};
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        setenv("JLM_CPU", C[i].env, 1);
        jlm_err err = {0};
        cr_assert(jlm_k_cpu_init(&err) == 0, "JLM_CPU=%s: %s", C[i].env, err.msg);
        const jlm_k_cpu *k = jlm_k_cpu_get();
        int want = C[i].pf ? C[i].pf : jlm_k_cpu_pf_default();
        cr_assert(k->variant == JLM_K_AVX512 && k->pf == want, "JLM_CPU=%s: variant %d prefetch %d, want %d",
                  C[i].env, k->variant, k->pf, want);
        cr_assert(k->matvec[JLM_T_Q4_0] != jlm_k_matvec_ref, "JLM_CPU=%s: Q4_0 is the reference", C[i].env);
    }
    jlm_k_cpu l1, l2;
    cr_assert(jlm_k_cpu_table_pf(JLM_K_AVX512, JLM_K_PF_L1, &l1, NULL) == 0);
    cr_assert(jlm_k_cpu_table_pf(JLM_K_AVX512, JLM_K_PF_L2, &l2, NULL) == 0);
    cr_assert(l1.matvec[JLM_T_Q4_0] != l2.matvec[JLM_T_Q4_0], "the two builds share the Q4_0 matvec");
    cr_assert(jlm_k_cpu_table_pf(JLM_K_AVX512, 7, &l1, NULL) == JLM_EINVAL, "prefetch level 7 accepted");
    unsetenv("JLM_CPU");
    jlm_k_cpu_init(NULL);
}

Test(kernels, every_table_entry_is_set_for_every_supported_variant)
{
    for (int v = 0; v < JLM_K_NVARIANT; v++) {
        jlm_k_cpu tab;
        if (!jlm_k_cpu_has(v)) {
            cr_log_info("variant %s: not supported by this CPU, not checked", VNAME[v]);
            continue;
        }
        cr_assert(jlm_k_cpu_table(v, &tab, NULL) == 0);
        for (int t = 1; t < JLM_T_COUNT; t++)
            cr_assert(tab.matvec[t] && tab.matmul[t], "%s: type %d has no kernel", VNAME[v], t);
    }
}

Test(kernels, mat_check_refuses_k_not_a_multiple_of_the_super_block)
{
    uint32_t w[16] = {0};
    jlm_k_mat m = {.type = JLM_T_Q4_K, .k = 128, .rows = 1, .qs = w, .d = w, .sc = w};
    jlm_err err = {0};
    cr_assert(jlm_k_mat_check(&m, &err) == JLM_EINVAL, "Q4_K with k 128 accepted");
    m.k = 256;
    cr_assert(jlm_k_mat_check(&m, &err) == 0, "%s", err.msg);
    m.type = 99;
    cr_assert(jlm_k_mat_check(&m, &err) == JLM_EINVAL, "type 99 accepted");
}

/* ---------------------------------------------------------------- ops */

static void expect_close(const char *what, int i, double want, double got, double tol)
{
    double err = fabs(got - want), lim = tol * fmax(1.0, fabs(want));
    cr_assert(!(err > lim) && err == err, "%s [%d]: expected %.9g got %.9g (err %.3g)", what, i, want, got, err);
}

Test(kernels, rmsnorm_and_layernorm_match_the_plain_formulas)
{
    enum { N = 300 };
    float x[N], w[N], b[N], o[N];
    uint64_t seed = 11;
    for (int i = 0; i < N; i++) {
        x[i] = 3.0f * rng_unit(&seed) + 0.5f;
        w[i] = rng_unit(&seed);
        b[i] = rng_unit(&seed);
    }
    double ss = 0, mean = 0, var = 0;
    for (int i = 0; i < N; i++) {
        ss += (double)x[i] * x[i];
        mean += x[i];
    }
    mean /= N;
    for (int i = 0; i < N; i++)
        var += (x[i] - mean) * (x[i] - mean);
    var /= N;
    jlm_k_rmsnorm(o, x, w, N, 1e-5f);
    for (int i = 0; i < N; i++)
        expect_close("rmsnorm", i, x[i] / sqrt(ss / N + 1e-5) * w[i], o[i], JLM_K_TOL_NORM);
    jlm_k_layernorm(o, x, w, b, N, 1e-6f);
    for (int i = 0; i < N; i++)
        expect_close("layernorm", i, (x[i] - mean) / sqrt(var + 1e-6) * w[i] + b[i], o[i], JLM_K_TOL_NORM);
}

/* Plain f64 RoPE with optional YaRN, written from the paper's formulas. */
static void rope_plain(const jlm_k_rope *p, double *x, int head_dim, int n_head, long pos)
{
    double lo = 0, hi = 0;
    if (p->ext_factor != 0.0f) {
        double cd_fast = p->n_rot * log(p->orig_ctx / (p->beta_fast * 2 * M_PI)) / (2 * log(p->freq_base));
        double cd_slow = p->n_rot * log(p->orig_ctx / (p->beta_slow * 2 * M_PI)) / (2 * log(p->freq_base));
        lo = fmax(0, floor(cd_fast));
        hi = fmin(p->n_rot - 1, ceil(cd_slow));
    }
    for (int h = 0; h < n_head; h++)
        for (unsigned i = 0; i < p->n_rot / 2; i++) {
            double ext = pos * pow(p->freq_base, -2.0 * i / p->n_rot) / (p->freq_factors ? p->freq_factors[i] : 1.0);
            double theta = ext * p->freq_scale, ms = p->attn_factor;
            if (p->ext_factor != 0.0f) {
                double ramp = 1 - fmin(1, fmax(0, (i - lo) / fmax(0.001, hi - lo)));
                double mix = ramp * p->ext_factor;
                theta = theta * (1 - mix) + ext * mix;
                ms *= 1 + 0.1 * log(1 / p->freq_scale);
            }
            unsigned a = p->neox ? i : 2 * i, b = p->neox ? i + p->n_rot / 2 : 2 * i + 1;
            double *xh = x + h * head_dim, x0 = xh[a], x1 = xh[b];
            xh[a] = (x0 * cos(theta) - x1 * sin(theta)) * ms;
            xh[b] = (x0 * sin(theta) + x1 * cos(theta)) * ms;
        }
}

Test(kernels, rope_normal_neox_and_yarn_match_the_plain_formulas)
{
    enum { HD = 64, NH = 3 };
    float ff[HD / 2];
    uint64_t seed = 3;
    for (int i = 0; i < HD / 2; i++)
        ff[i] = 1.0f + (float)i / 8.0f;
    for (int mode = 0; mode < 4; mode++) {
        jlm_k_rope p;
        jlm_k_rope_defaults(&p, mode == 2 ? 32 : HD, 10000.0f);
        p.neox = mode & 1;
        if (mode == 2)
            p.freq_factors = ff;
        if (mode == 3) {
            p.freq_scale = 0.25f;
            p.ext_factor = 1.0f;
            p.attn_factor = 1.0f;
            p.orig_ctx = 4096;
        }
        for (long pos = 0; pos < 300; pos += 37) {
            float x[HD * NH];
            double xd[HD * NH];
            for (int i = 0; i < HD * NH; i++)
                xd[i] = x[i] = rng_unit(&seed);
            jlm_k_rope_apply(&p, x, NH, HD, pos);
            rope_plain(&p, xd, HD, NH, pos);
            for (int i = 0; i < HD * NH; i++)
                expect_close(mode == 0 ? "rope" : mode == 1 ? "rope neox" : mode == 2 ? "rope ff" : "rope yarn",
                             i, xd[i], x[i], JLM_K_TOL_ROPE);
        }
    }
}

Test(kernels, softmax_silu_gelu_and_swiglu_match_the_plain_formulas)
{
    enum { N = 200 };
    float x[N], g[N], o[N];
    uint64_t seed = 9;
    double mx = -1e300, sum = 0;
    for (int i = 0; i < N; i++) {
        x[i] = 12.0f * rng_unit(&seed);
        g[i] = 4.0f * rng_unit(&seed);
        mx = fmax(mx, x[i]);
    }
    for (int i = 0; i < N; i++)
        sum += exp(x[i] - mx);
    memcpy(o, x, sizeof o);
    jlm_k_softmax(o, N);
    for (int i = 0; i < N; i++)
        expect_close("softmax", i, exp(x[i] - mx) / sum, o[i], JLM_K_TOL_SOFTMAX);
    jlm_k_silu(o, g, N);
    for (int i = 0; i < N; i++)
        expect_close("silu", i, g[i] / (1 + exp(-(double)g[i])), o[i], JLM_K_TOL_ACT);
    jlm_k_gelu(o, g, N);
    for (int i = 0; i < N; i++) {
        double v = g[i];
        expect_close("gelu", i, 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), o[i], JLM_K_TOL_ACT);
    }
    jlm_k_swiglu(o, g, x, N);
    for (int i = 0; i < N; i++)
        expect_close("swiglu", i, g[i] / (1 + exp(-(double)g[i])) * x[i], o[i], JLM_K_TOL_ACT * 10);
    jlm_k_swiglu_oai(o, x, g, N, 1.702f, 7.0f);
    for (int i = 0; i < N; i++) {
        double gg = fmin(x[i], 7.0), u = fmax(fmin(g[i], 7.0), -7.0);
        expect_close("swiglu_oai", i, gg / (1 + exp(-1.702 * gg)) * (u + 1), o[i], JLM_K_TOL_ACT * 10);
    }
}

Test(kernels, gelu_fp16_returns_the_fp16_rounded_gelu_of_the_fp16_rounded_input)
{
    float x[] = {-11.0f, -10.0f, -3.3f, -0.5f, 0.0f, 1e-6f, 0.7f, 2.5f, 9.99f, 10.0f, 50.0f};
    float o[sizeof x / sizeof x[0]];
    jlm_k_gelu_fp16(o, x, sizeof x / sizeof x[0]);
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) {
        double v = x[i], want;
        if (v <= -10) {
            want = 0;
        } else if (v >= 10) {
            want = v;
        } else {
            double h = jlm_k_fp16_to_f32(jlm_k_f32_to_fp16(x[i]));
            want = 0.5 * h * (1 + tanh(sqrt(2 / M_PI) * (h + 0.044715 * h * h * h)));
            cr_assert(jlm_k_fp16_to_f32(jlm_k_f32_to_fp16(o[i])) == o[i], "gelu_fp16(%g) = %.9g is not an fp16 value",
                      v, (double)o[i]);
            cr_assert(fabs(o[i] - want) <= fabs(want) * 0x1p-10 + 1e-7, "gelu_fp16(%g): expected ~%.6g got %.6g",
                      v, want, (double)o[i]);
            continue;
        }
        cr_assert(o[i] == want, "gelu_fp16(%g): expected %g got %g", v, want, (double)o[i]);
    }
}

Test(kernels, attention_head_matches_softmax_of_scaled_capped_masked_scores)
{
    enum { HD = 16, HV = 8, NKV = 23, STR = 40 };
    float q[HD], k[NKV * STR], v[NKV * STR], mask[NKV], p[NKV], out[HV];
    uint64_t seed = 21;
    for (int i = 0; i < HD; i++)
        q[i] = 2.0f * rng_unit(&seed);
    for (int i = 0; i < NKV * STR; i++) {
        k[i] = rng_unit(&seed);
        v[i] = rng_unit(&seed);
    }
    for (int j = 0; j < NKV; j++)
        mask[j] = j % 4 == 3 ? -INFINITY : 0.0f;
    for (int cfg = 0; cfg < 3; cfg++) {
        jlm_k_attn a = {.head_dim = HD, .head_dim_v = HV, .k_stride = STR, .v_stride = STR,
                        .scale = 0.25f, .softcap = cfg == 1 ? 2.0f : 0.0f, .has_sink = cfg == 2,
                        .sink = 1.5f, .mask = cfg ? mask : NULL};
        jlm_k_attn_head(&a, q, k, v, NKV, p, out);
        double s[NKV], mx = a.has_sink ? a.sink : -1e300, sum = 0;
        for (int j = 0; j < NKV; j++) {
            double d = 0;
            for (int i = 0; i < HD; i++)
                d += (double)q[i] * k[j * STR + i];
            if (a.softcap > 0)
                d = a.softcap * tanh(d / a.softcap);
            s[j] = d * a.scale + (a.mask ? a.mask[j] : 0);
            mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < NKV; j++)
            sum += exp(s[j] - mx);
        if (a.has_sink)
            sum += exp(a.sink - mx);
        for (int i = 0; i < HV; i++) {
            double o = 0;
            for (int j = 0; j < NKV; j++)
                o += exp(s[j] - mx) / sum * v[j * STR + i];
            expect_close("attn out", cfg * 100 + i, o, out[i], JLM_K_TOL_SOFTMAX * 4);
        }
        for (int j = 0; j < NKV; j++)
            expect_close("attn p", cfg * 100 + j, exp(s[j] - mx) / sum, p[j], JLM_K_TOL_SOFTMAX);
    }
    for (int j = 0; j < NKV; j++)
        mask[j] = -INFINITY;
    jlm_k_attn a = {.head_dim = HD, .head_dim_v = HV, .k_stride = STR, .v_stride = STR, .scale = 1, .mask = mask};
    jlm_k_attn_head(&a, q, k, v, NKV, p, out);
    for (int i = 0; i < HV; i++)
        cr_assert(out[i] == 0.0f, "all keys masked: expected 0 got %g", (double)out[i]);
}

/* The table's activation quantizer equals jlm_k_quantize_act bit for bit:
 * random blocks, rounding ties (x/d = k + 0.5), zeros, denormals, inf, NaN. */
/* The KV cache's F16 rows: every variant's row conversion gives the
 * reference's bits, contiguous and at the key tiles' stride, on each half's
 * value and the floats around its rounding midpoints, NaNs with payloads,
 * overflow, denormals and random values, for lengths that leave a tail. */
Test(kernels, every_variants_fp16_row_conversion_equals_the_reference)
{
    enum { N = 65536 * 4 + 64 };
    static float x[N];
    static uint16_t want[N * 2], got[N * 2];
    uint64_t s = 99;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t b;
        float f = jlm_k_fp16_to_f32((uint16_t)h);
        memcpy(&b, &f, 4);
        x[4 * h] = f;
        uint32_t m = b + (1u << 12), lo = m - 1, hi = m + 1;   /* around the midpoint above f */
        memcpy(&x[4 * h + 1], &m, 4);
        memcpy(&x[4 * h + 2], &lo, 4);
        memcpy(&x[4 * h + 3], &hi, 4);
    }
    for (int i = 65536 * 4; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t b = (uint32_t)(s >> 32);
        memcpy(&x[i], &b, 4);                                   /* any bits: NaNs and infinities too */
    }
    x[N - 1] = 65519.0f;
    x[N - 2] = 65520.0f;
    x[N - 3] = 1e-9f;
    for (int v = 0; v < JLM_K_NVARIANT; v++) {
        jlm_k_cpu tab;
        if (jlm_k_cpu_table(v, &tab, NULL) != 0)
            continue;
        cr_assert(tab.to_fp16, "%s: no to_fp16", tab.name);
        const uint64_t lens[] = {N, N - 5, 7, 1};
        for (int l = 0; l < 4; l++)
            for (uint64_t stride = 1; stride <= 2; stride++) {
                memset(want, 0xa5, sizeof want);
                memset(got, 0xa5, sizeof got);
                jlm_k_to_fp16_ref(want, stride, x, lens[l]);
                tab.to_fp16(got, stride, x, lens[l]);
                for (uint64_t i = 0; i < N * 2; i++)
                    cr_assert(got[i] == want[i], "%s, %llu values at stride %llu: element %llu: 0x%04x, reference 0x%04x",
                              tab.name, (unsigned long long)lens[l], (unsigned long long)stride,
                              (unsigned long long)i, got[i], want[i]);
            }
        uint16_t tile[32 * 40];
        memset(tile, 0, sizeof tile);
        tab.to_fp16(tile + 3, 32, x + 1000, 40);                /* the key tiles' stride */
        for (int i = 0; i < 40; i++)
            cr_assert(tile[3 + 32 * i] == jlm_k_f32_to_fp16(x[1000 + i]), "%s: tile element %d", tab.name, i);
    }
}

Test(kernels, every_variants_activation_quantizer_equals_the_reference)
{
    enum { K = 32 * 64 };
    static float x[K];
    uint64_t s = 12345;
    for (int i = 0; i < K; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * ((i / 32) % 7 + 1);
    }
    for (int i = 0; i < 32; i++) x[32 * 3 + i] = (float)(i - 16) + 0.5f;    /* ties with amax 15.5 */
    x[32 * 3] = 127.0f;                                                      /* d = 1: x/d = k + 0.5 exactly */
    for (int i = 0; i < 32; i++) x[32 * 5 + i] = 0.0f;
    for (int i = 0; i < 32; i++) x[32 * 6 + i] = 1e-40f * (float)(i - 16);   /* denormals */
    x[32 * 7 + 3] = INFINITY;
    x[32 * 8 + 9] = NAN;
    x[32 * 9 + 1] = -INFINITY;
    for (int v = 0; v < JLM_K_NVARIANT; v++) {
        jlm_k_cpu tab;
        if (jlm_k_cpu_table(v, &tab, NULL) != 0)
            continue;
        static unsigned char b1[1 << 16], b2[1 << 16];
        jlm_act_q8 a, r;
        cr_assert_eq(jlm_k_act_q8_init(&a, b1, K, NULL), 0);
        cr_assert_eq(jlm_k_act_q8_init(&r, b2, K, NULL), 0);
        jlm_k_quantize_act(x, &r);
        tab.quantize_act(x, &a);
        cr_assert(!memcmp(a.q, r.q, K), "%s: int8 values differ from the reference", tab.name);
        cr_assert(!memcmp(a.sum16, r.sum16, K / 16 * sizeof(int16_t)), "%s: sums of 16 differ", tab.name);
        for (int b = 0; b < K / 32; b++)
            cr_assert(!memcmp(&a.d[b], &r.d[b], 4) || (isnan(a.d[b]) && isnan(r.d[b])), "%s: block %d scale %g vs %g",
                      tab.name, b, a.d[b], r.d[b]);
    }
}

/* The table's SwiGLU equals jlm_k_swiglu bit for bit (NaN: a NaN): random
 * gates over the exp's whole range and both signs, zeros of both signs,
 * infinities, NaN, denormals, the exp's cut at -87, for lengths that leave
 * each variant a tail. */
Test(kernels, every_variants_swiglu_equals_the_reference)
{
    enum { N = 4099 };
    static float g[N], u[N], want[N], got[N];
    uint64_t s = 77;
    for (int i = 0; i < N; i++) {
        g[i] = 40.0f * rng_unit(&s) * (float)(i % 5 + 1);
        u[i] = 3.0f * rng_unit(&s);
    }
    const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 87.0f, -87.0f, 87.01f, -87.01f,
                          88.7f, -88.7f, 1e30f, -1e30f, 16.6f, -16.6f, 0.5f, -0.5f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        g[3 * i + 1] = edge[i];
    for (int v = 0; v < JLM_K_NVARIANT; v++) {
        jlm_k_cpu tab;
        if (jlm_k_cpu_table(v, &tab, NULL) != 0)
            continue;
        cr_assert(tab.swiglu, "%s: no swiglu", tab.name);
        const uint64_t lens[] = {N, N - 7, 15, 1};
        for (int l = 0; l < 4; l++) {
            memset(got, 0xa5, sizeof got);
            jlm_k_swiglu(want, g, u, lens[l]);
            tab.swiglu(got, g, u, lens[l]);
            for (uint64_t i = 0; i < lens[l]; i++)
                cr_assert(!memcmp(&got[i], &want[i], 4) || (isnan(got[i]) && isnan(want[i])),
                          "%s, %llu values: element %llu (gate %g, up %g): %.9g, reference %.9g", tab.name,
                          (unsigned long long)lens[l], (unsigned long long)i, (double)g[i], (double)u[i],
                          (double)got[i], (double)want[i]);
            cr_assert(lens[l] == N || !memcmp(&got[lens[l]], &(uint32_t){0xa5a5a5a5u}, 4),
                      "%s: wrote past %llu values", tab.name, (unsigned long long)lens[l]);
        }
    }
}

/* ---------------------------------------------------------------- batched attention (jlm_k_fattn) */

/* One case: n rows at positions pos0.., KV cache of npos positions and NKVH
 * KV heads, group query heads each, keys [lo, hi) per row as the engine
 * builds them (causal, window, bidir_end), or lo = hi (all masked) where
 * empty_every divides the row. */
typedef struct fa_case {
    uint32_t hd, hdv, group, n, pos0, window, bidir_end;
    int sinks, kv_f16, empty_every;
    float softcap, qscale;   /* qscale: query magnitude (large logits) */
} fa_case;

enum { FA_NKVH = 2 };

typedef struct fa_data {
    fa_case c;
    uint32_t npos, nh;
    float *q, *k32, *v32, *sink, *out_tok;
    uint16_t *k16, *v16;
    uint32_t *lo, *hi;
} fa_data;

static void fa_make(fa_data *d, const fa_case *c, uint64_t seed)
{
    memset(d, 0, sizeof *d);
    d->c = *c;
    d->nh = FA_NKVH * c->group;
    d->npos = c->pos0 + c->n;
    if (c->bidir_end > d->npos) d->npos = c->bidir_end;
    uint64_t nk = (uint64_t)d->npos * FA_NKVH;
    d->q = malloc((size_t)c->n * d->nh * c->hd * sizeof(float));
    d->k32 = malloc(nk * c->hd * sizeof(float));
    d->v32 = malloc(nk * c->hdv * sizeof(float));
    d->k16 = malloc(nk * c->hd * sizeof(uint16_t));
    d->v16 = malloc(nk * c->hdv * sizeof(uint16_t));
    d->sink = malloc(d->nh * sizeof(float));
    d->lo = malloc(c->n * sizeof(uint32_t));
    d->hi = malloc(c->n * sizeof(uint32_t));
    d->out_tok = malloc((size_t)c->n * d->nh * c->hdv * sizeof(float));
    cr_assert(d->q && d->k32 && d->v32 && d->k16 && d->v16 && d->sink && d->lo && d->hi && d->out_tok);
    for (uint64_t i = 0; i < (uint64_t)c->n * d->nh * c->hd; i++)
        d->q[i] = c->qscale * rng_unit(&seed);
    for (uint64_t i = 0; i < nk * c->hd; i++) {
        /* keys grow along the positions: the running max keeps moving */
        float x = rng_unit(&seed) * (1.0f + (float)(i / (FA_NKVH * c->hd)) / 64.0f);
        d->k16[i] = jlm_k_f32_to_fp16(x);
        d->k32[i] = c->kv_f16 ? jlm_k_fp16_to_f32(d->k16[i]) : x;
    }
    for (uint64_t i = 0; i < nk * c->hdv; i++) {
        float x = 3.0f * rng_unit(&seed);
        d->v16[i] = jlm_k_f32_to_fp16(x);
        d->v32[i] = c->kv_f16 ? jlm_k_fp16_to_f32(d->v16[i]) : x;
    }
    for (uint32_t h = 0; h < d->nh; h++)
        d->sink[h] = 2.0f * rng_unit(&seed);
    for (uint32_t r = 0; r < c->n; r++) {
        uint32_t pos = c->pos0 + r;
        d->hi[r] = pos < c->bidir_end ? c->bidir_end : pos + 1;
        d->lo[r] = c->window && pos >= c->window ? pos - c->window + 1 : 0;
        if (c->empty_every && r % c->empty_every == 0)
            d->lo[r] = d->hi[r];
    }
    /* the per-token path: jlm_k_attn_head over keys [0, hi) with a -inf mask
     * outside [lo, hi), on the values the cache holds (F16 widened) */
    float *mask = malloc(d->npos * sizeof(float)), *sc = malloc(d->npos * sizeof(float));
    cr_assert(mask && sc);
    for (uint32_t r = 0; r < c->n; r++) {
        for (uint32_t j = 0; j < d->hi[r]; j++)
            mask[j] = j < d->lo[r] ? -INFINITY : 0.0f;
        for (uint32_t h = 0; h < d->nh; h++) {
            uint32_t g = h / c->group;
            jlm_k_attn a = {.head_dim = c->hd, .head_dim_v = c->hdv, .k_stride = FA_NKVH * c->hd,
                            .v_stride = FA_NKVH * c->hdv, .scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap,
                            .has_sink = c->sinks, .sink = d->sink[h], .mask = mask};
            jlm_k_attn_head(&a, d->q + ((size_t)r * d->nh + h) * c->hd, d->k32 + (size_t)g * c->hd,
                            d->v32 + (size_t)g * c->hdv, d->hi[r], sc, d->out_tok + ((size_t)r * d->nh + h) * c->hdv);
        }
    }
    free(mask);
    free(sc);
}

static void fa_free(fa_data *d)
{
    free(d->q); free(d->k32); free(d->v32); free(d->k16); free(d->v16);
    free(d->sink); free(d->lo); free(d->hi); free(d->out_tok);
}

/* The cache of d (rows of FA_NKVH heads) as the engine keeps it: head by
 * head, each its npos positions (element size es). */
static void *fa_head_major(const fa_data *d, const void *src, uint32_t dim, size_t es)
{
    uint8_t *dst = malloc((size_t)d->npos * FA_NKVH * dim * es);
    cr_assert(dst);
    for (uint32_t g = 0; g < FA_NKVH; g++)
        for (uint32_t j = 0; j < d->npos; j++)
            memcpy(dst + (((size_t)g * d->npos + j) * dim) * es,
                   (const uint8_t *)src + (((size_t)j * FA_NKVH + g) * dim) * es, dim * es);
    return dst;
}

/* The keys of d as k_tiled tiles (kernels.h), head by head, each its
 * positions rounded up to whole tiles (the padding NaN: read, never used). */
static void *fa_key_tiles(const fa_data *d, const void *src, size_t es, uint32_t *npad)
{
    uint32_t hd = d->c.hd, bk = JLM_K_FATTN_BK;
    *npad = (d->npos + bk - 1) / bk * bk;
    uint8_t *dst = malloc((size_t)*npad * FA_NKVH * hd * es);
    cr_assert(dst);
    for (size_t i = 0; i < (size_t)*npad * FA_NKVH * hd; i++) {
        if (es == 4) ((float *)dst)[i] = NAN;
        else ((uint16_t *)dst)[i] = 0x7e00;   /* F16 NaN */
    }
    for (uint32_t g = 0; g < FA_NKVH; g++)
        for (uint32_t j = 0; j < d->npos; j++)
            for (uint32_t i = 0; i < hd; i++)
                memcpy(dst + ((size_t)g * *npad * hd + (size_t)(j / bk) * bk * hd + (size_t)i * bk + j % bk) * es,
                       (const uint8_t *)src + (((size_t)j * FA_NKVH + g) * hd + i) * es, es);
    return dst;
}

/* fn over every KV head and the rows in tiles of `tile` (<= BQ) rows; hm 1:
 * on a head-major copy of the cache (kh_stride = the positions); hm 2: the
 * same with the keys in k_tiled tiles (the engine's cache) */
static void fa_run_at(const fa_data *d, jlm_k_fattn_fn fn, uint32_t tile, float *out, int hm)
{
    const fa_case *c = &d->c;
    jlm_k_fattn p = {.head_dim = c->hd, .head_dim_v = c->hdv, .group = c->group, .q_stride = (uint64_t)d->nh * c->hd,
                     .o_stride = (uint64_t)d->nh * c->hdv, .k_stride = FA_NKVH * c->hd, .v_stride = FA_NKVH * c->hdv,
                     .kh_stride = c->hd, .vh_stride = c->hdv,
                     .kv_f16 = c->kv_f16, .scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap,
                     .sinks = c->sinks ? d->sink : NULL, .lo = d->lo, .hi = d->hi};
    if (hm) {
        p.k_stride = c->hd;
        p.v_stride = c->hdv;
        p.kh_stride = (uint64_t)d->npos * c->hd;
        p.vh_stride = (uint64_t)d->npos * c->hdv;
    }
    size_t nf = jlm_k_fattn_scratch_floats(c->hd, c->hdv, c->group);
    float *scratch = malloc(nf * sizeof(float));
    cr_assert(scratch);
    for (size_t i = 0; i < (size_t)c->n * d->nh * c->hdv; i++)
        out[i] = NAN;   /* every element must be written */
    size_t es = c->kv_f16 ? 2 : 4;
    const void *k = c->kv_f16 ? (const void *)d->k16 : (const void *)d->k32;
    const void *v = c->kv_f16 ? (const void *)d->v16 : (const void *)d->v32;
    uint32_t npad = 0;
    void *kh = hm == 2 ? fa_key_tiles(d, k, es, &npad) : hm ? fa_head_major(d, k, c->hd, es) : NULL;
    void *vh = hm ? fa_head_major(d, v, c->hdv, es) : NULL;
    if (hm == 2) {
        p.k_tiled = 1;
        p.kh_stride = (uint64_t)npad * c->hd;
    }
    for (uint32_t g = 0; g < FA_NKVH; g++)
        for (uint32_t r0 = 0; r0 < c->n; r0 += tile)
            fn(&p, d->q, hm ? kh : k, hm ? vh : v, out, g, r0, r0 + tile < c->n ? r0 + tile : c->n, scratch);
    free(kh);
    free(vh);
    free(scratch);
}

static void fa_run(const fa_data *d, jlm_k_fattn_fn fn, uint32_t tile, float *out)
{
    fa_run_at(d, fn, tile, out, 0);
}

static const fa_case FA_CASES[] = {
    /* hd hdv grp  n pos0 win bidir sinks f16 empty cap  qscale */
    {64, 64, 4, 1, 0, 0, 0, 0, 0, 0, 0, 1},          /* one query, one key */
    {64, 64, 4, 1, 200, 0, 0, 0, 0, 0, 0, 1},        /* decode: one query, 201 keys */
    {64, 64, 4, 128, 0, 0, 0, 0, 0, 0, 0, 1},        /* a prefill batch from 0 */
    {64, 64, 4, 33, 70, 0, 0, 1, 0, 0, 0, 1},        /* tile remainder (32 + 1), sinks */
    {64, 64, 4, 45, 10, 0, 0, 0, 1, 0, 0, 1},        /* F16 cache */
    {128, 128, 2, 40, 0, 32, 0, 0, 0, 0, 0, 1},      /* window = the key tile */
    {64, 64, 8, 50, 20, 1, 0, 1, 1, 0, 0, 1},        /* window 1: only itself, sinks, f16 */
    {64, 64, 4, 37, 90, 33, 0, 0, 0, 0, 0, 1},       /* window edge across tiles */
    {256, 256, 1, 20, 5, 0, 0, 0, 0, 0, 0, 1},       /* gemma3-wide heads (128-dim value chunks) */
    {24, 40, 3, 19, 3, 0, 0, 1, 1, 0, 0, 1},         /* dims off the vector width */
    {24, 40, 4, 19, 3, 0, 0, 1, 1, 0, 0, 1},         /* the same, four heads a run (avx512 pv64x4, masked) */
    {128, 96, 4, 33, 40, 0, 0, 0, 0, 0, 0, 1},       /* values 64 + 32: a whole and a masked chunk, four heads */
    {16, 20, 4, 9, 5, 0, 0, 0, 0, 0, 0, 1},          /* values off the 8-lane width: avx2's scalar tail, two heads */
    {64, 64, 4, 1, 300, 0, 0, 0, 1, 0, 0, 1},        /* decode, F16: avx512 reads the F16 tile and values in place */
    {24, 40, 4, 1, 70, 0, 0, 1, 1, 0, 0, 1},         /* the same with masked chunks and sinks */
    {128, 96, 2, 1, 50, 0, 0, 0, 1, 0, 0, 1},        /* decode, F16, two heads: pv64 on F16, 64 + 32 dims */
    {16, 20, 4, 1, 40, 0, 0, 0, 1, 0, 0, 1},         /* decode, F16, values off the 8-lane width (avx2's tail) */
    {8, 8, 1, 30, 0, 0, 0, 0, 0, 0, 0, 1},           /* stories260K heads */
    {64, 64, 4, 40, 0, 0, 24, 0, 0, 0, 0, 1},        /* image rows 0..23 bidirectional */
    {64, 64, 4, 40, 8, 6, 30, 1, 0, 0, 0, 1},        /* image + window + sinks */
    {64, 64, 4, 35, 0, 0, 0, 0, 0, 3, 0, 1},         /* every third row all masked */
    {64, 64, 4, 35, 4, 0, 0, 1, 1, 2, 0, 1},         /* all masked with sinks: 0 too */
    {64, 64, 4, 30, 60, 0, 0, 0, 0, 0, 5.0f, 4},     /* softcap */
    {64, 64, 4, 64, 40, 0, 0, 1, 0, 0, 0, 40},       /* large logits (|s| ~ 10^3) */
};

Test(kernels, fattn_stays_within_its_bound_of_the_per_token_attention_and_variants_equal_ref, .timeout = 60)
{
    double worst = 0;   /* largest error seen, in units of its bound */
    for (size_t ci = 0; ci < sizeof FA_CASES / sizeof FA_CASES[0]; ci++) {
        const fa_case *c = &FA_CASES[ci];
        fa_data d;
        fa_make(&d, c, 1000 + ci);
        size_t no = (size_t)c->n * d.nh * c->hdv;
        float *ref = malloc(no * sizeof(float)), *got = malloc(no * sizeof(float));
        cr_assert(ref && got);
        fa_run(&d, jlm_k_fattn_ref, JLM_K_FATTN_BQ, ref);
        for (uint32_t r = 0; r < c->n; r++) {
            uint32_t nvis = d.hi[r] - d.lo[r];
            for (uint32_t h = 0; h < d.nh; h++) {
                const float *a = ref + ((size_t)r * d.nh + h) * c->hdv, *b = d.out_tok + ((size_t)r * d.nh + h) * c->hdv;
                if (!nvis) {
                    for (uint32_t i = 0; i < c->hdv; i++)
                        cr_assert(a[i] == 0.0f, "case %zu row %u: all keys masked: expected 0 got %g", ci, r, (double)a[i]);
                    continue;
                }
                double vmax = 0;
                for (uint32_t j = d.lo[r]; j < d.hi[r]; j++)
                    for (uint32_t i = 0; i < c->hdv; i++)
                        vmax = fmax(vmax, fabs(d.v32[((size_t)j * FA_NKVH + h / c->group) * c->hdv + i]));
                double bound = JLM_K_TOL_FATTN(nvis) * vmax;
                for (uint32_t i = 0; i < c->hdv; i++) {
                    double e = fabs((double)a[i] - b[i]);
                    cr_assert(e <= bound, "case %zu row %u head %u dim %u: fattn %.9g per-token %.9g (err %g > %g)", ci,
                              r, h, i, (double)a[i], (double)b[i], e, bound);
                    if (e / bound > worst) worst = e / bound;
                }
            }
        }
        /* a row's result does not depend on the rows it is tiled with */
        for (uint32_t tile = 1; tile <= 7; tile += 6) {
            fa_run(&d, jlm_k_fattn_ref, tile, got);
            cr_assert(!memcmp(ref, got, no * sizeof(float)), "case %zu: ref in tiles of %u rows differs", ci, tile);
        }
        /* every variant, on the cache as rows, as heads and as heads with the
         * keys in tiles (the engine's), gives the reference's bits */
        jlm_k_fattn_fn vfn[JLM_K_NVARIANT] = {jlm_k_fattn_ref, jlm_k_fattn_avx2, jlm_k_fattn_avx512};
        for (int v = 0; v < JLM_K_NVARIANT; v++) {
            if (!jlm_k_cpu_has(v))
                continue;
            for (int hm = 0; hm < 3; hm++)
                for (uint32_t tile = 5; tile <= JLM_K_FATTN_BQ; tile += JLM_K_FATTN_BQ - 5) {
                    if (v == 0 && !hm)
                        continue;   /* ref on rows: the tiling check above */
                    fa_run_at(&d, vfn[v], tile, got, hm);
                    for (size_t i = 0; i < no; i++)
                        cr_assert(!memcmp(&ref[i], &got[i], sizeof(float)),
                                  "case %zu %s (tiles of %u, cache by %s): [%zu] %.9g, ref %.9g", ci, VNAME[v], tile,
                                  hm == 2 ? "heads, keys tiled" : hm ? "heads" : "rows", i, (double)got[i], (double)ref[i]);
                }
        }
        free(ref);
        free(got);
        fa_free(&d);
    }
    cr_log_info("fattn vs per-token: worst error %.3f of the bound", worst);
}

Test(kernels, fattn_exp_is_within_2_ulp_of_expf)
{
    uint64_t seed = 5;
    for (int i = 0; i < 200000; i++) {
        float x = i < 4 ? (float[]){0.0f, -0.0f, -87.0f, -1e-30f}[i] : -87.0f * (rng_unit(&seed) + 1.0f) / 2.0f;
        float a = jlm_k_fattn_exp(x), b = expf(x);
        double ulp = ldexp(1.0, ilogb(b) - 23);
        cr_assert(fabs((double)a - b) <= 2 * ulp, "exp(%.9g): %.9g, expf %.9g", (double)x, (double)a, (double)b);
    }
    cr_assert(jlm_k_fattn_exp(-INFINITY) == 0.0f && jlm_k_fattn_exp(-88.0f) == 0.0f);
    cr_assert(isnan(jlm_k_fattn_exp(NAN)));
}
