/* test_bench.c - the benchmarks' synthetic GGUF generator (bench/mkgguf.c) is
 * correct: its quantizers decode through ggml's reference dequantization to
 * the values they encoded, its output is a pure function of the seed, and a
 * generated model converts with `jlm convert` and runs with `jlm run`.
 * No timing is asserted anywhere. */
#define MKGGUF_NO_MAIN
#include "bench/mkgguf.c"

#include "tests/testutil.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

/* ---------------------------------------------------------------- quantizers */
/* RMS error of encode -> jlm_ggml_dequant_row relative to the data's RMS.
 * Bounds: the step is ~2*amax/15 (4-bit) or amax/127 (Q8_0), uniform rounding
 * error step/sqrt(12), data RMS amax/sqrt(3): 0.067 and 0.0045 expected. */
static double rel_rms_error(uint32_t type, size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x), *back = malloc(n * sizeof *back);
    uint8_t *y = malloc(n * 4);
    cr_assert(x && back && y);
    uint64_t s = seed;
    mkg_fill(&s, x, n);
    mkg_encode(type, x, y, n);
    jlm_err err = {0};
    cr_assert_eq(jlm_ggml_dequant_row(type, y, back, n, &err), 0, "%s", err.msg);
    double e2 = 0, x2 = 0;
    for (size_t i = 0; i < n; i++) {
        e2 += (double)(back[i] - x[i]) * (back[i] - x[i]);
        x2 += (double)x[i] * x[i];
    }
    free(x);
    free(back);
    free(y);
    return sqrt(e2 / x2);
}

Test(bench, q8_0_encoding_decodes_to_the_data_within_its_step)
{
    double e = rel_rms_error(GGML_Q8_0, 4096, 7);
    cr_assert(!(e > 0.008), "Q8_0 relative RMS error %g, expected <= 0.008", e);
}

Test(bench, q4_0_encoding_decodes_to_the_data_within_its_step)
{
    double e = rel_rms_error(GGML_Q4_0, 4096, 7);
    cr_assert(!(e > 0.1), "Q4_0 relative RMS error %g, expected <= 0.1", e);
}

Test(bench, q4_k_encoding_decodes_to_the_data_within_its_step)
{
    double e = rel_rms_error(GGML_Q4_K, 4096, 7);
    cr_assert(!(e > 0.1), "Q4_K relative RMS error %g, expected <= 0.1", e);
}

Test(bench, f16_encoding_decodes_to_the_data_within_half_precision)
{
    double e = rel_rms_error(GGML_F16, 4096, 7);
    cr_assert(!(e > 1e-3), "F16 relative RMS error %g, expected <= 1e-3", e);
}

/* A block that is all one sign and all zeros still decodes (no NaN from a 0 scale). */
Test(bench, q4_k_encodes_an_all_zero_block_as_zeros)
{
    float x[256] = {0}, back[256];
    uint8_t y[144];
    mkg_q4_k_block(x, y);
    jlm_err err = {0};
    cr_assert_eq(jlm_ggml_dequant_row(GGML_Q4_K, y, back, 256, &err), 0, "%s", err.msg);
    for (int i = 0; i < 256; i++)
        cr_assert(back[i] == 0.0f, "element %d decodes to %g, expected 0", i, back[i]);
}

/* ---------------------------------------------------------------- files */
Test(bench, a_generated_file_is_a_pure_function_of_the_seed, .timeout = 30)
{
    char *dir = tu_tmpdir(), a[1024], b[1024], c[1024], msg[512];
    mkg_shape s;
    cr_assert_eq(mkg_preset("tiny", &s), 0);
    snprintf(a, sizeof a, "%s/a.gguf", dir);
    snprintf(b, sizeof b, "%s/b.gguf", dir);
    snprintf(c, sizeof c, "%s/c.gguf", dir);
    cr_assert_eq(mkg_write(a, &s, GGML_Q4_K, 1, 5, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(mkg_write(b, &s, GGML_Q4_K, 1, 5, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(mkg_write(c, &s, GGML_Q4_K, 1, 6, msg, sizeof msg), 0, "%s", msg);
    size_t na = 0, nb = 0, nc = 0;
    unsigned char *pa = tu_read_file(a, &na), *pb = tu_read_file(b, &nb), *pc = tu_read_file(c, &nc);
    cr_assert(pa && pb && pc);
    cr_assert(na == nb && !memcmp(pa, pb, na), "two files of seed 5 differ (%zu vs %zu bytes)", na, nb);
    cr_assert(na == nc && memcmp(pa, pc, na), "seeds 5 and 6 gave identical files");
    free(pa);
    free(pb);
    free(pc);
    tu_rmrf(dir);
    free(dir);
}

/* The GGUF reader sees llama.cpp's keys and tensor shapes as written. */
Test(bench, a_generated_file_reads_back_with_its_shape_and_vocab, .timeout = 30)
{
    char *dir = tu_tmpdir(), p[1024], msg[512];
    mkg_shape s;
    cr_assert_eq(mkg_preset("tiny-moe", &s), 0);
    snprintf(p, sizeof p, "%s/m.gguf", dir);
    cr_assert_eq(mkg_write(p, &s, GGML_Q8_0, 0, 1, msg, sizeof msg), 0, "%s", msg);
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_open(p, &g, &err), 0, "%s", err.msg);
    uint32_t v;
    cr_assert_eq(jlm_gguf_get_u32(g, "llama.expert_count", &v, &err), 0, "%s", err.msg);
    cr_assert_eq(v, s.n_expert, "expert_count %u, expected %u", v, s.n_expert);
    const jlm_gguf_kv *tok = jlm_gguf_find(g, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->n == s.n_vocab, "tokens: %llu, expected %u", tok ? (unsigned long long)tok->n : 0ull, s.n_vocab);
    const jlm_gguf_str *ts = tok->arr;
    cr_assert_str_eq(ts[3].s, "<0x00>");
    cr_assert_str_eq(ts[258].s, "<0xFF>");
    const jlm_gguf_tensor *t = jlm_gguf_find_tensor(g, "blk.1.ffn_down_exps.weight");
    cr_assert(t && t->type == GGML_Q8_0 && t->ne[0] == s.n_ff && t->ne[1] == s.n_embd && t->ne[2] == s.n_expert,
              "blk.1.ffn_down_exps.weight missing or of the wrong type/shape");
    jlm_gguf_close(g);
    tu_rmrf(dir);
    free(dir);
}

/* --text-vocab (bench/vs-llama-server.sh): no token decodes to a lone
 * non-ASCII byte (types 6 only for <0x00>..<0x7F>), and U+2581 alone is a
 * token, so ASCII text tokenizes without a non-ASCII byte. */
Test(bench, a_text_vocab_has_no_lone_non_ascii_byte_token, .timeout = 30)
{
    char *dir = tu_tmpdir(), p[1024], msg[512];
    mkg_shape s;
    cr_assert_eq(mkg_preset("tiny", &s), 0);
    s.text_vocab = 1;
    snprintf(p, sizeof p, "%s/m.gguf", dir);
    cr_assert_eq(mkg_write(p, &s, GGML_Q8_0, 0, 1, msg, sizeof msg), 0, "%s", msg);
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_open(p, &g, &err), 0, "%s", err.msg);
    const jlm_gguf_kv *tok = jlm_gguf_find(g, "tokenizer.ggml.tokens");
    const jlm_gguf_kv *ty = jlm_gguf_find(g, "tokenizer.ggml.token_type");
    cr_assert(tok && ty && tok->n == s.n_vocab && ty->n == s.n_vocab, "tokens or token_type missing");
    const jlm_gguf_str *ts = tok->arr;
    int spaces = 0;
    for (uint32_t i = 0; i < s.n_vocab; i++) {
        unsigned b;
        int is_byte = sscanf(ts[i].s, "<0x%2X>", &b) == 1 && strlen(ts[i].s) == 6;
        cr_assert(!(is_byte && b >= 0x80), "token %u is the byte token %s", i, ts[i].s);
        int32_t type;   /* packed in the mapping: no alignment to count on */
        memcpy(&type, (const char *)ty->arr + 4 * (size_t)i, 4);
        cr_assert(type != 6 || (is_byte && b < 0x80), "token %u (%s) has type 6 (byte)", i, ts[i].s);
        spaces += !strcmp(ts[i].s, "\xe2\x96\x81");
    }
    cr_assert_str_eq(ts[3 + 0x41].s, "<0x41>");
    cr_assert_eq(spaces, 1, "U+2581 alone is %d tokens, expected 1", spaces);
    jlm_gguf_close(g);
    tu_rmrf(dir);
    free(dir);
}

typedef struct gen_case { char preset[16]; uint32_t type; } gen_case;

ParameterizedTestParameters(bench, a_generated_model_converts_and_runs)
{
    static gen_case cases[] = {
        {"tiny", GGML_F32}, {"tiny", GGML_F16}, {"tiny", GGML_Q8_0}, {"tiny", GGML_Q4_0},
        {"tiny", GGML_Q4_K}, {"tiny-moe", GGML_Q4_K}, {"tiny-moe", GGML_Q8_0},
    };
    return cr_make_param_array(gen_case, cases, sizeof cases / sizeof cases[0]);
}

/* Greedy generation from ids 1,2,3: four ids come back, each inside the vocab. */
ParameterizedTest(gen_case *gc, bench, a_generated_model_converts_and_runs, .timeout = 60)
{
    char *dir = tu_tmpdir(), src[1024], out[1024], cmd[4096], msg[512];
    mkg_shape s;
    cr_assert_eq(mkg_preset(gc->preset, &s), 0);
    snprintf(src, sizeof src, "%s/m.gguf", dir);
    snprintf(out, sizeof out, "%s/m.jlm", dir);
    cr_assert_eq(mkg_write(src, &s, gc->type, 0, 3, msg, sizeof msg), 0, "%s", msg);
    char *log = NULL;
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' -o '%s'", tu_jlm(), src, out);
    int rc = tu_run(cmd, &log);
    cr_assert_eq(rc, 0, "%s %s: convert exited %d: %s", gc->preset, jlm_ggml_type_name(gc->type), rc, log);
    free(log);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --ids 1,2,3 -n 4 --temp 0 --print-ids 2>/dev/null", tu_jlm(), out);
    rc = tu_run(cmd, &log);
    cr_assert_eq(rc, 0, "%s %s: run exited %d: %s", gc->preset, jlm_ggml_type_name(gc->type), rc, log);
    const char *g = strstr(log, "\"generated\": [");
    cr_assert(g, "no generated ids in: %s", log);
    g += strlen("\"generated\": [");
    int n = 0;
    while (*g && *g != ']') {
        char *end;
        long id = strtol(g, &end, 10);
        cr_assert(end != g, "unparsable ids: %s", log);
        cr_assert(id >= 0 && id < (long)s.n_vocab, "id %ld outside [0, %u)", id, s.n_vocab);
        n++;
        g = end;
        while (*g == ',' || *g == ' ')
            g++;
    }
    cr_assert_eq(n, 4, "%d ids generated, expected 4: %s", n, log);
    free(log);
    tu_rmrf(dir);
    free(dir);
}
