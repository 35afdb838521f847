/* fuzz_convert.c - libFuzzer target for what the daemon's scan does with a
 * GGUF dropped into SRC: jlm_conv_open (GGUF parse, config, vocab, tensor
 * mapping, the sanity checks, jlm_fmt_plan) and the read of the planned
 * metadata [0, DenseOff) that a view serves first. Any input must be refused
 * with a message or planned, in bounded memory, without a sanitizer report.
 *   make fuzz && build-fuzz/fuzz_convert -max_total_time=60 -rss_limit_mb=2048 CORPUS/ tests/fuzz/seeds/convert
 * (the first directory receives new inputs: never point it into the tree) */
#include <stdint.h>
#include <stdlib.h>

#include "converter/convert.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_as_file(data, size, path, sizeof path);
    if (fd < 0)
        return 0;
    jlm_conv *c = NULL;
    jlm_err err = {0};
    if (jlm_conv_open(path, NULL, &c, &err) == 0) {
        uint64_t n = c->plan.hdr.dense_off;
        uint8_t *meta = n <= (64u << 20) ? malloc(n ? n : 1) : NULL;
        if (meta)
            (void)jlm_conv_read_span(c, 0, n, meta, &err);
        free(meta);
        jlm_conv_close(c);
    }
    close(fd);
    return 0;
}
