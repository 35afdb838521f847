/* test_cuda.c - suite `cuda`: the CUDA kernels' per-thread bodies
 * (kernels/cuda/body.h), run by the host harness over the kernels' grids,
 * against the CPU reference kernels on random data and edge shapes. This is
 * what CI checks of the CUDA backend without a GPU: indexing into the packed
 * planes, the grid split, the reduction phases and the arithmetic. Launches
 * and device memory are checked by build/jlm-cuda-check on a GPU machine
 * (bench/gpu-check.sh); the probe test here skips with one line without one.
 * The engine's CUDA backend (engine/backend_cu.c: frames, staging, streams,
 * splits) runs here on the strict host emulation of kernels/cuda/rt.h, whose
 * own strictness is tested first. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model_int.h"
#include "kernels/cpu/tolerances.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/rt.h"
#include "tests/backend_matrix.h"
#include "tests/cuda/gen.h"
#include "tests/testutil.h"

/* ---------------------------------------------------------------- matvec: bit-identical to ref */

static void check_matvec(uint8_t type, uint64_t k, uint64_t rows, uint64_t seed)
{
    gen_mat g;
    cr_assert_eq(gen_mat_make(&g, type, k, rows, &seed), 0);
    cr_assert_eq(jlm_k_mat_check(&g.m, NULL), 0, "type %u k %llu", type, (unsigned long long)k);
    float *x = malloc(k * 4), *y0 = malloc(rows * 4), *y1 = malloc(rows * 4);
    void *abuf = malloc(jlm_k_act_q8_bytes(k));
    gen_floats(x, k, 2.0f, &seed);
    jlm_act_q8 a, *ap = NULL;
    if (k % 32 == 0) {                         /* float types may have any k */
        cr_assert_eq(jlm_k_act_q8_init(&a, abuf, k, NULL), 0);
        jlm_k_quantize_act(x, &a);
        ap = &a;
    }
    jlm_k_matvec_ref(&g.m, x, ap, y0, 0, rows);
    /* the launcher's warp count, then others: the work split moves, the
     * sum's order must not */
    static const unsigned WARPS[] = {0, 2, 3, 8, 16};
    jlm_cu_mat cm;
    jlm_cu_mat_from(&g.m, &cm);
    jlm_cu_act ca = ap ? (jlm_cu_act){a.k, a.q, a.d, a.sum16} : (jlm_cu_act){0, NULL, NULL, NULL};
    for (unsigned w = 0; w < sizeof WARPS / sizeof WARPS[0]; w++) {
        memset(y1, 0xff, rows * 4);
        if (WARPS[w])
            jlm_cu_grid_matvec(&cm, x, &ca, y1, WARPS[w]);
        else
            jlm_cu_host_matvec(&g.m, x, ap, y1);
        for (uint64_t r = 0; r < rows; r++)
            cr_assert(memcmp(&y0[r], &y1[r], 4) == 0, "%s k %llu rows %llu warps %u: row %llu cuda %.9g ref %.9g",
                      jlm_fmt_type_traits(type)->name, (unsigned long long)k, (unsigned long long)rows, WARPS[w],
                      (unsigned long long)r, y1[r], y0[r]);
    }
    free(x), free(y0), free(y1), free(abuf);
    gen_mat_free(&g);
}

Test(cuda, matvec_every_type_bit_identical_to_ref)
{
    /* rows: one, odd (shared d words of Q4_0/Q8_0/Q5_0/MXFP4 half-filled),
     * one past a block of 32 rows, several blocks */
    static const uint64_t ROWS[] = {1, 3, 7, 33, 300};
    for (int i = 0; i < 12; i++) {
        uint8_t type = GEN_TYPES[i];
        const jlm_type_traits *t = jlm_fmt_type_traits(type);
        uint64_t super = t->is_float ? 32 : (uint64_t)t->sub * t->super_sub;
        for (unsigned ks = 1; ks <= 3; ks++)
            for (unsigned ri = 0; ri < sizeof ROWS / sizeof ROWS[0]; ri++)
                check_matvec(type, super * ks * (super < 256 ? 2 : 1), ROWS[ri], 77 + i * 31 + ks * 7 + ri);
    }
}

/* Rows of more than one chunk of JLM_CU_MV_CHUNK terms, the last one partial:
 * the grid's two buffers and its in-order add across chunks. */
Test(cuda, matvec_rows_of_several_chunks_bit_identical_to_ref)
{
    for (int i = 0; i < 12; i++) {
        uint8_t type = GEN_TYPES[i];
        const jlm_type_traits *t = jlm_fmt_type_traits(type);
        uint64_t k = t->is_float ? 2 * JLM_CU_MV_CHUNK + 29 : 32 * (2 * JLM_CU_MV_CHUNK + 8);
        check_matvec(type, k, 45, 900 + i);
    }
}

Test(cuda, matvec_float_types_odd_k)
{
    check_matvec(JLM_T_F32, 1, 5, 1);
    check_matvec(JLM_T_F16, 33, 130, 2);
    check_matvec(JLM_T_BF16, 7, 1, 3);
}

/* ---------------------------------------------------------------- activation quantization */

Test(cuda, quantize_bit_identical_with_edge_blocks)
{
    uint64_t k = 256, seed = 5;
    float x[256];
    gen_floats(x, k, 3.0f, &seed);
    for (int i = 32; i < 64; i++)
        x[i] = 0.0f;                   /* all-zero block: d 0, q 0 */
    x[70] = INFINITY;                  /* inf block: d NaN */
    x[100] = NAN;
    x[130] = 1e30f;                    /* one huge value */
    x[160] = -0.5f * 127.0f / 127.0f;  /* halves */
    void *b0 = malloc(jlm_k_act_q8_bytes(k)), *b1 = malloc(jlm_k_act_q8_bytes(k));
    jlm_act_q8 a0, a1;
    cr_assert_eq(jlm_k_act_q8_init(&a0, b0, k, NULL), 0);
    cr_assert_eq(jlm_k_act_q8_init(&a1, b1, k, NULL), 0);
    jlm_k_quantize_act(x, &a0);
    jlm_cu_host_quantize(x, &a1);
    cr_assert(memcmp(a0.q, a1.q, k) == 0);
    cr_assert(memcmp(a0.d, a1.d, k / 32 * 4) == 0);
    cr_assert(memcmp(a0.sum16, a1.sum16, k / 16 * 2) == 0);
    cr_assert(isnan(a1.d[2]) && isnan(a1.d[3]) && a1.d[1] == 0.0f);
    free(b0), free(b1);
}

/* ---------------------------------------------------------------- norms and softmax */

static void assert_close(const float *want, const float *got, uint64_t n, double tol, const char *what)
{
    for (uint64_t i = 0; i < n; i++) {
        double err = fabs((double)want[i] - (double)got[i]), mag = fmax(1.0, fabs((double)want[i]));
        cr_assert(err <= tol * mag, "%s [%llu]: cuda %.9g ref %.9g", what, (unsigned long long)i, got[i], want[i]);
    }
}

Test(cuda, rmsnorm_matches_cpu)
{
    static const uint64_t N[] = {1, 7, 255, 256, 257, 4096};
    uint64_t seed = 9;
    for (unsigned c = 0; c < sizeof N / sizeof N[0]; c++) {
        uint64_t n = N[c];
        float *x = malloc(n * 4), *w = malloc(n * 4), *o0 = malloc(n * 4), *o1 = malloc(n * 4);
        gen_floats(x, n, 4.0f, &seed);
        gen_floats(w, n, 1.5f, &seed);
        for (int ww = 0; ww < 2; ww++) {
            jlm_k_rmsnorm(o0, x, ww ? w : NULL, n, 1e-6f);
            jlm_cu_host_rmsnorm(o1, x, ww ? w : NULL, n, 1e-6f);
            assert_close(o0, o1, n, JLM_K_TOL_NORM, "rmsnorm");
        }
        memcpy(o1, x, n * 4);                  /* in place */
        jlm_cu_host_rmsnorm(o1, o1, w, n, 1e-5f);
        jlm_k_rmsnorm(o0, x, w, n, 1e-5f);
        assert_close(o0, o1, n, JLM_K_TOL_NORM, "rmsnorm in place");
        free(x), free(w), free(o0), free(o1);
    }
}

Test(cuda, layernorm_matches_cpu)
{
    static const uint64_t N[] = {1, 5, 256, 1000};
    uint64_t seed = 17;
    for (unsigned c = 0; c < sizeof N / sizeof N[0]; c++) {
        uint64_t n = N[c];
        float *x = malloc(n * 4), *w = malloc(n * 4), *b = malloc(n * 4), *o0 = malloc(n * 4), *o1 = malloc(n * 4);
        gen_floats(x, n, 4.0f, &seed);
        for (uint64_t i = 0; i < n; i++)
            x[i] += 3.0f;                      /* a non-zero mean */
        gen_floats(w, n, 1.5f, &seed);
        gen_floats(b, n, 1.0f, &seed);
        for (int v = 0; v < 3; v++) {
            jlm_k_layernorm(o0, x, v ? w : NULL, v == 2 ? b : NULL, n, 1e-5f);
            memcpy(o1, x, n * 4);              /* in place */
            jlm_cu_host_layernorm(o1, o1, v ? w : NULL, v == 2 ? b : NULL, n, 1e-5f);
            assert_close(o0, o1, n, JLM_K_TOL_NORM, "layernorm");
        }
        free(x), free(w), free(b), free(o0), free(o1);
    }
}

Test(cuda, softmax_matches_cpu)
{
    static const uint64_t N[] = {1, 3, 256, 300, 5000};
    uint64_t seed = 11;
    for (unsigned c = 0; c < sizeof N / sizeof N[0]; c++) {
        uint64_t n = N[c];
        float *a = malloc(n * 4), *b = malloc(n * 4);
        gen_floats(a, n, 20.0f, &seed);
        if (n > 2)
            a[1] = -INFINITY;                  /* a masked entry */
        memcpy(b, a, n * 4);
        jlm_k_softmax(a, n);
        jlm_cu_host_softmax(b, n);
        assert_close(a, b, n, JLM_K_TOL_SOFTMAX, "softmax");
        free(a), free(b);
    }
}

/* ---------------------------------------------------------------- rope */

static void check_rope(const jlm_k_rope *p, uint32_t n_head, uint32_t head_dim, int64_t pos, uint64_t seed)
{
    uint64_t n = (uint64_t)n_head * head_dim;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    gen_floats(a, n, 1.0f, &seed);
    memcpy(b, a, n * 4);
    jlm_k_rope_apply(p, a, n_head, head_dim, pos);
    jlm_cu_host_rope(p, b, n_head, head_dim, pos);
    assert_close(a, b, n, JLM_K_TOL_ROPE, "rope");
    free(a), free(b);
}

Test(cuda, rope_variants_match_cpu)
{
    static const int64_t POS[] = {0, 1, 37, 100000};
    float ff[32];
    for (int i = 0; i < 32; i++)
        ff[i] = 1.0f + 0.25f * (float)i;
    for (unsigned pi = 0; pi < 4; pi++) {
        jlm_k_rope p;
        jlm_k_rope_defaults(&p, 64, 10000.0f);
        check_rope(&p, 4, 64, POS[pi], 1 + pi);
        p.neox = 1;
        check_rope(&p, 3, 64, POS[pi], 2 + pi);
        jlm_k_rope_defaults(&p, 32, 500000.0f);   /* partial rotation: dims 32..79 copied */
        p.freq_factors = ff;
        check_rope(&p, 2, 80, POS[pi], 3 + pi);
        jlm_k_rope_defaults(&p, 64, 10000.0f);    /* YaRN */
        p.ext_factor = 1.0f;
        p.freq_scale = 0.25f;
        p.orig_ctx = 4096;
        p.neox = 1;
        check_rope(&p, 2, 64, POS[pi], 4 + pi);
    }
}

/* ---------------------------------------------------------------- element-wise */

Test(cuda, activations_bit_identical_to_cpu)
{
    enum { N = 1000 };
    float a[N], b[N], o0[N], o1[N];
    uint64_t seed = 13;
    gen_floats(a, N, 12.0f, &seed);
    gen_floats(b, N, 12.0f, &seed);
    a[0] = -10.0f, a[1] = 10.0f, a[2] = 0.0f, a[3] = -INFINITY;
#define CHECK(op, call, bb, s, lim)                                            \
    do {                                                                       \
        call;                                                                  \
        jlm_cu_host_elem(op, o1, a, bb, N, s, lim);                            \
        for (int i = 0; i < N; i++)                                            \
            cr_assert(memcmp(&o0[i], &o1[i], 4) == 0, #op " [%d] %.9g vs %.9g", i, o1[i], o0[i]); \
    } while (0)
    CHECK(JLM_CU_SILU, jlm_k_silu(o0, a, N), NULL, 0, 0);
    CHECK(JLM_CU_GELU, jlm_k_gelu(o0, a, N), NULL, 0, 0);
    CHECK(JLM_CU_GELU_FP16, jlm_k_gelu_fp16(o0, a, N), NULL, 0, 0);
    CHECK(JLM_CU_GELU_QUICK, jlm_k_gelu_quick(o0, a, N), NULL, 0, 0);
    CHECK(JLM_CU_SWIGLU, jlm_k_swiglu(o0, a, b, N), b, 0, 0);
    CHECK(JLM_CU_SWIGLU_OAI, jlm_k_swiglu_oai(o0, a, b, N, 1.702f, 7.0f), b, 1.702f, 7.0f);
    CHECK(JLM_CU_ADD, jlm_k_add(o0, a, b, N), b, 0, 0);
    CHECK(JLM_CU_MUL, jlm_k_mul(o0, a, b, N), b, 0, 0);
    CHECK(JLM_CU_SCALE, jlm_k_scale(o0, a, 0.125f, N), NULL, 0.125f, 0);
#undef CHECK
}

/* ---------------------------------------------------------------- decode attention, GQA */

typedef struct attn_case {
    uint32_t n_head, n_head_kv, head_dim, head_dim_v;
    uint64_t n_kv;
    float    softcap;
    int      sinks, mask;   /* mask: 0 none, 1 sliding window of 16, 2 all hidden */
} attn_case;

/* kt, vt: the keys' and the values' cache type (KV_F32, KV_F16, KV_Q8_0):
 * the kernel reads them as stored (jlm_kv_put_row's rows; Q8_0 from byte 2,
 * its blocks across words, as a cache row at an odd position starts), the
 * CPU attends the same rows widened, as jlm_kv_get_row gives them. */
static void check_attn(attn_case c, int kt, int vt, uint64_t seed)
{
    uint64_t kvn = (uint64_t)c.n_head_kv * c.n_kv;
    float *q = malloc((size_t)c.n_head * c.head_dim * 4), *k = malloc(kvn * c.head_dim * 4);
    float *v = malloc(kvn * c.head_dim_v * 4), *mask = malloc(c.n_kv * 4), sinks[64];
    float *scores = malloc((size_t)c.n_head * c.n_kv * 4), *scratch = malloc(c.n_kv * 4);
    float *o0 = malloc((size_t)c.n_head * c.head_dim_v * 4), *o1 = malloc((size_t)c.n_head * c.head_dim_v * 4);
    gen_floats(q, (uint64_t)c.n_head * c.head_dim, 2.0f, &seed);
    gen_floats(k, kvn * c.head_dim, 2.0f, &seed);
    gen_floats(v, kvn * c.head_dim_v, 1.0f, &seed);
    gen_floats(sinks, 64, 3.0f, &seed);
    for (uint64_t j = 0; j < c.n_kv; j++)
        mask[j] = c.mask == 2 || (c.mask == 1 && j + 16 < c.n_kv) ? -INFINITY : 0.0f;
    /* the KV cache as (kv head, position, dim): each whole as one row of its type */
    uint32_t kn = (uint32_t)(kvn * c.head_dim), vn = (uint32_t)(kvn * c.head_dim_v);
    uint64_t ko = kt == KV_Q8_0 ? 2 : 0, vo = vt == KV_Q8_0 ? 2 : 0;
    uint8_t *kc = malloc(ko + jlm_kv_row_bytes(kt, kn)), *vc = malloc(vo + jlm_kv_row_bytes(vt, vn));
    jlm_kv_put_row(kt, kc + ko, k, kn);
    jlm_kv_get_row(kt, kc + ko, k, kn);
    jlm_kv_put_row(vt, vc + vo, v, vn);
    jlm_kv_get_row(vt, vc + vo, v, vn);
    jlm_cu_attn p = {c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.n_kv, c.head_dim, c.head_dim_v,
                     c.n_kv * c.head_dim, c.n_kv * c.head_dim_v, 1.0f / sqrtf((float)c.head_dim),
                     c.softcap, c.sinks ? sinks : NULL, c.mask ? mask : NULL, kt, vt, NULL, 0, 0};
    jlm_cu_host_attn(&p, q, kc + ko, vc + vo, scores, o1);
    for (uint32_t h = 0; h < c.n_head; h++) {
        uint32_t g = h / (c.n_head / c.n_head_kv);
        jlm_k_attn cp = {c.head_dim, c.head_dim_v, c.head_dim, c.head_dim_v, p.scale, c.softcap,
                         c.sinks, sinks[h], p.mask};
        jlm_k_attn_head(&cp, q + h * c.head_dim, k + g * p.k_head_stride, v + g * p.v_head_stride,
                        c.n_kv, scratch, o0 + h * c.head_dim_v);
        assert_close(scratch, scores + h * c.n_kv, c.n_kv, JLM_K_TOL_SOFTMAX, "attn probabilities");
    }
    assert_close(o0, o1, (uint64_t)c.n_head * c.head_dim_v, JLM_K_TOL_SOFTMAX, "attn out");
    free(q), free(k), free(v), free(mask), free(scores), free(scratch), free(o0), free(o1), free(kc), free(vc);
}

static const attn_case ATTN_CASES[] = {
        {8, 2, 64, 64, 1, 0, 0, 0},        /* first token */
        {8, 2, 64, 64, 17, 0, 0, 0},
        {8, 8, 32, 32, 300, 0, 0, 1},      /* MHA, sliding window */
        {8, 1, 64, 64, 1000, 0, 1, 0},     /* MQA with sinks */
        {4, 2, 128, 64, 257, 30.0f, 0, 0}, /* softcap, head_dim_v != head_dim */
        {4, 2, 64, 64, 40, 0, 0, 2},       /* everything masked: out 0 */
        {4, 2, 64, 64, 40, 0, 1, 2},       /* everything masked but the sink */
};

Test(cuda, attention_gqa_matches_cpu)
{
    for (unsigned i = 0; i < sizeof ATTN_CASES / sizeof ATTN_CASES[0]; i++)
        check_attn(ATTN_CASES[i], KV_F32, KV_F32, 100 + i);
}

/* The same cases over an F16 cache (engine/exec_cu.c's with --kv f16): the
 * kernel widening the halves it reads gives the CPU's attention over the
 * same halves. */
Test(cuda, attention_over_an_f16_cache_matches_cpu)
{
    for (unsigned i = 0; i < sizeof ATTN_CASES / sizeof ATTN_CASES[0]; i++)
        check_attn(ATTN_CASES[i], KV_F16, KV_F16, 200 + i);
}

/* Over Q8_0 caches and keys and values of different types (engine/exec_cu.c's
 * with --kv q8_0, --cache-type-k / --cache-type-v): the kernel's blocks read
 * in place give the CPU's attention over the rows jlm_kv_get_row widens. */
Test(cuda, attention_over_q8_0_and_mixed_caches_matches_cpu)
{
    static const int KV[][2] = {{KV_Q8_0, KV_Q8_0}, {KV_Q8_0, KV_F16}, {KV_F32, KV_Q8_0},
                                {KV_F16, KV_Q8_0}, {KV_Q8_0, KV_F32}, {KV_F16, KV_F32}};
    for (unsigned t = 0; t < sizeof KV / sizeof KV[0]; t++)
        for (unsigned i = 0; i < sizeof ATTN_CASES / sizeof ATTN_CASES[0]; i++)
            check_attn(ATTN_CASES[i], KV[t][0], KV[t][1], 300 + 10 * t + i);
}

static jlm_cu_rt *emu_open(void);

/* A Q8_0 cache's rows (jlm_cu_k_kv_q8) are the CPU's Q8_0 cache's, bit for
 * bit (jlm_kv_put_row), from every byte of a word (a row at an odd position
 * starts mid-word), neighbours kept; through the emulated device's seam
 * too. The blocks: round(x / d)'s ties (amax 127: d 1; and amax times
 * (k + 1/2) / 127), random spreads from 1e-30 to 1e30, zero blocks, a single
 * non-zero, negative maxima, tiny maxima where d is denormal or 1/d
 * overflows (1e-36 to 1e-45), huge ones near FLT_MAX, Inf and NaN. */
Test(cuda, q8_0_rows_bit_identical_to_the_cpus_q8_0_cache)
{
    enum { NB = 1200, N = NB * 32 };
    uint64_t seed = 42, bytes = jlm_kv_row_bytes(KV_Q8_0, N);
    float *x = malloc(N * 4);
    static const float TINY[] = {1e-36f, 3.7e-37f, 3e-37f, 1e-37f, 1e-38f, 1.17e-38f, 5e-39f, 1e-40f, 1e-42f, 1e-44f,
                                 1.4e-45f};
    for (uint32_t b = 0; b < NB; b++) {
        float *xb = x + b * 32, mag = powf(10.0f, gen_unit(&seed) * 30.0f);
        int kind = (int)(b % 9);
        for (int i = 0; i < 32; i++)
            xb[i] = kind == 3 ? 0.0f : gen_unit(&seed) * mag;
        if (kind == 4)
            for (int i = 0; i < 32; i++)
                xb[i] = i == (int)(b % 32) ? -mag : 0.0f;
        if (kind <= 1)   /* ties after 1/d */
            for (int i = 1; i < 32; i++)
                xb[i] = mag * ((float)(int)(gen_unit(&seed) * 126.0f) + 0.5f) / 127.0f;
        if (kind <= 1)
            xb[0] = kind ? -mag : mag;
        if (kind == 2)   /* exact ties: amax 127, d 1 */
            for (int i = 0; i < 32; i++)
                xb[i] = i ? (float)((int)(gen_next(&seed) % 253) - 126) + (i % 2 ? 0.5f : -0.5f) : -127.0f;
        if (kind == 5)   /* tiny */
            for (int i = 0; i < 32; i++)
                xb[i] = TINY[(b / 9) % (sizeof TINY / sizeof TINY[0])] * gen_unit(&seed) * (i ? 1.0f : 0.0f) +
                        (i ? 0.0f : TINY[(b / 9) % (sizeof TINY / sizeof TINY[0])]);
        if (kind == 6)   /* huge */
            for (int i = 0; i < 32; i++)
                xb[i] = 3.4e38f * gen_unit(&seed);
        if (kind == 7)   /* Inf, NaN */
            xb[b % 32] = (b / 9) % 3 == 0 ? INFINITY : (b / 9) % 3 == 1 ? -INFINITY : NAN;
        if (kind == 8)
            xb[b % 32] = NAN;
    }
    uint8_t *want = malloc(bytes + 8), *got = malloc(bytes + 8);
    for (int off = 0; off < 4; off++) {
        memset(want, 0x5a, bytes + 8);
        memset(got, 0x5a, bytes + 8);
        jlm_kv_put_row(KV_Q8_0, want + off, x, N);
        jlm_cu_host_kv_q8(got + off, x, N);
        for (uint64_t i = 0; i < bytes + 8; i++)
            cr_assert_eq(got[i], want[i], "from byte %d: byte %llu (block %llu, x[0] %g): 0x%02x, the CPU's 0x%02x",
                         off, (unsigned long long)i, (unsigned long long)(i - off) / 34,
                         x[(i - off) / 34 * 32], got[i], want[i]);
    }
    /* the seam: rows at byte 2 of a device allocation, two launches (the second block starts mid-word) */
    jlm_cu_rt *r = emu_open();
    void *dx = NULL, *dc = NULL;
    cr_assert_eq(jlm_cu_rt_alloc(r, N * 4, &dx), 0);
    cr_assert_eq(jlm_cu_rt_alloc(r, bytes + 4, &dc), 0);
    memset(want, 0x5a, bytes + 4);
    memset(got, 0x5a, bytes + 4);
    jlm_kv_put_row(KV_Q8_0, want + 2, x, N);
    cr_assert_eq(jlm_cu_rt_h2d(r, dx, x, N * 4, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_h2d(r, dc, got, bytes + 4, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_kv_q8(r, (uint8_t *)dc + 2, dx, 32, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_kv_q8(r, (uint8_t *)dc + 36, (float *)dx + 32, N - 32, JLM_CU_S_COMPUTE), 0, "%s",
                 jlm_cu_rt_error(r));
    cr_assert_neq(jlm_cu_rt_kv_q8(r, (uint8_t *)dc + 2, dx, 33, JLM_CU_S_COMPUTE), 0, "33 floats: no whole block");
    cr_assert_neq(jlm_cu_rt_kv_q8(r, (uint8_t *)dc + 36, dx, N, JLM_CU_S_COMPUTE), 0, "past the allocation");
    cr_assert(strstr(jlm_cu_rt_error(r), "kernel: output"), "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_d2h(r, got, dc, bytes + 4, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert(!memcmp(got, want, bytes + 4), "the emulated device's rows differ from the CPU's");
    jlm_cu_rt_close(r);
    free(x), free(want), free(got);
}

/* An F16 cache's rows (jlm_cu_k_to_f16) are the CPU's F16 cache's, bit for
 * bit (jlm_kv_put_row: jlm_k_f32_to_fp16, nearest even): every half's value,
 * values halfway between neighbouring halves (ties to even) and a quarter
 * off them, the denormal-half range and its ties, around 65520 (overflow to
 * Inf), Inf, NaN payloads and random bit patterns of every exponent. */
Test(cuda, f16_rows_bit_identical_to_the_cpus_f16_cache)
{
    enum { N = 4 * 65536 + 16384 };
    float *x = malloc(N * 4);
    uint32_t *bits = (uint32_t *)x;
    uint16_t *h = malloc(N * 2);
    uint64_t seed = 38;
    for (uint32_t i = 0; i < 65536; i++) {
        x[i] = jlm_k_fp16_to_f32((uint16_t)i);
        float nx = jlm_k_fp16_to_f32((uint16_t)(i + 1));   /* the next half up in magnitude */
        x[65536 + i] = (i & 0x7fffu) < 0x7bffu ? x[i] + (nx - x[i]) / 2 : x[i];   /* a tie */
        x[2 * 65536 + i] = (i & 0x7fffu) < 0x7bffu ? x[i] + (nx - x[i]) / 4 : x[i];
        bits[3 * 65536 + i] = (uint32_t)gen_next(&seed);
    }
    for (uint32_t i = 0; i < 16384; i++) {
        uint32_t j = 4 * 65536 + i;
        bits[j] = i < 4096 ? 0x33000000u + i * 0x1000u + (i % 3 ? 0 : 0x800u)   /* denormal halves, ties */
                  : i < 8192 ? 0x477fe000u + (i - 4096) * 8u                     /* near 65520 */
                  : i < 8200 ? (i % 2 ? 0x7f800000u : 0xff800000u)               /* +-Inf */
                             : 0x7f800001u + (uint32_t)gen_next(&seed) % 0x7fffffu + (i % 2 ? 0x80000000u : 0);   /* NaN */
    }
    jlm_cu_host_to_f16(h, x, N);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(h[i], jlm_k_f32_to_fp16(x[i]), "f16 of 0x%08x: 0x%04x, the CPU's 0x%04x", bits[i], h[i],
                     jlm_k_f32_to_fp16(x[i]));
    free(x), free(h);
}

/* ---------------------------------------------------------------- MoE router and combine */

/* The router against jlm_k_moe_route: the same experts in the same order;
 * weights bit-identical where no softmax over all experts runs (gpt-oss) and
 * within the softmax tolerance otherwise (the tree's sum). Ties go to the
 * lower index on both. */
Test(cuda, moe_router_picks_the_cpus_experts)
{
    static const uint32_t NE[] = {8, 32, 60, 128, 256, 1000};
    uint64_t seed = 5;
    for (size_t c = 0; c < sizeof NE / sizeof NE[0]; c++) {
        uint32_t n = NE[c], nu = n >= 8 ? 8 : 2;
        float *lg = malloc(n * 4), *pr = malloc(n * 4), w0[8], w1[8];
        int32_t s0[8], s1[8];
        gen_floats(lg, n, 6.0f, &seed);
        if (n >= 32)
            lg[17] = lg[5];   /* a tie */
        for (int mode = 0; mode < 3; mode++) {
            float scale = mode == 1 ? 2.5f : 0.0f;
            jlm_k_moe_route(lg, n, nu, mode, scale, s0, w0);
            jlm_cu_host_moe_route(lg, n, nu, mode, scale, pr, s1, w1);
            cr_assert(!memcmp(s0, s1, nu * 4), "n %u mode %d: experts differ (first %d vs %d)", n, mode, s1[0], s0[0]);
            for (uint32_t s = 0; s < nu; s++)
                cr_assert(mode == 2 ? !memcmp(&w0[s], &w1[s], 4) : fabsf(w0[s] - w1[s]) <= JLM_K_TOL_SOFTMAX,
                          "n %u mode %d: weight %u %.9g vs %.9g", n, mode, s, w1[s], w0[s]);
        }
        free(lg);
        free(pr);
    }
}

Test(cuda, moe_combine_bit_identical_to_cpu)
{
    enum { NU = 6, N = 777 };
    static float ys[NU * N], x0[N], x1[N], w[NU];
    uint64_t seed = 9;
    gen_floats(ys, NU * N, 3.0f, &seed);
    gen_floats(x0, N, 3.0f, &seed);
    gen_floats(w, NU, 1.0f, &seed);
    memcpy(x1, x0, sizeof x0);
    const float *yp[NU];
    for (int s = 0; s < NU; s++)
        yp[s] = ys + s * N;
    jlm_k_moe_combine(x0, yp, w, NU, N);
    jlm_cu_host_moe_combine(x1, ys, w, NU, N);
    cr_assert(!memcmp(x0, x1, sizeof x0), "combine differs from jlm_k_moe_combine");
}

/* ---------------------------------------------------------------- the device probe */

Test(cuda, device_probe_reports_count_or_reason)
{
    jlm_cu_info in;
    jlm_cu_probe(&in);
    char line[512];
    jlm_cu_describe(line, sizeof line);
    cr_assert(strncmp(line, "cuda: ", 6) == 0, "%s", line);
    cr_assert(in.count >= 0);
    if (in.count == 0) {
        cr_assert(in.reason[0] != '\0', "count 0 without a reason");
        cr_skip_test("no CUDA device (%s); device tests run in build/jlm-cuda-check", in.reason);
    }
    cr_assert(in.name[0] != '\0' && in.mem_bytes > 0);
}

/* ---------------------------------------------------------------- the CLI */

Test(cuda, version_lists_the_cuda_backend)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s --version", tu_jlm());
    cr_assert_eq(tu_run(cmd, &out), 0);
    jlm_cu_info in;
    jlm_cu_probe(&in);
    cr_assert(strstr(out, "\ncuda: ") != NULL, "%s", out);
    if (in.built)
        cr_assert(strstr(out, "cuda: built (runtime ") != NULL, "%s", out);
    else
        cr_assert(strstr(out, "cuda: not built") != NULL, "%s", out);
    free(out);
}

Test(cuda, backend_cuda_fails_with_one_line_without_a_device)
{
    jlm_cu_info in;
    jlm_cu_probe(&in);
    if (in.count > 0)
        cr_skip_test("a CUDA device is present (%s): the refusal is not reachable", in.name);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run no-such.jlm -p hi --backend cuda", tu_jlm());
    cr_assert_eq(tu_run(cmd, &out), 1, "%s", out);
    cr_assert(strncmp(out, "jlm run: --backend cuda: ", 25) == 0, "%s", out);
    cr_assert(strstr(out, in.reason) != NULL, "%s", out);
    cr_assert(strchr(out, '\n') == out + strlen(out) - 1, "not one line: %s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run no-such.jlm -p hi --backend opencl", tu_jlm());
    cr_assert_eq(tu_run(cmd, &out), 2, "%s", out);
    cr_assert(strstr(out, "unknown backend") != NULL, "%s", out);
    free(out);
}

/* ---------------------------------------------------------------- the emulated device (rt.h) */

static jlm_cu_rt *emu_open(void)
{
    jlm_cu_rt *r = NULL;
    char why[320];
    cr_assert_eq(jlm_cu_rt_open(0, 1, &r, why, sizeof why), 0, "%s", why);
    cr_assert(jlm_cu_rt_emulated(r));
    return r;
}

/* The emulation is only a test of the plumbing if it fails plumbing bugs that
 * a fast device would forgive: each case is a bug the backend could have. */
Test(cuda, the_emulated_device_runs_copies_when_waited_for_not_when_queued)
{
    jlm_cu_rt *r = emu_open();
    void *d = NULL, *h = NULL;
    char out[8] = "-------";
    cr_assert_eq(jlm_cu_rt_alloc(r, 8, &d), 0);
    cr_assert_eq(jlm_cu_rt_host_alloc(r, 8, &h), 0);
    /* a pinned staging buffer refilled before its copy ran: the copy carries the new bytes */
    memcpy(h, "first..", 8);
    cr_assert_eq(jlm_cu_rt_h2d(r, d, h, 8, JLM_CU_S_COPY), 0);
    memcpy(h, "second.", 8);
    cr_assert_eq(jlm_cu_rt_d2h(r, out, d, 8, JLM_CU_S_COPY), 0);
    cr_assert_str_eq(out, "-------", "a result is read before the stream ran");
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COPY), 0);
    cr_assert_str_eq(out, "second.");
    /* a pageable source is consumed at the call */
    char pg[8] = "pagea..";
    cr_assert_eq(jlm_cu_rt_h2d(r, d, pg, 8, JLM_CU_S_COPY), 0);
    memcpy(pg, "changed", 8);
    cr_assert_eq(jlm_cu_rt_d2h(r, out, d, 8, JLM_CU_S_COPY), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COPY), 0);
    cr_assert_str_eq(out, "pagea..");
    /* another stream sees a copy only through an event */
    memcpy(h, "evented", 8);
    cr_assert_eq(jlm_cu_rt_h2d(r, d, h, 8, JLM_CU_S_COPY), 0);
    cr_assert_eq(jlm_cu_rt_d2h(r, out, d, 8, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0);
    cr_assert_str_eq(out, "pagea..", "the compute stream saw an unsynchronized copy");
    cr_assert_eq(jlm_cu_rt_record(r, 3, JLM_CU_S_COPY), 0);
    cr_assert_eq(jlm_cu_rt_wait(r, JLM_CU_S_COMPUTE, 3), 0);
    cr_assert_eq(jlm_cu_rt_d2h(r, out, d, 8, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0);
    cr_assert_str_eq(out, "evented");
    jlm_cu_rt_close(r);
}

Test(cuda, the_emulated_device_refuses_pointers_outside_device_memory)
{
    jlm_cu_rt *r = emu_open();
    void *d = NULL;
    char host[64] = {0};
    cr_assert_eq(jlm_cu_rt_alloc(r, 32, &d), 0);
    cr_assert_neq(jlm_cu_rt_h2d(r, host, host, 8, JLM_CU_S_COPY), 0, "a host pointer taken as device memory");
    cr_assert(strstr(jlm_cu_rt_error(r), "not inside one device allocation"), "%s", jlm_cu_rt_error(r));
    cr_assert_neq(jlm_cu_rt_h2d(r, (char *)d + 16, host, 17, JLM_CU_S_COPY), 0, "a span past the allocation's end");
    cr_assert_neq(jlm_cu_rt_d2h(r, d, d, 8, JLM_CU_S_COPY), 0, "device memory as the host destination");
    uint64_t seed = 7;
    gen_mat g;
    cr_assert_eq(gen_mat_make(&g, JLM_T_Q4_K, 256, 8, &seed), 0);
    jlm_cu_mat cm;
    jlm_cu_mat_from(&g.m, &cm);   /* host planes: refused */
    cr_assert_neq(jlm_cu_rt_matvec(r, &cm, 1, NULL, d, d, JLM_CU_S_COMPUTE), 0);
    cr_assert(strstr(jlm_cu_rt_error(r), "qs plane"), "%s", jlm_cu_rt_error(r));
    gen_mat_free(&g);
    jlm_cu_rt_close(r);
}

/* A whole block's launches through the seam (rt.h: rmsnorm over rows, RoPE,
 * attention, elementwise, quantization, device copies) on the emulated
 * device: after a weight copied on the copy stream and an event, an
 * rmsnorm of two rows equals the harness's, row by row; the same launch
 * reading a weight another stream copied with no event between faults at
 * the wait; spans past their allocation are refused at the launch, naming
 * the operand; an F16 cache's spans are counted in halves (its rows, and
 * the keys and values attention reads). */
Test(cuda, the_emulated_block_kernels_check_their_spans_and_their_ordering)
{
    jlm_cu_rt *r = emu_open();
    enum { N = 64 };
    float x[2 * N], w[N], want[2 * N], got[2 * N];
    uint64_t seed = 11;
    for (int i = 0; i < 2 * N; i++)
        x[i] = gen_unit(&seed);
    for (int i = 0; i < N; i++)
        w[i] = 1.5f + gen_unit(&seed);
    for (int t = 0; t < 2; t++)
        jlm_cu_host_rmsnorm(want + t * N, x + t * N, w, N, 1e-5f);
    void *dx = NULL, *dw = NULL, *dy = NULL, *dq = NULL;
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof x, &dx), 0);
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof w, &dw), 0);
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof x, &dy), 0);
    cr_assert_eq(jlm_cu_rt_alloc(r, 2 * N + 2 * N / 8 * 2, &dq), 0);
    cr_assert_eq(jlm_cu_rt_h2d(r, dx, x, sizeof x, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_h2d(r, dw, w, sizeof w, JLM_CU_S_COPY), 0);
    cr_assert_eq(jlm_cu_rt_record(r, 2, JLM_CU_S_COPY), 0);
    cr_assert_eq(jlm_cu_rt_wait(r, JLM_CU_S_COMPUTE, 2), 0);
    cr_assert_eq(jlm_cu_rt_rmsnorm(r, dy, dx, dw, N, 2, 1e-5f, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_d2h(r, got, dy, sizeof got, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert(!memcmp(got, want, sizeof got), "two rows in one launch differ from the harness's rows");
    /* the weight copied again on the copy stream, no event: a device could run the norm first */
    cr_assert_eq(jlm_cu_rt_h2d(r, dw, w, sizeof w, JLM_CU_S_COPY), 0);
    cr_assert_eq(jlm_cu_rt_rmsnorm(r, dy, dx, dw, N, 2, 1e-5f, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COPY), 0);
    cr_assert_neq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "an unordered read of another stream's copy");
    cr_assert(strstr(jlm_cu_rt_error(r), "rmsnorm: weight"), "%s", jlm_cu_rt_error(r));
    /* spans past their allocations */
    cr_assert_neq(jlm_cu_rt_rmsnorm(r, dy, dx, dw, N, 3, 1e-5f, JLM_CU_S_COMPUTE), 0, "three rows in two");
    cr_assert(strstr(jlm_cu_rt_error(r), "kernel: output"), "%s", jlm_cu_rt_error(r));
    cr_assert_neq(jlm_cu_rt_elem(r, JLM_CU_ADD, dy, dx, dw, 2 * N, 0, 0, JLM_CU_S_COMPUTE), 0, "b is N floats");
    cr_assert(strstr(jlm_cu_rt_error(r), "elementwise: b"), "%s", jlm_cu_rt_error(r));
    cr_assert_neq(jlm_cu_rt_d2d(r, dw, dx, sizeof x, JLM_CU_S_COMPUTE), 0, "a copy past the destination");
    jlm_cu_act a = {4 * N, dq, (float *)((char *)dq + 2 * N), (int16_t *)((char *)dq + 2 * N + N / 4)};
    cr_assert_neq(jlm_cu_rt_quantize(r, dx, &a, JLM_CU_S_COMPUTE), 0, "4N codes in 2N bytes");
    jlm_cu_rope rp = {.n_rot = 8, .freq_base = 10000, .freq_scale = 1, .attn_factor = 1};
    cr_assert_neq(jlm_cu_rt_rope(r, &rp, dy, 2 * N / 8 + 1, 8, 3, JLM_CU_S_COMPUTE), 0, "one head too many");
    jlm_cu_attn at = {.n_head = 2, .n_head_kv = 1, .head_dim = 16, .head_dim_v = 16, .n_kv = 8, .k_stride = 16,
                      .v_stride = 16, .scale = 0.25f};
    cr_assert_neq(jlm_cu_rt_attn(r, &at, dx, dx, dw, dq, dy, JLM_CU_S_COMPUTE), 0, "8 values of 16 in 64 floats");
    cr_assert(strstr(jlm_cu_rt_error(r), "attention: values"), "%s", jlm_cu_rt_error(r));
    at.n_kv = 4;
    cr_assert_eq(jlm_cu_rt_attn(r, &at, dx, dx, dw, dq, dy, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    /* an F16 cache: halves, so 2N of them in N floats' bytes; 8 values of 16 halves fit in 64 floats */
    uint16_t h[2 * N];
    cr_assert_neq(jlm_cu_rt_to_f16(r, dw, dx, 2 * N + 1, JLM_CU_S_COMPUTE), 0, "2N + 1 halves in 2N");
    cr_assert(strstr(jlm_cu_rt_error(r), "kernel: output"), "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_to_f16(r, dw, dx, 2 * N, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_d2h(r, h, dw, sizeof h, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    for (int i = 0; i < 2 * N; i++)
        cr_assert_eq(h[i], jlm_k_f32_to_fp16(x[i]), "half %d", i);
    at.n_kv = 8;
    at.k_type = at.v_type = JLM_CU_KV_F16;
    cr_assert_eq(jlm_cu_rt_attn(r, &at, dx, dw, dw, dq, dy, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    at.n_kv = 9;
    cr_assert_neq(jlm_cu_rt_attn(r, &at, dx, dw, dw, dq, dy, JLM_CU_S_COMPUTE), 0, "9 keys of 16 halves in 64 floats");
    cr_assert(strstr(jlm_cu_rt_error(r), "attention: keys"), "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    jlm_cu_rt_close(r);
}

/* n floats of host x into fresh device memory (on the compute stream). */
static void *dev_of(jlm_cu_rt *r, const void *x, uint64_t n)
{
    void *d = NULL;
    cr_assert_eq(jlm_cu_rt_alloc(r, n, &d), 0);
    cr_assert_eq(jlm_cu_rt_h2d(r, d, x, n, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    return d;
}

/* n bytes of device d, after the compute stream ran. */
static void host_of(jlm_cu_rt *r, void *h, const void *d, uint64_t n)
{
    cr_assert_eq(jlm_cu_rt_d2h(r, h, d, n, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
}

/* The row-batched launches of a prefill (rt.h: rope_rows, add_rows,
 * attn_rows, rmsnorm_strided, d2d_rows) compute each row as the one-row
 * launches do, bit for bit, in one launch each (jlm_cu_rt_launches): 6
 * query rows at positions 10..15 (GQA 2:1, sinks, a softcap) over an F32
 * cache of 16 positions, causal and with a window of 4 (the rows' first
 * keys from the row table, device memory); RoPE at each row's position;
 * a bias on each row (one too short refused at the launch, not counted);
 * the norm of rows narrower than their stride; a strided copy. The row table copied on the copy stream with no event
 * faults at the wait (an unordered read), and a row's keys past the cache
 * fault when the kernel runs, naming the row. */
Test(cuda, the_emulated_row_kernels_compute_each_row_as_the_one_row_kernels_in_one_launch)
{
    jlm_cu_rt *r = emu_open();
    enum { R = 6, NH = 4, NKV = 2, HD = 32, P = 16, KVD = NKV * HD, QW = NH * HD };
    uint64_t seed = 38;
    float q[R * QW], kc[P * KVD], vc[P * KVD], sinks[NH], want[R * QW], got[R * QW];
    gen_floats(q, R * QW, 1.0f, &seed);
    gen_floats(kc, P * KVD, 1.0f, &seed);
    gen_floats(vc, P * KVD, 1.0f, &seed);
    gen_floats(sinks, NH, 1.0f, &seed);
    float *dq = dev_of(r, q, sizeof q), *dk = dev_of(r, kc, sizeof kc), *dv = dev_of(r, vc, sizeof vc);
    float *ds = dev_of(r, sinks, sizeof sinks), *dy = dev_of(r, q, sizeof q), *dsc = NULL;
    cr_assert_eq(jlm_cu_rt_alloc(r, (uint64_t)R * NH * P * 4, (void **)&dsc), 0);
    jlm_cu_attn at = {.n_head = NH, .n_head_kv = NKV, .head_dim = HD, .head_dim_v = HD, .k_stride = KVD,
                      .v_stride = KVD, .k_head_stride = HD, .v_head_stride = HD, .scale = 0.2f, .softcap = 20.0f,
                      .sinks = ds};
    for (int win = 0; win < 2; win++) {
        uint32_t tab[3 * R];
        for (uint32_t t = 0; t < R; t++) {
            uint32_t pos = 10 + t, lo = win && pos >= 4 ? pos - 3 : 0;
            tab[t] = pos, tab[R + 2 * t] = lo, tab[R + 2 * t + 1] = pos + 1 - lo;
        }
        for (uint32_t t = 0; t < R; t++) {   /* the one-row launches */
            at.n_kv = tab[R + 2 * t + 1];
            cr_assert_eq(jlm_cu_rt_attn(r, &at, dq + t * QW, dk + tab[R + 2 * t] * KVD, dv + tab[R + 2 * t] * KVD,
                                        dsc, dy + t * QW, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
        }
        host_of(r, want, dy, sizeof want);
        uint32_t *dt = dev_of(r, tab, sizeof tab);
        jlm_cu_rows rw = {.n = R, .x_stride = QW, .o_stride = QW, .sc_stride = NH * 16, .kb = KVD * 4,
                          .vb = KVD * 4, .pos = dt, .span = dt + R};
        at.n_kv = 16;
        uint64_t l0 = jlm_cu_rt_launches(r);
        cr_assert_eq(jlm_cu_rt_attn_rows(r, &at, dq, dk, dv, P, dsc, dy, &rw, JLM_CU_S_COMPUTE), 0, "%s",
                     jlm_cu_rt_error(r));
        cr_assert_eq(jlm_cu_rt_launches(r) - l0, 1);
        host_of(r, got, dy, sizeof got);
        cr_assert(!memcmp(got, want, sizeof got), "attention rows (window %d) differ from the one-row launches", win);
        if (win) {   /* the table refilled on the copy stream, no event; then a row past the cache */
            cr_assert_eq(jlm_cu_rt_h2d(r, dt, tab, sizeof tab, JLM_CU_S_COPY), 0);
            cr_assert_eq(jlm_cu_rt_attn_rows(r, &at, dq, dk, dv, P, dsc, dy, &rw, JLM_CU_S_COMPUTE), 0);
            cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COPY), 0);
            cr_assert_neq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "an unordered read of the row table");
            cr_assert(strstr(jlm_cu_rt_error(r), "attention: spans"), "%s", jlm_cu_rt_error(r));
            tab[R + 2 * 5] = 10;   /* row 5: keys [10, 16) -> [10, 18) */
            tab[R + 2 * 5 + 1] = 8;
            cr_assert_eq(jlm_cu_rt_h2d(r, dt, tab, sizeof tab, JLM_CU_S_COMPUTE), 0);
            cr_assert_eq(jlm_cu_rt_attn_rows(r, &at, dq, dk, dv, P, dsc, dy, &rw, JLM_CU_S_COMPUTE), 0);
            cr_assert_neq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "keys past the cache");
            cr_assert(strstr(jlm_cu_rt_error(r), "attention row 5"), "%s", jlm_cu_rt_error(r));
        } else {   /* RoPE at each row's position, a bias on each row, rows narrower than their stride */
            jlm_cu_rope rp = {.n_rot = 16, .freq_base = 10000, .freq_scale = 1, .attn_factor = 1};
            for (uint32_t t = 0; t < R; t++) {
                cr_assert_eq(jlm_cu_rt_rope(r, &rp, dy + t * QW, NH, HD, tab[t], JLM_CU_S_COMPUTE), 0);
                cr_assert_eq(jlm_cu_rt_elem(r, JLM_CU_ADD, dy + t * QW, dy + t * QW, dq, QW, 0, 0, JLM_CU_S_COMPUTE), 0);
                cr_assert_eq(jlm_cu_rt_rmsnorm(r, dy + t * QW, dy + t * QW, NULL, 40, 1, 1e-5f, JLM_CU_S_COMPUTE), 0);
                cr_assert_eq(jlm_cu_rt_d2d(r, dsc + t * 8, dy + t * QW + 3, 5 * 4, JLM_CU_S_COMPUTE), 0);
            }
            float wsc[R * 8], gsc[R * 8];
            host_of(r, want, dy, sizeof want);
            host_of(r, wsc, dsc, sizeof wsc);
            cr_assert_eq(jlm_cu_rt_h2d(r, dy, got, sizeof got, JLM_CU_S_COMPUTE), 0);
            l0 = jlm_cu_rt_launches(r);
            cr_assert_eq(jlm_cu_rt_rope_rows(r, &rp, dy, NH, HD, &rw, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
            cr_assert_eq(jlm_cu_rt_add_rows(r, dy, dy, dq, QW, R, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
            cr_assert_neq(jlm_cu_rt_add_rows(r, dy, dy, ds, QW, R, JLM_CU_S_COMPUTE), 0, "a bias of QW in NH floats");
            cr_assert(strstr(jlm_cu_rt_error(r), "rows add: b"), "%s", jlm_cu_rt_error(r));
            cr_assert_eq(jlm_cu_rt_rmsnorm_strided(r, dy, dy, NULL, 40, R, QW, 1e-5f, JLM_CU_S_COMPUTE), 0);
            cr_assert_eq(jlm_cu_rt_d2d_rows(r, dsc, 8 * 4, dy + 3, QW * 4, 5 * 4, R, JLM_CU_S_COMPUTE), 0);
            cr_assert_eq(jlm_cu_rt_launches(r) - l0, 4);
            host_of(r, got, dy, sizeof got);
            host_of(r, gsc, dsc, sizeof gsc);
            cr_assert(!memcmp(got, want, sizeof got), "rope, bias or norm rows differ from the one-row launches");
            for (uint32_t t = 0; t < R; t++)
                cr_assert(!memcmp(gsc + t * 8, wsc + t * 8, 5 * 4), "copied row %u differs", t);
        }
    }
    jlm_cu_rt_close(r);
}

/* One taped token of row-batched launches and a cache store (the test
 * below): q's rows (pageable, before the token) rotated at the row table
 * tab's positions, a bias added, attention over k's keys from the table,
 * the first output row into the cache c at *dpos; 4 launches counted. */
typedef struct tape_rig {
    jlm_cu_rt *r;
    float *dq, *dy, *dk, *db, *dsc, *dout, *dc;
    uint32_t *dpos;
} tape_rig;

enum { TR_R = 4, TR_NH = 2, TR_HD = 32, TR_P = 16, TR_QW = TR_NH * TR_HD };

static void tape_token(const tape_rig *g, const float *q, const uint32_t *tab, float *out, float *cache)
{
    jlm_cu_rt *r = g->r;
    jlm_cu_rows rw = {.n = TR_R, .x_stride = TR_QW, .o_stride = TR_QW, .sc_stride = TR_NH * TR_P, .kb = TR_QW * 4,
                      .vb = TR_QW * 4, .pos = tab, .span = tab + TR_R};
    jlm_cu_attn at = {.n_head = TR_NH, .n_head_kv = TR_NH, .head_dim = TR_HD, .head_dim_v = TR_HD, .n_kv = TR_P,
                      .k_stride = TR_QW, .v_stride = TR_QW, .k_head_stride = TR_HD, .v_head_stride = TR_HD,
                      .scale = 0.2f};
    jlm_cu_rope rp = {.n_rot = 16, .freq_base = 10000, .freq_scale = 1, .attn_factor = 1};
    cr_assert_eq(jlm_cu_rt_h2d(r, g->dy, q, TR_R * TR_QW * 4, JLM_CU_S_COMPUTE), 0);
    uint64_t l0 = jlm_cu_rt_launches(r);
    cr_assert_eq(jlm_cu_rt_graph(r, 1), 0);
    cr_assert_eq(jlm_cu_rt_rope_rows(r, &rp, g->dy, TR_NH, TR_HD, &rw, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_add_rows(r, g->dy, g->dy, g->db, TR_QW, TR_R, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_attn_rows(r, &at, g->dy, g->dk, g->dk, TR_P, g->dsc, g->dout, &rw, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_kv_store(r, JLM_CU_KV_F32, g->dc, TR_QW * 4, TR_P * TR_QW * 4, g->dpos, g->dout, TR_QW,
                                    JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_graph(r, 0), 0, "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_launches(r) - l0, 4, "a taped token's launches, issued or replayed, count once each");
    host_of(r, out, g->dout, TR_R * TR_QW * 4);
    host_of(r, cache, g->dc, TR_P * TR_QW * 4);
}

/* Every kernel kind of the emulation tapes into a decoded token's graph:
 * the row-batched launches (RoPE, bias, attention) and the cache store at
 * the device's position, the row table's pointers part of what a segment
 * is compared by. The same token twice is issued, then captured and
 * replayed: bit for bit the launches issued one by one, counted as many
 * (jlm_cu_rt_launches); the same launches over another row table (other
 * positions, same shapes) are another segment, issued, not the stale
 * graph (other results), and captured when they repeat. */
Test(cuda, the_row_kernels_and_the_cache_store_tape_into_a_graph_compared_with_their_row_table)
{
    unsetenv("JLM_CUDA_GRAPH");
    tape_rig g = {.r = emu_open()};
    jlm_cu_rt *r = g.r;
    uint64_t seed = 71;
    static float q[TR_R * TR_QW], kc[TR_P * TR_QW], bias[TR_QW], out[4][TR_R * TR_QW], cache[4][TR_P * TR_QW];
    gen_floats(q, TR_R * TR_QW, 1.0f, &seed);
    gen_floats(kc, TR_P * TR_QW, 1.0f, &seed);
    gen_floats(bias, TR_QW, 1.0f, &seed);
    uint32_t tab[2][3 * TR_R], pos = 5;
    for (uint32_t v = 0; v < 2; v++)
        for (uint32_t t = 0; t < TR_R; t++)
            tab[v][t] = 8 + t + v, tab[v][TR_R + 2 * t] = 0, tab[v][TR_R + 2 * t + 1] = 9 + t + v;
    g.dk = dev_of(r, kc, sizeof kc), g.db = dev_of(r, bias, sizeof bias), g.dc = dev_of(r, kc, sizeof kc);
    g.dpos = dev_of(r, &pos, 4);
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof q, (void **)&g.dy), 0);
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof q, (void **)&g.dout), 0);
    cr_assert_eq(jlm_cu_rt_alloc(r, (uint64_t)TR_R * TR_NH * TR_P * 4, (void **)&g.dsc), 0);
    uint32_t *dt[2] = {dev_of(r, tab[0], sizeof tab[0]), dev_of(r, tab[1], sizeof tab[1])};
    static const int TAB[4] = {0, 0, 1, 1}, GRAPHS[4] = {0, 1, 1, 2};
    for (int i = 0; i < 4; i++) {
        tape_token(&g, q, dt[TAB[i]], out[i], cache[i]);
        jlm_cu_rt_count c;
        jlm_cu_rt_counts(r, &c);
        cr_assert(c.graph_launches == (uint64_t)GRAPHS[i] && c.captures == (uint64_t)GRAPHS[i],
                  "token %d: %llu graph launches, %llu captures, want %d", i, (unsigned long long)c.graph_launches,
                  (unsigned long long)c.captures, GRAPHS[i]);
    }
    cr_assert(!memcmp(out[1], out[0], sizeof out[0]) && !memcmp(cache[1], cache[0], sizeof cache[0]),
              "the replayed graph differs from the launches issued");
    cr_assert(!memcmp(out[3], out[2], sizeof out[0]) && !memcmp(cache[3], cache[2], sizeof cache[0]),
              "the second table's graph differs from its launches issued");
    cr_assert(memcmp(out[2], out[0], sizeof out[0]), "the other row table ran the first table's graph");
    jlm_cu_rt_close(r);
}

/* The expert combine through the seam (jlm_cu_rt_moe_combine, what
 * exec_cu_moe.c launches): equal to jlm_k_moe_combine bit for bit; weights
 * copied on the other stream with no event fault at the wait, and spans past
 * their allocations (too few outputs, too few weights) are refused at the
 * launch, naming the operand. */
Test(cuda, the_emulated_expert_combine_equals_the_cpus_and_checks_its_operands)
{
    enum { NU = 4, N = 96 };
    static float ys[NU * N], x[N], want[N], got[N], w[NU];
    uint64_t seed = 21;
    gen_floats(ys, NU * N, 3.0f, &seed);
    gen_floats(x, N, 3.0f, &seed);
    gen_floats(w, NU, 1.0f, &seed);
    memcpy(want, x, sizeof x);
    const float *yp[NU];
    for (int i = 0; i < NU; i++)
        yp[i] = ys + i * N;
    jlm_k_moe_combine(want, yp, w, NU, N);
    jlm_cu_rt *r = emu_open();
    void *dx = NULL, *dy = NULL, *dw = NULL;
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof x, &dx), 0);
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof ys, &dy), 0);
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof w, &dw), 0);
    cr_assert_eq(jlm_cu_rt_h2d(r, dx, x, sizeof x, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_h2d(r, dy, ys, sizeof ys, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_h2d(r, dw, w, sizeof w, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_moe_combine(r, dx, dy, dw, NU, N, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_d2h(r, got, dx, sizeof got, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
    cr_assert(!memcmp(got, want, sizeof got), "the combine through the seam differs from jlm_k_moe_combine");
    cr_assert_eq(jlm_cu_rt_h2d(r, dw, w, sizeof w, JLM_CU_S_COPY), 0);   /* no event: a device could run first */
    cr_assert_eq(jlm_cu_rt_moe_combine(r, dx, dy, dw, NU, N, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COPY), 0);
    cr_assert_neq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "an unordered read of another stream's copy");
    cr_assert(strstr(jlm_cu_rt_error(r), "expert combine: weights"), "%s", jlm_cu_rt_error(r));
    cr_assert_neq(jlm_cu_rt_moe_combine(r, dx, dy, dw, NU + 1, N, JLM_CU_S_COMPUTE), 0, "5 outputs in 4");
    cr_assert(strstr(jlm_cu_rt_error(r), "expert combine: outputs"), "%s", jlm_cu_rt_error(r));
    cr_assert_neq(jlm_cu_rt_moe_combine(r, dx, dy, dy, NU, N + 1, JLM_CU_S_COMPUTE), 0, "x is N floats");
    jlm_cu_rt_close(r);
}

/* A matvec through the seam: planes and activations copied on the copy
 * stream, the launch on the compute stream. Ordered by an event, or by a
 * host wait for the copies before the launch is issued, it equals the CPU
 * reference bit for bit; with nothing between them the kernel reads
 * poisoned memory, and where the copies happen to run first (another host
 * wait after the launch was issued drove them) the emulation still faults:
 * a device could have run the kernel first. */
Test(cuda, the_emulated_matvec_equals_ref_only_after_waiting_for_its_copies)
{
    const uint64_t k = 512, rows = 40;
    uint64_t seed = 11;
    gen_mat g;
    cr_assert_eq(gen_mat_make(&g, JLM_T_Q4_K, k, rows, &seed), 0);
    float *x = malloc(k * 4), *y0 = malloc(rows * 4), *y1 = malloc(rows * 4);
    void *abuf = malloc(jlm_k_act_q8_bytes(k));
    gen_floats(x, k, 2.0f, &seed);
    jlm_act_q8 a;
    cr_assert_eq(jlm_k_act_q8_init(&a, abuf, k, NULL), 0);
    jlm_k_quantize_act(x, &a);
    jlm_k_matvec_ref(&g.m, x, &a, y0, 0, rows);
    enum { NO_WAIT, EVENT, HOST_BEFORE, HOST_AFTER };
    for (int mode = NO_WAIT; mode <= HOST_AFTER; mode++) {
        jlm_cu_rt *r = emu_open();
        void *qs, *d, *sc, *aq, *ad, *as, *rec, *y;
        cr_assert_eq(jlm_cu_rt_alloc(r, g.qs_bytes, &qs) | jlm_cu_rt_alloc(r, g.d_bytes, &d) |
                     jlm_cu_rt_alloc(r, g.sc_bytes, &sc) | jlm_cu_rt_alloc(r, k, &aq) |
                     jlm_cu_rt_alloc(r, k / 8, &ad) | jlm_cu_rt_alloc(r, k / 8, &as) |
                     jlm_cu_rt_alloc(r, sizeof(jlm_cu_act), &rec) | jlm_cu_rt_alloc(r, rows * 4, &y), 0);
        jlm_cu_act hr = {k, aq, ad, as};
        cr_assert_eq(jlm_cu_rt_h2d(r, qs, g.qs, g.qs_bytes, JLM_CU_S_COPY) |
                     jlm_cu_rt_h2d(r, d, g.d, g.d_bytes, JLM_CU_S_COPY) |
                     jlm_cu_rt_h2d(r, sc, g.sc, g.sc_bytes, JLM_CU_S_COPY) |
                     jlm_cu_rt_h2d(r, aq, a.q, k, JLM_CU_S_COMPUTE) | jlm_cu_rt_h2d(r, ad, a.d, k / 8, JLM_CU_S_COMPUTE) |
                     jlm_cu_rt_h2d(r, as, a.sum16, k / 8, JLM_CU_S_COMPUTE) |
                     jlm_cu_rt_h2d(r, rec, &hr, sizeof hr, JLM_CU_S_COMPUTE), 0);
        cr_assert_eq(jlm_cu_rt_record(r, 0, JLM_CU_S_COPY), 0);
        if (mode == EVENT)
            cr_assert_eq(jlm_cu_rt_wait(r, JLM_CU_S_COMPUTE, 0), 0);
        if (mode == HOST_BEFORE)
            cr_assert_eq(jlm_cu_rt_event_sync(r, 0), 0);
        jlm_cu_mat cm;
        jlm_cu_mat_from(&g.m, &cm);
        cm.qs = qs;
        cm.d = d;
        cm.sc = sc;
        cr_assert_eq(jlm_cu_rt_matvec(r, &cm, 1, NULL, rec, y, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
        if (mode == HOST_AFTER)
            cr_assert_eq(jlm_cu_rt_event_sync(r, 0), 0);   /* the copies run now, the kernel later */
        int src = jlm_cu_rt_d2h(r, y1, y, rows * 4, JLM_CU_S_COMPUTE) | jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE);
        if (mode == HOST_AFTER) {
            cr_assert_neq(src, 0, "a kernel issued before the host waited for its copies ran without a fault");
            cr_assert(strstr(jlm_cu_rt_error(r), "no event between them"), "%s", jlm_cu_rt_error(r));
        } else {
            cr_assert_eq(src, 0, "%s", jlm_cu_rt_error(r));
            int same = !memcmp(y0, y1, rows * 4);
            cr_assert(mode == NO_WAIT ? !same : same, "mode %d: %s", mode,
                      mode == NO_WAIT ? "without the event: equal to ref" : "ordered: differs from ref");
        }
        jlm_cu_rt_close(r);   /* frees what is still allocated */
    }
    free(x);
    free(y0);
    free(y1);
    free(abuf);
    gen_mat_free(&g);
}

/* jlm_cu_rt_matvec_batch on the emulated device: nb sheets back to back in
 * each plane (a 3-D tensor: deepseek2's attn_k_b / attn_v_b), token t of
 * sheet h reading its floats at t*tx + h*bx (gaps between tokens) or act
 * record h*rs + t, writing at t*ty + h*by: byte for byte what one
 * jlm_cu_rt_matvec a sheet and a token writes (the per-head path) and the
 * CPU reference, gaps untouched. */
static void check_batch(jlm_cu_rt *r, uint8_t type, uint64_t k, uint64_t rows, uint32_t nb, uint32_t n,
                        uint64_t *seed)
{
    const jlm_type_traits *tr = jlm_fmt_type_traits(type);
    int fl = tr->is_float;
    gen_batch g;
    cr_assert_eq(gen_batch_make(&g, type, k, rows, nb, n, seed), 0);
    uint64_t rs = n + 1, nx = n * g.tx, ny = n * g.ty;
    float *y0 = malloc(ny * 4), *y1 = malloc(ny * 4);
    void *dq, *dd, *ds, *dx, *daq, *dad, *das, *drec, *dy0, *dy1;
    cr_assert_eq(jlm_cu_rt_alloc(r, nb * g.ql, &dq) | jlm_cu_rt_alloc(r, nb * g.dl + 4, &dd) |
                 jlm_cu_rt_alloc(r, nb * g.sl + 4, &ds) | jlm_cu_rt_alloc(r, nx * 4, &dx) |
                 jlm_cu_rt_alloc(r, nx, &daq) | jlm_cu_rt_alloc(r, nx / 8 + 4, &dad) |
                 jlm_cu_rt_alloc(r, nx / 8 + 4, &das) | jlm_cu_rt_alloc(r, nb * rs * sizeof(jlm_cu_act), &drec) |
                 jlm_cu_rt_alloc(r, ny * 4, &dy0) | jlm_cu_rt_alloc(r, ny * 4, &dy1), 0);
    jlm_cu_act *rec = calloc(nb * rs, sizeof *rec);
    for (uint32_t h = 0; h < nb; h++)
        for (uint32_t t = 0; t < n; t++) {
            uint64_t o = t * g.tx + h * g.bx;
            rec[h * rs + t] = (jlm_cu_act){k, (int8_t *)daq + o, (float *)dad + o / 32, (int16_t *)das + o / 16};
        }
    const int CS = JLM_CU_S_COMPUTE;
    cr_assert_eq(jlm_cu_rt_h2d(r, dq, g.q, nb * g.ql, CS) | jlm_cu_rt_h2d(r, dd, g.d, nb * g.dl, CS) |
                 jlm_cu_rt_h2d(r, ds, g.s, nb * g.sl, CS) | jlm_cu_rt_h2d(r, dx, g.x, nx * 4, CS) |
                 jlm_cu_rt_h2d(r, daq, g.aq, nx, CS) | jlm_cu_rt_h2d(r, dad, g.ad, nx / 8, CS) |
                 jlm_cu_rt_h2d(r, das, g.as, nx / 8, CS) | jlm_cu_rt_h2d(r, drec, rec, nb * rs * sizeof *rec, CS) |
                 jlm_cu_rt_h2d(r, dy0, g.ref, ny * 4, CS) | jlm_cu_rt_h2d(r, dy1, g.ref, ny * 4, CS), 0);
    jlm_cu_mat cm;
    jlm_cu_mat_from(&g.m, &cm);
    cm.qs = dq;
    cm.d = g.dl ? dd : NULL;
    cm.sc = g.sl ? ds : NULL;
    const float *xf = fl ? dx : NULL;
    const jlm_cu_act *xr = fl ? NULL : drec;
    jlm_cu_batch b = {nb, g.tx, g.ty, g.bx, g.by, g.ql, g.dl, g.sl, rs}, one = {1, 0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t h = 0; h < nb; h++) {   /* the per-head path: a launch a sheet and a token */
        jlm_cu_mat mh = jlm_cu_batch_sheet(&cm, &b, h);
        for (uint32_t t = 0; t < n; t++)
            cr_assert_eq(jlm_cu_rt_matvec_batch(r, &mh, &one, 1, xf ? xf + t * g.tx + h * g.bx : NULL,
                                                xr ? xr + h * rs + t : NULL, (float *)dy0 + t * g.ty + h * g.by, CS),
                         0, "%s", jlm_cu_rt_error(r));
    }
    cr_assert_eq(jlm_cu_rt_matvec_batch(r, &cm, &b, n, xf, xr, dy1, CS), 0, "%s", jlm_cu_rt_error(r));
    cr_assert_eq(jlm_cu_rt_d2h(r, y0, dy0, ny * 4, CS) | jlm_cu_rt_d2h(r, y1, dy1, ny * 4, CS) |
                 jlm_cu_rt_sync(r, CS), 0, "%s", jlm_cu_rt_error(r));
    for (uint64_t i = 0; i < ny; i++)
        cr_assert(!memcmp(&y0[i], &y1[i], 4) && !memcmp(&y0[i], &g.ref[i], 4),
                  "%s k %llu rows %llu, %u sheets, %u tokens: token %llu at %llu: batched %.9g per head %.9g ref %.9g",
                  tr->name, (unsigned long long)k, (unsigned long long)rows, nb, n, (unsigned long long)(i / g.ty),
                  (unsigned long long)(i % g.ty), y1[i], y0[i], g.ref[i]);
    void *dev[] = {dq, dd, ds, dx, daq, dad, das, drec, dy0, dy1};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        jlm_cu_rt_free(r, dev[i]);
    free(y0), free(y1), free(rec);
    gen_batch_free(&g);
}

Test(cuda, batched_matvec_of_sheets_is_each_sheets_matvec_bit_for_bit)
{
    jlm_cu_rt *r = emu_open();
    uint64_t seed = 0x6a09e667f3bcc909ull;
    static const uint32_t NB[] = {1, 3, 4}, NT[] = {1, 5, 2};
    for (int i = 0; i < 12; i++) {
        const jlm_type_traits *t = jlm_fmt_type_traits(GEN_TYPES[i]);
        uint64_t k = t->is_float ? 64 : 2 * (uint64_t)t->sub * t->super_sub;
        for (size_t j = 0; j < 3; j++)
            check_batch(r, GEN_TYPES[i], k, j == 1 ? 33 : 40, NB[j], NT[j], &seed);
    }
    jlm_cu_batch bad = {2, 64, 40, 64, 40, 4, 0, 0, 0};   /* records of sheet 1 over sheet 0's */
    jlm_cu_mat cm = {0};
    cr_assert_neq(jlm_cu_rt_matvec_batch(r, &cm, &bad, 3, NULL, NULL, NULL, JLM_CU_S_COMPUTE), 0);
    jlm_cu_rt_close(r);
}

/* ---------------------------------------------------------------- the engine on CUDA (emulated) */

/* The engine's CUDA backend on the emulated device, with 64 KiB staging
 * buffers so every page-in goes through both of them many times. */
Test(cuda, every_test_model_on_emulated_cuda_whole_split_and_at_one_frame_each_side_matches_the_cpu,
     .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    setenv("JLM_CUDA_STAGE_KIB", "64", 1);
    bm_every_model_matches_the_cpu("cuda");
}

/* A decode step with every block on the device: Q, K and V go up in one
 * round trip, gate and up in another, so a layer of 7 matmuls waits 4 times
 * (o and down alone), and the output matrix once; the logits are the CPU's
 * (the matrix test above holds them to it for every model). The same at one
 * frame each side: the block's frame is paged in before its first matmul, so
 * its planes are in a frame when asked for. */
Test(cuda, qkv_and_gate_up_go_to_the_device_in_one_round_trip_each, .timeout = 120)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    setenv("JLM_CUDA_BLOCKS", "0", 1);   /* the matmul offload (whole blocks: whole_blocks_*) */
    char *dir = tu_tmpdir(), why[512];
    jlm_err err = {0};
    char *path = tu_convert("synth-llama-256.Q4_K_M.gguf", dir, "m.jlm", &err);
    cr_assert(path, "%s", err.msg);
    jlm_engine *ec = bm_open_opts(path, (jlm_engine_opts){.backend = "cpu"}, 0, why, sizeof why);
    uint32_t nv = jlm_engine_n_vocab(ec), L = jlm_engine_model(ec)->config.n_layer;
    float *l0 = malloc(nv * 4), *l1 = malloc(nv * 4);
    int32_t tok[3] = {5, 17, 2};
    cr_assert_eq(jlm_engine_eval(ec, tok, 3, l0, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_eval(ec, tok, 1, l0, &err), 0, "%s", err.msg);
    for (int cfg = 0; cfg < 2; cfg++) {
        jlm_engine_opts o = {.backend = "cuda", .device = "0", .budget = cfg ? 1 : 0, .gpu_budget = cfg ? 1 : 0};
        jlm_engine *e = bm_open_opts(path, o, 0, why, sizeof why);
        cr_assert_eq(jlm_engine_eval(e, tok, 3, l1, &err), 0, "%s", err.msg);
        jlm_dev_stats s0, s1;
        jlm_engine_dev_stats(e, &s0);
        cr_assert_eq(jlm_engine_eval(e, tok, 1, l1, &err), 0, "%s", err.msg);
        jlm_engine_dev_stats(e, &s1);
        cr_assert_eq(s1.matmuls - s0.matmuls, 7ull * L + 1, "cfg %d: matmuls %llu", cfg,
                     (unsigned long long)(s1.matmuls - s0.matmuls));
        cr_assert_eq(s1.waits - s0.waits, 4ull * L + 1, "cfg %d: round trips %llu (L %u)", cfg,
                     (unsigned long long)(s1.waits - s0.waits), L);
        cr_assert_eq(s1.fallbacks, 0);
        float big = 0, diff = 0;
        for (uint32_t i = 0; i < nv; i++) {
            big = fmaxf(big, fabsf(l0[i]));
            diff = fmaxf(diff, fabsf(l0[i] - l1[i]));
        }
        cr_assert_leq(diff, 1e-4f * big, "cfg %d: logits differ from the CPU by %g of %g", cfg, diff, big);
        jlm_engine_close(e);
    }
    jlm_engine_close(ec);
    free(l0);
    free(l1);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* --stats' `activations up U, down D` on the emulated CUDA device: a decoded
 * token with every block on the device moves its matmuls' input rows (one
 * upload for Q/K/V and one for gate/up, with a jlm_cu_act record a row) and
 * their results, counted at the host <-> device copies. */
Test(cuda, activations_up_and_down_are_the_bytes_the_matmuls_copied, .timeout = 120)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    setenv("JLM_CUDA_BLOCKS", "0", 1);   /* the matmul offload (whole blocks: whole_blocks_*) */
    bm_decode_activations("cuda", "0", sizeof(jlm_cu_act), 1);
}

/* Whole blocks on the emulated device (engine/exec_cu.c): the dense test
 * models give the CPU's greedy ids and logits whole and at --gpu-layers 2,
 * and a decoded token is one round trip (one stream synchronize) where the
 * matmul offload (JLM_CUDA_BLOCKS=0) makes 4 a layer: backend_matrix.h's
 * bm_whole_blocks. The matrix above runs the other models and budgets with
 * whole blocks on too (those the kernels are not wired for fall back). */
Test(cuda, whole_blocks_on_the_emulated_device_give_the_cpus_ids_in_one_round_trip_a_token, .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    bm_whole_blocks("cuda");
}

/* Test model `name` (tests/models/name.gguf) converted to dir/file: its path. */
static char *model_jlm(const char *name, const char *dir, const char *file)
{
    char gguf[256];
    jlm_err err = {0};
    snprintf(gguf, sizeof gguf, "%s.gguf", name);
    char *path = tu_convert(gguf, dir, file, &err);
    cr_assert(path, "%s: %s", name, err.msg);
    return path;
}

/* ev against the CPU's ec (model, what: the label): bm_device_run with the
 * CPU's 8 greedy ids; the decoded token's round trips (*rt) and activation
 * bytes up and down (*act), and no matmul ever refused. */
static void decoded_vs_cpu(jlm_engine *ec, jlm_engine *ev, double tol, const char *model, const char *what,
                           uint64_t *rt, uint64_t *act)
{
    float *l = malloc(jlm_engine_n_vocab(ec) * sizeof *l);
    int32_t ic[8];
    bm_greedy_ids(ec, BM_PROMPT, 5, 8, ic, l);
    free(l);
    jlm_dev_stats s0, s1;
    *rt = bm_device_run(ec, ev, ic, tol, model, what, &s0, &s1);
    cr_assert(s1.fallbacks == 0, "%s (%s): %llu matmuls refused", model, what, (unsigned long long)s1.fallbacks);
    *act = s1.act_up - s0.act_up + s1.act_down - s0.act_down;
}

/* Whole blocks over an F16 cache on the emulated device (--kv f16, every
 * block on the device: rows rounded to halves as the CPU's F16 cache rounds
 * them, attention reading halves): synth-llama-256 f32, Q8_0 and Q4_0 and
 * qwen3moe Q8_0 give the greedy ids of the CPU's own --kv f16 run, the
 * lockstep logits within the CPU's F16 tolerance (2e-3 of the largest on
 * float weights: an element one half-ulp off where the K/V rows' last f32
 * bits differ; 0.05 quantized), and a decoded token is one round trip (the
 * MoE model: at most one a MoE block plus one), where
 * an F16 cache used to leave the blocks on the matmul offload (4 round trips
 * a layer) and no matmul refused. */
typedef struct kv_model { const char *name; double tol; } kv_model;

/* Each model on whole blocks with a --kv kv cache on the emulated device
 * against the CPU's own --kv kv run: its greedy ids, the lockstep logits
 * within tol, and a decoded token at most one round trip a MoE block plus
 * one, with no matmul refused. */
static void whole_blocks_kv(const char *kv, const kv_model *models, size_t n_models)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    char *dir = tu_tmpdir(), what[32];
    snprintf(what, sizeof what, "--kv %s", kv);
    for (size_t m = 0; m < n_models; m++) {
        char *path, why[512];
        int32_t ic[8];
        jlm_engine *ec = bm_cpu_ids(dir, models[m].name, "kv.jlm", kv, &path, ic);
        jlm_engine *ev = bm_open_opts(path, (jlm_engine_opts){.backend = "cuda", .device = "0", .kv = kv}, 0, why,
                                      sizeof why);
        const jlm_config *c = &jlm_engine_model(ec)->config;
        jlm_dev_stats s1;
        uint64_t trips = bm_device_run(ec, ev, ic, models[m].tol, models[m].name, what, NULL, &s1);
        uint64_t blocks = c->n_expert ? c->n_layer - c->n_dense_lead : 0;   /* a round trip a MoE block */
        cr_assert(trips <= blocks + 1 && s1.fallbacks == 0,
                  "%s %s: a decoded token made %llu round trips (%llu MoE blocks), %llu matmuls refused",
                  models[m].name, what, (unsigned long long)trips, (unsigned long long)blocks,
                  (unsigned long long)s1.fallbacks);
        jlm_engine_close(ev);
        jlm_engine_close(ec);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

Test(cuda, whole_blocks_with_an_f16_cache_give_the_cpus_f16_ids_in_one_round_trip_a_token, .timeout = 300)
{
    static const kv_model MODELS[] = {{"synth-llama-256.f32", 2e-3}, {"synth-llama-256.Q8_0", 0.05},
                                      {"synth-llama-256.Q4_0", 0.05}, {"synth-qwen3moe-256.Q8_0", 0.05}};
    whole_blocks_kv("f16", MODELS, sizeof MODELS / sizeof MODELS[0]);
}

/* The same with a Q8_0 cache (its rows bit-identical to the CPU's): the
 * greedy ids of the CPU's own --kv q8_0 run, the logits within the CPU's own
 * Q8_0 tolerance (3e-2 of the largest, test_kv.c: a code one step of 1/127
 * off where a K/V row's last f32 bits differ) or the quantized weights' (0.05). */
Test(cuda, whole_blocks_with_a_q8_0_cache_give_the_cpus_q8_0_ids_in_one_round_trip_a_token, .timeout = 300)
{
    static const kv_model MODELS[] = {{"synth-llama-256.f32", 3e-2}, {"synth-llama-256.Q4_0", 0.05},
                                      {"synth-qwen3moe-256.Q8_0", 0.05}};
    whole_blocks_kv("q8_0", MODELS, sizeof MODELS / sizeof MODELS[0]);
}

/* gemma3 on whole blocks on the emulated device (sliding-window layers,
 * their own RoPE base, the fp16-table GELU gate times up, the post-norms),
 * over F32 and F16 caches, whole and at --gpu-layers 2: the CPU's greedy
 * ids, its logits within the whole-block tolerance, and a decoded token is
 * one round trip (the matmul offload, where GELU gates used to leave
 * gemma3's blocks: 4 a layer) with activations up + down of at most its
 * embedding, its logits and 4 KiB: backend_matrix.h's bm_whole_blocks_gemma3,
 * as on Vulkan. */
Test(cuda, whole_blocks_of_gemma3_and_an_f16_cache_give_the_cpus_ids, .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    static const char *const KV[] = {"f32", "f16"};
    bm_whole_blocks_gemma3("cuda", KV, 2);
}

/* The same with a Q8_0 cache on the emulated device (its rows bit-identical
 * to the CPU's, q8_0_rows_bit_identical_to_the_cpus_q8_0_cache) and with keys
 * and values of different types: whole blocks, one round trip a decoded
 * token, where a Q8_0 or mixed cache used to leave them on the matmul
 * offload. */
Test(cuda, whole_blocks_with_a_q8_0_cache_give_the_cpus_ids, .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    static const char *const KV[] = {"q8_0", "q8_0/f16", "f32/q8_0"};
    bm_whole_blocks_gemma3("cuda", KV, 3);
}

/* f's whole text (from its start), or NULL. */
static char *file_text(FILE *f)
{
    fflush(f);
    long n = ftell(f);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    rewind(f);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        return NULL;
    }
    if (b)
        b[n] = 0;
    return b;
}

/* Routed experts on the emulated device (engine/exec_cu_moe.c): the
 * llama-style MoE (F16, MXFP4 experts, Q4_K_M), qwen3moe (Q4_K_M, Q8_0;
 * per-head q/k norms) and glm4moe (Q8_0, Q4_K_M: sigmoid routing with its
 * selection bias, a leading dense block, a shared expert narrower than n_ff)
 * and gpt-oss (MXFP4 experts with biases, top-k-then-softmax routing,
 * SwiGLU-OAI; attention sinks and a sliding window of 8, passed by the 13
 * positions), Llama 4 (Q8_0, Q4_K_M: MoE every other block, the top-1
 * expert's sigmoid weight on its input, RoPE then a weightless q/k norm,
 * layers without RoPE and their attention temperature) and OLMoE (Q4_K_M:
 * q/k norms over the whole row), whole and at --gpu-layers 1 (a split inside the model): the CPU's greedy ids
 * (whole: its --trace-routing lines too), the lockstep logits within the whole-block
 * tolerances (float experts: 5e-4 of the largest), and a decoded token at
 * most one round trip a MoE block plus one (each block's router logits come
 * down; then the logits or the split's rows) where the matmul offload made
 * several a block. At one frame each side and at a --budget of half the
 * file (expert pages evicted and read again) the CPU's ids still. */
Test(cuda, moe_blocks_on_the_emulated_device_give_the_cpus_ids_in_a_round_trip_a_block, .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    static const char *MODELS[] = {"synth-llama-moe-256.F16", "synth-llama-moe-256.MXFP4_MOE",
                                   "synth-llama-moe-256.Q4_K_M", "synth-qwen3moe-256.Q4_K_M",
                                   "synth-qwen3moe-256.Q8_0", "synth-glm4moe-256.Q8_0", "synth-glm4moe-256.Q4_K_M",
                                   "synth-gpt-oss-256.MXFP4_MOE", "synth-llama4-256.Q8_0", "synth-llama4-256.Q4_K_M",
                                   "synth-olmoe-256.Q4_K_M"};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        char gguf[256], why[512];
        jlm_err err = {0};
        snprintf(gguf, sizeof gguf, "%s.gguf", MODELS[m]);
        char *path = tu_convert(gguf, dir, "moe.jlm", &err);
        cr_assert(path, "%s", err.msg);
        struct stat st;
        cr_assert_eq(stat(path, &st), 0, "%s", path);
        jlm_engine *ec = bm_open_opts(path, (jlm_engine_opts){.backend = "cpu"}, 0, NULL, 0);
        const jlm_config *c = &jlm_engine_model(ec)->config;
        uint32_t nv = jlm_engine_n_vocab(ec), L = c->n_layer, lead = c->n_dense_lead;
        float *l = malloc(nv * 4);
        int32_t prompt[5] = {1, 10, 20, 30, 40}, ic[8], iv[8];
        FILE *tc = tmpfile(), *tv = tmpfile();
        cr_assert(tc && tv && jlm_engine_trace_routing(ec, tc, &err) == 0, "%s", err.msg);
        bm_greedy_ids(ec, prompt, 5, 8, ic, l);
        jlm_engine_trace_routing(ec, NULL, NULL);
        jlm_engine_predict pc;   /* the CPU's predictions of the next block's experts */
        jlm_engine_predict_stats(ec, &pc);
        cr_assert(pc.predicted > 0, "%s: the CPU predicted no expert", MODELS[m]);
        double tol = m == 0 ? 5e-4 : 0.05;
        /* --gpu-budget 1 alone: the device's minimum beside an unlimited host, where the
         * next block's device prefetch must not take the experts' room */
        static const jlm_engine_opts CFG[] = {{.gpu_layers = 0}, {.gpu_layers = 1}, {.budget = 1, .gpu_budget = 1},
                                              {.budget = 2}, {.gpu_budget = 1}};
        for (int i = 0; i < 5; i++) {
            jlm_engine_opts o = CFG[i];
            o.backend = "cuda";
            o.device = "0";
            if (i == 3)
                o.budget = (uint64_t)st.st_size / 2;
            const char *what = i == 0   ? "whole"
                               : i == 1 ? "--gpu-layers 1"
                               : i == 2 ? "one frame each side"
                               : i == 3 ? "--budget half"
                                        : "--gpu-budget 1";
            jlm_engine *ev = bm_open_opts(path, o, 0, why, sizeof why);
            if (i == 0)   /* --trace-routing: every block's picks, row by row, the CPU's */
                cr_assert(jlm_engine_trace_routing(ev, tv, &err) == 0, "%s", err.msg);
            bm_greedy_ids(ev, prompt, 5, 8, iv, l);
            cr_assert(!memcmp(ic, iv, sizeof ic), "%s (%s): greedy ids differ from the CPU's", MODELS[m], what);
            if (i < 2)   /* the next block's experts predicted as the CPU predicts them */
                bm_same_predictions(ev, &pc, 1, MODELS[m], what);
            if (i == 0) {
                jlm_engine_trace_routing(ev, NULL, NULL);
                char *a = file_text(tc), *b = file_text(tv);
                cr_assert(a && b && strlen(a) > 100 && !strcmp(a, b), "%s: the routing differs from the CPU's:\n%s\n%s",
                          MODELS[m], a, b);
                free(a);
                free(b);
            }
            if (i >= 2) {
                jlm_engine_close(ev);
                continue;
            }
            int32_t next = bm_lockstep(ec, ev, prompt, 5, tol, MODELS[m], what);
            jlm_dev_stats s0, s1;
            jlm_engine_dev_stats(ev, &s0);
            cr_assert_eq(jlm_engine_eval(ev, &next, 1, l, &err), 0, "%s", err.msg);
            jlm_engine_dev_stats(ev, &s1);
            uint64_t blocks = 0;   /* the MoE blocks on the device (Llama 4's: every moe_step-th) */
            for (uint32_t b = lead; b < (o.gpu_layers ? o.gpu_layers : L); b++)
                blocks += !c->moe_step || (b + 1) % c->moe_step == 0;
            cr_assert(s1.waits - s0.waits <= blocks + 1 && s1.fallbacks == s0.fallbacks,
                      "%s (%s): a decoded token made %llu round trips for %llu MoE blocks", MODELS[m], what,
                      (unsigned long long)(s1.waits - s0.waits), (unsigned long long)blocks);
            jlm_engine_close(ev);
        }
        fclose(tc);
        fclose(tv);
        free(l);
        jlm_engine_close(ec);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* A MoE prefill's routed experts grouped by expert on the emulated device
 * (engine/exec_dev.c's jlm_exd_moe_group, exec_cu_moe.c's batch): the
 * CPU's picks and logits, one matmul per used expert and matrix
 * (backend_matrix.h's bm_moe_grouped_prefill, as on Vulkan). */
Test(cuda, moe_prefill_groups_the_rows_by_expert, .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    bm_moe_grouped_prefill("cuda");
}

/* The read-ahead's gate on the emulated device (exec_cu_moe.c asks the
 * CPU's jlm_stream_predict_now and picks with jlm_ex_predict_pick):
 * backend_matrix.h's bm_moe_gate, as on Vulkan. */
Test(cuda, moe_predictions_pass_the_cpus_gate_at_a_small_budget, .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    bm_moe_gate("cuda");
}

/* deepseek2's latent attention on the emulated device (engine/exec_cu_mla.c:
 * the latent and the shared RoPE key cached there, each head's query
 * through its attn_k_b sheet, one KV head, each head's output through its
 * attn_v_b sheet), beside its leading dense block and its sigmoid-routed MoE
 * blocks with a shared expert: Q8_0 and Q4_K_M, whole and at --gpu-layers 2,
 * with the CPU's F32 cache and with an F16 one (held to the CPU's own F16
 * run): the CPU's greedy ids, the lockstep logits within the quantized
 * tolerance, and a decoded token in at most a round trip a MoE block on the
 * device plus one, its activations within its embedding, its logits and 4
 * KiB, no matmul refused; a block left on the matmul offload (latent
 * attention on the host) makes a round trip a matmul. */
Test(cuda, deepseek2_latent_attention_blocks_run_whole_on_the_emulated_device, .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    static const char *MODELS[] = {"synth-deepseek2-256.Q8_0", "synth-deepseek2-256.Q4_K_M"};
    static const struct { uint32_t gpu_layers; const char *kv, *what; } CFG[] = {
        {0, "f32", "whole"}, {2, "f32", "--gpu-layers 2"}, {0, "f16", "whole, --kv f16"},
        {2, "f16", "--gpu-layers 2, --kv f16"}};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        char why[512], *path = model_jlm(MODELS[m], dir, "ds.jlm");
        for (size_t i = 0; i < sizeof CFG / sizeof CFG[0]; i++) {
            jlm_engine_opts o = {.backend = "cpu", .kv = CFG[i].kv};
            jlm_engine *ec = bm_open_opts(path, o, 0, NULL, 0);
            o.backend = "cuda";
            o.device = "0";
            o.gpu_layers = CFG[i].gpu_layers;
            jlm_engine *ev = bm_open_opts(path, o, 0, why, sizeof why);
            const jlm_config *c = &jlm_engine_model(ec)->config;
            uint32_t nv = jlm_engine_n_vocab(ec), on = o.gpu_layers ? o.gpu_layers : c->n_layer;
            uint64_t rt, act, moe = on > c->n_dense_lead ? on - c->n_dense_lead : 0;
            decoded_vs_cpu(ec, ev, 0.05, MODELS[m], CFG[i].what, &rt, &act);
            cr_assert(moe > 0 && rt <= moe + 1, "%s (%s): a decoded token made %llu round trips for %llu MoE blocks",
                      MODELS[m], CFG[i].what, (unsigned long long)rt, (unsigned long long)moe);
            cr_assert(act <= (uint64_t)c->n_embd * 4 + (uint64_t)nv * 4 + 4096,
                      "%s (%s): %llu activation bytes a decoded token (embedding %u, logits %u)", MODELS[m],
                      CFG[i].what, (unsigned long long)act, c->n_embd * 4, nv * 4);
            bm_sheet_matvecs(ev, on, MODELS[m], CFG[i].what);
            jlm_engine_close(ev);
            jlm_engine_close(ec);
        }
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* The engine's own sequence on whole blocks and a jlm_engine_seq on the
 * matmul offload, interleaved token by token on one engine: both the CPU's
 * logits, one round trip a token against several (bm_seq_interleave). */
Test(cuda, the_engines_sequence_on_the_device_and_a_host_sequence_interleave, .timeout = 120)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    bm_seq_interleave("cuda");
}

/* Three sequences, prefills one by one, then single and batched steps and a
 * rewind, on whole blocks with an F32, F16 and (synth-llama-256) Q8_0 cache (each sequence's
 * cache on the device), at --gpu-layers 2 and at --gpu-budget 1 (one device
 * frame): the ids and logits of each sequence alone on the CPU; a batched
 * step of three is one round trip with every block on the device (one a
 * block, 5, at one frame) (backend_matrix.h's bm_seq_batch). */
Test(cuda, several_sequences_batched_on_the_device_give_the_cpus_ids, .timeout = 240)
{
    bm_seq_batch("cuda", "stories260K.gguf", "f32", 0, 0, 1e-4f, 1);
    bm_seq_batch("cuda", "stories260K.gguf", "f16", 0, 0, 5e-4f, 1);
    bm_seq_batch("cuda", "synth-llama-256.f32.gguf", "q8_0", 0, 0, 5e-4f, 1);
    bm_seq_batch("cuda", "stories260K.gguf", "f16", 2, 0, 5e-4f, 1);
    bm_seq_batch("cuda", "stories260K.gguf", "f16", 0, 1, 5e-4f, 5);   /* one frame: a round trip a block */
}

/* --embeddings with whole blocks on the device: the CPU's (bm_embeddings_match). */
Test(cuda, embeddings_on_whole_blocks_equal_the_cpus, .timeout = 60)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    bm_embeddings_match("cuda", "");
}

/* From --stats: with --gpu-layers all (and the CLI's --kv auto: F16, kept
 * on the device by the whole blocks as on Vulkan) a decoded token is one
 * round trip (qwen3moe: one a MoE block, for its router's logits, plus one)
 * and its embedding and logits (plus the logits of the routers and the
 * routing weights, within 4 KiB); the offload 4 round trips a layer (QKV,
 * o, gate/up, down). */
Test(cuda, stats_a_decoded_token_is_one_round_trip_and_its_embedding_and_logits, .timeout = 120)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    bm_stats_decoded_token("cuda", "JLM_CUDA_BLOCKS", "", 4, "synth-qwen3moe-256.Q8_0", "f16");
}

/* The CLI: `jlm run --backend cuda` on the emulated device gives the CPU's
 * ids, whole and split, and --stats names the backend and its counters. */
Test(cuda, jlm_run_backend_cuda_emulated_gives_the_cpus_ids, .timeout = 120)
{
    char *dir = tu_tmpdir(), cmd[4096], *ref = NULL, *out = NULL;
    jlm_err err = {0};
    char *path = tu_convert("synth-qwen3moe-256.Q4_K_M.gguf", dir, "m.jlm", &err);
    cr_assert(path, "%s", err.msg);
    /* { ... 2>/dev/null; }: stdout only (tu_run adds 2>&1 after) */
    snprintf(cmd, sizeof cmd, "{ %s run %s -p 'a b c' -n 12 --temp 0 2>/dev/null; }", tu_jlm(), path);
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    static const char *ARGS[] = {"", "--gpu-layers 1", "--budget 1 --gpu-budget 1"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "{ JLM_CUDA_EMULATE=1 %s run %s -p 'a b c' -n 12 --temp 0 --backend cuda %s "
                 "2>/dev/null; }", tu_jlm(), path, ARGS[i]);
        cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
        cr_assert_str_eq(out, ref, "--backend cuda %s: differs from the CPU", ARGS[i]);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "{ JLM_CUDA_EMULATE=1 %s run %s -p 'a b c' -n 4 --temp 0 --backend cuda --stats >/dev/null; }",
             tu_jlm(), path);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    cr_assert(strstr(out, "note: matmuls on CUDA device host emulation"), "%s", out);
    cr_assert(strstr(out, "cuda: matmuls ") && strstr(out, "cpu fallbacks 0, graphs ") && strstr(out, "), runtime calls ") && strstr(out, ", device host emulation"), "%s", out);
    free(out);
    free(ref);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* Timing stamps (jlm bench --profile): on the emulated device a stamp runs
 * when its stream is waited for, so the interval between two holds the ops
 * between them; before that wait it cannot be read. */
Test(cuda, the_emulated_stamps_time_the_ops_between_them_once_run)
{
    jlm_cu_rt *r = emu_open();
    void *d = NULL;
    static char big[1 << 20];
    uint64_t ns = 1;
    cr_assert_eq(jlm_cu_rt_alloc(r, sizeof big, &d), 0);
    cr_assert_eq(jlm_cu_rt_stamp(r, 0, JLM_CU_S_COMPUTE), 0);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(jlm_cu_rt_h2d(r, d, big, sizeof big, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_stamp(r, 1, JLM_CU_S_COMPUTE), 0);
    cr_assert_neq(jlm_cu_rt_stamp_ns(r, 0, 1, &ns), 0, "read before the stream ran");
    cr_assert_eq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_stamp_ns(r, 0, 1, &ns), 0, "%s", jlm_cu_rt_error(r));
    cr_assert(ns > 0, "64 MiB of copies took no time");
    cr_assert_neq(jlm_cu_rt_stamp(r, JLM_CU_NSTAMP, JLM_CU_S_COMPUTE), 0, "a stamp past JLM_CU_NSTAMP");
    jlm_cu_rt_free(r, d);
    jlm_cu_rt_close(r);
}

/* jlm bench --profile --backend cuda (emulated): with whole blocks (the
 * default) the cuda line's matmul, attention and norms are each measured
 * (stamps on the compute stream at each op class of the block walk); with
 * the matmul offload (JLM_CUDA_BLOCKS=0) only the matmul (attention and
 * norms run on the CPU: 0); the classes within the token's time. */
Test(cuda, bench_profile_shows_the_devices_matmul_time, .timeout = 120)
{
    char *dir = tu_tmpdir(), cmd[2048], *o = NULL;
    for (int blocks = 1; blocks >= 0; blocks--) {
        snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s JLM_CUDA_EMULATE=1 JLM_CUDA_BLOCKS=%d %s bench %s -p 8 -n 4 -r 2 "
                 "-t 1 --profile --backend cuda --gpu-layers all 2>&1", dir, blocks, tu_jlm(),
                 tu_model("stories260K.gguf"));
        cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
        for (int t = 0; t < 2; t++) {
            double ms[4], tok;
            bm_prof_line(o, t ? "tg4" : "pp8", "cuda", "the emulation's stamps, on the host's clock", ms, &tok);
            cr_assert(ms[0] > 0, "no matmul time: %s", o);
            cr_assert(blocks ? ms[1] > 0 && ms[2] > 0 : ms[1] == 0 && ms[2] == 0,
                      "%s: attention %g, norms %g ms/token:\n%s", blocks ? "whole blocks" : "the offload", ms[1], ms[2],
                      o);
            cr_assert(ms[0] + ms[1] + ms[2] + ms[3] <= 1.05 * tok + 0.01, "more than the token:\n%s", o);
        }
        free(o);
    }
    tu_rmrf(dir);
    free(dir);
}

/* A prefill on whole blocks makes a fixed number of launches a block
 * (jlm_dev_stats.dispatches: kernel launches and device copies), whatever
 * its row count: the norms, the biases, RoPE (each row at its own
 * position), the cache's stores and attention (each row its own causal
 * keys and window) each take all the rows in one launch. 40 rows launch as
 * many as 5 (synth-llama Q4_K_M with an F32 cache, qwen3's per-head norms
 * with an F16 cache, gemma3's windows of 16 keys and its own RoPE base with
 * a Q8_0 cache); each prefill's logits are within the CPU's (same --kv)
 * tolerance with the CPU's pick, and each row is computed as a one-row
 * batch computes it: the 40-row prefill's logits equal those of the same
 * tokens evaluated one by one, bit for bit. deepseek2's latent attention
 * (an F32 and an F16 cache) likewise, its dense block 0 on the device;
 * qwen3moe's MoE blocks still launch each row's experts (exec_cu_moe.c):
 * its counts are logged, its logits held to the same checks. */
Test(cuda, a_prefill_launches_the_same_kernels_whatever_its_row_count, .timeout = 300)
{
    static const struct { const char *model, *kv; double tol; uint32_t gl; int fixed; } CASES[] = {
        {"synth-llama-256.Q4_K_M", "f32", 0.05, 0, 1},     {"synth-qwen3-256.Q8_0", "f16", 0.05, 0, 1},
        {"synth-gemma3-256.Q8_0", "q8_0", 0.05, 0, 1},     {"synth-qwen3moe-256.Q8_0", "f16", 0.05, 0, 0},
        {"synth-deepseek2-256.Q8_0", "f32", 0.05, 1, 1},   {"synth-deepseek2-256.Q4_K_M", "f16", 0.05, 1, 1}};
    static const uint32_t ROWS[2] = {5, 40};
    setenv("JLM_CUDA_EMULATE", "1", 1);
    char *dir = tu_tmpdir();
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        jlm_err err = {0};
        char *path = model_jlm(CASES[c].model, dir, "p.jlm");
        jlm_engine *ec = bm_engine_kv(path, "cpu", 0, CASES[c].kv);
        jlm_engine *ev = bm_engine_kv(path, "cuda", CASES[c].gl, CASES[c].kv);
        cr_assert(ec && ev, "%s: no engine", CASES[c].model);
        uint32_t nv = jlm_engine_n_vocab(ev), L = CASES[c].gl ? CASES[c].gl : jlm_engine_model(ev)->config.n_layer;
        int32_t prompt[40];
        for (int i = 0; i < 40; i++)
            prompt[i] = 3 + (i * 37) % (nv - 3 < 200 ? nv - 3 : 200);
        float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
        uint64_t d[2];
        for (int r = 0; r < 2; r++) {
            jlm_dev_stats s0, s1;
            char label[160];
            jlm_engine_rewind(ec, 0);
            jlm_engine_rewind(ev, 0);
            cr_assert_eq(jlm_engine_eval(ec, prompt, ROWS[r], lc, &err), 0, "%s", err.msg);
            jlm_engine_dev_stats(ev, &s0);
            cr_assert_eq(jlm_engine_eval(ev, prompt, ROWS[r], lv, &err), 0, "%s", err.msg);
            jlm_engine_dev_stats(ev, &s1);
            cr_assert(s1.fallbacks == s0.fallbacks && s1.dispatches > s0.dispatches, "%s: nothing on the device",
                      CASES[c].model);
            d[r] = s1.dispatches - s0.dispatches;
            snprintf(label, sizeof label, "%s (%s cache), a prefill of %u rows", CASES[c].model, CASES[c].kv, ROWS[r]);
            bm_lockstep_pick(lc, lv, nv, CASES[c].tol, label);
        }
        cr_log_info("%s (%s cache): a prefill of 5 rows launches %llu, of 40 rows %llu (%u blocks)", CASES[c].model,
                    CASES[c].kv, (unsigned long long)d[0], (unsigned long long)d[1], L);
        cr_assert(!CASES[c].fixed || d[0] == d[1], "%s (%s cache): a prefill of 5 rows launched %llu, of 40 rows %llu",
                  CASES[c].model, CASES[c].kv, (unsigned long long)d[0], (unsigned long long)d[1]);
        bm_prefill_as_one_row_at_a_time(ev, prompt, 40, lv, CASES[c].model, CASES[c].kv);
        free(lc);
        free(lv);
        jlm_engine_close(ev);
        jlm_engine_close(ec);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- graphs */

/* One engine on the emulated device (JLM_CUDA_GRAPH = graph), whole
 * blocks: a 20-token prompt and n greedy steps, then rewound to 0 and a
 * second prompt of np2 tokens and n steps: the ids (2n) and every logit
 * (2n rows) into ids and lg (n decoded tokens in the first run, n - 1 in
 * the second); st: the device's counters after the first run
 * (st[0]) and after both (st[1]). */
static void graph_run(const char *path, const char *graph, int n, uint32_t np2, int32_t *ids, float *lg,
                      jlm_dev_stats st[2])
{
    setenv("JLM_CUDA_GRAPH", graph, 1);
    jlm_engine *e = bm_engine_kv(path, "cuda", 0, NULL);
    cr_assert(e, "the emulated device");
    uint32_t nv = jlm_engine_n_vocab(e);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = 1 + (i * 7) % 50;
    jlm_err err = {0};
    for (int run = 0; run < 2; run++) {
        uint32_t np = run ? np2 : 20;
        if (run)
            jlm_engine_rewind(e, 0);
        cr_assert_eq(jlm_engine_eval(e, prompt + run, np, lg + (size_t)run * n * nv, &err), 0, "%s", err.msg);
        for (int i = 0; i < n; i++) {
            int32_t *id = &ids[run * n + i];
            const float *l = lg + ((size_t)run * n + i) * nv;
            *id = 0;
            for (uint32_t j = 1; j < nv; j++)
                if (l[j] > l[*id])
                    *id = (int32_t)j;
            if (i + 1 < n || !run)
                cr_assert_eq(jlm_engine_eval(e, id, 1, lg + ((size_t)run * n + i + 1) * nv, &err), 0, "%s", err.msg);
        }
        cr_assert(jlm_engine_dev_stats(e, &st[run]), "no device");
    }
    jlm_engine_close(e);
    unsetenv("JLM_CUDA_GRAPH");
}

/* A decoded token's launches are one graph on the emulated device: for
 * synth-llama-256 (f32, Q4_0, Q4_K_M), gemma3 (sliding windows, past the
 * window of 16) and a MoE model, n greedy steps with the graph give the ids
 * and the logits (bit for bit) of JLM_CUDA_GRAPH=0; each decoded token
 * after the first is one graph launch (dense: captured once, so every
 * launch is the same graph, the position read on the device; MoE: the
 * stretch before the first routing wait, at least); rewound to a prompt of
 * the same length the graph is replayed from the first decoded token with
 * no new capture, and after a longer prompt (the buffers grow: other
 * pointers) it is captured once more. JLM_CUDA_GRAPH=0 launches none and
 * makes more runtime calls, and the same launches and device copies
 * (jlm_dev_stats.dispatches: a graph's counted at each replay). deepseek2's
 * latent attention tapes its one-row strided norm and copy too. */
Test(cuda, a_decoded_token_is_one_graph_launch_with_the_logits_of_no_graph, .timeout = 300)
{
    setenv("JLM_CUDA_EMULATE", "1", 1);
    static const struct { const char *name; int moe; } MODELS[] = {
        {"synth-llama-256.f32", 0}, {"synth-llama-256.Q4_0", 0}, {"synth-llama-256.Q4_K_M", 0},
        {"synth-gemma3-256.Q8_0", 0}, {"synth-qwen3moe-256.Q8_0", 1}, {"synth-deepseek2-256.Q8_0", 1}};
    enum { N = 8 };
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        char gguf[256];
        snprintf(gguf, sizeof gguf, "%s.gguf", MODELS[m].name);
        jlm_err err = {0};
        char *path = tu_convert(gguf, dir, "g.jlm", &err);
        cr_assert(path, "%s: %s", MODELS[m].name, err.msg);
        for (int longer = 0; longer < 2; longer++) {
            uint32_t np2 = longer ? 36 : 20, nv = 0;
            {
                jlm_engine *e = bm_engine_kv(path, "cpu", 0, NULL);
                nv = jlm_engine_n_vocab(e);
                jlm_engine_close(e);
            }
            size_t nl = (size_t)2 * N * nv;
            float *l1 = calloc(nl, 4), *l0 = calloc(nl, 4);
            int32_t i1[2 * N], i0[2 * N];
            jlm_dev_stats s1[2], s0[2];
            graph_run(path, "1", N, np2, i1, l1, s1);
            graph_run(path, "0", N, np2, i0, l0, s0);
            const char *mn = MODELS[m].name;
            cr_assert(!memcmp(i1, i0, sizeof i1), "%s: the graph's ids differ", mn);
            cr_assert(!memcmp(l1, l0, nl * 4), "%s: the graph's logits are not bit-identical", mn);
            cr_assert_eq(s0[1].graph_launches + s0[1].graph_captures, 0, "%s: JLM_CUDA_GRAPH=0 launched graphs", mn);
            /* the first run: N decoded tokens, the first taped and issued, the second captured */
            uint64_t g1 = s1[0].graph_launches, g2 = s1[1].graph_launches - g1;
            uint64_t c1 = s1[0].graph_captures, c2 = s1[1].graph_captures - c1;
            if (!MODELS[m].moe) {
                cr_assert_eq(g1, N - 1, "%s: %llu graph launches for %d decoded tokens", mn, (unsigned long long)g1,
                             N);
                cr_assert_eq(c1, 1, "%s: %llu captures at fixed shapes", mn, (unsigned long long)c1);
                cr_assert_eq(g2, longer ? N - 2 : N - 1, "%s: after the rewind, %llu graph launches", mn,
                             (unsigned long long)g2);
                cr_assert_eq(c2, (uint64_t)longer, "%s: after the rewind, %llu captures", mn, (unsigned long long)c2);
            } else {
                cr_assert_geq(g1, N - 2, "%s: %llu graph launches for %d decoded MoE tokens", mn,
                              (unsigned long long)g1, N);
            }
            cr_assert_lt(s1[1].rt_calls, s0[1].rt_calls, "%s: the graph made no fewer runtime calls", mn);
            for (int run = 0; run < 2; run++)   /* a graph's launches count at each replay, as issued one by one */
                cr_assert(s0[run].dispatches && s1[run].dispatches == s0[run].dispatches,
                          "%s: %llu launches and device copies with the graphs, %llu without", mn,
                          (unsigned long long)s1[run].dispatches, (unsigned long long)s0[run].dispatches);
            free(l1);
            free(l0);
        }
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* The launches that read the position from device memory (a decoded
 * token's, kept equal for its graph) give what the launch-argument forms
 * give, bit for bit, on the emulated seam: the cache store at *dpos of each
 * cache type (F32 as a copy, F16 as to_f16, Q8_0 as kv_q8), RoPE at *dpos,
 * attention over the keys *dpos sees (all, a sliding window's, a chunk's)
 * against the same kernel given n_kv and the first key; a position past the
 * cache faults when the store runs. */
Test(cuda, the_device_position_forms_equal_the_launch_argument_forms)
{
    enum { W = 64, ROWS = 8, NH = 2, HD = 32 };
    jlm_cu_rt *r = emu_open();
    float hx[W], hq[NH * HD];
    for (int i = 0; i < W; i++)
        hx[i] = sinf((float)i * 0.7f) * 3.0f;
    for (int i = 0; i < NH * HD; i++)
        hq[i] = cosf((float)i * 0.3f);
    void *x, *q, *dp, *c1, *c2, *o1, *o2, *sc;
    uint64_t cb = jlm_cu_kv_bytes(JLM_CU_KV_F32, (uint64_t)ROWS * W);
    cr_assert_eq(jlm_cu_rt_alloc(r, W * 4, &x) | jlm_cu_rt_alloc(r, NH * HD * 4, &q) | jlm_cu_rt_alloc(r, 4, &dp) |
                     jlm_cu_rt_alloc(r, cb, &c1) | jlm_cu_rt_alloc(r, cb, &c2) | jlm_cu_rt_alloc(r, NH * HD * 4, &o1) |
                     jlm_cu_rt_alloc(r, NH * HD * 4, &o2) | jlm_cu_rt_alloc(r, NH * ROWS * 4, &sc), 0);
    uint8_t *h1 = malloc(cb), *h2 = malloc(cb);
    cr_assert_eq(jlm_cu_rt_h2d(r, x, hx, W * 4, JLM_CU_S_COMPUTE), 0);
    for (int t = 0; t < 3; t++) {
        uint64_t rb = jlm_cu_kv_bytes(t, W);
        memset(h1, 0x5a, cb);
        cr_assert_eq(jlm_cu_rt_h2d(r, c1, h1, cb, JLM_CU_S_COMPUTE) | jlm_cu_rt_h2d(r, c2, h1, cb, JLM_CU_S_COMPUTE), 0);
        for (uint32_t p = 0; p < ROWS; p += 3) {
            cr_assert_eq(jlm_cu_rt_h2d(r, dp, &p, 4, JLM_CU_S_COMPUTE), 0);
            cr_assert_eq(jlm_cu_rt_kv_store(r, t, c1, rb, ROWS * rb, dp, x, W, JLM_CU_S_COMPUTE), 0);
            uint8_t *d2 = (uint8_t *)c2 + p * rb;
            cr_assert_eq(t == JLM_CU_KV_F16  ? jlm_cu_rt_to_f16(r, (uint16_t *)(void *)d2, x, W, JLM_CU_S_COMPUTE)
                         : t == JLM_CU_KV_Q8_0 ? jlm_cu_rt_kv_q8(r, d2, x, W, JLM_CU_S_COMPUTE)
                                               : jlm_cu_rt_d2d(r, d2, x, W * 4, JLM_CU_S_COMPUTE), 0);
        }
        cr_assert_eq(jlm_cu_rt_d2h(r, h1, c1, cb, JLM_CU_S_COMPUTE) | jlm_cu_rt_d2h(r, h2, c2, cb, JLM_CU_S_COMPUTE) |
                         jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "%s", jlm_cu_rt_error(r));
        cr_assert(!memcmp(h1, h2, cb), "cache type %d: the store at the device's position differs", t);
    }
    /* keys: the F32 cache c2 filled with varied rows */
    float *hk = malloc(cb);
    for (uint64_t i = 0; i < (uint64_t)ROWS * W; i++)
        hk[i] = sinf((float)i * 0.11f);
    cr_assert_eq(jlm_cu_rt_h2d(r, c2, hk, cb, JLM_CU_S_COMPUTE), 0);
    static const uint32_t RULE[][2] = {{0, 0}, {3, 0}, {0, 4}};   /* {win, chunk} */
    for (int ru = 0; ru < 3; ru++)
        for (uint32_t p = 0; p < ROWS; p++) {
            uint32_t win = RULE[ru][0], chunk = RULE[ru][1];
            uint32_t lo = chunk ? p / chunk * chunk : win && p >= win ? p - win + 1 : 0;
            jlm_cu_attn a = {.n_head = NH, .n_head_kv = 1, .head_dim = HD, .head_dim_v = HD, .n_kv = p + 1 - lo,
                             .k_stride = W, .v_stride = W, .k_head_stride = 0, .v_head_stride = HD,
                             .scale = 0.2f};
            jlm_cu_attn b = a;
            b.n_kv = ROWS, b.dpos = dp, b.win = win, b.chunk = chunk;
            cr_assert_eq(jlm_cu_rt_h2d(r, q, hq, NH * HD * 4, JLM_CU_S_COMPUTE) |
                             jlm_cu_rt_h2d(r, dp, &p, 4, JLM_CU_S_COMPUTE), 0);
            cr_assert_eq(jlm_cu_rt_attn(r, &a, q, (float *)c2 + lo * W, (float *)c2 + lo * W, sc, o1,
                                        JLM_CU_S_COMPUTE), 0);
            cr_assert_eq(jlm_cu_rt_attn(r, &b, q, c2, c2, sc, o2, JLM_CU_S_COMPUTE), 0);
            jlm_cu_rope rp = {.n_rot = HD, .freq_base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f};
            cr_assert_eq(jlm_cu_rt_rope(r, &rp, o1, NH, HD, p, JLM_CU_S_COMPUTE), 0);
            rp.dpos = dp;
            cr_assert_eq(jlm_cu_rt_rope(r, &rp, o2, NH, HD, 12345, JLM_CU_S_COMPUTE), 0);
            cr_assert_eq(jlm_cu_rt_d2h(r, h1, o1, NH * HD * 4, JLM_CU_S_COMPUTE) |
                             jlm_cu_rt_d2h(r, h2, o2, NH * HD * 4, JLM_CU_S_COMPUTE) | jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE),
                         0, "%s", jlm_cu_rt_error(r));
            cr_assert(!memcmp(h1, h2, NH * HD * 4), "rule %d, position %u: attention and RoPE at the device's "
                      "position differ", ru, p);
        }
    uint32_t past = ROWS;
    cr_assert_eq(jlm_cu_rt_h2d(r, dp, &past, 4, JLM_CU_S_COMPUTE), 0);
    cr_assert_eq(jlm_cu_rt_kv_store(r, JLM_CU_KV_F32, c1, W * 4, ROWS * W * 4ull, dp, x, W, JLM_CU_S_COMPUTE), 0);
    cr_assert_neq(jlm_cu_rt_sync(r, JLM_CU_S_COMPUTE), 0, "a store past the cache ran");
    cr_assert(strstr(jlm_cu_rt_error(r), "past"), "%s", jlm_cu_rt_error(r));
    free(hk);
    free(h1);
    free(h2);
    jlm_cu_rt_close(r);
}
