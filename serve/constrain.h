/* constrain.h - the constraint fields of a request body -> a compiled
 * grammar (text/grammar/grammar.h): llama-server's `grammar` (GBNF text) and
 * `json_schema` (a schema object), OpenAI's `response_format` ({"type":
 * "text"}, {"type": "json_object"} with an optional llama-server `schema`,
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}).
 *
 * Knows nothing of HTTP or the engine; the generation loop masks each step
 * with the result (docs/grammar.md, "Using it from a server").
 *
 * Thread safety: reentrant. Failure: every error is one line naming the
 * field (for a 400): JLM_EINVAL for a mistyped field or two constraints at
 * once, JLM_EFORMAT for a malformed grammar or schema, JLM_EUNSUPPORTED for
 * a schema keyword the converter does not implement; *out untouched then.
 */
#ifndef JLM_SERVE_CONSTRAIN_H
#define JLM_SERVE_CONSTRAIN_H

#include <jansson.h>

#include "base/jlm_err.h"
#include "text/grammar/grammar.h"

/* *out: the compiled grammar (jlm_gram_free), or NULL when body asks for no
 * constraint. */
int jlm_srv_constraint(json_t *body, jlm_gram **out, jlm_err *err);

#endif
