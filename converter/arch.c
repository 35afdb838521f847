/* arch.c - llama.cpp metadata and tensor names -> typed config and roles.
 *
 * One table of architectures (GGUF name, code, flags) and one table of tensor
 * name suffixes (role, dense/paged is decided by format/). Fused tensors
 * (phi3 attn_qkv, phi3 gate|up in ffn_up) are split by rows here. Anything
 * not in the tables is refused by name: a tensor we do not know would be a
 * weight the engine silently ignores. */
#include "converter/convert_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct arch_def {
    const char *gguf;      /* general.architecture */
    uint16_t    code;
    uint32_t    flags;     /* fixed flags; TiedEmbd is added when output.weight is absent */
    uint32_t    swa_period_default;
} arch_def;

static const arch_def ARCHS[] = {
    {"llama",    JLM_ARCH_LLAMA,    0, 0},
    {"qwen2",    JLM_ARCH_QWEN2,    JLM_F_ROPE_NEOX, 0},
    {"qwen3",    JLM_ARCH_QWEN3,    JLM_F_ROPE_NEOX | JLM_F_QK_NORM, 0},
    {"qwen3moe", JLM_ARCH_QWEN3MOE, JLM_F_ROPE_NEOX | JLM_F_QK_NORM, 0},
    {"olmoe",    JLM_ARCH_OLMOE,    JLM_F_ROPE_NEOX | JLM_F_QK_NORM | JLM_F_QK_NORM_WIDE | JLM_F_NO_EXPERT_NORM, 0},
    {"gemma3",   JLM_ARCH_GEMMA3,   JLM_F_ROPE_NEOX | JLM_F_QK_NORM | JLM_F_GELU, 6},
    {"phi3",     JLM_ARCH_PHI3,     JLM_F_ROPE_NEOX, 0},
    {"gpt-oss",  JLM_ARCH_GPTOSS,   JLM_F_ROPE_NEOX | JLM_F_SWIGLU_OAI, 2},
    /* the closed code list has no glm4moe or llama4 (docs/format.md, "Families
     * without a code of their own"): glm4moe is deepseek2 without latent
     * attention (kv_lora_rank 0), llama4 is llama with tail 1 (moe_step) */
    {"deepseek2", JLM_ARCH_DEEPSEEK2, 0, 0},
    {"glm4moe",  JLM_ARCH_DEEPSEEK2, JLM_F_ROPE_NEOX, 0},
    {"llama4",   JLM_ARCH_LLAMA,    0, 0},
};


static const arch_def *jlm_conv_arch_lookup(const char *name)
{
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (!strcmp(ARCHS[i].gguf, name))
            return &ARCHS[i];
    return NULL;
}

/* "<arch>.<key>" lookups with a default. */
static uint32_t key_u32(const jlm_gguf *g, const char *arch, const char *key, uint32_t def)
{
    char k[160];
    uint32_t v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return jlm_gguf_get_u32(g, k, &v, NULL) == 0 ? v : def;
}

static float key_f32(const jlm_gguf *g, const char *arch, const char *key, float def)
{
    char k[160];
    float v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return jlm_gguf_get_f32(g, k, &v, NULL) == 0 ? v : def;
}

static int key_has(const jlm_gguf *g, const char *arch, const char *key)
{
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return jlm_gguf_find(g, k) != NULL;
}


/* The keys of the big MoE families (deepseek2, glm4moe, llama4): leading
 * dense blocks, shared experts, the router's gating function and groups,
 * latent attention (deepseek2), the NextN/MTP blocks (glm4moe: counted out
 * of n_layer; map_tensors skips their tensors) and llama4's interleave, no-RoPE
 * layers and attention temperature (docs/format.md). */
static int moe_family_config(const jlm_gguf *g, const char *A, jlm_config *k, jlm_err *err)
{
    int ds = !strcmp(A, "deepseek2"), glm = !strcmp(A, "glm4moe"), l4 = !strcmp(A, "llama4");
    if (!ds && !glm && !l4)
        return JLM_OK;
    k->n_dense_lead = key_u32(g, A, "leading_dense_block_count", 0);
    uint32_t n_shared = key_u32(g, A, "expert_shared_count", l4 ? 1 : 0);
    if (n_shared > JLM_MAX_EXPERTS)
        return jlm_errf(err, JLM_ERANGE, "%s: %s.expert_shared_count is %u, at most %u is accepted", g->path, A,
                        n_shared, JLM_MAX_EXPERTS);
    if (!k->n_ffn_shexp)
        k->n_ffn_shexp = n_shared * k->n_ffn_exp;
    uint32_t gating = key_u32(g, A, "expert_gating_func", l4 ? 2 : 1);
    if (gating != 1 && gating != 2)
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: %s.expert_gating_func %u (1 softmax and 2 sigmoid are supported)",
                        g->path, A, gating);
    if (gating == 2)
        k->flags |= JLM_F_EXPERT_SIGMOID;
    int norm = 0;   /* llama.cpp's default: false; llama4 never normalises its top-1 */
    char key[160];
    snprintf(key, sizeof key, "%s.expert_weights_norm", A);
    if (l4 || jlm_gguf_get_bool(g, key, &norm, NULL) || !norm)
        k->flags |= JLM_F_NO_EXPERT_NORM;
    k->n_expert_group = key_u32(g, A, "expert_group_count", 0);
    k->n_expert_group_used = key_u32(g, A, "expert_group_used_count", 0);
    if (ds) {
        if (!key_has(g, A, "attention.key_length_mla") || !key_has(g, A, "attention.value_length_mla"))
            return jlm_errf(err, JLM_EUNSUPPORTED, "%s: deepseek2 without attention.key_length_mla / value_length_mla "
                            "(a fused attn_kv_b) is not supported: convert it again with a current llama.cpp", g->path);
        k->q_lora_rank = key_u32(g, A, "attention.q_lora_rank", 0);
        k->kv_lora_rank = key_u32(g, A, "attention.kv_lora_rank", 0);
        if (!k->kv_lora_rank)
            return jlm_errf(err, JLM_EFORMAT, "%s: deepseek2: attention.kv_lora_rank is missing or 0", g->path);
        k->head_dim = key_u32(g, A, "attention.key_length_mla", 0);
        uint32_t hdv = key_u32(g, A, "attention.value_length_mla", 0);
        k->head_dim_v = hdv == k->head_dim ? 0 : hdv;
    }
    if (glm) {
        uint32_t nextn = key_u32(g, A, "nextn_predict_layers", 0);
        if (nextn >= k->n_layer)
            return jlm_errf(err, JLM_EFORMAT, "%s: glm4moe.nextn_predict_layers %u of %u blocks", g->path, nextn,
                            k->n_layer);
        k->n_layer -= nextn;
    }
    if (l4) {
        /* llama.cpp b10359 (llama-model.cpp, LLM_ARCH_LLAMA4): MoE every
         * interleave_moe_layer_step-th block; without a sliding_window key,
         * chunked attention of 8192 on three layers of four, the fourth with
         * no RoPE and full attention; temperature tuning 0.1, floor 8192;
         * weightless q/k norms unless there are 128 experts */
        k->moe_step = key_u32(g, A, "interleave_moe_layer_step", 1);
        if (!(key_has(g, A, "attention.sliding_window") && !key_u32(g, A, "attention.sliding_window", 0))) {
            k->swa_window = 8192;
            k->swa_period = 4;
            k->attn_temp_scale = 0.1f;
            k->attn_temp_floor = 8192;
            k->attn_temp_offset = 1.0f;
        }
        if (k->n_expert != 128)
            k->flags |= JLM_F_QK_NORM;
    }
    return JLM_OK;
}

int jlm_conv_config(const jlm_gguf *g, jlm_config *c, jlm_err *err)
{
    jlm_gguf_str an;
    jlm_config k = {0};
    int has_arch = jlm_gguf_get_str(g, "general.architecture", &an, NULL) == 0;
    if (g->n_tensors == 0) {
        /* vocab-only file (section 8): Arch 0, no layers, the sizes it states */
        const jlm_gguf_kv *tok = jlm_gguf_find(g, "tokenizer.ggml.tokens");
        k.n_vocab = tok ? (uint32_t)tok->n : 0;
        if (has_arch)
            k.n_ctx = key_u32(g, an.s, "context_length", 0);
        *c = k;
        return JLM_OK;
    }
    if (!has_arch)
        return jlm_errf(err, JLM_EFORMAT, "%s: no general.architecture key", g->path);
    const arch_def *a = jlm_conv_arch_lookup(an.s);
    if (!a && !strcmp(an.s, "clip"))   /* llama.cpp's mmproj files */
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: a vision projector (mmproj, architecture 'clip'), not a model: pass "
                        "it with --mmproj next to its text model (jlm convert TEXT.gguf --mmproj %s)", g->path, g->path);
    if (!a)
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: architecture '%s' is not supported (supported: llama, qwen2, qwen3, qwen3moe, olmoe, gemma3, phi3, gpt-oss, "
                        "deepseek2, glm4moe, llama4)",
                        g->path, an.s);
    const char *A = a->gguf;
    k.arch = a->code;
    k.flags = a->flags;
    k.n_layer = key_u32(g, A, "block_count", 0);
    k.n_embd = key_u32(g, A, "embedding_length", 0);
    k.n_head = key_u32(g, A, "attention.head_count", 0);
    k.n_kv_head = key_u32(g, A, "attention.head_count_kv", k.n_head);
    if (!k.n_layer || !k.n_embd || !k.n_head)
        return jlm_errf(err, JLM_EFORMAT, "%s: %s.block_count / embedding_length / attention.head_count missing or 0",
                        g->path, A);
    k.head_dim = key_u32(g, A, "attention.key_length", k.n_embd / k.n_head);
    uint32_t hdv = key_u32(g, A, "attention.value_length", k.head_dim);
    k.head_dim_v = hdv == k.head_dim ? 0 : hdv;
    k.n_rot = key_u32(g, A, "rope.dimension_count", k.head_dim);
    k.n_ffn = key_u32(g, A, "feed_forward_length", 0);
    k.n_ctx = key_u32(g, A, "context_length", 0);
    k.n_expert = key_u32(g, A, "expert_count", 0);
    k.n_expert_used = key_u32(g, A, "expert_used_count", 0);
    k.n_ffn_exp = k.n_expert ? key_u32(g, A, "expert_feed_forward_length", k.n_ffn) : 0;
    k.n_ffn_shexp = key_u32(g, A, "expert_shared_feed_forward_length", 0);
    k.rms_eps = key_f32(g, A, "attention.layer_norm_rms_epsilon", key_f32(g, A, "attention.layer_norm_epsilon", 1e-5f));
    k.rope_base = key_f32(g, A, "rope.freq_base", 10000.0f);
    k.rope_base_swa = key_f32(g, A, "rope.freq_base_swa", k.rope_base);
    /* vocab size: the key, else the token list's length */
    const jlm_gguf_kv *tok = jlm_gguf_find(g, "tokenizer.ggml.tokens");
    k.n_vocab = key_u32(g, A, "vocab_size", tok ? (uint32_t)tok->n : 0);
    /* Sliding window: phi3 has the key but llama.cpp b10359 disables Phi SWA. */
    if (a->code != JLM_ARCH_PHI3 && key_has(g, A, "attention.sliding_window")) {
        k.swa_window = key_u32(g, A, "attention.sliding_window", 0);
        k.swa_period = key_u32(g, A, "attention.sliding_window_pattern", a->swa_period_default);
    }
    if (a->code == JLM_ARCH_GEMMA3) {
        k.embd_scale = sqrtf((float)k.n_embd);
        if (k.swa_window == 0) { k.swa_window = 0; k.swa_period = 0; }
    }
    /* RoPE scaling */
    jlm_gguf_str st;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", A);
    if (jlm_gguf_get_str(g, key, &st, NULL) == 0) {
        float f = key_f32(g, A, "rope.scaling.factor", 1.0f);
        if (!strcmp(st.s, "yarn")) {
            k.yarn_factor = f;
            k.yarn_orig_ctx = key_u32(g, A, "rope.scaling.original_context_length", k.n_ctx);
            k.yarn_beta_fast = key_f32(g, A, "rope.scaling.yarn_beta_fast", 32.0f);
            k.yarn_beta_slow = key_f32(g, A, "rope.scaling.yarn_beta_slow", 1.0f);
            k.yarn_log_mul = key_f32(g, A, "rope.scaling.yarn_log_multiplier", 0.0f);
        } else if (!strcmp(st.s, "linear")) {
            k.rope_linear = f;
        } else if (strcmp(st.s, "none")) {
            return jlm_errf(err, JLM_EUNSUPPORTED, "%s: rope scaling type '%s' is not supported", g->path, st.s);
        }
    }
    k.attn_softcap = key_f32(g, A, "attn_logit_softcapping", 0.0f);
    k.final_softcap = key_f32(g, A, "final_logit_softcapping", 0.0f);
    k.expert_scale = key_f32(g, A, "expert_weights_scale", 0.0f);
    int rc = moe_family_config(g, A, &k, err);
    if (rc)
        return rc;
    if (!jlm_gguf_find_tensor(g, "output.weight"))
        k.flags |= JLM_F_TIED_EMBD;
    if ((rc = jlm_fmt_config_check(&k, g->path, err)))
        return rc;
    *c = k;
    return JLM_OK;
}

/* ---------------------------------------------------------------- tensor names */
typedef struct name_def { const char *suffix; uint16_t role; } name_def;

/* "blk.N.<suffix>" -> role. */
static const name_def BLOCK_NAMES[] = {
    {"attn_norm.weight", JLM_R_ATTN_NORM}, {"attn_q.weight", JLM_R_ATTN_Q},
    {"attn_k.weight", JLM_R_ATTN_K}, {"attn_v.weight", JLM_R_ATTN_V},
    {"attn_output.weight", JLM_R_ATTN_OUT}, {"attn_q.bias", JLM_R_ATTN_Q_B},
    {"attn_k.bias", JLM_R_ATTN_K_B}, {"attn_v.bias", JLM_R_ATTN_V_B},
    {"attn_output.bias", JLM_R_ATTN_OUT_B}, {"attn_q_norm.weight", JLM_R_ATTN_Q_NORM},
    {"attn_k_norm.weight", JLM_R_ATTN_K_NORM}, {"post_attention_norm.weight", JLM_R_POST_ATTN_NORM},
    {"attn_sinks.weight", JLM_R_ATTN_SINKS}, {"attn_sinks", JLM_R_ATTN_SINKS},
    {"ffn_norm.weight", JLM_R_FFN_NORM}, {"ffn_gate.weight", JLM_R_FFN_GATE},
    {"ffn_up.weight", JLM_R_FFN_UP}, {"ffn_down.weight", JLM_R_FFN_DOWN},
    {"post_ffw_norm.weight", JLM_R_POST_FFW_NORM},
    {"ffn_gate_inp.bias", JLM_R_ROUTER_B}, {"ffn_gate_exps.bias", JLM_R_EXP_GATE_B},
    {"ffn_up_exps.bias", JLM_R_EXP_UP_B}, {"ffn_down_exps.bias", JLM_R_EXP_DOWN_B},
    {"ffn_gate_inp.weight", JLM_R_ROUTER}, {"ffn_gate_exps.weight", JLM_R_EXP_GATE},
    {"ffn_up_exps.weight", JLM_R_EXP_UP}, {"ffn_down_exps.weight", JLM_R_EXP_DOWN},
    {"ffn_gate_inp_shexp.weight", JLM_R_SHEXP_GATE_INP}, {"ffn_gate_shexp.weight", JLM_R_SHEXP_GATE},
    {"ffn_up_shexp.weight", JLM_R_SHEXP_UP}, {"ffn_down_shexp.weight", JLM_R_SHEXP_DOWN},
    {"rope_factors_long.weight", JLM_R_ROPE_LONG}, {"rope_factors_short.weight", JLM_R_ROPE_SHORT},
    {"exp_probs_b.bias", JLM_R_EXP_PROBS_B},
    {"attn_q_a.weight", JLM_R_ATTN_Q_A}, {"attn_q_a_norm.weight", JLM_R_ATTN_Q_A_NORM},
    {"attn_q_b.weight", JLM_R_ATTN_Q_B_MAT}, {"attn_kv_a_mqa.weight", JLM_R_ATTN_KV_A_MQA},
    {"attn_kv_a_norm.weight", JLM_R_ATTN_KV_A_NORM}, {"attn_k_b.weight", JLM_R_ATTN_K_B_MAT},
    {"attn_v_b.weight", JLM_R_ATTN_V_B_MAT},
};
static const name_def GLOBAL_NAMES[] = {
    {"token_embd.weight", JLM_R_TOKEN_EMBD}, {"output.weight", JLM_R_OUTPUT},
    {"output_norm.weight", JLM_R_OUTPUT_NORM}, {"rope_freqs.weight", JLM_R_ROPE_FREQS},
    {"rope_factors_long.weight", JLM_R_ROPE_LONG}, {"rope_factors_short.weight", JLM_R_ROPE_SHORT},
};

/* Parses a GGUF tensor name. Returns the role (0 if unknown), *block (-1 for a
 * global) and *fused: 1 attn_qkv (weight), 2 attn_qkv bias, 3 phi3 gate|up. */

int jlm_conv_role(const char *name, int32_t *block, int *fused)
{
    *fused = 0;
    *block = -1;
    if (!strncmp(name, "blk.", 4)) {
        char *end;
        long b = strtol(name + 4, &end, 10);
        if (end == name + 4 || *end != '.' || b < 0 || b > 1000000)
            return 0;
        *block = (int32_t)b;
        const char *suf = end + 1;
        if (!strcmp(suf, "attn_qkv.weight")) { *fused = 1; return JLM_R_ATTN_Q; }
        if (!strcmp(suf, "attn_qkv.bias"))   { *fused = 2; return JLM_R_ATTN_Q_B; }
        for (size_t i = 0; i < sizeof BLOCK_NAMES / sizeof BLOCK_NAMES[0]; i++)
            if (!strcmp(suf, BLOCK_NAMES[i].suffix))
                return BLOCK_NAMES[i].role;
        return 0;
    }
    for (size_t i = 0; i < sizeof GLOBAL_NAMES / sizeof GLOBAL_NAMES[0]; i++)
        if (!strcmp(name, GLOBAL_NAMES[i].suffix))
            return GLOBAL_NAMES[i].role;
    return 0;
}
