/* test_tokenizer.c - suite `tokenizer`: converter/vocab.c + text/tokenizer/tokenizer.c
 * against llama.cpp's own test vectors (the .inp/.out files of tests/models/vocab, made
 * by test-tokenizer-0 with add_special=false, parse_special=false) and the
 * prompt/generation oracles in tests/reference/.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "converter/gguf.h"
#include "converter/vocab.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_int.h"
#include "format/jlm_format.h"

/* ================================================================ fixtures */
static char *fixture(const char *rel)
{
    const char *root = getenv("JLM_ROOT");
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 1024, "%s/%s", root ? root : ".", rel);
    return p;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert(b && fread(b, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

typedef struct loaded {
    jlm_arena *arena;
    jlm_vocab  vocab;
    jlm_tok   *tok;
} loaded;

/* GGUF -> jlm_vocab (jlm_conv_vocab) -> jlm_tok; the GGUF is closed before the
 * tokenizer is built, so nothing may point into it. */
static void load(const char *rel, loaded *L)
{
    jlm_err err = {0};
    jlm_gguf *g = NULL;
    const char *path = fixture(rel);
    cr_assert_eq(jlm_gguf_open(path, &g, &err), 0, "open %s: %s", path, err.msg);
    L->arena = jlm_arena_new();
    cr_assert(L->arena);
    cr_assert_eq(jlm_conv_vocab(g, L->arena, &L->vocab, &err), 0, "convert %s: %s", path, err.msg);
    jlm_gguf_close(g);
    cr_assert_eq(jlm_tok_create(&L->vocab, &L->tok, &err), 0, "tokenizer for %s: %s", path, err.msg);
}

static void unload(loaded *L)
{
    jlm_tok_destroy(L->tok);
    jlm_arena_free(L->arena);
}

/* The .inp strings (each followed by "\n__ggml_vocab_test__\n") and the .out id lines. */
typedef struct vectors {
    char *inp, *out;
    size_t n;
    const char *text[128];
    size_t text_len[128];
    int32_t *ids[128];
    size_t n_ids[128];
} vectors;

static void read_vectors(const char *name, vectors *V)
{
    char rel[256];
    size_t len;
    static const char sep[] = "\n__ggml_vocab_test__\n";
    snprintf(rel, sizeof rel, "tests/models/vocab/%s.inp", name);
    V->inp = slurp(fixture(rel), &len);
    V->n = 0;
    for (char *p = V->inp, *e; (e = strstr(p, sep)); p = e + sizeof sep - 1) {
        cr_assert(V->n < 128);
        *e = 0;
        V->text[V->n] = p;
        V->text_len[V->n++] = (size_t)(e - p);
    }
    snprintf(rel, sizeof rel, "tests/models/vocab/%s.out", name);
    V->out = slurp(fixture(rel), &len);
    size_t line = 0;
    for (char *p = V->out; *p && line < V->n; line++) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = 0;
        V->ids[line] = malloc(sizeof(int32_t) * (strlen(p) / 2 + 1));
        V->n_ids[line] = 0;
        for (char *q = p, *end; *q; q = end) {
            long x = strtol(q, &end, 10);
            if (end == q)
                break;
            V->ids[line][V->n_ids[line]++] = (int32_t)x;
        }
        p = nl ? nl + 1 : p + strlen(p);
    }
    cr_assert_eq(line, V->n, "%s: %zu expected-id lines for %zu strings", name, line, V->n);
}

static void free_vectors(vectors *V)
{
    for (size_t i = 0; i < V->n; i++)
        free(V->ids[i]);
    free(V->inp);
    free(V->out);
}

static void fmt_ids(char *buf, size_t cap, const int32_t *ids, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && o + 12 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, " %d", ids[i]);
}

/* Every vector of `name` through tok: first mismatch reported with the text. */
static void check_vectors(const char *name, const jlm_tok *tok, const vectors *V)
{
    for (size_t i = 0; i < V->n; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        jlm_err err = {0};
        cr_assert_eq(jlm_tok_encode(tok, V->text[i], V->text_len[i], 0, 0, &ids, &n, &err), 0, "%s", err.msg);
        int same = n == V->n_ids[i] && (n == 0 || !memcmp(ids, V->ids[i], n * sizeof(int32_t)));
        if (!same) {
            char e[4096], a[4096];
            fmt_ids(e, sizeof e, V->ids[i], V->n_ids[i]);
            fmt_ids(a, sizeof a, ids, n);
            cr_assert_fail("%s: string %zu \"%s\"\n  expected:%s\n  actual:  %s", name, i, V->text[i], e, a);
        }
        free(ids);
    }
}

static void vocab_ids_match(const char *name)
{
    char rel[256];
    loaded L;
    vectors V;
    snprintf(rel, sizeof rel, "tests/models/vocab/%s", name);
    load(rel, &L);
    read_vectors(name, &V);
    cr_assert_eq(V.n, 46, "%s: %zu test strings, expected 46", name, V.n);
    check_vectors(name, L.tok, &V);
    free_vectors(&V);
    unload(&L);
}

/* ================================================================ llama.cpp's vectors, one test per vocab */
#define VOCAB_TEST(tname, file) \
    Test(tokenizer, tname, .timeout = 30) { vocab_ids_match(file); }

VOCAB_TEST(llama_spm_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-llama-spm.gguf")
VOCAB_TEST(phi_3_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-phi-3.gguf")
VOCAB_TEST(gpt_2_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-gpt-2.gguf")
VOCAB_TEST(mpt_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-mpt.gguf")
VOCAB_TEST(starcoder_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-starcoder.gguf")
VOCAB_TEST(refact_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-refact.gguf")
VOCAB_TEST(falcon_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-falcon.gguf")
VOCAB_TEST(deepseek_llm_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-deepseek-llm.gguf")
VOCAB_TEST(deepseek_coder_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-deepseek-coder.gguf")
VOCAB_TEST(bert_bge_vocab_gives_llama_cpp_ids_for_every_vector, "ggml-vocab-bert-bge.gguf")

/* ================================================================ round trip */
/* SPM and byte-level BPE represent every byte (SPM through <0xNN> fallback),
 * so decode(encode(s)) == s; decode drops the one space SPM's prefix added.
 * WPM is left out: its normalisation (lowercase, accents, whitespace) is lossy. */
static const char *const k_lossless[] = {
    "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-mpt.gguf",
    "ggml-vocab-starcoder.gguf", "ggml-vocab-refact.gguf", "ggml-vocab-falcon.gguf",
    "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-deepseek-coder.gguf"};

Test(tokenizer, decoding_the_ids_of_every_vector_gives_back_its_bytes_for_spm_and_bpe, .timeout = 60)
{
    for (size_t f = 0; f < sizeof k_lossless / sizeof k_lossless[0]; f++) {
        char rel[256];
        loaded L;
        vectors V;
        snprintf(rel, sizeof rel, "tests/models/vocab/%s", k_lossless[f]);
        load(rel, &L);
        read_vectors(k_lossless[f], &V);
        for (size_t i = 0; i < V.n; i++) {
            char *text = NULL;
            size_t len = 0;
            jlm_err err = {0};
            cr_assert_eq(jlm_tok_decode(L.tok, V.ids[i], V.n_ids[i], 0, &text, &len, &err), 0, "%s", err.msg);
            cr_assert(len == V.text_len[i] && !memcmp(text, V.text[i], len),
                      "%s: string %zu: expected \"%s\" (%zu bytes), decoded \"%s\" (%zu bytes)",
                      k_lossless[f], i, V.text[i], V.text_len[i], text, len);
            free(text);
        }
        free_vectors(&V);
        unload(&L);
    }
}

/* ================================================================ oracles: prompts and generations */
static void oracle_prompts(const char *model, const char *oracle)
{
    loaded L;
    json_error_t je;
    load(model, &L);
    json_t *root = json_load_file(fixture(oracle), 0, &je);
    cr_assert(root, "%s: %s", oracle, je.text);
    json_t *runs = json_object_get(root, "runs");
    cr_assert(json_array_size(runs) >= 2, "%s: no runs", oracle);
    for (size_t r = 0; r < json_array_size(runs); r++) {
        json_t *run = json_array_get(runs, r), *want = json_object_get(run, "prompt_ids");
        const char *prompt = json_string_value(json_object_get(run, "prompt"));
        cr_assert(prompt && json_is_array(want));
        int32_t *ids = NULL;
        size_t n = 0;
        jlm_err err = {0};
        cr_assert_eq(jlm_tok_encode(L.tok, prompt, strlen(prompt), 1, 0, &ids, &n, &err), 0, "%s", err.msg);
        int same = n == json_array_size(want);
        for (size_t i = 0; same && i < n; i++)
            same = ids[i] == json_integer_value(json_array_get(want, i));
        char a[1024];
        fmt_ids(a, sizeof a, ids, n);
        char *e = json_dumps(want, JSON_COMPACT);
        cr_assert(same, "%s: prompt \"%s\": expected %s, got%s", model, prompt, e, a);
        free(e);
        free(ids);
    }
    json_decref(root);
    unload(&L);
}

Test(tokenizer, stories260k_prompts_with_bos_give_the_oracle_prompt_ids, .timeout = 30)
{
    oracle_prompts("tests/models/stories260K.gguf", "tests/reference/oracle-stories260K.exact.json");
}

Test(tokenizer, llama_2_tiny_random_prompts_with_bos_give_the_oracle_prompt_ids, .timeout = 30)
{
    oracle_prompts("tests/models/llama-2-tiny-random.gguf", "tests/reference/oracle-llama-2-tiny-random.exact.json");
}

static int unhex(const char *h, uint8_t *out, size_t cap)
{
    size_t n = strlen(h) / 2;
    cr_assert(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned x;
        cr_assert_eq(sscanf(h + 2 * i, "%2x", &x), 1);
        out[i] = (uint8_t)x;
    }
    return (int)n;
}

/* llama.cpp prints each generated token's piece as it comes; streaming the
 * generated ids must give the same bytes, each chunk ending on a UTF-8 boundary. */
static void oracle_stream(const char *model, const char *oracle)
{
    loaded L;
    json_error_t je;
    load(model, &L);
    json_t *root = json_load_file(fixture(oracle), 0, &je);
    cr_assert(root, "%s: %s", oracle, je.text);
    json_t *runs = json_object_get(root, "runs");
    for (size_t r = 0; r < json_array_size(runs); r++) {
        json_t *run = json_array_get(runs, r), *gen = json_object_get(run, "generated_ids");
        static uint8_t want[8192];
        int nw = unhex(json_string_value(json_object_get(run, "generated_text_hex")), want, sizeof want);
        char got[8192], chunk[512];
        size_t ng = 0, nc;
        jlm_tok_stream s;
        jlm_err err = {0};
        jlm_tok_stream_init(&s, L.tok, 0, 0);
        cr_assert(jlm_tok_max_piece_len(L.tok) + 4 <= sizeof chunk);
        for (size_t i = 0; i < json_array_size(gen); i++) {
            int32_t id = (int32_t)json_integer_value(json_array_get(gen, i));
            cr_assert_eq(jlm_tok_stream_feed(&s, id, chunk, sizeof chunk, &nc, &err), 0, "%s", err.msg);
            if (nc) {   /* a chunk never ends inside a multi-byte sequence */
                uint8_t last = (uint8_t)chunk[nc - 1];
                cr_assert(last < 0xC0, "%s: chunk after token %zu ends with lead byte 0x%02x", model, i, last);
            }
            memcpy(got + ng, chunk, nc);
            ng += nc;
        }
        ng += jlm_tok_stream_flush(&s, got + ng);
        cr_assert(ng == (size_t)nw && !memcmp(got, want, ng),
                  "%s run %zu: streamed %zu bytes \"%.*s\", oracle has %d bytes \"%.*s\"",
                  model, r, ng, (int)ng, got, nw, nw, (const char *)want);
    }
    json_decref(root);
    unload(&L);
}

Test(tokenizer, streaming_stories260k_generations_gives_the_oracle_text, .timeout = 30)
{
    oracle_stream("tests/models/stories260K.gguf", "tests/reference/oracle-stories260K.exact.json");
}

Test(tokenizer, streaming_llama_2_tiny_random_generations_gives_the_oracle_text, .timeout = 30)
{
    oracle_stream("tests/models/llama-2-tiny-random.gguf", "tests/reference/oracle-llama-2-tiny-random.exact.json");
}

/* ================================================================ streaming: a split character */
Test(tokenizer, stream_holds_back_a_multibyte_char_split_across_byte_tokens, .timeout = 30)
{
    loaded L;
    load("tests/models/llama-2-tiny-random.gguf", &L);
    const char *text = "\xf0\x9f\xa6\x99";      /* U+1F999, not in the 32k vocab: 4 <0xNN> tokens */
    int32_t *ids = NULL;
    size_t n = 0;
    jlm_err err = {0};
    cr_assert_eq(jlm_tok_encode(L.tok, text, 4, 0, 0, &ids, &n, &err), 0, "%s", err.msg);
    /* ids: the space prefix, then one byte token per byte */
    cr_assert(n >= 4, "expected byte fallback tokens, got %zu ids", n);
    jlm_tok_stream s;
    jlm_tok_stream_init(&s, L.tok, 0, 1);
    char out[512], all[64];
    size_t nc, na = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(jlm_tok_stream_feed(&s, ids[i], out, sizeof out, &nc, &err), 0, "%s", err.msg);
        if (i + 1 < n)
            cr_assert_eq(nc, 0, "token %zu of %zu let out %zu bytes of an incomplete character", i, n, nc);
        else
            cr_assert(nc == 4 && !memcmp(out, text, 4), "last token gave %zu bytes, expected the whole character", nc);
        memcpy(all + na, out, nc);
        na += nc;
    }
    cr_assert_eq(jlm_tok_stream_flush(&s, out), 0, "nothing may remain held");
    free(ids);
    unload(&L);
}

Test(tokenizer, stream_flush_hands_out_a_truncated_sequence_at_the_end, .timeout = 30)
{
    loaded L;
    load("tests/models/llama-2-tiny-random.gguf", &L);
    jlm_err err = {0};
    char out[512];
    size_t nc;
    jlm_tok_stream s;
    jlm_tok_stream_init(&s, L.tok, 0, 0);
    int32_t b = -1;
    for (uint32_t i = 0; i < jlm_tok_n_tokens(L.tok); i++)   /* the <0xE2> byte token */
        if (!strcmp(L.vocab.tokens[i].s, "<0xE2>"))
            b = (int32_t)i;
    cr_assert(b >= 0, "no <0xE2> token in the llama-2 vocab");
    cr_assert_eq(jlm_tok_stream_feed(&s, b, out, sizeof out, &nc, &err), 0, "%s", err.msg);
    cr_assert_eq(nc, 0, "a lone lead byte must be held, %zu bytes came out", nc);
    cr_assert_eq(jlm_tok_stream_flush(&s, out), 1, "flush must hand out the held byte");
    cr_assert_eq((uint8_t)out[0], 0xE2);
    unload(&L);
}

/* ================================================================ special tokens */
Test(tokenizer, parse_special_turns_control_token_text_into_the_token, .timeout = 30)
{
    loaded L;
    load("tests/models/vocab/ggml-vocab-llama-spm.gguf", &L);
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    jlm_err err = {0};
    cr_assert_eq(jlm_tok_encode(L.tok, "<s>Hello", 8, 0, 1, &a, &na, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_tok_encode(L.tok, "Hello", 5, 0, 0, &b, &nb, &err), 0, "%s", err.msg);
    /* after a special token SPM prefixes a space, as it does at the start */
    cr_assert(na == nb + 1 && a[0] == L.vocab.bos && !memcmp(a + 1, b, nb * sizeof(int32_t)),
              "\"<s>Hello\" with parse_special: expected BOS + ids of \"Hello\"");
    free(a);
    cr_assert_eq(jlm_tok_encode(L.tok, "<s>Hello", 8, 0, 0, &a, &na, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < na; i++)
        cr_assert_neq(a[i], L.vocab.bos, "without parse_special \"<s>\" must stay text");
    free(a);
    free(b);
    unload(&L);
}

Test(tokenizer, control_tokens_give_no_piece_unless_asked, .timeout = 30)
{
    loaded L;
    load("tests/models/vocab/ggml-vocab-llama-spm.gguf", &L);
    const char *p;
    size_t n;
    jlm_err err = {0};
    cr_assert_eq(jlm_tok_piece(L.tok, L.vocab.eos, 0, &p, &n, &err), 0);
    cr_assert_eq(n, 0, "EOS piece without special: %zu bytes", n);
    cr_assert_eq(jlm_tok_piece(L.tok, L.vocab.eos, 1, &p, &n, &err), 0);
    cr_assert(n == 4 && !memcmp(p, "</s>", 4), "EOS piece with special: \"%.*s\"", (int)n, p);
    cr_assert_eq(jlm_tok_piece(L.tok, -1, 0, &p, &n, &err), JLM_ERANGE);
    cr_assert_eq(jlm_tok_piece(L.tok, (int32_t)jlm_tok_n_tokens(L.tok), 0, &p, &n, &err), JLM_ERANGE);
    unload(&L);
}

/* ================================================================ the record codec */
static const char *const k_all[] = {
    "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-mpt.gguf",
    "ggml-vocab-starcoder.gguf", "ggml-vocab-refact.gguf", "ggml-vocab-falcon.gguf",
    "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-deepseek-coder.gguf", "ggml-vocab-bert-bge.gguf"};

Test(tokenizer, a_vocab_survives_record_encode_and_decode_and_tokenizes_identically, .timeout = 60)
{
    for (size_t f = 0; f < sizeof k_all / sizeof k_all[0]; f++) {
        char rel[256];
        loaded L;
        vectors V;
        jlm_err err = {0};
        snprintf(rel, sizeof rel, "tests/models/vocab/%s", k_all[f]);
        load(rel, &L);
        jlm_buf b = {0};
        jlm_fmt_vocab_encode(&b, &L.vocab);
        cr_assert(!b.oom);
        unload(&L);   /* the decoded copy must not depend on the original */
        jlm_arena *a = jlm_arena_new();
        jlm_vocab v2;
        jlm_tok *t2 = NULL;
        cr_assert_eq(jlm_fmt_vocab_decode(b.p, b.len, a, &v2, k_all[f], &err), 0, "%s", err.msg);
        jlm_buf_free(&b);
        cr_assert_eq(jlm_tok_create(&v2, &t2, &err), 0, "%s", err.msg);
        read_vectors(k_all[f], &V);
        check_vectors(k_all[f], t2, &V);
        free_vectors(&V);
        jlm_tok_destroy(t2);
        jlm_arena_free(a);
    }
}

/* ================================================================ refusals */
/* A minimal GGUF v3 image with no tensors: string and string-array keys. */
typedef struct gb { uint8_t p[4096]; size_t n; } gb;

static void gb_put(gb *b, const void *x, size_t n)
{
    cr_assert(b->n + n <= sizeof b->p);
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void gb_u32(gb *b, uint32_t x) { gb_put(b, &x, 4); }
static void gb_u64(gb *b, uint64_t x) { gb_put(b, &x, 8); }
static void gb_str(gb *b, const char *s) { gb_u64(b, strlen(s)); gb_put(b, s, strlen(s)); }
static void gb_kv_str(gb *b, const char *k, const char *v) { gb_str(b, k); gb_u32(b, 8); gb_str(b, v); }
static void gb_kv_strs(gb *b, const char *k, const char *const *v, size_t n)
{
    gb_str(b, k);
    gb_u32(b, 9);
    gb_u32(b, 8);
    gb_u64(b, n);
    for (size_t i = 0; i < n; i++)
        gb_str(b, v[i]);
}

/* tokenizer.ggml.model = model, pre (NULL: absent), tokens, merges (NULL: absent). */
static int convert_mem(const char *model, const char *pre, const char *const *toks, size_t n_toks,
                       const char *const *merges, size_t n_merges, jlm_err *err)
{
    gb b = {.n = 0};
    uint64_t n_kv = 2 + (pre != NULL) + (merges != NULL);
    gb_put(&b, "GGUF", 4);
    gb_u32(&b, 3);
    gb_u64(&b, 0);
    gb_u64(&b, n_kv);
    gb_kv_str(&b, "tokenizer.ggml.model", model);
    if (pre)
        gb_kv_str(&b, "tokenizer.ggml.pre", pre);
    gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, n_toks);
    if (merges)
        gb_kv_strs(&b, "tokenizer.ggml.merges", merges, n_merges);
    jlm_gguf *g = NULL;
    int rc = jlm_gguf_open_mem(b.p, b.n, "mem.gguf", &g, err);
    cr_assert_eq(rc, 0, "test GGUF image refused: %s", err->msg);
    jlm_arena *a = jlm_arena_new();
    jlm_vocab v;
    rc = jlm_conv_vocab(g, a, &v, err);
    jlm_arena_free(a);
    jlm_gguf_close(g);
    return rc;
}

static const char *const k_toks[] = {"a", "b", "ab"};
static const char *const k_merges[] = {"a b"};

Test(tokenizer, converter_accepts_a_minimal_gpt2_vocab, .timeout = 10)
{
    jlm_err err = {0};
    cr_assert_eq(convert_mem("gpt2", "gpt-2", k_toks, 3, k_merges, 1, &err), 0, "%s", err.msg);
}

Test(tokenizer, converter_refuses_an_unknown_pre_tokenizer_by_name, .timeout = 10)
{
    jlm_err err = {0};
    cr_assert_eq(convert_mem("gpt2", "no-such-pre", k_toks, 3, k_merges, 1, &err), JLM_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "no-such-pre"), "message does not name the pre: %s", err.msg);
}

Test(tokenizer, converter_refuses_an_unknown_tokenizer_model_by_name, .timeout = 10)
{
    jlm_err err = {0};
    cr_assert_eq(convert_mem("t5", NULL, k_toks, 3, NULL, 0, &err), JLM_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "'t5'"), "message does not name the model: %s", err.msg);
}

Test(tokenizer, converter_refuses_a_gpt2_vocab_without_merges, .timeout = 10)
{
    jlm_err err = {0};
    cr_assert_eq(convert_mem("gpt2", "gpt-2", k_toks, 3, NULL, 0, &err), JLM_ENOTFOUND, "%s", err.msg);
}

Test(tokenizer, converter_refuses_two_tokens_with_one_text, .timeout = 10)
{
    static const char *const dup[] = {"a", "b", "a"};
    jlm_err err = {0};
    cr_assert_eq(convert_mem("llama", NULL, dup, 3, NULL, 0, &err), JLM_EFORMAT, "%s", err.msg);
    cr_assert(strstr(err.msg, "duplicate"), "%s", err.msg);
}

/* A hand-made BPE record with one regex stage. */
static int create_with_pattern(const char *pat, jlm_err *err)
{
    static jlm_str toks[2] = {{"a", 1}, {"b", 1}};
    jlm_preop op = {.kind = 1, .use_regex = 1, .behavior = {pat, (uint32_t)strlen(pat)}};
    jlm_vocab v = {.kind = JLM_VOCAB_BPE, .n_tokens = 2, .tokens = toks, .n_preops = 1, .preops = &op,
                   .bos = -1, .eos = -1, .unk = -1, .pad = -1, .sep = -1, .mask = -1};
    jlm_tok *t = NULL;
    int rc = jlm_tok_create(&v, &t, err);
    jlm_tok_destroy(t);
    return rc;
}

Test(tokenizer, regex_stages_refuse_categories_mixed_with_non_ascii_literals, .timeout = 10)
{
    jlm_err err = {0};
    cr_assert_eq(create_with_pattern("\\p{L}+|\\s?[\\x{FF01}-\\x{FF0F}]+", &err), JLM_EUNSUPPORTED, "%s", err.msg);
    cr_assert_eq(create_with_pattern("\\s?\\p{L}+", &err), 0, "%s", err.msg);
}

Test(tokenizer, regex_stages_refuse_malformed_patterns, .timeout = 10)
{
    jlm_err err = {0};
    cr_assert_eq(create_with_pattern("(ab", &err), JLM_EFORMAT, "%s", err.msg);
    cr_assert_eq(create_with_pattern("[a-", &err), JLM_EFORMAT, "%s", err.msg);
    cr_assert_eq(create_with_pattern("[z-a]", &err), JLM_EFORMAT, "%s", err.msg);
    cr_assert_eq(create_with_pattern("a{3,1}", &err), JLM_EFORMAT, "%s", err.msg);
    cr_assert_eq(create_with_pattern("(?<=a)b", &err), JLM_EUNSUPPORTED, "%s", err.msg);
}

/* The o200k Split regex (gpt-oss's tokenizer.json, converter/vocab.c RX_O200K)
 * splits at case changes with Unicode's letter subcategories (Lu, Ll, Lt, Lm,
 * Lo) and marks, and its (?i:'s|'t|...) contractions match any case and
 * U+017F (whose case fold is 's'). The expected pieces were made with Python's
 * `regex` module 2026.5.9 (Unicode categories and simple case folding, as
 * Oniguruma in Hugging Face tokenizers), matches and the gaps between them. */
#define O200K "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const struct { const char *text; const char *pieces; } k_o200k[] = {
    {"HelloWorld camelCaseString XMLHttpRequest",
     "Hello\001World\001 camel\001Case\001String\001 XMLHttp\001Request"},
    {"I'M HERE, DON'T you'RE We'Ve it'S they'LL I'D",
     "I'M\001 HERE\001,\001 DON'T\001 you'RE\001 We'Ve\001 it'S\001 they'LL\001 I'D"},
    {"it\305\277 ok, it'\305\277",
     "it\305\277\001 ok\001,\001 it'\305\277"},
    {"\307\205emal \307\204EMAL \312\260ello",
     "\307\205emal\001 \307\204EMAL\001 \312\260ello"},
    {"e\314\201t\303\251 NA\314\210IVE na\314\210ive",
     "e\314\201t\303\251\001 NA\314\210\001IVE\001 na\314\210ive"},
    {"ABC's abc'S Abc'Ll",
     "ABC's\001 abc'S\001 Abc'Ll"},
    {"\342\205\242\342\205\243 12345 \331\241\331\242\331\243\331\244",
     "\342\205\242\342\205\243\001 \001123\00145\001 \001\331\241\331\242\331\243\001\331\244"},
    {"Stra\303\237e STRASSE \304\260stanbul \304\261",
     "Stra\303\237e\001 STRASSE\001 \304\260stanbul\001 \304\261"},
    {"\302\277Qu\303\251\077 \302\241S\303\255! path/to/file\012\012x",
     "\302\277Qu\303\251\001\077\001 \302\241\001S\303\255\001!\001 path\001/to\001/file\001\012\012\001x"},
    {"\316\243\316\277\317\206\316\257\316\261 \316\221\316\230\316\227\316\235\316\221 \341\274\210\316\270\316\256\316\275\316\261\316\271",
     "\316\243\316\277\317\206\316\257\316\261\001 \316\221\316\230\316\227\316\235\316\221\001 \341\274\210\316\270\316\256\316\275\316\261\316\271"},
};

Test(tokenizer, o200k_regex_splits_at_case_changes_and_folds_contractions, .timeout = 10)
{
    jlm_err err = {0};
    tok_rx *rx = NULL;
    cr_assert_eq(jlm_tok_rx_compile(O200K, strlen(O200K), "o200k", &rx, &err), 0, "%s", err.msg);
    for (size_t k = 0; k < sizeof k_o200k / sizeof k_o200k[0]; k++) {
        const char *t = k_o200k[k].text;
        tok_cpts cp = {0};
        jlm_tok_cpts_from_utf8(t, strlen(t), &cp);
        size_t whole = cp.n;
        tok_lens in = {&whole, 1, 1, 0}, out = {0};
        cr_assert_eq(jlm_tok_rx_split(rx, cp.p, &in, &out), 0);
        char got[1024] = "";   /* the pieces as UTF-8, joined by \001 */
        size_t at = 0, gl = 0;
        for (size_t i = 0; i < out.n; i++) {
            tok_sbuf sb = {0};
            for (size_t j = 0; j < out.p[i]; j++)
                jlm_tok_sbuf_cpt(&sb, cp.p[at + j]);
            at += out.p[i];
            gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%.*s", i ? "\001" : "", (int)sb.n, sb.p);
            free(sb.p);
        }
        cr_assert_str_eq(got, k_o200k[k].pieces, "case %zu: '%s'", k, t);
        free(cp.p);
        free(out.p);
    }
    jlm_tok_rx_free(rx);
}

Test(tokenizer, regex_stages_refuse_non_ascii_inside_a_case_insensitive_group, .timeout = 10)
{
    jlm_err err = {0};
    cr_assert_eq(create_with_pattern("(?i:\\x{C9}t\\x{E9})", &err), JLM_EUNSUPPORTED, "%s", err.msg);
    cr_assert(strstr(err.msg, "(?i:"), "%s", err.msg);
    cr_assert_eq(create_with_pattern("(?i:'s|'t)|\\p{Lu}+", &err), 0, "%s", err.msg);
    cr_assert_eq(create_with_pattern("\\p{Lx}", &err), JLM_EUNSUPPORTED, "%s", err.msg);
}
