/* The C baseline of benchmarks/launch.py: host cost of cuLaunchKernel for an empty kernel
 * with two arguments (a pointer and an int), in batches of 128 launches on one stream,
 * synchronized between batches; only the submissions are timed. Two kinds of handle, as
 * cuctx launches them: a context-independent CUkernel (cuLibraryGetKernel, what a
 * cuctx.Library launches) and a CUfunction of a module (cuModuleGetFunction, a cuctx.Module).
 *
 *   launch_c CUBIN KERNEL BATCHES  ->  "CUkernel NS" and "CUfunction NS" lines: the best
 *                                      batch's nanoseconds per launch of each
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    const char* s_; cuGetErrorName(r_, &s_); fprintf(stderr, "%s: %s\n", #call, s_); return 1; } } while (0)
#define BATCH 128

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int best_ns(CUfunction f, CUstream stream, void** params, int batches, double* ns) {
    long long best = -1;
    for (int b = 0; b < batches; ++b) {
        long long start = now_ns();
        for (int i = 0; i < BATCH; ++i)
            CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
        long long spent = now_ns() - start;
        CHECK(cuStreamSynchronize(stream));
        if (best < 0 || spent < best) best = spent;
    }
    *ns = (double)best / BATCH;
    return 0;
}

int main(int argc, char** argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s CUBIN KERNEL BATCHES\n", argv[0]); return 2; }
    int batches = atoi(argv[3]);
    CUdevice dev; CUcontext ctx; CUlibrary lib; CUkernel kernel; CUmodule mod; CUfunction fn;
    CUstream stream; CUdeviceptr p;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuLibraryLoadFromFile(&lib, argv[1], NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kernel, lib, argv[2]));
    CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&fn, mod, argv[2]));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&p, 1024));
    int n = 3;
    void* params[2] = {&p, &n};
    double ns_kernel, ns_function;
    for (int round = 0; round < 3; ++round) {  /* interleaved, so drift hits both alike */
        double k, f;
        if (best_ns((CUfunction)kernel, stream, params, batches, &k)) return 1;
        if (best_ns(fn, stream, params, batches, &f)) return 1;
        if (round == 0 || k < ns_kernel) ns_kernel = k;
        if (round == 0 || f < ns_function) ns_function = f;
    }
    printf("CUkernel %.1f\nCUfunction %.1f\n", ns_kernel, ns_function);
    CHECK(cuMemFree(p));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuModuleUnload(mod));
    CHECK(cuLibraryUnload(lib));
    return 0;
}
