/* xpolicy.h - the expert cache's replacement policies: which unpinned
 * expert page the pager evicts first (pager.h's invariant 7 names the
 * expert class; this header says which of its pages), shared by the pager
 * (engine/pager_policy.c) and the routing replay (bench/routing_replay.c),
 * so the bench measures the engine's own rule.
 *
 *  - JLM_XP_LRU: the least recently used expert.
 *  - JLM_XP_LFU: the expert with the lowest decaying count. Each get adds 1
 *    to its page's count, and every count halves every `half_life` expert
 *    gets (the pager's clock counts the gets of expert pages); ties go to
 *    the least recently used. A page read ahead and not
 *    yet gotten is a victim only when no other is left (it was read for a
 *    use about to come).
 *  - JLM_XP_AUTO (the default): LFU with the half-life, from one get
 *    (recency) to 4 gets per expert page, or NEXT, whichever would have
 *    read least lately, chosen by shadow caches of each (engine/xadapt.h).
 *  - JLM_XP_NEXT: the expert whose next use is expected last. The MoE
 *    blocks run in a cycle, one routing each a token, so an expert of the
 *    block d steps ahead of the current one (1 <= d <= n_blocks; the
 *    current block's own is a whole cycle away) routed at a rate r a token
 *    is next used in d + n_blocks (1/r - 1) block steps on average. r is
 *    the decaying count over the count of an expert routed every token
 *    (the window, jlm_xp_window); the count is LFU's key, with its own
 *    half-life (JLM_XP_NEXT_HALF_LIFE). Ties, and pages read ahead, as LFU.
 *
 * A count is kept as one key, log2(count) + t / half_life with t the clock
 * at its last get: the decay of all counts is the same factor, so comparing
 * keys compares decayed counts at any later time, with no pass over the
 * pages. Header-only, no allocation, cannot fail. */
#ifndef JLM_ENGINE_XPOLICY_H
#define JLM_ENGINE_XPOLICY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

enum jlm_xpolicy {
    JLM_XP_LRU = 0,
    JLM_XP_LFU = 1,
    JLM_XP_NEXT = 2,
    JLM_XP_AUTO = 3,
};

/* The policy the engine uses when none is named. */
#define JLM_XP_DEFAULT JLM_XP_AUTO

/* JLM_XP_LFU's half-life of the counts, in expert gets per expert page of
 * the model (n_layer * n_expert): the rate docs/pager.md's replay measured
 * best of the fixed ones; AUTO's first pick. */
#define JLM_XP_HALF_LIFE 1.0

/* JLM_XP_NEXT's half-life, in the same unit: 2 measured best on the
 * moe-1g traces (docs/bench.md, Expert cache policy). */
#define JLM_XP_NEXT_HALF_LIFE 2.0

/* The key of a page never gotten: below every gotten page's (count >= 1
 * at its last get means a key >= t / half_life >= 0). */
#define JLM_XP_KEY_NONE (-INFINITY)

/* "lru" / "lfu" / "next" / "auto" -> the policy; -1 for anything else (NULL included). */
static inline int jlm_xp_parse(const char *s)
{
    if (s && !strcmp(s, "lru"))
        return JLM_XP_LRU;
    if (s && !strcmp(s, "lfu"))
        return JLM_XP_LFU;
    if (s && !strcmp(s, "next"))
        return JLM_XP_NEXT;
    if (s && !strcmp(s, "auto"))
        return JLM_XP_AUTO;
    return -1;
}

/* The policy's name (jlm_xp_parse's inverse): "lru" for anything else. */
static inline const char *jlm_xp_name(int policy)
{
    return policy == JLM_XP_LFU ? "lfu" : policy == JLM_XP_NEXT ? "next" : policy == JLM_XP_AUTO ? "auto" : "lru";
}

/* The key after a get at clock `now` of a page whose key was `key`:
 * its count decayed to now, plus 1. */
static inline double jlm_xp_touch(double key, uint64_t now, double half_life)
{
    double t = (double)now / half_life;
    double count = key == JLM_XP_KEY_NONE ? 0.0 : exp2(key - t);
    return log2(count + 1.0) + t;
}

/* JLM_XP_NEXT's window: the count of a page gotten once every
 * `gets_per_token` gets, forever (the sum of 2^(-k g / half_life)). */
static inline double jlm_xp_window(double half_life, double gets_per_token)
{
    return 1.0 / (1.0 - exp2(-gets_per_token / half_life));
}

/* JLM_XP_NEXT's score (the larger, the sooner evicted): the expected block
 * steps until the next use of the page with `key`, of MoE block `blk`, at
 * clock `now` while block `cur` runs (blocks 0..n_blocks-1 in run order). */
static inline double jlm_xp_next_score(double key, uint64_t now, double half_life, double window, uint32_t blk,
                                       uint32_t cur, uint32_t n_blocks)
{
    double count = key == JLM_XP_KEY_NONE ? 0.0 : exp2(key - (double)now / half_life);
    uint32_t d = n_blocks ? (blk + n_blocks - cur % n_blocks) % n_blocks : 0;
    if (!(count > 0))
        return INFINITY;
    return (double)(d ? d : n_blocks) + n_blocks * (window / count - 1.0);
}

#endif
