/* model_int.h - the engine's state, shared by model.c (the layer loop), the
 * executor (exec*.c, exec_int.h), the streamer (stream.c)
 * and model_open.c (open, budget, backend, close, queries). Internal to
 * engine/: nothing outside includes it. */
#ifndef JLM_ENGINE_MODEL_INT_H
#define JLM_ENGINE_MODEL_INT_H

#include "engine/model.h"

#include <stdlib.h>

#include "engine/backend.h"
#include "engine/pool.h"
#include "engine/prog.h"
#include "kernels/cpu/kernels.h"

#define ROLE_SLOTS 64   /* text roles are < 64 */
/* Sequences evaluated together by jlm_engine_eval_batch (one token each). */
#define BATCH 16
/* Prefill: tokens of one sequence evaluated together (e->nb of them; env
 * JLM_BATCH sets it, in [BATCH, PREFILL_MAX]): each block page is pinned once
 * per batch and each weight matrix goes through the GEMM (kernels.h) once for
 * the whole batch, so its bytes come from DRAM once per nb tokens. The scratch
 * grows with nb (about nb * (4 n_embd + q_dim + 2 kv_dim + n_head*hd_v + 2 ffn)
 * floats: 12 MiB at 128 for Llama-3.2-1B shapes). */
#define PREFILL_DEFAULT 128
#define PREFILL_MAX 512
#define NO_PF UINT32_MAX
#define WARM_DONE 1   /* warm_done's flags: read, resident or passed over */
#define WARM_SEL 2    /* a row routed to it */
#define ROW_BUFS 20   /* buffers of the batch scratch reserved by the row (scratch.c) */

/* ================================================================ engine state */
struct jlm_engine {
    jlm_model       *m;
    const jlm_config *c;
    jlm_source      *src;
    jlm_pager       *pager;
    jlm_pool        *pool;
    const jlm_k_cpu *k;
    /* --backend vulkan|cuda, or two in block order (cuda,vulkan): matmuls
     * offloaded; device i runs blocks [dev_end[i-1], dev_end[i]) (from 0),
     * the CPU the blocks after the last device's */
    jlm_dev         *devs[JLM_ENGINE_DEVS];
    uint32_t         dev_end[JLM_ENGINE_DEVS];
    int              n_dev;
    jlm_dev         *out_dev;     /* the output matrix's: the last device when its count is 'all', else NULL */
    jlm_dev         *dev_here;    /* the device of the block being run (block_dev), NULL: the CPU */
    int              dev_pf;      /* the host budget lets a prefetch hold the next block pinned */
    uint32_t         pf_block;    /* the block whose device prefetch holds an extra host pin; NO_PF: none */
    uint32_t         by_op;       /* 1 + the block the streamer advances through op by op; 0: none */
    int              by_op_on;    /* blocks on the CPU under a budget smaller than the pages go op by op */
    jlm_dev         *pf_dev;      /* the device that prefetch runs on */
    uint64_t         budget;      /* page frames' budget in force; 0: unlimited */
    uint64_t         budget_all;  /* frames + KV + scratch + dense asked for; 0: unlimited */
    uint64_t         mem_kv, mem_scratch;
    uint64_t         scratch_heap;   /* scratch's malloc'ed part (mem_scratch = it + the rows backed) */
    char             budget_src[320];   /* how budget_all was chosen, for --stats */
    uint8_t         *dense;       /* (DenseLen,) the dense region, resident */
    jlm_prog         prog_dense, prog_moe;   /* the family's block programs (engine/arch/) */
    const jlm_tensor **roles;     /* ((n_layer+1) * ROLE_SLOTS,) slot (block+1)*64 + role */
    uint32_t         n_ctx, n_past;
    uint32_t         bidir_end;   /* > 0: queries below it also see keys up to it (an image, eval_embd) */
    uint32_t         hd, hd_v, kv_dim, kv_dim_v, q_dim;
    uint32_t         nb;          /* rows of the batch scratch: prefill batch size (>= BATCH) */
    /* KV cache: keys and values each F32, F16 or Q8_0 (kt, vt: KV_*),
     * head-major, kv_ctx (n_ctx in whole key tiles) positions a head, so one
     * head's keys are one run that attention streams (as rows of kv_dim, a
     * head's keys sat kv_dim apart: at a power-of-two row, 2 KiB for
     * Llama-3.2-1B, they fell in a few L1 sets). F32/F16 keys in tiles of
     * JLM_K_FATTN_BK positions, dimension-major: the layout jlm_k_fattn
     * computes scores in (k_tiled), so decode reads them as they are instead
     * of transposing every tile every token (docs/kernels.md, Decode
     * attention); Q8_0 keys and all values are rows (a position's head_dim
     * values, Q8_0 in blocks of 32 along it, as ggml's). Latent attention
     * (deepseek2): kc holds a row of kv_dim values per (layer, position),
     * kt's type (F32 or F16), vc nothing. kv_heads runs of kv_ctx rows of
     * krow (vrow) bytes each. The memory is reserved for the whole context
     * (kvcache.c) and backed as positions are reached: kv_have positions of
     * every run, in chunks of KV_CHUNK, counted in mem_kv and so taken from
     * the page frames' budget. */
    int    kt, vt;
    int    kv_direct;   /* kt == vt, not Q8_0: jlm_k_fattn reads the cache
                         * itself; else attention widens its range into kv32 */
    int    qk_unit;   /* Llama 4: weightless q/k RMS norms after RoPE, on the RoPE layers */
    uint64_t krow, vrow, kv_heads;
    uint32_t kv_ctx;  /* n_ctx rounded up to whole key tiles */
    uint32_t kv_have; /* positions of the engine's own cache backed and counted */
    void  *kc;        /* (n_layer, n_kv_head, kv_ctx / BK, hd, BK) tiles, or (.., kv_ctx, krow) rows */
    void  *vc;        /* (n_layer, n_kv_head, kv_ctx, vrow) */
    float *kv32;      /* (n_threads, kv_ctx, hd + hd_v) one KV head as F32, a slab per thread (jlm_kv_slab):
                       * attn_token's rows, or !kv_direct's key tiles and value rows */
    /* scratch for a batch of up to nb tokens, row t of each at t * width;
     * each reserved for nb rows and backed as batches reach them
     * (scratch.c): rows_have rows of every one counted in mem_scratch */
    struct { void *p; uint64_t row; } rowbuf[ROW_BUFS];
    int      n_rowbuf;
    uint32_t rows_have;
    float *x;         /* (nb, n_embd) residual stream */
    float *h;         /* (nb, n_embd) normed input */
    float *q;         /* (nb, q_dim) */
    float *kk, *vv;   /* (nb, kv_dim), (nb, kv_dim_v) */
    float *att;       /* (nb, n_head * hd_v) */
    float *o;         /* (nb, n_embd) */
    float *g, *u;     /* (nb, max ffn) */
    float *moe;       /* (n_embd,) expert mixture of one token */
    float *scores;    /* (n_threads, n_ctx) attention scores, a row per pool thread */
    float *mask;      /* (n_ctx,) */
    float *fa;        /* (n_threads, fa_floats) jlm_k_fattn scratch, a slab per pool thread */
    float *mla;       /* latent attention scratch (exec_mla.c; 1 float when none) */
    size_t fa_floats;
    int    attn_token;   /* JLM_ATTN=token: the per-token attention (attend) instead of jlm_k_fattn */
    int    moe_rows;     /* JLM_MOE=rows: a batch's experts row by row (moe_token), not grouped (moe_batch) */
    float *router;    /* (n_expert,) */
    int32_t *route;   /* (n_layer, n_expert_used) routing of the last token */
    FILE    *rtrace;  /* --trace-routing: each routing's line (jlm_engine_trace_routing), NULL: none */
    float   *route_w; /* (n_expert_used,) */
    /* moe_batch (a prefill batch grouped by expert; MoE models only, else
     * one element each): each row's routing, the rows grouped by expert,
     * the gathered inputs of a group of experts and every (row, slot)'s output */
    int32_t  *msel;   /* (nb, n_expert_used) experts of each row */
    float    *mw;     /* (nb, n_expert_used) their weights */
    uint32_t *mord;   /* (nb * n_expert_used,) (row * n_expert_used + slot), grouped by expert */
    uint32_t *mpos;   /* (nb * n_expert_used,) each (row, slot)'s position in mord */
    uint32_t *mcnt;   /* (n_expert + 1,) group starts in mord */
    float    *mh;     /* (nb, n_embd) a group's input rows */
    float    *mo;     /* (nb * n_expert_used, n_embd) output of each (row, slot), in mord's order */
    float    *mrl;    /* (nb, n_expert) router logits of each row */
    void    *xq_buf;  /* nb quantized activation rows */
    jlm_act_q8 *xq;   /* (nb,) */
    const float *xq_of;   /* the rows xq holds (matmul_x_run's shared), NULL: none */
    /* the batch being run: token t writes and reads the cache at bkc[t]/bvc[t]
     * (the engine's own, or a jlm_engine_seq's) at position bpos[t] */
    void    **bkc, **bvc; /* (nb,) */
    uint32_t *bpos;       /* (nb,) */
    /* the QKV op computed the queries too (fused with K and V): the Q op of
     * the same rows (x) of layer q_ready_l skips its norm and matmul; cleared
     * by every Q op */
    const float *q_ready_x;
    uint32_t     q_ready_l;
    /* ... or its queries, keys and attention (decode on several threads:
     * attn_qkv_heads): Q, Q_ROPE and ATTENTION are skipped */
    const float *att_ready_x;
    uint32_t     att_ready_l;
    /* expert reads (stream.c): the block prefetch and the routed experts
     * read at once by the pager's readers (rd_depth pages); the next
     * block's experts predicted from this block's input (predict: pred_ is
     * (n_layer, rbytes) copies of the routers, float ones, taken as blocks
     * run; pred_ok (n_layer,) which are taken); the last prediction not yet
     * met by its block (pred_first: its bank, NO_PF none; pred_sel, and
     * pred_read: 1 a read was started for it, 2 one would have been but the
     * gate was shut, 0 neither); warm: the pages not yet resident read in
     * file order (the experts in warm_order's, when set) in the background
     * (warm_at: the next page, over the text pages then the experts): all
     * of them when the budget holds every page, else (warm_part) while the
     * frames have room */
    uint32_t         rd_depth;
    int              rd_par;      /* a block's experts read at once: depth > 1, budget 0 or >= 2 blocks + 2 x routed */
    int              predict, warm;
    int              warm_part;
    uint64_t         rbytes;
    uint8_t         *pred_buf;    /* routers, pred_ok, pred_sel, pred_read */
    uint8_t         *pred_ok, *pred_read;
    int32_t         *pred_sel;
    uint32_t         pred_first;
    double           pred_cand, pred_paid;   /* the read-ahead's gate: decaying counts of candidates, and of those routed */
    uint32_t         pred_tick;   /* jlm_stream_predict_now's calls while the gate is shut */
    uint64_t         warm_at;
    uint32_t        *warm_order;  /* (n_warm_order,) expert pages in the background read's order; NULL: file order */
    uint32_t         n_warm_order;
    /* below a budget that holds the model, the background read's experts
     * by rank (warm_rank, stream.c): warm_score (n_layer, n_expert + 2)
     * each block's routing probabilities summed, then its rows routed, then
     * its experts done; warm_done (expert pages,) WARM_DONE read, resident
     * or passed over, WARM_SEL a row routed to it; warm_quota the frames'
     * expert pages over the MoE blocks; warm_xpage the mean expert page in
     * bytes; warm_nsel the pages routed to, warm_nrouted the MoE blocks that
     * routed, of warm_nmoe; warm_blk the block whose turn it is; warm_l the
     * block acquired last, warm_pass the layers went round once */
    int              warm_rank, warm_pass;
    float            warm_quota;
    double           warm_xpage;
    uint32_t         warm_nsel, warm_nrouted, warm_nmoe;
    float           *warm_score;
    uint8_t         *warm_done;
    uint32_t         warm_blk, warm_l;
    jlm_engine_predict pst;
    /* profiling (model.h): prof on; prof_in: a class is being timed (nested
     * ones are not); pr the sums; pr_page0 the pager's read time at reset */
    int              prof, prof_in;
    jlm_engine_prof  pr;
    unsigned long long pr_page0;
};

/* A KV cache of its own, for serving several sequences on one engine. */
struct jlm_engine_seq {
    jlm_engine *e;
    void    *kc, *vc;   /* laid out as jlm_engine's kc, vc */
    uint32_t n_past, have;   /* have: as kv_have (not counted in the budget) */
};

/* The tensor of (block, role); block -1: the dense ones. NULL: none. */
static inline const jlm_tensor *W(const jlm_engine *e, int32_t block, uint16_t role)
{
    return role < ROLE_SLOTS ? e->roles[(size_t)(block + 1) * ROLE_SLOTS + role] : NULL;
}

/* The expert page of expert 0 of the bank whose gate is tg (a tensor of
 * the expert region): its offset there over the page size. */
static inline uint32_t bank_first(const jlm_engine *e, const jlm_tensor *tg)
{
    return (uint32_t)((tg->qs_off - e->m->hdr.exp_data_off) / e->m->hdr.exp_page_size);
}

static inline void *zalloc(size_t n) { return calloc(1, n ? n : 1); }

/* At open, after the budget (stream.c): the pages read at once, and whether
 * the whole model is read in the background (the cold start). */
void jlm_stream_open(jlm_engine *e, const jlm_engine_opts *o);

/* ---------------------------------------------------------------- the KV cache (kvcache.c) */
enum { KV_F32, KV_F16, KV_Q8_0, KV_N };
#define KV_Q8_BLOCK 32   /* values of a Q8_0 block */
#define KV_Q8_BYTES 34   /* its bytes: F16 scale + 32 int8 */
#define KV_CHUNK JLM_K_FATTN_BK   /* positions the cache grows by: one key tile */
const char *jlm_kv_type_name(int type);
/* "f32", "f16", "q8_0" -> KV_*; JLM_EINVAL naming opt otherwise. */
int      jlm_kv_type_parse(const char *opt, const char *s, int *out, jlm_err *err);
uint64_t jlm_kv_row_bytes(int type, uint32_t dim);   /* dim a multiple of 32 for Q8_0 */
void     jlm_kv_put_row(int type, uint8_t *dst, const float *x, uint32_t n);
void     jlm_kv_get_row(int type, const uint8_t *src, float *x, uint32_t n);
/* The run of KV head g of layer l in cache c: keys (val 0) or values. */
uint8_t *jlm_kv_head(const jlm_engine *e, void *c, int val, uint32_t l, uint32_t g);
void     jlm_kv_put_key(const jlm_engine *e, uint8_t *kh, uint32_t pos, const float *k);
void     jlm_kv_get_key(const jlm_engine *e, const uint8_t *kh, uint32_t pos, float *k);
/* Thread tid's slab; positions [j0, j1) of a head (kh, vh) into it as F32:
 * keys in tiles (whole ones, zero past j1), values in rows of hd_v, each at
 * its position (the slab is laid out as one head's F32 cache). */
float   *jlm_kv_slab(const jlm_engine *e, int tid);
void     jlm_kv_widen(const jlm_engine *e, const uint8_t *kh, const uint8_t *vh, uint32_t j0, uint32_t j1, float *slab);
/* Positions [p0, p0 + n) of layer l between a host cache (kc, vc: the
 * layout above) and rows as the device backends keep them (a position's
 * kv_dim keys, then kv_dim_v values in krows / vrows: its heads one after
 * another, each head's bytes as the host stores them); to_host: the rows
 * into the cache. Not for latent attention (jlm_engine_kv_bytes 0). */
void     jlm_kv_rows(const jlm_engine *e, uint8_t *kc, uint8_t *vc, uint32_t l, uint32_t p0, uint32_t n,
                     uint8_t *krows, uint8_t *vrows, int to_host);
/* Address space for a whole cache (MAP_NORESERVE: no memory until written). */
int      jlm_kv_reserve(const jlm_engine *e, void **kc, void **vc, jlm_err *err);
void     jlm_kv_release(const jlm_engine *e, void *kc, void *vc);   /* accepts NULLs */
uint64_t jlm_kv_bytes_at(const jlm_engine *e, uint32_t have);   /* the rows' bytes */
uint64_t jlm_kv_mem_at(const jlm_engine *e, uint32_t have);     /* the pages they touch: what mem_kv counts */
/* *have = need rounded up to KV_CHUNK (at most kv_ctx): positions given
 * back to the kernel when it shrinks; counted (the engine's own cache):
 * mem_kv follows and the page frames' budget is fitted to what is left
 * (jlm_eng_fit_frames). Error: the pager's; *have unchanged then. */
int      jlm_kv_fit(jlm_engine *e, void *kc, void *vc, uint32_t *have, uint32_t need, int counted, jlm_err *err);
/* ---------------------------------------------------------------- the batch scratch's rows (scratch.c) */
/* n bytes of address space (MAP_NORESERVE, MADV_NOHUGEPAGE: memory a page
 * at a time as it is written, as the KV and scratch counts assume); NULL:
 * none. Released with munmap. */
void    *jlm_mem_reserve(uint64_t n);
/* Address space for nb rows of row bytes (jlm_mem_reserve), recorded for the
 * count and jlm_rows_release; NULL: none left (or ROW_BUFS taken). */
void    *jlm_rows_reserve(jlm_engine *e, uint64_t row);
void     jlm_rows_release(jlm_engine *e);
uint64_t jlm_rows_bytes(const jlm_engine *e);   /* the pages rows_have rows of each buffer take */
/* Rows [0, need) (clamped to [1, nb]) of every row buffer backed and
 * counted in mem_scratch, the frames fitted to what is left; under a
 * budget a smaller need gives the rows past it (and past BATCH: serve's
 * batched steps keep theirs) back to the kernel (they read as zeros
 * again) and their bytes to the frames. Error: the pager's;
 * rows_have unchanged then. Called before a batch's rows are written. */
int      jlm_rows_fit(jlm_engine *e, uint32_t need, jlm_err *err);
/* budget = budget_all - dense - mem_kv - scratch, at least the minimum
 * working set, into the pager (model_open.c). */
int      jlm_eng_fit_frames(jlm_engine *e, jlm_err *err);

/* Lets go of a device prefetch in flight (stream.c, "device prefetch"). */
void jlm_eng_prefetch_end(jlm_engine *e);

#endif
