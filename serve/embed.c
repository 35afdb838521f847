/* embed.c - embeddings: OpenAI's POST /v1/embeddings and the jobs behind
 * it and ollama's /api/embed (request shapes: dialect.c). Each input is
 * tokenized as /v1/completions tokenizes a prompt (or given as token ids),
 * evaluated on a slot's sequence when the job joins the batch (as a
 * prompt is) and pooled by the engine (jlm_engine_embed: mean or last of
 * the final hidden states after the output norm, L2-normalised), so a
 * vector equals `jlm run --embeddings` on the same text. */
#include "serve/http_int.h"
#include "serve/dialect.h"

#include <stdlib.h>
#include <string.h>

int jlm_srv_embed_tokens(srv_model *m, const jlm_srv_req *req, int32_t **ids, size_t *n, uint32_t **off,
                         size_t *n_in, jlm_err *err)
{
    size_t k = json_array_size(req->inputs), total = 0, cap = 0, i;
    uint32_t n_ctx = jlm_engine_n_ctx(m->e), nv = jlm_engine_n_vocab(m->e);
    int32_t *all = NULL;
    uint32_t *o = calloc(k + 1, sizeof *o);
    int rc = o ? 0 : jlm_errf(err, JLM_ENOMEM, "out of memory");
    const json_t *in;
    json_array_foreach(req->inputs, i, in) {
        if (rc) break;
        int32_t *t = NULL;
        size_t nt = json_array_size(in);
        if (json_is_string(in)) {
            rc = jlm_tok_encode(m->tok, json_string_value(in), json_string_length(in), 1, 0, &t, &nt, err);
        } else if (!(t = malloc((nt ? nt : 1) * sizeof *t))) {
            rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
        } else {
            for (size_t q = 0; q < nt; q++) {
                json_int_t id = json_integer_value(json_array_get(in, q));
                if (id >= nv && !rc)
                    rc = jlm_errf(err, JLM_EINVAL, "'input[%zu][%zu]': token id %lld outside the vocab [0, %u)", i, q,
                                  (long long)id, nv);
                t[q] = (int32_t)id;
            }
        }
        if (!rc && (nt == 0 || nt > n_ctx))
            rc = nt == 0 ? jlm_errf(err, JLM_EINVAL, "'input[%zu]': empty after tokenization", i)
                         : jlm_errf(err, JLM_EINVAL, "'input[%zu]': %zu tokens; the context holds %u", i, nt, n_ctx);
        if (!rc && total + nt > cap) {
            size_t nc = (total + nt) * 2;
            int32_t *a = realloc(all, nc * sizeof *a);
            if (!a) rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
            else { all = a; cap = nc; }
        }
        if (!rc) {
            memcpy(all + total, t, nt * sizeof *t);
            total += nt;
            o[i + 1] = (uint32_t)total;
        }
        free(t);
    }
    if (rc) {
        free(all);
        free(o);
        return rc;
    }
    *ids = all;
    *n = total;
    *off = o;
    *n_in = k;
    return 0;
}

int jlm_srv_embed_run(srv_model *m, jlm_engine_seq *seq, srv_job *j, jlm_err *err)
{
    uint32_t E = jlm_engine_n_embd(m->e);
    if (!(j->emb = malloc(j->n_emb * E * sizeof *j->emb)))
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    j->n_embd = E;
    j->res.prompt_tokens = (uint32_t)j->n_prompt;
    for (size_t i = 0; i < j->n_emb; i++) {
        if (atomic_load(&j->cancelled))
            return jlm_errf(err, JLM_EINVAL, "cancelled");
        jlm_engine_seq_rewind(seq, 0);
        int rc = jlm_engine_embed(m->e, seq, j->prompt + j->emb_off[i], j->emb_off[i + 1] - j->emb_off[i],
                                  j->req.pool_last, j->emb + i * E, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------- responses */

static json_t *vector_json(const float *v, uint32_t n)
{
    json_t *a = json_array();
    for (uint32_t k = 0; a && k < n; k++)
        if (json_array_append_new(a, json_real((double)v[k]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The little-endian float32 bytes of v, base64 (OpenAI's encoding_format). */
static json_t *vector_b64(const float *v, uint32_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4, o = 0;
    const unsigned char *b = (const unsigned char *)v;   /* x86-64 and aarch64: little-endian */
    char *s = malloc(nb / 3 * 4 + 5);
    if (!s)
        return NULL;
    for (size_t i = 0; i < nb; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < nb ? b[i + 2] : 0);
        s[o++] = tab[x >> 18 & 63];
        s[o++] = tab[x >> 12 & 63];
        s[o++] = i + 1 < nb ? tab[x >> 6 & 63] : '=';
        s[o++] = i + 2 < nb ? tab[x & 63] : '=';
    }
    json_t *j = json_stringn(s, o);
    free(s);
    return j;
}

static json_t *openai_whole(const srv_job *j)
{
    json_t *data = json_array();
    for (size_t i = 0; data && i < j->n_emb; i++) {
        const float *v = j->emb + i * j->n_embd;
        json_t *e = j->req.base64 ? vector_b64(v, j->n_embd) : vector_json(v, j->n_embd);
        if (!e || json_array_append_new(data, json_pack("{s:s, s:I, s:o}", "object", "embedding", "index",
                                                        (json_int_t)i, "embedding", e))) {
            json_decref(data);
            return NULL;
        }
    }
    return json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model", j->ident.model, "usage",
                     "prompt_tokens", (json_int_t)j->n_prompt, "total_tokens", (json_int_t)j->n_prompt);
}

static json_t *ollama_whole(const srv_job *j)
{
    json_t *all = json_array();
    for (size_t i = 0; all && i < j->n_emb; i++)
        if (json_array_append_new(all, vector_json(j->emb + i * j->n_embd, j->n_embd))) {
            json_decref(all);
            return NULL;
        }
    uint64_t ns = (j->t_end_us - j->t_start_us) * 1000;
    return json_pack("{s:s, s:o, s:I, s:I, s:I}", "model", j->req.model ? j->req.model : j->ident.model, "embeddings",
                     all, "total_duration", (json_int_t)ns, "load_duration", (json_int_t)0, "prompt_eval_count",
                     (json_int_t)j->n_prompt);
}

static void no_stream(srv_job *j, const char *p, size_t n) { (void)j; (void)p; (void)n; }
static void no_close(srv_job *j, int status, const char *msg) { (void)j; (void)status; (void)msg; }

static const srv_dialect OPENAI_EMBED = {"application/json", "", NULL, no_stream, NULL, no_close, openai_whole, jlm_srv_json_error};
const srv_dialect jlm_srv_dia_ollama_embed = {"application/json", "", NULL, no_stream, NULL, no_close, ollama_whole,
                                              jlm_srv_ollama_error};

enum MHD_Result jlm_srv_embeddings(struct jlm_srv *s, struct MHD_Connection *c, const char *body, size_t len)
{
    jlm_err err = {0};
    jlm_srv_req req;
    int rc = jlm_srv_dialect_parse(JLM_SRV_API_EMBED, body, len, &req, &err);
    if (rc)
        return jlm_srv_send_error(s, c, NULL, rc == JLM_ENOMEM ? 500 : 400, err.msg);
    return jlm_srv_submit(s, c, &req, &OPENAI_EMBED);
}
