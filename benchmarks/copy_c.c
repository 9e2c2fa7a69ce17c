/* The C baseline of benchmarks/bandwidth.py's host cost of a copy: cuMemcpyHtoDAsync and
 * cuMemcpyDtoHAsync of CHUNK-byte slices of page-locked host memory to and from device memory
 * (slice i of SLICES, as benchmarks/overlap.py's pipeline copies its chunks), in batches of
 * BATCH copies on one non-blocking stream, synchronized between batches; only the submissions
 * are timed. Three rounds, interleaved, so drift hits both directions alike.
 *
 *   copy_c CHUNK SLICES BATCH BATCHES  ->  "HtoD NS" and "DtoH NS" lines: the best batch's
 *                                          nanoseconds per copy of each
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    const char* s_; cuGetErrorName(r_, &s_); fprintf(stderr, "%s: %s\n", #call, s_); return 1; } } while (0)

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int best_ns(int to_device, CUdeviceptr dev, char* host, size_t chunk, int slices,
                   int batch, int batches, CUstream stream, double* ns) {
    long long best = -1;
    for (int b = 0; b < batches; ++b) {
        long long start = now_ns();
        for (int i = 0; i < batch; ++i) {
            size_t offset = (size_t)(i % slices) * chunk;
            if (to_device)
                CHECK(cuMemcpyHtoDAsync(dev + offset, host + offset, chunk, stream));
            else
                CHECK(cuMemcpyDtoHAsync(host + offset, dev + offset, chunk, stream));
        }
        long long spent = now_ns() - start;
        CHECK(cuStreamSynchronize(stream));
        if (best < 0 || spent < best) best = spent;
    }
    *ns = (double)best / batch;
    return 0;
}

int main(int argc, char** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s CHUNK SLICES BATCH BATCHES\n", argv[0]);
        return 2;
    }
    size_t chunk = (size_t)atoll(argv[1]);
    int slices = atoi(argv[2]), batch = atoi(argv[3]), batches = atoi(argv[4]);
    CUdevice device; CUcontext ctx; CUstream stream; CUdeviceptr dev; void* host;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&dev, chunk * slices));
    CHECK(cuMemHostAlloc(&host, chunk * slices, CU_MEMHOSTALLOC_PORTABLE));
    double htod = 0, dtoh = 0;
    for (int round = 0; round < 3; ++round) {
        double h, d;
        if (best_ns(1, dev, host, chunk, slices, batch, batches, stream, &h)) return 1;
        if (best_ns(0, dev, host, chunk, slices, batch, batches, stream, &d)) return 1;
        if (round == 0 || h < htod) htod = h;
        if (round == 0 || d < dtoh) dtoh = d;
    }
    printf("HtoD %.1f\nDtoH %.1f\n", htod, dtoh);
    CHECK(cuMemFreeHost(host));
    CHECK(cuMemFree(dev));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuDevicePrimaryCtxRelease(device));
    return 0;
}
