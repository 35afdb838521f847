/* ollama.c - ollama's API (request shapes: dialect.c): POST /api/chat and
 * /api/generate (NDJSON, one object per piece of text, streamed unless
 * "stream": false, the last one with done: true, done_reason and the
 * counts and durations; a tool request's calls in message.tool_calls, of
 * one object before the last when streamed), POST /api/embed (embed.c's jobs), GET /api/tags
 * and /api/ps (the served models), POST /api/show (one model's details,
 * template and capabilities: "tools" when its template renders them), GET /api/version. Models are named by file stem, with or
 * without ":latest"; errors are {"error": message}. */
#include "serve/http_int.h"
#include "serve/dialect.h"
#include "serve/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define OLLAMA_VERSION "0.12.0"   /* the API version whose shapes these are */

static json_t *created_at(void)
{
    char b[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(b);
}

/* {model, created_at, message: {role, content} | response, done: false} */
static json_t *ol_object(const srv_job *j, int generate, const char *text, size_t len)
{
    json_t *t = jlm_srv_json_text(text, len);
    json_t *o = json_pack("{s:s, s:o, s:b}", "model", j->req.model ? j->req.model : j->ident.model, "created_at",
                          created_at(), "done", 0);
    if (o && t && generate)
        json_object_set_new(o, "response", t);
    else if (o && t)
        json_object_set_new(o, "message", json_pack("{s:s, s:o}", "role", "assistant", "content", t));
    else
        json_decref(t);
    return o;
}

/* The last object: done, done_reason ("stop" after tool calls, as ollama
 * says), counts, durations (ns); calls: the message's tool_calls. */
static json_t *ol_final(const srv_job *j, int generate, const char *text, size_t len, const json_t *calls)
{
    json_t *o = ol_object(j, generate, text, len);
    const char *fin = j->res.finish_reason ? j->res.finish_reason : "stop";
    if (!strcmp(fin, "tool_calls"))
        fin = "stop";
    if (o && json_array_size(calls) && !generate &&
        json_object_set_new(json_object_get(o, "message"), "tool_calls", jlm_srv_ollama_calls(calls))) {
        json_decref(o);
        return NULL;
    }
    uint64_t first = j->t_first_us ? j->t_first_us : j->t_start_us, end = j->t_end_us ? j->t_end_us : first;
    if (o && json_object_update_new(o, json_pack("{s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "done", 1, "done_reason", fin,
                                                 "total_duration", (json_int_t)((end - j->t_start_us) * 1000),
                                                 "load_duration", (json_int_t)0, "prompt_eval_count",
                                                 (json_int_t)j->res.prompt_tokens, "prompt_eval_duration",
                                                 (json_int_t)((first - j->t_start_us) * 1000), "eval_count",
                                                 (json_int_t)j->res.completion_tokens, "eval_duration",
                                                 (json_int_t)((end - first) * 1000)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void line(srv_job *j, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) {
        jlm_srv_job_write(j, "", 0);
        return;
    }
    size_t n = strlen(s);
    s[n] = '\n';   /* json_dumps' NUL becomes the line's end */
    jlm_srv_job_write(j, s, n + 1);
    free(s);
}

static void chat_piece(srv_job *j, const char *p, size_t n) { line(j, ol_object(j, 0, p, n)); }
static void gen_piece(srv_job *j, const char *p, size_t n) { line(j, ol_object(j, 1, p, n)); }
static void chat_close(srv_job *j, int st, const char *msg) { line(j, st == 200 ? ol_final(j, 0, "", 0, NULL) : jlm_srv_ollama_error(st, msg)); }
static void gen_close(srv_job *j, int st, const char *msg) { line(j, st == 200 ? ol_final(j, 1, "", 0, NULL) : jlm_srv_ollama_error(st, msg)); }
static json_t *chat_whole(const srv_job *j) { return ol_final(j, 0, j->out ? j->out : "", j->len, j->res.tool_calls); }
static json_t *gen_whole(const srv_job *j) { return ol_final(j, 1, j->out ? j->out : "", j->len, NULL); }

/* A stream's calls: one object whose message has them (as ollama streams). */
static void chat_calls(srv_job *j, const json_t *calls)
{
    json_t *o = ol_object(j, 0, "", 0);
    if (o && json_object_set_new(json_object_get(o, "message"), "tool_calls", jlm_srv_ollama_calls(calls))) {
        json_decref(o);
        o = NULL;
    }
    line(j, o);
}

/* The ping while a stream waits is a space: whitespace before the next
 * line's JSON, which an NDJSON reader parses past (an SSE comment would be
 * a line that is not JSON). */
static const srv_dialect OL_CHAT = {"application/x-ndjson", " ", NULL, chat_piece, chat_calls, chat_close, chat_whole,
                                    jlm_srv_ollama_error};
static const srv_dialect OL_GENERATE = {"application/x-ndjson", " ", NULL, gen_piece, NULL, gen_close, gen_whole,
                                        jlm_srv_ollama_error};

/* ---------------------------------------------------------------- models */

static json_t *details(const srv_model *m)
{
    const char *arch = m->e ? jlm_fmt_arch_name(jlm_engine_model(m->e)->config.arch) : NULL;
    return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", "jlm", "family",
                     arch ? arch : "", "families", arch ? arch : "", "parameter_size", "", "quantization_level", "");
}

/* name "ID:latest"; size and modified_at: the container's; digest: its
 * device, inode, size and mtime (what names this version of the file). */
static json_t *model_entry(const srv_model *m, int ps)
{
    char name[300], digest[80];
    struct stat st = {0};
    stat(m->path, &st);
    snprintf(name, sizeof name, "%s:latest", m->id);
    snprintf(digest, sizeof digest, "%016llx%016llx%016llx%016llx", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino, (unsigned long long)st.st_size,
             (unsigned long long)st.st_mtim.tv_sec * 1000000000ull + (unsigned long long)st.st_mtim.tv_nsec);
    uint64_t size = (uint64_t)st.st_size;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o}", "name", name, "model", name, "size", (json_int_t)size, "digest",
                          digest, "details", details(m));
    if (o && ps)
        json_object_update_new(o, json_pack("{s:s, s:I, s:I}", "expires_at", "9999-12-31T23:59:59Z", "size_vram",
                                            (json_int_t)0, "context_length",
                                            (json_int_t)(m->e ? jlm_engine_n_ctx(m->e) : 0)));
    else if (o) {
        char mod[32];
        time_t t = st.st_mtim.tv_sec;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(mod, sizeof mod, "%Y-%m-%dT%H:%M:%SZ", &tm);
        json_object_set_new(o, "modified_at", json_string(mod));
    }
    return o;
}

/* /api/tags: every model; /api/ps: the ready ones (their engines are open). */
static json_t *list(struct jlm_srv *s, int ps)
{
    json_t *a = json_array();
    pthread_mutex_lock(&s->models_mu);
    for (size_t i = 0; a && i < s->n_models; i++)
        if (!ps || !s->models[i]->status)
            json_array_append_new(a, model_entry(s->models[i], ps));
    pthread_mutex_unlock(&s->models_mu);
    return json_pack("{s:o}", "models", a);
}

static json_t *show(const srv_model *m)
{
    const jlm_config *c = &jlm_engine_model(m->e)->config;
    const char *arch = jlm_fmt_arch_name(c->arch);
    char k1[64], k2[64], k3[64];
    snprintf(k1, sizeof k1, "%s.context_length", arch ? arch : "unknown");
    snprintf(k2, sizeof k2, "%s.embedding_length", arch ? arch : "unknown");
    snprintf(k3, sizeof k3, "%s.block_count", arch ? arch : "unknown");
    json_t *info = json_pack("{s:s, s:I, s:I, s:I}", "general.architecture", arch ? arch : "unknown", k1,
                             (json_int_t)jlm_engine_n_ctx(m->e), k2, (json_int_t)c->n_embd, k3, (json_int_t)c->n_layer);
    /* tools: the template renders them, or it is the ChatML fallback (Hermes tools, serve/toolcall.h) */
    int tools = (m->tmpl != m->srv->o.chat_template && m->sess->tmpl_fallback) ||
                (m->tmpl && jlm_tc_family_of(m->tmpl, strlen(m->tmpl)) != JLM_TC_NONE);
    json_t *caps = json_pack("[s, s]", "completion", "embedding");
    if (caps && tools)
        json_array_append_new(caps, json_string("tools"));
    return json_pack("{s:s, s:s, s:s, s:o, s:o, s:o, s:s}", "modelfile", "", "parameters", "", "template",
                     m->tmpl ? m->tmpl : "", "details", details(m), "model_info", info, "capabilities", caps,
                     "modified_at", "");
}

/* POST /api/show {"model": NAME} */
static enum MHD_Result api_show(struct jlm_srv *s, struct MHD_Connection *c, const char *body, size_t len)
{
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    const char *name = json_string_value(json_object_get(o, "model"));
    if (!name)
        name = json_string_value(json_object_get(o, "name"));   /* the older field */
    char *id = name ? jlm_srv_ollama_name(name) : NULL;
    json_decref(o);
    if (!id)
        return jlm_srv_send_error(s, c, &OL_CHAT, 400, "'model': expected a string naming a model");
    srv_model *m = jlm_srv_find_model(s, id);
    char msg[400];
    snprintf(msg, sizeof msg, "model '%.300s' not found", id);
    free(id);
    enum MHD_Result ok = !m        ? jlm_srv_send_error(s, c, &OL_CHAT, 404, msg)
                       : m->status ? jlm_srv_send_error(s, c, &OL_CHAT, 503, m->status)
                                   : jlm_srv_send_json(c, 200, show(m));
    jlm_srv_model_unref(m);
    return ok;
}

static enum MHD_Result generate(struct jlm_srv *s, struct MHD_Connection *c, jlm_srv_api api, const srv_dialect *dia,
                                const char *body, size_t len)
{
    jlm_err err = {0};
    jlm_srv_req req;
    int rc = jlm_srv_dialect_parse(api, body, len, &req, &err);
    if (rc)
        return jlm_srv_send_error(s, c, dia, rc == JLM_ENOMEM ? 500 : 400, err.msg);
    return jlm_srv_submit(s, c, &req, dia);
}

enum MHD_Result jlm_srv_ollama(struct jlm_srv *s, struct MHD_Connection *c, const char *url, const char *method,
                               const char *body, size_t len)
{
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const char *p = url + 5;
    if (!strcmp(p, "tags") || !strcmp(p, "ps") || !strcmp(p, "version")) {
        if (!get)
            return jlm_srv_send_error(s, c, &OL_CHAT, 405, "GET only");
        if (!strcmp(p, "version"))
            return jlm_srv_send_json(c, 200, json_pack("{s:s}", "version", OLLAMA_VERSION));
        jlm_srv_scan_now(s, 5000);
        return jlm_srv_send_json(c, 200, list(s, !strcmp(p, "ps")));
    }
    const srv_dialect *dia = !strcmp(p, "chat")     ? &OL_CHAT
                           : !strcmp(p, "generate") ? &OL_GENERATE
                           : !strcmp(p, "embed")    ? &jlm_srv_dia_ollama_embed
                                                    : NULL;
    if (!dia && strcmp(p, "show"))
        return jlm_srv_send_error(s, c, &OL_CHAT, 404, "no such endpoint");
    if (!post)
        return jlm_srv_send_error(s, c, &OL_CHAT, 405, "POST only");
    if (!dia)
        return api_show(s, c, body, len);
    jlm_srv_api api = dia == &OL_CHAT ? JLM_SRV_API_OLLAMA_CHAT
                    : dia == &OL_GENERATE ? JLM_SRV_API_OLLAMA_GENERATE : JLM_SRV_API_OLLAMA_EMBED;
    return generate(s, c, api, dia, body, len);
}
