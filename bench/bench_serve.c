/* bench_serve.c - aggregate generation speed of `jlm serve` at 1, 4 and 8
 * concurrent requests, as ratios to 1 request, measured in the same run.
 *
 * Model: bench/mkgguf.c preset llama-1b (n_embd 2048, ff 8192, vocab 32000),
 * 2 layers, Q4_K (~90 MiB in $TMPDIR): decode is weight-read bound, which is
 * where one forward pass for the whole batch pays. The server runs with
 * --parallel 8; each request asks N tokens (ignore_eos, greedy) of a short
 * prompt. Aggregate t/s = c * N / wall time of c simultaneous curl requests.
 * Run twice: with the model resident, and with --budget half the container,
 * where every step pages the block pages in again: once per step for the
 * whole batch, so the ratio there should approach the request count.
 * A ratio near c means the batch costs about what one sequence costs. The
 * server's CPU time per generated token (from /proc) is printed too, with
 * its ratio to 1 request (how many times cheaper a token got): on a shared
 * machine that figure depends far less on other load than wall time does.
 *
 * Then a bounded soak: 8 clients each stream requests (16 tokens) back to
 * back for S seconds; prints requests done, failed requests (must be 0) and
 * the server's RSS after the warm-up and at the end (steady = no leak).
 * Then the drain: 8 streams in flight, SIGTERM; each must end with
 * `data: [DONE]`, a request sent meanwhile gets 503, the server exits 0.
 *
 * Last, two models (two copies of the container in a --models folder) under
 * ONE --budget of one container, against the same two unlimited: requests
 * alternating between them (each switch takes the other model's frames) and
 * 4 + 4 at once (the busy models settle at half the budget each); t/s as
 * ratios to the unlimited server, and the frames taken (jlm_budget_reclaims_total).
 *
 * First (alone with --ttft-only 1): the prefix cache, the time to the first
 * token of a chat's second turn after a first turn of ~2,000 tokens, on a
 * server with the cache and one without (--prefix-cache 0).
 *
 *   build/bench/bench_serve [-n N] [-t T] [--soak S] [--ttft-only 1]   defaults: N 16, T 2, S 15
 */
#include "bench/bench_common.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* Starts `jlm serve model --port 0` (with --prefix-cache 0 when no_cache);
 * the port, or -1. */
static int start_server_opt(const char *model, int n_threads, const char *budget, int no_cache, pid_t *pid)
{
    const char *jb = getenv("JLM_BIN");
    char t[16];
    snprintf(t, sizeof t, "%d", n_threads);
    int fd[2];
    if (!jb || pipe(fd))
        return -1;
    if ((*pid = fork()) == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        struct stat st;
        if (!stat(model, &st) && S_ISDIR(st.st_mode))   /* a folder of models */
            execl(jb, jb, "serve", "--models", model, "--port", "0", "--parallel", "8", "-t", t, "--budget", budget,
                  (char *)NULL);
        else
            execl(jb, jb, "serve", model, "--port", "0", "--parallel", "8", "-t", t, "--budget", budget,
                  no_cache ? "--prefix-cache" : (char *)NULL, "0", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char line[256] = "";
    size_t n = 0;
    for (int i = 0; i < 600 && n < sizeof line - 1; i++) {
        struct pollfd p = {.fd = fd[0], .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = read(fd[0], line + n, sizeof line - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        line[n] = 0;
        if (strchr(line, '\n')) break;
    }
    close(fd[0]);
    const char *c = strstr(line, "127.0.0.1:");
    return c ? atoi(c + 10) : -1;
}

static int start_server(const char *model, int n_threads, const char *budget, pid_t *pid)
{
    return start_server_opt(model, n_threads, budget, 0, pid);
}

/* CPU seconds (user + system) the process has used so far, or 0. */
static double cpu_s(pid_t pid)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    unsigned long ut = 0, st = 0;
    /* fields 14 and 15 after "pid (comm) state": comm holds no spaces here ("jlm") */
    int ok = f && fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2;
    if (f) fclose(f);
    return ok ? (double)(ut + st) / (double)sysconf(_SC_CLK_TCK) : 0.0;
}

/* c simultaneous requests of n tokens; aggregate tokens/s, or -1. */
static double run_concurrent(int port, int c, int n)
{
    char cmd[8192];
    int k = snprintf(cmd, sizeof cmd, "(");
    for (int i = 0; i < c; i++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "curl -sf --max-time 300 -o /dev/null http://127.0.0.1:%d/v1/completions -d "
                      "'{\"prompt\": \"request %d\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}' & ",
                      port, i, n);
    snprintf(cmd + k, sizeof cmd - (size_t)k, "wait) >/dev/null 2>&1");
    double t0 = bench_now();
    if (system(cmd) != 0)
        return -1;
    return (double)c * n / (bench_now() - t0);
}

/* VmRSS of pid in KiB, or 0. */
static long rss_kib(pid_t pid)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
    if (f) fclose(f);
    return kib;
}

/* 8 streaming clients for secs seconds; 0 when no request failed. */
static int soak(int port, pid_t pid, int secs, const char *dir)
{
    long rss0 = rss_kib(pid);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "for c in 1 2 3 4 5 6 7 8; do (end=$(($(date +%%s)+%d)); n=0; f=0; while [ $(date +%%s) -lt $end ]; do "
             "curl -sfN --max-time 60 -o /dev/null http://127.0.0.1:%d/v1/completions -d "
             "'{\"prompt\": \"soak\", \"max_tokens\": 16, \"stream\": true, \"ignore_eos\": true}' || f=$((f+1)); "
             "n=$((n+1)); done; echo $n $f > %s/soak$c) & done; wait", secs, port, dir);
    if (system(cmd) != 0)
        return -1;
    long total = 0, failed = 0;
    for (int c = 1; c <= 8; c++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/soak%d", dir, c);
        FILE *f = fopen(p, "r");
        long a = 0, b = 1;
        if (!f || fscanf(f, "%ld %ld", &a, &b) != 2) b = 1;
        if (f) fclose(f);
        total += a;
        failed += b;
    }
    long rss1 = rss_kib(pid);
    printf("soak %d s, 8 streaming clients: %ld requests, %ld failed; server RSS %ld -> %ld KiB (x%.2f)\n", secs,
           total, failed, rss0, rss1, rss0 ? (double)rss1 / (double)rss0 : 0.0);
    return failed ? -1 : 0;
}

/* The 1/4/8 table for one server; 0 or -1. */
static int table(int port, pid_t pid, int n)
{
    static const int conc[] = {1, 4, 8};
    printf("%-12s %10s %10s %16s %10s\n", "concurrent", "t/s", "ratio", "server cpu ms/t", "ratio");
    run_concurrent(port, 1, 4);   /* warm: pages in the weights once */
    double base = 0, cbase = 0;
    for (size_t i = 0; i < sizeof conc / sizeof conc[0]; i++) {
        double c0 = cpu_s(pid), tps = run_concurrent(port, conc[i], n);
        double cpt = (cpu_s(pid) - c0) * 1e3 / ((double)conc[i] * n);   /* load-independent cost of a token */
        if (tps < 0) {
            fprintf(stderr, "bench_serve: a request failed\n");
            return -1;
        }
        if (i == 0) { base = tps; cbase = cpt; }
        printf("%-12d %10.1f %10.2f %16.1f %10.2f\n", conc[i], tps, tps / base, cpt, cpt > 0 ? cbase / cpt : 0.0);
    }
    return 0;
}

/* Two models a, b under one budget: alternating requests, then 4 + 4 at once. */
static int two_models(int port, int n, double *alt, double *both)
{
    char cmd[8192];
    run_concurrent(port, 1, 4);
    double t0 = bench_now();
    for (int i = 0; i < 6; i++) {
        snprintf(cmd, sizeof cmd,
                 "curl -sf --max-time 300 -o /dev/null http://127.0.0.1:%d/v1/completions -d '{\"model\": \"%s\", "
                 "\"prompt\": \"request %d\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}'",
                 port, i % 2 ? "b" : "a", i, n);
        if (system(cmd) != 0)
            return -1;
    }
    *alt = 6.0 * n / (bench_now() - t0);
    int k = snprintf(cmd, sizeof cmd, "(");
    for (int i = 0; i < 8; i++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "curl -sf --max-time 300 -o /dev/null http://127.0.0.1:%d/v1/completions -d '{\"model\": \"%s\", "
                      "\"prompt\": \"request %d\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}' & ",
                      port, i % 2 ? "b" : "a", i, n);
    snprintf(cmd + k, sizeof cmd - (size_t)k, "wait) >/dev/null 2>&1");
    t0 = bench_now();
    if (system(cmd) != 0)
        return -1;
    *both = 8.0 * n / (bench_now() - t0);
    return 0;
}

/* The sum of a counter over both models in /metrics. */
static double metric_sum(int port, const char *name)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "curl -s http://127.0.0.1:%d/metrics | awk '/^%s\\{/ {s += $2} END {print s + 0}'", port,
             name);
    FILE *p = popen(cmd, "r");
    double v = 0;
    if (!p || fscanf(p, "%lf", &v) != 1) v = 0;
    if (p) pclose(p);
    return v;
}

/* The integer after "KEY": in the file at path; -1 when absent. */
static long json_int_in(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    char buf[65536], pat[64];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(buf, pat);
    return p ? atol(p + strlen(pat)) : -1;
}

/* POSTs the chat body in dir/name.json; seconds, the response in dir/name.out. */
static double post_chat(int port, const char *dir, const char *name)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "curl -s --max-time 600 -o %s/%s.out http://127.0.0.1:%d/v1/chat/completions "
             "--data-binary @%s/%s.json", dir, name, port, dir, name);
    double t0 = bench_now();
    int rc = system(cmd);
    return rc ? -1 : bench_now() - t0;
}

static int stop_server(pid_t pid);

/* TTFT of a chat's second turn after a first one of ~2,000 tokens: the
 * turn's prompt repeats the first turn and its reply, and asks one token
 * (its latency is the time to the first token). With the prefix cache the
 * shared prefix is not evaluated again. Seconds (cached, not), the prompt
 * and cached tokens of the cached server's turn; 0 when all ran. */
static int ttft(const char *model, int n_threads, const char *dir, double out[2], long tok[2])
{
    char p[1100], hist[1400] = "";
    size_t len = 0;
    uint64_t x = 88172645463325252ull;
    while (len < 1320) {   /* ~2,000 tokens of words drawn from a fixed generator: many distinct tokens */
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        len += (size_t)snprintf(hist + len, sizeof hist - len, "%c%c%c ", 'a' + (int)(x % 26), 'a' + (int)(x / 26 % 26),
                                'a' + (int)(x / 676 % 26));
    }
    for (int c = 0; c < 2; c++) {
        pid_t pid;
        int port = start_server_opt(model, n_threads, "0", c, &pid);
        if (port <= 0)
            return -1;
        snprintf(p, sizeof p, "%s/t1.json", dir);
        FILE *f = fopen(p, "w");
        if (f) fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 8, "
                      "\"temperature\": 0, \"ignore_eos\": true}", hist);
        if (!f || fclose(f) || post_chat(port, dir, "t1") < 0)
            return stop_server(pid), -1;
        snprintf(p, sizeof p, "%s/t2.json", dir);
        f = fopen(p, "w");   /* the reply of a random model is not valid text: its tokens stand for it ("x") */
        if (f) fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", "
                      "\"content\": \"x\"}, {\"role\": \"user\", \"content\": \"and then?\"}], \"max_tokens\": 1, "
                      "\"temperature\": 0, \"ignore_eos\": true}", hist);
        if (!f || fclose(f) || (out[c] = post_chat(port, dir, "t2")) < 0)
            return stop_server(pid), -1;
        snprintf(p, sizeof p, "%s/t2.out", dir);
        if (c == 0) {
            tok[0] = json_int_in(p, "prompt_tokens");
            tok[1] = json_int_in(p, "cached_tokens");
        }
        if (stop_server(pid) != 0)
            return -1;
    }
    return 0;
}

/* SIGTERM; the exit status (128 + signal when killed by one). */
static int stop_server(pid_t pid)
{
    int st = 0;
    kill(pid, SIGTERM);
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The drain after the soak: 8 streams in flight, then SIGTERM. Each stream
 * must end whole (curl succeeds, `data: [DONE]` received) and the server
 * exit 0; a request sent during the drain must get 503. 0 when all held. */
static int drain(int port, pid_t pid, const char *dir)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "for c in 1 2 3 4 5 6 7 8; do curl -sfN --max-time 120 -o %s/drain$c http://127.0.0.1:%d/v1/completions -d "
             "'{\"prompt\": \"drain\", \"max_tokens\": 48, \"stream\": true, \"ignore_eos\": true}' & done; "
             "sleep 0.5; kill -TERM %d; sleep 0.2; "
             "st=$(curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/v1/completions -d '{\"prompt\": \"late\"}'); "
             "f=0; for j in $(jobs -p); do wait $j || f=$((f+1)); done; echo $f $st > %s/drain",
             dir, port, (int)pid, port, dir);
    if (system(cmd) != 0)
        return -1;
    double t0 = bench_now();
    int st = 0;
    waitpid(pid, &st, 0);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    char p[1100];
    snprintf(p, sizeof p, "%s/drain", dir);
    FILE *f = fopen(p, "r");
    int failed = 8, late = 0, whole = 0;
    if (!f || fscanf(f, "%d %d", &failed, &late) != 2) failed = 8;
    if (f) fclose(f);
    for (int c = 1; c <= 8; c++) {
        snprintf(p, sizeof p, "%s/drain%d", dir, c);
        FILE *d = fopen(p, "r");
        char line[4096];
        int done = 0;
        while (d && fgets(line, sizeof line, d))
            done |= !strncmp(line, "data: [DONE]", 12);
        if (d) fclose(d);
        whole += done;
    }
    printf("drain on SIGTERM with 8 streams in flight: %d of 8 ended with [DONE], %d curl failures, a new request got %d, "
           "server exit %d (%.1f s after the streams)\n", whole, failed, late, rc, bench_now() - t0);
    return whole == 8 && failed == 0 && late == 503 && rc == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    int n = 16, n_threads = 2, soak_s = 15, ttft_only = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n")) n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) n_threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--soak")) soak_s = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ttft-only")) ttft_only = atoi(argv[i + 1]);
    }
    char *dir = bench_tmpdir(), model[1024];
    uint32_t type;
    if (!dir || mkg_parse_type("Q4_K", &type) || bench_make_model(dir, "serve", "llama-1b", type, 2, model, sizeof model))
        return 1;
    printf("model llama-1b shape, 2 layers, Q4_K; %d tokens per request, --parallel 8, -t %d\n", n, n_threads);
    char half[32];
    snprintf(half, sizeof half, "%llu", (unsigned long long)bench_file_size(model) / 2);
    const char *budgets[] = {"0", half};
    int rc = 0;
    double tt[2] = {0, 0};
    long tk[2] = {-1, -1};
    if (ttft(model, n_threads, dir, tt, tk) || tk[1] <= 0) {
        fprintf(stderr, "bench_serve: the prefix-cache TTFT runs failed (see %s/t2.out)\n", dir);
        return 1;
    }
    printf("chat turn after a %ld-token history, 1 token: %.3f s with the prefix cache (%ld tokens reused), %.3f s "
           "without: %.1fx\n", tk[0], tt[0], tk[1], tt[1], tt[1] / tt[0]);
    if (ttft_only) {
        bench_rmrf(dir);
        free(dir);
        return 0;
    }
    for (int b = 0; b < 2 && !rc; b++) {
        pid_t pid;
        int port = start_server(model, n_threads, budgets[b], &pid);
        if (port <= 0) {
            fprintf(stderr, "bench_serve: the server did not start (JLM_BIN set?)\n");
            rc = 1;
            break;
        }
        printf("-- budget %s\n", b ? "half the container (block pages are read again every step)" : "unlimited (resident)");
        rc = table(port, pid, n) ? 1 : 0;
        if (!rc && b == 0 && soak_s > 0 && soak(port, pid, soak_s, dir)) {
            fprintf(stderr, "bench_serve: the soak had failed requests\n");
            rc = 1;
        }
        if (!rc && b == 0 && soak_s > 0) {
            if (drain(port, pid, dir)) {
                fprintf(stderr, "bench_serve: the drain on SIGTERM was not clean\n");
                rc = 1;
            }
        } else if (stop_server(pid) != 0 && !rc) {
            fprintf(stderr, "bench_serve: the server did not exit 0 on SIGTERM\n");
            rc = 1;
        }
    }
    /* two models, one budget of one container */
    char mdir[1100], cmd[8192];
    snprintf(mdir, sizeof mdir, "%s/models", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s %s/a.jlm && cp %s %s/b.jlm", mdir, model, mdir, model, mdir);
    if (!rc && system(cmd) != 0)
        rc = 1;
    char one[32];
    snprintf(one, sizeof one, "%llu", (unsigned long long)bench_file_size(model));
    const char *two_budgets[] = {"0", one};
    double alt[2] = {0}, both[2] = {0}, taken = 0, ins = 0;
    for (int b = 0; b < 2 && !rc; b++) {
        pid_t pid;
        int port = start_server(mdir, n_threads, two_budgets[b], &pid);
        if (port <= 0 || two_models(port, n, &alt[b], &both[b])) {
            fprintf(stderr, "bench_serve: two models: the server did not start or a request failed\n");
            rc = 1;
        }
        if (!rc && b == 1) {
            taken = metric_sum(port, "jlm_budget_reclaims_total");
            ins = metric_sum(port, "jlm_page_ins_total");
        }
        if (port > 0 && stop_server(pid) != 0 && !rc) {
            fprintf(stderr, "bench_serve: the server did not exit 0 on SIGTERM\n");
            rc = 1;
        }
    }
    if (!rc) {
        printf("-- two models, one --budget of one container (half their sum) vs both unlimited\n");
        printf("%-24s %10s %10s %10s\n", "", "unlimited", "budget", "ratio");
        printf("%-24s %10.1f %10.1f %10.2f\n", "alternating a,b (t/s)", alt[0], alt[1], alt[0] > 0 ? alt[1] / alt[0] : 0);
        printf("%-24s %10.1f %10.1f %10.2f\n", "4 + 4 at once (t/s)", both[0], both[1], both[0] > 0 ? both[1] / both[0] : 0);
        printf("frames taken from the other model: %.0f times; page-ins (both models) %.0f\n", taken, ins);
    }
    bench_rmrf(dir);
    free(dir);
    return rc;
}
