/* cmd_stats.c - `jlm stats MOUNT_OR_DB [--json | --html [-o FILE_OR_DIR]]`:
 * the residency counters, as text, JSON or the container picture coloured by
 * residency (one page per view; a mount writes DIR/<view>.html for each).
 *
 * The argument is the SQLite database itself, a jlmfs model view (directory
 * or a file in it: its xattrs name the database and the model), or a mount
 * point (every view directly inside it is found by its xattrs; each distinct
 * database is printed once, with every model it holds). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "residency/residency.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char USAGE[] = "usage: jlm stats MOUNT_OR_DB [--json | --html [-o FILE_OR_DIR]]\n";

static int print_db(const char *db_path, const char *model_key, int json)
{
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    char *out = NULL;
    int e = jlm_rdb_open(db_path, JLM_RDB_READONLY, &db, &err);
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

/* --html on a mount: the picture of every view directly inside it, written
 * to out_dir/<view name>.html (each named on stderr). */
static int html_mount(const char *dir, const char *out_dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "jlm stats: %s: cannot list it\n", dir);
        return 1;
    }
    struct dirent *de;
    int rc = 0, n = 0;
    while ((de = readdir(d))) {
        char *p = NULL, *dbp = NULL, *key = NULL, *out = NULL;
        jlm_err err = {0};
        struct stat st;
        if (de->d_name[0] != '.' && asprintf(&p, "%s/%s", dir, de->d_name) >= 0 && stat(p, &st) == 0 &&
            S_ISDIR(st.st_mode) && jlm_rdb_discover(p, &dbp, &key, &err) == 0 &&
            asprintf(&out, "%s/%s.html", out_dir, de->d_name) >= 0) {
            int r = jlm_cli_picture("jlm stats", p, out, dbp, key);
            if (!r)
                fprintf(stderr, "jlm stats: wrote %s\n", out);
            rc |= r;
            n++;
        }
        free(p); free(dbp); free(key); free(out);
    }
    closedir(d);
    if (!n)
        fprintf(stderr, "jlm stats: %s: a directory without jlmfs model views\n", dir);
    return n ? rc : 1;
}

static int stats_html(const char *path, const char *out)
{
    jlm_err err = {0};
    char *dbp = NULL, *key = NULL;
    if (jlm_rdb_discover(path, &dbp, &key, &err) == 0) {   /* a view */
        int rc = jlm_cli_picture("jlm stats", path, out, dbp, key);
        free(dbp);
        free(key);
        return rc;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "jlm stats: %s: --html draws containers: give a jlmfs view or mount, not a database\n", path);
        return 1;
    }
    if (!out) {
        fprintf(stderr, "jlm stats: %s: --html on a mount writes one page per view: give -o DIR\n", path);
        return 2;
    }
    return html_mount(path, out);
}

int jlm_cmd_stats(int argc, char **argv)
{
    const char *path = NULL, *out = NULL;
    int json = 0, html = 0;
    const jlm_opt t[] = {
        {NULL, "--json", JLM_OPT_FLAG, &json, 0, 0, 0, NULL, "JSON on stdout"},
        {NULL, "--html", JLM_OPT_FLAG, &html, 0, 0, 0, NULL, "the residency picture as HTML"},
        {"-o", "--output", JLM_OPT_STR, &out, 0, 0, 0, "FILE", "--html: write to FILE (default: stdout)"},
    };
    const char *pos[1] = {0};
    jlm_opts_spec os = {"jlm stats", "MOUNT_OR_DB [options]", t, (int)(sizeof t / sizeof t[0]), pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    path = os.n_pos ? pos[0] : NULL;
    if (!path || (json && html) || (out && !html)) {
        fputs(USAGE, stderr);
        return 2;
    }
    if (html)
        return stats_html(path, out);
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
