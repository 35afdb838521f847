/* fuzz_safetensors.c - libFuzzer target for the safetensors header parser and
 * the config.json mapping (converter/safetensors.c, converter/hf.c).
 *
 *   make fuzz && mkdir -p /tmp/corpus-st && build-fuzz/fuzz_safetensors -max_total_time=60 /tmp/corpus-st
 *
 * Input: config.json text, a NUL byte, then one safetensors image (no NUL: the
 * whole input is the image, with tests/models/hf/tiny-llama's config). Seeds:
 * tests/fuzz/seeds-safetensors/. Every input is refused with a message or
 * becomes a handle whose every tensor we read back through the virtual reader
 * (permutation, widening, stacking), so ASan sees any read outside the image.
 * The image also goes through jlmfs's completeness check
 * (jlm_st_image_complete), whole and cut short: an image the parser accepts
 * must count as complete, and no cut of it shorter than its data may.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "converter/hf.h"
#include "converter/safetensors.h"

static const char DEFAULT_CFG[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8,\"intermediate_size\":16,"
    "\"num_attention_heads\":2,\"num_hidden_layers\":1,\"num_key_value_heads\":1,\"vocab_size\":4}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const char *cfg = DEFAULT_CFG;
    size_t cl = sizeof DEFAULT_CFG - 1;
    const uint8_t *img = data;
    size_t il = size;
    if (nul) {
        cfg = (const char *)data;
        cl = (size_t)(nul - data);
        img = nul + 1;
        il = size - cl - 1;
    }
    int complete = jlm_st_image_complete(img, il, il);
    /* a shard cut at half its length (the copy so far) */
    (void)jlm_st_image_complete(img, il / 2, il / 2);
    jlm_gguf *g = NULL;
    jlm_err err;
    err.msg[0] = '\0';
    jlm_st_set *st = NULL;
    if (jlm_st_open_mem(img, il, "fuzz", &st, &err) == 0) {
        if (!complete)
            abort();   /* a shard the parser accepts is complete */
        if (jlm_st_image_complete(img, il - 1, il - 1))
            abort();   /* its data tiles the file to the end: one byte less is a copy not finished */
        jlm_st_close(st);
    }
    err.msg[0] = '\0';
    if (jlm_hf_open_mem(cfg, cl, img, il, &g, &err) != 0) {
        if (!err.msg[0])
            abort();   /* every refusal says why */
        return 0;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const jlm_gguf_tensor *t = &g->tensors[i];
        size_t n = t->n_bytes < (1u << 20) ? (size_t)t->n_bytes : (1u << 20);
        uint8_t *buf = malloc(n + 1);
        if (buf && jlm_gguf_read(g, t, 0, buf, n, &err) != 0 && !err.msg[0])
            abort();
        free(buf);
    }
    jlm_gguf_close(g);
    return 0;
}
