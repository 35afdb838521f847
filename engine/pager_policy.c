/* pager_policy.c - the expert victim of the pager's eviction (invariant 7:
 * experts first) under the policy in force (engine/xpolicy.h): LRU, the
 * tail of the expert list; LFU, the lowest decaying count; NEXT, the
 * latest expected next use; AUTO, whichever of LFU at six half-lives and
 * NEXT its shadows choose (engine/xadapt.h); the last three found by a
 * scan of the resident unpinned experts from the least recently used end
 * (a model has hundreds to thousands of expert pages; a scan runs once per
 * expert read, which moves a page of megabytes). */
#include "engine/pager_int.h"

void jlm_pager_set_expert_policy(jlm_pager *p, int policy, double half_life)
{
    p->xp = policy == JLM_XP_LFU || policy == JLM_XP_NEXT || policy == JLM_XP_AUTO ? policy : JLM_XP_LRU;
    p->xp_half = half_life > 0 ? half_life : 1.0;
    jlm_xa_free(p->xa);   /* AUTO's shadows start again at its next get */
    p->xa = NULL;
}

void jlm_pager_set_expert_blocks(jlm_pager *p, uint32_t per_block, uint32_t used_per_block)
{
    uint32_t n = 0;
    for (uint32_t a = 0; a < p->n_arrays; a++)
        if (p->arr[a].cls == JLM_PAGER_EXPERT)
            n = p->arr[a].n_pages;
    int cycle = per_block && n && n % per_block == 0;
    p->xp_per_block = cycle ? per_block : 0;
    p->xp_blocks = cycle ? n / per_block : 1;
    p->xp_gets = (double)p->xp_blocks * (used_per_block ? used_per_block : 1);
}

int jlm_pager_expert_policy(const jlm_pager *p)
{
    return p->xp;
}

double jlm_pager_expert_half_life(const jlm_pager *p)
{
    double gets = p->xp == JLM_XP_LRU ? 0 : p->xa ? jlm_xa_half(p->xa) : p->xp_half;
    return gets / (p->xp_gets > 0 ? p->xp_gets : 1);
}

/* AUTO: the shadows see every expert get with the cache's expert pages as
 * their capacity (they evict when it does not grow). Made at the first get
 * (the routing's width is known then); out of memory: LFU from there on. */
static void xa_get(jlm_pager *p, const parray *r, uint32_t idx)
{
    if (!p->xa) {
        uint32_t used = p->xp_blocks ? (uint32_t)(p->xp_gets / p->xp_blocks) : 1;
        if (!(p->xa = jlm_xa_new(r->n_pages, used, p->xp_per_block))) {
            p->xp = JLM_XP_LFU;
            return;
        }
    }
    jlm_xa_get(p->xa, idx, p->xp_clock, r->st.resident_pages);
}

void jlm_pgp_touch(jlm_pager *p, ppage *pg)
{
    const parray *r = &p->arr[pg->array];
    if (r->cls != JLM_PAGER_EXPERT)
        return;
    if (p->xp == JLM_XP_AUTO)
        xa_get(p, r, pg->idx);
    pg->xp_key = jlm_xp_touch(pg->xp_key, p->xp_clock++, p->xp_half);
    p->xp_cur = pg->idx;
}

/* JLM_XP_NEXT: a page's block in the cycle (0 without one). */
static uint32_t xp_block(const jlm_pager *p, uint32_t idx)
{
    return p->xp_per_block ? idx / p->xp_per_block : 0;
}

/* How soon q goes (the larger, the sooner) under the policy in force:
 * LFU the key's opposite, NEXT its score, AUTO its shadows' pick's (cur:
 * the expert page being read, else the last gotten). */
static double xp_rank(const jlm_pager *p, const ppage *q, uint32_t cur, double window)
{
    if (p->xa)
        return jlm_xa_rank(p->xa, q->idx, p->xp_clock, cur);
    if (p->xp == JLM_XP_NEXT)
        return jlm_xp_next_score(q->xp_key, p->xp_clock, p->xp_half, window, xp_block(p, q->idx), xp_block(p, cur),
                                 p->xp_blocks);
    return -q->xp_key;
}

ppage *jlm_pgp_expert_victim(jlm_pager *p, const ppage *skip)
{
    ppage *x = p->lru[JLM_PAGER_EXPERT].tail;
    if (x && x == skip)
        x = x->prev;
    if (!x || p->xp == JLM_XP_LRU)
        return x;
    ppage *best = NULL;
    uint32_t cur = skip && p->arr[skip->array].cls == JLM_PAGER_EXPERT ? skip->idx : p->xp_cur;
    double window = jlm_xp_window(p->xp_half, p->xp_gets), br = 0;
    for (ppage *q = x; q; q = q->prev) {   /* strict >: ties to the least recent */
        if (q == skip || (q->pf_fresh && !q->pf_low))   /* read ahead: kept; a background read is not */
            continue;
        double r = xp_rank(p, q, cur, window);
        if (!best || r > br)
            best = q, br = r;
    }
    return best ? best : x;   /* only pages read ahead and not yet gotten: the least recent */
}
