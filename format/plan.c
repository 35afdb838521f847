/* plan.c - the layout planner (pass 1, jlm-format.md 2, 5, 6 and 8): from the
 * sections and the tensor shapes alone, every offset of the file.
 *
 * Placement rules, in one place:
 *  - dense region: tensors with block -1 and the expanded roles of every block,
 *    in table order, each plane 4096-aligned;
 *  - text page b: block b's other tensors (not banks), in table order;
 *  - vision page b: tower tensors (roles 64..93) of tower block b;
 *  - expert page rank(b)*NExpert + x: sheet x of every bank of block b.
 * Zero-length planes take the tensor's qsOff (section 8). */
#include "jlm_format.h"

#include <stdlib.h>
#include <string.h>

#define ROLE_VISION_FIRST 64
#define ROLE_VISION_LAST  93

/* With at most JLM_MAX_TENSORS tensors of planes this long, every cursor sum
 * below stays under 2^63. */
#define JLM_MAX_PLANE (1ull << 40)

static int is_vision_role(uint16_t r) { return r >= ROLE_VISION_FIRST && r <= ROLE_VISION_LAST; }

/* Places the three planes of a tensor (lengths q,d,s) at a cursor relative to
 * some base; returns the cursor after them. */
static uint64_t place(uint64_t cursor, uint64_t q, uint64_t d, uint64_t s,
                      uint64_t *qo, uint64_t *dof, uint64_t *so)
{
    cursor = jlm_align_up(cursor);
    *qo = cursor;
    cursor = jlm_align_up(cursor + q);
    *dof = *qo;
    if (d) { *dof = cursor; cursor = jlm_align_up(cursor + d); }
    *so = *qo;
    if (s) { *so = cursor; cursor = jlm_align_up(cursor + s); }
    return cursor;
}

static void minplane(uint64_t *m, uint64_t q, uint64_t d, uint64_t s)
{
    uint64_t v[3] = {q, d, s};
    for (int i = 0; i < 3; i++)
        if (v[i] && v[i] < *m)
            *m = v[i];
}

static int cmp_ident(const void *a, const void *b)
{
    const jlm_tensor *x = *(const jlm_tensor *const *)a, *y = *(const jlm_tensor *const *)b;
    if (x->role != y->role) return x->role < y->role ? -1 : 1;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    if (x->index != y->index) return x->index < y->index ? -1 : 1;
    return 0;
}

/* Duplicate identities (role, block, index) are refused. */
static int check_unique(const jlm_tensor *ts, uint32_t n, const char *what, jlm_err *err)
{
    if (n < 2)
        return JLM_OK;
    const jlm_tensor **v = malloc(n * sizeof *v);
    if (!v)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", what);
    for (uint32_t i = 0; i < n; i++)
        v[i] = &ts[i];
    qsort(v, n, sizeof *v, cmp_ident);
    int rc = JLM_OK;
    for (uint32_t i = 1; i < n && !rc; i++)
        if (!cmp_ident(&v[i - 1], &v[i]))
            rc = jlm_errf(err, JLM_EFORMAT, "%s: tensors '%s' and '%s' have the same identity (role %u, block %d, index %d)",
                          what, v[i - 1]->name.s, v[i]->name.s, v[i]->role, v[i]->block, v[i]->index);
    free(v);
    return rc;
}

int jlm_fmt_plan(const jlm_plan_input *in, jlm_plan *out, jlm_err *err)
{
    const jlm_config *cfg = in->config;
    uint32_t n = in->n_tensors;
    jlm_plan p = {0};
    /* Untrusted sizes first: nothing below is sized before the config is
     * bounded (sanity.c); shapes against the config are the caller's check
     * (jlm_fmt_shapes_check: the converter and the engine). */
    int rc = jlm_fmt_config_check(cfg, "plan", err);
    if (!rc && n > JLM_MAX_TENSORS)
        rc = jlm_errf(err, JLM_ERANGE, "plan: %u tensors, at most %u are accepted", n, JLM_MAX_TENSORS);
    if (!rc && in->vision && in->vision->n_layer > JLM_MAX_LAYERS)
        rc = jlm_errf(err, JLM_ERANGE, "plan: vision tower has %u layers, at most %u are accepted",
                      in->vision->n_layer, JLM_MAX_LAYERS);
    if (!rc)
        rc = check_unique(in->tensors, n, "plan", err);
    if (rc)
        return rc;
    p.tensors = calloc(n ? n : 1, sizeof *p.tensors);
    jlm_tensor_planes *pl = calloc(n ? n : 1, sizeof *pl);
    uint32_t nvis = in->vision ? in->vision->n_layer : 0;
    uint64_t *text_used = calloc((size_t)cfg->n_layer + 1, sizeof *text_used);
    uint64_t *vis_used = calloc((size_t)nvis + 1, sizeof *vis_used);
    int32_t *moe_rank = malloc(((size_t)cfg->n_layer + 1) * sizeof *moe_rank);
    if (!p.tensors || !pl || !text_used || !vis_used || !moe_rank) {
        rc = jlm_errf(err, JLM_ENOMEM, "plan: out of memory");
        goto fail;
    }
    if (n)
        memcpy(p.tensors, in->tensors, n * sizeof *p.tensors);
    p.n_tensors = n;

    /* Shapes, regions, and which blocks are MoE blocks. */
    for (uint32_t b = 0; b <= cfg->n_layer; b++)
        moe_rank[b] = -1;
    for (uint32_t i = 0; i < n; i++) {
        jlm_tensor *t = &p.tensors[i];
        if ((rc = jlm_fmt_tensor_planes(t, &pl[i], err)))
            goto fail;
        if (pl[i].qs_len > JLM_MAX_PLANE || pl[i].d_len > JLM_MAX_PLANE || pl[i].sc_len > JLM_MAX_PLANE) {
            rc = jlm_errf(err, JLM_ERANGE, "plan: tensor '%s' has a plane over 1 TiB", t->name.s);
            goto fail;
        }
        if (t->block >= 0 && (is_vision_role(t->role) ? (uint32_t)t->block >= nvis : (uint32_t)t->block >= cfg->n_layer)) {
            rc = jlm_errf(err, JLM_EFORMAT, "plan: tensor '%s' in block %d, model has %u", t->name.s, t->block,
                          is_vision_role(t->role) ? nvis : cfg->n_layer);
            goto fail;
        }
        if (jlm_fmt_role_is_bank(t->role)) {
            if (t->block < 0 || t->ndim != 3 || t->dims[2] != cfg->n_expert) {
                rc = jlm_errf(err, JLM_EFORMAT, "plan: expert bank '%s' must be 3-D with %u experts in a block",
                              t->name.s, cfg->n_expert);
                goto fail;
            }
            moe_rank[t->block] = 0;
        }
        if (t->role >= JLM_R_EXP1_GATE && t->role <= JLM_R_EXP1_DOWN) {
            rc = jlm_errf(err, JLM_EUNSUPPORTED, "plan: single-expert tensor '%s': merge experts into a bank", t->name.s);
            goto fail;
        }
    }
    uint32_t n_moe = 0;
    for (uint32_t b = 0; b < cfg->n_layer; b++)
        if (moe_rank[b] == 0)
            moe_rank[b] = (int32_t)n_moe++;

    /* Sections. */
    jlm_fmt_config_encode(&p.cfg, cfg);
    if (in->vision)
        jlm_fmt_vision_encode(&p.vis, in->vision);
    jlm_fmt_vocab_encode(&p.voc, in->vocab);
    for (uint32_t i = 0; i < n; i++)
        jlm_fmt_tensor_encode(&p.tab, &p.tensors[i]);   /* offsets zero: same length */
    jlm_fmt_fingerprint_encode(&p.fp, in->fp);
    if (p.cfg.oom || p.vis.oom || p.voc.oom || p.tab.oom || p.fp.oom) {
        rc = jlm_errf(err, JLM_ENOMEM, "plan: out of memory");
        goto fail;
    }
    jlm_header *h = &p.hdr;
    h->version = JLM_VERSION;
    h->n_tensors = n;
    h->n_blocks = cfg->n_layer;
    h->cfg_off = JLM_HEADER_LEN; h->cfg_len = p.cfg.len;
    h->vis_off = h->cfg_off + h->cfg_len; h->vis_len = p.vis.len;
    h->voc_off = h->vis_off + h->vis_len; h->voc_len = p.voc.len;
    h->tab_off = h->voc_off + h->voc_len; h->tab_len = p.tab.len;
    h->fp_off = h->tab_off + h->tab_len; h->fp_len = p.fp.len;
    h->dense_off = jlm_align_up(h->fp_off + h->fp_len);

    /* Pass over the table: dense offsets absolute, paged offsets page-relative. */
    uint64_t dense = h->dense_off, exp_used = 0, minp = UINT64_MAX, min_sheet = UINT64_MAX;
    uint64_t *exp_cursor = calloc((size_t)cfg->n_layer + 1, sizeof *exp_cursor);
    if (!exp_cursor) {
        rc = jlm_errf(err, JLM_ENOMEM, "plan: out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        jlm_tensor *t = &p.tensors[i];
        const jlm_tensor_planes *q = &pl[i];
        if (t->block < 0 || jlm_fmt_role_is_dense(t->role)) {
            dense = place(dense, q->qs_len, q->d_len, q->sc_len, &t->qs_off, &t->d_off, &t->sc_off);
            p.dense_used = dense;
        } else if (jlm_fmt_role_is_bank(t->role)) {
            exp_cursor[t->block] = place(exp_cursor[t->block], q->qs_len, q->d_len, q->sc_len,
                                         &t->qs_off, &t->d_off, &t->sc_off);
            if (exp_cursor[t->block] > exp_used) exp_used = exp_cursor[t->block];
            minplane(&minp, q->sheet_qs, q->sheet_d, q->sheet_sc);
            minplane(&min_sheet, q->sheet_qs, q->sheet_d, q->sheet_sc);
        } else if (is_vision_role(t->role)) {
            vis_used[t->block] = place(vis_used[t->block], q->qs_len, q->d_len, q->sc_len,
                                       &t->qs_off, &t->d_off, &t->sc_off);
            minplane(&minp, q->qs_len, q->d_len, q->sc_len);
        } else {
            text_used[t->block] = place(text_used[t->block], q->qs_len, q->d_len, q->sc_len,
                                        &t->qs_off, &t->d_off, &t->sc_off);
            minplane(&minp, q->qs_len, q->d_len, q->sc_len);
        }
    }
    free(exp_cursor);
    h->dense_len = jlm_align_up(dense) - h->dense_off;
    h->data_off = jlm_align_up(h->dense_off + h->dense_len);
    uint64_t ps = 0, vps = 0;
    for (uint32_t b = 0; b < cfg->n_layer; b++) if (text_used[b] > ps) ps = text_used[b];
    for (uint32_t b = 0; b < nvis; b++) if (vis_used[b] > vps) vps = vis_used[b];
    h->page_size = ps ? jlm_align_up(ps) : JLM_ALIGN;
    h->n_vis_blocks = nvis;
    h->vis_page_size = nvis ? jlm_align_up(vps ? vps : 1) : 0;
    uint64_t text_bytes, vis_bytes, exp_bytes;
    if (__builtin_mul_overflow((uint64_t)h->n_blocks, h->page_size, &text_bytes) ||
        __builtin_mul_overflow((uint64_t)nvis, h->vis_page_size, &vis_bytes)) {
        rc = jlm_errf(err, JLM_EFORMAT, "plan: page arrays overflow");
        goto fail;
    }
    h->vis_data_off = jlm_align_up(h->data_off + text_bytes);
    uint64_t eof = nvis ? h->vis_data_off + vis_bytes : h->data_off + text_bytes;
    if (n_moe) {
        h->exp_page_size = jlm_align_up(exp_used);
        h->n_exp_pages = n_moe * cfg->n_expert;
        h->exp_data_off = jlm_align_up(h->vis_data_off + vis_bytes);
        if (__builtin_mul_overflow((uint64_t)h->n_exp_pages, h->exp_page_size, &exp_bytes)) {
            rc = jlm_errf(err, JLM_EFORMAT, "plan: expert page array overflows");
            goto fail;
        }
        eof = h->exp_data_off + exp_bytes;
    }
    p.file_size = eof;

    /* Page-relative -> absolute. */
    for (uint32_t i = 0; i < n; i++) {
        jlm_tensor *t = &p.tensors[i];
        uint64_t base;
        if (t->block < 0 || jlm_fmt_role_is_dense(t->role))
            continue;
        if (jlm_fmt_role_is_bank(t->role))
            base = h->exp_data_off + (uint64_t)moe_rank[t->block] * cfg->n_expert * h->exp_page_size;
        else if (is_vision_role(t->role))
            base = h->vis_data_off + (uint64_t)t->block * h->vis_page_size;
        else
            base = h->data_off + (uint64_t)t->block * h->page_size;
        t->qs_off += base; t->d_off += base; t->sc_off += base;
    }
    /* Table again, now with offsets (same length). */
    p.tab.len = 0;
    for (uint32_t i = 0; i < n; i++)
        jlm_fmt_tensor_encode(&p.tab, &p.tensors[i]);

    /* Chunk: largest power of two <= min(1 MiB, smallest paged plane), >= 4096. */
    uint64_t lim = minp == UINT64_MAX ? JLM_ALIGN : minp < JLM_MAX_CHUNK ? minp : JLM_MAX_CHUNK;
    uint64_t chunk = JLM_ALIGN;
    while (chunk * 2 <= lim)
        chunk *= 2;
    h->chunk = chunk;
    /* StreamGroups: largest g <= NExpertUsed with ceil(used/g) * min_sheet >= 64 KiB. */
    h->stream_groups = 1;
    if (n_moe && cfg->n_expert_used >= 2 && min_sheet != UINT64_MAX)
        for (uint32_t g = cfg->n_expert_used; g >= 1; g--)
            if ((uint64_t)((cfg->n_expert_used + g - 1) / g) * min_sheet >= 65536) {
                h->stream_groups = g;
                break;
            }
    free(pl); free(text_used); free(vis_used); free(moe_rank);
    *out = p;
    return JLM_OK;
fail:
    free(pl); free(text_used); free(vis_used); free(moe_rank);
    jlm_fmt_plan_free(&p);
    return rc;
}

void jlm_fmt_plan_free(jlm_plan *p)
{
    if (!p)
        return;
    free(p->tensors);
    jlm_buf_free(&p->cfg); jlm_buf_free(&p->vis); jlm_buf_free(&p->voc);
    jlm_buf_free(&p->tab); jlm_buf_free(&p->fp);
    memset(p, 0, sizeof *p);
}
