/* pager_int.h - the pager's records, shared by pager.c (frames, budget,
 * eviction, fill, prefetch, get/unpin) and pager_check.c (the queries and
 * the invariant check). Internal to engine/: nothing outside includes it. */
#ifndef JLM_ENGINE_PAGER_INT_H
#define JLM_ENGINE_PAGER_INT_H

#include "engine/pager.h"

#include <pthread.h>

#include "engine/lru.h"
#include "engine/xadapt.h"
#include "engine/xpolicy.h"

#define PAGER_ALIGN 4096u

/* ---------------------------------------------------------------- types */
typedef struct ppage {
    uint8_t      *frame;      /* NULL when ABSENT */
    uint64_t     *bits;       /* (words,) filled chunks, into parray.bitmap */
    uint32_t      pins;       /* gets not yet unpinned */
    uint32_t      n_filled;   /* popcount(bits) */
    uint64_t      held;       /* bytes charged: filled chunks (+ a prefetch's in flight) */
    struct ppage *prev, *next;/* class list links (unpinned resident only) */
    uint32_t      array, idx;
    int           pf_fresh;   /* read by a prefetch, no get since */
    uint8_t       pf_low;     /* the last prefetch of the page was a background read
                                 (jlm_pager_prefetch_low): while pf_fresh, not kept */
    uint8_t       pf_in;      /* 1 + the slot reading it; 0: none */
    uint8_t       huge;       /* its frame is one huge frame (jlm_pg_want_huge when
                                 it was mapped): its chunk charged as chunk_top */
    uint64_t      rel;        /* pinned by one holder that advances (jlm_pager_advance):
                                 chunks [0, rel) are released, trimmable though pinned; else 0 */
    double        xp_key;     /* expert pages: the decaying count's key (engine/xpolicy.h) */
} ppage;

typedef struct parray {
    char      name[32];
    int       cls;            /* enum jlm_pager_class */
    uint64_t  base_off, page_size;
    uint64_t  frame_len;      /* bytes of one frame: the largest extent (>= 4096) */
    uint64_t  map_len;        /* bytes of a frame's mapping: frame_len, rounded up to
                                 whole huge pages where chunks are (p->thp) */
    uint32_t  n_pages;
    uint32_t  words;          /* bitmap words per page */
    uint64_t *extent;         /* (n_pages,) */
    uint64_t *bitmap;         /* (n_pages * words,) */
    ppage    *pages;          /* (n_pages,) */
    jlm_pager_array_counters st;
} parray;

/* A class list; held: its pages' held bytes, summed (jlm_pg_room_for). */
typedef struct plist { ppage *head, *tail; uint32_t n; uint64_t held; } plist;

/* The reader threads and their requests, one a slot: the runs of missing
 * chunks of one page. Up to `depth` slots are in use (pages read at once),
 * read by as many threads. state under mu; the engine thread fills a slot
 * (state QUEUED) only while it is IDLE, a reader takes it (READING) and
 * marks it DONE; the engine thread collects it (IDLE again). An engine
 * thread that must wait for a slot no reader has taken yet takes it itself
 * (pf_collect_slot). */
#define PF_SLOTS 16
enum { PF_IDLE = 0, PF_QUEUED, PF_READING, PF_DONE };
typedef struct pfrun { uint64_t c0, c1, lo, hi; } pfrun;   /* chunks [c0,c1), frame bytes [lo,hi) */
typedef struct pfslot {
    struct ppage   *pg;       /* engine thread: the page read, NULL when free */
    int             state;
    uint64_t        base;     /* source offset of the page */
    pfrun          *runs;     /* (cap,) */
    uint32_t        n_runs;
    uint64_t        len;      /* bytes of all runs, as charged (chunk_top) */
    uint64_t        rlen;     /* bytes of all runs, as read (chunk_hi) */
    int             was_absent;
    uint8_t        *dst;      /* the frame the engine thread gave */
    int             rc;
    jlm_err         err;
} pfslot;
typedef struct pfetch {
    pthread_mutex_t mu;
    pthread_cond_t  cv;       /* a slot was queued, or stop (the readers wait here) */
    pthread_cond_t  done;     /* a read finished (the engine thread waits here) */
    pthread_t       th[PF_SLOTS];
    uint32_t        n_threads, depth, cap, busy;   /* busy: slots in use (engine thread) */
    int             stop;
    int             no_threads;   /* JLM_PAGER_NO_THREADS=1 at creation: start no reader thread */
    pfslot          slot[PF_SLOTS];
} pfetch;

struct jlm_pager {
    /* configuration */
    jlm_source *src;          /* borrowed */
    uint64_t    chunk;
    uint32_t    chunk_shift;
    uint32_t    n_arrays;
    parray      arr[JLM_PAGER_MAX_ARRAYS];
    jlm_pager_event_fn ev_fn;
    void       *ev_ctx;
    jlm_pager_evict_fn evict_fn;   /* a frame's memory is about to change */
    void       *evict_ctx;

    /* changes during routine operation */
    uint64_t    budget;       /* 0 = unlimited */
    uint64_t    resident_bytes, peak_bytes;
    uint64_t    huge_need;    /* the budget from which frames use huge pages */
    uint64_t    huge_all;     /* every page's bytes with one huge frames (jlm_pg_want_huge) */
    uint64_t    all_bytes;    /* every page's extent, summed (jlm_pager_bytes) */
    uint64_t    thp;          /* chunks are whole transparent huge pages of this
                                 size (0: no, chunks are smaller or THP is off) */
    plist       lru[2];       /* per class; head = most recently used */
    int         xp;           /* the expert victim policy (enum jlm_xpolicy) */
    jlm_xadapt *xa;           /* JLM_XP_AUTO: the shadows choosing the half-life (made at the first get) */
    double      xp_half;      /* JLM_XP_LFU, _NEXT: expert gets in a count's half-life */
    uint64_t    xp_clock;     /* expert gets so far */
    uint32_t    xp_per_block; /* JLM_XP_NEXT: expert pages a MoE block (0: unknown, no cycle) */
    uint32_t    xp_blocks;    /* JLM_XP_NEXT: MoE blocks (expert pages / xp_per_block) */
    double      xp_gets;      /* JLM_XP_NEXT: expert gets a token (the window's step) */
    uint32_t    xp_cur;       /* JLM_XP_NEXT: the expert page last gotten or being read */
    ppage      *adv;          /* the pinned page with released chunks (rel > 0), or NULL */

    /* prefetch: on, and the reads in flight or uncollected (slots' pg:
     * engine thread only; the reader threads see the rest of pf) */
    int         pf_on;
    pfrun      *pf_runs;      /* (PF_SLOTS * pf.cap,): the slots' runs */
    pfetch      pf;
};

/* ---------------------------------------------------------------- chunks */
static inline int bit_get(const ppage *pg, uint64_t c) { return (int)((pg->bits[c >> 6] >> (c & 63)) & 1u); }
static inline void bit_set(ppage *pg, uint64_t c) { pg->bits[c >> 6] |= 1ull << (c & 63); }
static inline void bit_clear(ppage *pg, uint64_t c) { pg->bits[c >> 6] &= ~(1ull << (c & 63)); }

/* Chunks of the page (the last one cut at its extent). */
static inline uint64_t page_chunks(const jlm_pager *p, const parray *r, const ppage *pg)
{
    return (r->extent[pg->idx] + p->chunk - 1) >> p->chunk_shift;
}

/* Frame bytes [lo, hi) of chunks [c0, c1) (cut at the extent). */
static inline uint64_t chunk_lo(const jlm_pager *p, uint64_t c) { return c << p->chunk_shift; }
static inline uint64_t chunk_hi(const jlm_pager *p, const parray *r, const ppage *pg, uint64_t c1)
{
    uint64_t hi = c1 << p->chunk_shift, ext = r->extent[pg->idx];
    return hi > ext ? ext : hi;
}

/* Whether pg is on its class's list (invariant (4): unpinned and resident). */
static inline int jlm_pg_listed(const jlm_pager *p, const ppage *pg)
{
    return pg->prev || pg->next || p->lru[p->arr[pg->array].cls].head == pg;
}

/* The budget holds every page of every array with a huge page's slack each
 * (unlimited, or huge_need): nothing is evicted. */
static inline int jlm_pg_fits(const jlm_pager *p) { return p->budget == 0 || p->budget >= p->huge_need; }

/* With huge-page chunks, a page of `extent` bytes whose last huge page would
 * be at least 3/4 full: rounded up to huge pages it maps at most a quarter
 * of one more than it holds (a MoE's 1.7-2 MB expert pages; not a small
 * model's 100 KB blocks, 20 times their size). */
static inline int jlm_pg_tail_full(const jlm_pager *p, uint64_t extent)
{
    uint64_t tail = p->thp ? extent & (p->thp - 1) : 0;
    return tail && tail >= p->thp / 4 * 3;
}

/* n rounded up to whole huge pages (p->thp nonzero). */
static inline uint64_t jlm_pg_huge_end(const jlm_pager *p, uint64_t n) { return (n + p->thp - 1) & ~(p->thp - 1); }

/* Such a page of one chunk: a MoE's experts (docs/pager.md, Whole huge frames). */
static inline int jlm_pg_one_huge(const jlm_pager *p, uint64_t extent)
{
    return jlm_pg_tail_full(p, extent) && extent <= p->chunk;
}

/* Such a page whose huge pages it would leave at most 1/32 empty (moe-1g's
 * 2,048,000-byte experts: 49,152 bytes of 2 MiB). */
static inline int jlm_pg_near_full(const jlm_pager *p, uint64_t extent)
{
    return jlm_pg_one_huge(p, extent) && jlm_pg_huge_end(p, extent) - extent <= jlm_pg_huge_end(p, extent) / 32;
}

/* A frame mapped now for a page of `extent` bytes is one huge frame: huge
 * pages whole and charged for them (chunk_top), when the page is one-huge
 * and the budget is unlimited or at least 3/8 of huge_all, or at any budget
 * when it is near full. Below 3/8 the 1/8-1/9 more expert pages that exact
 * frames hold cost fewer reads than the huge pages save: on moe-1g's routing
 * traces a 9% smaller cache read 51-58% more at a quarter of the experts,
 * under 5% more from 0.41 up; a near-full page's frame holds at most 1/32
 * more, and its read into huge pages takes 0.35-0.5 ms against ~0.7 (docs/pager.md,
 * One huge frames under a budget). */
static inline int jlm_pg_want_huge(const jlm_pager *p, uint64_t extent)
{
    return jlm_pg_one_huge(p, extent) &&
           (p->budget == 0 || p->budget >= p->huge_all / 8 * 3 || jlm_pg_near_full(p, extent));
}

/* The end of the frame bytes chunks [.., c1) charge and give back: chunk_hi,
 * but for the chunk of a one huge frame (pg->huge; an absent page: the frame
 * it would be mapped now) the end of its huge pages. Its read still ends at
 * chunk_hi, the extent. */
static inline uint64_t chunk_top(const jlm_pager *p, const parray *r, const ppage *pg, uint64_t c1)
{
    uint64_t hi = chunk_hi(p, r, pg, c1), ext = r->extent[pg->idx];
    int huge = pg->frame ? pg->huge : jlm_pg_want_huge(p, ext);
    return hi == ext && huge ? jlm_pg_huge_end(p, ext) : hi;
}

/* A frame of a page of `extent` bytes is huge pages whole, its tail past the
 * extent included (invariant 8's exception, uncharged: huge_need counts it),
 * while the budget holds everything, where jlm_pg_tail_full. */
static inline int jlm_pg_whole_huge(const jlm_pager *p, uint64_t extent)
{
    return jlm_pg_tail_full(p, extent) && jlm_pg_fits(p);
}

/* pg's frame maps huge pages whole, its tail past the extent included: a one
 * huge frame (ppage.huge, charged), or jlm_pg_whole_huge (uncharged). */
static inline int jlm_pg_frame_whole(const jlm_pager *p, const parray *r, const ppage *pg)
{
    return pg->huge || jlm_pg_whole_huge(p, r->extent[pg->idx]);
}

/* Bytes the budget can give pg: free bytes plus every other unpinned page's
 * (pager_check.c). */
uint64_t jlm_pg_room_for(const jlm_pager *p, const ppage *pg);

/* ---------------------------------------------------------------- configuration (pager_conf.c) */
/* Array a of cfg checked (JLM_EINVAL naming it and the bound); its frame
 * length (the largest extent, >= 4096) in *frame_len. */
int    jlm_pgc_check_desc(const jlm_pager_config *cfg, uint32_t a, uint64_t *frame_len, jlm_err *err);
/* p->arr[a]'s records from d (JLM_ENOMEM). */
int    jlm_pgc_init_array(jlm_pager *p, const jlm_pager_array_desc *d, uint32_t a, uint64_t frame_len, jlm_err *err);

/* Bytes of the chunks of [c0, c1) not filled. */
static inline uint64_t missing_bytes(const jlm_pager *p, const parray *r, const ppage *pg, uint64_t c0, uint64_t c1)
{
    uint64_t n = 0;
    for (uint64_t c = c0; c < c1; c++)
        if (!bit_get(pg, c))
            n += chunk_top(p, r, pg, c + 1) - chunk_lo(p, c);
    return n;
}

/* 1 if a chunk of [c0, c1) is not filled. */
static inline int missing(const ppage *pg, uint64_t c0, uint64_t c1)
{
    for (uint64_t c = c0; c < c1; c++)
        if (!bit_get(pg, c))
            return 1;
    return 0;
}

/* ---------------------------------------------------------------- reader threads (pager_read.c) */
/* The pages of [q, q + n) populated for writing before a read fills them. */
void    jlm_pgr_prefault(uint8_t *q, uint64_t n);
/* Reads slot s's runs into its frame (s READING, taken by this thread):
 * 0, or the first failed read's error. */
int     jlm_pgr_run(jlm_pager *p, const pfslot *s, jlm_err *err);
/* A free prefetch slot with a reader thread for it (started here), or NULL;
 * with no thread at all prefetch turns off (p->pf_on = 0). */
pfslot *jlm_pgr_free_slot(jlm_pager *p);

/* ---------------------------------------------------------------- expert policy (pager_policy.c) */
/* A get of pg (an expert page's decaying count; other classes: nothing). */
void   jlm_pgp_touch(jlm_pager *p, ppage *pg);
/* The unpinned expert page to evict first under the policy (never skip);
 * NULL when there is none. */
ppage *jlm_pgp_expert_victim(jlm_pager *p, const ppage *skip);

#endif
