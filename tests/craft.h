/* craft.h - crafted inputs for the hostile-input suites: a test model with
 * one GGUF value changed. Header-only (static). */
#ifndef JLM_CRAFT_H
#define JLM_CRAFT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Offset of the u32 value of GGUF key `key` (type UINT32/INT32), or 0. */
static inline size_t tu_gguf_u32_at(const unsigned char *b, size_t n, const char *key)
{
    size_t kl = strlen(key);
    for (size_t i = 8; i + kl + 8 <= n; i++) {
        uint64_t len;
        memcpy(&len, b + i - 8, 8);
        if (len != kl || memcmp(b + i, key, kl))
            continue;
        uint32_t type;
        memcpy(&type, b + i + kl, 4);
        if (type == 4 || type == 5)
            return i + kl + 4;
    }
    return 0;
}

/* A copy of bytes b (n) with key's u32 value set to v, written to path;
 * 0 on success, -1 if the key is absent or the write fails. */
static inline int tu_gguf_write_with(const char *path, const unsigned char *b, size_t n, const char *key, uint32_t v)
{
    size_t at = tu_gguf_u32_at(b, n, key);
    unsigned char *c = at ? malloc(n) : NULL;
    if (!c)
        return -1;
    memcpy(c, b, n);
    memcpy(c + at, &v, 4);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(c, 1, n, f) == n;
    if (f && fclose(f))
        ok = 0;
    free(c);
    return ok ? 0 : -1;
}

#endif
