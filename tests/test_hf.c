/* test_hf.c - Hugging Face folders as a converter source: tiny-llama and
 * tiny-qwen2 against Hugging Face transformers' fp32 forward (logits at every
 * position within 1e-4 of max |logit|, 3 x 40 greedy ids exact), the sharded
 * copy giving the same container byte for byte, and every refusal the issue
 * lists (truncated shard, overlapping / out-of-range offsets, dtypes, a
 * config.json contradicting the tensors, a missing shard) with no output left.
 * The llama.cpp oracles of tiny-phi3/gemma3/mixtral run in test_engine.c. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>

#include "converter/convert.h"
#include "converter/hf.h"
#include "converter/safetensors.h"
#include "converter/vocab.h"
#include "engine/model.h"
#include "format/dequant.h"
#include "text/tokenizer/tokenizer.h"
#include "tests/hf_synth.h"
#include "tests/testutil.h"

#include <sys/stat.h>
#include <unistd.h>

#define TOL_HF 1e-4   /* transformers' fp32 forward of the same bf16 weights: only summation order differs */

static char *hf_dir(const char *name)
{
    char *p = malloc(1024);
    snprintf(p, 1024, "%s/tests/models/hf/%s", tu_root(), name);
    return p;
}

static char *convert_dir(const char *src, const char *dir, const char *name)
{
    char *out = malloc(1024);
    snprintf(out, 1024, "%s/%s.jlm", dir, name);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(src, NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(c, out, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    return out;
}

/* The F32 tensor `name` of a golden safetensors file (read with jansson, not
 * with the reader under test). */
static float *golden(const char *path, const char *name, size_t *n)
{
    size_t len = 0;
    unsigned char *b = tu_read_file(path, &len);
    cr_assert(b && len > 8, "%s", path);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)b[i] << (8 * i);
    json_t *h = json_loadb((const char *)b + 8, hl, 0, NULL), *e = json_object_get(h, name);
    cr_assert(e && !strcmp(json_string_value(json_object_get(e, "dtype")), "F32"), "%s: %s", path, name);
    json_t *of = json_object_get(e, "data_offsets");
    size_t lo = json_integer_value(json_array_get(of, 0)), hi = json_integer_value(json_array_get(of, 1));
    float *v = malloc(hi - lo);
    memcpy(v, b + 8 + hl + lo, hi - lo);
    *n = (hi - lo) / 4;
    json_decref(h);
    free(b);
    return v;
}

static int32_t *ids(json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

static int32_t argmax(const float *l, uint32_t n)
{
    int32_t b = 0;
    for (uint32_t j = 1; j < n; j++)
        if (l[j] > l[b]) b = (int32_t)j;
    return b;
}

/* Logits after every prefix of the golden input ids (one token per eval). */
static void logits_match(jlm_engine *e, const char *exp_dir, const char *name)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/meta.json", exp_dir);
    json_t *meta = json_load_file(p, 0, NULL);
    size_t np, nl;
    int32_t *in = ids(json_object_get(meta, "input_ids"), &np);
    snprintf(p, sizeof p, "%s/activations.safetensors", exp_dir);
    float *want = golden(p, "logits", &nl);
    uint32_t nv = jlm_engine_n_vocab(e);
    cr_assert_eq(nl, np * nv);
    float *l = malloc(nv * sizeof *l);
    jlm_err err = {0};
    jlm_engine_rewind(e, 0);
    double worst = 0;
    for (size_t t = 0; t < np; t++) {
        cr_assert_eq(jlm_engine_eval(e, &in[t], 1, l, &err), 0, "%s", err.msg);
        double mx = 0, d = 0;
        for (uint32_t i = 0; i < nv; i++) {
            double r = want[t * nv + i];
            mx = fmax(mx, fabs(r));
            if (!(fabs(r - l[i]) <= d)) d = fabs(r - l[i]);
        }
        cr_assert(!(d > TOL_HF * mx), "%s position %zu: logit error %g > %g x %g", name, t, d, TOL_HF, mx);
        worst = fmax(worst, d / mx);
    }
    cr_log_info("%s: worst logit error %.3g of max |logit| over %zu positions", name, worst, np);
    free(l); free(want); free(in);
    json_decref(meta);
}

static void greedy_match(jlm_engine *e, const char *exp_dir, const char *name)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/generate.json", exp_dir);
    json_t *g = json_load_file(p, 0, NULL), *cases = json_object_get(g, "cases");
    cr_assert(json_array_size(cases) >= 3, "%s", p);
    uint32_t nv = jlm_engine_n_vocab(e);
    float *l = malloc(nv * sizeof *l);
    jlm_err err = {0};
    for (size_t c = 0; c < json_array_size(cases); c++) {
        size_t np, ng;
        int32_t *pr = ids(json_object_get(json_array_get(cases, c), "prompt_ids"), &np);
        int32_t *want = ids(json_object_get(json_array_get(cases, c), "generated_ids"), &ng);
        jlm_engine_rewind(e, 0);
        cr_assert_eq(jlm_engine_eval(e, pr, (uint32_t)np, l, &err), 0, "%s", err.msg);
        for (size_t i = 0; i < ng; i++) {
            int32_t id = argmax(l, nv);
            cr_assert_eq(id, want[i], "%s case %zu: id %zu is %d, transformers %d", name, c, i, id, want[i]);
            cr_assert_eq(jlm_engine_eval(e, &id, 1, l, &err), 0, "%s", err.msg);
        }
        free(pr); free(want);
    }
    free(l);
    json_decref(g);
}

static void against_transformers(const char *name)
{
    char *dir = tu_tmpdir(), *src = hf_dir(name), exp_dir[1100];
    char *out = convert_dir(src, dir, name);
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1};
    jlm_engine *e;
    jlm_err err = {0};
    cr_assert_eq(jlm_engine_open(out, &o, &e, &err), 0, "%s", err.msg);
    snprintf(exp_dir, sizeof exp_dir, "%s/expected", src);
    logits_match(e, exp_dir, name);
    greedy_match(e, exp_dir, name);
    jlm_engine_close(e);
    free(out); free(src);
    tu_rmrf(dir);
    free(dir);
}

Test(hf, tiny_llama_matches_transformers, .timeout = 60) { against_transformers("tiny-llama"); }
Test(hf, tiny_qwen2_with_head_dim_24_matches_transformers, .timeout = 60) { against_transformers("tiny-qwen2"); }

Test(hf, sharded_folder_gives_the_same_container_byte_for_byte, .timeout = 60)
{
    char *dir = tu_tmpdir(), *one = hf_dir("tiny-llama"), *sh = hf_dir("tiny-llama-sharded");
    char *a = convert_dir(one, dir, "one"), *b = convert_dir(sh, dir, "sharded");
    size_t na = 0, nb = 0;
    unsigned char *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    cr_assert(x && y && na == nb && !memcmp(x, y, na), "the sharded folder's container differs");
    free(x); free(y); free(a); free(b); free(one); free(sh);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- crafted images */
typedef struct tdef { const char *name, *dtype; uint64_t shape[2]; int nd; uint64_t b, e; } tdef;

/* A safetensors image of the given entries; data bytes are a pattern. */
static unsigned char *image(const tdef *t, int n, size_t data_len, size_t *len)
{
    char hdr[4096];
    int k = snprintf(hdr, sizeof hdr, "{");
    for (int i = 0; i < n; i++) {
        k += snprintf(hdr + k, sizeof hdr - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].nd; d++)
            k += snprintf(hdr + k, sizeof hdr - k, "%s%llu", d ? "," : "", (unsigned long long)t[i].shape[d]);
        k += snprintf(hdr + k, sizeof hdr - k, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t[i].b,
                      (unsigned long long)t[i].e);
    }
    k += snprintf(hdr + k, sizeof hdr - k, "}");
    *len = 8 + (size_t)k + data_len;
    unsigned char *b = malloc(*len);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)k >> (8 * i));
    memcpy(b + 8, hdr, (size_t)k);
    for (size_t i = 0; i < data_len; i++)
        b[8 + k + i] = (unsigned char)(i * 7);
    return b;
}

static void refused(const tdef *t, int n, size_t data_len, const char *want1, const char *want2)
{
    size_t len = 0;
    unsigned char *b = image(t, n, data_len, &len);
    jlm_st_set *s = NULL;
    jlm_err err = {0};
    cr_assert_neq(jlm_st_open_mem(b, len, "x.safetensors", &s, &err), 0);
    cr_assert(strstr(err.msg, "x.safetensors") && strstr(err.msg, want1) && (!want2 || strstr(err.msg, want2)),
              "message: %s", err.msg);
    free(b);
}

Test(hf, refuses_overlapping_out_of_range_and_holed_offsets)
{
    tdef ov[] = {{"a", "F32", {4}, 1, 0, 16}, {"b", "F32", {4}, 1, 8, 24}};
    refused(ov, 2, 24, "'b'", "overlaps 'a'");
    tdef out[] = {{"a", "F32", {4}, 1, 0, 16}, {"b", "F32", {4}, 1, 16, 32}};
    refused(out, 2, 20, "'b'", "past the end");
    tdef hole[] = {{"a", "F32", {4}, 1, 0, 16}, {"b", "F32", {4}, 1, 20, 36}};
    refused(hole, 2, 36, "'b'", "hole");
    tdef size[] = {{"a", "F32", {4, 2}, 2, 0, 16}};
    refused(size, 1, 16, "'a'", "needs 32");
    tdef tail[] = {{"a", "F16", {4}, 1, 0, 8}};
    refused(tail, 1, 12, "4 bytes after", NULL);
}

Test(hf, refuses_dtypes_it_cannot_store_by_name)
{
    tdef t[] = {{"w", "F8_E4M3", {4}, 1, 0, 4}};
    refused(t, 1, 4, "'w'", "dtype F8_E4M3");
    tdef i[] = {{"w", "I64", {4}, 1, 0, 32}};
    refused(i, 1, 32, "'w'", "dtype I64");
}

Test(hf, refuses_a_bad_header_length_and_json)
{
    unsigned char b[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    jlm_st_set *s = NULL;
    jlm_err err = {0};
    cr_assert_neq(jlm_st_open_mem(b, sizeof b, "x.safetensors", &s, &err), 0);
    cr_assert(strstr(err.msg, "header length"), "%s", err.msg);
    unsigned char c[16] = {8, 0, 0, 0, 0, 0, 0, 0, '[', '1', ']', ' ', ' ', ' ', ' ', ' '};
    cr_assert_neq(jlm_st_open_mem(c, sizeof c, "x.safetensors", &s, &err), 0);
    cr_assert(strstr(err.msg, "not a JSON object"), "%s", err.msg);
}

/* The fuzz seeds are small valid models of eight classes: they open and a
 * tensor of each reads back (llama q/k permuted, mixtral experts stacked,
 * gemma norms + 1, olmoe's wide q norm, gpt-oss's MXFP4 up rows of a shared
 * gate_up tensor, deepseek2's attn_k_b transposed out of kv_b_proj, glm4moe's
 * selection bias, llama4's up experts transposed out of gate_up_proj). */
Test(hf, fuzz_seeds_open_as_models)
{
    const char *seeds[] = {"llama.bin", "mixtral.bin", "gemma3.bin", "olmoe.bin", "gpt-oss.bin", "deepseek2.bin",
                           "glm4moe.bin", "llama4.bin"};
    const char *probe[] = {"blk.0.attn_q.weight", "blk.0.ffn_up_exps.weight", "blk.0.post_ffw_norm.weight",
                           "blk.0.attn_q_norm.weight", "blk.1.ffn_up_exps.weight", "blk.1.attn_k_b.weight",
                           "blk.1.exp_probs_b.bias", "blk.1.ffn_up_exps.weight"};
    for (int i = 0; i < 8; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/tests/fuzz/seeds-safetensors/%s", tu_root(), seeds[i]);
        size_t len = 0;
        unsigned char *b = tu_read_file(p, &len);
        unsigned char *nul = memchr(b, 0, len);
        const char *cfg = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8,\"intermediate_size\":16,"
                          "\"num_attention_heads\":2,\"num_hidden_layers\":1,\"num_key_value_heads\":1,\"vocab_size\":4}";
        size_t cl = strlen(cfg);
        const unsigned char *img = b;
        if (nul && i) {
            cfg = (const char *)b;
            cl = (size_t)(nul - b);
            img = nul + 1;
        }
        jlm_gguf *g;
        jlm_err err = {0};
        cr_assert_eq(jlm_hf_open_mem(cfg, cl, img, len - (size_t)(img - b), &g, &err), 0, "%s: %s", seeds[i], err.msg);
        const jlm_gguf_tensor *t = jlm_gguf_find_tensor(g, probe[i]);
        cr_assert(t, "%s: %s", seeds[i], probe[i]);
        unsigned char *buf = malloc(t->n_bytes);
        cr_assert_eq(jlm_gguf_read(g, t, 0, buf, t->n_bytes, &err), 0, "%s", err.msg);
        free(buf);
        jlm_gguf_close(g);
        free(b);
    }
}

/* llama.cpp's permute(): HF row (head h, half p, i) is GGUF row (h, i, p). */
Test(hf, llama_q_rows_are_permuted_as_llama_cpp_does)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fuzz/seeds-safetensors/llama.bin", tu_root());
    size_t len = 0;
    unsigned char *b = tu_read_file(p, &len);
    const char *cfg = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8,\"intermediate_size\":16,"
                      "\"num_attention_heads\":2,\"num_hidden_layers\":1,\"num_key_value_heads\":1,\"vocab_size\":4}";
    jlm_gguf *g;
    jlm_st_set *s;
    jlm_err err = {0};
    cr_assert_eq(jlm_hf_open_mem(cfg, strlen(cfg), b, len, &g, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_st_open_mem(b, len, "seed", &s, &err), 0, "%s", err.msg);
    const jlm_st_tensor *q = jlm_st_find(s, "model.layers.0.self_attn.q_proj.weight");
    uint16_t hfq[64], gq[64];
    cr_assert_eq(jlm_st_read(s, q, 0, hfq, sizeof hfq, &err), 0);
    cr_assert_eq(jlm_gguf_read(g, jlm_gguf_find_tensor(g, "blk.0.attn_q.weight"), 0, gq, sizeof gq, &err), 0);
    for (int h = 0; h < 2; h++)          /* 2 heads of 4 rows: halves of 2 */
        for (int i = 0; i < 2; i++)
            for (int pp = 0; pp < 2; pp++)
                cr_assert(!memcmp(&gq[(h * 4 + i * 2 + pp) * 8], &hfq[(h * 4 + pp * 2 + i) * 8], 16),
                          "row h%d i%d p%d", h, i, pp);
    jlm_st_close(s);
    jlm_gguf_close(g);
    free(b);
}

/* ---------------------------------------------------------------- folders, through the CLI */
static char *copy_folder(const char *name)
{
    char *d = tu_tmpdir(), *src = hf_dir(name), cmd[2400];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s/m' && chmod -R u+w '%s/m'", src, d, d);
    cr_assert_eq(system(cmd), 0);
    free(src);
    return d;
}

/* `jlm convert DIR/m` fails with one line containing want and leaves nothing. */
static void cli_refuses(const char *d, const char *want)
{
    char cmd[2400], log[1100], out[1100], part[1200];
    snprintf(log, sizeof log, "%s/err.txt", d);
    snprintf(out, sizeof out, "%s/out.jlm", d);
    snprintf(part, sizeof part, "%s.part", out);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s/m' -o '%s' 2>'%s'", tu_jlm(), d, out, log);
    cr_assert_neq(system(cmd), 0, "convert succeeded");
    size_t n = 0;
    unsigned char *raw = tu_read_file(log, &n);
    char *msg = calloc(1, n + 1);
    if (raw)
        memcpy(msg, raw, n);
    free(raw);
    cr_assert(strstr(msg, want), "stderr: %s", msg);
    cr_assert(!tu_exists(out) && !tu_exists(part), "output left behind");
    free(msg);
}

static void edit_config(const char *d, const char *from, const char *to)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/m/config.json", d);
    size_t n = 0;
    unsigned char *raw = tu_read_file(p, &n);
    char *s = calloc(1, n + 1);
    memcpy(s, raw, n);
    free(raw);
    char *at = strstr(s, from);
    cr_assert(at, "%s not in config", from);
    FILE *f = fopen(p, "wb");
    fwrite(s, 1, (size_t)(at - s), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    free(s);
}

Test(hf_cli, converts_a_folder_and_refuses_a_truncated_shard, .timeout = 60)
{
    char *d = copy_folder("tiny-llama"), cmd[2400];
    snprintf(cmd, sizeof cmd, "'%s' convert '%s/m' >/dev/null 2>&1 && test -s '%s/m.jlm'", tu_jlm(), d, d);
    cr_assert_eq(system(cmd), 0, "jlm convert DIR writes DIR.jlm");
    snprintf(cmd, sizeof cmd, "truncate -s -100 '%s/m/model.safetensors'", d);
    cr_assert_eq(system(cmd), 0);
    cli_refuses(d, "model.safetensors: tensor '");
    tu_rmrf(d);
    free(d);
}

Test(hf_cli, refuses_a_missing_shard, .timeout = 60)
{
    char *d = copy_folder("tiny-llama-sharded"), p[1100];
    snprintf(p, sizeof p, "%s/m/model-00002-of-00002.safetensors", d);
    cr_assert_eq(unlink(p), 0);
    cli_refuses(d, "model-00002-of-00002.safetensors");
    tu_rmrf(d);
    free(d);
}

Test(hf_cli, refuses_a_config_contradicting_the_tensors, .timeout = 60)
{
    char *d = copy_folder("tiny-llama");
    edit_config(d, "\"intermediate_size\": 176", "\"intermediate_size\": 160");
    cli_refuses(d, "mlp.down_proj.weight' has shape [64, 176], config.json gives [64, 160]");
    tu_rmrf(d);
    free(d);
}

Test(hf_cli, refuses_an_unknown_class_and_a_missing_lm_head, .timeout = 60)
{
    char *d = copy_folder("tiny-llama");
    edit_config(d, "LlamaForCausalLM", "FalconForCausalLM");
    cli_refuses(d, "class 'FalconForCausalLM' is not supported");
    tu_rmrf(d);
    free(d);
    d = copy_folder("tiny-qwen2");
    edit_config(d, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    cli_refuses(d, "tie_word_embeddings is false but there is no lm_head.weight");
    tu_rmrf(d);
    free(d);
}

/* ---------------------------------------------------------------- tokenizer.json */
/* A folder with only tokenizer.json (unpacked from .xz: 9-11 MB as JSON) and
 * tokenizer_config.json becomes a vocab-only container; every reference string
 * tokenizes to Hugging Face tokenizers' ids, with and without the
 * post-processor's additions, and decodes back to its `decoded`. */
/* The container's default chat template is tokenizer_config.json's, byte for byte. */
static void template_kept(const char *d, const jlm_model *m, const char *name)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/t/tokenizer_config.json", d);
    json_t *tc = json_load_file(p, JSON_DECODE_INT_AS_REAL, NULL);
    const char *want = json_string_value(json_object_get(tc, "chat_template"));
    const jlm_str *got = NULL;
    for (uint32_t i = 0; i < m->vocab.n_templates; i++)
        if (m->vocab.templates[2 * i].len == 0)
            got = &m->vocab.templates[2 * i + 1];
    if (!json_object_get(tc, "chat_template")) {   /* llama2's config has none: the container has none either */
        cr_assert(!got, "%s: a chat template from nowhere", name);
        json_decref(tc);
        return;
    }
    cr_assert(want, "%s: chat_template is not a string", p);
    cr_assert(got && got->len == strlen(want) && !memcmp(got->s, want, got->len), "%s: chat template differs", name);
    json_decref(tc);
}

/* qwen3's tokenizer.json has normalizer NFC: carried as a first PreOp of
 * Kind 5 with Behavior "nfc" (docs/tokenizer.md), so decomposed text
 * tokenizes as its NFC form, as HF tokenizers does. Another Behavior on that
 * kind is refused by name. */
static void nfc_applied(const jlm_model *m, jlm_tok *tok)
{
    const jlm_vocab *v = &m->vocab;
    cr_assert(v->n_preops >= 2 && v->preops[0].kind == 5 && v->preops[0].behavior.len == 3 &&
              !memcmp(v->preops[0].behavior.s, "nfc", 3), "no NFC stage first");
    static const char *const P[][2] = {
        {"caf\xc3\xa9 cr\xc3\xa8me", "cafe\xcc\x81 cre\xcc\x80me"},               /* e + U+0301 / U+0300 */
        {"\xc3\x85ngstr\xc3\xb6m", "A\xcc\x8angstro\xcc\x88m"},                   /* A + ring, o + diaeresis */
        {"Vi\xe1\xbb\x87t", "Vie\xcc\x82\xcc\xa3t"},                             /* e + U+0302 + U+0323: reordered */
        {"\xea\xb0\x80\xeb\x82\x98", "\xe1\x84\x80\xe1\x85\xa1\xe1\x84\x82\xe1\x85\xa1"}, /* Hangul jamo */
    };
    jlm_err err = {0};
    for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
        int32_t *a = NULL, *b = NULL;
        size_t na, nb;
        cr_assert_eq(jlm_tok_encode(tok, P[i][0], strlen(P[i][0]), 0, 1, &a, &na, &err), 0, "%s", err.msg);
        cr_assert_eq(jlm_tok_encode(tok, P[i][1], strlen(P[i][1]), 0, 1, &b, &nb, &err), 0, "%s", err.msg);
        cr_assert(na == nb && !memcmp(a, b, na * 4), "'%s' does not tokenize as its NFC form '%s' (%zu ids, %zu)",
                  P[i][1], P[i][0], nb, na);
        free(a);
        free(b);
    }
    jlm_vocab w = *v;
    jlm_preop ops[16];
    cr_assert(v->n_preops <= 16);
    memcpy(ops, v->preops, v->n_preops * sizeof *ops);
    ops[0].behavior = (jlm_str){"nfkc", 4};
    w.preops = ops;
    jlm_tok *t2 = NULL;
    cr_assert_neq(jlm_tok_create(&w, &t2, &err), 0, "a Kind 5 stage 'nfkc' was accepted");
    cr_assert(strstr(err.msg, "nfkc") && strstr(err.msg, "not supported"), "%s", err.msg);
}

/* A temp dir d with d/t holding tests/models/hf-tok/NAME's tokenizer files
 * (tokenizer.json unpacked from .xz). */
static char *unpack_tokenizer(const char *name)
{
    char *d = tu_tmpdir(), cmd[3000];
    snprintf(cmd, sizeof cmd, "mkdir '%s/t' && cp '%s/tests/models/hf-tok/%s/tokenizer_config.json' '%s/t/' && "
             "xz -dc '%s/tests/models/hf-tok/%s/tokenizer.json.xz' > '%s/t/tokenizer.json'",
             d, tu_root(), name, d, tu_root(), name, d);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    return d;
}

/* Converts the folder d/t to d/v.jlm and opens it with its tokenizer. */
static void convert_tokenizer(const char *d, jlm_model **m, jlm_tok **tok)
{
    char src[1100], out[1100];
    snprintf(src, sizeof src, "%s/t", d);
    snprintf(out, sizeof out, "%s/v.jlm", d);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(src, NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c->n_tensors, 0);
    cr_assert_eq(jlm_conv_write(c, out, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    cr_assert_eq(jlm_fmt_open(out, m, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_tok_create(&(*m)->vocab, tok, &err), 0, "%s", err.msg);
}

/* The reference case cs's text tokenizes (parse_special on) to its ids,
 * with (add 1) and without the post-processor's additions; the ids without
 * them, in *got (malloc'd) and *n when got is non-NULL. */
static void case_matches(jlm_tok *tok, json_t *cs, const char *name, const char *what, int32_t **keep, size_t *kn)
{
    const char *text = json_string_value(json_object_get(cs, "text"));
    jlm_err err = {0};
    for (int add = 1; add >= 0; add--) {
        size_t nw, n;
        int32_t *want = ids(json_object_get(cs, add ? "ids_add_special" : "ids"), &nw), *got = NULL;
        cr_assert_eq(jlm_tok_encode(tok, text, strlen(text), add, 1, &got, &n, &err), 0, "%s", err.msg);
        cr_assert(n == nw && (!n || !memcmp(got, want, n * 4)), "%s: '%s'%s (add_special %d): %zu ids, HF %zu", name,
                  text, what, add, n, nw);
        free(want);
        if (!add && keep) {
            *keep = got;
            *kn = n;
        } else {
            free(got);
        }
    }
}

static void against_hf_tokenizers(const char *name)
{
    char *d = unpack_tokenizer(name), ref[1100];
    jlm_err err = {0};
    jlm_model *m;
    jlm_tok *tok;
    convert_tokenizer(d, &m, &tok);
    template_kept(d, m, name);
    snprintf(ref, sizeof ref, "%s/tests/reference/hf-tokenizers/%s.json", tu_root(), name);
    json_t *o = json_load_file(ref, 0, NULL), *cases = json_object_get(o, "cases"), *cs;
    size_t i;
    cr_assert(json_array_size(cases) > 50, "%s", ref);
    json_array_foreach(cases, i, cs) {
        int32_t *got;
        size_t n;
        case_matches(tok, cs, name, "", &got, &n);
        char *txt;
        size_t tl;
        const char *dec = json_string_value(json_object_get(cs, "decoded"));
        cr_assert_eq(jlm_tok_decode(tok, got, n, 1, &txt, &tl, &err), 0, "%s", err.msg);
        cr_assert(tl == strlen(dec) && !memcmp(txt, dec, tl), "%s: '%s' decodes to '%s'", name, dec, txt);
        free(txt);
        free(got);
    }
    json_decref(o);
    if (!strcmp(name, "qwen3"))
        nfc_applied(m, tok);
    jlm_tok_destroy(tok);
    jlm_fmt_close(m);
    tu_rmrf(d);
    free(d);
}

Test(hf_tok, llama3_tokenizer_json_matches_hf_tokenizers, .timeout = 180) { against_hf_tokenizers("llama3"); }
Test(hf_tok, qwen3_tokenizer_json_matches_hf_tokenizers, .timeout = 180) { against_hf_tokenizers("qwen3"); }
Test(hf_tok, llama2_tokenizer_json_matches_hf_tokenizers, .timeout = 180) { against_hf_tokenizers("llama2"); }
Test(hf_tok, gemma3_tokenizer_json_matches_hf_tokenizers, .timeout = 180) { against_hf_tokenizers("gemma3"); }
Test(hf_tok, gpt_oss_tokenizer_json_matches_hf_tokenizers, .timeout = 180) { against_hf_tokenizers("gpt-oss"); }

/* A model.vocab entry spelled like a special token but not in added_tokens
 * is text (Hugging Face tokenizers matches only added_tokens as special): the
 * reference string holding that spelling, with the entry added to model.vocab
 * under a new id (no merge reaches it, so HF's split does not change), still
 * tokenizes to the reference ids with parse_special on. Qwen3's own "</s>"
 * and "<s>" are such entries: they stay NORMAL tokens, not added ones. */
static void vocab_spelled_special(const char *name)
{
    char *d = unpack_tokenizer(name), p[1100];
    snprintf(p, sizeof p, "%s/t/tokenizer.json", d);
    json_t *tj = json_load_file(p, 0, NULL), *vocab = json_object_get(json_object_get(tj, "model"), "vocab");
    json_t *added = json_object_get(tj, "added_tokens"), *v;
    cr_assert(json_is_object(vocab) && json_is_array(added), "%s", p);
    static const char *const cand[] = {"<end_of_turn>", "<|im_end|>"};
    const char *spell = NULL;
    json_int_t mx = -1;
    size_t i;
    const char *k;
    json_object_foreach(vocab, k, v)
        if (json_integer_value(v) > mx) mx = json_integer_value(v);
    json_array_foreach(added, i, v)
        if (json_integer_value(json_object_get(v, "id")) > mx) mx = json_integer_value(json_object_get(v, "id"));
    for (size_t c = 0; !spell && c < 2; c++) {
        int taken = json_object_get(vocab, cand[c]) != NULL;
        json_array_foreach(added, i, v)
            taken |= !strcmp(json_string_value(json_object_get(v, "content")), cand[c]);
        if (!taken)
            spell = cand[c];
    }
    cr_assert(spell, "%s: every candidate spelling is a token already", name);
    json_int_t new_id = mx + 1;
    json_object_set_new(vocab, spell, json_integer(new_id));
    cr_assert_eq(json_dump_file(tj, p, JSON_COMPACT), 0);
    json_decref(tj);

    jlm_model *m;
    jlm_tok *tok;
    convert_tokenizer(d, &m, &tok);
    cr_assert_eq(m->vocab.token_kinds[new_id], JLM_TOK_NORMAL, "%s: '%s' (a model.vocab entry) became kind %u", name,
                 spell, m->vocab.token_kinds[new_id]);
    for (uint32_t a = 0; a < m->vocab.n_added; a++)
        cr_assert_neq(m->vocab.added[a].id, new_id, "%s: '%s' is an added token", name, spell);
    if (!strcmp(name, "qwen3"))
        for (int s = 0; s < 2; s++) {
            const char *sp = s ? "</s>" : "<s>";
            int32_t id = -1;
            for (uint32_t j = 0; j < m->vocab.n_tokens && id < 0; j++)
                if (m->vocab.tokens[j].len == strlen(sp) && !memcmp(m->vocab.tokens[j].s, sp, strlen(sp)))
                    id = (int32_t)j;
            cr_assert(id >= 0 && m->vocab.token_kinds[id] == JLM_TOK_NORMAL, "qwen3: '%s' is not a NORMAL token", sp);
        }
    snprintf(p, sizeof p, "%s/tests/reference/hf-tokenizers/%s.json", tu_root(), name);
    json_t *o = json_load_file(p, 0, NULL), *cs;
    int seen = 0;
    json_array_foreach(json_object_get(o, "cases"), i, cs) {
        const char *text = json_string_value(json_object_get(cs, "text"));
        if (!strstr(text, spell))
            continue;
        seen++;
        char what[80];
        snprintf(what, sizeof what, " with '%s' in model.vocab", spell);
        case_matches(tok, cs, name, what, NULL, NULL);
    }
    cr_assert(seen, "%s: no reference string holds '%s'", name, spell);
    json_decref(o);
    jlm_tok_destroy(tok);
    jlm_fmt_close(m);
    tu_rmrf(d);
    free(d);
}

Test(hf_tok, llama3_vocab_entry_spelled_special_is_text, .timeout = 180) { vocab_spelled_special("llama3"); }
Test(hf_tok, qwen3_vocab_entry_spelled_special_is_text, .timeout = 180) { vocab_spelled_special("qwen3"); }
Test(hf_tok, llama2_vocab_entry_spelled_special_is_text, .timeout = 180) { vocab_spelled_special("llama2"); }
Test(hf_tok, gemma3_vocab_entry_spelled_special_is_text, .timeout = 180) { vocab_spelled_special("gemma3"); }
Test(hf_tok, gpt_oss_vocab_entry_spelled_special_is_text, .timeout = 180) { vocab_spelled_special("gpt-oss"); }

/* The tokenizer fuzz seeds (tiny byte-level BPEs shaped like qwen3's and
 * llama-3's files) build a vocab record: the fuzzer starts from valid inputs. */
Test(hf_tok, fuzz_seeds_build_a_vocab)
{
    const char *seeds[] = {"qwen-like.json", "llama3-like.json"};
    for (int i = 0; i < 2; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/tests/fuzz/seeds-hf-tokenizer/%s", tu_root(), seeds[i]);
        size_t len = 0;
        unsigned char *b = tu_read_file(p, &len);
        jlm_gguf *g;
        jlm_err err = {0};
        cr_assert_eq(jlm_hf_open_tok_mem((const char *)b, len, &g, &err), 0, "%s: %s", seeds[i], err.msg);
        jlm_arena *a = jlm_arena_new();
        jlm_vocab v;
        cr_assert_eq(jlm_conv_vocab(g, a, &v, &err), 0, "%s: %s", seeds[i], err.msg);
        cr_assert_eq(v.kind, JLM_VOCAB_BPE);
        cr_assert_eq(v.add_bos, i == 1, "%s: BOS from the post-processor", seeds[i]);
        jlm_arena_free(a);
        jlm_gguf_close(g);
        free(b);
    }
}

/* Each unsupported part of tokenizer.json is refused naming its field. */
Test(hf_tok, refuses_what_the_record_cannot_carry_by_field)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fuzz/seeds-hf-tokenizer/qwen-like.json", tu_root());
    json_t *base = json_load_file(p, 0, NULL);
    struct { const char *path, *value, *want; } cases[] = {
        {"normalizer", "{\"type\":\"NFKC\"}", "normalizer NFKC"},
        {"normalizer", "{\"type\":\"NFD\"}", "normalizer NFD"},
        {"normalizer", "{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"AAAA\"}", "normalizer Precompiled"},
        {"model.byte_fallback", "true", "pre_tokenizer (with byte_fallback"},
        {"model.type", "\"Unigram\"", "model.type Unigram"},
        {"decoder", "{\"type\":\"Metaspace\"}", "decoder Metaspace"},
        {"pre_tokenizer", "{\"type\":\"Whitespace\"}", "pre_tokenizer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *t = json_deep_copy(base), *v = json_loads(cases[i].value, JSON_DECODE_ANY, NULL);
        const char *dot = strchr(cases[i].path, '.');
        if (dot)
            json_object_set_new(json_object_get(t, "model"), dot + 1, v);
        else
            json_object_set_new(t, cases[i].path, v);
        char *s = json_dumps(t, 0);
        jlm_gguf *g;
        jlm_err err = {0};
        cr_assert_neq(jlm_hf_open_tok_mem(s, strlen(s), &g, &err), 0, "%s accepted", cases[i].path);
        cr_assert(strstr(err.msg, cases[i].want) && strstr(err.msg, "not supported"), "%s", err.msg);
        free(s);
        json_decref(t);
    }
    json_decref(base);
}

/* A far token id would fill the table with "[PADi]" holes: fuzz_hf_tokenizer's
 * id 1131801 among ~260 tokens took seconds and 700 MB. Past twice the tokens
 * (+1024) without a vocab_size to cover it, or past the container's vocab limit,
 * it is refused naming the id; a few holes are kept as before. */
Test(hf_tok, a_far_token_id_is_refused_not_padded)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fuzz/seeds-hf-tokenizer/qwen-like.json", tu_root());
    json_t *base = json_load_file(p, 0, NULL);
    cr_assert(base);
    size_t n = json_object_size(json_object_get(base, "model") ? json_object_get(json_object_get(base, "model"), "vocab") : NULL);
    cr_assert(n > 0);
    struct { long long id; int ok; const char *want; } cases[] = {
        {(long long)n + 40, 1, NULL},
        {1131801, 0, "leaves more holes"},
        {(1ll << 24) + 5, 0, "over the limit"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *t = json_deep_copy(base);
        json_object_set_new(json_object_get(json_object_get(t, "model"), "vocab"), "far", json_integer(cases[i].id));
        char *s = json_dumps(t, 0);
        jlm_gguf *g = NULL;
        jlm_err err = {0};
        int rc = jlm_hf_open_tok_mem(s, strlen(s), &g, &err);
        if (cases[i].ok) {
            cr_assert_eq(rc, 0, "id %lld: %s", cases[i].id, err.msg);
            jlm_gguf_close(g);
        } else {
            cr_assert_neq(rc, 0, "id %lld accepted", cases[i].id);
            cr_assert(strstr(err.msg, cases[i].want) && strstr(err.msg, "token id"), "%s", err.msg);
            cr_assert(!strchr(err.msg, '\n'));
        }
        free(s);
        json_decref(t);
    }
    json_decref(base);
}

/* The byte-fallback U+2581 shape (llama-2 style) is accepted as a whole;
 * each part changed to what the SPM record cannot do is refused by field. */
#define SPM_NORM "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\u2581\"}," \
                 "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\u2581\"}]}"
#define SPM_DEC3 "{\"type\":\"Replace\",\"pattern\":{\"String\":\"\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}"
Test(hf_tok, byte_fallback_parts_refused_by_field)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fuzz/seeds-hf-tokenizer/qwen-like.json", tu_root());
    json_t *base = json_load_file(p, 0, NULL);
    json_object_set_new(json_object_get(base, "model"), "byte_fallback", json_true());
    json_object_set_new(base, "pre_tokenizer", json_null());
    json_object_set_new(base, "normalizer", json_loads(SPM_NORM, 0, NULL));
    json_object_set_new(base, "decoder", json_loads("{\"type\":\"Sequence\",\"decoders\":[" SPM_DEC3
                                                    ",{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}", 0, NULL));
    struct { const char *path, *value, *want; } cases[] = {
        {NULL, NULL, NULL},
        {"pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithPrevious\",\"invert\":false}", NULL},
        {"normalizer", "{\"type\":\"Precompiled\"}", "normalizer"},
        {"normalizer", "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\u2581\"}", "decoder"},
        {"decoder", "{\"type\":\"Sequence\",\"decoders\":[" SPM_DEC3 "]}", "decoder"},
        {"pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithPrevious\",\"invert\":true}", "pre_tokenizer"},
        {"pre_tokenizer", "{\"type\":\"Metaspace\"}", "pre_tokenizer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *t = json_deep_copy(base);
        if (cases[i].path)
            json_object_set_new(t, cases[i].path, json_loads(cases[i].value, JSON_DECODE_ANY, NULL));
        char *s = json_dumps(t, 0);
        jlm_gguf *g = NULL;
        jlm_err err = {0};
        int rc = jlm_hf_open_tok_mem(s, strlen(s), &g, &err);
        if (!cases[i].want) {
            cr_assert_eq(rc, 0, "case %zu: %s", i, err.msg);
            jlm_gguf_str m;
            cr_assert_eq(jlm_gguf_get_str(g, "tokenizer.ggml.model", &m, &err), 0);
            cr_assert_str_eq(m.s, "llama");
            cr_assert(jlm_gguf_find(g, "tokenizer.ggml.scores"));
            jlm_gguf_close(g);
        } else {
            cr_assert_neq(rc, 0, "case %zu accepted", i);
            cr_assert(strstr(err.msg, cases[i].want) && strstr(err.msg, "not supported"), "%s", err.msg);
        }
        free(s);
        json_decref(t);
    }
    json_decref(base);
}

/* ---------------------------------------------------------------- --type */
/* synth-llama-256.<T>.gguf are llama-quantize's outputs from synth-llama-256.f32.gguf:
 * quantizing the F32 file at conversion gives the same container byte for byte
 * (ggml's reference quantizers, llama-quantize's choice of tensors: output.weight
 * in Q6_K; under the _M mixes attn_v and ffn_down of layers 2 and 3 of 4 in Q6_K). */
Test(quantize, at_conversion_equals_llama_quantize_for_every_type, .timeout = 120)
{
    const char *types[] = {"Q8_0", "Q6_K", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q4_K_M", "Q5_K_M"};
    char *d = tu_tmpdir(), a[1100], b[1100], ref[300];
    snprintf(a, sizeof a, "%s/q.jlm", d);
    snprintf(b, sizeof b, "%s/r.jlm", d);
    for (int i = 0; i < 8; i++) {
        jlm_conv *c;
        jlm_err err = {0};
        cr_assert_eq(jlm_conv_open_as(tu_model("synth-llama-256.f32.gguf"), types[i], NULL, &c, &err), 0, "%s", err.msg);
        cr_assert_eq(jlm_conv_write(c, a, NULL, NULL, NULL, &err), 0, "%s", err.msg);
        jlm_conv_close(c);
        snprintf(ref, sizeof ref, "synth-llama-256.%s.gguf", types[i]);
        cr_assert_eq(jlm_conv_open(tu_model(ref), NULL, &c, &err), 0, "%s", err.msg);
        cr_assert_eq(jlm_conv_write(c, b, NULL, NULL, NULL, &err), 0, "%s", err.msg);
        jlm_conv_close(c);
        size_t na = 0, nb = 0;
        unsigned char *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
        cr_assert(x && y && na == nb && !memcmp(x, y, na), "--type %s: the container differs from %s's", types[i], ref);
        free(x); free(y);
    }
    tu_rmrf(d);
    free(d);
}

Test(quantize, refuses_a_type_it_does_not_have_by_name)
{
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open_as(tu_model("synth-llama-256.f32.gguf"), "Q3_K_M", NULL, &c, &err), JLM_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "--type Q3_K_M is not supported"), "%s", err.msg);
}

/* An HF folder quantized at conversion still runs: tiny-mixtral in Q8_0 stays
 * within the quantized tolerance of llama.cpp's F32 logits. */
Test(quantize, hf_folder_to_q8_0_runs, .timeout = 60)
{
    char *d = tu_tmpdir(), out[1100], src[1100];
    snprintf(out, sizeof out, "%s/m.jlm", d);
    snprintf(src, sizeof src, "%s/tests/models/hf/tiny-mixtral", tu_root());
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open_as(src, "Q8_0", NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(c, out, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    char ref[1100];
    snprintf(ref, sizeof ref, "%s/tests/reference/oracle-tiny-mixtral.json", tu_root());
    json_t *o = json_load_file(ref, 0, NULL), *run = json_array_get(json_object_get(o, "runs"), 0);
    size_t np;
    int32_t *p = ids(json_object_get(run, "prompt_ids"), &np);
    jlm_engine_opts eo = {.n_threads = 2, .quiet = 1, .direct = 1};
    jlm_engine *e;
    cr_assert_eq(jlm_engine_open(out, &eo, &e, &err), 0, "%s", err.msg);
    uint32_t nv = jlm_engine_n_vocab(e);
    float *l = malloc(nv * sizeof *l);
    cr_assert_eq(jlm_engine_eval(e, p, (uint32_t)np, l, &err), 0, "%s", err.msg);
    json_t *want = json_object_get(run, "logits_after_prompt");
    double mx = 0, d2 = 0;
    for (uint32_t i = 0; i < nv; i++) {
        double r = json_number_value(json_array_get(want, i));
        mx = fmax(mx, fabs(r));
        if (!(fabs(r - l[i]) <= d2)) d2 = fabs(r - l[i]);
    }
    cr_assert(!(d2 > 0.05 * mx), "Q8_0 logit error %g of max %g", d2, mx);
    cr_log_info("tiny-mixtral Q8_0: logit error %.3g of max |logit| %.3g", d2, mx);
    free(l); free(p);
    json_decref(o);
    jlm_engine_close(e);
    tu_rmrf(d);
    free(d);
}

/* ---------------------------------------------------------------- rope_scaling */
/* rope_type llama3 becomes llama.cpp's rope_freqs tensor (frequency divisors).
 * Reference: transformers' llama3 inv_freq for Llama-3.1's scaling (head_dim
 * 128, theta 5e5, factor 8, low 1, high 4, original 8192), in
 * tiny-llama/expected/rope.safetensors: base_freq / rope_freqs must equal it. */
Test(hf, llama3_rope_scaling_gives_transformers_inv_freq)
{
    tdef t[] = {
        {"model.embed_tokens.weight", "BF16", {4, 8}, 2, 0, 64},
        {"lm_head.weight", "BF16", {4, 8}, 2, 64, 128},
        {"model.norm.weight", "BF16", {8}, 1, 128, 144},
        {"model.layers.0.input_layernorm.weight", "BF16", {8}, 1, 144, 160},
        {"model.layers.0.post_attention_layernorm.weight", "BF16", {8}, 1, 160, 176},
        {"model.layers.0.self_attn.q_proj.weight", "BF16", {128, 8}, 2, 176, 2224},
        {"model.layers.0.self_attn.k_proj.weight", "BF16", {128, 8}, 2, 2224, 4272},
        {"model.layers.0.self_attn.v_proj.weight", "BF16", {128, 8}, 2, 4272, 6320},
        {"model.layers.0.self_attn.o_proj.weight", "BF16", {8, 128}, 2, 6320, 8368},
        {"model.layers.0.mlp.gate_proj.weight", "BF16", {16, 8}, 2, 8368, 8624},
        {"model.layers.0.mlp.up_proj.weight", "BF16", {16, 8}, 2, 8624, 8880},
        {"model.layers.0.mlp.down_proj.weight", "BF16", {8, 16}, 2, 8880, 9136},
    };
    size_t len;
    unsigned char *img = image(t, 12, 9136, &len);
    const char *cfg = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8,\"intermediate_size\":16,"
                      "\"num_attention_heads\":1,\"num_hidden_layers\":1,\"num_key_value_heads\":1,\"vocab_size\":4,"
                      "\"head_dim\":128,\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
                      "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}}";
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_hf_open_mem(cfg, strlen(cfg), img, len, &g, &err), 0, "%s", err.msg);
    const jlm_gguf_tensor *rf = jlm_gguf_find_tensor(g, "rope_freqs.weight");
    cr_assert(rf && rf->ne[0] == 64 && rf->type == GGML_F32);
    float f[64];
    cr_assert_eq(jlm_gguf_read(g, rf, 0, f, sizeof f, &err), 0, "%s", err.msg);
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/models/hf/tiny-llama/expected/rope.safetensors", tu_root());
    size_t n;
    float *want = golden(p, "llama3.inv_freq", &n);
    cr_assert_eq(n, 64);
    double worst = 0;
    for (int i = 0; i < 64; i++) {
        double base = 1.0 / pow(500000.0, (2.0 * i) / 128.0);
        double rel = fabs(base / f[i] - want[i]) / want[i];
        worst = fmax(worst, rel);
        cr_assert(rel < 1e-5, "frequency %d: %g vs transformers %g", i, base / f[i], want[i]);
    }
    cr_log_info("llama3 rope_freqs: worst relative error %.3g", worst);
    free(want);
    jlm_gguf_close(g);
    free(img);
}

/* Qwen3Moe's per-expert tensors stack into [n_expert, rows, cols] banks whose
 * sheet E is expert E's tensor; a missing expert is refused. */
Test(hf, qwen3moe_experts_stack_in_order_and_a_missing_one_is_refused)
{
    tdef t[] = {
        {"model.embed_tokens.weight", "BF16", {4, 8}, 2, 0, 64},
        {"lm_head.weight", "BF16", {4, 8}, 2, 64, 128},
        {"model.norm.weight", "BF16", {8}, 1, 128, 144},
        {"model.layers.0.input_layernorm.weight", "BF16", {8}, 1, 144, 160},
        {"model.layers.0.post_attention_layernorm.weight", "BF16", {8}, 1, 160, 176},
        {"model.layers.0.self_attn.q_proj.weight", "BF16", {8, 8}, 2, 176, 304},
        {"model.layers.0.self_attn.k_proj.weight", "BF16", {4, 8}, 2, 304, 368},
        {"model.layers.0.self_attn.v_proj.weight", "BF16", {4, 8}, 2, 368, 432},
        {"model.layers.0.self_attn.o_proj.weight", "BF16", {8, 8}, 2, 432, 560},
        {"model.layers.0.self_attn.q_norm.weight", "BF16", {4}, 1, 560, 568},
        {"model.layers.0.self_attn.k_norm.weight", "BF16", {4}, 1, 568, 576},
        {"model.layers.0.mlp.gate.weight", "BF16", {2, 8}, 2, 576, 608},
        {"model.layers.0.mlp.experts.1.down_proj.weight", "BF16", {8, 4}, 2, 608, 672},
        {"model.layers.0.mlp.experts.0.down_proj.weight", "BF16", {8, 4}, 2, 672, 736},
        {"model.layers.0.mlp.experts.0.gate_proj.weight", "BF16", {4, 8}, 2, 736, 800},
        {"model.layers.0.mlp.experts.1.gate_proj.weight", "BF16", {4, 8}, 2, 800, 864},
        {"model.layers.0.mlp.experts.0.up_proj.weight", "BF16", {4, 8}, 2, 864, 928},
        {"model.layers.0.mlp.experts.1.up_proj.weight", "BF16", {4, 8}, 2, 928, 992},
    };
    const char *cfg = "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":8,\"intermediate_size\":16,"
                      "\"num_attention_heads\":2,\"num_hidden_layers\":1,\"num_key_value_heads\":1,\"vocab_size\":4,"
                      "\"head_dim\":4,\"num_experts\":2,\"num_experts_per_tok\":1,\"moe_intermediate_size\":4}";
    size_t len;
    unsigned char *img = image(t, 18, 992, &len);
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_hf_open_mem(cfg, strlen(cfg), img, len, &g, &err), 0, "%s", err.msg);
    const jlm_gguf_tensor *d = jlm_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
    cr_assert(d && d->n_dims == 3 && d->ne[0] == 4 && d->ne[1] == 8 && d->ne[2] == 2);
    cr_assert(jlm_gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight") && jlm_gguf_find_tensor(g, "blk.0.attn_k_norm.weight"));
    uint8_t got[128];
    cr_assert_eq(jlm_gguf_read(g, d, 0, got, sizeof got, &err), 0, "%s", err.msg);
    cr_assert(!memcmp(got, img + len - 992 + 672, 64) && !memcmp(got + 64, img + len - 992 + 608, 64),
              "sheet E is expert E's down_proj");
    jlm_gguf_close(g);
    free(img);
    img = image(t, 17, 928, &len);     /* no experts.1.up_proj */
    cr_assert_neq(jlm_hf_open_mem(cfg, strlen(cfg), img, len, &g, &err), 0);
    cr_assert(strstr(err.msg, "blk.0.ffn_up_exps.weight: expert 1 has no tensor"), "%s", err.msg);
    free(img);
}

/* generation_config.json's eos_token_id list joins the end-of-generation set
 * (the first id is EOS when tokenizer_config.json names none). */
Test(hf_tok, generation_config_eos_list_ends_generation)
{
    char *d = tu_tmpdir(), cmd[3000], p[1100];
    snprintf(cmd, sizeof cmd, "mkdir '%s/t' && cp '%s/tests/fuzz/seeds-hf-tokenizer/qwen-like.json' '%s/t/tokenizer.json'",
             d, tu_root(), d);
    cr_assert_eq(system(cmd), 0);
    snprintf(p, sizeof p, "%s/t/generation_config.json", d);
    const char *gen = "{\"eos_token_id\": [5, 7], \"bos_token_id\": 1}";
    cr_assert_eq(tu_write_file(p, gen, strlen(gen)), 0);
    snprintf(p, sizeof p, "%s/t", d);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(p, NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c->vocab.eos, 5);
    int has7 = 0;
    for (uint32_t i = 0; i < c->vocab.n_stop; i++)
        has7 |= c->vocab.stop[i] == 7;
    cr_assert(has7, "id 7 of generation_config.json ends generation");
    jlm_conv_close(c);
    snprintf(p, sizeof p, "%s/t/generation_config.json", d);
    const char *bad = "{\"eos_token_id\": [5, 999999]}";
    cr_assert_eq(tu_write_file(p, bad, strlen(bad)), 0);
    snprintf(p, sizeof p, "%s/t", d);
    cr_assert_neq(jlm_conv_open(p, NULL, &c, &err), 0);
    cr_assert(strstr(err.msg, "generation_config.json: eos_token_id 1 is not a token id"), "%s", err.msg);
    tu_rmrf(d);
    free(d);
}

/* ---------------------------------------------------------------- olmoe / gpt-oss round trip */
/* No HF folder of these classes (and no transformers golden) exists here:
 * tests/hf_synth.h writes one from the synthetic GGUF by inverting llama.cpp's
 * mapping, and the HF path must give the GGUF path's model back. */

/* Engines on the two containers and the oracle of gguf_name (>= 2 runs). */
static json_t *rt_open_pair(const char *gguf_name, const char *jlm_a, const char *jlm_b, jlm_engine **a, jlm_engine **b)
{
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1};
    jlm_err err = {0};
    cr_assert_eq(jlm_engine_open(jlm_a, &o, a, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_open(jlm_b, &o, b, &err), 0, "%s", err.msg);
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/reference/oracle-%s.exact.json", tu_root(), gguf_name);
    json_t *orc = json_load_file(p, JSON_ALLOW_NUL, NULL);
    cr_assert(json_array_size(json_object_get(orc, "runs")) >= 2, "%s", p);
    return orc;
}

/* Both engines from position 0 over the prompt: logits into la / lb. */
static void rt_eval_both(jlm_engine *a, jlm_engine *b, const int32_t *pr, size_t np, float *la, float *lb)
{
    jlm_err err = {0};
    jlm_engine_rewind(a, 0);
    jlm_engine_rewind(b, 0);
    cr_assert_eq(jlm_engine_eval(a, pr, (uint32_t)np, la, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_eval(b, pr, (uint32_t)np, lb, &err), 0, "%s", err.msg);
}

/* Logits of the F32 round-trip container against llama.cpp's on the quantized
 * GGUF, as a fraction of max |logit|: F32 weights equal to the dequantized
 * GGUF weights, so only llama.cpp's 8-bit activation quantization (Q8_0 /
 * Q8_K) differs; test_engine.c's TOL_QUANT. */
#define TOL_RT 0.05

static const char *rt_gguf(const char *name)
{
    static char b[1100];
    snprintf(b, sizeof b, "%s.gguf", tu_model(name));
    return b;
}

static char *rt_folder_as(const char *gguf_name, const char *dir, int cond)
{
    char *d = malloc(1200);
    snprintf(d, 1200, "%s/%s-hf%s", dir, gguf_name, cond ? "-cond" : "");
    cr_assert_eq(mkdir(d, 0755), 0);
    cr_assert_eq(hs_from_gguf_as(rt_gguf(gguf_name), d, cond), 0, "writing the HF folder of %s", gguf_name);
    return d;
}

static char *rt_folder(const char *gguf_name, const char *dir) { return rt_folder_as(gguf_name, dir, 0); }

/* The two containers' configs agree on every field the engine reads. */
static void rt_config_equal(const jlm_config *a, const jlm_config *b)
{
#define SAME(f) cr_assert(a->f == b->f, "config." #f ": HF %g, GGUF %g", (double)a->f, (double)b->f)
    SAME(arch); SAME(n_layer); SAME(n_embd); SAME(n_head); SAME(n_kv_head); SAME(head_dim); SAME(n_rot); SAME(n_ffn);
    SAME(n_vocab); SAME(n_ctx); SAME(n_expert); SAME(n_expert_used); SAME(n_ffn_exp); SAME(swa_window);
    SAME(swa_period); SAME(rms_eps); SAME(rope_base); SAME(attn_factor); SAME(embd_scale); SAME(rope_base_swa);
    SAME(flags); SAME(yarn_factor); SAME(yarn_orig_ctx); SAME(yarn_beta_fast); SAME(yarn_beta_slow);
    SAME(yarn_log_mul); SAME(rope_linear); SAME(head_dim_v); SAME(expert_scale); SAME(clamp_kqv);
    SAME(n_ffn_shexp); SAME(n_dense_lead); SAME(q_lora_rank); SAME(kv_lora_rank); SAME(n_expert_group);
    SAME(n_expert_group_used); SAME(moe_step); SAME(attn_temp_scale); SAME(attn_temp_floor); SAME(attn_temp_offset);
#undef SAME
}

static uint8_t *rt_span(const jlm_model *m, const jlm_tensor *t, const jlm_tensor_planes *pl, uint64_t sheet,
                        uint64_t *span)
{
    uint64_t end = t->qs_off + pl->qs_len;
    if (t->d_off + pl->d_len > end) end = t->d_off + pl->d_len;
    if (t->sc_off + pl->sc_len > end) end = t->sc_off + pl->sc_len;
    *span = end - t->qs_off;
    uint8_t *buf = malloc(*span);
    uint64_t shift = jlm_fmt_role_is_bank(t->role) ? sheet * m->hdr.exp_page_size : 0;
    cr_assert_eq(pread(m->fd, buf, *span, (off_t)(t->qs_off + shift)), (ssize_t)*span);
    return buf;
}

/* Every tensor of the HF container against the GGUF: the same set of
 * (role, block, index) as the GGUF's own container, every row dequantized
 * equal bit for bit, and MXFP4 planes byte-identical to the GGUF container's.
 * Returns the number of MXFP4 tensors compared byte for byte. */
static int rt_tensors_equal(const char *gguf_name, const char *hf_jlm, const char *gg_jlm)
{
    jlm_model *m, *m2;
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_open(hf_jlm, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_fmt_open(gg_jlm, &m2, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_gguf_open(rt_gguf(gguf_name), &g, &err), 0, "%s", err.msg);
    rt_config_equal(&m->config, &m2->config);
    cr_assert_eq(m->hdr.n_tensors, m2->hdr.n_tensors, "HF container %u tensors, GGUF container %u", m->hdr.n_tensors,
                 m2->hdr.n_tensors);
    int n_mx = 0;
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        const jlm_tensor *t2 = jlm_fmt_find(m2, t->role, t->block, t->index);
        const jlm_gguf_tensor *gt = jlm_gguf_find_tensor(g, t->name.s);
        cr_assert(t2 && gt, "'%s' is not in the GGUF's container", t->name.s);
        for (int d = 0; d < 4; d++)
            cr_assert_eq(t->dims[d], t2->dims[d], "'%s' dims[%d]", t->name.s, d);
        jlm_tensor_planes pl, pl2;
        cr_assert_eq(jlm_fmt_tensor_planes(t, &pl, NULL), 0);
        cr_assert_eq(jlm_fmt_tensor_planes(t2, &pl2, NULL), 0);
        int bank = jlm_fmt_role_is_bank(t->role), mx = gt->type == GGML_MXFP4;
        if (mx)
            cr_assert_eq(t->type, t2->type, "'%s': MXFP4 is not kept as MXFP4", t->name.s);
        uint64_t k = jlm_tensor_k(t), rows = jlm_tensor_rows(t), nsheet = bank ? t->dims[2] : jlm_tensor_sheets(t);
        uint64_t rb = k / jlm_ggml_block_elems(gt->type) * jlm_ggml_block_bytes(gt->type);
        float *a = malloc(k * 4), *b = malloc(k * 4);
        uint8_t *srow = malloc(rb);
        for (uint64_t sh = 0; sh < nsheet; sh++) {
            uint64_t span, span2, in = bank ? 0 : sh;
            uint8_t *buf = rt_span(m, t, &pl, sh, &span);
            if (mx) {   /* the same planes, byte for byte */
                uint8_t *buf2 = rt_span(m2, t2, &pl2, sh, &span2);
                uint64_t o1[3] = {0, t->d_off - t->qs_off, t->sc_off - t->qs_off};
                uint64_t o2[3] = {0, t2->d_off - t2->qs_off, t2->sc_off - t2->qs_off};
                uint64_t len[3] = {pl.sheet_qs, pl.sheet_d, pl.sheet_sc};
                for (int q = 0; q < 3; q++)
                    cr_assert(!memcmp(buf + o1[q] + in * len[q], buf2 + o2[q] + in * len[q], len[q]),
                              "'%s' sheet %llu: MXFP4 plane %d differs from the GGUF conversion's", t->name.s,
                              (unsigned long long)sh, q);
                free(buf2);
            }
            for (uint64_t r = 0; r < rows; r++) {
                jlm_k_dequant_row_ref(t->type, buf + in * pl.sheet_qs, buf + (t->d_off - t->qs_off) + in * pl.sheet_d,
                                      buf + (t->sc_off - t->qs_off) + in * pl.sheet_sc, k, rows, r, a);
                cr_assert_eq(jlm_gguf_read(g, gt, (sh * rows + r) * rb, srow, rb, NULL), 0);
                cr_assert_eq(jlm_ggml_dequant_row(gt->type, srow, b, k, NULL), 0);
                if (memcmp(a, b, k * 4)) {
                    uint64_t j = 0;
                    while (!memcmp(&a[j], &b[j], 4)) j++;
                    cr_assert_fail("'%s' sheet %llu row %llu element %llu: HF container %.9g, GGUF %.9g", t->name.s,
                                   (unsigned long long)sh, (unsigned long long)r, (unsigned long long)j, a[j], b[j]);
                }
            }
            free(buf);
        }
        n_mx += mx;
        free(a); free(b); free(srow);
    }
    jlm_gguf_close(g);
    jlm_fmt_close(m);
    jlm_fmt_close(m2);
    return n_mx;
}

/* Logits after each oracle prompt within TOL_RT of llama.cpp's and of the
 * GGUF container's; greedy ids equal to llama.cpp's while its margin exceeds
 * twice the measured error (test_engine.c's rule). */
static void rt_logits(const char *gguf_name, const char *hf_jlm, const char *gg_jlm)
{
    jlm_engine *a, *b;
    jlm_err err = {0};
    json_t *orc = rt_open_pair(gguf_name, hf_jlm, gg_jlm, &a, &b), *runs = json_object_get(orc, "runs");
    uint32_t nv = jlm_engine_n_vocab(a);
    float *la = malloc(nv * 4), *lb = malloc(nv * 4);
    for (size_t r = 0; r < json_array_size(runs); r++) {
        json_t *run = json_array_get(runs, r), *ref = json_object_get(run, "logits_after_prompt");
        size_t np, ng;
        int32_t *pr = ids(json_object_get(run, "prompt_ids"), &np), *want = ids(json_object_get(run, "generated_ids"), &ng);
        cr_assert_eq(json_array_size(ref), nv);
        rt_eval_both(a, b, pr, np, la, lb);
        double mx = 0, e_ref = 0, e_gg = 0;
        for (uint32_t i = 0; i < nv; i++) {
            double v = json_number_value(json_array_get(ref, i));
            mx = fmax(mx, fabs(v));
            if (!(fabs(v - la[i]) <= e_ref)) e_ref = fabs(v - la[i]);
            if (!(fabs((double)lb[i] - la[i]) <= e_gg)) e_gg = fabs((double)lb[i] - la[i]);
        }
        cr_assert(!(e_ref > TOL_RT * mx), "%s run %zu: logit error against llama.cpp %g > %g x %g", gguf_name, r, e_ref,
                  TOL_RT, mx);
        cr_assert(!(e_gg > TOL_RT * mx), "%s run %zu: logit error against the GGUF container %g > %g x %g", gguf_name, r,
                  e_gg, TOL_RT, mx);
        json_t *steps = json_object_get(run, "step_top3");
        double thr = 2 * e_ref + 1e-4;
        size_t checked = 0;
        for (size_t i = 0; i < ng && i < json_array_size(steps); i++) {
            json_t *st = json_array_get(steps, i);
            double l1 = json_number_value(json_array_get(json_array_get(st, 0), 1));
            double l2 = json_number_value(json_array_get(json_array_get(st, 1), 1));
            if (l1 - l2 <= thr)
                break;
            int32_t id = argmax(la, nv);
            cr_assert_eq(id, want[i], "%s run %zu step %zu: id %d, llama.cpp %d", gguf_name, r, i, id, want[i]);
            cr_assert_eq(jlm_engine_eval(a, &id, 1, la, &err), 0, "%s", err.msg);
            checked++;
        }
        cr_log_info("%s run %zu: logit error %.3g (llama.cpp), %.3g (GGUF container) of max %.3g; %zu confident ids equal",
                    gguf_name, r, e_ref / mx, e_gg / mx, mx, checked);
        free(pr); free(want);
    }
    free(la); free(lb);
    json_decref(orc);
    jlm_engine_close(a);
    jlm_engine_close(b);
}

/* The folder's gate_up_proj / down_proj MXFP4 read with transformers' rule
 * (convert_moe_packed_tensors: byte j of a 16-byte block holds element 2j in
 * its low nibble and 2j + 1 in its high one, FP4 e2m1 values scaled by
 * 2^(scale - 127); gate = rows [::2], up = rows [1::2]) equal the GGUF's
 * experts: the generator's HF layout, checked apart from the converter. */
static void rt_hf_mxfp4_semantics(const char *folder, const char *gguf_name)
{
    static const float FP4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    jlm_st_set *st;
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_st_open_dir(folder, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_gguf_open(rt_gguf(gguf_name), &g, &err), 0, "%s", err.msg);
    const char *kinds[3][3] = {{"gate_up_proj", "ffn_gate_exps", "ffn_up_exps"}, {"down_proj", "ffn_down_exps", NULL}};
    for (int kd = 0; kd < 2; kd++) {
        char bn[128], sn[128], gn[2][64];
        snprintf(bn, sizeof bn, "model.layers.1.mlp.experts.%s_blocks", kinds[kd][0]);
        snprintf(sn, sizeof sn, "model.layers.1.mlp.experts.%s_scales", kinds[kd][0]);
        const jlm_st_tensor *B = jlm_st_find(st, bn), *S = jlm_st_find(st, sn);
        cr_assert(B && S && B->dtype == JLM_ST_U8 && S->dtype == JLM_ST_U8 && B->n_dims == 4, "%s", bn);
        int n_out = kinds[kd][2] ? 2 : 1;
        const jlm_gguf_tensor *gt[2] = {0};
        for (int o = 0; o < n_out; o++) {
            snprintf(gn[o], sizeof gn[o], "blk.1.%s.weight", kinds[kd][1 + o]);
            cr_assert((gt[o] = jlm_gguf_find_tensor(g, gn[o])), "%s", gn[o]);
        }
        uint64_t E = B->shape[0], rows = B->shape[1], nb = B->shape[2], k = nb * 32;
        uint8_t *blk = malloc(B->n_bytes), *sc = malloc(S->n_bytes), *raw = malloc(nb * 17);
        float *want = malloc(k * 4);
        cr_assert_eq(jlm_st_read(st, B, 0, blk, B->n_bytes, &err), 0, "%s", err.msg);
        cr_assert_eq(jlm_st_read(st, S, 0, sc, S->n_bytes, &err), 0, "%s", err.msg);
        for (uint64_t e = 0; e < E; e++)
            for (uint64_t r = 0; r < rows; r++) {
                int o = (int)(r % n_out);
                uint64_t gr = e * (rows / n_out) + r / n_out;
                cr_assert_eq(jlm_gguf_read(g, gt[o], gr * nb * 17, raw, nb * 17, NULL), 0);
                cr_assert_eq(jlm_ggml_dequant_row(GGML_MXFP4, raw, want, k, NULL), 0);
                for (uint64_t j = 0; j < k; j++) {
                    uint64_t b = (e * rows + r) * nb + j / 32;
                    uint8_t byte = blk[b * 16 + (j % 32) / 2];
                    float v = ldexpf(FP4[j % 2 ? byte >> 4 : byte & 0xF], (int)sc[b] - 127);
                    cr_assert(v == want[j], "%s expert %llu row %llu element %llu: HF rule %g, GGUF %g", bn,
                              (unsigned long long)e, (unsigned long long)r, (unsigned long long)j, v, want[j]);
                }
            }
        free(blk); free(sc); free(raw); free(want);
    }
    jlm_gguf_close(g);
    jlm_st_close(st);
}

static void round_trip(const char *gguf_name, int want_mxfp4)
{
    char *dir = tu_tmpdir(), *folder = rt_folder(gguf_name, dir);
    if (want_mxfp4)
        rt_hf_mxfp4_semantics(folder, gguf_name);
    char *hf_jlm = convert_dir(folder, dir, "hf"), *gg_jlm = malloc(1200);
    snprintf(gg_jlm, 1200, "%s/gguf.jlm", dir);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(rt_gguf(gguf_name), NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(c, gg_jlm, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    cr_assert_eq(rt_tensors_equal(gguf_name, hf_jlm, gg_jlm), want_mxfp4);
    rt_logits(gguf_name, hf_jlm, gg_jlm);
    free(hf_jlm); free(gg_jlm); free(folder);
    tu_rmrf(dir);
    free(dir);
}

Test(hf, olmoe_folder_made_from_the_gguf_converts_back_to_it, .timeout = 120)
{
    round_trip("synth-olmoe-256.Q4_K_M", 0);
}

Test(hf, gpt_oss_folder_keeps_mxfp4_and_converts_back_to_the_gguf, .timeout = 120)
{
    round_trip("synth-gpt-oss-256.MXFP4_MOE", 6);   /* 2 layers x gate, up, down */
}

/* The container of the folder quantized at conversion (--type Q8_0) against
 * the GGUF's container: Q8_0 of a dequantized Q8_0 row is that row again
 * (d = max|x| / 127 and the codes come back), so the two must run bit for
 * bit alike: logits after each oracle prompt and 16 greedy steps (ids and
 * logits) identical. The F32 container is not compared by logits here: these
 * families route by top-k (sigmoid, groups, top-1), and F32 activations
 * against Q8_0's quantized ones flip a routing choice on the oracle prompts
 * (deepseek2 run 0: 0.36 x max |logit|), which says nothing about the folder. */
static void rt_logits_same(const char *gguf_name, const char *hq_jlm, const char *gg_jlm)
{
    jlm_engine *a, *b;
    jlm_err err = {0};
    json_t *orc = rt_open_pair(gguf_name, hq_jlm, gg_jlm, &a, &b), *runs = json_object_get(orc, "runs");
    uint32_t nv = jlm_engine_n_vocab(a);
    float *la = malloc(nv * 4), *lb = malloc(nv * 4);
    for (size_t r = 0; r < json_array_size(runs); r++) {
        size_t np;
        int32_t *pr = ids(json_object_get(json_array_get(runs, r), "prompt_ids"), &np);
        rt_eval_both(a, b, pr, np, la, lb);
        for (int step = 0; step < 16; step++) {
            cr_assert(!memcmp(la, lb, nv * 4), "%s run %zu step %d: the folder's Q8_0 logits differ from the GGUF's",
                      gguf_name, r, step);
            int32_t id = argmax(la, nv), id2 = argmax(lb, nv);
            cr_assert_eq(id, id2);
            cr_assert_eq(jlm_engine_eval(a, &id, 1, la, &err), 0, "%s", err.msg);
            cr_assert_eq(jlm_engine_eval(b, &id2, 1, lb, &err), 0, "%s", err.msg);
        }
        free(pr);
    }
    free(la); free(lb);
    json_decref(orc);
    jlm_engine_close(a);
    jlm_engine_close(b);
}

/* The MoE families: the F32 container's tensors and config equal the GGUF
 * container's; the Q8_0 conversion runs as the GGUF does. */
static void round_trip_moe(const char *gguf_name)
{
    char *dir = tu_tmpdir(), *folder = rt_folder(gguf_name, dir);
    char *hf_jlm = convert_dir(folder, dir, "hf"), *gg_jlm = convert_dir(rt_gguf(gguf_name), dir, "gguf");
    char hq_jlm[1200];
    snprintf(hq_jlm, sizeof hq_jlm, "%s/hf-q8.jlm", dir);
    cr_assert_eq(rt_tensors_equal(gguf_name, hf_jlm, gg_jlm), 0);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open_as(folder, "Q8_0", NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(c, hq_jlm, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    rt_logits_same(gguf_name, hq_jlm, gg_jlm);
    free(hf_jlm); free(gg_jlm); free(folder);
    tu_rmrf(dir);
    free(dir);
}

/* DeepseekV3ForCausalLM: kv_b_proj split into attn_k_b (transposed per
 * head) / attn_v_b, q-LoRA, groups, e_score_correction_bias, yarn with
 * mscale_all_dim; the NextN/MTP layer left out. */
Test(hf, deepseek2_folder_made_from_the_gguf_converts_back_to_it, .timeout = 120)
{
    round_trip_moe("synth-deepseek2-256.Q8_0");
}

/* Glm4MoeForCausalLM: partial NeoX RoPE, biases, q/k norms, post_attention_norm,
 * shared expert, the NextN/MTP layer left out. */
Test(hf, glm4moe_folder_made_from_the_gguf_converts_back_to_it, .timeout = 120)
{
    round_trip_moe("synth-glm4moe-256.Q8_0");
}

/* Llama4ForCausalLM: [E, in, out] experts read transposed, interleaved MoE. */
Test(hf, llama4_folder_made_from_the_gguf_converts_back_to_it, .timeout = 120)
{
    round_trip_moe("synth-llama4-256.Q8_0");
}

/* Llama4ForConditionalGeneration: text_config, language_model. names, the
 * vision tower left out: the same tensors and config as the GGUF's. */
Test(hf, llama4_conditional_generation_folder_gives_the_text_model, .timeout = 120)
{
    const char *name = "synth-llama4-256.Q8_0";
    char *dir = tu_tmpdir(), *folder = rt_folder_as(name, dir, 1);
    char *hf_jlm = convert_dir(folder, dir, "hf"), *gg_jlm = convert_dir(rt_gguf(name), dir, "gguf");
    cr_assert_eq(rt_tensors_equal(name, hf_jlm, gg_jlm), 0);
    free(hf_jlm); free(gg_jlm); free(folder);
    tu_rmrf(dir);
    free(dir);
}

/* Values of the MoE families' keys the engine cannot honour or that
 * contradict the model are refused, the key named. */
Test(hf_cli, moe_family_configs_out_of_range_are_refused_by_key, .timeout = 120)
{
    static const char *const E[][4] = {
        {"synth-deepseek2-256.Q8_0", "\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 9", "first_k_dense_replace"},
        {"synth-deepseek2-256.Q8_0", "\"n_group\": 4", "\"n_group\": 3", "n_group"},
        {"synth-deepseek2-256.Q8_0", "\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"sqrtsoftplus\"", "scoring_func"},
        {"synth-deepseek2-256.Q8_0", "\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"group_limited_greedy\"", "topk_method"},
        {"synth-deepseek2-256.Q8_0", "\"mscale\": 1.0", "\"mscale\": 0.70699999999999996", "mscale"},
        {"synth-deepseek2-256.Q8_0", "\"kv_lora_rank\": 128", "\"kv_lora_rank\": 64", "config.json gives"},
        {"synth-glm4moe-256.Q8_0", "\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 1.5", "partial_rotary_factor"},
        {"synth-glm4moe-256.Q8_0", "\"num_nextn_predict_layers\": 1", "\"num_nextn_predict_layers\": 0", "layer 3"},
        {"synth-llama4-256.Q8_0", "\"attention_chunk_size\": 8192", "\"attention_chunk_size\": 4096", "attention_chunk_size"},
        {"synth-llama4-256.Q8_0", "\"use_qk_norm\": true", "\"use_qk_norm\": false", "use_qk_norm"},
        {"synth-llama4-256.Q8_0", "\"num_experts_per_tok\": 1", "\"num_experts_per_tok\": 2", "num_experts_per_tok"},
        {"synth-llama4-256.Q8_0", "\"floor_scale\": 8192", "\"floor_scale\": 4096", "floor_scale"},
        {"synth-llama4-256.Q8_0", "\"intermediate_size\": 256", "\"intermediate_size\": 128", "config.json gives"},
    };
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
        char *d = tu_tmpdir(), m[1100];
        snprintf(m, sizeof m, "%s/m", d);
        cr_assert_eq(mkdir(m, 0755), 0);
        cr_assert_eq(hs_from_gguf(rt_gguf(E[i][0]), m), 0);
        edit_config(d, E[i][1], E[i][2]);
        cli_refuses(d, E[i][3]);
        tu_rmrf(d);
        free(d);
    }
}

/* What the engine's olmoe / gpt-oss graphs cannot honour is refused by key. */
Test(hf_cli, olmoe_and_gpt_oss_configs_it_cannot_run_are_refused_by_key, .timeout = 60)
{
    static const char *const E[][3] = {
        {"synth-gpt-oss-256.MXFP4_MOE", "\"swiglu_limit\": 7.0", "\"swiglu_limit\": 8.0"},
        {"synth-gpt-oss-256.MXFP4_MOE", "\"sliding_attention\"", "\"full_attention\""},
        {"synth-gpt-oss-256.MXFP4_MOE", "\"mxfp4\"", "\"bitsandbytes\""},
        {"synth-gpt-oss-256.MXFP4_MOE", "\"beta_fast\": 32.0", "\"beta_fast\": 16.0"},
        {"synth-olmoe-256.Q4_K_M", "\"norm_topk_prob\": false", "\"norm_topk_prob\": true"},
        {"synth-olmoe-256.Q4_K_M", "\"clip_qkv\": null", "\"clip_qkv\": 8.0"},
    };
    static const char *const WANT[] = {"swiglu_limit", "layer_types", "quant_method", "rope_scaling", "norm_topk_prob",
                                       "clip_qkv"};
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
        char *d = tu_tmpdir(), m[1100];
        snprintf(m, sizeof m, "%s/m", d);
        cr_assert_eq(mkdir(m, 0755), 0);
        cr_assert_eq(hs_from_gguf(rt_gguf(E[i][0]), m), 0);
        edit_config(d, E[i][1], E[i][2]);
        cli_refuses(d, WANT[i]);
        tu_rmrf(d);
        free(d);
    }
}
