/* pager_policy.c - the expert victim of the pager's eviction (invariant 7:
 * experts first) under the policy in force (engine/xpolicy.h): LRU, the
 * tail of the expert list; LFU, the lowest decaying count, found by a scan
 * of the resident unpinned experts from the least recently used end (a
 * model has hundreds to thousands of expert pages; a scan runs once per
 * expert read, which moves a page of megabytes). */
#include "engine/pager_int.h"

void jlm_pager_set_expert_policy(jlm_pager *p, int policy, double half_life)
{
    p->xp = policy == JLM_XP_LFU ? JLM_XP_LFU : JLM_XP_LRU;
    p->xp_half = half_life > 0 ? half_life : 1.0;
}

int jlm_pager_expert_policy(const jlm_pager *p)
{
    return p->xp;
}

void jlm_pgp_touch(jlm_pager *p, ppage *pg)
{
    if (p->arr[pg->array].cls != JLM_PAGER_EXPERT)
        return;
    pg->xp_key = jlm_xp_touch(pg->xp_key, p->xp_clock++, p->xp_half);
}

ppage *jlm_pgp_expert_victim(jlm_pager *p, const ppage *skip)
{
    ppage *x = p->lru[JLM_PAGER_EXPERT].tail;
    if (x && x == skip)
        x = x->prev;
    if (!x || p->xp == JLM_XP_LRU)
        return x;
    ppage *best = NULL;
    for (ppage *q = x; q; q = q->prev)   /* strict <: ties to the least recent */
        if (q != skip && !q->pf_fresh && (!best || q->xp_key < best->xp_key))
            best = q;
    return best ? best : x;   /* only pages read ahead and not yet gotten: the least recent */
}
