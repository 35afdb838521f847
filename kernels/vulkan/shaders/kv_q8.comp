#version 450
// kv_q8.comp - rows into the Q8_0 KV cache, bit-identical to the CPU's
// jlm_kv_put_row (engine/kvcache.c, ggml's quantize_row_q8_0): per block of
// 32 floats amax = the largest |x| (NaN skipped, as fmaxf), d = amax / 127,
// id = 1 / d (0 for d 0), q = round-half-away(x * id) (NaN to 0, as x86's
// conversion), stored as the half of d (jlm_k_f32_to_fp16) then 32 int8: 34
// bytes. Both quotients are the CPU's correctly rounded ones (div_rn.glsl:
// needs shaderFloat64). One invocation per block; blocks start at byte off
// of the bound window and follow each other, so a block may begin or end in
// the middle of a word: those words are merged with atomics (the other half
// is a neighbour block's, written by another invocation or another row).
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
#include "div_rn.glsl"
#include "half.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer C { uint c[]; };
layout(push_constant) uniform P { JLM_PUSH_KV_Q8 } pc;   // kernels/layout.h

uint q[32];

uint byte_at(uint i, uint dh) { return i < 2u ? (dh >> (8u * i)) & 0xffu : q[i - 2u]; }

void main()
{
    uint b = gl_GlobalInvocationID.x;
    if (b >= pc.n)
        return;
    uint base = 32u * b;
    float amax = 0.0;
    for (uint i = 0u; i < 32u; i++) {
        float v = abs(x[base + i]);
        if (v > amax)
            amax = v;
    }
    float d = isinf(amax) ? amax : div_rn(amax, 127.0);
    float id = (d == 0.0 || isinf(d)) ? 0.0 : div_rn(1.0, d);
    for (uint i = 0u; i < 32u; i++) {
        precise float v = x[base + i] * id;
        int iv = 0;
        if (!isnan(v)) {
            iv = int(v);
            precise float frac = v - float(iv);
            iv += frac >= 0.5 ? 1 : (frac <= -0.5 ? -1 : 0);
        }
        q[i] = uint(iv) & 0xffu;
    }
    uint dh = f2h(d), s = pc.off + 34u * b;
    for (uint w = s >> 2; w <= (s + 33u) >> 2; w++) {
        uint val = 0u, mask = 0u;
        for (uint j = 0u; j < 4u; j++) {
            uint o = 4u * w + j;
            if (o >= s && o < s + 34u) {
                val |= byte_at(o - s, dh) << (8u * j);
                mask |= 0xffu << (8u * j);
            }
        }
        if (mask == 0xffffffffu) {
            c[w] = val;
        } else {
            atomicAnd(c[w], ~mask);
            atomicOr(c[w], val);
        }
    }
}
