/* session_gen.c - the one sample / accept / stream / evaluate loop of a
 * session (session.h: jlm_session_generate), shared by `jlm run` and
 * `jlm chat`. */
#include "prompt/session.h"
#include "text/tokenizer/utf8_fix.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct textbuf { char *p; size_t len, cap; } textbuf;

static int text_put(textbuf *t, const char *s, size_t n)
{
    while (t->len + n + 1 > t->cap) {
        char *np = realloc(t->p, t->cap *= 2);
        if (!np)
            return JLM_ENOMEM;
        t->p = np;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    return 0;
}

/* Feeds id to the stream; emits and keeps what it completes. */
static int emit(const jlm_sess_gen *g, int32_t id, char *piece, size_t cap, textbuf *t, jlm_err *err)
{
    size_t n = 0;
    if (jlm_tok_stream_feed(g->ts, id, piece, cap, &n, err) != 0 || !n)
        return 0;   /* an id without a piece emits nothing */
    char *fixed = g->fix_utf8 ? jlm_utf8_fix(piece, n) : NULL;
    if (g->fix_utf8 && !fixed)
        return JLM_ENOMEM;
    const char *out = fixed ? fixed : piece;
    n = fixed ? strlen(fixed) : n;
    int rc = g->emit ? g->emit(g->ctx, out, n, err) : 0;
    if (!rc && t)
        rc = text_put(t, out, n);
    free(fixed);
    return rc;
}

static int eval_one(jlm_session *s, int32_t id, float *logits, jlm_err *err)
{
    int rc = jlm_engine_eval(s->e, &id, 1, logits, err);
    jlm_session_flush(s);
    return rc;
}

static void mask_eog(jlm_session *s)
{
    uint32_t n_vocab = jlm_engine_n_vocab(s->e);
    for (uint32_t v = 0; v < n_vocab; v++)
        if (jlm_tok_is_eog(s->tok, (int32_t)v))
            s->logits[v] = -INFINITY;
}

int jlm_session_generate(jlm_session *s, const jlm_sess_gen *g, int32_t *ids, size_t *n_ids, char **text,
                         jlm_err *err)
{
    size_t cap = (s->tok ? jlm_tok_max_piece_len(s->tok) : 0) + 8;   /* no tok: a vocab-less container, ids only */
    char *piece = malloc(cap);
    textbuf t = {.p = text ? malloc(256) : NULL, .cap = 256};
    int rc = piece && (!text || t.p) ? 0 : JLM_ENOMEM;
    int streams = s->tok && (g->emit || text);
    if (n_ids)
        *n_ids = 0;
    for (int i = 0; i < g->n_max && !rc; i++) {
        if (g->stop && *g->stop)
            break;   /* Ctrl-C: every token so far is emitted and evaluated */
        if (g->ignore_eos && s->tok)
            mask_eog(s);
        int gram = g->gram && s->tok;
        if (gram) {
            long allowed = jlm_gram_mask(g->gram, g->gram_vocab, g->n_max - i, s->logits);
            if (allowed < 0) { rc = jlm_errf(err, JLM_ENOMEM, "grammar: out of memory"); break; }
            if (allowed == 0) break;   /* nothing can follow: the grammar is complete */
        }
        int32_t id = jlm_samp_next(s->s, s->logits);
        if (gram && !jlm_tok_is_eog(s->tok, id) && (rc = jlm_gram_accept(g->gram, g->gram_vocab, id, err)))
            break;
        if (ids)
            ids[(*n_ids)++] = id;
        jlm_samp_accept(s->s, id);
        if (s->tok && jlm_tok_is_eog(s->tok, id)) {
            if (g->eval_eog)
                rc = eval_one(s, id, NULL, err);
            break;
        }
        if (streams)
            rc = emit(g, id, piece, cap, text ? &t : NULL, err);
        if (!rc && (i + 1 < g->n_max || g->eval_last))
            rc = eval_one(s, id, s->logits, err);
    }
    if (t.p)
        t.p[t.len] = 0;
    if (text)
        *text = t.p;
    free(piece);
    return rc;
}
