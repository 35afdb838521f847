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

/* Parses "123", "4K", "512M", "2G" (binary units); -1 on error. */
long long jlm_cli_parse_size(const char *s);
/* 1 if the file starts with the GGUF magic. */
int jlm_cli_is_gguf(const char *path);
/* Prints "who: msg" and a newline to stderr, each control byte of msg (a
 * crafted tensor or key name) as '?' so a message can never drive the
 * terminal. */
void jlm_cli_error(const char *who, const char *msg);

#endif
