/* http_int.h - what serve/server.c (routing, the OpenAI endpoints) shares
 * with the handlers of the other APIs: serve/anthropic.c (/v1/messages),
 * serve/ollama.c (/api/...), serve/embed.c (/v1/embeddings). Not part of
 * the server's contract (server.h). Every function runs on a connection
 * thread and queues exactly one response. */
#ifndef JLM_SERVE_HTTP_INT_H
#define JLM_SERVE_HTTP_INT_H

#include <microhttpd.h>

#include "serve/srv_int.h"

/* Sends j (taking the reference) as application/json. */
enum MHD_Result jlm_srv_send_json(struct MHD_Connection *c, unsigned status, json_t *j);
/* An error in dia's shape (NULL: OpenAI's), counted in /metrics. */
enum MHD_Result jlm_srv_send_error(struct jlm_srv *s, struct MHD_Connection *c, const srv_dialect *dia,
                                   unsigned status, const char *msg);
/* The model named id, referenced (NULL: none), after a rescan of --models
 * when it is unknown, not ready or changed. */
srv_model *jlm_srv_find_model(struct jlm_srv *s, const char *id);
/* A parsed request (taken, *req zeroed): its model found (the only one
 * when it names none), its job created, queued and answered in dia's shape
 * (NULL: OpenAI's), streamed or whole. */
enum MHD_Result jlm_srv_submit(struct jlm_srv *s, struct MHD_Connection *c, jlm_srv_req *req, const srv_dialect *dia);

/* The handlers: body[0, len) is the request body. */
enum MHD_Result jlm_srv_anthropic(struct jlm_srv *s, struct MHD_Connection *c, const char *body, size_t len);
enum MHD_Result jlm_srv_embeddings(struct jlm_srv *s, struct MHD_Connection *c, const char *body, size_t len);
enum MHD_Result jlm_srv_ollama(struct jlm_srv *s, struct MHD_Connection *c, const char *url, const char *method,
                               const char *body, size_t len);
/* /api/embed's response shape (embed.c) */
extern const srv_dialect jlm_srv_dia_ollama_embed;

#endif
