/* cmd_serve.c - `jlm serve`: options, signals and the server's life cycle.
 * The server (serve/server.h) runs on its own threads; this main thread only
 * waits for SIGTERM/SIGINT, then drains (in-flight requests finish, new ones
 * get 503) and exits 0. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/report.h"
#include "serve/server.h"
#include "text/template/jinja.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char USAGE[] =
    "usage: jlm serve (MODEL... | --models DIR) [--host 127.0.0.1] [--port 8080] [--parallel N] [--queue N]\n"
    "                 [--api-key KEY] [--body-max SIZE] [--conn-per-addr N] [--header-timeout S]\n"
    "                 [--body-timeout S] [-c CTX] [-t THREADS] [--budget SIZE] [--rescan S]\n"
    "                 [--prefix-cache SIZE] [--chat-template-file FILE]\n"
    "                 [--kv T] [-ctk T] [-ctv T] [--backend NAME[,NAME]] [--device N|NAME[,..]] [--gpu-layers N|all[,M|all]]\n"
    "                 [--gpu-budget SIZE[,SIZE]] [--no-direct]\n"
    "       (MODEL: a .jlm, a jlmfs view, or a .gguf converted once into the cache as `jlm run` does;\n"
    "        the key may also come from the environment: JLM_API_KEY)\n";

#define MAX_MODELS 64
#define DRAIN_S    120   /* the longest a shutdown waits for requests in flight */

typedef struct serve_opts {
    char         *models[MAX_MODELS];   /* malloc'd container paths */
    char         *ids[MAX_MODELS];      /* malloc'd ids (the stem of the path as given) */
    size_t        n_models;
    char         *tmpl;                 /* --chat-template-file's text; NULL: none */
    jlm_srv_opts  srv;
} serve_opts;

/* The stem of a path as given: "a/foo.gguf" and "a/foo.jlm" are "foo". */
static char *stem(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *b = path + n;
    while (b > path && b[-1] != '/') b--;
    size_t bl = (size_t)(path + n - b);
    if (bl > 5 && !strncmp(b + bl - 5, ".gguf", 5)) bl -= 5;
    else if (bl > 4 && !strncmp(b + bl - 4, ".jlm", 4)) bl -= 4;
    return strndup(b, bl);
}

/* A model argument: a GGUF resolves to its cached container (converted
 * once, cli/resolve.c), served under the GGUF's stem. */
static int add_model(serve_opts *o, const char *arg)
{
    if (o->n_models == MAX_MODELS) {
        fprintf(stderr, "jlm serve: at most %d models\n", MAX_MODELS);
        return 2;
    }
    const char *path = jlm_cli_resolve_model("jlm serve", arg);
    if (!path)
        return 1;
    o->models[o->n_models] = strdup(path);
    o->ids[o->n_models] = stem(arg);
    o->n_models++;
    return o->models[o->n_models - 1] && o->ids[o->n_models - 1] ? 0 : 1;
}

/* --chat-template-file: read and parsed once, so a broken one stops the start. */
static int read_template(serve_opts *o, const char *path)
{
    if (!(o->tmpl = jlm_opts_read_text("jlm serve", "--chat-template-file", path, JLM_CLI_TEMPLATE_MAX)))
        return 1;
    jlm_jinja *t = NULL;
    jlm_err err = {0};
    if (jlm_jinja_parse(o->tmpl, strlen(o->tmpl), &t, &err)) {
        fprintf(stderr, "jlm serve: --chat-template-file %s: %s\n", path, err.msg);
        return 1;
    }
    jlm_jinja_free(t);
    o->srv.chat_template = o->tmpl;
    return 0;
}

static int parse(int argc, char **argv, serve_opts *o)
{
    o->srv.port = 8080;
    o->srv.rescan_s = 5;
    o->srv.parallel = 4;
    o->srv.queue = 8;
    o->srv.prefix_cache = (uint64_t)1 << 30;
    o->srv.conn_per_addr = 32;
    o->srv.header_s = 10;
    o->srv.body_s = 60;
    o->srv.eng.direct = 1;
    o->srv.api_key = getenv("JLM_API_KEY");
    o->srv.report = jlm_cli_view("jlm serve");   /* a view's page-ins reported as jlm run's (cli/report.c) */
    uint64_t body = 1 << 20;
    const char *m_opt = NULL, *tmpl_path = NULL;
    const jlm_opt own[] = {
        {"-m", "--model", JLM_OPT_STR, &m_opt, 0, 0, 0, "FILE", "a model to serve (as llama-server -m; or give them as MODEL...)"},
        {NULL, "--models", JLM_OPT_STR, &o->srv.models_dir, 0, 0, 0, "DIR", "serve every container and view in DIR, rescanned"},
        {NULL, "--rescan", JLM_OPT_INT, &o->srv.rescan_s, 0, 86400, 0, "S", "seconds between rescans of --models, 0: on request only"},
        {NULL, "--host", JLM_OPT_STR, &o->srv.host, 0, 0, 0, "HOST", "address to listen on (default: 127.0.0.1)"},
        {NULL, "--port", JLM_OPT_INT, &o->srv.port, 0, 65535, 0, "PORT", "port, 0: any free one"},
        {NULL, "--queue", JLM_OPT_INT, &o->srv.queue, 1, 1 << 20, 0, "N", "requests waiting per model at most"},
        {"-np", "--parallel", JLM_OPT_INT, &o->srv.parallel, 1, 16, 0, "N", "requests per model generating at once"},
        {NULL, "--api-key", JLM_OPT_STR, &o->srv.api_key, 0, 0, 0, "KEY", "bearer key required (or $JLM_API_KEY)"},
        {NULL, "--body-max", JLM_OPT_SIZE, &body, 1, 64 << 20, 0, "SIZE", "largest request body (K/M), at most 64M"},
        {NULL, "--conn-per-addr", JLM_OPT_INT, &o->srv.conn_per_addr, 1, 64, 0, "N",
         "connections from one client address at once"},
        {NULL, "--header-timeout", JLM_OPT_INT, &o->srv.header_s, 1, 3600, 0, "S",
         "seconds a request's line and headers may take"},
        {NULL, "--body-timeout", JLM_OPT_INT, &o->srv.body_s, 1, 3600, 0, "S",
         "seconds a request's body may take after its headers"},
        {NULL, "--budget", JLM_OPT_SIZE, &o->srv.budget, 0, 0, 0, "SIZE",
         "page frames of all models together (K/M/G), 0: unlimited"},
        {NULL, "--prefix-cache", JLM_OPT_SIZE, &o->srv.prefix_cache, 0, 0, 0, "SIZE",
         "KV of earlier requests each model keeps for reuse (K/M/G), 0: none"},
        {NULL, "--chat-template-file", JLM_OPT_STR, &tmpl_path, 0, 0, 0, "FILE",
         "a Jinja chat template for every model instead of its own (as llama-server's)"},
    };
    /* the engine's rows as run and chat have them (the budget is the server's own, above) */
    jlm_opts_gpu gpu = {0};
    jlm_opt t[sizeof own / sizeof own[0] + JLM_OPTS_ENGINE_MAX];
    int nt = jlm_opts_cat(t, 0, own, (int)(sizeof own / sizeof own[0]));
    nt += jlm_opts_engine_rows(t + nt, JLM_ROWS_CTX | JLM_ROWS_THREADS | JLM_ROWS_KV | JLM_ROWS_PAGING | JLM_ROWS_BACKEND,
                               &o->srv.eng, &gpu);
    const char *pos[MAX_MODELS + 1] = {0};
    jlm_opts_spec os = {"jlm serve", "(MODEL... | --models DIR) [options]", t, nt, pos, MAX_MODELS, 0};
    int rc = jlm_opts_parse(&os, argc, argv);
    if (rc)
        return rc == 1 ? -1 : rc;
    if ((rc = jlm_opts_engine_finish("jlm serve", &o->srv.eng, &gpu)))
        return rc;
    o->srv.body_max = (size_t)body;
    o->srv.no_prefix_cache = o->srv.prefix_cache == 0;
    if (tmpl_path && (rc = read_template(o, tmpl_path)))
        return rc;
    if (m_opt && os.n_pos < MAX_MODELS)
        pos[os.n_pos++] = m_opt;   /* -m FILE: served as the first positional would be */
    if (!o->srv.models_dir && !os.n_pos) {
        fputs(USAGE, stderr);
        return 2;
    }
    for (int k = 0; k < os.n_pos && !rc; k++)
        rc = add_model(o, pos[k]);
    return rc;
}

int jlm_cmd_serve(int argc, char **argv)
{
    serve_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc < 0)
        return 0;   /* --help printed, nothing allocated */
    /* every thread the server starts inherits this mask: only sigwait sees them */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    jlm_srv_model ms[MAX_MODELS];
    for (size_t i = 0; i < o.n_models; i++)
        ms[i] = (jlm_srv_model){o.models[i], o.ids[i]};
    jlm_srv *s = NULL;
    jlm_err err = {0};
    if (!rc && jlm_srv_open(ms, o.n_models, &o.srv, &s, &err)) {
        fprintf(stderr, "jlm serve: %s\n", err.msg);
        rc = 1;
    }
    if (!rc) {
        size_t n = jlm_srv_n_models(s);
        printf("jlm serve: listening on http://%s:%d (%zu model%s)\n", o.srv.host ? o.srv.host : "127.0.0.1",
               jlm_srv_port(s), n, n == 1 ? "" : "s");
        fflush(stdout);
        int sig = 0;
        sigwait(&set, &sig);
        fprintf(stderr, "jlm serve: signal %d: draining\n", sig);
        if (jlm_srv_drain(s, DRAIN_S))
            fprintf(stderr, "jlm serve: requests still in flight after %d s: stopping anyway\n", DRAIN_S);
    }
    jlm_srv_close(s);
    free(o.tmpl);
    for (size_t i = 0; i < o.n_models; i++) {
        free(o.models[i]);
        free(o.ids[i]);
    }
    return rc;
}
