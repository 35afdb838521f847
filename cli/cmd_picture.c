/* cmd_picture.c - what `jlm info --html` and `jlm stats --html` share: the
 * container picture (picture/picture.h) of one model, coloured by residency
 * when the model is a jlmfs view (or a database is named), written to a file
 * through the checked writer (cli/outfile.h) or to stdout. */
#include "cli/cli.h"
#include "format/jlm_format.h"
#include "picture/picture.h"
#include "cli/outfile.h"
#include "cli/report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* The page of model (its container at cpath) into *html; 0 or 1 after a line. */
static int render(const char *who, const char *model, const char *cpath, const char *db, const char *key, char **html,
                  size_t *len)
{
    char *vdb = NULL, *vkey = NULL;
    jlm_model *m = NULL;
    jlm_err err = {0};
    int e = 0;
    if (jlm_cli_is_gguf(cpath))
        e = jlm_errf(&err, JLM_EFORMAT, "%s: a GGUF file, not a .jlm container: convert it first with `jlm convert %s`",
                     model, model);
    if (!e)
        e = jlm_fmt_open(cpath, &m, &err);
    if (!e && !db && jlm_cli_view_discover(model, cpath, &vdb, &vkey)) {
        db = vdb;
        key = vkey;
    }
    jlm_pic_overlay ov = {db, key, NULL};
    if (!e)
        e = jlm_pic_html(m, db ? &ov : NULL, model, html, len, &err);
    if (e)
        jlm_cli_error(who, err.msg);
    jlm_fmt_close(m);
    free(vdb);
    free(vkey);
    return e ? 1 : 0;
}

int jlm_cli_picture(const char *who, const char *model, const char *out_path, const char *db, const char *key)
{
    char *cpath = jlm_cli_container_path(model);   /* a view directory: its model.jlm */
    if (!cpath)
        return jlm_cli_error(who, "out of memory"), 1;
    const char *inputs[2] = {model, cpath};
    jlm_cli_out o = {0};
    int rc = out_path ? jlm_cli_out_check(who, "-o", out_path, &db, 1, "residency database") : 0;
    if (!rc && out_path)   /* refused before any work */
        rc = jlm_cli_out_open(&o, who, "-o", out_path, inputs, 2, "model");
    char *html = NULL;
    size_t len = 0;
    if (!rc && (rc = render(who, model, cpath, db, key, &html, &len)) && out_path)
        jlm_cli_out_abort(&o);
    if (!rc && out_path) {
        if (fwrite(html, 1, len, o.f) != len)
            o.err = errno;
        rc = jlm_cli_out_commit(&o);
    } else if (!rc) {
        if (fwrite(html, 1, len, stdout) != len)
            jlm_cli_stdout_failed(errno);
        rc = jlm_cli_stdout_check(who);
    }
    free(html);
    free(cpath);
    return rc;
}
