/* harness.c - runs the CUDA kernels' per-thread bodies (body.h) on the CPU
 * over the same grid the kernels in kernels.cu launch, phase by phase, so the
 * suite `cuda` can compare them with the CPU reference without a GPU. Each
 * function mirrors one __global__ kernel; keep the two in step. */
#include "kernels/cuda/cuda.h"

#include <math.h>

void jlm_cu_mat_from(const jlm_k_mat *m, jlm_cu_mat *out)
{
    const jlm_type_traits *t = jlm_fmt_type_traits(m->type);
    *out = (jlm_cu_mat){.type = m->type, .sub = t->sub, .p0 = t->p0, .p1 = t->p1, .w = t->w,
                        .d_share = t->d_share, .k = m->k, .rows = m->rows, .qs = m->qs,
                        .d = m->d, .sc = m->sc};
}

static jlm_cu_act act_of(const jlm_act_q8 *a)
{
    jlm_cu_act c = {0, NULL, NULL, NULL};
    if (a)
        c = (jlm_cu_act){a->k, a->q, a->d, a->sum16};
    return c;
}

/* kernel matvec: grid (ceil(rows / 32), tokens), block 32 x warps.
 * Each step runs the workers' fill of one buffer and warp 0's add of the
 * other (they touch different buffers, so their order within a step is
 * free), as the barrier between steps does on the device. */
void jlm_cu_grid_matvec(const jlm_cu_mat *m, const float *x, const jlm_cu_act *a, float *y, unsigned warps)
{
    float sh[2][JLM_CU_MV_CHUNK * JLM_CU_MV_PITCH];
    const unsigned workers = warps - 1;
    uint64_t nch = (jlm_cu_n_terms(m) + JLM_CU_MV_CHUNK - 1) / JLM_CU_MV_CHUNK;
    for (uint64_t r0 = 0; r0 < m->rows; r0 += 32) {
        float acc[32] = {0};
        for (uint64_t c = 0; c <= nch; c++) {
            for (unsigned w = 0; c < nch && w < workers; w++)
                for (unsigned lane = 0; lane < 32; lane++)
                    jlm_cu_mv_fill(m, x, a, r0, lane, w, workers, c * JLM_CU_MV_CHUNK, sh[c % 2]);
            for (unsigned lane = 0; c > 0 && lane < 32; lane++)
                acc[lane] = jlm_cu_mv_add(m, sh[(c - 1) % 2], (c - 1) * JLM_CU_MV_CHUNK, lane, acc[lane]);
        }
        for (unsigned lane = 0; lane < 32 && r0 + lane < m->rows; lane++)
            y[r0 + lane] = acc[lane];
    }
}

void jlm_cu_host_matvec(const jlm_k_mat *m, const float *x, const jlm_act_q8 *xq, float *y)
{
    jlm_cu_mat cm;
    jlm_cu_mat_from(m, &cm);
    jlm_cu_act a = act_of(xq);
    jlm_cu_grid_matvec(&cm, x, &a, y, jlm_cu_mv_warps((m->rows + 31) / 32));
}

void jlm_cu_host_quantize(const float *x, jlm_act_q8 *a)
{
    jlm_cu_act c = act_of(a);
    for (uint64_t b = 0; b < a->k / 32; b++)
        jlm_cu_quantize_block(x, &c, b);
}

/* The shared-memory trees of the reduction kernels. */
static double tree_sum(double *sh)
{
    for (unsigned half = JLM_CU_THREADS / 2; half > 0; half /= 2)
        for (unsigned t = 0; t < JLM_CU_THREADS; t++)
            jlm_cu_tree_sum(sh, t, half);
    return sh[0];
}

static float tree_max(float *sh)
{
    for (unsigned half = JLM_CU_THREADS / 2; half > 0; half /= 2)
        for (unsigned t = 0; t < JLM_CU_THREADS; t++)
            jlm_cu_tree_max(sh, t, half);
    return sh[0];
}

/* kernel rmsnorm: one block of THREADS (a row each; rt.c runs the rows one by one). */
void jlm_cu_host_rmsnorm(float *out, const float *x, const float *w, uint64_t n, float eps)
{
    double sh[JLM_CU_THREADS];
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        sh[t] = jlm_cu_rms_partial(x, n, t, JLM_CU_THREADS);
    double sum = tree_sum(sh);
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        jlm_cu_rms_apply(out, x, w, n, eps, sum, t, JLM_CU_THREADS);
}

/* kernel layernorm: one block of THREADS. */
void jlm_cu_host_layernorm(float *out, const float *x, const float *w, const float *b, uint64_t n, float eps)
{
    double sh[JLM_CU_THREADS];
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        sh[t] = jlm_cu_sum_partial(x, n, t, JLM_CU_THREADS);
    const float mean = (float)(tree_sum(sh) / (double)n);
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        sh[t] = jlm_cu_center_partial(out, x, n, mean, t, JLM_CU_THREADS);
    double sum2 = tree_sum(sh);
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        jlm_cu_ln_apply(out, w, b, n, eps, sum2, t, JLM_CU_THREADS);
}

/* kernel softmax: one block of THREADS. */
void jlm_cu_host_softmax(float *x, uint64_t n)
{
    float shm[JLM_CU_THREADS];
    double shs[JLM_CU_THREADS];
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        shm[t] = jlm_cu_max_partial(x, n, t, JLM_CU_THREADS);
    float max = tree_max(shm);
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        shs[t] = jlm_cu_exp_partial(x, n, max, t, JLM_CU_THREADS);
    float inv = (float)(1.0 / tree_sum(shs));
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        jlm_cu_scale_strided(x, n, inv, t, JLM_CU_THREADS);
}

_Static_assert((int)JLM_CU_ROUTE_NORM == (int)JLM_K_ROUTE_NORM && (int)JLM_CU_ROUTE_RAW == (int)JLM_K_ROUTE_RAW &&
               (int)JLM_CU_ROUTE_OAI == (int)JLM_K_ROUTE_OAI, "routing modes of body.h and kernels.h");

/* kernel moe_route: one block; the copy, then jlm_cu_k_softmax's phases on probs
 * (unless OAI), then thread 0's pick. */
void jlm_cu_host_moe_route(const float *logits, uint32_t n, uint32_t n_used, int mode, float scale, float *probs,
                           int32_t *sel, float *w)
{
    for (unsigned t = 0; t < JLM_CU_THREADS; t++)
        jlm_cu_copy_strided(probs, logits, n, t, JLM_CU_THREADS);
    if (mode != JLM_CU_ROUTE_OAI)
        jlm_cu_host_softmax(probs, n);   /* the same phases over the same block */
    jlm_cu_route_pick(probs, n, n_used, mode, scale, sel, w);
}

/* kernel moe_combine: thread = element. */
void jlm_cu_host_moe_combine(float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        jlm_cu_moe_combine_elem(x, ys, w, n_used, n, i);
}

void jlm_cu_rope_from(const jlm_k_rope *p, jlm_cu_rope *out)
{
    *out = (jlm_cu_rope){.n_rot = p->n_rot, .neox = (uint32_t)(p->neox != 0), .orig_ctx = p->orig_ctx,
                         .freq_base = p->freq_base, .freq_scale = p->freq_scale,
                         .ext_factor = p->ext_factor, .attn_factor = p->attn_factor,
                         .beta_fast = p->beta_fast, .beta_slow = p->beta_slow,
                         .freq_factors = p->freq_factors};
}

/* kernel rope: thread = h * (n_rot/2) + pair. */
void jlm_cu_host_rope(const jlm_k_rope *p, float *x, uint32_t n_head, uint32_t head_dim, int64_t pos)
{
    jlm_cu_rope c;
    jlm_cu_rope_from(p, &c);
    uint64_t half = p->n_rot / 2;
    for (uint64_t i = 0; i < (uint64_t)n_head * half; i++)
        jlm_cu_rope_pair(&c, x, head_dim, pos, (uint32_t)(i / half), (uint32_t)(i % half));
}

/* kernel elem: thread = element. */
void jlm_cu_host_elem(int op, float *out, const float *a, const float *b, uint64_t n, float s, float lim)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = jlm_cu_elem(op, a[i], b ? b[i] : 0.0f, s, lim);
}

/* kernel to_f16: thread = element. */
void jlm_cu_host_to_f16(uint16_t *out, const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        jlm_cu_f16_store(out, x, i);
}

/* kernel kv_q8: thread = block of 32. */
void jlm_cu_host_kv_q8(uint8_t *out, const float *x, uint64_t n)
{
    for (uint64_t b = 0; b < n / 32; b++)
        jlm_cu_q8_block(out, x, b);
}

/* kernel attn: one block of THREADS per query head. */
void jlm_cu_host_attn(const jlm_cu_attn *p, const float *q, const void *k, const void *v,
                      float *scores, float *out)
{
    float shm[JLM_CU_THREADS];
    double shs[JLM_CU_THREADS];
    for (uint32_t h = 0; h < p->n_head; h++) {
        for (unsigned t = 0; t < JLM_CU_THREADS; t++)
            shm[t] = jlm_cu_attn_scores(p, q, k, scores, h, t, JLM_CU_THREADS);
        float max = jlm_cu_attn_max(p, h, tree_max(shm));
        for (unsigned t = 0; t < JLM_CU_THREADS; t++)
            shs[t] = jlm_cu_attn_exp(p, scores, h, max, t, JLM_CU_THREADS);
        float inv = jlm_cu_attn_inv(p, h, max, tree_sum(shs));
        for (unsigned t = 0; t < JLM_CU_THREADS; t++)
            jlm_cu_scale_strided(scores + h * p->n_kv, p->n_kv, inv, t, JLM_CU_THREADS);
        for (unsigned t = 0; t < JLM_CU_THREADS; t++)
            jlm_cu_attn_out(p, v, scores, out, h, t, JLM_CU_THREADS);
    }
}
