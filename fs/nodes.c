/* nodes.c - paths of the mount to nodes, and what each node shows: its
 * attributes, listing, bytes, text and extended attributes. */
#include "fs/jlmfs_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- parsing */
/* A decimal index without sign, spaces or leading zeros ("0", "12"). */
static int parse_index(const char *s, size_t n, int64_t *out)
{
    if (!n || n > 9 || (s[0] == '0' && n > 1))
        return -1;
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        x = x * 10 + (s[i] - '0');
    }
    *out = x;
    return 0;
}

static int span(jlmfs_node *n, uint64_t off, uint64_t len)
{
    n->kind = JLMFS_SPAN;
    n->off = off;
    n->len = len;
    return 0;
}

static int dir(jlmfs_node *n, int what) { n->kind = JLMFS_DIR; n->what = what; return 0; }
static int text(jlmfs_node *n, int what) { n->kind = JLMFS_TEXT; n->what = what; return 0; }

/* Names inside a view: rest is "" (the view dir) or "blocks/3" etc. */
static int resolve_in_view(jlmfs *fs, jlmfs_view *v, const char *rest, jlmfs_node *n)
{
    if (!*rest)
        return dir(n, JLMFS_W_VIEW);
    if (!strcmp(rest, "status"))
        return text(n, JLMFS_W_STATUS);
    if (jlmfs_view_state(v, NULL, NULL, 0) == JLMFS_ERROR)
        return -1;   /* invariant 4 */
    const jlm_header *h = &v->plan->hdr;
    const char *slash = strchr(rest, '/');
    size_t head = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *leaf = slash ? slash + 1 : NULL;
    int64_t i, e;
#define IS(s) (head == strlen(s) && !strncmp(rest, s, head))
    if (!leaf) {
        if (IS("model.jlm")) return span(n, 0, v->file_size);
        if (IS("dense")) return span(n, h->dense_off, h->dense_len);
        if (IS("config.json")) return text(n, JLMFS_W_CONFIG);
        if (IS("tensors")) return text(n, JLMFS_W_TENSORS);
        if (IS("stats")) return text(n, JLMFS_W_STATS);
        if (IS("layout.html")) return text(n, JLMFS_W_LAYOUT);
        if (IS("blocks")) return dir(n, JLMFS_W_BLOCKS);
        if (IS("resident")) return dir(n, JLMFS_W_RESIDENT);
        if (IS("vision") && h->n_vis_blocks) return dir(n, JLMFS_W_VISION);
        if (IS("experts") && h->n_exp_pages) return dir(n, JLMFS_W_EXPERTS);
        return -1;
    }
    if (strchr(leaf, '/'))
        return -1;
    if (IS("blocks") && !parse_index(leaf, strlen(leaf), &i) && i < h->n_blocks)
        return span(n, h->data_off + (uint64_t)i * h->page_size, h->page_size);
    if (IS("vision") && !parse_index(leaf, strlen(leaf), &i) && i < h->n_vis_blocks)
        return span(n, h->vis_data_off + (uint64_t)i * h->vis_page_size, h->vis_page_size);
    const char *dot = strchr(leaf, '.');
    uint64_t off;
    if (IS("experts") && dot && !parse_index(leaf, (size_t)(dot - leaf), &i) &&
        !parse_index(dot + 1, strlen(dot + 1), &e) && !jlmfs_view_expert_page(v, (int32_t)i, (int32_t)e, &off))
        return span(n, off, h->exp_page_size);
    if (IS("resident")) {
        char **names;
        size_t k;
        jlm_err err;
        int found = 0;
        if (!jlmfs_db_names(fs, v->key, &names, &k, &err)) {
            for (size_t j = 0; j < k; j++)
                found |= !strcmp(names[j], leaf);
            jlm_rdb_free_names(names, k);
        }
        n->kind = JLMFS_EMPTY;
        return found ? 0 : -1;
    }
#undef IS
    return -1;
}

int jlmfs_resolve(jlmfs *fs, const char *path, jlmfs_node *out, jlm_err *err)
{
    while (*path == '/')
        path++;
    size_t cl = fs->cache_rel ? strlen(fs->cache_rel) : 0;
    if (cl && !strncmp(path, fs->cache_rel, cl) && (!path[cl] || path[cl] == '/'))
        return jlm_errf(err, JLM_ENOTFOUND, "%s: hidden (the cache folder)", path);
    /* The first component x.jlm whose x.gguf (else whose Hugging Face
     * folder x/) has a view makes a view path. */
    for (const char *c = path; *c;) {
        const char *end = strchr(c, '/');
        size_t n = end ? (size_t)(end - c) : strlen(c);
        if (n > 4 && !strncmp(c + n - 4, ".jlm", 4)) {
            char *rel = NULL;
            if (asprintf(&rel, "%.*s.gguf", (int)(c - path + n - 4), path) < 0)
                return jlm_errf(err, JLM_ENOMEM, "out of memory");
            jlmfs_view *v = jlmfs_sync_view(fs, rel);
            if (!v) {
                rel[c - path + n - 4] = 0;   /* the folder x */
                v = jlmfs_sync_view(fs, rel);
            }
            free(rel);
            if (v) {
                jlmfs_node nd = {.view = v};
                if (resolve_in_view(fs, v, end ? end + 1 : "", &nd)) {
                    jlmfs_view_unref(v);
                    return jlm_errf(err, JLM_ENOTFOUND, "%s: no such view file", path);
                }
                *out = nd;
                return JLM_OK;
            }
        }
        c += n;
        while (*c == '/')
            c++;
    }
    jlmfs_node nd = {.kind = JLMFS_PASS};
    nd.rel = strdup(path);
    if (nd.rel && asprintf(&nd.real, "%s%s%s", fs->src, *path ? "/" : "", path) < 0)
        nd.real = NULL;
    if (!nd.rel || !nd.real) {
        free(nd.rel);
        free(nd.real);
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    }
    *out = nd;
    return JLM_OK;
}

void jlmfs_node_clear(jlmfs_node *n)
{
    jlmfs_view_unref(n->view);
    free(n->real);
    free(n->rel);
    *n = (jlmfs_node){0};
}

uint64_t jlmfs_node_version(const jlmfs_node *n)
{
    return n->view ? n->view->serial : 0;
}

/* ---------------------------------------------------------------- attributes */
int jlmfs_node_stat(jlmfs *fs, const jlmfs_node *n, struct stat *st, jlm_err *err)
{
    const jlmfs_view *v = n->view;
    struct stat s = {0};
    s.st_uid = v->dir_st.st_uid;
    s.st_gid = v->dir_st.st_gid;
    s.st_atim = s.st_mtim = s.st_ctim = v->dir_st.st_mtim;
    s.st_blksize = 4096;
    /* who may read the GGUF may read its view, nobody else (the kernel checks:
     * default_permissions); directories searchable where readable */
    mode_t r = v->dir_st.st_mode & 0444;
    if (n->kind == JLMFS_DIR) {
        s.st_mode = S_IFDIR | r | (r >> 2);
        s.st_nlink = 2;
    } else {
        s.st_mode = S_IFREG | r;
        s.st_nlink = 1;
        if (n->kind == JLMFS_SPAN) {
            s.st_size = (off_t)n->len;
        } else if (n->kind == JLMFS_TEXT) {
            char *t;
            size_t len;
            int rc = jlmfs_text(fs, n, &t, &len, err);
            if (rc)
                return rc;
            free(t);
            s.st_size = (off_t)len;
        }
        s.st_blocks = (s.st_size + 511) / 512;
    }
    *st = s;
    return JLM_OK;
}

/* ---------------------------------------------------------------- listings */
static int list_view(jlmfs *fs, jlmfs_view *v, int what, jlmfs_fill_fn fill, void *ctx, jlm_err *err)
{
    struct stat d = {.st_mode = S_IFDIR | 0555}, f = {.st_mode = S_IFREG | 0444};
    char name[64];
    if (what == JLMFS_W_VIEW) {
        if (jlmfs_view_state(v, NULL, NULL, 0) == JLMFS_ERROR)
            return fill(ctx, "status", &f), JLM_OK;
        const jlm_header *h = &v->plan->hdr;
        static const char *files[] = {"model.jlm", "status", "config.json", "tensors", "dense", "stats", "layout.html"};
        for (size_t i = 0; i < sizeof files / sizeof *files; i++)
            if (fill(ctx, files[i], &f))
                return JLM_OK;
        if (fill(ctx, "blocks", &d) || fill(ctx, "resident", &d) ||
            (h->n_vis_blocks && fill(ctx, "vision", &d)) || (h->n_exp_pages && fill(ctx, "experts", &d)))
            return JLM_OK;
        return JLM_OK;
    }
    if (what == JLMFS_W_RESIDENT) {
        char **names;
        size_t k;
        int rc = jlmfs_db_names(fs, v->key, &names, &k, err);
        if (rc)
            return rc;
        for (size_t j = 0; j < k && !fill(ctx, names[j], &f); j++)
            ;
        jlm_rdb_free_names(names, k);
        return JLM_OK;
    }
    for (uint32_t u = 0; u < v->n_units; u++) {
        const jlmfs_unit *un = &v->units[u];
        if ((what == JLMFS_W_BLOCKS && un->arr == JLMFS_A_BLOCKS) || (what == JLMFS_W_VISION && un->arr == JLMFS_A_VISION))
            snprintf(name, sizeof name, "%d", un->a);
        else if (what == JLMFS_W_EXPERTS && un->arr == JLMFS_A_EXPERTS)
            snprintf(name, sizeof name, "%d.%d", un->a, un->b);
        else
            continue;
        if (fill(ctx, name, &f))
            break;
    }
    return JLM_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A SRC folder: its entries minus the cache folder and minus real entries a
 * view shadows, plus x.jlm for each x.gguf that has a view. */
static int list_pass(jlmfs *fs, const jlmfs_node *n, jlmfs_fill_fn fill, void *ctx, jlm_err *err)
{
    DIR *d = opendir(n->real);
    if (!d)
        return jlm_errf(err, errno == ENOENT ? JLM_ENOTFOUND : JLM_EIO, "%s: %s", n->real, strerror(errno));
    char **views = NULL;
    size_t nv = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {   /* pass 1: which GGUFs and Hugging Face folders have views */
        size_t l = strlen(de->d_name);
        int folder = de->d_type == DT_DIR || de->d_type == DT_UNKNOWN;
        if (folder && de->d_name[0] == '.' && (l == 1 || (l == 2 && de->d_name[1] == '.')))
            continue;
        if (!folder && (l <= 5 || strcmp(de->d_name + l - 5, ".gguf")))
            continue;
        if (folder && l > 5 && !strcmp(de->d_name + l - 5, ".gguf"))
            folder = 0;
        char *rel = NULL;
        if (asprintf(&rel, "%s%s%s", n->rel, *n->rel ? "/" : "", de->d_name) < 0)
            break;
        jlmfs_view *v = jlmfs_sync_view(fs, rel);
        free(rel);
        if (!v)
            continue;
        jlmfs_view_unref(v);
        if (nv == cap) {
            char **nvw = realloc(views, (cap = cap ? cap * 2 : 8) * sizeof *views);
            if (!nvw)
                break;
            views = nvw;
        }
        if (asprintf(&views[nv], "%.*s.jlm", (int)(folder ? l : l - 5), de->d_name) >= 0)
            nv++;
    }
    if (nv)   /* views is NULL when none: qsort and bsearch want an array */
        qsort(views, nv, sizeof *views, cmp_str);
    size_t u = 0;   /* x.gguf and the folder x both give x.jlm: listed once */
    for (size_t i = 0; i < nv; i++) {
        if (u && !strcmp(views[u - 1], views[i]))
            free(views[i]);
        else
            views[u++] = views[i];
    }
    nv = u;
    rewinddir(d);
    const char *hide = NULL;   /* the cache's name if it sits in this folder */
    if (fs->cache_rel) {
        const char *slash = strrchr(fs->cache_rel, '/');
        size_t pl = slash ? (size_t)(slash - fs->cache_rel) : 0;
        if (strlen(n->rel) == pl && !strncmp(n->rel, fs->cache_rel, pl))
            hide = slash ? slash + 1 : fs->cache_rel;
    }
    int stop = 0;
    while (!stop && (de = readdir(d))) {   /* pass 2: fill */
        const char *nm = de->d_name;
        if ((hide && !strcmp(nm, hide)) || (nv && bsearch(&nm, views, nv, sizeof *views, cmp_str)))
            continue;
        struct stat st = {.st_ino = de->d_ino, .st_mode = (mode_t)(DTTOIF(de->d_type))};
        stop = fill(ctx, nm, &st);
    }
    struct stat vd = {.st_mode = S_IFDIR | 0555};
    for (size_t i = 0; i < nv; i++) {
        if (!stop)
            stop = fill(ctx, views[i], &vd);
        free(views[i]);
    }
    free(views);
    closedir(d);
    return JLM_OK;
}

int jlmfs_list(jlmfs *fs, const jlmfs_node *n, jlmfs_fill_fn fill, void *ctx, jlm_err *err)
{
    if (n->kind == JLMFS_PASS)
        return list_pass(fs, n, fill, ctx, err);
    if (n->kind != JLMFS_DIR)
        return jlm_errf(err, JLM_EINVAL, "not a folder");
    return list_view(fs, n->view, n->what, fill, ctx, err);
}

/* ---------------------------------------------------------------- bytes and texts */
int jlmfs_read(jlmfs *fs, const jlmfs_node *n, void *buf, size_t size, uint64_t off, size_t *got, jlm_err *err)
{
    if (n->kind != JLMFS_SPAN)
        return jlm_errf(err, JLM_EINVAL, "not a span file");
    if (off >= n->len) {
        *got = 0;
        return JLM_OK;
    }
    size_t len = n->len - off < size ? (size_t)(n->len - off) : size;   /* clamp to the file */
    int rc = jlmfs_view_read(n->view, n->off + off, len, buf, err);
    if (!rc)
        *got = len;
    return rc;
}

static int dup_text(const char *s, char **out, size_t *len, jlm_err *err)
{
    char *t = strdup(s);
    if (!t)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    *out = t;
    *len = strlen(t);
    return JLM_OK;
}

int jlmfs_text(jlmfs *fs, const jlmfs_node *n, char **out, size_t *len, jlm_err *err)
{
    jlmfs_view *v = n->view;
    char buf[1100], msg[1024];
    int pct;
    switch (n->what) {
    case JLMFS_W_STATUS:
        switch (jlmfs_view_state(v, &pct, msg, sizeof msg)) {
        case JLMFS_READY: snprintf(buf, sizeof buf, "ready\n"); break;
        case JLMFS_CONVERTING: {   /* "converting 37% (212 MiB of 573 MiB)" */
            uint64_t done, total;
            jlmfs_view_progress(v, &done, &total);
            const char *unit = total >= (10ull << 30) ? "GiB" : total >= (10ull << 20) ? "MiB" : "KiB";
            int shift = total >= (10ull << 30) ? 30 : total >= (10ull << 20) ? 20 : 10;
            snprintf(buf, sizeof buf, "converting %d%% (%llu %s of %llu %s)\n", pct,
                     (unsigned long long)(done >> shift), unit, (unsigned long long)(total >> shift), unit);
            break;
        }
        default: snprintf(buf, sizeof buf, "error: %s\n", msg); break;
        }
        return dup_text(buf, out, len, err);
    case JLMFS_W_CONFIG: return dup_text(v->config_json, out, len, err);
    case JLMFS_W_TENSORS: return dup_text(v->tensors_txt, out, len, err);
    case JLMFS_W_STATS: {
        char *s;
        jlm_err e;
        if (jlmfs_db_stats(fs, v->key, &s, &e)) {
            snprintf(buf, sizeof buf, "stats unavailable: %s\n", e.msg);
            return dup_text(buf, out, len, err);
        }
        *out = s;
        *len = strlen(s);
        return JLM_OK;
    }
    case JLMFS_W_LAYOUT: return jlmfs_db_layout(fs, v, out, len, err);
    default: return jlm_errf(err, JLM_EINVAL, "not a text file");
    }
}

/* ---------------------------------------------------------------- extended attributes */
#define XA_DB    "user.jlmfs.db"
#define XA_MODEL "user.jlmfs.model"

int jlmfs_getxattr(jlmfs *fs, const jlmfs_node *n, const char *name, char **val, size_t *len, jlm_err *err)
{
    const char *s = !strcmp(name, XA_DB) ? fs->db_path : !strcmp(name, XA_MODEL) ? n->view->key : NULL;
    if (!s)
        return jlm_errf(err, JLM_ENOTFOUND, "%s: no attribute %s", n->view->key, name);
    return dup_text(s, val, len, err);
}

int jlmfs_listxattr(jlmfs *fs, const jlmfs_node *n, char **names, size_t *len, jlm_err *err)
{
    static const char list[] = XA_DB "\0" XA_MODEL;
    char *p = malloc(sizeof list);
    if (!p)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    memcpy(p, list, sizeof list);
    *names = p;
    *len = sizeof list;
    return JLM_OK;
}
