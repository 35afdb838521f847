/* jlmfs_int.h - shared between fs/jlmfs.c (table, cache, workers, database)
 * and fs/nodes.c (paths, listings, texts). Not a public contract: see
 * jlmfs.h. Views (fs/view_int.h) are below both and never call up. */
#ifndef JLMFS_INT_H
#define JLMFS_INT_H

#include "fs/view_int.h"
#include "residency/residency.h"

#include <pthread.h>

struct jlmfs {
    char           *src;          /* realpath of SRC */
    int             src_fd;       /* SRC (O_PATH): sources open below it, no symlink followed */
    char           *cache;        /* realpath of the cache folder */
    char           *cache_rel;    /* cache path relative to SRC if inside it, else NULL */
    char           *db_path;
    char           *type;         /* -o type=: the conversion type (NULL: keep) */
    void          (*invalidate)(void *ctx, const char *path);   /* opts.invalidate */
    void           *invalidate_ctx;
    void          (*log)(void *ctx, int prio, const char *line);   /* opts.log */
    void           *log_ctx;
    int             lock_fd;      /* flock on CACHE/jlmfs.lock (single-host mode) */
    int             shared;       /* -o shared */
    char            host[17];     /* this daemon's random id (shared mode) */
    char            prev_host[17];   /* the previous daemon's on this host, or "" */
    jlmfs_keys     *keys;         /* shared mode: content keys, beside the database */
    unsigned        n_workers, slow_ms;
    const jlm_io   *io;           /* never NULL: opts.io or jlm_io_posix */
    jlmfs_view_env  env;          /* what every view is handed (jlmfs_open) */
    int             cache_fd;     /* the cache folder as checked (O_RDONLY | O_DIRECTORY | O_NOFOLLOW) */
    int             check;        /* JLMFS_CHECK=1: jlmfs_check after every sync */
    pthread_mutex_t create_lock;  /* serialises view planning; taken before lock */
    pthread_mutex_t lock;
    /* under lock */
    jlmfs_view    **views; size_t n_views, cap_views;
    struct jlmfs_writer { char *rel; int n; } *writers; size_t n_writers, cap_writers;
    jlmfs_view    **queue; size_t n_queue, cap_queue;
    pthread_cond_t  queue_cond;
    int             stop;
    pthread_t      *threads; unsigned n_threads;
    pthread_t       flusher; int has_flusher;
    /* database: own lock, never held with the others */
    pthread_mutex_t db_lock;
    jlm_rdb        *db;           /* NULL if it could not be opened */
    char            db_err[1024];
    int             db_dirty;
};

/* jlmfs.c: one line to opts.log (printf-style; no lock held). */
void  jlmfs_log(const jlmfs *fs, int prio, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* jlmfs.c */
jlmfs_view *jlmfs_sync_view(jlmfs *fs, const char *rel);   /* reference or NULL */
int   jlmfs_db_names(jlmfs *fs, const char *key, char ***names, size_t *n, jlm_err *err);
int   jlmfs_db_stats(jlmfs *fs, const char *key, char **out, jlm_err *err);
/* layout.html: the container picture of v (picture/picture.h) with the overlay as of now. */
int   jlmfs_db_layout(jlmfs *fs, const jlmfs_view *v, char **out, size_t *len, jlm_err *err);
void  jlmfs_db_record(jlmfs *fs, const char *key, const jlmfs_unit *u, int tier, uint64_t bytes);

#endif
