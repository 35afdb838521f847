/* matvec_avx512.c - AVX-512 F/BW/VL/DQ + VNNI matvec/matmul, vectorized
 * ACROSS ROWS (16 rows per 64-byte load).
 *
 * Same loop order as matvec_avx2.c (sub-block outer, rows inner: storage
 * order), with vpdpbusd doing u8 x s8 -> int32 per row lane directly.
 * Unsigned codes (nibbles, MXFP4 table values) feed it as they are; signed
 * Q8_0 bytes are flipped to w + 128 and 128*sum(a) is taken off the int32,
 * exact because the activations' 32-block sums are known.
 *
 * matmul is a register-tiled GEMM (section GEMM below); matmul4 reuses each
 * weight load for up to 4 tokens. Rows after the last full
 * group of 16 go through the reference (the shared scalar tail). Quantized
 * types are bit-identical to the reference (its f32 operations in its order,
 * no FMA; docs/kernels.md). */
#include "kernels/cpu/kernels.h"
/* Where the software prefetch puts its lines (prefetch.h): L2 here; compiled
 * a second time with L1 (matvec_l1_avx512.c) under another fill function.
 * dispatch.c picks one per CPU (jlm_k_cpu_pf_default). */
#ifndef JLM_PF_HINT
#define JLM_PF_HINT _MM_HINT_T2
#define JLM_K_FILL_AVX512 jlm_k_fill_avx512
#endif
#include "kernels/cpu/prefetch.h"

#include <immintrin.h>
#define MULADD(a, b, c) _mm512_add_ps(_mm512_mul_ps((a), (b)), (c))   /* no FMA: the same roundings as the reference */
#define NMULADD(a, b, c) _mm512_sub_ps((c), _mm512_mul_ps((a), (b)))
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define MAXT 4
#define UNROLL _Pragma("GCC unroll 16")   /* small loops (words, halves, sub-blocks of a pass, tokens) as straight code */

ALWAYS_INLINE __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

ALWAYS_INLINE __m512i ld(const uint32_t *p) { return _mm512_loadu_si512((const void *)p); }

ALWAYS_INLINE __m512 cvt16h(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Two f16 per dword (lo16, hi16) of 16 rows -> two f32 vectors. */
ALWAYS_INLINE void half_pair(__m512i w, __m512 *lo, __m512 *hi)
{
    /* one vpermw: the 16 low halves to the low 256 bits, the high halves above */
    const __m512i idx = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
                                         30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    __m512i p = _mm512_permutexvar_epi16(idx, w);
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(p));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(p, 1));
}

typedef struct tok32 {
    __m512i a[8];        /* bcast of a[4w..4w+3], w = 0..7 */
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

/* The word loops of a sub-block's dot: straight code (UNROLL) for the
 * K-quants and Q8_0, a loop (ROLLED) for Q4_0, Q5_0, Q5_1 and MXFP4. Unrolled,
 * every type ran faster from L3 (Q4_0 1.35x, MXFP4 1.14x), but end to end
 * Q4_0 and MXFP4 decoded 10% slower from DRAM at one thread (docs/kernels.md);
 * the same int32 dots either way. */
#define ROLLED _Pragma("GCC unroll 1")

ALWAYS_INLINE void nib_word(const uint32_t *col, uint64_t rows, uint64_t r, int w, int nt,
                            const tok32 *tk, __m512i *acc)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512i v = ld(col + w * rows + r);
    __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    UNROLL for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_dpbusd_epi32(acc[t], lo, tk[t].a[w]);
        acc[t] = _mm512_dpbusd_epi32(acc[t], hi, tk[t].a[w + 4]);
    }
}

ALWAYS_INLINE void dot_nib(const uint32_t *col, uint64_t rows, uint64_t r, int nt,
                           const tok32 *tk, __m512i *acc, int unrolled)
{
    UNROLL for (int t = 0; t < nt; t++)
        acc[t] = _mm512_setzero_si512();
    if (unrolled) {
        UNROLL for (int w = 0; w < 4; w++)
            nib_word(col, rows, r, w, nt, tk, acc);
    } else {
        ROLLED for (int w = 0; w < 4; w++)
            nib_word(col, rows, r, w, nt, tk, acc);
    }
}

ALWAYS_INLINE void acc_y(float *yt, uint64_t s, __m512 scale, __m512i is)
{
    __m512 a = s ? _mm512_loadu_ps(yt) : _mm512_setzero_ps();
    _mm512_storeu_ps(yt, MULADD(scale, _mm512_cvtepi32_ps(is), a));
}

/* ---------------------------------------------------------------- Q4_0, Q8_0, Q4_K */

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
        for (uint64_t r = r0; r < nv; r += 16) {
            __m512i dot[MAXT];
            pf_flat(col, 4, rows, d16, dcol, 2, s, r, r0, nv);
            dot_nib(col, rows, r, nt, tk, dot, 0);
            __m512 d = cvt16h(d16 + s * dcol + r);
            UNROLL for (int t = 0; t < nt; t++)
                acc_y(y + t * rows + r, s, _mm512_mul_ps(d, _mm512_set1_ps(tk[t].da)),
                      _mm512_sub_epi32(dot[t], _mm512_set1_epi32(8 * tk[t].suma)));
        }
    }
}

ALWAYS_INLINE void q8_0_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                             uint64_t r0, uint64_t nv)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    uint64_t rows = m->rows, dcol = (rows + 1) / 2 * 2;
    const uint32_t *qs = m->qs;
    const uint16_t *d16 = m->d;
    for (uint64_t s = 0; s < m->k / 32; s++) {
        tok32 tk[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            tok_load(&tk[t], &xq[t], s);
        const uint32_t *col = qs + s * 8 * rows;
        for (uint64_t r = r0; r < nv; r += 16) {
            __m512i acc[MAXT];
            pf_flat(col, 8, rows, d16, dcol, 2, s, r, r0, nv);
            UNROLL for (int t = 0; t < nt; t++)
                acc[t] = _mm512_setzero_si512();
            UNROLL for (int w = 0; w < 8; w++) {
                __m512i u = _mm512_xor_si512(ld(col + w * rows + r), flip);   /* w + 128 */
                UNROLL for (int t = 0; t < nt; t++)
                    acc[t] = _mm512_dpbusd_epi32(acc[t], u, tk[t].a[w]);
            }
            __m512 d = cvt16h(d16 + s * dcol + r);
            UNROLL for (int t = 0; t < nt; t++)
                acc_y(y + t * rows + r, s, _mm512_mul_ps(d, _mm512_set1_ps(tk[t].da)),
                      _mm512_sub_epi32(acc[t], _mm512_set1_epi32(128 * tk[t].suma)));
        }
    }
}

/* Fields 2j and 2j+1 (scale, min of sub-block j) as one 12-bit value at bit
 * 12j of the stream (one load and shift; a second where it straddles). */
ALWAYS_INLINE __m512i field12(const uint32_t *scb, uint64_t rows, uint64_t r, unsigned j)
{
    unsigned bit = 12 * j, wi = bit / 32, sh = bit % 32;
    __m512i v = _mm512_srl_epi32(ld(scb + wi * rows + r), _mm_cvtsi32_si128((int)sh));
    if (sh > 20)
        v = _mm512_or_si512(v, _mm512_sll_epi32(ld(scb + (wi + 1) * rows + r), _mm_cvtsi32_si128((int)(32 - sh))));
    return v;
}

/* dot of a 5-word sub-block (4 nibble words + 1 word of high bits, 7.5: the
 * high bit of element 4w+b is bit w of byte b, of element 16+4w+b bit 4+w). */
ALWAYS_INLINE void nib5_word(const uint32_t *col, uint64_t rows, uint64_t r, int w, int nt,
                             const tok32 *tk, __m512i *acc, __m512i hb, __m512i hl)
{
    const __m512i m4 = _mm512_set1_epi8(15), m10 = _mm512_set1_epi8(0x10);
    __m512i v = ld(col + w * rows + r);
    __m512i lo = _mm512_ternarylogic_epi32(v, m4, _mm512_and_si512(_mm512_srli_epi32(hl, w), m10), 0xea);   /* (a & b) | c */
    __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m4,
                                           _mm512_and_si512(_mm512_srli_epi32(hb, w), m10), 0xea);   /* (a & b) | c */
    UNROLL for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_dpbusd_epi32(acc[t], lo, tk[t].a[w]);
        acc[t] = _mm512_dpbusd_epi32(acc[t], hi, tk[t].a[w + 4]);
    }
}

ALWAYS_INLINE void dot_nib5(const uint32_t *col, uint64_t rows, uint64_t r, int nt,
                            const tok32 *tk, __m512i *acc, int unrolled)
{
    __m512i hb = ld(col + 4 * rows + r), hl = _mm512_slli_epi32(hb, 4);
    UNROLL for (int t = 0; t < nt; t++)
        acc[t] = _mm512_setzero_si512();
    if (unrolled) {
        UNROLL for (int w = 0; w < 4; w++)
            nib5_word(col, rows, r, w, nt, tk, acc, hb, hl);
    } else {
        ROLLED for (int w = 0; w < 4; w++)
            nib5_word(col, rows, r, w, nt, tk, acc, hb, hl);
    }
}

/* MXFP4: codes through the doubled-plus-12 table (values 0..24, vpshufb). */
ALWAYS_INLINE void dot_mx(const uint32_t *col, uint64_t rows, uint64_t r, int nt,
                          const tok32 *tk, __m512i *acc)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                             12, 11, 10, 9, 8, 6, 4, 0));
    UNROLL for (int t = 0; t < nt; t++)
        acc[t] = _mm512_setzero_si512();
    ROLLED for (int w = 0; w < 4; w++) {
        __m512i v = ld(col + w * rows + r);
        __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4));
        __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
        UNROLL for (int t = 0; t < nt; t++) {
            acc[t] = _mm512_dpbusd_epi32(acc[t], lo, tk[t].a[w]);
            acc[t] = _mm512_dpbusd_epi32(acc[t], hi, tk[t].a[w + 4]);
        }
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
        for (uint64_t r = r0; r < nv; r += 16) {
            __m512i dot[MAXT];
            pf_sub32(col, (unsigned)W, rows, m->d, dcol, type, s, r, r0, nv);
            if (type == JLM_T_MXFP4)
                dot_mx(col, rows, r, nt, tk, dot);
            else
                dot_nib5(col, rows, r, nt, tk, dot, 0);
            if (type == JLM_T_Q5_1) {
                __m512 d, b;
                half_pair(ld(dp + s * rows + r), &d, &b);
                UNROLL for (int t = 0; t < nt; t++) {
                    float *yt = y + t * rows + r;
                    __m512 acc = s ? _mm512_loadu_ps(yt) : _mm512_setzero_ps(), da = _mm512_set1_ps(tk[t].da);
                    __m512 pd = _mm512_mul_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(dot[t]));
                    __m512 pb = _mm512_mul_ps(_mm512_mul_ps(b, da), _mm512_set1_ps(tk[t].sumaf));
                    _mm512_storeu_ps(yt, _mm512_add_ps(acc, _mm512_sub_ps(pd, pb)));
                }
                continue;
            }
            __m512 d = type == JLM_T_Q5_0
                ? cvt16h(d16 + s * dcol + r)
                : _mm512_castsi512_ps(_mm512_slli_epi32(
                      _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(d8 + s * dcol + r))), 23));
            UNROLL for (int t = 0; t < nt; t++)
                acc_y(y + t * rows + r, s, _mm512_mul_ps(d, _mm512_set1_ps(tk[t].da)),
                      _mm512_sub_epi32(dot[t], _mm512_set1_epi32(bias * tk[t].suma)));
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
 * decoded once per KP, y kept in a register across them (the same f32
 * operations in the same order as the reference). KP = 8 (36 streams) was
 * slower from DRAM; KP = 2 measured best (docs/kernels.md). */
#ifndef JLM_K32_KP
#define JLM_K32_KP 2
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
    const __m512i m63 = _mm512_set1_epi32(63);
    for (uint64_t r = r0; r < nv; r += 16) {
        __m512 d, dmin, sc[KP], mn[KP];
        pf_k32(qs, dp, scp, rows, W, KP, s0, r, r0, nv);
        half_pair(ld(dp + sb * rows + r), &d, &dmin);
        /* sc*dot < 2^24 and m*suma < 2^24: the f32 products are exact, so
         * they equal the reference's (float)(sc*dot) and (float)(m*suma) */
        UNROLL for (int p = 0; p < KP; p++) {
            __m512i f = field12(scb, rows, r, j0 + p);
            sc[p] = _mm512_cvtepi32_ps(_mm512_and_si512(f, m63));
            mn[p] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(f, 6), m63));
        }
        __m512 acc[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            acc[t] = s0 ? _mm512_loadu_ps(y + t * rows + r) : _mm512_setzero_ps();
        UNROLL for (int p = 0; p < KP; p++) {
            const uint32_t *col = qs + (s0 + p) * W * rows;
            __m512i dot[MAXT];
            if (W == 5)
                dot_nib5(col, rows, r, nt, tk[p], dot, 1);
            else
                dot_nib(col, rows, r, nt, tk[p], dot, 1);
            UNROLL for (int t = 0; t < nt; t++) {
                __m512 a = _mm512_mul_ps(sc[p], _mm512_cvtepi32_ps(dot[t]));
                __m512 b = _mm512_mul_ps(mn[p], _mm512_set1_ps(tk[p][t].sumaf));
                __m512 v = NMULADD(dmin, b, _mm512_mul_ps(d, a));
                acc[t] = MULADD(_mm512_set1_ps(tk[p][t].da), v, acc[t]);
            }
        }
        UNROLL for (int t = 0; t < nt; t++)
            _mm512_storeu_ps(y + t * rows + r, acc[t]);
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
        switch (s0 % 8) {   /* KP = 2: 0, 2, 4, 6 */
        case 0: k32_pass(m, tk, nt, y, r0, nv, W, s0, 0); break;
        case 2: k32_pass(m, tk, nt, y, r0, nv, W, s0, 2); break;
        case 4: k32_pass(m, tk, nt, y, r0, nv, W, s0, 4); break;
        case 6: k32_pass(m, tk, nt, y, r0, nv, W, s0, 6); break;
        default: k32_pass(m, tk, nt, y, r0, nv, W, s0, (unsigned)(s0 % 8)); break;
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
 * y += (d*da) * isum. */
ALWAYS_INLINE void q3_k_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                             uint64_t r0, uint64_t nv)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    uint64_t rows = m->rows;
    const uint32_t *qs = m->qs, *dp = m->d, *scp = m->sc;
    for (uint64_t b = 0; b < m->k / 32; b++) {
        tok32 tk[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            tok_load(&tk[t], &xq[t], b);
        const __m128i c8a = _mm_cvtsi32_si128((int)(8 * ((2 * b) % 4)));
        const __m128i c8b = _mm_cvtsi32_si128((int)(8 * ((2 * b + 1) % 4)));
        const uint32_t *scw = scp + (2 * b / 4) * rows, *dw = dp + (b / 8) * rows;
        for (uint64_t r = r0; r < nv; r += 16) {
            __m512i is[MAXT];
            UNROLL for (int t = 0; t < nt; t++)
                is[t] = _mm512_setzero_si512();
            pf_k16(qs, dp, scp, rows, 2, b, r, r0, nv);
            __m512i scv = ld(scw + r);
            UNROLL for (int h = 0; h < 2; h++) {
                const uint32_t *col = qs + (2 * b + h) * 2 * rows + r;
                __m512i acc[MAXT];
                UNROLL for (int t = 0; t < nt; t++)
                    acc[t] = _mm512_setzero_si512();
                UNROLL for (int p = 0; p < 2; p++) {
                    __m512i v = ld(col + p * rows);
                    __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    UNROLL for (int t = 0; t < nt; t++) {
                        acc[t] = _mm512_dpbusd_epi32(acc[t], lo, tk[t].a[4 * h + p]);
                        acc[t] = _mm512_dpbusd_epi32(acc[t], hi, tk[t].a[4 * h + 2 + p]);
                    }
                }
                __m512i sc = _mm512_sub_epi32(_mm512_and_si512(_mm512_srl_epi32(scv, h ? c8b : c8a),
                                                               _mm512_set1_epi32(0xff)), _mm512_set1_epi32(32));
                UNROLL for (int t = 0; t < nt; t++) {
                    __m512i dot = _mm512_sub_epi32(acc[t], _mm512_set1_epi32(4 * xq[t].sum16[2 * b + h]));
                    is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(sc, dot));
                }
            }
            __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(ld(dw + r)));
            UNROLL for (int t = 0; t < nt; t++)
                acc_y(y + t * rows + r, b, _mm512_mul_ps(d, _mm512_set1_ps(tk[t].da)), is[t]);
        }
    }
}

/* ---------------------------------------------------------------- Q6_K */

/* Q6_K: 16-wide sub-blocks, 2 primary words + 1 word of 2-bit highs (7.5:
 * byte b of it holds elements b, b+4, b+8, b+12 at bits 0, 2, 4, 6). Codes
 * 0..63 go to vpdpbusd unsigned; per 32-block
 * isum = sum_h (sc_h - 128) * (dot_h - 32*sum16_h); y += (d*da) * isum. */
ALWAYS_INLINE void q6_k_core(const jlm_k_mat *m, const jlm_act_q8 *xq, int nt, float *y,
                             uint64_t r0, uint64_t nv)
{
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    uint64_t rows = m->rows;
    const uint32_t *qs = m->qs, *dp = m->d, *scp = m->sc;
    for (uint64_t b = 0; b < m->k / 32; b++) {
        tok32 tk[MAXT];
        UNROLL for (int t = 0; t < nt; t++)
            tok_load(&tk[t], &xq[t], b);
        const __m128i c8a = _mm_cvtsi32_si128((int)(8 * ((2 * b) % 4)));
        const __m128i c8b = _mm_cvtsi32_si128((int)(8 * ((2 * b + 1) % 4)));
        const uint32_t *scw = scp + (2 * b / 4) * rows, *dw = dp + (b / 8) * rows;
        for (uint64_t r = r0; r < nv; r += 16) {
            __m512i is[MAXT];
            UNROLL for (int t = 0; t < nt; t++)
                is[t] = _mm512_setzero_si512();
            pf_k16(qs, dp, scp, rows, 3, b, r, r0, nv);
            __m512i scv = ld(scw + r);
            UNROLL for (int h = 0; h < 2; h++) {
                const uint32_t *col = qs + (2 * b + h) * 3 * rows + r;
                __m512i hb = ld(col + 2 * rows), acc[MAXT];
                UNROLL for (int t = 0; t < nt; t++)
                    acc[t] = _mm512_setzero_si512();
                UNROLL for (int p = 0; p < 2; p++) {
                    __m512i v = ld(col + p * rows);
                    __m512i lo = _mm512_or_si512(_mm512_and_si512(v, m4),
                                                 _mm512_and_si512(p ? _mm512_slli_epi32(hb, 2) : _mm512_slli_epi32(hb, 4), m30));
                    __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                                 _mm512_and_si512(p ? _mm512_srli_epi32(hb, 2) : hb, m30));
                    UNROLL for (int t = 0; t < nt; t++) {
                        acc[t] = _mm512_dpbusd_epi32(acc[t], lo, tk[t].a[4 * h + p]);
                        acc[t] = _mm512_dpbusd_epi32(acc[t], hi, tk[t].a[4 * h + 2 + p]);
                    }
                }
                __m512i sc = _mm512_sub_epi32(_mm512_and_si512(_mm512_srl_epi32(scv, h ? c8b : c8a),
                                                               _mm512_set1_epi32(0xff)), _mm512_set1_epi32(128));
                UNROLL for (int t = 0; t < nt; t++) {
                    __m512i dot = _mm512_sub_epi32(acc[t], _mm512_set1_epi32(32 * xq[t].sum16[2 * b + h]));
                    is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(sc, dot));
                }
            }
            __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(ld(dw + r)));
            UNROLL for (int t = 0; t < nt; t++)
                acc_y(y + t * rows + r, b, _mm512_mul_ps(d, _mm512_set1_ps(tk[t].da)), is[t]);
        }
    }
}

/* ---------------------------------------------------------------- float types (along k) */

ALWAYS_INLINE __m512 load16f(const void *w, int type, uint64_t i)
{
    if (type == JLM_T_F32)
        return _mm512_loadu_ps((const float *)w + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    if (type == JLM_T_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE void float_rows(const jlm_k_mat *m, const float *x, float *y, uint64_t r0, uint64_t r1, int type)
{
    uint64_t k = m->k, kv = k / 64 * 64, es = type == JLM_T_F32 ? 4 : 2;
    for (uint64_t r = r0; r < r1; r++) {
        const uint8_t *w = (const uint8_t *)m->qs + r * k * es;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint64_t i = 0; i < kv; i += 64) {
            a0 = MULADD(load16f(w, type, i), _mm512_loadu_ps(x + i), a0);
            a1 = MULADD(load16f(w, type, i + 16), _mm512_loadu_ps(x + i + 16), a1);
            a2 = MULADD(load16f(w, type, i + 32), _mm512_loadu_ps(x + i + 32), a2);
            a3 = MULADD(load16f(w, type, i + 48), _mm512_loadu_ps(x + i + 48), a3);
        }
        float acc = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
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

#define DEFINE_Q(name, core)                                                                  \
    static void mv_##name(const jlm_k_mat *m, const float *x, const jlm_act_q8 *xq, float *y, \
                          uint64_t r0, uint64_t r1)                                           \
    {                                                                                         \
        uint64_t nv = r0 + (r1 - r0) / 16 * 16;                                               \
        if (nv > r0)                                                                          \
            core(m, xq, 1, y, r0, nv);                                                        \
        if (nv < r1)                                                                          \
            jlm_k_matvec_ref(m, x, xq, y, nv, r1);                                            \
    }                                                                                         \
    static void mm_##name(const jlm_k_mat *m, uint64_t n, const float *x, const jlm_act_q8 *xq, \
                          float *y, uint64_t r0, uint64_t r1)                                 \
    {                                                                                         \
        uint64_t nv = r0 + (r1 - r0) / 16 * 16, t = 0;                                        \
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

/* A register tile of 16 rows x nt tokens: the tile's int32 dots stay in
 * registers for a 32-block (f32 accumulators in L1 between 32-blocks); each weight word is loaded and decoded
 * (nibble split, high bits, table) once per tile and feeds the vpdpbusd of
 * every token of the tile. Loops go word by word across the tile's tokens, so
 * nt (or 2*nt) independent int32 chains are in flight: vpdpbusd has a latency
 * of ~5 cycles and two issue ports, and one chain per token of 8 tokens was
 * latency-bound (slower than the 4-token matmul). Per (row, token) the int32
 * dots and the f32 operations, sub-blocks in order, are the reference's
 * (bit-identical); the bias*sum(a) term seeds the int32 dot instead of being
 * subtracted after (integer addition: the same int32). Rows go in blocks of
 * RB (g_block: the block's accumulators in L1, contiguous plane runs), and
 * every token tile of the batch reuses a block's planes from L2. */
enum { NTMAX = 12, SC = 8 };

/* Tokens per tile: as many as the 32 zmm registers hold (2 per token: dot and
 * accumulator; Q3_K/Q6_K keep two dots, one per 16-wide half). */
ALWAYS_INLINE int g_nt(int type)
{
    return type == JLM_T_Q3_K || type == JLM_T_Q6_K ? 8 : type == JLM_T_Q5_0 || type == JLM_T_Q5_1 ||
           type == JLM_T_Q5_K || type == JLM_T_Q4_K ? 11 : 12;
}

/* The tile's activations for a chunk of SC 32-blocks, copied together (one
 * base address for the vector loop instead of nt pointers, which ran the
 * general registers out), with per token and 32-block the int32 seeds of the
 * dots (-bias*sum(a) of the 32-block, or of each 16-half for Q3_K/Q6_K) and
 * sum(a) as f32, so the vector loop takes them as broadcast loads. */
typedef struct gseed {
    int8_t  q[SC][NTMAX][32] __attribute__((aligned(64)));
    float   da[SC][NTMAX];
    int32_t b0[SC][NTMAX], b1[SC][NTMAX];
    float   fs[SC][NTMAX];
} gseed;

ALWAYS_INLINE void g_seed(gseed *z, const jlm_act_q8 *xq, int nt, uint64_t s0, uint64_t ns, int type)
{
    int k16 = type == JLM_T_Q3_K || type == JLM_T_Q6_K;
    int32_t bias = type == JLM_T_Q4_0 ? 8 : type == JLM_T_Q8_0 ? 128 : type == JLM_T_Q5_0 ? 16
                 : type == JLM_T_MXFP4 ? 12 : type == JLM_T_Q3_K ? 4 : type == JLM_T_Q6_K ? 32 : 0;
    for (int t = 0; t < nt; t++)
        for (uint64_t s = 0; s < ns; s++) {
            uint64_t b = s0 + s;
            int32_t a0 = xq[t].sum16[2 * b], a1 = xq[t].sum16[2 * b + 1];
            _mm256_store_si256((__m256i *)z->q[s][t], _mm256_loadu_si256((const __m256i *)(xq[t].q + 32 * b)));
            z->da[s][t] = xq[t].d[b];
            z->b0[s][t] = -bias * (k16 ? a0 : a0 + a1);
            z->b1[s][t] = -bias * a1;
            z->fs[s][t] = (float)(a0 + a1);
        }
}

ALWAYS_INLINE __m512i bcast32(const int32_t *p) { return _mm512_set1_epi32(*p); }

/* Step u (0..3) of 32-block s of rows [r, r+16): two decoded weight vectors
 * x0, x1 that pair with activation words i0, i1 (of 4 bytes); Q3_K/Q6_K:
 * both in 16-wide half u/2. */
ALWAYS_INLINE void g_step(const jlm_k_mat *m, uint64_t s, uint64_t r, int u, int type, __m512i hb,
                          __m512i *x0, __m512i *x1, int *i0, int *i1)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    uint64_t rows = m->rows;
    const uint32_t *qs = m->qs;
    *i0 = u;
    *i1 = u + 4;
    switch (type) {
    case JLM_T_Q4_0: case JLM_T_Q4_K: case JLM_T_MXFP4: {
        __m512i v = ld(qs + (s * 4 + u) * rows + r);
        *x0 = _mm512_and_si512(v, m4);
        *x1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (type == JLM_T_MXFP4) {
            const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                                     12, 11, 10, 9, 8, 6, 4, 0));
            *x0 = _mm512_shuffle_epi8(lut, *x0);
            *x1 = _mm512_shuffle_epi8(lut, *x1);
        }
        break;
    }
    case JLM_T_Q8_0: {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        *x0 = _mm512_xor_si512(ld(qs + (s * 8 + u) * rows + r), flip);   /* w + 128 */
        *x1 = _mm512_xor_si512(ld(qs + (s * 8 + u + 4) * rows + r), flip);
        break;
    }
    case JLM_T_Q5_0: case JLM_T_Q5_1: case JLM_T_Q5_K: {
        /* hb: the word of high bits (7.5: element 4w+b at bit w of byte b, 16+4w+b at bit 4+w) */
        const __m512i m10 = _mm512_set1_epi8(0x10);
        __m512i v = ld(qs + (s * 5 + u) * rows + r);
        *x0 = _mm512_ternarylogic_epi32(v, m4, _mm512_and_si512(_mm512_srli_epi32(_mm512_slli_epi32(hb, 4), u), m10), 0xea);
        *x1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m4, _mm512_and_si512(_mm512_srli_epi32(hb, u), m10), 0xea);
        break;
    }
    case JLM_T_Q3_K: case JLM_T_Q6_K: {
        int h = u / 2, p = u % 2, q3 = type == JLM_T_Q3_K;
        __m512i v = ld(qs + ((2 * s + h) * (q3 ? 2 : 3) + p) * rows + r);
        *x0 = _mm512_and_si512(v, m4);
        *x1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (!q3) {
            const __m512i m30 = _mm512_set1_epi8(0x30);
            *x0 = _mm512_or_si512(*x0, _mm512_and_si512(p ? _mm512_slli_epi32(hb, 2) : _mm512_slli_epi32(hb, 4), m30));
            *x1 = _mm512_or_si512(*x1, _mm512_and_si512(p ? _mm512_srli_epi32(hb, 2) : hb, m30));
        }
        *i0 = 4 * h + p;
        *i1 = 4 * h + 2 + p;
        break;
    }
    }
}

/* 32-block s (chunk index j of z) of rows [r, r+16) for tokens [0, nt):
 * A[t] (16 floats each) += its contribution, the reference's f32 operations. */
ALWAYS_INLINE void g_sub(const jlm_k_mat *m, const gseed *z, uint64_t j, uint64_t s, uint64_t r, int nt, int type,
                         float (*A)[16])
{
    const int k16 = type == JLM_T_Q3_K || type == JLM_T_Q6_K;
    uint64_t rows = m->rows;
    const uint32_t *qs = m->qs, *dp = m->d, *scp = m->sc;
    const uint16_t *d16 = m->d;
    const uint8_t *d8 = m->d;
    /* z opaque here: otherwise GCC hoists the activation broadcasts of the
     * block's every token out of the row tiles' loop into a stack table of
     * whole zmm (most of the block's 96 stored as 64-byte vectors, and most
     * vpdpbusd then read one from the stack); kept in the loop they are
     * vpbroadcastd from the tile's 4 bytes.
     * Zen 4: 1.15-1.23x GEMM by type (docs/kernels.md). */
    __asm__("" : "+r"(z));
    __m512 acc[NTMAX];
    UNROLL for (int t = 0; t < nt; t++)
        acc[t] = _mm512_load_ps(A[t]);
    __m512i dot[NTMAX], dot1[NTMAX];
    UNROLL for (int t = 0; t < nt; t++) {
        dot[t] = bcast32(&z->b0[j][t]);
        if (k16)
            dot1[t] = bcast32(&z->b1[j][t]);
    }
    __m512i hb = _mm512_setzero_si512();
    if (type == JLM_T_Q5_0 || type == JLM_T_Q5_1 || type == JLM_T_Q5_K)
        hb = ld(qs + (s * 5 + 4) * rows + r);
    UNROLL for (int u = 0; u < 4; u++) {
        if (type == JLM_T_Q6_K && u % 2 == 0)
            hb = ld(qs + ((2 * s + u / 2) * 3 + 2) * rows + r);
        __m512i x0, x1;
        int i0, i1;
        g_step(m, s, r, u, type, hb, &x0, &x1, &i0, &i1);
        UNROLL for (int t = 0; t < nt; t++) {
            const int8_t *q = z->q[j][t];
            if (k16 && u >= 2) {
                dot1[t] = _mm512_dpbusd_epi32(dot1[t], x0, bcast4(q + 4 * i0));
                dot1[t] = _mm512_dpbusd_epi32(dot1[t], x1, bcast4(q + 4 * i1));
            } else {
                dot[t] = _mm512_dpbusd_epi32(dot[t], x0, bcast4(q + 4 * i0));
                dot[t] = _mm512_dpbusd_epi32(dot[t], x1, bcast4(q + 4 * i1));
            }
        }
    }
    /* the f32 epilogue: the reference's operations, in its order */
    switch (type) {
    case JLM_T_Q4_0: case JLM_T_Q8_0: case JLM_T_Q5_0: case JLM_T_MXFP4: {
        __m512 d = type == JLM_T_MXFP4
            ? _mm512_castsi512_ps(_mm512_slli_epi32(
                  _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(d8 + s * ((rows + 3) / 4 * 4) + r))), 23))
            : cvt16h(d16 + s * ((rows + 1) / 2 * 2) + r);
        UNROLL for (int t = 0; t < nt; t++)
            acc[t] = MULADD(_mm512_mul_ps(d, _mm512_set1_ps(z->da[j][t])), _mm512_cvtepi32_ps(dot[t]), acc[t]);
        break;
    }
    case JLM_T_Q5_1: {
        __m512 d, b;
        half_pair(ld(dp + s * rows + r), &d, &b);
        UNROLL for (int t = 0; t < nt; t++) {
            __m512 da = _mm512_set1_ps(z->da[j][t]);
            __m512 pd = _mm512_mul_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(dot[t]));
            __m512 pb = _mm512_mul_ps(_mm512_mul_ps(b, da), _mm512_set1_ps(z->fs[j][t]));
            acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(pd, pb));
        }
        break;
    }
    case JLM_T_Q4_K: case JLM_T_Q5_K: {
        const __m512i m63 = _mm512_set1_epi32(63);
        __m512 d, dmin;
        half_pair(ld(dp + (s / 8) * rows + r), &d, &dmin);
        __m512i f = field12(scp + (s / 8) * 3 * rows, rows, r, (unsigned)(s % 8));
        /* d*sc and dmin*m once per tile, not per token: an f16 (11
         * significant bits) times a 6-bit integer is exact in f32, and so
         * are (float)dot and (float)sum(a) (< 2^24), so (d*sc)*dot rounds
         * the same exact product as the reference's d*(float)(sc*dot), and
         * (dmin*m)*sum(a) as its dmin*(float)(m*suma): bit-identical. */
        __m512 dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(f, m63)));
        __m512 dmn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(f, 6), m63)));
        UNROLL for (int t = 0; t < nt; t++) {
            __m512 v = NMULADD(dmn, _mm512_set1_ps(z->fs[j][t]), _mm512_mul_ps(dsc, _mm512_cvtepi32_ps(dot[t])));
            acc[t] = MULADD(_mm512_set1_ps(z->da[j][t]), v, acc[t]);
        }
        break;
    }
    case JLM_T_Q3_K: case JLM_T_Q6_K: {
        const __m512i ff = _mm512_set1_epi32(0xff), off = _mm512_set1_epi32(type == JLM_T_Q3_K ? 32 : 128);
        __m512i scv = ld(scp + (2 * s / 4) * rows + r);
        __m512i sc0 = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(scv, (unsigned)(8 * ((2 * s) % 4))), ff), off);
        __m512i sc1 = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(scv, (unsigned)(8 * ((2 * s + 1) % 4))), ff), off);
        __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(ld(dp + (s / 8) * rows + r)));
        UNROLL for (int t = 0; t < nt; t++) {
            __m512i is = _mm512_add_epi32(_mm512_mullo_epi32(sc0, dot[t]), _mm512_mullo_epi32(sc1, dot1[t]));
            acc[t] = MULADD(_mm512_mul_ps(d, _mm512_set1_ps(z->da[j][t])), _mm512_cvtepi32_ps(is), acc[t]);
        }
        break;
    }
    }
    UNROLL for (int t = 0; t < nt; t++)
        _mm512_store_ps(A[t], acc[t]);
}

/* Rows [r0, r1) (r1 - r0 a multiple of 16, at most RB) x tokens xq[0, nt):
 * y (nt, rows). Sub-blocks outer, the block's 16-row tiles inner: each
 * (sub-block, word) of the block is one contiguous run of (r1 - r0) * 4
 * bytes, and the block's accumulators A stay in L1. Reading a 16-row tile
 * down the whole of k instead (k/32 * W lines, each in its own 4 KiB page)
 * was ~2x slower inside the engine (TLB misses on 4 KiB frames). */
enum { RB = 128 };
ALWAYS_INLINE void g_block(const jlm_k_mat *m, const jlm_act_q8 *xq, float *y, uint64_t r0, uint64_t r1, int nt,
                           int nstore, int type)
{
    uint64_t nsub = m->k / 32, nrt = (r1 - r0) / 16;
    float A[RB / 16][NTMAX][16] __attribute__((aligned(64)));
    memset(A, 0, sizeof A);
    for (uint64_t s0 = 0; s0 < nsub; s0 += SC) {
        uint64_t ns = nsub - s0 < SC ? nsub - s0 : SC;
        gseed z;
        g_seed(&z, xq, nt, s0, ns, type);
        for (uint64_t j = 0; j < ns; j++)
            for (uint64_t rt = 0; rt < nrt; rt++)
                g_sub(m, &z, j, s0 + j, r0 + 16 * rt, nt, type, A[rt]);
    }
    for (uint64_t rt = 0; rt < nrt; rt++)
        for (int t = 0; t < nstore; t++)
            memcpy(y + t * m->rows + r0 + 16 * rt, A[rt][t], sizeof A[rt][t]);
}

/* Tokens [0, n) x rows [r0, nv) in tiles of nt tokens, then of 4 (the last
 * one padded with copies of the last token, whose outputs are not stored). */
ALWAYS_INLINE void g_run(const jlm_k_mat *m, uint64_t n, const jlm_act_q8 *xq, float *y, uint64_t r0, uint64_t nv,
                         int type)
{
    const int nt = g_nt(type);
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

/* The GEMM (g_run), the reference for rows after the last 16; fewer than 4
 * tokens go to the 4-token matmul (streaming the planes once is what bounds
 * them). */
#define DEFINE_GEMM(name, type)                                                               \
    static void gm_##name(const jlm_k_mat *m, uint64_t n, const float *x, const jlm_act_q8 *xq, \
                          float *y, uint64_t r0, uint64_t r1)                                 \
    {                                                                                         \
        if (n < 4) {                                                                          \
            mm_##name(m, n, x, xq, y, r0, r1);                                                \
            return;                                                                           \
        }                                                                                     \
        uint64_t nv = r0 + (r1 - r0) / 16 * 16;                                               \
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

void JLM_K_FILL_AVX512(jlm_k_cpu *t)
{
    t->to_fp16 = jlm_k_to_fp16_f16c;             /* F16C: the AVX2 variant's */
    t->quantize_act = jlm_k_quantize_act_avx2;   /* 32 floats a block: AVX2 width is enough */
    t->matvec[JLM_T_Q4_0] = mv_q4_0;
    t->matmul[JLM_T_Q4_0] = mm_q4_0;
    t->matvec[JLM_T_Q4_K] = mv_q4_k;
    t->matmul[JLM_T_Q4_K] = mm_q4_k;
    t->matvec[JLM_T_Q8_0] = mv_q8_0;
    t->matmul[JLM_T_Q8_0] = mm_q8_0;
    t->matvec[JLM_T_Q6_K] = mv_q6_k;
    t->matmul[JLM_T_Q6_K] = mm_q6_k;
    t->matvec[JLM_T_F32] = mv_f32;
    t->matmul[JLM_T_F32] = mm_f32;
    t->matvec[JLM_T_F16] = mv_f16;
    t->matmul[JLM_T_F16] = mm_f16;
    t->matvec[JLM_T_BF16] = mv_bf16;
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
