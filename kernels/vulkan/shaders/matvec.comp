#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
// matvec.comp - y = W x for every stored type, reading the packed planes of
// the container untouched (jlm-format.md 7). One invocation per row: the
// planes put word w of sub-block s of row r at (s*W + w)*rows + r, so
// neighbouring invocations read neighbouring words. The arithmetic is
// kernels/cpu/matvec_ref.c's, operation for operation, with every float
// `precise` (no contraction into FMA): quantized rows are bit-identical.
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Qs { uint qs[]; };
layout(std430, binding = 1) readonly buffer Dp { uint dp[]; };
layout(std430, binding = 2) readonly buffer Sc { uint scp[]; };
layout(std430, binding = 3) readonly buffer Aq { uint aq[]; };     // int8 codes, 4 per word
layout(std430, binding = 4) readonly buffer Ad { float ad[]; };
layout(std430, binding = 5) readonly buffer As { uint as16[]; };   // int16 sums, 2 per word
layout(std430, binding = 6) readonly buffer X  { float xf[]; };
layout(std430, binding = 7) buffer Y { float y[]; };   // read too: a later k-chunk continues y[r]

// A plane larger than one binding is run in k-chunks (whole super-blocks,
// vk.c): the chunk's units [u_lo, u_hi) of 32 elements, each plane bound as a
// window whose word i is the plane's word i - qd/dd/sd (mod 2^32), and
// `accum` continues the sum from y[r], so the additions stay in the CPU's
// order and the result is bit-identical to one dispatch. Float types split
// by rows: [r0, r1).
// Several tokens in one dispatch: token t's activations at t*k (codes),
// t*k/32 (scales), t*k/16 (sums), t*k (floats) and its outputs at t*rows.
// An invocation computes its row for a tile of NT tokens (gl_GlobalInvocationID.y
// = tile, tokens [tile*NT, min(tile*NT + NT, ntok))): the row's weight words,
// codes and scales are loaded and decoded once per tile, not once per token,
// which is what makes a prefill matmul read its weights ntok/NT times instead
// of ntok times. Each token's sum is still the CPU's, term for term and in
// order, so every token's row is bit-identical to its matvec alone.
// A batch of sheets in one dispatch (gl_GlobalInvocationID.z = sheet b; deepseek2's
// per-head attn_k_b / attn_v_b): sheet b's planes start bq/bd/bs words after sheet
// 0's; token t of sheet b reads its activations from element t*tx + b*bx and writes
// its outputs from t*ty + b*by (a plain matmul: tx = k, ty = rows, the rest 0).
// Each (sheet, token) row is the same arithmetic as that sheet's matvec alone.
layout(push_constant) uniform P { JLM_PUSH_MATVEC } pc;   // kernels/layout.h

// The type and its traits are specialization constants: one pipeline per
// stored type (and tile), so the driver compiles the type's branches and loop
// bounds out (vk.c creates each on first use).
layout(constant_id = JLM_SPEC_MATVEC_TYPE) const uint TYPE = 1u;
layout(constant_id = JLM_SPEC_MATVEC_W) const uint W = 1u;        // words per sub-block per row
layout(constant_id = JLM_SPEC_MATVEC_SUB) const uint SUB = 32u;
layout(constant_id = JLM_SPEC_MATVEC_P1) const uint P1 = 0u;
layout(constant_id = JLM_SPEC_MATVEC_D_SHARE) const uint DSHARE = 1u;
layout(constant_id = JLM_SPEC_MATVEC_NT) const uint NT = 1u;       // tokens per invocation

uint T0 = 0u, NTV = 1u;   // this invocation's first token and its token count (<= NT)
uint XB = 0u, YB = 0u, QB = 0u, DB = 0u, SB = 0u;   // its sheet's offsets: activations, outputs, planes
float acc_[NT];           // the running sum of each token of the tile

float fp16(uint h)   // exact, as jlm_k_fp16_to_f32
{
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (e == 0x1fu)
        return uintBitsToFloat(sign | 0x7f800000u | (man << 13));
    if (e == 0u) {
        precise float f = float(man) * 5.9604644775390625e-8;   // 2^-24, exact
        return sign != 0u ? -f : f;
    }
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (man << 13));
}

uint xo(uint t) { return t * pc.tx + XB; }   // token t's first activation
uint yo(uint t) { return t * pc.ty + YB; }   // token t's first output

int sum16(uint t, uint i) { i += xo(t) / 16u; return bitfieldExtract(int(as16[i / 2u]), int(16u * (i % 2u)), 16); }

const int MXFP4_LUT[16] = int[16](12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);

// The codes of sub-block s of row r: its W words loaded once, each code taken
// with the byte arithmetic of matvec_ref.c's ref_code (integers, so exact).
void codes(uint s, uint r, bool lut, out int cq[SUB])
{
    uint wd[W];
    for (uint w = 0u; w < W; w++)
        wd[w] = qs[(s * W + w) * pc.rows + r + pc.qd + QB];
    uint half_ = SUB / 2u, hi = P1, lanes = hi != 0u ? 8u / hi : 1u;
    for (uint e = 0u; e < SUB; e++) {
        uint i = e % 4u;
        int q;
        if (TYPE == T_Q8_0) {
            q = bitfieldExtract(int(wd[e / 4u]), int(8u * i), 8);
        } else {
            uint j = e % half_;
            uint b = (wd[j / 4u] >> (8u * (j % 4u))) & 0xffu;
            q = int(e < half_ ? (b & 15u) : (b >> 4));
            if (hi != 0u) {
                uint hj = half_ + ((e / 4u) / lanes) * 4u + i;
                uint hb = (wd[hj / 4u] >> (8u * (hj % 4u))) & 0xffu;
                q |= int((hb >> (hi * ((e / 4u) % lanes))) & ((1u << hi) - 1u)) << 4;
            }
            if (lut)
                q = MXFP4_LUT[q];
        }
        cq[e] = q;
    }
}

// sum_e cq[e] * a_t[a0 + e]: token t's int8 codes, four per word.
int dot_codes(int cq[SUB], uint t, uint a0)
{
    int acc = 0;
    for (uint e4 = 0u; e4 < SUB; e4 += 4u) {
        uint aw = aq[(xo(t) + a0 + e4) / 4u];
        for (uint i = 0u; i < 4u; i++)
            acc += cq[e4 + i] * bitfieldExtract(int(aw), int(8u * i), 8);
    }
    return acc;
}

uint dword(uint sb, uint r)
{
    uint S = DSHARE;
    if (S == 1u)
        return dp[sb * pc.rows + r + pc.dd + DB];
    uint wd = dp[sb * ((pc.rows + S - 1u) / S) + r / S + pc.dd + DB];
    uint bits = 32u / S;
    return (wd >> (bits * (r % S))) & (S == 2u ? 0xffffu : 0xffu);
}

uint field6(uint sb, uint r, uint f)
{
    uint v = 0u;
    for (uint b = 0u; b < 6u; b++) {
        uint bit = 6u * f + b;
        uint wd = scp[(sb * 3u + bit / 32u) * pc.rows + r + pc.sd + SB];
        v |= ((wd >> (bit % 32u)) & 1u) << b;
    }
    return v;
}

void acc_init(uint r)
{
    for (uint j = 0u; j < NT; j++)
        acc_[j] = pc.accum != 0u && j < NTV ? y[yo(T0 + j) + r] : 0.0;
}

void acc_add(uint j, float t)
{
    precise float a = acc_[j] + t;
    acc_[j] = a;
}

void row_sub32(uint r)
{
    acc_init(r);
    int cq[SUB];
    int bias = TYPE == T_Q4_0 ? 8 : TYPE == T_Q5_0 ? 16 : TYPE == T_MXFP4 ? 12 : 0;
    for (uint s = pc.u_lo; s < pc.u_hi; s++) {
        uint dw = dword(s, r);
        codes(s, r, TYPE == T_MXFP4, cq);
        float d = TYPE == T_MXFP4 ? uintBitsToFloat(dw << 23) : fp16(dw & 0xffffu);
        float b = fp16(dw >> 16);
        for (uint j = 0u; j < NT; j++) {
            if (j >= NTV)
                break;
            uint t = T0 + j;
            int suma = sum16(t, 2u * s) + sum16(t, 2u * s + 1u);
            float da = ad[xo(t) / 32u + s];
            int dt = dot_codes(cq, t, 32u * s);
            if (TYPE == T_Q5_1) {
                precise float t1 = (d * da) * float(dt);
                precise float t2 = (b * da) * float(suma);
                precise float u = t1 - t2;
                acc_add(j, u);
            } else {
                precise float u = (d * da) * float(dt - bias * suma);
                acc_add(j, u);
            }
        }
    }
}

void row_k32(uint r)
{
    acc_init(r);
    int cq[SUB];
    for (uint s = pc.u_lo; s < pc.u_hi; s++) {
        uint sb = s / 8u, j8 = s % 8u;
        uint dw = dword(sb, r);
        float d = fp16(dw & 0xffffu), dmin = fp16(dw >> 16);
        int sc = int(field6(sb, r, 2u * j8)), mn = int(field6(sb, r, 2u * j8 + 1u));
        codes(s, r, false, cq);
        for (uint j = 0u; j < NT; j++) {
            if (j >= NTV)
                break;
            uint t = T0 + j;
            int dt = dot_codes(cq, t, 32u * s);
            int suma = sum16(t, 2u * s) + sum16(t, 2u * s + 1u);
            precise float t1 = d * float(sc * dt);
            precise float t2 = dmin * float(mn * suma);
            precise float tt = t1 - t2;
            precise float u = ad[xo(t) / 32u + s] * tt;
            acc_add(j, u);
        }
    }
}

void row_k16(uint r)
{
    bool q3 = TYPE == T_Q3_K;
    int off = q3 ? -32 : -128, bias = q3 ? 4 : 32;
    acc_init(r);
    int c0[SUB], c1[SUB];
    for (uint b = pc.u_lo; b < pc.u_hi; b++) {
        float d = fp16(dword(b / 8u, r) & 0xffffu);
        uint s0 = 2u * b, s1 = s0 + 1u;
        codes(s0, r, false, c0);
        codes(s1, r, false, c1);
        int sc0 = int((scp[(s0 / 4u) * pc.rows + r + pc.sd + SB] >> (8u * (s0 % 4u))) & 0xffu) + off;
        int sc1 = int((scp[(s1 / 4u) * pc.rows + r + pc.sd + SB] >> (8u * (s1 % 4u))) & 0xffu) + off;
        for (uint j = 0u; j < NT; j++) {
            if (j >= NTV)
                break;
            uint t = T0 + j;
            int isum = sc0 * (dot_codes(c0, t, 16u * s0) - bias * sum16(t, s0));
            isum += sc1 * (dot_codes(c1, t, 16u * s1) - bias * sum16(t, s1));
            precise float u = (d * ad[xo(t) / 32u + b]) * float(isum);
            acc_add(j, u);
        }
    }
}

float half_at(uint i)   // element i of a u16 row-major plane
{
    uint h = (qs[i / 2u + pc.qd + QB] >> (16u * (i % 2u))) & 0xffffu;
    return TYPE == T_BF16 ? uintBitsToFloat(h << 16) : fp16(h);
}

void row_float(uint r)
{
    acc_init(r);
    uint base = r * pc.k;
    for (uint i = 0u; i < pc.k; i++) {
        float wv = TYPE == T_F32 ? uintBitsToFloat(qs[base + i + pc.qd + QB]) : half_at(base + i);
        for (uint j = 0u; j < NT; j++) {
            if (j >= NTV)
                break;
            precise float t = wv * xf[xo(T0 + j) + i];
            acc_add(j, t);
        }
    }
}

void main()
{
    uint r = gl_GlobalInvocationID.x + pc.r0;
    T0 = gl_GlobalInvocationID.y * NT;
    if (r >= pc.r1 || T0 >= pc.ntok)
        return;
    NTV = min(NT, pc.ntok - T0);
    uint z = gl_GlobalInvocationID.z;
    XB = z * pc.bx;
    YB = z * pc.by;
    QB = z * pc.bq;
    DB = z * pc.bd;
    SB = z * pc.bs;
    if (TYPE == T_F32 || TYPE == T_F16 || TYPE == T_BF16)
        row_float(r);
    else if (TYPE == T_Q4_K || TYPE == T_Q5_K)
        row_k32(r);
    else if (TYPE == T_Q3_K || TYPE == T_Q6_K)
        row_k16(r);
    else
        row_sub32(r);
    for (uint j = 0u; j < NT; j++)
        if (j < NTV)
            y[yo(T0 + j) + r] = acc_[j];
}
