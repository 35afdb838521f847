/* stream.c - the streamer: every page the layer loop computes on passes
 * through here, acquire -> compute -> release (exec_int.h). A block's page
 * is pinned on the host (the pager) and, for a block a device backend runs,
 * on that device (its frames, engine/devframes.h); the next block is read
 * ahead on the pager's thread and, on a device with a copy thread (CUDA),
 * copied ahead while this block computes; an expert page follows its
 * block's backend, and a grouped batch names the next expert it will want
 * so that it is read while the current one computes. A token's missing
 * experts are read at once, the next MoE block's predicted ones ahead, and
 * with a budget that holds the model the rest in the background
 * (docs/pager.md, Expert reads). The layer loop
 * (model.c) and the ops (exec*.c) make no pager or device-frame call. */
#include "engine/exec_int.h"

#include "engine/pager.h"

#include <math.h>
#include <string.h>

/* The device that runs block l's matmuls, pages and experts; NULL: the CPU.
 * The output matrix's is out_dev (after the blocks: jlm_stream_finish). */
static jlm_dev *block_dev(const jlm_engine *e, uint32_t l)
{
    for (int i = 0; i < e->n_dev; i++)
        if (l < e->dev_end[i])
            return e->devs[i];
    return NULL;
}

/* ---------------------------------------------------------------- device prefetch */
/* While block l's kernels run, the next block's page goes to the device on
 * the backend's copy thread (CUDA; docs/cuda.md, "Overlap"): started here
 * when that block runs on a device (its own: with two, the next block's may
 * be the other one's), is whole in host memory already (a get that would
 * read the disk is left to its turn) and the host budget can hold it
 * pinned; the device then waits for it only before its own kernels. The
 * extra host pin is let go once block l+1's device get (or the prefetch's
 * end) has the copy done. */
void jlm_eng_prefetch_end(jlm_engine *e)
{
    if (!e || e->pf_block == NO_PF)
        return;
    jlm_dev_prefetch_end(e->pf_dev);
    jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, e->pf_block);
    e->pf_block = NO_PF;
}

static void dev_prefetch_next(jlm_engine *e, uint32_t l)
{
    uint32_t nx = l + 1 < e->c->n_layer ? l + 1 : 0;
    jlm_dev *d = block_dev(e, nx);
    if (!d || !e->dev_pf || e->pf_block != NO_PF || nx == l)
        return;
    uint64_t ext = jlm_pager_extent(e->pager, JLM_PAGER_TEXT, nx);
    const void *host;
    if (jlm_pager_filled(e->pager, JLM_PAGER_TEXT, nx) < ext ||
        jlm_pager_get(e->pager, JLM_PAGER_TEXT, nx, 0, ext, &host, NULL))
        return;
    if (jlm_dev_prefetch(d, JLM_PAGER_TEXT, nx, JLM_PAGER_BLOCK, host, ext)) {
        e->pf_block = nx;
        e->pf_dev = d;
    } else
        jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, nx);
}

/* ---------------------------------------------------------------- the cold start */
/* The pages not yet resident read in the background on the pager's
 * readers, as many at once as it takes, so a first run reads the model at
 * the disk's bandwidth instead of page by page on first use. When the
 * budget holds every page, all of them in file order (the text blocks, then
 * the experts). Below that (warm_part), only into free frames, never
 * evicting, until they are full: the text blocks first, then the experts by
 * rank (warm_pick; in a prefill, guesses only where its later blocks leave
 * room: warm_spare), so that the frames fill with the experts the run is
 * likely to route to (issue 42: a 90% limit decoded at 0.29-0.38 of the
 * unlimited run, which read the model in the background while the limited
 * runs read each expert on first use; in file order, half the frames then
 * held the first blocks' experts whatever the routing). A page read so goes
 * in as the least recently used: a page a run needs evicts it and takes its
 * frame over (no new mapping: docs/pager.md, Expert frames).
 * warm_at: array << 32 | page of the next one in file order. A page in use
 * or on its way is passed over (its get reads it). */
/* Whether the frames hold page pg of array a, and `more` bytes beside it. */
static int frames_hold(jlm_engine *e, uint32_t a, uint32_t pg, double more)
{
    jlm_pager_counters pc;
    jlm_pager_stats(e->pager, &pc);
    return (double)(pc.resident_bytes + jlm_pager_charge(e->pager, a, pg)) + more <= (double)e->budget;
}

static int warm_fits(jlm_engine *e, uint32_t a, uint32_t pg)
{
    if (!e->warm_part)
        return 1;
    if (jlm_pager_filled(e->pager, a, pg))
        return 1;   /* resident (or partly): the prefetch passes it over or fills its rest */
    return frames_hold(e, a, pg, 0.0);
}

/* Block l's rows' choices (sel, n_expert_used a row) marked WARM_SEL in
 * warm_done and counted (warm_nsel; warm_nrouted when `first` routing). */
static void warm_chosen(jlm_engine *e, uint32_t l, int first_routing, const int32_t *sel, uint32_t n)
{
    const jlm_tensor *tg = W(e, (int32_t)l, JLM_R_EXP_GATE);
    if (!tg)
        return;
    uint32_t first = bank_first(e, tg), ne = e->c->n_expert, nu = e->c->n_expert_used;
    e->warm_nrouted += first_routing;
    for (uint64_t k = 0; k < (uint64_t)n * nu; k++) {
        if (sel[k] < 0 || (uint32_t)sel[k] >= ne || (e->warm_done[first + (uint32_t)sel[k]] & WARM_SEL))
            continue;
        e->warm_done[first + (uint32_t)sel[k]] |= WARM_SEL;
        e->warm_nsel++;
    }
}

/* Block l's routing of n rows (lg: their router logits, the bias added, n_expert
 * each) into its ranks for the background read (warm_score): each row's
 * probabilities summed, softmax over the logits, or for sigmoid routing
 * each expert's selection score (its sigmoid plus exp_probs_b) over the
 * row's sum. Counted while the background read ranks experts. */
void jlm_stream_routed(jlm_engine *e, uint32_t l, int mode, const float *lg, const int32_t *sel, uint32_t n)
{
    const jlm_config *c = e->c;
    uint32_t ne = c->n_expert;
    if (!e->warm || !e->warm_rank || l >= c->n_layer || ne > JLM_MAX_EXPERTS)
        return;
    float *sc = e->warm_score + (size_t)l * (ne + 2), p[JLM_MAX_EXPERTS];
    warm_chosen(e, l, sc[ne] == 0.0f, sel, n);
    const float *bias = mode == JLM_ROUTE_SIGMOID ? vec_dense(e, W(e, (int32_t)l, JLM_R_EXP_PROBS_B)) : NULL;
    int sigmoid = mode == JLM_ROUTE_SIGMOID || mode == JLM_ROUTE_SIGMOID_IN;
    for (uint32_t t = 0; t < n; t++) {
        const float *r = lg + (uint64_t)t * ne;
        float sum = 0.0f;
        memcpy(p, r, ne * sizeof *p);
        if (!sigmoid)
            jlm_k_softmax(p, ne);
        for (uint32_t i = 0; i < ne; i++) {
            if (sigmoid)
                p[i] = 1.0f / (1.0f + expf(-r[i])) + (bias ? bias[i] : 0.0f);
            p[i] = p[i] > 0.0f ? p[i] : 0.0f;
            sum += p[i];
        }
        for (uint32_t i = 0; sum > 0.0f && i < ne; i++)
            sc[i] += p[i] / sum;
        sc[ne] += 1.0f;   /* rows seen */
    }
}

/* Block l's expert bank (page `first`): its highest ranked expert not yet
 * read, resident or passed over (the ones a row routed to first, then by
 * rank; ties: the lower index), -1 none; the resident ones found marked
 * done (read as they were used). */
static int32_t warm_best(jlm_engine *e, uint32_t l, uint32_t first)
{
    uint32_t ne = e->c->n_expert;
    float *sc = e->warm_score + (size_t)l * (ne + 2);
    const uint8_t *d = e->warm_done + first;
    int32_t best = -1;
    for (uint32_t i = 0; i < ne; i++) {
        if (d[i] & WARM_DONE)
            continue;
        if (jlm_pager_filled(e->pager, JLM_PAGER_EXPERTS, first + i)) {
            e->warm_done[first + i] |= WARM_DONE;
            sc[ne + 1] += 1.0f;
            continue;
        }
        int si = (d[i] & WARM_SEL) != 0, sb = best >= 0 && (d[best] & WARM_SEL);
        if (best < 0 || si > sb || (si == sb && sc[i] > sc[best]))
            best = (int32_t)i;
    }
    return best;
}

/* Whether the frames have room for expert page pg, which no row routed to,
 * beside what the MoE blocks not yet routed in the layers' first pass (a
 * prefill's) are expected to route to: the mean of the blocks routed so far
 * each. A page read into a frame that the prefill's own experts then take
 * is read for nothing (issue 42's moe-1g at its 25% budget: 17 such pages,
 * 15 of them evicted before any use). */
static int warm_spare(jlm_engine *e, uint32_t pg)
{
    if (e->warm_pass || !e->warm_nrouted || e->warm_nrouted >= e->warm_nmoe)
        return 1;
    double later = (double)(e->warm_nmoe - e->warm_nrouted) * e->warm_nsel / e->warm_nrouted * e->warm_xpage;
    return frames_hold(e, JLM_PAGER_EXPERTS, pg, later);
}

/* The next expert page the background read takes below a budget that
 * holds the model: from the routed MoE block with the fewest experts done
 * (its level: resident, read or passed over; warm_blk: round robin among
 * equals), its highest ranked one left. Up to warm_quota (the frames' share
 * of each block) a block goes as soon as it is routed; past it, level by
 * level, waiting for the blocks below, so that every block's top experts are
 * read before any block's next. A block not yet routed counts as routed
 * once the layers have gone round without it (routed where no logits come
 * back: then in file order). 1: *pg, 0: none yet (a block waits), -1: none
 * left. */
static int warm_pick(jlm_engine *e, uint32_t *pg)
{
    const jlm_config *c = e->c;
    uint32_t ne = c->n_expert;
    for (;;) {
        int64_t lb = -1;
        float lv = 0.0f, low = (float)ne;   /* the chosen block's level; the lowest of all */
        for (uint32_t k = 0; k < c->n_layer; k++) {
            uint32_t l = (e->warm_blk + k) % c->n_layer;
            const float *sc = e->warm_score + (size_t)l * (ne + 2);
            if (!W(e, (int32_t)l, JLM_R_EXP_GATE) || sc[ne + 1] >= (float)ne)
                continue;
            low = sc[ne + 1] < low ? sc[ne + 1] : low;
            if ((sc[ne] > 0.0f || e->warm_pass) && (lb < 0 || sc[ne + 1] < lv))
                lb = l, lv = sc[ne + 1];
        }
        if (low >= (float)ne)
            return -1;
        if (lb < 0 || (lv >= e->warm_quota && lv > low))
            return 0;   /* the blocks below it wait for their routing */
        uint32_t first = bank_first(e, W(e, (int32_t)lb, JLM_R_EXP_GATE));
        const float *sc = e->warm_score + (size_t)lb * (ne + 2);
        int32_t best = warm_best(e, (uint32_t)lb, first);
        if (best < 0 || sc[ne + 1] > lv)
            continue;   /* its resident experts raised its level: choose again */
        if (!(e->warm_done[first + (uint32_t)best] & WARM_SEL) && !warm_spare(e, first + (uint32_t)best))
            return 0;   /* the frames left are the prefill's blocks to come */
        e->warm_blk = (uint32_t)lb + 1;
        *pg = first + (uint32_t)best;
        return 1;
    }
}

static void warm_step(jlm_engine *e)
{
    while (e->warm) {
        uint32_t a = (uint32_t)(e->warm_at >> 32), pg = (uint32_t)e->warm_at;
        int ranked = a == JLM_PAGER_EXPERTS && e->warm_rank && !e->warm_order;
        if (ranked) {
            int k = warm_pick(e, &pg);
            if (k <= 0) {
                e->warm = k == 0;   /* none left: done */
                return;
            }
        } else if (a == JLM_PAGER_EXPERTS && pg < e->n_warm_order) {
            pg = e->warm_order[pg];   /* the order of an earlier run's routing (jlm_engine_warm_order) */
        }
        if (!jlm_pager_extent(e->pager, a, pg)) {   /* past the array's end */
            e->warm = a == JLM_PAGER_TEXT;
            e->warm_at = (uint64_t)JLM_PAGER_EXPERTS << 32;
            continue;
        }
        if (!warm_fits(e, a, pg)) {
            e->warm = 0;   /* the frames are full: from here on pages come as they are used */
            return;
        }
        int rc = jlm_pager_prefetch_low(e->pager, a, pg);
        if (rc < 0)
            return;   /* every reader busy: the next call goes on */
        if (rc > 0) {
            e->pst.warm++;
            e->pst.warm_bytes += jlm_pager_extent(e->pager, a, pg);
        }
        if (ranked) {   /* done: one more of its block's (warm_pick left its turn past it) */
            e->warm_done[pg] |= WARM_DONE;
            e->warm_score[(size_t)(e->warm_blk - 1) * (e->c->n_expert + 2) + e->c->n_expert + 1] += 1.0f;
        } else
            e->warm_at++;
    }
}

/* The expert pages of the model (0: none). */
static uint32_t expert_pages(const jlm_engine *e)
{
    uint32_t np = 0;
    while (jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, np))
        np++;
    return np;
}

/* The background read's expert order from t (routing.h: jlm_routing_order):
 * a layer's MoE ordinal is its rank among the layers with a router. */
int jlm_engine_warm_order(jlm_engine *e, const jlm_routing_trace *t, jlm_err *err)
{
    const jlm_config *c = e->c;
    uint32_t np = expert_pages(e), nmoe = 0;
    if (!c->n_expert || !np)
        return jlm_errf(err, JLM_EINVAL, "%s: no routed experts: no order to read them in", e->m->path);
    if (t->n_layer != c->n_layer || t->n_expert != c->n_expert || t->n_used != c->n_expert_used)
        return jlm_errf(err, JLM_EINVAL, "a trace of another model (n_layer %u n_expert %u n_used %u; this one "
                        "has %u, %u, %u)", t->n_layer, t->n_expert, t->n_used, c->n_layer, c->n_expert,
                        c->n_expert_used);
    uint32_t *rank = malloc(c->n_layer * sizeof *rank), *order = malloc((uint64_t)np * sizeof *order);
    int rc = rank && order ? JLM_OK : jlm_errf(err, JLM_ENOMEM, "out of memory");
    for (uint32_t l = 0; !rc && l < c->n_layer; l++)
        rank[l] = W(e, (int32_t)l, JLM_R_ROUTER) ? nmoe++ : UINT32_MAX;
    if (!rc && (uint64_t)nmoe * c->n_expert != np)
        rc = jlm_errf(err, JLM_EUNSUPPORTED, "%s: %u expert pages for %u MoE blocks of %u", e->m->path, np, nmoe,
                      c->n_expert);
    if (!rc && !(rc = jlm_routing_order(t, rank, np, order, err))) {
        free(e->warm_order);
        e->warm_order = order, e->n_warm_order = np;
        order = NULL;
    }
    free(rank);
    free(order);
    return rc;
}

/* The background read by rank (warm_pick), below a budget that holds the
 * model: xp bytes of expert pages, `free` bytes of frames for them beside
 * the text blocks; warm_quota their expert pages over the MoE blocks. */
static void warm_rank_open(jlm_engine *e, uint64_t xp, uint64_t free)
{
    const jlm_config *c = e->c;
    uint32_t np = expert_pages(e), nmoe = 0;
    for (uint32_t l = 0; l < c->n_layer; l++)
        nmoe += W(e, (int32_t)l, JLM_R_EXP_GATE) != NULL;
    double quota = np && nmoe ? (double)free / ((double)xp / np) / nmoe : 0.0;
    e->warm_rank = e->warm && e->warm_part && c->n_expert && e->warm_score && quota < 0.75 * c->n_expert;
    e->warm_quota = e->warm_rank ? (float)quota : 0.0f;
    e->warm_xpage = np ? (double)xp / np : 0.0;
    e->warm_nmoe = nmoe;
    e->warm_blk = 0;
    e->warm_l = UINT32_MAX;
}

void jlm_stream_open(jlm_engine *e, const jlm_engine_opts *o)
{
    e->rd_depth = o->no_prefetch ? 1 : o->read_depth ? o->read_depth : JLM_ENGINE_READ_DEPTH;
    jlm_pager_set_prefetch_depth(e->pager, e->rd_depth);
    e->pred_first = NO_PF;
    e->pred_cand = 2.0;   /* open at first: one of two paid */
    e->pred_paid = 1.0;
    uint64_t all = 0;
    const uint32_t arrays[2] = {JLM_PAGER_TEXT, JLM_PAGER_EXPERTS};
    for (int i = 0; i < 2; i++)
        for (uint32_t pg = 0; jlm_pager_extent(e->pager, arrays[i], pg); pg++)
            all += jlm_pager_extent(e->pager, arrays[i], pg);
    /* reads at once need slack: near the minimum working set a read's frame
     * would take an expert of the same block read just before (read twice) */
    uint32_t pins[3] = {2, 0, 2 * e->c->n_expert_used};
    uint64_t room = jlm_pager_min_budget(e->pager, pins);
    e->warm = !o->no_warm && !o->no_prefetch && e->rd_depth > 1 && (!e->budget || e->budget >= all ||
                                                                     e->budget >= 2 * room);
    e->warm_part = e->budget && e->budget < all;
    e->rd_par = e->rd_depth > 1 && (!e->budget || e->budget >= room);
    uint64_t blocks = 0;
    for (uint32_t pg = 0; jlm_pager_extent(e->pager, JLM_PAGER_TEXT, pg); pg++)
        blocks += jlm_pager_extent(e->pager, JLM_PAGER_TEXT, pg);
    warm_rank_open(e, all - blocks, e->budget > blocks ? e->budget - blocks : 0);
    e->by_op_on = e->budget && e->budget < blocks && !o->whole_blocks;
    e->predict = e->predict && e->rd_par;
    e->warm_at = 0;
}

/* ---------------------------------------------------------------- op by op */
/* Ops that read no weight of the page but their own operands (op->w): the
 * ones a block can be acquired op by op for. MoE (the router kept, the
 * shared experts), latent attention and the vision ops read others. */
static int op_own_weights(int kind)
{
    switch (kind) {
    case JLM_OP_NORM: case JLM_OP_QKV: case JLM_OP_KV_STORE: case JLM_OP_KEYS_DONE: case JLM_OP_Q:
    case JLM_OP_Q_ROPE: case JLM_OP_ATTENTION: case JLM_OP_MATMUL: case JLM_OP_RESIDUAL: case JLM_OP_GATE_UP:
        return 1;
    default:
        return 0;
    }
}

/* Bytes [*lo, *hi) of block l's page that op's weights take (every plane of
 * each); 0 when none is in the page (norms and biases are dense). */
static int op_span(const jlm_engine *e, uint32_t l, const jlm_op *op, uint64_t *lo, uint64_t *hi)
{
    *lo = UINT64_MAX;
    *hi = 0;
    for (int i = 0; i < JLM_OP_W; i++) {
        const jlm_tensor *t = op->w[i] ? W(e, (int32_t)l, op->w[i]) : NULL;
        jlm_tensor_loc loc;
        jlm_tensor_planes pl;
        if (!t)
            continue;
        jlm_fmt_tensor_loc(e->m, t, &loc);
        if (loc.region != JLM_REG_TEXT || loc.page != (int64_t)l || jlm_fmt_tensor_planes(t, &pl, NULL))
            continue;
        const uint64_t off[3] = {t->qs_off, t->d_off, t->sc_off}, len[3] = {pl.qs_len, pl.d_len, pl.sc_len};
        for (int k = 0; k < 3; k++) {
            if (!len[k])
                continue;
            if (off[k] - loc.page_off < *lo)
                *lo = off[k] - loc.page_off;
            if (off[k] - loc.page_off + len[k] > *hi)
                *hi = off[k] - loc.page_off + len[k];
        }
    }
    return *hi > 0;
}

/* The first op at or after k of block l's program p with weights in the
 * page; p->n if none. */
static uint32_t next_span(const jlm_engine *e, const jlm_prog *p, uint32_t l, uint32_t k, uint64_t *lo, uint64_t *hi)
{
    for (; k < p->n; k++)
        if (op_span(e, l, &p->op[k], lo, hi))
            return k;
    return p->n;
}

static const jlm_prog *block_prog(const jlm_engine *e, uint32_t l)
{
    return W(e, (int32_t)l, JLM_R_EXP_GATE) ? &e->prog_moe : &e->prog_dense;
}

/* Whether block l (program p, n rows) is acquired op by op: on the CPU,
 * under a budget below the blocks, one pass of the program (n <= nb: more
 * passes would read the released weights again) that reads only its ops'
 * own weights. */
static int by_op(const jlm_engine *e, const jlm_prog *p, uint32_t l, uint32_t n)
{
    if (!e->by_op_on || e->n_dev || n > e->nb)
        return 0;
    for (uint32_t k = 0; k < p->n; k++)
        if (!op_own_weights(p->op[k].kind))
            return 0;
    return 1;
}

int jlm_stream_op(jlm_engine *e, const jlm_prog *p, uint32_t l, uint32_t k, jlm_err *err)
{
    uint64_t lo, hi;
    if (!op_span(e, l, &p->op[k], &lo, &hi))
        return JLM_OK;
    int rc = jlm_pager_advance(e->pager, JLM_PAGER_TEXT, l, lo, hi - lo, err);
    if (rc)
        return jlm_err_prefix(err, rc, "%s: block %u", e->m->path, l);
    /* the next op's weights are read while this one computes: in this
     * block, or the next block's first (block 0 of the next pass after the
     * last) if that one goes op by op too (otherwise its whole page is read
     * ahead at its own get) */
    uint32_t nk = next_span(e, p, l, k + 1, &lo, &hi), nl = l;
    if (nk == p->n) {
        nl = l + 1 < e->c->n_layer ? l + 1 : 0;
        const jlm_prog *np = block_prog(e, nl);
        if (!by_op(e, np, nl, 1) || (nk = next_span(e, np, nl, 0, &lo, &hi)) == np->n)
            return JLM_OK;
    }
    jlm_pager_prefetch_range(e->pager, JLM_PAGER_TEXT, nl, lo, hi - lo);
    return JLM_OK;
}

/* ---------------------------------------------------------------- blocks */
int jlm_stream_block(jlm_engine *e, uint32_t l, const jlm_prog *p, uint32_t n, const uint8_t **page, jlm_err *err)
{
    e->warm_pass |= e->warm_l != UINT32_MAX && l <= e->warm_l;   /* the layers went round once */
    e->warm_l = l;
    const void *host;
    uint64_t ext = jlm_pager_extent(e->pager, JLM_PAGER_TEXT, l);
    if (by_op(e, p, l, n)) {   /* pinned with its first op's weights; the ops advance through it */
        uint64_t lo = 0, hi = 0;
        if (next_span(e, p, l, 0, &lo, &hi) == p->n)
            lo = hi = 0;
        int rc = jlm_pager_get(e->pager, JLM_PAGER_TEXT, l, lo, hi - lo, &host, err);
        if (rc)
            return jlm_err_prefix(err, rc, "%s: block %u", e->m->path, l);
        e->dev_here = NULL;
        e->by_op = l + 1;
        *page = (const uint8_t *)host - lo;
        return JLM_OK;
    }
    int rc = jlm_pager_get(e->pager, JLM_PAGER_TEXT, l, 0, ext, &host, err);
    if (rc)
        return jlm_err_prefix(err, rc, "%s: block %u", e->m->path, l);
    /* the block after this one (block 0 of the next pass after the last)
     * is read while this one computes (docs/pager.md, Prefetch) */
    jlm_pager_prefetch(e->pager, JLM_PAGER_TEXT, l + 1 < e->c->n_layer ? l + 1 : 0);
    warm_step(e);
    e->dev_here = block_dev(e, l);
    if (e->pf_block != NO_PF && (e->pf_block != l || !e->dev_here))
        jlm_eng_prefetch_end(e);   /* not the block it was started for */
    if (e->dev_here)
        rc = jlm_dev_page_get(e->dev_here, JLM_PAGER_TEXT, l, JLM_PAGER_BLOCK, host, ext, err);
    if (e->pf_block == l) {   /* the device get consumed the prefetch: its host pin goes */
        jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, l);
        e->pf_block = NO_PF;
    }
    if (rc) {
        jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, l);
        return jlm_err_prefix(err, rc, "%s: block %u on the device", e->m->path, l);
    }
    dev_prefetch_next(e, l);   /* also from a CPU block: the device after the wrap */
    *page = host;
    return JLM_OK;
}

void jlm_stream_block_done(jlm_engine *e, uint32_t l)
{
    e->by_op = 0;
    if (e->dev_here)
        jlm_dev_page_put(e->dev_here, JLM_PAGER_TEXT, l);
    jlm_pager_unpin(e->pager, JLM_PAGER_TEXT, l);
}

void jlm_stream_finish(jlm_engine *e, int rc)
{
    if (rc)
        jlm_eng_prefetch_end(e);
    e->dev_here = e->out_dev;
}

int jlm_stream_page(jlm_engine *e, uint32_t array, uint32_t page, const uint8_t **host, jlm_err *err)
{
    const void *h;
    int rc = jlm_pager_get(e->pager, array, page, 0, jlm_pager_extent(e->pager, array, page), &h, err);
    if (!rc)
        *host = h;
    return rc;
}

void jlm_stream_page_done(jlm_engine *e, uint32_t array, uint32_t page)
{
    jlm_pager_unpin(e->pager, array, page);
}

/* ---------------------------------------------------------------- experts */
static int expert_whole(const jlm_engine *e, uint32_t pg)
{
    return jlm_pager_filled(e->pager, JLM_PAGER_EXPERTS, pg) >= jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg);
}

/* The read-ahead's gate: its counts' decay a candidate (a window of about
 * 32 candidates, a few tokens' worth). */
#define PRED_DECAY (31.0 / 32.0)

/* While the gate is shut, the predictions made (one call in PRED_SAMPLE). */
#define PRED_SAMPLE 8u

static int gate_open(const jlm_engine *e) { return 2 * e->pred_paid >= e->pred_cand; }

int jlm_stream_predict_now(jlm_engine *e)
{
    return gate_open(e) || e->pred_tick++ % PRED_SAMPLE == 0;
}

/* The prediction for the bank at `first` (jlm_stream_predict) meets the
 * experts routed there (sel[0..n); none: n 0, a prediction replaced). */
static void predict_met(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n)
{
    if (e->pred_first == NO_PF || e->pred_first != first)
        return;
    for (uint32_t i = 0; i < e->c->n_expert_used; i++) {
        int routed = 0;
        for (uint32_t s = 0; s < n && !routed; s++)
            routed = sel[s] == e->pred_sel[i];
        e->pst.hits += (uint64_t)routed;
        if (e->pred_read[i]) {   /* a candidate for a read ahead, read or not: the gate learns */
            e->pred_cand = e->pred_cand * PRED_DECAY + 1.0;
            e->pred_paid = e->pred_paid * PRED_DECAY + routed;
        }
        if (e->pred_read[i] == 1 && routed)
            e->pst.used++;
        else if (e->pred_read[i] == 1)
            e->pst.wasted_bytes += jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, first + (uint32_t)e->pred_sel[i]);
    }
    e->pred_first = NO_PF;
}

/* The more likely half of the predicted experts is read (sel is in the
 * order of the predicted router's logits): on moe-1g at a 25% budget the
 * reads of the other half were used 1 time in 3 and read 2x the bytes
 * (docs/bench.md, Expert reads). And only while reading ahead pays: a
 * predicted expert not resident (a candidate) is read when at least half of
 * the recent candidates, read or not, were routed to (counts decaying by
 * PRED_DECAY a candidate; the first ones are read). A wasted read costs its
 * bytes and the expert it evicted; a used one only moved a read earlier. */
void jlm_stream_predict(jlm_engine *e, uint32_t first, const int32_t *sel)
{
    predict_met(e, e->pred_first, NULL, 0);   /* one no block met: all its reads wasted */
    uint32_t nu = e->c->n_expert_used;
    int open = gate_open(e);
    e->pred_first = first;
    for (uint32_t i = 0; i < nu; i++) {
        uint32_t pg = first + (uint32_t)sel[i];
        e->pred_sel[i] = sel[i];
        e->pred_read[i] = 0;
        if (i >= (nu + 1) / 2 || expert_whole(e, pg))
            continue;
        if (!open)
            e->pred_read[i] = 2;
        else if (jlm_pager_prefetch(e->pager, JLM_PAGER_EXPERTS, pg) > 0)
            e->pred_read[i] = 1;
        e->pst.reads += e->pred_read[i] == 1;
        e->pst.held += e->pred_read[i] == 2;
    }
    e->pst.predicted += nu;
}

void jlm_engine_predict_stats(const jlm_engine *e, jlm_engine_predict *out)
{
    *out = e->pst;
}

/* Unpins the host pages of the experts marked in got and the first dev on
 * the block's device. */
static void experts_put(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n, const uint8_t *got,
                        uint32_t dev)
{
    for (uint32_t s = 0; s < dev; s++)
        jlm_dev_page_put(e->dev_here, JLM_PAGER_EXPERTS, first + (uint32_t)sel[s]);
    for (uint32_t s = 0; s < n; s++)
        if (!got || got[s])
            jlm_pager_unpin(e->pager, JLM_PAGER_EXPERTS, first + (uint32_t)sel[s]);
}

/* Every expert on the host first, then on the block's device: the minimum
 * working set counts n_expert_used of them pinned together. begin pins the
 * resident ones (ready[s] = 1: no read below can take them) and, with slack
 * in the budget (rd_par), on the CPU or a device, starts the reads of every missing one
 * at once on the pager's readers (rd_depth at a time). end gets the rest (a
 * get waits for its read, or reads), then pins every one on the block's
 * device. An error unpins everything. */
int jlm_stream_experts_begin(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n, const void **frames,
                             uint8_t *ready, jlm_err *err)
{
    if (n > JLM_MAX_EXPERTS_USED)
        return jlm_errf(err, JLM_EINVAL, "%u experts at once: at most %u", n, JLM_MAX_EXPERTS_USED);
    predict_met(e, first, sel, n);
    int rc = JLM_OK;
    for (uint32_t s = 0; s < n; s++) {
        uint32_t pg = first + (uint32_t)sel[s];
        ready[s] = 0;
        if (!rc && expert_whole(e, pg)) {
            rc = jlm_pager_get(e->pager, JLM_PAGER_EXPERTS, pg, 0, jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg),
                               &frames[s], err);
            ready[s] = !rc;
        }
    }
    if (rc) {
        experts_put(e, first, sel, n, ready, 0);
        return rc;
    }
    for (uint32_t s = 0; e->rd_par && s < n; s++)
        if (!ready[s])
            jlm_pager_prefetch(e->pager, JLM_PAGER_EXPERTS, first + (uint32_t)sel[s]);
    return JLM_OK;
}

int jlm_stream_experts_end(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n, const void **frames,
                           uint8_t *ready, jlm_err *err)
{
    uint32_t dpinned = 0;
    int rc = JLM_OK;
    for (uint32_t s = 0; s < n && !rc; s++) {
        uint32_t pg = first + (uint32_t)sel[s];
        if (ready[s])
            continue;
        rc = jlm_pager_get(e->pager, JLM_PAGER_EXPERTS, pg, 0, jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg),
                           &frames[s], err);
        ready[s] = !rc;
    }
    for (; !rc && e->dev_here && dpinned < n; dpinned++) {   /* expert pages follow their block's backend */
        uint32_t pg = first + (uint32_t)sel[dpinned];
        if ((rc = jlm_dev_page_get(e->dev_here, JLM_PAGER_EXPERTS, pg, JLM_PAGER_EXPERT, frames[dpinned],
                                   jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg), err)))
            break;
    }
    if (rc)
        experts_put(e, first, sel, n, ready, dpinned);
    warm_step(e);
    return rc;
}

int jlm_stream_experts(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n, const void **frames,
                       jlm_err *err)
{
    uint8_t ready[JLM_MAX_EXPERTS_USED];
    int rc = jlm_stream_experts_begin(e, first, sel, n, frames, ready, err);
    return rc ? rc : jlm_stream_experts_end(e, first, sel, n, frames, ready, err);
}

void jlm_stream_experts_done(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n)
{
    experts_put(e, first, sel, n, NULL, e->dev_here ? n : 0);
}

/* Only when it fits the budget beside everything resident: a read ahead
 * that evicted would take an expert this batch or the next block may still
 * want. */
void jlm_stream_expert_next(jlm_engine *e, uint32_t page)
{
    uint64_t ext = jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, page);
    if (jlm_pager_filled(e->pager, JLM_PAGER_EXPERTS, page) >= ext)
        return;
    jlm_pager_counters pc;
    jlm_pager_stats(e->pager, &pc);
    if (!pc.budget || pc.resident_bytes + jlm_pager_charge(e->pager, JLM_PAGER_EXPERTS, page) <= pc.budget)
        jlm_pager_prefetch(e->pager, JLM_PAGER_EXPERTS, page);
}
