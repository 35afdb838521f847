/* session.h - one model opened for generation: the engine, its tokenizer,
 * the chat template, a sampler, the backend choice (the engine options) and
 * a residency reporter; a prompt or a chat turn evaluated; tokens streamed
 * through a callback. `jlm run`, `jlm chat` and `jlm serve` all open their
 * models here, so they assemble these the same way.
 *
 * Residency: prompt/ may not include residency/ (docs/architecture.md). A
 * caller that reports page-ins hands the session a jlm_sess_view: find
 * tells whether the model is on a jlmfs view (and names its database),
 * open/flush/close report the engine's pager events there (the CLI's
 * implementation is cli/report.c). A view is read through the page cache
 * the mount fills: the session clears eng.direct for one.
 *
 * Threading: a session is used by one thread at a time (serve's worker owns
 * its model's). Failure: every function returns 0 or a JLM_E* code with err
 * set; nothing is left half-open. */
#ifndef JLM_PROMPT_SESSION_H
#define JLM_PROMPT_SESSION_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "text/grammar/grammar.h"
#include "text/template/chat.h"
#include "text/tokenizer/tokenizer.h"

typedef struct jlm_sess_view {
    /* 1 (and *db_path, *key malloc'd) when model (as given) or container is
     * on a jlmfs view; 0 otherwise */
    int   (*find)(const char *model, const char *container, char **db_path, char **key);
    /* subscribes to e's pager; the reporter (NULL: none) */
    void *(*open)(jlm_engine *e, const char *db_path, const char *key);
    void  (*flush)(void *r);                  /* the events queued so far (after each evaluation) */
    void  (*close)(void *r, jlm_engine *e);   /* flushes, ends, unsubscribes, frees */
} jlm_sess_view;

enum {
    JLM_SESS_TEMPLATE = 1,   /* open the chat template (the container's, else chatml) */
    JLM_SESS_NO_VOCAB = 2,   /* a container without a vocab opens without a tokenizer (ids in, ids out) */
    JLM_SESS_NO_REPORT = 4,  /* find the view, but report nothing (serve without a reporter) */
};

typedef struct jlm_sess_opts {
    jlm_engine_opts        eng;     /* the backend choice and memory budget */
    const jlm_samp_params *samp;    /* NULL: no sampler (serve's slots bring their own); repeat_last_n -1: n_ctx */
    const jlm_sess_view   *view;    /* NULL: never a view */
    unsigned               flags;   /* JLM_SESS_* */
} jlm_sess_opts;

typedef struct jlm_session {
    char            *container;     /* the .jlm opened: model, or model/model.jlm for a view folder */
    char            *db_path, *key; /* on a view: its residency database and the model's key; else NULL */
    jlm_engine      *e;
    jlm_tok         *tok;           /* NULL only with JLM_SESS_NO_VOCAB on a vocab-less container */
    const jlm_vocab *voc;
    jlm_sampler     *s;             /* NULL without samp */
    char            *tmpl, *bos, *eos; /* JLM_SESS_TEMPLATE: the template and its BOS/EOS texts */
    int              tmpl_fallback; /* 1: chatml, the container has none */
    float           *logits;        /* (n_vocab,): after the last evaluation */
    const jlm_sess_view *view;
    void            *rep;           /* the reporter (NULL: none) */
} jlm_session;

/* The container of model: a jlmfs view folder's model.jlm (a trailing '/'
 * dropped), anything else as given. malloc'd; NULL on OOM. */
char *jlm_session_container(const char *model);

/* Opens model (a .jlm or a jlmfs view folder) as o asks. Errors name the
 * container (tokenizer errors "PATH: tokenizer: ..."). */
int  jlm_session_open(const char *model, const jlm_sess_opts *o, jlm_session **out, jlm_err *err);
void jlm_session_close(jlm_session *s);
/* The reporter's queued events written (a no-op without one). */
void jlm_session_flush(jlm_session *s);

/* Tokenizes text at the cache's end: BOS added at position 0 (as the vocab
 * says), special-token texts as their ids when special. */
int  jlm_session_encode(jlm_session *s, const char *text, int special, int32_t **ids, size_t *n, jlm_err *err);
/* Evaluates n ids at the cache's end into s->logits; the sampler (if any)
 * accepts them; the reporter is flushed. */
int  jlm_session_eval(jlm_session *s, const int32_t *ids, size_t n, jlm_err *err);
/* Evaluates prompt with the image file at its marker (prompt/image_prompt.h)
 * into s->logits; *ids (malloc'd) the text tokens, accepted by the sampler. */
int  jlm_session_eval_image(jlm_session *s, const char *image, const char *prompt, int32_t **ids, size_t *n,
                            jlm_err *err);

/* Renders msgs through the session's template (JLM_SESS_TEMPLATE), with an
 * opened assistant turn when gen. malloc'd. */
int  jlm_session_render(jlm_session *s, const jlm_chat_msg *msgs, size_t n, int gen, char **out, jlm_err *err);
/* text, less a leading BOS text when it would go at position 0 and the
 * vocab adds BOS itself (llama.cpp); points into text. */
const char *jlm_session_at_start(const jlm_session *s, const char *text);

/* A chat turn at the cache's end: prev is the rendered text whose tokens
 * fill the cache from 0, full the conversation rendered now. When full
 * extends prev (and the cache holds it), *ids are the tokens of what it adds;
 * otherwise the cache is rewound to 0 and *ids are all of full's (llama.cpp's
 * common_chat_format_single). Special-token texts parsed. */
int  jlm_session_extend(jlm_session *s, const char *prev, const char *full, int32_t **ids, size_t *n, jlm_err *err);

/* Called with each completed piece of generated text; nonzero stops the
 * generation with that code (its err set by the callback). */
typedef int (*jlm_sess_emit)(void *ctx, const char *piece, size_t n, jlm_err *err);

typedef struct jlm_sess_gen {
    int             n_max;      /* tokens to sample at most */
    int             eval_eog;   /* 1: evaluate an end-of-generation token too (chat keeps the turn's end) */
    int             fix_utf8;   /* 1: invalid UTF-8 in a piece becomes U+FFFD, emitted and kept (chat) */
    int             eval_last;  /* 1: evaluate the n_max-th token too (chat); 0: stop before (run) */
    int             ignore_eos; /* 1: end-of-generation tokens are never sampled */
    volatile sig_atomic_t *stop; /* non-NULL: checked before each token; set ends the loop, rc 0 */
    jlm_tok_stream *ts;         /* the caller's stream (its leading-space rule) */
    jlm_sess_emit   emit;       /* NULL: nothing emitted */
    void           *ctx;
    jlm_gram_match *gram;       /* non-NULL (with a tokenizer): every token is masked to the grammar and advances it */
    const jlm_gram_vocab *gram_vocab; /* the tokenizer's trie (with gram) */
} jlm_sess_gen;

/* From s->logits: samples up to g->n_max tokens, stopping after an
 * end-of-generation token. Every id is accepted by the sampler and, if ids
 * is non-NULL, stored in ids[*n_ids] (room for n_max). With text non-NULL
 * the streamed text is returned malloc'd (also on error). The held-back
 * bytes of an incomplete UTF-8 sequence stay in g->ts. With g->gram, each
 * step masks s->logits to the grammar, the budget being the tokens left (so
 * the output closes within n_max), and a grammar that can match nothing more
 * ends the loop as an end-of-generation token would. 0, JLM_ENOMEM, the
 * engine's error or the callback's (the ids sampled before stay). */
int  jlm_session_generate(jlm_session *s, const jlm_sess_gen *g, int32_t *ids, size_t *n_ids, char **text,
                          jlm_err *err);

#endif
