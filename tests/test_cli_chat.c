/* test_cli_chat.c - `jlm chat` as a person uses it (issue 15): multi-line
 * input, /commands, -sys, a full context, and, driven through tmux on a real
 * terminal, line editing, history, Ctrl-C and Ctrl-D.
 *
 * stories260K has no chat template: chat renders chatml, so a reply can be
 * checked against `jlm run` on the rendered prompt (greedy). */
#include <criterion/criterion.h>

#include <signal.h>
#include <stdarg.h>
#include <time.h>

#include "tests/testutil.h"

static char *convert(const char *dir)
{
    jlm_err err = {0};
    char *m = tu_convert("stories260K.gguf", dir, "s.jlm", &err);
    cr_assert_not_null(m, "%s", err.msg);
    return m;
}

/* `jlm run` on the chatml text of printf-format fmt (the prompt ends with
 * "<|im_start|>assistant\n"); stdout. */
static char *run_rendered(const char *m, const char *fmt)
{
    char cmd[4096], *o = NULL;
    /* (the x keeps the prompt's final newline through command substitution) */
    snprintf(cmd, sizeof cmd, "(p=$(printf '%s<|im_start|>assistant\\nx'); %s run %s -p \"${p%%x}\" -n 12 --temp 0 "
             "2>/dev/null)", fmt, tu_jlm(), m);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strlen(o) > 0, "run generated text");
    return o;
}

static char *chat_out(const char *m, const char *input, const char *opts, int want_rc, int with_stderr)
{
    char cmd[4096], *o = NULL;
    snprintf(cmd, sizeof cmd, "(printf '%s' | %s chat %s -n 12 --temp 0 -t 1 %s %s)", input, tu_jlm(), m, opts,
             with_stderr ? "" : "2>/dev/null");
    int rc = tu_run(cmd, &o);
    cr_assert_eq(rc, want_rc, "rc %d: %s", rc, o);
    return o;
}

static void starts_with(const char *got, const char *want, const char *what)
{
    cr_assert(!strncmp(got, want, strlen(want)), "%s: chat '%s' starts with run's '%s'", what, got, want);
}

Test(cli_chat_input, a_triple_quote_block_is_one_message_with_its_newlines, .timeout = 60)
{
    char *dir = tu_tmpdir(), *m = convert(dir);
    char *run = run_rendered(m, "<|im_start|>user\\nline one\\nline two<|im_end|>\\n");
    char *a = chat_out(m, "\"\"\"\\nline one\\nline two\\n\"\"\"\\n", "", 0, 0);
    starts_with(a, run, "block on its own lines");
    char *b = chat_out(m, "\"\"\"line one\\nline two\"\"\"\\n", "", 0, 0);
    starts_with(b, run, "block with text on the quote lines");
    char *c = chat_out(m, "line one\\\\\\nline two\\n", "", 0, 0);
    starts_with(c, run, "trailing backslash");
    /* the end of input closes an open block: still answered */
    char *d = chat_out(m, "\"\"\"\\nline one\\nline two\\n", "", 0, 0);
    starts_with(d, run, "block closed by the end of input");
    free(a); free(b); free(c); free(d); free(run); free(m);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_chat_input, system_prompt_from_the_option_and_the_command, .timeout = 60)
{
    char *dir = tu_tmpdir(), *m = convert(dir);
    char *run = run_rendered(m, "<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nHello there<|im_end|>\\n");
    char *a = chat_out(m, "Hello there\\n", "-sys 'Be brief.'", 0, 0);
    starts_with(a, run, "-sys");
    char *b = chat_out(m, "Hello there\\n", "--system 'Be brief.'", 0, 0);
    starts_with(b, run, "--system");
    char *c = chat_out(m, "/system Be brief.\\nHello there\\n", "", 0, 1);
    cr_assert(strstr(c, "jlm chat: system prompt set\n"), "%s", c);
    cr_assert(strstr(c, run), "/system: the reply '%s' is in '%s'", run, c);
    free(a); free(b); free(c); free(run); free(m);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_chat_input, clear_forgets_the_conversation_and_bye_leaves, .timeout = 60)
{
    char *dir = tu_tmpdir(), *m = convert(dir);
    char *one = chat_out(m, "Hello there\\n", "", 0, 0);
    /* after /clear the same message gets the first reply again: the cache was rewound */
    char *c = chat_out(m, "Hello there\\nTell me more\\n/clear\\nHello there\\n", "", 0, 0);
    size_t lo = strlen(one), lc = strlen(c);
    cr_assert(lc > 2 * lo, "three replies: '%s'", c);
    cr_assert(!strncmp(c, one, lo), "first reply '%s' in '%s'", one, c);
    cr_assert_str_eq(c + lc - lo, one, "the reply after /clear equals the first");
    /* /bye: exit 0, the lines after it are not read */
    char *b = chat_out(m, "Hello there\\n/bye\\nHello there\\n", "", 0, 0);
    cr_assert_str_eq(b, one, "nothing after /bye");
    /* an unknown command: one line, the chat goes on; /help lists the commands */
    char *u = chat_out(m, "/nope x\\n/help\\nHello there\\n", "", 0, 1);
    cr_assert(strstr(u, "jlm chat: unknown command '/nope' (/help lists them)\n"), "%s", u);
    cr_assert(strstr(u, "/bye") && strstr(u, "/clear") && strstr(u, "/system TEXT"), "/help: %s", u);
    cr_assert(strstr(u, one), "answered after the unknown command: %s", u);
    /* the banner: one line naming the model, the template and the context */
    cr_assert(strstr(u, "| template: chatml (the model has none) | context: "), "banner: %s", u);
    free(one); free(c); free(b); free(u); free(m);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_chat_input, a_full_context_drops_the_oldest_turns_and_goes_on, .timeout = 60)
{
    char *dir = tu_tmpdir(), *m = convert(dir);
    /* -c 256: each turn is ~60 positions (chatml is spelt out in bytes in this vocab) plus a reply of up to 12 */
    char *o = chat_out(m, "Once upon a time there was a cat\\nWhat did the cat do\\nAnd then what\\nTell me more\\n"
                          "Where did it go\\nThe end\\n", "-sys 'You tell stories.' -c 256", 0, 1);
    cr_assert(strstr(o, "jlm chat: context full (256 positions): dropped the oldest "), "%s", o);
    cr_assert(!strstr(o, "exceed"), "no engine error: %s", o);
    /* a message that cannot fit even alone: one line, not sent, the chat goes on */
    char big[1400] = "";
    for (int i = 0; i < 100; i++) strcat(big, "word ");
    char in[1600];
    snprintf(in, sizeof in, "%s\\nHello there\\n", big);
    char *b = chat_out(m, in, "-c 128", 0, 1);
    cr_assert(strstr(b, "jlm chat: message too long: "), "%s", b);
    char *one = chat_out(m, "Hello there\\n", "-c 128", 0, 0);
    cr_assert(strstr(b, one), "the next message is answered as in a fresh chat: %s", b);
    /* a line of 5 MB through a pipe: read in bounded memory, one line, the chat goes on */
    char cmd[2048], *h = NULL;
    snprintf(cmd, sizeof cmd, "( (head -c 5000000 /dev/zero | tr '\\0' a; printf '\\nHello there\\n') | "
             "%s chat %s -n 12 --temp 0 -t 1 -c 128)", tu_jlm(), m);
    cr_assert_eq(tu_run(cmd, &h), 0, "%.300s", h);
    cr_assert(strstr(h, "jlm chat: message longer than 4 MiB; not sent\n"), "%.300s", h);
    cr_assert(strstr(h, one), "answered after it: %.300s", h);
    free(h);
    free(o); free(b); free(one); free(m);
    tu_rmrf(dir);
    free(dir);
}

/* ------------------------------------------------------------------ tmux */

typedef struct tmx { char sock[1200]; } tmx;   /* the server's socket, in the test's temp dir */
static tmx T;   /* the test's tmux server, killed in cleanup even after a failed assert */

static int tmux(const tmx *t, const char *fmt, ...)
{
    char args[3000], cmd[4400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "tmux -S %s -f /dev/null %s >/dev/null 2>&1", t->sock, args);
    return system(cmd);
}

static char *pane(const tmx *t)
{
    char cmd[1400], *o = NULL;
    snprintf(cmd, sizeof cmd, "tmux -S %s capture-pane -p -J -S -3000 -t jlm", t->sock);
    tu_run(cmd, &o);
    return o ? o : strdup("");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Polls the pane until pred holds (20 s at most); the pane text. */
static char *wait_pane(const tmx *t, int (*pred)(const char *p, const void *a), const void *a, const char *what)
{
    double t0 = now_s();
    for (;;) {
        char *p = pane(t);
        if (pred(p, a))
            return p;
        if (now_s() - t0 > 20)
            cr_assert_fail("timed out waiting for %s; the pane:\n%s", what, p);
        free(p);
        usleep(30000);
    }
}

static int has(const char *p, const void *a) { return strstr(p, a) != NULL; }

/* The last non-empty line is exactly a (the prompt with what was typed). */
static int last_line_is(const char *p, const void *a)
{
    const char *end = p + strlen(p);
    while (end > p && (end[-1] == '\n' || end[-1] == ' ')) end--;
    const char *s = end;
    while (s > p && s[-1] != '\n') s--;
    return (size_t)(end - s) == strlen(a) && !strncmp(s, a, strlen(a));
}

/* n or more occurrences of a line starting with the text after the count. */
typedef struct count_arg { const char *s; int n; } count_arg;
static int occurs(const char *p, const void *a)
{
    const count_arg *c = a;
    int k = 0;
    for (const char *q = p; (q = strstr(q, c->s)); q++) k++;
    return k >= c->n;
}

/* A reply has started after the last "> MSG" line: text after it. */
static int reply_after(const char *p, const void *a)
{
    const char *q = NULL, *r = p;
    while ((r = strstr(r, a))) q = r++;
    if (!q || !(q = strchr(q, '\n')))
        return 0;
    size_t n = 0;
    for (q++; *q && *q != '\n'; q++) n += *q != ' ';
    return n >= 8;
}

static void tty_fini(void)
{
    if (T.sock[0]) {
        char cmd[1300];
        snprintf(cmd, sizeof cmd, "tmux -S %s kill-server >/dev/null 2>&1", T.sock);
        if (system(cmd)) {}
    }
}

/* Each chat gets a server of its own (a new one on a killed server's socket
 * can race with its shutdown). */
static void start(tmx *t, const char *dir, const char *env, const char *m, const char *opts)
{
    static int k;
    snprintf(t->sock, sizeof t->sock, "%s/tmux%d", dir, k++);
    T = *t;
    tmux(t, "new-session -d -s jlm -x 200 -y 50 \"env %s %s chat %s %s; echo '[exit '\\$?']'; sleep 60\"", env, tu_jlm(),
         m, opts);
    char *p = wait_pane(t, last_line_is, ">", "the first prompt");
    cr_assert(strstr(p, "jlm chat: "), "the banner: %s", p);
    free(p);
}

/* The first line of s, without trailing spaces (the pane trims them). */
static char *first_line(const char *s)
{
    size_t n = strcspn(s, "\n");
    while (n && s[n - 1] == ' ') n--;
    return strndup(s, n);
}

Test(cli_chat_tty, editing_history_ctrl_c_and_ctrl_d_on_a_terminal, .fini = tty_fini, .timeout = 120)
{
    if (system("command -v tmux >/dev/null 2>&1"))
        cr_skip_test("tmux is not installed (scripts/deps.sh installs it)");
    char *dir = tu_tmpdir(), *m = convert(dir);
    tmx t;
    char env[1200];
    snprintf(env, sizeof env, "XDG_STATE_HOME=%s/state XDG_CACHE_HOME=%s/cache HOME=%s LANG=C.UTF-8", dir, dir, dir);

    /* what the same conversation answers through a pipe (greedy: the same) */
    char *want = chat_out(m, "hello\\nhello\\n", "", 0, 0), *one = chat_out(m, "hello\\n", "", 0, 0);
    cr_assert(!strncmp(want, one, strlen(one)), "%s / %s", want, one);
    char *r1 = first_line(want);
    cr_assert(strlen(r1) >= 8, "a reply to check: '%s'", want);

    /* 1. "helo", Left, "l", Enter: the edited line "hello" is sent */
    start(&t, dir, env, m, "-n 12 --temp 0 -t 1");
    tmux(&t, "send-keys -t jlm -l helo");
    tmux(&t, "send-keys -t jlm Left");
    tmux(&t, "send-keys -t jlm -l l");
    free(wait_pane(&t, last_line_is, "> hello", "the edited line"));
    tmux(&t, "send-keys -t jlm Enter");
    free(wait_pane(&t, has, r1, "the reply to the edited line"));
    /* 2. Up recalls it */
    free(wait_pane(&t, last_line_is, ">", "the prompt after the reply"));
    tmux(&t, "send-keys -t jlm Up");
    free(wait_pane(&t, last_line_is, "> hello", "Up recalling the line"));
    tmux(&t, "send-keys -t jlm Enter");
    count_arg two = {"> hello\n", 2};
    free(wait_pane(&t, occurs, &two, "the recalled line sent"));
    free(wait_pane(&t, last_line_is, ">", "the prompt after the second reply"));
    /* a block of three physical lines is one history entry (below) */
    tmux(&t, "send-keys -t jlm -l '\"\"\"first'");
    tmux(&t, "send-keys -t jlm Enter");
    free(wait_pane(&t, last_line_is, "...", "the block's prompt"));
    tmux(&t, "send-keys -t jlm -l 'second\"\"\"'");
    tmux(&t, "send-keys -t jlm Enter");
    free(wait_pane(&t, last_line_is, ">", "the prompt after the block's reply"));
    /* 3. /bye exits 0 */
    tmux(&t, "send-keys -t jlm -l /bye");
    tmux(&t, "send-keys -t jlm Enter");
    char *p = wait_pane(&t, has, "[exit 0]", "/bye to exit 0");
    char *r2 = first_line(want + strlen(one));
    cr_assert(strstr(p, r2), "the second reply '%s' as through a pipe: %s", r2, p);
    free(p); free(r2);
    tmux(&t, "kill-server");

    /* 4. the history survives: a new chat recalls "hello" with Up; Ctrl-D at
     * an empty prompt exits 0 with a newline (the exit line starts a line) */
    char hist[1200];
    snprintf(hist, sizeof hist, "%s/state/jlm/history", dir);
    size_t hl = 0;
    unsigned char *h = tu_read_file(hist, &hl);
    cr_assert(h && memmem(h, hl, "hello", 5), "history file %s holds the line", hist);
    free(h);
    struct stat st;
    cr_assert(stat(hist, &st) == 0 && (st.st_mode & 0777) == 0600, "history is private");
    start(&t, dir, env, m, "-n 12 --temp 0 -t 1");
    tmux(&t, "send-keys -t jlm Up");
    free(wait_pane(&t, last_line_is, "> /bye", "Up recalling the last saved line"));
    tmux(&t, "send-keys -t jlm Up");
    p = wait_pane(&t, last_line_is, "second\"\"\"", "Up recalling the block as one entry");
    cr_assert(strstr(p, "> \"\"\"first\nsecond\"\"\""), "the block's two lines, recalled at once: %s", p);
    free(p);
    tmux(&t, "send-keys -t jlm Up");
    free(wait_pane(&t, last_line_is, "> hello", "Up recalling the one before"));
    tmux(&t, "send-keys -t jlm C-u");   /* emacs: the line is cut */
    free(wait_pane(&t, last_line_is, ">", "the emptied line"));
    tmux(&t, "send-keys -t jlm C-d");
    p = wait_pane(&t, has, "[exit", "Ctrl-D to exit");
    cr_assert(strstr(p, "\n[exit 0]"), "exit 0 on a line of its own: %s", p);
    free(p);
    tmux(&t, "kill-server");

    /* 5. Ctrl-C mid-reply returns to the prompt and the next message is
     * answered; Ctrl-C at the empty prompt leaves (130). --ignore-eos and a
     * 4096-position context make each reply long enough to interrupt. */
    start(&t, dir, env, m, "--ignore-eos -n -1 -c 4096 --temp 0 -t 1");
    tmux(&t, "send-keys -t jlm -l Hello");
    tmux(&t, "send-keys -t jlm Enter");
    free(wait_pane(&t, reply_after, "> Hello", "the reply to start"));
    tmux(&t, "send-keys -t jlm C-c");
    p = wait_pane(&t, last_line_is, ">", "the prompt after Ctrl-C");
    cr_assert(!strstr(p, "[exit") && !strstr(p, "context full"), "the reply was stopped, the chat goes on: %s", p);
    free(p);
    tmux(&t, "send-keys -t jlm -l 'Tell me more'");
    tmux(&t, "send-keys -t jlm Enter");
    free(wait_pane(&t, reply_after, "> Tell me more", "the next message answered"));
    tmux(&t, "send-keys -t jlm C-c");
    free(wait_pane(&t, last_line_is, ">", "the prompt after the second Ctrl-C"));
    tmux(&t, "send-keys -t jlm C-c");
    p = wait_pane(&t, has, "[exit", "Ctrl-C at the prompt to exit");
    cr_assert(strstr(p, "[exit 130]"), "%s", p);
    free(p);
    tmux(&t, "kill-server");

    free(want); free(one); free(r1); free(m);
    tu_rmrf(dir);
    free(dir);
}

/* ------------------------------------------------------ SIGINT, plain reads */

static size_t file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) ? 0 : (size_t)st.st_size;
}

static void wait_size(const char *p, size_t more_than, const char *what)
{
    double t0 = now_s();
    while (file_size(p) <= more_than) {
        cr_assert(now_s() - t0 < 20, "timed out waiting for %s", what);
        usleep(20000);
    }
}

/* Through a pipe too (stdin a FIFO here): SIGINT stops the reply only, the
 * next message is answered, the end of input exits 0. */
Test(cli_chat_input, sigint_stops_only_the_reply_through_a_pipe, .timeout = 60)
{
    char *dir = tu_tmpdir(), *m = convert(dir);
    char fifo[1200], out[1200], err[1200], cmd[4096];
    snprintf(fifo, sizeof fifo, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(err, sizeof err, "%s/err", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    snprintf(cmd, sizeof cmd, "exec %s chat %s --ignore-eos -n -1 -c 4096 --temp 0 -t 1 < %s > %s 2> %s", tu_jlm(), m,
             fifo, out, err);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    cr_assert(pid > 0);
    FILE *w = fopen(fifo, "w");
    cr_assert_not_null(w);
    fputs("Hello\n", w);
    fflush(w);
    wait_size(out, 40, "the first reply to start");
    kill(pid, SIGINT);
    /* stopped: the reply's line ends, and the output stops growing */
    double t0 = now_s();
    size_t a;
    for (;;) {
        a = file_size(out);
        usleep(300000);
        if (file_size(out) == a)
            break;
        cr_assert(now_s() - t0 < 20, "the reply went on after SIGINT");
    }
    fputs("Tell me more\n", w);
    fflush(w);
    wait_size(out, a + 40, "the next message to be answered");
    kill(pid, SIGINT);
    fclose(w);   /* the end of input: exit 0 */
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    size_t el = 0;
    char *e = (char *)tu_read_file(err, &el);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit 0: %s", e);
    cr_assert(e && !strstr(e, "context full") && !strstr(e, "error"), "%s", e);
    size_t ol = 0;
    char *o = (char *)tu_read_file(out, &ol);
    cr_assert(o && ol > a + 40 && o[ol - 1] == '\n', "two replies, each ending its line");
    free(o); free(e); free(m);
    tu_rmrf(dir);
    free(dir);
}

/* A reply cut by -n (as one stopped by Ctrl-C) stays in the conversation as
 * its text: each next reply is `jlm run`'s on the whole chatml render. */
Test(cli_chat_input, a_cut_reply_stays_in_the_conversation_as_text, .timeout = 60)
{
    char *dir = tu_tmpdir(), *m = convert(dir);
    static const char *const U[] = {"Hello there", "Tell me more", "And then"};
    char *o = chat_out(m, "Hello there\\nTell me more\\nAnd then\\n", "-n 8", 0, 0);
    char *r[3], *p = o;
    for (int i = 0; i < 3; i++) {
        char *nl = strchr(p, '\n');
        cr_assert(nl, "three replies of one line: '%s'", o);
        *nl = 0;
        r[i] = p;
        p = nl + 1;
    }
    char path[1200], cmd[4096];
    snprintf(path, sizeof path, "%s/prompt", dir);
    for (int t = 1; t < 3; t++) {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        for (int i = 0; i < t; i++)
            fprintf(f, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n%s<|im_end|>\n", U[i], r[i]);
        fprintf(f, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", U[t]);
        fclose(f);
        char *run = NULL;
        snprintf(cmd, sizeof cmd, "%s run %s -f %s -n 8 --temp 0 2>/dev/null", tu_jlm(), m, path);
        cr_assert_eq(tu_run(cmd, &run), 0, "%s", run);
        run[strcspn(run, "\n")] = 0;
        cr_assert(strlen(run) > 0);
        cr_assert_str_eq(r[t], run, "reply %d follows the earlier ones as text", t + 1);
        free(run);
    }
    free(o); free(m);
    tu_rmrf(dir);
    free(dir);
}
