/* jlm_err.c - formatting of the project's error values (see jlm_err.h). */
#include "base/jlm_err.h"

#include <stdio.h>
#include <string.h>

/* A message is one line: control bytes that came in through %s (a key or
 * tensor name from a file, say) become '?', so no input can add a line to a
 * log or the terminal. */
static void one_line(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
}

int jlm_errf(jlm_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        one_line(err->msg);
        err->code = code;
    }
    return code;
}

int jlm_err_prefix(jlm_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return code;
    char head[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t hl = strlen(head);
    if (hl > sizeof err->msg - 1)
        hl = sizeof err->msg - 1;
    memcpy(err->msg, head, hl);
    size_t room = sizeof err->msg - hl;
    if (room > 2) {
        memcpy(err->msg + hl, ": ", 2);
        size_t ol = strnlen(old, room - 3);
        memcpy(err->msg + hl + 2, old, ol);
        err->msg[hl + 2 + ol] = 0;
    } else {
        err->msg[hl] = 0;
    }
    one_line(err->msg);
    err->code = code;
    return code;
}

const char *jlm_strerror(int code)
{
    switch (code) {
    case JLM_OK:           return "ok";
    case JLM_EINVAL:       return "invalid argument";
    case JLM_EFORMAT:      return "format error";
    case JLM_EVERSION:     return "wrong version";
    case JLM_EIO:          return "i/o error";
    case JLM_ENOMEM:       return "out of memory";
    case JLM_EUNSUPPORTED: return "unsupported";
    case JLM_ENOSPC:       return "no space left";
    case JLM_ENOTFOUND:    return "not found";
    case JLM_ERANGE:       return "out of range";
    default:               return "unknown error";
    }
}
