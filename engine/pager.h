/* pager.h - the engine's page cache: frames, one byte budget, eviction,
 * partial fill at Chunk granularity, statistics.
 *
 * Owns: every engine frame (4096-aligned heap memory holding one page of a
 * page array) and each page's filled-chunk bitmap. Knows page arrays only as
 * (base_off, page_size, n_pages, extent per page) descriptions, reads through
 * a jlm_source, and knows nothing of tensors, kernels or the container format
 * (jlm_pager_open_model in engine/model.h does the mapping).
 *
 * A page's lifecycle (SQLite pager.c style):
 *
 *                 get(off,len): frame taken, missing chunks read
 *      ABSENT ----------------------------------------> FILLING
 *        ^  ^                                            |   |
 *        |  |  read failed and no chunk of it filled      |   | all chunks of
 *        |  +--------------------------------------------+   | [off,len) read
 *        |                                                   v
 *        |   evict (unpinned only)             +---> RESIDENT, PINNED (pins > 0)
 *        +---------- RESIDENT, UNPINNED <------+        |   ^
 *                    (pins == 0, on the LRU    unpin to |   | get (hit, or a
 *                     list of its class)       pins = 0 v   | partial fill)
 *                                 ^--------------------------+
 *
 *   ABSENT     frame == NULL, no chunk filled, pins == 0, on no list.
 *   FILLING    inside jlm_pager_get, or while a prefetch's read is in
 *              flight (the page then holds one pin, the read's, until the
 *              engine thread collects it); a read error returns the page to
 *              RESIDENT with the chunks read before, or to ABSENT if none were.
 *   RESIDENT   frame != NULL; bitmap says which chunks hold the source's
 *              bytes (all of the page, or a part: a partial frame); a pinned
 *              page is on no list and is never a victim, not even in part,
 *              except for the chunks its one holder released
 *              (jlm_pager_advance: tensor-granular release).
 *
 * Partial frames: a frame is frame_len bytes of address space, but only the
 * page's filled chunks are charged to the budget (its held bytes) and only
 * they have memory behind them: chunks evicted from a page that stays
 * resident (a trim) are given back to the kernel (MADV_DONTNEED). Eviction
 * takes a block page's chunks from its end, so a block scanned whole keeps a
 * prefix; other subsets (gets of a part) are kept as the bitmap says.
 *
 * Invariants (jlm_pager_check verifies (1)-(5) and (8)):
 *  (1) resident_bytes == sum of held over pages; a page's held == the bytes
 *      of its filled chunks (the last cut at its extent, or for a one huge
 *      frame at the end of its huge pages), plus the bytes of the chunks a
 *      prefetch in flight is reading into it.
 *  (2) budget == 0 or resident_bytes <= budget.
 *  (3) frame == NULL implies no chunk filled, pins == 0 and held == 0.
 *  (4) A page is on its class's LRU list iff it has a frame and pins == 0;
 *      such a page has at least one chunk filled. A list's held is the sum
 *      of its pages' held (the room a read can make, in O(1)).
 *  (5) n_filled == popcount(bitmap); no bit at or past the page's chunk count.
 *  (6) A filled chunk holds exactly the source's bytes for that span (tests
 *      check this against the source content).
 *  (7) Eviction takes an unpinned EXPERT-class page, whole (the least
 *      recently used, or under jlm_pager_set_expert_policy's JLM_XP_LFU
 *      the lowest decaying count, under JLM_XP_NEXT the latest expected
 *      next use: engine/xpolicy.h); if there is none, chunks from the end of the BLOCK-
 *      class page holding the most chunks (ties: the most recently used),
 *      down to one below the next fullest: an unpinned page, or the page
 *      being advanced through (the most recent), from the end of its
 *      released chunks. Blocks are scanned cyclically every token: the
 *      pages level off, and a cycle reads (blocks - budget) plus what must
 *      be held at once beyond the levels: a whole page computed gives
 *      (blocks - budget) * N / (N - 1), N / (N - 2) with prefetch; a page
 *      advanced through op by op, the missing part of the largest two
 *      consecutive ops (docs/pager.md). With whole frames this is MRU; LRU
 *      would fault all N. "Used" = the last get or unpin.
 *  (8) No memory of a frame outside its filled chunks is mapped (mincore),
 *      so the process uses what the budget counts; not checked for the page
 *      a prefetch is reading into. A one huge frame (a page of one chunk
 *      whose last huge page is at least 3/4 full, mapped while the budget is
 *      unlimited or at least 3/8 of every page so, or at most 1/32 empty,
 *      at any budget) maps its huge page past
 *      the extent, and held counts it. While the budget holds every page
 *      with 2 MiB of slack each (unlimited, or that much), any frame whose
 *      last huge page is at least 3/4 full may map up to a quarter of one
 *      past its extent, uncharged; a budget lowered below that gives those
 *      tails back.
 *
 * Budget: 0 = unlimited. The caller sizes the minimum working set (the most
 * pages it pins at once) with jlm_pager_min_budget() and raises the budget to
 * it, saying so; a get that finds every resident page pinned with no room is a
 * caller bug and fails with JLM_ERANGE (the pager is left unchanged).
 *
 * Thread safety: one pager per engine; every jlm_pager_* call comes from one
 * thread (the engine thread) or is serialized by the caller. The source may
 * use other threads (a file source splits large reads across its I/O
 * threads, inside one call). With prefetch on, reader threads of the
 * pager's own (as many as the prefetch depth) each read one page into a
 * frame the engine thread gave it; at depth 1 the source is never called by
 * two threads at once (a get waits for the read in flight before reading),
 * above it the source must allow concurrent reads. The event callback runs synchronously
 * on the calling thread (a prefetched page's PAGE_IN when the engine thread
 * collects it).
 *
 * Prefetch (jlm_pager_prefetch): the page's missing chunks (all of an ABSENT
 * page, the rest of a partial one) are given room on the engine thread
 * (eviction per invariant 7, so never the page in use) and the page held with
 * one pin by the read in flight (it is FILLING: on no list, never a victim)
 * until the engine thread collects it: at the next get, prefetch,
 * set_budget or close. A prefetch that would need to evict a pinned page,
 * or that finds `depth` reads in flight, is skipped (counted); a failed one
 * leaves the page ABSENT and the get that follows reads it and reports.
 * Memory: the pager owns frames and bitmaps; pointers returned by get stay
 * valid until the matching unpin. The source is borrowed (must outlive it).
 */
#ifndef JLM_PAGER_H
#define JLM_PAGER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/source.h"
#include "base/jlm_err.h"

enum jlm_pager_class {
    JLM_PAGER_BLOCK = 0,    /* scanned cyclically: MRU victim (text, vision blocks) */
    JLM_PAGER_EXPERT = 1,   /* routed, reused by recency: LRU victim, evicted first */
};

#define JLM_PAGER_MAX_ARRAYS 8

typedef struct jlm_pager_array_desc {
    const char     *name;       /* "blocks", "vision", "experts": used in messages and events */
    int             cls;        /* enum jlm_pager_class */
    uint64_t        base_off;   /* source offset of page 0, 4096-aligned */
    uint64_t        page_size;  /* stride between pages, multiple of 4096 */
    uint32_t        n_pages;
    const uint64_t *extent;     /* (n_pages,) bytes used per page (multiple of 4096,
                                   <= page_size; copied); NULL: every page is page_size */
} jlm_pager_array_desc;

typedef struct jlm_pager_config {
    jlm_source *src;            /* borrowed */
    uint64_t    chunk;          /* fill granularity: power of two >= 4096 */
    uint64_t    budget;         /* bytes of frames; 0 = unlimited */
    uint32_t    n_arrays;       /* <= JLM_PAGER_MAX_ARRAYS; array index = position */
    const jlm_pager_array_desc *arrays;
} jlm_pager_config;

/* ---------------------------------------------------------------- events */
enum jlm_pager_ev_kind {
    JLM_PAGER_EV_PAGE_IN = 1,   /* ABSENT -> RESIDENT: bytes = bytes read */
    JLM_PAGER_EV_FILL = 2,      /* more chunks read into a resident page */
    JLM_PAGER_EV_HIT = 3,       /* served from the frame, nothing read */
    JLM_PAGER_EV_EVICT = 4,     /* RESIDENT -> ABSENT: bytes = the bytes it held last
                                   (a trim, chunks off a page that stays, has no event:
                                   the FILL that reads them again says so) */
};
typedef struct jlm_pager_event {
    int      kind;              /* enum jlm_pager_ev_kind */
    uint32_t array, page;
    const char *array_name;
    uint64_t bytes;
    int      tier;              /* enum jlm_tier: FRAME for hits, else the source's */
} jlm_pager_event;
typedef void (*jlm_pager_event_fn)(void *ctx, const jlm_pager_event *ev);

/* ---------------------------------------------------------------- stats */
typedef struct jlm_pager_array_counters {
    uint64_t page_ins;          /* ABSENT -> RESIDENT transitions */
    uint64_t fills;             /* partial fills of a resident page */
    uint64_t evictions;         /* RESIDENT -> ABSENT */
    uint64_t hits;              /* gets that read nothing */
    uint64_t reads;             /* source reads (one per coalesced run of chunks) */
    uint64_t bytes_read;
    uint64_t read_ns;           /* wall time spent waiting in source reads */
    /* prefetch (reads and bytes of prefetches are in reads/bytes_read/page_ins) */
    uint64_t pf_issued;         /* page reads started on the reader thread */
    uint64_t pf_hits;           /* gets whose page a finished prefetch had read */
    uint64_t pf_waits;          /* gets that waited for their page's prefetch */
    uint64_t pf_wait_ns;        /* time those gets waited */
    uint64_t pf_misses;         /* gets that read themselves while prefetch is on */
    uint64_t pf_unused;         /* prefetched pages evicted before any get */
    uint64_t pf_skipped;        /* prefetch calls not issued: no room, read in flight */
    uint64_t pf_failed;         /* prefetch reads that failed (the get reads again) */
    uint32_t resident_pages;    /* pages holding a frame (all or part of the page) */
    uint64_t resident_bytes;    /* bytes held: filled chunks (+ a prefetch in flight) */
    uint64_t trims;             /* chunks evicted from a page that stayed resident */
} jlm_pager_array_counters;

typedef struct jlm_pager_counters {
    uint64_t budget, resident_bytes, peak_bytes;
    uint32_t n_arrays;
    jlm_pager_array_counters a[JLM_PAGER_MAX_ARRAYS];
} jlm_pager_counters;

typedef struct jlm_pager jlm_pager;

/* ---------------------------------------------------------------- open / close */
/* Validates the configuration (chunk a power of two >= 4096; each array's
 * base aligned, page_size a nonzero multiple of 4096, extents multiples of
 * 4096 and <= page_size, the whole array inside the source, no overflow).
 * JLM_EINVAL naming the array and the bound, or JLM_ENOMEM; *out untouched. */
int  jlm_pager_open(const jlm_pager_config *cfg, jlm_pager **out, jlm_err *err);
/* Frees every frame (pinned or not) and the pager; accepts NULL. */
void jlm_pager_close(jlm_pager *p);

/* The transparent huge page size when THP may be used (enabled is "always"
 * or "madvise", a power of two from 4 KiB to 32 MiB), else 0. Read once from
 * /sys/kernel/mm/transparent_hugepage. When a pager's chunk is a multiple of
 * it, frames start on huge page boundaries and are huge pages up to the
 * page's extent at any budget (a trim, a move or an eviction takes whole huge
 * pages); otherwise only while the budget can hold every page. */
uint64_t jlm_pager_thp_size(void);
/* The chunk the engine gives its pager for a container whose chunk is
 * `chunk`: jlm_pager_thp_size() when that is larger, else chunk. Cannot
 * fail. */
uint64_t jlm_pager_chunk_for(uint64_t chunk);

/* ---------------------------------------------------------------- configure */
/* Bytes of the smallest budget that lets n_pinned[a] whole pages of each
 * array be pinned at once (sum of n_pinned[a] * frame_len(a), or its huge
 * pages' length where that is a one huge frame). Cannot fail. */
uint64_t jlm_pager_min_budget(const jlm_pager *p, const uint32_t *n_pinned);
/* Sets the budget (0 = unlimited), evicting unpinned pages and chunks
 * (invariant 7 order) until resident bytes fit. JLM_ERANGE if the bytes the
 * pinned pages hold exceed it (budget unchanged then). */
int  jlm_pager_set_budget(jlm_pager *p, uint64_t budget, jlm_err *err);
/* Which unpinned expert page is evicted first (enum jlm_xpolicy,
 * engine/xpolicy.h; anything else is JLM_XP_LRU, the default at open), and
 * for JLM_XP_LFU and JLM_XP_NEXT the half-life of the counts in expert gets
 * (<= 0: 1); JLM_XP_AUTO chooses its own (engine/xadapt.h; LFU's from there
 * on if its shadows cannot be allocated at the first get). Cannot fail. */
void jlm_pager_set_expert_policy(jlm_pager *p, int policy, double half_life);
int  jlm_pager_expert_policy(const jlm_pager *p);
/* The expert counts' half-life in force, in tokens (expert gets over
 * jlm_pager_set_expert_blocks' gets a token): JLM_XP_AUTO's current pick,
 * the fixed one of LFU and NEXT; 0 under LRU. */
double jlm_pager_expert_half_life(const jlm_pager *p);
/* JLM_XP_NEXT's cycle: the expert array's pages are MoE blocks of
 * per_block pages each in run order (page / per_block is the block), and a
 * token gets used_per_block of each block's. per_block 0, or one that does
 * not divide the expert pages: no cycle (every block one step away), the
 * default at open (with one get a token). Cannot fail. */
void jlm_pager_set_expert_blocks(jlm_pager *p, uint32_t per_block, uint32_t used_per_block);
/* Subscribes fn to events (NULL unsubscribes). Cannot fail. */
void jlm_pager_set_events(jlm_pager *p, jlm_pager_event_fn fn, void *ctx);

/* Called with a page's frame just before any of the frame's memory changes:
 * a trim (chunks given back to the kernel, or moved into the frame being
 * filled), an eviction (the frame unmapped), a failed fill's chunks released.
 * A user of the frame's memory (the Vulkan backend's zero-copy import) lets
 * go of it first and imports the page again when it next needs it.
 * One subscriber (NULL unsubscribes); separate from the events so
 * jlm_pager_set_events' user is not displaced. Cannot fail. */
typedef void (*jlm_pager_evict_fn)(void *ctx, uint32_t array, uint32_t page, void *frame);
void jlm_pager_set_evict_hook(jlm_pager *p, jlm_pager_evict_fn fn, void *ctx);

/* ---------------------------------------------------------------- get / unpin */
/* Pins page `page` of array `array` and guarantees [off, off+len) of it holds
 * the source's bytes: only missing chunks are read, adjacent missing chunks
 * coalesced into one read. *ptr = frame + off. Every successful get must be
 * matched by one jlm_pager_unpin. Errors: JLM_EINVAL (array/page out of range,
 * [off,len) past the page's extent), JLM_ERANGE (no room: every resident page
 * pinned), JLM_ENOMEM, or the source's code (JLM_EIO...) with the message
 * prefixed by "array page N"; then nothing is pinned, *ptr is untouched and
 * the pager is consistent (chunks read before the failure stay filled). A
 * failed get is not free of effects: unpinned pages evicted to make room for
 * the frame (before JLM_ERANGE was known, or before the read failed) stay
 * evicted. */
int  jlm_pager_get(jlm_pager *p, uint32_t array, uint32_t page, uint64_t off, uint64_t len,
                   const void **ptr, jlm_err *err);
/* Tensor-granular release: the one holder of page `page`'s pin (a get of any
 * part of it) is done with every byte before `off` and needs [off, off+len)
 * next. The chunks wholly before off become released: while the page stays
 * pinned they may be trimmed (invariant 7) like an unpinned page's, to make
 * room for this page's next bytes or any other page's; the rest of the page
 * stays pinned. Then the missing chunks of [off, off+len) are read (a FILL;
 * the pointer from the get stays valid: frame + off). A later get of the
 * page (a second holder) cancels the release; at most one page is advanced
 * through at a time (advancing another one while it is pinned releases
 * nothing there); unpin ends it. Errors as jlm_pager_get (JLM_EINVAL also
 * for a page not pinned); nothing is pinned or unpinned by it. */
int  jlm_pager_advance(jlm_pager *p, uint32_t array, uint32_t page, uint64_t off, uint64_t len, jlm_err *err);
/* Releases one pin; at zero the page becomes the most recently used of its
 * class. Unpinning a page that is not pinned is a caller bug (assert). */
void jlm_pager_unpin(jlm_pager *p, uint32_t array, uint32_t page);

/* ---------------------------------------------------------------- prefetch */
/* Turns prefetch on (1) or off (0; the default). Off waits for a read in
 * flight and collects it. Cannot fail. */
void jlm_pager_set_prefetch(jlm_pager *p, int on);
/* Pages read at once by prefetches (1, the default, to 16; clamped), each
 * on a reader thread of its own (started on first use). Above 1 the source's
 * read() is called from several threads at once (the file and mem sources
 * allow it; the fault source does not) and a get that reads does not wait
 * for the other pages' reads; a get that finds no room because reads in
 * flight pin their pages waits for them. Cannot fail. */
void jlm_pager_set_prefetch_depth(jlm_pager *p, uint32_t depth);
/* Starts reading the missing chunks of page `page` of `array` on a reader
 * thread, if prefetch is on, the page is not pinned and misses chunks, fewer
 * than `depth` prefetches are in flight, and the budget has room for them once the
 * other unpinned pages are evicted (invariant 7 order). Never
 * fails: a prefetch not issued is counted in pf_skipped; out of range is
 * ignored. The next get of that page waits for it if unfinished. Returns 1
 * when a read was started, 0 when there is nothing to read (resident in
 * full, pinned, on its way, prefetch off, out of range), -1 when skipped. */
int  jlm_pager_prefetch(jlm_pager *p, uint32_t array, uint32_t page);
/* The same as a background read (the engine's cold start): the page, once
 * read, is not protected as a page read ahead is (taken only when nothing
 * else is left) but placed as the least recently used, so pages a get uses
 * evict it before each other. Returns as jlm_pager_prefetch. */
int  jlm_pager_prefetch_low(jlm_pager *p, uint32_t array, uint32_t page);
/* The same for the missing chunks of bytes [off, off+len) of the page only;
 * also into the page advanced through (jlm_pager_advance), pinned by its one
 * holder, for bytes it will advance to (the next jlm_pager_advance of the
 * page waits for the read). Returns as jlm_pager_prefetch (0 also for a
 * range past the extent or empty). */
int  jlm_pager_prefetch_range(jlm_pager *p, uint32_t array, uint32_t page, uint64_t off, uint64_t len);

/* ---------------------------------------------------------------- query */
/* Bytes of the page currently filled (0 when absent). Cannot fail. */
uint64_t jlm_pager_filled(const jlm_pager *p, uint32_t array, uint32_t page);
/* 1 if the page holds a frame (all of it or a part). Cannot fail. */
int  jlm_pager_resident(const jlm_pager *p, uint32_t array, uint32_t page);
/* Bytes of every page of every array (their extents summed). Cannot fail. */
uint64_t jlm_pager_bytes(const jlm_pager *p);
/* Bytes of page `page` a reader uses (its extent); 0 out of range. Cannot fail. */
uint64_t jlm_pager_extent(const jlm_pager *p, uint32_t array, uint32_t page);
/* Bytes the page is charged when whole: its extent, or the length of its huge
 * pages where it has (or, absent, would be mapped now) a one huge frame
 * (invariant 8). 0 when out of range. */
uint64_t jlm_pager_charge(const jlm_pager *p, uint32_t array, uint32_t page);
/* Frame bytes one page of the array takes (its largest extent). */
uint64_t jlm_pager_frame_len(const jlm_pager *p, uint32_t array);
/* Copies the counters. Cannot fail. */
void jlm_pager_stats(const jlm_pager *p, jlm_pager_counters *out);
/* Zeroes the counters (not the residency). Cannot fail. */
void jlm_pager_stats_reset(jlm_pager *p);

/* ---------------------------------------------------------------- testing */
/* Verifies invariants (1)-(5) and (8). 0, or JLM_EINVAL with the first
 * broken invariant in err. */
int  jlm_pager_check(const jlm_pager *p, jlm_err *err);

#endif
