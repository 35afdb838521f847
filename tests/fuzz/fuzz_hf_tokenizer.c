/* fuzz_hf_tokenizer.c - libFuzzer target for the tokenizer.json reader
 * (converter/hf_tok.c) and the vocab record built from what it emits
 * (converter/vocab.c).
 *
 *   make fuzz && mkdir -p /tmp/corpus-tok && build-fuzz/fuzz_hf_tokenizer -max_total_time=60 /tmp/corpus-tok tests/fuzz/seeds-hf-tokenizer
 *
 * Input: a tokenizer.json text. Every input is refused with a message, or
 * becomes a vocab-only handle whose record is built (tokens, merges, specials,
 * end-of-generation set), so ASan sees any id or string used out of bounds.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "converter/hf.h"
#include "converter/vocab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jlm_gguf *g = NULL;
    jlm_err err;
    err.msg[0] = '\0';
    if (jlm_hf_open_tok_mem((const char *)data, size, &g, &err) != 0) {
        if (!err.msg[0])
            abort();
        return 0;
    }
    jlm_arena *a = jlm_arena_new();
    jlm_vocab v;
    err.msg[0] = '\0';
    if (a && jlm_conv_vocab(g, a, &v, &err) != 0 && !err.msg[0])
        abort();
    jlm_arena_free(a);
    jlm_gguf_close(g);
    return 0;
}
