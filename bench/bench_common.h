/* bench_common.h - helpers shared by the bench programs (header-only, static):
 * a clock, statistics, a temp dir, GGUF generation + conversion through the
 * library, and the memory-read bandwidth probe that the decode roofline is
 * measured against (in the same run: the machines are shared and noisy). */
#ifndef JLM_BENCH_COMMON_H
#define JLM_BENCH_COMMON_H

#define MKGGUF_NO_MAIN
#include "bench/mkgguf.c"

#include "converter/convert.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BENCH_FN static __attribute__((unused))

BENCH_FN double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

BENCH_FN void bench_mean_sd(const double *v, int n, double *mean, double *sd)
{
    double s = 0, q = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++)
        q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0.0;
}

BENCH_FN uint64_t bench_file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* A fresh temp dir under $TMPDIR (default /tmp); caller frees and removes. */
BENCH_FN char *bench_tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    char *d = NULL;
    if (asprintf(&d, "%s/jlmbench.XXXXXX", t && *t ? t : "/tmp") < 0)
        return NULL;
    if (!mkdtemp(d)) {
        free(d);
        return NULL;
    }
    return d;
}

BENCH_FN void bench_rmrf(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

/* Generates PRESET/TYPE into dir/NAME.gguf, converts it to dir/NAME.jlm and
 * deletes the GGUF. 0 or -1 with a message on stderr. */
BENCH_FN int bench_make_model(const char *dir, const char *name, const char *preset, uint32_t type, uint32_t n_layer,
                              char *jlm_path, size_t jlm_len)
{
    char src[1024], msg[512];
    mkg_shape s;
    if (mkg_preset(preset, &s)) {
        fprintf(stderr, "bench: unknown preset %s\n", preset);
        return -1;
    }
    snprintf(src, sizeof src, "%s/%s.gguf", dir, name);
    snprintf(jlm_path, jlm_len, "%s/%s.jlm", dir, name);
    if (mkg_write(src, &s, type, n_layer, 42, msg, sizeof msg)) {
        fprintf(stderr, "bench: %s\n", msg);
        return -1;
    }
    jlm_err err = {0};
    jlm_conv *c = NULL;
    int rc = jlm_conv_open(src, NULL, &c, &err);
    if (!rc)
        rc = jlm_conv_write(c, jlm_path, NULL, NULL, NULL, &err);
    jlm_conv_close(c);
    unlink(src);
    if (rc) {
        fprintf(stderr, "bench: convert %s: %s\n", src, err.msg);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- bandwidth probe */
/* Each thread sums its slice of one buffer much larger than the LLC (L3 is
 * ~300 MiB here; the probe uses 1 GiB), with the widest loads the CPU has,
 * as the engine's matvec kernels do. Best of `reps` passes. */
typedef struct bench_probe_arg { const uint8_t *p; size_t len; uint64_t sum; } bench_probe_arg;

__attribute__((target("avx2"))) static uint64_t bench_sum_avx2(const uint8_t *p, size_t len)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= len; i += 128) {   /* hot loop: 4 independent accumulators */
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, a0);
    return v[0] + v[1] + v[2] + v[3];
}

static uint64_t bench_sum_ref(const uint8_t *p, size_t len)
{
    const uint64_t *q = (const uint64_t *)p;
    uint64_t s = 0;
    for (size_t i = 0; i < len / 8; i++)
        s += q[i];
    return s;
}

static void *bench_probe_thread(void *a)
{
    bench_probe_arg *x = a;
    x->sum = __builtin_cpu_supports("avx2") ? bench_sum_avx2(x->p, x->len) : bench_sum_ref(x->p, x->len);
    return NULL;
}

/* The probe's buffer: allocated and touched once (no zero-page mapping, no
 * faults in the timing), then read as often as the caller interleaves it. */
typedef struct bench_probe { uint8_t *buf; size_t bytes; } bench_probe;

BENCH_FN int bench_probe_open(bench_probe *p, size_t bytes)
{
    p->bytes = bytes;
    if (posix_memalign((void **)&p->buf, 4096, bytes))
        return -1;
    memset(p->buf, 1, bytes);
    return 0;
}

BENCH_FN void bench_probe_close(bench_probe *p) { free(p->buf); p->buf = NULL; }

/* Bytes per second read by n_threads over the whole buffer, best of `reps`
 * passes; 0 on a bad thread count. */
BENCH_FN double bench_probe_bw(const bench_probe *p, int n_threads, int reps)
{
    if (n_threads < 1 || n_threads > 64)
        return 0;
    double best = 0;
    uint64_t sink = 0;
    size_t slice = p->bytes / (size_t)n_threads / 4096 * 4096;
    for (int r = 0; r < reps; r++) {
        pthread_t th[64];
        bench_probe_arg arg[64];
        double t0 = bench_now();
        for (int i = 0; i < n_threads; i++) {
            arg[i] = (bench_probe_arg){p->buf + (size_t)i * slice, slice, 0};
            pthread_create(&th[i], NULL, bench_probe_thread, &arg[i]);
        }
        for (int i = 0; i < n_threads; i++) {
            pthread_join(th[i], NULL);
            sink += arg[i].sum;
        }
        double bw = (double)slice * n_threads / (bench_now() - t0);
        best = bw > best ? bw : best;
    }
    if (sink != (uint64_t)slice / 8 * 0x0101010101010101ull * (uint64_t)n_threads * (uint64_t)reps)
        fprintf(stderr, "bench: probe checksum mismatch\n");
    return best;
}

static int bench_cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

BENCH_FN double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
