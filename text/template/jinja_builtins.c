/* jinja_builtins.c - filters, tests, Python str/dict/list methods and the globals
 * (range, namespace, raise_exception, strftime_now, dict).
 *
 * Anything not in these tables is refused with JLM_EUNSUPPORTED naming it, so a
 * template using it fails instead of rendering something different.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "text/template/jinja_int.h"

jj_val jlm_jj_str_mod(jj_ctx *C, jj_val fmt, jj_val args);

/* ================================================================ argument helpers */
static jj_val *argp(jj_args *a, int i, const char *name)
{
    if (i >= 0 && i < a->n_pos) return &a->pos[i];
    for (int k = 0; name && k < a->n_kw; k++)
        if (!strcmp(a->kw_name[k], name)) return &a->kw[k];
    return NULL;
}

static jj_val arg(jj_args *a, int i, const char *name, jj_val def)
{
    jj_val *p = argp(a, i, name);
    return p ? *p : def;
}

static jj_str *want_str(jj_ctx *C, jj_val v, const char *what)
{
    if (v.t == JT_STR) return v.u.s;
    if (v.t == JT_UNDEF && v.u.uname) jlm_jj_fail(C, JLM_EINVAL, "'%s' is undefined", v.u.uname);
    jlm_jj_fail(C, JLM_EINVAL, "%s: expected a string, got %s", what, jlm_jj_type_name(v));
}

static int64_t want_int(jj_ctx *C, jj_val v, const char *what)
{
    if (v.t == JT_INT) return v.u.i;
    if (v.t == JT_BOOL) return v.u.b;
    jlm_jj_fail(C, JLM_EINVAL, "%s: expected an integer, got %s", what, jlm_jj_type_name(v));
}

static jj_val buf_val(jj_ctx *C, jj_buf *b) { return jlm_jj_strn(C, b->p ? b->p : "", b->len); }

static jj_val tuple2(jj_ctx *C, jj_val a, jj_val b)
{
    jj_val t = jlm_jj_new_list(C);
    t.tuple = 1;
    jlm_jj_list_push(C, t.u.l, a);
    jlm_jj_list_push(C, t.u.l, b);
    return t;
}

/* ================================================================ unicode string helpers */
/* The unconditional one-to-many mappings of Unicode SpecialCasing.txt that
 * Python's str.upper()/lower() apply (utf8proc maps one code point to one). */
static const char *special_case(utf8proc_int32_t cp, int mode)
{
    if (mode == 2) return cp == 0x130 ? "i\xcc\x87" : NULL;
    switch (cp) {
    case 0xdf: return "SS";
    case 0x149: return "\xca\xbcN";
    case 0xfb00: return "FF";
    case 0xfb01: return "FI";
    case 0xfb02: return "FL";
    case 0xfb03: return "FFI";
    case 0xfb04: return "FFL";
    case 0xfb05: case 0xfb06: return "ST";
    default: return NULL;
    }
}

static jj_val map_case(jj_ctx *C, const char *s, size_t n, int mode /* 1 upper, 2 lower */)
{
    jj_buf b = {0};
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t cl = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (cl <= 0) { jlm_jj_buf_put(C, &b, s + i, 1); i++; continue; }
        const char *special = special_case(cp, mode);
        if (special) {
            jlm_jj_buf_puts(C, &b, special);
            i += (size_t)cl;
            continue;
        }
        cp = mode == 1 ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t el = utf8proc_encode_char(cp, enc);
        jlm_jj_buf_put(C, &b, (const char *)enc, (size_t)el);
        i += (size_t)cl;
    }
    return buf_val(C, &b);
}

static int cp_at(const char *s, size_t n, size_t i, utf8proc_int32_t *cp)
{
    utf8proc_ssize_t cl = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), cp);
    if (cl <= 0) { *cp = (unsigned char)s[i]; return 1; }
    return (int)cl;
}

static int is_cased_letter(utf8proc_int32_t cp)
{
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

/* Python str.title(): a cased letter after an uncased char is upper-cased, others lower. */
static jj_val py_title(jj_ctx *C, const char *s, size_t n)
{
    jj_buf b = {0};
    int prev_cased = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        int cl = cp_at(s, n, i, &cp);
        int cased = is_cased_letter(cp);
        utf8proc_int32_t o = cased ? (prev_cased ? utf8proc_tolower(cp) : utf8proc_toupper(cp)) : cp;
        prev_cased = cased;
        utf8proc_uint8_t enc[4];
        jlm_jj_buf_put(C, &b, (const char *)enc, (size_t)utf8proc_encode_char(o, enc));
        i += (size_t)cl;
    }
    return buf_val(C, &b);
}

static jj_val py_capitalize(jj_ctx *C, const char *s, size_t n)
{
    if (!n) return jlm_jj_strn(C, "", 0);
    utf8proc_int32_t cp;
    int cl = cp_at(s, n, 0, &cp);
    jj_val first = map_case(C, s, (size_t)cl, 1), rest = map_case(C, s + cl, n - (size_t)cl, 2);
    jj_buf b = {0};
    jlm_jj_buf_put(C, &b, first.u.s->s, first.u.s->len);
    jlm_jj_buf_put(C, &b, rest.u.s->s, rest.u.s->len);
    return buf_val(C, &b);
}

/* Is the code point at s[i] in chars (NULL = Python whitespace)? Its length in *cl. */
static int in_set(const char *s, size_t n, size_t i, const jj_str *chars, size_t *cl)
{
    if (!chars) return jlm_jj_py_space(s + i, n - i, cl);
    utf8proc_int32_t cp, c2;
    *cl = (size_t)cp_at(s, n, i, &cp);
    for (size_t k = 0; k < chars->len;) {
        k += (size_t)cp_at(chars->s, chars->len, k, &c2);
        if (c2 == cp) return 1;
    }
    return 0;
}

static jj_val py_strip(jj_ctx *C, jj_str *s, const jj_str *chars, int left, int right)
{
    size_t a = 0, z = s->len, cl;
    if (left) while (a < z && in_set(s->s, z, a, chars, &cl)) a += cl;
    if (right) {
        while (z > a) {
            size_t k = z - 1;
            while (k > a && ((unsigned char)s->s[k] & 0xc0) == 0x80) k--;
            if (!in_set(s->s, z, k, chars, &cl) || k + cl != z) break;
            z = k;
        }
    }
    return jlm_jj_strn(C, s->s + a, z - a);
}

static jj_val strip_chars_arg(jj_ctx *C, jj_args *a, jj_str **chars)
{
    jj_val c = arg(a, 0, "chars", jlm_jj_none());
    *chars = (c.t == JT_NONE || c.t == JT_UNDEF) ? NULL : want_str(C, c, "strip");
    return c;
}

/* Python str.split / rsplit. sep NULL = runs of whitespace. */
static jj_val py_split(jj_ctx *C, jj_str *s, jj_str *sep, int64_t maxsplit, int from_right)
{
    jj_val r = jlm_jj_new_list(C);
    const char *p = s->s;
    size_t n = s->len;
    if (sep) {
        if (!sep->len) jlm_jj_fail(C, JLM_EINVAL, "split: empty separator");
        if (!from_right) {
            size_t st = 0;
            int64_t done = 0;
            for (;;) {
                const char *f = (maxsplit < 0 || done < maxsplit) ? memmem(p + st, n - st, sep->s, sep->len) : NULL;
                if (!f) { jlm_jj_list_push(C, r.u.l, jlm_jj_strn(C, p + st, n - st)); break; }
                jlm_jj_list_push(C, r.u.l, jlm_jj_strn(C, p + st, (size_t)(f - (p + st))));
                st = (size_t)(f - p) + sep->len;
                done++;
            }
            return r;
        }
        /* from the right: collect then reverse */
        jj_val tmp = jlm_jj_new_list(C);
        size_t end = n;
        int64_t done = 0;
        for (;;) {
            const char *f = NULL;
            if ((maxsplit < 0 || done < maxsplit) && end >= sep->len)
                for (size_t k = end - sep->len + 1; k-- > 0;)
                    if (!memcmp(p + k, sep->s, sep->len)) { f = p + k; break; }
            if (!f) { jlm_jj_list_push(C, tmp.u.l, jlm_jj_strn(C, p, end)); break; }
            size_t fo = (size_t)(f - p);
            jlm_jj_list_push(C, tmp.u.l, jlm_jj_strn(C, p + fo + sep->len, end - fo - sep->len));
            end = fo;
            done++;
        }
        for (size_t i = tmp.u.l->n; i-- > 0;) jlm_jj_list_push(C, r.u.l, tmp.u.l->v[i]);
        return r;
    }
    /* whitespace split */
    size_t i = 0, cl;
    int64_t done = 0;
    if (from_right) {
        jj_val tmp = jlm_jj_new_list(C);
        size_t end = n;
        for (;;) {
            while (end > 0) {
                size_t k = end - 1;
                while (k > 0 && ((unsigned char)p[k] & 0xc0) == 0x80) k--;
                if (!in_set(p, n, k, NULL, &cl)) break;
                end = k;
            }
            if (!end) break;
            if (maxsplit >= 0 && done >= maxsplit) { jlm_jj_list_push(C, tmp.u.l, jlm_jj_strn(C, p, end)); break; }
            size_t st = end;
            while (st > 0) {
                size_t k = st - 1;
                while (k > 0 && ((unsigned char)p[k] & 0xc0) == 0x80) k--;
                if (in_set(p, n, k, NULL, &cl)) break;
                st = k;
            }
            jlm_jj_list_push(C, tmp.u.l, jlm_jj_strn(C, p + st, end - st));
            end = st;
            done++;
        }
        for (size_t k = tmp.u.l->n; k-- > 0;) jlm_jj_list_push(C, r.u.l, tmp.u.l->v[k]);
        return r;
    }
    for (;;) {
        while (i < n && in_set(p, n, i, NULL, &cl)) i += cl;
        if (i >= n) break;
        if (maxsplit >= 0 && done >= maxsplit) {
            jlm_jj_list_push(C, r.u.l, jlm_jj_strn(C, p + i, n - i));   /* remainder keeps its trailing blanks */
            break;
        }
        size_t st = i;
        while (i < n && !in_set(p, n, i, NULL, &cl)) i += cl;
        jlm_jj_list_push(C, r.u.l, jlm_jj_strn(C, p + st, i - st));
        done++;
    }
    return r;
}

static jj_val py_replace(jj_ctx *C, jj_str *s, jj_str *old, jj_str *new, int64_t count)
{
    jj_buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (!old->len) {   /* Python inserts new between every code point */
        for (size_t k = 0; k <= s->len;) {
            if (count < 0 || done < count) { jlm_jj_buf_put(C, &b, new->s, new->len); done++; }
            if (k == s->len) break;
            size_t e = k + 1;
            while (e < s->len && ((unsigned char)s->s[e] & 0xc0) == 0x80) e++;
            jlm_jj_buf_put(C, &b, s->s + k, e - k);
            k = e;
        }
        return buf_val(C, &b);
    }
    while (i <= s->len) {
        const char *f = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
        if (!f) { jlm_jj_buf_put(C, &b, s->s + i, s->len - i); break; }
        jlm_jj_buf_put(C, &b, s->s + i, (size_t)(f - (s->s + i)));
        jlm_jj_buf_put(C, &b, new->s, new->len);
        i = (size_t)(f - s->s) + old->len;
        done++;
    }
    return buf_val(C, &b);
}

/* Python str.splitlines() line breaks. Returns the break's byte length at s[i], 0 if none. */
static size_t line_break(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c == '\r') return (i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) return 1;
    if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85) return 2;
    if (c == 0xe2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xa8 || (unsigned char)s[i + 2] == 0xa9)) return 3;
    return 0;
}

static jj_val py_splitlines(jj_ctx *C, const char *s, size_t n, int keepends)
{
    jj_val r = jlm_jj_new_list(C);
    size_t st = 0, i = 0;
    while (i < n) {
        size_t bl = line_break(s, n, i);
        if (!bl) { i++; continue; }
        jlm_jj_list_push(C, r.u.l, jlm_jj_strn(C, s + st, i - st + (keepends ? bl : 0)));
        i += bl;
        st = i;
    }
    if (st < n) jlm_jj_list_push(C, r.u.l, jlm_jj_strn(C, s + st, n - st));
    return r;
}

/* ================================================================ str methods */
typedef jj_val (*method_fn)(jj_ctx *C, jj_val self, jj_args *a);

static jj_val m_upper(jj_ctx *C, jj_val s, jj_args *a) { return map_case(C, s.u.s->s, s.u.s->len, 1); }
static jj_val m_lower(jj_ctx *C, jj_val s, jj_args *a) { return map_case(C, s.u.s->s, s.u.s->len, 2); }
static jj_val m_title(jj_ctx *C, jj_val s, jj_args *a) { return py_title(C, s.u.s->s, s.u.s->len); }
static jj_val m_capitalize(jj_ctx *C, jj_val s, jj_args *a) { return py_capitalize(C, s.u.s->s, s.u.s->len); }
static jj_val m_strip(jj_ctx *C, jj_val s, jj_args *a) { jj_str *c; strip_chars_arg(C, a, &c); return py_strip(C, s.u.s, c, 1, 1); }
static jj_val m_lstrip(jj_ctx *C, jj_val s, jj_args *a) { jj_str *c; strip_chars_arg(C, a, &c); return py_strip(C, s.u.s, c, 1, 0); }
static jj_val m_rstrip(jj_ctx *C, jj_val s, jj_args *a) { jj_str *c; strip_chars_arg(C, a, &c); return py_strip(C, s.u.s, c, 0, 1); }

static jj_val split_common(jj_ctx *C, jj_val s, jj_args *a, int right)
{
    jj_val sep = arg(a, 0, "sep", jlm_jj_none());
    jj_val mx = arg(a, 1, "maxsplit", jlm_jj_int(-1));
    return py_split(C, s.u.s, sep.t == JT_NONE ? NULL : want_str(C, sep, "split"), want_int(C, mx, "split"), right);
}
static jj_val m_split(jj_ctx *C, jj_val s, jj_args *a) { return split_common(C, s, a, 0); }
static jj_val m_rsplit(jj_ctx *C, jj_val s, jj_args *a) { return split_common(C, s, a, 1); }

static int affix_match(jj_ctx *C, jj_str *s, jj_val x, int end)
{
    if (x.t == JT_LIST && x.tuple) {
        for (size_t i = 0; i < x.u.l->n; i++)
            if (affix_match(C, s, x.u.l->v[i], end)) return 1;
        return 0;
    }
    jj_str *p = want_str(C, x, end ? "endswith" : "startswith");
    if (p->len > s->len) return 0;
    jlm_jj_work_bytes(C, p->len);
    return !memcmp(end ? s->s + s->len - p->len : s->s, p->s, p->len);
}
static jj_val m_startswith(jj_ctx *C, jj_val s, jj_args *a) { return jlm_jj_bool(affix_match(C, s.u.s, arg(a, 0, "prefix", jlm_jj_none()), 0)); }
static jj_val m_endswith(jj_ctx *C, jj_val s, jj_args *a) { return jlm_jj_bool(affix_match(C, s.u.s, arg(a, 0, "suffix", jlm_jj_none()), 1)); }

static jj_val m_replace(jj_ctx *C, jj_val s, jj_args *a)
{
    return py_replace(C, s.u.s, want_str(C, arg(a, 0, "old", jlm_jj_none()), "replace"),
                      want_str(C, arg(a, 1, "new", jlm_jj_none()), "replace"), want_int(C, arg(a, 2, "count", jlm_jj_int(-1)), "replace"));
}

static jj_val find_common(jj_ctx *C, jj_val s, jj_args *a, int right, int count)
{
    jj_str *sub = want_str(C, arg(a, 0, "sub", jlm_jj_none()), "find");
    const char *p = s.u.s->s;
    size_t n = s.u.s->len;
    if (count) {
        int64_t c = 0;
        if (!sub->len) return jlm_jj_int((int64_t)jlm_jj_utf8_len(p, n) + 1);
        for (const char *f = p; (f = memmem(f, n - (size_t)(f - p), sub->s, sub->len)); f += sub->len) c++;
        return jlm_jj_int(c);
    }
    const char *hit = NULL;
    if (!right) hit = memmem(p, n, sub->s, sub->len);
    else if (sub->len <= n) {   /* the last match: the first of the reversed bytes (memmem is linear) */
        char *rs = jlm_jj_alloc(C, n + sub->len + 1), *rsub = rs + n;
        for (size_t k = 0; k < n; k++) rs[k] = p[n - 1 - k];
        for (size_t k = 0; k < sub->len; k++) rsub[k] = sub->s[sub->len - 1 - k];
        const char *r = memmem(rs, n, rsub, sub->len);
        hit = r ? p + (n - (size_t)(r - rs) - sub->len) : NULL;
    }
    return jlm_jj_int(hit ? (int64_t)jlm_jj_utf8_len(p, (size_t)(hit - p)) : -1);
}
static jj_val m_find(jj_ctx *C, jj_val s, jj_args *a) { return find_common(C, s, a, 0, 0); }
static jj_val m_rfind(jj_ctx *C, jj_val s, jj_args *a) { return find_common(C, s, a, 1, 0); }
static jj_val m_scount(jj_ctx *C, jj_val s, jj_args *a) { return find_common(C, s, a, 0, 1); }

static jj_val m_sjoin(jj_ctx *C, jj_val s, jj_args *a)
{
    jj_val it = jlm_jj_iter_list(C, arg(a, 0, "iterable", jlm_jj_none()));
    jj_buf b = {0};
    for (size_t i = 0; i < it.u.l->n; i++) {
        if (i) jlm_jj_buf_put(C, &b, s.u.s->s, s.u.s->len);
        jj_str *x = want_str(C, it.u.l->v[i], "join");
        jlm_jj_buf_put(C, &b, x->s, x->len);
    }
    return buf_val(C, &b);
}

static jj_val m_splitlines(jj_ctx *C, jj_val s, jj_args *a)
{
    return py_splitlines(C, s.u.s->s, s.u.s->len, jlm_jj_truthy(arg(a, 0, "keepends", jlm_jj_bool(0))));
}

static jj_val str_class(jj_ctx *C, jj_val s, int kind)
{
    const char *p = s.u.s->s;
    size_t n = s.u.s->len;
    if (!n) return jlm_jj_bool(0);
    int any_cased = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        i += (size_t)cp_at(p, n, i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        int letter = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        int digit = c == UTF8PROC_CATEGORY_ND;
        switch (kind) {
        case 0: if (!digit) return jlm_jj_bool(0); break;
        case 1: if (!letter) return jlm_jj_bool(0); break;
        case 2: if (!letter && !digit && c != UTF8PROC_CATEGORY_NL && c != UTF8PROC_CATEGORY_NO) return jlm_jj_bool(0); break;
        case 3: {
            size_t cl;
            char e[4];
            utf8proc_ssize_t el = utf8proc_encode_char(cp, (utf8proc_uint8_t *)e);
            if (!jlm_jj_py_space(e, (size_t)el, &cl)) return jlm_jj_bool(0);
            break;
        }
        case 4:
            if (c == UTF8PROC_CATEGORY_LL) return jlm_jj_bool(0);
            if (c == UTF8PROC_CATEGORY_LU) any_cased = 1;
            break;
        case 5:
            if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) return jlm_jj_bool(0);
            if (c == UTF8PROC_CATEGORY_LL) any_cased = 1;
            break;
        }
    }
    return jlm_jj_bool(kind < 4 || any_cased);
}
static jj_val m_isdigit(jj_ctx *C, jj_val s, jj_args *a) { return str_class(C, s, 0); }
static jj_val m_isalpha(jj_ctx *C, jj_val s, jj_args *a) { return str_class(C, s, 1); }
static jj_val m_isalnum(jj_ctx *C, jj_val s, jj_args *a) { return str_class(C, s, 2); }
static jj_val m_isspace(jj_ctx *C, jj_val s, jj_args *a) { return str_class(C, s, 3); }
static jj_val m_isupper(jj_ctx *C, jj_val s, jj_args *a) { return str_class(C, s, 4); }
static jj_val m_islower(jj_ctx *C, jj_val s, jj_args *a) { return str_class(C, s, 5); }

/* str.format with {} / {0} / {name} fields and no format specs. */
static jj_val m_format(jj_ctx *C, jj_val s, jj_args *a)
{
    jj_buf b = {0};
    const char *p = s.u.s->s;
    size_t n = s.u.s->len;
    int autoidx = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') { jlm_jj_buf_put(C, &b, "}", 1); i++; continue; }
        if (p[i] != '{') { jlm_jj_buf_put(C, &b, p + i, 1); continue; }
        if (i + 1 < n && p[i + 1] == '{') { jlm_jj_buf_put(C, &b, "{", 1); i++; continue; }
        const char *e = memchr(p + i, '}', n - i);
        if (!e) jlm_jj_fail(C, JLM_EINVAL, "str.format: single '{' encountered");
        size_t fl = (size_t)(e - p) - i - 1;
        const char *f = p + i + 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl))
            jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: str.format field '{%.*s}'", (int)fl, f);
        jj_val v;
        if (!fl) v = arg(a, autoidx++, NULL, jlm_jj_undef(NULL));
        else if (isdigit((unsigned char)f[0])) v = arg(a, atoi(f), NULL, jlm_jj_undef(NULL));
        else v = arg(a, -1, jlm_jj_strdup(C, f, fl), jlm_jj_undef(NULL));
        if (v.t == JT_UNDEF) jlm_jj_fail(C, JLM_EINVAL, "str.format: no argument for field '{%.*s}'", (int)fl, f);
        jlm_jj_write_str(C, &b, v);
        i = (size_t)(e - p);
    }
    return buf_val(C, &b);
}

/* ================================================================ dict / list methods */
static jj_val m_items(jj_ctx *C, jj_val d, jj_args *a)
{
    jj_val r = jlm_jj_new_list(C);
    for (size_t i = 0; i < d.u.d->n; i++) jlm_jj_list_push(C, r.u.l, tuple2(C, d.u.d->k[i], d.u.d->v[i]));
    return r;
}
static jj_val m_keys(jj_ctx *C, jj_val d, jj_args *a) { return jlm_jj_iter_list(C, d); }
static jj_val m_values(jj_ctx *C, jj_val d, jj_args *a)
{
    jj_val r = jlm_jj_new_list(C);
    for (size_t i = 0; i < d.u.d->n; i++) jlm_jj_list_push(C, r.u.l, d.u.d->v[i]);
    return r;
}
static jj_val m_get(jj_ctx *C, jj_val d, jj_args *a)
{
    jj_val *v = jlm_jj_dict_find(C, d.u.d, arg(a, 0, "key", jlm_jj_none()));
    return v ? *v : arg(a, 1, "default", jlm_jj_none());
}
static jj_val m_append(jj_ctx *C, jj_val l, jj_args *a)
{
    if (l.tuple) jlm_jj_fail(C, JLM_EINVAL, "'tuple' object has no attribute 'append'");
    jlm_jj_list_push(C, l.u.l, arg(a, 0, "object", jlm_jj_none()));
    return jlm_jj_none();
}
static jj_val m_extend(jj_ctx *C, jj_val l, jj_args *a)
{
    jj_val it = jlm_jj_iter_list(C, arg(a, 0, "iterable", jlm_jj_none()));
    for (size_t i = 0; i < it.u.l->n; i++) jlm_jj_list_push(C, l.u.l, it.u.l->v[i]);
    return jlm_jj_none();
}
static jj_val m_pop(jj_ctx *C, jj_val l, jj_args *a)
{
    if (l.t == JT_DICT) {
        jj_val key = arg(a, 0, "key", jlm_jj_none());
        for (size_t i = 0; i < l.u.d->n; i++)
            if (jlm_jj_equal(C, l.u.d->k[i], key)) {
                jj_val v = l.u.d->v[i];
                memmove(&l.u.d->k[i], &l.u.d->k[i + 1], (l.u.d->n - i - 1) * sizeof(jj_val));
                memmove(&l.u.d->v[i], &l.u.d->v[i + 1], (l.u.d->n - i - 1) * sizeof(jj_val));
                l.u.d->n--;
                return v;
            }
        jj_val *d = argp(a, 1, "default");
        if (!d) jlm_jj_fail(C, JLM_EINVAL, "dict.pop: key not found");
        return *d;
    }
    if (!l.u.l->n) jlm_jj_fail(C, JLM_EINVAL, "pop from empty list");
    int64_t i = want_int(C, arg(a, 0, "index", jlm_jj_int(-1)), "pop");
    if (i < 0) i += (int64_t)l.u.l->n;
    if (i < 0 || (size_t)i >= l.u.l->n) jlm_jj_fail(C, JLM_EINVAL, "pop index out of range");
    jj_val v = l.u.l->v[i];
    memmove(&l.u.l->v[i], &l.u.l->v[i + 1], (l.u.l->n - (size_t)i - 1) * sizeof(jj_val));
    l.u.l->n--;
    return v;
}
static jj_val m_index(jj_ctx *C, jj_val l, jj_args *a)
{
    jj_val x = arg(a, 0, "value", jlm_jj_none());
    jlm_jj_work(C, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++)
        if (jlm_jj_equal(C, l.u.l->v[i], x)) return jlm_jj_int((int64_t)i);
    jlm_jj_fail(C, JLM_EINVAL, "list.index(x): x not in list");
}
static jj_val m_lcount(jj_ctx *C, jj_val l, jj_args *a)
{
    jj_val x = arg(a, 0, "value", jlm_jj_none());
    int64_t c = 0;
    jlm_jj_work(C, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++) c += jlm_jj_equal(C, l.u.l->v[i], x);
    return jlm_jj_int(c);
}

typedef struct method { const char *name; method_fn fn; } method;

static const method STR_METHODS[] = {
    {"upper", m_upper}, {"lower", m_lower}, {"title", m_title}, {"capitalize", m_capitalize},
    {"strip", m_strip}, {"lstrip", m_lstrip}, {"rstrip", m_rstrip}, {"split", m_split}, {"rsplit", m_rsplit},
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"replace", m_replace}, {"find", m_find},
    {"rfind", m_rfind}, {"count", m_scount}, {"join", m_sjoin}, {"splitlines", m_splitlines},
    {"isdigit", m_isdigit}, {"isalpha", m_isalpha}, {"isalnum", m_isalnum}, {"isspace", m_isspace},
    {"isupper", m_isupper}, {"islower", m_islower}, {"format", m_format}, {NULL, NULL}};
static const method DICT_METHODS[] = {
    {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"get", m_get}, {"pop", m_pop}, {NULL, NULL}};
static const method LIST_METHODS[] = {
    {"append", m_append}, {"extend", m_extend}, {"pop", m_pop}, {"index", m_index}, {"count", m_lcount}, {NULL, NULL}};

jj_val jlm_jj_method(jj_ctx *C, jj_val obj, const char *name)
{
    if (obj.t == JT_STR)
        jlm_jj_work_bytes(C, obj.u.s->len);   /* every string method walks the string */
    const method *t = obj.t == JT_STR ? STR_METHODS : obj.t == JT_DICT ? DICT_METHODS : obj.t == JT_LIST ? LIST_METHODS : NULL;
    for (; t && t->name; t++)
        if (!strcmp(t->name, name)) return jlm_jj_new_func(C, t->name, t->fn, obj);
    return jlm_jj_undef(name);
}

/* ================================================================ sorting (stable merge sort) */
typedef struct sort_ctx { jj_ctx *C; int case_sens; } sort_ctx;

static jj_val sort_key(jj_ctx *C, jj_val v, int case_sens)
{
    if (!case_sens && v.t == JT_STR) return map_case(C, v.u.s->s, v.u.s->len, 2);
    return v;
}

static void merge_sort(jj_ctx *C, jj_val *keys, jj_val *vals, size_t n, int reverse)
{
    if (n < 2) return;
    size_t h = n / 2;
    jlm_jj_work(C, n);   /* each level of the sort visits n items */
    merge_sort(C, keys, vals, h, reverse);
    merge_sort(C, keys + h, vals + h, n - h, reverse);
    jj_val *tk = jlm_jj_alloc(C, n * sizeof(jj_val)), *tv = jlm_jj_alloc(C, n * sizeof(jj_val));
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        int c = jlm_jj_compare(C, keys[j], keys[i]);
        int take_right = reverse ? c > 0 : c < 0;
        if (take_right) { tk[o] = keys[j]; tv[o++] = vals[j++]; }
        else { tk[o] = keys[i]; tv[o++] = vals[i++]; }
    }
    while (i < h) { tk[o] = keys[i]; tv[o++] = vals[i++]; }
    while (j < n) { tk[o] = keys[j]; tv[o++] = vals[j++]; }
    memcpy(keys, tk, n * sizeof(jj_val));
    memcpy(vals, tv, n * sizeof(jj_val));
}

/* Attribute path "a.b.0" as Jinja's make_attrgetter resolves it. */
static jj_val get_path(jj_ctx *C, jj_val v, jj_val attr)
{
    if (attr.t == JT_INT) return jlm_jj_getitem(C, v, attr);
    jj_str *s = want_str(C, attr, "attribute");
    const char *p = s->s;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        jj_val key = isdigit((unsigned char)p[0]) ? jlm_jj_int(atoll(p)) : jlm_jj_strn(C, p, l);
        if (v.t == JT_UNDEF) return v;
        v = jlm_jj_getitem(C, v, key);
        if (!dot) return v;
        p = dot + 1;
    }
}

/* ================================================================ filters */
typedef jj_val (*filter_fn)(jj_ctx *C, jj_val in, jj_args *a);

static jj_val f_str_of(jj_ctx *C, jj_val in) { return jlm_jj_to_str(C, in); }

static jj_val f_upper(jj_ctx *C, jj_val in, jj_args *a) { jj_val s = f_str_of(C, in); return map_case(C, s.u.s->s, s.u.s->len, 1); }
static jj_val f_lower(jj_ctx *C, jj_val in, jj_args *a) { jj_val s = f_str_of(C, in); return map_case(C, s.u.s->s, s.u.s->len, 2); }
static jj_val f_capitalize(jj_ctx *C, jj_val in, jj_args *a) { jj_val s = f_str_of(C, in); return py_capitalize(C, s.u.s->s, s.u.s->len); }

/* Jinja's title: split on runs of [-\s({[<], capitalize each piece. */
static int title_sep(const char *p, size_t n, size_t i, size_t *cl)
{
    if (p[i] && strchr("-({[<", p[i])) { *cl = 1; return 1; }
    return jlm_jj_py_space(p + i, n - i, cl);
}

static jj_val f_title(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val s = f_str_of(C, in);
    const char *p = s.u.s->s;
    size_t n = s.u.s->len, i = 0, cl;
    jj_buf b = {0};
    while (i < n) {
        size_t st = i;
        while (i < n && title_sep(p, n, i, &cl)) i += cl;
        jlm_jj_buf_put(C, &b, p + st, i - st);
        st = i;
        while (i < n && !title_sep(p, n, i, &cl)) i += cl;
        if (i > st) {
            jj_val w = py_capitalize(C, p + st, i - st);
            jlm_jj_buf_put(C, &b, w.u.s->s, w.u.s->len);
        }
    }
    return buf_val(C, &b);
}

static jj_val f_trim(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_str *c;
    strip_chars_arg(C, a, &c);
    return py_strip(C, f_str_of(C, in).u.s, c, 1, 1);
}

static jj_val f_length(jj_ctx *C, jj_val in, jj_args *a)
{
    switch (in.t) {
    case JT_UNDEF: return jlm_jj_int(0);
    case JT_STR: return jlm_jj_int((int64_t)jlm_jj_utf8_len(in.u.s->s, in.u.s->len));
    case JT_LIST: return jlm_jj_int((int64_t)in.u.l->n);
    case JT_DICT: case JT_NS: return jlm_jj_int((int64_t)in.u.d->n);
    default: jlm_jj_fail(C, JLM_EINVAL, "object of type '%s' has no len()", jlm_jj_type_name(in));
    }
}

static jj_val f_default(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val def = arg(a, 0, "default_value", jlm_jj_strn(C, "", 0));
    int boolean = jlm_jj_truthy(arg(a, 1, "boolean", jlm_jj_bool(0)));
    if (in.t == JT_UNDEF || (boolean && !jlm_jj_truthy(in))) return def;
    return in;
}

static jj_val f_tojson(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val ind = arg(a, 0, "indent", jlm_jj_none());
    jj_val ea = arg(a, -1, "ensure_ascii", jlm_jj_bool(0));
    jj_val sk = arg(a, -1, "sort_keys", jlm_jj_bool(0));
    jj_val seps = arg(a, -1, "separators", jlm_jj_none());
    const char *indent = NULL;
    char spaces[65];
    if (ind.t == JT_INT) {
        if (ind.u.i < 0 || ind.u.i > 64) jlm_jj_fail(C, JLM_EINVAL, "tojson: indent %lld outside [0, 64]", (long long)ind.u.i);
        memset(spaces, ' ', (size_t)ind.u.i);
        spaces[ind.u.i] = 0;
        indent = spaces;
    } else if (ind.t == JT_STR) indent = ind.u.s->s;
    else if (ind.t != JT_NONE && ind.t != JT_UNDEF) jlm_jj_fail(C, JLM_EINVAL, "tojson: indent must be an int or a string");
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (seps.t == JT_LIST && seps.u.l->n == 2) {
        item_sep = want_str(C, seps.u.l->v[0], "tojson separators")->s;
        key_sep = want_str(C, seps.u.l->v[1], "tojson separators")->s;
    }
    jj_buf b = {0};
    jlm_jj_write_json(C, &b, in, indent, item_sep, key_sep, jlm_jj_truthy(sk), jlm_jj_truthy(ea), 0);
    return buf_val(C, &b);
}

static jj_val f_replace(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val s = f_str_of(C, in);
    jj_val o = jlm_jj_to_str(C, arg(a, 0, "old", jlm_jj_none())), nw = jlm_jj_to_str(C, arg(a, 1, "new", jlm_jj_none()));
    jj_val cnt = arg(a, 2, "count", jlm_jj_none());
    return py_replace(C, s.u.s, o.u.s, nw.u.s, cnt.t == JT_NONE ? -1 : want_int(C, cnt, "replace"));
}

static jj_val f_list(jj_ctx *C, jj_val in, jj_args *a) { return jlm_jj_iter_list(C, in); }

static jj_val f_join(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val sep = jlm_jj_to_str(C, arg(a, 0, "d", jlm_jj_strn(C, "", 0)));
    jj_val attr = arg(a, 1, "attribute", jlm_jj_none());
    jj_val it = jlm_jj_iter_list(C, in);
    jj_buf b = {0};
    for (size_t i = 0; i < it.u.l->n; i++) {
        if (i) jlm_jj_buf_put(C, &b, sep.u.s->s, sep.u.s->len);
        jj_val v = it.u.l->v[i];
        if (attr.t != JT_NONE) v = get_path(C, v, attr);
        jlm_jj_write_str(C, &b, v);
    }
    return buf_val(C, &b);
}

static jj_val f_first(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val it = jlm_jj_iter_list(C, in);
    return it.u.l->n ? it.u.l->v[0] : jlm_jj_undef("first");
}

static jj_val f_last(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val it = jlm_jj_iter_list(C, in);
    return it.u.l->n ? it.u.l->v[it.u.l->n - 1] : jlm_jj_undef("last");
}

static jj_val f_string(jj_ctx *C, jj_val in, jj_args *a) { return jlm_jj_to_str(C, in); }

static int parse_num(const char *s, int base, int64_t *iv, double *fv, int want_float)
{
    while (isspace((unsigned char)*s)) s++;
    char *end;
    if (want_float) {
        *fv = strtod(s, &end);
    } else {
        errno = 0;
        long long v = strtoll(s, &end, base);
        if (errno) return 0;
        *iv = v;
    }
    if (end == s) return 0;
    while (isspace((unsigned char)*end)) end++;
    return *end == 0;
}

static jj_val f_int(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val def = arg(a, 0, "default", jlm_jj_int(0));
    int base = (int)want_int(C, arg(a, 1, "base", jlm_jj_int(10)), "int");
    switch (in.t) {
    case JT_INT: return in;
    case JT_BOOL: return jlm_jj_int(in.u.b);
    case JT_FLOAT: return isfinite(in.u.f) && fabs(in.u.f) < 9.2e18 ? jlm_jj_int((int64_t)in.u.f) : def;
    case JT_STR: {
        int64_t iv;
        double fv;
        if (parse_num(in.u.s->s, base, &iv, &fv, 0)) return jlm_jj_int(iv);
        if (parse_num(in.u.s->s, 10, &iv, &fv, 1) && isfinite(fv) && fabs(fv) < 9.2e18) return jlm_jj_int((int64_t)fv);
        return def;
    }
    default: return def;
    }
}

static jj_val f_float(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val def = arg(a, 0, "default", jlm_jj_float(0.0));
    int64_t iv;
    double fv;
    switch (in.t) {
    case JT_FLOAT: return in;
    case JT_INT: return jlm_jj_float((double)in.u.i);
    case JT_BOOL: return jlm_jj_float(in.u.b);
    case JT_STR: return parse_num(in.u.s->s, 10, &iv, &fv, 1) ? jlm_jj_float(fv) : def;
    default: return def;
    }
}

static jj_val f_abs(jj_ctx *C, jj_val in, jj_args *a)
{
    if (in.t == JT_INT) {
        if (in.u.i == INT64_MIN) jlm_jj_fail(C, JLM_ERANGE, "abs overflows 64 bits");
        return jlm_jj_int(in.u.i < 0 ? -in.u.i : in.u.i);
    }
    if (in.t == JT_BOOL) return jlm_jj_int(in.u.b);
    if (in.t == JT_FLOAT) return jlm_jj_float(fabs(in.u.f));
    jlm_jj_fail(C, JLM_EINVAL, "bad operand type for abs(): '%s'", jlm_jj_type_name(in));
}

static jj_val f_round(jj_ctx *C, jj_val in, jj_args *a)
{
    int64_t prec = want_int(C, arg(a, 0, "precision", jlm_jj_int(0)), "round");
    jj_str *method = want_str(C, arg(a, 1, "method", jlm_jj_cstr(C, "common")), "round");
    if (in.t != JT_INT && in.t != JT_FLOAT && in.t != JT_BOOL) jlm_jj_fail(C, JLM_EINVAL, "round: expected a number, got %s", jlm_jj_type_name(in));
    double x = in.t == JT_FLOAT ? in.u.f : in.t == JT_INT ? (double)in.u.i : in.u.b;
    double m = pow(10.0, (double)prec), y = x * m;
    if (!strcmp(method->s, "common")) y = nearbyint(y);   /* Python round(): half to even */
    else if (!strcmp(method->s, "ceil")) y = ceil(y);
    else if (!strcmp(method->s, "floor")) y = floor(y);
    else jlm_jj_fail(C, JLM_EINVAL, "round: method must be common, ceil or floor");
    return jlm_jj_float(y / m);
}

static jj_val f_items(jj_ctx *C, jj_val in, jj_args *a)
{
    if (in.t == JT_UNDEF) return jlm_jj_new_list(C);
    if (in.t != JT_DICT) jlm_jj_fail(C, JLM_EINVAL, "items: expected a mapping, got %s", jlm_jj_type_name(in));
    return m_items(C, in, a);
}

static jj_val f_dictsort(jj_ctx *C, jj_val in, jj_args *a)
{
    int cs = jlm_jj_truthy(arg(a, 0, "case_sensitive", jlm_jj_bool(0)));
    jj_str *by = want_str(C, arg(a, 1, "by", jlm_jj_cstr(C, "key")), "dictsort");
    int rev = jlm_jj_truthy(arg(a, 2, "reverse", jlm_jj_bool(0)));
    if (in.t != JT_DICT) jlm_jj_fail(C, JLM_EINVAL, "dictsort: expected a mapping, got %s", jlm_jj_type_name(in));
    int by_value = !strcmp(by->s, "value");
    if (!by_value && strcmp(by->s, "key")) jlm_jj_fail(C, JLM_EINVAL, "dictsort: 'by' must be 'key' or 'value'");
    size_t n = in.u.d->n;
    jj_val *keys = jlm_jj_alloc(C, (n + 1) * sizeof(jj_val)), *vals = jlm_jj_alloc(C, (n + 1) * sizeof(jj_val));
    for (size_t i = 0; i < n; i++) {
        vals[i] = tuple2(C, in.u.d->k[i], in.u.d->v[i]);
        keys[i] = sort_key(C, by_value ? in.u.d->v[i] : in.u.d->k[i], cs);
    }
    merge_sort(C, keys, vals, n, rev);
    jj_val r = jlm_jj_new_list(C);
    for (size_t i = 0; i < n; i++) jlm_jj_list_push(C, r.u.l, vals[i]);
    return r;
}

static jj_val f_sort(jj_ctx *C, jj_val in, jj_args *a)
{
    int rev = jlm_jj_truthy(arg(a, 0, "reverse", jlm_jj_bool(0)));
    int cs = jlm_jj_truthy(arg(a, 1, "case_sensitive", jlm_jj_bool(0)));
    jj_val attr = arg(a, 2, "attribute", jlm_jj_none());
    jj_val it = jlm_jj_iter_list(C, in);
    size_t n = it.u.l->n;
    jj_val *keys = jlm_jj_alloc(C, (n + 1) * sizeof(jj_val));
    for (size_t i = 0; i < n; i++)
        keys[i] = sort_key(C, attr.t == JT_NONE ? it.u.l->v[i] : get_path(C, it.u.l->v[i], attr), cs);
    merge_sort(C, keys, it.u.l->v, n, rev);
    return it;
}

static jj_val f_unique(jj_ctx *C, jj_val in, jj_args *a)
{
    int cs = jlm_jj_truthy(arg(a, 0, "case_sensitive", jlm_jj_bool(0)));
    jj_val attr = arg(a, 1, "attribute", jlm_jj_none());
    jj_val it = jlm_jj_iter_list(C, in), r = jlm_jj_new_list(C), seen = jlm_jj_new_list(C);
    for (size_t i = 0; i < it.u.l->n; i++) {
        jj_val k = sort_key(C, attr.t == JT_NONE ? it.u.l->v[i] : get_path(C, it.u.l->v[i], attr), cs);
        size_t j;
        jlm_jj_work(C, seen.u.l->n);
        for (j = 0; j < seen.u.l->n; j++)
            if (jlm_jj_equal(C, seen.u.l->v[j], k)) break;
        if (j < seen.u.l->n) continue;
        jlm_jj_list_push(C, seen.u.l, k);
        jlm_jj_list_push(C, r.u.l, it.u.l->v[i]);
    }
    return r;
}

static jj_val minmax(jj_ctx *C, jj_val in, jj_args *a, int want_max)
{
    int cs = jlm_jj_truthy(arg(a, 0, "case_sensitive", jlm_jj_bool(0)));
    jj_val attr = arg(a, 1, "attribute", jlm_jj_none());
    jj_val it = jlm_jj_iter_list(C, in);
    if (!it.u.l->n) return jlm_jj_undef(want_max ? "max" : "min");
    size_t best = 0;
    jj_val bk = sort_key(C, attr.t == JT_NONE ? it.u.l->v[0] : get_path(C, it.u.l->v[0], attr), cs);
    for (size_t i = 1; i < it.u.l->n; i++) {
        jj_val k = sort_key(C, attr.t == JT_NONE ? it.u.l->v[i] : get_path(C, it.u.l->v[i], attr), cs);
        int c = jlm_jj_compare(C, k, bk);
        if (want_max ? c > 0 : c < 0) { best = i; bk = k; }
    }
    return it.u.l->v[best];
}
static jj_val f_min(jj_ctx *C, jj_val in, jj_args *a) { return minmax(C, in, a, 0); }
static jj_val f_max(jj_ctx *C, jj_val in, jj_args *a) { return minmax(C, in, a, 1); }

static jj_val f_sum(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val attr = arg(a, 0, "attribute", jlm_jj_none());
    jj_val acc = arg(a, 1, "start", jlm_jj_int(0));
    jj_val it = jlm_jj_iter_list(C, in);
    for (size_t i = 0; i < it.u.l->n; i++) {
        jj_val v = attr.t == JT_NONE ? it.u.l->v[i] : get_path(C, it.u.l->v[i], attr);
        if (acc.t == JT_FLOAT || v.t == JT_FLOAT) {
            if ((acc.t != JT_FLOAT && acc.t != JT_INT && acc.t != JT_BOOL) || (v.t != JT_FLOAT && v.t != JT_INT && v.t != JT_BOOL))
                jlm_jj_fail(C, JLM_EINVAL, "sum: unsupported operand types");
            double x = acc.t == JT_FLOAT ? acc.u.f : acc.t == JT_INT ? (double)acc.u.i : acc.u.b;
            double y = v.t == JT_FLOAT ? v.u.f : v.t == JT_INT ? (double)v.u.i : v.u.b;
            acc = jlm_jj_float(x + y);
        } else {
            int64_t r;
            if (__builtin_add_overflow(want_int(C, acc, "sum"), want_int(C, v, "sum"), &r)) jlm_jj_fail(C, JLM_ERANGE, "sum overflows 64 bits");
            acc = jlm_jj_int(r);
        }
    }
    return acc;
}

/* select / reject / selectattr / rejectattr */
static jj_val select_common(jj_ctx *C, jj_val in, jj_args *a, int by_attr, int keep)
{
    jj_val it = jlm_jj_iter_list(C, in), r = jlm_jj_new_list(C);
    int first = by_attr ? 1 : 0;
    jj_val attr = by_attr ? arg(a, 0, NULL, jlm_jj_none()) : jlm_jj_none();
    if (by_attr && attr.t == JT_NONE) jlm_jj_fail(C, JLM_EINVAL, "selectattr/rejectattr: missing attribute");
    jj_val *test = argp(a, first, NULL);
    jj_args ta = {0};
    if (test) {
        ta.n_pos = a->n_pos - first - 1 > 0 ? a->n_pos - first - 1 : 0;
        ta.pos = a->pos + first + 1;
        ta.n_kw = a->n_kw;
        ta.kw = a->kw;
        ta.kw_name = a->kw_name;
    }
    for (size_t i = 0; i < it.u.l->n; i++) {
        jj_val v = by_attr ? get_path(C, it.u.l->v[i], attr) : it.u.l->v[i];
        int ok = test ? jlm_jj_apply_test(C, want_str(C, *test, "select")->s, v, &ta) : jlm_jj_truthy(v);
        if (ok == keep) jlm_jj_list_push(C, r.u.l, it.u.l->v[i]);
    }
    return r;
}
static jj_val f_select(jj_ctx *C, jj_val in, jj_args *a) { return select_common(C, in, a, 0, 1); }
static jj_val f_reject(jj_ctx *C, jj_val in, jj_args *a) { return select_common(C, in, a, 0, 0); }
static jj_val f_selectattr(jj_ctx *C, jj_val in, jj_args *a) { return select_common(C, in, a, 1, 1); }
static jj_val f_rejectattr(jj_ctx *C, jj_val in, jj_args *a) { return select_common(C, in, a, 1, 0); }

static jj_val f_map(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val it = jlm_jj_iter_list(C, in), r = jlm_jj_new_list(C);
    jj_val *attr = argp(a, -1, "attribute");
    if (attr) {
        jj_val def = arg(a, -1, "default", jlm_jj_undef(NULL));
        for (size_t i = 0; i < it.u.l->n; i++) {
            jj_val v = get_path(C, it.u.l->v[i], *attr);
            jlm_jj_list_push(C, r.u.l, v.t == JT_UNDEF && argp(a, -1, "default") ? def : v);
        }
        return r;
    }
    if (a->n_pos < 1) jlm_jj_fail(C, JLM_EINVAL, "map: a filter name or attribute= is required");
    const char *fname = want_str(C, a->pos[0], "map")->s;
    jj_args fa = *a;
    fa.n_pos--;
    fa.pos++;
    for (size_t i = 0; i < it.u.l->n; i++) jlm_jj_list_push(C, r.u.l, jlm_jj_apply_filter(C, fname, it.u.l->v[i], &fa));
    return r;
}

static jj_val f_reverse(jj_ctx *C, jj_val in, jj_args *a)
{
    if (in.t == JT_STR) {
        jj_val chars = jlm_jj_iter_list(C, in);
        jj_buf b = {0};
        for (size_t i = chars.u.l->n; i-- > 0;) jlm_jj_buf_put(C, &b, chars.u.l->v[i].u.s->s, chars.u.l->v[i].u.s->len);
        return buf_val(C, &b);
    }
    jj_val it = jlm_jj_iter_list(C, in), r = jlm_jj_new_list(C);
    for (size_t i = it.u.l->n; i-- > 0;) jlm_jj_list_push(C, r.u.l, it.u.l->v[i]);
    return r;
}

static jj_val f_safe(jj_ctx *C, jj_val in, jj_args *a) { return in; }

static jj_val f_escape(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val s = f_str_of(C, in);
    jj_buf b = {0};
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->s[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
        if (e) jlm_jj_buf_puts(C, &b, e);
        else jlm_jj_buf_put(C, &b, &c, 1);
    }
    return buf_val(C, &b);
}

/* Jinja 3.1 indent(width=4, first=False, blank=False). */
static jj_val f_indent(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val w = arg(a, 0, "width", jlm_jj_int(4));
    int first = jlm_jj_truthy(arg(a, 1, "first", jlm_jj_bool(0))), blank = jlm_jj_truthy(arg(a, 2, "blank", jlm_jj_bool(0)));
    jj_buf ind = {0};
    if (w.t == JT_STR) jlm_jj_buf_put(C, &ind, w.u.s->s, w.u.s->len);
    else for (int64_t i = 0, n = want_int(C, w, "indent"); i < n && i < 4096; i++) jlm_jj_buf_put(C, &ind, " ", 1);
    const char *is = ind.p ? ind.p : "";
    jj_val s = f_str_of(C, in);
    jj_buf t = {0};
    jlm_jj_buf_put(C, &t, s.u.s->s, s.u.s->len);
    jlm_jj_buf_put(C, &t, "\n", 1);
    jj_val lines = py_splitlines(C, t.p, t.len, 0);
    jj_buf b = {0};
    if (first) jlm_jj_buf_puts(C, &b, is);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jj_str *l = lines.u.l->v[i].u.s;
        if (i) {
            jlm_jj_buf_put(C, &b, "\n", 1);
            if (blank || l->len) jlm_jj_buf_puts(C, &b, is);
        }
        jlm_jj_buf_put(C, &b, l->s, l->len);
    }
    return buf_val(C, &b);
}

static jj_val f_center(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val s = f_str_of(C, in);
    int64_t w = want_int(C, arg(a, 0, "width", jlm_jj_int(80)), "center");
    int64_t n = (int64_t)jlm_jj_utf8_len(s.u.s->s, s.u.s->len);
    if (w <= n) return s;
    int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
    jj_buf b = {0};
    for (int64_t i = 0; i < left; i++) jlm_jj_buf_put(C, &b, " ", 1);
    jlm_jj_buf_put(C, &b, s.u.s->s, s.u.s->len);
    for (int64_t i = 0; i < pad - left; i++) jlm_jj_buf_put(C, &b, " ", 1);
    return buf_val(C, &b);
}

static jj_val f_wordcount(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val s = f_str_of(C, in);
    int64_t c = 0;
    int inw = 0;
    for (size_t i = 0; i < s.u.s->len;) {
        utf8proc_int32_t cp;
        i += (size_t)cp_at(s.u.s->s, s.u.s->len, i, &cp);
        utf8proc_category_t k = utf8proc_category(cp);
        int w = cp == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
                (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) || (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME);
        if (w && !inw) c++;
        inw = w;
    }
    return jlm_jj_int(c);
}

static jj_val f_batch(jj_ctx *C, jj_val in, jj_args *a)
{
    int64_t n = want_int(C, arg(a, 0, "linecount", jlm_jj_none()), "batch");
    jj_val *fill = argp(a, 1, "fill_with");
    if (n <= 0) jlm_jj_fail(C, JLM_EINVAL, "batch: linecount must be positive");
    jj_val it = jlm_jj_iter_list(C, in), r = jlm_jj_new_list(C), cur = jlm_jj_new_list(C);
    for (size_t i = 0; i < it.u.l->n; i++) {
        jlm_jj_list_push(C, cur.u.l, it.u.l->v[i]);
        if ((int64_t)cur.u.l->n == n) { jlm_jj_list_push(C, r.u.l, cur); cur = jlm_jj_new_list(C); }
    }
    if (cur.u.l->n) {
        if (fill && fill->t != JT_NONE) while ((int64_t)cur.u.l->n < n) jlm_jj_list_push(C, cur.u.l, *fill);
        jlm_jj_list_push(C, r.u.l, cur);
    }
    return r;
}

static jj_val f_attr(jj_ctx *C, jj_val in, jj_args *a)
{
    return jlm_jj_getattr(C, in, want_str(C, arg(a, 0, "name", jlm_jj_none()), "attr")->s);
}

static jj_val f_format(jj_ctx *C, jj_val in, jj_args *a)
{
    jj_val t = jlm_jj_new_list(C);
    t.tuple = 1;
    for (int i = 0; i < a->n_pos; i++) jlm_jj_list_push(C, t.u.l, a->pos[i]);
    if (a->n_kw) jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: format filter with keyword arguments");
    return jlm_jj_str_mod(C, f_str_of(C, in), a->n_pos == 1 && a->pos[0].t == JT_DICT ? a->pos[0] : t);
}

typedef struct filter { const char *name; filter_fn fn; } filter;

static const filter FILTERS[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
    {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
    {"escape", f_escape}, {"first", f_first}, {"float", f_float}, {"forceescape", f_escape}, {"format", f_format},
    {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
    {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
    {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
    {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort},
    {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
    {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount}, {NULL, NULL}};

int jlm_jj_has_filter(const char *name)
{
    for (const filter *f = FILTERS; f->name; f++)
        if (!strcmp(f->name, name)) return 1;
    return 0;
}

jj_val jlm_jj_apply_filter(jj_ctx *C, const char *name, jj_val in, jj_args *a)
{
    if (in.t == JT_STR)
        jlm_jj_work_bytes(C, in.u.s->len);
    for (const filter *f = FILTERS; f->name; f++)
        if (!strcmp(f->name, name)) return f->fn(C, in, a);
    jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: filter '%s'", name);
}

/* ================================================================ tests */
static int t_cmp(jj_ctx *C, jj_val in, jj_args *a, int op)
{
    jj_val o = arg(a, 0, NULL, jlm_jj_undef(NULL));
    if (op == 0) return jlm_jj_equal(C, in, o);
    if (op == 1) return !jlm_jj_equal(C, in, o);
    int c = jlm_jj_compare(C, in, o);
    return op == 2 ? c < 0 : op == 3 ? c <= 0 : op == 4 ? c > 0 : c >= 0;
}

int jlm_jj_has_test(const char *name);

static const char *TESTS[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number",
                              "string", "mapping", "iterable", "sequence", "callable", "odd", "even", "divisibleby",
                              "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt",
                              "greaterthan", ">", "ge", ">=", "in", "sameas", "lower", "upper", "escaped", NULL};

int jlm_jj_has_test(const char *name)
{
    for (int i = 0; TESTS[i]; i++)
        if (!strcmp(TESTS[i], name)) return 1;
    return 0;
}

static int is_lower_or_upper(jj_ctx *C, jj_val in, int upper)
{
    jj_val s = jlm_jj_to_str(C, in);
    jj_val m = map_case(C, s.u.s->s, s.u.s->len, upper ? 1 : 2);
    return jlm_jj_equal(C, s, m);
}

int jlm_jj_apply_test(jj_ctx *C, const char *n, jj_val in, jj_args *a)
{
    int t = in.t;
    if (!strcmp(n, "defined")) return t != JT_UNDEF;
    if (!strcmp(n, "undefined")) return t == JT_UNDEF;
    if (!strcmp(n, "none")) return t == JT_NONE;
    if (!strcmp(n, "boolean")) return t == JT_BOOL;
    if (!strcmp(n, "false")) return t == JT_BOOL && !in.u.b;
    if (!strcmp(n, "true")) return t == JT_BOOL && in.u.b;
    if (!strcmp(n, "integer")) return t == JT_INT;
    if (!strcmp(n, "float")) return t == JT_FLOAT;
    if (!strcmp(n, "number")) return t == JT_INT || t == JT_FLOAT || t == JT_BOOL;
    if (!strcmp(n, "string")) return t == JT_STR;
    if (!strcmp(n, "mapping")) return t == JT_DICT;
    if (!strcmp(n, "iterable")) return t == JT_STR || t == JT_LIST || t == JT_DICT || t == JT_UNDEF;
    if (!strcmp(n, "sequence")) return t == JT_STR || t == JT_LIST || t == JT_DICT;
    if (!strcmp(n, "callable")) return t == JT_FUNC;
    if (!strcmp(n, "escaped")) return 0;
    if (!strcmp(n, "odd") || !strcmp(n, "even")) {
        int64_t v = want_int(C, in, n);
        return (v & 1) == (n[0] == 'o');
    }
    if (!strcmp(n, "divisibleby")) {
        int64_t d = want_int(C, arg(a, 0, "num", jlm_jj_none()), n);
        if (!d) jlm_jj_fail(C, JLM_EINVAL, "divisibleby: division by zero");
        return want_int(C, in, n) % d == 0;
    }
    if (!strcmp(n, "eq") || !strcmp(n, "equalto") || !strcmp(n, "==")) return t_cmp(C, in, a, 0);
    if (!strcmp(n, "ne") || !strcmp(n, "!=")) return t_cmp(C, in, a, 1);
    if (!strcmp(n, "lt") || !strcmp(n, "lessthan") || !strcmp(n, "<")) return t_cmp(C, in, a, 2);
    if (!strcmp(n, "le") || !strcmp(n, "<=")) return t_cmp(C, in, a, 3);
    if (!strcmp(n, "gt") || !strcmp(n, "greaterthan") || !strcmp(n, ">")) return t_cmp(C, in, a, 4);
    if (!strcmp(n, "ge") || !strcmp(n, ">=")) return t_cmp(C, in, a, 5);
    if (!strcmp(n, "sameas")) {
        jj_val o = arg(a, 0, NULL, jlm_jj_undef(NULL));
        if (o.t != in.t) return 0;
        if (t == JT_NONE || t == JT_UNDEF) return 1;
        if (t == JT_BOOL) return o.u.b == in.u.b;
        if (t == JT_INT) return o.u.i == in.u.i;
        return memcmp(&o.u, &in.u, sizeof o.u) == 0;
    }
    if (!strcmp(n, "in")) {
        jj_val c = arg(a, 0, NULL, jlm_jj_undef(NULL));
        if (c.t == JT_STR) jlm_jj_work_bytes(C, c.u.s->len);
        if (c.t == JT_LIST) jlm_jj_work(C, c.u.l->n);
        if (c.t == JT_STR) return in.t == JT_STR && memmem(c.u.s->s, c.u.s->len, in.u.s->s, in.u.s->len) != NULL;
        if (c.t == JT_LIST) { for (size_t i = 0; i < c.u.l->n; i++) if (jlm_jj_equal(C, c.u.l->v[i], in)) return 1; return 0; }
        if (c.t == JT_DICT) return jlm_jj_dict_find(C, c.u.d, in) != NULL;
        jlm_jj_fail(C, JLM_EINVAL, "test 'in': argument of type '%s' is not iterable", jlm_jj_type_name(c));
    }
    if (!strcmp(n, "lower")) return t == JT_STR && is_lower_or_upper(C, in, 0);
    if (!strcmp(n, "upper")) return t == JT_STR && is_lower_or_upper(C, in, 1);
    jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: test '%s'", n);
}

/* ================================================================ str % args */
jj_val jlm_jj_str_mod(jj_ctx *C, jj_val fmt, jj_val args)
{
    const char *p = fmt.u.s->s;
    size_t n = fmt.u.s->len, ai = 0;
    int is_tuple = args.t == JT_LIST && args.tuple;
    jj_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') { jlm_jj_buf_put(C, &b, p + i, 1); continue; }
        if (++i >= n) jlm_jj_fail(C, JLM_EINVAL, "%% format: incomplete format");
        if (p[i] == '%') { jlm_jj_buf_put(C, &b, "%", 1); continue; }
        jj_val v;
        if (p[i] == '(') {
            const char *e = memchr(p + i, ')', n - i);
            if (!e || args.t != JT_DICT) jlm_jj_fail(C, JLM_EINVAL, "%% format: format requires a mapping");
            jj_val *x = jlm_jj_dict_find(C, args.u.d, jlm_jj_strn(C, p + i + 1, (size_t)(e - p) - i - 1));
            if (!x) jlm_jj_fail(C, JLM_EINVAL, "%% format: key '%.*s' not found", (int)((size_t)(e - p) - i - 1), p + i + 1);
            v = *x;
            i = (size_t)(e - p) + 1;
        } else if (is_tuple) {
            if (ai >= args.u.l->n) jlm_jj_fail(C, JLM_EINVAL, "%% format: not enough arguments for format string");
            v = args.u.l->v[ai++];
        } else {
            if (ai++) jlm_jj_fail(C, JLM_EINVAL, "%% format: not enough arguments for format string");
            v = args;
        }
        char spec[32];
        size_t sl = 0;
        spec[sl++] = '%';
        while (i < n && strchr("-+ #0123456789.", p[i]) && sl < 20) spec[sl++] = p[i++];
        if (i >= n) jlm_jj_fail(C, JLM_EINVAL, "%% format: incomplete format");
        spec[sl] = 0;
        for (const char *d = spec + 1; *d; d++) {   /* a width or precision is output: bounded first */
            if (*d < '0' || *d > '9') continue;
            unsigned long long w = strtoull(d, NULL, 10);
            if (w > C->max_out)
                jlm_jj_fail(C, JLM_ERANGE, "%% format: a width or precision of %llu is past the output limit of %zu bytes", w, C->max_out);
            while (d[1] >= '0' && d[1] <= '9') d++;
        }
        char conv = p[i];
        if (conv == 's' || conv == 'r') {
            if (sl > 1) jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: %% format flags with %%%c", conv);
            if (conv == 's') jlm_jj_write_str(C, &b, v); else jlm_jj_write_repr(C, &b, v);
        } else if (strchr("dixXo", conv)) {
            int64_t iv = v.t == JT_FLOAT ? (int64_t)v.u.f : want_int(C, v, "% format");
            memcpy(spec + sl, "ll", 2);
            sl += 2;
            spec[sl++] = conv == 'i' ? 'd' : conv;
            spec[sl] = 0;
            jlm_jj_buf_printf(C, &b, spec, (long long)iv);
        } else if (strchr("feEgG", conv)) {
            double dv = v.t == JT_FLOAT ? v.u.f : (double)want_int(C, v, "% format");
            spec[sl++] = conv;
            spec[sl] = 0;
            jlm_jj_buf_printf(C, &b, spec, dv);
        } else jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: %% format conversion '%c'", conv);
    }
    if (is_tuple && ai < args.u.l->n) jlm_jj_fail(C, JLM_EINVAL, "%% format: not all arguments converted during string formatting");
    return buf_val(C, &b);
}

/* ================================================================ globals */
static jj_val g_range(jj_ctx *C, jj_val self, jj_args *a)
{
    int64_t start = 0, stop, step = 1;
    if (a->n_pos == 1) stop = want_int(C, a->pos[0], "range");
    else if (a->n_pos == 2 || a->n_pos == 3) {
        start = want_int(C, a->pos[0], "range");
        stop = want_int(C, a->pos[1], "range");
        if (a->n_pos == 3) step = want_int(C, a->pos[2], "range");
    } else jlm_jj_fail(C, JLM_EINVAL, "range expected 1 to 3 arguments, got %d", a->n_pos);
    if (!step) jlm_jj_fail(C, JLM_EINVAL, "range() arg 3 must not be zero");
    jj_val r = jlm_jj_new_list(C);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (r.u.l->n >= 100000) jlm_jj_fail(C, JLM_ERANGE, "range: more than 100000 items");
        jlm_jj_list_push(C, r.u.l, jlm_jj_int(i));
    }
    return r;
}

static jj_val g_namespace(jj_ctx *C, jj_val self, jj_args *a)
{
    jj_val ns = jlm_jj_new_dict(C);
    ns.t = JT_NS;
    for (int i = 0; i < a->n_pos; i++) {
        if (a->pos[i].t != JT_DICT && a->pos[i].t != JT_NS) jlm_jj_fail(C, JLM_EINVAL, "namespace: positional argument must be a mapping");
        for (size_t k = 0; k < a->pos[i].u.d->n; k++) jlm_jj_dict_set(C, ns.u.d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
    }
    for (int i = 0; i < a->n_kw; i++) jlm_jj_dict_sets(C, ns.u.d, a->kw_name[i], a->kw[i]);
    return ns;
}

static jj_val g_dict(jj_ctx *C, jj_val self, jj_args *a)
{
    jj_val d = g_namespace(C, self, a);
    d.t = JT_DICT;
    return d;
}

static jj_val g_raise(jj_ctx *C, jj_val self, jj_args *a)
{
    jj_val m = jlm_jj_to_str(C, arg(a, 0, "message", jlm_jj_strn(C, "", 0)));
    jlm_jj_fail(C, JLM_EINVAL, "raise_exception: %s", m.u.s->s);
}

static jj_val g_strftime_now(jj_ctx *C, jj_val self, jj_args *a)
{
    jj_str *fmt = want_str(C, arg(a, 0, "format", jlm_jj_none()), "strftime_now");
    struct tm tm;
    time_t t = C->now;
    if (C->utc) gmtime_r(&t, &tm); else localtime_r(&t, &tm);
    char out[512];
    size_t n = fmt->len ? strftime(out, sizeof out, fmt->s, &tm) : 0;
    if (!n && fmt->len) jlm_jj_fail(C, JLM_EINVAL, "strftime_now: format '%s' gives an empty or over-long result", fmt->s);
    return jlm_jj_strn(C, out, n);
}

void jlm_jj_install_globals(jj_ctx *C, jj_scope *g)
{
    jlm_jj_dict_sets(C, &g->vars, "range", jlm_jj_new_func(C, "range", g_range, jlm_jj_none()));
    jlm_jj_dict_sets(C, &g->vars, "namespace", jlm_jj_new_func(C, "namespace", g_namespace, jlm_jj_none()));
    jlm_jj_dict_sets(C, &g->vars, "dict", jlm_jj_new_func(C, "dict", g_dict, jlm_jj_none()));
    jlm_jj_dict_sets(C, &g->vars, "raise_exception", jlm_jj_new_func(C, "raise_exception", g_raise, jlm_jj_none()));
    jlm_jj_dict_sets(C, &g->vars, "strftime_now", jlm_jj_new_func(C, "strftime_now", g_strftime_now, jlm_jj_none()));
}
