/* hf_spm.c - tokenizer.json's BPE with byte fallback and U+2581 (llama-2,
 * mistral, gemma3 style) as llama.cpp's "llama" (SentencePiece) model.
 *
 * Phases: (1) the normalizer, pre-tokenizer and decoder must be the shapes
 * the SPM tokenizer of text/tokenizer applies (Prepend + Replace, or Replace
 * alone; no pre-tokenizer, or gemma3's Split(' ', MergedWithPrevious) that
 * splits nothing once spaces are U+2581; Replace + ByteFallback + Fuse
 * [+ Strip]); the rest is refused by field name. (2) scores: a token made by
 * merge rank r scores -r, so the highest-score bigram first is HF's
 * lowest-rank merge first; tokens no merge makes score -1e9. */
#include "converter/hf_int.h"

#include <stdlib.h>
#include <string.h>

#define SP "\xe2\x96\x81"

static int refuse(hf *h, const char *path, const char *field, const char *what)
{
    return jlm_errf(h->err, JLM_EUNSUPPORTED, "%s: %s %s is not supported (docs/tokenizer.md)", path, field, what);
}

static const char *str_at(json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

static int is_type(json_t *o, const char *ty) { return str_at(o, "type") && !strcmp(str_at(o, "type"), ty); }

/* Replace(String from -> to) */
static int is_replace(json_t *o, const char *from, const char *to)
{
    const char *p = str_at(json_object_get(o, "pattern"), "String"), *c = str_at(o, "content");
    return is_type(o, "Replace") && p && c && !strcmp(p, from) && !strcmp(c, to);
}

int jlm_hf_spm_pre(hf *h, const char *path, json_t *pre)
{
    if (!pre || json_is_null(pre))
        return 0;
    const char *p = str_at(json_object_get(pre, "pattern"), "String"), *b = str_at(pre, "behavior");
    if (is_type(pre, "Split") && p && !strcmp(p, " ") && b && !strcmp(b, "MergedWithPrevious") &&
        !json_is_true(json_object_get(pre, "invert")))
        return 0;   /* after Replace(' ' -> U+2581) there is no ' ' left to split at */
    return refuse(h, path, "pre_tokenizer", "(with byte_fallback: none, or Split(' ', MergedWithPrevious))");
}

static int check_norm(hf *h, const char *path, json_t *n, int *prepend)
{
    json_t *seq = json_object_get(n, "normalizers"), *a = json_array_get(seq, 0), *b = json_array_get(seq, 1);
    *prepend = 0;
    if (is_replace(n, " ", SP))
        return 0;
    if (is_type(n, "Sequence") && json_array_size(seq) == 2 && is_type(a, "Prepend") && str_at(a, "prepend") &&
        !strcmp(str_at(a, "prepend"), SP) && is_replace(b, " ", SP)) {
        *prepend = 1;
        return 0;
    }
    return refuse(h, path, "normalizer", "(with byte_fallback: only Replace(' ', U+2581), after Prepend(U+2581) or alone)");
}

/* Replace(U+2581 -> ' '), ByteFallback, Fuse, and Strip(' ', 1, 0) exactly when the normalizer prepends. */
static int check_dec(hf *h, const char *path, json_t *d, int prepend)
{
    json_t *seq = json_object_get(d, "decoders"), *s = json_array_get(seq, 3);
    size_t n = json_array_size(seq);
    int strip = n == 4 && is_type(s, "Strip") && str_at(s, "content") && !strcmp(str_at(s, "content"), " ") &&
                json_integer_value(json_object_get(s, "start")) == 1 && json_integer_value(json_object_get(s, "stop")) == 0;
    if (is_type(d, "Sequence") && (n == 3 || strip) && strip == prepend && is_replace(json_array_get(seq, 0), SP, " ") &&
        is_type(json_array_get(seq, 1), "ByteFallback") && is_type(json_array_get(seq, 2), "Fuse"))
        return 0;
    return refuse(h, path, "decoder", "(with byte_fallback: only Replace + ByteFallback + Fuse [+ Strip when prepending])");
}

int jlm_hf_spm_norm_dec(hf *h, const char *path, json_t *norm, json_t *dec, int *prepend)
{
    int rc = check_norm(h, path, norm, prepend);
    return rc ? rc : check_dec(h, path, dec, *prepend);
}

int jlm_hf_spm_is_byte(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    return strlen(s) == 6 && !strncmp(s, "<0x", 3) && strchr(hex, s[3]) && strchr(hex, s[4]) && s[5] == '>';
}

/* A non-special added token that model.vocab also has and that holds U+2581
 * (gemma3's whitespace runs): HF's decoder turns its U+2581 into ' ', which
 * the record does only for normal tokens, and the SPM tokenizer reaches it
 * through the vocab anyway; so it is typed normal. */
int jlm_hf_spm_plain(const char *s, json_t *vocab)
{
    return strstr(s, SP) && json_object_get(vocab, s);
}

int jlm_hf_spm_scores(hf *h, const char *path, json_t *tok, uint32_t n)
{
    json_t *m = json_object_get(tok, "model"), *vocab = json_object_get(m, "vocab"), *mg = json_object_get(m, "merges"), *v;
    float *sc = jlm_hf_keep(h, malloc((n ? n : 1) * sizeof *sc));
    char *buf = NULL;
    size_t i, cap = 0;
    if (!sc)
        return jlm_errf(h->err, JLM_ENOMEM, "%s: scores", path);
    for (uint32_t j = 0; j < n; j++)
        sc[j] = -1e9f;
    json_array_foreach(mg, i, v) {
        const char *a = json_string_value(v), *b = NULL, *sp;
        size_t la = 0, lb;
        if (json_is_string(v) && (sp = strchr(a + (*a != 0), ' '))) {
            la = (size_t)(sp - a);
            b = sp + 1;
        } else if (json_array_size(v) == 2 && (a = json_string_value(json_array_get(v, 0))) &&
                   (b = json_string_value(json_array_get(v, 1))))
            la = strlen(a);
        if (!b) {
            free(buf);
            return jlm_errf(h->err, JLM_EFORMAT, "%s: model.merges[%zu] is not \"a b\" or [a, b]", path, i);
        }
        lb = strlen(b);
        if (la + lb + 1 > cap) {
            char *nb = realloc(buf, 2 * (la + lb + 1));
            if (!nb) {
                free(buf);
                return jlm_errf(h->err, JLM_ENOMEM, "%s: scores", path);
            }
            buf = nb;
            cap = 2 * (la + lb + 1);
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb + 1);
        json_t *id = json_object_get(vocab, buf);
        if (json_is_integer(id) && json_integer_value(id) >= 0 && (uint64_t)json_integer_value(id) < n &&
            sc[json_integer_value(id)] == -1e9f)
            sc[json_integer_value(id)] = -(float)i;
    }
    free(buf);
    /* pieces of one character are what the SPM tokenizer starts from: score 0 */
    const char *k;
    json_object_foreach(vocab, k, v) {
        size_t l = strlen(k), c = (unsigned char)k[0] < 0x80 ? 1 : (unsigned char)k[0] < 0xe0 ? 2 : (unsigned char)k[0] < 0xf0 ? 3 : 4;
        if (l == c && json_integer_value(v) >= 0 && (uint64_t)json_integer_value(v) < n && sc[json_integer_value(v)] == -1e9f)
            sc[json_integer_value(v)] = 0;
    }
    jlm_gguf_kv *kv = jlm_hf_kv(h, "tokenizer.ggml.scores", 0, GGUF_T_ARRAY);
    if (!kv)
        return jlm_errf(h->err, JLM_ENOMEM, "%s: scores", path);
    kv->arr_type = GGUF_T_F32;
    kv->n = n;
    kv->arr = sc;
    return 0;
}
