/* report.h - residency reporting of an engine on a jlmfs view (the reporter
 * jlm run, jlm chat and jlm serve hand their sessions), and finding a view. Reporting never stops a run: the first
 * failure prints one note ("<who>: note: residency reporting stopped: ...")
 * and turns it off. */
#ifndef JLM_CLI_REPORT_H
#define JLM_CLI_REPORT_H

#include "prompt/session.h"

/* A jlmfs model view is a directory: its container is DIR/model.jlm; any
 * other path is returned as is. malloc'd; NULL on OOM. */
char *jlm_cli_container_path(const char *model);
/* 1 (and *db, *key malloc'd) when model or path is on a jlmfs view. */
int  jlm_cli_view_discover(const char *model, const char *path, char **db, char **key);
/* The residency reporter of a session (prompt/session.h: jlm_sess_view):
 * find is jlm_cli_view_discover; open registers a session on the view's
 * database and subscribes to the engine's pager (expert pages mapped to
 * their block and expert); flush writes the queued events (once per token);
 * close flushes, ends the session and unsubscribes. Notes are prefixed with
 * who ("jlm run"); one command per process. */
const jlm_sess_view *jlm_cli_view(const char *who);

#endif
