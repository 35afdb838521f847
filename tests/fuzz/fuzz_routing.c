/* fuzz_routing.c - libFuzzer target for the routing trace reader
 * (engine/routing.c: `jlm run --warm-from`, bench/routing_replay). The input
 * is the trace file's bytes:
 *
 *   make fuzz && mkdir -p /tmp/corpus-routing && \
 *   build-fuzz/fuzz_routing -max_total_time=60 /tmp/corpus-routing tests/fuzz/seeds-routing
 *
 * Every input must be refused with one line naming the file, or parse into
 * n_groups lines of n_used pages, each below n_layer x n_expert, with
 * 1 <= n_tokens <= n_groups; and (up to 65536 pages) its order be a
 * permutation of the pages, most routed first, ties in page order. */
#ifndef _GNU_SOURCE   /* the Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/routing.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    FILE *f = fmemopen((void *)data, size, "r");
    if (!f)
        return 0;
    jlm_routing_trace t;
    jlm_err err = {0};
    int rc = jlm_routing_parse(f, "t.trace", &t, &err);
    fclose(f);
    if (rc) {
        if (t.page || t.n_groups || !err.msg[0] || strchr(err.msg, '\n') || strncmp(err.msg, "t.trace:", 8)) {
            fprintf(stderr, "refusal not one line naming t.trace: '%s'\n", err.msg);
            abort();
        }
        return 0;
    }
    uint64_t np = (uint64_t)t.n_layer * t.n_expert;
    if (!t.page || !t.n_groups || !t.n_tokens || t.n_tokens > t.n_groups || !t.n_used || t.n_used > t.n_expert)
        abort();
    for (uint64_t i = 0; i < (uint64_t)t.n_groups * t.n_used; i++)
        if (t.page[i] >= np)
            abort();
    if (np <= (1u << 16)) {   /* the order of every layer's pages: a permutation, counts descending */
        uint32_t *rank = malloc(t.n_layer * sizeof *rank), *order = malloc(np * sizeof *order);
        uint32_t *cnt = calloc(np, sizeof *cnt);
        uint8_t *seen = calloc(np, 1);
        if (!rank || !order || !cnt || !seen)
            abort();
        for (uint32_t l = 0; l < t.n_layer; l++)
            rank[l] = l;
        if (jlm_routing_order(&t, rank, (uint32_t)np, order, &err))
            abort();
        for (uint64_t i = 0; i < (uint64_t)t.n_groups * t.n_used; i++)
            cnt[t.page[i]]++;
        for (uint64_t i = 0; i < np; i++) {
            if (order[i] >= np || seen[order[i]]++)
                abort();
            if (i && (cnt[order[i]] > cnt[order[i - 1]] ||
                      (cnt[order[i]] == cnt[order[i - 1]] && order[i] < order[i - 1])))
                abort();
        }
        free(rank);
        free(order);
        free(cnt);
        free(seen);
    }
    jlm_routing_free(&t);
    return 0;
}
