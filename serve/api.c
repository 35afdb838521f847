/* api.c - OpenAI request parsing and response objects (contract in api.h). */
#include "serve/api.h"
#include "serve/constrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

/* ---------------------------------------------------------------- field readers */

static int bad(jlm_err *err, const char *field, const char *want)
{
    return jlm_errf(err, JLM_EINVAL, "'%s': expected %s", field, want);
}

/* A number in [lo, hi] ((lo, hi] when lo_open; integers accepted), as the
 * float it is stored as: 1e-50 is above 0 as a double and 0 as a float.
 * Absent leaves *out. */
static int get_num(const json_t *o, const char *k, double lo, double hi, int lo_open, float *out, jlm_err *err)
{
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    double x = json_number_value(v);
    float f = (float)x;
    if (!json_is_number(v) || !isfinite(x) || !isfinite(f) || (lo_open ? f <= lo : f < lo) || f > hi) {
        char want[96];
        snprintf(want, sizeof want, "a number in %c%g, %g]", lo_open ? '(' : '[', lo, hi);
        return bad(err, k, want);
    }
    *out = f;
    return 0;
}

static int get_int(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out, jlm_err *err)
{
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    json_int_t x = json_integer_value(v);
    if (!json_is_integer(v) || x < lo || x > hi) {
        char want[96];
        snprintf(want, sizeof want, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
        return bad(err, k, want);
    }
    *out = x;
    return 0;
}

static int get_bool(const json_t *o, const char *k, int *out, jlm_err *err)
{
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return bad(err, k, "true or false");
    *out = json_is_true(v);
    return 0;
}

static int add_stop(jlm_srv_req *r, const json_t *s, jlm_err *err)
{
    size_t n = json_string_length(s);
    if (!json_is_string(s) || n == 0 || n > JLM_SRV_MAX_STOP_LEN)
        return bad(err, "stop", "non-empty strings of at most 256 bytes");
    if (r->n_stop == JLM_SRV_MAX_STOP)
        return bad(err, "stop", "at most 4 strings");
    r->stop[r->n_stop] = strndup(json_string_value(s), n);
    if (!r->stop[r->n_stop])
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    r->n_stop++;
    return 0;
}

static int get_stop(const json_t *o, jlm_srv_req *r, jlm_err *err)
{
    const json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v))
        return add_stop(r, v, err);
    if (!json_is_array(v))
        return bad(err, "stop", "a string or an array of strings");
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s) {
        int rc = add_stop(r, s, err);
        if (rc) return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------- prompt and messages */

/* (jansson refuses \u0000 in a body: strings hold no NUL) */
static int dup_text(const json_t *s, char **out, jlm_err *err)
{
    *out = strndup(json_string_value(s), json_string_length(s));
    return *out ? 0 : jlm_errf(err, JLM_ENOMEM, "out of memory");
}

/* A string, or an array holding exactly one string (what clients send for a
 * single prompt). Token-id prompts and batches of prompts are refused. */
static int get_prompt(const json_t *o, jlm_srv_req *r, jlm_err *err)
{
    const json_t *v = json_object_get(o, "prompt");
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
        v = json_array_get(v, 0);
    else if (json_is_array(v))
        return jlm_errf(err, JLM_EUNSUPPORTED, "'prompt': only one text prompt per request is supported");
    if (!json_is_string(v))
        return bad(err, "prompt", "a string");
    return dup_text(v, &r->prompt, err);
}

/* Standard base64 (padding optional, no whitespace) into a malloc'd buffer;
 * -1 on a bad character or length, -2 on OOM. */
static int b64_decode(const char *s, size_t n, uint8_t **out, size_t *len)
{
    while (n > 0 && s[n - 1] == '=') n--;
    if (n % 4 == 1)
        return -1;
    uint8_t *b = malloc(n / 4 * 3 + 3);
    if (!b)
        return -2;
    size_t k = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
              : c == '+' ? 62 : c == '/' ? 63 : -1;
        if (v < 0) {
            free(b);
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            b[k++] = (uint8_t)(acc >> 16);
            b[k++] = (uint8_t)(acc >> 8);
            b[k++] = (uint8_t)acc;
        }
    }
    if (n % 4 == 2) b[k++] = (uint8_t)(acc >> 4);
    if (n % 4 == 3) { b[k++] = (uint8_t)(acc >> 10); b[k++] = (uint8_t)(acc >> 2); }
    *out = b;
    *len = k;
    return 0;
}

/* An image_url part: a data: URI of a base64 image, decoded into r->image
 * (one per request; the model's decoder checks the bytes). */
static int get_image(const json_t *p, const char *what, jlm_srv_req *r, jlm_err *err)
{
    const json_t *iu = json_object_get(p, "image_url");
    const json_t *u = json_is_object(iu) ? json_object_get(iu, "url") : iu;
    if (!json_is_string(u))
        return jlm_errf(err, JLM_EINVAL, "'%s.image_url': expected an object with a string 'url'", what);
    const char *url = json_string_value(u), *comma = strchr(url, ',');
    if (strncmp(url, "data:", 5))
        return jlm_errf(err, JLM_EUNSUPPORTED, "'%s.image_url.url': only data: URIs are accepted (no remote or file URLs)", what);
    if (!comma || (size_t)(comma - url) < 12 || memcmp(comma - 7, ";base64", 7) || strncmp(url + 5, "image/", 6))
        return jlm_errf(err, JLM_EINVAL, "'%s.image_url.url': expected data:image/...;base64,...", what);
    if (r->image)
        return jlm_errf(err, JLM_EUNSUPPORTED, "'%s': only one image per request is supported", what);
    int rc = b64_decode(comma + 1, json_string_length(u) - (size_t)(comma + 1 - url), &r->image, &r->image_len);
    if (rc == -2)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    if (rc || r->image_len == 0)
        return jlm_errf(err, JLM_EINVAL, "'%s.image_url.url': the data is not valid base64", what);
    snprintf(r->image_what, sizeof r->image_what, "%s", what);
    return 0;
}

static int check_content(const json_t *c, size_t i, jlm_srv_req *r, jlm_err *err)
{
    if (!c || json_is_null(c) || json_is_string(c))
        return 0;
    if (!json_is_array(c))
        return jlm_errf(err, JLM_EINVAL, "'messages[%zu].content': expected a string or an array of parts", i);
    size_t j;
    const json_t *p;
    json_array_foreach(c, j, p) {
        const json_t *t = json_object_get(p, "type");
        char what[64];
        snprintf(what, sizeof what, "messages[%zu].content[%zu]", i, j);
        if (!json_is_object(p) || !json_is_string(t))
            return jlm_errf(err, JLM_EINVAL, "'%s': expected an object with a 'type'", what);
        if (!strcmp(json_string_value(t), "image_url")) {
            int rc = get_image(p, what, r, err);
            if (rc) return rc;
            continue;
        }
        if (strcmp(json_string_value(t), "text"))
            return jlm_errf(err, JLM_EUNSUPPORTED, "'%s': part type '%s' is not supported (text and image_url only)",
                            what, json_string_value(t));
        if (!json_is_string(json_object_get(p, "text")))
            return jlm_errf(err, JLM_EINVAL, "'%s.text': expected a string", what);
    }
    return 0;
}

static int get_messages(const json_t *o, jlm_srv_req *r, jlm_err *err)
{
    json_t *v = json_object_get(o, "messages");
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(err, "messages", "a non-empty array of messages");
    size_t i;
    const json_t *m;
    json_array_foreach(v, i, m) {
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return jlm_errf(err, JLM_EINVAL, "'messages[%zu]': expected an object with a string 'role'", i);
        int rc = check_content(json_object_get(m, "content"), i, r, err);
        if (rc) return rc;
    }
    r->messages = json_incref(v);
    return 0;
}

/* ---------------------------------------------------------------- request */

/* completions: logprobs = N alternatives (0..5); chat: logprobs = true and
 * top_logprobs = N (0..20). */
static int get_logprobs(const json_t *o, jlm_srv_kind kind, jlm_srv_req *r, jlm_err *err)
{
    int64_t top = 0;
    int rc;
    if (kind == JLM_SRV_COMPLETION) {
        top = -1;
        rc = get_int(o, "logprobs", 0, 5, &top, err);
        r->logprobs = top >= 0;
    } else {
        rc = get_bool(o, "logprobs", &r->logprobs, err);
        if (!rc) rc = get_int(o, "top_logprobs", 0, 20, &top, err);
        if (!rc && top > 0 && !r->logprobs)
            return jlm_errf(err, JLM_EINVAL, "'top_logprobs': needs 'logprobs': true");
    }
    r->top_logprobs = top > 0 ? (int)top : 0;
    return rc;
}

/* A field given with a value other than its neutral one (null, false, an
 * empty string, array or object). */
static int given(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) && !json_is_false(v) && !(json_is_string(v) && json_string_length(v) == 0) &&
           !(json_is_array(v) && json_array_size(v) == 0) && !(json_is_object(v) && json_object_size(v) == 0);
}

/* OpenAI fields that would change the output and are not implemented: a
 * 400 naming the field rather than a reply that ignores it. */
static int get_unsupported(const json_t *o, jlm_srv_kind kind, jlm_err *err)
{
    static const char *const chat_only[] = {"audio", "prediction", "web_search_options", "functions", "function_call",
                                            "reasoning_effort", "verbosity"};
    int64_t best = 1;
    int rc = kind == JLM_SRV_COMPLETION ? get_int(o, "best_of", 1, 128, &best, err) : 0;
    if (rc) return rc;
    if (best != 1)
        return jlm_errf(err, JLM_EUNSUPPORTED, "'best_of': only best_of = 1 is supported");
    if (given(o, "logit_bias"))
        return jlm_errf(err, JLM_EUNSUPPORTED, "'logit_bias': not implemented by this server");
    if (kind == JLM_SRV_COMPLETION) {
        if (given(o, "suffix"))
            return jlm_errf(err, JLM_EUNSUPPORTED, "'suffix': not implemented by this server");
        if (given(o, "tools") || given(o, "tool_choice"))
            return jlm_errf(err, JLM_EINVAL, "'%s': only /v1/chat/completions takes tools", given(o, "tools") ? "tools" : "tool_choice");
        return 0;
    }
    for (size_t i = 0; i < sizeof chat_only / sizeof *chat_only; i++)
        if (given(o, chat_only[i]))
            return jlm_errf(err, JLM_EUNSUPPORTED, "'%s': not implemented by this server%s", chat_only[i],
                            i >= 3 && i <= 4 ? " (use 'tools' and 'tool_choice')" : "");
    const json_t *mod = json_object_get(o, "modalities"), *x;
    size_t i;
    json_array_foreach(mod, i, x)
        if (!json_is_string(x) || strcmp(json_string_value(x), "text"))
            return jlm_errf(err, JLM_EUNSUPPORTED, "'modalities': only [\"text\"] is implemented by this server");
    return 0;
}

static int get_sampling(const json_t *o, jlm_srv_req *r, jlm_err *err)
{
    jlm_samp_params *p = &r->samp;
    int64_t k = p->top_k, seed = 0;
    int rc = get_num(o, "temperature", 0, 2, 0, &p->temp, err);
    if (!rc) rc = get_num(o, "top_p", 0, 1, 0, &p->top_p, err);
    if (!rc) rc = get_num(o, "min_p", 0, 1, 0, &p->min_p, err);
    if (!rc) rc = get_num(o, "presence_penalty", -2, 2, 0, &p->presence_penalty, err);
    if (!rc) rc = get_num(o, "frequency_penalty", -2, 2, 0, &p->freq_penalty, err);
    /* logits are divided by it: 0 is refused, as the CLI's --repeat-penalty */
    if (!rc) rc = get_num(o, "repeat_penalty", 0, 10, 1, &p->repeat_penalty, err);
    if (!rc) rc = get_int(o, "top_k", 0, 1 << 30, &k, err);
    if (!rc) rc = get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, err);
    if (rc)
        return rc;
    p->top_k = (int32_t)k;
    r->seeded = json_is_integer(json_object_get(o, "seed"));
    if (r->seeded)
        p->seed = (uint64_t)seed;
    return 0;
}

static int get_stream(const json_t *o, jlm_srv_req *r, jlm_err *err)
{
    int rc = get_bool(o, "stream", &r->stream, err);
    const json_t *so = json_object_get(o, "stream_options");
    if (rc || !so || json_is_null(so))
        return rc;
    if (!json_is_object(so))
        return bad(err, "stream_options", "an object");
    return get_bool(so, "include_usage", &r->include_usage, err);
}

static int parse_fields(const json_t *o, jlm_srv_kind kind, jlm_srv_req *r, jlm_err *err)
{
    const json_t *m = json_object_get(o, "model");
    if (m && !json_is_null(m) && !json_is_string(m))
        return bad(err, "model", "a string");
    if (json_is_string(m) && dup_text(m, &r->model, err))
        return err ? err->code : JLM_EINVAL;
    int rc = kind == JLM_SRV_CHAT ? get_messages(o, r, err) : get_prompt(o, r, err);
    if (!rc) rc = get_unsupported(o, kind, err);
    int64_t n = 1;
    if (!rc) rc = get_int(o, "n", 1, JLM_SRV_MAX_N, &n, err);
    r->n = (int)n;
    if (!rc) rc = get_int(o, "max_tokens", 0, JLM_SRV_MAX_TOKENS, &r->max_tokens, err);
    if (!rc && kind == JLM_SRV_CHAT)
        rc = get_int(o, "max_completion_tokens", 0, JLM_SRV_MAX_TOKENS, &r->max_tokens, err);
    if (!rc) rc = get_sampling(o, r, err);
    if (!rc) rc = get_stop(o, r, err);
    if (!rc) rc = get_stream(o, r, err);
    if (!rc) rc = get_bool(o, "ignore_eos", &r->ignore_eos, err);
    if (!rc) rc = get_logprobs(o, kind, r, err);
    if (!rc && kind == JLM_SRV_COMPLETION) rc = get_bool(o, "echo", &r->echo, err);
    if (!rc && r->echo && r->logprobs)   /* would need the prompt tokens' log-probabilities */
        return jlm_errf(err, JLM_EUNSUPPORTED, "'echo': not supported together with 'logprobs'");
    if (!rc && kind == JLM_SRV_CHAT) rc = jlm_tc_check_messages(r->messages, err);
    if (!rc && kind == JLM_SRV_CHAT) rc = jlm_tc_req_parse(o, &r->tc, err);   /* serve/toolcall.h */
    return rc;
}

int jlm_srv_req_parse(const char *body, size_t len, jlm_srv_kind kind, jlm_srv_req *req, jlm_err *err)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return jlm_errf(err, JLM_EFORMAT, "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                        je.column);
    if (!json_is_object(o)) {
        json_decref(o);
        return jlm_errf(err, JLM_EFORMAT, "request body: expected a JSON object");
    }
    int rc = jlm_srv_req_parse_obj(o, kind, req, err);
    json_decref(o);
    return rc;
}

int jlm_srv_req_parse_obj(json_t *o, jlm_srv_kind kind, jlm_srv_req *req, jlm_err *err)
{
    jlm_srv_req r = {.kind = kind, .max_tokens = -1, .n = 1};
    jlm_samp_params_default(&r.samp);
    int rc = parse_fields(o, kind, &r, err);
    if (!rc)
        rc = jlm_srv_constraint(o, &r.gram, err);   /* docs/grammar.md */
    if (rc) {
        jlm_srv_req_free(&r);
        return rc;
    }
    *req = r;
    return 0;
}

void jlm_srv_req_free(jlm_srv_req *req)
{
    free(req->model);
    free(req->prompt);
    free(req->image);
    json_decref(req->messages);
    json_decref(req->inputs);
    jlm_gram_free(req->gram);
    jlm_tc_req_free(&req->tc);
    for (size_t i = 0; i < req->n_stop; i++)
        free(req->stop[i]);
    memset(req, 0, sizeof *req);
}

/* ---------------------------------------------------------------- responses */

/* A JSON string of text[0, len) with every invalid UTF-8 sequence replaced by
 * U+FFFD (a token can end inside a character that never completes). */
static json_t *text_json(const char *text, size_t len)
{
    char *buf = malloc(len * 3 + 1);
    size_t n = 0;
    for (size_t i = 0; buf && i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k > 0 && cp != 0) {
            memcpy(buf + n, text + i, (size_t)k);
            n += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(buf + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        }
    }
    json_t *j = buf ? json_stringn(buf, n) : NULL;
    free(buf);
    return j;
}

json_t *jlm_srv_json_text(const char *text, size_t len) { return text_json(text, len); }

static json_t *usage(const jlm_srv_result *r)
{
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)r->prompt_tokens, "completion_tokens",
                     (json_int_t)r->completion_tokens, "total_tokens",
                     (json_int_t)r->prompt_tokens + (json_int_t)r->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", (json_int_t)r->cached_tokens);
}

static json_t *envelope(const jlm_srv_ident *id, const char *object, json_t *choice)
{
    if (!choice)
        return NULL;
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o]}", "id", id->id, "object", object, "created",
                     (json_int_t)id->created, "model", id->model, "system_fingerprint", "jlmfs", "choices", choice);
}

json_t *jlm_srv_json_completion(const jlm_srv_ident *id, const char *text, size_t len, const jlm_srv_result *r)
{
    int chat = id->kind == JLM_SRV_CHAT, calls = chat && json_array_size(r->tool_calls) > 0;
    json_t *t = calls && len == 0 ? json_null() : text_json(text, len);
    json_t *choice = chat ? json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", id->index, "message", "role",
                                      "assistant", "content", t, "logprobs", "finish_reason", r->finish_reason)
                          : json_pack("{s:o, s:i, s:n, s:s}", "text", t, "index", id->index, "logprobs",
                                      "finish_reason", r->finish_reason);
    if (choice && calls)
        json_object_set(json_object_get(choice, "message"), "tool_calls", (json_t *)r->tool_calls);
    json_t *j = envelope(id, chat ? "chat.completion" : "text_completion", choice);
    if (j && json_object_set_new(j, "usage", usage(r))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

json_t *jlm_srv_json_chunk(const jlm_srv_ident *id, const char *text, size_t len, int role, const jlm_srv_result *r)
{
    int chat = id->kind == JLM_SRV_CHAT;
    json_t *fin = r ? json_string(r->finish_reason) : json_null();
    json_t *choice;
    if (!chat) {
        choice = json_pack("{s:o, s:i, s:n, s:o}", "text", text_json(text, len), "index", id->index, "logprobs",
                           "finish_reason", fin);
    } else {
        json_t *delta = r ? json_object() : json_pack("{s:o}", "content", text_json(text, len));
        if (delta && role)
            json_object_set_new(delta, "role", json_string("assistant"));
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", id->index, "delta", delta, "logprobs", "finish_reason", fin);
    }
    return envelope(id, chat ? "chat.completion.chunk" : "text_completion", choice);
}

json_t *jlm_srv_json_delta_chunk(const jlm_srv_ident *id, json_t *delta, int role)
{
    if (delta && role)
        json_object_set_new(delta, "role", json_string("assistant"));
    json_t *choice = json_pack("{s:i, s:o, s:n, s:n}", "index", id->index, "delta", delta, "logprobs", "finish_reason");
    return envelope(id, "chat.completion.chunk", choice);
}

json_t *jlm_srv_json_usage_chunk(const jlm_srv_ident *id, const jlm_srv_result *r)
{
    int chat = id->kind == JLM_SRV_CHAT;
    return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id->id, "object",
                     chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)id->created, "model",
                     id->model, "choices", "usage", usage(r));
}

static const char *error_type(int status)
{
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 503: return "server_busy";
    default:  return "server_error";
    }
}

json_t *jlm_srv_json_error(int status, const char *message)
{
    return json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", message, "type", error_type(status), "param",
                     "code", status);
}

static json_t *bytes_json(const char *p, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

json_t *jlm_srv_json_lp_entry(const char *tok, size_t len, double lp)
{
    return json_pack("{s:o, s:f, s:o, s:[]}", "token", text_json(tok, len), "logprob", lp, "bytes",
                     bytes_json(tok, len), "top_logprobs");
}

int jlm_srv_json_lp_add_top(json_t *entry, const char *tok, size_t len, double lp)
{
    json_t *t = json_pack("{s:o, s:f, s:o}", "token", text_json(tok, len), "logprob", lp, "bytes", bytes_json(tok, len));
    return t ? json_array_append_new(json_object_get(entry, "top_logprobs"), t) : -1;
}

/* The legacy completions shape of the chat-shaped entries. */
static json_t *completion_logprobs(const json_t *entries, size_t *offset)
{
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i, k;
    const json_t *e, *t;
    json_array_foreach(entries, i, e) {
        json_array_append(toks, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += json_array_size(json_object_get(e, "bytes"));
        json_t *top = json_object();
        json_array_foreach(json_object_get(e, "top_logprobs"), k, t)
            json_object_set(top, json_string_value(json_object_get(t, "token")), json_object_get(t, "logprob"));
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

json_t *jlm_srv_json_logprobs(jlm_srv_kind kind, json_t *entries, size_t *offset)
{
    if (!entries)
        return NULL;
    json_t *lp = kind == JLM_SRV_CHAT ? json_pack("{s:O}", "content", entries) : completion_logprobs(entries, offset);
    json_decref(entries);
    return lp;
}

void jlm_srv_json_set_logprobs(json_t *obj, json_t *lp)
{
    json_t *c = json_array_get(json_object_get(obj, "choices"), 0);
    if (c && lp)
        json_object_set(c, "logprobs", lp);
    json_decref(lp);
}

char *jlm_srv_sse(const json_t *j, size_t *len)
{
    char *s = json_dumps(j, JSON_COMPACT);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, s, n);
        memcpy(out + 6 + n, "\n\n", 3);
        *len = n + 8;
    }
    free(s);
    return out;
}

/* ---------------------------------------------------------------- key, stop strings */

int jlm_srv_key_equal(const char *a, size_t na, const char *b, size_t nb)
{
    volatile unsigned char d = (unsigned char)(na != nb);
    size_t n = na > nb ? na : nb;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < na ? (unsigned char)a[i] : 0, y = i < nb ? (unsigned char)b[i] : 0;
        d |= (unsigned char)(x ^ y);
    }
    return d == 0;
}

/* Longest suffix of text that is a proper prefix of s. */
static size_t partial_tail(const char *text, size_t len, const char *s)
{
    size_t ns = strlen(s);
    for (size_t k = ns - 1 < len ? ns - 1 : len; k > 0; k--)
        if (!memcmp(text + len - k, s, k))
            return k;
    return 0;
}

size_t jlm_srv_stop_scan(const jlm_srv_req *req, const char *text, size_t len, int final, int *hit)
{
    size_t first = len, held = 0;
    *hit = 0;
    for (size_t i = 0; i < req->n_stop; i++) {
        const char *p = memmem(text, len, req->stop[i], strlen(req->stop[i]));
        if (p && (size_t)(p - text) < first) {
            first = (size_t)(p - text);
            *hit = (int)i + 1;
        }
        size_t t = partial_tail(text, len, req->stop[i]);
        if (t > held) held = t;
    }
    if (*hit)
        return first;
    size_t safe = final ? len : len - held;
    while (safe > 0 && safe < len && ((unsigned char)text[safe] & 0xC0) == 0x80)
        safe--;
    return safe;
}
