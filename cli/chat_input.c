/* chat_input.c - the message reader of `jlm chat` (chat_input.h). */
#include "cli/chat_input.h"

#include <errno.h>
#include <fcntl.h>
#include <histedit.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

struct jlm_chat_in {
    EditLine *el;                  /* NULL: plain reads from src */
    FILE *src;                     /* stdin (a fuzz target reads a memory stream) */
    History *hist;
    FILE *draw;                    /* where the editor draws (a terminal) */
    char *hpath;                   /* history file, NULL: none */
    volatile sig_atomic_t *intr;
    int eof;                       /* input ended: the next read returns EOF */
    char *line;                    /* the last physical line (no newline) */
    size_t cap;
    int n_lines;                   /* physical lines of the message being read */
};

/* libedit calls the prompt and key functions without a context of ours;
 * one reader exists per process. */
static const char *g_prompt = "> ";
static int g_ctrl_c = -1;          /* -1: no ^C; 0: at an empty line; 1: with text */

static char *prompt_fn(EditLine *el)
{
    (void)el;
    return (char *)g_prompt;
}

/* ^C in the editor (ISIG is off while editing, so it arrives as a key):
 * remember whether text was typed and end the read like EOF. */
static unsigned char ctrl_c_fn(EditLine *el, int ch)
{
    (void)ch;
    const LineInfo *li = el_line(el);
    g_ctrl_c = li->lastchar > li->buffer;
    return CC_EOF;
}

static int mkdir_parents(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        int rc = mkdir(path, 0700);
        *p = '/';
        if (rc && errno != EEXIST)
            return -1;
    }
    return 0;
}

char *jlm_chat_history_path(void)
{
    const char *state = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char *p = NULL;
    if (state && state[0] == '/') {
        if (asprintf(&p, "%s/jlm/history", state) < 0)
            p = NULL;
    } else if (home && *home) {
        if (asprintf(&p, "%s/.local/state/jlm/history", home) < 0)
            p = NULL;
    }
    return p;
}

/* Runs f with LC_CTYPE from the environment, so libedit reads and draws
 * multibyte characters; the rest of jlm (the tokenizer's ctype calls) keeps
 * the C locale. */
static void with_user_ctype(int on, char *saved, size_t n)
{
    if (on) {
        const char *cur = setlocale(LC_CTYPE, NULL);
        snprintf(saved, n, "%s", cur ? cur : "C");
        setlocale(LC_CTYPE, "");
    } else {
        setlocale(LC_CTYPE, saved);
    }
}

static int open_editor(jlm_chat_in *in, const char *prog)
{
    char saved[128];
    with_user_ctype(1, saved, sizeof saved);
    in->el = el_init(prog, stdin, in->draw, stderr);
    with_user_ctype(0, saved, sizeof saved);
    in->hist = history_init();
    if (!in->el || !in->hist)
        return -1;
    HistEvent ev;
    history(in->hist, &ev, H_SETSIZE, 1000);
    history(in->hist, &ev, H_SETUNIQUE, 1);
    in->hpath = jlm_chat_history_path();
    if (in->hpath)
        history(in->hist, &ev, H_LOAD, in->hpath);   /* a missing or unreadable file: an empty history */
    el_set(in->el, EL_EDITOR, "emacs");
    el_set(in->el, EL_HIST, history, in->hist);
    el_set(in->el, EL_PROMPT, prompt_fn);
    el_set(in->el, EL_SIGNAL, 1);
    el_source(in->el, NULL);   /* the user's ~/.editrc, as every libedit program */
    el_set(in->el, EL_SETTY, "-d", "-isig", NULL);
    /* the wide call: libedit keeps these pointers as given, where the narrow
     * el_set(EL_ADDFN) stores wcsdup'd copies that el_end never frees */
    el_wset(in->el, EL_ADDFN, L"jlm-interrupt", L"stop the line or leave", ctrl_c_fn);
    el_set(in->el, EL_BIND, "^C", "jlm-interrupt", NULL);
    return 0;
}

jlm_chat_in *jlm_chat_in_open(const char *prog, volatile sig_atomic_t *intr)
{
    jlm_chat_in *in = calloc(1, sizeof *in);
    if (!in)
        return NULL;
    in->intr = intr;
    in->src = stdin;
    if (isatty(0) && (isatty(2) || isatty(1))) {
        in->draw = isatty(2) ? stderr : stdout;
        if (open_editor(in, prog)) {   /* no editor here (a terminal libedit cannot drive): plain reads */
            if (in->el)
                el_end(in->el);
            if (in->hist)
                history_end(in->hist);
            free(in->hpath);
            in->el = NULL;
            in->hist = NULL;
            in->hpath = NULL;
        }
    }
    return in;
}

int jlm_chat_in_edits(const jlm_chat_in *in)
{
    return in->el != NULL;
}

static int keep_line(jlm_chat_in *in, const char *l, size_t n)
{
    while (n && (l[n - 1] == '\n' || l[n - 1] == '\r'))
        n--;
    if (n + 1 > in->cap) {
        char *b = realloc(in->line, n + 1);
        if (!b)
            return -1;
        in->line = b;
        in->cap = n + 1;
    }
    memmove(in->line, l, n);   /* l may be in->line itself (plain reads) */
    in->line[n] = 0;
    return 0;
}

enum { L_LINE, L_EOF, L_INTR_EMPTY, L_INTR_TEXT, L_TOOLONG, L_NOMEM = -1 };

/* A plain line in bounded memory: a longer one is read to its end and
 * reported (L_TOOLONG). The last line may lack its newline. */
static int read_plain(jlm_chat_in *in)
{
    size_t n = 0;
    int c, over = 0, any = 0;
    while ((c = getc_unlocked(in->src)) != EOF) {
        any = 1;
        if (c == '\n')
            break;
        if (over)
            continue;
        if (n + 2 > in->cap) {
            size_t cap = in->cap ? in->cap * 2 : 256;
            char *b = realloc(in->line, cap);
            if (!b)
                return L_NOMEM;
            in->line = b;
            in->cap = cap;
        }
        in->line[n++] = (char)c;
        over = n > JLM_CHAT_IN_MAX;
    }
    if (!any)
        return *in->intr ? L_INTR_EMPTY : L_EOF;
    if (over)
        return L_TOOLONG;
    if (!in->line && keep_line(in, "", 0))
        return L_NOMEM;
    in->line[n] = 0;
    if (n && in->line[n - 1] == '\r')
        in->line[n - 1] = 0;
    return L_LINE;
}

/* One physical line into in->line. */
static int get_line(jlm_chat_in *in, int more)
{
    if (!in->el)
        return read_plain(in);
    for (;;) {
        g_prompt = more ? "... " : "> ";
        g_ctrl_c = -1;
        char saved[128];
        int n = 0;
        with_user_ctype(1, saved, sizeof saved);
        const char *l = el_gets(in->el, &n);
        int e = errno;
        with_user_ctype(0, saved, sizeof saved);
        if (l && n > 0) {
            if (keep_line(in, l, (size_t)n))
                return L_NOMEM;
            in->n_lines++;
            return L_LINE;
        }
        fputc('\n', in->draw);   /* ^C / ^D leave the cursor on the prompt's line */
        fflush(in->draw);
        if (g_ctrl_c >= 0)
            return g_ctrl_c ? L_INTR_TEXT : L_INTR_EMPTY;
        if (n < 0 && *in->intr)
            return L_INTR_EMPTY;
        if (n < 0 && e == EINTR)
            continue;   /* another signal (the editor redraws) */
        return L_EOF;
    }
}

typedef struct sbuf { char *p; size_t n, cap; int over; } sbuf;

/* Appends; past JLM_CHAT_IN_MAX the message is dropped (over) and the rest
 * of it only read. -1: out of memory. */
static int put(sbuf *b, const char *s, size_t n)
{
    if (b->over || b->n + n > JLM_CHAT_IN_MAX) {
        free(b->p);
        *b = (sbuf){.over = 1};
        return 0;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int ends_with_quotes(const char *s, size_t n)
{
    return n >= 3 && !memcmp(s + n - 3, "\"\"\"", 3);
}

/* The finished message: a block's final newlines are dropped. */
static int finish(sbuf *b, int block, char **msg)
{
    if (b->over)
        return JLM_CHAT_IN_TOOLONG;
    if (!b->p && put(b, "", 0))
        return JLM_CHAT_IN_NOMEM;
    while (block && b->n && b->p[b->n - 1] == '\n')
        b->p[--b->n] = 0;
    *msg = b->p;
    return JLM_CHAT_IN_MSG;
}

static int read_msg(jlm_chat_in *in, char **msg);

/* One history entry per message, not per physical line: a one-line message
 * as typed; a block or continued lines as one """...""" block holding
 * the message (its newlines inside; libedit's history file encodes them),
 * which gives the same message when recalled and sent. Dropped text (^C, a
 * message too long) is not kept. */
static void remember(jlm_chat_in *in, const char *msg)
{
    HistEvent ev;
    if (in->n_lines == 1 && *in->line) {
        history(in->hist, &ev, H_ENTER, in->line);
        return;
    }
    char *e = NULL;
    if (*msg && asprintf(&e, "\"\"\"%s\"\"\"", msg) >= 0)
        history(in->hist, &ev, H_ENTER, e);
    free(e);
}

int jlm_chat_in_read(jlm_chat_in *in, char **msg)
{
    in->n_lines = 0;
    int rc = read_msg(in, msg);
    if (rc == JLM_CHAT_IN_MSG && in->el && in->n_lines)
        remember(in, *msg);
    return rc;
}

static int read_msg(jlm_chat_in *in, char **msg)
{
    *msg = NULL;
    if (in->eof)
        return JLM_CHAT_IN_EOF;
    sbuf b = {0};
    int block = 0, cont = 0;
    for (;;) {
        int r = get_line(in, block || cont);
        if (r == L_NOMEM) {
            free(b.p);
            return JLM_CHAT_IN_NOMEM;
        }
        if (r == L_INTR_TEXT || (r == L_INTR_EMPTY && (block || cont))) {
            free(b.p);   /* ^C drops what was typed */
            b = (sbuf){0};
            block = cont = 0;
            in->n_lines = 0;
            continue;
        }
        if (r == L_TOOLONG) {
            b.over = 1;   /* the line still ends the message or goes on in it */
            free(b.p);
            b.p = NULL;
            if (!in->line && keep_line(in, "", 0))
                return JLM_CHAT_IN_NOMEM;
            in->line[0] = 0;
        } else if (r == L_INTR_EMPTY) {
            free(b.p);
            return JLM_CHAT_IN_INTR;
        }
        if (r == L_EOF) {
            in->eof = 1;
            if (block || cont)
                return finish(&b, block, msg);   /* the end of input closes the block */
            free(b.p);
            return JLM_CHAT_IN_EOF;
        }
        const char *l = in->line;
        size_t n = strlen(l);
        int rc = 0;
        if (block) {
            if (ends_with_quotes(l, n))
                return put(&b, l, n - 3) ? (free(b.p), JLM_CHAT_IN_NOMEM) : finish(&b, 1, msg);
            rc = put(&b, l, n) || put(&b, "\n", 1);
        } else if (!cont && !strncmp(l, "\"\"\"", 3)) {
            if (ends_with_quotes(l + 3, n - 3))   /* """one line""" */
                return put(&b, l + 3, n - 6) ? (free(b.p), JLM_CHAT_IN_NOMEM) : finish(&b, 1, msg);
            block = 1;
            rc = n > 3 && (put(&b, l + 3, n - 3) || put(&b, "\n", 1));
        } else if (n && l[n - 1] == '\\') {
            cont = 1;
            rc = put(&b, l, n - 1) || put(&b, "\n", 1);
        } else {
            return put(&b, l, n) ? (free(b.p), JLM_CHAT_IN_NOMEM) : finish(&b, 0, msg);
        }
        if (rc) {
            free(b.p);
            return JLM_CHAT_IN_NOMEM;
        }
    }
}

static void save_history(jlm_chat_in *in)
{
    if (!in->hpath || mkdir_parents(in->hpath))
        return;
    /* created private (a chat may be personal); H_SAVE keeps the mode */
    int fd = open(in->hpath, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    close(fd);
    HistEvent ev;
    history(in->hist, &ev, H_SAVE, in->hpath);
}

void jlm_chat_in_close(jlm_chat_in *in)
{
    if (!in)
        return;
    if (in->el && in->hist)
        save_history(in);
    if (in->el)
        el_end(in->el);
    if (in->hist)
        history_end(in->hist);
    free(in->hpath);
    free(in->line);
    free(in);
}
