/* quantize.c - ggml's reference quantizers and llama-quantize's per-tensor
 * choices (see quantize.h). Expressions follow ggml-quants.c's order and
 * operand types (-std=c11: no FMA contraction), so results equal bit for bit. */
#include "converter/quantize.h"
#include "converter/gguf.h"

#include <float.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <strings.h>

static const struct { const char *name; uint32_t type; } TYPES[] = {
    {"keep", 0}, {"Q8_0", GGML_Q8_0}, {"Q4_0", GGML_Q4_0}, {"Q4_1", GGML_Q4_1}, {"Q5_0", GGML_Q5_0},
    {"Q5_1", GGML_Q5_1}, {"Q6_K", GGML_Q6_K},
    {"Q4_K_M", GGML_Q4_K | JLM_QUANT_MIX_M}, {"Q5_K_M", GGML_Q5_K | JLM_QUANT_MIX_M},
};

/* Any case (q4_k_m, as ollama's tags write it). */
int jlm_quant_parse(const char *name, uint32_t *ggml_type, jlm_err *err)
{
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcasecmp(name, TYPES[i].name)) {
            *ggml_type = TYPES[i].type;
            return 0;
        }
    return jlm_errf(err, JLM_EUNSUPPORTED, "--type %s is not supported (keep, Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q5_1, Q5_0, Q4_1, Q4_0)",
                    name);
}

/* llama-quantize's use_more_bits: the first and last eighth of the layers and every third between. */
static int more_bits(int32_t i, int32_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int32_t block_of(const char *name)
{
    return strncmp(name, "blk.", 4) ? -1 : atoi(name + 4);
}

/* llama_tensor_get_type (b10359) for the mixes done here, without an
 * importance matrix: output -> Q6_K; _M: attn_v and ffn_down of the
 * more_bits layers -> Q6_K, attn_qkv one step up; 8 experts: attn_v, attn_k -> Q8_0. */
static uint32_t mix_type(uint32_t target, const char *name, uint32_t n_layer, uint32_t n_expert)
{
    uint32_t base = target & ~JLM_QUANT_MIX_M;
    int mix_m = (target & JLM_QUANT_MIX_M) != 0;
    int legacy = base == GGML_Q4_0 || base == GGML_Q4_1 || base == GGML_Q5_0 || base == GGML_Q5_1;
    int kq = base == GGML_Q4_K || base == GGML_Q5_K;
    if (!strcmp(name, "output.weight"))
        return legacy || kq ? GGML_Q6_K : base;
    if (!kq)
        return base;
    if (n_expert == 8 && (strstr(name, "attn_v.weight") || strstr(name, "attn_k.weight")))
        return GGML_Q8_0;
    if (mix_m && (strstr(name, "attn_v.weight") || strstr(name, "ffn_down")) &&
        more_bits(block_of(name), (int32_t)n_layer))
        return GGML_Q6_K;
    if (mix_m && strstr(name, "attn_qkv.weight"))
        return base == GGML_Q4_K ? GGML_Q5_K : GGML_Q6_K;
    return base;
}

/* convert_incompatible_tensor: a K type on rows that are not whole super-blocks. */
static uint32_t fallback(uint32_t t)
{
    return t == GGML_Q4_K ? GGML_Q5_0 : t == GGML_Q5_K ? GGML_Q5_1 : t == GGML_Q6_K ? GGML_Q8_0 : t;
}

uint32_t jlm_quant_choice(uint32_t target, const char *name, uint32_t n_dims, uint64_t row_len, uint32_t src_type,
                          uint32_t n_layer, uint32_t n_expert)
{
    int is_float = src_type == GGML_F32 || src_type == GGML_F16 || src_type == GGML_BF16;
    size_t n = strlen(name);
    int is_weight = n > 7 && !strcmp(name + n - 7, ".weight");
    if (!target || !is_float || n_dims < 2 || !is_weight || strstr(name, "ffn_gate_inp.weight"))
        return src_type;
    uint32_t t = mix_type(target, name, n_layer, n_expert);
    if (row_len % jlm_ggml_block_elems(t))
        t = fallback(t);
    return row_len % jlm_ggml_block_elems(t) ? src_type : t;
}

/* quantize_row_q8_0_ref */
static void q8_0(const float *x, uint8_t *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[i * 32 + j];
            amax = amax > fabsf(v) ? amax : fabsf(v);
        }
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        uint16_t h = jlm_f32_to_f16(d);
        y[0] = (uint8_t)h;
        y[1] = (uint8_t)(h >> 8);
        for (int j = 0; j < 32; j++) {
            const float x0 = x[i * 32 + j] * id;
            y[2 + j] = (uint8_t)(int8_t)roundf(x0);
        }
    }
}

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = jlm_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* The value a stored f16 field reads back as. */
static float f16_round(float f) { return jlm_f16_to_f32(jlm_f32_to_f16(f)); }

/* quantize_row_q4_0_ref / q5_0: d = (the signed value of largest magnitude) / -2^(bits-1). */
static void q_sym(const float *x, uint8_t *y, uint64_t nb, int bits)
{
    const int half = 1 << (bits - 1), top = (1 << bits) - 1;
    const size_t bs = bits == 4 ? 18 : 22;
    for (uint64_t i = 0; i < nb; i++, y += bs, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        const float d = max / -half;
        const float id = d ? 1.0f / d : 0.0f;
        put_f16(y, d);
        uint8_t *qs = y + (bits == 4 ? 2 : 6);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const float x0 = x[j] * id, x1 = x[16 + j] * id;
            int a = (int8_t)(x0 + (half + 0.5f)), b = (int8_t)(x1 + (half + 0.5f));
            const uint8_t xi0 = (uint8_t)(a < top ? a : top), xi1 = (uint8_t)(b < top ? b : top);
            qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << j;
            qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
        }
        if (bits == 5)
            memcpy(y + 2, &qh, 4);   /* little-endian host (pack.c asserts it) */
    }
}

/* quantize_row_q4_1_ref / q5_1: d = (max - min) / (2^bits - 1), m = min. */
static void q_affine(const float *x, uint8_t *y, uint64_t nb, int bits)
{
    const size_t bs = bits == 4 ? 20 : 24;
    for (uint64_t i = 0; i < nb; i++, y += bs, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << bits) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        put_f16(y, d);
        put_f16(y + 2, min);
        uint8_t *qs = y + (bits == 4 ? 4 : 8);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            uint8_t xi0, xi1;
            if (bits == 4) {
                int a = (int8_t)(x0 + 0.5f), b = (int8_t)(x1 + 0.5f);
                xi0 = (uint8_t)(a < 15 ? a : 15);
                xi1 = (uint8_t)(b < 15 ? b : 15);
            } else {
                xi0 = (uint8_t)(x0 + 0.5f);
                xi1 = (uint8_t)(x1 + 0.5f);
            }
            qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << j;
            qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
        }
        if (bits == 5)
            memcpy(y + 4, &qh, 4);
    }
}

/* ggml's nearest_int (round to nearest by the 1.5 * 2^23 trick). Its
 * argument stays within +-4194303 (ggml's assertion) for finite input: every
 * caller scales a value by the inverse of its block's own scale. */
static inline int nearest_int(float fval)
{
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* make_qx_quants with rmse_type 1 (weights x^2) and no importance matrix. */
static float qx_quants(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i)
                L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* quantize_row_q6_K_ref: block = ql[128] qh[64] scales[16] d(f16). */
static void q6_k(const float *x, uint8_t *y, uint64_t nb)
{
    int8_t L[256];
    float scales[16];
    for (uint64_t i = 0; i < nb; i++, y += 210, x += 256) {
        float max_scale = 0, max_abs = 0;
        for (int ib = 0; ib < 16; ++ib) {
            scales[ib] = qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs) {
                max_abs = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        memset(y, 0, 210);
        if (max_abs < 1e-15f)
            continue;
        int8_t *sc = (int8_t *)(y + 192);
        float iscale = -128.f / max_scale;
        put_f16(y + 208, 1 / iscale);
        for (int ib = 0; ib < 16; ++ib) {
            int v = nearest_int(iscale * scales[ib]);
            sc[ib] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; ++j) {
            float d = f16_round(1 / iscale) * sc[j];
            if (!d)
                continue;
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] = (int8_t)(clampi(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        uint8_t *ql = y, *qh = y + 128;
        for (int j = 0; j < 256; j += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
    }
}

/* make_qkx2_quants: an affine fit (scale, -min) of n values to 0..nmax, searched over nstep+1 scales. */
static float qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                         uint8_t *Laux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* quantize_row_q4_K_ref (bits 4) / q5_K_ref (bits 5): 8 sub-blocks of 32 with
 * 6-bit scales and mins. Block: d dmin scales[12] [qh[32]] qs[128]. */
static void q_k(const float *x, uint8_t *y, uint64_t nb, int bits)
{
    const int nmax = (1 << bits) - 1;
    const size_t bs = bits == 4 ? 144 : 176;
    uint8_t L[256], Laux[32];
    float weights[32], mins[8], scales[8];
    for (uint64_t i = 0; i < nb; i++, y += bs, x += 256) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; ++j) {
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
            float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
            scales[j] = bits == 4 ? qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20)
                                  : qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.5f, 0.1f, 15);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
        uint8_t *sc = y + 4;
        memset(sc, 0, 12);
        for (int j = 0; j < 8; ++j) {
            uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]), lm = (uint8_t)nearest_int(inv_min * mins[j]);
            ls = ls < 63 ? ls : 63;
            lm = lm < 63 ? lm : 63;
            if (j < 4) {
                sc[j] = ls;
                sc[j + 4] = lm;
            } else {
                sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
                sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
                sc[j - 0] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        put_f16(y, max_scale / 63.f);
        put_f16(y + 2, max_min / 63.f);
        for (int j = 0; j < 8; ++j) {
            uint8_t s, m;
            scale_min_k4(j, sc, &s, &m);
            const float d = f16_round(max_scale / 63.f) * s;
            if (!d)
                continue;
            const float dm = f16_round(max_min / 63.f) * m;
            for (int ii = 0; ii < 32; ++ii)
                L[32 * j + ii] = (uint8_t)clampi(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
        }
        if (bits == 4) {
            uint8_t *q = y + 16;
            for (int j = 0; j < 256; j += 64, q += 32)
                for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            continue;
        }
        uint8_t *qh = y + 16, *ql = y + 48, m1 = 1, m2 = 2;
        memset(qh, 0, 32);
        for (int n = 0; n < 256; n += 64, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

int jlm_quant_row(uint32_t type, const float *src, void *dst, uint64_t k, jlm_err *err)
{
    uint32_t be = jlm_ggml_block_elems(type);
    if (!be || k % be)
        return jlm_errf(err, JLM_EUNSUPPORTED, "quantize: type %u, row of %llu", type, (unsigned long long)k);
    uint64_t nb = k / be;
    switch (type) {
    case GGML_Q8_0: q8_0(src, dst, nb); return 0;
    case GGML_Q4_0: q_sym(src, dst, nb, 4); return 0;
    case GGML_Q5_0: q_sym(src, dst, nb, 5); return 0;
    case GGML_Q4_1: q_affine(src, dst, nb, 4); return 0;
    case GGML_Q5_1: q_affine(src, dst, nb, 5); return 0;
    case GGML_Q6_K: q6_k(src, dst, nb); return 0;
    case GGML_Q4_K: q_k(src, dst, nb, 4); return 0;
    case GGML_Q5_K: q_k(src, dst, nb, 5); return 0;
    }
    return jlm_errf(err, JLM_EUNSUPPORTED, "quantize: no quantizer for ggml type %u", type);
}
