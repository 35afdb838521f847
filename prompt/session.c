/* session.c - a model opened for generation (session.h): open and close,
 * encode, evaluate (text or an image prompt), render a chat. The decode
 * loop is session_gen.c. */
#include "prompt/session.h"
#include "prompt/chat_prompt.h"
#include "prompt/image_prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

char *jlm_session_container(const char *model)
{
    struct stat st;
    char *c = NULL;
    if (stat(model, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t n = strlen(model);
        while (n > 1 && model[n - 1] == '/')
            n--;
        if (asprintf(&c, "%.*s/model.jlm", (int)n, model) < 0)
            c = NULL;
        return c;
    }
    return strdup(model);
}

static int open_text(jlm_session *s, const jlm_sess_opts *o, jlm_err *err)
{
    if (!(s->voc->kind == JLM_VOCAB_NONE && (o->flags & JLM_SESS_NO_VOCAB)) && jlm_tok_create(s->voc, &s->tok, err))
        return jlm_err_prefix(err, err->code ? err->code : JLM_EFORMAT, "%s: tokenizer", s->container);
    if (o->samp) {
        jlm_samp_params sp = *o->samp;
        if (sp.repeat_last_n < 0)
            sp.repeat_last_n = (int32_t)jlm_engine_n_ctx(s->e);   /* -1: the whole context */
        int rc = jlm_samp_create(&sp, jlm_engine_n_vocab(s->e), &s->s, err);
        if (rc)
            return rc;
    }
    if ((o->flags & JLM_SESS_TEMPLATE) && s->tok) {
        int rc = jlm_chat_template_or_chatml(s->container, s->voc, &s->tmpl, &s->bos, &s->eos, &s->tmpl_fallback, err);
        if (rc)
            return rc;
    }
    if (!(s->logits = malloc(jlm_engine_n_vocab(s->e) * sizeof *s->logits)))
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", s->container);
    return 0;
}

int jlm_session_open(const char *model, const jlm_sess_opts *o, jlm_session **out, jlm_err *err)
{
    jlm_session *s = calloc(1, sizeof *s);
    if (!s || !(s->container = jlm_session_container(model))) {
        free(s);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    jlm_engine_opts eo = o->eng;
    s->view = o->view;
    if (s->view && s->view->find(model, s->container, &s->db_path, &s->key))
        eo.direct = 0;   /* a view is read through the page cache the mount fills */
    int rc = jlm_engine_open(s->container, &eo, &s->e, err);
    if (!rc && s->db_path && s->view->open)
        s->rep = s->view->open(s->e, s->db_path, s->key);
    if (!rc) {
        s->voc = &jlm_engine_model(s->e)->vocab;
        rc = open_text(s, o, err);
    }
    if (rc) {
        jlm_session_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void jlm_session_close(jlm_session *s)
{
    if (!s)
        return;
    if (s->rep)
        s->view->close(s->rep, s->e);
    jlm_samp_destroy(s->s);
    jlm_tok_destroy(s->tok);
    jlm_engine_close(s->e);
    free(s->tmpl); free(s->bos); free(s->eos); free(s->logits);
    free(s->container); free(s->db_path); free(s->key);
    free(s);
}

void jlm_session_flush(jlm_session *s)
{
    if (s->rep)
        s->view->flush(s->rep);
}

int jlm_session_encode(jlm_session *s, const char *text, int special, int32_t **ids, size_t *n, jlm_err *err)
{
    return jlm_tok_encode(s->tok, text, strlen(text), jlm_engine_n_past(s->e) == 0, special, ids, n, err);
}

static void accept_all(jlm_session *s, const int32_t *ids, size_t n)
{
    for (size_t i = 0; s->s && i < n; i++)
        jlm_samp_accept(s->s, ids[i]);
    jlm_session_flush(s);
}

int jlm_session_eval(jlm_session *s, const int32_t *ids, size_t n, jlm_err *err)
{
    int rc = n ? jlm_engine_eval(s->e, ids, (uint32_t)n, s->logits, err) : 0;
    if (!rc)
        accept_all(s, ids, n);
    return rc;
}

int jlm_session_eval_image(jlm_session *s, const char *image, const char *prompt, int32_t **ids, size_t *n,
                           jlm_err *err)
{
    jlm_image img = {0};
    jlm_vtower *vt = NULL;
    int rc = jlm_image_load(image, &img, err);
    if (!rc)
        rc = jlm_vtower_open(s->e, &vt, err);
    if (!rc)
        rc = jlm_image_prompt_eval(s->e, vt, s->tok, prompt ? prompt : "", &img, s->logits, ids, n, err);
    jlm_vtower_close(vt);
    jlm_image_free(&img);
    if (!rc)
        accept_all(s, *ids, *n);
    return rc;
}

int jlm_session_render(jlm_session *s, const jlm_chat_msg *msgs, size_t n, int gen, char **out, jlm_err *err)
{
    jlm_chat_opts co = {.add_generation_prompt = gen, .bos_token = s->bos, .eos_token = s->eos, .local_time = 1};
    size_t len;
    return jlm_chat_render(s->tmpl, strlen(s->tmpl), msgs, n, &co, out, &len, err);
}

const char *jlm_session_at_start(const jlm_session *s, const char *text)
{
    if (jlm_engine_n_past(s->e) == 0 && s->voc->add_bos && s->bos && *s->bos && !strncmp(text, s->bos, strlen(s->bos)))
        return text + strlen(s->bos);
    return text;
}

int jlm_session_extend(jlm_session *s, const char *prev, const char *full, int32_t **ids, size_t *n, jlm_err *err)
{
    size_t plen = strlen(prev);
    if (!(jlm_engine_n_past(s->e) > 0 && !strncmp(full, prev, plen))) {
        jlm_engine_rewind(s->e, 0);   /* the cache no longer matches the conversation */
        plen = 0;
    }
    return jlm_session_encode(s, jlm_session_at_start(s, full + plen), 1, ids, n, err);
}
