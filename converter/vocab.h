/* vocab.h - GGUF tokenizer metadata -> the .jlm vocab record (jlm_vocab).
 *
 * Owns: reading tokenizer.ggml.* and tokenizer.chat_template* from a GGUF,
 * applying llama.cpp's defaults for every key a file lacks (llama_vocab::
 * impl::load), and resolving the pre-tokenizer family name
 * (tokenizer.ggml.pre) into the PreOp stage list the engine interprets
 * (docs/tokenizer.md lists every accepted name and its stages).
 * Must not know: how stages run (text/tokenizer/tokenizer.c), the record's bytes
 * (format/).
 *
 * Invariants of a jlm_vocab it fills:
 *  (1) Every string (tokens, merges, added-token contents, templates, pre
 *      name) lives in the arena or is a static literal, NUL-terminated, with
 *      len; nothing points into the jlm_gguf, which may be closed afterwards.
 *  (2) Token texts are unique and non-empty (an empty GGUF token becomes
 *      "[EMPTY_<id>]" as llama.cpp names it); every id in it lies in
 *      [-1, n_tokens) (special ids) or [0, n_tokens) (added, stop).
 *  (3) Merges keep GGUF order, so a pair's rank is its index; a merge line
 *      without a space after its first byte becomes ("", "") as in llama.cpp.
 *  (4) When Stop is non-empty, PunctNoNewline has one (zero) entry per PreOp,
 *      as the record's tail rule requires.
 * Thread safety: none needed (pure function of its inputs).
 */
#ifndef JLM_CONV_VOCAB_H
#define JLM_CONV_VOCAB_H

#include "base/jlm_err.h"
#include "format/jlm_format.h"
#include "converter/gguf.h"

/* Fills *out from g's tokenizer keys; every allocation comes from a.
 * JLM_ENOTFOUND if tokenizer.ggml.model or .tokens (or .merges for gpt2) is
 * missing; JLM_EUNSUPPORTED for a tokenizer model other than llama, gpt2,
 * bert (and none/no_vocab, which gives kind 0 with no tokens) or a
 * tokenizer.ggml.pre not in docs/tokenizer.md, naming it; JLM_EFORMAT for a
 * key of the wrong type, a short scores/token_type array, a duplicate token,
 * AddBOS/AddEOS without the id; JLM_ENOMEM. *out untouched on error. */
int jlm_conv_vocab(const jlm_gguf *g, jlm_arena *a, jlm_vocab *out, jlm_err *err);

#endif
