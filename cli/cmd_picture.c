/* cmd_picture.c - what `jlm info --html` and `jlm stats --html` share: the
 * container picture (picture/picture.h) of one model, coloured by residency
 * when the model is a jlmfs view (or a database is named), written to a file
 * atomically or to stdout. */
#include "cli/cli.h"
#include "format/jlm_format.h"
#include "picture/picture.h"
#include "cli/report.h"

#include <stdio.h>
#include <stdlib.h>

int jlm_cli_picture(const char *who, const char *model, const char *out_path, const char *db, const char *key)
{
    char *cpath = jlm_cli_container_path(model);   /* a view directory: its model.jlm */
    char *vdb = NULL, *vkey = NULL, *html = NULL;
    jlm_model *m = NULL;
    jlm_err err = {0};
    size_t len = 0;
    int e = cpath ? 0 : jlm_errf(&err, JLM_ENOMEM, "out of memory");
    if (!e && jlm_cli_is_gguf(cpath))
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
        e = jlm_pic_html(m, db ? &ov : NULL, model, &html, &len, &err);
    if (!e && out_path)
        e = jlm_pic_write(out_path, html, len, &err);
    else if (!e && (fwrite(html, 1, len, stdout) != len || fflush(stdout)))
        e = jlm_errf(&err, JLM_EIO, "stdout: write failed");
    if (e)
        fprintf(stderr, "%s: %s\n", who, err.msg);
    jlm_fmt_close(m);
    free(html);
    free(vdb);
    free(vkey);
    free(cpath);
    return e ? 1 : 0;
}
