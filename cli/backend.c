/* backend.c - `--backend` refusal and `jlm --version` (see backend.h). */
#include "cli/backend.h"

#include <string.h>

#include "format/jlm_format.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/cuda.h"
#include "kernels/vulkan/vk.h"

int jlm_cli_backend_check(const char *cmd, const char *name, int device)
{
    if (!name || !strcmp(name, "cpu") || !strcmp(name, "vulkan") || !strcmp(name, "auto"))
        return 0;   /* the engine opens Vulkan (engine/backend_vk.h) */
    if (strcmp(name, "cuda")) {
        fprintf(stderr, "jlm %s: --backend '%s': unknown backend: expected cpu, vulkan, cuda or auto\n", cmd, name);
        return 2;
    }
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
    fprintf(stderr, "jlm %s: --backend cuda: the CUDA kernels are built and %s is present, but the "
                    "engine's graphs do not run on CUDA yet (docs/cuda.md)\n", cmd, in.name);
    return 1;
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
    fprintf(f, "cpu kernels: %s (this CPU runs: %s)\n%s\n", jlm_k_cpu_variant_name(), runs, line);
}
