/* backend_matrix.h - every test model on a device backend against the CPU
 * backend and llama.cpp's logits: whole, split (--gpu-layers 2) and at one
 * frame each side (--budget 1 --gpu-budget 1); whole blocks on the device
 * (bm_whole_blocks, bm_stats_decoded_token). Shared by the suites vulkan
 * (tests/test_vulkan.c) and cuda (tests/test_cuda.c, on the emulated
 * device), so both backends are held to the same matrix. Include once, in a
 * Criterion test file that has testutil.h. */
#ifndef JLM_TESTS_BACKEND_MATRIX_H
#define JLM_TESTS_BACKEND_MATRIX_H

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/pager.h"
#include "tests/moe_budget.h"
#include "tests/testutil.h"

/* The engine with o (threads, quiet and direct set here); NULL when a
 * device backend has no device (JLM_EUNSUPPORTED) and may_lack, the reason
 * in why. */
static jlm_engine *bm_open_opts(const char *path, jlm_engine_opts o, int may_lack, char *why, size_t why_len)
{
    o.n_threads = 2, o.quiet = 1, o.direct = 1;
    jlm_engine *e = NULL;
    jlm_err err = {0};
    int rc = jlm_engine_open(path, &o, &e, &err);
    if (rc == JLM_EUNSUPPORTED && may_lack) {
        snprintf(why, why_len, "%.400s", err.msg);
        return NULL;
    }
    cr_assert_eq(rc, 0, "%s: %s", o.backend ? o.backend : "cpu", err.msg);
    return e;
}

static const char *MATRIX[] = {
    "stories260K", "llama-2-tiny-random", "synth-gemma3-256.Q4_K_M", "synth-gemma3-256.Q8_0",
    "synth-gemma3v-128.F32", "synth-gemma3v-128.Q8_0", "synth-gpt-oss-256.MXFP4_MOE", "synth-llama-256.MXFP4",
    "synth-llama-256.Q2_K", "synth-llama-256.Q3_K_M", "synth-llama-256.Q4_0", "synth-llama-256.Q4_1",
    "synth-llama-256.Q4_K_M", "synth-llama-256.Q5_0", "synth-llama-256.Q5_1", "synth-llama-256.Q5_K_M",
    "synth-llama-256.Q6_K", "synth-llama-256.Q8_0", "synth-llama-256.f32", "synth-llama-moe-256.F16",
    "synth-llama-moe-256.MXFP4_MOE", "synth-llama-moe-256.Q4_K_M", "synth-olmoe-256.Q4_K_M", "synth-phi3-256.Q4_K_M",
    "synth-qwen2-256.Q4_K_M", "synth-qwen2-256.Q8_0", "synth-qwen3-256.Q4_K_M", "synth-qwen3-256.Q8_0",
    "synth-qwen3moe-256.Q4_K_M", "synth-qwen3moe-256.Q8_0", "synth-glm4moe-256.Q8_0", "synth-glm4moe-256.Q4_K_M",
    "synth-deepseek2-256.Q8_0", "synth-deepseek2-256.Q4_K_M",
    "synth-llama4-256.Q4_K_M",   /* not Q8_0: llama.cpp's own modes route its first prompt differently */
};

/* tests/test_engine.c's per-type tolerance of the CPU backend against
 * llama.cpp's logits (docs/engine.md says why), relative to max |logit|. */
static double cpu_tol(const char *m)
{
    if (strstr(m, "f32") || !strcmp(m, "stories260K")) return 1e-4;
    if (strstr(m, "F16") || strstr(m, "tiny-random")) return 2e-3;
    if (strstr(m, "Q2_K")) return 0.12;
    return 0.05;
}

/* The oracle's first run (tests/reference/oracle-NAME.exact.json): e's logits
 * after its prompt within cpu_tol of llama.cpp's. 0 when there is no oracle
 * or it holds no full logit vector. e is rewound after. */
static int vs_oracle(jlm_engine *e, const char *name, const char *what)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/reference/oracle-%s.exact.json", tu_root(), name);
    json_t *o = json_load_file(p, 0, NULL);
    if (!o)
        return 0;
    json_t *run = json_array_get(json_object_get(o, "runs"), 0), *ref = json_object_get(run, "logits_after_prompt");
    json_t *jp = json_object_get(run, "prompt_ids");
    uint32_t nv = jlm_engine_n_vocab(e);
    int done = 0;
    if (json_array_size(ref) == nv && json_array_size(jp) <= 64) {
        int32_t ids[64];
        for (size_t i = 0; i < json_array_size(jp); i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(jp, i));
        float *l = malloc(nv * 4);
        jlm_err err = {0};
        jlm_engine_rewind(e, 0);
        cr_assert_eq(jlm_engine_eval(e, ids, (uint32_t)json_array_size(jp), l, &err), 0, "%s", err.msg);
        double mx = 0, d = 0;
        for (uint32_t i = 0; i < nv; i++) {
            double v = json_number_value(json_array_get(ref, i));
            mx = fmax(mx, fabs(v));
            double di = fabs(v - l[i]);
            if (!(di <= d)) d = di;   /* NaN propagates */
        }
        cr_assert(!(d > cpu_tol(name) * mx), "%s (%s): max logit error %g against llama.cpp > %g x max |logit| %g",
                  name, what, d, cpu_tol(name), mx);
        free(l);
        jlm_engine_rewind(e, 0);
        done = 1;
    }
    json_decref(o);
    return done;
}

/* A device backend against the CPU backend on the same ids. Quantized matvec is
 * bit-identical to the CPU's, so what differs there is rounding elsewhere:
 * 1e-4 of the largest logit. Float weights (F32, F16) are summed in another
 * order by the shader (docs/vulkan.md), and synth-gemma3v-128.F32 amplifies
 * such rounding: the CPU's own two attention paths (JLM_ATTN=token and the
 * batched kernel, both within tolerance of llama.cpp) differ there by 1.6e-4
 * of the largest logit, and Vulkan against the CPU by 1.2e-4 to 2.0e-4, so
 * float models get 5e-4. */
/* backend: the configuration's. Whole blocks on Vulkan (engine/exec_vk.c)
 * and on CUDA (engine/exec_cu.c; JLM_*_BLOCKS=0 turns them off)
 * quantize to int8 activations the device computed, whose norms and
 * exponentials differ from the CPU's in the last bits: a code one off moves a
 * quantized model's logits by up to ~1% of the largest, so quantized models
 * are held there to the CPU's own tolerance against llama.cpp (cpu_tol). */
static inline int bm_knob_off(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "0");
}
static double dev_cpu_tol(const char *m, const char *backend)
{
    int whole = backend && ((strstr(backend, "vulkan") && !bm_knob_off("JLM_VK_BLOCKS")) ||
                            (strstr(backend, "cuda") && !bm_knob_off("JLM_CUDA_BLOCKS")));
    if (whole && cpu_tol(m) > 2e-3)
        return cpu_tol(m);
    return strstr(m, "F32") || strstr(m, "f32") || strstr(m, "F16") ? 5e-4 : 1e-4;
}

static int argmax2(const float *l, uint32_t n, float *margin)
{
    uint32_t b = 0, s = n > 1 ? 1 : 0;
    if (n > 1 && l[1] > l[0])
        b = 1, s = 0;
    for (uint32_t i = 2; i < n; i++)
        if (l[i] > l[b])
            s = b, b = i;
        else if (l[i] > l[s])
            s = i;
    *margin = l[b] - l[s];
    return (int)b;
}

/* One configuration of the matrix: what to call it and the engine's
 * options (threads, quiet, direct are set by bm_open_opts). */
typedef struct bm_cfg {
    const char      *what;   /* "cuda, --gpu-layers 2" */
    jlm_engine_opts  o;
    uint32_t         gpu_frames[JLM_ENGINE_DEVS];   /* > 0: device i's budget (o.gpu_budget,
                                    * gpu_budget2) is that many block frames plus the routed
                                    * experts' (the model's, from the CPU engine's pager) */
} bm_cfg;

/* Called after a configuration's steps on model (n blocks): ev's device
 * figures, before[i] = device i's before the steps (jlm_engine_dev_stats_at),
 * steps = the evaluations between. */
typedef void (*bm_check_fn)(jlm_engine *ev, const char *model, const bm_cfg *cfg, int cfg_i,
                            const jlm_dev_stats *before, int steps);

/* Every test model on each configuration against the CPU backend: after the
 * oracle's first prompt, logits within the CPU backend's tolerance of
 * llama.cpp's; then the CPU's ids fed to both for 3 steps, logits within
 * dev_cpu_tol of the largest and the same pick wherever the CPU's top-2
 * margin exceeds twice the difference; then check. A configuration that
 * cannot open for want of a device skips the test (one line). */
static void bm_matrix(const bm_cfg *cfgs, int n_cfg, bm_check_fn check)
{
    char *dir = tu_tmpdir();
    int n_oracle = 0;
    size_t nm = sizeof MATRIX / sizeof MATRIX[0];
    for (size_t m = 0; m < nm; m++) {
        char gguf[256], why[512] = "";
        jlm_err err = {0};
        snprintf(gguf, sizeof gguf, "%s.gguf", MATRIX[m]);
        char *path = tu_convert(gguf, dir, "m.jlm", &err);
        cr_assert(path, "%s: %s", MATRIX[m], err.msg);
        jlm_engine *ec = bm_open_opts(path, (jlm_engine_opts){.backend = "cpu"}, 0, why, sizeof why);
        uint32_t nv = jlm_engine_n_vocab(ec);
        float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
        for (int cfg = 0; cfg < n_cfg; cfg++) {
            const char *what = cfgs[cfg].what;
            jlm_engine_opts o = cfgs[cfg].o;
            uint64_t *gb[JLM_ENGINE_DEVS] = {&o.gpu_budget, &o.gpu_budget2};
            for (int i = 0; i < JLM_ENGINE_DEVS; i++)
                if (cfgs[cfg].gpu_frames[i]) {
                    const jlm_config *mc = &jlm_engine_model(ec)->config;
                    uint32_t pins[3] = {cfgs[cfg].gpu_frames[i], 0, mc->n_expert ? mc->n_expert_used : 0};
                    *gb[i] = jlm_pager_min_budget(jlm_engine_pager(ec), pins);
                }
            jlm_engine *ev = bm_open_opts(path, o, 1, why, sizeof why);
            if (!ev) {
                tu_rmrf(dir);
                cr_skip_test("%s: no device (%s)", what, why);
            }
            n_oracle += vs_oracle(ev, MATRIX[m], what);
            jlm_dev_stats before[JLM_ENGINE_DEVS];
            for (int i = 0; i < JLM_ENGINE_DEVS; i++)
                jlm_engine_dev_stats_at(ev, i, &before[i]);
            jlm_engine_rewind(ec, 0);
            int32_t tok[3] = {1, 10, 20};
            uint32_t n = 3;
            for (int step = 0; step < 3; step++) {
                jlm_err e1 = {0}, e2 = {0};
                cr_assert_eq(jlm_engine_eval(ec, tok, n, lc, &e1), 0, "%s", e1.msg);
                cr_assert_eq(jlm_engine_eval(ev, tok, n, lv, &e2), 0, "%s", e2.msg);
                float mx = 0, d = 0, margin;
                for (uint32_t i = 0; i < nv; i++) {
                    mx = fmaxf(mx, fabsf(lc[i]));
                    d = fmaxf(d, fabsf(lc[i] - lv[i]));
                }
                cr_assert(d <= dev_cpu_tol(MATRIX[m], o.backend) * mx, "%s (%s), step %d: logits differ by %g (largest %g)",
                          MATRIX[m], what, step, d, mx);
                int ic = argmax2(lc, nv, &margin), iv;
                float mv;
                iv = argmax2(lv, nv, &mv);
                if (margin > 2 * d)
                    cr_assert_eq(ic, iv, "%s (%s), step %d: id %d vs the CPU's %d (margin %g)", MATRIX[m], what,
                                 step, iv, ic, margin);
                tok[0] = ic;   /* the CPU's pick, fed to both */
                n = 1;
            }
            check(ev, MATRIX[m], &cfgs[cfg], cfg, before, 3);
            jlm_engine_close(ev);
        }
        free(lc);
        free(lv);
        jlm_engine_close(ec);
        free(path);
    }
    cr_assert(n_oracle >= n_cfg * 20, "only %d oracle comparisons", n_oracle);
    tu_rmrf(dir);
    free(dir);
}

/* The number after name in line (a --stats line); fails the test without it. */
static inline unsigned long long bm_field(const char *line, const char *name)
{
    const char *p = strstr(line, name);
    cr_assert(p, "no '%s' in %s", name, line);
    return strtoull(p + strlen(name), NULL, 10);
}

/* Backends whose page-ins can run ahead on a copy thread (jlm_dev_prefetch). */
static int bm_prefetches(const char *backend) { return !strcmp(backend, "cuda"); }

/* bm_every_model_matches_the_cpu's checks: matmuls on the device, none
 * fell back, none found its planes outside the pinned device frames (an
 * expert used without its page on the device); at one frame each side (cfg 2) evictions counted on both
 * sides, i.e. pages read again; at two device frames (cfg 3) the next
 * block went up while this one computed. */
static void bm_one_device_check(jlm_engine *ev, const char *model, const bm_cfg *cfg, int cfg_i,
                                const jlm_dev_stats *before, int steps)
{
    jlm_dev_stats ds;
    jlm_engine_dev_stats(ev, &ds);
    cr_assert(ds.matmuls > 0 && ds.fallbacks == 0, "%s (%s): %llu matmuls on the device, %llu fell back to the CPU",
              model, cfg->what, (unsigned long long)ds.matmuls, (unsigned long long)ds.fallbacks);
    cr_assert(ds.reuploads == 0, "%s (%s): %llu matmuls found their planes in no pinned device frame", model,
              cfg->what, (unsigned long long)ds.reuploads);
    uint32_t nb = jlm_engine_model(ev)->hdr.n_blocks;
    if (cfg_i == 2 && nb > 1) {
        jlm_pager_counters pc;
        jlm_pager_stats(jlm_engine_pager(ev), &pc);
        uint64_t host_in = pc.a[0].page_ins + pc.a[0].fills;
        cr_assert(ds.evictions > 0 && ds.page_ins > nb, "%s (%s): device %llu page-ins, %llu evictions for %u blocks",
                  model, cfg->what, (unsigned long long)ds.page_ins, (unsigned long long)ds.evictions, nb);
        cr_assert(host_in > nb, "%s (%s): host %llu page-ins + fills for %u blocks over 4 evaluations", model,
                  cfg->what, (unsigned long long)host_in, nb);
    }
    if (cfg_i == 3 && nb > 2)
        cr_assert(ds.prefetches >= nb && ds.evictions > 0,
                  "%s (%s): %llu prefetches, %llu evictions for %u blocks over 4 evaluations", model, cfg->what,
                  (unsigned long long)ds.prefetches, (unsigned long long)ds.evictions, nb);
}

/* Whole, --gpu-layers 2 (split), --budget 1 --gpu-budget 1 (both raised
 * to one frame plus the routed experts: every token pages every block in
 * again on both sides) and, backends with a copy thread (prefetch),
 * --gpu-budget of two block frames plus the routed experts (every token
 * pages the blocks in again on the device, each while the block before it
 * computes). Skips (one line) when backend has no device. */
static inline void bm_every_model_matches_the_cpu(const char *backend)
{
    char w[4][96];
    snprintf(w[0], sizeof w[0], "%s", backend);
    snprintf(w[1], sizeof w[1], "%s, --gpu-layers 2", backend);
    snprintf(w[2], sizeof w[2], "%s, one frame each side", backend);
    snprintf(w[3], sizeof w[3], "%s, two device frames (prefetch)", backend);
    const bm_cfg cfgs[4] = {
        {w[0], {.backend = backend, .device = "0"}, {0}},
        {w[1], {.backend = backend, .device = "0", .gpu_layers = 2}, {0}},
        {w[2], {.backend = backend, .device = "0", .budget = 1, .gpu_budget = 1}, {0}},
        {w[3], {.backend = backend, .device = "0"}, {2}},
    };
    bm_matrix(cfgs, bm_prefetches(backend) ? 4 : 3, bm_one_device_check);
}


/* The bytes a matmul's input rows take up to the device (quantized: k
 * codes, k/32 f32 scales, k/16 int16 sums, plus rec, the backend's record a
 * row; float: k f32) and its results down (rows f32). */
static uint64_t bm_act_up(const jlm_tensor *t, uint64_t rec)
{
    uint64_t k = jlm_tensor_k(t);
    return jlm_fmt_type_traits(t->type)->is_float ? 4 * k : rec + k + k / 8 + k / 8;
}

/* The tensor of (block, role) in m (fails the test without it). */
static const jlm_tensor *bm_tensor(const jlm_model *m, int32_t block, uint16_t role)
{
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++)
        if (m->tensors[i].block == block && m->tensors[i].role == role)
            return &m->tensors[i];
    cr_assert_fail("no tensor %u of block %d", role, block);
    return NULL;
}

/* `activations up U, down D` (backend.h act_up, act_down): a decoded token
 * with every block on the device moves exactly its matmuls' input rows up
 * and results down, counted at the copies: per layer Q/K/V (one upload when
 * multi, the backend's jlm_dev_matmul_multi, else one each), o, gate/up
 * (likewise), down, then the output matrix; rec: the backend's record a
 * row. The --stats line prints the same counters. */
static inline void bm_decode_activations(const char *backend, const char *device, uint64_t rec, int multi)
{
    char *dir = tu_tmpdir(), why[512];
    jlm_err err = {0};
    char *path = tu_convert("synth-llama-256.Q4_K_M.gguf", dir, "m.jlm", &err);
    cr_assert(path, "%s", err.msg);
    jlm_engine *e = bm_open_opts(path, (jlm_engine_opts){.backend = backend, .device = device}, 1, why, sizeof why);
    if (!e) {
        free(path);
        tu_rmrf(dir);
        free(dir);
        cr_skip_test("%s", why);
    }
    const jlm_model *m = jlm_engine_model(e);
    uint32_t L = m->config.n_layer, nv = jlm_engine_n_vocab(e);
    float *lg = malloc(nv * 4);
    int32_t tok[3] = {5, 17, 2};
    cr_assert_eq(jlm_engine_eval(e, tok, 3, lg, &err), 0, "%s", err.msg);
    jlm_dev_stats s0, s1;
    jlm_engine_dev_stats(e, &s0);
    cr_assert_eq(jlm_engine_eval(e, tok, 1, lg, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(e, &s1);
    uint64_t up = 0, down = 0;
    for (uint32_t l = 0; l < L; l++) {
        static const uint16_t ROLES[] = {JLM_R_ATTN_Q, JLM_R_ATTN_K, JLM_R_ATTN_V, JLM_R_ATTN_OUT,
                                         JLM_R_FFN_GATE, JLM_R_FFN_UP, JLM_R_FFN_DOWN};
        for (int r = 0; r < 7; r++) {
            const jlm_tensor *t = bm_tensor(m, (int32_t)l, ROLES[r]);
            int shares = multi && (r == 1 || r == 2 || r == 5);   /* K, V after Q; up after gate */
            up += shares ? 0 : bm_act_up(t, rec);
            down += 4 * jlm_tensor_rows(t);
        }
    }
    const jlm_tensor *out = NULL;
    for (uint32_t i = 0; i < m->hdr.n_tensors && !out; i++)
        if (m->tensors[i].block < 0 && m->tensors[i].role == JLM_R_OUTPUT)
            out = &m->tensors[i];
    out = out ? out : bm_tensor(m, -1, JLM_R_TOKEN_EMBD);   /* tied */
    up += bm_act_up(out, rec);
    down += 4 * jlm_tensor_rows(out);
    cr_assert_eq(s1.fallbacks, 0);
    cr_assert_eq(s1.act_up - s0.act_up, up, "%s: activations up %llu, want %llu", backend,
                 (unsigned long long)(s1.act_up - s0.act_up), (unsigned long long)up);
    cr_assert_eq(s1.act_down - s0.act_down, down, "%s: activations down %llu, want %llu", backend,
                 (unsigned long long)(s1.act_down - s0.act_down), (unsigned long long)down);
    jlm_engine_close(e);
    /* the CLI's --stats line carries them */
    char cmd[4096], *txt = NULL;
    snprintf(cmd, sizeof cmd, "{ JLM_CUDA_EMULATE=1 %s run %s --ids 5,17,2 -n 2 --temp 0 --backend %s%s%s --stats "
             ">/dev/null; }", tu_jlm(), path, backend, device ? " --device " : "", device ? device : "");
    cr_assert_eq(tu_run(cmd, &txt), 0, "%s", txt);
    char want[32];
    snprintf(want, sizeof want, "\n%s: matmuls ", backend);
    const char *ln = strstr(txt, want);
    cr_assert(ln, "%s", txt);
    cr_assert_gt(bm_field(ln, "activations up "), 0, "%s", ln);
    cr_assert_gt(bm_field(ln, ", down "), 0, "%s", ln);
    free(txt);
    free(lg);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* Greedy ids after prompt; the logits after the prompt into first. */
static inline void bm_greedy_ids(jlm_engine *e, const int32_t *prompt, size_t np, int n, int32_t *out, float *first)
{
    uint32_t nv = jlm_engine_n_vocab(e);
    float *l = malloc(nv * sizeof *l);
    jlm_err err = {0};
    cr_assert_eq(jlm_engine_eval(e, prompt, (uint32_t)np, l, &err), 0, "%s", err.msg);
    memcpy(first, l, nv * sizeof *l);
    for (int i = 0; i < n; i++) {
        int32_t best = 0;
        for (uint32_t j = 1; j < nv; j++)
            if (l[j] > l[best])
                best = (int32_t)j;
        out[i] = best;
        if (i + 1 < n)
            cr_assert_eq(jlm_engine_eval(e, &best, 1, l, &err), 0, "%s", err.msg);
    }
    free(l);
}

/* The next MoE block's experts predicted on the device as the CPU predicts
 * them (docs/pager.md, Reading ahead): ev's counts (jlm_engine_predict_stats,
 * after the same run as pc's) equal to the CPU's pc: the predictions the
 * gate let through and their hits; with all, every count (the reads and the
 * ones held depend on which experts are resident: equal where the budget
 * holds them all). */
static inline void bm_same_predictions(const jlm_engine *ev, const jlm_engine_predict *pc, int all, const char *model,
                                       const char *what)
{
    jlm_engine_predict pv;
    jlm_engine_predict_stats(ev, &pv);
    cr_assert(pv.predicted == pc->predicted && pv.hits == pc->hits &&
                  (!all || (pv.reads == pc->reads && pv.used == pc->used && pv.wasted_bytes == pc->wasted_bytes &&
                            pv.held == pc->held)),
              "%s (%s): predicted %llu, hits %llu, reads %llu, used %llu, wasted %llu B, held %llu; the CPU's %llu, "
              "%llu, %llu, %llu, %llu B, %llu",
              model, what, (unsigned long long)pv.predicted, (unsigned long long)pv.hits, (unsigned long long)pv.reads,
              (unsigned long long)pv.used, (unsigned long long)pv.wasted_bytes, (unsigned long long)pv.held,
              (unsigned long long)pc->predicted, (unsigned long long)pc->hits, (unsigned long long)pc->reads,
              (unsigned long long)pc->used, (unsigned long long)pc->wasted_bytes, (unsigned long long)pc->held);
}

/* The read-ahead's gate on a device (its MoE blocks ask the CPU's
 * jlm_stream_predict_now where the CPU asks it): qwen3moe Q8_0 at a
 * --budget holding the blocks and a third of the experts (tests/moe_budget.h,
 * the moe suite's gate test), where the gate shuts and samples one block in
 * PRED_SAMPLE: 8 greedy tokens (later ones part at near-ties within the
 * quantized tolerance) give the CPU's ids and as many predictions and hits
 * as the CPU's, fewer than its unlimited run's (a device that ignores the
 * gate predicts 14 where the CPU predicts 4). The reads and the ones held
 * are not compared: they follow which experts are resident, and a device
 * engine's host frames differ from the CPU engine's (olmoe's gate learns
 * from other candidates there). Skipped without a device. */
static inline void bm_moe_gate(const char *backend)
{
    static const int32_t prompt[5] = {1, 403, 407, 261, 378};
    enum { NG = 8 };
    const char *model = "synth-qwen3moe-256.Q8_0";
    char *dir = tu_tmpdir(), why[512];
    jlm_err err = {0};
    char *path = tu_convert("synth-qwen3moe-256.Q8_0.gguf", dir, "moe.jlm", &err);
    cr_assert(path, "%s", err.msg);
    jlm_engine *e = bm_open_opts(path, (jlm_engine_opts){.backend = "cpu"}, 0, NULL, 0);
    float *l = malloc(jlm_engine_n_vocab(e) * 4);
    int32_t ic[NG], iv[NG];
    bm_greedy_ids(e, prompt, 5, NG, ic, l);
    jlm_engine_predict pu, ps;   /* unlimited (the gate open throughout), at the budget */
    jlm_engine_predict_stats(e, &pu);
    uint64_t budget = tb_third_of_the_experts(e);
    jlm_engine_close(e);
    e = bm_open_opts(path, (jlm_engine_opts){.backend = "cpu", .budget = budget}, 0, NULL, 0);
    bm_greedy_ids(e, prompt, 5, NG, ic, l);
    jlm_engine_predict_stats(e, &ps);
    cr_assert(ps.predicted > 0 && ps.predicted < pu.predicted, "%s: the CPU predicted %llu, %llu unlimited", model,
              (unsigned long long)ps.predicted, (unsigned long long)pu.predicted);
    jlm_engine_close(e);
    e = bm_open_opts(path, (jlm_engine_opts){.backend = backend, .device = "0", .budget = budget}, 1, why, sizeof why);
    if (!e) {
        tu_rmrf(dir);
        cr_skip_test("%s: no device (%s)", backend, why);
    }
    bm_greedy_ids(e, prompt, 5, NG, iv, l);
    cr_assert(!memcmp(ic, iv, sizeof ic), "%s (%s): greedy ids differ from the CPU's", model, backend);
    jlm_dev_stats ds;
    jlm_engine_dev_stats(e, &ds);
    cr_assert(ds.fallbacks == 0, "%s (%s): %llu matmuls refused", model, backend, (unsigned long long)ds.fallbacks);
    bm_same_predictions(e, &ps, 0, model, backend);
    jlm_engine_close(e);
    free(l);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* One lockstep step: the device's logits lv within tol of the largest
 * |logit| of the CPU's lc, and the same pick wherever the CPU's top-2 margin
 * exceeds twice the difference. Returns the CPU's pick (the next id fed). */
static inline int32_t bm_lockstep_pick(const float *lc, const float *lv, uint32_t nv, double tol, const char *label)
{
    float mx = 0, d = 0, margin, mv;
    for (uint32_t i = 0; i < nv; i++) {
        mx = fmaxf(mx, fabsf(lc[i]));
        d = fmaxf(d, fabsf(lc[i] - lv[i]));
    }
    cr_assert(d <= tol * mx, "%s: logits differ by %g (largest %g)", label, d, mx);
    int pc = argmax2(lc, nv, &margin), pv = argmax2(lv, nv, &mv);
    cr_assert(pc == pv || margin <= 2 * d, "%s: picks %d and %d, margin %g, difference %g", label, pc, pv, margin, d);
    return pc;
}

/* Both engines rewound, then the prompt and 8 steps of the CPU's greedy
 * ids fed to both, each step through bm_lockstep_pick. Returns the CPU's
 * last pick (not yet fed). */
static inline int32_t bm_lockstep(jlm_engine *ec, jlm_engine *ev, const int32_t *prompt, uint32_t np, double tol,
                                  const char *model, const char *what)
{
    uint32_t nv = jlm_engine_n_vocab(ec);
    float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
    jlm_err err = {0};
    jlm_engine_rewind(ec, 0);
    jlm_engine_rewind(ev, 0);
    const int32_t *tok = prompt;
    int32_t next = 0;
    uint32_t n = np;
    for (int step = 0; step < 8; step++) {
        cr_assert_eq(jlm_engine_eval(ec, tok, n, lc, &err), 0, "%s", err.msg);
        cr_assert_eq(jlm_engine_eval(ev, tok, n, lv, &err), 0, "%s", err.msg);
        char label[256];
        snprintf(label, sizeof label, "%s (%s), step %d", model, what, step);
        next = bm_lockstep_pick(lc, lv, nv, tol, label);
        tok = &next;
        n = 1;
    }
    free(lc);
    free(lv);
    return next;
}

/* The prompt of the whole-block checks (bm_cpu_ids, bm_device_run). */
static const int32_t BM_PROMPT[5] = {1, 10, 20, 30, 40};

/* name.gguf converted into dir (as file out; *path, the caller frees it),
 * and the CPU's engine on it (kv: its --kv, NULL: the default) with its 8
 * greedy ids after BM_PROMPT in ic. */
static inline jlm_engine *bm_cpu_ids(const char *dir, const char *name, const char *out, const char *kv, char **path,
                                     int32_t ic[8])
{
    char gguf[256];
    jlm_err err = {0};
    snprintf(gguf, sizeof gguf, "%s.gguf", name);
    *path = tu_convert(gguf, dir, out, &err);
    cr_assert(*path, "%s", err.msg);
    jlm_engine *ec = bm_open_opts(*path, (jlm_engine_opts){.backend = "cpu", .kv = kv}, 0, NULL, 0);
    float *l = malloc(jlm_engine_n_vocab(ec) * sizeof *l);
    bm_greedy_ids(ec, BM_PROMPT, 5, 8, ic, l);
    free(l);
    return ec;
}

/* Device engine ev against ec, the CPU's on the same file, after
 * BM_PROMPT: its 8 greedy ids are ic, the CPU's (ic NULL: not compared),
 * its logits within tol of the CPU's (bm_lockstep), then the CPU's next id
 * decoded on ev. Returns that token's round trips; before, after (before
 * may be NULL): ev's counters before and after it. */
static inline uint64_t bm_device_run(jlm_engine *ec, jlm_engine *ev, const int32_t *ic, double tol, const char *model,
                                     const char *what, jlm_dev_stats *before, jlm_dev_stats *after)
{
    float *l = malloc(jlm_engine_n_vocab(ev) * sizeof *l);
    jlm_err err = {0};
    if (ic) {
        int32_t iv[8];
        bm_greedy_ids(ev, BM_PROMPT, 5, 8, iv, l);
        cr_assert(!memcmp(ic, iv, sizeof iv), "%s (%s): greedy ids differ from the CPU's", model, what);
    }
    int32_t next = bm_lockstep(ec, ev, BM_PROMPT, 5, tol, model, what);
    jlm_dev_stats s0;
    jlm_engine_dev_stats(ev, before ? before : &s0);
    if (before) s0 = *before;
    cr_assert_eq(jlm_engine_eval(ev, &next, 1, l, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(ev, after);
    free(l);
    return after->waits - s0.waits;
}

/* Each of ev's `on` device layers' attn_k_b and attn_v_b sheets (latent
 * attention): one batched matvec each for all heads and rows, a prompt's
 * and a decoded token's alike (a matvec a head made 2 n_head a layer);
 * jlm_dev_stats.sheet_matvecs, Vulkan's and CUDA's alike. */
static inline void bm_sheet_matvecs(jlm_engine *ev, uint32_t on, const char *model, const char *what)
{
    uint32_t nv = jlm_engine_n_vocab(ev), nh = jlm_engine_model(ev)->config.n_head;
    float *lg = malloc((uint64_t)nv * 5 * 4);
    jlm_dev_stats s0, s1, s2;
    jlm_err err = {0};
    jlm_engine_rewind(ev, 0);
    jlm_engine_dev_stats(ev, &s0);
    cr_assert_eq(jlm_engine_eval(ev, BM_PROMPT, 5, lg, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(ev, &s1);
    cr_assert_eq(jlm_engine_eval(ev, BM_PROMPT, 1, lg, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(ev, &s2);
    cr_assert(nh > 1);
    cr_assert(s1.sheet_matvecs - s0.sheet_matvecs == 2ull * on && s2.sheet_matvecs - s1.sheet_matvecs == 2ull * on,
              "%s (%s): sheet matvecs: %llu for the prompt, %llu for a decoded token (%u device layers, %u heads; "
              "want 2 a layer)", model, what, (unsigned long long)(s1.sheet_matvecs - s0.sheet_matvecs),
              (unsigned long long)(s2.sheet_matvecs - s1.sheet_matvecs), on, nh);
    free(lg);
}

/* Whole blocks on backend's device (engine/exec_vk.c, engine/exec_cu.c):
 * stories260K, every synth-llama type, and qwen2 (biases), qwen3 (per-head
 * q/k norms) and phi3, whole and at --gpu-layers 2, against the CPU with the
 * CPU's greedy ids fed to both for 8 steps after a prompt: logits within 5e-4
 * of the largest on float weights (the CPU's FMA kernels) and the same greedy
 * ids as the CPU's own run; on quantized weights within the quantized
 * tolerance against llama.cpp (0.05, Q2_K 0.12: an int8 code one off,
 * dev_cpu_tol) and the same pick wherever the CPU's top-2 margin exceeds
 * twice the difference. And a decoded token is one round trip (the blocks,
 * and the output matrix when it is there: one command buffer on Vulkan, one
 * stream synchronize on CUDA). Skips without a device. */
static inline void bm_whole_blocks(const char *backend)
{
    static const char *MODELS[] = {"stories260K", "synth-llama-256.f32", "synth-llama-256.Q4_K_M",
                                   "synth-llama-256.Q8_0", "synth-llama-256.Q4_0", "synth-llama-256.Q4_1",
                                   "synth-llama-256.Q5_0", "synth-llama-256.Q5_1", "synth-llama-256.Q2_K",
                                   "synth-llama-256.Q3_K_M", "synth-llama-256.Q5_K_M", "synth-llama-256.Q6_K",
                                   "synth-llama-256.MXFP4", "synth-qwen2-256.Q8_0", "synth-qwen3-256.Q8_0",
                                   "synth-phi3-256.Q4_K_M"};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        char *path;
        int32_t ic[8];
        jlm_engine *ec = bm_cpu_ids(dir, MODELS[m], "w.jlm", NULL, &path, ic);
        int fl = m < 2;
        double tol = fl ? 5e-4 : strstr(MODELS[m], "Q2_K") ? 0.12 : 0.05;
        for (int split = 0; split < 2; split++) {
            char why[512];
            jlm_engine *ev = bm_open_opts(path, (jlm_engine_opts){.backend = backend, .device = "0",
                                          .gpu_layers = split ? 2 : 0}, 1, why, sizeof why);
            if (!ev) {
                tu_rmrf(dir);
                cr_skip_test("%s: no device (%s)", backend, why);
            }
            const char *what = split ? "--gpu-layers 2" : "whole";
            jlm_dev_stats s1;
            uint64_t trips = bm_device_run(ec, ev, fl ? ic : NULL, tol, MODELS[m], what, NULL, &s1);
            cr_assert_eq(trips, 1, "%s (%s, %s): a decoded token made %llu round trips", MODELS[m], backend, what,
                         (unsigned long long)trips);
            jlm_engine_close(ev);
        }
        jlm_engine_close(ec);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* An engine on backend (device "0") at gpu_layers with --kv kv; NULL when
 * a device backend has no device. */
static inline jlm_engine *bm_engine_kv(const char *path, const char *backend, uint32_t gpu_layers, const char *kv)
{
    char why[512], kk[16] = "", *vv = NULL;
    if (kv && strchr(kv, '/') && strlen(kv) < sizeof kk) {   /* "K/V": the keys' type, the values' */
        strcpy(kk, kv);
        vv = strchr(kk, '/');
        *vv++ = 0;
    }
    jlm_engine_opts o = {.backend = backend, .device = "0", .gpu_layers = gpu_layers, .kv = vv ? NULL : kv,
                         .kv_k = vv ? kk : NULL, .kv_v = vv};
    return bm_open_opts(path, o, strcmp(backend, "cpu") != 0, why, sizeof why);
}

/* The n tokens of prompt evaluated one at a time on e (rewound first) end
 * with pre, the logits of e's n-row prefill of them, bit for bit: each row
 * of a prefill computed as a one-row batch computes it (model, kv: the
 * label). */
static inline void bm_prefill_as_one_row_at_a_time(jlm_engine *e, const int32_t *prompt, uint32_t n, const float *pre,
                                                   const char *model, const char *kv)
{
    uint32_t nv = jlm_engine_n_vocab(e);
    float *one = malloc(nv * 4);
    jlm_err err = {0};
    jlm_engine_rewind(e, 0);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(jlm_engine_eval(e, &prompt[i], 1, one, &err), 0, "%s", err.msg);
    cr_assert(!memcmp(pre, one, nv * 4), "%s (%s cache): the prefill's logits differ from one row at a time", model,
              kv);
    free(one);
}

/* gemma3 on whole blocks (sliding-window layers, their own RoPE base, the
 * fp16-table GELU gate, the post-norms) with each KV cache type of kvs
 * ("f16", "q8_0", "K/V" for keys and values apart) on the device, each
 * against the CPU with the same --kv, whole and at --gpu-layers 2: a
 * 20-token prompt and 12 more (past the test models' window of 16). The
 * quantized gemma3 models and stories260K give the CPU's greedy ids (one
 * type for keys and values; mixed types sit on these random models'
 * near-ties, so they are held to the logits); every
 * model, fed the CPU's ids, gives logits within the whole-block tolerance
 * (5e-4 of the largest on float weights, 0.05 quantized; at least the
 * CPU's own tolerance of the cache type) with the same pick
 * wherever the CPU's margin exceeds twice the difference; and a decoded
 * token is one round trip (gemma3v's 514 logits included: the output's rows
 * need no aligned binding) with activations up + down of at most its
 * embedding, its logits and 4 KiB. Shared by vulkan and cuda. */
static inline void bm_whole_blocks_gemma3(const char *backend, const char *const *kvs, size_t nkv)
{
    static const struct { const char *name; int greedy; double tol; } MODELS[] = {
        {"synth-gemma3-256.Q8_0", 1, 0.05}, {"synth-gemma3-256.Q4_K_M", 1, 0.05},
        {"synth-gemma3v-128.F32", 0, 5e-4}, {"stories260K", 1, 5e-4}};
    enum { NP = 20, NG = 12 };
    int32_t prompt[NP], ic[NG], iv[NG];
    for (int i = 0; i < NP; i++)
        prompt[i] = 1 + 4 * i;
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        char gguf[256];
        jlm_err err = {0};
        snprintf(gguf, sizeof gguf, "%s.gguf", MODELS[m].name);
        char *path = tu_convert(gguf, dir, "g.jlm", &err);
        cr_assert(path, "%s", err.msg);
        for (size_t ki = 0; ki < nkv; ki++) {
            const char *kv = kvs[ki];
            if ((!strcmp(kv, "f32") || strstr(kv, "q8_0")) && !strcmp(MODELS[m].name, "stories260K"))
                continue;   /* F32 caches: whole_blocks_on_the_device_give_the_cpus_ids_...; Q8_0: its head
                             * dimension (8) is no whole block, the CPU refuses it too */
            jlm_engine *ec = bm_engine_kv(path, "cpu", 0, kv);
            const jlm_model *md = jlm_engine_model(ec);
            uint64_t E = md->config.n_embd;
            uint32_t nv = jlm_engine_n_vocab(ec);
            float *lc = malloc(nv * 8), *lv = lc + nv;   /* the CPU's logits, the device's */
            if (MODELS[m].greedy)
                bm_greedy_ids(ec, prompt, NP, NG, ic, lc);
            for (int split = 0; split < 2; split++) {
                jlm_engine *ev = bm_engine_kv(path, backend, split ? 2 : 0, kv);
                if (!ev) {
                    tu_rmrf(dir);
                    cr_skip_test("%s: no device", backend);
                }
                const char *what = split ? "--gpu-layers 2" : "whole";
                if (MODELS[m].greedy && !strchr(kv, '/')) {   /* mixed types: near-ties, the logits only */
                    bm_greedy_ids(ev, prompt, NP, NG, iv, lv);
                    cr_assert(!memcmp(ic, iv, sizeof ic), "%s --kv %s (%s): greedy ids differ", MODELS[m].name, kv,
                              what);
                    jlm_engine_rewind(ev, 0);
                }
                jlm_engine_rewind(ec, 0);
                const int32_t *tok = prompt;
                int32_t next;
                uint32_t n = NP;
                for (int step = 0; step < NG; step++) {
                    jlm_dev_stats s0, s1;
                    jlm_engine_dev_stats(ev, &s0);
                    cr_assert_eq(jlm_engine_eval(ec, tok, n, lc, &err), 0, "%s", err.msg);
                    cr_assert_eq(jlm_engine_eval(ev, tok, n, lv, &err), 0, "%s", err.msg);
                    jlm_engine_dev_stats(ev, &s1);
                    /* an F16 cache on float weights: the K/V rows' last f32 bits (norms, RoPE inputs)
                     * can put an element one half-ulp (2^-11 relative) off the CPU's: the CPU's own F16
                     * tolerance (2e-3, test_engine.c); a Q8_0 cache one step of 1/127 of its block's
                     * largest: the CPU's own Q8_0 tolerance (3e-2, test_kv.c) */
                    double fl = strstr(kv, "q8_0") ? 3e-2 : strcmp(kv, "f32") ? 2e-3 : 0;
                    double tol = MODELS[m].tol < fl ? fl : MODELS[m].tol;
                    char label[256];
                    snprintf(label, sizeof label, "%s --kv %s (%s), step %d", MODELS[m].name, kv, what, step);
                    int32_t pc = bm_lockstep_pick(lc, lv, nv, tol, label);
                    unsigned long long rt = s1.waits - s0.waits, act = s1.act_up + s1.act_down - s0.act_up - s0.act_down;
                    cr_assert(step == 0 || rt == 1, "%s --kv %s (%s), step %d: %llu round trips",
                              MODELS[m].name, kv, what, step, rt);
                    cr_assert(step == 0 || act <= E * 4 + (uint64_t)nv * 4 + 4096,
                              "%s --kv %s (%s), step %d: %llu activation bytes (embedding %llu, logits %llu)",
                              MODELS[m].name, kv, what, step, act, (unsigned long long)E * 4, (unsigned long long)nv * 4);
                    next = pc;
                    tok = &next;
                    n = 1;
                }
                jlm_engine_close(ev);
            }
            free(lc);
            jlm_engine_close(ec);
        }
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* From --stats (the numbers a user sees) on backend (devarg: its --device
 * option; CLI defaults, so --kv auto, whose cache type the KV line must
 * name: kv): with --gpu-layers all a decoded token costs one round trip (at
 * most one a block: the bound; the goal, one a token, is what is
 * tested; a MoE model, moe if not NULL, one a block, for its router's
 * picks, plus one) and activations up + down of at most its embedding in,
 * its logits out and 4 KiB (the positions' RoPE cos/sin and a MoE block's
 * picks within it), from the difference of a 4-token and a 12-token run.
 * The same runs with knob=0 (the matmul offload) cost at least
 * offload_per_layer round trips a layer: what the counters are compared
 * with. */
static inline void bm_stats_decoded_token(const char *backend, const char *knob, const char *devarg,
                                          int offload_per_layer, const char *moe, const char *kv)
{
    const char *MODELS[] = {"stories260K", "synth-llama-256.Q4_K_M", moe};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < 3 && MODELS[m]; m++) {
        char gguf[256], cmd[2048];
        jlm_err err = {0};
        snprintf(gguf, sizeof gguf, "%s.gguf", MODELS[m]);
        char *path = tu_convert(gguf, dir, "s.jlm", &err);
        cr_assert(path, "%s", err.msg);
        jlm_engine *ec = bm_open_opts(path, (jlm_engine_opts){.backend = "cpu"}, 0, NULL, 0);
        const jlm_model *md = jlm_engine_model(ec);
        uint64_t E = md->config.n_embd, L = md->config.n_layer, V = jlm_engine_n_vocab(ec);
        int is_moe = md->config.n_expert > 0;
        jlm_engine_close(ec);
        unsigned long long rt[2][2], act[2][2], gen[2][2];
        for (int blocks = 0; blocks < 2; blocks++)
            for (int r = 0; r < 2; r++) {
                char *out = NULL, want[32];
                snprintf(cmd, sizeof cmd, "%s=%d %s run %s --ids 1,2,3 -n %d --print-ids --backend %s %s "
                         "--gpu-layers all --stats --seed 1", knob, blocks, tu_jlm(), path, r ? 12 : 4, backend, devarg);
                int rc = tu_run(cmd, &out);
                if (rc && strstr(out, "no device")) {
                    free(out);
                    tu_rmrf(dir);
                    cr_skip_test("%s: no device", backend);
                }
                cr_assert_eq(rc, 0, "%s", out);
                snprintf(want, sizeof want, "\n%s: matmuls ", backend);
                const char *vl = strstr(out, want), *kl = strstr(out, ", KV ");
                cr_assert(vl, "%s", out);
                snprintf(want, sizeof want, " (%s),", kv);
                cr_assert(kl && strstr(kl, want) == strchr(kl + 5, ' '), "--kv auto on %s keeps %s: %s", backend, kv,
                          out);   /* the whole blocks' cache type on the device */
                const char *g = strstr(out, "\"generated\": [");
                cr_assert(g, "%s", out);
                gen[blocks][r] = 1;
                for (g += 14; *g && *g != ']'; g++)
                    gen[blocks][r] += *g == ',';
                rt[blocks][r] = bm_field(vl, "round trips ");
                act[blocks][r] = bm_field(vl, "activations up ") + bm_field(vl, ", down ");
                free(out);
            }
        cr_assert(gen[1][1] > gen[1][0] && gen[0][1] > gen[0][0], "%s: %llu and %llu tokens", MODELS[m], gen[1][0],
                  gen[1][1]);
        double dn = (double)(gen[1][1] - gen[1][0]), per_rt = (rt[1][1] - rt[1][0]) / dn;
        double per_act = (act[1][1] - act[1][0]) / dn, off_rt = (rt[0][1] - rt[0][0]) / (double)(gen[0][1] - gen[0][0]);
        cr_assert(is_moe ? per_rt <= (double)L + 1 : per_rt <= 1.0 && per_rt <= (double)L,
                  "%s: %.2f round trips a decoded token (%llu blocks)", MODELS[m], per_rt, (unsigned long long)L);
        cr_assert(per_act <= (double)(E * 4 + V * 4 + 4096), "%s: %.0f activation bytes a token (embedding %llu, logits %llu)",
                  MODELS[m], per_act, (unsigned long long)(E * 4), (unsigned long long)(V * 4));
        cr_assert(off_rt >= offload_per_layer * (double)L, "%s: the matmul offload's %.2f round trips a token", MODELS[m],
                  off_rt);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

/* The engine's own sequence runs whole blocks with its cache on backend's
 * device; a jlm_engine_seq (serve's slots) keeps its host cache and the
 * matmul offload. Interleaved on one engine, token by token, both give the
 * CPU's logits for the same ids within 1e-4 of the largest (the residual
 * rows and the queued work are handed over between them), and the default
 * sequence's tokens are one round trip each, the other's one a matmul (or a
 * few matmuls). Skips without a device. */
static inline void bm_seq_interleave(const char *backend)
{
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *path = tu_convert("stories260K.gguf", dir, "s.jlm", &err);
    cr_assert(path, "%s", err.msg);
    char why[512];
    jlm_engine *ec = bm_open_opts(path, (jlm_engine_opts){.backend = "cpu"}, 0, NULL, 0);
    jlm_engine *ev = bm_open_opts(path, (jlm_engine_opts){.backend = backend, .device = "0"}, 1, why, sizeof why);
    if (!ev) {
        tu_rmrf(dir);
        cr_skip_test("%s: no device (%s)", backend, why);
    }
    uint32_t nv = jlm_engine_n_vocab(ec);
    float *lc = malloc(nv * 4), *la = malloc(nv * 4), *lb = malloc(nv * 4);
    jlm_engine_seq *s = NULL;
    cr_assert_eq(jlm_engine_seq_create(ev, &s, &err), 0, "%s", err.msg);
    int32_t ids[6] = {1, 403, 407, 261, 378, 432};
    for (int t = 0; t < 6; t++) {
        jlm_dev_stats s0, s1, s2;
        cr_assert_eq(jlm_engine_eval(ec, &ids[t], 1, lc, &err), 0, "%s", err.msg);
        jlm_engine_dev_stats(ev, &s0);
        cr_assert_eq(jlm_engine_eval(ev, &ids[t], 1, la, &err), 0, "%s", err.msg);
        jlm_engine_dev_stats(ev, &s1);
        cr_assert_eq(jlm_engine_eval_seq(ev, s, &ids[t], 1, lb, &err), 0, "%s", err.msg);
        jlm_engine_dev_stats(ev, &s2);
        float mx = 0, da = 0, db = 0;
        for (uint32_t i = 0; i < nv; i++) {
            mx = fmaxf(mx, fabsf(lc[i]));
            da = fmaxf(da, fabsf(lc[i] - la[i]));
            db = fmaxf(db, fabsf(lc[i] - lb[i]));
        }
        cr_assert(da <= 1e-4f * mx && db <= 1e-4f * mx, "%s, token %d: the engine's sequence's logits differ by %g, "
                  "a jlm_engine_seq's by %g (largest %g)", backend, t, da, db, mx);
        cr_assert(s1.waits - s0.waits == 1 && s2.waits - s1.waits == 1, "%s, token %d: round trips %llu and %llu", backend, t,
                  (unsigned long long)(s1.waits - s0.waits), (unsigned long long)(s2.waits - s1.waits));
    }
    jlm_engine_seq_destroy(s);
    free(lc);
    free(la);
    free(lb);
    jlm_engine_close(ec);
    jlm_engine_close(ev);
    free(path);
    tu_rmrf(dir);
    free(dir);
}


/* logits l of a device against the CPU's c (nv of them): within tol of the
 * largest, and the same pick where the CPU's margin exceeds twice that */
static inline void bm_seq_close(const float *c, const float *l, uint32_t nv, float tol, const char *what, int s,
                                uint32_t pos)
{
    float mx = 0, d = 0;
    for (uint32_t i = 0; i < nv; i++) {
        mx = fmaxf(mx, fabsf(c[i]));
        d = fmaxf(d, fabsf(c[i] - l[i]));
    }
    cr_assert(d <= tol * mx, "%s: sequence %d at %u: the logits differ by %g (largest %g)", what, s, pos, d, mx);
    float mc, ml;
    int ic = argmax2(c, nv, &mc), il = argmax2(l, nv, &ml);
    cr_assert(ic == il || mc <= 2 * d, "%s: sequence %d at %u: id %d, the CPU's %d (its margin %g)", what, s, pos, il,
              ic, mc);
}

/* Three sequences (jlm_engine_seq) of different prompt lengths on backend's whole
 * blocks (model, --kv kv, at gpu_layers, 0: all; --gpu-budget gpu_budget,
 * 0: the default) give the ids and logits (within
 * tol of the largest) of the same sequences run alone on the CPU: prefills
 * one by one, then 8 rounds of a token each, batched (jlm_engine_eval_batch)
 * or one sequence alone and the other two batched, sequence 2 rewound by 3
 * after round 4 and its 3 tokens evaluated again; a batched step of 3 is at
 * most max_trips round trips, its activations up + down at most its 3
 * embeddings, 3 rows of logits and 4 KiB; a prefix saved from sequence 0
 * and loaded into a fourth continues as sequence 0 (its cache came down for
 * the save and went up for the load: counted). Prints the batched steps'
 * totals (docs' measurements). */
static inline void bm_seq_batch(const char *backend, const char *model, const char *kv, uint32_t gpu_layers,
                                uint64_t gpu_budget, float tol, uint64_t max_trips)
{
    enum { NS = 3, ROUNDS = 8, MAXT = 16 };
    static const int32_t PROMPT[NS][MAXT] = {{1, 403, 407}, {1, 261, 378, 432, 300}, {1, 20, 30, 40, 50, 60, 70, 80}};
    static const uint32_t NP[NS] = {3, 5, 8};
    char *dir = tu_tmpdir(), what[96];
    jlm_err err = {0};
    char *path = tu_convert(model, dir, "s.jlm", &err);
    cr_assert(path, "%s", err.msg);
    snprintf(what, sizeof what, "%s, %s, --kv %s, gpu layers %u, gpu budget %llu", backend, model, kv, gpu_layers,
             (unsigned long long)gpu_budget);
    char why[512];
    jlm_engine *ec = bm_engine_kv(path, "cpu", 0, kv);
    jlm_engine *ev = bm_open_opts(path, (jlm_engine_opts){.backend = backend, .device = "0", .gpu_layers = gpu_layers,
                                                          .gpu_budget = gpu_budget, .kv = kv}, 1, why, sizeof why);
    if (!ev) {
        jlm_engine_close(ec);
        tu_rmrf(dir);
        cr_skip_test("%s: no device", backend);
    }
    uint32_t nv = jlm_engine_n_vocab(ec), E = jlm_engine_n_embd(ec);
    /* the CPU, each sequence alone: its tokens (prompt, then greedy) and the logits after each */
    int32_t tok[NS][MAXT + ROUNDS];
    float *ref = malloc((size_t)NS * (MAXT + ROUNDS) * nv * 4), *l = malloc((size_t)NS * nv * 4);
    for (int q = 0; q < NS; q++) {
        jlm_engine_seq *s;
        cr_assert_eq(jlm_engine_seq_create(ec, &s, &err), 0, "%s", err.msg);
        for (uint32_t j = 0; j < NP[q]; j++)
            tok[q][j] = PROMPT[q][j] % (int32_t)nv;
        for (uint32_t j = 0; j < NP[q] + ROUNDS; j++) {
            float *r = ref + ((size_t)q * (MAXT + ROUNDS) + j) * nv;
            cr_assert_eq(jlm_engine_eval_seq(ec, s, &tok[q][j], 1, r, &err), 0, "%s", err.msg);
            if (j + 1 < NP[q] + ROUNDS && j + 1 >= NP[q])
                tok[q][j + 1] = argmax2(r, nv, &(float){0});
        }
        jlm_engine_seq_destroy(s);
    }
#define BM_REF(q, j) (ref + ((size_t)(q) * (MAXT + ROUNDS) + (j)) * nv)
    jlm_engine_seq *sq[NS + 1];
    for (int q = 0; q <= NS; q++)
        cr_assert_eq(jlm_engine_seq_create(ev, &sq[q], &err), 0, "%s", err.msg);
    for (int q = 0; q < NS; q++) {
        cr_assert_eq(jlm_engine_eval_seq(ev, sq[q], tok[q], NP[q] - 1, l, &err), 0, "%s", err.msg);
        bm_seq_close(BM_REF(q, NP[q] - 2), l, nv, tol, what, q, NP[q] - 2);
    }
    uint64_t trips = 0, up = 0, down = 0, steps = 0;
    for (int r = 0; r < ROUNDS; r++) {
        jlm_engine_seq *bs[NS];
        int32_t bt[NS];
        int who[NS], nb = 0, alone = r % 3 == 1 ? r % NS : -1;
        for (int q = 0; q < NS; q++) {
            uint32_t j = jlm_engine_seq_n_past(sq[q]);
            if (q == alone) {
                cr_assert_eq(jlm_engine_eval_seq(ev, sq[q], &tok[q][j], 1, l, &err), 0, "%s", err.msg);
                bm_seq_close(BM_REF(q, j), l, nv, tol, what, q, j);
                continue;
            }
            bs[nb] = sq[q], bt[nb] = tok[q][j], who[nb++] = q;
        }
        jlm_dev_stats s0, s1;
        jlm_engine_dev_stats(ev, &s0);
        cr_assert_eq(jlm_engine_eval_batch(ev, bs, bt, (uint32_t)nb, l, &err), 0, "%s", err.msg);
        jlm_engine_dev_stats(ev, &s1);
        for (int b = 0; b < nb; b++) {
            uint32_t j = jlm_engine_seq_n_past(bs[b]) - 1;
            bm_seq_close(BM_REF(who[b], j), l + (size_t)b * nv, nv, tol, what, who[b], j);
        }
        if (nb == NS) {
            uint64_t w = s1.waits - s0.waits, a = (s1.act_up - s0.act_up) + (s1.act_down - s0.act_down);
            cr_assert(w <= max_trips, "%s, round %d: a batched step of %d made %llu round trips", what, r, NS,
                      (unsigned long long)w);
            cr_assert(a <= (uint64_t)NS * (E + nv) * 4 + 4096, "%s, round %d: activations %llu bytes", what, r,
                      (unsigned long long)a);
            trips += w, up += s1.act_up - s0.act_up, down += s1.act_down - s0.act_down, steps++;
        }
        if (r == 4) {   /* sequence 2 back by 3, the same tokens again */
            uint32_t j = jlm_engine_seq_n_past(sq[2]) - 3;
            jlm_engine_seq_rewind(sq[2], j);
            cr_assert_eq(jlm_engine_eval_seq(ev, sq[2], &tok[2][j], 3, l, &err), 0, "%s", err.msg);
            bm_seq_close(BM_REF(2, j + 2), l, nv, tol, what, 2, j + 2);
        }
    }
    fprintf(stderr, "%s: %llu batched steps of %d: round trips %llu, activations up %llu, down %llu\n", what,
            (unsigned long long)steps, NS, (unsigned long long)trips, (unsigned long long)up,
            (unsigned long long)down);
    /* a prefix of sequence 0 saved, loaded into the fourth: it goes on as sequence 0 */
    uint32_t n = NP[0] + 2, k = n - 1;
    void *buf = malloc(jlm_engine_kv_bytes(ev, n));
    jlm_dev_stats s0, s1, s2;
    jlm_engine_dev_stats(ev, &s0);
    cr_assert_eq(jlm_engine_kv_save(ev, sq[0], n, buf, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(ev, &s1);
    cr_assert_eq(jlm_engine_kv_load(ev, sq[NS], buf, n, k, &err), 0, "%s", err.msg);
    jlm_engine_dev_stats(ev, &s2);
    if (!gpu_layers)
        cr_assert(s1.act_down > s0.act_down && s2.act_up > s1.act_up, "%s: the prefix's copies are not counted",
                  what);
    for (uint32_t j = k; j < NP[0] + ROUNDS; j++) {
        cr_assert_eq(jlm_engine_eval_seq(ev, sq[NS], &tok[0][j], 1, l, &err), 0, "%s", err.msg);
        bm_seq_close(BM_REF(0, j), l, nv, tol, what, 0, j);
    }
#undef BM_REF
    free(buf);
    for (int q = 0; q <= NS; q++)
        jlm_engine_seq_destroy(sq[q]);
    free(ref);
    free(l);
    jlm_engine_close(ec);
    jlm_engine_close(ev);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* `jlm run --embeddings` (the pooled final hidden states) on backend
 * (devarg: its --device option) equals the CPU's within 5e-3 per element
 * (L2-normalised vectors; stories260K's F32 matvecs sum in another order
 * there), mean and last pooling: the rows a device's whole blocks hold come
 * back for the pooling. Skips without a device. */
static inline void bm_embeddings_match(const char *backend, const char *devarg)
{
    char *dir = tu_tmpdir(), cmd[4096];
    jlm_err err = {0};
    char *path = tu_convert("stories260K.gguf", dir, "s.jlm", &err);
    cr_assert(path, "%s", err.msg);
    for (int last = 0; last < 2; last++) {
        json_t *v[2];
        for (int dev = 0; dev < 2; dev++) {
            char *out = NULL;
            snprintf(cmd, sizeof cmd, "{ %s run %s -p 'hello world, once more' --embeddings --pooling %s%s%s%s "
                     "2>/dev/null; }", tu_jlm(), path, last ? "last" : "mean", dev ? " --backend " : "",
                     dev ? backend : "", dev ? devarg : "");
            int rc = tu_run(cmd, &out);
            if (rc && dev) {
                free(out);
                tu_rmrf(dir);
                cr_skip_test("%s: no device", backend);
            }
            cr_assert_eq(rc, 0, "%s", out);
            v[dev] = json_loads(out, JSON_DECODE_ANY, NULL);
            cr_assert(json_is_array(v[dev]) && json_array_size(v[dev]) > 0, "%s", out);
            free(out);
        }
        cr_assert_eq(json_array_size(v[0]), json_array_size(v[1]));
        double d = 0;
        for (size_t i = 0; i < json_array_size(v[0]); i++)
            d = fmax(d, fabs(json_number_value(json_array_get(v[0], i)) - json_number_value(json_array_get(v[1], i))));
        cr_assert(d <= 5e-3, "%s (%s pooling): embeddings differ from the CPU's by %g", backend, last ? "last" : "mean",
                  d);
        json_decref(v[0]);
        json_decref(v[1]);
    }
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* jlm bench --profile, one device backend's line: "> profile TEST on KIND:
 * matmul X ms/token (P%), attention ..., norms/rope/act ..., transfer/wait
 * ... [DEVICE; HOW]" with HOW how. Its four classes, in ms/token, into ms; the token's
 * ms/token (the CPU block's head) into tok. */
static inline void bm_prof_line(const char *out, const char *test, const char *kind, const char *how, double ms[4],
                                double *tok)
{
    char head[96];
    snprintf(head, sizeof head, "> profile %s: ", test);
    const char *p = strstr(out, head);
    cr_assert(p && sscanf(p + strlen(head), "%lf ms/token", tok) == 1 && *tok > 0, "no '%s' head in:\n%s", head, out);
    snprintf(head, sizeof head, "> profile %s on %s:", test, kind);
    const char *l = strstr(out, head);
    cr_assert(l, "no '%s' line in:\n%s", head, out);
    static const char *const CLASSES[4] = {" matmul ", ", attention ", ", norms/rope/act ", ", transfer/wait "};
    for (int i = 0; i < 4; i++) {
        const char *c = strstr(l, CLASSES[i]);
        double pct;
        cr_assert(c && sscanf(c + strlen(CLASSES[i]), "%lf ms/token (%lf%%)", &ms[i], &pct) == 2, "%s: %s", CLASSES[i], l);
        cr_assert(ms[i] >= 0 && pct >= 0, "a negative class: %s", l);
    }
    char tail[96];
    snprintf(tail, sizeof tail, "; %s]", how);
    const char *nl = strchr(l, '\n'), *h = strstr(l, tail);
    cr_assert(h && (!nl || h < nl), "not '%s': %s", how, l);
}


/* The distinct (block, expert) pairs of --trace-routing's lines in f
 * (a header, then "pos block e1 e2 ..."), blocks below 256, experts below 1024. */
static inline uint64_t bm_distinct_experts(FILE *f, uint32_t nu)
{
    static uint8_t seen[256][1024];
    memset(seen, 0, sizeof seen);
    uint64_t n = 0;
    unsigned pos, l;
    char head[256];
    rewind(f);
    cr_assert(fgets(head, sizeof head, f) && head[0] == '#', "the routing trace's header");
    while (fscanf(f, "%u %u", &pos, &l) == 2) {
        for (uint32_t s = 0; s < nu; s++) {
            int x;
            cr_assert(fscanf(f, "%d", &x) == 1 && l < 256 && x >= 0 && x < 1024, "a routing line");
            n += !seen[l][x];
            seen[l][x] = 1;
        }
    }
    return n;
}

/* A MoE prefill on backend's device, whole and at one frame each side
 * (--budget 1 --gpu-budget 1: every expert page evicted and paged in again
 * while its group runs): prompts of 5 and 40 tokens give the CPU's pick
 * and its logits within the MoE checks' tolerance (float experts 5e-4 of
 * the largest, else 0.05); and a 40-row prefill's routed-expert matmuls
 * (jlm_dev_stats.expert_matmuls) are at most three (gate, up, down) per
 * distinct (block, expert) its routing used (--trace-routing), as the
 * CPU's moe_batch groups them, not three per (row, slot). */
static inline void bm_moe_grouped_prefill(const char *backend)
{
    static const char *MODELS[] = {"synth-qwen3moe-256.Q8_0", "synth-llama-moe-256.F16", "synth-olmoe-256.Q4_K_M",
                                   "synth-glm4moe-256.Q8_0", "synth-llama4-256.Q8_0", "synth-gpt-oss-256.MXFP4_MOE",
                                   "synth-deepseek2-256.Q8_0"};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        char *path;
        int32_t ic[8], prompt[40];
        jlm_engine *ec = bm_cpu_ids(dir, MODELS[m], "moe.jlm", NULL, &path, ic);
        uint32_t nv = jlm_engine_n_vocab(ec), nu = jlm_engine_model(ec)->config.n_expert_used;
        for (uint32_t i = 0; i < 40; i++)
            prompt[i] = (int32_t)((1 + 37 * i) % nv);
        float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
        double tol = strstr(MODELS[m], ".F16") ? 5e-4 : 0.05;
        for (int budget = 0; budget < 2; budget++) {
            jlm_engine_opts o = {.backend = backend, .device = "0", .budget = budget, .gpu_budget = budget};
            char why[512];
            jlm_engine *ev = bm_open_opts(path, o, 1, why, sizeof why);
            if (!ev) {
                tu_rmrf(dir);
                cr_skip_test("%s", why);
            }
            const char *what = budget ? "one frame each side" : "whole";
            jlm_err err = {0};
            for (uint32_t np = 5; np <= 40; np += 35) {
                jlm_engine_rewind(ec, 0);
                jlm_engine_rewind(ev, 0);
                FILE *tr = np == 40 ? tmpfile() : NULL;
                cr_assert(np == 5 || (tr && jlm_engine_trace_routing(ev, tr, &err) == 0), "%s", err.msg);
                jlm_dev_stats s0, s1;
                jlm_engine_dev_stats(ev, &s0);
                cr_assert_eq(jlm_engine_eval(ec, prompt, np, lc, &err), 0, "%s", err.msg);
                cr_assert_eq(jlm_engine_eval(ev, prompt, np, lv, &err), 0, "%s", err.msg);
                jlm_engine_dev_stats(ev, &s1);
                char label[256];
                snprintf(label, sizeof label, "%s (%s, %s), a prefill of %u", MODELS[m], backend, what, np);
                bm_lockstep_pick(lc, lv, nv, tol, label);
                if (!tr)
                    continue;
                jlm_engine_trace_routing(ev, NULL, &err);
                uint64_t xm = s1.expert_matmuls - s0.expert_matmuls, d = bm_distinct_experts(tr, nu);
                fclose(tr);
                cr_assert(xm > 0 && xm <= 3 * d, "%s: %llu routed-expert matmuls on the device for %llu distinct "
                          "(block, expert) pairs (at most 3 each; row by row: 3 x 40 rows x %u used a block)", label,
                          (unsigned long long)xm, (unsigned long long)d, nu);
                cr_assert(!budget || s1.evictions > s0.evictions, "%s: no device frame evicted", label);
            }
            jlm_engine_close(ev);
        }
        free(lc);
        free(lv);
        jlm_engine_close(ec);
        free(path);
    }
    tu_rmrf(dir);
    free(dir);
}

#endif
