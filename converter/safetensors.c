/* safetensors.c - shard headers, the shard index and reads (see safetensors.h).
 *
 * Shape: parse each shard's JSON header into jlm_st_tensor records (phase 1:
 * fields, phase 2: the byte layout of the data section), then sort the whole
 * set by name once and refuse duplicates, so lookups are a binary search. */
#include "converter/safetensors.h"
#include "converter/gguf.h"
#include "base/beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct jlm_st_set {
    uint32_t       n_files;
    char         **paths;
    int           *fds;        /* -1 for the in-memory shard */
    uint64_t      *sizes;
    const uint8_t *mem;
    uint64_t       n, cap;
    jlm_st_tensor *t;
    uint64_t       total;
};

/* ---------------------------------------------------------------- header */
static int dtype_of(const char *s, uint32_t *type, uint32_t *size)
{
    static const struct { const char *n; uint32_t t, sz; } D[] = {
        {"F32", GGML_F32, 4}, {"F16", GGML_F16, 2}, {"BF16", GGML_BF16, 2}, {"U8", JLM_ST_U8, 1},
    };
    for (size_t i = 0; i < sizeof D / sizeof D[0]; i++)
        if (!strcmp(s, D[i].n)) {
            *type = D[i].t;
            *size = D[i].sz;
            return 1;
        }
    return 0;
}

static int u64_of(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

static int grow(jlm_st_set *s)
{
    if (s->n < s->cap)
        return 1;
    uint64_t nc = s->cap ? s->cap * 2 : 64;
    jlm_st_tensor *t = realloc(s->t, nc * sizeof *t);
    if (!t)
        return 0;
    s->t = t;
    s->cap = nc;
    return 1;
}

/* Phase 1: one entry's dtype, shape and offsets (relative to the data section). */
static int parse_entry(jlm_st_set *s, const char *what, const char *name, json_t *v, uint32_t file,
                       jlm_err *err)
{
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
    json_t *of = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(of) ||
        json_array_size(of) != 2)
        return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%.200s': needs dtype, shape and data_offsets [begin, end]",
                        what, name);
    uint32_t type, esz;
    if (!dtype_of(json_string_value(dt), &type, &esz))
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: tensor '%.200s': dtype %.40s is not supported (F32, F16, BF16, U8)",
                        what, name, json_string_value(dt));
    size_t nd = json_array_size(sh);
    if (nd > JLM_ST_MAX_DIMS)
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: tensor '%.200s': %zu dimensions (at most %d)", what, name, nd,
                        JLM_ST_MAX_DIMS);
    if (!grow(s))
        return jlm_errf(err, JLM_ENOMEM, "%s: tensor table", what);
    jlm_st_tensor *t = &s->t[s->n];
    memset(t, 0, sizeof *t);
    uint64_t bytes = esz, b, e;
    for (size_t d = 0; d < nd; d++) {
        if (!u64_of(json_array_get(sh, d), &t->shape[d]))
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%.200s': shape[%zu] is not a non-negative integer",
                            what, name, d);
        if (t->shape[d] && bytes > UINT64_MAX / 2 / t->shape[d])
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%.200s': shape overflows", what, name);
        bytes *= t->shape[d];
    }
    if (!u64_of(json_array_get(of, 0), &b) || !u64_of(json_array_get(of, 1), &e) || e < b)
        return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%.200s': data_offsets are not 0 <= begin <= end", what, name);
    if (e - b != bytes)
        return jlm_errf(err, JLM_EFORMAT,
                        "%s: tensor '%.200s': data_offsets span %" PRIu64 " bytes, shape x %s needs %" PRIu64,
                        what, name, e - b, json_string_value(dt), bytes);
    if (!(t->name = strdup(name)))
        return jlm_errf(err, JLM_ENOMEM, "%s: tensor name", what);
    t->dtype = type;
    t->n_dims = (uint32_t)nd;
    t->file = file;
    t->off = b;
    t->n_bytes = bytes;
    s->n++;
    return 0;
}

static int cmp_off(const void *a, const void *b)
{
    const jlm_st_tensor *x = *(const jlm_st_tensor *const *)a, *y = *(const jlm_st_tensor *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Phase 2: the entries of one shard tile its data section exactly; offsets
 * become absolute. */
static int check_layout(jlm_st_set *s, uint64_t first, const char *what, uint64_t data0, uint64_t data_len,
                        jlm_err *err)
{
    uint64_t n = s->n - first;
    jlm_st_tensor **v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return jlm_errf(err, JLM_ENOMEM, "%s: layout check", what);
    for (uint64_t i = 0; i < n; i++)
        v[i] = &s->t[first + i];
    qsort(v, n, sizeof *v, cmp_off);
    uint64_t at = 0;
    int rc = 0;
    for (uint64_t i = 0; i < n && !rc; i++) {
        const jlm_st_tensor *t = v[i];
        if (t->off + t->n_bytes > data_len)
            rc = jlm_errf(err, JLM_EFORMAT,
                          "%s: tensor '%s': data [%" PRIu64 ", %" PRIu64 ") past the end of the data section (%" PRIu64
                          " bytes): truncated file?", what, t->name, t->off, t->off + t->n_bytes, data_len);
        else if (t->off < at)
            rc = jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': data at %" PRIu64 " overlaps '%s' (ends at %" PRIu64 ")",
                          what, t->name, t->off, v[i - 1]->name, at);
        else if (t->off > at)
            rc = jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': data at %" PRIu64 " leaves a hole after offset %" PRIu64,
                          what, t->name, t->off, at);
        at = t->off + t->n_bytes;
    }
    if (!rc && at != data_len)
        rc = jlm_errf(err, JLM_EFORMAT, "%s: %" PRIu64 " bytes after the last tensor's data", what, data_len - at);
    for (uint64_t i = 0; i < n && !rc; i++)
        s->t[first + i].off += data0;
    free(v);
    return rc;
}

int jlm_st_parse(jlm_st_set *s, const uint8_t *buf, size_t len, uint64_t file_size, uint32_t file, jlm_err *err)
{
    const char *what = jlm_st_file(s, file);
    if (len < 8 || file_size < 8)
        return jlm_errf(err, JLM_EFORMAT, "%s: %" PRIu64 " bytes, shorter than the 8-byte header length", what,
                        file_size);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)buf[i] << (8 * i);
    if (hl > JLM_ST_HEADER_CAP || hl > file_size - 8)
        return jlm_errf(err, JLM_EFORMAT, "%s: header length %" PRIu64 " exceeds %s (%" PRIu64 " bytes)", what, hl,
                        hl > JLM_ST_HEADER_CAP ? "the 100 MiB cap" : "the file", hl > JLM_ST_HEADER_CAP ? JLM_ST_HEADER_CAP : file_size - 8);
    if (len - 8 < hl)
        return jlm_errf(err, JLM_EFORMAT, "%s: header of %" PRIu64 " bytes not read", what, hl);
    json_error_t je;
    json_t *h = json_loadb((const char *)buf + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
    if (!h || !json_is_object(h)) {
        json_decref(h);
        return jlm_errf(err, JLM_EFORMAT, "%s: header is not a JSON object (%s at byte %d)", what,
                        h ? "not an object" : je.text, h ? 0 : je.position + 8);
    }
    uint64_t first = s->n;
    int rc = 0;
    const char *k;
    json_t *v;
    json_object_foreach(h, k, v) {
        if (!strcmp(k, "__metadata__"))
            continue;
        if ((rc = parse_entry(s, what, k, v, file, err)))
            break;
    }
    json_decref(h);
    if (!rc)
        rc = check_layout(s, first, what, 8 + hl, file_size - 8 - hl, err);
    return rc;
}

/* ---------------------------------------------------------------- the set */
static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const jlm_st_tensor *)a)->name, ((const jlm_st_tensor *)b)->name);
}

static int finish(jlm_st_set *s, jlm_err *err)
{
    qsort(s->t, s->n, sizeof *s->t, cmp_name);
    for (uint64_t i = 1; i < s->n; i++)
        if (!strcmp(s->t[i].name, s->t[i - 1].name))
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s' also in %s", jlm_st_file(s, s->t[i].file),
                            s->t[i].name, jlm_st_file(s, s->t[i - 1].file));
    return 0;
}

static jlm_st_set *new_set(uint32_t n_files)
{
    jlm_st_set *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->paths = calloc(n_files, sizeof *s->paths);
    s->fds = malloc(n_files * sizeof *s->fds);
    s->sizes = calloc(n_files, sizeof *s->sizes);
    if (!s->paths || !s->fds || !s->sizes) {
        free(s->paths); free(s->fds); free(s->sizes); free(s);
        return NULL;
    }
    for (uint32_t i = 0; i < n_files; i++)
        s->fds[i] = -1;
    s->n_files = n_files;
    return s;
}

void jlm_st_close(jlm_st_set *s)
{
    if (!s)
        return;
    for (uint32_t i = 0; i < s->n_files; i++) {
        if (s->fds[i] >= 0)
            close(s->fds[i]);
        free(s->paths[i]);
    }
    for (uint64_t i = 0; i < s->n; i++)
        free((char *)s->t[i].name);
    free(s->paths); free(s->fds); free(s->sizes); free(s->t);
    free(s);
}

int jlm_st_open_mem(const void *buf, size_t len, const char *what, jlm_st_set **out, jlm_err *err)
{
    jlm_st_set *s = new_set(1);
    if (!s || !(s->paths[0] = strdup(what ? what : "<memory>"))) {
        jlm_st_close(s);
        return jlm_errf(err, JLM_ENOMEM, "safetensors set");
    }
    s->mem = buf;
    s->sizes[0] = s->total = len;
    int rc = jlm_st_parse(s, buf, len, len, 0, err);
    if (!rc)
        rc = finish(s, err);
    if (rc) {
        jlm_st_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* A file of the folder dir_fd: below it and following no symlink when
 * beneath (the daemon's sources, docs/security.md), else as openat does. */
static int open_in(int dir_fd, int beneath, const char *name, int flags)
{
    return beneath ? jlm_open_beneath(dir_fd, name, flags, 0) : openat(dir_fd, name, flags | O_CLOEXEC);
}

static int exists_in(int dir_fd, int beneath, const char *name)
{
    struct stat st;
    return fstatat(dir_fd, name, &st, beneath ? AT_SYMLINK_NOFOLLOW : 0) == 0;
}

/* Opens shard i (paths[i] set, for messages; name inside dir_fd) and parses its header. */
static int open_shard(jlm_st_set *s, uint32_t i, int dir_fd, int beneath, const char *name, jlm_err *err)
{
    const char *p = s->paths[i];
    /* O_NONBLOCK: a FIFO named like a shard is refused below, never waited on */
    int fd = open_in(dir_fd, beneath, name, O_RDONLY | O_NONBLOCK);
    if (fd < 0)
        return jlm_errf(err, errno == ENOENT ? JLM_ENOTFOUND : JLM_EIO, "%s: %s", p, strerror(errno));
    s->fds[i] = fd;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return jlm_errf(err, JLM_EIO, "%s: not a readable regular file", p);
    uint64_t size = (uint64_t)st.st_size, hl = 0;
    uint8_t b8[8];
    if (size >= 8 && pread(fd, b8, 8, 0) != 8)
        return jlm_errf(err, JLM_EIO, "%s: read of the header length failed", p);
    for (int k = 0; size >= 8 && k < 8; k++)
        hl |= (uint64_t)b8[k] << (8 * k);
    size_t want = size < 8 ? 0 : 8 + (size_t)(hl <= JLM_ST_HEADER_CAP && hl <= size - 8 ? hl : 0);
    uint8_t *buf = malloc(want + 1);
    if (!buf)
        return jlm_errf(err, JLM_ENOMEM, "%s: header of %zu bytes", p, want);
    ssize_t got = want ? pread(fd, buf, want, 0) : 0;
    int rc = got == (ssize_t)want ? jlm_st_parse(s, buf, want, size, i, err)
                                  : jlm_errf(err, JLM_EIO, "%s: read of the header failed", p);
    free(buf);
    s->sizes[i] = size;
    s->total += size;
    return rc;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* The distinct shard names of the index's weight_map, in first-seen order. */
static int index_files(const char *ipath, json_t *wm, const char ***names, uint32_t *n, jlm_err *err)
{
    size_t cap = json_object_size(wm);
    const char **v = calloc(cap ? cap : 1, sizeof *v);
    if (!v)
        return jlm_errf(err, JLM_ENOMEM, "%s", ipath);
    uint32_t k = 0;
    const char *key;
    json_t *f;
    json_object_foreach(wm, key, f) {
        const char *fn = json_string_value(f);
        if (!fn || !*fn || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, "..")) {
            free(v);
            return jlm_errf(err, JLM_EFORMAT, "%s: weight_map['%.200s'] is not a file name in the folder", ipath, key);
        }
        uint32_t j = 0;
        while (j < k && strcmp(v[j], fn))
            j++;
        if (j == k)
            v[k++] = fn;
    }
    *names = v;
    *n = k;
    return 0;
}

/* Every tensor the index maps is in the shard it names, and nothing else is. */
static int check_index(const jlm_st_set *s, const char *ipath, json_t *wm, const char **names, jlm_err *err)
{
    if (json_object_size(wm) != s->n)
        return jlm_errf(err, JLM_EFORMAT, "%s: weight_map lists %zu tensors, the shards hold %" PRIu64, ipath,
                        json_object_size(wm), s->n);
    const char *key;
    json_t *f;
    json_object_foreach(wm, key, f) {
        const jlm_st_tensor *t = jlm_st_find(s, key);
        if (!t)
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%.200s' is in no shard", ipath, key);
        if (strcmp(names[t->file], json_string_value(f)))
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%.200s' is in %s, the index says %s", ipath, key,
                            names[t->file], json_string_value(f));
    }
    return 0;
}

static int open_index(int dir_fd, int beneath, const char *dir, const char *ipath, jlm_st_set **out, jlm_err *err)
{
    json_error_t je = {.text = ""};
    int ifd = open_in(dir_fd, beneath, "model.safetensors.index.json", O_RDONLY | O_NONBLOCK);
    if (ifd < 0)
        return jlm_errf(err, JLM_EIO, "%s: %s", ipath, strerror(errno));
    FILE *f = fdopen(ifd, "r");
    json_t *j = f ? json_loadf(f, JSON_REJECT_DUPLICATES, &je) : NULL, *wm = json_object_get(j, "weight_map");
    if (f)
        fclose(f);
    else
        close(ifd);
    if (!json_is_object(wm)) {
        json_decref(j);
        return jlm_errf(err, JLM_EFORMAT, "%s: %s", ipath, j ? "no weight_map object" : je.text);
    }
    const char **names = NULL;
    uint32_t n = 0;
    int rc = index_files(ipath, wm, &names, &n, err);
    jlm_st_set *s = rc ? NULL : new_set(n ? n : 1);
    if (!rc && !s)
        rc = jlm_errf(err, JLM_ENOMEM, "%s", ipath);
    for (uint32_t i = 0; !rc && i < n; i++)
        rc = (s->paths[i] = join(dir, names[i])) ? open_shard(s, i, dir_fd, beneath, names[i], err)
                                                 : jlm_errf(err, JLM_ENOMEM, "%s", ipath);
    if (!rc)
        rc = finish(s, err);
    if (!rc)
        rc = check_index(s, ipath, wm, names, err);
    free(names);
    json_decref(j);
    if (rc) {
        jlm_st_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

int jlm_st_open_dirfd(int dir_fd, int beneath, const char *dir, jlm_st_set **out, jlm_err *err)
{
    char *ipath = join(dir, "model.safetensors.index.json"), *one = join(dir, "model.safetensors");
    int rc;
    if (!ipath || !one) {
        rc = jlm_errf(err, JLM_ENOMEM, "%s", dir);
    } else if (exists_in(dir_fd, beneath, "model.safetensors.index.json")) {
        rc = open_index(dir_fd, beneath, dir, ipath, out, err);
    } else if (!exists_in(dir_fd, beneath, "model.safetensors")) {
        rc = jlm_errf(err, JLM_ENOTFOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
    } else {
        jlm_st_set *s = new_set(1);
        rc = s && (s->paths[0] = strdup(one)) ? open_shard(s, 0, dir_fd, beneath, "model.safetensors", err)
                                              : jlm_errf(err, JLM_ENOMEM, "%s", one);
        if (!rc)
            rc = finish(s, err);
        if (rc)
            jlm_st_close(s);
        else
            *out = s;
    }
    free(ipath);
    free(one);
    return rc;
}

int jlm_st_open_dir(const char *dir, jlm_st_set **out, jlm_err *err)
{
    int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return jlm_errf(err, errno == ENOENT ? JLM_ENOTFOUND : JLM_EIO, "%s: %s", dir, strerror(errno));
    int rc = jlm_st_open_dirfd(dfd, 0, dir, out, err);
    close(dfd);
    return rc;
}

/* ---------------------------------------------------------------- completeness */
int jlm_st_image_complete(const uint8_t *img, size_t have, uint64_t file_size)
{
    if (file_size < 8 || have < 8)
        return 0;
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++)
        hl |= (uint64_t)img[k] << (8 * k);
    if (hl > JLM_ST_HEADER_CAP)
        return 1;   /* not a header being copied: a bad one, refused when planned */
    if (hl > file_size - 8 || hl > have - 8)
        return 0;   /* the header is not all there yet */
    json_t *j = json_loadb((const char *)img + 8, (size_t)hl, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return 1;   /* all there but not a header: complete, and refused when planned */
    }
    uint64_t end = 0;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        json_t *o = json_object_get(v, "data_offsets");
        uint64_t e;
        if (json_is_array(o) && u64_of(json_array_get(o, 1), &e) && e > end)
            end = e;
    }
    json_decref(j);
    return end <= file_size - 8 - hl;
}

/* 1 if shard `name` (below dir_fd, no symlink) is complete
 * (jlm_st_image_complete); 0 (why filled) while it is shorter, or absent. */
static int shard_complete(int dir_fd, const char *name, char *why, size_t n)
{
    int fd = jlm_open_beneath(dir_fd, name, O_RDONLY | O_NONBLOCK, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(why, n, "%s: %s", name, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return 0;
    }
    uint64_t size = (uint64_t)st.st_size, hl = 0;
    uint8_t b8[8];
    int ok = 0;
    if (size >= 8 && pread(fd, b8, 8, 0) == 8) {
        for (int k = 0; k < 8; k++)
            hl |= (uint64_t)b8[k] << (8 * k);
        size_t want = hl <= JLM_ST_HEADER_CAP && hl <= size - 8 ? 8 + (size_t)hl : 8;
        uint8_t *img = malloc(want);
        ok = img && pread(fd, img, want, 0) == (ssize_t)want && jlm_st_image_complete(img, want, size);
        free(img);
    }
    close(fd);
    if (!ok)
        snprintf(why, n, "%s: %llu bytes, shorter than its header says (still being copied?)", name,
                 (unsigned long long)size);
    return ok;
}

int jlm_st_dir_complete(int dir_fd, char *why, size_t n)
{
    struct stat st;
    if (fstatat(dir_fd, "config.json", &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
        return snprintf(why, n, "no config.json"), 0;
    if (fstatat(dir_fd, "model.safetensors.index.json", &st, AT_SYMLINK_NOFOLLOW))
        return shard_complete(dir_fd, "model.safetensors", why, n);
    int ifd = jlm_open_beneath(dir_fd, "model.safetensors.index.json", O_RDONLY | O_NONBLOCK, 0);
    FILE *f = ifd >= 0 ? fdopen(ifd, "r") : NULL;
    json_t *j = f ? json_loadf(f, 0, NULL) : NULL, *wm = json_object_get(j, "weight_map");
    if (f)
        fclose(f);
    else if (ifd >= 0)
        close(ifd);
    if (!json_is_object(wm)) {   /* half-written, or bad: a bad one stays without a view */
        json_decref(j);
        return snprintf(why, n, "model.safetensors.index.json has no weight_map (yet)"), 0;
    }
    const char **names = NULL;
    uint32_t k = 0;
    jlm_err e;
    int ok = !index_files("model.safetensors.index.json", wm, &names, &k, &e);
    if (!ok)
        snprintf(why, n, "%s", e.msg);
    for (uint32_t i = 0; ok && i < k; i++)
        ok = shard_complete(dir_fd, names[i], why, n);
    free(names);
    json_decref(j);
    return ok;
}

/* ---------------------------------------------------------------- lookups, reads */
uint64_t jlm_st_count(const jlm_st_set *s) { return s->n; }
const jlm_st_tensor *jlm_st_at(const jlm_st_set *s, uint64_t i) { return i < s->n ? &s->t[i] : NULL; }
const char *jlm_st_file(const jlm_st_set *s, uint32_t f) { return f < s->n_files && s->paths[f] ? s->paths[f] : "?"; }
uint64_t jlm_st_total_bytes(const jlm_st_set *s) { return s->total; }

const jlm_st_tensor *jlm_st_find(const jlm_st_set *s, const char *name)
{
    jlm_st_tensor key = {.name = name};
    return bsearch(&key, s->t, s->n, sizeof *s->t, cmp_name);
}

int jlm_st_read(const jlm_st_set *s, const jlm_st_tensor *t, uint64_t off, void *buf, size_t n, jlm_err *err)
{
    if (off > t->n_bytes || n > t->n_bytes - off)
        return jlm_errf(err, JLM_EINVAL, "%s: tensor '%s': read past its %" PRIu64 " bytes", jlm_st_file(s, t->file),
                        t->name, t->n_bytes);
    uint64_t at = t->off + off;   /* inside the shard: invariant (2) */
    if (s->mem) {
        memcpy(buf, s->mem + at, n);
        return 0;
    }
    for (size_t done = 0; done < n;) {
        ssize_t got = pread(s->fds[t->file], (char *)buf + done, n - done, (off_t)(at + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return jlm_errf(err, JLM_EIO, "%s: tensor '%s': read at offset %" PRIu64 ": %s", jlm_st_file(s, t->file),
                            t->name, at + done, got < 0 ? strerror(errno) : "unexpected end of file (shard shrank?)");
        done += (size_t)got;
    }
    return 0;
}
