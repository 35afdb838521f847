/* jinja_eval.c - the tree-walking interpreter: scopes, expressions, statements, macros.
 *
 * Scoping follows Jinja2: a for loop, a macro call and a with block get a new
 * scope (assignments inside do not leak out, and an iteration does not see
 * what the previous one set: one scope per iteration); if blocks do not. Macros close over the scope they were defined in and see its
 * current values. Undefined behaves like jinja2.Undefined: it renders as "",
 * is falsy, iterates as empty, and raises on attribute access, calls and
 * arithmetic.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/template/jinja_int.h"

#define JJ_MAX_EVAL_DEPTH 2000

enum { FLOW_NORMAL = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

static jj_val eval(jj_ctx *C, jj_node *n, jj_scope *sc);
static int exec_list(jj_ctx *C, jj_nlist *l, jj_scope *sc);

static jj_scope *new_scope(jj_ctx *C, jj_scope *parent)
{
    jj_scope *s = jlm_jj_alloc(C, sizeof(jj_scope));
    s->parent = parent;
    return s;
}

static jj_val *lookup(jj_scope *sc, const char *name)
{
    for (; sc; sc = sc->parent) {
        jj_val *v = jlm_jj_dict_finds(&sc->vars, name);
        if (v) return v;
    }
    return NULL;
}

_Noreturn static void fail_undef(jj_ctx *C, jj_val v)
{
    if (v.u.uname) jlm_jj_fail(C, JLM_EINVAL, "'%s' is undefined", v.u.uname);
    jlm_jj_fail(C, JLM_EINVAL, "undefined value used");
}

/* ================================================================ access */
jj_val jlm_jj_getattr(jj_ctx *C, jj_val obj, const char *name)
{
    switch (obj.t) {
    case JT_UNDEF: fail_undef(C, obj);
    case JT_DICT: {
        jj_val m = jlm_jj_method(C, obj, name);
        if (m.t != JT_UNDEF) return m;
        jj_val *v = jlm_jj_dict_finds(obj.u.d, name);
        return v ? *v : jlm_jj_undef(name);
    }
    case JT_NS: {
        jj_val *v = jlm_jj_dict_finds(obj.u.d, name);
        return v ? *v : jlm_jj_undef(name);
    }
    case JT_STR: case JT_LIST: {
        jj_val m = jlm_jj_method(C, obj, name);
        return m.t != JT_UNDEF ? m : jlm_jj_undef(name);
    }
    default: return jlm_jj_undef(name);
    }
}

static int64_t norm_index(int64_t i, size_t n, int *ok)
{
    if (i < 0) i += (int64_t)n;
    *ok = i >= 0 && (uint64_t)i < n;
    return i;
}

jj_val jlm_jj_getitem(jj_ctx *C, jj_val obj, jj_val key)
{
    switch (obj.t) {
    case JT_UNDEF: fail_undef(C, obj);
    case JT_DICT: case JT_NS: {
        jj_val *v = jlm_jj_dict_find(C, obj.u.d, key);
        if (v) return *v;
        if (key.t == JT_STR && obj.t == JT_DICT) return jlm_jj_getattr(C, obj, key.u.s->s);
        return jlm_jj_undef(key.t == JT_STR ? key.u.s->s : NULL);
    }
    case JT_LIST: case JT_STR: {
        if (key.t == JT_INT || key.t == JT_BOOL) {
            int ok;
            int64_t k = key.t == JT_INT ? key.u.i : key.u.b;
            if (obj.t == JT_LIST) {
                int64_t i = norm_index(k, obj.u.l->n, &ok);
                return ok ? obj.u.l->v[i] : jlm_jj_undef(NULL);
            }
            jlm_jj_work_bytes(C, 3 * obj.u.s->len);   /* three UTF-8 walks: the length, the character's two ends */
            size_t ncp = jlm_jj_utf8_len(obj.u.s->s, obj.u.s->len);
            int64_t i = norm_index(k, ncp, &ok);
            if (!ok) return jlm_jj_undef(NULL);
            size_t a = jlm_jj_utf8_offset(obj.u.s->s, obj.u.s->len, (size_t)i);
            size_t b = jlm_jj_utf8_offset(obj.u.s->s, obj.u.s->len, (size_t)i + 1);
            return jlm_jj_strn(C, obj.u.s->s + a, b - a);
        }
        if (key.t == JT_STR) return jlm_jj_getattr(C, obj, key.u.s->s);
        return jlm_jj_undef(NULL);
    }
    default: return jlm_jj_undef(NULL);
    }
}

static int64_t slice_bound(jj_ctx *C, jj_val v, int64_t def, int64_t n, int64_t step)
{
    if (v.t == JT_NONE || v.t == JT_UNDEF) return def;
    if (v.t != JT_INT && v.t != JT_BOOL) jlm_jj_fail(C, JLM_EINVAL, "slice indices must be integers or None");
    int64_t i = v.t == JT_INT ? v.u.i : v.u.b;
    if (i < 0) {
        i += n;
        if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) i = step < 0 ? n - 1 : n;
    return i;
}

static jj_val do_slice(jj_ctx *C, jj_val obj, jj_val vs, jj_val ve, jj_val vst)
{
    if (obj.t == JT_UNDEF) fail_undef(C, obj);
    if (obj.t != JT_LIST && obj.t != JT_STR) jlm_jj_fail(C, JLM_EINVAL, "'%s' object is not subscriptable", jlm_jj_type_name(obj));
    int64_t step = 1;
    if (vst.t == JT_INT) step = vst.u.i;
    else if (vst.t != JT_NONE && vst.t != JT_UNDEF) jlm_jj_fail(C, JLM_EINVAL, "slice step must be an integer");
    if (step == 0) jlm_jj_fail(C, JLM_EINVAL, "slice step cannot be zero");
    if (obj.t == JT_STR)
        jlm_jj_work_bytes(C, obj.u.s->len);   /* the UTF-8 walk; a list's items: as pushed */
    int64_t n = obj.t == JT_LIST ? (int64_t)obj.u.l->n : (int64_t)jlm_jj_utf8_len(obj.u.s->s, obj.u.s->len);
    int64_t s = slice_bound(C, vs, step < 0 ? n - 1 : 0, n, step);
    int64_t e = slice_bound(C, ve, step < 0 ? -1 : n, n, step);
    if (obj.t == JT_LIST) {
        jj_val r = jlm_jj_new_list(C);
        r.tuple = obj.tuple;
        for (int64_t i = s; step > 0 ? i < e : i > e; i += step) jlm_jj_list_push(C, r.u.l, obj.u.l->v[i]);
        return r;
    }
    jj_buf b = {0};
    const char *p = obj.u.s->s;
    size_t len = obj.u.s->len;
    if (step == 1 && s < e) {
        size_t a = jlm_jj_utf8_offset(p, len, (size_t)s), z = jlm_jj_utf8_offset(p, len, (size_t)e);
        return jlm_jj_strn(C, p + a, z - a);
    }
    /* character i's bytes are [a, z): a walked from character s, step
     * characters at a time (an offset counted from the start for each
     * character made a stepped slice of a long string quadratic) */
    size_t a = s < e || step < 0 ? jlm_jj_utf8_offset(p, len, (size_t)s) : len;
    for (int64_t i = s; step > 0 ? i < e : i > e; i += step) {
        size_t z = a + 1;
        while (z < len && ((unsigned char)p[z] & 0xc0) == 0x80) z++;
        jlm_jj_buf_put(C, &b, p + a, z - a);
        for (int64_t k = step > 0 ? step : -step; k > 0; k--) {
            if (step > 0) {
                if (a >= len) break;
                a++;
                while (a < len && ((unsigned char)p[a] & 0xc0) == 0x80) a++;
            } else {
                if (a == 0) break;
                a--;
                while (a > 0 && ((unsigned char)p[a] & 0xc0) == 0x80) a--;
            }
        }
    }
    return jlm_jj_strn(C, b.p ? b.p : "", b.len);
}

jj_val jlm_jj_iter_list(jj_ctx *C, jj_val v)
{
    switch (v.t) {
    case JT_UNDEF: return jlm_jj_new_list(C);
    case JT_LIST: {   /* snapshot: the loop visits the items present when it starts (one allocation) */
        jj_val r = jlm_jj_new_list(C);
        if (v.u.l->n) {
            r.u.l->v = jlm_jj_alloc(C, v.u.l->n * sizeof(jj_val));
            memcpy(r.u.l->v, v.u.l->v, v.u.l->n * sizeof(jj_val));
            r.u.l->n = r.u.l->cap = v.u.l->n;
        }
        return r;
    }
    case JT_DICT: {
        jj_val r = jlm_jj_new_list(C);
        for (size_t i = 0; i < v.u.d->n; i++) jlm_jj_list_push(C, r.u.l, v.u.d->k[i]);
        return r;
    }
    case JT_STR: {
        jj_val r = jlm_jj_new_list(C);
        const char *p = v.u.s->s;
        size_t i = 0;
        while (i < v.u.s->len) {
            size_t j = i + 1;
            while (j < v.u.s->len && ((unsigned char)p[j] & 0xc0) == 0x80) j++;
            jlm_jj_list_push(C, r.u.l, jlm_jj_strn(C, p + i, j - i));
            i = j;
        }
        return r;
    }
    default: jlm_jj_fail(C, JLM_EINVAL, "'%s' object is not iterable", jlm_jj_type_name(v));
    }
}

/* ================================================================ operators */
static int is_num(jj_val v) { return v.t == JT_BOOL || v.t == JT_INT || v.t == JT_FLOAT; }
static double fnum(jj_val v) { return v.t == JT_FLOAT ? v.u.f : v.t == JT_INT ? (double)v.u.i : v.u.b; }
static int64_t inum(jj_val v) { return v.t == JT_INT ? v.u.i : v.u.b; }

static const char *OPNAME[] = {"", "+", "-", "*", "/", "//", "%", "**", "~"};

_Noreturn static void bad_operands(jj_ctx *C, int op, jj_val a, jj_val b)
{
    if (a.t == JT_UNDEF) fail_undef(C, a);
    if (b.t == JT_UNDEF) fail_undef(C, b);
    jlm_jj_fail(C, JLM_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", OPNAME[op], jlm_jj_type_name(a),
            jlm_jj_type_name(b));
}

static jj_val repeat(jj_ctx *C, jj_val seq, int64_t k)
{
    if (k < 0) k = 0;
    if ((seq.t == JT_STR ? seq.u.s->len : seq.u.l->n) == 0)
        k = 0;   /* '' * 600000000: nothing to repeat, and no limit would stop the loop */
    if (seq.t == JT_STR) {
        if (seq.u.s->len && (uint64_t)k > C->max_out / seq.u.s->len)
            jlm_jj_fail(C, JLM_ERANGE, "string repetition past the output limit of %zu bytes", C->max_out);
        size_t total = seq.u.s->len * (size_t)k;
        jj_buf b = {0};
        if (k)
            jlm_jj_buf_put(C, &b, seq.u.s->s, seq.u.s->len);
        while (b.len < total)   /* doubling: a copy of what is there, not a put per repetition */
            jlm_jj_buf_put(C, &b, b.p, b.len < total - b.len ? b.len : total - b.len);
        return jlm_jj_strn(C, b.p ? b.p : "", b.len);
    }
    if (seq.u.l->n && (uint64_t)k > (1u << 24) / seq.u.l->n) jlm_jj_fail(C, JLM_ERANGE, "list repetition too large");
    jj_val r = jlm_jj_new_list(C);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.l->n; j++) jlm_jj_list_push(C, r.u.l, seq.u.l->v[j]);
    return r;
}

jj_val jlm_jj_str_mod(jj_ctx *C, jj_val fmt, jj_val args);   /* jinja_builtins.c */

static jj_val int_arith(jj_ctx *C, int op, int64_t x, int64_t y, jj_val a, jj_val b)
{
    int64_t r;
    switch (op) {
    case OP_ADD: if (__builtin_add_overflow(x, y, &r)) break; return jlm_jj_int(r);
    case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) break; return jlm_jj_int(r);
    case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) break; return jlm_jj_int(r);
    case OP_FLOORDIV: case OP_MOD: {
        if (y == 0) jlm_jj_fail(C, JLM_EINVAL, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) break;
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
        return jlm_jj_int(op == OP_FLOORDIV ? q : m);
    }
    case OP_POW: {
        if (y < 0) return jlm_jj_float(pow((double)x, (double)y));
        /* by squaring: O(log y) steps, so 0 ** 2**62 ends at once (a loop of y
         * steps ran for hours); a square that overflows while bits of y remain
         * means the power does too, since |x| >= 2 then */
        int64_t acc = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
            if ((e & 1) && __builtin_mul_overflow(acc, base, &acc))
                jlm_jj_fail(C, JLM_ERANGE, "integer power overflows 64 bits");
            if (e > 1 && __builtin_mul_overflow(base, base, &base))
                jlm_jj_fail(C, JLM_ERANGE, "integer power overflows 64 bits");
        }
        return jlm_jj_int(acc);
    }
    default: return jlm_jj_undef(NULL);
    }
    (void)a; (void)b;
    jlm_jj_fail(C, JLM_ERANGE, "integer %s overflows 64 bits", OPNAME[op]);
}

static jj_val arith(jj_ctx *C, int op, jj_val a, jj_val b)
{
    if (op == OP_CONCAT) {
        jj_val x = jlm_jj_to_str(C, a), y = jlm_jj_to_str(C, b);
        return jlm_jj_str_cat(C, x.u.s, y.u.s);
    }
    if (is_num(a) && is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT && op != OP_DIV) return int_arith(C, op, inum(a), inum(b), a, b);
        double x = fnum(a), y = fnum(b);
        switch (op) {
        case OP_ADD: return jlm_jj_float(x + y);
        case OP_SUB: return jlm_jj_float(x - y);
        case OP_MUL: return jlm_jj_float(x * y);
        case OP_DIV:
            if (y == 0) jlm_jj_fail(C, JLM_EINVAL, "division by zero");
            return jlm_jj_float(x / y);
        case OP_FLOORDIV:
            if (y == 0) jlm_jj_fail(C, JLM_EINVAL, "float floor division by zero");
            return jlm_jj_float(floor(x / y));
        case OP_MOD: {
            if (y == 0) jlm_jj_fail(C, JLM_EINVAL, "float modulo");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return jlm_jj_float(m);
        }
        case OP_POW: return jlm_jj_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a.t == JT_STR && b.t == JT_STR) return jlm_jj_str_cat(C, a.u.s, b.u.s);
    if (op == OP_ADD && a.t == JT_LIST && b.t == JT_LIST && a.tuple == b.tuple) {
        jj_val r = jlm_jj_new_list(C);
        r.tuple = a.tuple;
        for (size_t i = 0; i < a.u.l->n; i++) jlm_jj_list_push(C, r.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) jlm_jj_list_push(C, r.u.l, b.u.l->v[i]);
        return r;
    }
    if (op == OP_MUL && (a.t == JT_STR || a.t == JT_LIST) && (b.t == JT_INT || b.t == JT_BOOL)) return repeat(C, a, inum(b));
    if (op == OP_MUL && (b.t == JT_STR || b.t == JT_LIST) && (a.t == JT_INT || a.t == JT_BOOL)) return repeat(C, b, inum(a));
    if (op == OP_MOD && a.t == JT_STR) return jlm_jj_str_mod(C, a, b);
    bad_operands(C, op, a, b);
}

static int contains(jj_ctx *C, jj_val item, jj_val cont)
{
    switch (cont.t) {
    case JT_UNDEF: return 0;
    case JT_STR:
        if (item.t != JT_STR) jlm_jj_fail(C, JLM_EINVAL, "'in <string>' requires string as left operand, not %s", jlm_jj_type_name(item));
        jlm_jj_work_bytes(C, cont.u.s->len);
        return memmem(cont.u.s->s, cont.u.s->len, item.u.s->s, item.u.s->len) != NULL || item.u.s->len == 0;
    case JT_LIST:
        jlm_jj_work(C, cont.u.l->n);
        for (size_t i = 0; i < cont.u.l->n; i++)
            if (jlm_jj_equal(C, cont.u.l->v[i], item)) return 1;
        return 0;
    case JT_DICT: case JT_NS: return jlm_jj_dict_find(C, cont.u.d, item) != NULL;
    default: jlm_jj_fail(C, JLM_EINVAL, "argument of type '%s' is not iterable", jlm_jj_type_name(cont));
    }
}

static int compare(jj_ctx *C, int op, jj_val a, jj_val b)
{
    switch (op) {
    case OP_EQ: return jlm_jj_equal(C, a, b);
    case OP_NE: return !jlm_jj_equal(C, a, b);
    case OP_IN: return contains(C, a, b);
    case OP_NOTIN: return !contains(C, a, b);
    default: break;
    }
    if (a.t == JT_UNDEF) fail_undef(C, a);
    if (b.t == JT_UNDEF) fail_undef(C, b);
    int c = jlm_jj_compare(C, a, b);
    if (c == 0 && ((a.t == JT_FLOAT && isnan(a.u.f)) || (b.t == JT_FLOAT && isnan(b.u.f)))) return 0;
    switch (op) {
    case OP_LT: return c < 0;
    case OP_LE: return c <= 0;
    case OP_GT: return c > 0;
    default: return c >= 0;
    }
}

/* ================================================================ calls */
static void eval_args(jj_ctx *C, jj_node *n, jj_scope *sc, jj_args *a)
{
    memset(a, 0, sizeof *a);
    int np = 0, nk = 0;
    for (int i = 0; i < n->args.n; i++) {
        if (n->names[i]) nk++;
        else np++;
    }
    a->pos = jlm_jj_alloc(C, (size_t)(np + 1) * sizeof(jj_val));
    a->kw = jlm_jj_alloc(C, (size_t)(nk + 1) * sizeof(jj_val));
    a->kw_name = jlm_jj_alloc(C, (size_t)(nk + 1) * sizeof(char *));
    for (int i = 0; i < n->args.n; i++) {
        jj_val v = eval(C, n->args.v[i], sc);
        if (n->names[i]) {
            a->kw_name[a->n_kw] = n->names[i];
            a->kw[a->n_kw++] = v;
        } else a->pos[a->n_pos++] = v;
    }
}

static jj_val call_macro(jj_ctx *C, jj_func *f, jj_args *a)
{
    jj_node *m = f->macro;
    const char *mname = m->name ? m->name : "caller";
    jj_scope *sc = new_scope(C, f->closure);
    char *set = jlm_jj_alloc(C, (size_t)m->n_names + 1);
    jj_val varargs = jlm_jj_new_list(C), kwargs = jlm_jj_new_dict(C);
    varargs.tuple = 1;
    for (int i = 0; i < a->n_pos; i++) {
        if (i < m->n_names) {
            jlm_jj_dict_sets(C, &sc->vars, m->names[i], a->pos[i]);
            set[i] = 1;
        } else if (m->flags & 1) jlm_jj_list_push(C, varargs.u.l, a->pos[i]);
        else jlm_jj_fail(C, JLM_EINVAL, "macro '%s' takes not more than %d argument(s)", mname, m->n_names);
    }
    for (int i = 0; i < a->n_kw; i++) {
        int j;
        for (j = 0; j < m->n_names; j++)
            if (!strcmp(m->names[j], a->kw_name[i])) break;
        if (j < m->n_names) {
            if (set[j]) jlm_jj_fail(C, JLM_EINVAL, "macro '%s' got multiple values for argument '%s'", mname, m->names[j]);
            jlm_jj_dict_sets(C, &sc->vars, m->names[j], a->kw[i]);
            set[j] = 1;
        } else if (m->flags & 2) jlm_jj_dict_sets(C, kwargs.u.d, a->kw_name[i], a->kw[i]);
        else jlm_jj_fail(C, JLM_EINVAL, "macro '%s' takes no keyword argument '%s'", mname, a->kw_name[i]);
    }
    for (int j = 0; j < m->n_names; j++)
        if (!set[j])
            jlm_jj_dict_sets(C, &sc->vars, m->names[j], m->args2.v[j] ? eval(C, m->args2.v[j], sc) : jlm_jj_undef(m->names[j]));
    jlm_jj_dict_sets(C, &sc->vars, "varargs", varargs);
    jlm_jj_dict_sets(C, &sc->vars, "kwargs", kwargs);
    if (f->caller.t == JT_FUNC) jlm_jj_dict_sets(C, &sc->vars, "caller", f->caller);
    jj_buf *saved = C->out, buf = {0};
    C->out = &buf;
    exec_list(C, &m->args, sc);
    C->out = saved;
    return jlm_jj_strn(C, buf.p ? buf.p : "", buf.len);
}

jj_val jlm_jj_call(jj_ctx *C, jj_val fn, jj_args *a)
{
    if (fn.t == JT_UNDEF) fail_undef(C, fn);
    if (fn.t != JT_FUNC) jlm_jj_fail(C, JLM_EINVAL, "'%s' object is not callable", jlm_jj_type_name(fn));
    if (fn.u.fn->kind == JJ_FN_MACRO) return call_macro(C, fn.u.fn, a);
    return fn.u.fn->fn(C, fn.u.fn->self, a);
}

/* ================================================================ expressions */
static jj_val eval_filter(jj_ctx *C, jj_node *n, jj_scope *sc, jj_val in)
{
    jj_args a;
    eval_args(C, n, sc, &a);
    C->line = n->line;
    return jlm_jj_apply_filter(C, n->name, in, &a);
}

/* Applies a chain of N_FILTER nodes whose innermost input is a placeholder. */
static jj_val apply_filter_chain(jj_ctx *C, jj_node *f, jj_scope *sc, jj_val in)
{
    if (f->kind != N_FILTER) return in;
    in = apply_filter_chain(C, f->a, sc, in);
    return eval_filter(C, f, sc, in);
}

static jj_val eval_inner(jj_ctx *C, jj_node *n, jj_scope *sc)
{
    switch (n->kind) {
    case N_LIT: return n->lit;
    case N_NAME: {
        jj_val *v = lookup(sc, n->name);
        return v ? *v : jlm_jj_undef(n->name);
    }
    case N_LIST: case N_TUPLE: {
        jj_val r = jlm_jj_new_list(C);
        r.tuple = n->kind == N_TUPLE;
        for (int i = 0; i < n->args.n; i++) jlm_jj_list_push(C, r.u.l, eval(C, n->args.v[i], sc));
        return r;
    }
    case N_DICT: {
        jj_val r = jlm_jj_new_dict(C);
        for (int i = 0; i < n->args.n; i++) {
            jj_val k = eval(C, n->args.v[i], sc);
            if (k.t == JT_LIST && !k.tuple) jlm_jj_fail(C, JLM_EINVAL, "unhashable type: 'list'");
            if (k.t == JT_DICT) jlm_jj_fail(C, JLM_EINVAL, "unhashable type: 'dict'");
            jlm_jj_dict_set(C, r.u.d, k, eval(C, n->args2.v[i], sc));
        }
        return r;
    }
    case N_ATTR: return jlm_jj_getattr(C, eval(C, n->a, sc), n->name);
    case N_ITEM: {
        jj_val o = eval(C, n->a, sc);
        return jlm_jj_getitem(C, o, eval(C, n->b, sc));
    }
    case N_SLICE: {
        jj_val o = eval(C, n->a, sc), u = jlm_jj_none();
        return do_slice(C, o, n->b ? eval(C, n->b, sc) : u, n->c ? eval(C, n->c, sc) : u, n->d ? eval(C, n->d, sc) : u);
    }
    case N_CALL: {
        jj_val fn = eval(C, n->a, sc);
        jj_args a;
        eval_args(C, n, sc, &a);
        C->line = n->line;
        return jlm_jj_call(C, fn, &a);
    }
    case N_FILTER: return eval_filter(C, n, sc, eval(C, n->a, sc));
    case N_TEST: {
        jj_val in = eval(C, n->a, sc);
        jj_args a;
        eval_args(C, n, sc, &a);
        C->line = n->line;
        int r = jlm_jj_apply_test(C, n->name, in, &a);
        return jlm_jj_bool(n->op ? !r : r);
    }
    case N_NEG: case N_POS: {
        jj_val v = eval(C, n->a, sc);
        if (v.t == JT_FLOAT) return jlm_jj_float(n->kind == N_NEG ? -v.u.f : v.u.f);
        if (v.t == JT_INT || v.t == JT_BOOL) {
            int64_t i = inum(v);
            if (n->kind == N_POS) return jlm_jj_int(i);
            if (i == INT64_MIN) jlm_jj_fail(C, JLM_ERANGE, "integer negation overflows 64 bits");
            return jlm_jj_int(-i);
        }
        if (v.t == JT_UNDEF) fail_undef(C, v);
        jlm_jj_fail(C, JLM_EINVAL, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+", jlm_jj_type_name(v));
    }
    case N_NOT: return jlm_jj_bool(!jlm_jj_truthy(eval(C, n->a, sc)));
    case N_AND: {
        jj_val a = eval(C, n->a, sc);
        return jlm_jj_truthy(a) ? eval(C, n->b, sc) : a;
    }
    case N_OR: {
        jj_val a = eval(C, n->a, sc);
        return jlm_jj_truthy(a) ? a : eval(C, n->b, sc);
    }
    case N_BIN: {
        jj_val a = eval(C, n->a, sc), b = eval(C, n->b, sc);
        C->line = n->line;
        return arith(C, n->op, a, b);
    }
    case N_CMP: {
        jj_val a = eval(C, n->a, sc), b = eval(C, n->b, sc);
        C->line = n->line;
        return jlm_jj_bool(compare(C, n->op, a, b));
    }
    case N_COND:
        if (jlm_jj_truthy(eval(C, n->a, sc))) return eval(C, n->b, sc);
        return n->c ? eval(C, n->c, sc) : jlm_jj_undef(NULL);
    default:
        jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: node kind %d in an expression", n->kind);
    }
}

static jj_val eval(jj_ctx *C, jj_node *n, jj_scope *sc)
{
    if (++C->depth > JJ_MAX_EVAL_DEPTH) jlm_jj_fail(C, JLM_ERANGE, "evaluation nested deeper than %d", JJ_MAX_EVAL_DEPTH);
    C->line = n->line;
    jlm_jj_step(C);
    jj_val v = eval_inner(C, n, sc);
    C->depth--;
    return v;
}

/* ================================================================ statements */
static void assign_targets(jj_ctx *C, jj_scope *sc, const char **names, int n, jj_val v)
{
    if (n == 1) {
        jlm_jj_dict_sets(C, &sc->vars, names[0], v);
        return;
    }
    jj_val items = v.t == JT_LIST ? v : jlm_jj_iter_list(C, v);
    if (items.u.l->n != (size_t)n)
        jlm_jj_fail(C, JLM_EINVAL, "cannot unpack %zu values into %d names", items.u.l->n, n);
    for (int i = 0; i < n; i++) jlm_jj_dict_sets(C, &sc->vars, names[i], items.u.l->v[i]);
}

static jj_val loop_cycle(jj_ctx *C, jj_val self, jj_args *a)
{
    if (!a->n_pos) jlm_jj_fail(C, JLM_EINVAL, "loop.cycle: no items given");
    return a->pos[self.u.i % a->n_pos];
}

static void exec_for(jj_ctx *C, jj_node *n, jj_scope *sc)
{
    jj_val items = jlm_jj_iter_list(C, eval(C, n->a, sc));
    jj_scope *ls = new_scope(C, sc);
    if (n->b) {   /* for x in y if cond: filter first, loop.* counts the kept items */
        jj_val kept = jlm_jj_new_list(C);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jlm_jj_step(C);   /* an iteration is a step, whatever its body */
            assign_targets(C, ls, n->names, n->n_names, items.u.l->v[i]);
            if (jlm_jj_truthy(eval(C, n->b, ls))) jlm_jj_list_push(C, kept.u.l, items.u.l->v[i]);
        }
        items = kept;
    }
    size_t len = items.u.l->n;
    for (size_t i = 0; i < len; i++) {
        jlm_jj_step(C);
        ls = new_scope(C, sc);   /* Jinja: a set in one iteration is not seen by the next */
        jj_val lp = jlm_jj_new_dict(C);
        jj_dict *d = lp.u.d;
        jlm_jj_dict_sets(C, d, "index", jlm_jj_int((int64_t)i + 1));
        jlm_jj_dict_sets(C, d, "index0", jlm_jj_int((int64_t)i));
        jlm_jj_dict_sets(C, d, "revindex", jlm_jj_int((int64_t)(len - i)));
        jlm_jj_dict_sets(C, d, "revindex0", jlm_jj_int((int64_t)(len - i - 1)));
        jlm_jj_dict_sets(C, d, "first", jlm_jj_bool(i == 0));
        jlm_jj_dict_sets(C, d, "last", jlm_jj_bool(i + 1 == len));
        jlm_jj_dict_sets(C, d, "length", jlm_jj_int((int64_t)len));
        jlm_jj_dict_sets(C, d, "depth", jlm_jj_int(1));
        jlm_jj_dict_sets(C, d, "depth0", jlm_jj_int(0));
        jlm_jj_dict_sets(C, d, "previtem", i ? items.u.l->v[i - 1] : jlm_jj_undef("previtem"));
        jlm_jj_dict_sets(C, d, "nextitem", i + 1 < len ? items.u.l->v[i + 1] : jlm_jj_undef("nextitem"));
        jlm_jj_dict_sets(C, d, "cycle", jlm_jj_new_func(C, "loop.cycle", loop_cycle, jlm_jj_int((int64_t)i)));
        jlm_jj_dict_sets(C, &ls->vars, "loop", lp);
        assign_targets(C, ls, n->names, n->n_names, items.u.l->v[i]);
        int fl = exec_list(C, &n->args, ls);
        if (fl == FLOW_BREAK) break;
    }
    if (!len && n->args2.n) exec_list(C, &n->args2, sc);
}

static jj_val render_body(jj_ctx *C, jj_nlist *body, jj_scope *sc)
{
    jj_buf *saved = C->out, buf = {0};
    C->out = &buf;
    exec_list(C, body, sc);
    C->out = saved;
    return jlm_jj_strn(C, buf.p ? buf.p : "", buf.len);
}

static jj_val make_macro(jj_ctx *C, jj_node *n, jj_scope *sc)
{
    jj_val f = jlm_jj_new_func(C, n->name ? n->name : "caller", NULL, jlm_jj_none());
    f.u.fn->kind = JJ_FN_MACRO;
    f.u.fn->macro = n;
    f.u.fn->closure = sc;
    return f;
}

static int exec_node(jj_ctx *C, jj_node *n, jj_scope *sc)
{
    C->line = n->line;
    jlm_jj_step(C);
    switch (n->kind) {
    case N_TEXT: jlm_jj_buf_put(C, C->out, n->lit.u.s->s, n->lit.u.s->len); return 0;
    case N_EMIT: jlm_jj_write_str(C, C->out, eval(C, n->a, sc)); return 0;
    case N_IF:
        if (jlm_jj_truthy(eval(C, n->a, sc))) return exec_list(C, &n->args, sc);
        return exec_list(C, &n->args2, sc);
    case N_FOR: exec_for(C, n, sc); return 0;
    case N_SET: {
        jj_val v = eval(C, n->b, sc);
        if (n->a) {
            jj_val ns = eval(C, n->a, sc);
            if (ns.t != JT_NS) jlm_jj_fail(C, JLM_EINVAL, "cannot assign attribute on non-namespace object '%s'", n->a->name);
            jlm_jj_dict_sets(C, ns.u.d, n->name, v);
        } else assign_targets(C, sc, n->names, n->n_names, v);
        return 0;
    }
    case N_SETBLOCK: {
        jj_val v = render_body(C, &n->args, sc);
        if (n->c) v = apply_filter_chain(C, n->c, sc, v);
        if (n->a) {
            jj_val ns = eval(C, n->a, sc);
            if (ns.t != JT_NS) jlm_jj_fail(C, JLM_EINVAL, "cannot assign attribute on non-namespace object '%s'", n->a->name);
            jlm_jj_dict_sets(C, ns.u.d, n->name, v);
        } else assign_targets(C, sc, n->names, n->n_names, v);
        return 0;
    }
    case N_MACRO: jlm_jj_dict_sets(C, &sc->vars, n->name, make_macro(C, n, sc)); return 0;
    case N_CALLBLOCK: {
        jj_val fn = eval(C, n->a->a, sc);
        jj_args a;
        eval_args(C, n->a, sc, &a);
        if (fn.t != JT_FUNC || fn.u.fn->kind != JJ_FN_MACRO)
            jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: {%% call %%} of something other than a macro");
        jj_func f = *fn.u.fn;
        f.caller = make_macro(C, n, sc);
        jlm_jj_buf_puts(C, C->out, call_macro(C, &f, &a).u.s->s);
        return 0;
    }
    case N_FILTERBLOCK: {
        jj_val v = render_body(C, &n->args, sc);
        jlm_jj_write_str(C, C->out, apply_filter_chain(C, n->c, sc, v));
        return 0;
    }
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    case N_BODY: return exec_list(C, &n->args, sc);
    case N_DO: eval(C, n->a, sc); return 0;
    case N_WITH: {
        jj_scope *ws = new_scope(C, sc);
        for (int i = 0; i < n->n_names; i++) jlm_jj_dict_sets(C, &ws->vars, n->names[i], eval(C, n->args2.v[i], sc));
        return exec_list(C, &n->args, ws);
    }
    default: jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: node kind %d as a statement", n->kind);
    }
}

static int exec_list(jj_ctx *C, jj_nlist *l, jj_scope *sc)
{
    if (++C->depth > JJ_MAX_EVAL_DEPTH) jlm_jj_fail(C, JLM_ERANGE, "statements nested deeper than %d", JJ_MAX_EVAL_DEPTH);
    for (int i = 0; i < l->n; i++) {
        int fl = exec_node(C, l->v[i], sc);
        if (fl) { C->depth--; return fl; }
    }
    C->depth--;
    return FLOW_NORMAL;
}

void jlm_jj_exec(jj_ctx *C, jj_node *body, jj_scope *sc)
{
    C->depth = 0;
    exec_list(C, &body->args, sc);
}
