/* test_sampler.c - each sampling step with fixed logits and fixed draws.
 *
 * Expected candidates are computed from the definitions in sampler.h
 * (llama.cpp's): probabilities are chosen as logits = ln(p) so the
 * boundaries are easy to read. */
#include <criterion/criterion.h>

#include <math.h>
#include <string.h>

#include "engine/sampler.h"

static jlm_samp_cand g_buf[64];

static jlm_samp_cands cands(const float *logits, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g_buf[i] = (jlm_samp_cand){ (int32_t)i, logits[i], 0.0f };
    return (jlm_samp_cands){ g_buf, n, 0 };
}

static void expect_ids(const jlm_samp_cands *c, const int32_t *want, size_t n, const char *what)
{
    cr_assert_eq(c->n, n, "%s: %zu candidates kept, expected %zu", what, c->n, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(c->data[i].id, want[i], "%s: candidate %zu is id %d, expected %d", what, i,
                     c->data[i].id, want[i]);
}

/* probabilities 0.05, 0.5, 0.15, 0.3 (ids 0..3) */
static const float P4[4] = { 0.05f, 0.5f, 0.15f, 0.3f };
static void logits_of(const float *p, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = logf(p[i]);
}

Test(sampler, top_k_keeps_the_k_largest_sorted_with_ties_to_the_lower_id, .timeout = 5)
{
    float l[8] = { 0.1f, 3.0f, -1.0f, 2.0f, 3.0f, 0.5f, 2.0f, -4.0f };
    jlm_samp_cands c = cands(l, 8);
    jlm_samp_top_k(&c, 4);
    int32_t want[4] = { 1, 4, 3, 6 };
    expect_ids(&c, want, 4, "top-k 4");
    cr_assert(c.sorted);
    c = cands(l, 8);
    jlm_samp_top_k(&c, 0);
    cr_assert_eq(c.n, 8, "top-k 0 must be a no-op");
    c = cands(l, 8);
    jlm_samp_top_k(&c, 100);
    cr_assert_eq(c.n, 8, "top-k above n keeps all");
    cr_assert_eq(c.data[7].id, 7);
}

Test(sampler, top_p_keeps_the_shortest_prefix_reaching_p, .timeout = 5)
{
    float l[4];
    logits_of(P4, l, 4);
    jlm_samp_cands c = cands(l, 4);
    jlm_samp_top_p(&c, 0.75f, 0);                            /* 0.5 + 0.3 = 0.8 >= 0.75 */
    int32_t want2[2] = { 1, 3 };
    expect_ids(&c, want2, 2, "top-p 0.75");
    c = cands(l, 4);
    jlm_samp_top_p(&c, 0.85f, 0);                            /* + 0.15 = 0.95 */
    int32_t want3[3] = { 1, 3, 2 };
    expect_ids(&c, want3, 3, "top-p 0.85");
    c = cands(l, 4);
    jlm_samp_top_p(&c, 0.1f, 3);                             /* min_keep wins */
    expect_ids(&c, want3, 3, "top-p 0.1 min_keep 3");
    c = cands(l, 4);
    jlm_samp_top_p(&c, 1.0f, 0);
    cr_assert_eq(c.n, 4, "top-p 1 must be a no-op");
}

Test(sampler, min_p_keeps_candidates_within_p_of_the_best_in_their_order, .timeout = 5)
{
    float l[4];
    logits_of(P4, l, 4);
    jlm_samp_cands c = cands(l, 4);
    jlm_samp_min_p(&c, 0.2f, 0);                             /* keep p >= 0.1: ids 1, 2, 3 */
    int32_t want[3] = { 1, 2, 3 };
    expect_ids(&c, want, 3, "min-p 0.2 (unsorted keeps id order)");
    c = cands(l, 4);
    jlm_samp_min_p(&c, 0.7f, 0);                             /* keep p >= 0.35: id 1 */
    int32_t want1[1] = { 1 };
    expect_ids(&c, want1, 1, "min-p 0.7");
    c = cands(l, 4);
    jlm_samp_min_p(&c, 0.7f, 2);                             /* min_keep 2: sorted fallback */
    int32_t want2[2] = { 1, 3 };
    expect_ids(&c, want2, 2, "min-p 0.7 min_keep 2");
    c = cands(l, 4);
    jlm_samp_min_p(&c, 0.0f, 0);
    cr_assert_eq(c.n, 4, "min-p 0 must be a no-op");
}

Test(sampler, temperature_divides_logits_and_zero_keeps_only_the_first_maximum, .timeout = 5)
{
    float l[4] = { 1.0f, -2.0f, 4.0f, 4.0f };
    jlm_samp_cands c = cands(l, 4);
    jlm_samp_temp(&c, 0.5f);
    for (int i = 0; i < 4; i++)
        cr_assert(!(fabsf(c.data[i].logit - l[i] * 2.0f) > 0.0f), "logit %d: %g, expected %g", i,
                  c.data[i].logit, l[i] * 2.0f);
    c = cands(l, 4);
    jlm_samp_temp(&c, 0.0f);
    cr_assert_eq(c.data[2].logit, 4.0f);
    cr_assert(isinf(c.data[0].logit) && isinf(c.data[1].logit) && isinf(c.data[3].logit));
    cr_assert_eq(jlm_samp_dist(&c, 0.999), 2, "temp 0 must always give the first maximum");
}

Test(sampler, repeat_penalty_divides_positive_and_multiplies_negative_logits_once_per_token, .timeout = 5)
{
    float l[5] = { 2.0f, -2.0f, 1.0f, 0.5f, 0.0f };
    jlm_samp_cands c = cands(l, 5);
    int32_t last[4] = { 0, 1, 1, 4 };
    jlm_samp_penalties(&c, last, 4, 2.0f, 0.0f, 0.0f);
    float want[5] = { 1.0f, -4.0f, 1.0f, 0.5f, 0.0f };
    for (int i = 0; i < 5; i++)
        cr_assert(!(fabsf(c.data[i].logit - want[i]) > 1e-6f), "logit %d: %g, expected %g", i,
                  c.data[i].logit, want[i]);
    c = cands(l, 5);
    jlm_samp_penalties(&c, last, 4, 1.0f, 0.25f, 0.5f);      /* freq * count + presence */
    float want2[5] = { 2.0f - 0.75f, -2.0f - 1.0f, 1.0f, 0.5f, -0.75f };
    for (int i = 0; i < 5; i++)
        cr_assert(!(fabsf(c.data[i].logit - want2[i]) > 1e-6f), "logit %d: %g, expected %g", i,
                  c.data[i].logit, want2[i]);
    /* non-identity order: the same penalty finds the token by id */
    c = cands(l, 5);
    jlm_samp_top_k(&c, 5);
    jlm_samp_penalties(&c, last, 4, 2.0f, 0.0f, 0.0f);
    for (size_t i = 0; i < c.n; i++)
        cr_assert(!(fabsf(c.data[i].logit - want[c.data[i].id]) > 1e-6f), "sorted: id %d logit %g, expected %g",
                  c.data[i].id, c.data[i].logit, want[c.data[i].id]);
}

Test(sampler, dist_picks_the_candidate_whose_cumulative_probability_covers_the_draw, .timeout = 5)
{
    float l[4];
    logits_of(P4, l, 4);                                     /* cumulative, id order: .05 .55 .70 1 */
    double u[6] = { 0.0, 0.04, 0.06, 0.54, 0.56, 0.71 };
    int32_t want[6] = { 0, 0, 1, 1, 2, 3 };
    for (int i = 0; i < 6; i++) {
        jlm_samp_cands c = cands(l, 4);
        int32_t id = jlm_samp_dist(&c, u[i]);
        cr_assert_eq(id, want[i], "draw %g gave id %d, expected %d", u[i], id, want[i]);
        cr_assert(!(fabsf(c.data[1].p - 0.5f) > 1e-6f), "p of id 1: %g", c.data[1].p);
    }
}

Test(sampler, greedy_is_the_first_maximum_after_penalties, .timeout = 5)
{
    float l[6] = { 1.0f, 3.0f, 3.0f, 2.0f, -1.0f, 2.9f };
    cr_assert_eq(jlm_samp_argmax(l, 6), 1);
    jlm_samp_params prm;
    jlm_samp_params_default(&prm);
    prm.temp = 0.0f;
    prm.repeat_penalty = 1.5f;
    jlm_sampler *s = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_samp_create(&prm, 6, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_samp_sample(s, l, 0.9), 1, "greedy must ignore the draw");
    jlm_samp_accept(s, 1);                                   /* 3 / 1.5 = 2 < 3 */
    cr_assert_eq(jlm_samp_sample(s, l, 0.0), 2);
    jlm_samp_accept(s, 2);                                   /* now 2.9 is best */
    cr_assert_eq(jlm_samp_sample(s, l, 0.0), 5);
    jlm_samp_destroy(s);
}

Test(sampler, the_chain_applies_top_k_before_top_p_before_min_p, .timeout = 5)
{
    /* p (ids 0..5): .30 .25 .20 .15 .06 .04. top-k 4 -> {0,1,2,3} (sum .90);
     * top-p .6 on the renormalised four (.333 .278 .222 .167): .333+.278 = .611 >= .6 -> {0,1};
     * min-p .9 keeps p >= .9 * .333 of the pair: only id 0 ... so use min-p .8: .278/.333 = .83 -> {0,1}.
     * temp 1, draws: u < .545 (= .30/.55) -> 0, else 1. */
    float p[6] = { 0.30f, 0.25f, 0.20f, 0.15f, 0.06f, 0.04f }, l[6];
    logits_of(p, l, 6);
    jlm_samp_params prm;
    jlm_samp_params_default(&prm);
    prm.temp = 1.0f;
    prm.top_k = 4;
    prm.top_p = 0.6f;
    prm.min_p = 0.8f;
    jlm_sampler *s = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_samp_create(&prm, 6, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_samp_sample(s, l, 0.54), 0);
    cr_assert_eq(jlm_samp_sample(s, l, 0.55), 1);
    cr_assert_eq(jlm_samp_sample(s, l, 0.999), 1, "a token cut by top-k/top-p was drawn");
    jlm_samp_destroy(s);
    prm.min_p = 0.9f;                                        /* .83 < .9: only id 0 survives */
    cr_assert_eq(jlm_samp_create(&prm, 6, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_samp_sample(s, l, 0.999), 0);
    jlm_samp_destroy(s);
}

Test(sampler, a_seeded_rng_is_reproducible_and_uniform_in_zero_one, .timeout = 5)
{
    jlm_samp_rng a, b, c;
    jlm_samp_rng_seed(&a, 42);
    jlm_samp_rng_seed(&b, 42);
    jlm_samp_rng_seed(&c, 43);
    int differ = 0;
    double sum = 0;
    for (int i = 0; i < 10000; i++) {
        double x = jlm_samp_rng_uniform(&a), y = jlm_samp_rng_uniform(&b), z = jlm_samp_rng_uniform(&c);
        cr_assert(x == y, "draw %d differs between two RNGs seeded 42", i);
        cr_assert(x >= 0.0 && x < 1.0, "draw %g outside [0,1)", x);
        differ += x != z;
        sum += x;
    }
    cr_assert_gt(differ, 9990, "seeds 42 and 43 gave the same draws");
    cr_assert(!(fabs(sum / 10000 - 0.5) > 0.02), "mean %g, expected about 0.5", sum / 10000);

    float l[16];
    for (int i = 0; i < 16; i++)
        l[i] = (float)(i % 5) * 0.3f;
    jlm_samp_params prm;
    jlm_samp_params_default(&prm);
    prm.seed = 7;
    prm.top_k = 0;
    prm.top_p = 1.0f;
    prm.min_p = 0.0f;
    jlm_sampler *s1, *s2;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_samp_create(&prm, 16, &s1, &err), 0);
    cr_assert_eq(jlm_samp_create(&prm, 16, &s2, &err), 0);
    int32_t first[50];
    for (int i = 0; i < 50; i++) {
        first[i] = jlm_samp_next(s1, l);
        cr_assert_eq(jlm_samp_next(s2, l), first[i], "token %d differs between two samplers seeded 7", i);
    }
    jlm_samp_reset(s1);
    for (int i = 0; i < 50; i++)
        cr_assert_eq(jlm_samp_next(s1, l), first[i], "token %d differs after reset", i);
    jlm_samp_destroy(s1);
    jlm_samp_destroy(s2);
}

Test(sampler, refuses_an_empty_vocabulary_and_nan_parameters, .timeout = 5)
{
    jlm_samp_params prm;
    jlm_samp_params_default(&prm);
    jlm_sampler *s = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_samp_create(&prm, 0, &s, &err), JLM_EINVAL);
    prm.top_p = NAN;
    cr_assert_eq(jlm_samp_create(&prm, 10, &s, &err), JLM_EINVAL);
    cr_assert_null(s);
    jlm_samp_destroy(NULL);
}
