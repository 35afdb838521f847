/* test_toolcall.c - serve/toolcall.h on fixed model outputs of every family
 * (tests/toolcall/cases.json, shared with the served test in test_serve.c):
 * the parsed calls, the streamed deltas and the content held back while a
 * reply grows, the families of the real templates, the grammar that forces a
 * call, the request fields and the ChatML tools template. */
#include <criterion/criterion.h>

#include <ctype.h>
#include <jansson.h>
#include <string.h>

#include "serve/toolcall.h"
#include "text/grammar/grammar.h"
#include "text/template/chat.h"
#include "tests/testutil.h"

static json_t *cases(void)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/tests/toolcall/cases.json", tu_root());
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    cr_assert(json_is_array(c), "%s: %s", p, je.text);
    return c;
}

static jlm_tc_family family_named(const char *name)
{
    for (int f = JLM_TC_NONE; f <= JLM_TC_GRANITE; f++)
        if (!strcmp(jlm_tc_family_name((jlm_tc_family)f), name))
            return (jlm_tc_family)f;
    cr_assert_fail("no family '%s'", name);
    return JLM_TC_NONE;
}

static void check_result(const json_t *c, const jlm_tc_result *r, size_t i)
{
    const json_t *want = json_object_get(c, "content");
    const char *wc = json_is_string(want) ? json_string_value(want) : "";
    cr_assert_str_eq(r->content, wc, "case %zu: content", i);
    const json_t *wcalls = json_object_get(c, "tool_calls"), *w;
    cr_assert_eq(json_array_size(r->calls), json_array_size(wcalls), "case %zu: %s", i, json_dumps(r->calls, 0));
    size_t k;
    json_array_foreach(wcalls, k, w) {
        const json_t *got = json_array_get(r->calls, k), *f = json_object_get(got, "function");
        cr_assert_str_eq(json_string_value(json_object_get(got, "type")), "function");
        cr_assert_str_eq(json_string_value(json_object_get(f, "name")), json_string_value(json_object_get(w, "name")),
                         "case %zu call %zu", i, k);
        cr_assert_str_eq(json_string_value(json_object_get(f, "arguments")),
                         json_string_value(json_object_get(w, "arguments")), "case %zu call %zu", i, k);
        const char *id = json_string_value(json_object_get(got, "id"));
        cr_assert(id && strlen(id) == 9, "case %zu: a 9-character id", i);
        for (int x = 0; x < 9; x++) cr_assert(isalnum((unsigned char)id[x]));
        for (size_t m = 0; m < k; m++)
            cr_assert_str_neq(id, json_string_value(json_object_get(json_array_get(r->calls, m), "id")), "ids differ");
    }
}

Test(toolcall, every_family_parses_its_fixed_outputs_into_the_expected_calls, .timeout = 10)
{
    json_t *cs = cases(), *c;
    size_t i;
    json_array_foreach(cs, i, c) {
        const char *out = json_string_value(json_object_get(c, "output"));
        jlm_tc_result r;
        jlm_err err = {0};
        uint64_t ids = i;
        cr_assert_eq(jlm_tc_parse(family_named(json_string_value(json_object_get(c, "family"))), out, strlen(out), &ids,
                                  &r, &err), 0, "%s", err.msg);
        check_result(c, &r, i);
        jlm_tc_result_free(&r);
    }
    json_decref(cs);
}

/* A reply streamed token by token (here: byte by byte): the content sent
 * early never runs into a call, and what is parsed at the end gives the
 * same calls and, with what was sent, the same content. */
Test(toolcall, content_held_back_while_streaming_gives_the_same_calls, .timeout = 10)
{
    json_t *cs = cases(), *c;
    size_t i;
    json_array_foreach(cs, i, c) {
        const char *out = json_string_value(json_object_get(c, "output"));
        jlm_tc_family f = family_named(json_string_value(json_object_get(c, "family")));
        size_t n = strlen(out), sent = 0;
        for (size_t k = 0; k <= n; k++) {
            size_t s = jlm_tc_content_prefix(f, out, k, 0);
            cr_assert(s <= k);
            if (s > sent) sent = s;
        }
        jlm_tc_result r;
        uint64_t ids = i;
        cr_assert_eq(jlm_tc_parse(f, out + sent, n - sent, &ids, &r, NULL), 0);
        const json_t *want = json_object_get(c, "content");
        char joined[4096];
        snprintf(joined, sizeof joined, "%.*s%s", (int)sent, out, r.content);
        size_t b = 0, e = strlen(joined);   /* the whole reply's content is trimmed when it has calls */
        if (json_array_size(json_object_get(c, "tool_calls"))) {
            while (b < e && isspace((unsigned char)joined[b])) b++;
            while (e > b && isspace((unsigned char)joined[e - 1])) e--;
        }
        joined[e] = 0;
        cr_assert_str_eq(joined + b, json_is_string(want) ? json_string_value(want) : "", "case %zu", i);
        cr_assert_eq(json_array_size(r.calls), json_array_size(json_object_get(c, "tool_calls")), "case %zu", i);
        jlm_tc_result_free(&r);
    }
    json_decref(cs);
}

Test(toolcall, deltas_carry_each_call_whole_in_order, .timeout = 10)
{
    const char *out = "<tool_call>{\"name\": \"a\", \"arguments\": {\"t\": \"h\\u00e9llo w\\u00f6rld, a long argument\"}}</tool_call>"
                      "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
    jlm_tc_result r;
    uint64_t ids = 7;
    cr_assert_eq(jlm_tc_parse(JLM_TC_HERMES, out, strlen(out), &ids, &r, NULL), 0);
    cr_assert_eq(json_array_size(r.calls), 2);
    json_t *ds = jlm_tc_deltas(r.calls, 5), *d;
    cr_assert(ds);
    char args[2][256] = {"", ""};
    size_t i;
    json_array_foreach(ds, i, d) {
        json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0);
        json_int_t k = json_integer_value(json_object_get(tc, "index"));
        cr_assert(k == 0 || k == 1);
        const char *a = json_string_value(json_object_get(json_object_get(tc, "function"), "arguments"));
        cr_assert(a && strlen(a) <= 6, "pieces of at most 5 bytes plus a character's tail");
        strcat(args[k], a);
        if (json_object_get(tc, "id"))
            cr_assert_str_eq(json_string_value(json_object_get(tc, "id")),
                             json_string_value(json_object_get(json_array_get(r.calls, (size_t)k), "id")));
    }
    for (int k = 0; k < 2; k++)
        cr_assert_str_eq(args[k], json_string_value(json_object_get(json_object_get(json_array_get(r.calls, (size_t)k),
                                                                                    "function"), "arguments")));
    json_decref(ds);
    jlm_tc_result_free(&r);
}

static char *read_template(const char *name)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/tests/reference/chat-templates/%s", tu_root(), name);
    size_t n;
    char *t = (char *)tu_read_file(p, &n);
    cr_assert(t, "%s", p);
    return t;
}

Test(toolcall, the_real_templates_name_their_family, .timeout = 10)
{
    json_t *cs = cases(), *c;
    size_t i;
    json_array_foreach(cs, i, c) {
        const json_t *tn = json_object_get(c, "template");
        if (!json_is_string(tn))
            continue;
        char *t = read_template(json_string_value(tn));
        cr_assert_str_eq(jlm_tc_family_name(jlm_tc_family_of(t, strlen(t))),
                         json_string_value(json_object_get(c, "family")), "%s", json_string_value(tn));
        free(t);
    }
    json_decref(cs);
    char *t = read_template("bofenghuang-vigogne-2-70b-chat.jinja");
    cr_assert_eq(jlm_tc_family_of(t, strlen(t)), JLM_TC_NONE, "a template without tools");
    free(t);
    cr_assert_eq(jlm_tc_family_of(jlm_tc_chatml_tools, strlen(jlm_tc_chatml_tools)), JLM_TC_HERMES);
}

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"tz\": {\"enum\": [\"UTC\", \"CET\"]}}, \"required\": [\"tz\"]}}}]";

static int req_of(const char *extra, jlm_tc_req *r, jlm_err *err)
{
    char body[4096];
    snprintf(body, sizeof body, "{\"tools\": %s%s}", TOOLS, extra);
    json_t *o = json_loads(body, 0, NULL);
    cr_assert(o, "%s", body);
    int rc = jlm_tc_req_parse(o, r, err);
    json_decref(o);
    return rc;
}

/* The grammar of each family accepts a call of the chosen tool in that
 * family's syntax, which parses back into the call, and refuses the other
 * tool when a name is chosen. */
Test(toolcall, the_grammar_forces_a_call_the_parser_reads_back, .timeout = 30)
{
    static const struct { jlm_tc_family f; const char *time_call, *weather_call; } fam[] = {
        {JLM_TC_HERMES, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"},
        {JLM_TC_LLAMA3, "{\"name\": \"get_time\", \"parameters\": {\"tz\": \"CET\"}}",
         "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"},
        {JLM_TC_MISTRAL, "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]",
         "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"},
        {JLM_TC_MISTRAL_V11, "[TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}"},
        {JLM_TC_GPTOSS, "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": \"CET\"}",
         "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}"},
        {JLM_TC_GRANITE, "<|tool_call|>[{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]",
         "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"},
        {JLM_TC_GEMMA, "<|tool_call>call:get_time{\"tz\": \"CET\"}<tool_call|>",
         "<|tool_call>call:get_weather{\"city\": \"Oslo\"}<tool_call|>"},
    };
    jlm_tc_req named, any;
    jlm_err err = {0};
    cr_assert_eq(req_of(", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}", &named, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(named.choice, JLM_TC_NAMED);
    cr_assert_eq(req_of(", \"tool_choice\": \"required\"", &any, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < sizeof fam / sizeof *fam; i++) {
        for (int which = 0; which < 2; which++) {
            char *g = NULL;
            jlm_gram *gr;
            cr_assert_eq(jlm_tc_grammar(fam[i].f, which ? &any : &named, &g, &err), 0, "%s", err.msg);
            cr_assert_eq(jlm_gram_parse(g, strlen(g), &gr, &err), 0, "%s: %s\n%s", jlm_tc_family_name(fam[i].f), err.msg, g);
            for (int call = 0; call < 2; call++) {
                const char *text = call ? fam[i].weather_call : fam[i].time_call;
                jlm_gram_match *m;
                cr_assert_eq(jlm_gram_match_new(gr, &m, &err), 0);
                int ok = jlm_gram_accept_bytes(m, text, strlen(text), NULL) == 0 && jlm_gram_can_end(m);
                jlm_gram_match_free(m);
                cr_assert_eq(ok, which || !call, "%s %s: %s", jlm_tc_family_name(fam[i].f), which ? "required" : "named", text);
                jlm_tc_result r;
                uint64_t ids = 1;
                cr_assert_eq(jlm_tc_parse(fam[i].f, text, strlen(text), &ids, &r, NULL), 0);
                cr_assert_eq(json_array_size(r.calls), 1, "%s parses back", text);
                jlm_tc_result_free(&r);
            }
            jlm_gram_free(gr);
            free(g);
        }
    }
    char *g = NULL;
    cr_assert_eq(jlm_tc_grammar(JLM_TC_NONE, &any, &g, &err), JLM_EUNSUPPORTED);
    jlm_tc_req_free(&named);
    jlm_tc_req_free(&any);
}

Test(toolcall, malformed_tool_fields_are_refused_naming_them, .timeout = 10)
{
    static const struct { const char *body, *field; } bad[] = {
        {"{\"tools\": {}}", "'tools'"},
        {"{\"tools\": [{\"type\": \"retrieval\"}]}", "'tools[0]'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}", "'tools[0].function.name'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": \"x\"}}]}",
         "'tools[0].function.parameters'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"type\": 5}}}]}",
         "'tools[0].function.parameters'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"type\": \"object\", \"properties\": []}}}]}",
         "'tools[0].function.parameters'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": \"function\", \"function\": {\"name\": \"a\"}}]}",
         "'tools[1].function.name'"},
        {"{\"tool_choice\": \"required\"}", "'tool_choice'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}], \"tool_choice\": \"always\"}", "'tool_choice'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"b\"}}}",
         "'tool_choice.function.name'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"type\": \"string\", \"pattern\": \"x+\"}}}], \"tool_choice\": \"required\"}",
         "'tools[0].function.parameters'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}], \"parallel_tool_calls\": 1}", "'parallel_tool_calls'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *o = json_loads(bad[i].body, 0, NULL);
        cr_assert(o, "%s", bad[i].body);
        jlm_tc_req r = {0};
        jlm_err err = {0};
        cr_assert_neq(jlm_tc_req_parse(o, &r, &err), 0, "%s is refused", bad[i].body);
        cr_assert(strstr(err.msg, bad[i].field), "%s: '%s' names %s", bad[i].body, err.msg, bad[i].field);
        cr_assert_null(r.tools);
        json_decref(o);
    }
    /* a keyword the converter lacks is fine while no grammar is needed */
    json_t *o = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\":"
                           " {\"type\": \"string\", \"pattern\": \"x+\"}}}]}", 0, NULL);
    jlm_tc_req r;
    jlm_err err = {0};
    cr_assert_eq(jlm_tc_req_parse(o, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.choice, JLM_TC_AUTO);
    jlm_tc_req_free(&r);
    json_decref(o);
    o = json_loads("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"a\", \"arguments\": 3}}]}]", 0, NULL);
    cr_assert_eq(jlm_tc_check_messages(o, &err), JLM_EINVAL);
    cr_assert(strstr(err.msg, "'messages[0].tool_calls[0]'"), "%s", err.msg);
    json_decref(o);
}

/* The ChatML tools template is plain ChatML without tools, and renders the
 * tools, the calls (arguments as objects) and the results with them. */
Test(toolcall, the_chatml_tools_template, .timeout = 10)
{
    static const char chatml[] =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
                              " {\"role\": \"assistant\", \"content\": \"Hello\"}, {\"role\": \"user\", \"content\": \"Weather?\"}]",
                              0, NULL);
    jlm_chat_opts co = {.add_generation_prompt = 1, .now = 1};
    char *a = NULL, *b = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_chat_render_json(chatml, strlen(chatml), msgs, &co, 1, &a, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_chat_render_json(jlm_tc_chatml_tools, strlen(jlm_tc_chatml_tools), msgs, &co, 1, &b, NULL, &err), 0,
                 "%s", err.msg);
    cr_assert_str_eq(b, a);
    free(a); free(b);
    json_decref(msgs);
    msgs = json_loads("[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Weather?\"},"
                      " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abc\", \"type\": \"function\","
                      " \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},"
                      " {\"role\": \"tool\", \"tool_call_id\": \"abc\", \"content\": \"sunny\"}]", 0, NULL);
    json_t *tools = json_loads(TOOLS, 0, NULL), *tm = jlm_tc_messages_for_template(msgs);
    co.tools = tools;
    cr_assert_eq(jlm_chat_render_json(jlm_tc_chatml_tools, strlen(jlm_tc_chatml_tools), tm, &co, 1, &b, NULL, &err), 0,
                 "%s", err.msg);
    cr_assert(strstr(b, "<|im_start|>system\nBe brief.\n\n# Tools"), "%s", b);
    cr_assert(strstr(b, "\"name\": \"get_time\""), "the tools are listed: %s", b);
    cr_assert(strstr(b, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"), "%s", b);
    cr_assert(strstr(b, "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "%s", b);
    cr_assert_null(strstr(b, "Be brief.<|im_end|>"), "the system message is in the tools block only: %s", b);
    free(b);
    json_decref(tm);
    json_decref(tools);
    json_decref(msgs);
}
