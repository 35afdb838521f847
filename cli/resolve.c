/* resolve.c - the MODEL argument of run, chat, info, tokenize and bench: a
 * .jlm or a jlmfs view as given, a GGUF converted once into the per-user
 * cache (docs/cli.md, "Running a GGUF"). The engine still reads only .jlm. */
#include "cli/cli.h"
#include "converter/convert.h"
#include "converter/hf.h"
#include "format/sums.h"
#include "residency/residency.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <unistd.h>

static char *g_resolved;   /* what jlm_cli_resolve_model returned; freed at exit */
static char *g_part;       /* the .part a signal must remove (as cmd_convert.c) */

static void free_resolved(void)
{
    free(g_resolved);
    g_resolved = NULL;
}

static void on_signal(int sig)
{
    if (g_part)
        unlink(g_part);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* mkdir -p of an absolute or relative path, each new level 0700. */
static int mkdirs(char *p)
{
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        int rc = mkdir(p, 0700);
        *s = '/';
        if (rc && errno != EEXIST)
            return -1;
    }
    return mkdir(p, 0700) && errno != EEXIST ? -1 : 0;
}

/* $XDG_CACHE_HOME/jlm (an absolute XDG_CACHE_HOME only, as the XDG spec
 * says), else $HOME/.cache/jlm; created. NULL with *why set on failure. */
char *jlm_cli_cache_dir(const char **why)
{
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    char *d = NULL;
    if (x && x[0] == '/') {
        if (asprintf(&d, "%s/jlm", x) < 0)
            d = NULL;
    } else if (h && *h) {
        if (asprintf(&d, "%s/.cache/jlm", h) < 0)
            d = NULL;
    } else {
        *why = "no cache directory: neither XDG_CACHE_HOME nor HOME is set";
        return NULL;
    }
    if (!d)
        *why = "out of memory";
    else if (mkdirs(d)) {
        *why = strerror(errno);
        free(d);
        d = NULL;
    }
    return d;
}

/* DIR/STEM@dev-ino-size-mtime.ns.vVERSION.jlm: a new source (replaced,
 * rewritten, touched) or a new format version gets a new entry, as the jlmfs
 * cache names its entries (fs/view.c cache_name). */
static char *cache_name(const char *dir, const char *src, const struct stat *st)
{
    const char *b = strrchr(src, '/');
    b = b ? b + 1 : src;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf"))
        n -= 5;
    if (n > 120)
        n = 120;   /* the name stays under NAME_MAX with its suffixes */
    char *out = NULL;
    if (asprintf(&out, "%s/%.*s@%llx-%llx-%llx-%lld.%09ld.v%u.jlm", dir, (int)n, b, (unsigned long long)st->st_dev,
                 (unsigned long long)st->st_ino, (unsigned long long)st->st_size, (long long)st->st_mtim.tv_sec,
                 st->st_mtim.tv_nsec, JLM_VERSION) < 0)
        out = NULL;
    for (char *p = out ? out + strlen(dir) + 1 : NULL; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '_';
    return out;
}

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Converts src to out under an exclusive flock on the cache directory dir
 * (no lock file is left behind), unless a run that held the lock before us
 * already did. The plan is made before the notice, so a malformed source is
 * one error line. 0, or 1 with the error printed. */
static int convert_locked(const char *who, const char *dir, const char *src, const char *out)
{
    char *part = NULL;
    if (asprintf(&part, "%s.part", out) < 0) {
        fprintf(stderr, "%s: out of memory\n", who);
        return 1;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 1;
    if (fd < 0 || flock(fd, LOCK_EX)) {
        fprintf(stderr, "%s: %s: %s\n", who, dir, strerror(errno));
        goto out;
    }
    if (is_file(out)) {   /* a concurrent run converted it while we waited */
        rc = 0;
        goto out;
    }
    jlm_err err = {0};
    jlm_conv *c = NULL;
    if (jlm_conv_open(src, NULL, &c, &err) == 0) {
        const char *b = strrchr(src, '/');
        char line[8192];   /* through jlm_cli_error: a control byte in a name prints as '?' */
        snprintf(line, sizeof line, "converting %s into the cache (%s) ...", b && b[1] ? b + 1 : src, out);
        jlm_cli_error(who, line);
        g_part = part;
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        signal(SIGHUP, on_signal);
        jlm_cli_bar bar;
        jlm_cli_bar_init(&bar, who, jlm_cli_bar_mode(0));
        rc = jlm_conv_write(c, out, NULL, jlm_cli_progress, &bar, &err) ? 1 : 0;
        jlm_cli_bar_end(&bar);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        g_part = NULL;
    }
    jlm_conv_close(c);
    if (rc)
        jlm_cli_error(who, err.msg);
out:
    if (fd >= 0)
        close(fd);   /* releases the lock */
    free(part);
    return rc;
}

/* Holds a shared flock on the cache entry `out` until exit (the fd is never
 * closed): what `jlm rm` and `jlm cache prune` test with a non-blocking
 * exclusive flock before removing an entry, so an entry a live process runs
 * is never removed, and a dead one's lock is gone with it. Also stamps the
 * entry's atime ("last used" of jlm list; set explicitly, relatime or not).
 * 0 when held; 1 when the entry was removed between the lookup and the lock
 * (a prune won the race: convert again); -1 on another error. */
static int hold_entry(const char *out)
{
    int fd = open(out, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return errno == ENOENT ? 1 : -1;
    if (flock(fd, LOCK_SH) || fstat(fd, &st)) {
        close(fd);
        return -1;
    }
    if (st.st_nlink == 0) {
        close(fd);
        return 1;
    }
    struct timespec ts[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    (void)futimens(fd, ts);
    return 0;   /* fd kept open: the lock lasts as long as the process */
}

/* After `out` was made: removes the older entries of the same source (the
 * name up to and including its "@dev-ino-" part, for a touched or rewritten
 * file) that no process holds, so a touched GGUF leaves no duplicate. */
static void prune_siblings(const char *dir, const char *out, size_t prefix_len)
{
    const char *base = out + strlen(dir) + 1;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (strncmp(de->d_name, base, prefix_len) || !strcmp(de->d_name, base) || n < 4 ||
            strcmp(de->d_name + n - 4, ".jlm"))
            continue;
        char *p = NULL;
        if (asprintf(&p, "%s/%s", dir, de->d_name) < 0)
            break;
        jlm_cli_entry_remove(p);
        free(p);
    }
    if (d)
        closedir(d);
}

int jlm_cli_entry_remove(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    int rc = -1;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        rc = unlink(path) ? -1 : 0;   /* under the lock: a run that opened it sees nlink 0 and converts again */
        char *sums = rc ? NULL : jlm_sums_path(path);
        if (sums)   /* its checksums (docs/checksums.md) go with it */
            unlink(sums);
        free(sums);
    }
    else if (errno == EWOULDBLOCK)
        rc = 1;
    close(fd);
    return rc;
}

/* The length of "STEM@dev-ino-" (GGUF) or "NAME@dev-ino-h" (folder) in the
 * entry file name base: the part naming the source, not its version. */
static size_t source_prefix(const char *base)
{
    const char *at = strrchr(base, '@');
    if (!at)
        return 0;
    const char *p = strchr(at, '-');
    p = p ? strchr(p + 1, '-') : NULL;
    return p ? (size_t)(p - base) + 1 : 0;
}

/* The entry out, held (hold_entry), converted first if it is not there (or
 * was pruned meanwhile); older entries of the same source pruned after a
 * conversion. 0, or 1 with the error printed. */
static int ensure_entry(const char *who, const char *dir, const char *src, const char *out)
{
    for (int tries = 0; tries < 3; tries++) {
        int made = 0;
        if (!is_file(out)) {
            if (convert_locked(who, dir, src, out))
                return 1;
            made = 1;
        }
        int h = hold_entry(out);
        if (h < 0) {
            fprintf(stderr, "%s: %s: %s\n", who, out, strerror(errno));
            return 1;
        }
        if (h == 0) {
            size_t pl = source_prefix(out + strlen(dir) + 1);
            if (made && pl)
                prune_siblings(dir, out, pl);
            return 0;
        }
    }
    fprintf(stderr, "%s: %s: removed while starting, three times\n", who, out);
    return 1;
}

/* The cached .jlm of the GGUF src, converted first if it is not there. */
static char *resolve_gguf(const char *who, const char *src)
{
    struct stat st;
    const char *why = NULL;
    if (stat(src, &st)) {
        fprintf(stderr, "%s: %s: %s\n", who, src, strerror(errno));
        return NULL;
    }
    char *dir = jlm_cli_cache_dir(&why);
    if (!dir) {
        fprintf(stderr, "%s: %s: cannot use the cache: %s\n", who, src, why);
        return NULL;
    }
    char *out = cache_name(dir, src, &st);
    if (!out)
        fprintf(stderr, "%s: out of memory\n", who);
    else if (ensure_entry(who, dir, src, out)) {
        free(out);
        out = NULL;
    }
    free(dir);
    return out;
}

/* FNV-1a 64 over n bytes, continuing from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The identity of a Hugging Face folder, as jlmfs takes it (fs/hfdir.c): a
 * hash of (name, ino, size, mtime) of every *.json and *.safetensors file
 * directly in it (a symlink, as in a Hugging Face hub snapshot whose files
 * link to its blobs, by the file it names: a retargeted link is a new
 * source), each hashed on its own and XORed (readdir's order does
 * not matter). A shard or config.json added, replaced, rewritten or touched
 * changes it; a README or an editor's temp file does not. 0 if the folder
 * cannot be listed (errno set). */
static uint64_t hf_ident(const char *src)
{
    DIR *d = opendir(src);
    if (!d)
        return 0;
    uint64_t acc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        struct stat st;
        if (!((n > 5 && !strcmp(de->d_name + n - 5, ".json")) ||
              (n > 12 && !strcmp(de->d_name + n - 12, ".safetensors"))) ||
            fstatat(dirfd(d), de->d_name, &st, 0) || !S_ISREG(st.st_mode))
            continue;
        uint64_t h = fnv(1469598103934665603ull, de->d_name, n + 1);
        int64_t f[4] = {(int64_t)st.st_ino, (int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
        acc ^= fnv(h, f, sizeof f);
    }
    closedir(d);
    return acc ? acc : 1;
}

/* The cached .jlm of the Hugging Face folder src, converted first if it is not
 * there: DIR/NAME@dev-ino-hHASH.vVERSION.jlm, NAME the folder's last path
 * component, (dev, ino) the folder's, HASH its files' identity (hf_ident). */
static char *resolve_hf(const char *who, const char *src)
{
    struct stat st;
    const char *why = NULL;
    uint64_t id;
    if (stat(src, &st) || !(id = hf_ident(src))) {
        fprintf(stderr, "%s: %s: %s\n", who, src, strerror(errno));
        return NULL;
    }
    char *dir = jlm_cli_cache_dir(&why);
    if (!dir) {
        fprintf(stderr, "%s: %s: cannot use the cache: %s\n", who, src, why);
        return NULL;
    }
    size_t n = strlen(src);
    while (n > 1 && src[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && src[b - 1] != '/')
        b--;
    size_t len = n - b > 120 ? 120 : n - b;   /* the name stays under NAME_MAX with its suffixes */
    char *out = NULL;
    if (asprintf(&out, "%s/%.*s@%llx-%llx-h%016llx.v%u.jlm", dir, (int)len, src + b, (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino, (unsigned long long)id, JLM_VERSION) < 0)
        out = NULL;
    for (char *p = out ? out + strlen(dir) + 1 : NULL; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || (*p == '.' && p == out + strlen(dir) + 1))
            *p = '_';   /* a control byte, or a leading dot ("." as the folder) */
    if (!out)
        fprintf(stderr, "%s: out of memory\n", who);
    else if (ensure_entry(who, dir, src, out)) {
        free(out);
        out = NULL;
    }
    free(dir);
    return out;
}

/* A directory given as MODEL must be a jlmfs model view with a container:
 * a view whose conversion failed has only `status` ("error: <reason>"), and
 * that line is the answer, not "model.jlm: No such file or directory". A
 * view being converted has its model.jlm at once (on-demand packing,
 * docs/jlmfs.md), so it runs, after a one-line note (its first pages may be
 * slow: they are packed as they are read). 0 when dir/model.jlm is there; 1
 * with one line printed. */
static int check_view(const char *who, const char *dir)
{
    char *p = NULL, line[512] = "";
    if (asprintf(&p, "%s/status", dir) < 0) {
        fprintf(stderr, "%s: out of memory\n", who);
        return 1;
    }
    FILE *f = fopen(p, "r");
    free(p);
    if (f) {
        if (!fgets(line, sizeof line, f))
            line[0] = 0;
        fclose(f);
        line[strcspn(line, "\n")] = 0;
    }
    if (asprintf(&p, "%s/model.jlm", dir) < 0) {
        fprintf(stderr, "%s: out of memory\n", who);
        return 1;
    }
    struct stat st;
    int ok = stat(p, &st) == 0, e = errno;
    free(p);
    char msg[1200];
    if (ok && !strncmp(line, "converting", 10)) {
        snprintf(msg, sizeof msg, "note: %s is still converting (%s); pages not converted yet are packed as they are "
                 "read", dir, line);
        jlm_cli_error(who, msg);
    }
    if (ok)
        return 0;
    if (!strncmp(line, "error", 5))
        snprintf(msg, sizeof msg, "%s: status: %s", dir, line);
    else if (line[0])
        snprintf(msg, sizeof msg, "%s: the view has no model.jlm yet (status: %s)", dir, line);
    else
        snprintf(msg, sizeof msg, "%s: a directory without model.jlm (%s): not a jlmfs model view or a Hugging Face "
                 "folder", dir, strerror(e));
    jlm_cli_error(who, msg);   /* a control byte in a name or reason prints as '?' */
    return 1;
}

/* The jlmfs view beside a GGUF read through a mount (MNT/x.gguf -> MNT/x.jlm,
 * a directory carrying the view's attributes), else NULL: inside a mount the
 * daemon has converted it already, the per-user cache would copy it. */
static char *sibling_view(const char *src)
{
    size_t n = strlen(src);
    if (n <= 5 || strcmp(src + n - 5, ".gguf"))
        return NULL;
    char *v = NULL, *db = NULL, *key = NULL;
    struct stat st;
    jlm_err err = {0};
    if (asprintf(&v, "%.*s.jlm", (int)(n - 5), src) < 0)
        return NULL;
    if (stat(v, &st) == 0 && S_ISDIR(st.st_mode) && jlm_rdb_discover(v, &db, &key, &err) == 0) {
        free(db);
        free(key);
        return v;
    }
    free(v);
    return NULL;
}

const char *jlm_cli_resolve_model(const char *who, const char *model)
{
    char *r;
    struct stat st;
    int held = 0;   /* a cache entry: ensure_entry holds it already */
    if (jlm_cli_is_gguf(model) && (r = sibling_view(model))) {
        if (check_view(who, r)) {
            free(r);
            return NULL;
        }
    } else if (jlm_cli_is_gguf(model))
        r = resolve_gguf(who, model), held = 1;
    else if (jlm_hf_is_folder(model))
        r = resolve_hf(who, model), held = 1;
    else if (stat(model, &st) == 0 && S_ISDIR(st.st_mode) && check_view(who, model)) {
        return NULL;
    } else if (!(r = strdup(model)))
        fprintf(stderr, "%s: out of memory\n", who);
    if (r && !held && stat(r, &st) == 0) {
        /* a jlmfs view's model.jlm, or a .jlm where it lies: held as a cache
         * entry is held, so `jlm ps` finds the process (best effort: rm and
         * prune remove only cache entries) */
        char *f = NULL;
        if (S_ISDIR(st.st_mode) ? asprintf(&f, "%s/model.jlm", r) >= 0 : (f = strdup(r)) != NULL) {
            /* O_NONBLOCK: a FIFO in the model's place must not block here;
             * the engine's open refuses it in one line */
            int fd = open(f, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
            struct stat fs;
            if (fd >= 0 && (fstat(fd, &fs) || !S_ISREG(fs.st_mode) || flock(fd, LOCK_SH | LOCK_NB)))
                close(fd);
        }
        free(f);
    }
    if (r) {
        if (!g_resolved)
            atexit(free_resolved);
        free(g_resolved);
        g_resolved = r;
    }
    return r;
}
