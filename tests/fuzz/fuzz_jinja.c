/* fuzz_jinja.c - libFuzzer target for the Jinja interpreter
 * (text/template/jinja*.c): a template and the variables a chat template is
 * rendered with.
 *
 *   make fuzz && mkdir -p /tmp/corpus-jj && build-fuzz/fuzz_jinja -max_total_time=60 /tmp/corpus-jj build-fuzz/seeds/jinja
 *
 * Input: template bytes, a NUL, then a JSON object of variables (messages,
 * add_generation_prompt, bos_token, ... as in
 * tests/reference/chat-templates/ *.cases.json); no NUL: the whole input is
 * the template, rendered without variables. The template is parsed once and
 * rendered; an error must come with a message, output must be NUL-terminated
 * at its length. The interpreter's own bounds (jinja.h invariant 4) keep each
 * input's time and memory bounded.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/template/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    const char *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - src) : size;
    json_t *vars = NULL;
    if (nul) {
        vars = json_loadb(nul + 1, size - tlen - 1, JSON_DECODE_ANY, NULL);
        if (vars && !json_is_object(vars)) {   /* a bare array: the messages */
            json_t *o = json_object();
            json_object_set_new(o, "messages", vars);
            vars = o;
        }
    }
    jlm_jinja *t = NULL;
    jlm_err err;
    err.msg[0] = '\0';
    if (jlm_jinja_parse(src, tlen, &t, &err) != 0) {
        if (!err.msg[0])
            abort();
        json_decref(vars);
        return 0;
    }
    jlm_jinja_opts opts = {.now = 1741348800};   /* fixed clock: reproducible */
    char *out = NULL;
    size_t out_len = 0;
    err.msg[0] = '\0';
    if (jlm_jinja_render(t, vars, &opts, &out, &out_len, &err) != 0) {
        if (!err.msg[0])
            abort();
    } else if (out[out_len] != '\0') {
        abort();
    }
    free(out);
    jlm_jinja_free(t);
    json_decref(vars);
    return 0;
}
