/* test_cli_io.c - what the commands write and read, as a hostile or unlucky
 * user reaches it (issues 40 and 45): every option that takes an output path
 * goes through the checked writer (cli/outfile.h) and refuses a directory,
 * a FIFO (standing for a device node) and the model itself; stdout on
 * /dev/full is exit 1 with one line; prompt files and templates are capped
 * in bounded memory; `jlm run`'s messages (no prompt, the seed's and -t's
 * defaults, -n past the context, -c past the trained context, --stats' byte
 * units); `jlm stats --html -o` on a mount of several models; no function
 * in cli/ over 80 lines. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <jansson.h>
#include <sys/resource.h>
#include <sys/xattr.h>

#include "residency/residency.h"
#include "tests/testutil.h"

static char *T;   /* the test's temp dir */

static void io_init(void)
{
    T = tu_tmpdir();
    cr_assert(T, "cannot create a temp dir");
}

static void io_fini(void)
{
    tu_rmrf(T);
    free(T);
    T = NULL;
}

TestSuite(cli_io, .init = io_init, .fini = io_fini, .timeout = 120);

/* `sh -c CMD` with stdout in *out and stderr in *err (malloc'd; either may
 * be NULL); the exit status. */
static int sh2(const char *cmd, char **out, char **err)
{
    char full[8192], ep[1100];
    snprintf(ep, sizeof ep, "%s/stderr.txt", T);
    snprintf(full, sizeof full, "((%s) 2>'%s')", cmd, ep);
    char *o = NULL;
    int rc = tu_run(full, &o);
    size_t n = 0;
    unsigned char *e = tu_read_file(ep, &n);
    if (out) *out = o; else free(o);
    if (err) *err = e ? (char *)e : strdup(""); else free(e);
    return rc;
}

/* T/NAME.jlm converted from tests/models/GGUF (once per test). */
static const char *model(const char *gguf, const char *name)
{
    static char path[8][1100];
    static int k;
    char *p = path[k++ & 7];
    snprintf(p, 1100, "%s/%s.jlm", T, name);
    if (!tu_exists(p)) {
        jlm_err err = {0};
        char file[300];
        snprintf(file, sizeof file, "%s.jlm", name);
        char *m = tu_convert(gguf, T, file, &err);
        cr_assert(m, "converting %s: %s", gguf, err.msg);
        free(m);
    }
    return p;
}

/* A folder shaped like a jlmfs view, T/DIR/model.jlm, whose xattrs name a
 * residency database (T/res.db) and its key (what `jlm stats` looks at),
 * without a mount. */
static void fake_view(const char *dir, const char *gguf)
{
    char d[1100], db[1100];
    snprintf(d, sizeof d, "%s/%s", T, dir);
    snprintf(db, sizeof db, "%s/res.db", T);
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "mkdir -p '%s'", d) > 0 && system(cmd) == 0);
    free(cmd);
    jlm_err err = {0};
    char *m = tu_convert(gguf, d, "model.jlm", &err);
    cr_assert(m, "converting %s: %s", gguf, err.msg);
    free(m);
    jlm_rdb *r = NULL;
    cr_assert_eq(jlm_rdb_open(db, JLM_RDB_CREATE, &r, &err), 0, "%s", err.msg);
    jlm_rdb_close(r);
    const char *key = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    cr_assert_eq(setxattr(d, "user.jlmfs.db", db, strlen(db), 0), 0, "setxattr on %s (user xattrs needed)", d);
    cr_assert_eq(setxattr(d, "user.jlmfs.model", key, strlen(key), 0), 0);
}

/* ---------------------------------------------------------------- output paths */

/* Every option that takes an output path: the command line with %s for the
 * model (or source) and %s for the path. */
static const struct { const char *opt, *cmd; int gguf; } OUTS[] = {
    {"convert -o", "convert '%s' -o '%s'", 1},
    {"info --html -o", "info '%s' --html -o '%s'", 0},
    {"stats --html -o", "stats '%s' --html -o '%s'", 0},
    {"run --logits", "run '%s' -p Hi -n 1 -t 1 --logits '%s'", 0},
    {"run --trace-routing", "run '%s' -p Hi -n 1 -t 1 --trace-routing '%s'", 0},
};

/* The options marked JLM_OPT_OUT in cli/ are the ones listed in OUTS (a new
 * one must be added there, and so is tested). */
Test(cli_io, the_list_of_output_options_is_every_one_the_cli_marks)
{
    char cmd[1200], *o = NULL;
    snprintf(cmd, sizeof cmd, "grep -ho '\"-[-a-z]*\", JLM_OPT_STR, [^,]*, 0, 0, JLM_OPT_OUT' '%s'/cli/*.c | "
             "cut -d'\"' -f2 | sort | tr '\\n' ' '", tu_root());
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert_str_eq(o, "--logits --output --output --output --trace-routing ", "JLM_OPT_OUT rows in cli/: %s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "grep -l 'JLM_OPT_OUT' '%s'/cli/cmd_*.c | sed 's|.*/cmd_||; s|\\.c$||' | sort | tr '\\n' ' '",
             tu_root());
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert_str_eq(o, "convert info run stats ", "commands with an output path: %s", o);
    free(o);
}

Test(cli_io, every_output_option_refuses_a_directory_a_fifo_and_the_model_itself)
{
    const char *src = tu_model("stories260K.gguf");
    char gg[1100];
    snprintf(gg, sizeof gg, "%s/src.gguf", T);
    size_t n = 0;
    unsigned char *b = tu_read_file(src, &n);
    cr_assert(b && tu_write_file(gg, b, n) == 0);
    free(b);
    const char *jlm = model("stories260K.gguf", "s");
    fake_view("view", "stories260K.gguf");
    char view[1100], vmodel[1100], fifo[1100], dir[1100];
    snprintf(view, sizeof view, "%s/view", T);
    snprintf(vmodel, sizeof vmodel, "%s/view/model.jlm", T);
    snprintf(fifo, sizeof fifo, "%s/out.fifo", T);   /* stands for a device: a test must never risk a real one */
    snprintf(dir, sizeof dir, "%s/adir", T);
    cr_assert(mkfifo(fifo, 0644) == 0 && mkdir(dir, 0755) == 0);
    for (size_t i = 0; i < sizeof OUTS / sizeof OUTS[0]; i++) {
        const char *in = OUTS[i].gguf ? gg : strstr(OUTS[i].opt, "stats") ? view : jlm;
        const char *self = strstr(OUTS[i].opt, "stats") ? vmodel : in;
        const char *targets[3][2] = {{dir, "is a directory"}, {fifo, "is not a regular file"}, {self, "itself"}};
        for (int k = 0; k < 3; k++) {
            if (k == 0 && strstr(OUTS[i].opt, "stats"))
                continue;   /* stats -o on a view: a folder is refused below, on a mount it takes pages */
            char args[3000], cmd[3400], *e = NULL;
            snprintf(args, sizeof args, OUTS[i].cmd, in, targets[k][0]);
            snprintf(cmd, sizeof cmd, "'%s' %s", tu_jlm(), args);
            int rc = sh2(cmd, NULL, &e);
            cr_expect_eq(rc, 2, "%s %s: exit %d: %s", OUTS[i].opt, targets[k][0], rc, e);
            cr_expect(strstr(e, targets[k][1]) && tu_count_lines(e) == 1, "%s %s: %s", OUTS[i].opt, targets[k][0], e);
            free(e);
        }
        struct stat st;
        cr_assert(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "%s: the FIFO is still a FIFO", OUTS[i].opt);
        cr_assert(stat(dir, &st) == 0 && S_ISDIR(st.st_mode), "%s: the folder is still a folder", OUTS[i].opt);
    }
    size_t m = 0;
    unsigned char *c = tu_read_file(gg, &m);
    cr_expect(c && m == n, "the source is untouched");
    free(c);
    char cmd[2400], *e = NULL;   /* the models still open */
    snprintf(cmd, sizeof cmd, "'%s' info '%s' >/dev/null && '%s' info '%s' > /dev/null", tu_jlm(), jlm, tu_jlm(), vmodel);
    cr_expect_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    free(e);
    snprintf(cmd, sizeof cmd, "'%s' stats '%s' --html -o '%s'", tu_jlm(), view, dir);
    cr_expect_eq(sh2(cmd, NULL, &e), 2, "stats on a view, -o a folder: %s", e);
    cr_expect(strstr(e, "is a directory"), "%s", e);
    free(e);
}

Test(cli_io, an_output_file_is_written_whole_and_a_failed_write_leaves_nothing)
{
    const char *jlm = model("stories260K.gguf", "s");
    char cmd[3000], *e = NULL, out[1100];
    snprintf(out, sizeof out, "%s/l.json", T);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n 1 -t 1 --logits '%s' >/dev/null", tu_jlm(), jlm, out);
    cr_assert_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    free(e);
    size_t n = 0;
    unsigned char *b = tu_read_file(out, &n);
    cr_assert(b && n > 2 && b[0] == '[' && !memcmp(b + n - 2, "]\n", 2), "the logits file is one JSON list");
    free(b);
    char part[1200];
    snprintf(part, sizeof part, "%s.part", out);
    cr_expect(!tu_exists(part), "no .part left");
    /* a .part that is a link is never followed */
    char victim[1100];
    snprintf(victim, sizeof victim, "%s/victim", T);
    cr_assert(tu_write_file(victim, "keep", 4) == 0 && symlink(victim, part) == 0);
    snprintf(cmd, sizeof cmd, "'%s' info '%s' --html -o '%s'", tu_jlm(), jlm, out);
    cr_expect_eq(sh2(cmd, NULL, &e), 1, "%s", e);
    cr_expect(tu_count_lines(e) == 1 && strstr(e, "cannot write"), "%s", e);
    free(e);
    b = tu_read_file(victim, &n);
    cr_expect(b && n == 4 && !memcmp(b, "keep", 4), "the link's target is untouched");
    free(b);
}

/* --trace-routing on a MoE model: the header, then one line per (position,
 * MoE block) of the prompt and of every generated token but the last (it is
 * sampled, never evaluated), each with n_used distinct ids below n_expert; the
 * positions of the --print-ids run. A dense model is refused, no file left. */
Test(cli_io, trace_routing_writes_every_token_s_routing_and_refuses_a_dense_model, .timeout = 60)
{
    const char *moe = model("synth-qwen3moe-256.Q8_0.gguf", "q3");
    char cmd[3000], *e = NULL, out[1100];
    snprintf(out, sizeof out, "%s/r.trace", T);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --ids 1,403,407 -n 4 -t 1 --temp 0 --trace-routing '%s' >/dev/null", tu_jlm(),
             moe, out);
    cr_assert_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    free(e);
    FILE *f = fopen(out, "r");
    cr_assert(f, "no trace written");
    unsigned nl, ne, nu;
    unsigned long long eb;
    cr_assert_eq(fscanf(f, "# jlm routing trace 1 n_layer %u n_expert %u n_used %u expert_bytes %llu\n", &nl, &ne, &nu,
                        &eb), 4, "header");
    cr_assert(nl > 0 && nu > 0 && nu <= ne && nu <= 16 && eb >= 4096, "header %u %u %u %llu", nl, ne, nu, eb);
    unsigned lines = 0, pos, blk, seen[8] = {0};
    while (fscanf(f, "%u %u", &pos, &blk) == 2) {
        int ids[16];
        for (unsigned k = 0; k < nu; k++) {
            cr_assert_eq(fscanf(f, "%d", &ids[k]), 1, "line %u: %u ids", lines + 2, nu);
            cr_assert(ids[k] >= 0 && (unsigned)ids[k] < ne, "line %u: id %d", lines + 2, ids[k]);
            for (unsigned j = 0; j < k; j++)
                cr_assert_neq(ids[j], ids[k], "line %u: id %d twice", lines + 2, ids[k]);
        }
        cr_assert(pos < 6 && blk < nl, "line %u: position %u block %u", lines + 2, pos, blk);
        seen[pos]++;
        lines++;
    }
    cr_assert(feof(f), "a line that is not POS BLOCK ID...");
    fclose(f);
    for (unsigned p = 0; p < 6; p++)   /* 3 prompt tokens and 3 of the 4 generated */
        cr_assert_eq(seen[p], nl, "position %u: %u routings, %u blocks", p, seen[p], nl);
    cr_assert_eq(lines, 6 * nl);
    const char *dense = model("stories260K.gguf", "s");
    char out2[1100];
    snprintf(out2, sizeof out2, "%s/d.trace", T);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n 1 -t 1 --trace-routing '%s'", tu_jlm(), dense, out2);
    cr_assert_eq(sh2(cmd, NULL, &e), 2, "%s", e);
    cr_assert(strstr(e, "--trace-routing") && strstr(e, "no routed experts") && tu_count_lines(e) == 1, "%s", e);
    free(e);
    char part[1200];
    snprintf(part, sizeof part, "%s.part", out2);
    cr_assert(!tu_exists(out2) && !tu_exists(part), "nothing written for a dense model");
}

/* --warm-from: a run's own trace orders the background read (unlimited: it
 * reads every page, the traced experts first); the ids are those of the run
 * without it (the order changes which pages are read when, never a result;
 * the moe suite checks it under a budget). A malformed trace (the file and
 * line named), a trace of another model, a dense model and --no-warm are
 * refused: exit 2, one line. */
Test(cli_io, warm_from_orders_the_background_read_and_keeps_the_ids, .timeout = 120)
{
    const char *moe = model("synth-qwen3moe-256.Q8_0.gguf", "q3");
    char cmd[3000], tr[1100], bad[1100], other[1100], *o = NULL, *e = NULL;
    snprintf(tr, sizeof tr, "%s/w.trace", T);
    snprintf(bad, sizeof bad, "%s/bad.trace", T);
    snprintf(other, sizeof other, "%s/other.trace", T);
    const char *run = "'%s' run '%s' --ids 1,403,407 -n 12 -t 2 --temp 0 --print-ids %s '%s'";
    snprintf(cmd, sizeof cmd, run, tu_jlm(), moe, "--trace-routing", tr);
    cr_assert_eq(sh2(cmd, &o, &e), 0, "%s", e);
    char *ids0 = o;
    free(e);
    snprintf(cmd, sizeof cmd, run, tu_jlm(), moe, "--stats --warm-from", tr);
    cr_assert_eq(sh2(cmd, &o, &e), 0, "%s", e);
    cr_assert_str_eq(o, ids0, "ids with --warm-from differ");
    cr_assert(strstr(e, "warm: "), "no background read with --warm-from: %s", e);
    free(o);
    free(e);
    const char *b = "# jlm routing trace 1 n_layer 2 n_expert 4 n_used 2 expert_bytes 9\n0 1 1 2\n0 1 7 1\n";
    const char *x = "# jlm routing trace 1 n_layer 99 n_expert 4 n_used 2 expert_bytes 9\n0 1 1 2\n";
    cr_assert_eq(tu_write_file(bad, b, strlen(b)), 0);
    cr_assert_eq(tu_write_file(other, x, strlen(x)), 0);
    const char *dense = model("stories260K.gguf", "s");
    struct { const char *model, *file, *flags, *want; } C[] = {
        {moe, bad, "", "bad.trace:3: expected n_used expert ids below n_expert"},
        {moe, other, "", "a trace of another model"},
        {dense, tr, "", "no routed experts"},
        {moe, tr, "--no-warm", "--no-warm"},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n 1 -t 1 %s --warm-from '%s'", tu_jlm(), C[i].model,
                 C[i].flags, C[i].file);
        cr_assert_eq(sh2(cmd, NULL, &e), 2, "case %zu: %s", i, e);
        cr_assert(strstr(e, "--warm-from") && strstr(e, C[i].want) && tu_count_lines(e) == 1, "case %zu: %s", i, e);
        free(e);
    }
    free(ids0);
}

/* ---------------------------------------------------------------- stdout */

Test(cli_io, a_full_stdout_is_exit_1_with_one_line_in_every_command)
{
    const char *jlm = model("stories260K.gguf", "s");
    char msgs[1100], tmpl[1100];
    snprintf(msgs, sizeof msgs, "%s/m.json", T);
    snprintf(tmpl, sizeof tmpl, "%s/t.jinja", T);
    const char *m = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    const char *t = "{{ messages[0].content }}";
    cr_assert(tu_write_file(msgs, m, strlen(m)) == 0);
    cr_assert(tu_write_file(tmpl, t, strlen(t)) == 0);
    const char *cmds[] = {"run '%s' -p Hi -n 4 -t 1", "run '%s' -p Hi -n 4 -t 1 --json", "run '%s' -p Hi -n 4 -t 1 --print-ids",
                          "info '%s'", "info '%s' --json", "info '%s' --html", "tokenize '%s' Hello",
                          "tokenize '%s' Hello --ids", "template --template '%s' --messages '%s'", "--version", "--help"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[3000], cmd[3400], *e = NULL;
        snprintf(args, sizeof args, cmds[i], strstr(cmds[i], "template") ? tmpl : jlm, msgs);
        snprintf(cmd, sizeof cmd, "'%s' %s > /dev/full", tu_jlm(), args);
        int rc = sh2(cmd, NULL, &e);
        cr_expect_eq(rc, 1, "%s: exit %d: %s", args, rc, e);
        cr_expect(tu_count_lines(e) == 1 && strstr(e, "stdout: write failed: No space left on device"), "%s: %s", args, e);
        free(e);
    }
}

/* ---------------------------------------------------------------- input caps */

/* Runs cmd under sh; the exit status, its stderr, and the peak RSS in MiB of
 * the largest child so far. */
static int measured(const char *cmd, char **err, long *peak_mib)
{
    int rc = sh2(cmd, NULL, err);
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    *peak_mib = ru.ru_maxrss / 1024;
    return rc;
}

Test(cli_io, prompt_files_and_templates_are_capped_in_bounded_memory)
{
    const char *jlm = model("stories260K.gguf", "s");
    const struct { const char *args, *cap; } C[] = {
        {"run '%s' -f /dev/zero", "-f /dev/zero: larger than 16 MiB"},
        {"run '%s' -p - < /dev/zero", "-p stdin: larger than 16 MiB"},
        {"template --template /dev/zero --messages /dev/null", "--template /dev/zero: larger than 1 MiB"},
        {"template --template /dev/null --messages /dev/zero", "--messages /dev/zero: larger than 16 MiB"},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        char args[2000], cmd[2400], *e = NULL;
        long mib = 0;
        snprintf(args, sizeof args, C[i].args, jlm);
        snprintf(cmd, sizeof cmd, "'%s' %s", tu_jlm(), args);
        int rc = measured(cmd, &e, &mib);
        cr_expect_eq(rc, 1, "%s: exit %d: %s", args, rc, e);
        cr_expect(tu_count_lines(e) == 1 && strstr(e, C[i].cap), "%s: %s", args, e);
        cr_expect(mib < 256, "%s: peak %ld MiB", args, mib);
        free(e);
    }
    /* a prompt under the cap still runs */
    char big[1100], cmd[2400], *e = NULL;
    snprintf(big, sizeof big, "%s/p.txt", T);
    cr_assert(tu_write_file(big, "Once upon a time", 16) == 0);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -f '%s' -n 2 -t 1 >/dev/null", tu_jlm(), jlm, big);
    cr_expect_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    free(e);
}

/* ---------------------------------------------------------------- jlm run's messages */

Test(cli_io, run_without_a_prompt_names_what_is_missing_in_one_line)
{
    const char *jlm = model("stories260K.gguf", "s");
    char cmd[2000], *o = NULL, *e = NULL;
    snprintf(cmd, sizeof cmd, "'%s' run '%s'", tu_jlm(), jlm);
    cr_assert_eq(sh2(cmd, &o, &e), 2, "%s", e);
    cr_expect(tu_count_lines(e) == 1 && strstr(e, "jlm run: no prompt: give -p TEXT, -f FILE"), "%s", e);
    cr_expect(!*o, "nothing on stdout: %s", o);
    free(o); free(e);
    snprintf(cmd, sizeof cmd, "'%s' run -p Hi", tu_jlm());
    cr_assert_eq(sh2(cmd, &o, &e), 2, "%s", e);
    cr_expect(tu_count_lines(e) == 1 && strstr(e, "jlm run: no model: give MODEL or -m FILE"), "%s", e);
    free(o); free(e);
}

Test(cli_io, help_says_the_defaults_that_hold)
{
    const char *cmds[] = {"run", "chat", "bench", "serve"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char cmd[600], *o = NULL;
        snprintf(cmd, sizeof cmd, "'%s' %s --help", tu_jlm(), cmds[i]);
        cr_assert_eq(sh2(cmd, &o, NULL), 0);
        const char *t = strstr(o, "-t, --threads N");
        cr_assert(t, "%s: %s", cmds[i], o);
        const char *eol = strchr(t, '\n');
        cr_expect(!memmem(t, (size_t)(eol - t), "default: 0", 10) && memmem(t, (size_t)(eol - t), "all cores", 9),
                  "%s: %.*s", cmds[i], (int)(eol - t), t);
        const char *s = strstr(o, "--seed S");
        if (s) {
            eol = strchr(s, '\n');
            cr_expect(memmem(s, (size_t)(eol - s), "(default: random)", 17), "%s: %.*s", cmds[i], (int)(eol - s), s);
        }
        free(o);
    }
}

Test(cli_io, n_past_the_context_stops_there_with_a_note_and_exit_0)
{
    const char *jlm = model("stories260K.gguf", "s");
    char cmd[2000], *o = NULL, *e = NULL, *o1 = NULL;
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n 100 -c 32 --temp 0 -t 1 --print-ids", tu_jlm(), jlm);
    int rc = sh2(cmd, &o, &e);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, e);
    cr_expect(strstr(e, "jlm run: note: context full (32 positions): stopped after ") && tu_count_lines(e) == 1, "%s", e);
    cr_expect(e[0] == 'j' && e[strlen(e) - 1] == '\n', "the note is a line of its own: %s", e);
    free(e);
    /* the same ids -n N within the context gives */
    json_t *j = json_loads(o, 0, NULL);
    cr_assert(j, "%s", o);
    size_t n = json_array_size(json_object_get(j, "generated"));
    cr_expect(n == 30, "32 positions less 3 prompt ids, and the last one sampled: %zu", n);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n %zu -c 32 --temp 0 -t 1 --print-ids", tu_jlm(), jlm, n);
    cr_assert_eq(sh2(cmd, &o1, &e), 0, "%s", e);
    cr_expect(!*e, "no note within the context: %s", e);
    cr_expect_str_eq(o, o1);
    json_decref(j);
    free(o); free(o1); free(e);
    /* stdout and stderr one file: the note still starts its own line */
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n 100 -c 32 --temp 0 -t 1 2>&1", tu_jlm(), jlm);
    cr_assert_eq(sh2(cmd, &o, &e), 0, "%s", e);
    cr_expect(strstr(o, "\njlm run: note: context full"), "%s", o);
    free(o); free(e);
}

Test(cli_io, c_past_the_trained_context_warns_once)
{
    const char *jlm = model("stories260K.gguf", "s");   /* trained on 2048 positions... if its header says so */
    char cmd[2000], *e = NULL, *o = NULL;
    snprintf(cmd, sizeof cmd, "'%s' info '%s' --json", tu_jlm(), jlm);
    cr_assert_eq(sh2(cmd, &o, NULL), 0);
    json_t *j = json_loads(o, 0, NULL);
    long long trained = json_integer_value(json_object_get(json_object_get(j, "config"), "n_ctx"));
    json_decref(j);
    free(o);
    cr_assert(trained > 0);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n 2 -t 1 -c %lld --budget 64M >/dev/null", tu_jlm(), jlm, trained * 2);
    cr_assert_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    char want[200];
    snprintf(want, sizeof want, "jlm run: warning: -c %lld is above the model's trained context (%lld positions)",
             trained * 2, trained);
    const char *w = strstr(e, want);
    cr_expect(w && !strstr(w + strlen(want), "trained context"), "once: %s", e);
    free(e);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n 2 -t 1 -c %lld >/dev/null", tu_jlm(), jlm, trained);
    cr_assert_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    cr_expect(!strstr(e, "trained context"), "-c at the trained context: %s", e);
    free(e);
}

Test(cli_io, stats_byte_counts_keep_the_integer_and_add_a_unit)
{
    const char *jlm = model("stories260K.gguf", "s");
    char cmd[2000], *e = NULL;
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p Hi -n 2 -t 1 --stats --budget 64M >/dev/null", tu_jlm(), jlm);
    cr_assert_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    long long pi, ev, br, hi;
    char unit[16];
    double v;
    const char *l = strstr(e, "pager: ");
    cr_assert(l && sscanf(l, "pager: page-ins %lld, evictions %lld, bytes-read %lld (%lf %15[A-Za-z]), hits %lld", &pi,
                          &ev, &br, &v, unit, &hi) == 6, "%s", e);
    double scale = !strcmp(unit, "B") ? 1 : !strcmp(unit, "KiB") ? 1024 : !strcmp(unit, "MiB") ? 1048576 : 0;
    cr_expect(scale > 0 && v * scale <= br * 1.001 + 1 && v * scale >= br * 0.95 - 1, "%lld bytes as %g %s", br, v, unit);
    cr_expect(strstr(e, "\ncpu: ") && strstr(strstr(e, "\ncpu: "), "bytes read ") &&
              sscanf(strstr(strstr(e, "\ncpu: "), "bytes read "), "bytes read %lld (%lf", &br, &v) == 2, "%s", e);
    free(e);
}

/* ---------------------------------------------------------------- jlm stats --html -o */

Test(cli_io, stats_html_on_a_mount_of_several_models_refuses_a_file_and_fills_a_folder)
{
    fake_view("mnt/a", "stories260K.gguf");
    fake_view("mnt/b", "stories260K.gguf");
    char cmd[3000], *e = NULL, out[1100], pages[1100];
    snprintf(out, sizeof out, "%s/page.html", T);
    snprintf(pages, sizeof pages, "%s/pages", T);
    snprintf(cmd, sizeof cmd, "'%s' stats '%s/mnt' --html -o '%s'", tu_jlm(), T, out);
    int rc = sh2(cmd, NULL, &e);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, e);
    cr_expect(tu_count_lines(e) == 1 && strstr(e, "holds 2 models, a page each: give -o DIR"), "%s", e);
    cr_expect(!tu_exists(out), "nothing written");
    free(e);
    cr_assert(mkdir(pages, 0755) == 0);
    snprintf(cmd, sizeof cmd, "'%s' stats '%s/mnt' --html -o '%s'", tu_jlm(), T, pages);
    cr_expect_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    free(e);
    snprintf(cmd, sizeof cmd, "%s/a.html", pages);
    cr_expect(tu_exists(cmd), "a page per model");
    snprintf(cmd, sizeof cmd, "%s/b.html", pages);
    cr_expect(tu_exists(cmd), "a page per model");
    /* a mount of one model: FILE is its page */
    snprintf(cmd, sizeof cmd, "rm -rf '%s/mnt/b' && '%s' stats '%s/mnt' --html -o '%s'", T, tu_jlm(), T, out);
    cr_expect_eq(sh2(cmd, NULL, &e), 0, "%s", e);
    free(e);
    size_t n = 0;
    unsigned char *b = tu_read_file(out, &n);
    cr_expect(b && n > 100 && strstr((char *)b, "<html"), "one page");
    free(b);
}

/* ---------------------------------------------------------------- the CLI's shape */

Test(cli_io, no_function_in_cli_is_over_80_lines)
{
    char cmd[1200], *o = NULL;
    snprintf(cmd, sizeof cmd, "cd '%s' && scripts/check-function-length.sh", tu_root());
    int rc = tu_run(cmd, &o);
    cr_expect_eq(rc, 0, "%s", o);
    free(o);
    /* the check itself fails on a long function */
    char f[1100];
    snprintf(f, sizeof f, "%s/long.c", T);
    FILE *fp = fopen(f, "w");
    cr_assert(fp);
    fputs("static int long_one(void)\n{\n", fp);
    for (int i = 0; i < 81; i++)
        fprintf(fp, "    x(%d);\n", i);
    fputs("}\n", fp);
    fclose(fp);
    snprintf(cmd, sizeof cmd, "cd '%s' && scripts/check-function-length.sh '%s'", tu_root(), f);
    cr_expect_eq(tu_run(cmd, &o), 1, "%s", o);
    cr_expect(strstr(o, "long_one is 81 lines (max 80)"), "%s", o);
    free(o);
}
