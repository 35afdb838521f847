#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
// moe_combine.comp - out = x + sum_s w[s] * y_s, the routed experts' outputs
// (n_used rows of n floats, one after another) mixed by their weights, as
// jlm_k_moe_combine: each element's sum starts at 0 and adds the experts in
// order, one rounded product and one rounded sum each (precise), then x is
// added once: bit-identical to the CPU. Row r (gl_WorkGroupID.y) of rows of n
// floats: x and o at r*n, its n_used outputs at r*n_used*n, its weights at
// r*n_used.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Y { float y[]; };
layout(std430, binding = 2) readonly buffer Wt { float wt[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { JLM_PUSH_MOE_COMBINE } pc;   // kernels/layout.h

void main()
{
    uint i = gl_GlobalInvocationID.x, r = gl_WorkGroupID.y, wo = r * pc.n_used;
    if (i >= pc.n)
        return;
    precise float acc = 0.0;
    for (uint s = 0u; s < pc.n_used; s++) {
        precise float t = wt[wo + s] * y[(wo + s) * pc.n + i];
        acc = acc + t;
    }
    precise float v = x[r * pc.n + i] + acc;
    o[r * pc.n + i] = v;
}
