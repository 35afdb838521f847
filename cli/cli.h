/* cli.h - the `jlm` subcommands. Each returns the process exit status
 * (0 ok, 1 failure, 2 usage) and prints its own errors as
 * "jlm <cmd>: <file>: <reason>". Only these mains may exit. */
#ifndef JLM_CLI_H
#define JLM_CLI_H

int jlm_cmd_convert(int argc, char **argv);
int jlm_cmd_info(int argc, char **argv);
int jlm_cmd_template(int argc, char **argv);
int jlm_cmd_run(int argc, char **argv);
int jlm_cmd_bench(int argc, char **argv);
int jlm_cmd_stats(int argc, char **argv);
int jlm_cmd_tokenize(int argc, char **argv);
int jlm_cmd_chat(int argc, char **argv);
int jlm_cmd_serve(int argc, char **argv);

/* The container picture of model (a .jlm or a jlmfs view) to out_path (NULL:
 * stdout), with the residency overlay of db/key, or of the view's database
 * when db is NULL; errors printed as "<who>: ...". Exit status. */
int jlm_cli_picture(const char *who, const char *model, const char *out_path, const char *db, const char *key);

/* Parses "123", "4K", "512M", "2G" (binary units); -1 on error. */
long long jlm_cli_parse_size(const char *s);
/* 1 if the file starts with the GGUF magic. */
int jlm_cli_is_gguf(const char *path);
/* The container a subcommand opens for MODEL (cli/resolve.c): a GGUF's
 * cached .jlm, converted once into $XDG_CACHE_HOME/jlm (else ~/.cache/jlm)
 * under a lock with a notice on stderr; anything else as given. NULL with
 * one "who: ..." line printed (a Hugging Face folder: "convert it"). The
 * string lives until exit. */
const char *jlm_cli_resolve_model(const char *who, const char *model);
/* The per-user cache directory ($XDG_CACHE_HOME/jlm, else ~/.cache/jlm),
 * created 0700; malloc'd, or NULL with *why set. */
char *jlm_cli_cache_dir(const char **why);
/* Removes the cache entry path unless a process holds it (every process
 * running an entry holds a shared flock on it until it exits, resolve.c):
 * 0 removed, 1 in use (nothing done), -1 with errno on another error. */
int jlm_cli_entry_remove(const char *path);
/* `jlm list`, `show`, `rm`, `ps`, `cache` (cli/cmd_models.c). */
int jlm_cmd_list(int argc, char **argv);
int jlm_cmd_show(int argc, char **argv);
int jlm_cmd_rm(int argc, char **argv);
int jlm_cmd_ps(int argc, char **argv);
int jlm_cmd_cache(int argc, char **argv);
int jlm_cmd_verify(int argc, char **argv);
/* Checks every span of the container file against file.sums, each bad one
 * named on stderr, a summary line on stdout: the exit status of `jlm verify`
 * (0 all match, 1 some do not or unreadable, 2 no or another's sidecar). */
int jlm_cli_verify_file(const char *file);

#include <stdint.h>

/* `jlm convert`'s progress (and the cache's, resolve.c), a jlm_conv_progress
 * callback. Mode JLM_CLI_BAR_TTY (stderr is a terminal): one line redrawn
 * with '\r': a bar, percent, MiB done of total, rate, ETA. JLM_CLI_BAR_LOG
 * (asked for: `jlm convert --progress`, or JLM_PROGRESS=1, when stderr is
 * not a terminal): plain lines for a log, one as each quarter (25, 50, 75%)
 * is passed and one every 30 s between; so a few, never one per unit.
 * JLM_CLI_BAR_OFF (a pipe or a test, not asked): nothing. Single-threaded
 * (the converter's writer calls it). */
enum { JLM_CLI_BAR_OFF = 0, JLM_CLI_BAR_TTY = 1, JLM_CLI_BAR_LOG = 2 };
/* The mode for stderr: TTY on a terminal, else LOG if asked (or
 * JLM_PROGRESS=1 in the environment), else OFF. */
int jlm_cli_bar_mode(int asked);
typedef struct jlm_cli_bar {
    const char *who;   /* "jlm convert": prefix of the plain lines */
    int tty, shown, last_pct;   /* tty: the mode (JLM_CLI_BAR_*) */
    double t0, t_line;
} jlm_cli_bar;
void jlm_cli_bar_init(jlm_cli_bar *b, const char *who, int tty);
void jlm_cli_progress(void *ctx, uint64_t done, uint64_t total);
/* Ends the terminal line (a newline if a bar was drawn). */
void jlm_cli_bar_end(jlm_cli_bar *b);

/* Prints "who: msg" and a newline to stderr, each control byte of msg (a
 * crafted tensor or key name) as '?' so a message can never drive the
 * terminal. */
void jlm_cli_error(const char *who, const char *msg);
/* jlm_cli_error with a printf format: the whole line (names from files or
 * the command line included) on one line, each control byte as '?'. */
void jlm_cli_errorf(const char *who, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s to print on stdout (a file, tensor or model name read from a file or
 * given by the user): each control byte as '?', in one of 8 rotating static
 * buffers (cut at 4 KiB). For the single-threaded printing of the CLI. */
const char *jlm_cli_clean(const char *s);
/* fputs of a text of several lines: each control byte but '\n' as '?'. */
void jlm_cli_puts_lines(const char *text, void *file);
/* "who: warning: -c N is above the model's trained context (M positions)"
 * when n_ctx (as given, 0: the engine's choice) exceeds it. */
struct jlm_engine;
void jlm_cli_ctx_warn(const char *who, struct jlm_engine *e, uint32_t n_ctx);
/* bytes in binary units after an integer printed beside it: "900 KiB",
 * "1.5 MiB", "12 B" (one decimal unless whole). Returns buf (32 bytes). */
const char *jlm_cli_iec(char buf[32], unsigned long long bytes);
/* A sampler seed when none is given (as llama.cpp's default -1): a u32 from
 * getrandom, or the clock if that fails. */
#define JLM_CLI_SEED_UNSET UINT64_MAX
uint64_t jlm_cli_random_seed(void);

#endif
