/* test_fs_io.c - the jlmfs daemon's cache-file I/O goes through the jlm_io
 * seam (base/io.h): short transfers and EINTR give the converted bytes, a full
 * disk gives JLM_ENOSPC naming the cache file. In process, no mount, no
 * worker threads (jlmfs_start is not called: reads pack on demand). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fs/jlmfs.h"
#include "tests/testutil.h"

static int io_calls;
static int fail_errno;   /* nonzero: every pwrite fails with it */

/* At most 999 bytes per call, EINTR on every third call. */
static ssize_t choppy_pwrite(int fd, const void *b, size_t n, int64_t o)
{
    if (fail_errno) { errno = fail_errno; return -1; }
    if (++io_calls % 3 == 0) { errno = EINTR; return -1; }
    return jlm_io_posix.pwrite(fd, b, n > 999 ? 999 : n, o);
}
static ssize_t choppy_pread(int fd, void *b, size_t n, int64_t o)
{
    if (++io_calls % 3 == 0) { errno = EINTR; return -1; }
    return jlm_io_posix.pread(fd, b, n > 777 ? 777 : n, o);
}

static char *tmp;
static jlmfs *fs;

static void open_fs(const jlm_io *io)
{
    tmp = tu_tmpdir();
    cr_assert(tmp);
    char src[1100], path[1200];
    snprintf(src, sizeof src, "%s/src", tmp);
    cr_assert_eq(mkdir(src, 0755), 0);
    size_t n;
    unsigned char *g = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(g);
    snprintf(path, sizeof path, "%s/m.gguf", src);
    cr_assert_eq(tu_write_file(path, g, n), 0);
    free(g);
    jlmfs_opts o = {.src = src, .n_workers = 1, .io = io};
    jlm_err err = {0};
    cr_assert_eq(jlmfs_open(&o, &fs, &err), 0, "%s", err.msg);
}

static void fini(void)
{
    jlmfs_close(fs);
    fs = NULL;
    tu_rmrf(tmp);
    free(tmp);
    tmp = NULL;
    fail_errno = 0;
    io_calls = 0;
}

TestSuite(fs_io, .fini = fini, .timeout = 60);

Test(fs_io, short_transfers_and_eintr_through_the_seam_give_the_converted_bytes)
{
    jlm_io io = jlm_io_posix;
    io.pwrite = choppy_pwrite;
    io.pread = choppy_pread;
    open_fs(&io);
    char cmd[1400], ref_path[1200];
    snprintf(ref_path, sizeof ref_path, "%s/ref.jlm", tmp);
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s", tu_jlm(), tu_model("stories260K.gguf"), ref_path);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    size_t ref_len;
    unsigned char *ref = tu_read_file(ref_path, &ref_len);
    cr_assert(ref);

    jlmfs_node node = {0};
    jlm_err err = {0};
    cr_assert_eq(jlmfs_resolve(fs, "/m.jlm/model.jlm", &node, &err), 0, "%s", err.msg);
    unsigned char *got = malloc(ref_len + 1);
    size_t total = 0, g;
    for (int pass = 0; pass < 2; pass++) {   /* first packs (pwrite), second reads the cache (pread) */
        total = 0;
        do {
            cr_assert_eq(jlmfs_read(fs, &node, got + total, 65536, total, &g, &err), 0, "%s", err.msg);
            total += g;
        } while (g && total <= ref_len);
        cr_assert_eq(total, ref_len);
        cr_assert(!memcmp(got, ref, ref_len), "pass %d: bytes differ from jlm convert", pass);
    }
    cr_assert_gt(io_calls, 100, "the seam was bypassed (%d calls)", io_calls);
    jlmfs_node_clear(&node);
    free(got);
    free(ref);
}

Test(fs_io, a_full_disk_while_packing_a_page_is_enospc_naming_the_cache_file)
{
    jlm_io io = jlm_io_posix;
    io.pwrite = choppy_pwrite;
    fail_errno = ENOSPC;
    open_fs(&io);
    jlmfs_node node = {0};
    jlm_err err = {0};
    cr_assert_eq(jlmfs_resolve(fs, "/m.jlm/model.jlm", &node, &err), 0, "%s", err.msg);
    unsigned char buf[4096];
    size_t g = 0;
    int rc = jlmfs_read(fs, &node, buf, sizeof buf, 0, &g, &err);
    cr_assert_eq(rc, JLM_ENOSPC, "rc %d: %s", rc, err.msg);
    cr_assert(strstr(err.msg, ".part") && strstr(err.msg, "no space left in cache (need "), "%s", err.msg);
    jlmfs_node_clear(&node);
}
