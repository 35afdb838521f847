/* backend_cu_int.h - the CUDA backend's state, shared by backend_cu.c (the
 * frames, the staging, the copy thread, the matmul offload) and exec_cu.c
 * (whole blocks enqueued on the compute stream). Internal to engine/:
 * nothing else includes it. */
#ifndef JLM_ENGINE_BACKEND_CU_INT_H
#define JLM_ENGINE_BACKEND_CU_INT_H

#include <pthread.h>

#include "engine/backend_cu.h"
#include "engine/prog.h"
#include "kernels/cuda/rt.h"

/* events: staging buffer i free (EV_STAGE + i); the graph's own page-ins
 * done; the copy thread's prefetch done */
enum { EV_STAGE = 0, EV_FRAMES = 2, EV_PF = 3 };
enum { D_ACT, D_Y, D_QS, D_D, D_SC, D_N };   /* device scratch */

typedef struct scratch {
    void    *p;
    uint64_t cap;
} scratch;

/* The copy thread's one job: a prefetch's page-in (jlm_dev_prefetch). */
typedef struct cu_job {
    void          *dev;
    const void    *host;
    uint64_t       len;
    int            state, rc;
    jlm_err        err;
} cu_job;

/* exec_cu.c's device side of a block: the activation buffers (jlm_actbuf),
 * the int8 rows of a matmul's input and their act records (JLM_B_COUNT
 * tables of ab_rows records: buffer b's rows at its width), the attention's
 * scores, the logits, the KV cache of each sequence (per layer, rows of
 * kv_dim), the pinned host rows and logits, and the residual rows the
 * device holds. */
struct jlm_exd_seqs;
typedef struct jlm_ecu_blk {
    scratch   ab[JLM_B_COUNT];
    uint64_t  ab_rows;              /* rows every ab[] and rec table holds */
    scratch   aq, ad, as, rec;
    uint64_t  rec_k[JLM_B_COUNT];   /* the width of rec's table b */
    scratch   odd;                  /* ab_rows records of width odd_k (made for odd_rows rows) */
    uint64_t  odd_k, odd_rows;
    scratch   scores, logits;
    scratch   rowt;                 /* a prefill block's row table: positions, then (first key, keys) a row */
    uint32_t  rowt_most;            /* ... the most keys of a row */
    scratch   h_x, h_logits;        /* pinned host */
    void    **kc, **vc;             /* (n_layer,) the sequence being enqueued's (one of seqs): NULL until a
                                     * block of that layer ran here for it */
    struct jlm_exd_seqs *seqs;      /* every sequence's device cache (exec_dev.h) */
    scratch   stage;                /* pinned: a sequence's cache rows up or down (jlm_ecu_kv_xfer) */
    uint32_t  n_layer;
    uint8_t  *side;                 /* (n_layer,) the blocks: 0 undecided, 1 here, 2 host */
    float    *x_host;               /* where the rows held belong on the host; NULL: the host has them */
    uint32_t  x_rows, x_E;
    int       queued;               /* kernels enqueued since the host last waited for the compute stream */
    scratch   dpos, h_dpos;         /* a decoded token's position: device, pinned (4 bytes, up with the rows) */
    uint32_t  dpos_at;              /* ... its value; */
    int       dpos_ok;              /* ... 1: dpos holds it (one row went up): RoPE, the cache and attention read it */
    struct jlm_ecu_moebufs *moe;    /* exec_cu_moe.c's buffers; NULL until a MoE block ran here */
    struct jlm_ecu_mlabufs *mla;    /* exec_cu_mla.c's; NULL until a latent attention block ran here */
} jlm_ecu_blk;

typedef struct jlm_ecu {
    jlm_dev        dev;   /* first: a jlm_dev * is a jlm_ecu * */
    jlm_cu_rt     *rt;
    /* staging, shared by the graph's page-ins and the copy thread's: mu */
    pthread_mutex_t mu;
    void          *stage[2];
    int            stage_busy[2];
    int            next;
    uint64_t       stage_bytes;
    uint64_t       bytes_up;         /* under mu */
    int            frames_pending;   /* a page-in was queued since the compute stream last waited */
    /* the copy thread: a prefetch's copy overlaps the kernels before it */
    pthread_mutex_t jmu;
    pthread_cond_t  jcv;
    pthread_t       thr;
    int             thr_on, stop;
    cu_job          job;
    scratch        d[D_N];
    scratch        h_act, h_y;        /* pinned host scratch */
    /* freed frames kept for the next page-in (cudaFree waits for the whole
     * device, cudaMalloc is slow): at most SPARES, outside the budget */
    struct { void *p; uint64_t cap; } spare[2];
    int            nspare;
    uint64_t       default_budget;
    jlm_dev_stats  st;
    uint64_t       launch0;          /* jlm_cu_rt_launches at the last stats reset */
    jlm_cu_rt_count cnt0;            /* the runtime's other counts at the last stats reset */
    jlm_ecu_blk    blk;
    char           name[300];
    /* --profile: stamps on the compute stream at each op class change
     * (jlm_dev_prof_op), summed per class when read */
    int            prof_tag;
    uint32_t       prof_n;
    uint8_t        prof_of[JLM_CU_NSTAMP];
    uint64_t       prof_ns[JLM_DEVP_N];
} jlm_ecu;

uint64_t jlm_ecu_now_ns(void);
int  jlm_ecu_fail(jlm_ecu *v, jlm_err *err, const char *what);   /* JLM_EIO naming the seam's last error */
/* s holding at least n bytes of device (pinned: pinned host) memory; the
 * old contents are lost. */
int  jlm_ecu_grow(jlm_ecu *v, scratch *s, uint64_t n, int pinned, jlm_err *err);
void jlm_ecu_scratch_free(jlm_ecu *v, scratch *s, int pinned);
/* m's planes as device addresses in pinned frames (or the dense region);
 * 1 and nothing done when a plane is in none. */
int  jlm_ecu_planes(jlm_ecu *v, const jlm_k_mat *m, jlm_cu_mat *cm, jlm_err *err);
/* The compute stream waits for the graph's page-ins queued since its last wait. */
int  jlm_ecu_frames_wait(jlm_ecu *v, jlm_err *err);
/* The host waits for the compute stream's kernels (a round trip), if any are queued. */
int  jlm_ecu_drain(jlm_ecu *v, jlm_err *err);

/* exec_cu.c: the jlm_dev_ops entries (docs/cuda.md "Whole blocks on the
 * device"), and the state's release at close. */
int  jlm_ecu_block(jlm_dev *d, struct jlm_engine *e, const jlm_prog *p, uint32_t l, const uint8_t *page, float *xs,
                   uint32_t n, void *kc, uint32_t pos0, jlm_err *err);
int  jlm_ecu_x_sync(jlm_dev *d, jlm_err *err);
void jlm_ecu_x_drop(jlm_dev *d);
int  jlm_ecu_output(jlm_dev *d, const float *norm, float eps, const jlm_k_mat *m, const float *x, uint32_t n,
                    uint32_t E, float *logits, jlm_err *err);
void jlm_ecu_blk_free(jlm_ecu *v);
/* jlm_dev_ops.kv_xfer: a sequence's device cache up (1), down (0) or freed (-1). */
int  jlm_ecu_kv_xfer(jlm_dev *d, struct jlm_engine *e, void *kc, void *vc, uint32_t n, int up, jlm_err *err);
/* exec_cu.c's helpers for exec_cu_moe.c: y (n rows) = x (n rows of
 * activation buffer src) times m, quantized types through src's int8 rows
 * (reuse: quantized by the previous call; dry: only whether it can); a dense
 * vector's device address (p NULL: none; JLM_EUNSUPPORTED: in no frame);
 * bytes of device src into host dst through the pinned pin after everything
 * queued (a round trip, counted in the activations down). */
int  jlm_ecu_matmul_rows(jlm_ecu *v, const jlm_k_mat *m, uint32_t n, const float *x, int src, float *y, int reuse,
                         int dry, jlm_err *err);
int  jlm_ecu_vec(jlm_ecu *v, const float *p, uint64_t n, const float **out);
int  jlm_ecu_down(jlm_ecu *v, scratch *pin, float *dst, const void *src, uint64_t bytes, jlm_err *err);
/* The act record of k int8 codes at element off of the int8 rows q, d, s;
 * count records h copied into device dst (at the call), counted in the
 * activations up (parameters). */
jlm_cu_act jlm_ecu_act_at(const scratch *q, const scratch *d, const scratch *s, uint64_t k, uint64_t off);
int  jlm_ecu_records_up(jlm_ecu *v, void *dst, const jlm_cu_act *h, uint64_t count, jlm_err *err);
/* exec_cu_moe.c: the MOE op of block b (the router on the device, its
 * logits down in the block's one round trip, the CPU's routing on the host,
 * the routed experts through the streamer, their mixture) enqueued on the
 * compute stream; dry: only whether it can (JLM_EUNSUPPORTED: not).
 * moe_free: its buffers. */
struct jlm_ex_blk;
struct jlm_op;
int  jlm_ecu_moe(jlm_ecu *v, struct jlm_engine *e, const struct jlm_ex_blk *b, const struct jlm_op *op, int dry,
                 jlm_err *err);
void jlm_ecu_moe_free(jlm_ecu *v);
/* exec_cu_mla.c: latent attention's ops (MLA_KV, MLA_Q, MLA_ATTN) of the
 * walk's block enqueued on the compute stream (dry: only whether they can;
 * JLM_EUNSUPPORTED: not), the cache in the layer's kc; mla_free: its buffers. */
struct jlm_exd;
int  jlm_ecu_mla(struct jlm_exd *k, const struct jlm_op *op);
/* exec_cu.c: a prefill block's rows (n > 1) in one grid (kernels/cuda/body.h
 * jlm_cu_rows): rows [t0, t0 + m), x rows xw floats apart, each row's
 * position and keys from the row table the block sent up. attn_rows: every
 * row's attention (ap: the one-row parameters; q rows qw and out rows ow
 * floats apart, the layer's cache kc, vc at position 0) in as few launches
 * as the scores hold (one, but for a long prompt on a large model). */
jlm_cu_rows jlm_ecu_rows(const struct jlm_exd *k, uint32_t t0, uint32_t m, uint64_t xw);
int jlm_ecu_attn_rows(struct jlm_exd *k, jlm_cu_attn *ap, const float *q, uint64_t qw, const void *kc, const void *vc,
                      float *out, uint64_t ow, const char *what);
/* The device's copy of a decoded row's position (exec_cu.c: up with the
 * rows), or NULL (a prefill's rows, or no copy): the launches then take
 * the position as an argument or from the row table. */
const uint32_t *jlm_ecu_dpos(const struct jlm_exd *k);
void jlm_ecu_mla_free(jlm_ecu *v);

#endif
