/* gen.c - served models, their generation workers and the generation of one
 * request (contract in srv_int.h). A request generates exactly as `jlm run`
 * (completions) or the first turn of `jlm chat` (chat) does with the same
 * sampling parameters: same tokenization, same sampler chain, same
 * detokenizer, on a fresh KV cache or one loaded from the prefix cache
 * (prefix.c) with what evaluating those tokens writes. */
#include "serve/srv_int.h"

#include "text/template/chat.h"
#include "prompt/session.h"
#include "prompt/image_prompt.h"
#include "residency/residency.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t jlm_srv_now_us(void)
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

void jlm_srv_job_write(srv_job *j, const char *p, size_t n)
{
    pthread_mutex_lock(&j->mu);
    if (job_append(j, p, n)) {
        j->status = 500;
        snprintf(j->errmsg, sizeof j->errmsg, "out of memory");
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* The job whose stream a job's events go to: choice 0's. */
static srv_job *job_sink(srv_job *j) { return j->group ? j->group : j; }

static int job_cancelled(srv_job *j)
{
    return atomic_load(&j->cancelled) || (j->group && atomic_load(&j->group->cancelled));
}

/* Appends one JSON object as an SSE event (to the choices' stream); takes
 * the reference. */
static void job_event(srv_job *j, json_t *ev)
{
    size_t n = 0;
    char *s = ev ? jlm_srv_sse(ev, &n) : NULL;
    json_decref(ev);
    j = job_sink(j);
    pthread_mutex_lock(&j->mu);
    if (!s || job_append(j, s, n)) {
        j->status = 500;
        snprintf(j->errmsg, sizeof j->errmsg, "out of memory");
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(s);
}

/* The logprobs recorded since the last chunk, in the response's shape; NULL
 * when not asked for or none. */
static json_t *job_take_lp(srv_job *j)
{
    if (!j->lp_pending || !json_array_size(j->lp_pending))
        return NULL;
    json_t *lp = jlm_srv_json_logprobs(j->ident.kind, j->lp_pending, &j->lp_offset);
    j->lp_pending = json_array();
    return lp;
}

/* Hands text to the client: a chunk when streaming (with the logprobs of the
 * tokens sampled since the last one), else appended. */
static void job_emit(srv_job *j, const char *p, size_t n, int first)
{
    if (j->req.stream && j->dia) {
        j->dia->piece(j, p, n);
        return;
    }
    if (j->req.stream) {
        json_t *c = jlm_srv_json_chunk(&j->ident, p, n, first && j->ident.kind == JLM_SRV_CHAT, NULL);
        jlm_srv_json_set_logprobs(c, job_take_lp(j));
        job_event(j, c);
        return;
    }
    pthread_mutex_lock(&j->mu);
    if (job_append(j, p, n)) {
        j->status = 500;
        snprintf(j->errmsg, sizeof j->errmsg, "out of memory");
    }
    pthread_mutex_unlock(&j->mu);
}

/* A choice's end: its last chunk (or error event); the stream's end (usage,
 * [DONE]) and done when it is the last choice. */
static void job_finish(srv_job *j, int status, const char *msg)
{
    if (!j->req.stream && status == 200 && j->lp_pending) {
        j->lp_final = jlm_srv_json_logprobs(j->ident.kind, j->lp_pending, &j->lp_offset);
        j->lp_pending = NULL;
    }
    j->t_end_us = jlm_srv_now_us();
    if (j->req.stream && j->dia) {
        j->dia->close(j, status, msg);
    } else if (j->req.stream) {
        if (status == 200) {
            json_t *c = jlm_srv_json_chunk(&j->ident, "", 0, 0, &j->res);
            jlm_srv_json_set_logprobs(c, job_take_lp(j));
            job_event(j, c);
        } else {
            job_event(j, jlm_srv_json_error(status, msg));
        }
    }
    srv_job *g = job_sink(j);
    if (g != j) {   /* a later choice: its own end, read by send_whole through the group */
        pthread_mutex_lock(&j->mu);
        j->done = 1;
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_lock(&g->mu);
    g->sum_completion += j->res.completion_tokens;
    int last = --g->n_left == 0;
    if (status != 200 && g->status == 200) {
        g->status = status;
        snprintf(g->errmsg, sizeof g->errmsg, "%s", msg);
    }
    int usage = last && g->status == 200 && g->req.stream && !g->dia && g->req.include_usage;
    jlm_srv_result r = g->res;
    r.completion_tokens = g->sum_completion;
    pthread_mutex_unlock(&g->mu);
    if (usage)
        job_event(g, jlm_srv_json_usage_chunk(&g->ident, &r));
    pthread_mutex_lock(&g->mu);
    if (last) {
        if (g->req.stream && !g->dia)
            job_append(g, "data: [DONE]\n\n", 14);
        g->done = 1;
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void jlm_srv_job_unref(srv_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    struct jlm_srv *s = j->srv;
    for (size_t i = 0; i < j->n_subs; i++)
        jlm_srv_job_unref(j->subs[i]);
    free(j->subs);
    if (j->group) {   /* the request and the image are choice 0's */
        memset(&j->req, 0, sizeof j->req);
        j->img = (jlm_image){0};
        j->img_text = NULL;
    }
    jlm_srv_req_free(&j->req);
    free(j->model_id);
    json_decref(j->lp_pending);
    json_decref(j->lp_final);
    json_decref(j->tc_calls);
    free(j->prompt);
    free(j->out);
    free(j->emb_off);
    free(j->emb);
    jlm_image_free(&j->img);
    free(j->img_text);
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
 * text}] and one image_url, checked by api.c) joined into one string with
 * "\n", an image as llama.cpp's media marker where the image goes, as
 * llama.cpp's server does; the renderer types it again for a template that
 * needs parts. */
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
            if (f) fprintf(f, "%s%s", j ? "\n" : "", json_object_get(p, "image_url") ? "<__media__>"
                                                                   : json_string_value(json_object_get(p, "text")));
        if (!f || fclose(f) || json_object_set_new(m, "content", json_stringn(text, len))) {
            free(text);
            json_decref(out);
            return NULL;
        }
        free(text);
    }
    return out;
}

/* The template a request renders with: the model's, or, for a model without
 * one, ChatML with Hermes tools when the request has tools or tool messages
 * (serve/toolcall.h); *fam: the call syntax it speaks. */
static const char *job_template(const srv_model *m, const jlm_srv_req *req, jlm_tc_family *fam)
{
    int fallback = m->tmpl != m->srv->o.chat_template && m->sess->tmpl_fallback;
    int tools = req->tc.tools != NULL;
    size_t i;
    const json_t *msg;
    json_array_foreach(req->messages, i, msg)
        tools |= json_object_get(msg, "tool_calls") != NULL || json_object_get(msg, "tool_call_id") != NULL;
    if (fallback && tools) {
        *fam = JLM_TC_HERMES;
        return jlm_tc_chatml_tools;
    }
    *fam = jlm_tc_family_of(m->tmpl, strlen(m->tmpl));
    return m->tmpl;
}

/* The chat prompt as `jlm chat` renders its first turn: the template with a
 * generation prompt (and the request's tools), a leading BOS text dropped
 * when the vocab adds BOS. */
static int chat_prompt(srv_model *m, const jlm_srv_req *req, const char *tmpl, int32_t **ids, size_t *n, char **out,
                       jlm_err *err)
{
    jlm_chat_opts co = {.add_generation_prompt = 1, .bos_token = m->bos, .eos_token = m->eos, .local_time = 1,
                        .cancelled = req->cancelled, .cancel_arg = req->cancel_arg, .tools = req->tc.tools};
    char *text = NULL;
    size_t len;
    json_t *msgs = jlm_tc_messages_for_template(req->messages);
    json_t *flat = msgs ? flatten_parts(msgs) : NULL;
    json_decref(msgs);
    if (!flat)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    int rc = jlm_chat_render_json(tmpl, strlen(tmpl), flat, &co, 1, &text, &len, err);
    json_decref(flat);
    if (rc)
        return jlm_err_prefix(err, JLM_EINVAL, "'messages': chat template");
    const jlm_vocab *v = &jlm_engine_model(m->e)->vocab;
    const char *p = text;
    if (v->add_bos && *m->bos && !strncmp(p, m->bos, strlen(m->bos)))
        p += strlen(m->bos);
    rc = jlm_tok_encode(m->tok, p, strlen(p), 1, 1, ids, n, err);
    if (!rc && out && !(*out = strdup(p)))
        rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
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
    j->ident.model = j->model_id;
    j->ident.kind = j->req.kind;
}

/* Tools of a chat request on its model: refused when the template renders
 * none; "required" and named choices compiled into the request's grammar. */
static int tc_setup(srv_model *m, jlm_srv_req *req, jlm_tc_family fam, jlm_err *err)
{
    if (!req->tc.tools || req->tc.choice == JLM_TC_OFF)
        return 0;
    if (fam == JLM_TC_NONE)
        return jlm_errf(err, JLM_EUNSUPPORTED, "'tools': the chat template of model '%s' renders no tools", m->id);
    if (req->tc.choice == JLM_TC_AUTO)
        return 0;
    if (req->gram)
        return jlm_errf(err, JLM_EINVAL, "'tool_choice': \"required\" or a function excludes grammar, json_schema and response_format");
    char *gbnf = NULL;
    int rc = jlm_tc_grammar(fam, &req->tc, &gbnf, err);
    if (!rc) rc = jlm_gram_parse(gbnf, strlen(gbnf), &req->gram, err);
    free(gbnf);
    return rc;
}

/* An image request on its model: refused without a vision tower; the
 * picture decoded (errors name the part). */
static int image_setup(const srv_model *m, const jlm_srv_req *req, jlm_image *img, jlm_err *err)
{
    if (!jlm_engine_model(m->e)->has_vision)
        return jlm_errf(err, JLM_EUNSUPPORTED, "'%s': model '%s' has no vision tower (convert it with --mmproj)",
                        req->image_what, m->id);
    char what[80];
    snprintf(what, sizeof what, "'%s'", req->image_what);
    return jlm_image_load_mem(req->image, req->image_len, what, img, err);
}

int jlm_srv_job_create(srv_model *m, jlm_srv_req *req, srv_job **out, jlm_err *err)
{
    int32_t *ids = NULL;
    size_t n = 0, n_emb = 0;
    uint32_t *emb_off = NULL;
    jlm_tc_family fam = JLM_TC_NONE;
    char *img_text = NULL;
    jlm_image img = {0};
    const char *tmpl = req->kind == JLM_SRV_CHAT ? job_template(m, req, &fam) : NULL;
    int rc = req->kind == JLM_SRV_CHAT ? tc_setup(m, req, fam, err) : 0;
    if (!rc && req->image)
        rc = image_setup(m, req, &img, err);
    if (!rc)
        rc = req->kind == JLM_SRV_EMBED ? jlm_srv_embed_tokens(m, req, &ids, &n, &emb_off, &n_emb, err)
           : req->kind == JLM_SRV_CHAT  ? chat_prompt(m, req, tmpl, &ids, &n, req->image ? &img_text : NULL, err)
                                        : jlm_tok_encode(m->tok, req->prompt, strlen(req->prompt), 1, 0, &ids, &n, err);
    if (rc) {
        jlm_image_free(&img);
        return rc;
    }
    uint32_t n_ctx = jlm_engine_n_ctx(m->e);
    if (req->kind != JLM_SRV_EMBED && (n == 0 || n >= n_ctx)) {
        free(ids);
        free(img_text);
        jlm_image_free(&img);
        return n == 0 ? jlm_errf(err, JLM_EINVAL, "the prompt is empty after tokenization")
                      : jlm_errf(err, JLM_EINVAL, "the prompt is %zu tokens; the context holds %u", n, n_ctx);
    }
    srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(ids);
        free(emb_off);
        free(img_text);
        jlm_image_free(&img);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    j->img = img;
    j->img_text = img_text;
    j->emb_off = emb_off;
    j->n_emb = n_emb;
    j->t_start_us = jlm_srv_now_us();
    j->m = m;
    j->srv = m->srv;
    if (!(j->model_id = strdup(m->id))) {
        free(ids);
        free(emb_off);
        free(img_text);
        jlm_image_free(&j->img);
        free(j);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->prompt = ids;
    j->n_prompt = n;
    uint64_t room = n_ctx - n;
    j->max_tokens = (uint32_t)(j->req.max_tokens >= 0 && (uint64_t)j->req.max_tokens < room ? (uint64_t)j->req.max_tokens : room);
    j->refs = 2;
    j->status = 200;
    j->lp_pending = j->req.logprobs ? json_array() : NULL;
    j->tc_family = fam;
    j->tc_active = j->req.tc.tools && j->req.tc.choice != JLM_TC_OFF;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    make_ident(j);
    if (!j->req.seeded)
        j->req.samp.seed = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)j << 16) ^ jlm_srv_now_us();
    j->tc_ids = j->req.samp.seed ^ jlm_srv_now_us();
    j->n_left = 1;
    pthread_mutex_lock(&m->srv->mu);
    m->srv->in_flight++;
    pthread_mutex_unlock(&m->srv->mu);
    if (jlm_srv_job_fork(j, err)) {
        *req = j->req;   /* the caller frees it */
        memset(&j->req, 0, sizeof j->req);
        jlm_srv_job_drop(j);
        return JLM_ENOMEM;
    }
    *out = j;
    return 0;
}

int jlm_srv_job_fork(srv_job *j, jlm_err *err)
{
    int n = j->req.n;
    if (n <= 1)
        return 0;
    if (!(j->subs = calloc((size_t)n - 1, sizeof *j->subs)))
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    for (int i = 1; i < n; i++) {
        srv_job *c = calloc(1, sizeof *c);
        int32_t *ids = malloc(j->n_prompt * sizeof *ids);
        char *id = strdup(j->model_id);
        if (!c || !ids || !id) {
            free(c); free(ids); free(id);
            return jlm_errf(err, JLM_ENOMEM, "out of memory");
        }
        memcpy(ids, j->prompt, j->n_prompt * sizeof *ids);
        c->req = j->req;   /* shared: freed with choice 0 */
        c->req.cancelled = NULL;   /* the template is rendered: the watch is the connection's */
        c->req.samp.seed = j->req.seeded ? j->req.samp.seed + (uint64_t)i
                                         : j->req.samp.seed ^ jlm_srv_now_us() ^ ((uint64_t)(uintptr_t)c << 16);
        c->ident = j->ident;
        c->ident.model = c->model_id = id;
        c->ident.index = i;
        c->srv = j->srv;
        c->m = j->m;
        c->prompt = ids;
        c->n_prompt = j->n_prompt;
        c->max_tokens = j->max_tokens;
        c->lp_pending = j->req.logprobs ? json_array() : NULL;
        c->tc_family = j->tc_family;
        c->tc_active = j->tc_active;
        c->tc_ids = c->req.samp.seed ^ jlm_srv_now_us();
        c->img = j->img;
        c->img_text = j->img_text;
        c->t_start_us = j->t_start_us;
        c->refs = 2;   /* choice 0's, the worker's */
        c->status = 200;
        c->group = j;
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        pthread_mutex_lock(&j->srv->mu);
        j->srv->in_flight++;
        pthread_mutex_unlock(&j->srv->mu);
        j->subs[j->n_subs++] = c;
        j->refs++;     /* held by c's worker side */
        j->n_left++;
    }
    return 0;
}

void jlm_srv_job_drop(srv_job *j)
{
    for (size_t i = 0; i < j->n_subs; i++) {
        jlm_srv_job_unref(j->subs[i]);   /* its worker side */
        jlm_srv_job_unref(j);            /* its hold on j */
    }
    jlm_srv_job_unref(j);
    jlm_srv_job_unref(j);
}

void jlm_srv_job_add_choices(const srv_job *j, json_t *done)
{
    json_t *choices = json_object_get(done, "choices"), *u = json_object_get(done, "usage");
    for (size_t i = 0; i < j->n_subs; i++) {
        const srv_job *c = j->subs[i];
        json_t *one = jlm_srv_json_completion(&c->ident, c->out ? c->out : "", c->len, &c->res);
        if (one && c->lp_final)
            jlm_srv_json_set_logprobs(one, json_incref(c->lp_final));
        json_array_append(choices, json_array_get(json_object_get(one, "choices"), 0));
        json_decref(one);
    }
    json_int_t ct = j->sum_completion, pt = json_integer_value(json_object_get(u, "prompt_tokens"));
    json_object_set_new(u, "completion_tokens", json_integer(ct));
    json_object_set_new(u, "total_tokens", json_integer(pt + ct));
}

/* ---------------------------------------------------------------- generation
 * Continuous batching: a model's worker holds up to `parallel` slots, each a
 * request with its own KV cache (jlm_engine_seq), sampler and detokenizer.
 * A step admits waiting requests into free slots (evaluating each one's
 * prompt alone), then runs one forward pass over the next token of every
 * active slot (jlm_engine_eval_batch) and samples each from its own logits.
 * Per sequence this computes exactly what it computes alone (model.h), so a
 * request's output does not depend on the others in the batch. A finished,
 * cancelled or failed slot leaves at the step it ends. */

typedef struct gen_state {
    jlm_tok_stream ts;
    char  *text;            /* (cap,) everything generated so far */
    size_t len, cap, sent;  /* sent: bytes of text already emitted */
} gen_state;

typedef struct slot {
    srv_job        *j;      /* NULL: free */
    jlm_engine_seq *seq;    /* kept across requests once created */
    jlm_sampler    *s;
    jlm_gram_match *gm;     /* the request's grammar state; NULL: unconstrained */
    gen_state       g;
    uint32_t        n_gen;
    int32_t         next;   /* the token the next step evaluates */
    int32_t        *toks;   /* (n_toks, toks_cap) the prompt and the tokens sampled: what seq holds */
    size_t          n_toks, toks_cap;
} slot;

/* Appends id to the slot's tokens; 0, or -1 when out of memory. */
static int slot_push(slot *sl, int32_t id)
{
    if (sl->n_toks == sl->toks_cap) {
        size_t cap = sl->toks_cap ? sl->toks_cap * 2 : 256;
        int32_t *t = realloc(sl->toks, cap * sizeof *t);
        if (!t) return -1;
        sl->toks = t;
        sl->toks_cap = cap;
    }
    sl->toks[sl->n_toks++] = id;
    return 0;
}

/* Adds bytes to the text and emits what no stop string can still claim;
 * 1 when a stop string was hit, -1 on OOM. */
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
    if (j->tc_active) {   /* what may be a call waits for the end (tc_finish) */
        size_t c = j->req.stream ? jlm_tc_content_prefix(j->tc_family, g->text, safe, 0) : 0;
        safe = c < safe ? c : safe;
    }
    if (safe > g->sent) {
        job_emit(j, g->text + g->sent, safe - g->sent, g->sent == 0);
        g->sent = safe;
    }
    return hit;
}

/* A tool request's end: the reply not sent yet (up to a stop string) parsed
 * into content and calls (serve/toolcall.h), the content handed out, the
 * calls streamed as deltas or kept for the completion object; 0 or -1 (OOM). */
static int tc_finish(srv_job *j, gen_state *g)
{
    int hit;
    const char *text = g->text ? g->text : "";   /* NULL: nothing was generated */
    size_t end = jlm_srv_stop_scan(&j->req, text, g->len, 1, &hit);
    jlm_tc_result r;
    jlm_err err = {0};
    if (end < g->sent) end = g->sent;
    if (jlm_tc_parse(j->tc_family, text + g->sent, end - g->sent, &j->tc_ids, &r, &err))
        return -1;
    int first = g->sent == 0;
    if (r.content_len) job_emit(j, r.content, r.content_len, first);
    first &= r.content_len == 0;
    if (j->req.stream && j->dia && json_array_size(r.calls))
        j->dia->calls(j, r.calls);
    json_t *ds = j->req.stream && !j->dia ? jlm_tc_deltas(r.calls, 32) : NULL, *d;
    size_t i;
    json_array_foreach(ds, i, d) {
        job_event(j, jlm_srv_json_delta_chunk(&j->ident, json_incref(d), first));
        first = 0;
    }
    json_decref(ds);
    g->sent = g->len;
    j->tc_calls = r.calls;
    j->res.tool_calls = r.calls;
    free(r.content);
    return 0;
}

/* Ends the slot's request: flushes the detokenizer (unless it failed), sends
 * the end, frees the slot for the next request. */
static void slot_end(srv_model *m, slot *sl, const char *fin, int status, const char *msg)
{
    srv_job *j = sl->j;
    int kv_ok = status == 200 && !j->img.rgb;   /* the sequence holds what its tokens say (an image's: more) */
    char tail[4];
    size_t nt = jlm_tok_stream_flush(&sl->g.ts, tail);
    int hit = status == 200 ? gen_push(j, &sl->g, tail, nt, 1) : 0;
    if (hit >= 0 && status == 200 && j->tc_active && tc_finish(j, &sl->g)) hit = -1;
    if (hit < 0) { status = 500; msg = "out of memory"; }
    j->res.finish_reason = json_array_size(j->tc_calls) ? "tool_calls" : hit > 0 ? "stop" : fin;
    if (hit > 0)
        j->res.stop_sequence = j->req.stop[hit - 1];   /* the stop scan's: the first in the text */
    j->res.completion_tokens = sl->n_gen;
    atomic_fetch_add(&m->n_gen_tok, sl->n_gen);
    if (job_cancelled(j)) {
        atomic_fetch_add(&m->n_cancelled, 1);
        if (status == 200) { status = 499; msg = "cancelled"; }
    }
    job_finish(j, status, msg);
    atomic_fetch_add(&m->n_done, 1);
    jlm_samp_destroy(sl->s);
    jlm_gram_match_free(sl->gm);
    free(sl->g.text);
    uint32_t held = sl->seq ? jlm_engine_seq_n_past(sl->seq) : 0;
    if (kv_ok && held <= sl->n_toks)
        jlm_srv_pcache_put(m, sl->seq, sl->toks, held);
    if (sl->seq)
        jlm_engine_seq_rewind(sl->seq, 0);
    *sl = (slot){.seq = sl->seq, .toks = sl->toks, .toks_cap = sl->toks_cap};
    srv_job *g = j->group;
    jlm_srv_job_unref(j);
    jlm_srv_job_unref(g);   /* the hold of a later choice on choice 0 */
}

/* Records token id's log-probability under logits (log-softmax in double)
 * and the top_logprobs most likely tokens (ties: lower id first). */
static void lp_record(srv_model *m, srv_job *j, const float *logits, int32_t id)
{
    uint32_t nv = jlm_engine_n_vocab(m->e);
    int32_t best[20];
    int nb = 0, want = j->req.top_logprobs;
    double mx = logits[0], sum = 0;
    for (uint32_t i = 1; i < nv; i++) if (logits[i] > mx) mx = logits[i];
    for (uint32_t i = 0; i < nv; i++) {
        sum += exp((double)logits[i] - mx);
        if (!want || (nb == want && !(logits[i] > logits[best[nb - 1]])))
            continue;
        int k = nb < want ? nb++ : want - 1;   /* full: the last one drops out */
        while (k > 0 && logits[i] > logits[best[k - 1]]) { best[k] = best[k - 1]; k--; }
        best[k] = (int32_t)i;
    }
    double lse = mx + log(sum);
    const char *p;
    size_t n;
    json_t *e = jlm_tok_piece(m->tok, id, 0, &p, &n, NULL) ? NULL : jlm_srv_json_lp_entry(p, n, logits[id] - lse);
    for (int k = 0; e && k < nb; k++)
        if (!jlm_tok_piece(m->tok, best[k], 0, &p, &n, NULL))
            jlm_srv_json_lp_add_top(e, p, n, logits[best[k]] - lse);
    if (e) json_array_append_new(j->lp_pending, e);
}

/* Samples the slot's next token from logits and hands out its text; ends the
 * request at EOG, a stop string or max_tokens. */
static void slot_sample(srv_model *m, slot *sl, const float *logits, char *piece, size_t piece_cap)
{
    srv_job *j = sl->j;
    if (sl->n_gen == j->max_tokens || job_cancelled(j)) {
        slot_end(m, sl, "length", 200, "");
        return;
    }
    if (sl->gm && jlm_gram_mask(sl->gm, m->gv, (int32_t)(j->max_tokens - sl->n_gen), (float *)logits) <= 0) {
        slot_end(m, sl, "stop", 200, "");   /* nothing can follow: the grammar is complete */
        return;
    }
    int32_t id = jlm_samp_next(sl->s, logits);
    jlm_samp_accept(sl->s, id);
    sl->n_gen++;
    if (sl->gm && !jlm_tok_is_eog(m->tok, id))
        jlm_gram_accept(sl->gm, m->gv, id, NULL);   /* cannot fail: id passed the mask */
    int eog = !j->req.ignore_eos && jlm_tok_is_eog(m->tok, id);
    if (j->lp_pending && !eog)
        lp_record(m, j, logits, id);
    if (eog) {
        slot_end(m, sl, "stop", 200, "");
        return;
    }
    size_t n = 0;
    jlm_err err = {0};
    int hit = jlm_tok_stream_feed(&sl->g.ts, id, piece, piece_cap, &n, &err) == 0 && n
                  ? gen_push(j, &sl->g, piece, n, 0) : 0;
    if (hit == 0 && sl->n_gen < j->max_tokens && slot_push(sl, id))
        hit = -1;
    if (hit != 0 || sl->n_gen == j->max_tokens)
        slot_end(m, sl, hit > 0 ? "stop" : "length", hit < 0 ? 500 : 200, hit < 0 ? "out of memory" : "");
    else
        sl->next = id;
}

/* An image request's prompt (its text around the marker, the picture's
 * embeddings) on the slot's sequence, then its first token; or ends it. */
static void slot_image(srv_model *m, slot *sl, srv_job *j, float *logits, char *piece, size_t piece_cap, jlm_err *err)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = m->vt ? 0 : jlm_vtower_open(m->e, &m->vt, err);   /* only this worker uses it */
    if (!rc) rc = jlm_image_prompt_eval_seq(m->e, sl->seq, m->vt, m->tok, j->img_text, &j->img, logits, &ids, &n, err);
    for (size_t i = 0; !rc && i < n; i++)
        jlm_samp_accept(sl->s, ids[i]);
    free(ids);
    j->res.prompt_tokens = jlm_engine_seq_n_past(sl->seq);
    uint32_t room = jlm_engine_n_ctx(m->e) - j->res.prompt_tokens;   /* the image's positions too */
    if (j->max_tokens > room)
        j->max_tokens = room;
    atomic_fetch_add(&m->n_prompt_tok, j->res.prompt_tokens);
    j->t_first_us = jlm_srv_now_us();
    if (rc) {
        slot_end(m, sl, "length", rc == JLM_ENOMEM ? 503 : rc == JLM_ERANGE ? 400 : 500, err->msg);
        return;
    }
    slot_sample(m, sl, logits, piece, piece_cap);
}

/* Puts job j in slot sl and evaluates its prompt alone; 0 or ends it. */
static void slot_start(srv_model *m, slot *sl, srv_job *j, float *logits, char *piece, size_t piece_cap)
{
    jlm_err err = {0};
    sl->j = j;
    j->res.prompt_tokens = (uint32_t)j->n_prompt;
    jlm_tok_stream_init(&sl->g.ts, m->tok, j->tc_active, 0);   /* tools: call markers may be special tokens */
    if (job_cancelled(j)) {
        slot_end(m, sl, "length", 200, "");
        return;
    }
    int rc = sl->seq ? 0 : jlm_engine_seq_create(m->e, &sl->seq, &err);
    if (j->req.kind == JLM_SRV_EMBED) {   /* batched as prompts are: evaluated alone as it joins */
        if (!rc) rc = jlm_srv_embed_run(m, sl->seq, j, &err);
        atomic_fetch_add(&m->n_prompt_tok, j->n_prompt);
        slot_end(m, sl, "stop", rc == 0 ? 200 : rc == JLM_ENOMEM ? 503 : 500, rc ? err.msg : "");
        return;
    }
    if (!rc) rc = jlm_samp_create(&j->req.samp, jlm_engine_n_vocab(m->e), &sl->s, &err);
    if (!rc && j->req.gram && !m->gv) rc = jlm_gram_vocab_from_tok(m->tok, &m->gv, &err);   /* only this worker uses it */
    if (!rc && j->req.gram) rc = jlm_gram_match_new(j->req.gram, &sl->gm, &err);
    if (!rc && j->img.rgb) {   /* evaluated as `jlm run --image` does */
        slot_image(m, sl, j, logits, piece, piece_cap, &err);
        return;
    }
    for (size_t i = 0; !rc && i < j->n_prompt; i++)
        if (slot_push(sl, j->prompt[i]))
            rc = jlm_errf(&err, JLM_ENOMEM, "out of memory");
        else
            jlm_samp_accept(sl->s, j->prompt[i]);
    uint32_t shared = 0;
    const srv_pentry *pe = rc ? NULL : jlm_srv_pcache_find(m, j->prompt, (uint32_t)j->n_prompt, &shared);
    if (pe && jlm_engine_kv_load(m->e, sl->seq, pe->kv, pe->n, shared, &err))   /* as if prompt[0, shared) ran */
        shared = 0;   /* a device's copy failed: the whole prompt is evaluated */
    j->res.cached_tokens = shared;
    if (!rc) rc = jlm_engine_eval_seq(m->e, sl->seq, j->prompt + shared, (uint32_t)j->n_prompt - shared, logits, &err);
    atomic_fetch_add(&m->n_prompt_tok, j->n_prompt);
    atomic_fetch_add(&m->n_cached_tok, shared);
    j->t_first_us = jlm_srv_now_us();
    if (rc) {
        slot_end(m, sl, "length", rc == JLM_ENOMEM ? 503 : 500, err.msg);
        return;
    }
    if (j->req.echo)   /* completions: the prompt first, as given (no stop string applies to it) */
        job_emit(j, j->req.prompt, strlen(j->req.prompt), 1);
    slot_sample(m, sl, logits, piece, piece_cap);
}

/* ---------------------------------------------------------------- workers */

/* Takes waiting jobs into free slots; the number of active slots after. */
static int admit(srv_model *m, slot *slots, srv_job **taken)
{
    int n_active = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->parallel; i++) {
        taken[i] = NULL;
        if (!slots[i].j && m->q_len) {
            taken[i] = m->q[m->q_head];
            m->q_head = (m->q_head + 1) % m->q_cap;
            m->q_len--;
        }
        n_active += slots[i].j || taken[i];
    }
    m->running = n_active;
    pthread_mutex_unlock(&m->mu);
    return n_active;
}

/* One decode step over every active slot. */
static void step(srv_model *m, slot *slots, float *logits, char *piece, size_t piece_cap)
{
    jlm_engine_seq *seqs[JLM_SRV_MAX_PARALLEL];
    int32_t ids[JLM_SRV_MAX_PARALLEL];
    int who[JLM_SRV_MAX_PARALLEL];
    uint32_t n = 0, nv = jlm_engine_n_vocab(m->e);
    for (int i = 0; i < m->parallel; i++)
        if (slots[i].j) { seqs[n] = slots[i].seq; ids[n] = slots[i].next; who[n++] = i; }
    if (!n)
        return;
    jlm_err err = {0};
    atomic_fetch_add(&m->n_steps, 1);
    atomic_fetch_add(&m->n_step_seqs, n);
    if (jlm_engine_eval_batch(m->e, seqs, ids, n, logits, &err)) {
        for (uint32_t t = 0; t < n; t++)
            slot_end(m, &slots[who[t]], "length", 500, err.msg);
        return;
    }
    for (uint32_t t = 0; t < n; t++)
        slot_sample(m, &slots[who[t]], logits + (size_t)t * nv, piece, piece_cap);
}

static void *worker_main(void *arg)
{
    srv_model *m = arg;
    uint32_t nv = jlm_engine_n_vocab(m->e);
    size_t piece_cap = jlm_tok_max_piece_len(m->tok) + 8;
    slot slots[JLM_SRV_MAX_PARALLEL] = {{0}};
    srv_job *taken[JLM_SRV_MAX_PARALLEL];
    float *logits = malloc((size_t)m->parallel * nv * sizeof *logits);
    char *piece = malloc(piece_cap);
    for (;;) {
        pthread_mutex_lock(&m->mu);
        while (!m->q_len && !m->running && !m->stop)
            pthread_cond_wait(&m->cv, &m->mu);
        int quit = !m->q_len && !m->running && m->stop;
        pthread_mutex_unlock(&m->mu);
        if (quit)
            break;
        jlm_srv_budget_acquire(&m->srv->budget, m);
        pthread_mutex_lock(&m->pager_mu);
        uint64_t t0 = jlm_srv_now_us();
        admit(m, slots, taken);
        for (int i = 0; i < m->parallel; i++)
            if (taken[i]) {
                if (logits && piece) slot_start(m, &slots[i], taken[i], logits, piece, piece_cap);
                else { slots[i].j = taken[i]; slot_end(m, &slots[i], "length", 500, "out of memory"); }
            }
        step(m, slots, logits, piece, piece_cap);
        int active = 0;
        for (int i = 0; i < m->parallel; i++) active += slots[i].j != NULL;
        atomic_fetch_add(&m->busy_us, jlm_srv_now_us() - t0);
        pthread_mutex_lock(&m->mu);
        m->running = active;
        jlm_pager_stats(jlm_engine_pager(m->e), &m->pc);   /* the pager is used under pager_mu only */
        pthread_mutex_unlock(&m->mu);
        if (m->rep)
            m->srv->o.report->flush(m->rep);
        pthread_mutex_unlock(&m->pager_mu);
    }
    for (int i = 0; i < m->parallel; i++) {
        jlm_engine_seq_destroy(slots[i].seq);
        free(slots[i].toks);
    }
    free(logits);
    free(piece);
    pthread_mutex_lock(&m->mu);
    m->exited = 1;
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int jlm_srv_job_submit(srv_job *j)
{
    srv_model *m = j->m;
    pthread_mutex_lock(&m->mu);
    int full = m->q_cap - m->q_len < 1 + j->n_subs || m->stop;   /* every choice, or none */
    for (size_t i = 0; !full && i <= j->n_subs; i++) {
        m->q[(m->q_head + m->q_len) % m->q_cap] = i ? j->subs[i - 1] : j;
        m->q_len++;
    }
    if (!full)
        pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return full ? JLM_ERANGE : 0;
}

/* ---------------------------------------------------------------- models */

char *jlm_srv_model_stem(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *b = path + n;
    while (b > path && b[-1] != '/') b--;
    size_t bl = (size_t)(path + n - b);
    if (bl > 4 && !strncmp(b + bl - 4, ".jlm", 4)) bl -= 4;
    return strndup(b, bl);
}

/* The session's view finder when the command line gives no reporter: the
 * view's database is still found (its stats are served), nothing reported. */
static int find_view(const char *model, const char *container, char **db, char **key)
{
    return jlm_rdb_discover(model, db, key, NULL) == 0 || jlm_rdb_discover(container, db, key, NULL) == 0;
}

static const jlm_sess_view FIND_ONLY = {find_view, NULL, NULL, NULL};

static int model_load(srv_model *m, const jlm_engine_opts *opts, uint64_t budget, jlm_err *err)
{
    jlm_sess_opts so = {.eng = *opts, .view = m->srv->o.report ? m->srv->o.report : &FIND_ONLY,
                        .flags = JLM_SESS_TEMPLATE};
    so.eng.budget = budget;   /* the served models' total: the budget (budget.c) sets each one's share */
    int rc = jlm_session_open(m->given, &so, &m->sess, err);   /* on a view: the server's page-ins, as jlm run's */
    if (rc)
        return jlm_err_prefix(err, rc, "model '%s'", m->id);
    jlm_session *ss = m->sess;
    m->e = ss->e; m->tok = ss->tok; m->rep = ss->rep;
    m->tmpl = m->srv->o.chat_template ? (char *)m->srv->o.chat_template : ss->tmpl;   /* only read */
    m->bos = ss->bos; m->eos = ss->eos;
    m->rdb_path = ss->db_path; m->rdb_key = ss->key;
    return 0;
}

static srv_model *model_new(struct jlm_srv *s, const char *path, const char *id)
{
    srv_model *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->srv = s;
    atomic_init(&m->refs, 1);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    pthread_mutex_init(&m->pager_mu, NULL);
    m->q_cap = (size_t)(s->o.queue > 0 ? s->o.queue : 8);
    m->parallel = s->o.parallel > 0 ? s->o.parallel : 4;
    m->pcache.limit = s->o.no_prefix_cache ? 0 : s->o.prefix_cache ? s->o.prefix_cache : (uint64_t)1 << 30;
    if (m->parallel > JLM_SRV_MAX_PARALLEL) m->parallel = JLM_SRV_MAX_PARALLEL;
    if ((uint32_t)m->parallel > jlm_engine_max_batch()) m->parallel = (int)jlm_engine_max_batch();
    m->q = calloc(m->q_cap, sizeof *m->q);
    m->given = strdup(path);
    m->path = jlm_session_container(path);
    m->id = id ? strdup(id) : jlm_srv_model_stem(path);
    if (!m->q || !m->given || !m->path || !m->id) {
        jlm_srv_model_close(m);
        return NULL;
    }
    return m;
}

int jlm_srv_model_pending(struct jlm_srv *s, const char *path, const char *id, const char *status, srv_model **out)
{
    srv_model *m = model_new(s, path, id);
    if (!m || !(m->status = strdup(status))) {
        jlm_srv_model_close(m);
        return JLM_ENOMEM;
    }
    *out = m;
    return 0;
}

int jlm_srv_model_open(struct jlm_srv *s, const char *path, const char *id, srv_model **out, jlm_err *err)
{
    srv_model *m = model_new(s, path, id);
    if (!m)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    int rc = model_load(m, &s->o.eng, s->budget.total, err);
    if (!rc) rc = jlm_srv_budget_join(&s->budget, m, err);
    if (!rc && pthread_create(&m->worker, NULL, worker_main, m))
        rc = jlm_errf(err, JLM_ENOMEM, "model '%s': cannot start its worker thread", m->id);
    m->started = !rc;
    if (rc) {
        jlm_srv_model_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

void jlm_srv_model_close(srv_model *m)
{
    if (!m) return;
    if (m->started) {
        pthread_mutex_lock(&m->mu);
        m->stop = 1;
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->worker, NULL);
    }
    if (m->in_budget)
        jlm_srv_budget_leave(&m->srv->budget, m);
    jlm_gram_vocab_free(m->gv);
    jlm_vtower_close(m->vt);
    jlm_srv_pcache_free(m);
    jlm_session_close(m->sess);   /* the worker has stopped and the budget let go */
    free(m->status); free(m->given);
    free(m->q); free(m->id); free(m->path);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->pager_mu);
    free(m);
}
