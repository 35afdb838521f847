/* devframes.c - device page frames under the pager's policy (devframes.h). */
#include "engine/devframes.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define DF(node) ((jlm_dframe *)(void *)(node))

void jlm_dframes_init(jlm_dframes *f, const jlm_dframes_ops *ops, void *ctx, const char *who)
{
    memset(f, 0, sizeof *f);
    f->ops = ops;
    f->ctx = ctx;
    f->who = who;
}

static void drop(jlm_dframes *f, jlm_dframe *d)
{
    if (d->buf)
        f->ops->drop(f->ctx, d);
    d->buf = NULL;
    d->aliased = 0;
}

void jlm_dframes_free(jlm_dframes *f)
{
    for (int a = 0; a < JLM_DF_ARRAYS; a++) {
        for (uint32_t i = 0; i < f->ntab[a]; i++) {
            if (f->tab[a][i])
                drop(f, f->tab[a][i]);
            free(f->tab[a][i]);
        }
        free(f->tab[a]);
        f->tab[a] = NULL;
        f->ntab[a] = 0;
    }
    drop(f, &f->dense);
}

/* RESIDENT, UNPINNED -> ABSENT on the device. */
static void evict(jlm_dframes *f, jlm_dframe *d)
{
    jlm_lru_unlink(&f->lru[d->cls], &d->ln);
    f->resident -= d->len;
    f->frames--;
    f->evictions++;
    drop(f, d);
    d->host = NULL;
}

void jlm_dframes_set_budget(jlm_dframes *f, uint64_t budget)
{
    f->budget = budget;
    jlm_lru_node *n;
    while (budget && f->resident > budget && (n = jlm_lru_victim(f->lru)))
        evict(f, DF(n));
}

void jlm_dframes_set_dense(jlm_dframes *f, const void *host, uint64_t len)
{
    drop(f, &f->dense);
    f->dense.host = host;
    f->dense.len = len;
}

void jlm_dframes_host_evicted(jlm_dframes *f, uint32_t array, uint32_t page, const void *frame)
{
    if (array >= JLM_DF_ARRAYS || page >= f->ntab[array])
        return;
    jlm_dframe *d = f->tab[array][page];
    if (d && d->buf && d->aliased && d->host == frame) {
        if (d->pins)   /* cannot happen: the device pin nests inside the host pin */
            abort();
        evict(f, d);   /* counted: the device frame is gone as well */
    }
}

static int page_in(jlm_dframes *f, jlm_dframe *d, const void *host, uint64_t len, jlm_err *err)
{
    d->aliased = 0;
    int rc = f->ops->page_in(f->ctx, d, host, len, err);
    if (rc) {
        d->buf = NULL;
        return rc;
    }
    d->host = host;
    d->len = len;
    f->page_ins++;
    return JLM_OK;
}

/* Evicts unpinned frames (the pager's victim order) until need more bytes
 * fit; JLM_ERANGE when only pinned frames remain. */
static int make_room(jlm_dframes *f, uint64_t need, uint32_t array, uint32_t page, jlm_err *err)
{
    while (f->budget && f->resident + need > f->budget) {
        jlm_lru_node *n = jlm_lru_victim(f->lru);
        if (!n)
            return jlm_errf(err, JLM_ERANGE,
                            "%s: --gpu-budget %llu bytes exhausted by pinned frames (%llu resident), "
                            "array %u page %u needs %llu more", f->who, (unsigned long long)f->budget,
                            (unsigned long long)f->resident, array, page, (unsigned long long)need);
        evict(f, DF(n));
    }
    return JLM_OK;
}

/* The record of (array, page), made on first use; NULL: err set. */
static jlm_dframe *record(jlm_dframes *f, uint32_t array, uint32_t page, jlm_err *err)
{
    if (page >= f->ntab[array]) {
        uint32_t n = page + 1 > f->ntab[array] * 2 ? page + 1 : f->ntab[array] * 2;
        jlm_dframe **t = realloc(f->tab[array], (size_t)n * sizeof *t);
        if (!t) {
            jlm_errf(err, JLM_ENOMEM, "%s: out of memory for %u page records", f->who, n);
            return NULL;
        }
        memset(t + f->ntab[array], 0, (size_t)(n - f->ntab[array]) * sizeof *t);
        f->tab[array] = t;
        f->ntab[array] = n;
    }
    jlm_dframe *d = f->tab[array][page];
    if (!d && !(d = f->tab[array][page] = calloc(1, sizeof *d)))
        jlm_errf(err, JLM_ENOMEM, "%s: out of memory", f->who);
    return d;
}

/* ABSENT -> RESIDENT (room made, paged in, counted); not pinned yet. */
static int bring_in(jlm_dframes *f, jlm_dframe *d, uint32_t array, uint32_t page, int cls, const void *host,
                    uint64_t len, jlm_err *err)
{
    d->cls = cls;
    int rc;
    if ((rc = make_room(f, len, array, page, err)) || (rc = page_in(f, d, host, len, err)))
        return rc;
    f->resident += len;
    if (f->resident > f->peak)
        f->peak = f->resident;
    f->frames++;
    return JLM_OK;
}

static void pin(jlm_dframes *f, jlm_dframe *d, const void *host)
{
    d->host = host;   /* a copied frame stays valid at any host frame */
    f->pinned[f->npinned++] = d;
    if (d->pins++ == 0)
        f->pinned_bytes += d->len;
}

static int bad_request(uint32_t array, int cls, const void *host, uint64_t len)
{
    return array >= JLM_DF_ARRAYS || cls < 0 || cls > 1 || !host || !len;
}

int jlm_dframes_get(jlm_dframes *f, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len,
                    jlm_err *err)
{
    if (bad_request(array, cls, host, len))
        return jlm_errf(err, JLM_EINVAL, "%s: array %u page %u class %d: bad request", f->who, array, page, cls);
    if (f->npinned >= JLM_DF_PIN_MAX)
        return jlm_errf(err, JLM_ERANGE, "%s: more than %d frames pinned at once", f->who, JLM_DF_PIN_MAX);
    jlm_dframe *d = record(f, array, page, err);
    if (!d)
        return JLM_ENOMEM;
    if (d->buf && (d->len != len || (d->aliased && d->host != host))) {
        if (d->pins)
            return jlm_errf(err, JLM_EINVAL, "%s: array %u page %u pinned at another frame", f->who, array, page);
        evict(f, d);   /* a different frame or extent: not the same page-in */
    }
    if (d->buf) {
        if (!d->pins)
            jlm_lru_unlink(&f->lru[d->cls], &d->ln);
        f->hits++;
    } else {
        int rc = bring_in(f, d, array, page, cls, host, len, err);
        if (rc)
            return rc;
    }
    pin(f, d, host);
    return JLM_OK;
}

int jlm_dframes_prefetch(jlm_dframes *f, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len)
{
    if (bad_request(array, cls, host, len) || f->npinned >= JLM_DF_PIN_MAX)
        return 0;
    jlm_err err = {0};
    jlm_dframe *d = record(f, array, page, &err);
    if (!d || d->buf)
        return 0;   /* resident already (or no memory for the record): nothing to start */
    /* room only from unpinned frames, as a get; a prefetch that would not
     * fit is not started (the get will page it in when its turn comes) */
    if (f->budget && f->pinned_bytes + len > f->budget)
        return 0;
    f->async = 1;
    int rc = bring_in(f, d, array, page, cls, host, len, &err);
    f->async = 0;
    if (rc)
        return 0;
    f->prefetches++;
    pin(f, d, host);
    return 1;
}

void jlm_dframes_discard(jlm_dframes *f, uint32_t array, uint32_t page)
{
    if (array >= JLM_DF_ARRAYS || page >= f->ntab[array] || !f->tab[array][page])
        return;
    jlm_dframe *d = f->tab[array][page];
    if (d->buf && !d->pins)
        evict(f, d);
}

void jlm_dframes_put(jlm_dframes *f, uint32_t array, uint32_t page)
{
    if (array >= JLM_DF_ARRAYS || page >= f->ntab[array] || !f->tab[array][page])
        return;
    jlm_dframe *d = f->tab[array][page];
    if (!d->pins)
        return;
    for (uint32_t i = f->npinned; i-- > 0;)
        if (f->pinned[i] == d) {
            f->pinned[i] = f->pinned[--f->npinned];
            break;
        }
    if (--d->pins == 0) {
        f->pinned_bytes -= d->len;
        jlm_lru_push_head(&f->lru[d->cls], &d->ln);
    }
}

static int holds(const jlm_dframe *d, const uint8_t *q, uint64_t n)
{
    return d->host && q >= d->host && q - d->host <= (ptrdiff_t)d->len && n <= d->len - (uint64_t)(q - d->host);
}

jlm_dframe *jlm_dframes_frame_of(jlm_dframes *f, const void *p, uint64_t n, jlm_err *err)
{
    const uint8_t *q = p;
    for (uint32_t i = 0; i < f->npinned; i++)
        if (holds(f->pinned[i], q, n))
            return f->pinned[i];
    jlm_dframe *d = &f->dense;
    if (!holds(d, q, n))
        return NULL;
    if (!d->buf && page_in(f, d, d->host, d->len, err))
        return NULL;
    return d;
}
