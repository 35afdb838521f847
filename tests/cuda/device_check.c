/* device_check.c - build/jlm-cuda-check: the CUDA kernels on a real device.
 * Launches every kernel of kernels/cuda/kernels.cu on device memory and
 * compares it with the CPU reference (matvec and quantization bit for bit,
 * the f32 ops within kernels/cpu/tolerances.h x JLM_CU_DEV_SLACK, since the
 * device's expf/cosf/powf are not glibc's), then measures matvec bandwidth
 * against a device-to-device copy and a pinned host-to-device copy measured
 * in the same run. Self-contained (no Criterion, SQLite, FUSE): it is what
 * bench/gpu-check.sh runs on a GPU machine. Without a device it prints one
 * "skip" line naming why and exits 0.
 * The bench ends with the decode shapes of a 1B model: kernel time and an
 * engine-style round trip per launch.
 * Usage: jlm-cuda-check [--no-bench] [--bench-n N]   (N: rows = k of the bench, default 16384) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/tolerances.h"
#include "kernels/cuda/cuda.h"
#include "tests/cuda/gen.h"

#define JLM_CU_DEV_SLACK 8.0   /* device libm: a few ulp where glibc is correctly rounded */

#ifdef JLM_CUDA
#include <cuda_runtime_api.h>

static int fails;

#define CK(call)                                                                   \
    do {                                                                           \
        cudaError_t e_ = (call);                                                   \
        if (e_ != cudaSuccess) {                                                   \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

static void *dev_copy(const void *h, size_t n)
{
    void *d = NULL;
    CK(cudaMalloc(&d, n ? n : 4));
    if (n)
        CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static void *dev_zero(size_t n)
{
    void *d = NULL;
    CK(cudaMalloc(&d, n ? n : 4));
    CK(cudaMemset(d, 0, n ? n : 4));
    return d;
}

static void back(void *h, const void *d, size_t n)
{
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

static void launch_ok(int rc, const char *what)
{
    if (rc) {
        printf("FAIL launch %s: %s\n", what, jlm_cu_launch_error(rc));
        exit(1);
    }
}

/* Device activations of k floats (x already on the device). */
typedef struct dev_act { jlm_cu_act host_view; jlm_cu_act *dev; } dev_act;

static void dev_act_make(dev_act *a, uint64_t k)
{
    a->host_view = (jlm_cu_act){k, dev_zero(k), dev_zero(k / 32 * 4), dev_zero(k / 16 * 2)};
    a->dev = dev_copy(&a->host_view, sizeof a->host_view);
}

static void dev_act_free(dev_act *a)
{
    cudaFree(a->host_view.q), cudaFree(a->host_view.d), cudaFree(a->host_view.sum16), cudaFree(a->dev);
}

/* Uploads g's planes; *cm gets device plane pointers. */
static void dev_mat(const gen_mat *g, jlm_cu_mat *cm)
{
    jlm_cu_mat_from(&g->m, cm);
    cm->qs = dev_copy(g->qs, g->qs_bytes);
    cm->d = dev_copy(g->d, g->d_bytes);
    cm->sc = dev_copy(g->sc, g->sc_bytes);
}

static void dev_mat_free(jlm_cu_mat *cm)
{
    cudaFree((void *)cm->qs), cudaFree((void *)cm->d), cudaFree((void *)cm->sc);
}

/* ---------------------------------------------------------------- correctness */

static void check_matvec(uint8_t type, uint64_t k, uint64_t rows, uint64_t n, uint64_t seed)
{
    const char *name = jlm_fmt_type_traits(type)->name;
    gen_mat g;
    if (gen_mat_make(&g, type, k, rows, &seed)) {
        printf("FAIL matvec %s: cannot make k %llu rows %llu\n", name, (unsigned long long)k, (unsigned long long)rows);
        fails++;
        return;
    }
    float *x = malloc(n * k * 4), *y0 = malloc(n * rows * 4), *y1 = malloc(n * rows * 4);
    gen_floats(x, n * k, 2.0f, &seed);
    jlm_act_q8 *aq = calloc(n, sizeof *aq);
    void **abuf = calloc(n, sizeof *abuf);
    dev_act *da = calloc(n, sizeof *da);
    jlm_cu_act *views = calloc(n, sizeof *views);
    float *dx = dev_copy(x, n * k * 4), *dy = dev_zero(n * rows * 4);
    int quant = !jlm_fmt_type_traits(type)->is_float;
    for (uint64_t t = 0; quant && t < n; t++) {
        abuf[t] = malloc(jlm_k_act_q8_bytes(k));
        jlm_k_act_q8_init(&aq[t], abuf[t], k, NULL);
        jlm_k_quantize_act(x + t * k, &aq[t]);
        dev_act_make(&da[t], k);
        launch_ok(jlm_cu_launch_quantize(dx + t * k, &da[t].host_view, NULL), "quantize");
        views[t] = da[t].host_view;
        int8_t *q = malloc(k);
        back(q, da[t].host_view.q, k);
        if (memcmp(q, aq[t].q, k)) {
            printf("FAIL quantize k %llu: device codes differ from jlm_k_quantize_act\n", (unsigned long long)k);
            fails++;
        }
        free(q);
    }
    jlm_cu_act *dviews = quant ? dev_copy(views, n * sizeof *views) : NULL;
    jlm_cu_mat cm;
    dev_mat(&g, &cm);
    launch_ok(jlm_cu_launch_matvec(&cm, n, dx, dviews, dy, NULL), "matvec");
    back(y1, dy, n * rows * 4);
    jlm_k_matmul_ref(&g.m, n, x, quant ? aq : NULL, y0, 0, rows);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n * rows; i++)
        bad += memcmp(&y0[i], &y1[i], 4) != 0;
    if (bad) {
        printf("FAIL matvec %s k %llu rows %llu n %llu: %llu of %llu outputs differ from ref\n", name,
               (unsigned long long)k, (unsigned long long)rows, (unsigned long long)n,
               (unsigned long long)bad, (unsigned long long)(n * rows));
        fails++;
    }
    for (uint64_t t = 0; quant && t < n; t++)
        dev_act_free(&da[t]), free(abuf[t]);
    dev_mat_free(&cm);
    cudaFree(dx), cudaFree(dy), cudaFree(dviews);
    free(x), free(y0), free(y1), free(aq), free(abuf), free(da), free(views);
    gen_mat_free(&g);
}

/* jlm_cu_launch_matvec_batch: nb sheets back to back in each plane (deepseek2's
 * per-head attn_k_b / attn_v_b), token t of sheet h at t*tx + h*bx (record
 * h*rs + t), its rows at t*ty + h*by: each (sheet, token) bit-identical to
 * jlm_k_matvec_ref, the gaps between them untouched. */
static void check_batch(uint8_t type, uint64_t k, uint64_t rows, uint32_t nb, uint32_t n, uint64_t seed)
{
    const char *name = jlm_fmt_type_traits(type)->name;
    int fl = jlm_fmt_type_traits(type)->is_float;
    gen_batch g;
    if (gen_batch_make(&g, type, k, rows, nb, n, &seed)) {
        printf("FAIL batched matvec %s: cannot make k %llu rows %llu\n", name, (unsigned long long)k,
               (unsigned long long)rows);
        fails++;
        gen_batch_free(&g);
        return;
    }
    uint64_t rs = n + 1, nx = n * g.tx, ny = n * g.ty;
    jlm_cu_mat cm;
    jlm_cu_mat_from(&g.m, &cm);
    cm.qs = dev_copy(g.q, nb * g.ql + 4);
    cm.d = dev_copy(g.d, nb * g.dl + 4);
    cm.sc = dev_copy(g.s, nb * g.sl + 4);
    float *dx = dev_copy(g.x, nx * 4), *dad = dev_copy(g.ad, nx / 8 + 4), *y = malloc(ny * 4);
    int8_t *daq = dev_copy(g.aq, nx);
    int16_t *das = dev_copy(g.as, nx / 8 + 4);
    jlm_cu_act *rec = calloc(nb * rs, sizeof *rec);
    for (uint32_t h = 0; h < nb; h++)
        for (uint32_t t = 0; t < n; t++) {
            uint64_t o = t * g.tx + h * g.bx;
            rec[h * rs + t] = (jlm_cu_act){k, daq + o, dad + o / 32, das + o / 16};
        }
    jlm_cu_act *drec = dev_copy(rec, nb * rs * sizeof *rec);
    memset(y, 0xff, ny * 4);
    float *dy = dev_copy(y, ny * 4);
    jlm_cu_batch b = {nb, g.tx, g.ty, g.bx, g.by, g.ql, g.dl, g.sl, rs};
    launch_ok(jlm_cu_launch_matvec_batch(&cm, &b, n, fl ? dx : NULL, fl ? NULL : drec, dy, NULL), "batched matvec");
    back(y, dy, ny * 4);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < ny; i++)
        bad += memcmp(&y[i], &g.ref[i], 4) != 0;
    if (bad) {
        printf("FAIL batched matvec %s k %llu rows %llu, %u sheets of %u tokens: %llu of %llu outputs differ\n", name,
               (unsigned long long)k, (unsigned long long)rows, nb, n, (unsigned long long)bad,
               (unsigned long long)ny);
        fails++;
    }
    dev_mat_free(&cm);
    cudaFree(dx), cudaFree(dad), cudaFree(daq), cudaFree(das), cudaFree(drec), cudaFree(dy);
    free(y), free(rec);
    gen_batch_free(&g);
}

static void check_all_matvec(void)
{
    int before = fails;
    for (int i = 0; i < 12; i++) {
        const jlm_type_traits *t = jlm_fmt_type_traits(GEN_TYPES[i]);
        uint64_t super = t->is_float ? 32 : (uint64_t)t->sub * t->super_sub;
        check_matvec(GEN_TYPES[i], super * 4, 1, 1, 1 + i);
        check_matvec(GEN_TYPES[i], super * 2, 301, 1, 100 + i);
        check_matvec(GEN_TYPES[i], 4096, 1000, 3, 200 + i);   /* prefill: 3 tokens */
        check_matvec(GEN_TYPES[i], 2304, 77, 2, 300 + i);     /* 72 terms: a partial chunk; a partial block */
    }
    printf("%s matvec: 12 types x 4 shapes, device bit-identical to jlm_k_matvec_ref\n",
           fails == before ? "PASS" : "FAIL");
    before = fails;
    for (int i = 0; i < 12; i++) {
        const jlm_type_traits *t = jlm_fmt_type_traits(GEN_TYPES[i]);
        uint64_t k = t->is_float ? 64 : 2 * (uint64_t)t->sub * t->super_sub;
        check_batch(GEN_TYPES[i], k, 40, 4, 1, 400 + i);
        check_batch(GEN_TYPES[i], k, 33, 3, 5, 500 + i);
    }
    printf("%s batched matvec: 12 types x 2 shapes (sheets x tokens), device bit-identical to jlm_k_matvec_ref\n",
           fails == before ? "PASS" : "FAIL");
}

static int close_all(const float *want, const float *got, uint64_t n, double tol)
{
    for (uint64_t i = 0; i < n; i++) {
        double err = fabs((double)want[i] - (double)got[i]), mag = fmax(1.0, fabs((double)want[i]));
        if (!(err <= tol * JLM_CU_DEV_SLACK * mag))
            return 0;
    }
    return 1;
}

static void report(int ok, const char *what)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    fails += !ok;
}

static void check_ops(void)
{
    enum { N = 5000 };
    static float x[N], w[N], b[N], o0[N], o1[N];
    uint64_t seed = 7;
    gen_floats(x, N, 4.0f, &seed);
    gen_floats(w, N, 1.5f, &seed);
    gen_floats(b, N, 4.0f, &seed);
    float *dx = dev_copy(x, sizeof x), *dw = dev_copy(w, sizeof w), *db = dev_copy(b, sizeof b), *dout = dev_zero(sizeof x);
    jlm_k_rmsnorm(o0, x, w, N, 1e-6f);
    launch_ok(jlm_cu_launch_rmsnorm(dout, dx, dw, N, 1e-6f, NULL), "rmsnorm");
    back(o1, dout, sizeof o1);
    report(close_all(o0, o1, N, JLM_K_TOL_NORM), "rmsnorm n 5000");
    jlm_k_layernorm(o0, x, w, b, N, 1e-5f);
    launch_ok(jlm_cu_launch_layernorm(dout, dx, dw, db, N, 1e-5f, NULL), "layernorm");
    back(o1, dout, sizeof o1);
    report(close_all(o0, o1, N, JLM_K_TOL_NORM), "layernorm n 5000");
    memcpy(o0, x, sizeof x);
    jlm_k_softmax(o0, N);
    CK(cudaMemcpy(dout, x, sizeof x, cudaMemcpyHostToDevice));
    launch_ok(jlm_cu_launch_softmax(dout, N, NULL), "softmax");
    back(o1, dout, sizeof o1);
    report(close_all(o0, o1, N, JLM_K_TOL_SOFTMAX), "softmax n 5000");
    int ok = 1;
    for (int op = JLM_CU_SILU; op < JLM_CU_NOP; op++) {
        jlm_cu_host_elem(op, o0, x, b, N, 0.5f, 7.0f);
        launch_ok(jlm_cu_launch_elem(op, dout, dx, db, N, 0.5f, 7.0f, NULL), "elem");
        back(o1, dout, sizeof o1);
        ok &= close_all(o0, o1, N, JLM_K_TOL_ACT);
    }
    report(ok, "activations (9 ops) vs the host harness");
    jlm_k_rope p;
    jlm_k_rope_defaults(&p, 128, 500000.0f);
    p.neox = 1;
    memcpy(o0, x, 32 * 128 * 4);
    jlm_k_rope_apply(&p, o0, 32, 128, 4321);
    jlm_cu_rope cp;
    jlm_cu_rope_from(&p, &cp);
    CK(cudaMemcpy(dout, x, 32 * 128 * 4, cudaMemcpyHostToDevice));
    launch_ok(jlm_cu_launch_rope(&cp, dout, 32, 128, 4321, NULL), "rope");
    back(o1, dout, 32 * 128 * 4);
    report(close_all(o0, o1, 32 * 128, JLM_K_TOL_ROPE), "rope neox 32 heads x 128 at pos 4321");
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dout);
}

static void check_attn(void)
{
    enum { H = 32, HKV = 8, D = 128, NKV = 777 };
    static float q[H * D], k[HKV * NKV * D], v[HKV * NKV * D], o0[H * D], o1[H * D], sc[H * NKV], sinks[H];
    uint64_t seed = 21;
    gen_floats(q, H * D, 2.0f, &seed);
    gen_floats(k, HKV * NKV * D, 2.0f, &seed);
    gen_floats(v, HKV * NKV * D, 1.0f, &seed);
    gen_floats(sinks, H, 3.0f, &seed);
    jlm_cu_attn p = {H, HKV, D, D, NKV, D, D, (uint64_t)NKV * D, (uint64_t)NKV * D, 0.088388f, 0.0f, sinks, NULL, 0, 0, NULL, 0, 0};
    jlm_cu_host_attn(&p, q, k, v, sc, o0);
    jlm_cu_attn dp = p;
    dp.sinks = dev_copy(sinks, sizeof sinks);
    float *dq = dev_copy(q, sizeof q), *dk = dev_copy(k, sizeof k), *dv = dev_copy(v, sizeof v);
    float *dsc = dev_zero(sizeof sc), *dout = dev_zero(sizeof o1);
    launch_ok(jlm_cu_launch_attn(&dp, dq, dk, dv, dsc, dout, NULL), "attn");
    back(o1, dout, sizeof o1);
    report(close_all(o0, o1, H * D, JLM_K_TOL_SOFTMAX), "attention GQA 32/8 heads x 128, 777 keys, sinks");
    /* the key count and the cache row from the position in device memory (a decoded token's graph):
     * bit for bit the launch-argument forms' */
    {
        static float o2[H * D];
        static uint16_t r1[D], r2[D];
        uint32_t last = NKV - 1, *dpos = dev_copy(&last, 4);
        jlm_cu_attn pp = dp;
        pp.dpos = dpos;
        launch_ok(jlm_cu_launch_attn(&pp, dq, dk, dv, dsc, dout, NULL), "attn at the device's position");
        back(o2, dout, sizeof o2);
        uint16_t *c1 = dev_zero((uint64_t)NKV * D * 2), *c2 = dev_zero((uint64_t)NKV * D * 2);
        launch_ok(jlm_cu_launch_kv_store(JLM_CU_KV_F16, (uint8_t *)c1, D * 2, dpos, dq, D, NULL), "kv_store");
        launch_ok(jlm_cu_launch_to_f16(c2 + (uint64_t)last * D, dq, D, NULL), "to_f16");
        back(r1, c1 + (uint64_t)last * D, sizeof r1);
        back(r2, c2 + (uint64_t)last * D, sizeof r2);
        report(!memcmp(o1, o2, sizeof o2) && !memcmp(r1, r2, sizeof r1),
               "attention and the cache store at the device's position equal the argument forms");
        cudaFree(dpos), cudaFree(c1), cudaFree(c2);
    }
    /* an F16 cache: the rows rounded on the device (bit for bit the CPU's), attention reading the halves */
    static uint16_t kh[HKV * NKV * D], vh[HKV * NKV * D], dh[HKV * NKV * D];
    uint16_t *dkh = dev_zero(sizeof kh), *dvh = dev_zero(sizeof vh);
    launch_ok(jlm_cu_launch_to_f16(dkh, dk, HKV * NKV * D, NULL), "to_f16");
    launch_ok(jlm_cu_launch_to_f16(dvh, dv, HKV * NKV * D, NULL), "to_f16");
    int same = 1;
    back(dh, dkh, sizeof dh);
    for (uint64_t i = 0; i < HKV * NKV * D; i++) {
        kh[i] = jlm_k_f32_to_fp16(k[i]);
        vh[i] = jlm_k_f32_to_fp16(v[i]);
        same &= dh[i] == kh[i];
    }
    back(dh, dvh, sizeof dh);
    same &= !memcmp(dh, vh, sizeof vh);
    report(same, "f16 rows bit-identical to the CPU's F16 cache");
    p.k_type = p.v_type = dp.k_type = dp.v_type = JLM_CU_KV_F16;
    jlm_cu_host_attn(&p, q, kh, vh, sc, o0);
    launch_ok(jlm_cu_launch_attn(&dp, dq, dkh, dvh, dsc, dout, NULL), "attn f16");
    back(o1, dout, sizeof o1);
    report(close_all(o0, o1, H * D, JLM_K_TOL_SOFTMAX), "attention over an F16 cache, 32/8 heads x 128, 777 keys");
    /* Q8_0 rows from byte 2 (blocks across words; the device's division and rounding against the
     * harness's, which suite cuda holds to jlm_kv_put_row): the keys with blocks of tiny maxima (d
     * normal; d denormal, 1/d finite; d denormal, 1/d infinite; d 0), a huge one, NaN and Inf; then
     * the keys as they are, a Q8_0 key cache with the F16 values beside it */
    enum { KQ = HKV * NKV * D / 32 * 34 };
    static uint8_t kq[KQ + 2], dkq_back[KQ + 2];
    static float kx[HKV * NKV * D];
    uint8_t *dkq = (uint8_t *)dev_zero(sizeof kq);
    memcpy(kx, k, sizeof k);
    for (int i = 0; i < 32; i++)
        kx[64 + i] *= 1e-35f, kx[96 + i] *= 5e-37f, kx[128 + i] *= 1.5e-37f, kx[160 + i] *= 1e-44f,
        kx[192 + i] *= 1.5e38f;
    kx[230] = NAN, kx[250] = INFINITY;
    CK(cudaMemcpy(dk, kx, sizeof kx, cudaMemcpyHostToDevice));
    jlm_cu_host_kv_q8(kq + 2, kx, HKV * NKV * D);
    launch_ok(jlm_cu_launch_kv_q8(dkq + 2, dk, HKV * NKV * D, NULL), "kv_q8");
    back(dkq_back, dkq, sizeof dkq_back);
    report(!memcmp(dkq_back + 2, kq + 2, KQ), "q8_0 rows from byte 2 bit-identical to the harness's");
    CK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
    jlm_cu_host_kv_q8(kq + 2, k, HKV * NKV * D);
    launch_ok(jlm_cu_launch_kv_q8(dkq + 2, dk, HKV * NKV * D, NULL), "kv_q8");
    p.k_type = dp.k_type = JLM_CU_KV_Q8_0;
    jlm_cu_host_attn(&p, q, kq + 2, vh, sc, o0);
    launch_ok(jlm_cu_launch_attn(&dp, dq, dkq + 2, dvh, dsc, dout, NULL), "attn q8_0/f16");
    back(o1, dout, sizeof o1);
    report(close_all(o0, o1, H * D, JLM_K_TOL_SOFTMAX), "attention over Q8_0 keys and F16 values, 777 keys");
    cudaFree((void *)dp.sinks), cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dsc), cudaFree(dout);
    cudaFree(dkh), cudaFree(dvh), cudaFree(dkq);
}

/* A prefill's row-batched kernels (body.h's jlm_cu_rows: rope_rows,
 * add_rows, rmsnorm_strided, attn_rows) against the one-row kernels on the
 * device, bit for bit: 40 query rows at positions 100..139 (GQA 32/8 x 128,
 * sinks), the keys of each row from a window of 64 (a span each, read from
 * device memory). */
static void check_rows(void)
{
    enum { R = 40, H = 32, HKV = 8, D = 128, P = 140, QW = H * D, KW = HKV * D };
    static float q[R * QW], k[P * KW], v[P * KW], bias[QW], sinks[H], o0[R * QW], o1[R * QW];
    static uint32_t tab[3 * R];
    uint64_t seed = 38;
    gen_floats(q, R * QW, 2.0f, &seed);
    gen_floats(k, P * KW, 2.0f, &seed);
    gen_floats(v, P * KW, 1.0f, &seed);
    gen_floats(bias, QW, 1.0f, &seed);
    gen_floats(sinks, H, 3.0f, &seed);
    for (uint32_t t = 0; t < R; t++)
        tab[t] = 100 + t, tab[R + 2 * t] = tab[t] - 63, tab[R + 2 * t + 1] = 64;
    float *dq = dev_copy(q, sizeof q), *dk = dev_copy(k, sizeof k), *dv = dev_copy(v, sizeof v);
    float *db = dev_copy(bias, sizeof bias), *dsc = dev_zero((uint64_t)R * H * 64 * 4), *dout = dev_zero(sizeof o1);
    uint32_t *dt = dev_copy(tab, sizeof tab);
    jlm_cu_attn p = {H, HKV, D, D, 64, KW, KW, D, D, 0.088388f, 0.0f, dev_copy(sinks, sizeof sinks), NULL, 0, 0, NULL, 0, 0};
    jlm_cu_rope rp;
    jlm_k_rope kr;
    jlm_k_rope_defaults(&kr, 128, 500000.0f);
    jlm_cu_rope_from(&kr, &rp);
    for (uint32_t t = 0; t < R; t++) {   /* the one-row kernels */
        float *x = dq + (uint64_t)t * QW;
        launch_ok(jlm_cu_launch_elem(JLM_CU_ADD, x, x, db, QW, 0, 0, NULL), "elem");
        launch_ok(jlm_cu_launch_rmsnorm_rows(x, x, NULL, D, H, 1e-6f, NULL), "rmsnorm");
        launch_ok(jlm_cu_launch_rope(&rp, x, H, D, tab[t], NULL), "rope");
        launch_ok(jlm_cu_launch_attn(&p, x, dk + tab[R + 2 * t] * KW, dv + tab[R + 2 * t] * KW, dsc,
                                     dout + (uint64_t)t * QW, NULL), "attn");
    }
    back(o0, dout, sizeof o0);
    CK(cudaMemcpy(dq, q, sizeof q, cudaMemcpyHostToDevice));
    jlm_cu_rows rw = {R, QW, QW, H * 64, KW * 4, KW * 4, dt, dt + R};
    launch_ok(jlm_cu_launch_add_rows(dq, dq, db, QW, R, NULL), "add_rows");
    launch_ok(jlm_cu_launch_rmsnorm_strided(dq, dq, NULL, D, R * H, D, 1e-6f, NULL), "rmsnorm_strided");
    launch_ok(jlm_cu_launch_rope_rows(&rp, dq, H, D, &rw, NULL), "rope_rows");
    launch_ok(jlm_cu_launch_attn_rows(&p, dq, dk, dv, dsc, dout, &rw, NULL), "attn_rows");
    back(o1, dout, sizeof o1);
    report(!memcmp(o0, o1, sizeof o0), "row-batched bias, norm, rope and attention (40 rows) = the one-row kernels'");
    cudaFree((void *)p.sinks), cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(db), cudaFree(dsc);
    cudaFree(dout), cudaFree(dt);
}

/* The router (128 experts, top 8, each mode) and the combine against the host
 * harness: the same picks, weights within the softmax tolerance; the combine
 * bit for bit. */
static void check_moe(void)
{
    enum { NE = 128, NU = 8, N = 3000 };
    static float lg[NE], pr[NE], w0[NU], w1[NU], ys[NU * N], x0[N], x1[N];
    int32_t s0[NU], s1[NU];
    uint64_t seed = 33;
    gen_floats(lg, NE, 6.0f, &seed);
    gen_floats(ys, NU * N, 2.0f, &seed);
    gen_floats(x0, N, 2.0f, &seed);
    float *dl = dev_copy(lg, sizeof lg), *dp = dev_zero(sizeof pr), *dw = dev_zero(sizeof w1);
    int32_t *ds = (int32_t *)dev_zero(sizeof s1);
    int ok = 1;
    for (int mode = 0; mode < 3; mode++) {
        jlm_cu_host_moe_route(lg, NE, NU, mode, mode == 1 ? 2.5f : 0.0f, pr, s0, w0);
        launch_ok(jlm_cu_launch_moe_route(dl, NE, NU, mode, mode == 1 ? 2.5f : 0.0f, dp, ds, dw, NULL), "moe_route");
        back(s1, ds, sizeof s1);
        back(w1, dw, sizeof w1);
        ok &= !memcmp(s0, s1, sizeof s0) && close_all(w0, w1, NU, JLM_K_TOL_SOFTMAX);
    }
    report(ok, "moe router 128 experts top 8, 3 modes");
    memcpy(x1, x0, sizeof x0);
    jlm_cu_host_moe_combine(x0, ys, w0, NU, N);
    float *dx = dev_copy(x1, sizeof x1), *dy = dev_copy(ys, sizeof ys), *dw0 = dev_copy(w0, sizeof w0);
    launch_ok(jlm_cu_launch_moe_combine(dx, dy, dw0, NU, N, NULL), "moe_combine");
    back(x1, dx, sizeof x1);
    report(!memcmp(x0, x1, sizeof x0), "moe combine 8 x 3000 bit for bit");
    cudaFree(dl), cudaFree(dp), cudaFree(dw), cudaFree(ds), cudaFree(dx), cudaFree(dy), cudaFree(dw0);
}

/* ---------------------------------------------------------------- bandwidth */

static double copy_gbs(size_t bytes, enum cudaMemcpyKind kind, void *dst, const void *src)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaMemcpy(dst, src, bytes, kind));
    CK(cudaEventRecord(a, 0));
    for (int i = 0; i < 10; i++)
        CK(cudaMemcpyAsync(dst, src, bytes, kind, 0));
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    /* a device-to-device copy reads and writes every byte */
    return (kind == cudaMemcpyDeviceToDevice ? 2.0 : 1.0) * 10.0 * (double)bytes / (ms * 1e6);
}

/* Microseconds per launch of cm over n tokens, by events around reps
 * launches on stream st after one untimed launch (checked). */
static double launch_us(const jlm_cu_mat *cm, uint64_t n, const float *dx, const jlm_cu_act *acts, float *dy,
                        int reps, cudaStream_t st)
{
    launch_ok(jlm_cu_launch_matvec(cm, n, dx, acts, dy, st), "matvec");
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, st));
    for (int r = 0; r < reps; r++)
        jlm_cu_launch_matvec(cm, n, dx, acts, dy, st);
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms * 1000.0 / reps;
}

static void bench(uint64_t n)
{
    size_t big = (size_t)1 << 30;
    void *d0 = dev_zero(big), *d1 = dev_zero(big), *h = NULL;
    CK(cudaMallocHost(&h, big));
    memset(h, 1, big);
    double d2d = copy_gbs(big, cudaMemcpyDeviceToDevice, d1, d0);
    double h2d = copy_gbs(big, cudaMemcpyHostToDevice, d0, h);
    cudaFree(d0), cudaFree(d1), cudaFreeHost(h);
    printf("baseline: device copy %.0f GB/s (read+write), pinned host-to-device %.1f GB/s\n", d2d, h2d);
    static const uint8_t TYPES[] = {JLM_T_Q4_K, JLM_T_Q8_0, JLM_T_Q6_K, JLM_T_MXFP4, JLM_T_F16};
    printf("%-6s %10s %10s %10s %12s %12s\n", "type", "MB", "us/matvec", "GB/s", "of d2d copy", "pp64 us/tok");
    for (unsigned i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        uint64_t seed = 5 + i;
        gen_mat g;
        if (gen_mat_make(&g, TYPES[i], n, n, &seed))
            continue;
        jlm_cu_mat cm;
        dev_mat(&g, &cm);
        float *x = malloc(n * 4);
        gen_floats(x, n, 1.0f, &seed);
        float *dx = dev_copy(x, n * 4), *dy = dev_zero(n * 4);
        dev_act da;
        dev_act_make(&da, n);
        launch_ok(jlm_cu_launch_quantize(dx, &da.host_view, NULL), "quantize");
        double bytes = (double)(g.qs_bytes + g.d_bytes + g.sc_bytes), us = launch_us(&cm, 1, dx, da.dev, dy, 20, NULL);
        double gbs = bytes / (us * 1e3);
        /* prefill: 64 tokens in one launch (gridDim.y), one act record each */
        enum { PP = 64 };
        jlm_cu_act views[PP];
        for (int t = 0; t < PP; t++)
            views[t] = da.host_view;
        jlm_cu_act *dviews = dev_copy(views, sizeof views);
        float *dyp = dev_zero((size_t)PP * n * 4), *dxp = dev_zero((size_t)PP * n * 4);
        for (int t = 0; t < PP; t++)
            CK(cudaMemcpy(dxp + (size_t)t * n, dx, n * 4, cudaMemcpyDeviceToDevice));
        double pp_us = launch_us(&cm, PP, dxp, dviews, dyp, 3, NULL) / PP;
        printf("%-6s %10.1f %10.1f %10.0f %11.0f%% %12.1f\n", jlm_fmt_type_traits(TYPES[i])->name, bytes / 1e6, us, gbs,
               100.0 * gbs / d2d, pp_us);
        cudaFree(dviews), cudaFree(dyp), cudaFree(dxp);
        dev_act_free(&da);
        dev_mat_free(&cm);
        cudaFree(dx), cudaFree(dy), free(x);
        gen_mat_free(&g);
    }
}

/* The decode shapes of a 1B model (synth-1b: E 2048, KV 512, FFN 8192) per
 * type: one launch's kernel time (events, 50 launches) and one engine-style
 * round trip (the activations up from pinned memory, the launch, the result
 * back, a stream synchronize; host clock, 50 trips). The gap is what a
 * matmul costs the engine beyond its kernel. */
static void bench_shapes(void)
{
    static const uint8_t TYPES[] = {JLM_T_Q4_0, JLM_T_Q4_K, JLM_T_Q8_0};
    static const uint64_t SH[][2] = {{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}};   /* rows, k */
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    for (unsigned i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        for (unsigned j = 0; j < sizeof SH / sizeof SH[0]; j++) {
            uint64_t rows = SH[j][0], k = SH[j][1], seed = 900 + i * 7 + j;
            gen_mat g;
            if (gen_mat_make(&g, TYPES[i], k, rows, &seed))
                continue;
            jlm_cu_mat cm;
            dev_mat(&g, &cm);
            float *x = malloc(k * 4), *hx = NULL, *hy = NULL;
            gen_floats(x, k, 1.0f, &seed);
            float *dx = dev_copy(x, k * 4), *dy = dev_zero(rows * 4);
            CK(cudaMallocHost((void **)&hx, k * 4));
            CK(cudaMallocHost((void **)&hy, rows * 4));
            memcpy(hx, x, k * 4);
            dev_act da;
            dev_act_make(&da, k);
            launch_ok(jlm_cu_launch_quantize(dx, &da.host_view, NULL), "quantize");
            double us = launch_us(&cm, 1, dx, da.dev, dy, 50, st);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (int r = 0; r < 50; r++) {
                CK(cudaMemcpyAsync(dx, hx, k * 4, cudaMemcpyHostToDevice, st));
                jlm_cu_launch_matvec(&cm, 1, dx, da.dev, dy, st);
                CK(cudaMemcpyAsync(hy, dy, rows * 4, cudaMemcpyDeviceToHost, st));
                CK(cudaStreamSynchronize(st));
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double trip = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / 50;
            double bytes = (double)(g.qs_bytes + g.d_bytes + g.sc_bytes);
            printf("shape %-5s %5llu x %-5llu %7.2f MB: kernel %7.1f us (%5.0f GB/s), round trip %7.1f us\n",
                   jlm_fmt_type_traits(TYPES[i])->name, (unsigned long long)rows, (unsigned long long)k, bytes / 1e6,
                   us, bytes / (us * 1e3), trip);
            dev_act_free(&da);
            dev_mat_free(&cm);
            cudaFree(dx), cudaFree(dy), cudaFreeHost(hx), cudaFreeHost(hy), free(x);
            gen_mat_free(&g);
        }
    cudaStreamDestroy(st);
}

int main(int argc, char **argv)
{
    int do_bench = 1;
    uint64_t n = 16384;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-bench"))
            do_bench = 0;
        else if (!strcmp(argv[i], "--bench-n") && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 10) / 256 * 256;
        else {
            fprintf(stderr, "usage: jlm-cuda-check [--no-bench] [--bench-n N]\n");
            return 2;
        }
    }
    jlm_cu_info in;
    jlm_cu_probe(&in);
    if (in.count == 0) {
        printf("jlm-cuda-check: skip: no CUDA device: %s\n", in.reason);
        return 0;
    }
    char line[512];
    jlm_cu_describe(line, sizeof line);
    printf("%s\n", line);
    check_all_matvec();
    check_ops();
    check_attn();
    check_rows();
    check_moe();
    if (do_bench && n)
        bench(n);
    if (do_bench)
        bench_shapes();
    printf("jlm-cuda-check: %s (%d failure%s)\n", fails ? "FAIL" : "PASS", fails, fails == 1 ? "" : "s");
    return fails ? 1 : 0;
}

#else

int main(void)
{
    jlm_cu_info in;
    jlm_cu_probe(&in);
    printf("jlm-cuda-check: skip: CUDA backend %s\n", in.reason);
    return 0;
}

#endif
