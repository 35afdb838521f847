/* outfile.h - the one checked writer behind every output path a `jlm`
 * command takes (`convert -o`, `info --html -o`, `stats --html -o`,
 * `run --logits`, `run --trace-routing`): docs/cli.md "Output paths".
 *
 * Owns: the refusals (a directory, anything but a regular file: a device
 * node, a FIFO, a socket; one of the command's own inputs, the model or the
 * source), checked before any work, and the write itself: PATH.part created
 * beside PATH (O_NOFOLLOW, a regular file), every write and the close
 * checked, then renamed over PATH; on any failure the .part is removed and
 * PATH is untouched. A symbolic link at PATH is replaced, not followed.
 * Errors are one line "who: OPT PATH: reason" on stderr. Single-threaded. */
#ifndef JLM_CLI_OUTFILE_H
#define JLM_CLI_OUTFILE_H

#include <stddef.h>
#include <stdio.h>

#include "base/jlm_err.h"

/* Why PATH may not be written (NULL: it may): "is a directory", "is not a
 * regular file (...)", "is the model itself" (one of inputs[0..n), NULLs
 * skipped, names the same file). */
const char *jlm_cli_out_refusal(const char *path, const char *const *inputs, int n, const char *input_word);

/* The refusal as one line "who: OPT PATH: reason" (opt may be ""), and the
 * exit status 2; 0 when PATH may be written. */
int jlm_cli_out_check(const char *who, const char *opt, const char *path, const char *const *inputs, int n,
                      const char *input_word);

typedef struct jlm_cli_out {
    FILE       *f;            /* write here between open and commit */
    char       *part;
    const char *who, *opt, *path;
    int         err;          /* the first errno of a write (0: none) */
} jlm_cli_out;

/* The check above, then PATH.part created. 0, 2 (refused) or 1 (cannot
 * create it), the line printed. */
int  jlm_cli_out_open(jlm_cli_out *o, const char *who, const char *opt, const char *path,
                      const char *const *inputs, int n, const char *input_word);
/* Flushes, closes and renames over PATH: 0, or 1 after one line (the .part
 * removed). */
int  jlm_cli_out_commit(jlm_cli_out *o);
/* Drops the .part (after a failure of the caller's own). */
void jlm_cli_out_abort(jlm_cli_out *o);
/* open + fwrite(data, len) + commit: 0, 1 or 2. */
int  jlm_cli_out_write(const char *who, const char *opt, const char *path, const char *const *inputs, int n,
                       const char *input_word, const void *data, size_t len);

/* stdout's writes: 0 while every write so far went through (a flush is
 * tried), else 1 after one line "who: stdout: reason" (printed once per
 * process whoever asks again). jlm_cli_stdout_close adds the final fclose. */
int  jlm_cli_stdout_check(const char *who);
int  jlm_cli_stdout_close(const char *who);
/* A write of the caller's failed with errno e: remembered for the line. */
void jlm_cli_stdout_failed(int e);
/* fflush(stdout), a failure remembered (nothing printed). */
void jlm_cli_stdout_flush(void);
/* A session's emit callback (prompt/session.h): the n bytes to stdout,
 * flushed; a failed write is remembered and stops the generation
 * (JLM_EIO; jlm_cli_stdout_check prints the line). ctx unused. */
int  jlm_cli_put_stdout(void *ctx, const char *p, size_t n, jlm_err *err);

#endif
