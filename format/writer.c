/* writer.c - the atomic container writer (jlm-format.md 6): OUT.part is
 * created pre-sized to the planned length (so ENOSPC shows up front), filled
 * at planned offsets, fsynced and renamed to OUT. Any failure removes the
 * .part (invariant 4). All I/O goes through a jlm_io seam for fault tests. */
#include "format/jlm_format.h"
#include "format/sums.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- writer */
struct jlm_writer {
    const jlm_io *io;
    int       fd;
    uint64_t  size;
    char     *out, *part;
};

static int io_code(int e) { return e == ENOSPC || e == EDQUOT ? JLM_ENOSPC : JLM_EIO; }

const char *jlm_fmt_writer_part_path(const jlm_writer *w) { return w ? w->part : NULL; }

void jlm_fmt_writer_abort(jlm_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        w->io->close(w->fd);
    if (w->part)
        w->io->unlink(w->part);
    free(w->out);
    free(w->part);
    free(w);
}

int jlm_fmt_writer_pwrite(jlm_writer *w, const void *buf, size_t n, uint64_t off, jlm_err *err)
{
    if (off > w->size || n > w->size - off)
        return jlm_errf(err, JLM_EINVAL, "%s: write [%llu, +%zu) outside the planned %llu bytes", w->out,
                        (unsigned long long)off, n, (unsigned long long)w->size);
    size_t done;
    int e = jlm_io_pwrite_full(w->io, w->fd, buf, n, off, &done);
    if (e) {
        e = e == JLM_IO_EOF ? EIO : e;
        return jlm_errf(err, io_code(e), "%s: writing %zu bytes at %llu: %s", w->part, n - done,
                        (unsigned long long)(off + done), strerror(e));
    }
    /* Start the writeback of what was just written (asynchronous; a hint
     * whose failure fsync reports anyway), so the disk works while the next
     * tensors pack and commit's fsync finds little left to write. */
    if (w->io == &jlm_io_posix)
        (void)sync_file_range(w->fd, (off_t)off, (off_t)n, SYNC_FILE_RANGE_WRITE);
    return JLM_OK;
}

int jlm_fmt_writer_open(const char *out_path, const jlm_plan *plan, const jlm_io *io,
                        jlm_writer **wout, jlm_err *err)
{
    if (!io)
        io = &jlm_io_posix;
    jlm_writer *w = calloc(1, sizeof *w);
    if (!w)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", out_path);
    w->io = io;
    w->fd = -1;
    w->size = plan->file_size;
    w->out = strdup(out_path);
    if (w->out && asprintf(&w->part, "%s.part", out_path) < 0)
        w->part = NULL;
    if (!w->out || !w->part) {
        free(w->out);
        free(w);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", out_path);
    }
    w->fd = io->open(w->part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int rc = jlm_errf(err, io_code(errno), "%s: %s", w->part, strerror(errno));
        free(w->part);
        w->part = NULL;   /* not ours to unlink */
        jlm_fmt_writer_abort(w);
        return rc;
    }
    if (io->ftruncate(w->fd, (int64_t)w->size) != 0) {
        int rc = jlm_errf(err, io_code(errno), "%s: sizing to %llu bytes: %s", w->part,
                          (unsigned long long)w->size, strerror(errno));
        jlm_fmt_writer_abort(w);
        return rc;
    }
    uint8_t hdr[JLM_HEADER_LEN];
    jlm_fmt_header_encode(&plan->hdr, hdr);
    const jlm_header *h = &plan->hdr;
    int rc;
    if ((rc = jlm_fmt_writer_pwrite(w, hdr, sizeof hdr, 0, err)) ||
        (rc = jlm_fmt_writer_pwrite(w, plan->cfg.p, plan->cfg.len, h->cfg_off, err)) ||
        (rc = jlm_fmt_writer_pwrite(w, plan->vis.p, plan->vis.len, h->vis_off, err)) ||
        (rc = jlm_fmt_writer_pwrite(w, plan->voc.p, plan->voc.len, h->voc_off, err)) ||
        (rc = jlm_fmt_writer_pwrite(w, plan->tab.p, plan->tab.len, h->tab_off, err)) ||
        (rc = jlm_fmt_writer_pwrite(w, plan->fp.p, plan->fp.len, h->fp_off, err))) {
        jlm_fmt_writer_abort(w);
        return rc;
    }
    *wout = w;
    return JLM_OK;
}

/* OUT.sums (format/sums.h) from the finished .part, renamed into place before
 * the container so a container never appears without its sidecar. Only
 * through the real I/O (the fault seams of the tests write no real file). */
static int write_sums(jlm_writer *w, jlm_err *err)
{
    char *sums = jlm_sums_path(w->out);
    if (!sums)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", w->out);
    int fd = open(w->part, O_RDONLY | O_CLOEXEC);
    int rc = fd < 0 ? jlm_errf(err, JLM_EIO, "%s: %s", w->part, strerror(errno))
                    : jlm_sums_write_fd(fd, w->size, AT_FDCWD, sums, 0644, err);
    if (fd >= 0)
        close(fd);
    free(sums);
    return rc;
}

int jlm_fmt_writer_commit(jlm_writer *w, jlm_err *err)
{
    int rc = JLM_OK;
    if (w->io->fsync(w->fd) != 0)
        rc = jlm_errf(err, io_code(errno), "%s: fsync: %s", w->part, strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (w->io->close(fd) != 0 && !rc)
        rc = jlm_errf(err, io_code(errno), "%s: close: %s", w->part, strerror(errno));
    if (!rc && w->io == &jlm_io_posix)
        rc = write_sums(w, err);
    if (!rc && w->io->rename(w->part, w->out) != 0)
        rc = jlm_errf(err, JLM_EIO, "%s: rename to %s: %s", w->part, w->out, strerror(errno));
    if (!rc) {
        free(w->part);
        w->part = NULL;   /* renamed: nothing to remove */
    }
    jlm_fmt_writer_abort(w);
    return rc;
}
