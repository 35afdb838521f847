/* dialect.h - the request and response shapes of the APIs `jlm serve`
 * answers beside OpenAI's completions (serve/api.h): OpenAI's
 * /v1/embeddings, Anthropic's /v1/messages and ollama's /api/chat,
 * /api/generate and /api/embed.
 *
 * Owns: parsing a request body of each into a jlm_srv_req. The generation
 * requests are translated into the OpenAI chat / completion shape and parsed
 * by jlm_srv_req_parse_obj, so their fields are checked once; what only the
 * other API has is checked here, with messages naming that API's field
 * ('stop_sequences', 'options.num_predict'). A field that would change the
 * output and is not implemented is refused (JLM_EUNSUPPORTED) naming it;
 * informational ones (metadata, keep_alive, ollama's runtime options) are
 * accepted. Knows nothing of HTTP, models or the engine, so it is fuzzed
 * with the OpenAI parser (tests/fuzz/fuzz_serve_req.c).
 *
 * Message conversion (Anthropic): each content block goes through one
 * switch on its type (anth_block in dialect.c); text blocks become OpenAI
 * text parts, an assistant turn's tool_use blocks its tool_calls (input ->
 * the arguments' JSON text), a user turn's tool_result blocks `tool`
 * messages (in their place among its text); image blocks are refused (400).
 * Anthropic's tools and tool_choice (auto, any = required, tool = a named
 * function, none) and ollama's tools (OpenAI's shape), assistant tool_calls
 * (arguments objects) and `tool` messages become OpenAI's fields, so the
 * chat template and toolcall.h see one shape. `grammar` (llama-server's
 * GBNF field) is taken by /v1/messages and /api/chat too.
 *
 * Thread safety: reentrant. Memory: as api.h (jlm_srv_req_free; builders
 * return new references).
 */
#ifndef JLM_SERVE_DIALECT_H
#define JLM_SERVE_DIALECT_H

#include <stddef.h>

#include <jansson.h>

#include "serve/api.h"

#define JLM_SRV_MAX_INPUTS 2048     /* inputs of one embeddings request (OpenAI's limit) */

typedef enum jlm_srv_api {
    JLM_SRV_API_EMBED,              /* OpenAI /v1/embeddings */
    JLM_SRV_API_ANTHROPIC,          /* /v1/messages */
    JLM_SRV_API_OLLAMA_CHAT,        /* /api/chat */
    JLM_SRV_API_OLLAMA_GENERATE,    /* /api/generate */
    JLM_SRV_API_OLLAMA_EMBED,       /* /api/embed */
} jlm_srv_api;

/* Parses body[0, len) of api into *req (kind CHAT, COMPLETION for ollama's
 * raw generate, or EMBED). Errors as jlm_srv_req_parse: JLM_EFORMAT (not a
 * JSON object), JLM_EINVAL (missing, mistyped, out of range),
 * JLM_EUNSUPPORTED (not implemented); the message names the field. ollama's
 * `stream` defaults to true; its model names may end in ":latest" (dropped).
 * *req written only on success. */
int jlm_srv_dialect_parse(jlm_srv_api api, const char *body, size_t len, jlm_srv_req *req, jlm_err *err);

/* The model name an ollama client sends, without a ":latest" tag; malloc'd
 * (NULL on OOM). */
char *jlm_srv_ollama_name(const char *name);

/* Anthropic's error body {"type": "error", "error": {"type", "message"}}:
 * type from the status (400 invalid_request_error, 401
 * authentication_error, 404 not_found_error, 413 request_too_large, 429
 * rate_limit_error, 503 overloaded_error, else api_error). */
json_t *jlm_srv_anth_error(int status, const char *msg);
/* Anthropic's stop_reason for a result: tool_use (it has tool calls),
 * stop_sequence, max_tokens, end_turn. */
const char *jlm_srv_anth_stop_reason(const jlm_srv_result *r);
/* A whole Anthropic message object {id, type: message, role, model,
 * content: [{type: text, text}, {type: tool_use, ...}...], stop_reason,
 * stop_sequence, usage}; the text block only when there is text (r given). */
json_t *jlm_srv_anth_message(const jlm_srv_ident *id, const char *text, size_t len, const jlm_srv_result *r);
/* The tool_use block of a parsed call (serve/toolcall.h) {type: tool_use,
 * id: "toolu_" + its id, name, input: its arguments object ({} if empty)}. */
json_t *jlm_srv_anth_tool_use(const json_t *call, int empty);
/* ollama's message.tool_calls of parsed calls: [{id, function: {index,
 * name, arguments: object}}]. NULL on OOM. */
json_t *jlm_srv_ollama_calls(const json_t *calls);
/* "event: NAME\ndata: <compact json>\n\n" of data (taken), malloc'd. */
char   *jlm_srv_sse_event(const char *name, json_t *data, size_t *len);
/* ollama's error body {"error": msg}. */
json_t *jlm_srv_ollama_error(int status, const char *msg);

#endif
