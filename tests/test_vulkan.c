/* test_vulkan.c - suite `vulkan`: every shader of kernels/vulkan/ against its
 * CPU twin in kernels/cpu/ on random data and edge shapes (rows not a multiple
 * of the d-word group, odd column counts, zeros, NaN/Inf, large values).
 * Tolerances are stated where each check is made and justified in
 * docs/vulkan.md. Without a Vulkan device (or built without Vulkan) each test
 * skips with one line. Lavapipe counts: the tests name it (allow_cpu). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "engine/backend_vk.h"
#include "engine/model.h"
#include "engine/model_int.h"
#include "engine/pager.h"
#include "kernels/cpu/kernels.h"
#include "kernels/vulkan/vk.h"
#include "tests/backend_matrix.h"
#include "tests/kernel_fixture.h"
#include "tests/testutil.h"

/* ---------------------------------------------------------------- helpers */

static jlm_vk *open_or_skip(void)
{
    jlm_vk *vk = NULL;
    jlm_err err = {0};
    if (jlm_vk_open(NULL, 1, &vk, &err) != 0)
        cr_skip_test("%s", err.msg);
    return vk;
}

static jlm_vk_buf *up(jlm_vk *vk, const void *src, uint64_t n)
{
    jlm_vk_buf *b = NULL;
    jlm_err err = {0};
    cr_assert(jlm_vk_buf_upload(vk, src, n, &b, &err) == 0, "%s", err.msg);
    return b;
}

static jlm_vk_view whole(jlm_vk_buf *b) { return (jlm_vk_view){b, 0, 0}; }
static const float *fmap(jlm_vk_buf *b) { return jlm_vk_buf_map(b); }

/* Same bits, or both NaN (payloads may differ). */
static int same(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0;
}

/* ---------------------------------------------------------------- matvec */

static const uint8_t TYPES[] = {JLM_T_F32, JLM_T_F16, JLM_T_BF16, JLM_T_Q4_0, JLM_T_Q8_0,
                                JLM_T_Q5_0, JLM_T_Q5_1, JLM_T_MXFP4, JLM_T_Q3_K, JLM_T_Q4_K,
                                JLM_T_Q5_K, JLM_T_Q6_K};

/* Flavour 5: NaN and Inf among the activations; 6: an Inf scale (float
 * types: an Inf weight) in row 0. */
static void poison(tmat *t, float *x, uint64_t k, int flavour)
{
    const jlm_type_traits *tr = jlm_fmt_type_traits(t->m.type);
    if (flavour == 5) {
        x[k / 3] = NAN;
        x[k - 1] = -INFINITY;
    } else if (flavour == 6 && tr->is_float) {
        if (t->m.type == JLM_T_F32)
            ((float *)t->qs)[0] = INFINITY;
        else
            ((uint16_t *)t->qs)[0] = t->m.type == JLM_T_F16 ? 0x7c00 : 0x7f80;
    } else if (flavour == 6) {
        t->d[0] = tr->d_share == 4 ? (t->d[0] | 0xffu) : ((t->d[0] & 0xffff0000u) | 0x7c00u);
    }
}

/* One (type, k, rows, flavour): the shader's y against jlm_k_matvec_ref's,
 * bit for bit (NaN matches NaN). Returns the number of rows compared. */
static uint64_t check_matvec(jlm_vk *vk, uint8_t type, uint64_t k, uint64_t rows, int flavour,
                             uint64_t *seed)
{
    const jlm_type_traits *tr = jlm_fmt_type_traits(type);
    tmat t;
    tmat_make(&t, type, k, rows, seed);
    uint64_t kx = (k + 31) / 32 * 32;
    float *x = calloc(kx, sizeof *x), *yc = malloc(rows * sizeof *yc);
    rand_act(x, k, seed, flavour < 5 ? flavour : 0);
    poison(&t, x, k, flavour);
    void *abuf = malloc(jlm_k_act_q8_bytes(kx));
    jlm_act_q8 xq;
    jlm_err err = {0};
    cr_assert(jlm_k_act_q8_init(&xq, abuf, kx, &err) == 0);
    jlm_k_quantize_act(x, &xq);
    jlm_k_matvec_ref(&t.m, x, &xq, yc, 0, rows);

    uint64_t ql, dl, sl;
    cr_assert(jlm_fmt_planes(type, k, rows, &ql, &dl, &sl, NULL) == 0);
    jlm_vk_buf *bq = up(vk, t.qs, ql), *bd = dl ? up(vk, t.d, dl) : NULL, *bs = sl ? up(vk, t.sc, sl) : NULL;
    jlm_vk_buf *bx = up(vk, x, k * 4), *by = up(vk, yc, rows * 4);
    memset(jlm_vk_buf_map(by), 0xff, rows * 4);
    jlm_vk_buf *aq = up(vk, xq.q, kx), *ad = up(vk, xq.d, kx / 32 * 4), *as = up(vk, xq.sum16, kx / 16 * 2);
    jlm_vk_mat m = {type, k, rows, whole(bq), {bd, 0, 0}, {bs, 0, 0}};
    jlm_vk_act va = {kx, whole(aq), whole(ad), whole(as), 1};
    cr_assert(jlm_vk_matvec(vk, &m, whole(bx), tr->is_float ? NULL : &va, whole(by), &err) == 0,
              "%s", err.msg);
    const float *yg = fmap(by);
    for (uint64_t r = 0; r < rows; r++)
        cr_assert(same(yg[r], yc[r]), "%s k %llu rows %llu flavour %d row %llu: vulkan %.9g cpu %.9g",
                  tr->name, (unsigned long long)k, (unsigned long long)rows, flavour,
                  (unsigned long long)r, yg[r], yc[r]);
    jlm_vk_buf *all[] = {bq, bd, bs, bx, by, aq, ad, as};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        jlm_vk_buf_free(vk, all[i]);
    free(abuf);
    free(x);
    free(yc);
    tmat_free(&t);
    return rows;
}

Test(vulkan, matvec_is_bit_identical_to_the_cpu_reference_for_every_type)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 0x9e3779b97f4a7c15ull, n = 0;
    static const uint64_t ROWS[] = {1, 3, 67, 130};
    for (size_t i = 0; i < sizeof TYPES; i++) {
        const jlm_type_traits *tr = jlm_fmt_type_traits(TYPES[i]);
        uint64_t super = (uint64_t)tr->sub * tr->super_sub;
        uint64_t ks[3] = {super, 3 * super, tr->is_float ? 37 : 2 * super};   /* 37: odd columns */
        for (int f = 0; f <= 6; f++)
            for (size_t r = 0; r < 4; r++)
                n += check_matvec(vk, TYPES[i], ks[(f + r) % 3], ROWS[r], f, &seed);
    }
    cr_assert(n > 0);
    jlm_vk_close(vk);
}

/* A plane over one binding (maxStorageBufferRange, lowered to 16 KiB here by
 * JLM_VK_MAX_BINDING) is bound as windows of the same buffer: quantized types
 * in k-chunks of whole super-blocks with the sum carried in y, float types
 * in row chunks. Still bit-identical to the CPU reference, every type. */
Test(vulkan, matvec_over_one_binding_runs_in_chunks_bit_identical)
{
    setenv("JLM_VK_MAX_BINDING", "16384", 1);
    jlm_vk *vk = open_or_skip();
    unsetenv("JLM_VK_MAX_BINDING");
    cr_assert_eq(jlm_vk_max_binding(vk), 16384);
    uint64_t seed = 0x51ed270b27c8f3a1ull, n = 0;
    for (size_t i = 0; i < sizeof TYPES; i++) {
        const jlm_type_traits *tr = jlm_fmt_type_traits(TYPES[i]);
        uint64_t super = (uint64_t)tr->sub * tr->super_sub;
        uint64_t k = tr->is_float ? 600 : super == 256 ? 16 * 256 : 64 * super, rows = 67, ql, dl, sl;
        cr_assert_eq(jlm_fmt_planes(TYPES[i], k, rows, &ql, &dl, &sl, NULL), 0);
        cr_assert(ql > 16384, "%s: the qs plane (%llu bytes) must exceed the binding", tr->name, (unsigned long long)ql);
        for (int f = 0; f <= 6; f += 3)
            n += check_matvec(vk, TYPES[i], k, rows, f, &seed);
    }
    cr_assert(n > 0);
    jlm_vk_close(vk);
}

/* jlm_vk_matmul: n tokens in one dispatch, each token's rows bit-identical
 * to jlm_k_matvec_ref on that token alone; also with the planes over one
 * binding (16 KiB: k-chunks carrying y for every token). */
static void check_matmul(jlm_vk *vk, uint8_t type, uint64_t k, uint64_t rows, uint32_t n, uint64_t *seed)
{
    const jlm_type_traits *tr = jlm_fmt_type_traits(type);
    tmat t;
    tmat_make(&t, type, k, rows, seed);
    float *x = calloc(n * k, sizeof *x), *yc = malloc(n * rows * sizeof *yc);
    uint8_t *aqb = malloc(n * k), *adb = malloc(n * k / 8), *asb = malloc(n * k / 8);
    jlm_err err = {0};
    for (uint32_t i = 0; i < n; i++) {
        rand_act(x + i * k, k, seed, (int)(i % 5));
        void *abuf = malloc(jlm_k_act_q8_bytes(k));
        jlm_act_q8 xq;
        cr_assert(jlm_k_act_q8_init(&xq, abuf, k, &err) == 0);
        jlm_k_quantize_act(x + i * k, &xq);
        jlm_k_matvec_ref(&t.m, x + i * k, &xq, yc + i * rows, 0, rows);
        memcpy(aqb + i * k, xq.q, k);
        memcpy(adb + i * (k / 8), xq.d, k / 8);
        memcpy(asb + i * (k / 8), xq.sum16, k / 8);
        free(abuf);
    }
    uint64_t ql, dl, sl;
    cr_assert(jlm_fmt_planes(type, k, rows, &ql, &dl, &sl, NULL) == 0);
    jlm_vk_buf *bq = up(vk, t.qs, ql), *bd = dl ? up(vk, t.d, dl) : NULL, *bs = sl ? up(vk, t.sc, sl) : NULL;
    jlm_vk_buf *bx = up(vk, x, n * k * 4), *by = up(vk, yc, n * rows * 4);
    memset(jlm_vk_buf_map(by), 0xff, n * rows * 4);
    jlm_vk_buf *aq = up(vk, aqb, n * k), *ad = up(vk, adb, n * k / 8), *as = up(vk, asb, n * k / 8);
    jlm_vk_mat m = {type, k, rows, whole(bq), {bd, 0, 0}, {bs, 0, 0}};
    jlm_vk_act va = {k, whole(aq), whole(ad), whole(as), n};
    cr_assert(jlm_vk_matmul(vk, &m, n, tr->is_float ? whole(bx) : (jlm_vk_view){0}, tr->is_float ? NULL : &va, whole(by),
                            &err) == 0, "%s", err.msg);
    const float *yg = fmap(by);
    for (uint64_t i = 0; i < n * rows; i++)
        cr_assert(same(yg[i], yc[i]), "%s k %llu rows %llu: token %llu row %llu: vulkan %.9g cpu %.9g", tr->name,
                  (unsigned long long)k, (unsigned long long)rows, (unsigned long long)(i / rows),
                  (unsigned long long)(i % rows), yg[i], yc[i]);
    jlm_vk_buf *all[] = {bq, bd, bs, bx, by, aq, ad, as};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        jlm_vk_buf_free(vk, all[i]);
    free(x);
    free(yc);
    free(aqb);
    free(adb);
    free(asb);
    tmat_free(&t);
}

Test(vulkan, matmul_of_several_tokens_is_each_tokens_matvec_bit_for_bit)
{
    /* Token counts either side of the shader's tile of 8 (a partial tile,
     * whole tiles, whole tiles and one more), with every plane in one
     * binding, then over a lowered binding (k-chunks carrying y for every
     * token of a tile): 16 KiB with 3 tokens, 64 KiB (the activations of 9
     * and 11 tokens of k = 4096 still fit one binding; the planes do not). */
    static const uint32_t NTOK[] = {2, 5, 8, 9, 19}, NTOK16[] = {3}, NTOK64[] = {9, 11};
    static const struct { const char *lim; const uint32_t *n; size_t nn; } RUN[] = {
        {NULL, NTOK, 5}, {"16384", NTOK16, 1}, {"65536", NTOK64, 2}};
    for (size_t r = 0; r < sizeof RUN / sizeof RUN[0]; r++) {
        int lowered = RUN[r].lim != NULL;
        if (lowered)
            setenv("JLM_VK_MAX_BINDING", RUN[r].lim, 1);
        jlm_vk *vk = open_or_skip();
        unsetenv("JLM_VK_MAX_BINDING");
        uint64_t seed = 0x2545f4914f6cdd1dull;
        for (size_t i = 0; i < sizeof TYPES; i++) {
            const jlm_type_traits *tr = jlm_fmt_type_traits(TYPES[i]);
            uint64_t super = (uint64_t)tr->sub * tr->super_sub;
            uint64_t k = tr->is_float ? 256 : lowered ? (super == 256 ? 16 * 256 : 64 * super) : 2 * super;
            for (size_t j = 0; j < RUN[r].nn; j++)
                check_matmul(vk, TYPES[i], k, lowered ? 67 : 130, RUN[r].n[j], &seed);
        }
        jlm_vk_close(vk);
    }
}

/* jlm_vk_matmul_batch: nb sheets back to back in each plane (a 3-D tensor:
 * deepseek2's attn_k_b / attn_v_b), token t of sheet h reading its
 * activations at t*tx + h*bx (gaps between tokens) and writing at t*ty + h*by:
 * every (sheet, token) row bit-identical to jlm_k_matvec_ref of that sheet
 * alone (what the per-sheet jlm_vk_matmul gives, tests above), and nothing
 * written outside those rows. */
static void check_batch(jlm_vk *vk, uint8_t type, uint64_t k, uint64_t rows, uint32_t nb, uint32_t n, uint64_t *seed)
{
    const jlm_type_traits *tr = jlm_fmt_type_traits(type);
    uint64_t ql, dl, sl, bx = k, tx = nb * k + 32, by = rows, ty = nb * rows + 5;
    cr_assert(jlm_fmt_planes(type, k, rows, &ql, &dl, &sl, NULL) == 0);
    cr_assert(ql % 4 == 0 && dl % 4 == 0 && sl % 4 == 0);
    uint8_t *pq = calloc(nb, ql + 4), *pd = calloc(nb, dl + 4), *ps = calloc(nb, sl + 4);
    float *x = calloc(n * tx, 4), *yc = malloc(n * ty * 4);
    uint8_t *aqb = calloc(n * tx, 1), *adb = calloc(n * tx / 8, 1), *asb = calloc(n * tx / 8, 1);
    void *abuf = malloc(jlm_k_act_q8_bytes(k));
    jlm_act_q8 xq;
    jlm_err err = {0};
    cr_assert(jlm_k_act_q8_init(&xq, abuf, k, &err) == 0);
    memset(yc, 0xff, n * ty * 4);
    for (uint32_t h = 0; h < nb; h++) {
        tmat t;
        tmat_make(&t, type, k, rows, seed);
        memcpy(pq + h * ql, t.qs, ql);
        memcpy(pd + h * dl, t.d, dl);
        memcpy(ps + h * sl, t.sc, sl);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t o = i * tx + h * bx;
            rand_act(x + o, k, seed, (int)((i + h) % 5));
            jlm_k_quantize_act(x + o, &xq);
            jlm_k_matvec_ref(&t.m, x + o, &xq, yc + i * ty + h * by, 0, rows);
            memcpy(aqb + o, xq.q, k);
            memcpy(adb + o / 8, xq.d, k / 8);
            memcpy(asb + o / 8, xq.sum16, k / 8);
        }
        tmat_free(&t);
    }
    jlm_vk_buf *bq = up(vk, pq, nb * ql), *bd = dl ? up(vk, pd, nb * dl) : NULL, *bs = sl ? up(vk, ps, nb * sl) : NULL;
    jlm_vk_buf *bxb = up(vk, x, n * tx * 4), *byb = up(vk, yc, n * ty * 4);
    memset(jlm_vk_buf_map(byb), 0xff, n * ty * 4);
    jlm_vk_buf *aq = up(vk, aqb, n * tx), *ad = up(vk, adb, n * tx / 8), *as = up(vk, asb, n * tx / 8);
    jlm_vk_mat m = {type, k, rows, {bq, 0, ql}, {bd, 0, dl}, {bs, 0, sl}};
    jlm_vk_act va = {k, whole(aq), whole(ad), whole(as), n};
    jlm_vk_batch b = {nb, tx, ty, bx, by, ql, dl, sl};
    cr_assert(jlm_vk_matmul_batch(vk, &m, &b, n, tr->is_float ? whole(bxb) : (jlm_vk_view){0},
                                  tr->is_float ? NULL : &va, whole(byb), &err) == 0, "%s", err.msg);
    const float *yg = fmap(byb);
    for (uint64_t i = 0; i < n * ty; i++)   /* the gaps stay as written (0xff bytes: NaN) */
        cr_assert(!memcmp(&yg[i], &yc[i], 4), "%s k %llu rows %llu, %u sheets, %u tokens: token %llu at %llu: "
                  "vulkan %.9g cpu %.9g", tr->name, (unsigned long long)k, (unsigned long long)rows, nb, n,
                  (unsigned long long)(i / ty), (unsigned long long)(i % ty), yg[i], yc[i]);
    jlm_vk_buf *all[] = {bq, bd, bs, bxb, byb, aq, ad, as};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        jlm_vk_buf_free(vk, all[i]);
    void *mem[] = {pq, pd, ps, x, yc, aqb, adb, asb, abuf};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        free(mem[i]);
}

Test(vulkan, batched_matvec_of_sheets_is_each_sheets_matvec_bit_for_bit)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 0x6a09e667f3bcc909ull;
    static const uint32_t NB[] = {1, 3, 4}, NT[] = {1, 5, 9};
    for (size_t i = 0; i < sizeof TYPES; i++) {
        const jlm_type_traits *tr = jlm_fmt_type_traits(TYPES[i]);
        uint64_t super = (uint64_t)tr->sub * tr->super_sub, k = tr->is_float ? 64 : 2 * super;
        for (size_t j = 0; j < 3; j++)
            check_batch(vk, TYPES[i], k, j == 1 ? 130 : 67, NB[j], NT[j], &seed);
    }
    jlm_err err = {0};
    jlm_vk_mat m = {.type = JLM_T_Q8_0, .k = 32, .rows = 4};
    jlm_vk_batch bad = {2, 33, 4, 32, 4, 136, 0, 0};   /* an activation stride off a 32-block */
    cr_assert_eq(jlm_vk_matmul_batch(vk, &m, &bad, 1, (jlm_vk_view){0}, NULL, (jlm_vk_view){0}, &err), JLM_EINVAL);
    cr_assert(strstr(err.msg, "bad strides"), "%s", err.msg);
    jlm_vk_close(vk);
}

Test(vulkan, matvec_rejects_a_view_past_its_buffer)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 7;
    tmat t;
    tmat_make(&t, JLM_T_F32, 32, 4, &seed);
    jlm_vk_buf *bq = up(vk, t.qs, 32 * 4 * 4), *bx = up(vk, t.qs, 32 * 4), *by = up(vk, t.qs, 16);
    jlm_vk_mat m = {.type = JLM_T_F32, .k = 32, .rows = 4, .qs = {bq, 0, 32 * 4 * 8}};
    jlm_err err = {0};
    cr_assert_eq(jlm_vk_matvec(vk, &m, whole(bx), NULL, whole(by), &err), JLM_EINVAL);
    cr_assert(strstr(err.msg, "outside its buffer"), "%s", err.msg);
    jlm_vk_buf_free(vk, bq);
    jlm_vk_buf_free(vk, bx);
    jlm_vk_buf_free(vk, by);
    tmat_free(&t);
    jlm_vk_close(vk);
}

/* ---------------------------------------------------------------- f32 ops */

/* Random values of magnitude up to `mag`, with zeros, and NaN/Inf when edge. */
static void rand_vec(float *x, uint64_t n, float mag, int edge, uint64_t *seed)
{
    for (uint64_t i = 0; i < n; i++)
        x[i] = rng_unit(seed) * mag * (i % 11 == 0 ? 0.0f : 1.0f);
    if (edge && n > 4) {
        x[1] = NAN;
        x[2] = INFINITY;
        x[3] = -INFINITY;
    }
}

/* Largest |gpu - cpu| / (|cpu| + floor) over finite pairs; non-finite pairs
 * must match exactly (fails the test otherwise). */
static double worst(const float *g, const float *c, uint64_t n, double floor_, const char *what)
{
    double w = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || !isfinite(c[i])) {
            cr_assert(same(g[i], c[i]), "%s [%llu]: vulkan %g cpu %g", what, (unsigned long long)i, g[i], c[i]);
            continue;
        }
        double e = fabs((double)g[i] - (double)c[i]) / (fabs((double)c[i]) + floor_);
        if (e > w)
            w = e;
    }
    return w;
}

#define TOL_NORM 1e-5      /* f32 tree sum vs f64 sum, 1/sqrt: docs/vulkan.md */
#define TOL_EXP  2e-5      /* exp/tanh within the Vulkan spec's ULP bounds: docs/vulkan.md */

Test(vulkan, rmsnorm_matches_the_cpu_within_TOL_NORM)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 11;
    static const uint32_t NS[] = {1, 7, 256, 257, 1000, 4096};
    for (size_t i = 0; i < sizeof NS / sizeof NS[0]; i++)
        for (int edge = 0; edge < 3; edge++) {
            uint32_t n = NS[i];
            float *x = malloc(n * 4), *w = malloc(n * 4), *c = malloc(n * 4);
            rand_vec(x, n, edge == 2 ? 1e18f : 3.0f, 0, &seed);   /* 1e18: x^2 overflows f32 */
            rand_vec(w, n, 1.0f, 0, &seed);
            if (edge == 1)
                x[n / 2] = NAN;
            jlm_k_rmsnorm(c, x, edge ? NULL : w, n, 1e-5f);
            jlm_vk_buf *bx = up(vk, x, n * 4), *bw = up(vk, w, n * 4), *bo = up(vk, c, n * 4);
            jlm_err err = {0};
            cr_assert(jlm_vk_rmsnorm(vk, whole(bo), whole(bx), edge ? (jlm_vk_view){0} : whole(bw), n,
                                     1e-5f, &err) == 0, "%s", err.msg);
            double e = worst(fmap(bo), c, n, 1e-30, "rmsnorm");
            cr_assert(e <= TOL_NORM, "rmsnorm n %u edge %d: relative error %g > %g", n, edge, e, TOL_NORM);
            jlm_vk_buf_free(vk, bx);
            jlm_vk_buf_free(vk, bw);
            jlm_vk_buf_free(vk, bo);
            free(x);
            free(w);
            free(c);
        }
    jlm_vk_close(vk);
}

Test(vulkan, softmax_matches_the_cpu_within_TOL_EXP)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 12;
    static const uint32_t NS[] = {1, 5, 256, 300, 32000};
    for (size_t i = 0; i < sizeof NS / sizeof NS[0]; i++)
        for (int edge = 0; edge < 3; edge++) {
            uint32_t n = NS[i], rows = 3;
            float *x = malloc((size_t)n * rows * 4), *c = malloc((size_t)n * rows * 4);
            rand_vec(x, (uint64_t)n * rows, edge == 2 ? 80.0f : 8.0f, 0, &seed);
            if (edge == 1 && n > 4)
                x[2] = -INFINITY;                      /* a masked entry */
            memcpy(c, x, (size_t)n * rows * 4);
            for (uint32_t r = 0; r < rows; r++)
                jlm_k_softmax(c + (size_t)r * n, n);
            jlm_vk_buf *bx = up(vk, x, (uint64_t)n * rows * 4);
            jlm_err err = {0};
            cr_assert(jlm_vk_softmax(vk, whole(bx), n, rows, &err) == 0, "%s", err.msg);
            /* relative to each probability, floor 1e-6/n: a probability far
             * below 1/n may carry exp's absolute error only */
            double e = worst(fmap(bx), c, (uint64_t)n * rows, 1e-6 / n, "softmax");
            cr_assert(e <= TOL_EXP, "softmax n %u edge %d: relative error %g > %g", n, edge, e, TOL_EXP);
            jlm_vk_buf_free(vk, bx);
            free(x);
            free(c);
        }
    jlm_vk_close(vk);
}

Test(vulkan, eltwise_ops_match_the_cpu_within_TOL_EXP)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 13;
    uint32_t n = 1031;                                 /* not a multiple of the group of 256 */
    float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
    for (int op = JLM_VK_SILU; op <= JLM_VK_GELU_QUICK; op++)
        for (int edge = 0; edge < 2; edge++) {
            rand_vec(a, n, edge ? 100.0f : 6.0f, edge, &seed);
            rand_vec(b, n, 4.0f, 0, &seed);
            switch (op) {
            case JLM_VK_SILU: jlm_k_silu(c, a, n); break;
            case JLM_VK_GELU: jlm_k_gelu(c, a, n); break;
            case JLM_VK_SWIGLU: jlm_k_swiglu(c, a, b, n); break;
            case JLM_VK_ADD: jlm_k_add(c, a, b, n); break;
            case JLM_VK_GELU_QUICK: jlm_k_gelu_quick(c, a, n); break;
            default: jlm_k_mul(c, a, b, n); break;
            }
            jlm_vk_buf *ba = up(vk, a, n * 4), *bb = up(vk, b, n * 4), *bo = up(vk, c, n * 4);
            memset(jlm_vk_buf_map(bo), 0, n * 4);
            jlm_err err = {0};
            cr_assert(jlm_vk_eltwise(vk, op, whole(bo), whole(ba), whole(bb), n, &err) == 0, "%s", err.msg);
            /* error relative to |out| + |a|: exp/tanh carry an absolute error
             * near ulp(1), which x (or gate) multiplies; 0.5x(1 + tanh) cancels */
            double e = 0.0;
            const float *g = fmap(bo);
            for (uint32_t j = 0; j < n; j++) {
                if (!isfinite(g[j]) || !isfinite(c[j])) {
                    cr_assert(same(g[j], c[j]), "op %d [%u]: vulkan %g cpu %g", op, j, g[j], c[j]);
                    continue;
                }
                double ej = fabs((double)g[j] - c[j]) / (fabs((double)c[j]) + fabs((double)a[j]) + 1e-30);
                e = ej > e ? ej : e;
            }
            /* add and mul are one correctly rounded f32 operation: exact */
            double tol = op == JLM_VK_ADD || op == JLM_VK_MUL ? 0.0 : TOL_EXP;
            cr_assert(e <= tol, "op %d edge %d: relative error %g > %g", op, edge, e, tol);
            jlm_vk_buf_free(vk, ba);
            jlm_vk_buf_free(vk, bb);
            jlm_vk_buf_free(vk, bo);
        }
    free(a);
    free(b);
    free(c);
    jlm_vk_close(vk);
}

/* Largest |g - c| / (|c| + |a| + |b|): exp's absolute error near ulp(1)
 * times the gate, and (u + 1) times it again; non-finite pairs must match. */
static double worst_eltwise2(const float *g, const float *c, const float *a, const float *b, uint32_t n,
                             const char *what)
{
    double e = 0.0;
    for (uint32_t j = 0; j < n; j++) {
        if (!isfinite(g[j]) || !isfinite(c[j])) {
            cr_assert(same(g[j], c[j]), "%s [%u]: vulkan %g cpu %g (gate %g up %g)", what, j, g[j], c[j], a[j], b[j]);
            continue;
        }
        double ej = fabs((double)g[j] - c[j]) / (fabs((double)c[j]) + fabs((double)a[j]) * (fabs((double)b[j]) + 1) + 1e-30);
        e = ej > e ? ej : e;
    }
    return e;
}

Test(vulkan, swiglu_oai_matches_the_cpu_within_TOL_EXP_and_clamps_nan_as_fminf)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 17;
    uint32_t n = 1031;
    float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
    for (int edge = 0; edge < 2; edge++) {
        rand_vec(a, n, edge ? 40.0f : 9.0f, edge, &seed);   /* past the limit of 7 both ways */
        rand_vec(b, n, edge ? 40.0f : 9.0f, edge, &seed);
        if (edge) {   /* NaN gate / up: fminf gives the limit */
            b[5] = NAN, a[6] = NAN, b[7] = INFINITY, b[8] = -INFINITY, a[9] = -INFINITY;
        }
        jlm_k_swiglu_oai(c, a, b, n, 1.702f, 7.0f);
        jlm_vk_buf *ba = up(vk, a, n * 4), *bb = up(vk, b, n * 4), *bo = up(vk, c, n * 4);
        memset(jlm_vk_buf_map(bo), 0, n * 4);
        jlm_err err = {0};
        cr_assert(jlm_vk_swiglu_oai(vk, whole(bo), whole(ba), whole(bb), n, 1.702f, 7.0f, &err) == 0, "%s", err.msg);
        double e = worst_eltwise2(fmap(bo), c, a, b, n, "swiglu_oai");
        cr_assert(e <= TOL_EXP, "swiglu_oai edge %d: relative error %g > %g", edge, e, TOL_EXP);
        jlm_vk_buf_free(vk, ba);
        jlm_vk_buf_free(vk, bb);
        jlm_vk_buf_free(vk, bo);
    }
    free(a), free(b), free(c);
    jlm_vk_close(vk);
}

/* A scale by a scalar (Llama 4's routed expert input, its no-RoPE layers'
 * attention temperature) is one correctly rounded f32 product: bit for bit
 * jlm_k_scale's, in place, NaN and Inf included. */
Test(vulkan, scale_is_bit_identical_to_the_cpu)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 19;
    uint32_t n = 1031;
    float *a = malloc(n * 4), *c = malloc(n * 4);
    static const float S[] = {0.73105857f, 1.0f, -3.5f, 1e-30f};
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        rand_vec(a, n, 100.0f, 1, &seed);
        a[3] = NAN, a[4] = INFINITY, a[5] = 3e38f;
        jlm_k_scale(c, a, S[i], n);
        jlm_vk_buf *ba = up(vk, a, n * 4);
        jlm_err err = {0};
        cr_assert(jlm_vk_scale(vk, whole(ba), whole(ba), S[i], n, &err) == 0, "%s", err.msg);
        const float *g = fmap(ba);
        for (uint32_t j = 0; j < n; j++)
            cr_assert(same(g[j], c[j]), "scale %g [%u]: vulkan %g cpu %g", S[i], j, g[j], c[j]);
        jlm_vk_buf_free(vk, ba);
    }
    free(a), free(c);
    jlm_vk_close(vk);
}

/* Layer norm: the error of the f32 mean reaches every element alike, so it
 * is measured against the row's largest |out| (normwise), TOL_NORM. Inputs
 * sit on an offset of 2 (a mean to subtract) with spread 1. */
Test(vulkan, layernorm_matches_the_cpu_within_TOL_NORM)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 19;
    static const uint32_t NS[] = {1, 37, 256, 1031, 4096};
    for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++)
        for (int wb = 0; wb < 4; wb++) {
            uint32_t n = NS[ni];
            float *x = malloc(n * 4), *w = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
            for (uint32_t i = 0; i < n; i++) {
                x[i] = 2.0f + rng_unit(&seed);
                w[i] = 1.0f + 0.5f * rng_unit(&seed);
                b[i] = 0.25f * rng_unit(&seed);
            }
            int hw = wb & 1, hb = (wb >> 1) & 1;
            jlm_k_layernorm(c, x, hw ? w : NULL, hb ? b : NULL, n, 1e-5f);
            jlm_vk_buf *bx = up(vk, x, n * 4), *bw = up(vk, w, n * 4), *bbb = up(vk, b, n * 4), *bo = up(vk, c, n * 4);
            memset(jlm_vk_buf_map(bo), 0xff, n * 4);
            jlm_err err = {0};
            cr_assert(jlm_vk_layernorm(vk, whole(bo), whole(bx), hw ? whole(bw) : (jlm_vk_view){0},
                                       hb ? whole(bbb) : (jlm_vk_view){0}, n, 1e-5f, &err) == 0, "%s", err.msg);
            const float *g = fmap(bo);
            double mx = 1e-30, e = 0.0;
            for (uint32_t i = 0; i < n; i++)
                mx = fabs(c[i]) > mx ? fabs(c[i]) : mx;
            for (uint32_t i = 0; i < n; i++) {
                cr_assert(isfinite(g[i]), "layernorm n %u [%u]: %g", n, i, g[i]);
                double ei = fabs((double)g[i] - c[i]) / mx;
                e = ei > e ? ei : e;
            }
            cr_assert(e <= TOL_NORM, "layernorm n %u w %d b %d: error %g of max |out| > %g", n, hw, hb, e, TOL_NORM);
            jlm_vk_buf_free(vk, bx), jlm_vk_buf_free(vk, bw), jlm_vk_buf_free(vk, bbb), jlm_vk_buf_free(vk, bo);
            free(x), free(w), free(b), free(c);
        }
    jlm_vk_close(vk);
}

/* The router: logits a shuffled ladder (steps of 0.05, so no two experts are
 * within exp's error of each other) plus noise under a quarter step: the
 * picks must equal the CPU's exactly, in order; the weights within TOL_EXP
 * (exp, the f32 tree sum, the division). Every mode, with and without a
 * scale, from 8 to 1024 experts. */
Test(vulkan, moe_route_picks_the_cpus_experts_with_weights_within_TOL_EXP)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 23;
    static const uint32_t NE[] = {8, 32, 60, 128, 1024}, NU[] = {1, 2, 4, 8};
    float *lg = malloc(1024 * 4);
    for (size_t a = 0; a < sizeof NE / sizeof NE[0]; a++)
        for (size_t u = 0; u < sizeof NU / sizeof NU[0]; u++)
            for (int mode = JLM_K_ROUTE_NORM; mode <= JLM_K_ROUTE_OAI; mode++)
                for (int sc = 0; sc < 2; sc++) {
                    uint32_t ne = NE[a], nu = NU[u];
                    for (uint32_t i = 0; i < ne; i++)
                        lg[i] = 0.05f * (float)i - 0.025f * ne;
                    for (uint32_t i = ne - 1; i > 0; i--) {   /* Fisher-Yates */
                        uint32_t j = (uint32_t)(rng_next(&seed) % (i + 1));
                        float t = lg[i];
                        lg[i] = lg[j], lg[j] = t;
                    }
                    for (uint32_t i = 0; i < ne; i++)
                        lg[i] += 0.01f * rng_unit(&seed);
                    float scale = sc ? 2.5f : 0.0f, wc[8], *wg;
                    int32_t selc[8];
                    jlm_k_moe_route(lg, ne, nu, mode, scale, selc, wc);
                    jlm_vk_buf *bl = up(vk, lg, ne * 4), *bs = up(vk, selc, 8 * 4), *bw = up(vk, wc, 8 * 4);
                    memset(jlm_vk_buf_map(bs), 0xff, 32);
                    memset(jlm_vk_buf_map(bw), 0xff, 32);
                    jlm_err err = {0};
                    cr_assert(jlm_vk_moe_route(vk, whole(bl), ne, nu, mode, scale, whole(bs), whole(bw), &err) == 0, "%s",
                              err.msg);
                    const int32_t *sg = jlm_vk_buf_map(bs);
                    wg = jlm_vk_buf_map(bw);
                    for (uint32_t s = 0; s < nu; s++) {
                        cr_assert_eq(sg[s], selc[s], "route %u of %u mode %d: pick %u: vulkan %d cpu %d", nu, ne, mode, s,
                                     sg[s], selc[s]);
                        double e = fabs((double)wg[s] - wc[s]) / (fabs((double)wc[s]) + 1e-6);
                        cr_assert(e <= TOL_EXP, "route %u of %u mode %d scale %g: weight %u: vulkan %.9g cpu %.9g", nu,
                                  ne, mode, scale, s, wg[s], wc[s]);
                    }
                    jlm_vk_buf_free(vk, bl), jlm_vk_buf_free(vk, bs), jlm_vk_buf_free(vk, bw);
                }
    cr_assert(jlm_vk_moe_route(vk, (jlm_vk_view){0}, 1025, 2, 0, 0, (jlm_vk_view){0}, (jlm_vk_view){0}, NULL) ==
              JLM_EINVAL, "1025 experts must be refused");
    free(lg);
    jlm_vk_close(vk);
}

/* The experts' mixture: the same products and sums in the same order as
 * jlm_k_moe_combine (and moe_token), so bit for bit, NaN and Inf included. */
Test(vulkan, moe_combine_is_bit_identical_to_the_cpu)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 29;
    uint32_t n = 1031;
    for (uint32_t nu = 1; nu <= 8; nu++) {
        float *x = malloc(n * 4), *ys = malloc((size_t)nu * n * 4), *c = malloc(n * 4), w[8];
        const float *yp[8];
        rand_vec(x, n, 3.0f, nu == 3, &seed);
        rand_vec(ys, (uint64_t)nu * n, 1e4f, nu == 5, &seed);
        for (uint32_t s = 0; s < nu; s++) {
            w[s] = (rng_unit(&seed) + 1.0f) / (float)nu;
            yp[s] = ys + (size_t)s * n;
        }
        memcpy(c, x, n * 4);
        jlm_k_moe_combine(c, yp, w, nu, n);
        jlm_vk_buf *bx = up(vk, x, n * 4), *by = up(vk, ys, (uint64_t)nu * n * 4), *bw = up(vk, w, nu * 4);
        jlm_vk_buf *bo = up(vk, x, n * 4);
        memset(jlm_vk_buf_map(bo), 0xff, n * 4);
        jlm_err err = {0};
        cr_assert(jlm_vk_moe_combine(vk, whole(bo), whole(bx), whole(by), whole(bw), nu, n, &err) == 0, "%s", err.msg);
        const float *g = fmap(bo);
        for (uint32_t i = 0; i < n; i++)
            cr_assert(same(g[i], c[i]), "combine of %u [%u]: vulkan %.9g cpu %.9g", nu, i, g[i], c[i]);
        jlm_vk_buf_free(vk, bx), jlm_vk_buf_free(vk, by), jlm_vk_buf_free(vk, bw), jlm_vk_buf_free(vk, bo);
        free(x), free(ys), free(c);
    }
    jlm_vk_close(vk);
}

/* A batch's rows in one dispatch (a MoE prefill, exec_vk_moe.c): the
 * router over rows gives each row what a call of its own gives (picks and
 * weights bit for bit), the mixture over rows each row's CPU sum bit for
 * bit, and jlm_vk_copy_index gathers and puts back rows by index. */
Test(vulkan, moe_route_and_combine_over_rows_are_each_rows_own)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 31;
    enum { R = 5, NE = 60, NU = 4, N = 257 };
    float lg[R * NE], wone[NU], x[R * N], ys[R * NU * N], w[R * NU], c[N];
    for (uint32_t i = 0; i < R * NE; i++)
        lg[i] = 4.0f * rng_unit(&seed);
    jlm_err err = {0};
    jlm_vk_buf *bl = up(vk, lg, sizeof lg), *bs = up(vk, lg, R * NU * 4), *bw = up(vk, lg, R * NU * 4);
    jlm_vk_buf *b1s = up(vk, lg, NU * 4), *b1w = up(vk, lg, NU * 4);
    for (int mode = JLM_K_ROUTE_NORM; mode <= JLM_K_ROUTE_OAI; mode++) {
        cr_assert(jlm_vk_moe_route_rows(vk, whole(bl), NE, NU, mode, 2.5f, R, whole(bs), whole(bw), &err) == 0, "%s",
                  err.msg);
        for (uint32_t r = 0; r < R; r++) {
            cr_assert(jlm_vk_moe_route(vk, (jlm_vk_view){bl, r * NE * 4, NE * 4}, NE, NU, mode, 2.5f, whole(b1s),
                                       whole(b1w), &err) == 0, "%s", err.msg);
            memcpy(wone, fmap(b1w), sizeof wone);
            cr_assert(!memcmp((const int32_t *)jlm_vk_buf_map(bs) + r * NU, jlm_vk_buf_map(b1s), NU * 4) &&
                      !memcmp(fmap(bw) + r * NU, wone, sizeof wone), "mode %d: row %u's picks or weights differ", mode, r);
        }
    }
    cr_assert(jlm_vk_moe_route_rows(vk, whole(bl), NE, NU, 0, 0, 0, whole(bs), whole(bw), NULL) == JLM_EINVAL,
              "no rows must be refused");
    rand_vec(x, R * N, 3.0f, 0, &seed);
    rand_vec(ys, R * NU * N, 1e4f, 0, &seed);
    for (uint32_t i = 0; i < R * NU; i++)
        w[i] = rng_unit(&seed) + 1.0f;
    jlm_vk_buf *bx = up(vk, x, sizeof x), *by = up(vk, ys, sizeof ys), *bcw = up(vk, w, sizeof w);
    cr_assert(jlm_vk_moe_combine_rows(vk, whole(bx), whole(bx), whole(by), whole(bcw), NU, N, R, &err) == 0, "%s",
              err.msg);
    for (uint32_t r = 0; r < R; r++) {
        const float *yp[NU];
        for (uint32_t s = 0; s < NU; s++)
            yp[s] = ys + ((uint64_t)r * NU + s) * N;
        memcpy(c, x + r * N, sizeof c);
        jlm_k_moe_combine(c, yp, w + r * NU, NU, N);
        for (uint32_t i = 0; i < N; i++)
            cr_assert(same(fmap(bx)[r * N + i], c[i]), "combine row %u [%u]: vulkan %.9g cpu %.9g", r, i,
                      fmap(bx)[r * N + i], c[i]);
    }
    /* rows 4, 0, 2 of x gathered to 0, 1, 2 of ys, then back to rows 1, 3, 0 */
    static const uint32_t SI[3] = {4, 0, 2}, DI[3] = {1, 3, 0};
    float row[3][N];
    for (int i = 0; i < 3; i++)
        memcpy(row[i], fmap(bx) + SI[i] * N, N * 4);
    cr_assert(jlm_vk_copy_index(vk, whole(by), NULL, whole(bx), SI, N * 4, 3, &err) == 0, "%s", err.msg);
    cr_assert(jlm_vk_copy_index(vk, whole(bx), DI, whole(by), NULL, N * 4, 3, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 3; i++)
        cr_assert(!memcmp(fmap(by) + i * N, row[i], N * 4) && !memcmp(fmap(bx) + DI[i] * N, row[i], N * 4),
                  "copy_index row %d", i);
    static const uint32_t FAR[1] = {R * NU};
    cr_assert(jlm_vk_copy_index(vk, whole(bx), FAR, whole(by), NULL, N * 4, 1, NULL) == JLM_EINVAL,
              "a row past its buffer must be refused");
    jlm_vk_buf *all[] = {bl, bs, bw, b1s, b1w, bx, by, bcw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        jlm_vk_buf_free(vk, all[i]);
    jlm_vk_close(vk);
}

Test(vulkan, rope_is_bit_identical_to_the_cpu_normal_neox_and_yarn)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 14;
    static const int64_t POS[] = {0, 1, 17, 4095, 100000};
    for (int mode = 0; mode < 3; mode++)
        for (size_t i = 0; i < sizeof POS / sizeof POS[0]; i++) {
            uint32_t n_head = 5, head_dim = 64, n_rot = mode == 2 ? 64 : 48;   /* partial rotation */
            jlm_k_rope p;
            jlm_k_rope_defaults(&p, n_rot, 10000.0f);
            p.neox = mode >= 1;
            if (mode == 2) {                           /* YaRN */
                p.freq_scale = 0.25f;
                p.ext_factor = 1.0f;
                p.orig_ctx = 4096;
            }
            float *x = malloc(n_head * head_dim * 4), *c = malloc(n_head * head_dim * 4);
            rand_vec(x, n_head * head_dim, 10.0f, 0, &seed);
            memcpy(c, x, n_head * head_dim * 4);
            jlm_k_rope_apply(&p, c, n_head, head_dim, POS[i]);
            jlm_vk_buf *bx = up(vk, x, n_head * head_dim * 4);
            jlm_err err = {0};
            cr_assert(jlm_vk_rope(vk, &p, whole(bx), n_head, head_dim, POS[i], &err) == 0, "%s", err.msg);
            const float *g = fmap(bx);
            for (uint32_t j = 0; j < n_head * head_dim; j++)
                cr_assert(same(g[j], c[j]), "mode %d pos %lld [%u]: vulkan %.9g cpu %.9g", mode,
                          (long long)POS[i], j, g[j], c[j]);
            jlm_vk_buf_free(vk, bx);
            free(x);
            free(c);
        }
    jlm_vk_close(vk);
}

/* The cache as the device holds it (kvt: 0 f32, 1 halves, 2 Q8_0 rows of
 * stride elements, after pad positions of 0x5a bytes), x then the values the
 * CPU widens from it (jlm_kv_get_row); its bytes from position pad on. */
static uint8_t *cache_of(int kvt, float *x, uint64_t n_kv, uint64_t stride, uint64_t pad, uint64_t *row)
{
    *row = jlm_kv_row_bytes(kvt, (uint32_t)stride);
    uint8_t *c = malloc((n_kv + pad) * *row + 4);
    memset(c, 0x5a, (n_kv + pad) * *row + 4);
    for (uint64_t j = 0; j < n_kv; j++) {
        jlm_kv_put_row(kvt, c + (pad + j) * *row, x + j * stride, (uint32_t)stride);
        jlm_kv_get_row(kvt, c + (pad + j) * *row, x + j * stride, (uint32_t)stride);
    }
    return c;
}

/* One attention case: n_head query heads over n_kv_head kv heads. kvt: k
 * and v on the device as floats (jlm_vk_attention), halves (the F16 cache)
 * or Q8_0 blocks (the Q8_0 cache, its view starting a position in, at an
 * offset no binding could start at: jlm_vk_attention_kv), the CPU attending
 * the same values widened. */
static void check_attention(jlm_vk *vk, uint32_t n_head, uint32_t n_kv_head, uint32_t hd, uint64_t n_kv,
                            int flavour, int kvt, uint64_t *seed)
{
    int vt = kvt >> 2;   /* 4 + vt: keys kvt & 3, values vt */
    kvt = vt ? kvt & 3 : kvt;
    vt = vt ? vt - 1 : kvt;
    uint64_t stride = (uint64_t)n_kv_head * hd, pad = kvt == 2 || vt == 2, row, vrow;
    float *q = malloc(n_head * hd * 4), *k = malloc(n_kv * stride * 4), *v = malloc(n_kv * stride * 4);
    float *mask = malloc(n_kv * 4), *sinks = malloc(n_head * 4), *c = malloc(n_head * hd * 4);
    float *pc = malloc(n_head * n_kv * 4);
    rand_vec(q, n_head * hd, 2.0f, 0, seed);
    rand_vec(k, n_kv * stride, 2.0f, 0, seed);
    rand_vec(v, n_kv * stride, 3.0f, 0, seed);
    for (uint64_t j = 0; j < n_kv; j++)                /* flavour 1: a sliding window; 3: all masked */
        mask[j] = (flavour == 1 && j + 4 < n_kv) || flavour == 3 ? -INFINITY : 0.0f;
    for (uint32_t h = 0; h < n_head; h++)
        sinks[h] = rng_unit(seed) * 3.0f;
    uint8_t *kh = cache_of(kvt, k, n_kv, stride, pad, &row), *vh = cache_of(vt, v, n_kv, stride, pad, &vrow);
    jlm_k_attn p = {.head_dim = hd, .head_dim_v = hd, .k_stride = stride, .v_stride = stride,
                    .scale = 1.0f / sqrtf((float)hd), .softcap = flavour == 2 ? 30.0f : 0.0f,
                    .has_sink = flavour == 2, .mask = flavour == 1 || flavour == 3 ? mask : NULL};
    uint32_t group = n_head / n_kv_head;
    for (uint32_t h = 0; h < n_head; h++) {
        jlm_k_attn ph = p;
        ph.sink = sinks[h];
        jlm_k_attn_head(&ph, q + h * hd, k + (h / group) * hd, v + (h / group) * hd, n_kv,
                        pc + h * n_kv, c + h * hd);
    }
    jlm_vk_buf *bq = up(vk, q, n_head * hd * 4), *bk = up(vk, kh, (n_kv + pad) * row + 4);
    jlm_vk_buf *bv = up(vk, vh, (n_kv + pad) * vrow + 4);
    jlm_vk_buf *bs = up(vk, pc, n_head * n_kv * 4), *bo = up(vk, c, n_head * hd * 4);
    jlm_vk_view kv = {bk, pad * row, n_kv * row}, vv = {bv, pad * vrow, n_kv * vrow};
    cr_assert(kvt < 2 || kv.off % jlm_vk_offset_align(vk), "the Q8_0 case must start off a binding's alignment");
    memset(jlm_vk_buf_map(bo), 0xff, n_head * hd * 4);
    jlm_err err = {0};
    int rc = kvt == 0 && vt == 0 ? jlm_vk_attention(vk, &p, n_head, n_kv_head, whole(bq), kv, vv, n_kv,
                                         flavour == 2 ? sinks : NULL, whole(bs), whole(bo), &err)
                      : jlm_vk_attention_kv(vk, &p, n_head, n_kv_head, whole(bq), kv, kvt, vv, vt, n_kv,
                                            flavour == 2 ? sinks : NULL, whole(bs), whole(bo), &err);
    cr_assert(rc == 0, "%s", err.msg);
    /* output relative to the value scale (3): exp's error spread over a
     * weighted mean of values */
    double e = worst(fmap(bo), c, n_head * hd, 3.0, "attention");
    cr_assert(e <= TOL_EXP, "attention heads %u/%u hd %u n_kv %llu flavour %d cache %d/%d: error %g > %g", n_head,
              n_kv_head, hd, (unsigned long long)n_kv, flavour, kvt, vt, e, TOL_EXP);
    double ep = worst(fmap(bs), pc, n_head * n_kv, 1e-6, "attention probabilities");
    cr_assert(ep <= TOL_EXP, "attention probabilities: error %g > %g", ep, TOL_EXP);
    jlm_vk_buf *all[] = {bq, bk, bv, bs, bo};
    for (size_t i = 0; i < 5; i++)
        jlm_vk_buf_free(vk, all[i]);
    free(q), free(k), free(v), free(mask), free(sinks), free(c), free(pc), free(kh), free(vh);
}

Test(vulkan, attention_with_gqa_matches_the_cpu_within_TOL_EXP)
{
    jlm_vk *vk = open_or_skip();
    uint64_t seed = 15;
    /* 4 to 7: the same over an F16 cache, 8 to 11 over a Q8_0 one; then keys and values of different types
     * (cache 4 + vt: keys f32, f16 or Q8_0, values vt - 1) */
    static const int KVT[] = {0, 1, 2, 1 + 4 * 1, 2 + 4 * 1, 0 + 4 * 2, 2 + 4 * 2, 0 + 4 * 3, 1 + 4 * 3};
    for (int f = 0; f < 4 * (int)(sizeof KVT / sizeof KVT[0]); f++) {
        int kvt = KVT[f / 4], q8 = (kvt & 3) == 2 || kvt >> 2 == 3;
        check_attention(vk, 8, 2, 64, 1, f % 4, kvt, &seed);                /* first token */
        check_attention(vk, 8, 2, 64, 37, f % 4, kvt, &seed);               /* GQA 4:1 */
        check_attention(vk, 6, 6, q8 ? 32 : 48, 300, f % 4, kvt, &seed);   /* MHA, n_kv > 256 lanes */
        check_attention(vk, 4, 1, q8 ? 96 : 16, 5, f % 4, kvt, &seed);     /* MQA (Q8_0: odd blocks a row) */
    }
    jlm_vk_close(vk);
}

/* The Q8_0 cache's rows, bit for bit with the CPU's (jlm_kv_put_row): rows
 * of 3 blocks (102 bytes: most start and end inside a word, the neighbour's
 * bytes kept) written one dispatch each, out of order, over
 * 0x5a bytes, and one dispatch of 1,500 blocks from byte 2; the values: each
 * block's amax times (k + 1/2) / 127 for random k (the rounding's ties, or
 * next to them after 1/d), random spreads from 1e-30 to 1e30, zero blocks,
 * a single non-zero, negative maxima. */
Test(vulkan, q8_0_cache_rows_are_bit_identical_to_the_cpus)
{
    jlm_vk *vk = open_or_skip();
    if (!jlm_vk_can_quantize(vk)) {
        jlm_vk_close(vk);
        cr_skip_test("vulkan: no shaderFloat64");
    }
    enum { ROWS = 37, N = 96, BIG = 1500 * 32 };
    uint64_t seed = 38, row = jlm_kv_row_bytes(KV_Q8_0, N), bytes = 2 + jlm_kv_row_bytes(KV_Q8_0, BIG) + 4;
    float *x = malloc((uint64_t)BIG * 4);
    for (uint64_t b = 0; b < BIG / 32; b++) {
        float mag = powf(10.0f, rng_unit(&seed) * 30.0f), *xb = x + b * 32;
        int kind = (int)(b % 5);
        for (int i = 0; i < 32; i++)
            xb[i] = kind == 3 ? 0.0f : rng_unit(&seed) * mag;
        if (kind == 4)
            for (int i = 0; i < 32; i++)
                xb[i] = i == (int)(b % 32) ? -mag : 0.0f;
        if (kind <= 1) {   /* ties of round(x * 127 / amax) */
            xb[0] = kind ? -mag : mag;
            for (int i = 1; i < 32; i++)
                xb[i] = mag * ((float)(int)(rng_unit(&seed) * 126.0f) + 0.5f) / 127.0f;
        }
    }
    uint8_t *want = malloc(bytes);
    jlm_vk_buf *bx = up(vk, x, (uint64_t)BIG * 4), *bc = NULL;
    jlm_err err = {0};
    cr_assert(jlm_vk_buf_new(vk, bytes, &bc, &err) == 0, "%s", err.msg);
    for (int pass = 0; pass < 2; pass++) {
        memset(want, 0x5a, bytes);
        memset(jlm_vk_buf_map(bc), 0x5a, bytes);
        for (uint64_t r = 0; r < ROWS; r++) {
            uint64_t p = pass ? 0 : (r * 7) % ROWS;   /* pass 0: every row, out of order; pass 1: one dispatch */
            if (pass && r)
                break;
            uint64_t off = pass ? 2 : p * row;
            uint32_t n = pass ? BIG : N;
            jlm_kv_put_row(KV_Q8_0, want + off, x + p * N, n);
            cr_assert(jlm_vk_kv_q8(vk, (jlm_vk_view){bc, off, jlm_kv_row_bytes(KV_Q8_0, n)},
                                   (jlm_vk_view){bx, p * N * 4, n * 4ull}, n, &err) == 0, "%s", err.msg);
        }
        const uint8_t *got = jlm_vk_buf_map(bc);
        for (uint64_t i = 0; i < bytes; i++)
            cr_assert_eq(got[i], want[i], "pass %d: byte %llu (block %llu): 0x%02x, the CPU's 0x%02x", pass,
                         (unsigned long long)i, (unsigned long long)(i - (pass ? 2 : 0)) / 34, got[i], want[i]);
    }
    cr_assert(jlm_vk_kv_q8(vk, (jlm_vk_view){bc, 0, 33}, (jlm_vk_view){bx, 0, 32 * 4}, 32, &err) == JLM_EINVAL);
    cr_assert(jlm_vk_kv_q8(vk, (jlm_vk_view){bc, 0, 34}, (jlm_vk_view){bx, 0, 16 * 4}, 16, &err) == JLM_EINVAL);
    jlm_vk_buf_free(vk, bx);
    jlm_vk_buf_free(vk, bc);
    free(x);
    free(want);
    jlm_vk_close(vk);
}

/* gemma3's gate (GELU through ggml's fp16 table, times up) and the F16
 * cache's rounding, bit for bit: every half's value as a gate, values
 * between halves (ties to even included), +-10 and their neighbours, NaN,
 * Inf; the rounding over random bit patterns of every exponent, the
 * denormal-half range and its ties, overflow to Inf and NaN payloads. */
Test(vulkan, geglu_fp16_and_f16_rows_are_bit_identical_to_the_cpu)
{
    jlm_vk *vk = open_or_skip();
    enum { N = 65536 + 4096 };
    float *g = malloc(N * 4), *u = malloc(N * 4), *c = malloc(N * 4);
    uint64_t seed = 38;
    for (uint32_t i = 0; i < 65536; i++)
        g[i] = jlm_k_fp16_to_f32((uint16_t)i);
    static const float EDGE[] = {10.0f, -10.0f, 9.999999f, -9.999999f, 10.000001f, -10.000001f, 1.0f + 0x1p-11f,
                                 1.0f + 3 * 0x1p-11f, 0x1p-25f, 0x1.8p-25f, 65520.0f, 65519.99f, INFINITY, -INFINITY};
    for (uint32_t i = 65536; i < N; i++) {
        uint32_t j = i - 65536;
        g[i] = j < sizeof EDGE / sizeof EDGE[0] ? EDGE[j] : j < 64 ? NAN : rng_unit(&seed) * 12.0f;
    }
    for (uint32_t i = 0; i < N; i++)
        u[i] = rng_unit(&seed) * 3.0f;
    jlm_k_gelu_fp16(c, g, N);
    jlm_k_mul(c, c, u, N);
    jlm_vk_buf *bg = up(vk, g, N * 4), *bu = up(vk, u, N * 4), *bo = up(vk, c, N * 4);
    memset(jlm_vk_buf_map(bo), 0xff, N * 4);
    jlm_err err = {0};
    cr_assert(jlm_vk_geglu_fp16(vk, whole(bo), whole(bg), whole(bu), N, &err) == 0, "%s", err.msg);
    for (uint32_t i = 0; i < N; i++)
        cr_assert(same(fmap(bo)[i], c[i]), "geglu_fp16 of %a (up %a): %a, the CPU's %a", g[i], u[i], fmap(bo)[i],
                  c[i]);
    /* the rounding: bit patterns */
    uint32_t *bits = (uint32_t *)g;
    for (uint32_t i = 0; i < N; i++) {
        uint64_t r = rng_next(&seed);
        bits[i] = i < 4096 ? (uint32_t)(0x33000000u + i * 0x1000u + (i % 3 ? 0 : 0x800u))   /* denormal halves, ties */
                  : i < 8192 ? (uint32_t)(0x477fe000u + (i - 4096) * 8u)                       /* near 65520 */
                             : (uint32_t)r;
    }
    jlm_vk_buf_free(vk, bg);
    bg = up(vk, g, N * 4);
    memset(jlm_vk_buf_map(bo), 0xff, N * 2);
    cr_assert(jlm_vk_to_f16(vk, whole(bo), whole(bg), N, &err) == 0, "%s", err.msg);
    const uint16_t *h = jlm_vk_buf_map(bo);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(h[i], jlm_k_f32_to_fp16(g[i]), "f16 of 0x%08x: 0x%04x, the CPU's 0x%04x", bits[i], h[i],
                     jlm_k_f32_to_fp16(g[i]));
    cr_assert(jlm_vk_to_f16(vk, whole(bo), whole(bg), 3, &err) == JLM_EINVAL);
    jlm_vk_buf_free(vk, bg);
    jlm_vk_buf_free(vk, bu);
    jlm_vk_buf_free(vk, bo);
    free(g), free(u), free(c);
    jlm_vk_close(vk);
}

/* ---------------------------------------------------------------- engine: --backend vulkan */

/* An engine on the named backend ("cpu" or "vulkan"); NULL (test skipped by
 * the caller) when Vulkan has no device. Device "0": the first one,
 * lavapipe included. */
static jlm_engine *engine_on(const char *path, const char *backend, uint32_t gpu_layers)
{
    return bm_engine_kv(path, backend, gpu_layers, NULL);
}

Test(vulkan, backend_vulkan_gives_llama_cpp_ids_on_stories260K, .timeout = 60)
{
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *path = tu_convert("stories260K.gguf", dir, "s.jlm", &err);
    cr_assert(path, "%s", err.msg);
    jlm_engine *e = engine_on(path, "vulkan", 0);
    if (!e) {
        tu_rmrf(dir);
        cr_skip_test("vulkan: no device");
    }
    char ref[1024];
    snprintf(ref, sizeof ref, "%s/tests/reference/oracle-stories260K.exact.json", tu_root());
    json_t *o = json_load_file(ref, 0, NULL), *runs = json_object_get(o, "runs");
    cr_assert(o && json_array_size(runs) > 0, "%s", ref);
    float *first = malloc(jlm_engine_n_vocab(e) * sizeof *first);
    for (size_t r = 0; r < json_array_size(runs); r++) {
        json_t *run = json_array_get(runs, r), *jp = json_object_get(run, "prompt_ids"),
               *jg = json_object_get(run, "generated_ids");
        int32_t p[64], got[64];
        size_t np = json_array_size(jp), ng = json_array_size(jg);
        cr_assert(np <= 64 && ng <= 64);
        for (size_t i = 0; i < np; i++)
            p[i] = (int32_t)json_integer_value(json_array_get(jp, i));
        jlm_engine_rewind(e, 0);
        bm_greedy_ids(e, p, np, (int)ng, got, first);
        for (size_t i = 0; i < ng; i++)
            cr_assert_eq(got[i], json_integer_value(json_array_get(jg, i)), "run %zu: id %zu is %d, llama.cpp %lld",
                         r, i, got[i], (long long)json_integer_value(json_array_get(jg, i)));
    }
    uint64_t mm, up;
    jlm_engine_dev_counters(e, &mm, &up);
    jlm_dev_stats vs;
    jlm_engine_dev_stats(e, &vs);
    cr_assert(mm > 0 && vs.page_ins > 0, "the matmuls ran on Vulkan (%llu, %llu page-ins)", (unsigned long long)mm,
              (unsigned long long)vs.page_ins);
    free(first);
    json_decref(o);
    jlm_engine_close(e);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* Quantized models: the Vulkan matvec is bit-identical to the CPU kernels
 * (all variants equal the reference for quantized types), so the logits are
 * bit-identical too, and so are the ids. */
Test(vulkan, backend_vulkan_equals_the_cpu_bit_for_bit_on_quantized_models, .timeout = 60)
{
    setenv("JLM_VK_BLOCKS", "0", 1);   /* the matmul offload (whole blocks: whole_blocks_*) */
    static const char *MODELS[] = {"synth-llama-256.Q4_K_M", "synth-llama-256.MXFP4", "synth-llama-256.Q8_0"};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < 3; m++) {
        char gguf[256];
        jlm_err err = {0};
        snprintf(gguf, sizeof gguf, "%s.gguf", MODELS[m]);
        char *path = tu_convert(gguf, dir, "q.jlm", &err);
        cr_assert(path, "%s", err.msg);
        jlm_engine *ec = engine_on(path, "cpu", 0), *ev = engine_on(path, "vulkan", 0);
        jlm_engine *es = engine_on(path, "vulkan", 1);   /* split: block 0 on Vulkan, the rest on the CPU */
        if (!ev || !es) {
            tu_rmrf(dir);
            cr_skip_test("vulkan: no device");
        }
        uint32_t nv = jlm_engine_n_vocab(ec);
        float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
        int32_t prompt[5] = {1, 10, 20, 30, 40}, ic[8], iv[8];
        bm_greedy_ids(ec, prompt, 5, 8, ic, lc);
        bm_greedy_ids(ev, prompt, 5, 8, iv, lv);
        cr_assert(!memcmp(lc, lv, nv * 4), "%s: logits after the prompt differ", MODELS[m]);
        cr_assert(!memcmp(ic, iv, sizeof ic), "%s: greedy ids differ", MODELS[m]);
        bm_greedy_ids(es, prompt, 5, 8, iv, lv);
        cr_assert(!memcmp(lc, lv, nv * 4), "%s --gpu-layers 1: logits after the prompt differ", MODELS[m]);
        cr_assert(!memcmp(ic, iv, sizeof ic), "%s --gpu-layers 1: greedy ids differ", MODELS[m]);
        uint64_t mm, up, mm_split;
        jlm_engine_dev_counters(es, &mm_split, &up);
        jlm_engine_dev_counters(ev, &mm, &up);
        cr_assert(mm > 0, "%s: the matmuls ran on Vulkan", MODELS[m]);
        cr_assert(mm_split > 0 && mm_split < mm, "%s: the split ran part of the matmuls on Vulkan (%llu of %llu)",
                  MODELS[m], (unsigned long long)mm_split, (unsigned long long)mm);
        jlm_engine_dev_counters(ec, &mm, &up);
        cr_assert(mm == 0, "%s: the CPU engine ran no Vulkan matmul", MODELS[m]);
        free(lc);
        free(lv);
        jlm_engine_close(ec);
        jlm_engine_close(ev);
        jlm_engine_close(es);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* Device page frames (backend_vk.h): on both paths (the zero-copy import of
 * the pager's frames, and JLM_VK_UPLOAD=1's staging upload) the logits are
 * bit-identical to the CPU backend's; unlimited, a page is paged in to the
 * device once and hit after; at --budget 1 --gpu-budget 1 (one frame each
 * side, raised to the minimum) the ids are the same with evictions counted on
 * both. A dense model and an MoE model (expert pages follow their block). */
static jlm_engine *engine_opts(const char *path, const char *backend, uint64_t budget, uint64_t gpu_budget)
{
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1, .backend = backend, .device = "0",
                         .budget = budget, .gpu_budget = gpu_budget};
    jlm_engine *e = NULL;
    jlm_err err = {0};
    int rc = jlm_engine_open(path, &o, &e, &err);
    if (rc == JLM_EUNSUPPORTED && !strcmp(backend, "vulkan"))
        return NULL;
    cr_assert_eq(rc, 0, "%s", err.msg);
    return e;
}

/* exact: bit-identical; else within 1e-4 of the largest |logit| (F32
 * weights: the CPU's FMA variants vs the reference order on the device). */
static void same_logits(const float *a, const float *b, uint32_t n, int exact, const char *model, const char *what)
{
    if (exact) {
        cr_assert(!memcmp(a, b, n * 4), "%s (%s): logits differ", model, what);
        return;
    }
    float mx = 0, d = 0;
    for (uint32_t i = 0; i < n; i++) {
        mx = fmaxf(mx, fabsf(a[i]));
        d = fmaxf(d, fabsf(a[i] - b[i]));
    }
    cr_assert(d <= 1e-4f * mx, "%s (%s): logits differ by %g (largest %g)", model, what, d, mx);
}

Test(vulkan, device_frames_import_and_upload_paths_equal_the_cpu_and_page_in_once, .timeout = 120)
{
    setenv("JLM_VK_BLOCKS", "0", 1);   /* the matmul offload (whole blocks: whole_blocks_*) */
    static const char *MODELS[] = {"synth-llama-256.Q4_K_M", "synth-qwen3moe-256.Q8_0"};
    static const int exact[] = {1, 0};   /* qwen3moe's router is F32: the CPU's F32 kernel uses FMA */
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < 2; m++) {
        char gguf[256];
        jlm_err err = {0};
        snprintf(gguf, sizeof gguf, "%s.gguf", MODELS[m]);
        char *path = tu_convert(gguf, dir, "q.jlm", &err);
        cr_assert(path, "%s", err.msg);
        jlm_engine *ec = engine_opts(path, "cpu", 0, 0);
        uint32_t nv = jlm_engine_n_vocab(ec), nl = jlm_engine_model(ec)->config.n_layer;
        float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
        int32_t prompt[4] = {1, 10, 20, 30}, ic[6], iv[6];
        bm_greedy_ids(ec, prompt, 4, 6, ic, lc);
        for (int path_i = 0; path_i < 2; path_i++) {
            if (path_i)
                setenv("JLM_VK_UPLOAD", "1", 1);
            else
                unsetenv("JLM_VK_UPLOAD");
            const char *want = path_i ? "upload" : "import";
            jlm_engine *ev = engine_opts(path, "vulkan", 0, 0);
            if (!ev) {
                tu_rmrf(dir);
                cr_skip_test("vulkan: no device");
            }
            jlm_dev_stats vs;
            jlm_engine_dev_stats(ev, &vs);
            if (!path_i && strcmp(vs.path, "import")) {   /* a device without the extension */
                jlm_engine_close(ev);
                continue;
            }
            cr_assert_str_eq(vs.path, want, "%s: path", MODELS[m]);
            bm_greedy_ids(ev, prompt, 4, 6, iv, lv);
            same_logits(lc, lv, nv, exact[m], MODELS[m], want);
            cr_assert(!memcmp(ic, iv, sizeof ic), "%s (%s): greedy ids differ", MODELS[m], want);
            jlm_engine_dev_stats(ev, &vs);
            uint64_t pi = vs.page_ins;
            cr_assert(vs.evictions == 0 && pi >= nl, "%s (%s): unlimited: %llu page-ins (>= %u blocks), %llu evictions",
                      MODELS[m], want, (unsigned long long)pi, nl, (unsigned long long)vs.evictions);
            /* MoE: the routed expert pages are device frames too (blocks + dense + at least one expert each) */
            cr_assert(m == 0 || pi >= 2 * nl + 1, "%s (%s): %llu device page-ins for %u blocks: experts not paged in",
                      MODELS[m], want, (unsigned long long)pi, nl);
            cr_assert(path_i ? vs.bytes_up > 0 && vs.bytes_imported == 0 : vs.bytes_imported > 0 && vs.bytes_up == 0,
                      "%s (%s): %llu bytes uploaded, %llu imported", MODELS[m], want,
                      (unsigned long long)vs.bytes_up, (unsigned long long)vs.bytes_imported);
            /* resident pages are not paged in again */
            jlm_err e2 = {0};
            int32_t t = 5;
            uint64_t hits = vs.hits;
            cr_assert_eq(jlm_engine_eval(ev, &t, 1, lv, &e2), 0, "%s", e2.msg);
            jlm_engine_dev_stats(ev, &vs);
            cr_assert(vs.page_ins == pi && vs.hits >= hits + nl, "%s (%s): a token after: page-ins %llu -> %llu, hits +%llu",
                      MODELS[m], want, (unsigned long long)pi, (unsigned long long)vs.page_ins,
                      (unsigned long long)(vs.hits - hits));
            jlm_engine_close(ev);
            /* one frame on each side */
            ev = engine_opts(path, "vulkan", 1, 1);
            bm_greedy_ids(ev, prompt, 4, 6, iv, lv);
            same_logits(lc, lv, nv, exact[m], MODELS[m], "one frame");
            cr_assert(!memcmp(ic, iv, sizeof ic), "%s (%s, one frame): greedy ids differ", MODELS[m], want);
            jlm_engine_dev_stats(ev, &vs);
            jlm_pager_counters pc;
            jlm_pager_stats(jlm_engine_pager(ev), &pc);
            cr_assert(vs.evictions > 0 && vs.page_ins > 6 * nl && pc.a[JLM_PAGER_TEXT].evictions > 0,
                      "%s (%s, one frame): device page-ins %llu, evictions %llu; host evictions %llu", MODELS[m], want,
                      (unsigned long long)vs.page_ins, (unsigned long long)vs.evictions,
                      (unsigned long long)pc.a[JLM_PAGER_TEXT].evictions);
            cr_assert(vs.peak_bytes <= vs.budget, "%s (%s): device peak %llu over its budget %llu", MODELS[m], want,
                      (unsigned long long)vs.peak_bytes, (unsigned long long)vs.budget);
            jlm_engine_close(ev);
        }
        unsetenv("JLM_VK_UPLOAD");
        free(lc);
        free(lv);
        jlm_engine_close(ec);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* The CLI: a bad --backend is one line and a non-zero exit; --backend vulkan
 * on a device named by JLM_VK_DEVICE reports its matmuls in --stats; auto
 * always runs (on the CPU with a note when there is no GPU). */
Test(vulkan, cli_backend_option, .timeout = 60)
{
    char *dir = tu_tmpdir(), *out = NULL, cmd[2048];
    jlm_err err = {0};
    char *path = tu_convert("stories260K.gguf", dir, "s.jlm", &err);
    cr_assert(path, "%s", err.msg);
    snprintf(cmd, sizeof cmd, "%s run %s -p Once -n 2 --backend bogus", tu_jlm(), path);
    cr_assert_neq(tu_run(cmd, &out), 0);
    cr_assert(strstr(out, "--backend 'bogus': unknown backend: expected cpu, vulkan, cuda or auto") && strchr(out, '\n') == strrchr(out, '\n'),
              "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s -p Once -n 2 --backend auto --print-ids", tu_jlm(), path);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    free(out);
    if (jlm_vk_built()) {
        snprintf(cmd, sizeof cmd, "%s run %s -p Once -n 2 --backend vulkan --device 0 --stats", tu_jlm(), path);
        int rc = tu_run(cmd, &out);
        cr_assert(rc == 0 ? strstr(out, "vulkan: matmuls ") != NULL : strstr(out, "--backend vulkan: ") != NULL,
                  "%s", out);
        free(out);
    }
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* --stats per backend: the first paging line keeps its format and holds the
 * totals (host pager + device frames), then a cpu: and a vulkan: line; the
 * path is import by default and upload with JLM_VK_UPLOAD=1; --gpu-budget 1
 * is raised with a note and evicts. jlm bench -o json carries the same
 * device figures. */
Test(vulkan, stats_report_each_backend_and_the_totals, .timeout = 120)
{
    if (!jlm_vk_built())
        cr_skip_test("built without Vulkan");
    char *dir = tu_tmpdir(), *out = NULL, cmd[2048];
    jlm_err err = {0};
    char *path = tu_convert("synth-llama-256.Q4_K_M.gguf", dir, "q.jlm", &err);
    cr_assert(path, "%s", err.msg);
    for (int up = 0; up < 2; up++) {
        snprintf(cmd, sizeof cmd, "%s%s run %s --ids 1,2,3 -n 3 --backend vulkan --device 0 --stats --budget 1 "
                 "--gpu-budget 1 --seed 1", up ? "JLM_VK_UPLOAD=1 " : "", tu_jlm(), path);
        int rc = tu_run(cmd, &out);
        if (rc && strstr(out, "no device")) {
            free(out);
            break;
        }
        cr_assert_eq(rc, 0, "%s", out);
        const char *pl = strstr(out, "\npager: page-ins "), *cl = strstr(out, "\ncpu: page-ins "),
                   *vl = strstr(out, "\nvulkan: matmuls ");
        cr_assert(pl && cl && vl && pl < cl && cl < vl, "%s", out);
        cr_assert(strstr(out, "--gpu-budget 1 bytes is below the device's minimum working set"), "%s", out);
        cr_assert(strstr(vl, up ? "path upload" : "path import") || (!up && strstr(vl, "path upload")), "%s", vl);
        cr_assert_eq(bm_field(pl, "page-ins "), bm_field(cl, "page-ins ") + bm_field(vl, "page-ins "), "%s", out);
        cr_assert_eq(bm_field(pl, "evictions "), bm_field(cl, "evictions ") + bm_field(vl, "evictions "), "%s", out);
        cr_assert(bm_field(vl, "evictions ") > 0 && bm_field(vl, "frames ") == 1, "%s", vl);
        cr_assert(up ? bm_field(vl, "bytes uploaded ") > 0 : bm_field(vl, "bytes uploaded ") + bm_field(vl, "bytes imported ") > 0,
                  "%s", vl);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "%s bench %s -p 4 -n 2 -r 1 --backend vulkan --device 0 -o json", tu_jlm(), path);
    int rc = tu_run(cmd, &out);
    if (rc == 0) {
        cr_assert(strstr(out, "\"vulkan\"") && strstr(out, "\"kernel_ms\"") && strstr(out, "\"matmuls\""), "%s", out);
    } else {
        cr_assert(strstr(out, "no device"), "%s", out);
    }
    free(out);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* The fingerprint (jlm-format.md 4.7): jlm convert --device records the
 * intended device; a run on another backend prints one note naming both and
 * runs anyway; on the recorded backend there is no note. --device tpu is one
 * line and exit 2. jlm --version and jlm info --json list the backends. */
Test(vulkan, fingerprint_device_is_recorded_compared_and_never_enforced, .timeout = 120)
{
    char *dir = tu_tmpdir(), *out = NULL, cmd[4096], src[1024];
    snprintf(src, sizeof src, "%s/tests/models/synth-llama-256.Q4_K_M.gguf", tu_root());
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s/v.jlm --device vulkan", tu_jlm(), src, dir);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s/v.jlm --ids 1,2 -n 1", tu_jlm(), dir);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    const char *n = strstr(out, "was written for host ");
    cr_assert(n && strstr(n, "device vulkan") && strstr(n, "running on host ") && strstr(n, "device cpu") &&
              strstr(n, "device differs") && !strstr(n + 1, "was written for"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s info %s/v.jlm --json", tu_jlm(), dir);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    cr_assert(strstr(out, "\"device\": \"vulkan\"") && strstr(out, "\"backends\"") && strstr(out, "\"name\": \"vulkan\""),
              "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --version", tu_jlm());
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    cr_assert(strstr(out, "\nvulkan: "), "%s", out);
    free(out);
    if (jlm_vk_built()) {
        snprintf(cmd, sizeof cmd, "%s run %s/v.jlm --ids 1,2 -n 1 --backend vulkan --device 0", tu_jlm(), dir);
        int rc = tu_run(cmd, &out);
        cr_assert(rc == 0 ? !strstr(out, "was written for") : strstr(out, "--backend vulkan: ") != NULL, "%s", out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s/t.jlm --device tpu", tu_jlm(), src, dir);
    cr_assert_eq(tu_run(cmd, &out), 2, "%s", out);
    cr_assert(strstr(out, "--device 'tpu': expected cpu, vulkan or cuda") && strchr(out, '\n') == strrchr(out, '\n'),
              "%s", out);
    free(out);
    tu_rmrf(dir);
    free(dir);
}

/* The matrix: every text model of tests/models (every stored type, every
 * architecture, the four MoE families whose expert pages follow their
 * block's backend), on Vulkan whole and at --gpu-layers 2: against
 * llama.cpp's logits after the oracle's first prompt within the CPU
 * backend's own tolerance (test_engine.c), then against the CPU backend: the same ids fed to both (so one divergence does not cascade),
 * logits within 1e-4 of the largest |logit| after each (quantized matvecs are
 * bit-identical; F32/F16 weights differ in the last bits: the CPU's FMA
 * variants), and the same greedy pick wherever the CPU's top-2 margin is
 * over twice the difference seen. */
Test(vulkan, every_test_model_on_vulkan_whole_split_and_at_one_frame_each_side_matches_the_cpu, .timeout = 300)
{
    bm_every_model_matches_the_cpu("vulkan");
}

/* The engine with bindings lowered to 64 KiB (JLM_VK_MAX_BINDING): the
 * output matrix (512 rows x 256) and larger planes run in k-chunks; the
 * logits stay those of the CPU backend (bit-identical on the Q4_K_M llama,
 * where matmuls whose one super-block exceeds the window fall back to the CPU
 * and are counted; within 1e-4 on qwen3moe Q8_0, every matmul on the device). */
Test(vulkan, engine_with_planes_over_one_binding_equals_the_cpu, .timeout = 120)
{
    setenv("JLM_VK_BLOCKS", "0", 1);   /* the matmul offload (whole blocks: whole_blocks_*) */
    static const char *MODELS[] = {"synth-llama-256.Q4_K_M", "synth-qwen3moe-256.Q8_0"};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < 2; m++) {
        char gguf[256];
        jlm_err err = {0};
        snprintf(gguf, sizeof gguf, "%s.gguf", MODELS[m]);
        char *path = tu_convert(gguf, dir, "q.jlm", &err);
        cr_assert(path, "%s", err.msg);
        jlm_engine *ec = engine_opts(path, "cpu", 0, 0);
        setenv("JLM_VK_MAX_BINDING", "65536", 1);
        jlm_engine *ev = engine_opts(path, "vulkan", 0, 0);
        unsetenv("JLM_VK_MAX_BINDING");
        if (!ev) {
            tu_rmrf(dir);
            cr_skip_test("vulkan: no device");
        }
        uint32_t nv = jlm_engine_n_vocab(ec);
        float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
        int32_t prompt[4] = {1, 10, 20, 30}, ic[5], iv[5];
        bm_greedy_ids(ec, prompt, 4, 5, ic, lc);
        bm_greedy_ids(ev, prompt, 4, 5, iv, lv);
        same_logits(lc, lv, nv, m == 0, MODELS[m], "64 KiB bindings");
        cr_assert(!memcmp(ic, iv, sizeof ic), "%s (64 KiB bindings): greedy ids differ", MODELS[m]);
        jlm_dev_stats vs;
        jlm_engine_dev_stats(ev, &vs);
        cr_assert(vs.matmuls > 0 && (m == 0 || vs.fallbacks == 0), "%s: %llu matmuls on the device, %llu fell back",
                  MODELS[m], (unsigned long long)vs.matmuls, (unsigned long long)vs.fallbacks);
        free(lc);
        free(lv);
        jlm_engine_close(ec);
        jlm_engine_close(ev);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* The fingerprint is untrusted bytes: a host string with a newline and an
 * escape byte still gives one note line (control bytes shown as '?'), and
 * the run goes on. */
Test(vulkan, a_fingerprint_with_control_bytes_is_one_note_line, .timeout = 60)
{
    char *dir = tu_tmpdir(), *out = NULL, cmd[4096], src[1024], path[1100];
    snprintf(src, sizeof src, "%s/tests/models/stories260K.gguf", tu_root());
    snprintf(path, sizeof path, "%s/s.jlm", dir);
    snprintf(cmd, sizeof cmd, "%s convert %s -o %s", tu_jlm(), src, path);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    free(out);
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    uint64_t fp_off = 0;
    cr_assert(fseek(f, 88, SEEK_SET) == 0 && fread(&fp_off, 8, 1, f) == 1);
    uint16_t len = 0;
    cr_assert(fseek(f, (long)fp_off, SEEK_SET) == 0 && fread(&len, 2, 1, f) == 1 && len == 6, "host length %u", len);
    cr_assert(fseek(f, (long)fp_off + 2, SEEK_SET) == 0 && fwrite("x8\n_\0334", 1, 6, f) == 6);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2 -n 1 --no-verify", tu_jlm(), path);   /* the sidecar would refuse the edit */
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    const char *n = strstr(out, "note: ");
    cr_assert(n && strstr(n, "written for host x8?_?4,") && strstr(n, "host differs"), "%s", out);
    const char *nl = strchr(n, '\n');
    cr_assert(nl && strstr(nl, "was written for") == NULL && strstr(n, "running on host") < nl, "%s", out);
    free(out);
    tu_rmrf(dir);
    free(dir);
}

/* --stats' `activations up U, down D` on Vulkan: a decoded token with every
 * block on the device moves each matmul's input rows up and its results
 * down, one upload a matmul (Vulkan has no matmul_multi), counted where the
 * staging copies happen. */
Test(vulkan, activations_up_and_down_are_the_bytes_the_matmuls_copied, .timeout = 120)
{
    setenv("JLM_VK_BLOCKS", "0", 1);   /* the matmul offload (whole blocks: whole_blocks_*) */
    bm_decode_activations("vulkan", "0", 0, 0);
}

/* ---------------------------------------------------------------- whole blocks on the device */

/* jlm_vk_quantize is jlm_k_quantize_act bit for bit: random blocks over 13
 * decades, blocks whose quotients sit on and next to .5 (where a quotient
 * rounded 1 ulp off changes q), zeros, NaN, Inf, an outlier; 4 tokens of
 * 2048 in one dispatch. */
Test(vulkan, quantize_is_bit_identical_to_the_cpu)
{
    jlm_vk *vk = open_or_skip();
    if (!jlm_vk_can_quantize(vk)) {
        jlm_vk_close(vk);
        cr_skip_test("vulkan: the device has no shaderFloat64");
    }
    enum { K = 2048, T = 4, N = K * T };
    float *x = malloc(N * 4);
    uint64_t seed = 7;
    for (uint64_t b = 0; b < N / 32; b++) {
        float *xb = x + 32 * b, mag = powf(10.0f, (float)(b % 13) - 6.0f);
        if (b % 5 == 1) {   /* quotients m + 0.5 (+- an ulp): the rounding of x / d decides q */
            float dv = mag * (0.5f + 0.5f * fabsf(rng_unit(&seed)));
            xb[0] = 127.0f * dv;
            for (int i = 1; i < 32; i++) {
                float v = ((float)(i * 4 % 127) + 0.5f) * dv * (i % 2 ? 1.0f : -1.0f);
                xb[i] = i % 3 == 0 ? v : nextafterf(v, i % 3 == 1 ? INFINITY : -INFINITY);
            }
            continue;
        }
        for (int i = 0; i < 32; i++)
            xb[i] = rng_unit(&seed) * mag;
    }
    memset(x + 32 * 3, 0, 32 * 4);   /* a zero block: d 0 */
    x[32 * 7 + 5] = NAN;
    x[32 * 8 + 9] = INFINITY;
    x[32 * 9 + 2] = -INFINITY;
    x[32 * 10 + 30] = 1e30f;
    jlm_err err = {0};
    jlm_vk_buf *xb = up(vk, x, N * 4), *q = NULL, *d = NULL, *s = NULL;
    cr_assert(!jlm_vk_buf_new(vk, N, &q, &err) && !jlm_vk_buf_new(vk, N / 8, &d, &err) &&
              !jlm_vk_buf_new(vk, N / 8, &s, &err), "%s", err.msg);
    jlm_vk_act va = {K, {q, 0, N}, {d, 0, N / 8}, {s, 0, N / 8}, T};
    cr_assert_eq(jlm_vk_quantize(vk, whole(xb), N, &va, &err), 0, "%s", err.msg);
    void *buf = malloc(jlm_k_act_q8_bytes(K));
    jlm_act_q8 a;
    cr_assert_eq(jlm_k_act_q8_init(&a, buf, K, &err), 0, "%s", err.msg);
    for (int t = 0; t < T; t++) {
        jlm_k_quantize_act(x + (uint64_t)t * K, &a);
        const int8_t *gq = (const int8_t *)jlm_vk_buf_map(q) + (uint64_t)t * K;
        const float *gd = (const float *)jlm_vk_buf_map(d) + (uint64_t)t * K / 32;
        const int16_t *gs = (const int16_t *)jlm_vk_buf_map(s) + (uint64_t)t * K / 16;
        for (int i = 0; i < K; i++)
            cr_assert_eq(gq[i], a.q[i], "token %d, element %d (x %a): q %d, the CPU's %d", t, i, x[t * K + i], gq[i],
                         a.q[i]);
        for (int b = 0; b < K / 32; b++)
            cr_assert(same(gd[b], a.d[b]), "token %d, block %d: d %a, the CPU's %a", t, b, gd[b], a.d[b]);
        cr_assert(!memcmp(gs, a.sum16, K / 16 * 2), "token %d: sum16 differ", t);
    }
    free(buf);
    free(x);
    jlm_vk_buf_free(vk, xb);
    jlm_vk_buf_free(vk, q);
    jlm_vk_buf_free(vk, d);
    jlm_vk_buf_free(vk, s);
    jlm_vk_close(vk);
}

/* Whole blocks on the device (engine/exec_vk.c) give the CPU's ids and
 * logits, whole and at --gpu-layers 2, and a decoded token is one round trip
 * (one command buffer) where the matmul offload (JLM_VK_BLOCKS=0) makes one
 * a matmul: backend_matrix.h's bm_whole_blocks. */
Test(vulkan, whole_blocks_on_the_device_give_the_cpus_ids_in_one_round_trip_a_token, .timeout = 300)
{
    bm_whole_blocks("vulkan");
}

/* A MoE test model converted into dir and run on the CPU: its engine, its
 * path (*path), the greedy ids of the prompt 1,10,20,30,40 (ic, 8) and its
 * expert predictions (pc). */
static const int32_t MOE_PROMPT[5] = {1, 10, 20, 30, 40};

/* The test model `model` (its .gguf) converted into dir/name: the path. */
static char *convert_named(const char *model, const char *dir, const char *name)
{
    char gguf[256];
    jlm_err err = {0};
    snprintf(gguf, sizeof gguf, "%s.gguf", model);
    char *path = tu_convert(gguf, dir, name, &err);
    cr_assert(path, "%s", err.msg);
    return path;
}
static jlm_engine *moe_reference(const char *model, const char *dir, char **path, int32_t ic[8],
                                 jlm_engine_predict *pc)
{
    *path = convert_named(model, dir, "moe.jlm");
    jlm_engine *ec = engine_on(*path, "cpu", 0);
    float *l = malloc(jlm_engine_n_vocab(ec) * 4);
    bm_greedy_ids(ec, MOE_PROMPT, 5, 8, ic, l);
    jlm_engine_predict_stats(ec, pc);
    free(l);
    return ec;
}

/* The MoE model on the device (ev, `what`) against the CPU's ec: the
 * greedy ids ic (if greedy), as many expert predictions as pc (and its hits,
 * if hits), the lockstep logits within tol; then one decoded token in at most
 * max_rt round trips, none refused. Returns that token's activation bytes. */
static uint64_t moe_on_device(jlm_engine *ec, jlm_engine *ev, const int32_t *ic, const jlm_engine_predict *pc,
                              int greedy, int hits, double tol, uint64_t max_rt, const char *model, const char *what)
{
    float *l = malloc(jlm_engine_n_vocab(ev) * 4);
    int32_t iv[8];
    jlm_err err = {0};
    jlm_engine_predict pv;
    bm_greedy_ids(ev, MOE_PROMPT, 5, 8, iv, l);
    cr_assert(!greedy || !memcmp(ic, iv, sizeof iv), "%s (%s): greedy ids differ", model, what);
    jlm_engine_predict_stats(ev, &pv);   /* block 0 predicts block 1's experts on the device as the CPU does */
    cr_assert(pc->predicted > 0 && pv.predicted == pc->predicted && (!hits || pv.hits == pc->hits),
              "%s (%s): predicted %llu, hits %llu; the CPU's %llu, %llu", model, what,
              (unsigned long long)pv.predicted, (unsigned long long)pv.hits, (unsigned long long)pc->predicted,
              (unsigned long long)pc->hits);
    int32_t next = bm_lockstep(ec, ev, MOE_PROMPT, 5, tol, model, what);
    jlm_dev_stats s0, s1;
    jlm_engine_dev_stats(ev, &s0);
    cr_assert_eq(jlm_engine_eval(ev, &next, 1, l, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(ev, &s1);
    cr_assert(s1.waits - s0.waits <= max_rt && s1.fallbacks == s0.fallbacks,
              "%s (%s): a decoded token made %llu round trips (at most %llu)", model, what,
              (unsigned long long)(s1.waits - s0.waits), (unsigned long long)max_rt);
    free(l);
    return s1.act_up - s0.act_up + s1.act_down - s0.act_down;
}

/* Routed experts on the device (engine/exec_vk_moe.c): the llama-style MoE
 * (F16, MXFP4 experts, Q4_K_M), qwen3moe (Q4_K_M, Q8_0; per-head q/k
 * norms) and olmoe (Q4_K_M; q/k norms over the whole projection, raw
 * routing weights), 2 MoE blocks each, whole, at --gpu-layers 2 (the blocks there, the
 * output on the CPU) and 1 (a split inside the model): the CPU's greedy ids,
 * the lockstep logits within the whole-block tolerances (float experts: 5e-4
 * of the largest), and a decoded token at most one round trip a block plus
 * one (each MoE block reads its picks back; the logits or the split's rows
 * come down at the end) where the matmul offload makes several a block; the
 * next block's experts predicted as the CPU predicts them (the counts). At
 * a --budget of half the file (the expert pages evicted and read again,
 * counted) the CPU's ids still. */
Test(vulkan, moe_blocks_on_the_device_give_the_cpus_ids_in_a_round_trip_a_block, .timeout = 300)
{
    static const char *MODELS[] = {"synth-llama-moe-256.F16", "synth-llama-moe-256.MXFP4_MOE",
                                   "synth-llama-moe-256.Q4_K_M", "synth-qwen3moe-256.Q4_K_M",
                                   "synth-qwen3moe-256.Q8_0", "synth-olmoe-256.Q4_K_M"};
    /* olmoe: the matmul offload's greedy run already parts from the CPU's at
     * the 3rd token (a near-tie; its F32 router on the CPU's FMA kernel), so
     * it is held to the lockstep logits only */
    static const int greedy[] = {1, 1, 1, 1, 1, 0};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        char *path;
        int32_t ic[8], iv[8];
        jlm_engine_predict pc_cpu;
        jlm_engine *ec = moe_reference(MODELS[m], dir, &path, ic, &pc_cpu);
        uint32_t nv = jlm_engine_n_vocab(ec), L = jlm_engine_model(ec)->config.n_layer;
        float *lv = malloc(nv * 4);
        static const uint32_t LAYERS[] = {0, 2, 1};
        for (int i = 0; i < 3; i++) {
            jlm_engine *ev = engine_on(path, "vulkan", LAYERS[i]);
            if (!ev) {
                tu_rmrf(dir);
                cr_skip_test("vulkan: no device");
            }
            const char *what = i == 0 ? "whole" : i == 1 ? "--gpu-layers 2" : "--gpu-layers 1";
            moe_on_device(ec, ev, ic, &pc_cpu, greedy[m], greedy[m], m == 0 ? 5e-4 : 0.05,
                          (LAYERS[i] ? LAYERS[i] : L) + 1, MODELS[m], what);
            jlm_engine_close(ev);
        }
        /* experts paged through a budget of half the file, imported and uploaded
         * (an upload inside a recording submits it early) */
        struct stat st;
        cr_assert_eq(stat(path, &st), 0, "%s", path);
        for (int up = 0; up < 2; up++) {
            if (up)
                setenv("JLM_VK_UPLOAD", "1", 1);
            jlm_engine *eb = engine_opts(path, "vulkan", (uint64_t)st.st_size / 2, 0);
            bm_greedy_ids(eb, MOE_PROMPT, 5, 8, iv, lv);
            cr_assert(!greedy[m] || !memcmp(ic, iv, sizeof ic), "%s (budget, %s): greedy ids differ", MODELS[m],
                      up ? "upload" : "import");
            jlm_pager_counters pc;
            jlm_pager_stats(jlm_engine_pager(eb), &pc);
            jlm_dev_stats vs;
            jlm_engine_dev_stats(eb, &vs);
            /* 8 evals: a round trip a block and one more each, and one for each device frame dropped
             * (a frame a recording may read ends it first) */
            cr_assert(pc.a[JLM_PAGER_EXPERTS].evictions > 0 && vs.waits <= 8 * (L + 1) + vs.evictions,
                      "%s (budget, %s): %llu expert evictions, %llu round trips, %llu device evictions", MODELS[m],
                      up ? "upload" : "import",
                      (unsigned long long)pc.a[JLM_PAGER_EXPERTS].evictions, (unsigned long long)vs.waits,
                      (unsigned long long)vs.evictions);
            jlm_engine_close(eb);
            unsetenv("JLM_VK_UPLOAD");
        }
        free(lv);
        jlm_engine_close(ec);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* The read-ahead's gate on the device (exec_vk_moe.c asks the CPU's
 * jlm_stream_predict_now where the CPU asks it): backend_matrix.h's
 * bm_moe_gate, as on CUDA. */
/* A MoE prefill's routed experts grouped by expert on the device
 * (engine/exec_dev.c's jlm_exd_moe_group, exec_vk_moe.c's batch): the
 * CPU's picks and logits, one matmul per used expert and matrix
 * (backend_matrix.h's bm_moe_grouped_prefill). */
Test(vulkan, moe_prefill_groups_the_rows_by_expert, .timeout = 300)
{
    bm_moe_grouped_prefill("vulkan");
}

Test(vulkan, moe_predictions_pass_the_cpus_gate_at_a_small_budget, .timeout = 300)
{
    bm_moe_gate("vulkan");
}

/* Block l of m has a router (a MoE block). */
static int has_router(const jlm_model *m, uint32_t l)
{
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++)
        if (m->tensors[i].block == (int32_t)l && m->tensors[i].role == JLM_R_ROUTER)
            return 1;
    return 0;
}

/* Sigmoid-routed MoE blocks whole on the device (exec_vk_moe.c routes on
 * the host from the logits that come down, jlm_ex_route_pick): glm4moe
 * (the selection bias, renormalised and scaled weights; per-head q/k norms,
 * partial RoPE, a leading dense block, a shared expert narrower than the
 * dense FFN) and Llama 4 (top-1 whose sigmoid scales the routed expert's
 * input, not the shared expert's; RoPE then a weightless q/k norm, a layer
 * without RoPE, dense blocks between), Q8_0 and Q4_K_M, whole and at
 * --gpu-layers 2: the CPU's greedy ids, the lockstep logits within the
 * quantized tolerance, the next block's experts predicted as often as the
 * CPU predicts them (glm4moe: with the CPU's hits); and a decoded token at most a round trip a MoE block
 * plus one (the matmul offload makes one a matmul: 30 to 40 a token) with
 * its activations within its embedding, its logits and 4 KiB. */
/* The sigmoid-routed MoE models' checks (below), whole and at --gpu-layers 2. */
static void sigmoid_moe_whole(const char *const *models, size_t nm)
{
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < nm; m++) {
        char *path;
        int32_t ic[8];
        jlm_engine_predict pc_cpu;
        jlm_engine *ec = moe_reference(models[m], dir, &path, ic, &pc_cpu);
        const jlm_model *md = jlm_engine_model(ec);
        uint32_t nv = jlm_engine_n_vocab(ec), L = md->config.n_layer, E = md->config.n_embd;
        int llama4 = strstr(models[m], "llama4") != NULL;   /* its prediction reads the input before the scale */
        static const uint32_t LAYERS[] = {0, 2};
        for (int i = 0; i < 2; i++) {
            jlm_engine *ev = engine_on(path, "vulkan", LAYERS[i]);
            if (!ev) {
                tu_rmrf(dir);
                cr_skip_test("vulkan: no device");
            }
            const char *what = i ? "--gpu-layers 2" : "whole";
            uint32_t on = LAYERS[i] ? LAYERS[i] : L, moe = 0;
            for (uint32_t l = 0; l < on; l++)
                moe += has_router(md, l);
            cr_assert(moe > 0, "%s: no MoE block among the first %u", models[m], on);
            uint64_t act = moe_on_device(ec, ev, ic, &pc_cpu, 1, !llama4, 0.05, moe + 1, models[m], what);
            cr_assert(act <= (uint64_t)E * 4 + (uint64_t)nv * 4 + 4096,
                      "%s (%s): %llu activation bytes a decoded token (embedding %u, logits %u)", models[m], what,
                      (unsigned long long)act, E * 4, nv * 4);
            jlm_engine_close(ev);
        }
        jlm_engine_close(ec);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

Test(vulkan, sigmoid_routed_moe_blocks_run_whole_on_the_device, .timeout = 300)
{
    static const char *MODELS[] = {"synth-glm4moe-256.Q8_0", "synth-glm4moe-256.Q4_K_M", "synth-llama4-256.Q8_0",
                                   "synth-llama4-256.Q4_K_M"};
    sigmoid_moe_whole(MODELS, sizeof MODELS / sizeof MODELS[0]);
}

/* deepseek2's latent attention on the device too (engine/exec_vk_mla.c: the
 * latent and the shared RoPE key cached there, each head's query through its
 * attn_k_b sheet, one KV head, each head's output through its attn_v_b
 * sheet), its leading dense block and its sigmoid-routed MoE blocks with a
 * shared expert: Q8_0 and Q4_K_M, whole and at --gpu-layers 2, the checks
 * above (the CPU's ids and predictions, the logits within the quantized
 * tolerance, a decoded token in at most a round trip a MoE block plus one,
 * its activations within its embedding, its logits and 4 KiB), where a
 * host-side latent attention made one round trip a matmul (258 for 5 tokens);
 * and with an F16 cache, the lockstep logits of the CPU's F16 cache, and
 * each layer's attn_k_b and attn_v_b as one batched matvec each (2 a layer,
 * independent of n_head). */
Test(vulkan, deepseek2_latent_attention_blocks_run_whole_on_the_device, .timeout = 300)
{
    static const char *MODELS[] = {"synth-deepseek2-256.Q8_0", "synth-deepseek2-256.Q4_K_M"};
    sigmoid_moe_whole(MODELS, sizeof MODELS / sizeof MODELS[0]);
    /* an F16 latent cache (halves on the device as the CPU rounds them): the lockstep logits of the CPU's
     * F16 cache, every block on the device, none refused */
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *path = tu_convert("synth-deepseek2-256.Q8_0.gguf", dir, "ds.jlm", &err);
    cr_assert(path, "%s", err.msg);
    jlm_engine *ec = bm_engine_kv(path, "cpu", 0, "f16"), *ev = bm_engine_kv(path, "vulkan", 0, "f16");
    cr_assert(ev, "vulkan: no device");
    bm_lockstep(ec, ev, MOE_PROMPT, 5, 0.05, MODELS[0], "--kv f16");
    jlm_dev_stats st;
    jlm_engine_dev_stats(ev, &st);
    cr_assert(st.fallbacks == 0 && st.waits <= 8 * 3, "--kv f16: %llu round trips for 8 evals, %llu refused",
              (unsigned long long)st.waits, (unsigned long long)st.fallbacks);
    bm_sheet_matvecs(ev, jlm_engine_model(ev)->config.n_layer, MODELS[0], "--kv f16");
    jlm_engine_close(ev);
    jlm_engine_close(ec);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* gpt-oss on the device: every block runs whole (the sliding-window layers
 * with their window, the full-attention ones), the sinks in attention.comp
 * and the experts in exec_vk_moe.c (top-k-then-softmax routing, SwiGLU-OAI,
 * expert biases): the CPU's greedy ids for 14 tokens (past the window of 8),
 * the lockstep logits within the quantized tolerance, and a decoded token in
 * at most a round trip a block plus one (each MoE block's picks, then the
 * logits), where the offload (JLM_VK_BLOCKS=0) makes one a matmul; a block
 * left on the offload would add its matmuls' round trips. */
Test(vulkan, gpt_oss_blocks_run_whole_with_windows_sinks_and_experts, .timeout = 120)
{
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *path = tu_convert("synth-gpt-oss-256.MXFP4_MOE.gguf", dir, "g.jlm", &err);
    cr_assert(path, "%s", err.msg);
    jlm_engine *ec = engine_on(path, "cpu", 0);
    setenv("JLM_VK_BLOCKS", "0", 1);
    jlm_engine *eo = engine_on(path, "vulkan", 0);
    unsetenv("JLM_VK_BLOCKS");
    jlm_engine *ev = engine_on(path, "vulkan", 0);
    if (!eo || !ev) {
        tu_rmrf(dir);
        cr_skip_test("vulkan: no device");
    }
    uint32_t nv = jlm_engine_n_vocab(ec);
    float *l = malloc(nv * 4);
    int32_t prompt[3] = {1, 2, 3}, ic[14], iv[14];
    bm_greedy_ids(ec, prompt, 3, 14, ic, l);
    bm_greedy_ids(ev, prompt, 3, 14, iv, l);
    cr_assert(!memcmp(ic, iv, sizeof ic), "gpt-oss: greedy ids differ from the CPU's");
    int32_t next = bm_lockstep(ec, ev, prompt, 3, 0.05, "gpt-oss", "whole");
    jlm_engine_rewind(eo, 0);
    cr_assert_eq(jlm_engine_eval(eo, prompt, 3, l, &err), 0, "%s", err.msg);
    jlm_dev_stats o0, o1, v0, v1;
    jlm_engine_dev_stats(eo, &o0);
    cr_assert_eq(jlm_engine_eval(eo, &next, 1, l, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(eo, &o1);
    jlm_engine_dev_stats(ev, &v0);
    cr_assert_eq(jlm_engine_eval(ev, &next, 1, l, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(ev, &v1);
    uint32_t L = jlm_engine_model(ev)->config.n_layer;
    cr_assert(v1.waits - v0.waits <= L + 1 && v1.waits - v0.waits < o1.waits - o0.waits,
              "gpt-oss: a decoded token made %llu round trips (%u blocks), %llu offloaded",
              (unsigned long long)(v1.waits - v0.waits), L, (unsigned long long)(o1.waits - o0.waits));
    free(l);
    jlm_engine_close(ec);
    jlm_engine_close(eo);
    jlm_engine_close(ev);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* From --stats: with --gpu-layers all (and the CLI's --kv auto: an F16
 * cache, on the device) a decoded token is one round trip (qwen3moe: one a
 * MoE block, for its router's picks, plus one) and its embedding and logits
 * (plus the positions' RoPE cos/sin and the picks, within 4 KiB); the
 * matmul offload (JLM_VK_BLOCKS=0) a round trip a matmul, 7 a layer:
 * backend_matrix.h's bm_stats_decoded_token. */
Test(vulkan, stats_a_decoded_token_is_one_round_trip_and_its_embedding_and_logits, .timeout = 120)
{
    if (!jlm_vk_built())
        cr_skip_test("built without Vulkan");
    bm_stats_decoded_token("vulkan", "JLM_VK_BLOCKS", "--device 0", 7, "synth-qwen3moe-256.Q8_0", "f16");
}

/* --embeddings with whole blocks on the device: the CPU's (bm_embeddings_match). */
Test(vulkan, embeddings_on_whole_blocks_equal_the_cpus, .timeout = 60)
{
    if (!jlm_vk_built())
        cr_skip_test("built without Vulkan");
    bm_embeddings_match("vulkan", " --device 0");
}

/* The engine's own sequence on whole blocks and a jlm_engine_seq on the
 * matmul offload, interleaved: backend_matrix.h's bm_seq_interleave. */
Test(vulkan, the_engines_sequence_on_the_device_and_a_host_sequence_interleave, .timeout = 120)
{
    bm_seq_interleave("vulkan");
}

/* Three sequences, prefills one by one, then single and batched steps and a
 * rewind, on whole blocks with an F32, F16 and (synth-llama-256) Q8_0 cache (each sequence's
 * cache on the device), at --gpu-layers 2 and at --gpu-budget 1 (one device
 * frame): the ids and logits of each sequence alone on the CPU; a batched
 * step of three is one round trip with every block on the device (one a
 * block, 5, at one frame) (backend_matrix.h's bm_seq_batch). */
Test(vulkan, several_sequences_batched_on_the_device_give_the_cpus_ids, .timeout = 240)
{
    bm_seq_batch("vulkan", "stories260K.gguf", "f32", 0, 0, 1e-4f, 1);
    bm_seq_batch("vulkan", "stories260K.gguf", "f16", 0, 0, 5e-4f, 1);
    bm_seq_batch("vulkan", "synth-llama-256.f32.gguf", "q8_0", 0, 0, 5e-4f, 1);
    bm_seq_batch("vulkan", "stories260K.gguf", "f16", 2, 0, 5e-4f, 1);
    bm_seq_batch("vulkan", "stories260K.gguf", "f16", 0, 1, 5e-4f, 5);   /* one frame: a round trip a block */
}

/* --profile --backend vulkan: with every block on the device the vulkan
 * line's classes (device timestamps per op class, and the rest of the
 * host's time in the backend) cover the token: their sum is within
 * [0.5, 1.05] of the token's time (what is not in the backend: the
 * embedding, the greedy pick, the layer loop; over: the timestamps count
 * more than the host waited), matmul and attention both measured. With the
 * matmul offload (JLM_VK_BLOCKS=0) only matmuls run there. */
Test(vulkan, bench_profile_shows_the_devices_time_per_op_class, .timeout = 120)
{
    if (!jlm_vk_built())
        cr_skip_test("built without Vulkan");
    char *dir = tu_tmpdir();
    for (int blocks = 1; blocks >= 0; blocks--) {
        char cmd[2048], *o = NULL;
        snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s JLM_VK_BLOCKS=%d %s bench %s -p 8 -n 6 -r 2 -t 1 --profile "
                 "--backend vulkan --device 0 --gpu-layers all 2>&1", dir, blocks, tu_jlm(),
                 tu_model("stories260K.gguf"));
        int rc = tu_run(cmd, &o);
        if (rc && strstr(o, "no device")) {
            free(o);
            tu_rmrf(dir);
            cr_skip_test("vulkan: no device");
        }
        cr_assert_eq(rc, 0, "%s", o);
        for (int t = 0; t < 2; t++) {
            double ms[4], tok, sum = 0;
            bm_prof_line(o, t ? "tg6" : "pp8", "vulkan", "device timestamps", ms, &tok);
            for (int i = 0; i < 4; i++)
                sum += ms[i];
            cr_assert(ms[0] > 0, "no matmul time: %s", o);
            if (blocks) {
                cr_assert(ms[1] > 0 && ms[2] > 0, "whole blocks: attention and norms on the device: %s", o);
                cr_assert(sum >= 0.5 * tok && sum <= 1.05 * tok + 0.01,
                          "the vulkan classes add up to %.3f of a %.3f ms token:\n%s", sum, tok, o);
            } else {
                cr_assert(ms[1] == 0 && ms[2] == 0, "the offload runs matmuls only: %s", o);
                cr_assert(sum <= 1.05 * tok + 0.01, "%.3f of a %.3f ms token:\n%s", sum, tok, o);
            }
        }
        free(o);
    }
    /* a device without timestamps: the op classes n/a, their time in transfer/wait */
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s JLM_VK_NO_TIMESTAMPS=1 %s bench %s -p 0 -n 4 -r 1 -t 1 --profile "
             "--backend vulkan --device 0 --gpu-layers all 2>&1", dir, tu_jlm(), tu_model("stories260K.gguf"));
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    const char *l = strstr(o, "> profile tg4 on vulkan: matmul n/a, attention n/a, norms/rope/act n/a, transfer/wait ");
    double xf = 0;
    cr_assert(l && sscanf(l + 86, "%lf ms/token", &xf) == 1 && xf > 0, "%s", o);
    cr_assert(strstr(l, "; n/a: the device has no timestamp queries]"), "%s", l);
    free(o);
    tu_rmrf(dir);
    free(dir);
}

/* Profiling records timestamp queries between the ops: the ids and logits
 * are those of the same engine unprofiled, bit for bit, and with it off the
 * device's op classes stay at zero (no query was read). */
Test(vulkan, profiling_leaves_ids_and_logits_unchanged, .timeout = 120)
{
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *path = tu_convert("synth-llama-256.Q4_K_M.gguf", dir, "p.jlm", &err);
    cr_assert(path, "%s", err.msg);
    int32_t prompt[5] = {1, 10, 20, 30, 40}, ids[2][8];
    float *lg[2] = {NULL, NULL};
    for (int prof = 0; prof < 2; prof++) {
        jlm_engine *e = engine_on(path, "vulkan", 0);
        if (!e) {
            tu_rmrf(dir);
            cr_skip_test("vulkan: no device");
        }
        jlm_engine_profile(e, prof);
        lg[prof] = malloc(jlm_engine_n_vocab(e) * sizeof(float));
        bm_greedy_ids(e, prompt, 5, 8, ids[prof], lg[prof]);
        jlm_dev_prof dp;
        cr_assert(jlm_engine_dev_prof_at(e, 0, &dp));
        if (prof)
            cr_assert(dp.timed && dp.ns[JLM_DEVP_MATMUL] > 0 && dp.ns[JLM_DEVP_ATTN] > 0,
                      "profiled: timed %d, matmul %llu ns", dp.timed, (unsigned long long)dp.ns[JLM_DEVP_MATMUL]);
        else
            cr_assert(!dp.timed && !dp.ns[JLM_DEVP_MATMUL] && !dp.ns[JLM_DEVP_ATTN] && !dp.ns[JLM_DEVP_NORM],
                      "unprofiled, yet op classes timed");
        if (prof)
            cr_assert(!memcmp(lg[0], lg[1], jlm_engine_n_vocab(e) * sizeof(float)), "the prompt's logits differ");
        jlm_engine_close(e);
    }
    cr_assert(!memcmp(ids[0], ids[1], sizeof ids[0]), "greedy ids differ with profiling on");
    free(lg[0]);
    free(lg[1]);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* gemma3 on whole blocks (sliding-window layers, their own RoPE base, the
 * fp16-table GELU gate, the post-norms) with F32 and F16 KV caches on the
 * device: backend_matrix.h's bm_whole_blocks_gemma3. */
Test(vulkan, whole_blocks_of_gemma3_and_an_f16_cache_give_the_cpus_ids, .timeout = 300)
{
    static const char *const KV[] = {"f32", "f16"};
    bm_whole_blocks_gemma3("vulkan", KV, 2);
}

/* The same with a Q8_0 cache on the device (its rows bit-identical to the
 * CPU's, q8_0_cache_rows_are_bit_identical_to_the_cpus) and with keys and
 * values of different types. */
Test(vulkan, whole_blocks_with_a_q8_0_cache_give_the_cpus_ids, .timeout = 300)
{
    static const char *const KV[] = {"q8_0", "q8_0/f16", "f32/q8_0"};
    bm_whole_blocks_gemma3("vulkan", KV, 3);
}

/* A prefill on whole blocks records a fixed number of dispatches a block
 * (kernels and device copies, jlm_dev_stats.dispatches), whatever its row
 * count: the norms, RoPE, the cache's stores and attention each run over all
 * the rows at once (each row its own causal keys and window). 20 rows record
 * as many as 10; and each row is computed as a one-row batch computes it: the
 * prefill's logits equal those of the same tokens evaluated one by one, bit
 * for bit (llama, qwen3's per-head norms with an F16 cache, gemma3's windows
 * and its own RoPE base with a Q8_0 cache; deepseek2's latent attention
 * with an F32 and an F16 cache, its dense block 0 on the device: the MoE
 * blocks record each row's experts). */
Test(vulkan, a_prefill_records_the_same_dispatches_whatever_its_row_count, .timeout = 300)
{
    static const struct { const char *model, *kv; uint32_t gl; } CASES[] = {
        {"synth-llama-256.Q4_K_M", "f32", 0},     {"synth-qwen3-256.Q8_0", "f16", 0},
        {"synth-gemma3-256.Q8_0", "q8_0", 0},     {"synth-deepseek2-256.Q8_0", "f32", 1},
        {"synth-deepseek2-256.Q4_K_M", "f16", 1}};
    char *dir = tu_tmpdir();
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        jlm_err err = {0};
        char *path = convert_named(CASES[c].model, dir, "p.jlm");
        jlm_engine *e = bm_engine_kv(path, "vulkan", CASES[c].gl, CASES[c].kv);
        if (!e) {
            tu_rmrf(dir);
            cr_skip_test("vulkan: no device");
        }
        uint32_t nv = jlm_engine_n_vocab(e);
        int32_t prompt[20];
        for (int i = 0; i < 20; i++)
            prompt[i] = 3 + (i * 37) % (nv - 3 < 200 ? nv - 3 : 200);
        float *pre = malloc(nv * 4), *one = malloc(nv * 4);
        uint64_t d[2];
        for (int r = 0; r < 2; r++) {   /* 20 rows, then 10 */
            jlm_dev_stats s0, s1;
            jlm_engine_rewind(e, 0);
            jlm_engine_dev_stats(e, &s0);
            cr_assert_eq(jlm_engine_eval(e, prompt, r ? 10 : 20, pre, &err), 0, "%s", err.msg);
            jlm_engine_dev_stats(e, &s1);
            cr_assert(s1.fallbacks == s0.fallbacks && s1.dispatches > s0.dispatches, "%s: nothing on the device",
                      CASES[c].model);
            d[r] = s1.dispatches - s0.dispatches;
        }
        uint32_t L = CASES[c].gl ? CASES[c].gl : jlm_engine_model(e)->config.n_layer;
        cr_log_info("%s (%s cache): a prefill of 20 rows records %llu dispatches (%u blocks)", CASES[c].model,
                    CASES[c].kv, (unsigned long long)d[0], L);
        cr_assert(d[0] <= 32ull * L + 8, "%s (%s cache): a prefill recorded %llu dispatches, over 32 a block",
                  CASES[c].model, CASES[c].kv, (unsigned long long)d[0]);
        cr_assert_eq(d[0], d[1], "%s (%s cache): a prefill of 20 rows recorded %llu dispatches, of 10 %llu",
                     CASES[c].model, CASES[c].kv, (unsigned long long)d[0], (unsigned long long)d[1]);
        jlm_engine_rewind(e, 0);
        cr_assert_eq(jlm_engine_eval(e, prompt, 20, pre, &err), 0, "%s", err.msg);
        jlm_engine_rewind(e, 0);
        for (int i = 0; i < 20; i++)
            cr_assert_eq(jlm_engine_eval(e, &prompt[i], 1, one, &err), 0, "%s", err.msg);
        cr_assert(!memcmp(pre, one, nv * 4), "%s (%s cache): the prefill's logits differ from one row at a time",
                  CASES[c].model, CASES[c].kv);
        free(pre);
        free(one);
        jlm_engine_close(e);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* A device buffer of n zero bytes. */
static jlm_vk_buf *zeros(jlm_vk *vk, uint64_t n)
{
    jlm_vk_buf *b = NULL;
    jlm_err err = {0};
    cr_assert(jlm_vk_buf_new(vk, n, &b, &err) == 0, "%s", err.msg);
    memset(jlm_vk_buf_map(b), 0, n);
    return b;
}

/* jlm_vk_copy_rows: 5 rows of 3 floats from a stride of 7 floats to a
 * stride of 4 (latent attention's RoPE parts), in one command; the floats
 * between the rows kept; rows past either buffer refused whole. */
Test(vulkan, copy_rows_moves_each_row_in_one_command_and_refuses_rows_outside)
{
    jlm_vk *vk = open_or_skip();
    jlm_err err = {0};
    float src[35], want[21];
    for (int i = 0; i < 35; i++)
        src[i] = (float)i + 0.5f;
    for (int i = 0; i < 21; i++)
        want[i] = -1.0f;
    for (int r = 0; r < 5; r++)
        memcpy(&want[1 + r * 4], &src[2 + r * 7], 12);
    jlm_vk_buf *s = up(vk, src, sizeof src), *d = zeros(vk, sizeof want);
    for (int i = 0; i < 21; i++)
        ((float *)jlm_vk_buf_map(d))[i] = -1.0f;
    uint64_t n0 = jlm_vk_dispatches(vk);
    cr_assert_eq(jlm_vk_copy_rows(vk, (jlm_vk_view){d, 4, 80}, 16, (jlm_vk_view){s, 8, 132}, 28, 12, 5, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(jlm_vk_dispatches(vk) - n0, 1);
    cr_assert(!memcmp(jlm_vk_buf_map(d), want, sizeof want), "the rows differ");
    cr_assert_eq(jlm_vk_copy_rows(vk, (jlm_vk_view){d, 4, 80}, 16, (jlm_vk_view){s, 8, 132}, 28, 12, 6, &err),
                 JLM_EINVAL);
    cr_assert(strstr(err.msg, "outside"), "%s", err.msg);
    cr_assert(!memcmp(jlm_vk_buf_map(d), want, sizeof want), "a refused copy wrote");
    jlm_vk_buf_free(vk, s);
    jlm_vk_buf_free(vk, d);
    jlm_vk_close(vk);
}

/* The row-batched kernels (a prefill's: jlm_vk_attention_rows,
 * jlm_vk_rmsnorm_rows, jlm_vk_rope_rows, jlm_vk_add_rows, jlm_vk_scale_rows) compute each row
 * bit for bit as the one-row kernels do: attention of 6 query rows at
 * positions 10..15, causal, with and without a window of 4, with sinks and a
 * softcap, over an f32, a halves and a Q8_0 cache (GQA 2:1); the norms per
 * head and per row; RoPE at each row's cos/sin; a bias on each row; each
 * row times its own scale (Llama 4's attention temperature). */
Test(vulkan, row_batched_kernels_compute_each_row_as_the_one_row_kernels_bit_for_bit)
{
    jlm_vk *vk = open_or_skip();
    jlm_err err = {0};
    uint64_t seed = 38;
    enum { R = 6, NH = 4, NKV = 2, HD = 32, P = 16, KVD = NKV * HD, QW = NH * HD };
    float q[R * QW], kf[P * KVD], vf[P * KVD], sinks[NH];
    for (int i = 0; i < R * QW; i++)
        q[i] = rng_unit(&seed);
    for (int i = 0; i < P * KVD; i++)
        kf[i] = rng_unit(&seed), vf[i] = rng_unit(&seed);
    for (int h = 0; h < NH; h++)
        sinks[h] = rng_unit(&seed);
    static const uint64_t RB[3] = {KVD * 4, KVD * 2, KVD / 32 * 34};
    uint8_t kc[3][P * KVD * 4], vc[3][P * KVD * 4];
    for (int i = 0; i < P * KVD; i++) {
        uint16_t hk = jlm_k_f32_to_fp16(kf[i]), hv = jlm_k_f32_to_fp16(vf[i]);
        memcpy(kc[0] + 4 * i, &kf[i], 4), memcpy(vc[0] + 4 * i, &vf[i], 4);
        memcpy(kc[1] + 2 * i, &hk, 2), memcpy(vc[1] + 2 * i, &hv, 2);
    }
    for (int b = 0; b < P * KVD / 32; b++) {   /* Q8_0 blocks: a half d, 32 int8 */
        uint16_t d = (uint16_t)(0x2000 | (rng_next(&seed) & 0x3ff));
        memcpy(kc[2] + 34 * b, &d, 2), memcpy(vc[2] + 34 * b, &d, 2);
        for (int i = 0; i < 32; i++)
            kc[2][34 * b + 2 + i] = (uint8_t)rng_next(&seed), vc[2][34 * b + 2 + i] = (uint8_t)rng_next(&seed);
    }
    jlm_vk_buf *qb = up(vk, q, sizeof q), *one = zeros(vk, R * NH * HD * 4), *all = zeros(vk, R * NH * HD * 4),
               *sc = zeros(vk, R * NH * P * 4);
    for (int f = 0; f < 3 * 4; f++) {
        int t = f / 4, win = f & 1, sk = f & 2;
        jlm_vk_buf *kb = up(vk, kc[t], P * RB[t]), *vb = up(vk, vc[t], P * RB[t]);
        jlm_k_attn ap = {.head_dim = HD, .head_dim_v = HD, .k_stride = KVD, .v_stride = KVD,
                         .scale = 0.17f, .softcap = f % 3 == 1 ? 3.0f : 0.0f};
        uint32_t span[2 * R], lo0 = 0;
        for (int r = 0; r < R; r++) {
            uint32_t pos = 10 + r, lo = win && pos >= 3 ? pos - 3 : 0, n = pos + 1 - lo;
            lo0 = r == 0 ? lo : lo0;
            span[2 * r] = lo - lo0, span[2 * r + 1] = n;
            jlm_vk_view kv = {kb, lo * RB[t], n * RB[t]}, vv = {vb, lo * RB[t], n * RB[t]};
            cr_assert_eq(jlm_vk_attention_kv(vk, &ap, NH, NKV, (jlm_vk_view){qb, r * QW * 4, QW * 4}, kv, t, vv, t, n,
                                             sk ? sinks : NULL, (jlm_vk_view){sc, 0, NH * n * 4},
                                             (jlm_vk_view){one, r * QW * 4, QW * 4}, &err),
                         0, "%s", err.msg);
        }
        uint64_t nk = 16 - lo0;
        cr_assert_eq(jlm_vk_attention_rows(vk, &ap, NH, NKV, R, whole(qb), QW, (jlm_vk_view){kb, lo0 * RB[t], nk * RB[t]},
                                           t, (jlm_vk_view){vb, lo0 * RB[t], nk * RB[t]}, t, span, sk ? sinks : NULL,
                                           whole(sc), whole(all), QW, &err),
                     0, "%s", err.msg);
        cr_assert(!memcmp(fmap(one), fmap(all), R * QW * 4), "attention rows (cache %d, window %d, sinks %d) differ "
                  "from one row at a time", t, win, sk != 0);
        jlm_vk_buf_free(vk, kb);
        jlm_vk_buf_free(vk, vb);
    }
    /* norms: each head (3 of 32 a row), each row of 96 with a weight; RoPE: rows at their own cos/sin */
    float w[96], cs[R * 2 * 16], bias[96];
    for (int i = 0; i < 96; i++)
        w[i] = 1.0f + rng_unit(&seed), bias[i] = rng_unit(&seed);
    for (int r = 0; r < R * 2; r++) {
        jlm_k_rope rp = {.n_rot = 16, .freq_base = r % 2 ? 10000.0f : 1e6f, .freq_scale = 1.0f, .attn_factor = 1.0f};
        jlm_k_rope_cos_sin(&rp, 10 + r / 2, cs + r * 16);
    }
    jlm_vk_buf *wb = up(vk, w, sizeof w), *cb = up(vk, cs, sizeof cs), *bb = up(vk, bias, sizeof bias);
    float temp[R] = {1.0f, 1.25f, 0.75f, 1.0f, 3.0f, 0.1f};
    for (int f = 0; f < 6; f++) {
        memcpy(jlm_vk_buf_map(one), q, R * 96 * 4);
        memcpy(jlm_vk_buf_map(all), q, R * 96 * 4);
        for (int r = 0; r < R && f < 2; r++)
            for (int h = 0; h < (f ? 1 : 3); h++) {
                uint32_t n = f ? 96 : 32;
                jlm_vk_view x = {one, (r * 96 + h * n) * 4, n * 4};
                cr_assert_eq(jlm_vk_rmsnorm(vk, x, x, f ? whole(wb) : (jlm_vk_view){0}, n, 1e-5f, &err), 0, "%s",
                             err.msg);
            }
        for (int r = 0; r < R && f >= 2 && f < 4; r++)
            cr_assert_eq(jlm_vk_rope_cs(vk, 16, f == 3, (jlm_vk_view){one, r * 96 * 4, 96 * 4}, 3, 32,
                                        (jlm_vk_view){cb, r * 2 * 16 * 4, 16 * 4}, &err),
                         0, "%s", err.msg);
        for (int r = 0; r < R && f == 4; r++) {
            jlm_vk_view x = {one, r * 96 * 4, 96 * 4};
            cr_assert_eq(jlm_vk_eltwise(vk, JLM_VK_ADD, x, x, whole(bb), 96, &err), 0, "%s", err.msg);
        }
        for (int r = 0; r < R && f == 5; r++) {
            jlm_vk_view x = {one, r * 96 * 4, 96 * 4};
            cr_assert_eq(jlm_vk_scale(vk, x, x, temp[r], 96, &err), 0, "%s", err.msg);
        }
        int rc = f < 2 ? jlm_vk_rmsnorm_rows(vk, whole(all), whole(all), f ? whole(wb) : (jlm_vk_view){0}, f ? 96 : 32,
                                             f ? 1 : 3, R, 96, 1e-5f, &err)
                 : f < 4 ? jlm_vk_rope_rows(vk, 16, f == 3, whole(all), 3, 32, 96, whole(cb), 2 * 16, R, &err)
                 : f < 5 ? jlm_vk_add_rows(vk, whole(all), whole(all), whole(bb), 96, R, &err)
                         : jlm_vk_scale_rows(vk, whole(all), whole(all), temp, 96, R, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        cr_assert(!memcmp(fmap(one), fmap(all), R * 96 * 4), "case %d (norm by head, by row, rope, neox rope, "
                  "bias, scale a row): the rows differ from one row at a time", f);
        cr_assert(memcmp(fmap(all), q, R * 96 * 4), "case %d changed nothing", f);
    }
    jlm_vk_buf *bufs[] = {qb, one, all, sc, wb, cb, bb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        jlm_vk_buf_free(vk, bufs[i]);
    jlm_vk_close(vk);
}
