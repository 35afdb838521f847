/* backend_vk.c - the engine's Vulkan matvec offload (backend_vk.h). */
#include "engine/backend_vk.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/vulkan/vk.h"

enum { B_QS, B_D, B_SC, B_X, B_Y, B_AQ, B_AD, B_AS, B_N };

struct jlm_evk {
    jlm_vk     *vk;
    jlm_vk_buf *b[B_N];
    uint64_t    matmuls, bytes_up;
};

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
    *out = v;
    return JLM_OK;
}

void jlm_evk_close(jlm_evk *v)
{
    if (!v)
        return;
    for (int i = 0; i < B_N; i++)
        jlm_vk_buf_free(v->vk, v->b[i]);
    jlm_vk_close(v->vk);
    free(v);
}

const char *jlm_evk_device(const jlm_evk *v) { return jlm_vk_device_name(v->vk); }

void jlm_evk_counters(const jlm_evk *v, uint64_t *matmuls, uint64_t *bytes_up)
{
    *matmuls = v->matmuls;
    *bytes_up = v->bytes_up;
}

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

/* The planes of m, uploaded as they are (the span of each, untouched). */
static int upload_planes(jlm_evk *v, const jlm_k_mat *m, jlm_vk_mat *vm, jlm_err *err)
{
    uint64_t ql, dl, sl;
    int rc = jlm_fmt_planes(m->type, m->k, m->rows, &ql, &dl, &sl, err);
    uint64_t lim = jlm_vk_max_binding(v->vk);
    if (!rc && (ql > lim || dl > lim || sl > lim))
        rc = jlm_errf(err, JLM_EUNSUPPORTED, "vulkan backend: a plane exceeds one binding (%llu bytes)",
                      (unsigned long long)lim);
    if (!rc)
        rc = stage(v, B_QS, m->qs, ql, err);
    if (!rc && dl)
        rc = stage(v, B_D, m->d, dl, err);
    if (!rc && sl)
        rc = stage(v, B_SC, m->sc, sl, err);
    if (rc)
        return rc;
    v->bytes_up += ql + dl + sl;
    *vm = (jlm_vk_mat){m->type, m->k, m->rows, span(v->b[B_QS], 0, (ql + 3) & ~3ull),
                       {dl ? v->b[B_D] : NULL, 0, (dl + 3) & ~3ull}, {sl ? v->b[B_SC] : NULL, 0, (sl + 3) & ~3ull}};
    return JLM_OK;
}

static int one_token(jlm_evk *v, const jlm_vk_mat *vm, const float *x, const jlm_act_q8 *xq, float *y,
                     jlm_err *err)
{
    uint64_t k = vm->k, rows = vm->rows;
    int rc = stage(v, B_Y, NULL, rows * 4, err);
    jlm_vk_act va = {0};
    if (!rc && xq && !(rc = stage(v, B_AQ, xq->q, k, err)) && !(rc = stage(v, B_AD, xq->d, k / 8, err)))
        rc = stage(v, B_AS, xq->sum16, k / 8, err);
    if (!rc && xq)
        va = (jlm_vk_act){k, span(v->b[B_AQ], 0, k), span(v->b[B_AD], 0, k / 8), span(v->b[B_AS], 0, k / 8)};
    if (!rc && !xq)
        rc = stage(v, B_X, x, k * 4, err);
    if (rc)
        return rc;
    rc = jlm_vk_matvec(v->vk, vm, xq ? (jlm_vk_view){0} : span(v->b[B_X], 0, k * 4), xq ? &va : NULL,
                       span(v->b[B_Y], 0, rows * 4), err);
    if (!rc)
        memcpy(y, jlm_vk_buf_map(v->b[B_Y]), rows * 4);
    return rc;
}

int jlm_evk_matmul(jlm_evk *v, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_act_q8 *xq,
                   float *y, jlm_err *err)
{
    jlm_vk_mat vm;
    int rc = upload_planes(v, m, &vm, err);
    for (uint32_t t = 0; !rc && t < n; t++)
        rc = one_token(v, &vm, x ? x + (uint64_t)t * m->k : NULL, xq ? xq + t : NULL, y + (uint64_t)t * m->rows, err);
    if (!rc)
        v->matmuls++;
    return rc;
}
