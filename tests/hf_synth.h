/* hf_synth.h - writes a Hugging Face folder (config.json + model.safetensors)
 * from one of the synthetic test GGUFs by inverting llama.cpp's
 * convert_hf_to_gguf.py mapping, for classes with no HF test folder here
 * (OlmoeForCausalLM, GptOssForCausalLM). Used by tests/test_hf.c.
 *
 * - Dense weights, norms, biases, sinks and routers: dequantized with
 *   jlm_ggml_dequant_row (bit-identical to ggml's and to format/'s oracle,
 *   converter/pack.h) and written as F32, rows in HF order ([out, in]); olmoe
 *   and gpt-oss use NEOX RoPE, so q/k rows are not permuted.
 * - olmoe experts: blk.N.ffn_{gate,up,down}_exps sheet E ->
 *   model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight.
 * - gpt-oss experts: the MXFP4 bytes as they are, re-laid into HF's layout:
 *   gate and up interleaved by rows (gate row i -> gate_up row 2i, up row i ->
 *   2i + 1), each ggml block_mxfp4 (scale byte, byte i = element i | element
 *   i + 16 << 4) -> a _scales byte and 16 _blocks bytes (byte i = element 2i |
 *   element 2i + 1 << 4); biases interleaved the same way by column.
 * Not a converter: it trusts its input (a file of tests/models). */
#ifndef JLM_TESTS_HF_SYNTH_H
#define JLM_TESTS_HF_SYNTH_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "converter/gguf.h"

typedef struct hs_t { char name[128]; const char *dtype; uint32_t nd; uint64_t shape[4]; uint8_t *data; size_t len; } hs_t;
typedef struct hs_set { hs_t *t; size_t n, cap; } hs_set;

static hs_t *hs_add(hs_set *s, const char *name, const char *dtype, uint32_t nd, const uint64_t *shape)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->t = realloc(s->t, s->cap * sizeof *s->t);
    }
    hs_t *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->nd = nd;
    size_t n = !strcmp(dtype, "F32") ? 4 : 1;
    for (uint32_t d = 0; d < nd; d++) {
        t->shape[d] = shape[d];
        n *= shape[d];
    }
    t->len = n;
    t->data = calloc(1, n ? n : 1);
    return t;
}

/* Rows [r0, r0 + n) of a GGUF tensor, dequantized to F32 (k = ne[0] each). */
static float *hs_rows(const jlm_gguf *g, const jlm_gguf_tensor *gt, uint64_t r0, uint64_t n)
{
    uint64_t k = gt->ne[0], rb = k / jlm_ggml_block_elems(gt->type) * jlm_ggml_block_bytes(gt->type);
    uint8_t *raw = malloc(rb * n);
    float *out = malloc(k * n * 4);
    if (jlm_gguf_read(g, gt, r0 * rb, raw, rb * n, NULL))
        abort();
    for (uint64_t r = 0; r < n; r++)
        if (jlm_ggml_dequant_row(gt->type, raw + r * rb, out + r * k, k, NULL))
            abort();
    free(raw);
    return out;
}

/* A whole GGUF tensor as F32 under an HF name, shape [ne1, ne0] (or [ne0]). */
static void hs_dense(hs_set *s, const jlm_gguf *g, const jlm_gguf_tensor *gt, const char *name)
{
    uint64_t rows = gt->ne[1] * gt->ne[2], shape[2] = {rows, gt->ne[0]};
    hs_t *t = gt->n_dims == 1 ? hs_add(s, name, "F32", 1, &gt->ne[0]) : hs_add(s, name, "F32", 2, shape);
    float *v = hs_rows(g, gt, 0, gt->n_dims == 1 ? 1 : rows);
    memcpy(t->data, v, t->len);
    free(v);
}

/* MXFP4 element i (0..31) of a ggml block's 16 code bytes. */
static uint8_t hs_q(const uint8_t *qs, int i) { return (uint8_t)(i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4); }

/* ggml MXFP4 expert banks (1 or 2 interleaved: gate, up) -> _blocks/_scales. */
static void hs_mxfp4(hs_set *s, const jlm_gguf *g, const jlm_gguf_tensor *const *src, int n_src, const char *prefix)
{
    uint64_t k = src[0]->ne[0], rows = src[0]->ne[1], E = src[0]->ne[2], nb = k / 32;
    uint64_t bs[4] = {E, rows * n_src, nb, 16}, ss[3] = {E, rows * n_src, nb};
    char nm[160];
    snprintf(nm, sizeof nm, "%s_blocks", prefix);
    hs_t *B = hs_add(s, nm, "U8", 4, bs);
    snprintf(nm, sizeof nm, "%s_scales", prefix);
    hs_t *S = hs_add(s, nm, "U8", 3, ss);
    uint8_t *row = malloc(nb * 17);
    for (int o = 0; o < n_src; o++)
        for (uint64_t e = 0; e < E; e++)
            for (uint64_t r = 0; r < rows; r++) {
                if (jlm_gguf_read(g, src[o], (e * rows + r) * nb * 17, row, nb * 17, NULL))
                    abort();
                uint64_t hr = e * rows * n_src + r * n_src + o;   /* HF row */
                for (uint64_t b = 0; b < nb; b++) {
                    const uint8_t *blk = row + 17 * b;
                    S->data[hr * nb + b] = blk[0];
                    for (int j = 0; j < 16; j++)
                        B->data[(hr * nb + b) * 16 + j] = (uint8_t)(hs_q(blk + 1, 2 * j) | hs_q(blk + 1, 2 * j + 1) << 4);
                }
            }
    free(row);
}

/* F32 expert biases ne [rows, E] (1 or 2 interleaved by column) -> [E, rows * n]. */
static void hs_xbias(hs_set *s, const jlm_gguf *g, const jlm_gguf_tensor *const *src, int n_src, const char *name)
{
    uint64_t rows = src[0]->ne[0], E = src[0]->ne[1], shape[2] = {E, rows * n_src};
    hs_t *t = hs_add(s, name, "F32", 2, shape);
    float *d = (float *)(void *)t->data;
    for (int o = 0; o < n_src; o++) {
        float *v = hs_rows(g, src[o], 0, E);
        for (uint64_t e = 0; e < E; e++)
            for (uint64_t i = 0; i < rows; i++)
                d[e * rows * n_src + i * n_src + o] = v[e * rows + i];
        free(v);
    }
}

static int hs_write_st(const hs_set *s, const char *path)
{
    json_t *h = json_object();
    uint64_t off = 0;
    for (size_t i = 0; i < s->n; i++) {
        json_t *sh = json_array();
        for (uint32_t d = 0; d < s->t[i].nd; d++)
            json_array_append_new(sh, json_integer((json_int_t)s->t[i].shape[d]));
        json_object_set_new(h, s->t[i].name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", s->t[i].dtype, "shape", sh,
                                                        "data_offsets", (json_int_t)off, (json_int_t)(off + s->t[i].len)));
        off += s->t[i].len;
    }
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *txt = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    size_t hl = strlen(txt), pad = (8 - hl % 8) % 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(txt);
        return -1;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)(hl + pad) >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(txt, 1, hl, f);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    for (size_t i = 0; i < s->n; i++)
        fwrite(s->t[i].data, 1, s->t[i].len, f);
    free(txt);
    return fclose(f) ? -1 : 0;
}

static uint32_t hs_u32(const jlm_gguf *g, const char *arch, const char *key)
{
    char k[128];
    uint32_t v = 0;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    jlm_gguf_get_u32(g, k, &v, NULL);
    return v;
}

static double hs_f32(const jlm_gguf *g, const char *arch, const char *key)
{
    char k[128];
    float v = 0;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    jlm_gguf_get_f32(g, k, &v, NULL);
    return v;
}

/* GGUF name suffix -> HF name suffix of a block tensor (NULL: handled apart). */
static const char *hs_block_name(const char *arch, const char *suf)
{
    static const char *const M[][2] = {
        {"attn_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"post_attention_norm.weight", "post_attention_layernorm.weight"},
        {"attn_q.weight", "self_attn.q_proj.weight"},   {"attn_k.weight", "self_attn.k_proj.weight"},
        {"attn_v.weight", "self_attn.v_proj.weight"},   {"attn_output.weight", "self_attn.o_proj.weight"},
        {"attn_q.bias", "self_attn.q_proj.bias"},       {"attn_k.bias", "self_attn.k_proj.bias"},
        {"attn_v.bias", "self_attn.v_proj.bias"},       {"attn_output.bias", "self_attn.o_proj.bias"},
        {"attn_q_norm.weight", "self_attn.q_norm.weight"}, {"attn_k_norm.weight", "self_attn.k_norm.weight"},
        {"attn_sinks.weight", "self_attn.sinks"},
    };
    for (size_t i = 0; i < sizeof M / sizeof M[0]; i++)
        if (!strcmp(suf, M[i][0]))
            return M[i][1];
    if (!strcmp(suf, "ffn_gate_inp.weight"))
        return strcmp(arch, "olmoe") ? "mlp.router.weight" : "mlp.gate.weight";
    if (!strcmp(suf, "ffn_gate_inp.bias"))
        return "mlp.router.bias";
    return NULL;
}

/* Writes dir/config.json and dir/model.safetensors from gguf (olmoe or
 * gpt-oss); dir must exist. 0 on success. */
static int hs_from_gguf(const char *gguf, const char *dir)
{
    jlm_gguf *g;
    jlm_gguf_str an;
    if (jlm_gguf_open(gguf, &g, NULL) || jlm_gguf_get_str(g, "general.architecture", &an, NULL))
        return -1;
    const char *A = an.s;
    int oss = !strcmp(A, "gpt-oss");
    if (!oss && strcmp(A, "olmoe")) {
        jlm_gguf_close(g);
        return -1;
    }
    uint32_t nl = hs_u32(g, A, "block_count");
    hs_set s = {0};
    char nm[160];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const jlm_gguf_tensor *gt = &g->tensors[i];
        const char *n = gt->name.s;
        if (!strcmp(n, "token_embd.weight")) { hs_dense(&s, g, gt, "model.embed_tokens.weight"); continue; }
        if (!strcmp(n, "output.weight")) { hs_dense(&s, g, gt, "lm_head.weight"); continue; }
        if (!strcmp(n, "output_norm.weight")) { hs_dense(&s, g, gt, "model.norm.weight"); continue; }
        unsigned b;
        int p = 0;
        if (sscanf(n, "blk.%u.%n", &b, &p) != 1 || !p)
            abort();
        const char *suf = n + p, *hfn = hs_block_name(A, suf);
        if (hfn) {
            snprintf(nm, sizeof nm, "model.layers.%u.%s", b, hfn);
            hs_dense(&s, g, gt, nm);
        } else if (!oss && strstr(suf, "_exps.weight")) {
            const char *w = !strncmp(suf, "ffn_gate", 8) ? "gate" : !strncmp(suf, "ffn_up", 6) ? "up" : "down";
            for (uint64_t e = 0; e < gt->ne[2]; e++) {
                uint64_t shape[2] = {gt->ne[1], gt->ne[0]};
                snprintf(nm, sizeof nm, "model.layers.%u.mlp.experts.%llu.%s_proj.weight", b, (unsigned long long)e, w);
                hs_t *t = hs_add(&s, nm, "F32", 2, shape);
                float *v = hs_rows(g, gt, e * gt->ne[1], gt->ne[1]);
                memcpy(t->data, v, t->len);
                free(v);
            }
        } else if (oss && (!strcmp(suf, "ffn_gate_exps.weight") || !strcmp(suf, "ffn_gate_exps.bias"))) {
            int bias = strstr(suf, ".bias") != NULL;
            char un[64];
            snprintf(un, sizeof un, "blk.%u.ffn_up_exps.%s", b, bias ? "bias" : "weight");
            const jlm_gguf_tensor *pair[2] = {gt, jlm_gguf_find_tensor(g, un)};
            if (!pair[1])
                abort();
            snprintf(nm, sizeof nm, "model.layers.%u.mlp.experts.gate_up_proj%s", b, bias ? "_bias" : "");
            if (bias)
                hs_xbias(&s, g, pair, 2, nm);
            else
                hs_mxfp4(&s, g, pair, 2, nm);
        } else if (oss && !strcmp(suf, "ffn_down_exps.weight")) {
            snprintf(nm, sizeof nm, "model.layers.%u.mlp.experts.down_proj", b);
            hs_mxfp4(&s, g, &gt, 1, nm);
        } else if (oss && !strcmp(suf, "ffn_down_exps.bias")) {
            snprintf(nm, sizeof nm, "model.layers.%u.mlp.experts.down_proj_bias", b);
            hs_xbias(&s, g, &gt, 1, nm);
        } else if (!(oss && strncmp(suf, "ffn_up_exps.", 12) == 0)) {
            abort();   /* a tensor this inverse mapping does not know */
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = hs_write_st(&s, path);
    for (size_t i = 0; i < s.n; i++)
        free(s.t[i].data);
    free(s.t);

    json_t *c = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s}",
                          "architectures", oss ? "GptOssForCausalLM" : "OlmoeForCausalLM", "model_type", oss ? "gpt_oss" : "olmoe",
                          "hidden_size", (int)hs_u32(g, A, "embedding_length"),
                          "intermediate_size", (int)hs_u32(g, A, "feed_forward_length"),
                          "num_hidden_layers", (int)nl, "num_attention_heads", (int)hs_u32(g, A, "attention.head_count"),
                          "num_key_value_heads", (int)hs_u32(g, A, "attention.head_count_kv"),
                          "max_position_embeddings", (int)hs_u32(g, A, "context_length"),
                          "vocab_size", (int)hs_u32(g, A, "vocab_size"),
                          "rms_norm_eps", hs_f32(g, A, "attention.layer_norm_rms_epsilon"),
                          "rope_theta", hs_f32(g, A, "rope.freq_base"), "tie_word_embeddings", 0, "hidden_act", "silu");
    json_object_set_new(c, "num_experts_per_tok", json_integer(hs_u32(g, A, "expert_used_count")));
    json_object_set_new(c, "torch_dtype", json_string("float32"));
    if (oss) {
        json_t *lt = json_array();
        for (uint32_t i = 0; i < nl; i++)
            json_array_append_new(lt, json_string(i % 2 ? "full_attention" : "sliding_attention"));
        json_object_set_new(c, "layer_types", lt);
        json_object_set_new(c, "num_local_experts", json_integer(hs_u32(g, A, "expert_count")));
        json_object_set_new(c, "experts_per_token", json_integer(hs_u32(g, A, "expert_used_count")));
        json_object_set_new(c, "head_dim", json_integer(hs_u32(g, A, "attention.key_length")));
        json_object_set_new(c, "sliding_window", json_integer(hs_u32(g, A, "attention.sliding_window")));
        json_object_set_new(c, "attention_bias", json_true());
        json_object_set_new(c, "swiglu_limit", json_real(7.0));
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:s, s:f, s:i, s:f, s:f, s:b}", "rope_type", "yarn", "factor",
                                      hs_f32(g, A, "rope.scaling.factor"), "original_max_position_embeddings",
                                      (int)hs_u32(g, A, "rope.scaling.original_context_length"), "beta_fast", 32.0,
                                      "beta_slow", 1.0, "truncate", 0));
        json_object_set_new(c, "quantization_config",
                            json_pack("{s:s, s:[s, s, s, s]}", "quant_method", "mxfp4", "modules_to_not_convert",
                                      "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                      "lm_head"));
    } else {
        json_object_set_new(c, "num_experts", json_integer(hs_u32(g, A, "expert_count")));
        json_object_set_new(c, "norm_topk_prob", json_false());
        json_object_set_new(c, "clip_qkv", json_null());
        json_object_set_new(c, "attention_bias", json_false());
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS))
        rc = -1;
    json_decref(c);
    jlm_gguf_close(g);
    return rc;
}

#endif
