/* bench_kernels.c - matvec throughput (GB/s of packed planes read) per stored
 * type and kernel variant, on 1 and 2 threads, with the ratio to a memory-read
 * probe measured in the same run. The machines are shared and noisy: read the
 * ratio, not the absolute figure.
 *
 * "Cold": every measurement rotates over copies of the matrix totalling at
 * least -m MiB (default 768), so every byte comes from DRAM, not L3. The
 * probe sums the same amount of memory with AVX2 loads, on 1 and 2 threads.
 * Threads split the rows in halves and meet at a spin barrier after every
 * matvec (as the engine does). The reference is timed on one matvec, 1 thread.
 * One thread is timed by its own CPU clock, so other load on a shared machine
 * (time descheduled) does not count; two threads by the wall clock.
 *
 *   build/bench/bench_kernels [-k K] [-n ROWS] [-m MiB] [-t SECONDS] [-g TOKENS] [-P] [TYPE ...]
 * -P: the probe line only (bench/vs-llama.sh's decode roofline).
 *
 * -g TOKENS: prefill instead: the matmul of TOKENS tokens (the GEMM of the
 * table, `matmul`) against the 4-token matmul (`matmul4`) in the same run,
 * per type and variant, 1 and 2 threads, GMAC/s and the ratio. One copy of
 * the matrix (it is reused TOKENS times per call: compute, not DRAM, bounds it).
 */
#include "kernels/cpu/kernels.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The kernel builds to compare from variant v0 on: each variant, and the
 * AVX-512 one twice (its prefetch into L1 and into L2, dispatch.c); *tab
 * filled and named for build i, 0 when the CPU lacks it. */
enum { NBUILD = JLM_K_NVARIANT + 1 };

static int build_table(int v0, int i, jlm_k_cpu *tab)
{
    static const int V[NBUILD] = {JLM_K_REF, JLM_K_AVX2, JLM_K_AVX512, JLM_K_AVX512};
    static const int PF[NBUILD] = {0, 0, JLM_K_PF_L1, JLM_K_PF_L2};
    if (V[i] < v0 || jlm_k_cpu_table_pf(V[i], PF[i], tab, NULL))
        return 0;
    if (V[i] == JLM_K_AVX512)
        tab->name = PF[i] == JLM_K_PF_L1 ? "avx512-l1" : "avx512-l2";
    return 1;
}

/* ---------------------------------------------------------------- matrices */

typedef struct copyset {
    int        n;           /* copies */
    jlm_k_mat *m;           /* (n,) */
    uint8_t  **buf;
    uint64_t   bytes;       /* planes of one copy */
} copyset;

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint64_t up64(uint64_t x) { return (x + 63) / 64 * 64; }

/* One random matrix (sane scales: no denormal or NaN f32 on the hot path),
 * then memcpy'd into enough copies to fill cold_bytes. */
static int copyset_make(copyset *c, uint8_t type, uint64_t k, uint64_t rows, uint64_t cold_bytes)
{
    uint64_t ql, dl, sl;
    if (jlm_fmt_planes(type, k, rows, &ql, &dl, &sl, NULL))
        return -1;
    const jlm_type_traits *tr = jlm_fmt_type_traits(type);
    c->bytes = ql + dl + sl;
    uint64_t span = up64(ql) + up64(dl) + up64(sl) + 64;
    c->n = (int)(cold_bytes / c->bytes + 1);
    c->m = calloc(c->n, sizeof *c->m);
    c->buf = calloc(c->n, sizeof *c->buf);
    uint64_t seed = 0x12345678u + type;
    for (int i = 0; i < c->n; i++) {
        c->buf[i] = aligned_alloc(64, up64(span));
        if (!c->buf[i])
            return -1;
        uint8_t *qs = c->buf[i], *d = qs + up64(ql), *sc = d + up64(dl);
        if (i == 0) {
            for (uint64_t j = 0; j < span / 8; j++)
                ((uint64_t *)qs)[j] = rng(&seed);
            for (uint64_t j = 0; j < dl; j++)
                d[j] = type == JLM_T_MXFP4 ? (uint8_t)(118 + j % 8) : (j % 2 ? 0x2c : (uint8_t)j);
            if (tr->is_float)
                for (uint64_t j = 0; j < ql / 2; j++)   /* f16/bf16/f32 halves: small normals */
                    ((uint16_t *)qs)[j] = (uint16_t)(type == JLM_T_F16 ? 0x2c00 | (j & 0x3ff) : 0x3d00 | (j & 0x7f));
        } else {
            memcpy(c->buf[i], c->buf[0], span);
        }
        c->m[i] = (jlm_k_mat){.type = type, .k = k, .rows = rows, .qs = qs,
                              .d = tr->is_float ? NULL : d, .sc = tr->sc_kind ? sc : NULL};
    }
    return 0;
}

static void copyset_free(copyset *c)
{
    for (int i = 0; i < c->n; i++)
        free(c->buf[i]);
    free(c->buf);
    free(c->m);
}

/* ---------------------------------------------------------------- threads */

typedef struct job {
    const copyset    *c;          /* NULL: memory probe */
    const uint8_t    *probe;      /* probe buffer */
    uint64_t          probe_len;
    jlm_k_matvec_fn   fn;
    jlm_k_matmul_fn   mm;         /* non-NULL: matmul of n tokens instead of fn */
    uint64_t          n;
    const float      *x;
    const jlm_act_q8 *xq;
    float            *y;
    int               nth, iters;
    atomic_int        arrived, phase;
    double            sink[2];
} job;

typedef struct worker {
    job *j;
    int  id;
} worker;

static void barrier(job *j)
{
    int ph = atomic_load(&j->phase);
    if (atomic_fetch_add(&j->arrived, 1) == j->nth - 1) {
        atomic_store(&j->arrived, 0);
        atomic_store(&j->phase, ph + 1);
    } else {
        for (int spin = 0; atomic_load(&j->phase) == ph; spin++) {
            if (spin < 4096)
                _mm_pause();
            else
                sched_yield();                 /* the other thread may be descheduled */
        }
    }
}

__attribute__((target("avx2"))) static double probe_sum(const uint8_t *p, uint64_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (uint64_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    return (double)_mm256_extract_epi64(a0, 0);
}

static void *work(void *arg)
{
    worker *w = arg;
    job *j = w->j;
    if (!j->c) {
        uint64_t half = j->probe_len / j->nth / 128 * 128;
        for (int it = 0; it < j->iters; it++)
            j->sink[w->id] += probe_sum(j->probe + w->id * half, half);
        return NULL;
    }
    uint64_t rows = j->c->m[0].rows, r0 = rows * w->id / j->nth, r1 = rows * (w->id + 1) / j->nth;
    r0 = r0 / 16 * 16;
    r1 = w->id == j->nth - 1 ? rows : r1 / 16 * 16;
    for (int it = 0; it < j->iters; it++) {
        if (j->mm)
            j->mm(&j->c->m[it % j->c->n], j->n, NULL, j->xq, j->y, r0, r1);
        else
            j->fn(&j->c->m[it % j->c->n], j->x, j->xq, j->y, r0, r1);
        if (j->nth > 1)
            barrier(j);
    }
    return NULL;
}

/* Seconds for j->iters rounds on nth threads: 1 thread runs on the caller and
 * is timed by its CPU clock (time descheduled by other load not counted);
 * 2 threads by the wall clock. */
static double run(job *j, int nth)
{
    if (nth == 1) {
        j->nth = 1;
        worker w = {j, 0};
        double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        work(&w);
        return clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    }
    pthread_t th[2];
    worker w[2];
    j->nth = nth;
    atomic_store(&j->arrived, 0);
    atomic_store(&j->phase, 0);
    double t0 = clock_s(CLOCK_MONOTONIC);
    for (int i = 0; i < nth; i++) {
        w[i] = (worker){j, i};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    return clock_s(CLOCK_MONOTONIC) - t0;
}

/* GB/s: iterations sized from a first short run to last about `secs`; best of 3. */
static double gbps(job *j, int nth, uint64_t bytes_per_iter, int min_iters, double secs)
{
    j->iters = min_iters;
    double t = run(j, nth);
    int it = (int)(secs / 3 / (t / min_iters + 1e-9));
    j->iters = it < min_iters ? min_iters : it;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double g = (double)bytes_per_iter * j->iters / run(j, nth) / 1e9;
        best = g > best ? g : best;
    }
    return best;
}

/* ---------------------------------------------------------------- GEMM */

/* matmul (GEMM) vs matmul4 on ntok tokens, per type and vector variant. */
static int bench_gemm(const uint8_t *want, int nwant, uint64_t k, uint64_t rows, uint64_t ntok, double secs)
{
    size_t qb = jlm_k_act_q8_bytes(k);
    uint8_t *buf = malloc(qb * ntok);
    jlm_act_q8 *xq = calloc(ntok, sizeof *xq);
    float *x = malloc(k * sizeof *x), *y = aligned_alloc(64, up64(ntok * rows * sizeof *y));
    if (!buf || !xq || !x || !y) {
        fprintf(stderr, "bench_kernels: out of memory for %llu tokens\n", (unsigned long long)ntok);
        return 1;
    }
    uint64_t seed = 7;
    for (uint64_t t = 0; t < ntok; t++) {
        for (uint64_t i = 0; i < k; i++)
            x[i] = (float)((int64_t)(rng(&seed) % 2001) - 1000) / 1000.0f;
        if (jlm_k_act_q8_init(&xq[t], buf + t * qb, k, NULL))
            return 1;
        jlm_k_quantize_act(x, &xq[t]);
    }
    double macs = (double)k * rows * ntok;
    printf("prefill matmul %llu x %llu, %llu tokens: GMAC/s (1 thread CPU time, 2 threads wall), "
           "GEMM (matmul) vs 4-token matmul (matmul4)\n",
           (unsigned long long)rows, (unsigned long long)k, (unsigned long long)ntok);
    printf("%-6s %-9s %9s %9s %6s %9s %9s %6s\n", "type", "variant", "mm4 1t", "gemm 1t", "ratio", "mm4 2t",
           "gemm 2t", "ratio");
    for (int ti = 0; ti < nwant; ti++) {
        uint8_t type = want[ti];
        if (jlm_fmt_type_traits(type)->is_float)
            continue;
        copyset c;
        if (copyset_make(&c, type, k, rows, 0)) {
            fprintf(stderr, "bench_kernels: cannot build %s\n", jlm_fmt_type_traits(type)->name);
            return 1;
        }
        for (int b = 0; b < NBUILD; b++) {
            jlm_k_cpu tab;
            if (!build_table(JLM_K_AVX2, b, &tab))
                continue;
            /* interleaved A/B rounds of ~secs/20 each, best round of each: on a
             * shared machine the best round is the least disturbed one */
            double g[4] = {0, 0, 0, 0};
            job j[4];
            for (int i = 0; i < 4; i++) {
                j[i] = (job){.c = &c, .mm = i % 2 ? tab.matmul[type] : tab.matmul4[type], .n = ntok, .xq = xq, .y = y};
                j[i].iters = 1;
                double t = run(&j[i], i < 2 ? 1 : 2);
                int it = (int)(secs / 20 / (t + 1e-9));
                j[i].iters = it < 1 ? 1 : it;
            }
            for (int round = 0; round < 10; round++)
                for (int i = 0; i < 4; i++) {
                    double v = macs * j[i].iters / run(&j[i], i < 2 ? 1 : 2) / 1e9;
                    g[i] = v > g[i] ? v : g[i];
                }
            printf("%-6s %-9s %9.1f %9.1f %6.2f %9.1f %9.1f %6.2f%s\n", jlm_fmt_type_traits(type)->name, tab.name,
                   g[0], g[1], g[1] / g[0], g[2], g[3], g[3] / g[2],
                   (tab.native_gemm >> type) & 1 ? "" : "  (no GEMM: matmul = matmul4)");
            fflush(stdout);
        }
        copyset_free(&c);
    }
    free(buf);
    free(xq);
    free(x);
    free(y);
    return 0;
}

/* ---------------------------------------------------------------- main */

static const uint8_t TYPES[] = {JLM_T_Q4_0, JLM_T_Q8_0, JLM_T_Q5_0, JLM_T_Q5_1, JLM_T_MXFP4, JLM_T_Q3_K,
                                JLM_T_Q4_K, JLM_T_Q5_K, JLM_T_Q6_K, JLM_T_F16, JLM_T_BF16, JLM_T_F32};

int main(int argc, char **argv)
{
    uint64_t k = 4096, rows = 4096, cold = 768, gemm = 0;
    double secs = 1.0;
    uint8_t want[32];
    int nwant = 0, probe_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-k") && i + 1 < argc) k = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) rows = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) cold = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "-g") && i + 1 < argc) gemm = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-P")) probe_only = 1;
        else {
            for (size_t t = 0; t < sizeof TYPES; t++)
                if (!strcmp(argv[i], jlm_fmt_type_traits(TYPES[t])->name) && nwant < 32)
                    want[nwant++] = TYPES[t];
        }
    }
    if (!nwant) {
        memcpy(want, TYPES, sizeof TYPES);
        nwant = (int)sizeof TYPES;
    }
    if (gemm)
        return bench_gemm(want, nwant, k, rows, gemm, secs);
    cold <<= 20;
    float *x = malloc(k * sizeof *x), *y = aligned_alloc(64, up64(rows * sizeof *y));
    void *qb = malloc(jlm_k_act_q8_bytes(k));
    jlm_act_q8 xq;
    if (!x || !y || !qb || jlm_k_act_q8_init(&xq, qb, k, NULL)) {
        fprintf(stderr, "bench_kernels: bad -k %llu or out of memory\n", (unsigned long long)k);
        return 1;
    }
    uint64_t seed = 99;
    for (uint64_t i = 0; i < k; i++)
        x[i] = (float)((int64_t)(rng(&seed) % 2001) - 1000) / 1000.0f;
    jlm_k_quantize_act(x, &xq);

    uint8_t *pb = aligned_alloc(64, cold);
    memset(pb, 1, cold);
    job pj = {.probe = pb, .probe_len = cold};
    double p1 = gbps(&pj, 1, cold, 1, secs), p2 = gbps(&pj, 2, cold, 1, secs);
    printf("matvec %llu x %llu, cold set %llu MiB; probe (AVX2 read) 1 thread %.1f GB/s, 2 threads %.1f GB/s\n",
           (unsigned long long)rows, (unsigned long long)k, (unsigned long long)(cold >> 20), p1, p2);
    if (probe_only)
        return 0;
    printf("%-6s %-9s %8s %6s %8s %6s\n", "type", "variant", "1t GB/s", "/probe", "2t GB/s", "/probe");
    for (int ti = 0; ti < nwant; ti++) {
        uint8_t type = want[ti];
        copyset c;
        if (copyset_make(&c, type, k, rows, cold)) {
            fprintf(stderr, "bench_kernels: cannot build %s %llu x %llu\n", jlm_fmt_type_traits(type)->name,
                    (unsigned long long)rows, (unsigned long long)k);
            return 1;
        }
        for (int b = 0; b < NBUILD; b++) {
            jlm_k_cpu tab;
            if (!build_table(JLM_K_REF, b, &tab))
                continue;
            int v = tab.variant;
            job j = {.c = &c, .fn = tab.matvec[type], .x = x, .xq = &xq, .y = y};
            const char *tn = jlm_fmt_type_traits(type)->name;
            if (v == JLM_K_REF || !((tab.native >> type) & 1)) {
                j.iters = 1;
                double g = (double)c.bytes / run(&j, 1) / 1e9;
                printf("%-6s %-9s %8.2f %6.3f %8s %6s%s\n", tn, tab.name, g, g / p1, "-", "-",
                       v == JLM_K_REF ? "" : "  (falls back to ref)");
                continue;
            }
            double g1 = gbps(&j, 1, c.bytes, 2, secs), g2 = gbps(&j, 2, c.bytes, 2, secs);
            printf("%-6s %-9s %8.1f %6.2f %8.1f %6.2f\n", tn, tab.name, g1, g1 / p1, g2, g2 / p2);
            fflush(stdout);
        }
        copyset_free(&c);
    }
    free(pb);
    free(x);
    free(y);
    free(qb);
    return 0;
}
