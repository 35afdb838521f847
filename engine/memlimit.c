/* memlimit.c - the memory cgroup's limit and MemAvailable (memlimit.h). */
#include "engine/memlimit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* v1's "no limit" is PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB
 * pages); anything this large limits nothing a process can allocate. */
#define NO_LIMIT_FLOOR (1ull << 60)

/* ================================================================ parsing */
int jlm_memlimit_parse_value(const char *text, size_t len, uint64_t *bytes)
{
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' '))
        len--;
    if (len == 3 && !memcmp(text, "max", 3)) {
        *bytes = UINT64_MAX;
        return 0;
    }
    if (len == 0 || len > 20)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(text[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *bytes = v >= NO_LIMIT_FLOOR ? UINT64_MAX : v;
    return 0;
}

/* dst = [s, s + n) when it fits with its NUL, else "". */
static void put_path(char *dst, size_t cap, const char *s, size_t n)
{
    if (!cap)
        return;
    if (n >= cap)
        n = 0;
    memcpy(dst, s, n);
    dst[n] = 0;
}

/* 1 when the comma-separated list [s, s + n) has the item "memory". */
static int has_memory(const char *s, size_t n)
{
    while (n) {
        const char *c = memchr(s, ',', n);
        size_t k = c ? (size_t)(c - s) : n;
        if (k == 6 && !memcmp(s, "memory", 6))
            return 1;
        if (!c)
            break;
        n -= k + 1;
        s = c + 1;
    }
    return 0;
}

void jlm_memlimit_parse_cgroup(const char *text, size_t len, char *v2, size_t v2_len, char *v1, size_t v1_len)
{
    put_path(v2, v2_len, "", 0);
    put_path(v1, v1_len, "", 0);
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *c1 = memchr(p, ':', (size_t)(le - p));
        const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(le - c1 - 1)) : NULL;
        if (c2 && le > c2 + 1 && c2[1] == '/') {   /* a path is absolute */
            if (c1 - p == 1 && p[0] == '0' && c2 == c1 + 1)
                put_path(v2, v2_len, c2 + 1, (size_t)(le - c2 - 1));
            else if (has_memory(c1 + 1, (size_t)(c2 - c1 - 1)))
                put_path(v1, v1_len, c2 + 1, (size_t)(le - c2 - 1));
        }
        p = le + 1;
    }
}

uint64_t jlm_memlimit_parse_meminfo(const char *text, size_t len)
{
    static const char key[] = "MemAvailable:";
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if ((size_t)(le - p) > sizeof key - 1 && !memcmp(p, key, sizeof key - 1)) {
            const char *q = p + sizeof key - 1;
            while (q < le && *q == ' ')
                q++;
            uint64_t kb = 0;
            int digits = 0;
            for (; q < le && *q >= '0' && *q <= '9' && digits < 16; q++, digits++)
                kb = kb * 10 + (uint64_t)(*q - '0');
            while (q < le && *q == ' ')
                q++;
            if (!digits || le - q != 2 || memcmp(q, "kB", 2))
                return 0;
            return kb * 1024;
        }
        p = le + 1;
    }
    return 0;
}

/* ================================================================ reading */
/* The first cap - 1 bytes of path, NUL-terminated: the length, or -1 when
 * the file cannot be opened (absent, not permitted: nothing known). */
static long slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    return (long)n;
}

/* The smallest limit in FILE along mount/path, mount/dirname(path), ...,
 * mount (rule 1). 0 and nothing found; -1 with err naming a bad file. */
static int walk_limits(const char *root, const char *mount, const char *path, const char *file, int version,
                       jlm_memlimit *m, jlm_err *err)
{
    char dir[512], fp[800], buf[64];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return 0;
    for (;;) {
        size_t n = strlen(dir);
        while (n && dir[n - 1] == '/')
            dir[--n] = 0;
        snprintf(fp, sizeof fp, "%s/%s%s/%s", root, mount, dir, file);
        long len = slurp(fp, buf, sizeof buf);
        uint64_t v;
        if (len >= 0 && jlm_memlimit_parse_value(buf, (size_t)len, &v)) {
            for (long i = 0; i < len; i++)   /* the message stays one printable line */
                if (buf[i] < 0x20 || buf[i] > 0x7e)
                    buf[i] = buf[i] == '\n' && i == len - 1 ? 0 : '?';
            return jlm_errf(err, JLM_EFORMAT, "%s: expected a byte count or 'max', read '%.32s'", fp, buf);
        }
        if (len >= 0 && v != UINT64_MAX && (!m->cg_limit || v < m->cg_limit)) {
            m->cg_limit = v;
            m->cg_version = version;
            snprintf(m->cg_file, sizeof m->cg_file, "%.250s", fp);
        }
        if (!n)
            return 0;
        char *slash = strrchr(dir, '/');
        if (!slash)
            return 0;
        *slash = 0;
    }
}

int jlm_memlimit_read(const char *root, jlm_memlimit *out, jlm_err *err)
{
    jlm_memlimit m = {0};
    char buf[8192], v2[256], v1[256], fp[600];
    if (!root || !*root)
        root = "/";
    if (!strcmp(root, "/"))
        root = "";   /* "/proc/...", not "//proc/..." */
    snprintf(fp, sizeof fp, "%s/proc/self/cgroup", root);
    long len = slurp(fp, buf, sizeof buf);
    jlm_memlimit_parse_cgroup(buf, len > 0 ? (size_t)len : 0, v2, sizeof v2, v1, sizeof v1);
    int rc = 0;
    if (len >= 0 && v2[0])
        rc = walk_limits(root, "sys/fs/cgroup", v2, "memory.max", 2, &m, err);
    if (!rc && len >= 0 && v2[0])
        rc = walk_limits(root, "sys/fs/cgroup/unified", v2, "memory.max", 2, &m, err);
    if (!rc && len >= 0 && v1[0])
        rc = walk_limits(root, "sys/fs/cgroup/memory", v1, "memory.limit_in_bytes", 1, &m, err);
    if (rc)
        return rc;
    snprintf(fp, sizeof fp, "%s/proc/meminfo", root);
    len = slurp(fp, buf, sizeof buf);
    if (len > 0)
        m.mem_available = jlm_memlimit_parse_meminfo(buf, (size_t)len);
    *out = m;
    return JLM_OK;
}

uint64_t jlm_memlimit_budget(const jlm_memlimit *m, uint64_t *headroom)
{
    uint64_t lim = m->cg_limit;
    if (m->mem_available && (!lim || m->mem_available < lim))
        lim = m->mem_available;
    uint64_t h = lim ? (48ull << 20) + lim / 16 : 0;
    if (headroom)
        *headroom = h;
    return lim > h ? lim - h : lim ? 1 : 0;   /* 1: the engine raises it to its minimum */
}
