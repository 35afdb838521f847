/* test_cli_ux.c - issue 15's command-line behaviour, through the binaries:
 * a view in error answers with its status; info/tokenize/template take a view
 * folder; `jlm run --json`; the newline on a terminal; `jlm bench -o`;
 * `jlm convert`'s progress and output check; `jlm stats`'s summary; a GGUF
 * inside a mount runs its view (docs/cli.md). Every test that runs a GGUF
 * points XDG_CACHE_HOME at its own temp dir. */
#include <criterion/criterion.h>

#include <jansson.h>
#include <pty.h>
#include <sys/mount.h>

#include "tests/mntutil.h"

static char *T;   /* the test's temp dir (not the mount fixture's) */

static void ux_init(void)
{
    if (T)
        return;   /* the suite's .init and a test's own both name it: one temp dir */
    T = tu_tmpdir();
    cr_assert(T, "cannot create a temp dir");
}

static void ux_fini(void)
{
    tu_rmrf(T);
    free(T);
    T = NULL;
}

TestSuite(cli_ux, .init = ux_init, .fini = ux_fini, .timeout = 60);

/* Runs `jlm ARGS` with XDG_CACHE_HOME=T/cache: stdout in *out, stderr in *err
 * (both malloc'd, NUL-terminated); the exit status. */
static int jlm2(const char *args, char **out, char **err)
{
    char cmd[8192], ep[1200];
    snprintf(ep, sizeof ep, "%s/stderr", T);
    snprintf(cmd, sizeof cmd, "(XDG_CACHE_HOME='%s/cache' '%s' %s 2>'%s')", T, tu_jlm(), args, ep);
    int rc = tu_run(cmd, out);
    size_t n = 0;
    unsigned char *e = tu_read_file(ep, &n);
    *err = calloc(1, n + 1);
    cr_assert(*err, "out of memory");
    if (e)
        memcpy(*err, e, n);
    free(e);
    return rc;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Runs `sh -c cmd` on a pseudo-terminal (stdout and stderr both the pty);
 * everything it wrote, malloc'd. The exit status in *rc. */
static char *on_pty(const char *cmd, int *rc)
{
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    cr_assert(pid >= 0, "forkpty: %s", strerror(errno));
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    cr_assert(b);
    for (;;) {
        if (cap - len < 4096) {
            b = realloc(b, cap *= 2);
            cr_assert(b);
        }
        ssize_t r = read(master, b + len, cap - len - 1);
        if (r <= 0)
            break;   /* EIO once the child closed the pty */
        len += (size_t)r;
    }
    b[len] = 0;
    close(master);
    int st = 0;
    waitpid(pid, &st, 0);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return b;
}

/* A converted copy of tests/models/<gguf> at T/<dir>/model.jlm: a folder shaped
 * like a jlmfs view (what the CLI looks at), without a mount. */
static char *fake_view(const char *gguf, const char *dir)
{
    char *d = NULL;
    cr_assert(asprintf(&d, "%s/%s", T, dir) > 0);
    cr_assert(mkdir(d, 0755) == 0, "mkdir %s", d);
    jlm_err err = {0};
    char *m = tu_convert(gguf, d, "model.jlm", &err);
    cr_assert(m, "converting %s: %s", gguf, err.msg);
    free(m);
    return d;
}

/* ---------------------------------------------------------------- views */

Test(cli_ux, a_view_in_error_answers_with_its_status_in_every_command)
{
    char v[1100], st[1200], args[4096], *out, *err;
    snprintf(v, sizeof v, "%s/bad.jlm", T);
    cr_assert(mkdir(v, 0755) == 0);
    snprintf(st, sizeof st, "%s/status", v);
    const char *line = "error: truncated GGUF: tensor data ends at byte 4096";
    cr_assert(tu_write_file(st, line, strlen(line)) == 0);
    tu_write_file(pathf("%s/msgs.json", T), "[]", 2);
    const char *cmds[] = {"run '%s' -p hello", "info '%s'", "tokenize '%s' hello", "bench '%s' -p 4 -n 0 -r 1",
                          "template '%s' --messages '%s/msgs.json'"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(args, sizeof args, cmds[i], v, T);
        int rc = jlm2(args, &out, &err);
        cr_expect(rc == 1 && count_lines(err) == 1 && strstr(err, "bad.jlm: status: error: truncated GGUF") &&
                      !strstr(err, "No such file"),
                  "jlm %s: exit %d, stderr:\n%s", args, rc, err);
        cr_expect(!*out, "jlm %s: stdout '%s'", args, out);
        free(out);
        free(err);
    }
    /* a view still converting runs (its pages are packed as they are read), after a note */
    char *cv = fake_view("stories260K.gguf", "conv.jlm");
    const char *conv = "converting 37% (212 MiB of 573 MiB)\n";
    cr_assert(tu_write_file(pathf("%s/status", cv), conv, strlen(conv)) == 0);
    snprintf(args, sizeof args, "tokenize '%s' hello --ids", cv);
    int crc = jlm2(args, &out, &err);
    cr_expect(crc == 0 && *out == '[' && count_lines(err) == 1 &&
                  strstr(err, "conv.jlm is still converting (converting 37% (212 MiB of 573 MiB))"),
              "exit %d, stdout %s, stderr %s", crc, out, err);
    free(out);
    free(err);
    free(cv);
    /* a folder that is no view at all: one line saying so */
    snprintf(v, sizeof v, "%s/plain", T);
    cr_assert(mkdir(v, 0755) == 0);
    snprintf(args, sizeof args, "run '%s' -p hello", v);
    int rc = jlm2(args, &out, &err);
    cr_expect(rc == 1 && count_lines(err) == 1 && strstr(err, "plain: a directory without model.jlm"), "exit %d: %s",
              rc, err);
    free(out);
    free(err);
}

Test(cli_ux, info_tokenize_and_template_take_a_view_folder_like_run, .timeout = 120)
{
    char *v = fake_view("vocab/ggml-vocab-phi-3.gguf", "p.jlm"), args[4096], *o1, *e1, *o2, *e2;
    const char *msgs = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    tu_write_file(pathf("%s/msgs.json", T), msgs, strlen(msgs));
    const char *cmds[] = {"tokenize %s 'Hello world' --ids", "tokenize %s 'Hello world'",
                          "template %s --messages %s/msgs.json --add-generation-prompt", "info %s --json"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char folder[1200], file[1300];
        snprintf(folder, sizeof folder, "'%s'", v);
        snprintf(file, sizeof file, "'%s/model.jlm'", v);
        snprintf(args, sizeof args, cmds[i], folder, T);
        int r1 = jlm2(args, &o1, &e1);
        snprintf(args, sizeof args, cmds[i], file, T);
        int r2 = jlm2(args, &o2, &e2);
        cr_assert(r1 == 0 && r2 == 0, "%s: exit %d (folder) and %d (file): %s %s", cmds[i], r1, r2, e1, e2);
        cr_assert(*o1, "%s: no output", cmds[i]);
        cr_expect_str_eq(o1, o2, "%s: the folder and its model.jlm differ", cmds[i]);
        free(o1); free(e1); free(o2); free(e2);
    }
    free(v);
}

/* ---------------------------------------------------------------- jlm run */

Test(cli_ux, run_json_is_one_object_with_the_text_and_ids_of_a_plain_run, .timeout = 120)
{
    const char *g = tu_model("stories260K.gguf");
    char args[4096], *o1, *e1, *o2, *e2, *o3, *e3;
    snprintf(args, sizeof args, "run '%s' -p 'Once upon a time' -n 16 --seed 7 --json", g);
    cr_assert(jlm2(args, &o1, &e1) == 0, "%s", e1);
    snprintf(args, sizeof args, "run '%s' -p 'Once upon a time' -n 16 --seed 7 --print-ids", g);
    cr_assert(jlm2(args, &o2, &e2) == 0, "%s", e2);
    snprintf(args, sizeof args, "run '%s' -p 'Once upon a time' -n 16 --seed 7", g);
    cr_assert(jlm2(args, &o3, &e3) == 0, "%s", e3);
    cr_assert(count_lines(o1) == 1, "--json: expected one line, got:\n%s", o1);
    json_error_t je;
    json_t *j = json_loads(o1, 0, &je), *ids = json_loads(o2, 0, &je);
    cr_assert(j && ids, "not JSON: %s\n%s", o1, o2);
    cr_expect(json_equal(json_object_get(j, "prompt_ids"), json_object_get(ids, "prompt")), "prompt ids differ");
    cr_expect(json_equal(json_object_get(j, "ids"), json_object_get(ids, "generated")), "generated ids differ");
    cr_expect(json_array_size(json_object_get(j, "ids")) == 16, "expected 16 ids");
    cr_expect_str_eq(json_string_value(json_object_get(j, "text")), o3, "the text is the plain run's stdout");
    cr_expect_str_eq(json_string_value(json_object_get(j, "stop")), "length");
    json_t *t = json_object_get(j, "timings"), *p = json_object_get(j, "pager");
    cr_expect(json_integer_value(json_object_get(t, "prefill_tokens")) ==
                  (json_int_t)json_array_size(json_object_get(j, "prompt_ids")) &&
                  json_integer_value(json_object_get(t, "decode_tokens")) == 16,
              "timings: %s", o1);
    cr_expect(json_is_real(json_object_get(t, "decode_s")) && json_is_real(json_object_get(t, "prefill_tps")), "%s", o1);
    cr_expect(json_integer_value(json_object_get(p, "page_ins")) > 0 &&
                  json_integer_value(json_object_get(p, "bytes_read")) > 0 &&
                  json_array_size(json_object_get(p, "arrays")) >= 1,
              "pager counters: %s", o1);
    cr_expect(strstr(o1, "\"model\":") && strstr(o1, "stories260K.gguf\""), "model as given: %s", o1);
    /* --json with --print-ids is refused in one line */
    snprintf(args, sizeof args, "run '%s' -p x --json --print-ids", g);
    free(o2); free(e2);
    cr_expect(jlm2(args, &o2, &e2) == 2 && count_lines(e2) == 1 && strstr(e2, "--json"), "%s", e2);
    json_decref(j);
    json_decref(ids);
    free(o1); free(e1); free(o2); free(e2); free(o3); free(e3);
}

Test(cli_ux, run_ends_its_text_with_a_newline_on_a_terminal_only, .timeout = 120)
{
    const char *g = tu_model("stories260K.gguf");
    char args[4096], cmd[6000], *o, *e;
    /* a pipe: the bytes as generated (this prompt's 8 tokens end mid-line) */
    snprintf(args, sizeof args, "run '%s' -p 'Once upon a time' -n 8 --seed 7", g);
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    size_t n = strlen(o);
    cr_assert(n > 0 && o[n - 1] != '\n', "piped output should end as generated: '%s'", o);
    /* a terminal: the same text and a newline (the pty shows it as \r\n) */
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache' '%s' %s 2>/dev/null", T, tu_jlm(), args);
    int rc;
    char *t = on_pty(cmd, &rc);
    size_t m = strlen(t);
    cr_assert(rc == 0, "exit %d: %s", rc, t);
    cr_expect(m >= 2 && !strcmp(t + m - 2, "\r\n") && !strncmp(t, o, n), "on a terminal: '%s' (piped: '%s')", t, o);
    free(t); free(o); free(e);
}

/* ---------------------------------------------------------------- bench, convert */

Test(cli_ux, bench_prints_md_csv_or_json, .timeout = 120)
{
    const char *g = tu_model("stories260K.gguf");
    char args[4096], *o, *e;
    snprintf(args, sizeof args, "bench '%s' -p 4 -n 2 -r 1", g);
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    cr_expect(!strncmp(o, "| model", 7) && count_lines(o) == 4 && strstr(o, "| stories260K.gguf"), "md:\n%s", o);
    free(o); free(e);
    snprintf(args, sizeof args, "bench '%s' -p 4 -n 2 -r 1 -o csv", g);
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    cr_expect(count_lines(o) == 3 && !strncmp(o, "model,size_bytes,params,threads,budget_bytes,test,", 50) &&
                  strstr(o, "\n\"stories260K.gguf\",") && strstr(o, ",pp4,4,") && strstr(o, ",tg2,2,"),
              "csv:\n%s", o);
    for (char *l = strchr(o, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        int commas = 0;
        for (char *c = l + 1; *c && *c != '\n'; c++)
            commas += *c == ',';
        cr_expect(commas == 12, "csv row with %d commas: %.80s", commas, l + 1);
    }
    free(o); free(e);
    snprintf(args, sizeof args, "bench '%s' -p 4 -n 2 -r 1 -o json", g);
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    json_error_t je;
    json_t *j = json_loads(o, 0, &je);
    cr_assert(json_is_array(j) && json_array_size(j) == 2, "json: %s\n%s", je.text, o);
    json_t *r = json_array_get(j, 1);
    cr_expect(!strcmp(json_string_value(json_object_get(r, "test")), "tg2") &&
                  json_integer_value(json_object_get(r, "n_tokens")) == 2 &&
                  json_real_value(json_object_get(r, "tps_mean")) > 0,
              "json row: %s", o);
    json_decref(j);
    free(o); free(e);
    /* -d: the tests start from cached positions, named as llama-bench's */
    snprintf(args, sizeof args, "bench '%s' -p 4 -n 2 -d 3 -r 1", g);
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    cr_expect(count_lines(o) == 4 && strstr(o, " pp4 @ d3 |") && strstr(o, " tg2 @ d3 |"), "md -d 3:\n%s", o);
    free(o); free(e);
    snprintf(args, sizeof args, "bench '%s' -p 0 -n 2 -d 3 -r 1 -o csv", g);
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    cr_expect(count_lines(o) == 2 && strstr(o, ",n_depth\n") && strstr(o, ",tg2 @ d3,2,") && strstr(o, ",3\n"),
              "csv -d 3:\n%s", o);
    free(o); free(e);
    snprintf(args, sizeof args, "bench --help");
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    char *dl = strstr(o, "--depth N");
    cr_expect(dl && strstr(dl, "(default: 0)\n") && !strstr(dl, "(default: 0) (default"), "--help:\n%s", o);
    free(o); free(e);
    snprintf(args, sizeof args, "bench '%s' -d -1", g);
    cr_expect(jlm2(args, &o, &e) == 2 && count_lines(e) == 1 && strstr(e, "-d") && !*o, "-d -1: %s", e);
    free(o); free(e);
    snprintf(args, sizeof args, "bench '%s' -o xml", g);
    cr_expect(jlm2(args, &o, &e) == 2 && count_lines(e) == 1 && strstr(e, "-o 'xml'") && !*o, "%s", e);
    free(o); free(e);
}

Test(cli_ux, convert_shows_progress_as_a_few_lines_or_a_bar_on_a_terminal, .timeout = 120)
{
    const char *g = tu_model("synth-llama-256.f32.gguf");   /* 13 MiB: enough units to report */
    char args[4096], cmd[6000], *o, *e;
    snprintf(args, sizeof args, "convert '%s' -o '%s/a.jlm' --progress", g, T);   /* a log: asked for */
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    int lines = count_lines(e), pct = 0;
    for (char *p = e; (p = strstr(p, "% (")); p++)
        pct++;
    cr_expect(!strchr(e, '\r') && lines >= 2 && lines <= 5 && pct >= 1 && pct == lines - 1 &&
                  strstr(e, " MiB of 13.0 MiB, ") && strstr(e, " MiB/s, ETA ") && strstr(e, "jlm convert: wrote "),
              "not a terminal: %d lines:\n%s", lines, e);
    free(o); free(e);
    snprintf(cmd, sizeof cmd, "'%s' %s", tu_jlm(), args);
    int rc;
    char *t = on_pty(cmd, &rc);
    cr_assert(rc == 0, "%s", t);
    cr_expect(strchr(t, '\r') && strstr(t, "] 100%") && strstr(t, "13.0 MiB of 13.0 MiB") && strstr(t, "ETA"),
              "on a terminal:\n%s", t);
    free(t);
}

Test(cli_ux, convert_checks_the_output_folder_before_converting)
{
    char args[4096], *o, *e;
    snprintf(args, sizeof args, "convert '%s' -o '%s/no/such/dir/x.jlm'", tu_model("stories260K.gguf"), T);
    cr_expect(jlm2(args, &o, &e) == 2 && count_lines(e) == 1 && strstr(e, "/no/such/dir/x.jlm: cannot write there") &&
                  !strstr(e, "%"),
              "%s", e);
    free(o); free(e);
    /* a file where the folder should be */
    tu_write_file(pathf("%s/f", T), "x", 1);
    snprintf(args, sizeof args, "convert '%s' -o '%s/f/x.jlm'", tu_model("stories260K.gguf"), T);
    cr_expect(jlm2(args, &o, &e) == 2 && count_lines(e) == 1 && strstr(e, "Not a directory"), "%s", e);
    free(o); free(e);
}

Test(cli_ux, convert_takes_out_and_type_after_the_source_as_llama_quantize, .timeout = 120)
{
    const char *g = tu_model("stories260K.gguf");
    char args[4096], *o, *e;
    /* jlm convert IN OUT type, the type in any case: the bytes of -o OUT --type TYPE */
    snprintf(args, sizeof args, "convert '%s' '%s/p.jlm' q8_0", g, T);
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    free(o); free(e);
    snprintf(args, sizeof args, "convert '%s' -o '%s/f.jlm' --type Q8_0", g, T);
    cr_assert(jlm2(args, &o, &e) == 0, "%s", e);
    free(o); free(e);
    size_t np = 0, nf = 0;
    unsigned char *bp = tu_read_file(pathf("%s/p.jlm", T), &np), *bf = tu_read_file(pathf("%s/f.jlm", T), &nf);
    cr_assert(bp && bf);
    cr_expect(np == nf && !memcmp(bp, bf, np), "positional OUT TYPE wrote other bytes than -o / --type");
    free(bp); free(bf);
    /* the keep default: OUT alone is the default conversion */
    snprintf(args, sizeof args, "convert '%s' '%s/k.jlm'", g, T);
    cr_assert(jlm2(args, &o, &e) == 0 && tu_exists(pathf("%s/k.jlm", T)), "%s", e);
    free(o); free(e);
    /* named twice, differently: one line naming both, exit 2, nothing written */
    snprintf(args, sizeof args, "convert '%s' '%s/x.jlm' -o '%s/y.jlm'", g, T, T);
    cr_expect(jlm2(args, &o, &e) == 2 && count_lines(e) == 1 && strstr(e, "output is given twice") &&
                  strstr(e, "/x.jlm") && strstr(e, "/y.jlm"), "%s", e);
    cr_expect(!tu_exists(pathf("%s/x.jlm", T)) && !tu_exists(pathf("%s/y.jlm", T)), "written anyway");
    free(o); free(e);
    snprintf(args, sizeof args, "convert '%s' '%s/x.jlm' Q4_0 --type Q8_0", g, T);
    cr_expect(jlm2(args, &o, &e) == 2 && count_lines(e) == 1 && strstr(e, "type is given twice"), "%s", e);
    cr_expect(!tu_exists(pathf("%s/x.jlm", T)), "written anyway");
    free(o); free(e);
    /* a fourth positional is refused, naming it */
    snprintf(args, sizeof args, "convert '%s' '%s/x.jlm' Q8_0 extra", g, T);
    cr_expect(jlm2(args, &o, &e) == 2 && count_lines(e) == 1 && strstr(e, "'extra'"), "%s", e);
    free(o); free(e);
}

/* ---------------------------------------------------------------- through a mount */

static void ux_mnt_fini(void)
{
    mnt_fini();
    ux_fini();
}

Test(cli_ux, through_a_mount_errors_ggufs_and_stats, .init = ux_init, .fini = ux_mnt_fini, .timeout = 120)
{
    if (access("/dev/fuse", R_OK | W_OK))
        cr_skip_test("no /dev/fuse");
    mnt_dirs();
    /* a truncated GGUF in SRC: its view is `error: ...` */
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b && tu_write_file(pathf("%s/t.gguf", M.src), b, 4096) == 0);
    cr_assert(tu_write_file(pathf("%s/s.gguf", M.src), b, n) == 0);
    free(b);
    mnt_start(0, 1);
    char *st = read_text(pathf("%s/t.jlm/status", M.mnt));
    cr_assert(st && !strncmp(st, "error", 5), "t.jlm status: %s", st ? st : "(none)");
    st[strcspn(st, "\n")] = 0;
    char args[4096], *o, *e;
    snprintf(args, sizeof args, "run '%s/t.jlm' -p hello", M.mnt);
    int rc = jlm2(args, &o, &e);
    cr_expect(rc == 1 && count_lines(e) == 1 && strstr(e, "t.jlm: status: ") && strstr(e, st) &&
                  !strstr(e, "No such file"),
              "exit %d: %s (status '%s')", rc, e, st);
    free(o); free(e); free(st);
    /* jlm convert MNT/s.gguf (no -o) points to the view, one line, exit 1, nothing written */
    snprintf(args, sizeof args, "convert '%s/s.gguf'", M.mnt);
    rc = jlm2(args, &o, &e);
    cr_expect(rc == 1 && count_lines(e) == 1 && strstr(e, "is in a jlmfs mount: its view ") && strstr(e, "/s.jlm is the "),
              "exit %d: %s", rc, e);
    cr_expect(!tu_exists(pathf("%s/s.jlm.part", M.src)) && !tu_exists(pathf("%s/s.jlm", M.src)), "nothing written");
    free(o); free(e);
    /* MNT/s.gguf runs its view s.jlm: no copy in the per-user cache, same ids */
    snprintf(args, sizeof args, "run '%s/s.gguf' -p 'Once upon a time' -n 8 --seed 7 --print-ids", M.mnt);
    rc = jlm2(args, &o, &e);
    cr_assert(rc == 0, "exit %d: %s", rc, e);
    cr_expect(!strstr(e, "into the cache") && !tu_exists(pathf("%s/cache/jlm", T)), "converted again: %s", e);
    char *o2, *e2;
    snprintf(args, sizeof args, "run '%s' -p 'Once upon a time' -n 8 --seed 7 --print-ids", tu_model("stories260K.gguf"));
    cr_assert(jlm2(args, &o2, &e2) == 0, "%s", e2);
    cr_expect_str_eq(o, o2, "ids through the view differ from the GGUF's");
    free(o); free(e); free(o2); free(e2);
    /* jlm stats MNT: a summary per model with the container's totals, a legend, the table */
    jlm_model *m;
    jlm_err err;
    cr_assert(jlm_fmt_open(pathf("%s/s.jlm/model.jlm", M.mnt), &m, &err) == 0, "%s", err.msg);
    char want[128];
    snprintf(want, sizeof want, "s.jlm: 0 sessions, 0 of %u pages resident (0.0 KiB of ",
             m->hdr.n_blocks + m->hdr.n_vis_blocks + m->hdr.n_exp_pages);
    jlm_fmt_close(m);
    snprintf(args, sizeof args, "stats '%s'", M.mnt);
    rc = jlm2(args, &o, &e);
    char *legend = strstr(o, "\ncolumns: page-ins"), *table = strstr(o, "\nmodel s.jlm:");
    cr_expect(rc == 0 && strstr(o, want) == o && strstr(o, "hit rate ") && legend && table && legend < table,
              "exit %d, want '%s...':\n%s%s", rc, want, o, e);
    /* the heat strip: every block was read by the run, none stays resident after it */
    cr_expect(strstr(o, "\n  blocks     [+++++]\n"), "blocks strip:\n%s", o);
    /* the default table fits 80 columns; --wide is residency's whole table, as the view's stats file */
    cr_expect(strstr(o, "\npage           res page-ins      hits    evict       read  last-access\n"), "%s", o);
    cr_expect(!strstr(o, "t-pcache"), "the narrow table has no tier columns:\n%s", o);
    char *rows = strstr(o, "\npage           res");
    for (char *l = rows ? rows + 1 : o, *nl; *l; l = nl + 1) {
        nl = strchr(l, '\n');
        if (!nl) break;
        cr_expect(nl - l <= 80, "a line over 80 columns: %.*s", (int)(nl - l), l);
    }
    free(o); free(e);
    snprintf(args, sizeof args, "stats '%s/s.jlm' --wide", M.mnt);
    rc = jlm2(args, &o, &e);
    unsigned char *sf = tu_read_file(pathf("%s/s.jlm/stats", M.mnt), NULL);
    char *hdr = sf ? strstr((char *)sf, "\npage ") : NULL, *hend = hdr ? strchr(hdr + 1, '\n') : NULL;
    if (hend) hend[1] = 0;   /* the stats file's column header line */
    cr_expect(rc == 0 && hdr && strstr(o, "t-pcache") && strstr(o, hdr), "--wide has the stats file's columns:\n%s\n--\n%s",
              o, sf ? (char *)sf : "(no stats file)");
    free(sf); free(o); free(e);
    snprintf(args, sizeof args, "stats '%s' --wide --json", M.mnt);
    cr_expect(jlm2(args, &o, &e) == 2, "--wide is text only");
    free(o); free(e);
    /* a MoE view: one strip row per expert block, some experts read, not all */
    b = tu_read_file(tu_model("synth-qwen3moe-256.Q4_K_M.gguf"), &n);
    cr_assert(b && tu_write_file(pathf("%s/q.gguf", M.mnt), b, n) == 0);
    free(b);
    snprintf(args, sizeof args, "run '%s/q.jlm' -p 'hello' -n 2", M.mnt);
    rc = jlm2(args, &o, &e);
    cr_assert(rc == 0, "%s", e);
    free(o); free(e);
    snprintf(args, sizeof args, "stats '%s/q.jlm'", M.mnt);
    rc = jlm2(args, &o, &e);
    char *row = strstr(o, "\n  experts.0  [");
    cr_expect(rc == 0 && row && strchr(row + 1, '+') < strchr(row + 1, ']') && strstr(row, "."), "experts grid:\n%s", o);
    free(o); free(e);
    /* --watch prints again and again until interrupted */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout -s INT 1.2 '%s' stats '%s/s.jlm' --watch 0.2 2>&1", tu_jlm(), M.mnt);
    tu_run(cmd, &o);
    int frames = 0;
    for (char *p = o; (p = strstr(p, "s.jlm: 0 sessions")); p++)
        frames++;
    cr_expect(frames >= 2, "%d frames in 1.2 s at 0.2 s:\n%s", frames, o);
    free(o);
    snprintf(args, sizeof args, "stats '%s' --watch 1 --json", M.mnt);
    cr_expect(jlm2(args, &o, &e) == 2 && count_lines(e) == 1 && strstr(e, "--watch"), "%s", e);
    free(o); free(e);
}

/* ---------------------------------------------------------------- install */

/* `make install DESTDIR=D PREFIX=/usr` puts the tools, the man pages, the
 * completion and a helper that names the installed jlmfs; the pages render;
 * `make uninstall` with the same variables leaves nothing under D. */
Test(cli_ux, make_install_and_uninstall_into_a_staging_root, .timeout = 120)
{
    char build[1024], cmd[8192], *o;
    snprintf(build, sizeof build, "%s", tu_jlm());
    char *sl = strrchr(build, '/');
    cr_assert(sl, "JLM_BIN should be a path: %s", build);
    *sl = 0;
    const char *mk = "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory";
    snprintf(cmd, sizeof cmd, "%s -C '%s' install DESTDIR='%s/root' PREFIX=/usr BUILD='%s'", mk, tu_root(), T, build);
    int rc = tu_run(cmd, &o);
    cr_assert(rc == 0, "%s: exit %d\n%s", cmd, rc, o);
    free(o);
    const char *files[] = {"usr/bin/jlm", "sbin/mount.jlmfs", "usr/share/man/man1/jlm.1", "usr/share/man/man1/jlmfs.1",
                           "usr/share/man/man8/mount.jlmfs.8", "usr/share/bash-completion/completions/jlm",
                           "usr/share/doc/jlmfs/examples/jlmfs@.service"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        cr_expect(tu_exists(pathf("%s/root/%s", T, files[i])), "%s not installed", files[i]);
    char *helper = read_text(pathf("%s/root/sbin/mount.jlmfs", T));
    cr_expect(helper && strstr(helper, "installed=\"/usr/bin/jlmfs\"") && !strstr(helper, "@JLMFS_INSTALLED@"),
              "the helper does not name the installed jlmfs");
    free(helper);
    char *unit = read_text(pathf("%s/root/usr/share/doc/jlmfs/examples/jlmfs@.service", T));
    cr_expect(unit && strstr(unit, "\nExecStart=/usr/bin/jlmfs ") && !strstr(unit, "/usr/local/bin"),
              "the systemd example runs the installed jlmfs: %s", unit ? unit : "(missing)");
    free(unit);
    snprintf(cmd, sizeof cmd, "'%s/root/usr/bin/jlm' --version", T);
    cr_expect(tu_run(cmd, &o) == 0 && strstr(o, "jlm "), "installed jlm: %s", o);
    free(o);
    if (tu_run("command -v groff >/dev/null", NULL) == 0) {
        for (size_t i = 2; i < 5; i++) {
            snprintf(cmd, sizeof cmd, "groff -man -Tutf8 -ww -z '%s/root/%s'", T, files[i]);
            cr_expect(tu_run(cmd, &o) == 0 && !*o, "%s: %s", files[i], o);
            free(o);
        }
    }
    snprintf(cmd, sizeof cmd, "bash -c 'shopt -s extglob; . \"%s/root/usr/share/bash-completion/completions/jlm\"; "
             "COMP_WORDS=(\"%s\" bench m -o \"\"); COMP_CWORD=4; _jlm; echo \"${COMPREPLY[*]}\"; "
             "COMP_WORDS=(\"%s\" run --js); COMP_CWORD=2; _jlm; echo \"${COMPREPLY[*]}\"'", T, tu_jlm(), tu_jlm());
    cr_expect(tu_run(cmd, &o) == 0 && !strcmp(o, "md csv json\n--json --json-schema\n"), "completion: '%s'", o);
    free(o);
    snprintf(cmd, sizeof cmd, "%s -C '%s' uninstall DESTDIR='%s/root' PREFIX=/usr BUILD='%s'", mk, tu_root(), T, build);
    rc = tu_run(cmd, &o);
    cr_assert(rc == 0, "%s: exit %d\n%s", cmd, rc, o);
    free(o);
    cr_expect(!tu_exists(pathf("%s/root", T)), "make uninstall left files or folders under DESTDIR");
}

/* Token ids of text (printf escapes; its final newline kept) with special
 * tokens parsed, from `jlm tokenize`: the first line of its output. */
static char *tokenize_special(const char *model, const char *printf_text)
{
    char cmd[8192], *o = NULL;
    snprintf(cmd, sizeof cmd, "t=$(printf '%sx'); t=${t%%x}; XDG_CACHE_HOME='%s/cache' '%s' tokenize '%s' \"$t\" --ids "
             "--parse-special 2>/dev/null", printf_text, T, tu_jlm(), model);
    cr_assert(tu_run(cmd, &o) == 0, "%s: %s", cmd, o);
    o[strcspn(o, "\n")] = 0;
    return o;
}

/* `jlm run --chat` (-cnv) renders the prompt as one user turn, after -sys's
 * system message, through the model's template; this model has none, so
 * chatml (llama.cpp's fallback), whose text is fixed by its definition. */
Test(cli_ux, run_chat_renders_the_prompt_through_the_template, .timeout = 120)
{
    const char *g = tu_model("synth-qwen3-256.Q8_0.gguf");
    char args[4096], want[8192], *o1, *e1, *o2;
    snprintf(args, sizeof args, "run '%s' -sys 'Be brief.' -p 'hi there' -n 2 --temp 0 --print-ids", g);
    cr_assert(jlm2(args, &o1, &e1) == 0, "%s", e1);
    cr_expect(strstr(e1, "has no chat template: using chatml") && strstr(e1, "synth-qwen3-256.Q8_0.gguf"), "%s", e1);
    o2 = tokenize_special(g, "<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nhi there<|im_end|>\\n"
                             "<|im_start|>assistant\\n");
    snprintf(want, sizeof want, "{\"prompt\": %s, ", o2);
    cr_expect(!strncmp(o1, want, strlen(want)), "run --chat prompt ids:\n%s\nchatml tokenized:\n%s", o1, o2);
    free(o1); free(e1); free(o2);
    /* -cnv alone: no system turn; --chat with --ids is refused */
    snprintf(args, sizeof args, "run '%s' -cnv -p 'hi there' -n 2 --temp 0 --print-ids", g);
    cr_assert(jlm2(args, &o1, &e1) == 0, "%s", e1);
    o2 = tokenize_special(g, "<|im_start|>user\\nhi there<|im_end|>\\n<|im_start|>assistant\\n");
    snprintf(want, sizeof want, "{\"prompt\": %s, ", o2);
    cr_expect(!strncmp(o1, want, strlen(want)), "run -cnv prompt ids:\n%s\nchatml tokenized:\n%s", o1, o2);
    free(o1); free(e1); free(o2);
    snprintf(args, sizeof args, "run '%s' --chat --ids 1,2", g);
    cr_expect(jlm2(args, &o1, &e1) == 2 && count_lines(e1) == 1 && strstr(e1, "--chat"), "%s", e1);
    free(o1); free(e1);
}
