#version 450
#extension GL_GOOGLE_include_directive : require
#include "layout.glsl"
#include "half.glsl"
// eltwise.comp - the element-wise ops: silu, gelu (tanh form), swiglu, add, mul,
// gelu_quick, swiglu_oai (gpt-oss), each the formula of kernels/cpu/ops.c;
// gelu through ggml's fp16 table times up (gemma3: jlm_k_gelu_fp16 then
// jlm_k_mul; the table, indexed by the half, is binding 3), f32 to
// packed halves (jlm_k_f32_to_fp16, the F16 KV cache: n pairs, a word each)
// a scale by the push constant alpha (jlm_k_scale) and a vector of m added
// to each row (op 10: a bias on rows, the same sum as add's), each row of m
// times its own scale (op 11, binding 3: the same product as the scale's).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { uint o[]; };   // float bits, or two halves
layout(std430, binding = 3) readonly buffer T { float tab[]; };   // op 7: f32(fp16(gelu(half h))) at h; op 11: scales
layout(push_constant) uniform P { JLM_PUSH_ELTWISE } pc;   // kernels/layout.h

const float GELU_COEF_A = 0.044715, SQRT_2_OVER_PI = 0.79788456080286535587989211986876;

float tanh_safe(float v)   // GLSL tanh may overflow to NaN for large |v|
{
    if (abs(v) > 15.0)
        return sign(v);
    return tanh(v);
}

void main()
{
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n)
        return;
    if (pc.op == 8u) {
        o[i] = f2h(a[2u * i]) | (f2h(a[2u * i + 1u]) << 16);
        return;
    }
    float x = a[i];
    precise float r;
    if (pc.op == 0u) {
        r = x / (1.0 + exp(-x));
    } else if (pc.op == 1u) {
        precise float in_ = SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x);
        r = 0.5 * x * (1.0 + tanh_safe(in_));
    } else if (pc.op == 2u) {
        r = x / (1.0 + exp(-x)) * b[i];
    } else if (pc.op == 3u) {
        r = x + b[i];
    } else if (pc.op == 11u) {
        r = x * tab[i / pc.m];
    } else if (pc.op == 10u) {
        r = x + b[i % pc.m];
    } else if (pc.op == 4u) {
        r = x * b[i];
    } else if (pc.op == 5u) {
        r = x * (1.0 / (1.0 + exp(-1.702 * x)));
    } else if (pc.op == 9u) {
        r = x * pc.alpha;
    } else if (pc.op == 7u) {
        float gv = x <= -10.0 ? 0.0 : x >= 10.0 ? x : tab[f2h(x)];
        r = gv * b[i];
    } else {
        // jlm_k_swiglu_oai: fminf/fmaxf return the other operand for a NaN
        // (GLSL's min/max leave it undefined), so say it explicitly
        float lim = pc.limit, u = b[i];
        float g = isnan(x) ? lim : min(x, lim);
        u = isnan(u) ? lim : min(u, lim);
        u = max(u, -lim);
        r = g / (1.0 + exp(pc.alpha * -g)) * (u + 1.0);
    }
    o[i] = floatBitsToUint(r);
}
