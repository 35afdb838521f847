/* vk.h - the Vulkan compute layer: one device, storage buffers, and the
 * shaders of kernels/vulkan/shaders/ (SPIR-V compiled by glslc at build time
 * and embedded in the library).
 *
 * Owns: instance and device choice, buffer memory, one pipeline per shader,
 * and a synchronous dispatch (record, submit, wait). Knows nothing of files,
 * pages or models; uses only format/'s layout header and kernels/cpu's
 * operand types, so every kernel here has its CPU twin in kernels/cpu/.
 *
 * Device choice (jlm_vk_open): the env var JLM_VK_DEVICE, or the `want`
 * argument, names a device by index ("0") or by a substring of its name
 * ("llvmpipe"). Without a name the first discrete, integrated or virtual GPU
 * is taken; a device of type CPU (lavapipe/llvmpipe, a software rasterizer)
 * is never picked silently: only when named, or when allow_cpu is set (the
 * tests do, so CI exercises the shaders on lavapipe).
 *
 * Built without Vulkan (no headers, no glslc: `make` says so) every entry
 * point fails with JLM_EUNSUPPORTED and the message "built without Vulkan".
 *
 * Matvec reads the container's packed planes untouched (jlm-format.md 7):
 * the caller uploads the qs/d/sc bytes as they are on disk into buffers (or
 * binds ranges of one buffer); no repacking, no dequantized copy. The math is
 * jlm_k_matvec_ref's, in the same f32 operations and order, no fused
 * multiply-add (SPIR-V NoContraction), so quantized results are bit-identical
 * to the CPU reference (docs/vulkan.md).
 *
 * Thread safety: one jlm_vk per thread; calls on one jlm_vk are serialized by
 * the caller. Memory: buffers belong to the caller until jlm_vk_buf_free.
 */
#ifndef JLM_VK_H
#define JLM_VK_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"
#include "kernels/cpu/kernels.h"

typedef struct jlm_vk jlm_vk;
typedef struct jlm_vk_buf jlm_vk_buf;

/* 1 when the library was built with the Vulkan backend. */
int jlm_vk_built(void);

/* Lists the Vulkan devices found ("0: llvmpipe (...) (cpu)"), at most max;
 * returns the count, -1 when there is no loader/driver or no Vulkan build. */
int jlm_vk_list_devices(char names[][128], int max);

/* Opens a device (see the header comment). JLM_EUNSUPPORTED: no loader, no
 * device, or no acceptable device (message names what was found). */
int jlm_vk_open(const char *want, int allow_cpu, jlm_vk **out, jlm_err *err);
void jlm_vk_close(jlm_vk *vk);
const char *jlm_vk_device_name(const jlm_vk *vk);
int jlm_vk_device_is_cpu(const jlm_vk *vk);
/* maxStorageBufferRange: the most bytes one binding may cover (128 MiB on lavapipe). */
uint64_t jlm_vk_max_binding(const jlm_vk *vk);

/* minStorageBufferOffsetAlignment: a view's offset is a multiple of it. */
uint64_t jlm_vk_offset_align(const jlm_vk *vk);
/* minImportedHostPointerAlignment when VK_EXT_external_memory_host is
 * enabled on the device (host pages can be imported without a copy), else 0. */
uint64_t jlm_vk_import_align(const jlm_vk *vk);
/* Bytes of the largest device-local heap (0 when none is reported). */
uint64_t jlm_vk_device_local_bytes(const jlm_vk *vk);

/* A host-visible storage buffer of `bytes` (rounded up to 4). */
int jlm_vk_buf_new(jlm_vk *vk, uint64_t bytes, jlm_vk_buf **out, jlm_err *err);
void jlm_vk_buf_free(jlm_vk *vk, jlm_vk_buf *b);
void *jlm_vk_buf_map(jlm_vk_buf *b);      /* persistent mapping, coherent */
uint64_t jlm_vk_buf_size(const jlm_vk_buf *b);
/* A buffer holding a copy of bytes [0, n) of src (the upload path). */
int jlm_vk_buf_upload(jlm_vk *vk, const void *src, uint64_t n, jlm_vk_buf **out, jlm_err *err);

/* A storage buffer in device-local memory (host-visible too where that is the
 * only kind, as on lavapipe); written with jlm_vk_buf_write, not mapped. */
int jlm_vk_buf_new_device(jlm_vk *vk, uint64_t bytes, jlm_vk_buf **out, jlm_err *err);
/* A storage buffer over the caller's host memory [host, host+bytes), no copy
 * (VK_EXT_external_memory_host): host and bytes multiples of
 * jlm_vk_import_align. The memory must stay allocated until jlm_vk_buf_free.
 * JLM_EUNSUPPORTED without the extension, JLM_EINVAL misaligned. */
int jlm_vk_buf_import(jlm_vk *vk, void *host, uint64_t bytes, jlm_vk_buf **out, jlm_err *err);
int jlm_vk_is_imported(const jlm_vk_buf *b);
/* Copies n bytes of src to dst at off through a host-visible staging buffer
 * (16 MiB at a time: memcpy, then vkCmdCopyBuffer, submitted and waited). */
int jlm_vk_buf_write(jlm_vk *vk, jlm_vk_buf *dst, uint64_t off, const void *src, uint64_t n, jlm_err *err);

/* A binding: a range of a buffer. len 0 = to the end of the buffer. */
typedef struct jlm_vk_view {
    jlm_vk_buf *buf;
    uint64_t    off, len;
} jlm_vk_view;

/* Recording (a block or a token in one command buffer): between
 * jlm_vk_rec_begin and jlm_vk_rec_end every kernel call and jlm_vk_copy is
 * recorded, with a barrier after each, instead of being submitted and waited
 * for; their results are there once jlm_vk_rec_end returns. The buffer is
 * submitted early (and recording goes on) only when its descriptor sets (256)
 * or its upload arena run out, or jlm_vk_buf_write needs the command buffer;
 * jlm_vk_submits counts every submit-and-wait. A buffer a recorded command
 * reads must not be freed before jlm_vk_rec_end (end the recording first).
 * rec_end on no recording is a no-op. */
int jlm_vk_rec_begin(jlm_vk *vk, jlm_err *err);
int jlm_vk_rec_end(jlm_vk *vk, jlm_err *err);
int jlm_vk_recording(const jlm_vk *vk);
uint64_t jlm_vk_submits(const jlm_vk *vk);
/* Kernel dispatches and device copies recorded (or submitted) so far: a
 * prefill's cost in commands (docs/vulkan.md). */
uint64_t jlm_vk_dispatches(const jlm_vk *vk);
/* Timing (jlm bench --profile): with jlm_vk_time on, every command buffer
 * gets a timestamp query at its start, at each jlm_vk_time_tag that changes
 * the tag, and at its end; after its submit-and-wait, the time between two
 * stamps (timestampPeriod ns a tick) adds to the first one's tag. Off (the
 * default) records no query. jlm_vk_can_time: the compute queue's family
 * has timestampValidBits (else jlm_vk_time(on) is JLM_EUNSUPPORTED). The
 * copies of jlm_vk_buf_write are not stamped. jlm_vk_time zeroes the sums. */
#define JLM_VK_TAGS 8
int  jlm_vk_can_time(const jlm_vk *vk);
int  jlm_vk_time(jlm_vk *vk, int on, jlm_err *err);
void jlm_vk_time_tag(jlm_vk *vk, int tag);   /* 0 <= tag < JLM_VK_TAGS: the next commands' */
void jlm_vk_time_get(const jlm_vk *vk, uint64_t ns[JLM_VK_TAGS]);

/* n bytes from src to dst (device side, ordered with the kernels). */
int jlm_vk_copy(jlm_vk *vk, jlm_vk_view dst, jlm_vk_view src, uint64_t n, jlm_err *err);
/* The same over rows (n bytes each, row r from src.off + r*src_stride to
 * dst.off + r*dst_stride): one copy command. */
int jlm_vk_copy_rows(jlm_vk *vk, jlm_vk_view dst, uint64_t dst_stride, jlm_vk_view src, uint64_t src_stride,
                     uint64_t n, uint32_t rows, jlm_err *err);
/* The same with rows picked by index: row r from src.off + si[r]*n to
 * dst.off + di[r]*n (an index NULL: r), one copy command (a MoE batch's
 * rows gathered by expert and put back). */
int jlm_vk_copy_index(jlm_vk *vk, jlm_vk_view dst, const uint32_t *di, jlm_vk_view src, const uint32_t *si,
                      uint64_t n, uint32_t rows, jlm_err *err);

/* ---------------------------------------------------------------- kernels */

/* A packed sheet on the device: the planes of a jlm_k_mat, each a view. */
typedef struct jlm_vk_mat {
    uint8_t     type;
    uint64_t    k, rows;
    jlm_vk_view qs, d, sc;   /* d, sc: buf NULL where the type has none */
} jlm_vk_mat;

/* Quantized activations on the device, laid out as jlm_act_q8: q (k bytes),
 * d (k/32 floats), sum16 (k/16 int16). */
typedef struct jlm_vk_act {
    uint64_t    k;
    jlm_vk_view q, d, sum16;
    uint32_t    n;   /* tokens laid out one after another (jlm_vk_matmul); 0 = 1 */
} jlm_vk_act;

/* y[r] for r in [0, rows): float types read x (k floats), quantized types
 * read xq. JLM_EINVAL for a bad shape or a view past its buffer or past
 * maxStorageBufferRange. */
int jlm_vk_matvec(jlm_vk *vk, const jlm_vk_mat *m, jlm_vk_view x, const jlm_vk_act *xq,
                  jlm_vk_view y, jlm_err *err);
/* The same for ntok tokens in one dispatch (<= 65535): token t's operands at
 * t*k in x (floats) or xq (q: t*k bytes, d: t*k/32 floats, sum16: t*k/16
 * int16), its outputs at t*rows in y. Each token's rows are computed exactly
 * as by jlm_vk_matvec (bit-identical). */
int jlm_vk_matmul(jlm_vk *vk, const jlm_vk_mat *m, uint32_t ntok, jlm_vk_view x, const jlm_vk_act *xq,
                  jlm_vk_view y, jlm_err *err);

/* A batch of n sheets of one shape (a 3-D tensor's sheets: deepseek2's
 * per-head attn_k_b / attn_v_b), each times its own activations, in one
 * dispatch: sheet i's qs/d/sc planes q/d/s bytes (multiples of 4) after sheet
 * i-1's; token t of sheet i reads its activations (floats, or int8 codes with
 * their scales and sums: tx and bx multiples of 32) from element t*tx + i*bx
 * of x/xq (xq laid out as jlm_vk_quantize writes it) and writes its rows
 * from t*ty + i*by of y. m is sheet 0. Every (sheet, token) row is computed
 * exactly as jlm_vk_matmul computes that sheet's (bit-identical). All sheets'
 * planes must lie within one binding each (JLM_EUNSUPPORTED otherwise). */
typedef struct jlm_vk_batch {
    uint32_t n;
    uint64_t tx, ty, bx, by;   /* elements */
    uint64_t q, d, s;          /* bytes */
} jlm_vk_batch;
int jlm_vk_matmul_batch(jlm_vk *vk, const jlm_vk_mat *m, const jlm_vk_batch *b, uint32_t ntok, jlm_vk_view x,
                        const jlm_vk_act *xq, jlm_vk_view y, jlm_err *err);

/* out = x / sqrt(mean(x^2) + eps) * w; w.buf NULL: no weight. n floats. */
int jlm_vk_rmsnorm(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, uint32_t n,
                   float eps, jlm_err *err);
/* The same in one dispatch over rows x per groups of n floats: group (g, r)
 * is the n floats at r*stride + g*n of x and out (rows of heads: per heads
 * of n a row); each as jlm_vk_rmsnorm computes it (bit-identical). rows and
 * per at most 65535. */
int jlm_vk_rmsnorm_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, uint32_t n, uint32_t per,
                        uint32_t rows, uint32_t stride, float eps, jlm_err *err);
/* In place, over `rows` rows of n floats each. */
int jlm_vk_softmax(jlm_vk *vk, jlm_vk_view x, uint32_t n, uint32_t rows, jlm_err *err);

enum jlm_vk_ew { JLM_VK_SILU = 0, JLM_VK_GELU = 1, JLM_VK_SWIGLU = 2, JLM_VK_ADD = 3,
                 JLM_VK_MUL = 4, JLM_VK_GELU_QUICK = 5 };
/* out = op(a) or op(a, b) (SWIGLU: a gate, b up). b unused for one-input ops. */
int jlm_vk_eltwise(jlm_vk *vk, int op, jlm_vk_view out, jlm_vk_view a, jlm_vk_view b,
                   uint32_t n, jlm_err *err);
/* out = a + b over rows rows of n floats, b (n floats) added to each row
 * (a bias; each sum as JLM_VK_ADD's), one dispatch; out may be a. */
int jlm_vk_add_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view a, jlm_vk_view b, uint32_t n, uint32_t rows,
                    jlm_err *err);
/* out = x * s[r] over rows rows of n floats, each row r by its own scale
 * (s: rows floats, up with the call; each product as jlm_vk_scale's), one
 * dispatch; out may be x. */
int jlm_vk_scale_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, const float *s, uint32_t n, uint32_t rows,
                      jlm_err *err);
/* gpt-oss's SwiGLU (jlm_k_swiglu_oai): clamps, then g * sigmoid(alpha g) * (u + 1). */
int jlm_vk_swiglu_oai(jlm_vk *vk, jlm_vk_view out, jlm_vk_view gate, jlm_vk_view up, uint32_t n,
                      float alpha, float limit, jlm_err *err);
/* out = x * s (jlm_k_scale, bit-identical), n floats; out may be x. */
int jlm_vk_scale(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, float s, uint32_t n, jlm_err *err);
/* gemma3's gate: out = jlm_k_gelu_fp16(gate) * up, bit-identical (GELU read
 * from ggml's fp16 table, kept on the device after the first call). */
int jlm_vk_geglu_fp16(jlm_vk *vk, jlm_vk_view out, jlm_vk_view gate, jlm_vk_view up, uint32_t n, jlm_err *err);
/* x (n floats, n even) to n halves in out, as jlm_k_f32_to_fp16 rounds
 * (nearest even, bit-identical): the F16 KV cache's rows. */
int jlm_vk_to_f16(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, uint32_t n, jlm_err *err);
/* x (n floats, n a multiple of 32) to n/32 Q8_0 blocks (34 bytes: the half
 * d, then 32 int8) at out, which may start at any byte (out.len: n/32 * 34;
 * the bytes around it are kept): the Q8_0 KV cache's rows, bit-identical to
 * the CPU's (jlm_kv_put_row: d = amax / 127, q = round(x / d) by 1 / d; NaN
 * to 0). Needs shaderFloat64 (jlm_vk_can_quantize; else JLM_EUNSUPPORTED). */
int jlm_vk_kv_q8(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, uint32_t n, jlm_err *err);
/* out = (x - mean) / sqrt(var + eps) * w + b (jlm_k_layernorm); w, b: buf NULL for none. */
int jlm_vk_layernorm(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, jlm_vk_view b,
                     uint32_t n, float eps, jlm_err *err);
/* The MoE router of one token (jlm_k_moe_route, same modes): logits (n <=
 * 1024 floats) -> sel (n_used int32) and w (n_used floats). */
int jlm_vk_moe_route(jlm_vk *vk, jlm_vk_view logits, uint32_t n, uint32_t n_used, int mode, float scale,
                     jlm_vk_view sel, jlm_vk_view w, jlm_err *err);
/* The same for rows tokens (<= 65535) in one dispatch: row r's logits at
 * r*n floats, its picks and weights at r*n_used. */
int jlm_vk_moe_route_rows(jlm_vk *vk, jlm_vk_view logits, uint32_t n, uint32_t n_used, int mode, float scale,
                          uint32_t rows, jlm_vk_view sel, jlm_vk_view w, jlm_err *err);
/* out = x + sum_s w[s] * ys[s*n ..] (jlm_k_moe_combine, bit-identical); out may be x. */
int jlm_vk_moe_combine(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view ys, jlm_vk_view w,
                       uint32_t n_used, uint32_t n, jlm_err *err);
/* The same for rows rows (<= 65535) in one dispatch: row r's x and out at
 * r*n floats, its outputs at r*n_used*n, its weights at r*n_used. */
int jlm_vk_moe_combine_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view ys, jlm_vk_view w,
                            uint32_t n_used, uint32_t n, uint32_t rows, jlm_err *err);

/* RoPE at one position, in place on n_head heads of head_dim floats. The
 * cos/sin of each pair come from jlm_k_rope_cos_sin (the CPU's own theta, YaRN
 * included), so the rotation is bit-identical to jlm_k_rope_apply. */
int jlm_vk_rope(jlm_vk *vk, const jlm_k_rope *p, jlm_vk_view x, uint32_t n_head,
                uint32_t head_dim, int64_t pos, jlm_err *err);

/* The same with the cos/sin pairs (n_rot floats, jlm_k_rope_cos_sin's) in
 * cs already on the device: one upload serves every layer of a position. */
int jlm_vk_rope_cs(jlm_vk *vk, uint32_t n_rot, int neox, jlm_vk_view x, uint32_t n_head, uint32_t head_dim,
                   jlm_vk_view cs, jlm_err *err);

/* The same over rows (<= 65535) in one dispatch: row r's heads at r*x_stride
 * floats of x, its cos/sin at r*cs_stride floats of cs (each row its own
 * position), each row as jlm_vk_rope_cs rotates it. */
int jlm_vk_rope_rows(jlm_vk *vk, uint32_t n_rot, int neox, jlm_vk_view x, uint32_t n_head, uint32_t head_dim,
                     uint32_t x_stride, jlm_vk_view cs, uint32_t cs_stride, uint32_t rows, jlm_err *err);

/* The activations' int8 quantization on the device, bit-identical to
 * jlm_k_quantize_act: x (n floats, n a multiple of 32: tokens one after
 * another) into out (q: n bytes, d: n/32 floats, sum16: n/16 int16; the
 * layout jlm_vk_matmul reads). Needs shaderFloat64 (jlm_vk_can_quantize;
 * else JLM_EUNSUPPORTED): the quotients are rounded exactly through doubles. */
int jlm_vk_can_quantize(const jlm_vk *vk);
int jlm_vk_quantize(jlm_vk *vk, jlm_vk_view x, uint64_t n, const jlm_vk_act *out, jlm_err *err);

/* Single-token attention with GQA: n_head query heads (q: n_head*head_dim),
 * kv head of query head h is h / (n_head / n_kv_head). k: n_kv positions of
 * k_stride floats (kv head g at g*head_dim); v likewise. scratch: n_head*n_kv
 * floats (probabilities on return). out: n_head*head_dim_v. p->mask, if set,
 * is uploaded; sinks (n_head floats) or NULL. */
int jlm_vk_attention(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head,
                     jlm_vk_view q, jlm_vk_view k, jlm_vk_view v, uint64_t n_kv,
                     const float *sinks, jlm_vk_view scratch, jlm_vk_view out, jlm_err *err);
/* The same over k and v of halves (the F16 cache; strides in elements),
 * each read exactly as jlm_k_fp16_to_f32. */
int jlm_vk_attention_f16(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, jlm_vk_view q,
                         jlm_vk_view k, jlm_vk_view v, uint64_t n_kv, const float *sinks, jlm_vk_view scratch,
                         jlm_vk_view out, jlm_err *err);
/* The cache element types of jlm_vk_attention_kv (the engine's KV_* values). */
enum { JLM_VK_KV_F32, JLM_VK_KV_F16, JLM_VK_KV_Q8_0 };
/* The same with K of type kt and V of type vt: f32, halves, or Q8_0 blocks
 * (jlm_vk_kv_q8's; strides and head dims in elements, multiples of 32; the
 * view may start at any byte, a position's first block), each element read
 * exactly as the CPU widens it (d * q). */
int jlm_vk_attention_kv(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, jlm_vk_view q,
                        jlm_vk_view k, int kt, jlm_vk_view v, int vt, uint64_t n_kv, const float *sinks,
                        jlm_vk_view scratch, jlm_vk_view out, jlm_err *err);

/* Attention of `rows` query rows (<= 65535) in one dispatch, row r (its q
 * at r*q_stride floats, its out at r*o_stride) over span[2r+1] keys from
 * position span[2r] of the k and v views (each row its own causal range and
 * window), no mask; scratch: rows*n_head*(the most keys of a row) floats.
 * Each row is computed as jlm_vk_attention_kv computes it over those keys
 * (bit-identical). */
int jlm_vk_attention_rows(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, uint32_t rows,
                          jlm_vk_view q, uint32_t q_stride, jlm_vk_view k, int kt, jlm_vk_view v, int vt,
                          const uint32_t *span, const float *sinks, jlm_vk_view scratch, jlm_vk_view out,
                          uint32_t o_stride, jlm_err *err);

#endif
