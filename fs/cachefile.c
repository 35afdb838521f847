/* cachefile.c - opening a file of the cache folder (docs/security.md section
 * 12): below the folder the daemon checked and holds open, never following a
 * link, and never leaving a file it made wider than asked. */
#include "fs/view_int.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int jlmfs_cache_open(int cache_fd, const char *path, int flags, mode_t mode)
{
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    flags |= O_NOFOLLOW | O_CLOEXEC;
    int fd = cache_fd >= 0 ? openat(cache_fd, name, flags, mode) : open(path, flags, mode);
    if (fd < 0 || !(flags & O_CREAT))
        return fd;
    struct stat st;
    int e = fstat(fd, &st) ? errno : !S_ISREG(st.st_mode) ? EINVAL : 0;
    /* one made by an older daemon (0644): narrowed, if it is ours */
    if (!e && st.st_uid == geteuid() && (st.st_mode & 07777 & ~mode) && fchmod(fd, st.st_mode & mode & 07777))
        e = errno;
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}
