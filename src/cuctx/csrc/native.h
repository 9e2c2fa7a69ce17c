/* cuctx._native: the compiled fast path (docs/ARCHITECTURE.md, "The compiled fast path").
 *
 * The common case of a launch, an event record, a stream wait and a context push/pop, in C:
 * the same guards as the checked Python paths (exact types, context states, a host function
 * running, a trace sink listening), packing by the same launch plan (cuctx.kernels._plan.Plan), then
 * the driver call. Every other case is handed to the checked Python path, which raises the
 * same errors with the same messages: this module changes cost, never behaviour.
 *
 * No CUDA toolkit is needed to build it: the few driver function types are declared below,
 * and their addresses come from the driver at run time (cuGetProcAddress, through
 * cuda.bindings; cuctx/_driver/native.py). On the sim a Driver holds the SimDriver's Python
 * functions instead: only the final calls (the drv_* functions) differ, so every guard and
 * the packing run the same C code in CI.
 *
 * Objects are read through their __slots__, at offsets taken once from the classes' member
 * descriptors (`setup`); an offset is used only on an object whose type was checked.
 *
 * One extension module from several sources, each sharing what this header declares:
 *   native.c    module init, setup(): the classes, the slot offsets, the guards
 *   driver.c    Driver: the driver functions, in C or (the sim) in Python
 *   launch.c    Launch: packing the arguments, the launch
 *   launch_plan.c  Driver.launcher: a plan read into a Launch
 *   streams.c   Stream.record, Event.record, Stream.wait, Stream's hash
 *   contexts.c  context switches: push, pop, `with ctx:`, `with device:`
 *   methods.c   Method, and kernel[...], cuctx.launch, Launcher.__call__
 *   copies.c    host_address: a NumPy array's data address, for copies
 *   autograph.c an @autograph call's recorded launches, compared values, patches, launch
 *   autograph_call.c  an @autograph call: recording it
 *   autograph_serve.c serving it as a graph call, or its launches eagerly
 *   autograph_build.c building its graph: the kernel nodes and their GraphNodes
 *   arrays.c    cuctx.empty: its array made in C, of the memory an @autograph call's
 *               arena lends or (eagerly) of the pool's; an Allocation's free (__del__)
 */
#ifndef CUCTX_NATIVE_H
#define CUCTX_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000
#define PyFloat_Pack2 _PyFloat_Pack2
#define PyFloat_Pack4 _PyFloat_Pack4
#define PyFloat_Pack8 _PyFloat_Pack8
#endif

/* The names shared between the sources are the extension's own: hidden, so they neither
 * leave the shared library nor bind to a same-named symbol of the interpreter. */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* -- the driver functions, as cuda.h declares them (CUDA 12.0 ABI) -------------------- */

typedef int CUresult;
typedef CUresult (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shared, void *stream,
                              void **params, void **extra);
typedef CUresult (*launch_ex_fn)(const void *config, void *f, void **params, void **extra);
typedef CUresult (*record_fn)(void *event, void *stream);
typedef CUresult (*wait_fn)(void *stream, void *event, unsigned flags);
typedef CUresult (*push_fn)(void *ctx);
typedef CUresult (*pop_fn)(void **ctx);
typedef CUresult (*current_fn)(void **ctx);
typedef CUresult (*set_kernel_fn)(void *exec, void *node, const void *params);
typedef CUresult (*graph_launch_fn)(void *exec, void *stream);
typedef CUresult (*mem_alloc_fn)(unsigned long long *ptr, size_t nbytes, void *stream);
typedef CUresult (*mem_free_fn)(unsigned long long ptr, void *stream);
/* CUDA_KERNEL_NODE_PARAMS_v2 (what cuGraphAddKernelNode takes at ABI 12000); its layout is
 * checked against cuda.bindings' struct before it is used (cuctx/_driver/native.py). */
typedef struct {
    void *func;
    unsigned grid[3], block[3], shared;
    void **params, **extra;
    void *kern, *ctx;
} kernel_node_params;
typedef CUresult (*add_kernel_fn)(void **node, void *graph, void *const *deps, size_t ndeps,
                                  const kernel_node_params *params);

enum { F_LAUNCH, F_LAUNCH_EX, F_RECORD, F_WAIT, F_PUSH, F_POP, F_CURRENT, F_SET_KERNEL,
       F_GRAPH_LAUNCH, F_ADD_KERNEL, F_MEM_ALLOC, F_MEM_FREE, F_COUNT };

/* -- what setup() learnt about the classes (native.c) -------------------------------- */

struct native_setup {
    int ready;
    PyTypeObject *Context, *Stream, *Event, *DeviceArray, *ThreadState, *Device, *Kernel,
        *Launcher, *Tape;
    /* an @autograph call's (cuctx/graphs/_autograph*.py) */
    PyTypeObject *AutoGraph, *Recording, *Entry, *Policy, *Tally, *Arena, *Slot, *Lease;
    PyTypeObject *Allocation; /* cuctx.memory._alloc.Allocation (Lease subclasses it) */
    PyTypeObject *Backend; /* cuctx._driver.Backend */
    PyTypeObject *Code;    /* cuctx.kernels._library._Code: Library and Module */
    PyObject *ACTIVE;      /* cuctx._resource.ACTIVE: a context state, compared by identity */
    PyObject *CUresult;    /* makes the code of a failed call the enum fail() expects */
    PyObject *CUcontext;   /* a popped context's handle, for object_for */
    PyObject *fail;        /* cuctx._calls.fail */
    PyObject *object_for;  /* cuctx.context._object_for */
    PyObject *driver_dict; /* cuctx._driver's namespace: `_active` */
    PyObject *step_aside;  /* ((namespace, name), ...): step aside while any value is true */
    PyObject *launch_step_aside; /* the same for launches (a trace sink is not among them) */
    PyObject *announce;    /* ((namespace, name), ...): a launch is announced while any is true */
    PyObject *emit_launch; /* cuctx._trace.emit_launch(launcher, args, plan) */
    PyObject *recording;   /* cuctx._record.threads: the recorders of the recording threads */
    PyObject *autograph_dict, *policy_dict; /* the namespaces of _autograph, _autograph_policy */
    PyObject *GRAPH;       /* _autograph_state.GRAPH: an entry's mode, compared by identity */
    PyObject *CudaError;   /* cuctx.errors.CudaError: a refused patch rebuilds the graph */
    PyObject *defer;       /* _lifetimes.defer_cleanup(): the block an autograph call runs in */
    PyObject *lifetimes_dict; /* _lifetimes' namespace: the counter of that block */
    PyObject *perf_counter; /* time.perf_counter */
    PyObject *known_dtypes, *default_dtype; /* _layout.KNOWN_DTYPES, cuctx.empty's default */
    PyObject *from_pool;                    /* memory._alloc.from_pool: an eager allocation */
    PyObject *release;     /* memory._alloc._release: an allocation's free, as it is filed */
    PyObject *exiting;     /* _lifetimes.exiting: [True] once the interpreter exits */
    PyObject *alloc_step_aside, *free_step_aside; /* guards of an allocation and a free */
    /* slot offsets */
    Py_ssize_t backend, ctx, handle, key;          /* Resource */
    Py_ssize_t state, device, default_streams;     /* Context */
    Py_ssize_t sync_event, recorded;               /* Stream, Event */
    Py_ssize_t ptr, c_contiguous, dtype;           /* DeviceArray */
    Py_ssize_t stack, blocks, streams;             /* ThreadState */
    Py_ssize_t primary, lock, device_backend;      /* Device */
    Py_ssize_t launchers, launch_memo, fast;       /* Kernel, Launcher */
    Py_ssize_t tape_keys, tape_values, tape_items, tape_stream; /* cuctx._record.Tape */
    Py_ssize_t backend_native, backend_tls;        /* Backend */
    Py_ssize_t code_loaded;                        /* _Code (Library, Module) */
    Py_ssize_t array_shape, array_strides, array_alloc, array_owner, array_f; /* DeviceArray */
    Py_ssize_t alloc_slots[7];  /* Allocation's, in ALLOCATION_SLOTS' order (arrays.c) */
    Py_ssize_t alloc_ptr, alloc_stream, alloc_recorded, alloc_free; /* (among them) */
    Py_ssize_t ctx_allocations;                    /* Context._allocations */
    Py_ssize_t rec_streams, rec_ctx, rec_broken, rec_arena, rec_allocations, rec_roles,
        rec_role;                                  /* Recording */
    Py_ssize_t rec_slots[12];                      /* all of them, in RECORDING_SLOTS' order */
    Py_ssize_t arena_slots, arena_most, arena_lock, arena_grown, slot_lease, slot_capacity;
    Py_ssize_t ag_fn, ag_lock, ag_last, ag_tally, ag_arena, ag_policy, ag_max_bytes;
    Py_ssize_t e_keys, e_compiled, e_mode, e_values, e_patcher, e_seen, e_changes, e_count,
        e_size, e_eager_s, e_replay_s, e_construct_s, e_strikes;   /* Entry */
    Py_ssize_t p_measured, p_model, p_patch_s, p_whole_node_s, p_replay_node_s, p_run,
        p_run_entry;                                                /* Policy */
    Py_ssize_t t_calls, t_replays, t_updates, t_recording_s, t_replay_s, t_update_s,
        t_saved_s, t_patched_nodes;                                 /* Tally */
};
extern struct native_setup L;

extern PyObject *S_native, *S_tls, *S_tls_cache, *S_dict, *S_state, *S_loaded, *S_locked,
    *S_getPtr, *S_active, *S_shared_mem, *S_stream, *S_launch, *S_array_struct,
    *S_contexts, *S_legacy, *S_run, *S_trim, *S_acquire, *S_release, *S_call, *S_getitem,
    *S_defer_depth, *S_deferred, *S_orphans, *S_defer_lock, *S_SMOOTH, *S_SWITCH_AFTER, *ZERO;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* The sentinel an implementation returns to hand the call to the checked Python path. */
extern PyObject python_path_marker;
#define PYTHON_PATH (&python_path_marker)

Py_ssize_t slot_offset(PyTypeObject *type, const char *name);
int slot_offsets(PyTypeObject *type, const char *const *names, Py_ssize_t *offsets);
int any_true(PyObject *pairs);
/* announce.c: what _trace.emit_launch does, in C */
PyObject *announce_compiled_launch(PyObject *launcher, PyObject *args, PyObject *plan);
int loaded(PyObject *owner);
int step_aside(void);
int step_aside_unless_recording(void);
int recording(void);

/* -- Driver: the driver functions, in C or (the sim) in Python (driver.c) ----- */

typedef struct {
    PyObject_HEAD
    int compiled;
    int builds; /* kernel nodes are added from C (the struct's layout was checked) */
    void *c[F_COUNT];
    PyObject *py[F_COUNT];
} Driver;

extern PyTypeObject DriverType;

Driver *native_of(PyObject *backend);
void *key_of(PyObject *resource);
int py_result(PyObject *result, PyObject **second);
int drv_current(Driver *d, void **ctx);
int drv_push(Driver *d, PyObject *ctx);
int drv_pop(Driver *d, void **ctx, PyObject **handle);
int drv_record(Driver *d, PyObject *event, PyObject *stream);
int drv_wait(Driver *d, PyObject *stream, PyObject *event);
int enter_stream_context(Driver *d, PyObject *stream, PyObject *ctx, int *pushed);
void leave_stream_context(Driver *d, int pushed);
PyObject *fail(PyObject *backend, int err, const char *operation, PyObject *ctx);
int drv_mem_alloc(Driver *d, PyObject *ctx, PyObject *stream, size_t nbytes, PyObject **address);
int drv_mem_free(Driver *d, PyObject *ctx, PyObject *stream, PyObject *ptr);

/* -- Launch: one launcher's compiled fast path for one plan (launch.c) -------- */

/* The most parameter bytes and parameters a compiled launch packs on its stack; a kernel
 * with more takes the generated Python fast path. */
#define MAX_PARAM_BYTES 4096
#define MAX_PARAMS 512

enum { K_VALUE, K_ARRAY, K_CONVERT };

typedef struct {
    Py_ssize_t offset, size;
    char code; /* b h i q e f d Q s */
    int kind;
    PyTypeObject *type; /* the guard: exactly this type */
    PyObject *convert;  /* (arg, stream) -> value, or NULL */
    PyObject *dtypes;   /* an array's: the dtypes it may have (a tuple), or NULL: any */
} Param;

typedef struct Launch {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Driver *driver;
    PyObject *ctx, *owner, *device, *stream, *backend, *general, *fail, *config, *sim_args;
    PyObject *launcher, *plan; /* what a recorder takes with the packed bytes */
    void *function, *config_ptr;
    unsigned grid[3], block[3], shared;
    Py_ssize_t n, size;
    Param *params;
} Launch;

extern PyTypeObject LaunchType;

PyObject *Driver_launcher(Driver *self, PyObject *args, PyObject *kwargs);
PyObject *launch_run(Launch *l, PyObject *const *argv, Py_ssize_t n, PyObject *tuple);
PyObject *Launch_vectorcall(Launch *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames);
int launch_packed(PyObject *fast, PyObject *bytes);

/* -- the compiled paths a Method runs (streams.c, contexts.c) --------- */

PyObject *stream_record(PyObject *const *args, Py_ssize_t nargs);
PyObject *event_record(PyObject *const *args, Py_ssize_t nargs);
PyObject *stream_wait(PyObject *const *args, Py_ssize_t nargs);
Py_hash_t stream_tp_hash(PyObject *stream);
PyObject *context_push(PyObject *const *args, Py_ssize_t nargs);
PyObject *context_enter(PyObject *const *args, Py_ssize_t nargs);
PyObject *context_pop(PyObject *const *args, Py_ssize_t nargs);
PyObject *context_exit(PyObject *const *args, Py_ssize_t nargs);
PyObject *device_enter(PyObject *const *args, Py_ssize_t nargs);
PyObject *device_exit(PyObject *const *args, Py_ssize_t nargs);
PyObject *thread_state(PyObject *backend);
PyObject *current_stream(PyObject *backend, PyObject *ctx, int any_context);

/* -- a host array's address, for copies (copies.c) ------------------------------- */

PyObject *host_address(PyObject *module, PyObject *array);

/* -- an @autograph call's per-call path (autograph.c) ------------------------- */

extern PyTypeObject PatcherType;

PyObject *thread_recorder(void);
int record_launch(PyObject *recorder, PyObject *launcher, PyObject *stream, PyObject *bytes,
                  PyObject *args, PyObject *plan);
Py_ssize_t changed_into(PyObject *new, PyObject *old, Py_ssize_t *out);
void *address_of(PyObject *handle);
PyObject *Driver_changed(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Driver_patcher(Driver *self, PyObject *args, PyObject *kwargs);
int patcher_knows(PyObject *patcher, Py_ssize_t i);
int patcher_patch(PyObject *patcher, Py_ssize_t i, PyObject *value);
int patcher_ready(PyObject *patcher, PyObject *stream);
int patcher_launch(PyObject *patcher, PyObject *stream);
PyObject *autograph_call(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
int serve(PyObject *self, PyObject *rec);
PyObject *Driver_enqueue(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Driver_add_kernel_node(Driver *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Driver_add_kernel_chain(Driver *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *kernel_graph_nodes(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int node_params(PyObject *const *args, PyObject *data, PyObject *offsets,
                kernel_node_params *p, void **pointers);
int point_at(PyObject *data, PyObject *offsets, void **pointers);
PyObject *kernel_node_bytes(PyObject *module, PyObject *args);
int add_int(PyObject *obj, Py_ssize_t offset, Py_ssize_t delta);   /* int slot += delta */
int add_float(PyObject *obj, Py_ssize_t offset, double delta);     /* float slot += delta */

/* Seconds on the clock time.perf_counter reads (CLOCK_MONOTONIC on Linux). */
static inline double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
int recording_slot_offsets(void);
int install_autograph_call(void);

/* -- cuctx.empty and an allocation's free (arrays.c) ------------------------------ */

PyObject *array_empty(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *allocation_del(PyObject *const *args, Py_ssize_t nargs);
int allocation_slot_offsets(void);

/* -- Method: a compiled method standing in for a Python one (methods.c) ------- */

extern PyTypeObject MethodType;

int install_launcher_call(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif /* CUCTX_NATIVE_H */
