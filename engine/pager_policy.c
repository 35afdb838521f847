/* pager_policy.c - the expert victim of the pager's eviction (invariant 7:
 * experts first) under the policy in force (engine/xpolicy.h): LRU, the
 * tail of the expert list; LFU, the lowest decaying count; NEXT, the
 * latest expected next use; AUTO, whichever of LFU at six half-lives and
 * NEXT its shadows choose (engine/xadapt.h); the last three found by a
 * scan of the resident unpinned experts from the least recently used end
 * (a model has hundreds to thousands of expert pages; a scan runs once per
 * expert read, which moves a page of megabytes). Under each, an expert read
 * takes a victim whose frame fits it when one ranks close enough to the
 * policy's (xp_fits, XP_FIT_SHARE). */
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

/* Whether q, an unpinned expert page, may be the victim: any but skip under
 * LRU; under the others a page read ahead and not yet gotten is kept (a
 * background read's is not). */
static int xp_candidate(const jlm_pager *p, const ppage *q, const ppage *skip)
{
    return q != skip && (p->xp == JLM_XP_LRU || !(q->pf_fresh && !q->pf_low));
}

/* The bytes of its frame that expert page pg (skip of the victim's scan,
 * absent) would be charged and mapped whole: its extent, or for a one huge
 * frame its huge pages (chunk_top's rule for a page mapped now). */
static uint64_t xp_want_span(const jlm_pager *p, const ppage *pg)
{
    uint64_t ext = p->arr[pg->array].extent[pg->idx];
    return jlm_pg_want_huge(p, ext) ? jlm_pg_huge_end(p, ext) : ext;
}

/* Whether expert page pg (of `span` bytes: xp_want_span) taking q's frame
 * (take_frame) keeps its memory as it is: the same array, and the span q's
 * frame is charged and mapped (chunk_top of its whole page). Else the frame
 * gives bytes back, or maps new ones whose every 4 KiB page's first touch a
 * shadowing hypervisor charges (~10 us each: 0.7 ms for the 278 KB that
 * moe-1g's two expert sizes differ by), and a smaller victim leaves the
 * budget short by the difference: make_room evicts a second page for it,
 * whose frame goes. */
static int xp_fits(const jlm_pager *p, const ppage *q, const ppage *pg, uint64_t span)
{
    const parray *r = &p->arr[q->array];
    return q->array == pg->array && chunk_top(p, r, q, page_chunks(p, r, q)) == span;
}

/* The ranks above which the best victim that fits (xp_fits) is still
 * taken, as a share of the candidates: a quarter. Past it the policy's own
 * victim is, so that pages of one size are not held by the ones of their
 * size alone (the frames' split between sizes follows the routing). */
#define XP_FIT_SHARE 0.25

/* A candidate's rank under the policy in force (the larger, the sooner it
 * goes): LRU, its place from the least recent end (pos). */
static double xp_order(const jlm_pager *p, const ppage *q, uint32_t pos, uint32_t cur, double window)
{
    return p->xp == JLM_XP_LRU ? -(double)pos : xp_rank(p, q, cur, window);
}

/* The policy's victim (LRU: the least recent page; the others: the highest
 * rank, pages read ahead and not yet gotten kept), unless skip, the expert
 * page to be read, has a candidate that fits it (xp_fits) no more than
 * XP_FIT_SHARE of the candidates rank above: then the best of those.
 * Issue 42's moe-1g at 25%: decode 1.10-1.15x (its experts come in two
 * sizes), bytes read within 3% either way. */
ppage *jlm_pgp_expert_victim(jlm_pager *p, const ppage *skip)
{
    ppage *x = p->lru[JLM_PAGER_EXPERT].tail;
    if (x && x == skip)
        x = x->prev;
    if (!x)
        return x;
    int lru = p->xp == JLM_XP_LRU, fit = skip && p->arr[skip->array].cls == JLM_PAGER_EXPERT;
    if (lru && !fit)
        return x;
    ppage *best = lru ? x : NULL, *same = NULL;
    uint32_t cur = fit ? skip->idx : p->xp_cur, n = 0, pos = 0;
    uint64_t span = fit ? xp_want_span(p, skip) : 0;
    double window = jlm_xp_window(p->xp_half, p->xp_gets), br = 0, bs = 0;
    for (ppage *q = x; q; q = q->prev, pos++) {   /* strict >: ties to the least recent */
        if (!xp_candidate(p, q, skip))
            continue;
        double r = xp_order(p, q, pos, cur, window);
        n++;
        if (!lru && (!best || r > br))
            best = q, br = r;
        if (fit && xp_fits(p, q, skip, span) && (!same || r > bs))
            same = q, bs = r;
    }
    if (same && same != best) {   /* the candidates ranked above it (a second scan: bs is known now) */
        uint32_t above = 0;
        pos = 0;
        for (ppage *q = x; q; q = q->prev, pos++)
            if (xp_candidate(p, q, skip) && xp_order(p, q, pos, cur, window) > bs)
                above++;
        if (above <= XP_FIT_SHARE * n)
            return same;
    }
    return best ? best : x;   /* only pages read ahead and not yet gotten: the least recent */
}
