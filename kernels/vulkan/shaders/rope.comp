#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
// rope.comp - rotates pair i of every head by the (cos, sin) the host computed
// with jlm_k_rope_cos_sin (the CPU's own theta): bit-identical to
// jlm_k_rope_apply. One invocation per (pair, head); workgroup row y: the
// heads at y*x_stride, by the cos/sin at y*cs_stride (one row per position).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer CS { float cs[]; };   // (n_rot/2) x {cos, sin}
layout(push_constant) uniform P { JLM_PUSH_ROPE } pc;   // kernels/layout.h

void main()
{
    uint half_ = pc.n_rot / 2u, g = gl_GlobalInvocationID.x;
    if (g >= half_ * pc.n_head)
        return;
    uint p = g % half_, h = g / half_, i0 = 2u * p;
    uint xb = gl_WorkGroupID.y * pc.x_stride + h * pc.head_dim, cb = gl_WorkGroupID.y * pc.cs_stride;
    uint ia = xb + (pc.neox != 0u ? p : i0);
    uint ib = xb + (pc.neox != 0u ? p + half_ : i0 + 1u);
    float c = cs[cb + 2u * p], s = cs[cb + 2u * p + 1u];
    float x0 = x[ia], x1 = x[ib];
    precise float a0 = x0 * c, a1 = x1 * s, b0 = x0 * s, b1 = x1 * c;
    x[ia] = a0 - a1;
    x[ib] = b0 + b1;
}
