/* device.c - the CUDA device probe. Built with -DJLM_CUDA=1 and linked with
 * the CUDA runtime when the Makefile found nvcc (CUDA=1); otherwise a stub
 * that says the backend was not built. The count starts at 0 and stays 0 on
 * any failure: cudaGetDeviceCount on a machine without a usable driver
 * returns an error (35, cudaErrorInsufficientDriver, on the CI machine) and
 * leaves its output undefined. */
#include "kernels/cuda/cuda.h"

#include <stdio.h>
#include <string.h>

#ifdef JLM_CUDA
#include <cuda_runtime_api.h>

void jlm_cu_probe(jlm_cu_info *info)
{
    memset(info, 0, sizeof *info);
    info->built = 1;
    int rt = 0, n = 0;
    if (cudaRuntimeGetVersion(&rt) == cudaSuccess)
        info->runtime = rt;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(info->reason, sizeof info->reason, "cudaGetDeviceCount: %s (error %d)",
                 cudaGetErrorString(e), (int)e);
        cudaGetLastError();                       /* clear the sticky state */
        return;
    }
    if (n <= 0) {
        snprintf(info->reason, sizeof info->reason, "cudaGetDeviceCount: no CUDA device");
        return;
    }
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
        snprintf(info->reason, sizeof info->reason, "cudaGetDeviceProperties: %s (error %d)",
                 cudaGetErrorString(e), (int)e);
        return;
    }
    info->count = n;
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->mem_bytes = prop.totalGlobalMem;
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
}

#else

void jlm_cu_probe(jlm_cu_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->reason, sizeof info->reason, "not built (no nvcc at build time, or make CUDA=0)");
}

#endif

void jlm_cu_describe(char *buf, size_t len)
{
    jlm_cu_info in;
    jlm_cu_probe(&in);
    if (!in.built)
        snprintf(buf, len, "cuda: %s", in.reason);
    else if (in.count == 0)
        snprintf(buf, len, "cuda: built (runtime %d.%d, sm_80 sm_90), no device: %s",
                 in.runtime / 1000, in.runtime % 1000 / 10, in.reason);
    else
        snprintf(buf, len, "cuda: built (runtime %d.%d), %d device(s): %s, %.1f GiB, sm_%d%d",
                 in.runtime / 1000, in.runtime % 1000 / 10, in.count, in.name,
                 (double)in.mem_bytes / (1u << 30), in.cc_major, in.cc_minor);
}
