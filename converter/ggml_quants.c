/* ggml_quants.c - ggml block traits and the reference dequantization of ggml
 * block types to f32 (gguf.h), bit-identical to ggml's dequantize_row_*.
 *
 * Every expression that produces a float is written in the same order and
 * with the same operand types as ggml's ggml-quants.c (e.g. Q6_K is
 * (d * sc) * q, Q3_K is (d * (sc - 32)) * q), because float multiplication
 * is not associative and the contract is equality of bits. The build uses
 * -std=c11, which turns off FMA contraction, so no expression is fused.
 * Source bytes are read byte by byte (little-endian): blocks in GGUF have no
 * alignment guarantee beyond the tensor's start.
 */
#include "converter/gguf.h"

#include <string.h>

/* ---------------------------------------------------------------- block traits */
typedef struct ggml_traits { const char *name; uint32_t elems, bytes; } ggml_traits;

static const ggml_traits *traits_of(uint32_t type)
{
    static const ggml_traits T[] = {
        [GGML_F32] = {"F32", 1, 4},      [GGML_F16] = {"F16", 1, 2},
        [GGML_Q4_0] = {"Q4_0", 32, 18},  [GGML_Q4_1] = {"Q4_1", 32, 20},
        [GGML_Q5_0] = {"Q5_0", 32, 22},  [GGML_Q5_1] = {"Q5_1", 32, 24},
        [GGML_Q8_0] = {"Q8_0", 32, 34},  [GGML_Q8_1] = {"Q8_1", 32, 36},
        [GGML_Q2_K] = {"Q2_K", 256, 84}, [GGML_Q3_K] = {"Q3_K", 256, 110},
        [GGML_Q4_K] = {"Q4_K", 256, 144}, [GGML_Q5_K] = {"Q5_K", 256, 176},
        [GGML_Q6_K] = {"Q6_K", 256, 210}, [GGML_Q8_K] = {"Q8_K", 256, 292},
        [GGML_I8] = {"I8", 1, 1},        [GGML_I16] = {"I16", 1, 2},
        [GGML_I32] = {"I32", 1, 4},      [GGML_I64] = {"I64", 1, 8},
        [GGML_F64] = {"F64", 1, 8},      [GGML_BF16] = {"BF16", 1, 2},
        [GGML_MXFP4] = {"MXFP4", 32, 17},
    };
    if (type >= sizeof T / sizeof T[0] || !T[type].name)
        return NULL;
    return &T[type];
}

uint32_t jlm_ggml_block_elems(uint32_t type)
{
    const ggml_traits *t = traits_of(type);
    return t ? t->elems : 0;
}

uint32_t jlm_ggml_block_bytes(uint32_t type)
{
    const ggml_traits *t = traits_of(type);
    return t ? t->bytes : 0;
}

const char *jlm_ggml_type_name(uint32_t type)
{
    const ggml_traits *t = traits_of(type);
    return t ? t->name : NULL;
}

/* ---------------------------------------------------------------- f16 / bf16 */
static float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Exact widening by integer arithmetic: every f16 is an f32, so any correct
 * conversion (ggml's bit trick, its table, F16C) gives these bits; only a
 * signalling NaN's quiet bit may differ from F16C. */
float jlm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)                             /* inf / NaN */
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0)                                /* normal */
        return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0)
        return f32_from_bits(sign);
    int shift = 0;                               /* subnormal: normalise */
    while (!(man & 0x400u)) { man <<= 1; shift++; }
    return f32_from_bits(sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3ffu) << 13));
}

/* Round to nearest even; NaN -> 0x7e00 with the sign (as ggml's generic
 * ggml_compute_fp32_to_fp16); overflow -> inf. */
uint16_t jlm_f32_to_f16(float f)
{
    uint32_t w = f32_bits(f);
    uint16_t sign = (uint16_t)((w >> 16) & 0x8000u);
    uint32_t aw = w & 0x7fffffffu;
    if (aw > 0x7f800000u)
        return sign | 0x7e00u;
    if (aw >= 0x47800000u)                       /* >= 65536 (rounds to inf too) or inf */
        return sign | 0x7c00u;
    int32_t exp = (int32_t)(aw >> 23) - 127;
    uint32_t man = (aw & 0x7fffffu) | 0x800000u; /* 24-bit significand */
    uint32_t shift;                              /* bits dropped from the significand */
    uint32_t base;                               /* f16 exponent field contribution */
    if (exp >= -14) {
        shift = 13;
        base = (uint32_t)(exp + 14) << 10;       /* (exp+15) << 10 minus the implicit 1 added below */
    } else {
        if (exp < -25)                           /* below half the smallest subnormal */
            return sign;
        shift = (uint32_t)(-exp - 1);            /* subnormal: q counts units of 2^-24 */
        base = 0;
    }
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    /* normal: q holds the implicit 1 and 10 fraction bits; a rounding carry
     * moves into the exponent field naturally, up to inf */
    return sign | (uint16_t)(base + q);
}

float jlm_bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

/* ---------------------------------------------------------------- helpers */
static inline float rd_f16(const uint8_t *p) { return jlm_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ggml's get_scale_min_k4: 6-bit scale and min j (0..7) of a Q4_K/Q5_K block */
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* ---------------------------------------------------------------- 32-wide blocks */
static void deq_q4_0(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 18, y += 32) {
        const float d = rd_f16(x);
        for (int j = 0; j < 16; ++j) {
            const int x0 = (x[2 + j] & 0x0F) - 8;
            const int x1 = (x[2 + j] >> 4) - 8;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

static void deq_q4_1(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 20, y += 32) {
        const float d = rd_f16(x), m = rd_f16(x + 2);
        for (int j = 0; j < 16; ++j) {
            const int x0 = x[4 + j] & 0x0F;
            const int x1 = x[4 + j] >> 4;
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

static void deq_q5_0(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 22, y += 32) {
        const float d = rd_f16(x);
        const uint32_t qh = rd32(x + 2);
        for (int j = 0; j < 16; ++j) {
            const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
            const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
            const int32_t x0 = ((x[6 + j] & 0x0F) | xh_0) - 16;
            const int32_t x1 = ((x[6 + j] >> 4) | xh_1) - 16;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

static void deq_q5_1(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 24, y += 32) {
        const float d = rd_f16(x), m = rd_f16(x + 2);
        const uint32_t qh = rd32(x + 4);
        for (int j = 0; j < 16; ++j) {
            const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
            const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
            const int x0 = (x[8 + j] & 0x0F) | xh_0;
            const int x1 = (x[8 + j] >> 4) | xh_1;
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

static void deq_q8_0(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 34, y += 32) {
        const float d = rd_f16(x);
        for (int j = 0; j < 32; ++j)
            y[j] = (int8_t)x[2 + j] * d;
    }
}

/* kvalues_mxfp4: the e2m1 values doubled; GGML_E8M0_TO_FP32_HALF gives half the scale */
static const int8_t KVALUES_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float e8m0_to_f32_half(uint8_t x)
{
    uint32_t bits = x < 2 ? 0x00200000u << x : (uint32_t)(x - 1) << 23;
    return f32_from_bits(bits);
}

static void deq_mxfp4(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 17, y += 32) {
        const float d = e8m0_to_f32_half(x[0]);
        for (int j = 0; j < 16; ++j) {
            const int8_t x0 = KVALUES_MXFP4[x[1 + j] & 0x0F];
            const int8_t x1 = KVALUES_MXFP4[x[1 + j] >> 4];
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

/* ---------------------------------------------------------------- k-quants (256-wide) */
/* block_q2_K: scales[16] qs[64] d dmin */
static void deq_q2_k(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 84) {
        const float d = rd_f16(x + 80), min = rd_f16(x + 82);
        const uint8_t *q = x + 16;
        int is = 0;
        for (int n = 0; n < 256; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                uint8_t sc = x[is++];
                float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l] >> shift) & 3)) - ml;
                sc = x[is++];
                dl = d * (sc & 0xF); ml = min * (sc >> 4);
                for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3)) - ml;
                shift += 2;
            }
            q += 32;
        }
    }
}

/* The 6-bit Q3_K scale j (0..15) of a 12-byte scales field, as ggml's
 * kmask unpacking yields it (0..63; the signed scale is this - 32). */
static int q3k_scale(const uint8_t *s, int j)
{
    int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    return lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

/* block_q3_K: hmask[32] qs[64] scales[12] d */
static void deq_q3_k(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 110) {
        const float d_all = rd_f16(x + 108);
        const uint8_t *q = x + 32, *hm = x;
        int8_t scales[16];
        for (int j = 0; j < 16; j++)
            scales[j] = (int8_t)q3k_scale(x + 96, j);
        uint8_t m = 1;
        int is = 0;
        for (int n = 0; n < 256; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                float dl = d_all * (scales[is++] - 32);
                for (int l = 0; l < 16; ++l)
                    *y++ = dl * ((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
                dl = d_all * (scales[is++] - 32);
                for (int l = 0; l < 16; ++l)
                    *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
                shift += 2;
                m <<= 1;
            }
            q += 32;
        }
    }
}

/* block_q4_K: d dmin scales[12] qs[128] */
static void deq_q4_k(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 144) {
        const float d = rd_f16(x), min = rd_f16(x + 2);
        const uint8_t *q = x + 16;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < 256; j += 64) {
            scale_min_k4(is + 0, x + 4, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            scale_min_k4(is + 1, x + 4, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

/* block_q5_K: d dmin scales[12] qh[32] qs[128] */
static void deq_q5_k(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 176) {
        const float d = rd_f16(x), min = rd_f16(x + 2);
        const uint8_t *qh = x + 16, *ql = x + 48;
        int is = 0;
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0; j < 256; j += 64) {
            scale_min_k4(is + 0, x + 4, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            scale_min_k4(is + 1, x + 4, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

/* block_q6_K: ql[128] qh[64] scales[16] (int8) d */
static void deq_q6_k(const uint8_t *x, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 210) {
        const float d = rd_f16(x + 208);
        const uint8_t *ql = x, *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int n = 0; n < 256; n += 128) {
            for (int l = 0; l < 32; ++l) {
                int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

/* ---------------------------------------------------------------- entry point */
int jlm_ggml_dequant_row(uint32_t type, const void *src, float *dst, uint64_t k, jlm_err *err)
{
    const uint8_t *x = src;
    const ggml_traits *t = traits_of(type);
    if (!t)
        return jlm_errf(err, JLM_EUNSUPPORTED, "dequantize: unknown ggml type %u", type);
    if (k % t->elems)
        return jlm_errf(err, JLM_EINVAL, "dequantize %s: row length %llu is not a multiple of %u",
                        t->name, (unsigned long long)k, t->elems);
    uint64_t nb = k / t->elems;
    switch (type) {
    case GGML_F32:
        memcpy(dst, x, k * 4);
        break;
    case GGML_F16:
        for (uint64_t i = 0; i < k; i++)
            dst[i] = rd_f16(x + 2 * i);
        break;
    case GGML_BF16:
        for (uint64_t i = 0; i < k; i++)
            dst[i] = jlm_bf16_to_f32((uint16_t)(x[2 * i] | x[2 * i + 1] << 8));
        break;
    case GGML_Q4_0:  deq_q4_0(x, dst, nb); break;
    case GGML_Q4_1:  deq_q4_1(x, dst, nb); break;
    case GGML_Q5_0:  deq_q5_0(x, dst, nb); break;
    case GGML_Q5_1:  deq_q5_1(x, dst, nb); break;
    case GGML_Q8_0:  deq_q8_0(x, dst, nb); break;
    case GGML_MXFP4: deq_mxfp4(x, dst, nb); break;
    case GGML_Q2_K:  deq_q2_k(x, dst, nb); break;
    case GGML_Q3_K:  deq_q3_k(x, dst, nb); break;
    case GGML_Q4_K:  deq_q4_k(x, dst, nb); break;
    case GGML_Q5_K:  deq_q5_k(x, dst, nb); break;
    case GGML_Q6_K:  deq_q6_k(x, dst, nb); break;
    default:
        return jlm_errf(err, JLM_EUNSUPPORTED, "dequantize: ggml type %s is not supported", t->name);
    }
    return JLM_OK;
}
