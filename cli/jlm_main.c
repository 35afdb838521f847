/* jlm_main.c - the `jlm` command: a thin dispatcher over cli/cmd_*.c. */
#include "cli/backend.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/outfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cmd { const char *name; int (*fn)(int, char **); const char *help; } cmd;

static const cmd CMDS[] = {
    {"convert",  jlm_cmd_convert,  "convert SRC.gguf|DIR [-o OUT.jlm] [--plan]   GGUF or HF folder -> .jlm"},
    {"info",     jlm_cmd_info,     "info MODEL [--tensors] [--json]          what a container holds"},
    {"run",      jlm_cmd_run,      "run MODEL -p PROMPT [-n N] [-c CTX] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S] [-t N] [--budget SIZE] [-ctk T] [-ctv T] [--chat] [-sys TEXT] [--stats] [--json] [--print-ids] [--logits FILE] [--trace-routing FILE]"},
    {"tokenize", jlm_cmd_tokenize, "tokenize MODEL TEXT [--ids] [--no-bos] [--parse-special]"},
    {"chat",     jlm_cmd_chat,     "chat MODEL [-n N] [-c CTX] [-t T] [--temp T] [--seed S] [--budget SIZE] [-ctk T] [-ctv T]   one user message per line"},
    {"serve",    jlm_cmd_serve,    "serve (MODEL... | --models DIR) [--host H] [--port P] [--parallel N] [--queue N] [--api-key K] [-c CTX] [-t N] [--budget SIZE]   OpenAI-compatible HTTP server"},
    {"bench",    jlm_cmd_bench,    "bench MODEL [-p 512] [-n 128] [-r 3] [-t N] [--budget SIZE] [-ctk T] [-ctv T] [-o md|csv|json]   llama-bench-like speed table"},
    {"template", jlm_cmd_template, "template (MODEL | --template F) --messages F.json [--add-generation-prompt] [--bos S] [--eos S] [--now ISO]"},
    {"list",     jlm_cmd_list,     "list [MOUNT...] [--models DIR]          models in the cache, jlmfs mounts and DIR"},
    {"show",     jlm_cmd_show,     "show MODEL                              architecture, parameters, context, template, license"},
    {"rm",       jlm_cmd_rm,       "rm MODEL...                             remove cache entries (never one in use)"},
    {"ps",       jlm_cmd_ps,       "ps                                      processes running a cached model"},
    {"cache",    jlm_cmd_cache,    "cache prune [DIR] [--older-than D] [--max-size S]   remove unused cache entries"},
    {"verify",   jlm_cmd_verify,   "verify MODEL                            check every page against MODEL.sums (exit 0 all match, 1 some do not, 2 no sidecar)"},
    {"stats",    jlm_cmd_stats,    "stats MOUNT_OR_DB [--json | --watch S | --html [-o F]]   residency counters of a jlmfs mount, view or database"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: jlm COMMAND [ARGS] | jlm --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
        fprintf(f, "  jlm %s\n", CMDS[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : jlm_cli_stdout_close("jlm");
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        jlm_opts_version("jlm");
        jlm_cli_print_version(stdout);
        return jlm_cli_stdout_close("jlm");
    }
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
        if (!strcmp(argv[1], CMDS[i].name)) {
            char who[32];
            snprintf(who, sizeof who, "jlm %s", CMDS[i].name);
            int rc = CMDS[i].fn(argc - 1, argv + 1);
            int orc = jlm_cli_stdout_close(who);   /* every write to stdout and its close checked: exit 1 */
            return rc ? rc : orc;
        }
    fprintf(stderr, "jlm: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
