/* test_llama4_chunk.c - Llama 4's chunked attention and attention
 * temperature (llama.cpp's LLAMA_SWA_TYPE_CHUNKED mask and attn_temp input,
 * src/llama-hparams.h and src/llama-graph.cpp of b10359) against a scalar
 * forward pass written here from llama.cpp's llama4 graph
 * (src/models/llama4.cpp).
 *
 * Both are invisible below 8192 positions with llama.cpp's fixed values, and
 * a scalar reference over 8192+ positions is minutes of CPU, so the test
 * container is synth-llama4-256 with its chunk (SWAWindow) set to 32 and its
 * temperature floor (AttnTempFloor) to 16: the same code paths, reached at
 * position 32 / 15. The weights are F32 (the HF round trip of
 * tests/hf_synth.h: the GGUF's Q8_0 rows dequantized), so the engine
 * multiplies f32 activations as the reference does and the top-1 router
 * cannot flip on activation rounding. */
#include <criterion/criterion.h>
#include <math.h>

#include "converter/convert.h"
#include "engine/model.h"
#include "tests/hf_synth.h"
#include "tests/testutil.h"

#include <sys/stat.h>

#define CHUNK 32
#define FLOOR 16
#define N_TOK 100     /* positions 0..99: three chunk boundaries, temperatures 1 .. log(7) x 0.1 + 1 */
#define N_PRE 70      /* one batched prefill of 70, then 30 single-token steps */
#define TOL 1e-3      /* x max |logit|: F32 weights and cache on both sides, only summation order differs */

typedef struct ref {
    const jlm_gguf *g;
    uint32_t n_embd, n_head, n_kv, hd, n_layer, n_vocab, step;
    float eps, base;
} ref;

static float *W(const ref *r, const char *fmt, int l)
{
    char nm[96];
    snprintf(nm, sizeof nm, fmt, l);
    const jlm_gguf_tensor *t = jlm_gguf_find_tensor(r->g, nm);
    cr_assert(t, "%s", nm);
    return hs_rows(r->g, t, 0, t->n_dims == 1 ? 1 : t->ne[1] * t->ne[2]);
}

/* y[rows] = w[rows][k] x[k] */
static void mv(const float *w, const float *x, float *y, uint32_t rows, uint32_t k)
{
    for (uint32_t i = 0; i < rows; i++) {
        double s = 0;
        for (uint32_t j = 0; j < k; j++)
            s += (double)w[(uint64_t)i * k + j] * x[j];
        y[i] = (float)s;
    }
}

static void rms(const float *x, const float *w, float *y, uint32_t n, float eps)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    float sc = (float)(1.0 / sqrt(s / n + eps));
    for (uint32_t i = 0; i < n; i++)
        y[i] = x[i] * sc * (w ? w[i] : 1.0f);
}

/* llama.cpp's NORM RoPE: pairs (2i, 2i + 1) turned by pos x base^(-2i / hd). */
static void rope(float *x, uint32_t hd, uint32_t pos, float base)
{
    for (uint32_t i = 0; i < hd / 2; i++) {
        double th = pos * pow(base, -2.0 * i / hd), c = cos(th), s = sin(th);
        double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = (float)(a * c - b * s);
        x[2 * i + 1] = (float)(a * s + b * c);
    }
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

/* out = down(silu(gate x) * up x); sheet e of the expert banks (e < 0: dense). */
static void swiglu(const float *g, const float *u, const float *d, int64_t e, uint32_t ff, uint32_t n, const float *x,
                   float *out)
{
    float *a = malloc(ff * 4), *b = malloc(ff * 4);
    uint64_t off = e < 0 ? 0 : (uint64_t)e * ff * n;
    mv(g + off, x, a, ff, n);
    mv(u + off, x, b, ff, n);
    for (uint32_t i = 0; i < ff; i++)
        a[i] = silu(a[i]) * b[i];
    mv(d + off, a, out, n, ff);
    free(a);
    free(b);
}

/* Logits after every position of ids (n x n_vocab). */
static float *forward(const ref *r, const int32_t *ids, uint32_t n)
{
    uint32_t E = r->n_embd, qd = r->n_head * r->hd, kd = r->n_kv * r->hd, G = r->n_head / r->n_kv;
    float *x = malloc((uint64_t)n * E * 4), *h = malloc(E * 4), *y = malloc(E * 4), *y2 = malloc(E * 4);
    float *q = malloc((uint64_t)n * qd * 4), *k = malloc((uint64_t)n * kd * 4), *v = malloc((uint64_t)n * kd * 4);
    float *att = malloc(qd * 4), *p = malloc(n * 4), *emb = W(r, "token_embd.weight", 0);
    for (uint32_t t = 0; t < n; t++)
        memcpy(x + (uint64_t)t * E, emb + (uint64_t)ids[t] * E, E * 4);
    for (uint32_t l = 0; l < r->n_layer; l++) {
        int use_rope = (l + 1) % 4 != 0, moe = (l + 1) % r->step == 0;
        float *an = W(r, "blk.%d.attn_norm.weight", l), *wq = W(r, "blk.%d.attn_q.weight", l);
        float *wk = W(r, "blk.%d.attn_k.weight", l), *wv = W(r, "blk.%d.attn_v.weight", l);
        float *wo = W(r, "blk.%d.attn_output.weight", l), *fn = W(r, "blk.%d.ffn_norm.weight", l);
        for (uint32_t t = 0; t < n; t++) {
            rms(x + (uint64_t)t * E, an, h, E, r->eps);
            mv(wq, h, q + (uint64_t)t * qd, qd, E);
            mv(wk, h, k + (uint64_t)t * kd, kd, E);
            mv(wv, h, v + (uint64_t)t * kd, kd, E);
            for (uint32_t hh = 0; hh < r->n_head; hh++) {
                float *qh = q + (uint64_t)t * qd + hh * r->hd;
                if (use_rope) {
                    rope(qh, r->hd, t, r->base);
                    rms(qh, NULL, qh, r->hd, r->eps);
                } else {   /* the temperature of a no-RoPE layer */
                    float s = (float)(log(floor((t + 1.0) / FLOOR) + 1.0) * 0.1 + 1.0);
                    for (uint32_t i = 0; i < r->hd; i++)
                        qh[i] *= s;
                }
            }
            for (uint32_t g = 0; use_rope && g < r->n_kv; g++) {
                float *kh = k + (uint64_t)t * kd + g * r->hd;
                rope(kh, r->hd, t, r->base);
                rms(kh, NULL, kh, r->hd, r->eps);
            }
        }
        for (uint32_t t = 0; t < n; t++) {
            uint32_t lo = use_rope ? t / CHUNK * CHUNK : 0;   /* the chunk's first key on the RoPE layers */
            for (uint32_t hh = 0; hh < r->n_head; hh++) {
                const float *qh = q + (uint64_t)t * qd + hh * r->hd;
                uint32_t g = hh / G;
                double mx = -INFINITY, sum = 0;
                for (uint32_t j = lo; j <= t; j++) {
                    double s = 0;
                    for (uint32_t i = 0; i < r->hd; i++)
                        s += (double)qh[i] * k[(uint64_t)j * kd + g * r->hd + i];
                    p[j] = (float)(s / sqrt((double)r->hd));
                    mx = fmax(mx, p[j]);
                }
                for (uint32_t j = lo; j <= t; j++)
                    sum += exp(p[j] - mx);
                for (uint32_t i = 0; i < r->hd; i++) {
                    double o = 0;
                    for (uint32_t j = lo; j <= t; j++)
                        o += exp(p[j] - mx) / sum * v[(uint64_t)j * kd + g * r->hd + i];
                    att[hh * r->hd + i] = (float)o;
                }
            }
            mv(wo, att, y, E, qd);
            for (uint32_t i = 0; i < E; i++)
                x[(uint64_t)t * E + i] += y[i];
        }
        free(an); free(wq); free(wk); free(wv); free(wo);
        if (moe) {   /* shared expert + the top router logit's expert, its sigmoid on the expert's input */
            float *rt = W(r, "blk.%d.ffn_gate_inp.weight", l), *ge = W(r, "blk.%d.ffn_gate_exps.weight", l);
            float *ue = W(r, "blk.%d.ffn_up_exps.weight", l), *de = W(r, "blk.%d.ffn_down_exps.weight", l);
            float *gs = W(r, "blk.%d.ffn_gate_shexp.weight", l), *us = W(r, "blk.%d.ffn_up_shexp.weight", l);
            float *ds = W(r, "blk.%d.ffn_down_shexp.weight", l), lg[64];
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%u.ffn_gate_exps.weight", l);
            const jlm_gguf_tensor *gt = jlm_gguf_find_tensor(r->g, nm);
            uint32_t ne = (uint32_t)gt->ne[2], ffe = (uint32_t)gt->ne[1];
            cr_assert(ne <= 64);
            for (uint32_t t = 0; t < n; t++) {
                rms(x + (uint64_t)t * E, fn, h, E, r->eps);
                mv(rt, h, lg, ne, E);
                uint32_t best = 0;
                for (uint32_t e = 1; e < ne; e++)
                    best = lg[e] > lg[best] ? e : best;
                swiglu(gs, us, ds, -1, ffe, E, h, y);
                float w = 1.0f / (1.0f + expf(-lg[best]));
                for (uint32_t i = 0; i < E; i++)
                    h[i] *= w;
                swiglu(ge, ue, de, best, ffe, E, h, y2);
                for (uint32_t i = 0; i < E; i++)
                    x[(uint64_t)t * E + i] += y[i] + y2[i];
            }
            free(rt); free(ge); free(ue); free(de); free(gs); free(us); free(ds);
        } else {
            float *g = W(r, "blk.%d.ffn_gate.weight", l), *u = W(r, "blk.%d.ffn_up.weight", l);
            float *d = W(r, "blk.%d.ffn_down.weight", l);
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%u.ffn_gate.weight", l);
            uint32_t ff = (uint32_t)jlm_gguf_find_tensor(r->g, nm)->ne[1];
            for (uint32_t t = 0; t < n; t++) {
                rms(x + (uint64_t)t * E, fn, h, E, r->eps);
                swiglu(g, u, d, -1, ff, E, h, y);
                for (uint32_t i = 0; i < E; i++)
                    x[(uint64_t)t * E + i] += y[i];
            }
            free(g); free(u); free(d);
        }
        free(fn);
    }
    float *on = W(r, "output_norm.weight", 0), *out = W(r, "output.weight", 0);
    float *logits = malloc((uint64_t)n * r->n_vocab * 4);
    for (uint32_t t = 0; t < n; t++) {
        rms(x + (uint64_t)t * E, on, h, E, r->eps);
        mv(out, h, logits + (uint64_t)t * r->n_vocab, r->n_vocab, E);
    }
    free(on); free(out); free(emb);
    free(x); free(h); free(y); free(y2); free(q); free(k); free(v); free(att); free(p);
    return logits;
}

/* synth-llama4-256.Q8_0 as an F32 container (its HF round trip) with
 * SWAWindow / AttnTempFloor set to chunk / floor. */
static char *small_chunk_container(const char *dir, uint32_t chunk, uint32_t floor_)
{
    char folder[1100], *out = malloc(1200);
    snprintf(folder, sizeof folder, "%s/hf", dir);
    snprintf(out, 1200, "%s/l4.jlm", dir);
    cr_assert_eq(mkdir(folder, 0755), 0);
    cr_assert_eq(hs_from_gguf(tu_model("synth-llama4-256.Q8_0.gguf"), folder), 0);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(folder, NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c->config.swa_window, 8192);
    cr_assert_eq(c->config.attn_temp_floor, 8192);
    c->config.swa_window = chunk;
    c->config.attn_temp_floor = floor_;
    cr_assert_eq(jlm_conv_set_device(c, "cpu", &err), 0, "%s", err.msg);   /* plans again with the new record */
    cr_assert_eq(jlm_conv_write(c, out, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    return out;
}

static double max_err(const float *a, const float *b, uint32_t n, double *mx)
{
    double e = 0;
    *mx = 0;
    for (uint32_t i = 0; i < n; i++) {
        *mx = fmax(*mx, fabs(b[i]));
        if (!(fabs((double)a[i] - b[i]) <= e))
            e = fabs((double)a[i] - b[i]);
    }
    return e;
}

/* One batched prefill, then one token at a time (batched attention and the
 * decode path; JLM_ATTN=token's per-token path in the second test), every
 * position's logits within TOL of the scalar reference. */
static void chunked_matches_reference(void)
{
    char *dir = tu_tmpdir(), *path = small_chunk_container(dir, CHUNK, FLOOR);
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_open(tu_model("synth-llama4-256.Q8_0.gguf"), &g, &err), 0, "%s", err.msg);
    ref r = {.g = g, .n_embd = hs_u32(g, "llama4", "embedding_length"), .n_head = hs_u32(g, "llama4", "attention.head_count"),
             .n_kv = hs_u32(g, "llama4", "attention.head_count_kv"), .hd = hs_u32(g, "llama4", "attention.key_length"),
             .n_layer = hs_u32(g, "llama4", "block_count"), .n_vocab = hs_u32(g, "llama4", "vocab_size"),
             .step = hs_u32(g, "llama4", "interleave_moe_layer_step"),
             .eps = (float)hs_f32(g, "llama4", "attention.layer_norm_rms_epsilon"),
             .base = (float)hs_f32(g, "llama4", "rope.freq_base")};
    int32_t ids[N_TOK];
    srand(41);
    for (int i = 0; i < N_TOK; i++)
        ids[i] = 3 + rand() % (int)(r.n_vocab - 3);
    float *want = forward(&r, ids, N_TOK);
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1};
    jlm_engine *e;
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    float *got = malloc(r.n_vocab * 4);
    double worst = 0;
    for (uint32_t t = N_PRE - 1; t < N_TOK; t++) {
        if (t == N_PRE - 1)
            cr_assert_eq(jlm_engine_eval(e, ids, N_PRE, got, &err), 0, "%s", err.msg);
        else
            cr_assert_eq(jlm_engine_eval(e, &ids[t], 1, got, &err), 0, "%s", err.msg);
        double mx, d = max_err(got, want + (uint64_t)t * r.n_vocab, r.n_vocab, &mx);
        cr_assert(!(d > TOL * mx), "position %u (chunk %u): logit error %g > %g x max |logit| %g", t, t / CHUNK, d,
                  TOL, mx);
        worst = fmax(worst, d / mx);
    }
    cr_log_info("llama4 chunk %d, floor %d: positions %d..%d within %.3g x max |logit| of the scalar reference", CHUNK,
                FLOOR, N_PRE - 1, N_TOK - 1, worst);
    free(got);
    free(want);
    jlm_engine_close(e);
    jlm_gguf_close(g);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

Test(llama4, chunked_attention_and_temperature_match_a_scalar_reference, .timeout = 120)
{
    chunked_matches_reference();
}

Test(llama4, per_token_attention_path_chunks_the_same, .timeout = 120)
{
    setenv("JLM_ATTN", "token", 1);
    chunked_matches_reference();
    unsetenv("JLM_ATTN");
}

/* The real sizes: a context past llama.cpp's chunk (8192) opens and runs. */
Test(llama4, context_past_the_chunk_size_opens, .timeout = 60)
{
    char *dir = tu_tmpdir(), path[1100];
    snprintf(path, sizeof path, "%s/l4.jlm", dir);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(tu_model("synth-llama4-256.Q8_0.gguf"), NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(c, path, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1, .n_ctx = 16384};
    jlm_engine *e;
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_n_ctx(e), 16384);
    int32_t ids[4] = {1, 100, 200, 300};
    float *l = malloc(jlm_engine_n_vocab(e) * 4);
    cr_assert_eq(jlm_engine_eval(e, ids, 4, l, &err), 0, "%s", err.msg);
    free(l);
    jlm_engine_close(e);
    tu_rmrf(dir);
    free(dir);
}
