/* test_grammar.c - GBNF parsing and refusal, the token mask against a
 * per-token reference on real vocabularies (and its speed), max_tokens-aware
 * closing, JSON Schema -> grammar, and constrained generation with a
 * random-weight model whose every output is checked by jansson and a schema
 * validator written here (not the converter). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "converter/gguf.h"
#include "converter/hf.h"
#include "converter/vocab.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "format/jlm_format.h"
#include "text/grammar/grammar.h"
#include "text/tokenizer/tokenizer.h"
#include "tests/testutil.h"

/* ---------------------------------------------------------------- helpers */
static jlm_gram *parse_ok(const char *src)
{
    jlm_gram *g = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_gram_parse(src, strlen(src), &g, &err), 0, "grammar refused: %s\n%s", err.msg, src);
    return g;
}

/* 1 when text is a whole match of g. */
static int matches(const jlm_gram *g, const char *text)
{
    jlm_gram_match *m;
    cr_assert_eq(jlm_gram_match_new(g, &m, NULL), 0);
    int ok = jlm_gram_accept_bytes(m, text, strlen(text), NULL) == 0 && jlm_gram_can_end(m);
    jlm_gram_match_free(m);
    return ok;
}

/* 1 when text is a prefix of some match of g. */
static int prefix_ok(const jlm_gram *g, const char *text, size_t len)
{
    jlm_gram_match *m;
    cr_assert_eq(jlm_gram_match_new(g, &m, NULL), 0);
    int ok = jlm_gram_accept_bytes(m, text, len, NULL) == 0;
    jlm_gram_match_free(m);
    return ok;
}

/* ---------------------------------------------------------------- parser */
typedef struct gcase { const char *gbnf, *yes[6], *no[6]; } gcase;

static const gcase CASES[] = {
    {"root ::= \"ab\" | \"c\"", {"ab", "c"}, {"", "a", "abc", "cc"}},
    {"root ::= [^]", {"a", "\xc3\xa9", "]"}, {"", "ab"}},   /* the first class of a grammar, empty and negated: any one character */
    {"root ::= x+ \"!\"\nx ::= [a-c]", {"a!", "abcab!"}, {"!", "ad!", "a"}},
    {"root ::= [0-9]* \".\"?", {"", "12", "12.", "."}, {"1.2", "a"}},
    {"root ::= \"a\"{2,3} \"b\"{2} \"c\"{1,}", {"aabbc", "aaabbccc"}, {"abbc", "aaaabbc", "aabc", "aabb"}},
    {"root ::= [^\"\\\\]* # not a quote\n", {"", "abc", "\xc3\xa9t\xc3\xa9", "\xf0\x9f\x98\x80"}, {"\"", "a\\"}},
    {"root ::= ( \"x\" | \"y\" z )?\nz ::=\n  \"1\" |\n  \"2\"", {"", "x", "y1", "y2"}, {"y", "z1"}},
    {"root ::= \"\\x41\\u00e9\\n\\t\\\"\\\\\" .", {"A\xc3\xa9\n\t\"\\z", "A\xc3\xa9\n\t\"\\\xe2\x82\xac"}, {"A\xc3\xa9\n\t\"\\"}},
    {"root ::= [\\u0100-\\U0001F600] [a-]", {"\xc4\x80-", "\xf0\x9f\x98\x80" "a"}, {"\xc3\xbf-", "\xf0\x9f\x98\x81" "a"}},
    {"root ::= (\n  \"a\" (\"b\" | \"c\")* \n) \"d\"{0,2}", {"a", "abcbdd", "ad"}, {"addd", "b"}},
    {"root ::= item (\",\" item){0,2}\nitem ::= [a-z]{1,3}", {"a", "ab,c", "a,b,c"}, {"a,b,c,d", "abcd", ""}},
};

Test(grammar, parses_and_matches_gbnf, .timeout = 10)
{
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        jlm_gram *g = parse_ok(CASES[k].gbnf);
        for (int i = 0; i < 6 && CASES[k].yes[i]; i++)
            cr_expect(matches(g, CASES[k].yes[i]), "case %zu should match \"%s\"", k, CASES[k].yes[i]);
        for (int i = 0; i < 6 && CASES[k].no[i]; i++)
            cr_expect(!matches(g, CASES[k].no[i]), "case %zu should not match \"%s\"", k, CASES[k].no[i]);
        jlm_gram_free(g);
    }
}

typedef struct rcase { const char *gbnf, *why; } rcase;

static const rcase BAD[] = {
    {"", "no 'root' rule"},
    {"root ::= \"a", "line 1, column 10: unterminated literal"},
    {"root ::= [a-", "line 1, column 10: unterminated character class"},
    {"root ::= (\"a\"", "line 1, column 10: '(' without its ')'"},
    {"root ::= \"a\")", "line 1, column 13: ')' without its '('"},
    {"root ::= \"a\" x", "line 1, column 14: reference to an undefined rule"},
    {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule defined twice"},
    {"root := \"a\"", "line 1, column 6: expected '::='"},
    {"root ::= root \"a\" | \"b\"", "left recursion"},
    {"root ::= x\nx ::= e root \"a\" | \"c\"\ne ::= \"b\"?", "left recursion"},
    {"root ::= \"a\" root", "can never finish"},
    {"root ::= [b-a]", "end before its start"},
    {"root ::= [^\\x00-\\U0010FFFF]", "empty character class"},
    {"root ::= \"a\"{3,2}", "n < m"},
    {"root ::= \"a\"{1001}", "above 1000"},
    {"root ::= \"\\q\"", "unknown escape"},
    {"root ::= \"\\u12\"", "hex digits"},
    {"root ::= \"\xff\"", "invalid UTF-8"},
    {"root ::= *", "unexpected character"},
    {"root ::= \"\"*", "repetition of an empty literal"},
};

Test(grammar, refuses_malformed_grammars_naming_position_and_reason, .timeout = 10)
{
    for (size_t k = 0; k < sizeof BAD / sizeof *BAD; k++) {
        jlm_gram *g = NULL;
        jlm_err err = {0};
        int rc = jlm_gram_parse(BAD[k].gbnf, strlen(BAD[k].gbnf), &g, &err);
        cr_expect_eq(rc, JLM_EFORMAT, "\"%s\" accepted (rc %d)", BAD[k].gbnf, rc);
        cr_expect(g == NULL);
        cr_expect(strstr(err.msg, BAD[k].why), "\"%s\": message \"%s\" lacks \"%s\"", BAD[k].gbnf, err.msg, BAD[k].why);
        cr_expect(!strchr(err.msg, '\n'), "one line: %s", err.msg);
    }
    /* bounds: nesting and size */
    char deep[400] = "root ::= ";
    for (int i = 0; i < 70; i++) strcat(deep, "(");
    strcat(deep, "\"a\"");
    for (int i = 0; i < 70; i++) strcat(deep, ")");
    jlm_gram *g = NULL;
    jlm_err err = {0};
    cr_expect_eq(jlm_gram_parse(deep, strlen(deep), &g, &err), JLM_EFORMAT);
    cr_expect(strstr(err.msg, "nested deeper than 64"), "%s", err.msg);
    size_t nbig = JLM_GRAM_MAX_SRC + 1;
    char *big = malloc(nbig);
    memset(big, ' ', nbig);
    memcpy(big, "root ::= \"a\"", 12);
    cr_expect_eq(jlm_gram_parse(big, nbig, &g, &err), JLM_EFORMAT);
    cr_expect(strstr(err.msg, "more than the 1 MiB allowed"), "%s", err.msg);
    free(big);
}

/* ---------------------------------------------------------------- vocab */
typedef struct vload {
    jlm_arena *arena;
    jlm_vocab  vocab;
    jlm_tok   *tok;
    jlm_gram_vocab *gv;
} vload;

static void vload_open(const char *gguf, vload *L)
{
    jlm_err err = {0};
    jlm_gguf *g = NULL;
    if (!strncmp(gguf, "hf-tok/", 7)) {   /* a tokenizer.json.xz */
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "xz -dc '%s/tokenizer.json.xz'", tu_model(gguf));
        FILE *f = popen(cmd, "r");
        cr_assert(f, "%s", cmd);
        size_t cap = 1 << 20, n = 0, r;
        char *buf = malloc(cap);
        while ((r = fread(buf + n, 1, cap - n, f)) > 0) {
            n += r;
            if (n == cap) buf = realloc(buf, cap *= 2);
        }
        cr_assert_eq(pclose(f), 0, "%s", cmd);
        cr_assert_eq(jlm_hf_open_tok_mem(buf, n, &g, &err), 0, "%s", err.msg);
        free(buf);
    } else {
        cr_assert_eq(jlm_gguf_open(tu_model(gguf), &g, &err), 0, "%s", err.msg);
    }
    L->arena = jlm_arena_new();
    cr_assert_eq(jlm_conv_vocab(g, L->arena, &L->vocab, &err), 0, "%s", err.msg);
    jlm_gguf_close(g);
    cr_assert_eq(jlm_tok_create(&L->vocab, &L->tok, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_gram_vocab_from_tok(L->tok, &L->gv, &err), 0, "%s", err.msg);
}

static void vload_close(vload *L)
{
    jlm_gram_vocab_free(L->gv);
    jlm_tok_destroy(L->tok);
    jlm_arena_free(L->arena);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The mask after `prefix` equals, token by token, "prefix + piece is a
 * prefix of a match" (EOG: "prefix is a whole match"). */
static void check_mask(vload *L, const jlm_gram *g, const char *prefix, double *ms, double *warm_ms)
{
    uint32_t n = jlm_tok_n_tokens(L->tok);
    float *lg = calloc(n, sizeof *lg);
    jlm_gram_match *m;
    cr_assert_eq(jlm_gram_match_new(g, &m, NULL), 0);
    cr_assert_eq(jlm_gram_accept_bytes(m, prefix, strlen(prefix), NULL), 0, "prefix \"%s\"", prefix);
    double t0 = now_ms();
    long allowed = jlm_gram_mask(m, L->gv, -1, lg);
    *ms = now_ms() - t0;
    float *again = calloc(n, sizeof *again);   /* a second step from the same state: the transition cache warm */
    t0 = now_ms();
    cr_assert_eq(jlm_gram_mask(m, L->gv, -1, again), allowed);
    *warm_ms = now_ms() - t0;
    cr_assert(!memcmp(lg, again, sizeof *lg * n), "the cached walk differs from the first");
    free(again);
    long want_n = 0;
    size_t pl = strlen(prefix);
    char *buf = malloc(pl + jlm_tok_max_piece_len(L->tok) + 1);
    memcpy(buf, prefix, pl);
    int end = matches(g, prefix);
    for (uint32_t i = 0; i < n; i++) {
        const char *pc;
        size_t len;
        cr_assert_eq(jlm_tok_piece(L->tok, (int32_t)i, 0, &pc, &len, NULL), 0);
        int want;
        if (jlm_tok_is_eog(L->tok, (int32_t)i)) want = end;
        else if (!len) want = 0;
        else {
            memcpy(buf + pl, pc, len);
            want = prefix_ok(g, buf, pl + len);
        }
        want_n += want;
        cr_assert_eq(lg[i] == -INFINITY, !want, "after \"%s\": token %u \"%.*s\" %s", prefix, i, (int)len, pc,
                     want ? "masked" : "allowed");
    }
    cr_expect_eq(allowed, want_n);
    free(buf);
    free(lg);
    jlm_gram_match_free(m);
}

static const char JSONISH[] =
    "root ::= obj\n"
    "obj ::= \"{\" ws (kv (\",\" ws kv)*)? \"}\"\n"
    "kv ::= str \":\" ws val\n"
    "val ::= str | [0-9]+ | obj | \"\\u00e9t\\u00e9\" | \"\\U0001F600\"\n"
    "str ::= \"\\\"\" [^\"\\\\]* \"\\\"\"\n"
    "ws ::= \" \"?\n";

static void mask_suite(const char *gguf)
{
    vload L;
    vload_open(gguf, &L);
    jlm_gram *g = parse_ok(JSONISH);
    const char *prefixes[] = {"", "{", "{\"", "{\"ab", "{\"a\": ", "{\"a\":\xc3", "{\"a\":\"\xe2\x82", "{\"a\":1", "{\"a\":{}}",
                              "{\"a\": \xc3\xa9", "{\"a\": \xf0\x9f"};
    double worst = 0, worst_warm = 0;
    for (size_t k = 0; k < sizeof prefixes / sizeof *prefixes; k++) {
        double ms, warm;
        check_mask(&L, g, prefixes[k], &ms, &warm);
        if (ms > worst) worst = ms;
        if (warm > worst_warm) worst_warm = warm;
        cr_log_info("%s: mask after \"%s\": %.2f ms (again %.2f ms)", gguf, prefixes[k], ms, warm);
    }
    printf("grammar mask on %s (%u tokens): worst step %.2f ms from a new matcher, %.2f ms with its cache warm\n", gguf,
           jlm_tok_n_tokens(L.tok), worst, worst_warm);
    jlm_gram_free(g);
    vload_close(&L);
}

Test(grammar, mask_equals_the_per_token_reference_on_llama2_spm_vocab, .timeout = 120)
{
    mask_suite("llama-2-tiny-random.gguf");
}

Test(grammar, mask_equals_the_per_token_reference_on_a_byte_level_bpe_vocab, .timeout = 240)
{
    mask_suite("hf-tok/qwen3");
}

/* ---------------------------------------------------------------- JSON Schema */
static char *schema_gbnf(const char *schema, int *rc, jlm_err *err)
{
    char *out = NULL;
    *rc = jlm_gram_from_schema(schema, schema ? strlen(schema) : 0, &out, err);
    return out;
}

Test(grammar, schema_refuses_unsupported_keywords_naming_them, .timeout = 10)
{
    static const struct { const char *schema, *why; int code; } R[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "keyword 'pattern' is not supported", JLM_EUNSUPPORTED},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":3}}}",
         "keyword 'minimum' is not supported at /properties/n", JLM_EUNSUPPORTED},
        {"{\"type\":\"string\",\"format\":\"email\"}", "format 'email' is not supported", JLM_EUNSUPPORTED},
        {"{\"$ref\":\"http://x/y\"}", "$ref 'http://x/y'", JLM_EUNSUPPORTED},
        {"{\"allOf\":[{}]}", "keyword 'allOf' is not supported", JLM_EUNSUPPORTED},
        {"{\"type\":\"array\",\"maxItems\":5000}", "'maxItems' must be an integer in [0, 1000]", JLM_EUNSUPPORTED},
        {"{\"type\":\"object\",\"required\":[\"a\"]}", "required property 'a' is not in 'properties'", JLM_EUNSUPPORTED},
        {"{\"type\":\"strin\"}", "type 'strin'", JLM_EUNSUPPORTED},
        {"{\"type\":", "not JSON", JLM_EFORMAT},
        {"[1]", "a schema must be an object", JLM_EFORMAT},
        {"{\"enum\":[]}", "'enum' must be a non-empty array", JLM_EFORMAT},
    };
    for (size_t k = 0; k < sizeof R / sizeof *R; k++) {
        jlm_err err = {0};
        int rc;
        char *g = schema_gbnf(R[k].schema, &rc, &err);
        cr_expect_eq(rc, R[k].code, "%s: rc %d (%s)", R[k].schema, rc, err.msg);
        cr_expect(!g);
        cr_expect(strstr(err.msg, R[k].why), "%s: \"%s\" lacks \"%s\"", R[k].schema, err.msg, R[k].why);
    }
}

Test(grammar, schema_grammar_accepts_and_refuses_by_hand, .timeout = 10)
{
    static const struct { const char *schema, *yes[5], *no[5]; } S[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"boolean\"}},"
         "\"required\":[\"b\"],\"additionalProperties\":false}",
         {"{\"b\":\"x\"}", "{\"a\":-12,\"b\":\"\"}", "{\"a\": 1, \"b\": \"q\", \"c\": true}", "{\"b\":\"x\",\"c\":false}"},
         {"{}", "{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{\"b\":\"x\",}", "{\"b\":\"x\",\"d\":1}"}},
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"x\",2,null]},\"minItems\":1,\"maxItems\":2}",
         {"[\"x\"]", "[2, null]"}, {"[]", "[1]", "[\"x\",2,null]"}},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"const\":{\"k\":[1]}}]}", {"null", "{\"k\":[1]}"}, {"{\"k\":[2]}", "1"}},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2024-02-29T23:59:59Z\"", "\"1999-12-31T00:00:00.123+05:30\""},
         {"\"2024-13-01T00:00:00Z\"", "\"2024-01-01\""}},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}",
         {"{}", "{\"next\":{\"next\":{}}}"}, {"{\"next\":1}"}},
        {"{\"type\":[\"string\",\"null\"],\"maxLength\":2}", {"\"ab\"", "null", "\"\\u00e9\\n\""}, {"\"abc\"", "1"}},
    };
    for (size_t k = 0; k < sizeof S / sizeof *S; k++) {
        jlm_err err = {0};
        int rc;
        char *src = schema_gbnf(S[k].schema, &rc, &err);
        cr_assert_eq(rc, 0, "%s: %s", S[k].schema, err.msg);
        jlm_gram *g = parse_ok(src);
        for (int i = 0; i < 5 && S[k].yes[i]; i++) cr_expect(matches(g, S[k].yes[i]), "schema %zu should take %s", k, S[k].yes[i]);
        for (int i = 0; i < 5 && S[k].no[i]; i++) cr_expect(!matches(g, S[k].no[i]), "schema %zu should refuse %s", k, S[k].no[i]);
        jlm_gram_free(g);
        free(src);
    }
    /* json_object: any object */
    int rc;
    char *src = schema_gbnf(NULL, &rc, NULL);
    cr_assert_eq(rc, 0);
    jlm_gram *g = parse_ok(src);
    cr_expect(matches(g, "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}"));
    cr_expect(!matches(g, "[1]"));
    jlm_gram_free(g);
    free(src);
}

/* ---- schemas generated from a seed, and a validator independent of the converter */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}
static int pick(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

static json_t *gen_schema(uint64_t *s, int depth, int have_def)
{
    static const char *fmts[] = {"date", "time", "date-time", "uuid"};
    int kind = depth == 0 ? 9 : pick(s, depth >= 3 ? 9 : 14);
    json_t *o = json_object();
    switch (kind) {
    case 0: json_object_set_new(o, "type", json_string("string")); break;
    case 1:
        json_object_set_new(o, "type", json_string("string"));
        json_object_set_new(o, "minLength", json_integer(pick(s, 3)));
        json_object_set_new(o, "maxLength", json_integer(3 + pick(s, 6)));
        break;
    case 2:
        json_object_set_new(o, "type", json_string("string"));
        json_object_set_new(o, "format", json_string(fmts[pick(s, 4)]));
        break;
    case 3: json_object_set_new(o, "type", json_string("integer")); break;
    case 4: json_object_set_new(o, "type", json_string("number")); break;
    case 5: json_object_set_new(o, "type", json_string("boolean")); break;
    case 6: json_object_set_new(o, "type", json_string("null")); break;
    case 7: {
        json_t *e = json_array();
        json_array_append_new(e, json_string("red"));
        json_array_append_new(e, json_integer(pick(s, 100)));
        if (pick(s, 2)) json_array_append_new(e, json_null());
        if (pick(s, 2)) json_array_append_new(e, json_string("gr\xc3\xbcn \"q\""));
        json_object_set_new(o, "enum", e);
        break;
    }
    case 8: json_object_set_new(o, "const", pick(s, 2) ? json_string("fixed") : json_pack("{s:[i,b]}", "k", 7, 1)); break;
    case 9:
    case 12: {
        json_object_set_new(o, "type", json_string("object"));
        json_t *p = json_object(), *req = json_array();
        int np = 1 + pick(s, 4);
        for (int i = 0; i < np; i++) {
            char key[16];
            snprintf(key, sizeof key, "%c%d", 'a' + pick(s, 26), i);
            json_t *sub = have_def && pick(s, 4) == 0 ? json_pack("{s:s}", "$ref", "#/$defs/item") : gen_schema(s, depth + 1, have_def);
            json_object_set_new(p, key, sub);
            if (pick(s, 3)) json_array_append_new(req, json_string(key));
        }
        json_object_set_new(o, "properties", p);
        json_object_set_new(o, "required", req);
        if (pick(s, 2)) json_object_set_new(o, "additionalProperties", json_false());
        break;
    }
    case 10:
    case 13: {
        json_object_set_new(o, "type", json_string("array"));
        json_object_set_new(o, "items", gen_schema(s, depth + 1, have_def));
        int mn = pick(s, 3);
        if (pick(s, 2)) json_object_set_new(o, "minItems", json_integer(mn));
        if (pick(s, 2)) json_object_set_new(o, "maxItems", json_integer(mn + pick(s, 3)));
        break;
    }
    case 11: {
        json_t *a = json_array();
        json_t *first = gen_schema(s, depth + 1, have_def);
        const char *ft = json_string_value(json_object_get(first, "type"));
        /* oneOf only where its branches cannot both match (the grammar treats it as anyOf) */
        int disjoint = ft && (!strcmp(ft, "object") || !strcmp(ft, "array") || !strcmp(ft, "integer") || !strcmp(ft, "number"));
        json_array_append_new(a, first);
        json_array_append_new(a, json_pack("{s:s}", "type", pick(s, 2) ? "null" : "boolean"));
        json_object_set_new(o, disjoint && pick(s, 2) ? "oneOf" : "anyOf", a);
        break;
    }
    }
    if (depth > 0 && kind == 0 && pick(s, 3) == 0) {   /* a type list */
        json_object_set_new(o, "type", json_pack("[s,s]", "string", "null"));
    }
    return o;
}

static size_t cps(const char *t)
{
    size_t n = 0;
    for (; *t; t++) n += ((unsigned char)*t & 0xC0) != 0x80;
    return n;
}

static int digits(const char *t, int n)
{
    for (int i = 0; i < n; i++)
        if (t[i] < '0' || t[i] > '9') return 0;
    return 1;
}

static int two(const char *t) { return (t[0] - '0') * 10 + (t[1] - '0'); }

static int is_date(const char *t)
{
    return strlen(t) == 10 && digits(t, 4) && t[4] == '-' && digits(t + 5, 2) && t[7] == '-' && digits(t + 8, 2) &&
           two(t + 5) >= 1 && two(t + 5) <= 12 && two(t + 8) >= 1 && two(t + 8) <= 31;
}

static int is_time(const char *t)
{
    if (strlen(t) < 9 || !digits(t, 2) || t[2] != ':' || !digits(t + 3, 2) || t[5] != ':' || !digits(t + 6, 2)) return 0;
    if (two(t) > 23 || two(t + 3) > 59 || two(t + 6) > 60) return 0;
    t += 8;
    if (*t == '.') {
        t++;
        int k = 0;
        while (*t >= '0' && *t <= '9') { t++; k++; }
        if (!k) return 0;
    }
    if (!strcmp(t, "Z")) return 1;
    return (t[0] == '+' || t[0] == '-') && strlen(t) == 6 && digits(t + 1, 2) && t[3] == ':' && digits(t + 4, 2) &&
           two(t + 1) <= 23 && two(t + 4) <= 59;
}

static int is_uuid(const char *t)
{
    if (strlen(t) != 36) return 0;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) { if (t[i] != '-') return 0; }
        else if (!strchr("0123456789abcdefABCDEF", t[i])) return 0;
    }
    return 1;
}

static int type_ok(const char *t, json_t *v)
{
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return 0;
}

static int valid(json_t *sc, json_t *root, json_t *v)
{
    json_t *x;
    if ((x = json_object_get(sc, "$ref"))) {
        const char *r = json_string_value(x);
        return valid(json_object_get(json_object_get(root, "$defs"), r + strlen("#/$defs/")), root, v);
    }
    if ((x = json_object_get(sc, "const")) && !json_equal(x, v)) return 0;
    if ((x = json_object_get(sc, "enum"))) {
        int any = 0;
        for (size_t i = 0; i < json_array_size(x); i++) any |= json_equal(json_array_get(x, i), v);
        if (!any) return 0;
    }
    if ((x = json_object_get(sc, "anyOf")) || (x = json_object_get(sc, "oneOf"))) {
        int n = 0;
        for (size_t i = 0; i < json_array_size(x); i++) n += valid(json_array_get(x, i), root, v);
        if (json_object_get(sc, "oneOf") ? n != 1 : n < 1) return 0;
    }
    if ((x = json_object_get(sc, "type"))) {
        int ok = 0;
        if (json_is_string(x)) ok = type_ok(json_string_value(x), v);
        for (size_t i = 0; json_is_array(x) && i < json_array_size(x); i++) ok |= type_ok(json_string_value(json_array_get(x, i)), v);
        if (!ok) return 0;
    }
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        if ((x = json_object_get(sc, "minLength")) && cps(t) < (size_t)json_integer_value(x)) return 0;
        if ((x = json_object_get(sc, "maxLength")) && cps(t) > (size_t)json_integer_value(x)) return 0;
        if ((x = json_object_get(sc, "format"))) {
            const char *f = json_string_value(x);
            if (!strcmp(f, "date") && !is_date(t)) return 0;
            if (!strcmp(f, "time") && !is_time(t)) return 0;
            if (!strcmp(f, "uuid") && !is_uuid(t)) return 0;
            if (!strcmp(f, "date-time")) {
                char d[11];
                if (strlen(t) < 11 || t[10] != 'T') return 0;
                memcpy(d, t, 10);
                d[10] = 0;
                if (!is_date(d) || !is_time(t + 11)) return 0;
            }
        }
    }
    if (json_is_array(v)) {
        if ((x = json_object_get(sc, "minItems")) && json_array_size(v) < (size_t)json_integer_value(x)) return 0;
        if ((x = json_object_get(sc, "maxItems")) && json_array_size(v) > (size_t)json_integer_value(x)) return 0;
        if ((x = json_object_get(sc, "items")))
            for (size_t i = 0; i < json_array_size(v); i++)
                if (!valid(x, root, json_array_get(v, i))) return 0;
    }
    if (json_is_object(v)) {
        json_t *props = json_object_get(sc, "properties"), *req = json_object_get(sc, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return 0;
        const char *k;
        json_t *m;
        json_object_foreach(v, k, m) {
            json_t *ps = props ? json_object_get(props, k) : NULL;
            if (ps && !valid(ps, root, m)) return 0;
            if (!ps && json_is_false(json_object_get(sc, "additionalProperties"))) return 0;
        }
    }
    return 1;
}

Test(grammar, every_json_schema_output_of_a_random_model_parses_and_validates, .timeout = 300)
{
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *path = tu_convert("llama-2-tiny-random.gguf", dir, "m.jlm", &err);
    cr_assert(path, "%s", err.msg);
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1};
    jlm_engine *e;
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    jlm_tok *tok;
    cr_assert_eq(jlm_tok_create(&jlm_engine_model(e)->vocab, &tok, &err), 0, "%s", err.msg);
    jlm_gram_vocab *gv;
    cr_assert_eq(jlm_gram_vocab_from_tok(tok, &gv, &err), 0, "%s", err.msg);
    uint32_t nv = jlm_engine_n_vocab(e);
    float *lg = malloc(sizeof *lg * nv);
    int32_t *ids;
    size_t nids;
    cr_assert_eq(jlm_tok_encode(tok, "JSON:", 5, 1, 0, &ids, &nids, &err), 0);
    int budget_closed = 0, eos_ended = 0;
    double mask_ms = 0;
    long steps = 0;
    const int N = 60;
    for (int i = 0; i < N; i++) {
        uint64_t seed = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        json_t *sc = json_object();
        int with_def = i % 5 == 4;
        if (with_def) {
            json_t *defs = json_object();
            json_object_set_new(defs, "item", json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties", "id",
                                                        "type", "integer", "required", "id"));
            json_object_set_new(sc, "$defs", defs);
        }
        json_t *body = gen_schema(&seed, 0, with_def);
        json_object_update(sc, body);
        json_decref(body);
        char *st = json_dumps(sc, JSON_COMPACT);
        int rc;
        char *src = schema_gbnf(st, &rc, &err);
        cr_assert_eq(rc, 0, "schema %d %s: %s", i, st, err.msg);
        jlm_gram *g = parse_ok(src);
        jlm_gram_match *m;
        cr_assert_eq(jlm_gram_match_new(g, &m, NULL), 0);
        jlm_samp_params sp;
        jlm_samp_params_default(&sp);
        sp.temp = 1.5f;
        sp.top_k = 0;
        sp.top_p = 1.0f;
        sp.min_p = 0;
        sp.seed = (uint64_t)i;
        jlm_sampler *s;
        cr_assert_eq(jlm_samp_create(&sp, nv, &s, NULL), 0);
        jlm_engine_rewind(e, 0);
        cr_assert_eq(jlm_engine_eval(e, ids, (uint32_t)nids, lg, &err), 0, "%s", err.msg);
        int max_tokens = (int)jlm_gram_min_len(g) + (i * 7) % 60;   /* i = 0: exactly the shortest */
        char out[4096];
        size_t on = 0;
        int ended = 0;
        for (int t = 0; t < max_tokens; t++) {
            double t0 = now_ms();
            long n = jlm_gram_mask(m, gv, max_tokens - t, lg);
            mask_ms += now_ms() - t0;
            steps++;
            cr_assert_gt(n, 0, "schema %d: stuck after \"%.*s\"", i, (int)on, out);
            int32_t id = jlm_samp_next(s, lg);
            cr_assert(lg[id] != -INFINITY, "schema %d: sampled a masked token", i);
            jlm_samp_accept(s, id);
            if (jlm_tok_is_eog(tok, id)) { ended = 1; break; }
            cr_assert_eq(jlm_gram_accept(m, gv, id, &err), 0, "%s", err.msg);
            const char *pc;
            size_t len;
            cr_assert_eq(jlm_tok_piece(tok, id, 0, &pc, &len, NULL), 0);
            cr_assert_lt(on + len, sizeof out);
            memcpy(out + on, pc, len);
            on += len;
            if (t + 1 < max_tokens) cr_assert_eq(jlm_engine_eval(e, &id, 1, lg, &err), 0, "%s", err.msg);
        }
        out[on] = 0;
        if (ended) eos_ended++;
        else budget_closed++;
        cr_assert(jlm_gram_can_end(m), "schema %d (max_tokens %d) left open: %s", i, max_tokens, out);
        json_error_t je;
        json_t *v = json_loads(out, JSON_DECODE_ANY, &je);
        cr_assert(v, "schema %d: output is not JSON (%s): %s", i, je.text, out);
        cr_assert(valid(sc, sc, v), "schema %d: output does not validate\nschema %s\noutput %s", i, st, out);
        cr_log_info("schema %d: %s -> %s", i, st, out);
        json_decref(v);
        jlm_samp_destroy(s);
        jlm_gram_match_free(m);
        jlm_gram_free(g);
        free(src);
        free(st);
        json_decref(sc);
    }
    printf("grammar: %d schemas, %d ended by EOS, %d closed by the max_tokens rule, mask %.2f ms per step (llama-2 vocab)\n",
           N, eos_ended, budget_closed, mask_ms / (double)steps);
    cr_expect_gt(budget_closed, 0, "no output was closed by the budget: the closing is untested");
    free(ids);
    free(lg);
    jlm_gram_vocab_free(gv);
    jlm_tok_destroy(tok);
    jlm_engine_close(e);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

Test(grammar, jlm_run_json_schema_output_validates_and_a_bad_grammar_is_refused, .timeout = 120)
{
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *m = tu_convert("llama-2-tiny-random.gguf", dir, "m.jlm", &err);
    cr_assert(m, "%s", err.msg);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                         "\"when\":{\"type\":\"string\",\"format\":\"date\"},\"tags\":{\"type\":\"array\",\"items\":"
                         "{\"enum\":[\"a\",\"b\"]},\"maxItems\":3}},\"required\":[\"name\",\"when\"],\"additionalProperties\":false}";
    char sp[1100], gp[1100], cmd[4096], *o = NULL;
    snprintf(sp, sizeof sp, "%s/s.json", dir);
    snprintf(gp, sizeof gp, "%s/g.gbnf", dir);
    cr_assert_eq(tu_write_file(sp, schema, strlen(schema)), 0);
    json_t *sc = json_loads(schema, 0, NULL);
    for (int seed = 1; seed <= 6; seed++) {
        int n = 25 + seed * 6;   /* the shortest reply is 31 bytes: some runs end by the budget */
        snprintf(cmd, sizeof cmd, "%s run %s -p Hi -n %d --seed %d --temp 1.5 --json-schema %s", tu_jlm(), m, n, seed, sp);
        cr_assert_eq(tu_run(cmd, &o), 0, "%s\n%s", cmd, o);
        json_t *v = json_loads(o, 0, NULL);
        cr_assert(v, "not JSON: %s", o);
        cr_assert(valid(sc, sc, v), "does not validate: %s", o);
        json_decref(v);
        free(o);
    }
    json_decref(sc);
    const char *bad = "root ::= \"a\" (";
    cr_assert_eq(tu_write_file(gp, bad, strlen(bad)), 0);
    snprintf(cmd, sizeof cmd, "%s run %s -p Hi --grammar %s 2>&1", tu_jlm(), m, gp);
    cr_assert_neq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, "line 1, column 14: '(' without its ')'") && strchr(o, '\n') == o + strlen(o) - 1, "%s", o);
    free(o);
    const char *uns = "{\"type\":\"string\",\"pattern\":\"x\"}";
    cr_assert_eq(tu_write_file(sp, uns, strlen(uns)), 0);
    snprintf(cmd, sizeof cmd, "%s run %s -p Hi --json-schema %s 2>&1", tu_jlm(), m, sp);
    cr_assert_neq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, "keyword 'pattern' is not supported"), "%s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "%s run %s -p Hi --grammar %s --json-schema %s 2>&1", tu_jlm(), m, gp, sp);
    cr_assert_eq(tu_run(cmd, &o), 2, "both: usage error: %s", o);
    cr_assert(strstr(o, "--grammar and --json-schema exclude each other") && strchr(o, '\n') == o + strlen(o) - 1, "%s", o);
    free(o);
    free(m);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- serve's request fields */
#include "serve/constrain.h"

Test(grammar, request_fields_give_a_grammar_or_a_400_naming_the_field, .timeout = 10)
{
    static const struct { const char *body, *yes, *no; } OK[] = {
        {"{\"grammar\":\"root ::= [ab]+\"}", "abba", "abc"},
        {"{\"response_format\":{\"type\":\"json_object\"}}", "{\"a\": [1]}", "[1]"},
        {"{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"strict\":true,"
         "\"schema\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}}}}",
         "{\"n\": 3}", "{}"},
        {"{\"json_schema\":{\"enum\":[\"x\",\"y\"]}}", "\"y\"", "\"z\""},
        {"{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"any\"}}}", "[true]", "tru"},
    };
    for (size_t k = 0; k < sizeof OK / sizeof *OK; k++) {
        json_t *b = json_loads(OK[k].body, 0, NULL);
        jlm_gram *g = NULL;
        jlm_err err = {0};
        cr_assert_eq(jlm_srv_constraint(b, &g, &err), 0, "%s: %s", OK[k].body, err.msg);
        cr_assert(g);
        cr_expect(matches(g, OK[k].yes), "%s should take %s", OK[k].body, OK[k].yes);
        cr_expect(!matches(g, OK[k].no), "%s should refuse %s", OK[k].body, OK[k].no);
        jlm_gram_free(g);
        json_decref(b);
    }
    static const struct { const char *body, *why; int code; } BADR[] = {
        {"{\"grammar\":\"root ::= (\"}", "grammar: line 1, column 10: '(' without its ')'", JLM_EFORMAT},
        {"{\"grammar\":7}", "grammar: expected a string", JLM_EINVAL},
        {"{\"json_schema\":{\"minimum\":1}}", "json_schema: keyword 'minimum' is not supported", JLM_EUNSUPPORTED},
        {"{\"response_format\":{\"type\":\"xml\"}}", "response_format.type: 'xml'", JLM_EINVAL},
        {"{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"string\",\"pattern\":\"a\"}}}}",
         "response_format.json_schema.schema: json_schema: keyword 'pattern' is not supported", JLM_EUNSUPPORTED},
        {"{\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":\"json_object\"}}", "exclude each other", JLM_EINVAL},
    };
    for (size_t k = 0; k < sizeof BADR / sizeof *BADR; k++) {
        json_t *b = json_loads(BADR[k].body, 0, NULL);
        cr_assert(b, "%s", BADR[k].body);
        jlm_gram *g = NULL;
        jlm_err err = {0};
        cr_expect_eq(jlm_srv_constraint(b, &g, &err), BADR[k].code, "%s: %s", BADR[k].body, err.msg);
        cr_expect(!g);
        cr_expect(strstr(err.msg, BADR[k].why), "%s: \"%s\" lacks \"%s\"", BADR[k].body, err.msg, BADR[k].why);
        json_decref(b);
    }
    json_t *none = json_loads("{\"response_format\":{\"type\":\"text\"},\"prompt\":\"x\"}", 0, NULL);
    jlm_gram *g = (jlm_gram *)1;
    cr_expect_eq(jlm_srv_constraint(none, &g, NULL), 0);
    cr_expect(g == NULL);
    json_decref(none);
}

/* ---------------------------------------------------------------- UTF-8 and the budget on a small vocab */
static jlm_gram_vocab *small_vocab(const char *const *pieces, uint32_t n, int eos)
{
    size_t lens[16];
    uint8_t eog[16] = {0};
    for (uint32_t i = 0; i < n; i++) lens[i] = strlen(pieces[i]);
    if (eos >= 0) eog[eos] = 1;
    jlm_gram_vocab *v;
    cr_assert_eq(jlm_gram_vocab_new(n, pieces, lens, eog, &v, NULL), 0);
    return v;
}

/* The allowed tokens after prefix with tokens_left, as a string of '1'/'0'. */
static void allowed(const jlm_gram *g, const jlm_gram_vocab *v, uint32_t n, const char *prefix, int left, char *out)
{
    jlm_gram_match *m;
    float lg[16] = {0};
    cr_assert_eq(jlm_gram_match_new(g, &m, NULL), 0);
    cr_assert_eq(jlm_gram_accept_bytes(m, prefix, strlen(prefix), NULL), 0, "%s", prefix);
    jlm_gram_mask(m, v, left, lg);
    for (uint32_t i = 0; i < n; i++) out[i] = lg[i] == -INFINITY ? '0' : '1';
    out[n] = 0;
    jlm_gram_match_free(m);
}

Test(grammar, utf8_partial_tokens_are_allowed_only_toward_a_completion, .timeout = 10)
{
    jlm_gram *g = parse_ok("root ::= (\"\\u00e9\" | \"\\u20ac\")+");
    /*                          0       1       2          3       4   5      6        7 */
    const char *pc[] = {"\xc3", "\xa9", "\xc3\xa9", "\xe2", "a", "", "\xf0", "\xc3\xa8"};
    jlm_gram_vocab *v = small_vocab(pc, 8, 5);
    char got[17];
    allowed(g, v, 8, "", -1, got);
    cr_expect_str_eq(got, "10110000", "start: lead bytes of é and €, and é whole");
    allowed(g, v, 8, "\xc3", -1, got);
    cr_expect_str_eq(got, "01000000", "after C3 only A9 (é), not A8 (è)");
    allowed(g, v, 8, "\xc3\xa9", -1, got);
    cr_expect_str_eq(got, "10110100", "after é: more, or the end");
    jlm_gram_free(g);
    /* a negated class takes any valid UTF-8, never surrogates or overlong forms */
    g = parse_ok("root ::= [^a]");
    cr_expect(matches(g, "\xf0\x9f\x98\x80"));
    cr_expect(matches(g, "\xe2\x82\xac"));
    cr_expect(!matches(g, "\xed\xa0\x80"), "a UTF-8-encoded surrogate");
    cr_expect(!matches(g, "\xc0\xa9") && !matches(g, "\xe0\x80\xa9"), "overlong");
    cr_expect(!matches(g, "\x80") && !matches(g, "\xf8\x88\x80\x80\x80"), "a stray continuation, a 5-byte form");
    cr_expect(!matches(g, "\xc3"), "an unfinished character is not a whole match");
    jlm_gram_vocab_free(v);
    jlm_gram_free(g);
}

/* Nested optional rules reach one parse stack by exponentially many paths (the
 * inner "a"? may be empty at every level); each step expands a stack once, so
 * these finish (they took hours when every path was walked). */
Test(grammar, nested_optional_repetitions_match_in_linear_work, .timeout = 20)
{
    char a[1602];
    memset(a, 'a', sizeof a - 1);
    a[sizeof a - 1] = 0;
    jlm_gram *g = parse_ok("root ::= ((\"a\"?){0,40}){0,40}");
    cr_expect(matches(g, ""));
    cr_expect(matches(g, "aaaa"));
    a[1600] = 0;
    cr_expect(matches(g, a), "40 x 40 a's");
    a[1600] = 'a';
    cr_expect(!matches(g, a), "one a more than 40 x 40");
    cr_expect(!matches(g, "aab"));
    jlm_gram_free(g);
    g = parse_ok("root ::= x{0,30} \"!\"\nx ::= y{0,30}\ny ::= \"a\"? \"b\"?");
    const char *pc[] = {"a", "b", "!", "c", ""};
    jlm_gram_vocab *v = small_vocab(pc, 5, 4);
    char got[17];
    allowed(g, v, 5, "abba", -1, got);
    cr_expect_str_eq(got, "11100", "after abba: a, b or the closing !");
    allowed(g, v, 5, "abba!", -1, got);
    cr_expect_str_eq(got, "00001", "after !: only the end");
    cr_expect(matches(g, "ababbbaab!") && !matches(g, "abc!"));
    jlm_gram_vocab_free(v);
    jlm_gram_free(g);
}

/* A grammar where every character can open another parse keeps its stack
 * sets at their bounds, and every byte is taken by nearly every stack. A step
 * still costs a bounded amount of work (sets indexed and capped in entries,
 * bytes that the same stacks take fed once), and the mask and the matcher
 * agree: on the byte fed at every step, and on all 256 at a few steps. Each
 * mask fed the whole set once per byte before (a fuzz input timed out). */
Test(grammar, an_ambiguous_grammar_steps_in_bounded_work, .timeout = 10)
{
    jlm_gram *g = parse_ok("root ::= r\nr ::= [^x] r [^y] | [^z] r | [^w] [^v] r [^u] | \"\"");
    static char bytes[256];
    const char *pc[257];
    size_t ln[257];
    uint8_t eog[257] = {0};
    for (int i = 0; i < 256; i++) { bytes[i] = (char)i; pc[i] = &bytes[i]; ln[i] = 1; }
    pc[256] = "";
    ln[256] = 0;
    eog[256] = 1;
    jlm_gram_vocab *v;
    cr_assert_eq(jlm_gram_vocab_new(257, pc, ln, eog, &v, NULL), 0);
    jlm_gram_match *m;
    cr_assert_eq(jlm_gram_match_new(g, &m, NULL), 0);
    static const char text[] = "abxyuvwcdabyyxuuvvwwabcxyzw";
    char fed[64];
    float lg[257];
    for (size_t k = 0; k + 1 < sizeof text; k++) {
        for (int i = 0; i < 257; i++) lg[i] = 0;
        cr_assert_geq(jlm_gram_mask(m, v, -1, lg), 0);
        if (k == 1 || k == 8) {
            for (int b = 0; b < 256; b++) {
                fed[k] = (char)b;
                cr_expect_eq(lg[b] == 0, prefix_ok(g, fed, k + 1), "step %zu byte %d: the mask and the matcher differ", k, b);
            }
        }
        unsigned char c = (unsigned char)text[k];
        int ok = jlm_gram_accept(m, v, c, NULL) == 0;
        cr_assert_eq(lg[c] == 0, ok, "step %zu ('%c'): the mask and the matcher differ", k, c);
        if (!ok) break;
        fed[k] = (char)c;
    }
    jlm_gram_match_free(m);
    jlm_gram_vocab_free(v);
    jlm_gram_free(g);
}

Test(grammar, the_budget_leaves_only_tokens_that_can_still_close, .timeout = 10)
{
    jlm_gram *g = parse_ok("root ::= \"[\" (\"ab\" | \"c\")* \"]\"");
    /*                          0    1    2    3    4     5     6  */
    const char *pc[] = {"[", "a", "b", "c", "]", "c]", ""};
    jlm_gram_vocab *v = small_vocab(pc, 7, 6);
    char got[17];
    cr_expect_eq(jlm_gram_min_len(g), 2);
    allowed(g, v, 7, "[a", -1, got);
    cr_expect_str_eq(got, "0010000", "inside \"ab\" only b");
    allowed(g, v, 7, "[a", 2, got);
    cr_expect_str_eq(got, "0010000", "b then ] fits in 2");
    allowed(g, v, 7, "[", 3, got);
    cr_expect_str_eq(got, "0101110");
    allowed(g, v, 7, "[", 2, got);
    cr_expect_str_eq(got, "0001110", "a needs b and ] after it: 3 tokens");
    allowed(g, v, 7, "[", 1, got);
    cr_expect_str_eq(got, "0000110", "one token left: only what closes");
    allowed(g, v, 7, "[c]", 1, got);
    cr_expect_str_eq(got, "0000001", "complete: only the end");
    jlm_gram_match *m;
    cr_assert_eq(jlm_gram_match_new(g, &m, NULL), 0);
    cr_expect_eq(jlm_gram_close_cost(m), 2);
    cr_expect_eq(jlm_gram_accept(m, v, 1, NULL), JLM_EINVAL, "a before [");
    cr_expect_eq(jlm_gram_accept(m, v, 6, NULL), JLM_EINVAL, "the end before the grammar is complete");
    cr_expect_eq(jlm_gram_accept(m, v, 0, NULL), 0);
    cr_expect_eq(jlm_gram_accept(m, v, 1, NULL), 0);
    cr_expect_eq(jlm_gram_close_cost(m), 2, "b and ]");
    cr_expect_eq(jlm_gram_accept(m, v, 9, NULL), JLM_ERANGE);
    jlm_gram_match_free(m);
    jlm_gram_vocab_free(v);
    jlm_gram_free(g);
}
