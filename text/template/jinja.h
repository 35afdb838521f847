/* jinja.h - a Jinja2 interpreter for chat templates.
 *
 * Owns: parsing a template (Jinja2 3.1 syntax with the Hugging Face
 * transformers settings trim_blocks, lstrip_blocks, one trailing newline
 * dropped) and rendering it with variables given as a JSON object. Knows
 * nothing of chat messages or models (text/template/chat.h adds those).
 *
 * Invariants:
 *   1. Output is Python Jinja2's output for the same template and variables,
 *      or an error: a construct the interpreter does not implement (filter,
 *      test, tag, method, format spec) fails with JLM_EUNSUPPORTED naming it
 *      and the template line; it is never skipped or approximated.
 *   2. Values follow Python: str(None) == "None", True/False, float repr,
 *      list/dict repr; tojson is json.dumps(ensure_ascii=False) with
 *      separators (", ", ": ") (or "," + newline with indent) and keys in
 *      insertion order, as transformers' and llama.cpp's tojson.
 *   3. Undefined is jinja2.Undefined: renders "", is falsy, iterates empty,
 *      and raises on attribute access, call or arithmetic.
 *   4. Bounds: at most 256 MiB of interpreter memory, 64 MiB of output (and
 *      of any one string value; opts->max_out may lower it),
 *      JLM_JINJA_MAX_STEPS steps (an expression evaluated, a statement run,
 *      a loop iteration, a list item made, walked or compared, 256 bytes of
 *      a string made, scanned or compared: under a few seconds of work), expressions,
 *      variables and values printed, ordered or given to tojson nested 200
 *      deep (a list or namespace that holds itself is an error), evaluation (statements, calls,
 *      macros, recursion) nested 2000 deep, range() of 100000 items:
 *      JLM_ERANGE beyond, naming the bound. A render whose opts->cancelled
 *      returns nonzero (asked every JLM_JINJA_CANCEL_EVERY steps) stops with
 *      JLM_EIO "rendering cancelled". So every render ends within a few
 *      seconds, whatever the template.
 *
 * Globals always defined: range, namespace, dict, raise_exception(msg)
 * (fails with JLM_EINVAL and the message), strftime_now(fmt) (C strftime of
 * opts->now). Everything else comes from vars.
 *
 * Thread safety: a parsed jlm_jinja is immutable; any number of threads may
 * render it at once. Memory: the caller frees *out with free().
 */
#ifndef JLM_JINJA_H
#define JLM_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "base/jlm_err.h"

typedef struct jlm_jinja jlm_jinja;

/* Parses src[0, len). Syntax errors: JLM_EFORMAT; unsupported tags (include,
 * extends, import, block, recursive loops): JLM_EUNSUPPORTED; JLM_ENOMEM.
 * Messages give "template line N: ...". *out untouched on error. */
int  jlm_jinja_parse(const char *src, size_t len, jlm_jinja **out, jlm_err *err);
void jlm_jinja_free(jlm_jinja *t);   /* accepts NULL */

#define JLM_JINJA_MAX_STEPS   10000000ull     /* the default step budget */
#define JLM_JINJA_MAX_OUT     ((size_t)64 << 20)   /* output bytes, and bytes of one string */
#define JLM_JINJA_CANCEL_EVERY 65536        /* steps between two calls of opts->cancelled */

typedef struct jlm_jinja_opts {
    time_t   now;          /* the clock for strftime_now; 0 = time(NULL) */
    int      local_time;   /* 1: strftime_now formats local time (llama.cpp); 0: UTC */
    uint64_t max_steps;    /* step budget; 0: JLM_JINJA_MAX_STEPS */
    size_t   max_out;      /* output (and string) bytes; 0 or more than JLM_JINJA_MAX_OUT: that */
    int    (*cancelled)(void *arg);   /* NULL: never; nonzero: stop (the caller's request went away) */
    void    *cancel_arg;
} jlm_jinja_opts;

/* Renders t with the members of the JSON object vars (NULL = none) as
 * variables. opts may be NULL (current time, UTC, default budget). On
 * success *out is a malloc'ed NUL-terminated string of *out_len bytes.
 * Errors (JLM_EINVAL for raise_exception, undefined misuse and type errors;
 * JLM_EUNSUPPORTED; JLM_ERANGE for a bound of invariant 4; JLM_EIO when
 * cancelled; JLM_ENOMEM) leave *out untouched. */
int  jlm_jinja_render(const jlm_jinja *t, const json_t *vars, const jlm_jinja_opts *opts,
                      char **out, size_t *out_len, jlm_err *err);

/* Parse + render in one call. Same failure contract as the two above. */
int  jlm_jinja_render_src(const char *src, size_t len, const json_t *vars, const jlm_jinja_opts *opts,
                          char **out, size_t *out_len, jlm_err *err);

#endif
