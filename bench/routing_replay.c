/* routing_replay.c - an expert cache's bytes a token, replayed from a routing
 * trace (`jlm run --trace-routing FILE`, engine/model.h's format) at many
 * budgets, for the engine's policies (engine/xpolicy.h: LRU, the decaying
 * count LFU, the expected next use NEXT) and the offline optimum (Belady:
 * evict the expert whose next use is farthest), and the ratios of each
 * policy to the optimum, all measured in one run.
 *
 *   build/bench/routing_replay TRACE [--slots N,N,...] [--half-life H] [--next-half-life H]
 *
 * The replay is decode's access order: the trace's lines sorted by
 * (position, block), each line's n_used experts pinned together (none of
 * them is a victim while the others are gotten: the resident ones first,
 * then the missing ones read, as jlm_stream_experts does; rr_misses), one
 * expert get per id, a miss reads one expert page (expert_bytes, the
 * trace's mean). The
 * budget is in expert slots (default: 1/16, 1/8, 1/4, 3/8, 1/2, 5/8, 3/4 and
 * 7/8 of the expert pages the trace's blocks hold, at least n_used); block
 * pages and the dense region are not counted. The first use of each expert
 * is a miss under every policy (the cache starts empty), so the ratios
 * include those cold reads. --half-life: LFU's half-life in gets per expert
 * page (default JLM_XP_HALF_LIFE, the engine's); --next-half-life: NEXT's
 * (default JLM_XP_NEXT_HALF_LIFE). Without TRACE: a line, exit 0 (make bench
 * runs every bench bare).
 *
 * Tests include this file with ROUTING_REPLAY_NO_MAIN (tests/test_replay.c,
 * tests/test_engine.c: the replay against the engine's reads). */
#include "engine/routing.h"
#include "engine/xadapt.h"
#include "engine/xpolicy.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RR_FN static __attribute__((unused))

enum { RR_LRU = JLM_XP_LRU, RR_LFU = JLM_XP_LFU, RR_NEXT = JLM_XP_NEXT, RR_AUTO = JLM_XP_AUTO, RR_OPT = 4, RR_N = 5 };

/* The trace, parsed by the engine's own parser (engine/routing.h). */
typedef jlm_routing_trace rr_trace;

RR_FN void rr_free(rr_trace *t) { jlm_routing_free(t); }

/* Parses a trace (untrusted: every refusal is one line "NAME:LINE: why" in
 * msg). 0, or -1 with *t zeroed. */
RR_FN int rr_parse(FILE *f, const char *name, rr_trace *t, char *msg, size_t msz)
{
    jlm_err err = {0};
    if (!jlm_routing_parse(f, name, t, &err))
        return 0;
    size_t n = strnlen(err.msg, sizeof err.msg);
    n = n < msz ? n : msz - 1;   /* msz > 0 */
    memcpy(msg, err.msg, n);
    msg[n] = 0;
    return -1;
}

/* Expert pages the trace can name: n_layer * n_expert. */
static uint32_t rr_pages(const rr_trace *t) { return t->n_layer * t->n_expert; }

/* A trace page's index among the MoE blocks' pages (the pager's expert
 * array: ord, block -> 1 + its MoE ordinal): AUTO's shadows number them so. */
static uint32_t rr_xpage(const rr_trace *t, const uint32_t *ord, uint32_t p)
{
    return (ord[p / t->n_expert] - 1) * t->n_expert + p % t->n_expert;
}

/* Misses of the replay under policy (RR_LRU, RR_LFU, RR_NEXT, RR_AUTO, RR_OPT) with
 * `slots` expert frames (raised to n_used); LFU's and NEXT's half-life in
 * gets per expert page (as the engine: JLM_XP_HALF_LIFE, _NEXT_HALF_LIFE).
 * NEXT's blocks are the trace's MoE blocks in order (the engine's expert
 * pages: n_expert a MoE block). (uint64_t)-1 when out of memory.
 *
 * A routing runs as jlm_stream_experts runs it, so that the counts are the
 * engine's (tests/test_engine.c checks them against the pager's page-ins):
 * its resident experts are gotten (pinned) first, in slot order, then its
 * missing ones are read in slot order, each evicting an expert of another
 * routing; a get adds to the expert's count (clock: expert gets so far);
 * then all are unpinned in slot order, which makes them the most recently
 * used in that order (the pager's list head). */
RR_FN uint64_t rr_misses(const rr_trace *t, int policy, uint32_t slots, double half_life)
{
    uint32_t np = rr_pages(t), nu = t->n_used;
    uint64_t na = (uint64_t)t->n_groups * nu, miss = 0;
    if (slots < nu)
        slots = nu;
    /* per page: resident, the LRU stamp, the LFU key, the next use (OPT), the group pinning it */
    uint8_t *res = calloc(np, 1);
    uint64_t *stamp = calloc(np, sizeof *stamp), *nextuse = calloc(np, sizeof *nextuse);
    uint64_t *next = policy == RR_OPT ? malloc(na * sizeof *next) : NULL;
    uint64_t *pin = malloc(np * sizeof *pin);
    double *key = malloc(np * sizeof *key);
    uint32_t *resl = malloc((size_t)slots * sizeof *resl);   /* the resident pages, unordered */
    uint8_t *hit = malloc(nu);   /* the routing's experts resident at its start */
    uint32_t *ord = calloc(t->n_layer, sizeof *ord), nb = 0;   /* block -> 1 + its MoE ordinal */
    jlm_xadapt *xa = NULL;   /* AUTO's shadows, over the MoE blocks' pages as the pager's */
    if (!res || !stamp || !nextuse || !pin || !key || !resl || !hit || !ord || (policy == RR_OPT && !next)) {
        miss = (uint64_t)-1;
        goto out;
    }
    for (uint32_t p = 0; p < np; p++)
        key[p] = JLM_XP_KEY_NONE, pin[p] = UINT64_MAX;
    if (next) {   /* next[i]: the access after i to the same page (UINT64_MAX: none) */
        for (uint32_t p = 0; p < np; p++)
            nextuse[p] = UINT64_MAX;
        for (uint64_t i = na; i-- > 0;) {
            next[i] = nextuse[t->page[i]];
            nextuse[t->page[i]] = i;
        }
    }
    for (uint64_t i = 0; i < na; i++)
        if (!ord[t->page[i] / t->n_expert])
            ord[t->page[i] / t->n_expert] = 1;
    for (uint32_t b = 0; b < t->n_layer; b++)
        ord[b] = ord[b] ? ++nb : 0;
    double half = half_life * np, window = jlm_xp_window(half, (double)nb * nu);
    if (policy == RR_AUTO && !(xa = jlm_xa_new(nb * t->n_expert, nu, t->n_expert))) {
        miss = (uint64_t)-1;
        goto out;
    }
    uint32_t nres = 0;
    uint64_t clock = 0, seq = 0;
    for (uint64_t g = 0; g < t->n_groups; g++) {
        const uint32_t *pg = t->page + g * nu;
        for (uint32_t k = 0; k < nu; k++)
            pin[pg[k]] = g, hit[k] = res[pg[k]];
        for (int pass = 0; pass < 2; pass++)   /* the resident ones, then the reads */
            for (uint32_t k = 0; k < nu; k++) {
                uint32_t p = pg[k];
                if (hit[k] != !pass)
                    continue;
                if (!res[p]) {
                    miss++;
                    if (nres == slots) {   /* the victim: never a page of this routing */
                        uint32_t v = UINT32_MAX, cur = ord[p / t->n_expert] - 1;
                        double vs = 0;
                        for (uint32_t r = 0; r < nres; r++) {
                            uint32_t q = resl[r];
                            if (pin[q] == g)
                                continue;
                            double qs = policy == RR_NEXT ? jlm_xp_next_score(key[q], clock, half, window,
                                                                              ord[q / t->n_expert] - 1, cur, nb) : 0;
                            double xr = xa ? jlm_xa_rank(xa, rr_xpage(t, ord, q), clock, rr_xpage(t, ord, p)) : 0;
                            if (v == UINT32_MAX || (policy == RR_NEXT && (qs > vs || (qs == vs && stamp[q] < stamp[resl[v]]))) ||
                                (policy == RR_LRU && stamp[q] < stamp[resl[v]]) ||
                                (policy == RR_LFU && (key[q] < key[resl[v]] ||
                                                      (key[q] == key[resl[v]] && stamp[q] < stamp[resl[v]]))) ||
                                (policy == RR_AUTO && (xr > vs || (xr == vs && stamp[q] < stamp[resl[v]]))) ||
                                (policy == RR_OPT && nextuse[q] > nextuse[resl[v]]))
                                v = r, vs = xa ? xr : qs;
                        }
                        res[resl[v]] = 0;
                        resl[v] = resl[--nres];
                    }
                    res[p] = 1;
                    resl[nres++] = p;
                }
                if (xa)
                    jlm_xa_get(xa, rr_xpage(t, ord, p), clock, slots);
                key[p] = jlm_xp_touch(key[p], clock++, half);
                if (next)
                    nextuse[p] = next[g * nu + k];
            }
        for (uint32_t k = 0; k < nu; k++)   /* unpinned in slot order */
            stamp[pg[k]] = ++seq;
    }
out:
    free(res); free(stamp); free(nextuse); free(next); free(pin); free(key); free(resl); free(hit); free(ord);
    jlm_xa_free(xa);
    return miss;
}

#ifndef ROUTING_REPLAY_NO_MAIN
static int parse_slots(const char *s, uint32_t *v, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        errno = 0;
        unsigned long x = strtoul(s, &end, 10);
        if (end == s || errno || x == 0 || x > UINT32_MAX || (*end && *end != ','))
            return -1;
        v[n++] = (uint32_t)x;
        s = *end ? end + 1 : end;
    }
    return *s ? -1 : n;
}

static double rr_ratio(uint64_t m, uint64_t opt) { return opt ? (double)m / opt : 1.0; }

int main(int argc, char **argv)
{
    const char *path = NULL;
    uint32_t slots[64];
    int ns = 0;
    double half = JLM_XP_HALF_LIFE, nhalf = JLM_XP_NEXT_HALF_LIFE;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--slots") && i + 1 < argc) {
            if ((ns = parse_slots(argv[++i], slots, 64)) <= 0) {
                fprintf(stderr, "routing_replay: --slots '%s': expected up to 64 positive counts, comma-separated\n", argv[i]);
                return 2;
            }
        } else if ((!strcmp(argv[i], "--half-life") || !strcmp(argv[i], "--next-half-life")) && i + 1 < argc) {
            char *end;
            double *h = argv[i][2] == 'n' ? &nhalf : &half;
            *h = strtod(argv[++i], &end);
            if (*end || !(*h > 0) || *h > 1e9) {
                fprintf(stderr, "routing_replay: %s '%s': expected a positive number up to 1e9\n", argv[i - 1], argv[i]);
                return 2;
            }
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "usage: routing_replay TRACE [--slots N,N,...] [--half-life H] [--next-half-life H]\n");
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        printf("routing_replay: no trace given (jlm run MOE_MODEL ... --trace-routing FILE; then routing_replay FILE): nothing replayed\n");
        return 0;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "routing_replay: %s: %s\n", path, strerror(errno));
        return 1;
    }
    rr_trace t;
    char msg[512];
    int rc = rr_parse(f, path, &t, msg, sizeof msg);
    fclose(f);
    if (rc) {
        fprintf(stderr, "routing_replay: %s\n", msg);
        return 1;
    }
    /* the blocks the trace routes in: the pages a budget is a share of */
    uint32_t nb = 0;
    uint8_t *seen = calloc(t.n_layer, 1);
    for (uint64_t i = 0; seen && i < (uint64_t)t.n_groups * t.n_used; i++)
        if (!seen[t.page[i] / t.n_expert])
            seen[t.page[i] / t.n_expert] = 1, nb++;
    free(seen);
    uint32_t all = nb * t.n_expert;
    if (!ns) {
        static const int eighths[] = {1, 2, 4, 6, 8, 10, 12, 14};   /* sixteenths */
        for (int k = 0; k < 8; k++) {
            uint32_t s = (uint32_t)((uint64_t)all * (uint32_t)eighths[k] / 16);
            s = s < t.n_used ? t.n_used : s;
            if (!ns || s > slots[ns - 1])
                slots[ns++] = s;
        }
    }
    printf("trace %s: %u tokens, %u routings, %u MoE blocks x %u experts (%u used), expert page %.2f MB, "
           "half-life LFU %.3g, NEXT %.3g\n", path, t.n_tokens, t.n_groups, nb, t.n_expert, t.n_used, t.expert_bytes / 1e6,
           half, nhalf);
    printf("| slots | budget MB | share | LRU MB/token | LFU MB/token | NEXT MB/token | AUTO MB/token | optimum MB/token | LRU/opt | LFU/opt | NEXT/opt | AUTO/opt |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < ns; k++) {
        uint64_t m[RR_N];
        for (int pol = 0; pol < RR_N; pol++)
            if ((m[pol] = rr_misses(&t, pol, slots[k], pol == RR_NEXT ? nhalf : half)) == (uint64_t)-1) {
                fprintf(stderr, "routing_replay: out of memory\n");
                rr_free(&t);
                return 1;
            }
        double per = (double)t.expert_bytes / 1e6 / t.n_tokens;
        printf("| %u | %.1f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", slots[k],
               slots[k] * (double)t.expert_bytes / 1e6, (double)slots[k] / all, m[RR_LRU] * per, m[RR_LFU] * per,
               m[RR_NEXT] * per, m[RR_AUTO] * per, m[RR_OPT] * per, rr_ratio(m[RR_LRU], m[RR_OPT]),
               rr_ratio(m[RR_LFU], m[RR_OPT]), rr_ratio(m[RR_NEXT], m[RR_OPT]), rr_ratio(m[RR_AUTO], m[RR_OPT]));
    }
    rr_free(&t);
    return 0;
}
#endif
