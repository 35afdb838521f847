/* tokenizer_int.h - what tokenizer.c, tok_pre.c, tok_regex.c and tok_model.c
 * share. Not a public API: nothing outside engine/tok*.c includes it.
 *
 * Code points are uint32_t; a "piece list" is a vector of lengths (in code
 * points) partitioning a code point array, exactly like llama.cpp's
 * bpe_offsets in unicode_regex_split.
 */
#ifndef JLM_TOK_INTERNAL_H
#define JLM_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer/tokenizer.h"

/* ---------------------------------------------------------------- growable vectors */
typedef struct tok_ids  { int32_t  *p; size_t n, cap; int oom; } tok_ids;
typedef struct tok_lens { size_t   *p; size_t n, cap; int oom; } tok_lens;
typedef struct tok_cpts { uint32_t *p; size_t n, cap; int oom; } tok_cpts;
typedef struct tok_sbuf { char     *p; size_t n, cap; int oom; } tok_sbuf;

void jlm_tok_ids_push(tok_ids *v, int32_t x);
void jlm_tok_lens_push(tok_lens *v, size_t x);
void jlm_tok_cpts_push(tok_cpts *v, uint32_t x);
void jlm_tok_sbuf_put(tok_sbuf *b, const void *p, size_t n);
void jlm_tok_sbuf_cpt(tok_sbuf *b, uint32_t cp);      /* appends cp as UTF-8 */

/* ---------------------------------------------------------------- unicode (tok_pre.c) */
/* Category flags as llama.cpp's unicode_cpt_flags; 0 means "outside the piece". */
enum {
    TF_UNDEF = 1u << 0, TF_NUMBER = 1u << 1, TF_LETTER = 1u << 2, TF_SEP = 1u << 3,
    TF_MARK = 1u << 4, TF_PUNCT = 1u << 5, TF_SYMBOL = 1u << 6, TF_CONTROL = 1u << 7,
    TF_WS = 1u << 8,
};
uint32_t jlm_tok_flags(uint32_t cp);
uint32_t jlm_tok_tolower(uint32_t cp);
uint32_t jlm_tok_nfd_first(uint32_t cp);             /* first code point of cp's NFD */
size_t   jlm_tok_utf8_len(uint8_t lead);              /* llama.cpp's unicode_len_utf8 */
/* Decodes like llama.cpp's unicode_cpts_from_utf8 (a bad byte -> U+FFFD, one byte consumed). */
void     jlm_tok_cpts_from_utf8(const char *s, size_t n, tok_cpts *out);
/* GPT-2 byte-level table: byte -> code point, and code point -> byte (-1 if none). */
uint32_t jlm_tok_byte_to_cpt(uint8_t b);
int      jlm_tok_cpt_to_byte(uint32_t cp);

/* ---------------------------------------------------------------- regex (tok_regex.c) */
typedef struct tok_rx tok_rx;
/* Compiles the regex subset of docs/tokenizer.md ("Regex stages"). JLM_EFORMAT
 * naming `what` on a syntax error, JLM_EUNSUPPORTED for a feature outside it. */
int  jlm_tok_rx_compile(const char *src, size_t len, const char *what, tok_rx **out, jlm_err *err);
void jlm_tok_rx_free(tok_rx *rx);
/* Splits every piece of *lens over cpts like unicode_regex_split_stl: each
 * match and each gap between matches becomes a piece. Returns 0 or JLM_ENOMEM. */
int  jlm_tok_rx_split(const tok_rx *rx, const uint32_t *cpts, const tok_lens *in, tok_lens *out);

/* ---------------------------------------------------------------- the tokenizer */
typedef struct tok_map { uint32_t mask; int32_t *slot; } tok_map;   /* open addressing, -1 empty */

typedef struct tok_stage {
    const jlm_preop *op;
    tok_rx *rx;            /* regex-backed stage; NULL for the hand-written Split matcher */
} tok_stage;

struct jlm_tok {
    const jlm_vocab *v;
    uint32_t  n_tokens;
    uint8_t  *kind;          /* (n_tokens,) jlm_token_kind, 0 = undefined */
    tok_map   tokmap;        /* token text -> id */
    tok_map   mergemap;      /* (left, right) -> rank (= merge index) */
    size_t    max_token_len; /* bytes */
    char     *pieces;        /* every token's piece (special rendering), NUL-separated */
    uint64_t *piece_off;     /* (n_tokens + 1,) */
    size_t    max_piece_len;
    uint32_t  n_special;     /* added tokens, longest content first */
    const jlm_added_token **special;
    uint32_t  n_stages;
    tok_stage *stages;
    int       byte_level;    /* a ByteLevel stage is present */
    int       wpm_lower, wpm_strip;
    int       nfc;          /* a Kind 5 stage with Behavior "nfc": text NFC-normalised first */
    int32_t   byte_tok[256]; /* SPM byte fallback: <0xNN>, else the 1-byte token, else -1 */
};

int32_t jlm_tok_lookup(const jlm_tok *t, const char *s, size_t n);            /* -1 if absent */
int32_t jlm_tok_merge_rank(const jlm_tok *t, const char *l, size_t ln, const char *r, size_t rn);

/* Pre-tokenizer (tok_pre.c): compile the stages; split text into words (byte-
 * encoded when a ByteLevel stage is present), appended to *words with their
 * byte lengths in *lens. */
int  jlm_tok_pre_build(jlm_tok *t, jlm_err *err);
void jlm_tok_pre_free(jlm_tok *t);
int  jlm_tok_pre_split(const jlm_tok *t, const char *text, size_t len, tok_sbuf *words, tok_lens *lens);

/* Models (tok_model.c): tokenize one raw fragment, appending to *out.
 * Return 0 or JLM_ENOMEM. */
int jlm_tok_spm(const jlm_tok *t, const char *text, size_t len, tok_ids *out);
int jlm_tok_bpe(const jlm_tok *t, const char *text, size_t len, tok_ids *out);
int jlm_tok_wpm(const jlm_tok *t, const char *text, size_t len, tok_ids *out);

#endif
