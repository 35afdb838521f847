/* utf8_fix.h - text from a model made valid UTF-8 before it is kept. */
#ifndef JLM_TEXT_TOKENIZER_UTF8_FIX_H
#define JLM_TEXT_TOKENIZER_UTF8_FIX_H

#include <stddef.h>

/* A malloc'd, NUL-terminated copy of s[0, n) in which every byte that does not
 * start a valid UTF-8 sequence (overlong, surrogate, > U+10FFFF, truncated,
 * stray continuation) is replaced by U+FFFD, one per bad byte as llama.cpp's
 * decoder counts them; an embedded NUL becomes U+FFFD too. NULL: out of memory. */
char *jlm_utf8_fix(const char *s, size_t n);

#endif
