/* server.h - `jlm serve`: an OpenAI-compatible HTTP server over .jlm models.
 *
 * Owns: the HTTP daemon (libmicrohttpd, one thread per connection, at most
 * 64 at once and conn_per_addr from one address, each request's headers and
 * body under a deadline, 8 more connections kept for /health), the
 * table of served models (one engine, tokenizer and chat template each), one
 * generation worker per model with a bounded queue, the API key check and
 * the drain on shutdown. Request and response shapes live in serve/api.h;
 * the decisions the OpenAI API leaves open are in docs/serve.md.
 *
 * Concurrency: each model's worker decodes up to `parallel` requests together
 * (continuous batching: one forward pass per step for all of them, each with
 * its own KV cache and sampler; a request joins at the next step and leaves
 * when it ends); up to `queue` further requests per model wait in arrival
 * order, and one more gets 503. A request's output is exactly what it gets
 * alone (engine/model.h: jlm_engine_eval_batch).
 *
 * Thread safety: jlm_srv_open, _drain and _close are called from one thread
 * (the main); everything else runs on the daemon's and workers' threads.
 * Memory: the server owns everything it opened; jlm_srv_close accepts NULL.
 */
#ifndef JLM_SERVE_SERVER_H
#define JLM_SERVE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "prompt/session.h"
#include "base/jlm_err.h"

/* Residency reporting of a model on a jlmfs view (docs/residency.md): the
 * server's own page-ins, as `jlm run` reports them, through the session
 * layer's seam (prompt/session.h: find the view, open / flush / close a
 * reporter). The command line gives it (cli/report.c); serve/ only calls
 * it. open, flush (after each decode step) and close run under the model's
 * pager lock (or after its worker stopped), never two at once. */
typedef jlm_sess_view jlm_srv_reporter;

typedef struct jlm_srv_opts {
    const char *host;        /* NULL: 127.0.0.1 */
    int         port;        /* 0: any free port (see jlm_srv_port) */
    int         parallel;    /* requests per model decoded together; <= 0: 4 (at most 16) */
    int         queue;       /* requests waiting per model beyond those running; <= 0: 8 */
    size_t      body_max;    /* request body limit in bytes; 0: 1 MiB */
    int         conn_per_addr;  /* connections from one client address at once; 0: 32 */
    int         header_s;    /* seconds a request's line and headers may take; 0: 10 */
    int         body_s;      /* seconds a request's body may take once its headers are in; 0: 60 */
    const char *api_key;     /* NULL: no key required */
    const char *models_dir;  /* NULL: none; else every NAME.jlm in it, rescanned (docs/serve.md) */
    int         rescan_s;    /* seconds between rescans of models_dir; 0: only when a request asks */
    uint64_t    budget;      /* bytes of page frames for ALL models together; 0: unlimited */
    uint64_t    prefix_cache;   /* bytes of KV each model keeps for later requests (the
                                 * prefix cache, docs/serve.md); 0: 1 GiB. Under a
                                 * budget the cache also stays inside the model's share */
    int         no_prefix_cache;   /* 1: no prefix cache */
    const char *chat_template;   /* a Jinja chat template for every model instead of its own; NULL: each model's */
    jlm_engine_opts eng;     /* per model (its budget field is ignored: see budget) */
    const jlm_srv_reporter *report;  /* NULL: views' residency databases get no sessions from the server */
} jlm_srv_opts;

typedef struct jlm_srv_model {
    const char *path;        /* a .jlm file or a jlmfs view directory */
    const char *id;          /* NULL: the file stem */
} jlm_srv_model;

typedef struct jlm_srv jlm_srv;

/* Opens every model (ids must be unique) and every NAME.jlm of
 * o->models_dir, starts one worker per model, the folder's scanner and the
 * HTTP daemon. JLM_EINVAL (bad host, duplicate id), JLM_EIO (bind failed,
 * models_dir unreadable), the engine's errors naming the model; *out
 * untouched on error. A view of models_dir that is not ready yet is no
 * error: it is served once ready. */
int  jlm_srv_open(const jlm_srv_model *models, size_t n_models, const jlm_srv_opts *o, jlm_srv **out, jlm_err *err);
/* The models listed now (ready or not). Cannot fail. */
size_t jlm_srv_n_models(jlm_srv *s);
/* The port the daemon listens on. Cannot fail. */
int  jlm_srv_port(const jlm_srv *s);
/* From now on every generation request gets 503; waits until the requests in
 * flight have been answered, at most timeout_s seconds. 0 when all were,
 * JLM_ERANGE on timeout. */
int  jlm_srv_drain(jlm_srv *s, int timeout_s);
/* Stops the daemon and the workers, closes the models. */
void jlm_srv_close(jlm_srv *s);

#endif
