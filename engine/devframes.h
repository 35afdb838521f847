/* devframes.h - device page frames under the pager's policy, shared by the
 * engine's device backends (backend_vk.c, backend_cu.c).
 *
 * Owns: one record per (array, page) a backend has seen, the pin list, the
 * device-resident byte count against a budget, and the recency lists of
 * engine/lru.h (LRU experts first, else the MRU block). It does not own
 * device memory: a backend's page_in callback makes a record resident (fills
 * buf) and its drop callback releases it. Device frames follow the host
 * pager's pages: the graph pins a page on the host, then here, and unpins in
 * the reverse order; a page resident here is not transferred again while it
 * stays resident.
 *
 * An "aliased" frame is the host frame itself seen by the device (Vulkan's
 * import path): the host pager's evict hook (jlm_dframes_host_evicted) drops
 * it before the host memory changes, so aliased residency is a subset of host
 * residency. A copied frame stays valid whatever the host does.
 *
 * The dense region (output matrix, tied embeddings) is one more record, made
 * resident on first use and kept, outside the budget (as the host's).
 *
 * Failure: jlm_dframes_get fails with JLM_ERANGE when pinned frames fill the
 * budget (a caller bug: the engine raises the budget to one block plus the
 * routed experts), JLM_ENOMEM, or the page_in callback's error. Not
 * thread-safe: the graph calls it from its one thread. */
#ifndef JLM_ENGINE_DEVFRAMES_H
#define JLM_ENGINE_DEVFRAMES_H

#include <stdint.h>

#include "base/jlm_err.h"
#include "engine/lru.h"

#define JLM_DF_ARRAYS 8
#define JLM_DF_PIN_MAX 300   /* one block + the routed experts (<= 256) + dense */

typedef struct jlm_dframe {
    jlm_lru_node   ln;        /* first: class list links (unpinned resident only) */
    void          *buf;       /* the backend's device memory; NULL: not resident */
    const uint8_t *host;      /* the host frame it mirrors (aliased: is) */
    uint64_t       len;
    uint32_t       pins;
    int            cls;
    int            aliased;   /* set by page_in: buf is the host frame's memory */
    uint64_t       tag;       /* the backend's (e.g. the copy's completion event) */
} jlm_dframe;

typedef struct jlm_dframes_ops {
    /* Makes d resident: d->buf (and d->aliased) set, 0; or an error, d->buf NULL. */
    int  (*page_in)(void *ctx, jlm_dframe *d, const void *host, uint64_t len, jlm_err *err);
    void (*drop)(void *ctx, jlm_dframe *d);   /* releases d->buf */
} jlm_dframes_ops;

typedef struct jlm_dframes {
    const jlm_dframes_ops *ops;
    void        *ctx;
    const char  *who;            /* "vulkan backend": messages */
    uint64_t     budget, resident, peak;
    uint64_t     page_ins, hits, evictions, frames;
    uint64_t     prefetches;     /* page-ins started ahead of their get */
    int          async;          /* set around a prefetch's page_in: the copy may finish later */
    jlm_lru      lru[2];
    jlm_dframe **tab[JLM_DF_ARRAYS];   /* records allocated one by one: list links stay valid */
    uint32_t     ntab[JLM_DF_ARRAYS];
    jlm_dframe  *pinned[JLM_DF_PIN_MAX];
    uint32_t     npinned;
    uint64_t     pinned_bytes;   /* resident bytes of frames with a pin (the rest are in lru) */
    jlm_dframe   dense;
} jlm_dframes;

void jlm_dframes_init(jlm_dframes *f, const jlm_dframes_ops *ops, void *ctx, const char *who);
void jlm_dframes_free(jlm_dframes *f);   /* drops every frame */

/* Budget in bytes (0: unlimited), evicting unpinned frames until they fit. */
void jlm_dframes_set_budget(jlm_dframes *f, uint64_t budget);
/* host: 4096-aligned, borrowed for the frames' life. */
void jlm_dframes_set_dense(jlm_dframes *f, const void *host, uint64_t len);

/* Pins page `page` of array `array` (class cls 0/1, enum jlm_pager_class),
 * len bytes mirroring host (pinned on the host by the caller). */
int  jlm_dframes_get(jlm_dframes *f, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len,
                     jlm_err *err);
void jlm_dframes_put(jlm_dframes *f, uint32_t array, uint32_t page);
/* Starts the page-in of a page ahead of its get: made resident (with
 * f->async set during the page_in callback, so a backend may only queue the
 * copy) and pinned once, for the caller to put when the copy is known to be
 * done. Room comes from unpinned frames only, in the pager's victim order.
 * 1 if started; 0 if not (resident already, no room, or the page-in failed:
 * never an error, the get will page it in). */
int  jlm_dframes_prefetch(jlm_dframes *f, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len);
/* Evicts the page if it is resident and unpinned (a page-in found bad). */
void jlm_dframes_discard(jlm_dframes *f, uint32_t array, uint32_t page);
/* The host pager's evict hook body: drops the aliased frame of that host frame. */
void jlm_dframes_host_evicted(jlm_dframes *f, uint32_t array, uint32_t page, const void *frame);

/* The pinned frame (or the dense region, made resident here) holding host
 * bytes [p, p+n); NULL if none (or the dense page-in failed: err set). */
jlm_dframe *jlm_dframes_frame_of(jlm_dframes *f, const void *p, uint64_t n, jlm_err *err);

#endif
