/* log.c - the daemon's log (fs/fuse_int.h). */
#include "fs/fuse_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>

/* Mounts, views planned, ready, failed and dropped, database notes
 * (jlmfs_opts.log): on stderr in the foreground (-f, -d), else to syslog
 * (the journal), facility daemon. Control bytes of names become '?'. */
static int g_foreground;

void jlmfs_dlog_foreground(int on) { g_foreground = on; }

void jlmfs_dlog_line(void *ctx, int prio, const char *line)
{
    char clean[2048];
    size_t i = 0;
    for (; line[i] && i < sizeof clean - 1; i++)
        clean[i] = (unsigned char)line[i] < 0x20 || line[i] == 0x7f ? '?' : line[i];
    clean[i] = 0;
    if (g_foreground)
        fprintf(stderr, "jlmfs: %s\n", clean);
    else
        syslog(prio, "%s", clean);
}

void jlmfs_dlogf(int prio, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    jlmfs_dlog_line(NULL, prio, line);
}
