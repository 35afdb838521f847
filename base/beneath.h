/* beneath.h - open a path strictly below a directory, following no symlink
 * (docs/security.md section 3): how the daemon opens what other users can
 * write into (SRC's sources, the cache's files), and how the converter opens
 * the files of a source folder for it.
 *
 * Owns nothing; no state, safe from any thread. Failure: -1 with errno set,
 * nothing opened. */
#ifndef JLM_BASE_BENEATH_H
#define JLM_BASE_BENEATH_H

#include <sys/types.h>

/* Like openat(dirfd, rel, flags, mode), but fails (ELOOP for a symlink, EXDEV
 * for ".." or an absolute path) rather than leave dirfd or follow a link in
 * any component. Returns the descriptor (O_CLOEXEC) or -1 with errno set. */
int jlm_open_beneath(int dirfd, const char *rel, int flags, mode_t mode);

#endif
