/* tolerances.h - how far kernel results may be from their oracle, per type.
 *
 * Quantized matvec: the result is compared with the f64 dot product of the
 * dequantized weights (jlm_k_dequant_row_ref) and the dequantized int8
 * activations, relative to sum |w*x| of that row. The int32 sub-block dots are
 * exact, so the only error is f32 rounding of the per-sub-block scale products
 * and of the running sum (at most k/16 terms): a few ulp of sum |w*x|.
 * Variants are held to the same bound against the reference (FMA vs mul+add
 * and per-row order are their only freedom).
 * Float weights: f32 dot products in another order, relative to sum |w*x|.
 * Checks are written !(err <= tol * scale) so a NaN fails. */
#ifndef JLM_K_TOLERANCES_H
#define JLM_K_TOLERANCES_H

#define JLM_K_TOL_F32    2e-6
#define JLM_K_TOL_F16    2e-6
#define JLM_K_TOL_BF16   2e-6
#define JLM_K_TOL_Q4_0   4e-6
#define JLM_K_TOL_Q8_0   4e-6
#define JLM_K_TOL_Q5_0   4e-6
#define JLM_K_TOL_Q5_1   4e-6
#define JLM_K_TOL_MXFP4  4e-6
#define JLM_K_TOL_Q3_K   4e-6
#define JLM_K_TOL_Q4_K   4e-6
#define JLM_K_TOL_Q5_K   4e-6
#define JLM_K_TOL_Q6_K   4e-6

/* Ops against plain f64 formulas, relative to the value's magnitude (or 1). */
#define JLM_K_TOL_NORM    2e-6   /* rmsnorm, layernorm */
#define JLM_K_TOL_SOFTMAX 2e-6   /* softmax, attention probabilities and output */
#define JLM_K_TOL_ROPE    2e-5   /* theta accumulated in f32 as ggml does: grows with pos */
#define JLM_K_TOL_ACT     2e-6   /* silu, gelu, swiglu */

/* Batched attention (jlm_k_fattn) against the per-token jlm_k_attn_head, per
 * output element, relative to max |v| over the row's visible keys, for a row
 * that sees n keys. Both compute the same f32 scores (same dot order, same
 * softcap and scale), so only the softmax differs: the kernel's exp is within
 * 2 ulp of expf, each of its at most n/32 + 1 rescales of the running sum and
 * output adds about 3 ulp, its sum is f32 (n - 1 roundings of positive terms,
 * relative) where the per-token one sums in double, and both accumulate the
 * output in f32 over the n keys (n roundings each, of terms bounded by
 * p_j max|v|). Worst case: (2n + 3(n/32 + 1) + 8) ulp of max |v|; 4n + 32
 * ulp leaves room for the 1/l and p_j roundings. Random data lands far
 * below (the errors do not all line up). */
#define JLM_K_TOL_FATTN(n) ((4.0 * (double)(n) + 32.0) * 0x1p-24)

#endif
