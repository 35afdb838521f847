/* anthropic.c - Anthropic's POST /v1/messages (request shape: dialect.c):
 * a whole message object, or the event stream message_start, per content
 * block content_block_start, content_block_delta... (text_delta; a
 * tool_use block's input_json_delta), content_block_stop, then
 * message_delta (stop_reason, usage), message_stop; errors in Anthropic's
 * error shape (an `error` event once the stream has begun). */
#include "serve/http_int.h"
#include "serve/dialect.h"

#include <stdlib.h>
#include <string.h>

static void event(srv_job *j, const char *name, json_t *data)
{
    size_t n = 0;
    char *b = jlm_srv_sse_event(name, data, &n);
    if (b)
        jlm_srv_job_write(j, b, n);
    else
        jlm_srv_job_write(j, "", 0);   /* still wakes the reader */
    free(b);
}

/* Text blocks open at the first piece (a tool request's reply may be
 * calls only); j->dia_blocks counts the blocks begun, j->dia_open says the
 * last is a text block still open. */
static void text_start(srv_job *j)
{
    event(j, "content_block_start", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index",
                                              j->dia_blocks, "content_block", "type", "text", "text", ""));
    j->dia_blocks++;
    j->dia_open = 1;
}

static void block_stop(srv_job *j)
{
    event(j, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", j->dia_blocks - 1));
    j->dia_open = 0;
}

static void an_open(srv_job *j)
{
    jlm_srv_result r = {.prompt_tokens = (uint32_t)j->n_prompt};
    json_t *m = jlm_srv_anth_message(&j->ident, "", 0, NULL);
    if (m) {
        json_array_clear(json_object_get(m, "content"));
        json_object_set_new(json_object_get(m, "usage"), "input_tokens", json_integer(r.prompt_tokens));
    }
    event(j, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", m));
    if (!j->tc_active)
        text_start(j);
}

static void an_piece(srv_job *j, const char *p, size_t n)
{
    if (!j->dia_open)
        text_start(j);
    json_t *t = jlm_srv_json_text(p, n);
    event(j, "content_block_delta", t ? json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index",
                                                  j->dia_blocks - 1, "delta", "type", "text_delta", "text", t) : NULL);
}

/* Each call: content_block_start (tool_use, input {}), its input's JSON
 * text in input_json_delta pieces of at most 32 bytes (whole UTF-8
 * characters), content_block_stop. */
static void an_calls(srv_job *j, const json_t *calls)
{
    if (j->dia_open)
        block_stop(j);
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        event(j, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                                  j->dia_blocks, "content_block", jlm_srv_anth_tool_use(c, 1)));
        j->dia_blocks++;
        const char *a = json_string_value(json_object_get(json_object_get(c, "function"), "arguments"));   /* compact JSON */
        size_t len = a ? strlen(a) : 0, at = 0;
        while (at < len) {
            size_t k = len - at < 32 ? len - at : 32;
            while (at + k < len && k > 1 && ((unsigned char)a[at + k] & 0xC0) == 0x80)
                k--;   /* not inside a character */
            json_t *pj = json_stringn(a + at, k);
            event(j, "content_block_delta", pj ? json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta",
                                                           "index", j->dia_blocks - 1, "delta", "type",
                                                           "input_json_delta", "partial_json", pj) : NULL);
            at += k;
        }
        block_stop(j);
    }
}

static void an_close(srv_job *j, int status, const char *msg)
{
    if (status != 200) {
        event(j, "error", jlm_srv_anth_error(status, msg));
        return;
    }
    const jlm_srv_result *r = &j->res;
    if (!j->dia_blocks)   /* nothing at all: one empty text block, as a reply without tools has */
        text_start(j);
    if (j->dia_open)
        block_stop(j);
    event(j, "message_delta", json_pack("{s:s, s:{s:s, s:o}, s:{s:I, s:I}}", "type", "message_delta", "delta",
                                        "stop_reason", jlm_srv_anth_stop_reason(r), "stop_sequence",
                                        r->stop_sequence ? json_string(r->stop_sequence) : json_null(), "usage",
                                        "input_tokens", (json_int_t)r->prompt_tokens, "output_tokens",
                                        (json_int_t)r->completion_tokens));
    event(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static json_t *an_whole(const srv_job *j)
{
    return jlm_srv_anth_message(&j->ident, j->out ? j->out : "", j->len, &j->res);
}

static const srv_dialect ANTHROPIC = {"text/event-stream", ": ping\n\n", an_open, an_piece, an_calls,
                                    an_close, an_whole, jlm_srv_anth_error};

enum MHD_Result jlm_srv_anthropic(struct jlm_srv *s, struct MHD_Connection *c, const char *body, size_t len)
{
    jlm_err err = {0};
    jlm_srv_req req;
    int rc = jlm_srv_dialect_parse(JLM_SRV_API_ANTHROPIC, body, len, &req, &err);
    if (rc)
        return jlm_srv_send_error(s, c, &ANTHROPIC, rc == JLM_ENOMEM ? 500 : 400, err.msg);
    return jlm_srv_submit(s, c, &req, &ANTHROPIC);
}
