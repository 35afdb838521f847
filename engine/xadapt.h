/* xadapt.h - the expert cache's adaptive policy (JLM_XP_AUTO,
 * engine/xpolicy.h): the decaying count of the half-life, or NEXT, that
 * would have missed least lately, chosen as the run goes, shared by the
 * pager (engine/pager_policy.c) and the routing replay
 * (bench/routing_replay.c).
 *
 * Why: the half-life that reads least depends on the routing. On moe-1g's
 * routing traces a sampled generation reads least with counts that decay
 * over 8-16 tokens (frequency: LRU reads up to 1.6x more at a sixteenth to
 * a quarter of the experts), a greedy one with counts that decay within a
 * get or two (recency: the 8-token counts read 1.1-2x LRU's there), and
 * at a sixteenth of the experts NEXT reads least on both. No fixed policy
 * is near the optimum on every kind and share (docs/pager.md, Expert cache
 * policy).
 *
 * How: JLM_XA_K candidates (the LFU half-lives of JLM_XA_HALVES, in expert
 * gets per expert page, the unit of JLM_XP_HALF_LIFE, and NEXT with its
 * own) each keep a shadow cache: the set of pages the policy would hold
 * with the cache's capacity, its keys, and its misses, decaying with a
 * half-life of JLM_XA_WINDOW gets per expert page. Every expert get
 * updates every shadow (a miss evicts the shadow's victim outside the
 * current routing: a scan of its pages). The candidate in force is the one
 * whose shadow missed least lately; the pager's victim is the one it would
 * take (jlm_xa_rank). Shadows hold page numbers and keys only, never
 * memory: K x 16 + 8 bytes an expert page. No call fails but jlm_xa_new
 * (out of memory: NULL). */
#ifndef JLM_ENGINE_XADAPT_H
#define JLM_ENGINE_XADAPT_H

#include <stdint.h>

#define JLM_XA_K 7
/* 0: one get (recency: LRU but for a page gotten twice in a row), then
 * 1/4 to 4 (a long memory); 1 is JLM_XP_HALF_LIFE, the one in force at
 * first; the last is NEXT (its half-life JLM_XP_NEXT_HALF_LIFE) */
#define JLM_XA_HALVES { 0, 0.25, 0.5, 1.0, 2.0, 4.0, 0 }
#define JLM_XA_START  3
#define JLM_XA_NEXT   6
/* the misses' half-life, in expert gets per expert page (16 tokens on moe-1g) */
#define JLM_XA_WINDOW 2.0

typedef struct jlm_xadapt jlm_xadapt;

/* Shadows for n_pages expert pages (> 0) of which n_used are routed
 * together (a routing's pages are never a shadow's victim), MoE blocks of
 * per_block pages in run order for NEXT's cycle (0, or one that does not
 * divide n_pages: none, as jlm_pager_set_expert_blocks). NULL: out of
 * memory. */
jlm_xadapt *jlm_xa_new(uint32_t n_pages, uint32_t n_used, uint32_t per_block);
void jlm_xa_free(jlm_xadapt *a);

/* An expert get of page p (< n_pages) at clock `now` (expert gets so far:
 * +1 a call) with the cache holding `cap` expert pages (0 counts as 1). */
void jlm_xa_get(jlm_xadapt *a, uint32_t p, uint64_t now, uint32_t cap);

/* How soon the candidate in force evicts page q at clock `now` while page
 * `cur` is read (or was gotten last): the larger, the sooner (the opposite
 * of its key, or NEXT's score; a page never gotten: +infinity). */
double jlm_xa_rank(const jlm_xadapt *a, uint32_t q, uint64_t now, uint32_t cur);

/* The half-life in force, in expert gets; which candidate it is. */
double jlm_xa_half(const jlm_xadapt *a);
int jlm_xa_pick(const jlm_xadapt *a);

/* Candidate k's decayed misses (k < JLM_XA_K), for --stats and the tests. */
double jlm_xa_misses(const jlm_xadapt *a, int k);

#endif
