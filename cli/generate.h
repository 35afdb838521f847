/* generate.h - the one sample / accept / stream / eval loop of `jlm run` and
 * `jlm chat`. Single-threaded; owns nothing it is given. */
#ifndef JLM_CLI_GENERATE_H
#define JLM_CLI_GENERATE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/report.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "text/tokenizer/tokenizer.h"

typedef struct jlm_cli_gen {
    jlm_engine     *e;
    jlm_tok        *tok;
    jlm_sampler    *s;
    float          *logits;     /* in: the logits after the prompt; overwritten */
    jlm_cli_report *rep;        /* flushed after every evaluation (never-opened is fine) */
    jlm_tok_stream *ts;         /* the caller's stream (its leading-space rule) */
    int             n_max;      /* tokens to sample at most */
    int             print;      /* 1: write each completed piece to stdout, flushed */
    int             eval_eog;   /* 1: evaluate an end-of-generation token too (chat keeps the turn's end in the cache) */
    int             fix_utf8;   /* 1: invalid UTF-8 in a piece becomes U+FFFD, printed and kept (chat) */
    int             eval_last;  /* 1: evaluate the n_max-th token too (chat); 0: stop before (run) */
    int             ignore_eos; /* 1: end-of-generation tokens are never sampled (llama.cpp's --ignore-eos) */
    volatile sig_atomic_t *stop; /* non-NULL: checked before each token; set (SIGINT) ends the loop, rc 0 */
} jlm_cli_gen;

/* Samples up to g->n_max tokens, stopping after an end-of-generation token.
 * Every sampled id is accepted by the sampler and, if ids is non-NULL, stored
 * in ids[*n_ids] (room for n_max). With text non-NULL the streamed text is
 * returned malloc'd and NUL-terminated (also on error). The held-back bytes of
 * an incomplete UTF-8 sequence stay in g->ts for the caller to flush.
 * Returns 0, JLM_ENOMEM, or the engine's error (the ids sampled before stay). */
int jlm_cli_generate(const jlm_cli_gen *g, int32_t *ids, size_t *n_ids, char **text, jlm_err *err);

#endif
