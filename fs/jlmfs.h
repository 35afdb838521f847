/* jlmfs.h - the jlmfs daemon's logic: a source folder of GGUFs seen as model
 * views (foo.gguf -> foo.jlm/), their containers cached on disk, converted in
 * background threads and packed on demand where a read gets ahead of them.
 *
 * Owns: the view table, the cache folder (keying, validation, .part files),
 * the conversion workers, the bytes and texts of every view file, and the
 * daemon's connection to the residency database. Knows nothing of FUSE: the
 * FUSE layer (fs/fuse_ops.c) resolves a path to a jlmfs_node, calls these
 * functions and maps their JLM_E* codes to -errno in one place (errno_of).
 * Passthrough files are plain syscalls in that layer; this module only tells
 * it where SRC is (jlmfs_node.real) and is told when a source changes.
 *
 * Invariants:
 *  (1) A view exists for SRC/x.gguf iff that is a regular file no handle of
 *      the mount has open for writing; its identity (dev, ino, size, mtime)
 *      is the one it was planned from; a change of identity replaces it.
 *      The same for a Hugging Face folder SRC/x/ (view x.jlm/) once it is
 *      complete and none of its files is open for writing (fs/hfdir.c); x.gguf
 *      wins the name x.jlm when both exist.
 *  (2) The bytes a view serves for model.jlm at [o, o+n) are those
 *      jlm_conv_read_span gives for the same span: from the cache file where
 *      its unit is marked done, else packed on demand. A unit is marked done
 *      only after its bytes were written to the cache file.
 *  (3) A finished cache entry CACHE/<key>.jlm exists only after every unit
 *      was written, the file re-opened with jlm_fmt_open and its first
 *      DenseOff bytes matched the plan; unfinished ones are <key>.jlm.part and
 *      are removed at start, at shutdown and when the view goes.
 *  (4) A view in state ERROR serves only `status`.
 *
 * Thread safety: every function may be called from any FUSE thread. Lock
 * order: jlmfs.lock (table, writers, queue) before view.lock (state, unit
 * bitmap) ; the database has its own lock, taken with neither held. Packing,
 * planning and file I/O run with no lock held.
 * Memory: nodes hold a view reference; release with jlmfs_node_clear.
 */
#ifndef JLMFS_H
#define JLMFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "base/io.h"
#include "base/jlm_err.h"

typedef struct jlmfs jlmfs;
typedef struct jlmfs_view jlmfs_view;

typedef struct jlmfs_opts {
    const char *src;        /* source folder */
    const char *cache;      /* cache folder; NULL: SRC/.jlmfs-cache */
    unsigned    n_workers;  /* background conversion threads; 0: 1 */
    unsigned    slow_ms;    /* test hook (JLMFS_TEST_SLOW_MS): sleep before each unit */
    const jlm_io *io;       /* seam for the cache files' reads and writes; NULL: POSIX */
    const char *type;       /* -o type=T: quantize at conversion (jlm_conv_open_full); NULL or "keep": as stored */
    /* Told every mount path ("/sub/foo.jlm/blocks/3") whose bytes or
     * attributes the kernel may hold from a view that was just dropped,
     * replaced or failed, so it forgets them (the FUSE layer queues them and
     * drops every inode of the path: fuse_lowlevel_notify_inval_inode).
     * Called from any thread, with no lock of this module held; must not
     * block on a FUSE request. NULL: nobody to tell. */
    void (*invalidate)(void *ctx, const char *path);
    void *invalidate_ctx;
    /* The daemon's log (fs/log.c: stderr with -f, else syslog): one
     * line per event, without prefix or newline; prio is syslog's
     * (JLMFS_LOG_*). Events: a view planned (converting or ready from the
     * cache), ready after converting, failed, dropped; database notes. Called
     * from any thread with no lock of this module held. NULL: warnings and
     * notices (the database's notes) to stderr, the rest dropped (tests that
     * open the module in process; statuses carry the errors). */
    void (*log)(void *ctx, int prio, const char *line);
    void *log_ctx;
    /* -o shared: the cache folder is shared by daemons of many hosts
     * (fs/shared.c, docs/scale-out.md): entries keyed by content, one
     * converter per entry by its lock, no entry removed but by
     * `jlm cache prune`, no folder lock, the database never in it. */
    int         shared;
    /* -o db=PATH: the residency database; NULL: CACHE/jlmfs.db, or in
     * shared mode /var/lib/jlmfs/<name>.db (root) or
     * $XDG_STATE_HOME/jlmfs/<name>.db (else ~/.local/state/jlmfs/). */
    const char *db;
} jlmfs_opts;

/* syslog(3)'s priorities, for jlmfs_opts.log (values equal LOG_ERR ...). */
enum { JLMFS_LOG_ERR = 3, JLMFS_LOG_WARNING = 4, JLMFS_LOG_NOTICE = 5, JLMFS_LOG_INFO = 6 };

/* Checks SRC, creates (0700) and checks the cache folder (refused, JLM_EINVAL
 * naming it, if another user owns it or its group or others may write it;
 * docs/security.md section 12), locks it (one daemon per cache), removes
 * leftover .part files and stale entries (shared mode: no lock, and only the
 * .part files of this host's previous daemon go; a db= inside the cache is
 * refused), and plans a view for every
 * GGUF under SRC. Starts no thread (call jlmfs_start after daemonizing).
 * JLM_EIO / JLM_EINVAL naming the folder; *out untouched on error. */
int  jlmfs_open(const jlmfs_opts *o, jlmfs **out, jlm_err *err);
/* Opens the residency database (a failure is noted on stderr; stats then say
 * so) and starts the workers. JLM_EIO if a thread cannot start. */
int  jlmfs_start(jlmfs *fs, jlm_err *err);
/* Stops workers (a unit in progress finishes), removes unfinished .part
 * files, flushes and closes the database, frees everything. Accepts NULL. */
void jlmfs_close(jlmfs *fs);

const char *jlmfs_cache_dir(const jlmfs *fs);
/* Opens SRC/rel for a passthrough node without following any symlink or
 * leaving SRC (a component swapped for a link between the kernel's lookup and
 * the open is refused: ELOOP). rel "" is SRC itself. -1 with errno set. */
int jlmfs_pass_open(const jlmfs *fs, const char *rel, int flags, mode_t mode);
const char *jlmfs_db_path(const jlmfs *fs);

/* ---------------------------------------------------------------- nodes */
enum jlmfs_kind {
    JLMFS_PASS = 0,     /* a path of SRC: node.real */
    JLMFS_DIR,          /* a view dir or one of its sub-folders */
    JLMFS_SPAN,         /* model.jlm, dense, blocks/N, vision/N, experts/B.E */
    JLMFS_TEXT,         /* status, config.json, tensors, stats, layout.html */
    JLMFS_EMPTY,        /* an entry of resident/ (an empty file) */
};
enum jlmfs_what {       /* which dir / text */
    JLMFS_W_VIEW = 1, JLMFS_W_BLOCKS, JLMFS_W_VISION, JLMFS_W_EXPERTS, JLMFS_W_RESIDENT,
    JLMFS_W_STATUS, JLMFS_W_CONFIG, JLMFS_W_TENSORS, JLMFS_W_STATS, JLMFS_W_LAYOUT,
};

typedef struct jlmfs_node {
    int         kind;       /* enum jlmfs_kind */
    int         what;       /* enum jlmfs_what for DIR and TEXT */
    jlmfs_view *view;       /* reference held; NULL for PASS */
    char       *real;       /* PASS: SRC path (malloc'd) */
    char       *rel;        /* PASS: path relative to SRC, no leading '/' ("" = root) */
    uint64_t    off, len;   /* SPAN: bytes [off, off+len) of model.jlm */
} jlmfs_node;

/* Resolves a mount path ("/", "/a/foo.jlm/blocks/3"). Syncs the view it
 * names with its source first (invariant 1). JLM_ENOTFOUND for a hidden
 * path (the cache folder) or an absent view file; a PASS node is returned
 * for any other path, existing or not. *out untouched on error. */
int  jlmfs_resolve(jlmfs *fs, const char *path, jlmfs_node *out, jlm_err *err);
void jlmfs_node_clear(jlmfs_node *n);
/* Which version of its path a view node is: the serial of its view, never
 * the same for two views in one daemon (a source replaced under the same
 * name gives a new one); 0 for PASS. The FUSE layer gives each version its
 * own inode, so the kernel never shares one page cache between two versions. */
uint64_t jlmfs_node_version(const jlmfs_node *n);   /* accepts a zeroed node */

/* Attributes of a view node (read-only, the view dir's owner and times).
 * JLM_ENOTFOUND if the view went away. Cannot be called on PASS. */
int  jlmfs_node_stat(jlmfs *fs, const jlmfs_node *n, struct stat *st, jlm_err *err);

/* Lists a directory: a view dir, a sub-folder, or a PASS folder (whose
 * listing hides the cache and adds x.jlm for every x.gguf with a view).
 * fill returns nonzero to stop. JLM_ENOTFOUND / JLM_EIO. */
typedef int (*jlmfs_fill_fn)(void *ctx, const char *name, const struct stat *st);
int  jlmfs_list(jlmfs *fs, const jlmfs_node *n, jlmfs_fill_fn fill, void *ctx, jlm_err *err);

/* Reads [off, off+size) of a SPAN node, clamped to its length: *got bytes
 * (0 at EOF). Records the read per page in the database (tier DISK or
 * CONVERT). JLM_EIO if the view failed or the cache file cannot be read;
 * packing errors as jlm_conv_read_span. */
int  jlmfs_read(jlmfs *fs, const jlmfs_node *n, void *buf, size_t size, uint64_t off,
                size_t *got, jlm_err *err);

/* The current text of a TEXT node (a snapshot; *out malloc'd, NUL-terminated,
 * *len without the NUL). JLM_ENOMEM; database errors for stats. */
int  jlmfs_text(jlmfs *fs, const jlmfs_node *n, char **out, size_t *len, jlm_err *err);

/* Extended attributes of view nodes: user.jlmfs.db and user.jlmfs.model.
 * *val malloc'd. JLM_ENOTFOUND for another name. list: NUL-separated names. */
int  jlmfs_getxattr(jlmfs *fs, const jlmfs_node *n, const char *name, char **val, size_t *len,
                    jlm_err *err);
int  jlmfs_listxattr(jlmfs *fs, const jlmfs_node *n, char **names, size_t *len, jlm_err *err);
/* The view path ("sub/x.jlm", malloc'd) of the source SRC/rel (a GGUF or a
 * Hugging Face folder) if it has one now, else NULL. Syncs it first. */
char *jlmfs_view_of(jlmfs *fs, const char *rel);

/* ---------------------------------------------------------------- source events */
/* A handle opening SRC/rel for writing began / ended (end re-syncs the view:
 * a GGUF closed after writing gets its view). Cannot fail. */
void jlmfs_write_begin(jlmfs *fs, const char *rel);
void jlmfs_write_end(jlmfs *fs, const char *rel);
/* SRC/rel changed through the mount (unlink, rename, truncate, utimens):
 * re-sync its view. Cannot fail (a planning failure is the view's status). */
void jlmfs_changed(jlmfs *fs, const char *rel);
/* The folder SRC/rel was renamed or removed through the mount: every view
 * below it is re-synced (so dropped, its entry removed, the kernel told),
 * not left until the old path is looked up again. Cannot fail. */
void jlmfs_changed_tree(jlmfs *fs, const char *rel);

/* ---------------------------------------------------------------- checks */
/* Verifies the table's and every view's invariants (tests, debug builds).
 * JLM_EINVAL naming the first broken one. */
int  jlmfs_check(jlmfs *fs, jlm_err *err);

#endif
