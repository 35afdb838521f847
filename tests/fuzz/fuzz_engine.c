/* fuzz_engine.c - libFuzzer target for `jlm run` on an altered container:
 * jlm_engine_open (the reader's checks, the sanity checks against the graph,
 * buffers sized from the config) and, when it opens, one forward pass of one
 * token. Seeds are tiny containers (tests/fuzz/seeds/engine); an input either
 * opens and evaluates or is refused, without a sanitizer report.
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
        float *logits = malloc((size_t)jlm_engine_n_vocab(e) * sizeof *logits + 1);
        int32_t tok = 1;
        if (logits)
            (void)jlm_engine_eval(e, &tok, 1, logits, &err);
        free(logits);
        jlm_engine_close(e);
    }
    close(fd);
    return 0;
}
