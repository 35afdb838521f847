/* image_prompt.c - a text prompt with one image in it, fed to the engine:
 * the prompt split at its image marker, tokenized around the projector's
 * begin/end-of-image tokens, the image's embeddings in between. Lives above
 * engine/ and text/ (it needs both; neither needs the other). */
#include <stdlib.h>
#include <string.h>

#include "prompt/image_prompt.h"

static int token_id(const jlm_vocab *voc, const char *text, int32_t *id)
{
    for (uint32_t i = 0; i < voc->n_tokens; i++)
        if (voc->tokens[i].len == strlen(text) && !memcmp(voc->tokens[i].s, text, voc->tokens[i].len)) {
            *id = (int32_t)i;
            return 1;
        }
    return 0;
}

/* Splits prompt at its image marker: [pre_len) before, *post after. */
static void split_marker(const char *prompt, size_t *pre_len, const char **post)
{
    static const char *const markers[] = {"<image>", "<__media__>"};
    const char *best = NULL;
    size_t blen = 0;
    for (size_t i = 0; i < 2; i++) {
        const char *p = strstr(prompt, markers[i]);
        if (p && (!best || p < best)) {
            best = p;
            blen = strlen(markers[i]);
        }
    }
    *pre_len = best ? (size_t)(best - prompt) : 0;
    *post = best ? best + blen : prompt;
}

/* Tokenizes a + b (parse_special) and appends the ids to *ids. */
static int encode_cat(const jlm_tok *tok, const char *a, size_t alen, const char *b, int add_special, int32_t **ids,
                      size_t *n, jlm_err *err)
{
    size_t blen = strlen(b);
    char *s = malloc(alen + blen + 1);
    if (!s)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    memcpy(s, a, alen);
    memcpy(s + alen, b, blen + 1);
    int32_t *v = NULL;
    size_t m = 0;
    int rc = jlm_tok_encode(tok, s, alen + blen, add_special, 1, &v, &m, err);
    free(s);
    if (rc)
        return rc;
    int32_t *all = realloc(*ids, (*n + m + 1) * sizeof *all);
    if (!all) {
        free(v);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    memcpy(all + *n, v, m * sizeof *v);
    free(v);
    *ids = all;
    *n += m;
    return JLM_OK;
}

int jlm_image_prompt_eval(jlm_engine *e, jlm_vtower *vt, const jlm_tok *tok, const char *prompt, const jlm_image *img,
                           float *logits, int32_t **ids, size_t *n_ids, jlm_err *err)
{
    return jlm_image_prompt_eval_seq(e, NULL, vt, tok, prompt, img, logits, ids, n_ids, err);
}

/* The tokens on s's cache, or the engine's own (s NULL). */
static int eval_on(jlm_engine *e, jlm_engine_seq *s, const int32_t *v, size_t n, float *logits, jlm_err *err)
{
    return s ? jlm_engine_eval_seq(e, s, v, (uint32_t)n, logits, err) : jlm_engine_eval(e, v, (uint32_t)n, logits, err);
}

int jlm_image_prompt_eval_seq(jlm_engine *e, jlm_engine_seq *s, jlm_vtower *vt, const jlm_tok *tok, const char *prompt,
                               const jlm_image *img, float *logits, int32_t **ids, size_t *n_ids, jlm_err *err)
{
    const jlm_vocab *voc = jlm_tok_vocab(tok);
    const char *boi_s, *eoi_s, *name;
    jlm_vtower_markers(vt, &boi_s, &eoi_s, &name);
    int32_t boi, eoi;
    if (!token_id(voc, boi_s, &boi) || !token_id(voc, eoi_s, &eoi))
        return jlm_errf(err, JLM_EFORMAT, "%s: the vocabulary has no %s / %s token for %s images",
                        jlm_engine_model(e)->path, boi_s, eoi_s, name);
    size_t pre_len, n1 = 0, n = 0;
    const char *post;
    split_marker(prompt, &pre_len, &post);
    uint32_t n_tok = jlm_vtower_n_tokens(vt);
    float *emb = malloc((size_t)n_tok * jlm_vtower_n_embd(vt) * sizeof *emb);
    int32_t *v = NULL;
    int rc = !emb ? jlm_errf(err, JLM_ENOMEM, "out of memory for an image") : JLM_OK;
    if (!rc) rc = encode_cat(tok, prompt, pre_len, boi_s, 1, &v, &n, err);
    n1 = n;
    if (!rc) rc = encode_cat(tok, eoi_s, strlen(eoi_s), post, 0, &v, &n, err);
    if (!rc) rc = jlm_vtower_encode_image(vt, img, emb, err);
    if (!rc) rc = eval_on(e, s, v, n1, NULL, err);
    if (!rc) rc = s ? jlm_engine_eval_embd_seq(e, s, emb, n_tok, 1, NULL, err) : jlm_engine_eval_embd(e, emb, n_tok, 1, NULL, err);
    if (!rc) rc = eval_on(e, s, v + n1, n - n1, logits, err);
    free(emb);
    if (rc) {
        free(v);
        return rc;
    }
    *ids = v;
    *n_ids = n;
    return JLM_OK;
}
