/* model_open.c - opening an engine: the container's checks, the tensor index,
 * the block programs, the dense region, the budget (frames, KV, scratch),
 * the backend split, the buffers; closing it; and the queries on an open
 * engine. The forward pass is model.c (the loop), exec*.c (the executor)
 * and stream.c (paging). See model.h for the contract. */
#include "engine/model_int.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "engine/backend_cu.h"
#include "engine/backend_vk.h"
#include "engine/memlimit.h"
#include "engine/xpolicy.h"
#include "format/sums.h"

/* ================================================================ open / close */
/* An engine path switch read at open: name unset, empty or dflt gives 0,
 * alt gives 1; any other value is refused, naming it and both choices. */
static int env_path(const char *name, const char *what, const char *dflt, const char *alt, int *on, jlm_err *err)
{
    const char *v = getenv(name);
    if (v && *v && strcmp(v, dflt) && strcmp(v, alt))
        return jlm_errf(err, JLM_EINVAL, "%s=%s: not %s (%s, %s)", name, v, what, dflt, alt);
    *on = v && !strcmp(v, alt);
    return JLM_OK;
}

/* The read ahead's buffer (engine/model_int.h): the routers' copies when
 * e->predict (float routers of one size, 64 MiB at most in all; otherwise
 * no prediction), the chosen experts of the last prediction. 0: no memory. */
#define PRED_MAX ((uint64_t)64 << 20)
static int pred_alloc(jlm_engine *e)
{
    const jlm_config *c = e->c;
    uint32_t nu = c->n_expert_used;
    e->rbytes = 0;
    for (uint32_t l = 0; e->predict && l < c->n_layer; l++) {
        const jlm_tensor *t = W(e, (int32_t)l, JLM_R_ROUTER);
        const jlm_type_traits *tr = t ? jlm_fmt_type_traits(t->type) : NULL;
        uint64_t b = tr && tr->is_float ? jlm_tensor_rows(t) * jlm_tensor_k(t) * tr->elem_bytes : 0;
        if (t && (!b || (e->rbytes && b != e->rbytes)))
            e->predict = 0;   /* a quantized router, or two sizes */
        else if (t)
            e->rbytes = b;
    }
    if (!e->rbytes || e->rbytes * c->n_layer > PRED_MAX)
        e->predict = 0;
    uint64_t rb = e->predict ? e->rbytes * c->n_layer : 0;
    uint64_t sel = (rb + c->n_layer + 3) & ~(uint64_t)3, warm = (sel + (uint64_t)nu * 5 + 3) & ~(uint64_t)3;
    uint64_t ws = c->n_expert ? (uint64_t)c->n_layer * (c->n_expert + 2) : 0;   /* warm_score, then warm_done */
    e->pred_buf = zalloc(warm + ws * sizeof(float) + (uint64_t)c->n_layer * c->n_expert);
    if (!e->pred_buf)
        return 0;
    e->pred_ok = e->pred_buf + rb;
    e->pred_sel = (int32_t *)(e->pred_buf + sel);
    e->pred_read = (uint8_t *)(e->pred_sel + nu);
    e->warm_score = ws ? (float *)(e->pred_buf + warm) : NULL;
    e->warm_done = ws ? e->pred_buf + warm + ws * sizeof(float) : NULL;
    return 1;
}

static int alloc_buffers(jlm_engine *e, jlm_err *err)
{
    const jlm_config *c = e->c;
    uint64_t ffn = c->n_ffn > c->n_ffn_exp ? c->n_ffn : c->n_ffn_exp;
    if (ffn < c->n_ffn_shexp) ffn = c->n_ffn_shexp;
    if (ffn < c->n_embd) ffn = c->n_embd;
    uint64_t att = (uint64_t)c->n_head * e->hd_v;
    uint64_t kmax = ffn > att ? ffn : att;
    if (kmax < e->q_dim) kmax = e->q_dim;
    if (kmax < c->kv_lora_rank) kmax = c->kv_lora_rank;   /* latent attention's inputs */
    if (kmax < c->q_lora_rank) kmax = c->q_lora_rank;
    kmax = (kmax + 255) / 256 * 256;
    uint32_t nb = PREFILL_DEFAULT;
    const char *env = getenv("JLM_BATCH");
    if (env && *env) {
        char *end;
        unsigned long v = strtoul(env, &end, 10);
        if (*end || v < BATCH || v > PREFILL_MAX)
            return jlm_errf(err, JLM_EINVAL, "JLM_BATCH=%s: not a prefill batch size in [%d, %d]", env, BATCH,
                            PREFILL_MAX);
        nb = (uint32_t)v;
    }
    e->nb = nb;
    int rc = jlm_kv_reserve(e, &e->kc, &e->vc, err);
    if (rc)
        return rc;
    uint64_t F = sizeof(float), E = (uint64_t)c->n_embd * F;
    e->x = jlm_rows_reserve(e, E);
    e->h = jlm_rows_reserve(e, E);
    e->q = jlm_rows_reserve(e, e->q_dim * F);
    e->kk = jlm_rows_reserve(e, e->kv_dim * F);
    e->vv = jlm_rows_reserve(e, e->kv_dim_v * F);
    e->att = jlm_rows_reserve(e, att * F);
    e->o = jlm_rows_reserve(e, E);
    e->g = jlm_rows_reserve(e, ffn * F);
    e->u = jlm_rows_reserve(e, ffn * F);
    e->moe = zalloc(c->n_embd * sizeof(float));
    e->scores = zalloc((size_t)jlm_pool_n_threads(e->pool) * e->n_ctx * sizeof(float));   /* a row per thread */
    e->mask = zalloc(e->n_ctx * sizeof(float));
    e->fa_floats = jlm_k_fattn_scratch_floats(e->hd, e->hd_v, c->n_head / c->n_kv_head);
    e->fa = zalloc((size_t)jlm_pool_n_threads(e->pool) * e->fa_floats * sizeof(float));
    if (c->kv_lora_rank) {   /* q-LoRA rows, a head's gathered rows, its matmul out, q and o latents, scores */
        uint64_t R = c->kv_lora_rank, W = R + c->n_rot, a = c->q_lora_rank > e->hd ? c->q_lora_rank : e->hd;
        if (a < R) a = R;
        e->mla = zalloc((size_t)(nb * (a + a + 2 * (uint64_t)c->n_head * W) + e->kv_ctx + W) * sizeof(float));
    } else {
        e->mla = zalloc(sizeof(float));
    }
    if (env_path("JLM_ATTN", "an attention path", "batched", "token", &e->attn_token, err) ||
        env_path("JLM_MOE", "a MoE path", "grouped", "rows", &e->moe_rows, err))
        return JLM_EINVAL;
    if (e->attn_token || !e->kv_direct)   /* one KV head as F32 (jlm_kv_slab); else jlm_k_fattn reads the cache */
        e->kv32 = zalloc((size_t)jlm_pool_n_threads(e->pool) * e->kv_ctx * (e->hd + e->hd_v) * sizeof(float));
    e->router = zalloc((c->n_expert + 1) * sizeof(float));
    e->route = zalloc(((size_t)c->n_layer * c->n_expert_used + 1) * sizeof(int32_t));
    e->route_w = zalloc((c->n_expert_used + 1) * sizeof(float));
    uint64_t U = c->n_expert ? c->n_expert_used : 0;   /* moe_batch's rows: none without experts */
    e->msel = jlm_rows_reserve(e, U * sizeof(int32_t));
    e->mw = jlm_rows_reserve(e, U * F);
    e->mord = jlm_rows_reserve(e, U * sizeof(uint32_t));
    e->mpos = jlm_rows_reserve(e, U * sizeof(uint32_t));
    e->mcnt = zalloc((c->n_expert + 1) * sizeof(uint32_t));
    e->mh = jlm_rows_reserve(e, U ? E : 0);
    e->mo = jlm_rows_reserve(e, U * E);
    e->mrl = jlm_rows_reserve(e, U ? (c->n_expert + 1) * F : 0);
    if (!pred_alloc(e))
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory for the routers' copies", e->m->path);
    size_t qb = jlm_k_act_q8_bytes(kmax);
    e->xq_buf = jlm_rows_reserve(e, qb);
    e->xq = zalloc(nb * sizeof *e->xq);
    e->bkc = zalloc(nb * sizeof *e->bkc);
    e->bvc = zalloc(nb * sizeof *e->bvc);
    e->bpos = zalloc(nb * sizeof *e->bpos);
    if (!e->xq || !e->bkc || !e->bvc || !e->bpos || !e->kc || !e->vc || !e->x || !e->h || !e->q || !e->kk ||
        !e->vv || !e->att || !e->o || !e->g || !e->u || !e->moe || !e->scores || !e->mask || !e->fa || !e->mla || !e->router ||
        !e->route || !e->route_w || !e->xq_buf || ((e->attn_token || !e->kv_direct) && !e->kv32) || !e->msel || !e->mw ||
        !e->mord || !e->mpos || !e->mcnt || !e->mh || !e->mo || !e->mrl)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory for the KV cache (%u positions) and buffers",
                        e->m->path, e->n_ctx);
    for (uint32_t t = 0; t < nb; t++) {
        rc = jlm_k_act_q8_init(&e->xq[t], (uint8_t *)e->xq_buf + t * qb, kmax, err);
        if (rc)
            return rc;
    }
    return JLM_OK;
}

/* Every buffer the engine owns, into bufs (ENGINE_BUFS slots): the dense
 * region first, then the KV cache (2), then scratch; the one list both
 * jlm_engine_close and the budget's tally read. */
#define ENGINE_BUFS 19
static void engine_bufs(const jlm_engine *e, void **bufs)
{
    void *b[ENGINE_BUFS] = {e->dense, e->kc, e->vc, e->roles, e->moe, e->scores, e->mask, e->router, e->route,
                            e->route_w, e->kv32, e->xq, e->bkc, e->bvc, e->bpos, e->fa, e->mcnt, e->mla, e->pred_buf};
    memcpy(bufs, b, sizeof b);
}

/* Bytes of the KV cache (the positions backed so far, kvcache.c) and of
 * scratch, as allocated (malloc_usable_size: the allocator's rounding
 * counts, as it does in the process's RSS). */
static void tally_buffers(jlm_engine *e)
{
    void *b[ENGINE_BUFS];
    engine_bufs(e, b);
    e->mem_kv = jlm_kv_mem_at(e, e->kv_have);
    e->scratch_heap = 0;
    for (int i = 3; i < ENGINE_BUFS; i++)
        e->scratch_heap += malloc_usable_size(b[i]);
    e->mem_scratch = e->scratch_heap + jlm_rows_bytes(e);
}

static int supported(uint16_t arch)
{
    switch (arch) {
    case JLM_ARCH_LLAMA: case JLM_ARCH_QWEN2: case JLM_ARCH_QWEN3: case JLM_ARCH_QWEN3MOE:
    case JLM_ARCH_OLMOE: case JLM_ARCH_GEMMA3: case JLM_ARCH_PHI3: case JLM_ARCH_GPTOSS:
    case JLM_ARCH_DEEPSEEK2:
        return 1;
    default:
        return 0;
    }
}

/* Index tensors by (block, role) and check the graph has what it needs. */
static int index_tensors(jlm_engine *e, jlm_err *err)
{
    const jlm_model *m = e->m;
    e->roles = calloc((size_t)(e->c->n_layer + 1) * ROLE_SLOTS, sizeof *e->roles);
    if (!e->roles)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", m->path);
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        if (t->role < ROLE_SLOTS && t->block < (int32_t)e->c->n_layer)
            e->roles[(size_t)(t->block + 1) * ROLE_SLOTS + t->role] = t;
    }
    if (!W(e, -1, JLM_R_TOKEN_EMBD) || !W(e, -1, JLM_R_OUTPUT_NORM))
        return jlm_errf(err, JLM_EFORMAT, "%s: no token_embd or output_norm tensor", m->path);
    for (uint32_t l = 0; l < e->c->n_layer; l++) {
        int moe = W(e, l, JLM_R_EXP_GATE) != NULL;
        int mla = e->c->kv_lora_rank != 0, qa = mla && e->c->q_lora_rank;
        uint16_t need[] = {JLM_R_ATTN_NORM, qa ? JLM_R_ATTN_Q_A : JLM_R_ATTN_Q, mla ? JLM_R_ATTN_KV_A_MQA : JLM_R_ATTN_K,
                           mla ? JLM_R_ATTN_K_B_MAT : JLM_R_ATTN_V, JLM_R_ATTN_OUT,
                           moe ? JLM_R_ROUTER : JLM_R_FFN_GATE, moe ? JLM_R_EXP_UP : JLM_R_FFN_UP,
                           moe ? JLM_R_EXP_DOWN : JLM_R_FFN_DOWN, mla ? JLM_R_ATTN_V_B_MAT : JLM_R_ATTN_OUT,
                           mla ? JLM_R_ATTN_KV_A_NORM : JLM_R_ATTN_OUT, qa ? JLM_R_ATTN_Q_A_NORM : JLM_R_ATTN_OUT,
                           qa ? JLM_R_ATTN_Q_B_MAT : JLM_R_ATTN_OUT};
        for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
            if (!W(e, l, need[i]))
                return jlm_errf(err, JLM_EFORMAT, "%s: block %u has no %s tensor", m->path, l, jlm_fmt_role_name(need[i]));
        /* every tensor the graph reads through a page must be in that page */
        const jlm_tensor *t = W(e, l, need[1]);
        jlm_tensor_loc loc;
        jlm_fmt_tensor_loc(m, t, &loc);
        if (loc.region != JLM_REG_TEXT)
            return jlm_errf(err, JLM_EFORMAT, "%s: block %u's %s is not in its text page", m->path, l,
                            jlm_fmt_role_name(need[1]));
    }
    /* the family's block programs (engine/arch/): dense and MoE blocks */
    int rc = jlm_arch_program_for(e->c, 0, &e->prog_dense, err);
    if (!rc)
        rc = jlm_arch_program_for(e->c, 1, &e->prog_moe, err);
    if (rc)
        return jlm_err_prefix(err, rc, "%s", m->path);
    /* every matrix a block's program reads must be in that block (the shared
     * expert of a MoE block, the FFN of a dense one) */
    for (uint32_t l = 0; l < e->c->n_layer; l++) {
        const jlm_prog *p = W(e, l, JLM_R_EXP_GATE) ? &e->prog_moe : &e->prog_dense;
        for (uint32_t i = 0; i < p->n; i++) {
            const jlm_op *op = &p->op[i];
            int nm = op->kind == JLM_OP_GATE_UP ? 2 : op->kind == JLM_OP_MATMUL ? 1 : 0;
            for (int j = 0; j < nm; j++)
                if (!W(e, l, op->w[j]))
                    return jlm_errf(err, JLM_EFORMAT, "%s: block %u has no %s tensor (%s)", m->path, l,
                                    jlm_fmt_role_name(op->w[j]), p->family);
        }
    }
    /* the q/k norms' extent is the file's (format/sanity.c sized them by
     * its QKNormWide flag): a program that disagrees would read past them */
    const jlm_op *kv = NULL;
    for (uint32_t i = 0; i < e->prog_dense.n && !kv; i++)
        if (e->prog_dense.op[i].kind == JLM_OP_KV_STORE)
            kv = &e->prog_dense.op[i];
    int wide = kv && (kv->flags & JLM_OPF_QK_WIDE);
    if (wide != !!(e->c->flags & JLM_F_QK_NORM_WIDE))
        return jlm_errf(err, JLM_EFORMAT, "%s: flag QKNormWide %s, but %s's q/k norms are %s", m->path,
                        wide ? "missing" : "set", e->prog_dense.family, wide ? "over the whole projection" : "per head");
    return JLM_OK;
}

static int read_dense(jlm_engine *e, jlm_err *err)
{
    const jlm_header *h = &e->m->hdr;
    if (posix_memalign((void **)&e->dense, 4096, h->dense_len ? (h->dense_len + 4095) & ~4095ull : 4096))
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory for the dense region (%llu bytes)", e->m->path,
                        (unsigned long long)h->dense_len);
    if (!h->dense_len)
        return JLM_OK;
    /* read whole and kept whole: huge pages cost no memory here and save TLB
     * misses on the output matrix, read every token (frames: pager.c) */
    madvise(e->dense, (h->dense_len + 4095) & ~4095ull, MADV_HUGEPAGE);
    int rc = e->src->read(e->src, h->dense_off, h->dense_len, e->dense, err);
    return rc ? jlm_err_prefix(err, rc, "dense region") : JLM_OK;
}

/* The whole budget the options ask for (budget_all): --budget as given, or
 * for JLM_BUDGET_AUTO the cgroup limit / MemAvailable less the headroom
 * (engine/memlimit.h); unreadable limits: a note and no budget. */
static void choose_budget(jlm_engine *e, const jlm_engine_opts *o)
{
    e->budget_all = o->budget;
    if (o->budget != JLM_BUDGET_AUTO) {
        snprintf(e->budget_src, sizeof e->budget_src, "%s", o->budget ? "--budget" : "none (unlimited)");
        return;
    }
    e->budget_all = 0;
    jlm_memlimit ml;
    jlm_err merr = {0};
    if (jlm_memlimit_read(getenv("JLM_MEM_ROOT"), &ml, &merr)) {
        if (!o->quiet)
            fprintf(stderr, "note: automatic budget: %s; running without a budget\n", merr.msg);
        snprintf(e->budget_src, sizeof e->budget_src, "none (automatic: %.250s)", merr.msg);
        return;
    }
    uint64_t head = 0;
    e->budget_all = jlm_memlimit_budget(&ml, &head);
    if (!e->budget_all)
        snprintf(e->budget_src, sizeof e->budget_src, "none (automatic: no cgroup limit, no MemAvailable)");
    else if (ml.cg_limit && (!ml.mem_available || ml.cg_limit <= ml.mem_available))
        snprintf(e->budget_src, sizeof e->budget_src, "automatic: cgroup v%d limit %llu (%.200s) - headroom %llu",
                 ml.cg_version, (unsigned long long)ml.cg_limit, ml.cg_file, (unsigned long long)head);
    else
        snprintf(e->budget_src, sizeof e->budget_src, "automatic: MemAvailable %llu - headroom %llu",
                 (unsigned long long)ml.mem_available, (unsigned long long)head);
}

static int open_pager(jlm_engine *e, const jlm_engine_opts *o, jlm_err *err)
{
    choose_budget(e, o);
    return jlm_pager_open_model(e->m, e->src, 0, &e->pager, err);
}

/* The minimum working set: one block frame, plus the routed experts' frames
 * (or one vision block). */
static uint64_t min_frames(const jlm_engine *e)
{
    uint32_t pins[3] = {1, 0, e->c->n_expert ? e->c->n_expert_used : 0}, vis_pins[3] = {0, 1, 0};
    uint64_t min = jlm_pager_min_budget(e->pager, pins), vmin = jlm_pager_min_budget(e->pager, vis_pins);
    return vmin > min ? vmin : min;   /* the tower pins one vision block at a time, no text block */
}

static uint64_t fixed_bytes(const jlm_engine *e) { return e->m->hdr.dense_len + e->mem_kv + e->mem_scratch; }

int jlm_eng_fit_frames(jlm_engine *e, jlm_err *err)
{
    uint64_t fixed = fixed_bytes(e), min = min_frames(e);
    e->budget = 0;
    if (e->budget_all)
        e->budget = e->budget_all > fixed && e->budget_all - fixed > min ? e->budget_all - fixed : min;
    uint32_t pf_pins[3] = {3, 0, e->c->n_expert ? e->c->n_expert_used : 0};
    if (e->dev_pf && e->budget && e->budget < jlm_pager_min_budget(e->pager, pf_pins)) {
        jlm_eng_prefetch_end(e);   /* its extra pin no longer fits beside the grown cache (open_backend) */
        e->dev_pf = 0;
    }
    return jlm_pager_set_budget(e->pager, e->budget, err);
}

/* Once the buffers exist: the frames get what the KV cache (none yet: it
 * takes its share as it grows), scratch and the dense region leave of
 * budget_all, at least the minimum working set (a note when raised). */
static int apply_budget(jlm_engine *e, const jlm_engine_opts *o, jlm_err *err)
{
    tally_buffers(e);
    uint64_t fixed = fixed_bytes(e), min = min_frames(e);
    if (e->budget_all && !o->quiet && (e->budget_all <= fixed || e->budget_all - fixed < min))
        fprintf(stderr,
                "note: budget %llu bytes leaves %llu for page frames after scratch and the dense region (%llu): "
                "below the minimum working set (one block frame%s), raised to %llu\n",
                (unsigned long long)e->budget_all,
                (unsigned long long)(e->budget_all > fixed ? e->budget_all - fixed : 0), (unsigned long long)fixed,
                e->c->n_expert ? " plus the routed experts' frames" : "", (unsigned long long)min);
    return jlm_eng_fit_frames(e, err);
}

/* opts.kv (both: "auto" is F16, F32 for latent attention; a device's whole
 * blocks keep either, exec_vk.c and exec_cu.c), opts.kv_k,
 * opts.kv_v (each over kv): "f32", "f16" or "q8_0"; Q8_0 needs head dimensions in whole blocks of 32, and latent
 * attention (one cache row for keys and values) F32 or F16. */
static int choose_kv(jlm_engine *e, const jlm_engine_opts *o, jlm_err *err)
{
    int both = KV_F32, rc, mla = e->c->kv_lora_rank != 0;
    if (o->kv && !strcmp(o->kv, "auto"))
        both = mla ? KV_F32 : KV_F16;   /* docs/engine.md: F16's tolerance shown except for latent rows */
    else if (o->kv && (rc = jlm_kv_type_parse("--kv", o->kv, &both, err)))
        return rc;
    e->kt = e->vt = both;
    if ((o->kv_k && (rc = jlm_kv_type_parse("--cache-type-k", o->kv_k, &e->kt, err))) ||
        (o->kv_v && (rc = jlm_kv_type_parse("--cache-type-v", o->kv_v, &e->vt, err))))
        return rc;
    const char *opt[2] = {o->kv_k ? "--cache-type-k" : "--kv", o->kv_v ? "--cache-type-v" : "--kv"};
    if (mla && (e->kt == KV_Q8_0 || e->vt == KV_Q8_0))
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s q8_0: %s has a latent-attention cache (deepseek2): f32 or "
                        "f16 only", opt[e->kt == KV_Q8_0 ? 0 : 1], e->m->path);
    if (mla)
        e->vt = e->kt;   /* one row holds both (llama.cpp's V is a view of it) */
    uint32_t dims[2] = {e->hd, e->hd_v};
    int types[2] = {e->kt, e->vt};
    for (int i = 0; i < 2; i++)
        if (types[i] == KV_Q8_0 && dims[i] % KV_Q8_BLOCK)
            return jlm_errf(err, JLM_EUNSUPPORTED, "%s q8_0: %s has a %s head dimension of %u, not a multiple "
                            "of 32", opt[i], e->m->path, i ? "value" : "key", dims[i]);
    e->kv_direct = e->kt == e->vt && e->kt != KV_Q8_0;
    e->kv_heads = mla ? e->c->n_layer : (uint64_t)e->c->n_layer * e->c->n_kv_head;
    e->krow = jlm_kv_row_bytes(e->kt, mla ? e->kv_dim : e->hd);
    e->vrow = mla ? 0 : jlm_kv_row_bytes(e->vt, e->hd_v);
    return JLM_OK;
}

/* opts.expert_policy: NULL (JLM_XP_DEFAULT), "lru", "lfu", "next" or
 * "auto"; the counts' half-life is JLM_XP_HALF_LIFE (JLM_XP_NEXT_HALF_LIFE
 * for next) gets per expert page of the model, auto's its shadows' choice;
 * next's cycle is the MoE blocks of n_expert pages, n_expert_used gotten a
 * token. */
static int choose_expert_policy(jlm_engine *e, const jlm_engine_opts *o, jlm_err *err)
{
    int pol = o->expert_policy ? jlm_xp_parse(o->expert_policy) : JLM_XP_DEFAULT;
    if (pol < 0)
        return jlm_errf(err, JLM_EINVAL, "--expert-policy '%.40s': expected auto, lfu, lru or next", o->expert_policy);
    double n = (double)e->c->n_layer * e->c->n_expert;   /* expert pages, at most */
    double half = pol == JLM_XP_NEXT ? JLM_XP_NEXT_HALF_LIFE : JLM_XP_HALF_LIFE;
    jlm_pager_set_expert_policy(e->pager, pol, half * (n > 0 ? n : 1));
    jlm_pager_set_expert_blocks(e->pager, e->c->n_expert, e->c->n_expert_used);
    return JLM_OK;
}

/* The host pager has one evict hook: every device whose frames may alias
 * the host's (Vulkan's import path) hears of each eviction. */
static void host_evicted(void *ctx, uint32_t array, uint32_t page, void *frame)
{
    jlm_engine *e = ctx;
    for (int i = 0; i < e->n_dev; i++)
        jlm_dev_host_evicted(e->devs[i], array, page, frame);
}

/* Device frames: their own budget, at least one block frame plus the routed
 * experts' frames (as the host's); the dense region for the output. Returns
 * the budget (0: none). */
static uint64_t dev_frames(jlm_engine *e, jlm_dev *d, uint64_t asked, int quiet)
{
    uint32_t pins[3] = {1, 0, e->c->n_expert ? e->c->n_expert_used : 0};
    uint64_t min = jlm_pager_min_budget(e->pager, pins), gb = asked;
    if (!gb)
        gb = jlm_dev_default_budget(d);
    if (gb && gb < min) {
        if (!quiet && asked)
            fprintf(stderr, "note: --gpu-budget %llu bytes is below the device's minimum working set (one block "
                            "frame%s), raised to %llu\n", (unsigned long long)gb,
                    e->c->n_expert ? " plus the routed experts' frames" : "", (unsigned long long)min);
        gb = min;
    }
    jlm_dev_set_budget(d, gb);
    jlm_dev_set_dense(d, e->dense, (e->m->hdr.dense_len + 4095) & ~4095ull);
    return gb;
}

/* Appends to the line (truncated at its end). */
static void __attribute__((format(printf, 3, 4))) addf(char *line, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, cap - n, fmt, ap);
    va_end(ap);
}

static void add_blocks(char *line, size_t cap, uint32_t b, uint32_t end)
{
    if (end == b) addf(line, cap, "no block");
    else if (end == b + 1) addf(line, cap, "block %u", b);
    else addf(line, cap, "blocks %u-%u", b, end - 1);
}

/* Two devices: "note: matmuls on CUDA device X for block 0, on Vulkan
 * device Y for blocks 1-2; blocks 3-4 and the output on the CPU". */
static void split_note(const jlm_engine *e)
{
    char line[1024] = "note: matmuls";
    uint32_t at = 0;
    for (int i = 0; i < e->n_dev; i++) {
        addf(line, sizeof line, "%s on %s device %s for ", i ? "," : "",
             !strcmp(jlm_dev_kind(e->devs[i]), "cuda") ? "CUDA" : "Vulkan", jlm_dev_name(e->devs[i]));
        add_blocks(line, sizeof line, at, e->dev_end[i]);
        at = e->dev_end[i];
    }
    if (e->out_dev) {
        addf(line, sizeof line, " and the output");
    } else if (at < e->c->n_layer) {
        addf(line, sizeof line, "; ");
        add_blocks(line, sizeof line, at, e->c->n_layer);
        addf(line, sizeof line, " and the output on the CPU");
    } else {
        addf(line, sizeof line, "; the output on the CPU");
    }
    fprintf(stderr, "%s\n", line);
}

/* --backend: one device backend, or two in block order (jlm_engine_split):
 * device 0 runs blocks 0..gpu_layers-1, device 1 the next gpu_layers2 (0:
 * all remaining), the CPU the rest; the output matrix runs on the last
 * device when its count is 'all' (0). vulkan and cuda fail with one line
 * without a device; auto tries Vulkan and falls back to the CPU with a
 * note. */
static int open_backend(jlm_engine *e, const jlm_engine_opts *o, jlm_err *err)
{
    jlm_engine_split sp;
    int rc = jlm_engine_split_parse(o->backend, o->device, &sp, err);
    if (rc || !sp.n)
        return rc;
    if (sp.n > 1 && !o->gpu_layers)
        return jlm_errf(err, JLM_EINVAL, "--backend %s,%s: the first device's block count is needed (--gpu-layers "
                                         "N or N,M)", sp.kind[0], sp.kind[1]);
    uint32_t count[JLM_ENGINE_DEVS] = {o->gpu_layers, o->gpu_layers2}, at = 0;
    uint64_t budget[JLM_ENGINE_DEVS] = {o->gpu_budget, o->gpu_budget2};
    int dev_small = 0;   /* a device budget too small for a prefetch's extra block */
    for (int i = 0; i < sp.n; i++) {
        jlm_err verr = {0};
        int is_cuda = !strcmp(sp.kind[i], "cuda");
        rc = is_cuda ? jlm_ecu_open(sp.device[i], &e->devs[i], &verr)
                     : jlm_evk_open(sp.device[i], 0, &e->devs[i], &verr);
        if (rc && sp.is_auto) {
            if (!o->quiet)
                fprintf(stderr, "note: --backend auto: %s; running on the CPU\n", verr.msg);
            return JLM_OK;
        }
        if (rc)
            return jlm_errf(err, rc, "--backend %s: %s", sp.kind[i], verr.msg);
        e->n_dev = i + 1;
        uint64_t end = count[i] ? at + (uint64_t)count[i] : e->c->n_layer;   /* 0: all remaining */
        e->dev_end[i] = at = end < e->c->n_layer ? (uint32_t)end : e->c->n_layer;
        uint64_t gb = dev_frames(e, e->devs[i], budget[i], o->quiet);
        uint32_t dpf_pins[3] = {2, 0, e->c->n_expert ? e->c->n_expert_used : 0};
        dev_small |= gb && gb < jlm_pager_min_budget(e->pager, dpf_pins);
    }
    e->out_dev = count[sp.n - 1] ? NULL : e->devs[sp.n - 1];
    jlm_pager_set_evict_hook(e->pager, host_evicted, e);
    /* a device prefetch keeps the next block pinned on the host beside the
     * current one, and its device frame pinned beside the current block's
     * and its experts': only where the host budget holds both with room to
     * spare and every device's budget holds both blocks and the experts */
    uint32_t pf_pins[3] = {3, 0, e->c->n_expert ? e->c->n_expert_used : 0};
    e->dev_pf = !dev_small && (!e->budget || e->budget >= jlm_pager_min_budget(e->pager, pf_pins));
    if (!o->quiet && sp.n == 1)
        fprintf(stderr, "note: matmuls on %s device %s\n", !strcmp(sp.kind[0], "cuda") ? "CUDA" : "Vulkan",
                jlm_dev_name(e->devs[0]));
    else if (!o->quiet)
        split_note(e);
    return JLM_OK;
}

/* The fingerprint (jlm-format.md 4.7) against this run: one note naming
 * both sides where host, device or writer differ; never refused. */
static void fp_clean(char *dst, size_t n, const jlm_str *s)   /* untrusted bytes: one printable line */
{
    size_t i = 0;
    for (; s->s && i + 1 < n && i < s->len && s->s[i]; i++)
        dst[i] = (unsigned char)s->s[i] < 0x20 || s->s[i] == 0x7f ? '?' : s->s[i];
    dst[i] = 0;
}

static void fingerprint_note(const jlm_engine *e)
{
    char fh[41], fd[41], fw[61];
    fp_clean(fh, sizeof fh, &e->m->fp.host);
    fp_clean(fd, sizeof fd, &e->m->fp.device);
    fp_clean(fw, sizeof fw, &e->m->fp.writer);
    struct utsname u;
    const jlm_dev *d0 = e->devs[0], *d1 = e->devs[1];   /* compared: the first device */
    const char *host = uname(&u) == 0 ? u.machine : "?", *dev = d0 ? jlm_dev_kind(d0) : "cpu";
    int dh = strcmp(fh, host) != 0, dd = strcmp(fd, dev) != 0, dw = strcmp(fw, JLM_WRITER_NAME) != 0;
    if (dh || dd || dw)
        fprintf(stderr, "note: %s was written for host %s, device %s, writer '%s'; running on host %s, "
                        "device %s%s%s%s%s%s%s%s%s, writer '%s' (%s%s%s; compared, never enforced)\n",
                e->m->path, fh, fd, fw, host, dev, d0 ? " (" : "", d0 ? jlm_dev_name(d0) : "", d0 ? ")" : "",
                d1 ? " then " : "", d1 ? jlm_dev_kind(d1) : "", d1 ? " (" : "", d1 ? jlm_dev_name(d1) : "",
                d1 ? ")" : "", JLM_WRITER_NAME, dh ? "host differs" : "",
                dd ? (dh ? ", device differs" : "device differs") : "", dw ? (dh || dd ? ", writer differs" : "writer differs") : "");
}

/* The sidecar's checksums (jlm_engine_opts.verify), loaded and the header
 * and records checked before the records are decoded: a damaged record is
 * named as a mismatch, never parsed. Only the 192-byte header is decoded
 * first (bounds against the file, as the format's open and the sidecar's
 * pairing both do), so a cut container is named as the container. fd: the
 * container, open (the descriptor the metadata and pages are read through
 * next). *out NULL: none. */
static int load_verify(const char *path, int fd, const jlm_engine_opts *o, jlm_sums **out, jlm_err *err)
{
    *out = NULL;
    if (o->no_verify)
        return JLM_OK;
    struct stat st;
    if (fstat(fd, &st))
        return jlm_fmt_io_error(path, "cannot read its header", err);
    if (!S_ISREG(st.st_mode))   /* a FIFO or a folder in the model's place: the format's open says so */
        return JLM_OK;
    uint8_t hb[JLM_HEADER_LEN];
    jlm_header h;
    ssize_t got = pread(fd, hb, sizeof hb, 0);
    if (got < 0)
        return jlm_fmt_io_error(path, "cannot read its header", err);
    int rc;   /* a cut or damaged header named as the format's open names it: the container, not its sidecar */
    if ((rc = jlm_fmt_header_decode(hb, (size_t)got, &h, err)) ||
        (rc = jlm_fmt_header_validate(&h, (uint64_t)st.st_size, err)))
        return jlm_err_prefix(err, rc, "%s", path);
    char *sp = jlm_sums_path(path);
    if (!sp)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", path);
    rc = jlm_sums_load(AT_FDCWD, sp, hb, (uint64_t)st.st_size, out, err);
    free(sp);
    if (rc == JLM_ENOTFOUND && o->verify)
        rc = jlm_errf(err, JLM_ENOTFOUND, "%s: --verify: no checksum sidecar %s.sums", path, path);
    else if (rc == JLM_ENOTFOUND)
        rc = JLM_OK;
    uint8_t *meta = !rc && *out ? malloc((*out)->spans[0].len) : NULL;
    if (!rc && *out && !meta)
        rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory", path);
    ssize_t mg = meta ? pread(fd, meta, (*out)->spans[0].len, 0) : 0;
    if (meta && mg < 0)
        rc = jlm_fmt_io_error(path, "cannot read its records", err);
    else if (meta && mg != (ssize_t)(*out)->spans[0].len)
        rc = jlm_errf(err, JLM_EIO, "%s: cannot read its records: %zd of %llu bytes (the file shrank)", path, mg,
                      (unsigned long long)(*out)->spans[0].len);
    else if (meta)
        rc = jlm_sums_check(*out, 0, meta, (*out)->spans[0].len, path, NULL, err);
    free(meta);
    if (rc) {
        jlm_sums_free(*out);
        *out = NULL;
    }
    return rc;
}

/* Wraps e->src with sums (taken, also on failure). */
static int wrap_verify(jlm_engine *e, jlm_sums *sums, jlm_err *err)
{
    if (!sums)
        return JLM_OK;
    jlm_source *inner = e->src;
    e->src = NULL;   /* the verify source owns it from here, also on failure */
    return jlm_source_open_verify(inner, sums, &e->src, err);
}

int jlm_engine_open(const char *path, const jlm_engine_opts *opts, jlm_engine **out, jlm_err *err)
{
    jlm_engine_opts o = {0};
    if (opts)
        o = *opts;
    jlm_engine *e = calloc(1, sizeof *e);
    if (!e)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", path);
    e->pf_block = NO_PF;
    jlm_sums *sums = NULL;
    /* opened once: the checksum records, the metadata and every page are
     * read through this open file, never through path again (a path
     * replaced between two opens, a jlmfs view whose source changed, would
     * pair one version's metadata with another's pages) */
    int fd;
    int rc = jlm_fmt_open_file(path, &fd, err);
    if (!rc && (rc = load_verify(path, fd, &o, &sums, err)))
        close(fd);
    if (rc || (rc = jlm_fmt_open_fd(fd, path, &e->m, err)))   /* takes fd */
        goto fail;
    e->c = &e->m->config;
    const jlm_config *c = e->c;
    if (!supported(c->arch)) {
        rc = jlm_errf(err, JLM_EUNSUPPORTED, "%s: architecture '%s' has no graph in this engine%s", path,
                      jlm_fmt_arch_name(c->arch), c->arch == JLM_ARCH_NONE ? " (a vocab-only container)" : "");
        goto fail;
    }
    if (c->arch == JLM_ARCH_LLAMA && c->moe_step && c->n_expert_used != 1) {   /* Llama 4: weight before the FFN */
        rc = jlm_errf(err, JLM_EUNSUPPORTED, "%s: llama with moe_step %u (Llama 4) routes one expert, not "
                      "n_expert_used %u", path, c->moe_step, c->n_expert_used);
        goto fail;
    }
    if ((rc = jlm_fmt_shapes_check(c, e->m->tensors, e->m->hdr.n_tensors, path, err)))
        goto fail;
    e->hd = c->head_dim;
    e->hd_v = c->head_dim_v ? c->head_dim_v : c->head_dim;
    e->q_dim = c->n_head * e->hd;
    e->kv_dim = c->n_kv_head * e->hd;
    e->kv_dim_v = c->n_kv_head * e->hd_v;
    if (c->kv_lora_rank) {   /* latent attention: a cache row is the latent and the RoPE key (exec_mla.c) */
        e->kv_dim = c->kv_lora_rank + c->n_rot;
        e->kv_dim_v = 0;
    }
    e->n_ctx = o.n_ctx ? o.n_ctx : (c->n_ctx && c->n_ctx < 4096 ? c->n_ctx : 4096);
    e->qk_unit = c->arch == JLM_ARCH_LLAMA && c->moe_step && (c->flags & JLM_F_QK_NORM);
    if (e->n_ctx > JLM_ENGINE_MAX_CTX) {   /* the CLI's -c stops at 2^24; the API must not wrap kv_ctx */
        rc = jlm_errf(err, JLM_EINVAL, "%s: context of %u positions: at most %u", path, e->n_ctx, JLM_ENGINE_MAX_CTX);
        goto fail;
    }
    e->kv_ctx = (e->n_ctx + JLM_K_FATTN_BK - 1) / JLM_K_FATTN_BK * JLM_K_FATTN_BK;   /* whole key tiles */
    jlm_err kerr = {0};
    if (jlm_k_cpu_init(&kerr) && !o.quiet)
        fprintf(stderr, "note: %s\n", kerr.msg);
    e->k = jlm_k_cpu_get();
    /* the pages come from the file the metadata came from */
    jlm_file_source_opts so = {.direct = o.direct, .use_fd = 1, .fd = e->m->fd, .size = e->m->file_size};
    e->predict = !o.no_predict && !o.no_prefetch && c->n_expert;
    if ((rc = choose_kv(e, &o, err)) || (rc = jlm_source_open_file(path, &so, &e->src, err)) ||
        (rc = wrap_verify(e, sums, err), sums = NULL, rc) || (rc = index_tensors(e, err)) || (rc = read_dense(e, err)) || (rc = open_pager(e, &o, err)) ||
        (rc = choose_expert_policy(e, &o, err)) ||
        (rc = jlm_pool_create(o.n_threads, 0, &e->pool, err)) || (rc = alloc_buffers(e, err)) ||
        (rc = apply_budget(e, &o, err)) || (rc = open_backend(e, &o, err)))
        goto fail;
    jlm_pager_set_prefetch(e->pager, !o.no_prefetch);
    jlm_stream_open(e, &o);
    if (!o.quiet)
        fingerprint_note(e);
    *out = e;
    return JLM_OK;
fail:
    jlm_sums_free(sums);
    jlm_engine_close(e);
    return rc;
}


void jlm_engine_close(jlm_engine *e)
{
    if (!e)
        return;
    jlm_eng_prefetch_end(e);
    if (e->n_dev && e->pager)
        jlm_pager_set_evict_hook(e->pager, NULL, NULL);
    for (int i = 0; i < JLM_ENGINE_DEVS; i++)
        jlm_dev_close(e->devs[i]);
    jlm_pool_destroy(e->pool);
    jlm_pager_close(e->pager);
    jlm_source_close(e->src);
    jlm_fmt_close(e->m);
    void *bufs[ENGINE_BUFS];
    engine_bufs(e, bufs);
    jlm_kv_release(e, bufs[1], bufs[2]);   /* mapped (kvcache.c) */
    for (size_t i = 0; i < ENGINE_BUFS; i++)
        if (i != 1 && i != 2)
            free(bufs[i]);
    jlm_rows_release(e);   /* mapped (scratch.c) */
    free(e->warm_order);
    free(e);
}

uint32_t jlm_engine_max_batch(void) { return BATCH; }

/* ================================================================ queries */
void jlm_engine_rewind(jlm_engine *e, uint32_t pos)
{
    if (pos >= e->n_past)
        return;
    e->n_past = pos;
    jlm_err err;
    jlm_kv_fit(e, e->kc, e->vc, &e->kv_have, pos, 1, &err);   /* shrinks: the frames' budget only grows */
}
const jlm_model *jlm_engine_model(const jlm_engine *e) { return e->m; }
void jlm_engine_dev_counters(const jlm_engine *e, uint64_t *matmuls, uint64_t *bytes_up)
{
    *matmuls = *bytes_up = 0;
    for (int i = 0; i < e->n_dev; i++) {
        jlm_dev_stats s;
        jlm_dev_stats_get(e->devs[i], &s);
        *matmuls += s.matmuls;
        *bytes_up += s.bytes_up;
    }
}
int jlm_engine_dev_stats(const jlm_engine *e, struct jlm_dev_stats *out) { return jlm_engine_dev_stats_at(e, 0, out); }
int jlm_engine_dev_stats_at(const jlm_engine *e, int i, struct jlm_dev_stats *out)
{
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= e->n_dev)
        return 0;
    jlm_dev_stats_get(e->devs[i], out);
    return 1;
}
int jlm_engine_dev_prof_at(const jlm_engine *e, int i, struct jlm_dev_prof *out)
{
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= e->n_dev)
        return 0;
    jlm_dev_prof_get(e->devs[i], out);
    return 1;
}
uint32_t jlm_engine_n_past(const jlm_engine *e) { return e->n_past; }
uint32_t jlm_engine_n_ctx(const jlm_engine *e) { return e->n_ctx; }
uint32_t jlm_engine_n_vocab(const jlm_engine *e)
{
    const jlm_tensor *t = W(e, -1, JLM_R_OUTPUT);
    return (uint32_t)jlm_tensor_rows(t ? t : W(e, -1, JLM_R_TOKEN_EMBD));
}
jlm_pager *jlm_engine_pager(jlm_engine *e) { return e->pager; }

/* ================================================================ profiling */
static unsigned long long pager_read_ns(jlm_pager *pg)
{
    jlm_pager_counters c;
    jlm_pager_stats(pg, &c);
    unsigned long long s = 0;
    for (uint32_t a = 0; a < c.n_arrays; a++)
        s += c.a[a].read_ns + c.a[a].pf_wait_ns;   /* own reads + waits for a prefetch */
    return s;
}

void jlm_engine_prof_reset(jlm_engine *e)
{
    memset(&e->pr, 0, sizeof e->pr);
    jlm_pool_stats_reset(e->pool);
    for (int i = 0; i < e->n_dev; i++)
        jlm_dev_prof_reset(e->devs[i]);
    e->pr_page0 = pager_read_ns(e->pager);
}

void jlm_engine_profile(jlm_engine *e, int on)
{
    e->prof = on;
    e->prof_in = 0;
    jlm_pool_profile(e->pool, on);
    for (int i = 0; i < e->n_dev; i++)
        jlm_dev_profile(e->devs[i], on);
    jlm_engine_prof_reset(e);
}

void jlm_engine_prof_add(jlm_engine *e, int cls, unsigned long long ns)
{
    if (e->prof && cls >= 0 && cls < JLM_PROF_N) {
        e->pr.ns[cls] += ns;
        e->pr.total_ns += ns;
    }
}

void jlm_engine_prof_get(const jlm_engine *e, jlm_engine_prof *out)
{
    *out = e->pr;
    unsigned long long page = pager_read_ns(e->pager);
    out->ns[JLM_PROF_PAGEIN] = page > e->pr_page0 ? page - e->pr_page0 : 0;
    /* a counter reset by someone else (jlm bench between repetitions) */
    if (page < e->pr_page0)
        out->ns[JLM_PROF_PAGEIN] = page;
    unsigned long long known = 0;
    for (int i = 0; i < JLM_PROF_N; i++)
        if (i != JLM_PROF_OTHER)
            known += out->ns[i];
    out->ns[JLM_PROF_OTHER] = out->total_ns > known ? out->total_ns - known : 0;
    jlm_pool_stats ps;
    jlm_pool_stats_get(e->pool, &ps);
    out->dispatches = ps.dispatches;
    out->par_wall_ns = ps.wall_ns;
    out->wait_ns = ps.wait_ns;
    out->busy_ns = ps.busy_ns;
    out->n_threads = jlm_pool_n_threads(e->pool);
}

const char *jlm_engine_prof_name(int cls)
{
    static const char *const names[JLM_PROF_N] = {"matmul", "attention", "moe-routing", "page-in", "sampling",
                                                  "norms/rope/act"};
    return cls >= 0 && cls < JLM_PROF_N ? names[cls] : "?";
}
const uint8_t *jlm_engine_dense(const jlm_engine *e) { return e->dense; }
struct jlm_pool *jlm_engine_pool(jlm_engine *e) { return e->pool; }
uint64_t jlm_engine_budget(const jlm_engine *e) { return e->budget; }

void jlm_engine_mem_info(const jlm_engine *e, jlm_engine_mem *out)
{
    *out = (jlm_engine_mem){.budget = e->budget_all, .frames = e->budget, .kv = e->mem_kv,
                            .scratch = e->mem_scratch, .dense = e->m->hdr.dense_len,
                            .kv_k = jlm_kv_type_name(e->kt), .kv_v = jlm_kv_type_name(e->vt),
                            .kv_row = e->kv_dim + e->kv_dim_v, .kv_token = jlm_kv_bytes_at(e, 1),
                            .kv_have = e->kv_have, .kv_full = jlm_kv_bytes_at(e, e->kv_ctx)};
    snprintf(out->source, sizeof out->source, "%s", e->budget_src);
}

const int32_t *jlm_engine_last_route(const jlm_engine *e, uint32_t block)
{
    if (block >= e->c->n_layer || !W(e, block, JLM_R_EXP_GATE))
        return NULL;
    return e->route + (size_t)block * e->c->n_expert_used;
}

uint64_t jlm_engine_bytes_per_token(const jlm_engine *e)
{
    const jlm_header *h = &e->m->hdr;
    uint64_t b = 0;
    for (uint32_t l = 0; l < e->c->n_layer; l++)
        b += jlm_pager_extent(e->pager, JLM_PAGER_TEXT, l);
    if (h->n_exp_pages)
        b += (uint64_t)(h->n_exp_pages / e->c->n_expert) * e->c->n_expert_used * h->exp_page_size;
    const jlm_tensor *t = W(e, -1, JLM_R_OUTPUT);
    if (!t)
        t = W(e, -1, JLM_R_TOKEN_EMBD);
    jlm_tensor_planes pl;
    if (!jlm_fmt_tensor_planes(t, &pl, NULL))
        b += pl.qs_len + pl.d_len + pl.sc_len;
    return b;
}
