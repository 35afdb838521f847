/* engine_check.c - build/jlm-cuda-engine: the engine on the CUDA backend
 * against the CPU backend, and its decode/prefill speed, on a GPU machine
 * (bench/gpu-check.sh runs it). Self-contained like jlm-cuda-check: libjlm's
 * converter and engine, libc, libm, the static CUDA runtime; no SQLite,
 * jansson, FUSE or Criterion, so it can be carried to a machine without them.
 *
 *   jlm-cuda-engine check GGUF...        convert each, then per model: CPU vs
 *       CUDA whole, --gpu-layers 1 and --budget 1 --gpu-budget 1: greedy ids
 *       over 8 steps equal (where the CPU's top-2 margin exceeds twice the
 *       difference), logits within 1e-4 (5e-4 float weights) of the largest
 *       with the matmul offload (JLM_CUDA_BLOCKS=0), within the CPU's own
 *       tolerance against llama.cpp on quantized weights with whole blocks
 *       (the default: the device's norms move an int8 code by one); the
 *       round trips of the last decoded token; one PASS/FAIL line each
 *   jlm-cuda-engine bench GGUF|--synth PRESET TYPE [--pp N] [--tg N] [--rounds R] [--threads N]
 *                         [--gpu-budget BYTES]
 *       prefill and decode tok/s on CUDA (and the CPU's, same run; R rounds
 *       interleaved, medians), where a decode token's time goes on each
 *       (the engine's profile), device page-ins, bytes copied, kernel and
 *       transfer time; --synth writes
 *       bench/mkgguf's PRESET (e.g. synth-1b) in TYPE (Q4_0, Q8_0, Q4_K, F16)
 *       first, in the temp dir
 *
 * Without a device (or built without CUDA) it prints one "skip:" line and
 * exits 0; JLM_CUDA_EMULATE=1 runs it on the host emulation (how CI checks
 * that this program works). JLM_CUDA_KV=TYPE opens both engines with --kv
 * TYPE (f16: the whole blocks' F16 cache, against the CPU's F16 cache, float
 * weights within the CPU's F16 tolerance, 2e-3 of the largest logit; q8_0:
 * the CPU's Q8_0 tolerance, 3e-2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "converter/convert.h"
#include "format/jlm_format.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "kernels/cuda/cuda.h"

#define MKGGUF_NO_MAIN
#include "bench/mkgguf.c"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int convert(const char *gguf, const char *out)
{
    jlm_conv *c = NULL;
    jlm_err err = {0};
    int rc = jlm_conv_open(gguf, NULL, &c, &err);
    if (!rc)
        rc = jlm_conv_write(c, out, NULL, NULL, NULL, &err);
    jlm_conv_close(c);
    if (rc)
        fprintf(stderr, "FAIL convert %s: %s\n", gguf, err.msg);
    return rc;
}

static uint32_t g_threads;         /* bench --threads: 0 = the engine's default */

static jlm_engine *open_on(const char *path, const char *backend, uint32_t gl, uint64_t budget, uint64_t gb)
{
    jlm_engine_opts o = {.n_threads = g_threads, .quiet = 1, .direct = 1, .backend = backend, .device = "0",
                         .gpu_layers = gl, .budget = budget, .gpu_budget = gb, .kv = getenv("JLM_CUDA_KV")};
    jlm_engine *e = NULL;
    jlm_err err = {0};
    if (jlm_engine_open(path, &o, &e, &err)) {
        fprintf(stderr, "FAIL open %s on %s: %s\n", path, backend, err.msg);
        return NULL;
    }
    return e;
}

/* The largest logit's index; margin: its lead over the second. */
static int argmax2(const float *l, uint32_t n, double *margin)
{
    uint32_t b = 0, s = n > 1 ? 1 : 0;
    if (n > 1 && l[1] > l[0])
        b = 1, s = 0;
    for (uint32_t i = 2; i < n; i++)
        if (l[i] > l[b])
            s = b, b = i;
        else if (l[i] > l[s])
            s = i;
    *margin = (double)l[b] - l[s];
    return (int)b;
}

static int argmax(const float *l, uint32_t n)
{
    double m;
    return argmax2(l, n, &m);
}

/* Logits' tolerance against the CPU, relative to the largest: whole blocks
 * (unless JLM_CUDA_BLOCKS=0) on quantized weights the CPU's own against
 * llama.cpp (tests/backend_matrix.h's dev_cpu_tol), else the offload's. */
static double tol_of(const char *name)
{
    const char *bl = getenv("JLM_CUDA_BLOCKS"), *kv = getenv("JLM_CUDA_KV");
    int fl = strstr(name, "F32") || strstr(name, "f32") || strstr(name, "F16") || strstr(name, "tiny-random");
    if (!(bl && !strcmp(bl, "0")) && !fl && !strstr(name, "stories260K"))
        return strstr(name, "Q2_K") ? 0.12 : 0.05;
    if (fl && kv && !strcmp(kv, "q8_0") && !(bl && !strcmp(bl, "0")))
        return 3e-2;   /* a K/V code one step (1/127 of its block's largest) off where the rows' last bits differ */
    if (fl && kv && !strcmp(kv, "f16") && !(bl && !strcmp(bl, "0")))
        return 2e-3;   /* a K/V element one half-ulp off the CPU's where the rows' last f32 bits differ */
    return fl ? 5e-4 : 1e-4;
}

/* 0 when the CUDA run (cfg 0 whole, 1 split, 2 one frame each side, 3 two
 * device frames: every block paged in ahead on the copy thread) matches the
 * CPU's. */
static int check_one(const char *name, const char *path, int cfg)
{
    static const char *WHAT[] = {"whole", "--gpu-layers 1", "--budget 1 --gpu-budget 1", "two device frames"};
    jlm_engine *ec = open_on(path, "cpu", 0, 0, 0);
    uint64_t two = 0;
    if (ec) {
        const jlm_config *mc = &jlm_engine_model(ec)->config;
        uint32_t pins[3] = {2, 0, mc->n_expert ? mc->n_expert_used : 0};
        two = jlm_pager_min_budget(jlm_engine_pager(ec), pins);
    }
    jlm_engine *ev = open_on(path, "cuda", cfg == 1 ? 1 : 0, cfg == 2 ? 1 : 0, cfg == 2 ? 1 : cfg == 3 ? two : 0);
    if (!ec || !ev) {
        jlm_engine_close(ec);
        jlm_engine_close(ev);
        return 1;
    }
    uint32_t nv = jlm_engine_n_vocab(ec);
    float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
    double tol = tol_of(name), worst = 0;
    int32_t tok[3] = {1, 10, 20};
    uint32_t n = 3;
    int bad = 0;
    for (int step = 0; step < 8 && !bad; step++) {
        jlm_err e1 = {0}, e2 = {0};
        if (jlm_engine_eval(ec, tok, n, lc, &e1) || jlm_engine_eval(ev, tok, n, lv, &e2)) {
            printf("FAIL %s (%s): eval: %s%s\n", name, WHAT[cfg], e1.msg, e2.msg);
            bad = 1;
            break;
        }
        double mx = 0, d = 0;
        for (uint32_t i = 0; i < nv; i++) {
            mx = fmax(mx, fabs(lc[i]));
            double di = fabs(lc[i] - lv[i]);
            if (!(di <= d))
                d = di;
        }
        double margin;
        int ic = argmax2(lc, nv, &margin);
        if (!(d <= tol * mx) || (margin > 2 * d && ic != argmax(lv, nv))) {
            printf("FAIL %s (%s): step %d: logits differ by %g of %g, ids %d vs %d\n", name, WHAT[cfg], step, d, mx,
                   argmax(lv, nv), argmax(lc, nv));
            bad = 1;
        }
        worst = fmax(worst, mx > 0 ? d / mx : d);
        tok[0] = argmax(lc, nv);
        n = 1;
    }
    jlm_dev_stats s, s0;
    jlm_engine_dev_stats(ev, &s0);
    jlm_err e3 = {0};
    if (!bad && jlm_engine_eval(ev, tok, 1, lv, &e3)) {
        printf("FAIL %s (%s): eval: %s\n", name, WHAT[cfg], e3.msg);
        bad = 1;
    }
    jlm_engine_dev_stats(ev, &s);
    if (!bad && (s.matmuls == 0 || s.fallbacks)) {
        printf("FAIL %s (%s): %llu matmuls on the device, %llu fell back\n", name, WHAT[cfg],
               (unsigned long long)s.matmuls, (unsigned long long)s.fallbacks);
        bad = 1;
    }
    if (!bad && cfg == 3 && jlm_engine_model(ev)->hdr.n_blocks > 2 && !s.prefetches) {
        printf("FAIL %s (%s): no page-in was made ahead\n", name, WHAT[cfg]);
        bad = 1;
    }
    if (!bad)
        printf("PASS %s (%s): 8 steps, ids equal, logits within %.2g of the largest; %llu matmuls, %llu page-ins "
               "(%llu ahead), %llu evictions; a decoded token %llu round trips\n", name, WHAT[cfg], worst,
               (unsigned long long)s.matmuls, (unsigned long long)s.page_ins, (unsigned long long)s.prefetches,
               (unsigned long long)s.evictions, (unsigned long long)(s.waits - s0.waits));
    free(lc);
    free(lv);
    jlm_engine_close(ec);
    jlm_engine_close(ev);
    return bad;
}

static const char *base(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int cmd_check(int argc, char **argv, const char *tmp)
{
    int fails = 0;
    for (int i = 0; i < argc; i++) {
        char out[4096];
        snprintf(out, sizeof out, "%s/m%d.jlm", tmp, i);
        if (convert(argv[i], out)) {
            fails++;
            continue;
        }
        for (int cfg = 0; cfg < 4; cfg++)
            fails += check_one(base(argv[i]), out, cfg);
        unlink(out);
    }
    printf("engine check: %d failing\n", fails);
    return fails ? 1 : 0;
}

/* One bench run on one backend: prefill and decode tok/s, and where a decode
 * token's time went (the engine's profile; matmul includes the wait for the
 * device's result), with the device's counters over the decode steps. */
typedef struct bench_res {
    double pp, tg;                 /* tok/s */
    double ms_tok, ms_matmul, ms_attn, ms_other, ms_pagein; /* per decode token */
    double ms_kernel, ms_xfer, matmuls, waits;               /* device, per decode token */
    int threads;
    jlm_dev_stats st;              /* the whole run's device counters */
} bench_res;

static int bench_on(const char *path, const char *backend, uint32_t pp, uint32_t tg, uint64_t gb, bench_res *res)
{
    jlm_engine *e = open_on(path, backend, 0, 0, gb);
    if (!e)
        return 1;
    jlm_err err = {0};
    uint32_t nv = jlm_engine_n_vocab(e);
    float *l = malloc(nv * 4);
    int32_t *ids = malloc(pp * sizeof *ids);
    for (uint32_t i = 0; i < pp; i++)
        ids[i] = (int32_t)(1 + i * 7 % (nv - 1));
    int rc = jlm_engine_eval(e, ids, 8, l, &err);   /* warm: pages in */
    jlm_engine_rewind(e, 0);
    double t0 = now_s();
    if (!rc)
        rc = jlm_engine_eval(e, ids, pp, l, &err);
    double t1 = now_s();
    jlm_dev_stats s0 = {0}, s1 = {0};
    jlm_engine_dev_stats(e, &s0);
    jlm_engine_prof_reset(e);
    jlm_engine_profile(e, 1);
    for (uint32_t i = 0; !rc && i < tg; i++) {
        int32_t t = argmax(l, nv);
        rc = jlm_engine_eval(e, &t, 1, l, &err);
    }
    double t2 = now_s();
    jlm_engine_prof pr;
    jlm_engine_prof_get(e, &pr);
    jlm_engine_profile(e, 0);
    jlm_engine_dev_stats(e, &s1);
    if (rc)
        printf("FAIL bench on %s: %s\n", backend, err.msg);
    memset(res, 0, sizeof *res);
    res->pp = pp / (t1 - t0);
    res->tg = tg / (t2 - t1);
    res->ms_tok = (t2 - t1) * 1e3 / tg;
    res->ms_matmul = pr.ns[JLM_PROF_MATMUL] / 1e6 / tg;
    res->ms_attn = pr.ns[JLM_PROF_ATTN] / 1e6 / tg;
    res->ms_pagein = pr.ns[JLM_PROF_PAGEIN] / 1e6 / tg;
    res->ms_other = pr.ns[JLM_PROF_OTHER] / 1e6 / tg;
    res->ms_kernel = (double)(s1.kernel_ns - s0.kernel_ns) / 1e6 / tg;
    res->ms_xfer = (double)(s1.xfer_ns - s0.xfer_ns) / 1e6 / tg;
    res->matmuls = (double)(s1.matmuls - s0.matmuls) / tg;
    res->waits = (double)(s1.waits - s0.waits) / tg;
    res->threads = pr.n_threads;
    res->st = s1;
    free(l);
    free(ids);
    jlm_engine_close(e);
    return rc;
}

static int cmp_res_tg(const void *a, const void *b)
{
    double x = ((const bench_res *)a)->tg, y = ((const bench_res *)b)->tg;
    return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The round with the median decode speed, its prefill replaced by the
 * median prefill (the two are medians of their own). */
static bench_res median_of(bench_res *r, int n)
{
    double pp[16];
    for (int i = 0; i < n; i++)
        pp[i] = r[i].pp;
    qsort(pp, (size_t)n, sizeof pp[0], cmp_double);
    qsort(r, (size_t)n, sizeof r[0], cmp_res_tg);
    bench_res m = r[n / 2];
    m.pp = pp[n / 2];
    return m;
}

static int cmd_bench(int argc, char **argv, const char *tmp)
{
    uint32_t pp = 128, tg = 32;
    int rounds = 1;
    uint64_t gb = 0;
    const char *gguf = NULL;
    char synth[4096] = "";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--synth") && i + 2 < argc) {
            mkg_shape sh;
            uint32_t ty;
            char msg[600] = "";
            snprintf(synth, sizeof synth, "%s/%s-%s.gguf", tmp, argv[i + 1], argv[i + 2]);
            if (mkg_preset(argv[i + 1], &sh) || mkg_parse_type(argv[i + 2], &ty) ||
                mkg_write(synth, &sh, ty, 0, 1, msg, sizeof msg)) {
                fprintf(stderr, "FAIL --synth %s %s: %s\n", argv[i + 1], argv[i + 2], *msg ? msg : "unknown preset or type");
                return 1;
            }
            gguf = synth;
            i += 2;
        } else if (!strcmp(argv[i], "--pp") && i + 1 < argc)
            pp = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tg") && i + 1 < argc)
            tg = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            g_threads = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gpu-budget") && i + 1 < argc)
            gb = strtoull(argv[++i], NULL, 10);
        else
            gguf = argv[i];
    }
    if (!gguf || pp < 8 || !tg || rounds < 1 || rounds > 16) {
        fprintf(stderr, "usage: jlm-cuda-engine bench GGUF|--synth PRESET TYPE [--pp N>=8] [--tg N>=1] "
                        "[--rounds 1..16] [--threads N] [--gpu-budget BYTES]\n");
        return 2;
    }
    char out[4096];
    snprintf(out, sizeof out, "%s/bench.jlm", tmp);
    if (convert(gguf, out))
        return 1;
    jlm_model *m = NULL;
    jlm_err merr = {0};
    uint64_t fsize = 0;
    if (!jlm_fmt_open(out, &m, &merr)) {
        fsize = m->hdr.page_size * m->hdr.n_blocks;
        jlm_fmt_close(m);
    }
    bench_res rc_[16], rg_[16];
    int rc = 0;
    for (int r = 0; !rc && r < rounds; r++)   /* interleaved: the machine's noise hits both */
        rc = bench_on(out, "cpu", pp, tg, 0, &rc_[r]) | bench_on(out, "cuda", pp, tg, gb, &rg_[r]);
    if (!rc) {
        bench_res c = median_of(rc_, rounds), g = median_of(rg_, rounds);
        const jlm_dev_stats *gs = &g.st;
        printf("bench %s: pp%u cuda %.1f t/s (cpu %.1f, %.2fx), tg%u cuda %.1f t/s (cpu %.1f, %.2fx); "
               "medians of %d rounds, %d threads\n", base(gguf), pp, g.pp, c.pp, g.pp / c.pp, tg, g.tg, c.tg,
               g.tg / c.tg, rounds, g.threads);
        printf("bench %s: block pages %.1f MiB: decode reads them at %.1f GB/s from device frames\n", base(gguf),
               fsize / 1048576.0, fsize * g.tg / 1e9);
        printf("bench %s: a decode token on cuda: %.2f ms = matmul %.2f (device %.2f: %.0f launches in %.0f round "
               "trips, their wait and result; staging %.2f), attention %.2f, page-in %.2f, other %.2f; on the cpu "
               "%.2f ms = matmul %.2f, attention %.2f, other %.2f\n", base(gguf), g.ms_tok, g.ms_matmul, g.ms_kernel,
               g.matmuls, g.waits, g.ms_xfer, g.ms_attn, g.ms_pagein, g.ms_other, c.ms_tok, c.ms_matmul, c.ms_attn, c.ms_other);
        printf("bench %s: gpu-budget %llu: device page-ins %llu (%llu ahead), evictions %llu, bytes copied %llu, "
               "kernels %.1f ms, transfers %.1f ms, device %s\n", base(gguf), (unsigned long long)gs->budget,
               (unsigned long long)gs->page_ins, (unsigned long long)gs->prefetches, (unsigned long long)gs->evictions,
               (unsigned long long)gs->bytes_up, gs->kernel_ns / 1e6, gs->xfer_ns / 1e6, gs->device ? gs->device : "?");
    }
    unlink(out);
    if (*synth)
        unlink(synth);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "check") && strcmp(argv[1], "bench"))) {
        fprintf(stderr, "usage: jlm-cuda-engine check GGUF... | bench GGUF [--pp N] [--tg N] [--gpu-budget BYTES]\n");
        return 2;
    }
    const char *em = getenv("JLM_CUDA_EMULATE");
    if (!(em && *em && strcmp(em, "0"))) {
        jlm_cu_info in;
        jlm_cu_probe(&in);
        if (in.count == 0) {
            printf("skip: no CUDA device (%s)\n", in.reason);
            return 0;
        }
    }
    const char *t = getenv("TMPDIR");
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s/jlm-cuda-engine.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    int rc = !strcmp(argv[1], "check") ? cmd_check(argc - 2, argv + 2, tmp) : cmd_bench(argc - 2, argv + 2, tmp);
    rmdir(tmp);
    return rc;
}
