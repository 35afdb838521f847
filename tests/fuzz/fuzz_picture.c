/* fuzz_picture.c - libFuzzer target for the container picture: any bytes the
 * container reader accepts are drawn (picture/picture.c), and the page must
 * keep invariant (2) of picture.h: whatever the container's strings hold, the
 * page has exactly two script elements (the data block and the page's own
 * script) and the data block has no '<'.
 *   make fuzz && build-fuzz/fuzz_picture -max_total_time=60 CORPUS/ */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "picture/picture.h"

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jlm_model *m = NULL;
    if (jlm_fmt_parse(data, size, size, "fuzz", &m, NULL) != 0)
        return 0;
    char *html = NULL;
    size_t len = 0;
    if (jlm_pic_html(m, NULL, "fuzz", &html, &len, NULL) == 0) {
        const char *d = strstr(html, "id=\"jlm-data\">"), *e = d ? strstr(d, "</script>") : NULL;
        if (count(html, "<script") != 2 || !d || !e || memchr(d + 14, '<', (size_t)(e - d - 14)))
            abort();
        free(html);
    }
    jlm_fmt_close(m);
    return 0;
}
