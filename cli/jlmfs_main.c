/* jlmfs_main.c - `jlmfs SRC MOUNTPOINT [-f] [-o cache=DIR,workers=N,...]`: the
 * FUSE layer, on libfuse's lowlevel API. Each callback turns its inode into a
 * mount path, resolves the path to a node (fs/jlmfs.h), does a plain syscall
 * for a passthrough node (as libfuse's passthrough.c does) or calls fs/
 * logic for a view node, maps the JLM_E* code to -errno in one place
 * (errno_of) and replies. Views are read-only: every mutation of a view node
 * is refused with EROFS.
 *
 * Inodes (docs/security.md section 11): every version of a view has inodes
 * of its own. An inode is a mount path plus the version it resolved to
 * (jlmfs_node_version: the view's serial; for a passthrough file its real
 * inode); a lookup that finds the path now names another version makes a new
 * inode and leaves the old one to the descriptors still open on it. So the
 * kernel never keeps one page cache or one size for two versions: a
 * descriptor reads the version it opened from start to end (or gets EIO for
 * every page once that version failed), and a fresh open reads the new one.
 * An operation by path on an inode whose version is no longer there answers
 * ESTALE (the kernel then walks the path again). Inode numbers are never
 * reused within a mount (a 64-bit counter), so the generation is always 0. */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <jansson.h>
#include <sqlite3.h>

#include "fs/jlmfs.h"
#include "cli/opts.h"
#include "format/jlm_format.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

static const char USAGE[] =
    "usage: jlmfs SRC MOUNTPOINT [-f] [-d] [-o OPTIONS]\n"
    "Mounts the folder SRC at MOUNTPOINT; every complete x.gguf (or Hugging Face\n"
    "folder x/) in it gets a read-only model view x.jlm/ (model.jlm, status, config.json, tensors, dense,\n"
    "blocks/N, vision/N, experts/B.E, resident/, stats). See docs/jlmfs.md.\n"
    "options:\n"
    "  -o cache=DIR     container cache (default SRC/.jlmfs-cache, hidden from the mount)\n"
    "  -o workers=N     background conversion threads (default 1)\n"
    "  -o type=T        quantize at conversion: keep (default), Q8_0, Q6_K, Q5_K_M,\n"
    "                   Q4_K_M, Q5_1, Q5_0, Q4_1, Q4_0 (as jlm convert --type)\n"
    "  -o allow_other   let other users use the mount (FUSE option; the kernel checks\n"
    "                   every access against SRC's owners and modes: default_permissions)\n"
    "  -f               stay in the foreground, the log on stderr (else syslog,\n"
    "                   facility daemon: mounts, conversions, errors, drops);\n"
    "                   -d: debug (implies -f)\n"
    "test hook: JLMFS_TEST_SLOW_MS=N sleeps N ms before each page the\n"
    "background conversion packs (so tests can read ahead of it).\n";

static int errno_of(int code)
{
    switch (code) {
    case JLM_OK: return 0;
    case JLM_ENOTFOUND: return -ENOENT;
    case JLM_EINVAL: return -EINVAL;
    case JLM_ENOMEM: return -ENOMEM;
    case JLM_ENOSPC: return -ENOSPC;
    case JLM_ERANGE: return -ERANGE;
    case JLM_EUNSUPPORTED: return -ENOTSUP;
    default: return -EIO;   /* JLM_EIO, JLM_EFORMAT, JLM_EVERSION: the bytes cannot be served */
    }
}

static jlmfs *g_fs;
static struct fuse_session *g_se;
static jlmfs *FS(void) { return g_fs; }

/* ---------------------------------------------------------------- the log */
/* Mounts, views planned, ready, failed and dropped, database notes
 * (jlmfs_opts.log): on stderr in the foreground (-f, -d), else to syslog
 * (the journal), facility daemon. Control bytes of names become '?'. */
static int g_foreground;

static void log_line(void *ctx, int prio, const char *line)
{
    char clean[2048];
    size_t i = 0;
    for (; line[i] && i < sizeof clean - 1; i++)
        clean[i] = (unsigned char)line[i] < 0x20 || line[i] == 0x7f ? '?' : line[i];
    clean[i] = 0;
    if (g_foreground)
        fprintf(stderr, "jlmfs: %s\n", clean);
    else
        syslog(prio, "%s", clean);
}

static void logf_(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(int prio, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log_line(NULL, prio, line);
}

/* ---------------------------------------------------------------- inodes */
/* Every inode the kernel holds (nlookup > 0) and the root. One table lock;
 * nothing slow runs under it. Hashed by number and by path: a path has at
 * most one current inode (what a lookup gives while its version stays) and
 * any number of stale ones (old versions, removed names) until forgotten. */
typedef struct inode {
    fuse_ino_t    ino;
    uint64_t      nlookup;
    uint64_t      version;     /* ino_version */
    char         *path;        /* mount path: "/" or "/a/b" */
    int           current;
    struct inode *next_ino, *next_path;
} inode;

#define INO_BUCKETS 16384
static struct {
    pthread_mutex_t lock;
    inode          *by_ino[INO_BUCKETS], *by_path[INO_BUCKETS];
    fuse_ino_t      next;
    inode           root;
} T = {.lock = PTHREAD_MUTEX_INITIALIZER, .next = FUSE_ROOT_ID + 1};

static size_t path_hash(const char *p)
{
    uint64_t h = 1469598103934665603ull;
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return (size_t)(h % INO_BUCKETS);
}

static inode *ino_get_locked(fuse_ino_t ino)
{
    if (ino == FUSE_ROOT_ID)
        return &T.root;
    inode *i = T.by_ino[ino % INO_BUCKETS];
    while (i && i->ino != ino)
        i = i->next_ino;
    return i;
}

static inode *current_locked(const char *path)
{
    for (inode *i = T.by_path[path_hash(path)]; i; i = i->next_path)
        if (i->current && !strcmp(i->path, path))
            return i;
    return NULL;
}

static void path_unhash_locked(inode *i)
{
    inode **pp = &T.by_path[path_hash(i->path)];
    while (*pp != i)
        pp = &(*pp)->next_path;
    *pp = i->next_path;
}

static void path_hash_locked(inode *i)
{
    size_t b = path_hash(i->path);
    i->next_path = T.by_path[b];
    T.by_path[b] = i;
}

static void ino_init_root(void)
{
    T.root.ino = FUSE_ROOT_ID;
    T.root.nlookup = 1;
    T.root.path = "/";
    T.root.current = 1;
}

/* The version of a resolved node: a view node's view serial (top bit set),
 * else the passthrough file's own identity. */
static uint64_t ino_version(const jlmfs_node *n, const struct stat *st)
{
    if (n->kind != JLMFS_PASS)
        return jlmfs_node_version(n) | (1ull << 63);
    return ((uint64_t)st->st_ino ^ ((uint64_t)st->st_dev << 40)) & ~(1ull << 63);
}

/* A reply_entry is about to give the kernel a reference to path at version:
 * the current inode if it is that version, else a new one (the old one goes
 * stale). 0 if out of memory. */
static fuse_ino_t ino_link(const char *path, uint64_t version)
{
    pthread_mutex_lock(&T.lock);
    inode *c = current_locked(path);
    fuse_ino_t ino = 0;
    if (c && c->version == version) {
        c->nlookup++;
        ino = c->ino;
    } else {
        inode *n = calloc(1, sizeof *n);
        char *p = n ? strdup(path) : NULL;
        if (p) {
            if (c && c != &T.root)
                c->current = 0;   /* another version now: its descriptors keep their own inode */
            n->ino = T.next++;
            n->nlookup = 1;
            n->version = version;
            n->path = p;
            n->current = 1;
            n->next_ino = T.by_ino[n->ino % INO_BUCKETS];
            T.by_ino[n->ino % INO_BUCKETS] = n;
            path_hash_locked(n);
            ino = n->ino;
        } else {
            free(n);
        }
    }
    pthread_mutex_unlock(&T.lock);
    return ino;
}

static void ino_forget(fuse_ino_t ino, uint64_t n)
{
    pthread_mutex_lock(&T.lock);
    inode *i = ino_get_locked(ino);
    if (i && i != &T.root) {
        i->nlookup = n < i->nlookup ? i->nlookup - n : 0;
        if (!i->nlookup) {
            inode **pp = &T.by_ino[ino % INO_BUCKETS];
            while (*pp != i)
                pp = &(*pp)->next_ino;
            *pp = i->next_ino;
            path_unhash_locked(i);
            free(i->path);
            free(i);
        }
    }
    pthread_mutex_unlock(&T.lock);
}

/* The path (malloc'd) and version of ino; -ESTALE if the kernel names an
 * inode it was never given or already forgot. */
static int ino_path(fuse_ino_t ino, char **path, uint64_t *version, int *current)
{
    pthread_mutex_lock(&T.lock);
    inode *i = ino_get_locked(ino);
    int rc = !i ? -ESTALE : !(*path = strdup(i->path)) ? -ENOMEM : 0;
    if (!rc) {
        if (version)
            *version = i->version;
        if (current)
            *current = i->current;
    }
    pthread_mutex_unlock(&T.lock);
    return rc;
}

/* parent's path + "/" + name (malloc'd). */
static int child_path(fuse_ino_t parent, const char *name, char **out)
{
    char *pp;
    int rc = ino_path(parent, &pp, NULL, NULL);
    if (rc)
        return rc;
    rc = asprintf(out, "%s%s%s", pp, strcmp(pp, "/") ? "/" : "", name) < 0 ? -ENOMEM : 0;
    free(pp);
    return rc;
}

/* path was removed (unlink, rmdir, the target of a rename): the next lookup
 * makes a new inode. */
static void ino_unhash(const char *path)
{
    pthread_mutex_lock(&T.lock);
    inode *c = current_locked(path);
    if (c && c != &T.root)
        c->current = 0;
    pthread_mutex_unlock(&T.lock);
}

/* from was renamed to to: every inode at from or below it moves. */
static void ino_rename(const char *from, const char *to)
{
    size_t fl = strlen(from);
    pthread_mutex_lock(&T.lock);
    inode *c = current_locked(to);
    if (c && c != &T.root)
        c->current = 0;
    for (size_t b = 0; b < INO_BUCKETS; b++)
        for (inode *i = T.by_ino[b]; i; i = i->next_ino) {
            if (strncmp(i->path, from, fl) || (i->path[fl] && i->path[fl] != '/'))
                continue;
            char *np = NULL;
            if (asprintf(&np, "%s%s", to, i->path + fl) < 0)
                continue;   /* out of memory: it keeps the old path (its lookups go stale) */
            path_unhash_locked(i);
            free(i->path);
            i->path = np;
            path_hash_locked(i);
        }
    pthread_mutex_unlock(&T.lock);
}

/* At exit: the kernel sends no forget for what it held at unmount. */
static void ino_free_all(void)
{
    pthread_mutex_lock(&T.lock);
    for (size_t b = 0; b < INO_BUCKETS; b++) {
        for (inode *i = T.by_ino[b], *next; i; i = next) {
            next = i->next_ino;
            free(i->path);
            free(i);
        }
        T.by_ino[b] = T.by_path[b] = NULL;
    }
    pthread_mutex_unlock(&T.lock);
}

/* Every inode (current or stale) with this path: up to max numbers. */
static size_t ino_all_of(const char *path, fuse_ino_t *out, size_t max)
{
    size_t k = 0;
    pthread_mutex_lock(&T.lock);
    for (inode *i = T.by_path[path_hash(path)]; i && k < max; i = i->next_path)
        if (!strcmp(i->path, path))
            out[k++] = i->ino;
    pthread_mutex_unlock(&T.lock);
    return k;
}

/* ---------------------------------------------------------------- nodes */
/* A listing, taken whole at offset 0 (opendir, rewinddir) and handed out
 * in pieces. */
typedef struct dirent_ { char *name; mode_t type; } dirent_;
typedef struct dirh { dirent_ *e; size_t n, cap; } dirh;

/* An open file: the node it resolved to, plus its fd (passthrough) or the
 * text snapshot taken at open (status, stats, ...); an open directory: its
 * listing. */
typedef struct handle {
    jlmfs_node node;
    int        fd;        /* PASS: open descriptor; else -1 */
    int        writing;   /* PASS opened for writing: release re-syncs the view */
    char      *text;      /* TEXT: snapshot */
    size_t     text_len;
    dirh       dir;       /* an open directory's listing */
    /* the handle table (under g_h.lock) */
    uint64_t   id;        /* fi->fh */
    int        busy;      /* requests using it now */
    int        released;
    struct handle *next;
} handle;

/* Open files by number (fi->fh). The kernel can send a file's RELEASE while
 * a READ of it is still being answered (seen on Linux 6.18 with a status
 * file read as its view converts): a request holds the handle (busy) and the
 * last of release and the requests frees it; a request on a released number
 * gets EBADF. */
#define H_BUCKETS 1024
static struct {
    pthread_mutex_t lock;
    handle         *b[H_BUCKETS];
    uint64_t        next;
} g_h = {.lock = PTHREAD_MUTEX_INITIALIZER, .next = 1};

static void handle_free(handle *h);

static void handle_add(handle *h, struct fuse_file_info *fi)
{
    pthread_mutex_lock(&g_h.lock);
    h->id = g_h.next++;
    h->next = g_h.b[h->id % H_BUCKETS];
    g_h.b[h->id % H_BUCKETS] = h;
    pthread_mutex_unlock(&g_h.lock);
    fi->fh = h->id;
}

/* The handle of fi, held (hput), or NULL (no fi, or released). */
static handle *hget(struct fuse_file_info *fi)
{
    if (!fi)
        return NULL;
    pthread_mutex_lock(&g_h.lock);
    handle *h = g_h.b[fi->fh % H_BUCKETS];
    while (h && h->id != fi->fh)
        h = h->next;
    if (h && h->released)
        h = NULL;
    if (h)
        h->busy++;
    pthread_mutex_unlock(&g_h.lock);
    return h;
}

static void unlink_locked(handle *h)
{
    handle **pp = &g_h.b[h->id % H_BUCKETS];
    while (*pp != h)
        pp = &(*pp)->next;
    *pp = h->next;
}

static void hput(handle *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&g_h.lock);
    int last = --h->busy == 0 && h->released;
    if (last)
        unlink_locked(h);
    pthread_mutex_unlock(&g_h.lock);
    if (last)
        handle_free(h);
}

/* RELEASE (or an open the kernel never got): freed now, or by the last
 * request still using it. */
static void handle_release(struct fuse_file_info *fi)
{
    pthread_mutex_lock(&g_h.lock);
    handle *h = g_h.b[fi->fh % H_BUCKETS];
    while (h && h->id != fi->fh)
        h = h->next;
    int now = h && !h->released && !h->busy;
    if (h)
        h->released = 1;
    if (now)
        unlink_locked(h);
    pthread_mutex_unlock(&g_h.lock);
    if (now)
        handle_free(h);
}

static int resolve(const char *path, jlmfs_node *n)
{
    jlm_err e;
    return errno_of(jlmfs_resolve(FS(), path, n, &e));
}

/* For a name to be created: an absent name inside a view is refused as a
 * write to a read-only view (EROFS), not as a missing file. */
static int resolve_new(const char *path, jlmfs_node *n)
{
    int rc = resolve(path, n);
    if (rc != -ENOENT)
        return rc;
    char *dir = strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
    if (!slash) {
        free(dir);
        return rc;
    }
    *(slash == dir ? slash + 1 : slash) = 0;
    jlmfs_node p = {0};
    if (!resolve(dir, &p) && p.kind != JLMFS_PASS)
        rc = -EROFS;
    jlmfs_node_clear(&p);
    free(dir);
    return rc;
}

static int node_stat(const jlmfs_node *n, struct stat *st)
{
    jlm_err e;
    return n->kind == JLMFS_PASS ? (lstat(n->real, st) ? -errno : 0) : errno_of(jlmfs_node_stat(FS(), n, st, &e));
}

/* The node ino names now: resolved by its path, and -ESTALE if that path is
 * another version now than the inode's (the kernel walks the path again and
 * finds the new inode). st (if non-NULL) gets its attributes. */
static int ino_node(fuse_ino_t ino, jlmfs_node *n, struct stat *st)
{
    char *path;
    uint64_t ver;
    int cur;
    int rc = ino_path(ino, &path, &ver, &cur);
    if (rc)
        return rc;
    rc = resolve(path, n);
    free(path);
    struct stat s;
    if (!rc)
        rc = node_stat(n, &s);
    if (!rc && ino != FUSE_ROOT_ID && ino_version(n, &s) != ver)
        rc = -ESTALE;
    if (rc) {
        jlmfs_node_clear(n);
        return rc;
    }
    if (st) {
        *st = s;
        st->st_ino = ino;
    }
    return 0;
}

/* The entry for the kernel of path (just looked up or made): its inode
 * (reference taken) and attributes. */
static int make_entry(const char *path, struct fuse_entry_param *e)
{
    jlmfs_node n = {0};
    int rc = resolve(path, &n);
    memset(e, 0, sizeof *e);
    if (!rc)
        rc = node_stat(&n, &e->attr);
    if (!rc && !(e->ino = ino_link(path, ino_version(&n, &e->attr))))
        rc = -ENOMEM;
    jlmfs_node_clear(&n);
    if (rc)
        return rc;
    e->attr.st_ino = e->ino;
    e->generation = 0;
    e->attr_timeout = 0.0;    /* views appear and vanish with their GGUF; texts change size */
    e->entry_timeout = 0.0;
    return 0;
}

static void reply_entry(fuse_req_t req, const struct fuse_entry_param *e)
{
    if (fuse_reply_entry(req, e) == -ENOENT)   /* the request was interrupted: the kernel holds no reference */
        ino_forget(e->ino, 1);
}

/* ---------------------------------------------------------------- attributes, listings */
static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    char *path;
    struct fuse_entry_param e;
    int rc = child_path(parent, name, &path);
    if (!rc) {
        rc = make_entry(path, &e);
        free(path);
    }
    if (rc)
        fuse_reply_err(req, -rc);
    else
        reply_entry(req, &e);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    ino_forget(ino, nlookup);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    for (size_t i = 0; i < count; i++)
        ino_forget(forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
}

/* An open file answers for itself (its view, even once its GGUF is gone or
 * replaced); else the inode's path, if it is still that version. */
static int getattr_of(fuse_ino_t ino, struct fuse_file_info *fi, struct stat *st)
{
    handle *h = hget(fi);
    int rc;
    if (h && h->fd >= 0) {
        rc = fstat(h->fd, st) ? -errno : 0;
    } else if (h && h->node.kind != JLMFS_PASS) {
        jlm_err e;
        rc = errno_of(jlmfs_node_stat(FS(), &h->node, st, &e));
    } else {
        jlmfs_node n = {0};
        rc = ino_node(ino, &n, st);
        jlmfs_node_clear(&n);
    }
    hput(h);
    if (!rc)
        st->st_ino = ino;
    return rc;
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct stat st;
    int rc = getattr_of(ino, fi, &st);
    if (rc)
        fuse_reply_err(req, -rc);
    else
        fuse_reply_attr(req, &st, 0.0);
}


static void dirh_clear(dirh *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->e[i].name);
    free(d->e);
    d->e = NULL;
    d->n = d->cap = 0;
}

static int dirh_add(void *ctx, const char *name, const struct stat *st)
{
    dirh *d = ctx;
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 32;
        dirent_ *ne = realloc(d->e, nc * sizeof *ne);
        if (!ne)
            return 1;
        d->e = ne;
        d->cap = nc;
    }
    if (!(d->e[d->n].name = strdup(name)))
        return 1;
    d->e[d->n++].type = st ? st->st_mode & S_IFMT : 0;
    return 0;
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    handle *h = calloc(1, sizeof *h);
    if (!h) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    h->fd = -1;
    handle_add(h, fi);
    if (fuse_reply_open(req, fi) == -ENOENT)
        handle_release(fi);
}

static int dir_load(fuse_ino_t ino, dirh *d)
{
    jlmfs_node n = {0};
    int rc = ino_node(ino, &n, NULL);
    if (rc)
        return rc;
    dirh_clear(d);
    if (n.kind != JLMFS_PASS) {   /* a PASS listing carries the real . and .. */
        struct stat ds = {.st_mode = S_IFDIR};
        dirh_add(d, ".", &ds);
        dirh_add(d, "..", &ds);
    }
    jlm_err e;
    rc = errno_of(jlmfs_list(FS(), &n, dirh_add, d, &e));
    jlmfs_node_clear(&n);
    return rc;
}

static void readdir_h(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, dirh *d)
{
    int rc = off == 0 ? dir_load(ino, d) : 0;
    if (rc) {
        fuse_reply_err(req, -rc);
        return;
    }
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t pos = 0;
    for (size_t i = (size_t)off; off >= 0 && i < d->n; i++) {
        struct stat st = {.st_ino = 0xffffffffu, .st_mode = d->e[i].type};   /* no inode number in a listing */
        size_t need = fuse_add_direntry(req, buf + pos, size - pos, d->e[i].name, &st, (off_t)(i + 1));
        if (need > size - pos)
            break;
        pos += need;
    }
    fuse_reply_buf(req, buf, pos);
    free(buf);
}

/* The kernel serialises a directory's readdirs (its position lock). */
static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    handle *h = hget(fi);
    if (h)
        readdir_h(req, ino, size, off, &h->dir);
    else
        fuse_reply_err(req, EBADF);
    hput(h);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    handle_release(fi);
    fuse_reply_err(req, 0);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
    jlmfs_node n = {0};
    char buf[PATH_MAX + 1];
    int rc = ino_node(ino, &n, NULL);
    ssize_t r = -1;
    if (!rc) {
        r = n.kind == JLMFS_PASS ? readlink(n.real, buf, sizeof buf - 1) : (errno = EINVAL, -1);
        rc = r < 0 ? -errno : 0;
    }
    jlmfs_node_clear(&n);
    if (rc) {
        fuse_reply_err(req, -rc);
        return;
    }
    buf[r] = 0;
    fuse_reply_readlink(req, buf);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    jlmfs_node n = {0};
    struct statvfs st;
    int rc = ino_node(ino, &n, NULL);
    if (rc == -ESTALE || rc == -ENOENT)
        rc = ino_node(FUSE_ROOT_ID, &n, NULL);
    if (!rc)
        rc = statvfs(n.real ? n.real : jlmfs_cache_dir(FS()), &st) ? -errno : 0;
    jlmfs_node_clear(&n);
    if (rc)
        fuse_reply_err(req, -rc);
    else
        fuse_reply_statfs(req, &st);
}

/* ---------------------------------------------------------------- privilege (docs/security.md) */
/* setuid/setgid bits are never set through the mount: a user able to write
 * into SRC must not mint a privileged program there (the daemon is root). */
#define PRIV_BITS (S_ISUID | S_ISGID)

/* A new name made by the (root) daemon goes to the calling user: the caller's
 * uid, and the caller's gid unless the parent directory is setgid (then its
 * group, as the kernel does). No-op when the daemon is not root: it cannot
 * give files away, and every file is then its own user's anyway. */
static int give_to_caller(fuse_req_t req, const char *real, int fd)
{
    if (geteuid() != 0)
        return 0;
    const struct fuse_ctx *cx = fuse_req_ctx(req);
    gid_t gid = cx->gid;
    char *dir = strdup(real), *slash = dir ? strrchr(dir, '/') : NULL;
    struct stat pst;
    if (slash && slash != dir) {
        *slash = 0;
        if (!stat(dir, &pst) && (pst.st_mode & S_ISGID))
            gid = pst.st_gid;
    }
    free(dir);
    int rc = fd >= 0 ? fchown(fd, cx->uid, gid) : fchownat(AT_FDCWD, real, cx->uid, gid, AT_SYMLINK_NOFOLLOW);
    return rc ? -errno : 0;
}

/* ---------------------------------------------------------------- open, read, release */
/* Opens path (create: a new passthrough file). A view node must still be the
 * version of the inode opened (-ESTALE: the kernel looks the path up again);
 * ver 0 skips the check (create). */
static int open_node(fuse_req_t req, const char *path, uint64_t ver, struct fuse_file_info *fi, int create,
                     mode_t mode)
{
    handle *h = calloc(1, sizeof *h);
    if (!h)
        return -ENOMEM;
    h->fd = -1;
    int rc = create ? resolve_new(path, &h->node) : resolve(path, &h->node);
    if (!rc && !create && h->node.kind != JLMFS_PASS && ino_version(&h->node, NULL) != ver)
        rc = -ESTALE;
    if (!rc && h->node.kind == JLMFS_PASS) {
        h->fd = create ? jlmfs_pass_open(FS(), h->node.rel, fi->flags | O_CREAT | O_EXCL, mode & ~PRIV_BITS)
                       : jlmfs_pass_open(FS(), h->node.rel, fi->flags, 0);
        rc = h->fd < 0 ? -errno : 0;
        if (!rc && create && (rc = give_to_caller(req, h->node.real, h->fd)))
            unlink(h->node.real);   /* never leave a root-owned file behind */
        h->writing = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
        if (!rc && h->writing)
            jlmfs_write_begin(FS(), h->node.rel);   /* its view goes until release */
        fi->keep_cache = 0;   /* SRC may change beside the mount: the kernel drops its pages at each open */
    } else if (!rc) {
        jlm_err e;
        if (create || (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
            rc = -EROFS;
        else if (h->node.kind == JLMFS_TEXT) {
            fi->direct_io = 1;    /* status and stats change: every read asks the daemon */
            rc = errno_of(jlmfs_text(FS(), &h->node, &h->text, &h->text_len, &e));
        } else if (h->node.kind == JLMFS_DIR)
            rc = -EISDIR;
        else
            fi->keep_cache = 1;   /* a span: its inode is one version, whose bytes never change */
    }
    if (rc) {
        if (h->fd >= 0)
            close(h->fd);
        jlmfs_node_clear(&h->node);
        free(h);
        return rc;
    }
    handle_add(h, fi);
    return 0;
}

static void handle_free(handle *h)
{
    if (h->fd >= 0)
        close(h->fd);
    if (h->writing)
        jlmfs_write_end(FS(), h->node.rel);   /* a GGUF closed after writing gets its view */
    jlmfs_node_clear(&h->node);
    free(h->text);
    dirh_clear(&h->dir);
    free(h);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    char *path;
    uint64_t ver;
    int rc = ino_path(ino, &path, &ver, NULL);
    if (!rc) {
        rc = open_node(req, path, ver, fi, 0, 0);
        free(path);
    }
    if (rc)
        fuse_reply_err(req, -rc);
    else if (fuse_reply_open(req, fi) == -ENOENT)
        handle_release(fi);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi)
{
    char *path;
    struct fuse_entry_param e;
    int rc = child_path(parent, name, &path);
    if (rc) {
        fuse_reply_err(req, -rc);
        return;
    }
    rc = open_node(req, path, 0, fi, 1, mode);
    if (!rc && (rc = make_entry(path, &e))) {   /* out of memory, or the new file went at once */
        handle *h = hget(fi);
        if (h)
            unlink(h->node.real);
        hput(h);
        handle_release(fi);
    }
    free(path);
    if (rc) {
        fuse_reply_err(req, -rc);
    } else if (fuse_reply_create(req, &e, fi) == -ENOENT) {
        ino_forget(e.ino, 1);
        handle_release(fi);
    }
}

static void read_h(fuse_req_t req, handle *h, size_t size, off_t off)
{
    jlm_err e;
    size_t got = 0;
    switch (h->node.kind) {
    case JLMFS_PASS:
    case JLMFS_SPAN: {
        char *buf = malloc(size ? size : 1);
        if (!buf) {
            fuse_reply_err(req, ENOMEM);
            return;
        }
        int rc;
        if (h->node.kind == JLMFS_PASS) {
            ssize_t r = pread(h->fd, buf, size, off);
            rc = r < 0 ? -errno : 0;
            got = r < 0 ? 0 : (size_t)r;
        } else {
            rc = errno_of(jlmfs_read(FS(), &h->node, buf, size, (uint64_t)off, &got, &e));
            if (rc)
                logf_(LOG_ERR, "%s", e.msg);
        }
        if (rc)
            fuse_reply_err(req, -rc);
        else
            fuse_reply_buf(req, buf, got);
        free(buf);
        return;
    }
    case JLMFS_TEXT:
        if (off >= 0 && (size_t)off < h->text_len)
            got = h->text_len - (size_t)off < size ? h->text_len - (size_t)off : size;
        fuse_reply_buf(req, got ? h->text + off : NULL, got);
        return;
    default:
        fuse_reply_buf(req, NULL, 0);
    }
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    handle *h = hget(fi);
    if (h)
        read_h(req, h, size, off);
    else
        fuse_reply_err(req, EBADF);
    hput(h);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    handle *h = hget(fi);
    ssize_t r = !h ? (errno = EBADF, -1) : h->fd < 0 ? (errno = EROFS, -1) : pwrite(h->fd, buf, size, off);
    hput(h);
    if (r < 0)
        fuse_reply_err(req, errno);
    else
        fuse_reply_write(req, (size_t)r);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    handle_release(fi);
    fuse_reply_err(req, 0);
}

/* close(2) waits for flush, not for release: ending the write here makes
 * `cp x.gguf MNT/ && ls MNT/x.jlm` see the view. A later write through a
 * dup'd descriptor changes the file's identity, which replaces the view. */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    handle *h = hget(fi);
    pthread_mutex_lock(&g_h.lock);   /* two flushes (dup'd descriptors) end the write once */
    int end = h && h->writing;
    if (end)
        h->writing = 0;
    pthread_mutex_unlock(&g_h.lock);
    if (end)
        jlmfs_write_end(FS(), h->node.rel);
    hput(h);
    fuse_reply_err(req, 0);
}

/* A writer sizing its output (jlm convert -o MNT/x.jlm: ftruncate, then
 * posix_fallocate, whose glibc fallback fails on a write-only descriptor with
 * EBADF when the filesystem has no fallocate): on the passthrough descriptor. */
static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
    handle *h = hget(fi);
    int rc = !h || h->fd < 0 ? EROFS : fallocate(h->fd, mode, off, len) ? errno : 0;   /* a view file: read-only */
    hput(h);
    fuse_reply_err(req, rc);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    handle *h = hget(fi);
    int rc = !h || h->fd < 0 ? 0 : (datasync ? fdatasync(h->fd) : fsync(h->fd)) ? errno : 0;
    hput(h);
    fuse_reply_err(req, rc);
}

/* ---------------------------------------------------------------- mutations (passthrough only) */
/* The passthrough node a mutation of path works on: -EROFS for a view node. */
static int pass_node(const char *path, jlmfs_node *n)
{
    int rc = resolve_new(path, n);
    if (!rc && n->kind != JLMFS_PASS)
        rc = -EROFS;
    if (rc)
        jlmfs_node_clear(n);
    return rc;
}

/* mkdir/symlink, then the new name to the caller (removed if that fails). */
static int made(fuse_req_t req, int rc, const char *real, int is_dir)
{
    if (rc)
        return -errno;
    if (!(rc = give_to_caller(req, real, -1)))
        return 0;
    (void)(is_dir ? rmdir(real) : unlink(real));
    return rc;
}

/* mkdir (link NULL) or symlink (to link) of parent/name, replied with its entry. */
static void make_node(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, const char *link)
{
    char *path;
    jlmfs_node n = {0};
    struct fuse_entry_param e;
    int rc = child_path(parent, name, &path);
    if (rc) {
        fuse_reply_err(req, -rc);
        return;
    }
    if (!(rc = pass_node(path, &n))) {
        rc = link ? made(req, symlink(link, n.real), n.real, 0) : made(req, mkdir(n.real, mode & ~PRIV_BITS), n.real, 1);
        if (!rc)
            jlmfs_changed(FS(), n.rel);
        jlmfs_node_clear(&n);
    }
    if (!rc)
        rc = make_entry(path, &e);
    free(path);
    if (rc)
        fuse_reply_err(req, -rc);
    else
        reply_entry(req, &e);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    make_node(req, parent, name, mode, NULL);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    make_node(req, parent, name, 0, link);
}

static void remove_node(fuse_req_t req, fuse_ino_t parent, const char *name, int is_dir)
{
    char *path = NULL;
    jlmfs_node n = {0};
    int rc = child_path(parent, name, &path);
    if (!rc && !(rc = pass_node(path, &n))) {
        rc = (is_dir ? rmdir(n.real) : unlink(n.real)) ? -errno : 0;
        if (!rc) {
            ino_unhash(path);
            jlmfs_changed(FS(), n.rel);
        }
        jlmfs_node_clear(&n);
    }
    free(path);
    fuse_reply_err(req, -rc);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) { remove_node(req, parent, name, 0); }
static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) { remove_node(req, parent, name, 1); }

/* chmod, chown, truncate, utimens: in that order, each on the passthrough
 * path (a truncate with an open descriptor on it), then the attributes. */
static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi)
{
    char *path;
    jlmfs_node n = {0};
    int rc = ino_path(ino, &path, NULL, NULL);
    if (rc) {
        fuse_reply_err(req, -rc);
        return;
    }
    if ((to_set & FUSE_SET_ATTR_MODE) && (attr->st_mode & PRIV_BITS))
        rc = -EPERM;
    if (!rc && (to_set & FUSE_SET_ATTR_SIZE)) {   /* through an open descriptor: on it */
        handle *h = hget(fi);
        if (h && h->fd >= 0) {
            rc = ftruncate(h->fd, attr->st_size) ? -errno : 0;
            to_set &= ~FUSE_SET_ATTR_SIZE;
        }
        hput(h);
    }
    int more = to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID | FUSE_SET_ATTR_SIZE |
                         FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW);
    if (!rc && more && !(rc = pass_node(path, &n))) {
        if (to_set & FUSE_SET_ATTR_MODE)
            rc = chmod(n.real, attr->st_mode & 07777) ? -errno : 0;
        if (!rc && (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)))
            rc = lchown(n.real, (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1,
                        (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1) ? -errno : 0;
        if (!rc && (to_set & FUSE_SET_ATTR_SIZE))
            rc = truncate(n.real, attr->st_size) ? -errno : 0;
        if (!rc && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                              FUSE_SET_ATTR_MTIME_NOW))) {
            struct timespec tv[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
            if (to_set & FUSE_SET_ATTR_ATIME_NOW)
                tv[0].tv_nsec = UTIME_NOW;
            else if (to_set & FUSE_SET_ATTR_ATIME)
                tv[0] = attr->st_atim;
            if (to_set & FUSE_SET_ATTR_MTIME_NOW)
                tv[1].tv_nsec = UTIME_NOW;
            else if (to_set & FUSE_SET_ATTR_MTIME)
                tv[1] = attr->st_mtim;
            rc = utimensat(AT_FDCWD, n.real, tv, AT_SYMLINK_NOFOLLOW) ? -errno : 0;
        }
        if (!rc)
            jlmfs_changed(FS(), n.rel);
        jlmfs_node_clear(&n);
    }
    free(path);
    struct stat st;
    if (!rc)
        rc = getattr_of(ino, fi, &st);
    if (rc)
        fuse_reply_err(req, -rc);
    else
        fuse_reply_attr(req, &st, 0.0);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
    char *from = NULL, *to = NULL;
    jlmfs_node a = {0}, b = {0};
    int rc = child_path(parent, name, &from);
    if (!rc)
        rc = child_path(newparent, newname, &to);
    if (!rc)
        rc = resolve(from, &a);
    if (!rc)
        rc = resolve_new(to, &b);
    if (!rc && (a.kind != JLMFS_PASS || b.kind != JLMFS_PASS))
        rc = -EROFS;
    if (!rc && renameat2(AT_FDCWD, a.real, AT_FDCWD, b.real, flags))
        rc = -errno;
    if (!rc) {
        if (flags & RENAME_EXCHANGE) {   /* both names stay, each another file now */
            ino_unhash(from);
            ino_unhash(to);
        } else {
            ino_rename(from, to);
        }
        jlmfs_changed(FS(), a.rel);
        jlmfs_changed(FS(), b.rel);
        jlmfs_changed_tree(FS(), a.rel);   /* a folder: the views of the GGUFs it held go now */
    }
    jlmfs_node_clear(&a);
    jlmfs_node_clear(&b);
    free(from);
    free(to);
    fuse_reply_err(req, -rc);
}

/* ---------------------------------------------------------------- extended attributes */
static void reply_xattr(fuse_req_t req, int rc, const char *v, size_t len, size_t size)
{
    if (rc)
        fuse_reply_err(req, -rc);
    else if (!size)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, v, len);
}

#define XA_VIEW "user.jlmfs.view"   /* on a source (x.gguf, a folder x/): its view, "sub/x.jlm" */
static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    jlmfs_node n = {0};
    int rc = ino_node(ino, &n, NULL);
    char *v = NULL;
    size_t len = 0;
    if (!rc && n.kind == JLMFS_PASS && !strcmp(name, XA_VIEW)) {
        /* a source's view, for tools run on it inside the mount (jlm convert
         * MNT/x.gguf can point to MNT/x.jlm instead of converting again) */
        v = jlmfs_view_of(FS(), n.rel);
        len = v ? strlen(v) : 0;
        rc = v ? 0 : -ENODATA;
    } else if (!rc && n.kind == JLMFS_PASS) {
        ssize_t r = lgetxattr(n.real, name, NULL, 0);
        if (r >= 0 && !(v = malloc((size_t)r + 1)))
            rc = -ENOMEM;
        else if (r >= 0 && (r = lgetxattr(n.real, name, v, (size_t)r)) < 0)
            rc = -errno;
        else if (r < 0)
            rc = -errno;
        len = r < 0 ? 0 : (size_t)r;
    } else if (!rc) {
        jlm_err e;
        rc = jlmfs_getxattr(FS(), &n, name, &v, &len, &e);
        rc = rc == JLM_ENOTFOUND ? -ENODATA : errno_of(rc);
    }
    jlmfs_node_clear(&n);
    reply_xattr(req, rc, v, len, size);
    free(v);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    jlmfs_node n = {0};
    int rc = ino_node(ino, &n, NULL);
    char *v = NULL;
    size_t len = 0;
    if (!rc && n.kind == JLMFS_PASS) {
        ssize_t r = llistxattr(n.real, NULL, 0);
        if (r > 0 && !(v = malloc((size_t)r)))
            rc = -ENOMEM;
        else if (r > 0 && (r = llistxattr(n.real, v, (size_t)r)) < 0)
            rc = -errno;
        else if (r < 0)
            rc = -errno;
        len = r < 0 ? 0 : (size_t)r;
    } else if (!rc) {
        jlm_err e;
        rc = errno_of(jlmfs_listxattr(FS(), &n, &v, &len, &e));
    }
    jlmfs_node_clear(&n);
    reply_xattr(req, rc, v, len, size);
    free(v);
}

/* ---------------------------------------------------------------- invalidation */
/* fs/ tells which view paths went stale (jlmfs_opts.invalidate); the kernel
 * is told here, from a thread of its own: an inode's invalidation must not
 * run inside a request on the same inode (a read holds the page the kernel
 * then waits for), and fs/ calls from inside reads. Every inode that path has
 * (the current one and old versions still open) drops its pages: a failed
 * view's open descriptors then get EIO for every page, never cached pages of
 * a version that failed. An inode the kernel already forgot: -ENOENT, nothing
 * to drop. */
typedef struct inval_item { struct inval_item *next; char path[]; } inval_item;
static struct {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    inval_item     *head, *tail;
    pthread_t       thread;
    int             running, stop;
} g_inval = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0, 0};

static void inval_queue(void *ctx, const char *path)
{
    size_t n = strlen(path) + 1;
    inval_item *it = malloc(sizeof *it + n);
    if (!it)
        return;   /* then the pages stay: only for the version they are of (own inode) */
    it->next = NULL;
    memcpy(it->path, path, n);
    pthread_mutex_lock(&g_inval.lock);
    if (!g_inval.running || g_inval.stop) {
        free(it);
    } else {
        if (g_inval.tail)
            g_inval.tail->next = it;
        else
            g_inval.head = it;
        g_inval.tail = it;
        pthread_cond_signal(&g_inval.cond);
    }
    pthread_mutex_unlock(&g_inval.lock);
}

static void *inval_main(void *arg)
{
    pthread_mutex_lock(&g_inval.lock);
    for (;;) {
        while (!g_inval.head && !g_inval.stop)
            pthread_cond_wait(&g_inval.cond, &g_inval.lock);
        inval_item *it = g_inval.head;
        if (!it)
            break;   /* stopping, queue drained */
        g_inval.head = it->next;
        if (!g_inval.head)
            g_inval.tail = NULL;
        int stop = g_inval.stop;
        pthread_mutex_unlock(&g_inval.lock);
        fuse_ino_t inos[64];
        size_t k = stop ? 0 : ino_all_of(it->path, inos, sizeof inos / sizeof *inos);
        for (size_t i = 0; i < k; i++)
            fuse_lowlevel_notify_inval_inode(g_se, inos[i], 0, 0);
        free(it);
        pthread_mutex_lock(&g_inval.lock);
    }
    pthread_mutex_unlock(&g_inval.lock);
    return NULL;
}

static void inval_start(void)
{
    pthread_mutex_lock(&g_inval.lock);
    g_inval.running = !pthread_create(&g_inval.thread, NULL, inval_main, NULL);
    pthread_mutex_unlock(&g_inval.lock);
    if (!g_inval.running)
        logf_(LOG_WARNING, "note: no invalidation thread: a failed view's cached pages stay until evicted");
}

static void inval_stop(void)
{
    pthread_mutex_lock(&g_inval.lock);
    int running = g_inval.running;
    g_inval.stop = 1;
    pthread_cond_signal(&g_inval.cond);
    pthread_mutex_unlock(&g_inval.lock);
    if (running)
        pthread_join(g_inval.thread, NULL);
}

/* ---------------------------------------------------------------- lifecycle */
static int g_started;

/* No name or attribute caching (every reply says 0 s): views appear and
 * vanish with their GGUF (a cached entry would show a removed view for its
 * timeout), and text files change size. The cost is one lookup per path
 * walk; page-ins read an open descriptor and do not walk. Data caching is
 * chosen per open file (keep_cache for view spans only: one inode, one
 * version). Handles hold descriptors, so an unlinked open file needs no
 * hidden rename. Called in the session loop, after daemonizing. */
static void op_init(void *data, struct fuse_conn_info *conn)
{
    jlmfs *fs = data;
    inval_start();
    jlm_err e;
    if (jlmfs_start(fs, &e))
        logf_(LOG_ERR, "%s", e.msg);
    logf_(LOG_NOTICE, "mounted (cache %s)", jlmfs_cache_dir(fs));
    g_started = 1;
}

static void op_destroy(void *data)
{
    jlmfs_close(data);   /* workers joined: nothing queues any more */
    inval_stop();
    logf_(LOG_NOTICE, "unmounted");
}

static const struct fuse_lowlevel_ops ops = {
    .init = op_init, .destroy = op_destroy,
    .lookup = op_lookup, .forget = op_forget, .forget_multi = op_forget_multi,
    .getattr = op_getattr, .setattr = op_setattr, .readlink = op_readlink,
    .opendir = op_opendir, .readdir = op_readdir, .releasedir = op_releasedir, .statfs = op_statfs,
    .open = op_open, .create = op_create, .read = op_read, .write = op_write,
    .flush = op_flush, .release = op_release, .fsync = op_fsync, .fallocate = op_fallocate,
    .mkdir = op_mkdir, .rmdir = op_rmdir, .unlink = op_unlink, .symlink = op_symlink,
    .rename = op_rename, .getxattr = op_getxattr, .listxattr = op_listxattr,
};
/* ---------------------------------------------------------------- one daemon per tree */
/* Undoes mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
    char *o = s;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
            *o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *o++ = *s;
        }
    }
    *o = 0;
}

/* The mount holding path (the longest mount point that is path or above it;
 * the last listed of equal ones, which covers the others): 1 with its mount
 * point and source copied out if it is a jlmfs mount (fstype fuse.jlmfs), else 0. */
static int jlmfs_mount_of(const char *path, char *mp_out, size_t mp_n, char *src_out, size_t src_n)
{
    char *real = realpath(path, NULL);
    FILE *f = real ? fopen("/proc/self/mountinfo", "re") : NULL;
    char line[8192], best_mp[4096] = "", best_src[4096] = "";
    size_t best = 0;
    int is_jlmfs = 0;
    while (f && fgets(line, sizeof line, f)) {
        char mp[4096], fstype[256], src[4096];
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 ||
            sscanf(dash + 3, "%255s %4095s", fstype, src) != 2)
            continue;
        unescape(mp);
        unescape(src);
        size_t n = strlen(mp);
        int above = !strcmp(mp, "/") || (!strncmp(real, mp, n) && (real[n] == 0 || real[n] == '/'));
        if (above && n >= best) {   /* later lines of the same point were mounted over earlier ones */
            best = n;
            is_jlmfs = !strcmp(fstype, "fuse.jlmfs");
            snprintf(best_mp, sizeof best_mp, "%s", mp);
            snprintf(best_src, sizeof best_src, "%s", src);
        }
    }
    if (f)
        fclose(f);
    free(real);
    if (is_jlmfs) {
        snprintf(mp_out, mp_n, "%s", best_mp);
        snprintf(src_out, src_n, "%s", best_src);
    }
    return is_jlmfs;
}

/* 1 (its mount point copied out) if a jlmfs mount has src as its source. */
static int jlmfs_mounted_from(const char *src, char *mp_out, size_t mp_n)
{
    char *real = realpath(src, NULL);
    FILE *f = real ? fopen("/proc/self/mountinfo", "re") : NULL;
    char line[8192];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        char mp[4096], fstype[256], from[4096];
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 ||
            sscanf(dash + 3, "%255s %4095s", fstype, from) != 2 || strcmp(fstype, "fuse.jlmfs"))
            continue;
        unescape(mp);
        unescape(from);
        char *rf = realpath(from, NULL);
        found = rf && !strcmp(rf, real);
        if (found)
            snprintf(mp_out, mp_n, "%s", mp);
        free(rf);
    }
    if (f)
        fclose(f);
    free(real);
    return found;
}

/* A jlmfs over a jlmfs would convert every model a second time into a
 * second cache: SRC inside a jlmfs mount or already the source of one, or MNT
 * on or inside one, is refused naming that mount. 0, or 1 with the line printed. */
static int refuse_stacking(const char *src, const char *mnt)
{
    char mp[4096], from[4096];
    if (jlmfs_mount_of(src, mp, sizeof mp, from, sizeof from)) {
        fprintf(stderr, "jlmfs: source %s is inside the jlmfs mount %s (of %s): mount %s instead\n", src, mp, from,
                from);
        return 1;
    }
    if (jlmfs_mounted_from(src, mp, sizeof mp)) {
        fprintf(stderr, "jlmfs: source %s is already mounted by jlmfs at %s: use that mount\n", src, mp);
        return 1;
    }
    if (mnt && jlmfs_mount_of(mnt, mp, sizeof mp, from, sizeof from)) {
        fprintf(stderr, "jlmfs: mount point %s is %s the jlmfs mount %s (of %s): unmount it first (fusermount3 -u %s)\n",
                mnt, strcmp(mp, mnt) ? "inside" : "already", mp, from, mp);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- options */
typedef struct opts { char *src, *mnt, *cache, *type; unsigned workers; int help, n_nonopt; } opts;

enum { KEY_HELP = 1, KEY_FG };
static const struct fuse_opt opt_spec[] = {
    {"cache=%s", offsetof(opts, cache), 0},
    {"workers=%u", offsetof(opts, workers), 0},
    {"type=%s", offsetof(opts, type), 0},
    FUSE_OPT_KEY("-f", KEY_FG),
    FUSE_OPT_KEY("-d", KEY_FG),
    FUSE_OPT_KEY("debug", KEY_FG),
    FUSE_OPT_KEY("-h", KEY_HELP),
    FUSE_OPT_KEY("--help", KEY_HELP),
    FUSE_OPT_END,
};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *out)
{
    opts *o = data;
    if (key == KEY_HELP) {
        o->help = 1;
        return 0;
    }
    if (key == KEY_FG) {
        g_foreground = 1;   /* the log goes to stderr; FUSE sees the option too */
        return 1;
    }
    if (key == FUSE_OPT_KEY_NONOPT && o->n_nonopt++ == 0) {
        o->src = strdup(arg);   /* SRC; the mount point goes on to FUSE */
        return 0;
    }
    if (key == FUSE_OPT_KEY_NONOPT && o->n_nonopt == 2 && !o->mnt)
        o->mnt = strdup(arg);   /* kept to check it, and passed on */
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))) {
        printf("jlmfs version %s (.jlm format %u)\n", JLM_CLI_VERSION, (unsigned)JLM_VERSION);
        /* the build: what the daemon is made of (it runs no kernels: no SIMD or device line) */
        printf("build: %s %s, libfuse %d.%d (runtime %d), sqlite %s, jansson %s\n",
#if defined(__clang__)
               "clang",
#else
               "gcc",
#endif
               __VERSION__, FUSE_MAJOR_VERSION, FUSE_MINOR_VERSION, fuse_version(), sqlite3_libversion(),
               jansson_version_str());
        return 0;
    }
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts co = {0};
    struct fuse_session *se = NULL;
    struct fuse_loop_config *cfg = NULL;
    jlmfs *fs = NULL;
    opts o = {0};
    char *name = NULL;   /* "SRC on MNT type fuse.jlmfs" in the mount table */
    int rc, mounted = 0, handlers = 0;
    if (fuse_opt_parse(&args, &o, opt_spec, opt_proc)) {
        rc = 2;
        goto out;
    }
    if (o.help) {
        fputs(USAGE, stdout);
        rc = 0;
        goto out;
    }
    if (!o.src || o.n_nonopt != 2) {
        fputs(USAGE, stderr);
        rc = 2;
        goto out;
    }
    if (refuse_stacking(o.src, o.mnt)) {
        rc = 1;
        goto out;
    }
    /* The kernel checks every access against the owner and mode each node
     * shows (SRC's own for passthrough files): without it a root daemon
     * mounted allow_other would read, write and chmod anything for anyone. */
    fuse_opt_add_arg(&args, "-odefault_permissions");
    char *abs_src = realpath(o.src, NULL);   /* absolute: refuse_stacking compares it */
    const char *shown = abs_src ? abs_src : o.src;
    if (!strchr(shown, ',') && asprintf(&name, "-ofsname=%s", shown) >= 0)
        fuse_opt_add_arg(&args, name);
    fuse_opt_add_arg(&args, "-osubtype=jlmfs");
    free(abs_src);
    if (fuse_parse_cmdline(&args, &co) || !co.mountpoint) {
        fputs(USAGE, stderr);
        rc = 2;
        goto out;
    }
    openlog("jlmfs", LOG_PID, LOG_DAEMON);   /* connects at the first line: after daemonizing */
    const char *slow = getenv("JLMFS_TEST_SLOW_MS");
    jlmfs_opts fo = {.src = o.src, .cache = o.cache, .n_workers = o.workers, .type = o.type,
                     .invalidate = inval_queue, .log = log_line,
                     .slow_ms = slow ? (unsigned)strtoul(slow, NULL, 10) : 0};
    jlm_err e;
    if (jlmfs_open(&fo, &fs, &e)) {
        fprintf(stderr, "jlmfs: %s\n", e.msg);
        fs = NULL;
        rc = 1;
        goto out;
    }
    g_fs = fs;
    ino_init_root();
    rc = 1;
    if (!(se = g_se = fuse_session_new(&args, &ops, sizeof ops, fs)))
        goto out;   /* libfuse said why (an unknown option) */
    if (fuse_set_signal_handlers(se))
        goto out;
    handlers = 1;
    if (fuse_session_mount(se, co.mountpoint))
        goto out;
    mounted = 1;
    fuse_daemonize(co.foreground);
    if (co.singlethread) {
        rc = fuse_session_loop(se) ? 1 : 0;
    } else {
        /* libfuse's own default for idle threads is "unlimited"; 10 is the
         * documented one (-o max_idle_threads=N sets it) */
        cfg = fuse_loop_cfg_create();
        if (cfg) {
            fuse_loop_cfg_set_clone_fd(cfg, (unsigned)co.clone_fd);
            fuse_loop_cfg_set_idle_threads(cfg, co.max_idle_threads == UINT_MAX ? 10 : co.max_idle_threads);
            fuse_loop_cfg_set_max_threads(cfg, co.max_threads);
            rc = fuse_session_loop_mt(se, cfg) ? 1 : 0;
        }
    }
out:   /* every exit frees what the options and args hold (LSan in make debug) */
    if (mounted)
        fuse_session_unmount(se);
    if (handlers)
        fuse_remove_signal_handlers(se);
    if (se)
        fuse_session_destroy(se);   /* runs op_destroy if init ran */
    if (fs && !g_started)
        jlmfs_close(fs);   /* never initialised: destroy did not close it */
    ino_free_all();
    if (cfg)
        fuse_loop_cfg_destroy(cfg);
    free(co.mountpoint);
    fuse_opt_free_args(&args);
    free(name); free(o.src); free(o.mnt); free(o.cache); free(o.type);
    return rc;
}
