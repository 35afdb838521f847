/* test_fs_inode.c - the FUSE layer's inode table (fs/inode.h) without a
 * mount: versions of one path get inodes of their own, stale inodes keep
 * their path for the descriptors still open on them, renames move every
 * inode below the old name, counts drop them, numbers are never reused. */
#include <criterion/criterion.h>

#include "fs/inode.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jlmfs_inodes *T;
static void init(void) { cr_assert((T = jlmfs_ino_new())); }
static void fini(void) { jlmfs_ino_free(T); T = NULL; }

TestSuite(fs_inode, .init = init, .fini = fini, .timeout = 30);

/* ino's path, or "" if stale-gone; *cur its current flag. */
static char *path_of(uint64_t ino, int *cur, uint64_t *ver)
{
    char *p = NULL;
    int rc = jlmfs_ino_path(T, ino, &p, ver, cur);
    return rc ? NULL : p;
}

Test(fs_inode, the_root_is_there_from_the_start_and_never_forgotten)
{
    int cur = 0;
    char *p = path_of(JLMFS_INO_ROOT, &cur, NULL);
    cr_assert(p && !strcmp(p, "/") && cur);
    free(p);
    jlmfs_ino_forget(T, JLMFS_INO_ROOT, 1000);
    cr_assert((p = path_of(JLMFS_INO_ROOT, NULL, NULL)));
    free(p);
    cr_assert_eq(jlmfs_ino_count(T), 0);
    char *c = NULL;
    cr_assert_eq(jlmfs_ino_child_path(T, JLMFS_INO_ROOT, "a.jlm", &c), 0);
    cr_assert_str_eq(c, "/a.jlm");
    free(c);
}

Test(fs_inode, one_version_one_inode_and_a_new_version_a_new_inode)
{
    uint64_t a = jlmfs_ino_link(T, "/m.jlm/model.jlm", 7);
    uint64_t a2 = jlmfs_ino_link(T, "/m.jlm/model.jlm", 7);
    cr_assert(a && a == a2, "the same version got two inodes (%llu, %llu)", (unsigned long long)a,
              (unsigned long long)a2);
    cr_assert_neq(a, JLMFS_INO_ROOT);
    uint64_t b = jlmfs_ino_link(T, "/m.jlm/model.jlm", 8);   /* the source was replaced */
    cr_assert(b && b != a);
    int cur = -1;
    uint64_t ver = 0;
    char *p = path_of(a, &cur, &ver);
    cr_assert(p && !strcmp(p, "/m.jlm/model.jlm") && cur == 0 && ver == 7, "the old version is not kept stale");
    free(p);
    p = path_of(b, &cur, &ver);
    cr_assert(p && cur == 1 && ver == 8);
    free(p);
    uint64_t all[4];
    cr_assert_eq(jlmfs_ino_all_of(T, "/m.jlm/model.jlm", all, 4), 2);
    /* the stale one lives while the kernel holds it (two lookups), then goes */
    jlmfs_ino_forget(T, a, 1);
    cr_assert((p = path_of(a, NULL, NULL)));
    free(p);
    jlmfs_ino_forget(T, a, 1);
    cr_assert_null(path_of(a, NULL, NULL));
    char *q = NULL;
    cr_assert_eq(jlmfs_ino_path(T, a, &q, NULL, NULL), -ESTALE);
    cr_assert_eq(jlmfs_ino_count(T), 1);
    /* numbers are never reused */
    uint64_t c = jlmfs_ino_link(T, "/other", 1);
    cr_assert(c > b);
}

Test(fs_inode, a_removed_name_gets_a_new_inode_at_its_next_lookup)
{
    uint64_t a = jlmfs_ino_link(T, "/x.gguf", 5);
    jlmfs_ino_unhash(T, "/x.gguf");
    int cur = 1;
    char *p = path_of(a, &cur, NULL);
    cr_assert(p && cur == 0);
    free(p);
    uint64_t b = jlmfs_ino_link(T, "/x.gguf", 5);   /* same identity, but a new name */
    cr_assert(b && b != a);
}

Test(fs_inode, a_rename_moves_every_inode_at_or_below_the_old_name_only)
{
    uint64_t d = jlmfs_ino_link(T, "/d", 1), f = jlmfs_ino_link(T, "/d/f", 2);
    uint64_t sib = jlmfs_ino_link(T, "/dd/f", 3), tgt = jlmfs_ino_link(T, "/e", 4);
    jlmfs_ino_rename(T, "/d", "/e");
    char *p;
    int cur;
    cr_assert((p = path_of(d, &cur, NULL)) && !strcmp(p, "/e") && cur);
    free(p);
    cr_assert((p = path_of(f, NULL, NULL)) && !strcmp(p, "/e/f"));
    free(p);
    cr_assert((p = path_of(sib, NULL, NULL)) && !strcmp(p, "/dd/f"), "a sibling sharing the prefix moved");
    free(p);
    cr_assert((p = path_of(tgt, &cur, NULL)) && cur == 0, "the replaced target stayed current");
    free(p);
    uint64_t all[4];
    cr_assert_eq(jlmfs_ino_all_of(T, "/e/f", all, 4), 1);
    cr_assert_eq(all[0], f);
    cr_assert_eq(jlmfs_ino_link(T, "/e", 1), d, "a lookup of the new name did not find the moved inode");
}

static void *linker(void *arg)
{
    char path[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(path, sizeof path, "/p%d", i % 50);
        uint64_t n = jlmfs_ino_link(T, path, (uint64_t)(uintptr_t)arg);
        if (!n)
            return (void *)1;
        jlmfs_ino_forget(T, n, 1);
    }
    return NULL;
}

Test(fs_inode, concurrent_links_and_forgets_leave_nothing_behind)
{
    pthread_t th[4];
    for (uintptr_t i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, linker, (void *)(i % 2)), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        cr_assert_null(r);
    }
    cr_assert_eq(jlmfs_ino_count(T), 0, "%zu inodes left after every reference was forgotten",
                 jlmfs_ino_count(T));
}
