/* fattn_avx2.c - jlm_k_fattn with AVX2 (+F16C): bit-identical to
 * jlm_k_fattn_ref (kernels.h); the structure of fattn_avx512.c in 8 lanes:
 * Kt (head_dim, 32) per key tile (or the cache's own tile, F16 converted as
 * loaded at decode), scores of 4 items x 16 keys in 8 ymm accumulators (two
 * halves per tile), exp in 8 lanes, values 8 dimensions a lane, two items with
 * the same keys at once. No FMA: mul then add, the reference's order. And
 * jlm_k_swiglu in 8 lanes, on the same exp. */
#include "kernels/cpu/kernels.h"

#include <immintrin.h>
#include <math.h>

#define BK JLM_K_FATTN_BK
#define BQ JLM_K_FATTN_BQ

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

/* jlm_k_fattn_exp in 8 lanes (min(0, x) keeps a NaN lane NaN) */
static __m256 exp8(__m256 x)
{
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_setzero_ps(), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 z = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_mul_ps(y, z), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(tiny, y);
}

static void widen(float *dst, const void *src, int f16, uint32_t n)
{
    uint32_t i = 0;
    if (f16) {
        const uint16_t *s = src;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
        for (; i < n; i++)
            dst[i] = jlm_k_fp16_to_f32(s[i]);
    } else {
        const float *s = src;
        for (; i < n; i++)
            dst[i] = s[i];
    }
}

/* r[t] = row t (8 floats) -> dst + e*stride = element e of the 8 rows */
static void transpose8(__m256 r[8], float *dst, size_t stride)
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int b = 0; b < 2; b++) {   /* u[4b + c]: element 4L + c of rows 4b..4b+3 in lane L */
        u[4 * b + 0] = _mm256_shuffle_ps(t[4 * b], t[4 * b + 2], 0x44);
        u[4 * b + 1] = _mm256_shuffle_ps(t[4 * b], t[4 * b + 2], 0xEE);
        u[4 * b + 2] = _mm256_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0x44);
        u[4 * b + 3] = _mm256_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_ps(dst + (size_t)c * stride, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
        _mm256_storeu_ps(dst + (size_t)(4 + c) * stride, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
    }
}

static void scale_row(float *o, float a, uint32_t n)
{
    __m256 va = _mm256_set1_ps(a);
    uint32_t d = 0;
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), va));
    for (; d < n; d++)
        o[d] = o[d] * a;
}

static float hmax8(__m256 x)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* 8 floats at element idx: f32, or F16 bits widened where they lie (F16C, exact) */
static inline __attribute__((always_inline)) __m256 ld8(const void *base, int f16, uint64_t idx)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx)));
    return _mm256_loadu_ps((const float *)base + idx);
}

static inline __attribute__((always_inline)) float ld1(const void *base, int f16, uint64_t idx)
{
    return f16 ? jlm_k_fp16_to_f32(((const uint16_t *)base)[idx]) : ((const float *)base)[idx];
}

/* o[0, 8*nc) += s[jj] * v_jj[d0, d0 + 8*nc) for keys jj in [a, b), ascending
 * (nc 4 or 1, a literal), value jj at element jj * vstr of vr (f32, or F16
 * where f16): the accumulators stay in registers (a runtime count of them in
 * an array had GCC keep them on the stack, a store-to-load round trip per key
 * and chunk). */
static inline __attribute__((always_inline)) void pv32(float *o, const void *vr, int f16, uint64_t d0, uint64_t vstr,
                                                       const float *s, uint32_t a, uint32_t b, int nc)
{
    __m256 acc[4];
    for (int c = 0; c < nc; c++)
        acc[c] = _mm256_loadu_ps(o + 8 * c);
    for (uint32_t jj = a; jj < b; jj++) {
        __m256 pj = _mm256_broadcast_ss(s + jj);
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(pj, ld8(vr, f16, jj * vstr + d0 + 8 * c)));
    }
    for (int c = 0; c < nc; c++)
        _mm256_storeu_ps(o + 8 * c, acc[c]);
}

/* pv32 for two items with the same keys [a, b): each value row is loaded
 * once for both, and the 8 accumulators are independent chains. Per (item,
 * dimension) the adds are pv32's, keys ascending: the same bits. */
static inline __attribute__((always_inline)) void pv32x2(float *o0, float *o1, const void *vr, int f16, uint64_t d0,
                                                         uint64_t vstr, const float *s0, const float *s1, uint32_t a,
                                                         uint32_t b, int nc)
{
    __m256 c0[4], c1[4];
    for (int c = 0; c < nc; c++) {
        c0[c] = _mm256_loadu_ps(o0 + 8 * c);
        c1[c] = _mm256_loadu_ps(o1 + 8 * c);
    }
    for (uint32_t jj = a; jj < b; jj++) {
        __m256 p0 = _mm256_broadcast_ss(s0 + jj), p1 = _mm256_broadcast_ss(s1 + jj);
        for (int c = 0; c < nc; c++) {
            __m256 vc = ld8(vr, f16, jj * vstr + d0 + 8 * c);
            c0[c] = _mm256_add_ps(c0[c], _mm256_mul_ps(p0, vc));
            c1[c] = _mm256_add_ps(c1[c], _mm256_mul_ps(p1, vc));
        }
    }
    for (int c = 0; c < nc; c++) {
        _mm256_storeu_ps(o0 + 8 * c, c0[c]);
        _mm256_storeu_ps(o1 + 8 * c, c1[c]);
    }
}

/* o += the tile's values weighted by s over keys [a, b), for one item (o1 =
 * NULL) or two with the same keys (pv32x2); values f32, or F16 where f16 */
static inline __attribute__((always_inline)) void pv_items_t(float *o0, const float *s0, float *o1, const float *s1,
                                                             const void *vbase, int f16, uint64_t vstr, uint32_t a,
                                                             uint32_t b, uint32_t hdv)
{
    uint32_t nv8 = hdv / 8 * 8, d0 = 0;
    if (o1) {
        for (; d0 + 32 <= nv8; d0 += 32)
            pv32x2(o0 + d0, o1 + d0, vbase, f16, d0, vstr, s0, s1, a, b, 4);
        for (; d0 < nv8; d0 += 8)
            pv32x2(o0 + d0, o1 + d0, vbase, f16, d0, vstr, s0, s1, a, b, 1);
    } else {
        for (; d0 + 32 <= nv8; d0 += 32)
            pv32(o0 + d0, vbase, f16, d0, vstr, s0, a, b, 4);
        for (; d0 < nv8; d0 += 8)
            pv32(o0 + d0, vbase, f16, d0, vstr, s0, a, b, 1);
    }
    for (uint32_t d = nv8; d < hdv; d++) {
        for (uint32_t jj = a; jj < b; jj++)
            o0[d] = o0[d] + s0[jj] * ld1(vbase, f16, jj * vstr + d);
        for (uint32_t jj = a; o1 && jj < b; jj++)
            o1[d] = o1[d] + s1[jj] * ld1(vbase, f16, jj * vstr + d);
    }
}

static void pv_items(float *o0, const float *s0, float *o1, const float *s1, const void *vbase, int f16,
                     uint64_t vstr, uint32_t a, uint32_t b, uint32_t hdv)
{
    if (f16)
        pv_items_t(o0, s0, o1, s1, vbase, 1, vstr, a, b, hdv);
    else
        pv_items_t(o0, s0, o1, s1, vbase, 0, vstr, a, b, hdv);
}

/* The scores of items qp[0..3] against the tile's 32 keys, dimension-major
 * at kc (f32, or F16 where f16), into s (rows of BK; nb of them stored), in
 * halves of 16 keys. */
static inline __attribute__((always_inline)) void scores4(const void *kc, int f16, uint32_t hd,
                                                          const float *const qp[4], float *s, uint32_t nb)
{
    for (uint32_t half = 0; half < BK; half += 16) {
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
               a31 = a00;
        for (uint32_t i = 0; i < hd; i++) {
            __m256 k0 = ld8(kc, f16, (size_t)i * BK + half), k1 = ld8(kc, f16, (size_t)i * BK + half + 8);
            __m256 q0 = _mm256_broadcast_ss(qp[0] + i), q1 = _mm256_broadcast_ss(qp[1] + i);
            a00 = _mm256_add_ps(a00, _mm256_mul_ps(q0, k0));
            a01 = _mm256_add_ps(a01, _mm256_mul_ps(q0, k1));
            a10 = _mm256_add_ps(a10, _mm256_mul_ps(q1, k0));
            a11 = _mm256_add_ps(a11, _mm256_mul_ps(q1, k1));
            __m256 q2 = _mm256_broadcast_ss(qp[2] + i), q3 = _mm256_broadcast_ss(qp[3] + i);
            a20 = _mm256_add_ps(a20, _mm256_mul_ps(q2, k0));
            a21 = _mm256_add_ps(a21, _mm256_mul_ps(q2, k1));
            a30 = _mm256_add_ps(a30, _mm256_mul_ps(q3, k0));
            a31 = _mm256_add_ps(a31, _mm256_mul_ps(q3, k1));
        }
        _mm256_storeu_ps(s + half, a00);
        _mm256_storeu_ps(s + half + 8, a01);
        if (nb > 1) { _mm256_storeu_ps(s + BK + half, a10); _mm256_storeu_ps(s + BK + half + 8, a11); }
        if (nb > 2) { _mm256_storeu_ps(s + 2 * BK + half, a20); _mm256_storeu_ps(s + 2 * BK + half + 8, a21); }
        if (nb > 3) { _mm256_storeu_ps(s + 3 * BK + half, a30); _mm256_storeu_ps(s + 3 * BK + half + 8, a31); }
    }
}

void jlm_k_fattn_avx2(const jlm_k_fattn *p, const float *q, const void *k, const void *v, float *out,
                      uint32_t g, uint32_t r0, uint32_t r1, float *scratch)
{
    const uint32_t G = p->group, hd = p->head_dim, hdv = p->head_dim_v, nr = r1 - r0, ni = G * nr;
    const size_t es = p->kv_f16 ? 2 : 4;
    float *Kt = scratch, *Vt = Kt + al16((size_t)hd * BK), *S = Vt + al16((size_t)BK * hdv);
    float *M = S + (size_t)G * BQ * BK, *L = M + al16((size_t)G * BQ);
    uint32_t jmin = UINT32_MAX, jmax = 0;
    for (uint32_t it = 0; it < ni; it++) {
        uint32_t r = r0 + it / G, h = g * G + it % G;
        M[it] = p->sinks ? p->sinks[h] : -INFINITY;
        L[it] = p->sinks ? 1.0f : 0.0f;
        float *o = out + r * p->o_stride + (uint64_t)h * hdv;
        for (uint32_t d = 0; d < hdv; d++)
            o[d] = 0.0f;
        if (p->lo[r] < p->hi[r]) {
            if (p->lo[r] < jmin) jmin = p->lo[r];
            if (p->hi[r] > jmax) jmax = p->hi[r];
        }
    }
    float kw[8];
    for (uint32_t j0 = jmin / BK * BK; jmin < jmax && j0 < jmax; j0 += BK) {
        uint32_t nk = jmax - j0 < BK ? jmax - j0 : BK;
        int any = 0;
        for (uint32_t r = r0; r < r1 && !any; r++)
            any = p->lo[r] < p->hi[r] && p->lo[r] < j0 + nk && p->hi[r] > j0;
        if (!any)
            continue;
        /* Kt[i][jj] = key j0+jj, dim i: the cache's own tile (k_tiled, F32),
         * its tile widened (k_tiled, F16), or transposed from rows: 8x8 blocks
         * in registers where whole, else element by element (zero past nk) */
        const void *Kc = Kt;
        int kf16 = 0;   /* Kc holds F16 bits: one group of items (decode) reads the tile where it is */
        if (p->k_tiled) {
            const uint8_t *tile = (const uint8_t *)k + ((uint64_t)g * p->kh_stride + (uint64_t)j0 * hd) * es;
            if (!p->kv_f16 || ni <= 4)
                Kc = tile, kf16 = p->kv_f16;
            else
                for (uint32_t i = 0; i < hd * BK; i += 8)
                    _mm256_storeu_ps(Kt + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)tile + i))));
        }
        for (uint32_t jb = 0; jb < BK && !p->k_tiled; jb += 8) {
            if (hd % 8 == 0 && jb + 8 <= nk) {
                for (uint32_t i0 = 0; i0 < hd; i0 += 8) {
                    __m256 rw[8];
                    for (uint32_t t = 0; t < 8; t++) {
                        const uint8_t *kj =
                            (const uint8_t *)k + ((uint64_t)(j0 + jb + t) * p->k_stride + (uint64_t)g * p->kh_stride + i0) * es;
                        rw[t] = p->kv_f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)kj))
                                          : _mm256_loadu_ps((const float *)kj);
                    }
                    transpose8(rw, Kt + (size_t)i0 * BK + jb, BK);
                }
                continue;
            }
            for (uint32_t jj = jb; jj < jb + 8; jj++) {
                if (jj >= nk) {
                    for (uint32_t i = 0; i < hd; i++)
                        Kt[(size_t)i * BK + jj] = 0.0f;
                    continue;
                }
                const uint8_t *kj = (const uint8_t *)k + ((uint64_t)(j0 + jj) * p->k_stride + (uint64_t)g * p->kh_stride) * es;
                for (uint32_t i0 = 0; i0 < hd; i0 += 8) {
                    uint32_t c = hd - i0 < 8 ? hd - i0 : 8;
                    widen(kw, kj + (size_t)i0 * es, p->kv_f16, c);
                    for (uint32_t i = 0; i < c; i++)
                        Kt[(size_t)(i0 + i) * BK + jj] = kw[i];
                }
            }
        }
        /* the values: f32 in place; F16 widened once into Vt for the rows,
         * or read where they are by a single row (decode: each is used once) */
        const void *vbase;
        uint64_t vstr;
        int vf16 = 0;
        if (p->kv_f16 && nr > 1) {
            for (uint32_t jj = 0; jj < nk; jj++)
                widen(Vt + (size_t)jj * hdv,
                      (const uint16_t *)v + (uint64_t)(j0 + jj) * p->v_stride + (uint64_t)g * p->vh_stride, 1, hdv);
            vbase = Vt;
            vstr = hdv;
        } else {
            vbase = (const uint8_t *)v + ((uint64_t)j0 * p->v_stride + (uint64_t)g * p->vh_stride) * es;
            vstr = p->v_stride;
            vf16 = p->kv_f16;
        }
        for (uint32_t i0 = 0; i0 < ni; i0 += 4) {
            uint32_t nb = ni - i0 < 4 ? ni - i0 : 4, act = 0;
            const float *qp[4];
            for (uint32_t b = 0; b < 4; b++) {
                uint32_t it = i0 + (b < nb ? b : 0), r = r0 + it / G, h = g * G + it % G;
                qp[b] = q + r * p->q_stride + (uint64_t)h * hd;
                act |= b < nb && p->lo[r] < p->hi[r] && p->lo[r] < j0 + nk && p->hi[r] > j0;
            }
            if (!act)
                continue;
            if (kf16)
                scores4(Kc, 1, hd, qp, S + (size_t)i0 * BK, nb);
            else
                scores4(Kc, 0, hd, qp, S + (size_t)i0 * BK, nb);
        }
        /* an item's values wait for the next one's: two with the same keys
         * go through pv32x2 together (each item's own operations, scale
         * then values, keep their order) */
        float *po = NULL;
        const float *ps = NULL;
        uint32_t pa = 0, pb = 0;
        for (uint32_t it = 0; it < ni; it++) {
            uint32_t r = r0 + it / G, h = g * G + it % G, lo = p->lo[r], hi = p->hi[r];
            if (!(lo < hi && lo < j0 + nk && hi > j0))
                continue;
            uint32_t a = (lo > j0 ? lo : j0) - j0, b = (hi < j0 + nk ? hi : j0 + nk) - j0;
            float *s = S + (size_t)it * BK;
            if (p->softcap > 0.0f)
                for (uint32_t jj = a; jj < b; jj++)
                    s[jj] = p->softcap * tanhf(s[jj] / p->softcap);
            __m256 sc = _mm256_set1_ps(p->scale), ninf = _mm256_set1_ps(-INFINITY), mx = ninf;
            __m256 sv[4];
            __m256i va = _mm256_set1_epi32((int)a - 1), vb = _mm256_set1_epi32((int)b);
            for (uint32_t c = 0; c < 4; c++) {
                sv[c] = _mm256_mul_ps(_mm256_loadu_ps(s + 8 * c), sc);
                __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * (int)c));
                __m256 ok = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(idx, va), _mm256_cmpgt_epi32(vb, idx)));
                mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, sv[c], ok));
            }
            float mt = hmax8(mx), m = M[it], mn = fmaxf(m, mt);
            if (mn == -INFINITY)
                continue;
            float *o = out + r * p->o_stride + (uint64_t)h * hdv;
            float al = m == mn ? 1.0f : jlm_k_fattn_exp(m - mn), l = L[it];   /* exp(0) is 1 exactly */
            if (al != 1.0f) {
                l = l * al;
                scale_row(o, al, hdv);
            }
            __m256 vm = _mm256_set1_ps(mn);
            for (uint32_t c = 0; c < 4; c++)
                _mm256_storeu_ps(s + 8 * c, exp8(_mm256_sub_ps(sv[c], vm)));
            for (uint32_t jj = a; jj < b; jj++)
                l = l + s[jj];
            L[it] = l;
            M[it] = mn;
            if (po && pa == a && pb == b) {
                pv_items(po, ps, o, s, vbase, vf16, vstr, a, b, hdv);
                po = NULL;
                continue;
            }
            if (po)
                pv_items(po, ps, NULL, NULL, vbase, vf16, vstr, pa, pb, hdv);
            po = o, ps = s, pa = a, pb = b;
        }
        if (po)
            pv_items(po, ps, NULL, NULL, vbase, vf16, vstr, pa, pb, hdv);
    }
    for (uint32_t it = 0; it < ni; it++) {
        uint32_t r = r0 + it / G, h = g * G + it % G;
        if (L[it] > 0.0f)
            scale_row(out + r * p->o_stride + (uint64_t)h * hdv, 1.0f / L[it], hdv);
    }
}

/* jlm_k_swiglu, 8 lanes at a time with its operations (the tail: it). */
void jlm_k_swiglu_avx2(float *out, const float *gate, const float *up, uint64_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_or_ps(g, sign));   /* exp(-|g|) */
        __m256 pos = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ);
        __m256 s = _mm256_div_ps(_mm256_blendv_ps(e, one, pos), _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_loadu_ps(up + i)));
    }
    if (i < n)
        jlm_k_swiglu(out + i, gate + i, up + i, n - i);
}
