/* source.c - page sources: plain file (pread, O_DIRECT, split reads), memory,
 * and a fault-injecting wrapper for tests (see source.h). */
#include "engine/source.h"
#include "engine/pool.h"
#include "format/sums.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SRC_ALIGN        4096u
#define SRC_SPLIT_MIN    ((size_t)4 << 20)  /* reads this large are split */
#define SRC_PIECE_MIN    ((size_t)1 << 20)  /* no piece smaller than this */
#define SRC_MAX_PIECES   16

void jlm_source_close(jlm_source *s)
{
    if (s)
        s->close(s);
}

/* ---------------------------------------------------------------- file source */
typedef struct file_source {
    jlm_source   base;
    char        *path;
    int          fd;          /* buffered descriptor */
    int          dfd;         /* O_DIRECT descriptor, -1 if unavailable */
    size_t       split_min;
    jlm_pread_fn pread;
    jlm_pool    *pool;        /* I/O threads for split reads; NULL: none */
    int          splitting;   /* a read holds the pool: another one reads unsplit */
} file_source;

static int aligned(uint64_t x) { return (x & (SRC_ALIGN - 1)) == 0; }

/* Reads [off, off+len) with retries on short reads and EINTR. A piece goes to
 * the O_DIRECT descriptor only while offset, length left and buffer are all
 * aligned (invariant 2); after a short read that breaks alignment the rest is
 * read buffered. EOF before len bytes is JLM_EIO naming the offset reached. */
static int file_read_span(file_source *f, uint64_t off, size_t len, uint8_t *buf, jlm_err *err)
{
    size_t done = 0;
    int eintr = 0;
    while (done < len) {
        uint64_t pos = off + done;
        size_t left = len - done;
        int use_direct = f->dfd >= 0 && aligned(pos) && aligned(left) && aligned((uintptr_t)(buf + done));
        ssize_t r = f->pread(use_direct ? f->dfd : f->fd, buf + done, left, (off_t)pos);
        /* a filesystem may accept O_DIRECT at open and still refuse an
         * alignment it dislikes (a larger logical block): read this piece
         * buffered instead */
        if (r < 0 && errno == EINVAL && use_direct)
            r = f->pread(f->fd, buf + done, left, (off_t)pos);
        if (r < 0) {
            if (errno == EINTR && ++eintr < 1000)
                continue;
            return jlm_errf(err, JLM_EIO, "%s: read of %zu bytes at offset %llu failed: %s",
                            f->path, left, (unsigned long long)pos, strerror(errno));
        }
        if (r == 0)
            return jlm_errf(err, JLM_EIO,
                            "%s: unexpected end of file at offset %llu (wanted [%llu, %llu), file is %llu bytes)",
                            f->path, (unsigned long long)pos, (unsigned long long)off,
                            (unsigned long long)(off + len), (unsigned long long)f->base.size);
        done += (size_t)r;
    }
    return 0;
}

typedef struct split_job {
    file_source *f;
    uint64_t     off;
    size_t       len, piece;   /* piece: bytes per piece (aligned) */
    uint8_t     *buf;
    int          rc[SRC_MAX_PIECES];
    jlm_err      err[SRC_MAX_PIECES];
} split_job;

static void split_piece(void *ctx, size_t b, size_t e, int t)
{
    split_job *j = ctx;
    for (size_t i = b; i < e; i++) {
        size_t o = i * j->piece;
        size_t n = j->len - o < j->piece ? j->len - o : j->piece;
        j->rc[i] = file_read_span(j->f, j->off + o, n, j->buf + o, &j->err[i]);
    }
}

static int split_read(file_source *f, uint64_t off, size_t len, void *buf, int nt, jlm_err *err);

static int file_read(jlm_source *s, uint64_t off, size_t len, void *buf, jlm_err *err)
{
    file_source *f = (file_source *)s;
    if (off > s->size || len > s->size - off)
        return jlm_errf(err, JLM_EIO, "%s: read of [%llu, %llu) past the end of the file (%llu bytes)",
                        f->path, (unsigned long long)off, (unsigned long long)(off + len),
                        (unsigned long long)s->size);
    int nt = jlm_pool_n_threads(f->pool);
    if (!f->pool || len < f->split_min || nt < 2 || __atomic_exchange_n(&f->splitting, 1, __ATOMIC_ACQUIRE))
        return file_read_span(f, off, len, buf, err);   /* (the pool serves one read at a time) */
    int rc = split_read(f, off, len, buf, nt, err);
    __atomic_store_n(&f->splitting, 0, __ATOMIC_RELEASE);
    return rc;
}

static int split_read(file_source *f, uint64_t off, size_t len, void *buf, int nt, jlm_err *err)
{
    size_t n_pieces = (size_t)nt;
    if (n_pieces > SRC_MAX_PIECES)
        n_pieces = SRC_MAX_PIECES;
    if (len / n_pieces < SRC_PIECE_MIN)
        n_pieces = len / SRC_PIECE_MIN ? len / SRC_PIECE_MIN : 1;
    /* pieces are 4096-aligned so each stays eligible for O_DIRECT */
    size_t piece = ((len / n_pieces) + SRC_ALIGN - 1) & ~(size_t)(SRC_ALIGN - 1);
    n_pieces = (len + piece - 1) / piece;
    split_job *j = malloc(sizeof *j);
    if (!j)
        return file_read_span(f, off, len, buf, err);
    j->f = f;
    j->off = off;
    j->len = len;
    j->piece = piece;
    j->buf = buf;
    jlm_pool_for(f->pool, n_pieces, 1, split_piece, j);
    int rc = 0;
    for (size_t i = 0; i < n_pieces && !rc; i++)
        if (j->rc[i]) {
            rc = j->rc[i];
            if (err)
                *err = j->err[i];
        }
    free(j);
    return rc;
}

static void file_close(jlm_source *s)
{
    file_source *f = (file_source *)s;
    jlm_pool_destroy(f->pool);
    if (f->dfd >= 0)
        close(f->dfd);
    if (f->fd >= 0)
        close(f->fd);
    free(f->path);
    free(f);
}

static ssize_t plain_pread(int fd, void *buf, size_t n, off_t off)
{
    return pread(fd, buf, n, off);
}

/* The O_DIRECT descriptor, or -1 where the filesystem refuses it (tmpfs:
 * EINVAL) or the caller asked for buffered reads. fd >= 0: the file open on
 * fd, opened again through /proc/self/fd (the same inode, whatever path
 * names now), and only if it is that file (device and inode). */
static int open_direct(const char *path, int fd, int want)
{
#ifdef O_DIRECT
    if (!want || fd < 0)
        return want ? open(path, O_RDONLY | O_DIRECT | O_CLOEXEC) : -1;
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    int d = open(self, O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct stat a, b;
    if (d >= 0 && (fstat(fd, &a) || fstat(d, &b) || a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
        close(d);
        d = -1;
    }
    return d;
#else
    (void)path;
    (void)fd;
    (void)want;
    return -1;
#endif
}

int jlm_source_open_file(const char *path, const jlm_file_source_opts *opts,
                         jlm_source **out, jlm_err *err)
{
    jlm_file_source_opts o = { .direct = 1 };
    if (opts)
        o = *opts;
    file_source *f = calloc(1, sizeof *f);
    char *p = strdup(path);
    if (!f || !p) {
        free(f);
        free(p);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory opening the page source", path);
    }
    f->path = p;
    f->dfd = -1;
    f->fd = o.use_fd ? fcntl(o.fd, F_DUPFD_CLOEXEC, 3) : open(path, O_RDONLY | O_CLOEXEC);
    struct stat st = {0};
    if (f->fd < 0 || ((!o.use_fd || !o.size) && fstat(f->fd, &st) != 0)) {
        int e = errno;
        file_close(&f->base);
        return jlm_errf(err, JLM_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    uint64_t size = o.use_fd && o.size ? o.size : (uint64_t)st.st_size;
    f->dfd = open_direct(path, o.use_fd ? f->fd : -1, o.direct);
    f->pread = o.pread ? o.pread : plain_pread;
    f->split_min = o.split_min ? o.split_min : SRC_SPLIT_MIN;
    int nt = o.n_threads;
    if (nt <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nt = c > 4 ? 4 : (c > 0 ? (int)c : 1);
    }
    int prc;
    if (nt > 1 && (prc = jlm_pool_create(nt, 2000, &f->pool, err)) != 0) {
        file_close(&f->base);
        return jlm_err_prefix(err, prc, "%s", path);
    }
    f->base.read = file_read;
    f->base.close = file_close;
    f->base.name = f->path;
    f->base.size = size;
    f->base.direct = f->dfd >= 0;
    f->base.tier = f->dfd >= 0 ? JLM_TIER_DISK : JLM_TIER_UNKNOWN;
    *out = &f->base;
    return 0;
}

/* ---------------------------------------------------------------- mem source */
typedef struct mem_source {
    jlm_source     base;
    const uint8_t *data;
    char          *label;
} mem_source;

static int mem_read(jlm_source *s, uint64_t off, size_t len, void *buf, jlm_err *err)
{
    mem_source *m = (mem_source *)s;
    if (off > s->size || len > s->size - off)
        return jlm_errf(err, JLM_EIO, "%s: read of [%llu, %llu) past the end (%llu bytes)",
                        m->label, (unsigned long long)off, (unsigned long long)(off + len),
                        (unsigned long long)s->size);
    memcpy(buf, m->data + off, len);
    return 0;
}

static void mem_close(jlm_source *s)
{
    mem_source *m = (mem_source *)s;
    free(m->label);
    free(m);
}

int jlm_source_open_mem(const void *data, uint64_t size, const char *name,
                        jlm_source **out, jlm_err *err)
{
    mem_source *m = calloc(1, sizeof *m);
    char *l = strdup(name ? name : "(memory)");
    if (!m || !l) {
        free(m);
        free(l);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", name ? name : "(memory)");
    }
    m->data = data;
    m->label = l;
    m->base = (jlm_source){ .read = mem_read, .close = mem_close, .name = l, .size = size,
                            .tier = JLM_TIER_MEMORY, .direct = 0 };
    *out = &m->base;
    return 0;
}

/* ---------------------------------------------------------------- fault source */
static int fault_read(jlm_source *s, uint64_t off, size_t len, void *buf, jlm_err *err)
{
    jlm_fault_source *f = (jlm_fault_source *)s;
    uint64_t nth = ++f->n_reads;
    if (f->n_log < sizeof f->log / sizeof f->log[0])
        f->log[f->n_log] = (jlm_fault_span){ off, len };
    f->n_log++;
    int fail = (f->fail_nth && (nth == f->fail_nth || (f->fail_every_after && nth > f->fail_nth))) ||
               (f->fail_byte_on && f->fail_byte >= off && f->fail_byte - off < len);
    if (fail) {
        f->n_failed++;
        return jlm_errf(err, JLM_EIO, "%s: read of %zu bytes at offset %llu failed: %s (injected)",
                        f->inner->name, len, (unsigned long long)off, strerror(EIO));
    }
    int rc = f->inner->read(f->inner, off, len, buf, err);
    if (rc == 0)
        f->bytes_read += len;
    return rc;
}

static void fault_close(jlm_source *s)
{
    free(s);
}

int jlm_source_open_fault(jlm_source *inner, jlm_fault_source **out, jlm_err *err)
{
    jlm_fault_source *f = calloc(1, sizeof *f);
    if (!f)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", inner->name);
    f->inner = inner;
    f->base = (jlm_source){ .read = fault_read, .close = fault_close, .name = inner->name,
                            .size = inner->size, .tier = inner->tier, .direct = inner->direct };
    *out = f;
    return 0;
}

/* ---------------------------------------------------------------- verify source */
typedef struct verify_source {
    jlm_source  base;
    jlm_source *inner;   /* owned */
    jlm_sums   *sums;    /* owned */
} verify_source;

/* Span i, which [off, off+len) (bytes in buf) covers only in part: the bytes
 * read plus zeros first (a page's tail), else the whole span read again. */
static int verify_partial(verify_source *v, uint32_t i, uint64_t off, size_t len, const uint8_t *buf, jlm_err *err)
{
    const jlm_span *sp = &v->sums->spans[i];
    if (off <= sp->off && !jlm_sums_check(v->sums, i, buf + (sp->off - off), off + len - sp->off, v->base.name, NULL, NULL))
        return JLM_OK;
    uint8_t *whole = malloc(sp->len ? sp->len : 1);
    if (!whole)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", v->base.name);
    int rc = v->inner->read(v->inner, sp->off, sp->len, whole, err);
    if (!rc)
        rc = jlm_sums_check(v->sums, i, whole, sp->len, v->base.name, NULL, err);
    uint64_t lo = off > sp->off ? off : sp->off, hi = off + len < sp->off + sp->len ? off + len : sp->off + sp->len;
    if (!rc && memcmp(buf + (lo - off), whole + (lo - sp->off), hi - lo) != 0)
        rc = jlm_errf(err, JLM_EIO, "%s: bytes %llu+%llu changed between two reads", v->base.name,
                      (unsigned long long)lo, (unsigned long long)(hi - lo));
    free(whole);
    return rc;
}

static int verify_read(jlm_source *s, uint64_t off, size_t len, void *buf, jlm_err *err)
{
    verify_source *v = (verify_source *)s;
    int rc = v->inner->read(v->inner, off, len, buf, err);
    if (rc || !len)
        return rc;
    int64_t i = jlm_sums_find(v->sums, off);
    if (i < 0)   /* in padding: the next span at or after off */
        for (i = 0; (uint32_t)i < v->sums->n && v->sums->spans[i].off < off; i++)
            ;
    for (; (uint32_t)i < v->sums->n && v->sums->spans[i].off < off + len; i++) {
        const jlm_span *sp = &v->sums->spans[i];
        if (jlm_sums_done(v->sums, (uint32_t)i))
            continue;
        rc = sp->off >= off && sp->off + sp->len <= off + len
                 ? jlm_sums_check(v->sums, (uint32_t)i, (const uint8_t *)buf + (sp->off - off), sp->len, s->name, NULL, err)
                 : verify_partial(v, (uint32_t)i, off, len, buf, err);
        if (rc)
            return rc;
    }
    return JLM_OK;
}

static void verify_close(jlm_source *s)
{
    verify_source *v = (verify_source *)s;
    jlm_source_close(v->inner);
    jlm_sums_free(v->sums);
    free(v);
}

int jlm_source_open_verify(jlm_source *inner, jlm_sums *sums, jlm_source **out, jlm_err *err)
{
    verify_source *v = calloc(1, sizeof *v);
    if (!v) {
        int rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory", inner->name);
        jlm_source_close(inner);
        jlm_sums_free(sums);
        return rc;
    }
    v->inner = inner;
    v->sums = sums;
    v->base = (jlm_source){ .read = verify_read, .close = verify_close, .name = inner->name,
                            .size = inner->size, .tier = inner->tier, .direct = inner->direct };
    *out = &v->base;
    return 0;
}
