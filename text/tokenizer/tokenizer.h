/* tokenizer.h - text <-> token ids for the three vocab kinds of the .jlm vocab
 * record (jlm-format.md 4.3): SentencePiece-style SPM, byte-level BPE and
 * WordPiece (BERT). Reproduces llama.cpp's tokenizers (llama-vocab.cpp,
 * unicode.cpp); docs/tokenizer.md says exactly how, stage by stage.
 *
 * Owns: the token/merge hash maps, the pre-tokenizer stages compiled from the
 * record's PreOp list (jlm_preop), the special-token partition, the piece
 * cache and the streaming detokenizer.
 * Must not know: GGUF, tokenizer.json or pre-tokenizer family names. Every
 * family decision was made at conversion (converter/vocab.c) and arrives here
 * as PreOp stages and flags.
 *
 * Invariants:
 *  (1) A jlm_tok borrows its jlm_vocab: the vocab (and whatever arena holds
 *      its strings) must outlive the tokenizer. Nothing in it is modified.
 *  (2) After jlm_tok_create succeeds, every id the tokenizer can emit lies in
 *      [0, n_tokens): special ids, added-token ids and byte-fallback ids were
 *      all checked at create time, so encode never fails on vocab data.
 *  (3) Token texts are unique (a duplicate is refused at create), so text ->
 *      id is a function, as in llama.cpp.
 *
 * Thread safety: a jlm_tok is immutable after create; encode, piece and
 * decode may be called from any number of threads at once. A jlm_tok_stream
 * belongs to one caller.
 * Memory: arrays returned by encode/decode are malloc'd and owned by the
 * caller (free()). Pieces returned by jlm_tok_piece live as long as the
 * tokenizer.
 */
#ifndef JLM_TOKENIZER_H
#define JLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"
#include "format/jlm_format.h"

typedef struct jlm_tok jlm_tok;

/* Builds a tokenizer for v (borrowed, invariant 1). Checks every id, token
 * string, merge and PreOp; compiles regex stages. JLM_EFORMAT for a record a
 * tokenizer cannot be built from (duplicate token text, id out of range, a
 * Behavior pattern that does not parse), JLM_EUNSUPPORTED for a vocab kind or
 * PreOp this engine does not implement (kind 0 or 4, a regex feature outside
 * docs/tokenizer.md), JLM_ENOMEM. *out untouched on error. */
int  jlm_tok_create(const jlm_vocab *v, jlm_tok **out, jlm_err *err);
void jlm_tok_destroy(jlm_tok *t);   /* accepts NULL */

uint32_t jlm_tok_n_tokens(const jlm_tok *t);        /* cannot fail */
const jlm_vocab *jlm_tok_vocab(const jlm_tok *t);   /* cannot fail */
/* 1 if id ends generation: EOS or one of the vocab's Stop ids. Cannot fail. */
int jlm_tok_is_eog(const jlm_tok *t, int32_t id);

/* Tokenizes text[0, len) (any bytes; invalid UTF-8 is handled as llama.cpp
 * does). add_special: prepend BOS if the vocab's AddBOS, append EOS (SPM,
 * BPE) or SEP (WPM) if its AddEOS. parse_special: text equal to a special
 * added token (control/unknown) becomes that token; user-defined added tokens
 * are always split out first, as in llama.cpp. *ids is malloc'd (NULL when
 * *n == 0); the caller frees it. JLM_ENOMEM, JLM_EINVAL (text NULL with
 * len > 0); *ids and *n untouched on error. */
int jlm_tok_encode(const jlm_tok *t, const char *text, size_t len, int add_special,
                   int parse_special, int32_t **ids, size_t *n, jlm_err *err);

/* The bytes token `id` stands for: SPM/WPM U+2581 rendered as a space, <0xNN>
 * byte tokens as the raw byte, byte-level BPE tokens decoded through GPT-2's
 * byte<->unicode table. Control and unknown tokens give "" unless `special`,
 * then their text. *piece points into the tokenizer (not NUL-terminated
 * unless *len is taken into account; it is NUL-terminated in fact).
 * JLM_ERANGE for an id outside [0, n_tokens); outputs untouched then. */
int jlm_tok_piece(const jlm_tok *t, int32_t id, int special, const char **piece,
                  size_t *len, jlm_err *err);

/* Longest piece of any token, in bytes. Cannot fail. */
size_t jlm_tok_max_piece_len(const jlm_tok *t);

/* Concatenates the pieces of ids[0, n) like llama.cpp's detokenize with
 * remove_special = false: when the vocab has AddSpacePrefix, one leading space
 * of the first token's piece is dropped. No clean-up of spaces is applied (the
 * record does not carry clean_up_tokenization_spaces). *text is malloc'd and
 * NUL-terminated; *len excludes the NUL. JLM_ERANGE for a bad id, JLM_ENOMEM;
 * outputs untouched on error. */
int jlm_tok_decode(const jlm_tok *t, const int32_t *ids, size_t n, int special,
                   char **text, size_t *len, jlm_err *err);

/* ---------------------------------------------------------------- streaming */
/* Detokenizes one id at a time for a generator printing as it goes. A UTF-8
 * sequence split across tokens is held back until it is complete, so every
 * chunk handed out ends on a character boundary (bytes that can never become
 * valid UTF-8 are passed through at once). At most 3 bytes are held. */
typedef struct jlm_tok_stream {
    const jlm_tok *tok;
    uint8_t  held[4];
    uint8_t  n_held;
    uint8_t  special;       /* render control tokens */
    uint8_t  strip_space;   /* drop one leading space of the next piece */
} jlm_tok_stream;

/* strip_leading_space: drop one leading space of the first piece (what decode
 * does for an AddSpacePrefix vocab when the first id is not BOS). Cannot fail. */
void jlm_tok_stream_init(jlm_tok_stream *s, const jlm_tok *t, int special, int strip_leading_space);

/* Appends the bytes now complete to out[0, cap) and sets *n_out. cap must be at
 * least jlm_tok_max_piece_len(t) + 4 to be always enough. JLM_ERANGE for a bad
 * id or too small a buffer; the stream state and outputs are untouched then. */
int jlm_tok_stream_feed(jlm_tok_stream *s, int32_t id, char *out, size_t cap,
                        size_t *n_out, jlm_err *err);

/* Hands out whatever is still held (an incomplete sequence at end of text):
 * writes at most 3 bytes to out and returns how many. Cannot fail. */
size_t jlm_tok_stream_flush(jlm_tok_stream *s, char out[4]);

#endif
