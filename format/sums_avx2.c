/* sums_avx2.c - jlm_sums_hash_avx2 (format/sums.h): XXH3-64 with its AVX2
 * loop, compiled with the Makefile's AVX2 flags (the *_avx2.c rule). XXH3's
 * value does not depend on the loop that computes it; sums.c calls this one
 * only where the CPU has AVX2. */
#include "format/sums.h"

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

uint64_t jlm_sums_hash_avx2(const void *p, size_t n) { return XXH3_64bits(p, n); }
