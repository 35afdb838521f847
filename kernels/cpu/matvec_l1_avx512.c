/* matvec_l1_avx512.c - the AVX-512 kernels of matvec_avx512.c compiled with
 * their software prefetch into L1 (prefetcht0) instead of L2: a prefetch
 * hint is an immediate, so the choice between them is two compiled copies
 * and a table filled from one (dispatch.c, jlm_k_cpu_pf_default). Same code,
 * same results: a prefetch changes no value. */
#define JLM_PF_HINT _MM_HINT_T0
#define JLM_K_FILL_AVX512 jlm_k_fill_avx512_l1
#include "kernels/cpu/matvec_avx512.c"
