/* toolcall.h - tool calling: the request's `tools` / `tool_choice`, the
 * model family's call syntax, and a reply parsed back into OpenAI
 * `tool_calls`.
 *
 * Owns: which family a chat template speaks (jlm_tc_family_of), the
 * Hermes-style ChatML template a model without one is rendered with when a
 * request has tools, the messages as templates expect them (arguments as
 * objects), the parser of a reply (jlm_tc_parse: text in, content and calls
 * out), how much of a reply being generated is plain content for sure
 * (streaming), the GBNF that forces one call (tool_choice "required" or a
 * named function; the tools' parameter schemas through JSON Schema -> GBNF)
 * and the streamed deltas of parsed calls. The families (docs/serve.md):
 *   HERMES     <tool_call>{"name": N, "arguments": {...}}</tool_call> (Qwen, Hermes, ChatML)
 *   LLAMA3     {"name": N, "parameters": {...}}, optionally after <|python_tag|>
 *   MISTRAL    [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]
 *   MISTRAL_V11 [TOOL_CALLS]N[ARGS]{...} (also parsed in MISTRAL's place, and vice versa)
 *   GPTOSS     <|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}<|call|>
 *   GEMMA      <|tool_call>call:N{key:<|"|>text<|"|>,n:1}<tool_call|> (the
 *              arguments may also be a JSON object), and ```tool_code
 *              N(key="text", n=1)``` blocks
 *   GRANITE    <|tool_call|>[{"name": N, "arguments": {...}}, ...]
 * Knows nothing of HTTP or the engine: serve/ and the other APIs (Anthropic
 * tool_use blocks, ollama tool_calls) build their shapes from the calls.
 *
 * Thread safety: reentrant. Failure: JLM_EINVAL / JLM_EFORMAT /
 * JLM_EUNSUPPORTED with one line naming the field (for a 400), JLM_ENOMEM;
 * outputs untouched on error. The parser never fails on its input: what is
 * not a well-formed call stays content.
 */
#ifndef JLM_SERVE_TOOLCALL_H
#define JLM_SERVE_TOOLCALL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/jlm_err.h"

typedef enum jlm_tc_family {
    JLM_TC_NONE,        /* the template renders no tools */
    JLM_TC_HERMES,
    JLM_TC_LLAMA3,
    JLM_TC_MISTRAL,
    JLM_TC_MISTRAL_V11,
    JLM_TC_GPTOSS,
    JLM_TC_GEMMA,
    JLM_TC_GRANITE,
} jlm_tc_family;

typedef enum jlm_tc_choice {
    JLM_TC_AUTO,        /* the default with tools */
    JLM_TC_OFF,         /* "none": tools rendered, the reply not parsed */
    JLM_TC_REQUIRED,    /* one call of any tool, forced by the grammar */
    JLM_TC_NAMED,       /* one call of `name`, forced by the grammar */
} jlm_tc_choice;

/* A request's tool fields. tools NULL: none given (choice is then OFF). */
typedef struct jlm_tc_req {
    json_t        *tools;       /* the validated `tools` array (a reference) */
    jlm_tc_choice  choice;
    char          *name;        /* JLM_TC_NAMED: the function */
} jlm_tc_req;

/* The name of a family ("hermes", "llama3", ...). */
const char *jlm_tc_family_name(jlm_tc_family f);

/* The family a chat template's source speaks; JLM_TC_NONE when it renders
 * no tools. */
jlm_tc_family jlm_tc_family_of(const char *tmpl, size_t len);

/* The ChatML template with Hermes tools (a system block listing them,
 * <tool_call> JSON for assistant calls, <tool_response> for tool results)
 * rendered for a model without a template when a request has tools or tool
 * messages; its family is JLM_TC_HERMES. */
extern const char jlm_tc_chatml_tools[];

/* Reads `tools`, `tool_choice` and `parallel_tool_calls` of a request body
 * into *out (zeroed when there are no tools). Refused, naming the field:
 * tools not an array of {"type": "function", "function": {"name",
 * "description"?, "parameters"?}}, a name not [A-Za-z0-9_-]{1,64} or given
 * twice, parameters not a schema JSON Schema -> GBNF accepts (a keyword it
 * does not implement is refused only for "required" and named choices, which
 * need the grammar), tool_choice not one of "none", "auto", "required",
 * {"type": "function", "function": {"name"}} naming a given tool, a
 * tool_choice without tools. */
int  jlm_tc_req_parse(const json_t *body, jlm_tc_req *out, jlm_err *err);
void jlm_tc_req_free(jlm_tc_req *r);   /* accepts a zeroed one */

/* Checks the tool fields of messages (assistant `tool_calls`: objects with
 * function.name a string and function.arguments a string or an object; a
 * `tool` message's tool_call_id a string when given). JLM_EINVAL naming
 * messages[i]. */
int jlm_tc_check_messages(const json_t *messages, jlm_err *err);

/* A copy of messages as chat templates expect them (llama.cpp does the
 * same): each tool call's arguments string that is a JSON object becomes
 * that object. NULL on OOM. */
json_t *jlm_tc_messages_for_template(const json_t *messages);

/* A parsed reply. */
typedef struct jlm_tc_result {
    char   *content;    /* what is not a call, trimmed; malloc'd, NUL-terminated */
    size_t  content_len;
    json_t *calls;      /* [{"id", "type": "function", "function": {"name", "arguments": JSON text}}] */
} jlm_tc_result;

/* Parses text[0, len) of family f. Call ids are 9 letters and digits drawn
 * from *id_state (which advances), unique within a reply; arguments are the
 * compact JSON text of the arguments object. JLM_ENOMEM only. */
int  jlm_tc_parse(jlm_tc_family f, const char *text, size_t len, uint64_t *id_state, jlm_tc_result *out, jlm_err *err);
void jlm_tc_result_free(jlm_tc_result *r);   /* accepts a zeroed one */

/* How many bytes of text[0, len), a reply still being generated, are
 * content for sure: everything before the first place a call may start
 * (a marker, or a tail that may still grow into one). final: the reply is
 * complete (a partial marker at its end is content then). Whitespace before
 * the hold-back point is held too (it may be the layout before a call). */
size_t jlm_tc_content_prefix(jlm_tc_family f, const char *text, size_t len, int final);

/* GBNF that allows exactly one call, in f's syntax, of r's named tool
 * (JLM_TC_NAMED) or of any tool (JLM_TC_REQUIRED), its arguments following
 * the tool's parameters schema. *gbnf malloc'd. JLM_EUNSUPPORTED for a
 * family without tools or a schema keyword the converter lacks. */
int jlm_tc_grammar(jlm_tc_family f, const jlm_tc_req *r, char **gbnf, jlm_err *err);

/* The stream deltas of calls: for call i, {"tool_calls": [{"index": i, "id",
 * "type", "function": {"name", "arguments": ""}}]} and then its arguments
 * in pieces of at most piece bytes (whole UTF-8 characters)
 * {"tool_calls": [{"index": i, "function": {"arguments": "..."}}]}.
 * A new array of delta objects; NULL on OOM. */
json_t *jlm_tc_deltas(const json_t *calls, size_t piece);

#endif
