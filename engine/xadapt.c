/* xadapt.c - the adaptive decaying count's shadow caches (engine/xadapt.h). */
#include "engine/xadapt.h"

#include <math.h>
#include <stdlib.h>

#include "engine/xpolicy.h"

typedef struct xshadow {
    double   half;     /* expert gets in a count's half-life */
    double  *key;      /* (n_pages,) jlm_xp_touch's key */
    uint32_t *res;     /* (n_pages,) 1 + its place in `list`; 0: not held */
    uint32_t *list;    /* (n_pages,) the pages held */
    uint32_t n;        /* pages held */
    double   miss;     /* misses, decayed */
} xshadow;

struct jlm_xadapt {
    uint32_t  n_pages, n_used;
    uint64_t *last;    /* (n_pages,) clock + 1 of the page's last get; 0: never */
    double    decay;   /* the misses' factor a get */
    int       pick;    /* the candidate in force */
    xshadow   s[JLM_XA_K];
};

jlm_xadapt *jlm_xa_new(uint32_t n_pages, uint32_t n_used)
{
    static const double halves[JLM_XA_K] = JLM_XA_HALVES;
    jlm_xadapt *a = n_pages ? calloc(1, sizeof *a) : NULL;
    if (!a)
        return NULL;
    a->n_pages = n_pages;
    a->n_used = n_used ? n_used : 1;
    a->pick = JLM_XA_START;
    a->decay = exp2(-1.0 / (JLM_XA_WINDOW * n_pages));
    a->last = calloc(n_pages, sizeof *a->last);
    int ok = a->last != NULL;
    for (int k = 0; k < JLM_XA_K && ok; k++) {
        xshadow *s = &a->s[k];
        s->half = halves[k] > 0 ? halves[k] * n_pages : 1.0;
        s->key = malloc(n_pages * sizeof *s->key);
        s->res = calloc(n_pages, sizeof *s->res);
        s->list = malloc(n_pages * sizeof *s->list);
        ok = s->key && s->res && s->list;
        for (uint32_t i = 0; ok && i < n_pages; i++)
            s->key[i] = JLM_XP_KEY_NONE;
    }
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

/* Shadow s's victim: the lowest key, ties to the least recent get, never a
 * page gotten in the last n_used - 1 gets before `now` (the routing being
 * gotten). The list's index, or UINT32_MAX. */
static uint32_t victim(const jlm_xadapt *a, const xshadow *s, uint64_t now)
{
    uint32_t v = UINT32_MAX;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t q = s->list[i];
        if (a->last[q] + a->n_used > now + 1)   /* last get within the routing */
            continue;
        uint32_t b = v == UINT32_MAX ? 0 : s->list[v];
        if (v == UINT32_MAX || s->key[q] < s->key[b] || (s->key[q] == s->key[b] && a->last[q] < a->last[b]))
            v = i;
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
                uint32_t v = victim(a, s, now);
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

double jlm_xa_key(const jlm_xadapt *a, uint32_t p)
{
    return p < a->n_pages ? a->s[a->pick].key[p] : JLM_XP_KEY_NONE;
}

double jlm_xa_half(const jlm_xadapt *a) { return a->s[a->pick].half; }

int jlm_xa_pick(const jlm_xadapt *a) { return a->pick; }

double jlm_xa_misses(const jlm_xadapt *a, int k) { return k >= 0 && k < JLM_XA_K ? a->s[k].miss : 0; }
