/* sampler.h - choosing the next token from logits (llama.cpp semantics).
 *
 * Owns: the candidate buffer, the history of the last N accepted tokens and
 * the RNG state (no globals). Knows nothing of models or the vocabulary
 * beyond its size.
 *
 * The chain, in llama.cpp's common default order where the order matters:
 *     penalties -> top-k -> top-p -> min-p -> temperature -> dist
 * temp <= 0 is greedy: penalties, then the first maximum (lowest id on ties,
 * as llama.cpp's greedy sampler). Each step is also callable on its own on a
 * jlm_samp_cands array, so tests can check exactly which candidates survive.
 *
 * Semantics of each step (llama.cpp src/llama-sampling.cpp):
 *   penalties   for each token seen c > 0 times in the last N accepted:
 *               logit <= 0 ? logit * repeat : logit / repeat, then
 *               logit -= c * freq + present. No-op when N == 0 or
 *               (repeat == 1, freq == 0, present == 0).
 *   top-k       k <= 0: no-op; else sort descending, keep min(k, n).
 *   top-p       p >= 1: no-op; else softmax, keep the shortest prefix of the
 *               sorted candidates whose probability sum >= p (and >= min_keep).
 *   min-p       p <= 0: no-op; keep logit >= max_logit + ln(p) (that is,
 *               prob >= p * max prob), at least min_keep (sorted fallback).
 *   temperature t <= 0: keep only the first maximum (others -inf); else /= t.
 *   dist        softmax; pick the first candidate i, in the current order,
 *               whose running sum of exp(logit - max) >= u * total.
 * Ties in sorting are broken by lower id first, so results are reproducible.
 * The draw u in [0, 1) is an argument; jlm_samp_next draws it from the RNG.
 *
 * Thread safety: a sampler belongs to one thread. Memory: the sampler owns
 * its buffers; jlm_samp_destroy accepts NULL.
 */
#ifndef JLM_SAMPLER_H
#define JLM_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"

/* ---------------------------------------------------------------- RNG */
/* splitmix64: a 64-bit state, full period, good equidistribution. */
typedef struct jlm_samp_rng { uint64_t s; } jlm_samp_rng;
void     jlm_samp_rng_seed(jlm_samp_rng *r, uint64_t seed);
uint64_t jlm_samp_rng_u64(jlm_samp_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double   jlm_samp_rng_uniform(jlm_samp_rng *r);

/* ---------------------------------------------------------------- candidates */
typedef struct jlm_samp_cand { int32_t id; float logit; float p; } jlm_samp_cand;
typedef struct jlm_samp_cands {
    jlm_samp_cand *data;   /* (n,) */
    size_t         n;
    int            sorted; /* 1: descending by logit, ties by id */
} jlm_samp_cands;

/* Each step edits c in place as described above. Cannot fail. */
void    jlm_samp_penalties(jlm_samp_cands *c, const int32_t *last, size_t n_last,
                           float repeat, float freq, float present);
void    jlm_samp_top_k(jlm_samp_cands *c, int32_t k);
void    jlm_samp_top_p(jlm_samp_cands *c, float p, size_t min_keep);
void    jlm_samp_min_p(jlm_samp_cands *c, float p, size_t min_keep);
void    jlm_samp_temp(jlm_samp_cands *c, float t);
/* Fills .p with softmax of the logits (float, as llama.cpp); n > 0. */
void    jlm_samp_softmax(jlm_samp_cands *c);
/* The id drawn by u in [0,1); c->n > 0. Fills .p. */
int32_t jlm_samp_dist(jlm_samp_cands *c, double u);
/* Index of the first maximum of logits[0, n); n > 0. */
int32_t jlm_samp_argmax(const float *logits, size_t n);

/* ---------------------------------------------------------------- sampler */
typedef struct jlm_samp_params {
    float    temp;            /* <= 0: greedy */
    int32_t  top_k;           /* <= 0: off */
    float    top_p;           /* >= 1: off */
    float    min_p;           /* <= 0: off */
    size_t   min_keep;        /* candidates top-p / min-p always keep */
    int32_t  repeat_last_n;   /* tokens of history penalized; 0: off */
    float    repeat_penalty;  /* 1: off */
    float    freq_penalty, presence_penalty;
    uint64_t seed;
} jlm_samp_params;

/* llama.cpp's common defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05,
 * min_keep 0, last-n 64, repeat 1.0, freq 0, presence 0, seed 0. */
void jlm_samp_params_default(jlm_samp_params *p);

typedef struct jlm_sampler jlm_sampler;

/* JLM_EINVAL (n_vocab 0, repeat_last_n < 0, NaN parameters) or JLM_ENOMEM;
 * *out untouched on error. */
int  jlm_samp_create(const jlm_samp_params *prm, uint32_t n_vocab, jlm_sampler **out, jlm_err *err);
void jlm_samp_destroy(jlm_sampler *s);
/* Appends a token to the penalty history (prompt tokens too, as llama.cpp's
 * main does). Tokens outside [0, n_vocab) are ignored. Cannot fail. */
void jlm_samp_accept(jlm_sampler *s, int32_t token);
/* Clears the history and reseeds the RNG with the params' seed. */
void jlm_samp_reset(jlm_sampler *s);
/* Runs the chain on logits (n_vocab,) with the draw u in [0,1). Does not
 * accept the result. Cannot fail. */
int32_t jlm_samp_sample(jlm_sampler *s, const float *logits, double u);
/* jlm_samp_sample with u from the sampler's RNG. */
int32_t jlm_samp_next(jlm_sampler *s, const float *logits);

#endif
