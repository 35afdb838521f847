/* backend_vk.c - the engine's Vulkan backend: device memory for the frames
 * of engine/devframes.h, and the matvec offload (backend_vk.h). */
#include "engine/backend_vk_int.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t jlm_evk_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#define now_ns jlm_evk_now_ns

int jlm_evk_rec_end(jlm_evk *v, jlm_err *err)
{
    if (!jlm_vk_recording(v->vk))
        return JLM_OK;
    uint64_t t0 = now_ns();
    int rc = jlm_vk_rec_end(v->vk, err);
    v->st.kernel_ns += now_ns() - t0;
    v->st.waits++;
    return rc;
}

/* ---------------------------------------------------------------- device frames */

/* Makes d resident: an import of the host frame, or a device buffer written
 * through the staging buffer. */
static int page_in(void *ctx, jlm_dframe *d, const void *host, uint64_t len, jlm_err *err)
{
    jlm_evk *v = ctx;
    jlm_vk_buf *b = NULL;
    uint64_t t0 = now_ns();
    int rc = JLM_EUNSUPPORTED;
    if (v->import && !((uintptr_t)host % 4096) && !(len % 4096)) {
        rc = jlm_vk_buf_import(v->vk, (void *)host, len, &b, err);
        if (!rc) {
            v->st.bytes_imported += len;
            d->aliased = 1;
        }
    }
    if (rc) {
        rc = jlm_vk_buf_new_device(v->vk, len, &b, err);
        if (!rc && (rc = jlm_vk_buf_write(v->vk, b, 0, host, len, err))) {
            jlm_vk_buf_free(v->vk, b);
            b = NULL;
        }
        if (!rc)
            v->st.bytes_up += len;
    }
    v->st.xfer_ns += now_ns() - t0;
    d->buf = b;
    return rc;
}

static void drop(void *ctx, jlm_dframe *d)
{
    jlm_evk *v = ctx;
    jlm_evk_rec_end(v, NULL);   /* recorded commands may read the frame */
    jlm_vk_buf_free(v->vk, d->buf);
}

static const jlm_dframes_ops FRAME_OPS = {page_in, drop};

/* ---------------------------------------------------------------- the jlm_dev */

static void evk_close(jlm_dev *dev)
{
    jlm_evk *v = (jlm_evk *)dev;
    jlm_evk_rec_end(v, NULL);
    jlm_evk_blk_free(v);
    for (int i = 0; i < B_N; i++)
        jlm_vk_buf_free(v->vk, v->b[i]);
    jlm_vk_close(v->vk);
    free(v);
}

static const char *evk_device(const jlm_dev *dev) { return jlm_vk_device_name(((const jlm_evk *)dev)->vk); }

static uint64_t evk_default_budget(const jlm_dev *dev)
{
    const jlm_evk *v = (const jlm_evk *)dev;
    return v->import ? 0 : jlm_vk_device_local_bytes(v->vk) / 4 * 3;
}

static void evk_stats(const jlm_dev *dev, jlm_dev_stats *out)
{
    const jlm_evk *v = (const jlm_evk *)dev;
    *out = v->st;
    out->dispatches = jlm_vk_dispatches(v->vk) - v->disp0;
}

static void evk_stats_reset(jlm_dev *dev)
{
    jlm_evk *v = (jlm_evk *)dev;
    jlm_dev_stats keep = v->st;
    memset(&v->st, 0, sizeof v->st);
    v->st.device = keep.device;
    v->st.path = keep.path;
    v->disp0 = jlm_vk_dispatches(v->vk);
}

static int evk_matmul(jlm_dev *dev, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq,
                      float *y, jlm_err *err);

/* A block's recording (and the submits it makes early) and the logits'
 * count as kernels (dispatch + wait), less what the calls inside counted. */
static void kernel_time(jlm_evk *v, uint64_t t0, uint64_t k0, uint64_t x0)
{
    uint64_t dt = now_ns() - t0, in = (v->st.kernel_ns - k0) + (v->st.xfer_ns - x0);
    v->st.kernel_ns += dt > in ? dt - in : 0;
}

static int evk_block(jlm_dev *d, struct jlm_engine *e, const jlm_prog *p, uint32_t l, const uint8_t *page, float *xs,
                     uint32_t n, void *kc, uint32_t pos0, jlm_err *err)
{
    jlm_evk *v = (jlm_evk *)d;
    uint64_t t0 = now_ns(), k0 = v->st.kernel_ns, x0 = v->st.xfer_ns;
    int rc = jlm_evk_block(d, e, p, l, page, xs, n, kc, pos0, err);
    kernel_time(v, t0, k0, x0);
    return rc;
}

static int evk_output(jlm_dev *d, const float *norm, float eps, const jlm_k_mat *m, const float *x, uint32_t n,
                      uint32_t E, float *logits, jlm_err *err)
{
    jlm_evk *v = (jlm_evk *)d;
    uint64_t t0 = now_ns(), k0 = v->st.kernel_ns, x0 = v->st.xfer_ns;
    int rc = jlm_evk_output(d, norm, eps, m, x, n, E, logits, err);
    kernel_time(v, t0, k0, x0);
    return rc;
}

/* --profile: timestamp queries, tagged with the JLM_DEVP_* class */
static int evk_prof_on(jlm_dev *dev, int on) { return jlm_vk_time(((jlm_evk *)dev)->vk, on, NULL); }
static void evk_prof_op(jlm_dev *dev, int cls) { jlm_vk_time_tag(((jlm_evk *)dev)->vk, cls); }
static void evk_prof_get(jlm_dev *dev, uint64_t ns[JLM_DEVP_N])
{
    uint64_t t[JLM_VK_TAGS];
    jlm_vk_time_get(((jlm_evk *)dev)->vk, t);
    for (int i = 0; i < JLM_DEVP_XFER; i++)
        ns[i] = t[i];
}

static const jlm_dev_ops EVK_OPS = {"vulkan", evk_close, evk_device, evk_default_budget, evk_matmul,
                                    evk_stats, evk_stats_reset, NULL, NULL, evk_block, jlm_evk_x_sync,
                                    jlm_evk_x_drop, evk_output, evk_prof_on, evk_prof_op, evk_prof_get,
                                    jlm_evk_kv_xfer};
/* JLM_VK_BLOCKS=0: matmuls only, one round trip each (the tests of the
 * offload's bit-identity; the before of docs/vulkan.md's counts) */
static const jlm_dev_ops EVK_OPS_MATMUL = {"vulkan", evk_close, evk_device, evk_default_budget, evk_matmul,
                                           evk_stats, evk_stats_reset, NULL, NULL, NULL, NULL, NULL, NULL,
                                           evk_prof_on, evk_prof_op, evk_prof_get, NULL};

int jlm_evk_open(const char *want, int allow_cpu, jlm_dev **out, jlm_err *err)
{
    jlm_evk *v = calloc(1, sizeof *v);
    if (!v)
        return jlm_errf(err, JLM_ENOMEM, "vulkan backend: out of memory");
    int rc = jlm_vk_open(want, allow_cpu, &v->vk, err);
    if (rc) {
        free(v);
        return rc;
    }
    const char *up = getenv("JLM_VK_UPLOAD");
    uint64_t al = jlm_vk_import_align(v->vk);
    v->import = al && al <= 4096 && !(up && *up && strcmp(up, "0"));
    v->st.device = jlm_vk_device_name(v->vk);
    v->st.path = v->import ? "import" : "upload";
    const char *bl = getenv("JLM_VK_BLOCKS");
    v->dev.ops = bl && !strcmp(bl, "0") ? &EVK_OPS_MATMUL : &EVK_OPS;
    jlm_dframes_init(&v->dev.frames, &FRAME_OPS, v, "vulkan backend");
    *out = &v->dev;
    return JLM_OK;
}

/* ---------------------------------------------------------------- matmul */

/* Buffer i holding at least n bytes, src copied in when non-NULL. */
static int stage(jlm_evk *v, int i, const void *src, uint64_t n, jlm_err *err)
{
    if (!v->b[i] || jlm_vk_buf_size(v->b[i]) < n) {
        jlm_vk_buf_free(v->vk, v->b[i]);
        v->b[i] = NULL;
        int rc = jlm_vk_buf_new(v->vk, n + n / 4, &v->b[i], err);
        if (rc)
            return rc;
    }
    if (src && n)
        memcpy(jlm_vk_buf_map(v->b[i]), src, n);
    return JLM_OK;
}

static jlm_vk_view span(jlm_vk_buf *b, uint64_t off, uint64_t len) { return (jlm_vk_view){b, off, len}; }

/* The planes of m as views of their device frame; or, when they are in no
 * frame, uploaded for this call. */
int jlm_evk_planes(jlm_evk *v, const jlm_k_mat *m, jlm_vk_mat *vm, int reupload, jlm_err *err)
{
    uint64_t ql, dl, sl;   /* a plane over one binding: jlm_vk_matvec runs it in k-chunks */
    int rc = jlm_fmt_planes(m->type, m->k, m->rows, &ql, &dl, &sl, err);
    if (rc)
        return rc;
    uint64_t q4 = (ql + 3) & ~3ull, d4 = (dl + 3) & ~3ull, s4 = (sl + 3) & ~3ull;
    jlm_dframes *fr = &v->dev.frames;
    jlm_dframe *f = jlm_dframes_frame_of(fr, m->qs, q4, err);
    if (f && (!dl || jlm_dframes_frame_of(fr, m->d, d4, err) == f) &&
        (!sl || jlm_dframes_frame_of(fr, m->sc, s4, err) == f)) {
        const uint8_t *h = f->host;
        *vm = (jlm_vk_mat){m->type, m->k, m->rows, span(f->buf, (uint64_t)((const uint8_t *)m->qs - h), q4),
                           {dl ? f->buf : NULL, dl ? (uint64_t)((const uint8_t *)m->d - h) : 0, d4},
                           {sl ? f->buf : NULL, sl ? (uint64_t)((const uint8_t *)m->sc - h) : 0, s4}};
        return JLM_OK;
    }
    if (!reupload)
        return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: a matrix in no device frame");
    uint64_t t0 = now_ns();
    rc = stage(v, B_QS, m->qs, ql, err);
    if (!rc && dl)
        rc = stage(v, B_D, m->d, dl, err);
    if (!rc && sl)
        rc = stage(v, B_SC, m->sc, sl, err);
    v->st.xfer_ns += now_ns() - t0;
    if (rc)
        return rc;
    v->st.reuploads++;
    v->st.bytes_up += ql + dl + sl;
    *vm = (jlm_vk_mat){m->type, m->k, m->rows, span(v->b[B_QS], 0, q4),
                       {dl ? v->b[B_D] : NULL, 0, d4}, {sl ? v->b[B_SC] : NULL, 0, s4}};
    return JLM_OK;
}

/* Tokens [0, n) of x / xq in one dispatch: their activations copied one
 * after another into the staging buffers, n * rows results back. */
static int tokens(jlm_evk *v, const jlm_vk_mat *vm, uint32_t n, const float *x, const jlm_act_q8 *xq, float *y,
                  jlm_err *err)
{
    uint64_t k = vm->k, rows = vm->rows, t0 = now_ns();
    int rc = stage(v, B_Y, NULL, n * rows * 4, err);
    jlm_vk_act va = {0};
    if (!rc && xq && !(rc = stage(v, B_AQ, NULL, n * k, err)) && !(rc = stage(v, B_AD, NULL, n * k / 8, err)) &&
        !(rc = stage(v, B_AS, NULL, n * k / 8, err))) {
        uint8_t *q = jlm_vk_buf_map(v->b[B_AQ]), *d = jlm_vk_buf_map(v->b[B_AD]), *sm = jlm_vk_buf_map(v->b[B_AS]);
        for (uint32_t t = 0; t < n; t++) {
            memcpy(q + t * k, xq[t].q, k);
            memcpy(d + t * (k / 8), xq[t].d, k / 8);    /* k/32 floats */
            memcpy(sm + t * (k / 8), xq[t].sum16, k / 8);   /* k/16 int16 */
        }
        v->st.act_up += (uint64_t)n * (k + k / 8 + k / 8);
        va = (jlm_vk_act){k, span(v->b[B_AQ], 0, n * k), span(v->b[B_AD], 0, n * k / 8),
                          span(v->b[B_AS], 0, n * k / 8), n};
    }
    if (!rc && !xq && !(rc = stage(v, B_X, x, n * k * 4, err)))
        v->st.act_up += n * k * 4;
    uint64_t t1 = now_ns();
    v->st.xfer_ns += t1 - t0;
    if (rc)
        return rc;
    rc = jlm_vk_matmul(v->vk, vm, n, xq ? (jlm_vk_view){0} : span(v->b[B_X], 0, n * k * 4), xq ? &va : NULL,
                       span(v->b[B_Y], 0, n * rows * 4), err);
    uint64_t t2 = now_ns();
    v->st.kernel_ns += t2 - t1;
    if (!rc) {
        memcpy(y, jlm_vk_buf_map(v->b[B_Y]), n * rows * 4);
        v->st.act_down += n * rows * 4;
    }
    v->st.xfer_ns += now_ns() - t2;
    return rc;
}

static int evk_matmul(jlm_dev *dev, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq,
                      float *y, jlm_err *err)
{
    jlm_evk *v = (jlm_evk *)dev;
    jlm_vk_mat vm;
    int rc = jlm_evk_rec_end(v, err);   /* the staging buffers: no recorded command reads them */
    jlm_dev_prof_op(dev, JLM_DEVP_MATMUL);
    if (!rc)
        rc = jlm_evk_planes(v, m, &vm, 1, err);
    /* tokens per dispatch: every staging binding (n*rows results, n*k floats
     * or codes) within one binding */
    uint64_t lim = jlm_vk_max_binding(v->vk), per = m->rows * 4 > m->k * 4 ? m->rows * 4 : m->k * 4;
    uint64_t g = per ? lim / per : 1;
    if (g < 1)
        g = 1;
    if (g > 65535)
        g = 65535;
    for (uint32_t t = 0; !rc && t < n; t += (uint32_t)g) {
        uint32_t c = n - t < g ? n - t : (uint32_t)g;
        rc = tokens(v, &vm, c, x ? x + (uint64_t)t * m->k : NULL, xq ? xq + t : NULL, y + (uint64_t)t * m->rows, err);
    }
    if (!rc)
        v->st.matmuls++, v->st.waits++;
    else
        v->st.fallbacks++;
    return rc;
}
