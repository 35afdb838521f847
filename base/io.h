/* io.h - the one I/O seam and the whole-buffer positional read/write loops.
 *
 * jlm_io is a table of the system calls the writer, the readers and the jlmfs
 * daemon make on their files; tests swap entries to inject EIO, ENOSPC and
 * short transfers. jlm_io_posix is the real thing.
 *
 * jlm_io_pread_full / jlm_io_pwrite_full transfer exactly n bytes at off:
 * they retry EINTR and continue after short transfers (pread/pwrite may return
 * fewer bytes than asked on pipes, signals, NFS, FUSE). They return 0, a
 * positive errno, or JLM_IO_EOF when a read hit end of file (or a write
 * transferred nothing) first; *done (if non-NULL) gets the bytes transferred
 * before the failure. io == NULL means jlm_io_posix. No allocation, no state:
 * thread safe as far as the entries of io are.
 */
#ifndef JLM_IO_H
#define JLM_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct jlm_io {
    int     (*open)(const char *path, int flags, int mode);
    ssize_t (*pwrite)(int fd, const void *buf, size_t n, int64_t off);
    ssize_t (*pread)(int fd, void *buf, size_t n, int64_t off);
    int     (*ftruncate)(int fd, int64_t len);   /* posix: also reserves the blocks */
    int     (*fsync)(int fd);
    int     (*close)(int fd);
    int     (*rename)(const char *from, const char *to);
    int     (*unlink)(const char *path);
} jlm_io;
extern const jlm_io jlm_io_posix;

#define JLM_IO_EOF (-1)   /* end of file before n bytes (read), nothing written (write) */

int jlm_io_pread_full(const jlm_io *io, int fd, void *buf, size_t n, uint64_t off, size_t *done);
int jlm_io_pwrite_full(const jlm_io *io, int fd, const void *buf, size_t n, uint64_t off, size_t *done);

/* "unexpected end of file" for JLM_IO_EOF, strerror(e) otherwise. */
const char *jlm_io_strerror(int e);

#endif
