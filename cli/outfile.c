/* outfile.c - the checked writer of outfile.h, and stdout's write check. */
#include "cli/outfile.h"
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *jlm_cli_out_refusal(const char *path, const char *const *inputs, int n, const char *input_word)
{
    static char why[64];
    struct stat o, s;
    if (!*path)
        return "is empty";
    if (lstat(path, &o) != 0 || S_ISLNK(o.st_mode))
        return NULL;   /* new, or a link (the rename replaces the link, not its target) */
    if (!S_ISREG(o.st_mode))
        return S_ISDIR(o.st_mode) ? "is a directory" : "is not a regular file (a device, FIFO or socket)";
    for (int i = 0; i < n; i++)
        if (inputs[i] && stat(inputs[i], &s) == 0 && s.st_dev == o.st_dev && s.st_ino == o.st_ino) {
            snprintf(why, sizeof why, "is the %s itself", input_word ? input_word : "input");
            return why;
        }
    return NULL;
}

int jlm_cli_out_check(const char *who, const char *opt, const char *path, const char *const *inputs, int n,
                      const char *input_word)
{
    const char *why = jlm_cli_out_refusal(path, inputs, n, input_word);
    if (!why)
        return 0;
    jlm_cli_errorf(who, "%s%s%s: %s", opt, *opt ? " " : "", path, why);
    return 2;
}

static int out_fail(jlm_cli_out *o, int e)
{
    jlm_cli_errorf(o->who, "%s%s%s: cannot write: %s", o->opt, *o->opt ? " " : "", o->path, strerror(e));
    jlm_cli_out_abort(o);
    return 1;
}

int jlm_cli_out_open(jlm_cli_out *o, const char *who, const char *opt, const char *path,
                     const char *const *inputs, int n, const char *input_word)
{
    *o = (jlm_cli_out){.who = who, .opt = opt, .path = path};
    int rc = jlm_cli_out_check(who, opt, path, inputs, n, input_word);
    if (rc)
        return rc;
    if (asprintf(&o->part, "%s.part", path) < 0) {
        o->part = NULL;
        return out_fail(o, ENOMEM);
    }
    /* O_NOFOLLOW | O_NONBLOCK and a regular-file check: a link or a FIFO
     * planted at PATH.part is refused, never followed or waited on */
    int fd = open(o->part, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        free(o->part);
        o->part = NULL;   /* not ours to remove */
        return out_fail(o, EINVAL);
    }
    if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        free(o->part);
        o->part = NULL;
        return out_fail(o, e);
    }
    return 0;
}

int jlm_cli_out_commit(jlm_cli_out *o)
{
    int e = o->err ? o->err : ferror(o->f) ? EIO : 0;
    if (fflush(o->f) && !e)
        e = errno;
    if (!e && fsync(fileno(o->f)) && errno != EINVAL && errno != EROFS)
        e = errno;
    if (fclose(o->f) && !e)
        e = errno;
    o->f = NULL;
    if (!e && rename(o->part, o->path))
        e = errno;
    if (e)
        return out_fail(o, e);
    free(o->part);
    o->part = NULL;
    return 0;
}

void jlm_cli_out_abort(jlm_cli_out *o)
{
    if (o->f)
        fclose(o->f);
    o->f = NULL;
    if (o->part)
        unlink(o->part);
    free(o->part);
    o->part = NULL;
}

int jlm_cli_out_write(const char *who, const char *opt, const char *path, const char *const *inputs, int n,
                      const char *input_word, const void *data, size_t len)
{
    jlm_cli_out o;
    int rc = jlm_cli_out_open(&o, who, opt, path, inputs, n, input_word);
    if (rc)
        return rc;
    if (len && fwrite(data, 1, len, o.f) != len)
        o.err = errno ? errno : EIO;
    return jlm_cli_out_commit(&o);
}

/* ---------------------------------------------------------------- stdout */

static int g_out_errno, g_out_reported;

void jlm_cli_stdout_failed(int e)
{
    if (!g_out_errno)
        g_out_errno = e ? e : EIO;
}

void jlm_cli_stdout_flush(void)
{
    errno = 0;
    if (fflush(stdout))
        jlm_cli_stdout_failed(errno);
}

int jlm_cli_put_stdout(void *ctx, const char *p, size_t n, jlm_err *err)
{
    (void)ctx;
    errno = 0;
    if (fwrite(p, 1, n, stdout) == n && fflush(stdout) == 0)
        return 0;
    jlm_cli_stdout_failed(errno);
    return jlm_errf(err, JLM_EIO, "stdout: write failed");
}

static int stdout_report(const char *who)
{
    if (!g_out_errno)
        return 0;
    if (!g_out_reported)
        jlm_cli_errorf(who, "stdout: write failed: %s", strerror(g_out_errno));
    g_out_reported = 1;
    return 1;
}

int jlm_cli_stdout_check(const char *who)
{
    errno = 0;
    if (fflush(stdout))
        jlm_cli_stdout_failed(errno);
    if (ferror(stdout))
        jlm_cli_stdout_failed(errno);
    return stdout_report(who);
}

int jlm_cli_stdout_close(const char *who)
{
    if (jlm_cli_stdout_check(who))
        return 1;
    errno = 0;
    if (fclose(stdout) && errno != EBADF)   /* EBADF: started with stdout closed, nothing written */
        jlm_cli_stdout_failed(errno);
    return stdout_report(who);
}
