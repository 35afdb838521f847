/* chat.h - rendering a chat template for a message list, as llama.cpp does.
 *
 * Owns: the variables llama.cpp b10359 gives a chat template
 * (common_chat_templates_apply with use_jinja): messages, bos_token,
 * eos_token, add_generation_prompt (defined only when true), enable_thinking,
 * tools (defined only when given),
 * datetime ("%b %d %Y" of now), date_string ("%d %b %Y" of now), plus the
 * interpreter's globals (strftime_now, raise_exception, namespace, range);
 * and llama.cpp's message adjustments:
 *   1. capability probes by trial renders (as minja's chat_template caps):
 *      requires_typed_content (string content not rendered, but
 *      [{type: text, text}] is) and supports_system_role (a system message's
 *      text appears in the output; a raising template does not support it);
 *   2. the developer role becomes system (not for gpt-oss templates); without
 *      a system role, a FIRST system message is merged into the next message
 *      (any role) as system + "\n" + content, or dropped when alone (llama.cpp
 *      b10359's workaround::system_message_not_supported);
 *   3. with typed content required, string contents become [{type: text, text}];
 *   4. gpt-oss templates (source contains "<|channel|>"): with
 *      add_generation_prompt false the last "<|return|>" of the prompt
 *      becomes "<|end|>".
 * A leading BOS is never stripped (llama.cpp does that only with a model
 * whose vocab adds BOS; callers that tokenize must do it themselves).
 *
 * Thread safety: all functions are reentrant. Memory: the caller frees *out
 * (and the strings of jlm_chat_template_from_model) with free().
 */
#ifndef JLM_CHAT_H
#define JLM_CHAT_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "base/jlm_err.h"
#include "format/jlm_format.h"

typedef struct jlm_chat_msg {
    const char *role;
    const char *content;
} jlm_chat_msg;

typedef struct jlm_chat_opts {
    int         add_generation_prompt;
    const char *bos_token, *eos_token;   /* NULL = "" */
    time_t      now;                     /* 0 = time(NULL) */
    int         local_time;              /* dates in local time (llama.cpp) instead of UTC */
    int         disable_thinking;        /* enable_thinking = false (llama.cpp default: true) */
    uint64_t    max_steps;               /* the interpreter's step budget; 0: JLM_JINJA_MAX_STEPS */
    int       (*cancelled)(void *arg);   /* NULL: never; see jlm_jinja_opts */
    void       *cancel_arg;
    const json_t *tools;                 /* the `tools` variable (OpenAI function list); NULL: undefined */
} jlm_chat_opts;

/* Renders template_src[0, len) for msgs[0, n) with llama.cpp's adjustments.
 * Template errors (syntax JLM_EFORMAT, raise_exception/type errors
 * JLM_EINVAL, JLM_EUNSUPPORTED, JLM_ERANGE for the interpreter's bounds
 * (jinja.h invariant 4: steps, output, memory), JLM_EIO when cancelled),
 * JLM_ENOMEM; *out untouched on error. A capability probe that hits a bound
 * ends the render with that error (the probes and the render share no
 * budget, so a render costs at most four budgets). */
int jlm_chat_render(const char *template_src, size_t len, const jlm_chat_msg *msgs, size_t n,
                    const jlm_chat_opts *opts, char **out, size_t *out_len, jlm_err *err);

/* Same with messages as a JSON array of objects (any fields: role, content
 * (string or parts), tool_calls, ...). adjust = 0 renders the bare template
 * on the unmodified messages (no probes, no polyfills, no gpt-oss fix).
 * JLM_EINVAL when messages is not an array of objects. */
int jlm_chat_render_json(const char *template_src, size_t len, const json_t *messages,
                         const jlm_chat_opts *opts, int adjust, char **out, size_t *out_len, jlm_err *err);

/* Reads the default chat template (name "") of a .jlm container and its BOS
 * and EOS token texts ("" when the vocab has none). JLM_ENOTFOUND when the
 * container has no default template; reader errors as jlm_fmt_open; *tmpl,
 * *bos, *eos untouched on error. */
int jlm_chat_template_from_model(const char *path, char **tmpl, char **bos, char **eos, jlm_err *err);
/* The same from a container already open (name: its path, for messages):
 * the engine's own vocab, so the template is the version the engine runs. */
int jlm_chat_template_from_vocab(const jlm_vocab *v, const char *name, char **tmpl, char **bos, char **eos,
                                 jlm_err *err);

#endif
