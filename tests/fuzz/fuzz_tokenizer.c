/* fuzz_tokenizer.c - libFuzzer target for the tokenizer (text/tokenizer/):
 * a vocab record (jlm-format.md 4.3, as a container carries it) and a text.
 *
 *   make fuzz && mkdir -p /tmp/corpus-tk && build-fuzz/fuzz_tokenizer -max_total_time=60 /tmp/corpus-tk build-fuzz/seeds/tokenizer
 *
 * Input: u32 (little-endian) record length L, L bytes of vocab record, then
 * the text. The record is decoded (jlm_fmt_vocab_decode); a record the
 * tokenizer accepts encodes the text with and without specials, every id is
 * checked in range, the ids are decoded and streamed back, and every piece is
 * looked up: ASan sees any string or table used out of bounds. A refusal must
 * come with a message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/jlm_format.h"
#include "text/tokenizer/tokenizer.h"

static void round_trip(const jlm_tok *t, const char *text, size_t len, int special)
{
    int32_t *ids = NULL;
    size_t n = 0;
    jlm_err err;
    err.msg[0] = '\0';
    if (jlm_tok_encode(t, text, len, special, special, &ids, &n, &err) != 0) {
        if (!err.msg[0])
            abort();
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= jlm_tok_n_tokens(t))
            abort();   /* tokenizer.h invariant 2 */
    char *out = NULL;
    size_t out_len = 0;
    if (jlm_tok_decode(t, ids, n, special, &out, &out_len, &err) != 0)
        abort();   /* every id is in range: decode cannot fail but for memory */
    free(out);
    jlm_tok_stream s;
    jlm_tok_stream_init(&s, t, special, 1);
    size_t cap = jlm_tok_max_piece_len(t) + 4;
    char *chunk = malloc(cap);
    for (size_t i = 0; chunk && i < n; i++) {
        size_t got = 0;
        if (jlm_tok_stream_feed(&s, ids[i], chunk, cap, &got, &err) != 0)
            abort();
    }
    char tail[4];
    (void)jlm_tok_stream_flush(&s, tail);
    free(chunk);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t rec;
    if (size < 4)
        return 0;
    memcpy(&rec, data, 4);
    if (rec > size - 4)
        return 0;
    jlm_arena *a = jlm_arena_new();
    jlm_vocab v;
    jlm_tok *t = NULL;
    jlm_err err;
    err.msg[0] = '\0';
    if (a && jlm_fmt_vocab_decode(data + 4, rec, a, &v, "fuzz", &err) == 0) {
        err.msg[0] = '\0';
        if (jlm_tok_create(&v, &t, &err) != 0 && !err.msg[0])
            abort();
    }
    if (t) {
        const char *text = (const char *)data + 4 + rec;
        size_t len = size - 4 - rec;
        round_trip(t, text, len, 0);
        round_trip(t, text, len, 1);
        for (uint32_t i = 0; i < jlm_tok_n_tokens(t) && i < 4096; i++) {
            const char *piece;
            size_t plen;
            if (jlm_tok_piece(t, (int32_t)i, (int)(i & 1), &piece, &plen, &err) != 0)
                abort();
        }
    }
    jlm_tok_destroy(t);
    jlm_arena_free(a);
    return 0;
}
