#version 450
// The activations' int8 quantization (jlm_k_quantize_act), bit-identical:
// per block of 32 floats, d = amax / 127 and q = round-half-away(x / d), each
// quotient the correctly rounded f32 one the CPU computes (div_rn.glsl).
// Needs shaderFloat64. One invocation per block; tokens one after another.
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
#include "div_rn.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Q { uint q[]; };     // 8 words a block
layout(std430, binding = 2) writeonly buffer D { float d[]; };    // a float a block
layout(std430, binding = 3) writeonly buffer S { uint s16[]; };   // two int16 a block
layout(push_constant) uniform P { JLM_PUSH_SOFTMAX } pc;   // n: blocks (kernels/layout.h)

void main()
{
    uint b = gl_GlobalInvocationID.x;
    if (b >= pc.n)
        return;
    uint base = 32u * b;
    float amax = 0.0;
    bool bad = false;
    for (uint i = 0u; i < 32u; i++) {
        float v = abs(x[base + i]);
        if (!(v <= 3.4028235e38))
            bad = true;
        else if (v > amax)
            amax = v;
    }
    float dd = bad ? uintBitsToFloat(0x7fc00000u) : div_rn(amax, 127.0);
    int sum0 = 0, sum1 = 0;
    for (uint w = 0u; w < 8u; w++) {
        uint word = 0u;
        for (uint j = 0u; j < 4u; j++) {
            uint i = 4u * w + j;
            float xi = x[base + i];
            precise float v = (bad || dd == 0.0) ? 0.0 : (xi < 0.0 ? -div_rn(-xi, dd) : div_rn(xi, dd));
            int iv = int(v);
            precise float frac = v - float(iv);
            iv += frac >= 0.5 ? 1 : (frac <= -0.5 ? -1 : 0);
            iv = clamp(iv, -127, 127);
            if (i < 16u)
                sum0 += iv;
            else
                sum1 += iv;
            word |= (uint(iv) & 0xffu) << (8u * j);
        }
        q[8u * b + w] = word;
    }
    d[b] = dd;
    s16[b] = (uint(sum0) & 0xffffu) | ((uint(sum1) & 0xffffu) << 16);
}
