/* cuda.h - the CUDA backend's host-side API: the device probe, the host
 * harness that runs the kernels' per-thread bodies (kernels/cuda/body.h) over
 * an emulated grid, and the device launchers of kernels/cuda/kernels.cu.
 *
 * Owns: converting a checked jlm_k_mat to the bodies' jlm_cu_mat, the grid
 * emulation (harness.c, plain C, always built), the device probe (device.c:
 * the CUDA runtime when built with CUDA, a stub otherwise) and the launchers
 * (kernels.cu, only in `make cuda` outputs: build/libjlm_cuda.a).
 *
 * Failure: the probe never fails; it reports count 0 and a one-line reason.
 * The harness functions cannot fail (preconditions as kernels.h). Launchers
 * return 0 or a cudaError_t value; jlm_cu_launch_error() names it.
 * Thread safety: the harness functions are pure; the probe may be called from
 * any thread (the CUDA runtime is thread safe). */
#ifndef JLM_CU_CUDA_H
#define JLM_CU_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/body.h"

/* ---------------------------------------------------------------- device probe */

typedef struct jlm_cu_info {
    int      built;          /* 1 if this binary was built with the CUDA runtime */
    int      count;          /* devices usable; 0 whenever anything failed */
    int      runtime;        /* cudaRuntimeGetVersion (e.g. 13000), 0 if unknown */
    char     reason[320];    /* why count is 0 ("" otherwise) */
    char     name[256];      /* device 0's name when count > 0 */
    uint64_t mem_bytes;      /* device 0's global memory */
    int      cc_major, cc_minor;
} jlm_cu_info;

/* Fills *info. Cannot fail: a failure is count 0 with the reason. */
void jlm_cu_probe(jlm_cu_info *info);
/* One line for `jlm --version`: "cuda: built (runtime 13.0), no device: ...". */
void jlm_cu_describe(char *buf, size_t len);

/* ---------------------------------------------------------------- host harness */

/* The bodies' view of a checked matrix (traits resolved). */
void jlm_cu_mat_from(const jlm_k_mat *m, jlm_cu_mat *out);

/* Each runs the kernel of the same name in kernels.cu on the CPU: every block,
 * every thread, phase by phase (body.h invariant 2). Arguments as the CPU ops
 * of kernels.h; xq may be NULL for float types. */
void jlm_cu_host_matvec(const jlm_k_mat *m, const float *x, const jlm_act_q8 *xq, float *y);
/* jlm_cu_k_matvec's grid for one token with `warps` warps per block (2..32), as
 * above but on the bodies' view (the host emulation of kernels/cuda/rt.c
 * runs it too). */
void jlm_cu_grid_matvec(const jlm_cu_mat *m, const float *x, const jlm_cu_act *a, float *y, unsigned warps);
void jlm_cu_host_quantize(const float *x, jlm_act_q8 *a);
void jlm_cu_host_rmsnorm(float *out, const float *x, const float *w, uint64_t n, float eps);
void jlm_cu_host_layernorm(float *out, const float *x, const float *w, const float *b, uint64_t n, float eps);
void jlm_cu_host_softmax(float *x, uint64_t n);
void jlm_cu_host_rope(const jlm_k_rope *p, float *x, uint32_t n_head, uint32_t head_dim, int64_t pos);
void jlm_cu_host_elem(int op, float *out, const float *a, const float *b, uint64_t n, float s, float lim);
/* n floats of x as halves, nearest even (an F16 cache's rows). */
void jlm_cu_host_to_f16(uint16_t *out, const float *x, uint64_t n);
/* n floats of x (whole blocks of 32) as Q8_0 blocks at out (n / 32 * 34
 * bytes, any alignment; a Q8_0 cache's rows, as jlm_kv_put_row). */
void jlm_cu_host_kv_q8(uint8_t *out, const float *x, uint64_t n);
/* scores: (n_head, n_kv) scratch; out (n_head, head_dim_v); q (n_head, head_dim);
 * k, v: of p->k_type and p->v_type (floats, halves or Q8_0 blocks). */
void jlm_cu_host_attn(const jlm_cu_attn *p, const float *q, const void *k, const void *v,
                      float *scores, float *out);

/* The router of one token (probs: n floats of scratch) and the expert
 * combine (ys: (n_used, n) contiguous), as jlm_cu_k_moe_route / jlm_cu_k_moe_combine. */
void jlm_cu_host_moe_route(const float *logits, uint32_t n, uint32_t n_used, int mode, float scale, float *probs,
                           int32_t *sel, float *w);
void jlm_cu_host_moe_combine(float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n);

/* The rope parameters as the bodies take them. */
void jlm_cu_rope_from(const jlm_k_rope *p, jlm_cu_rope *out);

/* ---------------------------------------------------------------- device launchers (kernels.cu) */

/* All pointers are device pointers (m's planes too); stream is a cudaStream_t
 * or NULL. n tokens: x (n, k), xq (n,) device-resident act structs whose
 * buffers are device memory, y (n, rows). Return 0 or a cudaError_t. */
int jlm_cu_launch_matvec(const jlm_cu_mat *m, uint64_t n, const float *x, const jlm_cu_act *xq,
                         float *y, void *stream);
/* b->n sheets (<= 65535) in one grid (body.h's jlm_cu_batch; xq: record h*rs + t). */
int jlm_cu_launch_matvec_batch(const jlm_cu_mat *m, const jlm_cu_batch *b, uint64_t n, const float *x,
                               const jlm_cu_act *xq, float *y, void *stream);
int jlm_cu_launch_quantize(const float *x, const jlm_cu_act *a, void *stream);
int jlm_cu_launch_rmsnorm(float *out, const float *x, const float *w, uint64_t n, float eps, void *stream);
/* rows rows of n floats (row i at x + i*n, out + i*n), a block each. */
int jlm_cu_launch_rmsnorm_rows(float *out, const float *x, const float *w, uint64_t n, uint32_t rows, float eps,
                               void *stream);
int jlm_cu_launch_layernorm(float *out, const float *x, const float *w, const float *b, uint64_t n, float eps,
                            void *stream);
int jlm_cu_launch_softmax(float *x, uint64_t n, void *stream);
int jlm_cu_launch_rope(const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim, int64_t pos,
                       void *stream);
int jlm_cu_launch_elem(int op, float *out, const float *a, const float *b, uint64_t n, float s, float lim,
                       void *stream);
int jlm_cu_launch_to_f16(uint16_t *out, const float *x, uint64_t n, void *stream);
int jlm_cu_launch_kv_q8(uint8_t *out, const float *x, uint64_t n, void *stream);
/* n floats of x into the cache row at device *dpos (base + *dpos * row_bytes) of type t (JLM_CU_KV_*). */
int jlm_cu_launch_kv_store(int t, uint8_t *base, uint64_t row_bytes, const uint32_t *dpos, const float *x, uint64_t n,
                           void *stream);
int jlm_cu_launch_attn(const jlm_cu_attn *p, const float *q, const void *k, const void *v, float *scores,
                       float *out, void *stream);
/* A prefill's rows in one grid (body.h's jlm_cu_rows; r's pos and span device memory). */
int jlm_cu_launch_rope_rows(const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim, const jlm_cu_rows *r,
                            void *stream);
int jlm_cu_launch_rmsnorm_strided(float *out, const float *x, const float *w, uint64_t n, uint32_t rows,
                                   uint32_t stride, float eps, void *stream);
int jlm_cu_launch_add_rows(float *out, const float *a, const float *b, uint64_t m, uint32_t rows, void *stream);
int jlm_cu_launch_attn_rows(const jlm_cu_attn *p, const float *q, const void *k, const void *v, float *scores,
                            float *out, const jlm_cu_rows *r, void *stream);
int jlm_cu_launch_moe_route(const float *logits, uint32_t n, uint32_t n_used, int mode, float scale, float *probs,
                            int32_t *sel, float *w, void *stream);
int jlm_cu_launch_moe_combine(float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n, void *stream);
const char *jlm_cu_launch_error(int rc);

#endif
