/* backend_vk_int.h - the Vulkan backend's state, shared by backend_vk.c (the
 * frames, the matmul offload) and exec_vk.c (whole blocks recorded into one
 * command buffer). Internal to engine/: nothing else includes it. */
#ifndef JLM_ENGINE_BACKEND_VK_INT_H
#define JLM_ENGINE_BACKEND_VK_INT_H

#include "engine/backend_vk.h"
#include "engine/prog.h"
#include "kernels/vulkan/vk.h"

enum { B_QS, B_D, B_SC, B_X, B_Y, B_AQ, B_AD, B_AS, B_N };

/* exec_vk.c's device side of a block: the activation buffers (jlm_actbuf;
 * X host-visible: the residual stream crosses there), the attention's
 * scores, the logits, the KV cache of each sequence (per layer, rows of
 * kv_dim), and the residual rows the device holds. */
struct jlm_exd_seqs;
typedef struct jlm_evk_blk {
    jlm_vk_buf *ab[JLM_B_COUNT];
    uint64_t    ab_rows;             /* rows every ab[] holds */
    jlm_vk_buf *scores, *logits;
    jlm_vk_buf *aq, *ad, *as;        /* the int8 rows of a matmul's input (jlm_vk_quantize) */
    jlm_vk_buf *mla;                 /* exec_vk_mla.c's scratch (latent attention), sized by buffers() */
    jlm_vk_buf *cs;                  /* (rows, n_rot) each row's RoPE cos/sin, host-visible: up with the rows */
    jlm_vk_buf **kc, **vc;           /* (n_layer,) the sequence being recorded's (one of seqs): NULL until a
                                      * block of that layer ran here for it */
    struct jlm_exd_seqs *seqs;       /* every sequence's device cache (exec_dev.h) */
    jlm_vk_buf *stage;               /* host-visible: a sequence's cache rows up or down (jlm_evk_kv_xfer) */
    uint32_t    n_layer;
    uint8_t    *side;                /* (n_layer,) the blocks: 0 undecided, 1 here, 2 host */
    float      *x_host;              /* where the rows held belong on the host; NULL: the host has them */
    uint32_t    x_rows, x_E;
} jlm_evk_blk;

typedef struct jlm_evk {
    jlm_dev        dev;   /* first: a jlm_dev * is a jlm_evk * */
    jlm_vk        *vk;
    jlm_vk_buf    *b[B_N];
    int            import;   /* the import path */
    jlm_dev_stats  st;       /* the backend's counters (frames': dev.frames) */
    uint64_t       disp0;    /* jlm_vk_dispatches at the last stats reset */
    jlm_evk_blk    blk;
    struct jlm_evk_moebufs *moe;   /* exec_vk_moe.c's buffers; NULL until a MoE block ran here */
} jlm_evk;

uint64_t jlm_evk_now_ns(void);
/* m's planes as views of their device frame; reupload: else copied for this
 * call into the staging buffers (never inside a recording), or
 * JLM_EUNSUPPORTED. */
int jlm_evk_planes(jlm_evk *v, const jlm_k_mat *m, jlm_vk_mat *vm, int reupload, jlm_err *err);
/* Ends an open recording (a submit-and-wait, counted a round trip). */
int jlm_evk_rec_end(jlm_evk *v, jlm_err *err);

/* exec_vk.c: the jlm_dev_ops entries, and the state's release at close. */
int  jlm_evk_block(jlm_dev *d, struct jlm_engine *e, const jlm_prog *p, uint32_t l, const uint8_t *page, float *xs,
                   uint32_t n, void *kc, uint32_t pos0, jlm_err *err);
int  jlm_evk_x_sync(jlm_dev *d, jlm_err *err);
void jlm_evk_x_drop(jlm_dev *d);
int  jlm_evk_output(jlm_dev *d, const float *norm, float eps, const jlm_k_mat *m, const float *x, uint32_t n,
                    uint32_t E, float *logits, jlm_err *err);
void jlm_evk_blk_free(jlm_evk *v);
/* A sequence's device cache (host: its host cache kc): up (1: positions
 * [0, n) of every layer here from the host cache kc, vc, made if absent),
 * down (0: the same back into kc, vc) or dropped (-1; kc, vc unread). */
int  jlm_evk_kv_xfer(jlm_dev *d, struct jlm_engine *e, void *kc, void *vc, uint32_t n, int up, jlm_err *err);
/* exec_vk.c's helpers for exec_vk_moe.c: y (n rows) = x times m (planes in a
 * device frame; quantized: x's int8 rows made in blk.aq, reuse: the previous
 * call's); a dense vector's view (p NULL: none); *b at least bytes (a
 * recording is ended first when it is replaced). */
int jlm_evk_matmul_rows(jlm_evk *v, const jlm_k_mat *m, uint32_t n, jlm_vk_view x, jlm_vk_view y, int reuse, int dry,
                        jlm_err *err);
int jlm_evk_vec(jlm_evk *v, const float *p, uint64_t n, jlm_vk_view *out);
int jlm_evk_grow(jlm_evk *v, jlm_vk_buf **b, uint64_t bytes, int host, jlm_err *err);

/* exec_vk_moe.c: the MOE op of block b (router, picks read back, the routed
 * experts through the streamer, their mixture) recorded on the device; dry:
 * only whether it can (JLM_EUNSUPPORTED: not). moe_free: its buffers. */
struct jlm_ex_blk;
struct jlm_op;
int  jlm_evk_moe(jlm_evk *v, struct jlm_engine *e, const struct jlm_ex_blk *b, const struct jlm_op *op, int dry,
                 jlm_err *err);
void jlm_evk_moe_free(jlm_evk *v);
/* exec_vk_mla.c: latent attention's ops (MLA_KV, MLA_Q, MLA_ATTN) of the
 * walk k (dry: only whether it can); the bytes of its scratch for rows rows.
 * exec_vk.c's helpers for it: the RoPE cos/sin of the block's rows for its
 * layer (rp: the parameters; row t's at t * cs_stride floats of cs),
 * JLM_EUNSUPPORTED when no table up with the rows is it; how many rows from
 * t on sit at consecutive positions (a prefill: all); and the attention of
 * the block's rows over a layer's cache (kv), row t's query at q + t*qw
 * floats over keys [lh[2t], lh[2t+1]), its output at out + t*ow (a dispatch
 * a chunk of rows whose scores fit). */
struct jlm_exd;
typedef struct jlm_evk_kv {
    jlm_vk_buf *kc;
    uint64_t    kb;   /* a position's bytes */
    int         kt;   /* JLM_VK_KV_* */
    jlm_vk_buf *vc;
    uint64_t    vb;
    int         vt;
} jlm_evk_kv;
int      jlm_evk_mla(struct jlm_exd *k, const struct jlm_op *op);
uint64_t jlm_evk_mla_bytes(jlm_evk *v, const struct jlm_engine *e, uint32_t rows);
int      jlm_evk_rope_cs(const struct jlm_exd *k, jlm_k_rope *rp, jlm_vk_view *cs, uint32_t *cs_stride);
uint32_t jlm_evk_run_of(const struct jlm_exd *k, uint32_t t);
int      jlm_evk_attend_rows(const struct jlm_exd *k, const jlm_k_attn *ap, uint32_t n_head, uint32_t n_kv_head,
                             const uint32_t *lh, jlm_vk_view q, uint32_t qw, jlm_evk_kv kv, const float *sinks,
                             jlm_vk_view out, uint32_t ow);

#endif
