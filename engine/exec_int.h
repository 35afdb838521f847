/* exec_int.h - the CPU executor of block programs (engine/prog.h), shared by
 * exec.c (the op loop, matmuls, norms, the dense FFN), exec_attn.c (the
 * cache and attention ops) and exec_moe.c (the routed experts), and by
 * model.c (embeddings and the output matrix). Internal to engine/.
 *
 * Every op runs today's kernels (kernels/cpu/kernels.h) on the engine's pool
 * in the same order of floating-point operations as the one graph they
 * replaced: a program's results are bit-identical to it. A matmul goes to
 * the block's device backend (e->dev_here, chosen by the streamer) where it
 * can, else to the CPU kernels. Called from the graph's one thread. */
#ifndef JLM_ENGINE_EXEC_INT_H
#define JLM_ENGINE_EXEC_INT_H

#include <time.h>

#include "engine/model_int.h"
#include "engine/prog.h"

/* ================================================================ tensors -> kernel operands */
/* A kernel matrix over planes at base (whose file offset is base_off). For an
 * expert bank, `shift` is the expert's page offset relative to expert 0. */
static inline jlm_k_mat mat_at(const jlm_tensor *t, const uint8_t *base, uint64_t base_off, uint64_t shift)
{
    jlm_k_mat m = {.type = t->type, .k = jlm_tensor_k(t), .rows = jlm_tensor_rows(t)};
    m.qs = base + (t->qs_off + shift - base_off);
    const jlm_type_traits *tr = jlm_fmt_type_traits(t->type);
    m.d = tr->is_float ? NULL : base + (t->d_off + shift - base_off);
    m.sc = tr->sc_kind ? base + (t->sc_off + shift - base_off) : NULL;
    return m;
}

static inline jlm_k_mat mat_dense(const jlm_engine *e, const jlm_tensor *t)
{
    return mat_at(t, e->dense, e->m->hdr.dense_off, 0);
}

/* Expert xe's matrix of bank t in block l, in that expert's page frame
 * (first: the page of the block's expert 0). The bank's offsets address
 * expert 0's page: shifted to expert xe's. */
static inline jlm_k_mat mat_expert(const jlm_engine *e, const jlm_tensor *t, const void *frame, uint32_t first,
                                   uint32_t xe)
{
    const jlm_header *hd = &e->m->hdr;
    uint64_t pg_off = hd->exp_data_off + (uint64_t)(first + xe) * hd->exp_page_size;
    return mat_at(t, frame, pg_off, (uint64_t)xe * hd->exp_page_size);
}

static inline const float *vec_dense(const jlm_engine *e, const jlm_tensor *t)
{
    return t ? (const float *)(e->dense + (t->qs_off - e->m->hdr.dense_off)) : NULL;
}

static inline void add_bias(float *y, const float *b, uint64_t n)
{
    if (b)
        for (uint64_t i = 0; i < n; i++)
            y[i] += b[i];
}

/* ================================================================ profiling */
static inline unsigned long long prof_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* A class's start: 0 when off or inside another timed class (counted there). */
static inline unsigned long long prof_begin(jlm_engine *e)
{
    if (!e->prof || e->prof_in)
        return 0;
    e->prof_in = 1;
    return prof_now();
}

static inline void prof_end(jlm_engine *e, int cls, unsigned long long t0)
{
    if (!t0)
        return;
    e->pr.ns[cls] += prof_now() - t0;
    e->prof_in = 0;
}

/* ================================================================ the block being run */
/* One block's operands while its program runs: the layer, its page (pinned
 * by the streamer), the rows of this chunk. */
typedef struct jlm_ex_blk {
    const jlm_prog *p;
    uint32_t        l;
    const uint8_t  *page;
    uint64_t        page_off;
    uint32_t        n;          /* rows of this chunk (<= nb), from e->x */
    int             att_done;   /* QKV ran the fused decode: Q, Q_ROPE, ATTENTION are done */
} jlm_ex_blk;

/* The tensor of role r of the block (NULL: none, or r == 0). */
static inline const jlm_tensor *blk_w(const jlm_engine *e, const jlm_ex_blk *b, uint16_t r)
{
    return r ? W(e, (int32_t)b->l, r) : NULL;
}
static inline const float *blk_vec(const jlm_engine *e, const jlm_ex_blk *b, uint16_t r)
{
    return vec_dense(e, blk_w(e, b, r));
}
static inline jlm_k_mat blk_mat(const jlm_engine *e, const jlm_ex_blk *b, uint16_t r)
{
    return mat_at(W(e, (int32_t)b->l, r), b->page, b->page_off, 0);
}
/* The activation buffer b (jlm_actbuf) of the batch. */
float *jlm_ex_buf(jlm_engine *e, int b);
/* The program's first op of a kind (NULL: none). */
const jlm_op *jlm_ex_find(const jlm_prog *p, int kind);

/* ================================================================ threaded matvec / matmul (exec.c) */
typedef struct mm_job {
    jlm_k_matvec_fn mv;
    jlm_k_matmul_fn mm;
    const jlm_k_mat *m;
    uint64_t n;
    const float *x;
    const jlm_act_q8 *xq;
    float *y;
} mm_job;

void jlm_ex_mm_slice(void *ctx, size_t b, size_t en, int tid);

/* Work of a batch that is per token and independent across tokens, split
 * over the pool for ROWS_PAR tokens or more (exec.c). */
typedef void (*jlm_ex_row_fn)(jlm_engine *e, void *ctx, uint32_t t);
void jlm_ex_for_rows(jlm_engine *e, uint32_t n, jlm_ex_row_fn fn, void *ctx);
void jlm_ex_quant_rows(jlm_engine *e, const float *x, uint64_t k, uint32_t n);
void jlm_ex_norm_rows(jlm_engine *e, float *h, const float *x, const float *w, uint32_t E, uint32_t n);
void jlm_ex_mm_dispatch(jlm_engine *e, uint32_t n, size_t count, size_t grain, jlm_pool_fn fn, void *ctx);
void jlm_ex_matmul_x(jlm_engine *e, const jlm_k_mat *m, uint32_t n, const float *x, float *y, int shared);
static inline void jlm_ex_matmul(jlm_engine *e, const jlm_k_mat *m, uint32_t n, const float *x, float *y)
{
    jlm_ex_matmul_x(e, m, n, x, y, 0);
}
void jlm_ex_matmul_multi(jlm_engine *e, const jlm_k_mat *const *ms, float *const *ys, int nm, uint32_t n,
                         const float *x);
void jlm_ex_gate_up_act(jlm_engine *e, int act, const jlm_k_mat *wg, const jlm_k_mat *wu, uint32_t n,
                        const float *x);
void jlm_ex_activate(const jlm_k_cpu *k, int act, float *g, const float *u, uint64_t n);

/* ================================================================ ops */
void jlm_ex_rope_params(const jlm_engine *e, uint32_t l, jlm_k_rope *p);   /* exec_attn.c: layer l's RoPE */
/* exec_attn.c: the first key a query at pos sees on layer l (0, or a sliding window's / a chunk's start) */
uint32_t jlm_ex_first_key(const jlm_config *c, uint32_t l, uint32_t pos);
/* exec_attn.c: the factor on q at pos on a layer of RoPE rp (Llama 4's attention temperature; 1 elsewhere) */
float jlm_ex_q_temp(const jlm_config *c, const jlm_k_rope *rp, uint32_t pos);
void jlm_ex_qkv(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b);        /* exec_attn.c */
void jlm_ex_kv_store(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b);
void jlm_ex_q(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b);
void jlm_ex_q_rope(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b);
void jlm_ex_attention(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b);
int  jlm_ex_moe(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b, jlm_err *err);   /* exec_moe.c */
/* One token's experts sel[n_expert_used] and weights w from its router
 * logits lg (the router's bias added) by routing mode (JLM_ROUTE_*, or a
 * JLM_K_ROUTE_* mode), as block l routes on the CPU; JLM_ROUTE_SIGMOID_IN
 * scales the token's normed input h (n_embd) by its expert's gate instead
 * (h NULL: a device scales its own copy). Returns the factor h is scaled by
 * (1 but for JLM_ROUTE_SIGMOID_IN). */
float jlm_ex_route_pick(const jlm_engine *e, int mode, uint32_t l, float *lg, int32_t *sel, float *w, float *h);
/* Block l's float router copied from its page for the next blocks' read-ahead
 * predictions (once; none without e->predict; exec_moe.c) */
void jlm_ex_router_keep(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off);
/* Reading ahead (exec_moe.c, docs/pager.md): the next MoE block after l
 * whose router the host keeps (e->pred_buf), or n_layer: none (without
 * e->predict, or not kept yet); a decode step predicts it when
 * jlm_stream_predict_now says so. predict_pick: that block's experts sel
 * (n_expert_used) from its router's logits lg (n_expert, before its bias;
 * changed) over this block's normed input, as the CPU picks them (sigmoid
 * routing's choice, else the top-k by logit, in the logits' order); returns
 * the first page of its bank, for jlm_stream_predict. */
uint32_t jlm_ex_predict_block(const jlm_engine *e, uint32_t l);
uint32_t jlm_ex_predict_pick(jlm_engine *e, int route, uint32_t nl, float *lg, int32_t *sel);
/* --trace-routing's line for row t's choice sel in block l (none without it; exec_moe.c) */
void jlm_ex_trace_route(const jlm_engine *e, uint32_t l, uint32_t t, const int32_t *sel);

/* Block l's program over rows [0, n) of xs, nb at a time through e->x
 * (model.c's run_layers; kc/vc as there); page: its frame (the streamer's).
 * The ops before KEYS_DONE run for every chunk first, then the rest. */
int jlm_ex_block(jlm_engine *e, const jlm_prog *p, uint32_t l, const uint8_t *page, float *xs, uint32_t n,
                 void *kc, void *vc, uint32_t pos0, jlm_err *err);
/* Whole blocks on a device (jlm_dev_ops.block): the residual rows a device
 * holds back on the host (every device's but except's); forgotten (the
 * host's are new: a forward's start). */
int  jlm_ex_x_host(jlm_engine *e, const jlm_dev *except, jlm_err *err);
void jlm_ex_x_forget(jlm_engine *e);

/* ================================================================ the streamer (stream.c) */
/* Owns paging for the layer loop: a block's page on the host and on the
 * block's device (it sets e->dev_here), the read-ahead of the next block
 * (host) and its device prefetch, and expert pages. Acquire -> compute ->
 * release; the layer loop and the ops make no pager or device-frame call. */
/* Block l's page, for program p over n rows. On the CPU under a budget
 * below the pages, with n <= nb and a program whose ops use only their own
 * weights, the page is acquired op by op (jlm_stream_op before each op:
 * tensor-granular acquire and release, docs/pager.md); otherwise whole. */
int  jlm_stream_block(jlm_engine *e, uint32_t l, const jlm_prog *p, uint32_t n, const uint8_t **page, jlm_err *err);
/* Before op k of block l's program when e->by_op == l + 1: the op's
 * weights are read (what is missing of them), the bytes of the page before
 * them released, and the next op's weights read ahead. */
int  jlm_stream_op(jlm_engine *e, const jlm_prog *p, uint32_t l, uint32_t k, jlm_err *err);
void jlm_stream_block_done(jlm_engine *e, uint32_t l);
/* Pins experts sel[0..n) of the bank whose expert 0 is page `first`, on the
 * host and on the block's device; all or none (an error releases them). */
int  jlm_stream_experts(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n, const void **frames,
                        jlm_err *err);
/* The same in two steps (a token's resident experts compute between them):
 * begin pins the resident ones (ready[s] = 1) and starts reading the others;
 * end pins the rest (every ready[s] = 1) and, on a device, all of them
 * there: call it unless begin failed or (on the CPU) every one was ready.
 * Between them only the experts marked ready may be used; after an error of
 * either nothing is pinned. */
int  jlm_stream_experts_begin(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n, const void **frames,
                              uint8_t *ready, jlm_err *err);
int  jlm_stream_experts_end(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n, const void **frames,
                            uint8_t *ready, jlm_err *err);
void jlm_stream_experts_done(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n);
/* The expert page the caller will acquire next: read ahead on the pager's
 * thread when it fits the budget beside everything resident. */
void jlm_stream_expert_next(jlm_engine *e, uint32_t page);
/* The next MoE block's experts predicted (sel, n_expert_used of them, in
 * the bank whose expert 0 is page `first`): read ahead now; counted when
 * that bank's experts are next acquired (jlm_engine_predict_stats). */
void jlm_stream_predict(jlm_engine *e, uint32_t first, const int32_t *sel);
/* Block l's routing of n rows (their router logits, bias added, n_expert
 * each; mode JLM_ROUTE_*; sel: the experts chosen, n_expert_used a row):
 * the background read's ranks of its experts. */
void jlm_stream_routed(jlm_engine *e, uint32_t l, int mode, const float *lg, const int32_t *sel, uint32_t n);
/* Whether to predict now: always while the read-ahead gate is open; while it
 * is shut, one call in PRED_SAMPLE (the router's matmul and the counts that
 * may open the gate again, without a dispatch per block every token). */
int  jlm_stream_predict_now(jlm_engine *e);
/* After the layers: the output matrix's device, and (failed: rc) any device
 * prefetch let go. */
void jlm_stream_finish(jlm_engine *e, int rc);
/* A whole page of another array on the host (the vision tower's blocks,
 * engine/vision.c): acquire, release. */
int  jlm_stream_page(jlm_engine *e, uint32_t array, uint32_t page, const uint8_t **host, jlm_err *err);
void jlm_stream_page_done(jlm_engine *e, uint32_t array, uint32_t page);

/* exec_mla.c: multi-head latent attention (deepseek2) */
void jlm_ex_mla_kv(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b);
void jlm_ex_mla_q(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b);
void jlm_ex_mla_attn(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b);
/* Their parts a device backend shares (exec_vk_mla.c, exec_cu_mla.c): sheet
 * s (a head) of block b's 3-D tensor of role, and its sheets 0, 1 (0 with one
 * head) and n_head - 1 (a batch's stride and span); layer l's RoPE (YaRN's magnitude moved into
 * the score scale); the score scale. */
jlm_k_mat jlm_ex_mla_sheet(const jlm_engine *e, const jlm_ex_blk *b, uint16_t role, uint32_t s);
void      jlm_ex_mla_sheet_ends(const jlm_engine *e, const jlm_ex_blk *b, uint16_t role, jlm_k_mat m[3]);
void jlm_ex_mla_rope(const jlm_engine *e, uint32_t l, jlm_k_rope *rp);
float jlm_ex_mla_scale(const jlm_engine *e);

#endif
