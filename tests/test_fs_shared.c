/* test_fs_shared.c - the shared-cache mode (`-o cache=DIR,shared`, issue 43,
 * docs/scale-out.md) with two daemons on one local folder, as two hosts on a
 * distributed filesystem would run (tests/twohost.sh runs them on GlusterFS
 * in two network namespaces): one conversion for both, no entry removed by
 * a view going, no database on the shared storage, no view of a source still
 * being written, and `jlm cache ls|verify` over the folder. */
#include "tests/mntutil.h"
#include "format/jlm_format.h"
#include "format/sums.h"

#include <dirent.h>
#include <sys/stat.h>

/* Host 2: its own source, mount point, database and log; the same cache. */
static mnt H2;

static void init(void)
{
    mnt_dirs();
    H2 = M;
    snprintf(H2.src, sizeof H2.src, "%s/src2", M.tmp);
    snprintf(H2.mnt, sizeof H2.mnt, "%s/mnt2", M.tmp);
    snprintf(H2.log, sizeof H2.log, "%s/jlmfs2.log", M.tmp);
    mkdir(H2.src, 0755);
    mkdir(H2.mnt, 0755);
    mkdir(M.cache, 0700);
    snprintf(M.extra, sizeof M.extra, "shared,db=%s/db1/jlmfs.db", M.tmp);
    snprintf(H2.extra, sizeof H2.extra, "shared,db=%s/db2/jlmfs.db", M.tmp);
}

/* The fixture's helpers work on M: swap host 2 in around a call. */
static void as_host2(void (*fn)(void *), void *arg)
{
    mnt one = M;
    M = H2;
    fn(arg);
    H2 = M;
    M = one;
}

static void start_slow(void *slow) { mnt_start(*(unsigned *)slow, 1); }
static void stop_it(void *unused) { mnt_stop(); }

static void fini(void)
{
    as_host2(stop_it, NULL);
    mnt_fini();
}

TestSuite(fs_shared, .init = init, .fini = fini, .timeout = 90);

/* tests/models/<model> as <dir>/<as>, with an mtime 10 s ago: settled, as a
 * source another host finished writing a while ago. */
static void put_settled(const char *dir, const char *model, const char *as)
{
    size_t n;
    unsigned char *b = tu_read_file(tu_model(model), &n);
    cr_assert(b, "%s", model);
    const char *p = pathf("%s/%s", dir, as);
    cr_assert_eq(tu_write_file(p, b, n), 0);
    free(b);
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= 10;
    t[1] = t[0];
    cr_assert_eq(utimensat(AT_FDCWD, p, t, 0), 0);
}

static int count_in(const char *path, const char *what)
{
    char *t = read_text(path);
    int k = 0;
    for (const char *s = t; s && (s = strstr(s, what)); s++)
        k++;
    free(t);
    return k;
}

/* The finished entries (*.jlm) of the cache: how many, the last one's path. */
static int entries(char *last, size_t n)
{
    DIR *d = opendir(M.cache);
    struct dirent *de;
    int k = 0;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 4 && !strcmp(de->d_name + l - 4, ".jlm")) {
            k++;
            snprintf(last, n, "%s/%s", M.cache, de->d_name);
        }
    }
    if (d)
        closedir(d);
    return k;
}

/* Both hosts up (slow conversions), m.gguf settled on both, host 1's lookup
 * plans it first and host 2's while host 1 converts. */
static void two_hosts_plan_m(void)
{
    unsigned slow = 250;
    mnt_start(slow, 1);
    as_host2(start_slow, &slow);
    put_settled(M.src, "stories260K.gguf", "m.gguf");
    put_settled(H2.src, "stories260K.gguf", "m.gguf");
    free(read_text(pathf("%s/m.jlm/status", M.mnt)));
    sleep_ms(300);
    free(read_text(pathf("%s/m.jlm/status", H2.mnt)));
}

static void wait2(void *unused) { mnt_wait_ready("m.jlm", 60); }

Test(fs_shared, two_daemons_convert_a_model_once_and_both_serve_the_bytes_of_convert)
{
    two_hosts_plan_m();
    mnt_wait_ready("m.jlm", 60);
    as_host2(wait2, NULL);
    int conv = count_in(M.log, "m.jlm: converting as host") + count_in(H2.log, "m.jlm: converting as host");
    int adopted = count_in(M.log, "converted by another host") + count_in(H2.log, "converted by another host");
    cr_assert_eq(conv, 1, "converted %d times (logs %s, %s)", conv, M.log, H2.log);
    cr_assert_eq(adopted, 1, "host 2 did not serve host 1's conversion (logs %s, %s)", M.log, H2.log);
    cr_assert_eq(count_in(H2.log, "m.jlm: waiting: host"), 1, "host 2's log does not say it waited");
    jlm_err e;
    char *ref = tu_convert("stories260K.gguf", M.tmp, "ref.jlm", &e);
    cr_assert(ref, "%s", e.msg);
    mnt_expect_view_is("m.jlm", ref);
    mnt one = M;
    M = H2;
    mnt_expect_view_is("m.jlm", ref);
    M = one;
    char entry[1024];
    cr_assert_eq(entries(entry, sizeof entry), 1, "one entry expected in %s", M.cache);
    cr_assert(!tu_exists(pathf("%s/jlmfs.db", M.cache)) && !tu_exists(pathf("%s/jlmfs.lock", M.cache)),
              "a database or a folder lock on the shared storage");
    cr_assert(tu_exists(pathf("%s/db1/jlmfs.db", M.tmp)) && tu_exists(pathf("%s/db2/jlmfs.db", M.tmp)));
    char *out = NULL;   /* jlm stats finds each host's own database through its views */
    int rc = tu_run(pathf("'%s' stats '%s/m.jlm' 2>&1", tu_jlm(), H2.mnt), &out);
    cr_assert(rc == 0 && out && strstr(out, "m.jlm"), "jlm stats on host 2: exit %d: %s", rc, out ? out : "");
    free(out);
    free(ref);
}

Test(fs_shared, a_view_dropped_on_one_host_leaves_the_entry_the_other_serves)
{
    two_hosts_plan_m();
    mnt_wait_ready("m.jlm", 60);
    as_host2(wait2, NULL);
    char entry[1024];
    cr_assert_eq(entries(entry, sizeof entry), 1);
    cr_assert_eq(unlink(pathf("%s/m.gguf", M.src)), 0);
    cr_assert(!read_text(pathf("%s/m.jlm/status", M.mnt)), "host 1 still has a view of a removed source");
    cr_assert(count_in(M.log, "m.jlm: dropped") >= 1);
    cr_assert(tu_exists(entry), "host 1's drop removed the shared entry %s", entry);
    cr_assert(tu_exists(pathf("%s.sums", entry)));
    size_t n;
    unsigned char *b = tu_read_file(pathf("%s/m.jlm/model.jlm", H2.mnt), &n);
    cr_assert(b && n > 0, "host 2 cannot read its view after host 1 dropped its own");
    free(b);
}

Test(fs_shared, a_database_on_the_shared_storage_is_refused_in_one_line)
{
    char *out = NULL;
    int rc = tu_run(pathf("timeout 5 '%s' '%s' '%s' -f -o cache='%s',shared,db='%s/x.db' 2>&1", jlmfs_bin(), M.src,
                          M.mnt, M.cache, M.cache), &out);
    cr_assert(rc == 1, "exit %d: %s", rc, out ? out : "");
    cr_assert(out && strstr(out, "inside the shared cache") && tu_count_lines(out) == 1, "%s", out ? out : "");
    cr_assert(!is_mounted(M.mnt));
    free(out);
    rc = tu_run(pathf("timeout 5 '%s' '%s' '%s' -f -o shared 2>&1", jlmfs_bin(), M.src, M.mnt), &out);
    cr_assert(rc == 2 && out && strstr(out, "needs cache=DIR"), "exit %d: %s", rc, out ? out : "");
    free(out);
}

Test(fs_shared, a_source_still_being_written_gets_no_view_until_it_settles)
{
    mnt_start(0, 1);
    mnt_copy_src("stories260K.gguf", "m.gguf");   /* mtime now: another host may still be writing it */
    mnt_copy_src("stories260K.gguf", ".n.gguf");  /* a dot name: a copy's temporary */
    cr_assert(!read_text(pathf("%s/m.jlm/status", M.mnt)), "a source modified just now got a view");
    sleep_ms(3000);
    mnt_wait_ready("m.jlm", 30);
    cr_assert(!read_text(pathf("%s/.n.jlm/status", M.mnt)), "a dot-named temporary got a view");
}

Test(fs_shared, cache_ls_and_verify_name_the_entries_and_every_bad_page)
{
    mnt_start(0, 1);
    put_settled(M.src, "stories260K.gguf", "m.gguf");
    mnt_wait_ready("m.jlm", 60);
    char *out = NULL;
    int rc = tu_run(pathf("'%s' cache ls '%s' 2>&1", tu_jlm(), M.cache), &out);
    cr_assert(rc == 0 && out && strstr(out, "m.gguf") && strstr(out, "ready") && tu_count_lines(out) == 2,
              "exit %d: %s", rc, out ? out : "");
    free(out);
    rc = tu_run(pathf("'%s' cache verify '%s' 2>&1", tu_jlm(), M.cache), &out);
    cr_assert(rc == 0 && out && strstr(out, "every page matches"), "exit %d: %s", rc, out ? out : "");
    free(out);
    char entry[1024];
    cr_assert_eq(entries(entry, sizeof entry), 1);
    jlm_header h = {0};
    jlm_err e;
    cr_assert_eq(tu_header(entry, &h, &e), 0, "%s", e.msg);
    cr_assert_eq(tu_flip(entry, h.data_off + 5, 0x10), 0);   /* block 0 */
    rc = tu_run(pathf("'%s' cache verify '%s' 2>&1", tu_jlm(), M.cache), &out);
    cr_assert(rc == 1 && out && strstr(out, "checksum mismatch in block 0"), "exit %d: %s", rc, out ? out : "");
    free(out);
}
