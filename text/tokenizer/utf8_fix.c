/* utf8_fix.c - invalid UTF-8 to U+FFFD (utf8_fix.h), with utf8proc's decoder. */
#include "text/tokenizer/utf8_fix.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

char *jlm_utf8_fix(const char *s, size_t n)
{
    /* each input byte becomes at most 3 output bytes (U+FFFD) */
    char *out = malloc(n * 3 + 1), *w = out;
    if (!out)
        return NULL;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s, *end = p + n;
    while (p < end) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p, end - p, &cp);
        if (k > 0 && cp != 0) {
            memcpy(w, p, (size_t)k);
            w += k;
            p += k;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            p++;
        }
    }
    *w = 0;
    return out;
}
