/* jlmfs_main.c - the `jlmfs` daemon's main: --version here, everything else
 * is the daemon (fs/daemon.h; the FUSE layer lives in fs/). */
#include "fs/daemon.h"
#include "cli/opts.h"
#include "format/jlm_format.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))) {
        printf("jlmfs version %s (.jlm format %u)\n", JLM_CLI_VERSION, (unsigned)JLM_VERSION);
        /* the build: what the daemon is made of (it runs no kernels: no SIMD or device line) */
        jlmfs_daemon_print_build(stdout);
        return 0;
    }
    return jlmfs_daemon_main(argc, argv);
}
