/* test_cli_cache.c - `jlm run foo.gguf` (and chat, info, tokenize, bench)
 * converting once into the per-user cache (cli/resolve.c, docs/cli.md). Every
 * test points XDG_CACHE_HOME at its own temp dir. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "tests/testutil.h"

/* A private copy of stories260K.gguf (its own inode and mtime) in a temp dir. */
static char *setup(char **gguf)
{
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    size_t n = 0;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert_not_null(b);
    cr_assert_eq(asprintf(gguf, "%s/story.gguf", dir) > 0, 1);
    cr_assert_eq(tu_write_file(*gguf, b, n), 0);
    free(b);
    return dir;
}

/* Runs `jlm ARGS` with the cache in DIR/cache; stdout in *out, stderr in *err. */
static int jlm_cached(const char *dir, const char *args, char **out, char **err)
{
    char cmd[4096], ep[1200];
    snprintf(ep, sizeof ep, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd, "(XDG_CACHE_HOME='%s/cache' '%s' %s 2>'%s')", dir, tu_jlm(), args, ep);
    int rc = tu_run(cmd, out);
    size_t n = 0;
    unsigned char *e = tu_read_file(ep, &n);
    *err = calloc(1, n + 1);
    if (e && *err)
        memcpy(*err, e, n);
    free(e);
    return rc;
}

/* How many files the cache holds (entries, .part or anything else), and the
 * path of the newest in newest (a buffer of 1400) with its mtime. */
static int cache_files(const char *dir, char *newest, struct timespec *mt)
{
    char d[1100];
    snprintf(d, sizeof d, "%s/cache/jlm", dir);
    DIR *h = opendir(d);
    int n = 0;
    struct dirent *de;
    while (h && (de = readdir(h))) {
        size_t l = strlen(de->d_name);
        if (de->d_name[0] == '.' || (l > 5 && !strcmp(de->d_name + l - 5, ".sums")))
            continue;   /* a checksum sidecar goes with its entry (docs/checksums.md) */
        n++;
        char p[1400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", d, de->d_name);
        if (newest && stat(p, &st) == 0 && (!*newest || st.st_mtim.tv_sec > mt->tv_sec ||
                                           (st.st_mtim.tv_sec == mt->tv_sec && st.st_mtim.tv_nsec > mt->tv_nsec))) {
            snprintf(newest, 1400, "%s", p);
            *mt = st.st_mtim;
        }
    }
    if (h)
        closedir(h);
    return n;
}

Test(cli_cache, first_run_converts_then_reuses_with_the_ids_of_convert_and_run, .timeout = 120)
{
    char *g, *dir = setup(&g), args[2048], *o1, *e1, *o2, *e2, *o3, *e3;
    snprintf(args, sizeof args, "run '%s' -p 'Once upon a time' -n 12 --temp 0 --print-ids", g);
    cr_assert_eq(jlm_cached(dir, args, &o1, &e1), 0, "%s", e1);
    cr_assert(strstr(e1, "jlm run: converting story.gguf into the cache"), "notice: %s", e1);
    char f1[1400] = "", f2[1400] = "";
    struct timespec m1 = {0}, m2 = {0};
    cr_assert_eq(cache_files(dir, f1, &m1), 1, "one cache entry");
    cr_assert(strstr(f1, "/cache/jlm/story@") && strstr(f1, ".jlm"), "%s", f1);

    cr_assert_eq(jlm_cached(dir, args, &o2, &e2), 0, "%s", e2);
    cr_assert(!strstr(e2, "converting"), "second run converts nothing: %s", e2);
    cr_assert_eq(cache_files(dir, f2, &m2), 1);
    cr_assert_str_eq(f1, f2);
    cr_assert(m1.tv_sec == m2.tv_sec && m1.tv_nsec == m2.tv_nsec, "the cache file is not rewritten");
    cr_assert_str_eq(o1, o2);

    /* the same ids as `jlm convert` then `jlm run` on the .jlm */
    snprintf(args, sizeof args, "convert '%s' -o '%s/c.jlm'", g, dir);
    cr_assert_eq(jlm_cached(dir, args, &o3, &e3), 0, "%s", e3);
    free(o3); free(e3);
    snprintf(args, sizeof args, "run '%s/c.jlm' -p 'Once upon a time' -n 12 --temp 0 --print-ids", dir);
    cr_assert_eq(jlm_cached(dir, args, &o3, &e3), 0, "%s", e3);
    cr_assert(strstr(o3, "\"generated\": [") && strlen(o3) > 40, "%s", o3);
    cr_assert_str_eq(o1, o3, "cached run %s vs convert+run %s", o1, o3);
    free(o1); free(e1); free(o2); free(e2); free(o3); free(e3);
    tu_rmrf(dir);
    free(dir); free(g);
}

Test(cli_cache, other_subcommands_use_the_same_entry, .timeout = 60)
{
    char *g, *dir = setup(&g), args[2048], *o, *e;
    snprintf(args, sizeof args, "tokenize '%s' 'Once upon a time' --ids", g);
    cr_assert_eq(jlm_cached(dir, args, &o, &e), 0, "%s", e);
    cr_assert_str_eq(o, "[1, 403, 407, 261, 378]\n", "reference prompt_ids");
    cr_assert(strstr(e, "jlm tokenize: converting story.gguf"), "%s", e);
    free(o); free(e);
    snprintf(args, sizeof args, "info '%s'", g);
    cr_assert_eq(jlm_cached(dir, args, &o, &e), 0, "%s", e);
    cr_assert(strstr(o, "n_layer 5") && !strstr(e, "converting"), "%s / %s", o, e);
    cr_assert_eq(cache_files(dir, NULL, NULL), 1);
    free(o); free(e);
    tu_rmrf(dir);
    free(dir); free(g);
}

Test(cli_cache, a_touched_source_converts_again_and_its_old_entry_is_pruned, .timeout = 60)
{
    char *g, *dir = setup(&g), args[2048], *o, *e;
    snprintf(args, sizeof args, "tokenize '%s' 'a' --ids", g);
    cr_assert_eq(jlm_cached(dir, args, &o, &e), 0, "%s", e);
    free(o); free(e);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1234567890, 123456789}};
    cr_assert_eq(utimensat(AT_FDCWD, g, ts, 0), 0);
    cr_assert_eq(jlm_cached(dir, args, &o, &e), 0, "%s", e);
    cr_assert(strstr(e, "converting story.gguf"), "a new mtime is a new source: %s", e);
    char f[1400] = "";
    struct timespec m = {0};
    cr_assert_eq(cache_files(dir, f, &m), 1, "the old entry is pruned once the new one is ready, no duplicate");
    cr_assert(strstr(f, "-1234567890.123456789.v"), "keyed by the new mtime: %s", f);
    free(o); free(e);
    tu_rmrf(dir);
    free(dir); free(g);
}

Test(cli_cache, a_truncated_gguf_is_one_error_line_and_no_cache_file)
{
    char *g, *dir = setup(&g), args[2048], *o, *e;
    cr_assert_eq(truncate(g, 1000), 0);
    snprintf(args, sizeof args, "run '%s' -p hi -n 2", g);
    cr_assert_eq(jlm_cached(dir, args, &o, &e), 1, "%s", e);
    int lines = 0;
    for (char *p = e; *p; p++)
        lines += *p == '\n';
    cr_assert_eq(lines, 1, "one line: %s", e);
    cr_assert(strstr(e, "jlm run: ") && strstr(e, "story.gguf"), "names the file: %s", e);
    cr_assert_str_eq(o, "", "nothing on stdout");
    cr_assert_eq(cache_files(dir, NULL, NULL), 0, "no cache file, no .part, no lock file");
    free(o); free(e);
    tu_rmrf(dir);
    free(dir); free(g);
}

Test(cli_cache, two_concurrent_runs_convert_once, .timeout = 60)
{
    char *g, *dir = setup(&g), cmd[4096], *o;
    snprintf(cmd, sizeof cmd, "(for i in 1 2 3; do XDG_CACHE_HOME='%s/cache' '%s' tokenize '%s' 'a' --ids & done; wait)",
             dir, tu_jlm(), g);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    int conv = 0, ok = 0;
    for (char *p = o; (p = strstr(p, "converting story.gguf")); p++)
        conv++;
    for (char *p = o; (p = strstr(p, "[1, 261]")); p++)
        ok++;
    cr_assert_eq(conv, 1, "one conversion among three runs: %s", o);
    cr_assert_eq(ok, 3, "every run tokenizes: %s", o);
    cr_assert_eq(cache_files(dir, NULL, NULL), 1);
    free(o);
    tu_rmrf(dir);
    free(dir); free(g);
}

/* A private copy of tests/models/hf/tiny-llama (config.json + one
 * model.safetensors, no tokenizer: runs feed ids) as DIR/tl. */
static char *setup_hf(char **folder)
{
    char *dir = tu_tmpdir(), cmd[3000], *o = NULL;
    cr_assert_not_null(dir);
    cr_assert_eq(asprintf(folder, "%s/tl", dir) > 0, 1);
    snprintf(cmd, sizeof cmd, "cp -r '%s/tests/models/hf/tiny-llama' '%s'", tu_root(), *folder);
    cr_assert_eq(tu_run(cmd, &o), 0);
    free(o);
    return dir;
}

Test(cli_cache, a_hugging_face_folder_converts_once_with_the_ids_of_convert_and_run, .timeout = 120)
{
    char *f, *dir = setup_hf(&f), args[2048], *o1, *e1, *o2, *e2, *o3, *e3;
    snprintf(args, sizeof args, "run '%s/' --ids 1,2,3 -n 12 --temp 0 --print-ids", f);
    cr_assert_eq(jlm_cached(dir, args, &o1, &e1), 0, "%s", e1);
    cr_assert(strstr(e1, "jlm run: converting ") && strstr(e1, "/tl/ into the cache"), "notice: %s", e1);
    cr_assert(strstr(o1, "\"generated\": [") && strlen(o1) > 40, "%s", o1);
    char f1[1400] = "", f2[1400] = "";
    struct timespec m1 = {0}, m2 = {0};
    cr_assert_eq(cache_files(dir, f1, &m1), 1, "one cache entry");
    cr_assert(strstr(f1, "/cache/jlm/tl@") && strstr(f1, ".jlm"), "%s", f1);

    /* the second run (without the trailing slash) and `jlm info` use that entry */
    snprintf(args, sizeof args, "run '%s' --ids 1,2,3 -n 12 --temp 0 --print-ids", f);
    cr_assert_eq(jlm_cached(dir, args, &o2, &e2), 0, "%s", e2);
    cr_assert(!strstr(e2, "converting"), "second run converts nothing: %s", e2);
    cr_assert_str_eq(o1, o2);
    free(o2); free(e2);
    snprintf(args, sizeof args, "info '%s'", f);
    cr_assert_eq(jlm_cached(dir, args, &o2, &e2), 0, "%s", e2);
    cr_assert(strstr(o2, "n_layer") && !strstr(e2, "converting"), "%s / %s", o2, e2);
    cr_assert_eq(cache_files(dir, f2, &m2), 1);
    cr_assert_str_eq(f1, f2);
    cr_assert(m1.tv_sec == m2.tv_sec && m1.tv_nsec == m2.tv_nsec, "the cache file is not rewritten");
    free(o2); free(e2);

    /* the same ids as `jlm convert DIR` then `jlm run` on the .jlm */
    snprintf(args, sizeof args, "convert '%s' -o '%s/c.jlm'", f, dir);
    cr_assert_eq(jlm_cached(dir, args, &o3, &e3), 0, "%s", e3);
    free(o3); free(e3);
    snprintf(args, sizeof args, "run '%s/c.jlm' --ids 1,2,3 -n 12 --temp 0 --print-ids", dir);
    cr_assert_eq(jlm_cached(dir, args, &o3, &e3), 0, "%s", e3);
    cr_assert_str_eq(o1, o3, "cached run %s vs convert+run %s", o1, o3);
    free(o3); free(e3);

    /* a changed file (config.json rewritten with a new mtime) is a new source */
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", f);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1234567890, 123456789}};
    cr_assert_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
    snprintf(args, sizeof args, "run '%s' --ids 1,2,3 -n 12 --temp 0 --print-ids", f);
    cr_assert_eq(jlm_cached(dir, args, &o2, &e2), 0, "%s", e2);
    cr_assert(strstr(e2, "converting tl into the cache"), "a touched config.json converts again: %s", e2);
    cr_assert_eq(cache_files(dir, NULL, NULL), 1, "a new entry, the old one pruned");
    cr_assert_str_eq(o1, o2);
    free(o2); free(e2);
    /* a README added is no change */
    snprintf(p, sizeof p, "%s/README.md", f);
    cr_assert_eq(tu_write_file(p, "hi\n", 3), 0);
    cr_assert_eq(jlm_cached(dir, args, &o2, &e2), 0, "%s", e2);
    cr_assert(!strstr(e2, "converting"), "%s", e2);
    cr_assert_eq(cache_files(dir, NULL, NULL), 1);
    free(o1); free(e1); free(o2); free(e2);
    tu_rmrf(dir);
    free(dir); free(f);
}

Test(cli_cache, a_truncated_shard_in_a_folder_is_one_error_line_and_no_cache_file, .timeout = 60)
{
    char *f, *dir = setup_hf(&f), args[2048], p[1200], *o, *e;
    snprintf(p, sizeof p, "%s/model.safetensors", f);
    cr_assert_eq(truncate(p, 100000), 0);
    snprintf(args, sizeof args, "run '%s' --ids 1 -n 2", f);
    cr_assert_neq(jlm_cached(dir, args, &o, &e), 0);
    cr_assert(strstr(e, "model.safetensors") && !strstr(e, "converting"), "%s", e);
    cr_assert_eq(strchr(e, '\n') - e + 1, (long)strlen(e), "one line: %s", e);
    cr_assert_eq(cache_files(dir, NULL, NULL), 0, "no cache file");
    free(o); free(e);
    tu_rmrf(dir);
    free(dir); free(f);
}
