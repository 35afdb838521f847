/* pack.h - packing of ggml blocks into the .jlm transposed planes (jlm-format.md 7).
 *
 * Owns: the conversion of one 2-D matrix (k x rows) of a ggml type into the
 * qs, d and sc planes of its stored .jlm type, and the choice of stored type
 * for a source type (Q4_1 -> Q5_1 exactly; Q2_K re-quantized; see docs/packing.md).
 * Must not know: GGUF files (it receives bytes), the container layout.
 *
 * Invariants:
 *  (1) Dequantizing the packed planes with jlm_k_dequant_row_ref gives
 *      bit-identical f32 to jlm_ggml_dequant_row on the source bytes, for
 *      every exact pair (everything except a re-quantized source).
 *  (2) Every unused bit of a plane is zero (padding, unused d slots).
 * Thread safety: pure functions.
 */
#ifndef JLM_PACK_H
#define JLM_PACK_H

#include <stdint.h>
#include "base/jlm_err.h"

/* The stored .jlm type for a ggml source type, and whether the conversion is
 * exact (1) or a re-quantization (0). JLM_EUNSUPPORTED (naming the type) if
 * there is none. */
int jlm_pack_stored_type(uint32_t ggml_type, uint8_t *jlm_type, int *exact, jlm_err *err);

/* Packs one 2-D matrix: src holds rows*k elements of ggml_type as stored in
 * GGUF (row-major, k per row). qs/d/sc point at the destination planes, each
 * at least as long as jlm_fmt_planes() says for (jlm_type, k, rows) and
 * zero-filled by the caller. jlm_type must be jlm_pack_stored_type(ggml_type).
 * Errors: JLM_EFORMAT (e.g. MXFP4 exponent 0/1/255 in a non-zero block; the
 * message names `what`), JLM_EUNSUPPORTED. */
int jlm_pack_matrix(uint32_t ggml_type, const void *src, uint64_t k, uint64_t rows,
                    uint8_t jlm_type, uint8_t *qs, uint8_t *d, uint8_t *sc,
                    const char *what, jlm_err *err);

#endif
