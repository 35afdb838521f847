/* matvec_avx2.c - AVX2+FMA+F16C matvec/matmul, vectorized ACROSS ROWS.
 *
 * The packed layout puts word w of sub-block s of 8 consecutive rows in 32
 * contiguous bytes, so one load feeds 8 row lanes and each dword lane keeps
 * its own int32 dot product. Loops run sub-block outer, rows inner: memory is
 * then read in storage order (a few parallel streams, one per word of the
 * sub-block), which is what the hardware prefetcher follows; y (f32, per row)
 * stays in L1 between sub-blocks. Activations of one sub-block are
 * broadcast once and reused by every row.
 *
 * int8 dots: vpmaddubsw (u8 weight x s8 activation -> s16 pairs) then
 * vpmaddwd by 1. Nibble codes <= 15 and |a| <= 127 bound a pair by 3810, so 8
 * pairs may be summed in s16 (30480) before widening. Signed Q8_0 weights use
 * |w| x sign(a, w), widened per word.
 *
 * matmul reuses each weight load (and its nibble split) for up to 4 tokens.
 * Rows left over after the last full group of 8 go through the reference
 * (the shared scalar tail). Quantized types: the reference's int32 dots and
 * its f32 operations in its order, without FMA (MULADD), so the results are
 * bit-identical to it (docs/kernels.md); float types sum in another order. */
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/prefetch.h"

#include <immintrin.h>
#define MULADD(a, b, c) _mm256_add_ps(_mm256_mul_ps((a), (b)), (c))   /* no FMA: the same roundings as the reference */
#define NMULADD(a, b, c) _mm256_sub_ps((c), _mm256_mul_ps((a), (b)))
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define MAXT 4
/* Loops over words, tokens and halves are unrolled: GCC at -O2 leaves them
 * as loops (2 vpmaddubsw in the whole Q6_K matvec), with the tile's vectors
 * copied between iterations; in the GEMM the tile lives in registers only
 * if unrolled. */
#define UNROLL _Pragma("GCC unroll 16")

ALWAYS_INLINE __m256i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

ALWAYS_INLINE __m256i ld(const uint32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Two f16 per dword (lo16, hi16) of 8 rows -> two f32 vectors. */
ALWAYS_INLINE void half_pair(__m256i w, __m256 *lo, __m256 *hi)
{
    __m256i l = _mm256_and_si256(w, _mm256_set1_epi32(0xffff)), h = _mm256_srli_epi32(w, 16);
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(l, h), 0xd8);
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1));
}

/* Fields 2j and 2j+1 (scale, min of sub-block j) as one 12-bit value at bit
 * 12j of the stream (one load and shift; a second where it straddles). */
ALWAYS_INLINE __m256i field12(const uint32_t *scb, uint64_t rows, uint64_t r, unsigned j)
{
    unsigned bit = 12 * j, wi = bit / 32, sh = bit % 32;
    __m256i v = _mm256_srl_epi32(ld(scb + wi * rows + r), _mm_cvtsi32_si128((int)sh));
    if (sh > 20)
        v = _mm256_or_si256(v, _mm256_sll_epi32(ld(scb + (wi + 1) * rows + r), _mm_cvtsi32_si128((int)(32 - sh))));
    return v;
}

/* Per-token view of one 32-wide activation block. */
typedef struct tok32 {
    __m256i a[8];        /* bcast of a[4w..4w+3], w = 0..7 */
    int32_t suma;
    float   sumaf;       /* (float)suma: exact, |suma| <= 32*127 */
    float   da;
} tok32;

ALWAYS_INLINE void tok_load(tok32 *t, const jlm_act_q8 *a, uint64_t s)
{
    UNROLL for (int w = 0; w < 8; w++)
        t->a[w] = bcast4(a->q + 32 * s + 4 * w);
    t->suma = a->sum16[2 * s] + a->sum16[2 * s + 1];
    t->sumaf = (float)t->suma;
    t->da = a->d[s];
}

/* ---------------------------------------------------------------- 4-bit cores */

/* dot of a 4-word nibble sub-block (8 rows) with NT tokens; split done once. */
ALWAYS_INLINE void dot_nib(const uint32_t *col, uint64_t rows, uint64_t r, int nt,
                           const tok32 *tk, __m256i *out)
{
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi16(1);
    __m256i acc[MAXT];
    UNROLL for (int t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_si256();
    UNROLL for (int w = 0; w < 4; w++) {
        __m256i v = ld(col + w * rows + r);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        UNROLL for (int t = 0; t < nt; t++) {
            acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(lo, tk[t].a[w]));
            acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(hi, tk[t].a[w + 4]));
        }
    }
    UNROLL for (int t = 0; t < nt; t++)
        out[t] = _mm256_madd_epi16(acc[t], one);
}

/* Q4_0: y += (d*da) * (dot - 8*suma). */
ALWAYS_INLINE void q4_0_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                             uint64_t r0, uint64_t nv)
{
    uint64_t rows = m->rows, dcol = (rows + 1) / 2 * 2;
    const uint32_t *qs = m->qs;
    const uint16_t *d16 = m->d;
    for (uint64_t s = 0; s < m->k / 32; s++) {
        tok32 tk[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            tok_load(&tk[t], &xq[t], s);
        const uint32_t *col = qs + s * 4 * rows;
        for (uint64_t r = r0; r < nv; r += 8) {
            __m256i dot[MAXT];
            if ((r & 8) == 0)
                pf_flat(col, 4, rows, d16, dcol, 2, s, r, r0, nv);
            dot_nib(col, rows, r, nt, tk, dot);
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d16 + s * dcol + r)));
            UNROLL for (int t = 0; t < nt; t++) {
                __m256i is = _mm256_sub_epi32(dot[t], _mm256_set1_epi32(8 * tk[t].suma));
                float *yt = y + t * rows + r;
                __m256 acc = s ? _mm256_loadu_ps(yt) : _mm256_setzero_ps();
                acc = MULADD(_mm256_mul_ps(d, _mm256_set1_ps(tk[t].da)), _mm256_cvtepi32_ps(is), acc);
                _mm256_storeu_ps(yt, acc);
            }
        }
    }
}

/* ---------------------------------------------------------------- 5-bit and MXFP4 cores */

/* dot of a 5-word sub-block (4 nibble words + 1 word of high bits, 7.5: the
 * high bit of element 4w+b is bit w of byte b, of element 16+4w+b bit 4+w).
 * Codes <= 31: a vpmaddubsw pair is at most 7874, so 4 pairs (2 words) are
 * summed in s16 (31496) before widening. */
ALWAYS_INLINE void dot_nib5(const uint32_t *col, uint64_t rows, uint64_t r, int nt,
                            const tok32 *tk, __m256i *out)
{
    const __m256i m4 = _mm256_set1_epi8(15), m10 = _mm256_set1_epi8(0x10), one = _mm256_set1_epi16(1);
    __m256i hb = ld(col + 4 * rows + r), hl = _mm256_slli_epi32(hb, 4);
    UNROLL for (int t = 0; t < nt; t++)
        out[t] = _mm256_setzero_si256();
    UNROLL for (int w2 = 0; w2 < 4; w2 += 2) {
        __m256i acc[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
        UNROLL for (int w = w2; w < w2 + 2; w++) {
            __m256i v = ld(col + w * rows + r);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi32(hl, w), m10));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi32(hb, w), m10));
            UNROLL for (int t = 0; t < nt; t++) {
                acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(lo, tk[t].a[w]));
                acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(hi, tk[t].a[w + 4]));
            }
        }
        UNROLL for (int t = 0; t < nt; t++)
            out[t] = _mm256_add_epi32(out[t], _mm256_madd_epi16(acc[t], one));
    }
}

/* MXFP4: codes through the doubled-plus-12 table (values 0..24, vpshufb); a
 * pair is at most 6096, so 4 pairs (2 words) share an s16 sum (24384). */
ALWAYS_INLINE void dot_mx(const uint32_t *col, uint64_t rows, uint64_t r, int nt,
                          const tok32 *tk, __m256i *out)
{
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    UNROLL for (int t = 0; t < nt; t++)
        out[t] = _mm256_setzero_si256();
    UNROLL for (int w2 = 0; w2 < 4; w2 += 2) {
        __m256i acc[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
        UNROLL for (int w = w2; w < w2 + 2; w++) {
            __m256i v = ld(col + w * rows + r);
            __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
            __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            UNROLL for (int t = 0; t < nt; t++) {
                acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(lo, tk[t].a[w]));
                acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(hi, tk[t].a[w + 4]));
            }
        }
        UNROLL for (int t = 0; t < nt; t++)
            out[t] = _mm256_add_epi32(out[t], _mm256_madd_epi16(acc[t], one));
    }
}

/* Q5_0: y += (d*da)*(dot - 16*suma); MXFP4: y += (e*da)*(dot' - 12*suma), e
 * the f32 with bits byte << 23; Q5_1: y += ((d*da)*dot - (b*da)*suma). The
 * same operations in the same order as the reference (bit-identical). */
ALWAYS_INLINE void sub32_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                              uint64_t r0, uint64_t nv, int type)
{
    uint64_t rows = m->rows, W = type == JLM_T_MXFP4 ? 4 : 5;
    uint64_t dcol = type == JLM_T_Q5_0 ? (rows + 1) / 2 * 2 : (rows + 3) / 4 * 4;
    const uint32_t *qs = m->qs, *dp = m->d;
    const uint16_t *d16 = m->d;
    const uint8_t *d8 = m->d;
    int32_t bias = type == JLM_T_Q5_0 ? 16 : 12;
    for (uint64_t s = 0; s < m->k / 32; s++) {
        tok32 tk[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            tok_load(&tk[t], &xq[t], s);
        const uint32_t *col = qs + s * W * rows;
        for (uint64_t r = r0; r < nv; r += 8) {
            __m256i dot[MAXT];
            if ((r & 8) == 0)
                pf_sub32(col, (unsigned)W, rows, m->d, dcol, type, s, r, r0, nv);
            if (type == JLM_T_MXFP4)
                dot_mx(col, rows, r, nt, tk, dot);
            else
                dot_nib5(col, rows, r, nt, tk, dot);
            UNROLL for (int t = 0; t < nt; t++) {
                float *yt = y + t * rows + r;
                __m256 acc = s ? _mm256_loadu_ps(yt) : _mm256_setzero_ps(), da = _mm256_set1_ps(tk[t].da);
                if (type == JLM_T_Q5_1) {
                    __m256 d, b;
                    half_pair(ld(dp + s * rows + r), &d, &b);
                    __m256 pd = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(dot[t]));
                    __m256 pb = _mm256_mul_ps(_mm256_mul_ps(b, da), _mm256_set1_ps(tk[t].sumaf));
                    acc = _mm256_add_ps(acc, _mm256_sub_ps(pd, pb));
                } else {
                    __m256 d = type == JLM_T_Q5_0
                        ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d16 + s * dcol + r)))
                        : _mm256_castsi256_ps(_mm256_slli_epi32(
                              _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(d8 + s * dcol + r))), 23));
                    __m256i is = _mm256_sub_epi32(dot[t], _mm256_set1_epi32(bias * tk[t].suma));
                    acc = MULADD(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(is), acc);
                }
                _mm256_storeu_ps(yt, acc);
            }
        }
    }
}

ALWAYS_INLINE void q5_0_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y, uint64_t r0, uint64_t nv)
{
    sub32_core(m, xq, nt, y, r0, nv, JLM_T_Q5_0);
}
ALWAYS_INLINE void q5_1_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y, uint64_t r0, uint64_t nv)
{
    sub32_core(m, xq, nt, y, r0, nv, JLM_T_Q5_1);
}
ALWAYS_INLINE void mxfp4_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y, uint64_t r0, uint64_t nv)
{
    sub32_core(m, xq, nt, y, r0, nv, JLM_T_MXFP4);
}

/* Q4_K (W 4), Q5_K (W 5): y += da * (d*(sc*dot) - dmin*(m*suma)). KP
 * consecutive sub-blocks of one super-block per pass over the rows: d/dmin
 * decoded once per KP, y kept in a register across them (the reference's f32
 * operations in its order). KP = 1 here: 2 was chosen on AVX-512 machines
 * running this variant, but the CPUs that run it (no AVX-512) lose by it: on
 * a Zen 3 EPYC, KP = 2 ran Q4_K at 0.65-0.7x of KP = 1 from cache and from DRAM
 * (docs/kernels.md). */
#ifndef JLM_K32_KP
#define JLM_K32_KP 1
#endif
/* One pass of KP sub-blocks from s0 (j0 = s0 % 8) over the rows; j0 is a
 * constant where k32_core calls it, so the scale fields' shifts are too. */
ALWAYS_INLINE void k32_pass(const jlm_k_mat *m, tok32 (*tk)[MAXT], int nt, float *y,
                            uint64_t r0, uint64_t nv, unsigned W, uint64_t s0, unsigned j0)
{
    enum { KP = JLM_K32_KP };
    uint64_t rows = m->rows, sb = s0 / 8;
    const uint32_t *qs = m->qs, *dp = m->d, *scp = m->sc;
    const uint32_t *scb = scp + sb * 3 * rows;
    const __m256i m63 = _mm256_set1_epi32(63);
    for (uint64_t r = r0; r < nv; r += 8) {
        __m256 d, dmin, sc[KP], mn[KP];
        if ((r & 8) == 0)
            pf_k32(qs, dp, scp, rows, W, KP, s0, r, r0, nv);
        half_pair(ld(dp + sb * rows + r), &d, &dmin);
        /* sc*dot < 2^24 and m*suma < 2^24: the f32 products are exact, so
         * they equal the reference's (float)(sc*dot) and (float)(m*suma) */
        UNROLL for (int p = 0; p < KP; p++) {
            __m256i f = field12(scb, rows, r, j0 + p);
            sc[p] = _mm256_cvtepi32_ps(_mm256_and_si256(f, m63));
            mn[p] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(f, 6), m63));
        }
        __m256 acc[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            acc[t] = s0 ? _mm256_loadu_ps(y + t * rows + r) : _mm256_setzero_ps();
        UNROLL for (int p = 0; p < KP; p++) {
            const uint32_t *col = qs + (s0 + p) * W * rows;
            __m256i dot[MAXT];
            if (W == 5)
                dot_nib5(col, rows, r, nt, tk[p], dot);
            else
                dot_nib(col, rows, r, nt, tk[p], dot);
            UNROLL for (int t = 0; t < nt; t++) {
                __m256 a = _mm256_mul_ps(sc[p], _mm256_cvtepi32_ps(dot[t]));
                __m256 b = _mm256_mul_ps(mn[p], _mm256_set1_ps(tk[p][t].sumaf));
                __m256 v = NMULADD(dmin, b, _mm256_mul_ps(d, a));
                acc[t] = MULADD(_mm256_set1_ps(tk[p][t].da), v, acc[t]);
            }
        }
        UNROLL for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(y + t * rows + r, acc[t]);
    }
}

ALWAYS_INLINE void k32_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                            uint64_t r0, uint64_t nv, unsigned W)
{
    enum { KP = JLM_K32_KP };
    for (uint64_t s0 = 0; s0 < m->k / 32; s0 += KP) {
        tok32 tk[KP][MAXT];
        UNROLL for (int p = 0; p < KP; p++)
            UNROLL for (int t = 0; t < nt; t++)
                tok_load(&tk[p][t], &xq[t], s0 + p);
        switch (s0 % 8) {   /* KP = 1: every j0 */
        case 0: k32_pass(m, tk, nt, y, r0, nv, W, s0, 0); break;
        case 1: k32_pass(m, tk, nt, y, r0, nv, W, s0, 1); break;
        case 2: k32_pass(m, tk, nt, y, r0, nv, W, s0, 2); break;
        case 3: k32_pass(m, tk, nt, y, r0, nv, W, s0, 3); break;
        case 4: k32_pass(m, tk, nt, y, r0, nv, W, s0, 4); break;
        case 5: k32_pass(m, tk, nt, y, r0, nv, W, s0, 5); break;
        case 6: k32_pass(m, tk, nt, y, r0, nv, W, s0, 6); break;
        default: k32_pass(m, tk, nt, y, r0, nv, W, s0, 7); break;
        }
    }
}

ALWAYS_INLINE void q4_k_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y, uint64_t r0, uint64_t nv)
{
    k32_core(m, xq, nt, y, r0, nv, 4);
}
ALWAYS_INLINE void q5_k_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y, uint64_t r0, uint64_t nv)
{
    k32_core(m, xq, nt, y, r0, nv, 5);
}

/* ---------------------------------------------------------------- Q3_K */

/* Q3_K: 16-wide sub-blocks of 2 nibble words (byte j: element j low, j+8
 * high); per 32-block isum = sum_h (sc_h - 32) * (dot_h - 4*sum16_h),
 * y += (d*da) * isum. 4 vpmaddubsw per sub-block fit s16 (4*3810). */
ALWAYS_INLINE void q3_k_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                             uint64_t r0, uint64_t nv)
{
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi16(1);
    uint64_t rows = m->rows;
    const uint32_t *qs = m->qs, *dp = m->d, *scp = m->sc;
    for (uint64_t b = 0; b < m->k / 32; b++) {
        tok32 tk[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            tok_load(&tk[t], &xq[t], b);
        const __m128i c8a = _mm_cvtsi32_si128((int)(8 * ((2 * b) % 4)));
        const __m128i c8b = _mm_cvtsi32_si128((int)(8 * ((2 * b + 1) % 4)));
        const uint32_t *scw = scp + (2 * b / 4) * rows, *dw = dp + (b / 8) * rows;
        for (uint64_t r = r0; r < nv; r += 8) {
            __m256i is[MAXT];
            UNROLL for (int t = 0; t < nt; t++)
                is[t] = _mm256_setzero_si256();
            if ((r & 8) == 0)
                pf_k16(qs, dp, scp, rows, 2, b, r, r0, nv);
            __m256i scv = ld(scw + r);
            UNROLL for (int h = 0; h < 2; h++) {
                const uint32_t *col = qs + (2 * b + h) * 2 * rows + r;
                __m256i acc[MAXT];
                UNROLL for (int t = 0; t < nt; t++)
                    acc[t] = _mm256_setzero_si256();
                UNROLL for (int p = 0; p < 2; p++) {
                    __m256i v = ld(col + p * rows);
                    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    UNROLL for (int t = 0; t < nt; t++)
                        acc[t] = _mm256_add_epi16(acc[t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, tk[t].a[4 * h + p]),
                                                                           _mm256_maddubs_epi16(hi, tk[t].a[4 * h + 2 + p])));
                }
                __m256i sc = _mm256_sub_epi32(_mm256_and_si256(_mm256_srl_epi32(scv, h ? c8b : c8a),
                                                               _mm256_set1_epi32(0xff)), _mm256_set1_epi32(32));
                UNROLL for (int t = 0; t < nt; t++) {
                    __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(acc[t], one),
                                                   _mm256_set1_epi32(4 * xq[t].sum16[2 * b + h]));
                    is[t] = _mm256_add_epi32(is[t], _mm256_mullo_epi32(sc, dot));
                }
            }
            __m256 d, unused;
            half_pair(ld(dw + r), &d, &unused);
            UNROLL for (int t = 0; t < nt; t++) {
                float *yt = y + t * rows + r;
                __m256 a = b ? _mm256_loadu_ps(yt) : _mm256_setzero_ps();
                a = MULADD(_mm256_mul_ps(d, _mm256_set1_ps(tk[t].da)), _mm256_cvtepi32_ps(is[t]), a);
                _mm256_storeu_ps(yt, a);
            }
        }
    }
}

/* ---------------------------------------------------------------- Q8_0 */

ALWAYS_INLINE void q8_0_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                             uint64_t r0, uint64_t nv)
{
    const __m256i one = _mm256_set1_epi16(1);
    uint64_t rows = m->rows, dcol = (rows + 1) / 2 * 2;
    const uint32_t *qs = m->qs;
    const uint16_t *d16 = m->d;
    for (uint64_t s = 0; s < m->k / 32; s++) {
        tok32 tk[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            tok_load(&tk[t], &xq[t], s);
        const uint32_t *col = qs + s * 8 * rows;
        for (uint64_t r = r0; r < nv; r += 8) {
            __m256i acc[MAXT];
            if ((r & 8) == 0)
                pf_flat(col, 8, rows, d16, dcol, 2, s, r, r0, nv);
            UNROLL for (int t = 0; t < nt; t++)
                acc[t] = _mm256_setzero_si256();
            UNROLL for (int w = 0; w < 8; w++) {
                __m256i v = ld(col + w * rows + r), av = _mm256_abs_epi8(v);
                UNROLL for (int t = 0; t < nt; t++) {
                    __m256i p = _mm256_maddubs_epi16(av, _mm256_sign_epi8(tk[t].a[w], v));
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, one));
                }
            }
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d16 + s * dcol + r)));
            UNROLL for (int t = 0; t < nt; t++) {
                float *yt = y + t * rows + r;
                __m256 a = s ? _mm256_loadu_ps(yt) : _mm256_setzero_ps();
                a = MULADD(_mm256_mul_ps(d, _mm256_set1_ps(tk[t].da)), _mm256_cvtepi32_ps(acc[t]), a);
                _mm256_storeu_ps(yt, a);
            }
        }
    }
}

/* ---------------------------------------------------------------- Q6_K */

/* Q6_K (see matvec_avx512.c): codes 0..63, so a vpmaddubsw pair is at most
 * 2*63*127 = 16002 and the lo and hi halves of one word may share an s16 add. */
ALWAYS_INLINE void q6_k_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                             uint64_t r0, uint64_t nv)
{
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30), one = _mm256_set1_epi16(1);
    uint64_t rows = m->rows;
    const uint32_t *qs = m->qs, *dp = m->d, *scp = m->sc;
    for (uint64_t b = 0; b < m->k / 32; b++) {
        tok32 tk[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            tok_load(&tk[t], &xq[t], b);
        const __m128i c8a = _mm_cvtsi32_si128((int)(8 * ((2 * b) % 4)));
        const __m128i c8b = _mm_cvtsi32_si128((int)(8 * ((2 * b + 1) % 4)));
        const uint32_t *scw = scp + (2 * b / 4) * rows, *dw = dp + (b / 8) * rows;
        for (uint64_t r = r0; r < nv; r += 8) {
            __m256i is[MAXT];
            UNROLL for (int t = 0; t < nt; t++)
                is[t] = _mm256_setzero_si256();
            if ((r & 8) == 0)
                pf_k16(qs, dp, scp, rows, 3, b, r, r0, nv);
            __m256i scv = ld(scw + r);
            UNROLL for (int h = 0; h < 2; h++) {
                const uint32_t *col = qs + (2 * b + h) * 3 * rows + r;
                __m256i hb = ld(col + 2 * rows), acc[MAXT];
                UNROLL for (int t = 0; t < nt; t++)
                    acc[t] = _mm256_setzero_si256();
                UNROLL for (int p = 0; p < 2; p++) {
                    __m256i v = ld(col + p * rows);
                    __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4),
                                                 _mm256_and_si256(p ? _mm256_slli_epi32(hb, 2) : _mm256_slli_epi32(hb, 4), m30));
                    __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                                 _mm256_and_si256(p ? _mm256_srli_epi32(hb, 2) : hb, m30));
                    UNROLL for (int t = 0; t < nt; t++) {
                        __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, tk[t].a[4 * h + p]),
                                                       _mm256_maddubs_epi16(hi, tk[t].a[4 * h + 2 + p]));
                        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s16, one));
                    }
                }
                __m256i sc = _mm256_sub_epi32(_mm256_and_si256(_mm256_srl_epi32(scv, h ? c8b : c8a),
                                                               _mm256_set1_epi32(0xff)), _mm256_set1_epi32(128));
                UNROLL for (int t = 0; t < nt; t++) {
                    __m256i dot = _mm256_sub_epi32(acc[t], _mm256_set1_epi32(32 * xq[t].sum16[2 * b + h]));
                    is[t] = _mm256_add_epi32(is[t], _mm256_mullo_epi32(sc, dot));
                }
            }
            __m256 d, unused;
            half_pair(ld(dw + r), &d, &unused);
            UNROLL for (int t = 0; t < nt; t++) {
                float *yt = y + t * rows + r;
                __m256 a = b ? _mm256_loadu_ps(yt) : _mm256_setzero_ps();
                a = MULADD(_mm256_mul_ps(d, _mm256_set1_ps(tk[t].da)), _mm256_cvtepi32_ps(is[t]), a);
                _mm256_storeu_ps(yt, a);
            }
        }
    }
}

/* ---------------------------------------------------------------- float types (along k) */

ALWAYS_INLINE __m256 load8f(const void *w, int type, uint64_t i)
{
    if (type == JLM_T_F32)
        return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (type == JLM_T_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ALWAYS_INLINE void float_rows(const jlm_k_mat *m, const float *x, float *y, uint64_t r0, uint64_t r1, int type)
{
    uint64_t k = m->k, kv = k / 32 * 32, es = type == JLM_T_F32 ? 4 : 2;
    for (uint64_t r = r0; r < r1; r++) {
        const uint8_t *w = (const uint8_t *)m->qs + r * k * es;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint64_t i = 0; i < kv; i += 32) {
            a0 = MULADD(load8f(w, type, i), _mm256_loadu_ps(x + i), a0);
            a1 = MULADD(load8f(w, type, i + 8), _mm256_loadu_ps(x + i + 8), a1);
            a2 = MULADD(load8f(w, type, i + 16), _mm256_loadu_ps(x + i + 16), a2);
            a3 = MULADD(load8f(w, type, i + 24), _mm256_loadu_ps(x + i + 24), a3);
        }
        float acc = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (uint64_t i = kv; i < k; i++) {
            float wi = type == JLM_T_F32 ? ((const float *)w)[i]
                     : type == JLM_T_F16 ? jlm_k_fp16_to_f32(((const uint16_t *)w)[i])
                                          : jlm_k_bf16_to_f32(((const uint16_t *)w)[i]);
            acc += wi * x[i];
        }
        y[r] = acc;
    }
}

/* ---------------------------------------------------------------- entry points */

/* matvec = core with one token; matmul = groups of 4 tokens, then singles. */
#define DEFINE_Q(name, core)                                                                  \
    static void mv_##name(const jlm_k_mat *m, const float *x, const jlm_act_q8 *xq, float *y, \
                          uint64_t r0, uint64_t r1)                                           \
    {                                                                                         \
        uint64_t nv = r0 + (r1 - r0) / 8 * 8;                                                 \
        if (nv > r0)                                                                          \
            core(m, xq, 1, y, r0, nv);                                                        \
        if (nv < r1)                                                                          \
            jlm_k_matvec_ref(m, x, xq, y, nv, r1);                                            \
    }                                                                                         \
    static void mm_##name(const jlm_k_mat *m, uint64_t n, const float *x, const jlm_act_q8 *xq, \
                          float *y, uint64_t r0, uint64_t r1)                                 \
    {                                                                                         \
        uint64_t nv = r0 + (r1 - r0) / 8 * 8, t = 0;                                          \
        for (; nv > r0 && t + MAXT <= n; t += MAXT)                                           \
            core(m, xq + t, MAXT, y + t * m->rows, r0, nv);                                   \
        for (; nv > r0 && t < n; t++)                                                         \
            core(m, xq + t, 1, y + t * m->rows, r0, nv);                                      \
        if (nv < r1)                                                                          \
            jlm_k_matmul_ref(m, n, x, xq, y, nv, r1);                                         \
    }

DEFINE_Q(q4_0, q4_0_core)
DEFINE_Q(q4_k, q4_k_core)
DEFINE_Q(q8_0, q8_0_core)
DEFINE_Q(q6_k, q6_k_core)
DEFINE_Q(q5_0, q5_0_core)
DEFINE_Q(q5_1, q5_1_core)
DEFINE_Q(mxfp4, mxfp4_core)
DEFINE_Q(q5_k, q5_k_core)
DEFINE_Q(q3_k, q3_k_core)

/* ---------------------------------------------------------------- GEMM (prefill) */

/* The AVX-512 file's GEMM (register tile of rows x tokens, each weight word
 * loaded and decoded once per tile and fed to every token of the tile; rows
 * in blocks of RB, sub-blocks outer, the block's accumulators in L1) on 8-row
 * ymm tiles and without VNNI; inside a 32-block the tokens go one at a time
 * over its decoded weights (g_sub). Each step takes two decoded weight vectors x0,
 * x1 (u8 codes) and their activation words; per token vpmaddubsw of both are
 * added in s16 and, every G steps, widened by vpmaddwd into the int32 dot,
 * which is seeded with -bias*sum(a). Exact (no s16 saturation) because
 * |a| <= 127 and the codes are bounded: a vpmaddubsw pair is at most
 * 2*15*127 = 3810 (Q4_0, Q4_K, Q3_K: G = 4 steps = 8 pairs, 30480; Q3_K's
 * halves are 2 steps), 2*31*127 = 7874 (Q5_*: G = 2, 4 pairs, 31496),
 * 2*24*127 = 6096 (MXFP4: G = 2, 24384), 2*63*127 = 16002 (Q6_K: G = 1, 2
 * pairs, 32004). Q8_0 is signed: |w| x sign(a, w), a pair <= 2*128*127 =
 * 32512, widened per vpmaddubsw. So the int32 dots are the reference's and
 * the f32 epilogue is its operations in its order: bit-identical. */
/* Tokens per tile: the block's weights are decoded once per tile into 8
 * registers and each token in turn takes its dot and epilogue over them
 * (g_sub), so the tile's width is not bounded by registers; 16 measured
 * best on Zen 3 (8: 0.78-0.96x of it by type, 24 and 32: 0.9-0.97x). */
enum { NT = 16, SC = 8 };

/* Steps (of 4 per 32-block) summed in s16 before widening (see above). */
ALWAYS_INLINE int g_group(int type)
{
    return type == JLM_T_Q4_0 || type == JLM_T_Q4_K ? 4 : type == JLM_T_Q6_K ? 1 : 2;
}

/* What the codes of a type are offset by (the seed -bias*sum(a) undoes it);
 * 0: no seed (the dot starts at the first product). Q3_K and Q6_K (offset 4
 * and 32) have none here: their dot is scaled per half, and g_epi takes the
 * offset off once, scaled. */
ALWAYS_INLINE int32_t g_bias(int type)
{
    return type == JLM_T_Q4_0 ? 8 : type == JLM_T_Q5_0 ? 16 : type == JLM_T_MXFP4 ? 12 : 0;
}

/* The tile's activations for a chunk of SC 32-blocks (see matvec_avx512.c):
 * int8 values, scales, the int32 seeds -bias*sum(a) (Q3_K/Q6_K: the two
 * 16-halves' sums) and sum(a) as f32. */
typedef struct gseed {
    int8_t  q[SC][NT][32] __attribute__((aligned(32)));
    float   da[SC][NT];
    int32_t b0[SC][NT];   /* the seed; Q3_K/Q6_K: the halves' sums as an s16 pair */
    float   fs[SC][NT];
} gseed;

ALWAYS_INLINE void g_seed(gseed *z, const jlm_act_q8 *xq, int nt, uint64_t s0, uint64_t ns, int type)
{
    int k16 = type == JLM_T_Q3_K || type == JLM_T_Q6_K;
    int32_t bias = g_bias(type);
    for (int t = 0; t < nt; t++)
        for (uint64_t s = 0; s < ns; s++) {
            uint64_t b = s0 + s;
            int32_t a0 = xq[t].sum16[2 * b], a1 = xq[t].sum16[2 * b + 1];
            _mm256_store_si256((__m256i *)z->q[s][t], _mm256_loadu_si256((const __m256i *)(xq[t].q + 32 * b)));
            z->da[s][t] = xq[t].d[b];
            /* k16: the halves' sums as an s16 pair (|sum16| <= 16 * 127) for
             * the seed's vpmaddwd with the scale pair (g_epi) */
            z->b0[s][t] = k16 ? (int32_t)(((uint32_t)a0 & 0xffffu) | ((uint32_t)a1 << 16)) : -bias * (a0 + a1);
            z->fs[s][t] = (float)(a0 + a1);
        }
}

/* Step u (0..3) of 32-block s of rows [r, r+8): two decoded weight vectors
 * x0, x1 that pair with activation words i0, i1 (of 4 bytes); Q3_K/Q6_K:
 * both in 16-wide half u/2. Q8_0: the signed bytes as stored. */
ALWAYS_INLINE void g_step(const jlm_k_mat *m, uint64_t s, uint64_t r, int u, int type, __m256i hb,
                          __m256i *x0, __m256i *x1, int *i0, int *i1)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    uint64_t rows = m->rows;
    const uint32_t *qs = m->qs;
    *i0 = u;
    *i1 = u + 4;
    switch (type) {
    case JLM_T_Q4_0: case JLM_T_Q4_K: case JLM_T_MXFP4: {
        __m256i v = ld(qs + (s * 4 + u) * rows + r);
        *x0 = _mm256_and_si256(v, m4);
        *x1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (type == JLM_T_MXFP4) {
            const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                                 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
            *x0 = _mm256_shuffle_epi8(lut, *x0);
            *x1 = _mm256_shuffle_epi8(lut, *x1);
        }
        break;
    }
    case JLM_T_Q8_0:
        *x0 = ld(qs + (s * 8 + u) * rows + r);
        *x1 = ld(qs + (s * 8 + u + 4) * rows + r);
        break;
    case JLM_T_Q5_0: case JLM_T_Q5_1: case JLM_T_Q5_K: {
        const __m256i m10 = _mm256_set1_epi8(0x10);
        __m256i v = ld(qs + (s * 5 + u) * rows + r);
        *x0 = _mm256_or_si256(_mm256_and_si256(v, m4),
                              _mm256_and_si256(_mm256_srli_epi32(_mm256_slli_epi32(hb, 4), u), m10));
        *x1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi32(hb, u), m10));
        break;
    }
    case JLM_T_Q3_K: case JLM_T_Q6_K: {
        int h = u / 2, p = u % 2, q3 = type == JLM_T_Q3_K;
        __m256i v = ld(qs + ((2 * s + h) * (q3 ? 2 : 3) + p) * rows + r);
        *x0 = _mm256_and_si256(v, m4);
        *x1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (!q3) {
            const __m256i m30 = _mm256_set1_epi8(0x30);
            *x0 = _mm256_or_si256(*x0, _mm256_and_si256(p ? _mm256_slli_epi32(hb, 2) : _mm256_slli_epi32(hb, 4), m30));
            *x1 = _mm256_or_si256(*x1, _mm256_and_si256(p ? _mm256_srli_epi32(hb, 2) : hb, m30));
        }
        *i0 = 4 * h + p;
        *i1 = 4 * h + 2 + p;
        break;
    }
    }
}

/* The f32 epilogue's per-row factors of 32-block s, rows [r, r+8). */
typedef struct gfac {
    __m256 d, e, sc, mn;   /* scale; Q5_1 bias / K-quant dmin; Q4_K/Q5_K d*sc, dmin*m */
    __m256i sc0, sc1, scp; /* Q3_K/Q6_K: the two 16-halves' signed scales, each in both
                              s16 of a dword; scp: (sc0, sc1) in one dword */
} gfac;

ALWAYS_INLINE gfac g_factors(const jlm_k_mat *m, uint64_t s, uint64_t r, int type)
{
    uint64_t rows = m->rows;
    const uint32_t *dp = m->d, *scp = m->sc;
    const uint16_t *d16 = m->d;
    const uint8_t *d8 = m->d;
    gfac f = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
               _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256() };
    switch (type) {
    case JLM_T_Q4_0: case JLM_T_Q8_0: case JLM_T_Q5_0:
        f.d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d16 + s * ((rows + 1) / 2 * 2) + r)));
        break;
    case JLM_T_MXFP4:
        f.d = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(d8 + s * ((rows + 3) / 4 * 4) + r))), 23));
        break;
    case JLM_T_Q5_1:
        half_pair(ld(dp + s * rows + r), &f.d, &f.e);
        break;
    case JLM_T_Q4_K: case JLM_T_Q5_K: {
        /* d*sc and dmin*m once per tile, not per token: an f16 (11
         * significant bits) times a 6-bit integer is exact in f32, and so
         * are (float)dot and (float)sum(a) (< 2^24), so (d*sc)*dot rounds
         * the same exact product as the reference's d*(float)(sc*dot), and
         * (dmin*m)*sum(a) as its dmin*(float)(m*suma): bit-identical. */
        const __m256i m63 = _mm256_set1_epi32(63);
        __m256 d, dmin;
        half_pair(ld(dp + (s / 8) * rows + r), &d, &dmin);
        __m256i w = field12(scp + (s / 8) * 3 * rows, rows, r, (unsigned)(s % 8));
        f.sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(w, m63)));
        f.mn = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(w, 6), m63)));
        break;
    }
    case JLM_T_Q3_K: case JLM_T_Q6_K: {
        /* The two 16-halves' signed scales as the vpmaddwd multipliers of
         * their dots (sc, sc per dword: g_acc) and as one (sc0, sc1) pair
         * for the seed (g_epi). */
        const __m256i ff = _mm256_set1_epi32(0xff), off = _mm256_set1_epi32(type == JLM_T_Q3_K ? 32 : 128);
        const __m256i lo16 = _mm256_set1_epi32(0xffff);
        __m256i scv = ld(scp + (2 * s / 4) * rows + r);
        __m256i s0 = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(scv, (int)(8 * ((2 * s) % 4))), ff), off);
        __m256i s1 = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(scv, (int)(8 * ((2 * s + 1) % 4))), ff), off);
        f.sc0 = _mm256_or_si256(_mm256_and_si256(s0, lo16), _mm256_slli_epi32(s0, 16));
        f.sc1 = _mm256_or_si256(_mm256_and_si256(s1, lo16), _mm256_slli_epi32(s1, 16));
        f.scp = _mm256_or_si256(_mm256_and_si256(s0, lo16), _mm256_slli_epi32(s1, 16));
        half_pair(ld(dp + (s / 8) * rows + r), &f.d, &f.e);
        break;
    }
    }
    return f;
}

/* Token t's epilogue: *A += its contribution from the int32 dots, the
 * reference's f32 operations in its order. */
ALWAYS_INLINE void g_epi(const gfac *f, const gseed *z, uint64_t j, int t, __m256i dot, int type, float *A)
{
    __m256 da = _mm256_set1_ps(z->da[j][t]);
    switch (type) {
    case JLM_T_Q4_0: case JLM_T_Q8_0: case JLM_T_Q5_0: case JLM_T_MXFP4:
        _mm256_store_ps(A, MULADD(_mm256_mul_ps(f->d, da), _mm256_cvtepi32_ps(dot), _mm256_load_ps(A)));
        break;
    case JLM_T_Q5_1: {
        __m256 pd = _mm256_mul_ps(_mm256_mul_ps(f->d, da), _mm256_cvtepi32_ps(dot));
        __m256 pb = _mm256_mul_ps(_mm256_mul_ps(f->e, da), _mm256_set1_ps(z->fs[j][t]));
        _mm256_store_ps(A, _mm256_add_ps(_mm256_load_ps(A), _mm256_sub_ps(pd, pb)));
        break;
    }
    case JLM_T_Q4_K: case JLM_T_Q5_K: {
        __m256 v = NMULADD(f->mn, _mm256_set1_ps(z->fs[j][t]), _mm256_mul_ps(f->sc, _mm256_cvtepi32_ps(dot)));
        _mm256_store_ps(A, MULADD(da, v, _mm256_load_ps(A)));
        break;
    }
    case JLM_T_Q3_K: case JLM_T_Q6_K: {
        /* dot = sum_h sc_h * codes.a over the halves (g_acc); the seed
         * bias * sum_h sc_h * sum16_h in one vpmaddwd of the scale pair and
         * the token's sum pair: the reference's isum, exactly */
        __m256i seed = _mm256_madd_epi16(f->scp, _mm256_set1_epi32(z->b0[j][t]));
        __m256i is = _mm256_sub_epi32(dot, _mm256_slli_epi32(seed, type == JLM_T_Q3_K ? 2 : 5));
        _mm256_store_ps(A, MULADD(_mm256_mul_ps(f->d, da), _mm256_cvtepi32_ps(is), _mm256_load_ps(A)));
        break;
    }
    }
}

/* Step u's products for one token (activations q): added in s16 into *h16,
 * widened every G steps into *dot (Q3_K/Q6_K: by the 16-half's scale, so
 * *dot sums sc_h * dot_h over both halves); Q8_0 widens each product:
 * |w| x sign(a, w). */
ALWAYS_INLINE void g_acc(__m256i x0, __m256i x1, const int8_t *q, int i0, int i1, int u, int type, const gfac *f,
                         __m256i *h16, __m256i *dot)
{
    const int k16 = type == JLM_T_Q3_K || type == JLM_T_Q6_K, G = g_group(type);
    const __m256i one = _mm256_set1_epi16(1);
    if (type == JLM_T_Q8_0) {
        __m256i p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(x0), _mm256_sign_epi8(bcast4(q + 4 * i0), x0));
        __m256i p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(x1), _mm256_sign_epi8(bcast4(q + 4 * i1), x1));
        *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(p0, one));
        *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(p1, one));
        return;
    }
    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(x0, bcast4(q + 4 * i0)),
                                 _mm256_maddubs_epi16(x1, bcast4(q + 4 * i1)));
    *h16 = u % G ? _mm256_add_epi16(*h16, p) : p;
    if (u % G == G - 1) {   /* k16: widened by the half's scale (|h16 * sc| < 2^22) */
        __m256i w = _mm256_madd_epi16(*h16, k16 ? (u >= 2 ? f->sc1 : f->sc0) : one);
        *dot = u == G - 1 && !g_bias(type) ? w : _mm256_add_epi32(*dot, w);
    }
}

/* 32-block s (chunk index j of z) of rows [r, r+8) for tokens [0, nt):
 * A[t] (8 floats each) += its contribution. The block's weights are decoded
 * once into 8 registers (4 steps x 2 vectors); then each token in turn takes
 * its int32 dot and its epilogue, so nothing but the weights lives across
 * tokens. (Steps outer with every token's accumulators live, the first
 * version, held 2-3 vectors per token: 8, 6 or 4 tokens a tile, spilled,
 * and ran 0.7-0.85x of this.) */
ALWAYS_INLINE void g_sub(const jlm_k_mat *m, const gseed *z, uint64_t j, uint64_t s, uint64_t r, int nt, int type,
                         float (*A)[8])
{
    uint64_t rows = m->rows;
    const uint32_t *qs = m->qs;
    __m256i hb = _mm256_setzero_si256(), x0[4], x1[4];
    int i0[4], i1[4];
    if (type == JLM_T_Q5_0 || type == JLM_T_Q5_1 || type == JLM_T_Q5_K)
        hb = ld(qs + (s * 5 + 4) * rows + r);
    UNROLL for (int u = 0; u < 4; u++) {
        if (type == JLM_T_Q6_K && u % 2 == 0)
            hb = ld(qs + ((2 * s + u / 2) * 3 + 2) * rows + r);
        g_step(m, s, r, u, type, hb, &x0[u], &x1[u], &i0[u], &i1[u]);
    }
    gfac f = g_factors(m, s, r, type);
    UNROLL for (int t = 0; t < nt; t++) {
        __m256i zero = _mm256_setzero_si256(), h16 = zero;
        __m256i dot = g_bias(type) ? _mm256_set1_epi32(z->b0[j][t]) : zero;
        UNROLL for (int u = 0; u < 4; u++)
            g_acc(x0[u], x1[u], z->q[j][t], i0[u], i1[u], u, type, &f, &h16, &dot);
        g_epi(&f, z, j, t, dot, type, A[t]);
    }
}

/* Rows [r0, r1) (r1 - r0 a multiple of 8, at most RB) x tokens xq[0, nt):
 * y (nt, rows). Sub-blocks outer, the block's 8-row tiles inner: each
 * (sub-block, word) of the block is one contiguous run of (r1 - r0) * 4
 * bytes, and the block's accumulators A stay in L1 (see matvec_avx512.c). */
enum { RB = 128 };
ALWAYS_INLINE void g_block(const jlm_k_mat *m, const jlm_act_q8 *xq, float *y, uint64_t r0, uint64_t r1, int nt,
                           int nstore, int type)
{
    uint64_t nsub = m->k / 32, nrt = (r1 - r0) / 8;
    float A[RB / 8][NT][8] __attribute__((aligned(32)));
    memset(A, 0, sizeof A);
    for (uint64_t s0 = 0; s0 < nsub; s0 += SC) {
        uint64_t ns = nsub - s0 < SC ? nsub - s0 : SC;
        gseed z;
        g_seed(&z, xq, nt, s0, ns, type);
        for (uint64_t j = 0; j < ns; j++)
            for (uint64_t rt = 0; rt < nrt; rt++)
                g_sub(m, &z, j, s0 + j, r0 + 8 * rt, nt, type, A[rt]);
    }
    for (uint64_t rt = 0; rt < nrt; rt++)
        for (int t = 0; t < nstore; t++)
            memcpy(y + t * m->rows + r0 + 8 * rt, A[rt][t], sizeof A[rt][t]);
}

/* Tokens [0, n) x rows [r0, nv) in tiles of nt tokens, then of 4 (the last
 * one padded with copies of the last token, whose outputs are not stored). */
ALWAYS_INLINE void g_run(const jlm_k_mat *m, uint64_t n, const jlm_act_q8 *xq, float *y, uint64_t r0, uint64_t nv,
                         int type)
{
    const int nt = NT;
    for (uint64_t r = r0; r < nv; r += RB) {
        uint64_t re = nv - r < RB ? nv : r + RB, t = 0;
        for (; t + nt <= n; t += nt)
            g_block(m, xq + t, y + t * m->rows, r, re, nt, nt, type);
        for (; t < n; t += 4) {
            jlm_act_q8 pad[4];
            int left = n - t < 4 ? (int)(n - t) : 4;
            for (int i = 0; i < 4; i++)
                pad[i] = xq[t + (i < left ? i : left - 1)];
            g_block(m, pad, y + t * m->rows, r, re, 4, left, type);
        }
    }
}

/* The GEMM (g_run), the reference for rows after the last 8; fewer than 4
 * tokens go to the 4-token matmul (streaming the planes once bounds them). */
#define DEFINE_GEMM(name, type)                                                               \
    static void gm_##name(const jlm_k_mat *m, uint64_t n, const float *x, const jlm_act_q8 *xq, \
                          float *y, uint64_t r0, uint64_t r1)                                 \
    {                                                                                         \
        if (n < 4) {                                                                          \
            mm_##name(m, n, x, xq, y, r0, r1);                                                \
            return;                                                                           \
        }                                                                                     \
        uint64_t nv = r0 + (r1 - r0) / 8 * 8;                                                 \
        g_run(m, n, xq, y, r0, nv, type);                                                     \
        if (nv < r1)                                                                          \
            jlm_k_matmul_ref(m, n, x, xq, y, nv, r1);                                         \
    }
DEFINE_GEMM(q4_0, JLM_T_Q4_0)
DEFINE_GEMM(q4_k, JLM_T_Q4_K)
DEFINE_GEMM(q8_0, JLM_T_Q8_0)
DEFINE_GEMM(q6_k, JLM_T_Q6_K)
DEFINE_GEMM(q5_0, JLM_T_Q5_0)
DEFINE_GEMM(q5_1, JLM_T_Q5_1)
DEFINE_GEMM(mxfp4, JLM_T_MXFP4)
DEFINE_GEMM(q5_k, JLM_T_Q5_K)
DEFINE_GEMM(q3_k, JLM_T_Q3_K)

#define DEFINE_F(name, type)                                                                  \
    static void mv_##name(const jlm_k_mat *m, const float *x, const jlm_act_q8 *xq, float *y, \
                          uint64_t r0, uint64_t r1)                                           \
    {                                                                                         \
        float_rows(m, x, y, r0, r1, type);                                                    \
    }                                                                                         \
    static void mm_##name(const jlm_k_mat *m, uint64_t n, const float *x, const jlm_act_q8 *xq, \
                          float *y, uint64_t r0, uint64_t r1)                                 \
    {                                                                                         \
        for (uint64_t t = 0; t < n; t++)                                                      \
            float_rows(m, x + t * m->k, y + t * m->rows, r0, r1, type);                       \
    }
DEFINE_F(f32, JLM_T_F32)
DEFINE_F(f16, JLM_T_F16)
DEFINE_F(bf16, JLM_T_BF16)

/* ---------------------------------------------------------------- activations */
/* jlm_k_quantize_act, 8 lanes at a time, with the same operations: amax of
 * |x| (a NaN or inf makes the block bad), d = amax / 127 (a true division),
 * q = x / d rounded half away from zero (trunc, then +-1 when the exact
 * fraction is >= 0.5), clamped to [-127, 127]. Bit-identical to the
 * reference (tested). Hot: once per matmul input row. */
void jlm_k_quantize_act_avx2(const float *x, jlm_act_q8 *a)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 fmax = _mm256_set1_ps(3.4028235e38f), half = _mm256_set1_ps(0.5f);
    for (uint64_t b = 0; b < a->k / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v[4], mx = _mm256_setzero_ps();
        int bad = 0;
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            __m256 av = _mm256_and_ps(v[i], absmask);
            bad |= _mm256_movemask_ps(_mm256_cmp_ps(av, fmax, _CMP_NLE_UQ));   /* !(av <= max): inf, NaN */
            mx = _mm256_max_ps(mx, av);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        float d = bad ? NAN : amax / 127.0f;
        int8_t *q = a->q + 32 * b;
        a->d[b] = d;
        if (bad || d == 0.0f) {
            memset(q, 0, 32);
            a->sum16[2 * b] = a->sum16[2 * b + 1] = 0;
            continue;
        }
        const __m256 dv = _mm256_set1_ps(d);
        __m256i qi[4];
        for (int i = 0; i < 4; i++) {
            __m256 t = _mm256_div_ps(v[i], dv);
            __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m256 fr = _mm256_sub_ps(t, tr);
            __m256 up = _mm256_and_ps(_mm256_cmp_ps(fr, half, _CMP_GE_OQ), _mm256_set1_ps(1.0f));
            __m256 dn = _mm256_and_ps(_mm256_cmp_ps(fr, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), _mm256_set1_ps(1.0f));
            __m256i iv = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(tr, up), dn));
            qi[i] = _mm256_max_epi32(_mm256_min_epi32(iv, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
        }
        /* pack 32 int32 -> 32 int8 in element order, and the two sums of 16 */
        __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]), p23 = _mm256_packs_epi32(qi[2], qi[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q, p);
        __m256i s01 = _mm256_add_epi32(qi[0], qi[1]), s23 = _mm256_add_epi32(qi[2], qi[3]);
        int32_t t0[8], t1[8];
        _mm256_storeu_si256((__m256i *)t0, s01);
        _mm256_storeu_si256((__m256i *)t1, s23);
        int s0 = 0, s1 = 0;
        for (int i = 0; i < 8; i++) { s0 += t0[i]; s1 += t1[i]; }
        a->sum16[2 * b] = (int16_t)s0;
        a->sum16[2 * b + 1] = (int16_t)s1;
    }
}

/* F16C rounds to nearest even and quiets a NaN keeping its top payload
 * bits, as jlm_k_f32_to_fp16 does. */
void jlm_k_to_fp16_f16c(uint16_t *d, uint64_t stride, const float *x, uint64_t n)
{
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (stride == 1) {
            _mm_storeu_si128((__m128i *)(d + i), h);
        } else {
            uint16_t t[8];
            _mm_storeu_si128((__m128i *)t, h);
            for (int k = 0; k < 8; k++)
                d[(i + (uint64_t)k) * stride] = t[k];
        }
    }
    for (; i < n; i++)
        d[i * stride] = jlm_k_f32_to_fp16(x[i]);
}

void jlm_k_fill_avx2(jlm_k_cpu *t)
{
    t->to_fp16 = jlm_k_to_fp16_f16c;
    t->quantize_act = jlm_k_quantize_act_avx2;
    t->matvec[JLM_T_Q4_0] = mv_q4_0;
    t->matmul[JLM_T_Q4_0] = mm_q4_0;
    t->matvec[JLM_T_Q4_K] = mv_q4_k;
    t->matmul[JLM_T_Q4_K] = mm_q4_k;
    t->matvec[JLM_T_Q8_0] = mv_q8_0;
    t->matmul[JLM_T_Q8_0] = mm_q8_0;
    t->matvec[JLM_T_Q6_K] = mv_q6_k;
    t->matmul[JLM_T_Q6_K] = mm_q6_k;
    t->matvec[JLM_T_F32] = mv_f32;
    t->matvec[JLM_T_F16] = mv_f16;
    t->matvec[JLM_T_BF16] = mv_bf16;
    t->matmul[JLM_T_F32] = mm_f32;
    t->matmul[JLM_T_F16] = mm_f16;
    t->matmul[JLM_T_BF16] = mm_bf16;
    t->matvec[JLM_T_Q5_0] = mv_q5_0;
    t->matmul[JLM_T_Q5_0] = mm_q5_0;
    t->matvec[JLM_T_Q5_1] = mv_q5_1;
    t->matmul[JLM_T_Q5_1] = mm_q5_1;
    t->matvec[JLM_T_MXFP4] = mv_mxfp4;
    t->matmul[JLM_T_MXFP4] = mm_mxfp4;
    t->matvec[JLM_T_Q5_K] = mv_q5_k;
    t->matmul[JLM_T_Q5_K] = mm_q5_k;
    t->matvec[JLM_T_Q3_K] = mv_q3_k;
    t->matmul[JLM_T_Q3_K] = mm_q3_k;
    t->native = 1u << JLM_T_Q4_0 | 1u << JLM_T_Q4_K | 1u << JLM_T_Q8_0 | 1u << JLM_T_Q6_K |
                1u << JLM_T_Q5_0 | 1u << JLM_T_Q5_1 | 1u << JLM_T_MXFP4 | 1u << JLM_T_Q5_K |
                1u << JLM_T_Q3_K | 1u << JLM_T_F32 | 1u << JLM_T_F16 | 1u << JLM_T_BF16;
    t->native_mm = t->native;
    /* the 4-token matmuls stay as matmul4; matmul becomes the tiled GEMM */
    memcpy(t->matmul4, t->matmul, sizeof t->matmul);
    t->matmul[JLM_T_Q4_0] = gm_q4_0;
    t->matmul[JLM_T_Q4_K] = gm_q4_k;
    t->matmul[JLM_T_Q8_0] = gm_q8_0;
    t->matmul[JLM_T_Q6_K] = gm_q6_k;
    t->matmul[JLM_T_Q5_0] = gm_q5_0;
    t->matmul[JLM_T_Q5_1] = gm_q5_1;
    t->matmul[JLM_T_MXFP4] = gm_mxfp4;
    t->matmul[JLM_T_Q5_K] = gm_q5_k;
    t->matmul[JLM_T_Q3_K] = gm_q3_k;
    t->native_gemm = 1u << JLM_T_Q4_0 | 1u << JLM_T_Q4_K | 1u << JLM_T_Q8_0 | 1u << JLM_T_Q6_K |
                     1u << JLM_T_Q5_0 | 1u << JLM_T_Q5_1 | 1u << JLM_T_MXFP4 | 1u << JLM_T_Q5_K |
                     1u << JLM_T_Q3_K;
}
