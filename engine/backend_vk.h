/* backend_vk.h - the engine's Vulkan backend (issue 12): the graph's matmuls
 * on a Vulkan device, reading the weights from device-resident page frames.
 *
 * Owns: one Vulkan device, the device page frames and their budget, a set of
 * reusable activation buffers. Device frames follow the host pager's pages:
 * the graph pins a page on the host (jlm_pager_get), then on the device
 * (jlm_evk_page_get), and unpins in the reverse order. A page-in to the device
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
 * evict hook (jlm_evk_host_evicted) releases it before the host memory is
 * freed or reused: device residency is then a subset of host residency.
 *
 * The dense region (output matrix, tied embeddings) is one more frame, made
 * resident on first use and kept (outside the page budget, like the host's).
 *
 * Failure: jlm_evk_open fails with one line (no Vulkan, no device);
 * jlm_evk_page_get fails with JLM_ERANGE when pinned frames fill the budget
 * (a caller bug: the budget is raised to one block plus the routed experts)
 * or the device's error; jlm_evk_matmul returns non-zero when the device
 * cannot run it (one super-block of a plane over a binding; the caller then
 * runs the CPU kernel, counted in fallbacks). A plane over one binding is run
 * in k-chunks by jlm_vk_matvec, bit-identical. Not thread-safe: the
 * graph calls it from its one thread. */
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

/* Device frames' budget in bytes (0: unlimited), evicting unpinned frames
 * until they fit. The caller raises it to its minimum working set first. */
void jlm_evk_set_budget(jlm_evk *v, uint64_t budget);
/* The budget a 0 --gpu-budget means: 3/4 of the largest device-local heap
 * on the upload path, 0 (bounded by the host's frames) on the import path. */
uint64_t jlm_evk_default_budget(const jlm_evk *v);
/* The dense region (host memory, 4096-aligned, len a multiple of 4096,
 * borrowed for the backend's life). */
void jlm_evk_set_dense(jlm_evk *v, const void *host, uint64_t len);

/* Pins page `page` of pager array `array` (class cls, enum jlm_pager_class)
 * on the device, len bytes mirroring host (the host frame, pinned by the
 * caller). array < JLM_EVK_ARRAYS. */
#define JLM_EVK_ARRAYS 8
int  jlm_evk_page_get(jlm_evk *v, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len,
                      jlm_err *err);
void jlm_evk_page_put(jlm_evk *v, uint32_t array, uint32_t page);
/* The host pager's evict hook (jlm_pager_evict_fn; ctx = the jlm_evk). */
void jlm_evk_host_evicted(void *ctx, uint32_t array, uint32_t page, void *frame);

/* y (n, rows) for n tokens; xq: n quantized tokens (quantized types), x:
 * (n, k) floats (float types). The planes are read from the pinned device
 * frame holding m's host planes (else uploaded for this call, counted in
 * reuploads). 0 on success. */
int jlm_evk_matmul(jlm_evk *v, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq,
                   float *y, jlm_err *err);

typedef struct jlm_evk_stats {
    const char *device, *path;   /* path: "import" or "upload" */
    uint64_t matmuls;            /* matmuls run on the device */
    uint64_t page_ins, hits, evictions;
    uint64_t bytes_up;           /* bytes transferred into device frames (upload path) and per-call reuploads */
    uint64_t bytes_imported;     /* bytes of host frames imported without a copy */
    uint64_t frames, resident_bytes, peak_bytes, budget;
    uint64_t reuploads;          /* matmuls whose planes were in no pinned frame */
    uint64_t fallbacks;          /* matmuls the device refused (run on the CPU): e.g. one
                                  * super-block of a plane over maxStorageBufferRange */
    uint64_t kernel_ns, xfer_ns; /* dispatch+wait; page-ins and activation/result copies */
} jlm_evk_stats;
void jlm_evk_stats_get(const jlm_evk *v, jlm_evk_stats *out);
void jlm_evk_stats_reset(jlm_evk *v);

/* Counters for --stats: matmuls run, bytes of planes uploaded. */
void jlm_evk_counters(const jlm_evk *v, uint64_t *matmuls, uint64_t *bytes_up);

#endif
