/* match.c - the matcher: the set of live parse stacks (llama.cpp's idea: each
 * stack lists grammar positions still to match, its top a character class),
 * advanced one code point at a time with UTF-8 decoded on the fly; the token
 * mask walks a byte trie of the vocabulary against those stacks, so a prefix
 * shared by many tokens is matched once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar_int.h"

/* ---------------------------------------------------------------- stack sets */
/* A set of stacks, deduplicated by content: a linear scan while it is small,
 * then an open-addressing index (a set in an ambiguous grammar holds
 * thousands, and a scan per add made a step quadratic). Every set is bounded
 * in stacks and in entries, so a step costs at most a fixed amount of work
 * whatever the grammar; what is over the bound is dropped, the same way on
 * every path, so the mask and the matcher agree. */
typedef struct sset {
    uint32_t *d;        /* the stacks' entries, bottom first, one after another */
    size_t    nd, capd;
    uint32_t *off;      /* (ns + 1,) */
    uint32_t *h;        /* (ns,) hashes */
    size_t    ns, caps;
    uint32_t *slot;     /* (cap,) once indexed: stack index + 1, 0 empty */
    uint32_t *at;       /* (cap / 2,) each stack's slot, to empty them */
    uint32_t  cap;      /* a power of two; 0 while unindexed */
} sset;

#define SSET_SCAN 16                        /* stacks a set scans before it builds an index */
#define SSET_MAX_ENTRIES (1u << 13)         /* entries in one set: 8192, 32 KiB */
#define XWORK_MAX_ENTRIES (1u << 17)        /* entries one step's expansions record */

static void sset_clear(sset *s)
{
    if (s->cap)
        for (size_t k = 0; k < s->ns; k++) s->slot[s->at[k]] = 0;
    s->nd = 0;
    s->ns = 0;
    if (s->off) s->off[0] = 0;
}

static void sset_free(sset *s)
{
    free(s->d);
    free(s->off);
    free(s->h);
    free(s->slot);
    free(s->at);
    memset(s, 0, sizeof *s);
}

/* Drops the index (a set that is only read from now on). */
static void sset_unindex(sset *s)
{
    free(s->slot);
    free(s->at);
    s->slot = s->at = NULL;
    s->cap = 0;
}

/* Room for `stacks` stacks and `entries` entries in all. */
static int sset_room(sset *s, size_t stacks, size_t entries)
{
    if (!s->off) {
        s->caps = 8;
        s->off = malloc(sizeof *s->off * (s->caps + 1));
        s->h = malloc(sizeof *s->h * s->caps);
        if (!s->off || !s->h) return JLM_ENOMEM;
        s->off[0] = 0;
    }
    if (stacks > s->caps) {
        size_t nc = s->caps * 2;
        while (nc < stacks) nc *= 2;
        uint32_t *o = realloc(s->off, sizeof *o * (nc + 1));
        if (!o) return JLM_ENOMEM;
        s->off = o;
        uint32_t *h = realloc(s->h, sizeof *h * nc);
        if (!h) return JLM_ENOMEM;
        s->h = h;
        s->caps = nc;
    }
    if (entries > s->capd) {
        size_t nc = s->capd ? s->capd * 2 : 64;
        while (nc < entries) nc *= 2;
        uint32_t *d = realloc(s->d, sizeof *d * nc);
        if (!d) return JLM_ENOMEM;
        s->d = d;
        s->capd = nc;
    }
    return 0;
}

/* Room for one more stack of `entries` entries. */
static int sset_reserve(sset *s, size_t entries) { return sset_room(s, s->ns + 1, s->nd + entries); }

static uint32_t sset_probe(const uint32_t *slot, uint32_t cap, uint32_t h)
{
    uint32_t k = (h * 0x9E3779B9u) & (cap - 1);
    while (slot[k]) k = (k + 1) & (cap - 1);
    return k;
}

/* Room in the index for one more stack at half load, built once the set
 * outgrows a scan. */
static int sset_grow_index(sset *s)
{
    if (!s->cap && s->ns < SSET_SCAN) return 0;
    if ((s->ns + 1) * 2 <= s->cap) return 0;
    uint32_t nc = s->cap ? s->cap * 2 : 4 * SSET_SCAN;
    uint32_t *sl = calloc(nc, sizeof *sl), *at = malloc(sizeof *at * (nc / 2));
    if (!sl || !at) {
        free(sl);
        free(at);
        return JLM_ENOMEM;
    }
    for (size_t i = 0; i < s->ns; i++) {
        at[i] = sset_probe(sl, nc, s->h[i]);
        sl[at[i]] = (uint32_t)i + 1;
    }
    free(s->slot);
    free(s->at);
    s->slot = sl;
    s->at = at;
    s->cap = nc;
    return 0;
}

static int same_stack(const sset *s, size_t i, const uint32_t *w, size_t n, uint32_t h)
{
    uint32_t o = s->off[i];
    return s->h[i] == h && s->off[i + 1] - o == n && (!n || !memcmp(s->d + o, w, n * sizeof *w));
}

/* Adds stack w[0, n) to s, which holds at most max_s stacks and max_d
 * entries. Returns 0 added, 1 held already or over a bound, or JLM_ENOMEM. */
static int sset_put(sset *s, const uint32_t *w, size_t n, size_t max_s, size_t max_d)
{
    uint32_t h = 2166136261u;
    for (size_t k = 0; k < n; k++) h = (h ^ w[k]) * 16777619u;
    uint32_t k = 0;
    if (s->cap) {
        for (k = (h * 0x9E3779B9u) & (s->cap - 1); s->slot[k]; k = (k + 1) & (s->cap - 1))
            if (same_stack(s, s->slot[k] - 1, w, n, h)) return 1;
    } else {
        for (size_t i = 0; i < s->ns; i++)
            if (same_stack(s, i, w, n, h)) return 1;
    }
    if (s->ns >= max_s || s->nd + n > max_d) return 1;   /* bounded: the rest of an ambiguous parse is dropped */
    uint32_t cap0 = s->cap;
    if (sset_grow_index(s) || sset_reserve(s, n)) return JLM_ENOMEM;
    if (s->cap && s->cap != cap0) k = sset_probe(s->slot, s->cap, h);   /* (re)built: probe again */
    if (n) memcpy(s->d + s->nd, w, n * sizeof *w);   /* d may still be NULL for an empty stack */
    s->nd += n;
    s->h[s->ns] = h;
    if (s->cap) {
        s->at[s->ns] = k;
        s->slot[k] = (uint32_t)s->ns + 1;
    }
    s->off[++s->ns] = (uint32_t)s->nd;
    return 0;
}

/* Adds a live stack (held already or over the bounds: nothing). */
static int sset_add(sset *s, const uint32_t *w, size_t n)
{
    int rc = sset_put(s, w, n, JLM_GRAM_MAX_STACKS, SSET_MAX_ENTRIES);
    return rc < 0 ? rc : 0;
}

/* dst = src, unindexed (an add builds the index again when it needs one). */
static int sset_copy(sset *dst, const sset *src)
{
    sset_clear(dst);
    sset_unindex(dst);
    if (sset_room(dst, src->ns, src->nd)) return JLM_ENOMEM;
    if (src->nd) memcpy(dst->d, src->d, sizeof *src->d * src->nd);
    if (src->off) memcpy(dst->off, src->off, sizeof *src->off * (src->ns + 1));   /* else empty: off[0] = 0 */
    if (src->ns) memcpy(dst->h, src->h, sizeof *src->h * src->ns);
    dst->nd = src->nd;
    dst->ns = src->ns;
    return 0;
}

/* ---------------------------------------------------------------- stepping */
static int cls_has(const jlm_gram *g, uint32_t c, uint32_t lo, uint32_t hi)
{
    for (uint32_t k = g->cls[c]; k < g->cls[c + 1]; k++)
        if (g->rng[2 * k] <= hi && lo <= g->rng[2 * k + 1]) return 1;
    return 0;
}

/* The work area of one step's expansions: the stack being built, and the
 * stacks already expanded in this step. Expanding a stack twice adds nothing,
 * and nested optional rules reach one stack by exponentially many paths
 * (("a"?){0,40}){0,40} does), so each is expanded once; and a step expands at
 * most JLM_GRAM_MAX_EXPAND stacks of XWORK_MAX_ENTRIES entries in all (the
 * rest of an ambiguous parse is dropped, the same way on every path, so the
 * mask and the matcher agree). */
typedef struct xwork {
    uint32_t *w;        /* (JLM_GRAM_MAX_STACK + 1,) */
    sset      seen;     /* the stacks expanded this step */
} xwork;

static int xwork_init(xwork *X)
{
    X->w = malloc(sizeof *X->w * (JLM_GRAM_MAX_STACK + 1));
    return X->w ? 0 : JLM_ENOMEM;
}

static void xwork_free(xwork *X)
{
    free(X->w);
    sset_free(&X->seen);
}

/* Starts a step. */
static void xwork_reset(xwork *X) { sset_clear(&X->seen); }

/* 1 when w[0, n) was expanded already this step (or the step's work is
 * spent), 0 after recording it as expanded now, or JLM_ENOMEM. */
static int xwork_seen(xwork *X, size_t n)
{
    return sset_put(&X->seen, X->w, n, JLM_GRAM_MAX_EXPAND, XWORK_MAX_ENTRIES);
}

/* Expands w[0, n) until its top is a character (or it is empty) into out.
 * w[0, n-1) is left as found. */
static int expand(const jlm_gram *g, xwork *X, size_t n, sset *out, int depth)
{
    uint32_t *w = X->w;
    if (n == 0) return sset_add(out, w, 0);
    uint32_t p = w[n - 1];
    if (g->el[p].t == GE_CHR) return sset_add(out, w, n);
    if (depth > 4096) return 0;   /* bounded: a chain of rules this long is dropped */
    int seen = xwork_seen(X, n);
    if (seen) return seen == 1 ? 0 : seen;
    size_t m = n - 1;
    if (!jlm_gram_is_end(&g->el[p + 1])) w[m++] = p + 1;
    int rc = 0;
    for (uint32_t a = g->rule[g->el[p].v];;) {
        if (jlm_gram_is_end(&g->el[a])) rc = expand(g, X, m, out, depth + 1);
        else if (m < JLM_GRAM_MAX_STACK) {
            w[m] = a;
            rc = expand(g, X, m + 1, out, depth + 1);
        }
        if (rc) break;
        while (!jlm_gram_is_end(&g->el[a])) a++;
        if (g->el[a].t == GE_END) break;
        a++;
    }
    w[n - 1] = p;
    return rc;
}

/* The stacks of in whose top accepts cp, advanced past it, into out. */
static int accept_cp(const jlm_gram *g, const sset *in, uint32_t cp, sset *out, xwork *X)
{
    uint32_t *w = X->w;
    sset_clear(out);
    xwork_reset(X);
    for (size_t k = 0; k < in->ns; k++) {
        size_t n = in->off[k + 1] - in->off[k];
        if (!n) continue;
        const uint32_t *s = in->d + in->off[k];
        uint32_t p = s[n - 1];
        if (!cls_has(g, g->el[p].v, cp, cp)) continue;
        memcpy(w, s, n * sizeof *w);
        w[n - 1] = p + 1;
        if (jlm_gram_is_end(&g->el[p + 1])) n--;
        int rc = expand(g, X, n, out, 0);
        if (rc) return rc;
    }
    return 0;
}

/* The stacks of in whose top can take a code point in [lo, hi]. */
static int filter(const jlm_gram *g, const sset *in, uint32_t lo, uint32_t hi, sset *out)
{
    sset_clear(out);
    for (size_t k = 0; k < in->ns; k++) {
        size_t n = in->off[k + 1] - in->off[k];
        if (n && cls_has(g, g->el[in->d[in->off[k] + n - 1]].v, lo, hi) && sset_add(out, in->d + in->off[k], n))
            return JLM_ENOMEM;
    }
    return 0;
}

typedef struct u8st { uint32_t cp, rem, min; } u8st;   /* a code point being decoded; min: the least value its length may encode */

/* Feeds one byte: out gets the stacks alive after it, *st the UTF-8 state.
 * Returns 1 alive, 0 dead, or JLM_ENOMEM. */
static int feed(const jlm_gram *g, const sset *in, u8st *st, unsigned char b, sset *out, xwork *X)
{
    uint32_t cp, rem, min = st->min;
    if (!st->rem) {
        if (b < 0x80) { cp = b; rem = 0; min = 0; }
        else if (b >= 0xC2 && b <= 0xDF) { cp = b & 0x1F; rem = 1; min = 0x80; }
        else if (b >= 0xE0 && b <= 0xEF) { cp = b & 0x0F; rem = 2; min = 0x800; }
        else if (b >= 0xF0 && b <= 0xF4) { cp = b & 0x07; rem = 3; min = 0x10000; }
        else return 0;
    } else {
        if ((b & 0xC0) != 0x80) return 0;
        cp = (st->cp << 6) | (b & 0x3F);
        rem = st->rem - 1;
    }
    int rc;
    if (rem) {
        uint32_t lo = cp << (6 * rem), hi = lo | ((1u << (6 * rem)) - 1);
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo < min) lo = min;                        /* overlong */
        if (lo >= 0xD800 && hi <= 0xDFFF) return 0;    /* only surrogates */
        if (lo > hi) return 0;
        rc = filter(g, in, lo, hi, out);
    } else {
        if (cp < min || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;   /* overlong, or a surrogate: not UTF-8 */
        rc = accept_cp(g, in, cp, out, X);
    }
    if (rc) return rc;
    st->cp = rem ? cp : 0;   /* a finished code point leaves no state (the cache keys on it) */
    st->rem = rem;
    st->min = rem ? min : 0;
    return out->ns > 0;
}

static size_t set_cost(const jlm_gram *g, const sset *s, const u8st *st)
{
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < s->ns; k++) {
        size_t c = st->rem;
        for (uint32_t j = s->off[k]; j < s->off[k + 1]; j++) c += g->dist[s->d[j]];
        if (c < best) best = c;
    }
    return best;
}

static int set_can_end(const sset *s, const u8st *st)
{
    if (st->rem) return 0;
    for (size_t k = 0; k < s->ns; k++)
        if (s->off[k + 1] == s->off[k]) return 1;
    return 0;
}

/* ---------------------------------------------------------------- vocab trie */
typedef struct tnode {
    uint32_t c0, c1;   /* children [c0, c1) */
    uint32_t t0, t1;   /* tokens ending here: ids tok[t0, t1) */
    uint32_t byte;
} tnode;

struct jlm_gram_vocab {
    uint32_t  n;
    char     *blob;    /* every piece, back to back */
    size_t   *boff;    /* (n + 1,) */
    uint8_t  *eog;
    tnode    *nd;
    uint32_t  nn;
    uint32_t *tok;     /* ids sorted by piece */
    uint32_t  ntok, maxlen;
};

void jlm_gram_vocab_free(jlm_gram_vocab *v)
{
    if (!v) return;
    free(v->blob);
    free(v->boff);
    free(v->eog);
    free(v->nd);
    free(v->tok);
    free(v);
}

static int by_piece(const void *a, const void *b, void *ctx)
{
    const jlm_gram_vocab *sort_v = ctx;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    size_t lx = sort_v->boff[x + 1] - sort_v->boff[x], ly = sort_v->boff[y + 1] - sort_v->boff[y];
    int c = memcmp(sort_v->blob + sort_v->boff[x], sort_v->blob + sort_v->boff[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx < ly ? -1 : lx > ly ? 1 : (x < y ? -1 : 1);
}

static unsigned char piece_at(const jlm_gram_vocab *v, uint32_t id, size_t k)
{
    return (unsigned char)v->blob[v->boff[id] + k];
}

/* Node `at` holds the tokens tok[lo, hi), which share their first `depth` bytes. */
static void build(jlm_gram_vocab *v, uint32_t at, uint32_t lo, uint32_t hi, size_t depth)
{
    uint32_t k = lo;
    while (k < hi && v->boff[v->tok[k] + 1] - v->boff[v->tok[k]] == depth) k++;
    v->nd[at].t0 = lo;
    v->nd[at].t1 = k;
    uint32_t groups = 0;
    for (uint32_t j = k; j < hi; j++)
        if (j == k || piece_at(v, v->tok[j], depth) != piece_at(v, v->tok[j - 1], depth)) groups++;
    v->nd[at].c0 = v->nn;
    v->nd[at].c1 = v->nn + groups;
    uint32_t c = v->nn;
    v->nn += groups;
    for (uint32_t j = k; j < hi;) {
        uint32_t e = j + 1;
        unsigned char b = piece_at(v, v->tok[j], depth);
        while (e < hi && piece_at(v, v->tok[e], depth) == b) e++;
        v->nd[c].byte = b;
        build(v, c, j, e, depth + 1);
        c++;
        j = e;
    }
}

int jlm_gram_vocab_new(uint32_t n, const char *const *pieces, const size_t *lens, const uint8_t *is_eog,
                       jlm_gram_vocab **out, jlm_err *err)
{
    jlm_gram_vocab *v = calloc(1, sizeof *v);
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += lens[i];
    if (v) {
        v->n = n;
        v->blob = malloc(total + 1);
        v->boff = malloc(sizeof *v->boff * ((size_t)n + 1));
        v->eog = calloc(n ? n : 1, 1);
        v->tok = malloc(sizeof *v->tok * (n ? n : 1));
        v->nd = calloc(total + 1, sizeof *v->nd);
    }
    if (!v || !v->blob || !v->boff || !v->eog || !v->tok || !v->nd) {
        jlm_gram_vocab_free(v);
        return jlm_errf(err, JLM_ENOMEM, "grammar: out of memory for the vocabulary trie");
    }
    size_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        v->boff[i] = at;
        if (lens[i]) memcpy(v->blob + at, pieces[i], lens[i]);
        at += lens[i];
        v->eog[i] = is_eog && is_eog[i];
        if (!v->eog[i] && lens[i]) v->tok[v->ntok++] = i;
        if (lens[i] > v->maxlen) v->maxlen = (uint32_t)lens[i];
    }
    v->boff[n] = at;
    qsort_r(v->tok, v->ntok, sizeof *v->tok, by_piece, v);   /* glibc's: reentrant, so two models may load at once */
    v->nn = 1;
    build(v, 0, 0, v->ntok, 0);
    *out = v;
    return 0;
}

int jlm_gram_vocab_from_tok(const jlm_tok *t, jlm_gram_vocab **out, jlm_err *err)
{
    uint32_t n = jlm_tok_n_tokens(t);
    const char **pc = malloc(sizeof *pc * (n ? n : 1));
    size_t *ln = malloc(sizeof *ln * (n ? n : 1));
    uint8_t *eog = malloc(n ? n : 1);
    int rc = 0;
    if (!pc || !ln || !eog) rc = jlm_errf(err, JLM_ENOMEM, "grammar: out of memory for the vocabulary trie");
    for (uint32_t i = 0; !rc && i < n; i++) {
        rc = jlm_tok_piece(t, (int32_t)i, 0, &pc[i], &ln[i], err);
        eog[i] = (uint8_t)(jlm_tok_is_eog(t, (int32_t)i) != 0);
    }
    if (!rc) rc = jlm_gram_vocab_new(n, pc, ln, eog, out, err);
    free(pc);
    free(ln);
    free(eog);
    return rc;
}

/* ---------------------------------------------------------------- matcher */
struct jlm_gram_match {
    const jlm_gram *g;
    sset      cur, tmp;
    u8st      st;
    xwork     x;          /* one step's expansions */
    sset     *lv;         /* one set per trie depth */
    size_t    nlv;
    uint8_t  *allow;
    size_t    nallow;
    /* The transition cache: stack sets (with their UTF-8 state) interned as
     * numbered states, and (state, byte) -> state or CACHE_DEAD. States are
     * pure functions of their content, so the cache stays valid across steps;
     * it is emptied at the start of a mask once it holds CACHE_MAX states. */
    struct gstate **states;
    uint32_t  nstates, capstates;
    uint32_t *sidx;       /* open addressing: state id + 1, 0 empty */
    uint32_t  sidx_cap;
    uint64_t *tkey;       /* (state << 8 | byte) + 1, 0 empty */
    uint32_t *tval;
    uint32_t  tcap, tn;
    size_t    cache_words;   /* the states' entries and offsets */
};

typedef struct gstate {
    sset      s;
    u8st      st;
    uint32_t  h;
    size_t    cost;     /* the close cost, once asked (costed) */
    int       costed;
    uint32_t  visits;   /* walks from this state; at ROW_AFTER it gets a row */
    uint32_t *row;      /* (256,) byte -> state, CACHE_DEAD or CACHE_MISS: a hot state's transitions without hashing */
} gstate;

#define ROW_AFTER 4

#define CACHE_MAX  16384u
#define CACHE_WORDS (1u << 24)        /* 64 MiB of states at most */
#define CACHE_NONE UINT32_MAX        /* no state (not interned) */
#define CACHE_DEAD (UINT32_MAX - 1)  /* the byte kills every stack */
#define CACHE_MISS (UINT32_MAX - 2)

static void cache_clear(jlm_gram_match *m)
{
    for (uint32_t k = 0; k < m->nstates; k++) {
        sset_free(&m->states[k]->s);
        free(m->states[k]->row);
        free(m->states[k]);
    }
    m->nstates = 0;
    m->cache_words = 0;
    if (m->sidx) memset(m->sidx, 0, sizeof *m->sidx * m->sidx_cap);
    if (m->tkey) memset(m->tkey, 0, sizeof *m->tkey * m->tcap);
    m->tn = 0;
}

static uint32_t set_hash(const sset *s, const u8st *st)
{
    uint32_t h = 2166136261u ^ st->cp ^ (st->rem << 24);
    for (size_t k = 0; k < s->ns; k++) h = (h ^ s->h[k] ^ (s->off[k + 1] - s->off[k])) * 16777619u;
    return h;
}

static int same_set(const gstate *a, const sset *s, const u8st *st, uint32_t h)
{
    return a->h == h && a->st.cp == st->cp && a->st.rem == st->rem && a->s.ns == s->ns && a->s.nd == s->nd &&
           !memcmp(a->s.off, s->off, sizeof *s->off * (s->ns + 1)) && (!s->nd || !memcmp(a->s.d, s->d, sizeof *s->d * s->nd));
}

/* The id of the state holding (s, st), made if new; CACHE_NONE when the cache
 * is full or memory is short (the caller then works uncached). */
static uint32_t intern(jlm_gram_match *m, const sset *s, const u8st *st)
{
    if (!m->sidx) {
        m->sidx_cap = 2 * CACHE_MAX;
        m->sidx = calloc(m->sidx_cap, sizeof *m->sidx);
        m->capstates = CACHE_MAX;
        m->states = malloc(sizeof *m->states * m->capstates);
        if (!m->sidx || !m->states) {
            free(m->sidx); free(m->states);
            m->sidx = NULL; m->states = NULL;
            return CACHE_NONE;
        }
    }
    uint32_t h = set_hash(s, st), mask = m->sidx_cap - 1, k = h & mask;
    for (; m->sidx[k]; k = (k + 1) & mask)
        if (same_set(m->states[m->sidx[k] - 1], s, st, h)) return m->sidx[k] - 1;
    if (m->nstates >= CACHE_MAX || m->cache_words + s->nd + 2 * s->ns > CACHE_WORDS) return CACHE_NONE;
    gstate *g = calloc(1, sizeof *g);
    if (!g || sset_copy(&g->s, s)) {
        if (g) sset_free(&g->s);
        free(g);
        return CACHE_NONE;
    }
    m->cache_words += s->nd + 2 * s->ns;
    g->st = *st;
    g->h = h;
    m->states[m->nstates] = g;
    m->sidx[k] = ++m->nstates;
    return m->nstates - 1;
}

/* A state's close cost, computed the first time a walk with a budget asks. */
static size_t state_cost(jlm_gram_match *m, uint32_t sid)
{
    gstate *S = m->states[sid];
    if (!S->costed) {
        S->cost = set_cost(m->g, &S->s, &S->st);
        S->costed = 1;
    }
    return S->cost;
}

static uint32_t trans_get(const jlm_gram_match *m, uint32_t sid, unsigned b)
{
    if (!m->tcap) return CACHE_MISS;
    uint64_t key = ((uint64_t)sid << 8 | b) + 1;
    uint32_t mask = m->tcap - 1, k = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
    for (; m->tkey[k]; k = (k + 1) & mask)
        if (m->tkey[k] == key) return m->tval[k];
    return CACHE_MISS;
}

static void trans_put(jlm_gram_match *m, uint32_t sid, unsigned b, uint32_t to)
{
    if ((m->tn + 1) * 2 > m->tcap) {   /* grow (rehash) at half load */
        uint32_t nc = m->tcap ? m->tcap * 2 : 1u << 12;
        uint64_t *nk = calloc(nc, sizeof *nk);
        uint32_t *nv = malloc(sizeof *nv * nc);
        if (!nk || !nv) { free(nk); free(nv); return; }   /* uncached then */
        for (uint32_t i = 0; i < m->tcap; i++)
            if (m->tkey[i]) {
                uint32_t k = (uint32_t)((m->tkey[i] * 0x9E3779B97F4A7C15ull) >> 32) & (nc - 1);
                while (nk[k]) k = (k + 1) & (nc - 1);
                nk[k] = m->tkey[i];
                nv[k] = m->tval[i];
            }
        free(m->tkey); free(m->tval);
        m->tkey = nk; m->tval = nv; m->tcap = nc;
    }
    uint64_t key = ((uint64_t)sid << 8 | b) + 1;
    uint32_t mask = m->tcap - 1, k = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
    while (m->tkey[k] && m->tkey[k] != key) k = (k + 1) & mask;
    if (!m->tkey[k]) m->tn++;
    m->tkey[k] = key;
    m->tval[k] = to;
}

void jlm_gram_match_free(jlm_gram_match *m)
{
    if (!m) return;
    sset_free(&m->cur);
    sset_free(&m->tmp);
    for (size_t k = 0; k < m->nlv; k++) sset_free(&m->lv[k]);
    free(m->lv);
    xwork_free(&m->x);
    free(m->allow);
    cache_clear(m);
    free(m->states);
    free(m->sidx);
    free(m->tkey);
    free(m->tval);
    free(m);
}

int jlm_gram_match_new(const jlm_gram *g, jlm_gram_match **out, jlm_err *err)
{
    jlm_gram_match *m = calloc(1, sizeof *m);
    int rc = !m ? JLM_ENOMEM : xwork_init(&m->x);
    if (!rc) {
        m->g = g;
        /* expand a virtual stack [root's alternatives] */
        sset_clear(&m->cur);
        xwork_reset(&m->x);
        for (uint32_t a = g->rule[g->root]; !rc;) {
            if (jlm_gram_is_end(&g->el[a])) rc = expand(g, &m->x, 0, &m->cur, 0);
            else {
                m->x.w[0] = a;
                rc = expand(g, &m->x, 1, &m->cur, 0);
            }
            while (!jlm_gram_is_end(&g->el[a])) a++;
            if (g->el[a].t == GE_END) break;
            a++;
        }
    }
    if (rc) {
        jlm_gram_match_free(m);
        return jlm_errf(err, JLM_ENOMEM, "grammar: out of memory for the matcher");
    }
    *out = m;
    return 0;
}

int jlm_gram_can_end(const jlm_gram_match *m) { return set_can_end(&m->cur, &m->st); }

size_t jlm_gram_close_cost(const jlm_gram_match *m) { return set_cost(m->g, &m->cur, &m->st); }

int jlm_gram_accept_bytes(jlm_gram_match *m, const char *bytes, size_t len, jlm_err *err)
{
    sset a = {0}, b = {0};
    u8st st = m->st;
    int rc = sset_copy(&a, &m->cur);
    for (size_t k = 0; !rc && k < len; k++) {
        rc = feed(m->g, &a, &st, (unsigned char)bytes[k], &b, &m->x);
        if (rc == 0) rc = jlm_errf(err, JLM_EINVAL, "grammar: byte %zu of the text does not continue the grammar", k);
        else if (rc == 1) {
            sset t = a; a = b; b = t;
            rc = 0;
        } else rc = jlm_errf(err, JLM_ENOMEM, "grammar: out of memory");
    }
    if (!rc) {
        sset t = m->cur; m->cur = a; a = t;
        m->st = st;
    }
    sset_free(&a);
    sset_free(&b);
    return rc;
}

int jlm_gram_accept(jlm_gram_match *m, const jlm_gram_vocab *v, int32_t id, jlm_err *err)
{
    if (id < 0 || (uint32_t)id >= v->n) return jlm_errf(err, JLM_ERANGE, "grammar: token %d outside the vocabulary", id);
    if (v->eog[id])
        return jlm_gram_can_end(m) ? 0 : jlm_errf(err, JLM_EINVAL, "grammar: end of generation before the grammar is complete");
    size_t len = v->boff[id + 1] - v->boff[id];
    if (!len) return jlm_errf(err, JLM_EINVAL, "grammar: token %d has no text", id);
    return jlm_gram_accept_bytes(m, v->blob + v->boff[id], len, err);
}

typedef struct walk {
    jlm_gram_match      *m;
    const jlm_gram_vocab *v;
    long                 budget;   /* < 0: none; else the highest close cost allowed after the token */
    size_t               now;      /* close cost before the token (for the fallback rule) */
    int                  progress; /* 1: allow only tokens that lower the close cost */
    long                 n;
} walk;

/* Records state sid's transition on byte b: in its row when it has one,
 * else in the table (no state: nothing). */
static void trans_remember(jlm_gram_match *m, gstate *S, uint32_t sid, unsigned b, uint32_t to)
{
    if (S && S->row) S->row[b] = to;
    else if (S) trans_put(m, sid, b, to);
}

#define GROUP_COLS 256   /* distinct top classes a set may have for its bytes to be grouped */
#define GROUP_MIN  16    /* children below 0x80 a trie node needs before grouping pays */

/* Groups the bytes below 0x80 by which stacks of in take them. A step on a
 * whole code point depends only on that (the stacks that take it are
 * advanced and expanded in the same order), so every byte of a group leads to
 * one set and a walk feeds one byte of each: an ambiguous grammar whose tops
 * take most bytes costs one step, not 128. grp[b] = the group of b; returns
 * the number of groups, or 0 when the tops have too many distinct classes. */
static int ascii_groups(const jlm_gram *g, const sset *in, uint8_t grp[128])
{
    uint64_t bits[128][GROUP_COLS / 64];
    uint32_t col[2 * GROUP_COLS];   /* open addressing: class id + 1, 0 empty */
    memset(bits, 0, sizeof bits);
    memset(col, 0, sizeof col);
    uint32_t ncol = 0;
    for (size_t k = 0; k < in->ns; k++) {
        size_t n = in->off[k + 1] - in->off[k];
        if (!n) continue;
        uint32_t c = g->el[in->d[in->off[k] + n - 1]].v, h = (c * 0x9E3779B9u) & (2 * GROUP_COLS - 1);
        while (col[h] && col[h] != c + 1) h = (h + 1) & (2 * GROUP_COLS - 1);
        if (col[h]) continue;
        if (ncol == GROUP_COLS) return 0;
        col[h] = c + 1;
        for (uint32_t r = g->cls[c]; r < g->cls[c + 1] && g->rng[2 * r] < 128; r++)
            for (uint32_t b = g->rng[2 * r]; b <= g->rng[2 * r + 1] && b < 128; b++)
                bits[b][ncol / 64] |= 1ull << (ncol % 64);
        ncol++;
    }
    uint8_t rep[128];
    int ng = 0;
    for (int b = 0; b < 128; b++) {
        int j = 0;
        while (j < ng && memcmp(bits[rep[j]], bits[b], sizeof bits[b])) j++;
        if (j == ng) rep[ng++] = (uint8_t)b;
        grp[b] = (uint8_t)j;
    }
    return ng;
}

static int walk_node(walk *W, uint32_t node, size_t depth, const sset *in, u8st st, uint32_t sid)
{
    jlm_gram_match *m = W->m;
    if (depth + 1 >= m->nlv) {
        size_t nn = depth + 2 > W->v->maxlen + 2 ? depth + 2 : W->v->maxlen + 2;
        sset *l = realloc(m->lv, sizeof *l * nn);
        if (!l) return JLM_ENOMEM;
        memset(l + m->nlv, 0, sizeof *l * (nn - m->nlv));
        m->lv = l;
        m->nlv = nn;
    }
    const tnode *nd = &W->v->nd[node];
    gstate *S = sid != CACHE_NONE ? m->states[sid] : NULL;
    if (S && !S->row && ++S->visits >= ROW_AFTER && (S->row = malloc(sizeof *S->row * 256)))
        for (int b = 0; b < 256; b++) S->row[b] = trans_get(m, sid, (unsigned)b);
    uint8_t grp[128];
    uint32_t gres[128];   /* each group's state once fed: an id, CACHE_DEAD, or CACHE_MISS */
    int ng = 0;
    if (!st.rem && nd->c1 - nd->c0 >= GROUP_MIN && W->v->nd[nd->c0 + GROUP_MIN - 1].byte < 128) {
        ng = ascii_groups(m->g, in, grp);
        for (int j = 0; j < ng; j++) gres[j] = CACHE_MISS;
    }
    for (uint32_t c = nd->c0; c < nd->c1; c++) {
        const tnode *ch = &W->v->nd[c];
        const sset *out;
        u8st s2 = st;
        int gi = ng && ch->byte < 128 ? grp[ch->byte] : -1;   /* the byte's group, when grouped */
        uint32_t osid = S ? (S->row ? S->row[ch->byte] : trans_get(m, sid, ch->byte)) : CACHE_MISS;
        if (osid == CACHE_MISS && gi >= 0 && gres[gi] != CACHE_MISS) {
            osid = gres[gi];   /* the same set as an earlier byte of its group */
            trans_remember(m, S, sid, ch->byte, osid);
        }
        if (gi >= 0) gres[gi] = osid;
        if (osid == CACHE_DEAD) continue;
        if (osid != CACHE_MISS) {
            out = &m->states[osid]->s;
            s2 = m->states[osid]->st;
        } else {
            int rc = feed(m->g, in, &s2, (unsigned char)ch->byte, &m->lv[depth + 1], &m->x);
            if (rc < 0) return rc;
            if (!rc) {
                trans_remember(m, S, sid, ch->byte, CACHE_DEAD);
                if (gi >= 0) gres[gi] = CACHE_DEAD;
                continue;
            }
            out = &m->lv[depth + 1];
            osid = intern(m, out, &s2);
            if (osid != CACHE_NONE) {
                trans_remember(m, S, sid, ch->byte, osid);
                if (gi >= 0) gres[gi] = osid;
                out = &m->states[osid]->s;
            }
        }
        if (ch->t1 > ch->t0) {
            int ok = 1;
            if (W->budget >= 0 || W->progress) {
                size_t cost = osid < m->nstates ? state_cost(m, osid) : set_cost(m->g, out, &s2);
                ok = W->progress ? cost < W->now : cost <= (size_t)W->budget;
            }
            if (ok)
                for (uint32_t t = ch->t0; t < ch->t1; t++) {
                    m->allow[W->v->tok[t]] = 1;
                    W->n++;
                }
        }
        if (ch->c1 > ch->c0) {
            int rc = walk_node(W, c, depth + 1, out, s2, osid);
            if (rc) return rc;
        }
    }
    return 0;
}

long jlm_gram_mask(jlm_gram_match *m, const jlm_gram_vocab *v, int32_t tokens_left, float *logits)
{
    if (m->nallow < v->n) {
        uint8_t *a = realloc(m->allow, v->n);
        if (!a) return JLM_ENOMEM;
        m->allow = a;
        m->nallow = v->n;
    }
    memset(m->allow, 0, v->n);
    walk W = {.m = m, .v = v, .budget = tokens_left > 0 ? (long)tokens_left - 1 : -1};
    W.now = set_cost(m->g, &m->cur, &m->st);
    if (m->nstates >= CACHE_MAX || m->cache_words >= CACHE_WORDS / 2) cache_clear(m);
    uint32_t sid = intern(m, &m->cur, &m->st);
    int rc = walk_node(&W, 0, 0, sid != CACHE_NONE ? &m->states[sid]->s : &m->cur, m->st, sid);
    if (!rc && W.n == 0 && W.budget >= 0 && !jlm_gram_can_end(m)) {   /* over budget already: shrink */
        W.budget = -1;
        W.progress = 1;
        rc = walk_node(&W, 0, 0, sid != CACHE_NONE ? &m->states[sid]->s : &m->cur, m->st, sid);
    }
    if (rc) return JLM_ENOMEM;
    int end = jlm_gram_can_end(m);
    for (uint32_t i = 0; i < v->n; i++) {
        if (v->eog[i] && end) { W.n++; continue; }
        if (!m->allow[i]) logits[i] = -INFINITY;
    }
    return W.n;
}
