/* backend_vk.h - the engine's Vulkan matvec offload (issue 12, first step).
 *
 * Owns: one Vulkan device and a set of reusable device buffers. A matmul the
 * graph hands over is run by kernels/vulkan's matvec shader: the weight's
 * packed planes are uploaded untouched (one byte copy of each plane's span
 * from the pager's frame, a "page-in" to the device), then one dispatch per
 * token. Everything else of the graph stays on the CPU. Quantized results are
 * bit-identical to the CPU reference, so greedy ids equal the CPU backend's.
 *
 * Failure: jlm_evk_open fails with one line (no Vulkan, no device);
 * jlm_evk_matmul returns non-zero when a plane exceeds one binding (the caller
 * then runs the CPU kernel). Not thread-safe: the graph calls it from its one
 * thread. */
#ifndef JLM_ENGINE_BACKEND_VK_H
#define JLM_ENGINE_BACKEND_VK_H

#include <stdint.h>

#include "base/jlm_err.h"
#include "kernels/cpu/kernels.h"

typedef struct jlm_evk jlm_evk;

/* want: device index or name substring (NULL: JLM_VK_DEVICE or the first
 * GPU); allow_cpu: accept a CPU device (lavapipe) unnamed. */
int  jlm_evk_open(const char *want, int allow_cpu, jlm_evk **out, jlm_err *err);
void jlm_evk_close(jlm_evk *v);   /* accepts NULL */
const char *jlm_evk_device(const jlm_evk *v);

/* y (n, rows) for n tokens; xq: n quantized tokens (quantized types), x:
 * (n, k) floats (float types). 0 on success. */
int jlm_evk_matmul(jlm_evk *v, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq,
                   float *y, jlm_err *err);

/* Counters for --stats: matmuls run, bytes of planes uploaded. */
void jlm_evk_counters(const jlm_evk *v, uint64_t *matmuls, uint64_t *bytes_up);

#endif
