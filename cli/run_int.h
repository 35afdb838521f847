/* run_int.h - the state of one `jlm run`, shared by cmd_run.c (options, the
 * prompt, generation) and run_out.c (what it prints: ids, --json, --stats).
 * Single-threaded. */
#ifndef JLM_CLI_RUN_INT_H
#define JLM_CLI_RUN_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "cli/outfile.h"
#include "engine/sampler.h"
#include "prompt/session.h"
#include "text/grammar/grammar.h"

typedef struct run_opts {
    const char *model, *prompt, *prompt_file, *logits_file, *ids, *image, *system, *grammar, *json_schema, *pooling;
    const char *trace_file;   /* --trace-routing */
    const char *warm_from;    /* --warm-from: a trace whose routing orders the background read */
    int n_predict, stats, print_ids, json, chat, embeddings;
    jlm_engine_opts eng;
    jlm_samp_params samp;
} run_opts;

/* `--grammar FILE` / `--json-schema FILE` (grammar_opt.c): the compiled
 * grammar, the vocab trie and a matcher at the start. */
typedef struct jlm_cli_gram {
    jlm_gram       *g;
    jlm_gram_vocab *v;
    jlm_gram_match *m;
} jlm_cli_gram;

typedef struct run {
    run_opts     o;
    const char  *given;        /* the model as given (--json names it so, not its cache entry) */
    const char  *inputs[3];    /* what --logits may not overwrite: the model as given, resolved, its container */
    jlm_session *s;
    char        *text;         /* -f / -p -: the prompt read */
    char        *rendered;     /* --chat: the prompt through the template */
    int32_t     *prompt, *gen;
    size_t       np, ng;
    char        *out_text;     /* the generated text (kept for --json and the last byte) */
    char         tail[4];      /* the stream's held-back bytes, flushed at the end */
    size_t       n_tail;
    int          ctx_cut;      /* -n went past the context: stopped there */
    double       t0, t1, t2;   /* prefill start, decode start, end */
    uint64_t     wait1_ns;     /* the pager's read waits at t1 (jlm_cli_run_wait_ns) */
    jlm_cli_gram gram;         /* --grammar / --json-schema; zeroed: none */
    jlm_cli_out  trace;        /* --trace-routing's file while the engine writes it (trace.f NULL: none) */
} run;

/* Loads at most one of the two files (both NULL: *out zeroed, 0). Prints one
 * line naming the file and the reason and returns 1 on error. */
int  jlm_cli_gram_load(const char *who, const char *grammar_file, const char *schema_file, const jlm_tok *tok,
                       jlm_cli_gram *out);
void jlm_cli_gram_free(jlm_cli_gram *c);   /* a zeroed one is fine */

/* --print-ids or --json on stdout; 0 or 1 after a line. */
int  jlm_cli_run_print(run *r);
/* The engine thread's time blocked on reads so far, every array: its own
 * reads and its waits for the reader threads' (read_ns + pf_wait_ns). */
uint64_t jlm_cli_run_wait_ns(const run *r);
/* --stats' lines on stderr. */
void jlm_cli_run_stats(const run *r);

#endif
