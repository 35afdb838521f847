/* scan.c - the table of served models and the --models DIR scanner
 * (contract in srv_int.h; behaviour in docs/serve.md, "A models folder").
 * A scan lists NAME.jlm entries of the folder: a file is opened; a directory
 * is a jlmfs view, opened when its `status` says `ready`, else listed as
 * pending with that status. An entry whose identity (device, inode, size,
 * mtime) changed is reopened; one that is gone is retired. */
#include "serve/srv_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---------------------------------------------------------------- table */

static srv_model *find_locked(struct jlm_srv *s, const char *id)
{
    for (size_t i = 0; i < s->n_models; i++)
        if (!strcmp(s->models[i]->id, id))
            return s->models[i];
    return NULL;
}

srv_model *jlm_srv_model_find(struct jlm_srv *s, const char *id)
{
    pthread_mutex_lock(&s->models_mu);
    srv_model *m = find_locked(s, id);
    if (m) atomic_fetch_add(&m->refs, 1);
    pthread_mutex_unlock(&s->models_mu);
    return m;
}

srv_model *jlm_srv_model_only(struct jlm_srv *s)
{
    pthread_mutex_lock(&s->models_mu);
    srv_model *m = s->n_models == 1 ? s->models[0] : NULL;
    if (m) atomic_fetch_add(&m->refs, 1);
    pthread_mutex_unlock(&s->models_mu);
    return m;
}

/* The last reference of a retired model is dropped by its lookup; the
 * scanner (or the server's close) frees it. */
void jlm_srv_model_unref(srv_model *m)
{
    if (m) atomic_fetch_sub(&m->refs, 1);
}

static int push(srv_model ***a, size_t *n, size_t *cap, srv_model *m)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        srv_model **t = realloc(*a, c * sizeof *t);
        if (!t) return JLM_ENOMEM;
        *a = t;
        *cap = c;
    }
    (*a)[(*n)++] = m;
    return 0;
}

int jlm_srv_models_add(struct jlm_srv *s, srv_model *m, jlm_err *err)
{
    pthread_mutex_lock(&s->models_mu);
    int rc = find_locked(s, m->id) ? jlm_errf(err, JLM_EINVAL, "%s: model id '%s' is served twice (ids are file stems)",
                                              m->path, m->id)
           : push(&s->models, &s->n_models, &s->models_cap, m) ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
    pthread_mutex_unlock(&s->models_mu);
    return rc;
}

/* Takes m out of the table onto the retired list: no lookup finds it from
 * now on, its worker accepts no job and exits when it has answered the ones
 * it holds. Caller holds models_mu. */
static void retire_locked(struct jlm_srv *s, size_t i)
{
    srv_model *m = s->models[i];
    memmove(s->models + i, s->models + i + 1, (s->n_models - i - 1) * sizeof *s->models);
    s->n_models--;
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    atomic_fetch_sub(&m->refs, 1);   /* the table's */
    if (push(&s->retired, &s->n_retired, &s->retired_cap, m)) {
        /* cannot keep it for later: close it now (waits for its worker) */
        pthread_mutex_unlock(&s->models_mu);
        while (atomic_load(&m->refs) > 0) {
            struct timespec t = {0, 10000000};
            nanosleep(&t, NULL);
        }
        jlm_srv_model_close(m);
        pthread_mutex_lock(&s->models_mu);
    }
}

/* Closes the retired models whose worker has exited and no lookup holds. */
static void reap(struct jlm_srv *s)
{
    pthread_mutex_lock(&s->models_mu);
    for (size_t i = 0; i < s->n_retired;) {
        srv_model *m = s->retired[i];
        pthread_mutex_lock(&m->mu);
        int gone = (m->exited || !m->started) && atomic_load(&m->refs) == 0;
        pthread_mutex_unlock(&m->mu);
        if (!gone) { i++; continue; }
        s->retired[i] = s->retired[--s->n_retired];
        pthread_mutex_unlock(&s->models_mu);
        jlm_srv_model_close(m);
        pthread_mutex_lock(&s->models_mu);
    }
    pthread_mutex_unlock(&s->models_mu);
}

void jlm_srv_models_close_all(struct jlm_srv *s)
{
    if (s->scanner) {
        pthread_mutex_lock(&s->scan_mu);
        s->scan_stop = 1;
        pthread_cond_broadcast(&s->scan_cv);
        pthread_mutex_unlock(&s->scan_mu);
        pthread_join(s->scanner, NULL);
        s->scanner = 0;
    }
    for (size_t i = 0; i < s->n_models; i++)
        jlm_srv_model_close(s->models[i]);
    for (size_t i = 0; i < s->n_retired; i++)
        jlm_srv_model_close(s->retired[i]);
    free(s->models);
    free(s->retired);
    s->models = s->retired = NULL;
    s->n_models = s->n_retired = 0;
}

/* ---------------------------------------------------------------- scan */

typedef struct entry {
    char    *path, *id, *status;   /* status: NULL ready; else a view's status line or an error */
    uint64_t ident[4];
} entry;

static void ident_of(const struct stat *st, uint64_t out[4])
{
    out[0] = (uint64_t)st->st_dev;
    out[1] = (uint64_t)st->st_ino;
    out[2] = (uint64_t)st->st_size;
    out[3] = (uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec;
}

/* A view's status file: its first line ("" when unreadable). */
static char *read_status(const char *view)
{
    char p[4096], line[256] = "";
    snprintf(p, sizeof p, "%s/status", view);
    FILE *f = fopen(p, "r");
    if (f) {
        if (!fgets(line, sizeof line, f)) line[0] = 0;
        fclose(f);
    }
    line[strcspn(line, "\r\n")] = 0;
    for (char *c = line; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return strdup(f ? line : "no status file");
}

static int describe_at(const char *path, entry *e);
static int same(const srv_model *m, const entry *e);

/* Fills e for DIR/NAME; 0, or -1 to skip the entry (vanished meanwhile). */
static int describe(const char *dir, const char *name, entry *e)
{
    char *p = NULL;
    if (asprintf(&p, "%s/%s", dir, name) < 0)
        return -1;
    int rc = describe_at(p, e);
    free(p);
    return rc;
}

static int describe_at(const char *path, entry *e)
{
    memset(e, 0, sizeof *e);
    if (!(e->path = strdup(path))) return -1;
    struct stat st;
    if (stat(e->path, &st)) { free(e->path); return -1; }
    e->id = jlm_srv_model_stem(e->path);
    if (S_ISDIR(st.st_mode)) {
        char *status = read_status(e->path), c[4096];
        snprintf(c, sizeof c, "%s/model.jlm", e->path);
        struct stat cs;
        if (status && !strcmp(status, "ready") && !stat(c, &cs)) {
            free(status);
            ident_of(&cs, e->ident);
        } else {
            e->status = status ? status : strdup("unknown");
        }
    } else if (S_ISREG(st.st_mode)) {
        ident_of(&st, e->ident);
    } else {
        free(e->path); free(e->id);
        return -1;
    }
    return e->id ? 0 : -1;
}

int jlm_srv_model_stale(const srv_model *m)
{
    if (!m->from_dir || m->status)
        return 0;
    entry e;
    if (describe_at(m->given, &e))
        return 1;   /* gone */
    int st = !same(m, &e);
    free(e.path); free(e.id); free(e.status);
    return st;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The NAME.jlm entries of dir in name order (*names malloc'd). */
static int list_dir(const char *dir, char ***names, size_t *n, jlm_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return jlm_errf(err, JLM_EIO, "--models %s: cannot open the folder: %s", dir, strerror(errno));
    char **v = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (struct dirent *de; !rc && (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l <= 4 || strcmp(de->d_name + l - 4, ".jlm") || de->d_name[0] == '.')
            continue;
        if (len == cap) {
            cap = cap ? cap * 2 : 16;
            char **t = realloc(v, cap * sizeof *t);
            if (!t) { rc = JLM_ENOMEM; break; }
            v = t;
        }
        if (!(v[len] = strdup(de->d_name))) rc = JLM_ENOMEM;
        else len++;
    }
    closedir(d);
    if (rc) {
        for (size_t i = 0; i < len; i++) free(v[i]);
        free(v);
        return jlm_errf(err, rc, "out of memory");
    }
    qsort(v, len, sizeof *v, by_name);
    *names = v;
    *n = len;
    return 0;
}

/* Whether the table's entry m still is what e describes. */
static int same(const srv_model *m, const entry *e)
{
    if (m->status && !e->status && !strncmp(m->status, "error: ", 7))   /* failed to open: retried when it changes */
        return !strcmp(m->given, e->path) && !memcmp(m->ident, e->ident, sizeof m->ident);
    if (!!m->status != !!e->status) return 0;
    if (m->status) return !strcmp(m->status, e->status) && !strcmp(m->given, e->path);
    return !strcmp(m->given, e->path) && !memcmp(m->ident, e->ident, sizeof m->ident);
}

int jlm_srv_scan(struct jlm_srv *s, int first, jlm_err *err)
{
    char **names = NULL;
    size_t n = 0;
    int rc = list_dir(s->models_dir, &names, &n, err);
    if (rc)
        return rc;
    entry *es = calloc(n ? n : 1, sizeof *es);
    size_t ne = 0;
    for (size_t i = 0; es && i < n; i++)
        if (!describe(s->models_dir, names[i], &es[ne])) ne++;
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!es)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    /* retire what vanished or changed (folder entries only: a model given
     * by path is not the folder's) */
    pthread_mutex_lock(&s->models_mu);
    for (size_t i = 0; i < s->n_models;) {
        srv_model *m = s->models[i];
        int ours = m->from_dir;
        const entry *e = NULL;
        for (size_t k = 0; ours && k < ne && !e; k++)
            if (!strcmp(es[k].id, m->id)) e = &es[k];
        if (ours && (!e || !same(m, e)))
            retire_locked(s, i);
        else
            i++;
    }
    pthread_mutex_unlock(&s->models_mu);
    /* open what is new */
    for (size_t k = 0; k < ne && !rc; k++) {
        entry *e = &es[k];
        srv_model *m = jlm_srv_model_find(s, e->id);
        jlm_srv_model_unref(m);
        if (m && first) {
            rc = jlm_errf(err, JLM_EINVAL, "%s: model id '%s' is served twice (ids are file stems)", e->path, e->id);
            break;
        }
        if (m)
            continue;   /* served already, unchanged */
        jlm_err oe = {0};
        if (e->status) {
            rc = jlm_srv_model_pending(s, e->path, e->id, e->status, &m) ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
        } else if (jlm_srv_model_open(s, e->path, e->id, &m, &oe)) {
            if (first) {   /* at start a broken model is refused, as one given by path */
                rc = jlm_errf(err, oe.code, "%s", oe.msg);
                break;
            }
            /* later (a file still being copied, or a broken one): listed
             * with the reason, retried when the file changes */
            fprintf(stderr, "jlm serve: %s\n", oe.msg);
            char *st = NULL;
            if (asprintf(&st, "error: %s", oe.msg) < 0) st = NULL;
            rc = !st || jlm_srv_model_pending(s, e->path, e->id, st, &m) ? jlm_errf(err, JLM_ENOMEM, "out of memory") : 0;
            free(st);
        }
        if (!rc && m) {
            memcpy(m->ident, e->ident, sizeof m->ident);
            m->from_dir = 1;
            if (jlm_srv_models_add(s, m, err)) {
                jlm_srv_model_close(m);
                rc = first ? JLM_EINVAL : 0;
            }
        }
    }
    for (size_t k = 0; k < ne; k++) { free(es[k].path); free(es[k].id); free(es[k].status); }
    free(es);
    reap(s);
    return rc;
}

static void *scanner_main(void *arg)
{
    struct jlm_srv *s = arg;
    pthread_mutex_lock(&s->scan_mu);
    while (!s->scan_stop) {
        if (!s->scan_asked) {
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_sec += s->o.rescan_s > 0 ? s->o.rescan_s : 3600;
            int r = pthread_cond_timedwait(&s->scan_cv, &s->scan_mu, &t);
            if (s->scan_stop) break;
            if (r == ETIMEDOUT && s->o.rescan_s <= 0 && !s->scan_asked) continue;
        }
        s->scan_asked = 0;
        s->scanning = 1;
        pthread_mutex_unlock(&s->scan_mu);
        jlm_err err = {0};
        if (jlm_srv_scan(s, 0, &err))
            fprintf(stderr, "jlm serve: rescan: %s\n", err.msg);
        pthread_mutex_lock(&s->scan_mu);
        s->scanning = 0;
        s->scans_done++;
        pthread_cond_broadcast(&s->scan_cv);
    }
    pthread_mutex_unlock(&s->scan_mu);
    return NULL;
}

int jlm_srv_scanner_start(struct jlm_srv *s, jlm_err *err)
{
    if (pthread_create(&s->scanner, NULL, scanner_main, s)) {
        s->scanner = 0;
        return jlm_errf(err, JLM_ENOMEM, "cannot start the --models scanner thread");
    }
    return 0;
}

void jlm_srv_scan_now(struct jlm_srv *s, int timeout_ms)
{
    if (!s->models_dir || !s->scanner)
        return;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += timeout_ms / 1000;
    t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) { t.tv_sec++; t.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&s->scan_mu);
    /* a scan already running may have listed the folder before the call */
    uint64_t want = s->scans_done + (s->scanning ? 2 : 1);
    s->scan_asked = 1;
    pthread_cond_broadcast(&s->scan_cv);
    while (s->scans_done < want && !s->scan_stop)
        if (pthread_cond_timedwait(&s->scan_cv, &s->scan_mu, &t) == ETIMEDOUT) break;
    pthread_mutex_unlock(&s->scan_mu);
}
