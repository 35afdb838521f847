/* fuzz_gguf.c - libFuzzer target for the GGUF parser (converter/gguf.c).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_gguf.c \
 *       converter/gguf.c converter/ggml_quants.c base/jlm_err.c -o fuzz_gguf
 *   ./fuzz_gguf -max_len=65536 CORPUS_DIR
 *
 * Seeds: metadata prefixes of the files in tests/models, plus small whole files. Every input
 * must be either refused with a message or opened into a handle whose tables
 * we then walk, so ASan sees any entry that points outside what was parsed.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "converter/gguf.h"

static void walk_kv(const jlm_gguf_kv *kv, unsigned depth)
{
    volatile size_t sink = kv->key.s ? strlen(kv->key.s) : 0;
    if (kv->type == GGUF_T_STRING)
        sink += strlen(kv->v.str.s);
    if (kv->type != GGUF_T_ARRAY || depth > 16)
        return;
    if (kv->arr_type == GGUF_T_STRING)
        for (uint64_t i = 0; i < kv->n; i++)
            sink += ((const jlm_gguf_str *)kv->arr)[i].s[((const jlm_gguf_str *)kv->arr)[i].len];
    else if (kv->arr_type == GGUF_T_ARRAY)
        for (uint64_t i = 0; i < kv->n; i++)
            walk_kv(&((const jlm_gguf_kv *)kv->arr)[i], depth + 1);
    else if (kv->n)
        sink += ((const uint8_t *)kv->arr)[0];
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jlm_gguf *g = NULL;
    jlm_err err;
    err.msg[0] = '\0';
    if (jlm_gguf_open_mem(data, size, "fuzz.gguf", &g, &err) != 0) {
        if (g || !err.msg[0])
            abort();   /* contract: *out untouched, a message given */
        return 0;
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        walk_kv(&g->kv[i], 0);
        if (jlm_gguf_find(g, g->kv[i].key.s) == NULL)
            abort();
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const jlm_gguf_tensor *t = &g->tensors[i];
        if (jlm_gguf_find_tensor(g, t->name.s) != t || t->data_off + t->n_bytes > size)
            abort();
        uint8_t buf[16];
        size_t n = t->n_bytes < sizeof buf ? (size_t)t->n_bytes : sizeof buf;
        if (jlm_gguf_read(g, t, t->n_bytes - n, buf, n, &err) != 0)
            abort();
    }
    jlm_gguf_close(g);
    return 0;
}
