/* test_pack.c - suite `pack`: converter/ggml_quants.c, converter/pack.c and
 * format/dequant_ref.c against each other, against the spec's literal
 * formulas (jlm-format.md 7) and against every tensor of the test models. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "converter/gguf.h"
#include "converter/pack.h"
#include "format/jlm_format.h"
#include "format/dequant.h"

/* Q2_K -> Q4_K re-quantization bounds (docs/packing.md): per row, the max
 * abs error over the row's max |w|, and the RMS error over the row's RMS. */
#define Q2K_MAX_REL 0.125
#define Q2K_RMS_REL 0.075

/* ---------------------------------------------------------------- helpers */
static const char *root(void)
{
    const char *r = getenv("JLM_ROOT");
    return r && *r ? r : ".";
}

typedef struct planes { uint8_t *qs, *d, *sc; uint64_t qs_len, d_len, sc_len; uint8_t type; } planes;

static void planes_free(planes *p) { free(p->qs); free(p->d); free(p->sc); }

/* Packs one sheet into freshly zeroed planes of exactly jlm_fmt_planes' lengths. */
static int pack_sheet(uint32_t g, const void *src, uint64_t k, uint64_t rows, const char *what,
                      planes *p, jlm_err *err)
{
    int exact;
    memset(p, 0, sizeof *p);
    cr_assert_eq(jlm_pack_stored_type(g, &p->type, &exact, err), 0, "%s: %s", what, err->msg);
    cr_assert_eq(jlm_fmt_planes(p->type, k, rows, &p->qs_len, &p->d_len, &p->sc_len, err), 0,
                 "%s: %s", what, err->msg);
    p->qs = calloc(1, p->qs_len + 1);
    p->d = calloc(1, p->d_len + 1);
    p->sc = calloc(1, p->sc_len + 1);
    cr_assert(p->qs && p->d && p->sc);
    return jlm_pack_matrix(g, src, k, rows, p->type, p->qs, p->d, p->sc, what, err);
}

static uint32_t rng_state = 12345u;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

/* a random finite f16 of moderate size (|x| in [2^-10, 2^5)) */
static uint16_t rnd_f16(void)
{
    return (uint16_t)((rnd() & 0x8000u) | ((5 + rnd() % 15) << 10) | (rnd() & 0x3ffu));
}

/* Random valid GGUF bytes: `n` blocks of ggml type g (scale fields finite). */
static void random_blocks(uint32_t g, uint8_t *x, uint64_t n)
{
    uint32_t bb = jlm_ggml_block_bytes(g);
    for (uint64_t i = 0; i < n * bb; i++)
        x[i] = (uint8_t)rnd();
    for (uint64_t b = 0; b < n; b++) {
        uint8_t *p = x + b * bb;
        uint16_t h1 = rnd_f16(), h2 = rnd_f16();
        switch (g) {
        case GGML_F16:
            p[0] = (uint8_t)h1; p[1] = (uint8_t)(h1 >> 8); break;
        case GGML_F32: case GGML_BF16: {
            uint8_t *top = g == GGML_F32 ? p + 3 : p + 1;     /* sign + exponent high bits */
            if ((*top & 0x7f) == 0x7f)
                *top &= 0xbf;                                  /* no inf/NaN */
            break;
        }
        case GGML_Q4_0: case GGML_Q5_0: case GGML_Q8_0:
            p[0] = (uint8_t)h1; p[1] = (uint8_t)(h1 >> 8); break;
        case GGML_Q4_1: case GGML_Q5_1: case GGML_Q4_K: case GGML_Q5_K:
            p[0] = (uint8_t)h1; p[1] = (uint8_t)(h1 >> 8);
            p[2] = (uint8_t)h2; p[3] = (uint8_t)(h2 >> 8); break;
        case GGML_Q2_K:
            p[80] = (uint8_t)h1; p[81] = (uint8_t)(h1 >> 8);
            p[82] = (uint8_t)h2; p[83] = (uint8_t)(h2 >> 8); break;
        case GGML_Q3_K: p[108] = (uint8_t)h1; p[109] = (uint8_t)(h1 >> 8); break;
        case GGML_Q6_K: p[208] = (uint8_t)h1; p[209] = (uint8_t)(h1 >> 8); break;
        case GGML_MXFP4: p[0] = (uint8_t)(2 + rnd() % 253); break;
        default: break;
        }
    }
}

/* Every row of a packed sheet dequantizes to the bits ggml gives for the source. */
static void check_rows_exact(uint32_t g, const uint8_t *src, uint64_t k, uint64_t rows,
                             const planes *p, const char *what)
{
    uint64_t row_bytes = k / jlm_ggml_block_elems(g) * jlm_ggml_block_bytes(g);
    float *a = malloc(k * 4), *b = malloc(k * 4);
    jlm_err err = {0};
    cr_assert(a && b);
    for (uint64_t r = 0; r < rows; r++) {
        cr_assert_eq(jlm_ggml_dequant_row(g, src + r * row_bytes, a, k, &err), 0, "%s", err.msg);
        cr_assert_eq(jlm_k_dequant_row_ref(p->type, p->qs, p->d, p->sc, k, rows, r, b), 0);
        if (memcmp(a, b, k * 4)) {
            uint64_t i = 0;
            while (!memcmp(a + i, b + i, 4)) i++;
            cr_assert_fail("%s (%s, %llu x %llu): row %llu element %llu: ggml %.9g, packed %.9g",
                           what, jlm_ggml_type_name(g), (unsigned long long)k, (unsigned long long)rows,
                           (unsigned long long)r, (unsigned long long)i, a[i], b[i]);
        }
    }
    free(a);
    free(b);
}

/* Calls fn on every sheet of every tensor of every test model (not vocab/, not mmproj). */
typedef void (*sheet_fn)(const char *what, uint32_t g, const uint8_t *src, uint64_t k, uint64_t rows, void *ctx);

static int for_each_sheet(sheet_fn fn, void *ctx, const char *only_file)
{
    char dir[4096], path[4352], what[4608];
    snprintf(dir, sizeof dir, "%s/tests/models", root());
    DIR *dp = opendir(dir);
    cr_assert(dp, "cannot open %s", dir);
    struct dirent *de;
    int n_files = 0;
    while ((de = readdir(dp))) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".gguf") || !strncmp(de->d_name, "mmproj", 6))
            continue;
        if (only_file && strcmp(de->d_name, only_file))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        jlm_gguf *g = NULL;
        jlm_err err = {0};
        cr_assert_eq(jlm_gguf_open(path, &g, &err), 0, "%s", err.msg);
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const jlm_gguf_tensor *t = &g->tensors[i];
            uint8_t *buf = malloc(t->n_bytes ? t->n_bytes : 1);
            cr_assert(buf);
            cr_assert_eq(jlm_gguf_read(g, t, 0, buf, t->n_bytes, &err), 0, "%s", err.msg);
            uint64_t k = t->ne[0], rows = t->ne[1], sheets = t->ne[2] * t->ne[3];
            uint64_t sheet_bytes = rows * (k / jlm_ggml_block_elems(t->type)) * jlm_ggml_block_bytes(t->type);
            cr_assert_eq(sheet_bytes * sheets, t->n_bytes, "%s: %s size", de->d_name, t->name.s);
            for (uint64_t s = 0; s < sheets; s++) {
                snprintf(what, sizeof what, "%s: %s sheet %llu", de->d_name, t->name.s, (unsigned long long)s);
                fn(what, t->type, buf + s * sheet_bytes, k, rows, ctx);
            }
            free(buf);
        }
        jlm_gguf_close(g);
        n_files++;
    }
    closedir(dp);
    return n_files;
}

/* ---------------------------------------------------------------- real models */
typedef struct exact_ctx { uint64_t n_sheets, n_rows; uint32_t seen[64]; } exact_ctx;

static void exact_sheet(const char *what, uint32_t g, const uint8_t *src, uint64_t k, uint64_t rows, void *vctx)
{
    exact_ctx *c = vctx;
    if (g == GGML_Q2_K)
        return;
    planes p;
    jlm_err err = {0};
    cr_assert_eq(pack_sheet(g, src, k, rows, what, &p, &err), 0, "%s", err.msg);
    check_rows_exact(g, src, k, rows, &p, what);
    planes_free(&p);
    c->n_sheets++;
    c->n_rows += rows;
    if (g < 64)
        c->seen[g]++;
}

Test(pack, every_exact_tensor_of_every_model_dequantizes_bit_identically_after_packing, .timeout = 60)
{
    exact_ctx c = {0};
    int n = for_each_sheet(exact_sheet, &c, NULL);
    cr_assert_geq(n, 25, "only %d model files found under %s/tests/models", n, root());
    static const uint32_t want[] = {GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1,
                                    GGML_Q8_0, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_MXFP4};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert_gt(c.seen[want[i]], 0, "no %s tensor was checked", jlm_ggml_type_name(want[i]));
    cr_log_info("pack: %llu sheets, %llu rows bit-identical", (unsigned long long)c.n_sheets,
                (unsigned long long)c.n_rows);
}

typedef struct q2k_ctx { uint64_t n_rows; double worst_max, worst_rms; } q2k_ctx;

static void q2k_sheet(const char *what, uint32_t g, const uint8_t *src, uint64_t k, uint64_t rows, void *vctx)
{
    q2k_ctx *c = vctx;
    if (g != GGML_Q2_K)
        return;
    planes p;
    jlm_err err = {0};
    cr_assert_eq(pack_sheet(g, src, k, rows, what, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p.type, JLM_T_Q4_K);
    float *a = malloc(k * 4), *b = malloc(k * 4);
    uint64_t row_bytes = k / 256 * 84;
    for (uint64_t r = 0; r < rows; r++) {
        cr_assert_eq(jlm_ggml_dequant_row(g, src + r * row_bytes, a, k, &err), 0);
        cr_assert_eq(jlm_k_dequant_row_ref(p.type, p.qs, p.d, p.sc, k, rows, r, b), 0);
        double amax = 0, emax = 0, s2 = 0, e2 = 0;
        for (uint64_t i = 0; i < k; i++) {
            double e = fabs((double)a[i] - b[i]);
            amax = fmax(amax, fabs(a[i]));
            emax = e > emax || isnan(e) ? e : emax;
            s2 += (double)a[i] * a[i];
            e2 += e * e;
        }
        double rel_max = amax > 0 ? emax / amax : emax, rel_rms = s2 > 0 ? sqrt(e2 / s2) : sqrt(e2);
        cr_assert(!(rel_max > Q2K_MAX_REL), "%s row %llu: max error %.4g of max |w| %.4g = %.4g, bound %.4g",
                  what, (unsigned long long)r, emax, amax, rel_max, Q2K_MAX_REL);
        cr_assert(!(rel_rms > Q2K_RMS_REL), "%s row %llu: RMS error / RMS = %.4g, bound %.4g",
                  what, (unsigned long long)r, rel_rms, Q2K_RMS_REL);
        c->worst_max = fmax(c->worst_max, rel_max);
        c->worst_rms = fmax(c->worst_rms, rel_rms);
        c->n_rows++;
    }
    free(a);
    free(b);
    planes_free(&p);
}

Test(pack, q2_k_requantized_to_q4_k_stays_within_the_documented_error_bound, .timeout = 30)
{
    q2k_ctx c = {0};
    int n = for_each_sheet(q2k_sheet, &c, "synth-llama-256.Q2_K.gguf");
    cr_assert_eq(n, 1);
    cr_assert_gt(c.n_rows, 0, "no Q2_K tensor found");
    cr_log_info("pack: Q2_K->Q4_K over %llu rows: worst max err %.5f of row max|w|, worst RMS ratio %.5f",
                (unsigned long long)c.n_rows, c.worst_max, c.worst_rms);
}

/* ---------------------------------------------------------------- random blocks, odd shapes */
static const uint32_t EXACT_TYPES[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0,
                                       GGML_Q5_1, GGML_Q8_0, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,
                                       GGML_MXFP4};
#define N_EXACT (sizeof EXACT_TYPES / sizeof EXACT_TYPES[0])

static uint8_t *random_matrix(uint32_t g, uint64_t k, uint64_t rows)
{
    uint64_t n = rows * (k / jlm_ggml_block_elems(g));
    uint8_t *x = malloc(n * jlm_ggml_block_bytes(g));
    cr_assert(x);
    random_blocks(g, x, n);
    return x;
}

Test(pack, random_blocks_of_every_exact_type_dequantize_bit_identically_for_1_to_9_rows)
{
    jlm_err err = {0};
    for (size_t ti = 0; ti < N_EXACT; ti++) {
        uint32_t g = EXACT_TYPES[ti];
        for (uint64_t rows = 1; rows <= 9; rows++) {
            uint64_t k = 512;
            uint8_t *x = random_matrix(g, k, rows);
            planes p;
            char what[64];
            snprintf(what, sizeof what, "random %s %llu rows", jlm_ggml_type_name(g), (unsigned long long)rows);
            cr_assert_eq(pack_sheet(g, x, k, rows, what, &p, &err), 0, "%s", err.msg);
            check_rows_exact(g, x, k, rows, &p, what);
            planes_free(&p);
            free(x);
        }
    }
}

static uint32_t word_le(const uint8_t *p, uint64_t w)
{
    p += 4 * w;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

Test(pack, unused_d_slots_and_the_high_half_of_q3_k_and_q6_k_d_words_stay_zero)
{
    static const struct { uint32_t g; int S; } cases[] = {
        {GGML_Q4_0, 2}, {GGML_Q8_0, 2}, {GGML_Q5_0, 2}, {GGML_MXFP4, 4}, {GGML_Q3_K, 1}, {GGML_Q6_K, 1}};
    jlm_err err = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        uint32_t g = cases[ci].g;
        for (uint64_t rows = 1; rows <= 7; rows++) {
            uint64_t k = 512, nsuper = k / jlm_ggml_block_elems(g), S = (uint64_t)cases[ci].S;
            uint8_t *x = random_matrix(g, k, rows);
            planes p;
            cr_assert_eq(pack_sheet(g, x, k, rows, "d slots", &p, &err), 0, "%s", err.msg);
            if (S > 1) {
                uint64_t per = (rows + S - 1) / S, slot_bits = 32 / S;
                cr_assert_eq(p.d_len, nsuper * per * 4);
                for (uint64_t sb = 0; sb < nsuper; sb++) {
                    uint32_t w = word_le(p.d, sb * per + per - 1);
                    for (uint64_t slot = (rows - 1) % S + 1; slot < S; slot++) {
                        uint32_t v = (w >> (slot * slot_bits)) & ((1u << slot_bits) - 1);
                        cr_assert_eq(v, 0, "%s rows %llu super-block %llu: unused d slot %llu holds 0x%x, expected 0",
                                     jlm_ggml_type_name(g), (unsigned long long)rows,
                                     (unsigned long long)sb, (unsigned long long)slot, v);
                    }
                }
            } else {
                for (uint64_t w = 0; w < p.d_len / 4; w++)
                    cr_assert_eq(word_le(p.d, w) >> 16, 0, "%s rows %llu: d word %llu high half 0x%x, expected 0",
                                 jlm_ggml_type_name(g), (unsigned long long)rows, (unsigned long long)w,
                                 word_le(p.d, w) >> 16);
            }
            planes_free(&p);
            free(x);
        }
    }
}

Test(pack, plane_bytes_equal_gguf_bytes_except_q6_k_212_of_210_and_q3_k_148_of_110)
{
    static const struct { uint32_t g; uint64_t num, den; } cases[] = {
        {GGML_Q4_0, 1, 1}, {GGML_Q5_0, 1, 1}, {GGML_Q5_1, 1, 1}, {GGML_Q8_0, 1, 1}, {GGML_Q4_K, 1, 1},
        {GGML_Q5_K, 1, 1}, {GGML_MXFP4, 1, 1}, {GGML_Q6_K, 212, 210}, {GGML_Q3_K, 148, 110}};
    jlm_err err = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t t;
        int exact;
        uint64_t k = 1024, rows = 8, q, d, s;
        cr_assert_eq(jlm_pack_stored_type(cases[i].g, &t, &exact, &err), 0);
        cr_assert_eq(jlm_fmt_planes(t, k, rows, &q, &d, &s, &err), 0, "%s", err.msg);
        uint64_t gguf = rows * k / jlm_ggml_block_elems(cases[i].g) * jlm_ggml_block_bytes(cases[i].g);
        cr_assert_eq((q + d + s) * cases[i].den, gguf * cases[i].num,
                     "%s: planes %llu bytes, GGUF %llu bytes, expected ratio %llu/%llu",
                     jlm_ggml_type_name(cases[i].g), (unsigned long long)(q + d + s),
                     (unsigned long long)gguf, (unsigned long long)cases[i].num, (unsigned long long)cases[i].den);
    }
}

/* ---------------------------------------------------------------- the spec, read literally */
/* Full code of element e of row r, from 7.1 and 7.5 element by element. */
static int spec_code(const jlm_type_traits *t, const uint8_t *qs, uint64_t rows, uint64_t r, uint64_t e)
{
    uint64_t s = e / t->sub, W = t->w;
    int u = (int)(e % t->sub), code;
    if (t->p0 == 8) {
        code = (word_le(qs, (s * W + (uint64_t)u / 4) * rows + r) >> (8 * (u % 4))) & 0xff;
    } else {
        int j = u % (t->sub / 2);
        int byte = (word_le(qs, (s * W + (uint64_t)j / 4) * rows + r) >> (8 * (j % 4))) & 0xff;
        code = u >= t->sub / 2 ? byte >> 4 : byte & 15;
    }
    if (t->p1) {
        int hi = t->p1, lanes = 8 / hi, bi = ((u / 4) / lanes) * 4 + u % 4;
        uint64_t base = (uint64_t)t->sub * t->p0 / 32;           /* primary words of the sub-block */
        int byte = (word_le(qs, (s * W + base + (uint64_t)bi / 4) * rows + r) >> (8 * (bi % 4))) & 0xff;
        code |= ((byte >> (hi * ((u / 4) % lanes))) & ((1 << hi) - 1)) << 4;
    }
    return code;
}

/* six-bit field f of the stream of super-block sb, bit by bit */
static int spec_field(const uint8_t *sc, uint64_t sb, uint64_t rows, uint64_t r, int f)
{
    int v = 0;
    for (int b = 0; b < 6; b++) {
        int bit = 6 * f + b;
        v |= (int)((word_le(sc, (sb * 3 + (uint64_t)bit / 32) * rows + r) >> (bit % 32)) & 1) << b;
    }
    return v;
}

static float spec_f16(uint16_t h) { return jlm_f16_to_f32(h); }

static float spec_value(uint8_t type, const planes *p, uint64_t k, uint64_t rows, uint64_t r, uint64_t e)
{
    const jlm_type_traits *t = jlm_fmt_type_traits(type);
    uint64_t sb = e / ((uint64_t)t->sub * t->super_sub), s = e / t->sub;
    int q = spec_code(t, p->qs, rows, r, e);
    uint64_t S = t->d_share, dword = S > 1 ? sb * ((rows + S - 1) / S) + r / S : sb * rows + r;
    uint32_t dw = word_le(p->d, dword);
    uint32_t slot = S == 2 ? (dw >> (16 * (r % 2))) & 0xffff : S == 4 ? (dw >> (8 * (r % 4))) & 0xff : dw;
    float d = spec_f16((uint16_t)slot), hi = spec_f16((uint16_t)(dw >> 16));
    int scb = t->sc_kind == 1 ? (int)((word_le(p->sc, (s / 4) * rows + r) >> (8 * (s % 4))) & 0xff) : 0;
    static const int mx[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
    switch (type) {
    case JLM_T_Q4_0: return (q - 8) * d;
    case JLM_T_Q5_0: return (q - 16) * d;
    case JLM_T_Q8_0: return (int8_t)q * d;
    case JLM_T_Q5_1: return q * d - hi;
    case JLM_T_MXFP4: { uint32_t bits = slot << 23; float sc; memcpy(&sc, &bits, 4); return (mx[q] - 12) * sc; }
    case JLM_T_Q3_K: { float dl = d * (scb - 32); return dl * (q - 4); }
    case JLM_T_Q6_K: return d * (scb - 128) * (q - 32);
    case JLM_T_Q4_K: case JLM_T_Q5_K: {
        int sl = (int)(s % 8);
        float d1 = d * spec_field(p->sc, sb, rows, r, 2 * sl), m1 = hi * spec_field(p->sc, sb, rows, r, 2 * sl + 1);
        return d1 * q - m1;
    }
    default: cr_assert_fail("no spec formula for type %u", type); return 0;
    }
}

Test(pack, planes_read_by_the_literal_formulas_of_section_7_give_ggml_values)
{
    static const uint32_t types[] = {GGML_Q4_0, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_Q8_0, GGML_Q3_K,
                                     GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_MXFP4};
    jlm_err err = {0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t g = types[ti];
        uint64_t k = 512, rows = 5, rb = k / jlm_ggml_block_elems(g) * jlm_ggml_block_bytes(g);
        uint8_t *x = random_matrix(g, k, rows);
        planes p;
        cr_assert_eq(pack_sheet(g, x, k, rows, "spec", &p, &err), 0, "%s", err.msg);
        float ref[512];
        for (uint64_t r = 0; r < rows; r++) {
            cr_assert_eq(jlm_ggml_dequant_row(g, x + r * rb, ref, k, &err), 0);
            for (uint64_t e = 0; e < k; e++) {
                float v = spec_value(p.type, &p, k, rows, r, e);
                cr_assert(!memcmp(&v, &ref[e], 4), "%s row %llu element %llu: spec reading %.9g, ggml %.9g",
                          jlm_ggml_type_name(g), (unsigned long long)r, (unsigned long long)e, v, ref[e]);
            }
        }
        planes_free(&p);
        free(x);
    }
}

Test(pack, q4_1_is_stored_as_q5_1_with_zero_high_bits_and_m_sign_flipped)
{
    jlm_err err = {0};
    uint64_t k = 64, rows = 3;
    uint8_t *x = random_matrix(GGML_Q4_1, k, rows);
    planes p;
    cr_assert_eq(pack_sheet(GGML_Q4_1, x, k, rows, "q4_1", &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p.type, JLM_T_Q5_1);
    for (uint64_t sb = 0; sb < 2; sb++)
        for (uint64_t r = 0; r < rows; r++) {
            const uint8_t *blk = x + (r * 2 + sb) * 20;
            uint32_t dw = word_le(p.d, sb * rows + r);
            uint32_t want = (uint32_t)(blk[0] | blk[1] << 8) | (uint32_t)((blk[2] | blk[3] << 8) ^ 0x8000) << 16;
            cr_assert_eq(dw, want, "block %llu row %llu: d word 0x%08x, expected 0x%08x",
                         (unsigned long long)sb, (unsigned long long)r, dw, want);
            cr_assert_eq(word_le(p.qs, (sb * 5 + 4) * rows + r), 0, "secondary word not zero");
        }
    planes_free(&p);
    free(x);
}

/* ---------------------------------------------------------------- MXFP4 exponents */
Test(pack, mxfp4_refuses_exponent_0_1_and_255_in_a_nonzero_block_naming_the_tensor)
{
    static const uint8_t bad[] = {0, 1, 255};
    for (size_t i = 0; i < 3; i++) {
        uint8_t x[2 * 17];
        random_blocks(GGML_MXFP4, x, 2);
        x[17] = bad[i];
        x[18] = 0x21;                      /* codes 1 and 2: non-zero */
        planes p;
        jlm_err err = {0};
        int rc = pack_sheet(GGML_MXFP4, x, 64, 1, "blk.7.ffn_up_exps.weight", &p, &err);
        cr_assert_eq(rc, JLM_EFORMAT, "exponent %u: rc %d, expected JLM_EFORMAT", bad[i], rc);
        cr_assert(strstr(err.msg, "blk.7.ffn_up_exps.weight"), "message does not name the tensor: %s", err.msg);
        planes_free(&p);
    }
}

Test(pack, mxfp4_all_zero_block_is_accepted_whatever_its_exponent_and_stores_byte_0)
{
    static const uint8_t exps[] = {0, 1, 255, 127};
    for (size_t i = 0; i < 4; i++) {
        uint64_t rows = 5, k = 64;
        uint8_t *x = random_matrix(GGML_MXFP4, k, rows);
        uint8_t *blk = x + (2 * 2 + 1) * 17;        /* row 2, block 1 */
        blk[0] = exps[i];
        for (int j = 1; j < 17; j++)
            blk[j] = (uint8_t)((rnd() & 1 ? 0x08 : 0x00) | (rnd() & 1 ? 0x80 : 0x00));   /* codes 0 / 8: zero */
        planes p;
        jlm_err err = {0};
        cr_assert_eq(pack_sheet(GGML_MXFP4, x, k, rows, "zero block", &p, &err), 0, "exponent %u: %s", exps[i], err.msg);
        uint32_t w = word_le(p.d, 1 * 2 + 0);        /* super-block 1, rows 0..3 */
        cr_assert_eq((w >> 16) & 0xff, 0, "exponent %u: stored byte %u, expected 0", exps[i], (w >> 16) & 0xff);
        check_rows_exact(GGML_MXFP4, x, k, rows, &p, "zero block");
        planes_free(&p);
        free(x);
    }
}

/* ---------------------------------------------------------------- type table, refusals */
Test(pack, ggml_block_traits_match_ggml_for_every_listed_type)
{
    static const struct { uint32_t t; uint32_t e, b; const char *n; } T[] = {
        {GGML_F32, 1, 4, "F32"}, {GGML_F16, 1, 2, "F16"}, {GGML_BF16, 1, 2, "BF16"}, {GGML_Q4_0, 32, 18, "Q4_0"},
        {GGML_Q4_1, 32, 20, "Q4_1"}, {GGML_Q5_0, 32, 22, "Q5_0"}, {GGML_Q5_1, 32, 24, "Q5_1"},
        {GGML_Q8_0, 32, 34, "Q8_0"}, {GGML_Q8_1, 32, 36, "Q8_1"}, {GGML_Q2_K, 256, 84, "Q2_K"},
        {GGML_Q3_K, 256, 110, "Q3_K"}, {GGML_Q4_K, 256, 144, "Q4_K"}, {GGML_Q5_K, 256, 176, "Q5_K"},
        {GGML_Q6_K, 256, 210, "Q6_K"}, {GGML_Q8_K, 256, 292, "Q8_K"}, {GGML_I8, 1, 1, "I8"},
        {GGML_I16, 1, 2, "I16"}, {GGML_I32, 1, 4, "I32"}, {GGML_I64, 1, 8, "I64"}, {GGML_F64, 1, 8, "F64"},
        {GGML_MXFP4, 32, 17, "MXFP4"}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        cr_assert_eq(jlm_ggml_block_elems(T[i].t), T[i].e, "%s elems", T[i].n);
        cr_assert_eq(jlm_ggml_block_bytes(T[i].t), T[i].b, "%s bytes", T[i].n);
        cr_assert_str_eq(jlm_ggml_type_name(T[i].t), T[i].n);
    }
    cr_assert_eq(jlm_ggml_block_elems(4), 0, "type 4 (removed Q4_2) is unknown");
    cr_assert_null(jlm_ggml_type_name(1000));
}

Test(pack, types_without_a_stored_type_are_refused_by_name)
{
    static const uint32_t T[] = {GGML_Q8_1, GGML_Q8_K, GGML_I8, GGML_I32, GGML_F64};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        jlm_err err = {0};
        uint8_t t = 0;
        int exact = 0;
        cr_assert_eq(jlm_pack_stored_type(T[i], &t, &exact, &err), JLM_EUNSUPPORTED);
        cr_assert(strstr(err.msg, jlm_ggml_type_name(T[i])), "message does not name %s: %s",
                  jlm_ggml_type_name(T[i]), err.msg);
    }
    jlm_err err = {0};
    float y[256];
    uint8_t blk[292] = {0};
    cr_assert_eq(jlm_ggml_dequant_row(GGML_Q8_K, blk, y, 256, &err), JLM_EUNSUPPORTED);
    cr_assert_eq(jlm_ggml_dequant_row(77, blk, y, 256, &err), JLM_EUNSUPPORTED);
}

/* ---------------------------------------------------------------- f16 */
Test(pack, f16_to_f32_to_f16_round_trips_all_65536_values)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = jlm_f16_to_f32((uint16_t)h);
        uint16_t back = jlm_f32_to_f16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            cr_assert(isnan(f), "0x%04x should widen to NaN", h);
            cr_assert_eq(back & 0x7c00, 0x7c00, "NaN 0x%04x narrowed to non-NaN 0x%04x", h, back);
            cr_assert(back & 0x3ff, "NaN 0x%04x narrowed to inf 0x%04x", h, back);
            continue;
        }
        cr_assert_eq(back, h, "0x%04x -> %.9g -> 0x%04x", h, f, back);
    }
}

Test(pack, f32_to_f16_rounds_to_nearest_even_at_and_around_every_midpoint)
{
    for (uint32_t h = 0; h < 0x7bff; h++) {          /* every pair of adjacent finite positives */
        float a = jlm_f16_to_f32((uint16_t)h), b = jlm_f16_to_f32((uint16_t)(h + 1));
        float mid = (a + b) / 2;                      /* exact: f16 has 11 bits, f32 24 */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        cr_assert_eq(jlm_f32_to_f16(mid), even, "midpoint of 0x%04x/0x%04x -> 0x%04x", h, h + 1, jlm_f32_to_f16(mid));
        cr_assert_eq(jlm_f32_to_f16(-mid), even | 0x8000, "negative midpoint of 0x%04x", h);
        cr_assert_eq(jlm_f32_to_f16(nextafterf(mid, 0)), h, "just below the midpoint of 0x%04x", h);
        cr_assert_eq(jlm_f32_to_f16(nextafterf(mid, INFINITY)), h + 1, "just above the midpoint of 0x%04x", h);
    }
    cr_assert_eq(jlm_f32_to_f16(65520.f), 0x7c00, "65520 (the max-finite midpoint, odd side) rounds to inf");
    cr_assert_eq(jlm_f32_to_f16(nextafterf(65520.f, 0)), 0x7bff);
    cr_assert_eq(jlm_f32_to_f16(1e-8f), 0, "below half the smallest subnormal");
    cr_assert_eq(jlm_f32_to_f16(INFINITY), 0x7c00);
}

Test(pack, bf16_widens_by_shifting_into_the_high_half)
{
    for (uint32_t h = 0; h < 65536; h += 7) {
        float f = jlm_bf16_to_f32((uint16_t)h);
        uint32_t bits;
        memcpy(&bits, &f, 4);
        cr_assert_eq(bits, h << 16);
    }
}

/* ---------------------------------------------------------------- ggml port vs the f32 source */
/* The synth-llama-256.* files were quantized by llama-quantize from the shipped
 * f32 file, so our port of dequantize_row_* must land within each type's
 * quantization error of the source: relative RMS error per type, measured
 * 0.297 Q2_K, 0.151 Q3_K, 0.086 Q4_0, 0.078 Q4_1, 0.071 Q4_K, 0.043 Q5_0,
 * 0.038 Q5_1, 0.036 Q5_K, 0.018 Q6_K, 0.0054 Q8_0, 0.114 MXFP4; the bounds
 * are 1.25x that. A misplaced nibble, bit or scale gives 0.5 or more. */
static double ggml_rms_bound(uint32_t g)
{
    switch (g) {
    case GGML_Q2_K: return 0.37;   case GGML_Q3_K: return 0.19;  case GGML_Q4_0: return 0.11;
    case GGML_Q4_1: return 0.098;  case GGML_Q4_K: return 0.089; case GGML_Q5_0: return 0.054;
    case GGML_Q5_1: return 0.048;  case GGML_Q5_K: return 0.045; case GGML_Q6_K: return 0.023;
    case GGML_Q8_0: return 0.0068; case GGML_MXFP4: return 0.143;
    default: return 0;
    }
}

Test(pack, ggml_dequantization_of_every_synth_llama_type_tracks_the_f32_source, .timeout = 60)
{
    static const char *files[] = {"Q2_K", "Q3_K_M", "Q4_0", "Q4_1", "Q4_K_M", "Q5_0", "Q5_1", "Q5_K_M",
                                  "Q6_K", "Q8_0", "MXFP4"};
    char path[4352];
    jlm_err err = {0};
    jlm_gguf *f = NULL;
    snprintf(path, sizeof path, "%s/tests/models/synth-llama-256.f32.gguf", root());
    cr_assert_eq(jlm_gguf_open(path, &f, &err), 0, "%s", err.msg);
    for (size_t fi = 0; fi < sizeof files / sizeof files[0]; fi++) {
        jlm_gguf *q = NULL;
        snprintf(path, sizeof path, "%s/tests/models/synth-llama-256.%s.gguf", root(), files[fi]);
        cr_assert_eq(jlm_gguf_open(path, &q, &err), 0, "%s", err.msg);
        double e2[64] = {0}, s2[64] = {0};
        for (uint64_t i = 0; i < q->n_tensors; i++) {
            const jlm_gguf_tensor *tq = &q->tensors[i];
            if (tq->type == GGML_F32 || tq->type >= 64)
                continue;
            const jlm_gguf_tensor *tf = jlm_gguf_find_tensor(f, tq->name.s);
            cr_assert(tf && tf->type == GGML_F32, "%s: %s has no f32 source", files[fi], tq->name.s);
            uint64_t k = tq->ne[0], n = tf->n_bytes / 4, rb = k / jlm_ggml_block_elems(tq->type) * jlm_ggml_block_bytes(tq->type);
            uint8_t *b = malloc(tq->n_bytes);
            float *src = malloc(tf->n_bytes), *y = malloc(k * 4);
            cr_assert(jlm_gguf_read(q, tq, 0, b, tq->n_bytes, &err) == 0 && jlm_gguf_read(f, tf, 0, src, tf->n_bytes, &err) == 0);
            for (uint64_t r = 0; r < n / k; r++) {
                cr_assert_eq(jlm_ggml_dequant_row(tq->type, b + r * rb, y, k, &err), 0, "%s", err.msg);
                for (uint64_t j = 0; j < k; j++) {
                    double e = (double)y[j] - src[r * k + j];
                    e2[tq->type] += e * e;
                    s2[tq->type] += (double)src[r * k + j] * src[r * k + j];
                }
            }
            free(b);
            free(src);
            free(y);
        }
        int checked = 0;
        for (uint32_t t = 0; t < 64; t++) {
            if (s2[t] == 0)
                continue;
            double rel = sqrt(e2[t] / s2[t]), bound = ggml_rms_bound(t);
            cr_assert(bound > 0 && !(rel > bound), "%s: %s relative RMS error vs f32 %.5f, bound %.5f",
                      files[fi], jlm_ggml_type_name(t), rel, bound);
            checked++;
        }
        cr_assert_gt(checked, 0, "%s: no quantized tensor", files[fi]);
        jlm_gguf_close(q);
    }
    jlm_gguf_close(f);
}
