/* hf_tok.c - tokenizer.json + tokenizer_config.json -> llama.cpp's
 * tokenizer.ggml.* keys, as convert_hf_to_gguf.py writes them for a
 * byte-level BPE ("gpt2" model), so converter/vocab.c builds the record.
 *
 * Phases: (1) check every part of tokenizer.json against what the record can
 * carry, refusing the rest by field name; (2) the token list (model.vocab +
 * added_tokens, "[PADi]" for holes up to config.json's vocab_size), kinds and
 * merges; (3) special ids, BOS/EOS additions, the end-of-generation ids of
 * generation_config.json and the chat templates. docs/safetensors.md lists
 * the decisions. */
#include "converter/hf_int.h"
#include "format/jlm_format.h"

#include <stdlib.h>
#include <string.h>

/* The Split regexes the pre-tokenizer table of converter/vocab.c has stages for. */
static const struct { const char *re, *pre; } KNOWN_SPLITS[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", "llama-bpe"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", "qwen2"},
    {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
     "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", "gpt-4o"},
};

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

typedef struct tk {
    hf         *h;
    const char *path;      /* tokenizer.json, for messages */
    json_t     *tok, *cfg, *gen;
    uint32_t    n;         /* token count */
    jlm_gguf_str *text;
    int32_t    *type;
    const char *pre;
    int         add_bos, add_eos;
    int32_t     pp_bos, pp_eos;   /* what the post-processor adds */
    FILE       *notes;
    int         spm;       /* BPE with byte fallback and '\xe2\x96\x81' (llama.cpp's "llama" model) */
    int         prepend;   /* its normalizer prepends '\xe2\x96\x81' */
} tk;

static int refuse(tk *t, const char *field, const char *what)
{
    return jlm_errf(t->h->err, JLM_EUNSUPPORTED, "%s: %s %s is not supported (docs/safetensors.md)", t->path, field, what);
}

static const char *type_of(json_t *o) { return json_string_value(json_object_get(o, "type")); }

/* ---------------------------------------------------------------- phase 1: what the record can carry */
static int check_model(tk *t)
{
    json_t *m = json_object_get(t->tok, "model");
    const char *ty = type_of(m);
    if (!ty || strcmp(ty, "BPE"))
        return refuse(t, "model.type", ty ? ty : "(missing)");
    t->spm = json_is_true(json_object_get(m, "byte_fallback"));
    const char *csp = json_string_value(json_object_get(m, "continuing_subword_prefix"));
    const char *eow = json_string_value(json_object_get(m, "end_of_word_suffix"));
    if ((csp && *csp) || (eow && *eow))
        return refuse(t, "model.continuing_subword_prefix/end_of_word_suffix", "other than empty");
    if (!json_is_object(json_object_get(m, "vocab")) || !json_is_array(json_object_get(m, "merges")))
        return jlm_errf(t->h->err, JLM_EFORMAT, "%s: model.vocab / model.merges missing", t->path);
    return 0;
}

/* Sequence[Split(known regex, Isolated), ByteLevel(use_regex false)] or ByteLevel(use_regex true). */
static int check_pre(tk *t)
{
    json_t *p = json_object_get(t->tok, "pre_tokenizer");
    const char *ty = type_of(p);
    if (t->spm)
        return jlm_hf_spm_pre(t->h, t->path, p);
    if (ty && !strcmp(ty, "ByteLevel") && !json_is_false(json_object_get(p, "use_regex"))) {
        t->pre = "gpt-2";
        return 0;
    }
    json_t *seq = json_object_get(p, "pretokenizers"), *sp = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
    if (!ty || strcmp(ty, "Sequence") || json_array_size(seq) != 2 || !type_of(sp) || strcmp(type_of(sp), "Split") ||
        !type_of(bl) || strcmp(type_of(bl), "ByteLevel") || json_is_true(json_object_get(bl, "use_regex")))
        return refuse(t, "pre_tokenizer", "(only Split + ByteLevel, or ByteLevel)");
    const char *beh = json_string_value(json_object_get(sp, "behavior"));
    if (json_is_true(json_object_get(sp, "invert")) || !beh || strcmp(beh, "Isolated"))
        return refuse(t, "pre_tokenizer Split behavior/invert", beh ? beh : "(missing)");
    const char *re = json_string_value(json_object_get(json_object_get(sp, "pattern"), "Regex"));
    for (size_t i = 0; re && i < sizeof KNOWN_SPLITS / sizeof KNOWN_SPLITS[0]; i++)
        if (!strcmp(re, KNOWN_SPLITS[i].re)) {
            t->pre = KNOWN_SPLITS[i].pre;
            return 0;
        }
    return refuse(t, "pre_tokenizer Split regex", "other than llama-3's, qwen2's or o200k's (gpt-oss)");
}

static int check_rest(tk *t)
{
    json_t *n = json_object_get(t->tok, "normalizer"), *d = json_object_get(t->tok, "decoder");
    const char *nt = type_of(n), *dt = type_of(d);
    if (t->spm)
        return jlm_hf_spm_norm_dec(t->h, t->path, n, d, &t->prepend);
    if (nt && strcmp(nt, "NFC"))
        return refuse(t, "normalizer", nt);
    if (nt && jlm_hf_kv_str(t->h, "tokenizer.ggml.normalizer", "nfc"))   /* a first PreOp stage (docs/tokenizer.md) */
        return jlm_errf(t->h->err, JLM_ENOMEM, "%s: normalizer", t->path);
    if (!dt || strcmp(dt, "ByteLevel"))
        return refuse(t, "decoder", dt ? dt : "(missing)");
    return 0;
}

/* ---------------------------------------------------------------- phase 2: tokens, kinds, merges */
static int set_token(tk *t, json_int_t id, const char *s, int32_t type)
{
    if (id < 0 || (uint64_t)id >= t->n)
        return jlm_errf(t->h->err, JLM_EFORMAT, "%s: token '%.80s' has id %lld outside 0..%u", t->path, s,
                        (long long)id, t->n - 1);
    if (t->text[id].s && type == TT_NORMAL && strcmp(t->text[id].s, s))
        return jlm_errf(t->h->err, JLM_EFORMAT, "%s: id %lld is given to '%.80s' and '%.80s'", t->path, (long long)id,
                        t->text[id].s, s);
    t->text[id].s = s;                 /* owned by the json, which outlives the handle: copied below */
    t->text[id].len = strlen(s);
    t->type[id] = type;
    return 0;
}

/* llama.cpp's does_token_look_special for added tokens HF calls non-special. */
static int looks_special(const char *s)
{
    size_t n = strlen(s);
    return !strcmp(s, "<pad>") || !strcmp(s, "<mask>") || (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>"));
}

static int count_tokens(tk *t, uint32_t n_vocab)
{
    json_t *vocab = json_object_get(json_object_get(t->tok, "model"), "vocab"), *added = json_object_get(t->tok, "added_tokens");
    json_int_t mx = -1;
    const char *k;
    json_t *v;
    size_t i;
    json_object_foreach(vocab, k, v)
        if (json_integer_value(v) > mx) mx = json_integer_value(v);
    json_array_foreach(added, i, v)
        if (json_integer_value(json_object_get(v, "id")) > mx) mx = json_integer_value(json_object_get(v, "id"));
    if (mx < 0 || mx >= 0x7fffffff)
        return jlm_errf(t->h->err, JLM_EFORMAT, "%s: no tokens, or an id out of range", t->path);
    /* Ids past config.json's vocab_size are filled with "[PADi]" holes. Real files
     * leave few; a table that would be mostly holes (the fuzzer's id 1131801 among
     * 260 tokens made 1.1 M placeholder strings, seconds and 700 MB) is refused,
     * as is one over the container's vocab limit. */
    uint64_t entries = json_object_size(vocab) + json_array_size(added);
    if ((uint64_t)mx + 1 > JLM_MAX_VOCAB)
        return jlm_errf(t->h->err, JLM_EFORMAT, "%s: token id %lld is over the limit of %u tokens", t->path,
                        (long long)mx, JLM_MAX_VOCAB);
    if ((uint64_t)mx + 1 > n_vocab && (uint64_t)mx + 1 > 2 * entries + 1024)
        return jlm_errf(t->h->err, JLM_EFORMAT,
                        "%s: token id %lld leaves more holes than the %llu tokens it has (no vocab_size covers it)",
                        t->path, (long long)mx, (unsigned long long)entries);
    t->n = (uint32_t)mx + 1 > n_vocab ? (uint32_t)mx + 1 : n_vocab;
    t->text = jlm_hf_keep(t->h, calloc(t->n, sizeof *t->text));
    t->type = jlm_hf_keep(t->h, calloc(t->n, sizeof *t->type));
    return t->text && t->type ? 0 : jlm_errf(t->h->err, JLM_ENOMEM, "%s: token table", t->path);
}

static int tokens(tk *t, uint32_t n_vocab)
{
    int rc = count_tokens(t, n_vocab);
    json_t *vocab = json_object_get(json_object_get(t->tok, "model"), "vocab"), *added = json_object_get(t->tok, "added_tokens");
    const char *k;
    json_t *v;
    size_t i;
    json_object_foreach(vocab, k, v)
        if (!rc && !json_is_integer(v))
            rc = jlm_errf(t->h->err, JLM_EFORMAT, "%s: model.vocab['%.80s'] is not an integer", t->path, k);
        else if (!rc)
            rc = set_token(t, json_integer_value(v), k, t->spm && jlm_hf_spm_is_byte(k) ? TT_BYTE : TT_NORMAL);
    json_array_foreach(added, i, v) {
        const char *s = json_string_value(json_object_get(v, "content"));
        json_t *id = json_object_get(v, "id");
        if (!rc && (!s || !json_is_integer(id)))
            rc = jlm_errf(t->h->err, JLM_EFORMAT, "%s: added_tokens[%zu] needs id and content", t->path, i);
        else if (!rc)
            rc = set_token(t, json_integer_value(id), s,
                           json_is_true(json_object_get(v, "special")) || looks_special(s) ? TT_CONTROL
                           : t->spm && jlm_hf_spm_plain(s, vocab)                        ? TT_NORMAL
                                                                                         : TT_USER);
    }
    const char *unk = json_string_value(json_object_get(json_object_get(t->tok, "model"), "unk_token"));
    json_t *uid = unk ? json_object_get(vocab, unk) : NULL;
    if (!rc && t->spm && json_is_integer(uid))
        t->type[json_integer_value(uid)] = TT_UNKNOWN;
    for (uint32_t j = 0; !rc && j < t->n; j++) {
        const char *s = t->text[j].s ? jlm_hf_own(t->h, "%s", t->text[j].s) : jlm_hf_own(t->h, "[PAD%u]", j);
        if (!s)
            return jlm_errf(t->h->err, JLM_ENOMEM, "%s: token table", t->path);
        if (!t->text[j].s)
            t->type[j] = TT_UNUSED;
        t->text[j].s = s;
        t->text[j].len = strlen(s);
    }
    return rc;
}

static jlm_gguf_kv *arr(tk *t, const char *key, uint32_t et, uint64_t n, const void *a)
{
    jlm_gguf_kv *kv = jlm_hf_kv(t->h, key, 0, GGUF_T_ARRAY);
    if (kv) {
        kv->arr_type = et;
        kv->n = n;
        kv->arr = a;
    }
    return kv;
}

/* "a b" strings, from either form tokenizers writes ("a b" or ["a", "b"]). */
static int merges(tk *t)
{
    json_t *m = json_object_get(json_object_get(t->tok, "model"), "merges"), *v;
    size_t n = json_array_size(m), i;
    jlm_gguf_str *s = jlm_hf_keep(t->h, calloc(n ? n : 1, sizeof *s));
    if (!s)
        return jlm_errf(t->h->err, JLM_ENOMEM, "%s: merges", t->path);
    json_array_foreach(m, i, v) {
        const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
        char *x = json_is_string(v) ? jlm_hf_own(t->h, "%s", json_string_value(v))
                  : a && b && json_array_size(v) == 2 ? jlm_hf_own(t->h, "%s %s", a, b) : NULL;
        if (!x)
            return jlm_errf(t->h->err, JLM_EFORMAT, "%s: model.merges[%zu] is not \"a b\" or [a, b]", t->path, i);
        s[i].s = x;
        s[i].len = strlen(x);
    }
    return arr(t, "tokenizer.ggml.merges", GGUF_T_STRING, n, s) ? 0 : JLM_ENOMEM;
}

/* ---------------------------------------------------------------- phase 3: specials and templates */
static int32_t id_of(tk *t, const char *s)
{
    for (uint32_t i = 0; s && i < t->n; i++)
        if (t->type[i] != TT_NORMAL && !strcmp(t->text[i].s, s))
            return (int32_t)i;
    json_t *v = json_object_get(json_object_get(json_object_get(t->tok, "model"), "vocab"), s ? s : "");
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
}

/* tokenizer_config.json's "<name>_token": a string or {"content": ...}. */
static int32_t cfg_token(tk *t, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "%s_token", name);
    json_t *v = json_object_get(t->cfg, key);
    return id_of(t, json_is_object(v) ? json_string_value(json_object_get(v, "content")) : json_string_value(v));
}

/* TemplateProcessing: which special tokens surround $A. ByteLevel / none: nothing. */
static int post_processor(tk *t)
{
    json_t *pp = json_object_get(t->tok, "post_processor");
    const char *ty = type_of(pp);
    t->pp_bos = t->pp_eos = -1;
    if (!ty || !strcmp(ty, "ByteLevel"))
        return 0;
    json_t *single = json_object_get(pp, "single");
    if (strcmp(ty, "TemplateProcessing") || !json_array_size(single))
        return refuse(t, "post_processor", ty);
    size_t n = json_array_size(single), i;
    json_t *e;
    json_array_foreach(single, i, e) {
        json_t *sp = json_object_get(e, "SpecialToken");
        if (!sp && json_object_get(e, "Sequence"))
            continue;
        const char *id = json_string_value(json_object_get(sp, "id"));
        if (!id || (i != 0 && i != n - 1))
            return refuse(t, "post_processor.single", "(only special tokens before and after $A)");
        *(i == 0 ? &t->pp_bos : &t->pp_eos) = id_of(t, id);
    }
    return 0;
}

static int id_key(tk *t, const char *key, int32_t id)
{
    if (id < 0)
        return 0;
    jlm_gguf_kv *kv = jlm_hf_kv(t->h, key, 0, GGUF_T_U32);
    if (kv)
        kv->v.u = (uint32_t)id;
    return kv ? 0 : JLM_ENOMEM;
}

static int bool_key(tk *t, const char *key, int b)
{
    jlm_gguf_kv *kv = jlm_hf_kv(t->h, key, 0, GGUF_T_BOOL);
    if (kv)
        kv->v.b = b;
    return kv ? 0 : JLM_ENOMEM;
}

/* generation_config.json's eos_token_id: one id or a list -> end-of-generation ids. */
static int eog(tk *t, int32_t *eos)
{
    json_t *e = json_object_get(t->gen, "eos_token_id"), *v;
    size_t n = json_is_array(e) ? json_array_size(e) : json_is_integer(e), i;
    if (!n)
        return 0;
    int32_t *ids = jlm_hf_keep(t->h, calloc(n, sizeof *ids));
    if (!ids)
        return JLM_ENOMEM;
    for (i = 0; i < n; i++) {
        v = json_is_array(e) ? json_array_get(e, i) : e;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= t->n)
            return jlm_errf(t->h->err, JLM_EFORMAT, "%s/generation_config.json: eos_token_id %zu is not a token id",
                            t->h->dir, i);
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (*eos < 0)
        *eos = ids[0];
    return arr(t, "tokenizer.ggml.eog_token_ids", GGUF_T_I32, n, ids) ? 0 : JLM_ENOMEM;
}

/* "chat_template": a string, or a list of {name, template} ("default" is the plain one). */
static int templates(tk *t)
{
    json_t *ct = json_object_get(t->cfg, "chat_template"), *e;
    size_t i;
    if (json_is_string(ct))
        return jlm_hf_kv_str(t->h, "tokenizer.chat_template", json_string_value(ct)) ? JLM_ENOMEM : 0;
    if (ct && !json_is_array(ct) && !json_is_null(ct))
        return jlm_errf(t->h->err, JLM_EFORMAT, "%s/tokenizer_config.json: chat_template is not a string or a list",
                        t->h->dir);
    json_array_foreach(ct, i, e) {
        const char *nm = json_string_value(json_object_get(e, "name")), *tx = json_string_value(json_object_get(e, "template"));
        if (!nm || !tx)
            return jlm_errf(t->h->err, JLM_EFORMAT, "%s/tokenizer_config.json: chat_template[%zu] needs name and template",
                            t->h->dir, i);
        char key[160];
        snprintf(key, sizeof key, strcmp(nm, "default") ? "tokenizer.chat_template.%.100s" : "tokenizer.chat_template", nm);
        if (jlm_hf_kv_str(t->h, key, tx))
            return JLM_ENOMEM;
    }
    return 0;
}

static int specials(tk *t)
{
    int32_t bos = cfg_token(t, "bos"), eos = cfg_token(t, "eos");
    int rc = post_processor(t);
    if (rc)
        return rc;
    if (t->pp_bos >= 0)
        bos = t->pp_bos;
    if (t->pp_eos >= 0)
        eos = t->pp_eos;
    if ((rc = eog(t, &eos)))
        return rc;
    if (id_key(t, "tokenizer.ggml.bos_token_id", bos) || id_key(t, "tokenizer.ggml.eos_token_id", eos) ||
        id_key(t, "tokenizer.ggml.padding_token_id", cfg_token(t, "pad")) ||
        id_key(t, "tokenizer.ggml.unknown_token_id", cfg_token(t, "unk")) ||
        bool_key(t, "tokenizer.ggml.add_bos_token", t->pp_bos >= 0) ||
        bool_key(t, "tokenizer.ggml.add_eos_token", t->pp_eos >= 0))
        return jlm_errf(t->h->err, JLM_ENOMEM, "%s: special tokens", t->path);
    return templates(t);
}

int jlm_hf_tokenizer(hf *h, json_t *tok, json_t *tok_cfg, json_t *gen_cfg, uint32_t n_vocab, FILE *notes)
{
    if (!tok)
        return jlm_hf_kv_str(h, "tokenizer.ggml.model", "none") ? jlm_errf(h->err, JLM_ENOMEM, "%s", h->dir) : 0;
    tk t = {.h = h, .tok = tok, .cfg = tok_cfg, .gen = gen_cfg, .notes = notes};
    char *path = jlm_hf_own(h, "%s/tokenizer.json", h->dir);
    if (!path)
        return jlm_errf(h->err, JLM_ENOMEM, "%s", h->dir);
    t.path = path;
    int rc;
    if ((rc = check_model(&t)) || (rc = check_pre(&t)) || (rc = check_rest(&t)) || (rc = tokens(&t, n_vocab)) ||
        (rc = t.spm ? jlm_hf_spm_scores(h, t.path, t.tok, t.n) : merges(&t)))
        return rc;
    if (t.spm && bool_key(&t, "tokenizer.ggml.add_space_prefix", t.prepend))
        return jlm_errf(h->err, JLM_ENOMEM, "%s", t.path);
    if (jlm_hf_kv_str(h, "tokenizer.ggml.model", t.spm ? "llama" : "gpt2") ||
        bool_key(&t, "tokenizer.hf.added_only", 1) ||
        (!t.spm && jlm_hf_kv_str(h, "tokenizer.ggml.pre", t.pre)) ||
        !arr(&t, "tokenizer.ggml.tokens", GGUF_T_STRING, t.n, t.text) ||
        !arr(&t, "tokenizer.ggml.token_type", GGUF_T_I32, t.n, t.type))
        return jlm_errf(h->err, JLM_ENOMEM, "%s", t.path);
    rc = specials(&t);
    return rc == JLM_ENOMEM ? jlm_errf(h->err, JLM_ENOMEM, "%s", t.path) : rc;
}
