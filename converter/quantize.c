/* quantize.c - ggml's reference quantizers and llama-quantize's per-tensor
 * choices (see quantize.h). Expressions follow ggml-quants.c's order and
 * operand types (-std=c11: no FMA contraction), so results equal bit for bit. */
#include "quantize.h"
#include "gguf.h"

#include <float.h>
#include <math.h>
#include <string.h>

static const struct { const char *name; uint32_t type; } TYPES[] = {
    {"keep", 0}, {"Q8_0", GGML_Q8_0}, {"Q4_0", GGML_Q4_0}, {"Q4_1", GGML_Q4_1}, {"Q5_0", GGML_Q5_0},
    {"Q5_1", GGML_Q5_1}, {"Q6_K", GGML_Q6_K},
};

int jlm_quant_parse(const char *name, uint32_t *ggml_type, jlm_err *err)
{
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcmp(name, TYPES[i].name)) {
            *ggml_type = TYPES[i].type;
            return 0;
        }
    return jlm_errf(err, JLM_EUNSUPPORTED, "--type %s is not supported (keep, Q8_0, Q6_K, Q5_1, Q5_0, Q4_1, Q4_0)",
                    name);
}

uint32_t jlm_quant_choice(uint32_t target, const char *name, uint32_t n_dims, uint64_t row_len, uint32_t src_type)
{
    int is_float = src_type == GGML_F32 || src_type == GGML_F16 || src_type == GGML_BF16;
    size_t n = strlen(name);
    int is_weight = n > 7 && !strcmp(name + n - 7, ".weight");
    if (!target || !is_float || n_dims < 2 || !is_weight || strstr(name, "ffn_gate_inp.weight") ||
        row_len % jlm_ggml_block_elems(target))
        return src_type;
    /* llama-quantize: output.weight gets Q6_K under the 4/5-bit legacy types
     * (Q8_0 and Q6_K keep their own type), when its rows allow it. */
    int legacy = target == GGML_Q4_0 || target == GGML_Q4_1 || target == GGML_Q5_0 || target == GGML_Q5_1;
    if (legacy && !strcmp(name, "output.weight") && row_len % 256 == 0)
        return GGML_Q6_K;
    return target;
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
    }
    return jlm_errf(err, JLM_EUNSUPPORTED, "quantize: no quantizer for ggml type %u", type);
}
