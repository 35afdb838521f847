/* test_serve.c - `jlm serve` as clients use it: a server on a free loopback
 * port per test, driven with curl and a small socket client; request parsing
 * and the stop-string scan on crafted inputs. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <jansson.h>
#include <netinet/in.h>
#include <png.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>

#include "converter/convert.h"
#include "engine/model.h"
#include "engine/vision.h"
#include "engine/sampler.h"
#include "serve/api.h"
#include "tests/testutil.h"
#include "tests/mntutil.h"

/* ---------------------------------------------------------------- a server per test */

typedef struct srv {
    char *dir, *model;   /* temp dir, converted stories260K */
    pid_t pid;
    int   port;
} srv;

static char *convert_to(const char *gguf, const char *dir, const char *name)
{
    char *out = malloc(1024);
    snprintf(out, 1024, "%s/%s", dir, name);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(tu_model(gguf), NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(c, out, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    return out;
}

/* Reads the "listening on http://127.0.0.1:PORT" line (at most 20 s). */
static int read_port(int fd)
{
    char line[256];
    size_t n = 0;
    for (int tries = 0; tries < 200 && n < sizeof line - 1; tries++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = read(fd, line + n, sizeof line - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        line[n] = 0;
        const char *c = strstr(line, "127.0.0.1:");
        if (c && strchr(c, '\n'))
            return atoi(c + 10);
    }
    return -1;
}

/* Starts `jlm serve MODEL ARGS...` on port 0 (the kernel picks a free one). */
static void srv_start(srv *s, const char *const *args)
{
    if (!s->dir) {
        s->dir = tu_tmpdir();
        s->model = convert_to("stories260K.gguf", s->dir, "stories.jlm");
    }
    const char *argv[32] = {tu_jlm(), "serve", "--port", "0", "-t", "1", s->model};
    size_t k = s->model ? 7 : 6;   /* no model: args name them (--models DIR) */
    for (size_t i = 0; args && args[i] && k < 31; i++) argv[k++] = args[i];
    argv[k] = NULL;
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    s->pid = fork();
    cr_assert(s->pid >= 0);
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* a failed assertion never leaves a server behind */
        char log[1100];
        snprintf(log, sizeof log, "%s/server.log", s->dir);
        int lf = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (lf >= 0) dup2(lf, 2);
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    s->port = read_port(fd[0]);
    close(fd[0]);
    cr_assert(s->port > 0, "jlm serve printed its port");
}

/* SIGTERM, then the exit status (at most 30 s; -1 if it did not exit). */
static int srv_stop(srv *s)
{
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 600; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(50000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return -1;
}

/* Stops the server (it must exit 0: under ASan a leak or an error fails it
 * here), removes the temp dir. */
static void srv_free(srv *s)
{
    if (s->pid > 0) {
        int rc = srv_stop(s);
        cr_assert_eq(rc, 0, "the server exits 0 on SIGTERM (see %s/server.log)", s->dir);
    }
    tu_rmrf(s->dir);
    free(s->dir);
    free(s->model);
}

/* curl METHOD PATH [-d @body]: the response body in *out, the HTTP status returned. */
static int http(const srv *s, const char *method, const char *path, const char *body, const char *extra, char **out)
{
    char bf[1100] = "", cmd[4096];
    if (body) {
        snprintf(bf, sizeof bf, "%s/body.json", s->dir);
        cr_assert_eq(tu_write_file(bf, body, strlen(body)), 0);
    }
    snprintf(cmd, sizeof cmd, "curl -sN --max-time 60 -o %s/resp -w '%%{http_code}' -X %s %s%s %s http://127.0.0.1:%d%s",
             s->dir, method, body ? "--data-binary @" : "", bf, extra ? extra : "", s->port, path);
    char *code = NULL;
    tu_run(cmd, &code);
    int status = code ? atoi(code) : -1;
    free(code);
    char rp[1100];
    snprintf(rp, sizeof rp, "%s/resp", s->dir);
    size_t n = 0;
    unsigned char *b = tu_read_file(rp, &n);
    char *t = malloc(n + 1);
    if (b) memcpy(t, b, n);
    t[n] = 0;
    free(b);
    *out = t;
    return status;
}

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    cr_assert(j, "JSON response: %s (%s)", e.text, s);
    return j;
}

/* The text of a completion (choices[0].text or .message.content). */
static char *completion_text(const char *resp, const char **finish)
{
    json_t *j = parse(resp), *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *t = json_object_get(c, "text");
    if (!t) t = json_object_get(json_object_get(c, "message"), "content");
    cr_assert(json_is_string(t), "a text in %s", resp);
    char *r = strdup(json_string_value(t));
    static char fin[16];
    snprintf(fin, sizeof fin, "%s", json_string_value(json_object_get(c, "finish_reason")));
    if (finish) *finish = fin;
    json_decref(j);
    return r;
}

/* Concatenates the text of every SSE chunk; checks the stream ends with [DONE]. */
static char *stream_text(const char *resp, const char **finish)
{
    static char fin[16] = "";
    size_t cap = strlen(resp) + 1, len = 0;
    char *out = calloc(1, cap);
    const char *p = resp, *last = NULL;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        cr_assert(e, "every event ends with a blank line");
        last = p;
        if (!strncmp(p, "[DONE]", 6)) break;
        char *ev = strndup(p, (size_t)(e - p));
        json_t *j = parse(ev), *c = json_array_get(json_object_get(j, "choices"), 0);
        json_t *t = json_object_get(c, "text");
        if (!t) t = json_object_get(json_object_get(c, "delta"), "content");
        if (json_is_string(t)) {
            memcpy(out + len, json_string_value(t), json_string_length(t));
            len += json_string_length(t);
        }
        if (json_is_string(json_object_get(c, "finish_reason")))
            snprintf(fin, sizeof fin, "%s", json_string_value(json_object_get(c, "finish_reason")));
        json_decref(j);
        free(ev);
        p = e;
    }
    cr_assert(last && !strncmp(last, "[DONE]\n\n", 8), "the stream ends with data: [DONE]: %s", resp);
    if (finish) *finish = fin;
    return out;
}

static char *jlm_run(const srv *s, const char *prompt, int n)
{
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s -p '%s' -n %d --temp 0 -t 1 2>/dev/null", tu_jlm(), s->model, prompt, n);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    return o;
}

static void expect_error(const srv *s, const char *method, const char *path, const char *body, const char *extra,
                         int status, const char *type);

/* ---------------------------------------------------------------- endpoints */

Test(serve, greedy_completion_equals_jlm_run_streamed_or_not, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    const char *prompts[] = {"Once upon a time", "The cat", "Lily and Ben went to"};
    for (size_t i = 0; i < 3; i++) {
        char *ref = jlm_run(&s, prompts[i], 24), body[512], *r = NULL;
        cr_assert(strlen(ref) > 0);
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 24, \"temperature\": 0}", prompts[i]);
        cr_assert_eq(http(&s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
        json_t *j = parse(r);
        cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "text_completion");
        cr_assert_str_eq(json_string_value(json_object_get(j, "model")), "stories");
        json_t *u = json_object_get(j, "usage");
        cr_assert_eq(json_integer_value(json_object_get(u, "completion_tokens")), 24, "%s", r);
        cr_assert_eq(json_integer_value(json_object_get(u, "total_tokens")),
                     json_integer_value(json_object_get(u, "prompt_tokens")) + 24);
        json_decref(j);
        const char *fin;
        char *t = completion_text(r, &fin);
        cr_assert_str_eq(t, ref, "API text equals jlm run's for '%s'", prompts[i]);
        cr_assert_str_eq(fin, "length");
        free(t); free(r);
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 24, \"temperature\": 0, \"stream\": true}",
                 prompts[i]);
        cr_assert_eq(http(&s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
        t = stream_text(r, &fin);
        cr_assert_str_eq(t, ref, "streamed text equals jlm run's for '%s'", prompts[i]);
        cr_assert_str_eq(fin, "length");
        free(t); free(r); free(ref);
    }
    cr_assert_eq(srv_stop(&s), 0, "SIGTERM exits 0");
    srv_free(&s);
}

Test(serve, greedy_chat_equals_jlm_chat_first_reply, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    char cmd[2048], *ref = NULL, *r = NULL;
    snprintf(cmd, sizeof cmd, "(printf 'Hello there\\n' | %s chat %s -n 12 --temp 0 -t 1 2>/dev/null)", tu_jlm(), s.model);
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    const char *body = "{\"model\": \"stories\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello there\"}], "
                       "\"max_tokens\": 12, \"temperature\": 0}";
    cr_assert_eq(http(&s, "POST", "/v1/chat/completions", body, NULL, &r), 200, "%s", r);
    json_t *j = parse(r);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "role")), "assistant");
    json_decref(j);
    char *t = completion_text(r, NULL), want[4096];
    snprintf(want, sizeof want, "%s\n", t);
    cr_assert_str_eq(want, ref, "chat reply through the API equals jlm chat's");
    free(t); free(r);
    const char *sbody = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hello there\"}]}], "
                        "\"max_tokens\": 12, \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}}";
    cr_assert_eq(http(&s, "POST", "/v1/chat/completions", sbody, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "\"object\":\"chat.completion.chunk\""), "%s", r);
    cr_assert(strstr(r, "\"role\":\"assistant\""), "the first delta carries the role: %s", r);
    cr_assert(strstr(r, "\"usage\":{\"prompt_tokens\":"), "include_usage adds a usage chunk: %s", r);
    t = stream_text(r, NULL);
    snprintf(want, sizeof want, "%s\n", t);
    cr_assert_str_eq(want, ref, "streamed chat reply (typed content parts) equals jlm chat's");
    free(t); free(r); free(ref);
    srv_free(&s);
}

/* ---------------------------------------------------------------- images */

/* "data:MIME;base64,..." of a file's bytes (malloc'd). */
static char *data_uri(const char *path, const char *mime)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0;
    unsigned char *b = tu_read_file(path, &n);
    cr_assert(b, "%s", path);
    char head[64];
    snprintf(head, sizeof head, "data:%s;base64,", mime);
    char *o = malloc(strlen(head) + (n + 2) / 3 * 4 + 1), *q = o + strlen(head);
    strcpy(o, head);
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *q++ = a[v >> 18 & 63];
        *q++ = a[v >> 12 & 63];
        *q++ = i + 1 < n ? a[v >> 6 & 63] : '=';
        *q++ = i + 2 < n ? a[v & 63] : '=';
    }
    *q = 0;
    free(b);
    return o;
}

/* A chat body with one user message: an image_url part (url) and a text part. */
static char *image_body(const char *url, const char *extra)
{
    size_t n = strlen(url) + 512;
    char *b = malloc(n);
    snprintf(b, n, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": "
                   "\"%s\"}}, {\"type\": \"text\", \"text\": \"Describe:\"}]}], \"max_tokens\": 8, \"temperature\": 0%s}",
             url, extra);
    return b;
}

Test(serve, an_image_request_gives_what_jlm_run_image_gives_streamed_or_not, .timeout = 180)
{
    srv s = {.dir = tu_tmpdir()};
    s.model = malloc(1200);
    snprintf(s.model, 1200, "%s/v.jlm", s.dir);
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open_mm(tu_model("synth-gemma3v-128.F32.gguf"), tu_model("mmproj-tinygemma3.gguf"), NULL, &c,
                                  &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(c, s.model, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    srv_start(&s, NULL);
    char img[2][1200], pf[1200], cmd[4096], *r = NULL;
    snprintf(img[0], sizeof img[0], "%s/tests/models/images/grad-32x32.ppm", tu_root());
    snprintf(img[1], sizeof img[1], "%s/shapes.png", s.dir);   /* the other test image as a PNG */
    jlm_image pic;
    snprintf(pf, sizeof pf, "%s/tests/models/images/shapes-48x40.ppm", tu_root());
    cr_assert_eq(jlm_image_load(pf, &pic, &err), 0, "%s", err.msg);
    png_image pi = {.version = PNG_IMAGE_VERSION, .width = pic.w, .height = pic.h, .format = PNG_FORMAT_RGB};
    cr_assert(png_image_write_to_file(&pi, img[1], 0, pic.rgb, 0, NULL), "%s", pi.message);
    jlm_image_free(&pic);
    /* the chat as the ChatML fallback renders it, the image at llama.cpp's marker */
    const char *prompt = "<|im_start|>user\n<__media__>\nDescribe:<|im_end|>\n<|im_start|>assistant\n";
    snprintf(pf, sizeof pf, "%s/prompt.txt", s.dir);
    cr_assert_eq(tu_write_file(pf, prompt, strlen(prompt)), 0);
    char *uri = NULL, *body = NULL, *ref = NULL;
    json_t *want = NULL;
    for (int k = 0; k < 2; k++) {
        free(uri); free(ref);
        json_decref(want);
        snprintf(cmd, sizeof cmd, "%s run %s --image %s -f %s -n 8 --temp 0 -t 1 2>/dev/null", tu_jlm(), s.model, img[k],
                 pf);
        cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
        want = jlm_srv_json_text(ref, strlen(ref));   /* as the server sends any text */
        uri = data_uri(img[k], k ? "image/png" : "image/x-portable-pixmap");
        body = image_body(uri, "");
        cr_assert_eq(http(&s, "POST", "/v1/chat/completions", body, NULL, &r), 200, "%s", r);
        json_t *j = parse(r);
        cr_assert_gt(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 256,
                     "the image's 256 embeddings count as prompt tokens: %s", r);
        json_decref(j);
        char *t = completion_text(r, NULL);
        cr_assert(strlen(json_string_value(want)) > 0);
        cr_assert_str_eq(t, json_string_value(want), "the reply equals jlm run --image %s's", img[k]);
        free(t); free(r); free(body);
        body = image_body(uri, ", \"stream\": true");
        cr_assert_eq(http(&s, "POST", "/v1/chat/completions", body, NULL, &r), 200, "%s", r);
        t = stream_text(r, NULL);
        cr_assert_str_eq(t, json_string_value(want), "the streamed reply equals jlm run --image %s's", img[k]);
        free(t); free(r); free(body);
    }
    /* refusals, each naming what is wrong */
    static const char *const bad[][2] = {
        {"https://example.com/cat.png", "only data: URIs"},
        {"file:///etc/passwd", "only data: URIs"},
        {"data:image/png;base64,@@@@", "'messages[0].content[0].image_url.url': the data is not valid base64"},
        {"data:text/plain,hello", "'messages[0].content[0].image_url.url': expected data:image/"},
        {"data:image/png;base64,aGVsbG8gd29ybGQ=", "'messages[0].content[0]'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        body = image_body(bad[i][0], "");
        cr_assert_eq(http(&s, "POST", "/v1/chat/completions", body, NULL, &r), 400, "%s: %s", bad[i][0], r);
        cr_assert(strstr(r, bad[i][1]), "%s: %s", bad[i][0], r);
        free(r); free(body);
    }
    cr_assert_eq(srv_stop(&s), 0, "SIGTERM exits 0");
    srv_free(&s);
    /* a model without a vision tower is named */
    srv s2 = {0};
    srv_start(&s2, NULL);
    body = image_body(uri, "");
    cr_assert_eq(http(&s2, "POST", "/v1/chat/completions", body, NULL, &r), 400, "%s", r);
    cr_assert(strstr(r, "model 'stories' has no vision tower"), "%s", r);
    free(r); free(body); free(uri); free(ref);
    json_decref(want);
    srv_free(&s2);
}

/* ---------------------------------------------------------------- seed, echo */

/* The text of a completion request with body (streamed or not). */
static char *text_of(const srv *s, const char *body)
{
    char *r = NULL;
    cr_assert_eq(http(s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
    char *t = strstr(body, "\"stream\": true") ? stream_text(r, NULL) : completion_text(r, NULL);
    free(r);
    return t;
}

Test(serve, a_requests_seed_makes_sampling_repeatable, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    const char *fmt = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 32, \"temperature\": 1.0, \"seed\": %d%s}";
    char body[512];
    snprintf(body, sizeof body, fmt, 42, "");
    char *a = text_of(&s, body), *b = text_of(&s, body);
    snprintf(body, sizeof body, fmt, 42, ", \"stream\": true");
    char *c = text_of(&s, body);
    snprintf(body, sizeof body, fmt, 43, "");
    char *d = text_of(&s, body);
    cr_assert(strlen(a) > 0);
    cr_assert_str_eq(a, b, "the same seed gives the same text");
    cr_assert_str_eq(a, c, "streamed or not");
    cr_assert_str_neq(a, d, "another seed gives another text");
    free(a); free(b); free(c); free(d);
    srv_free(&s);
}

Test(serve, echo_puts_the_prompt_before_the_completion_streamed_or_not, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    char *ref = jlm_run(&s, "Once upon a time", 16), want[1024];
    snprintf(want, sizeof want, "Once upon a time%s", ref);
    const char *fmt = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 0, \"echo\": true%s}";
    char body[512];
    snprintf(body, sizeof body, fmt, "");
    char *t = text_of(&s, body);
    cr_assert_str_eq(t, want);
    free(t);
    snprintf(body, sizeof body, fmt, ", \"stream\": true");
    t = text_of(&s, body);
    cr_assert_str_eq(t, want);
    free(t);
    snprintf(body, sizeof body, fmt, ", \"logprobs\": 1");
    expect_error(&s, "POST", "/v1/completions", body, NULL, 400, "invalid_request_error");
    free(ref);
    srv_free(&s);
}

/* The text of each choice (by "index") of a whole or streamed response. */
static void choice_texts(const char *resp, int stream, char *out[], size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = calloc(1, strlen(resp) + 1);
    const char *p = resp;
    while (stream ? (p = strstr(p, "data: ")) != NULL : p == resp) {
        if (stream) p += 6;
        if (stream && !strncmp(p, "[DONE]", 6)) break;
        const char *e = stream ? strstr(p, "\n\n") : p + strlen(p);
        char *ev = strndup(p, (size_t)(e - p));
        json_t *j = parse(ev), *c;
        size_t k;
        json_array_foreach(json_object_get(j, "choices"), k, c) {
            json_int_t idx = json_integer_value(json_object_get(c, "index"));
            cr_assert(idx >= 0 && (size_t)idx < n, "index %lld of %zu: %s", (long long)idx, n, ev);
            json_t *t = json_object_get(c, "text");
            if (!t) t = json_object_get(json_object_get(c, stream ? "delta" : "message"), "content");
            if (json_is_string(t)) strcat(out[idx], json_string_value(t));
        }
        json_decref(j);
        free(ev);
        p = e;
    }
}

Test(serve, n_choices_are_sampled_each_with_its_own_seed_streamed_or_not, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    const char *path[2] = {"/v1/completions", "/v1/chat/completions"};
    const char *what[2] = {"\"prompt\": \"Once upon a time\"", "\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]"};
    for (int k = 0; k < 2; k++) {
        char body[512], *one[3], *r = NULL;
        for (int i = 0; i < 3; i++) {   /* each seed alone */
            snprintf(body, sizeof body, "{%s, \"max_tokens\": 12, \"temperature\": 1.0, \"ignore_eos\": true, \"seed\": %d}", what[k], 40 + i);
            cr_assert_eq(http(&s, "POST", path[k], body, NULL, &r), 200, "%s", r);
            one[i] = completion_text(r, NULL);
            free(r);
        }
        cr_assert(strcmp(one[0], one[1]) || strcmp(one[1], one[2]), "the seeds give different texts");
        for (int st = 0; st < 2; st++) {
            snprintf(body, sizeof body, "{%s, \"max_tokens\": 12, \"temperature\": 1.0, \"ignore_eos\": true, \"seed\": 40, \"n\": 3%s}", what[k],
                     st ? ", \"stream\": true, \"stream_options\": {\"include_usage\": true}" : "");
            cr_assert_eq(http(&s, "POST", path[k], body, NULL, &r), 200, "%s", r);
            char *got[3];
            choice_texts(r, st, got, 3);
            for (int i = 0; i < 3; i++) {
                cr_assert_str_eq(got[i], one[i], "%s choice %d is seed %d's text (stream %d)", path[k], i, 40 + i, st);
                free(got[i]);
            }
            const char *u = strstr(r, "\"usage\"");
            cr_assert(u && strstr(u, "\"completion_tokens\":36"), "usage sums the choices: %s", r);
            if (st) cr_assert(strstr(r, "data: [DONE]\n\n") && strlen(strstr(r, "data: [DONE]\n\n")) == 14, "%s", r);
            free(r);
        }
        for (int i = 0; i < 3; i++) free(one[i]);
    }
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": \"a\", \"n\": 9}", NULL, 400, "invalid_request_error");
    srv_free(&s);
    /* the choices are queued together or not at all */
    srv q = {0};
    const char *args[] = {"--queue", "2", NULL};
    srv_start(&q, args);
    char *r = NULL;
    cr_assert_eq(http(&q, "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 2, \"n\": 3}", NULL, &r), 503, "%s", r);
    cr_assert(strstr(r, "its queue of 2 requests has no room for 3 choices"), "%s", r);
    free(r);
    cr_assert_eq(http(&q, "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 2, \"n\": 2}", NULL, &r), 200, "%s", r);
    free(r);
    srv_free(&q);
}

Test(serve, lists_models_and_answers_health, .timeout = 60)
{
    srv s = {0};
    srv_start(&s, NULL);
    char *r = NULL;
    cr_assert_eq(http(&s, "GET", "/health", NULL, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "\"ok\""), "%s", r);
    free(r);
    cr_assert_eq(http(&s, "GET", "/v1/models", NULL, NULL, &r), 200, "%s", r);
    json_t *j = parse(r), *d = json_object_get(j, "data");
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
    cr_assert_eq(json_array_size(d), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 0), "id")), "stories", "ids are file stems");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 0), "object")), "model");
    json_decref(j);
    free(r);
    cr_assert_eq(http(&s, "GET", "/v1/models/stories", NULL, NULL, &r), 200, "%s", r);
    free(r);
    cr_assert_eq(http(&s, "GET", "/metrics", NULL, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "jlm_generated_tokens_total{model=\"stories\"} 0"), "%s", r);
    free(r);
    cr_assert_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 3}", NULL, &r), 200);
    free(r);
    cr_assert_eq(http(&s, "GET", "/v1/models/stories/residency", NULL, NULL, &r), 200, "%s", r);
    j = parse(r);
    json_t *a0 = json_array_get(json_object_get(j, "arrays"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "source")), "engine", "%s", r);
    cr_assert(json_integer_value(json_object_get(a0, "page_ins")) >= 1, "the block pages were paged in: %s", r);
    cr_assert(json_integer_value(json_object_get(j, "resident_bytes")) > 0, "%s", r);
    json_decref(j);
    free(r);
    cr_assert_eq(http(&s, "GET", "/metrics", NULL, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "jlm_generated_tokens_total{model=\"stories\"} 3"), "%s", r);
    cr_assert(!strstr(r, "jlm_page_ins_total{model=\"stories\"} 0"), "%s", r);
    const char *fr = strstr(r, "\njlm_frames_resident{model=\"stories\"} ");
    cr_assert(fr && atoi(fr + strlen("\njlm_frames_resident{model=\"stories\"} ")) >= 1, "frames per model: %s", r);
    free(r);
    expect_error(&s, "GET", "/v1/models/nope/residency", NULL, NULL, 404, "not_found_error");
    srv_free(&s);
}

/* ---------------------------------------------------------------- errors */

static void expect_error(const srv *s, const char *method, const char *path, const char *body, const char *extra,
                         int status, const char *type)
{
    char *r = NULL;
    int got = http(s, method, path, body, extra, &r);
    cr_assert_eq(got, status, "%s %s %s: status %d, expected %d: %s", method, path, body ? body : "", got, status, r);
    json_t *j = parse(r), *e = json_object_get(j, "error");
    cr_assert(json_is_string(json_object_get(e, "message")), "an OpenAI error object: %s", r);
    cr_assert_str_eq(json_string_value(json_object_get(e, "type")), type, "%s", r);
    json_decref(j);
    free(r);
}

Test(serve, answers_bad_requests_with_openai_error_objects, .timeout = 60)
{
    srv s = {0};
    const char *args[] = {"--body-max", "4K", "-c", "16", NULL};
    srv_start(&s, args);
    const char *inv = "invalid_request_error";
    expect_error(&s, "POST", "/v1/completions",
                 "{\"prompt\": \"Once upon a time there was a little girl named Lily who loved to play in the park\"}",
                 NULL, 400, inv);   /* more tokens than -c 16 holds */
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": ", NULL, 400, inv);
    expect_error(&s, "POST", "/v1/completions", "[1, 2]", NULL, 400, inv);
    expect_error(&s, "POST", "/v1/completions", "{\"max_tokens\": 4}", NULL, 400, inv);
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": \"a\", \"temperature\": 5}", NULL, 400, inv);
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": -1}", NULL, 400, inv);
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": \"a\", \"n\": 9}", NULL, 400, inv);
    expect_error(&s, "POST", "/v1/chat/completions", "{\"messages\": []}", NULL, 400, inv);
    expect_error(&s, "POST", "/v1/chat/completions", "{\"messages\": [{\"content\": \"x\"}]}", NULL, 400, inv);
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": \"a\", \"model\": \"nope\"}", NULL, 404, "not_found_error");
    expect_error(&s, "GET", "/v1/nothing", NULL, NULL, 404, "not_found_error");
    expect_error(&s, "GET", "/v1/models/nope", NULL, NULL, 404, "not_found_error");
    expect_error(&s, "GET", "/v1/completions", NULL, NULL, 405, "server_error");
    char big[6000];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = 0;
    memcpy(big, "{\"prompt\": \"", 12);
    expect_error(&s, "POST", "/v1/completions", big, NULL, 413, "request_too_large");
    expect_error(&s, "POST", "/v1/completions", big, "-H 'Transfer-Encoding: chunked'", 413, "request_too_large");
    char *r = NULL;
    cr_assert_eq(http(&s, "GET", "/health", NULL, NULL, &r), 200, "still serving after bad requests: %s", r);
    free(r);
    cr_assert_eq(srv_stop(&s), 0);
    srv_free(&s);
}

Test(serve, requires_the_api_key_when_given_one, .timeout = 60)
{
    srv s = {0};
    const char *args[] = {"--api-key", "sekrit-123", NULL};
    srv_start(&s, args);
    const char *body = "{\"prompt\": \"Once\", \"max_tokens\": 2}";
    expect_error(&s, "POST", "/v1/completions", body, NULL, 401, "authentication_error");
    expect_error(&s, "POST", "/v1/completions", body, "-H 'Authorization: Bearer sekrit-12'", 401, "authentication_error");
    expect_error(&s, "POST", "/v1/completions", body, "-H 'Authorization: Bearer sekrit-1234'", 401, "authentication_error");
    expect_error(&s, "GET", "/v1/models", NULL, NULL, 401, "authentication_error");
    char *r = NULL;
    cr_assert_eq(http(&s, "POST", "/v1/completions", body, "-H 'Authorization: Bearer sekrit-123'", &r), 200, "%s", r);
    free(r);
    cr_assert_eq(http(&s, "GET", "/health", NULL, NULL, &r), 200, "health needs no key: %s", r);
    free(r);
    srv_free(&s);
}

/* ---------------------------------------------------------------- generation control */

Test(serve, stop_strings_cut_the_text_streamed_or_not, .timeout = 60)
{
    srv s = {0};
    srv_start(&s, NULL);
    char *ref = jlm_run(&s, "Once upon a time", 24), *r = NULL;
    const char *cut = strstr(ref, "girl");
    cr_assert(cut, "the reference continuation mentions a girl: '%s'", ref);
    size_t keep = (size_t)(cut - ref);
    const char *body = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0, \"stop\": [\"zzz\", \"girl\"]}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
    const char *fin;
    char *t = completion_text(r, &fin);
    cr_assert_eq(strlen(t), keep, "'%s' is the reference up to the stop string", t);
    cr_assert(!strncmp(t, ref, keep));
    cr_assert_str_eq(fin, "stop");
    free(t); free(r);
    body = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0, \"stop\": \"girl\", \"stream\": true}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
    t = stream_text(r, &fin);
    cr_assert_eq(strlen(t), keep, "streamed '%s' stops before the stop string", t);
    cr_assert_str_eq(fin, "stop");
    cr_assert(!strstr(r, "gir"), "no prefix of the stop string was sent: %s", r);
    free(t); free(r); free(ref);
    srv_free(&s);
}

/* n greedy requests at once (request i: prompts[i], 32 + 4i tokens, odd
 * ones streamed); each must return exactly alone[i]. */
static void expect_concurrent(const srv *s, const char *const *prompts, int n, char *const *alone)
{
    char cmd[16384];
    int k = snprintf(cmd, sizeof cmd, "(");
    for (int i = 0; i < n; i++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "curl -s --max-time 60 -o %s/c%d http://127.0.0.1:%d/v1/completions -d "
                      "'{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0%s}' & ",
                      s->dir, i, s->port, prompts[i], 32 + 4 * i, i % 2 ? ", \"stream\": true" : "");
    snprintf(cmd + k, sizeof cmd - (size_t)k, "wait)");
    cr_assert_eq(tu_run(cmd, NULL), 0);
    for (int i = 0; i < n; i++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/c%d", s->dir, i);
        size_t rl = 0;
        unsigned char *raw = tu_read_file(p, &rl);
        cr_assert(raw, "response %d", i);
        char *r = strndup((const char *)raw, rl);
        free(raw);
        char *t = i % 2 ? stream_text(r, NULL) : completion_text(r, NULL);
        cr_assert_str_eq(t, alone[i], "request %d alongside %d others equals jlm run alone", i, n - 1);
        free(t); free(r);
    }
}

static const char *const PROMPTS8[8] = {"Once upon a time", "The dog", "One day, Tom", "She was happy",
                                        "Lily saw a bird", "The sun", "Ben and Mia", "A big red ball"};

/* 8 greedy requests at once on --parallel 8: decoded together in one batch
 * per step, each must return exactly what jlm run gives it alone. */
Test(serve, concurrent_requests_each_get_what_they_get_alone, .timeout = 120)
{
    enum { N = 8 };
    srv s = {0};
    const char *args[] = {"--parallel", "8", NULL};
    srv_start(&s, args);
    char *alone[N];
    for (int i = 0; i < N; i++) alone[i] = jlm_run(&s, PROMPTS8[i], 32 + 4 * i);
    expect_concurrent(&s, PROMPTS8, N, alone);
    for (int i = 0; i < N; i++) free(alone[i]);
    char *r = NULL;
    cr_assert_eq(http(&s, "GET", "/metrics", NULL, NULL, &r), 200);
    cr_assert(strstr(r, "jlm_requests_done_total{model=\"stories\"} 8"), "%s", r);
    free(r);
    srv_free(&s);
}

/* jlm serve --parallel 4 --backend vulkan (JLM_VK_DEVICE picks lavapipe):
 * four greedy requests at once, each slot's KV cache on the device and
 * their steps batched on whole blocks, each return what jlm run gives it
 * alone on the CPU; the same four again reuse the prefix cache (a slot's
 * positions read back from the device, then written up into the slot that
 * reuses them) and return the same. Skips without a Vulkan device. */
Test(serve, parallel_slots_on_vulkan_whole_blocks_get_what_the_cpu_gives_alone, .timeout = 180)
{
    enum { N = 4 };
    srv s = {0};
    s.dir = tu_tmpdir();
    s.model = convert_to("stories260K.gguf", s.dir, "stories.jlm");
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s -p 'The' -n 1 -t 1 --backend vulkan --device 0 2>&1", tu_jlm(), s.model);
    if (tu_run(cmd, &o)) {
        cr_log_info("no vulkan device: %s", o);
        free(o);
        srv_free(&s);
        cr_skip_test("vulkan: no device");
    }
    free(o);
    const char *args[] = {"--parallel", "4", "--backend", "vulkan", "--device", "0", "--gpu-layers", "all", NULL};
    srv_start(&s, args);
    char *alone[N];
    static const char *const LONG[N] = {  /* over 16 tokens: the prefix cache shares whole 16-token blocks */
        "Once upon a time there was a little girl named Lily. She liked to play in the park with her friends",
        "The dog was very happy because it was a sunny day and he could run in the big green garden",
        "One day, Tom went to the shop with his mom to buy some red apples and a big cake for his sister",
        "She was happy to see the little bird sing on the tree next to her house every morning before school"};
    for (int i = 0; i < N; i++) alone[i] = jlm_run(&s, LONG[i], 32 + 4 * i);
    for (int round = 0; round < 2; round++)
        expect_concurrent(&s, LONG, N, alone);
    for (int i = 0; i < N; i++) free(alone[i]);
    char *r = NULL;
    cr_assert_eq(http(&s, "GET", "/metrics", NULL, NULL, &r), 200);
    const char *c = strstr(r, "jlm_prompt_cached_tokens_total{model=\"stories\"} ");
    cr_assert(c && atoll(strchr(c, ' ') + 1) > 0, "the second round reused the prefix cache: %s", r);
    free(r);
    srv_free(&s);
}

/* ---------------------------------------------------------------- disconnects and drain */

/* rcvbuf > 0: that receive buffer, set before connecting so the window
 * offered to the server stays that small. */
static int tcp_connect_buf(int port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && rcvbuf > 0)
        cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect to the server");
    return fd;
}

static int tcp_connect(int port)
{
    return tcp_connect_buf(port, 0);
}

/* Sends a streamed generation of n_tokens (ignore_eos) to model (NULL: the
 * server's one) and waits for its first event. rcvbuf > 0: the client's
 * receive buffer, so that a stream longer than the socket buffers can hold
 * stays in flight, whatever the generation's speed, until the caller reads. */
static int open_stream(const srv *s, const char *model, int n_tokens, int rcvbuf)
{
    int fd = tcp_connect_buf(s->port, rcvbuf);
    char body[256], req[512], mf[96] = "";
    if (model)
        snprintf(mf, sizeof mf, "\"model\": \"%s\", ", model);
    int nb = snprintf(body, sizeof body, "{%s\"prompt\": \"Once\", \"max_tokens\": %d, \"ignore_eos\": true, \"stream\": true}",
                      mf, n_tokens);
    int nr = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s", nb, body);
    cr_assert_eq(write(fd, req, (size_t)nr), nr);
    char buf[4096];
    size_t got = 0;
    for (int i = 0; i < 200 && got < sizeof buf - 1; i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        cr_assert(r > 0, "the stream is open");
        got += (size_t)r;
        buf[got] = 0;
        if (strstr(buf, "data: {")) return fd;
    }
    cr_assert_fail("no first event within 20 s: %s", buf);
    return -1;
}

/* A long streamed generation on the server's model, its first event read. */
static int start_long_stream(const srv *s, int n_tokens)
{
    return open_stream(s, NULL, n_tokens, 0);
}

/* Polls /metrics until it holds `line` (at most 20 s). */
static int metrics_reach(const srv *s, const char *line)
{
    for (int i = 0; i < 200; i++) {
        char *r = NULL;
        http(s, "GET", "/metrics", NULL, NULL, &r);
        int ok = strstr(r, line) != NULL;
        free(r);
        if (ok) return 1;
        usleep(100000);
    }
    return 0;
}

Test(serve, a_client_that_disconnects_cancels_its_generation, .timeout = 120)
{
    srv s = {0};
    const char *args[] = {"-c", "4096", NULL};
    srv_start(&s, args);
    int fd = start_long_stream(&s, 4000);
    close(fd);
    cr_assert(metrics_reach(&s, "jlm_requests_cancelled_total{model=\"stories\"} 1"), "the cancel is counted");
    cr_assert(metrics_reach(&s, "jlm_requests_running{model=\"stories\"} 0"), "the slot is free again");
    char *r = NULL;
    cr_assert_eq(http(&s, "GET", "/metrics", NULL, NULL, &r), 200);
    const char *g = strstr(r, "jlm_generated_tokens_total{model=\"stories\"} ");
    cr_assert(g && atoi(g + 43) < 4000, "generation stopped early: %s", r);
    free(r);
    cr_assert_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 4}", NULL, &r), 200,
                 "the next request is served: %s", r);
    free(r);
    srv_free(&s);
}

Test(serve, a_full_queue_answers_503, .timeout = 120)
{
    srv s = {0};
    const char *args[] = {"--parallel", "1", "--queue", "1", "-c", "4096", NULL};
    srv_start(&s, args);
    int running = start_long_stream(&s, 4000);   /* holds the only slot */
    int queued = tcp_connect(s.port);            /* waits in the queue of one */
    const char *body = "{\"prompt\": \"Once\", \"max_tokens\": 4000, \"ignore_eos\": true, \"stream\": true}";
    char req[512];
    int nr = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                      strlen(body), body);
    cr_assert_eq(write(queued, req, (size_t)nr), nr);
    cr_assert(metrics_reach(&s, "jlm_queue_length{model=\"stories\"} 1"), "the second request waits");
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 2}", NULL, 503, "server_busy");
    close(queued);
    close(running);
    cr_assert(metrics_reach(&s, "jlm_requests_running{model=\"stories\"} 0"), "both leave once their clients are gone");
    srv_free(&s);
}

Test(serve, sigterm_finishes_requests_in_flight_refuses_new_ones_and_exits_0, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    int fd = start_long_stream(&s, 1200);
    kill(s.pid, SIGTERM);
    /* The signal is handled at the server's next turn: a request that arrives
     * before it is still served (under load that can take a while), so ask
     * until the drain answers, for at most 10 s. */
    char *r = NULL;
    int st = 0;
    for (int i = 0; i < 200 && st != 503; i++) {
        if (i)
            usleep(50000);
        free(r);
        r = NULL;
        st = http(&s, "POST", "/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 4}", NULL, &r);
        cr_assert(st == 503 || st == 200, "a request around SIGTERM gets 200 or 503: %d %s", st, r);
    }
    cr_assert_eq(st, 503, "a new request while draining gets 503: %d %s", st, r);
    free(r);
    /* the stream in flight runs to its end */
    size_t cap = 4 << 20, got = 0;
    char *buf = malloc(cap);
    time_t t0 = time(NULL);
    while (got < cap - 1 && time(NULL) - t0 < 60) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
        buf[got] = 0;
        if (strstr(buf + (got > 64 ? got - 64 : 0), "data: [DONE]")) break;
    }
    buf[got] = 0;
    cr_assert(strstr(buf, "\"finish_reason\":\"length\""), "the drained stream finished whole");
    cr_assert(strstr(buf, "data: [DONE]"), "and ended with [DONE]");
    free(buf);
    close(fd);
    int code = -1;
    for (int i = 0; i < 600 && code < 0; i++) {
        int w;
        if (waitpid(s.pid, &w, WNOHANG) == s.pid) code = WIFEXITED(w) ? WEXITSTATUS(w) : 128 + WTERMSIG(w);
        else usleep(50000);
    }
    cr_assert_eq(code, 0, "the server exits 0 after draining");
    s.pid = 0;
    srv_free(&s);
}

/* ---------------------------------------------------------------- request parsing */

Test(serve_api, parses_every_supported_field)
{
    const char *b = "{\"model\": \"m\", \"prompt\": [\"hi\"], \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, "
                    "\"top_k\": 5, \"min_p\": 0.1, \"seed\": 42, \"stop\": [\"a\", \"b\"], \"stream\": true, "
                    "\"presence_penalty\": 1, \"frequency_penalty\": -0.5, \"stream_options\": {\"include_usage\": true}, "
                    "\"user\": \"ignored\", \"logprobs\": null, \"n\": 1}";
    jlm_srv_req r;
    jlm_err err = {0};
    cr_assert_eq(jlm_srv_req_parse(b, strlen(b), JLM_SRV_COMPLETION, &r, &err), 0, "%s", err.msg);
    cr_assert_str_eq(r.model, "m");
    cr_assert_str_eq(r.prompt, "hi");
    cr_assert_eq(r.max_tokens, 7);
    cr_assert_float_eq(r.samp.temp, 0.5f, 1e-7);
    cr_assert_float_eq(r.samp.top_p, 0.9f, 1e-7);
    cr_assert_eq(r.samp.top_k, 5);
    cr_assert_float_eq(r.samp.min_p, 0.1f, 1e-7);
    cr_assert_float_eq(r.samp.presence_penalty, 1.0f, 1e-7);
    cr_assert_float_eq(r.samp.freq_penalty, -0.5f, 1e-7);
    cr_assert(r.seeded && r.samp.seed == 42);
    cr_assert_eq(r.n_stop, 2);
    cr_assert(r.stream && r.include_usage);
    jlm_srv_req_free(&r);
}

Test(serve_api, refuses_wrong_types_and_ranges_naming_the_field)
{
    static const struct { const char *body, *field; } cases[] = {
        {"{\"prompt\": \"a\", \"temperature\": \"hot\"}", "temperature"},
        {"{\"prompt\": \"a\", \"top_p\": 1.5}", "top_p"},
        {"{\"prompt\": \"a\", \"repeat_penalty\": 0}", "repeat_penalty"},
        {"{\"prompt\": \"a\", \"repeat_penalty\": 1e-50}", "repeat_penalty"},
        {"{\"prompt\": \"a\", \"top_k\": 1.5}", "top_k"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1e9}", "max_tokens"},
        {"{\"prompt\": \"a\", \"stop\": [\"\"]}", "stop"},
        {"{\"prompt\": \"a\", \"stop\": [\"1\", \"2\", \"3\", \"4\", \"5\"]}", "stop"},
        {"{\"prompt\": \"a\", \"stream\": 1}", "stream"},
        {"{\"prompt\": \"a\", \"model\": 3}", "model"},
        {"{\"prompt\": [\"a\", \"b\"]}", "prompt"},
        {"{\"prompt\": [1, 2]}", "prompt"},
        {"{\"prompt\": \"a\", \"logprobs\": 6}", "logprobs"},
        {"{\"prompt\": \"a\", \"logprobs\": true}", "logprobs"},
        {"{\"prompt\": \"a\\u0000b\"}", "u0000"},
        {"{\"prompt\": \"a\", \"prompt\": \"b\"}", "duplicate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        jlm_srv_req r;
        jlm_err err = {0};
        cr_assert_neq(jlm_srv_req_parse(cases[i].body, strlen(cases[i].body), JLM_SRV_COMPLETION, &r, &err), 0,
                      "refused: %s", cases[i].body);
        cr_assert(strstr(err.msg, cases[i].field), "'%s' named in '%s'", cases[i].field, err.msg);
    }
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_audio\"}]}]}";
    jlm_srv_req r;
    jlm_err err = {0};
    cr_assert_eq(jlm_srv_req_parse(chat, strlen(chat), JLM_SRV_CHAT, &r, &err), JLM_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "messages[0].content[0]"), "%s", err.msg);
    /* image parts: a data: URI of base64, one per request */
    static const char *const bad[][2] = {
        {"{\"type\": \"image_url\"}", "'messages[0].content[0].image_url': expected an object with a string 'url'"},
        {"{\"type\": \"image_url\", \"image_url\": {\"url\": \"http://x/a.png\"}}", "only data: URIs"},
        {"{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,QUJD!\"}}", "not valid base64"},
        {"{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,QUJD\"}}, "
         "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,QUJD\"}}",
         "'messages[0].content[1]': only one image"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": [%s]}]}", bad[i][0]);
        cr_assert_neq(jlm_srv_req_parse(body, strlen(body), JLM_SRV_CHAT, &r, &err), 0, "%s", body);
        cr_assert(strstr(err.msg, bad[i][1]), "%s: %s", body, err.msg);
    }
    /* the bytes decoded, padding or not */
    static const char *const good[][2] = {{"QUJD", "ABC"}, {"QUI=", "AB"}, {"QUI", "AB"}, {"QQ==", "A"}};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
                 "\"image_url\": {\"url\": \"data:image/png;base64,%s\"}}]}]}", good[i][0]);
        cr_assert_eq(jlm_srv_req_parse(body, strlen(body), JLM_SRV_CHAT, &r, &err), 0, "%s: %s", body, err.msg);
        cr_assert_eq(r.image_len, strlen(good[i][1]));
        cr_assert(!memcmp(r.image, good[i][1], r.image_len));
        cr_assert_str_eq(r.image_what, "messages[0].content[0]");
        jlm_srv_req_free(&r);
    }
}

Test(serve_api, stop_scan_holds_back_what_could_become_a_stop_string)
{
    jlm_srv_req r = {.n_stop = 1};
    r.stop[0] = "END";
    int hit;
    cr_assert_eq(jlm_srv_stop_scan(&r, "abcE", 4, 0, &hit), 3);
    cr_assert_eq(hit, 0);
    cr_assert_eq(jlm_srv_stop_scan(&r, "abcEN", 5, 0, &hit), 3);
    cr_assert_eq(jlm_srv_stop_scan(&r, "abcENx", 6, 0, &hit), 6, "a broken prefix is released");
    cr_assert_eq(jlm_srv_stop_scan(&r, "abENDx", 6, 0, &hit), 2);
    cr_assert_eq(hit, 1);
    cr_assert_eq(jlm_srv_stop_scan(&r, "abcE", 4, 1, &hit), 4, "at the end nothing is held");
    r.n_stop = 2;   /* *hit names the stop string that comes first in the text */
    r.stop[1] = "bc";
    cr_assert_eq(jlm_srv_stop_scan(&r, "abcEND", 6, 1, &hit), 1);
    cr_assert_eq(hit, 2);
    cr_assert_eq(jlm_srv_stop_scan(&r, "aENDbc", 6, 1, &hit), 1);
    cr_assert_eq(hit, 1);
    r.n_stop = 1;
    r.stop[0] = "\xC3\xA9!";   /* held-back bytes never split a character */
    cr_assert_eq(jlm_srv_stop_scan(&r, "a\xC3\xA9", 3, 0, &hit), 1);
    r.n_stop = 0;
    cr_assert_eq(jlm_srv_stop_scan(&r, "a\xC3", 2, 0, &hit), 2, "without stop strings everything goes");
}

Test(serve_api, compares_keys_by_content_and_length)
{
    cr_assert(jlm_srv_key_equal("abc", 3, "abc", 3));
    cr_assert(!jlm_srv_key_equal("abc", 3, "abd", 3));
    cr_assert(!jlm_srv_key_equal("abc", 3, "abcd", 4));
    cr_assert(!jlm_srv_key_equal("", 0, "a", 1));
}

Test(serve_api, replaces_invalid_utf8_in_generated_text)
{
    jlm_srv_ident id = {.id = "cmpl-1", .model = "m", .kind = JLM_SRV_COMPLETION};
    jlm_srv_result res = {.finish_reason = "stop", .prompt_tokens = 1, .completion_tokens = 2};
    json_t *j = jlm_srv_json_completion(&id, "a\xFF" "b\xC3", 4, &res);
    cr_assert(j, "built despite invalid bytes");
    const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    cr_assert_str_eq(t, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
    json_decref(j);
}

/* ---------------------------------------------------------------- batched sequences */

/* Greedy decode of `steps` tokens after prompt p on the engine's own cache;
 * logits of every step in ref (steps, nv). */
static void decode_alone(jlm_engine *e, const int32_t *p, uint32_t np, int steps, float *ref)
{
    jlm_err err = {0};
    uint32_t nv = jlm_engine_n_vocab(e);
    jlm_engine_rewind(e, 0);
    cr_assert_eq(jlm_engine_eval(e, p, np, ref, &err), 0, "%s", err.msg);
    for (int s = 1; s < steps; s++) {
        int32_t id = jlm_samp_argmax(ref + (size_t)(s - 1) * nv, nv);
        cr_assert_eq(jlm_engine_eval(e, &id, 1, ref + (size_t)s * nv, &err), 0, "%s", err.msg);
    }
}

/* Four sequences with different prompts decode together, the fourth joining
 * two steps late; each step's logits must equal the sequence's alone, bit for bit. */
static void check_batch_equals_alone(const char *gguf)
{
    enum { NS = 4, STEPS = 8, LATE = 2 };
    char *dir = tu_tmpdir();
    char *m = convert_to(gguf, dir, "m.jlm");
    jlm_engine_opts eo = {.n_threads = 2, .n_ctx = 128, .direct = 0, .quiet = 1};
    jlm_engine *e;
    jlm_err err = {0};
    cr_assert_eq(jlm_engine_open(m, &eo, &e, &err), 0, "%s", err.msg);
    uint32_t nv = jlm_engine_n_vocab(e);
    static const int32_t prompts[NS][4] = {{1, 5, 9, 13}, {1, 100, 7, 3}, {1, 42, 42, 42}, {1, 77, 8, 200}};
    float *ref = malloc((size_t)NS * STEPS * nv * sizeof *ref), *got = malloc((size_t)NS * nv * sizeof *got);
    for (int s = 0; s < NS; s++)
        decode_alone(e, prompts[s], 4, STEPS, ref + (size_t)s * STEPS * nv);
    jlm_engine_seq *seq[NS];
    int step[NS] = {0};   /* logits rows already produced per sequence */
    int32_t next[NS];
    for (int s = 0; s < NS; s++) {
        cr_assert_eq(jlm_engine_seq_create(e, &seq[s], &err), 0, "%s", err.msg);
        if (s == NS - 1) continue;   /* joins late */
        cr_assert_eq(jlm_engine_eval_seq(e, seq[s], prompts[s], 4, got, &err), 0, "%s", err.msg);
        cr_assert(!memcmp(got, ref + (size_t)s * STEPS * nv, nv * sizeof *got), "%s: prompt logits of seq %d", gguf, s);
        next[s] = jlm_samp_argmax(got, nv);
        step[s] = 1;
    }
    for (int round = 0; round < STEPS + LATE; round++) {
        if (round == LATE) {
            int s = NS - 1;
            cr_assert_eq(jlm_engine_eval_seq(e, seq[s], prompts[s], 4, got, &err), 0, "%s", err.msg);
            next[s] = jlm_samp_argmax(got, nv);
            step[s] = 1;
        }
        jlm_engine_seq *bs[NS];
        int32_t bt[NS];
        int who[NS];
        uint32_t n = 0;
        for (int s = 0; s < NS; s++)
            if (step[s] > 0 && step[s] < STEPS) { bs[n] = seq[s]; bt[n] = next[s]; who[n++] = s; }
        if (!n) break;
        cr_assert_eq(jlm_engine_eval_batch(e, bs, bt, n, got, &err), 0, "%s", err.msg);
        for (uint32_t t = 0; t < n; t++) {
            int s = who[t];
            cr_assert(!memcmp(got + (size_t)t * nv, ref + ((size_t)s * STEPS + (size_t)step[s]) * nv, nv * sizeof *got),
                      "%s: seq %d step %d in a batch of %u differs from alone", gguf, s, step[s], n);
            next[s] = jlm_samp_argmax(got + (size_t)t * nv, nv);
            step[s]++;
        }
    }
    for (int s = 0; s < NS; s++) {
        cr_assert_eq(step[s], STEPS, "seq %d ran every step", s);
        jlm_engine_seq_destroy(seq[s]);
    }
    jlm_engine_close(e);
    free(ref); free(got); free(m);
    tu_rmrf(dir);
    free(dir);
}

Test(engine_batch, each_sequence_gets_the_logits_it_gets_alone_dense, .timeout = 60)
{
    check_batch_equals_alone("stories260K.gguf");
    check_batch_equals_alone("synth-llama-256.Q4_K_M.gguf");
}

Test(engine_batch, each_sequence_gets_the_logits_it_gets_alone_moe_and_swa, .timeout = 60)
{
    check_batch_equals_alone("synth-qwen3moe-256.Q4_K_M.gguf");
    check_batch_equals_alone("synth-gemma3-256.Q8_0.gguf");
}

/* A prefix of K positions loaded from a saved one of N (K not on a key
 * tile's edge) into a sequence holding other tokens, then the rest of the
 * prompt evaluated: the logits equal evaluating the whole prompt, bit for bit. */
static void check_kv_prefix_load(const char *gguf, const char *kv)
{
    enum { NP = 100, N = 80, K = 37 };
    char *dir = tu_tmpdir();
    char *m = convert_to(gguf, dir, "m.jlm");
    jlm_engine_opts eo = {.n_threads = 2, .n_ctx = 128, .direct = 0, .quiet = 1, .kv = kv};
    jlm_engine *e;
    jlm_err err = {0};
    cr_assert_eq(jlm_engine_open(m, &eo, &e, &err), 0, "%s", err.msg);
    uint32_t nv = jlm_engine_n_vocab(e);
    int32_t p[NP], other[NP];
    for (int i = 0; i < NP; i++) { p[i] = (i * 7 + 3) % 250 + 1; other[i] = (i * 13 + 5) % 250 + 1; }
    float *ref = malloc(nv * sizeof *ref), *got = malloc(nv * sizeof *got);
    jlm_engine_seq *a, *b;
    cr_assert_eq(jlm_engine_seq_create(e, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_seq_create(e, &b, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_eval_seq(e, a, p, NP, ref, &err), 0, "%s", err.msg);
    void *buf = malloc(jlm_engine_kv_bytes(e, N));
    cr_assert_eq(jlm_engine_kv_save(e, a, N, buf, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_eval_seq(e, b, other, NP, got, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_kv_load(e, b, buf, N, K, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_seq_n_past(b), K);
    cr_assert_eq(jlm_engine_eval_seq(e, b, p + K, NP - K, got, &err), 0, "%s", err.msg);
    cr_assert(!memcmp(got, ref, nv * sizeof *got), "%s (kv %s): logits after a loaded prefix differ", gguf,
              kv ? kv : "f32");
    jlm_engine_seq_destroy(a);
    jlm_engine_seq_destroy(b);
    jlm_engine_close(e);
    free(buf); free(ref); free(got); free(m);
    tu_rmrf(dir);
    free(dir);
}

Test(engine_batch, a_loaded_kv_prefix_gives_the_logits_of_evaluating_it, .timeout = 60)
{
    check_kv_prefix_load("stories260K.gguf", NULL);
    check_kv_prefix_load("synth-llama-256.Q4_K_M.gguf", "f16");
    check_kv_prefix_load("synth-qwen3moe-256.Q4_K_M.gguf", NULL);
    check_kv_prefix_load("synth-gemma3-256.Q8_0.gguf", NULL);
}

Test(engine_batch, refuses_a_repeated_sequence_and_a_full_context)
{
    char *dir = tu_tmpdir();
    char *m = convert_to("stories260K.gguf", dir, "m.jlm");
    jlm_engine_opts eo = {.n_threads = 1, .n_ctx = 4, .direct = 0, .quiet = 1};
    jlm_engine *e;
    jlm_err err = {0};
    cr_assert_eq(jlm_engine_open(m, &eo, &e, &err), 0, "%s", err.msg);
    jlm_engine_seq *s;
    cr_assert_eq(jlm_engine_seq_create(e, &s, &err), 0);
    float *l = malloc(2 * jlm_engine_n_vocab(e) * sizeof *l);
    jlm_engine_seq *two[2] = {s, s};
    int32_t ids[4] = {1, 2, 3, 4};
    cr_assert_eq(jlm_engine_eval_batch(e, two, ids, 2, l, &err), JLM_EINVAL);
    cr_assert_eq(jlm_engine_eval_seq(e, s, ids, 4, l, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_eval_batch(e, two, ids, 1, l, &err), JLM_ERANGE, "the context is full");
    cr_assert_eq(jlm_engine_seq_n_past(s), 4);
    free(l);
    jlm_engine_seq_destroy(s);
    jlm_engine_close(e);
    free(m);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- several models */

Test(serve, serves_every_model_of_a_folder_by_file_stem, .timeout = 120)
{
    srv s = {0};
    s.dir = tu_tmpdir();
    s.model = convert_to("stories260K.gguf", s.dir, "stories.jlm");
    char *m2 = convert_to("synth-llama-256.Q4_K_M.gguf", s.dir, "synth.jlm");
    /* a model given twice (by path and through the folder) is refused */
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s serve %s --models %s --port 0", tu_jlm(), s.model, s.dir);
    cr_assert_eq(tu_run(cmd, &o), 1, "a duplicate id is refused: %s", o);
    cr_assert(strstr(o, "served twice"), "%s", o);
    free(o);
    /* the folder alone: both models */
    char *keep = s.model;
    s.model = NULL;
    /* --budget 1 is raised to each engine's minimum working set (one block
     * frame): every token pages blocks out and in again, answers unchanged */
    const char *args[] = {"--models", s.dir, "--budget", "1", NULL};
    srv_start(&s, args);
    s.model = keep;
    char *r = NULL;
    cr_assert_eq(http(&s, "GET", "/v1/models", NULL, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "\"id\":\"stories\"") && strstr(r, "\"id\":\"synth\""), "%s", r);
    free(r);
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": \"a\"}", NULL, 400, "invalid_request_error");
    const char *body = "{\"model\": \"stories\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 0}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
    char *t = completion_text(r, NULL), *ref = jlm_run(&s, "Once upon a time", 16);
    cr_assert_str_eq(t, ref, "the stories model answers as jlm run");
    free(t); free(r); free(ref);
    body = "{\"model\": \"synth\", \"prompt\": \"t1 t2\", \"max_tokens\": 8, \"temperature\": 0}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
    t = completion_text(r, NULL);
    snprintf(cmd, sizeof cmd, "%s run %s -p 't1 t2' -n 8 --temp 0 -t 1 2>/dev/null", tu_jlm(), m2);
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    /* random weights emit lone UTF-8 lead bytes, which JSON carries as U+FFFD:
     * compare the ASCII of both (stories above compares every byte) */
    char *a = t, *b = ref;
    for (char *p = t; *p; p++) if (!((unsigned char)*p & 0x80)) *a++ = *p;
    for (char *p = ref; *p; p++) if (!((unsigned char)*p & 0x80)) *b++ = *p;
    *a = *b = 0;
    cr_assert_str_eq(t, ref, "the synth model answers as jlm run");
    cr_assert(strstr(r, "\"completion_tokens\":8"), "%s", r);
    free(t); free(r); free(ref); free(m2);
    cr_assert_eq(http(&s, "GET", "/metrics", NULL, NULL, &r), 200);
    cr_assert(!strstr(r, "jlm_page_evictions_total{model=\"stories\"} 0\n"), "stories pages were evicted: %s", r);
    cr_assert(!strstr(r, "jlm_page_evictions_total{model=\"synth\"} 0\n"), "synth pages were evicted: %s", r);
    free(r);
    srv_free(&s);
}

/* ---------------------------------------------------------------- logprobs */

/* The first generated token's log-probability equals log-softmax of the
 * logits `jlm run --logits` writes for the same prompt; the alternatives are
 * the most likely tokens in order. */
Test(serve, logprobs_match_the_log_softmax_of_jlm_run_logits, .timeout = 60)
{
    srv s = {0};
    srv_start(&s, NULL);
    char cmd[2048], lf[1100], *o = NULL, *r = NULL;
    snprintf(lf, sizeof lf, "%s/logits.json", s.dir);
    snprintf(cmd, sizeof cmd, "%s run %s -p 'Once upon' -n 1 --temp 0 -t 1 --logits %s", tu_jlm(), s.model, lf);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    free(o);
    size_t n = 0;
    unsigned char *raw = tu_read_file(lf, &n);
    char *txt = strndup((const char *)raw, n);
    json_t *lg = parse(txt);
    free(raw); free(txt);
    size_t nv = json_array_size(lg), best = 0, second = 0;
    double mx = -INFINITY, sum = 0;
    for (size_t i = 0; i < nv; i++) mx = fmax(mx, json_number_value(json_array_get(lg, i)));
    for (size_t i = 0; i < nv; i++) sum += exp(json_number_value(json_array_get(lg, i)) - mx);
    for (size_t i = 1; i < nv; i++) {
        double v = json_number_value(json_array_get(lg, i));
        if (v > json_number_value(json_array_get(lg, best))) { second = best; best = i; }
        else if (second == best || v > json_number_value(json_array_get(lg, second))) second = i;
    }
    double want0 = json_number_value(json_array_get(lg, best)) - mx - log(sum);
    double want1 = json_number_value(json_array_get(lg, second)) - mx - log(sum);
    json_decref(lg);
    const char *body = "{\"prompt\": \"Once upon\", \"max_tokens\": 3, \"temperature\": 0, \"logprobs\": 2}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
    json_t *j = parse(r), *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *tl = json_object_get(lp, "token_logprobs"), *top = json_array_get(json_object_get(lp, "top_logprobs"), 0);
    cr_assert_eq(json_array_size(tl), 3, "one entry per token: %s", r);
    double got = json_number_value(json_array_get(tl, 0));
    cr_assert(fabs(got - want0) < 1e-5, "logprob %.9g, log-softmax of jlm run's logits %.9g", got, want0);
    cr_assert_eq(json_object_size(top), 2, "%s", r);
    const char *k;
    json_t *v;
    double lo = 0;
    json_object_foreach(top, k, v) lo = fmin(lo, json_number_value(v));
    cr_assert(fabs(lo - want1) < 1e-5, "second alternative %.9g, expected %.9g", lo, want1);
    json_decref(j);
    free(r);
    const char *cb = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, "
                     "\"temperature\": 0, \"logprobs\": true, \"top_logprobs\": 3, \"stream\": true}";
    cr_assert_eq(http(&s, "POST", "/v1/chat/completions", cb, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "\"logprobs\":{\"content\":[{\"token\":"), "streamed chat chunks carry logprobs: %s", r);
    free(r);
    expect_error(&s, "POST", "/v1/chat/completions",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_logprobs\": 2}", NULL, 400,
                 "invalid_request_error");
    srv_free(&s);
}

/* ---------------------------------------------------------------- one budget across models */

/* The value of a metric line "NAME VALUE" (name with its labels); -1 when absent. */
static double metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; (p = strstr(p, name)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

static char *get_metrics(const srv *s)
{
    char *r = NULL;
    cr_assert_eq(http(s, "GET", "/metrics", NULL, NULL, &r), 200, "%s", r);
    return r;
}

/* Bytes of every page of a container (what holding it all takes). */
static uint64_t all_page_bytes(const char *path)
{
    jlm_engine *e;
    jlm_err err = {0};
    jlm_engine_opts o = {.quiet = 1};
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    const jlm_header *h = &jlm_engine_model(e)->hdr;
    uint64_t b = h->page_size * h->n_blocks + h->vis_page_size * h->n_vis_blocks + h->exp_page_size * h->n_exp_pages;
    jlm_engine_close(e);
    return b;
}

static char *ascii_only(char *t)
{
    char *a = t;
    for (char *p = t; *p; p++) if (!((unsigned char)*p & 0x80)) *a++ = *p;
    *a = 0;
    return t;
}

/* Two models under one --budget of 3/4 of their pages together: the model a
 * request needs takes the frames of the least recently used one (its budget
 * is lowered, its pages evicted), never more than the budget is resident,
 * and both keep answering exactly as jlm run. */
Test(serve, one_budget_across_models_takes_frames_from_the_least_recently_used, .timeout = 120)
{
    srv s = {0};
    s.dir = tu_tmpdir();
    s.model = convert_to("stories260K.gguf", s.dir, "stories.jlm");
    char *m2 = convert_to("synth-llama-256.Q4_K_M.gguf", s.dir, "synth.jlm");
    uint64_t a = all_page_bytes(s.model), b = all_page_bytes(m2), total = (a + b) / 4 * 3;
    char bud[32];
    snprintf(bud, sizeof bud, "%llu", (unsigned long long)total);
    char *keep = s.model;
    s.model = NULL;
    const char *args[] = {"--models", s.dir, "--budget", bud, "--rescan", "0", NULL};
    srv_start(&s, args);
    s.model = keep;
    char *r = NULL, *ref = jlm_run(&s, "Once upon a time", 24), cmd[2048], *ref2 = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s -p 't1 t2' -n 8 --temp 0 -t 1 2>/dev/null", tu_jlm(), m2);
    cr_assert_eq(tu_run(cmd, &ref2), 0, "%s", ref2);
    ascii_only(ref2);
    const char *b1 = "{\"model\": \"stories\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0}";
    const char *b2 = "{\"model\": \"synth\", \"prompt\": \"t1 t2\", \"max_tokens\": 8, \"temperature\": 0}";

    cr_assert_eq(http(&s, "POST", "/v1/completions", b1, NULL, &r), 200, "%s", r);
    char *t = completion_text(r, NULL);
    cr_assert_str_eq(t, ref, "stories answers as jlm run");
    free(t); free(r);
    char *m = get_metrics(&s);
    cr_assert_eq(metric(m, "jlm_budget_total_bytes"), (double)total, "%s", m);
    cr_assert(metric(m, "jlm_resident_total_bytes") <= (double)total, "%s", m);
    double st_in = metric(m, "jlm_bytes_read_total{model=\"stories\"}");
    double st_res = metric(m, "jlm_resident_bytes{model=\"stories\"}");
    cr_assert(st_res > 0, "%s", m);
    free(m);

    /* synth needs frames: stories (idle, least recently used) gives them */
    cr_assert_eq(http(&s, "POST", "/v1/completions", b2, NULL, &r), 200, "%s", r);
    t = ascii_only(completion_text(r, NULL));
    cr_assert_str_eq(t, ref2, "synth answers as jlm run");
    free(t); free(r);
    m = get_metrics(&s);
    cr_assert(metric(m, "jlm_budget_reclaims_total{model=\"stories\"}") >= 1, "stories' frames were taken: %s", m);
    cr_assert(metric(m, "jlm_budget_reclaimed_bytes_total{model=\"stories\"}") > 0, "%s", m);
    /* evicted, or trimmed (partial frames: a page may keep some chunks) */
    cr_assert(metric(m, "jlm_resident_bytes{model=\"stories\"}") < st_res, "stories holds less: %s", m);
    cr_assert(metric(m, "jlm_resident_total_bytes") <= (double)total, "never more than the budget: %s", m);
    cr_assert(metric(m, "jlm_budget_granted_bytes") <= (double)total, "%s", m);
    free(m);

    /* stories again: it takes synth's frames and pages its own in again */
    cr_assert_eq(http(&s, "POST", "/v1/completions", b1, NULL, &r), 200, "%s", r);
    t = completion_text(r, NULL);
    cr_assert_str_eq(t, ref, "stories still answers as jlm run");
    free(t); free(r);
    m = get_metrics(&s);
    cr_assert(metric(m, "jlm_budget_reclaims_total{model=\"synth\"}") >= 1, "synth's frames were taken: %s", m);
    /* page-ins, or fills of the pages it kept in part */
    cr_assert(metric(m, "jlm_bytes_read_total{model=\"stories\"}") > st_in, "stories paged in again: %s", m);
    cr_assert(metric(m, "jlm_resident_total_bytes") <= (double)total, "%s", m);
    free(m);
    free(ref); free(ref2); free(m2);
    srv_free(&s);
}

/* ---------------------------------------------------------------- a models folder that changes */

/* curl with the response headers in DIR/hdr; the status. */
static int http_hdr(const srv *s, const char *method, const char *path, const char *body, char **out, char **hdr)
{
    char extra[1200];
    snprintf(extra, sizeof extra, "-D %s/hdr", s->dir);
    int st = http(s, method, path, body, extra, out);
    snprintf(extra, sizeof extra, "%s/hdr", s->dir);
    size_t n = 0;
    unsigned char *h = tu_read_file(extra, &n);
    *hdr = strndup(h ? (const char *)h : "", n);
    free(h);
    return st;
}

static void put_text(const char *dir, const char *name, const char *text)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(tu_write_file(p, text, strlen(text)), 0, "%s", p);
}

/* A view (a folder NAME.jlm with `status` and model.jlm, as a jlmfs mount
 * shows it) that appears after the start is listed with its status and
 * answers 503 with Retry-After until `ready`, then generates; a container
 * copied in later is served; one that vanishes is dropped (404), and a
 * stream in flight on it still ends whole. */
Test(serve, a_models_folder_picks_up_late_views_and_drops_vanished_models, .timeout = 120)
{
    srv s = {0};
    s.dir = tu_tmpdir();
    char *md = NULL, cmd[4096];
    if (asprintf(&md, "%s/models", s.dir) < 0) cr_assert_fail();
    cr_assert_eq(mkdir(md, 0755), 0);
    s.model = convert_to("stories260K.gguf", md, "stories.jlm");
    char *keep = s.model;
    s.model = NULL;
    const char *args[] = {"--models", md, "--rescan", "0", "-c", "4096", NULL};
    srv_start(&s, args);
    s.model = keep;
    char *r = NULL, *h = NULL;

    /* a view still converting */
    char view[1200];
    snprintf(view, sizeof view, "%s/late.jlm", md);
    cr_assert_eq(mkdir(view, 0755), 0);
    put_text(view, "status", "converting 40%\n");
    cr_assert_eq(http(&s, "GET", "/v1/models", NULL, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "{\"id\":\"late\"") && strstr(r, "\"status\":\"converting 40%\""), "%s", r);
    cr_assert(strstr(r, "\"id\":\"stories\"") && strstr(r, "\"status\":\"ready\""), "%s", r);
    free(r);
    const char *bl = "{\"model\": \"late\", \"prompt\": \"t1 t2\", \"max_tokens\": 8, \"temperature\": 0}";
    cr_assert_eq(http_hdr(&s, "POST", "/v1/completions", bl, &r, &h), 503, "%s", r);
    cr_assert(strcasestr(h, "\r\nRetry-After: "), "a 503 for a converting view says when to retry: %s", h);
    cr_assert(strstr(r, "\"type\":\"server_busy\"") && strstr(r, "converting 40%"), "%s", r);
    free(r); free(h);

    /* ready: its container is there and its status says so */
    char *late = convert_to("synth-llama-256.Q4_K_M.gguf", view, "model.jlm");
    put_text(view, "status", "ready\n");
    cr_assert_eq(http(&s, "POST", "/v1/completions", bl, NULL, &r), 200, "the view answers once ready: %s", r);
    char *t = ascii_only(completion_text(r, NULL)), *ref = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s -p 't1 t2' -n 8 --temp 0 -t 1 2>/dev/null", tu_jlm(), late);
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    cr_assert_str_eq(t, ascii_only(ref), "the late view answers as jlm run on its container");
    free(t); free(r); free(ref); free(late);

    /* a container copied in later, then removed while a stream runs on it */
    snprintf(cmd, sizeof cmd, "cp %s %s/copy.jlm", keep, md);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    const char *bc = "{\"model\": \"copy\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 0}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", bc, NULL, &r), 200, "%s", r);
    t = completion_text(r, NULL);
    ref = jlm_run(&s, "Once upon a time", 16);
    cr_assert_str_eq(t, ref, "a container dropped in later answers as jlm run");
    free(t); free(r); free(ref);
    /* the stream has started (its first event is here) and cannot end before
     * this side reads it: 600 events are ~100 KB, and a 4 KiB receive buffer
     * holds the server's sends back, however fast it generates */
    int fd = open_stream(&s, "copy", 600, 4096);
    snprintf(cmd, sizeof cmd, "%s/copy.jlm", md);
    cr_assert_eq(unlink(cmd), 0);
    cr_assert_eq(http(&s, "GET", "/v1/models", NULL, NULL, &r), 200, "%s", r);
    cr_assert(!strstr(r, "\"id\":\"copy\""), "a vanished model is no longer listed: %s", r);
    free(r);
    expect_error(&s, "POST", "/v1/completions", bc, NULL, 404, "not_found_error");
    size_t cap = 1 << 20, got = 0;
    char *buf = malloc(cap);
    time_t t0 = time(NULL);
    while (got < cap - 1 && time(NULL) - t0 < 60) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
        buf[got] = 0;
        if (strstr(buf + (got > 64 ? got - 64 : 0), "data: [DONE]")) break;
    }
    buf[got] = 0;
    cr_assert(strstr(buf, "\"finish_reason\":\"length\"") && strstr(buf, "data: [DONE]"),
              "the stream in flight on the vanished model ends whole");
    free(buf);
    close(fd);

    /* the view goes back to converting (its GGUF replaced): 503 again */
    put_text(view, "status", "converting 5%\n");
    cr_assert_eq(http_hdr(&s, "POST", "/v1/completions", bl, &r, &h), 503, "%s", r);
    free(r); free(h);
    r = get_metrics(&s);
    cr_assert(strstr(r, "jlm_model_ready{model=\"late\"} 0"), "%s", r);
    cr_assert(!strstr(r, "{model=\"copy\"}"), "%s", r);
    free(r);
    cr_assert_eq(http(&s, "POST", "/v1/completions", "{\"model\": \"stories\", \"prompt\": \"Once\", \"max_tokens\": 4}",
                      NULL, &r), 200, "the first model answers throughout: %s", r);
    free(r);
    free(md);
    srv_free(&s);
}

/* ---------------------------------------------------------------- a GGUF */

/* `jlm serve foo.gguf` converts once into the per-user cache (as jlm run)
 * and serves it as "foo". */
Test(serve, serves_a_gguf_through_the_per_user_cache, .timeout = 120)
{
    srv s = {0};
    s.dir = tu_tmpdir();
    char cache[1100];
    snprintf(cache, sizeof cache, "%s/cache", s.dir);
    setenv("XDG_CACHE_HOME", cache, 1);
    s.model = strdup(tu_model("stories260K.gguf"));
    srv_start(&s, NULL);
    char *r = NULL;
    cr_assert_eq(http(&s, "GET", "/v1/models", NULL, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "\"id\":\"stories260K\""), "served under the GGUF's stem: %s", r);
    free(r);
    const char *b = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 0}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", b, NULL, &r), 200, "%s", r);
    char *t = completion_text(r, NULL), *ref = jlm_run(&s, "Once upon a time", 16);
    cr_assert_str_eq(t, ref, "the cached conversion answers as jlm run on the GGUF");
    free(t); free(r); free(ref);
    char cmd[1300], *o = NULL;
    snprintf(cmd, sizeof cmd, "ls %s/jlm | grep -c '^stories260K@.*\\.jlm$'", cache);
    tu_run(cmd, &o);
    cr_assert_eq(atoi(o), 1, "one cached container: %s", o);
    free(o);
    srv_free(&s);
}

/* ---------------------------------------------------------------- soak */

static long rss_kib(pid_t pid)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    long k = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) k = atol(line + 6);
    if (f) fclose(f);
    return k;
}

/* 8 clients for 8 s, each sending bounded greedy requests back to back
 * (half streamed, chat and completions): every response is well-formed and
 * is exactly the text that request gets alone, the server stays up and its
 * RSS does not grow without bound. */
Test(serve, soak_eight_clients_well_formed_and_bounded, .timeout = 180)
{
    enum { N = 8, SECONDS = 8 };
    srv s = {0};
    const char *args[] = {"--parallel", "4", "--queue", "16", NULL};
    srv_start(&s, args);
    const char *prompts[4] = {"Once upon a time", "The dog", "Lily saw a bird", "The sun"};
    char *want[4];
    for (int i = 0; i < 4; i++) want[i] = jlm_run(&s, prompts[i], 12);
    /* warm up: one of each, so the first RSS sample holds the caches */
    char *r = NULL;
    cr_assert_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 12, \"temperature\": 0}",
                      NULL, &r), 200, "%s", r);
    free(r);
    long rss0 = rss_kib(s.pid);
    char cmd[16384];
    int k = snprintf(cmd, sizeof cmd, "(");
    for (int c = 0; c < N; c++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "(end=$(( $(date +%%s) + %d )); i=0; while [ $(date +%%s) -lt $end ]; do "
                      "curl -s --max-time 60 -o %s/soak-%d-$i -w '%%{http_code}\\n' http://127.0.0.1:%d/v1/completions "
                      "-d '{\"prompt\": \"%s\", \"max_tokens\": 12, \"temperature\": 0%s}' >> %s/codes; i=$((i+1)); done) & ",
                      SECONDS, s.dir, c, s.port, prompts[c % 4], c % 2 ? ", \"stream\": true" : "", s.dir);
    snprintf(cmd + k, sizeof cmd - (size_t)k, "wait)");
    cr_assert_eq(tu_run(cmd, NULL), 0);
    long rss1 = rss_kib(s.pid);
    /* every status 200, every body whole and right */
    char p[1200];
    snprintf(p, sizeof p, "%s/codes", s.dir);
    size_t n = 0;
    unsigned char *codes = tu_read_file(p, &n);
    cr_assert(codes && n > 0, "the clients ran");
    int total = 0;
    for (size_t i = 0; i + 3 < n + 1; i += 4, total++)
        cr_assert(!memcmp(codes + i, "200\n", 4), "response %d: status %.3s", total, codes + i);
    free(codes);
    int checked = 0;
    for (int c = 0; c < N; c++)
        for (int i = 0;; i++) {
            snprintf(p, sizeof p, "%s/soak-%d-%d", s.dir, c, i);
            size_t rl = 0;
            unsigned char *raw = tu_read_file(p, &rl);
            if (!raw) break;
            char *body = strndup((const char *)raw, rl);
            free(raw);
            char *t = c % 2 ? stream_text(body, NULL) : completion_text(body, NULL);
            cr_assert_str_eq(t, want[c % 4], "client %d request %d equals jlm run alone", c, i);
            free(t); free(body);
            checked++;
        }
    cr_assert_eq(checked, total, "one body per status");
    cr_assert(total >= N, "every client got at least one answer (%d)", total);
#ifdef __SANITIZE_ADDRESS__
    const long slack = 320 * 1024;   /* ASan keeps up to 256 MiB of freed memory in quarantine */
#else
    const long slack = 64 * 1024;
#endif
    cr_assert(rss0 > 0 && rss1 > 0 && rss1 - rss0 < slack, "RSS %ld -> %ld KiB over %d requests", rss0, rss1, total);
    cr_log_info("soak: %d requests, RSS %ld -> %ld KiB", total, rss0, rss1);
    r = get_metrics(&s);
    cr_assert_eq(metric(r, "jlm_requests_done_total{model=\"stories\"}"), (double)(total + 1), "%s", r);
    cr_assert_eq(metric(r, "jlm_requests_running{model=\"stories\"}"), 0, "%s", r);
    cr_assert_eq(metric(r, "jlm_http_errors_total"), 0, "%s", r);
    free(r);
    for (int i = 0; i < 4; i++) free(want[i]);
    srv_free(&s);
}

/* ---------------------------------------------------------------- the openai npm client */

/* Where scripts/deps.sh installs the `openai` package (JLM_NODE_MODULES overrides). */
static const char *node_modules(void)
{
    const char *e = getenv("JLM_NODE_MODULES");
    return e && *e ? e : "/opt/jlm-test-node/node_modules";
}

/* Skips the test when node or the openai package is absent. */
static void need_node(void)
{
    char probe[1200], *o = NULL;
    snprintf(probe, sizeof probe, "command -v node >/dev/null && test -f %s/openai/package.json", node_modules());
    int rc = tu_run(probe, &o);
    free(o);
    if (rc != 0)
        cr_skip_test("node or the openai npm package (%s) is absent: scripts/deps.sh installs them", node_modules());
}

/* The official client: models.list, a completion and a chat completion,
 * whole and streamed; the texts equal jlm run's and jlm chat's. */
Test(serve, the_openai_npm_client_gets_what_jlm_run_gives, .timeout = 120)
{
    need_node();
    srv s = {0};
    srv_start(&s, NULL);
    char cmd[4096], *out = NULL, *ref = jlm_run(&s, "Once upon a time", 16), *cref = NULL;
    snprintf(cmd, sizeof cmd, "(printf 'Hello there\\n' | %s chat %s -n 16 --temp 0 -t 1 2>/dev/null)", tu_jlm(), s.model);
    cr_assert_eq(tu_run(cmd, &cref), 0, "%s", cref);
    snprintf(cmd, sizeof cmd, "node %s/tests/serve_openai.mjs %s http://127.0.0.1:%d/v1 stories 'Once upon a time' 16 2>&1",
             tu_root(), node_modules(), s.port);
    int rc = tu_run(cmd, &out);
    cr_assert_eq(rc, 0, "the client ran: %s", out);
    json_t *j = parse(out);
    json_t *models = json_object_get(j, "models");
    cr_assert_eq(json_array_size(models), 1, "%s", out);
    cr_assert_str_eq(json_string_value(json_array_get(models, 0)), "stories");
    cr_assert_str_eq(json_string_value(json_object_get(j, "completion")), ref, "completion equals jlm run");
    cr_assert_str_eq(json_string_value(json_object_get(j, "stream")), ref, "streamed completion equals jlm run");
    cr_assert_str_eq(json_string_value(json_object_get(j, "finish")), "length");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 16, "%s", out);
    char want[4096];
    snprintf(want, sizeof want, "%s\n", json_string_value(json_object_get(j, "chat")));
    cr_assert_str_eq(want, cref, "chat equals jlm chat's first reply");
    snprintf(want, sizeof want, "%s\n", json_string_value(json_object_get(j, "chat_stream")));
    cr_assert_str_eq(want, cref, "streamed chat equals jlm chat's first reply");
    for (int i = 0; i < 2; i++) {   /* n = 2, seed 7: choice i is seed 7 + i's text */
        char body[512], *r = NULL;
        snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 1.0, "
                                    "\"seed\": %d}", 7 + i);
        cr_assert_eq(http(&s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
        char *t = completion_text(r, NULL);
        cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "n2"), i)), t, "%s", out);
        cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "n2_stream"), i)), t, "%s", out);
        free(t); free(r);
    }
    json_decref(j);
    free(out); free(ref); free(cref);
    srv_free(&s);
}

/* ---------------------------------------------------------------- tool calls */

/* node tests/serve_tools.mjs ... against s; its "ok N" line, asserted. */
/* node tests/SCRIPT NODE_MODULES http://127.0.0.1:PORT{url_tail} stories MODE
 * ARGS prints "ok WANT". */
static void node_check(const srv *s, const char *script, const char *url_tail, const char *mode, const char *args, int want)
{
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "node %s/tests/%s %s http://127.0.0.1:%d%s stories %s %s 2>&1", tu_root(), script,
             node_modules(), s->port, url_tail, mode, args);
    int rc = tu_run(cmd, &out);
    char ok[32];
    snprintf(ok, sizeof ok, "ok %d\n", want);
    cr_assert(rc == 0 && out && !strcmp(out, ok), "%s %s: %s (see %s/server.log)", mode, args, out, s->dir);
    free(out);
}

static void node_tools(const srv *s, const char *mode, const char *args, int want)
{
    node_check(s, "serve_tools.mjs", "/v1", mode, args, want);
}

/* Every family's fixed outputs (tests/toolcall/cases.json), produced by the
 * server under a grammar that allows only that text and the family's own
 * template (--chat-template-file; none: the ChatML fallback), come back as
 * the expected tool_calls, whole and assembled by the openai client from the
 * stream. */
Test(serve, tool_calls_of_every_family_parse_from_fixed_outputs_whole_and_streamed, .timeout = 600)
{
    need_node();
    char path[1100];
    snprintf(path, sizeof path, "%s/tests/toolcall/cases.json", tu_root());
    json_t *cases = json_load_file(path, 0, NULL), *c;
    cr_assert(json_is_array(cases));
    json_t *groups = json_object();   /* template file ("" for none) -> "i,j,..." */
    size_t i;
    json_array_foreach(cases, i, c) {
        const json_t *t = json_object_get(c, "template");
        const char *key = json_is_string(t) ? json_string_value(t) : "";
        const char *had = json_string_value(json_object_get(groups, key));
        char list[256];
        snprintf(list, sizeof list, "%s%s%zu", had ? had : "", had ? "," : "", i);
        json_object_set_new(groups, key, json_string(list));
    }
    srv s = {0};
    const char *tmpl;
    json_t *v;
    int total = 0;
    json_object_foreach(groups, tmpl, v) {
        char file[1100], args[1400];
        snprintf(file, sizeof file, "%s/tests/reference/chat-templates/%s", tu_root(), tmpl);
        const char *with[] = {"-c", "4096", "--chat-template-file", file, NULL};
        if (!*tmpl) with[2] = NULL;
        srv_start(&s, with);
        snprintf(args, sizeof args, "%s %s", path, json_string_value(v));
        int n = 1;
        for (const char *p = json_string_value(v); *p; p++) n += *p == ',';
        node_tools(&s, "fixed", args, 2 * n);
        total += 2 * n;
        cr_assert_eq(srv_stop(&s), 0, "the server exits 0 (see %s/server.log)", s.dir);
    }
    cr_assert_eq(total, 2 * (int)json_array_size(cases), "every case, whole and streamed");
    json_decref(groups);
    json_decref(cases);
    srv_free(&s);
}

/* A random-weight model under tool_choice "required" or a named function
 * (the grammar of the ChatML fallback's Hermes syntax): always one call of
 * an allowed tool whose arguments the client parses, over several seeds,
 * whole and streamed. */
Test(serve, tool_choice_required_and_named_always_give_a_well_formed_call, .timeout = 600)
{
    need_node();
    srv s = {0};
    const char *with[] = {"-c", "2048", NULL};
    srv_start(&s, with);
    node_tools(&s, "forced", "4", 4 * 3 * 2);
    srv_free(&s);
}

/* Refusals naming the field: malformed tools (the schema of its parameters
 * included), an OpenAI field the server does not implement, tools on a
 * model whose template renders none; informational fields are accepted. */
Test(serve, malformed_tools_and_unimplemented_fields_get_400_naming_them, .timeout = 120)
{
    static const struct { const char *body, *name; } bad[] = {
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": 7}}}]",
         "'tools[0].function.parameters'"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"string\", \"pattern\": \"a\"}}}],"
         " \"tool_choice\": \"required\"", "'tools[0].function.parameters'"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {}}]", "'tools[0].function.name'"},
        {"\"tool_choice\": \"auto\"", "'tool_choice'"},
        {"\"logit_bias\": {\"15\": 10}", "'logit_bias'"},
        {"\"n\": 9", "'n'"},
        {"\"audio\": {\"voice\": \"alloy\", \"format\": \"wav\"}", "'audio'"},
        {"\"modalities\": [\"text\", \"audio\"]", "'modalities'"},
        {"\"functions\": [{\"name\": \"f\"}]", "'functions'"},
        {"\"prediction\": {\"type\": \"content\", \"content\": \"x\"}", "'prediction'"},
        {"\"reasoning_effort\": \"high\"", "'reasoning_effort'"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"required\","
         " \"response_format\": {\"type\": \"json_object\"}", "'tool_choice'"},
    };
    srv s = {0};
    srv_start(&s, NULL);
    char body[2048], *r = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2, %s}", bad[i].body);
        int st = http(&s, "POST", "/v1/chat/completions", body, NULL, &r);
        cr_assert_eq(st, 400, "%s: %d %s", body, st, r);
        cr_assert(strstr(r, bad[i].name), "%s: the error names %s: %s", body, bad[i].name, r);
        free(r);
    }
    cr_assert_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"Hi\", \"logit_bias\": {\"1\": 2}}", NULL, &r), 400);
    cr_assert(strstr(r, "'logit_bias'"), "%s", r);
    free(r);
    cr_assert_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"Hi\", \"suffix\": \"end\"}", NULL, &r), 400);
    cr_assert(strstr(r, "'suffix'"), "%s", r);
    free(r);
    const char *fine = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2, \"user\": \"u1\","
                       " \"metadata\": {\"k\": \"v\"}, \"store\": false, \"logit_bias\": {}, \"service_tier\": \"auto\","
                       " \"parallel_tool_calls\": true, \"stream_options\": null}";
    cr_assert_eq(http(&s, "POST", "/v1/chat/completions", fine, NULL, &r), 200, "%s", r);
    free(r);
    cr_assert_eq(srv_stop(&s), 0);
    char file[1100];
    snprintf(file, sizeof file, "%s/tests/reference/chat-templates/bofenghuang-vigogne-2-70b-chat.jinja", tu_root());
    const char *with[] = {"--chat-template-file", file, NULL};
    srv_start(&s, with);
    const char *tools = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2,"
                        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}";
    cr_assert_eq(http(&s, "POST", "/v1/chat/completions", tools, NULL, &r), 400, "%s", r);
    cr_assert(strstr(r, "'tools': the chat template of model 'stories' renders no tools"), "%s", r);
    free(r);
    srv_free(&s);
}

/* --chat-template-file is parsed at start: a broken one is one line naming
 * it, exit 1; a missing one too. */
Test(serve, a_broken_chat_template_file_stops_the_start_in_one_line, .timeout = 60)
{
    char *dir = tu_tmpdir(), *model = convert_to("stories260K.gguf", dir, "stories.jlm"), bad[1100], cmd[4096], *out = NULL;
    snprintf(bad, sizeof bad, "%s/bad.jinja", dir);
    cr_assert_eq(tu_write_file(bad, "{% if messages %}never closed", 29), 0);
    snprintf(cmd, sizeof cmd, "%s serve --port 0 %s --chat-template-file %s 2>&1", tu_jlm(), model, bad);
    cr_assert_eq(tu_run(cmd, &out), 1, "%s", out);
    cr_assert(strstr(out, "jlm serve: --chat-template-file ") && strstr(out, "bad.jinja"), "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s serve --port 0 %s --chat-template-file %s/none.jinja 2>&1", tu_jlm(), model, dir);
    cr_assert_neq(tu_run(cmd, &out), 0, "%s", out);
    cr_assert(strstr(out, "--chat-template-file"), "%s", out);
    free(out);
    tu_rmrf(dir);
    free(dir);
    free(model);
}

/* ---------------------------------------------------------------- a jlmfs mount */

/* `--models MNT` on a real jlmfs mount: a GGUF copied in after the start
 * gets a view that answers 503 (Retry-After) while it converts (the mount's
 * test hook slows each unit), then exactly what jlm run gives; removing the
 * GGUF removes the view and the model (404). */
Test(serve, a_jlmfs_mount_serves_a_gguf_dropped_in_once_its_view_is_ready, .init = mnt_dirs, .fini = mnt_fini,
     .timeout = 120)
{
    mnt_start(200, 1);
    srv s = {0};
    s.dir = tu_tmpdir();
    char cache[1100];
    snprintf(cache, sizeof cache, "%s/xdg", s.dir);
    setenv("XDG_CACHE_HOME", cache, 1);
    const char *args[] = {"--models", M.mnt, "--rescan", "0", NULL};
    srv_start(&s, args);
    char cmd[4096], *r = NULL, *h = NULL;
    snprintf(cmd, sizeof cmd, "cp %s %s/tiny.gguf", tu_model("stories260K.gguf"), M.mnt);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    const char *b = "{\"model\": \"tiny\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 0}";
    int st = http_hdr(&s, "POST", "/v1/completions", b, &r, &h);
    cr_assert_eq(st, 503, "the view is still converting: %s", r);
    cr_assert(strstr(r, "converting"), "%s", r);
    cr_assert(strcasestr(h, "\r\nRetry-After: "), "%s", h);
    free(r); free(h);
    cr_assert_eq(http(&s, "GET", "/v1/models", NULL, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "\"id\":\"tiny\""), "the view is listed while converting: %s", r);
    free(r);
    for (int i = 0; i < 300 && (st = http(&s, "POST", "/v1/completions", b, NULL, &r)) == 503; i++) {
        free(r);
        usleep(200000);
    }
    cr_assert_eq(st, 200, "the view answers once ready: %s", r);
    char *t = completion_text(r, NULL), *ref = NULL;
    free(r);
    snprintf(cmd, sizeof cmd, "(%s run %s -p 'Once upon a time' -n 16 --temp 0 -t 1 2>/dev/null)", tu_jlm(),
             tu_model("stories260K.gguf"));
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    cr_assert_str_eq(t, ref, "the mounted view answers as jlm run on the GGUF: [%s] [%s]", t, ref);
    free(t); free(ref);
    snprintf(cmd, sizeof cmd, "%s/tiny.gguf", M.mnt);
    cr_assert_eq(unlink(cmd), 0);
    expect_error(&s, "POST", "/v1/completions", b, NULL, 404, "not_found_error");
    srv_free(&s);
}

/* The server reports its own page-ins to a view's residency database, as
 * `jlm run` does (cli/report.c): while it serves the view, /residency (what
 * `jlm stats --json` gives) counts its session and the pages it holds; after
 * SIGTERM the session is gone. Before, the database saw only the daemon's
 * reads: sessions 0, nothing resident. */
static json_t *view_stats(json_t *root)
{
    json_t *models = json_object_get(root, "models");
    cr_assert_eq(json_object_size(models), 1, "one model on the mount");
    const char *k;
    json_t *v;
    json_object_foreach(models, k, v) return v;
    return NULL;
}

Test(serve, reports_its_page_ins_to_a_views_residency_database, .init = mnt_dirs, .fini = mnt_fini, .timeout = 120)
{
    char cmd[4096], *r = NULL, *ref = NULL;
    snprintf(cmd, sizeof cmd, "cp %s %s/tiny.gguf", tu_model("stories260K.gguf"), M.src);
    cr_assert_eq(tu_run(cmd, NULL), 0);
    mnt_start(0, 1);
    char status[1200], view[1100];
    snprintf(view, sizeof view, "%s/tiny.jlm", M.mnt);
    snprintf(status, sizeof status, "%s/status", view);
    for (int i = 0; i < 300; i++) {
        char *st = (char *)tu_read_file(status, NULL);
        int ready = st && !strncmp(st, "ready", 5);
        free(st);
        if (ready) break;
        cr_assert(i < 299, "the view became ready");
        usleep(100000);
    }
    srv s = {0};
    s.dir = tu_tmpdir();
    s.model = strdup(view);
    srv_start(&s, NULL);
    const char *b = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8, \"temperature\": 0}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", b, NULL, &r), 200, "%s", r);
    char *t = completion_text(r, NULL);
    free(r);
    snprintf(cmd, sizeof cmd, "(%s run %s -p 'Once upon a time' -n 8 --temp 0 -t 1 2>/dev/null)", tu_jlm(), view);
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    cr_assert_str_eq(t, ref, "[%s] [%s]", t, ref);
    free(t); free(ref);
    cr_assert_eq(http(&s, "GET", "/v1/models/tiny/residency", NULL, NULL, &r), 200, "%s", r);
    json_t *j = parse(r), *m = view_stats(j);
    cr_assert_eq(json_integer_value(json_object_get(m, "sessions")), 1, "the server's session is live: %s", r);
    cr_assert(json_integer_value(json_object_get(m, "resident")) >= 1, "the server's frames are resident: %s", r);
    json_t *tot = json_object_get(m, "totals");
    cr_assert(json_integer_value(json_object_get(tot, "page_ins")) >= 1, "its page-ins are counted: %s", r);
    json_decref(j);
    free(r);
    cr_assert_eq(srv_stop(&s), 0);
    snprintf(cmd, sizeof cmd, "%s stats --json %s", tu_jlm(), view);
    cr_assert_eq(tu_run(cmd, &r), 0, "%s", r);
    j = parse(r);
    m = view_stats(j);
    cr_assert_eq(json_integer_value(json_object_get(m, "sessions")), 0, "SIGTERM ended the session: %s", r);
    cr_assert(json_integer_value(json_object_get(json_object_get(m, "totals"), "page_ins")) >= 1, "%s", r);
    json_decref(j);
    free(r);
    srv_free(&s);
}

/* The engine's options reach the server as they reach `jlm run` (the rows
 * are shared, cli/opts.c): with --kv f16 --no-prefetch --backend cpu the
 * greedy completion equals jlm run's with the same options. */
Test(serve, takes_the_engine_options_as_jlm_run_does, .timeout = 60)
{
    srv s = {0};
    const char *args[] = {"--kv", "f16", "--no-prefetch", "--backend", "cpu", "-c", "128", NULL};
    srv_start(&s, args);
    char *r = NULL, *ref = NULL, cmd[4096];
    const char *b = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0}";
    cr_assert_eq(http(&s, "POST", "/v1/completions", b, NULL, &r), 200, "%s", r);
    char *t = completion_text(r, NULL);
    free(r);
    snprintf(cmd, sizeof cmd, "(%s run %s -p 'Once upon a time' -n 24 --temp 0 -t 1 --kv f16 --no-prefetch -c 128 "
             "2>/dev/null)", tu_jlm(), s.model);
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    cr_assert_str_eq(t, ref, "[%s] [%s]", t, ref);
    free(t); free(ref);
    srv_free(&s);
}

/* Each block page is read once per decode step for the whole batch (issue
 * 16): with one block frame (--budget 1, raised to the minimum) every step
 * pages every block in, so the page-ins are n_blocks per step plus n_blocks
 * per prompt (each evaluated alone), not per sequence: 4 concurrent requests
 * of 32 tokens read about a quarter of what 4 sequences alone would. */
Test(serve, a_batch_reads_each_block_page_once_per_step, .timeout = 60)
{
    srv s = {0};
    const char *args[] = {"--budget", "1", "-np", "4", NULL};
    srv_start(&s, args);
    jlm_model *c = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_open(s.model, &c, &err), 0, "%s", err.msg);
    double nb = c->hdr.n_blocks;
    jlm_fmt_close(c);
    char cmd[4096], *o = NULL;
    snprintf(cmd, sizeof cmd, "for i in 1 2 3 4; do curl -sf -o /dev/null http://127.0.0.1:%d/v1/completions -d "
             "\"{\\\"prompt\\\": \\\"Once upon a time $i\\\", \\\"max_tokens\\\": 32, \\\"temperature\\\": 0, "
             "\\\"ignore_eos\\\": true}\" & done; f=0; for j in $(jobs -p); do wait $j || f=1; done; exit $f", s.port);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    free(o);
    char *m = get_metrics(&s);
    double steps = metric(m, "jlm_decode_steps_total{model=\"stories\"}");
    double seqs = metric(m, "jlm_decode_step_sequences_total{model=\"stories\"}");
    double ins = metric(m, "jlm_page_ins_total{model=\"stories\"}");
    cr_assert(steps > 0 && seqs > steps, "the requests were batched: %g sequences in %g steps\n%s", seqs, steps, m);
    cr_assert(ins >= nb * steps, "one frame: every step pages every block in: %g page-ins, %g steps\n%s", ins, steps, m);
    cr_assert(ins <= nb * (steps + 4), "a block page read once per step for the batch (and once per prompt): %g "
              "page-ins, %g steps, %g blocks\n%s", ins, steps, nb, m);
    cr_assert(ins < nb * seqs, "fewer reads than one per sequence-step: %g vs %g\n%s", ins, nb * seqs, m);
    free(m);
    srv_free(&s);
}

/* ---------------------------------------------------------------- slow clients and the port */

/* A TCP connection to the server from the loopback address src (any of
 * 127.0.0.0/8 is this machine), non-blocking; -1 when refused. */
static int tcp_connect_from(int port, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in b = {.sin_family = AF_INET}, a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, src, &b.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&b, sizeof b) == 0, "bind to %s", src);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* 1 when the server closed fd (end of file or reset), without reading a response. */
static int closed_by_server(int fd)
{
    char b[256];
    ssize_t n = read(fd, b, sizeof b);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* Sends req from src and returns the response's HTTP status (-1: the
 * connection was closed or nothing came within timeout_ms); the response in
 * out (at most 4 KiB) when out is not NULL. */
static int raw_request(int port, const char *src, const char *req, int timeout_ms, char *out)
{
    char buf[4096];
    size_t got = 0;
    int fd = tcp_connect_from(port, src);
    if (fd < 0) return -1;
    if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
        close(fd);
        return -1;
    }
    for (int waited = 0; waited < timeout_ms && got < sizeof buf - 1; waited += 20) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0) continue;
        ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
        buf[got] = 0;
        const char *h = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "Content-Length: ");
        if (h && cl && (size_t)(buf + got - (h + 4)) >= (size_t)atoi(cl + 16)) break;
    }
    buf[got] = 0;
    close(fd);
    if (out) strcpy(out, buf);
    return !strncmp(buf, "HTTP/1.1 ", 9) ? atoi(buf + 9) : -1;
}

static double secs_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define N_ADDR  8    /* attacking addresses, 127.0.0.1 .. 127.0.0.8 */
#define PER_ADDR 10  /* sockets from each, 2 past --conn-per-addr 8 */

/* 80 slow clients (64 of them taking every connection the server serves)
 * sending one header line every 300 ms: a further address still gets
 * /health at once (the connections kept for it), and a generation request
 * a 503 naming the limit; every slow client is closed by its 2 s header
 * deadline; a body sent as slowly by its body deadline; then every address,
 * the attackers' too, is served again. */
Test(serve, slow_clients_are_closed_by_their_deadlines_and_never_starve_health, .timeout = 60)
{
    srv s = {0};
    const char *args[] = {"--conn-per-addr", "8", "--header-timeout", "2", "--body-timeout", "2", NULL};
    srv_start(&s, args);
    int fds[N_ADDR * PER_ADDR];
    char src[32];
    double t0 = secs_now();
    for (int a = 0; a < N_ADDR; a++)
        for (int k = 0; k < PER_ADDR; k++) {
            snprintf(src, sizeof src, "127.0.0.%d", a + 1);
            int fd = fds[a * PER_ADDR + k] = tcp_connect_from(s.port, src);
            cr_assert(fd >= 0);
            const char *line = "GET /health HTTP/1.1\r\nHost: x\r\n";
            cr_assert_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
        }
    usleep(300000);
    /* the per-address cap: 2 of each address's 10 are closed at once */
    int refused = 0;
    for (int i = 0; i < N_ADDR * PER_ADDR; i++)
        if (closed_by_server(fds[i])) {
            close(fds[i]);
            fds[i] = -1;
            refused++;
        }
    cr_assert_eq(refused, N_ADDR * (PER_ADDR - 8), "connections past 8 from one address are refused");
    /* every connection served is taken: /health still answers, from another address, at once */
    char resp[4096];
    double th = secs_now();
    int st = raw_request(s.port, "127.0.0.9", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 1500, resp);
    cr_assert_eq(st, 200, "/health with 64 slow clients: %d '%s'", st, resp);
    cr_assert(secs_now() - th < 1.5, "at once");
    const char *gen = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 36\r\n\r\n"
                      "{\"prompt\": \"Once\", \"max_tokens\": 2}";
    st = raw_request(s.port, "127.0.0.9", gen, 3000, resp);
    cr_assert(st == 503 && strstr(resp, "64 connections"), "past the limit only /health: %d '%s'", st, resp);
    /* one header line every 300 ms does not keep them: all closed by their 2 s deadline */
    int open_left = N_ADDR * 8;
    while (open_left > 0 && secs_now() - t0 < 6) {
        usleep(300000);
        for (int i = 0; i < N_ADDR * PER_ADDR; i++) {
            if (fds[i] < 0) continue;
            if (closed_by_server(fds[i]) || write(fds[i], "X-Slow: 1\r\n", 11) < 0) {
                close(fds[i]);
                fds[i] = -1;
                open_left--;
            }
        }
    }
    double took = secs_now() - t0;
    cr_assert_eq(open_left, 0, "%d slow clients still open after %.1f s", open_left, took);
    cr_assert(took > 1.5, "closed by the deadline, not at once (%.1f s)", took);
    /* a body sent one byte every 300 ms: closed by the body deadline */
    int fd = tcp_connect_from(s.port, "127.0.0.1");
    const char *hdr = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n";
    cr_assert_eq(write(fd, hdr, strlen(hdr)), (ssize_t)strlen(hdr));
    double tb = secs_now();
    int closed = 0;
    while (!closed && secs_now() - tb < 6) {
        usleep(300000);
        closed = closed_by_server(fd) || write(fd, " ", 1) < 0;
    }
    close(fd);
    cr_assert(closed && secs_now() - tb > 1.5, "a slow body is closed by its deadline (%.1f s)", secs_now() - tb);
    /* served again, the attackers' addresses too */
    st = raw_request(s.port, "127.0.0.1", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 2000, resp);
    cr_assert_eq(st, 200, "%d '%s'", st, resp);
    char *r = NULL;
    cr_assert_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 2}", NULL, &r), 200, "%s", r);
    free(r);
    cr_assert_eq(http(&s, "GET", "/metrics", NULL, NULL, &r), 200);
    const char *m = strstr(r, "jlm_http_deadline_closed_total ");
    cr_assert(m && atoi(m + 31) >= N_ADDR * 8 + 1, "%s", r);
    free(r);
    srv_free(&s);
}

/* A port another program holds: one line naming the address and port, exit 1. */
Test(serve, a_busy_port_is_named_in_one_line, .timeout = 60)
{
    char *dir = tu_tmpdir();
    char *model = convert_to("stories260K.gguf", dir, "stories.jlm");
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t al = sizeof a;
    cr_assert(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 1) == 0 &&
              getsockname(lfd, (struct sockaddr *)&a, &al) == 0);
    int port = ntohs(a.sin_port);
    char cmd[2048], want[64], *o = NULL;
    snprintf(cmd, sizeof cmd, "timeout 30 %s serve --port %d -t 1 %s", tu_jlm(), port, model);
    int rc = tu_run(cmd, &o);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, o);
    snprintf(want, sizeof want, "127.0.0.1:%d: Address already in use", port);
    cr_assert(strstr(o, want), "names the address and port: %s", o);
    cr_assert(!strstr(o, "port 0"), "%s", o);
    cr_assert(strchr(o, '\n') == o + strlen(o) - 1, "one line: '%s'", o);
    free(o);
    close(lfd);
    tu_rmrf(dir);
    free(dir);
    free(model);
}

/* stories260K.gguf with tokenizer.chat_template = tmpl inserted first,
 * written to path. The key-value is padded with spaces to a multiple of the
 * GGUF alignment (32), so the tensor data keeps its padding. */
static void gguf_with_template(const char *path, const char *tmpl)
{
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b && n > 24);
    static const char key[] = "tokenizer.chat_template";
    size_t kl = sizeof key - 1, tl = strlen(tmpl), kv = 8 + kl + 4 + 8 + tl, pad = (32 - kv % 32) % 32;
    uint64_t nkv, len = tl + pad, klen = kl;
    uint32_t type = 8;   /* GGUF string */
    unsigned char *c = malloc(n + kv + pad), *p = c + 24;
    memcpy(c, b, 24);
    memcpy(&nkv, b + 16, 8);
    nkv++;
    memcpy(c + 16, &nkv, 8);
    memcpy(p, &klen, 8), p += 8;
    memcpy(p, key, kl), p += kl;
    memcpy(p, &type, 4), p += 4;
    memcpy(p, &len, 8), p += 8;
    memcpy(p, tmpl, tl), p += tl;
    memset(p, ' ', pad), p += pad;
    memcpy(p, b + 24, n - 24);
    cr_assert_eq(tu_write_file(path, c, n + kv + pad), 0);
    free(c);
    free(b);
}

/* A model whose chat template loops 10^10 times: each chat request is
 * refused within seconds naming the step limit (it ran for minutes),
 * completions are served, and SIGTERM with requests mid-render drains and
 * exits 0. */
Test(serve, a_runaway_chat_template_is_refused_per_request_and_sigterm_still_drains, .timeout = 120)
{
    srv s = {0};
    s.dir = tu_tmpdir();
    char g[1100];
    snprintf(g, sizeof g, "%s/evil.gguf", s.dir);
    gguf_with_template(g, "{% set r = range(100000) %}{% for i in r %}{% for j in r if j < 0 %}{% endfor %}{% endfor %}");
    jlm_conv *c;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(g, NULL, &c, &err), 0, "%s", err.msg);
    s.model = malloc(1100);
    snprintf(s.model, 1100, "%s/evil.jlm", s.dir);
    cr_assert_eq(jlm_conv_write(c, s.model, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    srv_start(&s, NULL);
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2}";
    double t0 = secs_now();
    char *r = NULL;
    int st = http(&s, "POST", "/v1/chat/completions", chat, NULL, &r);
    cr_assert(st == 400 && strstr(r, "step limit of 10000000"), "refused naming the limit: %d %s", st, r);
    cr_assert(secs_now() - t0 < 30, "within seconds: %.1f s", secs_now() - t0);
    free(r);
    cr_assert_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 2}", NULL, &r), 200, "%s", r);
    free(r);
    /* a client that leaves: its rendering stops at the next check (65536 steps), counted */
    char req[512];
    int nr = snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                      strlen(chat), chat);
    int gone = tcp_connect(s.port);
    cr_assert_eq(write(gone, req, (size_t)nr), nr);
    close(gone);
    cr_assert(metrics_reach(&s, "jlm_template_renders_cancelled_total 1\n"), "the render of a client gone stops");
    /* clients that leave mid-render, one still waiting, then SIGTERM */
    int waiting = -1;
    for (int i = 0; i < 4; i++) {
        int fd = tcp_connect(s.port);
        cr_assert_eq(write(fd, req, (size_t)nr), nr);
        if (i < 3) close(fd);
        else waiting = fd;
    }
    usleep(100000);
    double ts = secs_now();
    cr_assert_eq(srv_stop(&s), 0, "exits 0 (see %s/server.log)", s.dir);
    cr_assert(secs_now() - ts < 30, "drained in %.1f s", secs_now() - ts);
    close(waiting);
    srv_free(&s);
}

/* ---------------------------------------------------------------- constrained decoding (docs/grammar.md) */
Test(serve, response_format_json_schema_replies_parse_and_follow_the_schema_streamed_or_not, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},"
                         "\"n\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\"]},\"maxItems\":2}},"
                         "\"required\":[\"name\",\"n\"],\"additionalProperties\":false}";
    int by_budget = 0;
    for (int seed = 1; seed <= 8; seed++) {
        char body[2048], *out = NULL;
        int stream = seed % 2;
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":%d,\"seed\":%d,"
                 "\"temperature\":1.5,\"stream\":%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                 "{\"name\":\"p\",\"strict\":true,\"schema\":%s}}}", 14 + 3 * seed, seed, stream ? "true" : "false", schema);
        cr_assert_eq(http(&s, "POST", "/v1/chat/completions", body, NULL, &out), 200, "%s", out);
        const char *fin;
        char *text = stream ? stream_text(out, &fin) : completion_text(out, &fin);
        by_budget += !strcmp(fin, "length");
        json_t *v = json_loads(text, 0, NULL), *name = json_object_get(v, "name"), *tags = json_object_get(v, "tags");
        cr_assert(json_is_object(v), "seed %d: not a JSON object: %s", seed, text);
        cr_expect(json_is_string(name) && json_string_length(name) <= 40, "seed %d: name: %s", seed, text);   /* 10 characters */
        cr_expect(json_is_integer(json_object_get(v, "n")), "seed %d: n: %s", seed, text);
        cr_expect(json_object_size(v) == 2 + !!tags, "seed %d: no other keys: %s", seed, text);
        for (size_t i = 0; tags && i < json_array_size(tags); i++) {
            const char *t = json_string_value(json_array_get(tags, i));
            cr_expect(t && (!strcmp(t, "x") || !strcmp(t, "y")) && json_array_size(tags) <= 2, "seed %d: tags: %s", seed, text);
        }
        json_decref(v);
        free(text);
        free(out);
    }
    cr_expect_gt(by_budget, 0, "some replies closed by max_tokens");
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\":\"x\",\"grammar\":\"root ::= (\"}", NULL, 400, "invalid_request_error");
    char *out = NULL;
    cr_expect_eq(http(&s, "POST", "/v1/completions",
                      "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"minimum\":1}}}}",
                      NULL, &out), 400);
    cr_expect(strstr(out, "keyword 'minimum' is not supported"), "%s", out);
    free(out);
    srv_free(&s);
}

/* ---------------------------------------------------------------- prefix cache */

/* POSTs a chat body; the response parsed (200 asserted). */
static json_t *chat_json(const srv *s, const char *body)
{
    char *r = NULL;
    cr_assert_eq(http(s, "POST", "/v1/chat/completions", body, NULL, &r), 200, "%s", r);
    json_t *j = parse(r);
    free(r);
    return j;
}

static json_int_t cached_tokens(json_t *j)
{
    json_t *d = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
    cr_assert(json_is_integer(json_object_get(d, "cached_tokens")), "usage.prompt_tokens_details.cached_tokens");
    return json_integer_value(json_object_get(d, "cached_tokens"));
}

/* The choice as bytes: the reply's text and every token's logprob and top 20
 * alternatives (doubles printed to 17 digits): equal only when the logits
 * each came from are. */
static char *choice_bytes(json_t *j)
{
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    return json_dumps(c, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(17));
}

Test(serve, a_next_chat_turn_reuses_the_cached_prefix_and_answers_as_without_it, .timeout = 120)
{
    srv a = {0}, b = {0};
    const char *one[] = {"--parallel", "1", NULL};
    srv_start(&a, one);
    const char *t1 = "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time there was a little girl "
                     "who liked to play in the park with her dog\"}], \"max_tokens\": 24, \"temperature\": 0}";
    json_t *j1 = chat_json(&a, t1);
    cr_assert_eq(cached_tokens(j1), 0, "the first request finds an empty cache");
    char *d1 = json_dumps(j1, 0), *reply = completion_text(d1, NULL);
    free(d1);
    json_decref(j1);
    /* a request sharing less than a block (the BOS, a few template tokens)
     * reuses nothing; on the one slot (--parallel 1) it overwrites the
     * sequence's cache, so the next turn's prefix must come from the cache */
    json_t *j4 = chat_json(&a, "{\"messages\": [{\"role\": \"user\", \"content\": \"Zebras eat grass all day long "
                               "in the hot sun and they run very fast when lions come near\"}], \"max_tokens\": 64, "
                               "\"temperature\": 0, \"ignore_eos\": true}");
    cr_assert_eq(cached_tokens(j4), 0, "a request sharing no block reports 0 cached tokens");
    json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}]", "role", "user", "content",
                             "Once upon a time there was a little girl who liked to play in the park with her dog",
                             "role", "assistant", "content", reply, "role", "user", "content", "What happened next?");
    json_t *req = json_pack("{s:o, s:i, s:i, s:b, s:i}", "messages", msgs, "max_tokens", 12, "temperature", 0,
                            "logprobs", 1, "top_logprobs", 20);
    char *t2 = json_dumps(req, 0);
    json_t *j2 = chat_json(&a, t2);
    json_int_t hit = cached_tokens(j2);
    json_int_t n_prompt = json_integer_value(json_object_get(json_object_get(j2, "usage"), "prompt_tokens"));
    cr_assert(hit >= 32 && hit < n_prompt, "the second turn reuses the first's prefix: %lld of %lld",
              (long long)hit, (long long)n_prompt);
    /* the same turn on a fresh server without the cache */
    const char *off[] = {"--prefix-cache", "0", NULL};
    srv_start(&b, off);
    json_t *j3 = chat_json(&b, t2);
    cr_assert_eq(cached_tokens(j3), 0);
    char *x = choice_bytes(j2), *y = choice_bytes(j3);
    cr_assert_str_eq(x, y, "text and logprobs with the cached prefix equal those without it");
    char *m = get_metrics(&a);
    cr_assert(metric(m, "jlm_prefix_cache_bytes{model=\"stories\"}") > 0, "%s", m);
    cr_assert_eq(metric(m, "jlm_prompt_cached_tokens_total{model=\"stories\"}"), (double)hit, "%s", m);
    free(m); free(x); free(y); free(t2); free(reply);
    json_decref(j2); json_decref(j3); json_decref(j4); json_decref(req);
    srv_free(&b);
    srv_free(&a);
}

#define PROMPT_A "Once upon a time there was a little girl named Lily who liked to play in the park with her big dog"
#define PROMPT_B "Zebras eat grass all day long in the hot sun and they run very fast when the hungry lions come near"

/* POSTs a greedy completion of prompt; its usage's cached tokens. */
static json_int_t completion_cached(const srv *s, const char *prompt)
{
    char body[1024], *r = NULL;
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 8, \"temperature\": 0}", prompt);
    cr_assert_eq(http(s, "POST", "/v1/completions", body, NULL, &r), 200, "%s", r);
    json_t *j = parse(r);
    json_int_t c = cached_tokens(j);
    json_decref(j);
    free(r);
    return c;
}

Test(serve, the_prefix_cache_stays_under_its_limit_and_the_budget_evicting_lru, .timeout = 120)
{
    srv a = {0}, b = {0}, c = {0};
    srv_start(&a, NULL);
    cr_assert_eq(completion_cached(&a, PROMPT_A), 0);
    cr_assert_gt(completion_cached(&a, PROMPT_A), 0, "the same prompt again reuses its prefix");
    char *m = get_metrics(&a);
    double one = metric(m, "jlm_prefix_cache_bytes{model=\"stories\"}");
    free(m);
    cr_assert_gt(one, 0);
    /* room for one entry: B's evicts A's (least recently used) */
    char lim[32];
    snprintf(lim, sizeof lim, "%.0f", one * 1.5);
    const char *small[] = {"--prefix-cache", lim, NULL};
    srv_start(&b, small);
    cr_assert_eq(completion_cached(&b, PROMPT_A), 0);
    cr_assert_eq(completion_cached(&b, PROMPT_B), 0);
    cr_assert_gt(completion_cached(&b, PROMPT_B), 0, "B is held");
    cr_assert_eq(completion_cached(&b, PROMPT_A), 0, "A was evicted to make room for B");
    m = get_metrics(&b);
    cr_assert_leq(metric(m, "jlm_prefix_cache_bytes{model=\"stories\"}"), one * 1.5, "%s", m);
    free(m);
    /* a budget at the model's minimum working set leaves the cache no room */
    const char *tight[] = {"--budget", "1", NULL};
    srv_start(&c, tight);
    cr_assert_eq(completion_cached(&c, PROMPT_A), 0);
    cr_assert_eq(completion_cached(&c, PROMPT_A), 0, "the cache counts against --budget");
    m = get_metrics(&c);
    cr_assert_eq(metric(m, "jlm_prefix_cache_bytes{model=\"stories\"}"), 0, "%s", m);
    free(m);
    srv_free(&c);
    srv_free(&b);
    srv_free(&a);
}

/* A latent-attention cache (deepseek2) is not kept per KV head: its prefixes
 * cannot be saved (jlm_engine_kv_bytes 0), so serve's prefix cache keeps none
 * of them, and a save into a zero-byte buffer writes nothing. */
Test(engine_batch, a_latent_attention_cache_is_never_saved_as_a_prefix, .timeout = 60)
{
    char *dir = tu_tmpdir();
    char *m = convert_to("synth-deepseek2-256.Q8_0.gguf", dir, "m.jlm");
    jlm_engine_opts eo = {.n_threads = 1, .n_ctx = 64, .direct = 0, .quiet = 1};
    jlm_engine *e;
    jlm_err err = {0};
    cr_assert_eq(jlm_engine_open(m, &eo, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_kv_bytes(e, 16), 0);
    jlm_engine_seq *s;
    cr_assert_eq(jlm_engine_seq_create(e, &s, &err), 0);
    float *l = malloc(jlm_engine_n_vocab(e) * sizeof *l);
    int32_t ids[4] = {1, 2, 3, 4};
    cr_assert_eq(jlm_engine_eval_seq(e, s, ids, 4, l, &err), 0, "%s", err.msg);
    char guard = 0x5a;
    cr_assert_eq(jlm_engine_kv_save(e, s, 4, &guard, &err), 0, "%s", err.msg);
    cr_assert_eq(guard, 0x5a, "nothing written");
    free(l);
    jlm_engine_seq_destroy(s);
    jlm_engine_close(e);
    free(m);
    tu_rmrf(dir);
    free(dir);
}

/* ================================================================ the other APIs (suite serve_apis)
 * /v1/embeddings, Anthropic's /v1/messages, ollama's /api/...: request
 * parsing on crafted bodies (serve/dialect.c), then each endpoint against
 * `jlm run` / `jlm chat`, then their official npm clients. */
#include "serve/dialect.h"

/* `jlm chat`'s first greedy reply of n tokens to "Hello there", without its
 * newline (what every chat API below must answer). */
static char *chat_reply(const srv *s, int n)
{
    char cmd[2048], *ref = NULL;
    snprintf(cmd, sizeof cmd, "(printf 'Hello there\\n' | %s chat %s -n %d --temp 0 -t 1 2>/dev/null)", tu_jlm(),
             s->model, n);
    cr_assert_eq(tu_run(cmd, &ref), 0, "%s", ref);
    ref[strcspn(ref, "\n")] = 0;
    return ref;
}

static void parse_case(jlm_srv_api api, const char *body, int want_rc, const char *want_msg)
{
    jlm_srv_req r;
    jlm_err err = {0};
    int rc = jlm_srv_dialect_parse(api, body, strlen(body), &r, &err);
    cr_assert_eq(rc, want_rc, "%s: rc %d (%s), expected %d", body, rc, err.msg, want_rc);
    if (rc)
        cr_assert(strstr(err.msg, want_msg), "%s: '%s' names '%s'", body, err.msg, want_msg);
    else
        jlm_srv_req_free(&r);
}

Test(serve_apis, requests_of_the_other_apis_parse_or_are_refused_naming_the_field)
{
    const jlm_srv_api E = JLM_SRV_API_EMBED, A = JLM_SRV_API_ANTHROPIC, C = JLM_SRV_API_OLLAMA_CHAT,
                      G = JLM_SRV_API_OLLAMA_GENERATE, OE = JLM_SRV_API_OLLAMA_EMBED;
    parse_case(E, "{\"input\": \"hi\"}", 0, NULL);
    parse_case(E, "{\"input\": [\"a\", \"b\"], \"encoding_format\": \"base64\", \"pooling\": \"last\"}", 0, NULL);
    parse_case(E, "{\"input\": [1, 2, 3]}", 0, NULL);
    parse_case(E, "{\"input\": [[1, 2], [3]]}", 0, NULL);
    parse_case(E, "{}", JLM_EINVAL, "'input'");
    parse_case(E, "{\"input\": \"\"}", JLM_EINVAL, "'input'");
    parse_case(E, "{\"input\": [\"a\", [1]]}", JLM_EINVAL, "'input'");
    parse_case(E, "{\"input\": [[1], []]}", JLM_EINVAL, "'input'");
    parse_case(E, "{\"input\": [-1]}", JLM_EINVAL, "'input'");
    parse_case(E, "{\"input\": \"a\", \"dimensions\": 8}", JLM_EUNSUPPORTED, "'dimensions'");
    parse_case(E, "{\"input\": \"a\", \"encoding_format\": \"int8\"}", JLM_EINVAL, "'encoding_format'");
    parse_case(E, "{\"input\": \"a\", \"pooling\": \"cls\"}", JLM_EINVAL, "'pooling'");
    parse_case(E, "[1]", JLM_EFORMAT, "JSON object");
    parse_case(OE, "{\"model\": \"m:latest\", \"input\": [\"a\"], \"truncate\": true, \"options\": {\"temperature\": 1}}",
               0, NULL);
    parse_case(OE, "{\"input\": [1, 2]}", JLM_EINVAL, "'input'");
    parse_case(OE, "{\"input\": \"a\", \"options\": {\"bogus\": 1}}", JLM_EUNSUPPORTED, "'options.bogus'");

    const char *msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    char b[1024];
#define ANTH(extra) (snprintf(b, sizeof b, "{\"model\": \"m\", \"max_tokens\": 8, %s%s}", msgs, extra), b)
    parse_case(A, ANTH(""), 0, NULL);
    parse_case(A, ANTH(", \"system\": [{\"type\": \"text\", \"text\": \"be brief\"}], \"stop_sequences\": [\"x\"], "
                       "\"metadata\": {\"user_id\": \"u\"}, \"top_k\": 5, \"stream\": true"), 0, NULL);
    parse_case(A, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", JLM_EINVAL, "'max_tokens'");
    parse_case(A, ANTH(", \"temperature\": 1.5"), JLM_EINVAL, "'temperature'");
    parse_case(A, ANTH(", \"stop_sequences\": [\"\"]"), JLM_EINVAL, "'stop_sequences[0]'");
    parse_case(A, ANTH(", \"stop_sequences\": [\"a\", \"b\", \"c\", \"d\", \"e\"]"), JLM_EINVAL, "'stop_sequences'");
    const char *tool = "\"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}}]";
    char b2[512];
#define ANTH_T(extra) (snprintf(b2, sizeof b2, ", %s%s", tool, extra), ANTH(b2))
    parse_case(A, ANTH_T(""), 0, NULL);
    parse_case(A, ANTH_T(", \"tool_choice\": {\"type\": \"any\", \"disable_parallel_tool_use\": true}"), 0, NULL);
    parse_case(A, ANTH_T(", \"tool_choice\": {\"type\": \"tool\", \"name\": \"f\"}"), 0, NULL);
    parse_case(A, ANTH_T(", \"tool_choice\": {\"type\": \"none\"}"), 0, NULL);
    parse_case(A, ANTH_T(", \"tool_choice\": {\"type\": \"tool\", \"name\": \"g\"}"), JLM_EINVAL, "'tool_choice");
    parse_case(A, ANTH_T(", \"tool_choice\": {\"type\": \"tool\"}"), JLM_EINVAL, "'tool_choice.name'");
    parse_case(A, ANTH_T(", \"tool_choice\": {\"type\": \"some\"}"), JLM_EINVAL, "'tool_choice.type'");
    parse_case(A, ANTH_T(", \"tool_choice\": \"auto\""), JLM_EINVAL, "'tool_choice'");
    parse_case(A, ANTH(", \"tool_choice\": {\"type\": \"any\"}"), JLM_EINVAL, "'tool_choice'");
#undef ANTH_T
    parse_case(A, ANTH(", \"tools\": [{\"name\": \"f\"}]"), JLM_EINVAL, "'tools[0].input_schema'");
    parse_case(A, ANTH(", \"tools\": [{\"input_schema\": {}}]"), JLM_EINVAL, "'tools[0].name'");
    parse_case(A, ANTH(", \"tools\": [{\"type\": \"web_search_20250305\", \"name\": \"web_search\"}]"),
               JLM_EUNSUPPORTED, "'tools[0].type'");
    parse_case(A, ANTH(", \"tools\": {}"), JLM_EINVAL, "'tools'");
    parse_case(A, ANTH(", \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1024}"), JLM_EUNSUPPORTED,
               "'thinking'");
    parse_case(A, ANTH(", \"system\": 3"), JLM_EINVAL, "'system'");
    parse_case(A, "{\"max_tokens\": 8, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", "
                  "\"tool_use_id\": \"x\"}]}]}", 0, NULL);
    parse_case(A, "{\"max_tokens\": 8, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", "
                  "\"tool_use_id\": 3}]}]}", JLM_EINVAL, "'messages[0].content[0].tool_use_id'");
    parse_case(A, "{\"max_tokens\": 8, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", "
                  "\"tool_use_id\": \"x\", \"content\": [{\"type\": \"image\"}]}]}]}", JLM_EUNSUPPORTED,
               "'messages[0].content[0].content[0]': image");
    parse_case(A, "{\"max_tokens\": 8, \"messages\": [{\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", "
                  "\"id\": \"x\", \"name\": \"f\", \"input\": {}}]}]}", 0, NULL);
    parse_case(A, "{\"max_tokens\": 8, \"messages\": [{\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", "
                  "\"id\": \"x\", \"name\": \"f\", \"input\": []}]}]}", JLM_EINVAL, "'messages[0].content[0]'");
    parse_case(A, "{\"max_tokens\": 8, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_use\", "
                  "\"id\": \"x\", \"name\": \"f\", \"input\": {}}]}]}", JLM_EINVAL, "an assistant message");
    parse_case(A, "{\"max_tokens\": 8, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", "
                  "\"source\": {}}]}]}", JLM_EUNSUPPORTED, "'messages[0].content[0]': image");
    parse_case(A, "{\"max_tokens\": 8, \"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}", JLM_EINVAL,
               "'messages[0].role'");
    parse_case(A, "{\"max_tokens\": 8, \"messages\": []}", JLM_EINVAL, "'messages'");
#undef ANTH

    parse_case(C, "{\"model\": \"m:latest\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"options\": "
                  "{\"temperature\": 0, \"num_predict\": 4, \"num_ctx\": 2048, \"repeat_last_n\": 32, \"seed\": 1, "
                  "\"typical_p\": 1.0, \"mirostat\": 0}, \"format\": \"json\", \"keep_alive\": \"5m\"}", 0, NULL);
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"options\": {\"mirostat\": 2}}",
               JLM_EUNSUPPORTED, "'options.mirostat'");
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"options\": {\"typical_p\": 0.5}}",
               JLM_EUNSUPPORTED, "'options.typical_p'");
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"options\": {\"nope\": 1}}",
               JLM_EUNSUPPORTED, "'options.nope'");
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"options\": {\"num_predict\": -3}}",
               JLM_EINVAL, "'options.num_predict'");
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"options\": {\"temperature\": 9}}",
               JLM_EINVAL, "'temperature'");
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{}]}", JLM_EINVAL,
               "'tools[0]");
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", "
                  "\"function\": {\"name\": \"f\"}}]}", 0, NULL);
    parse_case(C, "{\"messages\": [{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": "
                  "{\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}, {\"role\": \"tool\", \"content\": \"2\", "
                  "\"tool_name\": \"f\"}]}", 0, NULL);
    parse_case(C, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
                  "\"arguments\": \"{}\"}}]}]}", JLM_EINVAL, "'messages[0].tool_calls[0]'");
    parse_case(C, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": {}}]}", JLM_EINVAL,
               "'messages[0].tool_calls'");
    parse_case(C, "{\"messages\": [{\"role\": \"tool\", \"content\": \"2\", \"tool_name\": 1}]}", JLM_EINVAL,
               "'messages[0].tool_name'");
    parse_case(G, "{\"prompt\": \"hi\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
               JLM_EINVAL, "'tools'");
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"images\": [\"AAAA\"]}]}",
               JLM_EUNSUPPORTED, "'messages[0].images'");
    parse_case(C, "{\"messages\": [{\"role\": \"tool\", \"content\": \"hi\"}]}", 0, NULL);
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"format\": 3}", JLM_EINVAL, "'format'");
    parse_case(C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": 1}", JLM_EINVAL, "'stream'");
    parse_case(G, "{\"prompt\": \"hi\", \"raw\": true}", 0, NULL);
    parse_case(G, "{\"prompt\": \"hi\", \"system\": \"s\"}", 0, NULL);
    parse_case(G, "{\"prompt\": \"hi\", \"raw\": true, \"system\": \"s\"}", JLM_EINVAL, "'system'");
    parse_case(G, "{\"prompt\": \"hi\", \"suffix\": \"x\"}", JLM_EUNSUPPORTED, "'suffix'");
    parse_case(G, "{\"prompt\": \"hi\", \"context\": [1, 2]}", JLM_EUNSUPPORTED, "'context'");
    parse_case(G, "{\"prompt\": \"hi\", \"think\": true}", JLM_EUNSUPPORTED, "'think'");
    parse_case(G, "{}", JLM_EINVAL, "'prompt'");

    /* what the translation carries over */
    jlm_srv_req r;
    jlm_err err = {0};
    const char *ob = "{\"model\": \"stories:latest\", \"prompt\": \"hi\", \"raw\": true, \"options\": {\"num_predict\": 7, "
                     "\"top_k\": 3, \"repeat_last_n\": 5, \"stop\": [\"x\"]}}";
    cr_assert_eq(jlm_srv_dialect_parse(G, ob, strlen(ob), &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.kind, JLM_SRV_COMPLETION);
    cr_assert_str_eq(r.model, "stories", "':latest' dropped");
    cr_assert_eq(r.max_tokens, 7);
    cr_assert_eq(r.samp.top_k, 3);
    cr_assert_eq(r.samp.repeat_last_n, 5);
    cr_assert_eq(r.stream, 1, "ollama streams by default");
    cr_assert_eq(r.n_stop, 1);
    jlm_srv_req_free(&r);
    const char *ab = "{\"max_tokens\": 9, \"system\": \"S\", \"messages\": [{\"role\": \"user\", \"content\": "
                     "[{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}], "
                     "\"stop_sequences\": [\"zz\"], \"temperature\": 0.5}";
    cr_assert_eq(jlm_srv_dialect_parse(A, ab, strlen(ab), &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.kind, JLM_SRV_CHAT);
    cr_assert_eq(r.max_tokens, 9);
    cr_assert_eq(r.stream, 0);
    cr_assert_str_eq(r.stop[0], "zz");
    cr_assert_float_eq(r.samp.temp, 0.5f, 1e-6);
    cr_assert_eq(json_array_size(r.messages), 2, "the system prompt is the first message");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(r.messages, 0), "role")), "system");
    jlm_srv_req_free(&r);
}

/* `jlm run MODEL -p TEXT --embeddings [--pooling P]` as floats. */
static float *run_embedding(const char *model, const char *text, const char *pool, size_t *n)
{
    char cmd[4096], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s -p '%s' --embeddings %s%s -t 1 2>&1", tu_jlm(), model, text,
             pool ? "--pooling " : "", pool ? pool : "");
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    json_t *j = parse(o);
    cr_assert(json_is_array(j) && json_array_size(j) > 0, "%s", o);
    *n = json_array_size(j);
    float *v = malloc(*n * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (float)json_number_value(json_array_get(j, i));
    json_decref(j);
    free(o);
    return v;
}

static void expect_vec(const json_t *got, const float *want, size_t n, double tol, const char *what)
{
    cr_assert_eq(json_array_size(got), n, "%s: %zu floats, expected %zu", what, json_array_size(got), n);
    double norm = 0;
    for (size_t i = 0; i < n; i++) {
        double g = json_number_value(json_array_get(got, i));
        cr_assert(fabs(g - want[i]) <= tol, "%s[%zu]: %.9g vs jlm run's %.9g", what, i, g, (double)want[i]);
        norm += g * g;
    }
    cr_assert(fabs(norm - 1.0) < 1e-4, "%s is L2-normalised (%g)", what, norm);
}

/* /v1/embeddings and /api/embed equal `jlm run --embeddings` to 1e-5 on
 * two models (llama and gemma3 architectures), mean and last pooling, text
 * and token-id inputs, float and base64; several inputs in one request. */
Test(serve_apis, embeddings_equal_jlm_run_embeddings_on_two_models, .timeout = 240)
{
    srv s = {0};
    s.dir = tu_tmpdir();
    s.model = convert_to("stories260K.gguf", s.dir, "stories.jlm");
    char *gemma = convert_to("synth-gemma3-256.Q8_0.gguf", s.dir, "gemma.jlm");
    const char *args[] = {gemma, NULL};
    srv_start(&s, args);
    const char *texts[] = {"Once upon a time", "The cat sat"};
    const char *models[][2] = {{"stories", s.model}, {"gemma", gemma}};
    for (int mi = 0; mi < 2; mi++)
        for (int last = 0; last < 2; last++) {
            size_t n0, n1;
            float *w0 = run_embedding(models[mi][1], texts[0], last ? "last" : NULL, &n0);
            float *w1 = run_embedding(models[mi][1], texts[1], last ? "last" : NULL, &n1);
            char body[512], *r = NULL, what[96];
            snprintf(body, sizeof body, "{\"model\": \"%s\", \"input\": [\"%s\", \"%s\"]%s}", models[mi][0], texts[0],
                     texts[1], last ? ", \"pooling\": \"last\"" : "");
            cr_assert_eq(http(&s, "POST", "/v1/embeddings", body, NULL, &r), 200, "%s", r);
            json_t *j = parse(r), *d = json_object_get(j, "data");
            cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
            cr_assert_eq(json_array_size(d), 2, "%s", r);
            cr_assert_eq(json_integer_value(json_object_get(json_array_get(d, 1), "index")), 1);
            cr_assert(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")) > 2, "%s", r);
            snprintf(what, sizeof what, "%s %s input 0", models[mi][0], last ? "last" : "mean");
            expect_vec(json_object_get(json_array_get(d, 0), "embedding"), w0, n0, 1e-5, what);
            snprintf(what, sizeof what, "%s %s input 1", models[mi][0], last ? "last" : "mean");
            expect_vec(json_object_get(json_array_get(d, 1), "embedding"), w1, n1, 1e-5, what);
            json_decref(j);
            free(r);
            if (!last) {   /* ollama's /api/embed, with the :latest tag */
                snprintf(body, sizeof body, "{\"model\": \"%s:latest\", \"input\": [\"%s\", \"%s\"]}", models[mi][0],
                         texts[0], texts[1]);
                cr_assert_eq(http(&s, "POST", "/api/embed", body, NULL, &r), 200, "%s", r);
                j = parse(r);
                json_t *e = json_object_get(j, "embeddings");
                expect_vec(json_array_get(e, 0), w0, n0, 1e-5, "/api/embed 0");
                expect_vec(json_array_get(e, 1), w1, n1, 1e-5, "/api/embed 1");
                cr_assert(json_integer_value(json_object_get(j, "prompt_eval_count")) > 2, "%s", r);
                json_decref(j);
                free(r);
            }
            free(w0); free(w1);
        }
    /* token ids: the ids jlm tokenize gives for the text, and base64 */
    size_t n;
    float *w = run_embedding(s.model, texts[0], NULL, &n);
    char cmd[2048], *ids = NULL, body[1024], *r = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s -p '%s' -n 0 --print-ids -t 1 2>/dev/null", tu_jlm(), s.model, texts[0]);
    cr_assert_eq(tu_run(cmd, &ids), 0, "%s", ids);
    json_t *pj = parse(ids), *prompt = json_object_get(pj, "prompt");
    cr_assert(json_is_array(prompt), "--print-ids gives the prompt ids: %s", ids);
    char *pl = json_dumps(prompt, JSON_COMPACT);
    snprintf(body, sizeof body, "{\"model\": \"stories\", \"input\": %s}", pl);
    cr_assert_eq(http(&s, "POST", "/v1/embeddings", body, NULL, &r), 200, "%s", r);
    json_t *j = parse(r);
    expect_vec(json_object_get(json_array_get(json_object_get(j, "data"), 0), "embedding"), w, n, 1e-5, "token ids");
    json_decref(j);
    free(r);
    snprintf(body, sizeof body, "{\"model\": \"stories\", \"input\": \"%s\", \"encoding_format\": \"base64\"}", texts[0]);
    cr_assert_eq(http(&s, "POST", "/v1/embeddings", body, NULL, &r), 200, "%s", r);
    j = parse(r);
    const char *b64 = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "embedding"));
    cr_assert(b64, "%s", r);
    snprintf(cmd, sizeof cmd, "printf '%%s' '%s' | base64 -d | od -An -v -t f4 -w4", b64);
    char *od = NULL;
    cr_assert_eq(tu_run(cmd, &od), 0, "%s", od);
    char *p = od;
    for (size_t i = 0; i < n; i++) {
        char *e;
        double x = strtod(p, &e);
        cr_assert(e != p, "float %zu of the base64 vector: %s", i, od);
        cr_assert(fabs(x - w[i]) <= 1e-5, "base64[%zu] %g vs %g", i, x, (double)w[i]);
        p = e;
    }
    free(od);
    json_decref(j);
    free(r);
    expect_error(&s, "POST", "/v1/embeddings", "{\"model\": \"stories\", \"input\": [99999999]}", NULL, 400,
                 "invalid_request_error");
    expect_error(&s, "POST", "/v1/embeddings", "{\"model\": \"stories\", \"input\": \"x\", \"dimensions\": 4}", NULL, 400,
                 "invalid_request_error");
    expect_error(&s, "POST", "/v1/embeddings", "{\"model\": \"nope\", \"input\": \"x\"}", NULL, 404, "not_found_error");
    json_decref(pj);
    free(pl); free(ids); free(w); free(gemma);
    srv_free(&s);
}

/* The event names of an SSE body, in order, joined with ','. */
static char *event_names(const char *resp)
{
    char *out = calloc(1, strlen(resp) + 1);
    for (const char *p = resp; (p = strstr(p, "event: ")); ) {
        p += 7;
        size_t n = strcspn(p, "\n");
        if (*out) strcat(out, ",");
        strncat(out, p, n);
        p += n;
    }
    return out;
}

/* The concatenated text_delta texts of an Anthropic stream. */
static char *anth_stream_text(const char *resp, json_t **delta)
{
    char *out = calloc(1, strlen(resp) + 1);
    for (const char *p = resp; (p = strstr(p, "data: ")); ) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        cr_assert(e, "every event ends with a blank line: %s", resp);
        char *ev = strndup(p, (size_t)(e - p));
        json_t *j = parse(ev);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && !strcmp(type, "content_block_delta"))
            strcat(out, json_string_value(json_object_get(json_object_get(j, "delta"), "text")));
        if (type && !strcmp(type, "message_delta") && delta)
            *delta = json_incref(j);
        json_decref(j);
        free(ev);
        p = e;
    }
    return out;
}

Test(serve_apis, anthropic_messages_equal_jlm_chat_streamed_or_not, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    char *ref = chat_reply(&s, 12), *r = NULL;
    const char *body = "{\"model\": \"stories\", \"max_tokens\": 12, \"temperature\": 0, \"messages\": [{\"role\": "
                       "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hello there\"}]}]}";
    cr_assert_eq(http(&s, "POST", "/v1/messages", body, "-H 'anthropic-version: 2023-06-01'", &r), 200, "%s", r);
    json_t *j = parse(r), *c0 = json_array_get(json_object_get(j, "content"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "message");
    cr_assert_str_eq(json_string_value(json_object_get(j, "role")), "assistant");
    cr_assert(!strncmp(json_string_value(json_object_get(j, "id")), "msg_", 4), "%s", r);
    cr_assert_str_eq(json_string_value(json_object_get(c0, "type")), "text");
    cr_assert_str_eq(json_string_value(json_object_get(c0, "text")), ref, "the message equals jlm chat's reply");
    cr_assert_str_eq(json_string_value(json_object_get(j, "stop_reason")), "max_tokens", "%s", r);
    cr_assert(json_is_null(json_object_get(j, "stop_sequence")), "%s", r);
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "output_tokens")), 12, "%s", r);
    cr_assert(json_integer_value(json_object_get(u, "input_tokens")) > 2, "%s", r);
    json_decref(j);
    free(r);
    const char *sbody = "{\"model\": \"stories\", \"max_tokens\": 12, \"temperature\": 0, \"stream\": true, "
                        "\"system\": [], \"messages\": [{\"role\": \"user\", \"content\": \"Hello there\"}]}";
    cr_assert_eq(http(&s, "POST", "/v1/messages", sbody, NULL, &r), 200, "%s", r);
    char *names = event_names(r);
    cr_assert(!strncmp(names, "message_start,content_block_start,content_block_delta,", 54), "%s", names);
    size_t nl = strlen(names);
    const char *tail = ",content_block_delta,content_block_stop,message_delta,message_stop";
    cr_assert(nl > strlen(tail) && !strcmp(names + nl - strlen(tail), tail), "the event sequence: %s", names);
    json_t *delta = NULL;
    char *t = anth_stream_text(r, &delta);
    cr_assert_str_eq(t, ref, "the streamed deltas equal jlm chat's reply");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(delta, "delta"), "stop_reason")), "max_tokens");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(delta, "usage"), "output_tokens")), 12);
    json_decref(delta);
    free(t); free(names); free(r);
    /* a stop sequence from the middle of the reply */
    size_t rl = strlen(ref);
    cr_assert(rl >= 8, "a reply to cut: '%s'", ref);
    char stop[8], sb[1024];
    snprintf(stop, sizeof stop, "%.3s", ref + rl / 2);
    const char *at = strstr(ref, stop);
    json_t *stop_j = json_string(stop);
    char *stop_q = json_dumps(stop_j, JSON_ENCODE_ANY);   /* quoted and escaped */
    snprintf(sb, sizeof sb, "{\"model\": \"stories\", \"max_tokens\": 12, \"temperature\": 0, \"stop_sequences\": "
             "[%s], \"messages\": [{\"role\": \"user\", \"content\": \"Hello there\"}]}", stop_q);
    free(stop_q);
    json_decref(stop_j);
    cr_assert_eq(http(&s, "POST", "/v1/messages", sb, NULL, &r), 200, "%s", r);
    j = parse(r);
    cr_assert_str_eq(json_string_value(json_object_get(j, "stop_reason")), "stop_sequence", "%s", r);
    cr_assert_str_eq(json_string_value(json_object_get(j, "stop_sequence")), stop, "%s", r);
    const char *got = json_string_value(json_object_get(json_array_get(json_object_get(j, "content"), 0), "text"));
    cr_assert(got && strlen(got) == (size_t)(at - ref) && !strncmp(got, ref, strlen(got)),
              "the text ends before '%s': %s", stop, r);
    json_decref(j);
    free(r);
    /* errors in Anthropic's shape */
    const char *bad[][2] = {
        {"{\"model\": \"stories\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "max_tokens"},
        {"{\"model\": \"stories\", \"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
         "\"image\", \"source\": {}}]}]}", "image"},
        {"{\"model\": \"nope\", \"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "nope"},
        {"not json", "JSON"},
    };
    for (int i = 0; i < 4; i++) {
        int st = http(&s, "POST", "/v1/messages", bad[i][0], NULL, &r);
        cr_assert_eq(st, i == 2 ? 404 : 400, "%s: %d %s", bad[i][0], st, r);
        j = parse(r);
        cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "error", "%s", r);
        json_t *e = json_object_get(j, "error");
        cr_assert_str_eq(json_string_value(json_object_get(e, "type")),
                         i == 2 ? "not_found_error" : "invalid_request_error", "%s", r);
        cr_assert(strstr(json_string_value(json_object_get(e, "message")), bad[i][1]), "%s", r);
        json_decref(j);
        free(r);
    }
    free(ref);
    srv_free(&s);
}

/* Every NDJSON line of an ollama stream parsed; their texts concatenated;
 * *last: the last object (done: true). */
static char *ndjson_text(const char *resp, const char *field, json_t **last)
{
    char *out = calloc(1, strlen(resp) + 1);
    int done = 0;
    for (const char *p = resp; *p; ) {
        const char *e = strchr(p, '\n');
        cr_assert(e, "every object ends with a newline: %s", resp);
        cr_assert(!done, "nothing after the done object: %s", resp);
        char *l = strndup(p, (size_t)(e - p));
        json_t *j = parse(l);
        json_t *t = !strcmp(field, "response") ? json_object_get(j, "response")
                                               : json_object_get(json_object_get(j, "message"), "content");
        cr_assert(json_is_string(t), "%s", l);
        strcat(out, json_string_value(t));
        done = json_is_true(json_object_get(j, "done"));
        if (done) *last = json_incref(j);
        json_decref(j);
        free(l);
        p = e + 1;
    }
    cr_assert(done, "the stream ends with done: true: %s", resp);
    return out;
}

Test(serve_apis, ollama_chat_and_generate_equal_jlm_chat_and_jlm_run, .timeout = 120)
{
    srv s = {0};
    srv_start(&s, NULL);
    char *cref = chat_reply(&s, 10), *r = NULL, *ref = jlm_run(&s, "Once upon a time", 10);
    const char *opts = "\"options\": {\"temperature\": 0, \"num_predict\": 10, \"num_ctx\": 4096, \"num_thread\": 1}";
    char body[1024];
    snprintf(body, sizeof body, "{\"model\": \"stories:latest\", \"messages\": [{\"role\": \"user\", \"content\": "
             "\"Hello there\"}], %s}", opts);
    cr_assert_eq(http(&s, "POST", "/api/chat", body, NULL, &r), 200, "%s", r);
    json_t *last = NULL;
    char *t = ndjson_text(r, "message", &last);
    cr_assert_str_eq(t, cref, "streamed (the default) /api/chat equals jlm chat");
    cr_assert_str_eq(json_string_value(json_object_get(last, "done_reason")), "length", "%s", r);
    cr_assert_eq(json_integer_value(json_object_get(last, "eval_count")), 10, "%s", r);
    cr_assert_str_eq(json_string_value(json_object_get(last, "model")), "stories", "%s", r);
    cr_assert(json_integer_value(json_object_get(last, "total_duration")) > 0, "%s", r);
    json_decref(last);
    free(t); free(r);
    snprintf(body, sizeof body, "{\"model\": \"stories\", \"stream\": false, \"messages\": [{\"role\": \"user\", "
             "\"content\": \"Hello there\"}], %s}", opts);
    cr_assert_eq(http(&s, "POST", "/api/chat", body, NULL, &r), 200, "%s", r);
    json_t *j = parse(r);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "message"), "content")), cref, "%s", r);
    cr_assert(json_is_true(json_object_get(j, "done")), "%s", r);
    json_decref(j);
    free(r);
    snprintf(body, sizeof body, "{\"model\": \"stories\", \"prompt\": \"Once upon a time\", \"raw\": true, %s}", opts);
    cr_assert_eq(http(&s, "POST", "/api/generate", body, NULL, &r), 200, "%s", r);
    t = ndjson_text(r, "response", &last);
    cr_assert_str_eq(t, ref, "raw /api/generate equals jlm run");
    json_decref(last);
    free(t); free(r);
    snprintf(body, sizeof body, "{\"model\": \"stories\", \"prompt\": \"Hello there\", \"stream\": false, %s}", opts);
    cr_assert_eq(http(&s, "POST", "/api/generate", body, NULL, &r), 200, "%s", r);
    j = parse(r);
    cr_assert_str_eq(json_string_value(json_object_get(j, "response")), cref, "templated /api/generate is a chat turn");
    json_decref(j);
    free(r);
    /* format "json": the reply is JSON (the grammar closes it within num_predict) */
    const char *fb = "{\"model\": \"stories\", \"stream\": false, \"format\": \"json\", \"messages\": [{\"role\": "
                     "\"user\", \"content\": \"Hello there\"}], \"options\": {\"num_predict\": 24, \"seed\": 7}}";
    cr_assert_eq(http(&s, "POST", "/api/chat", fb, NULL, &r), 200, "%s", r);
    j = parse(r);
    const char *content = json_string_value(json_object_get(json_object_get(j, "message"), "content"));
    json_t *fj = content ? json_loads(content, JSON_DECODE_ANY, NULL) : NULL;
    cr_assert(json_is_object(fj), "format json gives a JSON object: %s", r);
    json_decref(fj);
    json_decref(j);
    free(r);
    /* the model list, the loaded models, one model's details */
    cr_assert_eq(http(&s, "GET", "/api/tags", NULL, NULL, &r), 200, "%s", r);
    j = parse(r);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "models"), 0), "name")),
                     "stories:latest", "%s", r);
    json_decref(j);
    free(r);
    cr_assert_eq(http(&s, "GET", "/api/ps", NULL, NULL, &r), 200, "%s", r);
    cr_assert(strstr(r, "\"name\":\"stories:latest\""), "%s", r);
    free(r);
    cr_assert_eq(http(&s, "POST", "/api/show", "{\"model\": \"stories:latest\"}", NULL, &r), 200, "%s", r);
    j = parse(r);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "details"), "family")), "llama", "%s", r);
    cr_assert(json_integer_value(json_object_get(json_object_get(j, "model_info"), "llama.embedding_length")) > 0, "%s", r);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "capabilities"), 2)), "tools",
                     "the ChatML fallback renders tools: %s", r);
    json_decref(j);
    free(r);
    /* errors: {"error": message} */
    const char *bad[][4] = {
        {"/api/chat", "{\"model\": \"stories\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                      "\"options\": {\"mirostat\": 2}}", "400", "options.mirostat"},
        {"/api/chat", "{\"model\": \"stories\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                      "\"options\": {\"frobnicate\": 1}}", "400", "options.frobnicate"},
        {"/api/generate", "{\"model\": \"nope:latest\", \"prompt\": \"x\"}", "404", "nope"},
        {"/api/show", "{\"model\": \"nope\"}", "404", "nope"},
        {"/api/nothing", "{}", "404", "endpoint"},
    };
    for (int i = 0; i < 5; i++) {
        int st = http(&s, "POST", bad[i][0], bad[i][1], NULL, &r);
        cr_assert_eq(st, atoi(bad[i][2]), "%s %s: %d %s", bad[i][0], bad[i][1], st, r);
        j = parse(r);
        cr_assert(strstr(json_string_value(json_object_get(j, "error")), bad[i][3]), "%s", r);
        json_decref(j);
        free(r);
    }
    free(ref); free(cref);
    srv_free(&s);
}

/* `jlm run --embeddings`: its refusals (one line, exit 2). */
Test(serve_apis, jlm_run_embeddings_refuses_what_does_not_go_with_it, .timeout = 60)
{
    srv s = {0};
    s.dir = tu_tmpdir();
    s.model = convert_to("stories260K.gguf", s.dir, "stories.jlm");
    const char *cases[][2] = {
        {"--embeddings --pooling cls", "--pooling 'cls'"},
        {"--pooling last", "--pooling goes with --embeddings"},
        {"--embeddings --json", "--embeddings prints only the vector"},
    };
    for (int i = 0; i < 3; i++) {
        char cmd[2048], *o = NULL;
        snprintf(cmd, sizeof cmd, "%s run %s -p hi %s 2>&1", tu_jlm(), s.model, cases[i][0]);
        int rc = tu_run(cmd, &o);
        cr_assert_eq(rc, 2, "%s: exit %d: %s", cases[i][0], rc, o);
        cr_assert(strstr(o, cases[i][1]) && strchr(o, '\n') == o + strlen(o) - 1, "%s: one line: %s", cases[i][0], o);
        free(o);
    }
    tu_rmrf(s.dir);
    free(s.dir); free(s.model);
}

/* ---------------------------------------------------------------- the official clients */

/* Skips the test without node or the npm package pkg; else starts a server
 * (args) and runs `node tests/SCRIPT NODE_MODULES http://127.0.0.1:PORT/PATH
 * ARGS`, whose one line of JSON it returns (*text: that line, to print). */
static json_t *node_client(srv *s, const char *pkg, const char *const *args, const char *script, const char *path,
                           const char *cargs, char **text)
{
    char cmd[4096], *o = NULL;
    snprintf(cmd, sizeof cmd, "command -v node >/dev/null && test -f %s/%s/package.json", node_modules(), pkg);
    int ok = tu_run(cmd, &o) == 0;
    free(o);
    if (!ok)
        cr_skip_test("node or the npm package %s (%s) is absent: scripts/deps.sh installs them", pkg, node_modules());
    srv_start(s, args);
    snprintf(cmd, sizeof cmd, "node %s/tests/%s %s http://127.0.0.1:%d%s %s 2>&1", tu_root(), script, node_modules(),
             s->port, path, cargs);
    cr_assert_eq(tu_run(cmd, text), 0, "the client ran: %s", *text);
    return parse(*text);
}

Test(serve_apis, the_anthropic_npm_client_gets_what_jlm_chat_gives, .timeout = 120)
{
    srv s = {0};
    const char *args[] = {"--api-key", "test-key", NULL};
    char *out = NULL;
    json_t *j = node_client(&s, "@anthropic-ai/sdk", args, "serve_anthropic.mjs", "", "stories 12", &out);
    char *cref = chat_reply(&s, 12);
    cr_assert_str_eq(json_string_value(json_object_get(j, "message")), cref, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "stream")), cref, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "stop_reason")), "max_tokens", "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "final"), "text")), cref, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(json_object_get(j, "final"), "usage"),
                                                    "output_tokens")), 12, "%s", out);
    json_t *ref = json_object_get(j, "refused");
    cr_assert_eq(json_integer_value(json_object_get(ref, "status")), 400, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(ref, "type")), "invalid_request_error", "%s", out);
    json_decref(j);
    free(out); free(cref);
    srv_free(&s);
}

/* node serve_tools_apis.mjs MODE ARGS against s: "ok WANT" (skips without
 * node or the clients). */
static void node_tools_apis(srv *s, const char *mode, const char *args, int want)
{
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "command -v node >/dev/null && test -f %s/@anthropic-ai/sdk/package.json && "
             "test -f %s/ollama/package.json", node_modules(), node_modules());
    int ok = tu_run(cmd, &out) == 0;
    free(out);
    if (!ok)
        cr_skip_test("node or the npm clients are absent (%s): scripts/deps.sh installs them", node_modules());
    node_check(s, "serve_tools_apis.mjs", "", mode, args, want);
}

/* Fixed outputs of five families (tests/toolcall/cases.json: Hermes with
 * text before its calls, the ChatML fallback, Llama 3, Mistral v11,
 * gpt-oss with and without a call), forced with a grammar under each
 * family's template: Anthropic's tool_use blocks (whole, and the SDK's
 * assembly of the stream) and ollama's message.tool_calls (whole and
 * streamed) equal the case's calls. */
Test(serve_apis, tool_use_blocks_and_ollama_tool_calls_of_fixed_outputs_whole_and_streamed, .timeout = 600)
{
    static const struct { const char *tmpl, *cases; int n; } groups[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", "0", 1},
        {NULL, "1", 1},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", "2", 1},
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", "5", 1},
        {"openai-gpt-oss-120b.jinja", "6,7", 2},
    };
    char path[1100], file[1100], args[1400];
    snprintf(path, sizeof path, "%s/tests/toolcall/cases.json", tu_root());
    srv s = {0};
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
        snprintf(file, sizeof file, "%s/tests/reference/chat-templates/%s", tu_root(), groups[g].tmpl ? groups[g].tmpl : "");
        const char *with[] = {"-c", "4096", "--chat-template-file", file, NULL};
        if (!groups[g].tmpl) with[2] = NULL;
        srv_start(&s, with);
        snprintf(args, sizeof args, "%s %s", path, groups[g].cases);
        node_tools_apis(&s, "fixed", args, 4 * groups[g].n);
        cr_assert_eq(srv_stop(&s), 0, "the server exits 0 (see %s/server.log)", s.dir);
    }
    srv_free(&s);
}

/* tool_choice any / tool (a name) on /v1/messages with the random model:
 * always one tool_use of an allowed tool, whole and streamed. */
Test(serve_apis, anthropic_tool_choice_any_and_tool_always_give_one_tool_use, .timeout = 600)
{
    srv s = {0};
    const char *with[] = {"-c", "2048", NULL};
    srv_start(&s, with);
    node_tools_apis(&s, "forced", "3", 3 * 3 * 2);
    srv_free(&s);
}

/* A turn after a call (assistant tool_use + user tool_result on Anthropic,
 * tool_calls + a tool message on ollama) renders as the equivalent OpenAI
 * request does: the same prompt tokens and the same greedy reply, through
 * a template that renders tools and results (Qwen 2.5); without the tool
 * turn the prompt is shorter. */
Test(serve_apis, a_tool_result_turn_renders_as_the_equivalent_openai_request, .timeout = 120)
{
    char file[1100];
    snprintf(file, sizeof file, "%s/tests/reference/chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja", tu_root());
    const char *with[] = {"-c", "4096", "--chat-template-file", file, NULL};
    srv s = {0};
    srv_start(&s, with);
#define SCHEMA "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}"
    const char *openai =
        "{\"model\": \"stories\", \"max_tokens\": 8, \"temperature\": 0, \"tools\": [{\"type\": \"function\", "
        "\"function\": {\"name\": \"get_weather\", \"description\": \"The weather\", \"parameters\": " SCHEMA "}}], "
        "\"messages\": [{\"role\": \"system\", \"content\": \"You help.\"}, {\"role\": \"user\", \"content\": "
        "\"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": \"Checking.\", \"tool_calls\": [{\"id\": "
        "\"abc123def\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
        "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"abc123def\", \"content\": "
        "\"sunny, 21 C\"}, {\"role\": \"user\", \"content\": \"And tomorrow?\"}]}";
    const char *anth =
        "{\"model\": \"stories\", \"max_tokens\": 8, \"temperature\": 0, \"system\": \"You help.\", \"tools\": [{\"name\": "
        "\"get_weather\", \"description\": \"The weather\", \"input_schema\": " SCHEMA "}], \"messages\": [{\"role\": "
        "\"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"text\", "
        "\"text\": \"Checking.\"}, {\"type\": \"tool_use\", \"id\": \"abc123def\", \"name\": \"get_weather\", \"input\": "
        "{\"city\": \"Paris\"}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": "
        "\"abc123def\", \"content\": [{\"type\": \"text\", \"text\": \"sunny, 21 C\"}]}, {\"type\": \"text\", \"text\": "
        "\"And tomorrow?\"}]}]}";
    const char *ollama =
        "{\"model\": \"stories:latest\", \"stream\": false, \"options\": {\"temperature\": 0, \"num_predict\": 8}, "
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather\", "
        "\"parameters\": " SCHEMA "}}], \"messages\": [{\"role\": \"system\", \"content\": \"You help.\"}, {\"role\": "
        "\"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": \"Checking.\", "
        "\"tool_calls\": [{\"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, "
        "{\"role\": \"tool\", \"content\": \"sunny, 21 C\", \"tool_name\": \"get_weather\"}, {\"role\": \"user\", "
        "\"content\": \"And tomorrow?\"}]}";
    const char *short_ =
        "{\"model\": \"stories\", \"max_tokens\": 8, \"temperature\": 0, \"system\": \"You help.\", \"tools\": [{\"name\": "
        "\"get_weather\", \"description\": \"The weather\", \"input_schema\": " SCHEMA "}], \"messages\": [{\"role\": "
        "\"user\", \"content\": \"And tomorrow?\"}]}";
#undef SCHEMA
    char *r = NULL;
    cr_assert_eq(http(&s, "POST", "/v1/chat/completions", openai, NULL, &r), 200, "%s", r);
    json_t *o = parse(r);
    free(r);
    json_int_t n = json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens"));
    const char *text = json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                                                                         "message"), "content"));
    cr_assert_eq(http(&s, "POST", "/v1/messages", anth, NULL, &r), 200, "%s", r);
    json_t *a = parse(r);
    free(r);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(a, "usage"), "input_tokens")), n,
                 "Anthropic's prompt is OpenAI's (%lld tokens)", (long long)n);
    const char *atext = json_string_value(json_object_get(json_array_get(json_object_get(a, "content"), 0), "text"));
    cr_assert_str_eq(atext ? atext : "", text ? text : "", "the same greedy reply");
    cr_assert_eq(http(&s, "POST", "/api/chat", ollama, NULL, &r), 200, "%s", r);
    json_t *l = parse(r);
    free(r);
    cr_assert_eq(json_integer_value(json_object_get(l, "prompt_eval_count")), n, "ollama's prompt is OpenAI's (%lld tokens)",
                 (long long)n);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(l, "message"), "content")), text ? text : "",
                     "the same greedy reply");
    cr_assert_eq(http(&s, "POST", "/v1/messages", short_, NULL, &r), 200, "%s", r);
    json_t *sh = parse(r);
    free(r);
    cr_assert_lt(json_integer_value(json_object_get(json_object_get(sh, "usage"), "input_tokens")) + 20, n,
                 "the tool turn is rendered");
    json_decref(o);
    json_decref(a);
    json_decref(l);
    json_decref(sh);
    srv_free(&s);
}

Test(serve_apis, the_ollama_npm_client_gets_what_jlm_run_gives, .timeout = 120)
{
    srv s = {0};
    char *out = NULL;
    json_t *j = node_client(&s, "ollama", NULL, "serve_ollama.mjs", "", "stories 'Once upon a time' 10", &out);
    char *cref = chat_reply(&s, 10), *ref = jlm_run(&s, "Once upon a time", 10);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "tags"), 0)), "stories:latest", "%s", out);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "ps"), 0)), "stories:latest", "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "chat")), cref, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "chat_stream")), cref, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "generate")), ref, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "generate_stream")), ref, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "done_reason")), "length", "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(j, "eval_count")), 10, "%s", out);
    size_t n;
    float *w = run_embedding(s.model, "Once upon a time", NULL, &n);
    expect_vec(json_array_get(json_object_get(j, "embed"), 0), w, n, 1e-5, "ollama client embed");
    json_t *ref400 = json_object_get(j, "refused");
    cr_assert_eq(json_integer_value(json_object_get(ref400, "status")), 400, "%s", out);
    cr_assert(strstr(json_string_value(json_object_get(ref400, "error")), "options.mirostat"), "%s", out);
    json_decref(j);
    free(w); free(out); free(cref); free(ref);
    srv_free(&s);
}

Test(serve_apis, the_openai_npm_client_gets_the_embeddings_of_jlm_run, .timeout = 120)
{
    srv s = {0};
    char *out = NULL;
    json_t *j = node_client(&s, "openai", NULL, "serve_openai_embed.mjs", "/v1", "stories 'Once upon a time'", &out);
    size_t n0, n1;
    float *w0 = run_embedding(s.model, "Once upon a time", NULL, &n0), *w1 = run_embedding(s.model, "Hello there", NULL, &n1);
    expect_vec(json_array_get(json_object_get(j, "b64"), 0), w0, n0, 1e-5, "client base64 0");
    expect_vec(json_array_get(json_object_get(j, "b64"), 1), w1, n1, 1e-5, "client base64 1");
    expect_vec(json_array_get(json_object_get(j, "float"), 0), w0, n0, 1e-5, "client float");
    json_decref(j);
    free(w0); free(w1); free(out);
    srv_free(&s);
}

/* An oracle for jlm_engine_embed that does not go through it: the logits
 * after a prefix are W h (W the GGUF's output matrix, dequantized by the
 * converter's ggml reference; h the final hidden state after the output
 * norm), so the last-pooled embedding e of that prefix must satisfy
 * logits = c * W e with c = |h| > 0 for every vocab row; and the mean-pooled
 * embedding of the whole prompt is the normalised sum of c_t e_t over its
 * prefixes t. On stories260K, whose logits match llama.cpp's oracle. */
#include "converter/gguf.h"

Test(serve_apis, embeddings_are_the_final_hidden_states_the_logits_come_from, .timeout = 120)
{
    char *dir = tu_tmpdir();
    char *path = convert_to("stories260K.gguf", dir, "stories.jlm");
    jlm_err err = {0};
    jlm_gguf *g = NULL;
    cr_assert_eq(jlm_gguf_open(tu_model("stories260K.gguf"), &g, &err), 0, "%s", err.msg);
    const jlm_gguf_tensor *t = jlm_gguf_find_tensor(g, "output.weight");
    if (!t) t = jlm_gguf_find_tensor(g, "token_embd.weight");   /* tied */
    cr_assert(t);
    uint64_t E = t->ne[0], V = t->ne[1];
    void *raw = malloc(t->n_bytes);
    float *W = malloc(E * V * sizeof *W);
    cr_assert_eq(jlm_gguf_read(g, t, 0, raw, t->n_bytes, &err), 0, "%s", err.msg);
    for (uint64_t r = 0; r < V; r++)
        cr_assert_eq(jlm_ggml_dequant_row(t->type, (const uint8_t *)raw + r * (t->n_bytes / V), W + r * E, E, &err), 0);
    jlm_engine_opts o = {.n_threads = 1, .quiet = 1};
    jlm_engine *e = NULL;
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_engine_n_embd(e), E);
    cr_assert_eq(jlm_engine_n_vocab(e), V);
    const int32_t toks[] = {1, 403, 407, 261, 378, 117, 287};   /* BOS and some ids below its 512 */
    const uint32_t n = sizeof toks / sizeof toks[0];
    float *logits = malloc(V * sizeof *logits), *emb = malloc(E * sizeof *emb), *mean = malloc(E * sizeof *mean);
    double *sum = calloc(E, sizeof *sum);
    for (uint32_t p = 1; p <= n; p++) {
        jlm_engine_rewind(e, 0);
        cr_assert_eq(jlm_engine_eval(e, toks, p, logits, &err), 0, "%s", err.msg);
        jlm_engine_rewind(e, 0);
        cr_assert_eq(jlm_engine_embed(e, NULL, toks, p, 1, emb, &err), 0, "%s", err.msg);
        /* c by least squares over the vocab, then every row within 1e-4 of the largest logit */
        double zz = 0, zl = 0, big = 0;
        float *z = malloc(V * sizeof *z);
        for (uint64_t r = 0; r < V; r++) {
            double d = 0;
            for (uint64_t k = 0; k < E; k++) d += (double)W[r * E + k] * emb[k];
            z[r] = (float)d;
            zz += d * d; zl += d * logits[r];
            if (fabs(logits[r]) > big) big = fabs(logits[r]);
        }
        double c = zl / zz, worst = 0;
        for (uint64_t r = 0; r < V; r++)
            if (fabs(logits[r] - c * z[r]) > worst) worst = fabs(logits[r] - c * z[r]);
        cr_assert(c > 0 && worst <= 1e-4 * big, "prefix %u: logits = %g * W e off by %g (largest logit %g)", p, c, worst, big);
        for (uint64_t k = 0; k < E; k++) sum[k] += c * emb[k];
        free(z);
    }
    jlm_engine_rewind(e, 0);
    cr_assert_eq(jlm_engine_embed(e, NULL, toks, n, 0, mean, &err), 0, "%s", err.msg);
    double norm = 0;
    for (uint64_t k = 0; k < E; k++) norm += sum[k] * sum[k];
    for (uint64_t k = 0; k < E; k++)
        cr_assert(fabs(sum[k] / sqrt(norm) - mean[k]) <= 1e-5, "mean[%llu]: %g vs the prefixes' %g",
                  (unsigned long long)k, (double)mean[k], sum[k] / sqrt(norm));
    jlm_engine_close(e);
    jlm_gguf_close(g);
    free(raw); free(W); free(logits); free(emb); free(mean); free(sum); free(path);
    tu_rmrf(dir);
    free(dir);
}

/* llama.cpp's llama-embedding (b10359, recorded by scripts/embed-reference.sh
 * into tests/reference/embeddings-MODEL.json with its command lines) on the
 * same GGUF and prompt: jlm run --embeddings agrees to cosine >= 0.999, mean
 * and last pooling, on the llama and gemma3 test models. */
Test(serve_apis, jlm_run_embeddings_agree_with_llama_embedding, .timeout = 120)
{
    char *dir = tu_tmpdir();
    const char *models[] = {"stories260K", "synth-gemma3-256.Q8_0"};
    for (int mi = 0; mi < 2; mi++) {
        char gguf[256], ref[1100], name[300];
        snprintf(gguf, sizeof gguf, "%s.gguf", models[mi]);
        snprintf(name, sizeof name, "%s.jlm", models[mi]);
        snprintf(ref, sizeof ref, "%s/tests/reference/embeddings-%s.json", tu_root(), models[mi]);
        char *model = convert_to(gguf, dir, name);
        json_error_t je;
        json_t *j = json_load_file(ref, 0, &je), *runs = json_object_get(j, "runs"), *run;
        cr_assert(json_array_size(runs) == 4, "%s: %s", ref, je.text);
        size_t i;
        json_array_foreach(runs, i, run) {
            const char *pool = json_string_value(json_object_get(run, "pooling"));
            const char *prompt = json_string_value(json_object_get(run, "prompt"));
            json_t *want = json_object_get(run, "embedding");
            size_t n;
            float *got = run_embedding(model, prompt, pool, &n);
            cr_assert_eq(n, json_array_size(want), "%s %s: width %zu vs llama.cpp's %zu", models[mi], pool, n,
                         json_array_size(want));
            double dot = 0, ng = 0, nw = 0;
            for (size_t k = 0; k < n; k++) {
                double w = json_number_value(json_array_get(want, k));
                dot += w * got[k]; ng += (double)got[k] * got[k]; nw += w * w;
            }
            double cos = dot / sqrt(ng * nw);
            cr_assert(cos >= 0.999, "%s, %s pooling, '%s': cosine %.6f with llama-embedding's", models[mi], pool, prompt, cos);
            cr_log_info("%s %s '%s': cosine %.6f", models[mi], pool, prompt, cos);
            free(got);
        }
        json_decref(j);
        free(model);
    }
    tu_rmrf(dir);
    free(dir);
}
