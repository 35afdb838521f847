/* api.h - the OpenAI request and response shapes of `jlm serve`.
 *
 * Owns: parsing and validating a request body of POST /v1/completions and
 * POST /v1/chat/completions into a jlm_srv_req, and building the JSON the
 * server sends back (completion objects, stream chunks, error objects, the
 * model list). Knows nothing of HTTP, models or the engine beyond the
 * sampler's parameter struct, so it is fuzzed on its own
 * (tests/fuzz/fuzz_serve_req.c).
 *
 * Which fields are accepted, their ranges and defaults: docs/serve.md.
 * Unknown fields are ignored (clients send `user`, `metadata`, ...); a known
 * field of the wrong type or out of range is refused with a message naming
 * it, as OpenAI does, and so is an OpenAI field that would change the
 * output and is not implemented (`logit_bias`, `best_of` > 1, `audio`, ...).
 *
 * Thread safety: reentrant. Memory: jlm_srv_req_free releases what parse
 * filled; every builder returns a new reference (json_decref) or a malloc'd
 * string (free).
 */
#ifndef JLM_SERVE_API_H
#define JLM_SERVE_API_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/sampler.h"
#include "base/jlm_err.h"
#include "serve/toolcall.h"

#define JLM_SRV_MAX_STOP     4      /* OpenAI's limit on `stop` strings */
#define JLM_SRV_MAX_STOP_LEN 256    /* bytes of one stop string */
#define JLM_SRV_MAX_TOKENS   1000000
#define JLM_SRV_MAX_N        8      /* choices per request (`n`) */

/* EMBED: /v1/embeddings and ollama's /api/embed (serve/dialect.h) */
typedef enum jlm_srv_kind { JLM_SRV_COMPLETION, JLM_SRV_CHAT, JLM_SRV_EMBED } jlm_srv_kind;

typedef struct jlm_srv_req {
    jlm_srv_kind kind;
    char   *model;                      /* NULL: not given */
    char   *prompt;                     /* completions: the prompt text */
    json_t *messages;                   /* chat: the validated message array (a reference) */
    int64_t max_tokens;                 /* -1: not given */
    int     n;                          /* choices, 1..JLM_SRV_MAX_N */
    jlm_samp_params samp;               /* llama.cpp defaults, then the request's fields */
    int     seeded;                     /* 1: `seed` was given */
    char   *stop[JLM_SRV_MAX_STOP];
    size_t  n_stop;
    int     stream, include_usage;
    int     ignore_eos;                 /* llama-server's extension: generate through EOS */
    int     echo;                       /* completions: the prompt sent before the generated text */
    int     logprobs;                   /* 1: report each token's log-probability */
    int     top_logprobs;               /* and this many most likely alternatives (<= 20) */
    /* not parsed: set by the server. Nonzero stops rendering the chat
     * template (the client went away, or the server drains). NULL: never. */
    int   (*cancelled)(void *arg);
    void   *cancel_arg;
    struct jlm_gram *gram;              /* grammar / json_schema / response_format compiled (serve/constrain.h); NULL: none */
    jlm_tc_req tc;                      /* chat: tools and tool_choice (serve/toolcall.h) */
    uint8_t *image;                     /* chat: the image_url part's bytes (its data: URI decoded); NULL: none */
    size_t   image_len;
    char     image_what[64];            /* that part, "messages[I].content[K]", for errors */
    /* EMBED (serve/dialect.h) */
    json_t *inputs;                     /* a non-empty array of strings, or of non-empty token id arrays */
    int     pool_last;                  /* 1: the last token's hidden state; 0: the mean */
    int     base64;                     /* encoding_format "base64" */
} jlm_srv_req;

/* Parses body[0, len) (not NUL-terminated) for kind. JLM_EFORMAT for a body
 * that is not a JSON object, JLM_EINVAL for a missing, mistyped or
 * out-of-range field, JLM_EUNSUPPORTED for a field this server does not
 * implement with the value given (best_of > 1, logit_bias); the message names the
 * field. *req is written only on success. */
int  jlm_srv_req_parse(const char *body, size_t len, jlm_srv_kind kind, jlm_srv_req *req, jlm_err *err);
/* The same on a parsed object o (the other APIs translate theirs into the
 * OpenAI shape, serve/dialect.h); o is not taken. */
int  jlm_srv_req_parse_obj(json_t *o, jlm_srv_kind kind, jlm_srv_req *req, jlm_err *err);
void jlm_srv_req_free(jlm_srv_req *req);   /* accepts a zeroed req */

/* What a generation reports at its end. */
typedef struct jlm_srv_result {
    const char *finish_reason;          /* "stop", "length" or "tool_calls" */
    uint32_t    prompt_tokens, completion_tokens;
    uint32_t    cached_tokens;          /* prompt tokens whose KV came from the prefix cache */
    const json_t *tool_calls;           /* chat: the calls parsed from the reply (toolcall.h); NULL or []: none */
    const char *stop_sequence;          /* the stop string that ended it (in the request); NULL: none */
} jlm_srv_result;

/* Identity shared by every object of one response. */
typedef struct jlm_srv_ident {
    char        id[48];                 /* "cmpl-<hex>" or "chatcmpl-<hex>" */
    int64_t     created;                /* unix seconds */
    const char *model;
    jlm_srv_kind kind;
    int         index;                  /* the choice a job generates (`n` > 1) */
} jlm_srv_ident;

/* A whole (non-streamed) completion object with text and usage (chat: and
 * r->tool_calls, content null when the text is empty). NULL on OOM. */
json_t *jlm_srv_json_completion(const jlm_srv_ident *id, const char *text, size_t len, const jlm_srv_result *r);
/* One stream chunk: text[0, len) as the choice's text or delta content;
 * role != 0 adds the chat delta's "role"; r != NULL makes it the closing
 * chunk (empty delta, finish_reason). NULL on OOM. */
json_t *jlm_srv_json_chunk(const jlm_srv_ident *id, const char *text, size_t len, int role, const jlm_srv_result *r);
/* A chat stream chunk with the given delta object (taken), "role" added when
 * role != 0. NULL on OOM. */
json_t *jlm_srv_json_delta_chunk(const jlm_srv_ident *id, json_t *delta, int role);
/* The usage-only chunk sent when stream_options.include_usage is true. */
json_t *jlm_srv_json_usage_chunk(const jlm_srv_ident *id, const jlm_srv_result *r);
/* {"error": {"message", "type", "param": null, "code"}}: type from the HTTP
 * status (400 invalid_request_error, 401 authentication_error, 404
 * not_found_error, 413 request_too_large, 503 server_busy, else
 * server_error). NULL on OOM. */
json_t *jlm_srv_json_error(int status, const char *message);
/* Log-probabilities. One generated token's entry, in the chat shape
 * {token, logprob, bytes, top_logprobs: []}; NULL on OOM. */
json_t *jlm_srv_json_lp_entry(const char *tok, size_t len, double lp);
/* Appends an alternative {token, logprob, bytes} to entry's top_logprobs. */
int     jlm_srv_json_lp_add_top(json_t *entry, const char *tok, size_t len, double lp);
/* The choice's "logprobs" for entries (taken): chat {"content": entries};
 * completions {tokens, token_logprobs, top_logprobs, text_offset}, offsets
 * counted from *offset, which advances by the tokens' bytes. NULL on OOM. */
json_t *jlm_srv_json_logprobs(jlm_srv_kind kind, json_t *entries, size_t *offset);
/* Sets choices[0].logprobs of a completion or chunk to lp (taken). */
void    jlm_srv_json_set_logprobs(json_t *obj, json_t *lp);

/* A JSON string of text[0, len), every invalid UTF-8 sequence replaced by
 * U+FFFD (the rule for every text the server sends). NULL on OOM. */
json_t *jlm_srv_json_text(const char *text, size_t len);

/* "data: <compact json>\n\n", malloc'd; NULL on OOM. */
char   *jlm_srv_sse(const json_t *j, size_t *len);

/* 1 if a[0, na) equals b[0, nb), in time that depends only on na and nb
 * (for the API key). Cannot fail. */
int jlm_srv_key_equal(const char *a, size_t na, const char *b, size_t nb);

/* Stop strings: the length of text[0, len) that may be sent now, holding back
 * a tail that could still grow into a stop string, cut back to a UTF-8
 * character start; when one occurs, the returned length is where the first
 * stop string begins and *hit = 1 + its index in req->stop (the earlier one
 * in the list where two begin there), else *hit = 0. Cannot fail. */
size_t jlm_srv_stop_scan(const jlm_srv_req *req, const char *text, size_t len, int final, int *hit);

#endif
