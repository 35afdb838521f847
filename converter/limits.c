/* limits.c - the converter's untrusted-size check after planning: the
 * container may not be out of proportion to the GGUF it comes from. Shapes
 * were already checked against the config (jlm_fmt_shapes_check), so a large
 * plan means large tensors, which a small file cannot hold; this is the last
 * line against a crafted file that would have the daemon write a sparse
 * container of hundreds of GB (docs/security.md). */
#include "converter/convert_int.h"

/* Re-quantizing can grow a tensor (a 1.5-bit type stored as Q8_0: ~6x);
 * every plane and page is 4096-aligned. */
#define GROWTH 8u

int jlm_conv_check_proportion(const jlm_conv *c, jlm_err *err)
{
    uint64_t src = c->g->total_bytes;
    uint64_t pad = ((uint64_t)c->n_tensors * 3 + c->config.n_layer + 64) * 2 * JLM_ALIGN;
    uint64_t limit;
    if (__builtin_mul_overflow(src, (uint64_t)GROWTH, &limit) || __builtin_add_overflow(limit, pad, &limit))
        limit = UINT64_MAX;
    if (c->plan.file_size > limit)
        return jlm_errf(err, JLM_ERANGE, "%s: the planned container (%llu bytes) is out of proportion to the "
                        "%llu-byte source", c->src_path, (unsigned long long)c->plan.file_size,
                        (unsigned long long)src);
    return JLM_OK;
}
