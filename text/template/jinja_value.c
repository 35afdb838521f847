/* jinja_value.c - arena, values, equality/ordering, str()/repr()/json.dumps output.
 * Python semantics are the reference: str(None) == "None", repr of floats is
 * the shortest round-trip form, json.dumps separators (', ', ': ').
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/template/jinja_int.h"

/* ================================================================ errors, arena */
_Noreturn void jlm_jj_fail(jj_ctx *C, int code, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (C->line > 0) jlm_errf(C->err, code, "template line %d: %s", C->line, msg);
    else jlm_errf(C->err, code, "template: %s", msg);
    longjmp(C->jb, 1);
}

void jlm_jj_step_slow(jj_ctx *C)
{
    if (C->steps > C->max_steps)
        jlm_jj_fail(C, JLM_ERANGE, "step limit of %llu exceeded (a loop or recursion that does not end in time)",
                    (unsigned long long)C->max_steps);
    if (C->cancelled && C->cancelled(C->cancel_arg))
        jlm_jj_fail(C, JLM_EIO, "rendering cancelled");
    C->next_check = C->steps + JLM_JINJA_CANCEL_EVERY;
    if (C->next_check > C->max_steps + 1) C->next_check = C->max_steps + 1;
}

void *jlm_jj_alloc(jj_ctx *C, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    jj_chunk *h = C->arena.head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (C->arena.total + cap > JJ_MAX_ARENA)
            jlm_jj_fail(C, JLM_ERANGE, "memory limit of %zu bytes exceeded", JJ_MAX_ARENA);
        h = malloc(sizeof(jj_chunk) + 16 + cap);
        if (!h) jlm_jj_fail(C, JLM_ENOMEM, "out of memory allocating %zu bytes", cap);
        h->used = 0;
        h->cap = cap;
        h->next = C->arena.head;
        C->arena.head = h;
        C->arena.total += cap;
    }
    char *base = (char *)h + ((sizeof(jj_chunk) + 15) & ~(size_t)15);
    void *p = base + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

void jlm_jj_arena_free(jj_arena *a)
{
    jj_chunk *h = a->head;
    while (h) {
        jj_chunk *n = h->next;
        free(h);
        h = n;
    }
    a->head = NULL;
    a->total = 0;
}

char *jlm_jj_strdup(jj_ctx *C, const char *s, size_t n)
{
    char *p = jlm_jj_alloc(C, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ================================================================ constructors */
jj_val jlm_jj_undef(const char *name) { jj_val v = {.t = JT_UNDEF}; v.u.uname = name; return v; }
jj_val jlm_jj_none(void) { jj_val v = {.t = JT_NONE}; return v; }
jj_val jlm_jj_bool(int b) { jj_val v = {.t = JT_BOOL}; v.u.b = !!b; return v; }
jj_val jlm_jj_int(int64_t i) { jj_val v = {.t = JT_INT}; v.u.i = i; return v; }
jj_val jlm_jj_float(double f) { jj_val v = {.t = JT_FLOAT}; v.u.f = f; return v; }

/* A string value of n bytes, NUL-terminated, its bytes to be written. */
static jj_val str_new(jj_ctx *C, size_t n)
{
    jj_val v = {.t = JT_STR};
    if (n > C->max_out)
        jlm_jj_fail(C, JLM_ERANGE, "a string of %zu bytes: the output limit is %zu bytes", n, C->max_out);
    jlm_jj_work_bytes(C, n);
    v.u.s = jlm_jj_alloc(C, sizeof(jj_str) + n + 1);
    v.u.s->len = n;
    v.u.s->s[n] = 0;
    return v;
}

jj_val jlm_jj_strn(jj_ctx *C, const char *s, size_t n)
{
    jj_val v = str_new(C, n);
    if (n) memcpy(v.u.s->s, s, n);
    return v;
}

jj_val jlm_jj_str_cat(jj_ctx *C, const jj_str *a, const jj_str *b)
{
    jj_val v = str_new(C, a->len + b->len);   /* each at most max_out: no overflow */
    memcpy(v.u.s->s, a->s, a->len);
    memcpy(v.u.s->s + a->len, b->s, b->len);
    return v;
}

jj_val jlm_jj_cstr(jj_ctx *C, const char *s) { return jlm_jj_strn(C, s, strlen(s)); }

jj_val jlm_jj_new_list(jj_ctx *C)
{
    jj_val v = {.t = JT_LIST};
    v.u.l = jlm_jj_alloc(C, sizeof(jj_list));
    return v;
}

jj_val jlm_jj_new_dict(jj_ctx *C)
{
    jj_val v = {.t = JT_DICT};
    v.u.d = jlm_jj_alloc(C, sizeof(jj_dict));
    return v;
}

jj_val jlm_jj_new_func(jj_ctx *C, const char *name, jj_builtin fn, jj_val self)
{
    jj_val v = {.t = JT_FUNC};
    v.u.fn = jlm_jj_alloc(C, sizeof(jj_func));
    v.u.fn->kind = JJ_FN_BUILTIN;
    v.u.fn->name = name;
    v.u.fn->fn = fn;
    v.u.fn->self = self;
    return v;
}

void jlm_jj_list_push(jj_ctx *C, jj_list *l, jj_val v)
{
    jlm_jj_work(C, 1);
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jj_val *nv = jlm_jj_alloc(C, cap * sizeof(jj_val));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jj_val));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

/* Linear lookup: dicts in chat templates hold a handful of keys. */
jj_val *jlm_jj_dict_find(jj_ctx *C, jj_dict *d, jj_val key)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == key.t || (d->k[i].t != JT_STR && key.t != JT_STR))
            if (jlm_jj_equal(C, d->k[i], key)) return &d->v[i];
    return NULL;
}

jj_val *jlm_jj_dict_finds(jj_dict *d, const char *key)
{
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JT_STR && d->k[i].u.s->len == n && memcmp(d->k[i].u.s->s, key, n) == 0)
            return &d->v[i];
    return NULL;
}

void jlm_jj_dict_set(jj_ctx *C, jj_dict *d, jj_val key, jj_val v)
{
    jj_val *p = jlm_jj_dict_find(C, d, key);
    if (p) { *p = v; return; }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jj_val *nk = jlm_jj_alloc(C, cap * sizeof(jj_val)), *nv = jlm_jj_alloc(C, cap * sizeof(jj_val));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jj_val));
            memcpy(nv, d->v, d->n * sizeof(jj_val));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n++] = v;
}

void jlm_jj_dict_sets(jj_ctx *C, jj_dict *d, const char *key, jj_val v)
{
    jj_val *p = jlm_jj_dict_finds(d, key);
    if (p) { *p = v; return; }
    jlm_jj_dict_set(C, d, jlm_jj_cstr(C, key), v);
}

/* ================================================================ truth, equality, order */
int jlm_jj_truthy(jj_val v)
{
    switch (v.t) {
    case JT_UNDEF: case JT_NONE: return 0;
    case JT_BOOL: return v.u.b;
    case JT_INT: return v.u.i != 0;
    case JT_FLOAT: return v.u.f != 0.0;
    case JT_STR: return v.u.s->len > 0;
    case JT_LIST: return v.u.l->n > 0;
    case JT_DICT: return v.u.d->n > 0;
    default: return 1;
    }
}

static int is_num(jj_val v) { return v.t == JT_BOOL || v.t == JT_INT || v.t == JT_FLOAT; }

/* One level into a value (printing or ordering it): JLM_ERANGE past
 * JJ_MAX_DEPTH, so a list or namespace that holds itself is an error, not
 * a stack overflow. The caller decrements C->vdepth when it comes back. */
static void value_enter(jj_ctx *C, const char *what)
{
    if (++C->vdepth > JJ_MAX_DEPTH)
        jlm_jj_fail(C, JLM_ERANGE, "%s: a value nested deeper than %d (a list, dict or namespace holding itself?)",
                    what, JJ_MAX_DEPTH);
}
static double num_f(jj_val v) { return v.t == JT_FLOAT ? v.u.f : v.t == JT_INT ? (double)v.u.i : v.u.b; }
static int64_t num_i(jj_val v) { return v.t == JT_INT ? v.u.i : v.u.b; }

/* depth: how deep inside a and b this compares. A list, dict or namespace
 * may hold itself ({% do l.append(l) %}): the same object is equal to
 * itself without a look inside (Python compares items by identity first),
 * and two that hold themselves are unequal past JJ_MAX_DEPTH levels where
 * Python would raise RecursionError (a crash on the stack is what it must
 * not do). Each string compared byte by byte and each list or dict walked is
 * charged to the step budget (jlm_jj_work). */
static int equal_at(jj_ctx *C, jj_val a, jj_val b, int depth)
{
    if (depth > JJ_MAX_DEPTH) return 0;
    if (is_num(a) && is_num(b)) {
        if (a.t == JT_FLOAT || b.t == JT_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JT_UNDEF: case JT_NONE: return 1;
    case JT_STR:
        if (a.u.s->len != b.u.s->len) return 0;
        if (a.u.s == b.u.s) return 1;
        jlm_jj_work_bytes(C, a.u.s->len);
        return memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case JT_LIST:
        if (a.u.l == b.u.l && a.tuple == b.tuple) return 1;
        if (a.tuple != b.tuple || a.u.l->n != b.u.l->n) return 0;
        jlm_jj_work(C, a.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal_at(C, a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
        return 1;
    case JT_DICT:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->n != b.u.d->n) return 0;
        jlm_jj_work(C, a.u.d->n);
        for (size_t i = 0; i < a.u.d->n; i++) {
            jj_val *o = jlm_jj_dict_find(C, b.u.d, a.u.d->k[i]);
            if (!o || !equal_at(C, a.u.d->v[i], *o, depth + 1)) return 0;
        }
        return 1;
    default: return a.u.d == b.u.d;   /* identity for namespaces, functions */
    }
}

int jlm_jj_equal(jj_ctx *C, jj_val a, jj_val b) { return equal_at(C, a, b, 0); }

int jlm_jj_compare(jj_ctx *C, jj_val a, jj_val b)
{
    if (is_num(a) && is_num(b)) {
        if (a.t == JT_FLOAT || b.t == JT_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.t == JT_STR && b.t == JT_STR) {   /* UTF-8 byte order == code point order */
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        jlm_jj_work_bytes(C, n);
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        if (c) return c < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len ? 1 : 0;
    }
    if (a.t == JT_LIST && b.t == JT_LIST) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jlm_jj_equal(C, a.u.l->v[i], b.u.l->v[i])) continue;
            value_enter(C, "compare");
            int c = jlm_jj_compare(C, a.u.l->v[i], b.u.l->v[i]);
            C->vdepth--;
            return c;
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n ? 1 : 0;
    }
    jlm_jj_fail(C, JLM_EINVAL, "'<' not supported between instances of '%s' and '%s'",
            jlm_jj_type_name(a), jlm_jj_type_name(b));
}

const char *jlm_jj_type_name(jj_val v)
{
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str",
                                  "list", "dict", "Namespace", "function"};
    if (v.t == JT_LIST && v.tuple) return "tuple";
    return names[v.t];
}

/* ================================================================ buffers */
/* Room for n more bytes and a NUL, failing past the output limit. */
static void buf_reserve(jj_ctx *C, jj_buf *b, size_t n)
{
    if (b->len + n + 1 <= b->cap)
        return;
    if (b->len + n > C->max_out)
        jlm_jj_fail(C, JLM_ERANGE, "output larger than the limit of %zu bytes", C->max_out);
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = jlm_jj_alloc(C, cap);
    if (b->len) memcpy(p, b->p, b->len);
    b->p = p;
    b->cap = cap;
}

void jlm_jj_buf_put(jj_ctx *C, jj_buf *b, const char *s, size_t n)
{
    jlm_jj_work_bytes(C, n + JJ_PUT_BYTES);
    buf_reserve(C, b, n);
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void jlm_jj_buf_puts(jj_ctx *C, jj_buf *b, const char *s) { jlm_jj_buf_put(C, b, s, strlen(s)); }

/* A value longer than tmp (a wide %-format field) is written whole, never
 * cut at tmp's size; one past the output limit fails before it is written. */
void jlm_jj_buf_printf(jj_ctx *C, jj_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof tmp) {
        va_end(again);
        jlm_jj_buf_put(C, b, tmp, (size_t)n);
        return;
    }
    if (n < 0 || b->len + (size_t)n > C->max_out) {
        va_end(again);
        jlm_jj_fail(C, JLM_ERANGE, "output larger than the limit of %zu bytes", C->max_out);
    }
    buf_reserve(C, b, (size_t)n);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, again);
    va_end(again);
    b->len += (size_t)n;
}

/* ================================================================ str / repr */
/* Python's float repr: shortest digits that round-trip; fixed notation for
 * 1e-4 <= |f| < 1e16, else d.ddde+XX. */
void jlm_jj_write_float(jj_buf *b, jj_ctx *C, double f)
{
    if (isnan(f)) { jlm_jj_buf_puts(C, b, "nan"); return; }
    if (isinf(f)) { jlm_jj_buf_puts(C, b, f < 0 ? "-inf" : "inf"); return; }
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = e;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    int o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0'; out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > exp + 1) for (int i = exp + 1; i < nd; i++) out[o++] = digits[i];
            else out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    jlm_jj_buf_puts(C, b, out);
}

static void write_repr_str(jj_ctx *C, jj_buf *b, const char *s, size_t n)
{
    char q = (memchr(s, '\'', n) && !memchr(s, '"', n)) ? '"' : '\'';
    jlm_jj_buf_put(C, b, &q, 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\' || c == (unsigned char)q) { jlm_jj_buf_put(C, b, "\\", 1); jlm_jj_buf_put(C, b, s + i, 1); i++; continue; }
        if (c == '\n') { jlm_jj_buf_puts(C, b, "\\n"); i++; continue; }
        if (c == '\r') { jlm_jj_buf_puts(C, b, "\\r"); i++; continue; }
        if (c == '\t') { jlm_jj_buf_puts(C, b, "\\t"); i++; continue; }
        if (c < 0x20 || c == 0x7f) { jlm_jj_buf_printf(C, b, "\\x%02x", c); i++; continue; }
        if (c < 0x80) { jlm_jj_buf_put(C, b, s + i, 1); i++; continue; }
        utf8proc_int32_t cp;
        utf8proc_ssize_t cl = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (cl <= 0) { jlm_jj_buf_printf(C, b, "\\x%02x", c); i++; continue; }
        utf8proc_category_t cat = utf8proc_category(cp);
        int printable = !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CS ||
                          cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                          cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
        if (printable) jlm_jj_buf_put(C, b, s + i, (size_t)cl);
        else if (cp < 0x100) jlm_jj_buf_printf(C, b, "\\x%02x", (unsigned)cp);
        else if (cp < 0x10000) jlm_jj_buf_printf(C, b, "\\u%04x", (unsigned)cp);
        else jlm_jj_buf_printf(C, b, "\\U%08x", (unsigned)cp);
        i += (size_t)cl;
    }
    jlm_jj_buf_put(C, b, &q, 1);
}

static void write_seq(jj_ctx *C, jj_buf *b, jj_val v, int repr_items)
{
    (void)repr_items;
    jlm_jj_buf_puts(C, b, v.tuple ? "(" : "[");
    for (size_t i = 0; i < v.u.l->n; i++) {
        if (i) jlm_jj_buf_puts(C, b, ", ");
        jlm_jj_write_repr(C, b, v.u.l->v[i]);
    }
    if (v.tuple && v.u.l->n == 1) jlm_jj_buf_puts(C, b, ",");
    jlm_jj_buf_puts(C, b, v.tuple ? ")" : "]");
}

static void write_dict(jj_ctx *C, jj_buf *b, jj_dict *d)
{
    jlm_jj_buf_puts(C, b, "{");
    for (size_t i = 0; i < d->n; i++) {
        if (i) jlm_jj_buf_puts(C, b, ", ");
        jlm_jj_write_repr(C, b, d->k[i]);
        jlm_jj_buf_puts(C, b, ": ");
        jlm_jj_write_repr(C, b, d->v[i]);
    }
    jlm_jj_buf_puts(C, b, "}");
}

void jlm_jj_write_repr(jj_ctx *C, jj_buf *b, jj_val v)
{
    if (v.t == JT_STR) write_repr_str(C, b, v.u.s->s, v.u.s->len);
    else jlm_jj_write_str(C, b, v);
}

void jlm_jj_write_str(jj_ctx *C, jj_buf *b, jj_val v)
{
    switch (v.t) {
    case JT_UNDEF: return;
    case JT_NONE: jlm_jj_buf_puts(C, b, "None"); return;
    case JT_BOOL: jlm_jj_buf_puts(C, b, v.u.b ? "True" : "False"); return;
    case JT_INT: jlm_jj_buf_printf(C, b, "%lld", (long long)v.u.i); return;
    case JT_FLOAT: jlm_jj_write_float(b, C, v.u.f); return;
    case JT_STR: jlm_jj_buf_put(C, b, v.u.s->s, v.u.s->len); return;
    case JT_LIST: value_enter(C, "printing"); write_seq(C, b, v, 1); C->vdepth--; return;
    case JT_DICT: value_enter(C, "printing"); write_dict(C, b, v.u.d); C->vdepth--; return;
    case JT_NS:
        value_enter(C, "printing");
        jlm_jj_buf_puts(C, b, "<Namespace ");
        write_dict(C, b, v.u.d);
        jlm_jj_buf_puts(C, b, ">");
        C->vdepth--;
        return;
    case JT_FUNC: jlm_jj_buf_printf(C, b, "<function %s>", v.u.fn->name ? v.u.fn->name : "?"); return;
    }
}

jj_val jlm_jj_to_str(jj_ctx *C, jj_val v)
{
    if (v.t == JT_STR) return v;
    jj_buf b = {0};
    jlm_jj_write_str(C, &b, v);
    return jlm_jj_strn(C, b.p ? b.p : "", b.len);
}

/* ================================================================ json.dumps */
static void write_json_str(jj_ctx *C, jj_buf *b, const char *s, size_t n, int ensure_ascii)
{
    jlm_jj_buf_put(C, b, "\"", 1);
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[16];
        size_t adv = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); esc = tmp; }
        else if (c >= 0x80 && ensure_ascii) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t cl = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
            if (cl <= 0) { cl = 1; cp = 0xfffd; }
            adv = (size_t)cl;
            if (cp >= 0x10000) {
                unsigned v = (unsigned)cp - 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)cp);
            esc = tmp;
        }
        if (esc) {
            jlm_jj_buf_put(C, b, s + i - run, run);
            run = 0;
            jlm_jj_buf_puts(C, b, esc);
            i += adv;
        } else { run++; i++; }
    }
    jlm_jj_buf_put(C, b, s + n - run, run);
    jlm_jj_buf_put(C, b, "\"", 1);
}

static void json_newline(jj_ctx *C, jj_buf *b, const char *indent, int level)
{
    jlm_jj_buf_put(C, b, "\n", 1);
    for (int i = 0; i < level; i++) jlm_jj_buf_puts(C, b, indent);
}

static int cmp_keys(const void *x, const void *y)
{
    const jj_val *a = *(jj_val *const *)x, *b = *(jj_val *const *)y;
    if (a->t == JT_STR && b->t == JT_STR) return strcmp(a->u.s->s, b->u.s->s);
    return a->t - b->t;
}

void jlm_jj_write_json(jj_ctx *C, jj_buf *b, jj_val v, const char *indent, const char *item_sep,
                   const char *key_sep, int sort_keys, int ensure_ascii, int level)
{
    if (level > JJ_MAX_DEPTH) jlm_jj_fail(C, JLM_ERANGE, "tojson: nesting deeper than %d", JJ_MAX_DEPTH);
    switch (v.t) {
    case JT_NONE: jlm_jj_buf_puts(C, b, "null"); return;
    case JT_BOOL: jlm_jj_buf_puts(C, b, v.u.b ? "true" : "false"); return;
    case JT_INT: jlm_jj_buf_printf(C, b, "%lld", (long long)v.u.i); return;
    case JT_FLOAT:
        if (isnan(v.u.f)) jlm_jj_buf_puts(C, b, "NaN");
        else if (isinf(v.u.f)) jlm_jj_buf_puts(C, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else jlm_jj_write_float(b, C, v.u.f);
        return;
    case JT_STR: write_json_str(C, b, v.u.s->s, v.u.s->len, ensure_ascii); return;
    case JT_LIST:
        if (!v.u.l->n) { jlm_jj_buf_puts(C, b, "[]"); return; }
        jlm_jj_buf_puts(C, b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jlm_jj_buf_puts(C, b, item_sep);
            if (indent) json_newline(C, b, indent, level + 1);
            jlm_jj_write_json(C, b, v.u.l->v[i], indent, item_sep, key_sep, sort_keys, ensure_ascii, level + 1);
        }
        if (indent) json_newline(C, b, indent, level);
        jlm_jj_buf_puts(C, b, "]");
        return;
    case JT_DICT: case JT_NS: {
        jj_dict *d = v.u.d;
        if (!d->n) { jlm_jj_buf_puts(C, b, "{}"); return; }
        jj_val **order = jlm_jj_alloc(C, d->n * sizeof(jj_val *));
        for (size_t i = 0; i < d->n; i++) order[i] = &d->k[i];
        if (sort_keys) qsort(order, d->n, sizeof(jj_val *), cmp_keys);
        jlm_jj_buf_puts(C, b, "{");
        for (size_t j = 0; j < d->n; j++) {
            size_t i = (size_t)(order[j] - d->k);
            if (j) jlm_jj_buf_puts(C, b, item_sep);
            if (indent) json_newline(C, b, indent, level + 1);
            jj_val k = d->k[i];
            if (k.t != JT_STR) {   /* json.dumps converts int/float/bool/None keys to strings */
                if (k.t == JT_BOOL) k = jlm_jj_cstr(C, k.u.b ? "true" : "false");
                else if (k.t == JT_NONE) k = jlm_jj_cstr(C, "null");
                else if (k.t == JT_INT || k.t == JT_FLOAT) k = jlm_jj_to_str(C, k);
                else jlm_jj_fail(C, JLM_EINVAL, "tojson: keys must be str, int, float, bool or None, not %s", jlm_jj_type_name(k));
            }
            write_json_str(C, b, k.u.s->s, k.u.s->len, ensure_ascii);
            jlm_jj_buf_puts(C, b, key_sep);
            jlm_jj_write_json(C, b, d->v[i], indent, item_sep, key_sep, sort_keys, ensure_ascii, level + 1);
        }
        if (indent) json_newline(C, b, indent, level);
        jlm_jj_buf_puts(C, b, "}");
        return;
    }
    default:
        jlm_jj_fail(C, JLM_EINVAL, "tojson: object of type %s is not JSON serializable", jlm_jj_type_name(v));
    }
}

/* ================================================================ unicode */
size_t jlm_jj_utf8_len(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xc0) != 0x80) c++;
    return c;
}

size_t jlm_jj_utf8_offset(const char *s, size_t n, size_t cp)
{
    size_t c = 0, i = 0;
    for (; i < n; i++) {
        if (((unsigned char)s[i] & 0xc0) != 0x80) {
            if (c == cp) return i;
            c++;
        }
    }
    return n;
}

/* Python str.isspace() code points (what str.strip()/split() remove). */
int jlm_jj_py_space(const char *s, size_t n, size_t *cl)
{
    unsigned char c = (unsigned char)s[0];
    *cl = 1;
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
    utf8proc_int32_t cp;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &cp);
    if (l <= 0) return 0;
    *cl = (size_t)l;
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}
