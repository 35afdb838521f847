/* template_cmd.c - `jlm template (MODEL | --template FILE.jinja) --messages FILE.json
 * [--add-generation-prompt] [--bos S] [--eos S] [--now ISO-8601]`: prints the
 * prompt llama.cpp would render for the messages, and nothing else.
 * MODEL's default template and BOS/EOS token texts come from its vocab;
 * --bos/--eos override them. Without --now the clock is the current local
 * time (as llama.cpp); with --now it is that instant, formatted in UTC. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/outfile.h"
#include "cli/report.h"
#include "text/template/chat.h"

static int usage(void)
{
    fprintf(stderr, "usage: jlm template (MODEL | --template FILE.jinja) --messages FILE.json "
                    "[--add-generation-prompt] [--bos S] [--eos S] [--now ISO-8601]\n");
    return 2;
}

/* "YYYY-MM-DD[THH:MM[:SS]][Z]" as UTC; -1 on a malformed string. */
static time_t parse_iso(const char *s)
{
    struct tm tm = {0};
    int y, mo, d, h = 0, mi = 0, sec = 0, used = 0;
    if (sscanf(s, "%4d-%2d-%2d%n", &y, &mo, &d, &used) != 3) return -1;
    s += used;
    if (*s == 'T' || *s == ' ') {
        int u2 = 0;
        if (sscanf(s + 1, "%2d:%2d%n", &h, &mi, &u2) != 2) return -1;
        s += 1 + u2;
        if (*s == ':') {
            if (sscanf(s + 1, "%2d%n", &sec, &u2) != 1) return -1;
            s += 1 + u2;
        }
    }
    if (*s == 'Z' || !strcmp(s, "+00:00")) s += *s == 'Z' ? 1 : 6;
    if (*s) return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    return timegm(&tm);
}

typedef struct targs {
    const char *model, *tmpl_path, *msgs_path, *bos, *eos, *now;
    int add_gen;
} targs;

/* 0, 2 (usage; printed), or -1 after --help. */
static int parse_args(int argc, char **argv, targs *a)
{
    const char *m_opt = NULL;
    const jlm_opt t[] = {
        {"-m", "--model", JLM_OPT_STR, &m_opt, 0, 0, 0, "FILE", "the model (or give it first)"},
        {NULL, "--template", JLM_OPT_STR, &a->tmpl_path, 0, 0, 0, "FILE", "a Jinja chat template instead of MODEL's"},
        {NULL, "--messages", JLM_OPT_STR, &a->msgs_path, 0, 0, 0, "FILE.json", "the messages (an array, or {messages: [...]})"},
        {NULL, "--add-generation-prompt", JLM_OPT_FLAG, &a->add_gen, 0, 0, 0, NULL, "end with the assistant's turn opening"},
        {NULL, "--bos", JLM_OPT_STR, &a->bos, 0, 0, 0, "S", "bos_token text"},
        {NULL, "--eos", JLM_OPT_STR, &a->eos, 0, 0, 0, "S", "eos_token text"},
        {NULL, "--now", JLM_OPT_STR, &a->now, 0, 0, 0, "ISO", "the template's clock (YYYY-MM-DD[THH:MM:SS])"},
    };
    const char *pos[1] = {0};
    jlm_opts_spec os = {"jlm template", "(MODEL | --template FILE) --messages FILE.json [options]", t,
                        (int)(sizeof t / sizeof t[0]), pos, 1, 0};
    int rc = jlm_opts_parse(&os, argc, argv);
    if (rc)
        return rc == 1 ? -1 : rc;
    if (os.n_pos && m_opt)
        return jlm_cli_error("jlm template", "give the model once: as MODEL or as -m"), 2;
    a->model = os.n_pos ? pos[0] : m_opt;
    if (!a->msgs_path || (!a->model) == (!a->tmpl_path)) return usage();
    return 0;
}

static json_t *load_messages(const char *path)
{
    json_error_t je;
    char *text = jlm_opts_read_text("jlm template", "--messages", path, JLM_CLI_PROMPT_MAX);
    if (!text)
        return NULL;
    json_t *j = json_loads(text, 0, &je);
    free(text);
    if (!j) {
        fprintf(stderr, "jlm template: %s: line %d: %s\n", path, je.line, je.text);
        return NULL;
    }
    if (json_is_object(j) && json_is_array(json_object_get(j, "messages"))) {
        json_t *m = json_incref(json_object_get(j, "messages"));
        json_decref(j);
        j = m;
    }
    if (!json_is_array(j)) {
        fprintf(stderr, "jlm template: %s: expected a JSON array of messages\n", path);
        json_decref(j);
        return NULL;
    }
    return j;
}

int jlm_cmd_template(int argc, char **argv)
{
    targs a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;   /* -1: --help printed */
    jlm_chat_opts o = {.add_generation_prompt = a.add_gen, .local_time = 1};
    if (a.now) {
        o.now = parse_iso(a.now);
        if (o.now == (time_t)-1) {
            fprintf(stderr, "jlm template: --now %s: expected ISO-8601 like 2025-03-07T12:00:00Z\n", a.now);
            return 2;
        }
        o.local_time = 0;
    }
    char *tmpl = NULL, *bos = NULL, *eos = NULL;
    size_t tlen = 0;
    jlm_err err = {0};
    if (a.tmpl_path) {
        if (!(tmpl = jlm_opts_read_text("jlm template", "--template", a.tmpl_path, JLM_CLI_TEMPLATE_MAX)))
            return 1;
        tlen = strlen(tmpl);
    } else {
        const char *model = jlm_cli_resolve_model("jlm template", a.model);   /* a GGUF, a view, a .jlm */
        char *file = model ? jlm_cli_container_path(model) : NULL;
        int trc = file ? jlm_chat_template_from_model(file, &tmpl, &bos, &eos, &err) : 1;
        if (trc && file)
            jlm_cli_error("jlm template", err.msg);
        else if (!file && model)
            jlm_cli_error("jlm template", "out of memory");
        free(file);
        if (trc)
            return 1;
        tlen = strlen(tmpl);
    }
    o.bos_token = a.bos ? a.bos : bos;
    o.eos_token = a.eos ? a.eos : eos;
    json_t *msgs = load_messages(a.msgs_path);
    char *out = NULL;
    size_t n = 0;
    rc = 1;
    if (msgs) {
        if (jlm_chat_render_json(tmpl, tlen, msgs, &o, 1, &out, &n, &err))
            fprintf(stderr, "jlm template: %s: %s\n", a.tmpl_path ? a.tmpl_path : a.model, err.msg);
        else {
            if (fwrite(out, 1, n, stdout) != n)
                jlm_cli_stdout_failed(errno);
            rc = jlm_cli_stdout_check("jlm template");
        }
    }
    json_decref(msgs);
    free(out);
    free(tmpl);
    free(bos);
    free(eos);
    return rc;
}
