/* test_fs_switch.c - a view's source replaced under open descriptors (issue
 * 10, the torn reads of the full-size soak, docs/security.md section 11).
 *
 * Each round: SRC/m.gguf is model X; a descriptor D opened on
 * m.jlm/model.jlm reads its first page; X is replaced by model Y (written
 * aside, renamed over m.gguf); then, released at one barrier, two threads
 * open m.jlm/model.jlm afresh and read it whole while D reads on. Every
 * descriptor must see one model as a whole: D only X's pages up to X's end
 * (or an error from some page on, never a page of Y, zeros, or an early end),
 * the fresh ones only Y's. Many short rounds overlap the reads at the switch,
 * where one kernel inode shared by both versions mixed their pages. */
#include "tests/mntutil.h"

#include <pthread.h>
#include <stdatomic.h>

#define PAGE   65536
#define ROUNDS 200
#define FRESH  2

static void fini(void) { mnt_fini(); }

TestSuite(fs_switch, .init = mnt_dirs, .fini = fini, .timeout = 120);

static const char *const MODEL[2] = { "stories260K.gguf", "synth-llama-256.Q4_0.gguf" };
static unsigned char *src_bytes[2], *ref[2];
static size_t src_len[2], ref_len[2];

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

/* SRC/m.gguf becomes model i: by a rename over it (a new inode), or
 * rewritten in place (truncated and written: the same inode). */
static void replace(int i, int in_place)
{
    if (in_place) {
        cr_assert_eq(tu_write_file(pathf("%s/m.gguf", M.src), src_bytes[i], src_len[i]), 0);
        return;
    }
    char *aside = pathf("%s/.m.tmp", M.src);
    cr_assert_eq(tu_write_file(aside, src_bytes[i], src_len[i]), 0);
    cr_assert_eq(rename(aside, pathf("%s/m.gguf", M.src)), 0);
}

typedef struct reader {
    int fd;                  /* -1: open the path itself */
    int want;                /* the model every page must be */
    uint64_t from;           /* first offset to read */
    char path[1100];
    pthread_barrier_t *go;
    /* results */
    uint64_t got;            /* bytes matched */
    int failed;              /* a read failed (allowed) */
    char bad[300];           /* a tear: what was seen */
} reader;

static void *read_all(void *arg)
{
    reader *r = arg;
    unsigned char *buf = malloc(PAGE);
    pthread_barrier_wait(r->go);
    int fd = r->fd >= 0 ? r->fd : open(r->path, O_RDONLY);
    if (fd < 0) {
        r->failed = errno;
        free(buf);
        return NULL;
    }
    const unsigned char *want = ref[r->want];
    uint64_t len = ref_len[r->want], off = r->from;
    for (;;) {
        ssize_t n = pread(fd, buf, PAGE, (off_t)off);
        if (n < 0) {
            r->failed = errno;
            break;
        }
        if (n == 0) {
            if (off != len)
                snprintf(r->bad, sizeof r->bad, "end of file at %llu, model %d has %llu bytes",
                         (unsigned long long)off, r->want, (unsigned long long)len);
            break;
        }
        if (off + (uint64_t)n > len || memcmp(buf, want + off, (size_t)n)) {
            int other = off + (uint64_t)n <= ref_len[1 - r->want] && !memcmp(buf, ref[1 - r->want] + off, (size_t)n);
            snprintf(r->bad, sizeof r->bad, "%zd bytes at %llu are not model %d's%s", n, (unsigned long long)off,
                     r->want, other ? " (they are the other model's)" : "");
            break;
        }
        r->got += (uint64_t)n;
        off += (uint64_t)n;
    }
    if (r->fd < 0)
        close(fd);
    free(buf);
    return NULL;
}

Test(fs_switch, descriptors_at_a_source_switch_see_one_version_each)
{
    load_models();
    cr_assert_neq(ref_len[0], ref_len[1]);
    replace(0, 0);
    mnt_start(0, 1);
    const char *model = pathf("%s/m.jlm/model.jlm", M.mnt);
    char mpath[1100];
    snprintf(mpath, sizeof mpath, "%s", model);
    int old_failed = 0, old_whole = 0, fresh_whole = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int x = round & 1, y = 1 - x, in_place = (round & 2) != 0;
        /* D on version X: its first page read (and the kernel's cache warm) */
        int fd = open(mpath, O_RDONLY);
        cr_assert(fd >= 0, "round %d: open %s: %s", round, mpath, strerror(errno));
        unsigned char *page = malloc(PAGE);
        ssize_t n = pread(fd, page, PAGE, 0);
        cr_assert(n == PAGE && !memcmp(page, ref[x], PAGE), "round %d: the first page is not model %d's", round, x);
        free(page);
        replace(y, in_place);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 1 + FRESH);
        reader r[1 + FRESH];
        memset(r, 0, sizeof r);
        r[0] = (reader){.fd = fd, .want = x, .from = PAGE, .go = &go};
        for (int i = 1; i <= FRESH; i++) {
            r[i] = (reader){.fd = -1, .want = y, .go = &go};
            snprintf(r[i].path, sizeof r[i].path, "%s", mpath);
        }
        pthread_t t[1 + FRESH];
        for (int i = 0; i <= FRESH; i++)
            cr_assert_eq(pthread_create(&t[i], NULL, read_all, &r[i]), 0);
        for (int i = 0; i <= FRESH; i++)
            pthread_join(t[i], NULL);
        pthread_barrier_destroy(&go);
        close(fd);
        for (int i = 0; i <= FRESH; i++)
            cr_assert(!r[i].bad[0], "round %d, %s descriptor: %s", round, i ? "a fresh" : "the old", r[i].bad);
        /* replaced by a rename, the old version is whole and unchanged: its
         * descriptor keeps it (POSIX). Rewritten in place, a conversion
         * still running fails as a whole (EIO from then on). */
        cr_assert(in_place || !r[0].failed, "round %d: the old descriptor failed after %llu bytes: %s", round,
                  (unsigned long long)r[0].got, strerror(r[0].failed));
        old_failed += r[0].failed != 0;
        old_whole += !r[0].failed;
        for (int i = 1; i <= FRESH; i++) {
            cr_assert(!r[i].failed, "round %d: a fresh descriptor of the new version failed: %s", round,
                      strerror(r[i].failed));
            fresh_whole++;
        }
    }
    cr_log_info("fs_switch: %d rounds; old descriptors: %d whole, %d failed; %d fresh reads whole", ROUNDS, old_whole,
                old_failed, fresh_whole);
    cr_assert(is_mounted(M.mnt) && kill(M.pid, 0) == 0, "the daemon died; see %s", M.log);
    for (int i = 0; i < 2; i++) {
        free(ref[i]);
        free(src_bytes[i]);
    }
}
