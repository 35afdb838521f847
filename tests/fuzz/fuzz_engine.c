/* fuzz_engine.c - libFuzzer target for `jlm run` on an altered container:
 * jlm_engine_open (the reader's checks, the sanity checks against the graph,
 * buffers sized from the config) and, when it opens, a forward pass of a
 * batch of three tokens and then one of one token. Seeds are tiny
 * containers (tests/fuzz/seeds/engine); an input either opens and
 * evaluates or is refused, without a sanitizer report.
 *   make fuzz && build-fuzz/fuzz_engine -max_total_time=60 -rss_limit_mb=2048 CORPUS/ tests/fuzz/seeds/engine */
#include <stdint.h>
#include <stdlib.h>

#include "engine/model.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_as_file(data, size, path, sizeof path);
    if (fd < 0)
        return 0;
    jlm_engine_opts o = {.n_threads = 1, .n_ctx = 8, .quiet = 1};
    jlm_engine *e = NULL;
    jlm_err err = {0};
    if (jlm_engine_open(path, &o, &e, &err) == 0) {
        uint32_t nv = jlm_engine_n_vocab(e);
        float *logits = malloc((size_t)nv * sizeof *logits + 1);
        int32_t toks[3];
        for (int i = 0; i < 3; i++)
            toks[i] = nv ? (int32_t)((uint32_t)(i + 1) % nv) : 0;
        /* a batch of three (the prefill paths: GEMM, batched attention, a MoE
         * layer grouped by expert), then one token (the decode paths) */
        if (logits && jlm_engine_eval(e, toks, 3, logits, &err) == 0)
            (void)jlm_engine_eval(e, toks, 1, logits, &err);
        free(logits);
        jlm_engine_close(e);
    }
    close(fd);
    return 0;
}
