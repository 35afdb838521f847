/* sums.c - the page-checksum sidecar (format/sums.h, docs/checksums.md). */
#include "format/sums.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/io.h"

#define SUMS_ALGO_XXH3_64 1u
#define SUMS_MAX_SPANS    (1u << 30)

uint64_t jlm_sums_hash_base(const void *p, size_t n) { return XXH3_64bits(p, n); }

uint64_t jlm_sums_hash(const void *p, size_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx2"))
        return jlm_sums_hash_avx2(p, n);
#endif
    return XXH3_64bits(p, n);
}

static void wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void wr64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t rd32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* ---------------------------------------------------------------- spans (invariant 1) */
typedef struct span_region { uint64_t off, page, n; } span_region;

static void regions(const jlm_header *h, span_region r[4])
{
    r[0] = (span_region){h->dense_off, h->dense_len, h->dense_len ? 1 : 0};
    r[1] = (span_region){h->data_off, h->page_size, h->n_blocks};
    r[2] = (span_region){h->vis_data_off, h->vis_page_size, h->n_vis_blocks};
    r[3] = (span_region){h->exp_data_off, h->exp_page_size, h->n_exp_pages};
}

/* len / chunk rounded up, without len + chunk - 1 (a forged page size near 2^64 wrapped it to 0) */
static uint64_t pieces(uint64_t len, uint64_t chunk) { return len / chunk + (len % chunk != 0); }

/* Counts (spans == NULL) or fills the spans; returns the count, 0 on overflow. */
static uint64_t make_spans(const jlm_header *h, jlm_span *spans)
{
    span_region r[4];
    regions(h, r);
    uint64_t n = 0, c = h->chunk;
    if (spans)
        spans[0] = (jlm_span){0, h->dense_off};
    n++;
    for (int k = 0; k < 4; k++) {
        if (!r[k].n || !r[k].page)
            continue;
        uint64_t per = pieces(r[k].page, c);
        if (per > SUMS_MAX_SPANS || r[k].n > SUMS_MAX_SPANS / per || n + per * r[k].n > SUMS_MAX_SPANS)
            return 0;
        for (uint64_t p = 0; spans && p < r[k].n; p++)
            for (uint64_t j = 0; j < per; j++) {
                uint64_t o = j * c, len = r[k].page - o < c ? r[k].page - o : c;
                spans[n + p * per + j] = (jlm_span){r[k].off + p * r[k].page + o, len};
            }
        n += per * r[k].n;
    }
    return n;
}

/* have: the sidecar's length when loading one (SIZE_MAX when writing): a
 * header claiming more spans than it can hold is refused before the span
 * list is made (a forged header could ask for 2^30 of them). */
static int spans_for(jlm_sums *s, size_t have, const char *what, jlm_err *err)
{
    uint64_t n = make_spans(&s->hdr, NULL);
    if (!n)
        return jlm_errf(err, JLM_EFORMAT, "%s: too many checksum spans", what);
    if (have != SIZE_MAX && n > have / 8)
        return jlm_errf(err, JLM_EFORMAT, "%s: belongs to another container, or the container's header is damaged "
                        "(%" PRIu64 " spans, the sidecar's %zu bytes hold fewer)", what, n, have);
    s->n = (uint32_t)n;
    s->spans = malloc(n * sizeof *s->spans);
    s->hash = calloc(n, sizeof *s->hash);
    s->ok = calloc(n, 1);
    if (!s->spans || !s->hash || !s->ok)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory for %" PRIu64 " checksum spans", what, n);
    make_spans(&s->hdr, s->spans);
    s->chunk = s->hdr.chunk;
    return JLM_OK;
}

void jlm_sums_free(jlm_sums *s)
{
    if (!s)
        return;
    free(s->spans);
    free(s->hash);
    free(s->ok);
    free(s);
}

static int header_of(const uint8_t *hb, uint64_t size, size_t have, jlm_sums *s, const char *what, jlm_err *err)
{
    int rc = jlm_fmt_header_decode(hb, JLM_HEADER_LEN, &s->hdr, err);
    if (!rc)
        rc = jlm_fmt_header_validate(&s->hdr, size, err);
    if (rc)   /* the message names the sidecar, as every other of jlm_sums_load's */
        return jlm_err_prefix(err, rc, "%s: the container's header", what);
    s->file_size = size;
    s->hdr_hash = jlm_sums_hash(hb, JLM_HEADER_LEN);
    return spans_for(s, have, what, err);
}

/* ---------------------------------------------------------------- writing (invariant 2) */
static int hash_spans(int fd, jlm_sums *s, const char *what, jlm_err *err)
{
    uint64_t max = 0;
    for (uint32_t i = 0; i < s->n; i++)
        max = s->spans[i].len > max ? s->spans[i].len : max;
    uint8_t *buf = malloc(max ? max : 1);
    if (!buf)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", what);
    for (uint32_t i = 0; i < s->n; i++) {
        size_t done;
        int e = jlm_io_pread_full(NULL, fd, buf, s->spans[i].len, s->spans[i].off, &done);
        if (e) {
            free(buf);
            return jlm_errf(err, JLM_EIO, "%s: reading bytes %" PRIu64 "+%" PRIu64 ": %s", what,
                            s->spans[i].off, s->spans[i].len, jlm_io_strerror(e));
        }
        s->hash[i] = jlm_sums_hash(buf, s->spans[i].len);
    }
    free(buf);
    return JLM_OK;
}

static uint8_t *encode(const jlm_sums *s, size_t *len)
{
    size_t n = JLM_SUMS_HDR_LEN + (size_t)s->n * 8 + 8;
    uint8_t *b = calloc(1, n);
    if (!b)
        return NULL;
    memcpy(b, JLM_SUMS_MAGIC, 8);
    wr32(b + 8, JLM_SUMS_VERSION);
    wr32(b + 12, SUMS_ALGO_XXH3_64);
    wr64(b + 16, s->file_size);
    wr64(b + 24, s->hdr_hash);
    wr64(b + 32, s->chunk);
    wr32(b + 40, s->n);
    for (uint32_t i = 0; i < s->n; i++)
        wr64(b + JLM_SUMS_HDR_LEN + (size_t)i * 8, s->hash[i]);
    wr64(b + n - 8, jlm_sums_hash(b, n - 8));
    *len = n;
    return b;
}

static int write_atomic(int dirfd, const char *path, unsigned mode, const uint8_t *b, size_t n, jlm_err *err)
{
    char *part = NULL;
    if (asprintf(&part, "%s.part", path) < 0)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", path);
    int fd = openat(dirfd, part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, (mode_t)mode);
    int rc = JLM_OK;
    size_t done;
    if (fd < 0) {
        rc = jlm_errf(err, JLM_EIO, "%s: %s", part, strerror(errno));
        free(part);
        return rc;
    }
    int e = jlm_io_pwrite_full(NULL, fd, b, n, 0, &done);
    if (e)
        rc = jlm_errf(err, e == ENOSPC ? JLM_ENOSPC : JLM_EIO, "%s: %s", part, jlm_io_strerror(e));
    else if (fsync(fd) != 0)
        rc = jlm_errf(err, JLM_EIO, "%s: fsync: %s", part, strerror(errno));
    if (close(fd) != 0 && !rc)
        rc = jlm_errf(err, JLM_EIO, "%s: close: %s", part, strerror(errno));
    if (!rc && renameat(dirfd, part, dirfd, path) != 0)
        rc = jlm_errf(err, JLM_EIO, "%s: rename to %s: %s", part, path, strerror(errno));
    if (rc)
        unlinkat(dirfd, part, 0);
    free(part);
    return rc;
}

int jlm_sums_write_fd(int fd, uint64_t size, int dirfd, const char *sums_path, unsigned mode, jlm_err *err)
{
    uint8_t hb[JLM_HEADER_LEN];
    size_t done;
    if (size < JLM_HEADER_LEN || jlm_io_pread_full(NULL, fd, hb, sizeof hb, 0, &done))
        return jlm_errf(err, JLM_EIO, "%s: cannot read the container's header", sums_path);
    jlm_sums *s = calloc(1, sizeof *s);
    if (!s)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", sums_path);
    int rc = header_of(hb, size, SIZE_MAX, s, sums_path, err);
    if (!rc)
        rc = hash_spans(fd, s, sums_path, err);
    size_t n = 0;
    uint8_t *b = rc ? NULL : encode(s, &n);
    if (!rc && !b)
        rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory", sums_path);
    if (!rc)
        rc = write_atomic(dirfd, sums_path, mode, b, n, err);
    free(b);
    jlm_sums_free(s);
    return rc;
}

/* ---------------------------------------------------------------- reading */
static int read_all(int dirfd, const char *path, uint8_t **out, size_t *len, jlm_err *err)
{
    int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return jlm_errf(err, errno == ENOENT ? JLM_ENOTFOUND : JLM_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    int rc = JLM_OK;
    uint8_t *b = NULL;
    size_t done;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = jlm_errf(err, JLM_EFORMAT, "%s: not a regular file", path);
    else if ((uint64_t)st.st_size < JLM_SUMS_HDR_LEN + 8 || (uint64_t)st.st_size > (8ull << 32))
        rc = jlm_errf(err, JLM_EFORMAT, "%s: %lld bytes is no checksum sidecar", path, (long long)st.st_size);
    else if (!(b = malloc((size_t)st.st_size)))
        rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory", path);
    else if (jlm_io_pread_full(NULL, fd, b, (size_t)st.st_size, 0, &done))
        rc = jlm_errf(err, JLM_EIO, "%s: read failed", path);
    close(fd);
    if (rc) {
        free(b);
        return rc;
    }
    *out = b;
    *len = (size_t)st.st_size;
    return JLM_OK;
}

static int pair(const jlm_sums *s, const uint8_t *b, size_t len, const char *path, jlm_err *err)
{
    if (memcmp(b, JLM_SUMS_MAGIC, 8) != 0)
        return jlm_errf(err, JLM_EFORMAT, "%s: not a jlm checksum sidecar", path);
    if (rd32(b + 8) != JLM_SUMS_VERSION || rd32(b + 12) != SUMS_ALGO_XXH3_64)
        return jlm_errf(err, JLM_EFORMAT, "%s: sidecar version %u / hash %u, this build reads %u / %u", path,
                        rd32(b + 8), rd32(b + 12), JLM_SUMS_VERSION, SUMS_ALGO_XXH3_64);
    if (rd64(b + len - 8) != jlm_sums_hash(b, len - 8))
        return jlm_errf(err, JLM_EFORMAT, "%s: the sidecar's own checksum does not match (damaged)", path);
    if (rd64(b + 16) != s->file_size || rd64(b + 24) != s->hdr_hash)
        return jlm_errf(err, JLM_EFORMAT, "%s: belongs to another container, or the container's header is damaged (size %" PRIu64 " vs %" PRIu64
                        ", header hash %016" PRIx64 " vs %016" PRIx64 ")", path, rd64(b + 16), s->file_size,
                        rd64(b + 24), s->hdr_hash);
    if (rd64(b + 32) != s->chunk || rd32(b + 40) != s->n || len != JLM_SUMS_HDR_LEN + (size_t)s->n * 8 + 8)
        return jlm_errf(err, JLM_EFORMAT, "%s: %u spans, the container has %u", path, rd32(b + 40), s->n);
    return JLM_OK;
}

int jlm_sums_load(int dirfd, const char *sums_path, const uint8_t *hdr_bytes, uint64_t file_size,
                  jlm_sums **out, jlm_err *err)
{
    uint8_t *b = NULL;
    size_t len = 0;
    int rc = read_all(dirfd, sums_path, &b, &len, err);
    if (rc)
        return rc;
    jlm_sums *s = calloc(1, sizeof *s);
    if (!s) {
        free(b);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", sums_path);
    }
    rc = header_of(hdr_bytes, file_size, len, s, sums_path, err);
    if (!rc)
        rc = pair(s, b, len, sums_path, err);
    for (uint32_t i = 0; !rc && i < s->n; i++)
        s->hash[i] = rd64(b + JLM_SUMS_HDR_LEN + (size_t)i * 8);
    free(b);
    if (rc) {
        jlm_sums_free(s);
        return rc;
    }
    *out = s;
    return JLM_OK;
}

/* ---------------------------------------------------------------- checking */
int64_t jlm_sums_find(const jlm_sums *s, uint64_t off)
{
    uint32_t lo = 0, hi = s->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->spans[mid].off + s->spans[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->n && s->spans[lo].off <= off ? (int64_t)lo : -1;
}

void jlm_sums_name(const jlm_sums *s, uint32_t i, char *buf, size_t n)
{
    const jlm_span *sp = &s->spans[i];
    if (i == 0) {
        snprintf(buf, n, "the header and records (bytes 0+%" PRIu64 ")", sp->len);
        return;
    }
    span_region r[4];
    regions(&s->hdr, r);
    static const char *names[4] = {"the dense region", "block", "vision block", "expert page"};
    for (int k = 0; k < 4; k++) {
        if (!r[k].n || sp->off < r[k].off || sp->off >= r[k].off + r[k].n * r[k].page)
            continue;
        uint64_t rel = sp->off - r[k].off, page = rel / r[k].page, chunk = rel % r[k].page / s->chunk;
        if (k == 0)
            snprintf(buf, n, "%s chunk %" PRIu64 " (bytes %" PRIu64 "+%" PRIu64 ")", names[k], chunk, sp->off, sp->len);
        else
            snprintf(buf, n, "%s %" PRIu64 " chunk %" PRIu64 " (bytes %" PRIu64 "+%" PRIu64 ")", names[k], page,
                     chunk, sp->off, sp->len);
        return;
    }
    snprintf(buf, n, "bytes %" PRIu64 "+%" PRIu64, sp->off, sp->len);
}

static uint64_t hash_zero_tail(const void *p, uint64_t have, uint64_t len)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, p, (size_t)have);
    static const uint8_t zeros[65536];
    for (uint64_t left = len - have; left;) {
        size_t k = left < sizeof zeros ? (size_t)left : sizeof zeros;
        XXH3_64bits_update(&st, zeros, k);
        left -= k;
    }
    return XXH3_64bits_digest(&st);
}

int jlm_sums_check(jlm_sums *s, uint32_t i, const void *p, uint64_t have, const char *what,
                   uint64_t *got, jlm_err *err)
{
    uint64_t len = s->spans[i].len;
    uint64_t h = have >= len ? jlm_sums_hash(p, (size_t)len) : hash_zero_tail(p, have, len);
    if (got)
        *got = h;
    if (h == s->hash[i]) {
        __atomic_store_n(&s->ok[i], 1, __ATOMIC_RELEASE);
        return JLM_OK;
    }
    char name[160];
    jlm_sums_name(s, i, name, sizeof name);
    return jlm_errf(err, JLM_EFORMAT, "%s: checksum mismatch in %s: expected %016" PRIx64 ", got %016" PRIx64,
                    what, name, s->hash[i], h);
}

int jlm_sums_done(const jlm_sums *s, uint32_t i) { return __atomic_load_n(&s->ok[i], __ATOMIC_ACQUIRE); }

char *jlm_sums_path(const char *container)
{
    char *p = NULL;
    return asprintf(&p, "%s.sums", container) < 0 ? NULL : p;
}
