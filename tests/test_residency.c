/* test_residency.c - the residency database (residency/residency.h) and
 * `jlm stats`: sessions, counters, residency, pruning of dead sessions, tier
 * attribution with daemon reads, two writer processes, bad files, xattr
 * discovery. Every test works on a database in its own temp dir. */
#include <criterion/criterion.h>

#include "residency/residency.h"
#include "base/tier.h"
#include "tests/testutil.h"

#include <jansson.h>
#include <sqlite3.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>

static char *tmp;
static char dbpath[1100];

static void setup(void)
{
    tmp = tu_tmpdir();
    cr_assert(tmp, "mkdtemp failed");
    snprintf(dbpath, sizeof dbpath, "%s/jlmfs.db", tmp);
}

static void teardown(void)
{
    tu_rmrf(tmp);
    free(tmp);
}

TestSuite(residency, .init = setup, .fini = teardown, .timeout = 30);

/* One clock for every handle of a test: each stamp 1 ms after the one
 * before, so order is by call and no test sleeps for distinct stamps. */
static double fake_now = 1.7e9;
static double fake_clock(void *ctx) { return fake_now += 0.001; }

static jlm_rdb *open_db(void)
{
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    int rc = jlm_rdb_open(dbpath, 1, &db, &err);
    cr_assert_eq(rc, 0, "open %s: %s", dbpath, err.msg);
    jlm_rdb_set_clock(db, fake_clock, NULL);
    return db;
}

static int64_t begin(jlm_rdb *db, const char *key)
{
    jlm_err err = {0};
    int64_t s = 0;
    cr_assert_eq(jlm_rdb_session_begin(db, key, &s, &err), 0, "session_begin: %s", err.msg);
    cr_assert(s > 0, "session id %lld, expected > 0", (long long)s);
    return s;
}

static void ev(jlm_rdb *db, int64_t s, const char *array, int a, int b, int kind, int tier, uint64_t bytes)
{
    jlm_err err = {0};
    cr_assert_eq(jlm_rdb_event(db, s, array, a, b, kind, tier, bytes, &err), 0, "event: %s", err.msg);
}

static void flush(jlm_rdb *db)
{
    jlm_err err = {0};
    cr_assert_eq(jlm_rdb_flush(db, &err), 0, "flush: %s", err.msg);
}

/* The stats JSON as a tree (caller decrefs). */
static json_t *stats(jlm_rdb *db, const char *key)
{
    jlm_err err = {0};
    char *s = NULL;
    cr_assert_eq(jlm_rdb_stats_json(db, key, &s, &err), 0, "stats_json: %s", err.msg);
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    cr_assert(j, "stats JSON does not parse: %s\n%s", je.text, s);
    free(s);
    return j;
}

static json_t *model(json_t *root, const char *key)
{
    json_t *m = json_object_get(json_object_get(root, "models"), key);
    cr_assert(m, "no model '%s' in the stats", key);
    return m;
}

/* Page `name` of model key, or NULL. */
static json_t *page(json_t *root, const char *key, const char *name)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(model(root, key), "pages"), i, p)
        if (!strcmp(json_string_value(json_object_get(p, "name")), name))
            return p;
    return NULL;
}

static long long num(json_t *o, const char *path)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", path);
    char *dot = strchr(buf, '.');
    if (dot) {
        *dot = 0;
        o = json_object_get(o, buf);
        path = dot + 1;
    }
    json_t *v = json_object_get(o, path);
    cr_assert(json_is_integer(v), "counter '%s' missing", path);
    return (long long)json_integer_value(v);
}

#define EXPECT(o, path, want) do { long long got_ = num((o), (path)); \
    cr_assert_eq(got_, (long long)(want), "%s: expected %lld, got %lld", (path), (long long)(want), got_); } while (0)

static void resident(jlm_rdb *db, const char *key, const char *want)
{
    jlm_err err = {0};
    char **names = NULL;
    size_t n = 0;
    cr_assert_eq(jlm_rdb_resident(db, key, &names, &n, &err), 0, "resident: %s", err.msg);
    char got[1024] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? " " : "", names[i]);
    jlm_rdb_free_names(names, n);
    cr_assert_str_eq(got, want, "resident pages: expected '%s', got '%s'", want, got);
}

/* ---------------------------------------------------------------- sessions */
Test(residency, a_session_is_listed_from_begin_to_end)
{
    jlm_rdb *db = open_db();
    jlm_err err = {0};
    int64_t s = begin(db, "a.jlm");
    json_t *j = stats(db, "a.jlm");
    EXPECT(model(j, "a.jlm"), "sessions", 1);
    json_decref(j);
    cr_assert_eq(jlm_rdb_session_end(db, s, &err), 0, "session_end: %s", err.msg);
    j = stats(db, "a.jlm");
    EXPECT(model(j, "a.jlm"), "sessions", 0);
    json_decref(j);
    jlm_rdb_close(db);
}

Test(residency, events_are_counted_at_flush_not_before)
{
    jlm_rdb *db = open_db();
    int64_t s = begin(db, "m.jlm");
    ev(db, s, "blocks", 3, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 8192);
    ev(db, s, "blocks", 3, -1, JLM_RDB_HIT, JLM_TIER_FRAME, 0);
    ev(db, s, "blocks", 3, -1, JLM_RDB_HIT, JLM_TIER_FRAME, 0);
    ev(db, s, "blocks", 3, -1, JLM_RDB_FILL, JLM_TIER_DISK, 4096);
    ev(db, s, "blocks", 3, -1, JLM_RDB_EVICT, JLM_TIER_FRAME, 12288);
    ev(db, s, "experts", 1, 7, JLM_RDB_PAGE_IN, JLM_TIER_MEMORY, 4096);
    json_t *j = stats(db, "m.jlm");
    cr_assert_null(page(j, "m.jlm", "blocks.3"), "blocks.3 counted before the flush");
    json_decref(j);
    flush(db);
    j = stats(db, "m.jlm");
    json_t *p = page(j, "m.jlm", "blocks.3");
    cr_assert(p, "blocks.3 missing after the flush");
    EXPECT(p, "page_ins", 1); EXPECT(p, "hits", 2); EXPECT(p, "fills", 1); EXPECT(p, "evictions", 1);
    EXPECT(p, "bytes", 12288); EXPECT(p, "tiers.disk", 2); EXPECT(p, "tiers.frame", 2);
    cr_assert(json_is_string(json_object_get(p, "last_access")), "last_access not set");
    p = page(j, "m.jlm", "experts.1.7");
    cr_assert(p, "experts.1.7 missing");
    EXPECT(p, "page_ins", 1); EXPECT(p, "tiers.other", 1);
    json_t *t = json_object_get(model(j, "m.jlm"), "totals");
    EXPECT(t, "page_ins", 2); EXPECT(t, "hits", 2); EXPECT(t, "bytes", 16384); EXPECT(t, "pages", 2);
    json_decref(j);
    /* a second flush adds, never replaces */
    ev(db, s, "blocks", 3, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 8192);
    flush(db);
    j = stats(db, "m.jlm");
    EXPECT(page(j, "m.jlm", "blocks.3"), "page_ins", 2);
    json_decref(j);
    jlm_rdb_close(db);
}

Test(residency, refuses_an_unknown_array_or_kind)
{
    jlm_rdb *db = open_db();
    jlm_err err = {0};
    cr_assert_eq(jlm_rdb_event(db, 1, "tensors", 0, -1, JLM_RDB_HIT, JLM_TIER_FRAME, 0, &err), JLM_EINVAL);
    cr_assert(strstr(err.msg, "tensors"), "message should name the array: %s", err.msg);
    cr_assert_eq(jlm_rdb_event(db, 1, "blocks", 0, -1, 9, JLM_TIER_FRAME, 0, &err), JLM_EINVAL);
    cr_assert_eq(jlm_rdb_daemon_read(db, "m", "blocks", 0, -1, JLM_TIER_FRAME, 0, &err), JLM_EINVAL);
    jlm_rdb_close(db);
}

/* ---------------------------------------------------------------- residency */
Test(residency, resident_lists_page_ins_minus_evictions)
{
    jlm_rdb *db = open_db();
    int64_t s = begin(db, "m.jlm");
    ev(db, s, "experts", 3, 5, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    ev(db, s, "blocks", 10, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    ev(db, s, "blocks", 2, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    ev(db, s, "vision", 0, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    ev(db, s, "blocks", 7, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    ev(db, s, "blocks", 7, -1, JLM_RDB_EVICT, JLM_TIER_FRAME, 4096);
    flush(db);
    resident(db, "m.jlm", "blocks.2 blocks.10 vision.0 experts.3.5");
    ev(db, s, "blocks", 2, -1, JLM_RDB_EVICT, JLM_TIER_FRAME, 4096);
    ev(db, s, "blocks", 7, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    flush(db);
    resident(db, "m.jlm", "blocks.7 blocks.10 vision.0 experts.3.5");
    resident(db, "other.jlm", "");
    jlm_rdb_close(db);
}

Test(residency, ending_a_session_clears_only_its_residency)
{
    jlm_rdb *db = open_db();
    jlm_err err = {0};
    int64_t s1 = begin(db, "m.jlm"), s2 = begin(db, "m.jlm");
    ev(db, s1, "blocks", 0, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    ev(db, s1, "blocks", 1, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    ev(db, s2, "blocks", 1, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    flush(db);
    resident(db, "m.jlm", "blocks.0 blocks.1");
    ev(db, s1, "blocks", 4, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);   /* queued: end flushes it first */
    cr_assert_eq(jlm_rdb_session_end(db, s1, &err), 0, "session_end: %s", err.msg);
    resident(db, "m.jlm", "blocks.1");
    json_t *j = stats(db, "m.jlm");
    EXPECT(page(j, "m.jlm", "blocks.4"), "page_ins", 1);   /* counters survive the session */
    EXPECT(model(j, "m.jlm"), "sessions", 1);
    json_decref(j);
    cr_assert_eq(jlm_rdb_session_end(db, s2, &err), 0, "session_end: %s", err.msg);
    resident(db, "m.jlm", "");
    jlm_rdb_close(db);
}

/* A pid that certainly names no process now: a child we forked and reaped. */
static pid_t dead_pid(void)
{
    pid_t c = fork();
    if (c == 0)
        _exit(0);
    cr_assert(c > 0, "fork failed");
    waitpid(c, NULL, 0);
    return c;
}

Test(residency, a_session_whose_process_died_is_pruned_with_its_residency)
{
    jlm_rdb *db = open_db();
    int64_t live = begin(db, "m.jlm");
    ev(db, live, "blocks", 1, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    flush(db);
    /* a crashed engine's leftovers, written behind the API's back */
    sqlite3 *raw = NULL;
    cr_assert_eq(sqlite3_open(dbpath, &raw), SQLITE_OK);
    char sql[512];
    snprintf(sql, sizeof sql, "INSERT INTO sessions(id, model_id, pid, pid_start, started) SELECT 999, id, %d, 0, 0 "
             "FROM models WHERE key = 'm.jlm'; INSERT INTO resident(session_id, model_id, array, a, b) SELECT 999, id, "
             "'blocks', 5, -1 FROM models WHERE key = 'm.jlm'", (int)dead_pid());
    cr_assert_eq(sqlite3_exec(raw, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(raw));
    sqlite3_close(raw);
    jlm_rdb *ro = NULL;   /* read-only (jlm stats): the dead session is hidden, not deleted */
    jlm_err err = {0};
    cr_assert_eq(jlm_rdb_open(dbpath, JLM_RDB_READONLY, &ro, &err), 0, "%s", err.msg);
    resident(ro, "m.jlm", "blocks.1");
    json_t *j = stats(ro, "m.jlm");
    EXPECT(model(j, "m.jlm"), "sessions", 1);
    json_decref(j);
    jlm_rdb_close(ro);
    resident(db, "m.jlm", "blocks.1");
    j = stats(db, "m.jlm");
    EXPECT(model(j, "m.jlm"), "sessions", 1);
    json_decref(j);
    jlm_rdb_close(db);
}

/* ---------------------------------------------------------------- tiers */

Test(residency, a_view_page_in_is_pagecache_unless_the_daemon_read_it_since_the_last)
{
    jlm_rdb *eng = open_db(), *dmn = open_db();
    jlm_err err = {0};
    int64_t s = begin(eng, "m.jlm");
    /* blocks.0: nobody else read it: the page cache served it */
    ev(eng, s, "blocks", 0, -1, JLM_RDB_PAGE_IN, JLM_TIER_PAGECACHE, 4096);
    /* blocks.1: the daemon read it from disk (three FUSE reads) during the
     * page-in and flushed first */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(jlm_rdb_daemon_read(dmn, "m.jlm", "blocks", 1, -1, JLM_TIER_DISK, 1024, &err), 0, "%s", err.msg);
    ev(eng, s, "blocks", 1, -1, JLM_RDB_PAGE_IN, JLM_TIER_PAGECACHE, 4096);
    flush(dmn);
    flush(eng);
    /* blocks.2: packed on demand during the page-in; the engine flushed first */
    cr_assert_eq(jlm_rdb_daemon_read(dmn, "m.jlm", "blocks", 2, -1, JLM_TIER_CONVERT, 4096, &err), 0, "%s", err.msg);
    ev(eng, s, "blocks", 2, -1, JLM_RDB_PAGE_IN, JLM_TIER_PAGECACHE, 4096);
    flush(eng);
    flush(dmn);
    json_t *j = stats(eng, "m.jlm");
    json_t *p0 = page(j, "m.jlm", "blocks.0"), *p1 = page(j, "m.jlm", "blocks.1"), *p2 = page(j, "m.jlm", "blocks.2");
    EXPECT(p0, "tiers.pagecache", 1); EXPECT(p0, "tiers.disk", 0);
    EXPECT(p1, "tiers.pagecache", 0); EXPECT(p1, "tiers.disk", 1); EXPECT(p1, "daemon.disk", 3);
    EXPECT(p1, "daemon.bytes", 3072);
    EXPECT(p2, "tiers.pagecache", 0); EXPECT(p2, "tiers.convert", 1); EXPECT(p2, "daemon.convert", 1);
    json_decref(j);
    /* blocks.0 again: evicted, then a daemon read AFTER the first page-in (the
     * kernel dropped it): the second page-in is the disk one, the first stays */
    ev(eng, s, "blocks", 0, -1, JLM_RDB_EVICT, JLM_TIER_FRAME, 4096);
    flush(eng);
    cr_assert_eq(jlm_rdb_daemon_read(dmn, "m.jlm", "blocks", 0, -1, JLM_TIER_DISK, 4096, &err), 0, "%s", err.msg);
    flush(dmn);
    ev(eng, s, "blocks", 0, -1, JLM_RDB_PAGE_IN, JLM_TIER_PAGECACHE, 4096);
    ev(eng, s, "blocks", 0, -1, JLM_RDB_EVICT, JLM_TIER_FRAME, 4096);
    ev(eng, s, "blocks", 0, -1, JLM_RDB_PAGE_IN, JLM_TIER_PAGECACHE, 4096);   /* third: page cache again */
    flush(eng);
    j = stats(eng, "m.jlm");
    p0 = page(j, "m.jlm", "blocks.0");
    EXPECT(p0, "page_ins", 3); EXPECT(p0, "tiers.pagecache", 2); EXPECT(p0, "tiers.disk", 1);
    json_t *t = json_object_get(model(j, "m.jlm"), "totals");
    EXPECT(t, "tiers.pagecache", 2); EXPECT(t, "tiers.disk", 2); EXPECT(t, "tiers.convert", 1);
    json_decref(j);
    jlm_rdb_close(dmn);
    jlm_rdb_close(eng);
}

/* ---------------------------------------------------------------- concurrency */
#define WRITER_EVENTS 3000

static int writer(int id)
{
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    int64_t s = 0;
    if (jlm_rdb_open(dbpath, 1, &db, &err) || jlm_rdb_session_begin(db, "m.jlm", &s, &err))
        return fprintf(stderr, "writer %d: %s\n", id, err.msg), 1;
    for (int i = 0; i < WRITER_EVENTS; i++) {
        int kind = i % 10 == 0 ? JLM_RDB_PAGE_IN : JLM_RDB_HIT;
        if (jlm_rdb_event(db, s, "blocks", i % 16, -1, kind, JLM_TIER_FRAME, 4096, &err) ||
            (i % 50 == 49 && jlm_rdb_flush(db, &err)))
            return fprintf(stderr, "writer %d: %s\n", id, err.msg), 1;
        if (i % 500 == 0 && jlm_rdb_daemon_read(db, "m.jlm", "blocks", 0, -1, JLM_TIER_DISK, 1, &err))
            return fprintf(stderr, "writer %d: %s\n", id, err.msg), 1;
    }
    int rc = jlm_rdb_session_end(db, s, &err) != 0;
    if (rc)
        fprintf(stderr, "writer %d: %s\n", id, err.msg);
    jlm_rdb_close(db);
    return rc;
}

Test(residency, two_writer_processes_lose_no_counts)
{
    jlm_rdb_close(open_db());
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        cr_assert(kids[k] >= 0, "fork failed");
        if (kids[k] == 0)
            _exit(writer(k));
    }
    for (int k = 0; k < 2; k++) {
        int st = 0;
        waitpid(kids[k], &st, 0);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %d failed (status %d)", k, st);
    }
    jlm_rdb *db = open_db();
    json_t *j = stats(db, "m.jlm");
    json_t *t = json_object_get(model(j, "m.jlm"), "totals");
    EXPECT(t, "page_ins", 2 * WRITER_EVENTS / 10);
    EXPECT(t, "hits", 2 * (WRITER_EVENTS - WRITER_EVENTS / 10));
    EXPECT(t, "daemon.disk", 2 * (WRITER_EVENTS / 500));
    EXPECT(model(j, "m.jlm"), "sessions", 0);
    json_decref(j);
    resident(db, "m.jlm", "");
    jlm_rdb_close(db);
}

/* ---------------------------------------------------------------- bad files */
static void fill_two_models(void);

static void write_junk(const char *path)
{
    char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)("not a database, just text\n"[i % 26]);
    cr_assert_eq(tu_write_file(path, junk, sizeof junk), 0);
}

Test(residency, a_file_that_is_not_a_database_is_refused_naming_it)
{
    write_junk(dbpath);
    for (int mode = JLM_RDB_EXISTING; mode <= JLM_RDB_READONLY; mode += 2) {
        jlm_err err = {0};
        jlm_rdb *db = NULL;
        int rc = jlm_rdb_open(dbpath, mode, &db, &err);
        cr_assert_eq(rc, JLM_EFORMAT, "mode=%d: expected JLM_EFORMAT, got %d (%s)", mode, rc, err.msg);
        cr_assert_null(db, "out-param written on error");
        cr_assert(strstr(err.msg, dbpath), "message should name %s: %s", dbpath, err.msg);
    }
}

/* The path of the one PATH.corrupt-* next to dbpath, or NULL (malloc'd). */
static char *corrupt_copy(void)
{
    char *found = NULL;
    DIR *d = opendir(tmp);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, "jlmfs.db.corrupt-", 17)) {
            cr_assert_null(found, "two corrupt copies");
            cr_assert(asprintf(&found, "%s/%s", tmp, de->d_name) > 0);
        }
    if (d)
        closedir(d);
    return found;
}

Test(residency, a_corrupt_database_is_moved_aside_and_recreated_by_its_owner)
{
    fill_two_models();
    size_t n = 0;
    unsigned char *good = tu_read_file(dbpath, &n);
    cr_assert(good && n >= 4096, "database of %zu bytes", n);
    memset(good + 100, 0xA5, n - 100);   /* the header survives, every page is garbage */
    cr_assert_eq(tu_write_file(dbpath, good, n), 0);
    free(good);
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    int rc = jlm_rdb_open(dbpath, JLM_RDB_CREATE, &db, &err);
    cr_assert_eq(rc, 0, "the owner's open should recover: %d %s", rc, err.msg);
    char *aside = corrupt_copy();
    cr_assert(aside, "no jlmfs.db.corrupt-* next to the database");
    cr_assert_str_eq(jlm_rdb_moved_aside(db), aside);
    size_t m = 0;
    free(tu_read_file(aside, &m));
    cr_assert_eq(m, n, "the corrupt file was not kept as it was (%zu bytes, had %zu)", m, n);
    char *out = NULL;
    cr_assert_eq(jlm_rdb_stats_json(db, NULL, &out, &err), 0, "%s", err.msg);
    cr_assert(!strstr(out, "a.jlm"), "stale statistics after recovery:\n%s", out);
    free(out);
    int64_t s = begin(db, "c.jlm");   /* the new database takes writes */
    ev(db, s, "blocks", 0, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    flush(db);
    jlm_rdb_close(db);
    cr_assert_eq(jlm_rdb_open(dbpath, JLM_RDB_READONLY, &db, &err), 0, "%s", err.msg);
    cr_assert_null(jlm_rdb_moved_aside(db));
    jlm_rdb_close(db);
    free(aside);
}

Test(residency, a_corrupt_database_is_left_alone_by_readers)
{
    write_junk(dbpath);
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    cr_assert_eq(jlm_rdb_open(dbpath, JLM_RDB_EXISTING, &db, &err), JLM_EFORMAT, "%s", err.msg);
    cr_assert_null(corrupt_copy(), "a reader moved the database aside");
    cr_assert(tu_exists(dbpath));
}

/* jlm stats FILE on a file that is not a database (text, empty) and on a
 * database in rollback-journal mode: every byte and the mtime stay (before,
 * the WAL pragma turned the empty file into a database and rewrote the
 * other's header). */
Test(residency, jlm_stats_never_writes_to_the_file_it_is_given, .timeout = 60)
{
    char text[1200], empty[1200];
    snprintf(text, sizeof text, "%s/notes.txt", tmp);
    snprintf(empty, sizeof empty, "%s/empty", tmp);
    write_junk(text);
    cr_assert_eq(tu_write_file(empty, "", 0), 0);
    fill_two_models();
    sqlite3 *raw = NULL;
    cr_assert_eq(sqlite3_open(dbpath, &raw), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(raw, "PRAGMA journal_mode=DELETE", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(raw);
    const char *files[] = { text, empty, dbpath };
    for (int i = 0; i < 3; i++) {
        struct timespec old = { 1000000000, 0 }, times[2] = { old, old };
        cr_assert_eq(utimensat(AT_FDCWD, files[i], times, 0), 0);
        size_t n0 = 0, n1 = 0;
        unsigned char *before = tu_read_file(files[i], &n0);
        char cmd[2600], *out = NULL;
        snprintf(cmd, sizeof cmd, "'%s' stats '%s' --json", tu_jlm(), files[i]);
        int rc = tu_run(cmd, &out);
        cr_assert_eq(rc, i == 2 ? 0 : 1, "%s: exit %d\n%s", cmd, rc, out);
        if (i < 2)
            cr_assert(strstr(out, files[i]), "the error should name the file:\n%s", out);
        free(out);
        unsigned char *after = tu_read_file(files[i], &n1);
        cr_assert(n0 == n1 && (n0 == 0 || !memcmp(before, after, n0)), "%s: bytes changed (%zu -> %zu)",
                  files[i], n0, n1);
        struct stat st;
        cr_assert_eq(stat(files[i], &st), 0);
        cr_assert_eq(st.st_mtime, old.tv_sec, "%s: mtime changed", files[i]);
        free(before);
        free(after);
    }
}

Test(residency, a_sqlite_database_of_another_program_is_refused)
{
    sqlite3 *raw = NULL;
    cr_assert_eq(sqlite3_open(dbpath, &raw), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(raw, "CREATE TABLE t(x)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(raw);
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    cr_assert_eq(jlm_rdb_open(dbpath, 0, &db, &err), JLM_EFORMAT, "%s", err.msg);
    cr_assert(strstr(err.msg, dbpath), "message should name the file: %s", err.msg);
    snprintf(dbpath + strlen(dbpath), 20, ".absent");
    cr_assert_eq(jlm_rdb_open(dbpath, 0, &db, &err), JLM_ENOTFOUND, "%s", err.msg);
}

/* ---------------------------------------------------------------- stats output */
static void fill_two_models(void)
{
    jlm_rdb *db = open_db();
    int64_t s = begin(db, "a.jlm"), t = begin(db, "b.jlm");
    ev(db, s, "blocks", 12, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 65536);
    for (int i = 0; i < 7; i++)
        ev(db, s, "blocks", 12, -1, JLM_RDB_HIT, JLM_TIER_FRAME, 0);
    ev(db, s, "blocks", 12, -1, JLM_RDB_EVICT, JLM_TIER_FRAME, 65536);
    ev(db, s, "experts", 3, 5, JLM_RDB_PAGE_IN, JLM_TIER_PAGECACHE, 8192);
    ev(db, s, "experts", 3, 5, JLM_RDB_FILL, JLM_TIER_PAGECACHE, 4096);
    ev(db, t, "vision", 1, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    flush(db);
    jlm_rdb_close(db);   /* sessions stay registered: this process is alive */
}

/* Fields of the text line starting with name, or fails. */
static void text_fields(const char *text, const char *name, long long f[12])
{
    char key[80];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *l = strstr(text, key);
    cr_assert(l, "no line for %s in:\n%s", name, text);
    int n = sscanf(l + strlen(key), "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", &f[0], &f[1],
                   &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10], &f[11]);
    cr_assert_eq(n, 12, "line %s: %d numbers, expected 12:\n%s", name, n, text);
}

static void check_text(const char *text)
{
    long long f[12];
    cr_assert(strstr(text, "model a.jlm: 1 live sessions, 1 pages resident"), "model line missing:\n%s", text);
    /* page-ins fills hits evictions bytes t-frame t-pcache t-disk t-conv t-oth d-disk d-conv */
    text_fields(text, "blocks.12", f);
    cr_assert(f[0] == 1 && f[1] == 0 && f[2] == 7 && f[3] == 1 && f[4] == 65536 && f[5] == 7 && f[7] == 1,
              "blocks.12: %lld %lld %lld %lld %lld %lld %lld", f[0], f[1], f[2], f[3], f[4], f[5], f[7]);
    text_fields(text, "experts.3.5", f);
    cr_assert(f[0] == 1 && f[1] == 1 && f[4] == 12288 && f[6] == 2, "experts.3.5: %lld %lld %lld %lld",
              f[0], f[1], f[4], f[6]);
    text_fields(text, "total", f);
    cr_assert(f[0] == 2 && f[2] == 7 && f[4] == 77824, "a.jlm total: %lld %lld %lld", f[0], f[2], f[4]);
    cr_assert(strstr(text, "model b.jlm:") && strstr(text, "\nvision.1 "), "model b.jlm missing:\n%s", text);
}

static void check_json(const char *s)
{
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    cr_assert(j, "stats JSON does not parse: %s\n%s", je.text, s);
    json_t *p = page(j, "a.jlm", "blocks.12");
    cr_assert(p, "blocks.12 missing");
    EXPECT(p, "hits", 7); EXPECT(p, "bytes", 65536); EXPECT(p, "tiers.disk", 1);
    cr_assert(json_is_false(json_object_get(p, "resident")), "blocks.12 was evicted");
    p = page(j, "a.jlm", "experts.3.5");
    EXPECT(p, "a", 3); EXPECT(p, "b", 5);
    cr_assert(json_is_true(json_object_get(p, "resident")), "experts.3.5 is resident");
    EXPECT(json_object_get(model(j, "a.jlm"), "totals"), "bytes", 77824);
    EXPECT(json_object_get(model(j, "b.jlm"), "totals"), "page_ins", 1);
    json_decref(j);
}

Test(residency, stats_text_and_json_hold_the_counters)
{
    fill_two_models();
    jlm_rdb *db = open_db();
    jlm_err err = {0};
    char *s = NULL;
    cr_assert_eq(jlm_rdb_stats_text(db, NULL, &s, &err), 0, "%s", err.msg);
    check_text(s);
    free(s);
    cr_assert_eq(jlm_rdb_stats_text(db, "b.jlm", &s, &err), 0, "%s", err.msg);
    cr_assert(!strstr(s, "a.jlm"), "model filter ignored:\n%s", s);
    free(s);
    cr_assert_eq(jlm_rdb_stats_json(db, NULL, &s, &err), 0, "%s", err.msg);
    check_json(s);
    free(s);
    jlm_rdb_close(db);
}

Test(residency, jlm_stats_prints_a_database_as_text_and_json, .timeout = 60)
{
    fill_two_models();
    char cmd[2400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' stats '%s' --wide", tu_jlm(), dbpath);   /* residency's whole table */
    int rc = tu_run(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit %d\n%s", cmd, rc, out);
    check_text(out);
    free(out);
    /* the default: page, res, page-ins, hits, evict, read, last access */
    snprintf(cmd, sizeof cmd, "'%s' stats '%s'", tu_jlm(), dbpath);
    rc = tu_run(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit %d\n%s", cmd, rc, out);
    cr_assert(strstr(out, "model a.jlm: 1 live sessions, 1 pages resident"), "%s", out);
    cr_assert(strstr(out, "\nblocks.12        -        1         7        1   64.0 KiB  "), "%s", out);
    cr_assert(strstr(out, "\nexperts.3.5    yes        1         0        0   12.0 KiB  "), "%s", out);
    cr_assert(strstr(out, "\ntotal                     2         7        1   76.0 KiB  "), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' stats '%s' --json 2>/dev/null", tu_jlm(), dbpath);
    rc = tu_run(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit %d\n%s", cmd, rc, out);
    check_json(out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' stats '%s/nope.db'", tu_jlm(), tmp);
    rc = tu_run(cmd, &out);
    cr_assert(rc == 1 && strstr(out, "nope.db"), "missing db: exit %d, output:\n%s", rc, out);
    free(out);
}

/* ---------------------------------------------------------------- discovery */
/* A directory that takes user xattrs: the test's temp dir, else /var/tmp. */
static char *xattr_dir(void)
{
    const char *cands[] = { tmp, "/var/tmp" };
    for (int i = 0; i < 2; i++) {
        char *d = NULL;
        if (asprintf(&d, "%s/xattr.%d", cands[i], (int)getpid()) < 0)
            return NULL;
        mkdir(d, 0700);
        if (setxattr(d, "user.jlmfs.probe", "1", 1, 0) == 0)
            return d;
        tu_rmrf(d);
        free(d);
    }
    return NULL;
}

Test(residency, discover_reads_the_view_attributes_and_refuses_a_plain_file)
{
    char *d = xattr_dir();
    if (!d)
        cr_skip_test("user extended attributes unsupported in %s and /var/tmp", tmp);
    char f[1200], plain[1200];
    snprintf(f, sizeof f, "%s/model.jlm", d);
    snprintf(plain, sizeof plain, "%s/plain.jlm", tmp);
    cr_assert_eq(tu_write_file(f, "x", 1), 0);
    cr_assert_eq(tu_write_file(plain, "x", 1), 0);
    jlm_err err = {0};
    char *dbp = NULL, *key = NULL;
    cr_assert_eq(jlm_rdb_discover(plain, &dbp, &key, &err), JLM_ENOTFOUND, "plain file: %s", err.msg);
    cr_assert(strstr(err.msg, plain), "message should name the file: %s", err.msg);
    cr_assert_eq(setxattr(f, "user.jlmfs.db", dbpath, strlen(dbpath), 0), 0);
    cr_assert_eq(setxattr(f, "user.jlmfs.model", "foo.jlm", 7, 0), 0);
    cr_assert_eq(jlm_rdb_discover(f, &dbp, &key, &err), 0, "%s", err.msg);
    cr_assert_str_eq(dbp, dbpath);
    cr_assert_str_eq(key, "foo.jlm");
    free(dbp); free(key);
    /* on the directory: found there, and from a file in it that carries none */
    cr_assert_eq(setxattr(d, "user.jlmfs.db", dbpath, strlen(dbpath), 0), 0);
    cr_assert_eq(setxattr(d, "user.jlmfs.model", "bar.jlm", 7, 0), 0);
    snprintf(f, sizeof f, "%s/config.json", d);
    cr_assert_eq(tu_write_file(f, "{}", 2), 0);
    cr_assert_eq(jlm_rdb_discover(f, &dbp, &key, &err), 0, "%s", err.msg);
    cr_assert_str_eq(key, "bar.jlm");
    free(dbp); free(key);
    /* jlm stats on the view directory prints that model only */
    fill_two_models();
    jlm_rdb *db = open_db();
    int64_t s = begin(db, "bar.jlm");
    ev(db, s, "blocks", 4, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096);
    flush(db);
    jlm_rdb_close(db);
    char cmd[2400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' stats '%s'", tu_jlm(), d);
    int rc = tu_run(cmd, &out);
    cr_assert(rc == 0 && strstr(out, "model bar.jlm:") && strstr(out, "\nblocks.4 ") && !strstr(out, "a.jlm"),
              "%s: exit %d\n%s", cmd, rc, out);
    free(out);
    tu_rmrf(d);
    free(d);
}

/* ---------------------------------------------------------------- jlm run on a view */
/* A directory carrying the view attributes around a converted container
 * stands in for a jlmfs view: `jlm run` must report every pager event. */
Test(residency, jlm_run_on_a_view_reports_exactly_the_pager_counters, .timeout = 60)
{
    char *d = xattr_dir();
    if (!d)
        cr_skip_test("user extended attributes unsupported in %s and /var/tmp", tmp);
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' -o '%s/model.jlm'", tu_jlm(),
             tu_model("synth-llama-moe-256.Q4_K_M.gguf"), d);
    int rc = tu_run(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit %d\n%s", cmd, rc, out);
    free(out);
    cr_assert_eq(setxattr(d, "user.jlmfs.db", dbpath, strlen(dbpath), 0), 0);
    cr_assert_eq(setxattr(d, "user.jlmfs.model", "moe.jlm", 7, 0), 0);
    /* no database yet: one note, and the run still succeeds */
    snprintf(cmd, sizeof cmd, "{ '%s' run '%s' -p Hello -n 2 -t 1 >/dev/null; }", tu_jlm(), d);
    rc = tu_run(cmd, &out);
    cr_assert(rc == 0 && strstr(out, "residency reporting stopped") && strstr(out, dbpath),
              "without a database: exit %d\n%s", rc, out);
    free(out);
    jlm_rdb_close(open_db());
    snprintf(cmd, sizeof cmd, "{ '%s' run '%s' -p Hello -n 6 -t 1 --budget 1 --stats >/dev/null; }", tu_jlm(), d);
    rc = tu_run(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit %d\n%s", cmd, rc, out);
    long long pi = -1, evn = -1, br = -1, hi = -1;
    const char *l = strstr(out, "pager: ");
    cr_assert(l && sscanf(l, "pager: page-ins %lld, evictions %lld, bytes-read %lld (%*[^)]), hits %lld", &pi, &evn,
                          &br, &hi) == 4, "no pager line in:\n%s", out);
    cr_assert(!strstr(out, "residency reporting stopped"), "reporting failed:\n%s", out);
    free(out);
    jlm_rdb *db = open_db();
    json_t *j = stats(db, "moe.jlm");
    json_t *m = model(j, "moe.jlm"), *t = json_object_get(m, "totals");
    EXPECT(t, "page_ins", pi); EXPECT(t, "evictions", evn); EXPECT(t, "hits", hi);
    EXPECT(t, "bytes", br);
    EXPECT(m, "sessions", 0); EXPECT(m, "resident", 0);
    /* expert pages are named by (block, expert) inside the model's shape:
     * synth-llama-moe-256 has 2 blocks of 4 experts */
    size_t i, n_exp = 0;
    json_t *p;
    json_array_foreach(json_object_get(m, "pages"), i, p) {
        if (strcmp(json_string_value(json_object_get(p, "array")), "experts"))
            continue;
        n_exp++;
        long long a = num(p, "a"), b = num(p, "b");
        cr_assert(a >= 0 && a < 2 && b >= 0 && b < 4, "expert page %s outside 2 blocks x 4 experts",
                  json_string_value(json_object_get(p, "name")));
    }
    cr_assert(n_exp > 0, "no expert page reported");
    json_decref(j);
    jlm_rdb_close(db);
    tu_rmrf(d);
    free(d);
}

/* `jlm ps`'s view of a database: each live session with its pid, budget and
 * pages per array. A database made before sessions had a budget column (the
 * schema-1 sessions table as first released) still opens: read-only it lists
 * budget 0 and stays untouched; a read-write open adds the column. */
Test(residency, sessions_list_pid_budget_and_pages_and_an_older_database_migrates)
{
    sqlite3 *raw;
    cr_assert_eq(sqlite3_open(dbpath, &raw), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(raw,
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE models(id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, created REAL NOT NULL);"
        "CREATE TABLE sessions(id INTEGER PRIMARY KEY, model_id INTEGER NOT NULL REFERENCES models(id),"
        " pid INTEGER NOT NULL, pid_start INTEGER NOT NULL, started REAL NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '1');", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(raw);
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    /* CREATE adds the missing tables (IF NOT EXISTS) and then the column */
    cr_assert_eq(jlm_rdb_open(dbpath, JLM_RDB_CREATE, &db, &err), 0, "%s", err.msg);
    jlm_rdb_set_clock(db, fake_clock, NULL);
    int64_t s = begin(db, "a.jlm");
    cr_assert_eq(jlm_rdb_session_budget(db, s, 8u << 20, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_rdb_event(db, s, "blocks", 3, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_rdb_event(db, s, "blocks", 4, -1, JLM_RDB_PAGE_IN, JLM_TIER_DISK, 4096, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_rdb_flush(db, &err), 0, "%s", err.msg);
    jlm_rdb_session_info *v = NULL;
    size_t n = 0;
    cr_assert_eq(jlm_rdb_sessions(db, "a.jlm", &v, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 1);
    cr_assert(v[0].pid == getpid() && v[0].budget == 8u << 20 && v[0].pages[0] == 2 && v[0].pages[1] == 0 &&
              v[0].pages[2] == 0, "pid %lld budget %llu pages %llu", (long long)v[0].pid,
              (unsigned long long)v[0].budget, (unsigned long long)v[0].pages[0]);
    free(v);
    cr_assert_eq(jlm_rdb_sessions(db, "other.jlm", &v, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 0);
    free(v);
    jlm_rdb_close(db);

    /* an older database opened read-only: listed with budget 0, not migrated */
    char old[1200];
    snprintf(old, sizeof old, "%s/old.db", tmp);
    cr_assert_eq(jlm_rdb_open(old, JLM_RDB_CREATE, &db, &err), 0, "%s", err.msg);   /* today's schema, */
    jlm_rdb_close(db);
    cr_assert_eq(sqlite3_open(old, &raw), SQLITE_OK);   /* less the column: as an older build made it */
    cr_assert_eq(sqlite3_exec(raw, "ALTER TABLE sessions DROP COLUMN budget;"
                              "INSERT INTO models(key, created) VALUES ('a.jlm', 1.0)", NULL, NULL, NULL), SQLITE_OK,
                 "%s", sqlite3_errmsg(raw));
    sqlite3_close(raw);
    cr_assert_eq(jlm_rdb_open(old, JLM_RDB_READONLY, &db, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_rdb_sessions(db, "a.jlm", &v, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 0);
    free(v);
    jlm_rdb_close(db);
    cr_assert_eq(sqlite3_open(old, &raw), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(raw, "SELECT COUNT(*) FROM pragma_table_info('sessions') WHERE name = 'budget'",
                                    -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_eq(sqlite3_column_int(st, 0), 0, "a read-only open changed the file");
    sqlite3_finalize(st);
    sqlite3_close(raw);
}
