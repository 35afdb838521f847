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
/* While the budget holds every page: the pages not yet resident read in
 * file order (the text blocks, then the experts) on the pager's readers,
 * as many at once as it takes, so a first run reads the model at the disk's
 * bandwidth instead of page by page on first use. warm_at: array << 32 |
 * page of the next one. A page in use or on its way is passed over (its
 * get reads it). */
static void warm_step(jlm_engine *e)
{
    while (e->warm) {
        uint32_t a = (uint32_t)(e->warm_at >> 32), pg = (uint32_t)e->warm_at;
        if (!jlm_pager_extent(e->pager, a, pg)) {   /* past the array's end */
            e->warm = a == JLM_PAGER_TEXT;
            e->warm_at = (uint64_t)JLM_PAGER_EXPERTS << 32;
            continue;
        }
        if (jlm_pager_prefetch(e->pager, a, pg) < 0)
            return;   /* every reader busy: the next call goes on */
        e->warm_at++;
    }
}

void jlm_stream_open(jlm_engine *e, const jlm_engine_opts *o)
{
    e->rd_depth = o->no_prefetch ? 1 : o->read_depth ? o->read_depth : JLM_ENGINE_READ_DEPTH;
    jlm_pager_set_prefetch_depth(e->pager, e->rd_depth);
    e->pred_first = NO_PF;
    uint64_t all = 0;
    const uint32_t arrays[2] = {JLM_PAGER_TEXT, JLM_PAGER_EXPERTS};
    for (int i = 0; i < 2; i++)
        for (uint32_t pg = 0; jlm_pager_extent(e->pager, arrays[i], pg); pg++)
            all += jlm_pager_extent(e->pager, arrays[i], pg);
    e->warm = !o->no_warm && !o->no_prefetch && e->rd_depth > 1 && (!e->budget || e->budget >= all);
    /* reads at once need slack: near the minimum working set a read's frame
     * would take an expert of the same block read just before (read twice) */
    uint32_t pins[3] = {2, 0, 2 * e->c->n_expert_used};
    e->rd_par = e->rd_depth > 1 && (!e->budget || e->budget >= jlm_pager_min_budget(e->pager, pins));
    e->predict = e->predict && e->rd_par;
    e->warm_at = 0;
}

/* ---------------------------------------------------------------- blocks */
int jlm_stream_block(jlm_engine *e, uint32_t l, const uint8_t **page, jlm_err *err)
{
    const void *host;
    uint64_t ext = jlm_pager_extent(e->pager, JLM_PAGER_TEXT, l);
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
        if (e->pred_read[i] && routed)
            e->pst.used++;
        else if (e->pred_read[i])
            e->pst.wasted_bytes += jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, first + (uint32_t)e->pred_sel[i]);
    }
    e->pred_first = NO_PF;
}

/* The more likely half of the predicted experts is read (sel is in the
 * order of the predicted router's logits): on moe-1g at a 25% budget the
 * reads of the other half were used 1 time in 3 and read 2x the bytes
 * (docs/bench.md, Expert reads). */
void jlm_stream_predict(jlm_engine *e, uint32_t first, const int32_t *sel)
{
    predict_met(e, e->pred_first, NULL, 0);   /* one no block met: all its reads wasted */
    uint32_t nu = e->c->n_expert_used;
    e->pred_first = first;
    for (uint32_t i = 0; i < nu; i++) {
        e->pred_sel[i] = sel[i];
        e->pred_read[i] = i < (nu + 1) / 2 && jlm_pager_prefetch(e->pager, JLM_PAGER_EXPERTS, first + (uint32_t)sel[i]) > 0;
        e->pst.reads += e->pred_read[i];
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
    if (!pc.budget || pc.resident_bytes + ext <= pc.budget)
        jlm_pager_prefetch(e->pager, JLM_PAGER_EXPERTS, page);
}
