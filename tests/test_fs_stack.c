/* test_fs_stack.c - jlmfs next to jlmfs, and writers inside a mount (issue
 * 15): a second daemon whose mount point is (or is inside) a jlmfs mount, or
 * whose SRC is inside one or already mounted, is refused naming the existing
 * mount, and the mount table is left as it was; `jlm convert MNT/x.gguf -o
 * MNT/y.jlm` works through the passthrough (it sizes its output with
 * ftruncate + posix_fallocate, which failed with "sizing ... Bad file
 * descriptor" before the mount had fallocate). Unmounted in .fini. */
#include <criterion/criterion.h>

#include "tests/testutil.h"
#include "tests/mntutil.h"
#include "format/jlm_format.h"

#include <errno.h>
#include <fcntl.h>

static void init(void) { mnt_dirs(); }

TestSuite(fs_stack, .init = init, .fini = mnt_fini, .timeout = 60);

/* How many mounts /proc/self/mountinfo lists at dir. */
static int mounts_at(const char *dir)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        char a[64], b[64], c[64], root[1024], mp[1024];
        n += sscanf(line, "%63s %63s %63s %1023s %1023s", a, b, c, root, mp) == 5 && !strcmp(mp, dir);
    }
    if (f)
        fclose(f);
    return n;
}

/* `jlmfs SRC MNT -f -o cache=...`: exit status, output in *out. */
static int second_jlmfs(const char *src, const char *mnt, char **out)
{
    return tu_run(pathf("timeout 10 '%s' '%s' '%s' -f -o cache='%s/cache2'", jlmfs_bin(), src, mnt, M.tmp), out);
}

Test(fs_stack, a_second_jlmfs_on_or_over_a_jlmfs_mount_is_refused_naming_it)
{
    mnt_start(0, 1);
    const char *other = pathf("%s/other", M.tmp);
    cr_assert(mkdir(other, 0755) == 0);
    cr_assert(mkdir(pathf("%s/sub", M.mnt), 0755) == 0);
    struct { const char *src, *mnt, *says; } cases[] = {
        {other, M.mnt, "already the jlmfs mount"},                  /* MNT is a jlmfs mount */
        {other, pathf("%s/sub", M.mnt), "inside the jlmfs mount"},  /* MNT inside one */
        {M.mnt, other, "inside the jlmfs mount"},                   /* SRC is a jlmfs mount */
        {M.src, other, "already mounted by jlmfs at"},              /* SRC already served */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int rc = second_jlmfs(cases[i].src, cases[i].mnt, &out);
        cr_assert(rc == 1, "case %zu: exit %d (expected 1): %s", i, rc, out ? out : "");
        cr_assert(out && strstr(out, cases[i].says) && strstr(out, M.mnt), "case %zu: '%s' naming %s expected: %s", i,
                  cases[i].says, M.mnt, out ? out : "");
        cr_assert(!strchr(out, '\n') || strchr(out, '\n') == out + strlen(out) - 1, "case %zu: one line: %s", i, out);
        free(out);
    }
    cr_assert(mounts_at(M.mnt) == 1, "a second mount stacked on %s", M.mnt);
    cr_assert(mounts_at(other) == 0 && mounts_at(pathf("%s/sub", M.mnt)) == 0);
    cr_assert(!tu_exists(pathf("%s/cache2", M.tmp)), "a refused daemon made a cache");
}

/* A mount inside its own source made `ls SRC/inner/inner` wait on the
 * daemon forever (it looked its own mount up); the source inside the mount
 * point is hidden from the daemon by the mount. Both refused at start, one
 * line, nothing mounted (exit 124 here: it mounted and ran until timeout). */
Test(fs_stack, a_mount_point_inside_its_source_or_around_it_is_refused)
{
    const char *inner = pathf("%s/inner", M.src);
    cr_assert(mkdir(inner, 0755) == 0);
    const char *outer = pathf("%s/outer", M.tmp), *osrc = pathf("%s/outer/src", M.tmp);
    cr_assert(mkdir(outer, 0755) == 0 && mkdir(osrc, 0755) == 0);
    struct { const char *src, *mnt, *says, *names; } cases[] = {
        {M.src, inner, "is inside the source", inner},
        {M.src, M.src, "is the source itself", M.src},
        {osrc, outer, "is inside the mount point", osrc},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int rc = second_jlmfs(cases[i].src, cases[i].mnt, &out);
        cr_assert(rc == 1, "case %zu: exit %d (expected 1): %s", i, rc, out ? out : "");
        cr_assert(out && strstr(out, cases[i].says) && strstr(out, cases[i].names), "case %zu: '%s' naming %s "
                  "expected: %s", i, cases[i].says, cases[i].names, out ? out : "");
        cr_assert(strchr(out, '\n') == out + strlen(out) - 1, "case %zu: one line: %s", i, out);
        cr_assert_eq(mounts_at(cases[i].mnt), 0, "case %zu: something was mounted", i);
        free(out);
    }
}

Test(fs_stack, jlm_convert_writes_its_output_through_the_mount)
{
    mnt_start(0, 1);
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b && tu_write_file(pathf("%s/s.gguf", M.mnt), b, n) == 0);
    free(b);
    char *out = NULL;
    int rc = tu_run(pathf("'%s' convert '%s/s.gguf' -o '%s/out.jlm'", tu_jlm(), M.mnt, M.mnt), &out);
    cr_assert(rc == 0, "jlm convert inside the mount: exit %d: %s", rc, out ? out : "");
    free(out);
    rc = tu_run(pathf("'%s' convert '%s' -o '%s/ref.jlm'", tu_jlm(), tu_model("stories260K.gguf"), M.tmp), &out);
    cr_assert(rc == 0, "%s", out ? out : "");
    free(out);
    size_t na = 0, nb = 0;
    unsigned char *x = tu_read_file(pathf("%s/out.jlm", M.src), &na), *y = tu_read_file(pathf("%s/ref.jlm", M.tmp), &nb);
    cr_assert(x && y && na == nb && !memcmp(x, y, na), "the container written through the mount differs");
    free(x);
    free(y);
    cr_assert(!tu_exists(pathf("%s/out.jlm.part", M.src)), "a .part left behind");
}

Test(fs_stack, fallocate_and_ftruncate_work_on_a_file_written_through_the_mount)
{
    mnt_start(0, 1);
    int fd = open(pathf("%s/f.bin", M.mnt), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0, "create: %s", strerror(errno));
    cr_assert(ftruncate(fd, 100000) == 0, "ftruncate: %s", strerror(errno));
    int e = posix_fallocate(fd, 0, 200000);
    cr_assert(e == 0, "posix_fallocate on a write-only descriptor: %s", strerror(e));
    cr_assert(fallocate(fd, 0, 200000, 4096) == 0, "fallocate: %s", strerror(errno));
    cr_assert(pwrite(fd, "x", 1, 5) == 1);
    cr_assert(close(fd) == 0);
    struct stat st;
    cr_assert(stat(pathf("%s/f.bin", M.src), &st) == 0 && st.st_size == 204096, "size %lld", (long long)st.st_size);
    /* a view file is not writable, so not allocatable either */
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b && tu_write_file(pathf("%s/s.gguf", M.mnt), b, n) == 0);
    free(b);
    cr_assert(open(pathf("%s/s.jlm/model.jlm", M.mnt), O_WRONLY) < 0 && errno == EROFS);
}

/* The daemon's log (-f: stderr, here M.log): the mount, a view converting and
 * ready, a bad source's error, a removed source's drop, the unmount; names
 * with control bytes escaped. */
Test(fs_stack, the_log_says_mounts_conversions_errors_and_drops)
{
    mnt_start(0, 1);
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b && tu_write_file(pathf("%s/s.gguf", M.mnt), b, n) == 0);
    free(b);
    cr_assert(tu_write_file(pathf("%s/bad\x01.gguf", M.mnt), "not a gguf at all", 17) == 0);
    double t0 = now_s();
    char *st = NULL;
    while (!(st = read_text(pathf("%s/s.jlm/status", M.mnt))) || strncmp(st, "ready", 5)) {
        free(st);
        cr_assert(now_s() - t0 < 20, "s.jlm not ready");
        sleep_ms(20);
    }
    free(st);
    free(read_text(pathf("%s/bad\x01.jlm/status", M.mnt)));
    cr_assert(unlink(pathf("%s/s.gguf", M.mnt)) == 0);
    /* unmounted alone (no SIGTERM racing the teardown): the daemon exits by itself */
    cr_assert(system(pathf("fusermount3 -u '%s'", M.mnt)) == 0);
    for (t0 = now_s(); waitpid(M.pid, NULL, WNOHANG) == 0; sleep_ms(10))
        cr_assert(now_s() - t0 < 10, "the daemon did not exit after the unmount");
    M.pid = 0;
    char *log = read_text(M.log);
    cr_assert(log, "no log");
    const char *want[] = {"jlmfs: mounted (cache ", "jlmfs: s.jlm: converting s.gguf (1.2 MiB)",
                          "jlmfs: s.jlm: ready (1.2 MiB converted in ", "jlmfs: bad?.jlm: error: ",
                          "jlmfs: s.jlm: dropped (s.gguf was removed", "jlmfs: unmounted"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(log, want[i]), "the log lacks '%s':\n%s", want[i], log);
    cr_assert(!strchr(log, '\x01'), "a control byte reached the log");
    free(log);
}

Test(fs_stack, version_names_the_format_and_the_build)
{
    char *out = NULL;
    int rc = tu_run(pathf("'%s' --version", jlmfs_bin()), &out);
    cr_assert(rc == 0 && out, "exit %d", rc);
    char want[64];
    snprintf(want, sizeof want, "(.jlm format %u)\n", (unsigned)JLM_VERSION);
    cr_assert(!strncmp(out, "jlmfs version ", 14) && strstr(out, want), "%s", out);
    cr_assert(strstr(out, "\nbuild: ") && strstr(out, ", libfuse 3.") && strstr(out, ", sqlite "), "%s", out);
    free(out);
}
