/* backend.h - the engine's device backend interface: the executor's matmuls on
 * a device (Vulkan: backend_vk.c; CUDA: backend_cu.c), reading the weights
 * from device page frames that follow the host pager's pages.
 *
 * A backend is a jlm_dev: its device frames (engine/devframes.h: the pager's
 * policy, the budget, the dense region) are common; what differs is behind
 * jlm_dev_ops: how a frame is made resident (devframes ops) and how a matmul
 * runs. The streamer (stream.c) pins a page on the host (jlm_pager_get),
 * then on the device (jlm_dev_page_get), and unpins in the reverse order.
 *
 * Failure: the backends' open functions fail with one line (no driver, no
 * device); jlm_dev_page_get as jlm_dframes_get; jlm_dev_matmul returns
 * non-zero when the device cannot run it (the caller then runs the CPU
 * kernel, counted in fallbacks). Not thread-safe: the graph's one thread. */
#ifndef JLM_ENGINE_BACKEND_H
#define JLM_ENGINE_BACKEND_H

#include <stdint.h>

#include "base/jlm_err.h"
#include "engine/devframes.h"
#include "kernels/cpu/kernels.h"

#define JLM_DEV_ARRAYS JLM_DF_ARRAYS

typedef struct jlm_dev_stats {
    const char *kind;            /* "vulkan" or "cuda" */
    const char *device, *path;   /* path: vulkan "import"/"upload"; cuda "staged" (or "emulated") */
    uint64_t matmuls;            /* matmuls run on the device */
    uint64_t expert_matmuls;     /* of them, routed experts' (gate, up, down): a prefill's, grouped by
                                    expert, three a used expert of a block, not three a (row, slot) */
    uint64_t sheet_matvecs;      /* matvec dispatches (launches) of deepseek2's per-head sheets
                                    (attn_k_b, attn_v_b): one a batch of all heads, one a head
                                    where a batch cannot be bound */
    uint64_t page_ins, hits, evictions;
    uint64_t prefetches;         /* page-ins started ahead, on the copy thread (CUDA) */
    uint64_t bytes_up;           /* bytes copied into device frames and per-call reuploads */
    uint64_t bytes_imported;     /* bytes of host frames imported without a copy */
    uint64_t frames, resident_bytes, peak_bytes, budget;
    uint64_t reuploads;          /* matmuls whose planes were in no pinned frame */
    uint64_t fallbacks;          /* matmuls the device refused (run on the CPU) */
    uint64_t kernel_ns, xfer_ns; /* kernels (dispatch + wait); page-ins and activation/result copies */
    uint64_t waits;              /* round trips: the host waited for results (one per matmul, or per
                                    jlm_dev_matmul_multi) */
    uint64_t act_up, act_down;   /* activation bytes copied host -> device (matmul inputs) and back
                                    (results), counted at the copies; page-ins and reuploads not */
    uint64_t dispatches;         /* kernel dispatches (CUDA: launches) and device copies recorded or
                                    enqueued; CUDA: a graph's counted each time it is launched, as
                                    its ops issued one by one (0: not counted) */
    uint64_t graph_launches, graph_captures;   /* CUDA: graphs of a token's launches replayed, captured */
    uint64_t rt_calls;           /* CUDA: host calls into the device runtime (launches and copies issued
                                    one by one, events, waits, graph launches; kernels/cuda/rt.h) */
} jlm_dev_stats;

/* Profiling (jlm bench --profile): a backend's time per op class. The
 * first three are the device's own time for the ops of that class
 * (Vulkan: timestamp queries in the command buffer; a backend without
 * device timing measures its kernels' calls on the host); JLM_DEVP_XFER is
 * the rest of the host's time in the backend (kernel_ns + xfer_ns of the
 * stats): page-ins, activations up and down, submits and waits. */
enum {
    JLM_DEVP_MATMUL,   /* weight matmuls, the activations' quantization included */
    JLM_DEVP_ATTN,     /* attention over the cache */
    JLM_DEVP_NORM,     /* norms, RoPE, the KV store, activations, residual adds */
    JLM_DEVP_XFER,     /* transfer/wait */
    JLM_DEVP_N
};
typedef struct jlm_dev_prof {
    int      timed;            /* 1: ns[MATMUL..NORM] measured; 0: n/a, the device cannot time its ops
                                * (they are then inside ns[JLM_DEVP_XFER]) */
    int      host_timed;       /* 1: ns[MATMUL..NORM] are the host's time in the kernels' calls */
    uint64_t ns[JLM_DEVP_N];
} jlm_dev_prof;

typedef struct jlm_dev jlm_dev;
struct jlm_engine;
struct jlm_prog;

typedef struct jlm_dev_ops {
    const char *kind;
    void        (*close)(jlm_dev *d);   /* after the frames are dropped */
    const char *(*device)(const jlm_dev *d);
    uint64_t    (*default_budget)(const jlm_dev *d);
    int         (*matmul)(jlm_dev *d, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq,
                          float *y, jlm_err *err);
    /* the backend's counters into out (kind, frame counters: filled by the caller) */
    void        (*stats)(const jlm_dev *d, jlm_dev_stats *out);
    void        (*stats_reset)(jlm_dev *d);
    /* A prefetch's page-in (jlm_dframes_prefetch's page_in callback) was
     * only queued: waits until its copy has read the host frame and orders
     * the device's next kernels after it; 0 or the copy's error. NULL: the
     * backend pages in synchronously and starts no prefetch (Vulkan). */
    int         (*prefetch_wait)(jlm_dev *d, jlm_err *err);
    /* ys[i] = the tokens times ms[i] for nm <= JLM_DEV_MULTI_MAX matrices of
     * one input, in one round trip; 1 and nothing done when it cannot (the
     * caller runs them one by one). NULL: never (Vulkan). */
    int         (*matmul_multi)(jlm_dev *d, const jlm_k_mat *const *ms, int nm, uint32_t n, const float *x,
                                const jlm_act_q8 *xq, float *const *ys, jlm_err *err);
    /* Whole blocks on the device (NULL: none; Vulkan: engine/exec_vk.c).
     * block: block l's program p over the rows xs (n rows of n_embd;
     * kc: their one sequence's cache at positions pos0.., NULL: the batch
     * bound in the engine), recorded with the blocks before it; the
     * residual rows then stay on the device until x_sync or output.
     * JLM_EUNSUPPORTED (nothing done, the rows on the host): the caller runs
     * the program on the CPU, as it will for that block every time (the
     * answer depends on the model, the layer and the sequence only).
     * x_sync: the rows the device holds back into the host's xs (none: 0).
     * x_drop: forgets them.
     * output: logits (n, m->rows) = rmsnorm(x rows) * norm times m, when the
     * device holds those rows (x: their host address); else
     * JLM_EUNSUPPORTED and nothing done. */
    int (*block)(jlm_dev *d, struct jlm_engine *e, const struct jlm_prog *p, uint32_t l, const uint8_t *page,
                 float *xs, uint32_t n, void *kc, uint32_t pos0, jlm_err *err);
    int (*x_sync)(jlm_dev *d, jlm_err *err);
    void (*x_drop)(jlm_dev *d);   /* forgets the rows it holds (the host has new ones); ends a recording */
    int (*output)(jlm_dev *d, const float *norm, float eps, const jlm_k_mat *m, const float *x, uint32_t n,
                  uint32_t E, float *logits, jlm_err *err);
    /* Op-class timing (NULL: the host times the matmul calls, kernel_ns).
     * prof_on: on (1) zeroes the sums and times from now on, 0 stops; 0
     * done, JLM_EUNSUPPORTED when the device cannot time (n/a). prof_op:
     * the device's next commands are class cls (JLM_DEVP_MATMUL..NORM), until
     * the next prof_op; JLM_DEVP_XFER: they are no op's (not summed: an
     * executor says so after its last op, before the host waits); called
     * through jlm_dev_prof_op only while on. prof_get: the device time per
     * class since prof_on (ns[XFER] not filled), after the host has waited
     * for what was timed. */
    int  (*prof_on)(jlm_dev *d, int on);
    void (*prof_op)(jlm_dev *d, int cls);
    void (*prof_get)(jlm_dev *d, uint64_t ns[JLM_DEVP_N]);
    /* A sequence's device KV cache (each sequence's whole blocks keep theirs
     * on the device; kc: its host cache, the key): up 1 writes positions
     * [0, n) of every layer placed here from the host cache (kc, vc; made
     * if absent), 0 reads them back into it, -1 frees it (kc, vc unread).
     * Counted in activations up / down; a round trip a layer. NULL: none. */
    int (*kv_xfer)(jlm_dev *d, struct jlm_engine *e, void *kc, void *vc, uint32_t n, int up, jlm_err *err);
} jlm_dev_ops;

#define JLM_DEV_MULTI_MAX 3

struct jlm_dev {
    const jlm_dev_ops *ops;
    jlm_dframes        frames;
    int                pf_on;              /* a prefetch started and not yet got or ended */
    uint32_t           pf_array, pf_page;
    int                prof, prof_timed;   /* jlm_dev_profile on; the device times its ops */
    uint64_t           prof_k0, prof_x0;   /* kernel_ns, xfer_ns at the last jlm_dev_prof_reset */
};

void        jlm_dev_close(jlm_dev *d);   /* accepts NULL */
const char *jlm_dev_kind(const jlm_dev *d);
const char *jlm_dev_name(const jlm_dev *d);

/* Device frames' budget in bytes (0: unlimited); the budget 0 --gpu-budget means. */
void     jlm_dev_set_budget(jlm_dev *d, uint64_t budget);
uint64_t jlm_dev_default_budget(const jlm_dev *d);
/* The dense region (host memory, 4096-aligned, len a multiple of 4096, borrowed). */
void jlm_dev_set_dense(jlm_dev *d, const void *host, uint64_t len);

int  jlm_dev_page_get(jlm_dev *d, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len,
                      jlm_err *err);
void jlm_dev_page_put(jlm_dev *d, uint32_t array, uint32_t page);
/* Starts the page-in of the page a later jlm_dev_page_get will ask for (the
 * next block), so its copy overlaps the kernels before it: 1 if started,
 * then the caller keeps the host frame pinned until that get, or
 * jlm_dev_prefetch_end, returns. 0 if not started (the backend has no copy
 * thread, a prefetch is under way, the page is resident, or the budget has
 * no room without evicting a pinned frame). Never fails. */
int  jlm_dev_prefetch(jlm_dev *d, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len);
/* Ends a started prefetch that will not be got (waits for its copy to have
 * read the host frame; the frame stays resident if the copy succeeded).
 * Accepts NULL and no prefetch. */
void jlm_dev_prefetch_end(jlm_dev *d);
/* The host pager's evict hook (jlm_pager_evict_fn; ctx = the jlm_dev). */
void jlm_dev_host_evicted(void *ctx, uint32_t array, uint32_t page, void *frame);

/* y (n, rows) for n tokens; xq: n quantized tokens (quantized types), x:
 * (n, k) floats (float types). 0 on success; counts matmuls or fallbacks. */
int jlm_dev_matmul(jlm_dev *d, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq, float *y,
                   jlm_err *err);

/* jlm_dev_matmul of nm matrices sharing x / xq (Q, K, V; gate, up) in one
 * round trip to the device: 0 done; non-zero and nothing done when the
 * backend cannot (no such op, a plane in no frame, mixed float and
 * quantized): run them with jlm_dev_matmul. */
int jlm_dev_matmul_multi(jlm_dev *d, const jlm_k_mat *const *ms, int nm, uint32_t n, const float *x,
                         const jlm_act_q8 *xq, float *const *ys, jlm_err *err);

void jlm_dev_stats_get(const jlm_dev *d, jlm_dev_stats *out);
void jlm_dev_stats_reset(jlm_dev *d);

/* Profiling (the enum above). jlm_dev_profile turns it on or off (off:
 * nothing is timed, no query recorded); jlm_dev_prof_reset zeroes the sums;
 * jlm_dev_prof_get: the sums since then (XFER: the host's time in the
 * backend less the op classes, never below 0). Cannot fail: a device that
 * cannot time says so in timed. */
void jlm_dev_profile(jlm_dev *d, int on);
void jlm_dev_prof_reset(jlm_dev *d);
void jlm_dev_prof_get(jlm_dev *d, jlm_dev_prof *out);
/* The hook an executor of block programs calls at the start of each op's
 * commands (exec_vk.c): what it records next counts to class cls (of an op:
 * jlm_dev_op_class). Off, or a device that cannot time: nothing. */
static inline void jlm_dev_prof_op(jlm_dev *d, int cls)
{
    if (d->prof && d->prof_timed)
        d->ops->prof_op(d, cls);
}
int jlm_dev_op_class(int op_kind);   /* a jlm_op_kind's JLM_DEVP_* class */

#endif
