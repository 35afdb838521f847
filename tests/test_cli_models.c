/* test_cli_models.c - the model-management commands (jlm list, show, rm, ps,
 * cache prune), `jlm info` on a source without converting it, and the
 * messages a new user meets (issue 45). Every test points XDG_CACHE_HOME at
 * its own temp dir. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/mntutil.h"

/* Runs `jlm ARGS` with the cache in DIR/cache; stdout+stderr in *out. */
static int jlm_in(const char *dir, const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache' '%s' %s", dir, tu_jlm(), args);
    return tu_run(cmd, out);
}

/* `jlm ARGS` (a printf format) with the cache in DIR/cache, asserting its
 * exit status is rc; its stdout+stderr (malloc'd). */
static char *jlm_rc(const char *dir, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static char *jlm_rc(const char *dir, int rc, const char *fmt, ...)
{
    char args[3000], *o = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    int got = jlm_in(dir, args, &o);
    cr_assert_eq(got, rc, "jlm %s: exit %d, expected %d:\n%s", args, got, rc, o);
    return o;
}

/* `jlm ARGS` exits rc and says needle. */
static void jlm_says(const char *dir, int rc, const char *args, const char *needle)
{
    char *o = jlm_rc(dir, rc, "%s", args);
    cr_assert(strstr(o, needle), "jlm %s does not say '%s':\n%s", args, needle, o);
    free(o);
}

/* How many files DIR/cache/jlm holds. */
static int cache_count(const char *dir)
{
    char d[1100];
    snprintf(d, sizeof d, "%s/cache/jlm", dir);
    DIR *h = opendir(d);
    int n = 0;
    struct dirent *de;
    while (h && (de = readdir(h))) {
        size_t l = strlen(de->d_name);   /* a checksum sidecar goes with its entry (docs/checksums.md) */
        n += de->d_name[0] != '.' && !(l > 5 && !strcmp(de->d_name + l - 5, ".sums"));
    }
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
    char *dir = tu_tmpdir(), *o = jlm_rc(dir, 0, "convert '%s' -o '%s/a.jlm'", tu_model("synth-llama-256.Q2_K.gguf"), dir);
    cr_assert_eq(count_lines(o, "re-quantized"), 1, "one note for the (Q2_K, Q4_K) pair:\n%s", o);
    cr_assert(strstr(o, "Q2_K") && strstr(o, "stored as Q4_K") && strstr(o, "17 tensors"), "%s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, type_q4_1_says_it_is_stored_as_q5_1, .timeout = 60)
{
    char *dir = tu_tmpdir(),
         *o = jlm_rc(dir, 0, "convert '%s' --type Q4_1 -o '%s/a.jlm'", tu_model("synth-llama-256.f32.gguf"), dir);
    cr_assert_eq(count_lines(o, "stored as Q5_1"), 1, "one note for --type Q4_1:\n%s", o);
    cr_assert(strstr(o, "Q4_1"), "%s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, an_mmproj_run_as_a_model_gets_the_mmproj_hint, .timeout = 60)
{
    char *dir = tu_tmpdir(), *o = jlm_rc(dir, 1, "run '%s' -p hi -n 1", tu_model("mmproj-tinygemma3.gguf"));
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
    o = jlm_rc(dir, 1, "run '%s/m' -p hi -n 1", dir);
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
    o = jlm_rc(dir, 0, "bench '%s/%s' -p 8 -n 4 -r 1", dir, name);
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
    char *dir = tu_tmpdir(), *o = jlm_rc(dir, 0, "info '%s' --tensors", tu_model("synth-llama-256.Q4_K_M.gguf"));
    cr_assert(strstr(o, "GGUF source") && strstr(o, "not converted"), "%s", o);
    cr_assert(strstr(o, "arch          llama"), "%s", o);
    cr_assert(strstr(o, "blk.0.attn_q.weight") && strstr(o, "token_embd.weight"), "%s", o);
    cr_assert(!strstr(o, "converting"), "%s", o);
    cr_assert_eq(cache_count(dir), 0, "jlm info made a cache entry");
    free(o);
    o = jlm_rc(dir, 0, "info '%s' --json", tu_model("synth-llama-256.Q4_K_M.gguf"));
    cr_assert(strstr(o, "\"arch\": \"llama\"") && strstr(o, "\"kind\": \"gguf\""), "%s", o);
    cr_assert_eq(cache_count(dir), 0, "jlm info --json made a cache entry");
    free(o);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- list, show, rm, ps, cache prune */
/* A cache with two models (stories260K as story, synth-llama-256.Q4_K_M as
 * synth), each converted by `jlm tokenize`. */
static char *two_models(void)
{
    char *dir = tu_tmpdir(), cmd[3000], *o;
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/story.gguf' && cp '%s' '%s/synth.gguf'", tu_model("stories260K.gguf"), dir,
             tu_model("synth-llama-256.Q4_K_M.gguf"), dir);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "tokenize '%s/%s.gguf' a --ids", dir, i ? "synth" : "story");
        o = jlm_rc(dir, 0, "%s", cmd);
        free(o);
    }
    cr_assert_eq(cache_count(dir), 2);
    return dir;
}

/* The line of s starting with name (a static copy), or NULL. */
static const char *row_of(const char *s, const char *name)
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

/* Starts `jlm chat MODEL` in the background (its stdin a pipe open for
 * `hold` seconds) and waits until `jlm ps` shows it; returns its pid. */
static long running_engine(const char *dir, const char *model, const char *name, const char *ps_args, int hold)
{
    char cmd[4000], *o = NULL;
    snprintf(cmd, sizeof cmd, "(sleep %d 2>/dev/null | XDG_CACHE_HOME='%s/cache' '%s' chat '%s' -n 1 >/dev/null 2>&1 &) "
             ">/dev/null 2>&1", hold,
             dir, tu_jlm(), model);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    long pid = 0;
    for (int i = 0; i < 200 && !pid; i++) {
        snprintf(cmd, sizeof cmd, "ps %s", ps_args);
        free(o);
        o = jlm_rc(dir, 0, "%s", cmd);
        const char *r = row_of(o, name);
        if (r)
            pid = atol(r + strlen(name));
        else
            usleep(50000);
    }
    cr_assert(pid > 0, "jlm ps never showed the engine on %s:\n%s", model, o);
    free(o);
    return pid;
}

static void stop_engine(long pid)
{
    kill((pid_t)pid, SIGTERM);
    for (int i = 0; i < 100 && kill((pid_t)pid, 0) == 0; i++)
        usleep(20000);
}

Test(cli_models, list_shows_each_cached_model_with_its_arch_params_type_and_size, .timeout = 120)
{
    char *dir = two_models(), args[2048], *o;
    snprintf(args, sizeof args, "list --models '%s/tests/models/hf'", tu_root());
    o = jlm_rc(dir, 0, "%s", args);
    const char *r = row_of(o, "story");
    cr_assert(r && strstr(r, "llama") && strstr(r, "F32") && strstr(r, "K ") && strstr(r, "MiB") &&
              strstr(r, "ago") && strstr(r, "cache"), "%s", o);
    r = row_of(o, "synth");
    cr_assert(r && strstr(r, "llama") && strstr(r, "Q4_K") && strstr(r, "M "), "%s", o);
    r = row_of(o, "tiny-qwen2");
    cr_assert(r && strstr(r, "qwen2") && strstr(r, "BF16") && strstr(r, "/tests/models/hf"), "%s", o);
    cr_assert_eq(cache_count(dir), 2, "jlm list --models converted something");
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, show_prints_architecture_parameters_context_template_and_license, .timeout = 120)
{
    char *dir = two_models(), cmd[3000], *o, *i;
    o = jlm_rc(dir, 0, "%s", "show story");
    snprintf(cmd, sizeof cmd, "info '%s/story.gguf' --json", dir);
    cr_assert_eq(jlm_in(dir, cmd, &i), 0, "%s", i);
    const char *c = strstr(i, "\"n_ctx\": ");
    cr_assert(c, "%s", i);
    char want[64];
    snprintf(want, sizeof want, "context length  %ld", atol(c + 9));
    cr_assert(strstr(o, "architecture    llama") && strstr(o, want) && strstr(o, "quantization    F32"), "%s", o);
    free(o);
    free(i);
    /* a tokenizer-only folder carries a chat template, its model card a license */
    snprintf(cmd, sizeof cmd, "mkdir '%s/q' && cp '%s/tests/models/hf-tok/qwen3/tokenizer_config.json' '%s/q/' && "
             "xz -dc '%s/tests/models/hf-tok/qwen3/tokenizer.json.xz' > '%s/q/tokenizer.json' && "
             "printf -- '---\\nlicense: apache-2.0\\n---\\n# Qwen3\\n' > '%s/q/README.md'",
             dir, tu_root(), dir, tu_root(), dir, dir);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "show '%s/q'", dir);
    o = jlm_rc(dir, 0, "%s", cmd);
    cr_assert(strstr(o, "template\n") && strstr(o, "<|im_start|>"), "%s", o);
    cr_assert(strstr(o, "License\n    apache-2.0"), "%s", o);
    free(o);
    jlm_says(dir, 1, "show nosuchmodel", "nosuchmodel: no such file or cache entry");
    tu_rmrf(dir);
    free(dir);
}

/* A GGUF's general.license: stories260K.gguf with that key put first (a
 * 64-byte key/value, so the data keeps its 32-byte alignment). */
Test(cli_models, show_prints_a_gguf_license, .timeout = 60)
{
    char *dir = tu_tmpdir(), p[1200];
    static const char key[] = "general.license", val[] = "CC-BY-4.0 and MIT, for a test";
    size_t n = 0, kl = strlen(key), vl = strlen(val), kv = 8 + kl + 4 + 8 + vl;
    cr_assert_eq(kv % 32, 0);
    unsigned char *g = tu_read_file(tu_model("stories260K.gguf"), &n), *o = malloc(n + kv);
    cr_assert(g && o && n > 24);
    memcpy(o, g, 24);
    uint64_t nkv, l;
    uint32_t ty = 8;   /* GGUF string */
    memcpy(&nkv, g + 16, 8);
    nkv++;
    memcpy(o + 16, &nkv, 8);
    unsigned char *w = o + 24;
    l = kl;
    memcpy(w, &l, 8), w += 8, memcpy(w, key, kl), w += kl, memcpy(w, &ty, 4), w += 4;
    l = vl;
    memcpy(w, &l, 8), w += 8, memcpy(w, val, vl), w += vl;
    memcpy(w, g + 24, n - 24);
    snprintf(p, sizeof p, "%s/lic.gguf", dir);
    cr_assert_eq(tu_write_file(p, o, n + kv), 0);
    free(g);
    free(o);
    char *out = jlm_rc(dir, 0, "show '%s'", p);
    cr_assert(strstr(out, "License\n    CC-BY-4.0 and MIT, for a test\n") && strstr(out, "architecture    llama"), "%s",
              out);
    free(out);
    tu_rmrf(dir);
    free(dir);
}

/* A Hugging Face hub snapshot links each file to its blob: the cache key
 * follows the links, so a link retargeted to a new blob is a new source (a
 * new entry), and the same links again are the same one. */
Test(cli_models, a_snapshot_folder_of_symlinks_is_keyed_by_the_files_they_name, .timeout = 120)
{
    char *dir = tu_tmpdir(), cmd[4000], *o;
    snprintf(cmd, sizeof cmd, "mkdir '%s/blobs' '%s/snap' && cp '%s/tests/models/hf/tiny-llama/config.json' "
             "'%s/blobs/c1' && cp '%s/tests/models/hf/tiny-llama/model.safetensors' '%s/blobs/m1' && "
             "ln -s ../blobs/c1 '%s/snap/config.json' && ln -s ../blobs/m1 '%s/snap/model.safetensors'",
             dir, dir, tu_root(), dir, tu_root(), dir, dir, dir);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    o = jlm_rc(dir, 0, "run '%s/snap' --ids 1,2,3 -n 2 --temp 0", dir);
    cr_assert(strstr(o, "converting snap into the cache"), "%s", o);
    free(o);
    o = jlm_rc(dir, 0, "run '%s/snap' --ids 1,2,3 -n 2 --temp 0", dir);
    cr_assert(!strstr(o, "converting"), "the same links: the same entry: %s", o);
    free(o);
    /* a new revision: config.json now links to another blob */
    snprintf(cmd, sizeof cmd, "cp '%s/blobs/c1' '%s/blobs/c2' && ln -sfn ../blobs/c2 '%s/snap/config.json'", dir, dir,
             dir);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    o = jlm_rc(dir, 0, "run '%s/snap' --ids 1,2,3 -n 2 --temp 0", dir);
    cr_assert(strstr(o, "converting snap into the cache"), "a retargeted link is a new source: %s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, rm_and_prune_never_remove_an_entry_a_running_engine_holds, .timeout = 120)
{
    char *dir = two_models(), model[1200], *o;
    snprintf(model, sizeof model, "%s/synth.gguf", dir);
    long pid = running_engine(dir, model, "synth", "", 20);
    o = jlm_rc(dir, 0, "%s", "ps");
    const char *r = row_of(o, "synth");
    cr_assert(r && strstr(r, "llama") && strstr(r, "cache"), "%s", o);
    cr_assert(!row_of(o, "story"), "story is not running:\n%s", o);
    free(o);
    jlm_says(dir, 1, "rm synth", "in use by a running process");
    cr_assert_eq(cache_count(dir), 2);
    o = jlm_rc(dir, 0, "%s", "cache prune --max-size 0");
    cr_assert(strstr(o, "deleted 'story@") && !strstr(o, "deleted 'synth@") && strstr(o, "1 in use kept"), "%s", o);
    free(o);
    cr_assert_eq(cache_count(dir), 1);
    stop_engine(pid);
    jlm_says(dir, 0, "rm synth", "deleted 'synth@");
    cr_assert_eq(cache_count(dir), 0);
    jlm_says(dir, 1, "rm synth", "no such cache entry");
    tu_rmrf(dir);
    free(dir);
}

/* A server or run on a .jlm outside the cache shows in jlm ps with its folder. */
Test(cli_models, ps_shows_an_engine_on_a_jlm_where_it_lies, .timeout = 120)
{
    char *dir = tu_tmpdir(), model[1200];
    free(jlm_rc(dir, 0, "convert '%s' -o '%s/x.jlm'", tu_model("stories260K.gguf"), dir));
    snprintf(model, sizeof model, "%s/x.jlm", dir);
    long pid = running_engine(dir, model, "x.jlm", "", 20);
    char *o = jlm_rc(dir, 0, "%s", "ps");
    const char *r = row_of(o, "x.jlm");
    cr_assert(r && strstr(r, "llama") && strstr(r, dir), "%s", o);
    free(o);
    stop_engine(pid);
    o = jlm_rc(dir, 0, "%s", "ps");
    cr_assert(!row_of(o, "x.jlm"), "a dead engine is still listed:\n%s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, prune_older_than_removes_only_entries_unused_that_long, .timeout = 120)
{
    char *dir = two_models(), p[1400], *o;
    snprintf(p, sizeof p, "%s/cache/jlm", dir);
    DIR *d = opendir(p);
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "story@", 6)) {
            struct timespec ts[2] = {{time(NULL) - 3 * 86400, 0}, {0, UTIME_OMIT}};   /* last used 3 days ago */
            cr_assert_eq(utimensat(dirfd(d), de->d_name, ts, 0), 0);
        }
    closedir(d);
    o = jlm_rc(dir, 0, "%s", "cache prune --older-than 2d");
    cr_assert(strstr(o, "deleted 'story@") && !strstr(o, "synth@"), "%s", o);
    free(o);
    cr_assert_eq(cache_count(dir), 1);
    jlm_says(dir, 2, "cache prune --older-than soon", "--older-than soon: not a duration");
    snprintf(p, sizeof p, "cache prune '%s/cache/jlm' --max-size 0", dir);
    o = jlm_rc(dir, 0, "%s", p);
    cr_assert(strstr(o, "deleted 'synth@"), "%s", o);
    free(o);
    cr_assert_eq(cache_count(dir), 0);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_models, every_model_command_has_help, .timeout = 30)
{
    static const char *const cmds[] = {"list", "show", "rm", "ps", "cache prune", "cache"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *dir = tu_tmpdir(), args[256], *o;
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        cr_assert_eq(jlm_in(dir, args, &o), 0, "%s: %s", cmds[i], o);
        cr_assert(strstr(o, "usage") || strstr(o, "Usage"), "%s: %s", cmds[i], o);
        free(o);
        tu_rmrf(dir);
        free(dir);
    }
}

/* scripts/completion/jlm under bash-completion (which sets extglob, as
 * scripts/deps.sh installs it): `jlmfs -o t<TAB>` offers type=, `jlm rm
 * <TAB>` the cache's entry names, `jlm run <TAB>` the GGUF beside a text file. */
Test(cli_models, completion_offers_type_cache_names_and_models, .timeout = 120)
{
    char *dir = two_models(), cmd[4000], *o;
    snprintf(cmd, sizeof cmd, "touch '%s/notes.txt'; cd '%s' && XDG_CACHE_HOME='%s/cache' bash -c '"
             ". /usr/share/bash-completion/bash_completion; . \"%s/scripts/completion/jlm\"; "
             "COMP_WORDS=(jlmfs -o t); COMP_CWORD=2; _jlmfs; echo \"${COMPREPLY[*]}\"; "
             "COMP_WORDS=(\"%s\" rm \"\"); COMP_CWORD=2; _jlm; echo \"${COMPREPLY[*]}\"; "
             "COMP_WORDS=(\"%s\" run s); COMP_CWORD=2; _jlm; echo \"${COMPREPLY[*]}\"; "
             "COMP_WORDS=(\"%s\" run n); COMP_CWORD=2; _jlm; echo \"[${COMPREPLY[*]}]\"'",
             dir, dir, dir, tu_root(), tu_jlm(), tu_jlm(), tu_jlm());
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    char l[4][256] = {"", "", "", ""};   /* readdir's order: each line's words in any order */
    cr_assert_eq(sscanf(o, "%255[^\n]\n%255[^\n]\n%255[^\n]\n%255[^\n]", l[0], l[1], l[2], l[3]), 4, "'%s'", o);
    cr_assert_str_eq(l[0], "type=", "jlmfs -o: '%s'", o);
    cr_assert(!strcmp(l[1], "story synth") || !strcmp(l[1], "synth story"), "jlm rm: '%s'", o);
    cr_assert(!strcmp(l[2], "story.gguf synth.gguf") || !strcmp(l[2], "synth.gguf story.gguf"), "jlm run: '%s'", o);
    cr_assert_str_eq(l[3], "[]", "a text file is no model: '%s'", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

/* The README's main command says what it is doing: one line per stage, in
 * order (deps, build, mount, convert, generate), before each stage runs. */
Test(cli_models, demo_prints_one_line_per_stage, .timeout = 300)
{
    char cmd[2048], *o;
    snprintf(cmd, sizeof cmd, "timeout 280 '%s/scripts/demo.sh'", tu_root());
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    static const char *const st[] = {"== [1/5] deps: ", "== [2/5] build: ", "== [3/5] mount: ", "== [4/5] convert: ",
                                     "== [5/5] generate: "};
    const char *at = o;
    for (int i = 0; i < 5; i++) {
        const char *p = strstr(at, st[i]);
        cr_assert(p, "no '%s' after the stages before it:\n%s", st[i], o);
        at = p + 1;
    }
    cr_assert(strstr(at, "== stats"), "the demo did not finish:\n%s", o);
    free(o);
}

/* The conversion inside `jlm run x.gguf`: a bar on a terminal (a pty from
 * script(1)); nothing in a pipe unless asked (JLM_PROGRESS=1: a few log lines);
 * `jlm convert` in a pipe is quiet too, `--progress` asks. */
Test(cli_models, conversion_progress_on_a_terminal_only_unless_asked, .timeout = 180)
{
    char *dir = tu_tmpdir(), cmd[4000], *o;
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/a.gguf' && cp '%s' '%s/b.gguf' && cp '%s' '%s/c.gguf'",
             tu_model("synth-llama-256.f32.gguf"), dir, tu_model("synth-llama-256.f32.gguf"), dir,
             tu_model("synth-llama-256.f32.gguf"), dir);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "run '%s/a.gguf' -p hi -n 1", dir);
    o = jlm_rc(dir, 0, "%s", cmd);
    cr_assert(strstr(o, "converting a.gguf") && !strstr(o, "% (") && !strchr(o, '\r'), "a pipe: %s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "convert '%s/a.gguf' -o '%s/a.jlm'", dir, dir);
    o = jlm_rc(dir, 0, "%s", cmd);
    cr_assert(!strstr(o, "% (") && strstr(o, "jlm convert: wrote "), "a pipe: %s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "JLM_PROGRESS=1 XDG_CACHE_HOME='%s/cache' '%s' run '%s/b.gguf' -p hi -n 1", dir, tu_jlm(),
             dir);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    /* the first line at the first update past 25% (how far it got depends on the machine's speed) */
    cr_assert(strstr(o, "jlm run: ") && strstr(o, "% (") && strstr(o, " MiB of 13.0 MiB, "), "asked: %s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache' script -qec \"'%s' run '%s/c.gguf' -p hi -n 1\" /dev/null",
             dir, tu_jlm(), dir);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strchr(o, '\r') && strstr(o, "] 100%") && strstr(o, "13.0 MiB of 13.0 MiB"), "a terminal: %s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- on a jlmfs mount */
/* `jlm list` and `jlm ps` on a mount with a running engine (tests/mntutil.h's
 * fixture: a private SRC, mount point and cache per test). */
static void fs_fini(void) { mnt_fini(); }

TestSuite(cli_models_fs, .init = mnt_dirs, .fini = fs_fini, .timeout = 90);

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
    const char *r = row_of(o, "m.jlm");
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
        if ((r = row_of(o, "m.jlm")) && !strstr(r, "       -  "))   /* its session registered: PAGES known */
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
    cr_assert(!row_of(o, "m.jlm"), "a dead engine is still listed:\n%s", o);
    free(o);
}
