/* test_session.c - the session layer (prompt/session.h) on its own: a
 * session opens a model with its tokenizer, sampler and template; greedy
 * generation through it streams the same ids and text `jlm run` prints;
 * a grammar masks each step and closes the text within n_max tokens;
 * a chat turn that extends the conversation evaluates only the new text;
 * the view seam is asked, and its reporter flushed after each evaluation. */
#include <criterion/criterion.h>

#include <jansson.h>

#include "prompt/session.h"
#include "tests/testutil.h"

static char *T, *M;   /* temp dir, the converted stories260K */

static void s_init(void)
{
    jlm_err err = {0};
    T = tu_tmpdir();
    cr_assert(T);
    M = tu_convert("stories260K.gguf", T, "s.jlm", &err);
    cr_assert(M, "%s", err.msg);
}

static void s_fini(void)
{
    tu_rmrf(T);
    free(T);
    free(M);
}

TestSuite(session, .init = s_init, .fini = s_fini, .timeout = 60);

typedef struct sink { char buf[4096]; size_t len; int calls; } sink;

static int to_sink(void *ctx, const char *p, size_t n, jlm_err *err)
{
    sink *k = ctx;
    if (k->len + n >= sizeof k->buf)
        return jlm_errf(err, JLM_ENOSPC, "sink full");
    memcpy(k->buf + k->len, p, n);
    k->len += n;
    k->calls++;
    return 0;
}

static jlm_sess_opts greedy_opts(jlm_samp_params *sp)
{
    jlm_samp_params_default(sp);
    sp->temp = 0;
    sp->seed = 1;
    jlm_sess_opts o = {.eng = {.n_threads = 1, .direct = 1, .budget = 64u << 20}, .samp = sp};
    return o;
}

Test(session, greedy_generation_streams_what_jlm_run_prints)
{
    jlm_samp_params sp;
    jlm_sess_opts o = greedy_opts(&sp);
    jlm_session *s = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_session_open(M, &o, &s, &err), 0, "%s", err.msg);
    cr_assert(s->tok && s->s && s->logits && !s->tmpl && !s->rep);
    int32_t *ids = NULL, gen[16];
    size_t n = 0, ng = 0;
    cr_assert_eq(jlm_session_encode(s, "Once upon a time", 0, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_session_eval(s, ids, n, &err), 0, "%s", err.msg);
    jlm_tok_stream ts;
    jlm_tok_stream_init(&ts, s->tok, 0, s->voc->add_space_prefix && ids[0] != s->voc->bos);
    ts.strip_space = 0;
    sink k = {0};
    jlm_sess_gen g = {.n_max = 12, .ts = &ts, .emit = to_sink, .ctx = &k};
    char *text = NULL;
    cr_assert_eq(jlm_session_generate(s, &g, gen, &ng, &text, &err), 0, "%s", err.msg);
    char tail[4];
    size_t nt = jlm_tok_stream_flush(&ts, tail);
    memcpy(k.buf + k.len, tail, nt);
    k.len += nt;
    cr_expect(ng == 12 && k.calls > 0 && text && !strncmp(text, k.buf, strlen(text)), "the text kept is the text emitted");
    /* jlm run --print-ids on the same prompt */
    char cmd[2000], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p 'Once upon a time' -n 12 --temp 0 -t 1 --budget 64M --print-ids 2>/dev/null",
             tu_jlm(), M);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    json_t *gj = json_object_get(j, "generated");
    cr_assert_eq(json_array_size(gj), ng, "%s", out);
    for (size_t i = 0; i < ng; i++)
        cr_expect_eq(json_integer_value(json_array_get(gj, i)), gen[i], "id %zu", i);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p 'Once upon a time' -n 12 --temp 0 -t 1 --budget 64M 2>/dev/null",
             tu_jlm(), M);
    free(out);
    cr_assert_eq(tu_run(cmd, &out), 0);
    cr_expect(k.len == strlen(out) && !memcmp(k.buf, out, k.len), "emitted '%.*s', jlm run printed '%s'", (int)k.len,
              k.buf, out);
    json_decref(j);
    free(out); free(text); free(ids);
    jlm_session_close(s);
}

Test(session, an_emit_failure_stops_generation_with_its_code)
{
    jlm_samp_params sp;
    jlm_sess_opts o = greedy_opts(&sp);
    jlm_session *s = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_session_open(M, &o, &s, &err), 0, "%s", err.msg);
    int32_t *ids = NULL, gen[64];
    size_t n = 0, ng = 0;
    cr_assert_eq(jlm_session_encode(s, "Once", 0, &ids, &n, &err), 0);
    cr_assert_eq(jlm_session_eval(s, ids, n, &err), 0);
    uint32_t past = jlm_engine_n_past(s->e);
    jlm_tok_stream ts;
    jlm_tok_stream_init(&ts, s->tok, 0, 0);
    sink k = {.len = sizeof k.buf - 2};   /* full: the first piece fails */
    jlm_sess_gen g = {.n_max = 64, .ts = &ts, .emit = to_sink, .ctx = &k};
    cr_expect_eq(jlm_session_generate(s, &g, gen, &ng, NULL, &err), JLM_ENOSPC);
    cr_expect(strstr(err.msg, "sink full"), "%s", err.msg);
    cr_expect(ng >= 1 && ng < 64 && jlm_engine_n_past(s->e) <= past + ng, "stopped at the failure: %zu ids", ng);
    free(ids);
    jlm_session_close(s);
}

/* jlm_sess_gen.gram: greedy decoding, which would go on with the story,
 * follows the grammar instead, and a budget too short for the story still
 * ends in a whole match (the max_tokens-aware mask), for several budgets. */
Test(session, a_grammar_masks_every_step_and_closes_within_n_max)
{
    jlm_samp_params sp;
    jlm_sess_opts o = greedy_opts(&sp);
    jlm_session *s = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_session_open(M, &o, &s, &err), 0, "%s", err.msg);
    const char *src = "root ::= \"The \" [a-z]+ (\" \" [a-z]+)* \".\"";
    jlm_gram *gr = NULL;
    jlm_gram_vocab *v = NULL;
    cr_assert_eq(jlm_gram_parse(src, strlen(src), &gr, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_gram_vocab_from_tok(s->tok, &v, &err), 0, "%s", err.msg);
    for (int n_max = 6; n_max <= 24; n_max += 6) {
        jlm_gram_match *m = NULL;
        cr_assert_eq(jlm_gram_match_new(gr, &m, &err), 0, "%s", err.msg);
        int32_t *ids = NULL, gen[32];
        size_t n = 0, ng = 0;
        jlm_engine_rewind(s->e, 0);
        cr_assert_eq(jlm_session_encode(s, "Once upon a time", 0, &ids, &n, &err), 0, "%s", err.msg);
        cr_assert_eq(jlm_session_eval(s, ids, n, &err), 0, "%s", err.msg);
        jlm_tok_stream ts;
        jlm_tok_stream_init(&ts, s->tok, 0, 0);
        ts.strip_space = 0;
        jlm_sess_gen g = {.n_max = n_max, .ts = &ts, .gram = m, .gram_vocab = v};
        char *text = NULL, tail[4];
        cr_assert_eq(jlm_session_generate(s, &g, gen, &ng, &text, &err), 0, "%s", err.msg);
        size_t nt = jlm_tok_stream_flush(&ts, tail), len = strlen(text);
        cr_expect(nt == 0 && ng <= (size_t)n_max, "n_max %d: %zu tokens", n_max, ng);
        cr_expect(jlm_gram_can_end(m), "n_max %d: a whole match: '%s'", n_max, text);
        int ok = len > 5 && !strncmp(text, "The ", 4) && text[len - 1] == '.';
        for (size_t i = 4; ok && i + 1 < len; i++)
            ok = (text[i] >= 'a' && text[i] <= 'z') || (text[i] == ' ' && text[i - 1] != ' ');
        cr_expect(ok, "n_max %d: '%s' does not follow the grammar", n_max, text);
        free(text); free(ids);
        jlm_gram_match_free(m);
    }
    jlm_gram_vocab_free(v);
    jlm_gram_free(gr);
    jlm_session_close(s);
}

Test(session, a_chat_turn_that_extends_the_conversation_evaluates_only_its_new_text)
{
    jlm_samp_params sp;
    jlm_sess_opts o = greedy_opts(&sp);
    o.flags = JLM_SESS_TEMPLATE;
    jlm_session *s = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_session_open(M, &o, &s, &err), 0, "%s", err.msg);
    cr_assert(s->tmpl && s->tmpl_fallback, "stories260K has no template: chatml");
    jlm_chat_msg m[3] = {{"user", "hi"}, {"assistant", "hello"}, {"user", "more"}};
    char *first = NULL, *second = NULL;
    int32_t *ids = NULL, *all = NULL;
    size_t n = 0, n_all = 0;
    cr_assert_eq(jlm_session_render(s, m, 2, 0, &first, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_session_extend(s, "", first, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_session_eval(s, ids, n, &err), 0, "%s", err.msg);
    free(ids);
    cr_assert_eq(jlm_session_render(s, m, 3, 1, &second, &err), 0, "%s", err.msg);
    cr_assert(!strncmp(second, first, strlen(first)));
    cr_assert_eq(jlm_session_extend(s, first, second, &ids, &n, &err), 0, "%s", err.msg);
    uint32_t past = jlm_engine_n_past(s->e);
    cr_expect(past > 0, "the cache still holds the first render");
    cr_assert_eq(jlm_session_encode(s, second + strlen(first), 1, &all, &n_all, &err), 0);
    cr_expect_eq(n, n_all, "only the new text's tokens");
    /* a render that does not extend prev starts over from 0 */
    free(ids);
    cr_assert_eq(jlm_session_extend(s, "something else", second, &ids, &n, &err), 0, "%s", err.msg);
    cr_expect_eq(jlm_engine_n_past(s->e), 0, "rewound");
    cr_expect(n > n_all && ids[0] == s->voc->bos, "the whole render, BOS first");
    free(ids); free(all); free(first); free(second);
    jlm_session_close(s);
}

/* The view seam: find is asked with the model and its container; when it
 * says "a view", open gets the database and key, flush runs after each
 * evaluation, close at the end. */
static int g_find, g_open, g_flush, g_close;
static char g_model[1100], g_container[1100];

static int fake_find(const char *model, const char *container, char **db, char **key)
{
    g_find++;
    snprintf(g_model, sizeof g_model, "%s", model);
    snprintf(g_container, sizeof g_container, "%s", container);
    *db = strdup("/nonexistent/db");
    *key = strdup("s.jlm");
    return 1;
}

static void *fake_open(jlm_engine *e, const char *db, const char *key)
{
    g_open++;
    cr_expect_str_eq(db, "/nonexistent/db");
    cr_expect_str_eq(key, "s.jlm");
    return &g_open;
}

static void fake_flush(void *r) { g_flush++; }
static void fake_close(void *r, jlm_engine *e) { g_close++; }

Test(session, the_view_seam_is_asked_and_its_reporter_flushed_per_evaluation)
{
    static const jlm_sess_view V = {fake_find, fake_open, fake_flush, fake_close};
    jlm_samp_params sp;
    jlm_sess_opts o = greedy_opts(&sp);
    o.view = &V;
    char dir[1100], inner[1200];
    snprintf(dir, sizeof dir, "%s/v.jlm", T);   /* a folder shaped like a view */
    snprintf(inner, sizeof inner, "%s/model.jlm", dir);
    cr_assert(mkdir(dir, 0755) == 0 && link(M, inner) == 0);
    jlm_session *s = NULL;
    jlm_err err = {0};
    char given[1200];
    snprintf(given, sizeof given, "%s/", dir);
    cr_assert_eq(jlm_session_open(given, &o, &s, &err), 0, "%s", err.msg);
    cr_expect(g_find == 1 && g_open == 1 && s->rep == &g_open);
    cr_expect_str_eq(g_container, inner, "a view folder's container, the trailing '/' dropped");
    cr_expect_str_eq(s->container, inner);
    int32_t *ids = NULL, gen[4];
    size_t n = 0, ng = 0;
    cr_assert_eq(jlm_session_encode(s, "Once", 0, &ids, &n, &err), 0);
    cr_assert_eq(jlm_session_eval(s, ids, n, &err), 0);
    int after_prefill = g_flush;
    jlm_tok_stream ts;
    jlm_tok_stream_init(&ts, s->tok, 0, 0);
    jlm_sess_gen g = {.n_max = 4, .ts = &ts};
    cr_assert_eq(jlm_session_generate(s, &g, gen, &ng, NULL, &err), 0);
    cr_expect(after_prefill == 1 && g_flush == 1 + 3, "one flush per evaluation: %d, %d", after_prefill, g_flush);
    jlm_session_close(s);
    cr_expect_eq(g_close, 1);
    free(ids);
}
