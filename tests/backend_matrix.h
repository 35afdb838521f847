/* backend_matrix.h - every test model on a device backend against the CPU
 * backend and llama.cpp's logits: whole, split (--gpu-layers 2) and at one
 * frame each side (--budget 1 --gpu-budget 1). Shared by the suites vulkan
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
#include "tests/testutil.h"

/* The engine on backend ("cpu" opens always); NULL when a device backend
 * has no device (JLM_EUNSUPPORTED). */
static jlm_engine *bm_open(const char *path, const char *backend, uint32_t gpu_layers, uint64_t budget,
                           uint64_t gpu_budget)
{
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1, .backend = backend, .device = "0",
                         .gpu_layers = gpu_layers, .budget = budget, .gpu_budget = gpu_budget};
    jlm_engine *e = NULL;
    jlm_err err = {0};
    int rc = jlm_engine_open(path, &o, &e, &err);
    if (rc == JLM_EUNSUPPORTED && strcmp(backend, "cpu"))
        return NULL;
    cr_assert_eq(rc, 0, "%s: %s", backend, err.msg);
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
    "synth-qwen3moe-256.Q4_K_M", "synth-qwen3moe-256.Q8_0",
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
static double dev_cpu_tol(const char *m)
{
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

/* Backends whose page-ins can run ahead on a copy thread (jlm_dev_prefetch). */
static int bm_prefetches(const char *backend) { return !strcmp(backend, "cuda"); }

/* Skips (one line) when backend has no device. */
static void bm_every_model_matches_the_cpu(const char *backend)
{
    char *dir = tu_tmpdir();
    int n_oracle = 0;
    size_t nm = sizeof MATRIX / sizeof MATRIX[0];
    for (size_t m = 0; m < nm; m++) {
        char gguf[256];
        jlm_err err = {0};
        snprintf(gguf, sizeof gguf, "%s.gguf", MATRIX[m]);
        char *path = tu_convert(gguf, dir, "m.jlm", &err);
        cr_assert(path, "%s: %s", MATRIX[m], err.msg);
        jlm_engine *ec = bm_open(path, "cpu", 0, 0, 0);
        uint32_t nv = jlm_engine_n_vocab(ec);
        float *lc = malloc(nv * 4), *lv = malloc(nv * 4);
        /* cfg 0: whole; 1: --gpu-layers 2 (split); 2: --budget 1 --gpu-budget 1
         * (both raised to one frame plus the routed experts: every token pages
         * every block in again on both sides); 3, backends with a copy thread
         * (prefetch): --gpu-budget of two block frames plus the routed experts,
         * so every token pages the blocks in again on the device, each while
         * the block before it computes */
        const jlm_config *mc = &jlm_engine_model(ec)->config;
        uint32_t pins2[3] = {2, 0, mc->n_expert ? mc->n_expert_used : 0};
        uint64_t two_frames = jlm_pager_min_budget(jlm_engine_pager(ec), pins2);
        int ncfg = bm_prefetches(backend) ? 4 : 3;
        for (int cfg = 0; cfg < ncfg; cfg++) {
            uint32_t gl = cfg == 1 ? 2 : 0;
            char what[96];
            snprintf(what, sizeof what, "%s%s", backend,
                     cfg == 0 ? "" : cfg == 1 ? ", --gpu-layers 2" : cfg == 2 ? ", one frame each side"
                                                                              : ", two device frames (prefetch)");
            jlm_engine *ev = cfg == 2 ? bm_open(path, backend, 0, 1, 1)
                             : cfg == 3 ? bm_open(path, backend, 0, 0, two_frames)
                                        : bm_open(path, backend, gl, 0, 0);
            if (!ev) {
                tu_rmrf(dir);
                cr_skip_test("%s: no device", backend);
            }
            n_oracle += vs_oracle(ev, MATRIX[m], what);
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
                cr_assert(d <= dev_cpu_tol(MATRIX[m]) * mx, "%s (%s), step %d: logits differ by %g (largest %g)",
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
            jlm_dev_stats ds;
            jlm_engine_dev_stats(ev, &ds);
            cr_assert(ds.matmuls > 0 && ds.fallbacks == 0, "%s (%s): %llu matmuls on the device, %llu fell back to the CPU",
                      MATRIX[m], what, (unsigned long long)ds.matmuls, (unsigned long long)ds.fallbacks);
            uint32_t nb = jlm_engine_model(ev)->hdr.n_blocks;
            if (cfg == 2 && nb > 1) {   /* evictions counted on both sides: pages read again */
                jlm_dev_stats vs;
                jlm_engine_dev_stats(ev, &vs);
                jlm_pager_counters pc;
                jlm_pager_stats(jlm_engine_pager(ev), &pc);
                uint64_t host_in = pc.a[0].page_ins + pc.a[0].fills;
                cr_assert(vs.evictions > 0 && vs.page_ins > nb, "%s (%s): device %llu page-ins, %llu evictions for %u blocks",
                          MATRIX[m], what, (unsigned long long)vs.page_ins, (unsigned long long)vs.evictions, nb);
                cr_assert(host_in > nb, "%s (%s): host %llu page-ins + fills for %u blocks over 4 evaluations", MATRIX[m],
                          what, (unsigned long long)host_in, nb);
            }
            if (cfg == 3 && nb > 2) {   /* the next block went up while this one computed */
                jlm_dev_stats vs;
                jlm_engine_dev_stats(ev, &vs);
                cr_assert(vs.prefetches >= nb && vs.evictions > 0,
                          "%s (%s): %llu prefetches, %llu evictions for %u blocks over 4 evaluations", MATRIX[m],
                          what, (unsigned long long)vs.prefetches, (unsigned long long)vs.evictions, nb);
            }
            jlm_engine_close(ev);
        }
        free(lc);
        free(lv);
        jlm_engine_close(ec);
        free(path);
    }
    cr_assert(n_oracle >= 3 * 20, "only %d oracle comparisons", n_oracle);
    tu_rmrf(dir);
    free(dir);
}


#endif
