/* report.c - what `jlm run`, `jlm chat` and `jlm bench` share when their
 * model is a jlmfs view: finding the view's database, and reporting the
 * pager's events to it (residency/residency.h, docs/residency.md). */
#include "cli/report.h"
#include "residency/residency.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *jlm_cli_container_path(const char *model)
{
    return jlm_session_container(model);
}

int jlm_cli_view_discover(const char *model, const char *path, char **db, char **key)
{
    return jlm_rdb_discover(model, db, key, NULL) == 0 || (path && jlm_rdb_discover(path, db, key, NULL) == 0);
}

typedef struct cli_report {
    jlm_rdb    *db;          /* NULL: not reporting */
    int64_t     session;
    int         failed;      /* the note was printed; nothing more is reported */
    const char *who;         /* "jlm run": prefix of the note */
    uint32_t    n_exp_pages, n_expert;
    int32_t    *exp_block, *exp_index;   /* (n_exp_pages,) expert page -> (B, E); -1 unmapped */
} cli_report;

/* On a jlmfs view (its xattrs name the mount's database) the run registers a
 * session and reports every pager event, flushed once per token and at exit
 * (docs/residency.md). Reporting never stops the run: the first failure
 * prints one note and turns it off. */
static void report_fail(cli_report *r, const jlm_err *err)
{
    if (!r->failed)
        fprintf(stderr, "%s: note: residency reporting stopped: %s\n", r->who, err->msg);
    r->failed = 1;
}

/* Expert page p -> (B, E) from the expert tensors' pages: a bank's page is
 * expert 0's, expert E's is that page + E; a single-expert tensor names E. */
static int report_map_experts(cli_report *r, const jlm_model *m)
{
    r->n_exp_pages = m->hdr.n_exp_pages;
    r->n_expert = m->config.n_expert;
    if (!r->n_exp_pages)
        return 0;
    r->exp_block = malloc(r->n_exp_pages * sizeof *r->exp_block);
    r->exp_index = malloc(r->n_exp_pages * sizeof *r->exp_index);
    if (!r->exp_block || !r->exp_index)
        return -1;
    for (uint32_t p = 0; p < r->n_exp_pages; p++)
        r->exp_block[p] = r->exp_index[p] = -1;
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        jlm_tensor_loc l;
        jlm_fmt_tensor_loc(m, t, &l);
        if (l.region != JLM_REG_EXPERT || l.page < 0)
            continue;
        uint32_t n = t->index >= 0 ? 1 : r->n_expert;
        for (uint32_t e = 0; e < n && (uint64_t)l.page + e < r->n_exp_pages; e++) {
            r->exp_block[l.page + e] = t->block;
            r->exp_index[l.page + e] = t->index >= 0 ? t->index : (int32_t)e;
        }
    }
    return 0;
}

static void report_event(void *ctx, const jlm_pager_event *ev)
{
    cli_report *r = ctx;
    if (r->failed)
        return;
    int32_t a = (int32_t)ev->page, b = -1;
    if (ev->array == JLM_PAGER_EXPERTS) {
        if (ev->page < r->n_exp_pages && r->exp_block[ev->page] >= 0) {
            a = r->exp_block[ev->page];
            b = r->exp_index[ev->page];
        } else if (r->n_expert) {
            a = (int32_t)(ev->page / r->n_expert);
            b = (int32_t)(ev->page % r->n_expert);
        }
    }
    int kind = ev->kind == JLM_PAGER_EV_PAGE_IN ? JLM_RDB_PAGE_IN : ev->kind == JLM_PAGER_EV_FILL ? JLM_RDB_FILL
             : ev->kind == JLM_PAGER_EV_HIT ? JLM_RDB_HIT : JLM_RDB_EVICT;
    /* a view is read buffered: the kernel's page cache, or the daemon behind it
     * (the database attributes DISK/CONVERT from the daemon's own reports) */
    int tier = ev->tier == JLM_TIER_UNKNOWN ? JLM_TIER_PAGECACHE : ev->tier;
    jlm_err err = {0};
    if (jlm_rdb_event(r->db, r->session, ev->array_name, a, b, kind, tier, ev->bytes, &err))
        report_fail(r, &err);
}

static void report_open(cli_report *r, jlm_engine *e, const char *db_path, const char *key, const char *who)
{
    r->who = who;
    jlm_err err = {0};
    if (jlm_rdb_open(db_path, 0, &r->db, &err) || jlm_rdb_session_begin(r->db, key, &r->session, &err) ||
        jlm_rdb_session_budget(r->db, r->session, jlm_engine_budget(e), &err)) {
        report_fail(r, &err);
        jlm_rdb_close(r->db);
        r->db = NULL;
        return;
    }
    if (report_map_experts(r, jlm_engine_model(e)) != 0) {
        jlm_errf(&err, JLM_ENOMEM, "%s: out of memory", db_path);
        report_fail(r, &err);
        return;
    }
    jlm_pager_set_events(jlm_engine_pager(e), report_event, r);
}

static void report_flush(cli_report *r)
{
    jlm_err err = {0};
    if (r->db && !r->failed && jlm_rdb_flush(r->db, &err))
        report_fail(r, &err);
}

static void report_close(cli_report *r, jlm_engine *e)
{
    if (e)
        jlm_pager_set_events(jlm_engine_pager(e), NULL, NULL);
    if (r->db) {
        jlm_err err = {0};
        report_flush(r);
        if (jlm_rdb_session_end(r->db, r->session, &err))
            report_fail(r, &err);
        jlm_rdb_close(r->db);
    }
    free(r->exp_block);
    free(r->exp_index);
}


/* ---------------------------------------------------------------- a session's reporter */

static const char *g_who = "jlm";

static void *view_open(jlm_engine *e, const char *db_path, const char *key)
{
    cli_report *r = calloc(1, sizeof *r);
    if (r)
        report_open(r, e, db_path, key, g_who);
    return r;
}

static void view_flush(void *r) { report_flush(r); }

static void view_close(void *r, jlm_engine *e)
{
    report_close(r, e);
    free(r);
}

static const jlm_sess_view VIEW = {jlm_cli_view_discover, view_open, view_flush, view_close};

const jlm_sess_view *jlm_cli_view(const char *who)
{
    g_who = who;
    return &VIEW;
}
