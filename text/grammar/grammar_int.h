/* grammar_int.h - the compiled grammar, shared by gbnf.c (the compiler) and
 * match.c (the matcher). Not for other modules. */
#ifndef JLM_GRAMMAR_INT_H
#define JLM_GRAMMAR_INT_H

#include <stdint.h>

#include "text/grammar/grammar.h"

enum { GE_END, GE_ALT, GE_REF, GE_CHR };   /* element kinds */

/* One element: GE_REF v = rule id, GE_CHR v = class id. Each rule is its
 * alternatives one after another, each closed by GE_ALT, the last by GE_END. */
typedef struct jlm_gram_el { uint32_t t, v; } jlm_gram_el;

#define JLM_GRAM_INF UINT32_MAX

struct jlm_gram {
    jlm_gram_el *el;       /* (n_el,) */
    uint32_t     n_el;
    uint32_t    *rule;     /* (n_rules,) index of each rule's first element */
    uint32_t     n_rules, root;
    uint32_t    *cls;      /* (n_cls + 1,) offsets into rng, in pairs */
    uint32_t    *rng;      /* sorted disjoint inclusive [lo, hi] code point pairs */
    uint32_t     n_cls;
    uint32_t    *dist;     /* (n_el,) fewest bytes from this element to its alternative's end */
    uint32_t    *rmin;     /* (n_rules,) fewest bytes of a match of the rule */
};

static inline int jlm_gram_is_end(const jlm_gram_el *e) { return e->t == GE_END || e->t == GE_ALT; }

#endif
