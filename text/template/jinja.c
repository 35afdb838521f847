/* jinja.c - public entry points of the Jinja interpreter (see jinja.h).
 * Each entry point owns one jj_ctx: a setjmp here catches every jlm_jj_fail()
 * raised below, frees the arena and returns the code.
 */
#include <stdlib.h>
#include <string.h>

#include "text/template/jinja.h"
#include "text/template/jinja_int.h"

struct jlm_jinja {
    jj_arena arena;
    jj_node *root;
};

static jj_val from_json(jj_ctx *C, const json_t *j, int depth)
{
    if (depth > JJ_MAX_DEPTH) jlm_jj_fail(C, JLM_ERANGE, "variables nested deeper than %d", JJ_MAX_DEPTH);
    switch (json_typeof(j)) {
    case JSON_NULL: return jlm_jj_none();
    case JSON_TRUE: return jlm_jj_bool(1);
    case JSON_FALSE: return jlm_jj_bool(0);
    case JSON_INTEGER: return jlm_jj_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jlm_jj_float(json_real_value(j));
    case JSON_STRING: return jlm_jj_strn(C, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        jj_val l = jlm_jj_new_list(C);
        size_t i;
        const json_t *x;
        json_array_foreach(j, i, x) jlm_jj_list_push(C, l.u.l, from_json(C, x, depth + 1));
        return l;
    }
    case JSON_OBJECT: {
        jj_val d = jlm_jj_new_dict(C);
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)j, k, x) jlm_jj_dict_sets(C, d.u.d, k, from_json(C, x, depth + 1));
        return d;
    }
    }
    return jlm_jj_none();
}

int jlm_jinja_parse(const char *src, size_t len, jlm_jinja **out, jlm_err *err)
{
    jlm_err local;
    jj_ctx *C = calloc(1, sizeof *C);
    jlm_jinja *t = calloc(1, sizeof *t);
    if (!C || !t) {
        free(C);
        free(t);
        return jlm_errf(err, JLM_ENOMEM, "template: out of memory");
    }
    C->err = err ? err : &local;
    C->max_steps = JLM_JINJA_MAX_STEPS;
    C->max_out = JLM_JINJA_MAX_OUT;
    C->next_check = C->max_steps + 1;   /* parsing takes no steps */
    if (setjmp(C->jb)) {
        int code = C->err->code;
        jlm_jj_arena_free(&C->arena);
        free(C);
        free(t);
        return code;
    }
    t->root = jlm_jj_parse(C, src, len);
    t->arena = C->arena;
    free(C);
    *out = t;
    return 0;
}

void jlm_jinja_free(jlm_jinja *t)
{
    if (!t) return;
    jlm_jj_arena_free(&t->arena);
    free(t);
}

int jlm_jinja_render(const jlm_jinja *t, const json_t *vars, const jlm_jinja_opts *opts,
                     char **out, size_t *out_len, jlm_err *err)
{
    jlm_err local;
    jj_ctx *C = calloc(1, sizeof *C);
    if (!C) return jlm_errf(err, JLM_ENOMEM, "template: out of memory");
    C->err = err ? err : &local;
    C->now = opts && opts->now ? opts->now : time(NULL);
    C->utc = !(opts && opts->local_time);
    C->max_steps = opts && opts->max_steps ? opts->max_steps : JLM_JINJA_MAX_STEPS;
    C->next_check = C->max_steps < JLM_JINJA_CANCEL_EVERY ? C->max_steps + 1 : JLM_JINJA_CANCEL_EVERY;
    C->max_out = opts && opts->max_out && opts->max_out < JLM_JINJA_MAX_OUT ? opts->max_out : JLM_JINJA_MAX_OUT;
    C->cancelled = opts ? opts->cancelled : NULL;
    C->cancel_arg = opts ? opts->cancel_arg : NULL;
    if (setjmp(C->jb)) {
        int code = C->err->code;
        jlm_jj_arena_free(&C->arena);
        free(C);
        return code;
    }
    jj_scope *g = jlm_jj_alloc(C, sizeof(jj_scope));
    jlm_jj_install_globals(C, g);
    jj_scope *top = jlm_jj_alloc(C, sizeof(jj_scope));
    top->parent = g;
    if (vars) {
        if (!json_is_object(vars)) jlm_jj_fail(C, JLM_EINVAL, "variables must be a JSON object");
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)vars, k, x) jlm_jj_dict_sets(C, &top->vars, k, from_json(C, x, 0));
    }
    jj_buf buf = {0};
    C->out = &buf;
    jlm_jj_exec(C, t->root, top);
    char *s = malloc(buf.len + 1);
    if (!s) jlm_jj_fail(C, JLM_ENOMEM, "out of memory copying %zu bytes of output", buf.len);
    if (buf.len) memcpy(s, buf.p, buf.len);
    s[buf.len] = 0;
    *out = s;
    if (out_len) *out_len = buf.len;
    jlm_jj_arena_free(&C->arena);
    free(C);
    return 0;
}

int jlm_jinja_render_src(const char *src, size_t len, const json_t *vars, const jlm_jinja_opts *opts,
                         char **out, size_t *out_len, jlm_err *err)
{
    jlm_jinja *t;
    int rc = jlm_jinja_parse(src, len, &t, err);
    if (rc) return rc;
    rc = jlm_jinja_render(t, vars, opts, out, out_len, err);
    jlm_jinja_free(t);
    return rc;
}
