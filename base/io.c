/* io.c - the POSIX seam and the EINTR / short-transfer loops (see io.h). */
#include "base/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- posix seam */
static int     px_open(const char *p, int f, int m)                 { return open(p, f, m); }
static ssize_t px_pwrite(int fd, const void *b, size_t n, int64_t o) { return pwrite(fd, b, n, (off_t)o); }
static ssize_t px_pread(int fd, void *b, size_t n, int64_t o)        { return pread(fd, b, n, (off_t)o); }
static int     px_fsync(int fd)                                     { return fsync(fd); }
static int     px_close(int fd)                                     { return close(fd); }
static int     px_rename(const char *a, const char *b)              { return rename(a, b); }
static int     px_unlink(const char *p)                             { return unlink(p); }
/* Sizes the file and reserves its blocks where the filesystem can, so a full
 * disk is reported before any packing work. */
static int px_ftruncate(int fd, int64_t len)
{
    if (ftruncate(fd, (off_t)len) != 0)
        return -1;
    int rc = posix_fallocate(fd, 0, (off_t)len);
    if (rc == 0 || rc == EINVAL || rc == EOPNOTSUPP)
        return 0;
    errno = rc;
    return -1;
}

const jlm_io jlm_io_posix = {
    .open = px_open, .pwrite = px_pwrite, .pread = px_pread, .ftruncate = px_ftruncate,
    .fsync = px_fsync, .close = px_close, .rename = px_rename, .unlink = px_unlink,
};

/* ---------------------------------------------------------------- whole-buffer loops */
int jlm_io_pread_full(const jlm_io *io, int fd, void *buf, size_t n, uint64_t off, size_t *done)
{
    if (!io)
        io = &jlm_io_posix;
    size_t got = 0;
    int rc = 0;
    while (got < n) {
        ssize_t r = io->pread(fd, (char *)buf + got, n - got, (int64_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? errno : JLM_IO_EOF;
            break;
        }
        got += (size_t)r;
    }
    if (done)
        *done = got;
    return rc;
}

int jlm_io_pwrite_full(const jlm_io *io, int fd, const void *buf, size_t n, uint64_t off, size_t *done)
{
    if (!io)
        io = &jlm_io_posix;
    size_t put = 0;
    int rc = 0;
    while (put < n) {
        ssize_t r = io->pwrite(fd, (const char *)buf + put, n - put, (int64_t)(off + put));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? errno : JLM_IO_EOF;
            break;
        }
        put += (size_t)r;
    }
    if (done)
        *done = put;
    return rc;
}

const char *jlm_io_strerror(int e)
{
    return e == JLM_IO_EOF ? "unexpected end of file" : strerror(e);
}
