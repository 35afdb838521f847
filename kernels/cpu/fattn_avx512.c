/* fattn_avx512.c - jlm_k_fattn with AVX-512: bit-identical to
 * jlm_k_fattn_ref (kernels.h). Per key tile the keys are read where the
 * cache keeps them in tiles (F32, or F16 converted as loaded at decode), or
 * widened / transposed once into Kt (head_dim, 32) for every query head of
 * the KV head and every row; scores of 4 (row, head) items x 32 keys are 8 zmm
 * accumulators (i ascending, mul then add: the reference's per-key order);
 * exp in 16 lanes with jlm_k_fattn_exp's operations; the values are
 * accumulated 16 dimensions a lane, keys ascending, four heads of a row at
 * once. No FMA anywhere. And jlm_k_swiglu in 16 lanes, on the same exp. */
#include "kernels/cpu/kernels.h"

#include <immintrin.h>
#include <math.h>

#define BK JLM_K_FATTN_BK
#define BQ JLM_K_FATTN_BQ

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

/* jlm_k_fattn_exp in 16 lanes (min(0, x) keeps a NaN lane NaN) */
static __m512 exp16(__m512 x)
{
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_setzero_ps(), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 z = _mm512_mul_ps(r, r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_add_ps(_mm512_mul_ps(y, z), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~tiny, y);
}

/* n floats of src (f32, or F16 bits) widened into dst */
static void widen(float *dst, const void *src, int f16, uint32_t n)
{
    uint32_t i = 0;
    if (f16) {
        const uint16_t *s = src;
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
        for (; i < n; i++)
            dst[i] = jlm_k_fp16_to_f32(s[i]);
    } else {
        const float *s = src;
        for (; i < n; i++)
            dst[i] = s[i];
    }
}

/* r[t] = row t (16 floats) -> dst + e*stride = element e of the 16 rows:
 * unpack pairs, shuffle quads, then transpose the 128-bit lanes (4 x 4) */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16], float *dst, size_t stride)
{
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int b = 0; b < 4; b++) {   /* rows 4b..4b+3: u[4b + c] holds element 4L + c of them in lane L */
        u[4 * b + 0] = _mm512_shuffle_ps(t[4 * b], t[4 * b + 2], 0x44);
        u[4 * b + 1] = _mm512_shuffle_ps(t[4 * b], t[4 * b + 2], 0xEE);
        u[4 * b + 2] = _mm512_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0x44);
        u[4 * b + 3] = _mm512_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        _mm512_storeu_ps(dst + (size_t)(0 + c) * stride, _mm512_shuffle_f32x4(v0, v2, 0x88));
        _mm512_storeu_ps(dst + (size_t)(4 + c) * stride, _mm512_shuffle_f32x4(v0, v2, 0xDD));
        _mm512_storeu_ps(dst + (size_t)(8 + c) * stride, _mm512_shuffle_f32x4(v1, v3, 0x88));
        _mm512_storeu_ps(dst + (size_t)(12 + c) * stride, _mm512_shuffle_f32x4(v1, v3, 0xDD));
    }
}

/* 16 dims of nrow keys (rows `stride` bytes apart from src, f32 or F16), zero
 * rows after them */
static inline __attribute__((always_inline)) void key_rows(__m512 rw[16], const uint8_t *src, uint64_t stride,
                                                           uint32_t nrow, int f16)
{
#pragma GCC unroll 16
    for (uint32_t t = 0; t < 16; t++) {
        const uint8_t *kj = src + t * stride;
        rw[t] = t >= nrow ? _mm512_setzero_ps()
              : f16       ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kj))
                          : _mm512_loadu_ps((const float *)kj);
    }
}

/* o (n floats) *= a */
static void scale_row(float *o, float a, uint32_t n)
{
    __m512 va = _mm512_set1_ps(a);
    uint32_t d = 0;
    for (; d + 16 <= n; d += 16)
        _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), va));
    if (d < n) {
        __mmask16 mk = (__mmask16)((1u << (n - d)) - 1);
        _mm512_mask_storeu_ps(o + d, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, o + d), va));
    }
}

/* 16 values (mask m) at element idx of a value row: f32, or F16 bits widened
 * where they lie (F16C, exact) */
static inline __attribute__((always_inline)) __m512 ldv(const void *base, int f16, uint64_t idx, __mmask16 m)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)base + idx));
    return _mm512_maskz_loadu_ps(m, (const float *)base + idx);
}

static inline __attribute__((always_inline)) __mmask16 mask16(uint32_t nd, uint32_t c)
{
    return nd >= 16 * c + 16 ? 0xffff : nd > 16 * c ? (__mmask16)((1u << (nd - 16 * c)) - 1) : 0;
}

/* o[0, nd) += s[jj] * v_jj[d0, d0 + nd) for keys jj in [a, b), ascending, nd <= 64,
 * value jj at element jj * vstr of vr (f32, or F16 where f16): four
 * accumulators that stay in registers (a runtime count of them, indexed in an
 * array, had GCC keep them on the stack: a store-to-load round trip per key
 * and chunk, ~5x slower at decode). Called with nd = 64 and f16 literally
 * where they are, so the masks and the loads fold. */
static inline __attribute__((always_inline)) void pv64(float *o, const void *vr, int f16, uint64_t d0, uint64_t vstr,
                                                       const float *s, uint32_t a, uint32_t b, uint32_t nd)
{
    __mmask16 m0 = mask16(nd, 0), m1 = mask16(nd, 1), m2 = mask16(nd, 2), m3 = mask16(nd, 3);
    __m512 a0 = _mm512_maskz_loadu_ps(m0, o), a1 = _mm512_maskz_loadu_ps(m1, o + 16);
    __m512 a2 = _mm512_maskz_loadu_ps(m2, o + 32), a3 = _mm512_maskz_loadu_ps(m3, o + 48);
    for (uint32_t jj = a; jj < b; jj++) {
        __m512 pj = _mm512_set1_ps(s[jj]);
        uint64_t v = jj * vstr + d0;
        a0 = _mm512_add_ps(a0, _mm512_mul_ps(pj, ldv(vr, f16, v, m0)));
        a1 = _mm512_add_ps(a1, _mm512_mul_ps(pj, ldv(vr, f16, v + 16, m1)));
        a2 = _mm512_add_ps(a2, _mm512_mul_ps(pj, ldv(vr, f16, v + 32, m2)));
        a3 = _mm512_add_ps(a3, _mm512_mul_ps(pj, ldv(vr, f16, v + 48, m3)));
    }
    _mm512_mask_storeu_ps(o, m0, a0);
    _mm512_mask_storeu_ps(o + 16, m1, a1);
    _mm512_mask_storeu_ps(o + 32, m2, a2);
    _mm512_mask_storeu_ps(o + 48, m3, a3);
}

/* pv64 for the four heads of a run at once: each value row is loaded once
 * for the four (it was four times), and the 16 accumulators are independent
 * chains (pv64's four are one add a key each, latency-bound). Per (head,
 * dimension) the adds are pv64's, keys ascending: the same bits. */
static inline __attribute__((always_inline)) void pv64x4(float *const o[4], const void *vr, int f16, uint64_t d0,
                                                         uint64_t vstr, const float *const s[4], uint32_t a,
                                                         uint32_t b, uint32_t nd)
{
    __mmask16 mk[4];
#pragma GCC unroll 4
    for (uint32_t c = 0; c < 4; c++)
        mk[c] = mask16(nd, c);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[u][c] = _mm512_maskz_loadu_ps(mk[c], o[u] + 16 * c);
    for (uint32_t jj = a; jj < b; jj++) {
        __m512 vc[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            vc[c] = ldv(vr, f16, jj * vstr + d0 + 16 * c, mk[c]);
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            __m512 pj = _mm512_set1_ps(s[u][jj]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[u][c] = _mm512_add_ps(acc[u][c], _mm512_mul_ps(pj, vc[c]));
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(o[u] + 16 * c, mk[c], acc[u][c]);
}

/* The scores of items qp[0..3] against the tile's 32 keys, dimension-major
 * at kc (f32, or F16 where f16), into s (rows of BK; nb of them stored). */
static inline __attribute__((always_inline)) void scores4(const void *kc, int f16, uint32_t hd,
                                                          const float *const qp[4], float *s, uint32_t nb)
{
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    for (uint32_t i = 0; i < hd; i++) {
        __m512 k0 = ldv(kc, f16, (size_t)i * BK, 0xffff), k1 = ldv(kc, f16, (size_t)i * BK + 16, 0xffff);
        __m512 q0 = _mm512_set1_ps(qp[0][i]), q1 = _mm512_set1_ps(qp[1][i]);
        __m512 q2 = _mm512_set1_ps(qp[2][i]), q3 = _mm512_set1_ps(qp[3][i]);
        a00 = _mm512_add_ps(a00, _mm512_mul_ps(q0, k0));
        a01 = _mm512_add_ps(a01, _mm512_mul_ps(q0, k1));
        a10 = _mm512_add_ps(a10, _mm512_mul_ps(q1, k0));
        a11 = _mm512_add_ps(a11, _mm512_mul_ps(q1, k1));
        a20 = _mm512_add_ps(a20, _mm512_mul_ps(q2, k0));
        a21 = _mm512_add_ps(a21, _mm512_mul_ps(q2, k1));
        a30 = _mm512_add_ps(a30, _mm512_mul_ps(q3, k0));
        a31 = _mm512_add_ps(a31, _mm512_mul_ps(q3, k1));
    }
    _mm512_storeu_ps(s, a00);
    _mm512_storeu_ps(s + 16, a01);
    if (nb > 1) { _mm512_storeu_ps(s + BK, a10); _mm512_storeu_ps(s + BK + 16, a11); }
    if (nb > 2) { _mm512_storeu_ps(s + 2 * BK, a20); _mm512_storeu_ps(s + 2 * BK + 16, a21); }
    if (nb > 3) { _mm512_storeu_ps(s + 3 * BK, a30); _mm512_storeu_ps(s + 3 * BK + 16, a31); }
}

void jlm_k_fattn_avx512(const jlm_k_fattn *p, const float *q, const void *k, const void *v, float *out,
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
    float kw[16 * 16];
    for (uint32_t j0 = jmin / BK * BK; jmin < jmax && j0 < jmax; j0 += BK) {
        uint32_t nk = jmax - j0 < BK ? jmax - j0 : BK;
        int any = 0;
        for (uint32_t r = r0; r < r1 && !any; r++)
            any = p->lo[r] < p->hi[r] && p->lo[r] < j0 + nk && p->hi[r] > j0;
        if (!any)
            continue;
        /* Kt[i][jj] = key j0+jj, dim i: the cache's own tile (k_tiled, F32),
         * its tile widened (k_tiled, F16), or transposed from rows: 16x16
         * blocks in registers (the keys past nk as zero rows) when hd is
         * whole vectors, else element by element (zero past nk) */
        const void *Kc = Kt;
        int kf16 = 0;   /* Kc holds F16 bits: one group of items (decode) reads the tile where it is */
        if (p->k_tiled) {
            const uint8_t *tile = (const uint8_t *)k + ((uint64_t)g * p->kh_stride + (uint64_t)j0 * hd) * es;
            if (!p->kv_f16 || ni <= 4)
                Kc = tile, kf16 = p->kv_f16;
            else
                for (uint32_t i = 0; i < hd; i++) {
                    const uint16_t *t16 = (const uint16_t *)tile + (size_t)i * BK;
                    _mm512_storeu_ps(Kt + (size_t)i * BK, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t16)));
                    _mm512_storeu_ps(Kt + (size_t)i * BK + 16,
                                     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t16 + 16))));
                }
        }
        for (uint32_t jb = 0; jb < BK && !p->k_tiled; jb += 16) {
            if (hd % 16 == 0) {
                uint32_t nrow = nk <= jb ? 0 : nk - jb < 16 ? nk - jb : 16;
                const uint8_t *k0 = (const uint8_t *)k + ((uint64_t)(j0 + jb) * p->k_stride + (uint64_t)g * p->kh_stride) * es;
                for (uint32_t i0 = 0; i0 < hd; i0 += 16) {
                    __m512 rw[16];
                    if (p->kv_f16)
                        key_rows(rw, k0 + (size_t)i0 * 2, p->k_stride * 2, nrow, 1);
                    else
                        key_rows(rw, k0 + (size_t)i0 * 4, p->k_stride * 4, nrow, 0);
                    transpose16(rw, Kt + (size_t)i0 * BK + jb, BK);
                }
                continue;
            }
            for (uint32_t jj = jb; jj < jb + 16; jj++) {
                if (jj >= nk) {
                    for (uint32_t i = 0; i < hd; i++)
                        Kt[(size_t)i * BK + jj] = 0.0f;
                    continue;
                }
                const uint8_t *kj = (const uint8_t *)k + ((uint64_t)(j0 + jj) * p->k_stride + (uint64_t)g * p->kh_stride) * es;
                for (uint32_t i0 = 0; i0 < hd; i0 += 16) {
                    uint32_t c = hd - i0 < 16 ? hd - i0 : 16;
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
        /* scores, 4 items at a time */
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
        /* online softmax and values, per row in runs of up to 4 of its
         * heads: their sums l go in one loop (four chains of adds instead of
         * one chain after another), then their values */
        static const float zeros[BK];
        for (uint32_t r = r0; r < r1; r++) {
            uint32_t lo = p->lo[r], hi = p->hi[r];
            if (!(lo < hi && lo < j0 + nk && hi > j0))
                continue;
            uint32_t a = (lo > j0 ? lo : j0) - j0, b = (hi < j0 + nk ? hi : j0 + nk) - j0;
            uint32_t valid = (uint32_t)(((uint64_t)1 << b) - 1) & ~(uint32_t)(((uint64_t)1 << a) - 1);
            for (uint32_t h0 = 0; h0 < G; h0 += 4) {
                uint32_t nh = G - h0 < 4 ? G - h0 : 4;
                float lq[4] = {0, 0, 0, 0};
                const float *sq[4] = {zeros, zeros, zeros, zeros};
                for (uint32_t u = 0; u < nh; u++) {
                    uint32_t it = (r - r0) * G + h0 + u, h = g * G + h0 + u;
                    float *s = S + (size_t)it * BK;
                    if (p->softcap > 0.0f)
                        for (uint32_t jj = a; jj < b; jj++)
                            s[jj] = p->softcap * tanhf(s[jj] / p->softcap);
                    __m512 sc = _mm512_set1_ps(p->scale);
                    __m512 s0 = _mm512_mul_ps(_mm512_loadu_ps(s), sc), s1 = _mm512_mul_ps(_mm512_loadu_ps(s + 16), sc);
                    __m512 ninf = _mm512_set1_ps(-INFINITY);
                    __m512 mx = _mm512_max_ps(_mm512_mask_mov_ps(ninf, (__mmask16)valid, s0),
                                              _mm512_mask_mov_ps(ninf, (__mmask16)(valid >> 16), s1));
                    float mt = _mm512_reduce_max_ps(mx), m = M[it], mn = fmaxf(m, mt);
                    if (mn == -INFINITY)
                        continue;
                    float al = m == mn ? 1.0f : jlm_k_fattn_exp(m - mn), l = L[it];   /* exp(0) is 1 exactly */
                    if (al != 1.0f) {
                        l = l * al;
                        scale_row(out + r * p->o_stride + (uint64_t)h * hdv, al, hdv);
                    }
                    __m512 vm = _mm512_set1_ps(mn);
                    _mm512_storeu_ps(s, exp16(_mm512_sub_ps(s0, vm)));
                    _mm512_storeu_ps(s + 16, exp16(_mm512_sub_ps(s1, vm)));
                    M[it] = mn;
                    lq[u] = l;
                    sq[u] = s;
                }
                float l0 = lq[0], l1 = lq[1], l2 = lq[2], l3 = lq[3];
                for (uint32_t jj = a; jj < b; jj++) {
                    l0 = l0 + sq[0][jj];
                    l1 = l1 + sq[1][jj];
                    l2 = l2 + sq[2][jj];
                    l3 = l3 + sq[3][jj];
                }
                lq[0] = l0, lq[1] = l1, lq[2] = l2, lq[3] = l3;
                if (nh == 4 && sq[0] != zeros && sq[1] != zeros && sq[2] != zeros && sq[3] != zeros) {
                    float *o4[4];
                    for (uint32_t u = 0; u < 4; u++) {
                        uint32_t it = (r - r0) * G + h0 + u;
                        o4[u] = out + r * p->o_stride + (uint64_t)(g * G + h0 + u) * hdv;
                        L[it] = lq[u];
                    }
                    for (uint32_t d0 = 0; d0 < hdv; d0 += 64) {
                        float *const od[4] = {o4[0] + d0, o4[1] + d0, o4[2] + d0, o4[3] + d0};
                        if (vf16)
                            pv64x4(od, vbase, 1, d0, vstr, sq, a, b, hdv - d0 >= 64 ? 64 : hdv - d0);
                        else if (hdv - d0 >= 64)
                            pv64x4(od, vbase, 0, d0, vstr, sq, a, b, 64);
                        else
                            pv64x4(od, vbase, 0, d0, vstr, sq, a, b, hdv - d0);
                    }
                    continue;
                }
                for (uint32_t u = 0; u < nh; u++) {
                    if (sq[u] == zeros)
                        continue;   /* every score of the tile -inf */
                    uint32_t it = (r - r0) * G + h0 + u, h = g * G + h0 + u;
                    float *o = out + r * p->o_stride + (uint64_t)h * hdv;
                    for (uint32_t d0 = 0; d0 < hdv; d0 += 64) {
                        if (vf16)
                            pv64(o + d0, vbase, 1, d0, vstr, sq[u], a, b, hdv - d0 >= 64 ? 64 : hdv - d0);
                        else if (hdv - d0 >= 64)
                            pv64(o + d0, vbase, 0, d0, vstr, sq[u], a, b, 64);
                        else
                            pv64(o + d0, vbase, 0, d0, vstr, sq[u], a, b, hdv - d0);
                    }
                    L[it] = lq[u];
                }
            }
        }
    }
    for (uint32_t it = 0; it < ni; it++) {
        uint32_t r = r0 + it / G, h = g * G + it % G;
        if (L[it] > 0.0f)
            scale_row(out + r * p->o_stride + (uint64_t)h * hdv, 1.0f / L[it], hdv);
    }
}

/* jlm_k_swiglu, 16 lanes at a time with its operations (the tail: it). */
void jlm_k_swiglu_avx512(float *out, const float *gate, const float *up, uint64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = exp16(_mm512_or_ps(g, sign));   /* exp(-|g|) */
        __mmask16 pos = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ);
        __m512 s = _mm512_div_ps(_mm512_mask_mov_ps(e, pos, one), _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, s), _mm512_loadu_ps(up + i)));
    }
    if (i < n)
        jlm_k_swiglu(out + i, gate + i, up + i, n - i);
}
