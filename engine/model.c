/* model.c - the token and layer loop: embeddings, each block's page from
 * the streamer and its program through the executor (engine/exec_int.h;
 * the programs: engine/prog.h, engine/arch/), the output matrix, and the
 * sequences. See model.h for the contract. */
#include "engine/exec_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "format/dequant.h"

/* ================================================================ a batch of tokens */
static void embed(jlm_engine *e, int32_t tok, float *x)
{
    const jlm_tensor *t = W(e, -1, JLM_R_TOKEN_EMBD);
    jlm_k_mat m = mat_dense(e, t);
    jlm_k_dequant_row_ref(t->type, m.qs, m.d, m.sc, m.k, m.rows, (uint64_t)tok, x);
    if (e->c->embd_scale > 0)
        jlm_k_scale(x, x, e->c->embd_scale, e->c->n_embd);
}

/* logits (n, n_vocab) of the rows x (n, n_embd): one matmul, so the output
 * matrix is read once for a batch of sequences (each row as its matvec). */
static int output(jlm_engine *e, const float *x, uint32_t n, float *logits, jlm_err *err)
{
    const jlm_config *c = e->c;
    const jlm_tensor *t = W(e, -1, JLM_R_OUTPUT);
    if (!t)
        t = W(e, -1, JLM_R_TOKEN_EMBD);   /* tied embeddings */
    jlm_k_mat m = mat_dense(e, t);
    jlm_dev *d = e->out_dev;
    if (d && d->ops->output && !(c->final_softcap > 0)) {   /* the rows still on the device: the logits come down */
        int rc = d->ops->output(d, vec_dense(e, W(e, -1, JLM_R_OUTPUT_NORM)), c->rms_eps, &m, x, n, c->n_embd, logits,
                                err);
        if (rc != JLM_EUNSUPPORTED)
            return rc;
    }
    int rc = jlm_ex_x_host(e, NULL, err);
    if (rc)
        return rc;
    for (uint32_t r = 0; r < n; r++)
        jlm_k_rmsnorm(e->h + (uint64_t)r * c->n_embd, x + (uint64_t)r * c->n_embd,
                      vec_dense(e, W(e, -1, JLM_R_OUTPUT_NORM)), c->n_embd, c->rms_eps);
    jlm_ex_matmul(e, &m, n, e->h, logits);
    if (c->final_softcap > 0)
        for (uint64_t i = 0; i < m.rows * n; i++)
            logits[i] = c->final_softcap * tanhf(logits[i] / c->final_softcap);
    return JLM_OK;
}

/* Token rows [i, i+b) of one sequence (cache kc/vc) at positions pos0 + i..
 * become the batch's rows [0, b). */
static void bind_rows(jlm_engine *e, void *kc, void *vc, uint32_t pos0, uint32_t b)
{
    for (uint32_t t = 0; t < b; t++) {
        e->bkc[t] = kc;
        e->bvc[t] = vc;
        e->bpos[t] = pos0 + t;
    }
}

/* Every layer over rows [0, n) of xs (n_embd floats each, the residual
 * stream): the streamer acquires the block's page (host, and its device's),
 * the executor runs the block's program over the rows nb at a time through
 * e->x, the streamer releases it. kc/vc non-NULL: the rows are one
 * sequence's, at positions pos0.. of that cache (any n); NULL: the batch
 * already bound in bkc/bvc/bpos (n <= nb). bidir: the rows attend to each
 * other both ways (an image, one sequence); otherwise causally. */
static int run_layers(jlm_engine *e, float *xs, uint32_t n, void *kc, void *vc, uint32_t pos0, int bidir,
                      jlm_err *err)
{
    const jlm_config *c = e->c;
    float *x0 = e->x;
    int rc = JLM_OK;
    jlm_ex_x_forget(e);   /* the rows are the host's (new embeddings) */
    e->bidir_end = bidir ? pos0 + n : 0;
    for (uint32_t l = 0; l < c->n_layer && !rc; l++) {
        const uint8_t *page;
        const jlm_prog *p = W(e, l, JLM_R_EXP_GATE) ? &e->prog_moe : &e->prog_dense;
        if ((rc = jlm_stream_block(e, l, p, n, &page, err)))
            break;
        rc = jlm_ex_block(e, p, l, page, xs, n, kc, vc, pos0, err);
        jlm_stream_block_done(e, l);
        if (rc)
            rc = jlm_err_prefix(err, rc, "%s: block %u experts", e->m->path, l);
    }
    jlm_stream_finish(e, rc);
    if (rc)
        jlm_ex_x_forget(e);
    e->x = x0;
    e->bidir_end = 0;
    return rc;
}

/* tokens[0, n) at the caches and positions bkc/bvc/bpos[0, n), n <= nb:
 * each block page is pinned once for the whole batch. logits: after the last
 * token (n_vocab), or with all_logits after every token (n, n_vocab). */
static int forward(jlm_engine *e, const int32_t *tokens, uint32_t n, float *logits, int all_logits, jlm_err *err)
{
    const jlm_config *c = e->c;
    unsigned long long t0 = e->prof ? prof_now() : 0;
    int rc = jlm_rows_fit(e, n, err);   /* the scratch's rows [0, n) backed and counted first */
    if (rc)
        return rc;
    for (uint32_t t = 0; t < n; t++)
        embed(e, tokens[t], e->x + t * c->n_embd);
    rc = run_layers(e, e->x, n, NULL, NULL, 0, 0, err);
    if (!rc && logits)
        rc = output(e, e->x + (uint64_t)(all_logits ? 0 : n - 1) * c->n_embd, all_logits ? n : 1, logits, err);
    if (t0) {
        e->pr.total_ns += prof_now() - t0;
        e->pr.evals++;
        e->pr.tokens += n;
    }
    return rc;
}

/* n embedding rows on the cache kc/vc at *n_past (*have positions fitted). */
static int embd_one(jlm_engine *e, void *kc, void *vc, uint32_t *n_past, uint32_t *have, int counted,
                    const float *embd, uint32_t n, int bidir, float *logits, jlm_err *err)
{
    const jlm_config *c = e->c;
    if (n == 0 || (uint64_t)*n_past + n > e->n_ctx)
        return jlm_errf(err, JLM_ERANGE, "context full: %u + %u embeddings exceed %u positions (-c)", *n_past, n,
                        e->n_ctx);
    int rc = *n_past + n > *have ? jlm_kv_fit(e, kc, vc, have, *n_past + n, counted, err) : JLM_OK;
    if (rc || (rc = jlm_rows_fit(e, n, err)))
        return rc;
    float *xs = malloc((size_t)n * c->n_embd * sizeof *xs);
    if (!xs)
        return jlm_errf(err, JLM_ENOMEM, "out of memory for %u embeddings", n);
    memcpy(xs, embd, (size_t)n * c->n_embd * sizeof *xs);   /* entered as they are: no embedding scale */
    rc = run_layers(e, xs, n, kc, vc, *n_past, bidir, err);
    if (!rc && logits)
        rc = output(e, xs + (uint64_t)(n - 1) * c->n_embd, 1, logits, err);
    free(xs);
    if (!rc)
        *n_past += n;
    return rc;
}

int jlm_engine_eval_embd(jlm_engine *e, const float *embd, uint32_t n, int bidir, float *logits, jlm_err *err)
{
    return embd_one(e, e->kc, e->vc, &e->n_past, &e->kv_have, 1, embd, n, bidir, logits, err);
}

static int check_ids(const jlm_engine *e, const int32_t *tokens, uint32_t n, jlm_err *err)
{
    uint64_t nv = jlm_tensor_rows(W(e, -1, JLM_R_TOKEN_EMBD));
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint64_t)tokens[i] >= nv)
            return jlm_errf(err, JLM_ERANGE, "token id %d outside [0, %llu)", tokens[i], (unsigned long long)nv);
    return JLM_OK;
}

/* tokens[0, n) of one sequence (cache kc/vc, *n_past, *have positions
 * backed; counted: the engine's own, in the budget), nb at a time. */
static int eval_one(jlm_engine *e, void *kc, void *vc, uint32_t *n_past, uint32_t *have, int counted,
                    const int32_t *tokens, uint32_t n, float *logits, jlm_err *err)
{
    int rc = check_ids(e, tokens, n, err);
    if (rc)
        return rc;
    if ((uint64_t)*n_past + n > e->n_ctx)
        return jlm_errf(err, JLM_ERANGE, "context full: %u + %u tokens exceed %u positions (-c)", *n_past, n, e->n_ctx);
    for (uint32_t i = 0; i < n; i += e->nb) {
        uint32_t b = n - i < e->nb ? n - i : e->nb;
        if (*n_past + b > *have && (rc = jlm_kv_fit(e, kc, vc, have, *n_past + b, counted, err)))
            return rc;
        bind_rows(e, kc, vc, *n_past, b);
        rc = forward(e, tokens + i, b, i + b == n ? logits : NULL, 0, err);
        if (rc)
            return rc;
        *n_past += b;
    }
    return JLM_OK;
}

int jlm_engine_eval(jlm_engine *e, const int32_t *tokens, uint32_t n, float *logits, jlm_err *err)
{
    return eval_one(e, e->kc, e->vc, &e->n_past, &e->kv_have, 1, tokens, n, logits, err);
}

/* ================================================================ embeddings */
/* tokens[0, n) of one sequence (cache kc/vc from *n_past), nb at a time as
 * eval_one, each row's final hidden state (after the output norm) added
 * into acc (double, n_embd) or, pool_last, the last row's kept. */
static int embed_one(jlm_engine *e, void *kc, void *vc, uint32_t *n_past, const int32_t *tokens, uint32_t n,
                     int pool_last, double *acc, jlm_err *err)
{
    const jlm_config *c = e->c;
    int rc = check_ids(e, tokens, n, err);
    if (rc)
        return rc;
    if ((uint64_t)*n_past + n > e->n_ctx)
        return jlm_errf(err, JLM_ERANGE, "context full: %u + %u tokens exceed %u positions (-c)", *n_past, n, e->n_ctx);
    const float *norm = vec_dense(e, W(e, -1, JLM_R_OUTPUT_NORM));
    for (uint32_t i = 0; i < n; i += e->nb) {
        uint32_t b = n - i < e->nb ? n - i : e->nb;
        bind_rows(e, kc, vc, *n_past, b);
        if ((rc = forward(e, tokens + i, b, NULL, 0, err)) || (rc = jlm_ex_x_host(e, NULL, err)))
            return rc;   /* x_host: the rows a device's whole blocks hold, back for the pooling */
        *n_past += b;
        for (uint32_t r = pool_last ? b - 1 : 0; r < b; r++) {
            float *h = e->h + (uint64_t)r * c->n_embd;
            jlm_k_rmsnorm(h, e->x + (uint64_t)r * c->n_embd, norm, c->n_embd, c->rms_eps);
            for (uint32_t k = 0; k < c->n_embd; k++)
                acc[k] = pool_last ? (double)h[k] : acc[k] + (double)h[k];
        }
    }
    return JLM_OK;
}

int jlm_engine_embed(jlm_engine *e, jlm_engine_seq *s, const int32_t *tokens, uint32_t n, int pool_last, float *out,
                     jlm_err *err)
{
    uint32_t E = e->c->n_embd;
    if (n == 0)
        return jlm_errf(err, JLM_EINVAL, "no tokens to embed");
    double *acc = calloc(E, sizeof *acc);
    if (!acc)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    int rc = s ? embed_one(e, s->kc, s->vc, &s->n_past, tokens, n, pool_last, acc, err)
               : embed_one(e, e->kc, e->vc, &e->n_past, tokens, n, pool_last, acc, err);
    double norm = 0;
    for (uint32_t k = 0; !rc && k < E; k++) {
        if (!pool_last)
            acc[k] /= n;
        norm += acc[k] * acc[k];
    }
    norm = norm > 0 ? 1.0 / sqrt(norm) : 0.0;
    for (uint32_t k = 0; !rc && k < E; k++)
        out[k] = (float)(acc[k] * norm);
    free(acc);
    return rc;
}

uint32_t jlm_engine_n_embd(const jlm_engine *e) { return e->c->n_embd; }

/* ================================================================ sequences */
int jlm_engine_seq_create(jlm_engine *e, jlm_engine_seq **out, jlm_err *err)
{
    jlm_engine_seq *s = calloc(1, sizeof *s);
    if (!s)
        return jlm_errf(err, JLM_ENOMEM, "%s: KV cache of a sequence: out of memory", e->m->path);
    s->e = e;
    int rc = jlm_kv_reserve(e, &s->kc, &s->vc, err);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return JLM_OK;
}

/* s's device caches: up (1), down (0) positions [0, n), or freed (-1). */
static int seq_dev(const jlm_engine *e, const jlm_engine_seq *s, uint32_t n, int up, jlm_err *err)
{
    int rc = JLM_OK;
    for (int i = 0; i < e->n_dev && !rc; i++)
        if (e->devs[i]->ops->kv_xfer)
            rc = e->devs[i]->ops->kv_xfer(e->devs[i], (jlm_engine *)e, s->kc, s->vc, n, up, err);
    return rc;
}

void jlm_engine_seq_destroy(jlm_engine_seq *s)
{
    if (!s) return;
    jlm_err err;
    seq_dev(s->e, s, 0, -1, &err);   /* frees: a device that fails to wait has nothing better to do */
    jlm_kv_release(s->e, s->kc, s->vc);
    free(s);
}

/* A sequence's memory is not counted in the budget: resizing it cannot fail. */
static void seq_fit(jlm_engine_seq *s, uint32_t need)
{
    jlm_err err;
    jlm_kv_fit(s->e, s->kc, s->vc, &s->have, need, 0, &err);
}

void jlm_engine_seq_rewind(jlm_engine_seq *s, uint32_t pos)
{
    if (pos < s->n_past) {
        s->n_past = pos;
        seq_fit(s, pos);
    }
}
uint32_t jlm_engine_seq_n_past(const jlm_engine_seq *s) { return s->n_past; }

int jlm_engine_eval_seq(jlm_engine *e, jlm_engine_seq *s, const int32_t *tokens, uint32_t n, float *logits,
                        jlm_err *err)
{
    return eval_one(e, s->kc, s->vc, &s->n_past, &s->have, 0, tokens, n, logits, err);
}

int jlm_engine_eval_embd_seq(jlm_engine *e, jlm_engine_seq *s, const float *embd, uint32_t n, int bidir, float *logits,
                             jlm_err *err)
{
    return embd_one(e, s->kc, s->vc, &s->n_past, &s->have, 0, embd, n, bidir, logits, err);
}

/* Keys: per head (n_layer * n_kv_head of them, kv_ctx positions each) whole
 * tiles of JLM_K_FATTN_BK positions (Q8_0: rows); values: rows. A prefix of
 * n positions is the first tiles(n) key tiles (n key rows) and n value rows
 * of each head. */
static uint64_t key_bytes(const jlm_engine *e, uint32_t n)
{
    uint64_t rows = e->kt == KV_Q8_0 ? n : ((uint64_t)n + JLM_K_FATTN_BK - 1) / JLM_K_FATTN_BK * JLM_K_FATTN_BK;
    return rows * e->krow;
}

uint64_t jlm_engine_kv_bytes(const jlm_engine *e, uint32_t n)
{
    if (e->c->kv_lora_rank)
        return 0;   /* a latent cache row per layer (exec_mla.c), not per-head tiles */
    return e->kv_heads * (key_bytes(e, n) + (uint64_t)n * e->vrow);
}

/* Copies the first k positions of each head between a sequence's cache and
 * a compact buffer of n positions; to_cache: from the buffer to the cache. */
static void kv_copy(const jlm_engine *e, uint8_t *cache_k, uint8_t *cache_v, uint8_t *buf, uint32_t n, uint32_t k,
                    int to_cache)
{
    if (e->c->kv_lora_rank)
        return;   /* jlm_engine_kv_bytes: nothing saved for latent attention */
    uint64_t ck = (uint64_t)e->kv_ctx * e->krow, cv = (uint64_t)e->kv_ctx * e->vrow;
    uint64_t bk = key_bytes(e, n), bv = (uint64_t)n * e->vrow, nk = key_bytes(e, k), nv = (uint64_t)k * e->vrow;
    uint8_t *bufv = buf + e->kv_heads * bk;
    for (uint64_t h = 0; h < e->kv_heads; h++) {
        memcpy(to_cache ? cache_k + h * ck : buf + h * bk, to_cache ? buf + h * bk : cache_k + h * ck, nk);
        memcpy(to_cache ? cache_v + h * cv : bufv + h * bv, to_cache ? bufv + h * bv : cache_v + h * cv, nv);
    }
}

int jlm_engine_kv_save(const jlm_engine *e, const jlm_engine_seq *s, uint32_t n, void *buf, jlm_err *err)
{
    int rc = jlm_engine_kv_bytes(e, n) ? seq_dev(e, s, n, 0, err) : JLM_OK;
    if (!rc)
        kv_copy(e, s->kc, s->vc, buf, n, n, 0);
    return rc;
}

int jlm_engine_kv_load(const jlm_engine *e, jlm_engine_seq *s, const void *buf, uint32_t n, uint32_t k, jlm_err *err)
{
    seq_fit(s, k > s->n_past ? k : s->n_past);
    kv_copy(e, s->kc, s->vc, (uint8_t *)buf, n, k, 1);
    s->n_past = k;
    seq_fit(s, k);
    int rc = jlm_engine_kv_bytes(e, k) ? seq_dev(e, s, k, 1, err) : JLM_OK;
    if (rc) {
        jlm_err e2;
        seq_dev(e, s, 0, -1, &e2);
        jlm_engine_seq_rewind(s, 0);
    }
    return rc;
}

int jlm_engine_eval_batch(jlm_engine *e, jlm_engine_seq *const *seqs, const int32_t *tokens, uint32_t n,
                          float *logits, jlm_err *err)
{
    if (n == 0 || n > BATCH)
        return jlm_errf(err, JLM_EINVAL, "a batch of %u sequences (1..%d)", n, BATCH);
    int rc = check_ids(e, tokens, n, err);
    for (uint32_t t = 0; !rc && t < n; t++) {
        for (uint32_t u = 0; u < t; u++)
            if (seqs[u] == seqs[t])
                return jlm_errf(err, JLM_EINVAL, "a sequence appears twice in one batch");
        if (seqs[t]->n_past + 1 > e->n_ctx)
            return jlm_errf(err, JLM_ERANGE, "context full: sequence %u holds %u positions (-c)", t, e->n_ctx);
        seq_fit(seqs[t], seqs[t]->n_past + 1 > seqs[t]->have ? seqs[t]->n_past + 1 : seqs[t]->have);
        e->bkc[t] = seqs[t]->kc;
        e->bvc[t] = seqs[t]->vc;
        e->bpos[t] = seqs[t]->n_past;
    }
    if (!rc) rc = forward(e, tokens, n, logits, 1, err);
    for (uint32_t t = 0; !rc && t < n; t++)
        seqs[t]->n_past++;
    return rc;
}
