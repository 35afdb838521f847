/* layout_glsl.c - writes kernels/vulkan/layout.glsl (on stdout) from the field
 * lists of kernels/layout.h, with each field's offset read from the C struct.
 * The Makefile builds and runs it on every build and compares its output with
 * the committed layout.glsl: a difference fails the build (`make layout-glsl`
 * rewrites the file). A host tool, not part of libjlm. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/layout.h"

static char line[1024];
static size_t at;

static void begin(const char *block, const char *name, size_t bytes)
{
    printf("\n// jlm_%s (kernels/layout.h), %zu bytes; byte offsets:", block, bytes);
    at = (size_t)snprintf(line, sizeof line, "#define JLM_%s", name);
}

/* One field: its declaration into the macro line, its offset into the comment
 * line above it. A field that is not 4 bytes has no GLSL twin here. */
static void field(const char *glsl, const char *name, size_t off, size_t size)
{
    if (size != 4) {
        fprintf(stderr, "layout_glsl: field %s is %zu bytes, not 4\n", name, size);
        _Exit(1);
    }
    printf(" %s %zu", name, off);
    at += (size_t)snprintf(line + at, sizeof line - at, " %s %s;", glsl, name);
}

static void end(void)
{
    printf("\n%s\n", line);
}

#define OFF_(name) (size_t)((const char *)&s.name - (const char *)&s), sizeof s.name
#define GEN_U_(name) field("uint", #name, OFF_(name));
#define GEN_F_(name) field("float", #name, OFF_(name));
#define GEN_BLOCK_(block, NAME, bytes, last) \
    static void gen_##block(void) \
    { \
        jlm_##block s; \
        if (!strncmp(#NAME, "SPEC", 4)) \
            return; /* constant ids below, not a block */ \
        begin(#block, #NAME, sizeof s); \
        JLM_##NAME##_FIELDS(GEN_U_, GEN_F_) \
        end(); \
    }
JLM_LAYOUT_LIST(GEN_BLOCK_)

/* matvec.comp's constant ids: JLM_SPEC_MATVEC_<FIELD> = the field's index. */
static int spec_id;
static void spec(const char *name)
{
    char up[64];
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof up; i++)
        up[i] = (char)toupper((unsigned char)name[i]);
    up[i] = 0;
    printf("#define JLM_SPEC_MATVEC_%s %d\n", up, spec_id++);
}
#define SPEC_(name) spec(#name);

#define TYPE_(name, code) printf("const uint T_%s = %du;\n", #name, code);
#define CALL_(block, NAME, bytes, last) gen_##block();

int main(void)
{
    printf("// layout.glsl - the shaders' side of kernels/layout.h, written from its field\n"
           "// lists by kernels/vulkan/gen/layout_glsl.c; every build compares this file\n"
           "// with that program's output and fails on a difference. Do not edit: change\n"
           "// kernels/layout.h and run `make layout-glsl`.\n"
           "// A shader declares its block as\n"
           "//     layout(push_constant) uniform P { JLM_PUSH_<SHADER> } pc;\n"
           "\n// stored type codes (format/jlm_format.h enum jlm_type)\n");
    JLM_KT_LIST(TYPE_)
    JLM_LAYOUT_LIST(CALL_)
    printf("\n// matvec.comp's specialization constant ids (jlm_spec_matvec's field index)\n");
    JLM_SPEC_MATVEC_FIELDS(SPEC_, SPEC_)
    return ferror(stdout) != 0;
}
