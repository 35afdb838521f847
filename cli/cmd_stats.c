/* cmd_stats.c - `jlm stats MOUNT_OR_DB [--json]`: the residency counters.
 *
 * The argument is the SQLite database itself, a jlmfs model view (directory
 * or a file in it: its xattrs name the database and the model), or a mount
 * point (every view directly inside it is found by its xattrs; each distinct
 * database is printed once, with every model it holds). */
#include "cli/cli.h"
#include "residency/residency.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char USAGE[] = "usage: jlm stats MOUNT_OR_DB [--json]\n";

static int print_db(const char *db_path, const char *model_key, int json)
{
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    char *out = NULL;
    int e = jlm_rdb_open(db_path, 0, &db, &err);
    if (!e)
        e = json ? jlm_rdb_stats_json(db, model_key, &out, &err) : jlm_rdb_stats_text(db, model_key, &out, &err);
    jlm_rdb_close(db);
    if (e) {
        fprintf(stderr, "jlm stats: %s\n", err.msg);
        return 1;
    }
    fputs(out, stdout);
    free(out);
    return 0;
}

/* Every distinct database named by a view directly inside dir. */
static int scan_mount(const char *dir, char ***dbs, size_t *n)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *de;
    char **v = NULL;
    size_t k = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char *p = NULL, *dbp = NULL, *key = NULL;
        jlm_err err = {0};
        if (asprintf(&p, "%s/%s", dir, de->d_name) < 0)
            break;
        struct stat st;
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode) && jlm_rdb_discover(p, &dbp, &key, &err) == 0) {
            size_t i = 0;
            while (i < k && strcmp(v[i], dbp))
                i++;
            char **nv = i == k ? realloc(v, (k + 1) * sizeof *v) : NULL;
            if (nv) {
                v = nv;
                v[k++] = dbp;
                dbp = NULL;
            }
        }
        free(p); free(dbp); free(key);
    }
    closedir(d);
    *dbs = v;
    *n = k;
    return 0;
}

int jlm_cmd_stats(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "jlm stats: unknown option '%s'\n%s", argv[i], USAGE);
            return 2;
        }
    }
    if (!path) {
        fputs(USAGE, stderr);
        return 2;
    }
    jlm_err err = {0};
    char *dbp = NULL, *key = NULL;
    if (jlm_rdb_discover(path, &dbp, &key, &err) == 0) {   /* a view */
        int rc = print_db(dbp, key, json);
        free(dbp);
        free(key);
        return rc;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "jlm stats: %s: no such file or directory\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        return print_db(path, NULL, json);
    char **dbs = NULL;
    size_t n = 0;
    if (scan_mount(path, &dbs, &n) != 0 || n == 0) {
        fprintf(stderr, "jlm stats: %s: a directory without jlmfs model views (no user.jlmfs.db attribute on it "
                "or its entries)\n", path);
        free(dbs);
        return 1;
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        rc |= print_db(dbs[i], NULL, json);
        free(dbs[i]);
    }
    free(dbs);
    return rc;
}
