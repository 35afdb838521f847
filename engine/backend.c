/* backend.c - the device backend interface's common half (backend.h). */
#include "engine/backend.h"
#include "engine/prog.h"

#include <string.h>

void jlm_dev_close(jlm_dev *d)
{
    if (!d)
        return;
    jlm_dev_prefetch_end(d);
    jlm_dframes_free(&d->frames);
    d->ops->close(d);
}

const char *jlm_dev_kind(const jlm_dev *d) { return d->ops->kind; }
const char *jlm_dev_name(const jlm_dev *d) { return d->ops->device(d); }

void jlm_dev_set_budget(jlm_dev *d, uint64_t budget) { jlm_dframes_set_budget(&d->frames, budget); }
uint64_t jlm_dev_default_budget(const jlm_dev *d) { return d->ops->default_budget(d); }
void jlm_dev_set_dense(jlm_dev *d, const void *host, uint64_t len) { jlm_dframes_set_dense(&d->frames, host, len); }

/* The started prefetch's copy has read its host frame and the device waits
 * for it: the prefetch's own pin goes; a failed copy's frame is dropped once
 * no pin holds it (the get that found it resident lets go first). */
static int prefetch_done(jlm_dev *d, jlm_err *err)
{
    int rc = d->ops->prefetch_wait(d, err);
    jlm_dframes_put(&d->frames, d->pf_array, d->pf_page);
    d->pf_on = 0;
    return rc;
}

int jlm_dev_page_get(jlm_dev *d, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len,
                     jlm_err *err)
{
    int rc = jlm_dframes_get(&d->frames, array, page, cls, host, len, err);
    if (rc || !d->pf_on || array != d->pf_array || page != d->pf_page)
        return rc;
    if ((rc = prefetch_done(d, err))) {
        jlm_dframes_put(&d->frames, array, page);
        jlm_dframes_discard(&d->frames, array, page);
    }
    return rc;
}

int jlm_dev_prefetch(jlm_dev *d, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len)
{
    if (!d->ops->prefetch_wait || d->pf_on || !jlm_dframes_prefetch(&d->frames, array, page, cls, host, len))
        return 0;
    d->pf_on = 1;
    d->pf_array = array;
    d->pf_page = page;
    return 1;
}

void jlm_dev_prefetch_end(jlm_dev *d)
{
    if (!d || !d->pf_on)
        return;
    uint32_t a = d->pf_array, p = d->pf_page;
    if (prefetch_done(d, NULL))
        jlm_dframes_discard(&d->frames, a, p);
}

void jlm_dev_page_put(jlm_dev *d, uint32_t array, uint32_t page) { jlm_dframes_put(&d->frames, array, page); }

void jlm_dev_host_evicted(void *ctx, uint32_t array, uint32_t page, void *frame)
{
    jlm_dev *d = ctx;
    jlm_dframes_host_evicted(&d->frames, array, page, frame);
}

int jlm_dev_matmul(jlm_dev *d, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq, float *y,
                   jlm_err *err)
{
    return d->ops->matmul(d, m, n, x, xq, y, err);
}

int jlm_dev_matmul_multi(jlm_dev *d, const jlm_k_mat *const *ms, int nm, uint32_t n, const float *x,
                         const jlm_act_q8 *xq, float *const *ys, jlm_err *err)
{
    return d->ops->matmul_multi ? d->ops->matmul_multi(d, ms, nm, n, x, xq, ys, err) : 1;
}

void jlm_dev_stats_get(const jlm_dev *d, jlm_dev_stats *out)
{
    memset(out, 0, sizeof *out);
    d->ops->stats(d, out);
    const jlm_dframes *f = &d->frames;
    out->kind = d->ops->kind;
    out->page_ins = f->page_ins;
    out->hits = f->hits;
    out->evictions = f->evictions;
    out->prefetches = f->prefetches;
    out->frames = f->frames;
    out->resident_bytes = f->resident;
    out->peak_bytes = f->peak;
    out->budget = f->budget;
}

void jlm_dev_stats_reset(jlm_dev *d)
{
    jlm_dframes *f = &d->frames;
    f->page_ins = f->hits = f->evictions = f->prefetches = 0;
    f->peak = f->resident;
    d->ops->stats_reset(d);
}

/* ---------------------------------------------------------------- profiling */

static void prof_base(jlm_dev *d)
{
    jlm_dev_stats s;
    jlm_dev_stats_get(d, &s);
    d->prof_k0 = s.kernel_ns;
    d->prof_x0 = s.xfer_ns;
}

void jlm_dev_profile(jlm_dev *d, int on)
{
    d->prof_timed = on && d->ops->prof_on && d->ops->prof_on(d, 1) == 0;
    if (!on && d->ops->prof_on)
        d->ops->prof_on(d, 0);
    d->prof = on;
    prof_base(d);
}

void jlm_dev_prof_reset(jlm_dev *d)
{
    if (d->prof_timed)
        d->ops->prof_on(d, 1);
    prof_base(d);
}

/* a counter since the reset; one reset since (jlm bench resets the stats): all of it */
static uint64_t since(uint64_t now, uint64_t base) { return now >= base ? now - base : now; }

void jlm_dev_prof_get(jlm_dev *d, jlm_dev_prof *out)
{
    memset(out, 0, sizeof *out);
    jlm_dev_stats s;
    jlm_dev_stats_get(d, &s);
    uint64_t k = since(s.kernel_ns, d->prof_k0), host = k + since(s.xfer_ns, d->prof_x0), dev = 0;
    if (d->prof_timed) {
        out->timed = 1;
        d->ops->prof_get(d, out->ns);
    } else if (!d->ops->prof_on) {   /* matmul offload only: its kernels' calls, timed on the host */
        out->timed = out->host_timed = 1;
        out->ns[JLM_DEVP_MATMUL] = k;
    }
    for (int i = 0; i < JLM_DEVP_XFER; i++)
        dev += out->ns[i];
    out->ns[JLM_DEVP_XFER] = host > dev ? host - dev : 0;
}

int jlm_dev_op_class(int op_kind)
{
    switch (op_kind) {
    case JLM_OP_QKV: case JLM_OP_Q: case JLM_OP_MATMUL: case JLM_OP_GATE_UP: case JLM_OP_MOE:
    case JLM_OP_MLA_KV: case JLM_OP_MLA_Q:
        return JLM_DEVP_MATMUL;
    case JLM_OP_ATTENTION: case JLM_OP_SELF_ATTN: case JLM_OP_MLA_ATTN:
        return JLM_DEVP_ATTN;
    default:
        return JLM_DEVP_NORM;
    }
}
