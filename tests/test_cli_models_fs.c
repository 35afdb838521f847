/* test_cli_models_fs.c - `jlm list` and `jlm ps` on a jlmfs mount with a
 * running engine (tests/mntutil.h's fixture: a private SRC, mount point and
 * cache per test). */
#include <criterion/criterion.h>

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/mntutil.h"

static void fini(void) { mnt_fini(); }

TestSuite(cli_models_fs, .init = mnt_dirs, .fini = fini, .timeout = 90);

/* The line of s starting with name followed by a space, or NULL (static). */
static const char *row(const char *s, const char *name)
{
    static char line[1024];
    size_t n = strlen(name);
    for (const char *l = s; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        if (len > n && !strncmp(l, name, n) && l[n] == ' ') {
            snprintf(line, sizeof line, "%.*s", (int)len, l);
            return line;
        }
        l = e ? e + 1 : NULL;
    }
    return NULL;
}

Test(cli_models_fs, list_and_ps_show_a_mounts_model_and_the_engine_running_it)
{
    size_t n;
    unsigned char *g = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(g);
    cr_assert_eq(tu_write_file(pathf("%s/m.gguf", M.src), g, n), 0);
    free(g);
    mnt_start(0, 1);
    char cmd[4000], *o = NULL;
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/xdg' '%s' list '%s'", M.tmp, tu_jlm(), M.mnt);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    const char *r = row(o, "m.jlm");
    cr_assert(r && strstr(r, "llama") && strstr(r, "F32") && strstr(r, M.mnt), "%s", o);
    free(o);

    /* an engine on the view: a chat whose input stays open */
    snprintf(cmd, sizeof cmd, "(sleep 30 2>/dev/null | XDG_CACHE_HOME='%s/xdg' '%s' chat '%s/m.jlm' -n 1 "
             "--budget 8M >/dev/null 2>&1 &) >/dev/null 2>&1", M.tmp, tu_jlm(), M.mnt);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    long pid = 0;
    o = NULL;
    for (int i = 0; i < 200 && !pid; i++) {
        free(o);
        snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/xdg' '%s' ps '%s'", M.tmp, tu_jlm(), M.mnt);
        cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
        if ((r = row(o, "m.jlm")) && !strstr(r, "       -  "))   /* its session registered: PAGES known */
            pid = atol(r + 5);
        else
            sleep_ms(50);
    }
    cr_assert(pid > 0, "jlm ps never showed the engine:\n%s", o);
    char exe[64], got[1024] = "", *want = realpath(tu_jlm(), NULL);
    snprintf(exe, sizeof exe, "/proc/%ld/exe", pid);
    ssize_t gl = readlink(exe, got, sizeof got - 1);
    cr_assert(gl > 0 && want && !strcmp(got, want), "pid %ld is not the jlm chat: %s", pid, got);
    free(want);
    char arch[32] = "", sz[32] = "", unit[16] = "", head[1024];
    long p2 = 0;
    cr_assert(sscanf(r, "%*s %ld %31s %31s %15s", &p2, arch, sz, unit) == 4 && p2 == pid && !strcmp(arch, "llama"),
              "%s", r);
    const char *p = strstr(r, M.mnt);   /* PAGES: the last column before WHERE */
    cr_assert(p, "%s", r);
    snprintf(head, sizeof head, "%.*s", (int)(p - r), r);
    size_t hl = strlen(head);
    while (hl && head[hl - 1] == ' ')
        head[--hl] = 0;
    const char *last = strrchr(head, ' ');
    long pages = last && last[1] >= '0' && last[1] <= '9' ? atol(last + 1) : -1;
    cr_assert(pages >= 0, "no resident page count from the residency database: %s", r);
    double bv = 0;   /* BUDGET: the engine's page-frame budget, within its --budget 8M */
    char bu[16] = "";
    cr_assert(sscanf(r, "%*s %*d %*s %*s %*s %lf %15s", &bv, bu) == 2 && !strcmp(bu, "MiB") && bv > 0 && bv <= 8.0,
              "the engine's budget (--budget 8M) is not in its row: %s", r);
    free(o);
    kill((pid_t)pid, SIGTERM);
    for (int i = 0; i < 100 && kill((pid_t)pid, 0) == 0; i++)
        sleep_ms(20);
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/xdg' '%s' ps '%s'", M.tmp, tu_jlm(), M.mnt);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(!row(o, "m.jlm"), "a dead engine is still listed:\n%s", o);
    free(o);
}
