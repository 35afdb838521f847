/* cmd_models.c - model management as ollama users expect it: `jlm list`,
 * `jlm show`, `jlm rm`, `jlm ps` and `jlm cache ls|verify|prune` over the per-user
 * cache (cli/resolve.c), jlmfs mounts and --models folders (docs/cli.md,
 * "Managing models"). An entry is in use while a process holds its shared
 * flock (resolve.c holds one for as long as it runs the entry); rm and prune
 * remove only under a non-blocking exclusive flock. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "converter/convert.h"
#include "converter/hf.h"
#include "format/jlm_format.h"
#include "residency/residency.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- describing a model */
typedef struct desc {
    char arch[32], type[16];
    double params;
    uint32_t n_ctx;
} desc;

static double tensor_elems(const jlm_tensor *t)
{
    double n = 1;
    for (int d = 0; d < t->ndim && d < 4; d++)
        n *= (double)t->dims[d];
    return n;
}

/* Architecture, parameter count and the type holding most parameters. */
static void describe(desc *d, const jlm_config *c, const jlm_tensor *ts, uint32_t n)
{
    double by_type[64] = {0};
    snprintf(d->arch, sizeof d->arch, "%s", jlm_fmt_arch_name(c->arch));
    d->params = 0;
    d->n_ctx = c->n_ctx;
    for (uint32_t i = 0; i < n; i++) {
        double e = tensor_elems(&ts[i]);
        d->params += e;
        by_type[ts[i].type & 63] += e;
    }
    int best = -1;
    for (int k = 0; k < 64; k++)
        if (by_type[k] > 0 && (best < 0 || by_type[k] > by_type[best]))
            best = k;
    const jlm_type_traits *tr = best >= 0 ? jlm_fmt_type_traits((uint8_t)best) : NULL;
    snprintf(d->type, sizeof d->type, "%s", tr ? tr->name : "-");
}

/* A .jlm (or a view's model.jlm), a GGUF or a Hugging Face folder: 0 with d
 * filled, else 1 with err set. */
static int describe_path(const char *path, desc *d, jlm_err *err)
{
    if (jlm_cli_is_gguf(path) || jlm_hf_is_folder(path)) {
        jlm_conv *c = NULL;
        if (jlm_conv_open(path, NULL, &c, err))
            return 1;
        describe(d, &c->config, c->plan.tensors, c->plan.n_tensors);
        jlm_conv_close(c);
        return 0;
    }
    jlm_model *m = NULL;
    if (jlm_fmt_open(path, &m, err))
        return 1;
    describe(d, &m->config, m->tensors, m->hdr.n_tensors);
    jlm_fmt_close(m);
    return 0;
}

static void human_size(char *b, size_t n, double v)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (v >= 1024 && k < 4) {
        v /= 1024;
        k++;
    }
    snprintf(b, n, k ? "%.1f %s" : "%.0f %s", v, u[k]);
}

static void human_params(char *b, size_t n, double p)
{
    if (p >= 1e9)
        snprintf(b, n, "%.1fB", p / 1e9);
    else if (p >= 1e6)
        snprintf(b, n, "%.1fM", p / 1e6);
    else
        snprintf(b, n, "%.1fK", p / 1e3);
}

static void human_ago(char *b, size_t n, time_t t)
{
    double s = difftime(time(NULL), t);
    if (s < 0)
        s = 0;
    if (s < 120)
        snprintf(b, n, "%.0f seconds ago", s);
    else if (s < 7200)
        snprintf(b, n, "%.0f minutes ago", s / 60);
    else if (s < 172800)
        snprintf(b, n, "%.0f hours ago", s / 3600);
    else
        snprintf(b, n, "%.0f days ago", s / 86400);
}

/* Is a cache entry held by a running process? (A shared flock test.) */
static int entry_in_use(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    int busy = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return busy;
}

/* ---------------------------------------------------------------- cache entries */
typedef struct entry {
    char *path, *name;   /* name: the entry's stem (before '@') */
    off_t disk;          /* bytes on disk */
    time_t used;         /* atime: last run */
} entry;

static int cmp_used(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return (x->used > y->used) - (x->used < y->used);
}

/* The *.jlm entries of dir (not .part); malloc'd array, *n set. */
static entry *entries(const char *dir, size_t *n)
{
    DIR *d = opendir(dir);
    entry *v = NULL;
    size_t cap = 0;
    *n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        struct stat st;
        if (de->d_name[0] == '.' || l < 5 || strcmp(de->d_name + l - 4, ".jlm") ||
            fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
            continue;
        if (*n == cap) {
            entry *nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof *v);
            if (!nv)
                break;
            v = nv;
        }
        entry *e = &v[(*n)++];
        const char *at = strrchr(de->d_name, '@');
        e->name = strndup(de->d_name, at ? (size_t)(at - de->d_name) : l - 4);
        if (asprintf(&e->path, "%s/%s", dir, de->d_name) < 0)
            e->path = NULL;
        e->disk = (off_t)st.st_blocks * 512;
        e->used = st.st_atim.tv_sec;
        if (!e->name || !e->path)
            (*n)--;
    }
    if (d)
        closedir(d);
    return v;
}

static void entries_free(entry *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].path);
        free(v[i].name);
    }
    free(v);
}

/* Parses a command without options (--help only) into pos (at most max);
 * 0, or the exit status to return (0 after --help). */
static int parse_plain(const char *who, const char *usage, int argc, char **argv, const char **pos, int max,
                       int *n_pos, int *done)
{
    const jlm_opt t[] = {{NULL, NULL, JLM_OPT_FLAG, NULL, 0, 0, 0, NULL, NULL}};
    jlm_opts_spec os = {who, usage, t, 0, pos, max, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    *n_pos = os.n_pos;
    *done = prc != 0;
    return prc == 1 ? 0 : prc;
}

/* The per-user cache directory, or NULL with one line printed. */
static char *cache_or_say(const char *who)
{
    const char *why = NULL;
    char *dir = jlm_cli_cache_dir(&why);
    if (!dir)
        jlm_cli_errorf(who, "cannot use the cache: %s", why);
    return dir;
}

/* ---------------------------------------------------------------- jlm list */
static void list_row(const char *name, const char *path, off_t disk, time_t used, const char *where)
{
    desc d;
    jlm_err err = {0};
    char ps[16] = "-", sz[24], ago[32] = "-";
    if (describe_path(path, &d, &err)) {
        snprintf(d.arch, sizeof d.arch, "?");
        snprintf(d.type, sizeof d.type, "?");
    } else {
        human_params(ps, sizeof ps, d.params);
    }
    human_size(sz, sizeof sz, (double)disk);
    if (used)
        human_ago(ago, sizeof ago, used);
    printf("%-32s %-10s %8s %-6s %10s  %-16s %s\n", jlm_cli_clean(name), d.arch, ps, d.type, sz, ago,
           jlm_cli_clean(where));
}

/* Calls fn(dir, name, ctx) for each entry of dir but dot files. */
static void each_entry(const char *dir, void (*fn)(const char *dir, const char *name, void *ctx), void *ctx)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.')
            fn(dir, de->d_name, ctx);
    if (d)
        closedir(d);
}

/* The jlmfs mount points of /proc/mounts (fuse.jlmfs), malloc'd strings. */
static size_t jlmfs_mounts(char **out, size_t max)
{
    FILE *f = fopen("/proc/mounts", "r");
    size_t n = 0;
    char line[4096];
    while (f && n < max && fgets(line, sizeof line, f)) {
        char dev[1024], mnt[2048], type[256];
        if (sscanf(line, "%1023s %2047s %255s", dev, mnt, type) == 3 && strstr(type, "jlmfs"))
            out[n++] = strdup(mnt);
    }
    if (f)
        fclose(f);
    return n;
}

/* The mounts given, else every jlmfs mount; malloc'd strings in out. */
static size_t mounts_of(const char **pos, int n_pos, char **out, size_t max)
{
    size_t n = 0;
    for (int i = 0; i < n_pos && n < max; i++)
        out[n++] = strdup(pos[i]);
    return n_pos ? n : jlmfs_mounts(out, max);
}

/* A mount's model view (a directory with model.jlm) as a row. */
static void list_view(const char *mnt, const char *name, void *ctx)
{
    char *p = NULL;
    struct stat st;
    if (asprintf(&p, "%s/%s/model.jlm", mnt, name) < 0)
        return;
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
        list_row(name, p, st.st_size, st.st_atim.tv_sec, mnt);
    free(p);
}

/* Adds a regular file's bytes on disk to *(off_t *)ctx. */
static void add_disk(const char *dir, const char *name, void *ctx)
{
    struct stat st;
    char *p = NULL;
    if (asprintf(&p, "%s/%s", dir, name) >= 0 && stat(p, &st) == 0 && S_ISREG(st.st_mode))
        *(off_t *)ctx += (off_t)st.st_blocks * 512;
    free(p);
}

/* A --models folder's model (*.jlm, *.gguf, a Hugging Face folder) as a row. */
static void list_model(const char *dir, const char *name, void *ctx)
{
    char *p = NULL;
    struct stat st;
    size_t l = strlen(name);
    if (asprintf(&p, "%s/%s", dir, name) < 0)
        return;
    off_t disk = 0;
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode) && jlm_hf_is_folder(p)) {
        each_entry(p, add_disk, &disk);
        list_row(name, p, disk, st.st_atim.tv_sec, dir);
    } else if (stat(p, &st) == 0 && S_ISREG(st.st_mode) &&
               ((l > 4 && !strcmp(name + l - 4, ".jlm")) || jlm_cli_is_gguf(p))) {
        list_row(name, p, (off_t)st.st_blocks * 512, st.st_atim.tv_sec, dir);
    }
    free(p);
}

int jlm_cmd_list(int argc, char **argv)
{
    const char *models = NULL;
    const jlm_opt t[] = {
        {NULL, "--models", JLM_OPT_STR, &models, 0, 0, 0, "DIR", "also list the models of DIR (.jlm, .gguf, HF folders)"},
    };
    const char *pos[32] = {0};
    jlm_opts_spec os = {"jlm list", "[MOUNT...] [--models DIR]", t, 1, pos, 32, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    char *dir = cache_or_say("jlm list");
    if (!dir)
        return 1;
    printf("%-32s %-10s %8s %-6s %10s  %-16s %s\n", "NAME", "ARCH", "PARAMS", "TYPE", "SIZE", "LAST USED", "WHERE");
    size_t n;
    entry *v = entries(dir, &n);
    for (size_t i = 0; i < n; i++)
        list_row(v[i].name, v[i].path, v[i].disk, v[i].used, entry_in_use(v[i].path) ? "cache (in use)" : "cache");
    entries_free(v, n);
    free(dir);
    char *mnts[64];
    size_t nm = mounts_of(pos, os.n_pos, mnts, 64);
    for (size_t i = 0; i < nm; i++) {
        if (mnts[i])
            each_entry(mnts[i], list_view, NULL);
        free(mnts[i]);
    }
    if (models)
        each_entry(models, list_model, NULL);
    return 0;
}

/* ---------------------------------------------------------------- jlm show */
/* MODEL as a path, else the newest cache entry named MODEL; malloc'd. */
static char *find_model(const char *model)
{
    struct stat st;
    if (stat(model, &st) == 0)
        return strdup(model);
    const char *why = NULL;
    char *dir = jlm_cli_cache_dir(&why), *best = NULL;
    if (!dir)
        return NULL;
    size_t n;
    entry *v = entries(dir, &n);
    time_t bt = 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v[i].name, model) && (!best || v[i].used >= bt)) {
            free(best);
            best = strdup(v[i].path);
            bt = v[i].used;
        }
    entries_free(v, n);
    free(dir);
    return best;
}

static void show_template(const jlm_vocab *v)
{
    for (uint32_t i = 0; i < v->n_templates; i++)
        if (v->templates[2 * i].len == 0) {
            char *s = strndup(v->templates[2 * i + 1].s, v->templates[2 * i + 1].len);
            printf("\n  template\n");
            jlm_cli_puts_lines(s ? s : "", stdout);
            printf("\n");
            free(s);
            return;
        }
    printf("\n  template      none\n");
}

/* A Hugging Face folder's license: the `license:` field of its README.md's
 * front matter (the model card's YAML between two "---" lines). */
static void hf_license(const char *dir, char *out, size_t n)
{
    char *p = NULL, line[1024];
    if (asprintf(&p, "%s/README.md", dir) < 0)
        return;
    FILE *f = fopen(p, "r");
    free(p);
    if (!f)
        return;
    if (fgets(line, sizeof line, f) && !strncmp(line, "---", 3))
        while (fgets(line, sizeof line, f) && strncmp(line, "---", 3))
            if (!strncmp(line, "license:", 8)) {
                char *v = line + 8;
                v += strspn(v, " \t\"'");
                v[strcspn(v, "\"'\r\n")] = 0;
                snprintf(out, n, "%s", v);
                break;
            }
    fclose(f);
}

int jlm_cmd_show(int argc, char **argv)
{
    const char *pos[1] = {0};
    int n_pos, done, prc = parse_plain("jlm show", "MODEL (a path or a cache entry name)", argc, argv, pos, 1, &n_pos,
                                       &done);
    if (done)
        return prc;
    if (!n_pos) {
        jlm_cli_error("jlm show", "missing MODEL (a .jlm, GGUF, Hugging Face folder, view or cache entry name)");
        return 2;
    }
    char *path = find_model(pos[0]);
    if (!path) {
        jlm_cli_errorf("jlm show", "%s: no such file or cache entry (jlm list shows them)", pos[0]);
        return 1;
    }
    struct stat st;
    char *file = NULL;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && !jlm_hf_is_folder(path) &&
        asprintf(&file, "%s/model.jlm", path) >= 0) {
        free(path);
        path = file;
    }
    jlm_err err = {0};
    desc d;
    char ps[16];
    if (describe_path(path, &d, &err)) {
        jlm_cli_error("jlm show", err.msg);
        free(path);
        return 1;
    }
    human_params(ps, sizeof ps, d.params);
    printf("  Model\n    architecture    %s\n    parameters      %s\n    context length  %u\n    quantization    %s\n",
           d.arch, ps, d.n_ctx, d.type);
    char license[512] = "";
    if (jlm_cli_is_gguf(path) || jlm_hf_is_folder(path)) {
        jlm_conv *c = NULL;
        if (jlm_conv_open(path, NULL, &c, &err) == 0) {
            jlm_gguf_str s;
            if (jlm_gguf_get_str(c->g, "general.license", &s, NULL) == 0)
                snprintf(license, sizeof license, "%.*s", (int)s.len, s.s);
            else if (jlm_hf_is_folder(path))
                hf_license(path, license, sizeof license);
            show_template(&c->vocab);
            jlm_conv_close(c);
        }
    } else {
        jlm_model *m = NULL;
        if (jlm_fmt_open(path, &m, &err) == 0) {
            show_template(&m->vocab);
            jlm_fmt_close(m);
        }
    }
    if (license[0])
        printf("  License\n    %s\n", jlm_cli_clean(license));
    free(path);
    return 0;
}

/* ---------------------------------------------------------------- jlm rm */
int jlm_cmd_rm(int argc, char **argv)
{
    const char *pos[16] = {0};
    int n_pos, done, prc = parse_plain("jlm rm", "MODEL... (cache entry names, as jlm list shows them)", argc, argv,
                                       pos, 16, &n_pos, &done);
    if (done)
        return prc;
    if (!n_pos) {
        jlm_cli_error("jlm rm", "missing MODEL (a cache entry name, as jlm list shows it)");
        return 2;
    }
    char *dir = cache_or_say("jlm rm");
    if (!dir)
        return 1;
    size_t n;
    entry *v = entries(dir, &n);
    int status = 0;
    for (int k = 0; k < n_pos; k++) {
        int found = 0;
        for (size_t i = 0; i < n; i++) {
            const char *base = strrchr(v[i].path, '/') + 1;
            if (strcmp(v[i].name, pos[k]) && strcmp(base, pos[k]))
                continue;
            found = 1;
            int rc = jlm_cli_entry_remove(v[i].path);
            if (rc == 1) {
                jlm_cli_errorf("jlm rm", "%s: in use by a running process (%s): not removed", pos[k], base);
                status = 1;
            } else if (rc) {
                jlm_cli_errorf("jlm rm", "%s: %s", v[i].path, strerror(errno));
                status = 1;
            } else {
                printf("deleted '%s'\n", jlm_cli_clean(base));
            }
        }
        if (!found) {
            jlm_cli_errorf("jlm rm", "%s: no such cache entry (jlm list shows them)", pos[k]);
            status = 1;
        }
    }
    entries_free(v, n);
    free(dir);
    return status;
}

/* ---------------------------------------------------------------- jlm cache prune */
/* "30d", "12h", "90m", "45s", a plain number = days; -1 on error. */
static double parse_duration(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isdigit((unsigned char)*s))
        return -1;
    double mul = !*end || !strcmp(end, "d") ? 86400 : !strcmp(end, "h") ? 3600 : !strcmp(end, "m") ? 60
                 : !strcmp(end, "s")       ? 1
                                           : -1;
    return mul < 0 ? -1 : v * mul;
}

/* The entry a shared-cache .part ("X.jlm.<host>.part", fs/shared.c) is
 * converted to: its length in name, or 0 for another name. */
static size_t shared_part_entry(const char *name)
{
    size_t l = strlen(name);
    if (l < 27 || strcmp(name + l - 5, ".part") || name[l - 22] != '.' || strspn(name + l - 21, "0123456789abcdef") < 16)
        return 0;
    return l - 22 >= 4 && !strncmp(name + l - 26, ".jlm", 4) ? l - 22 : 0;
}

/* 1 while a host converts the entry name[0, n) (it holds NAME.lock). */
static int entry_converting(int dfd, const char *name, size_t n)
{
    char lk[512];
    if (!n || snprintf(lk, sizeof lk, "%.*s.lock", (int)n, name) >= (int)sizeof lk)
        return 0;
    int fd = openat(dfd, lk, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    int held = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) && errno == EWOULDBLOCK;
    if (fd >= 0)
        close(fd);
    return held;
}

/* The .part files a killed conversion left, when no conversion runs (the
 * converter holds the directory's flock while it writes one, resolve.c; a
 * shared-cache daemon holds its entry's lock). */
static void prune_parts(const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || flock(dfd, LOCK_EX | LOCK_NB)) {
        if (dfd >= 0)
            close(dfd);
        return;
    }
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 5 && !strcmp(de->d_name + l - 5, ".part") &&
            !entry_converting(dirfd(d), de->d_name, shared_part_entry(de->d_name)) &&
            unlinkat(dirfd(d), de->d_name, 0) == 0)
            printf("deleted '%s' (a conversion that did not finish)\n", jlm_cli_clean(de->d_name));
    }
    if (d)
        closedir(d);
    close(dfd);
}

static int prune(const char *dir, double older, long long max_size)
{
    prune_parts(dir);
    size_t n;
    entry *v = entries(dir, &n);
    qsort(v, n, sizeof *v, cmp_used);   /* least recently used first */
    long long total = 0;
    for (size_t i = 0; i < n; i++)
        total += v[i].disk;
    time_t now = time(NULL);
    int removed = 0, busy = 0, status = 0;
    long long freed = 0;
    for (size_t i = 0; i < n; i++) {
        const char *base = strrchr(v[i].path, '/') + 1;
        char ver[32];
        snprintf(ver, sizeof ver, ".v%u.jlm", JLM_VERSION);
        int stale_version = strlen(base) < strlen(ver) || strcmp(base + strlen(base) - strlen(ver), ver);
        int old = older >= 0 && difftime(now, v[i].used) >= older;
        int over = max_size >= 0 && total > max_size;
        if (!stale_version && !old && !over)
            continue;
        int rc = jlm_cli_entry_remove(v[i].path);
        if (rc == 0) {
            total -= v[i].disk;
            freed += v[i].disk;
            removed++;
            printf("deleted '%s'\n", jlm_cli_clean(base));
        } else if (rc == 1) {
            busy++;
        } else {
            jlm_cli_errorf("jlm cache prune", "%s: %s", v[i].path, strerror(errno));
            status = 1;
        }
    }
    char fs[24];
    human_size(fs, sizeof fs, (double)freed);
    printf("%d entr%s removed (%s), %d in use kept\n", removed, removed == 1 ? "y" : "ies", fs, busy);
    entries_free(v, n);
    return status;
}

/* ---------------------------------------------------------------- jlm cache ls | verify */
static const char CACHE_USAGE[] = "usage: jlm cache ls [DIR] | verify [DIR] | prune [DIR] [--older-than D] "
                                  "[--max-size S]\n";

/* The source an entry was made from: a shared entry's lock line names it
 * ("host H pid P converting REL"), a single-host entry's name begins with it. */
static void entry_source(int dfd, const char *name, size_t n, char *out, size_t on)
{
    char lk[512], line[512] = "";
    int fd = snprintf(lk, sizeof lk, "%.*s.lock", (int)n, name) < (int)sizeof lk
                 ? openat(dfd, lk, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
    ssize_t r = fd >= 0 ? read(fd, line, sizeof line - 1) : 0;
    if (fd >= 0)
        close(fd);
    line[r > 0 ? r : 0] = 0;
    line[strcspn(line, "\n")] = 0;
    const char *conv = strstr(line, " converting ");
    const char *at = memchr(name, '@', n);
    if (conv)
        snprintf(out, on, "%s", conv + 12);
    else
        snprintf(out, on, "%.*s", at ? (int)(at - name) : 1, at ? name : "-");
}

/* One row of `jlm cache ls` for the file name of dfd (an entry or a .part). */
static void ls_row(int dfd, const char *dir, const char *name, const struct stat *st)
{
    size_t l = strlen(name), sp = shared_part_entry(name);
    int part = l > 5 && !strcmp(name + l - 5, ".part"), entry = l > 4 && !strcmp(name + l - 4, ".jlm");
    size_t n = sp ? sp : part ? l - 5 : l;
    char src[256], sz[24], ver[32], path[4096], sums[4600], fail[4600], key[256];
    entry_source(dfd, name, n, src, sizeof src);
    snprintf(ver, sizeof ver, ".v%u.jlm", JLM_VERSION);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(sums, sizeof sums, "%.*s.sums", (int)n, name);
    snprintf(fail, sizeof fail, "%.*s.fail", (int)n, name);
    snprintf(key, sizeof key, "%.*s", (int)(n > 4 ? n - 4 : n), name);
    const char *state = part ? (entry_converting(dfd, name, n) ? "converting" : "partial")
                        : faccessat(dfd, fail, F_OK, 0) == 0 ? "failed"
                        : n < strlen(ver) || strcmp(name + n - strlen(ver), ver) ? "old-version"
                        : faccessat(dfd, sums, F_OK, 0) ? "no-checksums"
                                                          : "ready";
    int used = entry ? entry_in_use(path) : part && entry_converting(dfd, name, n);
    human_size(sz, sizeof sz, (double)st->st_size);
    printf("%-44s %-28s %10s  %-12s %s\n", jlm_cli_clean(key), jlm_cli_clean(src), sz, state, used ? "yes" : "no");
}

/* Calls fn for every entry (*.jlm) or, with parts, every .part of dir. */
static int each_cache_file(const char *dir, int parts, void (*fn)(int, const char *, const char *, const struct stat *))
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        struct stat st;
        int want = (l > 4 && !strcmp(de->d_name + l - 4, ".jlm")) || (parts && l > 5 && !strcmp(de->d_name + l - 5, ".part") &&
                   strcmp(de->d_name + (l > 10 ? l - 10 : 0), ".sums.part"));
        if (de->d_name[0] != '.' && want && !fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
            S_ISREG(st.st_mode))
            fn(dirfd(d), dir, de->d_name, &st);
    }
    closedir(d);
    return 0;
}

static int verify_bad;
static long verify_n;

static void verify_row(int dfd, const char *dir, const char *name, const struct stat *st)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    verify_n++;
    int rc = jlm_cli_verify_file(path);
    if (rc)
        verify_bad = 1;
}

/* `jlm cache ls|verify [DIR]`: 0, 1 (verify: some entry bad; a folder that
 * cannot be read), 2 (usage). */
static int cache_ls_verify(int argc, char **argv, int verify)
{
    const char *pos[1] = {0};
    jlm_opts_spec os = {verify ? "jlm cache verify" : "jlm cache ls",
                        verify ? "[DIR]   (every entry's pages against its checksums; exit 1 naming each bad page)"
                               : "[DIR]   (entries: key, source, size, state, in use)", NULL, 0, pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    const char *why = NULL;
    char *dir = os.n_pos ? strdup(pos[0]) : jlm_cli_cache_dir(&why);
    struct stat st;
    if (!dir || stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        jlm_cli_errorf(os.who, "%s: %s", dir ? dir : "cache", dir ? "not a directory" : why);
        free(dir);
        return 1;
    }
    if (!verify)
        printf("%-44s %-28s %10s  %-12s %s\n", "KEY", "SOURCE", "SIZE", "STATE", "IN-USE");
    verify_bad = 0;
    verify_n = 0;
    int rc = each_cache_file(dir, !verify, verify ? verify_row : ls_row);
    if (rc)
        jlm_cli_errorf(os.who, "%s: %s", dir, strerror(errno));
    else if (verify)
        printf("%ld entr%s checked, %s\n", verify_n, verify_n == 1 ? "y" : "ies",
               verify_bad ? "some do not match (named above)" : "every page matches");
    free(dir);
    return rc ? 1 : verify_bad ? 1 : 0;
}

int jlm_cmd_cache(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "ls") || !strcmp(argv[1], "verify")))
        return cache_ls_verify(argc - 1, argv + 1, !strcmp(argv[1], "verify"));
    if (argc < 2 || strcmp(argv[1], "prune")) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            fputs(CACHE_USAGE, stdout);
            return 0;
        }
        fputs(CACHE_USAGE, stderr);
        return 2;
    }
    const char *older_s = NULL, *max_s = NULL;
    const jlm_opt t[] = {
        {NULL, "--older-than", JLM_OPT_STR, &older_s, 0, 0, 0, "D",
         "remove entries not used for D (30d, 12h, 90m, 45s; a plain number is days)"},
        {NULL, "--max-size", JLM_OPT_STR, &max_s, 0, 0, 0, "S",
         "remove least recently used entries until the cache holds at most S (0: every entry not in use)"},
    };
    const char *pos[1] = {0};
    jlm_opts_spec os = {"jlm cache prune", "[DIR] [--older-than D] [--max-size S] (DIR: the per-user cache; entries "
                        "of another format version always go; an entry in use never)", t, 2, pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc - 1, argv + 1);
    if (prc)
        return prc == 1 ? 0 : prc;
    double older = older_s ? parse_duration(older_s) : -1;
    long long max_size = max_s ? jlm_cli_parse_size(max_s) : -1;
    if (older_s && older < 0) {
        jlm_cli_errorf("jlm cache prune", "--older-than %s: not a duration (30d, 12h, 90m, 45s)", older_s);
        return 2;
    }
    if (max_s && max_size < 0) {
        jlm_cli_errorf("jlm cache prune", "--max-size %s: not a size (0, 512M, 20G)", max_s);
        return 2;
    }
    const char *why = NULL;
    char *dir = os.n_pos ? strdup(pos[0]) : jlm_cli_cache_dir(&why);
    struct stat st;
    if (!dir || stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        jlm_cli_errorf("jlm cache prune", "%s: %s", dir ? dir : "cache", dir ? "not a directory" : why);
        free(dir);
        return 1;
    }
    int rc = prune(dir, older, max_size);
    free(dir);
    return rc;
}

/* ---------------------------------------------------------------- jlm ps */
typedef struct lockrow { long pid; unsigned maj, min; unsigned long long ino; int shown; } lockrow;

/* The shared flocks of /proc/locks (every `jlm run`, `chat`, `bench` and
 * `serve` holds its model so: cli/resolve.c). malloc'd. */
static lockrow *read_locks(size_t *n)
{
    FILE *f = fopen("/proc/locks", "r");
    lockrow *v = NULL;
    size_t cap = 0;
    char line[512];
    *n = 0;
    while (f && fgets(line, sizeof line, f)) {
        char kind[16], adv[16], mode[16];
        lockrow r = {0};
        if (sscanf(line, "%*s %15s %15s %15s %ld %x:%x:%llu", kind, adv, mode, &r.pid, &r.maj, &r.min, &r.ino) != 7 ||
            strcmp(kind, "FLOCK") || strcmp(mode, "READ"))
            continue;
        if (*n == cap) {
            lockrow *nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof *v);
            if (!nv)
                break;
            v = nv;
        }
        v[(*n)++] = r;
    }
    if (f)
        fclose(f);
    return v;
}

/* The residency session of pid on the view's model (its database,
 * residency/residency.h): budget, pages resident and their bytes. 0 when
 * found, -1 without a database or a session of that pid. */
static int session_of(const char *view, const jlm_model *m, long pid, uint64_t *budget, uint64_t *pages,
                      double *bytes)
{
    char *db = NULL, *key = NULL;
    jlm_rdb_session_info *v = NULL;
    size_t n = 0;
    jlm_err err = {0};
    jlm_rdb *r = NULL;
    int rc = -1;
    if (jlm_rdb_discover(view, &db, &key, &err) == 0 && jlm_rdb_open(db, JLM_RDB_READONLY, &r, &err) == 0 &&
        jlm_rdb_sessions(r, key, &v, &n, &err) == 0)
        for (size_t i = 0; i < n && rc; i++)
            if (v[i].pid == pid) {
                *budget = v[i].budget;
                *pages = v[i].pages[0] + v[i].pages[1] + v[i].pages[2];
                *bytes = (double)v[i].pages[0] * (double)m->hdr.page_size +
                         (double)v[i].pages[1] * (double)m->hdr.vis_page_size +
                         (double)v[i].pages[2] * (double)m->hdr.exp_page_size;
                rc = 0;
            }
    free(v);
    jlm_rdb_close(r);
    free(db);
    free(key);
    return rc;
}

/* One row per (pid, model) whose model file (path) a process holds. */
static void ps_rows(lockrow *lk, size_t nl, const char *name, const char *path, const char *view, const char *where)
{
    struct stat st;
    if (stat(path, &st))
        return;
    for (size_t i = 0; i < nl; i++) {
        if (st.st_ino != lk[i].ino || major(st.st_dev) != lk[i].maj || minor(st.st_dev) != lk[i].min ||
            lk[i].pid == (long)getpid() || lk[i].shown)
            continue;
        lk[i].shown = 1;
        jlm_model *m = NULL;
        jlm_err err = {0};
        char sz[24], rb[24] = "-", pages[32] = "-", bud[24] = "-";
        human_size(sz, sizeof sz, (double)st.st_size);
        uint64_t budget = 0, np = 0;
        double bytes = 0;
        if (jlm_fmt_open(path, &m, &err) == 0 && view && session_of(view, m, lk[i].pid, &budget, &np, &bytes) == 0) {
            snprintf(pages, sizeof pages, "%llu", (unsigned long long)np);
            human_size(rb, sizeof rb, bytes);
            if (budget)
                human_size(bud, sizeof bud, (double)budget);
        }
        printf("%-32s %8ld %-10s %10s %10s %12s %8s  %s\n", jlm_cli_clean(name), lk[i].pid,
               m ? jlm_fmt_arch_name(m->config.arch) : "?", sz, bud, rb, pages, jlm_cli_clean(where));
        jlm_fmt_close(m);
    }
}

typedef struct ps_ctx { lockrow *lk; size_t nl; } ps_ctx;

/* The other shared flocks a jlm process holds (a .jlm run where it lies):
 * the file is found among the process's open files (/proc/PID/fd, readable
 * for the user's own processes) by its device and inode. */
static void ps_other(lockrow *lk, size_t nl)
{
    char self[4096] = "", exe[4096], fdp[64], link[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return;
    self[n] = 0;
    for (size_t i = 0; i < nl; i++) {
        if (lk[i].shown || lk[i].pid == (long)getpid())
            continue;
        snprintf(fdp, sizeof fdp, "/proc/%ld/exe", lk[i].pid);
        n = readlink(fdp, exe, sizeof exe - 1);
        if (n <= 0)
            continue;
        exe[n] = 0;
        if (strcmp(exe, self))
            continue;   /* only jlm's own processes */
        snprintf(fdp, sizeof fdp, "/proc/%ld/fd", lk[i].pid);
        DIR *d = opendir(fdp);
        struct dirent *de;
        while (d && (de = readdir(d)) && !lk[i].shown) {
            struct stat st;
            snprintf(exe, sizeof exe, "%s/%s", fdp, de->d_name);
            if (stat(exe, &st) || st.st_ino != lk[i].ino || major(st.st_dev) != lk[i].maj ||
                minor(st.st_dev) != lk[i].min || (n = readlink(exe, link, sizeof link - 1)) <= 0)
                continue;
            link[n] = 0;
            char *slash = strrchr(link, '/');
            if (!slash)
                continue;
            *slash = 0;
            char *name = strdup(slash + 1), *full = NULL;
            if (name && asprintf(&full, "%s/%s", link, name) >= 0)
                ps_rows(&lk[i], 1, name, full, NULL, link[0] ? link : "/");
            free(name);
            free(full);
        }
        if (d)
            closedir(d);
    }
}

/* The rows of the processes holding a mount's view. */
static void ps_view(const char *mnt, const char *name, void *ctx)
{
    const ps_ctx *pc = ctx;
    char *view = NULL, *p = NULL;
    if (asprintf(&view, "%s/%s", mnt, name) >= 0 && asprintf(&p, "%s/model.jlm", view) >= 0)
        ps_rows(pc->lk, pc->nl, name, p, view, mnt);
    free(view);
    free(p);
}

int jlm_cmd_ps(int argc, char **argv)
{
    const char *pos[32] = {0};
    int n_pos, done, prc = parse_plain("jlm ps", "[MOUNT...] (default: the jlmfs mounts of /proc/mounts)", argc, argv,
                                       pos, 32, &n_pos, &done);
    if (done)
        return prc;
    char *dir = cache_or_say("jlm ps");
    if (!dir)
        return 1;
    size_t nl, n;
    lockrow *lk = read_locks(&nl);
    printf("%-32s %8s %-10s %10s %10s %12s %8s  %s\n", "NAME", "PID", "ARCH", "SIZE", "BUDGET", "RESIDENT", "PAGES",
           "WHERE");
    entry *v = entries(dir, &n);
    for (size_t i = 0; i < n; i++)
        ps_rows(lk, nl, v[i].name, v[i].path, NULL, "cache");
    entries_free(v, n);
    free(dir);
    char *mnts[64];
    size_t nm = mounts_of(pos, n_pos, mnts, 64);
    ps_ctx pc = {lk, nl};
    for (size_t k = 0; k < nm; k++) {
        if (mnts[k])
            each_entry(mnts[k], ps_view, &pc);
        free(mnts[k]);
    }
    ps_other(lk, nl);
    free(lk);
    return 0;
}
