/* pager.c - engine frames, budget, eviction and partial fill (see pager.h for
 * the lifecycle diagram and the numbered invariants this file keeps).
 *
 * Data structures. Each array has a table of page records (allocated once at
 * open, so pointers to them are stable) and one bitmap block holding `words`
 * u64 per page. Each eviction class has one doubly linked list of the
 * resident unpinned pages, most recently used at the head: the expert victim
 * is the tail (LRU, O(1)); the block victim is the fullest page, ties to the
 * most recent (a scan of the block list: a model has tens of blocks).
 *
 * Partial frames. A frame is an anonymous mapping of frame_len bytes, but only
 * its filled chunks are charged to the budget (a page's `held`): the chunks
 * evicted from a page that stays resident are given back to the kernel with
 * MADV_DONTNEED, so the memory a frame really uses is its held bytes
 * (invariant 8). A scan of blocks keeps every block partly resident at about
 * the same level instead of a whole-frame number of them. Chunks evicted to
 * make room for a read move (mremap) into the reader's frame at the same
 * offsets when it reads those chunks, so memory changes frames without page
 * faults (drop_run; MREMAP_DONTUNMAP, so the frame it leaves keeps no hole).
 *
 * Huge pages. When the chunk is a multiple of the transparent huge page
 * size (the engine asks for that where THP is on: jlm_pager_chunk_for),
 * frames are mapped on a huge page boundary and MADV_HUGEPAGE up to the
 * page's extent rounded down (the tail stays in small pages), at any budget:
 * every chunk is whole huge pages, so a trim, a move (mremap of whole PMDs)
 * or an eviction takes whole ones, and a read pins and fills 2 MiB folios
 * instead of 512 small pages (under a budget decode 1.5-2.1x: docs/pager.md).
 * A page of one chunk whose last huge page would be at least 3/4 full (a
 * MoE's expert of 1.7-2 MB) gets a one huge frame, its tail included and
 * charged (ppage.huge, chunk_top), where the budget is unlimited or at least
 * 3/8 of every page so, or at any budget where it leaves at most 1/32 of its
 * huge pages empty (jlm_pg_want_huge): one huge page instead of ~450
 * small ones, which a VM that shadows page tables charges ~10 us of first
 * touch each, and fewer TLB misses. Other such pages are whole, their tails
 * uncharged, while the budget holds everything (jlm_pg_fits: at least their
 * extents plus 2 MiB a page; jlm_pg_whole_huge; map_len: frame_len rounded up
 * to huge pages). With smaller chunks (a pager opened directly, THP off) the
 * same budget makes frames MADV_HUGEPAGE (pp128 and tg64 1.05x), otherwise
 * MADV_NOHUGEPAGE: a huge page would map, and charge to the cgroup, 2 MiB
 * around one chunk of a partial frame. A budget lowered below that later
 * gives every other mapped frame the advice of its new budget and gives back
 * its memory past the extent (frame_fit); huge pages already there are split
 * by the kernel.
 */
#include "engine/pager_int.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define HUGE_SLACK (2ull << 20)   /* the most a huge page maps past an extent */

/* types: engine/pager_int.h */

/* ---------------------------------------------------------------- lists */
static void list_unlink(plist *l, ppage *pg)
{
    if (pg->prev) pg->prev->next = pg->next; else l->head = pg->next;
    if (pg->next) pg->next->prev = pg->prev; else l->tail = pg->prev;
    pg->prev = pg->next = NULL;
    l->n--;
    l->held -= pg->held;
}

static void list_push_head(plist *l, ppage *pg)
{
    pg->prev = NULL;
    pg->next = l->head;
    if (l->head) l->head->prev = pg; else l->tail = pg;
    l->head = pg;
    l->n++;
    l->held += pg->held;
}

static void list_push_tail(plist *l, ppage *pg)
{
    pg->next = NULL;
    pg->prev = l->tail;
    if (l->tail) l->tail->next = pg; else l->head = pg;
    l->tail = pg;
    l->n++;
    l->held += pg->held;
}

static plist *class_list(jlm_pager *p, const ppage *pg)
{
    return &p->lru[p->arr[pg->array].cls];
}

/* ---------------------------------------------------------------- events, time */
static void emit(jlm_pager *p, int kind, const ppage *pg, uint64_t bytes, int tier)
{
    if (!p->ev_fn)
        return;
    jlm_pager_event ev = { .kind = kind, .array = pg->array, .page = pg->idx,
                           .array_name = p->arr[pg->array].name, .bytes = bytes, .tier = tier };
    p->ev_fn(p->ev_ctx, &ev);
}

/* A frame's memory is about to be released, trimmed, moved or unmapped: the
 * evict hook's user (the Vulkan backend's zero-copy import of the frame) lets
 * go of it first, and imports the page again at its next use. */
static void host_changing(jlm_pager *p, const ppage *pg)
{
    if (p->evict_fn && pg->frame)
        p->evict_fn(p->evict_ctx, pg->array, pg->idx, pg->frame);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- open / close */
int jlm_pager_open(const jlm_pager_config *cfg, jlm_pager **out, jlm_err *err)
{
    if (!cfg || !cfg->src || cfg->n_arrays > JLM_PAGER_MAX_ARRAYS || (cfg->n_arrays && !cfg->arrays))
        return jlm_errf(err, JLM_EINVAL, "pager: no source, or %u arrays (at most %d)",
                        cfg ? cfg->n_arrays : 0, JLM_PAGER_MAX_ARRAYS);
    if (cfg->chunk < PAGER_ALIGN || (cfg->chunk & (cfg->chunk - 1)))
        return jlm_errf(err, JLM_EINVAL, "pager: chunk %llu, expected a power of two >= 4096",
                        (unsigned long long)cfg->chunk);
    uint64_t flen[JLM_PAGER_MAX_ARRAYS];
    for (uint32_t a = 0; a < cfg->n_arrays; a++) {
        int rc = jlm_pgc_check_desc(cfg, a, &flen[a], err);
        if (rc)
            return rc;
    }
    jlm_pager *p = calloc(1, sizeof *p);
    if (!p)
        return jlm_errf(err, JLM_ENOMEM, "pager: out of memory");
    p->src = cfg->src;
    p->chunk = cfg->chunk;
    while ((1ull << p->chunk_shift) < p->chunk)
        p->chunk_shift++;
    p->budget = cfg->budget;
    p->n_arrays = cfg->n_arrays;
    jlm_pager_set_expert_policy(p, JLM_XP_LRU, 1.0);
    p->xp_blocks = 1, p->xp_gets = 1;   /* no cycle until jlm_pager_set_expert_blocks */
    uint64_t thp = jlm_pager_thp_size();
    p->thp = thp && p->chunk % thp == 0 ? thp : 0;
    pthread_mutex_init(&p->pf.mu, NULL);
    pthread_cond_init(&p->pf.cv, NULL);
    pthread_cond_init(&p->pf.done, NULL);
    uint64_t max_chunks = 1;
    for (uint32_t a = 0; a < cfg->n_arrays; a++) {
        int rc = jlm_pgc_init_array(p, &cfg->arrays[a], a, flen[a], err);
        if (rc) {
            jlm_pager_close(p);
            return rc;
        }
        uint64_t nc = (flen[a] + p->chunk - 1) >> p->chunk_shift;
        if (nc > max_chunks)
            max_chunks = nc;
        for (uint32_t i = 0; i < p->arr[a].n_pages; i++) {
            uint64_t ext = p->arr[a].extent[i];
            p->huge_need += ext + HUGE_SLACK;
            p->huge_all += jlm_pg_one_huge(p, ext) ? jlm_pg_huge_end(p, ext) : ext;
            p->all_bytes += p->arr[a].extent[i];
        }
    }
    /* a page's missing chunks form at most ceil(n/2) runs */
    p->pf.cap = (uint32_t)((max_chunks + 1) / 2);
    p->pf.depth = 1;
    const char *nt = getenv("JLM_PAGER_NO_THREADS");
    p->pf.no_threads = nt && !strcmp(nt, "1");
    p->pf_runs = calloc((size_t)p->pf.cap * PF_SLOTS, sizeof *p->pf_runs);
    for (uint32_t i = 0; p->pf_runs && i < PF_SLOTS; i++)
        p->pf.slot[i].runs = p->pf_runs + (size_t)i * p->pf.cap;
    if (!p->pf_runs) {
        jlm_pager_close(p);
        return jlm_errf(err, JLM_ENOMEM, "pager: out of memory");
    }
    *out = p;
    return 0;
}

static void pf_collect(jlm_pager *p, int wait);

void jlm_pager_close(jlm_pager *p)
{
    if (!p)
        return;
    pf_collect(p, 1);
    pthread_mutex_lock(&p->pf.mu);
    p->pf.stop = 1;
    pthread_cond_broadcast(&p->pf.cv);
    pthread_mutex_unlock(&p->pf.mu);
    for (uint32_t i = 0; i < p->pf.n_threads; i++)
        pthread_join(p->pf.th[i], NULL);
    pthread_mutex_destroy(&p->pf.mu);
    pthread_cond_destroy(&p->pf.cv);
    pthread_cond_destroy(&p->pf.done);
    for (uint32_t a = 0; a < p->n_arrays; a++) {
        parray *r = &p->arr[a];
        for (uint32_t i = 0; r->pages && i < r->n_pages; i++)
            if (r->pages[i].frame)
                munmap(r->pages[i].frame, r->map_len);
        free(r->pages);
        free(r->bitmap);
        free(r->extent);
    }
    free(p->pf_runs);
    jlm_xa_free(p->xa);
    free(p);
}

/* ---------------------------------------------------------------- chunks (bits, page_chunks, chunk_lo/hi: pager_int.h) */

/* Gives the memory of frame bytes [lo, hi) back to the kernel (4096-aligned:
 * chunks are, and extents are multiples of 4096). The next touch maps zeroes. */
static void frame_release(uint8_t *f, uint64_t lo, uint64_t hi)
{
    if (hi > lo)
        madvise(f + lo, (size_t)(hi - lo), MADV_DONTNEED);
}

static void charge(jlm_pager *p, ppage *pg, uint64_t bytes)
{
    parray *r = &p->arr[pg->array];
    assert(!jlm_pg_listed(p, pg));   /* charged while pinned, or absent: its list's held is unchanged */
    pg->held += bytes;
    p->resident_bytes += bytes;
    r->st.resident_bytes += bytes;
    if (p->resident_bytes > p->peak_bytes)
        p->peak_bytes = p->resident_bytes;
}

static void uncharge(jlm_pager *p, ppage *pg, uint64_t bytes)
{
    parray *r = &p->arr[pg->array];
    assert(pg->held >= bytes);
    pg->held -= bytes;
    if (jlm_pg_listed(p, pg))
        class_list(p, pg)->held -= bytes;
    p->resident_bytes -= bytes;
    r->st.resident_bytes -= bytes;
}

/* ---------------------------------------------------------------- frames */
/* Whether frames use transparent huge pages (see the top of the file):
 * always when every chunk is whole huge pages, else only while nothing is
 * ever evicted. */
static int huge_ok(const jlm_pager *p) { return p->thp || jlm_pg_fits(p); }

/* With whole-huge-page chunks: pg's frame in huge pages up to its extent
 * rounded down to one, in small pages past it, so no huge page maps memory
 * past what the page holds (invariant 8); huge pages whole where
 * jlm_pg_frame_whole. */
static void advise_frame(const jlm_pager *p, const ppage *pg)
{
    const parray *r = &p->arr[pg->array];
    uint8_t *m = pg->frame;
    size_t al = (size_t)p->thp, len = (size_t)r->map_len, hx = (size_t)(r->extent[pg->idx] & ~(uint64_t)(al - 1));
    if (jlm_pg_frame_whole(p, r, pg))
        hx = len;
    if (hx)
        madvise(m, hx, MADV_HUGEPAGE);
    if (hx < len)
        madvise(m + hx, (size_t)len - hx, MADV_NOHUGEPAGE);
}

/* ABSENT -> FILLING: maps pg a frame (nothing charged: the caller charges the
 * chunks it reads). With whole-huge-page chunks the frame starts on a huge
 * page boundary, so every full chunk is huge pages and a trim or a move
 * (drop_run) takes whole ones (advise_frame). */
static int map_frame(jlm_pager *p, ppage *pg, jlm_err *err)
{
    parray *r = &p->arr[pg->array];
    size_t len = (size_t)r->map_len, al = (size_t)p->thp;
    uint8_t *m = mmap(NULL, len + al, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return jlm_errf(err, JLM_ENOMEM, "pager: %s page %u: out of memory for a %llu-byte frame",
                        r->name, pg->idx, (unsigned long long)r->frame_len);
    if (al) {   /* keep the aligned len bytes of the reservation */
        uint8_t *a = (uint8_t *)(((uintptr_t)m + al - 1) & ~(uintptr_t)(al - 1));
        if (a > m)
            munmap(m, (size_t)(a - m));
        munmap(a + len, (size_t)(m + al - a));
        m = a;
        pg->frame = m;
        pg->huge = (uint8_t)jlm_pg_want_huge(p, r->extent[pg->idx]);
        advise_frame(p, pg);
    } else {
        madvise(m, len, huge_ok(p) ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    }
    pg->frame = m;
    r->st.resident_pages++;
    return 0;
}

/* -> ABSENT: unmaps the frame of a page holding nothing, pinned by no one. */
static void unmap_frame(jlm_pager *p, ppage *pg)
{
    parray *r = &p->arr[pg->array];
    assert(pg->frame && pg->pins == 0 && pg->n_filled == 0 && pg->held == 0);
    host_changing(p, pg);
    munmap(pg->frame, (size_t)r->map_len);
    pg->frame = NULL;
    pg->huge = 0;
    r->st.resident_pages--;
}

/* ---------------------------------------------------------------- eviction */
/* The chunks [c0, c1) of pg the caller is about to read: evicted chunks at the
 * same offsets are moved there (mremap: the memory changes frames without a
 * page fault or a zeroed page) instead of given back to the kernel. */
typedef struct dest { ppage *pg; uint64_t c0, c1, next; } dest;   /* next: see drop_run */

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4   /* Linux 5.7; glibc's <sys/mman.h> may predate it */
#endif

/* Moves the pages of bytes [lo, hi) of frame `from` to the same offsets of
 * frame `to` (whatever `to` mapped there is replaced). 1 if moved.
 * MREMAP_DONTUNMAP leaves `from`'s range mapped (fresh, unpopulated memory),
 * so its frame never has a hole: a plain move unmapped it, and until the
 * hole was mapped again (MAP_FIXED) another thread's mmap (another engine's
 * frame under jlm serve, malloc, a sanitizer's allocator) could land there
 * and then be overwritten. tests/tsan.sh's serve check crashed that way in
 * ThreadSanitizer's allocator. A kernel without DONTUNMAP refuses (EINVAL):
 * the caller then releases the memory instead, and the reader faults it in. */
static int move_mem(uint8_t *from, uint8_t *to, uint64_t lo, uint64_t hi)
{
    return mremap(from + lo, (size_t)(hi - lo), (size_t)(hi - lo), MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
                  to + lo) != MAP_FAILED;
}

/* With whole-huge-page chunks, each full chunk of v's [lo, hi) moves to the
 * next missing full chunk of d from d->next on (any offset: the page
 * advanced through gives up chunks below the ones it reads next), and what
 * finds none is given back. */
static void drop_any(jlm_pager *p, ppage *v, uint64_t lo, uint64_t hi, dest *d)
{
    const parray *dr = d && d->pg && d->pg->frame && p->thp ? &p->arr[d->pg->array] : NULL;
    for (uint64_t q = lo; q < hi; q += p->chunk) {
        uint64_t e = q + p->chunk < hi ? q + p->chunk : hi;
        while (dr && d->next < d->c1 &&
               (bit_get(d->pg, d->next) || chunk_top(p, dr, d->pg, d->next + 1) - chunk_lo(p, d->next) != p->chunk))
            d->next++;
        if (dr && e - q == p->chunk && q % p->chunk == 0 && d->next < d->c1 &&
            mremap(v->frame + q, (size_t)p->chunk, (size_t)p->chunk, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
                   d->pg->frame + chunk_lo(p, d->next)) != MAP_FAILED) {
            d->next++;
            continue;
        }
        frame_release(v->frame, q, e);
    }
}

/* Drops the memory of v's chunks [ca, cb), just cleared. Whole-huge-page
 * chunks go to d's missing chunks in order (drop_any: a move at the same
 * offsets as well would supply a chunk twice, the first supply freed and
 * the chunk it was meant for faulted in fresh). Smaller chunks: the part
 * that d wants at the same offsets moves into d's frame, the rest is given
 * back. */
static void drop_run(jlm_pager *p, ppage *v, uint64_t ca, uint64_t cb, dest *d)
{
    parray *r = &p->arr[v->array];
    uint64_t lo = chunk_lo(p, ca), hi = chunk_top(p, r, v, cb);
    if (p->thp) {   /* whole huge pages: in order to d's missing chunks (none supplied twice) */
        drop_any(p, v, lo, hi, d);
        return;
    }
    if (d && d->pg && d->pg->frame) {
        const parray *dr = &p->arr[d->pg->array];
        uint64_t x0 = ca > d->c0 ? ca : d->c0, x1 = cb < d->c1 ? cb : d->c1, dc = page_chunks(p, dr, d->pg);
        if (x1 > dc)
            x1 = dc;
        int ok = x0 < x1;
        for (uint64_t c = x0; ok && c < x1; c++)
            ok = !bit_get(d->pg, c);
        uint64_t mlo = chunk_lo(p, x0), mhi = ok ? chunk_hi(p, r, v, x1) : 0, dhi = ok ? chunk_hi(p, dr, d->pg, x1) : 0;
        if (dhi < mhi)
            mhi = dhi;
        if (ok && mhi > mlo) {
            /* one call, or chunk by chunk where the range spans mappings
             * (mremap moves within one: earlier moves split frames at chunks) */
            if (!move_mem(v->frame, d->pg->frame, mlo, mhi))
                for (uint64_t q = mlo; q < mhi; q += p->chunk) {
                    uint64_t e = q + p->chunk < mhi ? q + p->chunk : mhi;
                    if (!move_mem(v->frame, d->pg->frame, q, e))
                        frame_release(v->frame, q, e);
                }
            drop_any(p, v, lo, mlo, d);
            drop_any(p, v, mhi, hi, d);
            return;
        }
    }
    drop_any(p, v, lo, hi, d);
}

/* Takes up to k of the highest filled chunks of an unpinned resident page
 * (its tail: the engine fills pages from the front, so a block keeps a
 * prefix), or of the released chunks of the advancing page (p->adv: those
 * below its rel, pinned or not). An unpinned page left with nothing is
 * evicted (RESIDENT -> ABSENT: EVICT event with the bytes it held);
 * otherwise it stays where it is (on its list, or pinned), a trim. The
 * chunks' memory goes to d where it wants them. */
static void trim(jlm_pager *p, ppage *pg, uint64_t k, dest *d)
{
    parray *r = &p->arr[pg->array];
    assert(pg->frame && (pg->pins == 0 || pg == p->adv) && pg->n_filled > 0);
    host_changing(p, pg);
    uint64_t held0 = pg->held, c = pg->pins ? pg->rel : page_chunks(p, r, pg), run_hi = 0, freed = 0;
    int in_run = 0;
    while (k && c > 0) {
        c--;
        if (!bit_get(pg, c)) {
            if (in_run)
                drop_run(p, pg, c + 1, run_hi, d);
            in_run = 0;
            continue;
        }
        if (!in_run)
            run_hi = c + 1;
        in_run = 1;
        bit_clear(pg, c);
        pg->n_filled--;
        freed += chunk_top(p, r, pg, c + 1) - chunk_lo(p, c);
        k--;
    }
    if (in_run)
        drop_run(p, pg, c, run_hi, d);
    uncharge(p, pg, freed);
    if (pg->pf_fresh) {           /* read ahead, and (part of it) gone before any get */
        r->st.pf_unused++;
        pg->pf_fresh = 0;
    }
    if (pg->n_filled || pg->pins) {   /* (a pinned page keeps its frame, empty or not) */
        r->st.trims++;
        return;
    }
    list_unlink(class_list(p, pg), pg);
    unmap_frame(p, pg);
    r->st.evictions++;
    emit(p, JLM_PAGER_EV_EVICT, pg, held0, JLM_TIER_FRAME);
}

/* The filled chunks of pg below its rel (the released ones of the advancing
 * page; 0 for any other). */
static uint64_t released_chunks(const jlm_pager *p, const ppage *pg)
{
    uint64_t n = 0;
    if (pg && pg == p->adv && pg->pins)
        for (uint64_t c = 0; c < pg->rel; c++)
            n += (uint64_t)bit_get(pg, c);
    return n;
}

/* Invariant (7): the victim and how many chunks to take from it. An
 * unpinned expert, whole (the one the expert policy names: pager_policy.c);
 * else the block holding the most chunks (ties: the most recently used),
 * down to one chunk below the next fullest (so the blocks level off): an
 * unpinned one, or the advancing page (p->adv, in use: the most recent),
 * which gives only its released chunks. `skip` (the page being filled) is
 * never chosen, unless it is the advancing page (its released chunks make
 * room for its next ones). NULL if every page is pinned. */
static ppage *pick_victim(jlm_pager *p, const ppage *skip, uint64_t *k)
{
    ppage *x = jlm_pgp_expert_victim(p, skip);
    if (x) {
        *k = x->n_filled;
        return x;
    }
    ppage *best = NULL, *adv = p->adv;
    uint32_t second = 0;
    uint64_t adv_k = released_chunks(p, adv);
    if (adv_k && p->arr[adv->array].cls == JLM_PAGER_BLOCK)
        best = adv;
    for (ppage *q = p->lru[JLM_PAGER_BLOCK].head; q; q = q->next) {
        if (q == skip)
            continue;
        if (!best || q->n_filled > best->n_filled) {
            if (best && best->n_filled > second)
                second = best->n_filled;
            best = q;
        } else if (q->n_filled > second) {
            second = q->n_filled;
        }
    }
    if (best)
        *k = best->n_filled > second ? best->n_filled - second : 1;
    if (best && best == adv && *k > adv_k)
        *k = adv_k;
    return best;
}

/* ABSENT -> FILLING for an expert page whose read must evict: when the
 * victim (invariant 7's: the expert policy's choice, unchanged) is an
 * unpinned page of the same array (every frame of an array is frame_len
 * bytes, whatever its page's extent), it is evicted whole and its frame,
 * its address range and the memory mapped there, becomes pg's, instead of a
 * new mapping the victim's memory then moves into (drop_run). The memory is
 * the same either way; the addresses are not, and a hypervisor that shadows
 * the guest's page tables charges the first touch of every 4 KiB page at a
 * new address: on this project's VM ~10 us, about 4 ms for a 1.8 MB expert,
 * 4x its read (docs/pager.md, Expert frames). Bytes of the frame outside
 * [lo, hi), the part pg is about to read, are given back (invariant 8); a
 * victim of another extent leaves its huge page advice redone for pg's
 * (map_frame's). Less freed than pg needs: the caller's make_room evicts
 * the rest. 1 if pg got the frame; 0: map_frame. */
static int take_frame(jlm_pager *p, ppage *pg, uint64_t need, uint64_t c0, uint64_t c1)
{
    parray *r = &p->arr[pg->array];
    if (!p->budget || r->cls != JLM_PAGER_EXPERT || p->resident_bytes + need <= p->budget)
        return 0;
    uint64_t k = 0;
    ppage *v = pick_victim(p, pg, &k);
    if (!v || v->array != pg->array || v->pins || v->pf_in)
        return 0;
    host_changing(p, v);
    uint64_t held0 = v->held;
    list_unlink(class_list(p, v), v);
    memset(v->bits, 0, r->words * sizeof *v->bits);
    v->n_filled = 0;
    uncharge(p, v, v->held);
    if (v->pf_fresh) {
        r->st.pf_unused++;
        v->pf_fresh = 0;
    }
    pg->frame = v->frame;   /* resident_pages: one frame, passed on */
    pg->huge = v->huge && jlm_pg_want_huge(p, r->extent[pg->idx]);
    v->frame = NULL;
    frame_release(pg->frame, 0, chunk_lo(p, c0));
    frame_release(pg->frame, chunk_top(p, r, pg, c1), r->map_len);
    if (p->thp && (r->extent[v->idx] != r->extent[pg->idx] || v->huge != pg->huge))
        advise_frame(p, pg);
    v->huge = 0;
    r->st.evictions++;
    emit(p, JLM_PAGER_EV_EVICT, v, held0, JLM_TIER_FRAME);
    return 1;
}

/* Evicts (invariant 7 order) until need more bytes fit the budget. d (may be
 * NULL) names the page being filled: never a victim, and the evicted chunks'
 * memory moves into it where it wants them. JLM_ERANGE when only pinned
 * pages remain. */
static int make_room(jlm_pager *p, uint64_t need, dest *d, jlm_err *err)
{
    if (p->budget == 0)
        return 0;
    const ppage *for_pg = d ? d->pg : NULL;
    while (p->resident_bytes + need > p->budget) {
        uint64_t k = 0, over = p->resident_bytes + need - p->budget;
        ppage *v = pick_victim(p, for_pg, &k);
        if (!v) {
            if (!for_pg)
                return jlm_errf(err, JLM_ERANGE, "pager: budget %llu bytes below the %llu bytes of pinned pages",
                                (unsigned long long)p->budget, (unsigned long long)p->resident_bytes);
            return jlm_errf(err, JLM_ERANGE,
                            "pager: budget %llu bytes exhausted by pinned pages (%llu resident), %s page %u needs %llu more;"
                            " raise the budget to jlm_pager_min_budget()",
                            (unsigned long long)p->budget, (unsigned long long)p->resident_bytes,
                            p->arr[for_pg->array].name, for_pg->idx, (unsigned long long)need);
        }
        if (p->arr[v->array].cls == JLM_PAGER_BLOCK) {
            uint64_t kn = (over + p->chunk - 1) >> p->chunk_shift;   /* >= 1; a short last chunk loops again */
            if (k > kn)
                k = kn;
        }
        trim(p, v, k, d);
    }
    return 0;
}

/* ---------------------------------------------------------------- fill */
/* Reads the missing chunks of [c0, c1) in coalesced runs (charged by the
 * caller). *read_bytes = bytes read (also on failure: the runs before it stay
 * filled; the failed run's memory is given back). */
static int fill_chunks(jlm_pager *p, ppage *pg, uint64_t c0, uint64_t c1, uint64_t *read_bytes, jlm_err *err)
{
    parray *r = &p->arr[pg->array];
    uint64_t c = c0;
    *read_bytes = 0;
    while (c < c1) {
        if (bit_get(pg, c)) {
            c++;
            continue;
        }
        uint64_t e = c + 1;
        while (e < c1 && !bit_get(pg, e))
            e++;
        uint64_t lo = chunk_lo(p, c), hi = chunk_hi(p, r, pg, e);
        uint64_t t0 = now_ns();
        jlm_pgr_prefault(pg->frame + lo, hi - lo);
        int rc = p->src->read(p->src, r->base_off + (uint64_t)pg->idx * r->page_size + lo,
                              (size_t)(hi - lo), pg->frame + lo, err);
        r->st.read_ns += now_ns() - t0;
        if (rc) {   /* the failed run and the runs not reached may hold moved-in memory */
            for (uint64_t q = c; q < c1; q++)
                if (!bit_get(pg, q))
                    host_changing(p, pg), frame_release(pg->frame, chunk_lo(p, q), chunk_top(p, r, pg, q + 1));
            return jlm_err_prefix(err, rc, "%s page %u", r->name, pg->idx);
        }
        r->st.reads++;
        r->st.bytes_read += hi - lo;
        *read_bytes += hi - lo;
        for (uint64_t q = c; q < e; q++)
            bit_set(pg, q);
        pg->n_filled += (uint32_t)(e - c);
        c = e;
    }
    return 0;
}

/* ---------------------------------------------------------------- prefetch */

/* Takes slot s's finished read into the pager (engine thread): the page's
 * chunks filled, its pin dropped, PAGE_IN (or FILL, for a page that held a
 * part) emitted; on a read error nothing of the read counts as filled and the
 * page returns to what it held before (ABSENT if nothing). wait 0: returns 0
 * at once if the read is unfinished; wait 1 on a read no reader has taken
 * yet: reads it here (jlm_pgr_run). Returns 1 if collected, -1 if it was and
 * its read had failed, 0 if not; *waited_ns = time waited for it (or spent
 * reading it). */
static int pf_collect_slot(jlm_pager *p, pfslot *f, int wait, uint64_t *waited_ns)
{
    if (waited_ns)
        *waited_ns = 0;
    ppage *pg = f->pg;
    if (!pg)
        return 0;
    pthread_mutex_lock(&p->pf.mu);
    if (f->state != PF_DONE) {
        if (!wait) {
            pthread_mutex_unlock(&p->pf.mu);
            return 0;
        }
        uint64_t t0 = now_ns();
        if (f->state == PF_QUEUED) {   /* no reader has it yet: read here, with no wake-up on either side */
            f->state = PF_READING;
            pthread_mutex_unlock(&p->pf.mu);
            jlm_err e = {0};
            int rc = jlm_pgr_run(p, f, &e);
            pthread_mutex_lock(&p->pf.mu);
            f->rc = rc, f->err = e, f->state = PF_DONE;
        }
        while (f->state != PF_DONE)
            pthread_cond_wait(&p->pf.done, &p->pf.mu);
        if (waited_ns)
            *waited_ns = now_ns() - t0 + 1;   /* nonzero: it waited */
    }
    int rc = f->rc;
    f->state = PF_IDLE;
    pthread_mutex_unlock(&p->pf.mu);
    f->pg = NULL;
    pg->pf_in = 0;
    p->pf.busy--;
    parray *r = &p->arr[pg->array];
    assert(pg->frame && pg->pins > 0);
    pg->pins--;
    if (rc) {
        r->st.pf_failed++;
        for (uint32_t i = 0; i < f->n_runs; i++)
            host_changing(p, pg), frame_release(pg->frame, f->runs[i].lo, chunk_top(p, r, pg, f->runs[i].c1));
        uncharge(p, pg, f->len);
        if (pg->pins == 0) {
            if (pg->n_filled == 0)
                unmap_frame(p, pg);
            else
                list_push_head(class_list(p, pg), pg);
        }
        return -1;
    }
    for (uint32_t i = 0; i < f->n_runs; i++) {
        for (uint64_t c = f->runs[i].c0; c < f->runs[i].c1; c++)
            bit_set(pg, c);
        pg->n_filled += (uint32_t)(f->runs[i].c1 - f->runs[i].c0);
    }
    /* a background read (jlm_pager_prefetch_low) goes in as the least
     * recently used page, and its pf_low leaves it unprotected (pager_policy.c):
     * a victim before any page a get has used */
    int low = pg->pf_low;
    pg->pf_fresh = 1;
    r->st.reads += f->n_runs;
    r->st.bytes_read += f->rlen;
    if (f->was_absent)
        r->st.page_ins++;
    else
        r->st.fills++;
    if (pg->pins == 0)
        (low ? list_push_tail : list_push_head)(class_list(p, pg), pg);
    emit(p, f->was_absent ? JLM_PAGER_EV_PAGE_IN : JLM_PAGER_EV_FILL, pg, f->rlen, p->src->tier);
    return 1;
}

/* Every slot's read: the finished ones (wait 0) or all of them (wait 1). */
static void pf_collect(jlm_pager *p, int wait)
{
    for (uint32_t i = 0; i < PF_SLOTS && p->pf.busy; i++)
        pf_collect_slot(p, &p->pf.slot[i], wait, NULL);
}

void jlm_pager_set_prefetch(jlm_pager *p, int on)
{
    if (!on)
        pf_collect(p, 1);
    p->pf_on = on != 0;
}


int jlm_pager_prefetch(jlm_pager *p, uint32_t array, uint32_t page)
{
    if (array >= p->n_arrays || page >= p->arr[array].n_pages)
        return 0;
    return jlm_pager_prefetch_range(p, array, page, 0, p->arr[array].extent[page]);
}

int jlm_pager_prefetch_low(jlm_pager *p, uint32_t array, uint32_t page)
{
    int rc = jlm_pager_prefetch(p, array, page);
    if (rc > 0)
        p->arr[array].pages[page].pf_low = 1;   /* read on a reader thread: collected on this one */
    return rc;
}

int jlm_pager_prefetch_range(jlm_pager *p, uint32_t array, uint32_t page, uint64_t off, uint64_t len)
{
    if (!p->pf_on || array >= p->n_arrays || page >= p->arr[array].n_pages)
        return 0;
    parray *r = &p->arr[array];
    ppage *pg = &r->pages[page];
    uint64_t ext = r->extent[page];
    if (off > ext || len > ext - off || !len)
        return 0;
    pf_collect(p, 0);
    /* on its way, or in use (then the get has read what it needs), unless its
     * one holder advances through it (the range is ahead of what it uses) */
    if (pg->pf_in || (pg->pins && (pg != p->adv || pg->pins != 1)))
        return 0;
    uint64_t c0 = off >> p->chunk_shift, nc = (off + len + p->chunk - 1) >> p->chunk_shift;
    uint64_t need = missing_bytes(p, r, pg, c0, nc);
    if (!need)
        return 0;   /* resident in full: nothing to read */
    pfslot *s = p->budget && jlm_pg_room_for(p, pg) < need ? NULL : jlm_pgr_free_slot(p);
    if (!s) {
        r->st.pf_skipped++;
        return -1;
    }
    jlm_err err = {0};
    int was_absent = pg->frame == NULL;
    dest d = { .pg = pg, .c0 = c0, .c1 = nc, .next = c0 };
    if (was_absent && !take_frame(p, pg, need, c0, nc) && map_frame(p, pg, &err)) {
        r->st.pf_skipped++;
        return -1;
    }
    if (was_absent)
        need = missing_bytes(p, r, pg, c0, nc);   /* the frame it got: one huge frame or not */
    if (make_room(p, need, &d, &err)) {   /* cannot happen: room was checked */
        for (uint64_t c = c0; c < nc; c++)
            if (!bit_get(pg, c))
                host_changing(p, pg), frame_release(pg->frame, chunk_lo(p, c), chunk_top(p, r, pg, c + 1));
        if (was_absent)
            unmap_frame(p, pg);
        r->st.pf_skipped++;
        return -1;
    }
    if (!was_absent && !pg->pins)
        list_unlink(class_list(p, pg), pg);
    pg->pins++;                       /* held by the read: FILLING, never a victim */
    charge(p, pg, need);
    s->pg = pg;
    pg->pf_in = (uint8_t)(s - p->pf.slot + 1);
    pg->pf_low = 0;   /* jlm_pager_prefetch_low sets it after */
    p->pf.busy++;
    r->st.pf_issued++;
    pthread_mutex_lock(&p->pf.mu);
    uint32_t n = 0;
    s->rlen = 0;
    for (uint64_t c = c0; c < nc;) {
        if (bit_get(pg, c)) {
            c++;
            continue;
        }
        uint64_t e = c + 1;
        while (e < nc && !bit_get(pg, e))
            e++;
        assert(n < p->pf.cap);
        s->runs[n++] = (pfrun){ .c0 = c, .c1 = e, .lo = chunk_lo(p, c), .hi = chunk_hi(p, r, pg, e) };
        s->rlen += s->runs[n - 1].hi - s->runs[n - 1].lo;
        c = e;
    }
    s->n_runs = n;
    s->len = need;   /* rlen: set with the runs */
    s->was_absent = was_absent;
    s->base = r->base_off + (uint64_t)page * r->page_size;
    s->dst = pg->frame;
    s->rc = 0;
    s->state = PF_QUEUED;
    pthread_cond_signal(&p->pf.cv);   /* one reader: the others would only wake to find nothing */
    pthread_mutex_unlock(&p->pf.mu);
    return 1;
}

/* ---------------------------------------------------------------- get / advance / unpin */
/* Validates [off, off+len) of array/page and turns it into chunks [c0, c1). */
static int span_chunks(jlm_pager *p, uint32_t array, uint32_t page, uint64_t off, uint64_t len, uint64_t *c0,
                       uint64_t *c1, jlm_err *err)
{
    if (array >= p->n_arrays || page >= p->arr[array].n_pages)
        return jlm_errf(err, JLM_EINVAL, "pager: array %u page %u out of range", array, page);
    const parray *r = &p->arr[array];
    uint64_t ext = r->extent[page];
    if (off > ext || len > ext - off)
        return jlm_errf(err, JLM_EINVAL, "pager: %s page %u: bytes [%llu, %llu) past the page's extent %llu",
                        r->name, page, (unsigned long long)off, (unsigned long long)(off + len),
                        (unsigned long long)ext);
    *c0 = off >> p->chunk_shift;
    *c1 = len ? (off + len + p->chunk - 1) >> p->chunk_shift : *c0;
    return 0;
}

/* Fills chunks [c0, c1) of pg for a get (pin 1: pins it on success) or an
 * advance (pin 0: its holder's pin is there already): the reads in flight
 * first (this page's is waited for; with one reader the others too when the
 * source is needed here: it then serves one thread at a time; a hit on
 * another page does not wait), then room and the missing chunks' reads.
 * *got = bytes read. On failure nothing more is pinned and the pager is
 * consistent (chunks read before the failure stay filled). */
static int acquire(jlm_pager *p, ppage *pg, uint64_t c0, uint64_t c1, int pin, uint64_t *got, jlm_err *err)
{
    parray *r = &p->arr[pg->array];
    int pf_waited = 0;
    uint64_t w;
    *got = 0;
    pf_collect(p, 0);
    if (pg->pf_in && pf_collect_slot(p, &p->pf.slot[pg->pf_in - 1], 1, &w) > 0 && w) {
        pf_waited = 1;
        r->st.pf_waits++;
        r->st.pf_wait_ns += w;
    }
    if (p->pf.busy && p->pf.depth == 1 && (!pg->frame || missing(pg, c0, c1)))
        pf_collect(p, 1);
    if (pg->pf_fresh) {
        pg->pf_fresh = 0;
        if (!pf_waited)
            r->st.pf_hits++;
    }
    int was_absent = pg->frame == NULL, listed = !was_absent && pg->pins == 0;
    uint64_t need = missing_bytes(p, r, pg, c0, c1);
    int rc;
    if (was_absent && !take_frame(p, pg, need, c0, c1) && (rc = map_frame(p, pg, err)))
        return rc;
    if (was_absent)
        need = missing_bytes(p, r, pg, c0, c1);   /* the frame it got: one huge frame or not */
    dest d = { .pg = pg, .c0 = c0, .c1 = c1, .next = c0 };
    rc = make_room(p, need, &d, err);
    if (rc == JLM_ERANGE && p->pf.busy) {   /* reads in flight hold pins: room once they are in */
        pf_collect(p, 1);
        rc = make_room(p, need, &d, err);
    }
    if (rc) {
        for (uint64_t c = c0; c < c1; c++)   /* memory moved in for the chunks not read */
            if (!bit_get(pg, c))
                host_changing(p, pg), frame_release(pg->frame, chunk_lo(p, c), chunk_top(p, r, pg, c + 1));
        if (was_absent)
            unmap_frame(p, pg);
        return rc;
    }
    if (listed && pin)
        list_unlink(class_list(p, pg), pg);
    charge(p, pg, need);
    rc = fill_chunks(p, pg, c0, c1, got, err);
    if (rc) {
        uncharge(p, pg, need - *got);
        if (pg->n_filled == 0 && pg->pins == 0)
            unmap_frame(p, pg);
        else if (pg->pins == 0 && pin)
            list_push_head(class_list(p, pg), pg);
        if (was_absent && pg->frame) {
            r->st.page_ins++;
            emit(p, JLM_PAGER_EV_PAGE_IN, pg, *got, p->src->tier);
        }
        return rc;
    }
    if (*got && p->pf_on)
        r->st.pf_misses++;
    if (was_absent) {
        r->st.page_ins++;
        emit(p, JLM_PAGER_EV_PAGE_IN, pg, *got, p->src->tier);
    } else if (*got) {
        r->st.fills++;
        emit(p, JLM_PAGER_EV_FILL, pg, *got, p->src->tier);
    } else if (pin) {
        r->st.hits++;
        emit(p, JLM_PAGER_EV_HIT, pg, 0, JLM_TIER_FRAME);
    }
    return 0;
}

int jlm_pager_get(jlm_pager *p, uint32_t array, uint32_t page, uint64_t off, uint64_t len,
                  const void **ptr, jlm_err *err)
{
    uint64_t c0, c1, got;
    int rc = span_chunks(p, array, page, off, len, &c0, &c1, err);
    if (rc)
        return rc;
    ppage *pg = &p->arr[array].pages[page];
    if (pg == p->adv) {   /* a second holder: nothing of the page is released any more */
        pg->rel = 0;
        p->adv = NULL;
    }
    if ((rc = acquire(p, pg, c0, c1, 1, &got, err)))
        return rc;
    pg->pins++;
    jlm_pgp_touch(p, pg);
    *ptr = pg->frame + off;
    return 0;
}

int jlm_pager_advance(jlm_pager *p, uint32_t array, uint32_t page, uint64_t off, uint64_t len, jlm_err *err)
{
    uint64_t c0, c1, got;
    int rc = span_chunks(p, array, page, off, len, &c0, &c1, err);
    if (rc)
        return rc;
    ppage *pg = &p->arr[array].pages[page];
    if (!pg->frame || !pg->pins)
        return jlm_errf(err, JLM_EINVAL, "pager: %s page %u: advanced but not pinned", p->arr[array].name, page);
    if (pg->pf_in)   /* a read ahead into this page: in before the released chunks change */
        pf_collect_slot(p, &p->pf.slot[pg->pf_in - 1], 1, NULL);
    if (pg->pins == 1 && (pg == p->adv || !p->adv || !p->adv->pins)) {
        if (p->adv && p->adv != pg)
            p->adv->rel = 0;
        p->adv = pg;
        pg->rel = c0;   /* the chunk holding off is still in use */
    }
    return acquire(p, pg, c0, c1, 0, &got, err);
}

void jlm_pager_unpin(jlm_pager *p, uint32_t array, uint32_t page)
{
    assert(array < p->n_arrays && page < p->arr[array].n_pages);
    ppage *pg = &p->arr[array].pages[page];
    assert(pg->frame && pg->pins > 0);
    if (!pg->frame || pg->pins == 0)
        return;
    if (--pg->pins == 0) {
        if (pg == p->adv) {
            pg->rel = 0;
            p->adv = NULL;
        }
        if (pg->n_filled == 0)
            unmap_frame(p, pg);   /* a get of no bytes: nothing to keep */
        else
            list_push_head(class_list(p, pg), pg);
    }
}

/* ---------------------------------------------------------------- configure, query */
/* A frame mapped while the budget held everything, under one that no
 * longer does: its new budget's advice, and its memory past the extent (a
 * whole huge page's tail) given back (invariant 8). Reads are collected. */
static void frame_fit(jlm_pager *p, parray *r, ppage *pg)
{
    if (!p->thp) {
        madvise(pg->frame, (size_t)r->frame_len, MADV_NOHUGEPAGE);
        return;
    }
    uint64_t ext = r->extent[pg->idx];
    if (pg->huge)
        return;   /* a one huge frame: whole at every budget, and charged so */
    host_changing(p, pg);
    advise_frame(p, pg);   /* small pages past the extent: neither huge nor fitting */
    frame_release(pg->frame, (ext + PAGER_ALIGN - 1) & ~(uint64_t)(PAGER_ALIGN - 1), r->map_len);
}

int jlm_pager_set_budget(jlm_pager *p, uint64_t budget, jlm_err *err)
{
    pf_collect(p, 1);
    if (budget) {
        uint64_t pinned = 0;
        for (uint32_t a = 0; a < p->n_arrays; a++)
            for (uint32_t i = 0; i < p->arr[a].n_pages; i++)
                if (p->arr[a].pages[i].pins)
                    pinned += p->arr[a].pages[i].held;
        if (pinned > budget)
            return jlm_errf(err, JLM_ERANGE, "pager: budget %llu bytes is below the %llu bytes of pinned pages",
                            (unsigned long long)budget, (unsigned long long)pinned);
    }
    int was_fit = jlm_pg_fits(p);
    p->budget = budget;
    if (was_fit && !jlm_pg_fits(p))
        for (uint32_t a = 0; a < p->n_arrays; a++)
            for (uint32_t i = 0; i < p->arr[a].n_pages; i++)
                if (p->arr[a].pages[i].frame)
                    frame_fit(p, &p->arr[a], &p->arr[a].pages[i]);
    int rc = make_room(p, 0, NULL, err);   /* cannot fail: the pinned pages fit */
    assert(rc == 0);
    return rc;
}
