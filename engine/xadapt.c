/* xadapt.c - the adaptive policy's shadow caches (engine/xadapt.h). */
#include "engine/xadapt.h"

#include <math.h>
#include <stdlib.h>

#include "engine/xpolicy.h"

typedef struct xshadow {
    double    half;    /* expert gets in a count's half-life */
    int       next;    /* JLM_XP_NEXT's victim (the latest expected use), else the lowest key */
    double   *key;     /* (n_pages,) jlm_xp_touch's key */
    uint32_t *res;     /* (n_pages,) 1 + its place in `list`; 0: not held */
    uint32_t *list;    /* (n_pages,) the pages held */
    uint32_t  n;       /* pages held */
    double    miss;    /* misses, decayed */
} xshadow;

struct jlm_xadapt {
    uint32_t  n_pages, n_used, per_block, n_blocks;
    double    window;  /* the NEXT candidate's (jlm_xp_window) */
    uint64_t *last;    /* (n_pages,) clock + 1 of the page's last get; 0: never */
    double    decay;   /* the misses' factor a get */
    int       pick;    /* the candidate in force */
    xshadow   s[JLM_XA_K];
};

jlm_xadapt *jlm_xa_new(uint32_t n_pages, uint32_t n_used, uint32_t per_block)
{
    static const double halves[JLM_XA_K] = JLM_XA_HALVES;
    jlm_xadapt *a = n_pages ? calloc(1, sizeof *a) : NULL;
    if (!a)
        return NULL;
    a->n_pages = n_pages;
    a->n_used = n_used ? n_used : 1;
    int cycle = per_block && n_pages % per_block == 0;   /* as jlm_pager_set_expert_blocks */
    a->per_block = cycle ? per_block : 0;
    a->n_blocks = cycle ? n_pages / per_block : 1;
    a->pick = JLM_XA_START;
    a->decay = exp2(-1.0 / (JLM_XA_WINDOW * n_pages));
    a->last = calloc(n_pages, sizeof *a->last);
    int ok = a->last != NULL;
    for (int k = 0; k < JLM_XA_K && ok; k++) {
        xshadow *s = &a->s[k];
        s->next = k == JLM_XA_NEXT;
        s->half = s->next ? JLM_XP_NEXT_HALF_LIFE * n_pages : halves[k] > 0 ? halves[k] * n_pages : 1.0;
        s->key = malloc(n_pages * sizeof *s->key);
        s->res = calloc(n_pages, sizeof *s->res);
        s->list = malloc(n_pages * sizeof *s->list);
        ok = s->key && s->res && s->list;
        for (uint32_t i = 0; ok && i < n_pages; i++)
            s->key[i] = JLM_XP_KEY_NONE;
    }
    a->window = jlm_xp_window(a->s[JLM_XA_NEXT].half, (double)a->n_blocks * a->n_used);
    if (!ok) {
        jlm_xa_free(a);
        return NULL;
    }
    return a;
}

void jlm_xa_free(jlm_xadapt *a)
{
    if (!a)
        return;
    for (int k = 0; k < JLM_XA_K; k++)
        free(a->s[k].key), free(a->s[k].res), free(a->s[k].list);
    free(a->last);
    free(a);
}

static void drop(xshadow *s, uint32_t i)
{
    uint32_t q = s->list[i];
    s->res[q] = 0;
    s->list[i] = s->list[--s->n];
    if (i < s->n)
        s->res[s->list[i]] = i + 1;
}

static uint32_t block_of(const jlm_xadapt *a, uint32_t p) { return a->per_block ? p / a->per_block : 0; }

/* How soon shadow s evicts page q (the larger, the sooner) at clock now
 * while the page `cur` is read: the key's opposite, or NEXT's score. */
static double rank(const jlm_xadapt *a, const xshadow *s, uint32_t q, uint64_t now, uint32_t cur)
{
    if (!s->next)
        return -s->key[q];
    return jlm_xp_next_score(s->key[q], now, s->half, a->window, block_of(a, q), block_of(a, cur), a->n_blocks);
}

/* Shadow s's victim as page p is read at clock now: the largest rank, ties
 * to the least recent get, never a page gotten in the last n_used - 1 gets
 * (the routing being gotten). The list's index, or UINT32_MAX. */
static uint32_t victim(const jlm_xadapt *a, const xshadow *s, uint64_t now, uint32_t p)
{
    uint32_t v = UINT32_MAX;
    double vr = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t q = s->list[i];
        if (a->last[q] + a->n_used > now + 1)   /* last get within the routing */
            continue;
        double r = rank(a, s, q, now, p);
        if (v == UINT32_MAX || r > vr || (r == vr && a->last[q] < a->last[s->list[v]]))
            v = i, vr = r;
    }
    return v;
}

void jlm_xa_get(jlm_xadapt *a, uint32_t p, uint64_t now, uint32_t cap)
{
    if (p >= a->n_pages)
        return;
    cap = cap ? cap : 1;
    int best = a->pick;
    for (int k = 0; k < JLM_XA_K; k++) {
        xshadow *s = &a->s[k];
        s->miss *= a->decay;
        if (!s->res[p]) {
            s->miss += 1.0;
            while (s->n >= cap) {
                uint32_t v = victim(a, s, now, p);
                if (v == UINT32_MAX)
                    break;
                drop(s, v);
            }
            s->list[s->n] = p;
            s->res[p] = ++s->n;
        }
        s->key[p] = jlm_xp_touch(s->key[p], now, s->half);
        if (s->miss < a->s[best].miss)   /* ties keep the one in force */
            best = k;
    }
    a->pick = best;
    a->last[p] = now + 1;
}

double jlm_xa_rank(const jlm_xadapt *a, uint32_t q, uint64_t now, uint32_t cur)
{
    if (q >= a->n_pages)
        return -INFINITY;
    return rank(a, &a->s[a->pick], q, now, cur < a->n_pages ? cur : 0);
}

double jlm_xa_half(const jlm_xadapt *a) { return a->s[a->pick].half; }

int jlm_xa_pick(const jlm_xadapt *a) { return a->pick; }

double jlm_xa_misses(const jlm_xadapt *a, int k) { return k >= 0 && k < JLM_XA_K ? a->s[k].miss : 0; }
