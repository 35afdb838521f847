/* fuzz_cli_opts.c - libFuzzer target for the command line's option parser
 * (cli/opts.c) and the chat's UTF-8 repair (text/tokenizer/utf8_fix.c). The
 * input, split at NUL bytes, is an argv for a table holding every option
 * kind; the parser must accept or refuse with exit 2, never crash, and every
 * accepted number must be in its range. The input as text must come out of
 * jlm_utf8_fix as valid UTF-8 (utf8proc agrees) of at most 3 bytes a byte.
 * The first four entries are also --backend, --device, --gpu-layers and
 * --gpu-budget lists (the device split): accepted or refused with 2, and an
 * accepted split names at most two different device kinds with counts in
 * range.
 *   make fuzz && build-fuzz/fuzz_cli_opts -max_total_time=60 CORPUS/ */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "cli/opts.c"
#include "cli/util.c"
#include "cli/backend.c"   /* jlm_opts_engine_finish checks --backend */
#include "text/tokenizer/utf8_fix.h"

static void check_utf8(const uint8_t *data, size_t size)
{
    char *f = jlm_utf8_fix((const char *)data, size);
    if (!f)
        return;
    size_t n = strlen(f);
    if (n > size * 3)
        abort();
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)f + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            abort();
        i += (size_t)k;
    }
    free(f);
}

/* The device split's lists, as jlm_opts_engine_finish parses them (without
 * its device probe). */
static void check_split(const char *backend, const char *device, const char *layers, const char *budget)
{
    jlm_engine_split sp;
    jlm_err err = {0};
    if (jlm_engine_split_parse(backend, device, &sp, &err)) {
        if (!err.msg[0] || strchr(err.msg, '\n'))
            abort();   /* a refusal is one line */
        return;
    }
    if (sp.n < 0 || sp.n > JLM_ENGINE_DEVS || (sp.n == 2 && sp.kind[0] == sp.kind[1]))
        abort();
    jlm_engine_opts eo = {0};
    int a = gpu_layers_list("fuzz", layers, sp.n, &eo), b = a ? 0 : gpu_budget_list("fuzz", budget, sp.n, &eo);
    if ((a != 0 && a != 2) || (b != 0 && b != 2) || eo.gpu_layers > 1u << 20 || eo.gpu_layers2 > 1u << 20)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_utf8(data, size);
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[64] = {"fuzz"};
    int argc = 1;
    for (char *p = buf; p < buf + size + 1 && argc < 63; p += strlen(p) + 1)
        argv[argc++] = p;
    int n = -7, flag = 0, top_k = 0;
    uint32_t ctx = 0;
    float top_p = 0.5f, pen = 1.0f;
    uint64_t seed = 0, budget = 0;
    const char *str = NULL;
    const jlm_opt t[] = {
        {"-n", NULL, JLM_OPT_INT, &n, -1, 1 << 30, 0, "N", "n"},
        {"-c", NULL, JLM_OPT_U32, &ctx, 0, 1 << 24, 0, "N", "c"},
        {NULL, "--top-k", JLM_OPT_INT, &top_k, 0, 1 << 30, 0, "K", "k"},
        {NULL, "--top-p", JLM_OPT_F32, &top_p, 0, 1, 0, "P", "p"},
        {NULL, "--rp", JLM_OPT_F32, &pen, 0, 1e6, JLM_OPT_LO_OPEN, "R", "r"},
        {"-s", NULL, JLM_OPT_SEED, &seed, 0, 0, 0, "S", "s"},
        {NULL, "--budget", JLM_OPT_SIZE, &budget, 0, 0, 0, "SIZE", "b"},
        {NULL, "--flag", JLM_OPT_FLAG, &flag, 0, 0, 0, NULL, "f"},
        {"-p", NULL, JLM_OPT_STR, &str, 0, 0, 0, "TEXT", "t"},
    };
    const char *pos[2] = {0};
    jlm_opts_spec s = {"fuzz", "[options]", t, (int)(sizeof t / sizeof t[0]), pos, 2, 0};
    int rc = jlm_opts_parse(&s, argc, argv);
    if (rc == 0 && ((n != -7 && (n < -1 || n > (1 << 30))) || ctx > (1u << 24) || top_p < 0 || top_p > 1 ||
                    !(pen > 0) || s.n_pos > 2))
        abort();
    if (rc != 0 && rc != 1 && rc != 2)
        abort();
    check_split(argc > 1 ? argv[1] : NULL, argc > 2 ? argv[2] : NULL, argc > 3 ? argv[3] : NULL,
                argc > 4 ? argv[4] : NULL);
    free(buf);
    return 0;
}
