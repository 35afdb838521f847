/* status.c - what a view's status may say about a failure (docs/security.md):
 * the reason, never the daemon's absolute paths (SRC and the cache are shown
 * as "SRC" and "CACHE") and never raw control bytes from a crafted name. */
#include "fs/view_int.h"

#include <string.h>

void jlmfs_status_clean(char *dst, size_t n, const char *msg, const jlmfs_view_env *env)
{
    if (!n)
        return;
    const char *roots[2] = {env ? env->cache : NULL, env ? env->src : NULL};   /* cache first: it may be in SRC */
    static const char *names[2] = {"CACHE", "SRC"};
    size_t o = 0;
    while (*msg && o + 1 < n) {
        int hit = -1;
        for (int r = 0; r < 2 && hit < 0; r++)
            if (roots[r] && *roots[r] && !strncmp(msg, roots[r], strlen(roots[r])))
                hit = r;
        if (hit >= 0) {
            for (const char *w = names[hit]; *w && o + 1 < n; w++)
                dst[o++] = *w;
            msg += strlen(roots[hit]);
            continue;
        }
        unsigned char c = (unsigned char)*msg++;
        dst[o++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    dst[o] = 0;
}
