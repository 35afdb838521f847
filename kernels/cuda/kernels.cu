// kernels.cu - the CUDA kernels: thin __global__ wrappers that run the
// per-thread bodies of kernels/cuda/body.h over a grid, and their launchers
// (declared in kernels/cuda/cuda.h, C linkage). The host harness
// (harness.c) emulates exactly these grids; keep the two in step.
// Built by `make cuda` with nvcc for sm_80 and sm_90 (-fmad=false: no fused
// multiply-add, as the CPU build's -ffp-contract=off, so matvec stays
// bit-identical to the CPU reference).
#include <cuda_runtime.h>
#include <stdlib.h>

#include "kernels/cuda/body.h"

#define T JLM_CU_THREADS

// Block (32, warps): 32 rows of one token (blockIdx.y); warps 1.. compute
// terms a chunk at a time into one shared buffer while warp 0 adds the
// previous chunk from the other (body.h, "matvec grid").
// __launch_bounds__: up to 32 warps a block (jlm_cu_mv_warps), so ptxas keeps
// the registers within 64 a thread or a 1024-thread block could not launch.
// blockIdx.z: the sheet of a batch (body.h's jlm_cu_batch; one for a plain
// matvec): the same block on sheet z's planes, its token's activations and
// its own rows.
__global__ void __launch_bounds__(1024) jlm_cu_k_matvec(jlm_cu_mat m0, jlm_cu_batch b, const float *x,
                                                        const jlm_cu_act *xq, float *y)
{
    __shared__ float sh[2][JLM_CU_MV_CHUNK * JLM_CU_MV_PITCH];
    const unsigned lane = threadIdx.x, wy = threadIdx.y, workers = blockDim.y - 1;
    const uint64_t r0 = (uint64_t)blockIdx.x * 32, tok = blockIdx.y, h = blockIdx.z;
    const jlm_cu_mat m = jlm_cu_batch_sheet(&m0, &b, h);
    const float *xt = x ? x + tok * b.tx + h * b.bx : NULL;
    const jlm_cu_act *at = xq ? &xq[h * b.rs + tok] : NULL;
    const uint64_t nch = (jlm_cu_n_terms(&m) + JLM_CU_MV_CHUNK - 1) / JLM_CU_MV_CHUNK;
    float acc = 0.0f;
    for (uint64_t c = 0; c <= nch; c++) {
        if (wy > 0 && c < nch)
            jlm_cu_mv_fill(&m, xt, at, r0, lane, wy - 1, workers, c * JLM_CU_MV_CHUNK, sh[c % 2]);
        else if (wy == 0 && c > 0)
            acc = jlm_cu_mv_add(&m, sh[(c - 1) % 2], (c - 1) * JLM_CU_MV_CHUNK, lane, acc);
        __syncthreads();
    }
    if (wy == 0 && r0 + lane < m.rows)
        y[tok * b.ty + h * b.by + r0 + lane] = acc;
}

__global__ void jlm_cu_k_quantize(const float *x, jlm_cu_act a)
{
    uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b < a.k / 32)
        jlm_cu_quantize_block(x, &a, b);
}

// The block's total of v by the tree step (sum or max) of body.h.
template <typename V, void (*STEP)(V *, unsigned, unsigned)>
__device__ static V block_reduce(V *sh, V v)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned half = T / 2; half > 0; half /= 2) {
        STEP(sh, threadIdx.x, half);
        __syncthreads();
    }
    V s = sh[0];
    __syncthreads();
    return s;
}

__device__ static double block_sum(double *sh, double v)
{
    return block_reduce<double, jlm_cu_tree_sum>(sh, v);
}

__device__ static float block_max(float *sh, float v)
{
    return block_reduce<float, jlm_cu_tree_max>(sh, v);
}

// Block b normalizes row b (a grid of one: the row at out, x).
__global__ void jlm_cu_k_rmsnorm(float *out, const float *x, const float *w, uint64_t n, float eps)
{
    __shared__ double sh[T];
    out += (uint64_t)blockIdx.x * n;
    x += (uint64_t)blockIdx.x * n;
    double sum = block_sum(sh, jlm_cu_rms_partial(x, n, threadIdx.x, T));
    jlm_cu_rms_apply(out, x, w, n, eps, sum, threadIdx.x, T);
}

// Block b normalizes the row at stride * b (latent attention's latent, in
// rows wider than it).
__global__ void jlm_cu_k_rmsnorm_strided(float *out, const float *x, const float *w, uint64_t n, uint32_t stride,
                                         float eps)
{
    __shared__ double sh[T];
    out += (uint64_t)blockIdx.x * stride;
    x += (uint64_t)blockIdx.x * stride;
    double sum = block_sum(sh, jlm_cu_rms_partial(x, n, threadIdx.x, T));
    jlm_cu_rms_apply(out, x, w, n, eps, sum, threadIdx.x, T);
}

__global__ void jlm_cu_k_layernorm(float *out, const float *x, const float *w, const float *b, uint64_t n, float eps)
{
    __shared__ double sh[T];
    const float mean = (float)(block_sum(sh, jlm_cu_sum_partial(x, n, threadIdx.x, T)) / (double)n);
    double sum2 = block_sum(sh, jlm_cu_center_partial(out, x, n, mean, threadIdx.x, T));
    jlm_cu_ln_apply(out, w, b, n, eps, sum2, threadIdx.x, T);
}

__global__ void jlm_cu_k_softmax(float *x, uint64_t n)
{
    __shared__ double shs[T];
    __shared__ float shm[T];
    float max = block_max(shm, jlm_cu_max_partial(x, n, threadIdx.x, T));
    float inv = (float)(1.0 / block_sum(shs, jlm_cu_exp_partial(x, n, max, threadIdx.x, T)));
    jlm_cu_scale_strided(x, n, inv, threadIdx.x, T);
}

__global__ void jlm_cu_k_rope(jlm_cu_rope p, float *x, uint32_t n_head, uint32_t head_dim, int64_t pos)
{
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, half = p.n_rot / 2;
    if (i < (uint64_t)n_head * half)
        jlm_cu_rope_pair(&p, x, head_dim, jlm_cu_pos_at(p.dpos, pos), (uint32_t)(i / half), (uint32_t)(i % half));
}

__global__ void jlm_cu_k_elem(int op, float *out, const float *a, const float *b, uint64_t n, float s, float lim)
{
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = jlm_cu_elem(op, a[i], b ? b[i] : 0.0f, s, lim);
}

__global__ void jlm_cu_k_to_f16(uint16_t *out, const float *x, uint64_t n)
{
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        jlm_cu_f16_store(out, x, i);
}

// A decoded token's cache row at *dpos: thread = element (F32, F16) or block of 32 (Q8_0).
__global__ void jlm_cu_k_kv_store(int t, uint8_t *base, uint64_t row_bytes, const uint32_t *dpos, const float *x,
                                  uint64_t n)
{
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        jlm_cu_kv_store_at(t, base, row_bytes, dpos, x, i);
}

// Q8_0 cache rows: thread = block of 32 (its 34 bytes written byte by byte).
__global__ void jlm_cu_k_kv_q8(uint8_t *out, const float *x, uint64_t nb)
{
    uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b < nb)
        jlm_cu_q8_block(out, x, b);
}

__global__ void jlm_cu_k_attn(jlm_cu_attn p, const float *q, const void *k, const void *v, float *scores,
                       float *out)
{
    __shared__ double shs[T];
    __shared__ float shm[T];
    uint32_t h = blockIdx.x;
    unsigned t = threadIdx.x;
    jlm_cu_attn_at(&p, &k, &v);
    float max = jlm_cu_attn_max(&p, h, block_max(shm, jlm_cu_attn_scores(&p, q, k, scores, h, t, T)));
    float inv = jlm_cu_attn_inv(&p, h, max, block_sum(shs, jlm_cu_attn_exp(&p, scores, h, max, t, T)));
    jlm_cu_scale_strided(scores + h * p.n_kv, p.n_kv, inv, t, T);
    __syncthreads();
    jlm_cu_attn_out(&p, v, scores, out, h, t, T);
}

// A prefill's rows in one grid (body.h's jlm_cu_rows, blockIdx.y = row):
// each row as the one-row kernel above computes it.
__global__ void jlm_cu_k_rope_rows(jlm_cu_rope p, float *x, uint32_t n_head, uint32_t head_dim, jlm_cu_rows r)
{
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, half = p.n_rot / 2;
    if (i < (uint64_t)n_head * half)
        jlm_cu_rope_pair(&p, x + blockIdx.y * r.x_stride, head_dim, r.pos[blockIdx.y], (uint32_t)(i / half),
                         (uint32_t)(i % half));
}

// out = a + b on each row of m floats (a bias), thread = element of a row
__global__ void jlm_cu_k_add_rows(float *out, const float *a, const float *b, uint64_t m)
{
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, o = (uint64_t)blockIdx.y * m + i;
    if (i < m)
        out[o] = jlm_cu_elem(JLM_CU_ADD, a[o], b[i], 0.0f, 0.0f);
}

__global__ void jlm_cu_k_attn_rows(jlm_cu_attn p0, const float *q, const void *k, const void *v, float *scores,
                                   float *out, jlm_cu_rows r)
{
    __shared__ double shs[T];
    __shared__ float shm[T];
    uint32_t h = blockIdx.x;
    unsigned t = threadIdx.x;
    const jlm_cu_attn p = jlm_cu_attn_row(&p0, &r, blockIdx.y, &q, &k, &v, &scores, &out);
    float max = jlm_cu_attn_max(&p, h, block_max(shm, jlm_cu_attn_scores(&p, q, k, scores, h, t, T)));
    float inv = jlm_cu_attn_inv(&p, h, max, block_sum(shs, jlm_cu_attn_exp(&p, scores, h, max, t, T)));
    jlm_cu_scale_strided(scores + h * p.n_kv, p.n_kv, inv, t, T);
    __syncthreads();
    jlm_cu_attn_out(&p, v, scores, out, h, t, T);
}

// The router of one token: probs (global scratch, n) = logits, their softmax
// (the jlm_cu_k_softmax phases) unless gpt-oss's mode, then the pick by thread 0.
__global__ void jlm_cu_k_moe_route(const float *logits, uint32_t n, uint32_t n_used, int mode, float scale, float *probs,
                            int32_t *sel, float *w)
{
    __shared__ double shs[T];
    __shared__ float shm[T];
    jlm_cu_copy_strided(probs, logits, n, threadIdx.x, T);
    __syncthreads();
    if (mode != JLM_CU_ROUTE_OAI) {
        float max = block_max(shm, jlm_cu_max_partial(probs, n, threadIdx.x, T));
        float inv = (float)(1.0 / block_sum(shs, jlm_cu_exp_partial(probs, n, max, threadIdx.x, T)));
        jlm_cu_scale_strided(probs, n, inv, threadIdx.x, T);
        __syncthreads();
    }
    if (threadIdx.x == 0)
        jlm_cu_route_pick(probs, n, n_used, mode, scale, sel, w);
}

__global__ void jlm_cu_k_moe_combine(float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n)
{
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        jlm_cu_moe_combine_elem(x, ys, w, n_used, n, i);
}

static unsigned blocks_for(uint64_t n, unsigned per)
{
    return (unsigned)((n + per - 1) / per);
}

// Warps per matvec block: jlm_cu_mv_warps, or JLM_CUDA_MV_WARPS (2..32) from
// the environment for tuning runs.
static unsigned mv_warps(uint64_t blocks)
{
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("JLM_CUDA_MV_WARPS");
        long v = e ? strtol(e, NULL, 10) : 0;
        env = v >= 2 && v <= 32 ? (int)v : 0;
    }
    return env ? (unsigned)env : jlm_cu_mv_warps(blocks);
}

static int launched(void)
{
    return (int)cudaGetLastError();
}

extern "C" {

int jlm_cu_launch_matvec_batch(const jlm_cu_mat *m, const jlm_cu_batch *b, uint64_t n, const float *x,
                               const jlm_cu_act *xq, float *y, void *stream)
{
    uint64_t blocks = (uint64_t)blocks_for(m->rows, 32) * n * b->n;
    dim3 grid(blocks_for(m->rows, 32), (unsigned)n, (unsigned)b->n), block(32, mv_warps(blocks));
    jlm_cu_k_matvec<<<grid, block, 0, (cudaStream_t)stream>>>(*m, *b, x, xq, y);
    return launched();
}

int jlm_cu_launch_matvec(const jlm_cu_mat *m, uint64_t n, const float *x, const jlm_cu_act *xq,
                         float *y, void *stream)
{
    jlm_cu_batch b = {1, m->k, m->rows, 0, 0, 0, 0, 0, 0};
    return jlm_cu_launch_matvec_batch(m, &b, n, x, xq, y, stream);
}

int jlm_cu_launch_quantize(const float *x, const jlm_cu_act *a, void *stream)
{
    jlm_cu_k_quantize<<<blocks_for(a->k / 32, 128), 128, 0, (cudaStream_t)stream>>>(x, *a);
    return launched();
}

int jlm_cu_launch_rmsnorm(float *out, const float *x, const float *w, uint64_t n, float eps, void *stream)
{
    jlm_cu_k_rmsnorm<<<1, T, 0, (cudaStream_t)stream>>>(out, x, w, n, eps);
    return launched();
}

int jlm_cu_launch_rmsnorm_rows(float *out, const float *x, const float *w, uint64_t n, uint32_t rows, float eps,
                               void *stream)
{
    if (rows == 0)
        return 0;
    jlm_cu_k_rmsnorm<<<rows, T, 0, (cudaStream_t)stream>>>(out, x, w, n, eps);
    return launched();
}

int jlm_cu_launch_layernorm(float *out, const float *x, const float *w, const float *b, uint64_t n, float eps,
                            void *stream)
{
    jlm_cu_k_layernorm<<<1, T, 0, (cudaStream_t)stream>>>(out, x, w, b, n, eps);
    return launched();
}

int jlm_cu_launch_softmax(float *x, uint64_t n, void *stream)
{
    jlm_cu_k_softmax<<<1, T, 0, (cudaStream_t)stream>>>(x, n);
    return launched();
}

int jlm_cu_launch_rope(const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim, int64_t pos,
                       void *stream)
{
    uint64_t n = (uint64_t)n_head * (p->n_rot / 2);
    if (n == 0)
        return 0;
    jlm_cu_k_rope<<<blocks_for(n, 128), 128, 0, (cudaStream_t)stream>>>(*p, x, n_head, head_dim, pos);
    return launched();
}

int jlm_cu_launch_elem(int op, float *out, const float *a, const float *b, uint64_t n, float s, float lim,
                       void *stream)
{
    if (n == 0)
        return 0;
    jlm_cu_k_elem<<<blocks_for(n, 256), 256, 0, (cudaStream_t)stream>>>(op, out, a, b, n, s, lim);
    return launched();
}

int jlm_cu_launch_to_f16(uint16_t *out, const float *x, uint64_t n, void *stream)
{
    if (n == 0)
        return 0;
    jlm_cu_k_to_f16<<<blocks_for(n, 256), 256, 0, (cudaStream_t)stream>>>(out, x, n);
    return launched();
}

int jlm_cu_launch_kv_q8(uint8_t *out, const float *x, uint64_t n, void *stream)
{
    if (n < 32)
        return 0;
    jlm_cu_k_kv_q8<<<blocks_for(n / 32, 128), 128, 0, (cudaStream_t)stream>>>(out, x, n / 32);
    return launched();
}

int jlm_cu_launch_kv_store(int t, uint8_t *base, uint64_t row_bytes, const uint32_t *dpos, const float *x, uint64_t n,
                           void *stream)
{
    uint64_t m = t == JLM_CU_KV_Q8_0 ? n / 32 : n;
    if (m == 0)
        return 0;
    jlm_cu_k_kv_store<<<blocks_for(m, 256), 256, 0, (cudaStream_t)stream>>>(t, base, row_bytes, dpos, x, m);
    return launched();
}

int jlm_cu_launch_attn(const jlm_cu_attn *p, const float *q, const void *k, const void *v, float *scores,
                       float *out, void *stream)
{
    jlm_cu_k_attn<<<p->n_head, T, 0, (cudaStream_t)stream>>>(*p, q, k, v, scores, out);
    return launched();
}

int jlm_cu_launch_rope_rows(const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim, const jlm_cu_rows *r,
                            void *stream)
{
    uint64_t n = (uint64_t)n_head * (p->n_rot / 2);
    if (n == 0 || r->n == 0)
        return 0;
    dim3 grid(blocks_for(n, 128), r->n);
    jlm_cu_k_rope_rows<<<grid, 128, 0, (cudaStream_t)stream>>>(*p, x, n_head, head_dim, *r);
    return launched();
}

int jlm_cu_launch_rmsnorm_strided(float *out, const float *x, const float *w, uint64_t n, uint32_t rows,
                                   uint32_t stride, float eps, void *stream)
{
    if (rows == 0)
        return 0;
    jlm_cu_k_rmsnorm_strided<<<rows, T, 0, (cudaStream_t)stream>>>(out, x, w, n, stride, eps);
    return launched();
}

int jlm_cu_launch_add_rows(float *out, const float *a, const float *b, uint64_t m, uint32_t rows, void *stream)
{
    if (m == 0 || rows == 0)
        return 0;
    dim3 grid(blocks_for(m, 256), rows);
    jlm_cu_k_add_rows<<<grid, 256, 0, (cudaStream_t)stream>>>(out, a, b, m);
    return launched();
}

int jlm_cu_launch_attn_rows(const jlm_cu_attn *p, const float *q, const void *k, const void *v, float *scores,
                            float *out, const jlm_cu_rows *r, void *stream)
{
    if (r->n == 0)
        return 0;
    dim3 grid(p->n_head, r->n);
    jlm_cu_k_attn_rows<<<grid, T, 0, (cudaStream_t)stream>>>(*p, q, k, v, scores, out, *r);
    return launched();
}

int jlm_cu_launch_moe_route(const float *logits, uint32_t n, uint32_t n_used, int mode, float scale, float *probs,
                            int32_t *sel, float *w, void *stream)
{
    jlm_cu_k_moe_route<<<1, T, 0, (cudaStream_t)stream>>>(logits, n, n_used, mode, scale, probs, sel, w);
    return launched();
}

int jlm_cu_launch_moe_combine(float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n, void *stream)
{
    if (n == 0)
        return 0;
    jlm_cu_k_moe_combine<<<blocks_for(n, 256), 256, 0, (cudaStream_t)stream>>>(x, ys, w, n_used, n);
    return launched();
}

const char *jlm_cu_launch_error(int rc)
{
    return cudaGetErrorString((cudaError_t)rc);
}

}
