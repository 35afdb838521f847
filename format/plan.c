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
#include "format/jlm_format.h"

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

/* ---------------------------------------------------------------- the planner's phases */
/* What the phases share. Offsets of paged tensors stay page-relative until
 * plan_absolute. */
typedef struct planner {
    const jlm_plan_input *in;
    const jlm_config     *cfg;
    uint32_t              n, nvis, n_moe;
    jlm_plan              p;
    jlm_tensor_planes    *pl;          /* (n,) plane lengths */
    uint64_t             *text_used;   /* (n_layer+1,) bytes used in text page b */
    uint64_t             *vis_used;    /* (nvis+1,) bytes used in vision page b */
    uint64_t             *exp_cursor;  /* (n_layer+1,) bytes used in block b's expert sheet */
    int32_t              *moe_rank;    /* (n_layer+1,) rank among MoE blocks or -1 */
    uint64_t              exp_used;    /* largest exp_cursor */
    uint64_t              minp;        /* smallest paged plane (Chunk) */
    uint64_t              min_sheet;   /* smallest expert-sheet plane (StreamGroups) */
} planner;

static void planner_free(planner *P)
{
    free(P->pl); free(P->text_used); free(P->vis_used); free(P->exp_cursor); free(P->moe_rank);
}

static int plan_alloc(planner *P, jlm_err *err)
{
    uint32_t n = P->n, nl = P->cfg->n_layer;
    P->p.tensors = calloc(n ? n : 1, sizeof *P->p.tensors);
    P->pl = calloc(n ? n : 1, sizeof *P->pl);
    P->text_used = calloc((size_t)nl + 1, sizeof *P->text_used);
    P->vis_used = calloc((size_t)P->nvis + 1, sizeof *P->vis_used);
    P->exp_cursor = calloc((size_t)nl + 1, sizeof *P->exp_cursor);
    P->moe_rank = malloc(((size_t)nl + 1) * sizeof *P->moe_rank);
    if (!P->p.tensors || !P->pl || !P->text_used || !P->vis_used || !P->exp_cursor || !P->moe_rank)
        return jlm_errf(err, JLM_ENOMEM, "plan: out of memory");
    if (n)
        memcpy(P->p.tensors, P->in->tensors, n * sizeof *P->p.tensors);
    P->p.n_tensors = n;
    return JLM_OK;
}

/* Phase 1: shapes, regions, and which blocks are MoE blocks (their rank). */
static int plan_shapes(planner *P, jlm_err *err)
{
    const jlm_config *cfg = P->cfg;
    for (uint32_t b = 0; b <= cfg->n_layer; b++)
        P->moe_rank[b] = -1;
    for (uint32_t i = 0; i < P->n; i++) {
        jlm_tensor *t = &P->p.tensors[i];
        int rc = jlm_fmt_tensor_planes(t, &P->pl[i], err);
        if (rc)
            return rc;
        const jlm_tensor_planes *q = &P->pl[i];
        if (q->qs_len > JLM_MAX_PLANE || q->d_len > JLM_MAX_PLANE || q->sc_len > JLM_MAX_PLANE)
            return jlm_errf(err, JLM_ERANGE, "plan: tensor '%s' has a plane over 1 TiB", t->name.s);
        uint32_t lim = is_vision_role(t->role) ? P->nvis : cfg->n_layer;
        if (t->block >= 0 && (uint32_t)t->block >= lim)
            return jlm_errf(err, JLM_EFORMAT, "plan: tensor '%s' in block %d, model has %u", t->name.s, t->block, lim);
        if (jlm_fmt_role_is_bank(t->role)) {
            if (t->block < 0 || t->ndim != 3 || t->dims[2] != cfg->n_expert)
                return jlm_errf(err, JLM_EFORMAT, "plan: expert bank '%s' must be 3-D with %u experts in a block",
                                t->name.s, cfg->n_expert);
            P->moe_rank[t->block] = 0;
        }
        if (t->role >= JLM_R_EXP1_GATE && t->role <= JLM_R_EXP1_DOWN)
            return jlm_errf(err, JLM_EUNSUPPORTED, "plan: single-expert tensor '%s': merge experts into a bank", t->name.s);
    }
    for (uint32_t b = 0; b < cfg->n_layer; b++)
        if (P->moe_rank[b] == 0)
            P->moe_rank[b] = (int32_t)P->n_moe++;
    return JLM_OK;
}

/* Phase 2: the sections, encoded (table offsets still zero: same length), and
 * their places in the header; the dense region starts after them. */
static int plan_sections(planner *P, jlm_err *err)
{
    jlm_plan *p = &P->p;
    jlm_fmt_config_encode(&p->cfg, P->cfg);
    if (P->in->vision)
        jlm_fmt_vision_encode(&p->vis, P->in->vision);
    jlm_fmt_vocab_encode(&p->voc, P->in->vocab);
    for (uint32_t i = 0; i < P->n; i++)
        jlm_fmt_tensor_encode(&p->tab, &p->tensors[i]);
    jlm_fmt_fingerprint_encode(&p->fp, P->in->fp);
    if (p->cfg.oom || p->vis.oom || p->voc.oom || p->tab.oom || p->fp.oom)
        return jlm_errf(err, JLM_ENOMEM, "plan: out of memory");
    jlm_header *h = &p->hdr;
    h->version = JLM_VERSION;
    h->n_tensors = P->n;
    h->n_blocks = P->cfg->n_layer;
    h->cfg_off = JLM_HEADER_LEN; h->cfg_len = p->cfg.len;
    h->vis_off = h->cfg_off + h->cfg_len; h->vis_len = p->vis.len;
    h->voc_off = h->vis_off + h->vis_len; h->voc_len = p->voc.len;
    h->tab_off = h->voc_off + h->voc_len; h->tab_len = p->tab.len;
    h->fp_off = h->tab_off + h->tab_len; h->fp_len = p->fp.len;
    h->dense_off = jlm_align_up(h->fp_off + h->fp_len);
    return JLM_OK;
}

/* Phase 3: one pass over the table in order: dense offsets absolute, paged
 * offsets relative to their page; the smallest planes for Chunk and groups. */
static void plan_place(planner *P)
{
    uint64_t dense = P->p.hdr.dense_off;
    P->minp = P->min_sheet = UINT64_MAX;
    for (uint32_t i = 0; i < P->n; i++) {
        jlm_tensor *t = &P->p.tensors[i];
        const jlm_tensor_planes *q = &P->pl[i];
        if (t->block < 0 || jlm_fmt_role_is_dense(t->role)) {
            dense = place(dense, q->qs_len, q->d_len, q->sc_len, &t->qs_off, &t->d_off, &t->sc_off);
            P->p.dense_used = dense;
        } else if (jlm_fmt_role_is_bank(t->role)) {
            uint64_t *c = &P->exp_cursor[t->block];
            *c = place(*c, q->qs_len, q->d_len, q->sc_len, &t->qs_off, &t->d_off, &t->sc_off);
            if (*c > P->exp_used) P->exp_used = *c;
            minplane(&P->minp, q->sheet_qs, q->sheet_d, q->sheet_sc);
            minplane(&P->min_sheet, q->sheet_qs, q->sheet_d, q->sheet_sc);
        } else if (is_vision_role(t->role)) {
            P->vis_used[t->block] = place(P->vis_used[t->block], q->qs_len, q->d_len, q->sc_len,
                                          &t->qs_off, &t->d_off, &t->sc_off);
            minplane(&P->minp, q->qs_len, q->d_len, q->sc_len);
        } else {
            P->text_used[t->block] = place(P->text_used[t->block], q->qs_len, q->d_len, q->sc_len,
                                           &t->qs_off, &t->d_off, &t->sc_off);
            minplane(&P->minp, q->qs_len, q->d_len, q->sc_len);
        }
    }
    P->p.hdr.dense_len = jlm_align_up(dense) - P->p.hdr.dense_off;
}

/* Phase 4: page sizes and the three page arrays after the dense region; the
 * file size. JLM_EFORMAT when an array's size overflows. */
static int plan_arrays(planner *P, jlm_err *err)
{
    jlm_header *h = &P->p.hdr;
    uint32_t nvis = P->nvis;
    h->data_off = jlm_align_up(h->dense_off + h->dense_len);
    uint64_t ps = 0, vps = 0;
    for (uint32_t b = 0; b < P->cfg->n_layer; b++) if (P->text_used[b] > ps) ps = P->text_used[b];
    for (uint32_t b = 0; b < nvis; b++) if (P->vis_used[b] > vps) vps = P->vis_used[b];
    h->page_size = ps ? jlm_align_up(ps) : JLM_ALIGN;
    h->n_vis_blocks = nvis;
    h->vis_page_size = nvis ? jlm_align_up(vps ? vps : 1) : 0;
    uint64_t text_bytes, vis_bytes, exp_bytes;
    if (__builtin_mul_overflow((uint64_t)h->n_blocks, h->page_size, &text_bytes) ||
        __builtin_mul_overflow((uint64_t)nvis, h->vis_page_size, &vis_bytes))
        return jlm_errf(err, JLM_EFORMAT, "plan: page arrays overflow");
    h->vis_data_off = jlm_align_up(h->data_off + text_bytes);
    uint64_t eof = nvis ? h->vis_data_off + vis_bytes : h->data_off + text_bytes;
    if (P->n_moe) {
        h->exp_page_size = jlm_align_up(P->exp_used);
        h->n_exp_pages = P->n_moe * P->cfg->n_expert;
        h->exp_data_off = jlm_align_up(h->vis_data_off + vis_bytes);
        if (__builtin_mul_overflow((uint64_t)h->n_exp_pages, h->exp_page_size, &exp_bytes))
            return jlm_errf(err, JLM_EFORMAT, "plan: expert page array overflows");
        eof = h->exp_data_off + exp_bytes;
    }
    P->p.file_size = eof;
    return JLM_OK;
}

/* Phase 5: page-relative offsets made absolute; the table encoded again, now
 * with offsets (same length). */
static void plan_absolute(planner *P)
{
    const jlm_header *h = &P->p.hdr;
    for (uint32_t i = 0; i < P->n; i++) {
        jlm_tensor *t = &P->p.tensors[i];
        uint64_t base;
        if (t->block < 0 || jlm_fmt_role_is_dense(t->role))
            continue;
        if (jlm_fmt_role_is_bank(t->role))
            base = h->exp_data_off + (uint64_t)P->moe_rank[t->block] * P->cfg->n_expert * h->exp_page_size;
        else if (is_vision_role(t->role))
            base = h->vis_data_off + (uint64_t)t->block * h->vis_page_size;
        else
            base = h->data_off + (uint64_t)t->block * h->page_size;
        t->qs_off += base; t->d_off += base; t->sc_off += base;
    }
    P->p.tab.len = 0;
    for (uint32_t i = 0; i < P->n; i++)
        jlm_fmt_tensor_encode(&P->p.tab, &P->p.tensors[i]);
}

/* Phase 6: Chunk is the largest power of two <= min(1 MiB, smallest paged
 * plane), >= 4096; StreamGroups the largest g <= NExpertUsed with
 * ceil(used/g) * min_sheet >= 64 KiB. */
static void plan_chunk_and_groups(planner *P)
{
    jlm_header *h = &P->p.hdr;
    const jlm_config *cfg = P->cfg;
    uint64_t lim = P->minp == UINT64_MAX ? JLM_ALIGN : P->minp < JLM_MAX_CHUNK ? P->minp : JLM_MAX_CHUNK;
    uint64_t chunk = JLM_ALIGN;
    while (chunk * 2 <= lim)
        chunk *= 2;
    h->chunk = chunk;
    h->stream_groups = 1;
    if (P->n_moe && cfg->n_expert_used >= 2 && P->min_sheet != UINT64_MAX)
        for (uint32_t g = cfg->n_expert_used; g >= 1; g--)
            if ((uint64_t)((cfg->n_expert_used + g - 1) / g) * P->min_sheet >= 65536) {
                h->stream_groups = g;
                break;
            }
}

int jlm_fmt_plan(const jlm_plan_input *in, jlm_plan *out, jlm_err *err)
{
    planner P = {.in = in, .cfg = in->config, .n = in->n_tensors, .nvis = in->vision ? in->vision->n_layer : 0};
    /* Untrusted sizes first: nothing below is sized before the config is
     * bounded (sanity.c); shapes against the config are the caller's check
     * (jlm_fmt_shapes_check: the converter and the engine). */
    int rc = jlm_fmt_config_check(in->config, "plan", err);
    if (!rc && P.n > JLM_MAX_TENSORS)
        rc = jlm_errf(err, JLM_ERANGE, "plan: %u tensors, at most %u are accepted", P.n, JLM_MAX_TENSORS);
    if (!rc && P.nvis > JLM_MAX_LAYERS)
        rc = jlm_errf(err, JLM_ERANGE, "plan: vision tower has %u layers, at most %u are accepted", P.nvis,
                      JLM_MAX_LAYERS);
    if (!rc)
        rc = check_unique(in->tensors, P.n, "plan", err);
    if (rc)
        return rc;
    if (!(rc = plan_alloc(&P, err)) && !(rc = plan_shapes(&P, err)) && !(rc = plan_sections(&P, err))) {
        plan_place(&P);
        if (!(rc = plan_arrays(&P, err))) {
            plan_absolute(&P);
            plan_chunk_and_groups(&P);
        }
    }
    planner_free(&P);
    if (rc) {
        jlm_fmt_plan_free(&P.p);
        return rc;
    }
    *out = P.p;
    return JLM_OK;
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
