/* gbnf.c - GBNF text -> jlm_gram: a recursive-descent parser that writes each
 * rule as flat elements (groups and repetitions become generated rules), then
 * the checks that make matching total: every rule defined, no left recursion,
 * every rule able to finish, and the fewest-bytes table the closing uses. */
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar_int.h"

typedef struct elv { jlm_gram_el *e; uint32_t n, cap; } elv;

typedef struct prule {
    const char *name;   /* into the source; NULL for a generated rule */
    size_t      nlen;
    elv         body;
    int         defined;
    size_t      used_at; /* offset of the first reference */
} prule;

typedef struct P {
    const char *s;
    size_t      n, i;
    prule      *r;
    uint32_t    nr, capr;
    uint32_t   *rng;     /* pairs */
    uint32_t    nrng, caprng;
    uint32_t   *cls;     /* start of each class in rng (pairs), closed at the end */
    uint32_t    ncls, capcls;
    size_t      total;   /* elements written so far */
    jlm_err    *err;
} P;

#define GROW(ptr, cnt, cap, need)                                                  \
    do {                                                                           \
        if ((cnt) + (need) > (cap)) {                                              \
            size_t nc_ = (cap) ? (size_t)(cap) * 2 : 16;                           \
            while (nc_ < (size_t)(cnt) + (need)) nc_ *= 2;                         \
            void *np_ = realloc((ptr), nc_ * sizeof *(ptr));                       \
            if (!np_) return jlm_errf(p->err, JLM_ENOMEM, "grammar: out of memory"); \
            (ptr) = np_;                                                           \
            (cap) = (uint32_t)nc_;                                                 \
        }                                                                          \
    } while (0)

static int perr(P *p, size_t at, const char *why)
{
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') { line++; col = 1; }
        else col++;
    }
    return jlm_errf(p->err, JLM_EFORMAT, "grammar: line %zu, column %zu: %s", line, col, why);
}

static int push(P *p, elv *v, uint32_t t, uint32_t val)
{
    if (p->total >= JLM_GRAM_MAX_ELEMS)
        return perr(p, p->i, "grammar too large (more than 1048576 elements)");
    GROW(v->e, v->n, v->cap, 1);
    v->e[v->n++] = (jlm_gram_el){t, val};
    p->total++;
    return 0;
}

static int new_rule(P *p, const char *name, size_t nlen, uint32_t *id)
{
    if (p->nr >= JLM_GRAM_MAX_RULES)
        return perr(p, p->i, "too many rules (more than 65536)");
    GROW(p->r, p->nr, p->capr, 1);
    p->r[p->nr] = (prule){.name = name, .nlen = nlen, .used_at = p->i};
    *id = p->nr++;
    return 0;
}

static int rule_id(P *p, const char *name, size_t nlen, uint32_t *id)
{
    for (uint32_t k = 0; k < p->nr; k++)
        if (p->r[k].name && p->r[k].nlen == nlen && !memcmp(p->r[k].name, name, nlen)) {
            *id = k;
            return 0;
        }
    return new_rule(p, name, nlen, id);
}

/* A class of the ranges rng[from, nrng) (pairs): sorted, merged, negated if asked. */
static int close_class(P *p, uint32_t from, int negate, size_t at, uint32_t *id)
{
    uint32_t k = p->nrng - from;
    uint32_t *a = k ? p->rng + 2 * from : NULL;   /* rng is still NULL before a grammar's first range */
    for (uint32_t x = 1; x < k; x++)   /* insertion sort: classes are short */
        for (uint32_t y = x; y > 0 && a[2 * y] < a[2 * (y - 1)]; y--) {
            uint32_t t0 = a[2 * y], t1 = a[2 * y + 1];
            a[2 * y] = a[2 * (y - 1)]; a[2 * y + 1] = a[2 * (y - 1) + 1];
            a[2 * (y - 1)] = t0; a[2 * (y - 1) + 1] = t1;
        }
    uint32_t m = 0;
    for (uint32_t x = 0; x < k; x++) {
        if (m && a[2 * x] <= a[2 * (m - 1) + 1] + 1) {
            if (a[2 * x + 1] > a[2 * (m - 1) + 1]) a[2 * (m - 1) + 1] = a[2 * x + 1];
        } else {
            a[2 * m] = a[2 * x]; a[2 * m + 1] = a[2 * x + 1]; m++;
        }
    }
    if (negate) {
        uint32_t tmp[2 * 64], *t = m + 1 <= 64 ? tmp : malloc(sizeof *t * 2 * (m + 1));
        if (!t) return jlm_errf(p->err, JLM_ENOMEM, "grammar: out of memory");
        uint32_t q = 0, next = 0;
        for (uint32_t x = 0; x < m; x++) {
            if (a[2 * x] > next) { t[2 * q] = next; t[2 * q + 1] = a[2 * x] - 1; q++; }
            next = a[2 * x + 1] + 1;
        }
        if (next <= 0x10FFFF) { t[2 * q] = next; t[2 * q + 1] = 0x10FFFF; q++; }
        p->nrng = from;
        int rc = 0;
        if (q) {
            if (p->nrng + q > p->caprng / 2) {
                size_t nc = (p->nrng + q) * 4;
                void *np = realloc(p->rng, nc * sizeof *p->rng);
                if (!np) rc = jlm_errf(p->err, JLM_ENOMEM, "grammar: out of memory");
                else { p->rng = np; p->caprng = (uint32_t)nc; }
            }
            if (!rc) memcpy(p->rng + 2 * from, t, sizeof *t * 2 * q);
        }
        if (t != tmp) free(t);
        if (rc) return rc;
        m = q;
    }
    p->nrng = from + m;
    if (!m) return perr(p, at, "empty character class (it can match nothing)");
    GROW(p->cls, p->ncls, p->capcls, 2);
    p->cls[p->ncls] = from;
    *id = p->ncls++;
    return 0;
}

static int add_range(P *p, uint32_t lo, uint32_t hi)
{
    if (p->nrng + 1 > p->caprng / 2) {
        size_t nc = p->caprng ? (size_t)p->caprng * 2 : 64;
        void *np = realloc(p->rng, nc * sizeof *p->rng);
        if (!np) return jlm_errf(p->err, JLM_ENOMEM, "grammar: out of memory");
        p->rng = np;
        p->caprng = (uint32_t)nc;
    }
    p->rng[2 * p->nrng] = lo;
    p->rng[2 * p->nrng + 1] = hi;
    p->nrng++;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class at p->i (an escape or one UTF-8
 * sequence) -> *cp. */
static int read_char(P *p, uint32_t *cp)
{
    size_t at = p->i;
    unsigned char c = (unsigned char)p->s[p->i];
    if (c == '\\') {
        if (p->i + 1 >= p->n) return perr(p, at, "unfinished escape");
        char e = p->s[p->i + 1];
        int nd = 0;
        switch (e) {
        case 'n': *cp = '\n'; break;
        case 'r': *cp = '\r'; break;
        case 't': *cp = '\t'; break;
        case '\\': case '"': case '[': case ']': case '-': case '/': case '\'': *cp = (uint32_t)e; break;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default: return perr(p, at, "unknown escape");
        }
        p->i += 2;
        if (nd) {
            uint32_t v = 0;
            for (int k = 0; k < nd; k++) {
                int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
                if (h < 0) return perr(p, at, "escape needs hex digits");
                v = v * 16 + (uint32_t)h;
                p->i++;
            }
            if (v > 0x10FFFF) return perr(p, at, "code point above U+10FFFF");
            *cp = v;
        }
        return 0;
    }
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || p->i + (size_t)len > p->n) return perr(p, at, "invalid UTF-8 in the grammar");
    uint32_t v = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        unsigned char d = (unsigned char)p->s[p->i + (size_t)k];
        if ((d & 0xC0) != 0x80) return perr(p, at, "invalid UTF-8 in the grammar");
        v = (v << 6) | (d & 0x3F);
    }
    if (v > 0x10FFFF) return perr(p, at, "invalid UTF-8 in the grammar");
    *cp = v;
    p->i += (size_t)len;
    return 0;
}

static void skip_space(P *p, int newline_ok)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t') p->i++;
        else if (c == '#') { while (p->i < p->n && p->s[p->i] != '\n') p->i++; }
        else if ((c == '\n' || c == '\r') && newline_ok) p->i++;
        else break;
    }
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int parse_alternates(P *p, uint32_t rule, int nested, int depth);

/* A rule holding body[from, n) of v (moved out of v). */
static int wrap(P *p, uint32_t rule, uint32_t from, uint32_t *id)
{
    int rc = new_rule(p, NULL, 0, id);
    if (rc) return rc;
    elv *v = &p->r[rule].body, *b = &p->r[*id].body;
    for (uint32_t k = from; k < v->n && !rc; k++) rc = push(p, b, v->e[k].t, v->e[k].v);
    if (!rc) rc = push(p, b, GE_END, 0);
    p->total -= v->n - from;
    v->n = from;
    p->r[*id].defined = 1;
    return rc;
}

/* t ... : the generated rule R ::= t R | t (plus) or t R | "" (star) or
 * t | "" (opt, with next = none) or t next | "" (nested optional). */
static int gen_rule(P *p, jlm_gram_el t, int self, int has_next, uint32_t next, uint32_t *id)
{
    int rc = new_rule(p, NULL, 0, id);
    if (rc) return rc;
    elv *b = &p->r[*id].body;
    rc = push(p, b, t.t, t.v);
    if (!rc && self) rc = push(p, &p->r[*id].body, GE_REF, *id);
    if (!rc && has_next) rc = push(p, &p->r[*id].body, GE_REF, next);
    if (!rc) rc = push(p, &p->r[*id].body, GE_ALT, 0);
    if (!rc) rc = push(p, &p->r[*id].body, GE_END, 0);
    p->r[*id].defined = 1;
    return rc;
}

static int read_count(P *p, uint32_t *v)
{
    size_t at = p->i;
    uint64_t x = 0;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return perr(p, at, "expected a number in {m,n}");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (x > JLM_GRAM_MAX_REPEAT) return perr(p, at, "repetition count above 1000");
    }
    *v = (uint32_t)x;
    return 0;
}

/* Applies the repetition at p->i (if any) to v's elements [from, n). */
static int repetition(P *p, uint32_t rule, uint32_t from)
{
    char c = p->i < p->n ? p->s[p->i] : 0;
    if (c != '*' && c != '+' && c != '?' && c != '{') return 0;
    size_t at = p->i;
    uint32_t lo = 0, hi = 0;
    int unbounded = 0;
    p->i++;
    if (c == '*') unbounded = 1;
    else if (c == '+') { lo = 1; unbounded = 1; }
    else if (c == '?') hi = 1;
    else {
        skip_space(p, 0);
        int rc = read_count(p, &lo);
        if (rc) return rc;
        skip_space(p, 0);
        hi = lo;
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            skip_space(p, 0);
            if (p->i < p->n && p->s[p->i] == '}') unbounded = 1;
            else if ((rc = read_count(p, &hi))) return rc;
            skip_space(p, 0);
        }
        if (p->i >= p->n || p->s[p->i] != '}') return perr(p, at, "expected '}' closing {m,n}");
        p->i++;
        if (!unbounded && hi < lo) return perr(p, at, "{m,n} with n < m");
    }
    if (from == p->r[rule].body.n) return perr(p, at, "repetition of nothing");
    int rc = 0;
    if (p->r[rule].body.n - from > 1) {
        uint32_t id;
        if ((rc = wrap(p, rule, from, &id))) return rc;
        if ((rc = push(p, &p->r[rule].body, GE_REF, id))) return rc;
    }
    jlm_gram_el t = p->r[rule].body.e[from];
    p->total--;
    p->r[rule].body.n = from;   /* rewritten below */
    for (uint32_t k = 0; k < lo && !rc; k++) rc = push(p, &p->r[rule].body, t.t, t.v);
    if (rc) return rc;
    uint32_t id;
    if (unbounded) {
        if ((rc = gen_rule(p, t, 1, 0, 0, &id))) return rc;
        return push(p, &p->r[rule].body, GE_REF, id);
    }
    if (hi == lo) return 0;
    if ((rc = gen_rule(p, t, 0, 0, 0, &id))) return rc;
    for (uint32_t k = lo + 1; k < hi; k++) {
        uint32_t nid;
        if ((rc = gen_rule(p, t, 0, 1, id, &nid))) return rc;
        id = nid;
    }
    return push(p, &p->r[rule].body, GE_REF, id);
}

static int parse_sequence(P *p, uint32_t rule, int nested, int depth)
{
    for (;;) {
        skip_space(p, nested);
        if (p->i >= p->n) return 0;
        char c = p->s[p->i];
        uint32_t from = p->r[rule].body.n;
        size_t at = p->i;
        int rc = 0;
        if (c == '"') {
            p->i++;
            for (;;) {
                if (p->i >= p->n || p->s[p->i] == '\n') return perr(p, at, "unterminated literal");
                if (p->s[p->i] == '"') { p->i++; break; }
                uint32_t cp, id, mark = p->nrng;
                if ((rc = read_char(p, &cp)) || (rc = add_range(p, cp, cp)) || (rc = close_class(p, mark, 0, at, &id)) ||
                    (rc = push(p, &p->r[rule].body, GE_CHR, id)))
                    return rc;
            }
            if (p->r[rule].body.n == from) {   /* "" matches the empty string */
                skip_space(p, nested);
                if (p->i < p->n && strchr("*+?{", p->s[p->i])) return perr(p, at, "repetition of an empty literal");
                continue;
            }
        } else if (c == '[') {
            p->i++;
            int neg = 0;
            if (p->i < p->n && p->s[p->i] == '^') { neg = 1; p->i++; }
            uint32_t mark = p->nrng, id;
            for (;;) {
                if (p->i >= p->n || p->s[p->i] == '\n') return perr(p, at, "unterminated character class");
                if (p->s[p->i] == ']') { p->i++; break; }
                uint32_t lo, hi;
                if ((rc = read_char(p, &lo))) return rc;
                hi = lo;
                if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                    p->i++;
                    if ((rc = read_char(p, &hi))) return rc;
                    if (hi < lo) return perr(p, at, "character range with its end before its start");
                }
                if ((rc = add_range(p, lo, hi))) return rc;
            }
            if ((rc = close_class(p, mark, neg, at, &id)) || (rc = push(p, &p->r[rule].body, GE_CHR, id))) return rc;
        } else if (c == '.') {
            p->i++;
            uint32_t mark = p->nrng, id;
            if ((rc = add_range(p, 0, 0x10FFFF)) || (rc = close_class(p, mark, 0, at, &id)) ||
                (rc = push(p, &p->r[rule].body, GE_CHR, id)))
                return rc;
        } else if (c == '(') {
            if (depth >= JLM_GRAM_MAX_NEST) return perr(p, at, "parentheses nested deeper than 64");
            p->i++;
            uint32_t id;
            if ((rc = new_rule(p, NULL, 0, &id))) return rc;
            p->r[id].defined = 1;
            if ((rc = parse_alternates(p, id, 1, depth + 1))) return rc;
            skip_space(p, 1);
            if (p->i >= p->n || p->s[p->i] != ')') return perr(p, at, "'(' without its ')'");
            p->i++;
            if ((rc = push(p, &p->r[rule].body, GE_REF, id))) return rc;
        } else if (is_name_char(c)) {
            size_t s = p->i;
            while (p->i < p->n && is_name_char(p->s[p->i])) p->i++;
            uint32_t id;
            if ((rc = rule_id(p, p->s + s, p->i - s, &id)) || (rc = push(p, &p->r[rule].body, GE_REF, id))) return rc;
            if (!p->r[id].defined && p->r[id].used_at == p->i) p->r[id].used_at = s;   /* first use: point at its name */
        } else {
            return 0;   /* | ) newline, or something the caller reports */
        }
        skip_space(p, 0);
        if ((rc = repetition(p, rule, from))) return rc;
    }
}

static int parse_alternates(P *p, uint32_t rule, int nested, int depth)
{
    int rc = parse_sequence(p, rule, nested, depth);
    while (!rc && p->i < p->n && p->s[p->i] == '|') {
        p->i++;
        if ((rc = push(p, &p->r[rule].body, GE_ALT, 0))) return rc;
        skip_space(p, 1);
        rc = parse_sequence(p, rule, nested, depth);
    }
    return rc ? rc : push(p, &p->r[rule].body, GE_END, 0);
}

static int parse_all(P *p)
{
    for (;;) {
        skip_space(p, 1);
        if (p->i >= p->n) break;
        size_t at = p->i;
        while (p->i < p->n && is_name_char(p->s[p->i])) p->i++;
        if (p->i == at) return perr(p, at, "expected a rule name");
        uint32_t id;
        int rc = rule_id(p, p->s + at, p->i - at, &id);
        if (rc) return rc;
        if (p->r[id].defined) return perr(p, at, "rule defined twice");
        p->r[id].defined = 1;
        skip_space(p, 0);
        if (p->n - p->i < 3 || memcmp(p->s + p->i, "::=", 3)) return perr(p, p->i, "expected '::='");
        p->i += 3;
        skip_space(p, 1);
        if ((rc = parse_alternates(p, id, 0, 0))) return rc;
        skip_space(p, 0);
        if (p->i < p->n && p->s[p->i] != '\n' && p->s[p->i] != '\r')
            return perr(p, p->i, p->s[p->i] == ')' ? "')' without its '('" : "unexpected character");
    }
    return 0;
}

static uint32_t utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

static uint32_t sat_add(uint32_t a, uint32_t b) { return a >= JLM_GRAM_INF - b ? JLM_GRAM_INF : a + b; }

/* rmin and dist; JLM_EFORMAT for a rule that can never finish. */
static int lengths(jlm_gram *g, P *p)
{
    for (uint32_t r = 0; r < g->n_rules; r++) g->rmin[r] = JLM_GRAM_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            uint32_t best = g->rmin[r], sum = 0;
            for (uint32_t k = g->rule[r];; k++) {
                const jlm_gram_el *e = &g->el[k];
                if (jlm_gram_is_end(e)) {
                    if (sum < best) best = sum;
                    if (e->t == GE_END) break;
                    sum = 0;
                } else if (e->t == GE_CHR) sum = sat_add(sum, utf8_len(g->rng[2 * g->cls[e->v]]));
                else sum = sat_add(sum, g->rmin[e->v]);
            }
            if (best < g->rmin[r]) { g->rmin[r] = best; changed = 1; }
        }
    }
    for (uint32_t r = 0; r < g->n_rules; r++)
        if (g->rmin[r] == JLM_GRAM_INF) {
            uint32_t q = r;   /* name the user's rule that holds it */
            return p->r[q].name ? perr(p, p->r[q].used_at, "this rule can never finish (every alternative recurses)")
                                : perr(p, p->n, "a group or repetition can never finish (every alternative recurses)");
        }
    for (uint32_t k = g->n_el; k-- > 0;) {
        const jlm_gram_el *e = &g->el[k];
        if (jlm_gram_is_end(e)) g->dist[k] = 0;
        else g->dist[k] = sat_add(e->t == GE_CHR ? utf8_len(g->rng[2 * g->cls[e->v]]) : g->rmin[e->v], g->dist[k + 1]);
    }
    return 0;
}

/* Left recursion: rule r reaches itself through refs preceded only by
 * rules that can match nothing. An iterative DFS over those edges. */
static int left_recursion(jlm_gram *g, P *p)
{
    uint8_t *color = calloc(g->n_rules, 1);
    uint32_t *st = malloc(sizeof *st * 2 * (g->n_rules + 1));
    if (!color || !st) {
        free(color);
        free(st);
        return jlm_errf(p->err, JLM_ENOMEM, "grammar: out of memory");
    }
    int rc = 0;
    for (uint32_t s = 0; s < g->n_rules && !rc; s++) {
        if (color[s]) continue;
        uint32_t sp = 0;
        st[0] = s; st[1] = g->rule[s]; sp = 1; color[s] = 1;
        while (sp && !rc) {
            uint32_t r = st[2 * (sp - 1)], k = st[2 * (sp - 1) + 1];
            /* the next edge of r from element k on */
            uint32_t to = UINT32_MAX;
            while (to == UINT32_MAX) {
                const jlm_gram_el *e = &g->el[k];
                if (e->t == GE_END) break;
                /* is k at a position reachable with only nullable elements before it? */
                int lead = k == g->rule[r] || g->el[k - 1].t == GE_ALT;
                for (uint32_t j = k; !lead && j-- > g->rule[r];) {
                    if (g->el[j].t == GE_ALT) { lead = 1; break; }
                    if (g->el[j].t == GE_CHR || g->rmin[g->el[j].v] != 0) break;
                    if (j == g->rule[r]) lead = 1;
                }
                if (lead && e->t == GE_REF) to = e->v;
                k++;
            }
            st[2 * (sp - 1) + 1] = k;
            if (to == UINT32_MAX) { color[r] = 2; sp--; continue; }
            if (color[to] == 1) {
                uint32_t q = to;
                while (!p->r[q].name && sp > 0) { sp--; q = st[2 * sp]; }
                rc = perr(p, p->r[q].name ? p->r[q].used_at : p->n, "left recursion (a rule reaches itself before any input)");
            } else if (!color[to]) {
                color[to] = 1;
                st[2 * sp] = to; st[2 * sp + 1] = g->rule[to]; sp++;
            }
        }
    }
    free(color);
    free(st);
    return rc;
}

void jlm_gram_free(jlm_gram *g)
{
    if (!g) return;
    free(g->el);
    free(g->rule);
    free(g->cls);
    free(g->rng);
    free(g->dist);
    free(g->rmin);
    free(g);
}

size_t jlm_gram_min_len(const jlm_gram *g) { return g->rmin[g->root]; }

int jlm_gram_parse(const char *src, size_t len, jlm_gram **out, jlm_err *err)
{
    if (!src && len) return jlm_errf(err, JLM_EINVAL, "grammar: NULL text");
    if (len > JLM_GRAM_MAX_SRC) return jlm_errf(err, JLM_EFORMAT, "grammar: %zu bytes, more than the 1 MiB allowed", len);
    P p = {.s = src, .n = len, .err = err};
    jlm_gram *g = NULL;
    int rc = parse_all(&p);
    uint32_t root = UINT32_MAX;
    for (uint32_t k = 0; !rc && k < p.nr; k++) {
        if (!p.r[k].defined) rc = perr(&p, p.r[k].used_at, "reference to an undefined rule");
        else if (p.r[k].name && p.r[k].nlen == 4 && !memcmp(p.r[k].name, "root", 4)) root = k;
    }
    if (!rc && root == UINT32_MAX) rc = jlm_errf(err, JLM_EFORMAT, "grammar: no 'root' rule");
    if (!rc) {
        g = calloc(1, sizeof *g);
        if (g) {
            g->n_el = (uint32_t)p.total;
            g->n_rules = p.nr;
            g->root = root;
            g->el = malloc(sizeof *g->el * (p.total + 1));
            g->rule = malloc(sizeof *g->rule * p.nr);
            g->dist = malloc(sizeof *g->dist * (p.total + 1));
            g->rmin = malloc(sizeof *g->rmin * p.nr);
        }
        if (!g || !g->el || !g->rule || !g->dist || !g->rmin) rc = jlm_errf(err, JLM_ENOMEM, "grammar: out of memory");
    }
    if (!rc) {
        uint32_t at = 0;
        for (uint32_t k = 0; k < p.nr; k++) {
            g->rule[k] = at;
            memcpy(g->el + at, p.r[k].body.e, sizeof *g->el * p.r[k].body.n);
            at += p.r[k].body.n;
        }
        g->el[at] = (jlm_gram_el){GE_END, 0};   /* a guard past the last rule */
        if (p.ncls + 1 > p.capcls) {
            void *np = realloc(p.cls, sizeof *p.cls * (p.ncls + 1));
            if (!np) rc = jlm_errf(err, JLM_ENOMEM, "grammar: out of memory");
            else p.cls = np;
        }
    }
    if (!rc) {
        p.cls[p.ncls] = p.nrng;
        g->cls = p.cls; g->rng = p.rng; g->n_cls = p.ncls;
        p.cls = NULL; p.rng = NULL;
        rc = lengths(g, &p);
        if (!rc) rc = left_recursion(g, &p);
    }
    for (uint32_t k = 0; k < p.nr; k++) free(p.r[k].body.e);
    free(p.r);
    free(p.cls);
    free(p.rng);
    if (rc) {
        jlm_gram_free(g);
        return rc;
    }
    *out = g;
    return 0;
}
