/* jlm_err.h - the project's one error convention.
 *
 * Every library function returns 0 (JLM_OK) or a negative JLM_E* code and, on
 * failure, fills a caller-owned jlm_err with a message naming the file, the
 * object and the bound that was broken. Out-parameters are written only on
 * success. Only the mains in cli/ may exit.
 *
 *   if (n > left) return jlm_errf(err, JLM_EFORMAT, "%s: tensor table: %u records, only %zu bytes left", path, n, left);
 *
 * jlm_errf accepts err == NULL (the message is dropped, the code returned).
 * Thread safety: none needed; a jlm_err belongs to one caller.
 */
#ifndef JLM_ERR_H
#define JLM_ERR_H

#include <stdarg.h>

enum {
    JLM_OK           = 0,
    JLM_EINVAL       = -1,  /* bad argument from the caller (usage) */
    JLM_EFORMAT      = -2,  /* malformed or out-of-bounds input bytes */
    JLM_EVERSION     = -3,  /* a container of another format version */
    JLM_EIO          = -4,  /* read/write/open failed (errno in the message) */
    JLM_ENOMEM       = -5,  /* allocation failed */
    JLM_EUNSUPPORTED = -6,  /* well-formed but not supported (arch, type, ...) */
    JLM_ENOSPC       = -7,  /* no space left writing output */
    JLM_ENOTFOUND    = -8,  /* a named key/tensor/file does not exist */
    JLM_ERANGE       = -9,  /* a value outside its allowed range */
};

typedef struct jlm_err {
    int  code;        /* the last code reported, 0 if none */
    char msg[1024];   /* NUL-terminated message, "" if none */
} jlm_err;

/* Formats the message into *err (if non-NULL) and returns code. Cannot fail. */
int jlm_errf(jlm_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to the message already in *err (if non-NULL) and
 * returns code, so a caller adds context in one line:
 *   if (rc) return jlm_err_prefix(err, rc, "%s", path);
 * Cannot fail. */
int jlm_err_prefix(jlm_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Short name of a code ("format error", ...). Cannot fail. */
const char *jlm_strerror(int code);

#endif
