/* hfdir.c - a Hugging Face folder in SRC as a model source (docs/jlmfs.md,
 * "Hugging Face folders"): when it counts as complete, and its identity.
 *
 * A folder SRC/x (reached below SRC, no symlink followed) is a source when it
 * holds a regular config.json and model.safetensors or every shard its
 * model.safetensors.index.json names, each shard at least as long as its own
 * header says (jlm_st_dir_complete), it holds no model.jlm (a converted
 * folder is no source), and no *.json or *.safetensors file in it is open
 * for writing through the mount (checked by the caller, jlmfs.c). Its identity is the folder's
 * (dev, ino), the sum of its files' sizes, their latest mtime and a hash of
 * (name, ino, size, mtime) of every *.json and *.safetensors file directly in
 * it: a file added, replaced, rewritten or touched changes it, and a changed
 * identity replaces the view (invariant 1 of jlmfs.h). */
#include "fs/view_int.h"
#include "base/beneath.h"
#include "converter/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n > m && !strcmp(s + n - m, suf);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Identity of the open folder d (dst: the folder's stat). 0, or -1 if it
 * cannot be listed. Each file's (name, ino, size, mtime) is hashed on its own
 * and the hashes XORed, so the order readdir gives does not matter. */
static int ident_of_dir(int d, const struct stat *dst, jlmfs_ident *id)
{
    int dd = openat(d, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = dd >= 0 ? fdopendir(dd) : NULL;
    if (!dir) {
        if (dd >= 0)
            close(dd);
        return -1;
    }
    *id = (jlmfs_ident){0};
    id->dev = dst->st_dev;
    id->ino = dst->st_ino;   /* not the folder's mtime: a README or an editor's temp file added is no change */
    uint64_t acc = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        struct stat st;
        if (!(suffix(de->d_name, ".json") || suffix(de->d_name, ".safetensors")) ||
            fstatat(d, de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
            continue;
        uint64_t h = fnv(1469598103934665603ull, de->d_name, strlen(de->d_name) + 1);
        int64_t f[4] = {(int64_t)st.st_ino, (int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
        acc ^= fnv(h, f, sizeof f);
        id->size += st.st_size;
        if (st.st_mtim.tv_sec > id->mtime_s || (st.st_mtim.tv_sec == id->mtime_s && st.st_mtim.tv_nsec > id->mtime_ns))
            id->mtime_s = st.st_mtim.tv_sec, id->mtime_ns = st.st_mtim.tv_nsec;
    }
    closedir(dir);
    id->hf_hash = acc ? acc : 1;   /* nonzero: marks a folder identity */
    return 0;
}

int jlmfs_hf_ident(int src_fd, const char *rel, int check_complete, jlmfs_ident *id, struct stat *dir_st)
{
    if (!*rel)
        return 0;
    int d = jlm_open_beneath(src_fd, rel, O_PATH | O_DIRECTORY, 0);
    if (d < 0)
        return 0;
    struct stat st, cst;
    char why[512];
    int ok = fstat(d, &st) == 0 && S_ISDIR(st.st_mode) &&
             fstatat(d, "config.json", &cst, AT_SYMLINK_NOFOLLOW) == 0 &&
             fstatat(d, "model.jlm", &cst, AT_SYMLINK_NOFOLLOW) != 0 &&
             (!check_complete || jlm_st_dir_complete(d, why, sizeof why)) && ident_of_dir(d, &st, id) == 0;
    close(d);
    if (ok && dir_st) {
        *dir_st = st;
        dir_st->st_mode = S_IFREG | (st.st_mode & 0444);   /* a view is read by who may read the folder */
        dir_st->st_mtim = (struct timespec){id->mtime_s, id->mtime_ns};
    }
    return ok;
}
