/* testutil.h - helpers shared by the Criterion suites: fixture paths, temp
 * dirs, whole-file reads and running the `jlm` binary. Header-only (static)
 * so each suite stays one file. */
#ifndef JLM_TESTUTIL_H
#define JLM_TESTUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "converter/convert.h"
#include "format/jlm_format.h"

/* Repo root (JLM_ROOT, set by `make test`; else "."). */
static inline const char *tu_root(void)
{
    const char *r = getenv("JLM_ROOT");
    return r && *r ? r : ".";
}

/* "<root>/tests/models/<name>" in a static rotating buffer. */
static inline const char *tu_model(const char *name)
{
    static char buf[8][1024];
    static int i;
    char *b = buf[i++ & 7];
    snprintf(b, 1024, "%s/tests/models/%s", tu_root(), name);
    return b;
}

/* tests/test_tmpdirs.c: removes a tu_tmpdir folder when the test's process
 * exits, however the test ended (passed, failed an assertion); the runner
 * removes what a crashed or timed-out test left (its JLM_TEST_RUN folders). */
void tu_tmpdir_track(const char *dir);

/* A fresh private temp dir, /tmp/jlmtest.RUN.XXXXXX (RUN: the suite runner's
 * pid, JLM_TEST_RUN; /tmp/jlmtest.XXXXXX outside the suite). The caller
 * removes it with tu_rmrf when done; if the test fails first, the process's
 * exit or the runner's end removes it (tests/test_tmpdirs.c). */
static inline char *tu_tmpdir(void)
{
    const char *run = getenv("JLM_TEST_RUN");
    char *t = NULL;
    if (asprintf(&t, "/tmp/jlmtest.%s%sXXXXXX", run && *run ? run : "", run && *run ? "." : "") < 0)
        return NULL;
    if (!mkdtemp(t)) {
        free(t);
        return NULL;
    }
    tu_tmpdir_track(t);
    return t;
}

static inline void tu_rmrf(const char *dir)
{
    if (!dir)
        return;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

static inline int tu_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Reads a whole file; NULL on error. A NUL follows the *len bytes, so a text
 * file can be searched as a string. */
static inline unsigned char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0)
        n = 0;
    unsigned char *b = malloc((size_t)n + 1);
    if (b)
        b[n] = 0;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b && len)
        *len = (size_t)n;
    return b;
}

static inline int tu_write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* Lines in s (its '\n's). */
static inline int tu_count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

/* Path of the jlm binary (JLM_BIN, set by `make test`). */
static inline const char *tu_jlm(void)
{
    const char *b = getenv("JLM_BIN");
    return b && *b ? b : "build/jlm";
}

/* Runs a shell command, capturing stdout+stderr into *out (malloc'd) if out is
 * non-NULL. Returns the exit status, or 128+signal. */
static inline int tu_run(const char *cmd, char **out)
{
    char *full = NULL;
    if (asprintf(&full, "%s 2>&1", cmd) < 0)
        return -1;
    FILE *p = popen(full, "r");
    free(full);
    if (!p)
        return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += r;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) break;
            buf = nb;
        }
    }
    if (buf) buf[len] = 0;
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
}

/* Converts tests/models/<gguf> to "<dir>/<name>" through the library; the
 * path (malloc'd), or NULL with err set. */
static inline char *tu_convert(const char *gguf, const char *dir, const char *name, jlm_err *err)
{
    char *out = NULL;
    jlm_conv *c = NULL;
    if (asprintf(&out, "%s/%s", dir, name) < 0)
        return NULL;
    int rc = jlm_conv_open(tu_model(gguf), NULL, &c, err);
    if (!rc)
        rc = jlm_conv_write(c, out, NULL, NULL, NULL, err);
    jlm_conv_close(c);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* Flips the bits of mask in the byte at off of path, in place (the same
 * inode: a daemon holding it open reads the change). 0, or -1. */
static inline int tu_flip(const char *path, uint64_t off, unsigned char mask)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    unsigned char c;
    int ok = fd >= 0 && pread(fd, &c, 1, (off_t)off) == 1 && (c ^= mask, pwrite(fd, &c, 1, (off_t)off) == 1);
    if (fd >= 0)
        close(fd);
    return ok ? 0 : -1;
}

/* The header of the container at path; 0, or a JLM_E* code with err set. */
static inline int tu_header(const char *path, jlm_header *h, jlm_err *err)
{
    jlm_model *m = NULL;
    int rc = jlm_fmt_open(path, &m, err);
    if (!rc)
        *h = m->hdr;
    jlm_fmt_close(m);
    return rc;
}

#endif
