/* report.h - residency reporting of an engine on a jlmfs view (shared by
 * jlm run, jlm chat and jlm bench). Reporting never stops a run: the first
 * failure prints one note ("<who>: note: residency reporting stopped: ...")
 * and turns it off. */
#ifndef JLM_CLI_REPORT_H
#define JLM_CLI_REPORT_H

#include <stdint.h>

#include "engine/model.h"
#include "prompt/session.h"
#include "residency/residency.h"

typedef struct jlm_cli_report {
    jlm_rdb    *db;          /* NULL: not reporting */
    int64_t     session;
    int         failed;      /* the note was printed; nothing more is reported */
    const char *who;         /* "jlm run": prefix of the note */
    uint32_t    n_exp_pages, n_expert;
    int32_t    *exp_block, *exp_index;   /* (n_exp_pages,) expert page -> (B, E); -1 unmapped */
} jlm_cli_report;

/* A jlmfs model view is a directory: its container is DIR/model.jlm; any
 * other path is returned as is. malloc'd; NULL on OOM. */
char *jlm_cli_container_path(const char *model);
/* 1 (and *db, *key malloc'd) when model or path is on a jlmfs view. */
int  jlm_cli_view_discover(const char *model, const char *path, char **db, char **key);
/* Registers a session on the view's database and subscribes to e's pager. */
void jlm_cli_report_open(jlm_cli_report *r, jlm_engine *e, const char *db_path, const char *key, const char *who);
/* Writes the queued events (once per token). */
void jlm_cli_report_flush(jlm_cli_report *r);
/* Flushes, ends the session, unsubscribes; accepts a report never opened. */
void jlm_cli_report_close(jlm_cli_report *r, jlm_engine *e);
/* The above as a session's view reporter (prompt/session.h), its notes
 * prefixed with who ("jlm run"); one command per process. */
const jlm_sess_view *jlm_cli_view(const char *who);

#endif
