/* mntutil.h - the jlmfs mount fixture shared by the fs suites: a private
 * SRC/mount point/cache per test, the built `jlmfs` (sibling of $JLM_BIN)
 * started in the foreground and stopped in .fini. Header-only (static), one
 * fixture M per suite file. */
#ifndef JLM_MNTUTIL_H
#define JLM_MNTUTIL_H

#include <criterion/criterion.h>

#include "tests/testutil.h"

#include <fcntl.h>
#include <stdarg.h>
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>

typedef struct mnt {
    char *tmp, src[512], mnt[512], cache[512], log[512];
    char extra[256];   /* more -o options for the next mnt_start ("": none) */
    pid_t pid;
} mnt;

static mnt M;

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline const char *jlmfs_bin(void)
{
    static char b[1024];
    snprintf(b, sizeof b, "%s", tu_jlm());
    char *s = strrchr(b, '/');
    snprintf(s ? s + 1 : b, sizeof b - (size_t)(s ? s + 1 - b : 0), "jlmfs");
    return b;
}

static inline int is_mounted(const char *dir)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[4096];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        char a[64], b[64], c[64], root[1024], mp[1024];
        if (sscanf(line, "%63s %63s %63s %1023s %1023s", a, b, c, root, mp) == 5 && !strcmp(mp, dir))
            found = 1;
    }
    if (f)
        fclose(f);
    return found;
}

static inline void mnt_dirs(void)
{
    M.tmp = tu_tmpdir();
    cr_assert(M.tmp, "cannot create a temp dir");
    snprintf(M.src, sizeof M.src, "%s/src", M.tmp);
    snprintf(M.mnt, sizeof M.mnt, "%s/mnt", M.tmp);
    snprintf(M.cache, sizeof M.cache, "%s/cache", M.tmp);
    snprintf(M.log, sizeof M.log, "%s/jlmfs.log", M.tmp);
    mkdir(M.src, 0755);
    mkdir(M.mnt, 0755);
}

/* Starts `jlmfs SRC MNT -f [-o cache=CACHE]` (slow_ms: the test hook) and
 * waits up to 10 s for the mount to appear. */
static inline void mnt_start(unsigned slow_ms, int own_cache)
{
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork failed");
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char slow[32];
        snprintf(slow, sizeof slow, "%u", slow_ms);
        setenv("JLMFS_TEST_SLOW_MS", slow, 1);
        setenv("JLMFS_CHECK", "1", 1);   /* the daemon aborts on a broken invariant */
        int fd = open(M.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); }
        char opt[600];
        snprintf(opt, sizeof opt, "cache=%s", M.cache);
        char *argv[10] = {"jlmfs", M.src, M.mnt, "-f"};
        int n = 4;
        if (own_cache) { argv[n++] = "-o"; argv[n++] = opt; }
        if (M.extra[0]) { argv[n++] = "-o"; argv[n++] = M.extra; }
        execv(jlmfs_bin(), argv);
        _exit(127);
    }
    M.pid = pid;
    double t0 = now_s();
    while (!is_mounted(M.mnt)) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            M.pid = 0;
            cr_assert_fail("jlmfs exited before mounting (status %d); see %s", st, M.log);
        }
        cr_assert(now_s() - t0 < 10, "mount did not appear within 10 s");
        sleep_ms(20);
    }
}

static inline void mnt_stop(void)
{
    if (M.mnt[0] && is_mounted(M.mnt)) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "fusermount3 -u -z '%s' 2>/dev/null", M.mnt);
        if (system(cmd)) {}
    }
    if (M.pid > 0) {
        kill(M.pid, SIGTERM);
        double t0 = now_s();
        while (waitpid(M.pid, NULL, WNOHANG) == 0) {
            if (now_s() - t0 > 5) {
                kill(M.pid, SIGKILL);
                waitpid(M.pid, NULL, 0);
                break;
            }
            sleep_ms(10);
        }
        M.pid = 0;
    }
}

static inline void mnt_fini(void)
{
    mnt_stop();
    tu_rmrf(M.tmp);
    free(M.tmp);
    M.tmp = NULL;
}

/* A path in a rotating static buffer (8 live at once). */
static inline char *pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline char *pathf(const char *fmt, ...)
{
    static char buf[8][1024];
    static int i;
    char *b = buf[i++ & 7];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, 1024, fmt, ap);
    va_end(ap);
    return b;
}

/* A whole file as a NUL-terminated string; NULL if unreadable. */
static inline char *read_text(const char *path)
{
    size_t n;
    char *t = (char *)tu_read_file(path, &n);
    if (t) {
        char *z = realloc(t, n + 1);
        if (z) { z[n] = 0; t = z; }
    }
    return t;
}

/* Waits up to limit_s for MNT/view/status to say "ready" (an error fails). */
static inline void mnt_wait_ready(const char *view, double limit_s)
{
    double t0 = now_s();
    for (;;) {
        char *s = read_text(pathf("%s/%s/status", M.mnt, view));
        int ready = s && !strncmp(s, "ready", 5);
        cr_assert(!s || strncmp(s, "error", 5), "%s: status '%s', expected ready", view, s);
        free(s);
        if (ready)
            return;
        cr_assert(now_s() - t0 < limit_s, "%s not ready within %.0f s", view, limit_s);
        sleep_ms(20);
    }
}

/* tests/models/<model> copied to SRC/<as> (beside the mount, not through it). */
static inline void mnt_copy_src(const char *model, const char *as)
{
    size_t n;
    unsigned char *b = tu_read_file(tu_model(model), &n);
    cr_assert(b, "%s", model);
    cr_assert_eq(tu_write_file(pathf("%s/%s", M.src, as), b, n), 0);
    free(b);
}

/* Every byte of MNT/<view>/model.jlm equals the file ref's. */
static inline void mnt_expect_view_is(const char *view, const char *ref)
{
    size_t a = 0, b = 0;
    unsigned char *x = tu_read_file(ref, &a), *y = tu_read_file(pathf("%s/%s/model.jlm", M.mnt, view), &b);
    cr_assert(x && y && a == b && !memcmp(x, y, a), "%s/model.jlm differs from %s", view, ref);
    free(x);
    free(y);
}

#endif
