/* quantize.h - quantization at conversion (`jlm convert --type T`): ggml's
 * reference quantizers (no importance matrix) and llama-quantize's per-tensor
 * choices, so the container equals what `llama-quantize` + `jlm convert` give.
 * Today: Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q5_1, Q5_0, Q4_1, Q4_0 ("keep": as they are).
 * docs/safetensors.md section 7.
 * Thread safety: pure functions. */
#ifndef JLM_QUANTIZE_H
#define JLM_QUANTIZE_H

#include <stdint.h>

#include "base/jlm_err.h"

/* "keep" -> 0 (no quantization); "Q8_0" -> GGML_Q8_0, ... Others: JLM_EUNSUPPORTED naming T. */
int jlm_quant_parse(const char *name, uint32_t *ggml_type, jlm_err *err);

/* llama-quantize's choice for one tensor of a model quantized to `target`:
 * the ggml type to store, or src_type to leave it as it is (1-D tensors, the
 * MoE router, rows not a multiple of the block, non-float sources). */
/* A target with this bit is a llama-quantize "_M" mix of its K type (Q4_K_M, Q5_K_M). */
#define JLM_QUANT_MIX_M 0x10000u

uint32_t jlm_quant_choice(uint32_t target, const char *name, uint32_t n_dims, uint64_t row_len, uint32_t src_type,
                          uint32_t n_layer, uint32_t n_expert);

/* Quantizes k floats (k a multiple of the block size) to `type` blocks at dst,
 * bit-identical to ggml's quantize_row_*_ref. */
int jlm_quant_row(uint32_t type, const float *src, void *dst, uint64_t k, jlm_err *err);

#endif
