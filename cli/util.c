/* util.c - small helpers shared by the subcommands. */
#include "cli/cli.h"
#include "engine/model.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>
#include <sys/random.h>

uint64_t jlm_cli_random_seed(void)
{
    uint32_t s;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s)
        s = (uint32_t)((uint64_t)time(NULL) ^ ((uint64_t)clock() << 12) ^ (uint64_t)getpid() << 20);
    return s;
}

const char *jlm_cli_iec(char buf[32], unsigned long long bytes)
{
    static const char *U[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    snprintf(buf, 32, v == (double)(unsigned long long)v ? "%.0f %s" : "%.1f %s", v, U[u]);
    return buf;
}

void jlm_cli_ctx_warn(const char *who, struct jlm_engine *e, uint32_t n_ctx)
{
    uint32_t trained = jlm_engine_model(e)->config.n_ctx;
    if (n_ctx && trained && n_ctx > trained)
        jlm_cli_errorf(who, "warning: -c %u is above the model's trained context (%u positions): what comes past it "
                       "may be poor", n_ctx, trained);
}

long long jlm_cli_parse_size(const char *s)
{
    char *end;
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mul = 1ull << 10; end++; break;
    case 'M': mul = 1ull << 20; end++; break;
    case 'G': mul = 1ull << 30; end++; break;
    case 'T': mul = 1ull << 40; end++; break;
    default: return -1;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end || (v && mul > (unsigned long long)9e18 / v))
        return -1;
    return (long long)(v * mul);
}

int jlm_cli_is_gguf(const char *path)
{
    /* O_NONBLOCK and regular files only: a FIFO is never waited on here */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    char m[4] = {0};
    ssize_t n = fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode) ? pread(fd, m, 4, 0) : -1;
    if (fd >= 0)
        close(fd);
    return n == 4 && !memcmp(m, "GGUF", 4);
}

void jlm_cli_error(const char *who, const char *msg)
{
    fprintf(stderr, "%s: ", who);
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
        fputc(*p < 0x20 || *p == 0x7f ? '?' : *p, stderr);
    fputc('\n', stderr);
}

void jlm_cli_errorf(const char *who, const char *fmt, ...)
{
    char line[4400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    jlm_cli_error(who, line);
}

const char *jlm_cli_clean(const char *s)
{
    static char buf[8][4096];
    static unsigned k;
    char *b = buf[k++ % 8];
    size_t i = 0;
    for (; s && s[i] && i < sizeof buf[0] - 1; i++)
        b[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    b[i] = 0;
    return b;
}

void jlm_cli_puts_lines(const char *text, void *file)
{
    FILE *f = file;
    for (const unsigned char *p = (const unsigned char *)text; p && *p; p++)
        fputc((*p < 0x20 && *p != '\n') || *p == 0x7f ? '?' : *p, f);
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int jlm_cli_bar_mode(int asked)
{
    const char *e = getenv("JLM_PROGRESS");
    return isatty(2) ? JLM_CLI_BAR_TTY : asked || (e && !strcmp(e, "1")) ? JLM_CLI_BAR_LOG : JLM_CLI_BAR_OFF;
}

void jlm_cli_bar_init(jlm_cli_bar *b, const char *who, int tty)
{
    *b = (jlm_cli_bar){.who = who, .tty = tty, .t0 = mono_s(), .t_line = mono_s(), .last_pct = -1};
}

/* "212.0 MiB of 573.0 MiB, 45.3 MiB/s, ETA 0:08" */
static void bar_figures(char *buf, size_t n, uint64_t done, uint64_t total, double dt)
{
    double rate = dt > 0 ? (double)done / dt : 0;
    char eta[32] = "--:--";
    if (rate > 0 && done > 0 && dt >= 0.2) {
        long long s = (long long)((double)(total - done) / rate + 0.5);
        if (s >= 3600)
            snprintf(eta, sizeof eta, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
        else
            snprintf(eta, sizeof eta, "%lld:%02lld", s / 60, s % 60);
    }
    snprintf(buf, n, "%.1f MiB of %.1f MiB, %.1f MiB/s, ETA %s", done / 1048576.0, total / 1048576.0,
             rate / 1048576.0, eta);
}

void jlm_cli_progress(void *ctx, uint64_t done, uint64_t total)
{
    jlm_cli_bar *b = ctx;
    if (!total || done > total || b->tty == JLM_CLI_BAR_OFF)
        return;
    double t = mono_s();
    int pct = (int)(done * 100 / total);
    char fig[160];
    if (b->tty == JLM_CLI_BAR_TTY) {   /* one line redrawn in place: on each new percent, or 4 times a second */
        if (pct == b->last_pct && t - b->t_line < 0.25)
            return;
        bar_figures(fig, sizeof fig, done, total, t - b->t0);
        int w = pct / 4;
        fprintf(stderr, "\r[%.*s%*s] %3d%%  %-60s", w, "#########################", 25 - w, "", pct, fig);
        fflush(stderr);
        b->shown = 1;
    } else {   /* a log: a line at 25, 50 and 75%, and every 30 s between */
        int quarter = pct / 25, last_quarter = b->last_pct < 0 ? 0 : b->last_pct / 25;
        if (done == total || (quarter == last_quarter && t - b->t_line < 30)) {
            if (b->last_pct < 0)
                b->last_pct = pct;   /* the start counts as quarter 0 */
            return;
        }
        bar_figures(fig, sizeof fig, done, total, t - b->t0);
        fprintf(stderr, "%s: %d%% (%s)\n", b->who, pct, fig);
    }
    b->last_pct = pct;
    b->t_line = t;
}

void jlm_cli_bar_end(jlm_cli_bar *b)
{
    if (b->tty == JLM_CLI_BAR_TTY && b->shown)
        fputc('\n', stderr);
    b->shown = 0;
}
