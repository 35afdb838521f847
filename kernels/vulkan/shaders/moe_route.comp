#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
// moe_route.comp - the MoE router of one token, as jlm_k_moe_route: the
// expert logits (n, after the router matvec and its bias) become probabilities
// (softmax; mode 2, gpt-oss: not yet), the n_used largest are picked in order
// (ties: the lower index, as the CPU's strict >), and their weights are
// renormalised (mode 0), left (mode 1) or softmaxed among themselves (mode 2),
// then scaled (scale > 0). One workgroup: the softmax over 256 lanes, the
// pick and the weights by lane 0 (n_used is small). A workgroup a row: row r
// (gl_WorkGroupID.y) reads logits r*n.. and writes sel and wt at r*n_used.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer L { float logit[]; };
layout(std430, binding = 1) writeonly buffer S { int sel[]; };
layout(std430, binding = 2) buffer Wt { float wt[]; };   // lane 0 works in it
layout(push_constant) uniform P { JLM_PUSH_MOE_ROUTE } pc;   // kernels/layout.h
shared float p[1024];
shared float part[256];
shared uint taken[32];   // 1024 bits

void main()
{
    uint t = gl_LocalInvocationID.x, r = gl_WorkGroupID.y, lo = r * pc.n, so = r * pc.n_used;
    for (uint i = t; i < pc.n; i += 256u)
        p[i] = logit[lo + i];
    if (t < 32u)
        taken[t] = 0u;
    barrier();
    if (pc.mode != 2u) {
        float m = -1.0 / 0.0;
        for (uint i = t; i < pc.n; i += 256u)
            m = max(m, p[i]);
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
            float v = exp(p[i] - mx);
            p[i] = v;
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
            p[i] = p[i] * inv;
        barrier();
    }
    if (t != 0u)
        return;
    for (uint s = 0u; s < pc.n_used; s++) {
        int best = -1;
        for (uint i = 0u; i < pc.n; i++)
            if ((taken[i / 32u] & (1u << (i % 32u))) == 0u && (best < 0 || p[i] > p[uint(best)]))
                best = int(i);
        taken[uint(best) / 32u] |= 1u << (uint(best) % 32u);
        sel[so + s] = best;
        wt[so + s] = p[uint(best)];
    }
    if (pc.mode == 2u) {
        float m = -1.0 / 0.0;
        for (uint s = 0u; s < pc.n_used; s++)
            m = max(m, wt[so + s]);
        precise float sum = 0.0;
        for (uint s = 0u; s < pc.n_used; s++) {
            wt[so + s] = exp(wt[so + s] - m);
            sum = sum + wt[so + s];
        }
        precise float inv = 1.0 / sum;
        for (uint s = 0u; s < pc.n_used; s++)
            wt[so + s] = wt[so + s] * inv;
    } else if (pc.mode == 0u) {
        precise float sum = 0.0;
        for (uint s = 0u; s < pc.n_used; s++)
            sum = sum + wt[so + s];
        for (uint s = 0u; s < pc.n_used; s++)
            wt[so + s] = wt[so + s] / sum;
    }
    for (uint s = 0u; s < pc.n_used; s++)
        if (pc.scale > 0.0)
            wt[so + s] = wt[so + s] * pc.scale;
}
