/* fuzz_chat_input.c - libFuzzer target for the message assembly of `jlm chat`
 * (cli/chat_input.c, plain mode): the input is what a pipe would send. Every
 * read must end in a message or the end of input, never crash or leak; a
 * message is never longer than the input, and after the end of input every
 * read says so.
 *   make fuzz && build-fuzz/fuzz_chat_input -max_total_time=60 CORPUS/ */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/chat_input.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static volatile sig_atomic_t intr;
    if (!size)
        return 0;
    FILE *f = fmemopen((void *)data, size, "r");
    jlm_chat_in *in = f ? calloc(1, sizeof *in) : NULL;
    if (!in) {
        if (f)
            fclose(f);
        return 0;
    }
    in->src = f;
    in->intr = &intr;
    size_t reads = 0;
    for (;;) {
        char *msg = NULL;
        int r = jlm_chat_in_read(in, &msg);
        if (r == JLM_CHAT_IN_MSG) {
            if (!msg || strlen(msg) > size)
                abort();
            free(msg);
        } else if (r == JLM_CHAT_IN_TOOLONG) {
            if (msg || size <= JLM_CHAT_IN_MAX)
                abort();
        } else if (r == JLM_CHAT_IN_EOF) {
            if (msg || jlm_chat_in_read(in, &msg) != JLM_CHAT_IN_EOF)
                abort();
            break;
        } else {
            break;   /* out of memory */
        }
        if (++reads > size + 1)
            abort();   /* every message consumes at least one line */
    }
    jlm_chat_in_close(in);
    fclose(f);
    return 0;
}
