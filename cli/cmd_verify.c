/* cmd_verify.c - `jlm verify MODEL`: every span of a container checked
 * against its checksum sidecar MODEL.sums (format/sums.h,
 * docs/checksums.md). Exit 0: every span matches; 1: some do not (each
 * named on stderr) or the container cannot be read; 2: no sidecar, or one
 * that does not pair with the container (or usage). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/report.h"
#include "format/jlm_format.h"
#include "format/sums.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WHO "jlm verify"

/* Loads the sidecar of the container open at fd (size bytes): 0, or the exit
 * status after one line. */
static int load(int fd, const char *file, uint64_t size, jlm_sums **sums)
{
    uint8_t hb[JLM_HEADER_LEN];
    if (size < sizeof hb || pread(fd, hb, sizeof hb, 0) != (ssize_t)sizeof hb) {
        jlm_cli_errorf(WHO, "%s: %llu bytes, no jlm container", jlm_cli_clean(file), (unsigned long long)size);
        return 2;
    }
    char *sp = jlm_sums_path(file);
    jlm_err err = {0};
    int rc = sp ? jlm_sums_load(AT_FDCWD, sp, hb, size, sums, &err) : jlm_errf(&err, JLM_ENOMEM, "out of memory");
    free(sp);
    if (rc)
        jlm_cli_error(WHO, err.msg);
    return rc == JLM_ENOMEM || rc == JLM_EIO ? 1 : rc ? 2 : 0;
}

/* Checks every span; returns the number that do not match, -1 on a read error. */
static long check_all(int fd, const char *file, jlm_sums *s)
{
    uint64_t max = 0;
    for (uint32_t i = 0; i < s->n; i++)
        max = s->spans[i].len > max ? s->spans[i].len : max;
    uint8_t *buf = malloc(max ? max : 1);
    if (!buf)
        return jlm_cli_error(WHO, "out of memory"), -1;
    long bad = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const jlm_span *sp = &s->spans[i];
        if (pread(fd, buf, sp->len, (off_t)sp->off) != (ssize_t)sp->len) {
            jlm_cli_errorf(WHO, "%s: cannot read bytes %llu+%llu", jlm_cli_clean(file),
                           (unsigned long long)sp->off, (unsigned long long)sp->len);
            free(buf);
            return -1;
        }
        jlm_err err = {0};
        if (jlm_sums_check(s, i, buf, sp->len, file, NULL, &err)) {
            jlm_cli_error(WHO, err.msg);
            bad++;
        }
    }
    free(buf);
    return bad;
}

int jlm_cli_verify_file(const char *file)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        jlm_cli_errorf(WHO, "%s: %s", jlm_cli_clean(file), fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return 1;
    }
    jlm_sums *s = NULL;
    int rc = load(fd, file, (uint64_t)st.st_size, &s);
    long bad = rc ? 0 : check_all(fd, file, s);
    if (!rc && bad >= 0)
        printf("%s: %u spans, %ld do not match\n", jlm_cli_clean(file), s->n, bad);
    rc = rc ? rc : bad ? 1 : 0;
    jlm_sums_free(s);
    close(fd);
    return rc;
}

int jlm_cmd_verify(int argc, char **argv)
{
    const char *pos[1] = {0};
    jlm_opts_spec os = {WHO, "MODEL.jlm   (exit 0: every page matches MODEL.jlm.sums, 1: some do not, 2: no sidecar "
                        "or another container's)", NULL, 0, pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (os.n_pos != 1) {
        jlm_opts_help(stderr, &os);
        return 2;
    }
    char *file = jlm_cli_container_path(pos[0]);   /* a view directory: its model.jlm */
    if (!file)
        return jlm_cli_error(WHO, "out of memory"), 1;
    int rc = jlm_cli_verify_file(file);
    free(file);
    return rc;
}
