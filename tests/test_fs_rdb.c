/* test_fs_rdb.c - the daemon's residency database (CACHE/jlmfs.db) when it is
 * corrupt: found at mount or damaged while mounted, it is moved aside as
 * jlmfs.db.corrupt-STAMP, recreated and said in the log; stats keep being
 * served from the new one (issue 10; docs/security.md). Removed while
 * mounted, it is recreated within a flusher tick (issue 40 item 7). */
#include "tests/mntutil.h"

#include <dirent.h>

static void fini(void) { mnt_fini(); }

TestSuite(fs_rdb, .init = mnt_dirs, .fini = fini, .timeout = 60);

static void copy_model(void)
{
    size_t n;
    unsigned char *g = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(g);
    cr_assert_eq(tu_write_file(pathf("%s/m.gguf", M.src), g, n), 0);
    free(g);
}

static void write_garbage(const char *path)
{
    char junk[8192];
    memset(junk, 'Z', sizeof junk);
    cr_assert_eq(tu_write_file(path, junk, sizeof junk), 0);
}

static int corrupt_copies(void)
{
    int k = 0;
    DIR *d = opendir(M.cache);
    struct dirent *de;
    while (d && (de = readdir(d)))
        k += !strncmp(de->d_name, "jlmfs.db.corrupt-", 17);
    if (d)
        closedir(d);
    return k;
}

/* stats of m.jlm after reading blocks/B: served, and counts the read. */
static char *stats_count_a_read(int b)
{
    size_t n;
    char page[32];
    free(tu_read_file(pathf("%s/m.jlm/blocks/%d", M.mnt, b), &n));
    snprintf(page, sizeof page, "\nblocks.%d ", b);
    char *st = read_text(pathf("%s/m.jlm/stats", M.mnt));
    cr_assert(st && strstr(st, page), "stats do not mention blocks.%d after reading it:\n%s", b,
              st ? st : "(unreadable)");
    return st;
}

Test(fs_rdb, a_corrupt_database_found_at_mount_is_moved_aside_and_recreated)
{
    copy_model();
    mkdir(M.cache, 0755);
    write_garbage(pathf("%s/jlmfs.db", M.cache));
    mnt_start(0, 1);
    free(stats_count_a_read(0));   /* the daemon has started by the time it answers */
    cr_assert_eq(corrupt_copies(), 1, "the corrupt database was not moved aside");
    char *log = read_text(M.log);
    cr_assert(log && strstr(log, "moved aside to"), "the log does not say it:\n%s", log ? log : "");
    free(log);
}

Test(fs_rdb, a_database_damaged_while_mounted_is_recreated_not_served_stale)
{
    copy_model();
    mnt_start(0, 1);
    free(stats_count_a_read(0));
    write_garbage(pathf("%s/jlmfs.db", M.cache));
    char *st = stats_count_a_read(1);   /* counted in the new database, */
    cr_assert(!strstr(st, "\nblocks.0 "), "stale statistics served after the damage:\n%s", st);   /* not the old */
    free(st);
    cr_assert_eq(corrupt_copies(), 1, "the damaged database was not moved aside");
    char *log = read_text(M.log);
    cr_assert(log && strstr(log, "moved aside to"), "the log does not say it:\n%s", log ? log : "");
    free(log);
}

static int count(const char *hay, const char *needle)
{
    int k = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle))
        k++;
    return k;
}

Test(fs_rdb, a_database_removed_while_mounted_is_recreated_and_said_once)
{
    copy_model();
    mnt_start(0, 1);
    free(stats_count_a_read(0));
    const char *db = pathf("%s/jlmfs.db", M.cache);
    cr_assert_eq(unlink(db), 0);
    double t0 = now_s();
    while (access(db, F_OK) != 0) {   /* without any read: the flusher's tick finds it gone */
        cr_assert(now_s() - t0 < 5, "jlmfs.db still absent 5 s after it was removed");
        sleep_ms(50);
    }
    char *st = stats_count_a_read(1);   /* counted in the new database */
    free(st);
    sleep_ms(1200);   /* more ticks: none may say it again */
    char *log = read_text(M.log);
    cr_assert(log && count(log, "was removed while mounted") == 1, "the log should say it once:\n%s", log ? log : "");
    cr_assert_eq(corrupt_copies(), 0, "a removed database has nothing to move aside");
    free(log);
}
