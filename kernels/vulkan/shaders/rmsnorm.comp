#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
// rmsnorm.comp - out = x / sqrt(mean(x^2) + eps) * w, one workgroup of 256
// per n floats: workgroup (x, y) those at y*stride + x*n (rows of heads).
// The mean of squares is a tree over 256 partial sums of x^2/n (the CPU sums
// x^2 in f64, then divides): each term divided by n first, so the f32 sums
// overflow only where the mean itself does (x = 1e18 over 4096 elements).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { JLM_PUSH_RMSNORM } pc;   // kernels/layout.h
shared float part[256];

void main()
{
    uint t = gl_LocalInvocationID.x, b = gl_WorkGroupID.y * pc.stride + gl_WorkGroupID.x * pc.n;
    precise float s = 0.0;
    for (uint i = t; i < pc.n; i += 256u) {
        precise float sq = x[b + i] * x[b + i];
        precise float term = sq / float(pc.n);
        s = s + term;
    }
    part[t] = s;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h)
            part[t] = part[t] + part[t + h];
        barrier();
    }
    precise float mean = part[0];
    precise float scale = 1.0 / sqrt(mean + pc.eps);
    for (uint i = t; i < pc.n; i += 256u) {
        precise float v = x[b + i] * scale;
        o[b + i] = pc.has_w != 0u ? v * w[i] : v;
    }
}
