/* test_fs_cache.c - the cache folder as a hostile user in a shared SRC would
 * find it (issue 40 items 2 and 3; docs/security.md section 12): a folder
 * another user owns or may write is refused, links planted in it are never
 * followed, and what the daemon writes there is as private as the sources
 * (entries take their source's owner and read bits, everything else 0600,
 * the folder 0700). chown needs root: those tests skip without it. */
#include "tests/mntutil.h"

#include <dirent.h>
#include <sys/stat.h>

static void init(void) { mnt_dirs(); }

TestSuite(fs_cache, .init = init, .fini = mnt_fini, .timeout = 60);

#define NOBODY 65534

static const char *def_cache(void) { return pathf("%s/.jlmfs-cache", M.src); }

static void copy_model(const char *name)
{
    size_t n;
    unsigned char *g = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(g);
    cr_assert_eq(tu_write_file(pathf("%s/%s", M.src, name), g, n), 0);
    free(g);
}

/* `jlmfs SRC MNT -f` with the default cache: its exit status (124: it
 * mounted and ran until `timeout` stopped it) and output. */
static int run_default(char **out)
{
    return tu_run(pathf("timeout 5 '%s' '%s' '%s' -f", jlmfs_bin(), M.src, M.mnt), out);
}

static void expect_refused(const char *says)
{
    char *out = NULL;
    int rc = run_default(&out);
    cr_assert(rc != 0 && rc != 124, "exit %d: the daemon used the cache (expected a refusal): %s", rc, out ? out : "");
    cr_assert(out && strstr(out, def_cache()) && strstr(out, says), "'%s' naming %s expected: %s", says, def_cache(),
              out ? out : "");
    cr_assert(strchr(out, '\n') == out + strlen(out) - 1, "one line expected: %s", out);
    cr_assert(!is_mounted(M.mnt));
    free(out);
}

Test(fs_cache, a_cache_folder_another_user_owns_is_refused_naming_it)
{
    if (geteuid() != 0)
        cr_skip_test("needs root (chown)");
    cr_assert_eq(mkdir(def_cache(), 0700), 0);
    cr_assert_eq(chown(def_cache(), NOBODY, NOBODY), 0);
    expect_refused("belongs to uid 65534");
}

Test(fs_cache, a_cache_folder_others_may_write_is_refused_naming_it)
{
    cr_assert_eq(mkdir(def_cache(), 0700), 0);
    cr_assert_eq(chmod(def_cache(), 0777), 0);
    expect_refused("writable by others");
    cr_assert_eq(chmod(def_cache(), 0770), 0);
    expect_refused("writable by its group");
}

/* A link where the lock or the database goes points into a folder only root
 * may enter: the daemon must not create or write the file it names. */
static const char *vault_and_cache(void)
{
    const char *vault = pathf("%s/vault", M.tmp);
    cr_assert_eq(mkdir(vault, 0700), 0);
    cr_assert_eq(mkdir(def_cache(), 0700), 0);
    return vault;
}

Test(fs_cache, a_lock_link_planted_in_the_cache_stops_the_start_unfollowed)
{
    const char *vault = vault_and_cache();
    const char *lock_target = pathf("%s/lock-target", vault);
    cr_assert_eq(symlink(lock_target, pathf("%s/jlmfs.lock", def_cache())), 0);
    char *out = NULL;
    int rc = run_default(&out);
    struct stat st;
    cr_assert(lstat(lock_target, &st) != 0, "the daemon created %s through the planted jlmfs.lock link (exit %d): %s",
              lock_target, rc, out ? out : "");
    cr_assert(rc != 0 && rc != 124 && out && strstr(out, "jlmfs.lock"), "exit %d, refusal naming jlmfs.lock expected: %s",
              rc, out ? out : "");
    free(out);
}

/* The database: the mount works, without statistics, and the target stays absent. */
Test(fs_cache, a_database_link_planted_in_the_cache_is_never_followed)
{
    const char *vault = vault_and_cache();
    struct stat st;
    const char *db_target = pathf("%s/db-target", vault);
    cr_assert_eq(symlink(db_target, pathf("%s/jlmfs.db", def_cache())), 0);
    copy_model("m.gguf");
    mnt_start(0, 0);
    size_t n;
    free(tu_read_file(pathf("%s/m.jlm/blocks/0", M.mnt), &n));
    free(read_text(pathf("%s/m.jlm/stats", M.mnt)));
    sleep_ms(700);   /* a flusher tick */
    cr_assert(lstat(db_target, &st) != 0, "the daemon created %s through the planted jlmfs.db link", db_target);
    cr_assert(lstat(pathf("%s-wal", db_target), &st) != 0);
    cr_assert(lstat(pathf("%s/jlmfs.db", def_cache()), &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced");
}

/* Every file of the cache after a conversion: entries as their source (a
 * 0640 GGUF of nobody's gives a 0440 container of nobody's), the rest the
 * daemon's own and 0600 or narrower, the folder 0700. */
Test(fs_cache, entries_take_their_sources_owner_and_mode_and_the_rest_is_private)
{
    if (geteuid() != 0)
        cr_skip_test("needs root (chown)");
    copy_model("m.gguf");
    cr_assert_eq(chown(pathf("%s/m.gguf", M.src), NOBODY, NOBODY), 0);
    cr_assert_eq(chmod(pathf("%s/m.gguf", M.src), 0640), 0);
    copy_model("p.gguf");
    cr_assert_eq(chmod(pathf("%s/p.gguf", M.src), 0600), 0);
    mnt_start(0, 0);
    mnt_wait_ready("m.jlm", 30);
    mnt_wait_ready("p.jlm", 30);
    size_t n;
    free(tu_read_file(pathf("%s/m.jlm/blocks/0", M.mnt), &n));
    free(read_text(pathf("%s/m.jlm/stats", M.mnt)));   /* the database and its WAL exist by now */
    struct stat st;
    cr_assert_eq(stat(def_cache(), &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0700, "cache folder mode %03o", st.st_mode & 07777);
    DIR *d = opendir(def_cache());
    cr_assert(d);
    struct dirent *de;
    int entries = 0, others = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        cr_assert_eq(lstat(pathf("%s/%s", def_cache(), de->d_name), &st), 0);
        size_t l = strlen(de->d_name);
        int entry = l > 4 && !strcmp(de->d_name + l - 4, ".jlm");
        mode_t m = st.st_mode & 07777;
        if (entry && de->d_name[0] == 'm') {
            cr_expect(st.st_uid == NOBODY && st.st_gid == NOBODY && m == 0440, "%s: uid %u gid %u mode %03o, expected "
                      "its source's nobody:nogroup 0440", de->d_name, (unsigned)st.st_uid, (unsigned)st.st_gid, m);
        } else if (entry) {
            cr_expect(st.st_uid == 0 && m == 0400, "%s: uid %u mode %03o, expected 0400 as its 0600 source",
                      de->d_name, (unsigned)st.st_uid, m);
        } else {
            cr_expect(st.st_uid == geteuid() && !(m & 077), "%s: uid %u mode %03o, expected the daemon's, 0600 or "
                      "narrower", de->d_name, (unsigned)st.st_uid, m);
            others++;
        }
        entries += entry;
    }
    closedir(d);
    cr_assert_eq(entries, 2, "%d finished entries", entries);
    cr_assert(others >= 2, "the lock and the database expected, %d other files", others);
}

/* A cache an older daemon made (0755, a 0644 database and lock) is narrowed
 * at start, not refused: it is the daemon's own and nobody else could write it. */
Test(fs_cache, an_older_cache_of_the_daemons_own_is_narrowed)
{
    cr_assert_eq(mkdir(def_cache(), 0755), 0);
    cr_assert_eq(chmod(def_cache(), 0755), 0);
    cr_assert_eq(tu_write_file(pathf("%s/jlmfs.lock", def_cache()), "", 0), 0);
    cr_assert_eq(chmod(pathf("%s/jlmfs.lock", def_cache()), 0644), 0);
    copy_model("m.gguf");
    mnt_start(0, 0);
    mnt_wait_ready("m.jlm", 30);
    free(read_text(pathf("%s/m.jlm/stats", M.mnt)));
    struct stat st;
    cr_assert_eq(stat(def_cache(), &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0700, "cache folder mode %03o", st.st_mode & 07777);
    cr_assert_eq(stat(pathf("%s/jlmfs.lock", def_cache()), &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0600, "jlmfs.lock mode %03o", st.st_mode & 07777);
    cr_assert_eq(stat(pathf("%s/jlmfs.db", def_cache()), &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0600, "jlmfs.db mode %03o", st.st_mode & 07777);
}
