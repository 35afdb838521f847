/* body.h - the per-thread bodies of the CUDA kernels, one source for two
 * compilers: nvcc builds them as __host__ __device__ functions for the
 * __global__ wrappers in kernels/cuda/kernels.cu, and gcc builds them as plain
 * C for the host harness (kernels/cuda/harness.c), which runs the same bodies
 * over an emulated grid so the CPU test suite (suite `cuda`) checks their
 * indexing and arithmetic against the CPU reference kernels without a GPU.
 *
 * Owns: the device-side math of every stored type read in place from the
 * packed planes (jlm-format.md 7.1-7.7), activation quantization (7.7),
 * rmsnorm, softmax, RoPE (ggml rope_ext + YaRN), the element-wise
 * activations, F16 and Q8_0 cache rows, and decode attention with GQA,
 * sinks, softcap and a mask over keys and values each F32, F16 or Q8_0.
 *
 * Invariants:
 *  (1) Matvec: a row is a sum of terms in order (jlm_cu_term), each term the
 *      same f32 operations as jlm_k_matvec_ref (kernels/cpu/matvec_ref.c),
 *      so the result is bit-identical to the CPU reference for every type.
 *      The terms of 32 rows are computed by several warps and added in order
 *      by one (the matvec grid below). The transposed planes make this
 *      coalesced: word w of sub-block s is at (s*W + w)*rows + r, so
 *      neighbouring threads read neighbouring words.
 *  (2) Reductions (norm, softmax, attention) are split into named phases:
 *      a strided per-thread partial, a fixed binary tree over JLM_CU_THREADS
 *      partials (jlm_cu_tree_*), and a strided apply. Device code puts
 *      __syncthreads() between phases; the harness runs each phase for every
 *      thread before the next. Sums are in double as in ops.c; the tree order
 *      differs from ops.c's sequential one, so those results are within
 *      kernels/cpu/tolerances.h, not bit-identical.
 *  (3) Bodies touch only their arguments; no globals, no allocation.
 *
 * The plane readers, per-row math and small helpers below (fp16 conversion,
 * the YaRN ramp) are deliberate twins of matvec_ref.c/ops.c: device code
 * cannot call host functions, and the CPU reference must stay an independent
 * implementation for suite `cuda` to compare against (sharing one copy would
 * make that comparison vacuous).
 * Everything here is C that is also valid C++ (nvcc compiles it as C++). */
#ifndef JLM_CU_BODY_H
#define JLM_CU_BODY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/layout.h"

#ifdef __CUDACC__
#define JLM_CU_HD static inline __host__ __device__
#else
#define JLM_CU_HD static inline
#endif

#define JLM_CU_THREADS   256u   /* threads per block of the reduction kernels (power of 2) */
#define JLM_CU_MV_WARPS  8u     /* warps per matvec block of a large grid (jlm_cu_mv_warps) */

/* Stored type codes: JLM_KT_* of kernels/layout.h (C and C++, shared with the
 * Vulkan shaders; vk.c asserts them equal to format/jlm_format.h's). */

/* A packed sheet with its traits resolved on the host (jlm_cu_mat_from). */
typedef struct jlm_cu_mat {
    uint32_t type, sub, p0, p1, w, d_share;
    uint64_t k, rows;
    const void     *qs;   /* u32 words (quantized) or (rows, k) row-major floats */
    const uint32_t *d, *sc;
} jlm_cu_mat;

/* int8 activations as jlm_act_q8 (7.7). */
typedef struct jlm_cu_act {
    uint64_t k;
    int8_t  *q;
    float   *d;
    int16_t *sum16;
} jlm_cu_act;

/* A batch of sheets of one shape in one matvec grid (jlm_cu_k_matvec;
 * deepseek2's per-head attn_k_b / attn_v_b): sheet h's qs/d/sc planes q/d/s
 * bytes (multiples of 4) after sheet h-1's; token t of sheet h reads its
 * floats at x + t*tx + h*bx or its act record h*rs + t, and writes its rows
 * at y + t*ty + h*by. A plain matvec is the batch {1, k, rows, 0, ...}. */
typedef struct jlm_cu_batch {
    uint64_t n, tx, ty, bx, by, q, d, s, rs;
} jlm_cu_batch;

/* Sheet h of the batch whose sheet 0 is m. */
JLM_CU_HD jlm_cu_mat jlm_cu_batch_sheet(const jlm_cu_mat *m, const jlm_cu_batch *b, uint64_t h)
{
    jlm_cu_mat s = *m;
    s.qs = (const uint8_t *)m->qs + h * b->q;
    if (m->d)
        s.d = (const uint32_t *)(const void *)((const uint8_t *)m->d + h * b->d);
    if (m->sc)
        s.sc = (const uint32_t *)(const void *)((const uint8_t *)m->sc + h * b->s);
    return s;
}

/* ---------------------------------------------------------------- scalar conversions */

JLM_CU_HD float jlm_cu_bits_f32(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

JLM_CU_HD uint32_t jlm_cu_f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

JLM_CU_HD float jlm_cu_fp16_to_f32(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    if (exp == 0x1f)
        return jlm_cu_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-8f;   /* 2^-24: exact */
        return sign ? -f : f;
    }
    return jlm_cu_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

JLM_CU_HD uint32_t jlm_cu_f32_to_fp16(float f)
{
    uint32_t x = jlm_cu_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00u | ((ax >> 13) & 0x3ffu);
    if (ax >= 0x477ff000u)
        return sign | 0x7c00u;
    if (ax < 0x38800000u)
        return sign | (uint32_t)rintf(jlm_cu_bits_f32(ax) * 16777216.0f);
    return (sign | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13)) & 0xffffu;
}

/* ---------------------------------------------------------------- activation quantization */

/* Block b (32 elements) of x into a: thread per block. Same rounding as
 * jlm_k_quantize_act: half away from zero, inf/NaN block -> d NaN, q 0. */
JLM_CU_HD void jlm_cu_quantize_block(const float *x, const jlm_cu_act *a, uint64_t b)
{
    const float *xb = x + 32 * b;
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < 32; i++) {
        float v = fabsf(xb[i]);
        if (!(v <= 3.4028235e38f))
            bad = 1;
        else if (v > amax)
            amax = v;
    }
    float d = bad ? jlm_cu_bits_f32(0x7fc00000u) : amax / 127.0f;
    int8_t *q = a->q + 32 * b;
    for (int i = 0; i < 32; i++) {
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

/* ---------------------------------------------------------------- plane readers (7.1-7.5) */

/* Row r's slot of super-block sb's d words: S = d_share rows (1, 2 or 4) per
 * word, so shifts, not divisions (a 64-bit division is a long call on the
 * device). */
JLM_CU_HD uint32_t jlm_cu_dword(const jlm_cu_mat *m, uint64_t sb, uint64_t r)
{
    unsigned S = m->d_share;
    if (S == 1)
        return m->d[sb * m->rows + r];
    unsigned lg = S == 2 ? 1 : 2;
    uint32_t w = m->d[sb * ((m->rows + S - 1) >> lg) + (r >> lg)];
    return (w >> ((32 >> lg) * (unsigned)(r & (S - 1)))) & (S == 2 ? 0xffffu : 0xffu);
}

/* 6-bit field f of super-block sb's 96-bit scale record (three words): bits
 * 6f..6f+5, which span at most two words. */
JLM_CU_HD uint32_t jlm_cu_field6(const jlm_cu_mat *m, uint64_t sb, uint64_t r, unsigned f)
{
    unsigned bit = 6 * f, i = bit / 32, o = bit % 32;
    uint32_t v = m->sc[(sb * 3 + i) * m->rows + r] >> o;
    if (o > 26)
        v |= m->sc[(sb * 3 + i + 1) * m->rows + r] << (32 - o);
    return v & 63u;
}

JLM_CU_HD int32_t jlm_cu_scbyte(const jlm_cu_mat *m, uint64_t s, uint64_t r)
{
    return (int32_t)((m->sc[(s / 4) * m->rows + r] >> (8 * (s % 4))) & 0xffu);
}

/* MXFP4 e2m1 codes, doubled, plus 12 (7.6); a switch, not a table, so no
 * global memory is needed on the device. */
JLM_CU_HD int32_t jlm_cu_mxfp4(int32_t q)
{
    switch (q & 15) {
    case 0: return 12;  case 1: return 13;  case 2: return 14;  case 3: return 15;
    case 4: return 16;  case 5: return 18;  case 6: return 20;  case 7: return 24;
    case 8: return 12;  case 9: return 11;  case 10: return 10; case 11: return 9;
    case 12: return 8;  case 13: return 6;  case 14: return 4;  default: return 0;
    }
}

/* Sum of the four int8 products of a and b, plus c: __dp4a on the device,
 * the same integer sum on the host (exact, so the order does not matter). */
JLM_CU_HD int32_t jlm_cu_dp4a(uint32_t a, uint32_t b, int32_t c)
{
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (unsigned i = 0; i < 4; i++)
        c += (int32_t)(int8_t)(a >> (8 * i)) * (int32_t)(int8_t)(b >> (8 * i));
    return c;
#endif
}

/* Four int8 activations as one word (the act codes are 4-byte aligned:
 * sub-blocks start at multiples of 16). */
JLM_CU_HD uint32_t jlm_cu_load4(const int8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)p;
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

/* Codes 4g..4g+3 of one row's sub-block as four bytes, read a word at a time
 * (jlm-format.md 7.5; dequant_ref.c's unpack byte by byte). col points at
 * the sub-block's word 0 of the row; word w is col[w * rows]. Low nibbles of
 * elements below sub/2 are the low halves of the first sub/8 words, the rest
 * their high halves; the p1 high bits of group g sit in word sub/8 + g /
 * (8 / p1), shifted by p1 * (g % (8 / p1)) within each byte. MXFP4's codes
 * (lut) go through its table byte by byte. */
JLM_CU_HD uint32_t jlm_cu_codes4(const uint32_t *col, uint64_t rows, unsigned g, unsigned sub, unsigned p0,
                                 unsigned p1, int lut)
{
    if (p0 == 8)
        return col[g * rows];
    unsigned nw = sub / 8;
    uint32_t w = col[(g % nw) * rows];
    uint32_t q = (g < nw ? w : w >> 4) & 0x0f0f0f0fu;
    if (p1) {
        unsigned lanes = 8 / p1;
        uint32_t hw = col[(nw + g / lanes) * rows];
        q |= ((hw >> (p1 * (g % lanes))) & (((1u << p1) - 1u) * 0x01010101u)) << 4;
    }
    if (lut) {
#ifdef __CUDA_ARCH__
        /* the table's 16 bytes in four words; __byte_perm picks among 8 by
         * the low 3 bits of each code, bit 3 chooses the upper or lower 8 */
        uint32_t sel = (q & 7u) | ((q >> 4) & 0x70u) | ((q >> 8) & 0x700u) | ((q >> 12) & 0x7000u);
        uint32_t lo = __byte_perm(0x0f0e0d0cu, 0x18141210u, sel), hi = __byte_perm(0x090a0b0cu, 0x00040608u, sel);
        uint32_t upper = ((q & 0x08080808u) >> 3) * 0xffu;
        q = (hi & upper) | (lo & ~upper);
#else
        uint32_t v = 0;
        for (unsigned b = 0; b < 4; b++)
            v |= (uint32_t)jlm_cu_mxfp4((int32_t)((q >> (8 * b)) & 15u)) << (8 * b);
        q = v;
#endif
    }
    return q;
}

/* nvcc unrolls a loop of constant trip count under this; gcc has no such
 * pragma (and warns on unknown ones). */
#ifdef __CUDACC__
#define JLM_CU_UNROLL _Pragma("unroll")
#else
#define JLM_CU_UNROLL
#endif

/* The integer dot of one row's sub-block with its sub activations. Called
 * with constant layout arguments, it compiles to straight-line code: every
 * word's load issued up front, no division. */
JLM_CU_HD int32_t jlm_cu_dot_c(const uint32_t *col, uint64_t rows, const int8_t *a, unsigned sub, unsigned p0,
                               unsigned p1, int lut)
{
    int32_t acc = 0;
    JLM_CU_UNROLL
    for (unsigned g = 0; g < sub / 4; g++)
        acc = jlm_cu_dp4a(jlm_cu_codes4(col, rows, g, sub, p0, p1, lut), jlm_cu_load4(a + 4 * g), acc);
    return acc;
}

/* Sub-block s of row r against a: each stored type with its layout as
 * constants (format/types.c: sub, p0, p1; MXFP4 through its table). */
JLM_CU_HD int32_t jlm_cu_dot(const jlm_cu_mat *m, const int8_t *a, uint64_t s, uint64_t r)
{
    const uint64_t rows = m->rows;
    const uint32_t *col = (const uint32_t *)m->qs + s * m->w * rows + r;
    switch (m->type) {
    case JLM_KT_Q4_0: case JLM_KT_Q4_K: return jlm_cu_dot_c(col, rows, a, 32, 4, 0, 0);
    case JLM_KT_MXFP4:                  return jlm_cu_dot_c(col, rows, a, 32, 4, 0, 1);
    case JLM_KT_Q8_0:                   return jlm_cu_dot_c(col, rows, a, 32, 8, 0, 0);
    case JLM_KT_Q5_0: case JLM_KT_Q5_1:
    case JLM_KT_Q5_K:                   return jlm_cu_dot_c(col, rows, a, 32, 4, 1, 0);
    case JLM_KT_Q3_K:                   return jlm_cu_dot_c(col, rows, a, 16, 4, 0, 0);
    case JLM_KT_Q6_K:                   return jlm_cu_dot_c(col, rows, a, 16, 4, 2, 0);
    default:                            return jlm_cu_dot_c(col, rows, a, m->sub, m->p0, m->p1, 0);
    }
}

/* ---------------------------------------------------------------- per-row math */

/* A row is a sum of terms taken in order: acc = 0, acc += term(0), term(1), ...
 * For quantized types term i is 32-element block i's scaled dot (k / 32
 * terms); for float types it is the product of element i (k terms). Each term
 * is computed with the same f32 operations as jlm_k_matvec_ref, and the sum
 * runs in the same order, so any grid that computes the terms in parallel and
 * adds them in order is bit-identical to the reference. */
JLM_CU_HD int jlm_cu_is_float(const jlm_cu_mat *m)
{
    return m->type == JLM_KT_F32 || m->type == JLM_KT_F16 || m->type == JLM_KT_BF16;
}

JLM_CU_HD uint64_t jlm_cu_n_terms(const jlm_cu_mat *m)
{
    return jlm_cu_is_float(m) ? m->k : m->k / 32;
}

JLM_CU_HD float jlm_cu_term_sub32(const jlm_cu_mat *m, const jlm_cu_act *a, uint64_t r, uint64_t s)
{
    uint32_t type = m->type;
    const int8_t *aq = a->q + 32 * s;
    int32_t suma = a->sum16[2 * s] + a->sum16[2 * s + 1];
    float da = a->d[s];
    uint32_t dw = jlm_cu_dword(m, s, r);
    if (type == JLM_KT_Q5_1) {
        int32_t dot = jlm_cu_dot(m, aq, s, r);
        float d = jlm_cu_fp16_to_f32(dw & 0xffffu), b = jlm_cu_fp16_to_f32(dw >> 16);
        return (d * da) * (float)dot - (b * da) * (float)suma;
    }
    int32_t bias = type == JLM_KT_Q4_0 ? 8 : type == JLM_KT_Q5_0 ? 16 : type == JLM_KT_MXFP4 ? 12 : 0;
    int32_t isum = jlm_cu_dot(m, aq, s, r) - bias * suma;
    float d = type == JLM_KT_MXFP4 ? jlm_cu_bits_f32(dw << 23) : jlm_cu_fp16_to_f32(dw & 0xffffu);
    return (d * da) * (float)isum;
}

JLM_CU_HD float jlm_cu_term_k32(const jlm_cu_mat *m, const jlm_cu_act *a, uint64_t r, uint64_t s)
{
    uint64_t sb = s / 8;
    unsigned j = (unsigned)(s % 8);
    uint32_t dw = jlm_cu_dword(m, sb, r);
    float d = jlm_cu_fp16_to_f32(dw & 0xffffu), dmin = jlm_cu_fp16_to_f32(dw >> 16);
    int32_t sc = (int32_t)jlm_cu_field6(m, sb, r, 2 * j), mn = (int32_t)jlm_cu_field6(m, sb, r, 2 * j + 1);
    int32_t dot = jlm_cu_dot(m, a->q + 32 * s, s, r);
    int32_t suma = a->sum16[2 * s] + a->sum16[2 * s + 1];
    float t = d * (float)(sc * dot) - dmin * (float)(mn * suma);
    return a->d[s] * t;
}

JLM_CU_HD float jlm_cu_term_k16(const jlm_cu_mat *m, const jlm_cu_act *a, uint64_t r, uint64_t b)
{
    int q3 = m->type == JLM_KT_Q3_K;
    int32_t off = q3 ? -32 : -128, bias = q3 ? 4 : 32;
    float d = jlm_cu_fp16_to_f32(jlm_cu_dword(m, b / 8, r) & 0xffffu);
    int32_t isum = 0;
    for (uint64_t s = 2 * b; s < 2 * b + 2; s++) {
        int32_t dot = jlm_cu_dot(m, a->q + 16 * s, s, r) - bias * a->sum16[s];
        isum += (jlm_cu_scbyte(m, s, r) + off) * dot;
    }
    return (d * a->d[b]) * (float)isum;
}

JLM_CU_HD float jlm_cu_term_float(const jlm_cu_mat *m, const float *x, uint64_t r, uint64_t i)
{
    if (m->type == JLM_KT_F32)
        return ((const float *)m->qs)[r * m->k + i] * x[i];
    uint16_t w = ((const uint16_t *)m->qs)[r * m->k + i];
    return (m->type == JLM_KT_BF16 ? jlm_cu_bits_f32((uint32_t)w << 16) : jlm_cu_fp16_to_f32(w)) * x[i];
}

/* Term i of row r of a quantized type (float types: jlm_cu_term_float). */
JLM_CU_HD float jlm_cu_term(const jlm_cu_mat *m, const jlm_cu_act *a, uint64_t r, uint64_t i)
{
    switch (m->type) {
    case JLM_KT_Q4_K: case JLM_KT_Q5_K:
        return jlm_cu_term_k32(m, a, r, i);
    case JLM_KT_Q3_K: case JLM_KT_Q6_K:
        return jlm_cu_term_k16(m, a, r, i);
    default:
        return jlm_cu_term_sub32(m, a, r, i);
    }
}

/* ---------------------------------------------------------------- matvec grid (jlm_cu_k_matvec)
 *
 * A block owns 32 rows and one token: lane = row within the block. Its warp 0
 * adds terms; warps 1.. (the workers) compute them, a chunk of
 * JLM_CU_MV_CHUNK terms at a time, into one of two shared buffers
 * (term j of row lane at j * JLM_CU_MV_PITCH + lane). Step c of the block:
 * the workers fill chunk c into buffer c % 2 while warp 0 adds chunk c - 1
 * from the other buffer in order; a barrier ends the step. So a row's terms
 * are computed by many threads and summed in order by one: the reference's
 * sum (above), bit for bit. Quantized workers take terms j = worker, worker + W, ...
 * of their own row (the planes are transposed: a warp reads 32 neighbouring
 * words); float workers take rows worker, worker + W, ... with lane = element
 * (the float sheets are row-major: a warp reads 32 neighbouring elements). */
#define JLM_CU_MV_CHUNK 64u
#define JLM_CU_MV_PITCH 33u

/* Warps per matvec block for a grid of `blocks` blocks. Measured on an H200
 * (docs/cuda.md, "On an H200"): a grid of few blocks is latency-bound, and
 * more warps per block give each worker fewer terms in a row; a grid of many
 * blocks does best with 8. 2048 x 2048 Q4_K: 25.9 us at 8 warps, 16.2 at 16,
 * 12.0 at 32; 8192 x 2048: 26.7, 18.1, 22.0; 16384 x 16384: 280, 309, 374.
 * So 32 warps up to 64 blocks (2048 rows of one token), 16 up to 256, else 8.
 * The result does not depend on it. */
JLM_CU_HD unsigned jlm_cu_mv_warps(uint64_t blocks)
{
    return blocks <= 64 ? 32u : blocks <= 256 ? 16u : JLM_CU_MV_WARPS;
}

JLM_CU_HD void jlm_cu_mv_fill(const jlm_cu_mat *m, const float *x, const jlm_cu_act *a, uint64_t r0,
                              unsigned lane, unsigned worker, unsigned workers, uint64_t c0, float *sh)
{
    uint64_t n = jlm_cu_n_terms(m), end = c0 + JLM_CU_MV_CHUNK < n ? c0 + JLM_CU_MV_CHUNK : n;
    if (jlm_cu_is_float(m)) {
        for (unsigned rr = worker; rr < 32 && r0 + rr < m->rows; rr += workers)
            for (uint64_t i = c0 + lane; i < end; i += 32)
                sh[(i - c0) * JLM_CU_MV_PITCH + rr] = jlm_cu_term_float(m, x, r0 + rr, i);
        return;
    }
    if (r0 + lane >= m->rows)
        return;
    for (uint64_t i = c0 + worker; i < end; i += workers)
        sh[(i - c0) * JLM_CU_MV_PITCH + lane] = jlm_cu_term(m, a, r0 + lane, i);
}

/* Warp 0's part of a step: chunk c0's terms of row lane added to acc in order. */
JLM_CU_HD float jlm_cu_mv_add(const jlm_cu_mat *m, const float *sh, uint64_t c0, unsigned lane, float acc)
{
    uint64_t n = jlm_cu_n_terms(m), cnt = c0 + JLM_CU_MV_CHUNK < n ? JLM_CU_MV_CHUNK : n - c0;
    for (uint64_t j = 0; j < cnt; j++)
        acc += sh[j * JLM_CU_MV_PITCH + lane];
    return acc;
}

/* ---------------------------------------------------------------- block reductions */

/* One level of the tree: thread t < half folds partial t + half into t. */
JLM_CU_HD void jlm_cu_tree_sum(double *sh, unsigned t, unsigned half)
{
    if (t < half)
        sh[t] += sh[t + half];
}

JLM_CU_HD void jlm_cu_tree_max(float *sh, unsigned t, unsigned half)
{
    if (t < half)
        sh[t] = fmaxf(sh[t], sh[t + half]);
}

/* rmsnorm phase 1: thread t's partial sum of squares (elements t, t+T, ...). */
JLM_CU_HD double jlm_cu_rms_partial(const float *x, uint64_t n, unsigned t, unsigned T)
{
    double s = 0.0;
    for (uint64_t i = t; i < n; i += T)
        s += (double)(x[i] * x[i]);
    return s;
}

/* rmsnorm phase 2: sum is the tree's total. out may be x. */
JLM_CU_HD void jlm_cu_rms_apply(float *out, const float *x, const float *w, uint64_t n, float eps,
                                double sum, unsigned t, unsigned T)
{
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (uint64_t i = t; i < n; i += T)
        out[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

/* layernorm phase 1: partial sum of x; phase 2: out = x - mean and the
 * partial sum of its squares; phase 3: scale, weight, bias. out may be x. */
JLM_CU_HD double jlm_cu_sum_partial(const float *x, uint64_t n, unsigned t, unsigned T)
{
    double s = 0.0;
    for (uint64_t i = t; i < n; i += T)
        s += (double)x[i];
    return s;
}

JLM_CU_HD double jlm_cu_center_partial(float *out, const float *x, uint64_t n, float mean,
                                       unsigned t, unsigned T)
{
    double s = 0.0;
    for (uint64_t i = t; i < n; i += T) {
        float v = x[i] - mean;
        out[i] = v;
        s += (double)(v * v);
    }
    return s;
}

JLM_CU_HD void jlm_cu_ln_apply(float *out, const float *w, const float *b, uint64_t n, float eps,
                               double sum2, unsigned t, unsigned T)
{
    const float scale = 1.0f / sqrtf((float)(sum2 / (double)n) + eps);
    for (uint64_t i = t; i < n; i += T) {
        float v = out[i] * scale;
        if (w)
            v *= w[i];
        if (b)
            v += b[i];
        out[i] = v;
    }
}

/* softmax phase 1: partial max; phase 2: exp in place and partial sum;
 * phase 3: scale by 1/total. */
JLM_CU_HD float jlm_cu_max_partial(const float *x, uint64_t n, unsigned t, unsigned T)
{
    float m = -INFINITY;
    for (uint64_t i = t; i < n; i += T)
        m = fmaxf(m, x[i]);
    return m;
}

JLM_CU_HD double jlm_cu_exp_partial(float *x, uint64_t n, float max, unsigned t, unsigned T)
{
    double s = 0.0;
    for (uint64_t i = t; i < n; i += T) {
        float v = expf(x[i] - max);
        x[i] = v;
        s += (double)v;
    }
    return s;
}

JLM_CU_HD void jlm_cu_scale_strided(float *x, uint64_t n, float s, unsigned t, unsigned T)
{
    for (uint64_t i = t; i < n; i += T)
        x[i] *= s;
}

/* ---------------------------------------------------------------- rope (ggml rope_ext + YaRN) */

typedef struct jlm_cu_rope {
    uint32_t     n_rot, neox, orig_ctx;
    float        freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    const float *freq_factors;   /* (n_rot/2,) or NULL */
    const uint32_t *dpos;        /* device memory: the position read there, not the launch's (NULL: the launch's) */
} jlm_cu_rope;

/* The position a launch works at: *dpos when given (a decoded token's
 * launches are then the same every token: a CUDA graph replays them), else
 * the launch argument. */
JLM_CU_HD int64_t jlm_cu_pos_at(const uint32_t *dpos, int64_t pos)
{
    return dpos ? (int64_t)*dpos : pos;
}

JLM_CU_HD float jlm_cu_yarn_dim(uint32_t n_dims, uint32_t orig_ctx, float n_rot, float base)
{
    return (float)n_dims * logf((float)orig_ctx / (n_rot * 2.0f * 3.14159265358979323846f)) /
           (2.0f * logf(base));
}

/* One (head, pair) of x (n_head heads of head_dim floats) at position pos:
 * the body of the rope kernel, thread = h * (n_rot/2) + pair. theta is
 * pos * theta_scale^pair accumulated by repeated f32 multiplies, as ggml's
 * loop does, so the host harness matches ops.c bit for bit. */
JLM_CU_HD void jlm_cu_rope_pair(const jlm_cu_rope *p, float *x, uint32_t head_dim, int64_t pos,
                                uint32_t h, uint32_t pair)
{
    const float theta_scale = powf(p->freq_base, -2.0f / (float)p->n_rot);
    float theta_ex = (float)pos;
    for (uint32_t i = 0; i < pair; i++)
        theta_ex *= theta_scale;
    uint32_t i0 = 2 * pair, half = p->n_rot / 2;
    theta_ex /= p->freq_factors ? p->freq_factors[pair] : 1.0f;
    float theta = p->freq_scale * theta_ex, mscale = p->attn_factor;
    if (p->ext_factor != 0.0f) {
        float lo = fmaxf(0.0f, floorf(jlm_cu_yarn_dim(p->n_rot, p->orig_ctx, p->beta_fast, p->freq_base)));
        float hi = fminf((float)p->n_rot - 1.0f,
                         ceilf(jlm_cu_yarn_dim(p->n_rot, p->orig_ctx, p->beta_slow, p->freq_base)));
        float y = ((float)(i0 / 2) - lo) / fmaxf(0.001f, hi - lo);
        float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p->ext_factor;
        theta = theta * (1.0f - mix) + theta_ex * mix;
        mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
    }
    float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
    float *xh = x + (uint64_t)h * head_dim;
    uint32_t a = p->neox ? pair : i0, b = p->neox ? pair + half : i0 + 1;
    float x0 = xh[a], x1 = xh[b];
    xh[a] = x0 * c - x1 * s;
    xh[b] = x0 * s + x1 * c;
}

/* ---------------------------------------------------------------- element-wise activations */

enum jlm_cu_op {
    JLM_CU_SILU, JLM_CU_GELU, JLM_CU_GELU_FP16, JLM_CU_GELU_QUICK, JLM_CU_SWIGLU,
    JLM_CU_SWIGLU_OAI, JLM_CU_ADD, JLM_CU_MUL, JLM_CU_SCALE, JLM_CU_NOP
};

JLM_CU_HD float jlm_cu_gelu1(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
}

/* exp(x) for x <= 0 (x > 0 is taken as 0; below -87: 0), the twin of
 * jlm_k_fattn_exp (kernels/cpu/fattn.c): the same f32 operations, so with
 * -fmad=false the same bits on the device as on the CPU. */
JLM_CU_HD float jlm_cu_exp_le0(float x)
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
    return y * jlm_cu_bits_f32((uint32_t)(((int32_t)n + 127) << 23));
}

/* gate * sigmoid(gate) * up as jlm_k_swiglu computes it (e = exp(-|gate|)) */
JLM_CU_HD float jlm_cu_swiglu1(float g, float u)
{
    float e = jlm_cu_exp_le0(-fabsf(g));
    float s = g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    return g * s * u;
}

/* out[i] for element i: a is x (or gate), b is up / the second operand
 * (unused by the unary ops), s is the scale (SCALE) or alpha (SWIGLU_OAI),
 * lim the swiglu_oai limit. */
JLM_CU_HD float jlm_cu_elem(int op, float a, float b, float s, float lim)
{
    switch (op) {
    case JLM_CU_SILU: return a / (1.0f + expf(-a));
    case JLM_CU_GELU: return jlm_cu_gelu1(a);
    case JLM_CU_GELU_FP16:
        if (a <= -10.0f)
            return 0.0f;
        if (a >= 10.0f)
            return a;
        return jlm_cu_fp16_to_f32(jlm_cu_f32_to_fp16(jlm_cu_gelu1(jlm_cu_fp16_to_f32(jlm_cu_f32_to_fp16(a)))));
    case JLM_CU_GELU_QUICK: return a * (1.0f / (1.0f + expf(-1.702f * a)));
    case JLM_CU_SWIGLU: return jlm_cu_swiglu1(a, b);
    case JLM_CU_SWIGLU_OAI: {
        float g = fminf(a, lim), u = fmaxf(fminf(b, lim), -lim);
        return g / (1.0f + expf(s * -g)) * (u + 1.0f);
    }
    case JLM_CU_ADD: return a + b;
    case JLM_CU_MUL: return a * b;
    case JLM_CU_SCALE: return a * s;
    default: return a;
    }
}

/* ---------------------------------------------------------------- F16 cache rows */

/* Element i of x rounded to a half, nearest even (jlm_kv_put_row's F16
 * rows; the twin of jlm_k_f32_to_fp16): thread per element. */
JLM_CU_HD void jlm_cu_f16_store(uint16_t *out, const float *x, uint64_t i)
{
    out[i] = (uint16_t)jlm_cu_f32_to_fp16(x[i]);
}

/* ---------------------------------------------------------------- Q8_0 cache rows */

/* A cache element's type: the engine's KV_F32, KV_F16, KV_Q8_0 (exec_cu.c
 * asserts them equal). A Q8_0 row is blocks of 32 elements, each 34 bytes:
 * the half of its scale d (little-endian), then 32 int8 codes; a row (or a
 * block) may start at any byte. */
enum { JLM_CU_KV_F32 = 0, JLM_CU_KV_F16 = 1, JLM_CU_KV_Q8_0 = 2 };
#define JLM_CU_Q8_BYTES 34u

/* Bytes of n elements of a cache of type t (Q8_0: n a multiple of 32). */
JLM_CU_HD uint64_t jlm_cu_kv_bytes(int t, uint64_t n)
{
    return t == JLM_CU_KV_Q8_0 ? n / 32 * JLM_CU_Q8_BYTES : n * (t == JLM_CU_KV_F16 ? 2u : 4u);
}

/* a / b correctly rounded (nearest even), as the host's SSE division: the
 * device's IEEE division whatever -prec-div says. */
JLM_CU_HD float jlm_cu_div_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* The int8 code the CPU's (int8_t)roundf(v) stores on x86-64: round half
 * away from zero, converted to int32 as cvttss2si does (NaN and values past
 * int32 give INT32_MIN), then its low byte. Written out because C leaves the
 * out-of-range conversion undefined and a device's conversion saturates. */
JLM_CU_HD uint8_t jlm_cu_q8_code(float v)
{
    float r = roundf(v);
    uint32_t u = r >= -2147483648.0f && r < 2147483648.0f ? (uint32_t)(int32_t)r : 0x80000000u;
    return (uint8_t)(u & 0xffu);
}

/* Block b of x (32 floats from x + 32 b) as Q8_0 bytes at out + 34 b,
 * bit-identical to jlm_kv_put_row's (ggml's quantize_row_q8_0): amax the
 * largest |x| (fmaxf: NaN skipped), d = amax / 127, id = 1 / d (0 for d 0),
 * both correctly rounded; codes round(x * id); d stored as its half
 * (jlm_cu_f32_to_fp16). Thread per block; bytes only, so blocks need no
 * alignment. */
JLM_CU_HD void jlm_cu_q8_block(uint8_t *out, const float *x, uint64_t b)
{
    const float *xb = x + b * 32;
    uint8_t *o = out + b * JLM_CU_Q8_BYTES;
    float amax = 0.0f;
    for (unsigned i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(xb[i]));
    float d = jlm_cu_div_rn(amax, 127.0f), id = d != 0.0f ? jlm_cu_div_rn(1.0f, d) : 0.0f;
    uint16_t dh = (uint16_t)jlm_cu_f32_to_fp16(d);
    o[0] = (uint8_t)(dh & 0xffu);
    o[1] = (uint8_t)(dh >> 8);
    for (unsigned i = 0; i < 32; i++)
        o[2 + i] = jlm_cu_q8_code(xb[i] * id);
}

/* A decoded token's K or V row (n floats of x) into the cache at row
 * *dpos (row_bytes a row): thread i of n (F32, F16) or block i of n / 32
 * (Q8_0), as jlm_cu_k_to_f16 / jlm_cu_k_kv_q8 / a copy write it. */
JLM_CU_HD void jlm_cu_kv_store_at(int t, uint8_t *base, uint64_t row_bytes, const uint32_t *dpos, const float *x,
                                  uint64_t i)
{
    uint8_t *dst = base + (uint64_t)*dpos * row_bytes;
    if (t == JLM_CU_KV_Q8_0)
        jlm_cu_q8_block(dst, x, i);
    else if (t == JLM_CU_KV_F16)
        jlm_cu_f16_store((uint16_t *)(void *)dst, x, i);
    else
        ((float *)(void *)dst)[i] = x[i];
}

/* ---------------------------------------------------------------- decode attention (GQA) */

/* One token's attention over a KV cache whose keys and values are each
 * f32, halves or Q8_0 blocks (k_type, v_type: JLM_CU_KV_*; halves and
 * blocks widened as they are read, as jlm_kv_get_row gives them back), one
 * block per query head h.
 * Query head h reads KV head h / (n_head / n_head_kv). Key j of KV head g is
 * element g*kv_head_stride + j*k_stride of k; values alike with v_head_stride and
 * v_stride (Q8_0: strides and head dims in whole blocks of 32, element e in
 * block e / 32 from k). scores (n_head, n_kv) is scratch in global memory (probabilities
 * on return). sinks (n_head,) or NULL; mask (n_kv,) or NULL. Same formulas as
 * jlm_k_attn_head. */
typedef struct jlm_cu_attn {
    uint32_t     n_head, n_head_kv, head_dim, head_dim_v;
    uint64_t     n_kv, k_stride, v_stride, k_head_stride, v_head_stride;
    float        scale, softcap;
    const float *sinks, *mask;
    int          k_type, v_type;
    /* dpos (device memory) non-NULL: the keys are those a query at *dpos
     * sees, resolved by jlm_cu_attn_at when the kernel runs (n_kv then
     * bounds the cache the launch may read): from key 0, from *dpos - win +
     * 1 (a sliding window) or from the start of *dpos's chunk of chunk
     * keys, to *dpos (jlm_ex_first_key's rule); no mask then */
    const uint32_t *dpos;
    uint32_t        win, chunk;
} jlm_cu_attn;

/* Resolves p's key range from *p->dpos (none: unchanged): n_kv, and k and
 * v moved to the range's first key (rows of k_stride / v_stride elements). */
JLM_CU_HD void jlm_cu_attn_at(jlm_cu_attn *p, const void **k, const void **v)
{
    if (!p->dpos)
        return;
    uint32_t pos = *p->dpos, lo = 0;
    if (p->chunk)
        lo = pos / p->chunk * p->chunk;
    else if (p->win && pos >= p->win)
        lo = pos - p->win + 1;
    p->n_kv = (uint64_t)pos + 1 - lo;
    *k = (const uint8_t *)*k + jlm_cu_kv_bytes(p->k_type, (uint64_t)lo * p->k_stride);
    *v = (const uint8_t *)*v + jlm_cu_kv_bytes(p->v_type, (uint64_t)lo * p->v_stride);
}

/* Element i of a cache of type t: an f32, or a half or a Q8_0 code widened
 * (jlm_kv_get_row's: d * code). */
JLM_CU_HD float jlm_cu_kv_at(const void *base, int t, uint64_t i)
{
    if (t == JLM_CU_KV_Q8_0) {
        const uint8_t *b = (const uint8_t *)base + i / 32 * JLM_CU_Q8_BYTES;
        return jlm_cu_fp16_to_f32((uint16_t)(b[0] | b[1] << 8)) * (float)(int8_t)b[2 + i % 32];
    }
    return t == JLM_CU_KV_F16 ? jlm_cu_fp16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* The element offsets of key j and value j of query head h's KV head. */
JLM_CU_HD uint64_t jlm_cu_attn_k(const jlm_cu_attn *p, uint32_t h, uint64_t j)
{
    return (uint64_t)(h / (p->n_head / p->n_head_kv)) * p->k_head_stride + j * p->k_stride;
}

JLM_CU_HD uint64_t jlm_cu_attn_v(const jlm_cu_attn *p, uint32_t h, uint64_t j)
{
    return (uint64_t)(h / (p->n_head / p->n_head_kv)) * p->v_head_stride + j * p->v_stride;
}

/* Phase 1: scores of keys t, t+T, ... into scores; returns the partial max. */
JLM_CU_HD float jlm_cu_attn_scores(const jlm_cu_attn *p, const float *q, const void *k, float *scores,
                                   uint32_t h, unsigned t, unsigned T)
{
    const float *qh = q + (uint64_t)h * p->head_dim;
    float max = -INFINITY;
    for (uint64_t j = t; j < p->n_kv; j += T) {
        uint64_t kj = jlm_cu_attn_k(p, h, j);
        float s = 0.0f;
        for (uint32_t i = 0; i < p->head_dim; i++)
            s += qh[i] * jlm_cu_kv_at(k, p->k_type, kj + i);
        if (p->softcap > 0.0f)
            s = p->softcap * tanhf(s / p->softcap);
        s = s * p->scale + (p->mask ? p->mask[j] : 0.0f);
        scores[h * p->n_kv + j] = s;
        max = fmaxf(max, s);
    }
    return max;
}

/* The head's max including its sink (tree max in, sink folded here). */
JLM_CU_HD float jlm_cu_attn_max(const jlm_cu_attn *p, uint32_t h, float tree_max)
{
    return p->sinks ? fmaxf(tree_max, p->sinks[h]) : tree_max;
}

/* Phase 2: exp in place, partial sum (max -INFINITY: every key masked, zeros). */
JLM_CU_HD double jlm_cu_attn_exp(const jlm_cu_attn *p, float *scores, uint32_t h, float max,
                                 unsigned t, unsigned T)
{
    float *sh = scores + h * p->n_kv;
    if (max == -INFINITY) {
        for (uint64_t j = t; j < p->n_kv; j += T)
            sh[j] = 0.0f;
        return 0.0;
    }
    return jlm_cu_exp_partial(sh, p->n_kv, max, t, T);
}

/* 1/denominator: the tree's sum plus the sink's exp. */
JLM_CU_HD float jlm_cu_attn_inv(const jlm_cu_attn *p, uint32_t h, float max, double tree_sum)
{
    if (max == -INFINITY)
        return 0.0f;
    double sum = tree_sum + (p->sinks ? (double)expf(p->sinks[h] - max) : 0.0);
    return (float)(1.0 / sum);
}

/* Phase 4 (after scaling the scores to probabilities): out dims t, t+T, ...,
 * keys in order, zero probabilities skipped (as jlm_k_attn_head). */
JLM_CU_HD void jlm_cu_attn_out(const jlm_cu_attn *p, const void *v, const float *scores, float *out,
                               uint32_t h, unsigned t, unsigned T)
{
    const float *ph = scores + h * p->n_kv;
    float *oh = out + (uint64_t)h * p->head_dim_v;
    for (uint32_t i = t; i < p->head_dim_v; i += T) {
        float acc = 0.0f;
        for (uint64_t j = 0; j < p->n_kv; j++)
            if (ph[j] != 0.0f)
                acc += ph[j] * jlm_cu_kv_at(v, p->v_type, jlm_cu_attn_v(p, h, j) + i);
        oh[i] = acc;
    }
}

/* ---------------------------------------------------------------- a prefill's rows in one grid */

/* The rows of a prefill in one launch (blockIdx.y = row y; RoPE, bias and
 * attention over every row of a block): row y's floats at x + y*x_stride
 * (attention: its query; output at out + y*o_stride, scores at
 * scores + y*sc_stride), its position pos[y] and its keys [span[2y],
 * span[2y] + span[2y+1]) of a cache whose position 0 is at k, v (kb, vb:
 * bytes of a position). pos and span are device memory, so the launch's
 * arguments do not depend on the rows' positions. Each row computes what
 * the one-row kernel computes for it alone (the same bodies, bit for bit). */
typedef struct jlm_cu_rows {
    uint32_t        n;   /* rows (gridDim.y) */
    uint64_t        x_stride, o_stride, sc_stride, kb, vb;
    const uint32_t *pos, *span;
} jlm_cu_rows;

/* Row y's attention as the one-row kernel sees it: p with row y's key
 * count, and its query, keys, values, scores and output. */
JLM_CU_HD jlm_cu_attn jlm_cu_attn_row(const jlm_cu_attn *p, const jlm_cu_rows *r, uint32_t y, const float **q,
                                      const void **k, const void **v, float **scores, float **out)
{
    jlm_cu_attn a = *p;
    uint64_t lo = r->span[2 * y];
    a.n_kv = r->span[2 * y + 1];
    *q += y * r->x_stride;
    *out += y * r->o_stride;
    *scores += y * r->sc_stride;
    *k = (const uint8_t *)*k + lo * r->kb;
    *v = (const uint8_t *)*v + lo * r->vb;
    return a;
}

/* ---------------------------------------------------------------- MoE router and combine */

/* Routing modes (kernels/cpu/kernels.h JLM_K_ROUTE_*, repeated: harness.c
 * checks they agree). */
enum { JLM_CU_ROUTE_NORM = 0, JLM_CU_ROUTE_RAW = 1, JLM_CU_ROUTE_OAI = 2 };

/* Router phase 0: probs = logits (strided copy; the softmax phases of
 * jlm_cu_k_softmax then run on probs unless mode is OAI). */
JLM_CU_HD void jlm_cu_copy_strided(float *dst, const float *src, uint64_t n, unsigned t, unsigned T)
{
    for (uint64_t i = t; i < n; i += T)
        dst[i] = src[i];
}

/* Router last phase, thread 0 alone: the n_used largest of probs in order
 * (ties: the lower index, a strict >, as jlm_k_moe_route), their weights
 * renormalised (NORM), left (RAW) or softmaxed among themselves (OAI, the
 * sequential softmax of ops.c), then scaled (scale > 0). */
JLM_CU_HD void jlm_cu_route_pick(const float *probs, uint32_t n, uint32_t n_used, int mode, float scale,
                                 int32_t *sel, float *w)
{
    for (uint32_t s = 0; s < n_used; s++) {
        int32_t best = -1;
        for (uint32_t i = 0; i < n; i++) {
            int taken = 0;
            for (uint32_t q = 0; q < s && !taken; q++)
                taken = sel[q] == (int32_t)i;
            if (!taken && (best < 0 || probs[i] > probs[best]))
                best = (int32_t)i;
        }
        sel[s] = best;
        w[s] = probs[best];
    }
    if (mode == JLM_CU_ROUTE_OAI) {
        float max = -INFINITY;
        for (uint32_t s = 0; s < n_used; s++)
            max = fmaxf(max, w[s]);
        double sum = 0.0;
        for (uint32_t s = 0; s < n_used; s++) {
            w[s] = expf(w[s] - max);
            sum += (double)w[s];
        }
        const float inv = (float)(1.0 / sum);
        for (uint32_t s = 0; s < n_used; s++)
            w[s] *= inv;
    } else if (mode == JLM_CU_ROUTE_NORM) {
        float sum = 0;
        for (uint32_t s = 0; s < n_used; s++)
            sum += w[s];
        for (uint32_t s = 0; s < n_used; s++)
            w[s] /= sum;
    }
    if (scale > 0)
        for (uint32_t s = 0; s < n_used; s++)
            w[s] *= scale;
}

/* Expert combine, thread = element i: x[i] += sum_s w[s] * ys[s][i], the
 * mixture summed from 0 in expert order (bit-identical to jlm_k_moe_combine);
 * ys is (n_used, n) contiguous. */
JLM_CU_HD void jlm_cu_moe_combine_elem(float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n,
                                       uint64_t i)
{
    float acc = 0.0f;
    for (uint32_t s = 0; s < n_used; s++)
        acc += w[s] * ys[(uint64_t)s * n + i];
    x[i] = x[i] + acc;
}

#endif
