/* util.c - small helpers shared by the subcommands. */
#include "cli/cli.h"
#include "converter/hf.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long long jlm_cli_parse_size(const char *s)
{
    char *end;
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mul = 1ull << 10; end++; break;
    case 'M': mul = 1ull << 20; end++; break;
    case 'G': mul = 1ull << 30; end++; break;
    case 'T': mul = 1ull << 40; end++; break;
    default: return -1;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end || (v && mul > (unsigned long long)9e18 / v))
        return -1;
    return (long long)(v * mul);
}

int jlm_cli_is_gguf(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char m[4] = {0};
    size_t n = fread(m, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(m, "GGUF", 4);
}

const char *jlm_cli_source_kind(const char *path)
{
    return jlm_cli_is_gguf(path) ? "a GGUF file" : jlm_hf_is_folder(path) ? "a Hugging Face folder" : NULL;
}
