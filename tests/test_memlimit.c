/* test_memlimit.c - the automatic budget's inputs (engine/memlimit.h): the
 * parsers on their own, then jlm_memlimit_read over fake /proc and
 * /sys/fs/cgroup trees (v1, v2, hybrid, nested limits, a container whose
 * cgroup path is not under the mount, malformed files), and `jlm run` taking
 * its budget from a fake tree through $JLM_MEM_ROOT. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/memlimit.h"
#include "tests/testutil.h"

#define MiB (1ull << 20)

/* ---------------------------------------------------------------- fake trees */
static void put(const char *root, const char *rel, const char *text)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        mkdir(p, 0755);
        *s = '/';
    }
    FILE *f = fopen(p, "w");
    cr_assert(f, "cannot create %s", p);
    fputs(text, f);
    fclose(f);
}

static const char MEMINFO[] = "MemTotal:       32000000 kB\nMemFree:         1000000 kB\n"
                              "MemAvailable:    8000000 kB\nBuffers:          100 kB\n";

/* ---------------------------------------------------------------- parsers */
Test(memlimit, parses_limit_values_and_refuses_junk)
{
    uint64_t v = 0;
    cr_assert_eq(jlm_memlimit_parse_value("max\n", 4, &v), 0);
    cr_assert_eq(v, UINT64_MAX, "'max' is no limit");
    cr_assert_eq(jlm_memlimit_parse_value("536870912\n", 10, &v), 0);
    cr_assert_eq(v, 536870912ull);
    cr_assert_eq(jlm_memlimit_parse_value("9223372036854771712\n", 20, &v), 0);
    cr_assert_eq(v, UINT64_MAX, "v1's PAGE_COUNTER_MAX is no limit");
    const char *bad[] = {"", "\n", "-1\n", "12k\n", "0x10", "99999999999999999999999\n", "1 2\n", "maxi"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(jlm_memlimit_parse_value(bad[i], strlen(bad[i]), &v), -1, "'%s' is refused", bad[i]);
}

Test(memlimit, finds_the_v2_path_and_the_v1_memory_path_in_proc_self_cgroup)
{
    char v2[64], v1[64];
    const char *t = "9:name=systemd:/\n4:cpu,memory:/process_api/abc\n1:cpu:/x\n0::/user.slice/s1\n";
    jlm_memlimit_parse_cgroup(t, strlen(t), v2, sizeof v2, v1, sizeof v1);
    cr_assert_str_eq(v2, "/user.slice/s1");
    cr_assert_str_eq(v1, "/process_api/abc");
    const char *t2 = "0::/\n";   /* pure v2, a namespaced container */
    jlm_memlimit_parse_cgroup(t2, strlen(t2), v2, sizeof v2, v1, sizeof v1);
    cr_assert_str_eq(v2, "/");
    cr_assert_str_eq(v1, "");
    const char *t3 = "4:memoryx:/no\n10::/v2-but-not-id-0\n0::relative\n:::\n\n0::";
    jlm_memlimit_parse_cgroup(t3, strlen(t3), v2, sizeof v2, v1, sizeof v1);
    cr_assert_str_eq(v2, "", "no absolute v2 path in '%s'", v2);
    cr_assert_str_eq(v1, "", "'memoryx' is not the memory controller");
    char small[4];
    jlm_memlimit_parse_cgroup("0::/long/path", 13, small, sizeof small, v1, sizeof v1);
    cr_assert_str_eq(small, "", "a path longer than the buffer is dropped, not cut");
}

Test(memlimit, reads_MemAvailable_in_bytes)
{
    cr_assert_eq(jlm_memlimit_parse_meminfo(MEMINFO, strlen(MEMINFO)), 8000000ull * 1024);
    cr_assert_eq(jlm_memlimit_parse_meminfo("MemTotal: 5 kB\n", 15), 0, "absent: 0");
    cr_assert_eq(jlm_memlimit_parse_meminfo("MemAvailable: 12 MB\n", 20), 0, "another unit: 0");
    cr_assert_eq(jlm_memlimit_parse_meminfo("MemAvailable:\n", 14), 0);
}

/* ---------------------------------------------------------------- trees */
Test(memlimit, takes_the_smallest_v2_limit_on_the_path_up_to_the_mount)
{
    char *r = tu_tmpdir();
    put(r, "proc/self/cgroup", "0::/a/b\n");
    put(r, "proc/meminfo", MEMINFO);
    put(r, "sys/fs/cgroup/memory.max", "max\n");
    put(r, "sys/fs/cgroup/a/memory.max", "1073741824\n");
    put(r, "sys/fs/cgroup/a/b/memory.max", "max\n");
    jlm_memlimit m;
    jlm_err err = {0};
    cr_assert_eq(jlm_memlimit_read(r, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m.cg_limit, 1073741824ull, "the parent's 1 GiB binds the child (got %llu)",
                 (unsigned long long)m.cg_limit);
    cr_assert_eq(m.cg_version, 2);
    cr_assert(strstr(m.cg_file, "sys/fs/cgroup/a/memory.max"), "%s", m.cg_file);
    cr_assert_eq(m.mem_available, 8000000ull * 1024);
    uint64_t head = 0, b = jlm_memlimit_budget(&m, &head);
    cr_assert_eq(head, 48 * MiB + (1ull << 30) / 16);
    cr_assert_eq(b, (1ull << 30) - head, "the limit (below MemAvailable) less the headroom");
    tu_rmrf(r);
    free(r);
}

Test(memlimit, reads_a_v1_limit_and_a_hybrid_v2_one_taking_the_smaller)
{
    char *r = tu_tmpdir();
    put(r, "proc/self/cgroup", "4:memory:/job/1\n0::/job/1\n");
    put(r, "sys/fs/cgroup/memory/job/1/memory.limit_in_bytes", "536870912\n");
    put(r, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put(r, "sys/fs/cgroup/unified/job/1/memory.max", "805306368\n");
    jlm_memlimit m;
    jlm_err err = {0};
    cr_assert_eq(jlm_memlimit_read(r, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m.cg_limit, 536870912ull);
    cr_assert_eq(m.cg_version, 1);
    cr_assert_eq(m.mem_available, 0, "no /proc/meminfo: unknown");
    uint64_t b = jlm_memlimit_budget(&m, NULL);
    cr_assert_eq(b, 536870912ull - 48 * MiB - 536870912ull / 16);
    tu_rmrf(r);
    free(r);
}

Test(memlimit, a_container_path_missing_under_the_mount_falls_back_to_the_mount_root)
{
    char *r = tu_tmpdir();
    put(r, "proc/self/cgroup", "0::/docker/0123abcd\n");   /* the host's path; the mount is the container's */
    put(r, "sys/fs/cgroup/memory.max", "268435456\n");
    put(r, "proc/meminfo", MEMINFO);
    jlm_memlimit m;
    cr_assert_eq(jlm_memlimit_read(r, &m, NULL), 0);
    cr_assert_eq(m.cg_limit, 268435456ull);
    tu_rmrf(r);
    free(r);
}

Test(memlimit, no_limit_anywhere_uses_MemAvailable_and_nothing_known_gives_no_budget)
{
    char *r = tu_tmpdir();
    put(r, "proc/self/cgroup", "0::/\n");
    put(r, "sys/fs/cgroup/memory.max", "max\n");
    put(r, "proc/meminfo", MEMINFO);
    jlm_memlimit m;
    cr_assert_eq(jlm_memlimit_read(r, &m, NULL), 0);
    cr_assert_eq(m.cg_limit, 0);
    uint64_t avail = 8000000ull * 1024;
    cr_assert_eq(jlm_memlimit_budget(&m, NULL), avail - 48 * MiB - avail / 16);
    tu_rmrf(r);
    free(r);
    r = tu_tmpdir();   /* an empty tree */
    cr_assert_eq(jlm_memlimit_read(r, &m, NULL), 0);
    cr_assert_eq(jlm_memlimit_budget(&m, NULL), 0, "nothing known: no budget");
    m = (jlm_memlimit){.cg_limit = 40 * MiB, .cg_version = 2};
    cr_assert_eq(jlm_memlimit_budget(&m, NULL), 1, "a limit below the headroom: 1 (raised to the minimum)");
    tu_rmrf(r);
    free(r);
}

Test(memlimit, a_malformed_limit_file_is_an_error_naming_it)
{
    char *r = tu_tmpdir();
    put(r, "proc/self/cgroup", "0::/a\n");
    put(r, "sys/fs/cgroup/a/memory.max", "lots\n");
    jlm_memlimit m = {.cg_limit = 7};
    jlm_err err = {0};
    cr_assert_eq(jlm_memlimit_read(r, &m, &err), JLM_EFORMAT);
    cr_assert(strstr(err.msg, "sys/fs/cgroup/a/memory.max") && strstr(err.msg, "lots"), "%s", err.msg);
    cr_assert_eq(m.cg_limit, 7, "*out untouched on error");
    tu_rmrf(r);
    free(r);
}

/* ---------------------------------------------------------------- through jlm run */
static char *stats_of(const char *env, const char *model, const char *extra)
{
    char cmd[4096], *o = NULL;
    snprintf(cmd, sizeof cmd, "(%s '%s' run '%s' --ids 1,2,3 -n 2 --temp 0 --stats %s 2>&1 >/dev/null)", env,
             tu_jlm(), model, extra);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s: %s", cmd, o ? o : "");
    return o;
}

/* The line "memory: budget B (SOURCE): frames F, KV K (T), scratch S, dense D". */
static void mem_line(const char *o, unsigned long long v[5])
{
    const char *m = strstr(o, "memory: budget ");
    cr_assert(m, "--stats has a memory line: %s", o);
    cr_assert_eq(sscanf(m, "memory: budget %llu", &v[0]), 1, "%s", m);
    const char *f = strstr(m, "): frames ");
    cr_assert(f, "%s", m);
    char kvt[8];
    cr_assert_eq(sscanf(f, "): frames %llu, KV %llu (%3s), scratch %llu, dense %llu", &v[1], &v[2], kvt, &v[3], &v[4]),
                 5, "%s", m);
}

Test(memlimit, jlm_run_without_budget_takes_the_cgroup_limit_and_says_so, .timeout = 60)
{
    char *d = tu_tmpdir(), path[1024], cmd[2048], env[1200], *o = NULL;
    snprintf(path, sizeof path, "%s/s.jlm", d);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s/tests/models/stories260K.gguf' -o '%s' >/dev/null 2>&1", tu_jlm(),
             tu_root(), path);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    free(o);
    char *r = tu_tmpdir();
    put(r, "proc/self/cgroup", "4:memory:/t\n");
    put(r, "sys/fs/cgroup/memory/t/memory.limit_in_bytes", "67108864\n");   /* 64 MiB */
    put(r, "proc/meminfo", MEMINFO);
    snprintf(env, sizeof env, "XDG_CACHE_HOME='%s' JLM_MEM_ROOT='%s'", d, r);
    o = stats_of(env, path, "");
    unsigned long long v[5];
    mem_line(o, v);
    unsigned long long want = 64 * MiB - 48 * MiB - 4 * MiB;
    cr_assert_eq(v[0], want, "budget = 64 MiB - headroom 52 MiB: %s", o);
    cr_assert(strstr(o, "cgroup v1 limit 67108864") && strstr(o, "memory.limit_in_bytes"), "%s", o);
    cr_assert_eq(v[1] + v[2] + v[3] + v[4], want, "frames + KV + scratch + dense = the budget: %s", o);
    free(o);
    /* --budget bounds the same sum */
    o = stats_of(env, path, "--budget 8M");
    mem_line(o, v);
    cr_assert_eq(v[0], 8 * MiB);
    cr_assert_eq(v[1] + v[2] + v[3] + v[4], 8 * MiB, "%s", o);
    cr_assert(strstr(o, "(--budget)"), "%s", o);
    free(o);
    /* a malformed limit file: a note, no budget, the run goes on */
    put(r, "sys/fs/cgroup/memory/t/memory.limit_in_bytes", "garbage\n");
    o = stats_of(env, path, "");
    cr_assert(strstr(o, "note: automatic budget: ") && strstr(o, "memory.limit_in_bytes"), "%s", o);
    mem_line(o, v);
    cr_assert_eq(v[0], 0, "%s", o);
    free(o);
    tu_rmrf(r);
    free(r);
    tu_rmrf(d);
    free(d);
}
