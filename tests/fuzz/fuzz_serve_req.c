/* fuzz_serve_req.c - libFuzzer target for the request-body parsers of
 * `jlm serve`: OpenAI's (serve/api.c), both endpoint kinds, and the other
 * APIs' (serve/dialect.c: /v1/embeddings, Anthropic's /v1/messages,
 * ollama's /api/chat, /api/generate, /api/embed), plus the stop-string scan
 * and the response builders on what parsed (a request's tool calls as a
 * reply's tool_use blocks and ollama tool_calls).
 *
 *   make fuzz && mkdir -p /tmp/corpus && build-fuzz/fuzz_serve_req -max_total_time=60 /tmp/corpus
 *
 * Every input must be refused with a message or parsed into a request whose
 * fields are then all read, so ASan sees anything left dangling. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"
#include "serve/dialect.h"

static void use(const jlm_srv_req *r, const uint8_t *data, size_t size)
{
    volatile size_t sink = r->model ? strlen(r->model) : 0;
    sink += r->prompt ? strlen(r->prompt) : 0;
    sink += r->messages ? json_array_size(r->messages) : 0;
    for (size_t i = 0; i < r->image_len; i++)   /* the decoded data: URI, all of it */
        sink += r->image[i];
    sink += strlen(r->image_what);
    int hit;
    /* the input itself as "generated text", split where the first byte says */
    size_t cut = size ? data[0] % (size + 1) : 0;
    sink += jlm_srv_stop_scan(r, (const char *)data, cut, 0, &hit);
    sink += jlm_srv_stop_scan(r, (const char *)data, size, 1, &hit);
    jlm_srv_ident id = {.id = "cmpl-x", .model = r->model ? r->model : "m", .kind = r->kind};
    jlm_srv_result res = {.finish_reason = "stop", .prompt_tokens = 1, .completion_tokens = 2};
    json_t *j = jlm_srv_json_completion(&id, (const char *)data, size, &res);
    size_t n = 0;
    char *sse = j ? jlm_srv_sse(j, &n) : NULL;
    sink += n;
    free(sse);
    json_decref(j);
    json_t *c = jlm_srv_json_chunk(&id, (const char *)data, cut, 1, NULL);
    if (r->logprobs) {   /* the input's bytes as token texts */
        json_t *entries = json_array(), *e = jlm_srv_json_lp_entry((const char *)data, cut, -1.5);
        for (int k = 0; e && k < r->top_logprobs; k++)
            jlm_srv_json_lp_add_top(e, (const char *)data + cut, size - cut, -2.0 - k);
        json_array_append_new(entries, e);
        size_t off = 0;
        jlm_srv_json_set_logprobs(c, jlm_srv_json_logprobs(r->kind, entries, &off));
    }
    json_decref(c);
    (void)sink;
}

/* The other APIs' parsers, and the Anthropic builders on what parsed. */
static void other_apis(const uint8_t *data, size_t size)
{
    for (int api = JLM_SRV_API_EMBED; api <= JLM_SRV_API_OLLAMA_EMBED; api++) {
        jlm_srv_req r;
        jlm_err err = {0};
        if (jlm_srv_dialect_parse((jlm_srv_api)api, (const char *)data, size, &r, &err) != 0) {
            if (!err.msg[0])
                abort();   /* a refusal always says why */
            continue;
        }
        if (r.kind != JLM_SRV_EMBED) {
            use(&r, data, size);
        } else if (!json_is_array(r.inputs) || !json_array_size(r.inputs)) {
            abort();   /* an embeddings request always has inputs */
        }
        jlm_srv_ident id = {.id = "msg-x", .model = r.model ? r.model : "m", .kind = r.kind};
        jlm_srv_result res = {.finish_reason = "stop", .stop_sequence = r.n_stop ? r.stop[0] : NULL};
        size_t n = 0, k;
        json_t *m;
        json_array_foreach(r.messages, k, m)   /* a request's calls as a reply's: tool_use blocks, ollama's */
            if (json_array_size(json_object_get(m, "tool_calls")))
                res.tool_calls = json_object_get(m, "tool_calls");
        char *ev = jlm_srv_sse_event("message_start", jlm_srv_anth_message(&id, (const char *)data, size, &res), &n);
        free(ev);
        json_decref(jlm_srv_ollama_calls(res.tool_calls));
        json_decref(jlm_srv_anth_error(400, r.model ? r.model : "m"));
        jlm_srv_req_free(&r);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    other_apis(data, size);
    for (int kind = JLM_SRV_COMPLETION; kind <= JLM_SRV_CHAT; kind++) {
        jlm_srv_req r;
        jlm_err err = {0};
        if (jlm_srv_req_parse((const char *)data, size, (jlm_srv_kind)kind, &r, &err) == 0) {
            use(&r, data, size);
            jlm_srv_req_free(&r);
        } else if (!err.msg[0]) {
            abort();   /* a refusal always says why */
        }
    }
    return 0;
}
