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
 * input's time and memory bounded: here a step budget of FUZZ_STEPS and an
 * output limit of FUZZ_OUT (so a runaway loop or a doubled string costs
 * milliseconds, not the default budgets' second and 64 MiB), and an
 * input of odd size is cancelled at the first cancel check (65536 steps),
 * so both the step limit and the cancel path are exercised. Seeds:
 * build-fuzz/seeds/jinja (mkseeds: every reference template with its first
 * case) and tests/fuzz/seeds-jinja (templates that hit the budgets).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/template/jinja.h"

#define FUZZ_STEPS 100000
#define FUZZ_OUT   (1 << 20)   /* the output and string limit: a doubled string stops at 1 MiB */

static int cancel_first(void *arg)
{
    return ++*(int *)arg >= 1;
}

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
    int calls = 0;
    jlm_jinja_opts opts = {.now = 1741348800, .max_steps = FUZZ_STEPS, .max_out = FUZZ_OUT};   /* fixed clock */
    if (size & 1) {
        opts.cancelled = cancel_first;
        opts.cancel_arg = &calls;
    }
    char *out = NULL;
    size_t out_len = 0;
    err.msg[0] = '\0';
    int rc = jlm_jinja_render(t, vars, &opts, &out, &out_len, &err);
    if (rc != 0) {
        if (!err.msg[0] || (rc == JLM_EIO && !(size & 1)))   /* cancelled without a cancel */
            abort();
    } else if (out[out_len] != '\0') {
        abort();
    }
    free(out);
    jlm_jinja_free(t);
    json_decref(vars);
    return 0;
}
