/* daemon.h - the jlmfs daemon as a program: `jlmfs SRC MOUNTPOINT [-f] [-d]
 * [-o cache=DIR,workers=N,type=T,allow_other,...]` (docs/jlmfs.md). The main
 * (cli/jlmfs_main.c) answers --version and hands everything else here.
 *
 * Owns: the option parsing (jlmfs's own options, the rest passed to
 * libfuse), the refusals at start (each one line on stderr naming the path
 * and the reason: SRC inside or already the source of a jlmfs mount, the
 * mount point on or inside one, the mount point inside SRC or SRC inside the
 * mount point, a cache folder another user owns or may write), the mount,
 * the log (stderr with -f / -d, else syslog) and the FUSE session loop
 * (fs/fuse_int.h). One daemon per process; not reentrant. */
#ifndef JLMFS_DAEMON_H
#define JLMFS_DAEMON_H

#include <stdio.h>

/* The --help text. */
extern const char jlmfs_daemon_usage[];

/* Runs the daemon to its unmount: the exit status (0 after a clean unmount
 * or --help, 1 for a refusal or a failed mount, 2 for bad usage). */
int  jlmfs_daemon_main(int argc, char **argv);

/* The "build: ..." line of --version: compiler, libfuse, SQLite, jansson. */
void jlmfs_daemon_print_build(FILE *out);

#endif
