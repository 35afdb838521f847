/* test_cli_models.c - the model-management commands (jlm list, show, rm, ps,
 * cache prune), `jlm info` on a source without converting it, and the
 * messages a new user meets (issue 45). Every test points XDG_CACHE_HOME at
 * its own temp dir. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/testutil.h"

/* Runs `jlm ARGS` with the cache in DIR/cache; stdout+stderr in *out. */
static int jlm_in(const char *dir, const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache' '%s' %s", dir, tu_jlm(), args);
    return tu_run(cmd, out);
}

/* How many files DIR/cache/jlm holds. */
static int cache_count(const char *dir)
{
    char d[1100];
    snprintf(d, sizeof d, "%s/cache/jlm", dir);
    DIR *h = opendir(d);
    int n = 0;
    struct dirent *de;
    while (h && (de = readdir(h)))
        n += de->d_name[0] != '.';
    if (h)
        closedir(h);
    return n;
}

/* Lines of s containing needle. */
static int count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *l = s; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char *line = strndup(l, len);
        n += strstr(line, needle) != NULL;
        free(line);
        l = e ? e + 1 : NULL;
    }
    return n;
}

/* ---------------------------------------------------------------- messages */
Test(cli_models, requantization_notes_are_one_line_per_type_pair, .timeout = 60)
{
    char *dir = tu_tmpdir(), args[2048], *o;
    snprintf(args, sizeof args, "convert '%s' -o '%s/a.jlm'", tu_model("synth-llama-256.Q2_K.gguf"), dir);
    cr_assert_eq(jlm_in(dir, args, &o), 0, "%s", o);
    cr_assert_eq(count_lines(o, "re-quantized"), 1, "one note for the (Q2_K, Q4_K) pair:\n%s", o);
    cr_assert(strstr(o, "Q2_K") && strstr(o, "stored as Q4_K") && strstr(o, "17 tensors"), "%s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, type_q4_1_says_it_is_stored_as_q5_1, .timeout = 60)
{
    char *dir = tu_tmpdir(), args[2048], *o;
    snprintf(args, sizeof args, "convert '%s' --type Q4_1 -o '%s/a.jlm'", tu_model("synth-llama-256.f32.gguf"), dir);
    cr_assert_eq(jlm_in(dir, args, &o), 0, "%s", o);
    cr_assert_eq(count_lines(o, "stored as Q5_1"), 1, "one note for --type Q4_1:\n%s", o);
    cr_assert(strstr(o, "Q4_1"), "%s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, an_mmproj_run_as_a_model_gets_the_mmproj_hint, .timeout = 60)
{
    char *dir = tu_tmpdir(), args[2048], *o;
    snprintf(args, sizeof args, "run '%s' -p hi -n 1", tu_model("mmproj-tinygemma3.gguf"));
    cr_assert_eq(jlm_in(dir, args, &o), 1, "%s", o);
    cr_assert(strstr(o, "--mmproj") && strstr(o, "vision projector"), "%s", o);
    cr_assert_eq(cache_count(dir), 0, "a cache file from a refused source");
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, a_hugging_face_folder_without_a_tokenizer_says_the_files_are_missing, .timeout = 120)
{
    char *dir = tu_tmpdir(), cmd[3000], *o;
    snprintf(cmd, sizeof cmd, "mkdir '%s/m' && cp '%s/tests/models/hf/tiny-llama/config.json' "
             "'%s/tests/models/hf/tiny-llama/model.safetensors' '%s/m/'", dir, tu_root(), tu_root(), dir);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "run '%s/m' -p hi -n 1", dir);
    cr_assert_eq(jlm_in(dir, cmd, &o), 1, "%s", o);
    cr_assert(strstr(o, "tokenizer files are missing") && strstr(o, "tokenizer.json"), "%s", o);
    cr_assert(!strstr(o, "kind 0"), "%s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, bench_prints_a_long_model_name_whole, .timeout = 120)
{
    char *dir = tu_tmpdir(), cmd[3000], *o;
    const char *name = "a-model-name-longer-than-twenty-four-characters.gguf";
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/%s'", tu_model("stories260K.gguf"), dir, name);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "bench '%s/%s' -p 8 -n 4 -r 1", dir, name);
    cr_assert_eq(jlm_in(dir, cmd, &o), 0, "%s", o);
    char row[200];
    snprintf(row, sizeof row, "| %s |", name);
    cr_assert_eq(count_lines(o, row), 2, "the whole name in both rows:\n%s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- jlm info SOURCE */
Test(cli_models, info_of_a_gguf_reads_its_header_without_a_cache_entry, .timeout = 60)
{
    char *dir = tu_tmpdir(), args[2048], *o;
    snprintf(args, sizeof args, "info '%s' --tensors", tu_model("synth-llama-256.Q4_K_M.gguf"));
    cr_assert_eq(jlm_in(dir, args, &o), 0, "%s", o);
    cr_assert(strstr(o, "GGUF source") && strstr(o, "not converted"), "%s", o);
    cr_assert(strstr(o, "arch          llama"), "%s", o);
    cr_assert(strstr(o, "blk.0.attn_q.weight") && strstr(o, "token_embd.weight"), "%s", o);
    cr_assert(!strstr(o, "converting"), "%s", o);
    cr_assert_eq(cache_count(dir), 0, "jlm info made a cache entry");
    free(o);
    snprintf(args, sizeof args, "info '%s' --json", tu_model("synth-llama-256.Q4_K_M.gguf"));
    cr_assert_eq(jlm_in(dir, args, &o), 0, "%s", o);
    cr_assert(strstr(o, "\"arch\": \"llama\"") && strstr(o, "\"kind\": \"gguf\""), "%s", o);
    cr_assert_eq(cache_count(dir), 0, "jlm info --json made a cache entry");
    free(o);
    tu_rmrf(dir);
    free(dir);
}
