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
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: architecture '%s' is not supported (supported: llama, qwen2, qwen3, qwen3moe, olmoe, gemma3, phi3, gpt-oss)",
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
    if (!jlm_gguf_find_tensor(g, "output.weight"))
        k.flags |= JLM_F_TIED_EMBD;
    int rc = jlm_fmt_config_check(&k, g->path, err);
    if (rc)
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
