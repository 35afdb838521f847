/* guard.c - crash isolation (docs/security.md): a source whose conversion
 * fails for a reason in its bytes, or during whose conversion the daemon died
 * twice, is recorded in the cache and not tried again until it changes (its
 * identity is in the cache name, so a changed source has no record).
 *
 *   CACHE/<entry>.busy   exists while the view plans or converts; holds how
 *                        many daemons started on it ("1", "2"). Left behind
 *                        only by a daemon that died (crash, kill -9).
 *   CACHE/<entry>.fail   the status line the source is refused with.
 *
 * In the shared-cache mode (shared.c) the .busy record is counted only by the
 * host holding the entry's lock: another host's conversion in progress is
 * not a death, a holder that died is (its lock was released). */
#include "fs/view_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Daemons that may die on one source before it is refused: one death (a kill
 * -9, a power cut) is retried; a second means the source itself kills. */
#define MAX_DEATHS 2

/* The shared-cache mode (a view made without an env, as a test does, is not). */
static int shared(const jlmfs_view *v) { return v->env && v->env->shared; }

static char *marker(const jlmfs_view *v, const char *ext)
{
    char *p = NULL;
    return asprintf(&p, "%s.%s", v->cache_path, ext) < 0 ? NULL : p;
}

/* Whole small file as text (NUL-terminated, at most n-1 bytes); 0 and ""
 * if absent. */
static int read_small(const char *path, char *buf, size_t n)
{
    buf[0] = 0;   /* an absent record reads as "": the caller's atoi gives 0 */
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
    if (fd < 0)
        return 0;
    ssize_t r = read(fd, buf, n - 1);
    close(fd);
    buf[r > 0 ? r : 0] = 0;
    return 1;
}

/* Written whole to path.tmp then renamed: a reader never sees half of it. */
static void write_small(const char *path, const char *text)
{
    char *tmp = NULL;
    if (!path || asprintf(&tmp, "%s.tmp", path) < 0)
        return;
    int fd = jlmfs_cache_open(-1, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);   /* no link followed, 0600 */
    size_t n = strlen(text);
    int ok = fd >= 0 && write(fd, text, n) == (ssize_t)n;
    if (fd >= 0 && close(fd))
        ok = 0;
    if (!ok || rename(tmp, path))
        unlink(tmp);
    free(tmp);
}

/* Records one more attempt in .busy, or refuses (msg) once MAX_DEATHS
 * daemons died on it. */
static int count_attempt(jlmfs_view *v, const char *fail, const char *busy, char *msg, size_t n)
{
    char buf[64];
    if (read_small(busy, buf, sizeof buf) && atoi(buf) >= MAX_DEATHS) {
        snprintf(msg, n, "%s: the daemon stopped %d times while converting it (a crash?): not tried again until "
                 "the file changes", v->rel, atoi(buf));
        write_small(fail, msg);
        unlink(busy);
        return 1;
    }
    snprintf(buf, sizeof buf, "%d\n", atoi(buf) + 1);   /* buf is "" when there was no record */
    write_small(busy, buf);
    return 0;
}

int jlmfs_guard_enter(jlmfs_view *v, char *msg, size_t n)
{
    char *fail = marker(v, "fail"), *busy = marker(v, "busy");
    int refused = 1;
    if (!read_small(fail, msg, n))   /* shared: the lock holder counts (jlmfs_guard_claim) */
        refused = shared(v) ? 0 : count_attempt(v, fail, busy, msg, n);
    free(fail);
    free(busy);
    return refused;
}

int jlmfs_guard_claim(jlmfs_view *v, char *msg, size_t n)
{
    char *fail = marker(v, "fail"), *busy = marker(v, "busy");
    int refused = read_small(fail, msg, n) || count_attempt(v, fail, busy, msg, n);
    free(fail);
    free(busy);
    return refused;
}

static int in_the_bytes(int code)
{
    return code == JLM_EFORMAT || code == JLM_EUNSUPPORTED || code == JLM_ERANGE || code == JLM_EVERSION;
}

void jlmfs_guard_leave(jlmfs_view *v, int code, const char *msg)
{
    char *busy = marker(v, "busy");
    if (busy && (!shared(v) || v->lock_fd >= 0))   /* shared: only its lock's holder counted it */
        unlink(busy);
    free(busy);
    if (code && in_the_bytes(code)) {
        char *fail = marker(v, "fail");
        write_small(fail, msg);
        free(fail);
    }
}

void jlmfs_guard_forget(jlmfs_view *v)
{
    if (shared(v))
        return;   /* keyed by content: the record is the same bytes' on every host */
    const char *ext[2] = {"busy", "fail"};
    for (int i = 0; i < 2; i++) {
        char *p = marker(v, ext[i]);
        if (p)
            unlink(p);
        free(p);
    }
}
