/* backend_cu.h - the engine's CUDA backend (issue 17): the graph's matmuls
 * on a CUDA device behind the device backend interface (engine/backend.h),
 * reading the weights in place from device page frames (the container's
 * planes are already in the device layout: a frame is the page's bytes).
 *
 * Owns: the device seam (kernels/cuda/rt.h), two pinned staging buffers, the
 * device scratch for activations and results, the copy thread that pages the
 * next block in while the current one computes (jlm_dev_prefetch), up to two
 * freed frames kept for reuse. A page-in is the page's span
 * copied through the staging buffers on the copy stream: the CPU fills one
 * buffer while the other's DMA runs, and the compute stream waits for the
 * copy stream's last page-in (an event) only before the next kernel.
 * Staging rather than registering the pager's frames: host frames are
 * anonymous mappings whose pages the pager moves between frames (mremap,
 * engine/pager.c), which a registration would not follow.
 *
 * JLM_CUDA_EMULATE=1 runs the backend on the host emulation of rt.h (the
 * device's kernel bodies, strict pointer and ordering checks): how the suite
 * tests this plumbing where no GPU is lent.
 *
 * Failure: jlm_ecu_open fails with one line (not built, no device, a bad
 * --device); matmuls fail as jlm_dev_matmul (the caller runs the CPU kernel).
 * Threads: the graph calls it from its one thread; the backend's own copy
 * thread (started at the first prefetch) copies a prefetched page through
 * the same staging buffers, which one lock shares chunk by chunk. */
#ifndef JLM_ENGINE_BACKEND_CU_H
#define JLM_ENGINE_BACKEND_CU_H

#include "engine/backend.h"

/* device: NULL or a device index ("0"). The budget a 0 --gpu-budget means:
 * 3/4 of the device memory free at open (emulated: 0, unlimited). */
int jlm_ecu_open(const char *device, jlm_dev **out, jlm_err *err);

#endif
