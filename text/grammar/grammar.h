/* grammar.h - constrained decoding: GBNF grammars, JSON Schema -> GBNF, and
 * the per-step token mask.
 *
 * Owns: a compiled grammar (jlm_gram, immutable once parsed, shareable across
 * threads and requests), a byte trie over a vocabulary's token strings
 * (jlm_gram_vocab, immutable, shareable), and the matcher state of one
 * generation (jlm_gram_match, one thread).
 *
 * Syntax: llama.cpp's GBNF as llama-server takes it in a `grammar` field:
 *   name ::= alternatives          (one rule per line; `root` is the start)
 *   a b   sequence, a | b alternation, ( ... ) grouping,
 *   x* x+ x? x{m} x{m,} x{m,n}      repetition (m, n <= JLM_GRAM_MAX_REPEAT),
 *   "lit"  literal with \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH,
 *   [a-z0-9_] [^"\\]                character classes (ranges, negation),
 *   .      any character,   # comment to end of line.
 * A rule continues on the next line after `|` or inside parentheses.
 * Matching is over Unicode code points; token bytes are decoded as UTF-8 on
 * the fly, so a token ending inside a code point is allowed exactly when some
 * completion of that code point can continue the grammar. Bytes that are not
 * UTF-8 never match.
 *
 * Refused with one line "grammar: line L, column C: reason" (JLM_EFORMAT):
 * syntax errors, an undefined or twice-defined rule, no `root`, an empty
 * character class, a left-recursive rule (it would never consume input), a
 * rule that can never finish, and anything beyond the bounds below (size,
 * nesting, repetition counts, rules, elements).
 *
 * max_tokens-aware closing: every grammar position knows the fewest bytes
 * that finish the grammar from it. jlm_gram_mask, given the tokens left,
 * allows only tokens after which the rest can still be closed with one
 * single-byte token per byte (byte-level BPE and SPM byte-fallback vocabs
 * have those), so a reply always ends complete within its budget.
 *
 * Failure: constructors return 0 or JLM_E* with *err set and *out untouched.
 */
#ifndef JLM_GRAMMAR_H
#define JLM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"
#include "text/tokenizer/tokenizer.h"

#define JLM_GRAM_MAX_SRC     (1u << 20)  /* bytes of GBNF text */
#define JLM_GRAM_MAX_NEST    64          /* parentheses depth */
#define JLM_GRAM_MAX_REPEAT  1000        /* m and n of x{m,n} */
#define JLM_GRAM_MAX_ELEMS   (1u << 20)  /* compiled elements */
#define JLM_GRAM_MAX_RULES   65536
#define JLM_GRAM_MAX_STACK   1024        /* nesting the matcher follows */
#define JLM_GRAM_MAX_STACKS  4096        /* live parses the matcher follows */
#define JLM_GRAM_MAX_EXPAND  16384       /* rule stacks one step expands */

typedef struct jlm_gram jlm_gram;
typedef struct jlm_gram_vocab jlm_gram_vocab;
typedef struct jlm_gram_match jlm_gram_match;

/* Parses and compiles GBNF text (len bytes, NUL not needed). */
int  jlm_gram_parse(const char *src, size_t len, jlm_gram **out, jlm_err *err);
void jlm_gram_free(jlm_gram *g);   /* accepts NULL */
/* Fewest bytes a whole match of the grammar has. */
size_t jlm_gram_min_len(const jlm_gram *g);

/* JSON Schema (the text of one schema) -> GBNF text, malloc'd and
 * NUL-terminated. Supported: type (string, number, integer, boolean, null,
 * object, array, or a list of them), properties, required,
 * additionalProperties (false, or a schema when there are no properties),
 * items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf
 * (as anyOf), $ref to #/$defs/NAME or #/definitions/NAME, format (date, time,
 * date-time, uuid); annotations (title, description, $schema, $id, $comment,
 * default, examples) are ignored. Any other keyword is refused naming it
 * (JLM_EUNSUPPORTED), malformed JSON or values with JLM_EFORMAT. schema NULL:
 * any JSON object ({"type":"json_object"} of the OpenAI API). */
int jlm_gram_from_schema(const char *schema, size_t len, char **gbnf, jlm_err *err);

/* A byte trie over the token strings: pieces[i] (lens[i] bytes) is what token
 * i decodes to; is_eog[i] non-zero marks end-of-generation tokens. A non-EOG
 * token with an empty piece is never allowed. The arrays are copied. */
int  jlm_gram_vocab_new(uint32_t n, const char *const *pieces, const size_t *lens,
                        const uint8_t *is_eog, jlm_gram_vocab **out, jlm_err *err);
/* The same from a tokenizer (its pieces without specials, its EOG set). */
int  jlm_gram_vocab_from_tok(const jlm_tok *t, jlm_gram_vocab **out, jlm_err *err);
void jlm_gram_vocab_free(jlm_gram_vocab *v);   /* accepts NULL */

/* A matcher at the grammar's start; it borrows g (g must outlive it). */
int  jlm_gram_match_new(const jlm_gram *g, jlm_gram_match **out, jlm_err *err);
void jlm_gram_match_free(jlm_gram_match *m);   /* accepts NULL */
/* Sets logits[i] = -INFINITY for every token of v that cannot continue the
 * grammar from the current state (EOG tokens: unless the grammar can end
 * here). tokens_left >= 1: the tokens that may still be sampled, this one
 * included (EOG counted too); < 0: no budget. Returns how many tokens stay
 * allowed (0: the grammar is stuck, which a grammar that can finish and a
 * vocab with single-byte tokens cannot reach), or JLM_ENOMEM. */
long jlm_gram_mask(jlm_gram_match *m, const jlm_gram_vocab *v, int32_t tokens_left, float *logits);
/* Advances the state over token id's bytes; JLM_EINVAL (state unchanged) when
 * the token does not continue the grammar, JLM_ERANGE for an id outside the
 * vocab. An EOG token is accepted when the grammar can end. */
int  jlm_gram_accept(jlm_gram_match *m, const jlm_gram_vocab *v, int32_t id, jlm_err *err);
/* The same over raw bytes. */
int  jlm_gram_accept_bytes(jlm_gram_match *m, const char *bytes, size_t len, jlm_err *err);
/* 1 when what was accepted is a whole match of the grammar. */
int  jlm_gram_can_end(const jlm_gram_match *m);
/* Fewest bytes that would complete the grammar from here (0: can end). */
size_t jlm_gram_close_cost(const jlm_gram_match *m);

#endif
