/* test_fs_soak.c - a bounded soak through a mount (issue 10): reader threads
 * read the model.jlm of two views page by page and compare every page with
 * `jlm convert` output of one of the two source models, while the main
 * thread drops, rewrites in place, renames and deletes the sources in SRC.
 * A read may fail (the view went, or failed as a whole); a page that
 * matches neither model, or a descriptor whose pages come from both, is a
 * mismatch. Then: 0 mismatches, the daemon alive and serving a fresh view
 * byte for byte. Runs SOAK_SECONDS (6) of churn. */
#include "tests/mntutil.h"

#include <pthread.h>
#include <stdatomic.h>

#define SOAK_SECONDS 6
#define READERS      3
#define PAGE         65536

static void fini(void) { mnt_fini(); }

TestSuite(fs_soak, .init = mnt_dirs, .fini = fini, .timeout = 60);

static const char *const MODEL[2] = { "stories260K.gguf", "synth-llama-256.Q4_0.gguf" };
static unsigned char *src_bytes[2], *ref[2];
static size_t src_len[2], ref_len[2];
static atomic_int stop, mismatches, pages_ok, reads_failed;
static char mismatch_msg[1400];

static void load_models(void)
{
    for (int i = 0; i < 2; i++) {
        char cmd[2400];
        snprintf(cmd, sizeof cmd, "%s convert %s -o %s/ref%d.jlm", tu_jlm(), tu_model(MODEL[i]), M.tmp, i);
        cr_assert_eq(tu_run(cmd, NULL), 0, "%s", cmd);
        ref[i] = tu_read_file(pathf("%s/ref%d.jlm", M.tmp, i), &ref_len[i]);
        src_bytes[i] = tu_read_file(tu_model(MODEL[i]), &src_len[i]);
        cr_assert(ref[i] && src_bytes[i]);
    }
}

static void mismatch(const char *what, const char *path, uint64_t off)
{
    if (atomic_fetch_add(&mismatches, 1) == 0)
        snprintf(mismatch_msg, sizeof mismatch_msg, "%s: %s at offset %llu", path, what, (unsigned long long)off);
}

/* Reads path page by page on one descriptor: every page equals the same
 * model's container at that offset, or the descriptor fails. */
static void check_file(const char *path, unsigned char *buf)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    int which = -1;
    for (uint64_t off = 0;; off += PAGE) {
        ssize_t n = pread(fd, buf, PAGE, (off_t)off);
        if (n < 0) {
            atomic_fetch_add(&reads_failed, 1);
            break;
        }
        if (n == 0)
            break;
        int m = -1;
        for (int i = 0; i < 2 && m < 0; i++)
            if ((which < 0 || which == i) && off + (uint64_t)n <= ref_len[i] && !memcmp(buf, ref[i] + off, (size_t)n))
                m = i;
        if (m < 0) {
            mismatch(which < 0 ? "a page of neither model" : "a page of the other model on the same descriptor",
                     path, off);
            break;
        }
        which = m;
        atomic_fetch_add(&pages_ok, 1);
    }
    close(fd);
}

static void *reader(void *arg)
{
    unsigned char *buf = malloc(PAGE);
    const char *names[3] = { "a", "b", "c" };
    char path[1100];   /* not pathf: its buffers are shared, these are threads */
    for (unsigned i = (unsigned)(uintptr_t)arg; !atomic_load(&stop); i++) {
        snprintf(path, sizeof path, "%s/%s.jlm/model.jlm", M.mnt, names[i % 3]);
        check_file(path, buf);
    }
    free(buf);
    return NULL;
}

/* Writes model i as SRC/name (in place: truncate and write). */
static void put(const char *name, int i)
{
    tu_write_file(pathf("%s/%s.gguf", M.src, name), src_bytes[i], src_len[i]);
}

static void churn(unsigned step)
{
    switch (step % 5) {
    case 0: put("a", (int)(step / 5) & 1); break;                      /* drop or rewrite in place */
    case 1: put("b", 1 - ((int)(step / 5) & 1)); break;
    case 2: rename(pathf("%s/a.gguf", M.src), pathf("%s/c.gguf", M.src)); break;
    case 3: unlink(pathf("%s/c.gguf", M.src)); break;
    case 4: rename(pathf("%s/b.gguf", M.src), pathf("%s/a.gguf", M.src)); break;
    }
}

Test(fs_soak, readers_see_whole_containers_while_sources_churn)
{
    load_models();
    put("a", 0);
    put("b", 1);
    mnt_start(0, 1);
    pthread_t t[READERS];
    for (uintptr_t i = 0; i < READERS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, reader, (void *)i), 0);
    double t0 = now_s();
    unsigned steps = 0;
    while (now_s() - t0 < SOAK_SECONDS) {
        churn(steps++);
        sleep_ms(40);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < READERS; i++)
        pthread_join(t[i], NULL);
    cr_log_info("soak: %u source changes, %d pages checked, %d reads failed, %d mismatches", steps,
                atomic_load(&pages_ok), atomic_load(&reads_failed), atomic_load(&mismatches));
    cr_assert_eq(atomic_load(&mismatches), 0, "%d mismatches; first: %s", atomic_load(&mismatches), mismatch_msg);
    cr_assert(is_mounted(M.mnt) && kill(M.pid, 0) == 0, "the daemon died during the soak; see %s", M.log);
    cr_assert_gt(atomic_load(&pages_ok), 0, "no page was ever read");
    put("fresh", 0);   /* still serving: a new view, byte for byte */
    size_t n = 0;
    unsigned char *got = tu_read_file(pathf("%s/fresh.jlm/model.jlm", M.mnt), &n);
    cr_assert(got && n == ref_len[0] && !memcmp(got, ref[0], n), "after the soak the daemon no longer serves a new view");
    free(got);
    for (int i = 0; i < 2; i++) {
        free(ref[i]);
        free(src_bytes[i]);
    }
}
