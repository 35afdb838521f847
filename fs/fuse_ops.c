/* fuse_ops.c - the FUSE layer, on libfuse's lowlevel API (fs/fuse_int.h).
 * Each callback turns its inode into a mount path (fs/inode.h), resolves the
 * path to a node (fs/jlmfs.h), does a plain syscall for a passthrough node
 * (as libfuse's passthrough.c does) or calls fs/ logic for a view node, maps
 * the JLM_E* code to -errno in one place (errno_of) and replies. Views are
 * read-only: every mutation of a view node is refused with EROFS.
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
#include "fs/fuse_int.h"
#include "fs/inode.h"

#include <errno.h>
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

/* One mount per process: the daemon it serves, its session and its inodes
 * (jlmfs_fuse_bind, before the session loop starts). */
static jlmfs *g_fs;
static struct fuse_session *g_se;
static jlmfs_inodes *g_ino;
static int g_started;   /* op_init ran */
static jlmfs *FS(void) { return g_fs; }

int jlmfs_fuse_bind(jlmfs *fs, struct fuse_session *se)
{
    g_fs = fs;
    g_se = se;
    return (g_ino = jlmfs_ino_new()) ? 0 : -1;
}

void jlmfs_fuse_unbind(void)
{
    jlmfs_ino_free(g_ino);
    g_ino = NULL;
}

int jlmfs_fuse_started(void) { return __atomic_load_n(&g_started, __ATOMIC_RELAXED); }

/* ---------------------------------------------------------------- inode versions */
/* The version of a resolved node: a view node's view serial (top bit set),
 * else the passthrough file's own identity. */
static uint64_t ino_version(const jlmfs_node *n, const struct stat *st)
{
    if (n->kind != JLMFS_PASS)
        return jlmfs_node_version(n) | (1ull << 63);
    return ((uint64_t)st->st_ino ^ ((uint64_t)st->st_dev << 40)) & ~(1ull << 63);
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
    int rc = jlmfs_ino_path(g_ino, ino, &path, &ver, &cur);
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
    if (!rc && !(e->ino = jlmfs_ino_link(g_ino, path, ino_version(&n, &e->attr))))
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
        jlmfs_ino_forget(g_ino, e->ino, 1);
}

/* ---------------------------------------------------------------- attributes, listings */
static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    char *path;
    struct fuse_entry_param e;
    int rc = jlmfs_ino_child_path(g_ino, parent, name, &path);
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
    jlmfs_ino_forget(g_ino, ino, nlookup);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    for (size_t i = 0; i < count; i++)
        jlmfs_ino_forget(g_ino, forgets[i].ino, forgets[i].nlookup);
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
    int rc = jlmfs_ino_path(g_ino, ino, &path, &ver, NULL);
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
    int rc = jlmfs_ino_child_path(g_ino, parent, name, &path);
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
        jlmfs_ino_forget(g_ino, e.ino, 1);
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
                jlmfs_dlogf(LOG_ERR, "%s", e.msg);
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
    int rc = jlmfs_ino_child_path(g_ino, parent, name, &path);
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
    int rc = jlmfs_ino_child_path(g_ino, parent, name, &path);
    if (!rc && !(rc = pass_node(path, &n))) {
        rc = (is_dir ? rmdir(n.real) : unlink(n.real)) ? -errno : 0;
        if (!rc) {
            jlmfs_ino_unhash(g_ino, path);
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
    int rc = jlmfs_ino_path(g_ino, ino, &path, NULL, NULL);
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
    int rc = jlmfs_ino_child_path(g_ino, parent, name, &from);
    if (!rc)
        rc = jlmfs_ino_child_path(g_ino, newparent, newname, &to);
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
            jlmfs_ino_unhash(g_ino, from);
            jlmfs_ino_unhash(g_ino, to);
        } else {
            jlmfs_ino_rename(g_ino, from, to);
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

void jlmfs_fuse_inval_queue(void *ctx, const char *path)
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
        uint64_t inos[64];
        size_t k = stop ? 0 : jlmfs_ino_all_of(g_ino, it->path, inos, sizeof inos / sizeof *inos);
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
        jlmfs_dlogf(LOG_WARNING, "note: no invalidation thread: a failed view's cached pages stay until evicted");
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
        jlmfs_dlogf(LOG_ERR, "%s", e.msg);
    jlmfs_dlogf(LOG_NOTICE, "mounted (cache %s)", jlmfs_cache_dir(fs));
    __atomic_store_n(&g_started, 1, __ATOMIC_RELAXED);
}

static void op_destroy(void *data)
{
    jlmfs_close(data);   /* workers joined: nothing queues any more */
    inval_stop();
    jlmfs_dlogf(LOG_NOTICE, "unmounted");
}

const struct fuse_lowlevel_ops jlmfs_fuse_ops = {
    .init = op_init, .destroy = op_destroy,
    .lookup = op_lookup, .forget = op_forget, .forget_multi = op_forget_multi,
    .getattr = op_getattr, .setattr = op_setattr, .readlink = op_readlink,
    .opendir = op_opendir, .readdir = op_readdir, .releasedir = op_releasedir, .statfs = op_statfs,
    .open = op_open, .create = op_create, .read = op_read, .write = op_write,
    .flush = op_flush, .release = op_release, .fsync = op_fsync, .fallocate = op_fallocate,
    .mkdir = op_mkdir, .rmdir = op_rmdir, .unlink = op_unlink, .symlink = op_symlink,
    .rename = op_rename, .getxattr = op_getxattr, .listxattr = op_listxattr,
};
