/* hf_synth.h - writes a Hugging Face folder (config.json + model.safetensors)
 * from one of the synthetic test GGUFs by inverting llama.cpp's
 * convert_hf_to_gguf.py mapping, for classes with no HF test folder here
 * (OlmoeForCausalLM, GptOssForCausalLM, DeepseekV3ForCausalLM,
 * Glm4MoeForCausalLM, Llama4ForCausalLM / Llama4ForConditionalGeneration).
 * Used by tests/test_hf.c.
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
 * - deepseek2: attn_k_b ne [nope, kv_lora, H] and attn_v_b ne [kv_lora, v, H]
 *   -> one kv_b_proj [H * (nope + v), kv_lora] (head h: its nope K rows,
 *   k_b transposed back, then its v V rows); exp_probs_b ->
 *   mlp.gate.e_score_correction_bias; shared experts -> mlp.shared_experts.
 * - glm4moe / deepseek2: one NextN/MTP layer of stand-in tensors after the
 *   last (num_nextn_predict_layers 1), which the converter must leave out.
 * - llama4: experts stacked the HF way, [E, in, out]: gate_up_proj
 *   [E, n_embd, 2 ff] (gate columns, then up) and down_proj [E, ff, n_embd];
 *   RoPE is interleaved (llama.cpp's Llama4Model does not permute), so q/k
 *   rows are as in the GGUF. The ConditionalGeneration variant nests the
 *   config in text_config, prefixes names with language_model. and adds a
 *   stand-in vision tensor.
 * Not a converter: it trusts its input (a file of tests/models). */
#ifndef JLM_TESTS_HF_SYNTH_H
#define JLM_TESTS_HF_SYNTH_H

#include <jansson.h>
#include <math.h>
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
    static const char *const FF[][2] = {
        {"ffn_gate.weight", "gate_proj.weight"}, {"ffn_up.weight", "up_proj.weight"}, {"ffn_down.weight", "down_proj.weight"},
        {"ffn_gate_shexp.weight", "gate_proj.weight"}, {"ffn_up_shexp.weight", "up_proj.weight"},
        {"ffn_down_shexp.weight", "down_proj.weight"},
    };
    static const char *const DS[][2] = {
        {"attn_q_a.weight", "self_attn.q_a_proj.weight"}, {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
        {"attn_q_b.weight", "self_attn.q_b_proj.weight"}, {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
        {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"}, {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
    };
    static char buf[96];
    int l4 = !strcmp(arch, "llama4");
    for (size_t i = 0; i < sizeof DS / sizeof DS[0]; i++)
        if (!strcmp(suf, DS[i][0]))
            return DS[i][1];
    for (size_t i = 0; i < sizeof FF / sizeof FF[0]; i++)
        if (!strcmp(suf, FF[i][0])) {
            snprintf(buf, sizeof buf, "%s%s%s", l4 ? "feed_forward." : "mlp.",
                     i < 3 ? "" : l4 ? "shared_expert." : "shared_experts.", FF[i][1]);
            return buf;
        }
    if (!strcmp(suf, "ffn_gate_inp.weight"))
        return !strcmp(arch, "gpt-oss") ? "mlp.router.weight" : l4 ? "feed_forward.router.weight" : "mlp.gate.weight";
    if (!strcmp(suf, "ffn_gate_inp.bias"))
        return "mlp.router.bias";
    return NULL;
}

/* deepseek2: blk.N.attn_k_b + attn_v_b -> model.layers.N.self_attn.kv_b_proj. */
static void hs_kv_b(hs_set *s, const jlm_gguf *g, unsigned b, const char *name)
{
    char kn[64], vn[64];
    snprintf(kn, sizeof kn, "blk.%u.attn_k_b.weight", b);
    snprintf(vn, sizeof vn, "blk.%u.attn_v_b.weight", b);
    const jlm_gguf_tensor *kb = jlm_gguf_find_tensor(g, kn), *vb = jlm_gguf_find_tensor(g, vn);
    if (!kb || !vb)
        abort();
    uint64_t nope = kb->ne[0], lora = kb->ne[1], H = kb->ne[2], v = vb->ne[1], shape[2] = {H * (nope + v), lora};
    hs_t *t = hs_add(s, name, "F32", 2, shape);
    float *d = (float *)(void *)t->data, *K = hs_rows(g, kb, 0, lora * H), *V = hs_rows(g, vb, 0, v * H);
    for (uint64_t h = 0; h < H; h++) {
        for (uint64_t j = 0; j < nope; j++)
            for (uint64_t c = 0; c < lora; c++)
                d[(h * (nope + v) + j) * lora + c] = K[(h * lora + c) * nope + j];
        memcpy(d + (h * (nope + v) + nope) * lora, V + h * v * lora, v * lora * 4);
    }
    free(K);
    free(V);
}

/* llama4: blk.N.ffn_{gate,up}_exps -> gate_up_proj [E, n_embd, 2 ff] and
 * ffn_down_exps -> down_proj [E, ff, n_embd]: [in, out] per expert. */
static void hs_l4_experts(hs_set *s, const jlm_gguf *g, const jlm_gguf_tensor *const *src, int n_src, const char *name)
{
    uint64_t in = src[0]->ne[0], out = src[0]->ne[1], E = src[0]->ne[2], shape[3] = {E, in, out * n_src};
    hs_t *t = hs_add(s, name, "F32", 3, shape);
    float *d = (float *)(void *)t->data;
    for (int o = 0; o < n_src; o++) {
        float *w = hs_rows(g, src[o], 0, out * E);
        for (uint64_t e = 0; e < E; e++)
            for (uint64_t r = 0; r < out; r++)
                for (uint64_t c = 0; c < in; c++)
                    d[(e * in + c) * out * n_src + o * out + r] = w[(e * out + r) * in + c];
        free(w);
    }
}

/* One NextN/MTP layer's stand-ins (a norm and eh_proj), as the converter must skip them. */
static void hs_mtp(hs_set *s, const jlm_gguf *g, unsigned layer, const char *prefix)
{
    char nm[160];
    const jlm_gguf_tensor *norm = jlm_gguf_find_tensor(g, "output_norm.weight"), *emb = jlm_gguf_find_tensor(g, "token_embd.weight");
    snprintf(nm, sizeof nm, "%smodel.layers.%u.enorm.weight", prefix, layer);
    hs_dense(s, g, norm, nm);
    snprintf(nm, sizeof nm, "%smodel.layers.%u.eh_proj.weight", prefix, layer);
    hs_dense(s, g, emb, nm);
    snprintf(nm, sizeof nm, "%smodel.layers.%u.mlp.experts.0.up_proj.weight", prefix, layer);
    hs_dense(s, g, emb, nm);
}

/* The HF tensors of every GGUF tensor (prefix: "language_model." or ""). */
static void hs_tensors(hs_set *s, const jlm_gguf *g, const char *A, const char *prefix)
{
    int oss = !strcmp(A, "gpt-oss"), l4 = !strcmp(A, "llama4");
    char nm[160];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const jlm_gguf_tensor *gt = &g->tensors[i];
        const char *n = gt->name.s;
        if (!strcmp(n, "token_embd.weight")) { snprintf(nm, sizeof nm, "%smodel.embed_tokens.weight", prefix); hs_dense(s, g, gt, nm); continue; }
        if (!strcmp(n, "output.weight")) { snprintf(nm, sizeof nm, "%slm_head.weight", prefix); hs_dense(s, g, gt, nm); continue; }
        if (!strcmp(n, "output_norm.weight")) { snprintf(nm, sizeof nm, "%smodel.norm.weight", prefix); hs_dense(s, g, gt, nm); continue; }
        unsigned b;
        int p = 0;
        if (sscanf(n, "blk.%u.%n", &b, &p) != 1 || !p)
            abort();
        const char *suf = n + p, *hfn = hs_block_name(A, suf);
        if (hfn) {
            snprintf(nm, sizeof nm, "%smodel.layers.%u.%s", prefix, b, hfn);
            hs_dense(s, g, gt, nm);
        } else if (!strcmp(suf, "attn_k_b.weight")) {
            snprintf(nm, sizeof nm, "model.layers.%u.self_attn.kv_b_proj.weight", b);
            hs_kv_b(s, g, b, nm);
        } else if (l4 && (!strcmp(suf, "ffn_gate_exps.weight") || !strcmp(suf, "ffn_down_exps.weight"))) {
            int gu = suf[4] == 'g';
            char un[64];
            snprintf(un, sizeof un, "blk.%u.ffn_up_exps.weight", b);
            const jlm_gguf_tensor *pair[2] = {gt, jlm_gguf_find_tensor(g, un)};
            if (gu && !pair[1])
                abort();
            snprintf(nm, sizeof nm, "%smodel.layers.%u.feed_forward.experts.%s", prefix, b, gu ? "gate_up_proj" : "down_proj");
            hs_l4_experts(s, g, pair, gu ? 2 : 1, nm);
        } else if (!oss && !l4 && strstr(suf, "_exps.weight")) {
            const char *w = !strncmp(suf, "ffn_gate", 8) ? "gate" : !strncmp(suf, "ffn_up", 6) ? "up" : "down";
            for (uint64_t e = 0; e < gt->ne[2]; e++) {
                uint64_t shape[2] = {gt->ne[1], gt->ne[0]};
                snprintf(nm, sizeof nm, "model.layers.%u.mlp.experts.%llu.%s_proj.weight", b, (unsigned long long)e, w);
                hs_t *t = hs_add(s, nm, "F32", 2, shape);
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
                hs_xbias(s, g, pair, 2, nm);
            else
                hs_mxfp4(s, g, pair, 2, nm);
        } else if (oss && !strcmp(suf, "ffn_down_exps.weight")) {
            snprintf(nm, sizeof nm, "model.layers.%u.mlp.experts.down_proj", b);
            hs_mxfp4(s, g, &gt, 1, nm);
        } else if (oss && !strcmp(suf, "ffn_down_exps.bias")) {
            snprintf(nm, sizeof nm, "model.layers.%u.mlp.experts.down_proj_bias", b);
            hs_xbias(s, g, &gt, 1, nm);
        } else if (!((oss || l4) && strncmp(suf, "ffn_up_exps.", 12) == 0) && strcmp(suf, "attn_v_b.weight")) {
            abort();   /* a tensor this inverse mapping does not know */
        }
    }
}

/* deepseek2 / glm4moe's MoE keys (DeepseekV3Config / Glm4MoeConfig names). */
static void hs_cfg_shared_moe(json_t *c, const jlm_gguf *g, const char *A)
{
    json_object_set_new(c, "n_routed_experts", json_integer(hs_u32(g, A, "expert_count")));
    json_object_set_new(c, "moe_intermediate_size", json_integer(hs_u32(g, A, "expert_feed_forward_length")));
    json_object_set_new(c, "n_shared_experts", json_integer(hs_u32(g, A, "expert_shared_count")));
    json_object_set_new(c, "first_k_dense_replace", json_integer(hs_u32(g, A, "leading_dense_block_count")));
    json_object_set_new(c, "routed_scaling_factor", json_real(hs_f32(g, A, "expert_weights_scale")));
    json_object_set_new(c, "norm_topk_prob", json_true());
    uint32_t ng = hs_u32(g, A, "expert_group_count");
    json_object_set_new(c, "n_group", json_integer(ng ? ng : 1));
    json_object_set_new(c, "topk_group", json_integer(ng ? hs_u32(g, A, "expert_group_used_count") : 1));
    json_object_set_new(c, "num_nextn_predict_layers", json_integer(1));
}

/* The per-class config.json fields beyond the shared ones. */
static void hs_cfg_family(json_t *c, const jlm_gguf *g, const char *A)
{
    uint32_t nl = hs_u32(g, A, "block_count");
    if (!strcmp(A, "gpt-oss")) {
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
    } else if (!strcmp(A, "olmoe")) {
        json_object_set_new(c, "num_experts", json_integer(hs_u32(g, A, "expert_count")));
        json_object_set_new(c, "norm_topk_prob", json_false());
        json_object_set_new(c, "clip_qkv", json_null());
        json_object_set_new(c, "attention_bias", json_false());
    } else if (!strcmp(A, "deepseek2")) {
        uint32_t rope = hs_u32(g, A, "rope.dimension_count");
        double ms = round(hs_f32(g, A, "rope.scaling.yarn_log_multiplier") / 0.1 * 1e6) / 1e6;
        hs_cfg_shared_moe(c, g, A);
        json_object_set_new(c, "num_key_value_heads", json_integer(hs_u32(g, A, "attention.head_count")));
        json_object_set_new(c, "q_lora_rank", json_integer(hs_u32(g, A, "attention.q_lora_rank")));
        json_object_set_new(c, "kv_lora_rank", json_integer(hs_u32(g, A, "attention.kv_lora_rank")));
        json_object_set_new(c, "qk_rope_head_dim", json_integer(rope));
        json_object_set_new(c, "qk_nope_head_dim", json_integer(hs_u32(g, A, "attention.key_length_mla") - rope));
        json_object_set_new(c, "v_head_dim", json_integer(hs_u32(g, A, "attention.value_length_mla")));
        json_object_set_new(c, "scoring_func", json_string("sigmoid"));
        json_object_set_new(c, "topk_method", json_string("noaux_tc"));
        json_object_set_new(c, "attention_bias", json_false());
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:s, s:f, s:i, s:f, s:f, s:f, s:f}", "type", "yarn", "factor",
                                      hs_f32(g, A, "rope.scaling.factor"), "original_max_position_embeddings",
                                      (int)hs_u32(g, A, "rope.scaling.original_context_length"), "beta_fast",
                                      hs_f32(g, A, "rope.scaling.yarn_beta_fast"), "beta_slow",
                                      hs_f32(g, A, "rope.scaling.yarn_beta_slow"), "mscale", ms, "mscale_all_dim", ms));
    } else if (!strcmp(A, "glm4moe")) {
        uint32_t hd = hs_u32(g, A, "attention.key_length");
        hs_cfg_shared_moe(c, g, A);
        json_object_set_new(c, "head_dim", json_integer(hd));
        json_object_set_new(c, "partial_rotary_factor", json_real((double)hs_u32(g, A, "rope.dimension_count") / hd));
        json_object_set_new(c, "use_qk_norm", json_true());
        json_object_set_new(c, "attention_bias", json_true());
    } else if (!strcmp(A, "llama4")) {
        uint32_t step = hs_u32(g, A, "interleave_moe_layer_step");
        json_t *nr = json_array(), *ml = json_array();
        for (uint32_t i = 0; i < nl; i++) {
            json_array_append_new(nr, json_integer((i + 1) % 4 != 0));
            if ((i + 1) % step == 0)
                json_array_append_new(ml, json_integer(i));
        }
        json_object_set_new(c, "no_rope_layers", nr);
        json_object_set_new(c, "moe_layers", ml);
        json_object_set_new(c, "interleave_moe_layer_step", json_integer(step));
        json_object_set_new(c, "intermediate_size", json_integer(hs_u32(g, A, "expert_feed_forward_length")));
        json_object_set_new(c, "intermediate_size_mlp", json_integer(hs_u32(g, A, "feed_forward_length")));
        json_object_set_new(c, "num_local_experts", json_integer(hs_u32(g, A, "expert_count")));
        json_object_set_new(c, "head_dim", json_integer(hs_u32(g, A, "attention.key_length")));
        json_object_set_new(c, "use_qk_norm", json_boolean(hs_u32(g, A, "expert_count") != 128));
        json_object_set_new(c, "attention_chunk_size", json_integer(8192));
        json_object_set_new(c, "attn_temperature_tuning", json_true());
        json_object_set_new(c, "floor_scale", json_integer(8192));
        json_object_set_new(c, "attn_scale", json_real(0.1));
        json_object_set_new(c, "attention_bias", json_false());
        json_object_set_new(c, "rope_scaling", json_null());
    }
}

/* Writes dir/config.json and dir/model.safetensors from gguf (olmoe, gpt-oss,
 * deepseek2, glm4moe or llama4; cond: llama4 as Llama4ForConditionalGeneration);
 * dir must exist. 0 on success. */
static int hs_from_gguf_as(const char *gguf, const char *dir, int cond)
{
    static const char *const CLS[][3] = {
        {"olmoe", "OlmoeForCausalLM", "olmoe"}, {"gpt-oss", "GptOssForCausalLM", "gpt_oss"},
        {"deepseek2", "DeepseekV3ForCausalLM", "deepseek_v3"}, {"glm4moe", "Glm4MoeForCausalLM", "glm4_moe"},
        {"llama4", "Llama4ForCausalLM", "llama4_text"},
    };
    jlm_gguf *g;
    jlm_gguf_str an;
    if (jlm_gguf_open(gguf, &g, NULL) || jlm_gguf_get_str(g, "general.architecture", &an, NULL))
        return -1;
    const char *A = an.s;
    size_t ci = 0;
    while (ci < sizeof CLS / sizeof CLS[0] && strcmp(CLS[ci][0], A))
        ci++;
    if (ci == sizeof CLS / sizeof CLS[0] || (cond && strcmp(A, "llama4"))) {
        jlm_gguf_close(g);
        return -1;
    }
    int mtp = !strcmp(A, "deepseek2") || !strcmp(A, "glm4moe");
    uint32_t nl = hs_u32(g, A, "block_count");
    hs_set s = {0};
    hs_tensors(&s, g, A, cond ? "language_model." : "");
    if (mtp)
        hs_mtp(&s, g, nl, "");
    if (cond) {
        uint64_t shape[2] = {16, 16};
        hs_add(&s, "vision_model.patch_embedding.linear.weight", "F32", 2, shape);
        hs_add(&s, "multi_modal_projector.linear_1.weight", "F32", 2, shape);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = hs_write_st(&s, path);
    for (size_t i = 0; i < s.n; i++)
        free(s.t[i].data);
    free(s.t);

    json_t *c = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s}",
                          "architectures", CLS[ci][1], "model_type", CLS[ci][2],
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
    hs_cfg_family(c, g, A);
    if (cond) {   /* Llama4ForConditionalGeneration: the text model's config nested */
        json_object_set_new(c, "architectures", json_pack("[s]", "Llama4ForConditionalGeneration"));
        json_t *outer = json_pack("{s:O, s:s, s:O, s:{s:s, s:i}, s:b}", "architectures", json_object_get(c, "architectures"),
                                  "model_type", "llama4", "text_config", c, "vision_config", "model_type", "llama4_vision_model",
                                  "hidden_size", 16, "tie_word_embeddings", 0);
        json_object_del(c, "architectures");
        json_decref(c);
        c = outer;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS))
        rc = -1;
    json_decref(c);
    jlm_gguf_close(g);
    return rc;
}

static int hs_from_gguf(const char *gguf, const char *dir) { return hs_from_gguf_as(gguf, dir, 0); }

#endif
