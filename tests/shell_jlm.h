/* shell_jlm.h - "shell" containers: a real header, sections and tensor table
 * from the planner, written by the atomic writer, with every weight byte left
 * as the writer's zero fill (a sparse file). Enough for everything that reads
 * only [0, DenseOff): jlm info, the picture, page extents. Used by
 * tests/test_picture.c (a vision container, which no test model converts to
 * yet) and bench/bench_picture.c (1B-scale shapes without 1 GB of weights).
 * Header-only (static). */
#ifndef JLM_SHELL_JLM_H
#define JLM_SHELL_JLM_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/jlm_format.h"

typedef struct shell_list {
    jlm_tensor t[4096];
    char       names[4096][48];
    uint32_t   n;
} shell_list;

static inline void shell_add(shell_list *L, uint16_t role, int32_t block, uint8_t type, int ndim,
                             uint64_t d0, uint64_t d1, uint64_t d2, const char *name)
{
    if (L->n >= 4096)
        return;
    jlm_tensor *t = &L->t[L->n];
    snprintf(L->names[L->n], sizeof L->names[0], "%s", name);
    *t = (jlm_tensor){.role = role, .block = block, .index = -1, .type = type, .ndim = (uint8_t)ndim,
                      .dims = {d0, d1, d2, 1}, .name = {L->names[L->n], (uint32_t)strlen(L->names[L->n])}};
    L->n++;
}

/* Plans and writes path (atomically); 0 or a JLM_E* code with err set. */
static inline int shell_write(const char *path, const jlm_config *cfg, const jlm_vision *vis, const shell_list *L,
                              jlm_err *err)
{
    static jlm_str toks[4] = {{"<unk>", 5}, {"<s>", 3}, {"</s>", 4}, {"a", 1}};
    jlm_vocab v = {0};
    v.kind = JLM_VOCAB_SPM;
    v.n_tokens = 4; v.tokens = toks;
    v.bos = 1; v.eos = 2; v.unk = 0; v.pad = v.sep = v.mask = -1;
    jlm_fingerprint fp = {{"shell", 5}, {"cpu", 3}, {"shell_jlm.h", 11}, 0};
    jlm_plan_input in = {.config = cfg, .vision = vis, .vocab = &v, .fp = &fp, .n_tensors = L->n, .tensors = L->t};
    jlm_plan p;
    int rc = jlm_fmt_plan(&in, &p, err);
    if (rc)
        return rc;
    jlm_writer *w = NULL;
    rc = jlm_fmt_writer_open(path, &p, &jlm_io_posix, &w, err);
    if (!rc)
        rc = jlm_fmt_writer_commit(w, err);
    jlm_fmt_plan_free(&p);
    return rc;
}

#endif
