/* ops.c - the f32 element-wise and per-vector ops of a transformer layer.
 * Scalar; each follows ggml's CPU op (ggml-cpu ops.cpp / vec.h) in formula and
 * accumulation precision (sums in double where ggml uses ggml_float), so the
 * engine can match llama.cpp's reference outputs. These are a few percent of
 * a token's time next to the matvecs; they are not in the variant table. */
#include "kernels/cpu/kernels.h"

#include <math.h>

/* ---------------------------------------------------------------- norms */

void jlm_k_rmsnorm(float *out, const float *x, const float *w, uint64_t n, float eps)
{
    double sum = 0.0;
    for (uint64_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (uint64_t i = 0; i < n; i++)
        out[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

void jlm_k_layernorm(float *out, const float *x, const float *w, const float *b,
                     uint64_t n, float eps)
{
    double sum = 0.0;
    for (uint64_t i = 0; i < n; i++)
        sum += (double)x[i];
    const float mean = (float)(sum / (double)n);
    double sum2 = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        float v = x[i] - mean;
        out[i] = v;
        sum2 += (double)(v * v);
    }
    const float scale = 1.0f / sqrtf((float)(sum2 / (double)n) + eps);
    for (uint64_t i = 0; i < n; i++) {
        float v = out[i] * scale;
        if (w)
            v *= w[i];
        if (b)
            v += b[i];
        out[i] = v;
    }
}

/* ---------------------------------------------------------------- rope (ggml rope_ext + YaRN) */

void jlm_k_rope_defaults(jlm_k_rope *p, uint32_t n_rot, float freq_base)
{
    *p = (jlm_k_rope){.n_rot = n_rot, .neox = 0, .freq_base = freq_base, .freq_scale = 1.0f,
                      .freq_factors = NULL, .ext_factor = 0.0f, .attn_factor = 1.0f,
                      .beta_fast = 32.0f, .beta_slow = 1.0f, .orig_ctx = 0};
}

/* n_dims * log(orig_ctx / (n_rot * 2pi)) / (2 log(base)): the dimension whose
 * wavelength makes n_rot turns over the original context. */
static float yarn_corr_dim(uint32_t n_dims, uint32_t orig_ctx, float n_rot, float base)
{
    return (float)n_dims * logf((float)orig_ctx / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

void jlm_k_rope_yarn_corr_dims(uint32_t n_dims, uint32_t orig_ctx, float freq_base,
                               float beta_fast, float beta_slow, float dims[2])
{
    float start = floorf(yarn_corr_dim(n_dims, orig_ctx, beta_fast, freq_base));
    float end = ceilf(yarn_corr_dim(n_dims, orig_ctx, beta_slow, freq_base));
    dims[0] = fmaxf(0.0f, start);
    dims[1] = fminf((float)n_dims - 1.0f, end);
}

static float yarn_ramp(float low, float high, uint32_t i0)
{
    float y = ((float)(i0 / 2) - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

/* cos/sin of pair i0 (ggml rope_yarn): interpolated theta mixed with the
 * extrapolated one along the ramp, magnitude scaled by mscale. */
static void rope_yarn(float theta_extrap, const jlm_k_rope *p, const float corr[2], uint32_t i0,
                      float *c, float *s)
{
    float theta_interp = p->freq_scale * theta_extrap, theta = theta_interp;
    float mscale = p->attn_factor;
    if (p->ext_factor != 0.0f) {
        float mix = yarn_ramp(corr[0], corr[1], i0) * p->ext_factor;
        theta = theta_interp * (1.0f - mix) + theta_extrap * mix;
        mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
    }
    *c = cosf(theta) * mscale;
    *s = sinf(theta) * mscale;
}

void jlm_k_rope_apply(const jlm_k_rope *p, float *x, uint32_t n_head, uint32_t head_dim,
                      int64_t pos)
{
    float cs[JLM_MAX_HEAD_DIM];   /* n_rot <= head_dim <= JLM_MAX_HEAD_DIM (format/sanity.c) */
    jlm_k_rope_cos_sin(p, pos, cs);
    jlm_k_rope_rotate(cs, p, x, n_head, head_dim);
}

void jlm_k_rope_rotate(const float *cs, const jlm_k_rope *p, float *x, uint32_t n_head, uint32_t head_dim)
{
    uint32_t half = p->n_rot / 2;
    for (uint32_t h = 0; h < n_head; h++) {
        float *xh = x + (uint64_t)h * head_dim;
        for (uint32_t i0 = 0; i0 < p->n_rot; i0 += 2) {
            uint32_t a = p->neox ? i0 / 2 : i0, b = p->neox ? i0 / 2 + half : i0 + 1;
            float c = cs[i0], s = cs[i0 + 1], x0 = xh[a], x1 = xh[b];
            xh[a] = x0 * c - x1 * s;
            xh[b] = x0 * s + x1 * c;
        }
    }
}

void jlm_k_rope_cos_sin(const jlm_k_rope *p, int64_t pos, float *cs)
{
    float corr[2] = {0.0f, 0.0f};
    if (p->ext_factor != 0.0f)
        jlm_k_rope_yarn_corr_dims(p->n_rot, p->orig_ctx, p->freq_base, p->beta_fast, p->beta_slow, corr);
    const float theta_scale = powf(p->freq_base, -2.0f / (float)p->n_rot);
    float theta = (float)pos;                      /* ggml: theta *= theta_scale per pair */
    for (uint32_t i0 = 0; i0 < p->n_rot; i0 += 2) {
        float ff = p->freq_factors ? p->freq_factors[i0 / 2] : 1.0f;
        rope_yarn(theta / ff, p, corr, i0, &cs[i0], &cs[i0 + 1]);
        theta *= theta_scale;
    }
}

/* ---------------------------------------------------------------- softmax, activations */

void jlm_k_softmax(float *x, uint64_t n)
{
    float max = -INFINITY;
    for (uint64_t i = 0; i < n; i++)
        max = fmaxf(max, x[i]);
    double sum = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        float v = expf(x[i] - max);
        x[i] = v;
        sum += (double)v;
    }
    const float inv = (float)(1.0 / sum);
    for (uint64_t i = 0; i < n; i++)
        x[i] *= inv;
}

void jlm_k_silu(float *out, const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = x[i] / (1.0f + expf(-x[i]));
}

#define GELU_COEF_A     0.044715f
#define SQRT_2_OVER_PI  0.79788456080286535587989211986876f

static float gelu1(float x)
{
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}

void jlm_k_gelu(float *out, const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = gelu1(x[i]);
}

float jlm_k_gelu_fp16_entry(uint16_t h)
{
    return jlm_k_fp16_to_f32(jlm_k_f32_to_fp16(gelu1(jlm_k_fp16_to_f32(h))));
}

/* ggml's table is table[h] = fp16(gelu(f32(h))); computing the entry on the
 * fly gives the same bits without a 128 KiB global. */
void jlm_k_gelu_fp16(float *out, const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        float v = x[i];
        if (v <= -10.0f)
            out[i] = 0.0f;
        else if (v >= 10.0f)
            out[i] = v;
        else
            out[i] = jlm_k_gelu_fp16_entry(jlm_k_f32_to_fp16(v));
    }
}

void jlm_k_gelu_quick(float *out, const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = x[i] * (1.0f / (1.0f + expf(-1.702f * x[i])));
}

void jlm_k_swiglu(float *out, const float *gate, const float *up, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        float g = gate[i], e = jlm_k_fattn_exp(-fabsf(g));
        float s = g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
        out[i] = g * s * up[i];
    }
}

void jlm_k_swiglu_oai(float *out, const float *gate, const float *up, uint64_t n,
                      float alpha, float limit)
{
    for (uint64_t i = 0; i < n; i++) {
        float g = fminf(gate[i], limit), u = fmaxf(fminf(up[i], limit), -limit);
        out[i] = g / (1.0f + expf(alpha * -g)) * (u + 1.0f);
    }
}

void jlm_k_add(float *out, const float *a, const float *b, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void jlm_k_axpy(float *y, float a, const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void jlm_k_moe_route(const float *logits, uint32_t n, uint32_t n_used, int mode, float scale,
                     int32_t *sel, float *w)
{
    float probs[1024];
    uint8_t taken[1024] = {0};
    for (uint32_t i = 0; i < n; i++)
        probs[i] = logits[i];
    if (mode != JLM_K_ROUTE_OAI)
        jlm_k_softmax(probs, n);
    for (uint32_t s = 0; s < n_used; s++) {
        int32_t best = -1;
        for (uint32_t i = 0; i < n; i++)
            if (!taken[i] && (best < 0 || probs[i] > probs[best]))
                best = (int32_t)i;
        taken[best] = 1;
        sel[s] = best;
        w[s] = probs[best];
    }
    if (mode == JLM_K_ROUTE_OAI) {
        jlm_k_softmax(w, n_used);
    } else if (mode == JLM_K_ROUTE_NORM) {
        float sum = 0;
        for (uint32_t s = 0; s < n_used; s++) sum += w[s];
        for (uint32_t s = 0; s < n_used; s++) w[s] /= sum;
    }
    if (scale > 0)
        for (uint32_t s = 0; s < n_used; s++) w[s] *= scale;
}

void jlm_k_moe_combine(float *x, const float *const *ys, const float *w, uint32_t n_used, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        float acc = 0.0f;
        for (uint32_t s = 0; s < n_used; s++)
            acc += w[s] * ys[s][i];
        x[i] = x[i] + acc;
    }
}

void jlm_k_mul(float *out, const float *a, const float *b, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = a[i] * b[i];
}

void jlm_k_scale(float *out, const float *a, float s, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = a[i] * s;
}

/* ---------------------------------------------------------------- attention, one head */

/* Scores as llama.cpp builds them: dot, softcap (tanh) on the raw dot, then
 * soft_max_ext's scale and mask; the sink joins max and denominator. */
void jlm_k_attn_head(const jlm_k_attn *p, const float *q, const float *k, const float *v,
                     uint64_t n_kv, float *scratch, float *out)
{
    float max = p->has_sink ? p->sink : -INFINITY;
    for (uint64_t j = 0; j < n_kv; j++) {
        const float *kj = k + j * p->k_stride;
        float s = 0.0f;
        for (uint32_t i = 0; i < p->head_dim; i++)
            s += q[i] * kj[i];
        if (p->softcap > 0.0f)
            s = p->softcap * tanhf(s / p->softcap);
        s = s * p->scale + (p->mask ? p->mask[j] : 0.0f);
        scratch[j] = s;
        max = fmaxf(max, s);
    }
    for (uint32_t i = 0; i < p->head_dim_v; i++)
        out[i] = 0.0f;
    if (max == -INFINITY) {                       /* every key masked, no sink */
        for (uint64_t j = 0; j < n_kv; j++)
            scratch[j] = 0.0f;
        return;
    }
    double sum = p->has_sink ? (double)expf(p->sink - max) : 0.0;
    for (uint64_t j = 0; j < n_kv; j++) {
        scratch[j] = expf(scratch[j] - max);
        sum += (double)scratch[j];
    }
    const float inv = (float)(1.0 / sum);
    for (uint64_t j = 0; j < n_kv; j++) {
        float pj = scratch[j] * inv;
        scratch[j] = pj;
        if (pj == 0.0f)
            continue;
        const float *vj = v + j * p->v_stride;
        for (uint32_t i = 0; i < p->head_dim_v; i++)
            out[i] += pj * vj[i];
    }
}
