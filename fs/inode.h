/* inode.h - the inode table of the FUSE layer (fs/fuse_ops.c): which mount
 * path and which version of it each inode number the kernel holds stands for
 * (docs/security.md section 11). Knows nothing of FUSE or of views: a version
 * is a number the caller chooses (a view's serial, a file's identity).
 *
 * Owns: every inode with a lookup count above 0, and the root (number
 * JLMFS_INO_ROOT, path "/", never forgotten). A path has at most one current
 * inode (what a lookup gives while its version stays) and any number of stale
 * ones (old versions, removed names) until the kernel forgets them. Numbers
 * are never reused within a table (a 64-bit counter).
 *
 * Thread safety: every function may be called from any thread (one lock;
 * nothing slow under it). Failure: out of memory is 0 / -ENOMEM, an unknown
 * number -ESTALE; nothing else fails. */
#ifndef JLMFS_INODE_H
#define JLMFS_INODE_H

#include <stddef.h>
#include <stdint.h>

#define JLMFS_INO_ROOT 1   /* FUSE_ROOT_ID */

typedef struct jlmfs_inodes jlmfs_inodes;

/* A table holding only the root. NULL if out of memory. */
jlmfs_inodes *jlmfs_ino_new(void);
/* Frees the table and every inode in it (at unmount the kernel sends no
 * forget for what it held). Accepts NULL. */
void     jlmfs_ino_free(jlmfs_inodes *t);
/* The kernel is given a reference to path at version: the current inode of
 * path if it is that version (its count + 1), else a new inode, current from
 * now on (the old one goes stale, kept for its open descriptors). 0 if out of
 * memory. */
uint64_t jlmfs_ino_link(jlmfs_inodes *t, const char *path, uint64_t version);
/* The kernel dropped n references: at 0 the inode goes. The root stays. */
void     jlmfs_ino_forget(jlmfs_inodes *t, uint64_t ino, uint64_t n);
/* ino's path (malloc'd), version and whether it is current (each may be
 * NULL but path). -ESTALE for a number never given or already forgotten. */
int      jlmfs_ino_path(jlmfs_inodes *t, uint64_t ino, char **path, uint64_t *version, int *current);
/* parent's path + "/" + name (malloc'd); as jlmfs_ino_path. */
int      jlmfs_ino_child_path(jlmfs_inodes *t, uint64_t parent, const char *name, char **out);
/* path was removed (unlink, rmdir, the target of a rename): its current
 * inode goes stale, the next lookup makes a new one. */
void     jlmfs_ino_unhash(jlmfs_inodes *t, const char *path);
/* from was renamed to to: every inode at from or below it takes the new
 * path; the current inode of to goes stale. */
void     jlmfs_ino_rename(jlmfs_inodes *t, const char *from, const char *to);
/* Every inode (current or stale) with this path: up to max numbers. */
size_t   jlmfs_ino_all_of(jlmfs_inodes *t, const char *path, uint64_t *out, size_t max);
/* How many inodes the table holds besides the root (tests, leak checks). */
size_t   jlmfs_ino_count(jlmfs_inodes *t);

#endif
