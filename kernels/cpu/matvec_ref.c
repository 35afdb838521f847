/* matvec_ref.c - the scalar reference: activation quantization and matvec for
 * every stored type, read in place from the packed planes (jlm-format.md 7).
 * Plain loops, no intrinsics. It defines the math (kernels.h invariant 1):
 * every vector variant must reproduce its int32 sub-block dot products exactly
 * and its f32 results within kernels/cpu/tolerances.h. */
#include "kernels/cpu/kernels.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- scalar conversions */

float jlm_k_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);          /* inf / NaN (payload kept) */
    } else if (exp == 0) {
        float f = (float)man * 0x1p-24f;                  /* zero / denormal: exact */
        return sign ? -f : f;
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t jlm_k_f32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)                                 /* NaN: quiet, keep top payload */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u)                                /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {                               /* below 2^-14: denormal half */
        float a;
        memcpy(&a, &ax, 4);
        /* a * 2^24 is exact in f32 and < 2^10; rintf rounds to nearest even */
        return (uint16_t)(sign | (uint32_t)rintf(a * 0x1p24f));
    }
    uint32_t m = ax + 0xc8000fffu + ((ax >> 13) & 1u);    /* rebias (-112<<23) + round even */
    return (uint16_t)(sign | (m >> 13));
}

void jlm_k_to_fp16_ref(uint16_t *d, uint64_t stride, const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        d[i * stride] = jlm_k_f32_to_fp16(x[i]);
}

float jlm_k_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---------------------------------------------------------------- checks and activations */

int jlm_k_mat_check(const jlm_k_mat *m, jlm_err *err)
{
    const jlm_type_traits *t = jlm_fmt_type_traits(m->type);
    if (!t)
        return jlm_errf(err, JLM_EINVAL, "kernel matrix: unknown type code %u", m->type);
    if (m->k == 0 || m->rows == 0)
        return jlm_errf(err, JLM_EINVAL, "kernel matrix %s: zero dimension (k %llu, rows %llu)",
                        t->name, (unsigned long long)m->k, (unsigned long long)m->rows);
    if (!m->qs)
        return jlm_errf(err, JLM_EINVAL, "kernel matrix %s: no qs plane", t->name);
    if (t->is_float)
        return JLM_OK;
    uint64_t super = (uint64_t)t->sub * t->super_sub;
    if (m->k % super)
        return jlm_errf(err, JLM_EINVAL, "kernel matrix %s: k %llu is not a multiple of %llu",
                        t->name, (unsigned long long)m->k, (unsigned long long)super);
    if (!m->d || (t->sc_kind && !m->sc))
        return jlm_errf(err, JLM_EINVAL, "kernel matrix %s: missing d or sc plane", t->name);
    return JLM_OK;
}

size_t jlm_k_act_q8_bytes(uint64_t k)
{
    return 64 + k + 64 + (k / 32) * 4 + 64 + (k / 16) * 2;
}

static void *align64(void *p)
{
    return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

int jlm_k_act_q8_init(jlm_act_q8 *a, void *buf, uint64_t k, jlm_err *err)
{
    if (k == 0 || k % 32)
        return jlm_errf(err, JLM_EINVAL, "activations: k %llu is not a positive multiple of 32",
                        (unsigned long long)k);
    int8_t *q = align64(buf);
    float *d = align64(q + k);
    int16_t *s = align64(d + k / 32);
    a->k = k;
    a->q = q;
    a->d = d;
    a->sum16 = s;
    return JLM_OK;
}

void jlm_k_quantize_act(const float *x, jlm_act_q8 *a)
{
    for (uint64_t b = 0; b < a->k / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        int bad = 0;
        for (int i = 0; i < 32; i++) {
            float v = fabsf(xb[i]);
            if (!(v <= 3.4028235e38f))
                bad = 1;                      /* inf or NaN */
            else if (v > amax)
                amax = v;
        }
        float d = bad ? NAN : amax / 127.0f;
        int8_t *q = a->q + 32 * b;
        for (int i = 0; i < 32; i++) {
            /* roundf (half away from zero) without the libm call: |v| <= 127
             * (plus rounding), so v - trunc(v) is exact (hot: every matmul) */
            float v = (bad || d == 0.0f) ? 0.0f : xb[i] / d;
            int iv = (int)v;
            float frac = v - (float)iv;
            iv += frac >= 0.5f ? 1 : frac <= -0.5f ? -1 : 0;
            q[i] = (int8_t)(iv > 127 ? 127 : iv < -127 ? -127 : iv);
        }
        a->d[b] = d;
        for (int h = 0; h < 2; h++) {
            int s = 0;
            for (int i = 0; i < 16; i++)
                s += q[16 * h + i];
            a->sum16[2 * b + h] = (int16_t)s;
        }
    }
}

/* ---------------------------------------------------------------- plane readers (7.1-7.5) */

typedef struct ref_ctx {
    const jlm_k_mat       *m;
    const jlm_type_traits *t;
    const uint32_t        *qs, *d, *sc;
} ref_ctx;

/* Byte j of sub-block s of row r (j < Sub*(P0+P1)/8). */
static uint32_t ref_byte(const ref_ctx *c, uint64_t s, uint64_t r, unsigned j)
{
    uint32_t word = c->qs[(s * c->t->w + j / 4) * c->m->rows + r];
    return (word >> (8 * (j % 4))) & 0xffu;
}

/* Integer code of element e of sub-block s of row r: the primary nibble (or
 * signed byte) with the secondary high bits above it (7.5). */
static int32_t ref_code(const ref_ctx *c, uint64_t s, uint64_t r, unsigned e)
{
    unsigned sub = c->t->sub;
    if (c->t->p0 == 8)
        return (int8_t)ref_byte(c, s, r, e);
    uint32_t b = ref_byte(c, s, r, e % (sub / 2));
    int32_t q = (int32_t)(e < sub / 2 ? (b & 15u) : (b >> 4));
    unsigned hi = c->t->p1;
    if (hi) {
        unsigned lanes = 8 / hi, prim = sub * 4 / 8;   /* primary bytes */
        uint32_t hb = ref_byte(c, s, r, prim + ((e / 4) / lanes) * 4 + e % 4);
        q |= (int32_t)((hb >> (hi * ((e / 4) % lanes))) & ((1u << hi) - 1)) << 4;
    }
    return q;
}

/* Raw d word of super-block sb of row r, already shifted to its slot. */
static uint32_t ref_dword(const ref_ctx *c, uint64_t sb, uint64_t r)
{
    unsigned S = c->t->d_share;
    uint64_t rows = c->m->rows;
    if (S == 1)
        return c->d[sb * rows + r];
    uint32_t w = c->d[sb * ((rows + S - 1) / S) + r / S];
    unsigned bits = 32 / S;
    return (w >> (bits * (r % S))) & (S == 2 ? 0xffffu : 0xffu);
}

/* Six-bit field f (0..15) of the Q4_K/Q5_K 96-bit stream of (sb, r). */
static uint32_t ref_field6(const ref_ctx *c, uint64_t sb, uint64_t r, unsigned f)
{
    uint32_t v = 0;
    for (unsigned b = 0; b < 6; b++) {
        unsigned bit = 6 * f + b;
        uint32_t w = c->sc[(sb * 3 + bit / 32) * c->m->rows + r];
        v |= ((w >> (bit % 32)) & 1u) << b;
    }
    return v;
}

/* Byte scale of 16-wide sub-block s (Q3_K, Q6_K), raw (offset not applied). */
static int32_t ref_scbyte(const ref_ctx *c, uint64_t s, uint64_t r)
{
    return (int32_t)((c->sc[(s / 4) * c->m->rows + r] >> (8 * (s % 4))) & 0xffu);
}

/* sum_e code(e) * a[e] over sub-block s (Sub elements). */
static int32_t ref_dot(const ref_ctx *c, const int8_t *a, uint64_t s, uint64_t r, const int32_t *lut)
{
    int32_t acc = 0;
    for (unsigned e = 0; e < c->t->sub; e++) {
        int32_t q = ref_code(c, s, r, e);
        acc += (lut ? lut[q] : q) * (int32_t)a[e];
    }
    return acc;
}

/* ---------------------------------------------------------------- per-row math */

/* MXFP4 e2m1 codes, doubled, plus 12 (7.6). */
static const int32_t MXFP4_LUT[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

static float e8m0_scale(uint32_t byte)
{
    uint32_t bits = byte << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Sub = 32, one d per sub-block: Q4_0, Q8_0, Q5_0, Q5_1, MXFP4. */
static float ref_row_sub32(const ref_ctx *c, const jlm_act_q8 *a, uint64_t r)
{
    uint8_t type = c->m->type;
    float acc = 0.0f;
    for (uint64_t s = 0; s < c->m->k / 32; s++) {
        const int8_t *aq = a->q + 32 * s;
        int32_t suma = a->sum16[2 * s] + a->sum16[2 * s + 1];
        float da = a->d[s];
        uint32_t dw = ref_dword(c, s, r);
        if (type == JLM_T_Q5_1) {
            int32_t dot = ref_dot(c, aq, s, r, NULL);
            float d = jlm_k_fp16_to_f32((uint16_t)dw), b = jlm_k_fp16_to_f32((uint16_t)(dw >> 16));
            acc += (d * da) * (float)dot - (b * da) * (float)suma;
            continue;
        }
        int32_t bias = type == JLM_T_Q4_0 ? 8 : type == JLM_T_Q5_0 ? 16 : type == JLM_T_MXFP4 ? 12 : 0;
        int32_t isum = ref_dot(c, aq, s, r, type == JLM_T_MXFP4 ? MXFP4_LUT : NULL) - bias * suma;
        float d = type == JLM_T_MXFP4 ? e8m0_scale(dw) : jlm_k_fp16_to_f32((uint16_t)dw);
        acc += (d * da) * (float)isum;
    }
    return acc;
}

/* Q4_K, Q5_K: super-block of 8 x 32, six-bit scale and min per sub-block. */
static float ref_row_k32(const ref_ctx *c, const jlm_act_q8 *a, uint64_t r)
{
    float acc = 0.0f;
    for (uint64_t s = 0; s < c->m->k / 32; s++) {
        uint64_t sb = s / 8;
        unsigned j = (unsigned)(s % 8);
        uint32_t dw = ref_dword(c, sb, r);
        float d = jlm_k_fp16_to_f32((uint16_t)dw), dmin = jlm_k_fp16_to_f32((uint16_t)(dw >> 16));
        int32_t sc = (int32_t)ref_field6(c, sb, r, 2 * j), mn = (int32_t)ref_field6(c, sb, r, 2 * j + 1);
        int32_t dot = ref_dot(c, a->q + 32 * s, s, r, NULL);
        int32_t suma = a->sum16[2 * s] + a->sum16[2 * s + 1];
        float t = d * (float)(sc * dot) - dmin * (float)(mn * suma);
        acc += a->d[s] * t;
    }
    return acc;
}

/* Q3_K, Q6_K: super-block of 16 x 16, one signed byte scale per sub-block;
 * the two sub-blocks of one activation block share its f32 multiply. */
static float ref_row_k16(const ref_ctx *c, const jlm_act_q8 *a, uint64_t r)
{
    int q3 = c->m->type == JLM_T_Q3_K;
    int32_t off = q3 ? -32 : -128, bias = q3 ? 4 : 32;
    float acc = 0.0f;
    for (uint64_t b = 0; b < c->m->k / 32; b++) {
        float d = jlm_k_fp16_to_f32((uint16_t)ref_dword(c, b / 8, r));
        int32_t isum = 0;
        for (uint64_t s = 2 * b; s < 2 * b + 2; s++) {
            int32_t dot = ref_dot(c, a->q + 16 * s, s, r, NULL) - bias * a->sum16[s];
            isum += (ref_scbyte(c, s, r) + off) * dot;
        }
        acc += (d * a->d[b]) * (float)isum;
    }
    return acc;
}

static float ref_row_float(const jlm_k_mat *m, const float *x, uint64_t r)
{
    float acc = 0.0f;
    if (m->type == JLM_T_F32) {
        const float *w = (const float *)m->qs + r * m->k;
        for (uint64_t i = 0; i < m->k; i++)
            acc += w[i] * x[i];
    } else {
        const uint16_t *w = (const uint16_t *)m->qs + r * m->k;
        int bf = m->type == JLM_T_BF16;
        for (uint64_t i = 0; i < m->k; i++)
            acc += (bf ? jlm_k_bf16_to_f32(w[i]) : jlm_k_fp16_to_f32(w[i])) * x[i];
    }
    return acc;
}

/* ---------------------------------------------------------------- entry points */

void jlm_k_matvec_ref(const jlm_k_mat *m, const float *x, const jlm_act_q8 *xq,
                      float *y, uint64_t r0, uint64_t r1)
{
    ref_ctx c = {m, jlm_fmt_type_traits(m->type), m->qs, m->d, m->sc};
    for (uint64_t r = r0; r < r1; r++) {
        switch (m->type) {
        case JLM_T_F32: case JLM_T_F16: case JLM_T_BF16:
            y[r] = ref_row_float(m, x, r);
            break;
        case JLM_T_Q4_K: case JLM_T_Q5_K:
            y[r] = ref_row_k32(&c, xq, r);
            break;
        case JLM_T_Q3_K: case JLM_T_Q6_K:
            y[r] = ref_row_k16(&c, xq, r);
            break;
        default:
            y[r] = ref_row_sub32(&c, xq, r);
            break;
        }
    }
}

void jlm_k_matmul_ref(const jlm_k_mat *m, uint64_t n, const float *x, const jlm_act_q8 *xq,
                      float *y, uint64_t r0, uint64_t r1)
{
    for (uint64_t t = 0; t < n; t++)
        jlm_k_matvec_ref(m, x ? x + t * m->k : NULL, xq ? xq + t : NULL, y + t * m->rows, r0, r1);
}
