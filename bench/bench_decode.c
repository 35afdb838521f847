/* bench_decode.c - decode speed against the memory-bandwidth roofline.
 *
 * For Llama-3.2-1B-shaped models (bench/mkgguf.c preset llama-1b: vocab 32000,
 * tied embeddings, random weights) in Q4_0, Q4_K and Q8_0: generate, convert,
 * open with an unlimited budget (every page resident after warm-up, nothing
 * paged per token), then measure
 *   probe   memory-read bandwidth of T threads over a 1 GiB buffer (> L3),
 *           measured before each of R decode rounds, in the same run;
 *   pp      prefill tokens/s (P tokens in one jlm_engine_eval call, batched
 *           as the engine batches them);
 *   tg      decode tokens/s (N single-token evals, greedy feed, in R rounds);
 *   B/tok   jlm_engine_bytes_per_token: weight bytes one token reads;
 *   roof    (B/tok x tg) / probe: the fraction of the bandwidth roofline,
 *           per round; the median of the rounds is printed.
 * Read the ratio, not the absolute figures: the machines are shared.
 *
 *   build/bench/bench_decode [-t T] [-p P] [-n N] [--rounds R] [--layers L] [--types Q4_0,Q4_K,Q8_0]
 * Defaults: T 2, P 16, N 32, R 4, all 16 layers. Disk: ~1.2 GiB at a time in $TMPDIR.
 */
#include "bench/bench_common.h"

#include "engine/model.h"

typedef struct decode_opts { int n_threads, n_pp, n_tg, rounds; uint32_t n_layer; char types[128]; } decode_opts;

typedef struct decode_row {
    const char *type;
    uint64_t file_bytes, bpt;
    double probe_bw, pp_tps, tg_tps, roof;   /* medians over the rounds (not pp) */
} decode_row;

static int32_t argmax(const float *l, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return (int32_t)b;
}

/* Opens the container, warms it, measures pp, then tg in `rounds` rounds,
 * each preceded by a bandwidth probe (the machine's load drifts: a ratio is
 * taken per round, from figures seconds apart, and the median reported).
 * 0 or -1 (stderr). */
static int measure(const char *path, const decode_opts *o, const bench_probe *probe, decode_row *row)
{
    jlm_engine_opts eo = {.n_threads = o->n_threads, .budget = 0, .n_ctx = 512, .direct = 1, .quiet = 1};
    jlm_engine *e;
    jlm_err err = {0};
    if (jlm_engine_open(path, &eo, &e, &err)) {
        fprintf(stderr, "bench_decode: %s\n", err.msg);
        return -1;
    }
    uint32_t nv = jlm_engine_n_vocab(e);
    float *logits = malloc(nv * sizeof *logits);
    int32_t toks[256], tok;
    for (int i = 0; i < o->n_pp; i++)
        toks[i] = (int32_t)(259 + (i * 7919) % (nv - 259));
    int rc = logits ? 0 : -1, per = o->n_tg / o->rounds;
    double bw[64], tps[64], roof[64];
    /* warm-up: two tokens page every block in; the budget is unlimited, so it stays */
    if (rc || (rc = jlm_engine_eval(e, toks, 2, logits, &err)))
        goto out;
    jlm_engine_rewind(e, 0);
    double t0 = bench_now();
    if ((rc = jlm_engine_eval(e, toks, (uint32_t)o->n_pp, logits, &err)))
        goto out;
    row->pp_tps = o->n_pp / (bench_now() - t0);
    row->bpt = jlm_engine_bytes_per_token(e);
    tok = argmax(logits, nv);
    for (int r = 0; r < o->rounds && !rc; r++) {
        bw[r] = bench_probe_bw(probe, o->n_threads, 2);
        t0 = bench_now();
        for (int i = 0; i < per && !rc; i++) {   /* greedy feed, as generation does */
            rc = jlm_engine_eval(e, &tok, 1, logits, &err);
            tok = argmax(logits, nv);
        }
        tps[r] = per / (bench_now() - t0);
        roof[r] = (double)row->bpt * tps[r] / bw[r];
    }
    if (!rc) {
        row->probe_bw = bench_median(bw, o->rounds);
        row->tg_tps = bench_median(tps, o->rounds);
        row->roof = bench_median(roof, o->rounds);
    }
out:
    if (rc)
        fprintf(stderr, "bench_decode: %s: %s\n", path, err.msg[0] ? err.msg : "out of memory");
    free(logits);
    jlm_engine_close(e);
    return rc ? -1 : 0;
}

static int parse(int argc, char **argv, decode_opts *o)
{
    *o = (decode_opts){2, 16, 32, 4, 0, "Q4_0,Q4_K,Q8_0"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return -1;
        if (!strcmp(a, "-t")) o->n_threads = atoi(v);
        else if (!strcmp(a, "-p")) o->n_pp = atoi(v);
        else if (!strcmp(a, "-n")) o->n_tg = atoi(v);
        else if (!strcmp(a, "--rounds")) o->rounds = atoi(v);
        else if (!strcmp(a, "--layers")) o->n_layer = (uint32_t)atoi(v);
        else if (!strcmp(a, "--types")) snprintf(o->types, sizeof o->types, "%s", v);
        else return -1;
        i++;
    }
    return o->n_threads < 1 || o->n_pp < 2 || o->n_pp > 256 || o->rounds < 1 || o->rounds > 64 ||
           o->n_tg < o->rounds ? -1 : 0;
}

int main(int argc, char **argv)
{
    decode_opts o;
    if (parse(argc, argv, &o)) {
        fprintf(stderr, "usage: bench_decode [-t T] [-p P<=256] [-n N] [--rounds R] [--layers L] [--types Q4_0,Q4_K,Q8_0]\n");
        return 2;
    }
    char *dir = bench_tmpdir();
    bench_probe probe;
    if (!dir || bench_probe_open(&probe, (size_t)1 << 30)) {
        perror("bench_decode: temp dir or 1 GiB probe buffer");
        return 1;
    }
    mkg_shape s = {0};
    mkg_preset("llama-1b", &s);
    printf("bench_decode: llama-1b shape (n_embd %u, n_ff %u, %u layers, %u/%u heads, vocab %u, tied), "
           "%d threads, pp %d, tg %d in %d rounds, unlimited budget; probe: %d-thread read of 1 GiB before each round\n",
           s.n_embd, s.n_ff, o.n_layer ? o.n_layer : s.n_layer, s.n_head, s.n_head_kv, s.n_vocab, o.n_threads,
           o.n_pp, o.n_tg, o.rounds, o.n_threads);
    printf("%-6s %9s %9s %10s %8s %8s %10s %8s\n", "type", "file MiB", "MiB/tok", "probe GB/s", "pp t/s", "tg t/s",
           "tg GB/s", "roof");
    printf("(probe, tg t/s and roof are medians over the rounds; roof = MiB/tok x t/s / probe, per round)\n");
    int status = 0;
    char types[128];
    snprintf(types, sizeof types, "%s", o.types);
    for (char *sv, *ty = strtok_r(types, ",", &sv); ty; ty = strtok_r(NULL, ",", &sv)) {
        uint32_t gt;
        char path[1024];
        decode_row r = {.type = ty};
        if (mkg_parse_type(ty, &gt) || bench_make_model(dir, ty, "llama-1b", gt, o.n_layer, path, sizeof path) ||
            (r.file_bytes = bench_file_size(path), measure(path, &o, &probe, &r))) {
            status = 1;
            break;
        }
        unlink(path);
        double gbs = (double)r.bpt * r.tg_tps;
        printf("%-6s %9.1f %9.1f %10.2f %8.2f %8.2f %10.2f %8.3f\n", ty, r.file_bytes / 1048576.0,
               r.bpt / 1048576.0, r.probe_bw / 1e9, r.pp_tps, r.tg_tps, gbs / 1e9, r.roof);
        fflush(stdout);
    }
    bench_probe_close(&probe);
    bench_rmrf(dir);
    free(dir);
    return status;
}
