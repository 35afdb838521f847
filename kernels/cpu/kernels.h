/* kernels.h - the CPU kernel API: matvec/matmul over packed .jlm planes,
 * activation quantization, and the small f32 ops of a transformer layer.
 *
 * Owns: the math of every stored type (jlm-format.md 7.1-7.7) read in place
 * from the packed planes, and the choice of one kernel variant (ref, avx2,
 * avx512) at startup. Knows nothing of files, pages or models; uses only
 * format/'s layout header. docs/kernels.md records the decisions the spec
 * leaves open (rounding, accumulation order, tolerances, fallbacks).
 *
 * Invariants:
 *  (1) jlm_k_matvec_ref() defines the exact math of every type: per sub-block
 *      an exact int32 dot product of the stored integer codes with the int8
 *      activations, the zero point removed as bias*sum(a), then one f32
 *      multiply-add per sub-block into a per-row f32 accumulator, sub-blocks in
 *      order. For quantized types every variant is BIT-IDENTICAL to ref (same
 *      f32 operations in the same order, no FMA; docs/kernels.md). Float
 *      types (F32/F16/BF16) may differ in the last bits (FMA, several
 *      accumulators), within kernels/cpu/tolerances.h.
 *  (2) A matvec writes y[r] for r in [r0, r1) only, reads nothing of y, and
 *      touches no other state: threads may split the rows of one matrix.
 *  (3) The kernel table chosen by jlm_k_cpu_init() is the module's only global
 *      mutable state. jlm_k_cpu_init writes it only when the choice changes
 *      (the first call, or JLM_CPU naming another variant); a later call with
 *      the same choice, as when jlm serve opens a model while another
 *      computes, only reads it. Call it before starting threads that read it.
 *
 * Thread safety: every kernel is a pure function of its arguments (given (3)).
 * Memory: kernels allocate nothing; callers own every buffer.
 */
#ifndef JLM_K_KERNELS_H
#define JLM_K_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"
#include "format/jlm_format.h"

/* ---------------------------------------------------------------- operands */

/* One packed 2-D sheet of `rows` rows of k weights (jlm-format.md 7). */
typedef struct jlm_k_mat {
    uint8_t     type;     /* enum jlm_type */
    uint64_t    k, rows;  /* k: weights per row (the reduced dimension) */
    const void *qs;       /* quantized: u32 words, word w of sub-block s of row r at
                           * (s*W + w)*rows + r; float types: (rows, k) row-major */
    const void *d;        /* d plane (7.2); NULL for float types */
    const void *sc;       /* sc plane (7.3); NULL unless Q3_K, Q4_K, Q5_K, Q6_K */
} jlm_k_mat;

/* Checks type and shape: a known type, k and rows > 0, k a multiple of the
 * super-block width, planes non-NULL where the type has them. Kernels assume
 * a checked matrix. Returns JLM_EINVAL (message names the bound) or 0. */
int jlm_k_mat_check(const jlm_k_mat *m, jlm_err *err);

/* int8 activations (7.7): per 32 elements one f32 scale d = amax/127 and
 * q = round(x/d) in [-127, 127]; per 16 elements the sum of q. */
typedef struct jlm_act_q8 {
    uint64_t k;           /* multiple of 32 */
    int8_t  *q;           /* (k,) 64-byte aligned when from jlm_k_act_q8_init */
    float   *d;           /* (k/32,) */
    int16_t *sum16;       /* (k/16,) */
} jlm_act_q8;

/* Bytes of caller storage for k activations (includes alignment slack). */
size_t jlm_k_act_q8_bytes(uint64_t k);
/* Points a at buf (jlm_k_act_q8_bytes(k) bytes). JLM_EINVAL if k is 0 or not
 * a multiple of 32; *a untouched then. */
int jlm_k_act_q8_init(jlm_act_q8 *a, void *buf, uint64_t k, jlm_err *err);
/* Quantizes x (a->k floats) into a. Round half away from zero. A block whose
 * amax is 0 gets d = 0 and q = 0; a block holding inf or NaN gets d = NaN and
 * q = 0, so every output it feeds is NaN. Cannot fail. */
void jlm_k_quantize_act(const float *x, jlm_act_q8 *a);

/* ---------------------------------------------------------------- matvec / matmul */

/* y[r] = sum_i W[r,i] * x[i] for r in [r0, r1). Quantized types read xq (the
 * quantized x, xq->k == m->k); float types read x. y has m->rows entries.
 * Preconditions (our bugs, not input): m checked, r0 <= r1 <= m->rows. */
typedef void (*jlm_k_matvec_fn)(const jlm_k_mat *m, const float *x, const jlm_act_q8 *xq,
                                float *y, uint64_t r0, uint64_t r1);
/* n tokens: x (n, k) row-major, xq (n,) quantized tokens, y (n, rows)
 * row-major; rows [r0, r1) of every token. */
typedef void (*jlm_k_matmul_fn)(const jlm_k_mat *m, uint64_t n, const float *x,
                                const jlm_act_q8 *xq, float *y, uint64_t r0, uint64_t r1);

/* The reference: plain loops, defines the math (invariant 1). */
void jlm_k_matvec_ref(const jlm_k_mat *m, const float *x, const jlm_act_q8 *xq,
                      float *y, uint64_t r0, uint64_t r1);
void jlm_k_matmul_ref(const jlm_k_mat *m, uint64_t n, const float *x, const jlm_act_q8 *xq,
                      float *y, uint64_t r0, uint64_t r1);

/* ---------------------------------------------------------------- kernel table */

struct jlm_k_fattn;   /* below, with the ops */

enum jlm_k_variant { JLM_K_REF = 0, JLM_K_AVX2 = 1, JLM_K_AVX512 = 2, JLM_K_NVARIANT = 3 };

/* Where the AVX-512 kernels' software prefetch puts the weights' lines
 * (prefetch.h): one build of matvec_avx512.c each. AUTO: this CPU's default
 * (jlm_k_cpu_pf_default). The other variants have one build. */
enum jlm_k_pf { JLM_K_PF_AUTO = 0, JLM_K_PF_L1 = 1, JLM_K_PF_L2 = 2 };

typedef struct jlm_k_cpu {
    const char     *name;                  /* "ref", "avx2", "avx512" */
    int             variant;               /* enum jlm_k_variant */
    int             pf;                    /* AVX-512: JLM_K_PF_L1 or _L2; 0 otherwise */
    uint32_t        native;                /* bit t: matvec[t] is this variant's own code */
    uint32_t        native_mm;             /* bit t: matmul[t] is this variant's own code */
    jlm_k_matvec_fn matvec[JLM_T_COUNT];   /* every stored type; never NULL */
    jlm_k_matmul_fn matmul[JLM_T_COUNT];   /* every stored type; never NULL (the GEMM where
                                            * native_gemm has the type's bit) */
    uint32_t        native_gemm;           /* bit t: matmul[t] is a register-tiled GEMM */
    jlm_k_matmul_fn matmul4[JLM_T_COUNT];  /* the up-to-4-tokens-per-weight-load matmul: what
                                            * a GEMM runs for tokens after its last full tile;
                                            * kept for benchmarks and tests; never NULL */
    /* jlm_k_quantize_act or a variant of it with bit-identical output */
    void          (*quantize_act)(const float *x, jlm_act_q8 *a);
    /* d[i * stride] = jlm_k_f32_to_fp16(x[i]) for i < n: jlm_k_to_fp16_ref or a
     * variant with bit-identical output (F16C; the KV cache's F16 rows) */
    void          (*to_fp16)(uint16_t *d, uint64_t stride, const float *x, uint64_t n);
    /* jlm_k_fattn_ref or a variant of it with bit-identical output (never NULL) */
    void          (*fattn)(const struct jlm_k_fattn *p, const float *q, const void *k, const void *v,
                           float *out, uint32_t g, uint32_t r0, uint32_t r1, float *scratch);
    /* jlm_k_swiglu or a variant of it with bit-identical output (never NULL) */
    void          (*swiglu)(float *out, const float *gate, const float *up, uint64_t n);
} jlm_k_cpu;

/* 1 if this CPU (cpuid + OS xsave state) runs variant v. Cannot fail. */
int jlm_k_cpu_has(int v);
/* Variant by name ("ref", "avx2", "avx512"); -1 if unknown. */
int jlm_k_cpu_variant_by_name(const char *name);
/* Fills *t with variant v (ref where it has no own code). JLM_EUNSUPPORTED if
 * the CPU lacks it, JLM_EINVAL for an unknown v; *t untouched then. The
 * AVX-512 variant prefetches as this CPU's default. */
int jlm_k_cpu_table(int v, jlm_k_cpu *t, jlm_err *err);
/* The same with the AVX-512 prefetch level named (enum jlm_k_pf; ignored by
 * the other variants; JLM_EINVAL for a value outside the enum). */
int jlm_k_cpu_table_pf(int v, int pf, jlm_k_cpu *t, jlm_err *err);
/* JLM_K_PF_L1 or JLM_K_PF_L2: where this CPU's AVX-512 kernels prefetch
 * (dispatch.c says which CPUs get which and what was measured). */
int jlm_k_cpu_pf_default(void);

/* Chooses the global table: the best variant the CPU runs, or the one named by
 * env JLM_CPU=ref|avx2|avx512|avx512-l1|avx512-l2 (the last two: AVX-512 with
 * its prefetch into L1 or L2). A forced variant the CPU lacks falls back to
 * the best one with a note on stderr. JLM_EINVAL for an unknown JLM_CPU value
 * (the table is then the best variant anyway). Call once before threads start. */
int jlm_k_cpu_init(jlm_err *err);
/* The chosen table (initializes on first use if jlm_k_cpu_init was not
 * called: that first call must then happen before threads start). */
const jlm_k_cpu *jlm_k_cpu_get(void);
const char *jlm_k_cpu_variant_name(void);

/* The AVX2 activation quantizer (also used by the AVX-512 table). */
void jlm_k_quantize_act_avx2(const float *x, jlm_act_q8 *a);

/* Internal: a variant's file overrides the entries it has code for. */
void jlm_k_fill_avx2(jlm_k_cpu *t);
void jlm_k_fill_avx512(jlm_k_cpu *t);      /* prefetch into L2 */
void jlm_k_fill_avx512_l1(jlm_k_cpu *t);   /* the same code, prefetch into L1 */

/* ---------------------------------------------------------------- scalar helpers */

float    jlm_k_fp16_to_f32(uint16_t h);   /* exact, inf/NaN/denormals kept */
uint16_t jlm_k_f32_to_fp16(float f);      /* round to nearest even, like F16C */
void     jlm_k_to_fp16_ref(uint16_t *d, uint64_t stride, const float *x, uint64_t n);
void     jlm_k_to_fp16_f16c(uint16_t *d, uint64_t stride, const float *x, uint64_t n);
float    jlm_k_bf16_to_f32(uint16_t h);

/* ---------------------------------------------------------------- ops (ops.c), f32, cannot fail */

/* out = x / sqrt(mean(x^2) + eps) * w (w NULL: no weight). out may be x. */
void jlm_k_rmsnorm(float *out, const float *x, const float *w, uint64_t n, float eps);
/* out = (x - mean) / sqrt(var + eps) * w + b (w, b may be NULL). out may be x. */
void jlm_k_layernorm(float *out, const float *x, const float *w, const float *b,
                     uint64_t n, float eps);

/* RoPE parameters (ggml's rope_ext): theta_i = pos * base^(-2i/n_rot) / ff[i]. */
typedef struct jlm_k_rope {
    uint32_t     n_rot;        /* rotated dims (even, <= head dim); the rest is copied */
    int          neox;         /* 0: pairs (2i, 2i+1); 1: pairs (i, i + n_rot/2) */
    float        freq_base;
    float        freq_scale;   /* 1 = none; YaRN/linear: 1/factor */
    const float *freq_factors; /* (n_rot/2,) or NULL */
    float        ext_factor;   /* YaRN ramp mix, 0 = off */
    float        attn_factor;  /* mscale, 1 = none */
    float        beta_fast, beta_slow;
    uint32_t     orig_ctx;     /* YaRN original context */
} jlm_k_rope;
/* Fills p with defaults: neox 0, freq_scale 1, attn_factor 1, ext_factor 0,
 * beta_fast 32, beta_slow 1, orig_ctx 0, no freq factors. */
void jlm_k_rope_defaults(jlm_k_rope *p, uint32_t n_rot, float freq_base);
/* Rotates n_head heads of head_dim floats, in place, at position pos:
 * jlm_k_rope_cos_sin then jlm_k_rope_rotate.
 * Precondition: n_rot even, n_rot <= head_dim <= JLM_MAX_HEAD_DIM. */
void jlm_k_rope_apply(const jlm_k_rope *p, float *x, uint32_t n_head, uint32_t head_dim,
                      int64_t pos);
/* The (cos, sin) pair i is rotated by at position pos, into cs[2i], cs[2i+1]
 * for i < n_rot/2 (f32 theta, YaRN mix), so a device kernel, or heads
 * rotated one at a time, given cs rotate bit-identically. */
void jlm_k_rope_cos_sin(const jlm_k_rope *p, int64_t pos, float *cs);
/* Rotates n_head heads of head_dim floats in place by cs (jlm_k_rope_cos_sin;
 * p gives n_rot and neox). */
void jlm_k_rope_rotate(const float *cs, const jlm_k_rope *p, float *x, uint32_t n_head, uint32_t head_dim);
/* ggml_rope_yarn_corr_dims: dims[0] = start, dims[1] = end of the ramp. */
void jlm_k_rope_yarn_corr_dims(uint32_t n_dims, uint32_t orig_ctx, float freq_base,
                               float beta_fast, float beta_slow, float dims[2]);

void jlm_k_softmax(float *x, uint64_t n);               /* in place, max-subtracted */
void jlm_k_silu(float *out, const float *x, uint64_t n);
void jlm_k_gelu(float *out, const float *x, uint64_t n);       /* tanh approximation, f32 */
/* ggml CPU's GELU: x <= -10 -> 0, x >= 10 -> x, else x rounded to fp16, the
 * tanh GELU of that, rounded to fp16 (llama.cpp's table; gemma3 needs it). */
void jlm_k_gelu_fp16(float *out, const float *x, uint64_t n);
/* ggml's GELU table entry of the half h: f32(fp16(gelu(f32(h)))) (the table jlm_k_gelu_fp16 reads in (-10, 10)) */
float jlm_k_gelu_fp16_entry(uint16_t h);
void jlm_k_gelu_quick(float *out, const float *x, uint64_t n); /* x*sigmoid(1.702x) */
/* out = gate * sigmoid(gate) * up, the sigmoid from e = jlm_k_fattn_exp(-|gate|)
 * (<= 1, so it never overflows): 1 / (1 + e) for gate >= 0, else e / (1 + e).
 * Within ~2 ulp of the libm formula; a vector variant gives the same bits
 * (jlm_k_cpu's swiglu). */
void jlm_k_swiglu(float *out, const float *gate, const float *up, uint64_t n);
void jlm_k_swiglu_avx2(float *out, const float *gate, const float *up, uint64_t n);
void jlm_k_swiglu_avx512(float *out, const float *gate, const float *up, uint64_t n);
/* gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
 * out = g * sigmoid(alpha*g) * (u + 1). */
void jlm_k_swiglu_oai(float *out, const float *gate, const float *up, uint64_t n,
                      float alpha, float limit);
void jlm_k_add(float *out, const float *a, const float *b, uint64_t n);
/* y[i] += a * x[i], one rounded product and one rounded sum (no FMA). */
void jlm_k_axpy(float *y, float a, const float *x, uint64_t n);

/* The MoE router of one token, after the router matvec and its bias:
 * logits (n <= 1024) -> sel[0..n_used) and their weights w[0..n_used).
 * mode JLM_K_ROUTE_NORM: softmax, the n_used largest probabilities in order
 * (ties: the lower index), weights renormalised to sum 1; JLM_K_ROUTE_RAW:
 * the same without renormalising (OLMoE); JLM_K_ROUTE_OAI (gpt-oss): the
 * n_used largest logits, softmax among them. scale > 0 multiplies the weights. */
enum { JLM_K_ROUTE_NORM = 0, JLM_K_ROUTE_RAW = 1, JLM_K_ROUTE_OAI = 2 };
void jlm_k_moe_route(const float *logits, uint32_t n, uint32_t n_used, int mode, float scale,
                     int32_t *sel, float *w);
/* x += sum_s w[s] * ys[s] (n floats each), each element's mixture summed from
 * 0 in expert order, then added to x once (what moe_token does). */
void jlm_k_moe_combine(float *x, const float *const *ys, const float *w, uint32_t n_used, uint64_t n);
void jlm_k_mul(float *out, const float *a, const float *b, uint64_t n);
void jlm_k_scale(float *out, const float *a, float s, uint64_t n);

/* One query head over an f32 KV cache. Key j is k + j*k_stride (head_dim
 * floats), value j is v + j*v_stride (head_dim_v floats), j in [0, n_kv).
 * score_j = scale * dot(q, key_j); softcap > 0: score = softcap*tanh(score/softcap);
 * mask (n_kv,) or NULL is added (-INFINITY hides a key); sink: when has_sink,
 * exp(sink) joins the softmax denominator with no value. out (head_dim_v) =
 * sum_j p_j value_j. scratch holds n_kv floats (the probabilities on return).
 * All keys masked and no sink: out = 0. Cannot fail. */
typedef struct jlm_k_attn {
    uint32_t     head_dim, head_dim_v;
    uint64_t     k_stride, v_stride;   /* floats between consecutive positions */
    float        scale, softcap;
    int          has_sink;
    float        sink;
    const float *mask;
} jlm_k_attn;
void jlm_k_attn_head(const jlm_k_attn *p, const float *q, const float *k, const float *v,
                     uint64_t n_kv, float *scratch, float *out);


/* Batched attention of a run of query rows of one sequence (prefill, and
 * decode as a run of one), flash-attention style: the keys in tiles of
 * JLM_K_FATTN_BK positions aligned on multiples of JLM_K_FATTN_BK, each tile
 * read (and an F16 cache widened) once for every query head of KV head g and
 * every row of [r0, r1), an online softmax (running max m and sum l) per
 * (row, head).
 *
 * Query row r, head h = g*group + hh: q + r*q_stride + h*head_dim; it sees
 * keys [lo[r], hi[r]) (causal mask, sliding window, an image's bidirectional
 * rows: all contiguous ranges); an empty range and no sink gives out = 0.
 * Key j of KV head g: k + (g*kh_stride + j*k_stride) elements (f32, or F16
 * bits when kv_f16), value j: v + (g*vh_stride + j*v_stride): a cache of
 * rows (position-major: kh_stride = head_dim, k_stride = the row) or, as the
 * engine keeps it, of heads (head-major: k_stride = head_dim, kh_stride =
 * the positions a head holds times head_dim). k_tiled: the keys instead in
 * tiles of JLM_K_FATTN_BK positions, dimension-major, the layout the
 * kernels compute scores in: key j, dimension i of head g at
 * k + g*kh_stride + (j/BK)*BK*head_dim + i*BK + j%BK (k_stride unused;
 * kh_stride a multiple of BK*head_dim). Positions of a tile past the cached
 * ones are read but never used. Output row r,
 * head h: out + r*o_stride + h*head_dim_v (overwritten).
 *
 * Per (row, head) and key tile, in this order (f32, no FMA):
 *   s_j = sum_i q[i]*k_j[i] (i ascending, from 0); softcap > 0:
 *   s_j = softcap*tanhf(s_j/softcap); s_j *= scale;
 *   m' = max(m, max_j s_j); a = exp(m - m'); l *= a, o *= a (skipped when a = 1);
 *   for j ascending: p = exp(s_j - m'), l += p, o += p*v_j;  m = m'.
 * start: m = sink (sinks[h]), l = 1, or m = -inf, l = 0 without sinks;
 * end: o *= 1/l (l > 0). exp is jlm_k_fattn_exp. The result of a row depends
 * only on its q, its range and the cache: not on r0, r1, the other rows, the
 * thread or the variant (every variant is bit-identical to jlm_k_fattn_ref).
 * It differs from jlm_k_attn_head (one pass, libm expf, sum in double) by
 * rounding: tests/test_kernels.c bounds it (JLM_K_TOL_FATTN).
 * Preconditions: r1 - r0 <= JLM_K_FATTN_BQ, scratch holds
 * jlm_k_fattn_scratch_floats(head_dim, head_dim_v, group) floats (no
 * alignment needed), every hi[r] <= the cached positions. Cannot fail. */
#define JLM_K_FATTN_BK 32
#define JLM_K_FATTN_BQ 32
typedef struct jlm_k_fattn jlm_k_fattn;
struct jlm_k_fattn {
    uint32_t        head_dim, head_dim_v, group;  /* group: query heads per KV head */
    uint64_t        q_stride, o_stride;           /* floats between query / output rows */
    uint64_t        k_stride, v_stride;           /* elements between cached positions */
    uint64_t        kh_stride, vh_stride;         /* elements between KV heads */
    int             k_tiled;                      /* keys in dimension-major tiles (above) */
    int             kv_f16;
    float           scale, softcap;
    const float    *sinks;                        /* (n_head,) or NULL */
    const uint32_t *lo, *hi;                      /* per query row */
};
typedef void (*jlm_k_fattn_fn)(const jlm_k_fattn *p, const float *q, const void *k, const void *v,
                               float *out, uint32_t g, uint32_t r0, uint32_t r1, float *scratch);
size_t jlm_k_fattn_scratch_floats(uint32_t head_dim, uint32_t head_dim_v, uint32_t group);
void   jlm_k_fattn_ref(const jlm_k_fattn *p, const float *q, const void *k, const void *v, float *out,
                       uint32_t g, uint32_t r0, uint32_t r1, float *scratch);
void   jlm_k_fattn_avx2(const jlm_k_fattn *p, const float *q, const void *k, const void *v, float *out,
                        uint32_t g, uint32_t r0, uint32_t r1, float *scratch);
void   jlm_k_fattn_avx512(const jlm_k_fattn *p, const float *q, const void *k, const void *v, float *out,
                          uint32_t g, uint32_t r0, uint32_t r1, float *scratch);
/* exp(x) for x <= 0 as the attention kernels compute it (Cody-Waite reduction,
 * Cephes' degree-5 polynomial, f32 mul/add only, so a vector lane gives the
 * same bits); x < -87: 0; NaN stays NaN. Within 2 ulp of expf on [-87, 0]. */
float  jlm_k_fattn_exp(float x);

#endif
