/* backend_vk.c - the engine's Vulkan backend: device page frames under the
 * pager's policy, and the matvec offload (backend_vk.h). */
#include "engine/backend_vk.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/lru.h"
#include "kernels/vulkan/vk.h"

enum { B_QS, B_D, B_SC, B_X, B_Y, B_AQ, B_AD, B_AS, B_N };
#define PIN_MAX 300   /* one block + the routed experts (<= 256) + dense */

/* A device frame: a page of a pager array, or the dense region. */
typedef struct dpage {
    jlm_lru_node   ln;        /* first: class list links (unpinned resident only) */
    jlm_vk_buf    *buf;       /* NULL: not resident on the device */
    const uint8_t *host;      /* the host frame it mirrors (import: aliases it) */
    uint64_t       len;
    uint32_t       pins;
    int            cls;
} dpage;
#define DP(node) ((dpage *)(void *)(node))

struct jlm_evk {
    jlm_vk     *vk;
    jlm_vk_buf *b[B_N];
    int         import;          /* the import path */
    uint64_t    budget, resident;
    jlm_lru     lru[2];
    dpage     **tab[JLM_EVK_ARRAYS];   /* records allocated one by one: list links stay valid */
    uint32_t    ntab[JLM_EVK_ARRAYS];
    dpage      *pinned[PIN_MAX];
    uint32_t    npinned;
    dpage       dense;
    jlm_evk_stats st;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int jlm_evk_open(const char *want, int allow_cpu, jlm_evk **out, jlm_err *err)
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
    *out = v;
    return JLM_OK;
}

static void drop(jlm_evk *v, dpage *d)
{
    jlm_vk_buf_free(v->vk, d->buf);
    d->buf = NULL;
    d->host = NULL;
}

void jlm_evk_close(jlm_evk *v)
{
    if (!v)
        return;
    for (int i = 0; i < B_N; i++)
        jlm_vk_buf_free(v->vk, v->b[i]);
    for (int a = 0; a < JLM_EVK_ARRAYS; a++) {
        for (uint32_t i = 0; i < v->ntab[a]; i++) {
            if (v->tab[a][i])
                drop(v, v->tab[a][i]);
            free(v->tab[a][i]);
        }
        free(v->tab[a]);
    }
    drop(v, &v->dense);
    jlm_vk_close(v->vk);
    free(v);
}

const char *jlm_evk_device(const jlm_evk *v) { return jlm_vk_device_name(v->vk); }

void jlm_evk_counters(const jlm_evk *v, uint64_t *matmuls, uint64_t *bytes_up)
{
    *matmuls = v->st.matmuls;
    *bytes_up = v->st.bytes_up;
}

void jlm_evk_stats_get(const jlm_evk *v, jlm_evk_stats *out)
{
    *out = v->st;
    out->resident_bytes = v->resident;
    out->budget = v->budget;
}

void jlm_evk_stats_reset(jlm_evk *v)
{
    jlm_evk_stats keep = v->st;
    memset(&v->st, 0, sizeof v->st);
    v->st.device = keep.device;
    v->st.path = keep.path;
    v->st.frames = keep.frames;
    v->st.peak_bytes = v->resident;
}

uint64_t jlm_evk_default_budget(const jlm_evk *v)
{
    return v->import ? 0 : jlm_vk_device_local_bytes(v->vk) / 4 * 3;
}

/* ---------------------------------------------------------------- device frames */

/* RESIDENT, UNPINNED -> ABSENT on the device. */
static void evict(jlm_evk *v, dpage *d)
{
    jlm_lru_unlink(&v->lru[d->cls], &d->ln);
    v->resident -= d->len;
    v->st.frames--;
    v->st.evictions++;
    drop(v, d);
}

void jlm_evk_set_budget(jlm_evk *v, uint64_t budget)
{
    v->budget = budget;
    jlm_lru_node *n;
    while (budget && v->resident > budget && (n = jlm_lru_victim(v->lru)))
        evict(v, DP(n));
}

void jlm_evk_set_dense(jlm_evk *v, const void *host, uint64_t len)
{
    drop(v, &v->dense);
    v->dense.host = host;
    v->dense.len = len;
}

void jlm_evk_host_evicted(void *ctx, uint32_t array, uint32_t page, void *frame)
{
    jlm_evk *v = ctx;
    if (!v->import || array >= JLM_EVK_ARRAYS || page >= v->ntab[array])
        return;
    dpage *d = v->tab[array][page];
    if (d && d->buf && d->host == frame && jlm_vk_is_imported(d->buf)) {
        if (d->pins)   /* cannot happen: the device pin nests inside the host pin */
            abort();
        evict(v, d);   /* counted: the device frame is gone as well */
    }
}

/* Makes d resident: an import of the host frame, or a device buffer written
 * through the staging buffer. */
static int page_in(jlm_evk *v, dpage *d, const void *host, uint64_t len, jlm_err *err)
{
    uint64_t t0 = now_ns();
    int rc = JLM_EUNSUPPORTED;
    if (v->import && !((uintptr_t)host % 4096) && !(len % 4096)) {
        rc = jlm_vk_buf_import(v->vk, (void *)host, len, &d->buf, err);
        if (!rc)
            v->st.bytes_imported += len;
    }
    if (rc) {
        rc = jlm_vk_buf_new_device(v->vk, len, &d->buf, err);
        if (!rc && (rc = jlm_vk_buf_write(v->vk, d->buf, 0, host, len, err)))
            drop(v, d);
        if (!rc)
            v->st.bytes_up += len;
    }
    v->st.xfer_ns += now_ns() - t0;
    if (rc)
        return rc;
    d->host = host;
    d->len = len;
    v->st.page_ins++;
    return JLM_OK;
}

static int pin_add(jlm_evk *v, dpage *d, jlm_err *err)
{
    if (v->npinned >= PIN_MAX)
        return jlm_errf(err, JLM_ERANGE, "vulkan backend: more than %d frames pinned at once", PIN_MAX);
    v->pinned[v->npinned++] = d;
    return JLM_OK;
}

/* Evicts unpinned frames (the pager's victim order) until need more bytes
 * fit; JLM_ERANGE when only pinned frames remain. */
static int make_room(jlm_evk *v, uint64_t need, uint32_t array, uint32_t page, jlm_err *err)
{
    while (v->budget && v->resident + need > v->budget) {
        jlm_lru_node *n = jlm_lru_victim(v->lru);
        if (!n)
            return jlm_errf(err, JLM_ERANGE,
                            "vulkan backend: --gpu-budget %llu bytes exhausted by pinned frames (%llu resident), "
                            "array %u page %u needs %llu more", (unsigned long long)v->budget,
                            (unsigned long long)v->resident, array, page, (unsigned long long)need);
        evict(v, DP(n));
    }
    return JLM_OK;
}

int jlm_evk_page_get(jlm_evk *v, uint32_t array, uint32_t page, int cls, const void *host, uint64_t len,
                     jlm_err *err)
{
    if (array >= JLM_EVK_ARRAYS || cls < 0 || cls > 1 || !host || !len)
        return jlm_errf(err, JLM_EINVAL, "vulkan backend: array %u page %u class %d: bad request", array, page, cls);
    if (page >= v->ntab[array]) {
        uint32_t n = page + 1 > v->ntab[array] * 2 ? page + 1 : v->ntab[array] * 2;
        dpage **t = realloc(v->tab[array], (size_t)n * sizeof *t);
        if (!t)
            return jlm_errf(err, JLM_ENOMEM, "vulkan backend: out of memory for %u page records", n);
        memset(t + v->ntab[array], 0, (size_t)(n - v->ntab[array]) * sizeof *t);
        v->tab[array] = t;
        v->ntab[array] = n;
    }
    dpage *d = v->tab[array][page];
    if (!d && !(d = v->tab[array][page] = calloc(1, sizeof *d)))
        return jlm_errf(err, JLM_ENOMEM, "vulkan backend: out of memory");
    int rc = JLM_OK;
    if (d->buf && (d->len != len || (jlm_vk_is_imported(d->buf) && d->host != host))) {
        if (d->pins)
            return jlm_errf(err, JLM_EINVAL, "vulkan backend: array %u page %u pinned at another frame", array, page);
        evict(v, d);   /* a different frame or extent: not the same page-in */
    }
    if (d->buf) {
        if (!d->pins)
            jlm_lru_unlink(&v->lru[d->cls], &d->ln);
        v->st.hits++;
    } else {
        d->cls = cls;
        if ((rc = make_room(v, len, array, page, err)) || (rc = page_in(v, d, host, len, err)))
            return rc;
        v->resident += len;
        if (v->resident > v->st.peak_bytes)
            v->st.peak_bytes = v->resident;
        v->st.frames++;
    }
    d->host = host;   /* the upload path's copy stays valid at any host frame */
    if ((rc = pin_add(v, d, err))) {
        if (!d->pins)
            jlm_lru_push_head(&v->lru[d->cls], &d->ln);
        return rc;
    }
    d->pins++;
    return JLM_OK;
}

void jlm_evk_page_put(jlm_evk *v, uint32_t array, uint32_t page)
{
    if (array >= JLM_EVK_ARRAYS || page >= v->ntab[array] || !v->tab[array][page])
        return;
    dpage *d = v->tab[array][page];
    if (!d->pins)
        return;
    for (uint32_t i = v->npinned; i-- > 0;)
        if (v->pinned[i] == d) {
            v->pinned[i] = v->pinned[--v->npinned];
            break;
        }
    if (--d->pins == 0)
        jlm_lru_push_head(&v->lru[d->cls], &d->ln);
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

/* The pinned frame (or the dense region) holding [p, p+n), made resident if
 * it is the dense region; NULL if none. */
static dpage *frame_of(jlm_evk *v, const void *p, uint64_t n, jlm_err *err)
{
    const uint8_t *q = p;
    for (uint32_t i = 0; i < v->npinned; i++) {
        dpage *d = v->pinned[i];
        if (q >= d->host && q - d->host <= (ptrdiff_t)d->len && n <= d->len - (uint64_t)(q - d->host))
            return d;
    }
    dpage *d = &v->dense;
    if (!d->host || q < d->host || q - d->host > (ptrdiff_t)d->len || n > d->len - (uint64_t)(q - d->host))
        return NULL;
    if (!d->buf && page_in(v, d, d->host, d->len, err))
        return NULL;
    return d;
}

/* The planes of m as views of their device frame; or, when they are in no
 * frame, uploaded for this call. */
static int bind_planes(jlm_evk *v, const jlm_k_mat *m, jlm_vk_mat *vm, jlm_err *err)
{
    uint64_t ql, dl, sl;   /* a plane over one binding: jlm_vk_matvec runs it in k-chunks */
    int rc = jlm_fmt_planes(m->type, m->k, m->rows, &ql, &dl, &sl, err);
    if (rc)
        return rc;
    uint64_t q4 = (ql + 3) & ~3ull, d4 = (dl + 3) & ~3ull, s4 = (sl + 3) & ~3ull;
    dpage *f = frame_of(v, m->qs, q4, err);
    if (f && (!dl || frame_of(v, m->d, d4, err) == f) && (!sl || frame_of(v, m->sc, s4, err) == f)) {
        const uint8_t *h = f->host;
        *vm = (jlm_vk_mat){m->type, m->k, m->rows, span(f->buf, (uint64_t)((const uint8_t *)m->qs - h), q4),
                           {dl ? f->buf : NULL, dl ? (uint64_t)((const uint8_t *)m->d - h) : 0, d4},
                           {sl ? f->buf : NULL, sl ? (uint64_t)((const uint8_t *)m->sc - h) : 0, s4}};
        return JLM_OK;
    }
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
        va = (jlm_vk_act){k, span(v->b[B_AQ], 0, n * k), span(v->b[B_AD], 0, n * k / 8),
                          span(v->b[B_AS], 0, n * k / 8), n};
    }
    if (!rc && !xq)
        rc = stage(v, B_X, x, n * k * 4, err);
    uint64_t t1 = now_ns();
    v->st.xfer_ns += t1 - t0;
    if (rc)
        return rc;
    rc = jlm_vk_matmul(v->vk, vm, n, xq ? (jlm_vk_view){0} : span(v->b[B_X], 0, n * k * 4), xq ? &va : NULL,
                       span(v->b[B_Y], 0, n * rows * 4), err);
    uint64_t t2 = now_ns();
    v->st.kernel_ns += t2 - t1;
    if (!rc)
        memcpy(y, jlm_vk_buf_map(v->b[B_Y]), n * rows * 4);
    v->st.xfer_ns += now_ns() - t2;
    return rc;
}

int jlm_evk_matmul(jlm_evk *v, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq,
                   float *y, jlm_err *err)
{
    jlm_vk_mat vm;
    int rc = bind_planes(v, m, &vm, err);
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
        v->st.matmuls++;
    else
        v->st.fallbacks++;
    return rc;
}
