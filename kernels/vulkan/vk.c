/* vk.c - the Vulkan compute layer (vk.h): device choice, buffers, pipelines
 * and synchronous dispatch. Without JLM_HAVE_VULKAN (no headers or no glslc at
 * build time) every entry point reports "built without Vulkan". */
#include "kernels/vulkan/vk.h"

#include "kernels/layout.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernels' type codes are the container's (kernels/layout.h). */
#define TYPE_CODE_(name, code) _Static_assert(JLM_T_##name == code, "kernels/layout.h: JLM_KT_" #name);
JLM_KT_LIST(TYPE_CODE_)
#undef TYPE_CODE_

#ifdef JLM_HAVE_VULKAN

#include <vulkan/vulkan.h>

/* ---------------------------------------------------------------- embedded SPIR-V */

static const uint32_t SPV_MATVEC[] =
#include "kernels/vulkan/matvec.spv.h"
;
static const uint32_t SPV_RMSNORM[] =
#include "kernels/vulkan/rmsnorm.spv.h"
;
static const uint32_t SPV_SOFTMAX[] =
#include "kernels/vulkan/softmax.spv.h"
;
static const uint32_t SPV_ELTWISE[] =
#include "kernels/vulkan/eltwise.spv.h"
;
static const uint32_t SPV_ROPE[] =
#include "kernels/vulkan/rope.spv.h"
;
static const uint32_t SPV_ATTENTION[] =
#include "kernels/vulkan/attention.spv.h"
;
static const uint32_t SPV_LAYERNORM[] =
#include "kernels/vulkan/layernorm.spv.h"
;
static const uint32_t SPV_MOE_ROUTE[] =
#include "kernels/vulkan/moe_route.spv.h"
;
static const uint32_t SPV_MOE_COMBINE[] =
#include "kernels/vulkan/moe_combine.spv.h"
;
static const uint32_t SPV_QUANTIZE[] =
#include "kernels/vulkan/quantize.spv.h"
;
static const uint32_t SPV_KV_Q8[] =
#include "kernels/vulkan/kv_q8.spv.h"
;

enum { K_MATVEC, K_RMSNORM, K_SOFTMAX, K_ELTWISE, K_ROPE, K_ATTENTION, K_LAYERNORM, K_MOE_ROUTE, K_MOE_COMBINE, K_QUANTIZE, K_KV_Q8,
       K_COUNT };
#define NBIND    8     /* every pipeline: bindings 0..7 (unused ones get a dummy) */
#define NSPEC    (sizeof(jlm_spec_matvec) / 4)   /* matvec.comp's specialization constants (kernels/layout.h) */
/* Tokens per invocation of a matmul of several tokens (matvec.comp's NT): the
 * row's weights are read and decoded once per tile. 8 keeps a tile's sums and
 * one sub-block's codes (40 words) in registers on a GPU. */
#define MV_TILE  8
/* Descriptor sets a recording holds before it is submitted and begun again
 * (jlm_vk_rec_begin; a decoded token of a small model records ~15 a block). */
#define REC_SETS 256
/* Timestamps one command buffer holds (jlm_vk_time): a stamp per op class
 * change, so a token of a large model fits; past it, the rest of the buffer
 * counts to the last stamp's tag. */
#define TS_MAX   4096
#define TS_RESET 64     /* queries reset at a time, as the stamps reach them */

static const struct { const uint32_t *code; size_t size; } SPV[K_COUNT] = {
    [K_MATVEC] = {SPV_MATVEC, sizeof SPV_MATVEC},
    [K_RMSNORM] = {SPV_RMSNORM, sizeof SPV_RMSNORM},
    [K_SOFTMAX] = {SPV_SOFTMAX, sizeof SPV_SOFTMAX},
    [K_ELTWISE] = {SPV_ELTWISE, sizeof SPV_ELTWISE},
    [K_ROPE] = {SPV_ROPE, sizeof SPV_ROPE},
    [K_ATTENTION] = {SPV_ATTENTION, sizeof SPV_ATTENTION},
    [K_LAYERNORM] = {SPV_LAYERNORM, sizeof SPV_LAYERNORM},
    [K_MOE_ROUTE] = {SPV_MOE_ROUTE, sizeof SPV_MOE_ROUTE},
    [K_MOE_COMBINE] = {SPV_MOE_COMBINE, sizeof SPV_MOE_COMBINE},
    [K_QUANTIZE] = {SPV_QUANTIZE, sizeof SPV_QUANTIZE},
    [K_KV_Q8] = {SPV_KV_Q8, sizeof SPV_KV_Q8},
};

struct jlm_vk_buf {
    VkBuffer       buf;
    VkDeviceMemory mem;
    uint64_t       size;
    void          *map;        /* NULL: device-local, written by jlm_vk_buf_write */
    int            imported;   /* memory is the caller's host pages (VK_EXT_external_memory_host) */
};

struct jlm_vk {
    VkInstance            inst;
    VkPhysicalDevice      phys;
    VkDevice              dev;
    VkQueue               queue;
    uint32_t              qfam;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    VkDescriptorSetLayout dsl;
    VkPipelineLayout      layout;
    VkPipeline            pipe[K_COUNT];   /* pipe[K_MATVEC] unused: see mv */
    VkPipeline            mv[JLM_T_COUNT][2]; /* matvec per stored type: one token, a tile of MV_TILE; made on first use */
    VkDescriptorPool      pool;
    VkCommandPool         cmdpool;
    VkCommandBuffer       cmd;
    VkFence               fence;
    jlm_vk_buf           *dummy, *tmp;   /* dummy: unused bindings; tmp: small uploads (an arena) */
    jlm_vk_buf           *gelu_tab;      /* jlm_vk_geglu_fp16's table (65536 floats), made on first use */
    uint64_t              tmp_off;       /* tmp's bytes in use by the commands not yet waited for */
    int                   rec;           /* jlm_vk_rec_begin: dispatches are recorded, not submitted */
    uint32_t              rec_sets;      /* descriptor sets allocated since the last submit */
    uint64_t              submits;       /* command buffers submitted and waited for */
    uint64_t              dispatches;    /* kernel dispatches and device copies recorded */
    jlm_vk_buf           *staging;       /* jlm_vk_buf_write's host-visible bounce buffer */
    uint64_t              max_binding;   /* maxStorageBufferRange, or JLM_VK_MAX_BINDING's lower value */
    int                   untiled;       /* JLM_VK_MATMUL_TILE=1: a matmul reads its weights once per token */
    int                   has_import;    /* VK_EXT_external_memory_host enabled */
    int                   has_f64;       /* shaderFloat64 enabled: quantize.comp's pipeline exists */
    uint64_t              import_align;  /* minImportedHostPointerAlignment */
    PFN_vkGetMemoryHostPointerPropertiesEXT host_ptr_props;
    /* timing (jlm_vk_time): a timestamp at each tag change, read back at
     * each submit; off: no query is ever recorded */
    uint32_t              ts_bits;       /* the queue family's timestampValidBits (0: no timestamps) */
    VkQueryPool           qpool;         /* TS_MAX timestamps, made at the first jlm_vk_time */
    int                   ts_on;         /* jlm_vk_time on */
    int                   ts_live;       /* the open command buffer reset the pool and stamps */
    int                   ts_tag;        /* the tag the next commands count to */
    uint32_t              ts_n;          /* stamps in the open command buffer */
    uint8_t               ts_of[TS_MAX]; /* each stamp's tag */
    uint64_t              ts_ns[JLM_VK_TAGS];
};

static int vkfail(jlm_err *err, const char *what, VkResult r)
{
    return jlm_errf(err, r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY
                             ? JLM_ENOMEM : JLM_EUNSUPPORTED,
                    "vulkan: %s failed (VkResult %d)", what, (int)r);
}

int jlm_vk_built(void) { return 1; }

static const char *dev_type(VkPhysicalDeviceType t)
{
    return t == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU ? "discrete" : t == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? "integrated"
         : t == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU ? "virtual" : t == VK_PHYSICAL_DEVICE_TYPE_CPU ? "cpu" : "other";
}

/* One VkInstance per process, made on first use and never destroyed: the
 * instance is cheap to keep, and destroying it unloads the driver, whose
 * allocations (lavapipe's: 128 bytes per instance) then read as leaks under
 * LeakSanitizer (make debug). Devices are still opened and closed per jlm_vk. */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static VkInstance g_inst = VK_NULL_HANDLE;
static VkResult g_inst_rc = VK_ERROR_INITIALIZATION_FAILED;

static void make_instance(void)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "jlm",
                             .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    g_inst_rc = vkCreateInstance(&ci, NULL, &g_inst);
    if (g_inst_rc != VK_SUCCESS)
        g_inst = VK_NULL_HANDLE;
}

static VkInstance instance(void)
{
    pthread_once(&g_once, make_instance);
    return g_inst;
}

int jlm_vk_list_devices(char names[][128], int max)
{
    VkInstance inst = instance();
    if (!inst)
        return -1;
    VkPhysicalDevice devs[16];
    uint32_t n = 16;
    if (vkEnumeratePhysicalDevices(inst, &n, devs) < 0)
        n = 0;
    int k = 0;
    for (uint32_t i = 0; i < n && k < max; i++, k++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(devs[i], &p);
        snprintf(names[k], 128, "%u: %.96s (%s)", i, p.deviceName, dev_type(p.deviceType));
    }
    return k;
}

/* ---------------------------------------------------------------- device choice */

static int has_compute_queue(VkPhysicalDevice p, uint32_t *fam, uint32_t *ts_bits)
{
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(p, &n, NULL);
    VkQueueFamilyProperties q[16];
    if (n > 16)
        n = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(p, &n, q);
    for (uint32_t i = 0; i < n; i++)
        if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *fam = i;
            *ts_bits = q[i].timestampValidBits;
            return 1;
        }
    return 0;
}

/* Index of the device named by want (index or name substring), or the first
 * acceptable GPU; -1 with err set if none. */
static int pick_device(VkPhysicalDevice *devs, uint32_t n, const char *want, int allow_cpu,
                       jlm_err *err)
{
    char seen[512] = "";
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(devs[i], &p);
        size_t l = strlen(seen);
        snprintf(seen + l, sizeof seen - l, "%s%u: %s", i ? ", " : "", i, p.deviceName);
        if (want && *want) {
            char *end;
            unsigned long idx = strtoul(want, &end, 10);
            if ((*end == 0 && idx == i) || (*end != 0 && strstr(p.deviceName, want)))
                return (int)i;
            continue;
        }
        if (p.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU || allow_cpu)
            return (int)i;
    }
    if (want && *want)
        jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: no device matches '%s' (found %s)", want,
                 n ? seen : "none");
    else
        jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: no GPU device (found %s; a CPU device such as "
                 "lavapipe is used only when named, e.g. JLM_VK_DEVICE=llvmpipe)", n ? seen : "none");
    return -1;
}

static int open_instance(jlm_vk *vk, jlm_err *err)
{
    vk->inst = instance();
    if (!vk->inst)
        return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: no loader or driver (vkCreateInstance: %d)", (int)g_inst_rc);
    return JLM_OK;
}

static int has_extension(VkPhysicalDevice p, const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(p, NULL, &n, NULL) != VK_SUCCESS || !n)
        return 0;
    VkExtensionProperties *e = calloc(n, sizeof *e);
    int found = 0;
    if (e && vkEnumerateDeviceExtensionProperties(p, NULL, &n, e) >= 0)
        for (uint32_t i = 0; i < n && !found; i++)
            found = !strcmp(e[i].extensionName, name);
    free(e);
    return found;
}

static int open_device(jlm_vk *vk, const char *want, int allow_cpu, jlm_err *err)
{
    VkPhysicalDevice devs[16];
    uint32_t n = 16;
    if (vkEnumeratePhysicalDevices(vk->inst, &n, devs) < 0)
        n = 0;
    const char *env = getenv("JLM_VK_DEVICE");
    int i = pick_device(devs, n, env && *env ? env : want, allow_cpu, err);
    if (i < 0)
        return JLM_EUNSUPPORTED;
    vk->phys = devs[i];
    vkGetPhysicalDeviceProperties(vk->phys, &vk->props);
    vkGetPhysicalDeviceMemoryProperties(vk->phys, &vk->memprops);
    if (!has_compute_queue(vk->phys, &vk->qfam, &vk->ts_bits))
        return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: %s has no compute queue", vk->props.deviceName);
    const char *nts = getenv("JLM_VK_NO_TIMESTAMPS");   /* tests: a device without timestamps (--profile's n/a) */
    if (nts && *nts && strcmp(nts, "0"))
        vk->ts_bits = 0;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = vk->qfam, .queueCount = 1, .pQueuePriorities = &prio};
    const char *ext[1] = {VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME};
    int imp = has_extension(vk->phys, ext[0]);
    VkPhysicalDeviceFeatures have, want_f = {0};
    vkGetPhysicalDeviceFeatures(vk->phys, &have);
    vk->has_f64 = have.shaderFloat64 != 0;
    want_f.shaderFloat64 = have.shaderFloat64;
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi, .enabledExtensionCount = imp ? 1u : 0u,
                             .ppEnabledExtensionNames = ext, .pEnabledFeatures = &want_f};
    VkResult r = vkCreateDevice(vk->phys, &di, NULL, &vk->dev);
    if (r != VK_SUCCESS) {
        vk->dev = VK_NULL_HANDLE;
        return vkfail(err, "vkCreateDevice", r);
    }
    vkGetDeviceQueue(vk->dev, vk->qfam, 0, &vk->queue);
    vk->max_binding = vk->props.limits.maxStorageBufferRange;
    const char *mb = getenv("JLM_VK_MAX_BINDING");   /* tests: force the k-chunked matvec on small planes */
    if (mb && *mb) {
        unsigned long long v = strtoull(mb, NULL, 10);
        if (v >= 4096 && v < vk->max_binding)
            vk->max_binding = v & ~3ull;
    }
    const char *tl = getenv("JLM_VK_MATMUL_TILE");   /* bench: the one-token-per-invocation baseline */
    vk->untiled = tl && !strcmp(tl, "1");
    if (imp) {
        VkPhysicalDeviceExternalMemoryHostPropertiesEXT hp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
        VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &hp};
        vkGetPhysicalDeviceProperties2(vk->phys, &p2);
        vk->host_ptr_props = (PFN_vkGetMemoryHostPointerPropertiesEXT)vkGetDeviceProcAddr(
            vk->dev, "vkGetMemoryHostPointerPropertiesEXT");
        vk->import_align = hp.minImportedHostPointerAlignment ? hp.minImportedHostPointerAlignment : 4096;
        vk->has_import = vk->host_ptr_props != NULL;
    }
    return JLM_OK;
}

/* ---------------------------------------------------------------- pipelines */

static int make_layout(jlm_vk *vk, jlm_err *err)
{
    VkDescriptorSetLayoutBinding b[NBIND];
    for (int i = 0; i < NBIND; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i, .descriptorCount = 1,
                                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo dl = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                          .bindingCount = NBIND, .pBindings = b};
    VkResult r = vkCreateDescriptorSetLayout(vk->dev, &dl, NULL, &vk->dsl);
    if (r != VK_SUCCESS)
        return vkfail(err, "vkCreateDescriptorSetLayout", r);
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = JLM_PUSH_MAX};
    VkPipelineLayoutCreateInfo pl = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                     .setLayoutCount = 1, .pSetLayouts = &vk->dsl,
                                     .pushConstantRangeCount = 1, .pPushConstantRanges = &pr};
    r = vkCreatePipelineLayout(vk->dev, &pl, NULL, &vk->layout);
    return r == VK_SUCCESS ? JLM_OK : vkfail(err, "vkCreatePipelineLayout", r);
}

/* Pipeline of shader k; spec (NULL: none) sets matvec.comp's specialization
 * constants, constant i at offset 4*i (kernels/layout.h, invariant 1). */
static int make_pipeline_spec(jlm_vk *vk, int k, const jlm_spec_matvec *spec, VkPipeline *out, jlm_err *err)
{
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                   .codeSize = SPV[k].size, .pCode = SPV[k].code};
    VkShaderModule mod;
    VkResult r = vkCreateShaderModule(vk->dev, &mi, NULL, &mod);
    if (r != VK_SUCCESS)
        return vkfail(err, "vkCreateShaderModule", r);
    VkSpecializationMapEntry map[NSPEC];
    for (uint32_t i = 0; i < NSPEC; i++)
        map[i] = (VkSpecializationMapEntry){.constantID = i, .offset = 4 * i, .size = 4};
    VkSpecializationInfo si = {.mapEntryCount = NSPEC, .pMapEntries = map, .dataSize = sizeof *spec, .pData = spec};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT, .module = mod, .pName = "main",
                  .pSpecializationInfo = spec ? &si : NULL},
        .layout = vk->layout};
    r = vkCreateComputePipelines(vk->dev, VK_NULL_HANDLE, 1, &ci, NULL, out);
    vkDestroyShaderModule(vk->dev, mod, NULL);
    return r == VK_SUCCESS ? JLM_OK : vkfail(err, "vkCreateComputePipelines", r);
}

static int make_submit_objects(jlm_vk *vk, jlm_err *err)
{
    VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = NBIND * REC_SETS};
    VkDescriptorPoolCreateInfo dp = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                     .maxSets = REC_SETS, .poolSizeCount = 1, .pPoolSizes = &ps};
    VkResult r = vkCreateDescriptorPool(vk->dev, &dp, NULL, &vk->pool);
    if (r != VK_SUCCESS)
        return vkfail(err, "vkCreateDescriptorPool", r);
    VkCommandPoolCreateInfo cp = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                  .queueFamilyIndex = vk->qfam};
    if ((r = vkCreateCommandPool(vk->dev, &cp, NULL, &vk->cmdpool)) != VK_SUCCESS)
        return vkfail(err, "vkCreateCommandPool", r);
    VkCommandBufferAllocateInfo ca = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = vk->cmdpool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    if ((r = vkAllocateCommandBuffers(vk->dev, &ca, &vk->cmd)) != VK_SUCCESS)
        return vkfail(err, "vkAllocateCommandBuffers", r);
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = vkCreateFence(vk->dev, &fi, NULL, &vk->fence)) != VK_SUCCESS)
        return vkfail(err, "vkCreateFence", r);
    return jlm_vk_buf_new(vk, 256, &vk->dummy, err);
}

int jlm_vk_open(const char *want, int allow_cpu, jlm_vk **out, jlm_err *err)
{
    jlm_vk *vk = calloc(1, sizeof *vk);
    if (!vk)
        return jlm_errf(err, JLM_ENOMEM, "vulkan: out of memory");
    int rc = open_instance(vk, err);
    if (!rc)
        rc = open_device(vk, want, allow_cpu, err);
    if (!rc)
        rc = make_layout(vk, err);
    for (int k = 0; !rc && k < K_COUNT; k++)
        if (k != K_MATVEC && ((k != K_QUANTIZE && k != K_KV_Q8) || vk->has_f64))
            rc = make_pipeline_spec(vk, k, NULL, &vk->pipe[k], err);
    if (!rc)
        rc = make_submit_objects(vk, err);
    if (rc) {
        jlm_vk_close(vk);
        return rc;
    }
    *out = vk;
    return JLM_OK;
}

void jlm_vk_close(jlm_vk *vk)
{
    if (!vk)
        return;
    if (vk->dev) {
        vkDeviceWaitIdle(vk->dev);
        jlm_vk_buf_free(vk, vk->dummy);
        jlm_vk_buf_free(vk, vk->tmp);
        jlm_vk_buf_free(vk, vk->gelu_tab);
        jlm_vk_buf_free(vk, vk->staging);
        if (vk->fence)
            vkDestroyFence(vk->dev, vk->fence, NULL);
        if (vk->qpool)
            vkDestroyQueryPool(vk->dev, vk->qpool, NULL);
        if (vk->cmdpool)
            vkDestroyCommandPool(vk->dev, vk->cmdpool, NULL);
        if (vk->pool)
            vkDestroyDescriptorPool(vk->dev, vk->pool, NULL);
        for (int k = 0; k < K_COUNT; k++)
            if (vk->pipe[k])
                vkDestroyPipeline(vk->dev, vk->pipe[k], NULL);
        for (int t = 0; t < JLM_T_COUNT; t++)
            for (int j = 0; j < 2; j++)
                if (vk->mv[t][j])
                    vkDestroyPipeline(vk->dev, vk->mv[t][j], NULL);
        if (vk->layout)
            vkDestroyPipelineLayout(vk->dev, vk->layout, NULL);
        if (vk->dsl)
            vkDestroyDescriptorSetLayout(vk->dev, vk->dsl, NULL);
        vkDestroyDevice(vk->dev, NULL);
    }
    /* vk->inst is the process's (instance()): kept */
    free(vk);
}

const char *jlm_vk_device_name(const jlm_vk *vk) { return vk->props.deviceName; }
int jlm_vk_device_is_cpu(const jlm_vk *vk) { return vk->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU; }
uint64_t jlm_vk_max_binding(const jlm_vk *vk) { return vk->max_binding; }
uint64_t jlm_vk_import_align(const jlm_vk *vk) { return vk->has_import ? vk->import_align : 0; }
uint64_t jlm_vk_offset_align(const jlm_vk *vk)
{
    uint64_t al = vk->props.limits.minStorageBufferOffsetAlignment;
    return al > 4 ? al : 4;
}

uint64_t jlm_vk_device_local_bytes(const jlm_vk *vk)
{
    uint64_t best = 0;
    for (uint32_t i = 0; i < vk->memprops.memoryHeapCount; i++)
        if ((vk->memprops.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
            vk->memprops.memoryHeaps[i].size > best)
            best = vk->memprops.memoryHeaps[i].size;
    return best;
}

/* ---------------------------------------------------------------- buffers */

static int mem_type(const jlm_vk *vk, uint32_t bits, VkMemoryPropertyFlags want)
{
    for (uint32_t i = 0; i < vk->memprops.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (vk->memprops.memoryTypes[i].propertyFlags & want) == want)
            return (int)i;
    return -1;
}

/* A storage buffer over memory with the properties want (host: an import of
 * the host pages there). any: without such a type take any type (a device
 * buffer on a device with no device-local heap); otherwise that is an error. */
static int buf_make(jlm_vk *vk, uint64_t bytes, VkMemoryPropertyFlags want, int any, void *host, jlm_vk_buf **out,
                    jlm_err *err)
{
    jlm_vk_buf *b = calloc(1, sizeof *b);
    if (!b)
        return jlm_errf(err, JLM_ENOMEM, "vulkan: out of memory");
    b->size = (bytes + 3) & ~(uint64_t)3;
    b->imported = host != NULL;
    VkExternalMemoryBufferCreateInfo eb = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                                           .handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT};
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .pNext = host ? &eb : NULL,
                             .size = b->size,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vkCreateBuffer(vk->dev, &bi, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        free(b);
        return vkfail(err, "vkCreateBuffer", r);
    }
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(vk->dev, b->buf, &req);
    uint32_t bits = req.memoryTypeBits;
    VkImportMemoryHostPointerInfoEXT imp = {.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
                                            .handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
                                            .pHostPointer = host};
    if (host) {
        VkMemoryHostPointerPropertiesEXT hp = {.sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
        r = vk->host_ptr_props(vk->dev, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, host, &hp);
        bits = r == VK_SUCCESS ? bits & hp.memoryTypeBits : 0;
    }
    int mt = mem_type(vk, bits, want);
    if (mt < 0 && any)
        mt = mem_type(vk, bits, 0);
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = host ? &imp : NULL,
                               .allocationSize = host ? b->size : req.size, .memoryTypeIndex = (uint32_t)mt};
    if (mt < 0 || (r = vkAllocateMemory(vk->dev, &ai, NULL, &b->mem)) != VK_SUCCESS ||
        (r = vkBindBufferMemory(vk->dev, b->buf, b->mem, 0)) != VK_SUCCESS) {
        jlm_vk_buf_free(vk, b);
        if (mt < 0 && (want & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT))
            return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: no host-visible memory type");
        return mt < 0 ? jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: no memory type for %s",
                                 host ? "an imported host pointer" : "a device buffer")
                      : vkfail(err, host ? "importing host memory" : "device buffer memory", r);
    }
    *out = b;
    return JLM_OK;
}

int jlm_vk_buf_new(jlm_vk *vk, uint64_t bytes, jlm_vk_buf **out, jlm_err *err)
{
    jlm_vk_buf *b;
    int rc = buf_make(vk, bytes ? bytes : 4, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                      0, NULL, &b, err);
    if (rc)
        return rc;
    VkResult r = vkMapMemory(vk->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map);
    if (r != VK_SUCCESS) {
        jlm_vk_buf_free(vk, b);
        return vkfail(err, "buffer memory", r);
    }
    memset(b->map, 0, b->size);
    *out = b;
    return JLM_OK;
}

int jlm_vk_buf_new_device(jlm_vk *vk, uint64_t bytes, jlm_vk_buf **out, jlm_err *err)
{
    return buf_make(vk, bytes ? bytes : 4, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 1, NULL, out, err);
}

int jlm_vk_buf_import(jlm_vk *vk, void *host, uint64_t bytes, jlm_vk_buf **out, jlm_err *err)
{
    if (!vk->has_import)
        return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: %s has no VK_EXT_external_memory_host",
                        vk->props.deviceName);
    if (!bytes || (uintptr_t)host % vk->import_align || bytes % vk->import_align)
        return jlm_errf(err, JLM_EINVAL, "vulkan: import of %llu bytes at %p: not a multiple of the %llu-byte "
                        "alignment", (unsigned long long)bytes, host, (unsigned long long)vk->import_align);
    return buf_make(vk, bytes, 0, 0, host, out, err);
}

int jlm_vk_is_imported(const jlm_vk_buf *b) { return b->imported; }

/* One copy command from the staging buffer into dst, submitted and waited. */
static void cmd_begin(jlm_vk *vk);
static int cmd_submit(jlm_vk *vk, jlm_err *err);

static int copy_submit(jlm_vk *vk, jlm_vk_buf *dst, uint64_t dst_off, uint64_t n, jlm_err *err)
{
    int rec = vk->rec;   /* a recording open: what it holds runs first, then it goes on */
    if (rec) {
        vk->rec = 0;
        int rc = cmd_submit(vk, err);
        if (rc)
            return rc;
    }
    int ts = vk->ts_on;   /* a page-in's copy: the caller times it on the host */
    vk->ts_on = 0;
    cmd_begin(vk);
    vk->ts_on = ts;
    vk->rec = rec;
    VkBufferCopy c = {.srcOffset = 0, .dstOffset = dst_off, .size = n};
    vkCmdCopyBuffer(vk->cmd, vk->staging->buf, dst->buf, 1, &c);
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT};
    vkCmdPipelineBarrier(vk->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb,
                         0, NULL, 0, NULL);
    vkEndCommandBuffer(vk->cmd);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &vk->cmd};
    vkResetFences(vk->dev, 1, &vk->fence);
    VkResult r = vkQueueSubmit(vk->queue, 1, &si, vk->fence);
    if (r != VK_SUCCESS)
        return vkfail(err, "vkQueueSubmit (copy)", r);
    r = vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, UINT64_MAX);
    if (r != VK_SUCCESS)
        return vkfail(err, "vkWaitForFences (copy)", r);
    if (rec)
        cmd_begin(vk);
    return JLM_OK;
}

#define STAGING_BYTES (16u << 20)

int jlm_vk_buf_write(jlm_vk *vk, jlm_vk_buf *dst, uint64_t off, const void *src, uint64_t n, jlm_err *err)
{
    if (off > dst->size || n > dst->size - off)
        return jlm_errf(err, JLM_EINVAL, "vulkan: write of %llu bytes at %llu past a buffer of %llu",
                        (unsigned long long)n, (unsigned long long)off, (unsigned long long)dst->size);
    if (!vk->staging) {
        int rc = jlm_vk_buf_new(vk, STAGING_BYTES, &vk->staging, err);
        if (rc)
            return rc;
    }
    const uint8_t *s = src;
    while (n) {
        uint64_t c = n < STAGING_BYTES ? n : STAGING_BYTES;
        memcpy(vk->staging->map, s, c);
        int rc = copy_submit(vk, dst, off, c, err);
        if (rc)
            return rc;
        s += c;
        off += c;
        n -= c;
    }
    return JLM_OK;
}

void jlm_vk_buf_free(jlm_vk *vk, jlm_vk_buf *b)
{
    if (!b)
        return;
    if (b->map)
        vkUnmapMemory(vk->dev, b->mem);
    if (b->buf)
        vkDestroyBuffer(vk->dev, b->buf, NULL);
    if (b->mem)
        vkFreeMemory(vk->dev, b->mem, NULL);
    free(b);
}

void *jlm_vk_buf_map(jlm_vk_buf *b) { return b->map; }
uint64_t jlm_vk_buf_size(const jlm_vk_buf *b) { return b->size; }

int jlm_vk_buf_upload(jlm_vk *vk, const void *src, uint64_t n, jlm_vk_buf **out, jlm_err *err)
{
    int rc = jlm_vk_buf_new(vk, n, out, err);
    if (!rc && n)
        memcpy((*out)->map, src, n);
    return rc;
}

/* ---------------------------------------------------------------- dispatch */

static int view_check(const jlm_vk *vk, const jlm_vk_view *v, int i, jlm_err *err)
{
    uint64_t len = v->len ? v->len : v->buf->size - (v->off < v->buf->size ? v->off : v->buf->size);
    if (v->off > v->buf->size || len > v->buf->size - v->off || len == 0)
        return jlm_errf(err, JLM_EINVAL, "vulkan: binding %d: range %llu+%llu outside its buffer of %llu",
                        i, (unsigned long long)v->off, (unsigned long long)len,
                        (unsigned long long)v->buf->size);
    if (len > vk->max_binding)
        return jlm_errf(err, JLM_EINVAL, "vulkan: binding %d: %llu bytes exceed maxStorageBufferRange %llu",
                        i, (unsigned long long)len, (unsigned long long)vk->max_binding);
    if (v->off % vk->props.limits.minStorageBufferOffsetAlignment)
        return jlm_errf(err, JLM_EINVAL, "vulkan: binding %d: offset %llu not a multiple of %llu", i,
                        (unsigned long long)v->off,
                        (unsigned long long)vk->props.limits.minStorageBufferOffsetAlignment);
    return JLM_OK;
}

/* Binds views (buf NULL: the dummy), pushes, dispatches gx x gy x gz groups
 * and waits. */
static int dispatch3(jlm_vk *vk, VkPipeline pipe, const jlm_vk_view *views, int nview, const void *push,
                     uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz, jlm_err *err);
static int dispatch2(jlm_vk *vk, VkPipeline pipe, const jlm_vk_view *views, int nview, const void *push,
                     uint32_t push_size, uint32_t gx, uint32_t gy, jlm_err *err)
{
    return dispatch3(vk, pipe, views, nview, push, push_size, gx, gy, 1, err);
}

static int dispatch(jlm_vk *vk, VkPipeline pipe, const jlm_vk_view *views, int nview, const void *push,
                    uint32_t push_size, uint32_t gx, jlm_err *err)
{
    return dispatch2(vk, pipe, views, nview, push, push_size, gx, 1, err);
}

/* ---------------------------------------------------------------- recording
 * Outside a recording each kernel call is one command buffer, submitted and
 * waited for. Between jlm_vk_rec_begin and jlm_vk_rec_end the calls are
 * recorded into one command buffer (a barrier after each), each with its own
 * descriptor set and its small uploads in the tmp arena; the buffer is
 * submitted (and begun again) early only when the sets or the arena run out,
 * or a write through the staging buffer needs the command buffer. */
static void stamp(jlm_vk *vk, int tag)
{
    if (vk->ts_n >= TS_MAX)
        return;
    if (vk->ts_n % TS_RESET == 0)   /* reset as used: a buffer with few stamps resets few */
        vkCmdResetQueryPool(vk->cmd, vk->qpool, vk->ts_n, TS_RESET);
    vk->ts_of[vk->ts_n] = (uint8_t)tag;
    vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vk->qpool, vk->ts_n++);
}

static void cmd_begin(jlm_vk *vk)
{
    vkResetDescriptorPool(vk->dev, vk->pool, 0);
    vk->rec_sets = 0;
    VkCommandBufferBeginInfo cb = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    vkResetCommandBuffer(vk->cmd, 0);
    vkBeginCommandBuffer(vk->cmd, &cb);
    vk->ts_live = vk->ts_on;
    vk->ts_n = 0;
    if (vk->ts_live)
        stamp(vk, vk->ts_tag);
}

/* The submitted buffer's stamps, waited for: each interval counts to the
 * tag of the stamp that opens it. */
static void stamps_read(jlm_vk *vk)
{
    uint64_t t[TS_MAX];
    uint64_t mask = vk->ts_bits >= 64 ? ~0ull : (1ull << vk->ts_bits) - 1;
    double period = vk->props.limits.timestampPeriod;
    if (vk->ts_n < 2 || vkGetQueryPoolResults(vk->dev, vk->qpool, 0, vk->ts_n, sizeof t, t, sizeof t[0],
                                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
        return;
    for (uint32_t i = 0; i + 1 < vk->ts_n; i++) {
        uint64_t d = ((t[i + 1] & mask) - (t[i] & mask)) & mask;   /* a counter that wrapped once */
        vk->ts_ns[vk->ts_of[i]] += (uint64_t)((double)d * period);
    }
}

/* Ends, submits and waits for the command buffer; the arena is free after. */
static int cmd_submit(jlm_vk *vk, jlm_err *err)
{
    int live = vk->ts_live;
    if (live)
        stamp(vk, vk->ts_tag);   /* closes the last interval */
    vk->ts_live = 0;
    vkEndCommandBuffer(vk->cmd);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1,
                       .pCommandBuffers = &vk->cmd};
    vkResetFences(vk->dev, 1, &vk->fence);
    VkResult r = vkQueueSubmit(vk->queue, 1, &si, vk->fence);
    if (r != VK_SUCCESS)
        return vkfail(err, "vkQueueSubmit", r);
    if ((r = vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, UINT64_MAX)) != VK_SUCCESS)
        return vkfail(err, "vkWaitForFences", r);
    vk->tmp_off = 0;
    vk->submits++;
    if (live)
        stamps_read(vk);
    return JLM_OK;
}

/* ---------------------------------------------------------------- timing */

int jlm_vk_can_time(const jlm_vk *vk) { return vk->ts_bits > 0 && vk->props.limits.timestampPeriod > 0; }

int jlm_vk_time(jlm_vk *vk, int on, jlm_err *err)
{
    if (on && !jlm_vk_can_time(vk))
        return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: %s has no timestamps on its compute queue",
                        vk->props.deviceName);
    if (on && !vk->qpool) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = TS_MAX};
        VkResult r = vkCreateQueryPool(vk->dev, &qi, NULL, &vk->qpool);
        if (r != VK_SUCCESS) {
            vk->qpool = VK_NULL_HANDLE;
            return vkfail(err, "vkCreateQueryPool", r);
        }
    }
    vk->ts_on = on;
    memset(vk->ts_ns, 0, sizeof vk->ts_ns);
    return JLM_OK;
}

void jlm_vk_time_tag(jlm_vk *vk, int tag)
{
    if (tag < 0 || tag >= JLM_VK_TAGS || tag == vk->ts_tag)
        return;
    vk->ts_tag = tag;
    if (vk->ts_live)
        stamp(vk, tag);
}

void jlm_vk_time_get(const jlm_vk *vk, uint64_t ns[JLM_VK_TAGS]) { memcpy(ns, vk->ts_ns, sizeof vk->ts_ns); }

int jlm_vk_rec_begin(jlm_vk *vk, jlm_err *err)
{
    (void)err;
    if (!vk->rec) {
        cmd_begin(vk);
        vk->rec = 1;
    }
    return JLM_OK;
}

int jlm_vk_rec_end(jlm_vk *vk, jlm_err *err)
{
    if (!vk->rec)
        return JLM_OK;
    vk->rec = 0;
    return cmd_submit(vk, err);
}

int jlm_vk_recording(const jlm_vk *vk) { return vk->rec; }
uint64_t jlm_vk_submits(const jlm_vk *vk) { return vk->submits; }
uint64_t jlm_vk_dispatches(const jlm_vk *vk) { return vk->dispatches; }

static uint64_t tmp_align(const jlm_vk *vk, uint64_t n)
{
    uint64_t al = vk->props.limits.minStorageBufferOffsetAlignment;
    al = al > 4 ? al : 4;
    return (n + al - 1) / al * al;
}

/* Room for one more descriptor set and `bytes` of uploads: a recording that
 * has none is submitted and begun again first; the arena grows (keeping its
 * bytes in use: nothing pending reads the old buffer then). Called before a
 * kernel's uploads, so the uploads and its dispatch land in one command
 * buffer. */
static int reserve(jlm_vk *vk, uint64_t bytes, jlm_err *err)
{
    uint64_t need = bytes ? tmp_align(vk, bytes) + 2 * tmp_align(vk, 4) : 0;
    int full = vk->rec_sets >= REC_SETS || (need && (!vk->tmp || vk->tmp_off + need > vk->tmp->size));
    if (vk->rec && full) {
        int rc = cmd_submit(vk, err);
        if (rc) {
            vk->rec = 0;
            return rc;
        }
        cmd_begin(vk);
    }
    if (need && (!vk->tmp || vk->tmp_off + need > vk->tmp->size)) {
        uint64_t sz = 2 * (vk->tmp_off + need);
        jlm_vk_buf *nb;
        int rc = jlm_vk_buf_new(vk, sz > (64u << 10) ? sz : (64u << 10), &nb, err);
        if (rc)
            return rc;
        if (vk->tmp)
            memcpy(nb->map, vk->tmp->map, vk->tmp_off);
        jlm_vk_buf_free(vk, vk->tmp);
        vk->tmp = nb;
    }
    return JLM_OK;
}

/* n bytes of src into the arena (room made by reserve): their view. */
static jlm_vk_view tmp_put(jlm_vk *vk, const void *src, uint64_t n)
{
    jlm_vk_view v = {vk->tmp, vk->tmp_off, n};
    memcpy((uint8_t *)vk->tmp->map + vk->tmp_off, src, n);
    vk->tmp_off += tmp_align(vk, n);
    return v;
}

/* A barrier after a command: its writes visible to the next kernels, copies
 * and the host. */
static void barrier_after(jlm_vk *vk, VkPipelineStageFlags src, VkAccessFlags acc)
{
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = acc,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_SHADER_READ_BIT |
                                           VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                                           VK_ACCESS_TRANSFER_WRITE_BIT};
    vkCmdPipelineBarrier(vk->cmd, src,
                         VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                             VK_PIPELINE_STAGE_TRANSFER_BIT,
                         0, 1, &mb, 0, NULL, 0, NULL);
}

int jlm_vk_copy(jlm_vk *vk, jlm_vk_view dst, jlm_vk_view src, uint64_t n, jlm_err *err)
{
    if (!dst.buf || !src.buf || !n || dst.off > dst.buf->size || n > dst.buf->size - dst.off ||
        src.off > src.buf->size || n > src.buf->size - src.off)
        return jlm_errf(err, JLM_EINVAL, "vulkan: copy of %llu bytes outside its buffers", (unsigned long long)n);
    if (!vk->rec)
        cmd_begin(vk);
    VkBufferCopy c = {.srcOffset = src.off, .dstOffset = dst.off, .size = n};
    vkCmdCopyBuffer(vk->cmd, src.buf->buf, dst.buf->buf, 1, &c);
    vk->dispatches++;
    barrier_after(vk, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
    return vk->rec ? JLM_OK : cmd_submit(vk, err);
}

/* rows copies of n bytes in one copy command: row r from src.off + sr(r) to
 * dst.off + dr(r), each checked within its buffer (rows_at: r * stride, or
 * idx[r] * n where idx is given). */
static uint64_t rows_at(const uint32_t *idx, uint64_t stride, uint64_t n, uint32_t r)
{
    return idx ? (uint64_t)idx[r] * n : r * stride;
}

static int copy_regions(jlm_vk *vk, jlm_vk_view dst, uint64_t dst_stride, const uint32_t *di, jlm_vk_view src,
                        uint64_t src_stride, const uint32_t *si, uint64_t n, uint32_t rows, jlm_err *err)
{
    int bad = !dst.buf || !src.buf || !n || !rows || dst.off > dst.buf->size || src.off > src.buf->size;
    VkBufferCopy *c = bad ? NULL : malloc((uint64_t)rows * sizeof *c);
    for (uint32_t r = 0; c && r < rows && !bad; r++) {
        uint64_t d = rows_at(di, dst_stride, n, r), s = rows_at(si, src_stride, n, r);
        bad = d > dst.buf->size - dst.off || n > dst.buf->size - dst.off - d || s > src.buf->size - src.off ||
              n > src.buf->size - src.off - s;
        c[r] = (VkBufferCopy){.srcOffset = src.off + s, .dstOffset = dst.off + d, .size = n};
    }
    if (bad) {
        free(c);
        return jlm_errf(err, JLM_EINVAL, "vulkan: copy of %u rows of %llu bytes outside its buffers", rows,
                        (unsigned long long)n);
    }
    if (!c)
        return jlm_errf(err, JLM_ENOMEM, "vulkan: out of memory");
    if (!vk->rec)
        cmd_begin(vk);
    vkCmdCopyBuffer(vk->cmd, src.buf->buf, dst.buf->buf, rows, c);
    free(c);
    vk->dispatches++;
    barrier_after(vk, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
    return vk->rec ? JLM_OK : cmd_submit(vk, err);
}

int jlm_vk_copy_rows(jlm_vk *vk, jlm_vk_view dst, uint64_t dst_stride, jlm_vk_view src, uint64_t src_stride,
                     uint64_t n, uint32_t rows, jlm_err *err)
{
    return copy_regions(vk, dst, dst_stride, NULL, src, src_stride, NULL, n, rows, err);
}

int jlm_vk_copy_index(jlm_vk *vk, jlm_vk_view dst, const uint32_t *di, jlm_vk_view src, const uint32_t *si,
                      uint64_t n, uint32_t rows, jlm_err *err)
{
    return copy_regions(vk, dst, n, di, src, n, si, n, rows, err);
}

/* dispatch with gx x gy x gz groups (the matvec's y: tokens, z: sheets). */
static int dispatch3(jlm_vk *vk, VkPipeline pipe, const jlm_vk_view *views, int nview, const void *push,
                     uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz, jlm_err *err)
{
    VkDescriptorBufferInfo bi[NBIND];
    VkWriteDescriptorSet w[NBIND];
    for (int i = 0; i < NBIND; i++) {
        jlm_vk_view v = i < nview && views[i].buf ? views[i] : (jlm_vk_view){vk->dummy, 0, 0};
        int rc = view_check(vk, &v, i, err);
        if (rc) {
            if (!vk->rec)
                vk->tmp_off = 0;   /* the call's uploads: nothing will read them */
            return rc;
        }
        bi[i] = (VkDescriptorBufferInfo){v.buf->buf, v.off, v.len ? v.len : VK_WHOLE_SIZE};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstBinding = (uint32_t)i,
                                      .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      .pBufferInfo = &bi[i]};
    }
    int rc = reserve(vk, 0, err);
    if (rc)
        return rc;
    if (!vk->rec)
        cmd_begin(vk);
    VkDescriptorSet set;
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                      .descriptorPool = vk->pool, .descriptorSetCount = 1, .pSetLayouts = &vk->dsl};
    VkResult r = vkAllocateDescriptorSets(vk->dev, &ai, &set);
    if (r != VK_SUCCESS) {
        if (!vk->rec)
            vkEndCommandBuffer(vk->cmd);
        return vkfail(err, "vkAllocateDescriptorSets", r);
    }
    vk->rec_sets++;
    for (int i = 0; i < NBIND; i++)
        w[i].dstSet = set;
    vkUpdateDescriptorSets(vk->dev, NBIND, w, 0, NULL);
    vkCmdBindPipeline(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    vkCmdBindDescriptorSets(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, vk->layout, 0, 1, &set, 0, NULL);
    uint8_t pbuf[JLM_PUSH_MAX] = {0};
    memcpy(pbuf, push, push_size);
    vkCmdPushConstants(vk->cmd, vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, JLM_PUSH_MAX, pbuf);
    vkCmdDispatch(vk->cmd, gx, gy, gz);
    vk->dispatches++;
    barrier_after(vk, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT);
    return vk->rec ? JLM_OK : cmd_submit(vk, err);
}

static uint32_t groups(uint64_t n, uint32_t per) { return (uint32_t)((n + per - 1) / per); }

/* ---------------------------------------------------------------- kernels */

static uint64_t view_len(const jlm_vk_view *v)
{
    return v->len ? v->len : v->buf->size - (v->off < v->buf->size ? v->off : v->buf->size);
}

/* The window of plane view pv holding its words [a, b): an aligned binding
 * within maxStorageBufferRange; *delta = what the shader adds to a plane word
 * index to address the window (mod 2^32). 0, or -1 if it does not fit. */
static int plane_window(const jlm_vk *vk, const jlm_vk_view *pv, uint64_t a, uint64_t b, jlm_vk_view *out,
                        uint32_t *delta)
{
    uint64_t al = vk->props.limits.minStorageBufferOffsetAlignment, lo = pv->off + 4 * a, hi = pv->off + 4 * b;
    uint64_t w0 = al ? lo / al * al : lo;
    if (hi - w0 > vk->max_binding || (lo - w0) % 4)
        return -1;
    *out = (jlm_vk_view){pv->buf, w0, hi - w0};
    *delta = (uint32_t)((lo - w0) / 4 - a);
    return 0;
}

/* A matvec whose planes exceed one binding: quantized types run in chunks of
 * whole super-blocks along k (each plane's words of a super-block range are
 * contiguous: word w of sub-block s of row r at (s*W + w)*rows + r), the
 * running sum carried in y; float types (row-major) in chunks of rows. The
 * file layout is untouched: only the bindings change. */
static int matvec_chunked(jlm_vk *vk, const jlm_vk_mat *m, const jlm_type_traits *t, jlm_vk_view *v,
                          jlm_push_matvec *push, VkPipeline pipe, uint32_t gy, jlm_err *err)
{
    uint64_t lim = vk->max_binding, al = vk->props.limits.minStorageBufferOffsetAlignment;
    uint64_t slack = al > 4 ? al : 4;
    if (t->is_float) {
        uint64_t row_words = m->k * t->elem_bytes / 4;   /* F16/BF16 rows: k even keeps rows word-aligned */
        if ((m->k * t->elem_bytes) % 4 || row_words * 4 + slack > lim)
            return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan matvec %s: one row (%llu bytes) exceeds a binding",
                            t->name, (unsigned long long)(m->k * t->elem_bytes));
        uint64_t step = (lim - slack) / (row_words * 4);
        for (uint64_t r0 = 0; r0 < m->rows; r0 += step) {
            uint64_t r1 = r0 + step < m->rows ? r0 + step : m->rows;
            jlm_vk_view pv = m->qs;
            if (plane_window(vk, &pv, r0 * row_words, r1 * row_words, &v[0], &push->qd))
                return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan matvec %s: no window for rows %llu..%llu", t->name,
                                (unsigned long long)r0, (unsigned long long)r1);
            push->r0 = (uint32_t)r0;
            push->r1 = (uint32_t)r1;
            int rc = dispatch2(vk, pipe, v, 8, push, sizeof *push, groups(r1 - r0, 64), gy, err);
            if (rc)
                return rc;
        }
        return JLM_OK;
    }
    uint64_t super = (uint64_t)t->sub * t->super_sub, nsb = m->k / super, per[3] = {0, 0, 0};
    const jlm_vk_view *pl[3] = {&m->qs, &m->d, &m->sc};
    uint32_t *delta[3] = {&push->qd, &push->dd, &push->sd};
    uint64_t ql, dl, sl;
    int rc = jlm_fmt_planes(m->type, m->k, m->rows, &ql, &dl, &sl, err);
    if (rc)
        return rc;
    uint64_t len[3] = {ql, dl, sl}, worst = 0;
    for (int i = 0; i < 3; i++) {
        if (!pl[i]->buf || !len[i])
            continue;
        if (len[i] % (4 * nsb))
            return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan matvec %s: plane %d not split by super-block", t->name, i);
        per[i] = len[i] / 4 / nsb;   /* words per super-block */
        if (per[i] * 4 > worst)
            worst = per[i] * 4;
    }
    if (worst + slack > lim)
        return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan matvec %s: one super-block of %llu rows (%llu bytes) exceeds a binding",
                        t->name, (unsigned long long)m->rows, (unsigned long long)worst);
    uint64_t step = (lim - slack) / worst;
    for (uint64_t b0 = 0; b0 < nsb; b0 += step) {
        uint64_t b1 = b0 + step < nsb ? b0 + step : nsb;
        for (int i = 0; i < 3; i++) {
            if (!per[i])
                continue;
            if (plane_window(vk, pl[i], b0 * per[i], b1 * per[i], &v[i], delta[i]))
                return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan matvec %s: no window for plane %d", t->name, i);
        }
        push->u_lo = (uint32_t)(b0 * super / 32);
        push->u_hi = (uint32_t)(b1 * super / 32);
        push->accum = b0 > 0;
        if ((rc = dispatch2(vk, pipe, v, 8, push, sizeof *push, groups(m->rows, 64), gy, err)))
            return rc;
    }
    return JLM_OK;
}

int jlm_vk_matvec(jlm_vk *vk, const jlm_vk_mat *m, jlm_vk_view x, const jlm_vk_act *xq,
                  jlm_vk_view y, jlm_err *err)
{
    return jlm_vk_matmul(vk, m, 1, x, xq, y, err);
}

/* The operands' checks, the views and the pipeline of a matvec of ntok
 * tokens (matmul and batch alike). */
static int mv_setup(jlm_vk *vk, const jlm_vk_mat *m, uint32_t ntok, jlm_vk_view x, const jlm_vk_act *xq,
                    jlm_vk_view y, jlm_vk_view v[8], VkPipeline *pipe, uint32_t *gy, jlm_err *err)
{
    const jlm_type_traits *t = jlm_fmt_type_traits(m->type);
    jlm_k_mat chk = {m->type, m->k, m->rows, m->qs.buf, m->d.buf, m->sc.buf};
    int rc = jlm_k_mat_check(&chk, err);
    if (rc)
        return rc;
    if (m->rows > UINT32_MAX || m->k > UINT32_MAX || (!t->is_float && (!xq || xq->k != m->k)) ||
        (t->is_float && !x.buf) || !y.buf || ntok == 0 || ntok > 65535 ||
        (xq && xq->n && xq->n != ntok) || (!xq && ntok != 1 && !t->is_float))
        return jlm_errf(err, JLM_EINVAL, "vulkan matvec %s: bad operands (k %llu, rows %llu)", t->name,
                        (unsigned long long)m->k, (unsigned long long)m->rows);
    memset(v, 0, 8 * sizeof *v);
    v[0] = m->qs, v[1] = m->d, v[2] = m->sc;
    if (xq) {
        v[3] = xq->q;
        v[4] = xq->d;
        v[5] = xq->sum16;
    }
    v[6] = x;
    v[7] = y;
    int tiled = ntok > 1 && !vk->untiled;
    uint32_t nt = tiled ? MV_TILE : 1;
    *gy = (ntok + nt - 1) / nt;
    VkPipeline *p = &vk->mv[m->type][tiled];
    if (!*p) {
        jlm_spec_matvec spec = {m->type, t->w ? t->w : 1, t->sub, t->p1, t->d_share, nt};
        if ((rc = make_pipeline_spec(vk, K_MATVEC, &spec, p, err)))
            return rc;
    }
    *pipe = *p;
    return JLM_OK;
}

/* A matvec of ntok tokens, or (b) a batch of sheets in one dispatch. */
static int mv_run(jlm_vk *vk, const jlm_vk_mat *m, const jlm_vk_batch *b, uint32_t ntok, jlm_vk_view x,
                  const jlm_vk_act *xq, jlm_vk_view y, jlm_err *err)
{
    jlm_vk_view v[8];
    VkPipeline pipe = VK_NULL_HANDLE;
    uint32_t gy = 1;
    int rc = mv_setup(vk, m, ntok, x, xq, y, v, &pipe, &gy, err);
    if (rc)
        return rc;
    jlm_push_matvec push = {.k = (uint32_t)m->k, .rows = (uint32_t)m->rows, .u_hi = (uint32_t)(m->k / 32),
                            .r1 = (uint32_t)m->rows, .ntok = ntok, .tx = (uint32_t)m->k, .ty = (uint32_t)m->rows};
    uint64_t lim = vk->max_binding;
    if (!b) {
        if (view_len(&m->qs) <= lim && (!m->d.buf || view_len(&m->d) <= lim) &&
            (!m->sc.buf || view_len(&m->sc) <= lim))
            return dispatch2(vk, pipe, v, 8, &push, sizeof push, groups(m->rows, 64), gy, err);
        return matvec_chunked(vk, m, jlm_fmt_type_traits(m->type), v, &push, pipe, gy, err);
    }
    /* every sheet's planes in one binding each: the views grow by the strides */
    uint64_t stride[3] = {b->q, b->d, b->s};
    for (int i = 0; i < 3; i++) {
        if (!v[i].buf)
            continue;
        v[i].len = view_len(&v[i]) + (b->n - 1) * stride[i];
        if (v[i].len > lim)
            return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan batched matvec %s: %u sheets exceed a binding",
                            jlm_fmt_type_traits(m->type)->name, (unsigned)b->n);
    }
    push.tx = (uint32_t)b->tx, push.ty = (uint32_t)b->ty, push.bx = (uint32_t)b->bx, push.by = (uint32_t)b->by;
    push.bq = (uint32_t)(b->q / 4), push.bd = (uint32_t)(b->d / 4), push.bs = (uint32_t)(b->s / 4);
    return dispatch3(vk, pipe, v, 8, &push, sizeof push, groups(m->rows, 64), gy, (uint32_t)b->n, err);
}

int jlm_vk_matmul(jlm_vk *vk, const jlm_vk_mat *m, uint32_t ntok, jlm_vk_view x, const jlm_vk_act *xq,
                  jlm_vk_view y, jlm_err *err)
{
    return mv_run(vk, m, NULL, ntok, x, xq, y, err);
}

int jlm_vk_matmul_batch(jlm_vk *vk, const jlm_vk_mat *m, const jlm_vk_batch *b, uint32_t ntok, jlm_vk_view x,
                        const jlm_vk_act *xq, jlm_vk_view y, jlm_err *err)
{
    const jlm_type_traits *t = jlm_fmt_type_traits(m->type);
    uint64_t xa = t->is_float ? 1 : 32, cap = UINT32_MAX;
    if (!b->n || b->n > 65535 || b->tx % xa || b->bx % xa || b->q % 4 || b->d % 4 || b->s % 4 || b->tx > cap ||
        b->ty > cap || b->bx > cap || b->by > cap || b->q / 4 > cap || b->d / 4 > cap || b->s / 4 > cap)
        return jlm_errf(err, JLM_EINVAL, "vulkan batched matvec %s: bad strides", t->name);
    return mv_run(vk, m, b, ntok, x, xq, y, err);
}

int jlm_vk_rmsnorm(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, uint32_t n,
                   float eps, jlm_err *err)
{
    return jlm_vk_rmsnorm_rows(vk, out, x, w, n, 1, 1, 0, eps, err);
}

int jlm_vk_rmsnorm_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, uint32_t n, uint32_t per,
                        uint32_t rows, uint32_t stride, float eps, jlm_err *err)
{
    if (!per || !rows || rows > 65535 || per > 65535)
        return jlm_errf(err, JLM_EINVAL, "vulkan rmsnorm: %u rows of %u groups", rows, per);
    jlm_push_rmsnorm p = {n, w.buf != NULL, eps, stride};
    jlm_vk_view v[3] = {x, w, out};
    return dispatch2(vk, vk->pipe[K_RMSNORM], v, 3, &p, sizeof p, per, rows, err);
}

int jlm_vk_softmax(jlm_vk *vk, jlm_vk_view x, uint32_t n, uint32_t rows, jlm_err *err)
{
    jlm_push_softmax p = {n};
    return dispatch(vk, vk->pipe[K_SOFTMAX], &x, 1, &p, sizeof p, rows, err);
}

int jlm_vk_eltwise(jlm_vk *vk, int op, jlm_vk_view out, jlm_vk_view a, jlm_vk_view b,
                   uint32_t n, jlm_err *err)
{
    if (op < JLM_VK_SILU || op > JLM_VK_GELU_QUICK)
        return jlm_errf(err, JLM_EINVAL, "vulkan: unknown element-wise op %d", op);
    jlm_push_eltwise p = {n, (uint32_t)op, 0, 0, 0};
    jlm_vk_view v[3] = {a, b, out};
    return dispatch(vk, vk->pipe[K_ELTWISE], v, 3, &p, sizeof p, groups(n, 256), err);
}

int jlm_vk_add_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view a, jlm_vk_view b, uint32_t n, uint32_t rows,
                    jlm_err *err)
{
    if (!n || !rows || (uint64_t)n * rows > UINT32_MAX)
        return jlm_errf(err, JLM_EINVAL, "vulkan add: %u rows of %u", rows, n);
    jlm_push_eltwise p = {n * rows, 10, 0, 0, n};
    jlm_vk_view v[3] = {a, b, out};
    return dispatch(vk, vk->pipe[K_ELTWISE], v, 3, &p, sizeof p, groups((uint64_t)n * rows, 256), err);
}

int jlm_vk_scale_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, const float *s, uint32_t n, uint32_t rows,
                      jlm_err *err)
{
    if (!n || !rows || (uint64_t)n * rows > UINT32_MAX)
        return jlm_errf(err, JLM_EINVAL, "vulkan scale: %u rows of %u", rows, n);
    int rc = reserve(vk, (uint64_t)rows * 4, err);
    if (rc)
        return rc;
    jlm_push_eltwise p = {n * rows, 11, 0, 0, n};
    jlm_vk_view v[4] = {x, x, out, tmp_put(vk, s, (uint64_t)rows * 4)};
    return dispatch(vk, vk->pipe[K_ELTWISE], v, 4, &p, sizeof p, groups((uint64_t)n * rows, 256), err);
}

int jlm_vk_swiglu_oai(jlm_vk *vk, jlm_vk_view out, jlm_vk_view gate, jlm_vk_view up, uint32_t n,
                      float alpha, float limit, jlm_err *err)
{
    jlm_push_eltwise p = {n, 6, alpha, limit, 0};
    jlm_vk_view v[3] = {gate, up, out};
    return dispatch(vk, vk->pipe[K_ELTWISE], v, 3, &p, sizeof p, groups(n, 256), err);
}

int jlm_vk_scale(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, float s, uint32_t n, jlm_err *err)
{
    jlm_push_eltwise p = {n, 9, s, 0, 0};
    jlm_vk_view v[3] = {x, x, out};
    return dispatch(vk, vk->pipe[K_ELTWISE], v, 3, &p, sizeof p, groups(n, 256), err);
}

int jlm_vk_geglu_fp16(jlm_vk *vk, jlm_vk_view out, jlm_vk_view gate, jlm_vk_view up, uint32_t n, jlm_err *err)
{
    if (!vk->gelu_tab) {   /* ggml's table: entry h is gelu of the half h, rounded to a half */
        int rc = jlm_vk_buf_new(vk, 65536 * sizeof(float), &vk->gelu_tab, err);
        if (rc)
            return rc;
        float *t = jlm_vk_buf_map(vk->gelu_tab);
        for (uint32_t h = 0; h < 65536; h++)
            t[h] = jlm_k_gelu_fp16_entry((uint16_t)h);
    }
    jlm_push_eltwise p = {n, 7, 0, 0, 0};
    jlm_vk_view v[4] = {gate, up, out, {vk->gelu_tab, 0, 0}};
    return dispatch(vk, vk->pipe[K_ELTWISE], v, 4, &p, sizeof p, groups(n, 256), err);
}

int jlm_vk_to_f16(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, uint32_t n, jlm_err *err)
{
    if (n % 2)
        return jlm_errf(err, JLM_EINVAL, "vulkan f16: %u floats (an even count)", n);
    jlm_push_eltwise p = {n / 2, 8, 0, 0, 0};
    jlm_vk_view v[3] = {x, {0}, out};
    return dispatch(vk, vk->pipe[K_ELTWISE], v, 3, &p, sizeof p, groups(n / 2, 256), err);
}

int jlm_vk_layernorm(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, jlm_vk_view b,
                     uint32_t n, float eps, jlm_err *err)
{
    jlm_push_layernorm p = {n, w.buf != NULL, b.buf != NULL, eps};
    jlm_vk_view v[4] = {x, w, b, out};
    return dispatch(vk, vk->pipe[K_LAYERNORM], v, 4, &p, sizeof p, 1, err);
}

int jlm_vk_moe_route_rows(jlm_vk *vk, jlm_vk_view logits, uint32_t n, uint32_t n_used, int mode, float scale,
                          uint32_t rows, jlm_vk_view sel, jlm_vk_view w, jlm_err *err)
{
    if (n == 0 || n > 1024 || n_used == 0 || n_used > n || mode < JLM_K_ROUTE_NORM || mode > JLM_K_ROUTE_OAI ||
        !rows || rows > 65535)
        return jlm_errf(err, JLM_EINVAL, "vulkan moe route: %u of %u experts, mode %d, %u rows", n_used, n, mode,
                        rows);
    jlm_push_moe_route p = {n, n_used, (uint32_t)mode, scale};
    jlm_vk_view v[3] = {logits, sel, w};
    return dispatch2(vk, vk->pipe[K_MOE_ROUTE], v, 3, &p, sizeof p, 1, rows, err);
}

int jlm_vk_moe_route(jlm_vk *vk, jlm_vk_view logits, uint32_t n, uint32_t n_used, int mode, float scale,
                     jlm_vk_view sel, jlm_vk_view w, jlm_err *err)
{
    return jlm_vk_moe_route_rows(vk, logits, n, n_used, mode, scale, 1, sel, w, err);
}

int jlm_vk_moe_combine_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view ys, jlm_vk_view w,
                            uint32_t n_used, uint32_t n, uint32_t rows, jlm_err *err)
{
    if (!rows || rows > 65535)
        return jlm_errf(err, JLM_EINVAL, "vulkan moe combine: %u rows", rows);
    jlm_push_moe_combine p = {n, n_used};
    jlm_vk_view v[4] = {x, ys, w, out};
    return dispatch2(vk, vk->pipe[K_MOE_COMBINE], v, 4, &p, sizeof p, groups(n, 256), rows, err);
}

int jlm_vk_moe_combine(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view ys, jlm_vk_view w,
                       uint32_t n_used, uint32_t n, jlm_err *err)
{
    return jlm_vk_moe_combine_rows(vk, out, x, ys, w, n_used, n, 1, err);
}

int jlm_vk_rope(jlm_vk *vk, const jlm_k_rope *p, jlm_vk_view x, uint32_t n_head,
                uint32_t head_dim, int64_t pos, jlm_err *err)
{
    if (p->n_rot == 0 || p->n_rot % 2 || p->n_rot > head_dim)
        return jlm_errf(err, JLM_EINVAL, "vulkan rope: n_rot %u not even and <= head dim %u",
                        p->n_rot, head_dim);
    float *cs = malloc(sizeof(float) * p->n_rot);
    if (!cs)
        return jlm_errf(err, JLM_ENOMEM, "vulkan rope: out of memory");
    jlm_k_rope_cos_sin(p, pos, cs);
    int rc = reserve(vk, sizeof(float) * p->n_rot, err);
    jlm_vk_view v[2] = {x};
    if (!rc)
        v[1] = tmp_put(vk, cs, sizeof(float) * p->n_rot);
    free(cs);
    if (rc)
        return rc;
    jlm_push_rope push = {p->n_rot, (uint32_t)(p->neox != 0), n_head, head_dim, 0, 0};
    return dispatch(vk, vk->pipe[K_ROPE], v, 2, &push, sizeof push, groups((uint64_t)p->n_rot / 2 * n_head, 64), err);
}

int jlm_vk_can_quantize(const jlm_vk *vk) { return vk->has_f64; }

int jlm_vk_quantize(jlm_vk *vk, jlm_vk_view x, uint64_t n, const jlm_vk_act *out, jlm_err *err)
{
    if (!vk->has_f64)
        return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan quantize: the device has no shaderFloat64");
    if (!n || n % 32 || n / 32 > UINT32_MAX)
        return jlm_errf(err, JLM_EINVAL, "vulkan quantize: %llu floats (a multiple of 32)", (unsigned long long)n);
    jlm_push_softmax p = {(uint32_t)(n / 32)};
    jlm_vk_view v[4] = {x, out->q, out->d, out->sum16};
    return dispatch(vk, vk->pipe[K_QUANTIZE], v, 4, &p, sizeof p, groups(n / 32, 64), err);
}

int jlm_vk_rope_cs(jlm_vk *vk, uint32_t n_rot, int neox, jlm_vk_view x, uint32_t n_head, uint32_t head_dim,
                   jlm_vk_view cs, jlm_err *err)
{
    return jlm_vk_rope_rows(vk, n_rot, neox, x, n_head, head_dim, 0, cs, 0, 1, err);
}

int jlm_vk_rope_rows(jlm_vk *vk, uint32_t n_rot, int neox, jlm_vk_view x, uint32_t n_head, uint32_t head_dim,
                     uint32_t x_stride, jlm_vk_view cs, uint32_t cs_stride, uint32_t rows, jlm_err *err)
{
    if (n_rot == 0 || n_rot % 2 || n_rot > head_dim)
        return jlm_errf(err, JLM_EINVAL, "vulkan rope: n_rot %u not even and <= head dim %u", n_rot, head_dim);
    if (!rows || rows > 65535)
        return jlm_errf(err, JLM_EINVAL, "vulkan rope: %u rows", rows);
    jlm_push_rope push = {n_rot, (uint32_t)(neox != 0), n_head, head_dim, x_stride, cs_stride};
    jlm_vk_view v[2] = {x, cs};
    return dispatch2(vk, vk->pipe[K_ROPE], v, 2, &push, sizeof push, groups((uint64_t)n_rot / 2 * n_head, 64), rows,
                     err);
}

/* A Q8_0 view (any byte offset) as a window that starts aligned down and
 * ends on a word: *delta is element 0's byte in it. */
static jlm_vk_view q8_window(const jlm_vk *vk, jlm_vk_view v, uint32_t *delta)
{
    uint64_t al = vk->props.limits.minStorageBufferOffsetAlignment, lo = v.off / al * al;
    *delta = (uint32_t)(v.off - lo);
    return (jlm_vk_view){v.buf, lo, (v.off + v.len + 3) / 4 * 4 - lo};
}

int jlm_vk_kv_q8(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, uint32_t n, jlm_err *err)
{
    if (!vk->has_f64)
        return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan kv q8_0: the device has no shaderFloat64");
    if (!n || n % 32 || out.len != (uint64_t)n / 32 * 34)
        return jlm_errf(err, JLM_EINVAL, "vulkan kv q8_0: %u floats into %llu bytes (blocks of 32 into 34)", n,
                        (unsigned long long)out.len);
    jlm_push_kv_q8 p = {n / 32, 0};
    jlm_vk_view v[2] = {x, q8_window(vk, out, &p.off)};
    return dispatch(vk, vk->pipe[K_KV_Q8], v, 2, &p, sizeof p, groups(n / 32, 64), err);
}

/* jlm_vk_attention_kv (rows 0: one query row, n_kv keys) and
 * jlm_vk_attention_rows (span: rows pairs of first key and key count, up
 * in the arena; n_kv: the scores' stride, the most keys of a row). */
static int attention(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, jlm_vk_view q,
                     uint32_t q_stride, jlm_vk_view k, int kt, jlm_vk_view v, int vt, uint64_t n_kv,
                     const float *sinks, jlm_vk_view scratch, jlm_vk_view out, uint32_t o_stride, uint32_t rows,
                     const uint32_t *span, jlm_err *err)
{
    if (!n_head || !n_kv_head || n_head % n_kv_head || !n_kv || n_kv > UINT32_MAX ||
        p->k_stride > UINT32_MAX || p->v_stride > UINT32_MAX || kt < 0 || kt > JLM_VK_KV_Q8_0 || vt < 0 ||
        vt > JLM_VK_KV_Q8_0 || (kt == JLM_VK_KV_Q8_0 && (p->k_stride % 32 || p->head_dim % 32)) ||
        (vt == JLM_VK_KV_Q8_0 && (p->v_stride % 32 || p->head_dim_v % 32)) || rows > 65535 ||
        (rows && (!q_stride || !o_stride || p->mask)))
        return jlm_errf(err, JLM_EINVAL, "vulkan attention: bad shape (heads %u/%u, n_kv %llu, cache types %d/%d, "
                        "%u rows)", n_head, n_kv_head, (unsigned long long)n_kv, kt, vt, rows);
    uint64_t mask_bytes = p->mask ? n_kv * 4 : 0, sink_bytes = sinks ? (uint64_t)n_head * 4 : 0;
    uint64_t span_bytes = (uint64_t)rows * 8;
    int rc = reserve(vk, mask_bytes + tmp_align(vk, sink_bytes) + tmp_align(vk, span_bytes), err);
    if (rc)
        return rc;
    jlm_vk_view mv = p->mask ? tmp_put(vk, p->mask, mask_bytes) : (jlm_vk_view){0};
    jlm_vk_view sv = sinks ? tmp_put(vk, sinks, sink_bytes) : (jlm_vk_view){0};
    jlm_vk_view rv = rows ? tmp_put(vk, span, span_bytes) : (jlm_vk_view){0};
    jlm_push_attention pc = {p->head_dim, p->head_dim_v, (uint32_t)p->k_stride, (uint32_t)p->v_stride, (uint32_t)n_kv,
            n_head / n_kv_head, p->mask != NULL, sinks != NULL, p->scale, p->softcap, (uint32_t)kt, (uint32_t)vt, 0, 0,
            rows ? q_stride : 0, rows ? o_stride : 0};
    if (kt == JLM_VK_KV_Q8_0)
        k = q8_window(vk, k, &pc.k_off);
    if (vt == JLM_VK_KV_Q8_0)
        v = q8_window(vk, v, &pc.v_off);
    jlm_vk_view b[8] = {q, k, v, mv, sv, scratch, out, rv};
    return dispatch2(vk, vk->pipe[K_ATTENTION], b, 8, &pc, sizeof pc, n_head, rows ? rows : 1, err);
}

int jlm_vk_attention_kv(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, jlm_vk_view q,
                        jlm_vk_view k, int kt, jlm_vk_view v, int vt, uint64_t n_kv, const float *sinks,
                        jlm_vk_view scratch, jlm_vk_view out, jlm_err *err)
{
    return attention(vk, p, n_head, n_kv_head, q, 0, k, kt, v, vt, n_kv, sinks, scratch, out, 0, 0, NULL, err);
}

int jlm_vk_attention_rows(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, uint32_t rows,
                          jlm_vk_view q, uint32_t q_stride, jlm_vk_view k, int kt, jlm_vk_view v, int vt,
                          const uint32_t *span, const float *sinks, jlm_vk_view scratch, jlm_vk_view out,
                          uint32_t o_stride, jlm_err *err)
{
    uint64_t most = 0;
    for (uint32_t r = 0; r < rows; r++)
        most = span[2 * r + 1] > most ? span[2 * r + 1] : most;
    if (!rows)
        return jlm_errf(err, JLM_EINVAL, "vulkan attention: no rows");
    return attention(vk, p, n_head, n_kv_head, q, q_stride, k, kt, v, vt, most, sinks, scratch, out, o_stride, rows,
                     span, err);
}

int jlm_vk_attention(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head,
                     jlm_vk_view q, jlm_vk_view k, jlm_vk_view v, uint64_t n_kv,
                     const float *sinks, jlm_vk_view scratch, jlm_vk_view out, jlm_err *err)
{
    return jlm_vk_attention_kv(vk, p, n_head, n_kv_head, q, k, JLM_VK_KV_F32, v, JLM_VK_KV_F32, n_kv, sinks, scratch,
                               out, err);
}

int jlm_vk_attention_f16(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, jlm_vk_view q,
                         jlm_vk_view k, jlm_vk_view v, uint64_t n_kv, const float *sinks, jlm_vk_view scratch,
                         jlm_vk_view out, jlm_err *err)
{
    return jlm_vk_attention_kv(vk, p, n_head, n_kv_head, q, k, JLM_VK_KV_F16, v, JLM_VK_KV_F16, n_kv, sinks, scratch,
                               out, err);
}

#else /* !JLM_HAVE_VULKAN */

struct jlm_vk_buf { int unused; };
struct jlm_vk { int unused; };

static int none(jlm_err *err)
{
    return jlm_errf(err, JLM_EUNSUPPORTED, "vulkan: built without Vulkan (no headers or glslc at build time)");
}

int jlm_vk_built(void) { return 0; }
int jlm_vk_list_devices(char names[][128], int max) { return -1; }
int jlm_vk_open(const char *want, int allow_cpu, jlm_vk **out, jlm_err *err) { return none(err); }
void jlm_vk_close(jlm_vk *vk) {}
const char *jlm_vk_device_name(const jlm_vk *vk) { return "none"; }
int jlm_vk_device_is_cpu(const jlm_vk *vk) { return 0; }
uint64_t jlm_vk_max_binding(const jlm_vk *vk) { return 0; }
uint64_t jlm_vk_import_align(const jlm_vk *vk) { return 0; }
uint64_t jlm_vk_offset_align(const jlm_vk *vk) { return 4; }
uint64_t jlm_vk_device_local_bytes(const jlm_vk *vk) { return 0; }
int jlm_vk_buf_new_device(jlm_vk *vk, uint64_t bytes, jlm_vk_buf **out, jlm_err *err) { return none(err); }
int jlm_vk_buf_import(jlm_vk *vk, void *host, uint64_t bytes, jlm_vk_buf **out, jlm_err *err) { return none(err); }
int jlm_vk_is_imported(const jlm_vk_buf *b) { return 0; }
int jlm_vk_buf_write(jlm_vk *vk, jlm_vk_buf *dst, uint64_t off, const void *src, uint64_t n, jlm_err *err)
{
    return none(err);
}
int jlm_vk_buf_new(jlm_vk *vk, uint64_t bytes, jlm_vk_buf **out, jlm_err *err) { return none(err); }
int jlm_vk_rec_begin(jlm_vk *vk, jlm_err *err) { return none(err); }
int jlm_vk_rec_end(jlm_vk *vk, jlm_err *err) { return JLM_OK; }
int jlm_vk_recording(const jlm_vk *vk) { return 0; }
uint64_t jlm_vk_submits(const jlm_vk *vk) { return 0; }
uint64_t jlm_vk_dispatches(const jlm_vk *vk) { return 0; }
int jlm_vk_can_time(const jlm_vk *vk) { return 0; }
int jlm_vk_time(jlm_vk *vk, int on, jlm_err *err) { return on ? none(err) : JLM_OK; }
void jlm_vk_time_tag(jlm_vk *vk, int tag) {}
void jlm_vk_time_get(const jlm_vk *vk, uint64_t ns[JLM_VK_TAGS]) { memset(ns, 0, JLM_VK_TAGS * sizeof ns[0]); }
int jlm_vk_copy(jlm_vk *vk, jlm_vk_view dst, jlm_vk_view src, uint64_t n, jlm_err *err) { return none(err); }
int jlm_vk_copy_rows(jlm_vk *vk, jlm_vk_view dst, uint64_t dst_stride, jlm_vk_view src, uint64_t src_stride,
                     uint64_t n, uint32_t rows, jlm_err *err)
{
    return none(err);
}
int jlm_vk_rope_cs(jlm_vk *vk, uint32_t n_rot, int neox, jlm_vk_view x, uint32_t n_head, uint32_t head_dim,
                   jlm_vk_view cs, jlm_err *err) { return none(err); }
int jlm_vk_can_quantize(const jlm_vk *vk) { return 0; }
int jlm_vk_quantize(jlm_vk *vk, jlm_vk_view x, uint64_t n, const jlm_vk_act *out, jlm_err *err) { return none(err); }
void jlm_vk_buf_free(jlm_vk *vk, jlm_vk_buf *b) {}
void *jlm_vk_buf_map(jlm_vk_buf *b) { return NULL; }
uint64_t jlm_vk_buf_size(const jlm_vk_buf *b) { return 0; }
int jlm_vk_buf_upload(jlm_vk *vk, const void *src, uint64_t n, jlm_vk_buf **out, jlm_err *err)
{
    return none(err);
}
int jlm_vk_matvec(jlm_vk *vk, const jlm_vk_mat *m, jlm_vk_view x, const jlm_vk_act *xq,
                  jlm_vk_view y, jlm_err *err) { return none(err); }
int jlm_vk_matmul(jlm_vk *vk, const jlm_vk_mat *m, uint32_t ntok, jlm_vk_view x, const jlm_vk_act *xq,
                  jlm_vk_view y, jlm_err *err) { return none(err); }
int jlm_vk_matmul_batch(jlm_vk *vk, const jlm_vk_mat *m, const jlm_vk_batch *b, uint32_t ntok, jlm_vk_view x,
                        const jlm_vk_act *xq, jlm_vk_view y, jlm_err *err) { return none(err); }
int jlm_vk_rmsnorm(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, uint32_t n,
                   float eps, jlm_err *err) { return none(err); }
int jlm_vk_softmax(jlm_vk *vk, jlm_vk_view x, uint32_t n, uint32_t rows, jlm_err *err) { return none(err); }
int jlm_vk_eltwise(jlm_vk *vk, int op, jlm_vk_view out, jlm_vk_view a, jlm_vk_view b,
                   uint32_t n, jlm_err *err) { return none(err); }
int jlm_vk_rope(jlm_vk *vk, const jlm_k_rope *p, jlm_vk_view x, uint32_t n_head,
                uint32_t head_dim, int64_t pos, jlm_err *err) { return none(err); }
int jlm_vk_swiglu_oai(jlm_vk *vk, jlm_vk_view out, jlm_vk_view gate, jlm_vk_view up, uint32_t n,
                      float alpha, float limit, jlm_err *err) { return none(err); }
int jlm_vk_scale(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, float s, uint32_t n, jlm_err *err) { return none(err); }
int jlm_vk_layernorm(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, jlm_vk_view b,
                     uint32_t n, float eps, jlm_err *err) { return none(err); }
int jlm_vk_moe_route(jlm_vk *vk, jlm_vk_view logits, uint32_t n, uint32_t n_used, int mode, float scale,
                     jlm_vk_view sel, jlm_vk_view w, jlm_err *err) { return none(err); }
int jlm_vk_moe_combine(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view ys, jlm_vk_view w,
                       uint32_t n_used, uint32_t n, jlm_err *err) { return none(err); }
int jlm_vk_moe_route_rows(jlm_vk *vk, jlm_vk_view logits, uint32_t n, uint32_t n_used, int mode, float scale,
                          uint32_t rows, jlm_vk_view sel, jlm_vk_view w, jlm_err *err) { return none(err); }
int jlm_vk_moe_combine_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view ys, jlm_vk_view w,
                            uint32_t n_used, uint32_t n, uint32_t rows, jlm_err *err) { return none(err); }
int jlm_vk_copy_index(jlm_vk *vk, jlm_vk_view dst, const uint32_t *di, jlm_vk_view src, const uint32_t *si,
                      uint64_t n, uint32_t rows, jlm_err *err) { return none(err); }
int jlm_vk_attention(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head,
                     jlm_vk_view q, jlm_vk_view k, jlm_vk_view v, uint64_t n_kv,
                     const float *sinks, jlm_vk_view scratch, jlm_vk_view out, jlm_err *err)
{
    return none(err);
}
int jlm_vk_attention_f16(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, jlm_vk_view q,
                         jlm_vk_view k, jlm_vk_view v, uint64_t n_kv, const float *sinks, jlm_vk_view scratch,
                         jlm_vk_view out, jlm_err *err) { return none(err); }
int jlm_vk_geglu_fp16(jlm_vk *vk, jlm_vk_view out, jlm_vk_view gate, jlm_vk_view up, uint32_t n,
                      jlm_err *err) { return none(err); }
int jlm_vk_to_f16(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, uint32_t n, jlm_err *err) { return none(err); }
int jlm_vk_kv_q8(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, uint32_t n, jlm_err *err) { return none(err); }
int jlm_vk_attention_rows(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, uint32_t rows,
                          jlm_vk_view q, uint32_t q_stride, jlm_vk_view k, int kt, jlm_vk_view v, int vt,
                          const uint32_t *span, const float *sinks, jlm_vk_view scratch, jlm_vk_view out,
                          uint32_t o_stride, jlm_err *err)
{
    return none(err);
}
int jlm_vk_rmsnorm_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, jlm_vk_view w, uint32_t n, uint32_t per,
                        uint32_t rows, uint32_t stride, float eps, jlm_err *err)
{
    return none(err);
}
int jlm_vk_add_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view a, jlm_vk_view b, uint32_t n, uint32_t rows,
                    jlm_err *err)
{
    return none(err);
}
int jlm_vk_scale_rows(jlm_vk *vk, jlm_vk_view out, jlm_vk_view x, const float *s, uint32_t n, uint32_t rows,
                      jlm_err *err)
{
    return none(err);
}
int jlm_vk_rope_rows(jlm_vk *vk, uint32_t n_rot, int neox, jlm_vk_view x, uint32_t n_head, uint32_t head_dim,
                     uint32_t x_stride, jlm_vk_view cs, uint32_t cs_stride, uint32_t rows, jlm_err *err)
{
    return none(err);
}
int jlm_vk_attention_kv(jlm_vk *vk, const jlm_k_attn *p, uint32_t n_head, uint32_t n_kv_head, jlm_vk_view q,
                        jlm_vk_view k, int kt, jlm_vk_view v, int vt, uint64_t n_kv, const float *sinks,
                        jlm_vk_view scratch, jlm_vk_view out, jlm_err *err) { return none(err); }

#endif
