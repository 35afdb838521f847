/* fuzz_mmproj.c - libFuzzer target for the mmproj conversion
 * (converter/vision_map.c): the input is an mmproj GGUF, converted with the
 * text model tests/models/synth-gemma3v-128.F32.gguf (run from the repo root,
 * or set JLM_FUZZ_TEXT) through the whole plan (pass 1).
 *
 *   make fuzz && mkdir -p /tmp/corpus-mm && cp tests/models/mmproj-tinygemma3.gguf /tmp/seed-mm/ && \
 *   build-fuzz/fuzz_mmproj -max_total_time=60 -max_len=1100000 /tmp/corpus-mm /tmp/seed-mm
 *
 * Every input must be refused with a one-line message naming the file, or
 * planned into a container whose vision record matches the tower tensors it
 * holds (every vision tensor inside its block's page or the dense region). */
#ifndef _GNU_SOURCE   /* the Makefile passes -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "converter/convert.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = getenv("JLM_FUZZ_TEXT");
    if (!text)
        text = "tests/models/synth-gemma3v-128.F32.gguf";
    int fd = memfd_create("mmproj", 0);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    jlm_conv *c = NULL;
    jlm_err err;
    err.msg[0] = '\0';
    if (jlm_conv_open_mm(text, path, NULL, &c, &err) != 0) {
        if (c || !err.msg[0] || strchr(err.msg, '\n'))
            abort();
        close(fd);
        return 0;
    }
    const jlm_header *h = &c->plan.hdr;
    if (!c->mm || h->n_vis_blocks != c->vision.n_layer)
        abort();
    for (uint32_t i = 0; i < c->n_tensors; i++) {
        const jlm_tensor *t = &c->tensors[i];
        if (t->role < JLM_R_VISION_FIRST || t->role > JLM_R_VISION_LAST || t->block < 0 ||
            jlm_fmt_role_is_dense(t->role))
            continue;
        uint64_t lo = h->vis_data_off + (uint64_t)t->block * h->vis_page_size;
        if (t->qs_off < lo || t->qs_off >= lo + h->vis_page_size)
            abort();
    }
    jlm_conv_close(c);
    close(fd);
    return 0;
}
