/* cmd_stats.c - `jlm stats MOUNT_OR_DB [--json | --html [-o FILE_OR_DIR]]`:
 * the residency counters, as text, JSON or the container picture coloured by
 * residency (one page per view; a mount writes DIR/<view>.html for each).
 *
 * The argument is the SQLite database itself, a jlmfs model view (directory
 * or a file in it: its xattrs name the database and the model), or a mount
 * point (every view directly inside it is found by its xattrs; each distinct
 * database is printed once, with every model it holds).
 *
 * Text: one summary line per model first (sessions, resident pages and bytes
 * of the container's total when its view is at hand, hit rate, bytes read),
 * then a legend of the columns, then residency's per-page table. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "format/jlm_format.h"
#include "residency/residency.h"

#include <jansson.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char USAGE[] = "usage: jlm stats MOUNT_OR_DB [--json | --wide | --watch S | --html [-o FILE_OR_DIR]]\n";

static const char STRIPS[] =
    "strips: # resident, + read but not resident, . never read (a cell per page, or per run past 64)\n";

/* The default table's columns (80 wide); --wide prints residency's own. */
static const char LEGEND[] =
    "columns: page-ins: pages read into an engine frame; hits: gets served from a\n"
    "  frame; evict: frames dropped; read: bytes the engines read; res: resident in a\n"
    "  live session; last-access in UTC (--wide: fills, where the bytes came from)\n";

static const char LEGEND_WIDE[] =
    "columns: page-ins: pages read into an engine frame; fills: later reads into a resident page;\n"
    "  hits: gets served from a frame; evictions: frames dropped; bytes: bytes the engines read;\n"
    "  t-frame t-pcache t-disk t-conv t-oth: page-ins by where the bytes came from (a frame, the\n"
    "  kernel page cache, the disk, packed on demand by the view, other); d-disk d-conv: the\n"
    "  daemon's reads from its cache file and its on-demand packings; last-access in UTC\n";

static void human(char *b, size_t n, double bytes)
{
    if (bytes >= 1024.0 * 1048576.0)
        snprintf(b, n, "%.2f GiB", bytes / (1024.0 * 1048576.0));
    else if (bytes >= 1048576.0)
        snprintf(b, n, "%.1f MiB", bytes / 1048576.0);
    else
        snprintf(b, n, "%.1f KiB", bytes / 1024.0);
}

#define JI(o, k) ((long long)json_integer_value(json_object_get((o), (k))))

/* The view directory of key: the view given, or MOUNT/KEY; NULL if none. */
static char *view_of(const char *view, const char *mount, const char *key)
{
    char *p = NULL;
    if (view)
        return strdup(view);
    if (!mount || asprintf(&p, "%s/%s/model.jlm", mount, key) < 0)
        return NULL;
    p[strlen(p) - strlen("/model.jlm")] = 0;
    return p;
}

/* Heat strips under a summary line: per page array one cell per page (or
 * per run of pages past 64), '#' resident, '+' read but not resident, '.'
 * never read; for experts one row per MoE block, one cell per expert. */
static void strip(const char *label, const unsigned char *st, uint32_t n)
{
    uint32_t w = n < 64 ? n : 64;
    printf("  %-10s [", label);
    for (uint32_t i = 0; i < w; i++) {
        unsigned char m = 0;
        for (uint64_t p = (uint64_t)i * n / w; p < (uint64_t)(i + 1) * n / w; p++)
            m = st[p] > m ? st[p] : m;
        putchar(".+#"[m]);
    }
    puts("]");
}

static void heat(json_t *m, const jlm_model *c)
{
    const jlm_header *h = &c->hdr;
    uint32_t ne = c->config.n_expert, nb = c->config.n_layer;
    unsigned char *blk = calloc(h->n_blocks + 1, 1), *vis = calloc(h->n_vis_blocks + 1, 1);
    unsigned char *exp = calloc((size_t)nb * (ne ? ne : 1) + 1, 1), *has = calloc(nb + 1, 1);
    if (!blk || !vis || !exp || !has)
        goto out;
    for (uint32_t i = 0; i < h->n_tensors; i++) {   /* the blocks that hold experts */
        jlm_tensor_loc l;
        jlm_fmt_tensor_loc(c, &c->tensors[i], &l);
        if (l.region == JLM_REG_EXPERT && c->tensors[i].block >= 0 && (uint32_t)c->tensors[i].block < nb)
            has[c->tensors[i].block] = 1;
    }
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(m, "pages"), i, p) {
        const char *a = json_string_value(json_object_get(p, "array"));
        long long x = JI(p, "a"), y = JI(p, "b");
        unsigned char v = json_is_true(json_object_get(p, "resident")) ? 2 : 1;
        unsigned char *cell = NULL;
        if (a && !strcmp(a, "blocks") && x >= 0 && x < h->n_blocks)
            cell = &blk[x];
        else if (a && !strcmp(a, "vision") && x >= 0 && x < h->n_vis_blocks)
            cell = &vis[x];
        else if (a && !strcmp(a, "experts") && x >= 0 && x < nb && y >= 0 && y < ne)
            cell = &exp[(size_t)x * ne + (size_t)y];
        if (cell && v > *cell)
            *cell = v;
    }
    if (h->n_blocks)
        strip("blocks", blk, h->n_blocks);
    if (h->n_vis_blocks)
        strip("vision", vis, h->n_vis_blocks);
    for (uint32_t b = 0; ne && b < nb; b++) {
        char label[32];
        snprintf(label, sizeof label, "experts.%u", b);
        if (has[b])
            strip(label, &exp[(size_t)b * ne], ne);
    }
out:
    free(blk); free(vis); free(exp); free(has);
}

/* "KEY: 1 session, 12 of 40 pages resident (3.2 MiB of 10.1 MiB), hit rate
 * 87.5%, 15.0 MiB read"; the totals only when the container can be read. */
static void summary_line(const char *key, json_t *m, const char *view_dir)
{
    json_t *tot = json_object_get(m, "totals");
    long long sess = JI(m, "sessions"), res = JI(m, "resident"), hits = JI(tot, "hits");
    long long looked = hits + JI(tot, "page_ins") + JI(tot, "fills");
    char rate[32] = "-", rd[32], rb[32], tb[32];
    if (looked)
        snprintf(rate, sizeof rate, "%.1f%%", 100.0 * (double)hits / (double)looked);
    human(rd, sizeof rd, (double)JI(tot, "bytes"));
    jlm_model *c = NULL;
    jlm_err err = {0};
    char *file = NULL;
    if (view_dir && asprintf(&file, "%s/model.jlm", view_dir) >= 0 && jlm_fmt_open(file, &c, &err) != 0)
        c = NULL;
    free(file);
    printf("%s: %lld session%s, %lld", jlm_cli_clean(key), sess, sess == 1 ? "" : "s", res);
    if (c) {
        const jlm_header *h = &c->hdr;
        double resident = 0, total = (double)h->n_blocks * (double)h->page_size +
                                     (double)h->n_vis_blocks * (double)h->vis_page_size +
                                     (double)h->n_exp_pages * (double)h->exp_page_size;
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(m, "pages"), i, p) {
            const char *a = json_string_value(json_object_get(p, "array"));
            if (!json_is_true(json_object_get(p, "resident")) || !a)
                continue;
            resident += !strcmp(a, "blocks") ? (double)h->page_size : !strcmp(a, "vision") ? (double)h->vis_page_size
                      : !strcmp(a, "experts") ? (double)h->exp_page_size : 0;
        }
        human(rb, sizeof rb, resident);
        human(tb, sizeof tb, total);
        printf(" of %u pages resident (%s of %s), hit rate %s, %s read\n",
               h->n_blocks + h->n_vis_blocks + h->n_exp_pages, rb, tb, rate, rd);
        heat(m, c);
        jlm_fmt_close(c);
    } else {
        printf(" pages resident, hit rate %s, %s read\n", rate, rd);
    }
}

/* The default table: per model its header line, then one 80-column row
 * per page (and the total) with the counters a reader looks at first. */
static void narrow_row(const char *name, json_t *p, int res)
{
    char rd[32];
    human(rd, sizeof rd, (double)JI(p, "bytes"));
    const char *last = json_string_value(json_object_get(p, "last_access"));
    printf("%-14s %3s %8lld %9lld %8lld %10s  %s\n", jlm_cli_clean(name ? name : "?"), res < 0 ? "" : res ? "yes" : "-", JI(p, "page_ins"),
           JI(p, "hits"), JI(p, "evictions"), rd, last ? last : "-");
}

static void narrow_table(json_t *root)
{
    const char *key;
    json_t *m;
    json_object_foreach(json_object_get(root, "models"), key, m) {
        printf("model %s: %lld live sessions, %lld pages resident\n", jlm_cli_clean(key), JI(m, "sessions"), JI(m, "resident"));
        printf("%-14s %3s %8s %9s %8s %10s  %s\n", "page", "res", "page-ins", "hits", "evict", "read", "last-access");
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(m, "pages"), i, p)
            narrow_row(json_string_value(json_object_get(p, "name")), p, json_is_true(json_object_get(p, "resident")));
        narrow_row("total", json_object_get(m, "totals"), -1);
    }
}

/* Text: the summary of every model, the legend, the table (wide: residency's
 * own, as the view's `stats` file). view: the view given (its model only),
 * mount: the mount scanned (MOUNT/KEY is KEY's view). */
static int print_text(jlm_rdb *db, const char *model_key, const char *view, const char *mount, int wide, jlm_err *err)
{
    char *js = NULL, *table = NULL;
    int e = jlm_rdb_stats_json(db, model_key, &js, err);
    if (!e && wide)
        e = jlm_rdb_stats_text(db, model_key, &table, err);
    json_t *root = e ? NULL : json_loads(js, 0, NULL);
    if (!e && !root)
        e = jlm_errf(err, JLM_ENOMEM, "stats: out of memory");
    if (!e) {
        const char *key;
        json_t *m;
        json_object_foreach(json_object_get(root, "models"), key, m) {
            char *v = view_of(view, mount, key);
            summary_line(key, m, v);
            free(v);
        }
        fputs(STRIPS, stdout);
        fputs(wide ? LEGEND_WIDE : LEGEND, stdout);
        if (wide)
            jlm_cli_puts_lines(table, stdout);   /* model keys are file names */
        else
            narrow_table(root);
    }
    json_decref(root);
    free(js);
    free(table);
    return e;
}

static int print_db(const char *db_path, const char *model_key, int json, int wide, const char *view, const char *mount)
{
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    char *out = NULL;
    int e = jlm_rdb_open(db_path, JLM_RDB_READONLY, &db, &err);
    if (!e && json)
        e = jlm_rdb_stats_json(db, model_key, &out, &err);
    else if (!e)
        e = print_text(db, model_key, view, mount, wide, &err);
    jlm_rdb_close(db);
    if (e) {
        jlm_cli_error("jlm stats", err.msg);
        return 1;
    }
    if (out)
        fputs(out, stdout);   /* JSON: jansson escaped every control byte */
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

/* The views directly inside dir (each a folder with a residency database):
 * their names, malloc'd; -1 if dir cannot be listed. */
static int mount_views(const char *dir, char ***names, size_t *n)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *de;
    *names = NULL;
    *n = 0;
    while ((de = readdir(d))) {
        char *p = NULL, *dbp = NULL, *key = NULL;
        struct stat st;
        int view = de->d_name[0] != '.' && asprintf(&p, "%s/%s", dir, de->d_name) >= 0 && stat(p, &st) == 0 &&
                   S_ISDIR(st.st_mode) && jlm_rdb_discover(p, &dbp, &key, NULL) == 0;
        char **nv = view ? realloc(*names, (*n + 1) * sizeof *nv) : NULL;
        if (nv) {
            *names = nv;
            if ((nv[*n] = strdup(de->d_name)))
                ++*n;
        }
        free(p); free(dbp); free(key);
    }
    closedir(d);
    return 0;
}

/* The picture of view dir/name to out (its residency from the view). */
static int html_view(const char *dir, const char *name, const char *out)
{
    char *p = NULL, *dbp = NULL, *key = NULL;
    int rc = 1;
    if (asprintf(&p, "%s/%s", dir, name) >= 0 && jlm_rdb_discover(p, &dbp, &key, NULL) == 0)
        rc = jlm_cli_picture("jlm stats", p, out, dbp, key);
    if (!rc)
        jlm_cli_errorf("jlm stats", "wrote %s", out);
    free(p); free(dbp); free(key);
    return rc;
}

/* --html on a mount: out an existing folder gets a page per view,
 * out/<view name>.html (each named on stderr); out a file takes the one
 * view of a mount that holds one, and is refused (2, nothing written) when
 * the mount holds several. */
static int html_mount(const char *dir, const char *out)
{
    char **names = NULL;
    size_t n = 0;
    struct stat st;
    int rc = 0, to_dir = stat(out, &st) == 0 && S_ISDIR(st.st_mode);
    if (mount_views(dir, &names, &n) != 0)
        return jlm_cli_errorf("jlm stats", "%s: cannot list it", dir), 1;
    if (!n)
        rc = (jlm_cli_errorf("jlm stats", "%s: a directory without jlmfs model views", dir), 1);
    else if (!to_dir && n > 1)
        rc = (jlm_cli_errorf("jlm stats", "-o %s: %s holds %zu models, a page each: give -o DIR, an existing folder",
                             out, dir, n), 2);
    else if (!to_dir)
        rc = html_view(dir, names[0], out);
    for (size_t i = 0; i < n; i++) {
        char *o = NULL;
        if (to_dir && asprintf(&o, "%s/%s.html", out, names[i]) >= 0)
            rc |= html_view(dir, names[i], o);
        free(o);
        free(names[i]);
    }
    free(names);
    return rc;
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
        jlm_cli_errorf("jlm stats", "%s: --html draws containers: give a jlmfs view or mount, not a database", path);
        return 1;
    }
    if (!out) {
        jlm_cli_errorf("jlm stats", "%s: --html on a mount writes a page per view: give -o DIR (or -o FILE for a "
                       "mount of one model)", path);
        return 2;
    }
    return html_mount(path, out);
}

static int stats_once(const char *path, int json, int wide);

int jlm_cmd_stats(int argc, char **argv)
{
    const char *path = NULL, *out = NULL;
    int json = 0, html = 0, wide = 0;
    float watch = 0;
    const jlm_opt t[] = {
        {NULL, "--json", JLM_OPT_FLAG, &json, 0, 0, 0, NULL, "JSON on stdout"},
        {NULL, "--wide", JLM_OPT_FLAG, &wide, 0, 0, 0, NULL, "every counter column (the view's stats file's table)"},
        {NULL, "--html", JLM_OPT_FLAG, &html, 0, 0, 0, NULL, "the residency picture as HTML"},
        {"-o", "--output", JLM_OPT_STR, &out, 0, 0, JLM_OPT_OUT, "FILE|DIR", "--html: write to FILE (default: stdout); on a mount: an existing DIR, a page per model (one model: FILE too)"},
        {"-w", "--watch", JLM_OPT_F32, &watch, 0.05, 86400, 0, "S", "print again every S seconds, like top (Ctrl-C ends)"},
    };
    const char *pos[1] = {0};
    jlm_opts_spec os = {"jlm stats", "MOUNT_OR_DB [options]", t, (int)(sizeof t / sizeof t[0]), pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    path = os.n_pos ? pos[0] : NULL;
    if (!path || (json && html) || (out && !html) || (wide && (json || html))) {
        fputs(USAGE, stderr);
        return 2;
    }
    if (html)
        return stats_html(path, out);
    if (watch > 0 && json)
        return jlm_cli_error("jlm stats", "--watch redraws the text: not with --json"), 2;
    if (watch <= 0)
        return stats_once(path, json, wide);
    int tty = isatty(1), rc;
    for (;;) {   /* until Ctrl-C, or an error */
        if (tty)
            fputs("\033[H\033[2J", stdout);   /* home, clear: one screen redrawn */
        rc = stats_once(path, 0, wide);
        if (!tty)
            putchar('\n');   /* a log: frames separated by a blank line */
        fflush(stdout);
        if (rc)
            return rc;
        struct timespec ts = {(time_t)watch, (long)((watch - (float)(time_t)watch) * 1e9f)};
        nanosleep(&ts, NULL);
    }
}

static int stats_once(const char *path, int json, int wide)
{
    jlm_err err = {0};
    char *dbp = NULL, *key = NULL;
    if (jlm_rdb_discover(path, &dbp, &key, &err) == 0) {   /* a view */
        int rc = print_db(dbp, key, json, wide, path, NULL);
        free(dbp);
        free(key);
        return rc;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        jlm_cli_errorf("jlm stats", "%s: no such file or directory", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        return print_db(path, NULL, json, wide, NULL, NULL);
    char **dbs = NULL;
    size_t n = 0;
    if (scan_mount(path, &dbs, &n) != 0 || n == 0) {
        jlm_cli_errorf("jlm stats", "%s: a directory without jlmfs model views (no user.jlmfs.db attribute on it "
                       "or its entries)", path);
        free(dbs);
        return 1;
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        rc |= print_db(dbs[i], NULL, json, wide, NULL, path);
        free(dbs[i]);
    }
    free(dbs);
    return rc;
}
