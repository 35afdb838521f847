/* reader.c - opening a container: one read of [0, DenseOff), every check of
 * jlm-format.md 3 and 4, then per-tensor placement checks (invariant 1 of
 * jlm_format.h). Refuses, never repairs. */
#include "format/jlm_format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Largest metadata (bytes before the dense region) we accept: 1 GiB. */
#define MAX_META (1ull << 30)

static int span_in(uint64_t off, uint64_t len, uint64_t lo, uint64_t hi)
{
    return off >= lo && off <= hi && len <= hi - off;
}

/* Region of a tensor per the placement rules of plan.c. */
static int region_of(const jlm_tensor *t)
{
    if (t->block < 0 || jlm_fmt_role_is_dense(t->role)) return JLM_REG_DENSE;
    if (jlm_fmt_role_is_bank(t->role)) return JLM_REG_EXPERT;
    if (t->role >= 64 && t->role <= 93) return JLM_REG_VISION;
    return JLM_REG_TEXT;
}

void jlm_fmt_tensor_loc(const jlm_model *m, const jlm_tensor *t, jlm_tensor_loc *out)
{
    const jlm_header *h = &m->hdr;
    jlm_tensor_loc l = {region_of(t), -1, h->dense_off};
    switch (l.region) {
    case JLM_REG_TEXT:   l.page = t->block; l.page_off = h->data_off + (uint64_t)t->block * h->page_size; break;
    case JLM_REG_VISION: l.page = t->block; l.page_off = h->vis_data_off + (uint64_t)t->block * h->vis_page_size; break;
    case JLM_REG_EXPERT:
        l.page = (int64_t)((t->qs_off - h->exp_data_off) / h->exp_page_size);
        l.page_off = h->exp_data_off + (uint64_t)l.page * h->exp_page_size;
        break;
    }
    *out = l;
}

/* Every plane of t inside [lo, hi); for a bank, [lo,hi) is expert 0's page and
 * the check is repeated for the last expert. */
static int check_tensor(const jlm_model *m, const jlm_tensor *t, uint32_t i, jlm_err *err)
{
    const jlm_header *h = &m->hdr;
    const char *nm = t->name.s;
    jlm_tensor_planes pl;
    int rc = jlm_fmt_tensor_planes(t, &pl, err);
    if (rc)
        return jlm_err_prefix(err, rc, "%s", m->path);
    if (t->role == 0)
        return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': role 0", m->path, nm);
    int reg = region_of(t);
    if (reg == JLM_REG_TEXT && (uint32_t)t->block >= h->n_blocks)
        return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': block %d, container has %u", m->path, nm, t->block, h->n_blocks);
    if (reg == JLM_REG_VISION && (uint32_t)t->block >= h->n_vis_blocks)
        return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': vision block %d, container has %u", m->path, nm, t->block, h->n_vis_blocks);
    uint64_t lo, hi;
    switch (reg) {
    case JLM_REG_DENSE: lo = h->dense_off; hi = h->dense_off + h->dense_len; break;
    case JLM_REG_TEXT:  lo = h->data_off + (uint64_t)t->block * h->page_size; hi = lo + h->page_size; break;
    case JLM_REG_VISION: lo = h->vis_data_off + (uint64_t)t->block * h->vis_page_size; hi = lo + h->vis_page_size; break;
    default: {
        if (h->n_exp_pages == 0 || t->qs_off < h->exp_data_off)
            return jlm_errf(err, JLM_EFORMAT, "%s: expert bank '%s' outside the expert page array", m->path, nm);
        uint64_t pg = (t->qs_off - h->exp_data_off) / h->exp_page_size;
        if (m->config.n_expert == 0 || t->dims[2] != m->config.n_expert || pg % m->config.n_expert ||
            pg + m->config.n_expert > h->n_exp_pages)
            return jlm_errf(err, JLM_EFORMAT, "%s: expert bank '%s' does not start at a block's first expert page", m->path, nm);
        lo = h->exp_data_off + pg * h->exp_page_size;
        hi = lo + h->exp_page_size;
    }
    }
    uint64_t off[3] = {t->qs_off, t->d_off, t->sc_off}, len[3] = {pl.qs_len, pl.d_len, pl.sc_len};
    static const char *pn[3] = {"qs", "d", "sc"};
    for (int k = 0; k < 3; k++) {
        if (len[k] == 0 && off[k] != t->qs_off)
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': empty %s plane at %llu, expected qsOff %llu",
                            m->path, nm, pn[k], (unsigned long long)off[k], (unsigned long long)t->qs_off);
        if (!span_in(off[k], len[k], lo, hi))
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor %u '%s': %s plane [%llu, +%llu) outside its region [%llu, %llu)",
                            m->path, i, nm, pn[k], (unsigned long long)off[k], (unsigned long long)len[k],
                            (unsigned long long)lo, (unsigned long long)hi);
        if (len[k] && off[k] % JLM_ALIGN)
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': %s plane at %llu is not 4096-aligned", m->path, nm,
                            pn[k], (unsigned long long)off[k]);
    }
    return JLM_OK;
}

static int cmp_ident(const void *a, const void *b)
{
    const jlm_tensor *x = a, *y = b;
    if (x->role != y->role) return x->role < y->role ? -1 : 1;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    if (x->index != y->index) return x->index < y->index ? -1 : 1;
    return 0;
}

static int parse(jlm_model *m, const uint8_t *buf, size_t len, jlm_err *err)
{
    const char *w = m->path;
    jlm_header *h = &m->hdr;
    int rc = jlm_fmt_header_decode(buf, len, h, err);
    if (rc)
        return jlm_err_prefix(err, rc, "%s", w);
    if ((rc = jlm_fmt_header_validate(h, m->file_size, err)))
        return jlm_err_prefix(err, rc, "%s", w);
    if (h->dense_off > len)
        return jlm_errf(err, JLM_EFORMAT, "%s: only %zu bytes of metadata, header says %llu", w, len,
                        (unsigned long long)h->dense_off);
    if ((rc = jlm_fmt_config_decode(buf + h->cfg_off, h->cfg_len, m->arena, &m->config, w, err)))
        return rc;
    if (h->vis_len) {
        if ((rc = jlm_fmt_vision_decode(buf + h->vis_off, h->vis_len, &m->vision, w, err)))
            return rc;
        m->has_vision = 1;
    }
    if ((rc = jlm_fmt_vocab_decode(buf + h->voc_off, h->voc_len, m->arena, &m->vocab, w, err)))
        return rc;
    if ((rc = jlm_fmt_table_decode(buf + h->tab_off, h->tab_len, h->n_tensors, m->arena, &m->tensors, w, err)))
        return rc;
    if ((rc = jlm_fmt_fingerprint_decode(buf + h->fp_off, h->fp_len, m->arena, &m->fp, w, err)))
        return rc;
    if (m->config.arch != JLM_ARCH_CLIP && h->n_blocks != m->config.n_layer)
        return jlm_errf(err, JLM_EFORMAT, "%s: %u text pages for %u layers", w, h->n_blocks, m->config.n_layer);
    if (m->config.arch == JLM_ARCH_NONE && (h->n_tensors || h->n_blocks))
        return jlm_errf(err, JLM_EFORMAT, "%s: architecture 'none' with tensors", w);
    for (uint32_t i = 0; i < h->n_tensors; i++)
        if ((rc = check_tensor(m, &m->tensors[i], i, err)))
            return rc;
    if (h->n_tensors > 1) {
        jlm_tensor *s = malloc(h->n_tensors * sizeof *s);
        if (!s)
            return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", w);
        memcpy(s, m->tensors, h->n_tensors * sizeof *s);
        qsort(s, h->n_tensors, sizeof *s, cmp_ident);
        for (uint32_t i = 1; i < h->n_tensors; i++)
            if (!cmp_ident(&s[i - 1], &s[i])) {
                rc = jlm_errf(err, JLM_EFORMAT, "%s: tensors '%s' and '%s' have the same identity", w,
                              s[i - 1].name.s, s[i].name.s);
                break;
            }
        free(s);
    }
    return rc;
}

static jlm_model *model_new(const char *what)
{
    jlm_model *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->fd = -1;
    m->path = strdup(what ? what : "(memory)");
    m->arena = jlm_arena_new();
    if (!m->path || !m->arena) {
        jlm_fmt_close(m);
        return NULL;
    }
    return m;
}

int jlm_fmt_parse(const uint8_t *buf, size_t len, uint64_t file_size, const char *what,
                  jlm_model **out, jlm_err *err)
{
    jlm_model *m = model_new(what);
    if (!m)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", what);
    m->file_size = file_size;
    int rc = parse(m, buf, len, err);
    if (rc) {
        jlm_fmt_close(m);
        return rc;
    }
    *out = m;
    return JLM_OK;
}

int jlm_fmt_io_error(const char *path, const char *what, jlm_err *err)
{
    int e = errno;
    return jlm_errf(err, JLM_EIO, "%s: %s%s%s%s", path, what ? what : "", what ? ": " : "", strerror(e),
                    e == ESTALE ? " (the file was replaced while it was opened; open it again)" : "");
}

int jlm_fmt_open_file(const char *path, int *fd, jlm_err *err)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   /* a FIFO is refused by the open, never waited on */
    return *fd < 0 ? jlm_fmt_io_error(path, NULL, err) : JLM_OK;
}

int jlm_fmt_open(const char *path, jlm_model **out, jlm_err *err)
{
    int fd, rc = jlm_fmt_open_file(path, &fd, err);
    return rc ? rc : jlm_fmt_open_fd(fd, path, out, err);
}

int jlm_fmt_open_fd(int fd, const char *path, jlm_model **out, jlm_err *err)
{
    jlm_model *m = model_new(path);
    if (!m) {
        close(fd);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", path);
    }
    int rc;
    struct stat st;
    uint8_t hb[JLM_HEADER_LEN];
    m->fd = fd;
    if (fstat(m->fd, &st) != 0) {
        rc = jlm_fmt_io_error(path, NULL, err);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = jlm_errf(err, JLM_EFORMAT, "%s: not a regular file%s", path,
                      S_ISDIR(st.st_mode) ? " (a jlmfs model view? pass VIEW/model.jlm)" : "");
        goto fail;
    }
    m->file_size = (uint64_t)st.st_size;
    ssize_t got = pread(m->fd, hb, sizeof hb, 0);
    if (got < 0) {
        rc = jlm_fmt_io_error(path, NULL, err);
        goto fail;
    }
    jlm_header h;
    if ((rc = jlm_fmt_header_decode(hb, (size_t)got, &h, err)) ||
        (rc = jlm_fmt_header_validate(&h, m->file_size, err))) {
        jlm_err_prefix(err, rc, "%s", path);
        goto fail;
    }
    if (h.dense_off > MAX_META) {
        rc = jlm_errf(err, JLM_EFORMAT, "%s: %llu bytes of metadata exceed the 1 GiB limit", path,
                      (unsigned long long)h.dense_off);
        goto fail;
    }
    m->meta = malloc(h.dense_off);
    if (!m->meta) {
        rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory for %llu bytes of metadata", path, (unsigned long long)h.dense_off);
        goto fail;
    }
    size_t done;
    int e = jlm_io_pread_full(NULL, m->fd, m->meta, h.dense_off, 0, &done);
    if (e) {
        rc = jlm_errf(err, JLM_EIO, "%s: reading metadata at %zu: %s", path, done, jlm_io_strerror(e));
        goto fail;
    }
    if ((rc = parse(m, m->meta, h.dense_off, err)))
        goto fail;
    *out = m;
    return JLM_OK;
fail:
    jlm_fmt_close(m);
    return rc;
}

void jlm_fmt_close(jlm_model *m)
{
    if (!m)
        return;
    if (m->fd >= 0)
        close(m->fd);
    free(m->meta);
    free(m->path);
    jlm_arena_free(m->arena);
    free(m);
}

const jlm_tensor *jlm_fmt_find(const jlm_model *m, uint16_t role, int32_t block, int32_t index)
{
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        if (t->role == role && t->block == block && t->index == index)
            return t;
    }
    return NULL;
}

uint64_t jlm_fmt_page_extent(const jlm_model *m, int region, uint32_t page)
{
    uint64_t ext = 0;
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        jlm_tensor_loc l;
        jlm_fmt_tensor_loc(m, t, &l);
        if (l.region != region)
            continue;
        uint64_t base = l.page_off;
        if (region == JLM_REG_EXPERT) {
            /* a bank's layout repeats in each of its block's expert pages */
            uint64_t first = (uint64_t)l.page, ne = m->config.n_expert;
            if (page < first || page >= first + ne)
                continue;
        } else if (l.page != (int64_t)page) {
            continue;
        }
        jlm_tensor_planes pl;
        if (jlm_fmt_tensor_planes(t, &pl, NULL))
            continue;
        uint64_t ends[3] = {t->qs_off + pl.qs_len, t->d_off + pl.d_len, t->sc_off + pl.sc_len};
        for (int k = 0; k < 3; k++)
            if (ends[k] - base > ext)
                ext = ends[k] - base;
    }
    return jlm_align_up(ext);
}
