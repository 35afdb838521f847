/* test_gguf.c - the GGUF reader against the real models of tests/models
 * (MANIFEST.jsonl, written by llama.cpp's gguf-py) and against files this
 * test writes itself (corruptions, split files). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "converter/gguf.h"

/* ---------------------------------------------------------------------
 * Fixtures
 * ------------------------------------------------------------------- */

static const char *root(void)
{
    const char *r = getenv("JLM_ROOT");
    return r && *r ? r : ".";
}

/* tests/models/NAME or tests/models/vocab/NAME, whichever exists. */
static void model_path(const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/tests/models/%s", root(), name);
    if (access(out, R_OK) != 0)
        snprintf(out, n, "%s/tests/models/vocab/%s", root(), name);
}

static uint8_t *load(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    cr_assert(b && fread(b, 1, (size_t)n, f) == (size_t)n, "reading %s", path);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void save(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(b, 1, n, f) == n && fclose(f) == 0, "writing %s", path);
}

static void tmpdir(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/jlm-gguf-XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static uint32_t type_id(const char *name)
{
    static const struct { const char *n; uint32_t id; } tab[] = {
        {"F32", 0}, {"F16", 1}, {"Q4_0", 2}, {"Q4_1", 3}, {"Q5_0", 6}, {"Q5_1", 7},
        {"Q8_0", 8}, {"Q8_1", 9}, {"Q2_K", 10}, {"Q3_K", 11}, {"Q4_K", 12}, {"Q5_K", 13},
        {"Q6_K", 14}, {"Q8_K", 15}, {"I8", 24}, {"I16", 25}, {"I32", 26}, {"I64", 27},
        {"F64", 28}, {"BF16", 30}, {"MXFP4", 39},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(tab[i].n, name))
            return tab[i].id;
    cr_assert_fail("manifest type %s not in the test's table", name);
    return 0;
}

/* Calls fn on every manifest line. */
static int for_each_manifest(void (*fn)(json_t *entry))
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/models/MANIFEST.jsonl", root());
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *e = json_loads(line, 0, &je);
        cr_assert(e, "MANIFEST line %d: %s", n + 1, je.text);
        fn(e);
        json_decref(e);
        n++;
    }
    free(line);
    fclose(f);
    return n;
}

static jlm_gguf *open_ok(const char *path)
{
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    int rc = jlm_gguf_open(path, &g, &err);
    cr_assert_eq(rc, 0, "open %s: rc %d: %s", path, rc, err.msg);
    cr_assert(g);
    return g;
}

/* ---------------------------------------------------------------------
 * Real models vs MANIFEST.jsonl
 * ------------------------------------------------------------------- */

static void check_tensors(json_t *e)
{
    char path[4096];
    const char *file = json_string_value(json_object_get(e, "file"));
    model_path(file, path, sizeof path);
    jlm_gguf *g = open_ok(path);
    cr_assert_eq(g->version, json_integer_value(json_object_get(e, "gguf_version")), "%s: version", file);
    cr_assert_eq(g->total_bytes, (uint64_t)json_integer_value(json_object_get(e, "size")), "%s: size", file);
    json_t *ts = json_object_get(e, "tensors");
    cr_assert_eq(g->n_tensors, json_array_size(ts), "%s: %" PRIu64 " tensors, expected %zu", file,
                 g->n_tensors, json_array_size(ts));
    cr_assert_eq(g->n_tensors, (uint64_t)json_integer_value(json_object_get(e, "n_tensors")));
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *t = json_array_get(ts, i), *shape = json_array_get(t, 2);
        const char *name = json_string_value(json_array_get(t, 0));
        const jlm_gguf_tensor *gt = &g->tensors[i];
        cr_assert_str_eq(gt->name.s, name, "%s: tensor %zu", file, i);
        cr_assert_eq(gt->name.len, strlen(name));
        cr_assert_eq(jlm_gguf_find_tensor(g, name), gt, "%s: find_tensor(%s)", file, name);
        cr_assert_eq(gt->type, type_id(json_string_value(json_array_get(t, 1))), "%s: %s type %u", file, name, gt->type);
        cr_assert_eq(gt->n_dims, json_array_size(shape), "%s: %s n_dims", file, name);
        uint64_t nel = 1;
        for (uint32_t d = 0; d < 4; d++) {
            uint64_t want = d < gt->n_dims ? (uint64_t)json_integer_value(json_array_get(shape, d)) : 1;
            cr_assert_eq(gt->ne[d], want, "%s: %s ne[%u] = %" PRIu64 ", expected %" PRIu64, file, name, d, gt->ne[d], want);
            nel *= want;
        }
        cr_assert_eq(gt->n_bytes, nel / jlm_ggml_block_elems(gt->type) * jlm_ggml_block_bytes(gt->type));
        cr_assert_eq(gt->data_off % g->alignment, 0, "%s: %s data_off", file, name);
        cr_assert(gt->data_off + gt->n_bytes <= g->total_bytes);
        cr_assert_eq(gt->part, 0);
    }
    cr_assert_null(jlm_gguf_find_tensor(g, "no.such.tensor"));
    jlm_gguf_close(g);
}

Test(gguf, opens_every_model_with_the_manifest_tensor_names_types_and_shapes, .timeout = 60)
{
    int n = for_each_manifest(check_tensors);
    cr_assert_geq(n, 30, "only %d manifest entries", n);
}

static void check_kv_value(const jlm_gguf *g, const char *file, const char *key, json_t *want)
{
    const jlm_gguf_kv *kv = jlm_gguf_find(g, key);
    cr_assert(kv, "%s: key %s missing", file, key);
    cr_assert_str_eq(kv->key.s, key);
    jlm_err err = {0};
    if (kv->type == GGUF_T_ARRAY) {   /* the manifest writes arrays as "array[N]" */
        char want_s[64];
        snprintf(want_s, sizeof want_s, "array[%" PRIu64 "]", kv->n);
        cr_assert(json_is_string(want), "%s: %s is an array, the manifest has no string", file, key);
        cr_assert_str_eq(json_string_value(want), want_s, "%s: %s", file, key);
    } else if (json_is_string(want)) {
        jlm_gguf_str s;
        cr_assert_eq(jlm_gguf_get_str(g, key, &s, &err), 0, "%s: %s: %s", file, key, err.msg);
        const char *w = json_string_value(want);
        size_t wl = json_string_length(want);
        if (wl > 3 && !strcmp(w + wl - 3, "...") && s.len > wl - 3) {   /* manifest cut a long string */
            cr_assert(!strncmp(s.s, w, wl - 3), "%s: %s = \"%s\", expected it to start with \"%.*s\"",
                      file, key, s.s, (int)(wl - 3), w);
        } else {
            cr_assert_str_eq(s.s, w, "%s: %s", file, key);
            cr_assert_eq(s.len, wl);
        }
    } else if (json_is_boolean(want)) {
        int b;
        cr_assert_eq(jlm_gguf_get_bool(g, key, &b, &err), 0, "%s: %s: %s", file, key, err.msg);
        cr_assert_eq(b, json_is_true(want), "%s: %s", file, key);
    } else if (json_is_integer(want)) {
        int64_t v;
        cr_assert_eq(jlm_gguf_get_i64(g, key, &v, &err), 0, "%s: %s: %s", file, key, err.msg);
        cr_assert_eq(v, json_integer_value(want), "%s: %s = %" PRId64 ", expected %" PRId64, file, key,
                     v, (int64_t)json_integer_value(want));
    } else if (json_is_real(want)) {
        float f;
        cr_assert_eq(jlm_gguf_get_f32(g, key, &f, &err), 0, "%s: %s: %s", file, key, err.msg);
        cr_assert(!(kv->v.f != json_real_value(want)), "%s: %s = %.17g, expected %.17g", file, key,
                  kv->v.f, json_real_value(want));
    } else {
        cr_assert_fail("%s: %s: manifest value of an unexpected JSON type", file, key);
    }
}

static void check_metadata(json_t *e)
{
    char path[4096];
    const char *file = json_string_value(json_object_get(e, "file"));
    model_path(file, path, sizeof path);
    jlm_gguf *g = open_ok(path);
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(e, "kv"), key, v)
        check_kv_value(g, file, key, v);
    json_t *nv = json_object_get(e, "n_vocab");
    if (json_is_integer(nv)) {
        const jlm_gguf_kv *tok = jlm_gguf_find(g, "tokenizer.ggml.tokens");
        cr_assert(tok && tok->type == GGUF_T_ARRAY && tok->arr_type == GGUF_T_STRING, "%s: tokens", file);
        cr_assert_eq(tok->n, (uint64_t)json_integer_value(nv), "%s: %" PRIu64 " tokens, expected %" PRId64,
                     file, tok->n, (int64_t)json_integer_value(nv));
        const jlm_gguf_str *s = tok->arr;
        for (uint64_t i = 0; i < tok->n; i++)
            cr_assert_eq(s[i].s[s[i].len], '\0', "%s: token %" PRIu64 " not NUL-terminated", file, i);
    }
    jlm_gguf_close(g);
}

Test(gguf, reads_every_manifest_metadata_value_and_the_vocab_size, .timeout = 60)
{
    for_each_manifest(check_metadata);
}

Test(gguf, reads_known_values_of_stories260K)
{
    char path[4096];
    model_path("stories260K.gguf", path, sizeof path);
    jlm_gguf *g = open_ok(path);
    jlm_err err = {0};
    uint32_t u;
    cr_assert_eq(jlm_gguf_get_u32(g, "llama.block_count", &u, &err), 0, "%s", err.msg);
    cr_assert_eq(u, 5, "block_count %u, expected 5 (PROVENANCE.md)", u);
    cr_assert_eq(jlm_gguf_get_u32(g, "llama.embedding_length", &u, &err), 0);
    cr_assert_eq(u, 64);
    jlm_gguf_str s;
    cr_assert_eq(jlm_gguf_get_str(g, "tokenizer.ggml.model", &s, &err), 0);
    cr_assert_str_eq(s.s, "llama");
    const jlm_gguf_kv *tok = jlm_gguf_find(g, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->n == 512);
    const jlm_gguf_kv *sc = jlm_gguf_find(g, "tokenizer.ggml.scores");
    cr_assert(sc && sc->type == GGUF_T_ARRAY && sc->arr_type == GGUF_T_F32 && sc->n == 512);
    cr_assert_eq(g->alignment, 32);
    cr_assert_eq(jlm_gguf_get_u32(g, "no.such.key", &u, &err), JLM_ENOTFOUND);
    cr_assert(strstr(err.msg, "no.such.key"), "message: %s", err.msg);
    cr_assert_eq(jlm_gguf_get_u32(g, "tokenizer.ggml.model", &u, &err), JLM_EFORMAT);
    cr_assert(strstr(err.msg, "string"), "message: %s", err.msg);
    jlm_gguf_close(g);
}

static void check_reads(const char *name)
{
    char path[4096];
    model_path(name, path, sizeof path);
    jlm_gguf *g = open_ok(path);
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    jlm_err err = {0};
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const jlm_gguf_tensor *t = &g->tensors[i];
        uint8_t *a = malloc(t->n_bytes + 1), *b = malloc(t->n_bytes + 1);
        cr_assert_eq(pread(fd, b, t->n_bytes, (off_t)t->data_off), (ssize_t)t->n_bytes);
        cr_assert_eq(jlm_gguf_read(g, t, 0, a, t->n_bytes, &err), 0, "%s", err.msg);
        cr_assert(!memcmp(a, b, t->n_bytes), "%s: tensor %s bytes differ from pread", name, t->name.s);
        if (t->n_bytes > 8) {   /* a window in the middle */
            cr_assert_eq(jlm_gguf_read(g, t, 3, a, 5, &err), 0);
            cr_assert(!memcmp(a, b + 3, 5), "%s: %s window", name, t->name.s);
        }
        cr_assert_eq(jlm_gguf_read(g, t, 1, a, t->n_bytes, &err), JLM_EINVAL, "read past the tensor accepted");
        free(a);
        free(b);
    }
    close(fd);
    jlm_gguf_close(g);
}

Test(gguf, read_returns_the_bytes_at_data_off)
{
    check_reads("stories260K.gguf");
    check_reads("synth-llama-256.Q4_K_M.gguf");
    check_reads("mmproj-tinygemma3.gguf");
}

/* Its speed is measured by bench/bench_gguf.c (the suite checks correctness only). */
Test(gguf, opens_a_32000_token_vocab)
{
    char path[4096];
    model_path("ggml-vocab-llama-spm.gguf", path, sizeof path);
    jlm_gguf *g = open_ok(path);
    cr_assert_eq(jlm_gguf_find(g, "tokenizer.ggml.tokens")->n, 32000);
    jlm_gguf_close(g);
}

/* ---------------------------------------------------------------------
 * Truncation
 * ------------------------------------------------------------------- */

static void expect_refused(const uint8_t *b, size_t n, const char *what)
{
    jlm_gguf *g = (jlm_gguf *)0x1;
    jlm_err err = {0};
    int rc = jlm_gguf_open_mem(b, n, what, &g, &err);
    cr_assert(rc < 0, "%s: a prefix of %zu bytes was accepted", what, n);
    cr_assert_eq(g, (jlm_gguf *)0x1, "%s: *out written on error", what);
    cr_assert(err.msg[0], "%s: empty message (prefix %zu)", what, n);
}

Test(gguf, refuses_a_file_truncated_at_any_byte, .timeout = 60)
{
    char path[4096];
    model_path("stories260K.gguf", path, sizeof path);
    size_t len;
    uint8_t *full = load(path, &len);
    jlm_gguf *g;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_open_mem(full, len, "stories260K.gguf", &g, &err), 0, "%s", err.msg);
    uint64_t data = UINT64_MAX, end = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const jlm_gguf_tensor *t = &g->tensors[i];
        data = t->data_off < data ? t->data_off : data;
        end = t->data_off + t->n_bytes > end ? t->data_off + t->n_bytes : end;
    }
    jlm_gguf_close(g);
    /* every byte of the first 16 KiB (all of this file's metadata), then sampled */
    for (size_t n = 0; n < data; n += n < 16384 ? 1 : 97) {
        uint8_t *pre = malloc(n ? n : 1);   /* exact-size copy: ASan sees any overread */
        memcpy(pre, full, n);
        expect_refused(pre, n, "stories260K.gguf");
        free(pre);
    }
    uint64_t inside[] = { data, data + 1, data + 4096, (data + end) / 2, end - 1 };
    for (size_t i = 0; i < sizeof inside / sizeof inside[0]; i++)
        expect_refused(full, inside[i], "stories260K.gguf");
    cr_assert_eq(jlm_gguf_open_mem(full, len, "stories260K.gguf", &g, &err), 0);
    jlm_gguf_close(g);
    free(full);
}

Test(gguf, names_the_tensor_and_the_span_of_a_truncated_data_section)
{
    char path[4096], want[64];
    model_path("stories260K.gguf", path, sizeof path);
    size_t len;
    uint8_t *full = load(path, &len);
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_open_mem(full, len, "cut.gguf", &g, &err), 0, "%s", err.msg);
    uint64_t end = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].data_off + g->tensors[i].n_bytes > end)
            end = g->tensors[i].data_off + g->tensors[i].n_bytes;
    jlm_gguf_close(g);
    g = NULL;
    cr_assert_eq(jlm_gguf_open_mem(full, end - 1, "cut.gguf", &g, &err), JLM_EFORMAT);
    snprintf(want, sizeof want, "past end of file (%" PRIu64 " bytes)", end - 1);
    cr_assert(strstr(err.msg, "cut.gguf: tensor '") && strstr(err.msg, want), "message: %s", err.msg);
    free(full);
}

Test(gguf, refuses_a_truncated_file_on_disk_after_growing_its_buffer)
{
    char path[4096], dir[64], cut[128];
    model_path("ggml-vocab-deepseek-llm.gguf", path, sizeof path);   /* 3.9 MB of metadata */
    size_t len;
    uint8_t *full = load(path, &len);
    tmpdir(dir, sizeof dir);
    snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
    save(cut, full, len * 2 / 3);
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_open(cut, &g, &err), JLM_EFORMAT, "rc: %s", err.msg);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, "cut.gguf: kv ") && strstr(err.msg, "tokenizer.ggml."), "message: %s", err.msg);
    unlink(cut);
    rmdir(dir);
    free(full);
}

/* ---------------------------------------------------------------------
 * A tiny GGUF writer, and hand-written files
 * ------------------------------------------------------------------- */

typedef struct wbuf { uint8_t *p; size_t n, cap; } wbuf;

static void w_bytes(wbuf *w, const void *src, size_t n)
{
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->p = realloc(w->p, w->cap);
        cr_assert(w->p);
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}

static void w_le(wbuf *w, uint64_t v, unsigned n)
{
    uint8_t b[8];
    for (unsigned i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    w_bytes(w, b, n);
}

static void w_str(wbuf *w, const char *s) { w_le(w, strlen(s), 8); w_bytes(w, s, strlen(s)); }
static void w_pad(wbuf *w, size_t a) { while (w->n % a) w_le(w, 0, 1); }

static void w_kv_int(wbuf *w, const char *key, uint32_t type, uint64_t v, unsigned size)
{
    w_str(w, key);
    w_le(w, type, 4);
    w_le(w, v, size);
}

static void w_kv_str(wbuf *w, const char *key, const char *v)
{
    w_str(w, key);
    w_le(w, GGUF_T_STRING, 4);
    w_str(w, v);
}

static void w_tinfo(wbuf *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
    w_str(w, name);
    w_le(w, n_dims, 4);
    for (uint32_t d = 0; d < n_dims; d++)
        w_le(w, ne[d], 8);
    w_le(w, type, 4);
    w_le(w, off, 8);
}

/* A key name with control bytes (as fuzz_mmproj found: '\n' and 0x1f in a
 * key before an unknown value type) must not split the message. */
Test(gguf, a_key_name_with_control_bytes_gives_a_one_line_message)
{
    wbuf w = {0};
    w_bytes(&w, "GGUF", 4);
    w_le(&w, 3, 4);                 /* version */
    w_le(&w, 0, 8);                 /* tensors */
    w_le(&w, 1, 8);                 /* kvs */
    w_str(&w, "clip.vis\n\x1fx\ty");
    w_le(&w, 0x9e3b8a0fu, 4);       /* no such value type */
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    cr_assert_lt(jlm_gguf_open_mem(w.p, w.n, "ctl.gguf", &g, &err), 0);
    cr_assert(strstr(err.msg, "unknown value type"), "%s", err.msg);
    cr_assert(strstr(err.msg, "'clip.vis??x?y'"), "%s", err.msg);
    for (const char *c = err.msg; *c; c++)
        cr_assert((unsigned char)*c >= 0x20 && *c != 0x7f, "control byte 0x%02x in: %s", (unsigned char)*c, err.msg);
    free(w.p);
}

/* What the hand-written file varies; zero fields keep the valid default. */
typedef struct spec {
    const char *magic;
    uint32_t version;
    uint64_t str_len;       /* replaces the length of the architecture value */
    uint64_t arr_count;     /* replaces the count of test.ints */
    uint32_t n_dims;        /* of tensor "a" */
    uint32_t type_b;        /* of tensor "b" */
    uint64_t ne0_b;
    uint64_t off_b;
    int      align_type;    /* general.alignment's value type (0 = u32) */
    uint64_t align;         /* value (0 = 32) */
    uint8_t  flag;          /* the bool value */
    int      dup_key, dup_tensor;
    size_t   cut;           /* drop this many bytes from the end */
} spec;

static const float A_VALS[16] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15.5f };

static uint8_t *make_file(const spec *s, size_t *len)
{
    wbuf w = {0};
    w_bytes(&w, s->magic ? s->magic : "GGUF", 4);
    w_le(&w, s->version ? s->version : 3, 4);
    w_le(&w, 2 + (s->dup_tensor != 0), 8);
    w_le(&w, 8 + (s->dup_key != 0), 8);
    w_str(&w, "general.architecture");
    w_le(&w, GGUF_T_STRING, 4);
    w_le(&w, s->str_len ? s->str_len : 5, 8);
    w_bytes(&w, "llama", 5);
    uint32_t at = s->align_type ? (uint32_t)s->align_type : GGUF_T_U32;
    if (at == GGUF_T_STRING)
        w_kv_str(&w, "general.alignment", "32");
    else
        w_kv_int(&w, "general.alignment", at, s->align ? s->align : 32, at == GGUF_T_U64 || at == GGUF_T_I64 ? 8 : 4);
    w_str(&w, "test.strs");                                       /* ["a", "bc", ""] */
    w_le(&w, GGUF_T_ARRAY, 4);
    w_le(&w, GGUF_T_STRING, 4);
    w_le(&w, 3, 8);
    w_str(&w, "a"); w_str(&w, "bc"); w_str(&w, "");
    w_str(&w, "test.ints");                                       /* i32 [1, -2, 3] */
    w_le(&w, GGUF_T_ARRAY, 4);
    w_le(&w, GGUF_T_I32, 4);
    w_le(&w, s->arr_count ? s->arr_count : 3, 8);
    w_le(&w, 1, 4); w_le(&w, (uint32_t)-2, 4); w_le(&w, 3, 4);
    w_str(&w, "test.nested");                                     /* [[7, 8], [9]] of u8 */
    w_le(&w, GGUF_T_ARRAY, 4);
    w_le(&w, GGUF_T_ARRAY, 4);
    w_le(&w, 2, 8);
    w_le(&w, GGUF_T_U8, 4); w_le(&w, 2, 8); w_le(&w, 7, 1); w_le(&w, 8, 1);
    w_le(&w, GGUF_T_U8, 4); w_le(&w, 1, 8); w_le(&w, 9, 1);
    w_kv_int(&w, "test.flag", GGUF_T_BOOL, s->flag ? s->flag : 1, 1);
    w_kv_int(&w, "test.neg", GGUF_T_I16, (uint16_t)-300, 2);
    w_kv_int(&w, "test.half", GGUF_T_F32, 0x3f000000, 4);          /* 0.5f */
    if (s->dup_key)
        w_kv_str(&w, "test.flag", "again");
    uint64_t ne_a[5] = { 8, 2, 1, 1, 1 }, ne_b[1] = { s->ne0_b ? s->ne0_b : 32 };
    w_tinfo(&w, "a", s->n_dims ? s->n_dims : 2, ne_a, GGML_F32, 0);
    w_tinfo(&w, "b", 1, ne_b, s->type_b ? s->type_b : GGML_Q8_0, s->off_b ? s->off_b : 64);
    if (s->dup_tensor)
        w_tinfo(&w, "a", 1, ne_b, GGML_Q8_0, 128);
    w_pad(&w, 32);
    w_bytes(&w, A_VALS, sizeof A_VALS);                           /* a: 64 bytes at 0 */
    for (int i = 0; i < 34 + (s->dup_tensor ? 64 + 34 : 0); i++) /* b: 34 bytes at 64 */
        w_le(&w, (uint64_t)(i * 7), 1);
    *len = w.n - s->cut;
    return w.p;
}

/* Opens the spec's file; expects code and a message naming word. */
static void expect_error(const spec *s, int code, const char *word)
{
    size_t n;
    uint8_t *b = make_file(s, &n);
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    int rc = jlm_gguf_open_mem(b, n, "hand.gguf", &g, &err);
    cr_assert_eq(rc, code, "rc %d (%s), expected %d", rc, err.msg, code);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, word), "message \"%s\" does not name \"%s\"", err.msg, word);
    cr_assert(strstr(err.msg, "hand.gguf"), "message \"%s\" does not name the file", err.msg);
    free(b);
}

Test(gguf, reads_every_value_kind_of_a_hand_written_file)
{
    spec s = {0};
    size_t n;
    uint8_t *b = make_file(&s, &n);
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_open_mem(b, n, "hand.gguf", &g, &err), 0, "%s", err.msg);
    cr_assert_eq(g->n_kv, 8);
    const jlm_gguf_kv *kv = jlm_gguf_find(g, "test.strs");
    const jlm_gguf_str *ss = kv->arr;
    cr_assert(kv->arr_type == GGUF_T_STRING && kv->n == 3);
    cr_assert(!strcmp(ss[0].s, "a") && !strcmp(ss[1].s, "bc") && ss[2].len == 0 && ss[2].s[0] == '\0');
    kv = jlm_gguf_find(g, "test.ints");
    int32_t iv[3];
    memcpy(iv, kv->arr, sizeof iv);
    cr_assert(kv->arr_type == GGUF_T_I32 && kv->n == 3 && iv[0] == 1 && iv[1] == -2 && iv[2] == 3);
    kv = jlm_gguf_find(g, "test.nested");
    const jlm_gguf_kv *sub = kv->arr;
    cr_assert(kv->arr_type == GGUF_T_ARRAY && kv->n == 2);
    cr_assert(sub[0].arr_type == GGUF_T_U8 && sub[0].n == 2 && ((const uint8_t *)sub[0].arr)[1] == 8);
    cr_assert(sub[1].n == 1 && ((const uint8_t *)sub[1].arr)[0] == 9);
    int flag;
    int64_t neg;
    float half;
    uint32_t u;
    cr_assert_eq(jlm_gguf_get_bool(g, "test.flag", &flag, &err), 0);
    cr_assert_eq(flag, 1);
    cr_assert_eq(jlm_gguf_get_i64(g, "test.neg", &neg, &err), 0);
    cr_assert_eq(neg, -300);
    cr_assert_eq(jlm_gguf_get_u32(g, "test.neg", &u, &err), JLM_EFORMAT, "-300 accepted as u32");
    cr_assert_eq(jlm_gguf_get_f32(g, "test.half", &half, &err), 0);
    cr_assert(!(half != 0.5f));
    const jlm_gguf_tensor *a = jlm_gguf_find_tensor(g, "a"), *tb = jlm_gguf_find_tensor(g, "b");
    cr_assert(a && tb && a->n_bytes == 64 && tb->n_bytes == 34 && tb->data_off == a->data_off + 64);
    float got[16];
    cr_assert_eq(jlm_gguf_read(g, a, 0, got, sizeof got, &err), 0);
    cr_assert(!memcmp(got, A_VALS, sizeof got));
    jlm_gguf_close(g);
    free(b);
}

Test(gguf, refuses_a_wrong_magic)           { expect_error(&(spec){ .magic = "GGML" }, JLM_EFORMAT, "magic"); }
Test(gguf, refuses_version_1)               { expect_error(&(spec){ .version = 1 }, JLM_EVERSION, "version 1"); }
Test(gguf, refuses_a_big_endian_file)       { expect_error(&(spec){ .version = 3u << 24 }, JLM_EVERSION, "big-endian"); }
Test(gguf, refuses_a_huge_string_length)    { expect_error(&(spec){ .str_len = 1ull << 62 }, JLM_EFORMAT, "string length"); }
Test(gguf, refuses_a_huge_array_count)      { expect_error(&(spec){ .arr_count = 1ull << 61 }, JLM_EFORMAT, "array count"); }
Test(gguf, refuses_5_dimensions)            { expect_error(&(spec){ .n_dims = 5 }, JLM_EFORMAT, "n_dims 5"); }
Test(gguf, refuses_an_unknown_tensor_type)  { expect_error(&(spec){ .type_b = 99 }, JLM_EFORMAT, "type id 99"); }
Test(gguf, refuses_a_misaligned_offset)     { expect_error(&(spec){ .off_b = 65 }, JLM_EFORMAT, "multiple of the alignment"); }
Test(gguf, refuses_an_alignment_of_48)      { expect_error(&(spec){ .align = 48 }, JLM_EFORMAT, "alignment 48"); }
Test(gguf, refuses_a_negative_alignment)    { expect_error(&(spec){ .align_type = GGUF_T_I32, .align = (uint32_t)-32 }, JLM_EFORMAT, "alignment"); }
Test(gguf, refuses_a_string_alignment)      { expect_error(&(spec){ .align_type = GGUF_T_STRING, .align = 0 }, JLM_EFORMAT, "alignment"); }
Test(gguf, refuses_a_duplicate_key)         { expect_error(&(spec){ .dup_key = 1 }, JLM_EFORMAT, "duplicate key"); }
Test(gguf, refuses_a_duplicate_tensor_name) { expect_error(&(spec){ .dup_tensor = 1 }, JLM_EFORMAT, "duplicate tensor"); }
Test(gguf, refuses_a_row_not_a_multiple_of_the_block) { expect_error(&(spec){ .ne0_b = 16 }, JLM_EFORMAT, "block size"); }
Test(gguf, refuses_a_bool_other_than_0_or_1) { expect_error(&(spec){ .flag = 2 }, JLM_EFORMAT, "bool"); }
Test(gguf, refuses_a_tensor_past_the_end)   { expect_error(&(spec){ .cut = 1 }, JLM_EFORMAT, "tensor 'b': data ["); }

Test(gguf, accepts_a_u64_alignment_of_64)
{
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    wbuf w = {0};
    w_bytes(&w, "GGUF", 4);
    w_le(&w, 3, 4); w_le(&w, 1, 8); w_le(&w, 1, 8);
    w_kv_int(&w, "general.alignment", GGUF_T_U64, 64, 8);
    uint64_t ne[1] = { 4 };
    w_tinfo(&w, "x", 1, ne, GGML_F32, 0);
    w_pad(&w, 64);
    size_t data = w.n;
    w_bytes(&w, A_VALS, 16);
    cr_assert_eq(jlm_gguf_open_mem(w.p, w.n, "a64.gguf", &g, &err), 0, "%s", err.msg);
    cr_assert_eq(g->alignment, 64);
    cr_assert_eq(g->tensors[0].data_off, data);
    jlm_gguf_close(g);
    free(w.p);
}

/* ---------------------------------------------------------------------
 * Split files
 * ------------------------------------------------------------------- */

/* Writes tensors [from, to) of src with its data as part k (1-based) of n. */
static void write_part(const jlm_gguf *src, const char *path, uint32_t k, uint32_t n, uint64_t from, uint64_t to)
{
    wbuf w = {0};
    uint32_t block_count;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_get_u32(src, "llama.block_count", &block_count, &err), 0);
    w_bytes(&w, "GGUF", 4);
    w_le(&w, 3, 4);
    w_le(&w, to - from, 8);
    w_le(&w, k == 1 ? 5 : 3, 8);
    if (k == 1) {
        w_kv_str(&w, "general.architecture", "llama");
        w_kv_int(&w, "llama.block_count", GGUF_T_U32, block_count, 4);
    }
    w_kv_int(&w, "split.no", GGUF_T_U16, k - 1, 2);
    w_kv_int(&w, "split.count", GGUF_T_U16, n, 2);
    w_kv_int(&w, "split.tensors.count", GGUF_T_I32, src->n_tensors, 4);
    uint64_t off = 0;
    for (uint64_t i = from; i < to; i++) {
        const jlm_gguf_tensor *t = &src->tensors[i];
        w_tinfo(&w, t->name.s, t->n_dims, t->ne, t->type, off);
        off = (off + t->n_bytes + 31) / 32 * 32;
    }
    for (uint64_t i = from; i < to; i++) {
        const jlm_gguf_tensor *t = &src->tensors[i];
        w_pad(&w, 32);
        uint8_t *buf = malloc(t->n_bytes);
        cr_assert_eq(jlm_gguf_read(src, t, 0, buf, t->n_bytes, &err), 0, "%s", err.msg);
        w_bytes(&w, buf, t->n_bytes);
        free(buf);
    }
    save(path, w.p, w.n);
    free(w.p);
}

static jlm_gguf *stories(void)
{
    char path[4096];
    model_path("stories260K.gguf", path, sizeof path);
    return open_ok(path);
}

Test(gguf, opens_a_two_part_split_with_merged_tensors)
{
    char dir[64], p1[128], p2[128];
    tmpdir(dir, sizeof dir);
    snprintf(p1, sizeof p1, "%s/m-00001-of-00002.gguf", dir);
    snprintf(p2, sizeof p2, "%s/m-00002-of-00002.gguf", dir);
    jlm_gguf *src = stories();
    uint64_t half = src->n_tensors / 2;
    write_part(src, p1, 1, 2, 0, half);
    write_part(src, p2, 2, 2, half, src->n_tensors);
    jlm_gguf *g = open_ok(p1);
    jlm_err err = {0};
    cr_assert_eq(g->n_parts, 2);
    cr_assert_eq(g->n_tensors, src->n_tensors, "%" PRIu64 " tensors, expected %" PRIu64, g->n_tensors, src->n_tensors);
    uint32_t bc;
    cr_assert_eq(jlm_gguf_get_u32(g, "llama.block_count", &bc, &err), 0, "%s", err.msg);
    cr_assert_eq(bc, 5);
    struct stat s1, s2;
    cr_assert(!stat(p1, &s1) && !stat(p2, &s2));
    cr_assert_eq(g->total_bytes, (uint64_t)(s1.st_size + s2.st_size));
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const jlm_gguf_tensor *a = &src->tensors[i], *b = jlm_gguf_find_tensor(g, a->name.s);
        cr_assert(b, "tensor %s missing from the merged split", a->name.s);
        cr_assert_eq(b->part, i < half ? 0u : 1u, "%s in part %u", a->name.s, b->part);
        cr_assert(b->type == a->type && b->n_dims == a->n_dims && !memcmp(b->ne, a->ne, sizeof a->ne));
        cr_assert_eq(b->n_bytes, a->n_bytes);
        uint8_t *x = malloc(a->n_bytes), *y = malloc(a->n_bytes);
        cr_assert_eq(jlm_gguf_read(src, a, 0, x, a->n_bytes, &err), 0);
        cr_assert_eq(jlm_gguf_read(g, b, 0, y, b->n_bytes, &err), 0, "%s", err.msg);
        cr_assert(!memcmp(x, y, a->n_bytes), "tensor %s: bytes differ after the split", a->name.s);
        free(x);
        free(y);
    }
    jlm_gguf_close(g);
    jlm_gguf *h = NULL;
    cr_assert_eq(jlm_gguf_open(p2, &h, &err), JLM_EINVAL, "part 2 opened on its own");
    cr_assert(strstr(err.msg, "m-00001-of-00002.gguf"), "message: %s", err.msg);
    jlm_gguf_close(src);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

Test(gguf, refuses_a_split_with_a_missing_part_naming_it)
{
    char dir[64], p1[128];
    tmpdir(dir, sizeof dir);
    snprintf(p1, sizeof p1, "%s/m-00001-of-00002.gguf", dir);
    jlm_gguf *src = stories();
    write_part(src, p1, 1, 2, 0, 10);
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    int rc = jlm_gguf_open(p1, &g, &err);
    cr_assert_eq(rc, JLM_ENOTFOUND, "rc %d: %s", rc, err.msg);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, "m-00002-of-00002.gguf") && strstr(err.msg, "missing"), "message: %s", err.msg);
    jlm_gguf_close(src);
    unlink(p1);
    rmdir(dir);
}

Test(gguf, refuses_a_split_part_whose_split_no_disagrees_with_its_name)
{
    char dir[64], p1[128], p2[128];
    tmpdir(dir, sizeof dir);
    snprintf(p1, sizeof p1, "%s/m-00001-of-00002.gguf", dir);
    snprintf(p2, sizeof p2, "%s/m-00002-of-00002.gguf", dir);
    jlm_gguf *src = stories();
    write_part(src, p1, 1, 2, 0, 10);
    write_part(src, p2, 1, 2, 10, src->n_tensors);   /* says split.no 0 */
    jlm_gguf *g = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_gguf_open(p1, &g, &err), JLM_EFORMAT, "%s", err.msg);
    cr_assert(strstr(err.msg, "split.no") && strstr(err.msg, "m-00002-of-00002.gguf"), "message: %s", err.msg);
    jlm_gguf_close(src);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}
