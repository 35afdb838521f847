#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
// attention.comp - single-token attention, one workgroup (256 lanes) per query
// head; kv head = head / group (GQA). Scores as jlm_k_attn_head: dot, softcap,
// scale, mask; sink joins max and denominator; all masked and no sink: 0.
// K and V are f32, or halves (kv_f16: the F16 cache, read exactly as
// jlm_k_fp16_to_f32).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { uint kc[]; };
layout(std430, binding = 2) readonly buffer V { uint vc[]; };
layout(std430, binding = 3) readonly buffer M { float mask[]; };
layout(std430, binding = 4) readonly buffer S { float sinks[]; };
layout(std430, binding = 5) buffer Sc { float sc[]; };      // n_head * n_kv
layout(std430, binding = 6) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { JLM_PUSH_ATTENTION } pc;   // kernels/layout.h
shared float part[256];

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

float key(uint i) { return pc.kv_f16 != 0u ? fp16((kc[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu) : uintBitsToFloat(kc[i]); }
float val(uint i) { return pc.kv_f16 != 0u ? fp16((vc[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu) : uintBitsToFloat(vc[i]); }

float reduce(float v, bool is_max)
{
    uint t = gl_LocalInvocationID.x;
    part[t] = v;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h)
            part[t] = is_max ? max(part[t], part[t + h]) : part[t] + part[t + h];
        barrier();
    }
    float r = part[0];
    barrier();
    return r;
}

void main()
{
    uint t = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, g = h / pc.group;
    uint qb = h * pc.head_dim, sb = h * pc.n_kv;
    float sink = pc.has_sink != 0u ? sinks[h] : -1.0 / 0.0;
    float m = sink;
    for (uint j = t; j < pc.n_kv; j += 256u) {
        uint kb = j * pc.k_stride + g * pc.head_dim;
        precise float s = 0.0;
        for (uint i = 0u; i < pc.head_dim; i++) {
            precise float p = q[qb + i] * key(kb + i);
            s = s + p;
        }
        if (pc.softcap > 0.0)
            s = pc.softcap * tanh(s / pc.softcap);
        precise float ss = s * pc.scale + (pc.has_mask != 0u ? mask[j] : 0.0);
        sc[sb + j] = ss;
        m = max(m, ss);
    }
    float mx = reduce(m, true);
    if (isinf(mx) && mx < 0.0) {                 // every key masked, no sink
        for (uint j = t; j < pc.n_kv; j += 256u)
            sc[sb + j] = 0.0;
        for (uint i = t; i < pc.head_dim_v; i += 256u)
            o[h * pc.head_dim_v + i] = 0.0;
        return;
    }
    precise float s = 0.0;
    for (uint j = t; j < pc.n_kv; j += 256u) {
        float e = exp(sc[sb + j] - mx);
        sc[sb + j] = e;
        s = s + e;
    }
    precise float total = reduce(s, false) + (pc.has_sink != 0u ? exp(sink - mx) : 0.0);
    precise float inv = 1.0 / total;
    for (uint j = t; j < pc.n_kv; j += 256u)
        sc[sb + j] = sc[sb + j] * inv;
    memoryBarrierBuffer();
    barrier();
    for (uint i = t; i < pc.head_dim_v; i += 256u) {
        precise float acc = 0.0;
        for (uint j = 0u; j < pc.n_kv; j++) {
            precise float p = sc[sb + j] * val(j * pc.v_stride + g * pc.head_dim_v + i);
            acc = acc + p;
        }
        o[h * pc.head_dim_v + i] = acc;
    }
}
