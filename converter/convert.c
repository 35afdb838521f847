/* convert.c - the conversion driver: GGUF -> mapped tensors -> plan (pass 1)
 * -> packed planes in OUT.part -> read-back checks -> rename (pass 2). */
#include "converter/convert_int.h"
#include "converter/hf.h"
#include "converter/pack.h"
#include "converter/quantize.h"
#include "converter/vocab.h"
#include "format/dequant.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- tensor mapping */
typedef struct mapped { jlm_tensor t; jlm_conv_src s; } mapped;

static int cmp_mapped(const void *a, const void *b)
{
    const jlm_tensor *x = &((const mapped *)a)->t, *y = &((const mapped *)b)->t;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    if (x->role != y->role) return x->role < y->role ? -1 : 1;
    return 0;
}

/* The tensors whose stored type differs from their source (or --type)
 * type, counted per (from, to) pair: one note line per pair, not one per
 * tensor (a real model has hundreds). */
#define CHANGES_MAX 32
typedef struct change { uint32_t from; uint8_t to; int exact; uint32_t n; const char *first; } change;
typedef struct changes { change p[CHANGES_MAX]; int n; } changes;

static void change_count(changes *ch, uint32_t from, uint8_t to, int exact, const char *name)
{
    for (int i = 0; i < ch->n; i++)
        if (ch->p[i].from == from && ch->p[i].to == to) {
            ch->p[i].n++;
            return;
        }
    if (ch->n < CHANGES_MAX)
        ch->p[ch->n++] = (change){from, to, exact, 1, name};
}

static void change_notes(const jlm_conv *c, const changes *ch, FILE *notes)
{
    for (int i = 0; notes && i < ch->n; i++)
        fprintf(notes, "note: %s: %u tensor%s %s (first '%s') stored as %s (%s)\n", c->src_path, ch->p[i].n,
                ch->p[i].n == 1 ? "" : "s", jlm_ggml_type_name(ch->p[i].from) ? jlm_ggml_type_name(ch->p[i].from) : "?", ch->p[i].first,
                jlm_fmt_type_traits(ch->p[i].to)->name,
                ch->p[i].exact ? "the same values: the container's layout for it" : "re-quantized");
}

/* Adds one container tensor taking `rows` rows of source tensor gi from row0. */
static int add(jlm_conv *c, mapped *v, uint32_t *n, uint32_t gi, uint16_t role, int32_t block,
               uint64_t row0, uint64_t rows, changes *ch, jlm_err *err)
{
    const jlm_gguf_tensor *gt = &c->g->tensors[gi];
    mapped *m = &v[(*n)++];
    memset(m, 0, sizeof *m);
    int exact;
    uint32_t qt = jlm_quant_choice(c->quant, gt->name.s, gt->n_dims, gt->ne[0], gt->type, c->config.n_layer,
                                   c->config.n_expert);
    int rc = jlm_pack_stored_type(qt, &m->t.type, &exact, err);
    if (rc)
        return jlm_err_prefix(err, rc, "%s: tensor '%s'", c->src_path, gt->name.s);
    if (qt != gt->type)
        m->s.qtype = qt;    /* --type: the read-back compares with the quantized source row */
    const char *qn = jlm_ggml_type_name(qt);
    if (row0 == 0 && (!exact || !qn || strcmp(qn, jlm_fmt_type_traits(m->t.type)->name)))
        change_count(ch, qt, m->t.type, exact, gt->name.s);
    m->t.role = role;
    m->t.block = block;
    m->t.index = -1;
    m->t.ndim = (uint8_t)(gt->n_dims ? gt->n_dims : 1);
    for (int d = 0; d < 4; d++)
        m->t.dims[d] = gt->ne[d] ? gt->ne[d] : 1;
    if (m->t.ndim >= 2)
        m->t.dims[1] = rows;
    m->t.name.s = gt->name.s;
    m->t.name.len = (uint32_t)gt->name.len;
    m->s.gguf_idx = gi;
    m->s.row0 = row0;
    m->s.src_type = gt->type;
    m->s.exact = exact;
    return JLM_OK;
}

static int map_tensors(jlm_conv *c, FILE *notes, jlm_err *err)
{
    const jlm_gguf *g = c->g;
    const jlm_config *k = &c->config;
    mapped *v = calloc(g->n_tensors * 3 + 1, sizeof *v);
    if (!v)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", c->src_path);
    uint32_t n = 0, n_nextn = 0, nextn = 0;
    int rc = JLM_OK;
    changes ch = {.n = 0};
    if (jlm_gguf_get_u32(g, "glm4moe.nextn_predict_layers", &nextn, NULL))
        nextn = 0;
    for (uint32_t i = 0; i < g->n_tensors && !rc; i++) {
        const jlm_gguf_tensor *gt = &g->tensors[i];
        int32_t blk;
        int fused;
        int role = jlm_conv_role(gt->name.s, &blk, &fused);
        if (blk >= 0 && (uint32_t)blk >= k->n_layer && (uint32_t)blk - k->n_layer < nextn) {
            n_nextn++;   /* a glm4moe NextN/MTP block (nextn.* tensors too): not run, kept out of the pages */
            continue;
        }
        if (!role) {
            rc = jlm_errf(err, JLM_EUNSUPPORTED, "%s: tensor '%s' has no role for architecture %s", c->src_path,
                          gt->name.s, jlm_fmt_arch_name(k->arch));
            break;
        }
        if (k->arch == JLM_ARCH_DEEPSEEK2 && role == JLM_R_POST_ATTN_NORM)
            role = JLM_R_FFN_NORM;   /* glm4moe's pre-FFN norm is named post_attention_norm */
        if (blk >= 0 && (uint32_t)blk >= k->n_layer) {
            rc = jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s' is in block %d of %u", c->src_path, gt->name.s, blk, k->n_layer);
            break;
        }
        uint64_t rows = gt->n_dims >= 2 ? gt->ne[1] : 1;
        if (fused == 1 || fused == 2) {   /* q | k | v by rows (bias: by elements of a 1-D tensor) */
            uint64_t q = (uint64_t)k->n_head * k->head_dim, kk = (uint64_t)k->n_kv_head * k->head_dim;
            uint64_t vv = (uint64_t)k->n_kv_head * (k->head_dim_v ? k->head_dim_v : k->head_dim);
            uint64_t total = fused == 1 ? rows : gt->ne[0];
            if (q + kk + vv != total) {
                rc = jlm_errf(err, JLM_EFORMAT, "%s: fused '%s' has %llu rows, expected q %llu + k %llu + v %llu",
                              c->src_path, gt->name.s, (unsigned long long)total, (unsigned long long)q,
                              (unsigned long long)kk, (unsigned long long)vv);
                break;
            }
            if (fused == 2) {
                rc = jlm_errf(err, JLM_EUNSUPPORTED, "%s: fused bias '%s' is not supported yet", c->src_path, gt->name.s);
                break;
            }
            (void)((rc = add(c, v, &n, i, JLM_R_ATTN_Q, blk, 0, q, &ch, err)) ||
                   (rc = add(c, v, &n, i, JLM_R_ATTN_K, blk, q, kk, &ch, err)) ||
                   (rc = add(c, v, &n, i, JLM_R_ATTN_V, blk, q + kk, vv, &ch, err)));
            continue;
        }
        if (role == JLM_R_FFN_UP && k->arch == JLM_ARCH_PHI3) {   /* phi3: ffn_up = gate | up */
            char gate[96];
            snprintf(gate, sizeof gate, "blk.%d.ffn_gate.weight", blk);
            if (!jlm_gguf_find_tensor(g, gate)) {
                if (rows % 2) {
                    rc = jlm_errf(err, JLM_EFORMAT, "%s: fused gate|up '%s' has an odd row count", c->src_path, gt->name.s);
                    break;
                }
                (void)((rc = add(c, v, &n, i, JLM_R_FFN_GATE, blk, 0, rows / 2, &ch, err)) ||
                       (rc = add(c, v, &n, i, JLM_R_FFN_UP, blk, rows / 2, rows / 2, &ch, err)));
                continue;
            }
        }
        rc = add(c, v, &n, i, (uint16_t)role, blk, 0, rows, &ch, err);
    }
    if (rc) {
        free(v);
        return rc;
    }
    change_notes(c, &ch, notes);
    if (n_nextn && notes)
        fprintf(notes, "note: %s: %u NextN/MTP block(s) (%u tensors) skipped: blocks %u..%u are not run and not stored\n",
                c->src_path, nextn, n_nextn, k->n_layer, k->n_layer + nextn - 1);
    qsort(v, n, sizeof *v, cmp_mapped);
    c->tensors = jlm_arena_alloc(c->arena, (n ? n : 1) * sizeof *c->tensors);
    c->src = jlm_arena_alloc(c->arena, (n ? n : 1) * sizeof *c->src);
    if (!c->tensors || !c->src) {
        free(v);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", c->src_path);
    }
    for (uint32_t i = 0; i < n; i++) {
        c->tensors[i] = v[i].t;
        c->src[i] = v[i].s;
    }
    c->n_tensors = n;
    free(v);
    return JLM_OK;
}

/* ---------------------------------------------------------------- open / plan */
static int has_role(const jlm_conv *c, uint16_t role)
{
    for (uint32_t i = 0; i < c->n_tensors; i++)
        if (c->tensors[i].role == role)
            return 1;
    return 0;
}

int jlm_conv_open(const char *src_path, FILE *notes, jlm_conv **out, jlm_err *err)
{
    return jlm_conv_open_full(-1, src_path, NULL, NULL, notes, out, err);
}

int jlm_conv_open_at(int root_fd, const char *src_path, FILE *notes, jlm_conv **out, jlm_err *err)
{
    return jlm_conv_open_full(root_fd, src_path, NULL, NULL, notes, out, err);
}

int jlm_conv_open_mm(const char *src_path, const char *mm_path, FILE *notes, jlm_conv **out, jlm_err *err)
{
    return jlm_conv_open_full(-1, src_path, mm_path, NULL, notes, out, err);
}

int jlm_conv_open_as(const char *src_path, const char *type, FILE *notes, jlm_conv **out, jlm_err *err)
{
    return jlm_conv_open_full(-1, src_path, NULL, type, notes, out, err);
}

int jlm_conv_open_full(int root_fd, const char *src_path, const char *mm_path, const char *type, FILE *notes,
                       jlm_conv **out, jlm_err *err)
{
    uint32_t quant = 0;
    if (type && jlm_quant_parse(type, &quant, err))
        return JLM_EUNSUPPORTED;
    jlm_conv *c = calloc(1, sizeof *c);
    if (!c || !(c->arena = jlm_arena_new())) {
        free(c);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", src_path);
    }
    c->quant = quant;
    /* an HF folder: below root_fd (the daemon's SRC) when given, as a GGUF is */
    int hf = root_fd < 0 ? jlm_hf_is_folder(src_path) : jlm_hf_is_folder_at(root_fd, src_path);
    int rc = hf ? jlm_hf_open_at(root_fd, src_path, notes, &c->g, err)
                : jlm_gguf_open_at(root_fd, src_path, &c->g, err);
    if (rc)
        goto fail;
    c->src_path = c->g->path;
    if ((rc = jlm_conv_config(c->g, &c->config, err)))
        goto fail;
    if ((rc = jlm_conv_vocab(c->g, c->arena, &c->vocab, err)))
        goto fail;
    if (c->config.arch != JLM_ARCH_NONE && c->config.n_vocab == 0)
        c->config.n_vocab = c->vocab.n_tokens;
    if (c->config.arch == JLM_ARCH_NONE)
        c->config.n_vocab = c->vocab.n_tokens;
    c->fp.host.s = "x86_64"; c->fp.host.len = 6;
    c->fp.device.s = "cpu"; c->fp.device.len = 3;
    c->fp.writer.s = JLM_WRITER_NAME; c->fp.writer.len = (uint32_t)strlen(JLM_WRITER_NAME);
    if (c->config.arch != JLM_ARCH_NONE && (rc = map_tensors(c, notes, err)))
        goto fail;
    if (c->config.arch != JLM_ARCH_NONE && !has_role(c, JLM_R_TOKEN_EMBD)) {
        rc = jlm_errf(err, JLM_EFORMAT, "%s: no token_embd.weight tensor", c->src_path);
        goto fail;
    }
    if ((rc = jlm_fmt_shapes_check(&c->config, c->tensors, c->n_tensors, c->src_path, err)))
        goto fail;
    if (mm_path && (rc = jlm_conv_map_vision(c, root_fd, mm_path, notes, err)))
        goto fail;
    jlm_plan_input in = {.config = &c->config, .vocab = &c->vocab, .fp = &c->fp,
                         .vision = c->mm ? &c->vision : NULL, .n_tensors = c->n_tensors, .tensors = c->tensors};
    if ((rc = jlm_fmt_plan(&in, &c->plan, err))) {
        jlm_err_prefix(err, rc, "%s", c->src_path);
        goto fail;
    }
    if ((rc = jlm_conv_check_proportion(c, err)))
        goto fail;
    if (c->n_tensors)
        memcpy(c->tensors, c->plan.tensors, c->n_tensors * sizeof *c->tensors);
    *out = c;
    return JLM_OK;
fail:
    jlm_conv_close(c);
    return rc;
}

int jlm_conv_set_device(jlm_conv *c, const char *device, jlm_err *err)
{
    if (!device || (strcmp(device, "cpu") && strcmp(device, "vulkan") && strcmp(device, "cuda")))
        return jlm_errf(err, JLM_EINVAL, "--device '%.40s': expected cpu, vulkan or cuda", device ? device : "");
    c->fp.device.s = device;   /* a literal or the caller's argv: outlives c */
    c->fp.device.len = (uint32_t)strlen(device);
    /* the fingerprint's length moves the dense region: plan again */
    jlm_fmt_plan_free(&c->plan);
    memset(&c->plan, 0, sizeof c->plan);
    jlm_plan_input in = {.config = &c->config, .vocab = &c->vocab, .fp = &c->fp,
                         .vision = c->mm ? &c->vision : NULL, .n_tensors = c->n_tensors, .tensors = c->tensors};
    int rc = jlm_fmt_plan(&in, &c->plan, err);
    if (rc)
        return jlm_err_prefix(err, rc, "%s", c->src_path);
    if ((rc = jlm_conv_check_proportion(c, err)))
        return rc;
    if (c->n_tensors)
        memcpy(c->tensors, c->plan.tensors, c->n_tensors * sizeof *c->tensors);
    return JLM_OK;
}

void jlm_conv_close(jlm_conv *c)
{
    if (!c)
        return;
    jlm_fmt_plan_free(&c->plan);
    jlm_gguf_close(c->g);
    jlm_gguf_close(c->mm);
    jlm_arena_free(c->arena);
    free(c);
}

char *jlm_conv_default_out(const char *src)
{
    size_t n = strlen(src);
    char *o = malloc(n + 5);
    if (!o)
        return NULL;
    memcpy(o, src, n + 1);
    while (n > 1 && o[n - 1] == '/')   /* an HF folder: DIR/ -> DIR.jlm */
        o[--n] = 0;
    if (n > 5 && !strcmp(o + n - 5, ".gguf"))
        o[n - 5] = 0;
    strcat(o, ".jlm");
    return o;
}

/* ---------------------------------------------------------------- pass 2: packing */
/* Source bytes of one sheet (rows x k from row0) of a container tensor. */
static uint64_t src_row_bytes(uint32_t type, uint64_t k)
{
    return k / jlm_ggml_block_elems(type) * jlm_ggml_block_bytes(type);
}

/* --type: source rows (F32/F16/BF16) -> f32 -> s->qtype blocks in *q (allocated once). */
static int quantize_rows(const jlm_conv_src *s, const uint8_t *src, uint64_t k, uint64_t rows, uint8_t **q, jlm_err *err)
{
    uint64_t rb = src_row_bytes(s->src_type, k), qb = src_row_bytes(s->qtype, k);
    float *f = malloc(k * sizeof *f);
    if (!*q)
        *q = malloc(qb * rows + 1);
    int rc = f && *q ? 0 : jlm_errf(err, JLM_ENOMEM, "quantize: out of memory");
    for (uint64_t r = 0; r < rows && !rc; r++)
        if (!(rc = jlm_ggml_dequant_row(s->src_type, src + r * rb, f, k, err)))
            rc = jlm_quant_row(s->qtype, f, *q + r * qb, k, err);
    free(f);
    return rc;
}

/* A buffer kept across calls (grown, never shrunk): a fresh malloc of tens
 * of MB per tensor is an mmap whose every page faults on first touch (15-20%
 * of a conversion's CPU time in a VM, perf). */
typedef struct scratch { uint8_t *p; uint64_t cap; } scratch;

static uint8_t *scratch_get(scratch *b, uint64_t n)
{
    if (n > b->cap) {
        free(b->p);
        b->p = malloc(n);
        b->cap = b->p ? n : 0;
    }
    return b->p;
}

static int pack_tensor(jlm_conv *c, uint32_t i, int64_t expert, uint8_t *buf, uint64_t base, uint64_t len,
                       scratch *sb, jlm_err *err);

int jlm_conv_pack_tensor(jlm_conv *c, uint32_t i, int64_t expert, uint8_t *buf,
                         uint64_t base, uint64_t len, jlm_err *err)
{
    scratch sb = {0};
    int rc = pack_tensor(c, i, expert, buf, base, len, &sb, err);
    free(sb.p);
    return rc;
}

static int pack_tensor(jlm_conv *c, uint32_t i, int64_t expert, uint8_t *buf, uint64_t base, uint64_t len,
                       scratch *sb, jlm_err *err)
{
    const jlm_tensor *t = &c->tensors[i];
    const jlm_conv_src *s = &c->src[i];
    const jlm_gguf *g = jlm_conv_src_gguf(c, s);
    const jlm_gguf_tensor *gt = &g->tensors[s->gguf_idx];
    jlm_tensor_planes pl;
    int rc = jlm_fmt_tensor_planes(t, &pl, err);
    if (rc)
        return rc;
    int bank = jlm_fmt_role_is_bank(t->role);
    uint64_t k = jlm_tensor_k(t), rows = jlm_tensor_rows(t);
    uint64_t sheets = bank ? 1 : jlm_tensor_sheets(t);
    uint64_t rb = src_row_bytes(s->src_type, k);
    uint64_t src_rows_total = gt->n_dims >= 2 ? gt->ne[1] : 1;
    uint64_t sheet_src = rb * src_rows_total;          /* one full source sheet */
    uint64_t shift = bank ? (uint64_t)expert * c->plan.hdr.exp_page_size : 0;
    uint64_t qo = t->qs_off + shift, dof = t->d_off + shift, so = t->sc_off + shift;
    if (qo < base || qo + pl.qs_len > base + len || dof + pl.d_len > base + len || so + pl.sc_len > base + len)
        return jlm_errf(err, JLM_EINVAL, "tensor '%s': planes outside the buffer", t->name.s);
    uint8_t *src = scratch_get(sb, rb * rows + 1), *q = NULL;
    if (!src)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory packing '%s'", c->src_path, t->name.s);
    for (uint64_t sh = 0; sh < sheets && !rc; sh++) {
        uint64_t sheet = bank ? (uint64_t)expert : sh;
        uint64_t off = sheet * sheet_src + s->row0 * rb;
        rc = jlm_gguf_read(g, gt, off, src, rb * rows, err);
        if (!rc && s->qtype)
            rc = quantize_rows(s, src, k, rows, &q, err);
        if (!rc)
            rc = jlm_pack_matrix(s->qtype ? s->qtype : s->src_type, s->qtype ? q : src, k, rows, t->type, buf + (qo - base) + sh * pl.sheet_qs,
                                 buf + (dof - base) + sh * pl.sheet_d, buf + (so - base) + sh * pl.sheet_sc,
                                 t->name.s, err);
    }
    free(q);
    if (rc)
        return jlm_err_prefix(err, rc, "%s", c->src_path);
    return JLM_OK;
}

/* The span [first plane, end of last plane) of tensor i (for one expert). */
static void tensor_span(const jlm_conv *c, uint32_t i, uint64_t *off, uint64_t *len)
{
    const jlm_tensor *t = &c->tensors[i];
    jlm_tensor_planes pl;
    jlm_fmt_tensor_planes(t, &pl, NULL);
    uint64_t end = t->qs_off + pl.qs_len;
    if (t->d_off + pl.d_len > end) end = t->d_off + pl.d_len;
    if (t->sc_off + pl.sc_len > end) end = t->sc_off + pl.sc_len;
    *off = t->qs_off;
    *len = end - t->qs_off;
}

/* Read-back: the written file re-opens, its table equals the plan, and rows 0
 * and rows-1 of the first and last sheet dequantize to the source's values. */
static int verify(jlm_conv *c, const char *part, jlm_err *err)
{
    jlm_model *m;
    scratch vb = {0};
    int rc = jlm_fmt_open(part, &m, err);
    if (rc)
        return jlm_err_prefix(err, rc, "read-back");
    if (m->hdr.n_tensors != c->n_tensors || m->file_size != c->plan.file_size) {
        jlm_fmt_close(m);
        return jlm_errf(err, JLM_EIO, "%s: read-back: the written file differs from the plan", part);
    }
    for (uint32_t i = 0; i < c->n_tensors && !rc; i++) {
        const jlm_tensor *t = &m->tensors[i];
        const jlm_conv_src *s = &c->src[i];
        if (!s->exact)
            continue;
        uint64_t off, len, k = jlm_tensor_k(t), rows = jlm_tensor_rows(t);
        tensor_span(c, i, &off, &len);
        int bank = jlm_fmt_role_is_bank(t->role);
        uint64_t nsheet = bank ? t->dims[2] : jlm_tensor_sheets(t);
        uint8_t *buf = scratch_get(&vb, len);
        float *a = malloc(k * sizeof *a), *b = malloc(k * sizeof *b);
        uint8_t *srow = malloc(src_row_bytes(s->src_type, k)), *qrow = NULL;
        if (!buf || !a || !b || !srow)
            rc = jlm_errf(err, JLM_ENOMEM, "read-back: out of memory");
        jlm_tensor_planes pl;
        jlm_fmt_tensor_planes(t, &pl, NULL);
        uint64_t sheets[2] = {0, nsheet - 1};
        for (int si = 0; si < (nsheet > 1 ? 2 : 1) && !rc; si++) {   /* one sheet: read it once */
            uint64_t sh = sheets[si];
            uint64_t shift = bank ? sh * m->hdr.exp_page_size : 0;
            uint64_t in = bank ? 0 : sh;
            if (pread(m->fd, buf, len, (off_t)(off + shift)) != (ssize_t)len) {
                rc = jlm_errf(err, JLM_EIO, "%s: read-back of '%s' failed", part, t->name.s);
                break;
            }
            uint64_t rr[2] = {0, rows - 1};
            const jlm_gguf *g = jlm_conv_src_gguf(c, s);
            const jlm_gguf_tensor *gt = &g->tensors[s->gguf_idx];
            uint64_t rb = src_row_bytes(s->src_type, k), srows = gt->n_dims >= 2 ? gt->ne[1] : 1;
            for (int ri = 0; ri < 2 && !rc; ri++) {
                jlm_k_dequant_row_ref(t->type, buf + (t->qs_off - off) + in * pl.sheet_qs,
                                      buf + (t->d_off - off) + in * pl.sheet_d,
                                      buf + (t->sc_off - off) + in * pl.sheet_sc, k, rows, rr[ri], a);
                rc = jlm_gguf_read(g, gt, sh * rb * srows + (s->row0 + rr[ri]) * rb, srow, rb, err);
                if (!rc && s->qtype)
                    rc = quantize_rows(s, srow, k, 1, &qrow, err);
                if (!rc)
                    rc = jlm_ggml_dequant_row(s->qtype ? s->qtype : s->src_type, s->qtype ? qrow : srow, b, k, err);
                if (!rc && memcmp(a, b, k * sizeof *a))
                    rc = jlm_errf(err, JLM_EIO, "%s: read-back: tensor '%s' row %llu differs from the source",
                                  part, t->name.s, (unsigned long long)rr[ri]);
            }
        }
        free(a); free(b); free(srow); free(qrow);
    }
    free(vb.p);
    jlm_fmt_close(m);
    return rc;
}

static void copy_overlap(uint8_t *out, uint64_t off, uint64_t len, const uint8_t *src, uint64_t soff, uint64_t slen)
{
    uint64_t lo = off > soff ? off : soff, hi = off + len < soff + slen ? off + len : soff + slen;
    if (lo < hi)
        memcpy(out + (lo - off), src + (lo - soff), hi - lo);
}

int jlm_conv_read_span(jlm_conv *c, uint64_t off, size_t len, uint8_t *out, jlm_err *err)
{
    const jlm_plan *p = &c->plan;
    const jlm_header *h = &p->hdr;
    if (off > p->file_size || len > p->file_size - off)
        return jlm_errf(err, JLM_EINVAL, "%s: span [%llu, +%zu) past the planned %llu bytes", c->src_path,
                        (unsigned long long)off, len, (unsigned long long)p->file_size);
    memset(out, 0, len);
    if (off < h->dense_off) {
        uint8_t hdr[JLM_HEADER_LEN];
        jlm_fmt_header_encode(h, hdr);
        copy_overlap(out, off, len, hdr, 0, sizeof hdr);
        copy_overlap(out, off, len, p->cfg.p, h->cfg_off, p->cfg.len);
        copy_overlap(out, off, len, p->vis.p, h->vis_off, p->vis.len);
        copy_overlap(out, off, len, p->voc.p, h->voc_off, p->voc.len);
        copy_overlap(out, off, len, p->tab.p, h->tab_off, p->tab.len);
        copy_overlap(out, off, len, p->fp.p, h->fp_off, p->fp.len);
    }
    /* A tensor wholly inside the span (every tensor of a page the daemon
     * packs) is packed in place: out is zeroed, as the pipeline's buffers are,
     * and spans are disjoint. One that straddles an edge goes through a zeroed
     * buffer of its own. One source scratch serves them all, so a page costs
     * its reads and its packing, not an allocation and a copy per tensor. */
    scratch sb = {0}, tb = {0};
    int rc = JLM_OK;
    for (uint32_t i = 0; i < c->n_tensors && !rc; i++) {
        const jlm_tensor *t = &c->tensors[i];
        uint64_t toff, tlen;
        tensor_span(c, i, &toff, &tlen);
        int64_t nexp = jlm_fmt_role_is_bank(t->role) ? (int64_t)t->dims[2] : 1;
        for (int64_t x = 0; x < nexp && !rc; x++) {
            uint64_t s = toff + (jlm_fmt_role_is_bank(t->role) ? (uint64_t)x * h->exp_page_size : 0);
            if (s >= off + len || s + tlen <= off)
                continue;
            if (s >= off && s + tlen <= off + len) {
                rc = pack_tensor(c, i, x, out + (s - off), s, tlen, &sb, err);
                continue;
            }
            uint8_t *buf = scratch_get(&tb, tlen ? tlen : 1);
            if (!buf) {
                rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory", c->src_path);
                break;
            }
            memset(buf, 0, tlen);
            rc = pack_tensor(c, i, x, buf, s, tlen, &sb, err);
            if (!rc)
                copy_overlap(out, off, len, buf, s, tlen);
        }
    }
    free(sb.p);
    free(tb.p);
    return rc;
}

/* ---------------------------------------------------------------- pass 2: parallel writer */
/* jlm_conv_write packs on worker threads and writes on the calling thread.
 * A job is one tensor (one expert sheet of a bank): the workers claim jobs in
 * table order and pack each into its own zeroed buffer with
 * jlm_conv_pack_tensor (thread-safe: it only reads the conversion and preads
 * the source); the caller pwrites finished buffers in the order they finish,
 * frees them and reports progress. So the jlm_io seam, the progress callback
 * and the error message all stay on one thread, as before, and the output
 * bytes do not depend on the schedule (each job owns a disjoint span). Cost:
 * memory for the buffers in flight (packed, not yet written) is bounded by
 * PACK_BUDGET, except that one job is always allowed however large (the
 * largest tensor, e.g. a 128k-vocabulary embedding, ~150 MB at Q4_K for 2048
 * columns); jlm_conv_pack_tensor holds a source copy of the same size. */
#define PACK_BUDGET (512ull << 20)
#define PACK_MAX_WORKERS 64
/* Written buffers are recycled (the smallest one that fits), up to SPARES of
 * them and SPARE_BUDGET bytes; memory in use stays under PACK_BUDGET +
 * SPARE_BUDGET, and a large file's jobs fault their pages in only once. */
#define SPARES 16
#define SPARE_BUDGET (256ull << 20)

typedef struct pack_job {
    uint32_t i;          /* tensor */
    int64_t  x;          /* expert sheet of a bank, else 0 */
    uint64_t off, len;   /* the span written */
    uint8_t *buf;        /* packed, waiting for the writer; NULL otherwise */
    uint64_t cap;        /* buf's size (>= len: a recycled buffer) */
} pack_job;

typedef struct pack_run {
    jlm_conv       *c;
    pack_job       *jobs;      /* (n_jobs,) table order */
    uint32_t        n_jobs;
    pthread_mutex_t mu;        /* guards everything below */
    pthread_cond_t  cv;        /* any change below: broadcast */
    uint32_t        next;      /* next job to claim */
    uint32_t       *ready;     /* (n_jobs,) FIFO of packed jobs: [head, tail) */
    uint32_t        head, tail;
    uint64_t        in_flight; /* bytes claimed and not yet written */
    uint8_t        *spare[SPARES];   /* written buffers kept for reuse (zeroed again before it) */
    uint64_t        spare_cap[SPARES], spare_bytes;
    uint32_t        n_spare;
    int             stop;      /* set on the first error: claim nothing more */
    int             rc;        /* the first worker error, with its message */
    jlm_err         err;
} pack_run;

/* Under mu: the smallest spare of at least n bytes, taken off the list. */
static uint8_t *take_spare(pack_run *p, uint64_t n, uint64_t *cap)
{
    uint32_t best = p->n_spare;
    for (uint32_t i = 0; i < p->n_spare; i++)
        if (p->spare_cap[i] >= n && (best == p->n_spare || p->spare_cap[i] < p->spare_cap[best]))
            best = i;
    if (best == p->n_spare)
        return NULL;
    uint8_t *b = p->spare[best];
    *cap = p->spare_cap[best];
    p->spare_bytes -= p->spare_cap[best];
    p->n_spare--;
    p->spare[best] = p->spare[p->n_spare];
    p->spare_cap[best] = p->spare_cap[p->n_spare];
    return b;
}

/* Under mu: a written buffer of cap bytes back to the list, or freed. */
static void give_spare(pack_run *p, uint8_t *b, uint64_t cap)
{
    if (p->n_spare < SPARES && p->spare_bytes + cap <= SPARE_BUDGET) {
        p->spare[p->n_spare] = b;
        p->spare_cap[p->n_spare++] = cap;
        p->spare_bytes += cap;
    } else {
        free(b);
    }
}

static void *pack_worker(void *arg)
{
    pack_run *p = arg;
    scratch sb = {0};   /* this worker's source rows, kept across its jobs */
    pthread_mutex_lock(&p->mu);
    while (!p->stop && p->next < p->n_jobs) {
        pack_job *j = &p->jobs[p->next];
        if (p->in_flight && p->in_flight + j->len > PACK_BUDGET) {
            pthread_cond_wait(&p->cv, &p->mu);   /* the writer frees a buffer, then broadcasts */
            continue;
        }
        p->next++;
        p->in_flight += j->len;
        uint64_t buf_cap = j->len ? j->len : 1;
        uint8_t *buf = take_spare(p, j->len, &buf_cap);
        pthread_mutex_unlock(&p->mu);
        jlm_err err = {0};
        if (buf)
            memset(buf, 0, j->len);
        else
            buf = calloc(1, buf_cap);
        int rc = buf ? pack_tensor(p->c, j->i, j->x, buf, j->off, j->len, &sb, &err)
                     : jlm_errf(&err, JLM_ENOMEM, "%s: out of memory (%llu bytes for '%s')", p->c->src_path,
                                (unsigned long long)j->len, p->c->tensors[j->i].name.s);
        pthread_mutex_lock(&p->mu);
        if (rc) {
            free(buf);
            p->in_flight -= j->len;
            if (!p->rc) {
                p->rc = rc;
                p->err = err;
            }
            p->stop = 1;
        } else {
            j->buf = buf;
            j->cap = buf_cap;
            p->ready[p->tail++] = (uint32_t)(j - p->jobs);
        }
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    free(sb.p);
    return NULL;
}

/* The jobs of c in table order, and the bytes they write in all. */
static int plan_jobs(jlm_conv *c, pack_job **out, uint32_t *n_out, uint64_t *total, jlm_err *err)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < c->n_tensors; i++)
        n += jlm_fmt_role_is_bank(c->tensors[i].role) ? c->tensors[i].dims[2] : 1;
    pack_job *v = calloc(n ? n : 1, sizeof *v);
    if (!v || n > UINT32_MAX) {
        free(v);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory (%llu packing jobs)", c->src_path, (unsigned long long)n);
    }
    uint32_t k = 0;
    *total = 0;
    for (uint32_t i = 0; i < c->n_tensors; i++) {
        const jlm_tensor *t = &c->tensors[i];
        int bank = jlm_fmt_role_is_bank(t->role);
        int64_t nexp = bank ? (int64_t)t->dims[2] : 1;
        uint64_t off, len;
        tensor_span(c, i, &off, &len);
        for (int64_t x = 0; x < nexp; x++) {
            v[k] = (pack_job){.i = i, .x = x, .off = off + (bank ? (uint64_t)x * c->plan.hdr.exp_page_size : 0),
                              .len = len};
            *total += len;
            k++;
        }
    }
    *out = v;
    *n_out = k;
    return JLM_OK;
}

/* Writes the packed buffers as the workers finish them; stops at the first
 * error of either side. Returns the writer's error, or JLM_OK. */
static int write_ready(pack_run *p, jlm_writer *w, uint64_t total, jlm_conv_progress cb, void *cb_ctx,
                       jlm_err *err)
{
    uint64_t done = 0;
    int rc = JLM_OK;
    pthread_mutex_lock(&p->mu);
    for (uint32_t written = 0; written < p->n_jobs && !p->stop;) {
        if (p->head == p->tail) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        pack_job *j = &p->jobs[p->ready[p->head++]];
        pthread_mutex_unlock(&p->mu);
        rc = jlm_fmt_writer_pwrite(w, j->buf, j->len, j->off, err);
        done += j->len;
        written++;
        if (!rc && cb)
            cb(cb_ctx, done, total);
        pthread_mutex_lock(&p->mu);
        give_spare(p, j->buf, j->cap);
        j->buf = NULL;
        p->in_flight -= j->len;
        if (rc)
            p->stop = 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Packs every job on min(online CPUs, jobs) workers while this thread writes. */
static int pack_and_write(jlm_conv *c, jlm_writer *w, jlm_conv_progress cb, void *cb_ctx, jlm_err *err)
{
    pack_run p = {.c = c};
    uint64_t total = 0;
    int rc = plan_jobs(c, &p.jobs, &p.n_jobs, &total, err);
    if (rc)
        return rc;
    p.ready = calloc(p.n_jobs ? p.n_jobs : 1, sizeof *p.ready);
    if (!p.ready) {
        free(p.jobs);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", c->src_path);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t nw = ncpu < 1 ? 1 : ncpu > PACK_MAX_WORKERS ? PACK_MAX_WORKERS : (uint32_t)ncpu, started = 0;
    if (nw > p.n_jobs)
        nw = p.n_jobs ? p.n_jobs : 1;
    pthread_t th[PACK_MAX_WORKERS];
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    while (started < nw && pthread_create(&th[started], NULL, pack_worker, &p) == 0)
        started++;
    if (!started)
        rc = jlm_errf(err, JLM_ENOMEM, "%s: cannot start a packing thread", c->src_path);
    else
        rc = write_ready(&p, w, total, cb, cb_ctx, err);
    for (uint32_t t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    for (uint32_t q = p.head; q < p.tail; q++)   /* packed, never written (after an error) */
        free(p.jobs[p.ready[q]].buf);
    for (uint32_t q = 0; q < p.n_spare; q++)
        free(p.spare[q]);
    if (!rc && p.rc) {
        rc = p.rc;
        if (err)
            *err = p.err;
    }
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
    free(p.ready);
    free(p.jobs);
    return rc;
}

int jlm_conv_write(jlm_conv *c, const char *out_path, const jlm_io *io,
                   jlm_conv_progress cb, void *cb_ctx, jlm_err *err)
{
    jlm_writer *w;
    int rc = jlm_fmt_writer_open(out_path, &c->plan, io, &w, err);
    if (rc)
        return rc;
    rc = pack_and_write(c, w, cb, cb_ctx, err);
    if (!rc)
        rc = verify(c, jlm_fmt_writer_part_path(w), err);
    if (rc) {
        jlm_fmt_writer_abort(w);
        return rc;
    }
    return jlm_fmt_writer_commit(w, err);
}
