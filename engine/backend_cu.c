/* backend_cu.c - the engine's CUDA backend: device frames copied through
 * pinned staging on a copy stream, matvec on a compute stream
 * (backend_cu.h). */
#include "engine/backend_cu_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/jlm_format.h"
#include "kernels/cuda/cuda.h"

#define STAGE_BYTES (8ull << 20)   /* per staging buffer; two alternate (JLM_CUDA_STAGE_KIB: tests) */
enum { JOB_NONE, JOB_QUEUED, JOB_DONE };

uint64_t jlm_ecu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define now_ns jlm_ecu_now_ns
#define rt_fail jlm_ecu_fail
#define grow jlm_ecu_grow

int jlm_ecu_fail(jlm_ecu *v, jlm_err *err, const char *what)
{
    return jlm_errf(err, JLM_EIO, "cuda backend: %s: %s", what, jlm_cu_rt_error(v->rt));
}

int jlm_ecu_drain(jlm_ecu *v, jlm_err *err)
{
    if (!v->blk.queued)
        return JLM_OK;
    uint64_t t0 = now_ns();
    v->blk.queued = 0;
    int rc = jlm_cu_rt_sync(v->rt, JLM_CU_S_COMPUTE) ? rt_fail(v, err, "the block's kernels") : JLM_OK;
    v->st.kernel_ns += now_ns() - t0;
    v->st.waits++;
    return rc;
}

int jlm_ecu_frames_wait(jlm_ecu *v, jlm_err *err)
{
    if (!v->frames_pending)
        return JLM_OK;
    if (jlm_cu_rt_wait(v->rt, JLM_CU_S_COMPUTE, EV_FRAMES))
        return rt_fail(v, err, "waiting for the page-ins");
    v->frames_pending = 0;
    return JLM_OK;
}

/* len bytes of host into device memory dev on the copy stream, through the
 * staging buffers, then event ev recorded behind the last chunk: a buffer is
 * refilled only after its previous copy ran. Called by the graph's thread
 * and the copy thread: each chunk takes the staging lock, so the two
 * interleave chunk by chunk on the one copy stream. */
static int copy_in(jlm_ecu *v, void *dev, const void *host, uint64_t len, int ev, jlm_err *err)
{
    int rc = JLM_OK;
    for (uint64_t off = 0; off < len && !rc;) {
        uint64_t c = len - off < v->stage_bytes ? len - off : v->stage_bytes;
        pthread_mutex_lock(&v->mu);
        int i = v->next;
        if (v->stage_busy[i] && jlm_cu_rt_event_sync(v->rt, EV_STAGE + i)) {
            rc = rt_fail(v, err, "staging");
        } else {
            memcpy(v->stage[i], (const uint8_t *)host + off, c);
            if (jlm_cu_rt_h2d(v->rt, (uint8_t *)dev + off, v->stage[i], c, JLM_CU_S_COPY) ||
                jlm_cu_rt_record(v->rt, EV_STAGE + i, JLM_CU_S_COPY)) {
                rc = rt_fail(v, err, "page-in copy");
            } else {
                v->stage_busy[i] = 1;
                v->next = i ^ 1;
                v->bytes_up += c;
            }
        }
        pthread_mutex_unlock(&v->mu);
        off += c;
    }
    if (!rc) {
        pthread_mutex_lock(&v->mu);
        if (jlm_cu_rt_record(v->rt, ev, JLM_CU_S_COPY))
            rc = rt_fail(v, err, "page-in event");
        pthread_mutex_unlock(&v->mu);
    }
    return rc;
}

/* The graph's own page-in: the compute stream waits for it before the next
 * launch. */
static int copy_now(jlm_ecu *v, void *dev, const void *host, uint64_t len, jlm_err *err)
{
    uint64_t t0 = now_ns();
    int rc = copy_in(v, dev, host, len, EV_FRAMES, err);
    if (!rc)
        v->frames_pending = 1;
    v->st.xfer_ns += now_ns() - t0;
    return rc;
}

/* ---------------------------------------------------------------- the copy thread */

/* The job's copy, then its outcome for ecu_prefetch_wait (jmu not held). */
static void run_job(jlm_ecu *v, const cu_job *j)
{
    jlm_err e = {0};
    int rc = copy_in(v, j->dev, j->host, j->len, EV_PF, &e);
    pthread_mutex_lock(&v->jmu);
    v->job.rc = rc;
    v->job.err = e;
    v->job.state = JOB_DONE;
    pthread_cond_broadcast(&v->jcv);
    pthread_mutex_unlock(&v->jmu);
}

static void *copier(void *arg)
{
    jlm_ecu *v = arg;
    pthread_mutex_lock(&v->jmu);
    for (;;) {
        while (!v->stop && v->job.state != JOB_QUEUED)
            pthread_cond_wait(&v->jcv, &v->jmu);
        if (v->stop)
            break;
        cu_job j = v->job;
        pthread_mutex_unlock(&v->jmu);
        run_job(v, &j);
        pthread_mutex_lock(&v->jmu);
    }
    pthread_mutex_unlock(&v->jmu);
    return NULL;
}

/* Queues the prefetch's copy for the copy thread (started on first use);
 * without a thread, copies here (the prefetch then overlaps nothing). */
static void queue_job(jlm_ecu *v, void *dev, const void *host, uint64_t len)
{
    pthread_mutex_lock(&v->jmu);
    if (!v->thr_on && pthread_create(&v->thr, NULL, copier, v) == 0)
        v->thr_on = 1;
    v->job = (cu_job){dev, host, len, JOB_QUEUED, 0, {0}};
    cu_job j = v->job;
    if (v->thr_on)
        pthread_cond_broadcast(&v->jcv);
    pthread_mutex_unlock(&v->jmu);
    if (!v->thr_on)
        run_job(v, &j);
}

static int ecu_prefetch_wait(jlm_dev *dev, jlm_err *err)
{
    jlm_ecu *v = (jlm_ecu *)dev;
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&v->jmu);
    while (v->job.state == JOB_QUEUED)
        pthread_cond_wait(&v->jcv, &v->jmu);
    int rc = v->job.state == JOB_DONE ? v->job.rc : JLM_OK;
    if (rc && err)
        *err = v->job.err;
    v->job.state = JOB_NONE;
    pthread_mutex_unlock(&v->jmu);
    v->st.xfer_ns += now_ns() - t0;   /* the graph's wait only: the copy itself overlapped */
    if (!rc && jlm_cu_rt_wait(v->rt, JLM_CU_S_COMPUTE, EV_PF))
        rc = rt_fail(v, err, "waiting for the prefetched page");
    return rc;
}

/* ---------------------------------------------------------------- device frames */

#define SPARES ((int)(sizeof ((jlm_ecu *)0)->spare / sizeof ((jlm_ecu *)0)->spare[0]))

/* Device memory for a frame of len bytes: a kept one of about that size
 * (block frames differ by their extents only), else a new one; its size in
 * *cap. Every kernel that read a kept frame has finished: each matmul waits
 * for its result before the graph goes on, and a frame dropped while a
 * whole block's kernels are queued waits for them first (drop). */
static int frame_alloc(jlm_ecu *v, uint64_t len, void **p, uint64_t *cap, jlm_err *err)
{
    for (int i = 0; i < v->nspare; i++)
        if (v->spare[i].cap >= len && v->spare[i].cap - len <= v->spare[i].cap / 8) {
            *p = v->spare[i].p;
            *cap = v->spare[i].cap;
            v->spare[i] = v->spare[--v->nspare];
            return JLM_OK;
        }
    if (jlm_cu_rt_alloc(v->rt, len, p))
        return jlm_errf(err, JLM_ENOMEM, "cuda backend: a %llu-byte device frame: %s", (unsigned long long)len,
                        jlm_cu_rt_error(v->rt));
    *cap = len;
    return JLM_OK;
}

static void frame_free(jlm_ecu *v, void *p, uint64_t cap)
{
    if (v->nspare < SPARES) {
        v->spare[v->nspare].p = p;
        v->spare[v->nspare++].cap = cap;
    } else {
        jlm_cu_rt_free(v->rt, p);
    }
}

static int page_in(void *ctx, jlm_dframe *d, const void *host, uint64_t len, jlm_err *err)
{
    jlm_ecu *v = ctx;
    void *p = NULL;
    uint64_t cap = 0;
    int rc = frame_alloc(v, len, &p, &cap, err);
    if (rc)
        return rc;
    d->tag = cap;
    if (v->dev.frames.async) {   /* a prefetch: the copy thread copies, ecu_prefetch_wait orders */
        queue_job(v, p, host, len);
        d->buf = p;
        return JLM_OK;
    }
    if ((rc = copy_now(v, p, host, len, err))) {
        frame_free(v, p, cap);
        return rc;
    }
    d->buf = p;
    return JLM_OK;
}

static void drop(void *ctx, jlm_dframe *d)
{
    jlm_ecu *v = ctx;
    jlm_ecu_drain(v, NULL);   /* queued kernels may read it (an error shows at the next wait) */
    frame_free(v, d->buf, d->tag);
}

static const jlm_dframes_ops FRAME_OPS = {page_in, drop};

/* ---------------------------------------------------------------- scratch */

void jlm_ecu_scratch_free(jlm_ecu *v, scratch *s, int pinned)
{
    if (pinned)
        jlm_cu_rt_host_free(v->rt, s->p);
    else
        jlm_cu_rt_free(v->rt, s->p);
    s->p = NULL;
    s->cap = 0;
}

int jlm_ecu_grow(jlm_ecu *v, scratch *s, uint64_t n, int pinned, jlm_err *err)
{
    if (s->cap >= n)
        return JLM_OK;
    jlm_ecu_scratch_free(v, s, pinned);
    uint64_t c = n + n / 4;
    if (pinned ? jlm_cu_rt_host_alloc(v->rt, c, &s->p) : jlm_cu_rt_alloc(v->rt, c, &s->p))
        return jlm_errf(err, JLM_ENOMEM, "cuda backend: %llu bytes of %s scratch: %s", (unsigned long long)c,
                        pinned ? "pinned host" : "device", jlm_cu_rt_error(v->rt));
    s->cap = c;
    return JLM_OK;
}

/* The device address of plane bytes [p, p+n): in a pinned frame (or the
 * dense region), else copied into scratch s for this call (*re = 1). */
static int plane(jlm_ecu *v, const void *p, uint64_t n, int s, const void **out, int *re, jlm_err *err)
{
    if (!n) {
        *out = NULL;
        return JLM_OK;
    }
    jlm_dframe *f = jlm_dframes_frame_of(&v->dev.frames, p, n, err);
    if (f) {
        *out = (const uint8_t *)f->buf + ((const uint8_t *)p - f->host);
        return JLM_OK;
    }
    int rc = grow(v, &v->d[s], n, 0, err);
    if (!rc)
        rc = copy_now(v, v->d[s].p, p, n, err);
    *out = v->d[s].p;
    *re = 1;
    return rc;
}

/* ---------------------------------------------------------------- matmul */

/* Tokens [0, n) of nm matrices sharing their input: the activations in one
 * copy (act records, codes, scales, sums; or floats), one launch per matrix,
 * the results back in one copy, then the host waits once. */
static int tokens(jlm_ecu *v, const jlm_cu_mat *cms, int nm, uint32_t n, const float *x, const jlm_act_q8 *xq,
                  float *const *ys, jlm_err *err)
{
    uint64_t k = cms[0].k, rec = (uint64_t)n * sizeof(jlm_cu_act), ylen = 0;
    uint64_t act = xq ? rec + (uint64_t)n * (k + k / 8 + k / 8) : (uint64_t)n * k * 4;
    for (int i = 0; i < nm; i++)
        ylen += (uint64_t)n * cms[i].rows * 4;
    int rc;
    if ((rc = grow(v, &v->d[D_ACT], act, 0, err)) || (rc = grow(v, &v->h_act, act, 1, err)) ||
        (rc = grow(v, &v->d[D_Y], ylen, 0, err)) || (rc = grow(v, &v->h_y, ylen, 1, err)))
        return rc;
    uint64_t t0 = now_ns();
    uint8_t *h = v->h_act.p, *dv = v->d[D_ACT].p;
    if (xq) {
        jlm_cu_act *r = (jlm_cu_act *)(void *)h;
        uint64_t q = rec, dd = q + (uint64_t)n * k, ss = dd + (uint64_t)n * (k / 8);
        for (uint32_t t = 0; t < n; t++) {
            memcpy(h + q + t * k, xq[t].q, k);
            memcpy(h + dd + t * (k / 8), xq[t].d, k / 8);     /* k/32 floats */
            memcpy(h + ss + t * (k / 8), xq[t].sum16, k / 8); /* k/16 int16 */
            r[t] = (jlm_cu_act){k, (int8_t *)(dv + q + t * k), (float *)(void *)(dv + dd + t * (k / 8)),
                                (int16_t *)(void *)(dv + ss + t * (k / 8))};
        }
    } else {
        memcpy(h, x, act);
    }
    if (jlm_cu_rt_h2d(v->rt, dv, h, act, JLM_CU_S_COMPUTE))
        return rt_fail(v, err, "activations");
    v->st.act_up += act;
    if ((rc = jlm_ecu_frames_wait(v, err)))
        return rc;
    uint64_t t1 = now_ns();
    v->st.xfer_ns += t1 - t0;
    float *dy = v->d[D_Y].p;
    jlm_dev_prof_op(&v->dev, JLM_DEVP_MATMUL);
    for (int i = 0; i < nm; i++) {
        if (jlm_cu_rt_matvec(v->rt, &cms[i], n, xq ? NULL : (const float *)(void *)dv,
                             xq ? (const jlm_cu_act *)(void *)dv : NULL, dy, JLM_CU_S_COMPUTE))
            return rt_fail(v, err, "matvec");
        dy += (uint64_t)n * cms[i].rows;
    }
    jlm_dev_prof_op(&v->dev, JLM_DEVP_XFER);   /* the results' copy: no op's */
    if (jlm_cu_rt_d2h(v->rt, v->h_y.p, v->d[D_Y].p, ylen, JLM_CU_S_COMPUTE) || jlm_cu_rt_sync(v->rt, JLM_CU_S_COMPUTE))
        return rt_fail(v, err, "matvec");
    uint64_t t2 = now_ns();
    v->st.act_down += ylen;
    v->st.kernel_ns += t2 - t1;
    v->st.waits++;
    const float *hy = v->h_y.p;
    for (int i = 0; i < nm; i++) {
        memcpy(ys[i], hy, (uint64_t)n * cms[i].rows * 4);
        hy += (uint64_t)n * cms[i].rows;
    }
    v->st.xfer_ns += now_ns() - t2;
    return JLM_OK;
}

/* m's planes as device addresses: in pinned frames, or (!strict) copied into
 * the scratch planes for this call (*re = 1). strict and a plane in no frame:
 * 1, nothing copied. */
static int mat_planes(jlm_ecu *v, const jlm_k_mat *m, jlm_cu_mat *cm, int strict, int *re, jlm_err *err)
{
    uint64_t ln[3];
    int rc = jlm_fmt_planes(m->type, m->k, m->rows, &ln[0], &ln[1], &ln[2], err);
    jlm_cu_mat_from(m, cm);
    const void *host[3] = {m->qs, m->d, m->sc}, *dev[3] = {NULL, NULL, NULL};
    for (int i = 0; !rc && i < 3; i++) {
        if (strict && ln[i] && !jlm_dframes_frame_of(&v->dev.frames, host[i], ln[i], NULL))
            return 1;
        rc = plane(v, host[i], ln[i], D_QS + i, &dev[i], re, err);
    }
    cm->qs = dev[0];
    cm->d = dev[1];
    cm->sc = dev[2];
    return rc;
}

static int ecu_matmul(jlm_dev *dev, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq,
                      float *y, jlm_err *err)
{
    jlm_ecu *v = (jlm_ecu *)dev;
    jlm_cu_mat cm;
    int re = 0, rc = mat_planes(v, m, &cm, 0, &re, err);
    if (!rc && re)
        v->st.reuploads++;
    for (uint32_t t = 0; !rc && t < n; t += 65535) {   /* gridDim.y */
        uint32_t c = n - t < 65535 ? n - t : 65535;
        float *yt = y + (uint64_t)t * m->rows;
        rc = tokens(v, &cm, 1, c, x ? x + (uint64_t)t * m->k : NULL, xq ? xq + t : NULL, &yt, err);
    }
    if (!rc)
        v->st.matmuls++;
    else
        v->st.fallbacks++;
    return rc;
}

/* Several matrices of one input in one round trip, when every plane is in a
 * pinned frame, the input is all quantized or all float, and one launch
 * holds the tokens; else 1 and nothing done (the caller runs them one by
 * one). */
static int ecu_matmul_multi(jlm_dev *dev, const jlm_k_mat *const *ms, int nm, uint32_t n, const float *x,
                            const jlm_act_q8 *xq, float *const *ys, jlm_err *err)
{
    jlm_ecu *v = (jlm_ecu *)dev;
    jlm_cu_mat cms[JLM_DEV_MULTI_MAX];
    if (nm < 1 || nm > JLM_DEV_MULTI_MAX || n > 65535)
        return 1;
    int flt = jlm_fmt_type_traits(ms[0]->type)->is_float, re = 0;
    for (int i = 0; i < nm; i++)
        if (jlm_fmt_type_traits(ms[i]->type)->is_float != flt || ms[i]->k != ms[0]->k ||
            mat_planes(v, ms[i], &cms[i], 1, &re, NULL))
            return 1;
    int rc = tokens(v, cms, nm, n, flt ? x : NULL, flt ? NULL : xq, ys, err);
    if (!rc)
        v->st.matmuls += (uint64_t)nm;
    else
        v->st.fallbacks += (uint64_t)nm;
    return rc;
}

int jlm_ecu_planes(jlm_ecu *v, const jlm_k_mat *m, jlm_cu_mat *cm, jlm_err *err)
{
    int re = 0;
    return mat_planes(v, m, cm, 1, &re, err);
}

/* ---------------------------------------------------------------- the jlm_dev */

static void ecu_close(jlm_dev *dev)
{
    jlm_ecu *v = (jlm_ecu *)dev;
    if (v->thr_on) {
        pthread_mutex_lock(&v->jmu);
        v->stop = 1;
        pthread_cond_broadcast(&v->jcv);
        pthread_mutex_unlock(&v->jmu);
        pthread_join(v->thr, NULL);
    }
    jlm_ecu_blk_free(v);
    for (int i = 0; i < D_N; i++)
        jlm_cu_rt_free(v->rt, v->d[i].p);
    for (int i = 0; i < v->nspare; i++)
        jlm_cu_rt_free(v->rt, v->spare[i].p);
    jlm_cu_rt_host_free(v->rt, v->h_act.p);
    jlm_cu_rt_host_free(v->rt, v->h_y.p);
    for (int i = 0; i < 2; i++)
        jlm_cu_rt_host_free(v->rt, v->stage[i]);
    jlm_cu_rt_close(v->rt);
    pthread_mutex_destroy(&v->mu);
    pthread_mutex_destroy(&v->jmu);
    pthread_cond_destroy(&v->jcv);
    free(v);
}

static const char *ecu_device(const jlm_dev *dev) { return ((const jlm_ecu *)dev)->name; }
static uint64_t ecu_default_budget(const jlm_dev *dev) { return ((const jlm_ecu *)dev)->default_budget; }
static void ecu_stats(const jlm_dev *dev, jlm_dev_stats *out)
{
    jlm_ecu *v = (jlm_ecu *)dev;
    *out = v->st;
    pthread_mutex_lock(&v->mu);
    out->bytes_up = v->bytes_up;
    pthread_mutex_unlock(&v->mu);
    out->dispatches = jlm_cu_rt_launches(v->rt) - v->launch0;
    jlm_cu_rt_count c;
    jlm_cu_rt_counts(v->rt, &c);
    out->graph_launches = c.graph_launches - v->cnt0.graph_launches;
    out->graph_captures = c.captures - v->cnt0.captures;
    out->rt_calls = c.calls - v->cnt0.calls;
}

static void ecu_stats_reset(jlm_dev *dev)
{
    jlm_ecu *v = (jlm_ecu *)dev;
    jlm_dev_stats keep = v->st;
    memset(&v->st, 0, sizeof v->st);
    pthread_mutex_lock(&v->mu);
    v->bytes_up = 0;
    pthread_mutex_unlock(&v->mu);
    v->st.device = keep.device;
    v->st.path = keep.path;
    v->launch0 = jlm_cu_rt_launches(v->rt);
    jlm_cu_rt_counts(v->rt, &v->cnt0);
}

/* ---------------------------------------------------------------- --profile */

/* The stamps recorded, their stream waited for: each interval into the
 * class of the stamp that opens it (JLM_DEVP_XFER: no op's, not kept). */
static void prof_read(jlm_ecu *v)
{
    if (v->prof_n > 1 && !jlm_cu_rt_sync(v->rt, JLM_CU_S_COMPUTE))
        for (uint32_t i = 0; i + 1 < v->prof_n; i++) {
            uint64_t ns;
            if (v->prof_of[i] < JLM_DEVP_XFER && !jlm_cu_rt_stamp_ns(v->rt, i, i + 1, &ns))
                v->prof_ns[v->prof_of[i]] += ns;
        }
    v->prof_n = 0;
}

static void ecu_prof_op(jlm_dev *dev, int cls)
{
    jlm_ecu *v = (jlm_ecu *)dev;
    if (cls == v->prof_tag && v->prof_n)
        return;   /* the class goes on (a whole block's ops in a row): no stamp */
    if (v->prof_n + 1 >= JLM_CU_NSTAMP) {   /* full: the host waits (profiling only), then on */
        int last = v->prof_tag;
        prof_read(v);
        if (!jlm_cu_rt_stamp(v->rt, 0, JLM_CU_S_COMPUTE))
            v->prof_of[v->prof_n++] = (uint8_t)last;
    }
    if (!jlm_cu_rt_stamp(v->rt, v->prof_n, JLM_CU_S_COMPUTE))
        v->prof_of[v->prof_n++] = (uint8_t)cls;
    v->prof_tag = cls;
}

static int ecu_prof_on(jlm_dev *dev, int on)
{
    jlm_ecu *v = (jlm_ecu *)dev;
    memset(v->prof_ns, 0, sizeof v->prof_ns);
    v->prof_n = 0;
    v->prof_tag = JLM_DEVP_XFER;
    return JLM_OK;
}

static void ecu_prof_get(jlm_dev *dev, uint64_t ns[JLM_DEVP_N])
{
    jlm_ecu *v = (jlm_ecu *)dev;
    prof_read(v);
    if (v->prof_tag != JLM_DEVP_XFER)   /* an op still open: it goes on from a fresh stamp */
        ecu_prof_op(dev, v->prof_tag);
    memcpy(ns, v->prof_ns, JLM_DEVP_XFER * sizeof ns[0]);
}

static const jlm_dev_ops ECU_OPS = {"cuda", ecu_close, ecu_device, ecu_default_budget, ecu_matmul,
                                    ecu_stats, ecu_stats_reset, ecu_prefetch_wait, ecu_matmul_multi,
                                    jlm_ecu_block, jlm_ecu_x_sync, jlm_ecu_x_drop, jlm_ecu_output,
                                    ecu_prof_on, ecu_prof_op, ecu_prof_get, jlm_ecu_kv_xfer};
/* JLM_CUDA_BLOCKS=0: matmuls only, a round trip each (or each multi): the
 * tests of the offload, and the before of docs/cuda.md's counts */
static const jlm_dev_ops ECU_OPS_MATMUL = {"cuda", ecu_close, ecu_device, ecu_default_budget, ecu_matmul,
                                           ecu_stats, ecu_stats_reset, ecu_prefetch_wait, ecu_matmul_multi,
                                           NULL, NULL, NULL, NULL, ecu_prof_on, ecu_prof_op, ecu_prof_get, NULL};

int jlm_ecu_open(const char *device, jlm_dev **out, jlm_err *err)
{
    long idx = 0;
    if (device && *device) {
        char *end;
        idx = strtol(device, &end, 10);
        if (*end || idx < 0 || idx > 1024)
            return jlm_errf(err, JLM_EINVAL, "--device '%.40s': a CUDA device is named by its index (0, 1, ...)",
                            device);
    }
    const char *em = getenv("JLM_CUDA_EMULATE");
    int emulate = em && *em && strcmp(em, "0");
    jlm_ecu *v = calloc(1, sizeof *v);
    if (!v)
        return jlm_errf(err, JLM_ENOMEM, "cuda backend: out of memory");
    char why[320] = "";
    int rc = jlm_cu_rt_open((int)idx, emulate, &v->rt, why, sizeof why);
    if (rc) {
        free(v);
        return jlm_errf(err, rc == JLM_EINVAL ? JLM_EINVAL : JLM_EUNSUPPORTED, "%s", why);
    }
    const char *bl = getenv("JLM_CUDA_BLOCKS");
    v->dev.ops = bl && !strcmp(bl, "0") ? &ECU_OPS_MATMUL : &ECU_OPS;
    pthread_mutex_init(&v->mu, NULL);
    pthread_mutex_init(&v->jmu, NULL);
    pthread_cond_init(&v->jcv, NULL);
    jlm_dframes_init(&v->dev.frames, &FRAME_OPS, v, "cuda backend");
    const char *sk = getenv("JLM_CUDA_STAGE_KIB");
    v->stage_bytes = sk && atol(sk) >= 4 && atol(sk) <= (1l << 20) ? (uint64_t)atol(sk) << 10 : STAGE_BYTES;
    for (int i = 0; i < 2; i++)
        if (jlm_cu_rt_host_alloc(v->rt, v->stage_bytes, &v->stage[i])) {
            rc = jlm_errf(err, JLM_ENOMEM, "cuda backend: pinned staging: %s", jlm_cu_rt_error(v->rt));
            ecu_close(&v->dev);
            return rc;
        }
    snprintf(v->name, sizeof v->name, "%s", jlm_cu_rt_name(v->rt));
    v->default_budget = jlm_cu_rt_free_bytes(v->rt) / 4 * 3;
    v->st.device = v->name;
    v->st.path = jlm_cu_rt_emulated(v->rt) ? "emulated" : "staged";
    *out = &v->dev;
    return JLM_OK;
}
