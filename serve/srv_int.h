/* srv_int.h - what serve/server.c (HTTP), serve/gen.c (workers, generation),
 * serve/scan.c (the table of served models, the --models DIR scanner) and
 * serve/budget.c (one frame budget over every model) share. Not part of the
 * server's contract (server.h).
 *
 * Job lifetime: a job is created by the connection thread with two
 * references (connection, worker); each side drops its own with
 * jlm_srv_job_unref, and the last drop frees it and tells the server one request
 * fewer is in flight. Everything under "guarded by mu" is read and written
 * with the job's mutex held; the worker signals cv after each append and at
 * the end. */
#ifndef JLM_SERVE_SRV_INT_H
#define JLM_SERVE_SRV_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/model.h"
#include "engine/vision.h"
#include "text/grammar/grammar.h"
#include "text/tokenizer/tokenizer.h"
#include "serve/api.h"
#include "serve/server.h"

typedef struct srv_job srv_job;

/* The shape of a job's output for an API other than OpenAI's (serve/
 * dialect.h: Anthropic, ollama, embeddings); a job without one answers in
 * OpenAI's (api.h). The stream callbacks append with jlm_srv_job_write:
 * open on the connection thread before the job is queued, piece and close
 * on the worker. */
typedef struct srv_dialect {
    const char *stream_type;                               /* Content-Type of a stream */
    const char *ping;                                      /* sent while a stream waits (ignored by its clients) */
    void   (*open)(srv_job *j);                            /* a stream's first bytes; NULL: none */
    void   (*piece)(srv_job *j, const char *p, size_t n);  /* generated text */
    void   (*calls)(srv_job *j, const json_t *calls);     /* a tool request's parsed calls (toolcall.h), before close */
    void   (*close)(srv_job *j, int status, const char *msg);   /* the end: j->res (200) or the error */
    json_t *(*whole)(const srv_job *j);                    /* a finished non-streamed job's body (NULL: OOM) */
    json_t *(*error)(int status, const char *msg);         /* an error body */
} srv_dialect;

/* The prefix cache of one model (prefix.c): KV of earlier requests, each
 * entry the first n positions of a finished request's sequence (prompt and
 * the generated tokens evaluated) with those tokens. A new request takes the
 * entry sharing the longest prefix with its prompt (in whole blocks of
 * JLM_SRV_PCACHE_BLOCK tokens, at most its length - 1: the last prompt token
 * is always evaluated for its logits) instead of evaluating those tokens. Used by the model's worker
 * under pager_mu, and by the budget under the same lock when it takes
 * frames (the cache lives inside the model's grant). */
#define JLM_SRV_PCACHE_BLOCK 16
typedef struct srv_pentry {
    int32_t  *tok;                   /* (n,) */
    uint32_t  n;
    void     *kv;                    /* jlm_engine_kv_bytes(n) bytes */
    uint64_t  bytes, last_use;
} srv_pentry;
typedef struct srv_pcache {
    srv_pentry *e;                   /* (n, cap) */
    size_t      n, cap;
    uint64_t    bytes, limit, clock; /* limit: 0 = off */
} srv_pcache;

#define JLM_SRV_MAX_PARALLEL 16   /* slots per model (the engine's batch is 16 too) */

/* Model lifetime: the server's table holds one reference, and every lookup
 * by a connection thread takes one for as long as it uses the model (jobs
 * hold none: a job's worker side ends before the worker does, its
 * connection side uses only the job). A model leaves the table when its file
 * or view goes away (--models DIR rescan): it is retired (stop set, no new
 * job accepted), its worker finishes what it has, and the scanner closes it
 * once the worker has exited and no lookup holds it. A PENDING entry (a view
 * whose status is not `ready`, or a file that failed to open) has no engine
 * and no worker: it is listed with its status and answers 503. */
typedef struct srv_model {
    char        *id, *path, *given;  /* id: the file stem; path: the container; given: as named (a view: its folder) */
    char        *status;             /* NULL: ready (engine open); else why not ("converting 40%", "error: ...") */
    uint64_t     ident[4];           /* dev, ino, size, mtime ns of what was opened (rescan notices a change) */
    int          from_dir;           /* found by the --models scan (only those are rescanned) */
    atomic_int   refs;
    jlm_session *sess;               /* the model opened (prompt/session.h); NULL while PENDING; owns the five below */
    char        *rdb_path, *rdb_key;  /* on a jlmfs view: its residency database; else NULL */
    void        *rep;                /* the view's reporter (jlm_srv_opts.report), under pager_mu; NULL: none */
    jlm_engine  *e;
    jlm_tok     *tok;
    jlm_vtower  *vt;                 /* the vision tower, opened by the worker at the first image request */
    jlm_gram_vocab *gv;              /* the vocab's trie for constrained requests, built by the worker at the first one */
    char        *tmpl, *bos, *eos;   /* chat template (chatml when the container has none) */
    struct jlm_srv *srv;
    pthread_t    worker;
    int          started;
    /* held by the worker for a whole step (the pager is used only under it),
     * and by the budget when it takes this model's frames for another */
    pthread_mutex_t pager_mu;
    /* guarded by the budget's mu (budget.c) */
    uint64_t     grant, floor, want, last_use;  /* pager budget; minimum working set; all pages; LRU clock */
    int          in_budget;
    atomic_ullong n_reclaims, reclaimed_bytes;  /* times (and bytes) frames were taken for another model */
    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    srv_job    **q;                  /* (q_cap,) ring of waiting jobs */
    size_t       q_head, q_len, q_cap;
    int          parallel;           /* slots: requests decoded together */
    int          running, stop;      /* running: active slots */
    int          exited;             /* the worker has returned */
    jlm_pager_counters pc;           /* the pager's counters after the last request */
    /* under pager_mu */
    srv_pcache   pcache;
    atomic_ullong n_cached_tok, pcache_bytes;   /* for /metrics */
    /* counters (atomic: read by /metrics) */
    atomic_ullong n_done, n_cancelled, n_prompt_tok, n_gen_tok;
    atomic_ullong busy_us;
    atomic_ullong n_steps, n_step_seqs;  /* decode passes, and sequences in them (mean batch = ratio) */
} srv_model;

struct srv_job {
    jlm_srv_req   req;
    jlm_srv_ident ident;             /* ident.model points to model_id */
    char         *model_id;
    struct jlm_srv *srv;
    srv_model    *m;                 /* the worker side's only */
    int32_t      *prompt;            /* (n_prompt,) token ids */
    size_t        n_prompt;
    uint32_t      max_tokens;
    atomic_int    cancelled;         /* the client went away */
    /* logprobs (worker only until done; then the connection reads lp_final) */
    json_t       *lp_pending;        /* entries not yet sent (chat shape) */
    size_t        lp_offset;         /* completions' text_offset of the next entry */
    json_t       *lp_final;          /* non-streamed: the choice's logprobs */
    /* tool calls (serve/toolcall.h; worker only until done) */
    jlm_tc_family tc_family;         /* the model's call syntax */
    int           tc_active;         /* tools given and tool_choice not "none": the reply is parsed */
    uint64_t      tc_ids;            /* call id state */
    json_t       *tc_calls;          /* the parsed calls (res.tool_calls points here) */
    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int           refs;
    char         *out;               /* stream: SSE bytes; else the text */
    size_t        len, cap, sent;    /* sent: bytes of out handed to the connection */
    int           done, status;      /* status: 200, or the HTTP error */
    char          errmsg[256];
    jlm_srv_result res;
    const srv_dialect *dia;          /* NULL: OpenAI's shapes */
    int           dia_blocks, dia_open;   /* the dialect's stream: content blocks begun, one still open (anthropic.c) */
    uint64_t      t_start_us, t_first_us, t_end_us;   /* created, prompt evaluated, ended (CLOCK_MONOTONIC) */
    /* EMBED: input i is prompt[emb_off[i], emb_off[i + 1]); its vector emb + i * n_embd */
    uint32_t     *emb_off;           /* (n_emb + 1,) */
    size_t        n_emb;
    float        *emb;               /* (n_emb, n_embd), written by the worker before done */
    uint32_t      n_embd;
    /* chat with an image part: the picture and the rendered prompt with its
     * marker, evaluated as `jlm run --image` does (prompt/image_prompt.h) */
    jlm_image     img;
    char         *img_text;
    /* `n` > 1: this job is choice 0; choices 1.. are jobs of their own
     * (group points here, holding a reference while their worker side
     * lives) sharing this job's request, image and stream: their events go
     * into this job's out, and this job is done when every choice is. */
    srv_job     **subs;              /* (n_subs,) each with a reference held here */
    size_t        n_subs;
    srv_job      *group;             /* a choice > 0: choice 0's job; else NULL */
    size_t        n_left;            /* guarded by mu: choices not finished */
    uint32_t      sum_completion;    /* guarded by mu: completion tokens of the finished choices */
};

/* One frame budget over every served model (budget.c): each model's pager
 * budget is its grant; the grants add up to at most total. Before each step
 * a worker asks for all its pages (jlm_srv_budget_acquire); what is not free is
 * taken from the other models, least recently used first: an idle model
 * down to its minimum working set, a busy one down to an even share of the
 * total among the busy models (so two busy models do not take turns evicting
 * each other's every page). Taking lowers the victim's pager budget under
 * its pager_mu, which evicts its frames (pager.h invariant 7 order).
 * Lock order: budget mu -> a model's pager_mu -> that model's mu. */
typedef struct srv_budget {
    pthread_mutex_t mu;
    uint64_t     total;              /* 0: off, every engine unlimited */
    uint64_t     clock;
    srv_model  **m;                  /* (n, cap) the models in the budget */
    size_t       n, cap;
} srv_budget;

struct jlm_srv {
    jlm_srv_opts  o;
    char         *host, *api_key, *models_dir;
    /* guarded by models_mu: the table, in id order, and the retired models */
    pthread_mutex_t models_mu;
    srv_model   **models;            /* (n_models, models_cap) */
    size_t        n_models, models_cap;
    srv_model   **retired;           /* (n_retired, retired_cap) */
    size_t        n_retired, retired_cap;
    /* the --models DIR scanner (scan.c); guarded by scan_mu */
    pthread_mutex_t scan_mu;
    pthread_cond_t  scan_cv;
    pthread_t     scanner;
    int           scanning, scan_stop, scan_asked;
    uint64_t      scans_done;
    srv_budget    budget;
    struct MHD_Daemon *d;
    struct srv_conns *conns;         /* server.c: the connections and their deadlines */
    int           port;
    atomic_int    draining;
    atomic_ullong n_requests, n_errors;
    /* guarded by mu: requests between job creation and its last unref */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int           in_flight;
};

/* gen.c */
/* Opens the container at path (a .jlm or a view directory) as id (NULL: the
 * file stem), joins the budget and starts its worker. */
int  jlm_srv_model_open(struct jlm_srv *s, const char *path, const char *id, srv_model **out, jlm_err *err);
/* A PENDING entry: listed with status, answers 503; no engine. */
int  jlm_srv_model_pending(struct jlm_srv *s, const char *path, const char *id, const char *status, srv_model **out);
/* Stops its worker (after what it has queued), leaves the budget, frees;
 * accepts NULL. */
void jlm_srv_model_close(srv_model *m);
/* The stem id of a path: "a/foo.jlm" and "a/foo.jlm/" are "foo". malloc'd. */
char *jlm_srv_model_stem(const char *path);

/* prefix.c (see srv_pcache above); caller holds m->pager_mu */
/* The entry sharing the longest prefix with tok[0, n) (NULL: none) and
 * that prefix's length (whole blocks, at most n - 1). Touches it (LRU). */
const srv_pentry *jlm_srv_pcache_find(srv_model *m, const int32_t *tok, uint32_t n, uint32_t *shared);
/* Keeps the first n positions of seq (tok[0, n) evaluated on it): entries
 * it extends are dropped, least recently used ones evicted to make room
 * under the limit and the model's grant; nothing kept when it cannot fit.
 * Memory failures keep nothing. */
void jlm_srv_pcache_put(srv_model *m, jlm_engine_seq *seq, const int32_t *tok, uint32_t n);
/* Evicts (LRU) until the cache holds at most `room` bytes. */
void jlm_srv_pcache_shrink(srv_model *m, uint64_t room);
void jlm_srv_pcache_free(srv_model *m);
/* The pager's budget for m's grant less its cache (grant 0: unlimited). */
void jlm_srv_pcache_fit_pager(srv_model *m);

/* budget.c (see srv_budget above) */
void jlm_srv_budget_init(srv_budget *b, uint64_t total);
void jlm_srv_budget_fini(srv_budget *b);
/* Adds m (engine open) with its minimum working set as grant, taking frames
 * from others when needed; a total below the sum of the minimums is raised
 * to it with a note on stderr. JLM_ENOMEM. */
int  jlm_srv_budget_join(srv_budget *b, srv_model *m, jlm_err *err);
void jlm_srv_budget_leave(srv_budget *b, srv_model *m);
/* Called by m's worker before a step, holding no lock. Cannot fail: with
 * nothing to take m keeps its grant. */
void jlm_srv_budget_acquire(srv_budget *b, srv_model *m);

/* scan.c: the models table */
/* A referenced model by id (NULL: none); release with jlm_srv_model_unref. */
srv_model *jlm_srv_model_find(struct jlm_srv *s, const char *id);
/* The only model when exactly one is served, referenced; else NULL. */
srv_model *jlm_srv_model_only(struct jlm_srv *s);
void jlm_srv_model_unref(srv_model *m);
/* Adds m to the table (taking the caller's reference); JLM_EINVAL when its
 * id is served already. */
int  jlm_srv_models_add(struct jlm_srv *s, srv_model *m, jlm_err *err);
/* Scans --models DIR once (blocking): new files and views are opened,
 * changed ones reopened, vanished ones retired, retired ones with no worker
 * and no user closed. first: errors end the open instead of being listed. */
int  jlm_srv_scan(struct jlm_srv *s, int first, jlm_err *err);
/* 1 when a model of the folder no longer is what was opened (its file gone
 * or changed, its view's status no longer `ready`): one stat, and a read of
 * a view's status. */
int  jlm_srv_model_stale(const srv_model *m);
/* Starts the scanner thread (every rescan_s seconds, and when asked). */
int  jlm_srv_scanner_start(struct jlm_srv *s, jlm_err *err);
/* Asks for a scan and waits for one that started after the call (at most
 * timeout_ms); a no-op without --models. */
void jlm_srv_scan_now(struct jlm_srv *s, int timeout_ms);
/* Stops the scanner; closes every model, retired or not. */
void jlm_srv_models_close_all(struct jlm_srv *s);
/* Tokenizes the request's prompt (completions: as `jlm run -p`; chat: the
 * rendered template, as `jlm chat`; embeddings: each input, embed.c) into a
 * new job with two references (`n` > 1: and its other choices, forked).
 * JLM_EINVAL (empty prompt, context exceeded, template error, an image that
 * does not decode or a model without a vision tower) with the message for a
 * 400; JLM_ENOMEM. req is moved into the job on success. */
int  jlm_srv_job_create(srv_model *m, jlm_srv_req *req, srv_job **out, jlm_err *err);
/* Queues j and its choices (`n` > 1) on its model, all or none; JLM_ERANGE
 * when the queue has no room for them all (503); then drop it
 * (jlm_srv_job_drop). */
int  jlm_srv_job_submit(srv_job *j);
void jlm_srv_job_unref(srv_job *j);
/* Appends n bytes to a stream's output and wakes its reader; an allocation
 * failure marks the job failed (500). */
void jlm_srv_job_write(srv_job *j, const char *p, size_t n);
/* The monotonic clock in microseconds. */
uint64_t jlm_srv_now_us(void);

/* `n` > 1: the choices after the first, each a job with its own sampler
 * seed (seed + i when the request gives one); JLM_ENOMEM. Called by
 * jlm_srv_job_create. */
int  jlm_srv_job_fork(srv_job *j, jlm_err *err);
/* Drops a created job that was never queued (both sides, and its choices'). */
void jlm_srv_job_drop(srv_job *j);
/* Appends choices 1.. of a finished job to its completion object (text,
 * finish_reason, logprobs), their completion tokens to its usage. */
void jlm_srv_job_add_choices(const srv_job *j, json_t *done);

/* embed.c: EMBED jobs. Tokenizes req->inputs (each as /v1/completions
 * tokenizes a prompt) into *ids with the offsets *off (n_in + 1); JLM_EINVAL
 * naming the input that is empty or longer than the context. */
int  jlm_srv_embed_tokens(srv_model *m, const jlm_srv_req *req, int32_t **ids, size_t *n, uint32_t **off,
                          size_t *n_in, jlm_err *err);
/* On the worker: every input of j evaluated on seq (rewound before each),
 * its vector into j->emb. */
int  jlm_srv_embed_run(srv_model *m, jlm_engine_seq *seq, srv_job *j, jlm_err *err);

#endif
