/* schema.c - JSON Schema -> GBNF text. Each schema node becomes one rule (or
 * a shared primitive); objects list their properties in the schema's order,
 * optional ones present or absent, through two chains of rules (before and
 * after the first member written) so commas stay right without exponential
 * growth. Whitespace is one optional space after '{', '[', ':' and ','. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar.h"

#define SCHEMA_MAX_DEPTH 64

typedef struct sb { char *s; size_t n, cap; int oom; } sb;

static void sb_add(sb *b, const char *t, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        while (nc < b->n + n + 1) nc *= 2;
        char *ns = realloc(b->s, nc);
        if (!ns) { b->oom = 1; return; }
        b->s = ns;
        b->cap = nc;
    }
    memcpy(b->s + b->n, t, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_f(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_f(sb *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = 1; return; }
    if ((size_t)n < sizeof tmp) { sb_add(b, tmp, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}

/* text as a GBNF literal, quotes included */
static void sb_lit(sb *b, const char *t, size_t n)
{
    sb_add(b, "\"", 1);
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)t[k];
        if (c == '"') sb_add(b, "\\\"", 2);
        else if (c == '\\') sb_add(b, "\\\\", 2);
        else if (c < 0x20 || c == 0x7F) sb_f(b, "\\x%02X", c);
        else sb_add(b, (const char *)&c, 1);
    }
    sb_add(b, "\"", 1);
}

typedef struct conv {
    sb        out;       /* the rules written so far */
    json_t   *root;
    json_t   *refs;      /* ref string -> rule name */
    unsigned  next;
    jlm_err  *err;
} conv;

typedef char rname[24];

/* The primitives, written once at the end. */
static const char PRIMS[] =
    "ws ::= \" \"?\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1F\\x7F\\uD800-\\uDFFF] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" hex4)\n"
    "hex4 ::= [1-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | \"0\" ([1-9a-fA-F] [0-9a-fA-F]{2} | \"0\" ([1-9a-fA-F] [0-9a-fA-F] | \"0\" [1-9a-fA-F]))\n"
    "int-part ::= [0-9] | [1-9] [0-9]{1,15}\n"
    "integer ::= \"-\"? int-part\n"
    "number ::= \"-\"? int-part (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws (string \":\" ws value (\",\" ws string \":\" ws value)*)? \"}\"\n"
    "array ::= \"[\" ws (value (\",\" ws value)*)? \"]\"\n"
    "date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])\n"
    "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{3})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "date-time ::= date \"T\" time\n"
    "uuid ::= [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}\n";

static int fail(conv *c, int code, const char *path, const char *fmt, const char *arg)
{
    char why[256];
    snprintf(why, sizeof why, fmt, arg);
    return jlm_errf(c->err, code, "json_schema: %s%s%s", why, *path ? " at " : "", path);
}

static void fresh(conv *c, rname n) { snprintf(n, sizeof(rname), "r%u", c->next++); }

static int node(conv *c, json_t *s, const char *path, int depth, rname out);

static const char *const KNOWN[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions",
    "format", "title", "description", "$schema", "$id", "$comment", "default", "examples",
    "deprecated", "readOnly", "writeOnly", NULL};

static int check_keywords(conv *c, json_t *s, const char *path)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        int ok = 0;
        for (int i = 0; KNOWN[i] && !ok; i++) ok = !strcmp(k, KNOWN[i]);
        if (!ok) return fail(c, JLM_EUNSUPPORTED, path, "keyword '%s' is not supported", k);
    }
    return 0;
}

static int count_kw(conv *c, json_t *s, const char *kw, const char *path, long *v)
{
    json_t *x = json_object_get(s, kw);
    if (!x) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > JLM_GRAM_MAX_REPEAT)
        return fail(c, JLM_EUNSUPPORTED, path, "'%s' must be an integer in [0, 1000]", kw);
    *v = (long)json_integer_value(x);
    return 0;
}

static void sub(char *dst, size_t cap, const char *path, const char *a, const char *b)
{
    snprintf(dst, cap, "%s/%s%s%s", path, a, b ? "/" : "", b ? b : "");
}

/* A literal rule for a JSON value (enum member, const). */
static int lit_value(conv *c, sb *body, json_t *v)
{
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!t) return jlm_errf(c->err, JLM_ENOMEM, "json_schema: out of memory");
    sb_lit(body, t, strlen(t));
    free(t);
    return 0;
}

static int object_rule(conv *c, json_t *s, const char *path, int depth, sb *body)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, JLM_EFORMAT, path, "'%s' must be an object", "properties");
    if (req && !json_is_array(req)) return fail(c, JLM_EFORMAT, path, "'%s' must be an array", "required");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(c, JLM_EFORMAT, path, "'%s' must be a boolean or a schema", "additionalProperties");
    size_t np = props ? json_object_size(props) : 0;
    for (size_t k = 0; req && k < json_array_size(req); k++) {
        json_t *r = json_array_get(req, k);
        if (!json_is_string(r)) return fail(c, JLM_EFORMAT, path, "'%s' must list strings", "required");
        if (!props || !json_object_get(props, json_string_value(r)))
            return fail(c, JLM_EUNSUPPORTED, path, "required property '%s' is not in 'properties'", json_string_value(r));
    }
    if (!np) {
        if (addl && json_is_false(addl)) { sb_add(body, "\"{\" ws \"}\"", 10); return 0; }
        rname v = "value";
        if (addl && json_is_object(addl)) {
            char p[1024];
            sub(p, sizeof p, path, "additionalProperties", NULL);
            int rc = node(c, addl, p, depth + 1, v);
            if (rc) return rc;
        }
        sb_f(body, "\"{\" ws (string \":\" ws %s (\",\" ws string \":\" ws %s)*)? \"}\"", v, v);
        return 0;
    }
    if (addl && !json_is_false(addl))
        return fail(c, JLM_EUNSUPPORTED, path, "'%s' other than false beside 'properties' is not supported", "additionalProperties");
    /* kv_i, then first_i / after_i from the last property back */
    rname *kv = calloc(np, sizeof *kv);
    int *need = calloc(np, sizeof *need);
    if (!kv || !need) {
        free(kv);
        free(need);
        return jlm_errf(c->err, JLM_ENOMEM, "json_schema: out of memory");
    }
    int rc = 0;
    size_t i = 0;
    const char *key;
    json_t *ps;
    json_object_foreach(props, key, ps) {
        char p[1024];
        sub(p, sizeof p, path, "properties", key);
        rname v;
        if ((rc = node(c, ps, p, depth + 1, v))) break;
        for (size_t k = 0; req && k < json_array_size(req); k++)
            if (!strcmp(json_string_value(json_array_get(req, k)), key)) need[i] = 1;
        fresh(c, kv[i]);
        sb_f(&c->out, "%s ::= ", kv[i]);
        json_t *ks = json_string(key);
        rc = ks ? lit_value(c, &c->out, ks) : jlm_errf(c->err, JLM_ENOMEM, "json_schema: out of memory");
        json_decref(ks);
        if (rc) break;
        sb_f(&c->out, " \":\" ws %s\n", v);
        i++;
    }
    if (!rc) {
        rname first_next = "", after_next = "";
        for (size_t k = np; k-- > 0;) {
            rname f, a;
            fresh(c, f);
            fresh(c, a);
            const char *an = after_next[0] ? after_next : "\"\"", *fn = first_next[0] ? first_next : "\"\"";
            sb_f(&c->out, "%s ::= \",\" ws %s %s", a, kv[k], after_next);
            if (!need[k]) sb_f(&c->out, " | %s", an);
            sb_f(&c->out, "\n%s ::= %s %s", f, kv[k], after_next);
            if (!need[k]) sb_f(&c->out, " | %s", fn);
            sb_add(&c->out, "\n", 1);
            memcpy(first_next, f, sizeof f);
            memcpy(after_next, a, sizeof a);
        }
        sb_f(body, "\"{\" ws %s \"}\"", first_next);
    }
    free(kv);
    free(need);
    return rc;
}

static int array_rule(conv *c, json_t *s, const char *path, int depth, sb *body)
{
    json_t *items = json_object_get(s, "items");
    long mn = 0, mx = -1;
    int rc;
    if ((rc = count_kw(c, s, "minItems", path, &mn)) || (rc = count_kw(c, s, "maxItems", path, &mx))) return rc;
    if (mx >= 0 && mx < mn) return fail(c, JLM_EUNSUPPORTED, path, "'%s' below minItems", "maxItems");
    rname it = "value";
    if (items) {
        if (!json_is_object(items)) return fail(c, JLM_EUNSUPPORTED, path, "'%s' must be one schema", "items");
        char p[1024];
        sub(p, sizeof p, path, "items", NULL);
        if ((rc = node(c, items, p, depth + 1, it))) return rc;
    }
    if (mx == 0) sb_add(body, "\"[\" ws \"]\"", 10);
    else if (mn == 0 && mx < 0) sb_f(body, "\"[\" ws (%s (\",\" ws %s)*)? \"]\"", it, it);
    else if (mn == 0) sb_f(body, "\"[\" ws (%s (\",\" ws %s){0,%ld})? \"]\"", it, it, mx - 1);
    else if (mx < 0) sb_f(body, "\"[\" ws %s (\",\" ws %s){%ld,} \"]\"", it, it, mn - 1);
    else sb_f(body, "\"[\" ws %s (\",\" ws %s){%ld,%ld} \"]\"", it, it, mn - 1, mx - 1);
    return 0;
}

static int string_rule(conv *c, json_t *s, const char *path, sb *body)
{
    json_t *f = json_object_get(s, "format");
    long mn = 0, mx = -1;
    int rc;
    if ((rc = count_kw(c, s, "minLength", path, &mn)) || (rc = count_kw(c, s, "maxLength", path, &mx))) return rc;
    if (mx >= 0 && mx < mn) return fail(c, JLM_EUNSUPPORTED, path, "'%s' below minLength", "maxLength");
    if (f) {
        const char *fv = json_string_value(f);
        if (!fv || (strcmp(fv, "date") && strcmp(fv, "time") && strcmp(fv, "date-time") && strcmp(fv, "uuid")))
            return fail(c, JLM_EUNSUPPORTED, path, "format '%s' is not supported (date, time, date-time, uuid are)",
                        fv ? fv : "?");
        if (mn || mx >= 0) return fail(c, JLM_EUNSUPPORTED, path, "%s beside format is not supported", "minLength/maxLength");
        sb_f(body, "\"\\\"\" %s \"\\\"\"", fv);
        return 0;
    }
    if (!mn && mx < 0) sb_add(body, "string", 6);
    else if (mx < 0) sb_f(body, "\"\\\"\" char{%ld,} \"\\\"\"", mn);
    else sb_f(body, "\"\\\"\" char{%ld,%ld} \"\\\"\"", mn, mx);
    return 0;
}

/* The body for one type name. */
static int typed(conv *c, json_t *s, const char *t, const char *path, int depth, sb *body)
{
    if (!strcmp(t, "object")) return object_rule(c, s, path, depth, body);
    if (!strcmp(t, "array")) return array_rule(c, s, path, depth, body);
    if (!strcmp(t, "string")) return string_rule(c, s, path, body);
    if (!strcmp(t, "number") || !strcmp(t, "integer") || !strcmp(t, "boolean") || !strcmp(t, "null")) {
        sb_add(body, t, strlen(t));
        return 0;
    }
    return fail(c, JLM_EUNSUPPORTED, path, "type '%s' is not a JSON Schema type", t);
}

static int ref_rule(conv *c, const char *ref, const char *path, rname out)
{
    json_t *have = json_object_get(c->refs, ref);
    if (have) {
        snprintf(out, sizeof(rname), "%s", json_string_value(have));
        return 0;
    }
    json_t *target = NULL;
    if (!strcmp(ref, "#")) target = c->root;
    else if (!strncmp(ref, "#/$defs/", 8)) target = json_object_get(json_object_get(c->root, "$defs"), ref + 8);
    else if (!strncmp(ref, "#/definitions/", 14)) target = json_object_get(json_object_get(c->root, "definitions"), ref + 14);
    if (!target) return fail(c, JLM_EUNSUPPORTED, path, "$ref '%s' does not name #, #/$defs/NAME or #/definitions/NAME", ref);
    fresh(c, out);
    json_t *nm = json_string(out);
    if (!nm || json_object_set_new(c->refs, ref, nm)) return jlm_errf(c->err, JLM_ENOMEM, "json_schema: out of memory");
    rname inner;
    int rc = node(c, target, ref, 1, inner);
    if (!rc) sb_f(&c->out, "%s ::= %s\n", out, inner);
    return rc;
}

/* Converts schema s; out gets the name of the rule that matches it. */
static int node(conv *c, json_t *s, const char *path, int depth, rname out)
{
    if (depth > SCHEMA_MAX_DEPTH) return fail(c, JLM_EUNSUPPORTED, path, "schema nested deeper than %s", "64");
    if (json_is_true(s)) { snprintf(out, sizeof(rname), "value"); return 0; }
    if (!json_is_object(s)) return fail(c, JLM_EFORMAT, path, "%s", "a schema must be an object or true");
    int rc = check_keywords(c, s, path);
    if (rc) return rc;
    json_t *t = json_object_get(s, "type"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    json_t *any = json_object_get(s, "anyOf");
    const char *anykw = "anyOf";
    if (!any) { any = json_object_get(s, "oneOf"); anykw = "oneOf"; }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return fail(c, JLM_EFORMAT, path, "'%s' must be a string", "$ref");
        return ref_rule(c, json_string_value(ref), path, out);
    }
    sb body = {0};
    if (cn) {
        rc = lit_value(c, &body, cn);
    } else if (en) {
        if (!json_is_array(en) || !json_array_size(en)) rc = fail(c, JLM_EFORMAT, path, "'%s' must be a non-empty array", "enum");
        for (size_t k = 0; !rc && k < json_array_size(en); k++) {
            if (k) sb_add(&body, " | ", 3);
            rc = lit_value(c, &body, json_array_get(en, k));
        }
    } else if (any) {
        if (!json_is_array(any) || !json_array_size(any)) rc = fail(c, JLM_EFORMAT, path, "'%s' must be a non-empty array", anykw);
        for (size_t k = 0; !rc && k < json_array_size(any); k++) {
            char p[1024], idx[24];
            snprintf(idx, sizeof idx, "%zu", k);
            sub(p, sizeof p, path, anykw, idx);
            rname alt;
            if ((rc = node(c, json_array_get(any, k), p, depth + 1, alt))) break;
            if (k) sb_add(&body, " | ", 3);
            sb_add(&body, alt, strlen(alt));
        }
    } else if (json_is_string(t)) {
        rc = typed(c, s, json_string_value(t), path, depth, &body);
    } else if (json_is_array(t)) {
        if (!json_array_size(t)) rc = fail(c, JLM_EFORMAT, path, "'%s' must not be empty", "type");
        for (size_t k = 0; !rc && k < json_array_size(t); k++) {
            const char *tn = json_string_value(json_array_get(t, k));
            if (!tn) { rc = fail(c, JLM_EFORMAT, path, "'%s' must list strings", "type"); break; }
            if (k) sb_add(&body, " | ", 3);
            sb_add(&body, "(", 1);
            rc = typed(c, s, tn, path, depth, &body);
            sb_add(&body, ")", 1);
        }
    } else if (t) {
        rc = fail(c, JLM_EFORMAT, path, "'%s' must be a string or an array", "type");
    } else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties")) {
        rc = typed(c, s, "object", path, depth, &body);
    } else if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems")) {
        rc = typed(c, s, "array", path, depth, &body);
    } else if (json_object_get(s, "format") || json_object_get(s, "minLength") || json_object_get(s, "maxLength")) {
        rc = typed(c, s, "string", path, depth, &body);
    } else {
        sb_add(&body, "value", 5);
    }
    if (!rc && body.oom) rc = jlm_errf(c->err, JLM_ENOMEM, "json_schema: out of memory");
    if (!rc) {
        fresh(c, out);
        sb_f(&c->out, "%s ::= %s\n", out, body.s);
    }
    free(body.s);
    return rc;
}

int jlm_gram_from_schema(const char *schema, size_t len, char **gbnf, jlm_err *err)
{
    conv c = {.err = err};
    int rc = 0;
    if (!schema) {
        sb_add(&c.out, "root ::= object\n", 16);
    } else {
        json_error_t je;
        c.root = json_loadb(schema, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
        if (!c.root) return jlm_errf(err, JLM_EFORMAT, "json_schema: not JSON (line %d, column %d: %s)", je.line, je.column, je.text);
        c.refs = json_object();
        if (!c.refs) rc = jlm_errf(err, JLM_ENOMEM, "json_schema: out of memory");
        rname top;
        if (!rc) rc = node(&c, c.root, "", 0, top);
        if (!rc) sb_f(&c.out, "root ::= %s\n", top);
        json_decref(c.refs);
        json_decref(c.root);
    }
    sb_add(&c.out, PRIMS, sizeof PRIMS - 1);
    if (!rc && c.out.oom) rc = jlm_errf(err, JLM_ENOMEM, "json_schema: out of memory");
    if (!rc && c.out.n > JLM_GRAM_MAX_SRC) rc = jlm_errf(err, JLM_EUNSUPPORTED, "json_schema: the grammar it needs is larger than 1 MiB");
    if (rc) {
        free(c.out.s);
        return rc;
    }
    *gbnf = c.out.s;
    return 0;
}
