/* bench_moe.c - MoE decode under a memory budget against a naive streamer.
 *
 * Model: bench/mkgguf.c preset moe-32x4 (n_embd 1024, expert ff 512, 8
 * layers, 32 experts of which 4 are routed, vocab 32000; random weights, so
 * routing is close to uniform: the hardest case for an expert cache).
 * For budgets of 100%, 50% and 25% of the container's size: open the engine,
 * decode W warm-up tokens (the cache settles at that budget), reset the pager
 * counters, decode N tokens (random ids, fixed seed: see next_id) and report tokens/s and what the
 * pager read per token (bytes, page-ins, read wait).
 *
 * Naive baseline, same run, same source kind (O_DIRECT file source when the
 * filesystem allows it, as the engine's): per token, pread every expert page
 * of every MoE block (what a streamer without routing-aware paging reads),
 * timed; naive tokens/s = 1 / (that read time + the compute time of a token
 * at the 100% budget, where nothing is read). Attention block pages are not
 * counted for the naive streamer, which favours it at the low budgets.
 * Ratios printed: engine t/s / naive t/s and engine bytes / naive bytes.
 *
 *   build/bench/bench_moe [-t T] [-n N] [-w W] [--type Q4_K] [--layers L]
 * Defaults: T 2, N 32, W 16, Q4_K, 8 layers (~280 MiB in $TMPDIR).
 */
#include "bench/bench_common.h"

#include "engine/model.h"

typedef struct moe_opts { int n_threads, n_tg, n_warm; uint32_t n_layer; const char *type; } moe_opts;

typedef struct moe_row {
    uint64_t budget;     /* in force (after raising to the minimum working set) */
    double   tps, bytes_tok, pageins_tok, wait_ms_tok;
    uint32_t n_routed;   /* distinct (block, expert) pairs the measured tokens routed to */
} moe_row;

/* Marks the experts the last token routed to in seen (n_layer x n_expert). */
static void mark_routes(jlm_engine *e, uint8_t *seen)
{
    const jlm_config *c = &jlm_engine_model(e)->config;
    for (uint32_t b = 0; b < c->n_layer; b++) {
        const int32_t *r = jlm_engine_last_route(e, b);
        for (uint32_t k = 0; r && k < c->n_expert_used; k++)
            if (r[k] >= 0 && (uint32_t)r[k] < c->n_expert)
                seen[(size_t)b * c->n_expert + (uint32_t)r[k]] = 1;
    }
}

/* Random ids (fixed seed), as llama-bench's tg feeds: a random-weight model
 * fed its own greedy output falls into a loop of one token whose routing
 * never changes, which would measure a cache that never misses. */
static int32_t next_id(uint64_t *s, uint32_t n_vocab)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)(259 + (*s >> 33) % (n_vocab - 259));
}

/* Decodes W + N tokens at `budget`; the last N are measured. 0 or -1. */
static int run_budget(const char *path, const moe_opts *o, uint64_t budget, moe_row *row)
{
    jlm_engine_opts eo = {.n_threads = o->n_threads, .budget = 0, .n_ctx = 512, .direct = 1, .quiet = 1};
    jlm_engine *e;
    jlm_err err = {0};
    if (budget && jlm_engine_open(path, &eo, &e, &err) == 0) {
        /* budget is of page frames: the engine's budget also bounds its KV
         * cache (as far as the run's positions take it, 256 at a time),
         * scratch and dense region, so add what they take */
        jlm_engine_mem mi;
        jlm_engine_mem_info(e, &mi);
        uint64_t pos = ((uint64_t)(1 + o->n_warm + o->n_tg) + 255) / 256 * 256;
        budget += mi.kv_token * (pos < mi.kv_full / mi.kv_token ? pos : mi.kv_full / mi.kv_token) + mi.scratch + mi.dense;
        jlm_engine_close(e);
    }
    eo.budget = budget;
    if (jlm_engine_open(path, &eo, &e, &err)) {
        fprintf(stderr, "bench_moe: %s\n", err.msg);
        return -1;
    }
    uint32_t nv = jlm_engine_n_vocab(e);
    const jlm_config *cf = &jlm_engine_model(e)->config;
    size_t n_pairs = (size_t)cf->n_layer * cf->n_expert;
    float *logits = malloc(nv * sizeof *logits);
    uint8_t *seen = calloc(n_pairs ? n_pairs : 1, 1);
    uint64_t seed = 99;
    int32_t tok;
    int rc = logits && seen && nv > 259 ? 0 : -1;
    double t0 = 0;
    for (int i = 0; i < o->n_warm + o->n_tg && !rc; i++) {
        if (i == o->n_warm) {
            jlm_pager_stats_reset(jlm_engine_pager(e));
            t0 = bench_now();
        }
        tok = next_id(&seed, nv);
        rc = jlm_engine_eval(e, &tok, 1, logits, &err);
        if (i >= o->n_warm)
            mark_routes(e, seen);
    }
    if (!rc) {
        double dt = bench_now() - t0;
        jlm_pager_counters c;
        jlm_pager_stats(jlm_engine_pager(e), &c);
        uint64_t bytes = 0, pageins = 0, wait_ns = 0;
        for (uint32_t a = 0; a < c.n_arrays; a++) {
            bytes += c.a[a].bytes_read;
            pageins += c.a[a].page_ins;
            wait_ns += c.a[a].read_ns;
        }
        row->budget = jlm_engine_budget(e);
        row->tps = o->n_tg / dt;
        row->bytes_tok = (double)bytes / o->n_tg;
        row->pageins_tok = (double)pageins / o->n_tg;
        row->wait_ms_tok = wait_ns / 1e6 / o->n_tg;
        row->n_routed = 0;
        for (size_t i = 0; i < n_pairs; i++)
            row->n_routed += seen[i];
    } else {
        fprintf(stderr, "bench_moe: %s: %s\n", path, err.msg[0] ? err.msg : "out of memory");
    }
    free(logits);
    free(seen);
    jlm_engine_close(e);
    return rc ? -1 : 0;
}

/* Seconds per token to read every expert page of every MoE block (best of
 * `reps` tokens); *bytes = bytes read per token. 0 or -1. */
static int naive_read(const char *path, int reps, double *sec_tok, uint64_t *bytes, int *direct, uint32_t *n_pages)
{
    jlm_model *m;
    jlm_err err = {0};
    if (jlm_fmt_open(path, &m, &err)) {
        fprintf(stderr, "bench_moe: %s\n", err.msg);
        return -1;
    }
    const jlm_header *h = &m->hdr;
    uint32_t n_x = m->config.n_expert, n_blocks = n_x ? h->n_exp_pages / n_x : 0;
    uint64_t span = (uint64_t)n_x * h->exp_page_size;
    jlm_file_source_opts so = {.direct = 1};
    jlm_source *src = NULL;
    void *buf = NULL;
    int rc = jlm_source_open_file(path, &so, &src, &err);
    if (!rc && (!n_blocks || posix_memalign(&buf, 4096, span)))
        rc = jlm_errf(&err, JLM_ENOMEM, "%s: no expert pages, or no memory for %llu bytes", path,
                      (unsigned long long)span);
    double best = 1e30;
    for (int r = 0; r < reps && !rc; r++) {
        double t0 = bench_now();
        for (uint32_t b = 0; b < n_blocks && !rc; b++)
            rc = src->read(src, h->exp_data_off + b * span, span, buf, &err);
        double dt = bench_now() - t0;
        best = dt < best ? dt : best;
    }
    if (rc)
        fprintf(stderr, "bench_moe: naive read: %s\n", err.msg);
    else {
        *sec_tok = best;
        *bytes = n_blocks * span;
        *direct = src->direct;
        *n_pages = h->n_exp_pages;
    }
    free(buf);
    jlm_source_close(src);
    jlm_fmt_close(m);
    return rc ? -1 : 0;
}

static int parse(int argc, char **argv, moe_opts *o)
{
    *o = (moe_opts){2, 32, 16, 0, "Q4_K"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return -1;
        if (!strcmp(a, "-t")) o->n_threads = atoi(v);
        else if (!strcmp(a, "-n")) o->n_tg = atoi(v);
        else if (!strcmp(a, "-w")) o->n_warm = atoi(v);
        else if (!strcmp(a, "--type")) o->type = v;
        else if (!strcmp(a, "--layers")) o->n_layer = (uint32_t)atoi(v);
        else return -1;
        i++;
    }
    return o->n_threads < 1 || o->n_tg < 1 || o->n_warm < 1 ? -1 : 0;
}

int main(int argc, char **argv)
{
    moe_opts o;
    uint32_t gt;
    if (parse(argc, argv, &o) || mkg_parse_type(o.type, &gt)) {
        fprintf(stderr, "usage: bench_moe [-t T] [-n N] [-w W] [--type F16|Q8_0|Q4_0|Q4_K] [--layers L]\n");
        return 2;
    }
    char *dir = bench_tmpdir(), path[1024];
    if (!dir || bench_make_model(dir, "moe", "moe-32x4", gt, o.n_layer, path, sizeof path)) {
        if (dir) bench_rmrf(dir);
        free(dir);
        return 1;
    }
    uint64_t size = bench_file_size(path);
    moe_row rows[3];
    static const int pct[3] = {100, 50, 25};
    int status = 0;
    for (int i = 0; i < 3 && !status; i++)
        status = run_budget(path, &o, size * (uint64_t)pct[i] / 100, &rows[i]);
    double naive_io = 0;
    uint64_t naive_bytes = 0;
    int direct = 0;
    uint32_t naive_n_pages = 0;
    if (!status)
        status = naive_read(path, 3, &naive_io, &naive_bytes, &direct, &naive_n_pages);
    if (!status) {
        double naive_tps = 1.0 / (naive_io + 1.0 / rows[0].tps);
        printf("bench_moe: moe-32x4 %s, %.1f MiB container, %d threads, %d warm-up + %d measured tokens, "
               "source %s\n", o.type, size / 1048576.0, o.n_threads, o.n_warm, o.n_tg,
               direct ? "O_DIRECT" : "buffered (page cache)");
        printf("naive: reads all experts: %.1f MiB/token in %.1f ms -> %.2f t/s (with the 100%% budget's compute)\n",
               naive_bytes / 1048576.0, naive_io * 1e3, naive_tps);
        printf("%-7s %10s %8s %10s %10s %11s %8s %12s %12s\n", "budget", "in force", "t/s", "MiB/tok", "pg-in/tok",
               "wait ms/tok", "routed", "t/s / naive", "bytes/naive");
        for (int i = 0; i < 3; i++)
            printf("%6d%% %9.1fM %8.2f %10.2f %10.1f %11.2f %8u %12.2f %12.3f\n", pct[i],
                   rows[i].budget / 1048576.0, rows[i].tps, rows[i].bytes_tok / 1048576.0, rows[i].pageins_tok,
                   rows[i].wait_ms_tok, rows[i].n_routed, rows[i].tps / naive_tps,
                   rows[i].bytes_tok / (double)naive_bytes);
        printf("(routed: distinct (block, expert) pages the measured tokens used, of %u)\n", naive_n_pages);
    }
    bench_rmrf(dir);
    free(dir);
    return status;
}
