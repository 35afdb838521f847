/* test_tmpdirs.c - every tu_tmpdir folder (tests/testutil.h) is removed even
 * when its test fails: the test's process removes the folders it made when it
 * exits (after the suite's fini: a failed assertion ends the test, not the
 * process), and the runner, at the end of the run, removes whatever a test
 * that crashed or timed out left: the folders are named after the runner
 * (/tmp/jlmtest.RUN.*, RUN = JLM_TEST_RUN, the runner's pid, set here before
 * any test starts). Never across a mount: rm --one-file-system, so a fixture
 * whose mount outlived a failure loses no file through it. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>

#include "tests/testutil.h"

static char **g_dirs;
static size_t g_n;
static pid_t g_owner;   /* the process that made them (a forked child never removes them) */

static void rm_tree(const char *pattern)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf --one-file-system %s 2>/dev/null", pattern);
    if (system(cmd)) {}
}

static void remove_tracked(void)
{
    if (getpid() != g_owner)
        return;
    for (size_t i = 0; i < g_n; i++) {
        char q[1100];
        snprintf(q, sizeof q, "'%s'", g_dirs[i]);
        rm_tree(q);
        free(g_dirs[i]);
    }
    free(g_dirs);
    g_dirs = NULL;
    g_n = 0;
}

void tu_tmpdir_track(const char *dir)
{
    if (!g_owner) {
        g_owner = getpid();
        atexit(remove_tracked);
    }
    if (getpid() != g_owner)
        return;
    char **n = realloc(g_dirs, (g_n + 1) * sizeof *n);
    if (!n)
        return;
    g_dirs = n;
    g_dirs[g_n] = strdup(dir);
    if (g_dirs[g_n])
        g_n++;
}

ReportHook(PRE_ALL)(struct criterion_test_set *set)
{
    (void)set;
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    setenv("JLM_TEST_RUN", pid, 1);
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    (void)stats;
    const char *run = getenv("JLM_TEST_RUN");
    if (!run || !*run || strspn(run, "0123456789") != strlen(run))
        return;
    char pat[64];
    snprintf(pat, sizeof pat, "/tmp/jlmtest.%s.*", run);
    rm_tree(pat);
}

/* The probes: tests that make a folder and then fail (an assertion) or crash
 * (abort), run only inside tmpdirs/a_failed_or_crashed_test_leaves_no_folder
 * (JLM_TMPDIRS_PROBE names the file they write their folder's name to);
 * skipped in a plain run. */
static void probe(int crash)
{
    const char *out = getenv("JLM_TMPDIRS_PROBE");
    if (!out || !*out)
        cr_skip_test("runs only inside tmpdirs/a_failed_or_crashed_test_leaves_no_folder");
    char *d = tu_tmpdir();
    char path[1100];
    snprintf(path, sizeof path, "%s/file", d);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fclose(f);
    f = fopen(out, "a");
    cr_assert(f);
    fprintf(f, "%s\n", d);
    fclose(f);
    if (crash)
        abort();
    cr_assert_fail("this probe fails on purpose");
}

Test(tmpdirs_probe, fails) { probe(0); }
Test(tmpdirs_probe, crashes) { probe(1); }

/* Runs the probes in a run of their own (this binary, --filter; BXFI_MAP
 * unset, or the run would take itself for one of this run's test workers)
 * and checks that both failed and that neither folder is left. */
Test(tmpdirs, a_failed_or_crashed_test_leaves_no_folder, .timeout = 60)
{
    char *d = tu_tmpdir(), exe[1024], cmd[4096], *log = NULL;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(d && n > 0);
    exe[n] = 0;
    snprintf(cmd, sizeof cmd, "env -u JLM_TEST_RUN -u BXFI_MAP -u CRITERION_TEST_PATTERN -u CRITERION_JOBS JLM_TMPDIRS_PROBE=%s/names '%s' --filter 'tmpdirs_probe/*' -j1 2>&1",
             d, exe);
    int rc = tu_run(cmd, &log);
    cr_assert_neq(rc, 0, "the probes fail: %s", log);
    cr_assert(strstr(log, "Crashing: 1"), "one probe crashed: %s", log);
    char path[1100], line[1100];
    snprintf(path, sizeof path, "%s/names", d);
    FILE *f = fopen(path, "r");
    cr_assert(f, "the probes ran: %s", log);
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        cr_assert(strncmp(line, "/tmp/jlmtest.", 13) == 0, "%s", line);
        cr_assert(!tu_exists(line), "%s is left after its test failed", line);
        seen++;
    }
    fclose(f);
    cr_assert_eq(seen, 2, "both probes made a folder: %s", log);
    free(log);
    tu_rmrf(d);
    free(d);
}
