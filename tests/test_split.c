/* test_split.c - suite `split`: CUDA + Vulkan + CPU in one engine (issue 17,
 * `--backend cuda,vulkan --gpu-layers 1,1`): the CUDA device is the host
 * emulation (JLM_CUDA_EMULATE=1: engine/backend_cu.h) and the Vulkan device
 * lavapipe, so the whole three-way split runs here. Every test model of the
 * backend matrix (tests/backend_matrix.h) as cuda,vulkan with 1,1 (the CPU
 * gets the blocks after the second) and as vulkan,cuda with 1,all, against
 * the CPU backend and llama.cpp; each device's share of the blocks is
 * checked by its matmul count, so a block run on the other device, or a
 * device skipped, fails. Then the CLI: the CPU's text, --stats and bench
 * with a line per device, and the malformed lists refused with one line.
 * Without a Vulkan device every test skips with one line. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vulkan/vk.h"
#include "tests/backend_matrix.h"
#include "tests/testutil.h"

/* NULL when a Vulkan device is present (lavapipe counts), else why not. */
static const char *no_vulkan(void)
{
    char names[8][128];
    if (!jlm_vk_built())
        return "built without Vulkan (no headers or glslc at build time)";
    if (jlm_vk_list_devices(names, 8) <= 0)
        return "no Vulkan device (lavapipe: mesa-vulkan-drivers)";
    return NULL;
}

/* ---------------------------------------------------------------- the engine: every test model */

/* Device i's matmuls, page-ins... during the steps. */
static uint64_t matmuls_in(jlm_engine *ev, int i, const jlm_dev_stats *before, const char *model, const char *what,
                           const char *kind)
{
    jlm_dev_stats s;
    cr_assert(jlm_engine_dev_stats_at(ev, i, &s), "%s (%s): no device %d", model, what, i);
    cr_assert_str_eq(s.kind, kind, "%s (%s): device %d is %s, expected %s", model, what, i, s.kind, kind);
    cr_assert(s.fallbacks == 0 && s.reuploads == 0, "%s (%s): %s: %llu matmuls fell back to the CPU, %llu "
              "found their planes in no pinned frame", model, what, kind, (unsigned long long)s.fallbacks,
              (unsigned long long)s.reuploads);
    return s.matmuls - before[i].matmuls;
}

/* Every block has the same matmuls (the test models' blocks are alike, but
 * for the families with dense and MoE blocks, and the routers of MoE blocks
 * whole on the devices: there only some on each), so
 * over the steps: cuda,vulkan 1,1 gives both devices the same count (the
 * second none on a one-block model; the output on the CPU); vulkan,cuda
 * 1,all gives cuda (n - 1) times Vulkan's plus one output matmul per
 * evaluation. With CUDA on two frames (cfg 2) its blocks are paged in
 * again, ahead of their turn on its copy thread (block 1's while Vulkan
 * runs block 0): a prefetch started on the wrong device, or left unended,
 * stops the page-ins ahead. */
static void split_check(jlm_engine *ev, const char *model, const bm_cfg *cfg, int cfg_i, const jlm_dev_stats *before,
                        int steps)
{
    uint32_t nb = jlm_engine_model(ev)->hdr.n_blocks;
    const char *k0 = cfg_i == 0 ? "cuda" : "vulkan", *k1 = cfg_i == 0 ? "vulkan" : "cuda";   /* 1, 2: vulkan,cuda */
    uint64_t m0 = matmuls_in(ev, 0, before, model, cfg->what, k0);
    uint64_t m1 = matmuls_in(ev, 1, before, model, cfg->what, k1);
    jlm_dev_stats none;
    cr_assert(!jlm_engine_dev_stats_at(ev, 2, &none), "%s (%s): a third device", model, cfg->what);
    cr_assert(m0 > 0, "%s (%s): no matmul on %s", model, cfg->what, k0);
    uint64_t want = cfg_i == 0 ? (nb > 1 ? m0 : 0) : (nb - 1) * m0 + (uint64_t)steps;
    const jlm_config *c = &jlm_engine_model(ev)->config;
    /* dense and MoE blocks (glm4moe, deepseek2, llama4): not alike; MoE blocks whole on both devices count
     * the router differently (Vulkan records it a row at a time, CUDA launches it once over the rows) */
    if (c->n_dense_lead || c->moe_step || c->n_expert)
        want = m1 > 0 || (cfg_i == 0 && nb <= 1) ? m1 : 1;
    cr_assert_eq(m1, want, "%s (%s, %u blocks): %s ran %llu matmuls, %s %llu (expected %llu)", model, cfg->what, nb,
                 k0, (unsigned long long)m0, k1, (unsigned long long)m1, (unsigned long long)want);
    if (cfg_i == 2 && nb > 3) {   /* CUDA's blocks over its two frames: paged in again, ahead (the copy thread) */
        jlm_dev_stats cu;
        jlm_engine_dev_stats_at(ev, 1, &cu);
        uint64_t pf = cu.prefetches - before[1].prefetches;
        cr_assert(pf >= nb - 1 && cu.evictions > 0, "%s (%s): %llu CUDA page-ins ahead, %llu evictions over the steps "
                  "for its %u blocks", model, cfg->what, (unsigned long long)pf, (unsigned long long)cu.evictions,
                  nb - 1);
    }
    uint64_t sum_mm, sum_up;   /* the single-device accessors: the first device, the counters summed */
    jlm_dev_stats first, s0, s1;
    jlm_engine_dev_counters(ev, &sum_mm, &sum_up);
    jlm_engine_dev_stats(ev, &first);
    jlm_engine_dev_stats_at(ev, 0, &s0);
    jlm_engine_dev_stats_at(ev, 1, &s1);
    cr_assert(!strcmp(first.kind, k0) && first.matmuls == s0.matmuls, "%s (%s): jlm_engine_dev_stats is the first "
              "device's", model, cfg->what);
    cr_assert(sum_mm == s0.matmuls + s1.matmuls && sum_up == s0.bytes_up + s1.bytes_up, "%s (%s): the counters sum "
              "both devices", model, cfg->what);
}

Test(split, every_test_model_on_cuda_vulkan_and_the_cpu_matches_the_cpu, .timeout = 300)
{
    const char *why = no_vulkan();
    if (why)
        cr_skip_test("split: %s", why);
    setenv("JLM_CUDA_EMULATE", "1", 1);
    setenv("JLM_CUDA_STAGE_KIB", "64", 1);
    /* split_check counts on every block running the same matmuls, which a MoE
     * block does only when a batch's experts run row by row: grouped by
     * expert (the default) a block runs one GEMM per expert its rows routed
     * to. The grouped path on the devices is held to the CPU's logits by
     * vulkan/every_test_model_... and cuda/every_test_model_... */
    setenv("JLM_MOE", "rows", 1);
    const bm_cfg cfgs[3] = {
        {"cuda,vulkan, --gpu-layers 1,1", {.backend = "cuda,vulkan", .device = "0,0", .gpu_layers = 1,
                                           .gpu_layers2 = 1}, {0}},
        {"vulkan,cuda, --gpu-layers 1,all", {.backend = "vulkan,cuda", .device = "0,0", .gpu_layers = 1}, {0}},
        {"vulkan,cuda, --gpu-layers 1,all, two CUDA frames (prefetch)",
         {.backend = "vulkan,cuda", .device = "0,0", .gpu_layers = 1}, {0, 2}},
    };
    bm_matrix(cfgs, 3, split_check);
    unsetenv("JLM_MOE");
}

/* The host pager has one evict hook; the engine fans it out to both
 * devices. On Vulkan's import path a device frame aliases the host frame,
 * so when the host evicts a page the import must go too: at one frame each
 * side, after the evaluations, the Vulkan device holds no frame (its block
 * is not the last one run), whichever place it has in the list. */
Test(split, the_host_pagers_evictions_reach_both_devices, .timeout = 120)
{
    const char *why = no_vulkan();
    if (why)
        cr_skip_test("split: %s", why);
    setenv("JLM_CUDA_EMULATE", "1", 1);
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *path = tu_convert("stories260K.gguf", dir, "s.jlm", &err);   /* 5 blocks: the CPU runs the last */
    cr_assert(path, "%s", err.msg);
    static const char *const ORDER[] = {"cuda,vulkan", "vulkan,cuda"};
    for (int k = 0; k < 2; k++) {
        jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1, .backend = ORDER[k], .device = "0,0",
                             .gpu_layers = 1, .gpu_layers2 = 1, .budget = 1, .gpu_budget = 1, .gpu_budget2 = 1};
        jlm_engine *e = NULL;
        cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s: %s", ORDER[k], err.msg);
        int32_t ids[3] = {1, 403, 407};
        for (int t = 0; t < 3; t++)
            cr_assert_eq(jlm_engine_eval(e, &ids[t], 1, NULL, &err), 0, "%s", err.msg);
        jlm_dev_stats v;
        cr_assert(jlm_engine_dev_stats_at(e, k == 0 ? 1 : 0, &v) && !strcmp(v.kind, "vulkan"));
        if (!strcmp(v.path, "import"))
            /* page-ins: its block's, each evicted, and the dense region's once (the norm weights of a
             * block run whole on the device, engine/exec_vk.c), kept */
            cr_assert(v.frames == 0 && v.evictions + 1 == v.page_ins && v.page_ins >= 4, "%s: vulkan holds %llu frames "
                      "after the host evicted its block (%llu page-ins, %llu evictions)", ORDER[k],
                      (unsigned long long)v.frames, (unsigned long long)v.page_ins, (unsigned long long)v.evictions);
        jlm_engine_close(e);
    }
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* Opening: a list the engine refuses (as the CLI does), and the first
 * device's count required. */
Test(split, the_engine_refuses_malformed_lists_and_a_missing_first_count, .timeout = 60)
{
    char *dir = tu_tmpdir();
    jlm_err err = {0};
    char *path = tu_convert("stories260K.gguf", dir, "s.jlm", &err);
    cr_assert(path, "%s", err.msg);
    static const struct { const char *backend, *device; uint32_t gl; const char *msg; } BAD[] = {
        {"cuda,cuda", "0", 1, "--backend 'cuda,cuda': cuda twice"},
        {"cuda,vulkan,cuda", "0", 1, "more than 2 device backends"},
        {"auto,vulkan", NULL, 1, "'auto' in a list"},
        {"cuda,", NULL, 1, "an empty entry"},
        {"cuda,vulkan", "0,0,0", 1, "--device '0,0,0': more entries"},
        {"cuda,vulkan", "0,0", 0, "the first device's block count is needed"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        jlm_engine_opts o = {.quiet = 1, .backend = BAD[i].backend, .device = BAD[i].device, .gpu_layers = BAD[i].gl};
        jlm_engine *e = NULL;
        jlm_err er = {0};
        cr_assert_eq(jlm_engine_open(path, &o, &e, &er), JLM_EINVAL, "%s: %s", BAD[i].backend, er.msg);
        cr_assert(strstr(er.msg, BAD[i].msg) && !strchr(er.msg, '\n'), "%s: '%s', expected '%s'", BAD[i].backend,
                  er.msg, BAD[i].msg);
    }
    jlm_engine_split sp;
    cr_assert_eq(jlm_engine_split_parse("vulkan,cuda", "llvmpipe,1", &sp, &err), 0, "%s", err.msg);
    cr_assert(sp.n == 2 && !strcmp(sp.kind[0], "vulkan") && !strcmp(sp.kind[1], "cuda"));
    cr_assert(!strcmp(sp.device[0], "llvmpipe") && !strcmp(sp.device[1], "1"));
    cr_assert_eq(jlm_engine_split_parse("cuda,vulkan", "1", &sp, &err), 0, "%s", err.msg);
    cr_assert(!strcmp(sp.device[0], "1") && !sp.device[1][0], "the missing entry is the default");
    cr_assert_eq(jlm_engine_split_parse("vulkan", "llvmpipe (LLVM, 256 bits)", &sp, &err), 0, "%s", err.msg);
    cr_assert(sp.n == 1 && !strcmp(sp.device[0], "llvmpipe (LLVM, 256 bits)"), "one backend: the whole --device");
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- the CLI */

/* `jlm run` on cuda,vulkan with the CPU's share prints the CPU's text, as
 * does vulkan,cuda with 1,all and both at one frame each side; --stats has
 * a line per device with matmuls and no fallback, and the totals line adds
 * both; bench prints a per-backend line per device. vulkan,cuda with 1,all
 * keeps --kv auto's F16 cache and CUDA's blocks whole: a decoded token is
 * one round trip on CUDA (the matmul offload: 4 a block). */
Test(split, jlm_run_on_cuda_vulkan_and_the_cpu_prints_the_cpus_text, .timeout = 180)
{
    const char *why = no_vulkan();
    if (why)
        cr_skip_test("split: %s", why);
    char *dir = tu_tmpdir(), cmd[4096], *ref = NULL, *out = NULL;
    jlm_err err = {0};
    char *path = tu_convert("stories260K.gguf", dir, "s.jlm", &err);   /* 5 blocks: 3 left to the CPU */
    cr_assert(path, "%s", err.msg);
    /* { ... 2>/dev/null; }: stdout only (tu_run adds 2>&1 after) */
    snprintf(cmd, sizeof cmd, "{ %s run %s -p 'Once upon' -n 16 --temp 0 2>/dev/null; }", tu_jlm(), path);
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    static const char *ARGS[] = {
        "--backend cuda,vulkan --device 0,0 --gpu-layers 1,1",
        "--backend vulkan,cuda --device 0,0 --gpu-layers 1,all",
        "--backend cuda,vulkan --device 0,0 --gpu-layers 2 --budget 1 --gpu-budget 1,1",
    };
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "{ JLM_CUDA_EMULATE=1 %s run %s -p 'Once upon' -n 16 --temp 0 %s 2>/dev/null; }",
                 tu_jlm(), path, ARGS[i]);
        cr_assert_eq(tu_run(cmd, &out), 0, "%s: %s", ARGS[i], out);
        cr_assert_str_eq(out, ref, "%s: differs from the CPU", ARGS[i]);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "{ JLM_CUDA_EMULATE=1 %s run %s -p 'Once upon' -n 4 --temp 0 %s --stats >/dev/null; }",
             tu_jlm(), path, ARGS[0]);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    cr_assert(strstr(out, "note: matmuls on CUDA device host emulation") && strstr(out, "for block 0, on Vulkan device ")
              && strstr(out, "for block 1; blocks 2-4 and the output on the CPU\n"), "%s", out);
    const char *pl = strstr(out, "\npager: page-ins "), *cl = strstr(out, "\ncpu: page-ins "),
               *c0 = strstr(out, "\ncuda: matmuls "), *v1 = strstr(out, "\nvulkan: matmuls ");
    cr_assert(pl && cl && c0 && v1 && pl < cl && cl < c0 && c0 < v1, "a line per device in block order: %s", out);
    cr_assert(bm_field(c0, "matmuls ") > 0 && bm_field(c0, "matmuls ") == bm_field(v1, "matmuls "), "%s", out);
    cr_assert(bm_field(c0, "cpu fallbacks ") == 0 && bm_field(v1, "cpu fallbacks ") == 0, "%s", out);
    cr_assert_eq(bm_field(pl, "page-ins "), bm_field(cl, "page-ins ") + bm_field(c0, "page-ins ") + bm_field(v1, "page-ins "),
                 "%s", out);
    free(out);
    unsigned long long rt[2];
    for (int r = 0; r < 2; r++) {
        snprintf(cmd, sizeof cmd, "{ JLM_CUDA_EMULATE=1 %s run %s -p 'Once upon' -n %d --temp 0 %s --stats >/dev/null; }",
                 tu_jlm(), path, r ? 12 : 4, ARGS[1]);
        cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
        const char *kl = strstr(out, ", KV "), *cu = strstr(out, "\ncuda: matmuls ");
        cr_assert(kl && cu && strstr(kl, " (f16),") == strchr(kl + 5, ' '), "%s: --kv auto keeps f16: %s", ARGS[1], out);
        rt[r] = bm_field(cu, "round trips ");
        free(out);
    }
    cr_assert(rt[1] - rt[0] <= 8, "%s: %llu round trips on CUDA for 8 decoded tokens", ARGS[1], rt[1] - rt[0]);
    snprintf(cmd, sizeof cmd, "JLM_CUDA_EMULATE=1 %s bench %s -p 4 -n 2 -r 1 %s", tu_jlm(), path, ARGS[1]);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    const char *bv = strstr(out, "pp4 per backend: vulkan ("), *bc = strstr(out, "pp4 per backend: cuda (");
    cr_assert(bv && bc && bv < bc && strstr(out, "tg2 per backend: cuda ("), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "JLM_CUDA_EMULATE=1 %s bench %s -p 4 -n 0 -r 1 %s -o json 2>/dev/null", tu_jlm(), path,
             ARGS[1]);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    cr_assert(strstr(out, "\"vulkan\": {") && strstr(out, "\"cuda\": {"), "an object per device: %s", out);
    free(out);
    free(ref);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* Each malformed list: exit 2 and one line naming the option, before any
 * work (the model is never opened: it does not exist). */
Test(split, malformed_lists_exit_2_with_one_line_naming_the_option)
{
    static const struct { const char *args, *opt; } BAD[] = {
        {"--backend cuda,cuda --gpu-layers 1", "--backend 'cuda,cuda': cuda twice"},
        {"--backend vulkan,vulkan --gpu-layers 1", "--backend 'vulkan,vulkan': vulkan twice"},
        {"--backend cuda,vulkan,cuda --gpu-layers 1", "--backend 'cuda,vulkan,cuda': more than 2"},
        {"--backend cuda, --gpu-layers 1", "--backend 'cuda,': an empty entry"},
        {"--backend auto,vulkan", "--backend 'auto,vulkan': 'auto' in a list"},
        {"--backend cpu,cuda", "--backend 'cpu,cuda': 'cpu' in a list"},
        {"--backend cuda,tpu", "--backend 'cuda,tpu': 'tpu' in a list"},
        {"--backend cuda,vulkan", "--gpu-layers: two device backends need the first one's block count"},
        {"--backend cuda,vulkan --gpu-layers all", "--gpu-layers 'all': 'all' on the first device"},
        {"--backend cuda,vulkan --gpu-layers all,1", "--gpu-layers 'all,1': 'all' on the first device"},
        {"--backend cuda,vulkan --gpu-layers 1,2,3", "--gpu-layers '1,2,3': more values than the two devices"},
        {"--backend cuda,vulkan --gpu-layers 1,x", "--gpu-layers '1,x': expected a count"},
        {"--backend cuda,vulkan --gpu-layers 0,1", "--gpu-layers '0,1': expected a count"},
        {"--backend cuda,vulkan --gpu-layers 1,", "--gpu-layers '1,': expected a count"},
        {"--backend cuda --gpu-layers 1,1", "--gpu-layers '1,1': one value for one device"},
        {"--backend cuda,vulkan --gpu-layers 1 --gpu-budget 1G,x", "--gpu-budget '1G,x': expected bytes"},
        {"--backend cuda,vulkan --gpu-layers 1 --gpu-budget 1G,2G,3G", "--gpu-budget '1G,2G,3G': more values"},
        {"--backend vulkan --gpu-budget 64M,1G", "--gpu-budget '64M,1G': one value for one device"},
        {"--backend cuda,vulkan --gpu-layers 1 --device 0,0,0", "--device '0,0,0': more entries"},
    };
    static const char *const CMDS[] = {"run", "bench", "serve", "chat"};
    char cmd[1024];
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        const char *sub = CMDS[i % 4];
        char *o = NULL, want[256];
        snprintf(cmd, sizeof cmd, "JLM_CUDA_EMULATE=1 %s %s /nonexistent/model.jlm%s %s", tu_jlm(), sub,
                 strcmp(sub, "run") ? "" : " -p hi", BAD[i].args);   /* run without a prompt prints its usage */
        int rc = tu_run(cmd, &o);
        cr_assert_eq(rc, 2, "%s %s: exit %d: %s", sub, BAD[i].args, rc, o);
        snprintf(want, sizeof want, "jlm %s: %s", sub, BAD[i].opt);
        cr_assert(!strncmp(o, want, strlen(want)), "%s %s: '%s', expected '%s...'", sub, BAD[i].args, o, want);
        char *nl = strchr(o, '\n');
        cr_assert(nl && nl[1] == 0, "one line: %s", o);
        free(o);
    }
}
