/* exec_dev.h - whole blocks on a device backend: the one walk of a block
 * program (engine/prog.h) that Vulkan (exec_vk.c) and CUDA (exec_cu.c)
 * share, over the primitives each backend supplies (jlm_exd_ops), the
 * decision whether a block runs there at all, and what the backends' MOE op
 * and output share (jlm_exd_moe_plan, jlm_exd_held).
 *
 * A walk runs twice per block: dry (k->dry: the primitives only say whether
 * they can, JLM_EUNSUPPORTED if not, nothing recorded) and then for real.
 * The decision is made per model and layer: an F32 or F16 cache (K and V
 * alike; a backend's kv_put refuses the types it lacks), a causal model,
 * every op of the program supported (latent attention: the engine's own
 * sequence only); once a layer's first block was placed, it stays on that
 * side for every sequence (their KV caches are there: a device cache per
 * sequence, jlm_exd_seqs). Weights and vectors reach the primitives as host
 * addresses; a backend maps them to its device frames (or answers
 * JLM_EUNSUPPORTED). Internal to engine/; the graph's one thread. */
#ifndef JLM_ENGINE_EXEC_DEV_H
#define JLM_ENGINE_EXEC_DEV_H

#include "engine/exec_int.h"

typedef struct jlm_exd jlm_exd;

/* Rows are the block's n rows of a jlm_actbuf buffer, each jlm_exd_width wide. */
typedef struct jlm_exd_ops {
    int (*norm)(jlm_exd *k, int dst, int src, const float *w);      /* dst = rmsnorm(src) * w (NULL: none) */
    int (*mm)(jlm_exd *k, const jlm_k_mat *m, int src, int dst, int reuse);   /* reuse: src was quantized last */
    int (*bias)(jlm_exd *k, int b, const float *bias);              /* b's rows += bias (never NULL) */
    /* each head's norm (w; wide: one norm over the whole row, OLMoE), RoPE */
    int (*heads)(jlm_exd *k, int b, uint32_t n_head, const float *w, int wide);
    int (*kv_put)(jlm_exd *k);                                      /* K, V rows into the cache at their positions */
    /* ATT rows over the cache: keys from jlm_ex_first_key (a window's) to the row's own, sinks (NULL: none) */
    int (*attend)(jlm_exd *k, const float *sinks);
    int (*add)(jlm_exd *k, int dst, int src);                       /* dst rows += src rows (n_embd wide) */
    int (*act)(jlm_exd *k, int act, uint64_t n);                    /* G = act(G, U), n floats (gated kinds) */
    int (*moe)(jlm_exd *k, const jlm_op *op);                       /* the routed experts (NULL: not here) */
    int (*mla)(jlm_exd *k, const jlm_op *op);   /* latent attention's MLA_KV, MLA_Q, MLA_ATTN (NULL: not here) */
    int kv_any;   /* kv_put and attend keep every cache type (Q8_0, keys and values of different types); 0: F32
                   * or F16, the same for both */
} jlm_exd_ops;

struct jlm_exd {
    const jlm_exd_ops *ops;
    void              *be;      /* the backend (jlm_evk *, jlm_ecu *) */
    jlm_dev           *dev;     /* be's first member: --profile's op classes (jlm_dev_prof_op) */
    jlm_engine        *e;
    const jlm_config  *c;
    jlm_ex_blk         b;
    void              *kc;      /* the rows' one sequence's cache (NULL: the batch bound in the engine) */
    uint32_t           pos0;
    int                dry, q_ready;
    jlm_err           *err;
};

/* Row t's sequence: the host cache it is bound to (jlm_engine's kc or a
 * jlm_engine_seq's), the key of its device cache. */
static inline const void *jlm_exd_host(const jlm_exd *k, uint32_t t) { return k->kc ? k->kc : k->e->bkc[t]; }
/* How many rows from t on share row t's sequence (a prefill: all). */
uint32_t jlm_exd_group(const jlm_exd *k, uint32_t t);

/* A backend's KV caches, one per sequence (the engine's own and each
 * jlm_engine_seq's, keyed by its host cache): kc, vc are the backend's
 * arrays of n_layer device buffers (NULL until a block of that layer ran
 * there for it). jlm_exd_seq_get finds the entry of host or adds one with
 * zeroed arrays (elem: a buffer handle's size; *t made if NULL); jlm_exd_seq_find: NULL when
 * none; jlm_exd_seq_forget drops the entry (its buffers freed by the
 * caller). */
typedef struct jlm_exd_seqc {
    const void *host;
    void       *kc, *vc;
} jlm_exd_seqc;
typedef struct jlm_exd_seqs {
    jlm_exd_seqc *c;
    uint32_t      n, cap;
} jlm_exd_seqs;
int  jlm_exd_seq_get(jlm_exd_seqs **t, const void *host, uint32_t n_layer, size_t elem, jlm_exd_seqc **out,
                     const char *who, jlm_err *err);
jlm_exd_seqc *jlm_exd_seq_find(const jlm_exd_seqs *t, const void *host);
void jlm_exd_seq_forget(jlm_exd_seqs *t, jlm_exd_seqc *c);

/* A backend's part of jlm_dev_ops.kv_xfer, which jlm_exd_kv_xfer walks:
 * sync: nothing recorded or queued uses a cache any longer (a wait);
 * drop: frees c's buffers and forgets c; cache: layer l's device cache of
 * host's sequence, made if absent, left as the one the next copy uses;
 * stage: a host-visible buffer of bytes (*p: its address); copy: kb key
 * bytes then vb value bytes between it and that cache's layer l (up 1:
 * to the device, 0: back), waited for. */
typedef struct jlm_exd_kvx {
    int  (*sync)(void *be, jlm_err *err);
    void (*drop)(void *be, jlm_exd_seqc *c);
    int  (*cache)(void *be, jlm_engine *e, const void *host, uint32_t l, jlm_err *err);
    int  (*stage)(void *be, uint64_t bytes, uint8_t **p, jlm_err *err);
    int  (*copy)(void *be, uint32_t l, uint64_t kb, uint64_t vb, int up, jlm_err *err);
} jlm_exd_kvx;
/* jlm_dev_ops.kv_xfer over x (t: the backend's caches, side its layers'
 * record, st its counters: the copies in act_up / act_down). */
int jlm_exd_kv_xfer(const jlm_exd_kvx *x, void *be, jlm_exd_seqs *t, const uint8_t *side, jlm_dev_stats *st,
                    jlm_engine *e, void *kc, void *vc, uint32_t n, int up, jlm_err *err);

/* The floats a row of buffer b holds. */
uint64_t jlm_exd_width(const jlm_engine *e, int b);
/* Row t's position. */
static inline uint32_t jlm_exd_pos(const jlm_exd *k, uint32_t t) { return k->kc ? k->pos0 + t : k->e->bpos[t]; }

/* The walk of k->b.p's ops (dry or not): JLM_OK, JLM_EUNSUPPORTED or a
 * primitive's error. Not dry, each op's class goes to --profile's timer
 * first (jlm_dev_prof_op). */
int jlm_exd_run(jlm_exd *k);

/* Sets up k for block l (dry) and decides: JLM_OK (run it here: the dry
 * walk passed), JLM_EUNSUPPORTED (the host runs it, nothing done) or an
 * error (a layer placed here that can no longer run here). side: the
 * backend's per-layer record (allocated here: n_layer bytes); who: "cuda".
 * be's first member is its jlm_dev. */
int jlm_exd_plan(jlm_exd *k, const jlm_exd_ops *ops, void *be, jlm_engine *e, const jlm_prog *p, uint32_t l,
                 const uint8_t *page, uint32_t n, void *kc, uint32_t pos0, uint8_t **side, const char *who,
                 jlm_err *err);

/* Whether n sheets (latent attention's per-head matrices) whose plane
 * starts at a0 (sheet 0), a1 (sheet 1) and al (the last) are one batch for
 * a batched matvec: one stride, a whole number of 32-bit words (*st). */
int jlm_exd_sheet_stride(uint64_t a0, uint64_t a1, uint64_t al, uint64_t n, uint64_t *st);

/* Whether the n rows of E floats at x are rows the device holds: among the
 * x_rows rows of x_E floats that came up from xh (NULL: none) and within
 * the ab_rows its buffers hold; *r0: the first one's row there. The
 * output's logits (jlm_evk_output, jlm_ecu_output) are computed there only
 * then. */
int jlm_exd_held(const float *xh, uint32_t x_rows, uint32_t x_E, uint64_t ab_rows, const float *x, uint32_t n,
                 uint32_t E, uint64_t *r0);

/* One MoE block's MOE op (engine/prog.h) as every device backend plans it
 * (exec_cu_moe.c, exec_vk_moe.c), checked before anything is enqueued or
 * recorded; each backend keeps its own extras (its biases' device
 * addresses or views, strides, predictions) beside it. */
typedef struct jlm_exd_moe {
    jlm_engine       *e;
    const jlm_ex_blk *b;
    const jlm_op     *op;
    jlm_err          *err;
    const jlm_tensor *tg, *tu, *td;   /* the gate, up and down banks */
    uint64_t          E, nff;
    uint32_t          ne, nu, first;  /* first: the page of the bank's expert 0 */
    const float      *bias[4];        /* host: the router's, the gate, up and down banks' biases (NULL: none) */
    uint64_t          bias_n[4];      /* their floats */
    float            *ins;            /* (rows) JLM_ROUTE_SIGMOID_IN: each row's input scale */
    /* a batch grouped by expert (jlm_exd_moe_group; NULL until then) */
    uint32_t         *cnt;            /* (ne + 1) expert x's pairs: ord[cnt[x]] to ord[cnt[x + 1]] */
    uint32_t         *ord;            /* (rows * nu) the (row, slot) pairs t * nu + s, by expert, rows ascending */
    uint32_t         *row;            /* (rows * nu) row i of the grouped order is input row row[i] = ord[i] / nu */
} jlm_exd_moe;

/* Fills p (ins NULL) for op of block b (the biases: the host's, each
 * backend maps them to its device) and checks what no backend runs:
 * JLM_EUNSUPPORTED for GELU gates, no router or banks, more than
 * JLM_MAX_EXPERTS experts or JLM_MAX_EXPERTS_USED used, a bank not
 * k x rows each expert (quantized: whole 32-blocks), a router not
 * n_embd x n_expert. */
int jlm_exd_moe_plan(jlm_exd_moe *p, jlm_engine *e, const jlm_ex_blk *b, const jlm_op *op, jlm_err *err);

/* A batch of the block's rows routed (picks: b->n rows of nu experts)
 * grouped by expert as exec_moe.c's moe_batch groups it (p->cnt, p->ord,
 * p->row), so that each used expert is one matmul over its gathered rows.
 * JLM_OK or JLM_ENOMEM. */
int jlm_exd_moe_group(jlm_exd_moe *p, const int32_t *picks);
/* Then, expert by expert in order, its page acquired through the streamer
 * (host page, device frame: resident while fn records or enqueues its
 * group), the next used expert's page read ahead, fn(ctx, x, g0, m, frame)
 * for expert x's m pairs from ord[g0], and its page released. JLM_OK, the
 * streamer's or fn's error. jlm_exd_moe_free frees what group made. */
typedef int (*jlm_exd_moe_fn)(void *ctx, uint32_t x, uint32_t g0, uint32_t m, const void *frame);
int  jlm_exd_moe_each(jlm_exd_moe *p, jlm_exd_moe_fn fn, void *ctx);
void jlm_exd_moe_free(jlm_exd_moe *p);

#endif
