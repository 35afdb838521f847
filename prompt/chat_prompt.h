/* chat_prompt.h - the chat template a conversation is rendered with, shared by
 * `jlm chat` and `jlm serve` so both render a prompt the same way.
 *
 * Thread safety: reentrant. Memory: the caller frees the strings.
 */
#ifndef JLM_CHAT_PROMPT_H
#define JLM_CHAT_PROMPT_H

#include "base/jlm_err.h"
#include "format/jlm_format.h"

/* The default template of v (the open container's vocab; path names it)
 * with its BOS and EOS texts, or, when it has none, chatml with the vocab's
 * BOS/EOS texts (llama.cpp falls back to chatml too) and *fallback = 1.
 * JLM_ENOMEM; outputs written only on success. */
int jlm_chat_template_or_chatml(const char *path, const jlm_vocab *v, char **tmpl, char **bos, char **eos,
                                int *fallback, jlm_err *err);

#endif
