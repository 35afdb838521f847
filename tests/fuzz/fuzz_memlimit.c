/* fuzz_memlimit.c - libFuzzer target for the automatic budget's parsers
 * (engine/memlimit.c): the input as a limit file's text, as
 * /proc/self/cgroup and as /proc/meminfo. They must not crash or read out of
 * bounds (the input is not NUL-terminated), paths must fit their buffers,
 * and an accepted limit must be what its digits say or "no limit".
 *   make fuzz && build-fuzz/fuzz_memlimit -max_total_time=60 CORPUS/ */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/memlimit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *t = malloc(size ? size : 1);   /* exactly size bytes: ASan sees any overread */
    if (!t)
        return 0;
    memcpy(t, data, size);
    uint64_t v = 0;
    if (jlm_memlimit_parse_value(t, size, &v) == 0 && v != UINT64_MAX) {
        if (!size || t[0] < '0' || t[0] > '9' || v >= (1ull << 60))
            abort();   /* only digits give a finite limit, below the no-limit floor */
    }
    char v2[64], v1[8];
    jlm_memlimit_parse_cgroup(t, size, v2, sizeof v2, v1, sizeof v1);
    if (strlen(v2) >= sizeof v2 || strlen(v1) >= sizeof v1 || (v2[0] && v2[0] != '/') || (v1[0] && v1[0] != '/'))
        abort();
    (void)jlm_memlimit_parse_meminfo(t, size);
    free(t);
    return 0;
}
