/* pager.c - engine frames, budget, eviction and partial fill (see pager.h for
 * the lifecycle diagram and the numbered invariants this file keeps).
 *
 * Data structures. Each array has a table of page records (allocated once at
 * open, so pointers to them are stable) and one bitmap block holding `words`
 * u64 per page. Each eviction class has one doubly linked list of the
 * resident unpinned pages, most recently used at the head: the expert victim
 * is the tail (LRU), the block victim the head (MRU), both O(1).
 */
#include "engine/pager.h"
#include "engine/lru.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAGER_ALIGN 4096u

/* ---------------------------------------------------------------- types */
typedef struct ppage {
    jlm_lru_node  ln;         /* first: class list links (unpinned resident only) */
    uint8_t      *frame;      /* NULL when ABSENT */
    uint64_t     *bits;       /* (words,) filled chunks, into parray.bitmap */
    uint32_t      pins;       /* gets not yet unpinned */
    uint32_t      n_filled;   /* popcount(bits) */
    uint32_t      array, idx;
    int           pf_fresh;   /* read by a prefetch, no get since */
} ppage;

typedef struct parray {
    char      name[32];
    int       cls;            /* enum jlm_pager_class */
    uint64_t  base_off, page_size;
    uint64_t  frame_len;      /* bytes of one frame: the largest extent (>= 4096) */
    uint32_t  n_pages;
    uint32_t  words;          /* bitmap words per page */
    uint64_t *extent;         /* (n_pages,) */
    uint64_t *bitmap;         /* (n_pages * words,) */
    ppage    *pages;          /* (n_pages,) */
    jlm_pager_array_counters st;
} parray;

typedef jlm_lru plist;   /* the policy's lists (engine/lru.h) */
#define PG(node) ((ppage *)(void *)(node))   /* ln is ppage's first member */

/* The reader thread and its one request. Fields under mu; the engine thread
 * sets a request (state QUEUED) only while state is IDLE or DONE. */
enum { PF_IDLE = 0, PF_QUEUED, PF_DONE };
typedef struct pfetch {
    pthread_mutex_t mu;
    pthread_cond_t  cv;       /* state or stop changed */
    pthread_t       th;
    int             started, stop, state;
    uint64_t        off, len; /* source span */
    uint8_t        *dst;      /* the frame the engine thread gave */
    int             rc;
    jlm_err         err;
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
    jlm_pager_evict_fn evict_fn;   /* frame about to be freed or reused */
    void       *evict_ctx;

    /* changes during routine operation */
    uint64_t    budget;       /* 0 = unlimited */
    uint64_t    resident_bytes, peak_bytes;
    plist       lru[2];       /* per class; head = most recently used */

    /* prefetch: on, and the page whose read is in flight or uncollected
     * (engine thread only; the reader thread sees only pf) */
    int         pf_on;
    ppage      *pf_pg;
    pfetch      pf;
};

/* ---------------------------------------------------------------- lists */
static void list_unlink(plist *l, ppage *pg) { jlm_lru_unlink(l, &pg->ln); }
static void list_push_head(plist *l, ppage *pg) { jlm_lru_push_head(l, &pg->ln); }

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

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- open / close */
static int check_desc(const jlm_pager_config *cfg, uint32_t a, uint64_t *frame_len, jlm_err *err)
{
    const jlm_pager_array_desc *d = &cfg->arrays[a];
    const char *nm = d->name ? d->name : "?";
    if (!d->name || (d->cls != JLM_PAGER_BLOCK && d->cls != JLM_PAGER_EXPERT))
        return jlm_errf(err, JLM_EINVAL, "pager: array %u (%s): no name or class %d unknown", a, nm, d->cls);
    if (d->n_pages == 0) {                   /* an empty array (no tower, dense model) */
        *frame_len = PAGER_ALIGN;
        return 0;
    }
    if (d->base_off % PAGER_ALIGN || d->page_size == 0 || d->page_size % PAGER_ALIGN)
        return jlm_errf(err, JLM_EINVAL, "pager: %s: base %llu / page size %llu not a nonzero multiple of 4096",
                        nm, (unsigned long long)d->base_off, (unsigned long long)d->page_size);
    uint64_t max = 0;
    for (uint32_t i = 0; i < d->n_pages; i++) {
        uint64_t e = d->extent ? d->extent[i] : d->page_size;
        if (e % PAGER_ALIGN || e > d->page_size)
            return jlm_errf(err, JLM_EINVAL, "pager: %s page %u: extent %llu, expected a multiple of 4096 <= page size %llu",
                            nm, i, (unsigned long long)e, (unsigned long long)d->page_size);
        if (e > max)
            max = e;
    }
    uint64_t size = cfg->src->size;
    if (d->n_pages && (d->base_off > size || (uint64_t)(d->n_pages - 1) > (size - d->base_off) / d->page_size ||
                       max > size - d->base_off - (uint64_t)(d->n_pages - 1) * d->page_size))
        return jlm_errf(err, JLM_EINVAL, "pager: %s: %u pages of %llu bytes at %llu end past %s (%llu bytes)",
                        nm, d->n_pages, (unsigned long long)d->page_size, (unsigned long long)d->base_off,
                        cfg->src->name, (unsigned long long)size);
    *frame_len = max < PAGER_ALIGN ? PAGER_ALIGN : max;
    return 0;
}

static int init_array(jlm_pager *p, const jlm_pager_array_desc *d, uint32_t a, uint64_t frame_len, jlm_err *err)
{
    parray *r = &p->arr[a];
    snprintf(r->name, sizeof r->name, "%s", d->name);
    r->cls = d->cls;
    r->base_off = d->base_off;
    r->page_size = d->page_size;
    r->frame_len = frame_len;
    r->n_pages = d->n_pages;
    r->words = (uint32_t)(((frame_len + p->chunk - 1) / p->chunk + 63) / 64);
    size_t n = d->n_pages ? d->n_pages : 1;
    r->extent = calloc(n, sizeof *r->extent);
    r->pages = calloc(n, sizeof *r->pages);
    r->bitmap = (size_t)r->words > SIZE_MAX / 8 / n ? NULL : calloc(n * r->words, sizeof *r->bitmap);
    if (!r->extent || !r->pages || !r->bitmap)
        return jlm_errf(err, JLM_ENOMEM, "pager: %s: out of memory for %u page records", r->name, d->n_pages);
    for (uint32_t i = 0; i < d->n_pages; i++) {
        r->extent[i] = d->extent ? d->extent[i] : d->page_size;
        r->pages[i].bits = r->bitmap + (size_t)i * r->words;
        r->pages[i].array = a;
        r->pages[i].idx = i;
    }
    return 0;
}

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
        int rc = check_desc(cfg, a, &flen[a], err);
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
    pthread_mutex_init(&p->pf.mu, NULL);
    pthread_cond_init(&p->pf.cv, NULL);
    for (uint32_t a = 0; a < cfg->n_arrays; a++) {
        int rc = init_array(p, &cfg->arrays[a], a, flen[a], err);
        if (rc) {
            jlm_pager_close(p);
            return rc;
        }
    }
    *out = p;
    return 0;
}

static int pf_collect(jlm_pager *p, int wait, uint64_t *waited_ns);

void jlm_pager_close(jlm_pager *p)
{
    if (!p)
        return;
    pf_collect(p, 1, NULL);
    if (p->pf.started) {
        pthread_mutex_lock(&p->pf.mu);
        p->pf.stop = 1;
        pthread_cond_broadcast(&p->pf.cv);
        pthread_mutex_unlock(&p->pf.mu);
        pthread_join(p->pf.th, NULL);
    }
    pthread_mutex_destroy(&p->pf.mu);
    pthread_cond_destroy(&p->pf.cv);
    for (uint32_t a = 0; a < p->n_arrays; a++) {
        parray *r = &p->arr[a];
        for (uint32_t i = 0; r->pages && i < r->n_pages; i++)
            free(r->pages[i].frame);
        free(r->pages);
        free(r->bitmap);
        free(r->extent);
    }
    free(p);
}

/* ---------------------------------------------------------------- eviction */
/* Invariant (7): LRU expert first, else MRU block; NULL if all are pinned. */
static ppage *pick_victim(jlm_pager *p)
{
    return PG(jlm_lru_victim(p->lru));
}

/* RESIDENT, UNPINNED -> ABSENT. Returns the frame (the caller frees or reuses it). */
static uint8_t *evict(jlm_pager *p, ppage *pg)
{
    parray *r = &p->arr[pg->array];
    assert(pg->frame && pg->pins == 0);
    list_unlink(class_list(p, pg), pg);
    uint8_t *f = pg->frame;
    pg->frame = NULL;
    memset(pg->bits, 0, (size_t)r->words * sizeof *pg->bits);
    pg->n_filled = 0;
    p->resident_bytes -= r->frame_len;
    r->st.evictions++;
    if (pg->pf_fresh) {
        r->st.pf_unused++;
        pg->pf_fresh = 0;
    }
    r->st.resident_pages--;
    r->st.resident_bytes -= r->frame_len;
    if (p->evict_fn)
        p->evict_fn(p->evict_ctx, pg->array, pg->idx, f);
    emit(p, JLM_PAGER_EV_EVICT, pg, r->frame_len, JLM_TIER_FRAME);
    return f;
}

/* Evicts until need more bytes fit the budget; *reuse = a victim's frame of
 * exactly need bytes when one was freed last (saves a free/alloc pair in the
 * common cyclic case), else NULL. JLM_ERANGE when only pinned pages remain. */
static int make_room(jlm_pager *p, uint64_t need, const ppage *for_pg, uint8_t **reuse, jlm_err *err)
{
    *reuse = NULL;
    if (p->budget == 0)
        return 0;
    while (p->resident_bytes + need > p->budget) {
        ppage *v = pick_victim(p);
        if (!v)
            return jlm_errf(err, JLM_ERANGE,
                            "pager: budget %llu bytes exhausted by pinned pages (%llu resident), %s page %u needs %llu more;"
                            " raise the budget to jlm_pager_min_budget()",
                            (unsigned long long)p->budget, (unsigned long long)p->resident_bytes,
                            p->arr[for_pg->array].name, for_pg->idx, (unsigned long long)need);
        uint64_t vlen = p->arr[v->array].frame_len;
        uint8_t *f = evict(p, v);
        if (vlen == need && p->resident_bytes + need <= p->budget) {
            *reuse = f;
            return 0;
        }
        free(f);
    }
    return 0;
}

/* ABSENT -> FILLING: gives pg a frame. */
static int take_frame(jlm_pager *p, ppage *pg, jlm_err *err)
{
    parray *r = &p->arr[pg->array];
    uint8_t *f;
    int rc = make_room(p, r->frame_len, pg, &f, err);
    if (rc)
        return rc;
    if (!f) {
        void *m = NULL;
        if (posix_memalign(&m, PAGER_ALIGN, r->frame_len) != 0)
            return jlm_errf(err, JLM_ENOMEM, "pager: %s page %u: out of memory for a %llu-byte frame",
                            r->name, pg->idx, (unsigned long long)r->frame_len);
        f = m;
    }
    pg->frame = f;
    p->resident_bytes += r->frame_len;
    if (p->resident_bytes > p->peak_bytes)
        p->peak_bytes = p->resident_bytes;
    r->st.resident_pages++;
    r->st.resident_bytes += r->frame_len;
    return 0;
}

/* Frees the frame of a page left with nothing filled (FILLING -> ABSENT). */
static void drop_frame(jlm_pager *p, ppage *pg)
{
    parray *r = &p->arr[pg->array];
    if (p->evict_fn)
        p->evict_fn(p->evict_ctx, pg->array, pg->idx, pg->frame);
    free(pg->frame);
    pg->frame = NULL;
    p->resident_bytes -= r->frame_len;
    r->st.resident_pages--;
    r->st.resident_bytes -= r->frame_len;
}

/* ---------------------------------------------------------------- fill */
static int bit_get(const ppage *pg, uint64_t c) { return (int)((pg->bits[c >> 6] >> (c & 63)) & 1u); }
static void bit_set(ppage *pg, uint64_t c) { pg->bits[c >> 6] |= 1ull << (c & 63); }

/* 1 if a chunk of [c0, c1) is not filled. */
static int missing(const ppage *pg, uint64_t c0, uint64_t c1)
{
    for (uint64_t c = c0; c < c1; c++)
        if (!bit_get(pg, c))
            return 1;
    return 0;
}

/* Reads the missing chunks of [c0, c1) in coalesced runs. *read_bytes = bytes
 * read (also on failure: the runs before it stay filled). */
static int fill_chunks(jlm_pager *p, ppage *pg, uint64_t c0, uint64_t c1, uint64_t *read_bytes, jlm_err *err)
{
    parray *r = &p->arr[pg->array];
    uint64_t ext = r->extent[pg->idx], c = c0;
    *read_bytes = 0;
    while (c < c1) {
        if (bit_get(pg, c)) {
            c++;
            continue;
        }
        uint64_t e = c + 1;
        while (e < c1 && !bit_get(pg, e))
            e++;
        uint64_t lo = c << p->chunk_shift, hi = e << p->chunk_shift;
        if (hi > ext)
            hi = ext;
        uint64_t t0 = now_ns();
        int rc = p->src->read(p->src, r->base_off + (uint64_t)pg->idx * r->page_size + lo,
                              (size_t)(hi - lo), pg->frame + lo, err);
        r->st.read_ns += now_ns() - t0;
        if (rc)
            return jlm_err_prefix(err, rc, "%s page %u", r->name, pg->idx);
        r->st.reads++;
        r->st.bytes_read += hi - lo;
        *read_bytes += hi - lo;
        for (uint64_t k = c; k < e; k++)
            bit_set(pg, k);
        pg->n_filled += (uint32_t)(e - c);
        c = e;
    }
    return 0;
}

/* ---------------------------------------------------------------- prefetch */
/* The reader thread: one request at a time, read into the frame it was given. */
static void *pf_main(void *arg)
{
    jlm_pager *p = arg;
    pfetch *f = &p->pf;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->stop && f->state != PF_QUEUED)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->stop)
            break;
        uint64_t off = f->off, len = f->len;
        uint8_t *dst = f->dst;
        pthread_mutex_unlock(&f->mu);
        jlm_err err = {0};
        int rc = p->src->read(p->src, off, (size_t)len, dst, &err);
        pthread_mutex_lock(&f->mu);
        f->rc = rc;
        f->err = err;
        f->state = PF_DONE;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* Takes the finished prefetch into the pager (engine thread): the page's
 * chunks filled, its pin dropped, PAGE_IN emitted; on a read error the page
 * returns to ABSENT. wait 0: returns 0 at once if the read is unfinished.
 * Returns 1 if a prefetch was collected, -1 if it was and its read had
 * failed, 0 if none was; *waited_ns = time waited for it. */
static int pf_collect(jlm_pager *p, int wait, uint64_t *waited_ns)
{
    if (waited_ns)
        *waited_ns = 0;
    ppage *pg = p->pf_pg;
    if (!pg)
        return 0;
    pfetch *f = &p->pf;
    pthread_mutex_lock(&f->mu);
    if (f->state != PF_DONE) {
        if (!wait) {
            pthread_mutex_unlock(&f->mu);
            return 0;
        }
        uint64_t t0 = now_ns();
        while (f->state != PF_DONE)
            pthread_cond_wait(&f->cv, &f->mu);
        if (waited_ns)
            *waited_ns = now_ns() - t0 + 1;   /* nonzero: it waited */
    }
    int rc = f->rc;
    uint64_t len = f->len;
    f->state = PF_IDLE;
    pthread_mutex_unlock(&f->mu);
    p->pf_pg = NULL;
    parray *r = &p->arr[pg->array];
    assert(pg->frame && pg->pins > 0 && pg->n_filled == 0);
    pg->pins--;
    if (rc) {
        r->st.pf_failed++;
        if (pg->pins == 0)
            drop_frame(p, pg);
        return -1;
    }
    uint64_t n_chunks = (len + p->chunk - 1) >> p->chunk_shift;
    for (uint64_t c = 0; c < n_chunks; c++)
        bit_set(pg, c);
    pg->n_filled = (uint32_t)n_chunks;
    pg->pf_fresh = 1;
    r->st.reads++;
    r->st.bytes_read += len;
    r->st.page_ins++;
    if (pg->pins == 0)
        list_push_head(class_list(p, pg), pg);
    emit(p, JLM_PAGER_EV_PAGE_IN, pg, len, p->src->tier);
    return 1;
}

void jlm_pager_set_prefetch(jlm_pager *p, int on)
{
    if (!on)
        pf_collect(p, 1, NULL);
    p->pf_on = on != 0;
}

/* Bytes the budget can give a new frame: free bytes plus every unpinned frame. */
static uint64_t room_for_frames(jlm_pager *p)
{
    uint64_t unpinned = 0;
    for (int c = 0; c < 2; c++)
        for (const ppage *q = PG(p->lru[c].head); q; q = PG(q->ln.next))
            unpinned += p->arr[q->array].frame_len;
    return p->budget - p->resident_bytes + unpinned;
}

void jlm_pager_prefetch(jlm_pager *p, uint32_t array, uint32_t page)
{
    if (!p->pf_on || array >= p->n_arrays || page >= p->arr[array].n_pages)
        return;
    parray *r = &p->arr[array];
    ppage *pg = &r->pages[page];
    pf_collect(p, 0, NULL);
    if (pg->frame || pg == p->pf_pg)
        return;   /* resident (or on its way): nothing to read */
    if (p->pf_pg || (p->budget && room_for_frames(p) < r->frame_len)) {
        r->st.pf_skipped++;
        return;
    }
    if (!p->pf.started) {
        if (pthread_create(&p->pf.th, NULL, pf_main, p) != 0) {
            r->st.pf_skipped++;
            p->pf_on = 0;   /* no thread: reads stay on the engine thread */
            return;
        }
        p->pf.started = 1;
    }
    jlm_err err = {0};
    if (take_frame(p, pg, &err)) {   /* ENOMEM (room was checked) */
        r->st.pf_skipped++;
        return;
    }
    pg->pins = 1;                     /* held by the read: FILLING, never a victim */
    p->pf_pg = pg;
    r->st.pf_issued++;
    pthread_mutex_lock(&p->pf.mu);
    p->pf.off = r->base_off + (uint64_t)page * r->page_size;
    p->pf.len = r->extent[page];
    p->pf.dst = pg->frame;
    p->pf.rc = 0;
    p->pf.state = PF_QUEUED;
    pthread_cond_broadcast(&p->pf.cv);
    pthread_mutex_unlock(&p->pf.mu);
}

/* ---------------------------------------------------------------- get / unpin */
int jlm_pager_get(jlm_pager *p, uint32_t array, uint32_t page, uint64_t off, uint64_t len,
                  const void **ptr, jlm_err *err)
{
    if (array >= p->n_arrays || page >= p->arr[array].n_pages)
        return jlm_errf(err, JLM_EINVAL, "pager: array %u page %u out of range", array, page);
    parray *r = &p->arr[array];
    ppage *pg = &r->pages[page];
    uint64_t ext = r->extent[page];
    if (off > ext || len > ext - off)
        return jlm_errf(err, JLM_EINVAL, "pager: %s page %u: bytes [%llu, %llu) past the page's extent %llu",
                        r->name, page, (unsigned long long)off, (unsigned long long)(off + len),
                        (unsigned long long)ext);
    uint64_t c0 = off >> p->chunk_shift;
    uint64_t c1 = len ? (off + len + p->chunk - 1) >> p->chunk_shift : c0;
    int pf_waited = 0, mine = p->pf_pg == pg;
    /* the read in flight: this page's, or the source is needed here (it serves
     * one thread at a time); a hit on another page does not wait (experts
     * gotten while a block computes) */
    if (p->pf_pg && (mine || !pg->frame || missing(pg, c0, c1))) {
        uint64_t w;
        if (pf_collect(p, 1, &w) > 0 && mine && w) {
            pf_waited = 1;
            r->st.pf_waits++;
            r->st.pf_wait_ns += w;
        }
    }
    if (pg->pf_fresh) {
        pg->pf_fresh = 0;
        if (!pf_waited)
            r->st.pf_hits++;
    }
    int was_absent = pg->frame == NULL;
    if (was_absent) {
        int rc = take_frame(p, pg, err);
        if (rc)
            return rc;
    } else if (pg->pins == 0) {
        list_unlink(class_list(p, pg), pg);
    }
    uint64_t got = 0;
    int rc = fill_chunks(p, pg, c0, c1, &got, err);
    if (rc) {
        if (pg->n_filled == 0 && pg->pins == 0)
            drop_frame(p, pg);
        else if (pg->pins == 0)
            list_push_head(class_list(p, pg), pg);
        if (was_absent && pg->frame) {
            r->st.page_ins++;
            emit(p, JLM_PAGER_EV_PAGE_IN, pg, got, p->src->tier);
        }
        return rc;
    }
    pg->pins++;
    if (got && p->pf_on)
        r->st.pf_misses++;
    if (was_absent) {
        r->st.page_ins++;
        emit(p, JLM_PAGER_EV_PAGE_IN, pg, got, p->src->tier);
    } else if (got) {
        r->st.fills++;
        emit(p, JLM_PAGER_EV_FILL, pg, got, p->src->tier);
    } else {
        r->st.hits++;
        emit(p, JLM_PAGER_EV_HIT, pg, 0, JLM_TIER_FRAME);
    }
    *ptr = pg->frame + off;
    return 0;
}

void jlm_pager_unpin(jlm_pager *p, uint32_t array, uint32_t page)
{
    assert(array < p->n_arrays && page < p->arr[array].n_pages);
    ppage *pg = &p->arr[array].pages[page];
    assert(pg->frame && pg->pins > 0);
    if (!pg->frame || pg->pins == 0)
        return;
    if (--pg->pins == 0)
        list_push_head(class_list(p, pg), pg);
}

/* ---------------------------------------------------------------- configure, query */
uint64_t jlm_pager_min_budget(const jlm_pager *p, const uint32_t *n_pinned)
{
    uint64_t s = 0;
    for (uint32_t a = 0; a < p->n_arrays; a++)
        s += (uint64_t)n_pinned[a] * p->arr[a].frame_len;
    return s;
}

int jlm_pager_set_budget(jlm_pager *p, uint64_t budget, jlm_err *err)
{
    pf_collect(p, 1, NULL);
    if (budget) {
        uint64_t pinned = 0;
        for (uint32_t a = 0; a < p->n_arrays; a++)
            for (uint32_t i = 0; i < p->arr[a].n_pages; i++)
                if (p->arr[a].pages[i].pins)
                    pinned += p->arr[a].frame_len;
        if (pinned > budget)
            return jlm_errf(err, JLM_ERANGE, "pager: budget %llu bytes is below the %llu bytes of pinned pages",
                            (unsigned long long)budget, (unsigned long long)pinned);
    }
    p->budget = budget;
    while (budget && p->resident_bytes > budget) {
        ppage *v = pick_victim(p);
        assert(v);
        free(evict(p, v));
    }
    return 0;
}

void jlm_pager_set_evict_hook(jlm_pager *p, jlm_pager_evict_fn fn, void *ctx)
{
    p->evict_fn = fn;
    p->evict_ctx = ctx;
}

void jlm_pager_set_events(jlm_pager *p, jlm_pager_event_fn fn, void *ctx)
{
    p->ev_fn = fn;
    p->ev_ctx = ctx;
}

uint64_t jlm_pager_filled(const jlm_pager *p, uint32_t array, uint32_t page)
{
    if (array >= p->n_arrays || page >= p->arr[array].n_pages)
        return 0;
    const parray *r = &p->arr[array];
    const ppage *pg = &r->pages[page];
    uint64_t ext = r->extent[page], n = 0;
    for (uint64_t c = 0; (c << p->chunk_shift) < ext; c++)
        if (bit_get(pg, c)) {
            uint64_t hi = (c + 1) << p->chunk_shift;
            n += (hi > ext ? ext : hi) - (c << p->chunk_shift);
        }
    return n;
}

int jlm_pager_resident(const jlm_pager *p, uint32_t array, uint32_t page)
{
    return array < p->n_arrays && page < p->arr[array].n_pages && p->arr[array].pages[page].frame != NULL;
}

uint64_t jlm_pager_extent(const jlm_pager *p, uint32_t array, uint32_t page)
{
    return array < p->n_arrays && page < p->arr[array].n_pages ? p->arr[array].extent[page] : 0;
}

uint64_t jlm_pager_frame_len(const jlm_pager *p, uint32_t array)
{
    return array < p->n_arrays ? p->arr[array].frame_len : 0;
}

void jlm_pager_stats(const jlm_pager *p, jlm_pager_counters *out)
{
    memset(out, 0, sizeof *out);
    out->budget = p->budget;
    out->resident_bytes = p->resident_bytes;
    out->peak_bytes = p->peak_bytes;
    out->n_arrays = p->n_arrays;
    for (uint32_t a = 0; a < p->n_arrays; a++)
        out->a[a] = p->arr[a].st;
}

void jlm_pager_stats_reset(jlm_pager *p)
{
    p->peak_bytes = p->resident_bytes;
    for (uint32_t a = 0; a < p->n_arrays; a++) {
        jlm_pager_array_counters *s = &p->arr[a].st;
        uint32_t rp = s->resident_pages;
        uint64_t rb = s->resident_bytes;
        memset(s, 0, sizeof *s);
        s->resident_pages = rp;
        s->resident_bytes = rb;
    }
}

/* ---------------------------------------------------------------- check */
static int check_page(const jlm_pager *p, const parray *r, const ppage *pg, jlm_err *err)
{
    uint64_t n_chunks = (r->extent[pg->idx] + p->chunk - 1) >> p->chunk_shift, pop = 0;
    for (uint32_t w = 0; w < r->words; w++) {
        uint64_t first = (uint64_t)w * 64;
        uint64_t valid = n_chunks > first ? n_chunks - first : 0;
        uint64_t mask = valid >= 64 ? ~0ull : (1ull << valid) - 1;
        pop += (uint64_t)__builtin_popcountll(pg->bits[w]);
        if (pg->bits[w] & ~mask)
            return jlm_errf(err, JLM_EINVAL, "pager check (5): %s page %u: a chunk at or past %llu filled, page has %llu",
                            r->name, pg->idx, (unsigned long long)(first + valid), (unsigned long long)n_chunks);
    }
    if (pop != pg->n_filled)
        return jlm_errf(err, JLM_EINVAL, "pager check (5): %s page %u: %u chunks counted, bitmap holds %llu",
                        r->name, pg->idx, pg->n_filled, (unsigned long long)pop);
    if (!pg->frame && (pg->n_filled || pg->pins))
        return jlm_errf(err, JLM_EINVAL, "pager check (3): %s page %u absent with %u chunks, %u pins",
                        r->name, pg->idx, pg->n_filled, pg->pins);
    return 0;
}

static int check_lists(const jlm_pager *p, const uint32_t expect[2], jlm_err *err)
{
    for (int c = 0; c < 2; c++) {
        const plist *l = &p->lru[c];
        uint32_t n = 0;
        const ppage *prev = NULL;
        for (const ppage *pg = PG(l->head); pg; prev = pg, pg = PG(pg->ln.next)) {
            if (++n > expect[c] || PG(pg->ln.prev) != prev)
                return jlm_errf(err, JLM_EINVAL, "pager check (4): class %d list broken or longer than the %u unpinned pages",
                                c, expect[c]);
            if (!pg->frame || pg->pins || p->arr[pg->array].cls != c)
                return jlm_errf(err, JLM_EINVAL, "pager check (4): %s page %u listed with frame %p, %u pins",
                                p->arr[pg->array].name, pg->idx, (void *)pg->frame, pg->pins);
        }
        if (n != expect[c] || n != l->n || PG(l->tail) != prev)
            return jlm_errf(err, JLM_EINVAL, "pager check (4): class %d list holds %u pages (n %u), expected %u",
                            c, n, l->n, expect[c]);
    }
    return 0;
}

int jlm_pager_check(const jlm_pager *p, jlm_err *err)
{
    uint64_t bytes = 0;
    uint32_t unpinned[2] = { 0, 0 };
    for (uint32_t a = 0; a < p->n_arrays; a++) {
        const parray *r = &p->arr[a];
        uint64_t abytes = 0;
        for (uint32_t i = 0; i < r->n_pages; i++) {
            const ppage *pg = &r->pages[i];
            int rc = check_page(p, r, pg, err);
            if (rc)
                return rc;
            if (pg->frame) {
                abytes += r->frame_len;
                if (!pg->pins)
                    unpinned[r->cls]++;
            }
        }
        if (abytes != r->st.resident_bytes)
            return jlm_errf(err, JLM_EINVAL, "pager check (1): %s: %llu bytes of frames, counters say %llu",
                            r->name, (unsigned long long)abytes, (unsigned long long)r->st.resident_bytes);
        bytes += abytes;
    }
    if (bytes != p->resident_bytes)
        return jlm_errf(err, JLM_EINVAL, "pager check (1): %llu bytes of frames, resident_bytes %llu",
                        (unsigned long long)bytes, (unsigned long long)p->resident_bytes);
    if (p->budget && bytes > p->budget)
        return jlm_errf(err, JLM_EINVAL, "pager check (2): %llu bytes resident, budget %llu",
                        (unsigned long long)bytes, (unsigned long long)p->budget);
    return check_lists(p, unpinned, err);
}
