/* dialect.c - the request shapes of /v1/embeddings, Anthropic's
 * /v1/messages and ollama's /api/chat, /api/generate, /api/embed, and the
 * Anthropic and ollama response bodies (contract in dialect.h). */
#include "serve/dialect.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- common */

static json_t *load_obj(const char *body, size_t len, jlm_err *err)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        jlm_errf(err, JLM_EFORMAT, "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                 je.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        jlm_errf(err, JLM_EFORMAT, "request body: expected a JSON object");
        return NULL;
    }
    return o;
}

static int given(const json_t *v) { return v && !json_is_null(v); }

/* Copies the field k of from (when given) into to as name. */
static int copy_field(json_t *to, const char *name, const json_t *from, const char *k)
{
    const json_t *v = json_object_get(from, k);
    return given(v) ? json_object_set(to, name, (json_t *)v) : 0;
}

char *jlm_srv_ollama_name(const char *name)
{
    size_t n = strlen(name);
    if (n > 7 && !strcmp(name + n - 7, ":latest"))
        n -= 7;
    return strndup(name, n);
}

/* The model field: a string (ollama: without ":latest") or absent. */
static int take_model(const json_t *o, int ollama, json_t *out, jlm_err *err)
{
    const json_t *m = json_object_get(o, "model");
    if (!given(m))
        return 0;
    if (!json_is_string(m))
        return jlm_errf(err, JLM_EINVAL, "'model': expected a string");
    char *name = ollama ? jlm_srv_ollama_name(json_string_value(m)) : strdup(json_string_value(m));
    int rc = name && !json_object_set_new(out, "model", json_string(name)) ? 0
                                                                           : jlm_errf(err, JLM_ENOMEM, "out of memory");
    free(name);
    return rc;
}

/* ---------------------------------------------------------------- embeddings */

/* input: a string, an array of strings, an array of token ids, or an array
 * of arrays of token ids; each non-empty. Returned as an array of strings
 * or of id arrays (a new reference). */
static json_t *embed_inputs(const json_t *in, int ollama, jlm_err *err)
{
    if (json_is_string(in)) {
        json_t *a = json_array();
        if (!a || json_array_append(a, (json_t *)in)) {
            json_decref(a);
            jlm_errf(err, JLM_ENOMEM, "out of memory");
            return NULL;
        }
        in = a;
    } else if (json_is_array(in) && json_array_size(in) && json_is_integer(json_array_get(in, 0)) && !ollama) {
        json_t *a = json_pack("[O]", in);   /* one token array */
        if (!a) {
            jlm_errf(err, JLM_ENOMEM, "out of memory");
            return NULL;
        }
        in = a;
    } else {
        json_incref((json_t *)in);
    }
    const char *want = ollama ? "a string or a non-empty array of non-empty strings"
                              : "a string, an array of strings, an array of token ids or an array of such arrays "
                                "(each non-empty)";
    size_t n = json_array_size(in), i, k;
    int ok = json_is_array(in) && n > 0;
    const json_t *v, *t;
    json_array_foreach(in, i, v) {
        if (!ok) break;
        if (json_is_string(v))
            ok = json_string_length(v) > 0 && (i == 0 || json_is_string(json_array_get(in, 0)));
        else if (json_is_array(v) && !ollama && json_array_size(v) && json_is_array(json_array_get(in, 0)))
            json_array_foreach(v, k, t) ok = ok && json_is_integer(t) && json_integer_value(t) >= 0 &&
                                             json_integer_value(t) <= INT32_MAX;
        else
            ok = 0;
    }
    if (!ok) {
        json_decref((json_t *)in);
        jlm_errf(err, JLM_EINVAL, "'input': expected %s", want);
        return NULL;
    }
    if (n > JLM_SRV_MAX_INPUTS) {
        json_decref((json_t *)in);
        jlm_errf(err, JLM_EINVAL, "'input': at most %d inputs per request", JLM_SRV_MAX_INPUTS);
        return NULL;
    }
    return (json_t *)in;
}

static int ollama_options(const json_t *o, json_t *out, int embed, jlm_err *err);

static int parse_embed(json_t *o, int ollama, jlm_srv_req *r, jlm_err *err)
{
    json_t *tmp = json_object();
    int rc = tmp ? take_model(o, ollama, tmp, err) : jlm_errf(err, JLM_ENOMEM, "out of memory");
    if (!rc && json_is_string(json_object_get(tmp, "model")) &&
        !(r->model = strdup(json_string_value(json_object_get(tmp, "model")))))
        rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
    json_decref(tmp);
    const json_t *in = json_object_get(o, "input");
    if (!rc && !given(in))
        rc = jlm_errf(err, JLM_EINVAL, "'input': required");
    if (!rc && !(r->inputs = embed_inputs(in, ollama, err)))
        rc = err->code;
    const json_t *dim = json_object_get(o, "dimensions");
    if (!rc && given(dim))
        rc = jlm_errf(err, JLM_EUNSUPPORTED, "'dimensions': not supported (the vectors have the model's width)");
    const json_t *ef = json_object_get(o, "encoding_format");
    if (!rc && !ollama && given(ef)) {
        if (!json_is_string(ef) || (strcmp(json_string_value(ef), "float") && strcmp(json_string_value(ef), "base64")))
            rc = jlm_errf(err, JLM_EINVAL, "'encoding_format': expected \"float\" or \"base64\"");
        else
            r->base64 = !strcmp(json_string_value(ef), "base64");
    }
    const json_t *pool = json_object_get(o, "pooling");
    if (!rc && given(pool)) {
        if (!json_is_string(pool) || (strcmp(json_string_value(pool), "mean") && strcmp(json_string_value(pool), "last")))
            rc = jlm_errf(err, JLM_EINVAL, "'pooling': expected \"mean\" or \"last\"");
        else
            r->pool_last = !strcmp(json_string_value(pool), "last");
    }
    const json_t *tr = json_object_get(o, "truncate");
    if (!rc && ollama && given(tr) && !json_is_boolean(tr))
        rc = jlm_errf(err, JLM_EINVAL, "'truncate': expected true or false");
    if (!rc && ollama) {
        json_t *sink = json_object();   /* the options are checked; none changes an embedding */
        rc = sink ? ollama_options(o, sink, 1, err) : jlm_errf(err, JLM_ENOMEM, "out of memory");
        json_decref(sink);
    }
    return rc;
}

/* ---------------------------------------------------------------- Anthropic */

static json_t *anth_content(const json_t *c, long i, const char *where, jlm_err *err);

/* A tool_use block -> an OpenAI tool call {id, type, function: {name,
 * arguments: the input's JSON text}}; a tool_result block -> a `tool`
 * message. Appended to calls / msgs. */
static int anth_tool_block(const json_t *b, const char *type, const char *where, json_t *calls, json_t *msgs,
                           jlm_err *err)
{
    if (!strcmp(type, "tool_use")) {
        const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *in = json_object_get(b, "input");
        if (!json_is_string(id) || !json_is_string(name) || !json_is_object(in))
            return jlm_errf(err, JLM_EINVAL, "'%s': a tool_use block needs a string 'id' and 'name' and an object 'input'",
                            where);
        char *args = json_dumps(in, JSON_COMPACT);
        int rc = !args || json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
                                                                  "function", "name", name, "arguments", args));
        free(args);
        return rc ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
    }
    const json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content"),
                 *e = json_object_get(b, "is_error");
    if (!json_is_string(id))
        return jlm_errf(err, JLM_EINVAL, "'%s.tool_use_id': expected a string", where);
    if (given(e) && !json_is_boolean(e))
        return jlm_errf(err, JLM_EINVAL, "'%s.is_error': expected true or false", where);
    json_t *text;
    char sub[96];
    snprintf(sub, sizeof sub, "%s.content", where);
    if (!given(c))
        text = json_string("");
    else if (!(text = anth_content(c, -2, sub, err)))
        return err->code;
    if (json_is_true(e)) {   /* the template has no field for it: the text says so */
        json_t *p = json_is_string(text) ? json_pack("[{s:s, s:O}]", "type", "text", "text", text) : json_incref(text);
        json_decref(text);
        text = p;
        if (p && json_array_insert_new(p, 0, json_pack("{s:s, s:s}", "type", "text", "text", "Error:")))
            json_decref(p), text = NULL;
    }
    return !text || json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id,
                                                          "content", text))
               ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
}

/* One content block at `where` as an OpenAI part appended to parts, or (a
 * tool block, when calls / msgs are given: a message's content) a call or a
 * tool message (anth_tool_block). Images are refused (dialect.h). */
static int anth_block(const json_t *b, const char *where, json_t *parts, json_t *calls, json_t *msgs, jlm_err *err)
{
    const char *type = json_string_value(json_object_get(b, "type"));
    if (!json_is_object(b) || !type)
        return jlm_errf(err, JLM_EINVAL, "'%s': expected an object with a string 'type'", where);
    if (!strcmp(type, "text")) {
        const json_t *t = json_object_get(b, "text");
        if (!json_is_string(t))
            return jlm_errf(err, JLM_EINVAL, "'%s.text': expected a string", where);
        return json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", t))
                   ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
    }
    if ((!strcmp(type, "tool_use") && calls) || (!strcmp(type, "tool_result") && msgs))
        return anth_tool_block(b, type, where, calls, msgs, err);
    if (!strcmp(type, "tool_use") || !strcmp(type, "tool_result"))
        return jlm_errf(err, JLM_EINVAL, "'%s': a %s block goes in %s", where, type,
                        !strcmp(type, "tool_use") ? "an assistant message" : "a user message");
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        return jlm_errf(err, JLM_EUNSUPPORTED, "'%s': %s blocks are not supported (text only)", where, type);
    return jlm_errf(err, JLM_EUNSUPPORTED, "'%s': block type '%s' is not supported (text only)", where, type);
}

/* content (of messages[i]; system when i == -1; a tool_result's when -2): a
 * string, or an array of text blocks -> the OpenAI message's content. */
static json_t *anth_content(const json_t *c, long i, const char *where, jlm_err *err)
{
    if (json_is_string(c))
        return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        if (i == -1) jlm_errf(err, JLM_EINVAL, "'system': expected a string or an array of text blocks");
        else jlm_errf(err, JLM_EINVAL, "'%s': expected a string or an array of blocks", where);
        return NULL;
    }
    json_t *parts = json_array();
    size_t k;
    const json_t *b;
    char at[128];
    json_array_foreach(c, k, b) {
        snprintf(at, sizeof at, "%s[%zu]", where, k);
        if (!parts || anth_block(b, at, parts, NULL, NULL, err)) {
            if (!parts) jlm_errf(err, JLM_ENOMEM, "out of memory");
            json_decref(parts);
            return NULL;
        }
    }
    return parts;
}

/* Appends a message {role, content: parts (null for an assistant's calls
 * without text)} when it has text or calls; empties parts. */
static int anth_flush(json_t *msgs, const char *role, json_t *parts, json_t *calls)
{
    if (!json_array_size(parts) && !json_array_size(calls))
        return 0;
    json_t *c = json_array_size(parts) ? json_copy(parts) : json_null();
    json_t *m = c ? json_pack("{s:s, s:o}", "role", role, "content", c) : NULL;
    if (m && json_array_size(calls) && json_object_set(m, "tool_calls", calls))
        json_decref(m), m = NULL;
    json_array_clear(parts);
    return !m || json_array_append_new(msgs, m);
}

/* messages[i] -> OpenAI messages: a user turn's tool_result blocks become
 * `tool` messages (in their place among its text), an assistant turn's
 * tool_use blocks its tool_calls. */
static int anth_message(const json_t *m, size_t i, json_t *msgs, jlm_err *err)
{
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return jlm_errf(err, JLM_EINVAL, "'messages[%zu].role': expected \"user\" or \"assistant\"", i);
    const json_t *c = json_object_get(m, "content"), *b;
    if (json_is_string(c))
        return json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", c))
                   ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
    if (!json_is_array(c))
        return jlm_errf(err, JLM_EINVAL, "'messages[%zu].content': expected a string or an array of blocks", i);
    int asst = !strcmp(role, "assistant"), rc = 0;
    json_t *parts = json_array(), *calls = json_array(), *tools = json_array();
    size_t k, had = json_array_size(msgs);
    char at[96];
    if (!parts || !calls || !tools)
        rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
    json_array_foreach(c, k, b) {
        if (rc) break;
        snprintf(at, sizeof at, "messages[%zu].content[%zu]", i, k);
        rc = anth_block(b, at, parts, asst ? calls : NULL, asst ? NULL : tools, err);
        if (!rc && json_array_size(tools)) {   /* the text before it, then the tool message */
            if (anth_flush(msgs, role, parts, NULL) || json_array_extend(msgs, tools))
                rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
            json_array_clear(tools);
        }
    }
    if (!rc && (anth_flush(msgs, role, parts, calls) ||
                (json_array_size(msgs) == had &&   /* an empty content still is a turn */
                 json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", role, "content", "")))))
        rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
    json_decref(parts);
    json_decref(calls);
    json_decref(tools);
    return rc;
}

static int anth_messages(const json_t *o, json_t *out, jlm_err *err)
{
    json_t *msgs = json_array();
    if (!msgs || json_object_set_new(out, "messages", msgs))
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    const json_t *sys = json_object_get(o, "system");
    if (given(sys) && !(json_is_array(sys) && !json_array_size(sys)) && !(json_is_string(sys) && !json_string_length(sys))) {
        /* an empty system prompt is none (no system turn rendered) */
        json_t *c = anth_content(sys, -1, "system", err);
        if (!c)
            return err->code;
        if (json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", c)))
            return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    const json_t *in = json_object_get(o, "messages"), *m;
    if (!json_is_array(in) || !json_array_size(in))
        return jlm_errf(err, JLM_EINVAL, "'messages': expected a non-empty array of messages");
    size_t i;
    json_array_foreach(in, i, m) {
        int rc = anth_message(m, i, msgs, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* tools [{name, description?, input_schema}] -> OpenAI function tools;
 * Anthropic's server tools (a `type` other than "custom") are refused. */
static int anth_tools(const json_t *o, json_t *out, jlm_err *err)
{
    const json_t *tools = json_object_get(o, "tools"), *t;
    if (!given(tools))
        return 0;
    if (!json_is_array(tools))
        return jlm_errf(err, JLM_EINVAL, "'tools': expected an array of tools");
    json_t *a = json_array();
    if (!a || json_object_set_new(out, "tools", a))
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    size_t i;
    json_array_foreach(tools, i, t) {
        const json_t *ty = json_object_get(t, "type"), *name = json_object_get(t, "name"),
                     *d = json_object_get(t, "description"), *sch = json_object_get(t, "input_schema");
        if (!json_is_object(t))
            return jlm_errf(err, JLM_EINVAL, "'tools[%zu]': expected an object", i);
        if (given(ty) && !(json_is_string(ty) && !strcmp(json_string_value(ty), "custom")))
            return jlm_errf(err, JLM_EUNSUPPORTED, "'tools[%zu].type': only custom tools are implemented (no server "
                            "tools)", i);
        if (!json_is_string(name))
            return jlm_errf(err, JLM_EINVAL, "'tools[%zu].name': expected a string", i);
        if (!json_is_object(sch))
            return jlm_errf(err, JLM_EINVAL, "'tools[%zu].input_schema': expected a JSON Schema object", i);
        json_t *f = json_pack("{s:O, s:O}", "name", name, "parameters", sch);
        if (f && given(d)) json_object_set(f, "description", (json_t *)d);
        if (!f || json_array_append_new(a, json_pack("{s:s, s:o}", "type", "function", "function", f)))
            return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    return 0;
}

/* tool_choice {type: auto | any | tool (name) | none, disable_parallel_tool_use}
 * -> OpenAI's tool_choice and parallel_tool_calls. */
static int anth_tool_choice(const json_t *o, json_t *out, jlm_err *err)
{
    const json_t *tc = json_object_get(o, "tool_choice");
    if (!given(tc))
        return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    const json_t *name = json_object_get(tc, "name"), *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (!json_is_object(tc) || !type)
        return jlm_errf(err, JLM_EINVAL, "'tool_choice': expected an object with a string 'type'");
    if (given(dp) && !json_is_boolean(dp))
        return jlm_errf(err, JLM_EINVAL, "'tool_choice.disable_parallel_tool_use': expected true or false");
    json_t *c = !strcmp(type, "auto") ? json_string("auto")
              : !strcmp(type, "any")  ? json_string("required")
              : !strcmp(type, "none") ? json_string("none")
              : !strcmp(type, "tool") && json_is_string(name)
                  ? json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name)
                  : NULL;
    if (!c && !strcmp(type, "tool"))
        return jlm_errf(err, JLM_EINVAL, "'tool_choice.name': expected a string naming a tool");
    if (!c)
        return jlm_errf(err, JLM_EINVAL, "'tool_choice.type': expected \"auto\", \"any\", \"tool\" or \"none\"");
    if (json_object_set_new(out, "tool_choice", c) ||
        (json_is_true(dp) && json_object_set_new(out, "parallel_tool_calls", json_false())))
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    return 0;
}

static int anth_fields(const json_t *o, json_t *out, jlm_err *err)
{
    int rc = take_model(o, 0, out, err);
    if (!rc) rc = anth_messages(o, out, err);
    if (rc)
        return rc;
    const json_t *mt = json_object_get(o, "max_tokens");
    if (!json_is_integer(mt) || json_integer_value(mt) < 1 || json_integer_value(mt) > JLM_SRV_MAX_TOKENS)
        return jlm_errf(err, JLM_EINVAL, "'max_tokens': required, an integer in [1, %d]", JLM_SRV_MAX_TOKENS);
    const json_t *t = json_object_get(o, "temperature");
    if (given(t) && (!json_is_number(t) || json_number_value(t) < 0 || json_number_value(t) > 1))
        return jlm_errf(err, JLM_EINVAL, "'temperature': expected a number in [0, 1]");
    const json_t *ss = json_object_get(o, "stop_sequences"), *s;
    size_t i;
    if (given(ss) && (!json_is_array(ss) || json_array_size(ss) > JLM_SRV_MAX_STOP))
        return jlm_errf(err, JLM_EINVAL, "'stop_sequences': expected an array of at most %d strings", JLM_SRV_MAX_STOP);
    json_array_foreach(ss, i, s)
        if (!json_is_string(s) || !json_string_length(s) || json_string_length(s) > JLM_SRV_MAX_STOP_LEN)
            return jlm_errf(err, JLM_EINVAL, "'stop_sequences[%zu]': expected a non-empty string of at most %d bytes",
                            i, JLM_SRV_MAX_STOP_LEN);
    if ((rc = anth_tools(o, out, err)) || (rc = anth_tool_choice(o, out, err)))
        return rc;
    const json_t *th = json_object_get(o, "thinking");
    const char *tt = json_string_value(json_object_get(th, "type"));
    if (given(th) && !(tt && !strcmp(tt, "disabled")))
        return jlm_errf(err, JLM_EUNSUPPORTED, "'thinking': extended thinking is not implemented");
    if (copy_field(out, "max_tokens", o, "max_tokens") || copy_field(out, "temperature", o, "temperature") ||
        copy_field(out, "top_p", o, "top_p") || copy_field(out, "top_k", o, "top_k") ||
        copy_field(out, "stream", o, "stream") || copy_field(out, "stop", o, "stop_sequences") ||
        copy_field(out, "grammar", o, "grammar"))   /* llama-server's extension, as on OpenAI's endpoints */
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    return 0;
}

/* ---------------------------------------------------------------- ollama */

/* ollama's options: ours by another name, those that change nothing here
 * (runtime: threads, GPU, batch, memory mapping), those accepted only at
 * the value that means "off", and the rest refused by name. */
static const struct { const char *ol, *ours; } OL_MAP[] = {
    {"temperature", "temperature"}, {"top_k", "top_k"}, {"top_p", "top_p"}, {"min_p", "min_p"},
    {"seed", "seed"}, {"stop", "stop"}, {"num_predict", "max_tokens"}, {"repeat_penalty", "repeat_penalty"},
    {"presence_penalty", "presence_penalty"}, {"frequency_penalty", "frequency_penalty"},
    {"repeat_last_n", "repeat_last_n"},
};
static const char *const OL_RUNTIME[] = {
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "use_mlock", "numa", "low_vram",
    "vocab_only", "f16_kv", "num_keep", "mirostat_tau", "mirostat_eta",
};
static const struct { const char *ol; double off; } OL_OFF[] = {
    {"typical_p", 1.0}, {"tfs_z", 1.0}, {"mirostat", 0.0},
};

static int ollama_option(const char *k, json_t *v, json_t *out, int embed, jlm_err *err)
{
    for (size_t i = 0; i < sizeof OL_RUNTIME / sizeof OL_RUNTIME[0]; i++)
        if (!strcmp(k, OL_RUNTIME[i]))
            return 0;
    for (size_t i = 0; i < sizeof OL_OFF / sizeof OL_OFF[0]; i++)
        if (!strcmp(k, OL_OFF[i].ol)) {
            if (json_is_number(v) && json_number_value(v) == OL_OFF[i].off)
                return 0;
            return jlm_errf(err, JLM_EUNSUPPORTED, "'options.%s': not implemented (only %g, off, is accepted)", k,
                            OL_OFF[i].off);
        }
    if (!strcmp(k, "penalize_newline"))
        return json_is_false(v) ? 0 : jlm_errf(err, JLM_EUNSUPPORTED, "'options.penalize_newline': not implemented "
                                                                     "(only false is accepted)");
    for (size_t i = 0; i < sizeof OL_MAP / sizeof OL_MAP[0]; i++) {
        if (strcmp(k, OL_MAP[i].ol))
            continue;
        if (embed)
            return 0;   /* sampling: nothing to change in an embedding */
        if (!strcmp(k, "num_predict")) {   /* -1: no limit, -2: fill the context; both: up to the context */
            if (!json_is_integer(v) || json_integer_value(v) < -2 || json_integer_value(v) > JLM_SRV_MAX_TOKENS)
                return jlm_errf(err, JLM_EINVAL, "'options.num_predict': expected an integer in [-2, %d]",
                                JLM_SRV_MAX_TOKENS);
            if (json_integer_value(v) < 0)
                return 0;
        }
        if (!strcmp(k, "repeat_last_n") && (!json_is_integer(v) || json_integer_value(v) < 0 ||
                                            json_integer_value(v) > (1 << 20)))
            return jlm_errf(err, JLM_EINVAL, "'options.repeat_last_n': expected an integer in [0, %d]", 1 << 20);
        return json_object_set(out, OL_MAP[i].ours, v) ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
    }
    return jlm_errf(err, JLM_EUNSUPPORTED, "'options.%s': unknown or not implemented option", k);
}

static int ollama_options(const json_t *o, json_t *out, int embed, jlm_err *err)
{
    json_t *opts = json_object_get(o, "options"), *v;
    if (!given(opts))
        return 0;
    if (!json_is_object(opts))
        return jlm_errf(err, JLM_EINVAL, "'options': expected an object");
    const char *k;
    json_object_foreach(opts, k, v) {
        if (json_is_null(v))
            continue;
        int rc = ollama_option(k, v, out, embed, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* Fields of /api/chat and /api/generate that this server does not
 * implement, refused when given a value that would matter. */
static int ollama_refuse(const json_t *o, jlm_err *err)
{
    static const char *const empty_only[] = {"images", "context", "template", "suffix"};
    for (size_t i = 0; i < sizeof empty_only / sizeof empty_only[0]; i++) {
        const json_t *v = json_object_get(o, empty_only[i]);
        if (given(v) && !(json_is_array(v) && !json_array_size(v)) && !(json_is_string(v) && !json_string_length(v)))
            return jlm_errf(err, JLM_EUNSUPPORTED, "'%s': not implemented by this server", empty_only[i]);
    }
    const json_t *th = json_object_get(o, "think");
    if (given(th) && !json_is_false(th))
        return jlm_errf(err, JLM_EUNSUPPORTED, "'think': not implemented by this server");
    return 0;
}

/* format: "json" or a JSON Schema object -> response_format / json_schema. */
static int ollama_format(const json_t *o, json_t *out, jlm_err *err)
{
    const json_t *f = json_object_get(o, "format");
    if (!given(f) || (json_is_string(f) && !json_string_length(f)))
        return 0;
    int rc = json_is_string(f) && !strcmp(json_string_value(f), "json")
                 ? json_object_set_new(out, "response_format", json_pack("{s:s}", "type", "json_object"))
             : json_is_object(f) ? json_object_set(out, "json_schema", (json_t *)f)
                                 : -2;
    if (rc == -2)
        return jlm_errf(err, JLM_EINVAL, "'format': expected \"json\" or a JSON Schema object");
    return rc ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
}

/* An assistant message's tool_calls [{function: {name, arguments: {...}}}]
 * -> OpenAI calls (ids "c" and 4 + 4 digits of I and K: 9 letters and
 * digits, as Mistral's templates demand; the arguments object kept:
 * templates take it as it is). */
static int ollama_calls(const json_t *calls, size_t i, json_t *msg, jlm_err *err)
{
    if (!json_is_array(calls))
        return jlm_errf(err, JLM_EINVAL, "'messages[%zu].tool_calls': expected an array", i);
    json_t *a = json_array();
    if (!a || json_object_set_new(msg, "tool_calls", a))
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    size_t k;
    const json_t *c;
    json_array_foreach(calls, k, c) {
        const json_t *f = json_object_get(c, "function"), *name = json_object_get(f, "name"),
                     *args = json_object_get(f, "arguments");
        if (!json_is_string(name) || !(json_is_object(args) || !given(args)))
            return jlm_errf(err, JLM_EINVAL, "'messages[%zu].tool_calls[%zu]': expected {\"function\": {\"name\": "
                            "string, \"arguments\": object}}", i, k);
        char id[48];
        snprintf(id, sizeof id, "c%04zu%04zu", i % 10000, k % 10000);
        json_t *oc = given(args) ? json_incref((json_t *)args) : json_object();
        if (json_array_append_new(a, json_pack("{s:s, s:s, s:{s:O, s:o}}", "id", id, "type", "function", "function",
                                               "name", name, "arguments", oc)))
            return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    return 0;
}

/* The id of the call a tool message answers: of the last assistant calls,
 * the one named tool_name, else the n-th (results come in the calls'
 * order); NULL when there is none. */
static const json_t *ollama_answered(const json_t *calls, const json_t *tool_name, size_t n)
{
    size_t k;
    const json_t *c;
    json_array_foreach(calls, k, c)
        if (json_is_string(tool_name) && json_equal(json_object_get(json_object_get(c, "function"), "name"), (json_t *)tool_name))
            return json_object_get(c, "id");
    return json_object_get(json_array_get(calls, n), "id");
}

/* messages: {role, content, tool_calls?} and {role: "tool", content,
 * tool_name?} as OpenAI's (a tool message's tool_name becomes its name, the
 * id of the call it answers its tool_call_id). */
static int ollama_messages(const json_t *o, json_t *out, jlm_err *err)
{
    const json_t *in = json_object_get(o, "messages"), *m;
    if (!json_is_array(in) || !json_array_size(in))
        return jlm_errf(err, JLM_EINVAL, "'messages': expected a non-empty array of messages");
    json_t *msgs = json_array();
    if (!msgs || json_object_set_new(out, "messages", msgs))
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    size_t i, n_results = 0;
    const json_t *last_calls = NULL;
    json_array_foreach(in, i, m) {
        const json_t *role = json_object_get(m, "role"), *c = json_object_get(m, "content"),
                     *calls = json_object_get(m, "tool_calls"), *tn = json_object_get(m, "tool_name");
        if (!json_is_object(m) || !json_is_string(role))
            return jlm_errf(err, JLM_EINVAL, "'messages[%zu]': expected an object with a string 'role'", i);
        const json_t *im = json_object_get(m, "images");
        if (given(im) && !(json_is_array(im) && !json_array_size(im)))
            return jlm_errf(err, JLM_EUNSUPPORTED, "'messages[%zu].images': images are not implemented", i);
        if (given(c) && !json_is_string(c))
            return jlm_errf(err, JLM_EINVAL, "'messages[%zu].content': expected a string", i);
        if (given(tn) && !json_is_string(tn))
            return jlm_errf(err, JLM_EINVAL, "'messages[%zu].tool_name': expected a string", i);
        json_t *msg = json_pack("{s:O, s:s}", "role", role, "content", given(c) ? json_string_value(c) : "");
        if (!msg || json_array_append_new(msgs, msg))
            return jlm_errf(err, JLM_ENOMEM, "out of memory");
        if (given(calls) && !(json_is_array(calls) && !json_array_size(calls))) {
            int rc = ollama_calls(calls, i, msg, err);
            if (rc) return rc;
            last_calls = json_object_get(msg, "tool_calls");
            n_results = 0;
        }
        const json_t *id = !strcmp(json_string_value(role), "tool") ? ollama_answered(last_calls, tn, n_results++) : NULL;
        if ((given(tn) && json_object_set(msg, "name", (json_t *)tn)) ||
            (id && json_object_set(msg, "tool_call_id", (json_t *)id)))
            return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    return 0;
}

/* /api/generate: raw -> a completion of prompt; else the prompt as a user
 * turn (after system) through the chat template, as ollama does. */
static int ollama_generate(const json_t *o, json_t *out, jlm_srv_kind *kind, jlm_err *err)
{
    const json_t *p = json_object_get(o, "prompt"), *sys = json_object_get(o, "system"), *raw = json_object_get(o, "raw");
    if (!json_is_string(p))
        return jlm_errf(err, JLM_EINVAL, "'prompt': expected a string");
    if (given(sys) && !json_is_string(sys))
        return jlm_errf(err, JLM_EINVAL, "'system': expected a string");
    if (given(raw) && !json_is_boolean(raw))
        return jlm_errf(err, JLM_EINVAL, "'raw': expected true or false");
    if (json_is_true(raw)) {
        if (given(sys))
            return jlm_errf(err, JLM_EINVAL, "'system': goes with a templated prompt, not with 'raw': true");
        *kind = JLM_SRV_COMPLETION;
        return json_object_set(out, "prompt", (json_t *)p) ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
    }
    *kind = JLM_SRV_CHAT;
    json_t *msgs = json_array();
    if (!msgs || json_object_set_new(out, "messages", msgs) ||
        (given(sys) && json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", sys))) ||
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", p)))
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    return 0;
}

static int ollama_fields(const json_t *o, int generate, json_t *out, jlm_srv_kind *kind, jlm_err *err)
{
    int rc = take_model(o, 1, out, err);
    if (!rc) rc = ollama_refuse(o, err);
    if (!rc) rc = generate ? ollama_generate(o, out, kind, err) : ollama_messages(o, out, err);
    if (!rc) rc = ollama_options(o, out, 0, err);
    if (!rc) rc = ollama_format(o, out, err);
    if (!rc && !generate && (copy_field(out, "tools", o, "tools") || copy_field(out, "grammar", o, "grammar")))
        rc = jlm_errf(err, JLM_ENOMEM, "out of memory");   /* tools: OpenAI's shape; grammar: llama-server's */
    if (!rc && generate && given(json_object_get(o, "tools")))
        rc = jlm_errf(err, JLM_EINVAL, "'tools': /api/generate takes none (use /api/chat)");
    const json_t *st = json_object_get(o, "stream");
    if (!rc && given(st) && !json_is_boolean(st))
        rc = jlm_errf(err, JLM_EINVAL, "'stream': expected true or false");
    if (!rc && json_object_set_new(out, "stream", json_boolean(!json_is_false(st))))   /* ollama streams by default */
        rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
    return rc;
}

/* ---------------------------------------------------------------- entry */

int jlm_srv_dialect_parse(jlm_srv_api api, const char *body, size_t len, jlm_srv_req *req, jlm_err *err)
{
    json_t *o = load_obj(body, len, err);
    if (!o)
        return err->code;
    int rc;
    if (api == JLM_SRV_API_EMBED || api == JLM_SRV_API_OLLAMA_EMBED) {
        jlm_srv_req r = {.kind = JLM_SRV_EMBED, .max_tokens = -1};
        jlm_samp_params_default(&r.samp);
        rc = parse_embed(o, api == JLM_SRV_API_OLLAMA_EMBED, &r, err);
        if (rc) jlm_srv_req_free(&r);
        else *req = r;
        json_decref(o);
        return rc;
    }
    json_t *out = json_object();
    jlm_srv_kind kind = JLM_SRV_CHAT;
    int64_t last_n = -1;
    rc = !out                             ? jlm_errf(err, JLM_ENOMEM, "out of memory")
       : api == JLM_SRV_API_ANTHROPIC     ? anth_fields(o, out, err)
                                          : ollama_fields(o, api == JLM_SRV_API_OLLAMA_GENERATE, out, &kind, err);
    if (!rc && json_is_integer(json_object_get(out, "repeat_last_n"))) {   /* not an OpenAI field: set after */
        last_n = json_integer_value(json_object_get(out, "repeat_last_n"));
        json_object_del(out, "repeat_last_n");
    }
    if (!rc)
        rc = jlm_srv_req_parse_obj(out, kind, req, err);
    if (!rc && last_n >= 0)
        req->samp.repeat_last_n = (int32_t)last_n;
    json_decref(out);
    json_decref(o);
    return rc;
}

/* ---------------------------------------------------------------- responses */

json_t *jlm_srv_anth_error(int status, const char *msg)
{
    const char *type = status == 400 ? "invalid_request_error" : status == 401 ? "authentication_error"
                     : status == 404 ? "not_found_error"       : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"      : status == 503 ? "overloaded_error"
                                                                               : "api_error";
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", msg);
}

const char *jlm_srv_anth_stop_reason(const jlm_srv_result *r)
{
    return json_array_size(r->tool_calls)                          ? "tool_use"
         : r->stop_sequence                                        ? "stop_sequence"
         : r->finish_reason && !strcmp(r->finish_reason, "length") ? "max_tokens"
                                                                   : "end_turn";
}

/* "msg_" and the hex of the id's tail */
static json_t *anth_id(const jlm_srv_ident *id)
{
    const char *dash = strrchr(id->id, '-');
    char buf[64];
    snprintf(buf, sizeof buf, "msg_%s", dash ? dash + 1 : id->id);
    return json_string(buf);
}

/* A parsed call's arguments (JSON text, serve/toolcall.h) as an object. */
static json_t *call_input(const json_t *call)
{
    const char *a = json_string_value(json_object_get(json_object_get(call, "function"), "arguments"));
    json_t *o = a ? json_loads(a, 0, NULL) : NULL;
    if (json_is_object(o))
        return o;
    json_decref(o);
    return json_object();
}

json_t *jlm_srv_anth_tool_use(const json_t *call, int empty)
{
    char id[80];
    const char *cid = json_string_value(json_object_get(call, "id"));
    snprintf(id, sizeof id, "toolu_%s", cid ? cid : "");
    return json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id", id, "name",
                     json_object_get(json_object_get(call, "function"), "name"), "input",
                     empty ? json_object() : call_input(call));
}

json_t *jlm_srv_ollama_calls(const json_t *calls)
{
    json_t *a = json_array(), *c;
    size_t i;
    json_array_foreach((json_t *)calls, i, c)
        if (!a || json_array_append_new(a, json_pack("{s:O, s:{s:I, s:O, s:o}}", "id", json_object_get(c, "id"),
                                                     "function", "index", (json_int_t)i, "name",
                                                     json_object_get(json_object_get(c, "function"), "name"),
                                                     "arguments", call_input(c)))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

json_t *jlm_srv_anth_message(const jlm_srv_ident *id, const char *text, size_t len, const jlm_srv_result *r)
{
    json_t *t = jlm_srv_json_text(text, len);
    json_t *content = t ? json_pack("[{s:s, s:o}]", "type", "text", "text", t) : NULL;
    if (!content)
        return NULL;
    if (r && !len)   /* Anthropic sends no empty text block */
        json_array_clear(content);
    size_t i;
    const json_t *c;
    json_array_foreach(r ? r->tool_calls : NULL, i, c)
        if (json_array_append_new(content, jlm_srv_anth_tool_use(c, 0))) {
            json_decref(content);
            return NULL;
        }
    json_t *usage = json_pack("{s:I, s:I, s:I}", "input_tokens", (json_int_t)(r ? r->prompt_tokens : 0),
                              "output_tokens", (json_int_t)(r ? r->completion_tokens : 0), "cache_read_input_tokens",
                              (json_int_t)(r ? r->cached_tokens : 0));
    return json_pack("{s:o, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", anth_id(id), "type", "message", "role",
                     "assistant", "model", id->model, "content", content, "stop_reason",
                     r ? json_string(jlm_srv_anth_stop_reason(r)) : json_null(), "stop_sequence",
                     r && r->stop_sequence ? json_string(r->stop_sequence) : json_null(), "usage", usage);
}

char *jlm_srv_sse_event(const char *name, json_t *data, size_t *len)
{
    char *d = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!d)
        return NULL;
    char *out = NULL;
    int n = asprintf(&out, "event: %s\ndata: %s\n\n", name, d);
    free(d);
    if (n < 0)
        return NULL;
    *len = (size_t)n;
    return out;
}

json_t *jlm_srv_ollama_error(int status, const char *msg)
{
    (void)status;
    return json_pack("{s:s}", "error", msg);
}
