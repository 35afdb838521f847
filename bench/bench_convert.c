/* bench_convert.c - conversion throughput as a ratio against `cp` of the same
 * GGUF, measured in the same run (both from a warm page cache, both writing
 * to the same temp dir; median of R runs). The machines are shared and noisy:
 * read the ratio, not the absolute times.
 *
 *   build/bench/bench_convert [MODEL.gguf ...] [-r R]
 */
#include "converter/convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmpd);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    const char *defaults[] = {"tests/models/synth-llama-256.f32.gguf", "tests/models/synth-llama-256.Q4_K_M.gguf",
                              "tests/models/synth-llama-moe-256.F16.gguf", "tests/models/synth-llama-256.Q2_K.gguf",
                              "models/stories260K.gguf"};
    const char *models[64];
    int n = 0, r = 5;
    for (int i = 1; i < argc && n < 64; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) r = atoi(argv[++i]);
        else models[n++] = argv[i];
    }
    if (!n)
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
            models[n++] = defaults[i];
    if (r < 1 || r > 99)
        r = 5;
    char dir[] = "/tmp/jlmbench.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    printf("%-44s %10s %10s %10s %8s %9s\n", "model", "MiB", "cp ms", "conv ms", "conv/cp", "conv MB/s");
    for (int m = 0; m < n; m++) {
        double tc[99], tv[99];
        char cmd[2048], out[1024];
        snprintf(out, sizeof out, "%s/out.jlm", dir);
        uint64_t bytes = 0;
        for (int k = 0; k < r; k++) {
            snprintf(cmd, sizeof cmd, "cp '%s' '%s/copy.gguf'", models[m], dir);
            double t0 = now();
            if (system(cmd) != 0) {
                fprintf(stderr, "bench_convert: cp of %s failed\n", models[m]);
                return 1;
            }
            tc[k] = now() - t0;
            jlm_err err = {0};
            jlm_conv *c;
            t0 = now();
            if (jlm_conv_open(models[m], NULL, &c, &err) || jlm_conv_write(c, out, NULL, NULL, NULL, &err)) {
                fprintf(stderr, "bench_convert: %s\n", err.msg);
                return 1;
            }
            tv[k] = now() - t0;
            bytes = c->g->total_bytes;
            jlm_conv_close(c);
        }
        double mc = median(tc, r), mv = median(tv, r);
        const char *b = strrchr(models[m], '/');
        printf("%-44s %10.2f %10.2f %10.2f %8.2f %9.1f\n", b ? b + 1 : models[m], bytes / 1048576.0, mc * 1e3,
               mv * 1e3, mv / mc, bytes / mv / 1e6);
    }
    snprintf(dir + strlen(dir), 1, "%s", "");
    char rm[256];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm)) {}
    return 0;
}
