/* tok_regex.c - the small backtracking regex engine behind the tokenizer's
 * regex-backed pre-tokenizer stages.
 *
 * It reproduces what llama.cpp gets from std::regex (ECMAScript) in
 * unicode_regex_split: patterns with \p{..} run on a "collapsed" text where a
 * non-ASCII code point is reduced to its category (whitespace first), other
 * patterns run on the code points with non-ASCII whitespace mapped to U+000B.
 * Here both are one rule (docs/tokenizer.md, "Regex stages"): literals and
 * ranges compare against the code point with non-ASCII whitespace mapped to
 * 0x0B; \s is [\t\n\v\f\r ] on that mapped value; \p{X} matches a non-ASCII,
 * non-whitespace code point of category X or one of llama.cpp's ASCII sets
 * for X. A pattern mixing \p{..} with non-ASCII literals is refused, as
 * llama.cpp refuses it.
 *
 * Supported: literals, escapes (\s \S \d \D \w \W \p{L,N,P,M,S} \r \n \t \f
 * \v \xHH \x{H..} \uHHHH \<punct>), the letter subcategories \p{Lu,Ll,Lt,Lm,Lo}
 * (Unicode's general category of the code point, ASCII included: A-Z is Lu,
 * a-z Ll), classes with ranges and negation, '.', groups (...) and (?:...)
 * with quantifier 1 or ?, case-insensitive groups (?i:...) whose literals are
 * ASCII (a letter also matches its other case, and 's'/'k' their Unicode
 * simple case folds U+017F and U+212A, as Oniguruma folds them; a non-ASCII
 * literal inside is refused), negative lookahead (?!...), '$',
 * alternation, quantifiers ? * + {m} {m,} {m,n} on single-character atoms.
 * Matching is leftmost, alternatives in order, quantifiers greedy with
 * backtracking: ECMAScript semantics for this subset.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tokenizer/tokenizer_int.h"

/* ================================================================ AST */
enum { RX_ATOM = 1, RX_GROUP = 2, RX_END = 3, RX_NLA = 4 };
enum { IT_RANGE = 1, IT_WS, IT_NWS, IT_CAT, IT_GC };

/* IT_CAT: lo = TF_* bit; IT_GC: lo = a mask of (1 << utf8proc category). */
typedef struct rx_item { uint8_t type; uint32_t lo, hi; } rx_item;
typedef struct rx_class { uint8_t neg; uint32_t n; rx_item *it; } rx_class;

typedef struct rx_seq rx_seq;
typedef struct rx_alt { uint32_t n; rx_seq *seq; } rx_alt;
typedef struct rx_node {
    uint8_t  type;
    uint32_t min, max;       /* quantifier; max UINT32_MAX = unbounded */
    rx_class cls;            /* RX_ATOM */
    rx_alt   alt;            /* RX_GROUP, RX_NLA */
} rx_node;
struct rx_seq { uint32_t n, cap; rx_node *node; };

struct tok_rx {
    rx_alt top;
    void  *blocks;           /* every allocation, chained for jlm_tok_rx_free */
};

/* All memory of a regex is chained in rx->blocks: [next][payload]. */
static void *rx_alloc(tok_rx *rx, size_t n)
{
    void **b = calloc(1, sizeof(void *) + n);
    if (!b)
        return NULL;
    b[0] = rx->blocks;
    rx->blocks = b;
    return b + 1;
}

void jlm_tok_rx_free(tok_rx *rx)
{
    if (!rx)
        return;
    for (void **b = rx->blocks, **nx; b; b = nx) {
        nx = b[0];
        free(b);
    }
    free(rx);
}

/* ================================================================ parser */
typedef struct rx_parse {
    tok_rx *rx;
    const uint32_t *beg, *p, *end;
    const char *what;
    jlm_err *err;
    int rc;
    int has_cat, has_nonascii;
    unsigned depth;
    unsigned icase;          /* inside (?i:...) */
} rx_parse;

static int perr(rx_parse *ps, int code, const char *msg)
{
    if (!ps->rc)
        ps->rc = jlm_errf(ps->err, code, "%s: pattern offset %zu: %s", ps->what,
                          (size_t)(ps->p - ps->beg), msg);
    return ps->rc;
}

static int cls_add(rx_parse *ps, rx_class *c, uint8_t type, uint32_t lo, uint32_t hi);

/* Inside (?i:...): the other case of the ASCII letters in [lo, hi], and the
 * Unicode code points whose simple case fold is 's' or 'k' (Oniguruma's
 * ignore-case compares case folds). A non-ASCII range is refused: its folding
 * is not implemented. */
static int cls_add_fold(rx_parse *ps, rx_class *c, uint32_t lo, uint32_t hi)
{
    if (hi >= 128)
        return perr(ps, JLM_EUNSUPPORTED, "a non-ASCII literal inside (?i:...) is not supported");
    static const uint32_t AZ[2][2] = {{'A', 'Z'}, {'a', 'z'}};
    for (int k = 0; k < 2; k++) {
        uint32_t a = lo > AZ[k][0] ? lo : AZ[k][0], b = hi < AZ[k][1] ? hi : AZ[k][1];
        if (a > b)
            continue;
        uint32_t d = 'a' - 'A';
        if (k == 0 ? cls_add(ps, c, IT_RANGE, a + d, b + d) : cls_add(ps, c, IT_RANGE, a - d, b - d))
            return -1;
        for (uint32_t x = a; x <= b; x++) {
            uint32_t l = k == 0 ? x + d : x;
            int had = ps->has_nonascii;   /* these two are no literal of the pattern's */
            if ((l == 's' && cls_add(ps, c, IT_RANGE, 0x17F, 0x17F)) || (l == 'k' && cls_add(ps, c, IT_RANGE, 0x212A, 0x212A)))
                return -1;
            ps->has_nonascii = had;
        }
    }
    return 0;
}

static int cls_add(rx_parse *ps, rx_class *c, uint8_t type, uint32_t lo, uint32_t hi)
{
    rx_item *it = rx_alloc(ps->rx, (c->n + 1) * sizeof(rx_item));
    if (!it)
        return perr(ps, JLM_ENOMEM, "out of memory");
    if (c->n)
        memcpy(it, c->it, c->n * sizeof(rx_item));
    it[c->n] = (rx_item){type, lo, hi};
    c->it = it;
    c->n++;
    if (type == IT_CAT || type == IT_GC)
        ps->has_cat = 1;
    if (type == IT_RANGE && hi >= 128)
        ps->has_nonascii = 1;
    if (type == IT_RANGE && ps->icase && hi < 128) {
        unsigned ic = ps->icase;
        ps->icase = 0;   /* the folds themselves are not folded again */
        int rc = cls_add_fold(ps, c, lo, hi);
        ps->icase = ic;
        return rc;
    }
    if (type == IT_RANGE && ps->icase)
        return cls_add_fold(ps, c, lo, hi);
    return 0;
}

static int hexval(uint32_t c)
{
    if (c >= '0' && c <= '9') return (int)(c - '0');
    if (c >= 'a' && c <= 'f') return (int)(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return (int)(c - 'A' + 10);
    return -1;
}

/* After a backslash. A single literal goes to *lit (returns 1); a class item
 * is added to c (returns 2); negative on error. */
static int parse_escape(rx_parse *ps, rx_class *c, uint32_t *lit)
{
    if (ps->p >= ps->end)
        return perr(ps, JLM_EFORMAT, "pattern ends in a backslash");
    uint32_t e = *ps->p++;
    switch (e) {
    case 's': return cls_add(ps, c, IT_WS, 0, 0) ? -1 : 2;
    case 'S': return cls_add(ps, c, IT_NWS, 0, 0) ? -1 : 2;
    case 'd': return cls_add(ps, c, IT_RANGE, '0', '9') ? -1 : 2;
    case 'w':
        if (cls_add(ps, c, IT_RANGE, '0', '9') || cls_add(ps, c, IT_RANGE, 'A', 'Z') ||
            cls_add(ps, c, IT_RANGE, 'a', 'z') || cls_add(ps, c, IT_RANGE, '_', '_'))
            return -1;
        return 2;
    case 'D': case 'W':
        return perr(ps, JLM_EUNSUPPORTED, "\\D and \\W are not supported"), -1;
    case 'p': {
        static const struct { char name; uint32_t flag; } cats[] = {
            {'L', TF_LETTER}, {'N', TF_NUMBER}, {'P', TF_PUNCT}, {'M', TF_MARK}, {'S', TF_SYMBOL}};
        static const struct { char sub; int gc; } lcats[] = {
            {'u', UTF8PROC_CATEGORY_LU}, {'l', UTF8PROC_CATEGORY_LL}, {'t', UTF8PROC_CATEGORY_LT},
            {'m', UTF8PROC_CATEGORY_LM}, {'o', UTF8PROC_CATEGORY_LO}};
        if (ps->end - ps->p >= 4 && ps->p[0] == '{' && ps->p[1] == 'L' && ps->p[3] == '}')
            for (size_t i = 0; i < sizeof lcats / sizeof lcats[0]; i++)
                if (ps->p[2] == (uint32_t)lcats[i].sub) {
                    ps->p += 4;
                    return cls_add(ps, c, IT_GC, 1u << lcats[i].gc, 0) ? -1 : 2;
                }
        if (ps->end - ps->p < 3 || ps->p[0] != '{' || ps->p[2] != '}')
            return perr(ps, JLM_EUNSUPPORTED, "only \\p{L}, \\p{Lu}, \\p{Ll}, \\p{Lt}, \\p{Lm}, \\p{Lo}, \\p{N}, \\p{P}, \\p{M}, \\p{S} are supported"), -1;
        for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++)
            if (ps->p[1] == (uint32_t)cats[i].name) {
                ps->p += 3;
                return cls_add(ps, c, IT_CAT, cats[i].flag, 0) ? -1 : 2;
            }
        return perr(ps, JLM_EUNSUPPORTED, "unknown \\p{..} category"), -1;
    }
    case 'r': *lit = '\r'; return 1;
    case 'n': *lit = '\n'; return 1;
    case 't': *lit = '\t'; return 1;
    case 'f': *lit = '\f'; return 1;
    case 'v': *lit = '\v'; return 1;
    case '0': *lit = 0; return 1;
    case 'x': case 'u': {
        if (e == 'x' && ps->p < ps->end && *ps->p == '{') {   /* \x{H..H}: any code point */
            uint32_t v = 0;
            int nd = 0;
            for (ps->p++; ps->p < ps->end && *ps->p != '}' && nd < 6; ps->p++, nd++) {
                int h = hexval(*ps->p);
                if (h < 0)
                    break;
                v = v * 16 + (uint32_t)h;
            }
            if (!nd || ps->p >= ps->end || *ps->p != '}' || v > 0x10FFFF)
                return perr(ps, JLM_EFORMAT, "bad \\x{...} escape"), -1;
            ps->p++;
            *lit = v;
            return 1;
        }
        int nd = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < nd; i++) {
            int h = ps->p < ps->end ? hexval(*ps->p) : -1;
            if (h < 0)
                return perr(ps, JLM_EFORMAT, "bad hex escape"), -1;
            v = v * 16 + (uint32_t)h;
            ps->p++;
        }
        *lit = v;
        return 1;
    }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
            return perr(ps, JLM_EUNSUPPORTED, "unknown escape"), -1;
        *lit = e;
        return 1;
    }
}

/* After '['. */
static int parse_class(rx_parse *ps, rx_class *c)
{
    if (ps->p < ps->end && *ps->p == '^') {
        c->neg = 1;
        ps->p++;
    }
    while (ps->p < ps->end && *ps->p != ']') {
        uint32_t lo;
        if (*ps->p == '\\') {
            ps->p++;
            int r = parse_escape(ps, c, &lo);
            if (r < 0)
                return -1;
            if (r == 2)
                continue;
        } else {
            lo = *ps->p++;
        }
        uint32_t hi = lo;
        if (ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            if (*ps->p == '\\') {
                ps->p++;
                rx_class tmp = {0};
                int r = parse_escape(ps, &tmp, &hi);
                if (r < 0)
                    return -1;
                if (r == 2)
                    return perr(ps, JLM_EFORMAT, "class escape as a range end");
            } else {
                hi = *ps->p++;
            }
            if (hi < lo)
                return perr(ps, JLM_EFORMAT, "range out of order");
        }
        if (cls_add(ps, c, IT_RANGE, lo, hi))
            return -1;
    }
    if (ps->p >= ps->end)
        return perr(ps, JLM_EFORMAT, "unterminated [");
    ps->p++;
    return 0;
}

static int parse_alt(rx_parse *ps, rx_alt *alt);

static rx_node *seq_push(rx_parse *ps, rx_seq *s)
{
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? 2 * s->cap : 4;
        rx_node *nn = rx_alloc(ps->rx, cap * sizeof(rx_node));
        if (!nn) {
            perr(ps, JLM_ENOMEM, "out of memory");
            return NULL;
        }
        if (s->n)
            memcpy(nn, s->node, s->n * sizeof(rx_node));
        s->node = nn;
        s->cap = cap;
    }
    rx_node *n = &s->node[s->n++];
    memset(n, 0, sizeof *n);
    n->min = n->max = 1;
    return n;
}

static uint32_t parse_num(rx_parse *ps)
{
    uint32_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9' && v < 100000)
        v = v * 10 + (*ps->p++ - '0');
    return v;
}

static int parse_quant(rx_parse *ps, rx_node *n)
{
    if (ps->p >= ps->end)
        return 0;
    uint32_t c = *ps->p, mn, mx;
    if (c == '?') { mn = 0; mx = 1; ps->p++; }
    else if (c == '*') { mn = 0; mx = UINT32_MAX; ps->p++; }
    else if (c == '+') { mn = 1; mx = UINT32_MAX; ps->p++; }
    else if (c == '{') {
        ps->p++;
        mn = mx = parse_num(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            mx = (ps->p < ps->end && *ps->p == '}') ? UINT32_MAX : parse_num(ps);
        }
        if (ps->p >= ps->end || *ps->p != '}' || mx < mn)
            return perr(ps, JLM_EFORMAT, "bad {m,n} quantifier");
        ps->p++;
    } else {
        return 0;
    }
    if (ps->p < ps->end && (*ps->p == '?' || *ps->p == '+'))
        return perr(ps, JLM_EUNSUPPORTED, "lazy and possessive quantifiers are not supported");
    if (n->type == RX_END || n->type == RX_NLA)
        return perr(ps, JLM_EFORMAT, "quantifier on an assertion");
    if (n->type == RX_GROUP && !(mn <= 1 && mx == 1))
        return perr(ps, JLM_EUNSUPPORTED, "a group may only be quantified by ?");
    n->min = mn;
    n->max = mx;
    return 0;
}

static int parse_atom(rx_parse *ps, rx_seq *s)
{
    rx_node *n = seq_push(ps, s);
    if (!n)
        return -1;
    uint32_t c = *ps->p++, lit = 0;
    if (c == '(') {
        n->type = RX_GROUP;
        int icase = 0;
        if (ps->end - ps->p >= 2 && ps->p[0] == '?') {
            if (ps->p[1] == ':') n->type = RX_GROUP;
            else if (ps->p[1] == '!') n->type = RX_NLA;
            else if (ps->p[1] == 'i' && ps->end - ps->p >= 3 && ps->p[2] == ':') icase = 1, ps->p++;
            else return perr(ps, JLM_EUNSUPPORTED, "only (?:, (?i: and (?! groups are supported");
            ps->p += 2;
        }
        if (++ps->depth > 32)
            return perr(ps, JLM_EUNSUPPORTED, "groups nested deeper than 32");
        ps->icase += icase;
        if (parse_alt(ps, &n->alt))
            return -1;
        ps->icase -= icase;
        ps->depth--;
        if (ps->p >= ps->end || *ps->p != ')')
            return perr(ps, JLM_EFORMAT, "unbalanced (");
        ps->p++;
    } else if (c == '[') {
        n->type = RX_ATOM;
        if (parse_class(ps, &n->cls))
            return -1;
    } else if (c == '$') {
        n->type = RX_END;
    } else if (c == '.') {
        n->type = RX_ATOM;
        n->cls.neg = 1;
        if (cls_add(ps, &n->cls, IT_RANGE, '\n', '\n') || cls_add(ps, &n->cls, IT_RANGE, '\r', '\r') ||
            cls_add(ps, &n->cls, IT_RANGE, 0x2028, 0x2029))
            return -1;
    } else if (c == '^' || c == ')' || c == '*' || c == '+' || c == '?' || c == '{') {
        return perr(ps, JLM_EUNSUPPORTED, "unexpected or unsupported metacharacter");
    } else {
        n->type = RX_ATOM;
        if (c == '\\') {
            int r = parse_escape(ps, &n->cls, &lit);
            if (r < 0)
                return -1;
            if (r == 1 && cls_add(ps, &n->cls, IT_RANGE, lit, lit))
                return -1;
        } else if (cls_add(ps, &n->cls, IT_RANGE, c, c)) {
            return -1;
        }
    }
    return parse_quant(ps, n);
}

static int parse_alt(rx_parse *ps, rx_alt *alt)
{
    for (;;) {
        rx_seq *ns = rx_alloc(ps->rx, (alt->n + 1) * sizeof(rx_seq));
        if (!ns)
            return perr(ps, JLM_ENOMEM, "out of memory");
        if (alt->n)
            memcpy(ns, alt->seq, alt->n * sizeof(rx_seq));
        alt->seq = ns;
        rx_seq *s = &alt->seq[alt->n++];
        while (ps->p < ps->end && *ps->p != '|' && *ps->p != ')')
            if (parse_atom(ps, s))
                return -1;
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            continue;
        }
        return 0;
    }
}

int jlm_tok_rx_compile(const char *src, size_t len, const char *what, tok_rx **out, jlm_err *err)
{
    tok_cpts cp = {0};
    jlm_tok_cpts_from_utf8(src, len, &cp);
    if (cp.oom) {
        free(cp.p);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", what);
    }
    tok_rx *rx = calloc(1, sizeof *rx);
    if (!rx) {
        free(cp.p);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", what);
    }
    rx_parse ps = {rx, cp.p, cp.p, cp.p + cp.n, what, err, 0, 0, 0, 0, 0};
    if (!parse_alt(&ps, &rx->top) && ps.p < ps.end)
        perr(&ps, JLM_EFORMAT, "unbalanced )");
    if (!ps.rc && ps.has_cat && ps.has_nonascii)
        perr(&ps, JLM_EUNSUPPORTED, "\\p{..} together with non-ASCII literals (llama.cpp refuses this too)");
    free(cp.p);
    if (ps.rc) {
        jlm_tok_rx_free(rx);
        return ps.rc;
    }
    *out = rx;
    return JLM_OK;
}

/* ================================================================ matcher */
typedef struct rx_ctx {
    const uint32_t *cp;
    size_t end;             /* piece end (absolute index) */
} rx_ctx;

typedef struct rx_cont { const rx_seq *s; uint32_t i; const struct rx_cont *next; } rx_cont;

/* ASCII members of each category, as llama.cpp's k_ucat_map (note: '~' is in no set). */
static int ascii_in_cat(uint32_t c, uint32_t cat)
{
    switch (cat) {
    case TF_NUMBER: return c >= '0' && c <= '9';
    case TF_LETTER: return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
    case TF_PUNCT:  return c && strchr("!\"#%&'()*,-./:;?@[\\]_{}", (int)c) != NULL;
    case TF_SYMBOL: return c && strchr("$+<=>^`|", (int)c) != NULL;
    default:        return 0;
    }
}

static int is_rx_space(uint32_t w) { return w == ' ' || (w >= 0x09 && w <= 0x0D); }

/* One code point against a class. w is cp with non-ASCII whitespace mapped to 0x0B. */
static int class_match(const rx_class *c, uint32_t cp)
{
    uint32_t fl = cp >= 128 ? jlm_tok_flags(cp) : 0;
    uint32_t w = (cp >= 128 && (fl & TF_WS)) ? 0x0B : cp;
    int hit = 0;
    for (uint32_t i = 0; i < c->n && !hit; i++) {
        const rx_item *it = &c->it[i];
        switch (it->type) {
        case IT_RANGE: hit = w >= it->lo && w <= it->hi; break;
        case IT_WS:    hit = is_rx_space(w); break;
        case IT_NWS:   hit = !is_rx_space(w); break;
        case IT_CAT:
            hit = cp < 128 ? ascii_in_cat(cp, it->lo) : (!(fl & TF_WS) && (fl & it->lo) != 0);
            break;
        case IT_GC:
            hit = cp <= 0x10FFFF && ((1u << utf8proc_category((utf8proc_int32_t)cp)) & it->lo) != 0;
            break;
        }
    }
    return c->neg ? !hit : hit;
}

static long m_seq(const rx_ctx *c, const rx_seq *s, uint32_t i, size_t pos, const rx_cont *k);

static long m_alt(const rx_ctx *c, const rx_alt *a, size_t pos, const rx_cont *k)
{
    for (uint32_t j = 0; j < a->n; j++) {
        long r = m_seq(c, &a->seq[j], 0, pos, k);
        if (r >= 0)
            return r;
    }
    return -1;
}

/* Returns the end of the overall match, or -1. Recursion depth is bounded by
 * the pattern's node count (a class run is tried in a loop, not by recursion). */
static long m_seq(const rx_ctx *c, const rx_seq *s, uint32_t i, size_t pos, const rx_cont *k)
{
    if (i == s->n)
        return k ? m_seq(c, k->s, k->i, pos, k->next) : (long)pos;
    const rx_node *n = &s->node[i];
    switch (n->type) {
    case RX_END:
        return pos == c->end ? m_seq(c, s, i + 1, pos, k) : -1;
    case RX_NLA:
        if (m_alt(c, &n->alt, pos, NULL) >= 0)
            return -1;
        return m_seq(c, s, i + 1, pos, k);
    case RX_GROUP: {
        rx_cont nk = {s, i + 1, k};
        long r = m_alt(c, &n->alt, pos, &nk);
        if (r >= 0 || n->min > 0)
            return r;
        return m_seq(c, s, i + 1, pos, k);
    }
    default: {
        size_t run = 0;
        while (run < n->max && pos + run < c->end && class_match(&n->cls, c->cp[pos + run]))
            run++;
        if (run < n->min)
            return -1;
        for (size_t cnt = run + 1; cnt-- > n->min;) {
            long r = m_seq(c, s, i + 1, pos + cnt, k);
            if (r >= 0)
                return r;
        }
        return -1;
    }
    }
}

int jlm_tok_rx_split(const tok_rx *rx, const uint32_t *cpts, const tok_lens *in, tok_lens *out)
{
    size_t start = 0;
    for (size_t p = 0; p < in->n; p++) {
        size_t beg = start, end = start + in->p[p], prev = beg;
        rx_ctx c = {cpts, end};
        for (size_t at = beg; at < end;) {
            long e = m_alt(&c, &rx->top, at, NULL);
            if (e <= (long)at) {      /* no match here (an empty match counts as none) */
                at++;
                continue;
            }
            if (at > prev)
                jlm_tok_lens_push(out, at - prev);
            jlm_tok_lens_push(out, (size_t)e - at);
            prev = at = (size_t)e;
        }
        if (prev < end)
            jlm_tok_lens_push(out, end - prev);
        start = end;
    }
    return out->oom ? JLM_ENOMEM : JLM_OK;
}
