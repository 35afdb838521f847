/* test_fs.c - the jlmfs mount, end to end: the built `jlmfs` binary (sibling
 * of $JLM_BIN) is started on a private SRC/mount point/cache per test, GGUFs
 * are copied in through the mount, and every byte read through a view is
 * compared with `jlm convert`'s output of the same GGUF. Each test unmounts
 * and kills its daemon in .fini (the daemon also dies with the test process:
 * PR_SET_PDEATHSIG), and every wait has a deadline. */
#include <criterion/criterion.h>

#include "format/jlm_format.h"
#include "tests/testutil.h"
#include "tests/mntutil.h"

#include <jansson.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/xattr.h>
#include <time.h>

static void init_own_cache(void) { mnt_dirs(); }

/* ---------------------------------------------------------------- helpers */
/* Copies a model into the mount (open, write, close: the view appears on close). */
static void copy_in(const char *model, const char *as)
{
    size_t n;
    unsigned char *b = tu_read_file(tu_model(model), &n);
    cr_assert(b, "cannot read %s", tu_model(model));
    cr_assert(tu_write_file(pathf("%s/%s", M.mnt, as), b, n) == 0, "writing %s through the mount failed", as);
    free(b);
}

/* `jlm convert` of a test model into TMP/<name>.ref.jlm; returns its bytes. */
static unsigned char *reference(const char *model, size_t *len, char **path_out)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s.ref.jlm", M.tmp, model);
    char cmd[3000], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' -o '%s'", tu_jlm(), tu_model(model), path);
    int rc = tu_run(cmd, &out);
    cr_assert(rc == 0, "jlm convert %s failed (%d): %s", model, rc, out ? out : "");
    free(out);
    unsigned char *b = tu_read_file(path, len);
    cr_assert(b, "cannot read %s", path);
    if (path_out)
        *path_out = path;
    return b;
}

/* Compares a file of the mount with ref[off, off+len). */
static void expect_span(const char *path, const unsigned char *ref, uint64_t off, uint64_t len)
{
    size_t n;
    unsigned char *b = tu_read_file(path, &n);
    cr_assert(b, "cannot read %s", path);
    cr_assert(n == len, "%s: %zu bytes, expected %llu", path, n, (unsigned long long)len);
    size_t i = 0;
    while (i < n && b[i] == ref[off + i])
        i++;
    cr_assert(i == n, "%s differs from the reference at byte %zu (container offset %llu)", path, i,
              (unsigned long long)(off + i));
    free(b);
}

/* Checks model.jlm, dense, every blocks/N and every experts/B.E of a view
 * against the reference container (expert pages located from its table). */
static void expect_view(const char *view, const unsigned char *ref, size_t ref_len, const char *ref_path)
{
    jlm_model *m;
    jlm_err e;
    cr_assert(jlm_fmt_open(ref_path, &m, &e) == 0, "reference: %s", e.msg);
    const jlm_header *h = &m->hdr;
    expect_span(pathf("%s/%s/model.jlm", M.mnt, view), ref, 0, ref_len);
    expect_span(pathf("%s/%s/dense", M.mnt, view), ref, h->dense_off, h->dense_len);
    for (uint32_t i = 0; i < h->n_blocks; i++)
        expect_span(pathf("%s/%s/blocks/%u", M.mnt, view, i), ref, h->data_off + (uint64_t)i * h->page_size, h->page_size);
    cr_assert(!tu_exists(pathf("%s/%s/blocks/%u", M.mnt, view, h->n_blocks)), "blocks/%u exists past NBlocks", h->n_blocks);
    uint32_t n_exp_files = 0;
    for (uint32_t t = 0; t < h->n_tensors; t++) {
        const jlm_tensor *tt = &m->tensors[t];
        if (!jlm_fmt_role_is_bank(tt->role) || (t && m->tensors[t - 1].block == tt->block &&
                                                 jlm_fmt_role_is_bank(m->tensors[t - 1].role)))
            continue;   /* first bank of each MoE block: its qs_off is in expert 0's page */
        uint64_t p0 = (tt->qs_off - h->exp_data_off) / h->exp_page_size;
        for (uint32_t x = 0; x < m->config.n_expert; x++, n_exp_files++)
            expect_span(pathf("%s/%s/experts/%d.%u", M.mnt, view, tt->block, x), ref,
                        h->exp_data_off + (p0 + x) * h->exp_page_size, h->exp_page_size);
    }
    cr_assert(n_exp_files == h->n_exp_pages, "%u expert files checked, NExpPages %u", n_exp_files, h->n_exp_pages);
    jlm_fmt_close(m);
}

static int count_entries(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name), s = strlen(suffix);
        n += de->d_name[0] != '.' && l >= s && !strcmp(de->d_name + l - s, suffix);
    }
    if (d)
        closedir(d);
    return n;
}

/* The resident page names in the data block of a `--html` page, each
 * checked against dir/NAME existing; returns how many (-1: no data block). */
static int picture_resident_in(const char *html_path, const char *dir)
{
    char *h = (char *)tu_read_file(html_path, NULL);
    const char *a = h ? strstr(h, "id=\"jlm-data\">") : NULL, *b = a ? strstr(a, "</script>") : NULL;
    json_t *d = b ? json_loadb(a + 14, (size_t)(b - a - 14), 0, NULL) : NULL;
    json_t *res = json_object_get(json_object_get(d, "residency"), "resident");
    int n = res ? (int)json_array_size(res) : -1;
    for (int i = 0; i < n; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, json_string_value(json_array_get(res, (size_t)i)));
        if (!tu_exists(p))
            n = -1;
    }
    json_decref(d);
    free(h);
    return n;
}

/* ---------------------------------------------------------------- tests */
TestSuite(fs, .init = init_own_cache, .fini = mnt_fini, .timeout = 60);

Test(fs, every_view_file_of_every_copied_test_model_matches_jlm_convert, .timeout = 120)
{
    static const char *models[] = {
        "stories260K.gguf", "llama-2-tiny-random.gguf", "synth-llama-256.f32.gguf", "synth-llama-256.Q4_0.gguf",
        "synth-llama-256.Q4_1.gguf", "synth-llama-256.Q5_0.gguf", "synth-llama-256.Q5_1.gguf",
        "synth-llama-256.Q8_0.gguf", "synth-llama-256.Q2_K.gguf", "synth-llama-256.Q3_K_M.gguf",
        "synth-llama-256.Q4_K_M.gguf", "synth-llama-256.Q5_K_M.gguf", "synth-llama-256.Q6_K.gguf",
        "synth-llama-256.MXFP4.gguf", "synth-llama-moe-256.F16.gguf", "synth-llama-moe-256.Q4_K_M.gguf",
        "synth-llama-moe-256.MXFP4_MOE.gguf", "synth-qwen2-256.Q4_K_M.gguf", "synth-qwen2-256.Q8_0.gguf",
        "synth-qwen3-256.Q4_K_M.gguf", "synth-qwen3-256.Q8_0.gguf", "synth-qwen3moe-256.Q4_K_M.gguf",
        "synth-qwen3moe-256.Q8_0.gguf", "synth-gemma3-256.Q4_K_M.gguf", "synth-gemma3-256.Q8_0.gguf",
        "synth-phi3-256.Q4_K_M.gguf", "synth-olmoe-256.Q4_K_M.gguf", "synth-gpt-oss-256.MXFP4_MOE.gguf",
        "synth-deepseek2-256.Q8_0.gguf", "synth-deepseek2-256.Q4_K_M.gguf", "synth-glm4moe-256.Q8_0.gguf",
        "synth-glm4moe-256.Q4_K_M.gguf", "synth-llama4-256.Q8_0.gguf", "synth-llama4-256.Q4_K_M.gguf",
    };
    mnt_start(0, 1);
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        copy_in(models[i], models[i]);
        size_t n;
        char *rp;
        unsigned char *ref = reference(models[i], &n, &rp);
        char view[256];
        snprintf(view, sizeof view, "%.*s.jlm", (int)(strlen(models[i]) - 5), models[i]);
        expect_view(view, ref, n, rp);   /* possibly before conversion finished */
        mnt_wait_ready(view, 20);
        expect_view(view, ref, n, rp);   /* and from the finished cache entry */
        free(ref);
    }
}

Test(fs, a_page_read_ahead_of_background_conversion_has_the_converted_bytes)
{
    mnt_start(300, 1);   /* 300 ms a unit: conversion of this model takes seconds */
    copy_in("synth-llama-256.Q4_K_M.gguf", "m.gguf");
    char *st = read_text(pathf("%s/m.jlm/status", M.mnt));
    cr_assert(st && !strncmp(st, "converting", 10), "status '%s', expected converting", st ? st : "(none)");
    free(st);
    size_t n;
    char *rp;
    unsigned char *ref = reference("synth-llama-256.Q4_K_M.gguf", &n, &rp);
    jlm_model *m;
    jlm_err e;
    cr_assert(jlm_fmt_open(rp, &m, &e) == 0, "%s", e.msg);
    uint32_t last = m->hdr.n_blocks - 1;
    expect_span(pathf("%s/m.jlm/blocks/%u", M.mnt, last), ref, m->hdr.data_off + (uint64_t)last * m->hdr.page_size,
                m->hdr.page_size);
    st = read_text(pathf("%s/m.jlm/status", M.mnt));
    cr_assert(st && !strncmp(st, "converting", 10), "status '%s' after the read, expected still converting", st);
    free(st);
    jlm_fmt_close(m);
    mnt_wait_ready("m.jlm", 30);
    expect_span(pathf("%s/m.jlm/model.jlm", M.mnt), ref, 0, n);
    cr_assert(count_entries(M.cache, ".part") == 0, "a .part file is left in the cache after conversion");
    free(ref);
}

/* A page-in arrives as many FUSE reads at once (an O_DIRECT read is split
 * into max_read pieces sent together). Each piece used to pack its whole
 * unit: a dozen threads packing the same page, which made drop-to-first-
 * token 2.4x convert + run (docs/jlmfs.md). Now one thread packs a unit and
 * the others wait for it: the daemon's "ready" line counts the packings,
 * which must equal the units. The worker sleeps 2 s before each unit, so the
 * one large read (the whole 13 MB container: 4 pages of 3 MiB) is ahead of it. */
Test(fs, a_page_read_in_many_pieces_at_once_is_packed_once)
{
    mnt_start(2000, 1);
    copy_in("synth-llama-256.f32.gguf", "m.gguf");
    size_t n;
    char *rp;
    unsigned char *ref = reference("synth-llama-256.f32.gguf", &n, &rp);
    int fd = open(pathf("%s/m.jlm/model.jlm", M.mnt), O_RDONLY | O_DIRECT);
    cr_assert(fd >= 0, "open O_DIRECT: %s", strerror(errno));
    size_t al = (n + 4095) & ~(size_t)4095;
    void *buf = NULL;
    cr_assert(posix_memalign(&buf, 4096, al) == 0);
    ssize_t got = pread(fd, buf, al, 0);
    close(fd);
    cr_assert(got == (ssize_t)n, "read %zd of %zu bytes: %s", got, n, strerror(errno));
    cr_assert(!memcmp(buf, ref, n), "the container read through the view differs from jlm convert's");
    free(buf);
    mnt_wait_ready("m.jlm", 30);
    char *log = NULL;
    const char *line = NULL;
    for (int i = 0; i < 100 && !line; i++) {   /* the log line follows the state by a moment */
        free(log);
        log = read_text(M.log);
        line = log ? strstr(log, "m.jlm: ready (") : NULL;
        if (!line)
            sleep_ms(20);
    }
    cr_assert(line, "no ready line in the log:\n%s", log ? log : "");
    unsigned units = 0, packed = 0;
    const char *u = strstr(line, "units ");
    cr_assert(u && sscanf(u, "units %u, packed %u", &units, &packed) == 2, "ready line: %.120s", line);
    cr_assert(units > 1 && packed == units, "%u units packed %u times: a unit was packed more than once", units,
              packed);
    free(log);
    free(ref);
}

Test(fs, two_processes_reading_one_view_during_conversion_both_see_the_right_bytes)
{
    mnt_start(50, 1);
    copy_in("synth-qwen3moe-256.Q4_K_M.gguf", "q.gguf");
    char *rp;
    size_t n;
    unsigned char *ref = reference("synth-qwen3moe-256.Q4_K_M.gguf", &n, &rp);
    pid_t c = fork();
    cr_assert(c >= 0);
    if (c == 0) {
        char cmd[2200];
        snprintf(cmd, sizeof cmd, "for i in 1 2 3; do cmp '%s/q.jlm/model.jlm' '%s' || exit 1; done", M.mnt, rp);
        _exit(system(cmd) == 0 ? 0 : 1);
    }
    expect_view("q.jlm", ref, n, rp);
    int st;
    double t0 = now_s();
    while (waitpid(c, &st, WNOHANG) == 0) {
        if (now_s() - t0 > 30) { kill(c, SIGKILL); waitpid(c, &st, 0); cr_assert_fail("the other reader hung"); }
        sleep_ms(10);
    }
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other reader saw different bytes (status %d)", st);
    free(ref);
}

Test(fs, a_truncated_gguf_and_a_text_file_get_an_error_status_and_no_model)
{
    mnt_start(0, 1);
    size_t n;
    unsigned char *g = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(g);
    cr_assert(tu_write_file(pathf("%s/trunc.gguf", M.mnt), g, n / 2) == 0);
    cr_assert(tu_write_file(pathf("%s/x.gguf", M.mnt), "hello, not a model\n", 19) == 0);
    free(g);
    static const char *views[] = {"trunc.jlm", "x.jlm"};
    for (int i = 0; i < 2; i++) {
        char *s = read_text(pathf("%s/%s/status", M.mnt, views[i]));
        cr_assert(s && !strncmp(s, "error: ", 7), "%s/status is '%s', expected 'error: ...'", views[i], s ? s : "(none)");
        free(s);
        cr_assert(!tu_exists(pathf("%s/%s/model.jlm", M.mnt, views[i])), "%s/model.jlm exists", views[i]);
        cr_assert(!tu_exists(pathf("%s/%s/blocks", M.mnt, views[i])), "%s/blocks exists", views[i]);
        int k = count_entries(pathf("%s/%s", M.mnt, views[i]), "");
        cr_assert(k == 1, "%s lists %d entries, expected only status", views[i], k);
    }
    copy_in("stories260K.gguf", "ok.gguf");   /* the daemon keeps serving */
    mnt_wait_ready("ok.jlm", 20);
}

Test(fs, a_restart_after_kill_9_mid_conversion_leaves_no_half_written_container)
{
    mnt_start(400, 1);
    copy_in("synth-llama-256.Q4_K_M.gguf", "m.gguf");
    cr_assert(count_entries(M.cache, ".part") == 1, "expected one .part while converting");
    kill(M.pid, SIGKILL);
    waitpid(M.pid, NULL, 0);
    M.pid = 0;
    mnt_stop();   /* unmounts the dead mount */
    cr_assert(count_entries(M.cache, ".v27.jlm") == 0, "a finished entry exists after a kill mid-conversion");
    mnt_start(0, 1);
    mnt_wait_ready("m.jlm", 20);
    cr_assert(count_entries(M.cache, ".part") == 0, "a .part file is left after restart and conversion");
    size_t n;
    unsigned char *ref = reference("synth-llama-256.Q4_K_M.gguf", &n, NULL);
    expect_span(pathf("%s/m.jlm/model.jlm", M.mnt), ref, 0, n);
    expect_span(pathf("%s/m.jlm/model.jlm", M.mnt), ref, 0, n);   /* again: from the page cache */
    free(ref);
}

Test(fs, a_cache_entry_of_another_format_version_is_rebuilt_not_misread)
{
    mnt_start(0, 1);
    copy_in("stories260K.gguf", "s.gguf");
    mnt_wait_ready("s.jlm", 20);
    mnt_stop();
    DIR *d = opendir(M.cache);
    struct dirent *de;
    char entry[1024] = "";
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".v27.jlm") && !strstr(de->d_name, ".sums"))   /* not its checksum sidecar */
            snprintf(entry, sizeof entry, "%s/%s", M.cache, de->d_name);
    if (d)
        closedir(d);
    cr_assert(entry[0], "no cache entry after conversion");
    int fd = open(entry, O_WRONLY);
    uint32_t v26 = 26;
    cr_assert(fd >= 0 && pwrite(fd, &v26, 4, 8) == 4, "cannot corrupt %s", entry);
    close(fd);
    mnt_start(0, 1);
    mnt_wait_ready("s.jlm", 20);
    size_t n;
    unsigned char *ref = reference("stories260K.gguf", &n, NULL);
    expect_span(pathf("%s/s.jlm/model.jlm", M.mnt), ref, 0, n);
    expect_span(entry, ref, 0, n);
    free(ref);
}

Test(fs, views_carry_the_database_attributes_and_refuse_writes)
{
    mnt_start(0, 0);   /* default cache: SRC/.jlmfs-cache, hidden from the mount */
    copy_in("stories260K.gguf", "s.gguf");
    mnt_wait_ready("s.jlm", 20);
    char val[1024];
    const char *files[] = {"s.jlm", "s.jlm/model.jlm"};
    for (int i = 0; i < 2; i++) {
        ssize_t r = getxattr(pathf("%s/%s", M.mnt, files[i]), "user.jlmfs.db", val, sizeof val - 1);
        cr_assert(r > 0, "%s: no user.jlmfs.db (%s)", files[i], strerror(errno));
        val[r] = 0;
        cr_assert(!strcmp(val, pathf("%s/.jlmfs-cache/jlmfs.db", M.src)), "user.jlmfs.db is '%s'", val);
        r = getxattr(pathf("%s/%s", M.mnt, files[i]), "user.jlmfs.model", val, sizeof val - 1);
        cr_assert(r > 0, "%s: no user.jlmfs.model", files[i]);
        val[r] = 0;
        cr_assert(!strcmp(val, "s.jlm"), "user.jlmfs.model is '%s', expected s.jlm", val);
    }
    cr_assert(!tu_exists(pathf("%s/.jlmfs-cache", M.mnt)), "the cache folder shows through the mount");
    cr_assert(count_entries(M.mnt, "") == 2, "mount root lists %d entries, expected s.gguf and s.jlm",
              count_entries(M.mnt, ""));
    int fd = open(pathf("%s/s.jlm/model.jlm", M.mnt), O_WRONLY);
    cr_assert(fd < 0 && errno == EROFS, "opening model.jlm for writing: fd %d errno %d, expected EROFS", fd, errno);
    cr_assert(mkdir(pathf("%s/s.jlm/new", M.mnt), 0755) != 0 && errno == EROFS, "mkdir in a view not refused");
}

Test(fs, a_gguf_removed_through_the_mount_loses_its_view_and_cache_entry)
{
    mnt_start(0, 1);
    copy_in("stories260K.gguf", "s.gguf");
    mnt_wait_ready("s.jlm", 20);
    cr_assert(count_entries(M.cache, ".v27.jlm") == 1);
    cr_assert(unlink(pathf("%s/s.gguf", M.mnt)) == 0);
    cr_assert(!tu_exists(pathf("%s/s.jlm", M.mnt)), "the view outlived its GGUF");
    cr_assert(count_entries(M.cache, ".v27.jlm") == 0, "the cache entry outlived its GGUF");
}

static char *run_ids(const char *model, const char *budget)
{
    char cmd[3000], *out = NULL;
    snprintf(cmd, sizeof cmd, "timeout 30 '%s' run '%s' --ids 1,403,407,261,378 -n 16 --temp 0 --print-ids %s",
             tu_jlm(), model, budget);
    int rc = tu_run(cmd, &out);
    cr_assert(rc == 0, "jlm run %s %s failed (%d): %s", model, budget, rc, out ? out : "");
    char *ids = strstr(out, "{\"prompt\"");   /* notes (stderr) are captured too: keep the ids line */
    cr_assert(ids, "jlm run %s %s printed no ids: %s", model, budget, out);
    char *r = strndup(ids, strcspn(ids, "\n"));
    free(out);
    return r;
}

/* stories260K, and the MoE families of issue 41 (latent attention, a
 * leading dense block, interleaved MoE) paged through the mount. */
Test(fs, jlm_run_through_a_view_gives_the_plain_files_ids_at_any_budget, .timeout = 120)
{
    static const char *models[] = {"stories260K.gguf", "synth-deepseek2-256.Q8_0.gguf", "synth-glm4moe-256.Q4_K_M.gguf",
                                   "synth-llama4-256.Q4_K_M.gguf"};
    mnt_start(100, 1);
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        char view[64];
        snprintf(view, sizeof view, "s%zu.jlm", m);
        copy_in(models[m], pathf("s%zu.gguf", m));
        char *rp;
        size_t n;
        free(reference(models[m], &n, &rp));
        char *plain = run_ids(rp, "");
        cr_assert(strstr(plain, "\"generated\""), "no ids from the plain file: %s", plain);
        const char *budgets[] = {"", "--budget 1"};
        for (int i = 0; i < 2; i++) {
            char *v = run_ids(pathf("%s/%s", M.mnt, view), budgets[i]);
            cr_assert(!strcmp(v, plain), "%s through the view (%s): %s\nplain file: %s", models[m], budgets[i], v,
                      plain);
            free(v);
        }
        free(plain);
    }
}

/* mount(8) looks for helpers only in /sbin: the test puts the tree's helper
 * there and takes it away again (unless one was installed before the test,
 * which it then leaves alone), so `make test` leaves the system as it was. */
static int helper_placed;
static void remove_placed_helper(void)
{
    if (helper_placed)
        unlink("/sbin/mount.jlmfs");
    helper_placed = 0;
}

Test(fs, mount_t_jlmfs_mounts_through_the_installed_helper, .fini = remove_placed_helper)
{
    if (geteuid() != 0 || access("/sbin", W_OK)) {
        cr_skip_test("mount -t jlmfs needs root to install /sbin/mount.jlmfs");
    }
    char cmd[3000], *out = NULL;
    if (access("/sbin/mount.jlmfs", F_OK) != 0) {
        snprintf(cmd, sizeof cmd, "install -m 755 '%s/mount-helpers/mount.jlmfs' /sbin/mount.jlmfs", tu_root());
        helper_placed = 1;
        cr_assert(tu_run(cmd, &out) == 0, "installing the helper: %s", out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "JLMFS_BIN='%s' timeout 20 mount -t jlmfs '%s' '%s' -o rw,cache=%s", jlmfs_bin(), M.src,
             M.mnt, M.cache);
    int rc = tu_run(cmd, &out);
    cr_assert(rc == 0, "mount -t jlmfs failed (%d): %s", rc, out);
    free(out);
    cr_assert(is_mounted(M.mnt), "not mounted after mount -t jlmfs");
    copy_in("stories260K.gguf", "s.gguf");
    mnt_wait_ready("s.jlm", 20);
    snprintf(cmd, sizeof cmd, "timeout 20 umount '%s'", M.mnt);
    rc = tu_run(cmd, &out);
    cr_assert(rc == 0, "umount failed (%d): %s", rc, out);
    free(out);
    double t0 = now_s();
    while (is_mounted(M.mnt) && now_s() - t0 < 5)
        sleep_ms(20);
    cr_assert(!is_mounted(M.mnt), "still mounted after umount");
}

Test(fs, config_json_tensors_and_stats_describe_the_view)
{
    mnt_start(0, 1);
    copy_in("synth-qwen3moe-256.Q4_K_M.gguf", "q.gguf");
    char *rp;
    size_t n;
    free(reference("synth-qwen3moe-256.Q4_K_M.gguf", &n, &rp));
    jlm_model *m;
    jlm_err e;
    cr_assert(jlm_fmt_open(rp, &m, &e) == 0, "%s", e.msg);
    char *cfg = read_text(pathf("%s/q.jlm/config.json", M.mnt));
    cr_assert(cfg, "no config.json");
    char want[64];
    snprintf(want, sizeof want, "\"n_expert\": %u,", m->config.n_expert);
    cr_assert(strstr(cfg, "\"arch\": \"qwen3moe\"") && strstr(cfg, want), "config.json lacks arch/%s:\n%s", want, cfg);
    free(cfg);
    char *tab = read_text(pathf("%s/q.jlm/tensors", M.mnt));
    cr_assert(tab, "no tensors file");
    uint32_t lines = 0;
    for (char *p = tab; *p; p++)
        lines += *p == '\n';
    cr_assert(lines == m->hdr.n_tensors, "tensors has %u lines, the table %u tensors", lines, m->hdr.n_tensors);
    cr_assert(!strncmp(tab, m->tensors[0].name.s, strlen(m->tensors[0].name.s)), "first line '%.40s', expected tensor %s",
              tab, m->tensors[0].name.s);
    free(tab);
    jlm_fmt_close(m);
    free(tu_read_file(pathf("%s/q.jlm/blocks/0", M.mnt), &n));   /* reaches the daemon: recorded */
    char *st = read_text(pathf("%s/q.jlm/stats", M.mnt));
    cr_assert(st && strstr(st, "blocks.0"), "stats do not mention blocks.0 after reading it:\n%s", st ? st : "(none)");
    free(st);
}

Test(fs, a_killed_daemon_gives_a_reader_an_error_not_a_hang)
{
    mnt_start(0, 1);
    copy_in("stories260K.gguf", "s.gguf");
    mnt_wait_ready("s.jlm", 20);
    int fd = open(pathf("%s/s.jlm/blocks/1", M.mnt), O_RDONLY);
    cr_assert(fd >= 0, "cannot open blocks/1");
    kill(M.pid, SIGKILL);
    waitpid(M.pid, NULL, 0);
    M.pid = 0;
    char buf[4096];
    ssize_t r = pread(fd, buf, sizeof buf, 0);   /* not read before: not in the page cache */
    int err = errno;
    close(fd);
    cr_assert(r < 0 && (err == ENOTCONN || err == EIO), "read after the daemon died: %zd, errno %d", r, err);
    char cmd[3000], *out = NULL;
    snprintf(cmd, sizeof cmd, "timeout 20 '%s' run '%s/s.jlm' --ids 1,403 -n 2 --temp 0 --print-ids", tu_jlm(), M.mnt);
    int rc = tu_run(cmd, &out);
    cr_assert(rc != 0 && rc != 124, "jlm run on a dead mount: exit %d (124 = hang), output: %s", rc, out);
    cr_assert(out && (strstr(out, "connected") || strstr(out, "error") || strstr(out, "Input/output")),
              "jlm run gave no clear error: %s", out);
    free(out);
}

/* An engine that stays open (jlm chat waiting for its next line) holds its
 * pages: resident/ lists them by page-file name; after it exits the list is
 * empty and stats has counted its page-ins, with a tier for each. */
Test(fs, resident_lists_an_open_engines_pages_and_stats_count_them_by_tier)
{
    mnt_start(0, 1);
    copy_in("stories260K.gguf", "s.gguf");
    mnt_wait_ready("s.jlm", 20);
    char *out = pathf("%s/chat.out", M.tmp);
    char cmd[3000];
    /* stdout only: the reply's newline marks the end of the turn (notes go to stderr) */
    snprintf(cmd, sizeof cmd, "timeout 30 '%s' chat '%s/s.jlm' -n 4 --temp 0 > '%s' 2>/dev/null", tu_jlm(), M.mnt, out);
    FILE *p = popen(cmd, "w");
    cr_assert(p, "popen");
    fputs("Hello\n", p);
    fflush(p);
    /* the reply ends with a newline once the first turn is done */
    double t0 = now_s();
    for (;;) {
        char *o = read_text(out);
        int done = o && strchr(o, '\n');
        free(o);
        if (done)
            break;
        cr_assert(now_s() - t0 < 20, "jlm chat did not answer");
        sleep_ms(20);
    }
    char *res = pathf("%s/s.jlm/resident", M.mnt);
    int n = count_entries(res, "");
    int blocks = 0;
    for (int b = 0; b < 5; b++)
        blocks += tu_exists(pathf("%s/blocks.%d", res, b));
    /* the picture's overlay (jlm stats --html of the view and of the mount, and the view's
     * layout.html) lists exactly resident/ */
    char resdir[1024];
    snprintf(resdir, sizeof resdir, "%s", res);   /* pathf's buffers rotate */
    snprintf(cmd, sizeof cmd, "'%s' stats '%s/s.jlm' --html -o '%s/v.html' && mkdir '%s/pics' && "
             "'%s' stats '%s' --html -o '%s/pics'", tu_jlm(), M.mnt, M.tmp, M.tmp, tu_jlm(), M.mnt, M.tmp);
    int html_rc = tu_run(cmd, NULL);
    int in_view = picture_resident_in(pathf("%s/v.html", M.tmp), resdir);
    int in_mount = picture_resident_in(pathf("%s/pics/s.jlm.html", M.tmp), resdir);
    int in_layout = picture_resident_in(pathf("%s/s.jlm/layout.html", M.mnt), resdir);
    pclose(p);
    cr_assert(html_rc == 0 && in_view == n && in_mount == n, "jlm stats --html: status %d, overlay lists %d and %d "
              "pages that resident/ has, of %d", html_rc, in_view, in_mount, n);
    cr_assert_eq(in_layout, n, "layout.html's overlay lists %d pages that resident/ has, of %d", in_layout, n);
    cr_assert(blocks == 5 && n == 5, "resident/ lists the 5 block pages the engine holds (%d blocks, %d entries)", blocks, n);
    cr_assert(count_entries(res, "") == 0, "resident/ is empty once the engine has exited");
    char *st = read_text(pathf("%s/s.jlm/stats", M.mnt));
    cr_assert(st, "stats");
    char *tot = strstr(st, "\ntotal");
    cr_assert(tot, "stats has a total line: %s", st);
    unsigned long long pi = 0, fills = 0, hits = 0, ev = 0, bytes = 0, tf = 0, tp = 0, td = 0, tc = 0;
    cr_assert(sscanf(tot, "\ntotal %llu %llu %llu %llu %llu %llu %llu %llu %llu", &pi, &fills, &hits, &ev, &bytes,
                     &tf, &tp, &td, &tc) == 9, "total line: %s", tot);
    cr_assert(pi >= 5 && bytes > 0, "page-ins %llu, bytes %llu", pi, bytes);
    cr_assert(tp + td + tc == pi + fills, "every page-in has a tier: page cache %llu + disk %llu + conversion %llu "
              "vs %llu page-ins", tp, td, tc, pi + fills);
    free(st);
}

/* Mounts, copies stories260K in, starts `jlm run` on its view with a
 * one-frame budget (every token reads pages) writing to out_path, and
 * returns once it has printed its first bytes. */
static FILE *start_reader(const char *out_path)
{
    mnt_start(0, 1);
    copy_in("stories260K.gguf", "s.gguf");
    mnt_wait_ready("s.jlm", 20);
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "timeout 45 '%s' run '%s/s.jlm' -p 'Once upon a time' -n 600 --temp 0 --budget 1 "
             "> '%s' 2>&1", tu_jlm(), M.mnt, out_path);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen");
    double t0 = now_s();
    for (;;) {
        char *o = read_text(out_path);
        int started = o && strstr(o, ", there");
        free(o);
        if (started)
            return p;
        cr_assert(now_s() - t0 < 20, "jlm run did not start generating");
        sleep_ms(5);
    }
}

/* The reader's exit status (128 when it was killed by a signal). */
static int reader_exit(FILE *p)
{
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(fs, a_daemon_killed_while_an_engine_reads_gives_it_a_clear_error_not_a_hang)
{
    char *out = pathf("%s/run.out", M.tmp);
    FILE *p = start_reader(out);
    kill(M.pid, SIGKILL);
    waitpid(M.pid, NULL, 0);
    M.pid = 0;
    int rc = reader_exit(p);
    char *o = read_text(out);
    cr_assert(rc != 124, "jlm run hung after the daemon died: %s", o);
    cr_assert(rc == 1 && o && strstr(o, "jlm run:") && strstr(o, "s.jlm"),
              "a clear error naming the model (exit %d): %s", rc, o);
    free(o);
}

Test(fs, a_lazy_unmount_while_an_engine_reads_does_not_hang_it)
{
    char *out = pathf("%s/run.out", M.tmp);
    FILE *p = start_reader(out);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "fusermount3 -uz '%s'", M.mnt);
    cr_assert(tu_run(cmd, NULL) == 0, "lazy unmount");
    int rc = reader_exit(p);
    char *o = read_text(out);
    /* the open container stays readable through the detached mount: the run
     * finishes; if it could not, it must say so, never hang */
    cr_assert(rc == 0 || (rc == 1 && strstr(o, "jlm run:")), "exit %d after a lazy unmount: %s", rc, o);
    free(o);
}

/* docs/vision.md: foo.gguf with mmproj-foo.gguf beside it gets the tower;
 * adding the projector later replans the view; the projector has no view. */
static char *run_image_ids(const char *model, const char *budget)
{
    char cmd[3000], *out = NULL;
    snprintf(cmd, sizeof cmd, "timeout 30 '%s' run '%s' --image '%s/tests/models/images/grad-32x32.ppm' "
             "-p '<image>Describe:' -n 16 --temp 0 --print-ids %s", tu_jlm(), model, tu_root(), budget);
    int rc = tu_run(cmd, &out);
    if (rc) {
        char *r = strdup(out ? out : "");
        free(out);
        return r;
    }
    char *ids = strstr(out, "{\"prompt\"");
    cr_assert(ids, "jlm run %s %s printed no ids: %s", model, budget, out);
    char *r = strndup(ids, strcspn(ids, "\n"));
    free(out);
    return r;
}

Test(fs, a_gguf_with_its_mmproj_beside_it_gets_the_vision_tower)
{
    mnt_start(0, 1);
    copy_in("synth-gemma3v-128.F32.gguf", "g.gguf");
    char *before = run_image_ids(pathf("%s/g.jlm", M.mnt), "");
    cr_assert(strstr(before, "no vision tower"), "%s", before);
    free(before);
    copy_in("mmproj-tinygemma3.gguf", "mmproj-g.gguf");
    cr_assert(!tu_exists(pathf("%s/mmproj-g.jlm", M.mnt)), "a projector got a view of its own");
    cr_assert(tu_exists(pathf("%s/g.jlm/vision/3", M.mnt)), "no vision pages in the view");
    char plain[1200], cmd[4000];
    snprintf(plain, sizeof plain, "%s/plain.jlm", M.tmp);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' --mmproj '%s' -o '%s'", tu_jlm(), tu_model("synth-gemma3v-128.F32.gguf"),
             tu_model("mmproj-tinygemma3.gguf"), plain);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    char *want = run_image_ids(plain, "");
    cr_assert(strstr(want, "\"generated\": [61, 107, 118"), "%s", want);   /* llama.cpp's first ids */
    const char *budgets[] = {"", "--budget 1"};
    for (int i = 0; i < 2; i++) {
        char *got = run_image_ids(pathf("%s/g.jlm", M.mnt), budgets[i]);
        cr_assert(!strcmp(got, want), "through the view (%s): %s\nplain file: %s", budgets[i], got, want);
        free(got);
    }
    free(want);
}
