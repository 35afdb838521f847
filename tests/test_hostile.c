/* test_hostile.c - untrusted sizes (issue 10, docs/security.md): crafted GGUFs
 * through `jlm convert` and altered containers through `jlm run` give one
 * clear line naming the field, exit 1, and leave nothing behind. The crafted
 * inputs are made here by patching one value of a model in tests/models. */
#include <criterion/criterion.h>

#include "format/jlm_format.h"
#include "tests/testutil.h"
#include "tests/craft.h"

/* Writes dir/name: `model` with key set to v. */
static char *craft_gguf(const char *dir, const char *model, const char *key, uint32_t v)
{
    size_t n;
    unsigned char *b = tu_read_file(tu_model(model), &n);
    cr_assert(b, "read %s", model);
    char *p = malloc(1024);
    snprintf(p, 1024, "%s/crafted.gguf", dir);
    cr_assert_eq(tu_gguf_write_with(p, b, n, key, v), 0, "%s has no u32 key %s", model, key);
    free(b);
    return p;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Runs `jlm convert` on the crafted file: exit 1, one line naming `want`,
 * neither the container nor its .part left. */
static void convert_refused(const char *model, const char *key, uint32_t v, const char *want)
{
    char *dir = tu_tmpdir();
    char *src = craft_gguf(dir, model, key, v);
    char cmd[3000], out[1100], part[1200], *o = NULL;
    snprintf(out, sizeof out, "%s/crafted.jlm", dir);
    snprintf(part, sizeof part, "%s.part", out);
    snprintf(cmd, sizeof cmd, "%s convert -o %s %s", tu_jlm(), out, src);
    int rc = tu_run(cmd, &o);
    cr_expect_eq(rc, 1, "%s=%u: exit %d (want 1, no crash): %s", key, v, rc, o);
    cr_expect(strstr(o, want), "%s=%u: message names '%s': %s", key, v, want, o);
    cr_expect(strstr(o, "crafted.gguf"), "message names the file: %s", o);
    cr_expect_eq(count_lines(o), 1, "one line: %s", o);
    cr_expect(!tu_exists(out) && !tu_exists(part), "%s=%u: nothing half-written", key, v);
    free(o);
    free(src);
    tu_rmrf(dir);
    free(dir);
}

Test(hostile_gguf, block_count_that_wraps_the_planner_is_refused)
{
    convert_refused("stories260K.gguf", "llama.block_count", 0xFFFFFFFFu, "n_layer");
}

Test(hostile_gguf, block_count_that_would_allocate_gigabytes_is_refused)
{
    convert_refused("stories260K.gguf", "llama.block_count", 1000000000u, "n_layer");
}

Test(hostile_gguf, block_count_that_would_write_a_huge_sparse_file_is_refused)
{
    convert_refused("stories260K.gguf", "llama.block_count", 20000000u, "n_layer");
    convert_refused("stories260K.gguf", "llama.block_count", 4000u, "block 5 has no tensor");
}

Test(hostile_gguf, expert_count_over_the_routing_arrays_is_refused)
{
    convert_refused("synth-qwen3moe-256.Q8_0.gguf", "qwen3moe.expert_count", 2000u, "n_expert is 2000");
    convert_refused("synth-qwen3moe-256.Q8_0.gguf", "qwen3moe.expert_count", 16u, "ffn_gate_inp");
}

Test(hostile_gguf, dimensions_that_disagree_with_the_tensors_are_refused)
{
    convert_refused("stories260K.gguf", "llama.embedding_length", 128u, "token_embd");
    convert_refused("stories260K.gguf", "llama.embedding_length", 0x7FFFFFFFu, "n_embd");
    convert_refused("stories260K.gguf", "llama.attention.head_count", 16u, "n_rot");
    convert_refused("stories260K.gguf", "llama.attention.head_count_kv", 8u, "attn_k");
    convert_refused("stories260K.gguf", "llama.feed_forward_length", 4096u, "ffn_gate");
    convert_refused("stories260K.gguf", "llama.rope.dimension_count", 1000u, "n_rot");
    convert_refused("synth-qwen3moe-256.Q8_0.gguf", "qwen3moe.attention.key_length", 128u, "attn_q");
    convert_refused("synth-qwen3moe-256.Q8_0.gguf", "qwen3moe.attention.value_length", 4096u, "attn_v");
    convert_refused("synth-qwen3moe-256.Q8_0.gguf", "qwen3moe.expert_feed_forward_length", 512u, "ffn_gate_exps");
}

/* The big MoE families' keys (deepseek2, glm4moe, llama4): counts of layers,
 * groups and ranks beyond what exists are refused with the field named. */
Test(hostile_gguf, moe_family_counts_beyond_the_model_are_refused)
{
    const char *ds = "synth-deepseek2-256.Q8_0.gguf", *glm = "synth-glm4moe-256.Q8_0.gguf";
    convert_refused(ds, "deepseek2.leading_dense_block_count", 5u, "n_dense_lead 5 exceeds the 3 blocks");
    convert_refused(glm, "glm4moe.leading_dense_block_count", 0xFFFFFFFFu, "n_dense_lead");
    convert_refused(ds, "deepseek2.expert_group_count", 3u, "n_expert_group 3 does not divide");
    convert_refused(ds, "deepseek2.expert_group_used_count", 9u, "n_expert_group_used 9 of 4 groups");
    convert_refused(ds, "deepseek2.expert_group_used_count", 0u, "n_expert_group_used 0 of 4 groups");
    convert_refused(ds, "deepseek2.expert_used_count", 6u, "n_expert_used 6 exceeds the experts of 2 kept groups");
    convert_refused(ds, "deepseek2.attention.kv_lora_rank", 0x7FFFFFFFu, "kv_lora_rank");
    convert_refused(ds, "deepseek2.attention.kv_lora_rank", 64u, "attn_kv_a_mqa");
    convert_refused(ds, "deepseek2.attention.q_lora_rank", 0x7FFFFFFFu, "q_lora_rank");
    convert_refused(ds, "deepseek2.attention.q_lora_rank", 64u, "attn_q_a");
    convert_refused(ds, "deepseek2.attention.key_length_mla", 32u, "n_rot 32 < head_dim 32");
    convert_refused(ds, "deepseek2.expert_shared_count", 5000u, "expert_shared_count");
    convert_refused(ds, "deepseek2.expert_shared_count", 2u, "ffn_gate_shexp");
    convert_refused(ds, "deepseek2.expert_gating_func", 3u, "expert_gating_func 3");
    convert_refused(glm, "glm4moe.nextn_predict_layers", 3u, "nextn_predict_layers 3 of 3");
    convert_refused("synth-llama4-256.Q8_0.gguf", "llama4.interleave_moe_layer_step", 9u, "moe_step 9");
}

/* ---------------------------------------------------------------- altered containers */
static char *convert_good(const char *dir, const char *model)
{
    char *out = malloc(1024), cmd[2600], *o = NULL;
    snprintf(out, 1024, "%s/good.jlm", dir);
    snprintf(cmd, sizeof cmd, "%s convert -o %s %s", tu_jlm(), out, tu_model(model));
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    free(o);
    return out;
}

/* Config field i (0 = n_layer, 1 = n_embd, ...; jlm-format.md 4.1) set to v. */
static void run_refused(const char *model, int field, uint32_t v, const char *want)
{
    char *dir = tu_tmpdir();
    char *path = convert_good(dir, model);
    size_t n;
    unsigned char *b = tu_read_file(path, &n);
    cr_assert(b);
    memcpy(b + JLM_HEADER_LEN + 2 + 4 * field, &v, 4);
    cr_assert_eq(tu_write_file(path, b, n), 0);
    free(b);
    char cmd[2600], *o = NULL;
    /* --no-verify: the sidecar's checksum would refuse the altered header first (the sums suite) */
    snprintf(cmd, sizeof cmd, "%s run %s -p 'Once upon' -n 2 --temp 0 --no-verify 2>&1", tu_jlm(), path);
    int rc = tu_run(cmd, &o);
    cr_expect_eq(rc, 1, "field %d=%u: exit %d (want 1, no crash): %s", field, v, rc, o);
    cr_expect(strstr(o, want), "field %d=%u: message names '%s': %s", field, v, want, o);
    cr_expect(strstr(o, "good.jlm"), "message names the file: %s", o);
    free(o);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

Test(hostile_container, config_that_disagrees_with_the_tensors_is_refused_at_open)
{
    run_refused("stories260K.gguf", 1, 128, "token_embd");        /* n_embd */
    run_refused("stories260K.gguf", 2, 16, "attn_q");             /* n_head */
    run_refused("stories260K.gguf", 3, 8, "attn_k");              /* n_kv_head */
    run_refused("stories260K.gguf", 4, 64, "attn_q");             /* head_dim */
    run_refused("stories260K.gguf", 5, 64, "n_rot");              /* n_rot */
    run_refused("stories260K.gguf", 6, 100000, "ffn_gate");       /* n_ffn */
    run_refused("stories260K.gguf", 7, 4096, "token_embd");       /* n_vocab */
    run_refused("stories260K.gguf", 1, 0xFFFFFFFFu, "n_embd");
}

Test(hostile_container, expert_config_that_disagrees_is_refused_at_open)
{
    run_refused("synth-qwen3moe-256.Q8_0.gguf", 11, 1024, "ffn_gate_exps");   /* n_ffn_exp */
}

/* The QKNormWide flag sizes the q/k norms (format/sanity.c) and the family's
 * block program says how they are applied (engine/arch/): a container whose
 * flag disagrees with its family is refused at open. Qwen3-MoE's per-head
 * norms pass sanity with the flag set, so only that check refuses this one. */
Test(hostile_container, qk_norm_wide_flag_that_disagrees_with_the_family_is_refused_at_open)
{
    char *dir = tu_tmpdir();
    char *path = convert_good(dir, "synth-qwen3moe-256.Q8_0.gguf");
    size_t n;
    unsigned char *b = tu_read_file(path, &n);
    cr_assert(b);
    uint32_t f;
    memcpy(&f, b + JLM_HEADER_LEN + 78, 4);   /* Flags (jlm-format.md 4.1) */
    f |= JLM_F_QK_NORM_WIDE;
    memcpy(b + JLM_HEADER_LEN + 78, &f, 4);
    cr_assert_eq(tu_write_file(path, b, n), 0);
    free(b);
    char cmd[2600], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s -p 'a b' -n 2 --temp 0 --no-verify 2>&1", tu_jlm(), path);
    int rc = tu_run(cmd, &o);
    cr_expect_eq(rc, 1, "exit %d (want 1): %s", rc, o);
    cr_expect(strstr(o, "QKNormWide") && strstr(o, "good.jlm"), "%s", o);
    free(o);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* The planner itself (the fuzz path and any other caller) bounds the config
 * before sizing anything: n_layer 0xFFFFFFFF used to wrap n_layer + 1 to 0. */
Test(hostile_plan, layer_count_that_wraps_is_refused_before_any_allocation)
{
    static jlm_str tok[1] = {{"a", 1}};
    jlm_vocab v = {.kind = JLM_VOCAB_SPM, .n_tokens = 1, .tokens = tok, .bos = -1, .eos = -1, .unk = -1,
                   .pad = -1, .sep = -1, .mask = -1};
    jlm_fingerprint fp = {.host = {"x", 1}, .device = {"cpu", 3}, .writer = {"t", 1}};
    jlm_config c = {.arch = JLM_ARCH_LLAMA, .n_layer = 0xFFFFFFFFu, .n_embd = 64, .n_head = 8, .n_kv_head = 4,
                    .head_dim = 8, .n_rot = 8, .n_vocab = 1, .rms_eps = 1e-5f, .rope_base = 1e4f};
    jlm_plan_input in = {.config = &c, .vocab = &v, .fp = &fp};
    jlm_plan p;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_plan(&in, &p, &err), JLM_ERANGE, "%s", err.msg);
    cr_expect(strstr(err.msg, "n_layer"), "%s", err.msg);
    c.n_layer = 2;
    c.n_expert = 5000;
    cr_assert_eq(jlm_fmt_plan(&in, &p, &err), JLM_ERANGE, "%s", err.msg);
    cr_expect(strstr(err.msg, "n_expert"), "%s", err.msg);
}

/* ---------------------------------------------------------------- opening below SRC */
#include "base/beneath.h"

#include <fcntl.h>

Test(hostile_beneath, no_symlink_and_no_dotdot_is_followed_out_of_the_root)
{
    char *dir = tu_tmpdir();
    char p[1200];
    snprintf(p, sizeof p, "%s/sub", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/sub/f", dir);
    cr_assert_eq(tu_write_file(p, "x", 1), 0);
    snprintf(p, sizeof p, "%s/sub/lf", dir);
    cr_assert_eq(symlink("f", p), 0);
    snprintf(p, sizeof p, "%s/ld", dir);
    cr_assert_eq(symlink("sub", p), 0);
    snprintf(p, sizeof p, "%s/etc", dir);
    cr_assert_eq(symlink("/etc", p), 0);
    int root = open(dir, O_PATH | O_DIRECTORY);
    cr_assert(root >= 0);
    int fd = jlm_open_beneath(root, "sub/f", O_RDONLY, 0);
    cr_expect(fd >= 0, "a plain path opens");
    if (fd >= 0) close(fd);
    const char *bad[] = {"sub/lf", "ld/f", "etc/passwd", "../etc/passwd", "sub/../../etc/passwd", "/etc/passwd", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fd = jlm_open_beneath(root, bad[i], O_RDONLY, 0);
        cr_expect(fd < 0, "'%s' must not open", bad[i]);
        if (fd >= 0) close(fd);
    }
    fd = jlm_open_beneath(root, "sub/new", O_WRONLY | O_CREAT | O_EXCL, S_IFREG | 0644);
    cr_expect(fd >= 0, "creating below the root works (mode with its type bits, as FUSE passes it)");
    if (fd >= 0) close(fd);
    close(root);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- the CLI's own inputs */
/* Makes dir/name a FIFO and runs `jlm ARGS` on it: exit 1 naming the reason
 * within 10 s (124: it waited on the FIFO). */
static void fifo_refused(const char *dir, const char *name, const char *args)
{
    char fifo[1100], cmd[3000], *o = NULL;
    snprintf(fifo, sizeof fifo, "%s/%s", dir, name);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    snprintf(cmd, sizeof cmd, "timeout 10 %s %s", tu_jlm(), args);
    char *full = NULL;
    cr_assert(asprintf(&full, cmd, fifo) > 0);
    int rc = tu_run(full, &o);
    cr_expect_eq(rc, 1, "%s: exit %d (124: it waited): %s", full, rc, o);
    cr_expect(strstr(o, "not a regular file"), "%s", o);
    free(o);
    free(full);
}

Test(hostile_cli, a_fifo_given_as_a_model_is_refused_not_waited_on)
{
    char *dir = tu_tmpdir();
    fifo_refused(dir, "m.gguf", "convert %s -o /tmp/never-written.jlm");
    fifo_refused(dir, "m.jlm", "run %s -p hi -n 1");
    tu_rmrf(dir);
    free(dir);
}

Test(hostile_cli, convert_refuses_an_output_that_is_the_source_a_directory_or_a_fifo)
{
    char *dir = tu_tmpdir();
    char src[1100], cmd[3000], *o = NULL;
    snprintf(src, sizeof src, "%s/s.gguf", dir);
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b);
    cr_assert_eq(tu_write_file(src, b, n), 0);
    char fifo[1100];   /* stands for a device: a test must never risk a real one */
    snprintf(fifo, sizeof fifo, "%s/out.fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    const char *outs[3][2] = {{src, "is the source itself"}, {dir, "is a directory"}, {fifo, "not a regular file"}};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s convert %s -o %s", tu_jlm(), src, outs[i][0]);
        int rc = tu_run(cmd, &o);
        cr_expect_eq(rc, 2, "-o %s: exit %d: %s", outs[i][0], rc, o);
        cr_expect(strstr(o, outs[i][1]), "-o %s: %s", outs[i][0], o);
        free(o);
    }
    size_t m;
    unsigned char *c = tu_read_file(src, &m);
    cr_expect(c && m == n && !memcmp(b, c, n), "the source is untouched");
    struct stat st;
    cr_expect(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO is still a FIFO");
    free(b);
    free(c);
    tu_rmrf(dir);
    free(dir);
}

Test(hostile_cli, control_bytes_in_a_crafted_name_never_reach_the_terminal)
{
    char *dir = tu_tmpdir();
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b);
    const char *name = "output_norm.weight";
    unsigned char *at = memmem(b, n, name, strlen(name));
    cr_assert(at, "stories260K has no '%s'", name);
    at[11] = 0x1b;   /* "output_norm\x1bweight": no role, named in the message */
    char src[1100], cmd[3000], *o = NULL;
    snprintf(src, sizeof src, "%s/esc.gguf", dir);
    cr_assert_eq(tu_write_file(src, b, n), 0);
    free(b);
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s/esc.jlm", tu_jlm(), src, dir);
    int rc = tu_run(cmd, &o);
    cr_expect_eq(rc, 1, "exit %d: %s", rc, o);
    cr_expect(strstr(o, "output_norm?weight"), "the name is shown with '?': %s", o);
    for (const char *p = o; *p; p++)
        cr_expect((unsigned char)*p >= 0x20 || *p == '\n', "control byte 0x%02x in the output", (unsigned char)*p);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

/* One line ending in '\n' and no other control byte (the one-line rule of
 * jlm_err and jlm_cli_error). */
static void expect_one_line(const char *what, const char *o)
{
    size_t n = strlen(o);
    cr_expect(n > 0 && o[n - 1] == '\n' && !memchr(o, '\n', n - 1), "%s: not one line: %s", what, o);
    for (const char *p = o; *p; p++)
        cr_expect((unsigned char)*p >= 0x20 || *p == '\n', "%s: control byte 0x%02x in the output", what,
                  (unsigned char)*p);
}

/* jlm info, tokenize, chat and stats (besides convert and run, above): a
 * file name, a tensor name and a GGUF key name holding '\n' and ESC reach
 * the terminal as one line with '?' for each control byte; a listing of a
 * container with such a name has no control byte; token pieces show theirs
 * as C escapes. The names go through the environment: sh has no $'..'. */
Test(hostile_cli, info_chat_tokenize_and_stats_print_crafted_names_as_one_line)
{
    char *dir = tu_tmpdir();
    char xdg[1100], bad[1100], key[1100], cont[1100], cmd[1400], *o = NULL;
    snprintf(xdg, sizeof xdg, "%s/xdg", dir);
    setenv("XDG_CACHE_HOME", xdg, 1);   /* jlm info x.gguf converts into the cache */
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b);
    /* 1. a tensor name with ESC, in a file whose name has '\n' and ESC */
    unsigned char *at = memmem(b, n, "output_norm.weight", 18);
    cr_assert(at);
    at[11] = 0x1b;
    snprintf(bad, sizeof bad, "%s/bad\nname\x1b[2J.gguf", dir);
    cr_assert_eq(tu_write_file(bad, b, n), 0);
    at[11] = '.';
    setenv("F", bad, 1);
    static const char *const with_tensor[] = {"info \"$F\"", "info \"$F\" --tensors", "tokenize \"$F\" hello",
                                              "chat \"$F\" -n 1 </dev/null"};
    for (size_t i = 0; i < sizeof with_tensor / sizeof *with_tensor; i++) {
        snprintf(cmd, sizeof cmd, "%s %s", tu_jlm(), with_tensor[i]);
        int rc = tu_run(cmd, &o);
        cr_expect_eq(rc, 1, "%s: exit %d: %s", with_tensor[i], rc, o);
        expect_one_line(with_tensor[i], o);
        cr_expect(strstr(o, "bad?name?[2J.gguf") && strstr(o, "output_norm?weight"), "%s: names with '?': %s",
                  with_tensor[i], o);
        free(o);
    }
    static const char *const names_only[] = {"stats \"$F\"", "stats \"$F\".missing", "stats --html \"$F\"",
                                             "info \"$F\".missing"};
    for (size_t i = 0; i < sizeof names_only / sizeof *names_only; i++) {
        snprintf(cmd, sizeof cmd, "%s %s", tu_jlm(), names_only[i]);
        int rc = tu_run(cmd, &o);
        cr_expect_eq(rc, 1, "%s: exit %d: %s", names_only[i], rc, o);
        expect_one_line(names_only[i], o);
        cr_expect(strstr(o, "bad?name?[2J.gguf"), "%s: the name with '?': %s", names_only[i], o);
        free(o);
    }
    /* 2. a key name with '\n' and ESC whose value type is unknown: named in the error */
    unsigned char *k = memmem(b, n, "llama.context_length", 20);
    cr_assert(k);
    unsigned char *c = malloc(n);
    memcpy(c, b, n);
    c[k - b + 9] = '\n';
    c[k - b + 14] = 0x1b;
    uint32_t t99 = 99;
    memcpy(c + (k - b) + 20, &t99, 4);
    snprintf(key, sizeof key, "%s/key.gguf", dir);
    cr_assert_eq(tu_write_file(key, c, n), 0);
    free(c);
    setenv("K", key, 1);
    static const char *const with_key[] = {"info \"$K\"", "tokenize \"$K\" hello", "chat \"$K\" </dev/null"};
    for (size_t i = 0; i < sizeof with_key / sizeof *with_key; i++) {
        snprintf(cmd, sizeof cmd, "%s %s", tu_jlm(), with_key[i]);
        int rc = tu_run(cmd, &o);
        cr_expect_eq(rc, 1, "%s: exit %d: %s", with_key[i], rc, o);
        expect_one_line(with_key[i], o);
        cr_expect(strstr(o, "llama.con?ext_?ength"), "%s: the key with '?': %s", with_key[i], o);
        free(o);
    }
    /* 3. a good container under such a name: its listing and its pieces */
    snprintf(cont, sizeof cont, "%s/c\nx\x1b[2J.jlm", dir);
    setenv("C", cont, 1);
    snprintf(cmd, sizeof cmd, "%s convert %s -o \"$C\"", tu_jlm(), tu_model("stories260K.gguf"));
    cr_assert_eq(tu_run(cmd, NULL), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s info \"$C\" --tensors", tu_jlm());
    cr_expect_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_expect(!strncmp(o, dir, strlen(dir)) && strstr(o, "/c?x?[2J.jlm: jlm container"), "first line: %s", o);
    for (const char *p = o; *p; p++)
        cr_expect((unsigned char)*p >= 0x20 || *p == '\n', "info: control byte 0x%02x", (unsigned char)*p);
    free(o);
    setenv("T", "a\nb\x1b", 1);
    snprintf(cmd, sizeof cmd, "%s tokenize \"$C\" \"$T\"", tu_jlm());
    cr_expect_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_expect(strstr(o, "'\\n'\n") && strstr(o, "'\\x1b'\n"), "pieces as C escapes: %s", o);
    for (const char *p = o; *p; p++)
        cr_expect((unsigned char)*p >= 0x20 || *p == '\n', "tokenize: control byte 0x%02x", (unsigned char)*p);
    free(o);
    free(b);
    tu_rmrf(dir);
    free(dir);
}
