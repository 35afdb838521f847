/* test_convert.c - GGUF -> .jlm conversion of every model in tests/models:
 * every tensor dequantized from the container equals the GGUF tensor's own
 * dequantization (bit for bit; Q2_K within the stated bound), placement and
 * section-8 rules, failure paths leave nothing behind, and the CLI. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <signal.h>

#include "converter/convert.h"
#include "converter/gguf.h"
#include "format/dequant.h"
#include "format/jlm_format.h"
#include "tests/testutil.h"
#include "tests/craft.h"

/* Q2_K is re-quantized to Q4_K (docs/packing.md): per row, the max abs error
 * must stay below this fraction of the row's max |w|. */
#define Q2K_REL_TOL 0.125f   /* the bound docs/packing.md measured and states */

typedef struct model_param { char name[64]; } model_param;
static model_param MODELS[] = {
    {"stories260K.gguf"}, {"llama-2-tiny-random.gguf"},
    {"synth-llama-256.f32.gguf"}, {"synth-llama-256.Q4_0.gguf"}, {"synth-llama-256.Q4_1.gguf"},
    {"synth-llama-256.Q5_0.gguf"}, {"synth-llama-256.Q5_1.gguf"}, {"synth-llama-256.Q8_0.gguf"},
    {"synth-llama-256.Q2_K.gguf"}, {"synth-llama-256.Q3_K_M.gguf"}, {"synth-llama-256.Q4_K_M.gguf"},
    {"synth-llama-256.Q5_K_M.gguf"}, {"synth-llama-256.Q6_K.gguf"}, {"synth-llama-256.MXFP4.gguf"},
    {"synth-llama-moe-256.F16.gguf"}, {"synth-llama-moe-256.Q4_K_M.gguf"}, {"synth-llama-moe-256.MXFP4_MOE.gguf"},
    {"synth-qwen2-256.Q4_K_M.gguf"}, {"synth-qwen2-256.Q8_0.gguf"}, {"synth-qwen3-256.Q4_K_M.gguf"},
    {"synth-qwen3-256.Q8_0.gguf"}, {"synth-qwen3moe-256.Q4_K_M.gguf"}, {"synth-qwen3moe-256.Q8_0.gguf"},
    {"synth-gemma3-256.Q4_K_M.gguf"}, {"synth-gemma3-256.Q8_0.gguf"}, {"synth-phi3-256.Q4_K_M.gguf"},
    {"synth-olmoe-256.Q4_K_M.gguf"}, {"synth-gpt-oss-256.MXFP4_MOE.gguf"},
    {"synth-deepseek2-256.Q8_0.gguf"}, {"synth-deepseek2-256.Q4_K_M.gguf"}, {"synth-glm4moe-256.Q8_0.gguf"},
    {"synth-glm4moe-256.Q4_K_M.gguf"}, {"synth-llama4-256.Q8_0.gguf"}, {"synth-llama4-256.Q4_K_M.gguf"},
};
#define N_MODELS (sizeof MODELS / sizeof MODELS[0])

static char *convert_to(const char *model, const char *dir)
{
    char *out = malloc(1024);
    const char *base = strrchr(model, '/');
    snprintf(out, 1024, "%s/%s.jlm", dir, base ? base + 1 : model);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(tu_model(model), NULL, &c, &err), 0, "%s: %s", model, err.msg);
    cr_assert_eq(jlm_conv_write(c, out, NULL, NULL, NULL, &err), 0, "%s: %s", model, err.msg);
    jlm_conv_close(c);
    return out;
}

/* Compares every row of every sheet of every tensor with the source. */
static void check_all_tensors(const char *model, const char *path)
{
    jlm_model *m;
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_open(path, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_gguf_open(tu_model(model), &g, &err), 0, "%s", err.msg);
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        const jlm_gguf_tensor *gt = jlm_gguf_find_tensor(g, t->name.s);
        cr_assert(gt, "%s: tensor '%s' not in the source", model, t->name.s);
        jlm_tensor_planes pl;
        cr_assert_eq(jlm_fmt_tensor_planes(t, &pl, NULL), 0);
        int bank = jlm_fmt_role_is_bank(t->role);
        uint64_t k = jlm_tensor_k(t), rows = jlm_tensor_rows(t);
        uint64_t nsheet = bank ? t->dims[2] : jlm_tensor_sheets(t);
        uint64_t end = t->qs_off + pl.qs_len;
        if (t->d_off + pl.d_len > end) end = t->d_off + pl.d_len;
        if (t->sc_off + pl.sc_len > end) end = t->sc_off + pl.sc_len;
        uint64_t span = end - t->qs_off;
        uint8_t *buf = malloc(span);
        float *a = malloc(k * 4), *b = malloc(k * 4);
        uint64_t rb = k / jlm_ggml_block_elems(gt->type) * jlm_ggml_block_bytes(gt->type);
        uint64_t src_rows = gt->n_dims >= 2 ? gt->ne[1] : 1;
        /* a fused source (phi3 qkv, gate|up): find which rows this tensor took */
        uint64_t row0 = 0;
        if (src_rows != rows) {
            if (t->role == JLM_R_ATTN_K) row0 = (uint64_t)m->config.n_head * m->config.head_dim;
            else if (t->role == JLM_R_ATTN_V) row0 = (uint64_t)(m->config.n_head + m->config.n_kv_head) * m->config.head_dim;
            else if (t->role == JLM_R_FFN_UP) row0 = rows;
        }
        uint8_t *srow = malloc(rb);
        for (uint64_t sh = 0; sh < nsheet; sh++) {
            uint64_t shift = bank ? sh * m->hdr.exp_page_size : 0, in = bank ? 0 : sh;
            cr_assert_eq(pread(m->fd, buf, span, (off_t)(t->qs_off + shift)), (ssize_t)span);
            for (uint64_t r = 0; r < rows; r++) {
                jlm_k_dequant_row_ref(t->type, buf + in * pl.sheet_qs, buf + (t->d_off - t->qs_off) + in * pl.sheet_d,
                                      buf + (t->sc_off - t->qs_off) + in * pl.sheet_sc, k, rows, r, a);
                cr_assert_eq(jlm_gguf_read(g, gt, sh * src_rows * rb + (row0 + r) * rb, srow, rb, NULL), 0);
                cr_assert_eq(jlm_ggml_dequant_row(gt->type, srow, b, k, NULL), 0);
                if (gt->type == GGML_Q2_K) {
                    float mx = 0, e = 0;
                    for (uint64_t j = 0; j < k; j++) {
                        if (fabsf(b[j]) > mx) mx = fabsf(b[j]);
                        if (fabsf(a[j] - b[j]) > e) e = fabsf(a[j] - b[j]);
                    }
                    cr_assert(!(e > Q2K_REL_TOL * mx), "%s: '%s' row %llu: Q2_K error %g > %g x max %g", model,
                              t->name.s, (unsigned long long)r, e, Q2K_REL_TOL, mx);
                } else if (memcmp(a, b, k * 4)) {
                    uint64_t j = 0;
                    while (!memcmp(&a[j], &b[j], 4)) j++;
                    cr_assert_fail("%s: '%s' (%s) sheet %llu row %llu element %llu: container %.9g, GGUF %.9g", model,
                                   t->name.s, jlm_ggml_type_name(gt->type), (unsigned long long)sh,
                                   (unsigned long long)r, (unsigned long long)j, a[j], b[j]);
                }
            }
        }
        free(buf); free(a); free(b); free(srow);
    }
    jlm_gguf_close(g);
    jlm_fmt_close(m);
}

ParameterizedTestParameters(convert, dequantizes_every_tensor_exactly_as_the_gguf_does)
{
    return cr_make_param_array(model_param, MODELS, N_MODELS);
}

ParameterizedTest(model_param *model, convert, dequantizes_every_tensor_exactly_as_the_gguf_does, .timeout = 120)
{
    char *dir = tu_tmpdir();
    char *out = convert_to(model->name, dir);
    check_all_tensors(model->name, out);
    free(out);
    tu_rmrf(dir);
    free(dir);
}

/* Stream groups and chunk recomputed from the table (section 8). */
static void check_section8(const jlm_model *m)
{
    uint64_t minp = UINT64_MAX, mins = UINT64_MAX;
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        jlm_tensor_loc l;
        jlm_fmt_tensor_loc(m, t, &l);
        if (l.region == JLM_REG_DENSE) continue;
        jlm_tensor_planes pl;
        jlm_fmt_tensor_planes(t, &pl, NULL);
        uint64_t v[3] = {pl.sheet_qs, pl.sheet_d, pl.sheet_sc};
        if (l.region != JLM_REG_EXPERT) { v[0] = pl.qs_len; v[1] = pl.d_len; v[2] = pl.sc_len; }
        for (int k = 0; k < 3; k++) {
            if (v[k] && v[k] < minp) minp = v[k];
            if (l.region == JLM_REG_EXPERT && v[k] && v[k] < mins) mins = v[k];
        }
        uint64_t off[3] = {t->qs_off, t->d_off, t->sc_off}, len[3] = {pl.qs_len, pl.d_len, pl.sc_len};
        for (int k = 0; k < 3; k++) {
            if (!len[k]) cr_expect_eq(off[k], t->qs_off, "%s: empty plane at qsOff", t->name.s);
            else cr_expect_eq(off[k] % 4096, 0, "%s: plane %d 4096-aligned", t->name.s, k);
        }
        if (l.region == JLM_REG_TEXT)
            cr_expect(t->qs_off >= m->hdr.data_off + (uint64_t)t->block * m->hdr.page_size &&
                      t->qs_off < m->hdr.data_off + (uint64_t)(t->block + 1) * m->hdr.page_size,
                      "%s inside block %d's page", t->name.s, t->block);
    }
    uint64_t lim = minp < (1u << 20) ? minp : (1u << 20), chunk = 4096;
    while (chunk * 2 <= lim) chunk *= 2;
    cr_expect_eq(m->hdr.chunk, chunk, "chunk %llu, expected %llu", (unsigned long long)m->hdr.chunk, (unsigned long long)chunk);
    uint32_t sg = 1, u = m->config.n_expert_used;
    if (m->hdr.n_exp_pages && u >= 2)
        for (uint32_t gq = u; gq >= 1; gq--)
            if ((uint64_t)((u + gq - 1) / gq) * mins >= 65536) { sg = gq; break; }
    cr_expect_eq(m->hdr.stream_groups, sg, "stream groups %u, expected %u", m->hdr.stream_groups, sg);
}

Test(convert, lays_out_pages_chunk_and_stream_groups_per_section_8, .timeout = 60)
{
    char *dir = tu_tmpdir();
    const char *ms[] = {"synth-qwen3moe-256.Q8_0.gguf", "synth-gpt-oss-256.MXFP4_MOE.gguf", "stories260K.gguf",
                        "synth-llama-moe-256.F16.gguf"};
    for (size_t i = 0; i < 4; i++) {
        char *out = convert_to(ms[i], dir);
        jlm_model *m;
        cr_assert_eq(jlm_fmt_open(out, &m, NULL), 0);
        check_section8(m);
        if (m->config.n_expert) {
            cr_expect_eq(m->hdr.n_exp_pages % m->config.n_expert, 0);
            cr_expect_eq(m->hdr.exp_data_off % 4096, 0);
        } else {
            cr_expect_eq(m->hdr.exp_data_off, 0);
            cr_expect_eq(m->hdr.exp_page_size, 0);
        }
        jlm_fmt_close(m);
        free(out);
    }
    tu_rmrf(dir);
    free(dir);
}

Test(convert, writes_byte_identical_containers_for_the_same_source)
{
    char *d1 = tu_tmpdir(), *d2 = tu_tmpdir();
    char *a = convert_to("synth-llama-moe-256.Q4_K_M.gguf", d1), *b = convert_to("synth-llama-moe-256.Q4_K_M.gguf", d2);
    size_t la = 0, lb = 1;
    unsigned char *x = tu_read_file(a, &la), *y = tu_read_file(b, &lb);
    cr_assert(x && y && la == lb && !memcmp(x, y, la), "two conversions differ");
    free(x); free(y); free(a); free(b);
    tu_rmrf(d1); tu_rmrf(d2); free(d1); free(d2);
}

Test(convert, plans_the_exact_size_it_writes)
{
    char *dir = tu_tmpdir();
    jlm_conv *c;
    cr_assert_eq(jlm_conv_open(tu_model("synth-olmoe-256.Q4_K_M.gguf"), NULL, &c, NULL), 0);
    uint64_t planned = c->plan.file_size;
    jlm_conv_close(c);
    char *out = convert_to("synth-olmoe-256.Q4_K_M.gguf", dir);
    size_t n = 0;
    unsigned char *b = tu_read_file(out, &n);
    cr_assert_eq(n, planned, "wrote %zu bytes, planned %llu", n, (unsigned long long)planned);
    free(b); free(out);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- failure paths */
static int g_fail_at, g_nw;
static ssize_t fail_pwrite(int fd, const void *b, size_t n, int64_t off)
{
    if (++g_nw == g_fail_at) { errno = EIO; return -1; }
    return jlm_io_posix.pwrite(fd, b, n, off);
}

Test(convert, leaves_no_output_when_a_write_fails_midway)
{
    char *dir = tu_tmpdir();
    char out[600], part[700];
    snprintf(out, sizeof out, "%s/x.jlm", dir);
    snprintf(part, sizeof part, "%s.part", out);
    jlm_io io = jlm_io_posix;
    io.pwrite = fail_pwrite;
    int fails[] = {1, 3, 10, 30};
    for (size_t i = 0; i < 4; i++) {
        jlm_conv *c;
        jlm_err err = {0};
        cr_assert_eq(jlm_conv_open(tu_model("synth-llama-256.Q4_0.gguf"), NULL, &c, &err), 0);
        g_fail_at = fails[i];
        g_nw = 0;
        cr_assert_eq(jlm_conv_write(c, out, &io, NULL, NULL, &err), JLM_EIO, "write %d failing is reported", fails[i]);
        cr_assert(strstr(err.msg, "x.jlm.part"), "names the file: %s", err.msg);
        cr_assert(!tu_exists(out) && !tu_exists(part), "nothing left after failing at write %d", fails[i]);
        jlm_conv_close(c);
    }
    tu_rmrf(dir);
    free(dir);
}

Test(convert, leaves_no_output_when_the_process_is_terminated_midway)
{
    char *dir = tu_tmpdir();
    char cmd[2048], *outp = NULL;
    snprintf(cmd, sizeof cmd, "JLM_TEST_SIGNAL_AT=50 %s convert %s -o %s/k.jlm", tu_jlm(), tu_model("synth-llama-256.f32.gguf"), dir);
    int rc = tu_run(cmd, &outp);
    cr_assert_eq(rc, 128 + SIGTERM, "killed by SIGTERM (rc %d): %s", rc, outp);
    char p1[1100], p2[1100];
    snprintf(p1, sizeof p1, "%s/k.jlm", dir);
    snprintf(p2, sizeof p2, "%s/k.jlm.part", dir);
    cr_assert(!tu_exists(p1) && !tu_exists(p2), "no output and no .part after SIGTERM");
    free(outp);
    tu_rmrf(dir);
    free(dir);
}

/* A minimal GGUF v3 writer for crafted inputs. */
typedef struct gw { unsigned char b[4096]; size_t n; } gw;
static void gw_put(gw *w, const void *p, size_t n) { memcpy(w->b + w->n, p, n); w->n += n; }
static void gw_u32(gw *w, uint32_t v) { gw_put(w, &v, 4); }
static void gw_u64(gw *w, uint64_t v) { gw_put(w, &v, 8); }
static void gw_str(gw *w, const char *s) { gw_u64(w, strlen(s)); gw_put(w, s, strlen(s)); }

static void write_arch_gguf(const char *path, const char *arch)
{
    gw w = {0};
    gw_put(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, 1);   /* tensors */
    gw_u64(&w, 1);   /* kv */
    gw_str(&w, "general.architecture"); gw_u32(&w, 8); gw_str(&w, arch);
    gw_str(&w, "token_embd.weight"); gw_u32(&w, 2); gw_u64(&w, 4); gw_u64(&w, 2); gw_u32(&w, 0); gw_u64(&w, 0);
    while (w.n % 32) w.b[w.n++] = 0;
    float z[8] = {0};
    gw_put(&w, z, sizeof z);
    cr_assert_eq(tu_write_file(path, w.b, w.n), 0);
}

Test(convert, refuses_an_unknown_architecture_by_name)
{
    char *dir = tu_tmpdir();
    char p[600];
    snprintf(p, sizeof p, "%s/m.gguf", dir);
    write_arch_gguf(p, "mamba");
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(p, NULL, &c, &err), JLM_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "'mamba'") && strstr(err.msg, "m.gguf"), "%s", err.msg);
    tu_rmrf(dir);
    free(dir);
}

Test(convert, refuses_a_truncated_gguf_without_writing)
{
    char *dir = tu_tmpdir();
    size_t n = 0;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    size_t cuts[] = {3, 24, 1000, 20000, n / 2, n - 1};
    for (size_t i = 0; i < 6; i++) {
        char p[600], out[700];
        snprintf(p, sizeof p, "%s/t.gguf", dir);
        snprintf(out, sizeof out, "%s/t.jlm", dir);
        cr_assert_eq(tu_write_file(p, b, cuts[i]), 0);
        char cmd[2048], *o = NULL;
        snprintf(cmd, sizeof cmd, "%s convert %s -o %s", tu_jlm(), p, out);
        int rc = tu_run(cmd, &o);
        cr_expect_eq(rc, 1, "cut at %zu: exit %d: %s", cuts[i], rc, o);
        cr_expect(strstr(o, "t.gguf"), "message names the file: %s", o);
        cr_expect(!tu_exists(out), "no output for a truncated source");
        free(o);
    }
    free(b);
    tu_rmrf(dir);
    free(dir);
}

Test(convert, turns_a_vocab_only_gguf_into_a_container_without_pages)
{
    char *dir = tu_tmpdir();
    char *out = convert_to("vocab/ggml-vocab-llama-spm.gguf", dir);
    jlm_model *m;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_open(out, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->config.arch, JLM_ARCH_NONE);
    cr_assert_eq(m->hdr.n_blocks, 0);
    cr_assert_eq(m->hdr.n_tensors, 0);
    cr_assert_eq(m->hdr.page_size, 4096);
    cr_assert_eq(m->file_size, m->hdr.data_off, "EOF = DataOff");
    cr_assert_eq(m->vocab.n_tokens, 32000);
    cr_assert_eq(m->config.n_vocab, 32000);
    jlm_fmt_close(m);
    free(out);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- CLI */
Test(convert_cli, converts_and_shows_info_and_plan)
{
    char *dir = tu_tmpdir();
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s/s.jlm --plan", tu_jlm(), tu_model("stories260K.gguf"), dir);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, "text pages      5 x"), "plan output: %s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "%s/s.jlm", dir);
    cr_assert(!tu_exists(cmd), "--plan writes nothing");
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s/s.jlm", tu_jlm(), tu_model("stories260K.gguf"), dir);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "%s info %s/s.jlm --json --tensors", tu_jlm(), dir);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, "\"arch\": \"llama\"") && strstr(o, "\"n_layer\": 5") && strstr(o, "blk.4.ffn_down.weight"), "%s", o);
    free(o);
    /* a GGUF given to info is read where it lies, not converted (docs/cli.md) */
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s/cache %s info %s", dir, tu_jlm(), tu_model("stories260K.gguf"));
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, "not converted") && strstr(o, "n_layer 5") && !strstr(o, "into the cache"), "%s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "%s/cache/jlm", dir);
    cr_assert(!tu_exists(cmd), "info made no cache entry");
    tu_rmrf(dir);
    free(dir);
}

/* The big MoE families' parameters in `jlm info`, text and JSON; glm4moe's
 * NextN blocks skipped with a note naming them. */
Test(convert_cli, info_shows_the_moe_families_parameters, .timeout = 60)
{
    char *dir = tu_tmpdir();
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s/d.jlm 2>&1 && %s info %s/d.jlm && %s info --json %s/d.jlm", tu_jlm(),
             tu_model("synth-deepseek2-256.Q8_0.gguf"), dir, tu_jlm(), dir, tu_jlm(), dir);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, "routing       sigmoid, weights normalised, scale 2.5, groups 4 (2 kept), shared expert n_ffn "
                        "128, leading dense 1"), "%s", o);
    cr_assert(strstr(o, "latent attn   q_lora 128, kv_lora 128, rope part 32, head_dim k 96 / v 32"), "%s", o);
    cr_assert(strstr(o, "yarn factor 40 (orig ctx 4096, beta fast 32 / slow 1, log mul 0.1)"), "%s", o);
    cr_assert(strstr(o, "\"kv_lora_rank\": 128") && strstr(o, "\"n_expert_group\": 4"), "%s", o);
    free(o);
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s/l.jlm 2>&1 && %s info %s/l.jlm", tu_jlm(),
             tu_model("synth-llama4-256.Q8_0.gguf"), dir, tu_jlm(), dir);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, "moe every 2") && strstr(o, "attn temp     scale 0.1, floor 8192"), "%s", o);
    free(o);
    /* glm4moe with one NextN block: block 2's tensors are not stored */
    size_t n = 0;
    unsigned char *b = tu_read_file(tu_model("synth-glm4moe-256.Q8_0.gguf"), &n);
    cr_assert(b);
    for (size_t i = 0; i + 17 <= n; i++)   /* a NextN tensor of its own (GLM-4.5's nextn.*), same name length */
        if (!memcmp(b + i, "blk.2.attn_k.bias", 17))
            memcpy(b + i, "blk.2.nextn.enorm", 17);
    snprintf(cmd, sizeof cmd, "%s/nextn.gguf", dir);
    cr_assert_eq(tu_gguf_write_with(cmd, b, n, "glm4moe.nextn_predict_layers", 1), 0);
    free(b);
    snprintf(cmd, sizeof cmd, "%s convert %s/nextn.gguf -o %s/g.jlm 2>&1 && %s info %s/g.jlm", tu_jlm(), dir, dir,
             tu_jlm(), dir);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, "1 NextN/MTP block(s) (19 tensors) skipped: blocks 2..2") && strstr(o, "n_layer 2,") &&
              strstr(o, "nextn/mtp     not stored"), "%s", o);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

Test(convert, computes_any_span_of_the_container_before_writing_it, .timeout = 60)
{
    char *dir = tu_tmpdir();
    const char *ms[] = {"synth-qwen3moe-256.Q4_K_M.gguf", "stories260K.gguf"};
    for (int k = 0; k < 2; k++) {
        char *out = convert_to(ms[k], dir);
        size_t n = 0;
        unsigned char *want = tu_read_file(out, &n);
        jlm_conv *c;
        cr_assert_eq(jlm_conv_open(tu_model(ms[k]), NULL, &c, NULL), 0);
        /* whole file in pages of 4096, and a few odd spans */
        unsigned char *got = malloc(n);
        for (size_t off = 0; off < n; off += 65536) {
            size_t len = n - off < 65536 ? n - off : 65536;
            cr_assert_eq(jlm_conv_read_span(c, off, len, got + off, NULL), 0);
        }
        cr_assert(!memcmp(got, want, n), "%s: spans equal the written file", ms[k]);
        unsigned char small[777];
        size_t offs[] = {0, 191, 5000, n / 3, n - 777};
        for (int i = 0; i < 5; i++) {
            cr_assert_eq(jlm_conv_read_span(c, offs[i], sizeof small, small, NULL), 0);
            cr_assert(!memcmp(small, want + offs[i], sizeof small), "span at %zu", offs[i]);
        }
        cr_assert_eq(jlm_conv_read_span(c, n - 10, 11, small, NULL), JLM_EINVAL);
        jlm_conv_close(c);
        free(got); free(want); free(out);
    }
    tu_rmrf(dir);
    free(dir);
}
