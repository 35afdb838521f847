/* prefix.c - the prefix cache of a served model (contract in srv_int.h,
 * srv_pcache): KV of finished requests kept for later ones that share a
 * prefix with them (a chat's next turn carries the previous turns). Entries
 * are few (each is a whole conversation so far), so a lookup compares the
 * token lists directly; the prefix taken is whole blocks of
 * JLM_SRV_PCACHE_BLOCK tokens (a shared BOS alone is no reuse). */
#include "serve/srv_int.h"

#include <stdlib.h>
#include <string.h>

static uint32_t common(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb)
{
    uint32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

const srv_pentry *jlm_srv_pcache_find(srv_model *m, const int32_t *tok, uint32_t n, uint32_t *shared)
{
    srv_pcache *c = &m->pcache;
    srv_pentry *best = NULL;
    uint32_t best_n = 0;
    for (size_t i = 0; n > 1 && i < c->n; i++) {
        uint32_t k = common(c->e[i].tok, c->e[i].n, tok, n - 1);
        if (k > best_n) { best = &c->e[i]; best_n = k; }
    }
    best_n -= best_n % JLM_SRV_PCACHE_BLOCK;
    if (!best_n)
        best = NULL;
    if (best) best->last_use = ++c->clock;
    *shared = best_n;
    return best;
}

static void drop(srv_pcache *c, size_t i)
{
    c->bytes -= c->e[i].bytes;
    free(c->e[i].tok);
    free(c->e[i].kv);
    c->e[i] = c->e[--c->n];
}

void jlm_srv_pcache_shrink(srv_model *m, uint64_t room)
{
    srv_pcache *c = &m->pcache;
    while (c->n && c->bytes > room) {
        size_t lru = 0;
        for (size_t i = 1; i < c->n; i++)
            if (c->e[i].last_use < c->e[lru].last_use) lru = i;
        drop(c, lru);
    }
    atomic_store(&m->pcache_bytes, c->bytes);
}

void jlm_srv_pcache_fit_pager(srv_model *m)
{
    if (!m->grant)
        return;   /* no budget: the pager is unlimited */
    jlm_err err = {0};
    jlm_pager_set_budget(jlm_engine_pager(m->e), m->grant - m->pcache.bytes, &err);   /* between steps: nothing pinned */
}

/* The bytes the cache may hold: its limit, and under a budget what the
 * model's grant leaves above its minimum working set. */
static uint64_t room_of(const srv_model *m)
{
    uint64_t room = m->pcache.limit;
    if (m->grant) {
        uint64_t g = m->grant > m->floor ? m->grant - m->floor : 0;
        if (g < room) room = g;
    }
    return room;
}

void jlm_srv_pcache_put(srv_model *m, jlm_engine_seq *seq, const int32_t *tok, uint32_t n)
{
    srv_pcache *c = &m->pcache;
    if (!c->limit || !n || !jlm_engine_kv_bytes(m->e, 1))
        return;   /* no limit, nothing to keep, or a cache that cannot be saved (latent attention) */
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].n >= n && common(c->e[i].tok, c->e[i].n, tok, n) == n) {
            c->e[i].last_use = ++c->clock;   /* already held whole */
            return;
        }
    uint64_t bytes = jlm_engine_kv_bytes(m->e, n) + (uint64_t)n * sizeof *tok, room = room_of(m);
    if (bytes > room)
        return;
    for (size_t i = c->n; i-- > 0;)
        if (common(c->e[i].tok, c->e[i].n, tok, n) == c->e[i].n)
            drop(c, i);   /* the new entry extends it */
    jlm_srv_pcache_shrink(m, room - bytes);
    srv_pentry e = {.n = n, .bytes = bytes, .last_use = ++c->clock};
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        srv_pentry *t = realloc(c->e, cap * sizeof *t);
        if (!t)
            return;
        c->e = t;
        c->cap = cap;
    }
    e.tok = malloc((size_t)n * sizeof *tok);
    e.kv = malloc(jlm_engine_kv_bytes(m->e, n));
    if (!e.tok || !e.kv) {
        free(e.tok);
        free(e.kv);
        return;
    }
    memcpy(e.tok, tok, (size_t)n * sizeof *tok);
    jlm_err err;
    if (jlm_engine_kv_save(m->e, seq, n, e.kv, &err)) {   /* a device's copy failed: nothing kept */
        free(e.tok);
        free(e.kv);
        return;
    }
    c->e[c->n++] = e;
    c->bytes += bytes;
    atomic_store(&m->pcache_bytes, c->bytes);
    jlm_srv_pcache_fit_pager(m);
}

void jlm_srv_pcache_free(srv_model *m)
{
    jlm_srv_pcache_shrink(m, 0);
    free(m->pcache.e);
    m->pcache.e = NULL;
    m->pcache.cap = 0;
}
