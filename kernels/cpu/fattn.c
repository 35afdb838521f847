/* fattn.c - batched (flash-attention style) attention: the scalar reference
 * that defines its math (kernels.h, jlm_k_fattn), the shared exp, and the
 * scratch size. The vector variants (fattn_avx2.c, fattn_avx512.c) compute
 * the same f32 operations in the same order per (row, head), lanes across
 * the keys of a tile for the scores and across dimensions for the values. */
#include "kernels/cpu/kernels.h"

#include <math.h>
#include <string.h>

#define BK JLM_K_FATTN_BK
#define BQ JLM_K_FATTN_BQ

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

size_t jlm_k_fattn_scratch_floats(uint32_t head_dim, uint32_t head_dim_v, uint32_t group)
{
    /* Kt (head_dim, BK) transposed key tile, Vt (BK, head_dim_v) widened F16
     * values, S (group*BQ, BK) scores, M and L (group*BQ) */
    return al16((size_t)head_dim * BK) + al16((size_t)BK * head_dim_v) + (size_t)group * BQ * BK +
           2 * al16((size_t)group * BQ) + 16;
}

/* Cephes expf: n = rint(x log2 e), r = x - n ln2 (two parts), e^r by a
 * degree-5 polynomial, times 2^n built in the exponent bits. x <= 0 here
 * (a score minus a running max), so n is in [-126, 0]: 2^n is normal. */
float jlm_k_fattn_exp(float x)
{
    if (x != x)
        return x;
    if (x < -87.0f)
        return 0.0f;
    if (x > 0.0f)
        x = 0.0f;
    float n = rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float z = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * z + r;
    y = y + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    return y * s;
}

static float kv_at(const void *base, int f16, uint64_t i)
{
    return f16 ? jlm_k_fp16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* Element i of key j of KV head g (kernels.h: rows, or k_tiled tiles). */
static uint64_t key_index(const jlm_k_fattn *p, uint32_t g, uint32_t j, uint32_t i)
{
    if (p->k_tiled)
        return (uint64_t)g * p->kh_stride + (uint64_t)(j / BK) * BK * p->head_dim + (uint64_t)i * BK + j % BK;
    return (uint64_t)j * p->k_stride + (uint64_t)g * p->kh_stride + i;
}

/* One (row, head) at a time, straight from the cache: the definition. */
void jlm_k_fattn_ref(const jlm_k_fattn *p, const float *q, const void *k, const void *v, float *out,
                     uint32_t g, uint32_t r0, uint32_t r1, float *scratch)
{
    (void)scratch;
    const uint32_t G = p->group, hd = p->head_dim, hdv = p->head_dim_v;
    for (uint32_t r = r0; r < r1; r++) {
        for (uint32_t hh = 0; hh < G; hh++) {
            uint32_t h = g * G + hh;
            const float *qr = q + r * p->q_stride + (uint64_t)h * hd;
            float *o = out + r * p->o_stride + (uint64_t)h * hdv;
            float m = p->sinks ? p->sinks[h] : -INFINITY, l = p->sinks ? 1.0f : 0.0f;
            for (uint32_t d = 0; d < hdv; d++)
                o[d] = 0.0f;
            uint32_t lo = p->lo[r], hi = p->hi[r];
            for (uint32_t j0 = lo / BK * BK; lo < hi && j0 < hi; j0 += BK) {
                uint32_t a = lo > j0 ? lo : j0, b = hi < j0 + BK ? hi : j0 + BK;
                float s[BK], mt = -INFINITY;
                for (uint32_t j = a; j < b; j++) {
                    float x = 0.0f;
                    for (uint32_t i = 0; i < hd; i++)
                        x = x + qr[i] * kv_at(k, p->kv_f16, key_index(p, g, j, i));
                    if (p->softcap > 0.0f)
                        x = p->softcap * tanhf(x / p->softcap);
                    x = x * p->scale;
                    s[j - j0] = x;
                    mt = fmaxf(mt, x);
                }
                float mn = fmaxf(m, mt);
                if (mn == -INFINITY)
                    continue;
                float al = jlm_k_fattn_exp(m - mn);
                if (al != 1.0f) {
                    l = l * al;
                    for (uint32_t d = 0; d < hdv; d++)
                        o[d] = o[d] * al;
                }
                for (uint32_t j = a; j < b; j++) {
                    float pj = jlm_k_fattn_exp(s[j - j0] - mn);
                    l = l + pj;
                    uint64_t vb = (uint64_t)j * p->v_stride + (uint64_t)g * p->vh_stride;
                    for (uint32_t d = 0; d < hdv; d++)
                        o[d] = o[d] + pj * kv_at(v, p->kv_f16, vb + d);
                }
                m = mn;
            }
            if (l > 0.0f) {
                float inv = 1.0f / l;
                for (uint32_t d = 0; d < hdv; d++)
                    o[d] = o[d] * inv;
            }
        }
    }
}
