/* stream.c - the streamer: every page the layer loop computes on passes
 * through here, acquire -> compute -> release (exec_int.h). A block's page
 * is pinned on the host (the pager) and, for a block a device backend runs,
 * on that device (its frames, engine/devframes.h); the next block is read
 * ahead on the pager's thread and, on a device with a copy thread (CUDA),
 * copied ahead while this block computes; an expert page follows its
 * block's backend, and a grouped batch names the next expert it will want
 * so that it is read while the current one computes. The layer loop
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
static void experts_put(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t host, uint32_t dev)
{
    for (uint32_t s = 0; s < dev; s++)
        jlm_dev_page_put(e->dev_here, JLM_PAGER_EXPERTS, first + (uint32_t)sel[s]);
    for (uint32_t s = 0; s < host; s++)
        jlm_pager_unpin(e->pager, JLM_PAGER_EXPERTS, first + (uint32_t)sel[s]);
}

/* Every expert on the host first, then on the block's device: the minimum
 * working set counts n_expert_used of them pinned together. */
int jlm_stream_experts(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n, const void **frames,
                       jlm_err *err)
{
    uint32_t pinned = 0, dpinned = 0;
    int rc = JLM_OK;
    for (; pinned < n; pinned++) {
        uint32_t pg = first + (uint32_t)sel[pinned];
        if ((rc = jlm_pager_get(e->pager, JLM_PAGER_EXPERTS, pg, 0, jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg),
                                &frames[pinned], err)))
            break;
    }
    for (; !rc && e->dev_here && dpinned < pinned; dpinned++) {   /* expert pages follow their block's backend */
        uint32_t pg = first + (uint32_t)sel[dpinned];
        if ((rc = jlm_dev_page_get(e->dev_here, JLM_PAGER_EXPERTS, pg, JLM_PAGER_EXPERT, frames[dpinned],
                                   jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, pg), err)))
            break;
    }
    if (rc)
        experts_put(e, first, sel, pinned, dpinned);
    return rc;
}

void jlm_stream_experts_done(jlm_engine *e, uint32_t first, const int32_t *sel, uint32_t n)
{
    experts_put(e, first, sel, n, e->dev_here ? n : 0);
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
