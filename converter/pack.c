/* pack.c - ggml blocks -> .jlm transposed planes (jlm-format.md 7 and 8).
 *
 * Each row's GGUF super-block is first decoded into a neutral form (one full
 * quant code per element, the d word halves, the sc bytes or six-bit fields),
 * then written out by three type-generic writers driven by format/'s traits:
 * put_payload (7.1 + 7.5), put_d (7.2), put_sc (7.3). Decoders only move
 * bits; no float is computed except for Q2_K, which is re-quantized to Q4_K
 * (see docs/packing.md for the choice and its measured error).
 *
 * Cost: one pass over the source; the plane writes are strided by `rows`
 * words (the layout's point), so large matrices write cache-unfriendly, but
 * conversion is a one-off.
 */
#include "pack.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "../format/jlm_format.h"

/* ---------------------------------------------------------------- type mapping */
int jlm_pack_stored_type(uint32_t ggml_type, uint8_t *jlm_type, int *exact, jlm_err *err)
{
    uint8_t t;
    int ex = 1;
    switch (ggml_type) {
    case GGML_F32:   t = JLM_T_F32; break;
    case GGML_F16:   t = JLM_T_F16; break;
    case GGML_BF16:  t = JLM_T_BF16; break;
    case GGML_Q4_0:  t = JLM_T_Q4_0; break;
    case GGML_Q5_0:  t = JLM_T_Q5_0; break;
    case GGML_Q5_1:  t = JLM_T_Q5_1; break;
    case GGML_Q8_0:  t = JLM_T_Q8_0; break;
    case GGML_Q3_K:  t = JLM_T_Q3_K; break;
    case GGML_Q4_K:  t = JLM_T_Q4_K; break;
    case GGML_Q5_K:  t = JLM_T_Q5_K; break;
    case GGML_Q6_K:  t = JLM_T_Q6_K; break;
    case GGML_MXFP4: t = JLM_T_MXFP4; break;
    case GGML_Q4_1:  t = JLM_T_Q5_1; break;            /* exact: high bit 0 */
    case GGML_Q2_K:  t = JLM_T_Q4_K; ex = 0; break;    /* re-quantized */
    default: {
        const char *n = jlm_ggml_type_name(ggml_type);
        if (n)
            return jlm_errf(err, JLM_EUNSUPPORTED, "ggml type %s has no .jlm stored type", n);
        return jlm_errf(err, JLM_EUNSUPPORTED, "unknown ggml type %u has no .jlm stored type", ggml_type);
    }
    }
    *jlm_type = t;
    *exact = ex;
    return JLM_OK;
}

/* ---------------------------------------------------------------- decoded super-block */
/* One super-block of one row in neutral form. q[e] is the full code of
 * element e (primary bits | high bits << 4; for Q8_0 the raw signed byte). */
typedef struct sblock {
    uint8_t  q[256];
    uint16_t lo, hi;      /* d word: lo16, hi16 (or the 8-bit E8M0 slot in lo) */
    uint8_t  scb[16];     /* Q3_K / Q6_K: sc byte per 16-wide sub-block */
    uint8_t  f6[16];      /* Q4_K / Q5_K: six-bit fields sc0, m0, ..., sc7, m7 */
} sblock;

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* nibble rule of GGUF's 32-wide blocks: qs[j] low = element j, high = j + 16 */
static void nibbles32(const uint8_t *qs, uint8_t *q)
{
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 15;
        q[j + 16] = qs[j] >> 4;
    }
}

static void dec_q4_0(const uint8_t *x, sblock *b) { b->lo = rd16(x); nibbles32(x + 2, b->q); }

static void dec_q8_0(const uint8_t *x, sblock *b) { b->lo = rd16(x); memcpy(b->q, x + 2, 32); }

static void dec_q5_0(const uint8_t *x, sblock *b)
{
    uint32_t qh = rd32(x + 2);
    b->lo = rd16(x);
    nibbles32(x + 6, b->q);
    for (int e = 0; e < 32; e++)
        b->q[e] |= (uint8_t)(((qh >> e) & 1) << 4);
}

/* Q5_1 and Q4_1 (hbits NULL): hi16 = m with its sign bit flipped (7.2) */
static void dec_q5_1(const uint8_t *x, const uint8_t *qh4, const uint8_t *qs, sblock *b)
{
    b->lo = rd16(x);
    b->hi = rd16(x + 2) ^ 0x8000u;
    nibbles32(qs, b->q);
    if (qh4) {
        uint32_t qh = rd32(qh4);
        for (int e = 0; e < 32; e++)
            b->q[e] |= (uint8_t)(((qh >> e) & 1) << 4);
    }
}

static int q3k_scale(const uint8_t *s, int j)
{
    int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    return lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

/* Q3_K at 4 bits: nibble = low2 + 4*hbit (so nibble - 4 = ggml's quant) */
static void dec_q3_k(const uint8_t *x, sblock *b)
{
    const uint8_t *hm = x, *qs = x + 32;
    for (int e = 0; e < 256; e++) {
        int n = e / 128, j = (e % 128) / 32, half = (e % 32) / 16, l = e % 16;
        int low2 = (qs[n * 32 + half * 16 + l] >> (2 * j)) & 3;
        int hbit = (hm[half * 16 + l] >> (n * 4 + j)) & 1;
        b->q[e] = (uint8_t)(low2 + 4 * hbit);
    }
    for (int s = 0; s < 16; s++)
        b->scb[s] = (uint8_t)q3k_scale(x + 96, s);
    b->lo = rd16(x + 108);
    b->hi = 0;
}

static void dec_q6_k(const uint8_t *x, sblock *b)
{
    const uint8_t *ql = x, *qh = x + 128;
    for (int e = 0; e < 256; e++) {
        int n = e / 128, g = (e % 128) / 32, l = e % 32;
        uint8_t lb = ql[n * 64 + l + (g & 1) * 32];
        int low4 = g < 2 ? lb & 15 : lb >> 4;
        int hi2 = (qh[n * 32 + l] >> (2 * g)) & 3;
        b->q[e] = (uint8_t)(low4 | hi2 << 4);
    }
    for (int s = 0; s < 16; s++)
        b->scb[s] = (uint8_t)(x[192 + s] ^ 0x80u);   /* int8 + 128 */
    b->lo = rd16(x + 208);
    b->hi = 0;
}

static void k4_fields(const uint8_t *scales, sblock *b)
{
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        if (j < 4) {
            sc = scales[j] & 63;
            m = scales[j + 4] & 63;
        } else {
            sc = (uint8_t)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
            m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
        }
        b->f6[2 * j] = sc;
        b->f6[2 * j + 1] = m;
    }
}

/* Q4_K (qh NULL) and Q5_K: GGUF pairs sub-blocks 2c/2c+1 in the low/high
 * nibbles of one 32-byte run; the codes here are per element, and
 * put_payload re-applies the 7.5 nibble rule per 32-element sub-block. */
static void dec_q45_k(const uint8_t *x, const uint8_t *qh, const uint8_t *qs, sblock *b)
{
    b->lo = rd16(x);
    b->hi = rd16(x + 2);
    k4_fields(x + 4, b);
    for (int e = 0; e < 256; e++) {
        int c = e / 64, hi = (e % 64) / 32, l = e % 32;
        uint8_t v = qs[c * 32 + l];
        uint8_t code = hi ? v >> 4 : v & 15;
        if (qh)
            code |= (uint8_t)(((qh[l] >> (2 * c + hi)) & 1) << 4);
        b->q[e] = code;
    }
}

/* MXFP4: stored byte = E8M0 - 1; an all-zero block (every code 0 or 8)
 * stores 0; a non-zero block with exponent 0, 1 or 255 is refused. */
static int dec_mxfp4(const uint8_t *x, sblock *b, const char *what, uint64_t r, uint64_t sb, jlm_err *err)
{
    int zero = 1;
    nibbles32(x + 1, b->q);
    for (int e = 0; e < 32; e++)
        if (b->q[e] & 7)
            zero = 0;
    uint8_t e8 = x[0];
    if (zero) {
        b->lo = 0;
    } else if (e8 == 0 || e8 == 1 || e8 == 255) {
        return jlm_errf(err, JLM_EFORMAT,
                        "%s: MXFP4 block %llu of row %llu: exponent %u is not allowed in a non-zero block "
                        "(allowed 2..254)", what, (unsigned long long)sb, (unsigned long long)r, e8);
    } else {
        b->lo = (uint16_t)(e8 - 1);
    }
    return JLM_OK;
}

/* ---------------------------------------------------------------- plane writers */
static inline void put32(uint8_t *plane, uint64_t word, const uint8_t *bytes)
{
    memcpy(plane + 4 * word, bytes, 4);
}

/* 7.1 + 7.5: the W words of each sub-block of super-block sb of row r */
static void put_payload(const jlm_type_traits *t, const sblock *b, uint64_t sb, uint64_t rows,
                        uint64_t r, uint8_t *qs)
{
    const int sub = t->sub, half = sub / 2, wn = t->w;
    for (int sl = 0; sl < t->super_sub; sl++) {
        const uint8_t *q = b->q + sl * sub;
        uint8_t bytes[32] = {0};
        if (t->p0 == 8) {
            memcpy(bytes, q, (size_t)sub);
        } else {
            for (int j = 0; j < half; j++)
                bytes[j] = (uint8_t)((q[j] & 15) | (q[j + half] & 15) << 4);
        }
        if (t->p1) {
            uint8_t *sec = bytes + sub * t->p0 / 8;
            int hi = t->p1, lanes = 8 / hi;
            for (int l = 0; l < sub; l++)
                sec[((l / 4) / lanes) * 4 + l % 4] |= (uint8_t)((q[l] >> 4) << (hi * ((l / 4) % lanes)));
        }
        uint64_t s = sb * t->super_sub + (uint64_t)sl;
        for (int w = 0; w < wn; w++)
            put32(qs, (s * (uint64_t)wn + (uint64_t)w) * rows + r, bytes + 4 * w);
    }
}

/* 7.2: the d value of super-block sb of row r */
static void put_d(const jlm_type_traits *t, const sblock *b, uint64_t sb, uint64_t rows, uint64_t r,
                  uint8_t *d)
{
    uint64_t S = t->d_share;
    if (S == 1) {
        uint8_t w[4] = {(uint8_t)b->lo, (uint8_t)(b->lo >> 8), (uint8_t)b->hi, (uint8_t)(b->hi >> 8)};
        put32(d, sb * rows + r, w);
        return;
    }
    uint64_t word = sb * ((rows + S - 1) / S) + r / S;
    uint8_t *p = d + 4 * word;
    if (S == 2) {
        p[2 * (r % 2)] = (uint8_t)b->lo;
        p[2 * (r % 2) + 1] = (uint8_t)(b->lo >> 8);
    } else {
        p[r % 4] = (uint8_t)b->lo;
    }
}

/* 7.3: sc bytes (Q3_K, Q6_K) or the 96-bit six-bit-field stream (Q4_K, Q5_K) */
static void put_sc(const jlm_type_traits *t, const sblock *b, uint64_t sb, uint64_t rows, uint64_t r,
                   uint8_t *sc)
{
    if (t->sc_kind == 1) {
        for (int sl = 0; sl < t->super_sub; sl++) {
            uint64_t s = sb * t->super_sub + (uint64_t)sl;
            sc[4 * ((s / 4) * rows + r) + s % 4] = b->scb[sl];
        }
    } else if (t->sc_kind == 2) {
        uint32_t w[3] = {0, 0, 0};
        for (int f = 0; f < 16; f++) {
            uint32_t bit = 6u * (uint32_t)f, v = b->f6[f];
            w[bit / 32] |= v << (bit % 32);
            if (bit % 32 > 26)                         /* straddles into the next word */
                w[bit / 32 + 1] |= v >> (32 - bit % 32);
        }
        for (int i = 0; i < 3; i++) {
            uint8_t by[4] = {(uint8_t)w[i], (uint8_t)(w[i] >> 8), (uint8_t)(w[i] >> 16), (uint8_t)(w[i] >> 24)};
            put32(sc, (sb * 3 + (uint64_t)i) * rows + r, by);
        }
    }
}

/* ---------------------------------------------------------------- Q2_K -> Q4_K */
/* A port of ggml's quantize_row_q4_K_ref (make_qkx2_quants, nearest_int),
 * except that nearest_int saturates at +-4194303 where ggml asserts. */
static inline int nearest_int(float fval)
{
    if (fval > 4194303.f) fval = 4194303.f;
    if (fval < -4194303.f) fval = -4194303.f;
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

#define MAXI(a, b) ((a) > (b) ? (a) : (b))
#define MINI(a, b) ((a) < (b) ? (a) : (b))

static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAXI(0, MINI(nmax, l));
        float diff = scale * L[i] + min - x[i];
        best_error += weights[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MAXI(0, MINI(nmax, l));
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
                cur_error += weights[i] * diff * diff;
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

/* quantize_row_q4_K_ref for one 256-element block: x -> y (144 bytes, GGUF layout) */
static void quantize_q4_k_block(const float *x, uint8_t *y)
{
    uint8_t L[256], Laux[32], *scales = y + 4, *qs = y + 16;
    float weights[32], mins[8], scl[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scl[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20);
        if (scl[j] > max_scale) max_scale = scl[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales, 0, 12);
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scl[j]), lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = MINI(63, ls);
        lm = MINI(63, lm);
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    uint16_t dh = jlm_f32_to_f16(max_scale / 63.f), mh = jlm_f32_to_f16(max_min / 63.f);
    y[0] = (uint8_t)dh; y[1] = (uint8_t)(dh >> 8);
    y[2] = (uint8_t)mh; y[3] = (uint8_t)(mh >> 8);
    sblock fb;
    k4_fields(scales, &fb);
    for (int j = 0; j < 8; ++j) {
        const float d = jlm_f16_to_f32(dh) * fb.f6[2 * j];
        if (!d) continue;
        const float dm = jlm_f16_to_f32(mh) * fb.f6[2 * j + 1];
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)MAXI(0, MINI(15, l));
        }
    }
    for (int j = 0; j < 256; j += 64) {
        for (int l = 0; l < 32; ++l) qs[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        qs += 32;
    }
}

/* ---------------------------------------------------------------- driver */
static int pack_floats(uint32_t g, const void *src, uint64_t k, uint64_t rows, uint8_t *qs)
{
    uint64_t eb = g == GGML_F32 ? 4 : 2;
    memcpy(qs, src, k * rows * eb);
    return JLM_OK;
}

/* Decodes super-block sb of one source row (blk points at its GGUF bytes). */
static int decode_block(uint32_t g, const uint8_t *blk, sblock *b, const char *what, uint64_t r,
                        uint64_t sb, jlm_err *err)
{
    switch (g) {
    case GGML_Q4_0:  dec_q4_0(blk, b); break;
    case GGML_Q8_0:  dec_q8_0(blk, b); break;
    case GGML_Q5_0:  dec_q5_0(blk, b); break;
    case GGML_Q5_1:  dec_q5_1(blk, blk + 4, blk + 8, b); break;
    case GGML_Q4_1:  dec_q5_1(blk, NULL, blk + 4, b); break;
    case GGML_Q3_K:  dec_q3_k(blk, b); break;
    case GGML_Q6_K:  dec_q6_k(blk, b); break;
    case GGML_Q4_K:  dec_q45_k(blk, NULL, blk + 16, b); break;
    case GGML_Q5_K:  dec_q45_k(blk, blk + 16, blk + 48, b); break;
    case GGML_MXFP4: return dec_mxfp4(blk, b, what, r, sb, err);
    default:
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: cannot pack ggml type %u", what, g);
    }
    return JLM_OK;
}

/* Q2_K rows: dequantize exactly, re-quantize each 256-block to Q4_K. */
static int requant_row_q2k(const uint8_t *row, uint64_t k, float *f, uint8_t *q4, const char *what,
                           uint64_t r, jlm_err *err)
{
    int rc = jlm_ggml_dequant_row(GGML_Q2_K, row, f, k, err);
    if (rc)
        return rc;
    for (uint64_t i = 0; i < k; i++)
        if (!isfinite(f[i]))
            return jlm_errf(err, JLM_EFORMAT, "%s: Q2_K row %llu element %llu is not finite",
                            what, (unsigned long long)r, (unsigned long long)i);
    for (uint64_t sb = 0; sb < k / 256; sb++)
        quantize_q4_k_block(f + 256 * sb, q4 + 144 * sb);
    return JLM_OK;
}

int jlm_pack_matrix(uint32_t ggml_type, const void *src, uint64_t k, uint64_t rows,
                    uint8_t jlm_type, uint8_t *qs, uint8_t *d, uint8_t *sc,
                    const char *what, jlm_err *err)
{
    uint8_t want;
    int exact, rc = jlm_pack_stored_type(ggml_type, &want, &exact, err);
    if (rc) {
        jlm_err_prefix(err, rc, "%s", what);   /* returns 0 when err is NULL: keep rc */
        return rc;
    }
    if (want != jlm_type)
        return jlm_errf(err, JLM_EINVAL, "%s: ggml %s is stored as .jlm type %u, not %u", what,
                        jlm_ggml_type_name(ggml_type), want, jlm_type);
    uint32_t be = jlm_ggml_block_elems(ggml_type), bb = jlm_ggml_block_bytes(ggml_type);
    if (k == 0 || rows == 0 || k % be)
        return jlm_errf(err, JLM_EFORMAT, "%s: %s matrix %llu x %llu: row length not a positive multiple of %u",
                        what, jlm_ggml_type_name(ggml_type), (unsigned long long)k,
                        (unsigned long long)rows, be);
    const jlm_type_traits *t = jlm_fmt_type_traits(jlm_type);
    if (t->is_float)
        return pack_floats(ggml_type, src, k, rows, qs);

    const uint8_t *s8 = src;
    uint64_t nsuper = k / ((uint64_t)t->sub * t->super_sub), row_bytes = k / be * bb;
    float *f = NULL;
    uint8_t *q4 = NULL;
    if (ggml_type == GGML_Q2_K) {
        f = malloc(k * sizeof(float));
        q4 = malloc(nsuper * 144);
        if (!f || !q4) {
            free(f);
            free(q4);
            return jlm_errf(err, JLM_ENOMEM, "%s: Q2_K re-quantization buffers (%llu elements)", what,
                            (unsigned long long)k);
        }
    }
    uint32_t src_type = ggml_type == GGML_Q2_K ? GGML_Q4_K : ggml_type;
    uint32_t src_bb = ggml_type == GGML_Q2_K ? 144 : bb;
    for (uint64_t r = 0; r < rows && !rc; r++) {
        const uint8_t *row = s8 + r * row_bytes;
        if (q4) {
            if ((rc = requant_row_q2k(row, k, f, q4, what, r, err)))
                break;
            row = q4;
        }
        for (uint64_t sb = 0; sb < nsuper; sb++) {
            sblock b;
            memset(&b, 0, sizeof b);
            if ((rc = decode_block(src_type, row + sb * src_bb, &b, what, r, sb, err)))
                break;
            put_payload(t, &b, sb, rows, r, qs);
            put_d(t, &b, sb, rows, r, d);
            put_sc(t, &b, sb, rows, r, sc);
        }
    }
    free(f);
    free(q4);
    return rc;
}
