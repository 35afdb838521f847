/* opts.c - the table-driven option parser of opts.h. */
#include "cli/opts.h"
#include "cli/backend.h"
#include "cli/cli.h"
#include "format/jlm_format.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int jlm_opts_strict_ll(const char *v, long long *out)
{
    char *end;
    if (!v || !*v || strchr(" \t\n", *v))
        return -1;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end)
        return -1;
    *out = x;
    return 0;
}

int jlm_opts_strict_double(const char *v, double *out)
{
    char *end;
    if (!v || !*v || strchr(" \t\n", *v))
        return -1;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || !isfinite(x))
        return -1;
    *out = x;
    return 0;
}

static int bad(const jlm_opts_spec *s, const char *name, const char *v, const char *want)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s '%s': expected %s (see --help)", name, v, want);
    jlm_cli_error(s->who, msg);
    return 2;
}

/* "an integer in [0, 16777216]": integers name both ends (a value over a large
 * maximum was told only ">= 0"); numbers with a maximum of 1e6 or more only
 * their minimum. */
static void range_text(const jlm_opt *o, char *buf, size_t n, const char *what)
{
    const char *lo_op = o->flags & JLM_OPT_LO_OPEN ? ">" : ">=";
    if (o->kind == JLM_OPT_INT || o->kind == JLM_OPT_U32)
        snprintf(buf, n, "%s in %s%.0f, %.0f]", what, o->flags & JLM_OPT_LO_OPEN ? "(" : "[", o->lo, o->hi);
    else if (o->hi >= 1e6)
        snprintf(buf, n, "%s %s %g", what, lo_op, o->lo);
    else
        snprintf(buf, n, "%s in %s%g, %g]", what, o->flags & JLM_OPT_LO_OPEN ? "(" : "[", o->lo, o->hi);
}

static int in_range(const jlm_opt *o, double x)
{
    int lo_ok = o->flags & JLM_OPT_LO_OPEN ? x > o->lo : x >= o->lo;
    return lo_ok && x <= o->hi;
}

static int set_value(const jlm_opts_spec *s, const jlm_opt *o, const char *name, const char *v)
{
    char want[96];
    long long i;
    double d;
    switch (o->kind) {
    case JLM_OPT_STR: *(const char **)o->dst = v; return 0;
    case JLM_OPT_FLAG: return 0;
    case JLM_OPT_INT:
    case JLM_OPT_U32:
        range_text(o, want, sizeof want, "an integer");
        if (jlm_opts_strict_ll(v, &i) || !in_range(o, (double)i))
            return bad(s, name, v, want);
        if (o->kind == JLM_OPT_INT) *(int *)o->dst = (int)i;
        else *(uint32_t *)o->dst = (uint32_t)i;
        return 0;
    case JLM_OPT_F32: {
        range_text(o, want, sizeof want, "a number");
        if (jlm_opts_strict_double(v, &d) || !in_range(o, d))
            return bad(s, name, v, want);
        /* the range holds for the value stored: 3e-83 is in (0, 1e6] but
         * is 0 as a float, and a repeat penalty of 0 divides by zero */
        float f = (float)d;
        if (!in_range(o, (double)f)) {
            char w2[160];
            snprintf(w2, sizeof w2, "%s (it is %g as a 32-bit float)", want, (double)f);
            return bad(s, name, v, w2);
        }
        *(float *)o->dst = f;
        return 0;
    }
    case JLM_OPT_SIZE: {
        long long b = jlm_cli_parse_size(v);
        if (b < 0)
            return bad(s, name, v, "bytes with an optional K/M/G suffix");
        if (o->hi > 0 && !in_range(o, (double)b)) {   /* hi 0: no range */
            snprintf(want, sizeof want, "bytes in [%.0f, %.0f] (K/M/G suffix allowed)", o->lo, o->hi);
            return bad(s, name, v, want);
        }
        *(uint64_t *)o->dst = (uint64_t)b;
        return 0;
    }
    case JLM_OPT_SEED:
        if (jlm_opts_strict_ll(v, &i) || i < -1 || i > 0xffffffffLL)
            return bad(s, name, v, "an unsigned 32-bit seed, or -1 for a random one");
        *(uint64_t *)o->dst = i == -1 ? jlm_cli_random_seed() : (uint64_t)i;
        return 0;
    }
    return 2;
}

/* Other names users type for an option, from llama.cpp's tools. */
static const struct { const char *alias, *name; } ALIASES[] = {
    {"--n-gpu-layers", "--gpu-layers"},
};

static const jlm_opt *find(const jlm_opts_spec *s, const char *a)
{
    for (size_t k = 0; k < sizeof ALIASES / sizeof ALIASES[0]; k++)
        if (!strcmp(a, ALIASES[k].alias))
            a = ALIASES[k].name;
    for (int k = 0; k < s->n_opts; k++) {
        const jlm_opt *o = &s->opts[k];
        if ((o->shrt && !strcmp(a, o->shrt)) || (o->lng && !strcmp(a, o->lng)))
            return o;
    }
    return NULL;
}

static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return 1;
    return 0;
}

static int one_arg(jlm_opts_spec *s, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    const jlm_opt *o = a[0] == '-' && a[1] ? find(s, a) : NULL;
    if (!o && a[0] == '-' && a[1]) {
        char msg[300];
        snprintf(msg, sizeof msg, "unknown option '%s' (see --help)", a);
        jlm_cli_error(s->who, msg);
        return 2;
    }
    if (!o) {
        if (s->n_pos >= s->max_pos)
            return bad(s, "argument", a, "no more arguments");
        s->pos[s->n_pos++] = a;
        return 0;
    }
    if (o->kind == JLM_OPT_FLAG) {
        *(int *)o->dst = o->flags & JLM_OPT_CLEARS ? 0 : 1;
        return 0;
    }
    if (*i + 1 >= argc) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s: missing value (see --help)", a);
        jlm_cli_error(s->who, msg);
        return 2;
    }
    return set_value(s, o, a, argv[++*i]);
}

int jlm_opts_parse(jlm_opts_spec *s, int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        jlm_opts_help(stdout, s);
        return 1;
    }
    s->n_pos = 0;
    for (int i = 1; i < argc; i++) {
        int rc = one_arg(s, argc, argv, &i);
        if (rc)
            return rc;
    }
    return 0;
}

static void print_default(FILE *f, const jlm_opt *o)
{
    switch (o->kind) {
    case JLM_OPT_STR:
        if (*(const char **)o->dst) fprintf(f, " (default: %s)", *(const char **)o->dst);
        break;
    /* a default outside the range is an "unset" the help text itself explains (-t: all cores) */
    case JLM_OPT_INT:
        if (in_range(o, *(int *)o->dst)) fprintf(f, " (default: %d)", *(int *)o->dst);
        break;
    case JLM_OPT_U32:
        if (in_range(o, *(uint32_t *)o->dst)) fprintf(f, " (default: %u)", *(uint32_t *)o->dst);
        break;
    case JLM_OPT_F32: fprintf(f, " (default: %g)", (double)*(float *)o->dst); break;
    case JLM_OPT_SIZE:   /* UINT64_MAX: the engine's JLM_BUDGET_AUTO (no typed size reaches it) */
        if (*(uint64_t *)o->dst == UINT64_MAX) fprintf(f, " (default: auto)");
        else fprintf(f, " (default: %llu)", (unsigned long long)*(uint64_t *)o->dst);
        break;
    case JLM_OPT_SEED:   /* JLM_CLI_SEED_UNSET: drawn at random after parsing */
        if (*(uint64_t *)o->dst == JLM_CLI_SEED_UNSET) fprintf(f, " (default: random)");
        else fprintf(f, " (default: %llu)", (unsigned long long)*(uint64_t *)o->dst);
        break;
    case JLM_OPT_FLAG: break;
    }
}

void jlm_opts_help(FILE *f, const jlm_opts_spec *s)
{
    fprintf(f, "usage: %s %s\n\noptions:\n", s->who, s->usage);
    for (int k = 0; k < s->n_opts; k++) {
        const jlm_opt *o = &s->opts[k];
        char names[64];
        snprintf(names, sizeof names, "%s%s%s %s", o->shrt ? o->shrt : "", o->shrt && o->lng ? ", " : "",
                 o->lng ? o->lng : "", o->meta ? o->meta : "");
        fprintf(f, "  %-28s %s", names, o->help);
        print_default(f, o);
        fputc('\n', f);
    }
    fprintf(f, "  %-28s %s\n", "-h, --help", "this help");
}

static char *read_fail(const char *who, const char *opt, const char *path, const char *why, FILE *f, char *buf)
{
    jlm_cli_errorf(who, "%s %s: %s", opt, strcmp(path, "-") ? path : "stdin", why);
    if (f && f != stdin)
        fclose(f);
    free(buf);
    return NULL;
}

char *jlm_opts_read_text(const char *who, const char *opt, const char *path, size_t max)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return read_fail(who, opt, path, strerror(errno), NULL, NULL);
    char big[96];
    snprintf(big, sizeof big, "larger than %zu MiB, the most it may hold", max >> 20);
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > max)
        return read_fail(who, opt, path, big, f, NULL);   /* refused unread */
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap), *nb;
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n > max)
            return read_fail(who, opt, path, big, f, buf);
        if (n < cap - 1)
            break;
        size_t ncap = cap * 2 > max + 2 ? max + 2 : cap * 2;   /* room for max + 1 bytes and the NUL */
        if (!(nb = realloc(buf, cap = ncap)))
            return read_fail(who, opt, path, "out of memory", f, buf);
        buf = nb;
    }
    if (!buf || ferror(f))
        return read_fail(who, opt, path, buf ? "read failed" : "out of memory", f, buf);
    if (f != stdin)
        fclose(f);
    buf[n] = 0;
    return buf;
}

int jlm_opts_engine_rows(jlm_opt *t, unsigned which, jlm_engine_opts *eo, jlm_opts_gpu *gpu)
{
    int n = 0;
    if (which & JLM_ROWS_CTX)
        t[n++] = (jlm_opt){"-c", "--ctx-size", JLM_OPT_U32, &eo->n_ctx, 0, JLM_ENGINE_MAX_CTX, 0, "N", "context size, 0: the model's"};
    if (which & JLM_ROWS_THREADS)
        t[n++] = (jlm_opt){"-t", "--threads", JLM_OPT_INT, &eo->n_threads, 1, 1024, 0, "N", "threads (default: all cores)"};
    if (which & JLM_ROWS_BUDGET)
        t[n++] = (jlm_opt){NULL, "--budget", JLM_OPT_SIZE, &eo->budget, 0, 0, 0, "SIZE",
                           "memory budget: frames + KV + scratch (K/M/G), 0: unlimited; default: the cgroup limit or "
                           "MemAvailable less a headroom"};
    if (which & JLM_ROWS_KV) {
        if (!eo->kv)
            eo->kv = "auto";   /* llama.cpp's default, where its tolerance is shown (docs/engine.md) */
        t[n++] = (jlm_opt){NULL, "--kv", JLM_OPT_STR, &eo->kv, 0, 0, 0, "auto|f32|f16|q8_0",
                           "KV cache type of keys and values (auto: f16, f32 for latent attention; "
                           "f16: half the memory of f32, q8_0: 0.27 of it)"};
        t[n++] = (jlm_opt){"-ctk", "--cache-type-k", JLM_OPT_STR, &eo->kv_k, 0, 0, 0, "f32|f16|q8_0",
                           "the keys' cache type (over --kv)"};
        t[n++] = (jlm_opt){"-ctv", "--cache-type-v", JLM_OPT_STR, &eo->kv_v, 0, 0, 0, "f32|f16|q8_0",
                           "the values' cache type (over --kv)"};
    }
    if (which & JLM_ROWS_PAGING) {
        t[n++] = (jlm_opt){NULL, "--no-direct", JLM_OPT_FLAG, &eo->direct, 0, 0, JLM_OPT_CLEARS, NULL,
                           "page weights through the page cache"};
        t[n++] = (jlm_opt){NULL, "--no-prefetch", JLM_OPT_FLAG, &eo->no_prefetch, 0, 0, 0, NULL,
                           "no read of the next block while one computes"};
        t[n++] = (jlm_opt){NULL, "--read-depth", JLM_OPT_U32, &eo->read_depth, 1, 16, 0, "N",
                           "pages read at once (a block's routed experts; default 8); 1: one at a time"};
        t[n++] = (jlm_opt){NULL, "--no-predict", JLM_OPT_FLAG, &eo->no_predict, 0, 0, 0, NULL,
                           "no read ahead of the next MoE block's predicted experts"};
        t[n++] = (jlm_opt){NULL, "--no-warm", JLM_OPT_FLAG, &eo->no_warm, 0, 0, 0, NULL,
                           "no background read of the model's pages (all of them when the budget holds them, else into free frames)"};
        t[n++] = (jlm_opt){NULL, "--whole-blocks", JLM_OPT_FLAG, &eo->whole_blocks, 0, 0, 0, NULL,
                           "under a budget, hold a block's whole page while it computes (default: op by op, "
                           "releasing each op's weights)"};
        t[n++] = (jlm_opt){NULL, "--expert-policy", JLM_OPT_STR, &eo->expert_policy, 0, 0, 0, "auto|lfu|lru|next",
                           "which cached expert is evicted first: the lowest decaying use count (lfu; half-life one "
                           "get per expert page of the model), the least recently used (lru), the one whose next use "
                           "is expected last from its count and its block's place in the cycle (next), or by "
                           "whichever of lfu at six half-lives and next would have read least lately (auto, default)"};
        t[n++] = (jlm_opt){NULL, "--verify", JLM_OPT_FLAG, &eo->verify, 0, 0, 0, NULL,
                           "check every page against MODEL.sums on its first read; refuse without one "
                           "(default: checked when MODEL.sums exists)"};
        t[n++] = (jlm_opt){NULL, "--no-verify", JLM_OPT_FLAG, &eo->no_verify, 0, 0, 0, NULL,
                           "no page checksums"};
    }
    if (which & JLM_ROWS_BACKEND) {
        t[n++] = (jlm_opt){NULL, "--backend", JLM_OPT_STR, &eo->backend, 0, 0, 0, "NAME[,NAME]",
                           "cpu (default), vulkan, cuda or auto; two devices in block order: cuda,vulkan or "
                           "vulkan,cuda (the rest of the blocks on the CPU)"};
        t[n++] = (jlm_opt){NULL, "--device", JLM_OPT_STR, &eo->device, 0, 0, 0, "N|NAME[,..]",
                           "the backend's device: index or name; one per backend, in its order"};
        t[n++] = (jlm_opt){"-ngl", "--gpu-layers", JLM_OPT_STR, &gpu->layers, 0, 0, 0, "N|all[,M|all]",
                           "blocks 0..N-1 on the device, the rest on the CPU; two devices: N on the first, the "
                           "next M on the second (all: every remaining block and the output); without --backend: "
                           "auto (llama.cpp's -ngl, --n-gpu-layers)"};
        t[n++] = (jlm_opt){NULL, "--gpu-budget", JLM_OPT_STR, &gpu->budget, 0, 0, 0, "SIZE[,SIZE]",
                           "bytes of device page frames (K/M/G), one per device; default: 3/4 of device memory "
                           "(upload path) or the host's frames (import path)"};
    }
    if (n > JLM_OPTS_ENGINE_MAX) {   /* a row added without raising the bound: the callers' tables overflowed */
        fprintf(stderr, "jlm: internal error: %d engine option rows, JLM_OPTS_ENGINE_MAX is %d\n", n,
                JLM_OPTS_ENGINE_MAX);
        abort();
    }
    return n;
}

int jlm_opts_sampler_rows(jlm_opt *t, jlm_samp_params *sp)
{
    int n = 0;
    t[n++] = (jlm_opt){NULL, "--temp", JLM_OPT_F32, &sp->temp, 0, 1e6, 0, "T", "temperature, 0: greedy"};
    t[n++] = (jlm_opt){NULL, "--top-k", JLM_OPT_INT, &sp->top_k, 0, 1 << 30, 0, "K", "top-k, 0: off"};
    t[n++] = (jlm_opt){NULL, "--top-p", JLM_OPT_F32, &sp->top_p, 0, 1, 0, "P", "top-p, 1: off"};
    t[n++] = (jlm_opt){NULL, "--min-p", JLM_OPT_F32, &sp->min_p, 0, 1, 0, "P", "min-p, 0: off"};
    t[n++] = (jlm_opt){NULL, "--repeat-penalty", JLM_OPT_F32, &sp->repeat_penalty, 0, 1e6, JLM_OPT_LO_OPEN, "R",
                       "repeat penalty, 1: off"};
    t[n++] = (jlm_opt){NULL, "--repeat-last-n", JLM_OPT_INT, &sp->repeat_last_n, -1, 1 << 30, 0, "N",
                       "tokens the penalty looks back, -1: context"};
    t[n++] = (jlm_opt){"-s", "--seed", JLM_OPT_SEED, &sp->seed, 0, 0, 0, "S",
                       "sampler seed (u32, -1: random; run prints the one drawn with its stats and JSON)"};
    return n;
}

int jlm_opts_cat(jlm_opt *t, int k, const jlm_opt *rows, int n)
{
    memcpy(t + k, rows, (size_t)n * sizeof *rows);
    return k + n;
}

/* Entry i of a comma list into buf (NUL-terminated); 0, or -1 when it does
 * not fit. *next: the rest after its comma, NULL after the last entry. */
static int list_entry(const char *v, char *buf, size_t cap, const char **next)
{
    size_t n = strcspn(v, ",");
    *next = v[n] ? v + n + 1 : NULL;
    if (n >= cap)
        return -1;
    memcpy(buf, v, n);
    buf[n] = 0;
    return 0;
}

static int list_error(const char *who, const char *opt, const char *v, const char *why)
{
    jlm_cli_errorf(who, "%s '%.80s': %s", opt, v, why);
    return 2;
}

/* Entry i of opt's list (all; *v the rest, advanced) into buf, for at most
 * max devices: 0 (*bad: it does not fit buf), or 2 after one line when the
 * list has more entries than devices. */
static int list_next(const char *who, const char *opt, const char *all, int i, int max, const char **v, char *buf,
                     size_t cap, int *bad)
{
    if (i == max)
        return list_error(who, opt, all, max == 1 ? "one value for one device (a list needs two device backends: "
                          "--backend cuda,vulkan)" : "more values than the two devices");
    *bad = list_entry(*v, buf, cap, v);
    return 0;
}

/* --gpu-layers for n_dev devices into eo: one value as before (a count >= 1
 * or 'all'); two devices: N (the second takes all the rest), N,M or N,all,
 * the first a count. 0, or 2 after one line. */
static int gpu_layers_list(const char *who, const char *v, int n_dev, jlm_engine_opts *eo)
{
    uint32_t *dst[JLM_ENGINE_DEVS] = {&eo->gpu_layers, &eo->gpu_layers2};
    const char *all = v;
    int max = n_dev > 1 ? n_dev : 1;
    if (!v && n_dev > 1)
        return jlm_cli_errorf(who, "--gpu-layers: two device backends need the first one's block count "
                                   "(--gpu-layers N, N,M or N,all)"), 2;
    for (int i = 0; v; i++) {
        char e[32];
        long long c;
        int bad;
        if (list_next(who, "--gpu-layers", all, i, max, &v, e, sizeof e, &bad))
            return 2;
        if (!bad && !strcmp(e, "all") && i + 1 < n_dev)
            return list_error(who, "--gpu-layers", all, "'all' on the first device leaves none to the second: "
                              "give it a count (N,M or N,all)");
        if (!bad && !strcmp(e, "all"))
            *dst[i] = 0;
        else if (bad || jlm_opts_strict_ll(e, &c) || c < 1 || c > 1 << 20)
            return list_error(who, "--gpu-layers", all, "expected a count >= 1 or 'all' (no layers: --backend cpu)");
        else
            *dst[i] = (uint32_t)c;
    }
    return 0;
}

/* --gpu-budget for n_dev devices into eo: one size per device (fewer: the
 * rest take their default). 0, or 2 after one line. */
static int gpu_budget_list(const char *who, const char *v, int n_dev, jlm_engine_opts *eo)
{
    uint64_t *dst[JLM_ENGINE_DEVS] = {&eo->gpu_budget, &eo->gpu_budget2};
    const char *all = v;
    int max = n_dev > 1 ? n_dev : 1;
    for (int i = 0; v; i++) {
        char e[64];
        int bad;
        if (list_next(who, "--gpu-budget", all, i, max, &v, e, sizeof e, &bad))
            return 2;
        long long b = bad ? -1 : jlm_cli_parse_size(e);
        if (b < 0)
            return list_error(who, "--gpu-budget", all, "expected bytes with an optional K/M/G suffix (see --help)");
        *dst[i] = (uint64_t)b;
    }
    return 0;
}

int jlm_opts_engine_finish(const char *who, jlm_engine_opts *eo, const jlm_opts_gpu *gpu)
{
    static const jlm_opts_gpu none = {0};
    jlm_engine_split sp;
    jlm_err err = {0};
    if (!gpu)
        gpu = &none;
    if (gpu->layers && !eo->backend)   /* -ngl N as in llama.cpp: on a GPU when there is one */
        eo->backend = "auto";
    if (jlm_engine_split_parse(eo->backend, eo->device, &sp, &err) || jlm_engine_kv_check(eo, &err))
        return jlm_cli_error(who, err.msg), 2;
    if (gpu_layers_list(who, gpu->layers, sp.n, eo) || gpu_budget_list(who, gpu->budget, sp.n, eo))
        return 2;
    const char *cmd = !strncmp(who, "jlm ", 4) ? who + 4 : who;
    for (int i = 0; i < sp.n; i++) {   /* one line and 1 for a device backend that cannot run here */
        int rc = jlm_cli_backend_check(cmd, sp.is_auto ? "auto" : sp.kind[i], atoi(sp.device[i]));
        if (rc)
            return rc;
    }
    return 0;
}

void jlm_opts_version(const char *prog)
{
    printf("%s version %s (.jlm format %u)\n", prog, JLM_CLI_VERSION, (unsigned)JLM_VERSION);
}
