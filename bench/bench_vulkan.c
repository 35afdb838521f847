/* bench_vulkan.c - Vulkan matvec throughput (GB/s of packed planes read) per
 * stored type against the CPU kernel (the variant jlm_k_cpu_get() picks, one
 * thread) on the same planes in the same run, printed as a ratio. On lavapipe
 * the "device" is this CPU (llvmpipe threads), so the ratio says how far the
 * shaders are from the hand-written kernels, not what a GPU would do. Warm
 * (planes in cache where they fit); each Vulkan figure includes one submit and
 * fence wait per matvec, as jlm_vk_matvec does. Skips (exit 0) with one line
 * when there is no Vulkan device.
 *
 * Then a prefill matmul (-p P tokens, 32 by default, in one jlm_vk_matmul)
 * with the shader's token tile (each row's weights read and decoded once per
 * 8 tokens) against the same shader at one token per invocation (the
 * baseline: JLM_VK_MATMUL_TILE=1, a second device handle in the same run),
 * the two results compared bit for bit, printed as a speed ratio.
 *
 * Then the page-in paths (engine/backend_vk.c) against an in-run memcpy of
 * the same bytes (a 4096-aligned "frame" of -m MiB, 32 by default): the
 * staging upload (jlm_vk_buf_write into a device buffer) and the zero-copy
 * import of the frame (VK_EXT_external_memory_host: the import's own cost),
 * each as GB/s and as a ratio of memcpy's.
 *
 *   build/bench/bench_vulkan [-k K] [-n ROWS] [-r REPS] [-m MIB] [-p P] [TYPE ...]
 *   JLM_VK_DEVICE=llvmpipe names the device (lavapipe is used here unasked)
 */
#include "kernels/cpu/kernels.h"
#include "kernels/vulkan/vk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random planes with sane scales (fp16 0x1c00 = 2^-8 in every d slot). */
static void fill(void *p, uint64_t n, int dplane, uint64_t *seed)
{
    uint32_t *w = p;
    for (uint64_t i = 0; i < n / 4; i++)
        w[i] = dplane ? 0x1c001c00u : (uint32_t)rng(seed) & 0x3f3f3f3fu;
}

/* The planes of one matrix (float types: 1.0 / 2^-4 in every element) and
 * nx activations in [-1, 1). */
static void fill_operands(uint8_t type, uint8_t *qs, uint64_t ql, uint8_t *d, uint64_t dl, uint8_t *sc, uint64_t sl,
                          float *x, uint64_t nx, uint64_t *seed)
{
    fill(qs, ql, 0, seed);
    if (jlm_fmt_type_traits(type)->is_float)
        for (uint64_t i = 0; i < ql / 2; i++)
            ((uint16_t *)qs)[i] = type == JLM_T_BF16 ? 0x3c00 : 0x2c00;
    fill(d, dl, 1, seed);
    fill(sc, sl, 0, seed);
    for (uint64_t i = 0; i < nx; i++)
        x[i] = (float)(rng(seed) % 2000) / 1000.0f - 1.0f;
}

typedef struct job {
    uint8_t type;
    uint64_t k, rows;
    int reps;
} job;

/* Best of reps seconds for one matvec on the CPU and on Vulkan; bytes read. */
static int run_type(jlm_vk *vk, const job *j, double *cpu_s, double *vk_s, uint64_t *bytes)
{
    uint64_t ql, dl, sl, seed = 0x1234 + j->type;
    if (jlm_fmt_planes(j->type, j->k, j->rows, &ql, &dl, &sl, NULL))
        return -1;
    const jlm_type_traits *tr = jlm_fmt_type_traits(j->type);
    uint8_t *qs = malloc(ql + 64), *d = malloc(dl + 64), *sc = malloc(sl + 64);
    float *x = malloc(j->k * 4), *y = malloc(j->rows * 4);
    void *abuf = malloc(jlm_k_act_q8_bytes(j->k));
    fill_operands(j->type, qs, ql, d, dl, sc, sl, x, j->k, &seed);
    jlm_act_q8 xq;
    jlm_k_act_q8_init(&xq, abuf, j->k, NULL);
    jlm_k_quantize_act(x, &xq);
    jlm_k_mat m = {j->type, j->k, j->rows, qs, tr->is_float ? NULL : d, tr->sc_kind ? sc : NULL};
    jlm_k_matvec_fn fn = jlm_k_cpu_get()->matvec[j->type];

    jlm_err err = {0};
    jlm_vk_buf *b[9] = {0};
    int rc = jlm_vk_buf_upload(vk, qs, ql, &b[0], &err) || (dl && jlm_vk_buf_upload(vk, d, dl, &b[1], &err)) ||
             (sl && jlm_vk_buf_upload(vk, sc, sl, &b[2], &err)) || jlm_vk_buf_upload(vk, x, j->k * 4, &b[3], &err) ||
             jlm_vk_buf_new(vk, j->rows * 4, &b[4], &err) || jlm_vk_buf_upload(vk, xq.q, j->k, &b[5], &err) ||
             jlm_vk_buf_upload(vk, xq.d, j->k / 8, &b[6], &err) || jlm_vk_buf_upload(vk, xq.sum16, j->k / 8, &b[7], &err);
    jlm_vk_mat vm = {j->type, j->k, j->rows, {b[0], 0, 0}, {b[1], 0, 0}, {b[2], 0, 0}};
    jlm_vk_act va = {j->k, {b[5], 0, 0}, {b[6], 0, 0}, {b[7], 0, 0}, 1};
    *cpu_s = *vk_s = 1e30;
    for (int r = 0; !rc && r < j->reps; r++) {
        double t0 = now();
        fn(&m, x, &xq, y, 0, j->rows);
        double t1 = now();
        rc = jlm_vk_matvec(vk, &vm, (jlm_vk_view){b[3], 0, 0}, tr->is_float ? NULL : &va,
                           (jlm_vk_view){b[4], 0, 0}, &err);
        double t2 = now();
        if (t1 - t0 < *cpu_s)
            *cpu_s = t1 - t0;
        if (t2 - t1 < *vk_s)
            *vk_s = t2 - t1;
    }
    if (rc)
        fprintf(stderr, "bench_vulkan: %s\n", err.msg);
    for (int i = 0; i < 9; i++)
        jlm_vk_buf_free(vk, b[i]);
    *bytes = ql + dl + sl;
    free(qs), free(d), free(sc), free(x), free(y), free(abuf);
    return rc;
}

/* One jlm_vk_matmul of ntok tokens on device handle vk: best of reps seconds;
 * y (ntok * rows floats) the result. */
static int time_matmul(jlm_vk *vk, const job *j, uint32_t ntok, const uint8_t *qs, const uint8_t *d,
                       const uint8_t *sc, const float *x, const jlm_act_q8 *xq, float *y, double *best)
{
    uint64_t ql, dl, sl;
    jlm_fmt_planes(j->type, j->k, j->rows, &ql, &dl, &sl, NULL);
    const jlm_type_traits *tr = jlm_fmt_type_traits(j->type);
    jlm_err err = {0};
    jlm_vk_buf *b[8] = {0};
    int rc = jlm_vk_buf_upload(vk, qs, ql, &b[0], &err) || (dl && jlm_vk_buf_upload(vk, d, dl, &b[1], &err)) ||
             (sl && jlm_vk_buf_upload(vk, sc, sl, &b[2], &err)) ||
             jlm_vk_buf_upload(vk, x, ntok * j->k * 4, &b[3], &err) ||
             jlm_vk_buf_new(vk, ntok * j->rows * 4, &b[4], &err) ||
             jlm_vk_buf_upload(vk, xq->q, ntok * j->k, &b[5], &err) ||
             jlm_vk_buf_upload(vk, xq->d, ntok * j->k / 8, &b[6], &err) ||
             jlm_vk_buf_upload(vk, xq->sum16, ntok * j->k / 8, &b[7], &err);
    jlm_vk_mat vm = {j->type, j->k, j->rows, {b[0], 0, 0}, {b[1], 0, 0}, {b[2], 0, 0}};
    jlm_vk_act va = {j->k, {b[5], 0, 0}, {b[6], 0, 0}, {b[7], 0, 0}, ntok};
    *best = 1e30;
    for (int r = 0; !rc && r < j->reps; r++) {
        double t0 = now();
        rc = jlm_vk_matmul(vk, &vm, ntok, (jlm_vk_view){b[3], 0, 0}, tr->is_float ? NULL : &va,
                           (jlm_vk_view){b[4], 0, 0}, &err);
        double t1 = now();
        if (t1 - t0 < *best)
            *best = t1 - t0;
    }
    if (rc)
        fprintf(stderr, "bench_vulkan: matmul: %s\n", err.msg);
    else
        memcpy(y, jlm_vk_buf_map(b[4]), ntok * j->rows * 4);
    for (int i = 0; i < 8; i++)
        jlm_vk_buf_free(vk, b[i]);
    return rc;
}

/* The prefill matmul, tiled (vk) against one token per invocation (vk1). */
static int run_prefill(jlm_vk *vk, jlm_vk *vk1, const job *j, uint32_t ntok)
{
    uint64_t ql, dl, sl, seed = 0x9876 + j->type;
    if (jlm_fmt_planes(j->type, j->k, j->rows, &ql, &dl, &sl, NULL))
        return -1;
    const jlm_type_traits *tr = jlm_fmt_type_traits(j->type);
    uint8_t *qs = malloc(ql + 64), *d = malloc(dl + 64), *sc = malloc(sl + 64);
    float *x = malloc(ntok * j->k * 4), *y1 = malloc(ntok * j->rows * 4), *y8 = malloc(ntok * j->rows * 4);
    uint8_t *aq = malloc(ntok * j->k), *ad = malloc(ntok * j->k / 8), *as = malloc(ntok * j->k / 8);
    void *abuf = malloc(jlm_k_act_q8_bytes(j->k));
    fill_operands(j->type, qs, ql, d, dl, sc, sl, x, ntok * j->k, &seed);
    jlm_act_q8 xq;
    jlm_k_act_q8_init(&xq, abuf, j->k, NULL);
    for (uint32_t t = 0; t < ntok; t++) {   /* tokens one after another, as jlm_vk_act wants */
        jlm_k_quantize_act(x + t * j->k, &xq);
        memcpy(aq + t * j->k, xq.q, j->k);
        memcpy(ad + t * (j->k / 8), xq.d, j->k / 8);
        memcpy(as + t * (j->k / 8), xq.sum16, j->k / 8);
    }
    jlm_act_q8 all = {.q = (int8_t *)aq, .d = (float *)ad, .sum16 = (int16_t *)as};
    double s1 = 0, s8 = 0;
    int rc = time_matmul(vk1, j, ntok, qs, d, sc, x, &all, y1, &s1) ||
             time_matmul(vk, j, ntok, qs, d, sc, x, &all, y8, &s8);
    if (!rc) {
        int same = !memcmp(y1, y8, ntok * j->rows * 4);
        printf("%-6s pp%u matmul: one token/invocation %8.2f ms, tile of 8 %8.2f ms, speed-up %.2fx, %s\n",
               tr->name, ntok, s1 * 1e3, s8 * 1e3, s1 / s8, same ? "results bit-identical" : "RESULTS DIFFER");
        rc = !same;
    }
    free(qs), free(d), free(sc), free(x), free(y1), free(y8), free(aq), free(ad), free(as), free(abuf);
    return rc;
}

/* The page-in paths against memcpy of the same n bytes, best of reps. */
static int page_in_paths(jlm_vk *vk, uint64_t n, int reps)
{
    void *src = NULL, *dst = NULL;
    jlm_vk_buf *dev = NULL;
    jlm_err err = {0};
    if (posix_memalign(&src, 4096, n) || posix_memalign(&dst, 4096, n) ||
        jlm_vk_buf_new_device(vk, n, &dev, &err)) {
        fprintf(stderr, "bench_vulkan: page-in buffers of %llu bytes: %s\n", (unsigned long long)n,
                err.msg[0] ? err.msg : "out of memory");
        free(src);
        free(dst);
        return 1;
    }
    uint64_t seed = 7;
    fill(src, n, 0, &seed);
    memset(dst, 1, n);
    double mc = 1e30, up = 1e30, im = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        memcpy(dst, src, n);
        double t1 = now();
        if (jlm_vk_buf_write(vk, dev, 0, src, n, &err)) {
            fprintf(stderr, "bench_vulkan: upload: %s\n", err.msg);
            break;
        }
        double t2 = now();
        if (t1 - t0 < mc) mc = t1 - t0;
        if (t2 - t1 < up) up = t2 - t1;
        if (jlm_vk_import_align(vk)) {
            jlm_vk_buf *b = NULL;
            double t3 = now();
            int irc = jlm_vk_buf_import(vk, src, n, &b, &err);
            double t4 = now();
            jlm_vk_buf_free(vk, b);
            if (!irc && t4 - t3 < im)
                im = t4 - t3;
        }
    }
    volatile uint8_t sink = ((uint8_t *)dst)[n / 2];
    (void)sink;
    printf("page-in of %.0f MiB, best of %d: memcpy %.2f GB/s; upload (staging) %.2f GB/s = %.3f x memcpy",
           n / 1048576.0, reps, n / mc / 1e9, n / up / 1e9, mc / up);
    if (im < 1e29)
        printf("; import (no copy) %.3f ms = %.1f x memcpy's speed\n", im * 1e3, mc / im);
    else
        printf("; import: not available on this device\n");
    jlm_vk_buf_free(vk, dev);
    free(src);
    free(dst);
    return 0;
}

int main(int argc, char **argv)
{
    job j = {0, 4096, 4096, 5};
    uint64_t mib = 32;
    uint32_t pp = 32;
    int first = 1;
    for (; first < argc && argv[first][0] == '-' && first + 1 < argc; first += 2) {
        if (!strcmp(argv[first], "-k"))
            j.k = strtoull(argv[first + 1], NULL, 10);
        else if (!strcmp(argv[first], "-n"))
            j.rows = strtoull(argv[first + 1], NULL, 10);
        else if (!strcmp(argv[first], "-r"))
            j.reps = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "-m"))
            mib = strtoull(argv[first + 1], NULL, 10);
        else if (!strcmp(argv[first], "-p"))
            pp = (uint32_t)strtoul(argv[first + 1], NULL, 10);
    }
    if (pp < 1 || pp > 4096)
        pp = 32;
    jlm_vk *vk;
    jlm_err err = {0};
    if (jlm_vk_open(NULL, 1, &vk, &err)) {
        printf("bench_vulkan: skipped: %s\n", err.msg);
        return 0;
    }
    printf("device %s%s; CPU kernel %s, 1 thread; k %llu rows %llu, best of %d\n", jlm_vk_device_name(vk),
           jlm_vk_device_is_cpu(vk) ? " (a CPU device)" : "", jlm_k_cpu_variant_name(),
           (unsigned long long)j.k, (unsigned long long)j.rows, j.reps);
    static const char *DEF[] = {"F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "MXFP4"};
    int n = first < argc ? argc - first : 6;
    for (int i = 0; i < n; i++) {
        const char *name = first < argc ? argv[first + i] : DEF[i];
        j.type = 0;
        for (uint8_t t = 1; t < JLM_T_COUNT; t++)
            if (!strcmp(jlm_fmt_type_traits(t)->name, name))
                j.type = t;
        double cs, vs;
        uint64_t bytes;
        if (!j.type || run_type(vk, &j, &cs, &vs, &bytes)) {
            fprintf(stderr, "bench_vulkan: %s: failed\n", name);
            jlm_vk_close(vk);
            return 1;
        }
        printf("%-6s %8.1f MiB  cpu %6.2f GB/s  vulkan %6.2f GB/s  vulkan/cpu %.4f\n", name,
               bytes / 1048576.0, bytes / cs / 1e9, bytes / vs / 1e9, cs / vs);
    }
    setenv("JLM_VK_MATMUL_TILE", "1", 1);
    jlm_vk *vk1;
    int rc = jlm_vk_open(NULL, 1, &vk1, &err);
    unsetenv("JLM_VK_MATMUL_TILE");
    if (rc) {
        fprintf(stderr, "bench_vulkan: second device handle: %s\n", err.msg);
        jlm_vk_close(vk);
        return 1;
    }
    for (int i = 0; !rc && i < n; i++) {
        const char *name = first < argc ? argv[first + i] : DEF[i];
        for (uint8_t t = 1; t < JLM_T_COUNT; t++)
            if (!strcmp(jlm_fmt_type_traits(t)->name, name))
                j.type = t;
        rc = run_prefill(vk, vk1, &j, pp);
    }
    jlm_vk_close(vk1);
    rc = rc || page_in_paths(vk, (mib ? mib : 1) << 20, j.reps);
    jlm_vk_close(vk);
    return rc;
}
