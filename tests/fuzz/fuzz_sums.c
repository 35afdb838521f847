/* fuzz_sums.c - libFuzzer target for the page-checksum sidecar reader
 * (format/sums.c, docs/checksums.md). The input is a container's first
 * JLM_HEADER_LEN bytes, the container's size (8 bytes, little-endian), then
 * the sidecar's bytes:
 *
 *   make fuzz && mkdir -p /tmp/corpus-sums && \
 *   build-fuzz/fuzz_sums -max_total_time=60 /tmp/corpus-sums tests/fuzz/seeds-sums
 *
 * Every input must be refused with one line naming the sidecar, or load
 * into spans that are sorted, disjoint, inside the container and found
 * again by jlm_sums_find; naming and checking a span never reads past it. */
#ifndef _GNU_SOURCE   /* the Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/sums.h"

static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < JLM_HEADER_LEN + 8)
        return 0;
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/fuzz_sums.%ld", (long)getpid());
    uint64_t file_size = 0;
    for (int i = 0; i < 8; i++)
        file_size |= (uint64_t)data[JLM_HEADER_LEN + i] << (8 * i);
    const uint8_t *side = data + JLM_HEADER_LEN + 8;
    size_t n = size - JLM_HEADER_LEN - 8;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, side, n) != (ssize_t)n || close(fd))
        abort();
    jlm_sums *s = NULL;
    jlm_err err = {0};
    int rc = jlm_sums_load(AT_FDCWD, path, data, file_size, &s, &err);
    unlink(path);
    if (rc) {
        if (s || !err.msg[0] || strchr(err.msg, '\n') || !strstr(err.msg, path)) {
            fprintf(stderr, "refusal not one line naming %s: '%s'\n", path, err.msg);
            abort();
        }
        return 0;
    }
    uint64_t end = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const jlm_span *sp = &s->spans[i];
        if (sp->off < end || sp->len == 0 || sp->off + sp->len > file_size || sp->off + sp->len < sp->off)
            abort();
        end = sp->off + sp->len;
        if (i < 4096 && (jlm_sums_find(s, sp->off) != (int64_t)i || jlm_sums_find(s, end - 1) != (int64_t)i))
            abort();
        char name[256];
        if (i < 4096)
            jlm_sums_name(s, i, name, sizeof name);
        static const uint8_t zeros[4096];
        uint64_t got = 0;
        if (i < 64 && sp->len <= (1u << 16))   /* checked against zeros (invariant 3): bounded work */
            (void)jlm_sums_check(s, i, zeros, sp->len < sizeof zeros ? sp->len : sizeof zeros, "fuzz", &got, &err);
    }
    jlm_sums_free(s);
    return 0;
}
