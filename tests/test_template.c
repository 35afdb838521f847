/* test_template.c - suite `template`: the Jinja interpreter (text/template/jinja.h), the
 * llama.cpp-compatible chat rendering (text/template/chat.h) and `jlm template`.
 *
 * Reference renders: tests/reference/chat-templates/ (llama.cpp b10359 output for
 * 20 real templates, 3 conversations each, clock pinned to 2025-03-07T12:00:00Z).
 *
 * Unit cases (UNIT below): every expected string was produced by Python Jinja2
 * 3.1.6 in the transformers environment (ImmutableSandboxedEnvironment,
 * trim_blocks, lstrip_blocks, loopcontrols, json.dumps tojson, same pinned
 * clock); a NULL expectation means Jinja2 raised. The generator script is in
 * docs/templates.md.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/template/chat.h"
#include "text/template/jinja.h"
#include "tests/testutil.h"

#define PINNED_NOW ((time_t)1741348800)   /* 2025-03-07T12:00:00Z */

/* ================================================================ helpers */
static char *ref_path(const char *name, const char *ext)
{
    static char buf[4][1024];
    static int i;
    char *b = buf[i++ & 3];
    snprintf(b, 1024, "%s/tests/reference/chat-templates/%s%s", tu_root(), name, ext);
    return b;
}

/* Asserts got == want, reporting the first differing byte with context. */
static void assert_same(const char *what, const char *want, size_t want_len, const char *got, size_t got_len)
{
    size_t k = 0;
    while (k < want_len && k < got_len && want[k] == got[k]) k++;
    if (k == want_len && k == got_len) return;
    size_t from = k > 40 ? k - 40 : 0;
    int wl = (int)((want_len - from) < 80 ? want_len - from : 80), gl = (int)((got_len - from) < 80 ? got_len - from : 80);
    cr_assert(0, "%s: differs at byte %zu (expected %zu bytes, got %zu)\n  expected ...%.*s...\n  got      ...%.*s...",
              what, k, want_len, got_len, wl, want + from, gl, got + from);
}

static void check_reference(const char *name)
{
    size_t tlen;
    char *tmpl = (char *)tu_read_file(ref_path(name, ".jinja"), &tlen);
    cr_assert(tmpl, "cannot read %s", ref_path(name, ".jinja"));
    json_error_t je;
    json_t *cases = json_load_file(ref_path(name, ".cases.json"), 0, &je);
    cr_assert(json_is_array(cases) && json_array_size(cases) > 0, "%s: %s", ref_path(name, ".cases.json"), je.text);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        jlm_chat_opts o = {.add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
                           .bos_token = json_string_value(json_object_get(c, "bos_token")),
                           .eos_token = json_string_value(json_object_get(c, "eos_token")),
                           .now = PINNED_NOW};
        json_t *msgs = json_object_get(c, "messages"), *exp = json_object_get(c, "expected");
        char what[256], *out = NULL;
        size_t n;
        jlm_err err = {0};
        snprintf(what, sizeof what, "%s case %zu", name, i);
        int rc = jlm_chat_render_json(tmpl, tlen, msgs, &o, 1, &out, &n, &err);
        cr_assert(rc == 0, "%s: render failed: %s", what, err.msg);
        assert_same(what, json_string_value(exp), json_string_length(exp), out, n);
        free(out);
        /* the bare engine run on the unmodified messages */
        json_t *eto = json_object_get(c, "expected_template_only");
        if (!eto) eto = exp;
        snprintf(what, sizeof what, "%s case %zu (template only)", name, i);
        out = NULL;
        rc = jlm_chat_render_json(tmpl, tlen, msgs, &o, 0, &out, &n, &err);
        if (json_is_null(eto)) {
            cr_assert(rc != 0, "%s: expected the template to raise (%s), it rendered %zu bytes", what,
                      json_string_value(json_object_get(c, "template_only_error")), n);
        } else {
            cr_assert(rc == 0, "%s: render failed: %s", what, err.msg);
            assert_same(what, json_string_value(eto), json_string_length(eto), out, n);
        }
        free(out);
    }
    json_decref(cases);
    free(tmpl);
}

/* Renders src with vars (JSON text) and the pinned clock in UTC. */
static int render(const char *src, const char *vars, char **out, size_t *n, jlm_err *err)
{
    json_error_t je;
    json_t *v = json_loads(vars, 0, &je);
    cr_assert(v, "bad test vars %s: %s", vars, je.text);
    jlm_jinja_opts o = {.now = PINNED_NOW, .local_time = 0};
    int rc = jlm_jinja_render_src(src, strlen(src), v, &o, out, n, err);
    json_decref(v);
    return rc;
}

/* ================================================================ the 20 reference templates */
Test(template, renders_cohereforai_c4ai_command_r7b_12_2024_tool_use_as_llama_cpp, .timeout = 30) { check_reference("CohereForAI-c4ai-command-r7b-12-2024-tool_use"); }
Test(template, renders_huggingfacetb_smollm3_3b_as_llama_cpp, .timeout = 30) { check_reference("HuggingFaceTB-SmolLM3-3B"); }
Test(template, renders_lfm2_5_instruct_as_llama_cpp, .timeout = 30) { check_reference("LFM2.5-Instruct"); }
Test(template, renders_mistral_small_3_2_24b_instruct_2506_as_llama_cpp, .timeout = 30) { check_reference("Mistral-Small-3.2-24B-Instruct-2506"); }
Test(template, renders_qwen_qwen2_5_7b_instruct_as_llama_cpp, .timeout = 30) { check_reference("Qwen-Qwen2.5-7B-Instruct"); }
Test(template, renders_qwen_qwen3_0_6b_as_llama_cpp, .timeout = 30) { check_reference("Qwen-Qwen3-0.6B"); }
Test(template, renders_bofenghuang_vigogne_2_70b_chat_as_llama_cpp, .timeout = 30) { check_reference("bofenghuang-vigogne-2-70b-chat"); }
Test(template, renders_deepseek_ai_deepseek_r1_distill_qwen_32b_as_llama_cpp, .timeout = 30) { check_reference("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"); }
Test(template, renders_ggml_vocab_phi_3_as_llama_cpp, .timeout = 30) { check_reference("ggml-vocab-phi-3"); }
Test(template, renders_google_gemma_2_2b_it_as_llama_cpp, .timeout = 30) { check_reference("google-gemma-2-2b-it"); }
Test(template, renders_google_gemma_4_31b_it_as_llama_cpp, .timeout = 30) { check_reference("google-gemma-4-31B-it"); }
Test(template, renders_ibm_granite_granite_3_3_2b_instruct_as_llama_cpp, .timeout = 30) { check_reference("ibm-granite-granite-3.3-2B-Instruct"); }
Test(template, renders_meta_llama_llama_3_1_8b_instruct_as_llama_cpp, .timeout = 30) { check_reference("meta-llama-Llama-3.1-8B-Instruct"); }
Test(template, renders_meta_llama_llama_3_2_3b_instruct_as_llama_cpp, .timeout = 30) { check_reference("meta-llama-Llama-3.2-3B-Instruct"); }
Test(template, renders_microsoft_phi_3_5_mini_instruct_as_llama_cpp, .timeout = 30) { check_reference("microsoft-Phi-3.5-mini-instruct"); }
Test(template, renders_microsoft_phi_4_as_llama_cpp, .timeout = 30) { check_reference("microsoft-phi-4"); }
Test(template, renders_mistralai_mistral_7b_instruct_v0_2_as_llama_cpp, .timeout = 30) { check_reference("mistralai-Mistral-7B-Instruct-v0.2"); }
Test(template, renders_mistralai_mistral_nemo_instruct_2407_as_llama_cpp, .timeout = 30) { check_reference("mistralai-Mistral-Nemo-Instruct-2407"); }
Test(template, renders_openai_gpt_oss_120b_as_llama_cpp, .timeout = 30) { check_reference("openai-gpt-oss-120b"); }
Test(template, renders_teknium_openhermes_2_5_mistral_7b_as_llama_cpp, .timeout = 30) { check_reference("teknium-OpenHermes-2.5-Mistral-7B"); }

/* ================================================================ differential unit cases */
static const struct unit_case {
    const char *group, *tmpl, *vars, *expected;   /* expected NULL: Jinja2 raised */
} UNIT[] = {
    {"loop",
     "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}",
     "1/0/3/2/True/False/3;2/1/2/1/False/False/3;3/2/1/0/False/True/3;"},
    {"loop",
     "{% for x in xs if x != 'b' %}{{ x }}{{ loop.index }}{{ loop.length }}{% if not loop.last %},{% endif %}{% endfor %}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}",
     "a12,c22"},
    {"loop",
     "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}",
     "{\"xs\": []}",
     "empty"},
    {"loop",
     "{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": 2}}",
     "b=1 a=2 "},
    {"loop",
     "{% for k in d %}{{ k }}{% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": 2}}",
     "ba"},
    {"loop",
     "{% for c in 'h\303\251llo' %}[{{ c }}]{% endfor %}",
     "{}",
     "[h][\303\251][l][l][o]"},
    {"loop",
     "{% for x in range(10) %}{% if x == 5 %}{% break %}{% endif %}{% if x is odd %}{% continue %}{% endif %}{{ x }}{% endfor %}",
     "{}",
     "024"},
    {"loop",
     "{% for x in xs %}{{ loop.previtem|default('-') }}{{ x }}{{ loop.nextitem|default('-') }} {% endfor %}",
     "{\"xs\": [1, 2, 3]}",
     "-12 123 23- "},
    {"loop",
     "{% for x in xs %}{{ loop.cycle('odd','even') }} {% endfor %}",
     "{\"xs\": [1, 2, 3]}",
     "odd even odd "},
    {"loop",
     "{% for a in [1,2] %}{% for b in [3,4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}",
     "{}",
     "113 214 1|123 224 2|"},
    {"loop",
     "{% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
     "{}",
     "231"},
    {"loop",
     "{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}{{ range(3)|list }}",
     "{}",
     "531[0, 1, 2]"},
    {"loop",
     "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
     "{}",
     "37"},
    {"loop",
     "{% for m in messages %}{{ m.role }}:{{ m['content'] }}{{ '\\n' if not loop.last }}{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "system:S\nuser:Hi\nassistant:Yo"},
    {"expr",
     "{% if a %}A{% elif b %}B{% else %}C{% endif %}|{{ 'y' if a else 'n' }}|{{ 'z' if a }}|",
     "{\"a\": false, \"b\": true}",
     "B|n||"},
    {"expr",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }}",
     "{}",
     "3 -4 1 2 3.5 1024 7 9 5"},
    {"expr",
     "{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0 }} {{ 3.14 }} {{ 1e-5 }} {{ 2.5e-3 }} {{ -0.0 }} {{ 123456789.125 }}",
     "{}",
     "2.5 0.30000000000000004 1e+20 1.0 3.14 1e-05 0.0025 -0.0 123456789.125"},
    {"expr",
     "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'x' + 'y' }}",
     "{}",
     "a1NoneTrue ababab [1, 2] xy"},
    {"expr",
     "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }}",
     "{}",
     "True False True True True True True True True"},
    {"expr",
     "{{ a and b }} {{ a or b }} {{ not a }} {{ none or 'x' }} {{ 0 and 1 }} {{ '' or [] }}",
     "{\"a\": 1, \"b\": \"B\"}",
     "B 1 False x 0 []"},
    {"expr",
     "{{ none }} {{ true }} {{ False }} {{ None }} {{ [1, 'a', none, true, 1.5] }} {{ {'a': 1, 'b': [2]} }} {{ (1, 2) }} {{ (1,) }} {{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}",
     "{}",
     "None True False None [1, 'a', None, True, 1.5] {'a': 1, 'b': [2]} (1, 2) (1,) it's [\"it's\", 'q\"']"},
    {"expr",
     "{{ x }}|{{ x.y is defined }}|{{ d.missing }}|{{ d['missing'] }}|{{ l[10] }}|{{ none.attr }}|",
     "{\"d\": {}, \"l\": [], \"x\": \"s\"}",
     "s|False|||||"},
    {"expr",
     "{{ -x }} {{ +x }} {{ not not x }} {{ x is number }} {{ -(-3) }}",
     "{\"x\": 3}",
     "-3 3 True True 3"},
    {"slice",
     "{{ l[1:3] }} {{ l[:2] }} {{ l[-2:] }} {{ l[::2] }} {{ l[::-1] }} {{ l[-1] }} {{ l[0] }} {{ l[5:] }} {{ l[3:1] }} {{ l[-10:2] }}",
     "{\"l\": [0, 1, 2, 3, 4]}",
     "[1, 2] [0, 1] [3, 4] [0, 2, 4] [4, 3, 2, 1, 0] 4 0 [] [] [0, 1]"},
    {"slice",
     "{{ s[1:3] }} {{ s[::-1] }} {{ s[-1] }} {{ s[0] }} {{ s[:3] }} {{ s|length }}",
     "{\"s\": \"h\303\251llo\342\234\223\"}",
     "\303\251l \342\234\223oll\303\251h \342\234\223 h h\303\251l 6"},
    {"slice",
     "{{ s[::2] }} {{ s[1::3] }} {{ s[::-2] }} {{ s[-2::-3] }} {{ s[5:1:-1] }} {{ s[1:100:4] }} {{ s[::-100] }} {{ s[10::-4] }}",
     "{\"s\": \"h\303\251llo\342\234\223ab\303\247\"}",
     "hloa\303\247 \303\251ob \303\247aolh bo\303\251 \342\234\223oll \303\251\342\234\223 \303\247 \303\247oh"},
    {"slice",
     "{% set m = messages[1:] %}{{ m|length }}{{ m[0].role }} {{ messages[-1]['content'] }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "2user Yo"},
    {"set",
     "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set ns = namespace(x=0, y='s') %}{% for i in [1,2,3] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}{{ ns.y }}",
     "{}",
     "126s"},
    {"set",
     "{% set t %}hello {{ name }}{% endset %}[{{ t }}]{% set u | upper %}up{% endset %}{{ u }}",
     "{\"name\": \"w\"}",
     "[hello w]UP"},
    {"set",
     "{% set ns = namespace(items=[]) %}{% for i in [1,2] %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.items }}",
     "{}",
     "[1, 2]"},
    {"set",
     "{% set d = {'a': 1, 'b': {'c': [1, 2]}} %}{{ d.b.c[1] }}{{ d['a'] }}{{ d.get('z', 'dflt') }}{{ d.get('a') }}{{ d.get('q') }}",
     "{}",
     "21dflt1None"},
    {"set",
     "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]",
     "{}",
     "3[]"},
    {"macro",
     "{% macro f(a, b='B', c=none) %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(1, c=3) }}{{ f(a='x', b='y') }}",
     "{}",
     "<1|B|None><1|2|None><1|B|3><x|y|None>"},
    {"macro",
     "{% macro outer(x) %}{{ inner(x) * 2 }}{% endmacro %}{% macro inner(y) %}({{ y }}){% endmacro %}{{ outer(5) }}",
     "{}",
     "(5)(5)"},
    {"macro",
     "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}",
     "{}",
     "<b>bold 2</b>"},
    {"macro",
     "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}",
     "{}",
     "4321"},
    {"macro",
     "{% macro v() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, k=3) }}",
     "{}",
     "(1, 2){'k': 3}"},
    {"macro",
     "{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{% set g = 'changed' %}{{ m() }}",
     "{}",
     "changed"},
    {"macro",
     "{% macro m(x) %}{% set x = x + 1 %}{{ x }}{% endmacro %}{% set x = 10 %}{{ m(1) }}{{ x }}",
     "{}",
     "210"},
    {"macro",
     "{% macro lst(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %}{% call(x, n) lst(['a', 'b']) %}[{{ n }}:{{ x }}]{% endcall %}",
     "{}",
     "[1:a][2:b]"},
    {"filters",
     "{% filter upper %}shout {{ 'this' }}{% endfilter %}|{% filter replace('a', 'o')|title %}banana split{% endfilter %}",
     "{}",
     "SHOUT THIS|Bonono Split"},
    {"filters",
     "{{ '  a b  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'Hello'|upper }}|{{ 'HeLLo'|lower }}|{{ 'hello wORLD-foo(bar'|title }}|{{ 'hELLO'|capitalize }}|{{ 'aaa'|replace('a','b',2) }}",
     "{}",
     "a b|a|HELLO|hello|Hello World-Foo(Bar|Hello|bba"},
    {"filters",
     "{{ [3,1,2]|sort }}|{{ ['b','A','c']|sort }}|{{ ['b','A','c']|sort(case_sensitive=true) }}|{{ [3,1,2]|sort(reverse=true) }}|{{ [1,2,2,3,1]|unique|list }}|{{ ['a','A']|unique|list }}",
     "{}",
     "[1, 2, 3]|['A', 'b', 'c']|['A', 'b', 'c']|[3, 2, 1]|[1, 2, 3]|['a']"},
    {"filters",
     "{{ [1,2,3]|join(', ') }}|{{ [1,2,3]|first }}|{{ [1,2,3]|last }}|{{ 'abc'|list }}|{{ 'abc'|first }}|{{ [1,2,3]|sum }}|{{ [1,2,3]|min }}|{{ [1,2,3]|max }}|{{ [1,2,3]|length }}|{{ {'a':1}|count }}|{{ [1,2,3]|reverse|list }}|{{ 'abc'|reverse }}",
     "{}",
     "1, 2, 3|1|3|['a', 'b', 'c']|a|6|1|3|3|1|[3, 2, 1]|cba"},
    {"filters",
     "{{ x|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|d('n') }}|{{ y|d }}",
     "{\"y\": 0}",
     "d||d|None|0"},
    {"filters",
     "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 3|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.1|round(0, 'ceil') }} {{ 42|string }}",
     "{}",
     "42 4 0 7 3 2.5 3.0 3 2.57 2.0 4.0 3.0 42"},
    {"filters",
     "{{ d|dictsort }}|{{ d|dictsort(reverse=true) }}|{{ d|dictsort(by='value') }}|{{ d|items|list }}",
     "{\"d\": {\"b\": 2, \"a\": 3, \"C\": 1}}",
     "[('a', 3), ('b', 2), ('C', 1)]|[('C', 1), ('b', 2), ('a', 3)]|[('C', 1), ('b', 2), ('a', 3)]|[('b', 2), ('a', 3), ('C', 1)]"},
    {"filters",
     "{{ users|selectattr('active')|map(attribute='name')|join(',') }}|{{ users|rejectattr('active')|map(attribute='name')|list }}|{{ users|selectattr('age', 'gt', 30)|map(attribute='name')|list }}|{{ users|map(attribute='missing', default='\?')|list }}|{{ users|selectattr('name', 'equalto', 'bo')|list|length }}",
     "{\"users\": [{\"name\": \"al\", \"active\": true, \"age\": 40}, {\"name\": \"bo\", \"active\": false, \"age\": 20}]}",
     "al|['bo']|['al']|['\?', '\?']|1"},
    {"filters",
     "{{ [1,2,3,4]|select('odd')|list }}|{{ [1,2,3,4]|reject('odd')|list }}|{{ [0,1,'',None,'a']|select|list }}|{{ ['a','b']|map('upper')|list }}|{{ [1,2,3,4,5]|batch(2)|list }}|{{ [1,2,3]|batch(2, 0)|list }}",
     "{}",
     "[1, 3]|[2, 4]|[1, 'a']|['A', 'B']|[[1, 2], [3, 4], [5]]|[[1, 2], [3, 0]]"},
    {"filters",
     "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('--', blank=true) }}|{{ '<a href=\"x\">&\\'</a>'|e }}|{{ 'x'|safe }}|{{ 'one two  three'|wordcount }}|{{ 'ab'|center(6) }}|",
     "{}",
     "a\n    b\n\n    c|  a\n  b|a\n--\n--b|&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;|x|3|  ab  |"},
    {"filters",
     "{{ '%s-%d'|format('a', 3) }}|{{ '%s and %s' % ('x', 'y') }}|{{ '%05.1f' % 3.14159 }}|{{ '{} is {}'.format('a', 1) }}|{{ '%(k)s' % {'k': 'v'} }}",
     "{}",
     "a-3|x and y|003.1|a is 1|v"},
    {"filters",
     "{{ [{'a': 2}, {'a': 1}]|sort(attribute='a') }}|{{ [{'a': 2}, {'a': 1}]|map(attribute='a')|sum }}|{{ [[1, 2], [3]]|map('length')|list }}|{{ x|attr('upper') is defined }}",
     "{\"x\": \"s\"}",
     "[{'a': 1}, {'a': 2}]|3|[2, 1]|True"},
    {"tojson",
     "{{ v|tojson }}",
     "{\"v\": {\"a\": [1, 2.5, null, true, \"\303\251\\\"\\\\\\n\\t\\u0001<>&'\"], \"b\": {}, \"c\": []}}",
     "{\"a\": [1, 2.5, null, true, \"\303\251\\\"\\\\\\n\\t\\u0001<>&'\"], \"b\": {}, \"c\": []}"},
    {"tojson",
     "{{ v|tojson(indent=2) }}",
     "{\"v\": {\"a\": [1, {\"x\": null}], \"b\": {}, \"c\": [], \"d\": \"s\"}}",
     "{\n  \"a\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"b\": {},\n  \"c\": [],\n  \"d\": \"s\"\n}"},
    {"tojson",
     "{{ v|tojson(indent=4) }}|{{ 1.0|tojson }}|{{ 'x'|tojson }}|{{ none|tojson }}|{{ [1e100, 1.5e-7, 100.0]|tojson }}|{{ {'z': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ v|tojson(separators=(',', ':')) }}",
     "{\"v\": [1, [2, []], {\"k\": \"v\"}]}",
     "[\n    1,\n    [\n        2,\n        []\n    ],\n    {\n        \"k\": \"v\"\n    }\n]|1.0|\"x\"|null|[1e+100, 1.5e-07, 100.0]|{\"a\": 2, \"z\": 1}|[1,[2,[]],{\"k\":\"v\"}]"},
    {"tojson",
     "{{ messages|tojson }}|{{ '\303\274\342\234\223\360\237\230\200'|tojson }}|{{ '\303\274\342\234\223'|tojson(ensure_ascii=true) }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]|\"\303\274\342\234\223\360\237\230\200\"|\"\\u00fc\\u2713\""},
    {"strmeth",
     "{{ s.startswith('he') }} {{ s.endswith('lo') }} {{ s.startswith(('x', 'h')) }} {{ s.split('l') }} {{ s.split('l', 1) }} {{ s.rsplit('l', 1) }} {{ '  a  b '.split() }} {{ ' a b '.split(none, 1) }} {{ 'a b c'.rsplit(none, 1) }}",
     "{\"s\": \"hello\"}",
     "True True True ['he', '', 'o'] ['he', 'lo'] ['hel', 'o'] ['a', 'b'] ['a', 'b '] ['a b', 'c']"},
    {"strmeth",
     "[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ 'xxhixx'.strip('x') }}][{{ s.upper() }}][{{ s.lower() }}][{{ s.replace('l', 'L') }}][{{ s.find('l') }}][{{ s.find('z') }}][{{ s.rfind('l') }}][{{ s.count('l') }}][{{ 'hello world'.title() }}][{{ 'hELLO'.capitalize() }}]",
     "{\"s\": \"hello\"}",
     "[x][x  ][  x][hi][HELLO][hello][heLLo][2][-1][3][2][Hello World][Hello]"},
    {"strmeth",
     "{{ '-'.join(['a','b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'AB'.isupper() }} {{ 'ab'.islower() }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}",
     "{\"d\": {\"x\": 1, \"y\": 2}}",
     "a-b ['a', 'b', 'c'] True True True True True ['x', 'y'] [1, 2] [('x', 1), ('y', 2)]"},
    {"strmeth",
     "{{ content.split('</think>')[-1].lstrip('\\n') }}|{{ content.split('<think>')[0] }}|",
     "{\"content\": \"<think>\\nreason\\n</think>\\n\\nanswer\"}",
     "answer||"},
    {"tests",
     "{{ x is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ d is mapping }} {{ l is sequence }} {{ l is iterable }} {{ s is iterable }} {{ d is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ true is true }} {{ 0 is false }} {{ 'a' is in 'abc' }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ n is not none }} {{ range is callable }} {{ 1 is sameas 1 }}",
     "{\"x\": 1, \"n\": null, \"s\": \"s\", \"d\": {}, \"l\": []}",
     "True True True True True True True True True True True True True True True True True True True False True True True False True True"},
    {"ws",
     "a\n  {% if true %}\n    b\n  {% endif %}\nc\n",
     "{}",
     "a\n    b\nc"},
    {"ws",
     "a  {%- if true -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\ne",
     "{}",
     "abc d e"},
    {"ws",
     "x\n    {#- comment -#}\n  y\n  {# c2 #}\nz {%+ if true %}k{% endif %}",
     "{}",
     "xy\nz k"},
    {"ws",
     "{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\nend\n\n",
     "{}",
     "  1\n  2\nend\n"},
    {"ws",
     "  {{ 'v' }}  \n  {% set x = 1 %}  \n{% raw %}{{ not evaluated }}{% endraw %}\nT",
     "{}",
     "  v  \n  \n{{ not evaluated }}T"},
    {"ws",
     "line1\015\nline2\015\n{% if true %}\015\nyes\015\n{% endif %}\015\n",
     "{}",
     "line1\nline2\nyes\n"},
    {"expr",
     "{{ strftime_now('%Y-%m-%d %H:%M %b %B %A %d') }}",
     "{}",
     "2025-03-07 12:00 Mar March Friday 07"},
    {"expr",
     "{{ x.a.b is defined }}|{{ messages[0]['role'] | upper }}|{{ (messages | selectattr('role', 'equalto', 'user') | list | length) }}|{{ messages | map(attribute='role') | join('/') }}",
     "{\"x\": {\"a\": {}}, \"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "False|SYSTEM|1|system/user/assistant"},
    {"strmeth",
     "{{ '\303\237'.upper() == 'SS' }}|{{ '\303\211COLE'.lower() }}|{{ '\303\251mile zola'.title() }}|{{ '\302\240x\342\200\203'.strip() }}|{{ 'a,b,,c'.split(',') }}",
     "{}",
     "True|\303\251cole|\303\211mile Zola|x|['a', 'b', '', 'c']"},
    {"errors",
     "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}",
     "{}",
     NULL},
    {"errors",
     "{{ raise_exception('bad role: ' + r) }}",
     "{\"r\": \"x\"}",
     NULL},
    {"errors",
     "{{ undefined_thing.attr }}",
     "{}",
     NULL},
    {"errors",
     "{{ 1 + 'a' }}",
     "{}",
     NULL},
    {"errors",
     "{{ x + 1 }}",
     "{}",
     NULL},
    {"errors",
     "{% for x in none %}{% endfor %}",
     "{}",
     NULL},
    {"errors",
     "{% if x %}unterminated",
     "{}",
     NULL},
    {"errors",
     "{{ 1 / 0 }}",
     "{}",
     NULL},
    {"errors",
     "{{ [1] < 'a' }}",
     "{}",
     NULL},
};

static void check_group(const char *group)
{
    int n_run = 0;
    for (size_t i = 0; i < sizeof UNIT / sizeof UNIT[0]; i++) {
        const struct unit_case *u = &UNIT[i];
        if (strcmp(u->group, group)) continue;
        n_run++;
        char *out = NULL, what[200];
        size_t n = 0;
        jlm_err err = {0};
        int rc = render(u->tmpl, u->vars, &out, &n, &err);
        snprintf(what, sizeof what, "%s case %zu: %.100s", group, i, u->tmpl);
        if (!u->expected) {
            cr_assert(rc != 0, "%s: Jinja2 raises, we rendered \"%s\"", what, out ? out : "");
            cr_assert(err.msg[0], "%s: failed without a message", what);
        } else {
            cr_assert(rc == 0, "%s: render failed: %s", what, err.msg);
            assert_same(what, u->expected, strlen(u->expected), out, n);
        }
        free(out);
    }
    cr_assert(n_run > 0, "no unit cases in group %s", group);
}

Test(template, matches_python_jinja2_on_for_loops_and_loop_variables, .timeout = 30) { check_group("loop"); }
Test(template, matches_python_jinja2_on_expressions_operators_and_literals, .timeout = 30) { check_group("expr"); }
Test(template, matches_python_jinja2_on_indexing_and_slicing, .timeout = 30) { check_group("slice"); }
Test(template, matches_python_jinja2_on_set_namespace_and_block_set, .timeout = 30) { check_group("set"); }
Test(template, matches_python_jinja2_on_macros_defaults_caller_and_closures, .timeout = 30) { check_group("macro"); }
Test(template, matches_python_jinja2_on_filters, .timeout = 30) { check_group("filters"); }
Test(template, matches_python_jinja2_on_tojson_formatting, .timeout = 30) { check_group("tojson"); }
Test(template, matches_python_jinja2_on_string_and_dict_methods, .timeout = 30) { check_group("strmeth"); }
Test(template, matches_python_jinja2_on_is_tests, .timeout = 30) { check_group("tests"); }
Test(template, matches_python_jinja2_on_whitespace_control_trim_and_lstrip, .timeout = 30) { check_group("ws"); }
Test(template, matches_python_jinja2_on_errors_where_jinja2_raises, .timeout = 30) { check_group("errors"); }

/* ================================================================ errors and refusals */
Test(template, raise_exception_fails_with_its_message)
{
    char *out = NULL;
    size_t n;
    jlm_err err = {0};
    int rc = render("line1\n{{ raise_exception('Conversation roles must alternate') }}", "{}", &out, &n, &err);
    cr_assert(rc == JLM_EINVAL, "rc %d, expected JLM_EINVAL (%d)", rc, JLM_EINVAL);
    cr_assert(strstr(err.msg, "Conversation roles must alternate"), "message lacks the text: %s", err.msg);
    cr_assert(strstr(err.msg, "line 2"), "message lacks the template line: %s", err.msg);
    cr_assert(out == NULL, "output written on error");
}

Test(template, refuses_unsupported_constructs_by_name)
{
    static const struct { const char *tmpl, *name; } cases[] = {
        {"{% include 'other.jinja' %}", "include"},
        {"{% extends 'base' %}", "extends"},
        {"{% import 'm' as m %}", "import"},
        {"{% for x in xs recursive %}{{ loop(x) }}{% endfor %}", "recursive"},
        {"{{ xs | groupby('a') }}", "groupby"},
        {"{{ 'x' | urlencode }}", "urlencode"},
        {"{{ 1 is prime }}", "prime"},
        {"{{ '{:>5}'.format(1) }}", "str.format"},
        {"{{ '%c' % 65 }}", "conversion"},
        {"{{ f(**kw) }}", "**kwargs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        size_t n;
        jlm_err err = {0};
        int rc = render(cases[i].tmpl, "{\"xs\": [], \"kw\": {}}", &out, &n, &err);
        cr_assert(rc == JLM_EUNSUPPORTED, "%s: rc %d (%s), expected JLM_EUNSUPPORTED", cases[i].tmpl, rc, err.msg);
        cr_assert(strstr(err.msg, cases[i].name), "%s: message does not name '%s': %s", cases[i].tmpl, cases[i].name, err.msg);
        cr_assert(strstr(err.msg, "line 1"), "%s: message lacks the line: %s", cases[i].tmpl, err.msg);
    }
}

Test(template, reports_syntax_errors_with_their_line)
{
    static const char *bad[] = {"a\nb\n{% if x %}never closed", "{{ 1 + }}", "{% for %}{% endfor %}",
                                "{{ 'unterminated }}", "{% endif %}", "{# open comment", "{{ (1, 2 }}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        jlm_jinja *t = NULL;
        jlm_err err = {0};
        int rc = jlm_jinja_parse(bad[i], strlen(bad[i]), &t, &err);
        cr_assert(rc == JLM_EFORMAT, "'%s': rc %d (%s), expected JLM_EFORMAT", bad[i], rc, err.msg);
        cr_assert(t == NULL, "'%s': out-param written on error", bad[i]);
        cr_assert(strstr(err.msg, "line "), "'%s': no line in message: %s", bad[i], err.msg);
    }
}

Test(template, bounds_runaway_recursion_and_output_with_an_error)
{
    char *out = NULL;
    size_t n;
    jlm_err err = {0};
    int rc = render("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "{}", &out, &n, &err);
    cr_assert(rc == JLM_ERANGE, "infinite recursion: rc %d (%s), expected JLM_ERANGE", rc, err.msg);
    rc = render("{{ 'x' * 1000000000000 }}", "{}", &out, &n, &err);
    cr_assert(rc == JLM_ERANGE, "huge repetition: rc %d (%s), expected JLM_ERANGE", rc, err.msg);
    rc = render("{% for i in range(100000000) %}{% endfor %}", "{}", &out, &n, &err);
    cr_assert(rc == JLM_ERANGE, "huge range: rc %d (%s), expected JLM_ERANGE", rc, err.msg);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A loop that prints nothing but never ends in time (10^10 steps), and a
 * string doubled 64 times: each refused within seconds, naming its limit;
 * straight and through the chat layer's probes. */
static const char *const RUNAWAY[][2] = {
    {"{% set r = range(100000) %}{% for i in r %}{% for j in r if j < 0 %}{% endfor %}{% endfor %}", "step limit of 10000000"},
    {"{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
     "limit is 67108864 bytes"},
    {"{% set ns = namespace(s='abcdefgh') %}{% for i in range(64) %}{{ ns.s }}{% set ns.s = ns.s ~ ns.s[:4096] %}{% endfor %}"
     "{% for i in range(100000) %}{{ ns.s }}{% endfor %}", "output larger than the limit of 67108864 bytes"},
};

Test(template, a_runaway_template_is_refused_within_seconds_naming_the_limit, .timeout = 60)
{
    for (size_t k = 0; k < sizeof RUNAWAY / sizeof RUNAWAY[0]; k++) {
        for (int chat = 0; chat < 2; chat++) {
            char *out = NULL;
            size_t n;
            jlm_err err = {0};
            double t0 = now_s();
            clock_t c0 = clock();   /* CPU time: what the template costs, whatever the machine's load */
            int rc;
            if (chat) {
                jlm_chat_msg m = {"user", "hi"};
                jlm_chat_opts co = {.add_generation_prompt = 1};
                rc = jlm_chat_render(RUNAWAY[k][0], strlen(RUNAWAY[k][0]), &m, 1, &co, &out, &n, &err);
            } else {
                rc = render(RUNAWAY[k][0], "{}", &out, &n, &err);
            }
            double dt = now_s() - t0, cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
            cr_assert_eq(rc, JLM_ERANGE, "template %zu (chat %d): rc %d (%s)", k, chat, rc, err.msg);
            cr_assert(strstr(err.msg, RUNAWAY[k][1]), "template %zu names the limit: %s", k, err.msg);
            cr_assert(cpu < 5 && dt < 30, "template %zu (chat %d) refused after %.1f s (%.1f s CPU)", k, chat, dt, cpu);
            cr_assert(out == NULL);
        }
    }
}

/* A value that holds itself (fuzz_jinja's finding: printing it recursed until
 * the stack overflowed): printed or ordered, an error naming the depth; the
 * same object still equals itself, as in Python. */
Test(template, a_value_holding_itself_is_an_error_not_a_stack_overflow)
{
    static const char *const BAD[] = {
        "{% set ns = namespace(s='a') %}{% set ns.s = ns %}{{ ns.s }}",
        "{% set l = [1] %}{% do l.append(l) %}{{ l }}",
        "{% set l = [1] %}{% do l.append(l) %}{% set m = [1] %}{% do m.append(m) %}{{ l < m }}",
    };
    for (size_t k = 0; k < sizeof BAD / sizeof BAD[0]; k++) {
        char *out = NULL;
        size_t n;
        jlm_err err = {0};
        int rc = render(BAD[k], "{}", &out, &n, &err);
        cr_assert(rc == JLM_ERANGE && strstr(err.msg, "nested deeper than 200"), "%s: %d %s", BAD[k], rc, err.msg);
    }
    char *out = NULL;
    size_t n;
    jlm_err err = {0};
    cr_assert_eq(render("{% set l = [1] %}{% do l.append(l) %}{{ l == l }} {{ [l] == [l] }} {{ l|length }}", "{}", &out,
                        &n, &err), 0, "%s", err.msg);
    cr_assert_str_eq(out, "True True 2");
    free(out);
}

static int cancel_after(void *arg)
{
    return ++*(int *)arg >= 3;
}

/* The caller's cancel (its request's client went away) stops a render. */
Test(template, a_render_stops_when_its_caller_cancels, .timeout = 30)
{
    int calls = 0;
    jlm_jinja_opts o = {.cancelled = cancel_after, .cancel_arg = &calls};
    char *out = NULL;
    size_t n;
    jlm_err err = {0};
    const char *src = RUNAWAY[0][0];
    int rc = jlm_jinja_render_src(src, strlen(src), NULL, &o, &out, &n, &err);
    cr_assert_eq(rc, JLM_EIO, "rc %d (%s)", rc, err.msg);
    cr_assert(strstr(err.msg, "rendering cancelled"), "%s", err.msg);
    cr_assert_eq(calls, 3, "asked every %d steps until it said stop", JLM_JINJA_CANCEL_EVERY);
    /* a smaller step budget of the caller's own */
    jlm_jinja_opts small = {.max_steps = 1000};
    rc = jlm_jinja_render_src(src, strlen(src), NULL, &small, &out, &n, &err);
    cr_assert(rc == JLM_ERANGE && strstr(err.msg, "step limit of 1000 "), "%d %s", rc, err.msg);
    /* a real template stays far inside the default budget */
    rc = jlm_jinja_render_src("{% for i in range(1000) %}{{ i }}{% endfor %}", 46, NULL, &small, &out, &n, &err);
    cr_assert_eq(rc, JLM_ERANGE, "1000 iterations pass 1000 steps");
    rc = jlm_jinja_render_src("{% for i in range(1000) %}{{ i }}{% endfor %}", 46, NULL, NULL, &out, &n, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    free(out);
}

Test(template, never_crashes_on_any_truncation_of_a_real_template, .timeout = 60)
{
    size_t tlen;
    char *tmpl = (char *)tu_read_file(ref_path("meta-llama-Llama-3.1-8B-Instruct", ".jinja"), &tlen);
    cr_assert(tmpl);
    json_t *v = json_pack("{s:[{s:s,s:s}], s:s}", "messages", "role", "user", "content", "hi", "bos_token", "<s>");
    int n_ok = 0;
    for (size_t cut = 0; cut <= tlen; cut += 7) {
        char *out = NULL;
        size_t n;
        jlm_err err = {0};
        jlm_jinja_opts o = {.now = PINNED_NOW};
        int rc = jlm_jinja_render_src(tmpl, cut, v, &o, &out, &n, &err);
        cr_assert(rc <= 0, "cut %zu: rc %d", cut, rc);
        if (rc) cr_assert(err.msg[0] && out == NULL, "cut %zu: error without message or with output", cut);
        n_ok += rc == 0;
        free(out);
    }
    cr_assert(n_ok > 0, "no prefix rendered at all");
    json_decref(v);
    free(tmpl);
}

/* ================================================================ chat API and CLI */
Test(template, chat_render_merges_the_system_message_when_the_template_has_no_system_role)
{
    size_t tlen;
    char *tmpl = (char *)tu_read_file(ref_path("google-gemma-2-2b-it", ".jinja"), &tlen);
    json_t *cases = json_load_file(ref_path("google-gemma-2-2b-it", ".cases.json"), 0, NULL);
    cr_assert(tmpl && cases);
    json_t *c = json_array_get(cases, 1), *msgs = json_object_get(c, "messages");
    jlm_chat_msg m[8];
    size_t nm = json_array_size(msgs);
    cr_assert(nm <= 8 && nm > 1);
    for (size_t i = 0; i < nm; i++) {
        m[i].role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        m[i].content = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
    }
    cr_assert(!strcmp(m[0].role, "system"), "fixture case 1 should open with a system message");
    jlm_chat_opts o = {.add_generation_prompt = 1, .bos_token = "<bos>", .eos_token = "<eos>", .now = PINNED_NOW};
    char *out = NULL;
    size_t n;
    jlm_err err = {0};
    cr_assert(jlm_chat_render(tmpl, tlen, m, nm, &o, &out, &n, &err) == 0, "render failed: %s", err.msg);
    json_t *exp = json_object_get(c, "expected");
    assert_same("gemma-2 via jlm_chat_render", json_string_value(exp), json_string_length(exp), out, n);
    free(out);
    json_decref(cases);
    free(tmpl);
}

Test(template, cli_prints_the_prompt_and_nothing_else, .timeout = 30)
{
    const char *name = "meta-llama-Llama-3.1-8B-Instruct";
    json_t *cases = json_load_file(ref_path(name, ".cases.json"), 0, NULL);
    cr_assert(cases);
    json_t *c = json_array_get(cases, 1);
    char *dir = tu_tmpdir(), mpath[600], cmd[3000];
    snprintf(mpath, sizeof mpath, "%s/messages.json", dir);
    cr_assert(json_dump_file(json_object_get(c, "messages"), mpath, 0) == 0);
    snprintf(cmd, sizeof cmd, "(%s template --template '%s' --messages '%s' --bos '%s' --eos '%s' --now 2025-03-07T12:00:00Z%s 2>/dev/null)",
             tu_jlm(), ref_path(name, ".jinja"), mpath, json_string_value(json_object_get(c, "bos_token")),
             json_string_value(json_object_get(c, "eos_token")),
             json_is_true(json_object_get(c, "add_generation_prompt")) ? " --add-generation-prompt" : "");
    char *out = NULL;
    int st = tu_run(cmd, &out);
    cr_assert(st == 0, "exit %d: %s", st, out);
    json_t *exp = json_object_get(c, "expected");
    assert_same("jlm template stdout", json_string_value(exp), json_string_length(exp), out, strlen(out));
    free(out);

    snprintf(cmd, sizeof cmd, "%s template --template /nonexistent/t.jinja --messages '%s'", tu_jlm(), mpath);
    st = tu_run(cmd, &out);
    cr_assert(st == 1, "missing template: exit %d, expected 1", st);
    cr_assert(strstr(out, "jlm template: --template /nonexistent/t.jinja: "), "missing template message: %s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s template --messages '%s'", tu_jlm(), mpath);
    st = tu_run(cmd, &out);
    cr_assert(st == 2, "no MODEL nor --template: exit %d, expected 2", st);
    free(out);
    snprintf(cmd, sizeof cmd, "%s template --template '%s' --messages '%s' --now yesterday", tu_jlm(), ref_path(name, ".jinja"), mpath);
    st = tu_run(cmd, &out);
    cr_assert(st == 2, "bad --now: exit %d, expected 2 (%s)", st, out);
    free(out);
    tu_rmrf(dir);
    free(dir);
    json_decref(cases);
}

/* ---------------------------------------------------------------- llama.cpp b10359's message workarounds */
static char *render_msgs(const char *tmpl, const jlm_chat_msg *m, size_t n)
{
    jlm_chat_opts o = {.now = 1741348800};
    char *out = NULL;
    size_t len;
    jlm_err err = {0};
    cr_assert_eq(jlm_chat_render(tmpl, strlen(tmpl), m, n, &o, &out, &len, &err), 0, "%s", err.msg);
    return out;
}

/* a template without a system role: it never reads a system message */
static const char NOSYS[] = "{% for m in messages %}{% if m['role'] == 'user' %}U:{{ m['content'] }}|"
                            "{% elif m['role'] == 'assistant' %}A:{{ m['content'] }}|{% endif %}{% endfor %}";

Test(template, a_first_system_message_is_merged_into_the_next_message_whatever_its_role)
{
    jlm_chat_msg a[] = {{"system", "S"}, {"user", "Q"}};
    char *o = render_msgs(NOSYS, a, 2);
    cr_assert_str_eq(o, "U:S\nQ|");
    free(o);
    jlm_chat_msg b[] = {{"system", "S"}, {"assistant", "X"}, {"user", "Q"}};
    o = render_msgs(NOSYS, b, 3);
    cr_assert_str_eq(o, "A:S\nX|U:Q|", "merged into the assistant message, as llama.cpp does");
    free(o);
}

Test(template, a_lone_system_message_is_dropped_and_a_later_one_left_alone)
{
    jlm_chat_msg a[] = {{"system", "S"}};
    char *o = render_msgs(NOSYS, a, 1);
    cr_assert_str_eq(o, "");
    free(o);
    jlm_chat_msg b[] = {{"user", "Q"}, {"system", "S2"}, {"user", "V"}};
    o = render_msgs(NOSYS, b, 3);
    cr_assert_str_eq(o, "U:Q|U:V|", "only a first system message is merged");
    free(o);
}

Test(template, the_developer_role_becomes_system_except_for_gpt_oss_templates)
{
    static const char ROLES[] = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}";
    static const char OSS[] = "{# <|channel|> #}{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}";
    jlm_chat_msg a[] = {{"developer", "D"}, {"user", "Q"}};
    char *o = render_msgs(ROLES, a, 2);
    cr_assert_str_eq(o, "system:D|user:Q|");
    free(o);
    o = render_msgs(OSS, a, 2);
    cr_assert_str_eq(o, "developer:D|user:Q|");
    free(o);
}

/* Each cases[i][0] renders without variables to exactly cases[i][1]. */
static void expect_renders(const char *const cases[][2], size_t n_cases)
{
    for (size_t i = 0; i < n_cases; i++) {
        char *out = NULL;
        size_t n = 0;
        jlm_err err = {0};
        cr_assert_eq(render(cases[i][0], "{}", &out, &n, &err), 0, "%s: %s", cases[i][0], err.msg);
        cr_assert_str_eq(out, cases[i][1], "%s", cases[i][0]);
        free(out);
    }
}

/* Each of templates[0..n) fails to render without variables, its message
 * holding needle. */
static void expect_refused(const char *const *templates, size_t n, const char *needle)
{
    for (size_t i = 0; i < n; i++) {
        char *out = NULL;
        size_t len = 0;
        jlm_err err = {0};
        cr_assert_neq(render(templates[i], "{}", &out, &len, &err), 0, "%s rendered", templates[i]);
        cr_assert(strstr(err.msg, needle), "%s: %s", templates[i], err.msg);
        free(out);
    }
}

/* Repeating an empty string or list ends at once whatever the count:
 * '' * 600000000 (fuzz_jinja's find; CI's fuzz-smoke timed out on it) ran
 * 600 million empty appends, which neither the output limit nor the step
 * budget saw. */
Test(template, repeating_an_empty_sequence_a_huge_number_of_times_ends_at_once, .timeout = 10)
{
    const char *const cases[][2] = {{"{{ 'x' * 0 * 600000000 }}", ""}, {"{{ '' * 900000000000000000 }}", ""},
                              {"{{ ([] * 900000000000000000) | length }}", "0"}, {"{{ 'ab' * 3 }}", "ababab"},
                              {"{{ ([1] * 3) | length }}", "3"}};
    expect_renders(cases, sizeof cases / sizeof cases[0]);
}

/* A stepped slice of a string walks its characters once: the step's
 * characters were each found by counting from the start, so
 * s[::-22] of a string of megabytes (fuzz_jinja's find, doubling a string
 * in a loop) ran for minutes inside one step of the budget. */
Test(template, a_stepped_slice_of_a_long_string_is_linear, .timeout = 20)
{
    const char *const cases[][2] = {
        {"{% set ns = namespace(s='ab\303\251d') %}{% for i in range(19) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
         "{{ ns.s|length }} {{ (ns.s[::-22])|length }} {{ (ns.s[1::7])|length }} {{ ns.s[::-1][:4] }}",
         "2097152 95326 299593 d\303\251ba"}};
    expect_renders(cases, sizeof cases / sizeof cases[0]);
}

/* A %-format field is written whole and its width is bounded by the output
 * limit first: a field wider than 511 bytes was cut there without a word, and
 * '%9032053o' % 0 in a loop (fuzz_jinja's find) spent 35 s padding fields
 * that were then cut. */
Test(template, a_wide_percent_format_field_is_whole_and_bounded, .timeout = 10)
{
    const char *const cases[][2] = {
        {"{{ ('%600d' % 7)|length }}|{{ ('%600d' % 7)|trim }}|{{ ('%-600o|' % 8)|length }}|{{ ('%.600f' % 1.5)|length }}", "600|7|601|602"},
        {"{{ '%5d|%-4d|%.2f' % (42, 7, 2.345) }}", "   42|7   |2.35"}};
    expect_renders(cases, sizeof cases / sizeof cases[0]);
    const char *const bad[] = {"{{ '%100000000d' % 0 }}", "{{ '%.100000000f' % 0.5 }}",
                               "{% for i in range(50000) %}{{ '%9032053o' % 0 }}{% endfor %}"};
    expect_refused(bad, sizeof bad / sizeof bad[0], "limit of");
}

/* Work inside a step is charged to the step budget (jinja.h invariant 4):
 * each item of a list walked, each 256 bytes of a string made, scanned or
 * compared. Before, a membership test in a loop over a growing list, an index
 * into a long UTF-8 string in a loop, or two lists of long strings compared
 * took minutes within the default budgets; rfind of a long needle was
 * quadratic. Now each ends at once: the step limit, or (rfind) the answer. */
Test(template, work_inside_a_step_is_charged_to_the_budget, .timeout = 30)
{
    const char *const over[] = {
        "{% set l = [] %}{% for i in range(100000) %}{% do l.append(i) %}{% if i in l %}{% endif %}{% endfor %}",
        "{% set s = '\303\251' * 500000 %}{% for i in range(100000) %}{{ s[-1] }}{% endfor %}",
        "{% set x = 'a' * 1000000 %}{% set y = 'a' * 999999 ~ 'a' %}{{ [x] * 100000 == [y] * 100000 }}",
        "{% set s = 'a' * 1000000 %}{% set t = 'a' * 999999 ~ 'a' %}{% for i in range(100000) %}{% if s == t %}{% endif %}{% endfor %}"};
    expect_refused(over, sizeof over / sizeof over[0], "step limit");
    const char *const cases[][2] = {
        {"{% set s = 'a' * 1000000 %}{% set t = 'a' * 500000 ~ 'b' %}{{ s.rfind(t) }}|{{ 'abcabc'.rfind('bc') }}|{{ 'abc'.rfind('') }}|{{ 'abc'.rfind('x') }}",
         "-1|4|3|-1"},
        {"{{ ('ab' * 3)|length }}|{{ ('xyz' * 1000)|length }}|{{ ('xyz' * 1000)[-3:] }}", "6|3000|xyz"}};
    expect_renders(cases, sizeof cases / sizeof cases[0]);
}

/* An integer power is computed by squaring: 0 ** 44073709551615 (fuzz_jinja's
 * find) ran a loop of that many multiplications, outside the step budget. */
Test(template, an_integer_power_with_a_huge_exponent_ends_at_once, .timeout = 10)
{
    const char *const cases[][2] = {{"{{ 0 ** 44073709551615 }}", "0"}, {"{{ 1 ** 44073709551615 }}", "1"},
                              {"{{ (-1) ** 44073709551615 }}", "-1"}, {"{{ 2 ** 62 }}", "4611686018427387904"},
                              {"{{ (-2) ** 63 }}", "-9223372036854775808"}, {"{{ 3 ** 0 }}", "1"},
                              {"{{ 7 ** 13 }}", "96889010407"}};
    expect_renders(cases, sizeof cases / sizeof cases[0]);
    char *out = NULL;
    size_t n = 0;
    jlm_err err = {0};
    cr_assert_neq(render("{{ 2 ** 64 }}", "{}", &out, &n, &err), 0);
    cr_assert(strstr(err.msg, "overflows 64 bits"), "%s", err.msg);
    free(out);
}
