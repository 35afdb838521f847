/* test_fs_rename.c - renames and rewrites under a mount (issue 10): a GGUF
 * renamed through the mount moves its view (the old name is gone at once, the
 * new one converts, no stale cache entry is left), one renamed over another
 * shows the new model to fresh opens, a renamed folder takes its views with
 * it, an open descriptor keeps reading the one version it opened; and a source
 * rewritten in place under a running conversion fails every page of the old
 * view's open descriptors, those the kernel had cached too (explicit
 * invalidation: fuse_invalidate_path). Unmounted in .fini (tests/mntutil.h). */
#include <criterion/criterion.h>

#include "tests/testutil.h"
#include "tests/mntutil.h"

#include <errno.h>
#include <fcntl.h>

static void init(void) { mnt_dirs(); }

TestSuite(fs_rename, .init = init, .fini = mnt_fini, .timeout = 90);

static void copy_model(const char *model, const char *to)
{
    size_t n;
    unsigned char *b = tu_read_file(tu_model(model), &n);
    cr_assert(b, "cannot read %s", model);
    cr_assert(tu_write_file(to, b, n) == 0, "writing %s failed", to);
    free(b);
}

/* `jlm convert` of a test model: its bytes. */
static unsigned char *reference(const char *model, size_t *len)
{
    const char *out = pathf("%s/%s.ref.jlm", M.tmp, model);
    char *o = NULL;
    int rc = tu_run(pathf("'%s' convert '%s' -o '%s'", tu_jlm(), tu_model(model), out), &o);
    cr_assert(rc == 0, "jlm convert %s: %s", model, o ? o : "");
    free(o);
    unsigned char *b = tu_read_file(out, len);
    cr_assert(b);
    return b;
}

static char *status_of(const char *view)
{
    return read_text(pathf("%s/%s/status", M.mnt, view));
}

static void expect_file(const char *path, const unsigned char *ref, size_t len)
{
    size_t n = 0;
    unsigned char *b = tu_read_file(path, &n);
    cr_assert(b && n == len && !memcmp(b, ref, len), "%s (%zu bytes) differs from the reference (%zu bytes)", path, n, len);
    free(b);
}

static void expect_fd(int fd, const unsigned char *ref, size_t len, const char *what)
{
    unsigned char *b = malloc(len + 1);
    size_t got = 0;
    ssize_t r;
    while ((r = pread(fd, b + got, len + 1 - got, (off_t)got)) > 0)
        got += (size_t)r;
    cr_assert(r == 0 && got == len && !memcmp(b, ref, len), "%s: read %zu bytes (last: %zd, %s), differs from the reference",
              what, got, r, r < 0 ? strerror(errno) : "ok");
    free(b);
}

static int gone(const char *path)
{
    struct stat st;
    return stat(path, &st) != 0 && errno == ENOENT;
}

/* Cache entries (finished or not) whose name starts with prefix. */
static int entries(const char *prefix)
{
    char *out = NULL;
    cr_assert(tu_run(pathf("ls '%s'", M.cache), &out) == 0);
    int n = 0;
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n"))
        n += !strncmp(l, prefix, strlen(prefix)) && strstr(l, ".jlm") && !strstr(l, ".busy") && !strstr(l, ".fail") &&
             !strstr(l, ".sums");   /* a checksum sidecar goes with its entry */
    free(out);
    return n;
}

Test(fs_rename, a_renamed_gguf_moves_its_view_and_leaves_nothing_stale)
{
    size_t na, nb;
    unsigned char *ra = reference("stories260K.gguf", &na), *rb = reference("synth-llama-256.Q4_0.gguf", &nb);
    mnt_start(0, 1);
    copy_model("stories260K.gguf", pathf("%s/a.gguf", M.mnt));
    mnt_wait_ready("a.jlm", 20);
    int fd = open(pathf("%s/a.jlm/model.jlm", M.mnt), O_RDONLY);
    cr_assert(fd >= 0);
    cr_assert(pread(fd, (char[4096]){0}, 4096, 0) == 4096);
    cr_assert(entries("a@") == 1);

    cr_assert(rename(pathf("%s/a.gguf", M.mnt), pathf("%s/b.gguf", M.mnt)) == 0, "%s", strerror(errno));
    cr_assert(gone(pathf("%s/a.jlm", M.mnt)), "a.jlm still there after the rename");
    cr_assert(entries("a@") == 0, "the old name's cache entry outlived the rename");
    mnt_wait_ready("b.jlm", 20);
    expect_file(pathf("%s/b.jlm/model.jlm", M.mnt), ra, na);
    expect_fd(fd, ra, na, "the descriptor opened before the rename");   /* POSIX: it keeps its file */
    close(fd);

    /* another model renamed over b.gguf: fresh opens see it, never b's old pages */
    fd = open(pathf("%s/b.jlm/model.jlm", M.mnt), O_RDONLY);
    cr_assert(fd >= 0);
    expect_fd(fd, ra, na, "b.jlm before the second rename");   /* its pages now in the kernel's cache */
    copy_model("synth-llama-256.Q4_0.gguf", pathf("%s/c.gguf", M.mnt));
    mnt_wait_ready("c.jlm", 20);
    cr_assert(rename(pathf("%s/c.gguf", M.mnt), pathf("%s/b.gguf", M.mnt)) == 0);
    cr_assert(gone(pathf("%s/c.jlm", M.mnt)));
    mnt_wait_ready("b.jlm", 20);
    expect_file(pathf("%s/b.jlm/model.jlm", M.mnt), rb, nb);
    expect_fd(fd, ra, na, "the descriptor opened before b.gguf was replaced");
    close(fd);
    cr_assert(entries("b@") == 1 && entries("c@") == 0, "stale entries: b %d, c %d", entries("b@"), entries("c@"));
    free(ra);
    free(rb);
}

Test(fs_rename, a_renamed_folder_takes_its_views_with_it)
{
    size_t na;
    unsigned char *ra = reference("stories260K.gguf", &na);
    mnt_start(0, 1);
    cr_assert(mkdir(pathf("%s/d", M.mnt), 0755) == 0);
    copy_model("stories260K.gguf", pathf("%s/d/x.gguf", M.mnt));
    mnt_wait_ready("d/x.jlm", 20);
    cr_assert(entries("d%x@") == 1);
    cr_assert(rename(pathf("%s/d", M.mnt), pathf("%s/e", M.mnt)) == 0);
    /* dropped at the rename, not at the next lookup of the old path (which nobody may make) */
    cr_assert(entries("d%x@") == 0, "the entry of d/x.gguf outlived the folder's rename");
    cr_assert(gone(pathf("%s/d/x.jlm", M.mnt)));
    mnt_wait_ready("e/x.jlm", 20);
    expect_file(pathf("%s/e/x.jlm/model.jlm", M.mnt), ra, na);
    free(ra);
}

Test(fs_rename, a_source_rewritten_under_a_conversion_fails_even_cached_pages)
{
    copy_model("stories260K.gguf", pathf("%s/m.gguf", M.src));
    mnt_start(400, 1);   /* 400 ms before each page: the conversion is still running below */
    int fd = open(pathf("%s/m.jlm/model.jlm", M.mnt), O_RDONLY);
    cr_assert(fd >= 0, "%s", strerror(errno));
    char page[4096], again[4096];
    cr_assert(pread(fd, page, sizeof page, 0) == (ssize_t)sizeof page);   /* packed on demand, now in the kernel's cache */
    char *s = status_of("m.jlm");
    cr_assert(s && !strncmp(s, "converting", 10), "status '%s'", s ? s : "(none)");
    free(s);
    /* rewritten in place (same inode), directly in SRC */
    int w = open(pathf("%s/m.gguf", M.src), O_WRONLY | O_APPEND);
    cr_assert(w >= 0 && write(w, "tail", 4) == 4 && close(w) == 0);
    free(status_of("m.jlm"));   /* the lookup replaces the view; the old one fails */
    double t0 = now_s();
    ssize_t r;
    while ((r = pread(fd, again, sizeof again, 0)) > 0 && now_s() - t0 < 3)
        sleep_ms(20);
    cr_assert(r < 0 && errno == EIO, "the old descriptor still reads its cached first page (%zd): a page of a "
              "view whose source changed under it", r);
    r = pread(fd, again, sizeof again, 8192);
    cr_assert(r < 0 && errno == EIO, "an uncached page: %zd", r);
    close(fd);
}
