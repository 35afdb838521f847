/* dequant_ref.c - scalar reference dequantization of packed .jlm planes
 * (jlm-format.md 7). Plain loops, no intrinsics; the oracle for the converter
 * and for every kernel variant.
 *
 * Every float expression is written in the order ggml's dequantize_row_* uses
 * for the source type (e.g. Q6_K is (d * sc) * q, Q3_K is (d * (sc-32)) * q),
 * so that for an exact conversion the result equals ggml's bit for bit.
 */
#include "format/dequant.h"

#include <string.h>

#include "format/jlm_format.h"

/* ---------------------------------------------------------------- scalars */
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static float f16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp)
        return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    if (!man)
        return bits_f32(sign);
    int shift = 0;
    while (!(man & 0x400u)) { man <<= 1; shift++; }
    return bits_f32(sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3ffu) << 13));
}

static inline uint32_t word_at(const uint8_t *plane, uint64_t w)
{
    const uint8_t *p = plane + 4 * w;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* MXFP4 codes doubled plus 12 (7.6) */
static const int MXFP4_TAB[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* ---------------------------------------------------------------- payload */
/* Full codes (primary | high << 4; Q8_0: the raw byte) of sub-block s of row r. */
static void sub_codes(const jlm_type_traits *t, const uint8_t *qs, uint64_t s, uint64_t rows,
                      uint64_t r, uint8_t *q)
{
    uint8_t bytes[32];
    const int sub = t->sub, half = sub / 2;
    for (int w = 0; w < t->w; w++) {
        uint32_t v = word_at(qs, (s * t->w + (uint64_t)w) * rows + r);
        for (int b = 0; b < 4; b++)
            bytes[4 * w + b] = (uint8_t)(v >> (8 * b));
    }
    if (t->p0 == 8) {
        memcpy(q, bytes, (size_t)sub);
        return;
    }
    for (int j = 0; j < half; j++) {
        q[j] = bytes[j] & 15;
        q[j + half] = bytes[j] >> 4;
    }
    if (t->p1) {
        const uint8_t *sec = bytes + sub * t->p0 / 8;
        int hi = t->p1, lanes = 8 / hi, mask = (1 << hi) - 1;
        for (int l = 0; l < sub; l++) {
            int hb = (sec[((l / 4) / lanes) * 4 + l % 4] >> (hi * ((l / 4) % lanes))) & mask;
            q[l] |= (uint8_t)(hb << 4);
        }
    }
}

/* d word of super-block sb of row r: returns the slot value (16 or 8 bits)
 * for shared words, the whole word otherwise. */
static uint32_t d_of(const jlm_type_traits *t, const uint8_t *d, uint64_t sb, uint64_t rows, uint64_t r)
{
    uint64_t S = t->d_share;
    if (S == 1)
        return word_at(d, sb * rows + r);
    uint32_t w = word_at(d, sb * ((rows + S - 1) / S) + r / S);
    return S == 2 ? (w >> (16 * (r % 2))) & 0xffffu : (w >> (8 * (r % 4))) & 0xffu;
}

/* six-bit field f of the 96-bit stream of super-block sb of row r (7.3) */
static int sc_field(const uint8_t *sc, uint64_t sb, uint64_t rows, uint64_t r, int f)
{
    uint32_t bit = 6u * (uint32_t)f, w = bit / 32, o = bit % 32;
    uint64_t v = word_at(sc, (sb * 3 + w) * rows + r);
    if (o > 26)
        v |= (uint64_t)word_at(sc, (sb * 3 + w + 1) * rows + r) << 32;
    return (int)((v >> o) & 63);
}

/* ---------------------------------------------------------------- one super-block */
static void deq_super(uint8_t type, const jlm_type_traits *t, const uint8_t *qs, const uint8_t *dp,
                      const uint8_t *sc, uint64_t sb, uint64_t rows, uint64_t r, float *y)
{
    uint32_t dw = d_of(t, dp, sb, rows, r);
    const float d = type == JLM_T_MXFP4 ? bits_f32(dw << 23) : f16_f32((uint16_t)dw);
    const float hi = f16_f32((uint16_t)(dw >> 16));
    uint8_t q[32];
    for (int sl = 0; sl < t->super_sub; sl++, y += t->sub) {
        uint64_t s = sb * t->super_sub + (uint64_t)sl;
        sub_codes(t, qs, s, rows, r, q);
        switch (type) {
        case JLM_T_Q4_0: for (int j = 0; j < 32; j++) y[j] = (q[j] - 8) * d; break;
        case JLM_T_Q5_0: for (int j = 0; j < 32; j++) y[j] = (q[j] - 16) * d; break;
        case JLM_T_Q8_0: for (int j = 0; j < 32; j++) y[j] = (int8_t)q[j] * d; break;
        case JLM_T_Q5_1: for (int j = 0; j < 32; j++) y[j] = q[j] * d - hi; break;  /* hi = -m */
        case JLM_T_MXFP4: for (int j = 0; j < 32; j++) y[j] = (MXFP4_TAB[q[j]] - 12) * d; break;
        case JLM_T_Q3_K: {
            int scv = (int)((word_at(sc, (s / 4) * rows + r) >> (8 * (s % 4))) & 0xff);
            const float dl = d * (scv - 32);
            for (int j = 0; j < 16; j++) y[j] = dl * (q[j] - 4);
            break;
        }
        case JLM_T_Q6_K: {
            int scv = (int)((word_at(sc, (s / 4) * rows + r) >> (8 * (s % 4))) & 0xff) - 128;
            for (int j = 0; j < 16; j++) y[j] = d * scv * (q[j] - 32);
            break;
        }
        case JLM_T_Q4_K: case JLM_T_Q5_K: {
            const float d1 = d * sc_field(sc, sb, rows, r, 2 * sl);
            const float m1 = hi * sc_field(sc, sb, rows, r, 2 * sl + 1);
            for (int j = 0; j < 32; j++) y[j] = d1 * q[j] - m1;
            break;
        }
        default: break;
        }
    }
}

/* ---------------------------------------------------------------- entry point */
int jlm_k_dequant_row_ref(uint8_t type, const void *qs, const void *d, const void *sc,
                          uint64_t k, uint64_t rows, uint64_t r, float *out)
{
    const jlm_type_traits *t = jlm_fmt_type_traits(type);
    if (!t || r >= rows)
        return -1;
    if (t->is_float) {
        const uint8_t *p = (const uint8_t *)qs + r * k * t->elem_bytes;
        if (type == JLM_T_F32)
            memcpy(out, p, k * 4);
        else
            for (uint64_t i = 0; i < k; i++) {
                uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
                out[i] = type == JLM_T_F16 ? f16_f32(h) : bits_f32((uint32_t)h << 16);
            }
        return 0;
    }
    uint64_t super = (uint64_t)t->sub * t->super_sub;
    if (k % super)
        return -1;
    for (uint64_t sb = 0; sb < k / super; sb++)
        deq_super(type, t, qs, d, sc, sb, rows, r, out + sb * super);
    return 0;
}
