/* layout.h - the byte layouts that the host C code, the CUDA kernels and the
 * Vulkan shaders share, declared once.
 *
 * Owns: the stored type codes as the kernels see them (format/jlm_format.h's
 * enum jlm_type; kernels/vulkan/vk.c asserts the two equal), the push-constant
 * block of every shader in kernels/vulkan/shaders/, and matvec.comp's
 * specialization constants (the per-type traits its pipelines are built with).
 *
 * Each layout is one field list (an X-macro: U(name) a 32-bit unsigned, F(name)
 * a 32-bit float, in order). From it come the C struct here (what vk.c fills
 * and pushes), and kernels/vulkan/layout.glsl (what the shaders #include; written
 * by kernels/vulkan/gen/layout_glsl.c from these lists, and compared with the
 * committed file on every build: a difference fails the build, `make
 * layout-glsl` rewrites it). body.h (CUDA, host harness) takes the type codes
 * from here.
 *
 * Invariants, checked at compile time below:
 *  (1) every field is 4 bytes at offset 4*i (std430 scalars in a push-constant
 *      block, specialization constant i at offset 4*i): no padding;
 *  (2) each block's size (hand-kept number) and last field's offset, so a field
 *      added, dropped or retyped is seen here as well as in the shader;
 *  (3) a push block fits in JLM_PUSH_MAX bytes (what vk.c pushes every dispatch).
 *
 * Plain C that is also valid C++ (nvcc compiles body.h, which includes it). No
 * symbols: types, macros and an enum only. */
#ifndef JLM_KERNELS_LAYOUT_H
#define JLM_KERNELS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define JLM_LAYOUT_ASSERT(c, msg) static_assert(c, msg)
#else
#define JLM_LAYOUT_ASSERT(c, msg) _Static_assert(c, msg)
#endif

/* Bytes vk.c pushes at every dispatch (its pipeline layout's one range). */
#define JLM_PUSH_MAX 80

/* ---------------------------------------------------------------- stored type codes */

/* X(NAME, code): format/jlm_format.h enum jlm_type (JLM_T_<NAME>). */
#define JLM_KT_LIST(X) \
    X(F32, 1) X(F16, 2) X(Q4_0, 3) X(Q8_0, 4) X(Q3_K, 5) X(Q4_K, 6) X(Q5_K, 7) X(Q6_K, 8) \
    X(BF16, 9) X(Q5_0, 10) X(MXFP4, 11) X(Q5_1, 12)

#define JLM_KT_ENUM_(name, code) JLM_KT_##name = code,
enum { JLM_KT_LIST(JLM_KT_ENUM_) JLM_KT_END_ };
#undef JLM_KT_ENUM_

/* ---------------------------------------------------------------- field lists */

/* matvec.comp: y = W x over rows [r0, r1) (float types) or the k-chunk of
 * 32-element units [u_lo, u_hi) (quantized types); qd/dd/sd: what the shader
 * adds to a word index of the qs/d/sc plane to address its bound window (mod
 * 2^32); accum: continue the sum from y; ntok: tokens of one dispatch; tx/ty:
 * elements from one token's activations/outputs to the next; bx/by, bq/bd/bs:
 * from one sheet of a batch (the grid's z) to the next, in activation and
 * output elements and in qs/d/sc plane words. */
#define JLM_PUSH_MATVEC_FIELDS(U, F) \
    U(k) U(rows) U(u_lo) U(u_hi) U(qd) U(dd) U(sd) U(accum) U(r0) U(r1) U(ntok) \
    U(tx) U(ty) U(bx) U(by) U(bq) U(bd) U(bs)
/* rmsnorm.comp: workgroup (x, y) normalizes the n floats at y*stride + x*n
 * (rows of heads; one dispatch of 1 x 1: the n floats at 0) */
#define JLM_PUSH_RMSNORM_FIELDS(U, F) U(n) U(has_w) F(eps) U(stride)
#define JLM_PUSH_LAYERNORM_FIELDS(U, F) U(n) U(has_w) U(has_b) F(eps)
#define JLM_PUSH_SOFTMAX_FIELDS(U, F) U(n)
/* op: JLM_VK_SILU.. (vk.h), 6 = gpt-oss's swiglu with alpha and limit, 10 =
 * a + b[i mod m] (a vector added to each row of m), 11 = a * s[i / m] (each
 * row of m times its own scale, binding 3) */
#define JLM_PUSH_ELTWISE_FIELDS(U, F) U(n) U(op) F(alpha) F(limit) U(m)
/* rope.comp: workgroup row y rotates the heads at y*x_stride by the cos/sin
 * at y*cs_stride (floats) */
#define JLM_PUSH_ROPE_FIELDS(U, F) U(n_rot) U(neox) U(n_head) U(head_dim) U(x_stride) U(cs_stride)
/* k_type, v_type: the cache's element (0 f32, 1 halves, 2 Q8_0 blocks: vk.h's
 * JLM_VK_KV_*); k_off, v_off: Q8_0's byte offset of element 0 in its bound
 * window (the window starts aligned down); q_stride, o_stride: 0 for one
 * query row, else the floats between two rows' q and out, each workgroup
 * row y its own keys (binding 7: y's first key and key count) and its
 * scores at (y*heads + head)*n_kv */
#define JLM_PUSH_ATTENTION_FIELDS(U, F) \
    U(head_dim) U(head_dim_v) U(k_stride) U(v_stride) U(n_kv) U(group) U(has_mask) U(has_sink) \
    F(scale) F(softcap) U(k_type) U(v_type) U(k_off) U(v_off) U(q_stride) U(o_stride)
/* kv_q8.comp: n blocks of 32 floats into Q8_0 blocks from byte off of the window */
#define JLM_PUSH_KV_Q8_FIELDS(U, F) U(n) U(off)
#define JLM_PUSH_MOE_ROUTE_FIELDS(U, F) U(n) U(n_used) U(mode) F(scale)
#define JLM_PUSH_MOE_COMBINE_FIELDS(U, F) U(n) U(n_used)

/* matvec.comp's specialization constants, constant_id = field index: the
 * stored type, words per sub-block per row (W), elements per sub-block, the
 * type's second parameter, sub-blocks sharing one d, tokens per invocation. */
#define JLM_SPEC_MATVEC_FIELDS(U, F) U(type) U(w) U(sub) U(p1) U(d_share) U(nt)

/* X(block, NAME, bytes, last field): every layout above, with its hand-kept
 * size and last field (invariant 2). */
#define JLM_LAYOUT_LIST(X) \
    X(push_matvec, PUSH_MATVEC, 72, bs) \
    X(push_rmsnorm, PUSH_RMSNORM, 16, stride) \
    X(push_layernorm, PUSH_LAYERNORM, 16, eps) \
    X(push_softmax, PUSH_SOFTMAX, 4, n) \
    X(push_eltwise, PUSH_ELTWISE, 20, m) \
    X(push_rope, PUSH_ROPE, 24, cs_stride) \
    X(push_attention, PUSH_ATTENTION, 64, o_stride) \
    X(push_kv_q8, PUSH_KV_Q8, 8, off) \
    X(push_moe_route, PUSH_MOE_ROUTE, 16, scale) \
    X(push_moe_combine, PUSH_MOE_COMBINE, 8, n_used) \
    X(spec_matvec, SPEC_MATVEC, 24, nt)

/* ---------------------------------------------------------------- the C structs */

#define JLM_LAYOUT_U_(name) uint32_t name;
#define JLM_LAYOUT_F_(name) float name;
#define JLM_LAYOUT_ONE_(name) +1
#define JLM_LAYOUT_STRUCT_(block, NAME, bytes, last) \
    typedef struct jlm_##block { JLM_##NAME##_FIELDS(JLM_LAYOUT_U_, JLM_LAYOUT_F_) } jlm_##block;
#define JLM_LAYOUT_CHECK_(block, NAME, bytes, last) \
    JLM_LAYOUT_ASSERT(sizeof(jlm_##block) == 4 * (0 JLM_##NAME##_FIELDS(JLM_LAYOUT_ONE_, JLM_LAYOUT_ONE_)), \
                      "jlm_" #block ": a field is not 4 bytes or is padded"); \
    JLM_LAYOUT_ASSERT(sizeof(jlm_##block) == bytes, "jlm_" #block " is not " #bytes " bytes"); \
    JLM_LAYOUT_ASSERT(offsetof(jlm_##block, last) == bytes - 4, "jlm_" #block "." #last " is not last"); \
    JLM_LAYOUT_ASSERT(bytes <= JLM_PUSH_MAX, "jlm_" #block " exceeds JLM_PUSH_MAX");

JLM_LAYOUT_LIST(JLM_LAYOUT_STRUCT_)
JLM_LAYOUT_LIST(JLM_LAYOUT_CHECK_)

#undef JLM_LAYOUT_STRUCT_
#undef JLM_LAYOUT_CHECK_

#endif
