/* opts.h - one table-driven option parser behind every `jlm` subcommand.
 * Numbers are strict (the whole string, no overflow, NaN/Inf refused, a
 * range per option); a bad value is one line naming the option and exit 2.
 * `--help` / `-h` is generated from the same table, with defaults. */
#ifndef JLM_CLI_OPTS_H
#define JLM_CLI_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "engine/model.h"
#include "engine/sampler.h"

typedef enum jlm_opt_kind {
    JLM_OPT_FLAG, /* int = 1 (0 with JLM_OPT_CLEARS: a "--no-x" flag) */
    JLM_OPT_STR,  /* const char * */
    JLM_OPT_INT,  /* int in [lo, hi] */
    JLM_OPT_U32,  /* uint32_t in [lo, hi] */
    JLM_OPT_F32,  /* float in [lo, hi], finite; JLM_OPT_LO_OPEN makes lo exclusive */
    JLM_OPT_SIZE, /* uint64_t bytes, "512M"; in [lo, hi] when hi > 0 */
    JLM_OPT_SEED, /* uint64_t: a u32, or -1 for a random one (jlm_cli_random_seed) */
} jlm_opt_kind;

enum {
    JLM_OPT_LO_OPEN = 1,
    JLM_OPT_CLEARS = 2,   /* a FLAG that sets 0 */
    JLM_OPT_OUT = 4,      /* a STR naming a path the command writes: through cli/outfile.h (tests list them all) */
};

typedef struct jlm_opt {
    const char *shrt, *lng; /* either may be NULL */
    jlm_opt_kind kind;
    void *dst;
    double lo, hi;
    unsigned flags;
    const char *meta, *help;
} jlm_opt;

typedef struct jlm_opts_spec {
    const char *who;   /* "jlm run" */
    const char *usage; /* "MODEL -p PROMPT [options]" */
    const jlm_opt *opts;
    int n_opts;
    const char **pos;  /* positional arguments go here */
    int max_pos, n_pos;
} jlm_opts_spec;

/* Rows several subcommands share, defined once here (the same names, ranges
 * and help everywhere). jlm_opts_engine_rows writes the rows named by which
 * (JLM_ROWS_*) for eo at t and returns how many (at most JLM_OPTS_ENGINE_MAX);
 * gpu receives --gpu-layers' and --gpu-budget's text (JLM_ROWS_BACKEND:
 * comma lists, one entry per device of --backend), turned into eo's
 * gpu_layers, gpu_budget (and the second device's) by jlm_opts_engine_finish. jlm_opts_sampler_rows writes the
 * sampler's rows for sp (JLM_OPTS_SAMPLER_MAX). jlm_opts_cat copies n rows to
 * t + k and returns k + n. */
enum {
    JLM_ROWS_CTX = 1,      /* -c, --ctx-size */
    JLM_ROWS_THREADS = 2,  /* -t, --threads */
    JLM_ROWS_BUDGET = 4,   /* --budget: the engine's memory budget */
    JLM_ROWS_KV = 8,       /* --kv, -ctk/--cache-type-k, -ctv/--cache-type-v: f32|f16|q8_0 */
    JLM_ROWS_PAGING = 16,  /* --no-direct, --no-prefetch, --read-depth, --no-predict, --no-warm, --whole-blocks, --expert-policy, --verify, --no-verify */
    JLM_ROWS_BACKEND = 32, /* --backend, --device, --gpu-layers, --gpu-budget */
};
#define JLM_OPTS_ENGINE_MAX 19
#define JLM_OPTS_SAMPLER_MAX 7
typedef struct jlm_opts_gpu { const char *layers, *budget; } jlm_opts_gpu;   /* as typed; NULL: not given */
int jlm_opts_engine_rows(jlm_opt *t, unsigned which, jlm_engine_opts *eo, jlm_opts_gpu *gpu);
int jlm_opts_sampler_rows(jlm_opt *t, jlm_samp_params *sp);
int jlm_opts_cat(jlm_opt *t, int k, const jlm_opt *rows, int n);
/* After parsing: --backend and --device as lists (jlm_engine_split_parse),
 * --gpu-layers (NULL, "all" or a count >= 1; two devices: N, N,M or N,all)
 * and --gpu-budget (a size per device) into eo, the KV cache types' names
 * (jlm_engine_kv_check), then the backend check of
 * each device (cli/backend.h). gpu may be NULL (no such rows). 0, or the
 * exit status after one line on stderr (2: a malformed value or list). */
int jlm_opts_engine_finish(const char *who, jlm_engine_opts *eo, const jlm_opts_gpu *gpu);

/* Parses argv[1..argc). Returns 0, 2 after printing one line (bad value,
 * unknown option, too many positionals), or 1 after printing --help to
 * stdout (the caller then exits 0). */
int jlm_opts_parse(jlm_opts_spec *s, int argc, char **argv);
/* The generated help, defaults from the current destinations. */
void jlm_opts_help(FILE *f, const jlm_opts_spec *s);
/* Strict numbers; 0 ok, -1 bad. */
int jlm_opts_strict_ll(const char *v, long long *out);
int jlm_opts_strict_double(const char *v, double *out);
/* The whole of path ("-": stdin), NUL-terminated, malloc'd, at most max
 * bytes: a longer input (/dev/zero) is refused once max + 1 bytes are read,
 * so memory stays near max. NULL after one line "who: OPT PATH: reason". */
#define JLM_CLI_PROMPT_MAX   (16u << 20)   /* -f, -p -, --messages: 16 MiB */
#define JLM_CLI_TEMPLATE_MAX (1u << 20)    /* --template: 1 MiB (real chat templates are a few KiB) */
char *jlm_opts_read_text(const char *who, const char *opt, const char *path, size_t max);
/* `jlm --version` / `jlmfs --version`: the program and the .jlm format it writes. */
#define JLM_CLI_VERSION "0.15"
void jlm_opts_version(const char *prog);

#endif
