/* chat_input.h - where `jlm chat` reads the user's messages from.
 *
 * On a terminal (stdin a tty, and stderr or stdout one to draw on): libedit
 * (Debian's libedit, the BSD editline library) gives line editing with the
 * emacs keys and a history kept in $XDG_STATE_HOME/jlm/history (else
 * ~/.local/state/jlm/history; mode 0600, silently skipped when it cannot be
 * read or written). Otherwise plain line reads (pipes, files), as before.
 *
 * Both assemble one message from several lines the same way:
 *   - a line starting with \"\"\" opens a block that the next line ending
 *     with \"\"\" closes (as ollama); the lines keep their newlines;
 *   - a line ending with a backslash continues on the next line (the
 *     backslash becomes a newline, as llama.cpp's multiline input).
 *
 * Owns: the EditLine, its History and the partial message. Invariants: a
 * returned message never holds the trailing newline of its last line.
 * Single-threaded; the caller owns SIGINT (see jlm_chat_in_read).
 */
#ifndef JLM_CLI_CHAT_INPUT_H
#define JLM_CLI_CHAT_INPUT_H

#include <signal.h>

typedef struct jlm_chat_in jlm_chat_in;

enum {
    JLM_CHAT_IN_MSG = 0,   /* *msg holds a message (malloc'd) */
    JLM_CHAT_IN_EOF = 1,   /* end of input or Ctrl-D at an empty prompt */
    JLM_CHAT_IN_INTR = 2,  /* Ctrl-C at an empty prompt, or SIGINT while waiting */
    JLM_CHAT_IN_TOOLONG = 3, /* a message over JLM_CHAT_IN_MAX bytes: read to its end and dropped */
    JLM_CHAT_IN_NOMEM = -1,
};

#define JLM_CHAT_IN_MAX (4u << 20)   /* bytes in one message (a line of a pipe is read in bounded memory) */

/* Opens the reader for stdin. intr: the flag the caller's SIGINT handler sets
 * (the handler must be installed without SA_RESTART while reading in plain
 * mode, so a blocked read returns). NULL when out of memory. */
jlm_chat_in *jlm_chat_in_open(const char *prog, volatile sig_atomic_t *intr);
/* 1 when the terminal editor is in use. */
int jlm_chat_in_edits(const jlm_chat_in *in);
/* Reads the next message. On a terminal, Ctrl-C with text typed (or inside a
 * block) discards that text and prompts again; at an empty prompt it returns
 * JLM_CHAT_IN_INTR. At the end of input a pending block or continuation is
 * returned as a message first. Ctrl-D ends the prompt's line (a newline on
 * the terminal) before JLM_CHAT_IN_EOF. */
int jlm_chat_in_read(jlm_chat_in *in, char **msg);
/* Saves the history (terminal mode) and frees everything. Accepts NULL. */
void jlm_chat_in_close(jlm_chat_in *in);

/* The history file's path (malloc'd), or NULL when neither XDG_STATE_HOME
 * (absolute) nor HOME is set. */
char *jlm_chat_history_path(void);

#endif
