/* The C baseline of benchmarks/launch.py: host cost of cuLaunchKernel for an empty kernel
 * with two arguments (a pointer and an int), in batches of 128 launches on one stream,
 * synchronized between batches; only the submissions are timed.
 *
 *   launch_c CUBIN KERNEL BATCHES  ->  prints the best batch's nanoseconds per launch
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

int main(int argc, char** argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s CUBIN KERNEL BATCHES\n", argv[0]); return 2; }
    int batches = atoi(argv[3]);
    CUdevice dev; CUcontext ctx; CUlibrary lib; CUkernel kernel; CUstream stream; CUdeviceptr p;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuLibraryLoadFromFile(&lib, argv[1], NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kernel, lib, argv[2]));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&p, 1024));
    int n = 3;
    void* params[2] = {&p, &n};
    long long best = -1;
    for (int b = 0; b < batches; ++b) {
        long long start = now_ns();
        for (int i = 0; i < BATCH; ++i)
            CHECK(cuLaunchKernel((CUfunction)kernel, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
        long long spent = now_ns() - start;
        CHECK(cuStreamSynchronize(stream));
        if (best < 0 || spent < best) best = spent;
    }
    printf("%.1f\n", (double)best / BATCH);
    CHECK(cuMemFree(p));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuLibraryUnload(lib));
    return 0;
}
