/* residency.c - the residency and statistics database (residency/residency.h).
 *
 * Sections: schema and open; discovery (xattrs); sessions and pruning; the
 * event queue and flush (tier attribution); queries (resident, stats text and
 * JSON). docs/residency.md gives the schema, the attribution rule and why.
 */
#include "residency/residency.h"
#include "base/tier.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define RDB_SCHEMA_VERSION 1
#define RDB_BUSY_MS        10000     /* a flush holds the write lock for ~ms; 10 s is "stuck" */
#define RDB_QUEUE_MAX      (1u << 20) /* queued records before event() flushes itself (~64 MiB) */
#define RDB_DAEMON         5         /* record kind of a daemon read (after enum jlm_rdb_kind) */

/* ---------------------------------------------------------------- state */
typedef struct rdb_rec {
    int64_t  sid;           /* engine events: session id; daemon reads: 0 */
    int64_t  model_id;      /* resolved at flush */
    uint32_t key_idx;       /* daemon reads: index into db->keys */
    uint32_t seq;           /* queue position: keeps per-page order after sorting */
    char     array[12];
    int32_t  a, b;
    int      kind, tier;
    uint64_t bytes;
    double   t;             /* CLOCK_REALTIME seconds when queued */
} rdb_rec;

enum {
    ST_MODEL_INS, ST_MODEL_ID, ST_SESS_MODEL, ST_PAGE_GET, ST_PAGE_PUT, ST_RES_INS, ST_RES_DEL,
    ST_COUNT
};
static const char *const STMT_SQL[ST_COUNT] = {
    [ST_MODEL_INS] = "INSERT OR IGNORE INTO models(key, created) VALUES (?1, ?2)",
    [ST_MODEL_ID] = "SELECT id FROM models WHERE key = ?1",
    [ST_SESS_MODEL] = "SELECT model_id FROM main.sessions WHERE id = ?1",   /* main.: see hide_dead_sessions */
    [ST_PAGE_GET] =
        "SELECT page_ins, fills, hits, evictions, bytes, t_frame, t_pagecache, t_disk, t_convert, t_other,"
        " d_disk, d_convert, d_bytes, last_access, eng_last, eng_claimed, d_pending"
        " FROM pages WHERE model_id = ?1 AND array = ?2 AND a = ?3 AND b = ?4",
    [ST_PAGE_PUT] =
        "INSERT INTO pages(model_id, array, a, b, page_ins, fills, hits, evictions, bytes, t_frame,"
        " t_pagecache, t_disk, t_convert, t_other, d_disk, d_convert, d_bytes, last_access, eng_last,"
        " eng_claimed, d_pending) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21)"
        " ON CONFLICT(model_id, array, a, b) DO UPDATE SET page_ins=excluded.page_ins, fills=excluded.fills,"
        " hits=excluded.hits, evictions=excluded.evictions, bytes=excluded.bytes, t_frame=excluded.t_frame,"
        " t_pagecache=excluded.t_pagecache, t_disk=excluded.t_disk, t_convert=excluded.t_convert,"
        " t_other=excluded.t_other, d_disk=excluded.d_disk, d_convert=excluded.d_convert,"
        " d_bytes=excluded.d_bytes, last_access=excluded.last_access, eng_last=excluded.eng_last,"
        " eng_claimed=excluded.eng_claimed, d_pending=excluded.d_pending",
    [ST_RES_INS] = "INSERT OR IGNORE INTO main.resident(session_id, model_id, array, a, b) VALUES (?1,?2,?3,?4,?5)",
    [ST_RES_DEL] = "DELETE FROM main.resident WHERE session_id = ?1 AND array = ?2 AND a = ?3 AND b = ?4",
};

struct jlm_rdb {
    sqlite3      *db;
    char         *path;
    sqlite3_stmt *st[ST_COUNT];
    rdb_rec      *q;                /* (nq,) queued records */
    size_t        nq, capq;
    char        **keys;             /* (nkeys,) model keys of queued daemon reads */
    size_t        nkeys;
    jlm_rdb_clock_fn clock;         /* wall clock of every stamp; never NULL */
    void         *clock_ctx;
    int           mode;             /* JLM_RDB_EXISTING, _CREATE or _READONLY */
    char         *moved_to;         /* where a corrupt database went at open, or NULL */
};

/* Page order everywhere: blocks, vision, experts, then a, then b. */
#define ORDER_PAGES "CASE array WHEN 'blocks' THEN 0 WHEN 'vision' THEN 1 ELSE 2 END, a, b"

static const char SCHEMA[] =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS models(id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, created REAL NOT NULL);"
    "CREATE TABLE IF NOT EXISTS sessions(id INTEGER PRIMARY KEY, model_id INTEGER NOT NULL REFERENCES models(id),"
    " pid INTEGER NOT NULL, pid_start INTEGER NOT NULL, started REAL NOT NULL, budget INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS pages(model_id INTEGER NOT NULL REFERENCES models(id), array TEXT NOT NULL,"
    " a INTEGER NOT NULL, b INTEGER NOT NULL,"
    " page_ins INTEGER NOT NULL DEFAULT 0, fills INTEGER NOT NULL DEFAULT 0, hits INTEGER NOT NULL DEFAULT 0,"
    " evictions INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0,"
    " t_frame INTEGER NOT NULL DEFAULT 0, t_pagecache INTEGER NOT NULL DEFAULT 0,"
    " t_disk INTEGER NOT NULL DEFAULT 0, t_convert INTEGER NOT NULL DEFAULT 0, t_other INTEGER NOT NULL DEFAULT 0,"
    " d_disk INTEGER NOT NULL DEFAULT 0, d_convert INTEGER NOT NULL DEFAULT 0, d_bytes INTEGER NOT NULL DEFAULT 0,"
    " last_access REAL NOT NULL DEFAULT 0, eng_last REAL NOT NULL DEFAULT 0,"
    " eng_claimed INTEGER NOT NULL DEFAULT 1, d_pending INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY(model_id, array, a, b)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS resident(session_id INTEGER NOT NULL REFERENCES sessions(id),"
    " model_id INTEGER NOT NULL, array TEXT NOT NULL, a INTEGER NOT NULL, b INTEGER NOT NULL,"
    " PRIMARY KEY(session_id, array, a, b)) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS resident_model ON resident(model_id, array, a, b);"
    "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');";

static double now_real(void *ctx)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void jlm_rdb_set_clock(jlm_rdb *db, jlm_rdb_clock_fn fn, void *ctx)
{
    db->clock = fn ? fn : now_real;
    db->clock_ctx = fn ? ctx : NULL;
}

/* The SQLite failure as a JLM code with the path and SQLite's message. */
static int sqerr(jlm_rdb *db, jlm_err *err, int rc, const char *what)
{
    int code = JLM_EIO;
    if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT)
        code = JLM_EFORMAT;
    else if (rc == SQLITE_NOMEM)
        code = JLM_ENOMEM;
    else if (rc == SQLITE_FULL)
        code = JLM_ENOSPC;
    const char *m = db->db ? sqlite3_errmsg(db->db) : sqlite3_errstr(rc);
    if (code == JLM_EFORMAT)
        return jlm_errf(err, code, "%s: not a valid SQLite database (%s: %s)", db->path, what, m);
    return jlm_errf(err, code, "%s: residency database: %s: %s", db->path, what, m);
}

static int exec(jlm_rdb *db, const char *sql, const char *what, jlm_err *err)
{
    int rc = sqlite3_exec(db->db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : sqerr(db, err, rc, what);
}

static void rollback(jlm_rdb *db)
{
    if (!sqlite3_get_autocommit(db->db))
        sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
}

/* ---------------------------------------------------------------- open / close */
static int check_schema(jlm_rdb *db, int create, jlm_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &s, NULL);
    if (rc != SQLITE_OK) {
        if (rc == SQLITE_ERROR && !create)
            return jlm_errf(err, JLM_EFORMAT, "%s: a SQLite database without jlmfs residency tables", db->path);
        return sqerr(db, err, rc, "schema");
    }
    int v = -1;
    if ((rc = sqlite3_step(s)) == SQLITE_ROW)
        v = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return sqerr(db, err, rc, "schema");
    if (v != RDB_SCHEMA_VERSION)
        return jlm_errf(err, JLM_EVERSION, "%s: residency schema version %d, this build reads version %d",
                        db->path, v, RDB_SCHEMA_VERSION);
    return 0;
}

static int pid_alive(int64_t pid, int64_t start);

/* 1 if the sessions table has the budget column (added after schema 1's
 * first release), 0 if not, -1 on error. */
static int has_budget_column(jlm_rdb *db)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db->db, "SELECT name FROM pragma_table_info('sessions') WHERE name = 'budget'", -1, &s,
                           NULL) != SQLITE_OK)
        return -1;
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : -1;
}

/* The migration to sessions.budget: an added column with a default, so the
 * schema version stays 1 both ways (an older build inserts sessions naming
 * its columns and reads them by name; this one reads a database an older
 * build made, read-only too, as budget 0). Under BEGIN IMMEDIATE, looking
 * again inside, so two openers never both add it. */
static int add_budget_column(jlm_rdb *db, jlm_err *err)
{
    int h = has_budget_column(db);
    if (h == 1)
        return 0;
    int e = exec(db, "BEGIN IMMEDIATE", "add sessions.budget", err);
    if (!e && (h = has_budget_column(db)) == 0)
        e = exec(db, "ALTER TABLE sessions ADD COLUMN budget INTEGER NOT NULL DEFAULT 0", "add sessions.budget", err);
    if (!e && h < 0)
        e = jlm_errf(err, JLM_EIO, "%s: cannot read the sessions table's columns", db->path);
    if (!e)
        e = exec(db, "COMMIT", "add sessions.budget", err);
    if (e)
        rollback(db);
    return e;
}

/* SQL jlm_alive(pid, pid_start): 1 while that engine process lives. */
static void sql_alive(sqlite3_context *c, int n, sqlite3_value **v)
{
    sqlite3_result_int(c, pid_alive(sqlite3_value_int64(v[0]), sqlite3_value_int64(v[1])));
}

/* Read-only: no pruning, so dead engines' sessions and residency are hidden
 * instead, by TEMP views that shadow the tables for every unqualified query
 * (TEMP lives in memory; the file is not touched). */
static int hide_dead_sessions(jlm_rdb *db, jlm_err *err)
{
    int rc = sqlite3_create_function(db->db, "jlm_alive", 2, SQLITE_UTF8, NULL, sql_alive, NULL, NULL);
    if (rc != SQLITE_OK)
        return sqerr(db, err, rc, "jlm_alive");
    return exec(db, "CREATE TEMP VIEW sessions AS SELECT * FROM main.sessions WHERE jlm_alive(pid, pid_start);"
                "CREATE TEMP VIEW resident AS SELECT * FROM main.resident WHERE session_id IN"
                " (SELECT id FROM temp.sessions)", "live sessions", err);
}

/* JLM_RDB_CREATE (the daemon's database, in a folder it owns): the file is
 * made 0600 before SQLite sees it (SQLite gives its -wal and -shm the
 * database's mode), an older wider one is narrowed, and a symbolic link is
 * refused, never followed. */
static int create_private(jlm_rdb *db, jlm_err *err)
{
    int fd = open(db->path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return jlm_errf(err, JLM_EIO, "%s: residency database: %s", db->path,
                        e == ELOOP ? "a symbolic link: refused" : strerror(e));
    }
    int rc = 0;
    if (!S_ISREG(st.st_mode))
        rc = jlm_errf(err, JLM_EINVAL, "%s: residency database: not a regular file", db->path);
    else if (st.st_uid == geteuid() && (st.st_mode & 077) && fchmod(fd, st.st_mode & 0700))
        rc = jlm_errf(err, JLM_EIO, "%s: residency database: chmod: %s", db->path, strerror(errno));
    close(fd);
    return rc;
}

static int open_db(jlm_rdb *db, int mode, jlm_err *err)
{
    int create = mode == JLM_RDB_CREATE;
    int flags = (mode == JLM_RDB_READONLY ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) |
                (create ? SQLITE_OPEN_CREATE | SQLITE_OPEN_NOFOLLOW : 0) | SQLITE_OPEN_NOMUTEX;
    if (create) {
        int e = create_private(db, err);
        if (e)
            return e;
    }
    int rc = sqlite3_open_v2(db->path, &db->db, flags, NULL);
    if (rc != SQLITE_OK)
        return sqerr(db, err, rc, "open");
    sqlite3_busy_timeout(db->db, RDB_BUSY_MS);
    /* journal_mode reads the file header: the first place a non-database
     * fails. Read-only: not at all (it would rewrite the header, and turn an
     * empty file into a database); check_schema's read fails instead. */
    int e = 0;
    if (mode != JLM_RDB_READONLY)
        e = exec(db, "PRAGMA journal_mode=WAL", "journal_mode=WAL", err);
    if (!e && mode != JLM_RDB_READONLY)
        e = exec(db, "PRAGMA synchronous=NORMAL", "synchronous=NORMAL", err);
    if (!e && create) {
        e = exec(db, "BEGIN IMMEDIATE", "create schema", err);
        if (!e)
            e = exec(db, SCHEMA, "create schema", err);
        if (!e)
            e = exec(db, "COMMIT", "create schema", err);
        if (e)
            rollback(db);
    }
    if (!e)
        e = check_schema(db, create, err);
    if (!e && mode != JLM_RDB_READONLY)
        e = add_budget_column(db, err);
    if (!e && mode == JLM_RDB_READONLY)
        e = hide_dead_sessions(db, err);
    for (int i = 0; !e && i < ST_COUNT; i++) {
        rc = sqlite3_prepare_v3(db->db, STMT_SQL[i], -1, SQLITE_PREPARE_PERSISTENT, &db->st[i], NULL);
        if (rc != SQLITE_OK)
            e = sqerr(db, err, rc, "prepare");
    }
    return e;
}

/* Closes the SQLite handle and its statements, keeping db itself. */
static void close_sqlite(jlm_rdb *db)
{
    for (int i = 0; i < ST_COUNT; i++) {
        sqlite3_finalize(db->st[i]);
        db->st[i] = NULL;
    }
    sqlite3_close(db->db);
    db->db = NULL;
}

/* Renames the corrupt database to PATH.corrupt-STAMP and removes its WAL and
 * shared-memory files (they belong to the damaged file). */
static int move_aside(jlm_rdb *db, jlm_err *err)
{
    char *to = NULL, side[4200];
    if (asprintf(&to, "%s.corrupt-%lld", db->path, (long long)time(NULL)) < 0)
        return jlm_errf(err, JLM_ENOMEM, "%s: residency database: out of memory", db->path);
    if (rename(db->path, to) != 0) {
        if (errno != ENOENT) {
            int e = jlm_errf(err, JLM_EIO, "%s: residency database is corrupt and cannot be moved aside: %s",
                             db->path, strerror(errno));
            free(to);
            return e;
        }
        free(to);   /* removed: nothing to keep; moved_aside says NULL */
        to = NULL;
    }
    for (int i = 0; i < 2; i++) {
        snprintf(side, sizeof side, "%s%s", db->path, i ? "-shm" : "-wal");
        unlink(side);
    }
    free(db->moved_to);
    db->moved_to = to;
    return 0;
}

int jlm_rdb_open(const char *path, int mode, jlm_rdb **out, jlm_err *err)
{
    struct stat st;
    int create = mode == JLM_RDB_CREATE;
    if (!create && stat(path, &st) != 0)
        return jlm_errf(err, errno == ENOENT ? JLM_ENOTFOUND : JLM_EIO, "%s: residency database: %s",
                        path, strerror(errno));
    if (!create && !S_ISREG(st.st_mode))
        return jlm_errf(err, JLM_EINVAL, "%s: residency database: not a regular file", path);
    jlm_rdb *db = calloc(1, sizeof *db);
    if (!db || !(db->path = strdup(path))) {
        free(db);
        return jlm_errf(err, JLM_ENOMEM, "%s: residency database: out of memory", path);
    }
    db->clock = now_real;
    db->mode = mode;
    int e = open_db(db, mode, err);
    if (e == JLM_EFORMAT && create) {   /* corrupt: keep it for a post-mortem, start afresh */
        close_sqlite(db);
        e = move_aside(db, err);
        if (!e)
            e = open_db(db, mode, err);
    }
    if (e) {
        jlm_rdb_close(db);
        return e;
    }
    *out = db;
    return 0;
}

int jlm_rdb_check(const jlm_rdb *db, jlm_err *err)
{
    static const char magic[16] = "SQLite format 3";
    char head[16] = {0};
    int fd = open(db->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n = fd >= 0 ? pread(fd, head, sizeof head, 0) : -1;
    if (fd >= 0)
        close(fd);
    if (n != (ssize_t)sizeof head || memcmp(head, magic, sizeof magic))
        return jlm_errf(err, JLM_EFORMAT, "%s: no longer a SQLite database (%s)", db->path,
                        fd < 0 ? strerror(errno) : "header overwritten");
    return 0;
}

int jlm_rdb_recreate(jlm_rdb *db, jlm_err *err)
{
    int e = move_aside(db, err);
    close_sqlite(db);
    size_t k = 0;   /* queued daemon reads are new and kept; engine events name old sessions */
    for (size_t i = 0; i < db->nq; i++)
        if (db->q[i].sid == 0)
            db->q[k++] = db->q[i];
    db->nq = k;
    return e ? e : open_db(db, JLM_RDB_CREATE, err);
}

const char *jlm_rdb_moved_aside(const jlm_rdb *db)
{
    return db ? db->moved_to : NULL;
}

void jlm_rdb_close(jlm_rdb *db)
{
    if (!db)
        return;
    close_sqlite(db);
    free(db->moved_to);
    for (size_t i = 0; i < db->nkeys; i++)
        free(db->keys[i]);
    free(db->keys);
    free(db->q);
    free(db->path);
    free(db);
}

/* ---------------------------------------------------------------- discovery */
static char *get_xattr(const char *path, const char *name)
{
    char buf[4096];
    ssize_t n = getxattr(path, name, buf, sizeof buf - 1);
    if (n <= 0)
        return NULL;
    buf[n] = 0;
    return strdup(buf);
}

/* The view's attributes are on its directory and the files in it: try path,
 * then its parent directory (a file inside a view that carries none). */
int jlm_rdb_discover(const char *path, char **db_path, char **model_key, jlm_err *err)
{
    char *dbp = get_xattr(path, "user.jlmfs.db"), *key = NULL, *dir = NULL;
    const char *where = path;
    if (!dbp) {
        char *tmp = strdup(path);
        if (!tmp)
            return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", path);
        dir = strdup(dirname(tmp));
        free(tmp);
        if (dir && (dbp = get_xattr(dir, "user.jlmfs.db")))
            where = dir;
    }
    if (dbp)
        key = get_xattr(where, "user.jlmfs.model");
    free(dir);
    if (!dbp || !key) {
        free(dbp);
        free(key);
        return jlm_errf(err, JLM_ENOTFOUND, "%s: not on a jlmfs view (no user.jlmfs.db and user.jlmfs.model "
                        "attributes)", path);
    }
    *db_path = dbp;
    *model_key = key;
    return 0;
}

/* ---------------------------------------------------------------- sessions */
/* Start time of a process in clock ticks since boot (/proc/PID/stat field 22),
 * so a recycled pid is not taken for the engine that registered; 0 if unknown. */
static int64_t pid_start(pid_t pid)
{
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *s = strrchr(buf, ')');   /* the command name may hold spaces and ')' */
    if (!s)
        return 0;
    long long v = 0;
    /* after ") " come fields 3..: state, then 18 numbers before starttime (22) */
    if (sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %lld", &v) != 1)
        return 0;
    return v;
}

static int pid_alive(int64_t pid, int64_t start)
{
    if (pid <= 0 || pid > INT32_MAX)
        return 0;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM)
        return 0;
    return start == 0 || pid_start((pid_t)pid) == start;
}

/* Deletes sessions whose process is gone, and their residency rows. Runs in
 * its own transaction (call outside one). */
static int prune(jlm_rdb *db, jlm_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->db, "SELECT id, pid, pid_start FROM sessions", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return sqerr(db, err, rc, "list sessions");
    int64_t dead[64];
    size_t nd = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW && nd < 64)
        if (!pid_alive(sqlite3_column_int64(s, 1), sqlite3_column_int64(s, 2)))
            dead[nd++] = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return sqerr(db, err, rc, "list sessions");
    if (nd == 0)
        return 0;
    int e = exec(db, "BEGIN IMMEDIATE", "prune sessions", err);
    for (size_t i = 0; !e && i < nd; i++) {
        char sql[160];
        snprintf(sql, sizeof sql, "DELETE FROM resident WHERE session_id = %lld; DELETE FROM sessions WHERE id = %lld",
                 (long long)dead[i], (long long)dead[i]);
        e = exec(db, sql, "prune sessions", err);
    }
    if (!e)
        e = exec(db, "COMMIT", "prune sessions", err);
    if (e)
        rollback(db);
    return e;
}

/* models.id of key, inserting it (inside the caller's transaction). */
static int model_id(jlm_rdb *db, const char *key, int64_t *id, jlm_err *err)
{
    sqlite3_stmt *ins = db->st[ST_MODEL_INS], *sel = db->st[ST_MODEL_ID];
    sqlite3_bind_text(ins, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_double(ins, 2, db->clock(db->clock_ctx));
    int rc = sqlite3_step(ins);
    sqlite3_reset(ins);
    if (rc != SQLITE_DONE)
        return sqerr(db, err, rc, "insert model");
    sqlite3_bind_text(sel, 1, key, -1, SQLITE_STATIC);
    rc = sqlite3_step(sel);
    if (rc == SQLITE_ROW)
        *id = sqlite3_column_int64(sel, 0);
    sqlite3_reset(sel);
    return rc == SQLITE_ROW ? 0 : sqerr(db, err, rc, "find model");
}

int jlm_rdb_session_begin(jlm_rdb *db, const char *model_key, int64_t *session, jlm_err *err)
{
    int e = prune(db, err);
    if (e)
        return e;
    int64_t mid = 0;
    if ((e = exec(db, "BEGIN IMMEDIATE", "begin session", err)) || (e = model_id(db, model_key, &mid, err))) {
        rollback(db);
        return e;
    }
    char sql[200];
    snprintf(sql, sizeof sql, "INSERT INTO sessions(model_id, pid, pid_start, started) VALUES (%lld, %d, %lld, %.6f)",
             (long long)mid, (int)getpid(), (long long)pid_start(getpid()), db->clock(db->clock_ctx));
    if ((e = exec(db, sql, "begin session", err))) {
        rollback(db);
        return e;
    }
    int64_t id = sqlite3_last_insert_rowid(db->db);
    if ((e = exec(db, "COMMIT", "begin session", err))) {
        rollback(db);
        return e;
    }
    *session = id;
    return 0;
}

int jlm_rdb_session_end(jlm_rdb *db, int64_t session, jlm_err *err)
{
    int e = jlm_rdb_flush(db, err);
    if (e) {   /* drop this session's queued events: they can never be written now */
        size_t k = 0;
        for (size_t i = 0; i < db->nq; i++)
            if (db->q[i].sid != session)
                db->q[k++] = db->q[i];
        db->nq = k;
    }
    char sql[160];
    snprintf(sql, sizeof sql, "BEGIN IMMEDIATE; DELETE FROM resident WHERE session_id = %lld;"
             " DELETE FROM sessions WHERE id = %lld; COMMIT", (long long)session, (long long)session);
    int e2 = exec(db, sql, "end session", e ? NULL : err);
    if (e2)
        rollback(db);
    return e ? e : e2;
}

/* ---------------------------------------------------------------- queue */
static int valid_array(const char *array)
{
    return array && (!strcmp(array, "blocks") || !strcmp(array, "vision") || !strcmp(array, "experts"));
}

static int enqueue(jlm_rdb *db, const rdb_rec *r, jlm_err *err)
{
    if (db->nq == db->capq) {
        if (db->nq >= RDB_QUEUE_MAX) {
            int e = jlm_rdb_flush(db, err);
            if (e)
                return e;
        }
        if (db->nq == db->capq) {
            size_t cap = db->capq ? db->capq * 2 : 1024;
            rdb_rec *q = realloc(db->q, cap * sizeof *q);
            if (!q)
                return jlm_errf(err, JLM_ENOMEM, "%s: residency event queue: out of memory", db->path);
            db->q = q;
            db->capq = cap;
        }
    }
    db->q[db->nq] = *r;
    db->q[db->nq].seq = (uint32_t)db->nq;
    db->nq++;
    return 0;
}

int jlm_rdb_event(jlm_rdb *db, int64_t session, const char *array, int32_t a, int32_t b,
                  int kind, int tier, uint64_t bytes, jlm_err *err)
{
    if (!valid_array(array) || kind < JLM_RDB_PAGE_IN || kind > JLM_RDB_EVICT || bytes > INT64_MAX)
        return jlm_errf(err, JLM_EINVAL, "%s: residency event: array '%s', kind %d (expected blocks, vision or "
                        "experts and kind 1..4)", db->path, array ? array : "(null)", kind);
    rdb_rec r = { .sid = session, .a = a, .b = b, .kind = kind, .tier = tier, .bytes = bytes, .t = db->clock(db->clock_ctx) };
    snprintf(r.array, sizeof r.array, "%s", array);
    return enqueue(db, &r, err);
}

int jlm_rdb_daemon_read(jlm_rdb *db, const char *model_key, const char *array, int32_t a, int32_t b,
                        int tier, uint64_t bytes, jlm_err *err)
{
    if (!valid_array(array) || (tier != JLM_TIER_DISK && tier != JLM_TIER_CONVERT) || !model_key || bytes > INT64_MAX)
        return jlm_errf(err, JLM_EINVAL, "%s: daemon read: array '%s', tier %d (expected blocks, vision or experts "
                        "and tier disk or convert)", db->path, array ? array : "(null)", tier);
    size_t k = 0;
    while (k < db->nkeys && strcmp(db->keys[k], model_key))
        k++;
    if (k == db->nkeys) {
        char **keys = realloc(db->keys, (k + 1) * sizeof *keys);
        if (keys)
            db->keys = keys;
        if (!keys || !(keys[k] = strdup(model_key)))
            return jlm_errf(err, JLM_ENOMEM, "%s: daemon read: out of memory", db->path);
        db->nkeys++;
    }
    rdb_rec r = { .key_idx = (uint32_t)k, .a = a, .b = b, .kind = RDB_DAEMON, .tier = tier, .bytes = bytes,
                  .t = db->clock(db->clock_ctx) };
    snprintf(r.array, sizeof r.array, "%s", array);
    return enqueue(db, &r, err);
}

/* ---------------------------------------------------------------- flush */
/* One page's row, as read, changed by the page's queued records, and written. */
typedef struct page_row {
    int64_t page_ins, fills, hits, evictions, bytes;
    int64_t t_frame, t_pagecache, t_disk, t_convert, t_other;
    int64_t d_disk, d_convert, d_bytes;
    double  last_access, eng_last;
    int64_t eng_claimed, d_pending;
} page_row;

static int64_t *tier_slot(page_row *p, int tier)
{
    switch (tier) {
    case JLM_TIER_FRAME: return &p->t_frame;
    case JLM_TIER_PAGECACHE: return &p->t_pagecache;
    case JLM_TIER_DISK: return &p->t_disk;
    case JLM_TIER_CONVERT: return &p->t_convert;
    default: return &p->t_other;
    }
}

/* The attribution rule (docs/residency.md): an engine read of a view page
 * (tier PAGECACHE) is a DISK or CONVERT read if the daemon served that page
 * since the engine's previous read of it. A daemon read that arrives before
 * the engine's (d_pending) is claimed by the next engine read; one that
 * arrives after an unclaimed engine read at a later time moves that read. */
static void apply(page_row *p, const rdb_rec *r)
{
    if (r->kind == RDB_DAEMON) {
        *(r->tier == JLM_TIER_CONVERT ? &p->d_convert : &p->d_disk) += 1;
        p->d_bytes += (int64_t)r->bytes;
        if (r->t <= p->eng_last && !p->eng_claimed && p->t_pagecache > 0) {
            p->t_pagecache--;
            *tier_slot(p, r->tier) += 1;
            p->eng_claimed = 1;
        } else if (r->t > p->eng_last && r->tier > p->d_pending) {
            p->d_pending = r->tier;   /* CONVERT (4) outranks DISK (3) */
        }
    } else if (r->kind == JLM_RDB_PAGE_IN || r->kind == JLM_RDB_FILL) {
        *(r->kind == JLM_RDB_PAGE_IN ? &p->page_ins : &p->fills) += 1;
        p->bytes += (int64_t)r->bytes;
        if (r->tier == JLM_TIER_PAGECACHE && p->d_pending) {
            *tier_slot(p, (int)p->d_pending) += 1;
            p->eng_claimed = 1;
        } else {
            *tier_slot(p, r->tier) += 1;
            p->eng_claimed = r->tier != JLM_TIER_PAGECACHE;
        }
        p->d_pending = 0;
        p->eng_last = r->t;
    } else if (r->kind == JLM_RDB_HIT) {
        p->hits++;
        *tier_slot(p, r->tier) += 1;
    } else {
        p->evictions++;
    }
    if (r->kind != JLM_RDB_EVICT && r->t > p->last_access)
        p->last_access = r->t;
}

static int cmp_rec(const void *x, const void *y)
{
    const rdb_rec *a = x, *b = y;
    if (a->model_id != b->model_id) return a->model_id < b->model_id ? -1 : 1;
    int c = strcmp(a->array, b->array);
    if (c) return c;
    if (a->a != b->a) return a->a < b->a ? -1 : 1;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static int cmp_seq(const void *x, const void *y)
{
    const rdb_rec *a = x, *b = y;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static int same_page(const rdb_rec *x, const rdb_rec *y)
{
    return x->model_id == y->model_id && x->a == y->a && x->b == y->b && !strcmp(x->array, y->array);
}

static void bind_page(sqlite3_stmt *s, const rdb_rec *r)
{
    sqlite3_bind_int64(s, 1, r->model_id);
    sqlite3_bind_text(s, 2, r->array, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 3, r->a);
    sqlite3_bind_int(s, 4, r->b);
}

static int load_row(jlm_rdb *db, const rdb_rec *r, page_row *p, jlm_err *err)
{
    sqlite3_stmt *s = db->st[ST_PAGE_GET];
    bind_page(s, r);
    memset(p, 0, sizeof *p);
    p->eng_claimed = 1;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        int64_t *v[] = { &p->page_ins, &p->fills, &p->hits, &p->evictions, &p->bytes, &p->t_frame,
                         &p->t_pagecache, &p->t_disk, &p->t_convert, &p->t_other, &p->d_disk,
                         &p->d_convert, &p->d_bytes };
        for (int i = 0; i < 13; i++)
            *v[i] = sqlite3_column_int64(s, i);
        p->last_access = sqlite3_column_double(s, 13);
        p->eng_last = sqlite3_column_double(s, 14);
        p->eng_claimed = sqlite3_column_int64(s, 15);
        p->d_pending = sqlite3_column_int64(s, 16);
    }
    sqlite3_reset(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : sqerr(db, err, rc, "read page counters");
}

static int store_row(jlm_rdb *db, const rdb_rec *r, const page_row *p, jlm_err *err)
{
    sqlite3_stmt *s = db->st[ST_PAGE_PUT];
    bind_page(s, r);
    const int64_t v[] = { p->page_ins, p->fills, p->hits, p->evictions, p->bytes, p->t_frame, p->t_pagecache,
                          p->t_disk, p->t_convert, p->t_other, p->d_disk, p->d_convert, p->d_bytes };
    for (int i = 0; i < 13; i++)
        sqlite3_bind_int64(s, 5 + i, v[i]);
    sqlite3_bind_double(s, 18, p->last_access);
    sqlite3_bind_double(s, 19, p->eng_last);
    sqlite3_bind_int64(s, 20, p->eng_claimed);
    sqlite3_bind_int64(s, 21, p->d_pending);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? 0 : sqerr(db, err, rc, "write page counters");
}

static int residency_row(jlm_rdb *db, const rdb_rec *r, jlm_err *err)
{
    int ins = r->kind == JLM_RDB_PAGE_IN;
    sqlite3_stmt *s = db->st[ins ? ST_RES_INS : ST_RES_DEL];
    sqlite3_bind_int64(s, 1, r->sid);
    if (ins) {
        sqlite3_bind_int64(s, 2, r->model_id);
        sqlite3_bind_text(s, 3, r->array, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(s, 4, r->a);
        sqlite3_bind_int(s, 5, r->b);
    } else {
        sqlite3_bind_text(s, 2, r->array, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(s, 3, r->a);
        sqlite3_bind_int(s, 4, r->b);
    }
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? 0 : sqerr(db, err, rc, "write residency");
}

/* Fills model_id of every queued record (inside the flush transaction). */
static int resolve_models(jlm_rdb *db, jlm_err *err)
{
    int64_t last_sid = 0, last_mid = 0;
    int64_t *key_ids = calloc(db->nkeys ? db->nkeys : 1, sizeof *key_ids);
    if (!key_ids)
        return jlm_errf(err, JLM_ENOMEM, "%s: flush: out of memory", db->path);
    int e = 0;
    for (size_t k = 0; !e && k < db->nkeys; k++)
        e = model_id(db, db->keys[k], &key_ids[k], err);
    for (size_t i = 0; !e && i < db->nq; i++) {
        rdb_rec *r = &db->q[i];
        if (r->kind == RDB_DAEMON) {
            r->model_id = key_ids[r->key_idx];
            continue;
        }
        if (r->sid != last_sid || !last_sid) {
            sqlite3_stmt *s = db->st[ST_SESS_MODEL];
            sqlite3_bind_int64(s, 1, r->sid);
            int rc = sqlite3_step(s);
            if (rc == SQLITE_ROW)
                last_mid = sqlite3_column_int64(s, 0);
            sqlite3_reset(s);
            if (rc == SQLITE_DONE)
                e = jlm_errf(err, JLM_ENOTFOUND, "%s: flush: session %lld is not registered (ended, or pruned as dead)",
                             db->path, (long long)r->sid);
            else if (rc != SQLITE_ROW)
                e = sqerr(db, err, rc, "find session");
            last_sid = r->sid;
        }
        r->model_id = last_mid;
    }
    free(key_ids);
    return e;
}

/* Hot path of reporting: one transaction, one read and one UPSERT per
 * distinct page, one residency statement per page-in or eviction. */
int jlm_rdb_flush(jlm_rdb *db, jlm_err *err)
{
    if (db->nq == 0)
        return 0;
    int e = exec(db, "BEGIN IMMEDIATE", "flush", err);
    if (!e)
        e = resolve_models(db, err);
    if (!e)
        qsort(db->q, db->nq, sizeof *db->q, cmp_rec);
    for (size_t i = 0; !e && i < db->nq;) {
        page_row p;
        size_t j = i;
        e = load_row(db, &db->q[i], &p, err);
        for (; !e && j < db->nq && same_page(&db->q[i], &db->q[j]); j++) {
            apply(&p, &db->q[j]);
            if (db->q[j].kind == JLM_RDB_PAGE_IN || db->q[j].kind == JLM_RDB_EVICT)
                e = residency_row(db, &db->q[j], err);
        }
        if (!e)
            e = store_row(db, &db->q[i], &p, err);
        i = j;
    }
    if (!e)
        e = exec(db, "COMMIT", "flush", err);
    if (e) {
        rollback(db);   /* the queue is kept (in queue order again) for a later flush */
        qsort(db->q, db->nq, sizeof *db->q, cmp_seq);
        return e;
    }
    db->nq = 0;
    for (size_t k = 0; k < db->nkeys; k++)
        free(db->keys[k]);
    db->nkeys = 0;
    return 0;
}

/* ---------------------------------------------------------------- resident */
static void page_name(char *buf, size_t n, const char *array, int32_t a, int32_t b)
{
    if (b >= 0)
        snprintf(buf, n, "%s.%d.%d", array, (int)a, (int)b);
    else
        snprintf(buf, n, "%s.%d", array, (int)a);
}

void jlm_rdb_free_names(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

int jlm_rdb_resident(jlm_rdb *db, const char *model_key, char ***names, size_t *n, jlm_err *err)
{
    if (db->mode != JLM_RDB_READONLY)
        prune(db, NULL);   /* best effort: a busy database still lists */
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->db, "SELECT DISTINCT r.array, r.a, r.b FROM resident r JOIN models m ON"
                                " m.id = r.model_id WHERE m.key = ?1 ORDER BY " ORDER_PAGES, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return sqerr(db, err, rc, "list resident pages");
    sqlite3_bind_text(s, 1, model_key, -1, SQLITE_STATIC);
    char **v = NULL;
    size_t k = 0, cap = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        char name[64];
        page_name(name, sizeof name, (const char *)sqlite3_column_text(s, 0), sqlite3_column_int(s, 1),
                  sqlite3_column_int(s, 2));
        if (k == cap) {
            char **nv = realloc(v, (cap = cap ? cap * 2 : 16) * sizeof *nv);
            if (!nv)
                break;
            v = nv;
        }
        if (!(v[k] = strdup(name)))
            break;
        k++;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        jlm_rdb_free_names(v, k);
        if (rc == SQLITE_ROW)
            return jlm_errf(err, JLM_ENOMEM, "%s: list resident pages: out of memory", db->path);
        return sqerr(db, err, rc, "list resident pages");
    }
    *names = v;
    *n = k;
    return 0;
}

int jlm_rdb_session_budget(jlm_rdb *db, int64_t session, uint64_t budget, jlm_err *err)
{
    char sql[160];
    snprintf(sql, sizeof sql, "UPDATE sessions SET budget = %lld WHERE id = %lld", (long long)budget,
             (long long)session);
    return exec(db, sql, "session budget", err);
}

int jlm_rdb_sessions(jlm_rdb *db, const char *model_key, jlm_rdb_session_info **out, size_t *n, jlm_err *err)
{
    if (db->mode != JLM_RDB_READONLY)
        prune(db, NULL);   /* best effort, as jlm_rdb_resident */
    int hb = has_budget_column(db);   /* a read-only open of an older database: budget 0 */
    char sql[700];
    snprintf(sql, sizeof sql,
             "SELECT s.id, s.pid, %s,"
             " (SELECT COUNT(*) FROM resident r WHERE r.session_id = s.id AND r.array = 'blocks'),"
             " (SELECT COUNT(*) FROM resident r WHERE r.session_id = s.id AND r.array = 'vision'),"
             " (SELECT COUNT(*) FROM resident r WHERE r.session_id = s.id AND r.array = 'experts')"
             " FROM sessions s JOIN models m ON m.id = s.model_id WHERE m.key = ?1 ORDER BY s.id",
             hb == 1 ? "s.budget" : "0");
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->db, sql, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return sqerr(db, err, rc, "list sessions");
    sqlite3_bind_text(s, 1, model_key, -1, SQLITE_STATIC);
    jlm_rdb_session_info *v = NULL;
    size_t k = 0, cap = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (k == cap) {
            jlm_rdb_session_info *nv = realloc(v, (cap = cap ? cap * 2 : 8) * sizeof *nv);
            if (!nv)
                break;
            v = nv;
        }
        v[k++] = (jlm_rdb_session_info){sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1),
                                         (uint64_t)sqlite3_column_int64(s, 2),
                                         {(uint64_t)sqlite3_column_int64(s, 3), (uint64_t)sqlite3_column_int64(s, 4),
                                          (uint64_t)sqlite3_column_int64(s, 5)}};
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        free(v);
        if (rc == SQLITE_ROW)
            return jlm_errf(err, JLM_ENOMEM, "%s: list sessions: out of memory", db->path);
        return sqerr(db, err, rc, "list sessions");
    }
    *out = v;
    *n = k;
    return 0;
}

/* ---------------------------------------------------------------- stats */
static const char *const COUNTERS[] = { "page_ins", "fills", "hits", "evictions", "bytes" };
static const char *const TIERS[] = { "frame", "pagecache", "disk", "convert", "other" };
static const char *const DAEMON[] = { "disk", "convert", "bytes" };

static json_t *iso_time(double t)
{
    if (t <= 0)
        return json_null();
    time_t s = (time_t)t;
    struct tm tm;
    char buf[32];
    gmtime_r(&s, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(buf);
}

/* Adds the 13 counters of columns [col, col+13) of s to (counters, tiers,
 * daemon) objects of o (creating them, or summing into existing ones). */
static void add_counters(json_t *o, sqlite3_stmt *s, int col)
{
    json_t *t = json_object_get(o, "tiers"), *d = json_object_get(o, "daemon");
    if (!t) json_object_set_new(o, "tiers", t = json_object());
    if (!d) json_object_set_new(o, "daemon", d = json_object());
    for (int i = 0; i < 13; i++) {
        json_t *dst = i < 5 ? o : i < 10 ? t : d;
        const char *k = i < 5 ? COUNTERS[i] : i < 10 ? TIERS[i - 5] : DAEMON[i - 10];
        json_int_t v = sqlite3_column_int64(s, col + i) + json_integer_value(json_object_get(dst, k));
        json_object_set_new(dst, k, json_integer(v));
    }
}

static int model_json(jlm_rdb *db, int64_t mid, json_t *m, jlm_err *err)
{
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT (SELECT count(*) FROM sessions WHERE model_id = %lld),"
             " (SELECT count(*) FROM (SELECT DISTINCT array, a, b FROM resident WHERE model_id = %lld))",
             (long long)mid, (long long)mid);
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->db, sql, -1, &s, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        json_object_set_new(m, "sessions", json_integer(sqlite3_column_int64(s, 0)));
        json_object_set_new(m, "resident", json_integer(sqlite3_column_int64(s, 1)));
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_OK)
        return sqerr(db, err, rc, "stats");
    snprintf(sql, sizeof sql, "SELECT array, a, b, page_ins, fills, hits, evictions, bytes, t_frame, t_pagecache,"
             " t_disk, t_convert, t_other, d_disk, d_convert, d_bytes, last_access,"
             " EXISTS(SELECT 1 FROM resident r WHERE r.model_id = p.model_id AND r.array = p.array AND r.a = p.a"
             " AND r.b = p.b) FROM pages p WHERE model_id = %lld ORDER BY " ORDER_PAGES, (long long)mid);
    if ((rc = sqlite3_prepare_v2(db->db, sql, -1, &s, NULL)) != SQLITE_OK)
        return sqerr(db, err, rc, "stats");
    json_t *pages = json_array(), *tot = json_object();
    double last = 0;
    json_object_set_new(m, "pages", pages);
    json_object_set_new(m, "totals", tot);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *array = (const char *)sqlite3_column_text(s, 0);
        char name[64];
        page_name(name, sizeof name, array, sqlite3_column_int(s, 1), sqlite3_column_int(s, 2));
        json_t *p = json_pack("{s:s, s:s, s:i, s:i}", "name", name, "array", array, "a", sqlite3_column_int(s, 1),
                              "b", sqlite3_column_int(s, 2));
        add_counters(p, s, 3);
        add_counters(tot, s, 3);
        double t = sqlite3_column_double(s, 16);
        json_object_set_new(p, "last_access", iso_time(t));
        json_object_set_new(p, "last_access_unix", json_real(t));
        json_object_set_new(p, "resident", json_boolean(sqlite3_column_int(s, 17)));
        json_array_append_new(pages, p);
        last = t > last ? t : last;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return sqerr(db, err, rc, "stats");
    if (!json_object_get(tot, "tiers")) {   /* no pages yet: zero totals */
        json_object_set_new(tot, "tiers", json_object());
        json_object_set_new(tot, "daemon", json_object());
        for (int i = 0; i < 13; i++)
            json_object_set_new(i < 5 ? tot : json_object_get(tot, i < 10 ? "tiers" : "daemon"),
                                i < 5 ? COUNTERS[i] : i < 10 ? TIERS[i - 5] : DAEMON[i - 10], json_integer(0));
    }
    json_object_set_new(tot, "pages", json_integer((json_int_t)json_array_size(pages)));
    json_object_set_new(tot, "last_access", iso_time(last));
    return 0;
}

/* {"db": path, "models": {key: {"sessions", "resident", "pages": [...], "totals"}}} */
static int stats_tree(jlm_rdb *db, const char *model_key, json_t **out, jlm_err *err)
{
    int e = 0;
    if (db->mode != JLM_RDB_READONLY)
        prune(db, NULL);   /* best effort, as in jlm_rdb_resident */
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->db, "SELECT id, key FROM models WHERE ?1 IS NULL OR key = ?1 ORDER BY key",
                                -1, &s, NULL);
    if (rc != SQLITE_OK)
        return sqerr(db, err, rc, "stats");
    sqlite3_bind_text(s, 1, model_key, -1, SQLITE_STATIC);
    json_t *root = json_pack("{s:s}", "db", db->path), *models = json_object();
    json_object_set_new(root, "models", models);
    while (!e && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *m = json_object();
        json_object_set_new(models, (const char *)sqlite3_column_text(s, 1), m);
        e = model_json(db, sqlite3_column_int64(s, 0), m, err);
    }
    sqlite3_finalize(s);
    if (!e && rc != SQLITE_DONE)
        e = sqerr(db, err, rc, "stats");
    if (!e && model_key && !json_object_get(models, model_key)) {   /* known to the mount, never used */
        json_t *m = json_object();
        json_object_set_new(models, model_key, m);
        e = model_json(db, -1, m, err);
    }
    if (e) {
        json_decref(root);
        return e;
    }
    *out = root;
    return 0;
}

int jlm_rdb_stats_json(jlm_rdb *db, const char *model_key, char **out, jlm_err *err)
{
    json_t *root = NULL;
    int e = stats_tree(db, model_key, &root, err);
    if (e)
        return e;
    char *s = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!s)
        return jlm_errf(err, JLM_ENOMEM, "%s: stats: out of memory", db->path);
    size_t n = strlen(s);
    char *r = malloc(n + 2);   /* json_dumps' buffer is jansson's to free: copy, add a newline */
    if (r) {
        memcpy(r, s, n);
        r[n] = '\n';
        r[n + 1] = 0;
    }
    free(s);
    if (!r)
        return jlm_errf(err, JLM_ENOMEM, "%s: stats: out of memory", db->path);
    *out = r;
    return 0;
}

#define I(o, k) ((long long)json_integer_value(json_object_get((o), (k))))

static void text_line(FILE *f, const char *name, json_t *p, const char *last)
{
    json_t *t = json_object_get(p, "tiers"), *d = json_object_get(p, "daemon");
    fprintf(f, "%-16s %9lld %6lld %9lld %9lld %13lld %9lld %9lld %7lld %7lld %6lld %7lld %7lld  %s\n", name,
            I(p, "page_ins"), I(p, "fills"), I(p, "hits"), I(p, "evictions"), I(p, "bytes"), I(t, "frame"),
            I(t, "pagecache"), I(t, "disk"), I(t, "convert"), I(t, "other"), I(d, "disk"), I(d, "convert"),
            last ? last : "-");
}

int jlm_rdb_stats_text(jlm_rdb *db, const char *model_key, char **out, jlm_err *err)
{
    json_t *root = NULL;
    int e = stats_tree(db, model_key, &root, err);
    if (e)
        return e;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        json_decref(root);
        return jlm_errf(err, JLM_ENOMEM, "%s: stats: out of memory", db->path);
    }
    const char *key;
    json_t *m;
    json_object_foreach(json_object_get(root, "models"), key, m) {
        fprintf(f, "model %s: %lld live sessions, %lld pages resident\n", key, I(m, "sessions"), I(m, "resident"));
        fprintf(f, "%-16s %9s %6s %9s %9s %13s %9s %9s %7s %7s %6s %7s %7s  %s\n", "page", "page-ins", "fills",
                "hits", "evictions", "bytes", "t-frame", "t-pcache", "t-disk", "t-conv", "t-oth", "d-disk",
                "d-conv", "last-access");
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(m, "pages"), i, p)
            text_line(f, json_string_value(json_object_get(p, "name")), p,
                      json_string_value(json_object_get(p, "last_access")));
        json_t *tot = json_object_get(m, "totals");
        text_line(f, "total", tot, json_string_value(json_object_get(tot, "last_access")));
    }
    json_decref(root);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return jlm_errf(err, JLM_ENOMEM, "%s: stats: out of memory", db->path);
    }
    *out = buf;
    return 0;
}
