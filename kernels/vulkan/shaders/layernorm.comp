#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
// layernorm.comp - out = (x - mean) / sqrt(var + eps) * w + b (w, b optional),
// one workgroup of 256, as jlm_k_layernorm: the mean, then the variance of
// x - mean. The CPU sums in f64; here each term is divided by n first and the
// 256 partial sums meet in an f32 tree (docs/vulkan.md's tolerance table).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer B { float bb[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { JLM_PUSH_LAYERNORM } pc;   // kernels/layout.h
shared float part[256];

float tree(float s, uint t)
{
    part[t] = s;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h)
            part[t] = part[t] + part[t + h];
        barrier();
    }
    float r = part[0];
    barrier();
    return r;
}

void main()
{
    uint t = gl_LocalInvocationID.x;
    precise float s = 0.0;
    for (uint i = t; i < pc.n; i += 256u) {
        precise float term = x[i] / float(pc.n);
        s = s + term;
    }
    float mean = tree(s, t);
    precise float s2 = 0.0;
    for (uint i = t; i < pc.n; i += 256u) {
        precise float v = x[i] - mean;
        precise float term = (v * v) / float(pc.n);
        s2 = s2 + term;
    }
    float var = tree(s2, t);
    precise float scale = 1.0 / sqrt(var + pc.eps);
    for (uint i = t; i < pc.n; i += 256u) {
        precise float v = (x[i] - mean) * scale;
        if (pc.has_w != 0u)
            v = v * w[i];
        if (pc.has_b != 0u)
            v = v + bb[i];
        o[i] = v;
    }
}
