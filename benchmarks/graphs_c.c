/* The C baselines of benchmarks/graphs.py: what CUDA graphs cost through the driver API, with
 * no Python anywhere. The kernel is tiny and takes (float* x, int a, int i); N launches of it
 * on one stream form a chain (each waits for the one before).
 *
 *   graphs_c CUBIN KERNEL N ROUNDS K...
 *
 * prints one measurement per line, "NAME VALUE" (the best of ROUNDS), for graphs.py to parse:
 *   eager_us_per_kernel       N launches then a synchronize, per kernel
 *   capture_ms                capturing the N launches into a graph
 *   instantiate_ms            cuGraphInstantiate of that graph
 *   capture_instantiate_ms    both, timed together: a graph made of the N launches, ready to
 *                             launch (what an AutoGraph build does; benchmarks/autograph.py),
 *                             the best of 3 * ROUNDS: from one process to the next its best of
 *                             5 ranged from 1.4 to 2.7 ms for 1000 kernels on one H100
 *   replay_us_per_node        cuGraphLaunch then a synchronize, per node
 *   patch_us_kK               K changed nodes patched one by one (cuGraphExecKernelNodeSetParams)
 *   update_us_kK              cuGraphExecUpdate from a graph built beforehand with K nodes changed
 *   capture_update_us_kK      re-capture with K nodes changed + cuGraphExecUpdate (llama.cpp's way)
 *   reinstantiate_us_kK       cuGraphInstantiate of that graph + cuGraphExecDestroy of the old one
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    const char* s_; cuGetErrorName(r_, &s_); fprintf(stderr, "%s: %s\n", #call, s_); \
    exit(1); } } while (0)

static CUfunction function;
static CUstream stream;
static CUdeviceptr x;
static int n_nodes;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static double min_of(double a, double b) { return a < b ? a : b; }

/* The value of node i's scalar: 1, except for the first `changed` nodes spread evenly over the
 * chain, which get `value`. */
static int scalar(int i, int changed, int value) {
    return changed > 0 && i % (n_nodes / changed) == 0 && i / (n_nodes / changed) < changed
        ? value : 1;
}

static void launch_chain(int changed, int value) {
    for (int i = 0; i < n_nodes; ++i) {
        int a = scalar(i, changed, value);
        void* params[3] = {&x, &a, &i};
        CHECK(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
    }
}

static CUgraph capture_chain(int changed, int value) {
    CUgraph graph;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    launch_chain(changed, value);
    CHECK(cuStreamEndCapture(stream, &graph));
    return graph;
}

/* The same chain built node by node, keeping the node handles (for per-node patches). The
 * kernel parameters are copied by the driver when each node is added. */
static CUgraph build_chain(CUgraphNode* nodes, int changed, int value) {
    CUgraph graph;
    CHECK(cuGraphCreate(&graph, 0));
    for (int i = 0; i < n_nodes; ++i) {
        int a = scalar(i, changed, value);
        void* params[3] = {&x, &a, &i};
        CUDA_KERNEL_NODE_PARAMS p = {0};
        p.func = function;
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 32; p.blockDimY = p.blockDimZ = 1;
        p.kernelParams = params;
        CHECK(cuGraphAddKernelNode(&nodes[i], graph, i ? &nodes[i - 1] : NULL, i ? 1 : 0, &p));
    }
    return graph;
}

static void update(CUgraphExec exec, CUgraph graph) {
    CUgraphExecUpdateResultInfo info;
    CHECK(cuGraphExecUpdate(exec, graph, &info));
}

int main(int argc, char** argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s CUBIN KERNEL N ROUNDS K...\n", argv[0]); return 2; }
    n_nodes = atoi(argv[3]);
    int rounds = atoi(argv[4]);
    CUdevice dev; CUcontext ctx; CUlibrary lib; CUkernel kernel;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuLibraryLoadFromFile(&lib, argv[1], NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kernel, lib, argv[2]));
    CHECK(cuKernelGetFunction(&function, kernel));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&x, 4096 * sizeof(float)));
    CHECK(cuMemsetD32(x, 0, 4096));

    double eager = 1e30, capture = 1e30, instantiate = 1e30, replay = 1e30;
    launch_chain(0, 1);  /* warm: the module is loaded on first use */
    CHECK(cuStreamSynchronize(stream));
    for (int r = 0; r < rounds; ++r) {
        double t0 = now_us();
        launch_chain(0, 1);
        CHECK(cuStreamSynchronize(stream));
        eager = min_of(eager, now_us() - t0);
    }
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    for (int r = 0; r < rounds; ++r) {
        if (graph) CHECK(cuGraphDestroy(graph));
        double t0 = now_us();
        graph = capture_chain(0, 1);
        capture = min_of(capture, now_us() - t0);
    }
    for (int r = 0; r < rounds; ++r) {
        if (exec) CHECK(cuGraphExecDestroy(exec));
        double t0 = now_us();
        CHECK(cuGraphInstantiate(&exec, graph, 0));
        instantiate = min_of(instantiate, now_us() - t0);
    }
    double build = 1e30;
    for (int r = 0; r < 3 * rounds; ++r) {
        CUgraphExec built;
        double t0 = now_us();
        CUgraph captured = capture_chain(0, 1);
        CHECK(cuGraphInstantiate(&built, captured, 0));
        build = min_of(build, now_us() - t0);
        CHECK(cuGraphExecDestroy(built));
        CHECK(cuGraphDestroy(captured));
    }
    CHECK(cuGraphUpload(exec, stream));
    CHECK(cuGraphLaunch(exec, stream));
    CHECK(cuStreamSynchronize(stream));
    for (int r = 0; r < rounds * 4; ++r) {
        double t0 = now_us();
        CHECK(cuGraphLaunch(exec, stream));
        CHECK(cuStreamSynchronize(stream));
        replay = min_of(replay, now_us() - t0);
    }
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    printf("eager_us_per_kernel %.4f\n", eager / n_nodes);
    printf("capture_ms %.4f\n", capture / 1e3);
    printf("instantiate_ms %.4f\n", instantiate / 1e3);
    printf("capture_instantiate_ms %.4f\n", build / 1e3);
    printf("replay_us_per_node %.4f\n", replay / n_nodes);

    CUgraphNode* nodes = malloc(sizeof(CUgraphNode) * n_nodes);
    CUgraphNode* other_nodes = malloc(sizeof(CUgraphNode) * n_nodes);
    for (int a = 5; a < argc; ++a) {
        int k = atoi(argv[a]);
        if (k < 1 || k > n_nodes) { fprintf(stderr, "K must be in 1..N, not %d\n", k); return 2; }
        /* Two versions of the chain that differ in k nodes; each measurement flips the
         * executable from one to the other, so every update really changes k nodes. */
        CUgraph base = build_chain(nodes, 0, 1);
        CUgraph changed = build_chain(other_nodes, k, 2);
        CUgraph versions[2] = {base, changed};
        CHECK(cuGraphInstantiate(&exec, base, 0));
        double patch = 1e30, whole = 1e30, recapture = 1e30, reinstantiate = 1e30;
        int flips = 0;
        for (int r = 0; r < rounds; ++r) {
            int value = ++flips & 1 ? 2 : 1;
            double t0 = now_us();
            for (int j = 0; j < k; ++j) {
                int i = j * (n_nodes / k);
                int a = value;
                void* params[3] = {&x, &a, &i};
                CUDA_KERNEL_NODE_PARAMS p = {0};
                p.func = function;
                p.gridDimX = p.gridDimY = p.gridDimZ = 1;
                p.blockDimX = 32; p.blockDimY = p.blockDimZ = 1;
                p.kernelParams = params;
                CHECK(cuGraphExecKernelNodeSetParams(exec, nodes[i], &p));
            }
            patch = min_of(patch, now_us() - t0);
        }
        for (int r = 0; r < rounds; ++r) {
            double t0 = now_us();
            update(exec, versions[++flips & 1]);
            whole = min_of(whole, now_us() - t0);
        }
        for (int r = 0; r < rounds; ++r) {
            int value = ++flips & 1 ? 2 : 1;
            double t0 = now_us();
            CUgraph captured = capture_chain(k, value);
            update(exec, captured);
            recapture = min_of(recapture, now_us() - t0);
            CHECK(cuGraphDestroy(captured));
        }
        for (int r = 0; r < rounds; ++r) {
            CUgraphExec fresh;
            double t0 = now_us();
            CHECK(cuGraphInstantiate(&fresh, versions[++flips & 1], 0));
            CHECK(cuGraphExecDestroy(exec));
            reinstantiate = min_of(reinstantiate, now_us() - t0);
            exec = fresh;
        }
        CHECK(cuGraphLaunch(exec, stream));  /* the updated executable still runs */
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuGraphExecDestroy(exec));
        CHECK(cuGraphDestroy(base));
        CHECK(cuGraphDestroy(changed));
        printf("patch_us_k%d %.4f\n", k, patch);
        printf("update_us_k%d %.4f\n", k, whole);
        printf("capture_update_us_k%d %.4f\n", k, recapture);
        printf("reinstantiate_us_k%d %.4f\n", k, reinstantiate);
        fflush(stdout);
    }
    free(nodes);
    free(other_nodes);
    CHECK(cuMemFree(x));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuLibraryUnload(lib));
    return 0;
}
