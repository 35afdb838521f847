/* fuzz_hf_tokenizer.c - libFuzzer target for the tokenizer.json reader
 * (converter/hf_tok.c) and the vocab record built from what it emits
 * (converter/vocab.c).
 *
 *   make fuzz && mkdir -p /tmp/corpus-tok && build-fuzz/fuzz_hf_tokenizer -max_total_time=60 /tmp/corpus-tok tests/fuzz/seeds-hf-tokenizer
 *
 * Input: a tokenizer.json text. Every input is refused with a message, or
 * becomes a vocab-only handle whose record is built (tokens, merges, specials,
 * end-of-generation set), so ASan sees any id or string used out of bounds.
 * A record the tokenizer accepts then encodes decomposed text and the input's
 * own first bytes (the NFC stage of a normalizer NFC file included).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "converter/hf.h"
#include "converter/vocab.h"
#include "text/tokenizer/tokenizer.h"

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
    int rc = a ? jlm_conv_vocab(g, a, &v, &err) : JLM_ENOMEM;
    if (a && rc != 0 && !err.msg[0])
        abort();
    jlm_tok *tok = NULL;
    if (!rc && jlm_tok_create(&v, &tok, &err) == 0) {
        static const char D[] = "cafe\xcc\x81 A\xcc\x8a e\xcc\x82\xcc\xa3 \xe1\x84\x80\xe1\x85\xa1 \xed\xa0\x80\xf7\xbf\xbf\xbf";
        int32_t *ids = NULL;
        size_t n = 0;
        if (jlm_tok_encode(tok, D, sizeof D - 1, 1, 1, &ids, &n, &err) == 0)
            free(ids);
        ids = NULL;
        if (jlm_tok_encode(tok, (const char *)data, size < 256 ? size : 256, 0, 1, &ids, &n, &err) == 0)
            free(ids);
        jlm_tok_destroy(tok);
    }
    jlm_arena_free(a);
    jlm_gguf_close(g);
    return 0;
}
