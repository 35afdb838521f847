/* budget.c - one frame budget over every served model (contract and lock
 * order in srv_int.h, srv_budget). The pager stays one per engine and
 * single-threaded: the budget only moves its byte limit, on the worker's own
 * thread or under the model's pager_mu while its worker is between steps. */
#include "serve/srv_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void jlm_srv_budget_init(srv_budget *b, uint64_t total)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    b->total = total;
}

void jlm_srv_budget_fini(srv_budget *b)
{
    free(b->m);
    pthread_mutex_destroy(&b->mu);
}

/* Bytes of every page of the model: what it takes to hold it all. */
static uint64_t all_pages(const jlm_engine *e)
{
    const jlm_header *h = &jlm_engine_model(e)->hdr;
    return h->page_size * h->n_blocks + h->vis_page_size * h->n_vis_blocks + h->exp_page_size * h->n_exp_pages;
}

/* The engine's minimum working set (engine/model.c open_pager): one block
 * frame with the routed experts' frames, or one vision block. */
static uint64_t min_pages(jlm_engine *e)
{
    const jlm_config *c = &jlm_engine_model(e)->config;
    uint32_t pins[3] = {1, 0, c->n_expert ? c->n_expert_used : 0}, vis[3] = {0, 1, 0};
    uint64_t a = jlm_pager_min_budget(jlm_engine_pager(e), pins), v = jlm_pager_min_budget(jlm_engine_pager(e), vis);
    return a > v ? a : v;
}

static uint64_t granted(const srv_budget *b)
{
    uint64_t g = 0;
    for (size_t i = 0; i < b->n; i++) g += b->m[i]->grant;
    return g;
}

static int busy(srv_model *m)
{
    pthread_mutex_lock(&m->mu);
    int r = m->running > 0 || m->q_len > 0;
    pthread_mutex_unlock(&m->mu);
    return r;
}

/* Lowers v's grant by up to `want` bytes, not below its floor; the bytes it
 * gave. Caller holds b->mu; v's worker is not the caller. */
static uint64_t take_from(srv_model *v, uint64_t floor, uint64_t want)
{
    if (v->grant <= floor)
        return 0;
    uint64_t give = v->grant - floor < want ? v->grant - floor : want;
    pthread_mutex_lock(&v->pager_mu);
    jlm_pager *p = jlm_engine_pager(v->e);
    jlm_pager_counters before, after;
    jlm_pager_stats(p, &before);
    jlm_err err = {0};
    uint64_t g = v->grant - give;
    jlm_srv_pcache_shrink(v, g - v->floor);   /* its prefix cache lives inside the grant (prefix.c) */
    if (jlm_pager_set_budget(p, g - v->pcache.bytes, &err)) {   /* only if pages were pinned: never between steps */
        pthread_mutex_unlock(&v->pager_mu);
        return 0;
    }
    v->grant = g;
    jlm_pager_stats(p, &after);
    pthread_mutex_lock(&v->mu);
    v->pc = after;   /* /metrics sees the eviction now, not after v's next step */
    pthread_mutex_unlock(&v->mu);
    pthread_mutex_unlock(&v->pager_mu);
    atomic_fetch_add(&v->n_reclaims, 1);
    atomic_fetch_add(&v->reclaimed_bytes, before.resident_bytes - after.resident_bytes);
    return give;
}

static int by_last_use(const void *a, const void *b)
{
    uint64_t x = (*(srv_model *const *)a)->last_use, y = (*(srv_model *const *)b)->last_use;
    return x < y ? -1 : x > y;
}

/* Frees `need` bytes of grant for m (caller holds b->mu): the other models
 * in LRU order, idle ones to their minimum, busy ones to an even share. */
static void reclaim(srv_budget *b, srv_model *m, uint64_t need)
{
    srv_model *v[b->n ? b->n : 1];
    int act[b->n ? b->n : 1];
    size_t n = 0, n_busy = 1;   /* m itself */
    for (size_t i = 0; i < b->n; i++)
        if (b->m[i] != m) v[n++] = b->m[i];
    qsort(v, n, sizeof *v, by_last_use);
    for (size_t i = 0; i < n; i++)
        n_busy += (size_t)(act[i] = busy(v[i]));
    uint64_t share = b->total / n_busy;
    for (size_t i = 0; i < n && need; i++) {
        uint64_t floor = v[i]->floor;
        if (act[i]) {
            uint64_t s = share < v[i]->want ? share : v[i]->want;
            if (s > floor) floor = s;
        }
        need -= take_from(v[i], floor, need);
    }
}

int jlm_srv_budget_join(srv_budget *b, srv_model *m, jlm_err *err)
{
    pthread_mutex_lock(&b->mu);
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8;
        srv_model **t = realloc(b->m, cap * sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&b->mu);
            return jlm_errf(err, JLM_ENOMEM, "out of memory");
        }
        b->m = t;
        b->cap = cap;
    }
    m->want = all_pages(m->e);
    m->floor = min_pages(m->e);
    if (m->floor > m->want) m->want = m->floor;
    m->last_use = ++b->clock;
    m->grant = 0;
    if (b->total) {
        uint64_t floors = m->floor;
        for (size_t i = 0; i < b->n; i++) floors += b->m[i]->floor;
        if (floors > b->total) {
            fprintf(stderr, "note: --budget %llu bytes is below the served models' minimum working sets together: "
                    "raised to %llu\n", (unsigned long long)b->total, (unsigned long long)floors);
            b->total = floors;
        }
        uint64_t g = granted(b);
        if (g + m->floor > b->total)
            reclaim(b, m, g + m->floor - b->total);
        m->grant = m->floor;
        jlm_err e2 = {0};
        jlm_pager_set_budget(jlm_engine_pager(m->e), m->grant, &e2);   /* nothing pinned yet: cannot fail */
    }
    b->m[b->n++] = m;
    m->in_budget = 1;
    pthread_mutex_unlock(&b->mu);
    return 0;
}

void jlm_srv_budget_leave(srv_budget *b, srv_model *m)
{
    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < b->n; i++)
        if (b->m[i] == m) {
            memmove(b->m + i, b->m + i + 1, (b->n - i - 1) * sizeof *b->m);
            b->n--;
            break;
        }
    m->in_budget = 0;
    m->grant = 0;
    pthread_mutex_unlock(&b->mu);
}

void jlm_srv_budget_acquire(srv_budget *b, srv_model *m)
{
    pthread_mutex_lock(&b->mu);
    m->last_use = ++b->clock;
    uint64_t want = m->want + m->pcache.bytes;   /* its pages, and its prefix cache beside them */
    if (b->total && m->grant < want) {
        uint64_t g = granted(b), free_b = b->total > g ? b->total - g : 0, need = want - m->grant;
        if (free_b < need)
            reclaim(b, m, need - free_b);
        g = granted(b);
        free_b = b->total > g ? b->total - g : 0;
        uint64_t grow = free_b < need ? free_b : need;
        if (grow) {
            jlm_err err = {0};
            if (!jlm_pager_set_budget(jlm_engine_pager(m->e), m->grant + grow - m->pcache.bytes, &err))   /* growing */
                m->grant += grow;
        }
    }
    pthread_mutex_unlock(&b->mu);
}
