/* fuzz_jlm.c - libFuzzer target for the container reader: any bytes given to
 * jlm_fmt_parse (and, when accepted, every tensor's placement query) must be
 * refused or accepted without a crash, leak or out-of-bounds read.
 *   make fuzz && build-fuzz/fuzz_jlm -max_total_time=60 CORPUS/ */
#include <stdint.h>
#include <stddef.h>

#include "format/jlm_format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jlm_model *m = NULL;
    if (jlm_fmt_parse(data, size, size, "fuzz", &m, NULL) == 0) {
        for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
            jlm_tensor_loc l;
            jlm_fmt_tensor_loc(m, &m->tensors[i], &l);
        }
        for (uint32_t b = 0; b < m->hdr.n_blocks && b < 64; b++)
            (void)jlm_fmt_page_extent(m, JLM_REG_TEXT, b);
        jlm_fmt_close(m);
    }
    return 0;
}
