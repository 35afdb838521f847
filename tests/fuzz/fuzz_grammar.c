/* fuzz_grammar.c - libFuzzer target for constrained decoding
 * (text/grammar/): the GBNF parser, the JSON Schema converter and the
 * matcher.
 *
 *   make fuzz && mkdir -p /tmp/corpus-gr && build-fuzz/fuzz_grammar -max_total_time=60 /tmp/corpus-gr tests/fuzz/seeds-grammar
 *
 * Input: a text, optionally followed by a NUL and bytes to feed. A text that
 * starts with '{' is a JSON Schema: converted, and the GBNF it gives must
 * parse. Otherwise the text is GBNF. A grammar that parses is then driven:
 * the fed bytes one at a time (each must be allowed by the mask over a small
 * vocab of every single byte plus a few multi-byte tokens exactly when
 * accepting it succeeds), with the close cost checked against the mask's
 * budget rule. Errors must come with a one-line message.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar.h"

static jlm_gram_vocab *V;

static void make_vocab(void)
{
    static char bytes[256];
    static const char *multi[] = {"{\"", "\":", "\xc3\xa9", "\xe2\x82", "\xac", "true", " \"", "12"};
    const char *pc[256 + 8 + 1];
    size_t ln[256 + 8 + 1];
    uint8_t eog[256 + 8 + 1] = {0};
    for (int i = 0; i < 256; i++) { bytes[i] = (char)i; pc[i] = &bytes[i]; ln[i] = 1; }
    for (int i = 0; i < 8; i++) { pc[256 + i] = multi[i]; ln[256 + i] = strlen(multi[i]); }
    pc[264] = "";
    ln[264] = 0;
    eog[264] = 1;
    if (jlm_gram_vocab_new(265, pc, ln, eog, &V, NULL)) abort();
}

static void check_msg(const jlm_err *err)
{
    if (!err->msg[0] || strchr(err->msg, '\n')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!V) make_vocab();
    const char *src = (const char *)data;
    const char *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - src) : size;
    const uint8_t *feed = nul ? (const uint8_t *)nul + 1 : NULL;
    size_t nfeed = nul ? size - tlen - 1 : 0;
    jlm_err err = {0};
    char *gbnf = NULL;
    if (tlen && src[0] == '{') {
        if (jlm_gram_from_schema(src, tlen, &gbnf, &err)) {
            check_msg(&err);
            return 0;
        }
        src = gbnf;
        tlen = strlen(gbnf);
    }
    jlm_gram *g = NULL;
    if (jlm_gram_parse(src, tlen, &g, &err)) {
        check_msg(&err);
        if (gbnf) abort();   /* the converter wrote a grammar the parser refuses */
        return 0;
    }
    jlm_gram_match *m = NULL;
    float lg[265];
    if (jlm_gram_match_new(g, &m, NULL)) abort();
    for (size_t k = 0; k < nfeed && k < 64; k++) {
        for (int i = 0; i < 265; i++) lg[i] = 0;
        long n = jlm_gram_mask(m, V, -1, lg);
        if (n < 0) abort();
        int allowed = lg[feed[k]] == 0;
        int rc = jlm_gram_accept(m, V, feed[k], &err);
        if ((rc == 0) != allowed) abort();   /* the mask and the matcher disagree */
        if (rc) {
            check_msg(&err);
            break;
        }
        if (jlm_gram_can_end(m) != (jlm_gram_close_cost(m) == 0)) abort();
    }
    jlm_gram_match_free(m);
    jlm_gram_free(g);
    free(gbnf);
    return 0;
}
