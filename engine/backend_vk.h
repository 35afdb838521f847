/* backend_vk.h - the engine's Vulkan backend (issue 12): the graph's matmuls
 * on a Vulkan device, reading the weights from device-resident page frames,
 * behind the device backend interface (engine/backend.h).
 *
 * Owns: one Vulkan device, a set of reusable activation buffers, the device
 * memory of its frames (the frames themselves: engine/devframes.h). Device
 * frames follow the host pager's pages: the graph pins a page on the host
 * (jlm_pager_get), then on the device (jlm_dev_page_get), and unpins in the
 * reverse order. A page-in to the device
 * is one transfer of the page's span untouched (the container's planes are
 * already in the device layout, jlm-format.md 7), or, on the import path, no
 * copy at all: the pager's 4096-aligned host frame is imported as device
 * memory (VK_EXT_external_memory_host). A page resident on the device is not
 * transferred again while it stays resident. The victim when the device
 * budget is full is chosen by the pager's own policy (engine/lru.h: LRU
 * experts first, else the MRU block).
 *
 * Paths: "import" where the device has VK_EXT_external_memory_host with an
 * alignment <= 4096 and JLM_VK_UPLOAD is unset; "upload" otherwise (a
 * device-local buffer per frame written through a staging buffer). On the
 * import path a device frame aliases the host frame, so the host pager's
 * evict hook (jlm_dev_host_evicted) releases it before the host memory is
 * freed or reused: device residency is then a subset of host residency.
 *
 * The dense region (output matrix, tied embeddings) is one more frame, made
 * resident on first use and kept (outside the page budget, like the host's).
 *
 * Failure: jlm_evk_open fails with one line (no Vulkan, no device);
 * jlm_dev_page_get fails with JLM_ERANGE when pinned frames fill the budget
 * (a caller bug: the budget is raised to one block plus the routed experts)
 * or the device's error; jlm_dev_matmul returns non-zero when the device
 * cannot run it (one super-block of a plane over a binding; the caller then
 * runs the CPU kernel, counted in fallbacks). A plane over one binding is run
 * in k-chunks by jlm_vk_matvec, bit-identical. Not thread-safe: the
 * graph calls it from its one thread. */
#ifndef JLM_ENGINE_BACKEND_VK_H
#define JLM_ENGINE_BACKEND_VK_H

#include "engine/backend.h"

/* want: device index or name substring (NULL: JLM_VK_DEVICE or the first
 * GPU); allow_cpu: accept a CPU device (lavapipe) unnamed. The budget a 0
 * --gpu-budget means: 3/4 of the largest device-local heap on the upload
 * path, 0 (bounded by the host's frames) on the import path. */
int jlm_evk_open(const char *want, int allow_cpu, jlm_dev **out, jlm_err *err);

#endif
