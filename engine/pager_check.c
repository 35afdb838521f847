/* pager_check.c - the pager's queries (filled, resident, extent, frame
 * length, counters) and jlm_pager_check, the invariants of pager.h checked
 * over every record (tests, fuzzing). See pager_int.h. */
#include "engine/pager_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

uint64_t jlm_pager_charge(const jlm_pager *p, uint32_t array, uint32_t page)
{
    if (array >= p->n_arrays || page >= p->arr[array].n_pages)
        return 0;
    const parray *r = &p->arr[array];
    const ppage *pg = &r->pages[page];
    return chunk_top(p, r, pg, page_chunks(p, r, pg));
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

uint64_t jlm_pager_bytes(const jlm_pager *p)
{
    return p->all_bytes;
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

/* Bytes the budget can give pg: free bytes plus every other unpinned page's. */
uint64_t jlm_pg_room_for(const jlm_pager *p, const ppage *pg)
{
    uint64_t unpinned = p->lru[0].held + p->lru[1].held - (jlm_pg_listed(p, pg) ? pg->held : 0);
    for (uint64_t c = 0; p->adv && p->adv->pins && c < p->adv->rel; c++)   /* the advancing page's released chunks */
        if (bit_get(p->adv, c))
            unpinned += chunk_top(p, &p->arr[p->adv->array], p->adv, c + 1) - chunk_lo(p, c);
    return p->budget - p->resident_bytes + unpinned;
}

/* ---------------------------------------------------------------- check */
/* Bytes of the page's filled chunks. */
static uint64_t filled_bytes(const jlm_pager *p, const parray *r, const ppage *pg)
{
    uint64_t n = 0, nc = page_chunks(p, r, pg);
    for (uint64_t c = 0; c < nc; c++)
        if (bit_get(pg, c))
            n += chunk_top(p, r, pg, c + 1) - chunk_lo(p, c);
    return n;
}

/* Invariant (8): no memory of the frame outside its filled chunks is mapped
 * (mincore: 1 per resident 4096-byte page), but for what a whole huge page
 * maps past the extent (jlm_pg_frame_whole). Not checked for the page whose
 * prefetch is in flight (the reader is writing it). */
static int check_frame_memory(const jlm_pager *p, const parray *r, const ppage *pg, jlm_err *err)
{
    size_t n = (size_t)(r->frame_len / PAGER_ALIGN);
    unsigned char *vec = malloc(n);
    if (!vec)
        return 0;   /* cannot tell: not a broken invariant */
    if (mincore(pg->frame, (size_t)r->frame_len, vec) != 0) {
        free(vec);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t c = ((uint64_t)i * PAGER_ALIGN) >> p->chunk_shift;
        int past = (uint64_t)i * PAGER_ALIGN >= r->extent[pg->idx];
        int filled = (!past && bit_get(pg, c)) || (past && jlm_pg_frame_whole(p, r, pg));
        if ((vec[i] & 1) && !filled) {
            free(vec);
            return jlm_errf(err, JLM_EINVAL, "pager check (8): %s page %u: frame byte %llu is mapped, chunk %llu not filled",
                            r->name, pg->idx, (unsigned long long)i * PAGER_ALIGN, (unsigned long long)c);
        }
    }
    free(vec);
    return 0;
}

static int check_page(const jlm_pager *p, const parray *r, const ppage *pg, jlm_err *err)
{
    uint64_t n_chunks = page_chunks(p, r, pg), pop = 0;
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
    if (!pg->frame && (pg->n_filled || pg->pins || pg->held))
        return jlm_errf(err, JLM_EINVAL, "pager check (3): %s page %u absent with %u chunks, %u pins, %llu bytes held",
                        r->name, pg->idx, pg->n_filled, pg->pins, (unsigned long long)pg->held);
    uint64_t want = filled_bytes(p, r, pg) + (pg->pf_in ? p->pf.slot[pg->pf_in - 1].len : 0);
    if (pg->held != want)
        return jlm_errf(err, JLM_EINVAL, "pager check (1): %s page %u holds %llu bytes, its filled chunks%s are %llu",
                        r->name, pg->idx, (unsigned long long)pg->held, pg->pf_in ? " and the read in flight" : "",
                        (unsigned long long)want);
    if (pg->frame && !pg->pins && !pg->n_filled)
        return jlm_errf(err, JLM_EINVAL, "pager check (4): %s page %u unpinned with a frame and nothing filled",
                        r->name, pg->idx);
    if (pg->frame && !pg->pf_in)
        return check_frame_memory(p, r, pg, err);
    return 0;
}

static int check_lists(const jlm_pager *p, const uint32_t expect[2], jlm_err *err)
{
    for (int c = 0; c < 2; c++) {
        const plist *l = &p->lru[c];
        uint32_t n = 0;
        uint64_t held = 0;
        const ppage *prev = NULL;
        for (const ppage *pg = l->head; pg; prev = pg, pg = pg->next) {
            held += pg->held;
            if (++n > expect[c] || pg->prev != prev)
                return jlm_errf(err, JLM_EINVAL, "pager check (4): class %d list broken or longer than the %u unpinned pages",
                                c, expect[c]);
            if (!pg->frame || pg->pins || p->arr[pg->array].cls != c)
                return jlm_errf(err, JLM_EINVAL, "pager check (4): %s page %u listed with frame %p, %u pins",
                                p->arr[pg->array].name, pg->idx, (void *)pg->frame, pg->pins);
        }
        if (n != expect[c] || n != l->n || l->tail != prev)
            return jlm_errf(err, JLM_EINVAL, "pager check (4): class %d list holds %u pages (n %u), expected %u",
                            c, n, l->n, expect[c]);
        if (held != l->held)
            return jlm_errf(err, JLM_EINVAL, "pager check (4): class %d list's pages hold %llu bytes, its count says %llu",
                            c, (unsigned long long)held, (unsigned long long)l->held);
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
        uint32_t apages = 0;
        for (uint32_t i = 0; i < r->n_pages; i++) {
            const ppage *pg = &r->pages[i];
            int rc = check_page(p, r, pg, err);
            if (rc)
                return rc;
            abytes += pg->held;
            if (pg->frame) {
                apages++;
                if (!pg->pins)
                    unpinned[r->cls]++;
            }
        }
        if (abytes != r->st.resident_bytes || apages != r->st.resident_pages)
            return jlm_errf(err, JLM_EINVAL, "pager check (1): %s: %llu bytes held in %u frames, counters say %llu in %u",
                            r->name, (unsigned long long)abytes, apages, (unsigned long long)r->st.resident_bytes,
                            r->st.resident_pages);
        bytes += abytes;
    }
    if (bytes != p->resident_bytes)
        return jlm_errf(err, JLM_EINVAL, "pager check (1): %llu bytes held, resident_bytes %llu",
                        (unsigned long long)bytes, (unsigned long long)p->resident_bytes);
    if (p->budget && bytes > p->budget)
        return jlm_errf(err, JLM_EINVAL, "pager check (2): %llu bytes resident, budget %llu",
                        (unsigned long long)bytes, (unsigned long long)p->budget);
    return check_lists(p, unpinned, err);
}
