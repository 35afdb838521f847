/* gen.c - served models, their generation workers and the generation of one
 * request (contract in srv_int.h). A request generates exactly as `jlm run`
 * (completions) or the first turn of `jlm chat` (chat) does with the same
 * sampling parameters: same tokenization, same sampler chain, same
 * detokenizer, on a fresh KV cache. */
#include "serve/srv_int.h"

#include "engine/chat.h"
#include "engine/chat_prompt.h"
#include "engine/sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static uint64_t now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

/* ---------------------------------------------------------------- jobs */

static int job_append(srv_job *j, const char *p, size_t n)
{
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 1024;
        while (cap < j->len + n + 1) cap *= 2;
        char *o = realloc(j->out, cap);
        if (!o) return JLM_ENOMEM;
        j->out = o;
        j->cap = cap;
    }
    memcpy(j->out + j->len, p, n);
    j->len += n;
    j->out[j->len] = 0;
    return 0;
}

/* Appends one JSON object as an SSE event; takes the reference. */
static void job_event(srv_job *j, json_t *ev)
{
    size_t n = 0;
    char *s = ev ? jlm_srv_sse(ev, &n) : NULL;
    json_decref(ev);
    pthread_mutex_lock(&j->mu);
    if (!s || job_append(j, s, n)) {
        j->status = 500;
        snprintf(j->errmsg, sizeof j->errmsg, "out of memory");
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(s);
}

/* Hands text to the client: a chunk when streaming, else appended. */
static void job_emit(srv_job *j, const char *p, size_t n, int first)
{
    if (j->req.stream) {
        job_event(j, jlm_srv_json_chunk(&j->ident, p, n, first && j->ident.kind == JLM_SRV_CHAT, NULL));
        return;
    }
    pthread_mutex_lock(&j->mu);
    if (job_append(j, p, n)) {
        j->status = 500;
        snprintf(j->errmsg, sizeof j->errmsg, "out of memory");
    }
    pthread_mutex_unlock(&j->mu);
}

static void job_finish(srv_job *j, int status, const char *msg)
{
    if (j->req.stream) {
        if (status == 200) {
            job_event(j, jlm_srv_json_chunk(&j->ident, "", 0, 0, &j->res));
            if (j->req.include_usage)
                job_event(j, jlm_srv_json_usage_chunk(&j->ident, &j->res));
        } else {
            job_event(j, jlm_srv_json_error(status, msg));
        }
    }
    pthread_mutex_lock(&j->mu);
    if (j->req.stream)
        job_append(j, "data: [DONE]\n\n", 14);
    if (status != 200 && j->status == 200) {
        j->status = status;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
    }
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void srv_job_unref(srv_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    struct jlm_srv *s = j->m->srv;
    jlm_srv_req_free(&j->req);
    free(j->prompt);
    free(j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    pthread_mutex_lock(&s->mu);
    s->in_flight--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- prompts */

/* A copy of the messages with every content given as parts ([{type: text,
 * text}], checked by api.c) joined into one string with "\n", as llama.cpp's
 * server does; the renderer types it again for a template that needs parts. */
static json_t *flatten_parts(const json_t *msgs)
{
    json_t *out = json_deep_copy(msgs), *m;
    size_t i;
    json_array_foreach(out, i, m) {
        json_t *c = json_object_get(m, "content"), *p;
        if (!json_is_array(c))
            continue;
        char *text = NULL;
        size_t len = 0, j;
        FILE *f = open_memstream(&text, &len);
        json_array_foreach(c, j, p)
            if (f) fprintf(f, "%s%s", j ? "\n" : "", json_string_value(json_object_get(p, "text")));
        if (!f || fclose(f) || json_object_set_new(m, "content", json_stringn(text, len))) {
            free(text);
            json_decref(out);
            return NULL;
        }
        free(text);
    }
    return out;
}

/* The chat prompt as `jlm chat` renders its first turn: the template with a
 * generation prompt, a leading BOS text dropped when the vocab adds BOS. */
static int chat_prompt(srv_model *m, const json_t *msgs, int32_t **ids, size_t *n, jlm_err *err)
{
    jlm_chat_opts co = {.add_generation_prompt = 1, .bos_token = m->bos, .eos_token = m->eos, .local_time = 1};
    char *text = NULL;
    size_t len;
    json_t *flat = flatten_parts(msgs);
    if (!flat)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    int rc = jlm_chat_render_json(m->tmpl, strlen(m->tmpl), flat, &co, 1, &text, &len, err);
    json_decref(flat);
    if (rc)
        return jlm_err_prefix(err, JLM_EINVAL, "'messages': chat template");
    const jlm_vocab *v = &jlm_engine_model(m->e)->vocab;
    const char *p = text;
    if (v->add_bos && *m->bos && !strncmp(p, m->bos, strlen(m->bos)))
        p += strlen(m->bos);
    rc = jlm_tok_encode(m->tok, p, strlen(p), 1, 1, ids, n, err);
    free(text);
    return rc;
}

static void make_ident(srv_job *j)
{
    static atomic_ullong seq;
    unsigned long long k = atomic_fetch_add(&seq, 1) + 1;
    snprintf(j->ident.id, sizeof j->ident.id, "%s-%llx%06llx", j->req.kind == JLM_SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)time(NULL), k);
    j->ident.created = (int64_t)time(NULL);
    j->ident.model = j->m->id;
    j->ident.kind = j->req.kind;
}

int srv_job_create(srv_model *m, jlm_srv_req *req, srv_job **out, jlm_err *err)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = req->kind == JLM_SRV_CHAT ? chat_prompt(m, req->messages, &ids, &n, err)
                                       : jlm_tok_encode(m->tok, req->prompt, strlen(req->prompt), 1, 0, &ids, &n, err);
    if (rc)
        return rc;
    uint32_t n_ctx = jlm_engine_n_ctx(m->e);
    if (n == 0 || n >= n_ctx) {
        free(ids);
        return n == 0 ? jlm_errf(err, JLM_EINVAL, "the prompt is empty after tokenization")
                      : jlm_errf(err, JLM_EINVAL, "the prompt is %zu tokens; the context holds %u", n, n_ctx);
    }
    srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(ids);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    j->m = m;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->prompt = ids;
    j->n_prompt = n;
    uint64_t room = n_ctx - n;
    j->max_tokens = (uint32_t)(j->req.max_tokens >= 0 && (uint64_t)j->req.max_tokens < room ? (uint64_t)j->req.max_tokens : room);
    j->refs = 2;
    j->status = 200;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    make_ident(j);
    if (!j->req.seeded)
        j->req.samp.seed = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)j << 16) ^ now_us();
    pthread_mutex_lock(&m->srv->mu);
    m->srv->in_flight++;
    pthread_mutex_unlock(&m->srv->mu);
    *out = j;
    return 0;
}

/* ---------------------------------------------------------------- generation */

typedef struct gen_state {
    jlm_tok_stream ts;
    char  *text;            /* (cap,) everything generated so far */
    size_t len, cap, sent;  /* sent: bytes of text already emitted */
    char  *piece;
    size_t piece_cap;
} gen_state;

/* Adds bytes to the text and emits what no stop string can still claim;
 * 1 when a stop string was hit. */
static int gen_push(srv_job *j, gen_state *g, const char *p, size_t n, int final)
{
    if (g->len + n + 1 > g->cap) {
        size_t cap = (g->len + n + 1) * 2;
        char *t = realloc(g->text, cap);
        if (!t) return -1;
        g->text = t;
        g->cap = cap;
    }
    memcpy(g->text + g->len, p, n);
    g->len += n;
    int hit;
    size_t safe = jlm_srv_stop_scan(&j->req, g->text, g->len, final, &hit);
    if (safe > g->sent) {
        job_emit(j, g->text + g->sent, safe - g->sent, g->sent == 0);
        g->sent = safe;
    }
    return hit;
}

/* Samples and evaluates until EOG, a stop string, max_tokens or cancel. */
static int gen_loop(srv_job *j, jlm_sampler *s, float *logits, gen_state *g, jlm_err *err)
{
    srv_model *m = j->m;
    const char *fin = "length";
    uint32_t n_gen = 0;
    int rc = 0, hit = 0;
    while (n_gen < j->max_tokens && !atomic_load(&j->cancelled)) {
        int32_t id = jlm_samp_next(s, logits);
        jlm_samp_accept(s, id);
        n_gen++;
        if (!j->req.ignore_eos && jlm_tok_is_eog(m->tok, id)) {
            fin = "stop";
            break;
        }
        size_t n = 0;
        if (jlm_tok_stream_feed(&g->ts, id, g->piece, g->piece_cap, &n, err) == 0 && n &&
            (hit = gen_push(j, g, g->piece, n, 0)) != 0)
            break;
        if (hit < 0 || n_gen == j->max_tokens)
            break;
        if ((rc = jlm_engine_eval(m->e, &id, 1, logits, err)) != 0)
            break;
    }
    char tail[4];
    size_t nt = jlm_tok_stream_flush(&g->ts, tail);
    if (!rc && hit == 0)
        hit = gen_push(j, g, tail, nt, 1);
    if (hit > 0)
        fin = "stop";
    j->res.finish_reason = fin;
    j->res.completion_tokens = n_gen;
    atomic_fetch_add(&m->n_gen_tok, n_gen);
    return rc ? rc : hit < 0 ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
}

static void gen_run(srv_job *j)
{
    srv_model *m = j->m;
    jlm_err err = {0};
    jlm_sampler *s = NULL;
    gen_state g = {0};
    uint32_t nv = jlm_engine_n_vocab(m->e);
    float *logits = malloc(nv * sizeof *logits);
    g.piece_cap = jlm_tok_max_piece_len(m->tok) + 8;
    g.piece = malloc(g.piece_cap);
    jlm_tok_stream_init(&g.ts, m->tok, 0, 0);
    j->res.prompt_tokens = (uint32_t)j->n_prompt;
    jlm_engine_rewind(m->e, 0);
    int rc = !logits || !g.piece ? jlm_errf(&err, JLM_ENOMEM, "out of memory")
                                 : jlm_samp_create(&j->req.samp, nv, &s, &err);
    for (size_t i = 0; !rc && i < j->n_prompt; i++)
        jlm_samp_accept(s, j->prompt[i]);
    if (!rc) rc = jlm_engine_eval(m->e, j->prompt, (uint32_t)j->n_prompt, logits, &err);
    atomic_fetch_add(&m->n_prompt_tok, j->n_prompt);
    if (!rc) rc = gen_loop(j, s, logits, &g, &err);
    if (atomic_load(&j->cancelled))
        atomic_fetch_add(&m->n_cancelled, 1);
    job_finish(j, rc ? 500 : 200, err.msg);
    jlm_samp_destroy(s);
    free(logits);
    free(g.piece);
    free(g.text);
}

/* ---------------------------------------------------------------- workers */

static void *worker_main(void *arg)
{
    srv_model *m = arg;
    for (;;) {
        pthread_mutex_lock(&m->mu);
        while (!m->q_len && !m->stop)
            pthread_cond_wait(&m->cv, &m->mu);
        if (!m->q_len) {
            pthread_mutex_unlock(&m->mu);
            return NULL;
        }
        srv_job *j = m->q[m->q_head];
        m->q_head = (m->q_head + 1) % m->q_cap;
        m->q_len--;
        m->running = 1;
        pthread_mutex_unlock(&m->mu);
        uint64_t t0 = now_us();
        if (atomic_load(&j->cancelled)) {
            atomic_fetch_add(&m->n_cancelled, 1);
            job_finish(j, 499, "cancelled");
        } else {
            gen_run(j);
        }
        atomic_fetch_add(&m->busy_us, now_us() - t0);
        atomic_fetch_add(&m->n_done, 1);
        pthread_mutex_lock(&m->mu);
        m->running = 0;
        jlm_pager_stats(jlm_engine_pager(m->e), &m->pc);   /* the pager is this thread's alone */
        pthread_mutex_unlock(&m->mu);
        srv_job_unref(j);
    }
}

int srv_job_submit(srv_job *j)
{
    srv_model *m = j->m;
    pthread_mutex_lock(&m->mu);
    int full = m->q_len == m->q_cap || m->stop;
    if (!full) {
        m->q[(m->q_head + m->q_len) % m->q_cap] = j;
        m->q_len++;
        pthread_cond_signal(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
    return full ? JLM_ERANGE : 0;
}

/* ---------------------------------------------------------------- models */

/* A jlmfs view is a directory holding model.jlm; its id is the directory's
 * stem. A file's id is its name without ".jlm". */
static int model_paths(const char *path, char **container, char **id)
{
    struct stat st;
    int dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *b = path + n;
    while (b > path && b[-1] != '/') b--;
    size_t bl = (size_t)(path + n - b);
    if (bl > 4 && !strncmp(b + bl - 4, ".jlm", 4)) bl -= 4;
    *id = strndup(b, bl);
    if (dir) {
        if (asprintf(container, "%.*s/model.jlm", (int)n, path) < 0) *container = NULL;
    } else {
        *container = strdup(path);
    }
    return *id && *container ? 0 : -1;
}

static int model_load(srv_model *m, const jlm_engine_opts *eo, jlm_err *err)
{
    int fallback;
    int rc = jlm_engine_open(m->path, eo, &m->e, err);
    if (!rc) rc = jlm_tok_create(&jlm_engine_model(m->e)->vocab, &m->tok, err);
    if (!rc) rc = jlm_chat_template_or_chatml(m->path, &jlm_engine_model(m->e)->vocab, &m->tmpl, &m->bos, &m->eos,
                                              &fallback, err);
    return rc ? jlm_err_prefix(err, rc, "model '%s'", m->id) : 0;
}

int srv_model_open(struct jlm_srv *s, const char *path, srv_model **out, jlm_err *err)
{
    srv_model *m = calloc(1, sizeof *m);
    if (!m)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    m->srv = s;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    m->q_cap = (size_t)(s->o.queue > 0 ? s->o.queue : 8);
    m->q = calloc(m->q_cap, sizeof *m->q);
    int rc = !m->q || model_paths(path, &m->path, &m->id) ? jlm_errf(err, JLM_ENOMEM, "out of memory")
                                                          : model_load(m, &s->o.eng, err);
    if (!rc && pthread_create(&m->worker, NULL, worker_main, m))
        rc = jlm_errf(err, JLM_ENOMEM, "model '%s': cannot start its worker thread", m->id);
    m->started = !rc;
    if (rc) {
        srv_model_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

void srv_model_close(srv_model *m)
{
    if (!m) return;
    if (m->started) {
        pthread_mutex_lock(&m->mu);
        m->stop = 1;
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->worker, NULL);
    }
    jlm_tok_destroy(m->tok);
    jlm_engine_close(m->e);
    free(m->tmpl); free(m->bos); free(m->eos);
    free(m->q); free(m->id); free(m->path);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}
