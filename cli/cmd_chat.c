/* cmd_chat.c - `jlm chat MODEL`: an interactive conversation that renders the
 * container's chat template and keeps the conversation in the KV cache: each
 * turn evaluates only the text the new messages add to the rendered prompt
 * (llama.cpp's common_chat_format_single), then generates the reply.
 *
 * Messages come from cli/chat_input.c (libedit on a terminal, plain lines
 * otherwise; \"\"\" blocks and \ continuations); a message starting with '/'
 * is a command (/bye /clear /system /help). The reply goes to stdout, notes
 * and errors to stderr.
 *
 * Invariants: `prev` is the rendered text whose tokens fill the KV cache from
 * position 0 (llama.cpp's gap: the newline after an end-of-turn token is only
 * in the text). A turn whose render does not extend prev (a new system
 * prompt, dropped turns, a template that rewrites old turns) rewinds the
 * cache to 0 and evaluates the whole render. A reply that did not end with an
 * end-of-generation token (Ctrl-C, -n, the context) is kept in the
 * conversation as text: the cache is rewound to the end of the prompt and
 * the next turn evaluates the reply's text as the template renders it.
 *
 * The model, tokenizer, template, sampler and residency reporting are a
 * session (prompt/session.h); its decode loop streams the reply.
 *
 * SIGINT: a flag set by the handler and checked between tokens (session_gen.c)
 * stops the reply; at an empty prompt it ends the chat (exit 130). */
#include "cli/chat_input.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/outfile.h"
#include "cli/report.h"
#include "prompt/session.h"
#include "text/tokenizer/utf8_fix.h"

#include <errno.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_intr;

static void on_sigint(int sig)
{
    (void)sig;
    g_intr = 1;
}

/* restart 0 while waiting for a line (a plain read must return on ^C),
 * 1 while the engine works (its reads must not fail with EINTR). */
static void sigint_mode(int restart)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigaction(SIGINT, &sa, NULL);
}

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
    /* any bytes (the user's, the model's): what is not UTF-8 becomes U+FFFD,
     * since the template and the tokenizer need valid text (llama.cpp's
     * server does the same); so a message is sent, never refused for it */
    c->owned[c->n] = jlm_utf8_fix(content, strlen(content));
    if (!c->owned[c->n])
        return -1;
    c->msgs[c->n].role = role;
    c->msgs[c->n].content = c->owned[c->n];
    c->n++;
    return 0;
}

/* Removes messages [from, from + k). */
static void conv_remove(conv *c, size_t from, size_t k)
{
    for (size_t i = from; i < from + k; i++) free(c->owned[i]);
    memmove(c->msgs + from, c->msgs + from + k, (c->n - from - k) * sizeof *c->msgs);
    memmove(c->owned + from, c->owned + from + k, (c->n - from - k) * sizeof *c->owned);
    c->n -= k;
}

static int conv_has_system(const conv *c)
{
    return c->n && !strcmp(c->msgs[0].role, "system");
}

static void conv_free(conv *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->owned[i]);
    free(c->owned); free(c->msgs);
}

typedef struct chat {
    jlm_session    *ss;
    int32_t        *ids;        /* (n_ctx,) the reply's sampled ids */
    conv            cv;
    char           *prev;       /* see the invariants above */
    const char     *image;      /* --image, for the first message */
    long            img_idx;    /* the message holding it; -1: none (dropped, cleared); -2: not yet given */
    int             n_max, ignore_eos;
} chat;

static int render(chat *ch, int gen, char **out, jlm_err *err)
{
    return jlm_session_render(ch->ss, ch->cv.msgs, ch->cv.n, gen, out, err);
}

/* text at the cache's end: its ids (BOS at position 0, special tokens parsed),
 * a leading BOS text dropped at 0 when the vocab adds BOS itself. */
static int encode(chat *ch, const char *text, int32_t **ids, size_t *n, jlm_err *err)
{
    return jlm_session_encode(ch->ss, jlm_session_at_start(ch->ss, text), 1, ids, n, err);
}

/* Drops the oldest turn (a user message and the replies up to the next user
 * message; the system prompt and the newest message stay). 0: none left. */
static int drop_oldest_turn(chat *ch)
{
    conv *c = &ch->cv;
    size_t f = conv_has_system(c) ? 1 : 0, end = f + 1;
    while (end < c->n && strcmp(c->msgs[end].role, "user"))
        end++;
    if (end >= c->n)
        return 0;
    conv_remove(c, f, end - f);
    if (ch->img_idx >= (long)f)
        ch->img_idx = ch->img_idx < (long)end ? -1 : ch->img_idx - (long)(end - f);
    return 1;
}

static void set_prev(chat *ch, char *text)
{
    free(ch->prev);
    ch->prev = text;
}

/* Forgets the last (user) message after a turn that could not run. */
static void undo_user(chat *ch)
{
    if (ch->img_idx == (long)ch->cv.n - 1)
        ch->img_idx = -2;   /* the image waits for the next message */
    conv_remove(&ch->cv, ch->cv.n - 1, 1);
}

/* The outcome of a step of a turn: go on, the message not sent (printed;
 * the chat goes on), the engine failed (printed), out of memory. */
enum { T_OK = 0, T_SKIP = 1, T_FAIL = 2, T_OOM = 3 };

/* Not sent after a failure at position 0: the cache starts over. */
static int skip_from_zero(chat *ch)
{
    undo_user(ch);
    set_prev(ch, strdup(""));
    return ch->prev ? T_SKIP : T_OOM;
}

/* The user's message into the conversation (--image: in the first one, at
 * its <image> marker or first). */
static int add_user(chat *ch, const char *line)
{
    char *msg = NULL;
    int new_img = ch->image && ch->img_idx == -2;
    if (new_img && !strstr(line, "<image>") && !strstr(line, "<__media__>")) {
        if (asprintf(&msg, "<image>%s", line) < 0)
            return T_OOM;
    } else if (!(msg = strdup(line))) {
        return T_OOM;
    }
    int rc_add = conv_add(&ch->cv, "user", msg);
    free(msg);
    if (rc_add)
        return T_OOM;
    if (new_img)
        ch->img_idx = (long)ch->cv.n - 1;
    return T_OK;
}

/* Context full: keep the system prompt, drop the oldest turns until the
 * whole render and room for the reply fit, evaluate again from 0. *full and
 * *ids are replaced. */
static int fit_context(chat *ch, char **full, int32_t **ids, size_t *n, uint32_t room)
{
    jlm_err err = {0};
    uint32_t n_ctx = jlm_engine_n_ctx(ch->ss->e);
    int dropped = 0;
    jlm_engine_rewind(ch->ss->e, 0);
    for (;;) {
        free(*ids);
        *ids = NULL;
        if (encode(ch, *full, ids, n, &err))
            return jlm_cli_error("jlm chat", err.msg), skip_from_zero(ch);
        if (*n + room <= n_ctx || !drop_oldest_turn(ch))
            break;
        dropped++;
        free(*full);
        *full = NULL;
        if (render(ch, 1, full, &err))
            return jlm_cli_error("jlm chat", err.msg), skip_from_zero(ch);
    }
    set_prev(ch, strdup(""));
    if (!ch->prev)
        return T_OOM;
    if (dropped)
        fprintf(stderr, "jlm chat: context full (%u positions): dropped the oldest %d turn%s\n", n_ctx, dropped,
                dropped == 1 ? "" : "s");
    if (*n >= n_ctx) {
        fprintf(stderr, "jlm chat: message too long: %zu tokens with the system prompt, the context holds %u "
                "(-c); not sent\n", *n, n_ctx);
        undo_user(ch);
        return T_SKIP;
    }
    return T_OK;
}

/* The turn's prompt: the render with a generation prompt (*full) and the
 * ids of what it adds to the cache (all of it when it does not extend
 * prev, or after fit_context). */
static int turn_prompt(chat *ch, char **full, int32_t **ids, size_t *n)
{
    jlm_err err = {0};
    if (render(ch, 1, full, &err)) {
        jlm_cli_errorf("jlm chat", "template: %s; message not sent", err.msg);
        undo_user(ch);
        return T_SKIP;
    }
    uint32_t n_ctx = jlm_engine_n_ctx(ch->ss->e);
    if (jlm_session_extend(ch->ss, ch->prev, *full, ids, n, &err)) {
        jlm_cli_error("jlm chat", err.msg);
        undo_user(ch);
        return T_SKIP;
    }
    /* room for the reply: -n, at most half the context (a quarter for -n -1) */
    uint32_t room = ch->n_max < 0 ? n_ctx / 4 : (uint32_t)ch->n_max < n_ctx / 2 ? (uint32_t)ch->n_max : n_ctx / 2;
    if (jlm_engine_n_past(ch->ss->e) + *n + room > n_ctx)
        return fit_context(ch, full, ids, n, room);
    return T_OK;
}

/* Evaluates the turn's ids (with the image at position 0). */
static int turn_eval(chat *ch, const char *full, int32_t *ids, size_t n)
{
    jlm_err err = {0};
    int rc;
    if (ch->img_idx >= 0 && jlm_engine_n_past(ch->ss->e) == 0) {
        int32_t *img_ids = NULL;
        size_t n_img = 0;
        rc = jlm_session_eval_image(ch->ss, ch->image, jlm_session_at_start(ch->ss, full), &img_ids, &n_img, &err);
        free(img_ids);
    } else {
        rc = jlm_session_eval(ch->ss, ids, n, &err);
    }
    if (!rc)
        return T_OK;
    jlm_cli_error("jlm chat", err.msg);
    if (rc != JLM_ERANGE)
        return T_FAIL;
    jlm_engine_rewind(ch->ss->e, 0);   /* context full with an image's positions: this message is not sent */
    return skip_from_zero(ch);
}

/* The reply kept in the conversation: with its end-of-turn token the cache
 * holds the conversation without a generation prompt; without (Ctrl-C, -n,
 * the context) the reply stays as text the next turn evaluates as rendered. */
static int keep_reply(chat *ch, char *full, char *text, int ended, uint32_t n_prompt)
{
    jlm_err err = {0};
    /* a reply may end inside a UTF-8 sequence or hold stray bytes: the
     * conversation keeps valid text (U+FFFD), or the next render fails */
    char *fixed = text ? jlm_utf8_fix(text, strlen(text)) : NULL;
    free(text);
    if (!fixed || conv_add(&ch->cv, "assistant", fixed)) {
        free(fixed); free(full);
        return T_OOM;
    }
    free(fixed);
    if (ended) {
        free(full);
        char *p = NULL;
        if (render(ch, 0, &p, &err)) {
            jlm_cli_error("jlm chat", err.msg);
            jlm_engine_rewind(ch->ss->e, 0);
            p = strdup("");
        }
        set_prev(ch, p);
    } else {
        jlm_engine_rewind(ch->ss->e, n_prompt);
        set_prev(ch, full);
    }
    return ch->prev ? T_OK : T_OOM;
}

/* The reply: generated, streamed, kept. Takes full. */
static int turn_reply(chat *ch, char *full)
{
    jlm_err err = {0};
    jlm_session *s = ch->ss;
    uint32_t n_ctx = jlm_engine_n_ctx(s->e), n_prompt = jlm_engine_n_past(s->e), left = n_ctx - n_prompt;
    int want = ch->n_max < 0 || (uint32_t)ch->n_max > left ? (int)left : ch->n_max;
    jlm_tok_stream ts;
    jlm_tok_stream_init(&ts, s->tok, 0, 0);
    jlm_sess_gen g = {.n_max = want, .eval_eog = 1, .eval_last = 1, .fix_utf8 = 1, .ignore_eos = ch->ignore_eos,
                      .stop = &g_intr, .ts = &ts, .emit = jlm_cli_put_stdout};
    char *text = NULL;
    size_t n_ids = 0;
    int rc = jlm_session_generate(s, &g, ch->ids, &n_ids, &text, &err);
    fputc('\n', stdout);   /* the reply's line ends; a reader on a pipe sees the turn now */
    jlm_cli_stdout_flush();
    if (rc) {
        if (!(rc == JLM_EIO && jlm_cli_stdout_check("jlm chat")))
            jlm_cli_error("jlm chat", err.msg);
        free(text); free(full);
        return T_FAIL;
    }
    int stopped = g_intr;
    g_intr = 0;
    int ended = n_ids && jlm_tok_is_eog(s->tok, ch->ids[n_ids - 1]);
    if (!ended && !stopped && want < ch->n_max)
        fprintf(stderr, "jlm chat: context full (%u positions): the reply stopped at %zu tokens\n", n_ctx, n_ids);
    return keep_reply(ch, full, text, ended, n_prompt);
}

/* One user turn. 0: go on (problems with this message were printed);
 * 1: the engine failed (printed); -1: out of memory. */
static int turn(chat *ch, const char *line)
{
    char *full = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = add_user(ch, line);
    if (!rc)
        rc = turn_prompt(ch, &full, &ids, &n);
    if (!rc)
        rc = turn_eval(ch, full, ids, n);
    free(ids);
    if (!rc)
        rc = turn_reply(ch, full);   /* takes full */
    else
        free(full);
    return rc == T_OK || rc == T_SKIP ? 0 : rc == T_FAIL ? 1 : -1;
}

static void print_help(void)
{
    printf("commands:\n"
           "  /bye            leave (also Ctrl-D, or Ctrl-C at an empty prompt)\n"
           "  /clear          forget the conversation (the system prompt stays)\n"
           "  /system TEXT    set the system prompt (/system alone removes it)\n"
           "  /help, /?       this help\n"
           "input:\n"
           "  \"\"\" on a line opens a message of several lines; a line ending with \"\"\" closes it\n"
           "  a line ending with \\ goes on on the next line\n"
           "  Ctrl-C stops a reply; the part already written stays in the conversation\n");
    jlm_cli_stdout_flush();
}

/* 0 go on, 1 leave (/bye), -1 out of memory. */
static int command(chat *ch, const char *line)
{
    size_t k = strcspn(line, " \t");
    const char *arg = line + k + strspn(line + k, " \t");
    if (k == 4 && !strncmp(line, "/bye", 4))
        return 1;
    if ((k == 5 && !strncmp(line, "/help", 5)) || (k == 2 && !strncmp(line, "/?", 2))) {
        print_help();
    } else if (k == 6 && !strncmp(line, "/clear", 6)) {
        size_t f = conv_has_system(&ch->cv) ? 1 : 0;
        conv_remove(&ch->cv, f, ch->cv.n - f);
        if (ch->img_idx >= 0)
            ch->img_idx = -1;
        jlm_engine_rewind(ch->ss->e, 0);
        jlm_samp_reset(ch->ss->s);
        set_prev(ch, strdup(""));
        if (!ch->prev)
            return -1;
        fprintf(stderr, "jlm chat: conversation cleared%s\n", f ? " (the system prompt stays)" : "");
    } else if (k == 7 && !strncmp(line, "/system", 7)) {
        int had = conv_has_system(&ch->cv);
        if (!*arg) {
            if (had) {
                conv_remove(&ch->cv, 0, 1);
                if (ch->img_idx >= 0)
                    ch->img_idx--;
            }
            fprintf(stderr, "jlm chat: system prompt removed\n");
            return 0;
        }
        char *t = jlm_utf8_fix(arg, strlen(arg));   /* as a message's text: U+FFFD for what is not UTF-8 */
        if (!t)
            return -1;
        if (had) {
            free(ch->cv.owned[0]);
            ch->cv.owned[0] = t;
            ch->cv.msgs[0].content = t;
        } else {
            int rc = conv_add(&ch->cv, "system", t);
            free(t);
            if (rc)
                return -1;
            jlm_chat_msg m = ch->cv.msgs[ch->cv.n - 1];
            char *o = ch->cv.owned[ch->cv.n - 1];
            memmove(ch->cv.msgs + 1, ch->cv.msgs, (ch->cv.n - 1) * sizeof m);
            memmove(ch->cv.owned + 1, ch->cv.owned, (ch->cv.n - 1) * sizeof o);
            ch->cv.msgs[0] = m;
            ch->cv.owned[0] = o;
            if (ch->img_idx >= 0)
                ch->img_idx++;
        }
        /* the next turn renders differently from prev: it evaluates from 0 */
        fprintf(stderr, "jlm chat: system prompt set\n");
    } else {
        char m[160];
        snprintf(m, sizeof m, "unknown command '%.*s' (/help lists them)", (int)(k > 64 ? 64 : k), line);
        jlm_cli_error("jlm chat", m);
    }
    return 0;
}

/* The family of a chat template, from the markers it writes (for the banner). */
static const char *template_kind(const char *t)
{
    static const struct { const char *mark, *name; } K[] = {
        {"<|channel|>", "harmony"},        {"<|im_start|>", "chatml"},    {"<start_of_turn>", "gemma"},
        {"<|start_header_id|>", "llama3"}, {"<|User|>", "deepseek"},      {"<|user|>", "phi3"},
        {"[INST]", "llama2/mistral"},      {"<|turn>", "gemma"},
    };
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++)
        if (strstr(t, K[i].mark))
            return K[i].name;
    return "custom";
}

/* The parsed command line of `jlm chat`. */
typedef struct chat_args {
    const char *model, *image, *system;
    jlm_engine_opts eo;
    jlm_samp_params sp;
    int n_max, ignore_eos;
} chat_args;

/* 0, the exit status after one line, or -1 after --help. */
static int chat_parse(int argc, char **argv, chat_args *a)
{
    jlm_opts_gpu gpu = {0};
    const jlm_opt head[] = {
        {"-m", "--model", JLM_OPT_STR, &a->model, 0, 0, 0, "FILE", "the model (or give it first)"},
        {"-sys", "--system", JLM_OPT_STR, &a->system, 0, 0, 0, "TEXT", "the system prompt (/system changes it)"},
        {"-n", "--n-predict", JLM_OPT_INT, &a->n_max, -1, 1 << 30, 0, "N", "reply tokens at most, -1: until the context is full"},
    };
    const jlm_opt tail[] = {
        {NULL, "--ignore-eos", JLM_OPT_FLAG, &a->ignore_eos, 0, 0, 0, NULL, "never end a reply with an end-of-turn token (-n ends it)"},
        {NULL, "--image", JLM_OPT_STR, &a->image, 0, 0, 0, "FILE", "an image for the first message"},
    };
    jlm_opt t[sizeof head / sizeof head[0] + sizeof tail / sizeof tail[0] + JLM_OPTS_ENGINE_MAX + JLM_OPTS_SAMPLER_MAX];
    int nt = jlm_opts_cat(t, 0, head, (int)(sizeof head / sizeof head[0]));
    nt += jlm_opts_engine_rows(t + nt, JLM_ROWS_CTX | JLM_ROWS_THREADS, &a->eo, NULL);
    nt += jlm_opts_sampler_rows(t + nt, &a->sp);
    nt = jlm_opts_cat(t, nt, tail, 1);
    nt += jlm_opts_engine_rows(t + nt, JLM_ROWS_BUDGET | JLM_ROWS_KV, &a->eo, NULL);
    nt = jlm_opts_cat(t, nt, tail + 1, 1);
    nt += jlm_opts_engine_rows(t + nt, JLM_ROWS_PAGING | JLM_ROWS_BACKEND, &a->eo, &gpu);
    const char *pos[1] = {0};
    jlm_opts_spec os = {"jlm chat", "MODEL [options]   (messages from the terminal, or one per line on stdin; /help)",
                        t, nt, pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? -1 : prc;
    if ((prc = jlm_opts_engine_finish("jlm chat", &a->eo, &gpu)))
        return prc;
    if (a->sp.seed == JLM_CLI_SEED_UNSET)
        a->sp.seed = jlm_cli_random_seed();   /* llama.cpp's default */
    if (os.n_pos && a->model)
        return jlm_cli_error("jlm chat", "give the model once: as MODEL or as -m"), 2;
    if (os.n_pos)
        a->model = pos[0];
    if (!a->model)
        return jlm_cli_error("jlm chat", "no model: give MODEL or -m FILE (see --help)"), 2;
    return 0;
}

/* The session, the buffers and the banner. 0, or 1 after a line. */
static int chat_open(chat *ch, const chat_args *a, const char *model)
{
    jlm_err err = {0};
    jlm_sess_opts so = {.eng = a->eo, .samp = &a->sp, .view = jlm_cli_view("jlm chat"), .flags = JLM_SESS_TEMPLATE};
    if (jlm_session_open(model, &so, &ch->ss, &err))
        return jlm_cli_error("jlm chat", err.msg), 1;
    jlm_cli_ctx_warn("jlm chat", ch->ss->e, a->eo.n_ctx);
    uint32_t n_ctx = jlm_engine_n_ctx(ch->ss->e);
    ch->ids = malloc(((size_t)n_ctx + 1) * sizeof *ch->ids);
    ch->prev = strdup("");
    if (!ch->ids || !ch->prev || (a->system && *a->system && conv_add(&ch->cv, "system", a->system)))
        return jlm_cli_error("jlm chat", "out of memory"), 1;
    char b[1200];
    snprintf(b, sizeof b, "%s | template: %s | context: %u tokens | /help for commands, Ctrl-D to leave", model,
             ch->ss->tmpl_fallback ? "chatml (the model has none)" : template_kind(ch->ss->tmpl), n_ctx);
    jlm_cli_error("jlm chat", b);
    return 0;
}

/* Messages until the end of input, /bye, Ctrl-C at the prompt or an error:
 * the exit status. */
static int chat_loop(chat *ch, jlm_chat_in *in)
{
    for (;;) {
        g_intr = 0;
        sigint_mode(0);
        char *line = NULL;
        int r = jlm_chat_in_read(in, &line);
        sigint_mode(1);
        if (r == JLM_CHAT_IN_EOF)
            return 0;
        if (r == JLM_CHAT_IN_INTR)
            return 130;   /* as llama.cpp: interrupted */
        if (r == JLM_CHAT_IN_TOOLONG) {
            fprintf(stderr, "jlm chat: message longer than %u MiB; not sent\n", JLM_CHAT_IN_MAX >> 20);
            continue;
        }
        if (r != JLM_CHAT_IN_MSG)
            return fprintf(stderr, "jlm chat: out of memory\n"), 1;
        int rc = 0, is_cmd = line[0] == '/' && !strchr(line, '\n');
        if (is_cmd)
            rc = command(ch, line);
        else if (line[strspn(line, " \t\r\n")])
            rc = turn(ch, line);
        free(line);
        if (rc == 1 && is_cmd)
            return 0;
        if (rc < 0)
            fprintf(stderr, "jlm chat: out of memory\n");
        if (rc)
            return 1;
    }
}

int jlm_cmd_chat(int argc, char **argv)
{
    chat_args a = {.eo = {.direct = 1, .budget = JLM_BUDGET_AUTO}, .n_max = 256};
    jlm_samp_params_default(&a.sp);
    a.sp.seed = JLM_CLI_SEED_UNSET;
    int status = chat_parse(argc, argv, &a);
    if (status)
        return status < 0 ? 0 : status;
    const char *model = jlm_cli_resolve_model("jlm chat", a.model);
    if (!model)
        return 1;
    chat ch = {.image = a.image, .img_idx = a.image ? -2 : -1, .n_max = a.n_max, .ignore_eos = a.ignore_eos};
    jlm_chat_in *in = NULL;
    struct sigaction old_int;
    sigaction(SIGINT, NULL, &old_int);
    status = chat_open(&ch, &a, model);
    if (!status && !(in = jlm_chat_in_open("jlm", &g_intr)))
        status = (jlm_cli_error("jlm chat", "out of memory"), 1);
    if (!status)
        status = chat_loop(&ch, in);
    sigaction(SIGINT, &old_int, NULL);
    jlm_chat_in_close(in);
    conv_free(&ch.cv);
    free(ch.prev);
    free(ch.ids);
    jlm_session_close(ch.ss);
    return status;
}
