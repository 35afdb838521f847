/* residency.h - the residency and statistics database (SQLite, WAL) shared by
 * running engines and the jlmfs daemon.
 *
 * Owns: the schema and every SQL statement. Engines report what their pagers
 * do (page-in, fill, hit, eviction, with the tier that served it); the daemon
 * reports the reads of view files that reached it, i.e. that the kernel page
 * cache could not serve (tier disk, or on-demand packing), and serves
 * `resident/`, `stats` and `jlm stats` from the same tables. Knows nothing of
 * FUSE, pagers or kernels: pages are named (array, a, b) where array is
 * "blocks", "vision" or "experts", a is the page (block index B for experts)
 * and b is -1 (the expert index E for experts). The entry names are
 * "blocks.12", "vision.0", "experts.3.5" (like the page files).
 *
 * How the engine finds the database: a jlmfs model view directory (and its
 * model.jlm) carries the extended attributes
 *     user.jlmfs.db     absolute path of the SQLite database
 *     user.jlmfs.model  the model's key in it (the view's name, "foo.jlm")
 * (jlm_rdb_discover reads them; docs/jlmfs.md documents them).
 *
 * Invariants:
 *  (1) A page is listed as resident for a model iff some live engine session
 *      reported a page-in for it after its last eviction; ending a session
 *      (or finding its pid dead) removes its residency rows.
 *  (2) Counters only grow; every event is attributed to one tier
 *      (enum jlm_tier in engine/source.h).
 * Thread safety: one jlm_rdb per thread (SQLite connection rules); several
 * processes may share the database file (WAL, busy timeout).
 * Failure: every function returns 0 or a JLM_E* code with the database path
 * and SQLite's message in err; a reporting failure must never stop an engine
 * (callers print one note and carry on).
 */
#ifndef JLM_RESIDENCY_H
#define JLM_RESIDENCY_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"

typedef struct jlm_rdb jlm_rdb;

/* How to open: JLM_RDB_EXISTING (0) read-write, the file must be there;
 * JLM_RDB_CREATE (1) creating it if absent (mode 0600, which SQLite gives
 * its -wal and -shm too; an existing wider one of the caller's is narrowed;
 * a symbolic link at PATH is refused, never followed: the jlmfs daemon's
 * database), and a corrupt one (not a SQLite database, or SQLite finds it
 * damaged) is renamed PATH.corrupt-STAMP and recreated (jlm_rdb_moved_aside
 * says where it went; the caller logs it);
 * JLM_RDB_READONLY (2) SQLITE_OPEN_READONLY: never writes to the file (no
 * journal-mode change, no pruning), for `jlm stats FILE` on any file. */
enum { JLM_RDB_EXISTING = 0, JLM_RDB_CREATE = 1, JLM_RDB_READONLY = 2 };

/* Opens the database in mode (above); WAL mode, busy timeout, schema created
 * or checked. *out untouched on error. */
int  jlm_rdb_open(const char *path, int mode, jlm_rdb **out, jlm_err *err);
/* Where a JLM_RDB_CREATE open moved a corrupt database, or NULL. */
const char *jlm_rdb_moved_aside(const jlm_rdb *db);
/* Cheap check that the file at the database's path still is a SQLite
 * database (present, with the SQLite header): a file overwritten or removed
 * under an open handle is otherwise served stale from SQLite's cache and WAL.
 * JLM_EFORMAT naming the path if not. */
int  jlm_rdb_check(const jlm_rdb *db, jlm_err *err);
/* The owner's answer to a failed check or a JLM_EFORMAT from a query: moves
 * the file aside as PATH.corrupt-STAMP (a file that was removed has nothing
 * to move: jlm_rdb_moved_aside then says NULL) before closing the connection (whose
 * close would checkpoint stale pages into it), drops queued engine events
 * (their sessions are gone; daemon reads stay queued) and opens a fresh database on the same handle. On error the handle can only be
 * closed. */
int  jlm_rdb_recreate(jlm_rdb *db, jlm_err *err);
void jlm_rdb_close(jlm_rdb *db);   /* accepts NULL */

/* The wall clock stamping sessions, models and reads (seconds since the
 * epoch). Default CLOCK_REALTIME; tests inject a clock that advances on every
 * call instead of sleeping for distinct stamps. fn NULL restores the default.
 * Per handle; cannot fail. */
typedef double (*jlm_rdb_clock_fn)(void *ctx);
void jlm_rdb_set_clock(jlm_rdb *db, jlm_rdb_clock_fn fn, void *ctx);

/* Reads the view's extended attributes from a view directory or a file in
 * it. JLM_ENOTFOUND if path is not on a jlmfs view. Outputs malloc'd. */
int  jlm_rdb_discover(const char *path, char **db_path, char **model_key, jlm_err *err);

/* ---------------------------------------------------------------- engine side */
/* Registers a running engine (its pid) on model_key; *session is its id. */
int  jlm_rdb_session_begin(jlm_rdb *db, const char *model_key, int64_t *session, jlm_err *err);
/* Records the engine's memory budget (bytes) on its session, for `jlm ps`. */
int  jlm_rdb_session_budget(jlm_rdb *db, int64_t session, uint64_t budget, jlm_err *err);
/* Removes the session and its residency rows. */
int  jlm_rdb_session_end(jlm_rdb *db, int64_t session, jlm_err *err);

enum jlm_rdb_kind { JLM_RDB_PAGE_IN = 1, JLM_RDB_FILL = 2, JLM_RDB_HIT = 3, JLM_RDB_EVICT = 4 };

/* Queues one pager event (cheap: no SQL until flush). tier: FRAME for hits;
 * a page-in/fill of a view page read through the page cache is PAGECACHE and
 * is re-attributed to DISK/CONVERT from the daemon's reads (docs/residency.md).
 * JLM_EINVAL for another array name or kind, JLM_ENOMEM. */
int  jlm_rdb_event(jlm_rdb *db, int64_t session, const char *array, int32_t a, int32_t b,
                   int kind, int tier, uint64_t bytes, jlm_err *err);
/* Writes the queued events in one transaction (the engine calls this once
 * per token and at exit). On failure the transaction is rolled back and the
 * queue kept for a later flush; JLM_ENOTFOUND if an event's session is gone. */
int  jlm_rdb_flush(jlm_rdb *db, jlm_err *err);

/* ---------------------------------------------------------------- daemon side */
/* Records a read of a view file the daemon served itself (tier DISK or
 * CONVERT), for the page (array, a, b) of model_key. Batched like events. */
int  jlm_rdb_daemon_read(jlm_rdb *db, const char *model_key, const char *array, int32_t a, int32_t b,
                         int tier, uint64_t bytes, jlm_err *err);

/* Entry names of the pages live sessions hold now ("blocks.12", ...), sorted
 * blocks, vision, experts, then numerically; prunes dead sessions first.
 * *names is malloc'd (array and strings); free with jlm_rdb_free_names. */
int  jlm_rdb_resident(jlm_rdb *db, const char *model_key, char ***names, size_t *n, jlm_err *err);
void jlm_rdb_free_names(char **names, size_t n);
/* The live engine sessions on model_key (dead ones pruned first, or hidden
 * read-only), oldest first: pid, budget (0: not recorded, e.g. a session an
 * older build began) and the pages each holds per array (blocks, vision,
 * experts). *out malloc'd (free). */
typedef struct jlm_rdb_session_info {
    int64_t  id, pid;
    uint64_t budget;
    uint64_t pages[3];
} jlm_rdb_session_info;
int  jlm_rdb_sessions(jlm_rdb *db, const char *model_key, jlm_rdb_session_info **out, size_t *n, jlm_err *err);

/* The counters as text (one line per page: name, page-ins, bytes, hits,
 * evictions, per-tier counts, last access) or JSON; model_key NULL = every
 * model. *out malloc'd, NUL-terminated. */
int  jlm_rdb_stats_text(jlm_rdb *db, const char *model_key, char **out, jlm_err *err);
int  jlm_rdb_stats_json(jlm_rdb *db, const char *model_key, char **out, jlm_err *err);

#endif
