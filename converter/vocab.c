/* vocab.c - GGUF tokenizer keys -> jlm_vocab, with llama.cpp's defaults and
 * its pre-tokenizer names resolved into PreOp stages (docs/tokenizer.md).
 * Facts follow llama.cpp's llama_vocab::impl::load (b10359).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "converter/vocab.h"

#define K_PRE "tokenizer.ggml.pre"
#define NAME_FW_BAR "\xef\xbd\x9c"   /* U+FF5C, DeepSeek's full-width bar */
#define NAME_SPC    "\xe2\x96\x81"   /* U+2581 */

/* ================================================================ pre-tokenizer stage lists */
#define OP_GPT2      {.kind = 1, .contractions = 1, .add_prefix_space = 1}
#define OP_LLAMA3(g) {.kind = 1, .contractions = 1, .case_fold = 1, .digit_group = (g)}
#define OP_BYTE      {.kind = 2}
#define OP_DIGITS(i) {.kind = 3, .individual = (i)}
#define OP_RX(p)     {.kind = 1, .use_regex = 1, .behavior = {p, sizeof(p) - 1}}

#define RX_CJK  "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RX_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
/* deepseek-llm's cased-letter class, every non-ASCII code point escaped so no
 * Unicode normalisation of this source can change it. */
#define RX_DS_LETTERS "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}" \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}" \
    "\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}" \
    "\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}" \
    "\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}" \
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}" \
    "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}" \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}" \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}" \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}" \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}" \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}" \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}" \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}" \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}" \
    "\\x{1E900}-\\x{1E943}]+"
#define RX_DS_PUNCT "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"
#define RX_DSV3 "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+" \
    "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* o200k (gpt-4o, gpt-oss): letter runs split at case changes (\p{Lu}...) and (?i:) contractions. */
#define RX_O200K "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const jlm_preop L_DEFAULT[]   = {{.kind = 7}, OP_GPT2, OP_DIGITS(0), {.kind = 6}, OP_BYTE};
static const jlm_preop L_GPT2[]      = {OP_GPT2, OP_BYTE};
static const jlm_preop L_LLAMA3[]    = {OP_LLAMA3(3), OP_BYTE};
static const jlm_preop L_QWEN2[]     = {OP_LLAMA3(1), OP_BYTE};
static const jlm_preop L_STARCODER[] = {OP_DIGITS(1), OP_GPT2, OP_BYTE};
static const jlm_preop L_FALCON[]    = {{.kind = 4}, OP_GPT2, {.kind = 6}, OP_BYTE};
static const jlm_preop L_DS_LLM[]    = {OP_RX("[\\r\\n]"), OP_RX(RX_DS_LETTERS), OP_RX(RX_DS_PUNCT),
                                        OP_RX("\\s+$"), OP_RX(RX_CJK), OP_DIGITS(0), OP_BYTE};
static const jlm_preop L_DS_CODER[]  = {OP_RX("[\\r\\n]"), OP_RX("\\s?\\p{L}+"), OP_RX("\\s?\\p{P}+"),
                                        OP_RX(RX_CJK), OP_DIGITS(1), OP_BYTE};
static const jlm_preop L_DS_V3[]     = {{.kind = 8, .digit_group = 3}, {.kind = 9}, OP_RX(RX_DSV3), OP_BYTE};
static const jlm_preop L_PORO[]      = {OP_RX(RX_PORO), OP_BYTE};
static const jlm_preop L_GPT4O[]     = {OP_RX(RX_O200K), OP_BYTE};
static const jlm_preop L_VIKING[]    = {OP_RX(RX_PORO), OP_DIGITS(1), OP_BYTE};

enum { PF_IGNORE_MERGES = 1, PF_ADD_BOS = 2, PF_NO_BOS = 4 };
#define LIST(l) l, sizeof(l) / sizeof(l[0])

static const struct pre_entry {
    const char *names;           /* '|'-separated tokenizer.ggml.pre values */
    const jlm_preop *ops;
    uint32_t n_ops;
    unsigned flags;
} k_pre[] = {
    {"default", LIST(L_DEFAULT), 0},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|jina-v1-en|"
     "jina-v2-code|roberta-bpe|mpt|olmo|jais|trillion|granite-docling|exaone4", LIST(L_GPT2), 0},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", LIST(L_LLAMA3),
     PF_IGNORE_MERGES | PF_ADD_BOS},
    {"dbrx|smaug-bpe", LIST(L_LLAMA3), 0},
    {"glm4|chatglm-bpe", LIST(L_LLAMA3), PF_NO_BOS},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open|grok-2", LIST(L_QWEN2), 0},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", LIST(L_STARCODER), 0},
    {"falcon", LIST(L_FALCON), 0},
    {"deepseek-llm", LIST(L_DS_LLM), 0},
    {"deepseek-coder", LIST(L_DS_CODER), 0},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", LIST(L_DS_V3), 0},
    {"poro-chat|bloom|gpt3-finnish", LIST(L_PORO), 0},
    {"viking", LIST(L_VIKING), 0},
    {"gpt-4o|llama4", LIST(L_GPT4O), 0},
};

/* 1 if name is one of the '|'-separated entries of list. */
static int in_list(const char *list, const char *name, size_t n)
{
    for (const char *p = list; *p;) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !memcmp(p, name, n))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

static const struct pre_entry *find_pre(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
        if (in_list(k_pre[i].names, name, n))
            return &k_pre[i];
    return NULL;
}

/* ================================================================ GGUF access */
typedef struct cv {
    const jlm_gguf *g;
    jlm_arena *a;
    jlm_err *err;
    const char *path;
} cv;

static int oom(cv *c) { return jlm_errf(c->err, JLM_ENOMEM, "%s: vocab: out of memory", c->path); }

static jlm_str adup(cv *c, const char *s, size_t n)
{
    char *d = jlm_arena_alloc(c->a, n + 1);
    if (d && n)
        memcpy(d, s, n);
    return (jlm_str){d, (uint32_t)n};
}

/* Optional scalar: 0 absent (*has 0), JLM_EFORMAT wrong type. */
static int opt_bool(cv *c, const char *key, uint8_t *v)
{
    int b, rc = jlm_gguf_get_bool(c->g, key, &b, c->err);
    if (rc == JLM_ENOTFOUND)
        return 0;
    if (rc)
        return rc;
    *v = (uint8_t)(b != 0);
    return 0;
}

/* A special-id key: kept only if it names a token (llama.cpp keeps the
 * default for an out-of-range value, e.g. 0xFFFFFFFF). */
static int opt_id(cv *c, const char *key, uint32_t n_tokens, int32_t *id)
{
    const jlm_gguf_kv *kv = jlm_gguf_find(c->g, key);
    if (!kv)
        return 0;
    int is_signed = kv->type == GGUF_T_I8 || kv->type == GGUF_T_I16 || kv->type == GGUF_T_I32 || kv->type == GGUF_T_I64;
    int is_int = is_signed || kv->type == GGUF_T_U8 || kv->type == GGUF_T_U16 || kv->type == GGUF_T_U32 ||
                 kv->type == GGUF_T_U64;
    if (!is_int)
        return jlm_errf(c->err, JLM_EFORMAT, "%s: %s is not an integer (type %u)", c->path, key, kv->type);
    if ((is_signed && kv->v.i >= 0 && (uint64_t)kv->v.i < n_tokens) || (!is_signed && kv->v.u < n_tokens))
        *id = (int32_t)kv->v.u;
    return 0;
}

static const jlm_gguf_kv *opt_array(cv *c, const char *key, uint32_t elem, int *rc)
{
    const jlm_gguf_kv *kv = jlm_gguf_find(c->g, key);
    *rc = 0;
    if (kv && (kv->type != GGUF_T_ARRAY || kv->arr_type != elem)) {
        *rc = jlm_errf(c->err, JLM_EFORMAT, "%s: %s is not an array of type %u", c->path, key, elem);
        return NULL;
    }
    return kv;
}

/* ================================================================ tokens, scores, kinds, merges */
static int read_tokens(cv *c, jlm_vocab *v)
{
    int rc;
    const jlm_gguf_kv *kv = opt_array(c, "tokenizer.ggml.tokens", GGUF_T_STRING, &rc);
    if (rc)
        return rc;
    if (!kv)
        return jlm_errf(c->err, JLM_ENOTFOUND, "%s: no tokenizer.ggml.tokens", c->path);
    if (kv->n > (uint64_t)INT32_MAX / 2)
        return jlm_errf(c->err, JLM_EFORMAT, "%s: %llu tokens", c->path, (unsigned long long)kv->n);
    const jlm_gguf_str *s = kv->arr;
    v->n_tokens = (uint32_t)kv->n;
    v->tokens = jlm_arena_alloc(c->a, (v->n_tokens ? v->n_tokens : 1) * sizeof(jlm_str));
    if (!v->tokens)
        return oom(c);
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (s[i].len > UINT32_MAX - 1)
            return jlm_errf(c->err, JLM_EFORMAT, "%s: token %u is %llu bytes", c->path, i, (unsigned long long)s[i].len);
        if (s[i].len) {
            v->tokens[i] = adup(c, s[i].s, s[i].len);
        } else {   /* llama.cpp: "[EMPTY_<id>]" */
            char nm[32];
            int n = snprintf(nm, sizeof nm, "[EMPTY_%u]", i);
            v->tokens[i] = adup(c, nm, (size_t)n);
        }
        if (!v->tokens[i].s)
            return oom(c);
    }
    return 0;
}

static int cmp_str(const void *a, const void *b, void *ctx)
{
    const jlm_str *t = ctx;
    const jlm_str *x = &t[*(const uint32_t *)a], *y = &t[*(const uint32_t *)b];
    size_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->s, y->s, n);
    return r ? r : (x->len > y->len) - (x->len < y->len);
}

/* llama.cpp refuses a vocabulary with two tokens of one text. */
static int check_unique(cv *c, const jlm_vocab *v)
{
    if (v->n_tokens < 2)
        return 0;
    uint32_t *ix = malloc(v->n_tokens * sizeof(uint32_t));
    if (!ix)
        return oom(c);
    for (uint32_t i = 0; i < v->n_tokens; i++)
        ix[i] = i;
    qsort_r(ix, v->n_tokens, sizeof(uint32_t), cmp_str, v->tokens);
    int rc = 0;
    for (uint32_t i = 1; i < v->n_tokens && !rc; i++)
        if (!cmp_str(&ix[i - 1], &ix[i], v->tokens))
            rc = jlm_errf(c->err, JLM_EFORMAT, "%s: duplicate token in vocabulary: ids %u and %u",
                          c->path, ix[i - 1] < ix[i] ? ix[i - 1] : ix[i], ix[i - 1] < ix[i] ? ix[i] : ix[i - 1]);
    free(ix);
    return rc;
}

static int read_scores_kinds(cv *c, jlm_vocab *v)
{
    const jlm_gguf_kv *kv = jlm_gguf_find(c->g, "tokenizer.ggml.scores");
    int rc;
    if (kv) {
        if (kv->type != GGUF_T_ARRAY || (kv->arr_type != GGUF_T_F32 && kv->arr_type != GGUF_T_I32))
            return jlm_errf(c->err, JLM_EFORMAT, "%s: tokenizer.ggml.scores is not an f32/i32 array", c->path);
        if (kv->n < v->n_tokens)
            return jlm_errf(c->err, JLM_EFORMAT, "%s: %llu scores for %u tokens", c->path, (unsigned long long)kv->n, v->n_tokens);
        v->n_scores = v->n_tokens;
        v->scores = jlm_arena_alloc(c->a, (v->n_tokens ? v->n_tokens : 1) * sizeof(float));
        if (!v->scores)
            return oom(c);
        for (uint32_t i = 0; i < v->n_tokens; i++) {
            int32_t x;
            memcpy(&x, (const uint8_t *)kv->arr + 4 * (size_t)i, 4);
            if (kv->arr_type == GGUF_T_F32)
                memcpy(&v->scores[i], &x, 4);
            else
                v->scores[i] = (float)x;
        }
    }
    /* Kinds are always written (all normal without the key): the EOG detection
     * below may turn some into control tokens, as llama.cpp's attributes. */
    kv = opt_array(c, "tokenizer.ggml.token_type", GGUF_T_I32, &rc);
    if (rc)
        return rc;
    if (kv && kv->n < v->n_tokens)
        return jlm_errf(c->err, JLM_EFORMAT, "%s: %llu token types for %u tokens", c->path, (unsigned long long)kv->n, v->n_tokens);
    v->n_token_kinds = v->n_tokens;
    v->token_kinds = jlm_arena_alloc(c->a, v->n_tokens ? v->n_tokens : 1);
    if (!v->token_kinds)
        return oom(c);
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        int32_t x = JLM_TOK_NORMAL;
        if (kv)
            memcpy(&x, (const uint8_t *)kv->arr + 4 * (size_t)i, 4);
        v->token_kinds[i] = (x >= JLM_TOK_NORMAL && x <= JLM_TOK_BYTE) ? (uint8_t)x : 0;
    }
    return 0;
}

/* "left right" split at the first space after byte 0, as llama.cpp does. */
static int read_merges(cv *c, jlm_vocab *v)
{
    int rc;
    const jlm_gguf_kv *kv = opt_array(c, "tokenizer.ggml.merges", GGUF_T_STRING, &rc);
    if (rc)
        return rc;
    if (!kv)
        return jlm_errf(c->err, JLM_ENOTFOUND, "%s: gpt2 tokenizer without tokenizer.ggml.merges", c->path);
    if (kv->n > (uint64_t)INT32_MAX / 2)
        return jlm_errf(c->err, JLM_EFORMAT, "%s: %llu merges", c->path, (unsigned long long)kv->n);
    const jlm_gguf_str *s = kv->arr;
    v->n_merges = (uint32_t)kv->n;
    v->merges = jlm_arena_alloc(c->a, (v->n_merges ? 2 * (size_t)v->n_merges : 1) * sizeof(jlm_str));
    if (!v->merges)
        return oom(c);
    for (uint32_t i = 0; i < v->n_merges; i++) {
        const char *sp = s[i].len > 1 ? memchr(s[i].s + 1, ' ', s[i].len - 1) : NULL;
        if (s[i].len > UINT32_MAX - 1)
            return jlm_errf(c->err, JLM_EFORMAT, "%s: merge %u too long", c->path, i);
        size_t at = sp ? (size_t)(sp - s[i].s) : 0;
        v->merges[2 * (size_t)i] = adup(c, s[i].s, at);
        v->merges[2 * (size_t)i + 1] = sp ? adup(c, sp + 1, s[i].len - at - 1) : adup(c, "", 0);
        if (!v->merges[2 * (size_t)i].s || !v->merges[2 * (size_t)i + 1].s)
            return oom(c);
    }
    return 0;
}

/* ================================================================ special tokens, EOG, added tokens */
static const char *const k_eot[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<" NAME_FW_BAR "end" NAME_SPC "of" NAME_SPC "sentence" NAME_FW_BAR ">",
    "<end_of_utterance>", NULL};
static const char *const k_eom[] = {"<|eom_id|>", NULL};
static const char *const k_fim_pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
    "<" NAME_FW_BAR "fim" NAME_SPC "begin" NAME_FW_BAR ">", "<PRE>", NAME_SPC "<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const k_fim_suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<" NAME_FW_BAR "fim" NAME_SPC "hole" NAME_FW_BAR ">", "<SUF>", NAME_SPC "<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const k_fim_mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
    "<" NAME_FW_BAR "fim" NAME_SPC "end" NAME_FW_BAR ">", "<MID>", NAME_SPC "<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const k_fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const k_fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
static const char *const k_fim_sep[] = {"<|file_sep|>", NULL};
static const char *const k_eog[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" NAME_FW_BAR "end" NAME_SPC "of" NAME_SPC "sentence" NAME_FW_BAR ">", "[e~[", NULL};

static int str_is(const jlm_str *s, const char *lit) { return s->len == strlen(lit) && !memcmp(s->s, lit, s->len); }

static int in_names(const jlm_str *s, const char *const *names)
{
    for (; *names; names++)
        if (str_is(s, *names))
            return 1;
    return 0;
}

static int32_t find_text(const jlm_vocab *v, const char *lit)
{
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (str_is(&v->tokens[i], lit))
            return (int32_t)i;
    return -1;
}

static void make_control(jlm_vocab *v, int32_t id)
{
    if (id >= 0 && v->n_token_kinds)
        v->token_kinds[id] = JLM_TOK_CONTROL;
}

/* May token i be found by its spelling (an EOG/EOT/FIM name) and made a
 * control token? Any token in a GGUF (llama.cpp's "control-looking token");
 * from a Hugging Face tokenizer.json (the key tokenizer.hf.added_only,
 * converter/hf_tok.c) only an added token: a model.vocab entry spelled like
 * one (Qwen3's "</s>") is text there, as HF tokenizers splits it. */
static int may_look_special(const jlm_vocab *v, int added_only, uint32_t i)
{
    if (!added_only || !v->n_token_kinds)
        return 1;
    uint8_t k = v->token_kinds[i];
    return k == JLM_TOK_CONTROL || k == JLM_TOK_USER || k == JLM_TOK_UNKNOWN;
}

/* An unset slot takes the first token (lowest id) whose text is in names,
 * which becomes a control token (llama.cpp's "control-looking token"). */
static void detect(jlm_vocab *v, int added_only, int32_t *slot, const char *const *names)
{
    if (*slot >= 0)
        return;
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (may_look_special(v, added_only, i) && in_names(&v->tokens[i], names)) {
            *slot = (int32_t)i;
            make_control(v, *slot);
            return;
        }
}

typedef struct idset { int32_t *p; uint32_t n; } idset;

static void set_add(idset *s, int32_t id)
{
    if (id < 0)
        return;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->p[i] == id)
            return;
    s->p[s->n++] = id;
}

static void set_del(idset *s, int32_t id)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (s->p[i] == id) {
            s->p[i] = s->p[--s->n];
            return;
        }
}

static int32_t set_find(const jlm_vocab *v, const idset *s, const char *lit)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (str_is(&v->tokens[s->p[i]], lit))
            return s->p[i];
    return -1;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* EOT/EOM/FIM detection, the end-of-generation set and its workarounds, in
 * llama.cpp's order; the set minus EOS becomes the Stop tail. */
static int build_eog(cv *c, jlm_vocab *v)
{
    int32_t eot = -1, eom = -1, fim[6] = {-1, -1, -1, -1, -1, -1};
    static const char *const fim_keys[6][2] = {
        {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
        {"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
        {"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
        {"tokenizer.ggml.fim_pad_token_id", NULL}, {"tokenizer.ggml.fim_rep_token_id", NULL},
        {"tokenizer.ggml.fim_sep_token_id", NULL}};
    static const char *const *fim_names[6] = {k_fim_pre, k_fim_suf, k_fim_mid, k_fim_pad, k_fim_rep, k_fim_sep};
    int rc;
    if ((rc = opt_id(c, "tokenizer.ggml.eot_token_id", v->n_tokens, &eot)) ||
        (rc = opt_id(c, "tokenizer.ggml.eom_token_id", v->n_tokens, &eom)))
        return rc;
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 2; j++)
            if (fim_keys[i][j] && (rc = opt_id(c, fim_keys[i][j], v->n_tokens, &fim[i])))
                return rc;
    const jlm_gguf_kv *ao = jlm_gguf_find(c->g, "tokenizer.hf.added_only");
    int added_only = ao && ao->type == GGUF_T_BOOL && ao->v.b;
    detect(v, added_only, &eot, k_eot);
    detect(v, added_only, &eom, k_eom);
    for (int i = 0; i < 6; i++)
        detect(v, added_only, &fim[i], fim_names[i]);

    idset s = {jlm_arena_alloc(c->a, (v->n_tokens + 8) * sizeof(int32_t)), 0};
    if (!s.p)
        return oom(c);
    set_add(&s, fim[3]);
    set_add(&s, fim[4]);
    set_add(&s, fim[5]);
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (may_look_special(v, added_only, i) && in_names(&v->tokens[i], k_eog)) {
            set_add(&s, (int32_t)i);
            make_control(v, (int32_t)i);
        }
    static const char *const always_user[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (int i = 0; i < 4 && v->n_token_kinds; i++) {   /* gpt-oss: always rendered */
        int32_t id = find_text(v, always_user[i]);
        if (id >= 0)
            v->token_kinds[id] = JLM_TOK_USER;
    }
    set_add(&s, v->eos);
    set_add(&s, eot);
    set_add(&s, eom);
    const jlm_gguf_kv *gk = jlm_gguf_find(c->g, "tokenizer.ggml.eog_token_ids");   /* HF generation_config.json */
    for (uint64_t i = 0; gk && gk->type == GGUF_T_ARRAY && gk->arr_type == GGUF_T_I32 && i < gk->n; i++) {
        int32_t id;
        memcpy(&id, (const char *)gk->arr + 4 * i, 4);
        if (id >= 0 && (uint32_t)id < v->n_tokens)
            set_add(&s, id);
    }
    int32_t end = set_find(v, &s, "<|end|>");
    int has_call = set_find(v, &s, "<|call|>") >= 0 || set_find(v, &s, "<|calls|>") >= 0;
    int has_ret_or_flush = set_find(v, &s, "<|return|>") >= 0 || set_find(v, &s, "<|flush|>") >= 0;
    if (end >= 0 && has_call && has_ret_or_flush) {
        set_del(&s, end);                                 /* o200k_harmony, solar-open */
        if (v->n_token_kinds)
            v->token_kinds[end] = JLM_TOK_USER;
    }
    int32_t es = set_find(v, &s, "</s>");
    if (es >= 0 && set_find(v, &s, "<|tool_response>") >= 0) {
        set_del(&s, es);                                  /* gemma4, paddleocr */
        if (v->n_token_kinds)
            v->token_kinds[es] = JLM_TOK_NORMAL;
    }
    set_del(&s, v->eos);
    qsort(s.p, s.n, sizeof(int32_t), cmp_i32);
    v->n_stop = s.n;
    v->stop = s.p;
    return 0;
}

static void lower_ascii(char *d, const char *s, size_t n, size_t cap)
{
    size_t i = 0;
    for (; i < n && i + 1 < cap; i++)
        d[i] = (char)tolower((unsigned char)s[i]);
    d[i] = 0;
}

/* Added tokens = llama.cpp's special-token cache: control, user-defined and
 * unknown tokens, with its per-model lstrip/rstrip attributes. */
static int build_added(cv *c, jlm_vocab *v, const char *pre)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < v->n_token_kinds; i++)
        n += v->token_kinds[i] == JLM_TOK_CONTROL || v->token_kinds[i] == JLM_TOK_USER || v->token_kinds[i] == JLM_TOK_UNKNOWN;
    v->added = jlm_arena_alloc(c->a, (n ? n : 1) * sizeof(jlm_added_token));
    if (!v->added)
        return oom(c);
    char name[128] = "", arch[128] = "";
    jlm_gguf_str gs;
    if (!jlm_gguf_get_str(c->g, "general.name", &gs, NULL))
        lower_ascii(name, gs.s, gs.len, sizeof name);
    if (!jlm_gguf_get_str(c->g, "general.architecture", &gs, NULL))
        lower_ascii(arch, gs.s, gs.len, sizeof arch);
    int phi3 = strstr(name, "phi-3") || strstr(name, "phi3");
    int lmask = strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code") ||
                strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3");
    int lMASK = !lmask && !phi3 && strstr(name, "modern-bert");
    for (uint32_t i = 0; i < v->n_token_kinds; i++) {
        uint8_t k = v->token_kinds[i];
        if (k != JLM_TOK_CONTROL && k != JLM_TOK_USER && k != JLM_TOK_UNKNOWN)
            continue;
        jlm_added_token *t = &v->added[v->n_added++];
        t->id = (int32_t)i;
        t->content = v->tokens[i];
        t->special = k != JLM_TOK_USER;
        t->rstrip = phi3 && !str_is(&t->content, "<unk>") && !str_is(&t->content, "<s>") &&
                    !str_is(&t->content, "<|endoftext|>");
        t->lstrip = (lmask && str_is(&t->content, "<mask>")) || (lMASK && str_is(&t->content, "[MASK]"));
    }
    return 0;
}

/* ================================================================ chat templates */
static int read_templates(cv *c, jlm_vocab *v)
{
    static const char base[] = "tokenizer.chat_template";
    uint32_t n = 0;
    for (uint64_t i = 0; i < c->g->n_kv; i++)
        n += !strncmp(c->g->kv[i].key.s, base, sizeof base - 1);
    if (!n)
        return 0;
    v->templates = jlm_arena_alloc(c->a, 2 * (size_t)n * sizeof(jlm_str));
    if (!v->templates)
        return oom(c);
    for (uint64_t i = 0; i < c->g->n_kv; i++) {
        const jlm_gguf_kv *kv = &c->g->kv[i];
        const char *k = kv->key.s;
        if (strncmp(k, base, sizeof base - 1) || (k[sizeof base - 1] != 0 && k[sizeof base - 1] != '.'))
            continue;
        if (kv->type != GGUF_T_STRING)
            return jlm_errf(c->err, JLM_EFORMAT, "%s: %s is not a string", c->path, k);
        if (kv->v.str.len > UINT32_MAX - 1)
            return jlm_errf(c->err, JLM_EFORMAT, "%s: %s is too long", c->path, k);
        const char *nm = k[sizeof base - 1] ? k + sizeof base : "";
        jlm_str *t = &v->templates[2 * (size_t)v->n_templates++];
        t[0] = adup(c, nm, strlen(nm));
        t[1] = adup(c, kv->v.str.s, kv->v.str.len);
        if (!t[0].s || !t[1].s)
            return oom(c);
    }
    return 0;
}

/* ================================================================ the whole vocab */
/* Type defaults, pre-tokenizer stages and flags (llama_vocab::impl::load). */
static int type_defaults(cv *c, jlm_vocab *v, const char *model, const jlm_gguf_str *pre)
{
    const jlm_preop *ops = NULL;
    uint32_t n_ops = 0;
    if (!strcmp(model, "llama")) {
        v->kind = JLM_VOCAB_SPM;
        v->bos = 1; v->eos = 2; v->unk = 0;
        v->add_bos = 1; v->add_space_prefix = 1; v->byte_fallback = 1;
    } else if (!strcmp(model, "bert")) {
        static const jlm_preop bert = {.kind = 5};
        uint8_t lower = 1, strip;
        int rc = opt_bool(c, "tokenizer.ggml.normalizer.lowercase", &lower);
        strip = lower;
        if (rc || (rc = opt_bool(c, "tokenizer.ggml.normalizer.strip_accents", &strip)))
            return rc;
        v->kind = JLM_VOCAB_WPM;
        v->bos = 101; v->unk = 100; v->sep = 102; v->pad = 0; v->mask = 103;
        v->add_bos = 1; v->add_eos = 1;   /* [CLS] ... [SEP]: WPM's AddEOS appends Sep */
        jlm_preop *op = jlm_arena_alloc(c->a, sizeof *op);
        if (!op)
            return oom(c);
        *op = bert;
        op->case_fold = lower;
        op->letter_marks = !strip;
        v->preops = op;
        v->n_preops = 1;
        return 0;
    } else if (!strcmp(model, "gpt2")) {
        const char *nm = pre && pre->len ? pre->s : "default";
        const struct pre_entry *e = find_pre(nm, strlen(nm));
        if (!e)
            return jlm_errf(c->err, JLM_EUNSUPPORTED, "%s: unknown pre-tokenizer type '%s' (docs/tokenizer.md lists the supported ones)", c->path, nm);
        v->kind = JLM_VOCAB_BPE;
        v->bos = (e->flags & PF_NO_BOS) ? -1 : 11;
        v->eos = 11;
        v->add_bos = (e->flags & PF_ADD_BOS) != 0;
        v->ignore_merges = (e->flags & PF_IGNORE_MERGES) != 0;
        ops = e->ops;
        n_ops = e->n_ops;
    } else {
        return jlm_errf(c->err, JLM_EUNSUPPORTED, "%s: tokenizer model '%s' is not supported (llama, gpt2, bert)", c->path, model);
    }
    /* tokenizer.ggml.normalizer (ours, from an HF tokenizer.json's NFC
     * normalizer): a first stage of Kind 5 with Behavior "nfc" (docs/tokenizer.md). */
    jlm_gguf_str nm;
    int nfc = jlm_gguf_get_str(c->g, "tokenizer.ggml.normalizer", &nm, NULL) == 0;
    if (nfc && (strcmp(nm.s, "nfc") || v->kind != JLM_VOCAB_BPE))
        return jlm_errf(c->err, JLM_EUNSUPPORTED, "%s: tokenizer.ggml.normalizer '%.40s' is not supported (nfc, on a gpt2 vocab, only)",
                        c->path, nm.s);
    if (n_ops || nfc) {
        v->preops = jlm_arena_alloc(c->a, (n_ops + (uint32_t)nfc) * sizeof(jlm_preop));
        if (!v->preops)
            return oom(c);
        if (nfc) {
            static const jlm_preop NFC = {.kind = 5, .letter_marks = 1, .behavior = {"nfc", 3}};
            v->preops[0] = NFC;
        }
        if (n_ops)
            memcpy(v->preops + nfc, ops, n_ops * sizeof(jlm_preop));
        v->n_preops = n_ops + (uint32_t)nfc;
    }
    return 0;
}

static int read_specials(cv *c, jlm_vocab *v)
{
    int32_t *ids[6] = {&v->bos, &v->eos, &v->unk, &v->sep, &v->pad, &v->mask};
    static const char *const keys[6] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
        "tokenizer.ggml.padding_token_id", "tokenizer.ggml.mask_token_id"};
    int rc;
    for (int i = 0; i < 6; i++) {
        if (*ids[i] >= 0 && (uint32_t)*ids[i] >= v->n_tokens)
            *ids[i] = -1;                /* a default outside the vocab is disabled */
        if ((rc = opt_id(c, keys[i], v->n_tokens, ids[i])))
            return rc;
    }
    if (v->kind != JLM_VOCAB_WPM) {      /* llama.cpp's WPM ignores these when tokenizing */
        if ((rc = opt_bool(c, "tokenizer.ggml.add_bos_token", &v->add_bos)) ||
            (rc = opt_bool(c, "tokenizer.ggml.add_eos_token", &v->add_eos)))
            return rc;
    }
    if ((rc = opt_bool(c, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix)))
        return rc;
    if (v->add_bos && v->bos < 0)
        return jlm_errf(c->err, JLM_EFORMAT, "%s: tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set", c->path);
    if (v->add_eos && (v->kind == JLM_VOCAB_WPM ? v->sep : v->eos) < 0)
        return jlm_errf(c->err, JLM_EFORMAT, "%s: add_eos/add_sep is true, but its token id is not set", c->path);
    return 0;
}

int jlm_conv_vocab(const jlm_gguf *g, jlm_arena *a, jlm_vocab *out, jlm_err *err)
{
    cv c = {g, a, err, g->path ? g->path : "gguf"};
    jlm_vocab v;
    memset(&v, 0, sizeof v);
    v.bos = v.eos = v.unk = v.pad = v.sep = v.mask = -1;
    jlm_gguf_str model, pre = {NULL, 0};
    int rc = jlm_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc)
        return rc == JLM_ENOTFOUND ? jlm_errf(err, rc, "%s: no tokenizer.ggml.model", c.path) : rc;
    rc = jlm_gguf_get_str(g, K_PRE, &pre, err);
    if (rc && rc != JLM_ENOTFOUND)
        return rc;
    if (!strcmp(model.s, "none") || !strcmp(model.s, "no_vocab")) {
        *out = v;
        return 0;
    }
    if ((rc = type_defaults(&c, &v, model.s, &pre)) || (rc = read_tokens(&c, &v)) ||
        (rc = check_unique(&c, &v)) || (rc = read_scores_kinds(&c, &v)) ||
        (v.kind == JLM_VOCAB_BPE && (rc = read_merges(&c, &v))) || (rc = read_specials(&c, &v)) ||
        (rc = build_eog(&c, &v)) || (rc = build_added(&c, &v, pre.s ? pre.s : "")) ||
        (rc = read_templates(&c, &v)))
        return rc;
    if (pre.s && !(v.pre_name = adup(&c, pre.s, pre.len)).s)
        return oom(&c);
    if (v.n_stop) {                      /* invariant 4: the Stop tail needs this one */
        v.n_punct_no_newline = v.n_preops;
        v.punct_no_newline = jlm_arena_alloc(a, v.n_preops ? v.n_preops : 1);
        if (!v.punct_no_newline)
            return oom(&c);
    }
    *out = v;
    return 0;
}
