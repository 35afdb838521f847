/* backend.c - `--backend` refusal and `jlm --version` (see backend.h). */
#include "cli/backend.h"
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/cuda.h"
#include "kernels/vulkan/vk.h"

int jlm_cli_backend_check(const char *cmd, const char *name, int device)
{
    if (!name || !strcmp(name, "cpu") || !strcmp(name, "vulkan") || !strcmp(name, "auto"))
        return 0;   /* the engine opens Vulkan (engine/backend_vk.h) */
    const char *em = getenv("JLM_CUDA_EMULATE");
    if (strcmp(name, "cuda")) {
        fprintf(stderr, "jlm %s: --backend '%s': unknown backend: expected cpu, vulkan, cuda or auto\n", cmd, name);
        return 2;
    }
    if (em && *em && strcmp(em, "0"))
        return 0;   /* the host emulation of a CUDA device (engine/backend_cu.h) */
    jlm_cu_info in;
    jlm_cu_probe(&in);
    if (!in.built) {
        fprintf(stderr, "jlm %s: --backend cuda: CUDA backend %s\n", cmd, in.reason);
        return 1;
    }
    if (in.count == 0) {
        fprintf(stderr, "jlm %s: --backend cuda: no CUDA device: %s\n", cmd, in.reason);
        return 1;
    }
    if (device < 0 || device >= in.count) {
        fprintf(stderr, "jlm %s: --device %d: this machine has %d CUDA device(s)\n", cmd, device, in.count);
        return 2;
    }
    return 0;   /* the engine opens it (engine/backend_cu.h) */
}

void jlm_cli_print_version(FILE *f)
{
    char line[512];
    jlm_cu_describe(line, sizeof line);
#if defined(__clang__)
    const char *cc = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *cc = "gcc " __VERSION__;
#else
    const char *cc = "an unknown C compiler";
#endif
    static const char *const TIER[JLM_K_NVARIANT] = {"ref", "avx2", "avx512"};
    char runs[64] = "";
    for (int v = 0; v < JLM_K_NVARIANT; v++)
        if (jlm_k_cpu_has(v))
            snprintf(runs + strlen(runs), sizeof runs - strlen(runs), "%s%s", *runs ? " " : "", TIER[v]);
    fprintf(f, "build: %s; SIMD tiers built: ref avx2 avx512; backends built: cpu%s (cuda: next line)\n", cc,
            jlm_vk_built() ? ", vulkan" : " (vulkan left out: no headers or glslc at build time)");
    const jlm_k_cpu *k = jlm_k_cpu_get();
    fprintf(f, "cpu kernels: %s%s (this CPU runs: %s)\n%s\n", k->name,
            k->pf == JLM_K_PF_L1 ? ", prefetch into L1" : k->pf == JLM_K_PF_L2 ? ", prefetch into L2" : "", runs, line);
    char names[8][128];
    int n = jlm_vk_built() ? jlm_vk_list_devices(names, 8) : -1;
    fprintf(f, "vulkan: %s", !jlm_vk_built() ? "not built (no headers or glslc at build time)"
                             : n < 0 ? "built; no loader or driver" : n == 0 ? "built; no device" : "built; devices ");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%s", i ? ", " : "", names[i]);
    fputc('\n', f);
}

json_t *jlm_cli_backends_json(void)
{
    json_t *a = json_array();
    json_array_append_new(a, json_pack("{s:s, s:b, s:[s]}", "name", "cpu", "built", 1, "devices",
                                       jlm_k_cpu_variant_name()));
    char names[8][128];
    int n = jlm_vk_built() ? jlm_vk_list_devices(names, 8) : -1;
    json_t *d = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(d, json_string(names[i]));
    json_array_append_new(a, json_pack("{s:s, s:b, s:o}", "name", "vulkan", "built", jlm_vk_built(), "devices", d));
    jlm_cu_info in;
    jlm_cu_probe(&in);
    json_t *cd = json_array();
    if (in.built && in.count > 0)
        json_array_append_new(cd, json_string(in.name));
    json_array_append_new(a, json_pack("{s:s, s:b, s:o}", "name", "cuda", "built", in.built, "devices", cd));
    return a;
}

/* The cuda line's graphs (docs/cuda.md): "graphs G (captures C), runtime calls K, "; "" elsewhere. */
static const char *cu_graphs(char *b, size_t n, const jlm_dev_stats *s)
{
    if (strcmp(s->kind, "cuda"))
        return "";
    snprintf(b, n, "graphs %llu (captures %llu), runtime calls %llu, ", (unsigned long long)s->graph_launches,
             (unsigned long long)s->graph_captures, (unsigned long long)s->rt_calls);
    return b;
}

void jlm_cli_print_backend_stats(FILE *f, struct jlm_engine *e, unsigned long long pi, unsigned long long ev,
                                 unsigned long long br, unsigned long long hi)
{
    jlm_dev_stats v[JLM_ENGINE_DEVS];
    unsigned long long dpi = 0, dev = 0, dbr = 0, dhi = 0;
    int n = 0;
    for (; n < JLM_ENGINE_DEVS && jlm_engine_dev_stats_at(e, n, &v[n]); n++) {
        dpi += v[n].page_ins;
        dev += v[n].evictions;
        dbr += v[n].bytes_up;
        dhi += v[n].hits;
    }
    char b1[32], b2[32], b3[32], b4[32], b5[96];
    fprintf(f, "pager: page-ins %llu, evictions %llu, bytes-read %llu (%s), hits %llu\n", pi + dpi, ev + dev, br + dbr,
            jlm_cli_iec(b1, br + dbr), hi + dhi);
    jlm_engine_mem mi;
    jlm_engine_mem_info(e, &mi);
    fprintf(f, "cpu: page-ins %llu, evictions %llu, bytes read %llu (%s), hits %llu, frames budget %llu (%s)\n", pi, ev,
            br, jlm_cli_iec(b1, br), hi, (unsigned long long)mi.frames, jlm_cli_iec(b2, mi.frames));
    for (int i = 0; i < n; i++)   /* one line per device, in block order */
        fprintf(f, "%s: matmuls %llu (round trips %llu), activations up %llu, down %llu, "
                   "page-ins %llu (%llu ahead), evictions %llu, hits %llu, bytes uploaded %llu (%s), bytes imported %llu (%s), frames %llu (%llu bytes, peak %llu, budget %llu), "
                   "path %s, kernels %.1f ms, transfers %.1f ms, reuploads %llu, cpu fallbacks %llu, %s"
                   "device %s\n",
                v[i].kind, (unsigned long long)v[i].matmuls, (unsigned long long)v[i].waits,
                (unsigned long long)v[i].act_up, (unsigned long long)v[i].act_down,
                (unsigned long long)v[i].page_ins,
                (unsigned long long)v[i].prefetches, (unsigned long long)v[i].evictions,
                (unsigned long long)v[i].hits, (unsigned long long)v[i].bytes_up, jlm_cli_iec(b3, v[i].bytes_up),
                (unsigned long long)v[i].bytes_imported, jlm_cli_iec(b4, v[i].bytes_imported),
                (unsigned long long)v[i].frames, (unsigned long long)v[i].resident_bytes,
                (unsigned long long)v[i].peak_bytes, (unsigned long long)v[i].budget,
                v[i].path, v[i].kernel_ns / 1e6, v[i].xfer_ns / 1e6,
                (unsigned long long)v[i].reuploads, (unsigned long long)v[i].fallbacks, cu_graphs(b5, sizeof b5, &v[i]),
                v[i].device);
}
