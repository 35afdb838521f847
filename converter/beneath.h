/* beneath.h - open a path strictly below a directory, following no symlink. */
#ifndef JLM_BENEATH_H
#define JLM_BENEATH_H

#include <sys/types.h>

/* Like openat(dirfd, rel, flags, mode), but fails (ELOOP for a symlink, EXDEV
 * for ".." or an absolute path) rather than leave dirfd or follow a link in
 * any component. Returns the descriptor (O_CLOEXEC) or -1 with errno set. */
int jlm_open_beneath(int dirfd, const char *rel, int flags, mode_t mode);

#endif
