/* kvcache.c - the KV cache's types, rows and memory (model_int.h): keys and
 * values each F32, F16 or Q8_0 (--cache-type-k / --cache-type-v); one
 * position of one KV head as it is stored, read back and widened for the
 * attention; and the cache's memory, reserved for the whole context but
 * backed and counted in chunks of KV_CHUNK positions as the context fills
 * (the budget's page frames give up what the cache takes, and get it back
 * when the cache is rewound). See model_int.h for the layout. */
#include "engine/model_int.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ================================================================ types and rows */
static const char *const kv_names[KV_N] = {"f32", "f16", "q8_0"};

const char *jlm_kv_type_name(int type) { return type >= 0 && type < KV_N ? kv_names[type] : "?"; }

int jlm_kv_type_parse(const char *opt, const char *s, int *out, jlm_err *err)
{
    for (int t = 0; s && t < KV_N; t++)
        if (!strcmp(s, kv_names[t])) {
            *out = t;
            return JLM_OK;
        }
    return jlm_errf(err, JLM_EINVAL, "%s '%.40s': expected f32, f16 or q8_0%s", opt, s ? s : "",
                    strcmp(opt, "--kv") ? "" : " (or auto)");
}

int jlm_engine_kv_check(const jlm_engine_opts *o, jlm_err *err)
{
    int t, rc;
    if ((o->kv && strcmp(o->kv, "auto") && (rc = jlm_kv_type_parse("--kv", o->kv, &t, err))) ||
        (o->kv_k && (rc = jlm_kv_type_parse("--cache-type-k", o->kv_k, &t, err))) ||
        (o->kv_v && (rc = jlm_kv_type_parse("--cache-type-v", o->kv_v, &t, err))))
        return rc;
    return JLM_OK;
}

uint64_t jlm_kv_row_bytes(int type, uint32_t dim)
{
    switch (type) {
    case KV_F16: return (uint64_t)dim * 2;
    case KV_Q8_0: return (uint64_t)dim / KV_Q8_BLOCK * KV_Q8_BYTES;
    default: return (uint64_t)dim * 4;
    }
}

/* n (a multiple of 32) values as Q8_0 blocks (ggml's block_q8_0: an F16
 * scale d = max|x| / 127, then 32 int8 round(x / d)), as ggml's reference
 * quantize_row_q8_0 computes them. */
static void q8_put(uint8_t *dst, const float *x, uint32_t n)
{
    for (uint32_t b = 0; b < n / KV_Q8_BLOCK; b++, dst += KV_Q8_BYTES, x += KV_Q8_BLOCK) {
        float amax = 0.0f;
        for (uint32_t i = 0; i < KV_Q8_BLOCK; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = jlm_k_f32_to_fp16(d);
        memcpy(dst, &dh, sizeof dh);
        for (uint32_t i = 0; i < KV_Q8_BLOCK; i++)
            dst[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
    }
}

static void q8_get(const uint8_t *src, float *x, uint32_t n)
{
    for (uint32_t b = 0; b < n / KV_Q8_BLOCK; b++, src += KV_Q8_BYTES, x += KV_Q8_BLOCK) {
        uint16_t dh;
        memcpy(&dh, src, sizeof dh);
        float d = jlm_k_fp16_to_f32(dh);
        for (uint32_t i = 0; i < KV_Q8_BLOCK; i++)
            x[i] = d * (float)(int8_t)src[2 + i];
    }
}

void jlm_kv_put_row(int type, uint8_t *dst, const float *x, uint32_t n)
{
    if (type == KV_F32) {
        memcpy(dst, x, n * sizeof(float));
    } else if (type == KV_F16) {
        jlm_k_cpu_get()->to_fp16((uint16_t *)dst, 1, x, n);   /* nearest even, as ggml's F16 cache */
    } else {
        q8_put(dst, x, n);
    }
}

void jlm_kv_get_row(int type, const uint8_t *src, float *x, uint32_t n)
{
    if (type == KV_F32) {
        memcpy(x, src, n * sizeof(float));
    } else if (type == KV_F16) {
        for (uint32_t i = 0; i < n; i++)
            x[i] = jlm_k_fp16_to_f32(((const uint16_t *)src)[i]);
    } else {
        q8_get(src, x, n);
    }
}

/* Element i of key pos in an F32/F16 head's tiles (model_int.h). */
static uint64_t key_elem(const jlm_engine *e, uint32_t pos, uint32_t i)
{
    enum { BK = JLM_K_FATTN_BK };
    return (uint64_t)(pos / BK) * BK * e->hd + (uint64_t)i * BK + pos % BK;
}

uint8_t *jlm_kv_head(const jlm_engine *e, void *c, int val, uint32_t l, uint32_t g)
{
    uint64_t head = (uint64_t)l * e->c->n_kv_head + g;
    return (uint8_t *)c + head * e->kv_ctx * (val ? e->vrow : e->krow);
}

void jlm_kv_put_key(const jlm_engine *e, uint8_t *kh, uint32_t pos, const float *k)
{
    if (e->kt == KV_Q8_0) {
        q8_put(kh + pos * e->krow, k, e->hd);
        return;
    }
    enum { BK = JLM_K_FATTN_BK };   /* key_elem: element i at i * BK past element 0 */
    uint64_t at = key_elem(e, pos, 0);
    if (e->kt == KV_F16) {
        e->k->to_fp16((uint16_t *)kh + at, BK, k, e->hd);
        return;
    }
    for (uint32_t i = 0; i < e->hd; i++)
        ((float *)kh)[at + (uint64_t)i * BK] = k[i];
}

void jlm_kv_get_key(const jlm_engine *e, const uint8_t *kh, uint32_t pos, float *k)
{
    if (e->kt == KV_Q8_0) {
        q8_get(kh + pos * e->krow, k, e->hd);
        return;
    }
    for (uint32_t i = 0; i < e->hd; i++) {
        uint64_t at = key_elem(e, pos, i);
        k[i] = e->kt == KV_F16 ? jlm_k_fp16_to_f32(((const uint16_t *)kh)[at]) : ((const float *)kh)[at];
    }
}

void jlm_kv_rows(const jlm_engine *e, uint8_t *kc, uint8_t *vc, uint32_t l, uint32_t p0, uint32_t n, uint8_t *krows,
                 uint8_t *vrows, int to_host)
{
    uint32_t nh = e->c->n_kv_head, es = e->kt == KV_F16 ? 2 : 4;
    for (uint32_t g = 0; g < nh; g++) {
        uint8_t *kh = jlm_kv_head(e, kc, 0, l, g), *vh = jlm_kv_head(e, vc, 1, l, g);
        for (uint32_t j = 0; j < n; j++) {
            uint32_t pos = p0 + j;
            uint8_t *kr = krows + ((uint64_t)j * nh + g) * e->krow, *vr = vrows + ((uint64_t)j * nh + g) * e->vrow;
            memcpy(to_host ? vh + (uint64_t)pos * e->vrow : vr, to_host ? vr : vh + (uint64_t)pos * e->vrow, e->vrow);
            if (e->kt == KV_Q8_0) {
                memcpy(to_host ? kh + (uint64_t)pos * e->krow : kr, to_host ? kr : kh + (uint64_t)pos * e->krow,
                       e->krow);
                continue;
            }
            for (uint32_t i = 0; i < e->hd; i++) {   /* a key's elements sit apart in its head's tiles */
                uint8_t *at = kh + key_elem(e, pos, i) * es;
                memcpy(to_host ? at : kr + i * es, to_host ? kr + i * es : at, es);
            }
        }
    }
}

float *jlm_kv_slab(const jlm_engine *e, int tid)
{
    return e->kv32 + (size_t)tid * e->kv_ctx * (e->hd + e->hd_v);
}

void jlm_kv_widen(const jlm_engine *e, const uint8_t *kh, const uint8_t *vh, uint32_t j0, uint32_t j1, float *slab)
{
    enum { BK = JLM_K_FATTN_BK };
    float *kt = slab, *vt = slab + (uint64_t)e->kv_ctx * e->hd, row[JLM_MAX_HEAD_DIM];
    j0 = j0 / BK * BK;
    uint32_t jt = (j1 + BK - 1) / BK * BK;   /* the last tile's end: zero past j1 */
    if (e->kt != KV_Q8_0) {   /* tiles as they are, widened */
        uint64_t a = (uint64_t)j0 * e->hd, b = (uint64_t)jt * e->hd;
        for (uint64_t i = a; i < b; i++)
            kt[i] = e->kt == KV_F16 ? jlm_k_fp16_to_f32(((const uint16_t *)kh)[i]) : ((const float *)kh)[i];
    } else {
        for (uint32_t j = j0; j < jt; j++) {
            if (j < j1)
                q8_get(kh + j * e->krow, row, e->hd);
            for (uint32_t i = 0; i < e->hd; i++)
                kt[key_elem(e, j, i)] = j < j1 ? row[i] : 0.0f;
        }
    }
    for (uint32_t j = j0; j < j1; j++)
        jlm_kv_get_row(e->vt, vh + j * e->vrow, vt + (uint64_t)j * e->hd_v, e->hd_v);
}

/* ================================================================ memory */
/* Keys (or the latent rows), values: bytes of the whole context. */
static uint64_t res_bytes(const jlm_engine *e, int val)
{
    return (uint64_t)e->kv_heads * e->kv_ctx * (val ? e->vrow : e->krow);
}

int jlm_kv_reserve(const jlm_engine *e, void **kc, void **vc, jlm_err *err)
{
    void *p[2] = {NULL, NULL};
    for (int v = 0; v < 2; v++) {
        uint64_t n = res_bytes(e, v);
        p[v] = jlm_mem_reserve(n ? n : 1);
        if (!p[v]) {
            jlm_kv_release(e, p[0], p[1]);
            return jlm_errf(err, JLM_ENOMEM, "%s: no address space for the KV cache (%u positions, %llu bytes)",
                            e->m->path, e->n_ctx, (unsigned long long)(res_bytes(e, 0) + res_bytes(e, 1)));
        }
    }
    *kc = p[0];
    *vc = p[1];
    return JLM_OK;
}

void jlm_kv_release(const jlm_engine *e, void *kc, void *vc)
{
    if (kc) munmap(kc, res_bytes(e, 0) ? res_bytes(e, 0) : 1);
    if (vc) munmap(vc, res_bytes(e, 1) ? res_bytes(e, 1) : 1);
}

uint64_t jlm_kv_bytes_at(const jlm_engine *e, uint32_t have)
{
    return (uint64_t)e->kv_heads * have * (e->krow + e->vrow);
}

/* The pages positions [0, have) of every head's run of rows of row bytes
 * touch (heads' runs are kv_ctx rows apart: two may share a page). */
static uint64_t run_pages(const jlm_engine *e, uint64_t row, uint32_t have)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), run = (uint64_t)e->kv_ctx * row, end = 0, pages = 0;
    for (uint64_t h = 0; have && row && h < e->kv_heads; h++) {
        uint64_t a = h * run / pg, b = (h * run + have * row + pg - 1) / pg;
        pages += b - (a > end ? a : end);
        end = b;
    }
    return pages * pg;
}

uint64_t jlm_kv_mem_at(const jlm_engine *e, uint32_t have)
{
    return run_pages(e, e->krow, have) + run_pages(e, e->vrow, have);
}

/* Positions [keep, have) of every head back to the kernel: the whole pages
 * inside each head's part of the range (MADV_DONTNEED: they read as zeros
 * and take no memory until written again). */
static void give_back(const jlm_engine *e, uint8_t *c, uint64_t row, uint32_t keep, uint32_t have)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), run = (uint64_t)e->kv_ctx * row;
    for (uint64_t h = 0; c && row && h < e->kv_heads; h++) {
        uint64_t a = (h * run + keep * row + pg - 1) / pg * pg, b = (h * run + have * row) / pg * pg;
        if (b > a)
            madvise(c + a, b - a, MADV_DONTNEED);
    }
}

/* Whether the frames hold less than every page, so that the cache's pages
 * given back would hold more of the model. When they hold it all (no budget,
 * or one above the model), a rewind keeps the cache's pages and their count:
 * given back, the next evaluation would only fault them in again (a 128-token
 * prefill of synth-1b: about a thousand 4 KiB faults, 2-4% of its time). */
static int frames_short(const jlm_engine *e)
{
    return e->budget_all && e->budget < jlm_pager_bytes(e->pager);
}

int jlm_kv_fit(jlm_engine *e, void *kc, void *vc, uint32_t *have, uint32_t need, int counted, jlm_err *err)
{
    uint32_t want = need ? (need + KV_CHUNK - 1) / KV_CHUNK * KV_CHUNK : 0;
    if (want > e->kv_ctx)
        want = e->kv_ctx;
    if (want == *have || (want < *have && counted && !frames_short(e)))
        return JLM_OK;
    uint32_t old = *have;
    *have = want;
    if (counted) {
        e->mem_kv = jlm_kv_mem_at(e, want);
        int rc = jlm_eng_fit_frames(e, err);
        if (rc) {
            *have = old;
            e->mem_kv = jlm_kv_mem_at(e, old);
            jlm_err e2;
            jlm_eng_fit_frames(e, &e2);   /* the budget it had: fits as before */
            return rc;
        }
    }
    if (want < old) {
        give_back(e, kc, e->krow, want, old);
        give_back(e, vc, e->vrow, want, old);
    }
    return JLM_OK;
}
