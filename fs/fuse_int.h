/* fuse_int.h - shared by the files of the FUSE layer: fs/fuse_ops.c (the
 * lowlevel operations, open handles, the invalidation thread), fs/log.c (the
 * daemon's log) and fs/daemon.c (options, start, session loop). Not a public
 * contract: see fs/daemon.h. The only files of fs/ that include libfuse. */
#ifndef JLMFS_FUSE_INT_H
#define JLMFS_FUSE_INT_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "fs/jlmfs.h"

/* fuse_ops.c: the operations, on the daemon and session bound here (one
 * mount per process). bind before the session loop: -1 if out of memory;
 * unbind after the session is destroyed (frees the inode table). */
extern const struct fuse_lowlevel_ops jlmfs_fuse_ops;
int  jlmfs_fuse_bind(jlmfs *fs, struct fuse_session *se);
void jlmfs_fuse_unbind(void);
/* 1 once the session's init ran (it started the daemon: destroy closes it). */
int  jlmfs_fuse_started(void);
/* jlmfs_opts.invalidate: queues path for the invalidation thread. */
void jlmfs_fuse_inval_queue(void *ctx, const char *path);

/* log.c: jlmfs_opts.log. One line per event, control bytes shown as '?':
 * "jlmfs: LINE" on stderr in the foreground (-f, -d), else syslog (facility
 * daemon, opened by the caller). */
void jlmfs_dlog_foreground(int on);
void jlmfs_dlog_line(void *ctx, int prio, const char *line);
void jlmfs_dlogf(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
