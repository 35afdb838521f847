/* test_fs_fault.c - fault injection through the daemon's I/O seam
 * (jlmfs_opts.io, base/io.h): EIO and ENOSPC at every write of a conversion
 * in turn. Whatever write fails, the view's status says why, no read returns
 * bytes other than `jlm convert`'s (a read either matches or fails), and the
 * daemon keeps serving another view. In process, no mount, no workers
 * (reads pack on demand), like test_fs_io.c. Issue 10; docs/security.md. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs/jlmfs.h"
#include "tests/testutil.h"

static int n_writes;     /* pwrite calls to m's cache file so far */
static int fail_at;      /* the pwrite call (1-based) that fails; 0: none */
static int fail_errno;
/* What the fail_at-th write does: fails with fail_errno; writes half its
 * bytes (a short write); writes nothing (returns 0); or is interrupted
 * (EINTR) before writing. */
enum { F_ERRNO, F_SHORT, F_ZERO, F_EINTR };
static int fault_kind;

/* Is fd m.gguf's cache file (CACHE/m@<key>.jlm.part)? The fault is aimed at
 * m's conversion only; other's, which a worker may run first, always pass. */
static int is_m(int fd)
{
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t l = readlink(link, path, sizeof path - 1);
    if (l <= 0)
        return 0;
    path[l] = 0;
    return strstr(path, "/cache/m@") != NULL;
}

static ssize_t faulty_pwrite(int fd, const void *b, size_t n, int64_t o)
{
    if (is_m(fd) && ++n_writes == fail_at) {
        switch (fault_kind) {
        case F_SHORT:
            return jlm_io_posix.pwrite(fd, b, n > 1 ? n / 2 : n, o);
        case F_ZERO:
            return 0;
        case F_EINTR:
            errno = EINTR;
            return -1;
        default:
            errno = fail_errno;
            return -1;
        }
    }
    return jlm_io_posix.pwrite(fd, b, n, o);
}

static char *tmp;
static unsigned char *ref[2];
static size_t ref_len[2];
static const char *const MODEL[2] = { "stories260K.gguf", "synth-llama-256.Q4_0.gguf" };
static const char *const VIEW[2] = { "/m.jlm/model.jlm", "/other.jlm/model.jlm" };

static void setup(void)
{
    tmp = tu_tmpdir();
    cr_assert(tmp);
    for (int i = 0; i < 2; i++) {
        char cmd[1400], path[1200];
        snprintf(path, sizeof path, "%s/ref%d.jlm", tmp, i);
        snprintf(cmd, sizeof cmd, "%s convert %s -o %s", tu_jlm(), tu_model(MODEL[i]), path);
        cr_assert_eq(tu_run(cmd, NULL), 0, "%s", cmd);
        ref[i] = tu_read_file(path, &ref_len[i]);
        cr_assert(ref[i]);
    }
}

static void fini(void)
{
    tu_rmrf(tmp);
    free(tmp);
    free(ref[0]);
    free(ref[1]);
}

TestSuite(fs_fault, .init = setup, .fini = fini, .timeout = 120);

/* A fresh SRC (m.gguf, other.gguf) and cache under tmp/run, opened through
 * the faulty seam. */
static jlmfs *open_fs(const jlm_io *io)
{
    char src[900], path[1300];
    snprintf(src, sizeof src, "%s/run", tmp);
    tu_rmrf(src);
    cr_assert_eq(mkdir(src, 0755), 0);
    snprintf(src, sizeof src, "%s/run/src", tmp);
    cr_assert_eq(mkdir(src, 0755), 0);
    for (int i = 0; i < 2; i++) {
        size_t n;
        unsigned char *g = tu_read_file(tu_model(MODEL[i]), &n);
        cr_assert(g);
        snprintf(path, sizeof path, "%s/%s", src, i ? "other.gguf" : "m.gguf");
        cr_assert_eq(tu_write_file(path, g, n), 0);
        free(g);
    }
    char cache[1000];
    snprintf(cache, sizeof cache, "%s/run/cache", tmp);
    jlmfs_opts o = {.src = src, .cache = cache, .n_workers = 1, .io = io};
    jlmfs *fs = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlmfs_open(&o, &fs, &err), 0, "%s", err.msg);
    return fs;
}

/* Reads view v in 64 KiB pieces: each read matches `jlm convert` or fails
 * (or the file is gone: the view failed). Returns how many failed. */
static int read_view(jlmfs *fs, int v, int fault)
{
    jlmfs_node node = {0};
    jlm_err err = {0};
    int rc = jlmfs_resolve(fs, VIEW[v], &node, &err);
    if (rc && fault)   /* a view in ERROR serves only its status (jlmfs.h invariant 4) */
        return 1;
    cr_assert_eq(rc, 0, "%s", err.msg);
    unsigned char *got = malloc(65536);
    int failed = 0;
    for (size_t off = 0; off < ref_len[v]; off += 65536) {
        size_t g = 0, want = ref_len[v] - off < 65536 ? ref_len[v] - off : 65536;
        int rc = jlmfs_read(fs, &node, got, 65536, off, &g, &err);
        if (rc) {
            cr_assert(rc == JLM_EIO || rc == JLM_ENOSPC, "fault %d: read at %zu: rc %d (%s)", fault, off, rc, err.msg);
            failed++;
            continue;
        }
        cr_assert(g == want && !memcmp(got, ref[v] + off, g),
                  "fault at write %d (%s): torn page: the read at %zu (%zu bytes) differs from jlm convert", fault,
                  strerror(fail_errno), off, g);
    }
    free(got);
    jlmfs_node_clear(&node);
    return failed;
}

static char *status_of(jlmfs *fs, const char *path)
{
    jlmfs_node node = {0};
    jlm_err err = {0};
    char *s = NULL;
    size_t n;
    cr_assert_eq(jlmfs_resolve(fs, path, &node, &err), 0, "%s", err.msg);
    cr_assert_eq(jlmfs_text(fs, &node, &s, &n, &err), 0, "%s", err.msg);
    jlmfs_node_clear(&node);
    return s;
}

/* Waits (<= 20 s) until m's status is no longer "converting". */
static void wait_settled(jlmfs *fs)
{
    for (int i = 0; i < 2000; i++) {
        char *st = status_of(fs, "/m.jlm/status");
        int busy = !strncmp(st, "converting", 10);
        free(st);
        if (!busy)
            return;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    cr_assert_fail("the conversion did not settle within 20 s");
}

/* One run with the fault at write k: reads of m, its status, then other.
 * worker: the background conversion writes (and finishes) first. */
static void run_with_fault(int k, int e, int worker)
{
    jlm_io io = jlm_io_posix;
    io.pwrite = faulty_pwrite;
    n_writes = 0;
    fail_at = k;
    fail_errno = e;
    jlmfs *fs = open_fs(&io);
    if (worker) {
        jlm_err err = {0};
        cr_assert_eq(jlmfs_start(fs, &err), 0, "%s", err.msg);
        wait_settled(fs);
    }
    int failed = read_view(fs, 0, k);
    failed += read_view(fs, 0, k);   /* again: a failed unit is never served as done */
    char *st = status_of(fs, "/m.jlm/status");
    if (fault_kind == F_SHORT || fault_kind == F_EINTR) {   /* the write loop carries on: nothing fails */
        cr_assert(failed == 0 && strncmp(st, "error", 5) && (!worker || !strncmp(st, "ready", 5)),
                  "%s at write %d: %d reads failed, status %s", fault_kind == F_SHORT ? "a short write" : "EINTR", k,
                  failed, st);
    } else if (failed || (worker && strncmp(st, "ready", 5))) {
        const char *why = e == ENOSPC ? "no space left in cache" : "Input/output error";
        cr_assert(!strncmp(st, "error: ", 7) && strstr(st, why),
                  "fault at write %d (%s): %d reads failed, the status does not say why: %s", k, strerror(e),
                  failed, st);
    }
    free(st);
    fail_at = 0;
    cr_assert_eq(read_view(fs, 1, k), 0, "fault at write %d: the other view stopped serving", k);
    jlmfs_close(fs);
}

static void every_write_kind(int kind, int e, int worker)
{
    fault_kind = kind;
    jlm_io io = jlm_io_posix;
    io.pwrite = faulty_pwrite;
    n_writes = 0;
    fail_at = 0;
    jlmfs *fs = open_fs(&io);
    cr_assert_eq(read_view(fs, 0, 0), 0);
    int total = n_writes;
    jlmfs_close(fs);
    cr_assert_gt(total, 1, "the conversion wrote through the seam %d times", total);
    static const char *const kinds[] = {NULL, "a short write", "a write of nothing", "EINTR"};
    cr_log_info("%s: a fault at each of %d writes", kind ? kinds[kind] : strerror(e), total);
    for (int k = 1; k <= total; k++)
        run_with_fault(k, e, worker);
    fault_kind = F_ERRNO;
}

static void every_write(int e, int worker) { every_write_kind(F_ERRNO, e, worker); }

Test(fs_fault, eio_at_every_write_of_an_on_demand_conversion)
{
    every_write(EIO, 0);
}

Test(fs_fault, enospc_at_every_write_of_an_on_demand_conversion)
{
    every_write(ENOSPC, 0);
}

Test(fs_fault, eio_at_every_write_of_the_background_conversion)
{
    every_write(EIO, 1);
}

Test(fs_fault, enospc_at_every_write_of_the_background_conversion)
{
    every_write(ENOSPC, 1);
}

/* A short write or EINTR at any write: jlm_io_pwrite_full carries on, the
 * conversion completes with jlm convert's bytes. A write of nothing (0 bytes
 * returned) fails the view as EIO does. */
Test(fs_fault, a_short_write_at_every_write_of_an_on_demand_conversion)
{
    every_write_kind(F_SHORT, 0, 0);
}

Test(fs_fault, a_short_write_at_every_write_of_the_background_conversion)
{
    every_write_kind(F_SHORT, 0, 1);
}

Test(fs_fault, eintr_at_every_write_of_the_background_conversion)
{
    every_write_kind(F_EINTR, 0, 1);
}

Test(fs_fault, a_write_of_nothing_at_every_write_of_an_on_demand_conversion)
{
    every_write_kind(F_ZERO, EIO, 0);
}

Test(fs_fault, a_write_of_nothing_at_every_write_of_the_background_conversion)
{
    every_write_kind(F_ZERO, EIO, 1);
}

/* ---------------------------------------------------------------- fsync and rename of the finished entry */
static int fail_sync_errno, fail_rename_errno;

static int faulty_fsync(int fd)
{
    if (fail_sync_errno && is_m(fd)) {
        errno = fail_sync_errno;
        return -1;
    }
    return jlm_io_posix.fsync(fd);
}

static int faulty_rename(const char *a, const char *b)
{
    if (fail_rename_errno && strstr(a, "/cache/m@")) {
        errno = fail_rename_errno;
        return -1;
    }
    return jlm_io_posix.rename(a, b);
}

/* m's entries in the cache: finished (*.jlm) and unfinished (*.jlm.part). */
static void m_entries(int *done, int *part)
{
    char cmd[1200], *out = NULL;
    snprintf(cmd, sizeof cmd, "ls '%s/run/cache'", tmp);
    cr_assert_eq(tu_run(cmd, &out), 0);
    *done = *part = 0;
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n")) {
        size_t n = strlen(l);
        if (strncmp(l, "m@", 2))
            continue;
        *done += n > 4 && !strcmp(l + n - 4, ".jlm");
        *part += n > 9 && !strcmp(l + n - 9, ".jlm.part");
    }
    free(out);
}

/* Every 64 KiB read of model.jlm through a node resolved before the fault:
 * how many matched jlm convert (a torn page fails the test) and how many
 * failed (EIO). */
static void read_held(jlmfs *fs, const jlmfs_node *node, int *ok, int *failed)
{
    unsigned char *got = malloc(65536);
    jlm_err err = {0};
    *ok = *failed = 0;
    for (size_t off = 0; off < ref_len[0]; off += 65536) {
        size_t g = 0, want = ref_len[0] - off < 65536 ? ref_len[0] - off : 65536;
        int rc = jlmfs_read(fs, node, got, 65536, off, &g, &err);
        if (rc) {
            cr_assert_eq(rc, JLM_EIO, "read at %zu: rc %d (%s)", off, rc, err.msg);
            (*failed)++;
            continue;
        }
        cr_assert(g == want && !memcmp(got, ref[0] + off, g), "torn page: the read at %zu differs from jlm convert",
                  off);
        (*ok)++;
    }
    free(got);
}

/* Waits (<= 20 s) until m's status starts with what. */
static int wait_status(jlmfs *fs, const char *what)
{
    for (int i = 0; i < 2000; i++) {
        char *st = status_of(fs, "/m.jlm/status");
        int got = !strncmp(st, what, strlen(what));
        free(st);
        if (got)
            return 1;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* The background conversion of m fails at the fsync or the rename that
 * finish its entry: the status says which and why, nothing of m is left in
 * the cache, a descriptor (node) held from before reads jlm convert's bytes
 * or EIO, and EIO for every page once the view failed (never a page of a
 * failed conversion next to an error), and the other view serves on. A full
 * cache (ENOSPC) is retried once it has room: with the fault gone, m becomes
 * ready and serves its bytes. */
static void finish_fault(int sync_e, int rename_e, const char *says)
{
    jlm_io io = jlm_io_posix;
    io.fsync = faulty_fsync;
    io.rename = faulty_rename;
    fail_sync_errno = sync_e;
    fail_rename_errno = rename_e;
    fail_at = 0;
    jlmfs *fs = open_fs(&io);
    jlm_err err = {0};
    jlmfs_node held = {0};
    cr_assert_eq(jlmfs_resolve(fs, VIEW[0], &held, &err), 0, "%s", err.msg);
    int ok, failed;
    read_held(fs, &held, &ok, &failed);   /* on demand, before the worker: all of it matches */
    cr_assert(ok > 0 && failed == 0, "before the fault: %d reads matched, %d failed", ok, failed);
    cr_assert_eq(jlmfs_start(fs, &err), 0, "%s", err.msg);
    wait_settled(fs);
    char *st = status_of(fs, "/m.jlm/status");
    cr_assert(!strncmp(st, "error: ", 7) && strstr(st, says), "status '%s', expected an error naming '%s'", st, says);
    free(st);
    int done, part;
    m_entries(&done, &part);
    cr_assert(done == 0 && part == 0, "after a failed %s: %d finished and %d .part entries of m left", says, done, part);
    read_held(fs, &held, &ok, &failed);
    cr_assert(ok == 0 && failed > 0, "after the failed %s the held descriptor read %d pages, %d failed", says, ok,
              failed);
    jlmfs_node_clear(&held);
    cr_assert(read_view(fs, 0, 1) >= 0);
    cr_assert_eq(read_view(fs, 1, 0), 0, "the other view stopped serving");
    fail_sync_errno = fail_rename_errno = 0;
    if (sync_e == ENOSPC || rename_e == ENOSPC) {   /* the fault gone = space back: retried (every 2 s) */
        cr_assert(wait_status(fs, "ready"), "a full cache at the %s was not retried once it had room", says);
        cr_assert_eq(read_view(fs, 0, 0), 0, "after the retry m does not serve jlm convert's bytes");
        m_entries(&done, &part);
        cr_assert(done == 1 && part == 0, "after the retry: %d finished and %d .part entries of m", done, part);
    }
    jlmfs_close(fs);
}

Test(fs_fault, eio_at_the_fsync_of_a_finished_conversion)
{
    finish_fault(EIO, 0, "fsync: Input/output error");
}

Test(fs_fault, enospc_at_the_fsync_of_a_finished_conversion)
{
    finish_fault(ENOSPC, 0, "fsync: No space left on device");
}

Test(fs_fault, eio_at_the_rename_of_a_finished_conversion)
{
    finish_fault(0, EIO, "rename: Input/output error");
}

Test(fs_fault, enospc_at_the_rename_of_a_finished_conversion)
{
    finish_fault(0, ENOSPC, "rename: No space left on device");
}

/* ---------------------------------------------------------------- a source replaced while its entry is finished */
static jlmfs *drop_fs;   /* the daemon the fsync hook drops m's view in */
static int drop_fired;

/* At the fsync that starts finishing m's entry (every unit written): m.gguf
 * is replaced by a rename (the other model, written aside), the next lookup
 * drops the view (kill unlinks its entry's names), and the sidecar's name
 * is taken (a folder at its .part), so the step of finish that writes and
 * loads the sidecar fails on the dropped view, as it does when kill unlinks
 * the sidecar between its write and its load (the CI race of
 * fs_switch::descriptors_at_a_source_switch_see_one_version_each). */
static int dropping_fsync(int fd)
{
    char link[64], part[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t l = readlink(link, part, sizeof part - 1);
    if (drop_fired || !is_m(fd) || l < 10)
        return jlm_io_posix.fsync(fd);
    part[l] = 0;
    char *dot = strstr(part, ".jlm.part");
    if (!dot)
        return jlm_io_posix.fsync(fd);
    drop_fired = 1;
    char aside[1200], src[1200];
    snprintf(aside, sizeof aside, "%s/run/src/.m.tmp", tmp);
    snprintf(src, sizeof src, "%s/run/src/m.gguf", tmp);
    size_t n;
    unsigned char *g = tu_read_file(tu_model(MODEL[1]), &n);
    int ok = g && !tu_write_file(aside, g, n) && !rename(aside, src);
    free(g);
    jlmfs_node node = {0};
    jlm_err err = {0};
    ok = ok && !jlmfs_resolve(drop_fs, VIEW[0], &node, &err);   /* the new version: the old view is dropped */
    jlmfs_node_clear(&node);
    strcpy(dot, ".jlm.sums.part");
    ok = ok && !mkdir(part, 0700);
    if (!ok)
        drop_fired = -1;
    return jlm_io_posix.fsync(fd);
}

/* A descriptor (node) of m held from before reads m's old version whole
 * (POSIX: a source replaced by a rename is whole and unchanged) even when
 * the view is dropped while its entry is being finished: the entry is gone
 * with the view, the bytes are not. The lookup after the switch serves the
 * new version. */
Test(fs_fault, a_view_dropped_while_its_entry_is_finished_serves_its_old_descriptors)
{
    jlm_io io = jlm_io_posix;
    io.fsync = dropping_fsync;
    drop_fired = 0;
    jlmfs *fs = drop_fs = open_fs(&io);
    jlm_err err = {0};
    jlmfs_node held = {0};
    cr_assert_eq(jlmfs_resolve(fs, VIEW[0], &held, &err), 0, "%s", err.msg);
    int ok, failed;
    read_held(fs, &held, &ok, &failed);   /* every unit packed on demand: the worker only finishes */
    cr_assert(ok > 0 && failed == 0, "before the switch: %d reads matched, %d failed", ok, failed);
    cr_assert_eq(jlmfs_start(fs, &err), 0, "%s", err.msg);
    /* the worker finishes the old view, then converts the new one (one worker, in order) */
    cr_assert(wait_status(fs, "ready"), "the new version of m never became ready");
    cr_assert_eq(drop_fired, 1, "the hook did not drop the view at the fsync of its entry");
    read_held(fs, &held, &ok, &failed);
    cr_assert(failed == 0, "the old version's descriptor failed %d of %d reads after its view was dropped", failed,
              ok + failed);
    jlmfs_node_clear(&held);
    cr_assert_eq(read_view(fs, 1, 0), 0, "the other view stopped serving");
    jlmfs_close(fs);
    drop_fs = NULL;
}
