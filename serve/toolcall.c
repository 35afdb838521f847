/* toolcall.c - tool calls: families, parsing, grammar (contract in toolcall.h). */
#include "serve/toolcall.h"
#include "text/grammar/grammar.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- families */

const char *jlm_tc_family_name(jlm_tc_family f)
{
    static const char *const names[] = {"none", "hermes", "llama3", "mistral", "mistral-v11", "gpt-oss", "gemma",
                                         "granite"};
    return (unsigned)f < sizeof names / sizeof *names ? names[f] : "none";
}

static int has(const char *s, size_t len, const char *needle)
{
    return memmem(s, len, needle, strlen(needle)) != NULL;
}

jlm_tc_family jlm_tc_family_of(const char *tmpl, size_t len)
{
    if (!tmpl || !has(tmpl, len, "tool"))
        return JLM_TC_NONE;
    if (has(tmpl, len, "<|channel|>") && has(tmpl, len, "functions."))
        return JLM_TC_GPTOSS;
    if (has(tmpl, len, "<|tool_call|>"))
        return JLM_TC_GRANITE;
    if (has(tmpl, len, "[TOOL_CALLS]"))
        return has(tmpl, len, "[ARGS]") ? JLM_TC_MISTRAL_V11 : JLM_TC_MISTRAL;
    if (has(tmpl, len, "<|tool_call>") || has(tmpl, len, "tool_code"))
        return JLM_TC_GEMMA;
    if (has(tmpl, len, "<tool_call>"))
        return JLM_TC_HERMES;
    if (has(tmpl, len, "<|python_tag|>") || (has(tmpl, len, "<|start_header_id|>") && has(tmpl, len, "\"parameters\"")))
        return JLM_TC_LLAMA3;
    return JLM_TC_NONE;
}

/* Every text goes through an expression and every tag trims around it, so
 * the output is exactly what the expressions say (plain ChatML without tools). */
const char jlm_tc_chatml_tools[] =
    "{%- if tools -%}"
    "{{- '<|im_start|>system\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}"
    "{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\n' + tool | tojson -}}{%- endfor -%}"
    "{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if tools and loop.first and message.role == 'system' -%}"
    "{%- elif message.role == 'assistant' and message.tool_calls -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- if message.content -%}{{- message.content + '\n' -}}{%- endif -%}"
    "{%- for tc in message.tool_calls -%}"
    "{{- '<tool_call>\n{\"name\": ' + tc.function.name | tojson + ', \"arguments\": ' + tc.function.arguments | tojson"
    " + '}\n</tool_call>\n' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}";

/* ---------------------------------------------------------------- request fields */

static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-')
            return 0;
    return 1;
}

/* The parameters schema of a tool ({"type": "object"} when not given),
 * compiled to GBNF. */
static int params_gbnf(const json_t *tool, char **gbnf, jlm_err *err)
{
    const json_t *p = json_object_get(json_object_get(tool, "function"), "parameters");
    char *text = p ? json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("{\"type\":\"object\"}");
    if (!text)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    int rc = jlm_gram_from_schema(text, strlen(text), gbnf, err);
    free(text);
    return rc;
}

static int check_tool(const json_t *t, size_t i, const json_t *tools, jlm_err *err)
{
    const json_t *f = json_object_get(t, "function");
    if (!json_is_object(t) || !json_is_string(json_object_get(t, "type")) ||
        strcmp(json_string_value(json_object_get(t, "type")), "function"))
        return jlm_errf(err, JLM_EINVAL, "'tools[%zu]': expected {\"type\": \"function\", \"function\": {...}}", i);
    const json_t *name = json_object_get(f, "name"), *d = json_object_get(f, "description");
    const json_t *p = json_object_get(f, "parameters");
    if (!json_is_object(f) || !json_is_string(name) || !valid_name(json_string_value(name)))
        return jlm_errf(err, JLM_EINVAL, "'tools[%zu].function.name': expected 1 to 64 letters, digits, '_' or '-'", i);
    if (d && !json_is_string(d) && !json_is_null(d))
        return jlm_errf(err, JLM_EINVAL, "'tools[%zu].function.description': expected a string", i);
    if (p && !json_is_object(p))
        return jlm_errf(err, JLM_EINVAL, "'tools[%zu].function.parameters': expected a JSON Schema object", i);
    for (size_t k = 0; k < i; k++)
        if (!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(tools, k), "function"), "name")),
                    json_string_value(name)))
            return jlm_errf(err, JLM_EINVAL, "'tools[%zu].function.name': '%s' is given twice", i, json_string_value(name));
    return 0;
}

/* Each tool's schema through the converter: malformed ones are refused;
 * keywords it lacks only when the grammar is needed. */
static int check_schemas(const jlm_tc_req *r, jlm_err *err)
{
    size_t i;
    const json_t *t;
    json_array_foreach(r->tools, i, t) {
        const char *name = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (r->choice == JLM_TC_NAMED && strcmp(name, r->name))
            continue;
        char *g = NULL;
        jlm_err e = {0};
        int rc = params_gbnf(t, &g, &e);
        free(g);
        int need = r->choice == JLM_TC_REQUIRED || r->choice == JLM_TC_NAMED;
        if (rc && (rc != JLM_EUNSUPPORTED || need))
            return jlm_errf(err, rc, "'tools[%zu].function.parameters': %s", i, e.msg);
    }
    return 0;
}

static int get_choice(const json_t *body, jlm_tc_req *r, jlm_err *err)
{
    const json_t *c = json_object_get(body, "tool_choice");
    r->choice = JLM_TC_AUTO;
    if (!c || json_is_null(c))
        return 0;
    if (json_is_string(c)) {
        const char *s = json_string_value(c);
        if (!strcmp(s, "none")) r->choice = JLM_TC_OFF;
        else if (!strcmp(s, "required")) r->choice = JLM_TC_REQUIRED;
        else if (strcmp(s, "auto"))
            return jlm_errf(err, JLM_EINVAL, "'tool_choice': expected \"none\", \"auto\", \"required\" or a function");
        return 0;
    }
    const json_t *n = json_object_get(json_object_get(c, "function"), "name");
    if (!json_is_object(c) || !json_is_string(json_object_get(c, "type")) ||
        strcmp(json_string_value(json_object_get(c, "type")), "function") || !json_is_string(n))
        return jlm_errf(err, JLM_EINVAL, "'tool_choice': expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
    size_t i;
    const json_t *t;
    json_array_foreach(r->tools, i, t)
        if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), json_string_value(n))) {
            r->choice = JLM_TC_NAMED;
            r->name = strdup(json_string_value(n));
            return r->name ? 0 : jlm_errf(err, JLM_ENOMEM, "out of memory");
        }
    return jlm_errf(err, JLM_EINVAL, "'tool_choice.function.name': '%s' is not one of the tools", json_string_value(n));
}

int jlm_tc_req_parse(const json_t *body, jlm_tc_req *out, jlm_err *err)
{
    jlm_tc_req r = {0};
    const json_t *tools = json_object_get(body, "tools"), *c = json_object_get(body, "tool_choice");
    const json_t *par = json_object_get(body, "parallel_tool_calls");
    if (par && !json_is_null(par) && !json_is_boolean(par))
        return jlm_errf(err, JLM_EINVAL, "'parallel_tool_calls': expected true or false");
    if (!tools || json_is_null(tools) || (json_is_array(tools) && json_array_size(tools) == 0)) {
        if (c && !json_is_null(c) && !(json_is_string(c) && !strcmp(json_string_value(c), "none")))
            return jlm_errf(err, JLM_EINVAL, "'tool_choice': needs 'tools'");
        *out = r;
        return 0;
    }
    if (!json_is_array(tools))
        return jlm_errf(err, JLM_EINVAL, "'tools': expected an array of functions");
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        int rc = check_tool(t, i, tools, err);
        if (rc) return rc;
    }
    r.tools = (json_t *)tools;
    int rc = get_choice(body, &r, err);
    if (!rc) rc = check_schemas(&r, err);
    if (rc) {
        free(r.name);
        return rc;
    }
    r.tools = json_incref((json_t *)tools);
    *out = r;
    return 0;
}

void jlm_tc_req_free(jlm_tc_req *r)
{
    json_decref(r->tools);
    free(r->name);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- messages */

int jlm_tc_check_messages(const json_t *messages, jlm_err *err)
{
    size_t i, k;
    const json_t *m, *tc;
    json_array_foreach(messages, i, m) {
        const json_t *calls = json_object_get(m, "tool_calls"), *id = json_object_get(m, "tool_call_id");
        if (id && !json_is_string(id) && !json_is_null(id))
            return jlm_errf(err, JLM_EINVAL, "'messages[%zu].tool_call_id': expected a string", i);
        if (!calls || json_is_null(calls))
            continue;
        if (!json_is_array(calls))
            return jlm_errf(err, JLM_EINVAL, "'messages[%zu].tool_calls': expected an array", i);
        json_array_foreach(calls, k, tc) {
            const json_t *f = json_object_get(tc, "function"), *a = json_object_get(f, "arguments");
            if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")) ||
                !(json_is_string(a) || json_is_object(a)))
                return jlm_errf(err, JLM_EINVAL,
                                "'messages[%zu].tool_calls[%zu]': expected {\"function\": {\"name\", \"arguments\"}}", i, k);
        }
    }
    return 0;
}

json_t *jlm_tc_messages_for_template(const json_t *messages)
{
    json_t *out = json_deep_copy(messages), *m, *tc;
    size_t i, k;
    json_array_foreach(out, i, m)
        json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
            json_t *f = json_object_get(tc, "function"), *a = json_object_get(f, "arguments");
            if (!json_is_string(a))
                continue;
            json_t *o = json_loadb(json_string_value(a), json_string_length(a), 0, NULL);
            if (json_is_object(o))
                json_object_set(f, "arguments", o);
            json_decref(o);
        }
    return out;
}

/* ---------------------------------------------------------------- parsing */

/* A growing NUL-terminated string; oom sticks. */
typedef struct sbuf {
    char  *s;
    size_t n, cap;
    int    oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *t = realloc(b->s, cap);
        if (!t) { b->oom = 1; return; }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

typedef struct pstate {
    jlm_tc_family f;
    const char   *s;
    size_t        n;
    sbuf          content;
    json_t       *calls;
    uint64_t     *ids;
    int           oom;
} pstate;

static void keep(pstate *p, const char *s, size_t n)
{
    if (n) sb_put(&p->content, s, n);
}

static const char *find(const char *s, size_t n, size_t from, const char *needle)
{
    return from <= n ? memmem(s + from, n - from, needle, strlen(needle)) : NULL;
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && isspace((unsigned char)s[i])) i++;
    return i;
}

static void next_id(uint64_t *st, char out[10])
{
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int i = 0; i < 9; i++, z /= 62)
        out[i] = al[z % 62];
    out[9] = 0;
}

/* Adds a call of name[0, nlen) with args (an object; taken). */
static void add_call(pstate *p, const char *name, size_t nlen, json_t *args)
{
    char id[10];
    next_id(p->ids, id);
    char *a = args ? json_dumps(args, JSON_COMPACT) : NULL;
    json_decref(args);
    json_t *c = a ? json_pack("{s:s, s:s, s:{s:s%, s:s}}", "id", id, "type", "function", "function", "name", name, nlen,
                              "arguments", a)
                  : NULL;
    free(a);
    if (!c || json_array_append_new(p->calls, c))
        p->oom = 1;
}

/* A JSON value at s[i, n): the value (a new reference) and *end after it. */
static json_t *json_at(const char *s, size_t n, size_t i, size_t *end)
{
    json_error_t je;
    if (i >= n)
        return NULL;
    json_t *v = json_loadb(s + i, n - i, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (v)
        *end = i + (size_t)je.position;
    return v;
}

/* {"name": N, "arguments" | "parameters": {...}} -> a call; 0 if it is not one. */
static int object_call(pstate *p, const json_t *o)
{
    const json_t *name = json_object_get(o, "name"), *a = json_object_get(o, "arguments");
    if (!a) a = json_object_get(o, "parameters");
    if (json_is_string(a)) {
        json_t *x = json_loadb(json_string_value(a), json_string_length(a), 0, NULL);
        if (!json_is_object(x)) { json_decref(x); return 0; }
        if (!json_is_string(name)) { json_decref(x); return 0; }
        add_call(p, json_string_value(name), json_string_length(name), x);
        return 1;
    }
    if (!json_is_string(name) || json_string_length(name) == 0 || (a && !json_is_object(a)))
        return 0;
    add_call(p, json_string_value(name), json_string_length(name), a ? json_incref((json_t *)a) : json_object());
    return 1;
}

static void parse_hermes(pstate *p)
{
    size_t i = 0;
    const char *q;
    while ((q = find(p->s, p->n, i, "<tool_call>"))) {
        size_t at = (size_t)(q - p->s), b = at + 11, end;
        const char *c = find(p->s, p->n, b, "</tool_call>");
        size_t stop = c ? (size_t)(c - p->s) : p->n, after = c ? stop + 12 : p->n;
        json_t *o = json_at(p->s, stop, b, &end);
        keep(p, p->s + i, at - i);
        if (!json_is_object(o) || skip_ws(p->s, stop, end) != stop || !object_call(p, o))
            keep(p, p->s + at, after - at);
        json_decref(o);
        i = after;
    }
    keep(p, p->s + i, p->n - i);
}

static int starts(const char *s, size_t n, size_t i, const char *lit)
{
    size_t l = strlen(lit);
    return i + l <= n && !memcmp(s + i, lit, l);
}

/* Llama 3.x: the reply is one or more JSON calls (after an optional
 * <|python_tag|>), separated by ';' or whitespace; else it is content. */
static void parse_llama3(pstate *p)
{
    const char *tag = find(p->s, p->n, 0, "<|python_tag|>");
    size_t i = skip_ws(p->s, p->n, 0), first = i;
    if (tag) {
        first = (size_t)(tag - p->s);
        i = skip_ws(p->s, p->n, first + 14);
    }
    size_t before = json_array_size(p->calls);
    while (i < p->n && p->s[i] == '{') {
        size_t end;
        json_t *o = json_at(p->s, p->n, i, &end);
        int ok = json_is_object(o) && object_call(p, o);
        json_decref(o);
        if (!ok) break;
        i = skip_ws(p->s, p->n, end);
        if (i < p->n && p->s[i] == ';') i = skip_ws(p->s, p->n, i + 1);
    }
    if (json_array_size(p->calls) == before) {
        keep(p, p->s, p->n);
        return;
    }
    keep(p, p->s, first);
    keep(p, p->s + i, p->n - i);
}

/* After [TOOL_CALLS]: a JSON array of calls, or NAME[CALL_ID]id[ARGS]{...};
 * the end of what was read, or 0 when it is not a call. */
static size_t mistral_one(pstate *p, size_t i)
{
    size_t end;
    i = skip_ws(p->s, p->n, i);
    if (i < p->n && p->s[i] == '[') {
        json_t *a = json_at(p->s, p->n, i, &end), *o;
        size_t k;
        int ok = json_is_array(a) && json_array_size(a) > 0;
        json_array_foreach(a, k, o) if (ok) ok = object_call(p, o);
        json_decref(a);
        return ok ? end : 0;
    }
    const char *args = find(p->s, p->n, i, "[ARGS]");
    if (!args)
        return 0;
    size_t ae = (size_t)(args - p->s), ne = ae;
    const char *cid = find(p->s, ae, i, "[CALL_ID]");
    if (cid) ne = (size_t)(cid - p->s);
    while (ne > i && isspace((unsigned char)p->s[ne - 1])) ne--;
    for (size_t k = i; k < ne; k++)
        if (!isalnum((unsigned char)p->s[k]) && p->s[k] != '_' && p->s[k] != '-' && p->s[k] != '.')
            return 0;
    json_t *o = json_at(p->s, p->n, ae + 6, &end);
    if (ne == i || !json_is_object(o)) {
        json_decref(o);
        return 0;
    }
    add_call(p, p->s + i, ne - i, o);
    return end;
}

/* Mistral's [TOOL_CALLS] and Granite's <|tool_call|>, each followed by the
 * calls (mistral_one). */
static void parse_marked(pstate *p, const char *marker)
{
    size_t ml = strlen(marker);
    const char *q = find(p->s, p->n, 0, marker);
    if (!q) {
        keep(p, p->s, p->n);
        return;
    }
    size_t at = (size_t)(q - p->s), i = at, end;
    keep(p, p->s, at);
    while (starts(p->s, p->n, i, marker) && (end = mistral_one(p, i + ml)))
        i = skip_ws(p->s, p->n, end);
    if (i == at) {   /* not a call: all of it is content */
        keep(p, p->s + at, p->n - at);
        return;
    }
    if (starts(p->s, p->n, i, "</s>")) i += 4;
    if (starts(p->s, p->n, i, "<|end_of_text|>")) i += 15;
    keep(p, p->s + i, p->n - i);
}

/* gpt-oss harmony: messages "[<|start|>ROLE]<|channel|>CH[ to=functions.N][ <|constrain|>json]<|message|>BODY"
 * ended by <|end|>, <|call|>, <|return|> or the text's end. A body whose
 * header names a function is a call; the final channel (or a message
 * without a channel) is content; analysis is dropped. Text without any
 * <|message|> is content. */
static void parse_gptoss(pstate *p)
{
    if (!find(p->s, p->n, 0, "<|message|>")) {
        keep(p, p->s, p->n);
        return;
    }
    static const char *const ends[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
    size_t i = 0;
    while (i < p->n) {
        const char *m = find(p->s, p->n, i, "<|message|>");
        if (!m) {
            keep(p, p->s + i, p->n - i);
            return;
        }
        size_t h = i, he = (size_t)(m - p->s), b = he + 11, be = p->n, next = p->n;
        for (size_t k = 0; k < 4; k++) {
            const char *e = find(p->s, p->n, b, ends[k]);
            if (e && (size_t)(e - p->s) < be) {
                be = (size_t)(e - p->s);
                next = be + (k == 3 ? 0 : strlen(ends[k]));
            }
        }
        if (next == be && be < p->n) next = be + 9;   /* <|start|>: skip it, its header follows */
        const char *fn = find(p->s, he, h, "to=functions.");
        if (fn) {
            size_t ns = (size_t)(fn - p->s) + 13, ne = ns;
            while (ne < he && (isalnum((unsigned char)p->s[ne]) || p->s[ne] == '_' || p->s[ne] == '-' || p->s[ne] == '.'))
                ne++;
            size_t end;
            json_t *o = json_at(p->s, be, b, &end);
            if (ne > ns && json_is_object(o) && skip_ws(p->s, be, end) == be)
                add_call(p, p->s + ns, ne - ns, json_incref(o));
            else
                keep(p, p->s + b, be - b);
            json_decref(o);
        } else if (!find(p->s, he, h, "<|channel|>") || find(p->s, he, h, "<|channel|>final")) {
            keep(p, p->s + b, be - b);
        }
        i = next;
    }
}

/* Gemma's argument values: <|"|>text<|"|>, "text", 'text', numbers, true /
 * false / null (True / False / None), [a, b], {key: value} (key=value in
 * tool_code calls). NULL when s[*i] starts none. */
static json_t *gemma_value(const char *s, size_t n, size_t *i, int depth);

static json_t *gemma_string(const char *s, size_t n, size_t *i)
{
    const char *open = starts(s, n, *i, "<|\"|>") ? "<|\"|>" : s[*i] == '"' ? "\"" : "'";
    size_t ol = strlen(open), b = *i + ol, e = b;
    if (ol == 1) {
        char q = open[0];
        json_t *buf = NULL;
        char *t = malloc(n - b + 1);
        size_t k = 0;
        for (; t && e < n && s[e] != q; e++) {
            if (s[e] == '\\' && e + 1 < n) {
                char c = s[++e];
                t[k++] = c == 'n' ? '\n' : c == 't' ? '\t' : c;
            } else {
                t[k++] = s[e];
            }
        }
        if (t && e < n) {
            buf = json_stringn(t, k);
            *i = e + 1;
        }
        free(t);
        return buf;
    }
    const char *c = find(s, n, b, open);
    if (!c)
        return NULL;
    *i = (size_t)(c - s) + ol;
    return json_stringn(s + b, (size_t)(c - s) - b);
}

/* {key: value, ...} or (key=value, ...) at s[*i] (the opening char). */
static json_t *gemma_object(const char *s, size_t n, size_t *i, char close, char sep, int depth)
{
    json_t *o = json_object();
    size_t k = skip_ws(s, n, *i + 1);
    if (k < n && s[k] == close) {
        *i = k + 1;
        return o;
    }
    while (o && k < n) {
        size_t ks = k;
        json_t *key = NULL;
        if (starts(s, n, k, "<|\"|>") || s[k] == '"' || s[k] == '\'') {
            key = gemma_string(s, n, &k);
        } else {
            while (k < n && (isalnum((unsigned char)s[k]) || s[k] == '_' || s[k] == '-' || s[k] == '.')) k++;
            if (k > ks) key = json_stringn(s + ks, k - ks);
        }
        k = skip_ws(s, n, k);
        if (!key || k >= n || s[k] != sep) { json_decref(key); break; }
        k = skip_ws(s, n, k + 1);
        json_t *v = gemma_value(s, n, &k, depth + 1);
        if (!v || json_object_set_new(o, json_string_value(key), v)) { json_decref(key); break; }
        json_decref(key);
        k = skip_ws(s, n, k);
        if (k < n && s[k] == ',') { k = skip_ws(s, n, k + 1); continue; }
        if (k < n && s[k] == close) {
            *i = k + 1;
            return o;
        }
        break;
    }
    json_decref(o);
    return NULL;
}

static json_t *gemma_value(const char *s, size_t n, size_t *i, int depth)
{
    size_t k = skip_ws(s, n, *i);
    if (k >= n || depth > 64)
        return NULL;
    json_t *v = NULL;
    if (starts(s, n, k, "<|\"|>") || s[k] == '"' || s[k] == '\'') {
        v = gemma_string(s, n, &k);
    } else if (s[k] == '{') {
        v = gemma_object(s, n, &k, '}', ':', depth);
    } else if (s[k] == '[') {
        v = json_array();
        k = skip_ws(s, n, k + 1);
        if (k < n && s[k] == ']') { *i = k + 1; return v; }
        while (v) {
            json_t *e = gemma_value(s, n, &k, depth + 1);
            if (!e || json_array_append_new(v, e)) { json_decref(v); return NULL; }
            k = skip_ws(s, n, k);
            if (k < n && s[k] == ',') { k++; continue; }
            if (k < n && s[k] == ']') { k++; break; }
            json_decref(v);
            return NULL;
        }
    } else {
        static const char *const words[] = {"true", "false", "null", "True", "False", "None"};
        for (int w = 0; w < 6 && !v; w++)
            if (starts(s, n, k, words[w]) && !(k + strlen(words[w]) < n && isalnum((unsigned char)s[k + strlen(words[w])]))) {
                v = w % 3 == 0 ? json_true() : w % 3 == 1 ? json_false() : json_null();
                k += strlen(words[w]);
            }
        if (!v) {
            size_t e = k;
            while (e < n && (isdigit((unsigned char)s[e]) || strchr("+-.eE", s[e]))) e++;
            json_error_t je;
            if (e > k) v = json_loadb(s + k, e - k, JSON_DECODE_ANY, &je);
            if (v && !json_is_number(v)) { json_decref(v); v = NULL; }
            if (v) k = e;
        }
    }
    if (v) *i = k;
    return v;
}

/* <|tool_call>call:NAME{...}<tool_call|>: the end of the call, or 0. */
static size_t gemma_call(pstate *p, size_t i)
{
    size_t ns = i + 17, ne = ns;
    while (ne < p->n && (isalnum((unsigned char)p->s[ne]) || p->s[ne] == '_' || p->s[ne] == '-' || p->s[ne] == '.')) ne++;
    if (ne == ns || ne >= p->n || p->s[ne] != '{')
        return 0;
    size_t end = ne;
    json_t *a = json_at(p->s, p->n, ne, &end);
    if (!json_is_object(a)) {
        json_decref(a);
        end = ne;
        a = gemma_object(p->s, p->n, &end, '}', ':', 0);
    }
    if (!a)
        return 0;
    end = skip_ws(p->s, p->n, end);
    if (starts(p->s, p->n, end, "<tool_call|>"))
        end += 12;
    else if (end < p->n) {
        json_decref(a);
        return 0;
    }
    add_call(p, p->s + ns, ne - ns, a);
    return end;
}

/* ```tool_code\nNAME(key=value, ...)\n```: the end of the block, or 0. */
static size_t gemma_code(pstate *p, size_t i)
{
    size_t ns = skip_ws(p->s, p->n, i + 12), ne = ns, k;
    if (starts(p->s, p->n, ns, "print(")) ns = ne = ns + 6;
    while (ne < p->n && (isalnum((unsigned char)p->s[ne]) || p->s[ne] == '_' || p->s[ne] == '.')) ne++;
    if (ne == ns || ne >= p->n || p->s[ne] != '(')
        return 0;
    k = ne;
    json_t *a = gemma_object(p->s, p->n, &k, ')', '=', 0);
    if (!a)
        return 0;
    k = skip_ws(p->s, p->n, k);
    if (k < p->n && p->s[k] == ')') k = skip_ws(p->s, p->n, k + 1);   /* print(...)'s */
    if (!starts(p->s, p->n, k, "```")) {
        json_decref(a);
        return 0;
    }
    add_call(p, p->s + ns, ne - ns, a);
    return k + 3;
}

static void parse_gemma(pstate *p)
{
    size_t i = 0;
    for (;;) {
        const char *a = find(p->s, p->n, i, "<|tool_call>call:"), *b = find(p->s, p->n, i, "```tool_code");
        const char *q = a && (!b || a < b) ? a : b;
        if (!q)
            break;
        size_t at = (size_t)(q - p->s), end = q == a ? gemma_call(p, at) : gemma_code(p, at);
        keep(p, p->s + i, at - i);
        if (!end) {
            size_t l = q == a ? 17 : 12;
            keep(p, p->s + at, l);
            end = at + l;
        }
        i = end;
    }
    keep(p, p->s + i, p->n - i);
}

int jlm_tc_parse(jlm_tc_family f, const char *text, size_t len, uint64_t *id_state, jlm_tc_result *out, jlm_err *err)
{
    if (!text) text = "", len = 0;
    pstate p = {.f = f, .s = text, .n = len, .calls = json_array(), .ids = id_state};
    if (!p.calls)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    switch (f) {
    case JLM_TC_HERMES: parse_hermes(&p); break;
    case JLM_TC_LLAMA3: parse_llama3(&p); break;
    case JLM_TC_MISTRAL: case JLM_TC_MISTRAL_V11: parse_marked(&p, "[TOOL_CALLS]"); break;
    case JLM_TC_GRANITE: parse_marked(&p, "<|tool_call|>"); break;
    case JLM_TC_GPTOSS: parse_gptoss(&p); break;
    case JLM_TC_GEMMA: parse_gemma(&p); break;
    default: keep(&p, text, len); break;
    }
    sbuf *c = &p.content;
    if (!c->oom && !c->s) sb_put(c, "", 0);
    if (p.oom || c->oom) {
        free(c->s);
        json_decref(p.calls);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    size_t b = 0, e = c->n;
    if (json_array_size(p.calls)) {   /* around calls, whitespace is the model's layout */
        while (b < e && isspace((unsigned char)c->s[b])) b++;
        while (e > b && isspace((unsigned char)c->s[e - 1])) e--;
    }
    memmove(c->s, c->s + b, e - b);
    c->s[e - b] = 0;
    *out = (jlm_tc_result){.content = c->s, .content_len = e - b, .calls = p.calls};
    return 0;
}

void jlm_tc_result_free(jlm_tc_result *r)
{
    free(r->content);
    json_decref(r->calls);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- streaming */

/* The first place in s[0, n) where marker starts, or where a tail of s is a
 * proper prefix of it (when !final); n when neither. */
static size_t marker_at(const char *s, size_t n, const char *marker, int final)
{
    const char *q = find(s, n, 0, marker);
    if (q)
        return (size_t)(q - s);
    size_t ml = strlen(marker);
    for (size_t k = ml - 1 < n ? ml - 1 : n; !final && k > 0; k--)
        if (!memcmp(s + n - k, marker, k))
            return n - k;
    return n;
}

size_t jlm_tc_content_prefix(jlm_tc_family f, const char *text, size_t len, int final)
{
    static const char *const markers[][3] = {
        [JLM_TC_HERMES] = {"<tool_call>"},
        [JLM_TC_LLAMA3] = {"<|python_tag|>"},
        [JLM_TC_MISTRAL] = {"[TOOL_CALLS]"},
        [JLM_TC_MISTRAL_V11] = {"[TOOL_CALLS]"},
        [JLM_TC_GEMMA] = {"<|tool_call>", "```tool_code"},
        [JLM_TC_GRANITE] = {"<|tool_call|>"},
    };
    if (f == JLM_TC_NONE || (unsigned)f > JLM_TC_GRANITE || !text)
        return len;
    if (f == JLM_TC_GPTOSS)   /* channels decide what is content: only the whole reply says */
        return final ? len : 0;
    size_t safe = len;
    if (f == JLM_TC_LLAMA3) {   /* a reply that opens with '{' may be a call */
        size_t i = skip_ws(text, len, 0);
        if (i == len || text[i] == '{')
            return final ? len : 0;
    }
    for (int k = 0; k < 3 && markers[f][k]; k++) {
        size_t m = marker_at(text, len, markers[f][k], final);
        if (m < safe) safe = m;
    }
    while (!final && safe > 0 && isspace((unsigned char)text[safe - 1]))   /* may be the layout before a call */
        safe--;
    while (safe > 0 && safe < len && ((unsigned char)text[safe] & 0xC0) == 0x80)
        safe--;
    return safe;
}

json_t *jlm_tc_deltas(const json_t *calls, size_t piece)
{
    json_t *out = json_array();
    size_t i;
    const json_t *c;
    if (piece == 0) piece = 1;
    json_array_foreach(calls, i, c) {
        const json_t *f = json_object_get(c, "function");
        json_t *d = json_pack("{s:[{s:I, s:O, s:s, s:{s:O, s:s}}]}", "tool_calls", "index", (json_int_t)i, "id",
                              json_object_get(c, "id"), "type", "function", "function", "name", json_object_get(f, "name"),
                              "arguments", "");
        if (!out || !d || json_array_append_new(out, d)) {
            json_decref(out);
            return NULL;
        }
        const char *a = json_string_value(json_object_get(f, "arguments"));
        size_t n = json_string_length(json_object_get(f, "arguments"));
        for (size_t k = 0; k < n;) {
            size_t e = k + piece < n ? k + piece : n;
            while (e < n && ((unsigned char)a[e] & 0xC0) == 0x80) e++;
            json_t *x = json_pack("{s:[{s:I, s:{s:s%}}]}", "tool_calls", "index", (json_int_t)i, "function", "arguments",
                                  a + k, e - k);
            if (!x || json_array_append_new(out, x)) {
                json_decref(out);
                return NULL;
            }
            k = e;
        }
    }
    return out;
}

/* ---------------------------------------------------------------- grammar */


/* Appends GBNF g with every rule name prefixed by pre (literals, classes
 * and comments copied as they are). */
static void sb_prefixed(sbuf *b, const char *g, const char *pre)
{
    size_t n = strlen(g);
    for (size_t i = 0; i < n;) {
        char c = g[i];
        size_t j = i + 1;
        if (c == '"' || c == '[') {
            char close = c == '"' ? '"' : ']';
            while (j < n && g[j] != close) j += g[j] == '\\' ? 2 : 1;
            if (j < n) j++;
        } else if (c == '#') {
            while (j < n && g[j] != '\n') j++;
        } else if (isalpha((unsigned char)c) || c == '_') {
            while (j < n && (isalnum((unsigned char)g[j]) || g[j] == '-' || g[j] == '_')) j++;
            sb_str(b, pre);
        }
        if (j > n) j = n;
        sb_put(b, g + i, j - i);
        i = j;
    }
}

/* The syntax around one call's name and arguments rule, per family. */
static void call_rule(sbuf *b, jlm_tc_family f, const char *name, const char *args)
{
    char line[256];
    switch (f) {
    case JLM_TC_MISTRAL_V11:
        snprintf(line, sizeof line, "\"%s[ARGS]\" %s", name, args);
        break;
    case JLM_TC_GPTOSS:
        snprintf(line, sizeof line, "\"%s <|constrain|>json<|message|>\" %s", name, args);
        break;
    case JLM_TC_GEMMA:
        snprintf(line, sizeof line, "\"%s\" %s", name, args);
        break;
    default:
        snprintf(line, sizeof line, "\"{\\\"name\\\": \\\"%s\\\", \\\"%s\\\": \" %s \"}\"", name,
                 f == JLM_TC_LLAMA3 ? "parameters" : "arguments", args);
        break;
    }
    sb_str(b, line);
}

int jlm_tc_grammar(jlm_tc_family f, const jlm_tc_req *r, char **gbnf, jlm_err *err)
{
    static const char *const around[][2] = {
        [JLM_TC_HERMES] = {"\"<tool_call>\\n\"", "\"\\n</tool_call>\""},
        [JLM_TC_LLAMA3] = {"", ""},
        [JLM_TC_MISTRAL] = {"\"[TOOL_CALLS][\"", "\"]\""},
        [JLM_TC_MISTRAL_V11] = {"\"[TOOL_CALLS]\"", ""},
        [JLM_TC_GPTOSS] = {"\"<|channel|>commentary to=functions.\"", ""},
        [JLM_TC_GEMMA] = {"\"<|tool_call>call:\"", "\"<tool_call|>\""},
        [JLM_TC_GRANITE] = {"\"<|tool_call|>[\"", "\"]\""},
    };
    if (f == JLM_TC_NONE || (unsigned)f > JLM_TC_GRANITE)
        return jlm_errf(err, JLM_EUNSUPPORTED, "'tool_choice': the model's chat template renders no tools");
    sbuf calls = {0}, rules = {0};
    size_t i;
    const json_t *t;
    int rc = 0, n = 0;
    json_array_foreach(r->tools, i, t) {
        const char *name = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (r->choice == JLM_TC_NAMED && strcmp(name, r->name))
            continue;
        char *g = NULL, pre[32], args[48];
        if ((rc = params_gbnf(t, &g, err))) {
            jlm_err_prefix(err, rc, "'tools[%zu].function.parameters'", i);
            break;
        }
        snprintf(pre, sizeof pre, "t%zu-", i);
        snprintf(args, sizeof args, "t%zu-root", i);
        sb_prefixed(&rules, g, pre);
        free(g);
        if (n++) sb_str(&calls, " | ");
        call_rule(&calls, f, name, args);
    }
    sbuf out = {0};
    if (!rc) {
        sb_str(&out, "root ::= ");
        sb_str(&out, around[f][0]);
        sb_str(&out, " tc-call ");
        sb_str(&out, around[f][1]);
        sb_str(&out, "\ntc-call ::= ");
        sb_put(&out, calls.s ? calls.s : "", calls.n);
        sb_str(&out, "\n");
        sb_put(&out, rules.s ? rules.s : "", rules.n);
    }
    int oom = calls.oom || rules.oom || out.oom;
    free(calls.s);
    free(rules.s);
    if (!rc && oom) rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
    if (!rc && n == 0) rc = jlm_errf(err, JLM_EINVAL, "'tool_choice': no tool to call");
    if (rc) {
        free(out.s);
        return rc;
    }
    *gbnf = out.s;
    return 0;
}
