/* dequant.h - scalar reference dequantization of packed .jlm planes.
 *
 * Owns: reading one row of a packed matrix (jlm-format.md 7: transposed
 * planes, d/sc addressing, nibble rule) back to f32. It is the oracle for the
 * converter's tests and for every kernel variant. Plain loops, no intrinsics.
 * Uses only format/'s layout header.
 * Thread safety: pure functions.
 */
#ifndef JLM_K_DEQUANT_H
#define JLM_K_DEQUANT_H

#include <stdint.h>

/* Dequantizes row r (0 <= r < rows) of a packed k x rows matrix of jlm type
 * `type` whose planes start at qs, d, sc (float types: qs is the row-major
 * span). Writes k floats to out. Returns 0, or -1 for an unknown type. */
int jlm_k_dequant_row_ref(uint8_t type, const void *qs, const void *d, const void *sc,
                          uint64_t k, uint64_t rows, uint64_t r, float *out);

#endif
