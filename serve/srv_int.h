/* srv_int.h - what serve/server.c (HTTP) and serve/gen.c (models, workers,
 * generation) share. Not part of the server's contract (server.h).
 *
 * Job lifetime: a job is created by the connection thread with two
 * references (connection, worker); each side drops its own with
 * srv_job_unref, and the last drop frees it and tells the server one request
 * fewer is in flight. Everything under "guarded by mu" is read and written
 * with the job's mutex held; the worker signals cv after each append and at
 * the end. */
#ifndef JLM_SERVE_SRV_INT_H
#define JLM_SERVE_SRV_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/model.h"
#include "text/tokenizer/tokenizer.h"
#include "serve/api.h"
#include "serve/server.h"

typedef struct srv_job srv_job;

#define JLM_SRV_MAX_PARALLEL 16   /* slots per model (the engine's batch is 16 too) */

typedef struct srv_model {
    char        *id, *path;          /* id: the file stem */
    char        *rdb_path, *rdb_key;  /* on a jlmfs view: its residency database; else NULL */
    jlm_engine  *e;
    jlm_tok     *tok;
    char        *tmpl, *bos, *eos;   /* chat template (chatml when the container has none) */
    struct jlm_srv *srv;
    pthread_t    worker;
    int          started;
    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    srv_job    **q;                  /* (q_cap,) ring of waiting jobs */
    size_t       q_head, q_len, q_cap;
    int          parallel;           /* slots: requests decoded together */
    int          running, stop;      /* running: active slots */
    jlm_pager_counters pc;           /* the pager's counters after the last request */
    /* counters (atomic: read by /metrics) */
    atomic_ullong n_done, n_cancelled, n_prompt_tok, n_gen_tok;
    atomic_ullong busy_us;
    atomic_ullong n_steps, n_step_seqs;  /* decode passes, and sequences in them (mean batch = ratio) */
} srv_model;

struct srv_job {
    jlm_srv_req   req;
    jlm_srv_ident ident;
    srv_model    *m;
    int32_t      *prompt;            /* (n_prompt,) token ids */
    size_t        n_prompt;
    uint32_t      max_tokens;
    atomic_int    cancelled;         /* the client went away */
    /* logprobs (worker only until done; then the connection reads lp_final) */
    json_t       *lp_pending;        /* entries not yet sent (chat shape) */
    size_t        lp_offset;         /* completions' text_offset of the next entry */
    json_t       *lp_final;          /* non-streamed: the choice's logprobs */
    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int           refs;
    char         *out;               /* stream: SSE bytes; else the text */
    size_t        len, cap, sent;    /* sent: bytes of out handed to the connection */
    int           done, status;      /* status: 200, or the HTTP error */
    char          errmsg[256];
    jlm_srv_result res;
};

struct jlm_srv {
    jlm_srv_opts  o;
    char         *host, *api_key;
    srv_model   **models;            /* (n_models,) */
    size_t        n_models;
    struct MHD_Daemon *d;
    int           port;
    atomic_int    draining;
    atomic_ullong n_requests, n_errors;
    /* guarded by mu: requests between job creation and its last unref */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int           in_flight;
};

/* gen.c */
int  srv_model_open(struct jlm_srv *s, const char *path, srv_model **out, jlm_err *err);
void srv_model_close(srv_model *m);          /* stops its worker first; accepts NULL */
/* Tokenizes the request's prompt (completions: as `jlm run -p`; chat: the
 * rendered template, as `jlm chat`) into a new job with two references.
 * JLM_EINVAL (empty prompt, context exceeded, template error) with the
 * message for a 400; JLM_ENOMEM. req is moved into the job on success. */
int  srv_job_create(srv_model *m, jlm_srv_req *req, srv_job **out, jlm_err *err);
/* Queues j on its model; JLM_ERANGE when the queue is full (503). */
int  srv_job_submit(srv_job *j);
void srv_job_unref(srv_job *j);

#endif
