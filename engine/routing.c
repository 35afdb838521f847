/* routing.c - a routing trace read back (routing.h). Every line is checked:
 * the header, then "POS BLOCK ID..." with BLOCK below n_layer and exactly
 * n_used ids below n_expert; nothing else. */
#include "engine/routing.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct rline { uint32_t pos, blk, at; } rline;

static int rline_cmp(const void *a, const void *b)
{
    const rline *x = a, *y = b;
    if (x->pos != y->pos)
        return x->pos < y->pos ? -1 : 1;
    if (x->blk != y->blk)
        return x->blk < y->blk ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

void jlm_routing_free(jlm_routing_trace *t)
{
    free(t->page);
    memset(t, 0, sizeof *t);
}

/* Reads one unsigned decimal field at *s (after spaces): 0, or -1. */
static int field(char **s, uint64_t max, uint64_t *v)
{
    while (**s == ' ')
        (*s)++;
    if (**s < '0' || **s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long x = strtoull(*s, &end, 10);
    if (errno || x > max)
        return -1;
    *s = end;
    *v = x;
    return 0;
}

static int header(const char *buf, jlm_routing_trace *t)
{
    unsigned nl, ne, nu;
    unsigned long long eb;
    if (sscanf(buf, "# jlm routing trace 1 n_layer %u n_expert %u n_used %u expert_bytes %llu", &nl, &ne, &nu, &eb) != 4 ||
        !nl || !ne || !nu || nu > ne || nl > 65536 || ne > 65536 || (uint64_t)nl * ne > (1u << 24))
        return -1;
    t->n_layer = nl, t->n_expert = ne, t->n_used = nu, t->expert_bytes = eb;
    return 0;
}

/* One routing line into ids (n_used of them, as pages block * n_expert +
 * id) and *l; NULL, or why it is refused. */
static const char *line(char *s, const jlm_routing_trace *t, uint32_t *ids, rline *l)
{
    uint64_t pos, blk, id;
    if (field(&s, UINT32_MAX, &pos) || field(&s, t->n_layer - 1, &blk))
        return "expected 'POS BLOCK ID...' with BLOCK below n_layer";
    for (uint32_t k = 0; k < t->n_used; k++) {
        if (field(&s, t->n_expert - 1, &id))
            return "expected n_used expert ids below n_expert";
        ids[k] = (uint32_t)(blk * t->n_expert + id);
    }
    while (*s == ' ' || *s == '\r')
        s++;
    if (*s != '\n' && *s != 0)
        return "more fields than n_used expert ids";
    l->pos = (uint32_t)pos, l->blk = (uint32_t)blk;
    return NULL;
}

int jlm_routing_parse(FILE *f, const char *name, jlm_routing_trace *t, jlm_err *err)
{
    memset(t, 0, sizeof *t);
    char buf[4096];
    unsigned long ln = 1;
    if (!fgets(buf, sizeof buf, f) || header(buf, t)) {
        memset(t, 0, sizeof *t);
        return jlm_errf(err, JLM_EFORMAT, "%s:1: expected '# jlm routing trace 1 n_layer L n_expert E n_used K "
                        "expert_bytes B'", name);
    }
    size_t cap = 0, n = 0;
    rline *ls = NULL;
    uint32_t *ids = NULL;
    int rc = 0;
    while (!rc && fgets(buf, sizeof buf, f)) {
        ln++;
        if (!strchr(buf, '\n') && !feof(f)) {
            rc = jlm_errf(err, JLM_EFORMAT, "%s:%lu: line too long", name, ln);
            break;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 1024;
            rline *nl = n >= (1u << 26) ? NULL : realloc(ls, nc * sizeof *ls);
            uint32_t *ni = nl ? realloc(ids, nc * t->n_used * sizeof *ids) : NULL;
            if (nl)
                ls = nl;
            if (ni)
                ids = ni;
            if (!nl || !ni) {
                rc = jlm_errf(err, JLM_ENOMEM, "%s:%lu: too many lines (out of memory)", name, ln);
                break;
            }
            cap = nc;
        }
        const char *why = line(buf, t, ids + n * t->n_used, &ls[n]);
        if (why)
            rc = jlm_errf(err, JLM_EFORMAT, "%s:%lu: %s", name, ln, why);
        ls[n].at = (uint32_t)n;
        n++;
    }
    if (!rc && ferror(f))
        rc = jlm_errf(err, JLM_EIO, "%s:%lu: read error", name, ln);
    if (!rc && n == 0)
        rc = jlm_errf(err, JLM_EFORMAT, "%s:%lu: no routing lines", name, ln);
    if (!rc && !(t->page = malloc(n * t->n_used * sizeof *t->page)))
        rc = jlm_errf(err, JLM_ENOMEM, "%s:%lu: out of memory", name, ln);
    if (!rc) {
        qsort(ls, n, sizeof *ls, rline_cmp);
        t->n_groups = (uint32_t)n;
        for (size_t i = 0; i < n; i++) {
            memcpy(t->page + i * t->n_used, ids + (size_t)ls[i].at * t->n_used, t->n_used * sizeof *ids);
            t->n_tokens += i == 0 || ls[i].pos != ls[i - 1].pos;
        }
    }
    free(ls);
    free(ids);
    if (rc)
        jlm_routing_free(t);
    return rc;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int jlm_routing_order(const jlm_routing_trace *t, const uint32_t *rank, uint32_t np, uint32_t *order,
                      jlm_err *err)
{
    for (uint32_t l = 0; l < t->n_layer; l++)
        if (rank[l] != UINT32_MAX && (uint64_t)(rank[l] + 1) * t->n_expert > np)
            return jlm_errf(err, JLM_EINVAL, "layer %u: MoE block %u of %u experts past %u expert pages", l,
                            rank[l], t->n_expert, np);
    uint64_t *key = calloc(np ? np : 1, sizeof *key);   /* routings, then the sort key */
    if (!key)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    for (uint64_t i = 0; i < (uint64_t)t->n_groups * t->n_used; i++) {
        uint32_t l = t->page[i] / t->n_expert, id = t->page[i] % t->n_expert;
        if (rank[l] != UINT32_MAX && key[(uint64_t)rank[l] * t->n_expert + id] < UINT32_MAX)
            key[(uint64_t)rank[l] * t->n_expert + id]++;
    }
    for (uint32_t p = 0; p < np; p++)   /* ascending: most routed first, then page order */
        key[p] = (uint64_t)(UINT32_MAX - key[p]) << 32 | p;
    qsort(key, np, sizeof *key, u64_cmp);
    for (uint32_t p = 0; p < np; p++)
        order[p] = (uint32_t)key[p];
    free(key);
    return JLM_OK;
}
