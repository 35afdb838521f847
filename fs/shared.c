/* shared.c - the shared-cache mode (`-o cache=DIR,shared`, docs/scale-out.md):
 * many hosts' daemons on one cache folder of a distributed filesystem.
 *
 *   host id        a random 64-bit id made at every start (never the
 *                  hostname, machine-id or pid: containers share those);
 *                  its own .part files carry it: CACHE/<entry>.<host>.part.
 *   content keys   an entry is named by the XXH3-128 of its source's bytes
 *                  (device and inode numbers differ between two clients of
 *                  one volume). Hashing reads the whole source, so each
 *                  host remembers the hash with the source's identity
 *                  (dev, ino, size, mtime) in a file beside its database.
 *   entry lock     CACHE/<entry>.lock: an exclusive flock held by the one
 *                  host converting the entry, the holder's host id, pid
 *                  and source written in it for diagnosis; the kernel (and
 *                  the filesystem's lock server) releases it when the
 *                  holder dies, and a waiting host takes over. */
#include "fs/view_int.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/beneath.h"

void jlmfs_host_id(char out[17])
{
    unsigned char r[8] = {0};
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t n = getrandom(r + got, sizeof r - got, 0);
        if (n <= 0 && errno != EINTR)
            break;
        got += n > 0 ? (size_t)n : 0;
    }
    if (got < sizeof r) {   /* no getrandom: /dev/urandom */
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r)
            abort();   /* no source of randomness: two hosts could share an id */
        close(fd);
    }
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", r[i]);
}

/* ---------------------------------------------------------------- content keys */
typedef struct key_row { uint64_t dev, ino, size; int64_t mt_s; long mt_ns; char hex[33]; } key_row;

struct jlmfs_keys {
    pthread_mutex_t lock;
    char           *path;
    key_row        *rows; size_t n, cap;
};

static int add_row(jlmfs_keys *k, const key_row *r)
{
    if (k->n == k->cap) {
        size_t nc = k->cap ? 2 * k->cap : 64;
        key_row *nr = realloc(k->rows, nc * sizeof *nr);
        if (!nr)
            return -1;
        k->rows = nr;
        k->cap = nc;
    }
    k->rows[k->n++] = *r;
    return 0;
}

int jlmfs_keys_open(const char *path, jlmfs_keys **out)
{
    jlmfs_keys *k = calloc(1, sizeof *k);
    if (!k || !(k->path = strdup(path))) {
        free(k);
        return -1;
    }
    pthread_mutex_init(&k->lock, NULL);
    FILE *f = fopen(path, "re");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {   /* a malformed line (a torn append) is skipped */
        key_row r;
        unsigned long long dev, ino, size;
        long long s;
        if (sscanf(line, "%llx %llx %llx %lld.%ld %32[0-9a-f]", &dev, &ino, &size, &s, &r.mt_ns, r.hex) != 6 ||
            strlen(r.hex) != 32)
            continue;
        r.dev = dev, r.ino = ino, r.size = size, r.mt_s = s;
        if (add_row(k, &r))
            break;
    }
    if (f)
        fclose(f);
    *out = k;
    return 0;
}

void jlmfs_keys_close(jlmfs_keys *k)
{
    if (!k)
        return;
    pthread_mutex_destroy(&k->lock);
    free(k->rows);
    free(k->path);
    free(k);
}

/* XXH3-128 of the whole file open at fd, 32 hex digits. */
static int hash_fd(int fd, char hex[33])
{
    enum { BUF = 1 << 20 };
    uint8_t *buf = malloc(BUF);
    XXH3_state_t *st = XXH3_createState();
    int rc = !buf || !st || XXH3_128bits_reset(st) != XXH_OK ? -1 : 0;
    for (ssize_t n; !rc && (n = read(fd, buf, BUF)) != 0;) {
        if (n < 0 && errno == EINTR)
            continue;
        rc = n < 0 ? -1 : XXH3_128bits_update(st, buf, (size_t)n) == XXH_OK ? 0 : -1;
    }
    if (!rc) {
        XXH128_hash_t h = XXH3_128bits_digest(st);
        snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    }
    XXH3_freeState(st);
    free(buf);
    return rc;
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

int jlmfs_keys_get(jlmfs_keys *k, int src_fd, const char *rel, char hex[33], jlm_err *err)
{
    int fd = jlm_open_beneath(src_fd, rel, O_RDONLY, 0);
    struct stat before, after;
    if (fd < 0 || fstat(fd, &before)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return jlm_errf(err, JLM_EIO, "%s: %s", rel, strerror(e));
    }
    key_row r = {.dev = before.st_dev, .ino = before.st_ino, .size = (uint64_t)before.st_size,
                 .mt_s = before.st_mtim.tv_sec, .mt_ns = before.st_mtim.tv_nsec};
    int found = 0;
    pthread_mutex_lock(&k->lock);
    for (size_t i = k->n; i-- > 0 && !found;)
        if (k->rows[i].dev == r.dev && k->rows[i].ino == r.ino && k->rows[i].size == r.size &&
            k->rows[i].mt_s == r.mt_s && k->rows[i].mt_ns == r.mt_ns) {
            memcpy(hex, k->rows[i].hex, 33);
            found = 1;
        }
    pthread_mutex_unlock(&k->lock);
    if (found) {
        close(fd);
        return 0;
    }
    int rc = hash_fd(fd, r.hex);
    int moved = !rc && (fstat(fd, &after) || !same_file(&before, &after));
    close(fd);
    if (rc)
        return jlm_errf(err, JLM_EIO, "%s: hashing: %s", rel, strerror(errno));
    if (moved)   /* written while hashed: not stable yet */
        return jlm_errf(err, JLM_ENOTFOUND, "%s: changed while its content key was computed", rel);
    memcpy(hex, r.hex, 33);
    pthread_mutex_lock(&k->lock);
    add_row(k, &r);
    FILE *f = fopen(k->path, "ae");   /* one line per append: a torn one is skipped when read */
    if (f) {
        fprintf(f, "%llx %llx %llx %lld.%09ld %s\n", (unsigned long long)r.dev, (unsigned long long)r.ino,
                (unsigned long long)r.size, (long long)r.mt_s, r.mt_ns, r.hex);
        fclose(f);
    }
    pthread_mutex_unlock(&k->lock);
    return 0;
}

/* ---------------------------------------------------------------- the entry lock */
/* The first line of the lock file: its (last) holder's "host H pid P converting REL". */
static void read_holder(int fd, char *holder, size_t n)
{
    ssize_t r = pread(fd, holder, n - 1, 0);
    holder[r > 0 ? r : 0] = 0;
    holder[strcspn(holder, "\n")] = 0;
}

int jlmfs_entry_lock(jlmfs_view *v, char *holder, size_t n)
{
    char *path = NULL;
    holder[0] = 0;
    if (asprintf(&path, "%s.lock", v->cache_path) < 0)
        return -1;
    int fd = jlmfs_cache_open(v->env->cache_fd, path, O_RDWR | O_CREAT, 0600);
    free(path);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        read_holder(fd, holder, n);
        close(fd);
        errno = e;
        return e == EWOULDBLOCK ? 0 : -1;
    }
    read_holder(fd, holder, n);   /* the last holder's line, for the take-over message */
    char line[512];
    int len = snprintf(line, sizeof line, "host %s pid %ld converting %s\n", v->env->host, (long)getpid(), v->rel);
    if (ftruncate(fd, 0) || pwrite(fd, line, (size_t)len, 0) != len) {
        /* diagnosis only: the flock is what excludes */
    }
    v->lock_fd = fd;
    return 1;
}

void jlmfs_entry_unlock(jlmfs_view *v)
{
    if (v->lock_fd >= 0)
        close(v->lock_fd);   /* releases the flock */
    v->lock_fd = -1;
}
