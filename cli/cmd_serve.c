/* cmd_serve.c - `jlm serve`: options, signals and the server's life cycle.
 * The server (serve/server.h) runs on its own threads; this main thread only
 * waits for SIGTERM/SIGINT, then drains (in-flight requests finish, new ones
 * get 503) and exits 0. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "serve/server.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char USAGE[] =
    "usage: jlm serve (MODEL... | --models DIR) [--host 127.0.0.1] [--port 8080] [--parallel N] [--queue N]\n"
    "                 [--api-key KEY] [--body-max SIZE] [-c CTX] [-t THREADS] [--budget SIZE]\n"
    "       (the key may also come from the environment: JLM_API_KEY)\n";

#define MAX_MODELS 64
#define DRAIN_S    120   /* the longest a shutdown waits for requests in flight */

typedef struct serve_opts {
    const char  *models_dir;
    char        *models[MAX_MODELS];   /* malloc'd paths */
    size_t       n_models;
    jlm_srv_opts srv;
} serve_opts;

static int add_model(serve_opts *o, const char *path)
{
    if (o->n_models == MAX_MODELS) {
        fprintf(stderr, "jlm serve: at most %d models\n", MAX_MODELS);
        return 2;
    }
    if (!(o->models[o->n_models] = strdup(path)))
        return 1;
    o->n_models++;
    return 0;
}

static int parse(int argc, char **argv, serve_opts *o)
{
    o->srv.port = 8080;
    o->srv.eng.direct = 1;
    o->srv.api_key = getenv("JLM_API_KEY");
    uint64_t body = 0;
    const jlm_opt t[] = {
        {NULL, "--models", JLM_OPT_STR, &o->models_dir, 0, 0, 0, "DIR", "serve every container in DIR"},
        {NULL, "--host", JLM_OPT_STR, &o->srv.host, 0, 0, 0, "HOST", "address to listen on (default: 127.0.0.1)"},
        {NULL, "--port", JLM_OPT_INT, &o->srv.port, 0, 65535, 0, "PORT", "port, 0: any free one"},
        {NULL, "--queue", JLM_OPT_INT, &o->srv.queue, 0, 1 << 20, 0, "N", "requests waiting at most, 0: the default"},
        {"-np", "--parallel", JLM_OPT_INT, &o->srv.parallel, 0, 16, 0, "N", "requests generating at once, 0: the default"},
        {NULL, "--api-key", JLM_OPT_STR, &o->srv.api_key, 0, 0, 0, "KEY", "bearer key required (or $JLM_API_KEY)"},
        {NULL, "--body-max", JLM_OPT_SIZE, &body, 0, 0, 0, "SIZE", "largest request body, 0: the default"},
        {"-c", "--ctx-size", JLM_OPT_U32, &o->srv.eng.n_ctx, 0, 1 << 24, 0, "N", "context size, 0: the model's"},
        {"-t", "--threads", JLM_OPT_INT, &o->srv.eng.n_threads, 1, 1024, 0, "N", "threads, unset: all cores"},
        {NULL, "--budget", JLM_OPT_SIZE, &o->srv.eng.budget, 0, 0, 0, "SIZE", "memory budget per model: frames + KV + scratch (K/M/G), 0: unlimited"},
    };
    const char *pos[MAX_MODELS + 1] = {0};
    jlm_opts_spec os = {"jlm serve", "(MODEL... | --models DIR) [options]", t, (int)(sizeof t / sizeof t[0]), pos,
                        MAX_MODELS, 0};
    int rc = jlm_opts_parse(&os, argc, argv);
    if (rc)
        return rc == 1 ? -1 : rc;
    for (int k = 0; k < os.n_pos && !rc; k++)
        rc = add_model(o, pos[k]);
    o->srv.body_max = (size_t)body;
    if (!rc && (o->srv.port < 0 || o->srv.port > 65535 || o->srv.queue < 0 || o->srv.parallel < 0 || o->srv.parallel > 16)) {
        fprintf(stderr, "jlm serve: --port must be in [0, 65535], --queue >= 0, --parallel in [1, 16]\n");
        rc = 2;
    }
    if (!rc && !o->models_dir && !o->n_models) {
        fputs(USAGE, stderr);
        rc = 2;
    }
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every NAME.jlm in dir (containers and jlmfs views), in name order. */
static int scan_models(serve_opts *o)
{
    DIR *d = opendir(o->models_dir);
    if (!d) {
        fprintf(stderr, "jlm serve: %s: cannot open the models folder\n", o->models_dir);
        return 1;
    }
    size_t first = o->n_models;
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n <= 4 || strcmp(e->d_name + n - 4, ".jlm") || e->d_name[0] == '.')
            continue;
        char *p;
        if (asprintf(&p, "%s/%s", o->models_dir, e->d_name) < 0)
            rc = 1;
        else
            rc = add_model(o, p), free(p);
    }
    closedir(d);
    qsort(o->models + first, o->n_models - first, sizeof *o->models, by_name);
    if (!rc && o->n_models == 0) {
        fprintf(stderr, "jlm serve: %s: no .jlm models in the folder\n", o->models_dir);
        rc = 1;
    }
    return rc;
}

int jlm_cmd_serve(int argc, char **argv)
{
    serve_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc < 0)
        return 0;   /* --help printed, nothing allocated */
    if (!rc && o.models_dir)
        rc = scan_models(&o);
    for (size_t i = 0; !rc && i < o.n_models; i++)
        if (jlm_cli_is_gguf(o.models[i])) {
            fprintf(stderr, "jlm serve: %s: a GGUF file; convert it first with `jlm convert %s`\n", o.models[i],
                    o.models[i]);
            rc = 1;
        }
    /* every thread the server starts inherits this mask: only sigwait sees them */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    jlm_srv *s = NULL;
    jlm_err err = {0};
    if (!rc && jlm_srv_open((const char *const *)o.models, o.n_models, &o.srv, &s, &err)) {
        fprintf(stderr, "jlm serve: %s\n", err.msg);
        rc = 1;
    }
    if (!rc) {
        printf("jlm serve: listening on http://%s:%d (%zu model%s)\n", o.srv.host ? o.srv.host : "127.0.0.1",
               jlm_srv_port(s), o.n_models, o.n_models == 1 ? "" : "s");
        fflush(stdout);
        int sig = 0;
        sigwait(&set, &sig);
        fprintf(stderr, "jlm serve: signal %d: draining\n", sig);
        if (jlm_srv_drain(s, DRAIN_S))
            fprintf(stderr, "jlm serve: requests still in flight after %d s: stopping anyway\n", DRAIN_S);
    }
    jlm_srv_close(s);
    for (size_t i = 0; i < o.n_models; i++)
        free(o.models[i]);
    return rc;
}
