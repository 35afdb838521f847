/* sampler.c - penalties, top-k, top-p, min-p, temperature, dist, greedy, and
 * the splitmix64 RNG (see sampler.h for the semantics of each step). */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- RNG */
void jlm_samp_rng_seed(jlm_samp_rng *r, uint64_t seed)
{
    r->s = seed;
}

uint64_t jlm_samp_rng_u64(jlm_samp_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double jlm_samp_rng_uniform(jlm_samp_rng *r)
{
    return (double)(jlm_samp_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---------------------------------------------------------------- sorting */
/* Total order: larger logit first, then lower id. */
static int better(const jlm_samp_cand *a, const jlm_samp_cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *x, const void *y)
{
    const jlm_samp_cand *a = x, *b = y;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

static void sort_all(jlm_samp_cands *c)
{
    if (!c->sorted)
        qsort(c->data, c->n, sizeof *c->data, cmp_cand);
    c->sorted = 1;
}

/* Min-heap (worst at the root) of the k best, then sorted: O(n log k), so
 * top-k 40 over a 150k vocabulary does not sort the vocabulary. */
static void heap_down(jlm_samp_cand *h, size_t k, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && better(&h[w], &h[l])) w = l;
        if (r < k && better(&h[w], &h[r])) w = r;
        if (w == i)
            return;
        jlm_samp_cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

static void keep_best_k(jlm_samp_cands *c, size_t k)
{
    jlm_samp_cand *h = c->data;
    for (size_t i = k / 2; i-- > 0;)
        heap_down(h, k, i);
    for (size_t i = k; i < c->n; i++)
        if (better(&c->data[i], &h[0])) {
            h[0] = c->data[i];
            heap_down(h, k, 0);
        }
    c->n = k;
    qsort(c->data, k, sizeof *c->data, cmp_cand);
    c->sorted = 1;
}

/* ---------------------------------------------------------------- steps */
static int cmp_i32(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

static void penalize(jlm_samp_cand *d, int32_t count, float repeat, float freq, float present)
{
    d->logit = d->logit <= 0 ? d->logit * repeat : d->logit / repeat;
    d->logit -= (float)count * freq + (float)(count > 0) * present;
}

void jlm_samp_penalties(jlm_samp_cands *c, const int32_t *last, size_t n_last,
                        float repeat, float freq, float present)
{
    if (n_last == 0 || (repeat == 1.0f && freq == 0.0f && present == 0.0f))
        return;
    int32_t small[256], *t = n_last <= 256 ? small : malloc(n_last * sizeof *t);
    if (!t)
        return;
    memcpy(t, last, n_last * sizeof *t);
    qsort(t, n_last, sizeof *t, cmp_i32);
    for (size_t i = 0; i < n_last;) {
        size_t j = i;
        while (j < n_last && t[j] == t[i])
            j++;
        int32_t id = t[i], count = (int32_t)(j - i);
        /* candidates in id order (the chain's first step) index directly */
        if (id >= 0 && (size_t)id < c->n && c->data[id].id == id) {
            penalize(&c->data[id], count, repeat, freq, present);
        } else {
            for (size_t k = 0; k < c->n; k++)
                if (c->data[k].id == id) {
                    penalize(&c->data[k], count, repeat, freq, present);
                    break;
                }
        }
        i = j;
    }
    if (t != small)
        free(t);
    c->sorted = 0;
}

void jlm_samp_top_k(jlm_samp_cands *c, int32_t k)
{
    if (k <= 0 || c->n == 0)
        return;
    size_t kk = (size_t)k < c->n ? (size_t)k : c->n;
    if (c->sorted)
        c->n = kk;
    else
        keep_best_k(c, kk);
}

void jlm_samp_softmax(jlm_samp_cands *c)
{
    float max = c->data[0].logit, sum = 0.0f;
    for (size_t i = 1; i < c->n; i++)
        if (c->data[i].logit > max)
            max = c->data[i].logit;
    for (size_t i = 0; i < c->n; i++) {
        c->data[i].p = expf(c->data[i].logit - max);
        sum += c->data[i].p;
    }
    for (size_t i = 0; i < c->n; i++)
        c->data[i].p /= sum;
}

void jlm_samp_top_p(jlm_samp_cands *c, float p, size_t min_keep)
{
    if (p >= 1.0f || c->n == 0)
        return;
    sort_all(c);
    jlm_samp_softmax(c);
    float cum = 0.0f;
    size_t last = c->n;
    for (size_t i = 0; i < c->n; i++) {
        cum += c->data[i].p;
        if (cum >= p && i + 1 >= min_keep) {
            last = i + 1;
            break;
        }
    }
    c->n = last;
}

void jlm_samp_min_p(jlm_samp_cands *c, float p, size_t min_keep)
{
    if (p <= 0.0f || c->n == 0)
        return;
    if (!c->sorted) {
        /* order-preserving filter; fall back to the sorted rule if it would
         * keep fewer than min_keep */
        float max = c->data[0].logit;
        for (size_t i = 1; i < c->n; i++)
            if (c->data[i].logit > max)
                max = c->data[i].logit;
        float min_logit = max + logf(p);
        size_t kept = 0;
        for (size_t i = 0; i < c->n; i++)
            kept += c->data[i].logit >= min_logit;
        if (kept > 0 && kept >= min_keep) {
            size_t o = 0;
            for (size_t i = 0; i < c->n; i++)
                if (c->data[i].logit >= min_logit)
                    c->data[o++] = c->data[i];
            c->n = o;
            return;
        }
        sort_all(c);
    }
    float min_logit = c->data[0].logit + logf(p);
    size_t i = 1;
    for (; i < c->n; i++)
        if (c->data[i].logit < min_logit && i >= min_keep)
            break;
    c->n = i;
}

void jlm_samp_temp(jlm_samp_cands *c, float t)
{
    if (c->n == 0)
        return;
    if (t <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < c->n; i++)
            if (c->data[i].logit > c->data[best].logit)
                best = i;
        for (size_t i = 0; i < c->n; i++)
            if (i != best)
                c->data[i].logit = -INFINITY;
        return;
    }
    for (size_t i = 0; i < c->n; i++)
        c->data[i].logit /= t;
}

int32_t jlm_samp_dist(jlm_samp_cands *c, double u)
{
    float max = c->data[0].logit;
    for (size_t i = 1; i < c->n; i++)
        if (c->data[i].logit > max)
            max = c->data[i].logit;
    double total = 0.0;
    for (size_t i = 0; i < c->n; i++) {
        c->data[i].p = expf(c->data[i].logit - max);
        total += c->data[i].p;
    }
    double target = u * total, run = 0.0;
    size_t pick = 0;
    for (size_t i = 0; i < c->n; i++)   /* rounding fallback: the last token with p > 0 */
        if (c->data[i].p > 0)
            pick = i;
    for (size_t i = 0; i < c->n; i++) {
        run += c->data[i].p;
        if (run >= target && c->data[i].p > 0) {
            pick = i;
            break;
        }
    }
    for (size_t i = 0; i < c->n; i++)
        c->data[i].p = (float)(c->data[i].p / total);
    return c->data[pick].id;
}

int32_t jlm_samp_argmax(const float *logits, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return (int32_t)best;
}

/* ---------------------------------------------------------------- sampler */
struct jlm_sampler {
    jlm_samp_params prm;
    uint32_t        n_vocab;
    jlm_samp_rng    rng;
    jlm_samp_cand  *cand;     /* (n_vocab,) */
    int32_t        *ring;     /* (repeat_last_n,) last accepted tokens */
    uint32_t        ring_pos, ring_n;
};

void jlm_samp_params_default(jlm_samp_params *p)
{
    *p = (jlm_samp_params){ .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                            .min_keep = 0, .repeat_last_n = 64, .repeat_penalty = 1.0f,
                            .freq_penalty = 0.0f, .presence_penalty = 0.0f, .seed = 0 };
}

int jlm_samp_create(const jlm_samp_params *prm, uint32_t n_vocab, jlm_sampler **out, jlm_err *err)
{
    if (n_vocab == 0 || prm->repeat_last_n < 0)
        return jlm_errf(err, JLM_EINVAL, "sampler: vocabulary of %u tokens, repeat-last-n %d",
                        n_vocab, prm->repeat_last_n);
    if (isnan(prm->temp) || isnan(prm->top_p) || isnan(prm->min_p) || isnan(prm->repeat_penalty) ||
        isnan(prm->freq_penalty) || isnan(prm->presence_penalty))
        return jlm_errf(err, JLM_EINVAL, "sampler: a parameter is NaN");
    jlm_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
        s->ring = malloc(((size_t)prm->repeat_last_n + 1) * sizeof *s->ring);
    }
    if (!s || !s->cand || !s->ring) {
        jlm_samp_destroy(s);
        return jlm_errf(err, JLM_ENOMEM, "sampler: out of memory for %u candidates", n_vocab);
    }
    s->prm = *prm;
    s->n_vocab = n_vocab;
    jlm_samp_reset(s);
    *out = s;
    return 0;
}

void jlm_samp_destroy(jlm_sampler *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s->ring);
    free(s);
}

void jlm_samp_reset(jlm_sampler *s)
{
    s->ring_pos = s->ring_n = 0;
    jlm_samp_rng_seed(&s->rng, s->prm.seed);
}

void jlm_samp_accept(jlm_sampler *s, int32_t token)
{
    uint32_t n = (uint32_t)s->prm.repeat_last_n;
    if (n == 0 || token < 0 || (uint32_t)token >= s->n_vocab)
        return;
    s->ring[s->ring_pos] = token;
    s->ring_pos = (s->ring_pos + 1) % n;
    if (s->ring_n < n)
        s->ring_n++;
}

int32_t jlm_samp_sample(jlm_sampler *s, const float *logits, double u)
{
    jlm_samp_cands c = { s->cand, s->n_vocab, 0 };
    for (uint32_t i = 0; i < s->n_vocab; i++)
        s->cand[i] = (jlm_samp_cand){ (int32_t)i, logits[i], 0.0f };
    /* ring order does not matter to the penalties (counts only) */
    jlm_samp_penalties(&c, s->ring, s->ring_n, s->prm.repeat_penalty,
                       s->prm.freq_penalty, s->prm.presence_penalty);
    if (s->prm.temp <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < c.n; i++)
            if (c.data[i].logit > c.data[best].logit)
                best = i;
        return c.data[best].id;
    }
    jlm_samp_top_k(&c, s->prm.top_k);
    jlm_samp_top_p(&c, s->prm.top_p, s->prm.min_keep);
    jlm_samp_min_p(&c, s->prm.min_p, s->prm.min_keep);
    jlm_samp_temp(&c, s->prm.temp);
    return jlm_samp_dist(&c, u);
}

int32_t jlm_samp_next(jlm_sampler *s, const float *logits)
{
    return jlm_samp_sample(s, logits, jlm_samp_rng_uniform(&s->rng));
}
