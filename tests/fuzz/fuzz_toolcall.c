/* fuzz_toolcall.c - libFuzzer target for serve/toolcall.h: the reply parser
 * of every family, the streaming hold-back, the deltas, and the request's
 * tool fields with the grammar they compile to.
 *
 *   make fuzz && mkdir -p /tmp/corpus && build-fuzz/fuzz_toolcall -max_total_time=60 /tmp/corpus tests/fuzz/seeds-toolcall
 *
 * Input: the first byte picks the family (low 3 bits) and the mode (bit 7
 * set: the rest is a request body; else it is a model's reply). A reply
 * always parses (the parser never refuses text), every call it gives has a
 * name and JSON-object arguments, the content it keeps is no longer than
 * the reply, and the hold-back never passes the end. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/toolcall.h"
#include "text/grammar/grammar.h"

static void reply(jlm_tc_family f, const char *s, size_t n)
{
    jlm_tc_result r;
    uint64_t ids = n;
    if (jlm_tc_parse(f, s, n, &ids, &r, NULL))
        return;   /* out of memory only */
    if (r.content_len > n || r.content[r.content_len] != 0)
        abort();
    size_t i;
    const json_t *c;
    json_array_foreach(r.calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        const char *a = json_string_value(json_object_get(fn, "arguments"));
        json_t *o = a ? json_loads(a, JSON_ALLOW_NUL, NULL) : NULL;   /* a value may hold \u0000 */
        if (!json_is_string(json_object_get(fn, "name")) || !json_is_object(o))
            abort();
        json_decref(o);
    }
    json_decref(jlm_tc_deltas(r.calls, 1 + n % 7));
    jlm_tc_result_free(&r);
    for (size_t k = 0; k <= n; k += 1 + n / 16)
        if (jlm_tc_content_prefix(f, s, k, k == n) > k)
            abort();
}

static void request(jlm_tc_family f, const char *s, size_t n)
{
    json_t *o = json_loadb(s, n, 0, NULL);
    jlm_tc_req r;
    jlm_err err = {0};
    if (o && jlm_tc_req_parse(o, &r, &err) == 0) {
        char *g = NULL;
        if (r.tools && (r.choice == JLM_TC_REQUIRED || r.choice == JLM_TC_NAMED) &&
            jlm_tc_grammar(f == JLM_TC_NONE ? JLM_TC_HERMES : f, &r, &g, &err) == 0) {
            jlm_gram *gr = NULL;
            if (jlm_gram_parse(g, strlen(g), &gr, &err))
                abort();   /* what the tools compile to is a grammar */
            jlm_gram_free(gr);
            free(g);
        }
        jlm_tc_req_free(&r);
    } else if (o && !err.msg[0]) {
        abort();   /* a refusal always says why */
    }
    if (o && json_is_array(json_object_get(o, "messages")) && !jlm_tc_check_messages(json_object_get(o, "messages"), &err))
        json_decref(jlm_tc_messages_for_template(json_object_get(o, "messages")));
    json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    jlm_tc_family f = (jlm_tc_family)((data[0] & 7) % (JLM_TC_GRANITE + 1));
    if (data[0] & 0x80)
        request(f, (const char *)data + 1, size - 1);
    else
        reply(f, (const char *)data + 1, size - 1);
    return 0;
}
