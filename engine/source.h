/* source.h - page sources: where the pager's bytes come from.
 *
 * Owns: the I/O seam between the pager and the outside world. A source reads
 * one span [off, off+len) of a flat byte space (a .jlm container, or a view of
 * one) into a caller buffer, entirely or not at all. It knows nothing of pages,
 * frames, budgets or the container's layout.
 *
 * Kinds:
 *   file   pread of a plain file; O_DIRECT where the filesystem allows it
 *          (silently buffered where open(O_DIRECT) fails with EINVAL); large
 *          reads split across the source's own I/O threads; short reads and
 *          EINTR retried. This is also the source for a jlmfs view's
 *          model.jlm: open it with direct = 0 so reads go through the kernel
 *          page cache (a view-aware source that reports the serving tier can
 *          be added later as another kind; nothing else changes).
 *   mem    a buffer in memory (tests, fuzzing, an in-memory container).
 *   fault  wraps another source: counts reads and bytes, logs spans, fails
 *          the Nth read or any read covering a given byte (tests).
 *   verify wraps another source with the container's page checksums
 *          (format/sums.h): the first read touching a span checks it (a
 *          read covering a span in part checks the bytes read followed by
 *          zeros, the page's tail padding, and only when that differs reads
 *          the whole span); a mismatch fails the read with JLM_EFORMAT
 *          "NAME: checksum mismatch in block B chunk C (bytes O+L): expected
 *          X, got Y", so the bytes are never handed on.
 *
 * Invariants:
 *  (1) read() returns 0 and has written all len bytes, or returns a negative
 *      JLM_E* code with a message naming the source (file path) and the
 *      offset; buf's contents are unspecified after a failure.
 *  (2) The file source uses the O_DIRECT descriptor only for a piece whose
 *      offset, length and buffer are all 4096-aligned; everything else goes
 *      through the buffered descriptor. Callers need not align, but aligned
 *      requests (the pager's are) are the ones that bypass the page cache.
 *
 * Thread safety: read() may be called from several threads at once for the
 * file and mem sources (pread has no shared offset); a file source's large
 * reads use its private pool, one read at a time: a large read that finds
 * the pool busy (the pager's readers, several pages at once) is one pread. The fault
 * source's counters are not atomic: one reader thread.
 * Memory: a source owns its state; close() frees it (jlm_source_close accepts
 * NULL). A fault source does not own the source it wraps.
 */
#ifndef JLM_SOURCE_H
#define JLM_SOURCE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/stat.h>

#include "base/jlm_err.h"
#include "base/tier.h"

typedef struct jlm_source jlm_source;
struct jlm_source {
    /* Reads exactly [off, off+len) into buf. 0, or JLM_EIO/JLM_ERANGE/... with
     * a message naming name and off (invariant 1). */
    int  (*read)(jlm_source *s, uint64_t off, size_t len, void *buf, jlm_err *err);
    /* Frees the source. */
    void (*close)(jlm_source *s);
    const char *name;   /* path or label used in messages */
    uint64_t    size;   /* bytes in the byte space (file size at open) */
    int         tier;   /* enum jlm_tier of a typical read */
    int         direct; /* 1 when aligned reads bypass the page cache (O_DIRECT) */
};

/* ---------------------------------------------------------------- file source */
typedef ssize_t (*jlm_pread_fn)(int fd, void *buf, size_t n, off_t off);

typedef struct jlm_file_source_opts {
    int          direct;      /* 1: try O_DIRECT (default), 0: buffered only */
    int          n_threads;   /* I/O threads for large reads; 0: min(4, cores); 1: none */
    size_t       split_min;   /* reads of at least this many bytes are split; 0: 4 MiB */
    jlm_pread_fn pread;       /* syscall seam for tests; NULL: pread(2) */
    /* use_fd: read the file open on fd (a duplicate of it; the caller keeps
     * fd) instead of opening path, which then only names it in messages;
     * size: its size (0: fstat). The engine passes its container's
     * descriptor, so its pages come from the file its metadata came from:
     * a path replaced between two opens (a jlmfs view whose source
     * changed) would pair one version's metadata with another's pages,
     * and a descriptor of a replaced view may fail fstat (ESTALE) while it
     * still reads its version. The O_DIRECT descriptor is that file opened
     * again through /proc/self/fd/N (the same inode, never a walk of the
     * path; none where that fails: reads stay buffered). */
    int          use_fd;
    int          fd;
    uint64_t     size;
} jlm_file_source_opts;

/* Opens path read-only (or opts->fd's file). opts may be NULL (defaults).
 * JLM_EIO naming the path and errno on failure; *out untouched then. */
int jlm_source_open_file(const char *path, const jlm_file_source_opts *opts,
                         jlm_source **out, jlm_err *err);

/* ---------------------------------------------------------------- mem source */
/* A source over data[0, size) (borrowed: must outlive the source). name is
 * copied. JLM_ENOMEM on failure; *out untouched then. */
int jlm_source_open_mem(const void *data, uint64_t size, const char *name,
                        jlm_source **out, jlm_err *err);

/* ---------------------------------------------------------------- fault source */
typedef struct jlm_fault_span { uint64_t off; size_t len; } jlm_fault_span;

typedef struct jlm_fault_source {
    jlm_source  base;         /* first member: a jlm_fault_source is a jlm_source */
    jlm_source *inner;        /* borrowed */
    /* configuration (tests write these directly) */
    uint64_t    fail_nth;     /* fail the read with this 1-based number; 0: never */
    int         fail_every_after; /* 1: also fail every read after fail_nth */
    uint64_t    fail_byte;    /* fail any read covering this byte ... */
    int         fail_byte_on; /* ... when 1 */
    /* counters */
    uint64_t    n_reads;      /* reads attempted, failed ones included */
    uint64_t    n_failed;
    uint64_t    bytes_read;   /* bytes of successful reads */
    jlm_fault_span log[256];  /* the first 256 spans requested */
    uint64_t    n_log;
} jlm_fault_source;

/* Wraps inner. JLM_ENOMEM; *out untouched on error. */
int jlm_source_open_fault(jlm_source *inner, jlm_fault_source **out, jlm_err *err);

/* ---------------------------------------------------------------- verify source */
struct jlm_sums;
/* Wraps inner with sums; the result owns both (closing it closes inner and
 * frees sums, also on failure). JLM_ENOMEM; *out untouched on error. */
int jlm_source_open_verify(jlm_source *inner, struct jlm_sums *sums, jlm_source **out, jlm_err *err);

/* ---------------------------------------------------------------- any source */
/* s->close(s); accepts NULL. */
void jlm_source_close(jlm_source *s);

#endif
