/* model_split.c - the device split's lists (model.h, jlm_engine_split):
 * `--backend cuda,vulkan` names up to two device backends in block order and
 * `--device 0,llvmpipe` their devices. Parsed here once, for the engine
 * (model.c opens the devices) and for the CLI's check before any work
 * (cli/opts.c), so both refuse the same lists with the same line. Which
 * blocks each device runs is jlm_engine_opts' gpu_layers / gpu_layers2. */
#include "engine/model.h"

#include <string.h>

/* "vulkan" / "cuda" for the entry [s, s + n), else NULL. */
static const char *device_kind(const char *s, size_t n)
{
    if (n == 6 && !memcmp(s, "vulkan", 6))
        return "vulkan";
    if (n == 4 && !memcmp(s, "cuda", 4))
        return "cuda";
    return NULL;
}

static int split_devices(const char *device, jlm_engine_split *sp, jlm_err *err)
{
    if (!device || !sp->n)
        return JLM_OK;
    if (sp->n < 2) {   /* one backend: the whole string, as before the lists */
        if (strlen(device) >= sizeof sp->device[0])
            return jlm_errf(err, JLM_EINVAL, "--device '%.40s...': longer than any device name", device);
        strcpy(sp->device[0], device);
        return JLM_OK;
    }
    const char *p = device;
    for (int i = 0; ; i++) {
        size_t n = strcspn(p, ",");
        if (i == sp->n)
            return jlm_errf(err, JLM_EINVAL, "--device '%.80s': more entries than the %d device backends of "
                                             "--backend (one per device, in its order)", device, sp->n);
        if (n >= sizeof sp->device[i])
            return jlm_errf(err, JLM_EINVAL, "--device '%.40s...': an entry longer than any device name", device);
        memcpy(sp->device[i], p, n);
        sp->device[i][n] = 0;
        if (!p[n])
            return JLM_OK;
        p += n + 1;
    }
}

int jlm_engine_split_parse(const char *backend, const char *device, jlm_engine_split *out, jlm_err *err)
{
    jlm_engine_split sp;
    memset(&sp, 0, sizeof sp);
    if (backend && !strcmp(backend, "auto")) {
        sp.n = sp.is_auto = 1;
        sp.kind[0] = "vulkan";
    } else if (backend && strcmp(backend, "cpu")) {
        const char *p = backend;
        for (;;) {
            size_t n = strcspn(p, ",");
            const char *k = device_kind(p, n);
            if (!k && !strchr(backend, ','))
                return jlm_errf(err, JLM_EINVAL, "--backend '%.80s': unknown backend: expected cpu, vulkan, cuda "
                                                 "or auto (or two devices: cuda,vulkan or vulkan,cuda)", backend);
            if (!n)
                return jlm_errf(err, JLM_EINVAL, "--backend '%.80s': an empty entry (cuda,vulkan or vulkan,cuda)",
                                backend);
            if (!k)
                return jlm_errf(err, JLM_EINVAL, "--backend '%.80s': '%.*s' in a list: a list names two device "
                                                 "backends, cuda,vulkan or vulkan,cuda (auto and cpu stand alone)",
                                backend, (int)(n < 20 ? n : 20), p);
            if (sp.n == JLM_ENGINE_DEVS)
                return jlm_errf(err, JLM_EINVAL, "--backend '%.80s': more than %d device backends (cuda,vulkan or "
                                                 "vulkan,cuda)", backend, JLM_ENGINE_DEVS);
            for (int i = 0; i < sp.n; i++)
                if (sp.kind[i] == k)
                    return jlm_errf(err, JLM_EINVAL, "--backend '%.80s': %s twice: a list names two different "
                                                     "device backends (cuda,vulkan or vulkan,cuda)", backend, k);
            sp.kind[sp.n++] = k;
            if (!p[n])
                break;
            p += n + 1;
        }
    }
    int rc = split_devices(device, &sp, err);
    if (!rc)
        *out = sp;
    return rc;
}
