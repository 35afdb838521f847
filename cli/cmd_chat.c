/* cmd_chat.c - `jlm chat MODEL`: an interactive conversation that renders the
 * container's chat template and keeps the conversation in the KV cache: each
 * turn evaluates only the text the new messages add to the rendered prompt
 * (llama.cpp's common_chat_format_single), then generates the reply. Reads
 * one user message per line from stdin; the reply goes to stdout. */
#include "cli/cli.h"
#include "cli/generate.h"
#include "cli/opts.h"
#include "cli/report.h"
#include "text/template/chat.h"
#include "prompt/chat_prompt.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/utf8_fix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct conv {
    jlm_chat_msg *msgs;
    char        **owned;
    size_t        n, cap;
} conv;

static int conv_add(conv *c, const char *role, const char *content)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        jlm_chat_msg *m = realloc(c->msgs, cap * sizeof *m);
        char **o = m ? realloc(c->owned, cap * sizeof *o) : NULL;
        if (!m || !o) { if (m) c->msgs = m; return -1; }
        c->msgs = m; c->owned = o; c->cap = cap;
    }
    c->owned[c->n] = strdup(content);
    if (!c->owned[c->n])
        return -1;
    c->msgs[c->n].role = role;
    c->msgs[c->n].content = c->owned[c->n];
    c->n++;
    return 0;
}

static void conv_free(conv *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->owned[i]);
    free(c->owned); free(c->msgs);
}

/* Generates a reply after the evaluated prompt into *out (malloc'd); ends
 * the line and flushes stdout: a reader waiting on a pipe sees the turn now. */
static int reply(jlm_engine *e, jlm_tok *tok, jlm_sampler *s, float *logits, int n_max, jlm_cli_report *rep,
                 char **out, jlm_err *err)
{
    jlm_tok_stream ts;
    jlm_tok_stream_init(&ts, tok, 0, 0);
    jlm_cli_gen g = {.e = e, .tok = tok, .s = s, .logits = logits, .rep = rep, .ts = &ts,
                     .n_max = n_max, .print = 1, .eval_eog = 1, .eval_last = 1, .fix_utf8 = 1};
    int rc = jlm_cli_generate(&g, NULL, NULL, out, err);
    fputc('\n', stdout);
    fflush(stdout);
    return rc;
}

int jlm_cmd_chat(int argc, char **argv)
{
    const char *model = NULL, *image = NULL;
    jlm_engine_opts eo = {.direct = 1, .budget = JLM_BUDGET_AUTO};
    jlm_samp_params sp;
    jlm_samp_params_default(&sp);
    int n_max = 256;
    const jlm_opt t[] = {
        {"-m", "--model", JLM_OPT_STR, &model, 0, 0, 0, "FILE", "the model (or give it first)"},
        {"-n", "--n-predict", JLM_OPT_INT, &n_max, -1, 1 << 30, 0, "N", "reply tokens at most, -1: until the context is full"},
        {"-c", "--ctx-size", JLM_OPT_U32, &eo.n_ctx, 0, 1 << 24, 0, "N", "context size, 0: the model's"},
        {"-t", "--threads", JLM_OPT_INT, &eo.n_threads, 1, 1024, 0, "N", "threads, unset: all cores"},
        {NULL, "--temp", JLM_OPT_F32, &sp.temp, 0, 1e6, 0, "T", "temperature, 0: greedy"},
        {NULL, "--top-k", JLM_OPT_INT, &sp.top_k, 0, 1 << 30, 0, "K", "top-k, 0: off"},
        {NULL, "--top-p", JLM_OPT_F32, &sp.top_p, 0, 1, 0, "P", "top-p, 1: off"},
        {NULL, "--min-p", JLM_OPT_F32, &sp.min_p, 0, 1, 0, "P", "min-p, 0: off"},
        {NULL, "--repeat-penalty", JLM_OPT_F32, &sp.repeat_penalty, 0, 1e6, JLM_OPT_LO_OPEN, "R", "repeat penalty, 1: off"},
        {"-s", "--seed", JLM_OPT_SEED, &sp.seed, 0, 0, 0, "S", "sampler seed (u32, -1: random)"},
        {NULL, "--budget", JLM_OPT_SIZE, &eo.budget, 0, 0, 0, "SIZE", "memory budget: frames + KV + scratch (K/M/G), 0: unlimited; default: the cgroup limit or MemAvailable less a headroom"},
        {NULL, "--kv", JLM_OPT_STR, &eo.kv, 0, 0, 0, "f32|f16", "KV cache type (f16: half the memory)"},
        {NULL, "--image", JLM_OPT_STR, &image, 0, 0, 0, "FILE", "an image for the first message"},
    };
    const char *pos[1] = {0};
    jlm_opts_spec os = {"jlm chat", "MODEL [options]   (one user message per line on stdin)", t,
                        (int)(sizeof t / sizeof t[0]), pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (os.n_pos && model)
        return jlm_cli_error("jlm chat", "give the model once: as MODEL or as -m"), 2;
    if (os.n_pos)
        model = pos[0];
    if (!model) {
        jlm_opts_help(stderr, &os);
        return 2;
    }
    if (!(model = jlm_cli_resolve_model("jlm chat", model)))
        return 1;
    jlm_err err = {0};
    jlm_engine *e = NULL;
    jlm_tok *tok = NULL;
    jlm_sampler *s = NULL;
    char *tmpl = NULL, *bos = NULL, *eos = NULL, *prev = NULL, *db = NULL, *key = NULL;
    float *logits = NULL;
    conv cv = {0};
    jlm_cli_report rep = {0};
    int status = 1;
    char *path = jlm_cli_container_path(model);
    int on_view = jlm_cli_view_discover(model, path, &db, &key);
    if (on_view)
        eo.direct = 0;   /* a view is read through the page cache the mount fills */
    if (!path) {
        fprintf(stderr, "jlm chat: out of memory\n");
        goto out;
    }
    if (jlm_engine_open(path, &eo, &e, &err) || jlm_tok_create(&jlm_engine_model(e)->vocab, &tok, &err) ||
        jlm_samp_create(&sp, jlm_engine_n_vocab(e), &s, &err)) {
        fprintf(stderr, "jlm chat: %s\n", err.msg);
        goto out;
    }
    if (on_view)
        jlm_cli_report_open(&rep, e, db, key, "jlm chat");
    int fallback = 0;
    if (jlm_chat_template_or_chatml(path, &jlm_engine_model(e)->vocab, &tmpl, &bos, &eos, &fallback, &err)) {
        fprintf(stderr, "jlm chat: %s\n", err.msg);
        goto out;
    }
    if (fallback)
        fprintf(stderr, "note: %s has no chat template: using chatml\n", model);
    logits = malloc(jlm_engine_n_vocab(e) * sizeof *logits);
    prev = strdup("");
    const jlm_vocab *voc = &jlm_engine_model(e)->vocab;
    char line[8192];
    int tty = isatty(0), rc_add;
    while (logits && prev) {
        if (tty) { fputs("> ", stderr); fflush(stderr); }
        if (!fgets(line, sizeof line, stdin))
            break;
        line[strcspn(line, "\n")] = 0;
        if (!*line)
            continue;
        /* --image: in the first message, at its <image> marker or first */
        char *msg = image && !cv.n && !strstr(line, "<image>") && !strstr(line, "<__media__>") ? NULL : strdup(line);
        if (!msg && asprintf(&msg, "<image>%s", line) < 0)
            break;
        int with_image = image && !cv.n;
        rc_add = conv_add(&cv, "user", msg);
        free(msg);
        if (rc_add) break;
        jlm_chat_opts co = {.add_generation_prompt = 1, .bos_token = bos, .eos_token = eos, .local_time = 1};
        char *full = NULL;
        size_t flen;
        if (jlm_chat_render(tmpl, strlen(tmpl), cv.msgs, cv.n, &co, &full, &flen, &err)) {
            fprintf(stderr, "jlm chat: template: %s\n", err.msg);
            goto out;
        }
        /* only what this turn adds: the suffix after the previous render */
        size_t plen = strlen(prev);
        const char *delta = (flen >= plen && !strncmp(full, prev, plen)) ? full + plen : full;
        int first = jlm_engine_n_past(e) == 0;
        /* a leading BOS text is dropped when the vocab adds BOS itself (llama.cpp) */
        if (first && voc->add_bos && bos && *bos && !strncmp(delta, bos, strlen(bos)))
            delta += strlen(bos);
        int32_t *ids = NULL;
        size_t n = 0;
        if (with_image ? jlm_cli_prefill_image(e, tok, image, delta, logits, &ids, &n, &err)
                       : jlm_tok_encode(tok, delta, strlen(delta), first, 1, &ids, &n, &err) ||
                             (n && jlm_engine_eval(e, ids, (uint32_t)n, logits, &err))) {
            fprintf(stderr, "jlm chat: %s\n", err.msg);
            free(ids); free(full);
            goto out;
        }
        for (size_t i = 0; i < n; i++) jlm_samp_accept(s, ids[i]);
        free(ids);
        jlm_cli_report_flush(&rep);
        char *text = NULL;
        int rc = reply(e, tok, s, logits, n_max < 0 ? (int)jlm_engine_n_ctx(e) : n_max, &rep, &text, &err);
        if (rc) {
            fprintf(stderr, "jlm chat: %s\n", err.msg);
            free(text); free(full);
            goto out;
        }
        /* a reply may end inside a UTF-8 sequence or hold stray bytes: the
         * conversation keeps valid text (U+FFFD), or the next render fails */
        char *fixed = text ? jlm_utf8_fix(text, strlen(text)) : NULL;
        free(text);
        if (!fixed || conv_add(&cv, "assistant", fixed)) {
            free(fixed); free(full);
            fprintf(stderr, "jlm chat: out of memory\n");
            goto out;
        }
        free(fixed);
        /* the prompt now holds the conversation without a generation prompt */
        jlm_chat_opts c2 = co;
        c2.add_generation_prompt = 0;
        free(full);
        free(prev);
        prev = NULL;
        if (jlm_chat_render(tmpl, strlen(tmpl), cv.msgs, cv.n, &c2, &prev, &flen, &err)) {
            fprintf(stderr, "jlm chat: template: %s\n", err.msg);
            goto out;
        }
    }
    status = 0;
out:
    jlm_cli_report_close(&rep, e);
    conv_free(&cv);
    free(tmpl); free(bos); free(eos); free(prev); free(logits); free(path); free(db); free(key);
    jlm_samp_destroy(s);
    jlm_tok_destroy(tok);
    jlm_engine_close(e);
    return status;
}
