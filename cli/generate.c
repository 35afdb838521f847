/* generate.c - the decode loop shared by jlm run and jlm chat (generate.h). */
#include "cli/generate.h"
#include "text/tokenizer/utf8_fix.h"

#include <math.h>
#include <stdio.h>
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

/* Feeds id to the stream; prints and keeps what it completes. */
static int emit(const jlm_cli_gen *g, int32_t id, char *piece, size_t cap, textbuf *t, jlm_err *err)
{
    size_t n = 0;
    if (jlm_tok_stream_feed(g->ts, id, piece, cap, &n, err) != 0 || !n)
        return 0;   /* an id without a piece prints nothing (as before) */
    char *fixed = g->fix_utf8 ? jlm_utf8_fix(piece, n) : NULL;
    if (g->fix_utf8 && !fixed)
        return JLM_ENOMEM;
    const char *out = fixed ? fixed : piece;
    n = fixed ? strlen(fixed) : n;
    if (g->print) {
        fwrite(out, 1, n, stdout);
        fflush(stdout);
    }
    int rc = t ? text_put(t, out, n) : 0;
    free(fixed);
    return rc;
}

static int eval_one(const jlm_cli_gen *g, int32_t id, float *logits, jlm_err *err)
{
    int rc = jlm_engine_eval(g->e, &id, 1, logits, err);
    jlm_cli_report_flush(g->rep);
    return rc;
}

int jlm_cli_generate(const jlm_cli_gen *g, int32_t *ids, size_t *n_ids, char **text, jlm_err *err)
{
    size_t cap = (g->tok ? jlm_tok_max_piece_len(g->tok) : 0) + 8;   /* no tok: a vocab-less container, ids only */
    char *piece = malloc(cap);
    textbuf t = {.p = text ? malloc(256) : NULL, .cap = 256};
    int rc = piece && (!text || t.p) ? 0 : JLM_ENOMEM;
    int streams = g->tok && (g->print || text);
    if (n_ids)
        *n_ids = 0;
    uint32_t n_vocab = jlm_engine_n_vocab(g->e);
    for (int i = 0; i < g->n_max && !rc; i++) {
        if (g->stop && *g->stop)
            break;   /* Ctrl-C: every token so far is printed and evaluated */
        if (g->ignore_eos && g->tok)
            for (uint32_t v = 0; v < n_vocab; v++)
                if (jlm_tok_is_eog(g->tok, (int32_t)v))
                    g->logits[v] = -INFINITY;
        if (g->gram) {
            long allowed = jlm_gram_mask(g->gram, g->gram_vocab, g->n_max - i, g->logits);
            if (allowed < 0) { rc = jlm_errf(err, JLM_ENOMEM, "grammar: out of memory"); break; }
            if (allowed == 0) break;   /* nothing can follow: the grammar is complete */
        }
        int32_t id = jlm_samp_next(g->s, g->logits);
        if (g->gram && !(g->tok && jlm_tok_is_eog(g->tok, id)) && (rc = jlm_gram_accept(g->gram, g->gram_vocab, id, err)))
            break;
        if (ids)
            ids[(*n_ids)++] = id;
        jlm_samp_accept(g->s, id);
        if (g->tok && jlm_tok_is_eog(g->tok, id)) {
            if (g->eval_eog)
                rc = eval_one(g, id, NULL, err);
            break;
        }
        if (streams)
            rc = emit(g, id, piece, cap, text ? &t : NULL, err);
        if (!rc && (i + 1 < g->n_max || g->eval_last))
            rc = eval_one(g, id, g->logits, err);
    }
    if (t.p)
        t.p[t.len] = 0;
    if (text)
        *text = t.p;
    free(piece);
    return rc;
}
