/* run_int.h - the state of one `jlm run`, shared by cmd_run.c (options, the
 * prompt, generation) and run_out.c (what it prints: ids, --json, --stats).
 * Single-threaded. */
#ifndef JLM_CLI_RUN_INT_H
#define JLM_CLI_RUN_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "engine/sampler.h"
#include "prompt/session.h"

typedef struct run_opts {
    const char *model, *prompt, *prompt_file, *logits_file, *ids, *image, *system;
    int n_predict, stats, print_ids, json, chat;
    jlm_engine_opts eng;
    jlm_samp_params samp;
} run_opts;

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
} run;

/* --print-ids or --json on stdout; 0 or 1 after a line. */
int  jlm_cli_run_print(run *r);
/* --stats' lines on stderr. */
void jlm_cli_run_stats(const run *r);

#endif
