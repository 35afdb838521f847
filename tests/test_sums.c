/* test_sums.c - page checksums (issue 43; docs/checksums.md): `jlm convert`
 * writes OUT.sums; a bit flipped in a page of each class (header and
 * records, dense region, block, expert, vision) is named by `jlm verify`
 * (exit 1) and by the engine, which exits 1 without computing with it; no
 * sidecar or another container's is exit 2 for verify and refused by
 * `jlm run --verify` / by default. */
#include "converter/convert.h"
#include "format/jlm_format.h"
#include "format/sums.h"
#include "tests/testutil.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_tmp;
static void init(void) { g_tmp = tu_tmpdir(); cr_assert(g_tmp); }
static void fini(void) { if (g_tmp) tu_rmrf(g_tmp); free(g_tmp); g_tmp = NULL; }
TestSuite(sums, .init = init, .fini = fini, .timeout = 120);

static char *pf(const char *fmt, const char *a, const char *b)
{
    char *p = NULL;
    cr_assert(asprintf(&p, fmt, a, b) >= 0);
    return p;
}

/* `jlm convert GGUF -o TMP/NAME` (the CLI, so the writer's sidecar is the
 * one tested); the container's path. */
static char *convert_with(const char *gguf, const char *mmproj, const char *name)
{
    char *out = pf("%s/%s", g_tmp, name), *cmd = NULL, *log = NULL;
    cr_assert(asprintf(&cmd, "'%s' convert '%s' -o '%s'%s%s%s", tu_jlm(), tu_model(gguf), out,
                       mmproj ? " --mmproj '" : "", mmproj ? tu_model(mmproj) : "", mmproj ? "'" : "") >= 0);
    cr_assert_eq(tu_run(cmd, &log), 0, "%s", log);
    free(cmd);
    free(log);
    char *s = pf("%s%s", out, ".sums");
    cr_assert(tu_exists(s), "jlm convert wrote no sidecar %s", s);
    free(s);
    return out;
}

static char *convert(const char *gguf, const char *name) { return convert_with(gguf, NULL, name); }

static void copy(const char *from, const char *to)
{
    size_t n;
    unsigned char *b = tu_read_file(from, &n);
    cr_assert(b, "%s", from);
    cr_assert_eq(tu_write_file(to, b, n), 0);
    free(b);
}

static jlm_header header_of(const char *path)
{
    jlm_header h;
    jlm_err e = {0};
    cr_assert_eq(tu_header(path, &h, &e), 0, "%s", e.msg);
    return h;
}

static void flip(const char *path, uint64_t off) { cr_assert_eq(tu_flip(path, off, 0x10), 0, "%s", path); }

/* A copy of good (and its sidecar) with one bit flipped at off. */
static char *flipped(const char *good, uint64_t off)
{
    char *bad = pf("%s/%s", g_tmp, "bad.jlm"), *bs = pf("%s%s", bad, ".sums"), *gs = pf("%s%s", good, ".sums");
    copy(good, bad);
    copy(gs, bs);
    flip(bad, off);
    free(bs);
    free(gs);
    return bad;
}

static int jlm(const char *args, const char *model, char **out)
{
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "'%s' %s '%s' %s", tu_jlm(), args, model,
                       !strcmp(args, "verify") ? "" : "-p hello -n 4 -t 1 --temp 0") >= 0);
    int rc = tu_run(cmd, out);
    free(cmd);
    return rc;
}

/* verify exits 1 naming `what`; run exits 1 with one line naming it too
 * (run_too: the engine reads that page for this prompt). */
static void expect_named(const char *good, uint64_t off, const char *what, int run_too)
{
    char *bad = flipped(good, off), *out = NULL;
    int rc = jlm("verify", bad, &out);
    cr_assert_eq(rc, 1, "verify exit %d for a flip at %llu: %s", rc, (unsigned long long)off, out);
    cr_assert(strstr(out, "checksum mismatch in ") && strstr(out, what) && strstr(out, "expected ") &&
              strstr(out, "got "), "'%s' not named: %s", what, out);
    free(out);
    if (run_too) {
        rc = jlm("run", bad, &out);
        cr_assert_eq(rc, 1, "run exit %d for a flip in %s: %s", rc, what, out);
        cr_assert(strstr(out, "checksum mismatch in ") && strstr(out, what), "'%s' not named: %s", what, out);
        cr_assert_eq(tu_count_lines(out), 1, "one line expected: %s", out);
        free(out);
    }
    free(bad);
}

Test(sums, a_clean_container_verifies_and_runs)
{
    char *good = convert("synth-llama-moe-256.Q4_K_M.gguf", "moe.jlm"), *out = NULL;
    int rc = jlm("verify", good, &out);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, out);
    cr_assert(strstr(out, ", 0 do not match"), "%s", out);
    free(out);
    rc = jlm("run", good, &out);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, out);
    free(out);
    free(good);
}

/* A container cut short, beside its own sidecar or none: run says what the
 * format's open says of the container (in its header: the bytes there are,
 * of the header's; empty: no magic; past it: what runs past the end), in one
 * line naming the container, not the sidecar, exit 1; never an errno left
 * over from the short read. */
Test(sums, a_cut_container_is_named_by_run_with_or_without_its_sidecar)
{
    char *good = convert("synth-llama-moe-256.Q4_K_M.gguf", "moe.jlm"), *cut = pf("%s/%s", g_tmp, "cut.jlm");
    char *gs = pf("%s%s", good, ".sums"), *cs = pf("%s%s", cut, ".sums");
    size_t n;
    unsigned char *b = tu_read_file(good, &n);
    cr_assert(b && n > JLM_HEADER_LEN);
    const size_t lens[4] = {0, 10, JLM_HEADER_LEN - 1, JLM_HEADER_LEN + 8};
    for (int side = 0; side < 2; side++) {
        if (side)
            copy(gs, cs);
        for (int i = 0; i < 4; i++) {
            char want[64], *out = NULL;
            cr_assert_eq(tu_write_file(cut, b, lens[i]), 0);
            if (lens[i] > JLM_HEADER_LEN)
                snprintf(want, sizeof want, "runs past the end of the file (%zu bytes)", lens[i]);
            else if (lens[i])
                snprintf(want, sizeof want, "truncated header: %zu of %u bytes", lens[i], (unsigned)JLM_HEADER_LEN);
            else
                snprintf(want, sizeof want, "not a jlm container (bad magic)");
            int rc = jlm("run", cut, &out);
            cr_assert_eq(rc, 1, "%zu bytes, sidecar %d: exit %d: %s", lens[i], side, rc, out);
            cr_assert(strstr(out, want) && tu_count_lines(out) == 1 && !strstr(out, ".sums"),
                      "%zu bytes, sidecar %d: '%s' expected in one line naming the container: %s", lens[i], side, want,
                      out);
            free(out);
        }
    }
    free(b);
    free(cs);
    free(gs);
    free(cut);
    free(good);
}

Test(sums, a_flipped_bit_in_every_page_class_is_named_and_never_computed_with)
{
    char *good = convert("synth-llama-moe-256.Q4_K_M.gguf", "moe.jlm");
    jlm_header h = header_of(good);
    cr_assert(h.n_exp_pages && h.dense_len && h.n_blocks);
    expect_named(good, h.cfg_off + 30, "the header and records", 1);   /* inside the config record */
    expect_named(good, h.voc_off + 100, "the header and records", 1);
    expect_named(good, h.dense_off + 5, "the dense region", 1);
    expect_named(good, h.data_off + h.page_size + 7, "block 1 ", 1);
    expect_named(good, h.exp_data_off + 3 * h.exp_page_size + 9, "expert page 3 ", 0);
    free(good);
}

/* A flip at the start of every expert page: whichever experts the router
 * picks, the engine reads a flipped one and refuses it. */
Test(sums, the_engine_refuses_a_flipped_expert_page)
{
    char *good = convert("synth-llama-moe-256.Q4_K_M.gguf", "moe.jlm"), *out = NULL;
    jlm_header h = header_of(good);
    char *bad = flipped(good, h.exp_data_off);
    for (uint32_t p = 1; p < h.n_exp_pages; p++)
        flip(bad, h.exp_data_off + p * h.exp_page_size);
    int rc = jlm("run", bad, &out);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, out);
    cr_assert(strstr(out, "checksum mismatch in expert page "), "%s", out);
    free(out);
    /* the check is what stops it: without it the run computes with the page */
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "'%s' run '%s' -p hello -n 4 -t 1 --temp 0 --no-verify", tu_jlm(), bad) >= 0);
    rc = tu_run(cmd, &out);
    cr_assert_eq(rc, 0, "--no-verify: exit %d: %s", rc, out);
    free(cmd);
    free(out);
    free(bad);
    free(good);
}

Test(sums, a_flipped_vision_page_is_named)
{
    char *good = convert_with("synth-gemma3v-128.F32.gguf", "mmproj-tinygemma3.gguf", "v.jlm");
    jlm_header h = header_of(good);
    cr_assert(h.n_vis_blocks, "the model has no vision pages");
    expect_named(good, h.vis_data_off + h.vis_page_size + 11, "vision block 1 ", 0);
    free(good);
}

Test(sums, verify_exit_2_without_a_sidecar_or_with_another_containers)
{
    char *a = convert("synth-llama-moe-256.Q4_K_M.gguf", "a.jlm");
    char *b = convert("synth-llama-256.Q4_K_M.gguf", "b.jlm");
    char *as = pf("%s%s", a, ".sums"), *bs = pf("%s%s", b, ".sums"), *out = NULL;
    cr_assert_eq(unlink(as), 0);
    int rc = jlm("verify", a, &out);
    cr_assert_eq(rc, 2, "no sidecar: exit %d: %s", rc, out);
    free(out);
    copy(bs, as);   /* another container's sidecar beside a */
    rc = jlm("verify", a, &out);
    cr_assert_eq(rc, 2, "another's sidecar: exit %d: %s", rc, out);
    cr_assert(strstr(out, "belongs to another container"), "%s", out);
    free(out);
    rc = jlm("run", a, &out);   /* by default: a sidecar that does not pair is refused */
    cr_assert_eq(rc, 1, "run with another's sidecar: exit %d: %s", rc, out);
    cr_assert(strstr(out, "belongs to another container"), "%s", out);
    free(out);
    cr_assert_eq(unlink(as), 0);
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "'%s' run '%s' -p hi -n 1 --verify", tu_jlm(), a) >= 0);
    rc = tu_run(cmd, &out);
    cr_assert_eq(rc, 1, "--verify without a sidecar: exit %d: %s", rc, out);
    cr_assert(strstr(out, "no checksum sidecar"), "%s", out);
    free(cmd);
    free(out);
    free(as);
    free(bs);
    free(a);
    free(b);
}

/* The same size and header, one bit flipped and the sidecar recomputed for
 * another container: the sidecar's own hash catches an edited sidecar. */
Test(sums, an_edited_sidecar_is_refused)
{
    char *a = convert("synth-llama-moe-256.Q4_K_M.gguf", "a.jlm"), *as = pf("%s%s", a, ".sums"), *out = NULL;
    flip(as, 60);
    int rc = jlm("verify", a, &out);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, out);
    cr_assert(strstr(out, "damaged"), "%s", out);
    free(out);
    free(as);
    free(a);
}

/* jlm_sums_hash takes XXH3's AVX2 loop where the CPU has it: the value is
 * the other loop's at every length (XXH3's short-input paths up to 240
 * bytes, its long loop by stripes and blocks, tails), and XXH3-64's of the
 * empty input. */
Test(sums, the_avx2_hash_is_the_same_xxh3_as_the_other_loop_at_every_length)
{
    enum { N = (1 << 20) + 4099 };
    uint8_t *b = malloc(N);
    cr_assert(b);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < N; i++) {   /* xorshift64: bytes with every value */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (uint8_t)(x >> 24);
    }
    cr_assert_eq(jlm_sums_hash("", 0), 0x2D06800538D394C2ull, "XXH3-64 of nothing");
    cr_assert_eq(jlm_sums_hash_base("", 0), 0x2D06800538D394C2ull);
    size_t lens[] = {1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4096, 65536 + 7, 208896, N};
    int avx2 = __builtin_cpu_supports("avx2");
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t off = 0; off < 3; off++) {   /* aligned and not */
            size_t n = lens[k] - (lens[k] == N ? off : 0);
            uint64_t want = jlm_sums_hash_base(b + off, n);
            cr_assert_eq(jlm_sums_hash(b + off, n), want, "length %zu at offset %zu", n, off);
            if (avx2)
                cr_assert_eq(jlm_sums_hash_avx2(b + off, n), want, "AVX2, length %zu at offset %zu", n, off);
        }
    free(b);
}

/* fuzz_sums's find (tests/fuzz/seeds-sums/page-size-near-2-64, the
 * target's layout: a container header, its file size, then the sidecar):
 * a forged vision page size near 2^64, which the header's validator let
 * through beside a forged file size, wrapped the span count's rounding to 0
 * and the loader divided by it (SIGFPE). Now a clean refusal naming the
 * sidecar. */
Test(sums, a_page_size_near_2_64_is_refused_not_divided_by_zero)
{
    size_t n = 0;
    char *seed = pf("%s/%s", tu_root(), "tests/fuzz/seeds-sums/page-size-near-2-64");
    unsigned char *d = tu_read_file(seed, &n);
    cr_assert(d && n > JLM_HEADER_LEN + 8, "%s", seed);
    uint64_t fs = 0;
    for (int i = 0; i < 8; i++)
        fs |= (uint64_t)d[JLM_HEADER_LEN + i] << (8 * i);
    char *side = pf("%s/%s", g_tmp, "forged.sums");
    FILE *f = fopen(side, "wb");
    cr_assert(f && fwrite(d + JLM_HEADER_LEN + 8, 1, n - JLM_HEADER_LEN - 8, f) == n - JLM_HEADER_LEN - 8 && !fclose(f));
    jlm_sums *s = NULL;
    jlm_err err = {0};
    cr_assert_neq(jlm_sums_load(AT_FDCWD, side, d, fs, &s, &err), 0, "a forged header was taken");
    cr_assert(!s && strstr(err.msg, side) && !strchr(err.msg, '\n'), "%s", err.msg);
    free(side);
    free(d);
    free(seed);
}
