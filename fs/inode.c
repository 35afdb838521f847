/* inode.c - the FUSE layer's inode table (fs/inode.h). */
#include "fs/inode.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every inode the kernel holds (nlookup > 0) and the root. One table lock;
 * nothing slow runs under it. Hashed by number and by path: a path has at
 * most one current inode (what a lookup gives while its version stays) and
 * any number of stale ones (old versions, removed names) until forgotten. */
typedef struct inode {
    uint64_t    ino;
    uint64_t      nlookup;
    uint64_t      version;     /* ino_version */
    char         *path;        /* mount path: "/" or "/a/b" */
    int           current;
    struct inode *next_ino, *next_path;
} inode;

#define INO_BUCKETS 16384
struct jlmfs_inodes {
    pthread_mutex_t lock;
    inode          *by_ino[INO_BUCKETS], *by_path[INO_BUCKETS];
    uint64_t        next;
    inode           root;
};

static size_t path_hash(const char *p)
{
    uint64_t h = 1469598103934665603ull;
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return (size_t)(h % INO_BUCKETS);
}

static inode *ino_get_locked(jlmfs_inodes *T, uint64_t ino)
{
    if (ino == JLMFS_INO_ROOT)
        return &T->root;
    inode *i = T->by_ino[ino % INO_BUCKETS];
    while (i && i->ino != ino)
        i = i->next_ino;
    return i;
}

static inode *current_locked(jlmfs_inodes *T, const char *path)
{
    for (inode *i = T->by_path[path_hash(path)]; i; i = i->next_path)
        if (i->current && !strcmp(i->path, path))
            return i;
    return NULL;
}

static void path_unhash_locked(jlmfs_inodes *T, inode *i)
{
    inode **pp = &T->by_path[path_hash(i->path)];
    while (*pp != i)
        pp = &(*pp)->next_path;
    *pp = i->next_path;
}

static void path_hash_locked(jlmfs_inodes *T, inode *i)
{
    size_t b = path_hash(i->path);
    i->next_path = T->by_path[b];
    T->by_path[b] = i;
}

jlmfs_inodes *jlmfs_ino_new(void)
{
    jlmfs_inodes *T = calloc(1, sizeof *T);
    if (!T)
        return NULL;
    pthread_mutex_init(&T->lock, NULL);
    T->next = JLMFS_INO_ROOT + 1;
    T->root.ino = JLMFS_INO_ROOT;
    T->root.nlookup = 1;
    T->root.path = "/";
    T->root.current = 1;
    return T;
}

/* A reply_entry is about to give the kernel a reference to path at version:
 * the current inode if it is that version, else a new one (the old one goes
 * stale). 0 if out of memory. */
uint64_t jlmfs_ino_link(jlmfs_inodes *T, const char *path, uint64_t version)
{
    pthread_mutex_lock(&T->lock);
    inode *c = current_locked(T, path);
    uint64_t ino = 0;
    if (c && c->version == version) {
        c->nlookup++;
        ino = c->ino;
    } else {
        inode *n = calloc(1, sizeof *n);
        char *p = n ? strdup(path) : NULL;
        if (p) {
            if (c && c != &T->root)
                c->current = 0;   /* another version now: its descriptors keep their own inode */
            n->ino = T->next++;
            n->nlookup = 1;
            n->version = version;
            n->path = p;
            n->current = 1;
            n->next_ino = T->by_ino[n->ino % INO_BUCKETS];
            T->by_ino[n->ino % INO_BUCKETS] = n;
            path_hash_locked(T, n);
            ino = n->ino;
        } else {
            free(n);
        }
    }
    pthread_mutex_unlock(&T->lock);
    return ino;
}

void jlmfs_ino_forget(jlmfs_inodes *T, uint64_t ino, uint64_t n)
{
    pthread_mutex_lock(&T->lock);
    inode *i = ino_get_locked(T, ino);
    if (i && i != &T->root) {
        i->nlookup = n < i->nlookup ? i->nlookup - n : 0;
        if (!i->nlookup) {
            inode **pp = &T->by_ino[ino % INO_BUCKETS];
            while (*pp != i)
                pp = &(*pp)->next_ino;
            *pp = i->next_ino;
            path_unhash_locked(T, i);
            free(i->path);
            free(i);
        }
    }
    pthread_mutex_unlock(&T->lock);
}

/* The path (malloc'd) and version of ino; -ESTALE if the kernel names an
 * inode it was never given or already forgot. */
int jlmfs_ino_path(jlmfs_inodes *T, uint64_t ino, char **path, uint64_t *version, int *current)
{
    pthread_mutex_lock(&T->lock);
    inode *i = ino_get_locked(T, ino);
    int rc = !i ? -ESTALE : !(*path = strdup(i->path)) ? -ENOMEM : 0;
    if (!rc) {
        if (version)
            *version = i->version;
        if (current)
            *current = i->current;
    }
    pthread_mutex_unlock(&T->lock);
    return rc;
}

/* parent's path + "/" + name (malloc'd). */
int jlmfs_ino_child_path(jlmfs_inodes *T, uint64_t parent, const char *name, char **out)
{
    char *pp;
    int rc = jlmfs_ino_path(T, parent, &pp, NULL, NULL);
    if (rc)
        return rc;
    rc = asprintf(out, "%s%s%s", pp, strcmp(pp, "/") ? "/" : "", name) < 0 ? -ENOMEM : 0;
    free(pp);
    return rc;
}

/* path was removed (unlink, rmdir, the target of a rename): the next lookup
 * makes a new inode. */
void jlmfs_ino_unhash(jlmfs_inodes *T, const char *path)
{
    pthread_mutex_lock(&T->lock);
    inode *c = current_locked(T, path);
    if (c && c != &T->root)
        c->current = 0;
    pthread_mutex_unlock(&T->lock);
}

/* from was renamed to to: every inode at from or below it moves. */
void jlmfs_ino_rename(jlmfs_inodes *T, const char *from, const char *to)
{
    size_t fl = strlen(from);
    pthread_mutex_lock(&T->lock);
    inode *c = current_locked(T, to);
    if (c && c != &T->root)
        c->current = 0;
    for (size_t b = 0; b < INO_BUCKETS; b++)
        for (inode *i = T->by_ino[b]; i; i = i->next_ino) {
            if (strncmp(i->path, from, fl) || (i->path[fl] && i->path[fl] != '/'))
                continue;
            char *np = NULL;
            if (asprintf(&np, "%s%s", to, i->path + fl) < 0)
                continue;   /* out of memory: it keeps the old path (its lookups go stale) */
            path_unhash_locked(T, i);
            free(i->path);
            i->path = np;
            path_hash_locked(T, i);
        }
    pthread_mutex_unlock(&T->lock);
}

/* At exit: the kernel sends no forget for what it held at unmount. */
void jlmfs_ino_free(jlmfs_inodes *T)
{
    if (!T)
        return;
    for (size_t b = 0; b < INO_BUCKETS; b++) {
        for (inode *i = T->by_ino[b], *next; i; i = next) {
            next = i->next_ino;
            free(i->path);
            free(i);
        }
    }
    pthread_mutex_destroy(&T->lock);
    free(T);
}

/* Every inode (current or stale) with this path: up to max numbers. */
size_t jlmfs_ino_all_of(jlmfs_inodes *T, const char *path, uint64_t *out, size_t max)
{
    size_t k = 0;
    pthread_mutex_lock(&T->lock);
    for (inode *i = T->by_path[path_hash(path)]; i && k < max; i = i->next_path)
        if (!strcmp(i->path, path))
            out[k++] = i->ino;
    pthread_mutex_unlock(&T->lock);
    return k;
}
size_t jlmfs_ino_count(jlmfs_inodes *T)
{
    size_t k = 0;
    pthread_mutex_lock(&T->lock);
    for (size_t b = 0; b < INO_BUCKETS; b++)
        for (inode *i = T->by_ino[b]; i; i = i->next_ino)
            k++;
    pthread_mutex_unlock(&T->lock);
    return k;
}
