/* mmproj.c - the naming rule that pairs a text GGUF with its vision projector
 * in SRC (docs/vision.md, docs/jlmfs.md): for "dir/foo.gguf", the first of
 * "dir/mmproj-foo.gguf" and "dir/foo.mmproj.gguf" that is a regular file
 * reached below SRC without a symlink (docs/security.md).
 * A projector file itself gets no view of its own. */
#include "fs/view_int.h"
#include "base/beneath.h"

#include <fcntl.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int jlmfs_is_mmproj(const char *rel)
{
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    size_t n = strlen(base);
    return !strncmp(base, "mmproj-", 7) || (n > 12 && !strcmp(base + n - 12, ".mmproj.gguf"));
}

char *jlmfs_mmproj_rel(int src_fd, const char *rel, struct stat *st)
{
    const char *base = strrchr(rel, '/');
    size_t dir = base ? (size_t)(base + 1 - rel) : 0, n = strlen(rel);
    if (n < dir + 6 || jlmfs_is_mmproj(rel))
        return NULL;
    for (int form = 0; form < 2; form++) {
        char *cand = NULL;
        int rc = form == 0 ? asprintf(&cand, "%.*smmproj-%s", (int)dir, rel, rel + dir)
                           : asprintf(&cand, "%.*s.mmproj.gguf", (int)(n - 5), rel);
        if (rc < 0)
            return NULL;
        struct stat s;   /* through SRC's descriptor: a symlink (anywhere in cand) is no projector */
        int fd = jlm_open_beneath(src_fd, cand, O_PATH, 0);
        int ok = fd >= 0 && fstat(fd, &s) == 0 && S_ISREG(s.st_mode);
        if (fd >= 0)
            close(fd);
        if (ok) {
            if (st)
                *st = s;
            return cand;
        }
        free(cand);
    }
    return NULL;
}
