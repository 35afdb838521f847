/* view_int.h - one view (fs/view.c: plan, units, conversion, reads, texts)
 * and the helpers below it (guard.c, hfdir.c, mmproj.c, status.c), as the
 * daemon's table (fs/jlmfs.c, fs/nodes.c) uses them. Not a public contract:
 * see jlmfs.h.
 *
 * The view knows nothing of the daemon above it: what it needs from it (the
 * folders, the conversion type, the I/O seam, the stop flag) and whom it
 * reports to (the log, the residency database, the kernel's caches) come in
 * a jlmfs_view_env it is handed at jlmfs_view_create, which outlives it. */
#ifndef JLMFS_VIEW_INT_H
#define JLMFS_VIEW_INT_H

#include "fs/jlmfs.h"
#include "converter/convert.h"
#include "base/tier.h"

#include <pthread.h>
#include <sys/types.h>

enum jlmfs_state { JLMFS_CONVERTING = 1, JLMFS_READY = 2, JLMFS_ERROR = 3 };

/* What a unit of the container is, for residency records. */
enum jlmfs_arr { JLMFS_A_META = 0, JLMFS_A_BLOCKS, JLMFS_A_VISION, JLMFS_A_EXPERTS };

typedef struct jlmfs_ident {
    dev_t dev; ino_t ino; off_t size; int64_t mtime_s; long mtime_ns;
    /* the paired vision projector (mmproj.c), all 0 without one */
    ino_t mm_ino; off_t mm_size; int64_t mm_mtime_s; long mm_mtime_ns;
    /* a Hugging Face folder (hfdir.c): nonzero hash of its files; dev, ino
     * are the folder's, size the sum, mtime the latest. 0 for a GGUF. */
    uint64_t hf_hash;
} jlmfs_ident;

typedef struct jlmfs_unit {
    uint64_t off, len;      /* bytes of model.jlm */
    uint8_t  arr;           /* enum jlmfs_arr */
    int32_t  a, b;          /* page name: blocks.a, vision.a, experts.a.b */
} jlmfs_unit;

/* What a view is handed by the daemon that owns it (fs/jlmfs.c fills one
 * per daemon; tests may fill their own). Read-only for the view; every
 * pointer outlives every view made with it. The callbacks run with no lock
 * of the view held and may be called from any thread. */
typedef struct jlmfs_keys jlmfs_keys;   /* shared.c: content keys this host computed */

typedef struct jlmfs_view_env {
    const char   *src;        /* realpath of SRC (status lines show it as "SRC") */
    int           src_fd;     /* SRC (O_PATH): sources open below it */
    const char   *cache;      /* realpath of the cache folder */
    int           cache_fd;   /* the cache folder as checked at start: its files open below it; -1: by path */
    const char   *type;       /* -o type=: the conversion type (NULL: keep) */
    const jlm_io *io;         /* never NULL */
    unsigned      slow_ms;    /* test hook: sleep before each unit */
    const int    *stop;       /* read atomically: nonzero once the daemon stops */
    /* one log line (printf'd, no prefix or newline), prio JLMFS_LOG_* */
    void (*log)(void *ctx, int prio, const char *line);
    /* a read of unit u served from tier (base/tier.h), bytes long */
    void (*record)(void *ctx, const char *key, const jlmfs_unit *u, int tier, uint64_t bytes);
    void  *ctx;               /* for log and record */
    /* a mount path the kernel may cache bytes of went stale; NULL: nobody to tell */
    void (*invalidate)(void *ctx, const char *path);
    void  *invalidate_ctx;
    /* -o cache=DIR,shared (shared.c, docs/scale-out.md): entries named by
     * content, converted by the one host holding their lock, never removed
     * by a view; 0: the single-host cache */
    int           shared;
    const char   *host;       /* this daemon's random id (16 hex digits); shared mode */
    jlmfs_keys   *keys;       /* shared mode: the content keys remembered on this host */
} jlmfs_view_env;

/* Packing buffers a converting view keeps for reuse (fs/view.c buf_get/buf_put):
 * up to 4; packers beyond that (a view packs on up to 8 CPUs) allocate theirs. */
#define JLMFS_SPARES 4

struct jlmfs_view {
    const jlmfs_view_env *env;
    int         refs;        /* atomic (__atomic builtins) */
    uint64_t    serial;      /* unique per view of this process: jlmfs_node_version */
    /* immutable after view_create */
    char       *rel;         /* "sub/foo.gguf", or "sub/foo" for a Hugging Face folder */
    int         is_hf;       /* rel is a Hugging Face folder (hfdir.c) */
    char       *key;         /* model key = view path "sub/foo.jlm" */
    char       *cache_path;  /* CACHE/<flat>@<ident>.v27.jlm */
    char       *part_path;   /* cache_path + ".part" (shared: + ".<host>.part") */
    int         lock_fd;     /* shared mode: the entry's lock file while this host holds it; -1 */
    char       *sums_path;   /* cache_path + ".sums": its page checksums (format/sums.h) */
    jlmfs_ident id;
    struct stat dir_st;      /* owner/times shown for view nodes */
    jlm_conv   *conv;        /* NULL in ERROR-at-create */
    jlm_model  *plan;        /* the planned [0, DenseOff) decoded (jlm_fmt_parse) */
    uint8_t    *meta;        /* (plan->hdr.dense_off,) the planned bytes [0, DenseOff) */
    uint64_t    file_size;
    int         fd;          /* .part (O_RDWR) or finished file; -1 if none */
    uint32_t    n_units;
    jlmfs_unit *units;       /* (n_units,) ascending, covering [0, file_size) */
    int32_t    *moe_rank;    /* (n_layer,) rank among MoE blocks or -1 */
    uint32_t    n_moe, n_expert;
    char       *config_json, *tensors_txt;
    pthread_mutex_t lock;
    /* under lock */
    int         state;       /* enum jlmfs_state */
    char        errmsg[1024];
    uint8_t    *done;        /* (n_units,) 1 = written to fd */
    uint8_t    *busy;        /* (n_units,) 1 = one thread is packing it; the others wait on packed */
    pthread_cond_t packed;   /* broadcast when a unit's packing ends (done or not) */
    uint32_t    packs;       /* under lock: units packed and written (== n_units when none is packed twice) */
    uint8_t    *spare[JLMFS_SPARES];   /* packing buffers kept for the next unit (no fresh pages to fault in) */
    size_t      spare_cap[JLMFS_SPARES];
    uint64_t    done_bytes;
    int         dead;        /* dropped from the table: stop converting */
    struct jlm_sums *sums;   /* under lock: the entry's checksums once READY (NULL before);
                              * its spans are checked on their first read */
    int         bad;         /* atomic: a span did not match: the table converts it again */
    double      t0;          /* when it was planned (CLOCK_MONOTONIC s): the log's "ready in" */
    double      t_nospace;   /* under lock: when it failed for a full cache (0: it did not) */
};


/* view.c */
int   jlmfs_view_create(const jlmfs_view_env *env, const char *rel, const jlmfs_ident *id, const struct stat *dir_st,
                        jlmfs_view **out, jlm_err *err);
void  jlmfs_view_ref(jlmfs_view *v);
void  jlmfs_view_unref(jlmfs_view *v);
void  jlmfs_view_kill(jlmfs_view *v);          /* mark dead, remove its cache files */
/* Tells opts.invalidate every path of v's files (the kernel drops what it
 * cached of them: the next read asks the daemon). No lock held. */
void  jlmfs_view_invalidate(jlmfs_view *v);
/* Dropped from the table: kill, fail it if its source was rewritten under a
 * conversion still running, and invalidate; the log says why (NULL: its
 * source went or changed). No lock held. */
void  jlmfs_view_retire(jlmfs_view *v, const char *why);
/* 1 if v failed for a full cache at least min_age s ago and the cache's
 * filesystem now has room for its whole container: worth planning again. */
int   jlmfs_view_space_back(jlmfs_view *v, double min_age);
/* Says in the log that v was planned: converting, ready from the cache, or its error. */
void  jlmfs_view_log_planned(jlmfs_view *v);
void  jlmfs_view_convert(jlmfs_view *v);       /* the worker's job: runs to READY/ERROR/dead */
int   jlmfs_view_state(jlmfs_view *v, int *pct, char *msg, size_t msg_len);
void  jlmfs_view_progress(jlmfs_view *v, uint64_t *done, uint64_t *total);   /* bytes written, container size */
int   jlmfs_view_read(jlmfs_view *v, uint64_t off, size_t len, uint8_t *out, jlm_err *err);
int   jlmfs_view_check(jlmfs_view *v, jlm_err *err);
/* 1 once a read found a span of v's entry that does not match its checksum
 * (the entry and its sidecar are removed then): the table replaces v, which
 * converts the source again. */
int   jlmfs_view_bad(jlmfs_view *v);
int   jlmfs_view_expert_page(const jlmfs_view *v, int32_t b, int32_t e, uint64_t *off);
const char *jlmfs_arr_name(int arr);

/* mmproj.c: the projector paired with rel (malloc'd rel, *st filled) or
 * NULL; 1 if rel is itself a projector's name. */
char *jlmfs_mmproj_rel(int src_fd, const char *rel, struct stat *st);
int   jlmfs_is_mmproj(const char *rel);

/* status.c: msg as a status line may show it (docs/security.md): SRC's and
 * the cache's absolute paths (env's; env may be NULL) become "SRC" and
 * "CACHE", control bytes "?". */
void  jlmfs_status_clean(char *dst, size_t n, const char *msg, const jlmfs_view_env *env);

/* guard.c: crash isolation. enter: 1 (msg filled) if the source is refused
 * (recorded failure, or daemons died on it twice), else records the attempt.
 * leave: the attempt ended (code 0 or the JLM_E* it failed with; a failure in
 * the source's bytes is recorded). forget: the source is gone or replaced. */
int   jlmfs_guard_enter(jlmfs_view *v, char *msg, size_t n);
void  jlmfs_guard_leave(jlmfs_view *v, int code, const char *msg);
void  jlmfs_guard_forget(jlmfs_view *v);

/* shared.c: the shared-cache mode. host_id: a fresh random id. keys_*: the
 * content key (XXH3-128 of the bytes, 32 hex digits) of SRC/rel, hashed once
 * per identity and remembered in the file path (JLM_ENOTFOUND when the file
 * changed while it was hashed: not stable yet). entry_lock: takes v's entry
 * lock without waiting (1: held, v->lock_fd set; 0: another holds it; -1:
 * errno), holder filled with the holder's (or the last holder's) line. */
void  jlmfs_host_id(char out[17]);
int   jlmfs_keys_open(const char *path, jlmfs_keys **out);
void  jlmfs_keys_close(jlmfs_keys *k);
int   jlmfs_keys_get(jlmfs_keys *k, int src_fd, const char *rel, char hex[33], jlm_err *err);
int   jlmfs_entry_lock(jlmfs_view *v, char *holder, size_t n);
void  jlmfs_entry_unlock(jlmfs_view *v);
/* guard.c, shared mode: the entry lock was just taken; 1 (msg filled) if
 * holders died on it MAX_DEATHS times, else the attempt is recorded. */
int   jlmfs_guard_claim(jlmfs_view *v, char *msg, size_t n);

/* hfdir.c: 1 if SRC/rel is a Hugging Face folder source (complete, when
 * check_complete), *id its identity and *dir_st what its view shows. */
int   jlmfs_hf_ident(int src_fd, const char *rel, int check_complete, jlmfs_ident *id, struct stat *dir_st);

/* cachefile.c: opens the file path of the cache folder: its last component
 * below cache_fd (the folder as the daemon checked it; -1: path as it is),
 * O_NOFOLLOW | O_CLOEXEC added (a symbolic link: ELOOP). With O_CREAT the
 * file must be a regular one, and one of the daemon's user's wider than mode
 * is narrowed to it. -1 with errno set. */
int   jlmfs_cache_open(int cache_fd, const char *path, int flags, mode_t mode);

/* view.c: 1 if a and b are the same identity. */
int   jlmfs_ident_eq(const jlmfs_ident *a, const jlmfs_ident *b);

#endif
