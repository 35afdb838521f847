/* server.c - the HTTP side of `jlm serve` (contract in server.h): routing,
 * body limit, API key, JSON and SSE responses, metrics, drain. HTTP itself is
 * libmicrohttpd's, one thread per connection, so a handler may block on its
 * job (non-streamed) and a stream reader may wait for the next token. */
#include "serve/http_int.h"

#include "residency/residency.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CONN_LIMIT     64   /* connections served at once, all addresses together */
#define CONN_RESERVE    8   /* more connections beyond CONN_LIMIT, answering /health only */
#define RESERVE_HEADER_S 2  /* a reserve connection's header deadline */
#define CONN_TIMEOUT_S 60   /* an idle connection is closed after this */
#define WATCH_MS      200   /* how often the deadline watchdog looks */
#define PING_S          2   /* a stream waiting for its first token sends an SSE comment this often */
#define SCAN_WAIT_MS 5000   /* the longest a request for an unknown id waits for a rescan of --models */

typedef struct conn_ctx {
    char  *body;            /* (cap,) the request body so far */
    size_t len, cap;
    int    too_big;         /* the body passed body_max: the rest is discarded */
    int    answered;        /* a response was queued before the body was read */
} conn_ctx;

/* ---------------------------------------------------------------- connection deadlines */

/* Every connection is tracked from libmicrohttpd's STARTED notification to
 * its CLOSED one: the phase of its current request and when that phase
 * began. A watchdog thread shuts down (shutdown(2): libmicrohttpd then reads
 * end-of-file and closes it) a connection whose request line and headers
 * took longer than header_s, or whose body took longer than body_s after
 * them; an idle keep-alive connection waits for its next request under the
 * header deadline too. The response phase (a generation) has none. The
 * socket stays open while tracked: libmicrohttpd sends CLOSED before it
 * closes the socket, and both the watchdog and CLOSED hold mu. */
enum { PH_HEADERS, PH_BODY, PH_ANSWER };

typedef struct conn_track {
    struct conn_track *prev, *next;
    int    fd;
    int    phase;           /* PH_* */
    int    reserve;         /* admitted past CONN_LIMIT: answers /health only */
    int    shut;            /* the watchdog shut it down */
    double t0;              /* when the phase began (CLOCK_MONOTONIC seconds) */
} conn_track;

typedef struct srv_conns {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    conn_track     *head;
    int             n, stop, started;
    pthread_t       thread;
    atomic_ullong   n_deadline;   /* connections shut down by a deadline */
    atomic_ullong   n_render_cancelled;   /* chat templates whose rendering stopped: client gone, or draining */
} srv_conns;

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    srv_conns *k = ((jlm_srv *)cls)->conns;
    conn_track *t = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        if (!(t = calloc(1, sizeof *t)))
            return;   /* out of memory: untracked, so no deadline and not counted */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        t->fd = ci ? ci->connect_fd : -1;
        t->t0 = mono_s();
        pthread_mutex_lock(&k->mu);
        t->reserve = k->n >= CONN_LIMIT;
        k->n++;
        t->next = k->head;
        if (k->head) k->head->prev = t;
        k->head = t;
        pthread_mutex_unlock(&k->mu);
        *socket_context = t;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && t) {
        pthread_mutex_lock(&k->mu);
        k->n--;
        if (t->prev) t->prev->next = t->next;
        else k->head = t->next;
        if (t->next) t->next->prev = t->prev;
        pthread_mutex_unlock(&k->mu);
        free(t);
        *socket_context = NULL;
    }
}

/* The connection's tracking (NULL: untracked); phase >= 0 starts that phase. */
static conn_track *conn_phase(jlm_srv *s, struct MHD_Connection *c, int phase)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_track *t = ci ? ci->socket_context : NULL;
    if (t && phase >= 0) {
        pthread_mutex_lock(&s->conns->mu);
        t->phase = phase;
        t->t0 = mono_s();
        pthread_mutex_unlock(&s->conns->mu);
    }
    return t;
}

static void *watchdog(void *arg)
{
    jlm_srv *s = arg;
    srv_conns *k = s->conns;
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        double now = mono_s();
        for (conn_track *t = k->head; t; t = t->next) {
            double lim = t->phase == PH_HEADERS ? (t->reserve && s->o.header_s > RESERVE_HEADER_S ? RESERVE_HEADER_S
                                                                                                  : s->o.header_s)
                       : t->phase == PH_BODY    ? s->o.body_s
                                                : -1;
            if (lim >= 0 && !t->shut && t->fd >= 0 && now - t->t0 > lim) {
                shutdown(t->fd, SHUT_RDWR);
                t->shut = 1;
                atomic_fetch_add(&k->n_deadline, 1);
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&k->cv, &k->mu, &ts);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* ---------------------------------------------------------------- responses */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, char *body, size_t len, const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* Sends j (taking the reference) as application/json. */
enum MHD_Result jlm_srv_send_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return MHD_NO;
    size_t n = strlen(s);
    char *b = realloc(s, n + 2);
    if (!b) {
        free(s);
        return MHD_NO;
    }
    b[n] = '\n';
    return send_text(c, status, b, n + 1, "application/json");
}

enum MHD_Result jlm_srv_send_error(jlm_srv *s, struct MHD_Connection *c, const srv_dialect *dia, unsigned status,
                                   const char *msg)
{
    atomic_fetch_add(&s->n_errors, 1);
    return jlm_srv_send_json(c, status, dia ? dia->error((int)status, msg) : jlm_srv_json_error((int)status, msg));
}

static enum MHD_Result send_error(jlm_srv *s, struct MHD_Connection *c, unsigned status, const char *msg)
{
    return jlm_srv_send_error(s, c, NULL, status, msg);
}

/* ---------------------------------------------------------------- models and auth */

/* The model a request names, referenced: an id not in the table, or one not
 * ready, or one whose file changed, asks the --models scanner to look once
 * more (a view dropped in, finished or replaced just now). */
srv_model *jlm_srv_find_model(jlm_srv *s, const char *id)
{
    srv_model *m = jlm_srv_model_find(s, id);
    if ((!m || m->status || jlm_srv_model_stale(m)) && s->models_dir) {
        jlm_srv_model_unref(m);
        jlm_srv_scan_now(s, SCAN_WAIT_MS);
        m = jlm_srv_model_find(s, id);
    }
    return m;
}

static json_t *model_json(const srv_model *m)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:s}", "id", m->id, "object", "model", "created", (json_int_t)0,
                          "owned_by", "jlmfs");
    if (j && m->e)
        json_object_set_new(j, "context_length", json_integer((json_int_t)jlm_engine_n_ctx(m->e)));
    if (j)
        json_object_set_new(j, "status", json_string(m->status ? m->status : "ready"));
    return j;
}

static json_t *models_json(jlm_srv *s)
{
    json_t *data = json_array();
    pthread_mutex_lock(&s->models_mu);
    for (size_t i = 0; data && i < s->n_models; i++)
        json_array_append_new(data, model_json(s->models[i]));
    pthread_mutex_unlock(&s->models_mu);
    return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

/* 503 with Retry-After for a model that is not ready (a converting view). */
static enum MHD_Result send_not_ready(jlm_srv *s, struct MHD_Connection *c, const srv_model *m,
                                      const srv_dialect *dia)
{
    char msg[512];
    snprintf(msg, sizeof msg, "model '%s' is not ready: %s", m->id, m->status);
    atomic_fetch_add(&s->n_errors, 1);
    json_t *j = dia ? dia->error(503, msg) : jlm_srv_json_error(503, msg);
    char *b = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!b)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(b), b, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(b);
        return MHD_NO;
    }
    char ra[16];
    snprintf(ra, sizeof ra, "%d", s->o.rescan_s > 0 ? s->o.rescan_s : 1);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    enum MHD_Result ok = MHD_queue_response(c, 503, r);
    MHD_destroy_response(r);
    return ok;
}

/* "Authorization: Bearer KEY" (or Anthropic's "x-api-key: KEY"), compared
 * in constant time. */
static int authorized(const jlm_srv *s, struct MHD_Connection *c)
{
    if (!s->api_key)
        return 1;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (x)
        return jlm_srv_key_equal(x, strlen(x), s->api_key, strlen(s->api_key));
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7))
        return 0;
    return jlm_srv_key_equal(h + 7, strlen(h + 7), s->api_key, strlen(s->api_key));
}

/* ---------------------------------------------------------------- streaming */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    srv_job *j = cls;
    (void)pos;
    pthread_mutex_lock(&j->mu);
    while (j->sent == j->len && !j->done) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += PING_S;
        if (pthread_cond_timedwait(&j->cv, &j->mu, &t) == ETIMEDOUT && j->sent == j->len && !j->done) {
            pthread_mutex_unlock(&j->mu);
            /* an SSE comment (or the dialect's): finds a client that left */
            const char *ping = j->dia ? j->dia->ping : ": ping\n\n";
            size_t n = strlen(ping) < max ? strlen(ping) : max;
            memcpy(buf, ping, n);
            return (ssize_t)n;
        }
    }
    size_t n = j->len - j->sent;
    if (n > max) n = max;
    memcpy(buf, j->out + j->sent, n);
    j->sent += n;
    int end = n == 0;
    pthread_mutex_unlock(&j->mu);
    return end ? MHD_CONTENT_READER_END_OF_STREAM : (ssize_t)n;
}

/* The connection is done with the stream (finished, or the client left). */
static void stream_free(void *cls)
{
    srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (!j->done)
        atomic_store(&j->cancelled, 1);
    pthread_mutex_unlock(&j->mu);
    jlm_srv_job_unref(j);
}

static enum MHD_Result send_stream(struct MHD_Connection *c, srv_job *j)
{
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
    if (!r) {
        stream_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, j->dia ? j->dia->stream_type : "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* Waits for a non-streamed job and sends its completion object. */
static enum MHD_Result send_whole(jlm_srv *s, struct MHD_Connection *c, srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    while (!j->done)
        pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    json_t *done = j->status != 200 ? NULL
                 : j->dia           ? j->dia->whole(j)
                                    : jlm_srv_json_completion(&j->ident, j->out ? j->out : "", j->len, &j->res);
    if (done && j->lp_final)
        jlm_srv_json_set_logprobs(done, json_incref(j->lp_final));
    if (done && j->n_subs)
        jlm_srv_job_add_choices(j, done);   /* `n` > 1 */
    enum MHD_Result ok = j->status == 200 ? jlm_srv_send_json(c, MHD_HTTP_OK, done)
                                          : jlm_srv_send_error(s, c, j->dia, (unsigned)j->status, j->errmsg);
    jlm_srv_job_unref(j);
    return ok;
}

/* ---------------------------------------------------------------- generation requests */

static unsigned status_of(int rc)
{
    return rc == JLM_ENOMEM ? 500 : 400;
}

/* Rendering a chat template stops when this says so: the client closed its
 * side (what libmicrohttpd would see as end-of-file), or the server drains. */
typedef struct render_watch { jlm_srv *s; int fd; } render_watch;

static int render_cancelled(void *arg)
{
    const render_watch *w = arg;
    struct pollfd p = {.fd = w->fd, .events = POLLRDHUP};
    int stop = atomic_load(&w->s->draining) ||
               (w->fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)));
    if (stop)   /* the render stops at the first yes: counted once */
        atomic_fetch_add(&w->s->conns->n_render_cancelled, 1);
    return stop;
}

static enum MHD_Result generate(jlm_srv *s, struct MHD_Connection *c, jlm_srv_kind kind, const conn_ctx *cx)
{
    if (atomic_load(&s->draining))
        return send_error(s, c, 503, "the server is shutting down");
    jlm_err err = {0};
    jlm_srv_req req;
    int rc = jlm_srv_req_parse(cx->body ? cx->body : "", cx->len, kind, &req, &err);
    if (rc)
        return send_error(s, c, status_of(rc), err.msg);
    return jlm_srv_submit(s, c, &req, NULL);
}

enum MHD_Result jlm_srv_submit(jlm_srv *s, struct MHD_Connection *c, jlm_srv_req *rq, const srv_dialect *dia)
{
    jlm_err err = {0};
    jlm_srv_req req = *rq;
    memset(rq, 0, sizeof *rq);
    if (atomic_load(&s->draining)) {
        jlm_srv_req_free(&req);
        return jlm_srv_send_error(s, c, dia, 503, "the server is shutting down");
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    render_watch watch = {s, ci ? ci->connect_fd : -1};
    req.cancelled = render_cancelled;
    req.cancel_arg = &watch;
    srv_model *m = req.model ? jlm_srv_find_model(s, req.model) : jlm_srv_model_only(s);
    if (!m) {
        char msg[600];
        snprintf(msg, sizeof msg, req.model ? "model '%.500s' does not exist (GET /v1/models lists the ids)"
                                            : "'model' is required: this server has several models", req.model);
        unsigned status = req.model ? 404 : 400;
        jlm_srv_req_free(&req);
        return jlm_srv_send_error(s, c, dia, status, msg);
    }
    if (m->status) {
        jlm_srv_req_free(&req);
        enum MHD_Result ok = send_not_ready(s, c, m, dia);
        jlm_srv_model_unref(m);
        return ok;
    }
    srv_job *j;
    int rc = jlm_srv_job_create(m, &req, &j, &err);
    if (rc) {
        jlm_srv_req_free(&req);
        jlm_srv_model_unref(m);
        if (atomic_load(&s->draining))
            return jlm_srv_send_error(s, c, dia, 503, "the server is shutting down");
        return jlm_srv_send_error(s, c, dia, status_of(rc), err.msg);
    }
    j->req.cancelled = NULL;   /* watch lives on this stack; the template is rendered */
    j->dia = dia;
    if (dia && j->req.stream && dia->open)
        dia->open(j);
    if (jlm_srv_job_submit(j)) {
        size_t n = 1 + j->n_subs;
        jlm_srv_job_drop(j);
        char msg[256];
        if (n > 1)
            snprintf(msg, sizeof msg, "model '%s' is busy: its queue of %zu requests has no room for %zu choices", m->id,
                     m->q_cap, n);
        else
            snprintf(msg, sizeof msg, "model '%s' is busy: its queue of %zu requests is full", m->id, m->q_cap);
        jlm_srv_model_unref(m);
        return jlm_srv_send_error(s, c, dia, 503, msg);
    }
    jlm_srv_model_unref(m);   /* the job's worker side keeps m until it answers (srv_int.h) */
    return j->req.stream ? send_stream(c, j) : send_whole(s, c, j);
}

/* ---------------------------------------------------------------- metrics */

static void metrics_model(FILE *f, srv_model *m)
{
    fprintf(f, "jlm_model_ready{model=\"%s\"} %d\n", m->id, !m->status);
    if (m->status)
        return;
    pthread_mutex_lock(&m->mu);
    size_t queued = m->q_len;
    int running = m->running;
    jlm_pager_counters pc = m->pc;
    pthread_mutex_unlock(&m->mu);
    uint64_t pi = 0, ev = 0, br = 0, hi = 0, fr = 0;
    for (uint32_t a = 0; a < pc.n_arrays; a++) {
        pi += pc.a[a].page_ins; ev += pc.a[a].evictions; br += pc.a[a].bytes_read; hi += pc.a[a].hits;
        fr += pc.a[a].resident_pages;
    }
    double busy = (double)atomic_load(&m->busy_us) * 1e-6;
    unsigned long long gen = atomic_load(&m->n_gen_tok);
    fprintf(f, "jlm_requests_done_total{model=\"%s\"} %llu\n", m->id, atomic_load(&m->n_done));
    fprintf(f, "jlm_requests_cancelled_total{model=\"%s\"} %llu\n", m->id, atomic_load(&m->n_cancelled));
    fprintf(f, "jlm_prompt_tokens_total{model=\"%s\"} %llu\n", m->id, atomic_load(&m->n_prompt_tok));
    fprintf(f, "jlm_prompt_cached_tokens_total{model=\"%s\"} %llu\n", m->id, atomic_load(&m->n_cached_tok));
    fprintf(f, "jlm_prefix_cache_bytes{model=\"%s\"} %llu\n", m->id, atomic_load(&m->pcache_bytes));
    fprintf(f, "jlm_generated_tokens_total{model=\"%s\"} %llu\n", m->id, gen);
    fprintf(f, "jlm_busy_seconds_total{model=\"%s\"} %.3f\n", m->id, busy);
    fprintf(f, "jlm_tokens_per_second{model=\"%s\"} %.3f\n", m->id, busy > 0 ? (double)gen / busy : 0.0);
    fprintf(f, "jlm_decode_steps_total{model=\"%s\"} %llu\n", m->id, atomic_load(&m->n_steps));
    fprintf(f, "jlm_decode_step_sequences_total{model=\"%s\"} %llu\n", m->id, atomic_load(&m->n_step_seqs));
    fprintf(f, "jlm_queue_length{model=\"%s\"} %zu\n", m->id, queued);
    fprintf(f, "jlm_requests_running{model=\"%s\"} %d\n", m->id, running);
    fprintf(f, "jlm_page_ins_total{model=\"%s\"} %llu\n", m->id, (unsigned long long)pi);
    fprintf(f, "jlm_page_evictions_total{model=\"%s\"} %llu\n", m->id, (unsigned long long)ev);
    fprintf(f, "jlm_page_hits_total{model=\"%s\"} %llu\n", m->id, (unsigned long long)hi);
    fprintf(f, "jlm_bytes_read_total{model=\"%s\"} %llu\n", m->id, (unsigned long long)br);
    fprintf(f, "jlm_resident_bytes{model=\"%s\"} %llu\n", m->id, (unsigned long long)pc.resident_bytes);
    fprintf(f, "jlm_frames_resident{model=\"%s\"} %llu\n", m->id, (unsigned long long)fr);   /* pages in frames */
    fprintf(f, "jlm_budget_bytes{model=\"%s\"} %llu\n", m->id, (unsigned long long)pc.budget);
    fprintf(f, "jlm_budget_reclaims_total{model=\"%s\"} %llu\n", m->id, atomic_load(&m->n_reclaims));
    fprintf(f, "jlm_budget_reclaimed_bytes_total{model=\"%s\"} %llu\n", m->id, atomic_load(&m->reclaimed_bytes));
}

static enum MHD_Result send_metrics(jlm_srv *s, struct MHD_Connection *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return MHD_NO;
    fprintf(f, "# jlm serve metrics (docs/serve.md)\n");
    fprintf(f, "jlm_http_requests_total %llu\n", atomic_load(&s->n_requests));
    fprintf(f, "jlm_http_errors_total %llu\n", atomic_load(&s->n_errors));
    fprintf(f, "jlm_http_deadline_closed_total %llu\n", atomic_load(&s->conns->n_deadline));
    fprintf(f, "jlm_template_renders_cancelled_total %llu\n", atomic_load(&s->conns->n_render_cancelled));
    pthread_mutex_lock(&s->budget.mu);
    uint64_t total = s->budget.total, granted = 0;
    for (size_t i = 0; i < s->budget.n; i++) granted += s->budget.m[i]->grant;
    pthread_mutex_unlock(&s->budget.mu);
    fprintf(f, "jlm_budget_total_bytes %llu\n", (unsigned long long)total);
    fprintf(f, "jlm_budget_granted_bytes %llu\n", (unsigned long long)granted);
    uint64_t resident = 0;
    pthread_mutex_lock(&s->models_mu);
    for (size_t i = 0; i < s->n_models; i++) {
        metrics_model(f, s->models[i]);
        pthread_mutex_lock(&s->models[i]->mu);
        resident += s->models[i]->pc.resident_bytes;
        pthread_mutex_unlock(&s->models[i]->mu);
    }
    for (size_t i = 0; i < s->n_retired; i++) {
        pthread_mutex_lock(&s->retired[i]->mu);
        resident += s->retired[i]->pc.resident_bytes;
        pthread_mutex_unlock(&s->retired[i]->mu);
    }
    fprintf(f, "jlm_models %zu\n", s->n_models);
    pthread_mutex_unlock(&s->models_mu);
    fprintf(f, "jlm_resident_total_bytes %llu\n", (unsigned long long)resident);
    if (fclose(f))
        return MHD_NO;
    return send_text(c, MHD_HTTP_OK, buf, len, "text/plain; version=0.0.4");
}

/* ---------------------------------------------------------------- residency */

/* What `jlm stats --json` says for a model on a jlmfs view; for a plain
 * container, the engine pager's counters per page array (docs/serve.md). */
static enum MHD_Result send_residency(jlm_srv *s, struct MHD_Connection *c, srv_model *m)
{
    jlm_err err = {0};
    if (m->rdb_path) {
        jlm_rdb *db = NULL;
        char *out = NULL;
        int rc = jlm_rdb_open(m->rdb_path, JLM_RDB_READONLY, &db, &err);
        if (!rc) rc = jlm_rdb_stats_json(db, m->rdb_key, &out, &err);
        jlm_rdb_close(db);
        return rc ? send_error(s, c, 500, err.msg) : send_text(c, 200, out, strlen(out), "application/json");
    }
    pthread_mutex_lock(&m->mu);
    jlm_pager_counters pc = m->pc;
    pthread_mutex_unlock(&m->mu);
    json_t *arrays = json_array();
    for (uint32_t a = 0; arrays && a < pc.n_arrays; a++) {
        const jlm_pager_array_counters *x = &pc.a[a];
        json_array_append_new(arrays, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "page_ins",
            (json_int_t)x->page_ins, "fills", (json_int_t)x->fills, "evictions", (json_int_t)x->evictions, "hits",
            (json_int_t)x->hits, "reads", (json_int_t)x->reads, "bytes_read", (json_int_t)x->bytes_read,
            "resident_pages", (json_int_t)x->resident_pages));
    }
    return jlm_srv_send_json(c, 200, json_pack("{s:s, s:s, s:I, s:I, s:I, s:o}", "model", m->id, "source", "engine", "budget",
                                       (json_int_t)pc.budget, "resident_bytes", (json_int_t)pc.resident_bytes,
                                       "peak_bytes", (json_int_t)pc.peak_bytes, "arrays", arrays));
}

/* ---------------------------------------------------------------- routing */

static enum MHD_Result route(jlm_srv *s, struct MHD_Connection *c, const char *url, const char *method,
                             const conn_ctx *cx)
{
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health"))
        return get ? jlm_srv_send_json(c, atomic_load(&s->draining) ? 503 : 200,
                               json_pack("{s:s}", "status", atomic_load(&s->draining) ? "draining" : "ok"))
                   : send_error(s, c, 405, "GET only");
    if (!authorized(s, c))
        return send_error(s, c, 401, "missing or wrong API key (Authorization: Bearer KEY)");
    if (!strcmp(url, "/v1/models")) {
        if (!get)
            return send_error(s, c, 405, "GET only");
        jlm_srv_scan_now(s, SCAN_WAIT_MS);   /* --models: list what the folder holds now */
        return jlm_srv_send_json(c, 200, models_json(s));
    }
    size_t ul = strlen(url);
    if (!strncmp(url, "/v1/models/", 11) && ul > 21 && !strcmp(url + ul - 10, "/residency")) {
        char id[256];
        snprintf(id, sizeof id, "%.*s", (int)(ul - 21 < 255 ? ul - 21 : 255), url + 11);
        if (!get)
            return send_error(s, c, 405, "GET only");
        srv_model *m = jlm_srv_find_model(s, id);
        enum MHD_Result ok = !m        ? send_error(s, c, 404, "no such model (GET /v1/models lists the ids)")
                           : m->status ? send_not_ready(s, c, m, NULL)
                                       : send_residency(s, c, m);
        jlm_srv_model_unref(m);
        return ok;
    }
    if (!strncmp(url, "/v1/models/", 11)) {
        if (!get)
            return send_error(s, c, 405, "GET only");
        srv_model *m = jlm_srv_find_model(s, url + 11);
        enum MHD_Result ok = m ? jlm_srv_send_json(c, 200, model_json(m))
                               : send_error(s, c, 404, "no such model (GET /v1/models lists the ids)");
        jlm_srv_model_unref(m);
        return ok;
    }
    if (!strcmp(url, "/metrics"))
        return get ? send_metrics(s, c) : send_error(s, c, 405, "GET only");
    if (!strcmp(url, "/v1/messages"))
        return post ? jlm_srv_anthropic(s, c, cx->body ? cx->body : "", cx->len) : send_error(s, c, 405, "POST only");
    if (!strcmp(url, "/v1/embeddings"))
        return post ? jlm_srv_embeddings(s, c, cx->body ? cx->body : "", cx->len) : send_error(s, c, 405, "POST only");
    if (!strncmp(url, "/api/", 5))
        return jlm_srv_ollama(s, c, url, method, cx->body ? cx->body : "", cx->len);
    int chat = !strcmp(url, "/v1/chat/completions");
    if (chat || !strcmp(url, "/v1/completions"))
        return post ? generate(s, c, chat ? JLM_SRV_CHAT : JLM_SRV_COMPLETION, cx) : send_error(s, c, 405, "POST only");
    return send_error(s, c, 404, "no such endpoint");
}

/* Collects the body (at most body_max bytes), then routes. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    jlm_srv *s = cls;
    conn_ctx *cx = *con_cls;
    (void)version;
    if (!cx) {
        if (!(cx = calloc(1, sizeof *cx)))
            return MHD_NO;
        *con_cls = cx;
        atomic_fetch_add(&s->n_requests, 1);
        conn_track *t = conn_phase(s, c, PH_BODY);   /* the headers are in */
        if (t && t->reserve && strcmp(url, "/health")) {
            cx->answered = 1;
            conn_phase(s, c, PH_ANSWER);
            char msg[160];
            snprintf(msg, sizeof msg, "the server has %d connections open, its limit: only GET /health is answered now",
                     CONN_LIMIT);
            return send_error(s, c, 503, msg);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o.body_max) {
            cx->answered = 1;
            conn_phase(s, c, PH_ANSWER);
            return send_error(s, c, 413, "request body too large");
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cx->answered && !cx->too_big && cx->len + *upload_size > s->o.body_max)
            cx->too_big = 1;
        if (!cx->answered && !cx->too_big) {
            if (cx->len + *upload_size > cx->cap) {
                size_t cap = cx->cap ? cx->cap : 4096;
                while (cap < cx->len + *upload_size) cap *= 2;
                char *b = realloc(cx->body, cap);
                if (!b) return MHD_NO;
                cx->body = b;
                cx->cap = cap;
            }
            memcpy(cx->body + cx->len, upload, *upload_size);
            cx->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cx->answered)
        return MHD_YES;
    cx->answered = 1;
    conn_phase(s, c, PH_ANSWER);
    if (cx->too_big)
        return send_error(s, c, 413, "request body too large");
    return route(s, c, url, method, cx);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
    conn_ctx *cx = *con_cls;
    (void)t;
    conn_phase(cls, c, PH_HEADERS);   /* keep-alive: the next request's headers are due */
    if (cx) {
        free(cx->body);
        free(cx);
        *con_cls = NULL;
    }
}

/* ---------------------------------------------------------------- life cycle */

/* libmicrohttpd's own messages (a connection refused at a limit, a failed
 * accept), one line each, marked as the server's. A flood of refused
 * connections would write a line each: a message repeated within
 * LOG_REPEAT_S is counted, and the count said with the next one printed. */
#define LOG_REPEAT_S 10
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char last[512];
    static double last_t;
    static unsigned long repeated;
    char msg[512];
    (void)cls;
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    double now = mono_s();
    pthread_mutex_lock(&mu);
    if (!strcmp(msg, last) && now - last_t < LOG_REPEAT_S) {
        repeated++;
    } else {
        if (repeated)
            fprintf(stderr, "jlm serve: http: (the message before %lu more times)\n", repeated);
        fprintf(stderr, "jlm serve: http: %s\n", msg);
        snprintf(last, sizeof last, "%s", msg);
        last_t = now;
        repeated = 0;
    }
    pthread_mutex_unlock(&mu);
}

/* The listening socket is bound here, so a refusal names the address and
 * port asked for (libmicrohttpd's own message says "port 0" when given an
 * address), then handed to the daemon, which closes it when stopped. */
static int start_daemon(jlm_srv *s, jlm_err *err)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->o.port)};
    if (inet_pton(AF_INET, s->host, &sa.sin_addr) != 1)
        return jlm_errf(err, JLM_EINVAL, "--host '%s': expected an IPv4 address such as 127.0.0.1", s->host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return jlm_errf(err, JLM_EIO, "cannot listen on %s:%d: %s", s->host, s->o.port, strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128)) {
        int e = errno;
        close(fd);
        return jlm_errf(err, JLM_EIO, "cannot listen on %s:%d: %s%s", s->host, s->o.port, strerror(e),
                        e == EADDRINUSE      ? " (another program has it; choose another with --port)"
                        : e == EADDRNOTAVAIL ? " (not an address of this machine)"
                                             : "");
    }
    struct sockaddr_in got;
    socklen_t gl = sizeof got;
    s->port = getsockname(fd, (struct sockaddr *)&got, &gl) ? s->o.port : ntohs(got.sin_port);
    srv_conns *k = s->conns;
    pthread_mutex_lock(&k->mu);
    k->started = !pthread_create(&k->thread, NULL, watchdog, s);
    pthread_mutex_unlock(&k->mu);
    if (!k->started) {
        close(fd);
        return jlm_errf(err, JLM_ENOMEM, "cannot start the connection watchdog thread");
    }
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(CONN_LIMIT + CONN_RESERVE),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->o.conn_per_addr,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_END);
    if (!s->d)   /* fd is not closed here: the daemon may have closed it already */
        return jlm_errf(err, JLM_EIO, "cannot serve on %s:%d: the HTTP daemon did not start", s->host, s->port);
    return 0;
}

static void stop_watchdog(srv_conns *k)
{
    pthread_mutex_lock(&k->mu);
    k->stop = 1;
    pthread_cond_signal(&k->cv);
    int started = k->started;
    pthread_mutex_unlock(&k->mu);
    if (started)
        pthread_join(k->thread, NULL);
}

int jlm_srv_open(const jlm_srv_model *models, size_t n_models, const jlm_srv_opts *o, jlm_srv **out, jlm_err *err)
{
    jlm_srv *s = calloc(1, sizeof *s);
    if (!s)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    s->o = *o;
    if (!s->o.body_max) s->o.body_max = 1u << 20;
    if (s->o.conn_per_addr <= 0) s->o.conn_per_addr = 32;
    if (s->o.header_s <= 0) s->o.header_s = 10;
    if (s->o.body_s <= 0) s->o.body_s = 60;
    if (!(s->conns = calloc(1, sizeof *s->conns))) {
        free(s);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&s->conns->mu, NULL);
    pthread_cond_init(&s->conns->cv, NULL);
    s->host = strdup(o->host ? o->host : "127.0.0.1");
    s->api_key = o->api_key ? strdup(o->api_key) : NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->models_mu, NULL);
    pthread_mutex_init(&s->scan_mu, NULL);
    pthread_cond_init(&s->scan_cv, NULL);
    jlm_srv_budget_init(&s->budget, o->budget);
    int rc = !s->host || (o->api_key && !s->api_key) ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
    if (!rc && o->models_dir) {
        size_t n = strlen(o->models_dir);
        while (n > 1 && o->models_dir[n - 1] == '/') n--;
        if (!(s->models_dir = strndup(o->models_dir, n)))
            rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
        s->o.models_dir = s->models_dir;
    }
    for (size_t i = 0; !rc && i < n_models; i++) {
        srv_model *m = NULL;
        rc = jlm_srv_model_open(s, models[i].path, models[i].id, &m, err);
        if (!rc && (rc = jlm_srv_models_add(s, m, err)))
            jlm_srv_model_close(m);
    }
    if (!rc && s->models_dir)
        rc = jlm_srv_scan(s, 1, err);
    if (!rc && s->models_dir)
        rc = jlm_srv_scanner_start(s, err);
    if (!rc)
        rc = start_daemon(s, err);
    if (rc) {
        jlm_srv_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

int jlm_srv_port(const jlm_srv *s) { return s->port; }

size_t jlm_srv_n_models(jlm_srv *s)
{
    pthread_mutex_lock(&s->models_mu);
    size_t n = s->n_models;
    pthread_mutex_unlock(&s->models_mu);
    return n;
}

int jlm_srv_drain(jlm_srv *s, int timeout_s)
{
    atomic_store(&s->draining, 1);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += timeout_s;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (s->in_flight > 0 && rc == 0)
        rc = pthread_cond_timedwait(&s->cv, &s->mu, &t);
    int left = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    return left ? JLM_ERANGE : 0;
}

void jlm_srv_close(jlm_srv *s)
{
    if (!s) return;
    if (s->d)
        MHD_stop_daemon(s->d);
    stop_watchdog(s->conns);
    pthread_mutex_destroy(&s->conns->mu);
    pthread_cond_destroy(&s->conns->cv);
    free(s->conns);
    jlm_srv_models_close_all(s);
    jlm_srv_budget_fini(&s->budget);
    free(s->host);
    free(s->api_key);
    free(s->models_dir);
    pthread_mutex_destroy(&s->models_mu);
    pthread_mutex_destroy(&s->scan_mu);
    pthread_cond_destroy(&s->scan_cv);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
