/* chat.c - llama.cpp-compatible chat template rendering (see chat.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/template/chat.h"
#include "text/template/jinja.h"
#include "format/jlm_format.h"

#define SYS_NEEDLE  "<System Needle>"
#define USER_NEEDLE "<User Needle>"

/* ================================================================ variables */
static void set_date(json_t *vars, const char *key, const char *fmt, time_t now, int local)
{
    struct tm tm;
    char s[64];
    if (local) localtime_r(&now, &tm); else gmtime_r(&now, &tm);
    size_t n = strftime(s, sizeof s, fmt, &tm);
    json_object_set_new(vars, key, json_stringn(s, n));
}

static json_t *build_vars(const json_t *messages, const jlm_chat_opts *o, int add_gen, time_t now)
{
    json_t *v = json_object();
    if (!v) return NULL;
    json_object_set(v, "messages", (json_t *)messages);
    json_object_set_new(v, "bos_token", json_string(o && o->bos_token ? o->bos_token : ""));
    json_object_set_new(v, "eos_token", json_string(o && o->eos_token ? o->eos_token : ""));
    if (add_gen) json_object_set_new(v, "add_generation_prompt", json_true());   /* undefined when false */
    json_object_set_new(v, "enable_thinking", json_boolean(!(o && o->disable_thinking)));
    if (o && o->tools) json_object_set(v, "tools", (json_t *)o->tools);
    set_date(v, "datetime", "%b %d %Y", now, o && o->local_time);
    set_date(v, "date_string", "%d %b %Y", now, o && o->local_time);
    return v;
}

static int render(const jlm_jinja *t, const json_t *messages, const jlm_chat_opts *o, int add_gen, time_t now,
                  char **out, size_t *out_len, jlm_err *err)
{
    json_t *vars = build_vars(messages, o, add_gen, now);
    if (!vars) return jlm_errf(err, JLM_ENOMEM, "template: out of memory building variables");
    jlm_jinja_opts jo = {.now = now, .local_time = o && o->local_time};
    if (o) {
        jo.max_steps = o->max_steps;
        jo.cancelled = o->cancelled;
        jo.cancel_arg = o->cancel_arg;
    }
    int rc = jlm_jinja_render(t, vars, &jo, out, out_len, err);
    json_decref(vars);
    return rc;
}

/* ================================================================ capability probes */
static json_t *msg(const char *role, const char *content, int typed)
{
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string(role));
    if (typed) json_object_set_new(m, "content", json_pack("[{s:s, s:s}]", "type", "text", "text", content));
    else json_object_set_new(m, "content", json_string(content));
    return m;
}

typedef struct caps { int typed_content, system_role, rc; } caps;   /* rc: a probe hit a bound or was cancelled */

/* Renders the probe conversation (add_generation_prompt false); 1 if the
 * output contains needle, 0 if not or if the template raised. A bound of the
 * interpreter (JLM_ERANGE) or a cancel (JLM_EIO) ends the probing: c->rc
 * and err get it, and the later probes do not run. */
static int probe(const jlm_jinja *t, json_t *msgs, const jlm_chat_opts *o, time_t now, const char *needle, caps *c,
                 jlm_err *err)
{
    char *out = NULL;
    size_t n;
    int found = 0;
    jlm_err e = {0};
    int rc = msgs && !c->rc ? render(t, msgs, o, 0, now, &out, &n, &e) : -1;
    if (!rc) found = strstr(out, needle) != NULL;
    else if (rc == JLM_ERANGE || rc == JLM_EIO) c->rc = jlm_errf(err, rc, "%s", e.msg);
    free(out);
    json_decref(msgs);
    return found;
}

static caps detect_caps(const jlm_jinja *t, const jlm_chat_opts *o, time_t now, jlm_err *err)
{
    caps c = {0};
    c.typed_content = !probe(t, json_pack("[o]", msg("user", USER_NEEDLE, 0)), o, now, USER_NEEDLE, &c, err) &&
                      probe(t, json_pack("[o]", msg("user", USER_NEEDLE, 1)), o, now, USER_NEEDLE, &c, err);
    c.system_role = probe(t, json_pack("[o,o]", msg("system", SYS_NEEDLE, c.typed_content),
                                       msg("user", "Hey", c.typed_content)), o, now, SYS_NEEDLE, &c, err);
    return c;
}

/* ================================================================ polyfills */
static void add_message(json_t *arr, json_t *m, int typed)
{
    json_t *c = json_object_get(m, "content");
    if (typed && json_is_string(c)) {
        json_t *copy = json_copy(m);
        json_object_set_new(copy, "content", json_pack("[{s:s, s:O}]", "type", "text", "text", c));
        json_array_append_new(arr, copy);
    } else json_array_append(arr, m);
}

static char *join2(const char *a, const char *sep, const char *b)
{
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = malloc(la + ls + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, sep, ls);
    memcpy(s + la + ls, b, lb + 1);
    return s;
}

/* llama.cpp b10359's message workarounds (common/chat.cpp, namespace
 * workaround), in its order:
 *  - developer -> system, unless the template is gpt-oss's ("<|channel|>");
 *  - without a system role, a FIRST system message is merged into the next
 *    message (whatever its role) as system + "\n" + content, or dropped when
 *    it is the only message; later system messages are left as they are;
 *  - string contents become [{type: text, text}] when the template needs
 *    typed content. */
static json_t *adjust_messages(const json_t *in, caps c, int gpt_oss)
{
    json_t *msgs = json_deep_copy(in);
    if (!msgs) return NULL;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!gpt_oss && role && !strcmp(role, "developer"))
            json_object_set_new(m, "role", json_string("system"));
    }
    json_t *first = json_array_get(msgs, 0);
    const char *role0 = json_string_value(json_object_get(first, "role"));
    if (!c.system_role && role0 && !strcmp(role0, "system")) {
        json_t *second = json_array_get(msgs, 1);
        const char *a = json_string_value(json_object_get(first, "content"));
        const char *b = json_string_value(json_object_get(second, "content"));
        if (second && a && b) {
            char *merged = join2(a, "\n", b);
            json_object_set_new(second, "content", json_string(merged ? merged : ""));
            free(merged);
        }
        json_array_remove(msgs, 0);
    }
    json_t *arr = json_array();
    json_array_foreach(msgs, i, m)
        add_message(arr, m, c.typed_content);
    json_decref(msgs);
    return arr;
}

/* ================================================================ entry points */
static int check_messages(const json_t *messages, jlm_err *err)
{
    if (!json_is_array(messages)) return jlm_errf(err, JLM_EINVAL, "chat: messages must be a JSON array");
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m)
        if (!json_is_object(m)) return jlm_errf(err, JLM_EINVAL, "chat: message %zu is not an object", i);
    return 0;
}

int jlm_chat_render_json(const char *template_src, size_t len, const json_t *messages,
                         const jlm_chat_opts *opts, int adjust, char **out, size_t *out_len, jlm_err *err)
{
    int rc = check_messages(messages, err);
    if (rc) return rc;
    jlm_jinja *t;
    if ((rc = jlm_jinja_parse(template_src, len, &t, err))) return rc;
    time_t now = opts && opts->now ? opts->now : time(NULL);
    int add_gen = opts && opts->add_generation_prompt;
    char *s = NULL;
    size_t n = 0;
    if (!adjust) {
        rc = render(t, messages, opts, add_gen, now, &s, &n, err);
    } else {
        caps c = detect_caps(t, opts, now, err);
        json_t *adj = c.rc ? NULL : adjust_messages(messages, c, memmem(template_src, len, "<|channel|>", 11) != NULL);
        rc = c.rc ? c.rc
           : adj  ? render(t, adj, opts, add_gen, now, &s, &n, err)
                  : jlm_errf(err, JLM_ENOMEM, "chat: out of memory adjusting messages");
        json_decref(adj);
        /* llama.cpp gpt-oss handler (issue 15417): end the last turn with <|end|>. */
        if (!rc && !add_gen && memmem(template_src, len, "<|channel|>", 11)) {
            char *last = NULL;
            for (char *p = s; (p = strstr(p, "<|return|>")); p++) last = p;
            if (last) {
                memcpy(last, "<|end|>", 7);
                memmove(last + 7, last + 10, n - (size_t)(last + 10 - s) + 1);
                n -= 3;
            }
        }
    }
    jlm_jinja_free(t);
    if (rc) return rc;
    *out = s;
    if (out_len) *out_len = n;
    return 0;
}

int jlm_chat_render(const char *template_src, size_t len, const jlm_chat_msg *msgs, size_t n,
                    const jlm_chat_opts *opts, char **out, size_t *out_len, jlm_err *err)
{
    json_t *arr = json_array();
    if (!arr) return jlm_errf(err, JLM_ENOMEM, "chat: out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_pack("{s:s, s:s}", "role", msgs[i].role ? msgs[i].role : "",
                              "content", msgs[i].content ? msgs[i].content : "");
        if (!m || json_array_append_new(arr, m)) {
            json_decref(arr);
            return jlm_errf(err, JLM_EINVAL, "chat: message %zu: role/content not valid UTF-8", i);
        }
    }
    int rc = jlm_chat_render_json(template_src, len, arr, opts, 1, out, out_len, err);
    json_decref(arr);
    return rc;
}

int jlm_chat_template_from_vocab(const jlm_vocab *v, const char *name, char **tmpl, char **bos, char **eos,
                                 jlm_err *err)
{
    const jlm_str *body = NULL;
    for (uint32_t i = 0; i < v->n_templates; i++)
        if (v->templates[2 * i].len == 0) { body = &v->templates[2 * i + 1]; break; }
    if (!body)
        return jlm_errf(err, JLM_ENOTFOUND, "%s: no default chat template in the vocab (%u named templates)",
                        name, v->n_templates);
    const jlm_str *b = v->bos >= 0 && (uint32_t)v->bos < v->n_tokens ? &v->tokens[v->bos] : NULL;
    const jlm_str *e = v->eos >= 0 && (uint32_t)v->eos < v->n_tokens ? &v->tokens[v->eos] : NULL;
    char *t = strndup(body->s, body->len);
    char *bs = b ? strndup(b->s, b->len) : strdup("");
    char *es = e ? strndup(e->s, e->len) : strdup("");
    if (!t || !bs || !es) {
        free(t);
        free(bs);
        free(es);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory copying the chat template", name);
    }
    *tmpl = t;
    *bos = bs;
    *eos = es;
    return 0;
}

int jlm_chat_template_from_model(const char *path, char **tmpl, char **bos, char **eos, jlm_err *err)
{
    jlm_model *m;
    int rc = jlm_fmt_open(path, &m, err);
    if (rc)
        return rc;
    rc = jlm_chat_template_from_vocab(&m->vocab, path, tmpl, bos, eos, err);
    jlm_fmt_close(m);
    return rc;
}
