/* jinja_int.h - internals shared by the text/template/jinja_*.c files (not a public API).
 *
 * Memory: every value, AST node and scope of one template lives in an arena
 * (jj_ctx.arena) freed in one go, so values are plain structs that point into
 * it and nothing is reference counted.
 *
 * Errors: inside the lexer, parser and interpreter an error is raised with
 * jlm_jj_fail(), which formats the message into the caller's jlm_err and longjmps
 * back to the single public entry point (jlm_jinja_parse / jlm_jinja_render).
 * This is safe because nothing is owned outside the arena. The public
 * functions keep the project convention (return 0 or -JLM_E*).
 *
 * Bounds (checked, JLM_ERANGE): arena bytes (JJ_MAX_ARENA), call/expression
 * depth (JJ_MAX_DEPTH), output bytes and string length (max_out), steps
 * (jlm_jj_step: every expression evaluated and statement run), loop
 * iterations.
 */
#ifndef JLM_JINJA_INT_H
#define JLM_JINJA_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "base/jlm_err.h"
#include "text/template/jinja.h"

#define JJ_MAX_ARENA ((size_t)256 << 20)
#define JJ_MAX_DEPTH 200

/* ---------------------------------------------------------------- arena */
typedef struct jj_chunk { struct jj_chunk *next; size_t used, cap; } jj_chunk;
typedef struct jj_arena { jj_chunk *head; size_t total; } jj_arena;

/* ---------------------------------------------------------------- values */
typedef enum {
    JT_UNDEF, JT_NONE, JT_BOOL, JT_INT, JT_FLOAT, JT_STR, JT_LIST, JT_DICT, JT_NS, JT_FUNC
} jj_type;

typedef struct jj_str  { size_t len; char s[]; } jj_str;   /* s NUL-terminated, UTF-8 */
typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jj_func jj_func;

typedef struct jj_val {
    uint8_t t;         /* jj_type */
    uint8_t tuple;     /* JT_LIST created as a tuple (repr uses parentheses) */
    union {
        int          b;
        int64_t      i;
        double       f;
        jj_str      *s;
        jj_list     *l;
        jj_dict     *d;        /* JT_DICT and JT_NS */
        jj_func     *fn;
        const char  *uname;    /* JT_UNDEF: the name looked up, for messages (may be NULL) */
    } u;
} jj_val;

struct jj_list { size_t n, cap; jj_val *v; };
struct jj_dict { size_t n, cap; jj_val *k, *v; };   /* insertion ordered */

typedef struct jj_ctx  jj_ctx;
typedef struct jj_node jj_node;
typedef struct jj_scope jj_scope;

/* Arguments of a call: positional then keyword (kw names NULL for positional). */
typedef struct jj_args {
    int n_pos, n_kw;
    jj_val *pos;
    const char **kw_name;
    jj_val *kw;
} jj_args;

typedef jj_val (*jj_builtin)(jj_ctx *C, jj_val self, jj_args *a);

enum { JJ_FN_BUILTIN, JJ_FN_MACRO };
struct jj_func {
    int         kind;
    const char *name;
    jj_builtin  fn;         /* JJ_FN_BUILTIN */
    jj_val      self;       /* bound object for methods */
    jj_node    *macro;      /* JJ_FN_MACRO: the MACRO or CALLBLOCK node */
    jj_scope   *closure;    /* scope the macro was defined in */
    jj_val      caller;     /* JT_FUNC when invoked through {% call %} */
};

/* ---------------------------------------------------------------- AST */
typedef struct jj_nlist { jj_node **v; int n, cap; } jj_nlist;

enum jj_kind {
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_BIN, N_CMP, N_COND,
    /* statements */
    N_TEXT, N_EMIT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_BREAK, N_CONTINUE, N_BODY, N_DO, N_WITH
};

/* Binary / comparison operators. */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

struct jj_node {
    int         kind, line, op;
    const char *name;       /* NAME, ATTR, FILTER, TEST, SET target, MACRO name */
    jj_val      lit;        /* LIT, TEXT */
    jj_node    *a, *b, *c, *d;
    jj_nlist    args;       /* call args / list items / dict keys / body */
    jj_nlist    args2;      /* dict values / else body / macro defaults */
    const char **names;     /* kwarg names (parallel to args) / for targets / macro params */
    int         n_names;
    int         flags;      /* N_FOR: 1 = recursive; N_MACRO: uses varargs(1)/kwargs(2)/caller(4) */
};

/* ---------------------------------------------------------------- context */
typedef struct jj_buf { char *p; size_t len, cap; } jj_buf;

struct jj_scope { jj_dict vars; jj_scope *parent; };

struct jj_ctx {
    jj_arena    arena;
    jmp_buf     jb;
    jlm_err    *err;
    int         line;        /* line of the node being evaluated, for messages */
    int         depth;
    int         vdepth;      /* levels inside a value being printed or ordered (JJ_MAX_DEPTH) */
    jj_buf     *out;
    jj_scope   *globals;
    time_t      now;
    int         utc;         /* strftime_now formats in UTC (else local time) */
    const char *src;         /* for the lexer */
    uint64_t    steps, max_steps;           /* jlm_jj_step */
    uint64_t    work_bytes;                 /* jlm_jj_work_bytes: bytes not yet a whole step */
    uint64_t    next_check;                 /* the step at which jlm_jj_step_slow runs next */
    size_t      max_out;                    /* output bytes, and bytes of one string */
    int       (*cancelled)(void *arg);     /* jlm_jinja_opts */
    void       *cancel_arg;
};

/* One step of the budget: JLM_ERANGE past max_steps; every
 * JLM_JINJA_CANCEL_EVERY steps, JLM_EIO when the caller cancelled. */
void    jlm_jj_step_slow(jj_ctx *C);
static inline void jlm_jj_step(jj_ctx *C)
{
    if (++C->steps >= C->next_check) jlm_jj_step_slow(C);
}

/* Work inside one step, charged to the same budget (jinja.h invariant 4):
 * n steps for n list items visited or compared, one step a JJ_WORK_BYTES of
 * string made, scanned or compared (the remainder carried to the next
 * charge; a write to a buffer also costs JJ_PUT_BYTES, so a character at a
 * time is not free). So a loop over a long string or list is bounded by what
 * it does, not only by how often it runs. */
#define JJ_WORK_BYTES 256
#define JJ_PUT_BYTES  16
static inline void jlm_jj_work(jj_ctx *C, uint64_t n)
{
    if ((C->steps += n) >= C->next_check) jlm_jj_step_slow(C);
}
static inline void jlm_jj_work_bytes(jj_ctx *C, size_t n)
{
    C->work_bytes += n;
    if (C->work_bytes >= JJ_WORK_BYTES) {
        uint64_t w = C->work_bytes / JJ_WORK_BYTES;
        C->work_bytes %= JJ_WORK_BYTES;
        jlm_jj_work(C, w);
    }
}

/* jinja_value.c */
_Noreturn void jlm_jj_fail(jj_ctx *C, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void   *jlm_jj_alloc(jj_ctx *C, size_t n);
void    jlm_jj_arena_free(jj_arena *a);
char   *jlm_jj_strdup(jj_ctx *C, const char *s, size_t n);
jj_val  jlm_jj_undef(const char *name);
jj_val  jlm_jj_none(void);
jj_val  jlm_jj_bool(int b);
jj_val  jlm_jj_int(int64_t i);
jj_val  jlm_jj_float(double f);
jj_val  jlm_jj_strn(jj_ctx *C, const char *s, size_t n);
jj_val  jlm_jj_cstr(jj_ctx *C, const char *s);
jj_val  jlm_jj_str_cat(jj_ctx *C, const jj_str *a, const jj_str *b);   /* a + b, one allocation */
jj_val  jlm_jj_new_list(jj_ctx *C);
jj_val  jlm_jj_new_dict(jj_ctx *C);
jj_val  jlm_jj_new_func(jj_ctx *C, const char *name, jj_builtin fn, jj_val self);
void    jlm_jj_list_push(jj_ctx *C, jj_list *l, jj_val v);
jj_val *jlm_jj_dict_find(jj_ctx *C, jj_dict *d, jj_val key);
jj_val *jlm_jj_dict_finds(jj_dict *d, const char *key);
void    jlm_jj_dict_set(jj_ctx *C, jj_dict *d, jj_val key, jj_val v);
void    jlm_jj_dict_sets(jj_ctx *C, jj_dict *d, const char *key, jj_val v);
int     jlm_jj_truthy(jj_val v);
int     jlm_jj_equal(jj_ctx *C, jj_val a, jj_val b);   /* charges its walk (jlm_jj_work) */
int     jlm_jj_compare(jj_ctx *C, jj_val a, jj_val b);   /* <0, 0, >0; raises on unorderable */
const char *jlm_jj_type_name(jj_val v);
void    jlm_jj_buf_put(jj_ctx *C, jj_buf *b, const char *s, size_t n);
void    jlm_jj_buf_puts(jj_ctx *C, jj_buf *b, const char *s);
void    jlm_jj_buf_printf(jj_ctx *C, jj_buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void    jlm_jj_write_str(jj_ctx *C, jj_buf *b, jj_val v);      /* Python str() */
void    jlm_jj_write_repr(jj_ctx *C, jj_buf *b, jj_val v);     /* Python repr() */
void    jlm_jj_write_float(jj_buf *b, jj_ctx *C, double f);    /* Python float repr */
jj_val  jlm_jj_to_str(jj_ctx *C, jj_val v);                    /* str() as a JT_STR */
/* json.dumps(v, ensure_ascii, indent (NULL = none), separators, sort_keys) */
void    jlm_jj_write_json(jj_ctx *C, jj_buf *b, jj_val v, const char *indent, const char *item_sep,
                      const char *key_sep, int sort_keys, int ensure_ascii, int level);
/* Unicode helpers */
size_t  jlm_jj_utf8_len(const char *s, size_t n);              /* number of code points */
size_t  jlm_jj_utf8_offset(const char *s, size_t n, size_t cp); /* byte offset of code point cp */
int     jlm_jj_py_space(const char *s, size_t n, size_t *cl);  /* whitespace code point at s? its byte length in *cl */

/* jinja_parse.c */
jj_node *jlm_jj_parse(jj_ctx *C, const char *src, size_t len);

/* jinja_eval.c */
void    jlm_jj_exec(jj_ctx *C, jj_node *body, jj_scope *sc);
jj_val  jlm_jj_call(jj_ctx *C, jj_val fn, jj_args *a);
jj_val  jlm_jj_getattr(jj_ctx *C, jj_val obj, const char *name);
jj_val  jlm_jj_getitem(jj_ctx *C, jj_val obj, jj_val key);
jj_val  jlm_jj_iter_list(jj_ctx *C, jj_val v);                  /* list of the items `for` visits */

/* jinja_builtins.c */
jj_val  jlm_jj_apply_filter(jj_ctx *C, const char *name, jj_val in, jj_args *a);
int     jlm_jj_apply_test(jj_ctx *C, const char *name, jj_val in, jj_args *a);
jj_val  jlm_jj_method(jj_ctx *C, jj_val obj, const char *name);  /* bound method or JT_UNDEF */
void    jlm_jj_install_globals(jj_ctx *C, jj_scope *g);
int     jlm_jj_has_filter(const char *name);
int     jlm_jj_has_test(const char *name);

#endif
