/* test_cuda.c - suite `cuda`: the CUDA kernels' per-thread bodies
 * (kernels/cuda/body.h), run by the host harness over the kernels' grids,
 * against the CPU reference kernels on random data and edge shapes. This is
 * what CI checks of the CUDA backend without a GPU: indexing into the packed
 * planes, the grid split, the reduction phases and the arithmetic. Launches
 * and device memory are checked by build/jlm-cuda-check on a GPU machine
 * (bench/gpu-check.sh); the probe test here skips with one line without one. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tolerances.h"
#include "kernels/cuda/cuda.h"
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
    memset(y1, 0xff, rows * 4);
    jlm_cu_host_matvec(&g.m, x, ap, y1);
    for (uint64_t r = 0; r < rows; r++)
        cr_assert(memcmp(&y0[r], &y1[r], 4) == 0, "%s k %llu rows %llu: row %llu cuda %.9g ref %.9g",
                  jlm_fmt_type_traits(type)->name, (unsigned long long)k, (unsigned long long)rows,
                  (unsigned long long)r, y1[r], y0[r]);
    free(x), free(y0), free(y1), free(abuf);
    gen_mat_free(&g);
}

Test(cuda, matvec_every_type_bit_identical_to_ref)
{
    /* rows: one, odd (shared d words of Q4_0/Q8_0/Q5_0/MXFP4 half-filled),
     * one past a block of 128 threads, several blocks */
    static const uint64_t ROWS[] = {1, 3, 7, 129, 300};
    for (int i = 0; i < 12; i++) {
        uint8_t type = GEN_TYPES[i];
        const jlm_type_traits *t = jlm_fmt_type_traits(type);
        uint64_t super = t->is_float ? 32 : (uint64_t)t->sub * t->super_sub;
        for (unsigned ks = 1; ks <= 3; ks++)
            for (unsigned ri = 0; ri < sizeof ROWS / sizeof ROWS[0]; ri++)
                check_matvec(type, super * ks * (super < 256 ? 2 : 1), ROWS[ri], 77 + i * 31 + ks * 7 + ri);
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

static void check_attn(attn_case c, uint64_t seed)
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
    /* KV cache as (kv head, position, dim) */
    jlm_cu_attn p = {c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.n_kv, c.head_dim, c.head_dim_v,
                     c.n_kv * c.head_dim, c.n_kv * c.head_dim_v, 1.0f / sqrtf((float)c.head_dim),
                     c.softcap, c.sinks ? sinks : NULL, c.mask ? mask : NULL};
    jlm_cu_host_attn(&p, q, k, v, scores, o1);
    for (uint32_t h = 0; h < c.n_head; h++) {
        uint32_t g = h / (c.n_head / c.n_head_kv);
        jlm_k_attn cp = {c.head_dim, c.head_dim_v, c.head_dim, c.head_dim_v, p.scale, c.softcap,
                         c.sinks, sinks[h], p.mask};
        jlm_k_attn_head(&cp, q + h * c.head_dim, k + g * p.k_head_stride, v + g * p.v_head_stride,
                        c.n_kv, scratch, o0 + h * c.head_dim_v);
        assert_close(scratch, scores + h * c.n_kv, c.n_kv, JLM_K_TOL_SOFTMAX, "attn probabilities");
    }
    assert_close(o0, o1, (uint64_t)c.n_head * c.head_dim_v, JLM_K_TOL_SOFTMAX, "attn out");
    free(q), free(k), free(v), free(mask), free(scores), free(scratch), free(o0), free(o1);
}

Test(cuda, attention_gqa_matches_cpu)
{
    static const attn_case C[] = {
        {8, 2, 64, 64, 1, 0, 0, 0},        /* first token */
        {8, 2, 64, 64, 17, 0, 0, 0},
        {8, 8, 32, 32, 300, 0, 0, 1},      /* MHA, sliding window */
        {8, 1, 64, 64, 1000, 0, 1, 0},     /* MQA with sinks */
        {4, 2, 128, 64, 257, 30.0f, 0, 0}, /* softcap, head_dim_v != head_dim */
        {4, 2, 64, 64, 40, 0, 0, 2},       /* everything masked: out 0 */
        {4, 2, 64, 64, 40, 0, 1, 2},       /* everything masked but the sink */
    };
    for (unsigned i = 0; i < sizeof C / sizeof C[0]; i++)
        check_attn(C[i], 100 + i);
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
