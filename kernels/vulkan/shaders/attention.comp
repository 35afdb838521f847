#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
#include "half.glsl"
// attention.comp - attention, one workgroup (256 lanes) per query head and
// row; kv head = head / group (GQA). One row (q_stride 0): pc.n_kv keys from
// the views' start. Rows (workgroup row y, its query at y*q_stride, its out
// at y*o_stride): span[2y] is y's first key (positions past the views' first)
// and span[2y+1] its key count, so each row of a prefill is causal with its
// own window, the same arithmetic as one row. Scores as jlm_k_attn_head: dot, softcap,
// scale, mask; sink joins max and denominator; all masked and no sink: 0.
// K and V are each f32, halves (the F16 cache) or Q8_0 blocks (the Q8_0
// cache): k_type, v_type.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { uint kc[]; };
layout(std430, binding = 2) readonly buffer V { uint vc[]; };
layout(std430, binding = 3) readonly buffer M { float mask[]; };
layout(std430, binding = 4) readonly buffer S { float sinks[]; };
layout(std430, binding = 5) buffer Sc { float sc[]; };      // n_head * n_kv
layout(std430, binding = 6) writeonly buffer O { float o[]; };
layout(std430, binding = 7) readonly buffer R { uint span[]; };   // (rows, 2): first key, key count
layout(push_constant) uniform P { JLM_PUSH_ATTENTION } pc;   // kernels/layout.h
shared float part[256];

// element i of the K (V) cache view: f32, a half (read exactly as
// jlm_k_fp16_to_f32), or of Q8_0 blocks (34 bytes: the half d, then 32 int8 q)
// from byte k_off (v_off): d * q, as jlm_kv_get_row widens them
uint kbyte(uint o) { return (kc[o >> 2] >> ((o & 3u) * 8u)) & 0xffu; }
uint vbyte(uint o) { return (vc[o >> 2] >> ((o & 3u) * 8u)) & 0xffu; }
float q8(uint d, uint q)
{
    precise float r = fp16(d) * float(int(q << 24) >> 24);
    return r;
}
float key(uint i)
{
    if (pc.k_type == 1u)
        return fp16((kc[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu);
    if (pc.k_type == 0u)
        return uintBitsToFloat(kc[i]);
    uint o = pc.k_off + (i >> 5) * 34u;
    return q8(kbyte(o) | (kbyte(o + 1u) << 8), kbyte(o + 2u + (i & 31u)));
}
float val(uint i)
{
    if (pc.v_type == 1u)
        return fp16((vc[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu);
    if (pc.v_type == 0u)
        return uintBitsToFloat(vc[i]);
    uint o = pc.v_off + (i >> 5) * 34u;
    return q8(vbyte(o) | (vbyte(o + 1u) << 8), vbyte(o + 2u + (i & 31u)));
}

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
    uint t = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, g = h / pc.group, y = gl_WorkGroupID.y;
    bool rows = pc.q_stride != 0u;
    uint n_kv = rows ? span[2u * y + 1u] : pc.n_kv, k0 = rows ? span[2u * y] : 0u;
    uint qb = y * pc.q_stride + h * pc.head_dim, sb = (y * gl_NumWorkGroups.x + h) * pc.n_kv;
    uint ob = y * pc.o_stride + h * pc.head_dim_v;
    float sink = pc.has_sink != 0u ? sinks[h] : -1.0 / 0.0;
    float m = sink;
    for (uint j = t; j < n_kv; j += 256u) {
        uint kb = (k0 + j) * pc.k_stride + g * pc.head_dim;
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
        for (uint j = t; j < n_kv; j += 256u)
            sc[sb + j] = 0.0;
        for (uint i = t; i < pc.head_dim_v; i += 256u)
            o[ob + i] = 0.0;
        return;
    }
    precise float s = 0.0;
    for (uint j = t; j < n_kv; j += 256u) {
        float e = exp(sc[sb + j] - mx);
        sc[sb + j] = e;
        s = s + e;
    }
    precise float total = reduce(s, false) + (pc.has_sink != 0u ? exp(sink - mx) : 0.0);
    precise float inv = 1.0 / total;
    for (uint j = t; j < n_kv; j += 256u)
        sc[sb + j] = sc[sb + j] * inv;
    memoryBarrierBuffer();
    barrier();
    for (uint i = t; i < pc.head_dim_v; i += 256u) {
        precise float acc = 0.0;
        for (uint j = 0u; j < n_kv; j++) {
            precise float p = sc[sb + j] * val((k0 + j) * pc.v_stride + g * pc.head_dim_v + i);
            acc = acc + p;
        }
        o[ob + i] = acc;
    }
}
