/* types.c - type traits, plane-length arithmetic (jlm-format.md 7.4) and the
 * name tables for arch and role codes. Pure functions, no I/O. */
#include "format/jlm_format.h"

#include <stddef.h>

/* ---------------------------------------------------------------- type traits (7.1) */
static const jlm_type_traits TRAITS[JLM_T_COUNT] = {
    /*              name     float eb  sub p0 p1  w  super S  sc */
    [JLM_T_F32]   = {"F32",   1, 4,   1, 0, 0, 0,  1, 1, 0},
    [JLM_T_F16]   = {"F16",   1, 2,   1, 0, 0, 0,  1, 1, 0},
    [JLM_T_BF16]  = {"BF16",  1, 2,   1, 0, 0, 0,  1, 1, 0},
    [JLM_T_Q4_0]  = {"Q4_0",  0, 0,  32, 4, 0, 4,  1, 2, 0},
    [JLM_T_Q8_0]  = {"Q8_0",  0, 0,  32, 8, 0, 8,  1, 2, 0},
    [JLM_T_Q5_0]  = {"Q5_0",  0, 0,  32, 4, 1, 5,  1, 2, 0},
    [JLM_T_Q5_1]  = {"Q5_1",  0, 0,  32, 4, 1, 5,  1, 1, 0},
    [JLM_T_MXFP4] = {"MXFP4", 0, 0,  32, 4, 0, 4,  1, 4, 0},
    [JLM_T_Q3_K]  = {"Q3_K",  0, 0,  16, 4, 0, 2, 16, 1, 1},
    [JLM_T_Q4_K]  = {"Q4_K",  0, 0,  32, 4, 0, 4,  8, 1, 2},
    [JLM_T_Q5_K]  = {"Q5_K",  0, 0,  32, 4, 1, 5,  8, 1, 2},
    [JLM_T_Q6_K]  = {"Q6_K",  0, 0,  16, 4, 2, 3, 16, 1, 1},
};

const jlm_type_traits *jlm_fmt_type_traits(uint8_t type)
{
    if (type == JLM_T_NONE || type >= JLM_T_COUNT)
        return NULL;
    return &TRAITS[type];
}

/* a*b with overflow detection; returns 0 on overflow */
static int mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

int jlm_fmt_planes(uint8_t type, uint64_t k, uint64_t rows,
                   uint64_t *qs_len, uint64_t *d_len, uint64_t *sc_len, jlm_err *err)
{
    const jlm_type_traits *t = jlm_fmt_type_traits(type);
    if (!t)
        return jlm_errf(err, JLM_EFORMAT, "unknown type code %u", type);
    if (k == 0 || rows == 0)
        return jlm_errf(err, JLM_EFORMAT, "%s matrix with a zero dimension (k %llu, rows %llu)",
                        t->name, (unsigned long long)k, (unsigned long long)rows);
    uint64_t q = 0, d = 0, s = 0;
    if (t->is_float) {
        if (!mul_ok(k, rows, &q) || !mul_ok(q, t->elem_bytes, &q))
            return jlm_errf(err, JLM_EFORMAT, "%s matrix %llu x %llu overflows", t->name,
                            (unsigned long long)k, (unsigned long long)rows);
    } else {
        uint64_t super = (uint64_t)t->sub * t->super_sub;
        if (k % super)
            return jlm_errf(err, JLM_EFORMAT, "%s row length %llu is not a multiple of %llu",
                            t->name, (unsigned long long)k, (unsigned long long)super);
        uint64_t nsub = k / t->sub, nsuper = k / super;
        uint64_t drows = t->d_share > 1 ? (rows + t->d_share - 1) / t->d_share : rows;
        if (!mul_ok(rows, nsub, &q) || !mul_ok(q, (uint64_t)t->w * 4, &q) ||
            !mul_ok(nsuper, drows, &d) || !mul_ok(d, 4, &d))
            return jlm_errf(err, JLM_EFORMAT, "%s matrix %llu x %llu overflows", t->name,
                            (unsigned long long)k, (unsigned long long)rows);
        if (t->sc_kind == 2 && (!mul_ok(rows, nsuper * 3, &s) || !mul_ok(s, 4, &s)))
            return jlm_errf(err, JLM_EFORMAT, "%s sc plane overflows", t->name);
        if (t->sc_kind == 1 && (!mul_ok(rows, (k / 16 + 3) / 4, &s) || !mul_ok(s, 4, &s)))
            return jlm_errf(err, JLM_EFORMAT, "%s sc plane overflows", t->name);
    }
    *qs_len = q;
    *d_len = d;
    *sc_len = s;
    return JLM_OK;
}

int jlm_fmt_tensor_planes(const jlm_tensor *t, jlm_tensor_planes *out, jlm_err *err)
{
    if (t->ndim < 1 || t->ndim > 4)
        return jlm_errf(err, JLM_EFORMAT, "tensor '%s': ndim %u not in [1, 4]", t->name.s ? t->name.s : "", t->ndim);
    uint64_t q, d, s, sheets = 1;
    for (int i = 2; i < t->ndim; i++)
        if (t->dims[i] == 0 || !mul_ok(sheets, t->dims[i], &sheets))
            return jlm_errf(err, JLM_EFORMAT, "tensor '%s': dims overflow", t->name.s ? t->name.s : "");
    int rc = jlm_fmt_planes(t->type, jlm_tensor_k(t), jlm_tensor_rows(t), &q, &d, &s, err);
    if (rc)
        return jlm_err_prefix(err, rc, "tensor '%s'", t->name.s ? t->name.s : "");
    jlm_tensor_planes p = {.sheet_qs = q, .sheet_d = d, .sheet_sc = s};
    if (jlm_fmt_role_is_bank(t->role)) {
        p.qs_len = q; p.d_len = d; p.sc_len = s;    /* one sheet per expert page */
    } else if (!mul_ok(q, sheets, &p.qs_len) || !mul_ok(d, sheets, &p.d_len) ||
               !mul_ok(s, sheets, &p.sc_len)) {
        return jlm_errf(err, JLM_EFORMAT, "tensor '%s': size overflows", t->name.s ? t->name.s : "");
    }
    *out = p;
    return JLM_OK;
}

/* ---------------------------------------------------------------- names */
const char *jlm_fmt_arch_name(uint16_t arch)
{
    switch (arch) {
    case JLM_ARCH_NONE:      return "none";
    case JLM_ARCH_LLAMA:     return "llama";
    case JLM_ARCH_QWEN2:     return "qwen2";
    case JLM_ARCH_QWEN3:     return "qwen3";
    case JLM_ARCH_QWEN3MOE:  return "qwen3moe";
    case JLM_ARCH_OLMOE:     return "olmoe";
    case JLM_ARCH_GEMMA:     return "gemma";
    case JLM_ARCH_PHI3:      return "phi3";
    case JLM_ARCH_CLIP:      return "clip";
    case JLM_ARCH_QWEN2VL:   return "qwen2vl";
    case JLM_ARCH_GEMMA2:    return "gemma2";
    case JLM_ARCH_GEMMA3:    return "gemma3";
    case JLM_ARCH_GPTOSS:    return "gpt-oss";
    case JLM_ARCH_DEEPSEEK2: return "deepseek2";
    case JLM_ARCH_QWEN2MOE:  return "qwen2moe";
    default:                 return NULL;
    }
}

/* Vision roles 64..93 by their mmproj (GGUF) names without the block prefix. */
static const char *const vision_role_names[] = {
    "v.patch_embd", "v.patch_embd.bias", "v.position_embd", "v.pre_ln", "v.pre_ln.bias",
    "v.post_ln", "v.post_ln.bias", "ln1", "ln1.bias", "attn_q", "attn_q.bias", "attn_k",
    "attn_k.bias", "attn_v", "attn_v.bias", "attn_out", "attn_out.bias", "ln2", "ln2.bias",
    "ffn_up", "ffn_up.bias", "ffn_down", "ffn_down.bias", "ffn_gate", "ffn_gate.bias",
    "mm.input_projection", "mm.soft_emb_norm",
};

const char *jlm_fmt_vision_role_name(uint16_t role)
{
    size_t n = sizeof vision_role_names / sizeof vision_role_names[0];
    return role >= JLM_R_VISION_FIRST && (size_t)(role - JLM_R_VISION_FIRST) < n ? vision_role_names[role - JLM_R_VISION_FIRST]
                                                                       : NULL;
}

const char *jlm_fmt_role_name(uint16_t role)
{
    switch (role) {
    case JLM_R_TOKEN_EMBD:     return "token_embd";
    case JLM_R_OUTPUT:         return "output";
    case JLM_R_OUTPUT_NORM:    return "output_norm";
    case JLM_R_ATTN_NORM:      return "attn_norm";
    case JLM_R_ATTN_Q:         return "attn_q";
    case JLM_R_ATTN_K:         return "attn_k";
    case JLM_R_ATTN_V:         return "attn_v";
    case JLM_R_ATTN_OUT:       return "attn_output";
    case JLM_R_ATTN_Q_B:       return "attn_q.bias";
    case JLM_R_ATTN_K_B:       return "attn_k.bias";
    case JLM_R_ATTN_V_B:       return "attn_v.bias";
    case JLM_R_ATTN_OUT_B:     return "attn_output.bias";
    case JLM_R_ATTN_Q_NORM:    return "attn_q_norm";
    case JLM_R_ATTN_K_NORM:    return "attn_k_norm";
    case JLM_R_POST_ATTN_NORM: return "post_attention_norm";
    case JLM_R_ATTN_SINKS:     return "attn_sinks";
    case JLM_R_FFN_NORM:       return "ffn_norm";
    case JLM_R_FFN_GATE:       return "ffn_gate";
    case JLM_R_FFN_UP:         return "ffn_up";
    case JLM_R_FFN_DOWN:       return "ffn_down";
    case JLM_R_POST_FFW_NORM:  return "post_ffw_norm";
    case JLM_R_ATTN_Q_A:       return "attn_q_a";
    case JLM_R_ATTN_Q_A_NORM:  return "attn_q_a_norm";
    case JLM_R_ATTN_Q_B_MAT:   return "attn_q_b";
    case JLM_R_ATTN_KV_A_MQA:  return "attn_kv_a_mqa";
    case JLM_R_ATTN_KV_A_NORM: return "attn_kv_a_norm";
    case JLM_R_ATTN_K_B_MAT:   return "attn_k_b";
    case JLM_R_ATTN_V_B_MAT:   return "attn_v_b";
    case JLM_R_EXP_PROBS_B:    return "exp_probs_b";
    case JLM_R_ROUTER_B:       return "ffn_gate_inp.bias";
    case JLM_R_EXP_GATE_B:     return "ffn_gate_exps.bias";
    case JLM_R_EXP_UP_B:       return "ffn_up_exps.bias";
    case JLM_R_EXP_DOWN_B:     return "ffn_down_exps.bias";
    case JLM_R_ROUTER:         return "ffn_gate_inp";
    case JLM_R_EXP_GATE:       return "ffn_gate_exps";
    case JLM_R_EXP_UP:         return "ffn_up_exps";
    case JLM_R_EXP_DOWN:       return "ffn_down_exps";
    case JLM_R_EXP1_GATE:      return "ffn_gate.expert";
    case JLM_R_EXP1_UP:        return "ffn_up.expert";
    case JLM_R_EXP1_DOWN:      return "ffn_down.expert";
    case JLM_R_SHEXP_GATE_INP: return "ffn_gate_inp_shexp";
    case JLM_R_SHEXP_GATE:     return "ffn_gate_shexp";
    case JLM_R_SHEXP_UP:       return "ffn_up_shexp";
    case JLM_R_SHEXP_DOWN:     return "ffn_down_shexp";
    case JLM_R_ROPE_LONG:      return "rope_factors_long";
    case JLM_R_ROPE_SHORT:     return "rope_factors_short";
    case JLM_R_ROPE_FREQS:     return "rope_freqs";
    default:                   return jlm_fmt_vision_role_name(role);
    }
}

int jlm_fmt_role_is_dense(uint16_t role)
{
    switch (role) {
    case JLM_R_OUTPUT_NORM: case JLM_R_ATTN_NORM: case JLM_R_ATTN_Q_NORM: case JLM_R_ATTN_K_NORM:
    case JLM_R_POST_ATTN_NORM: case JLM_R_FFN_NORM: case JLM_R_POST_FFW_NORM:
    case JLM_R_ATTN_Q_A_NORM: case JLM_R_ATTN_KV_A_NORM: case JLM_R_EXP_PROBS_B:
    case JLM_R_ATTN_Q_B: case JLM_R_ATTN_K_B: case JLM_R_ATTN_V_B: case JLM_R_ATTN_OUT_B:
    case JLM_R_ATTN_SINKS: case JLM_R_ROUTER_B:
    case JLM_R_EXP_GATE_B: case JLM_R_EXP_UP_B: case JLM_R_EXP_DOWN_B:
    case JLM_R_SHEXP_GATE_INP:
    case JLM_R_ROPE_LONG: case JLM_R_ROPE_SHORT: case JLM_R_ROPE_FREQS:
    case JLM_R_V_PRE_LN: case JLM_R_V_PRE_LN_B: case JLM_R_V_POST_LN: case JLM_R_V_POST_LN_B:
    case JLM_R_V_LN1: case JLM_R_V_LN1_B: case JLM_R_V_LN2: case JLM_R_V_LN2_B:
    case JLM_R_V_ATTN_Q_B: case JLM_R_V_ATTN_K_B: case JLM_R_V_ATTN_V_B: case JLM_R_V_ATTN_OUT_B:
    case JLM_R_V_FFN_UP_B: case JLM_R_V_FFN_DOWN_B: case JLM_R_V_FFN_GATE_B:
        return 1;
    default:
        return 0;
    }
}

int jlm_fmt_role_is_bank(uint16_t role)
{
    return role == JLM_R_EXP_GATE || role == JLM_R_EXP_UP || role == JLM_R_EXP_DOWN;
}
