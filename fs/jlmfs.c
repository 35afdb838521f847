/* jlmfs.c - the daemon's state: the view table kept in step with SRC, the
 * cache folder, the conversion workers, path resolution, listings, texts,
 * extended attributes and the residency database connection. */
#include "fs/jlmfs_int.h"
#include "picture/picture.h"
#include "base/beneath.h"
#include "converter/quantize.h"

#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */
static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n > m && !strcmp(s + n - m, suf);
}

static char *join(const char *a, const char *b)
{
    char *r = NULL;
    if (asprintf(&r, "%s%s%s", a, *a && *b ? "/" : "", b) < 0)
        return NULL;
    return r;
}

static void ident_of(const struct stat *st, jlmfs_ident *id)
{
    *id = (jlmfs_ident){.dev = st->st_dev, .ino = st->st_ino, .size = st->st_size, .mtime_s = st->st_mtim.tv_sec,
                        .mtime_ns = st->st_mtim.tv_nsec};
}

const char *jlmfs_cache_dir(const jlmfs *fs) { return fs->cache; }

/* env.log: opts.log, or warnings and notices (the database's notes) to stderr. */
static void log_line(void *ctx, int prio, const char *line)
{
    const jlmfs *fs = ctx;
    if (fs->log)
        fs->log(fs->log_ctx, prio, line);
    else if (prio == JLMFS_LOG_WARNING || prio == JLMFS_LOG_NOTICE)   /* the database's notes, as before */
        fprintf(stderr, "jlmfs: %s\n", line);
}

void jlmfs_log(const jlmfs *fs, int prio, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log_line((void *)fs, prio, line);
}

/* env.record: a view served a read. */
static void record_read(void *ctx, const char *key, const jlmfs_unit *u, int tier, uint64_t bytes)
{
    jlmfs_db_record(ctx, key, u, tier, bytes);
}

int jlmfs_pass_open(const jlmfs *fs, const char *rel, int flags, mode_t mode)
{
    return *rel ? jlm_open_beneath(fs->src_fd, rel, flags, mode) : open(fs->src, flags | O_CLOEXEC, mode);
}
const char *jlmfs_db_path(const jlmfs *fs) { return fs->db_path; }

/* ---------------------------------------------------------------- table (fs->lock held) */
static ssize_t find_view(jlmfs *fs, const char *rel)
{
    for (size_t i = 0; i < fs->n_views; i++)
        if (!strcmp(fs->views[i]->rel, rel))
            return (ssize_t)i;
    return -1;
}

static jlmfs_view *take_view(jlmfs *fs, size_t i)
{
    jlmfs_view *v = fs->views[i];
    fs->views[i] = fs->views[--fs->n_views];
    return v;
}

static int writers_of(jlmfs *fs, const char *rel)
{
    for (size_t i = 0; i < fs->n_writers; i++)
        if (!strcmp(fs->writers[i].rel, rel))
            return fs->writers[i].n;
    return 0;
}

/* Handles writing a model file (*.json, *.safetensors: the files a folder's
 * identity is made of, fs/hfdir.c) directly inside the folder rel. */
static int writers_in(jlmfs *fs, const char *rel)
{
    size_t n = strlen(rel);
    int k = 0;
    for (size_t i = 0; i < fs->n_writers; i++) {
        const char *w = fs->writers[i].rel;
        if (!strncmp(w, rel, n) && w[n] == '/' && !strchr(w + n + 1, '/') &&
            (ends_with(w + n + 1, ".json") || ends_with(w + n + 1, ".safetensors")))
            k += fs->writers[i].n;
    }
    return k;
}

/* rel is the cache folder or inside it. */
static int in_cache(const jlmfs *fs, const char *rel)
{
    size_t cl = fs->cache_rel ? strlen(fs->cache_rel) : 0;
    return cl && !strncmp(rel, fs->cache_rel, cl) && (!rel[cl] || rel[cl] == '/');
}

static int grow(void **p, size_t *cap, size_t n, size_t el)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    void *np = realloc(*p, nc * el);
    if (!np)
        return -1;
    *p = np;
    *cap = nc;
    return 0;
}

/* Inserts v (the table takes the caller's reference) and queues it if it
 * needs converting (the queue takes another). */
static int insert_view(jlmfs *fs, jlmfs_view *v)
{
    if (grow((void **)&fs->views, &fs->cap_views, fs->n_views, sizeof *fs->views))
        return -1;
    fs->views[fs->n_views++] = v;
    if (jlmfs_view_state(v, NULL, NULL, 0) == JLMFS_CONVERTING &&
        !grow((void **)&fs->queue, &fs->cap_queue, fs->n_queue, sizeof *fs->queue)) {
        jlmfs_view_ref(v);
        fs->queue[fs->n_queue++] = v;
        pthread_cond_broadcast(&fs->queue_cond);
    }
    return 0;
}

/* ---------------------------------------------------------------- sync (invariant 1) */
/* Shared mode: a source another host may still be writing is no source yet:
 * a dot name (rsync's and cp's temporaries) or one modified less than
 * STABLE_S ago (its next lookup after that plans it); the content key's
 * hashing checks once more that it did not change meanwhile. */
#define STABLE_S 2
static int settled(const char *rel, const struct stat *st)
{
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return base[0] != '.' && (now.tv_sec - st->st_mtim.tv_sec > STABLE_S ||
                              (now.tv_sec - st->st_mtim.tv_sec == STABLE_S && now.tv_nsec >= st->st_mtim.tv_nsec));
}

/* Brings the view of SRC/rel in step with the file; returns a reference to
 * it, or NULL if there is none. Planning runs unlocked, serialised by
 * create_lock so two threads never plan (and truncate the .part of) the
 * same view at once. */
jlmfs_view *jlmfs_sync_view(jlmfs *fs, const char *rel)
{
    int gguf = ends_with(rel, ".gguf");
    if (gguf ? jlmfs_is_mmproj(rel) : !*rel || in_cache(fs, rel))
        return NULL;
    struct stat st, mst;
    jlmfs_ident id;
    int ok;
    if (gguf) {
        /* lstat through SRC's descriptor: a symlink (anywhere in rel) is no source */
        int fd = jlm_open_beneath(fs->src_fd, rel, O_PATH, 0);
        ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
        if (fd >= 0)
            close(fd);
        if (ok && fs->shared && !settled(rel, &st))
            ok = 0;
        if (ok) {
            ident_of(&st, &id);
            char *mm = jlmfs_mmproj_rel(fs->src_fd, rel, &mst);   /* adding or changing it replans the view */
            if (mm)
                id.mm_ino = mst.st_ino, id.mm_size = mst.st_size, id.mm_mtime_s = mst.st_mtim.tv_sec,
                id.mm_mtime_ns = mst.st_mtim.tv_nsec;
            free(mm);
        }
    } else {   /* a Hugging Face folder, once complete (hfdir.c), unless x.gguf beside it has the name */
        char *g = NULL;
        int gfd = asprintf(&g, "%s.gguf", rel) < 0 ? -1 : jlm_open_beneath(fs->src_fd, g, O_PATH, 0);
        free(g);
        ok = gfd < 0 || fstat(gfd, &st) || !S_ISREG(st.st_mode);
        if (gfd >= 0)
            close(gfd);
        ok = ok && jlmfs_hf_ident(fs->src_fd, rel, 0, &id, &st);
        if (ok) {   /* the shards' headers are read only when the identity is new: a listing stays cheap */
            pthread_mutex_lock(&fs->lock);
            ssize_t i = find_view(fs, rel);
            int same = i >= 0 && jlmfs_ident_eq(&fs->views[i]->id, &id);
            pthread_mutex_unlock(&fs->lock);
            if (!same)
                ok = jlmfs_hf_ident(fs->src_fd, rel, 1, &id, &st);
        }
    }
    int locked_create = 0;
    jlmfs_view *res = NULL, *old = NULL;
    for (;;) {
        pthread_mutex_lock(&fs->lock);
        ssize_t i = find_view(fs, rel);
        if (!ok || (gguf ? writers_of(fs, rel) : writers_in(fs, rel)) > 0) {
            old = i >= 0 ? take_view(fs, (size_t)i) : NULL;
        } else if (i >= 0 && jlmfs_ident_eq(&fs->views[i]->id, &id) && !jlmfs_view_bad(fs->views[i])) {
            res = fs->views[i];
            jlmfs_view_ref(res);
        } else if (!locked_create) {
            pthread_mutex_unlock(&fs->lock);
            pthread_mutex_lock(&fs->create_lock);
            locked_create = 1;
            continue;   /* re-check under create_lock */
        } else {
            old = i >= 0 ? take_view(fs, (size_t)i) : NULL;
        }
        pthread_mutex_unlock(&fs->lock);
        break;
    }
    if (old) {   /* replaced or gone: its cache entry is stale, and so is what the kernel cached of it */
        jlmfs_view_retire(old, NULL);
        jlmfs_view_unref(old);
    }
    if (!res && ok && locked_create) {
        jlmfs_view *v;
        jlm_err e;
        if (!jlmfs_view_create(&fs->env, rel, &id, &st, &v, &e)) {   /* slow: plans from the GGUF's metadata */
            pthread_mutex_lock(&fs->lock);
            if (insert_view(fs, v)) {
                jlmfs_view_kill(v);
                jlmfs_view_unref(v);
            } else {
                jlmfs_view_ref(v);
                res = v;
            }
            pthread_mutex_unlock(&fs->lock);
            if (res)
                jlmfs_view_log_planned(res);
        }
    }
    if (locked_create)
        pthread_mutex_unlock(&fs->create_lock);
    if (fs->check) {   /* JLMFS_CHECK=1 (the tests): every invariant after every sync */
        jlm_err e;
        if (jlmfs_check(fs, &e)) {
            fprintf(stderr, "jlmfs: BUG: %s\n", e.msg);
            abort();
        }
    }
    return res;
}

void jlmfs_changed(jlmfs *fs, const char *rel)
{
    jlmfs_view_unref(jlmfs_sync_view(fs, rel));
    /* a file of a Hugging Face folder: the folder's view follows it */
    const char *slash = strrchr(rel, '/');
    char *dir = slash ? strndup(rel, (size_t)(slash - rel)) : NULL;
    if (dir)
        jlmfs_view_unref(jlmfs_sync_view(fs, dir));
    free(dir);
}

char *jlmfs_view_of(jlmfs *fs, const char *rel)
{
    jlmfs_view *v = jlmfs_sync_view(fs, rel);
    char *key = v ? strdup(v->key) : NULL;
    jlmfs_view_unref(v);
    return key;
}

void jlmfs_changed_tree(jlmfs *fs, const char *rel)
{
    size_t n = strlen(rel), k = 0;
    pthread_mutex_lock(&fs->lock);
    char **rels = calloc(fs->n_views ? fs->n_views : 1, sizeof *rels);
    for (size_t i = 0; rels && i < fs->n_views; i++)
        if (!strncmp(fs->views[i]->rel, rel, n) && fs->views[i]->rel[n] == '/' && (rels[k] = strdup(fs->views[i]->rel)))
            k++;
    pthread_mutex_unlock(&fs->lock);
    for (size_t i = 0; i < k; i++) {   /* unlocked: a sync plans and kills */
        jlmfs_changed(fs, rels[i]);
        free(rels[i]);
    }
    free(rels);
}

void jlmfs_write_begin(jlmfs *fs, const char *rel)
{
    pthread_mutex_lock(&fs->lock);
    size_t i;
    for (i = 0; i < fs->n_writers && strcmp(fs->writers[i].rel, rel); i++)
        ;
    if (i < fs->n_writers) {
        fs->writers[i].n++;
    } else if (!grow((void **)&fs->writers, &fs->cap_writers, fs->n_writers, sizeof *fs->writers)) {
        fs->writers[fs->n_writers].rel = strdup(rel);
        fs->writers[fs->n_writers].n = 1;
        if (fs->writers[fs->n_writers].rel)
            fs->n_writers++;
    }
    pthread_mutex_unlock(&fs->lock);
    jlmfs_changed(fs, rel);   /* a GGUF being written has no view */
}

void jlmfs_write_end(jlmfs *fs, const char *rel)
{
    pthread_mutex_lock(&fs->lock);
    for (size_t i = 0; i < fs->n_writers; i++)
        if (!strcmp(fs->writers[i].rel, rel)) {
            if (--fs->writers[i].n == 0) {
                free(fs->writers[i].rel);
                fs->writers[i] = fs->writers[--fs->n_writers];
            }
            break;
        }
    pthread_mutex_unlock(&fs->lock);
    jlmfs_changed(fs, rel);   /* closed after writing: complete, gets its view */
}

/* ---------------------------------------------------------------- database */
void jlmfs_db_record(jlmfs *fs, const char *key, const jlmfs_unit *u, int tier, uint64_t bytes)
{
    pthread_mutex_lock(&fs->db_lock);
    if (fs->db) {
        jlm_err e;
        if (jlm_rdb_daemon_read(fs->db, key, jlmfs_arr_name(u->arr), u->a, u->b, tier, bytes, &e))
            jlmfs_log(fs, JLMFS_LOG_NOTICE, "note: %s", e.msg);
        fs->db_dirty = 1;
    }
    pthread_mutex_unlock(&fs->db_lock);
}

static int db_recover_locked(jlmfs *fs, int rc);

static void db_flush_locked(jlmfs *fs)
{
    jlm_err e;
    int rc = fs->db && fs->db_dirty ? jlm_rdb_flush(fs->db, &e) : 0;
    if (rc)
        jlmfs_log(fs, JLMFS_LOG_NOTICE, "note: %s", e.msg);
    fs->db_dirty = 0;
    db_recover_locked(fs, rc);
}

/* Opens (creating) the database; a corrupt one is moved aside and
 * recreated by jlm_rdb_open, which the log says. */
static void db_open_locked(jlmfs *fs)
{
    jlm_err e;
    if (jlm_rdb_open(fs->db_path, JLM_RDB_CREATE, &fs->db, &e)) {
        fs->db = NULL;
        snprintf(fs->db_err, sizeof fs->db_err, "%s", e.msg);
        jlmfs_log(fs, JLMFS_LOG_WARNING, "note: no statistics: %s", e.msg);
    } else if (jlm_rdb_moved_aside(fs->db)) {
        jlmfs_log(fs, JLMFS_LOG_WARNING, "note: %s was corrupt: moved aside to %s, statistics start afresh",
                  fs->db_path, jlm_rdb_moved_aside(fs->db));
    }
}

/* A query or the check found the database corrupt or gone (damaged or
 * removed while mounted): recreate it, moving a damaged one aside, instead of
 * failing until remount. 1 if the query should be run again on the new
 * database. */
static int db_recover_locked(jlmfs *fs, int rc)
{
    if (rc != JLM_EFORMAT)
        return 0;
    jlm_err e;
    if (jlm_rdb_recreate(fs->db, &e)) {
        jlm_rdb_close(fs->db);
        fs->db = NULL;
        snprintf(fs->db_err, sizeof fs->db_err, "%s", e.msg);
        jlmfs_log(fs, JLMFS_LOG_WARNING, "note: no statistics: %s", e.msg);
        return 0;
    }
    if (jlm_rdb_moved_aside(fs->db))
        jlmfs_log(fs, JLMFS_LOG_WARNING, "note: %s was damaged while mounted: moved aside to %s, statistics start afresh",
                  fs->db_path, jlm_rdb_moved_aside(fs->db));
    else
        jlmfs_log(fs, JLMFS_LOG_WARNING, "note: %s was removed while mounted: recreated, statistics start afresh",
                  fs->db_path);
    return 1;
}

/* The database checked (recreated if damaged) and flushed; 0 if none. */
static int db_ready_locked(jlmfs *fs)
{
    jlm_err ce;
    if (fs->db)
        db_recover_locked(fs, jlm_rdb_check(fs->db, &ce));
    if (fs->db)
        db_flush_locked(fs);
    return fs->db != NULL;
}

/* resident/ and stats read the tables after a flush, so they include the
 * reads this daemon served a moment ago. */
int jlmfs_db_names(jlmfs *fs, const char *key, char ***names, size_t *n, jlm_err *err)
{
    pthread_mutex_lock(&fs->db_lock);
    int rc;
    if (db_ready_locked(fs)) {
        rc = jlm_rdb_resident(fs->db, key, names, n, err);
        if (db_recover_locked(fs, rc))
            rc = jlm_rdb_resident(fs->db, key, names, n, err);
    } else {
        rc = jlm_errf(err, JLM_EIO, "no residency database: %s", fs->db_err);
    }
    pthread_mutex_unlock(&fs->db_lock);
    return rc;
}

int jlmfs_db_stats(jlmfs *fs, const char *key, char **out, jlm_err *err)
{
    pthread_mutex_lock(&fs->db_lock);
    int rc;
    if (db_ready_locked(fs)) {
        rc = jlm_rdb_stats_text(fs->db, key, out, err);
        if (db_recover_locked(fs, rc))
            rc = jlm_rdb_stats_text(fs->db, key, out, err);
    } else {
        rc = jlm_errf(err, JLM_EIO, "no residency database: %s", fs->db_err[0] ? fs->db_err : "not open");
    }
    pthread_mutex_unlock(&fs->db_lock);
    return rc;
}

/* The overlay reads the daemon's own connection after a flush (no database:
 * the picture without an overlay). */
int jlmfs_db_layout(jlmfs *fs, const jlmfs_view *v, char **out, size_t *len, jlm_err *err)
{
    pthread_mutex_lock(&fs->db_lock);
    if (fs->db)
        db_flush_locked(fs);
    jlm_pic_overlay ov = {fs->db_path, v->key, fs->db};
    int rc = jlm_pic_html(v->plan, fs->db ? &ov : NULL, v->key, out, len, err);
    pthread_mutex_unlock(&fs->db_lock);
    return rc;
}

/* Views that failed for a full cache are planned again once the cache's
 * filesystem has room for their container (docs/security.md section 5); at
 * most one try per view every RETRY_NOSPACE_S, so a cache that keeps failing
 * does not churn. */
#define RETRY_NOSPACE_S 2.0

static void retry_full(jlmfs *fs)
{
    char **rels = NULL;
    size_t k = 0;
    pthread_mutex_lock(&fs->lock);
    for (size_t i = 0; i < fs->n_views; i++)
        if (jlmfs_view_space_back(fs->views[i], RETRY_NOSPACE_S)) {
            char **nr = realloc(rels, (k + 1) * sizeof *rels);
            if (!nr || !(nr[k] = strdup(fs->views[i]->rel))) {
                rels = nr ? nr : rels;
                break;
            }
            rels = nr;
            k++;
        }
    pthread_mutex_unlock(&fs->lock);
    for (size_t i = 0; i < k; i++) {
        pthread_mutex_lock(&fs->lock);
        ssize_t j = find_view(fs, rels[i]);
        jlmfs_view *old = NULL;
        if (j >= 0 && jlmfs_view_space_back(fs->views[j], RETRY_NOSPACE_S))
            old = take_view(fs, (size_t)j);
        pthread_mutex_unlock(&fs->lock);
        if (old) {
            jlmfs_view_retire(old, "the cache has room again: planned and converted again");
            jlmfs_view_unref(old);
            jlmfs_view_unref(jlmfs_sync_view(fs, rels[i]));
        }
        free(rels[i]);
    }
    free(rels);
}

/* Queued reads reach SQLite at most 500 ms late (one transaction each time),
 * after a check that the file is still there and a database; the same tick
 * retries views a full cache stopped. */
static void *flusher_main(void *arg)
{
    jlmfs *fs = arg;
    pthread_mutex_lock(&fs->lock);
    while (!fs->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&fs->queue_cond, &fs->lock, &ts);
        pthread_mutex_unlock(&fs->lock);
        pthread_mutex_lock(&fs->db_lock);
        db_ready_locked(fs);   /* a database removed or damaged meanwhile is recreated now, not at the next stats */
        pthread_mutex_unlock(&fs->db_lock);
        if (!__atomic_load_n(&fs->stop, __ATOMIC_RELAXED))
            retry_full(fs);
        pthread_mutex_lock(&fs->lock);
    }
    pthread_mutex_unlock(&fs->lock);
    return NULL;
}

/* ---------------------------------------------------------------- workers */
static void *worker_main(void *arg)
{
    jlmfs *fs = arg;
    for (;;) {
        pthread_mutex_lock(&fs->lock);
        while (!fs->stop && fs->n_queue == 0)
            pthread_cond_wait(&fs->queue_cond, &fs->lock);
        if (fs->stop) {
            pthread_mutex_unlock(&fs->lock);
            return NULL;
        }
        jlmfs_view *v = fs->queue[0];
        memmove(fs->queue, fs->queue + 1, --fs->n_queue * sizeof *fs->queue);
        pthread_mutex_unlock(&fs->lock);
        jlmfs_view_convert(v);   /* slow: packs every unit, no lock held */
        jlmfs_view_unref(v);
    }
}

int jlmfs_start(jlmfs *fs, jlm_err *err)
{
    pthread_mutex_lock(&fs->db_lock);
    db_open_locked(fs);
    pthread_mutex_unlock(&fs->db_lock);
    fs->threads = calloc(fs->n_workers, sizeof *fs->threads);
    if (!fs->threads)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    for (; fs->n_threads < fs->n_workers; fs->n_threads++)
        if (pthread_create(&fs->threads[fs->n_threads], NULL, worker_main, fs))
            return jlm_errf(err, JLM_EIO, "cannot start conversion thread %u", fs->n_threads);
    if (pthread_create(&fs->flusher, NULL, flusher_main, fs))
        return jlm_errf(err, JLM_EIO, "cannot start the statistics thread");
    fs->has_flusher = 1;
    return JLM_OK;
}

/* ---------------------------------------------------------------- open / close */
/* Makes the parents of path (0755, as mkdir -p) and path itself (0700). */
static int mkdirs(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return -1;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    int rc = mkdir(p, 0700) && errno != EEXIST ? -1 : 0;
    free(p);
    return rc;
}

/* Plans a view for every GGUF under dir (relative to SRC), skipping the cache. */
static void scan(jlmfs *fs, const char *rel, int depth)
{
    char *path = join(fs->src, rel);
    DIR *d = path ? opendir(path) : NULL;
    free(path);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        char *sub = join(rel, de->d_name);
        if (!sub)
            break;
        if (fs->cache_rel && !strcmp(sub, fs->cache_rel)) {
            free(sub);
            continue;
        }
        if (de->d_type == DT_DIR && depth < 16) {
            scan(fs, sub, depth + 1);
            jlmfs_view_unref(jlmfs_sync_view(fs, sub));   /* a Hugging Face folder */
        } else {
            jlmfs_view_unref(jlmfs_sync_view(fs, sub));
        }
        free(sub);
    }
    closedir(d);
}

/* First pass (parts_only, before any view exists): removes every .part (a
 * killed daemon's). Second pass: removes finished entries no view owns. */
static void clean_cache(jlmfs *fs, int parts_only)
{
    int dfd = fs->cache_fd >= 0 ? openat(fs->cache_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;   /* the folder checked at open, whatever its name is now */
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        int part = ends_with(de->d_name, ".jlm.part") || ends_with(de->d_name, ".jlm.sums.part");
        if (fs->shared)   /* only this host's previous daemon's: X.jlm.<host>.part */
            part = fs->prev_host[0] && ends_with(de->d_name, ".part") && strlen(de->d_name) > 22 &&
                   !strncmp(de->d_name + strlen(de->d_name) - 21, fs->prev_host, 16) &&
                   de->d_name[strlen(de->d_name) - 22] == '.';
        /* guard.c's records and the checksum sidecar go with their entry: kept while its source is */
        size_t rec = ends_with(de->d_name, ".jlm.fail") || ends_with(de->d_name, ".jlm.busy") ||
                     ends_with(de->d_name, ".jlm.sums") ? 5 : 0;
        if (parts_only ? !part : (part || !strchr(de->d_name, '@') || (!rec && !ends_with(de->d_name, ".jlm"))))
            continue;
        char *p = join(fs->cache, de->d_name);
        int owned = 0;
        size_t plen = p ? strlen(p) - rec : 0;
        pthread_mutex_lock(&fs->lock);
        for (size_t i = 0; p && !parts_only && i < fs->n_views; i++)
            owned |= strlen(fs->views[i]->cache_path) == plen && !strncmp(fs->views[i]->cache_path, p, plen);
        pthread_mutex_unlock(&fs->lock);
        if (p && !owned)
            unlinkat(fs->cache_fd, de->d_name, 0);
        free(p);
    }
    closedir(d);
}

/* The cache folder (docs/security.md section 12): opened without following
 * a link, refused unless it belongs to the daemon's user and nobody else may
 * write it (else whoever made it could plant links or swap containers), then
 * narrowed to 0700. Every file of it is opened below fs->cache_fd. */
static int check_cache_dir(jlmfs *fs, const char *shown, jlm_err *err)
{
    fs->cache_fd = open(fs->cache, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st, lst;
    if (fs->cache_fd < 0 || fstat(fs->cache_fd, &st))
        return jlm_errf(err, JLM_EIO, "cache %s: %s", shown, strerror(errno));
    if (st.st_uid != geteuid())
        return jlm_errf(err, JLM_EINVAL, "cache %s belongs to uid %u, not to the daemon's user (uid %u): refused "
                        "(remove it, or give -o cache=DIR)", shown, (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return jlm_errf(err, JLM_EINVAL, "cache %s is writable by %s (mode %03o): refused (chmod 700 it, or remove it)",
                        shown, st.st_mode & S_IWOTH ? "others" : "its group", (unsigned)(st.st_mode & 07777));
    if (lstat(fs->cache, &lst) || lst.st_dev != st.st_dev || lst.st_ino != st.st_ino)
        return jlm_errf(err, JLM_EINVAL, "cache %s was replaced while it was opened: refused", shown);
    if ((st.st_mode & 07777) != 0700 && fchmod(fs->cache_fd, 0700))
        return jlm_errf(err, JLM_EIO, "cache %s: chmod 700: %s", shown, strerror(errno));
    return 0;
}

static int open_cache(jlmfs *fs, const char *cache, jlm_err *err)
{
    char *def = NULL;
    if (!cache && asprintf(&def, "%s/.jlmfs-cache", fs->src) < 0)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    const char *c = cache ? cache : def;
    int rc = mkdirs(c) ? jlm_errf(err, JLM_EIO, "cache %s: %s", c, strerror(errno)) : 0;
    if (!rc && !(fs->cache = realpath(c, NULL)))
        rc = jlm_errf(err, JLM_EIO, "cache %s: %s", c, strerror(errno));
    if (!rc)
        rc = check_cache_dir(fs, c, err);
    free(def);
    if (rc)
        return rc;
    size_t n = strlen(fs->src);
    if (!strncmp(fs->cache, fs->src, n) && fs->cache[n] == '/')
        fs->cache_rel = strdup(fs->cache + n + 1);
    if (fs->shared)
        return 0;   /* many daemons on one folder: no folder lock; the database is set by open_db_path */
    char *lock = join(fs->cache, "jlmfs.lock");
    if (!fs->db_path)
        fs->db_path = join(fs->cache, "jlmfs.db");
    if (!lock || !fs->db_path) {
        free(lock);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    fs->lock_fd = jlmfs_cache_open(fs->cache_fd, "jlmfs.lock", O_RDWR | O_CREAT, 0600);
    if (fs->lock_fd < 0)
        rc = jlm_errf(err, JLM_EIO, "%s: %s", lock, errno == ELOOP ? "a symbolic link: refused" : strerror(errno));
    else if (flock(fs->lock_fd, LOCK_EX | LOCK_NB))
        rc = jlm_errf(err, JLM_EINVAL, "cache %s is in use by another jlmfs (one daemon per cache folder)", fs->cache);
    free(lock);
    return rc;
}

/* ---------------------------------------------------------------- shared mode (fs/shared.c) */
/* The default database of a shared-cache daemon: per host, never on the
 * shared storage: /var/lib/jlmfs/ as root, else $XDG_STATE_HOME/jlmfs/
 * (~/.local/state/jlmfs/), named after SRC and a hash of SRC and the cache. */
static char *default_db(const jlmfs *fs)
{
    const char *home = getenv("HOME"), *xdg = getenv("XDG_STATE_HOME");
    char *dir = NULL, *out = NULL;
    if (geteuid() == 0)
        dir = strdup("/var/lib/jlmfs");
    else if (xdg && xdg[0] == '/' && asprintf(&dir, "%s/jlmfs", xdg) < 0)
        dir = NULL;
    else if ((!xdg || xdg[0] != '/') && home && asprintf(&dir, "%s/.local/state/jlmfs", home) < 0)
        dir = NULL;
    uint64_t h = 1469598103934665603ull;   /* FNV-1a 64 of "SRC\nCACHE" */
    for (const char *p = fs->src; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ '\n') * 1099511628211ull;
    for (const char *p = fs->cache; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    const char *base = strrchr(fs->src, '/');
    base = base && base[1] ? base + 1 : "root";
    if (dir && asprintf(&out, "%s/%.64s-%08llx.db", dir, base, (unsigned long long)(h & 0xffffffffu)) < 0)
        out = NULL;
    free(dir);
    return out;
}

/* The database's folder (made, as mkdir -p) and, in shared mode, refused
 * inside the cache folder: SQLite's WAL needs memory shared on one host. */
static int open_db_path(jlmfs *fs, const char *db, jlm_err *err)
{
    if (!fs->db_path && !(fs->db_path = db ? strdup(db) : default_db(fs)))
        return jlm_errf(err, JLM_EINVAL, "no database path: give -o db=PATH (HOME is not set)");
    char *dir = strdup(fs->db_path), *slash = dir ? strrchr(dir, '/') : NULL;
    if (!dir)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    if (slash && slash != dir) {
        *slash = 0;
        mkdirs(dir);
    }
    char *real = realpath(slash ? (slash == dir ? "/" : dir) : ".", NULL);
    size_t n = strlen(fs->cache);
    int inside = real && !strncmp(real, fs->cache, n) && (real[n] == 0 || real[n] == '/');
    int rc = !real ? jlm_errf(err, JLM_EINVAL, "option db=%s: folder %s: %s", fs->db_path, dir, strerror(errno))
             : inside && fs->shared ? jlm_errf(err, JLM_EINVAL, "option db=%s: inside the shared cache %s: refused "
                                               "(the residency database stays on each host)", fs->db_path, fs->cache)
                                    : 0;
    free(real);
    free(dir);
    return rc;
}

/* Shared mode: a fresh host id; the .part files of this host's previous
 * daemon (its id is kept beside the database) are removed, no other. */
static int shared_start(jlmfs *fs, jlm_err *err)
{
    char *idf = NULL, *keyf = NULL, old[32] = "";
    if (asprintf(&idf, "%s.host", fs->db_path) < 0 || asprintf(&keyf, "%s.keys", fs->db_path) < 0 ||
        jlmfs_keys_open(keyf, &fs->keys)) {
        free(idf);
        free(keyf);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    jlmfs_host_id(fs->host);
    FILE *f = fopen(idf, "re");
    if (f && (!fgets(old, sizeof old, f) || strspn(old, "0123456789abcdef") != 16))
        old[0] = 0;
    if (f)
        fclose(f);
    old[old[0] ? 16 : 0] = 0;
    int fd = open(idf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    int ok = fd >= 0 && write(fd, fs->host, 16) == 16;
    if (fd >= 0 && close(fd))
        ok = 0;
    int rc = ok ? 0 : jlm_errf(err, JLM_EIO, "%s: %s", idf, strerror(errno));
    free(idf);
    free(keyf);
    if (!rc && old[0])
        memcpy(fs->prev_host, old, sizeof fs->prev_host);   /* 16 hex digits and the NUL put above */
    return rc;
}

int jlmfs_open(const jlmfs_opts *o, jlmfs **out, jlm_err *err)
{
    jlmfs *fs = calloc(1, sizeof *fs);
    if (!fs)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    fs->lock_fd = -1;
    fs->src_fd = -1;
    fs->cache_fd = -1;
    pthread_mutex_init(&fs->lock, NULL);
    pthread_mutex_init(&fs->create_lock, NULL);
    pthread_mutex_init(&fs->db_lock, NULL);
    pthread_cond_init(&fs->queue_cond, NULL);
    fs->n_workers = o->n_workers ? o->n_workers : 1;
    fs->slow_ms = o->slow_ms;
    fs->io = o->io ? o->io : &jlm_io_posix;
    fs->invalidate = o->invalidate;
    fs->invalidate_ctx = o->invalidate_ctx;
    fs->log = o->log;
    fs->log_ctx = o->log_ctx;
    const char *chk = getenv("JLMFS_CHECK");
    fs->check = chk && *chk == '1';
    struct stat st;
    int rc = 0;
    if (!o->src || !(fs->src = realpath(o->src, NULL)) || stat(fs->src, &st) || !S_ISDIR(st.st_mode) ||
        (fs->src_fd = open(fs->src, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        rc = jlm_errf(err, JLM_EINVAL, "source %s: %s", o->src ? o->src : "(none)",
                      fs->src && !S_ISDIR(st.st_mode) ? "not a directory" : strerror(errno));
    if (!rc && o->type && strcmp(o->type, "keep")) {
        uint32_t q;
        if (jlm_quant_parse(o->type, &q, err))
            rc = jlm_err_prefix(err, JLM_EINVAL, "option type=%s", o->type);
        else if (!(fs->type = strdup(o->type)))
            rc = jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    fs->shared = o->shared;
    if (!rc)
        rc = open_cache(fs, o->cache, err);
    if (!rc && (fs->shared || o->db))
        rc = open_db_path(fs, o->db, err);
    if (!rc && fs->shared)
        rc = shared_start(fs, err);
    if (rc) {
        jlmfs_close(fs);
        return rc;
    }
    fs->env = (jlmfs_view_env){.src = fs->src, .src_fd = fs->src_fd, .cache = fs->cache, .cache_fd = fs->cache_fd,
                               .type = fs->type, .io = fs->io, .slow_ms = fs->slow_ms, .stop = &fs->stop,
                               .log = log_line, .record = record_read, .ctx = fs,
                               .invalidate = fs->invalidate, .invalidate_ctx = fs->invalidate_ctx,
                               .shared = fs->shared, .host = fs->host, .keys = fs->keys};
    if (fs->shared)
        jlmfs_log(fs, JLMFS_LOG_INFO, "host %s: shared cache %s, database %s", fs->host, fs->cache, fs->db_path);
    clean_cache(fs, 1);
    scan(fs, "", 0);
    if (!fs->shared)   /* shared: an entry no view of this host owns may be another host's */
        clean_cache(fs, 0);
    *out = fs;
    return JLM_OK;
}

void jlmfs_close(jlmfs *fs)
{
    if (!fs)
        return;
    pthread_mutex_lock(&fs->lock);
    __atomic_store_n(&fs->stop, 1, __ATOMIC_RELAXED);   /* workers read it unlocked (view.c) */
    pthread_cond_broadcast(&fs->queue_cond);
    pthread_mutex_unlock(&fs->lock);
    for (unsigned i = 0; i < fs->n_threads; i++)
        pthread_join(fs->threads[i], NULL);
    if (fs->has_flusher)
        pthread_join(fs->flusher, NULL);
    for (size_t i = 0; i < fs->n_queue; i++)
        jlmfs_view_unref(fs->queue[i]);
    for (size_t i = 0; i < fs->n_views; i++) {
        jlmfs_view *v = fs->views[i];
        if (jlmfs_view_state(v, NULL, NULL, 0) == JLMFS_CONVERTING) {
            unlink(v->part_path);   /* invariant 3: no half-written entry survives */
            jlmfs_guard_leave(v, 0, NULL);   /* a clean stop is no crash */
        }
        jlmfs_view_unref(v);
    }
    for (size_t i = 0; i < fs->n_writers; i++)
        free(fs->writers[i].rel);
    if (fs->db) {
        db_flush_locked(fs);
        jlm_rdb_close(fs->db);
    }
    if (fs->lock_fd >= 0)
        close(fs->lock_fd);
    if (fs->src_fd >= 0)
        close(fs->src_fd);
    if (fs->cache_fd >= 0)
        close(fs->cache_fd);
    free(fs->views); free(fs->queue); free(fs->writers); free(fs->threads);
    jlmfs_keys_close(fs->keys);
    free(fs->src); free(fs->cache); free(fs->cache_rel); free(fs->db_path); free(fs->type);
    pthread_mutex_destroy(&fs->lock);
    pthread_mutex_destroy(&fs->create_lock);
    pthread_mutex_destroy(&fs->db_lock);
    pthread_cond_destroy(&fs->queue_cond);
    free(fs);
}

int jlmfs_check(jlmfs *fs, jlm_err *err)
{
    int rc = 0;
    pthread_mutex_lock(&fs->lock);
    for (size_t i = 0; i < fs->n_views && !rc; i++) {
        rc = jlmfs_view_check(fs->views[i], err);
        for (size_t j = 0; j < i && !rc; j++)
            if (!strcmp(fs->views[i]->rel, fs->views[j]->rel))
                rc = jlm_errf(err, JLM_EINVAL, "view %s listed twice", fs->views[i]->rel);
    }
    for (size_t i = 0; i < fs->n_writers && !rc; i++)
        if (fs->writers[i].n <= 0)
            rc = jlm_errf(err, JLM_EINVAL, "writer count %d for %s", fs->writers[i].n, fs->writers[i].rel);
    pthread_mutex_unlock(&fs->lock);
    return rc;
}
