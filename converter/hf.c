/* hf.c - Hugging Face folder -> virtual GGUF handle (see hf.h).
 *
 * Phases: (1) config.json -> hfc (typed, per class, refusals by key);
 * (2) hfc -> llama.cpp metadata keys; (3) every safetensors tensor -> a
 * llama.cpp tensor name, a shape check against hfc and a row source (expert
 * tensors are gathered into one stacked tensor); (4) the handle, whose reads
 * go through vread (row permutation, dtype widening, norm + 1, gpt-oss's
 * interleaved gate/up rows and MXFP4 re-layout). */
#include "converter/hf_int.h"
#include "converter/safetensors.h"
#include "base/beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const cls_def CLASSES[] = {
    {"LlamaForCausalLM", "llama", FAM_LLAMA},     {"MistralForCausalLM", "llama", FAM_LLAMA},
    {"MixtralForCausalLM", "llama", FAM_LLAMA},   {"Qwen2ForCausalLM", "qwen2", FAM_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", FAM_QWEN3},     {"Qwen3MoeForCausalLM", "qwen3moe", FAM_QWEN3MOE},
    {"Gemma3ForCausalLM", "gemma3", FAM_GEMMA3},  {"Phi3ForCausalLM", "phi3", FAM_PHI3},
    {"OlmoeForCausalLM", "olmoe", FAM_OLMOE},     {"GptOssForCausalLM", "gpt-oss", FAM_GPTOSS},
    {"DeepseekV2ForCausalLM", "deepseek2", FAM_DEEPSEEK2}, {"DeepseekV3ForCausalLM", "deepseek2", FAM_DEEPSEEK2},
    {"Glm4MoeForCausalLM", "glm4moe", FAM_GLM4MOE},        {"Llama4ForCausalLM", "llama4", FAM_LLAMA4},
    {"Llama4ForConditionalGeneration", "llama4", FAM_LLAMA4},
};

/* ---------------------------------------------------------------- phase 1: config.json */
typedef struct cfgp { json_t *j; const char *path; jlm_err *err; } cfgp;

/* An optional non-negative integer key (absent or null: def). */
static int c_u32(cfgp *p, const char *key, uint32_t def, uint32_t *out)
{
    json_t *v = json_object_get(p->j, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: '%s' is not an integer in 0..2^31", p->path, key);
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int c_req(cfgp *p, const char *key, uint32_t *out)
{
    int rc = c_u32(p, key, 0, out);
    if (!rc && *out == 0)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: '%s' is missing or 0", p->path, key);
    return rc;
}

static int c_num(cfgp *p, const char *key, double def, double *out)
{
    json_t *v = json_object_get(p->j, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return jlm_errf(p->err, JLM_EFORMAT, "%s: '%s' is not a number", p->path, key);
    *out = json_number_value(v);
    return 0;
}

static int c_bool(cfgp *p, const char *key, int def, int *out)
{
    json_t *v = json_object_get(p->j, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return jlm_errf(p->err, JLM_EFORMAT, "%s: '%s' is not a boolean", p->path, key);
    *out = json_is_true(v);
    return 0;
}

/* A key the engine cannot honour unless it has the neutral value. */
static int c_refuse_unless(cfgp *p, const char *key, const char *ok1, const char *ok2)
{
    json_t *v = json_object_get(p->j, key);
    if (!v || json_is_null(v) || json_is_false(v))
        return 0;
    const char *s = json_string_value(v);
    if (s && ((ok1 && !strcmp(s, ok1)) || (ok2 && !strcmp(s, ok2))))
        return 0;
    return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: '%s' = %s is not supported", p->path, key,
                    s ? s : json_is_true(v) ? "true" : "a value other than null");
}

static int cfg_class(cfgp *p, hfc *c)
{
    json_t *a = json_object_get(p->j, "architectures");
    const char *name = json_string_value(json_array_get(a, 0));
    if (!name || json_array_size(a) != 1)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: 'architectures' is not a list of one class name", p->path);
    for (size_t i = 0; i < sizeof CLASSES / sizeof CLASSES[0]; i++)
        if (!strcmp(name, CLASSES[i].hf)) {
            c->cls = &CLASSES[i];
            return 0;
        }
    return jlm_errf(p->err, JLM_EUNSUPPORTED,
                    "%s: architecture class '%.100s' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                    "MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Gemma3ForCausalLM, "
                    "Phi3ForCausalLM, OlmoeForCausalLM, GptOssForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
                    "Glm4MoeForCausalLM, Llama4ForCausalLM, Llama4ForConditionalGeneration)", p->path, name);
}

static int cfg_sizes(cfgp *p, hfc *c)
{
    int rc;
    if ((rc = c_req(p, "num_hidden_layers", &c->n_layer)) || (rc = c_req(p, "hidden_size", &c->n_embd)) ||
        (rc = c_req(p, "num_attention_heads", &c->n_head)) || (rc = c_req(p, "vocab_size", &c->n_vocab)) ||
        (rc = c_req(p, "intermediate_size", &c->n_ffn)) || (rc = c_u32(p, "num_key_value_heads", c->n_head, &c->n_kv)) ||
        (rc = c_u32(p, "max_position_embeddings", 0, &c->n_ctx)) || (rc = c_u32(p, "head_dim", 0, &c->head_dim)))
        return rc;
    if (c->n_layer > 100000 || c->n_head > 4096 || c->n_kv == 0 || c->n_kv > c->n_head || c->n_head % c->n_kv)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: num_hidden_layers %u / num_attention_heads %u / num_key_value_heads %u "
                        "out of range", p->path, c->n_layer, c->n_head, c->n_kv);
    c->head_dim_given = c->head_dim != 0;
    if (!c->head_dim)
        c->head_dim = c->n_embd / c->n_head;
    if (!c->head_dim || c->head_dim > 4096)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: head_dim %u out of range", p->path, c->head_dim);
    c->n_rot = c->head_dim;
    return 0;
}

static int cfg_moe(cfgp *p, hfc *c)
{
    int rc, fam = c->cls->fam;
    uint32_t step;
    int norm;
    if (!strcmp(c->cls->hf, "MixtralForCausalLM")) {
        if ((rc = c_req(p, "num_local_experts", &c->n_expert)) || (rc = c_req(p, "num_experts_per_tok", &c->n_expert_used)))
            return rc;
        c->n_ffn_exp = c->n_ffn;
    } else if (fam == FAM_QWEN3MOE) {
        if ((rc = c_req(p, "num_experts", &c->n_expert)) || (rc = c_req(p, "num_experts_per_tok", &c->n_expert_used)) ||
            (rc = c_req(p, "moe_intermediate_size", &c->n_ffn_exp)) || (rc = c_u32(p, "decoder_sparse_step", 1, &step)) ||
            (rc = c_bool(p, "norm_topk_prob", 1, &norm)))
            return rc;
        json_t *mlp_only = json_object_get(p->j, "mlp_only_layers");
        if (step != 1 || !norm || json_array_size(mlp_only))
            return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: decoder_sparse_step %u / norm_topk_prob false / mlp_only_layers "
                            "are not supported", p->path, step);
    } else if (fam == FAM_OLMOE) {
        /* OLMoE: intermediate_size is the experts' size; top-k weights are not
         * renormalised (the engine's olmoe graph, llama.cpp's). */
        if ((rc = c_req(p, "num_experts", &c->n_expert)) || (rc = c_req(p, "num_experts_per_tok", &c->n_expert_used)) ||
            (rc = c_bool(p, "norm_topk_prob", 0, &norm)))
            return rc;
        if (norm)
            return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'norm_topk_prob' true is not supported for OlmoeForCausalLM",
                            p->path);
        c->n_ffn_exp = c->n_ffn;
    } else if (fam == FAM_GPTOSS) {
        if ((rc = c_req(p, "num_local_experts", &c->n_expert)) || (rc = c_req(p, "num_experts_per_tok", &c->n_expert_used)))
            return rc;
        c->n_ffn_exp = c->n_ffn;
    } else if (fam == FAM_DEEPSEEK2 || fam == FAM_GLM4MOE) {
        if ((rc = c_req(p, "n_routed_experts", &c->n_expert)) || (rc = c_req(p, "num_experts_per_tok", &c->n_expert_used)) ||
            (rc = c_req(p, "moe_intermediate_size", &c->n_ffn_exp)))
            return rc;
    } else if (fam == FAM_LLAMA4) {
        /* Llama 4: intermediate_size is the experts' width, intermediate_size_mlp the dense blocks' */
        if ((rc = c_req(p, "num_local_experts", &c->n_expert)) || (rc = c_req(p, "num_experts_per_tok", &c->n_expert_used)))
            return rc;
        c->n_ffn_exp = c->n_ffn;
        if ((rc = c_req(p, "intermediate_size_mlp", &c->n_ffn)))
            return rc;
        if (c->n_expert_used != 1)
            return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'num_experts_per_tok' %u is not supported for Llama 4 (1 only: "
                            "the router weight scales the one expert's input)", p->path, c->n_expert_used);
    }
    if (c->n_expert && (c->n_expert > 4096 || c->n_expert_used > c->n_expert))
        return jlm_errf(p->err, JLM_EFORMAT, "%s: %u experts, %u used: out of range", p->path, c->n_expert, c->n_expert_used);
    return 0;
}

/* gpt-oss: q/k/v/o biases, attention sinks and a router bias are tensors; the
 * engine's gpt-oss graph has llama.cpp's fixed SwiGLU limit 7 and its sliding
 * window on even layers (pattern 2), so other values are refused. */
static int cfg_gptoss(cfgp *p, hfc *c)
{
    int rc;
    double limit;
    if ((rc = c_refuse_unless(p, "hidden_act", "silu", NULL)) || (rc = c_refuse_unless(p, "mlp_bias", NULL, NULL)) ||
        (rc = c_num(p, "swiglu_limit", 7.0, &limit)) || (rc = c_req(p, "sliding_window", &c->swa)))
        return rc;
    if (limit != 7.0)
        return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'swiglu_limit' %g is not supported (7 only)", p->path, limit);
    json_t *lt = json_object_get(p->j, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (json_array_size(lt) != c->n_layer)
            return jlm_errf(p->err, JLM_EFORMAT, "%s: 'layer_types' does not list num_hidden_layers %u entries", p->path,
                            c->n_layer);
        for (uint32_t i = 0; i < c->n_layer; i++) {
            const char *ty = json_string_value(json_array_get(lt, i));
            const char *want = i % 2 ? "full_attention" : "sliding_attention";
            if (!ty || strcmp(ty, want))
                return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'layer_types'[%u] is not %s: only sliding attention on "
                                "even layers (llama.cpp's gpt-oss pattern) is supported", p->path, i, want);
        }
    }
    json_t *q = json_object_get(p->j, "quantization_config");
    const char *qm = json_string_value(json_object_get(q, "quant_method"));
    if (q && !json_is_null(q) && (!qm || strcmp(qm, "mxfp4")))
        return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: quantization_config.quant_method '%.40s' is not supported (mxfp4 only)",
                        p->path, qm ? qm : "?");
    return 0;
}

/* An optional string key: NULL if absent or null; refused if not a string. */
static int c_str(cfgp *p, const char *key, const char **out)
{
    json_t *v = json_object_get(p->j, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!(*out = json_string_value(v)))
        return jlm_errf(p->err, JLM_EFORMAT, "%s: '%s' is not a string", p->path, key);
    return 0;
}

/* deepseek2 / glm4moe: leading dense blocks, shared experts, the router's
 * scale, normalisation and groups, the NextN/MTP layers (llama.cpp's
 * DeepseekV2Model / Glm4MoeModel keys). */
static int cfg_shared_moe(cfgp *p, hfc *c)
{
    int rc;
    if ((rc = c_u32(p, "first_k_dense_replace", 0, &c->n_dense_lead)) || (rc = c_u32(p, "n_shared_experts", 0, &c->n_shared)) ||
        (rc = c_num(p, "routed_scaling_factor", 0, &c->routed_scale)) || (rc = c_bool(p, "norm_topk_prob", 0, &c->norm_topk)) ||
        (rc = c_u32(p, "n_group", 0, &c->n_group)) || (rc = c_u32(p, "topk_group", 0, &c->n_group_used)) ||
        (rc = c_u32(p, "num_nextn_predict_layers", 0, &c->nextn)))
        return rc;
    if (c->n_dense_lead > c->n_layer)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: 'first_k_dense_replace' %u exceeds num_hidden_layers %u", p->path,
                        c->n_dense_lead, c->n_layer);
    if (c->n_shared > 64)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: 'n_shared_experts' %u out of range (at most 64)", p->path, c->n_shared);
    if (c->n_group > 1 && (c->n_expert % c->n_group || !c->n_group_used || c->n_group_used > c->n_group))
        return jlm_errf(p->err, JLM_EFORMAT, "%s: 'n_group' %u / 'topk_group' %u do not divide %u experts", p->path,
                        c->n_group, c->n_group_used, c->n_expert);
    if (c->nextn > 64)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: 'num_nextn_predict_layers' %u out of range", p->path, c->nextn);
    if (c->routed_scale < 0 || c->routed_scale > 1e6)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: 'routed_scaling_factor' %g out of range", p->path, c->routed_scale);
    c->n_ffn_shexp = c->n_shared * c->n_ffn_exp;
    return c_refuse_unless(p, "hidden_act", "silu", NULL);
}

/* DeepSeek V2 / V3: multi-head latent attention (q_lora_rank may be null:
 * a plain q_proj), sigmoid or softmax routing. llama.cpp stores MLA as MQA of
 * one head over the latent | rope key (key_length kv_lora + rope, value_length
 * kv_lora) and the per-head sizes as the _mla keys. */
static int cfg_deepseek2(cfgp *p, hfc *c)
{
    int rc;
    const char *score, *topk;
    if ((rc = cfg_shared_moe(p, c)) || (rc = c_u32(p, "q_lora_rank", 0, &c->q_lora)) ||
        (rc = c_req(p, "kv_lora_rank", &c->kv_lora)) || (rc = c_req(p, "qk_nope_head_dim", &c->qk_nope)) ||
        (rc = c_req(p, "qk_rope_head_dim", &c->qk_rope)) || (rc = c_req(p, "v_head_dim", &c->v_head)) ||
        (rc = c_str(p, "scoring_func", &score)) || (rc = c_str(p, "topk_method", &topk)) ||
        (rc = c_refuse_unless(p, "attention_bias", NULL, NULL)))
        return rc;
    if (c->q_lora > 65536 || c->kv_lora > 65536 || c->qk_nope > 4096 || c->qk_rope > 4096 || c->qk_rope % 2 ||
        c->v_head > 4096)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: q_lora_rank %u / kv_lora_rank %u / qk_nope_head_dim %u / "
                        "qk_rope_head_dim %u / v_head_dim %u out of range", p->path, c->q_lora, c->kv_lora, c->qk_nope,
                        c->qk_rope, c->v_head);
    if (score && strcmp(score, "sigmoid") && strcmp(score, "softmax"))
        return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'scoring_func' '%.40s' is not supported (sigmoid, softmax)", p->path,
                        score);
    if (topk && strcmp(topk, "noaux_tc") && strcmp(topk, "greedy") && (strcmp(topk, "group_limited_greedy") || c->n_group > 1))
        return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'topk_method' '%.40s' is not supported (noaux_tc, greedy)", p->path,
                        topk);
    c->gating = score && !strcmp(score, "sigmoid") ? 2 : 1;
    c->n_kv = 1;                 /* MLA as MQA, as llama.cpp writes it */
    c->head_dim_given = 0;
    c->head_dim = c->n_rot = c->qk_nope + c->qk_rope;
    return 0;
}

/* GLM-4.5 MoE: partial NeoX RoPE (partial_rotary_factor, 0.5 when absent as
 * llama.cpp), q/k/v biases, q/k norms where the tensors are, sigmoid routing. */
static int cfg_glm4moe(cfgp *p, hfc *c)
{
    int rc;
    double partial;
    if ((rc = cfg_shared_moe(p, c)) || (rc = c_num(p, "partial_rotary_factor", 0.5, &partial)))
        return rc;
    c->n_rot = (uint32_t)(c->head_dim * partial);
    if (partial <= 0 || partial > 1 || c->n_rot % 2)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: partial_rotary_factor %g out of range", p->path, partial);
    c->gating = 2;
    return 0;
}

/* llama4 (text): what llama.cpp b10359 fixes in its graph is refused unless
 * the config says the same: chunked attention of 8192 on three layers of
 * four, the fourth without RoPE (no_rope_layers), temperature tuning (scale
 * 0.1, floor 8192), q/k norms exactly when there are not 128 experts, MoE on
 * every interleave_moe_layer_step-th layer. */
static int cfg_llama4(cfgp *p, hfc *c)
{
    int rc, qk;
    uint32_t chunk, floor_scale, interval;
    double attn_scale;
    json_t *tune = json_object_get(p->j, "attn_temperature_tuning");
    if ((rc = c_refuse_unless(p, "hidden_act", "silu", NULL)) || (rc = c_refuse_unless(p, "attention_bias", NULL, NULL)) ||
        (rc = c_u32(p, "interleave_moe_layer_step", 1, &c->moe_step)) || (rc = c_bool(p, "use_qk_norm", 1, &qk)) ||
        (rc = c_u32(p, "attention_chunk_size", 0, &chunk)) || (rc = c_u32(p, "floor_scale", 8192, &floor_scale)) ||
        (rc = c_num(p, "attn_scale", 0.1, &attn_scale)) || (rc = c_u32(p, "no_rope_layer_interval", 4, &interval)))
        return rc;
    if (!c->moe_step || c->moe_step > c->n_layer)
        return jlm_errf(p->err, JLM_EFORMAT, "%s: 'interleave_moe_layer_step' %u out of range", p->path, c->moe_step);
    if (qk != (c->n_expert != 128))
        return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'use_qk_norm' %s with %u experts is not supported (llama.cpp's "
                        "llama4 graph norms q/k exactly when there are not 128 experts)", p->path, qk ? "true" : "false",
                        c->n_expert);
    json_t *lt = json_object_get(p->j, "layer_types");
    int all_full = json_array_size(lt) > 0;
    for (size_t i = 0; i < json_array_size(lt); i++) {
        const char *ty = json_string_value(json_array_get(lt, i));
        all_full = all_full && ty && !strcmp(ty, "full_attention");
    }
    c->swa_off = all_full;
    if (!all_full && chunk != 8192)
        return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'attention_chunk_size' %u is not supported (8192 only, llama.cpp's)",
                        p->path, chunk);
    if (interval != 4 || floor_scale != 8192 || attn_scale != 0.1 || (tune && (json_is_false(tune) ||
                                                                               (json_is_integer(tune) && !json_integer_value(tune)))))
        return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'no_rope_layer_interval' %u / 'floor_scale' %u / 'attn_scale' %g / "
                        "'attn_temperature_tuning' off are not supported (4, 8192, 0.1, on)", p->path, interval,
                        floor_scale, attn_scale);
    json_t *nr = json_object_get(p->j, "no_rope_layers"), *ml = json_object_get(p->j, "moe_layers");
    for (uint32_t i = 0; i < c->n_layer && json_array_size(nr); i++) {
        json_t *v = json_array_get(nr, i);
        if (json_array_size(nr) != c->n_layer || !json_is_integer(v) || json_integer_value(v) != ((i + 1) % 4 != 0))
            return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'no_rope_layers' is not RoPE on three layers of four, the "
                            "fourth without (the only pattern llama.cpp runs)", p->path);
    }
    for (uint32_t i = 0, k = 0; ml && !json_is_null(ml) && i < c->n_layer; i++) {
        int moe = (i + 1) % c->moe_step == 0;
        json_t *v = json_array_get(ml, k);
        if (moe && !(json_is_integer(v) && json_integer_value(v) == i))
            return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'moe_layers' differs from every interleave_moe_layer_step-th "
                            "layer", p->path);
        k += moe;
        if (i + 1 == c->n_layer && json_array_size(ml) != k)
            return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: 'moe_layers' differs from every interleave_moe_layer_step-th "
                            "layer", p->path);
    }
    c->gating = 2;
    c->n_ffn_shexp = c->n_ffn_exp;   /* one shared expert of the experts' width */
    return 0;
}

static int cfg_family(cfgp *p, hfc *c)
{
    int rc, fam = c->cls->fam;
    double pre, partial;
    if (fam == FAM_GEMMA3) {
        if ((rc = c_refuse_unless(p, "hidden_activation", "gelu_pytorch_tanh", NULL)) ||
            (rc = c_u32(p, "sliding_window", 0, &c->swa)) || (rc = c_u32(p, "sliding_window_pattern", 6, &c->swa_pattern)) ||
            (rc = c_num(p, "rope_local_base_freq", 10000.0, &c->theta_swa)) ||
            (rc = c_num(p, "attn_logit_softcapping", 0, &c->attn_softcap)) ||
            (rc = c_num(p, "final_logit_softcapping", 0, &c->final_softcap)) ||
            (rc = c_num(p, "query_pre_attn_scalar", c->head_dim, &pre)))
            return rc;
        if (pre != c->head_dim)
            return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: query_pre_attn_scalar %g differs from head_dim %u: not supported",
                            p->path, pre, c->head_dim);
        return 0;
    }
    if (fam == FAM_GPTOSS)
        return cfg_gptoss(p, c);
    if (fam == FAM_DEEPSEEK2)
        return cfg_deepseek2(p, c);
    if (fam == FAM_GLM4MOE)
        return cfg_glm4moe(p, c);
    if (fam == FAM_LLAMA4)
        return cfg_llama4(p, c);
    if ((rc = c_refuse_unless(p, "hidden_act", "silu", NULL)) || (rc = c_refuse_unless(p, "attention_bias", NULL, NULL)) ||
        (rc = c_refuse_unless(p, "mlp_bias", NULL, NULL)))
        return rc;
    if (fam == FAM_OLMOE && (rc = c_refuse_unless(p, "clip_qkv", NULL, NULL)))
        return rc;
    if (fam == FAM_PHI3) {
        if ((rc = c_num(p, "partial_rotary_factor", 1.0, &partial)))
            return rc;
        c->n_rot = (uint32_t)(c->head_dim * partial);
        if (partial <= 0 || partial > 1 || c->n_rot % 2)
            return jlm_errf(p->err, JLM_EFORMAT, "%s: partial_rotary_factor %g out of range", p->path, partial);
    }
    return 0;
}

/* A yarn entry llama.cpp b10359's converter carries whole: factor and
 * original_max_position_embeddings only. gpt-oss's beta_fast 32 / beta_slow 1
 * are llama.cpp's fixed defaults (accepted at exactly those values); its
 * truncate false is ignored, as llama.cpp does (docs/safetensors.md). */
static int yarn_plain(json_t *r, int gptoss)
{
    json_t *bf = json_object_get(r, "beta_fast"), *bs = json_object_get(r, "beta_slow"), *tr = json_object_get(r, "truncate");
    if (json_object_get(r, "attention_factor") || json_object_get(r, "mscale") || json_object_get(r, "mscale_all_dim"))
        return 0;
    if (!gptoss)
        return !bf && !bs && !tr;
    return (!bf || (json_is_number(bf) && json_number_value(bf) == 32.0)) &&
           (!bs || (json_is_number(bs) && json_number_value(bs) == 1.0)) && (!tr || json_is_boolean(tr));
}

/* DeepSeek's yarn: beta_fast / beta_slow carried as keys, mscale_all_dim as
 * llama.cpp's yarn_log_multiplier (0.1 x mscale_all_dim). llama.cpp applies
 * only mscale_all_dim, so an mscale that differs from it (transformers
 * scales cos/sin by their ratio) is refused. */
static int yarn_deepseek(cfgp *q, hfc *c)
{
    double ms, ms_all;
    int rc;
    c->rope_kind = 2;
    if ((rc = c_num(q, "beta_fast", -1, &c->yarn_beta_fast)) || (rc = c_num(q, "beta_slow", -1, &c->yarn_beta_slow)) ||
        (rc = c_num(q, "mscale", 1.0, &ms)) || (rc = c_num(q, "mscale_all_dim", 0, &ms_all)))
        return rc;
    if (json_object_get(q->j, "attention_factor") || ms != ms_all)
        return jlm_errf(q->err, JLM_EUNSUPPORTED, "%s: rope_scaling yarn with mscale %g != mscale_all_dim %g or an "
                        "attention_factor is not supported", q->path, ms, ms_all);
    if (!(ms_all >= 0 && ms_all < 100))
        return jlm_errf(q->err, JLM_EFORMAT, "%s: rope_scaling.mscale_all_dim %g out of range", q->path, ms_all);
    c->yarn_log_mul = json_object_get(q->j, "mscale_all_dim") ? 0.1 * ms_all : -1;
    return 0;
}

/* rope_scaling: null, linear, yarn (factor, original_max_position_embeddings) or
 * llama3 (llama family: a generated rope_freqs tensor, section 3 of docs/safetensors.md). */
static int cfg_rope(cfgp *p, hfc *c)
{
    json_t *r = json_object_get(p->j, "rope_scaling");
    if (!r || json_is_null(r))
        return 0;
    const char *ty = json_string_value(json_object_get(r, "rope_type"));
    if (!ty)
        ty = json_string_value(json_object_get(r, "type"));
    cfgp q = {r, p->path, p->err};
    int rc = c_num(&q, "factor", 0, &c->rope_factor);
    if (!rc && (!ty || !strcmp(ty, "default")))
        return 0;
    if (!rc && !strcmp(ty, "linear"))
        c->rope_kind = 1;
    else if (!rc && !strcmp(ty, "yarn") && c->cls->fam == FAM_DEEPSEEK2)
        rc = yarn_deepseek(&q, c);
    else if (!rc && !strcmp(ty, "yarn") && yarn_plain(r, c->cls->fam == FAM_GPTOSS))
        c->rope_kind = 2;
    else if (!rc && !strcmp(ty, "llama3") && (c->cls->fam == FAM_LLAMA || c->cls->fam == FAM_LLAMA4))
        c->rope_kind = 3;
    else if (!rc)
        return jlm_errf(p->err, JLM_EUNSUPPORTED, "%s: rope_scaling type '%.40s'%s is not supported", p->path, ty,
                        !strcmp(ty, "yarn") ? " with beta_fast/beta_slow/attention_factor/mscale" : "");
    if (!rc && c->rope_kind == 3 && !json_object_get(r, "factor"))
        c->rope_factor = 8.0;
    if (!rc && !(c->rope_factor > 0 && c->rope_factor < 1e6))
        return jlm_errf(p->err, JLM_EFORMAT, "%s: rope_scaling.factor %g out of range", p->path, c->rope_factor);
    if (rc || (rc = c_num(&q, "low_freq_factor", 1.0, &c->rope_low)) || (rc = c_num(&q, "high_freq_factor", 4.0, &c->rope_high)) ||
        (rc = c_u32(&q, "original_max_position_embeddings", c->rope_kind == 3 ? 8192 : c->n_ctx, &c->rope_orig_ctx)))
        return rc;
    if (c->rope_kind == 3 && !(c->rope_low > 0 && c->rope_high >= c->rope_low && c->rope_orig_ctx))
        return jlm_errf(p->err, JLM_EFORMAT, "%s: rope_scaling low/high_freq_factor or original_max_position_embeddings "
                        "out of range", p->path);
    return 0;
}

static int cfg_parse(json_t *j, const char *path, hfc *c, jlm_err *err)
{
    cfgp p = {j, path, err};
    memset(c, 0, sizeof *c);
    c->yarn_beta_fast = c->yarn_beta_slow = c->yarn_log_mul = -1;
    c->prefix = "";
    if (!json_is_object(j))
        return jlm_errf(err, JLM_EFORMAT, "%s: not a JSON object", path);
    int rc = cfg_class(&p, c);
    if (!rc && !strcmp(c->cls->hf, "Llama4ForConditionalGeneration")) {
        /* the text model: text_config, tensors under language_model. (vision_model. and
         * multi_modal_projector. are the projector's: jlm convert --mmproj does not take them) */
        p.j = json_object_get(j, "text_config");
        c->prefix = "language_model.";
        if (!json_is_object(p.j))
            return jlm_errf(err, JLM_EFORMAT, "%s: 'text_config' is not an object", path);
    }
    if (rc || (rc = cfg_sizes(&p, c)) || (rc = cfg_moe(&p, c)) || (rc = cfg_family(&p, c)) ||
        (rc = c_num(&p, "rms_norm_eps", 1e-6, &c->eps)) || (rc = c_num(&p, "rope_theta", 10000.0, &c->theta)) ||
        (rc = c_bool(&p, "tie_word_embeddings", c->cls->fam == FAM_GEMMA3, &c->tied)) ||
        (rc = cfg_rope(&p, c)))
        return rc;
    if (!(c->eps > 0 && c->eps < 1) || !(c->theta > 0 && c->theta < 1e12))
        return jlm_errf(err, JLM_EFORMAT, "%s: rms_norm_eps %g / rope_theta %g out of range", path, c->eps, c->theta);
    return 0;
}

/* ---------------------------------------------------------------- the virtual model */
static void hf_free(void *p)
{
    hf *h = p;
    if (!h)
        return;
    for (uint64_t i = 0; i < h->n_own; i++)
        free(h->own[i]);
    for (uint64_t i = 0; i < h->n_t; i++)
        free(h->src[i].seg);
    free(h->own); free(h->kv); free(h->t); free(h->src);
    jlm_st_close(h->st);
    if (h->dir_fd >= 0)
        close(h->dir_fd);
    free(h);
}

static int more(void **v, uint64_t *cap, uint64_t n, size_t sz)
{
    if (n < *cap)
        return 1;
    uint64_t nc = *cap ? *cap * 2 : 64;
    void *p = realloc(*v, nc * sz);
    if (!p)
        return 0;
    *v = p;
    *cap = nc;
    return 1;
}

char *jlm_hf_own(hf *h, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return jlm_hf_keep(h, n < 0 ? NULL : s);
}

void *jlm_hf_keep(hf *h, void *p)
{
    if (!p || !more((void **)&h->own, &h->cap_own, h->n_own, sizeof *h->own)) {
        free(p);
        return NULL;
    }
    h->own[h->n_own++] = p;
    return p;
}

/* ---------------------------------------------------------------- phase 2: metadata */
jlm_gguf_kv *jlm_hf_kv(hf *h, const char *key, int arch_key, uint32_t type)
{
    char *k = arch_key ? jlm_hf_own(h, "%s.%s", h->c.cls->gguf, key) : jlm_hf_own(h, "%s", key);
    if (!k || !more((void **)&h->kv, &h->cap_kv, h->n_kv, sizeof *h->kv))
        return NULL;
    jlm_gguf_kv *kv = &h->kv[h->n_kv++];
    memset(kv, 0, sizeof *kv);
    kv->key.s = k;
    kv->key.len = strlen(k);
    kv->type = type;
    kv->n = 1;
    return kv;
}

static int kv_u32(hf *h, const char *key, uint32_t v)
{
    jlm_gguf_kv *kv = jlm_hf_kv(h, key, 1, GGUF_T_U32);
    if (kv)
        kv->v.u = v;
    return kv ? 0 : JLM_ENOMEM;
}

static int kv_f32(hf *h, const char *key, double v)
{
    jlm_gguf_kv *kv = jlm_hf_kv(h, key, 1, GGUF_T_F32);
    if (kv)
        kv->v.f = (float)v;
    return kv ? 0 : JLM_ENOMEM;
}

int jlm_hf_kv_str(hf *h, const char *key, const char *v)
{
    jlm_gguf_kv *kv = jlm_hf_kv(h, key, 0, GGUF_T_STRING);
    char *s = kv ? jlm_hf_own(h, "%s", v) : NULL;
    if (s) {
        kv->v.str.s = s;
        kv->v.str.len = strlen(s);
    }
    return s ? 0 : JLM_ENOMEM;
}

static int kv_bool(hf *h, const char *key, int v)
{
    jlm_gguf_kv *kv = jlm_hf_kv(h, key, 1, GGUF_T_BOOL);
    if (kv)
        kv->v.b = v;
    return kv ? 0 : JLM_ENOMEM;
}

/* The keys llama.cpp's converter writes for deepseek2, glm4moe and llama4
 * (docs/safetensors.md, section 2). Groups of one are no groups: not written. */
static int meta_moe_family(hf *h)
{
    const hfc *c = &h->c;
    int fam = c->cls->fam, rc = 0;
    if (fam == FAM_LLAMA4)
        return kv_u32(h, "interleave_moe_layer_step", c->moe_step) ||
               (c->swa_off && kv_u32(h, "attention.sliding_window", 0));
    if (fam != FAM_DEEPSEEK2 && fam != FAM_GLM4MOE)
        return 0;
    rc = kv_u32(h, "leading_dense_block_count", c->n_dense_lead) || kv_u32(h, "expert_shared_count", c->n_shared) ||
         kv_u32(h, "expert_gating_func", c->gating) || (c->routed_scale && kv_f32(h, "expert_weights_scale", c->routed_scale)) ||
         (c->norm_topk && kv_bool(h, "expert_weights_norm", 1)) ||
         (c->n_group > 1 && (kv_u32(h, "expert_group_count", c->n_group) || kv_u32(h, "expert_group_used_count", c->n_group_used)));
    if (!rc && fam == FAM_GLM4MOE && c->nextn)
        rc = kv_u32(h, "nextn_predict_layers", c->nextn);
    if (!rc && fam == FAM_DEEPSEEK2)
        rc = (c->q_lora && kv_u32(h, "attention.q_lora_rank", c->q_lora)) || kv_u32(h, "attention.kv_lora_rank", c->kv_lora) ||
             kv_u32(h, "attention.key_length", c->kv_lora + c->qk_rope) || kv_u32(h, "attention.value_length", c->kv_lora) ||
             kv_u32(h, "attention.key_length_mla", c->qk_nope + c->qk_rope) ||
             kv_u32(h, "attention.value_length_mla", c->v_head) || kv_u32(h, "rope.dimension_count", c->qk_rope);
    if (!rc && c->rope_kind == 2)
        rc = (c->yarn_beta_fast >= 0 && kv_f32(h, "rope.scaling.yarn_beta_fast", c->yarn_beta_fast)) ||
             (c->yarn_beta_slow >= 0 && kv_f32(h, "rope.scaling.yarn_beta_slow", c->yarn_beta_slow)) ||
             (c->yarn_log_mul >= 0 && kv_f32(h, "rope.scaling.yarn_log_multiplier", c->yarn_log_mul));
    return rc;
}

static int metadata(hf *h)
{
    const hfc *c = &h->c;
    int rc = jlm_hf_kv_str(h, "general.architecture", c->cls->gguf) ||
             kv_u32(h, "block_count", c->n_layer + (c->cls->fam == FAM_GLM4MOE ? c->nextn : 0)) ||
             kv_u32(h, "embedding_length", c->n_embd) ||
             kv_u32(h, "feed_forward_length", c->n_ffn) || kv_u32(h, "attention.head_count", c->n_head) ||
             kv_u32(h, "attention.head_count_kv", c->n_kv) || kv_u32(h, "context_length", c->n_ctx) ||
             kv_u32(h, "vocab_size", c->n_vocab) || kv_f32(h, "attention.layer_norm_rms_epsilon", c->eps) ||
             kv_f32(h, "rope.freq_base", c->theta);
    if (!rc && c->head_dim_given)
        rc = kv_u32(h, "attention.key_length", c->head_dim) || kv_u32(h, "attention.value_length", c->head_dim);
    if (!rc && c->n_rot != c->head_dim)
        rc = kv_u32(h, "rope.dimension_count", c->n_rot);
    if (!rc && (c->rope_kind == 1 || c->rope_kind == 2)) {
        jlm_gguf_kv *kv = jlm_hf_kv(h, "rope.scaling.type", 1, GGUF_T_STRING);
        char *ty = kv ? jlm_hf_own(h, "%s", c->rope_kind == 1 ? "linear" : "yarn") : NULL;
        if (ty) {
            kv->v.str.s = ty;
            kv->v.str.len = strlen(ty);
        }
        rc = !ty || kv_f32(h, "rope.scaling.factor", c->rope_factor) ||
             (c->rope_kind == 2 && kv_u32(h, "rope.scaling.original_context_length", c->rope_orig_ctx));
    }
    if (!rc && c->n_expert)   /* llama.cpp's OLMoE converter writes no expert_feed_forward_length */
        rc = kv_u32(h, "expert_count", c->n_expert) || kv_u32(h, "expert_used_count", c->n_expert_used) ||
             (c->cls->fam != FAM_OLMOE && kv_u32(h, "expert_feed_forward_length", c->n_ffn_exp));
    if (!rc && c->cls->fam == FAM_GPTOSS)
        rc = kv_u32(h, "attention.sliding_window", c->swa);
    if (!rc && c->cls->fam == FAM_GEMMA3) {
        rc = kv_f32(h, "rope.freq_base_swa", c->theta_swa);
        if (!rc && c->swa)
            rc = kv_u32(h, "attention.sliding_window", c->swa) || kv_u32(h, "attention.sliding_window_pattern", c->swa_pattern);
        if (!rc && c->attn_softcap)
            rc = kv_f32(h, "attn_logit_softcapping", c->attn_softcap);
        if (!rc && c->final_softcap)
            rc = kv_f32(h, "final_logit_softcapping", c->final_softcap);
    }
    if (!rc)
        rc = meta_moe_family(h);
    return rc ? jlm_errf(h->err, JLM_ENOMEM, "%s: metadata", h->dir) : 0;
}

/* ---------------------------------------------------------------- phase 3: tensors */
enum { SH_EMBD, SH_VEC, SH_Q, SH_KV, SH_O, SH_QB, SH_KVB, SH_HEAD, SH_UP, SH_DOWN, SH_QKV, SH_UP2,
       SH_ROUTER, SH_XUP, SH_XDOWN, SH_SINKS, SH_RB, SH_SKIP, SH_QA, SH_QAN, SH_QBL, SH_KVA, SH_KVAN, SH_KVBP, SH_DSO,
       SH_SHUP, SH_SHDOWN };
enum { P_Q = 1, P_K = 2, EXPERT = 4, LLAMA_ONLY_PERM = 8 };

typedef struct name_map { const char *hf, *gguf; int shape, flags; } name_map;

/* model.layers.N.<hf> -> blk.N.<gguf>. Gemma3's own names come first for it. */
static const name_map GEMMA_BLOCK[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight", SH_VEC, 0},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight", SH_VEC, 0},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", SH_VEC, 0},
};
/* OLMoE's q_norm / k_norm span the whole q / k projection (the engine's
 * QK_NORM_WIDE, llama.cpp's olmoe graph), not one head. */
static const name_map OLMOE_BLOCK[] = {
    {"self_attn.q_norm.weight", "attn_q_norm.weight", SH_QB, 0},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", SH_KVB, 0},
};
/* gpt-oss: post_attention_layernorm is llama.cpp's post_attention_norm (the
 * pre-FFN norm), the output bias, the sinks and the router. */
static const name_map GPTOSS_BLOCK[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight", SH_VEC, 0},
    {"self_attn.o_proj.bias", "attn_output.bias", SH_VEC, 0},
    {"self_attn.sinks", "attn_sinks.weight", SH_SINKS, 0},
    {"mlp.router.weight", "ffn_gate_inp.weight", SH_ROUTER, 0},
    {"mlp.router.bias", "ffn_gate_inp.bias", SH_RB, 0},
};
/* The MoE families' own tables (no fall-back to BLOCK): llama.cpp's
 * tensor_mapping for deepseek2, glm4moe and llama4. */
#define MOE_SHARED(pre) \
    {pre "gate_proj.weight", "ffn_gate_shexp.weight", SH_SHUP, 0}, {pre "up_proj.weight", "ffn_up_shexp.weight", SH_SHUP, 0}, \
    {pre "down_proj.weight", "ffn_down_shexp.weight", SH_SHDOWN, 0}
#define MOE_DENSE(pre) \
    {pre "gate_proj.weight", "ffn_gate.weight", SH_UP, 0}, {pre "up_proj.weight", "ffn_up.weight", SH_UP, 0}, \
    {pre "down_proj.weight", "ffn_down.weight", SH_DOWN, 0}
#define PRE_NORMS(ffn_norm) \
    {"input_layernorm.weight", "attn_norm.weight", SH_VEC, 0}, {"post_attention_layernorm.weight", ffn_norm, SH_VEC, 0}
#define ATTN_QKVO \
    {"self_attn.q_proj.weight", "attn_q.weight", SH_Q, 0}, {"self_attn.k_proj.weight", "attn_k.weight", SH_KV, 0}, \
    {"self_attn.v_proj.weight", "attn_v.weight", SH_KV, 0}, {"self_attn.o_proj.weight", "attn_output.weight", SH_O, 0}, \
    {"self_attn.rotary_emb.inv_freq", NULL, SH_SKIP, 0}
#define SIGMOID_ROUTER \
    {"mlp.gate.weight", "ffn_gate_inp.weight", SH_ROUTER, 0}, \
    {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias", SH_RB, 0}
static const name_map DEEPSEEK2_BLOCK[] = {
    PRE_NORMS("ffn_norm.weight"),
    {"self_attn.q_proj.weight", "attn_q.weight", SH_Q, 0},
    {"self_attn.q_a_proj.weight", "attn_q_a.weight", SH_QA, 0},
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight", SH_QAN, 0},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight", SH_QBL, 0},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", SH_KVA, 0},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight", SH_KVAN, 0},
    {"self_attn.o_proj.weight", "attn_output.weight", SH_DSO, 0},
    {"self_attn.rotary_emb.inv_freq", NULL, SH_SKIP, 0},
    SIGMOID_ROUTER, MOE_SHARED("mlp.shared_experts."), MOE_DENSE("mlp."),
};
static const name_map GLM4MOE_BLOCK[] = {
    PRE_NORMS("post_attention_norm.weight"), ATTN_QKVO,
    {"self_attn.q_proj.bias", "attn_q.bias", SH_QB, 0},
    {"self_attn.k_proj.bias", "attn_k.bias", SH_KVB, 0},
    {"self_attn.v_proj.bias", "attn_v.bias", SH_KVB, 0},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", SH_HEAD, 0},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", SH_HEAD, 0},
    SIGMOID_ROUTER, MOE_SHARED("mlp.shared_experts."), MOE_DENSE("mlp."),
};
static const name_map LLAMA4_BLOCK[] = {
    PRE_NORMS("ffn_norm.weight"), ATTN_QKVO,
    {"feed_forward.router.weight", "ffn_gate_inp.weight", SH_ROUTER, 0},
    MOE_SHARED("feed_forward.shared_expert."), MOE_DENSE("feed_forward."),
};
static const name_map BLOCK[] = {
    {"input_layernorm.weight", "attn_norm.weight", SH_VEC, 0},
    {"post_attention_layernorm.weight", "ffn_norm.weight", SH_VEC, 0},
    {"self_attn.q_proj.weight", "attn_q.weight", SH_Q, P_Q},
    {"self_attn.k_proj.weight", "attn_k.weight", SH_KV, P_K},
    {"self_attn.v_proj.weight", "attn_v.weight", SH_KV, 0},
    {"self_attn.o_proj.weight", "attn_output.weight", SH_O, 0},
    {"self_attn.q_proj.bias", "attn_q.bias", SH_QB, 0},
    {"self_attn.k_proj.bias", "attn_k.bias", SH_KVB, 0},
    {"self_attn.v_proj.bias", "attn_v.bias", SH_KVB, 0},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", SH_HEAD, 0},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", SH_HEAD, 0},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight", SH_QKV, 0},
    {"self_attn.rotary_emb.inv_freq", NULL, SH_SKIP, 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", SH_UP, 0},
    {"mlp.up_proj.weight", "ffn_up.weight", SH_UP, 0},
    {"mlp.down_proj.weight", "ffn_down.weight", SH_DOWN, 0},
    {"mlp.gate_up_proj.weight", "ffn_up.weight", SH_UP2, 0},
    {"mlp.gate.weight", "ffn_gate_inp.weight", SH_ROUTER, 0},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight", SH_ROUTER, 0},
};
/* model.layers.N.<prefix>.E.<hf> -> blk.N.<gguf>, stacked over E. */
static const struct { const char *prefix, *hf, *gguf; int shape; } EXPERTS[] = {
    {"mlp.experts.", "gate_proj.weight", "ffn_gate_exps.weight", SH_XUP},
    {"mlp.experts.", "up_proj.weight", "ffn_up_exps.weight", SH_XUP},
    {"mlp.experts.", "down_proj.weight", "ffn_down_exps.weight", SH_XDOWN},
    {"block_sparse_moe.experts.", "w1.weight", "ffn_gate_exps.weight", SH_XUP},
    {"block_sparse_moe.experts.", "w3.weight", "ffn_up_exps.weight", SH_XUP},
    {"block_sparse_moe.experts.", "w2.weight", "ffn_down_exps.weight", SH_XDOWN},
};
static const name_map GLOBAL[] = {
    {"model.embed_tokens.weight", "token_embd.weight", SH_EMBD, 0},
    {"lm_head.weight", "output.weight", SH_EMBD, 0},
    {"model.norm.weight", "output_norm.weight", SH_VEC, 0},
};

/* Expected HF shape [rows, cols] (cols 0: a vector of rows). */
static void expect(const hfc *c, int shape, uint64_t *rows, uint64_t *cols)
{
    uint64_t q = (uint64_t)c->n_head * c->head_dim, kv = (uint64_t)c->n_kv * c->head_dim, E = c->n_embd;
    uint64_t r = 0, k = E;
    switch (shape) {
    case SH_EMBD:   r = c->n_vocab; break;
    case SH_VEC:    r = E; k = 0; break;
    case SH_Q:      r = q; break;
    case SH_KV:     r = kv; break;
    case SH_O:      r = E; k = q; break;
    case SH_QB:     r = q; k = 0; break;
    case SH_KVB:    r = kv; k = 0; break;
    case SH_HEAD:   r = c->head_dim; k = 0; break;
    case SH_UP:     r = c->n_ffn; break;
    case SH_DOWN:   r = E; k = c->n_ffn; break;
    case SH_QKV:    r = q + 2 * kv; break;
    case SH_UP2:    r = 2 * (uint64_t)c->n_ffn; break;
    case SH_ROUTER: r = c->n_expert; break;
    case SH_XUP:    r = c->n_ffn_exp; break;
    case SH_XDOWN:  r = E; k = c->n_ffn_exp; break;
    case SH_SINKS:  r = c->n_head; k = 0; break;
    case SH_RB:     r = c->n_expert; k = 0; break;
    case SH_QA:     r = c->q_lora; break;
    case SH_QAN:    r = c->q_lora; k = 0; break;
    case SH_QBL:    r = q; k = c->q_lora; break;
    case SH_KVA:    r = (uint64_t)c->kv_lora + c->qk_rope; break;
    case SH_KVAN:   r = c->kv_lora; k = 0; break;
    case SH_KVBP:   r = (uint64_t)c->n_head * (c->qk_nope + c->v_head); k = c->kv_lora; break;
    case SH_DSO:    r = E; k = (uint64_t)c->n_head * c->v_head; break;
    case SH_SHUP:   r = c->n_ffn_shexp; break;
    case SH_SHDOWN: r = E; k = c->n_ffn_shexp; break;
    }
    *rows = r;
    *cols = k;
}

static int check_shape(hf *h, const jlm_st_tensor *t, int shape)
{
    uint64_t rows, cols;
    expect(&h->c, shape, &rows, &cols);
    int ok = cols ? t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols
                  : t->n_dims == 1 && t->shape[0] == rows;
    if (ok && rows)
        return 0;
    char got[96];
    int n = snprintf(got, sizeof got, "[");
    for (uint32_t d = 0; d < t->n_dims && n < 80; d++)
        n += snprintf(got + n, sizeof got - n, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    snprintf(got + n, sizeof got - n, "]");
    if (cols)
        return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s' has shape %s, config.json gives [%" PRIu64 ", %" PRIu64 "]",
                        jlm_st_file(h->st, t->file), t->name, got, rows, cols);
    return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s' has shape %s, config.json gives [%" PRIu64 "]",
                    jlm_st_file(h->st, t->file), t->name, got, rows);
}

static jlm_gguf_tensor *find_made(hf *h, const char *name, uint64_t *i)
{
    for (uint64_t k = 0; k < h->n_t; k++)
        if (!strcmp(h->t[k].name.s, name)) {
            *i = k;
            return &h->t[k];
        }
    return NULL;
}

/* A new virtual tensor of n_seg segments of seg_rows rows of row_len elements
 * of ggml type `type`, n_dims 1 (a vector), 2 (rows of all segments) or 3
 * (ne [row_len, seg_rows, n_seg]). The last h->src entry describes its source. */
static int make_raw(hf *h, const char *name, uint32_t type, uint32_t n_dims, uint64_t row_len, uint64_t seg_rows,
                    uint32_t n_seg)
{
    if (!more((void **)&h->t, &h->cap_t, h->n_t, sizeof *h->t) ||
        !more((void **)&h->src, &h->cap_src, h->n_t, sizeof *h->src) ||
        !(name = jlm_hf_own(h, "%s", name)))
        return jlm_errf(h->err, JLM_ENOMEM, "%s: tensor table", h->dir);
    jlm_gguf_tensor *g = &h->t[h->n_t];
    vsrc *s = &h->src[h->n_t];
    memset(g, 0, sizeof *g);
    memset(s, 0, sizeof *s);
    if (!(s->seg = calloc(n_seg ? n_seg : 1, sizeof *s->seg)))
        return jlm_errf(h->err, JLM_ENOMEM, "%s: tensor table", h->dir);
    h->n_t++;
    s->n_seg = n_seg;
    s->row_len = row_len;
    s->seg_rows = seg_rows;
    g->name.s = name;
    g->name.len = strlen(name);
    g->type = type;
    g->n_dims = n_dims;
    g->ne[0] = row_len;
    g->ne[1] = n_dims == 1 ? 1 : n_dims == 2 ? seg_rows * n_seg : seg_rows;
    g->ne[2] = n_dims == 3 ? n_seg : 1;
    g->ne[3] = 1;
    g->n_bytes = row_len / jlm_ggml_block_elems(type) * seg_rows * n_seg * jlm_ggml_block_bytes(type);
    return 0;
}

/* A new virtual tensor over n_seg sources of rows x cols (cols 0: a vector). */
static int make(hf *h, const char *name, const jlm_st_tensor *t, uint32_t n_seg, int flags)
{
    int vec = t->n_dims == 1;
    uint32_t type = vec ? GGML_F32 : t->dtype;   /* 1-D: F32, as llama.cpp writes them */
    int rc = make_raw(h, name, type, vec ? 1 : n_seg > 1 || (flags & EXPERT) ? 3 : 2, t->shape[vec ? 0 : 1],
                      vec ? 1 : t->shape[0], n_seg);
    if (rc)
        return rc;
    vsrc *s = &h->src[h->n_t - 1];
    s->add_one = h->c.cls->fam == FAM_GEMMA3 && vec && strstr(name, "norm.weight");
    if (h->c.cls->fam == FAM_LLAMA && (flags & (P_Q | P_K)))
        s->perm_heads = flags & P_Q ? h->c.n_head : h->c.n_kv;
    if (s->perm_heads && (s->seg_rows % s->perm_heads || (s->seg_rows / s->perm_heads) % 2))
        return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s': %" PRIu64 " rows do not split into %u heads of even size",
                        jlm_st_file(h->st, t->file), t->name, s->seg_rows, s->perm_heads);
    return 0;
}

/* "model.layers.N.rest" -> N and rest; 0 if not a layer tensor. */
static int layer_of(const char *name, uint32_t *blk, const char **rest)
{
    static const char P[] = "model.layers.";
    if (strncmp(name, P, sizeof P - 1))
        return 0;
    char *end;
    const char *d = name + sizeof P - 1;
    if (*d < '0' || *d > '9')
        return 0;
    unsigned long b = strtoul(d, &end, 10);
    if (*end != '.' || b > 1000000)
        return 0;
    *blk = (uint32_t)b;
    *rest = end + 1;
    return 1;
}

/* An expert tensor: stacks it into blk.N.<gguf>; 1 if handled, <0 on error. */
static int map_expert(hf *h, const jlm_st_tensor *t, uint32_t blk, const char *rest)
{
    for (size_t i = 0; i < sizeof EXPERTS / sizeof EXPERTS[0]; i++) {
        size_t pl = strlen(EXPERTS[i].prefix);
        if (strncmp(rest, EXPERTS[i].prefix, pl))
            continue;
        char *end;
        unsigned long e = strtoul(rest + pl, &end, 10);
        if (end == rest + pl || *end != '.' || strcmp(end + 1, EXPERTS[i].hf))
            continue;
        if (!h->c.n_expert || e >= h->c.n_expert)
            return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s': expert %lu of %u", jlm_st_file(h->st, t->file), t->name,
                            e, h->c.n_expert);
        int rc = check_shape(h, t, EXPERTS[i].shape);
        if (rc)
            return rc;
        char name[96];
        snprintf(name, sizeof name, "blk.%u.%s", blk, EXPERTS[i].gguf);
        uint64_t k;
        if (!find_made(h, name, &k)) {
            if ((rc = make(h, name, t, h->c.n_expert, EXPERT)))
                return rc;
            k = h->n_t - 1;
        }
        const jlm_st_tensor *first = NULL;
        for (uint32_t s = 0; s < h->src[k].n_seg && !first; s++)
            first = h->src[k].seg[s];
        if (first && first->dtype != t->dtype)
            return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s': dtype differs from '%s'", jlm_st_file(h->st, t->file),
                            t->name, first->name);
        h->src[k].seg[e] = t;
        return 1;
    }
    return 0;
}

static int shape_is(const jlm_st_tensor *t, const uint64_t *want, uint32_t nd)
{
    if (t->n_dims != nd)
        return 0;
    for (uint32_t d = 0; d < nd; d++)
        if (t->shape[d] != want[d])
            return 0;
    return 1;
}

static int shape_refused(hf *h, const jlm_st_tensor *t, const uint64_t *want, uint32_t nd)
{
    char got[96], exp[96];
    int n = snprintf(got, sizeof got, "["), m = snprintf(exp, sizeof exp, "[");
    for (uint32_t d = 0; d < t->n_dims && n < 80; d++)
        n += snprintf(got + n, sizeof got - n, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    for (uint32_t d = 0; d < nd && m < 80; d++)
        m += snprintf(exp + m, sizeof exp - m, "%s%" PRIu64, d ? ", " : "", want[d]);
    snprintf(got + n, sizeof got - n, "]");
    snprintf(exp + m, sizeof exp - m, "]");
    return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s' has shape %s, config.json gives %s", jlm_st_file(h->st, t->file),
                    t->name, got, exp);
}

/* gpt-oss's experts: one HF tensor per kind holds every expert. MXFP4
 * _blocks [E, rows, k/32, 16] and _scales [E, rows, k/32] (U8), and _bias
 * [E, rows]. gate_up_proj interleaves gate (even rows) and up (odd rows):
 * convert_hf_to_gguf's [::2] / [1::2] split, here at read time. The MXFP4
 * bytes are carried as they are, re-laid into ggml's block (section 4 of
 * docs/safetensors.md). 1 if handled, <0 on error, 0 if not one of them. */
static int map_gptoss_expert(hf *h, const jlm_st_tensor *t, uint32_t blk, const char *rest)
{
    static const char P[] = "mlp.experts.";
    if (h->c.cls->fam != FAM_GPTOSS || strncmp(rest, P, sizeof P - 1))
        return 0;
    const char *w = rest + sizeof P - 1;
    int gu = !strncmp(w, "gate_up_proj", 12), dn = !strncmp(w, "down_proj", 9);
    const char *kind = gu ? w + 12 : dn ? w + 9 : NULL;
    int part = !kind ? -1 : !strcmp(kind, "_blocks") ? 0 : !strcmp(kind, "_scales") ? 1 : !strcmp(kind, "_bias") ? 2 : -1;
    if (part < 0)
        return jlm_errf(h->err, JLM_EUNSUPPORTED, "%s: tensor '%s': gpt-oss experts are read as MXFP4 "
                        "gate_up_proj/down_proj _blocks, _scales and _bias only", jlm_st_file(h->st, t->file), t->name);
    const hfc *c = &h->c;
    uint64_t E = c->n_expert, rows = gu ? 2 * (uint64_t)c->n_ffn : c->n_embd, k = gu ? c->n_embd : c->n_ffn;
    uint64_t want[4] = {E, rows, k / 32, 16};
    uint32_t nd = part == 0 ? 4 : part == 1 ? 3 : 2;
    if (k % 32)
        return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s': row length %" PRIu64 " is not a multiple of MXFP4's 32",
                        jlm_st_file(h->st, t->file), t->name, k);
    if (!shape_is(t, want, nd))
        return shape_refused(h, t, want, nd);
    if ((part < 2) != (t->dtype == JLM_ST_U8))
        return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s': dtype must be %s", jlm_st_file(h->st, t->file), t->name,
                        part < 2 ? "U8 (MXFP4)" : "F32, F16 or BF16");
    for (uint32_t o = 0; o < (gu ? 2u : 1u); o++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%u.ffn_%s_exps.%s", blk, gu ? (o ? "up" : "gate") : "down",
                 part == 2 ? "bias" : "weight");
        uint64_t i;
        int rc;
        if (!find_made(h, name, &i)) {
            if (part == 2)
                rc = make_raw(h, name, GGML_F32, 2, rows / (gu ? 2 : 1), 1, (uint32_t)E);
            else
                rc = make_raw(h, name, GGML_MXFP4, 3, k, rows / (gu ? 2 : 1), (uint32_t)E);
            if (rc)
                return rc;
            i = h->n_t - 1;
            vsrc *s = &h->src[i];
            s->shared = 1;
            s->src_seg_rows = part == 2 ? 1 : rows;
            s->rstride = s->cstride = 1;
            if (part == 2)
                s->cstride = gu ? 2 : 1, s->cphase = o;
            else
                s->rstride = gu ? 2 : 1, s->rphase = o;
            if (part < 2 && !(s->scales = jlm_hf_keep(h, calloc(E, sizeof *s->scales))))
                return jlm_errf(h->err, JLM_ENOMEM, "%s: tensor table", h->dir);
        }
        vsrc *s = &h->src[i];
        for (uint64_t e = 0; e < E; e++) {
            if (part == 1)
                s->scales[e] = t;
            else
                s->seg[e] = t;
        }
    }
    return 1;
}

/* A virtual tensor read transposed from t (vsrc.transposed): n_seg segments
 * of seg_rows rows of row_len elements; segment k's element j of row r is
 * t's row k * src_seg_rows + rphase + j, column cphase + r. */
static int make_transposed(hf *h, const char *name, const jlm_st_tensor *t, uint64_t row_len, uint64_t seg_rows,
                           uint32_t n_seg, uint64_t src_seg_rows, uint32_t rphase, uint32_t cphase)
{
    int rc = make_raw(h, name, t->dtype, 3, row_len, seg_rows, n_seg);
    if (rc)
        return rc;
    vsrc *s = &h->src[h->n_t - 1];
    s->transposed = s->shared = 1;
    s->src_seg_rows = src_seg_rows;
    s->rphase = rphase;
    s->cphase = cphase;
    s->src_row_len = t->shape[t->n_dims - 1];
    for (uint32_t k = 0; k < n_seg; k++)
        s->seg[k] = t;
    return 0;
}

/* deepseek2's kv_b_proj [n_head * (nope + v), kv_lora] -> llama.cpp's split
 * attn_k_b ne [nope, kv_lora, n_head] (each head's K rows transposed) and
 * attn_v_b ne [kv_lora, v, n_head] (each head's V rows). */
static int map_kv_b(hf *h, const jlm_st_tensor *t, uint32_t blk)
{
    const hfc *c = &h->c;
    int rc = check_shape(h, t, SH_KVBP);
    char name[96];
    snprintf(name, sizeof name, "blk.%u.attn_k_b.weight", blk);
    if (!rc)
        rc = make_transposed(h, name, t, c->qk_nope, c->kv_lora, c->n_head, c->qk_nope + c->v_head, 0, 0);
    snprintf(name, sizeof name, "blk.%u.attn_v_b.weight", blk);
    if (!rc)
        rc = make_raw(h, name, t->dtype, 3, c->kv_lora, c->v_head, c->n_head);
    if (rc)
        return rc;
    vsrc *s = &h->src[h->n_t - 1];
    s->shared = 1;
    s->src_seg_rows = c->qk_nope + c->v_head;
    s->rphase = c->qk_nope;
    for (uint32_t k = 0; k < c->n_head; k++)
        s->seg[k] = t;
    return 0;
}

/* llama4's experts: feed_forward.experts.gate_up_proj [E, n_embd, 2 ff]
 * (gate columns first) and down_proj [E, ff, n_embd], both [in, out]:
 * convert_hf_to_gguf's transpose, here at read time. 1 if handled. */
static int map_llama4_experts(hf *h, const jlm_st_tensor *t, uint32_t blk, const char *rest)
{
    static const char P[] = "feed_forward.experts.";
    if (h->c.cls->fam != FAM_LLAMA4 || strncmp(rest, P, sizeof P - 1))
        return 0;
    const hfc *c = &h->c;
    int gu = !strcmp(rest + sizeof P - 1, "gate_up_proj"), dn = !strcmp(rest + sizeof P - 1, "down_proj");
    if (!gu && !dn)
        return jlm_errf(h->err, JLM_EUNSUPPORTED, "%s: tensor '%s' is not known for %s", jlm_st_file(h->st, t->file),
                        t->name, c->cls->hf);
    uint64_t want[3] = {c->n_expert, gu ? c->n_embd : c->n_ffn_exp, gu ? 2 * (uint64_t)c->n_ffn_exp : c->n_embd};
    if (!shape_is(t, want, 3))
        return shape_refused(h, t, want, 3);
    char name[96];
    int rc = 0;
    for (uint32_t o = 0; o < (gu ? 2u : 1u) && !rc; o++) {
        snprintf(name, sizeof name, "blk.%u.ffn_%s_exps.weight", blk, dn ? "down" : o ? "up" : "gate");
        rc = make_transposed(h, name, t, want[1], gu ? c->n_ffn_exp : c->n_embd, c->n_expert, want[1], 0,
                             o ? c->n_ffn_exp : 0);
    }
    return rc ? rc : 1;
}

static const name_map *lookup(const name_map *m, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(m[i].hf, name))
            return &m[i];
    return NULL;
}

/* The family's own block table; NULL: the shared tables. */
static const name_map *family_block(int fam, size_t *n)
{
#define FB(T) (*n = sizeof T / sizeof T[0], T)
    switch (fam) {
    case FAM_GEMMA3:    return FB(GEMMA_BLOCK);
    case FAM_OLMOE:     return FB(OLMOE_BLOCK);
    case FAM_GPTOSS:    return FB(GPTOSS_BLOCK);
    case FAM_DEEPSEEK2: return FB(DEEPSEEK2_BLOCK);
    case FAM_GLM4MOE:   return FB(GLM4MOE_BLOCK);
    case FAM_LLAMA4:    return FB(LLAMA4_BLOCK);
    }
#undef FB
    return NULL;
}

static int map_one(hf *h, const jlm_st_tensor *t)
{
    uint32_t blk;
    const char *rest, *tname = t->name;
    const name_map *m = NULL;
    char name[160];
    size_t pl = strlen(h->c.prefix);
    if (pl && (!strncmp(tname, "vision_model.", 13) || !strncmp(tname, "multi_modal_projector.", 22))) {
        h->n_skipped++;   /* the vision tower and projector of a ...ForConditionalGeneration */
        return 0;
    }
    if (pl && !strncmp(tname, h->c.prefix, pl))
        tname += pl;
    if (layer_of(tname, &blk, &rest)) {
        if (blk >= h->c.n_layer && blk - h->c.n_layer < h->c.nextn) {
            h->n_skipped++;   /* a NextN/MTP layer: not run (llama.cpp skips it too) */
            return 0;
        }
        if (blk >= h->c.n_layer)
            return jlm_errf(h->err, JLM_EFORMAT, "%s: tensor '%s' is in layer %u, config.json has num_hidden_layers %u",
                            jlm_st_file(h->st, t->file), t->name, blk, h->c.n_layer);
        int rc = map_gptoss_expert(h, t, blk, rest);
        if (!rc && t->dtype == JLM_ST_U8)
            return jlm_errf(h->err, JLM_EUNSUPPORTED, "%s: tensor '%s': dtype U8 is read only as gpt-oss's MXFP4 "
                            "_blocks / _scales", jlm_st_file(h->st, t->file), t->name);
        if (!rc && h->c.cls->fam == FAM_DEEPSEEK2 && !strcmp(rest, "self_attn.kv_b_proj.weight"))
            return map_kv_b(h, t, blk);
        if (!rc)
            rc = map_llama4_experts(h, t, blk, rest);
        if (!rc)
            rc = map_expert(h, t, blk, rest);
        if (rc)
            return rc < 0 ? rc : 0;
        size_t nf = 0;
        const name_map *fb = family_block(h->c.cls->fam, &nf);
        int fam = h->c.cls->fam, own = fam == FAM_DEEPSEEK2 || fam == FAM_GLM4MOE || fam == FAM_LLAMA4;
        if (fb)
            m = lookup(fb, nf, rest);
        if (!m && !own)
            m = lookup(BLOCK, sizeof BLOCK / sizeof BLOCK[0], rest);
        if (m && m->gguf)
            snprintf(name, sizeof name, "blk.%u.%s", blk, m->gguf);
    } else {
        if (t->dtype == JLM_ST_U8)
            return jlm_errf(h->err, JLM_EUNSUPPORTED, "%s: tensor '%s': dtype U8 is read only as gpt-oss's MXFP4 "
                            "_blocks / _scales", jlm_st_file(h->st, t->file), t->name);
        m = lookup(GLOBAL, sizeof GLOBAL / sizeof GLOBAL[0], tname);
        if (m)
            snprintf(name, sizeof name, "%s", m->gguf);
    }
    if (!m)
        return jlm_errf(h->err, JLM_EUNSUPPORTED, "%s: tensor '%s' is not known for %s", jlm_st_file(h->st, t->file),
                        t->name, h->c.cls->hf);
    if (m->shape == SH_SKIP)
        return 0;
    if (!strcmp(tname, "lm_head.weight") && h->c.tied)
        return 0;                 /* tied: transformers uses the embeddings */
    int rc = check_shape(h, t, m->shape);
    if (!rc)
        rc = make(h, name, t, 1, m->flags);
    if (!rc)
        h->src[h->n_t - 1].seg[0] = t;
    return rc;
}

/* Every stacked tensor got all its experts; untied models have lm_head. */
static int check_complete(hf *h)
{
    for (uint64_t i = 0; i < h->n_t; i++)
        for (uint32_t s = 0; s < h->src[i].n_seg; s++) {
            if (h->src[i].scales && (!h->src[i].seg[s] || !h->src[i].scales[s]))
                return jlm_errf(h->err, JLM_EFORMAT, "%s: %s: the MXFP4 %s tensor is missing", h->dir, h->t[i].name.s,
                                h->src[i].seg[s] ? "_scales" : "_blocks");
            if (!h->src[i].seg[s])
                return jlm_errf(h->err, JLM_EFORMAT, "%s: %s: expert %u has no tensor", h->dir, h->t[i].name.s, s);
        }
    uint64_t k;
    if (!h->c.tied && !find_made(h, "output.weight", &k))
        return jlm_errf(h->err, JLM_EFORMAT, "%s: config.json: tie_word_embeddings is false but there is no lm_head.weight",
                        h->dir);
    return 0;
}

/* llama.cpp's LlamaModel.generate_extra_tensors for rope_type llama3, in
 * float32 as torch computes it: the per-frequency divisors of rope_freqs. */
static int llama3_rope_freqs(hf *h)
{
    const hfc *c = &h->c;
    uint32_t n = c->head_dim / 2;
    float *f = jlm_hf_keep(h, calloc(n ? n : 1, sizeof *f));
    jlm_st_tensor shape = {.name = "rope_freqs", .dtype = GGML_F32, .n_dims = 1, .shape = {n}};
    if (!f || make(h, "rope_freqs.weight", &shape, 1, 0))
        return jlm_errf(h->err, JLM_ENOMEM, "%s: rope_freqs", h->dir);
    const float factor = (float)c->rope_factor, low = (float)c->rope_low, high = (float)c->rope_high;
    const float old = (float)c->rope_orig_ctx, low_wl = old / low, high_wl = old / high;
    for (uint32_t i = 0; i < n; i++) {
        const float freq = 1.0f / powf((float)c->theta, (float)(2 * i) / (float)c->head_dim);
        const float wl = 2.0f * (float)M_PI / freq;
        if (wl < high_wl) {
            f[i] = 1.0f;
        } else if (wl > low_wl) {
            f[i] = factor;
        } else {
            const float smooth = (old / wl - low) / (high - low);
            f[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
        }
    }
    h->src[h->n_t - 1].data = f;
    h->src[h->n_t - 1].n_seg = 0;
    return 0;
}

static int map_all(hf *h)
{
    int rc = h->c.rope_kind == 3 ? llama3_rope_freqs(h) : 0;
    if (rc)
        return rc;
    for (uint64_t i = 0; i < jlm_st_count(h->st); i++) {
        rc = map_one(h, jlm_st_at(h->st, i));
        if (rc)
            return rc;
    }
    return check_complete(h);
}

/* ---------------------------------------------------------------- phase 4: reads */
static uint32_t esize(uint32_t type) { return type == GGML_F32 ? 4 : 2; }

/* Source row of output row r within a segment: llama.cpp's permute() undone
 * in reverse: out row (h, i, p) comes from source row (h, p, i). */
static uint64_t src_row(const vsrc *s, uint64_t r)
{
    if (!s->perm_heads)
        return r;
    uint64_t hd = s->seg_rows / s->perm_heads, half = hd / 2;
    uint64_t h = r / hd, j = r % hd;
    return h * hd + (j % 2) * half + j / 2;
}

/* Element j * stride + phase of the source row, widened to F32. */
static void widen(uint32_t type, const uint8_t *in, float *out, uint64_t n, int add_one, uint32_t stride, uint32_t phase)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t j = i * stride + phase;
        uint16_t v = (uint16_t)(in[2 * j] | in[2 * j + 1] << 8);
        float f;
        if (type == GGML_F32)
            memcpy(&f, in + 4 * j, 4);
        else
            f = type == GGML_BF16 ? jlm_bf16_to_f32(v) : jlm_f16_to_f32(v);
        out[i] = add_one ? f + 1.0f : f;
    }
}

/* nb MXFP4 blocks in HF's layout (16 bytes of 32 nibbles, element 2i in the low
 * nibble of byte i, element 2i + 1 in its high one; one E8M0 scale byte each)
 * -> ggml's block_mxfp4 (the scale byte, then byte i holds elements i (low)
 * and i + 16 (high)): convert_hf_to_gguf's transform_nibble_layout. The
 * 4-bit codes and scale bytes are not changed. */
static void mxfp4_join(const uint8_t *blocks, const uint8_t *scales, uint8_t *out, uint64_t nb)
{
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *q = blocks + 16 * b;
        uint8_t *o = out + 17 * b;
        o[0] = scales[b];
        for (int i = 0; i < 16; i++) {
            uint8_t lo = (uint8_t)((q[i / 2] >> (4 * (i & 1))) & 0xF);
            uint8_t hi = (uint8_t)((q[(i + 16) / 2] >> (4 * (i & 1))) & 0xF);
            o[1 + i] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* Row by row, through a bounce buffer: permuted, interleaved, shared,
 * widened or MXFP4 rows. */
static int read_rows(hf *h, const jlm_gguf_tensor *g, const vsrc *s, uint64_t off, uint8_t *buf, size_t n,
                     jlm_err *err)
{
    int mx = s->scales != NULL;
    uint32_t rs = s->rstride ? s->rstride : 1, cs = s->cstride ? s->cstride : 1;
    uint64_t nb = s->row_len / 32;
    uint64_t srb = mx ? nb * 16 : s->row_len * cs * esize(s->seg[0]->dtype);
    uint64_t orb = mx ? nb * 17 : s->row_len * esize(g->type);
    uint8_t *row = malloc(srb + orb + (mx ? nb : 0));
    if (!row)
        return jlm_errf(err, JLM_ENOMEM, "%s: row buffer", h->dir);
    int rc = 0;
    for (uint64_t r = off / orb; r * orb < off + n && !rc; r++) {
        uint64_t k = r / s->seg_rows;
        const jlm_st_tensor *t = s->seg[k];
        uint64_t sr = (s->shared ? k * s->src_seg_rows : 0) + src_row(s, r % s->seg_rows) * rs + s->rphase;
        uint8_t *o = row + srb;
        if ((rc = jlm_st_read(h->st, t, sr * srb, row, srb, err)))
            break;
        if (mx) {
            if ((rc = jlm_st_read(h->st, s->scales[k], sr * nb, o + orb, nb, err)))
                break;
            mxfp4_join(row, o + orb, o, nb);
        } else if (g->type == t->dtype && !s->add_one && cs == 1) {
            memcpy(o, row, srb);
        } else {
            widen(t->dtype, row, (float *)(void *)o, s->row_len, s->add_one, cs, s->cphase);
        }
        uint64_t lo = r * orb > off ? r * orb : off, hi = (r + 1) * orb < off + n ? (r + 1) * orb : off + n;
        memcpy(buf + (lo - off), o + (lo - r * orb), hi - lo);
    }
    free(row);
    return rc;
}

/* A transposed tensor (vsrc.transposed), a run of rows of one segment at a
 * time: for each of the row_len source rows, one read of the run's columns
 * (contiguous there), scattered into the run's rows. The elements keep
 * their dtype. */
static int read_transposed(hf *h, const jlm_gguf_tensor *g, const vsrc *s, uint64_t off, uint8_t *buf, size_t n,
                           jlm_err *err)
{
    uint64_t es = esize(g->type), orb = s->row_len * es, r1 = (off + n + orb - 1) / orb;
    int rc = 0;
    for (uint64_t r = off / orb; r < r1 && !rc;) {
        uint64_t k = r / s->seg_rows, ra = r % s->seg_rows, cnt = s->seg_rows - ra;
        if (cnt > r1 - r)
            cnt = r1 - r;
        uint8_t *tile = malloc(cnt * orb + cnt * es), *col = tile + cnt * orb;
        if (!tile)
            return jlm_errf(err, JLM_ENOMEM, "%s: row buffer", h->dir);
        for (uint64_t j = 0; j < s->row_len && !rc; j++) {
            uint64_t sr = k * s->src_seg_rows + s->rphase + j;
            rc = jlm_st_read(h->st, s->seg[k], (sr * s->src_row_len + s->cphase + ra) * es, col, cnt * es, err);
            for (uint64_t i = 0; i < cnt && !rc; i++)
                memcpy(tile + i * orb + j * es, col + i * es, es);
        }
        uint64_t lo = r * orb > off ? r * orb : off, hi = (r + cnt) * orb < off + n ? (r + cnt) * orb : off + n;
        if (!rc)
            memcpy(buf + (lo - off), tile + (lo - r * orb), hi - lo);
        free(tile);
        r += cnt;
    }
    return rc;
}

static int vread(void *ctx, uint64_t i, uint64_t off, void *buf, size_t n, jlm_err *err)
{
    hf *h = ctx;   /* read-only here: the daemon's packers read one conversion from several threads */
    const jlm_gguf_tensor *g = &h->t[i];
    const vsrc *s = &h->src[i];
    if (off > g->n_bytes || n > g->n_bytes - off)
        return jlm_errf(err, JLM_EINVAL, "%s: tensor '%s': read past its %" PRIu64 " bytes", h->dir, g->name.s, g->n_bytes);
    if (s->data) {
        memcpy(buf, (const uint8_t *)s->data + off, n);
        return 0;
    }
    if (s->transposed)
        return read_transposed(h, g, s, off, buf, n, err);
    if (s->perm_heads || s->add_one || s->shared || g->type != s->seg[0]->dtype)
        return read_rows(h, g, s, off, buf, n, err);
    uint64_t sb = s->seg[0]->n_bytes;   /* direct: segment by segment */
    for (uint32_t k = (uint32_t)(off / sb); k < s->n_seg && (uint64_t)k * sb < off + n; k++) {
        uint64_t lo = k * sb > off ? k * sb : off, hi = (k + 1) * sb < off + n ? (k + 1) * sb : off + n;
        int rc = jlm_st_read(h->st, s->seg[k], lo - k * sb, (uint8_t *)buf + (lo - off), hi - lo, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------- open */
/* The folder's JSON files; config.json may be absent only in a tokenizer-only folder. */
typedef struct hf_json { json_t *cfg, *tok, *tok_cfg, *gen; const char *cfg_path; } hf_json;

static void json_free(hf_json *j)
{
    json_decref(j->cfg); json_decref(j->tok); json_decref(j->tok_cfg); json_decref(j->gen);
}

static int build(hf *h, hf_json *j, FILE *notes, jlm_gguf **out, jlm_err *err)
{
    h->err = err;
    int rc = 0;
    if (j->cfg) {
        if (!(rc = cfg_parse(j->cfg, j->cfg_path, &h->c, err)) && !(rc = metadata(h)))
            rc = map_all(h);
        if (!rc && h->n_skipped && notes)
            fprintf(notes, "note: %s: %" PRIu64 " tensor(s) not converted: %s\n", h->dir, h->n_skipped,
                    h->c.prefix[0] ? "the vision tower and projector (the text model only)"
                                   : "the NextN/MTP layer(s), which are not run");
    }
    if (!rc)
        rc = jlm_hf_tokenizer(h, j->tok, j->tok_cfg, j->gen, j->cfg ? h->c.n_vocab : 0, notes);
    json_free(j);
    if (rc) {
        hf_free(h);
        return rc;
    }
    return jlm_gguf_virtual(h->dir, h->kv, h->n_kv, h->t, h->n_t, (h->st ? jlm_st_total_bytes(h->st) : 0) + h->json_bytes, vread, h,
                            hf_free, out, err);
}

static int exists_at(int dir_fd, int beneath, const char *name)
{
    struct stat st;
    return fstatat(dir_fd, name, &st, beneath ? AT_SYMLINK_NOFOLLOW : 0) == 0;
}

static int exists(const char *dir, const char *name)
{
    struct stat st;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

/* A jlmfs model view also holds a config.json (and model.jlm): it is not a source. */
int jlm_hf_is_folder(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode) || exists(path, "model.jlm"))
        return 0;
    return exists(path, "tokenizer.json") ||
           (exists(path, "config.json") &&
            (exists(path, "model.safetensors") || exists(path, "model.safetensors.index.json")));
}

int jlm_hf_is_folder_at(int root_fd, const char *rel)
{
    int d = jlm_open_beneath(root_fd, rel, O_PATH | O_DIRECTORY, 0);
    if (d < 0)
        return 0;
    int r = !exists_at(d, 1, "model.jlm") &&
            (exists_at(d, 1, "tokenizer.json") ||
             (exists_at(d, 1, "config.json") &&
              (exists_at(d, 1, "model.safetensors") || exists_at(d, 1, "model.safetensors.index.json"))));
    close(d);
    return r;
}

/* An optional JSON file of the folder (absent: *out NULL). tokenizer_config.json
 * is read with integers as reals: its model_max_length is often 1e30, and no
 * integer of it is used. */
static int load(hf *h, const char *name, size_t flags, json_t **out, const char **path_out, jlm_err *err)
{
    *out = NULL;
    if (!exists_at(h->dir_fd, h->beneath, name))
        return 0;
    char *p = jlm_hf_own(h, "%s/%s", h->dir, name);
    json_error_t je = {.text = ""};
    if (!p)
        return jlm_errf(err, JLM_ENOMEM, "%s", h->dir);
    if (path_out)
        *path_out = p;
    int fd = h->beneath ? jlm_open_beneath(h->dir_fd, name, O_RDONLY | O_NONBLOCK, 0)
                        : openat(h->dir_fd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return jlm_errf(err, JLM_EIO, "%s: %s", p, strerror(errno));
    struct stat st;
    FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "r") : NULL;
    if (!f) {
        close(fd);
        return jlm_errf(err, JLM_EIO, "%s: not a readable regular file", p);
    }
    *out = json_loadf(f, JSON_REJECT_DUPLICATES | flags, &je);
    fclose(f);
    h->json_bytes += (uint64_t)st.st_size;
    if (!*out || !json_is_object(*out))
        return jlm_errf(err, JLM_EFORMAT, "%s: line %d: %s", p, je.line, *out ? "not a JSON object" : je.text);
    return 0;
}

int jlm_hf_open_at(int root_fd, const char *dir, FILE *notes, jlm_gguf **out, jlm_err *err)
{
    hf *h = calloc(1, sizeof *h);
    hf_json j = {0};
    if (h)
        h->dir_fd = -1;
    if (!h || !(h->dir = jlm_hf_own(h, "%s", dir))) {
        hf_free(h);
        return jlm_errf(err, JLM_ENOMEM, "%s", dir);
    }
    h->beneath = root_fd >= 0;
    h->dir_fd = h->beneath ? jlm_open_beneath(root_fd, dir, O_PATH | O_DIRECTORY, 0)
                           : open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int rc = h->dir_fd < 0
                 ? jlm_errf(err, errno == ENOENT ? JLM_ENOTFOUND : JLM_EIO, "%s: %s", dir, strerror(errno)) : 0;
    if (!rc)
        rc = load(h, "config.json", 0, &j.cfg, &j.cfg_path, err);
    if (!rc)
        rc = load(h, "tokenizer.json", 0, &j.tok, NULL, err);
    if (!rc)
        rc = load(h, "tokenizer_config.json", JSON_DECODE_INT_AS_REAL, &j.tok_cfg, NULL, err);
    if (!rc)
        rc = load(h, "generation_config.json", 0, &j.gen, NULL, err);
    if (!rc && !j.cfg && !j.tok)
        rc = jlm_errf(err, JLM_ENOTFOUND, "%s: no config.json or tokenizer.json", dir);
    if (!rc && j.cfg)
        rc = jlm_st_open_dirfd(h->dir_fd, h->beneath, dir, &h->st, err);
    if (rc) {
        json_free(&j);
        hf_free(h);
        return rc;
    }
    return build(h, &j, notes, out, err);
}

int jlm_hf_open(const char *dir, FILE *notes, jlm_gguf **out, jlm_err *err)
{
    return jlm_hf_open_at(-1, dir, notes, out, err);
}

int jlm_hf_open_mem(const char *config, size_t config_len, const void *st, size_t st_len, jlm_gguf **out, jlm_err *err)
{
    hf *h = calloc(1, sizeof *h);
    hf_json j = {.cfg_path = "config.json"};
    if (h)
        h->dir_fd = -1;
    if (!h || !(h->dir = jlm_hf_own(h, "<memory>"))) {
        hf_free(h);
        return jlm_errf(err, JLM_ENOMEM, "hf");
    }
    json_error_t je;
    j.cfg = json_loadb(config, config_len, JSON_REJECT_DUPLICATES, &je);
    int rc = j.cfg ? jlm_st_open_mem(st, st_len, "<memory>.safetensors", &h->st, err)
                   : jlm_errf(err, JLM_EFORMAT, "config.json: line %d: %s", je.line, je.text);
    if (rc) {
        json_free(&j);
        hf_free(h);
        return rc;
    }
    return build(h, &j, NULL, out, err);
}

int jlm_hf_open_tok_mem(const char *tok, size_t tok_len, jlm_gguf **out, jlm_err *err)
{
    hf *h = calloc(1, sizeof *h);
    hf_json j = {0};
    if (h)
        h->dir_fd = -1;
    if (!h || !(h->dir = jlm_hf_own(h, "<memory>"))) {
        hf_free(h);
        return jlm_errf(err, JLM_ENOMEM, "hf");
    }
    json_error_t je;
    j.tok = json_loadb(tok, tok_len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j.tok)) {
        json_free(&j);
        hf_free(h);
        return jlm_errf(err, JLM_EFORMAT, "tokenizer.json: line %d: %s", je.line, j.tok ? "not an object" : je.text);
    }
    return build(h, &j, NULL, out, err);
}
