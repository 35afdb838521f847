/* cmd_bench.c - `jlm bench MODEL [-p 512] [-n 128] [-r 3] [-t T] [--budget SIZE]`:
 * a llama-bench-like table of prompt processing (ppP) and generation (tgN)
 * speed, with the pager's page-in figures per test.
 *
 * Method (llama-bench's, adapted): one engine per invocation; a warm-up
 * eval of the prompt test's size (one token without -p) pages the weights in
 * (within the budget) before any timing (bench_warm);
 * each repetition starts from an empty context (rewind to 0), or with -d N
 * from N cached positions (N random ids evaluated as a prompt, untimed: the
 * test then runs at depth N, "tg128 @ d4096" as llama-bench's -d), and
 * zeroed pager counters. ppP evaluates P random token ids in one jlm_engine_eval call (the
 * engine batches them as it does for a prompt) and the last one's logits, as llama-bench's
 * prompt (so a device's queued blocks are inside the time); tgN evaluates N random ids one
 * call each.
 * t/s is mean +- sample sd over r repetitions; page-ins, MiB read and read
 * wait are means per repetition. Nothing goes to stdout but the table:
 * -o md (a Markdown table, the default, llama-bench's), csv (a header row and
 * one row per test) or json (one array of objects, printed at the end); the
 * numeric columns of csv and json are plain numbers (bytes, not "1.2 MiB"). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/pool.h"
#include "engine/sampler.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char BENCH_USAGE[] =
    "usage: jlm bench MODEL [-p 512] [-n 128] [-d 0] [-r 3] [-t THREADS] [--budget SIZE] [--kv f32|f16|q8_0] [-ctk T] [-ctv T] [--no-direct]\n"
    "                 [--no-prefetch] [--read-depth N] [--no-predict] [--no-warm] [--profile] [--backend cpu|vulkan|cuda|auto|cuda,vulkan|vulkan,cuda]\n"
    "                 [--device N|NAME[,..]] [--gpu-layers N|all[,M|all]] [--gpu-budget SIZE[,SIZE]]\n"
    "  -p 0 or -n 0 skips that test\n";

typedef enum { OUT_MD, OUT_CSV, OUT_JSON } bench_out;
typedef struct bench_opts { const char *model, *out; jlm_opts_gpu gpu; int n_pp, n_tg, depth, reps, profile; bench_out fmt; jlm_engine_opts eng; } bench_opts;

/* A device backend's figures, means per repetition. */
typedef struct bench_dev {
    const char *kind, *device, *path;
    double pageins, up_mib, imp_mib, kernel_ms, xfer_ms, matmuls;
} bench_dev;

/* One test's figures: per repetition, then summarized. */
typedef struct bench_res {
    double tps_mean, tps_sd, pageins, mib, wait_ms;
    double solo, solo_ms;                        /* the pool's solo periods a run, and their ms (engine/pool.h) */
    int    n_dev;                                /* device backends that ran (in block order) */
    bench_dev dev[JLM_ENGINE_DEVS];
    jlm_engine_prof prof;
    jlm_dev_prof dprof[JLM_ENGINE_DEVS];         /* --profile: each device's, summed over repetitions */
} bench_res;

static int bench_parse(int argc, char **argv, bench_opts *o)
{
    o->n_pp = 512;
    o->n_tg = 128;
    o->reps = 3;
    o->eng.direct = 1;
    o->eng.quiet = 1;
    o->eng.budget = JLM_BUDGET_AUTO;
    const jlm_opt head[] = {
        {"-m", "--model", JLM_OPT_STR, &o->model, 0, 0, 0, "FILE", "the model (or give it first)"},
        {"-p", "--n-prompt", JLM_OPT_INT, &o->n_pp, 0, 1 << 20, 0, "N", "prompt tokens per pp test, 0: skip"},
        {"-n", "--n-gen", JLM_OPT_INT, &o->n_tg, 0, 1 << 20, 0, "N", "generated tokens per tg test, 0: skip"},
        {"-d", "--depth", JLM_OPT_INT, &o->depth, 0, 1 << 20, 0, "N", "positions already cached when each test starts"},
        {"-r", "--repetitions", JLM_OPT_INT, &o->reps, 1, 1000, 0, "N", "repetitions per test"},
    };
    const jlm_opt tail[] = {
        {NULL, "--profile", JLM_OPT_FLAG, &o->profile, 0, 0, 0, NULL, "after each test, where a token's time went (per operation class, barrier waits, serial share; per device backend: its op classes and transfer/wait)"},
        {"-o", "--output", JLM_OPT_STR, &o->out, 0, 0, 0, "md|csv|json", "output format (default: md)"},
    };
    jlm_opt t[sizeof head / sizeof head[0] + sizeof tail / sizeof tail[0] + 2 * JLM_OPTS_ENGINE_MAX];
    int nt = jlm_opts_cat(t, 0, head, (int)(sizeof head / sizeof head[0]));
    nt += jlm_opts_engine_rows(t + nt, JLM_ROWS_THREADS | JLM_ROWS_BUDGET | JLM_ROWS_KV | JLM_ROWS_PAGING, &o->eng, NULL);
    nt = jlm_opts_cat(t, nt, tail, (int)(sizeof tail / sizeof tail[0]));
    nt += jlm_opts_engine_rows(t + nt, JLM_ROWS_BACKEND, &o->eng, &o->gpu);
    const char *pos[1] = {0};
    jlm_opts_spec os = {"jlm bench", "MODEL [options]   (-p 0 or -n 0 skips that test)", t, nt, pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? -1 : prc;
    if (os.n_pos && o->model)
        return jlm_cli_error("jlm bench", "give the model once: as MODEL or as -m"), 2;
    if (os.n_pos)
        o->model = pos[0];
    int frc = jlm_opts_engine_finish("jlm bench", &o->eng, &o->gpu);   /* --gpu-layers, the backend check */
    if (frc)
        return frc;
    if (o->out) {
        if (!strcmp(o->out, "md"))
            o->fmt = OUT_MD;
        else if (!strcmp(o->out, "csv"))
            o->fmt = OUT_CSV;
        else if (!strcmp(o->out, "json"))
            o->fmt = OUT_JSON;
        else {
            char line[300];
            snprintf(line, sizeof line, "-o '%.200s': expected md, csv or json (see --help)", o->out);
            return jlm_cli_error("jlm bench", line), 2;
        }
    }
    if (!o->model || o->n_pp < 0 || o->n_tg < 0 || o->n_pp + o->n_tg == 0 || o->reps < 1 || o->reps > 1000) {
        fputs(BENCH_USAGE, stderr);
        return 2;
    }
    return 0;
}

static double bench_clock(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Random ids as llama-bench uses (fixed seed: runs compare), skipping the
 * first 3 (usually unk/bos/eos). */
static void bench_ids(int32_t *ids, uint32_t n, uint32_t n_vocab, uint64_t *state)
{
    for (uint32_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)(n_vocab > 3 ? 3 + (*state >> 33) % (n_vocab - 3) : 0);
    }
}

/* The warm-up, untimed, as llama-bench's (its test run once): with -p P, one
 * prompt of P random ids, else one token; then back to position 0. It pages
 * the weights in: a dense model's every block either way. A MoE model's
 * prompts route to some experts only (one token to n_expert_used of a
 * block's), and the timed tests then read the others from the disk while
 * llama.cpp's minor faults find them in the page cache: so when the budget
 * holds every page, each expert page is got once too (docs/bench.md). */
static int bench_warm(jlm_engine *e, const bench_opts *o, jlm_err *err)
{
    uint32_t n = o->n_pp > 0 ? (uint32_t)o->n_pp : 1;
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    uint64_t seed = 4321;
    bench_ids(ids, n, jlm_engine_n_vocab(e), &seed);
    int rc = jlm_engine_eval(e, ids, n, NULL, err);
    free(ids);
    jlm_engine_rewind(e, 0);
    jlm_pager *pg = jlm_engine_pager(e);
    jlm_pager_counters pc;
    jlm_pager_stats(pg, &pc);
    uint64_t all = jlm_pager_bytes(pg);
    for (uint32_t i = 0; !rc && (!pc.budget || all <= pc.budget) && jlm_pager_extent(pg, JLM_PAGER_EXPERTS, i); i++) {
        const void *p;
        if (!(rc = jlm_pager_get(pg, JLM_PAGER_EXPERTS, i, 0, jlm_pager_extent(pg, JLM_PAGER_EXPERTS, i), &p, err)))
            jlm_pager_unpin(pg, JLM_PAGER_EXPERTS, i);
    }
    return rc;
}

/* Runs one test r times: pp (one eval of n ids) or tg (n evals of one id). */
/* Sums one repetition's profile into the test's. */
static void bench_prof_add(jlm_engine_prof *a, const jlm_engine_prof *b)
{
    for (int i = 0; i < JLM_PROF_N; i++)
        a->ns[i] += b->ns[i];
    a->total_ns += b->total_ns;
    a->evals += b->evals;
    a->tokens += b->tokens;
    a->dispatches += b->dispatches;
    a->par_wall_ns += b->par_wall_ns;
    a->wait_ns += b->wait_ns;
    a->busy_ns += b->busy_ns;
    a->n_threads = b->n_threads;
}

/* One repetition's profile, the engine's and each device's, into the test's. */
static void bench_prof_collect(const jlm_engine *e, bench_res *res)
{
    jlm_engine_prof pr;
    jlm_engine_prof_get(e, &pr);
    bench_prof_add(&res->prof, &pr);
    jlm_dev_prof dp;
    for (int i = 0; jlm_engine_dev_prof_at(e, i, &dp); i++) {
        res->dprof[i].timed = dp.timed;
        res->dprof[i].host_timed = dp.host_timed;
        for (int c = 0; c < JLM_DEVP_N; c++)
            res->dprof[i].ns[c] += dp.ns[c];
    }
}

/* --profile: after the test's row, where its time went, as comment lines
 * (md: "> ", csv/json: on stderr so the table stays parseable). */
static void bench_prof_print(const char *test, const jlm_engine_prof *p, int md)
{
    FILE *f = md ? stdout : stderr;
    const char *lead = md ? "> " : "# ";
    double tot = (double)p->total_ns, tok = p->tokens ? (double)p->tokens : 1.0;
    if (tot <= 0)
        return;
    fprintf(f, "%sprofile %s: %.3f ms/token over %llu tokens, %d threads\n", lead, test, tot / tok / 1e6,
            (unsigned long long)p->tokens, p->n_threads);
    for (int i = 0; i < JLM_PROF_N; i++)
        fprintf(f, "%s  %-15s %9.3f ms/token %6.1f%%\n", lead, jlm_engine_prof_name(i), (double)p->ns[i] / tok / 1e6,
                100.0 * (double)p->ns[i] / tot);
    double par = (double)p->par_wall_ns, thr = par * p->n_threads;
    fprintf(f, "%s  parallel parts  %9.3f ms/token %6.1f%% (%.1f dispatches/token)\n", lead, par / tok / 1e6,
            100.0 * par / tot, (double)p->dispatches / tok);
    fprintf(f, "%s  serial          %9.3f ms/token %6.1f%% (one thread works, the others idle)\n", lead,
            (tot > par ? tot - par : 0) / tok / 1e6, 100.0 * (tot > par ? tot - par : 0) / tot);
    fprintf(f, "%s  barrier wait    %9.3f thread-ms/token %6.1f%% of the parallel parts' thread time\n", lead,
            (double)p->wait_ns / tok / 1e6, thr > 0 ? 100.0 * (double)p->wait_ns / thr : 0.0);
}

/* --profile, a device backend's line: its time per op class and its
 * transfer/wait, per token and as a share of the token's time. */
static void bench_dev_prof_print(const char *test, const bench_dev *d, const jlm_dev_prof *p, double tot,
                                 double tok, int md)
{
    static const char *const NAMES[JLM_DEVP_N] = {"matmul", "attention", "norms/rope/act", "transfer/wait"};
    FILE *f = md ? stdout : stderr;
    fprintf(f, "%sprofile %s on %s:", md ? "> " : "# ", test, d->kind);
    for (int i = 0; i < JLM_DEVP_N; i++) {
        if (i < JLM_DEVP_XFER && !p->timed)
            fprintf(f, " %s n/a,", NAMES[i]);
        else
            fprintf(f, " %s %.3f ms/token (%.1f%%)%s", NAMES[i], (double)p->ns[i] / tok / 1e6,
                    100.0 * (double)p->ns[i] / tot, i + 1 < JLM_DEVP_N ? "," : "");
    }
    fprintf(f, " [%s; %s]\n", d->device,
            !p->timed ? "n/a: the device has no timestamp queries" : p->host_timed ? "timed on the host"
            : d->path && !strcmp(d->path, "emulated") ? "the emulation's stamps, on the host's clock" : "device timestamps");
}

/* The host pager's page-ins, bytes read and read waits (reads + waits for
 * prefetches) of the last run, added to the sums. */
static void bench_pager_add(jlm_engine *e, double *pageins, double *bytes, double *wait_ns)
{
    jlm_pager_counters c;
    jlm_pager_stats(jlm_engine_pager(e), &c);
    for (uint32_t a = 0; a < c.n_arrays; a++) {
        *pageins += (double)c.a[a].page_ins;
        *bytes += (double)c.a[a].bytes_read;
        *wait_ns += (double)(c.a[a].read_ns + c.a[a].pf_wait_ns);
    }
}

static int bench_test(jlm_engine *e, int pp, uint32_t n, uint32_t depth, int reps, int profile, bench_res *res,
                      jlm_err *err)
{
    uint32_t nv = jlm_engine_n_vocab(e);
    int32_t *ids = malloc((n > depth ? n : depth) * sizeof *ids);
    double *tps = malloc((size_t)reps * sizeof *tps);
    uint64_t seed = 1234;
    float *lg = profile || pp ? malloc(nv * sizeof *lg) : NULL;
    int rc = ids && tps && (lg || !(profile || pp)) ? 0 : jlm_errf(err, JLM_ENOMEM, "out of memory");
    memset(&res->prof, 0, sizeof res->prof);
    memset(res->dprof, 0, sizeof res->dprof);
    double pageins = 0, bytes = 0, wait_ns = 0, solo = 0, solo_ns = 0;
    jlm_dev_stats v0[JLM_ENGINE_DEVS], v1;
    const jlm_pool *pool = jlm_engine_pool(e);
    res->n_dev = 0;
    memset(res->dev, 0, sizeof res->dev);
    for (int r = 0; r < reps && !rc; r++) {
        jlm_engine_rewind(e, 0);
        if (depth) {
            bench_ids(ids, depth, nv, &seed);
            if ((rc = jlm_engine_eval(e, ids, depth, NULL, err)))
                break;
        }
        for (int i = 0; i < JLM_ENGINE_DEVS; i++)
            jlm_engine_dev_stats_at(e, i, &v0[i]);
        bench_ids(ids, n, nv, &seed);
        jlm_pager_stats_reset(jlm_engine_pager(e));
        if (profile)
            jlm_engine_prof_reset(e);
        unsigned long long st0 = jlm_pool_stalls(pool), sn0 = jlm_pool_solo_ns(pool);
        double t0 = bench_clock();
        if (pp)   /* the last id's logits: the work a device queued comes back inside the time */
            rc = jlm_engine_eval(e, ids, n, lg, err);
        else
            for (uint32_t i = 0; i < n && !rc; i++) {
                /* --profile: logits and a greedy pick per token, as jlm run */
                rc = jlm_engine_eval(e, &ids[i], 1, lg, err);
                if (lg && !rc) {
                    double s0 = bench_clock();
                    volatile int32_t pick = jlm_samp_argmax(lg, nv);   /* greedy, as jlm run at temperature 0 */
                    (void)pick;
                    jlm_engine_prof_add(e, JLM_PROF_SAMPLE, (unsigned long long)((bench_clock() - s0) * 1e9));
                }
            }
        tps[r] = n / (bench_clock() - t0);
        solo += (double)(jlm_pool_stalls(pool) - st0);
        solo_ns += (double)(jlm_pool_solo_ns(pool) - sn0);
        if (profile)
            bench_prof_collect(e, res);
        for (int i = 0; i < JLM_ENGINE_DEVS && jlm_engine_dev_stats_at(e, i, &v1); i++) {
            bench_dev *d = &res->dev[i];
            res->n_dev = i + 1;
            d->kind = v1.kind, d->device = v1.device, d->path = v1.path;
            d->pageins += (double)(v1.page_ins - v0[i].page_ins) / reps;
            d->up_mib += (double)(v1.bytes_up - v0[i].bytes_up) / 1048576.0 / reps;
            d->imp_mib += (double)(v1.bytes_imported - v0[i].bytes_imported) / 1048576.0 / reps;
            d->kernel_ms += (double)(v1.kernel_ns - v0[i].kernel_ns) / 1e6 / reps;
            d->xfer_ms += (double)(v1.xfer_ns - v0[i].xfer_ns) / 1e6 / reps;
            d->matmuls += (double)(v1.matmuls - v0[i].matmuls) / reps;
        }
        bench_pager_add(e, &pageins, &bytes, &wait_ns);
    }
    if (!rc) {
        double s = 0, q = 0;
        for (int r = 0; r < reps; r++)
            s += tps[r];
        res->tps_mean = s / reps;
        for (int r = 0; r < reps; r++)
            q += (tps[r] - res->tps_mean) * (tps[r] - res->tps_mean);
        res->tps_sd = reps > 1 ? sqrt(q / (reps - 1)) : 0.0;
        res->pageins = pageins / reps;
        res->mib = bytes / reps / 1048576.0;
        res->wait_ms = wait_ns / reps / 1e6;
        res->solo = solo / reps;
        res->solo_ms = solo_ns / reps / 1e6;
    }
    free(ids);
    free(tps);
    free(lg);
    return rc;
}

static void bench_size(char *buf, size_t n, double bytes)
{
    if (bytes >= 1024.0 * 1048576.0)
        snprintf(buf, n, "%.2f GiB", bytes / (1024.0 * 1048576.0));
    else
        snprintf(buf, n, "%.2f MiB", bytes / 1048576.0);
}

/* One test's row, in every format. */
typedef struct bench_row {
    const char *name, *size, *params, *budget;
    double size_bytes, n_params;
    uint64_t budget_bytes;
    int threads, pp, n, depth;
    bench_res r;
} bench_row;

/* A test's name as llama-bench prints it: "pp512", "tg128 @ d4096". */
static void bench_test_name(char *buf, size_t len, int pp, int n, int depth)
{
    if (depth)
        snprintf(buf, len, "%s%d @ d%d", pp ? "pp" : "tg", n, depth);
    else
        snprintf(buf, len, "%s%d", pp ? "pp" : "tg", n);
}

static void csv_field(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"')
            putchar('"');
        putchar(*s);
    }
    putchar('"');
}

static void bench_header_csv(void)
{
    puts("model,size_bytes,params,threads,budget_bytes,test,n_tokens,tps_mean,tps_sd,page_ins,read_mib,wait_ms,n_depth");
}

static void bench_row_csv(const bench_row *w)
{
    char test[40];
    bench_test_name(test, sizeof test, w->pp, w->n, w->depth);
    csv_field(w->name);
    printf(",%.0f,%.0f,%d,%llu,%s,%d,%.4f,%.4f,%.1f,%.4f,%.4f,%d\n", w->size_bytes, w->n_params, w->threads,
           (unsigned long long)w->budget_bytes, test, w->n, w->r.tps_mean, w->r.tps_sd, w->r.pageins, w->r.mib,
           w->r.wait_ms, w->depth);
}

static json_t *bench_row_json(const bench_row *w)
{
    char test[40];
    bench_test_name(test, sizeof test, w->pp, w->n, w->depth);
    json_t *o = json_pack("{s:s, s:I, s:I, s:i, s:I, s:s, s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "model", w->name,
                     "size_bytes", (json_int_t)w->size_bytes, "params", (json_int_t)w->n_params, "threads", w->threads,
                     "budget_bytes", (json_int_t)w->budget_bytes, "test", test, "n_tokens", w->n, "n_depth", w->depth, "tps_mean",
                     w->r.tps_mean, "tps_sd", w->r.tps_sd, "page_ins", w->r.pageins, "read_mib", w->r.mib,
                     "wait_ms", w->r.wait_ms);
    if (o && w->threads > 1) {
        json_object_set_new(o, "solo_periods", json_real(w->r.solo));
        json_object_set_new(o, "solo_ms", json_real(w->r.solo_ms));
    }
    for (int i = 0; o && i < w->r.n_dev; i++) {   /* per backend, by kind: the fields above are the CPU pager's */
        const bench_dev *d = &w->r.dev[i];
        json_object_set_new(o, d->kind, json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "page_ins", d->pageins,
                                                  "uploaded_mib", d->up_mib, "imported_mib", d->imp_mib, "matmuls",
                                                  d->matmuls, "kernel_ms", d->kernel_ms, "transfer_ms", d->xfer_ms));
    }
    return o;
}

/* The table's header; the model column is w wide (24, or the name's length). */
static void bench_header(int w)
{
    char dash[300];
    memset(dash, '-', sizeof dash - 1);
    dash[w < (int)sizeof dash - 1 ? w : (int)sizeof dash - 1] = 0;
    printf("| %-*s | %10s | %8s | %7s | %10s | %7s | %16s | %9s | %9s | %9s |\n", w, "model", "size", "params",
           "threads", "budget", "test", "t/s", "page-ins", "read MiB", "wait ms");
    printf("| %s | %.10s | %.8s | %.7s | %.10s | %.7s | %.16s | %.9s | %.9s | %.9s |\n",
           dash, "----------", "--------", "-------", "----------", "-------",
           "----------------", "---------", "---------", "---------");
}

/* The model's size, parameter count and the budget cells. */
static double bench_describe(jlm_engine *e, const bench_opts *o, char *size, char *params, char *budget)
{
    const jlm_model *m = jlm_engine_model(e);
    double n = 0;
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        double k = 1;
        for (int d = 0; d < t->ndim && d < 4; d++)
            k *= (double)t->dims[d];
        n += k;
    }
    bench_size(size, 16, (double)m->file_size);
    snprintf(params, 16, n >= 1e9 ? "%.2f B" : "%.2f M", n >= 1e9 ? n / 1e9 : n / 1e6);
    if (jlm_engine_budget(e) == 0)   /* --budget 0, or nothing found by the automatic one */
        snprintf(budget, 16, "unlimited");
    else
        bench_size(budget, 16, (double)jlm_engine_budget(e));
    return n;
}

static char *bench_container(const char *model)
{
    struct stat st;
    char *p = NULL;
    if (stat(model, &st) == 0 && S_ISDIR(st.st_mode))
        return asprintf(&p, "%s/model.jlm", model) < 0 ? NULL : p;
    return strdup(model);
}

/* A row: md, csv or a JSON object kept in rows; the per-backend lines on stderr. */
static void bench_print(const bench_opts *o, const bench_row *w, const char *test, json_t *rows)
{
    if (o->fmt == OUT_CSV)
        bench_row_csv(w);
    else if (o->fmt == OUT_JSON)
        json_array_append_new(rows, bench_row_json(w));
    else {
        char tps[24];
        int nw = strlen(w->name) > 24 ? (int)strlen(w->name) : 24;   /* the whole name, never cut */
        snprintf(tps, sizeof tps, "%.2f ± %.2f", w->r.tps_mean, w->r.tps_sd);
        printf("| %-*s | %10s | %8s | %7d | %10s | %7s | %17s | %9.1f | %9.2f | %9.2f |\n", nw, w->name, w->size,
               w->params, w->threads, w->budget, test, tps, w->r.pageins, w->r.mib, w->r.wait_ms);
    }
    if (w->threads > 1 && o->fmt != OUT_JSON) {   /* the pool's solo periods (engine/pool.h), on stderr */
        fflush(stdout);
        fprintf(stderr, "%s%s pool: %.1f solo periods a run, %.1f ms on the calling thread alone\n",
                o->fmt == OUT_MD ? "  " : "", test, w->r.solo, w->r.solo_ms);
    }
    if (w->r.n_dev && o->fmt != OUT_JSON) {   /* per backend, on stderr: the table's columns stay llama-bench's */
        fflush(stdout);
        fprintf(stderr, "%s%s per backend: cpu: page-ins %.1f, read %.2f MiB\n", o->fmt == OUT_MD ? "  " : "",
                test, w->r.pageins, w->r.mib);
        for (int i = 0; i < w->r.n_dev; i++) {   /* one line per device, in block order */
            const bench_dev *d = &w->r.dev[i];
            fprintf(stderr, "%s%s per backend: %s (%s, %s): page-ins %.1f, uploaded %.2f MiB, imported %.2f "
                    "MiB, matmuls %.0f, kernels %.2f ms, transfers %.2f ms\n", o->fmt == OUT_MD ? "  " : "",
                    test, d->kind, d->device, d->path, d->pageins, d->up_mib, d->imp_mib,
                    d->matmuls, d->kernel_ms, d->xfer_ms);
        }
    }
}

/* The model column: the last component of the name given ("x.jlm/": x.jlm), whole. */
static void bench_name(const char *given, char *name, size_t cap)
{
    size_t gl = strlen(given);
    while (gl > 1 && given[gl - 1] == '/')
        gl--;   /* a view folder given as "x.jlm/" */
    const char *base = given + gl;
    while (base > given && base[-1] != '/')
        base--;
    snprintf(name, cap, "%.*s", (int)(given + gl - base), base);
}

int jlm_cmd_bench(int argc, char **argv)
{
    bench_opts o = {0};
    int rc = bench_parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;   /* -1: --help printed */
    const char *given = o.model;   /* the model column names it as given, not its cache entry */
    if (!(o.model = jlm_cli_resolve_model("jlm bench", o.model)))
        return 1;
    o.eng.n_ctx = (uint32_t)(o.n_pp > o.n_tg ? o.n_pp : o.n_tg) + (uint32_t)o.depth + 1;
    char *path = bench_container(o.model);
    jlm_err err = {0};
    jlm_engine *e = NULL;
    if (!path || jlm_engine_open(path, &o.eng, &e, &err) || bench_warm(e, &o, &err)) {
        fprintf(stderr, "jlm bench: %s\n", path ? err.msg : "out of memory");
        jlm_engine_close(e);
        free(path);
        return 1;
    }
    if (o.profile)
        jlm_engine_profile(e, 1);
    char size[16], params[16], budget[16], name[256];
    double n_params = bench_describe(e, &o, size, params, budget);
    bench_name(given, name, sizeof name);
    int threads = o.eng.n_threads > 0 ? o.eng.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int name_w = strlen(name) > 24 ? (int)strlen(name) : 24;   /* the whole name, never cut */
    if (o.fmt == OUT_MD)
        bench_header(name_w);
    else if (o.fmt == OUT_CSV)
        bench_header_csv();
    json_t *rows = o.fmt == OUT_JSON ? json_array() : NULL;
    int status = 0;
    for (int pp = 1; pp >= 0 && !status; pp--) {
        int n = pp ? o.n_pp : o.n_tg;
        if (n == 0)
            continue;
        bench_res r;
        if (bench_test(e, pp, (uint32_t)n, (uint32_t)o.depth, o.reps, o.profile, &r, &err)) {
            fprintf(stderr, "jlm bench: %s: %s\n", path, err.msg);
            status = 1;
            break;
        }
        bench_row w = {name, size, params, budget, (double)jlm_engine_model(e)->file_size, n_params,
                       o.eng.budget ? jlm_engine_budget(e) : 0, threads, pp, n, o.depth, r};
        char test[40];   /* "tg32 @ d1024": the table's test, and its lines on stderr */
        bench_test_name(test, sizeof test, pp, n, o.depth);
        bench_print(&o, &w, test, rows);
        if (o.profile) {
            bench_prof_print(test, &r.prof, o.fmt == OUT_MD);
            for (int i = 0; i < r.n_dev && r.prof.total_ns; i++)
                bench_dev_prof_print(test, &r.dev[i], &r.dprof[i], (double)r.prof.total_ns,
                                     r.prof.tokens ? (double)r.prof.tokens : 1.0, o.fmt == OUT_MD);
        }
        fflush(stdout);
    }
    if (rows && !status) {
        char *js = json_dumps(rows, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (js)
            puts(js);
        else
            jlm_cli_error("jlm bench", "-o json: out of memory"), status = 1;
        free(js);
    }
    json_decref(rows);
    jlm_engine_close(e);
    free(path);
    return status;
}
