/* jlmfs_main.c - `jlmfs SRC MOUNTPOINT [-f] [-o cache=DIR,workers=N,...]`: the
 * FUSE layer. Each callback resolves its path to a node (fs/jlmfs.h), does a
 * plain syscall for a passthrough node (as libfuse's passthrough.c does) or
 * calls fs/ logic for a view node, maps the JLM_E* code to -errno in one
 * place (errno_of) and returns. Views are read-only: every mutation of a
 * view node is refused with EROFS. */
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <jansson.h>
#include <sqlite3.h>

#include "fs/jlmfs.h"
#include "cli/opts.h"
#include "format/jlm_format.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <fcntl.h>
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

static jlmfs *FS(void) { return fuse_get_context()->private_data; }

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

/* An open file: the node it resolved to, plus its fd (passthrough) or the
 * text snapshot taken at open (status, stats, ...). */
typedef struct handle {
    jlmfs_node node;
    int        fd;        /* PASS: open descriptor; else -1 */
    int        writing;   /* PASS opened for writing: release re-syncs the view */
    char      *text;      /* TEXT: snapshot */
    size_t     text_len;
} handle;

static handle *H(struct fuse_file_info *fi) { return (handle *)(uintptr_t)fi->fh; }

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

#define RESOLVE_WITH(fn, path, n)         \
    jlmfs_node n = {0};                   \
    int rc_ = fn(path, &n);               \
    if (rc_)                              \
        return rc_
#define RESOLVE(path, n) RESOLVE_WITH(resolve, path, n)

/* ---------------------------------------------------------------- attributes, listings */
static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    if (fi && H(fi)->fd >= 0)
        return fstat(H(fi)->fd, st) ? -errno : 0;
    if (fi && H(fi)->node.kind != JLMFS_PASS) {   /* an open view file: its view, even once its GGUF is gone */
        jlm_err e;
        return errno_of(jlmfs_node_stat(FS(), &H(fi)->node, st, &e));
    }
    RESOLVE(path, n);
    jlm_err e;
    int rc = n.kind == JLMFS_PASS ? (lstat(n.real, st) ? -errno : 0) : errno_of(jlmfs_node_stat(FS(), &n, st, &e));
    jlmfs_node_clear(&n);
    return rc;
}

typedef struct fill_ctx { void *buf; fuse_fill_dir_t filler; } fill_ctx;

static int fill_one(void *ctx, const char *name, const struct stat *st)
{
    fill_ctx *f = ctx;
    return f->filler(f->buf, name, st, 0, 0);
}

static int op_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    RESOLVE(path, n);
    fill_ctx f = {buf, filler};
    jlm_err e;
    int rc = 0;
    if (n.kind != JLMFS_PASS) {   /* a PASS listing carries the real . and .. */
        filler(buf, ".", NULL, 0, 0);
        filler(buf, "..", NULL, 0, 0);
    }
    rc = errno_of(jlmfs_list(FS(), &n, fill_one, &f, &e));
    jlmfs_node_clear(&n);
    return rc;
}

static int op_readlink(const char *path, char *buf, size_t size)
{
    RESOLVE(path, n);
    ssize_t r = n.kind == JLMFS_PASS ? readlink(n.real, buf, size - 1) : (errno = EINVAL, -1);
    jlmfs_node_clear(&n);
    if (r < 0)
        return -errno;
    buf[r] = 0;
    return 0;
}

static int op_statfs(const char *path, struct statvfs *st)
{
    RESOLVE(path, n);
    int rc = statvfs(n.real ? n.real : jlmfs_cache_dir(FS()), st) ? -errno : 0;
    jlmfs_node_clear(&n);
    return rc;
}

/* ---------------------------------------------------------------- privilege (docs/security.md) */
/* setuid/setgid bits are never set through the mount: a user able to write
 * into SRC must not mint a privileged program there (the daemon is root). */
#define PRIV_BITS (S_ISUID | S_ISGID)

/* A new name made by the (root) daemon goes to the calling user: the caller's
 * uid, and the caller's gid unless the parent directory is setgid (then its
 * group, as the kernel does). No-op when the daemon is not root: it cannot
 * give files away, and every file is then its own user's anyway. */
static int give_to_caller(const char *real, int fd)
{
    if (geteuid() != 0)
        return 0;
    const struct fuse_context *cx = fuse_get_context();
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
static int open_node(const char *path, struct fuse_file_info *fi, int create, mode_t mode)
{
    handle *h = calloc(1, sizeof *h);
    if (!h)
        return -ENOMEM;
    h->fd = -1;
    int rc = create ? resolve_new(path, &h->node) : resolve(path, &h->node);
    if (!rc && h->node.kind == JLMFS_PASS) {
        h->fd = create ? jlmfs_pass_open(FS(), h->node.rel, fi->flags | O_CREAT | O_EXCL, mode & ~PRIV_BITS)
                       : jlmfs_pass_open(FS(), h->node.rel, fi->flags, 0);
        rc = h->fd < 0 ? -errno : 0;
        if (!rc && create && (rc = give_to_caller(h->node.real, h->fd)))
            unlink(h->node.real);   /* never leave a root-owned file behind */
        h->writing = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
        if (!rc && h->writing)
            jlmfs_write_begin(FS(), h->node.rel);   /* its view goes until release */
    } else if (!rc) {
        jlm_err e;
        if (create || (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
            rc = -EROFS;
        /* view spans: page-ins stay cached while the view's attributes (the
         * GGUF's mtime, the span's size) stay the same: auto_cache sets
         * keep_cache then, and drops the kernel's pages when a rewritten
         * source has made a new view under the same name */
        else if (h->node.kind == JLMFS_TEXT) {
            fi->direct_io = 1;    /* status and stats change: every read asks the daemon */
            rc = errno_of(jlmfs_text(FS(), &h->node, &h->text, &h->text_len, &e));
        } else if (h->node.kind == JLMFS_DIR)
            rc = -EISDIR;
    }
    if (rc) {
        if (h->fd >= 0)
            close(h->fd);
        jlmfs_node_clear(&h->node);
        free(h);
        return rc;
    }
    fi->fh = (uint64_t)(uintptr_t)h;
    return 0;
}

static int op_open(const char *path, struct fuse_file_info *fi) { return open_node(path, fi, 0, 0); }
static int op_create(const char *path, mode_t mode, struct fuse_file_info *fi) { return open_node(path, fi, 1, mode); }

static int op_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    handle *h = H(fi);
    jlm_err e;
    size_t got = 0;
    switch (h->node.kind) {
    case JLMFS_PASS: {
        ssize_t r = pread(h->fd, buf, size, off);
        return r < 0 ? -errno : (int)r;
    }
    case JLMFS_SPAN: {
        int rc = errno_of(jlmfs_read(FS(), &h->node, buf, size, (uint64_t)off, &got, &e));
        if (rc)
            logf_(LOG_ERR, "%s", e.msg);
        return rc ? rc : (int)got;
    }
    case JLMFS_TEXT:
        if ((size_t)off >= h->text_len)
            return 0;
        got = h->text_len - (size_t)off < size ? h->text_len - (size_t)off : size;
        memcpy(buf, h->text + off, got);
        return (int)got;
    default:
        return 0;
    }
}

static int op_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    handle *h = H(fi);
    if (h->fd < 0)
        return -EROFS;
    ssize_t r = pwrite(h->fd, buf, size, off);
    return r < 0 ? -errno : (int)r;
}

static int op_release(const char *path, struct fuse_file_info *fi)
{
    handle *h = H(fi);
    if (h->fd >= 0)
        close(h->fd);
    if (h->writing)
        jlmfs_write_end(FS(), h->node.rel);   /* a GGUF closed after writing gets its view */
    jlmfs_node_clear(&h->node);
    free(h->text);
    free(h);
    return 0;
}

/* close(2) waits for flush, not for release: ending the write here makes
 * `cp x.gguf MNT/ && ls MNT/x.jlm` see the view. A later write through a
 * dup'd descriptor changes the file's identity, which replaces the view. */
static int op_flush(const char *path, struct fuse_file_info *fi)
{
    handle *h = H(fi);
    if (h->writing) {
        h->writing = 0;
        jlmfs_write_end(FS(), h->node.rel);
    }
    return 0;
}

/* A writer sizing its output (jlm convert -o MNT/x.jlm: ftruncate, then
 * posix_fallocate, whose glibc fallback fails on a write-only descriptor with
 * EBADF when the filesystem has no fallocate): on the passthrough descriptor. */
static int op_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
    if (!fi || H(fi)->fd < 0)
        return -EROFS;   /* a view file: read-only */
    return fallocate(H(fi)->fd, mode, off, len) ? -errno : 0;
}

static int op_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    handle *h = H(fi);
    if (h->fd < 0)
        return 0;
    return (datasync ? fdatasync(h->fd) : fsync(h->fd)) ? -errno : 0;
}

/* ---------------------------------------------------------------- mutations (passthrough only) */
/* Runs a syscall on a passthrough path and re-syncs the view of that path. */
#define PASS_OP(path, call)                                   \
    do {                                                      \
        RESOLVE_WITH(resolve_new, path, n);                   \
        int rc = n.kind != JLMFS_PASS ? -EROFS : ((call) ? -errno : 0); \
        if (n.kind == JLMFS_PASS && !rc)                      \
            jlmfs_changed(FS(), n.rel);                       \
        jlmfs_node_clear(&n);                                 \
        return rc;                                            \
    } while (0)

/* mkdir/symlink, then the new name to the caller (removed if that fails). */
static int made(int rc, const char *real, int is_dir)
{
    if (rc || !(rc = give_to_caller(real, -1)))
        return rc;
    (void)(is_dir ? rmdir(real) : unlink(real));
    errno = -rc;
    return -1;
}

static int op_mkdir(const char *path, mode_t mode) { PASS_OP(path, made(mkdir(n.real, mode & ~PRIV_BITS), n.real, 1)); }
static int op_rmdir(const char *path) { PASS_OP(path, rmdir(n.real)); }
static int op_unlink(const char *path) { PASS_OP(path, unlink(n.real)); }
static int op_symlink(const char *target, const char *path) { PASS_OP(path, made(symlink(target, n.real), n.real, 0)); }
static int op_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    if (mode & PRIV_BITS)
        return -EPERM;
    PASS_OP(path, chmod(n.real, mode));
}
static int op_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
    PASS_OP(path, lchown(n.real, uid, gid));
}
static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    if (fi && H(fi)->fd >= 0)
        return ftruncate(H(fi)->fd, size) ? -errno : 0;
    PASS_OP(path, truncate(n.real, size));
}
static int op_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
    PASS_OP(path, utimensat(AT_FDCWD, n.real, tv, AT_SYMLINK_NOFOLLOW));
}

static int op_rename(const char *from, const char *to, unsigned int flags)
{
    RESOLVE(from, a);
    jlmfs_node b = {0};
    int rc = resolve_new(to, &b);
    if (!rc && (a.kind != JLMFS_PASS || b.kind != JLMFS_PASS))
        rc = -EROFS;
    if (!rc && renameat2(AT_FDCWD, a.real, AT_FDCWD, b.real, flags))
        rc = -errno;
    if (!rc) {
        jlmfs_changed(FS(), a.rel);
        jlmfs_changed(FS(), b.rel);
        jlmfs_changed_tree(FS(), a.rel);   /* a folder: the views of the GGUFs it held go now */
    }
    jlmfs_node_clear(&a);
    jlmfs_node_clear(&b);
    return rc;
}

/* ---------------------------------------------------------------- extended attributes */
#define XA_VIEW "user.jlmfs.view"   /* on a source (x.gguf, a folder x/): its view, "sub/x.jlm" */
static int op_getxattr(const char *path, const char *name, char *value, size_t size)
{
    RESOLVE(path, n);
    int rc;
    if (n.kind == JLMFS_PASS && !strcmp(name, XA_VIEW)) {
        /* a source's view, for tools run on it inside the mount (jlm convert
         * MNT/x.gguf can point to MNT/x.jlm instead of converting again) */
        char *key = jlmfs_view_of(FS(), n.rel);
        size_t len = key ? strlen(key) : 0;
        rc = !key ? -ENODATA : !size ? (int)len : size < len ? -ERANGE : (memcpy(value, key, len), (int)len);
        free(key);
    } else if (n.kind == JLMFS_PASS) {
        ssize_t r = lgetxattr(n.real, name, value, size);
        rc = r < 0 ? -errno : (int)r;
    } else {
        char *v;
        size_t len;
        jlm_err e;
        rc = jlmfs_getxattr(FS(), &n, name, &v, &len, &e);
        rc = rc == JLM_ENOTFOUND ? -ENODATA : errno_of(rc);
        if (!rc) {
            rc = !size ? (int)len : size < len ? -ERANGE : (memcpy(value, v, len), (int)len);
            free(v);
        }
    }
    jlmfs_node_clear(&n);
    return rc;
}

static int op_listxattr(const char *path, char *list, size_t size)
{
    RESOLVE(path, n);
    int rc;
    if (n.kind == JLMFS_PASS) {
        ssize_t r = llistxattr(n.real, list, size);
        rc = r < 0 ? -errno : (int)r;
    } else {
        char *v;
        size_t len;
        jlm_err e;
        rc = errno_of(jlmfs_listxattr(FS(), &n, &v, &len, &e));
        if (!rc) {
            rc = !size ? (int)len : size < len ? -ERANGE : (memcpy(list, v, len), (int)len);
            free(v);
        }
    }
    jlmfs_node_clear(&n);
    return rc;
}

/* ---------------------------------------------------------------- invalidation */
/* fs/ tells which view paths went stale (jlmfs_opts.invalidate); the kernel
 * is told here, from a thread of its own: fuse_invalidate_path must not run
 * inside a request on the same inode (a read holds the page the kernel then
 * waits for), and fs/ calls from inside reads. Paths the kernel never looked
 * up are not in libfuse's table: -ENOENT, nothing to drop. */
typedef struct inval_item { struct inval_item *next; char path[]; } inval_item;
static struct {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    inval_item     *head, *tail;
    struct fuse    *fuse;
    pthread_t       thread;
    int             running, stop;
} g_inval = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, NULL, 0, 0, 0};

static void inval_queue(void *ctx, const char *path)
{
    size_t n = strlen(path) + 1;
    inval_item *it = malloc(sizeof *it + n);
    if (!it)
        return;   /* then only auto_cache's check at the next open protects */
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
        if (!stop)
            fuse_invalidate_path(g_inval.fuse, it->path);
        free(it);
        pthread_mutex_lock(&g_inval.lock);
    }
    pthread_mutex_unlock(&g_inval.lock);
    return NULL;
}

static void inval_start(struct fuse *f)
{
    pthread_mutex_lock(&g_inval.lock);
    g_inval.fuse = f;
    g_inval.running = !pthread_create(&g_inval.thread, NULL, inval_main, NULL);
    pthread_mutex_unlock(&g_inval.lock);
    if (!g_inval.running)
        logf_(LOG_WARNING, "note: no invalidation thread: stale pages wait for the next open");
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

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    /* No name or attribute caching: views appear and vanish with their GGUF
     * (a cached entry would show a removed view for its timeout), and text
     * files change size. The cost is one lookup per path walk; page-ins
     * read an open descriptor and do not walk. Data caching is chosen per
     * open file (keep_cache for view spans only). hard_remove: handles hold
     * descriptors, so an unlinked open file needs no .fuse_hidden rename. */
    cfg->entry_timeout = 0.0;
    cfg->attr_timeout = 0.0;
    cfg->negative_timeout = 0.0;
    cfg->hard_remove = 1;
    cfg->kernel_cache = 0;
    cfg->auto_cache = 1;
    jlmfs *fs = fuse_get_context()->private_data;
    inval_start(fuse_get_context()->fuse);
    jlm_err e;
    if (jlmfs_start(fs, &e))
        logf_(LOG_ERR, "%s", e.msg);
    logf_(LOG_NOTICE, "mounted (cache %s)", jlmfs_cache_dir(fs));
    g_started = 1;
    return fs;
}

static void op_destroy(void *data)
{
    jlmfs_close(data);   /* workers joined: nothing queues any more */
    inval_stop();
    logf_(LOG_NOTICE, "unmounted");
}

static const struct fuse_operations ops = {
    .init = op_init, .destroy = op_destroy,
    .getattr = op_getattr, .readdir = op_readdir, .readlink = op_readlink, .statfs = op_statfs,
    .open = op_open, .create = op_create, .read = op_read, .write = op_write,
    .flush = op_flush, .release = op_release, .fsync = op_fsync, .fallocate = op_fallocate,
    .mkdir = op_mkdir, .rmdir = op_rmdir, .unlink = op_unlink, .symlink = op_symlink,
    .rename = op_rename, .chmod = op_chmod, .chown = op_chown, .truncate = op_truncate,
    .utimens = op_utimens, .getxattr = op_getxattr, .listxattr = op_listxattr,
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
    opts o = {0};
    char *name = NULL;   /* "SRC on MNT type fuse.jlmfs" in the mount table */
    int rc;
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
    openlog("jlmfs", LOG_PID, LOG_DAEMON);   /* connects at the first line: after FUSE daemonizes */
    const char *slow = getenv("JLMFS_TEST_SLOW_MS");
    jlmfs_opts fo = {.src = o.src, .cache = o.cache, .n_workers = o.workers, .type = o.type,
                     .invalidate = inval_queue, .log = log_line,
                     .slow_ms = slow ? (unsigned)strtoul(slow, NULL, 10) : 0};
    jlmfs *fs;
    jlm_err e;
    if (jlmfs_open(&fo, &fs, &e)) {
        fprintf(stderr, "jlmfs: %s\n", e.msg);
        rc = 1;
        goto out;
    }
    /* libfuse 3.14's fuse_main passes max_idle_threads = -1 ("unlimited")
     * and warns about it; 10 is the documented default. Inserted first so a
     * user's -o max_idle_threads wins. */
    fuse_opt_insert_arg(&args, 1, "-omax_idle_threads=10");
    /* The kernel checks every access against the owner and mode each node
     * shows (SRC's own for passthrough files): without it a root daemon
     * mounted allow_other would read, write and chmod anything for anyone. */
    fuse_opt_add_arg(&args, "-odefault_permissions");
    char *abs_src = realpath(o.src, NULL);   /* absolute: refuse_stacking compares it */
    const char *shown = abs_src ? abs_src : o.src;
    if (!strchr(shown, ',') && asprintf(&name, "-ofsname=%s,subtype=jlmfs", shown) >= 0)
        fuse_opt_add_arg(&args, name);
    free(abs_src);
    rc = fuse_main(args.argc, args.argv, &ops, fs);
    if (!g_started)
        jlmfs_close(fs);   /* fuse_main failed before init: destroy will not run */
out:   /* every exit frees what the options and args hold (LSan in make debug) */
    fuse_opt_free_args(&args);
    free(name); free(o.src); free(o.mnt); free(o.cache); free(o.type);
    return rc;
}
