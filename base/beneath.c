/* beneath.c - opening a path below a directory without following any symlink
 * (docs/security.md): the daemon runs as root over folders other people
 * write into, so a link planted in SRC must never make it read a file outside
 * SRC (or any file the link names). openat2(RESOLVE_BENEATH |
 * RESOLVE_NO_SYMLINKS) where the kernel has it; else one component at a time
 * with O_NOFOLLOW, refusing "..". */
#include "base/beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int walk(int dirfd, const char *rel, int flags, mode_t mode)
{
    char *copy = strdup(rel);
    if (!copy) {
        errno = ENOMEM;
        return -1;
    }
    int cur = dirfd, fd = -1;
    char *save = NULL, *part = strtok_r(copy, "/", &save);
    while (part) {
        char *next = strtok_r(NULL, "/", &save);
        if (!strcmp(part, "..")) {
            errno = EXDEV;
            break;
        }
        int f = next ? O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC : flags | O_NOFOLLOW | O_CLOEXEC;
        int nfd = openat(cur, part, f, mode);
        if (cur != dirfd)
            close(cur);
        cur = dirfd;
        if (nfd < 0)
            break;
        if (!next) {
            fd = nfd;
            break;
        }
        cur = nfd;
        part = next;
    }
    int e = errno;
    if (cur != dirfd)
        close(cur);
    free(copy);
    errno = e;
    return fd;
}

int jlm_open_beneath(int dirfd, const char *rel, int flags, mode_t mode)
{
    if (!rel || !*rel || rel[0] == '/') {
        errno = EXDEV;
        return -1;
    }
    /* openat2 refuses flags open(2) ignores (FUSE hands on the kernel's own) */
    flags &= O_ACCMODE | O_APPEND | O_TRUNC | O_CREAT | O_EXCL | O_NONBLOCK | O_DIRECTORY | O_NOFOLLOW |
             O_SYNC | O_DSYNC | O_DIRECT | O_NOATIME | O_LARGEFILE | O_NOCTTY | O_PATH;
    struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC), .mode = (flags & O_CREAT) ? mode & 07777 : 0,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
    if (fd >= 0 || (errno != ENOSYS && errno != EPERM))   /* EPERM: a seccomp filter without openat2 */
        return (int)fd;
    return walk(dirfd, rel, flags, mode);
}
