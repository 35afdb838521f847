#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
// softmax.comp - in place over one row of n floats per workgroup (256 lanes):
// max, exp(x - max), sum, scale by 1/sum, as jlm_k_softmax.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { JLM_PUSH_SOFTMAX } pc;   // kernels/layout.h
shared float part[256];

void main()
{
    uint t = gl_LocalInvocationID.x, base = gl_WorkGroupID.x * pc.n;
    float m = -1.0 / 0.0;
    for (uint i = t; i < pc.n; i += 256u)
        m = max(m, x[base + i]);
    part[t] = m;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h)
            part[t] = max(part[t], part[t + h]);
        barrier();
    }
    float mx = part[0];
    barrier();
    precise float s = 0.0;
    for (uint i = t; i < pc.n; i += 256u) {
        float v = exp(x[base + i] - mx);
        x[base + i] = v;
        s = s + v;
    }
    part[t] = s;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h)
            part[t] = part[t] + part[t + h];
        barrier();
    }
    precise float inv = 1.0 / part[0];
    for (uint i = t; i < pc.n; i += 256u)
        x[base + i] = x[base + i] * inv;
}
