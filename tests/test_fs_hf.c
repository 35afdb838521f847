/* test_fs_hf.c - Hugging Face folders dropped into a jlmfs mount (issue 11,
 * docs/jlmfs.md "Hugging Face folders"): `cp -r X/ MNT/` gives X.jlm/ once the
 * folder is complete, byte-identical to `jlm convert X`, and `jlm run` through
 * it gives the same ids; a half-copied folder (a shard missing, a shard
 * shorter than its header says) never gets a view; a symlinked shard is not
 * followed; `-o type=` converts to that type; status counts the bytes while
 * converting. Each test unmounts in .fini (tests/mntutil.h). */
#include <criterion/criterion.h>

#include "tests/testutil.h"
#include "tests/mntutil.h"
#include "converter/safetensors.h"

#include <errno.h>
#include <regex.h>
#include <sys/xattr.h>

static void init(void) { mnt_dirs(); }

TestSuite(fs_hf, .init = init, .fini = mnt_fini, .timeout = 60);

static const char *hf_dir(const char *name)
{
    return pathf("%s/tests/models/hf/%s", tu_root(), name);
}

static void sh(const char *cmd)
{
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    cr_assert(rc == 0, "%s: exit %d: %s", cmd, rc, out ? out : "");
    free(out);
}

/* `jlm convert DIR [--type T] -o TMP/ref-N.jlm`: its path. */
static const char *reference(const char *dir, const char *type)
{
    static int k;
    const char *out = pathf("%s/ref-%d.jlm", M.tmp, k++);
    sh(pathf("'%s' convert '%s' %s%s -o '%s'", tu_jlm(), dir, type ? "--type " : "", type ? type : "", out));
    return out;
}

static char *status_of(const char *view)
{
    return read_text(pathf("%s/%s/status", M.mnt, view));
}

static void expect_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    unsigned char *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    cr_assert(x && y, "cannot read %s or %s", a, b);
    cr_assert(na == nb && !memcmp(x, y, na), "%s (%zu bytes) differs from %s (%zu bytes)", a, na, b, nb);
    free(x);
    free(y);
}

/* The ids line of `jlm run MODEL --ids 1,2,3 -n 8` (XDG_CACHE_HOME private). */
static char *run_ids(const char *model)
{
    char *out = NULL;
    int rc = tu_run(pathf("XDG_CACHE_HOME='%s/xdg' '%s' run '%s' --ids 1,2,3 -n 8 --seed 7", M.tmp, tu_jlm(), model), &out);
    cr_assert(rc == 0, "jlm run %s: exit %d: %s", model, rc, out ? out : "");
    char *ids = strstr(out, "{\"prompt\"");
    cr_assert(ids, "jlm run %s printed no ids: %s", model, out);
    char *r = strndup(ids, strcspn(ids, "\n"));
    free(out);
    return r;
}

Test(fs_hf, a_sharded_folder_copied_in_gets_a_view_equal_to_jlm_convert_and_runs_the_same_ids)
{
    mnt_start(0, 1);
    sh(pathf("cp -r '%s' '%s/'", hf_dir("tiny-llama-sharded"), M.mnt));
    mnt_wait_ready("tiny-llama-sharded.jlm", 20);
    const char *ref = reference(hf_dir("tiny-llama-sharded"), NULL);
    expect_same_file(pathf("%s/tiny-llama-sharded.jlm/model.jlm", M.mnt), ref);
    char *a = run_ids(pathf("%s/tiny-llama-sharded.jlm", M.mnt)), *b = run_ids(ref);
    cr_assert(strstr(a, "\"generated\": [") && !strcmp(a, b), "through the view: %s\nconverted directly: %s", a, b);
    free(a);
    free(b);
    /* the folder itself stays as copied, next to its view */
    cr_assert(tu_exists(pathf("%s/tiny-llama-sharded/model-00002-of-00002.safetensors", M.mnt)));
}

Test(fs_hf, a_folder_with_a_shard_missing_or_short_gets_no_view_until_complete)
{
    mnt_start(0, 1);
    const char *d = pathf("%s/m", M.mnt);
    cr_assert(mkdir(d, 0755) == 0, "mkdir %s: %s", d, strerror(errno));
    sh(pathf("cp '%s/config.json' '%s/model.safetensors.index.json' '%s/model-00001-of-00002.safetensors' '%s/'",
             hf_dir("tiny-llama-sharded"), hf_dir("tiny-llama-sharded"), hf_dir("tiny-llama-sharded"), d));
    struct stat st;
    cr_assert(stat(pathf("%s/m.jlm", M.mnt), &st) != 0 && errno == ENOENT, "a view with a shard missing");
    /* the second shard, half there (written into SRC directly: no handle of the mount tells) */
    size_t n;
    unsigned char *b = tu_read_file(pathf("%s/model-00002-of-00002.safetensors", hf_dir("tiny-llama-sharded")), &n);
    cr_assert(b);
    cr_assert(tu_write_file(pathf("%s/m/model-00002-of-00002.safetensors", M.src), b, n / 2) == 0);
    cr_assert(stat(pathf("%s/m.jlm", M.mnt), &st) != 0 && errno == ENOENT, "a view with a shard half copied");
    char *ls = NULL;
    tu_run(pathf("ls '%s'", M.mnt), &ls);
    cr_assert(ls && !strstr(ls, "m.jlm"), "listed while incomplete: %s", ls);
    free(ls);
    /* complete: the view appears and converts */
    cr_assert(tu_write_file(pathf("%s/m/model-00002-of-00002.safetensors", M.src), b, n) == 0);
    free(b);
    mnt_wait_ready("m.jlm", 20);
    expect_same_file(pathf("%s/m.jlm/model.jlm", M.mnt), reference(hf_dir("tiny-llama-sharded"), NULL));
    /* a shard removed again: the view goes */
    cr_assert(unlink(pathf("%s/m/model-00001-of-00002.safetensors", M.mnt)) == 0);
    cr_assert(stat(pathf("%s/m.jlm", M.mnt), &st) != 0 && errno == ENOENT, "the view outlived its shard");
}

Test(fs_hf, a_symlinked_shard_is_not_followed)
{
    /* SRC/m/model.safetensors is a link to a real model outside SRC */
    cr_assert(mkdir(pathf("%s/m", M.src), 0755) == 0);
    sh(pathf("cp '%s/config.json' '%s/m/' && ln -s '%s/model.safetensors' '%s/m/model.safetensors'",
             hf_dir("tiny-llama"), M.src, hf_dir("tiny-llama"), M.src));
    mnt_start(0, 1);
    struct stat st;
    cr_assert(stat(pathf("%s/m.jlm", M.mnt), &st) != 0 && errno == ENOENT, "a view through a symlinked shard");
    /* the same folder with the real file gets one */
    cr_assert(unlink(pathf("%s/m/model.safetensors", M.mnt)) == 0);
    sh(pathf("cp '%s/model.safetensors' '%s/m/'", hf_dir("tiny-llama"), M.mnt));
    mnt_wait_ready("m.jlm", 20);
}

Test(fs_hf, o_type_quantizes_the_view_as_jlm_convert_type_does)
{
    snprintf(M.extra, sizeof M.extra, "type=Q8_0");
    mnt_start(0, 1);
    sh(pathf("cp -r '%s' '%s/'", hf_dir("tiny-llama"), M.mnt));
    mnt_wait_ready("tiny-llama.jlm", 20);
    expect_same_file(pathf("%s/tiny-llama.jlm/model.jlm", M.mnt), reference(hf_dir("tiny-llama"), "Q8_0"));
    char *t = read_text(pathf("%s/tiny-llama.jlm/tensors", M.mnt));
    cr_assert(t && strstr(t, " Q8_0 ") != NULL, "no Q8_0 tensor in the view: %s", t ? t : "(none)");
    free(t);
}

Test(fs_hf, a_bad_type_option_is_refused_naming_it)
{
    char *out = NULL;
    int rc = tu_run(pathf("'%s' '%s' '%s' -f -o type=Q9_9", jlmfs_bin(), M.src, M.mnt), &out);
    cr_assert(rc != 0 && out && strstr(out, "type=Q9_9"), "exit %d: %s", rc, out ? out : "");
    cr_assert(!is_mounted(M.mnt));
    free(out);
}

Test(fs_hf, status_counts_the_bytes_while_converting)
{
    mnt_start(300, 1);   /* 300 ms before each page: the status is seen mid-way */
    sh(pathf("cp -r '%s' '%s/'", hf_dir("tiny-llama"), M.mnt));
    char *s = status_of("tiny-llama.jlm");
    cr_assert(s, "no status");
    regex_t re;
    cr_assert(regcomp(&re, "^converting [0-9]+% \\([0-9]+ KiB of [0-9]+ KiB\\)\n$", REG_EXTENDED) == 0);
    int m = regexec(&re, s, 0, NULL, 0);
    regfree(&re);
    cr_assert(m == 0, "status '%s'", s);
    unsigned pct, done, total;
    cr_assert(sscanf(s, "converting %u%% (%u KiB of %u KiB)", &pct, &done, &total) == 3);
    cr_assert(total == 352256 / 1024 && done <= total, "status '%s': the container is 344 KiB", s);
    free(s);
    mnt_wait_ready("tiny-llama.jlm", 30);
}

/* The per-shard rule on its own (converter/safetensors.h): complete exactly
 * at the shard's full length; every shorter copy, inside the header or the
 * data, is not; a header that is all there but bad counts as complete (the
 * view then says why instead of waiting forever). */
Test(fs_hf, the_completeness_rule_holds_at_every_cut_of_a_shard)
{
    size_t n;
    unsigned char *b = tu_read_file(pathf("%s/model.safetensors", hf_dir("tiny-llama")), &n);
    cr_assert(b && n > 64);
    cr_assert(jlm_st_image_complete(b, n, n) == 1, "the whole shard is not complete");
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++)
        hl |= (uint64_t)b[k] << (8 * k);
    size_t cuts[] = {0, 7, 8, 8 + (size_t)hl / 2, 8 + (size_t)hl - 1, 8 + (size_t)hl, 8 + (size_t)hl + 1, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++)
        cr_assert(jlm_st_image_complete(b, cuts[i], cuts[i]) == 0, "a copy of %zu of %zu bytes counts as complete",
                  cuts[i], n);
    /* a longer file (bytes after the data): the planner refuses it, so complete */
    cr_assert(jlm_st_image_complete(b, n, n + 10) == 1);
    unsigned char bad[16 + 4] = {4, 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 'p', 'e'};
    cr_assert(jlm_st_image_complete(bad, 12, 12) == 1, "a bad header, all there, must not wait forever");
    unsigned char huge[8] = {0, 0, 0, 0, 0, 1, 0, 0};   /* 2^40: over the cap */
    cr_assert(jlm_st_image_complete(huge, 8, 8) == 1);
    free(b);
}

/* user.jlmfs.view on a source names its view (for tools run inside the
 * mount); a GGUF beside a folder of the same stem keeps the name. */
Test(fs_hf, a_source_names_its_view_in_an_xattr_and_a_gguf_wins_the_name)
{
    mnt_start(0, 1);
    sh(pathf("cp -r '%s' '%s/m'", hf_dir("tiny-llama"), M.mnt));
    mnt_wait_ready("m.jlm", 20);
    char v[256];
    ssize_t n = getxattr(pathf("%s/m", M.mnt), "user.jlmfs.view", v, sizeof v);
    cr_assert(n == 5 && !memcmp(v, "m.jlm", 5), "folder: %zd '%.*s'", n, (int)(n > 0 ? n : 0), v);
    cr_assert(getxattr(pathf("%s/m/config.json", M.mnt), "user.jlmfs.view", v, sizeof v) < 0 && errno == ENODATA);
    /* m.gguf beside m/: m.jlm is the GGUF's (stories260K: 5 layers) */
    sh(pathf("cp '%s' '%s/m.gguf'", tu_model("stories260K.gguf"), M.mnt));
    n = getxattr(pathf("%s/m.gguf", M.mnt), "user.jlmfs.view", v, sizeof v);
    cr_assert(n == 5 && !memcmp(v, "m.jlm", 5));
    cr_assert(getxattr(pathf("%s/m", M.mnt), "user.jlmfs.view", v, sizeof v) < 0 && errno == ENODATA,
              "the folder kept a view the GGUF shadows");
    mnt_wait_ready("m.jlm", 20);
    char *cfg = read_text(pathf("%s/m.jlm/config.json", M.mnt));
    cr_assert(cfg && strstr(cfg, "\"n_layer\": 5"), "m.jlm is not the GGUF's: %s", cfg ? cfg : "");
    free(cfg);
}

/* A folder renamed through the mount: the old view goes at once, the new name
 * converts to the same bytes; a file of it rewritten replaces the view (its
 * identity is its files'), and one added that is no model file does not. */
Test(fs_hf, a_renamed_or_changed_folder_gets_a_fresh_view)
{
    mnt_start(0, 1);
    sh(pathf("cp -r '%s' '%s/m'", hf_dir("tiny-llama-sharded"), M.mnt));
    mnt_wait_ready("m.jlm", 20);
    const char *ref = reference(hf_dir("tiny-llama-sharded"), NULL);
    cr_assert(rename(pathf("%s/m", M.mnt), pathf("%s/n", M.mnt)) == 0, "%s", strerror(errno));
    struct stat st;
    cr_assert(stat(pathf("%s/m.jlm", M.mnt), &st) != 0 && errno == ENOENT, "m.jlm outlived the rename");
    mnt_wait_ready("n.jlm", 20);
    expect_same_file(pathf("%s/n.jlm/model.jlm", M.mnt), ref);
    /* a README is no model file: the same view, still ready (its cache entry kept) */
    cr_assert(tu_write_file(pathf("%s/n/README.md", M.mnt), "hi\n", 3) == 0);
    char *s = status_of("n.jlm");
    cr_assert(s && !strncmp(s, "ready", 5), "a README replanned the view: '%s'", s ? s : "");
    free(s);
    /* config.json rewritten with another context length: a new view, converted again */
    char *cfg = read_text(pathf("%s/n/config.json", M.mnt));
    cr_assert(cfg && strstr(cfg, "\"max_position_embeddings\""), "%s", cfg ? cfg : "");
    char *p = strstr(cfg, "\"max_position_embeddings\"");
    p = strchr(p, ':') + 1;
    while (*p == ' ')
        p++;
    size_t digits = strspn(p, "0123456789");
    char *cfg2 = NULL;
    cr_assert(asprintf(&cfg2, "%.*s%s%s", (int)(p - cfg), cfg, "77", p + digits) > 0);
    cr_assert(tu_write_file(pathf("%s/n/config.json", M.mnt), cfg2, strlen(cfg2)) == 0);
    mnt_wait_ready("n.jlm", 20);
    char *c = read_text(pathf("%s/n.jlm/config.json", M.mnt));
    cr_assert(c && strstr(c, "\"n_ctx\": 77"), "the view did not follow config.json: %s", c ? c : "");
    free(c);
    free(cfg);
    free(cfg2);
}
