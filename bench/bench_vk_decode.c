/* bench_vk_decode.c - prefill and decode tokens/s on the Vulkan backend
 * against the CPU backend, the same container in the same run, printed as a
 * ratio (vulkan/cpu), with the device's share of kernel and transfer time.
 *
 * For each type: bench/mkgguf.c's PRESET (default "tiny": 256 wide, 2 blocks,
 * vocab 512; "llama-1b" for Llama-3.2-1B shapes) is generated and converted,
 * then opened twice, `--backend cpu` and `--backend vulkan` (device 0 or
 * JLM_VK_DEVICE), unlimited budgets so nothing pages after the warm-up; each
 * measures pp (P tokens in one eval) and tg (N single-token evals, greedy
 * feed), best of R. On lavapipe the "device" is this CPU, so read the ratio
 * as how far the one-row-per-invocation shaders and per-call submits are from
 * the CPU kernels, not as a GPU figure. Skips (exit 0) with one line without
 * a Vulkan device.
 *
 *   build/bench/bench_vk_decode [-t T] [-p P] [-n N] [-r R] [--preset NAME] [--types Q4_K,Q8_0]
 */
#include "bench/bench_common.h"

#include "engine/backend_vk.h"
#include "engine/model.h"

typedef struct vk_opts { int n_threads, n_pp, n_tg, reps; char preset[32], types[128]; } vk_opts;
typedef struct vk_fig { double pp, tg, kernel_ms, xfer_ms; } vk_fig;

static int32_t argmax_l(const float *l, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return (int32_t)b;
}

/* pp and tg tokens/s (best of reps) on one backend; 1: no device (skip). */
static int measure(const char *path, const char *backend, const vk_opts *o, vk_fig *f)
{
    jlm_engine_opts eo = {.n_threads = o->n_threads, .n_ctx = 512, .direct = 1, .quiet = 1, .backend = backend,
                          .device = "0"};
    jlm_engine *e;
    jlm_err err = {0};
    int rc = jlm_engine_open(path, &eo, &e, &err);
    if (rc) {
        fprintf(stderr, "bench_vk_decode: %s: %s\n", backend, err.msg);
        return rc == JLM_EUNSUPPORTED && !strcmp(backend, "vulkan") ? 1 : -1;
    }
    uint32_t nv = jlm_engine_n_vocab(e);
    float *logits = malloc(nv * sizeof *logits);
    int32_t toks[256];
    for (int i = 0; i < o->n_pp; i++)
        toks[i] = (int32_t)(1 + (i * 7919) % (nv - 1));
    rc = logits ? jlm_engine_eval(e, toks, 2, logits, &err) : -1;   /* warm-up: pages every block in */
    f->pp = f->tg = 0;
    jlm_dev_stats s0, s1;
    jlm_engine_dev_stats(e, &s0);
    for (int r = 0; r < o->reps && !rc; r++) {
        jlm_engine_rewind(e, 0);
        double t0 = bench_now();
        if ((rc = jlm_engine_eval(e, toks, (uint32_t)o->n_pp, logits, &err)))
            break;
        double pp = o->n_pp / (bench_now() - t0);
        int32_t tok = argmax_l(logits, nv);
        t0 = bench_now();
        for (int i = 0; i < o->n_tg && !rc; i++) {
            rc = jlm_engine_eval(e, &tok, 1, logits, &err);
            tok = argmax_l(logits, nv);
        }
        double tg = o->n_tg / (bench_now() - t0);
        if (pp > f->pp) f->pp = pp;
        if (tg > f->tg) f->tg = tg;
    }
    jlm_engine_dev_stats(e, &s1);
    double tokens = (double)o->reps * (o->n_pp + o->n_tg);
    f->kernel_ms = (double)(s1.kernel_ns - s0.kernel_ns) / 1e6 / tokens;
    f->xfer_ms = (double)(s1.xfer_ns - s0.xfer_ns) / 1e6 / tokens;
    if (rc)
        fprintf(stderr, "bench_vk_decode: %s: %s\n", backend, err.msg[0] ? err.msg : "out of memory");
    free(logits);
    jlm_engine_close(e);
    return rc ? -1 : 0;
}

static int parse(int argc, char **argv, vk_opts *o)
{
    *o = (vk_opts){2, 16, 16, 3, "tiny", "Q4_K,Q8_0"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return -1;
        if (!strcmp(a, "-t")) o->n_threads = atoi(v);
        else if (!strcmp(a, "-p")) o->n_pp = atoi(v);
        else if (!strcmp(a, "-n")) o->n_tg = atoi(v);
        else if (!strcmp(a, "-r")) o->reps = atoi(v);
        else if (!strcmp(a, "--preset")) snprintf(o->preset, sizeof o->preset, "%s", v);
        else if (!strcmp(a, "--types")) snprintf(o->types, sizeof o->types, "%s", v);
        else return -1;
        i++;
    }
    return o->n_threads < 1 || o->n_pp < 2 || o->n_pp > 256 || o->n_tg < 1 || o->reps < 1 ? -1 : 0;
}

int main(int argc, char **argv)
{
    vk_opts o;
    if (parse(argc, argv, &o)) {
        fprintf(stderr, "usage: bench_vk_decode [-t T] [-p P<=256] [-n N] [-r R] [--preset NAME] [--types Q4_K,Q8_0]\n");
        return 2;
    }
    char *dir = bench_tmpdir();
    if (!dir)
        return 1;
    printf("preset %s, %d threads, pp%d / tg%d, best of %d; ratio = vulkan / cpu tokens/s, same run\n", o.preset,
           o.n_threads, o.n_pp, o.n_tg, o.reps);
    int status = 0;
    char types[128];
    snprintf(types, sizeof types, "%s", o.types);
    for (char *save = NULL, *t = strtok_r(types, ",", &save); t && !status; t = strtok_r(NULL, ",", &save)) {
        uint32_t type;
        char path[1200];
        if (mkg_parse_type(t, &type) || bench_make_model(dir, t, o.preset, type, 0, path, sizeof path)) {
            fprintf(stderr, "bench_vk_decode: type %s: cannot make the model\n", t);
            status = 1;
            break;
        }
        vk_fig c, v;
        int rc = measure(path, "cpu", &o, &c);
        if (!rc)
            rc = measure(path, "vulkan", &o, &v);
        if (rc == 1) {
            printf("bench_vk_decode: skipped: no Vulkan device (JLM_VK_DEVICE=llvmpipe names lavapipe)\n");
            break;
        }
        if (rc) {
            status = 1;
            break;
        }
        printf("%-6s pp: cpu %8.1f t/s  vulkan %8.1f t/s  ratio %.3f | tg: cpu %8.1f t/s  vulkan %8.1f t/s  "
               "ratio %.3f | vulkan per token: kernels %.2f ms, transfers %.2f ms\n",
               t, c.pp, v.pp, v.pp / c.pp, c.tg, v.tg, v.tg / c.tg, v.kernel_ms, v.xfer_ms);
        unlink(path);
    }
    bench_rmrf(dir);
    free(dir);
    return status;
}
