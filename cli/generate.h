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
#include "text/grammar/grammar.h"
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
    jlm_gram_match *gram;       /* non-NULL: every token is masked to the grammar and advances it */
    const jlm_gram_vocab *gram_vocab; /* the tokenizer's trie (with gram) */
} jlm_cli_gen;

/* `--grammar FILE` / `--json-schema FILE` (grammar_opt.c): the compiled
 * grammar, the vocab trie and a matcher at the start. */
typedef struct jlm_cli_gram {
    jlm_gram       *g;
    jlm_gram_vocab *v;
    jlm_gram_match *m;
} jlm_cli_gram;

/* Loads at most one of the two files (both NULL: *out zeroed, 0). Prints one
 * line naming the file and the reason and returns 1 on error. */
int  jlm_cli_gram_load(const char *who, const char *grammar_file, const char *schema_file, const jlm_tok *tok,
                       jlm_cli_gram *out);
void jlm_cli_gram_free(jlm_cli_gram *c);   /* a zeroed one is fine */

/* Samples up to g->n_max tokens, stopping after an end-of-generation token.
 * Every sampled id is accepted by the sampler and, if ids is non-NULL, stored
 * in ids[*n_ids] (room for n_max). With text non-NULL the streamed text is
 * returned malloc'd and NUL-terminated (also on error). The held-back bytes of
 * an incomplete UTF-8 sequence stay in g->ts for the caller to flush.
 * With g->gram, each step masks the logits to the grammar, the budget being
 * the tokens left (so the output closes within n_max), and a grammar that
 * can match nothing more ends the loop as an end-of-generation token would.
 * Returns 0, JLM_ENOMEM, or the engine's error (the ids sampled before stay). */
int jlm_cli_generate(const jlm_cli_gen *g, int32_t *ids, size_t *n_ids, char **text, jlm_err *err);

#endif
