/* util.c - small helpers shared by the subcommands. */
#include "cli/cli.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <fcntl.h>

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
