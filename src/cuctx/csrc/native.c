/* cuctx._native (see native.h): module init, and setup(), which takes the classes and
 * helpers the compiled paths read, the slot offsets, and the guards (step_aside). */
#include "native.h"

/* -- what setup() learnt about the classes -------------------------------------------- */

struct native_setup L;

PyObject *S_native, *S_tls, *S_tls_cache, *S_dict, *S_state, *S_loaded, *S_locked,
    *S_getPtr, *S_active, *S_shared_mem, *S_stream, *S_launch, *S_array_struct,
    *S_contexts, *S_legacy, *S_run, *S_trim, *S_acquire, *S_release, *S_call, *S_getitem,
    *S_defer_depth, *S_deferred, *S_orphans, *S_defer_lock, *S_SMOOTH, *S_SWITCH_AFTER, *ZERO;

/* The sentinel an implementation returns to hand the call to the checked Python path. */
PyObject python_path_marker;

Py_ssize_t slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)
            && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX)
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ attribute", type->tp_name, name);
    Py_DECREF(descr);
    return offset;
}

/* slot_offset of each of the NULL-terminated ``names`` into ``offsets``, in their order: 0,
 * or -1 with an exception. */
int slot_offsets(PyTypeObject *type, const char *const *names, Py_ssize_t *offsets)
{
    for (int i = 0; names[i] != NULL; i++)
        if ((offsets[i] = slot_offset(type, names[i])) < 0)
            return -1;
    return 0;
}

/* Whether any value of ((namespace, name), ...) is true (a missing name is false). */
int any_true(PyObject *pairs)
{
    Py_ssize_t n = PyTuple_GET_SIZE(pairs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, i);
        PyObject *value = PyDict_GetItemWithError(PyTuple_GET_ITEM(pair, 0),
                                                  PyTuple_GET_ITEM(pair, 1));
        if (value == NULL) {
            PyErr_Clear();
            continue;
        }
        int truth = PyObject_IsTrue(value);
        if (truth) {
            if (truth < 0)
                PyErr_Clear();
            return 1;
        }
    }
    return 0;
}

/* Whether a launch's code (a Library or Module) is loaded: 1, 0, or -1 with an
 * exception (another owner's `_loaded` that cannot be read). */
int loaded(PyObject *owner)
{
    if (L.ready && PyObject_TypeCheck(owner, L.Code)) {
        PyObject *value = SLOT(owner, L.code_loaded);
        return value == Py_True;
    }
    PyObject *value = PyObject_GetAttr(owner, S_loaded);
    if (value == NULL)
        return -1;
    Py_DECREF(value);
    return value == Py_True;
}

/* True while a trace sink listens, a host function runs, ...: the checked paths announce
 * or refuse what these paths would do silently. A thread recording an autograph call is
 * not among them: a compiled launch hands its packed bytes to the recorder itself. */
int step_aside_unless_recording(void)
{
    return any_true(L.step_aside);
}

/* Some thread records an autograph call (the dict is mutated in place, never replaced). */
int recording(void)
{
    return PyDict_GET_SIZE(L.recording) > 0;
}

/* ... and the compiled record and wait step aside for a recording thread too: the Python
 * paths hand the operation to its recorder. */
int step_aside(void)
{
    return step_aside_unless_recording() || recording();
}

/* -- setup ------------------------------------------------------------------------------ */

static int take_type(PyObject *kwargs, const char *name, PyTypeObject **out)
{
    PyObject *value = PyDict_GetItemString(kwargs, name);
    if (value == NULL || !PyType_Check(value)) {
        PyErr_Format(PyExc_TypeError, "setup needs the class %s", name);
        return -1;
    }
    Py_XSETREF(*out, (PyTypeObject *)Py_NewRef(value));
    return 0;
}

static int take(PyObject *kwargs, const char *name, PyObject **out)
{
    PyObject *value = PyDict_GetItemString(kwargs, name);
    if (value == NULL) {
        PyErr_Format(PyExc_TypeError, "setup needs %s", name);
        return -1;
    }
    Py_XSETREF(*out, Py_NewRef(value));
    return 0;
}

static PyObject *setup(PyObject *module, PyObject *args, PyObject *kwargs)
{
    if (kwargs == NULL || PyTuple_GET_SIZE(args) != 0)
        return PyErr_Format(PyExc_TypeError, "setup takes keyword arguments only");
    const unsigned one = 1;
    if (*(const char *)&one != 1)
        return PyErr_Format(PyExc_RuntimeError, "the compiled path packs little-endian only");
    if (take_type(kwargs, "Context", &L.Context) || take_type(kwargs, "Stream", &L.Stream)
            || take_type(kwargs, "Event", &L.Event)
            || take_type(kwargs, "DeviceArray", &L.DeviceArray)
            || take_type(kwargs, "ThreadState", &L.ThreadState)
            || take_type(kwargs, "Device", &L.Device) || take_type(kwargs, "Kernel", &L.Kernel)
            || take_type(kwargs, "Launcher", &L.Launcher) || take_type(kwargs, "Tape", &L.Tape)
            || take_type(kwargs, "AutoGraph", &L.AutoGraph)
            || take_type(kwargs, "Recording", &L.Recording)
            || take_type(kwargs, "Entry", &L.Entry) || take_type(kwargs, "Policy", &L.Policy)
            || take_type(kwargs, "Tally", &L.Tally) || take_type(kwargs, "Arena", &L.Arena)
            || take_type(kwargs, "Slot", &L.Slot) || take_type(kwargs, "Lease", &L.Lease)
            || take_type(kwargs, "Allocation", &L.Allocation)
            || take_type(kwargs, "Backend", &L.Backend) || take_type(kwargs, "Code", &L.Code)
            || take(kwargs, "ACTIVE", &L.ACTIVE) || take(kwargs, "CUresult", &L.CUresult)
            || take(kwargs, "CUcontext", &L.CUcontext) || take(kwargs, "fail", &L.fail)
            || take(kwargs, "object_for", &L.object_for)
            || take(kwargs, "driver_namespace", &L.driver_dict)
            || take(kwargs, "step_aside", &L.step_aside)
            || take(kwargs, "launch_step_aside", &L.launch_step_aside)
            || take(kwargs, "announce", &L.announce)
            || take(kwargs, "emit_launch", &L.emit_launch)
            || take(kwargs, "recording", &L.recording)
            || take(kwargs, "autograph_namespace", &L.autograph_dict)
            || take(kwargs, "policy_namespace", &L.policy_dict)
            || take(kwargs, "GRAPH", &L.GRAPH) || take(kwargs, "CudaError", &L.CudaError)
            || take(kwargs, "defer", &L.defer) || take(kwargs, "perf_counter", &L.perf_counter)
            || take(kwargs, "lifetimes_namespace", &L.lifetimes_dict)
            || take(kwargs, "known_dtypes", &L.known_dtypes)
            || take(kwargs, "default_dtype", &L.default_dtype)
            || take(kwargs, "from_pool", &L.from_pool) || take(kwargs, "release", &L.release)
            || take(kwargs, "exiting", &L.exiting)
            || take(kwargs, "alloc_step_aside", &L.alloc_step_aside)
            || take(kwargs, "free_step_aside", &L.free_step_aside))
        return NULL;
    if (!PyList_CheckExact(L.exiting) || PyList_GET_SIZE(L.exiting) != 1)
        return PyErr_Format(PyExc_TypeError, "exiting: a list of one flag");
    if (!PyDict_Check(L.autograph_dict) || !PyDict_Check(L.policy_dict)
            || !PyDict_Check(L.lifetimes_dict) || !PyDict_CheckExact(L.known_dtypes))
        return PyErr_Format(PyExc_TypeError, "the namespaces and known_dtypes: dicts");
    if (!PyDict_Check(L.driver_dict) || !PyDict_CheckExact(L.recording)
            || !PyCallable_Check(L.emit_launch))
        return PyErr_Format(PyExc_TypeError,
                            "driver_namespace: a dict; recording: a dict; emit_launch: a callable");
    PyObject *guards[] = {L.step_aside, L.launch_step_aside, L.announce, L.alloc_step_aside,
                          L.free_step_aside};
    for (size_t g = 0; g < sizeof(guards) / sizeof(guards[0]); g++) {
        if (!PyTuple_Check(guards[g]))
            return PyErr_Format(PyExc_TypeError, "step_aside, launch_step_aside, announce, "
                                "alloc_step_aside, free_step_aside: tuples of (namespace, "
                                "name) pairs");
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(guards[g]); i++) {
            PyObject *pair = PyTuple_GET_ITEM(guards[g], i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
                    || !PyDict_Check(PyTuple_GET_ITEM(pair, 0)))
                return PyErr_Format(PyExc_TypeError,
                                    "the guards hold (namespace, name) pairs");
        }
    }
    struct { Py_ssize_t *offset; PyTypeObject **type; const char *name; } slots[] = {
        {&L.backend, &L.Stream, "_backend"}, {&L.ctx, &L.Stream, "_ctx"},
        {&L.handle, &L.Stream, "_handle"}, {&L.key, &L.Stream, "_key"},
        {&L.state, &L.Context, "_state"}, {&L.device, &L.Context, "_device"},
        {&L.sync_event, &L.Stream, "_sync_event"}, {&L.recorded, &L.Event, "_recorded"},
        {&L.ptr, &L.DeviceArray, "ptr"}, {&L.c_contiguous, &L.DeviceArray, "_c"},
        {&L.dtype, &L.DeviceArray, "dtype"},
        {&L.stack, &L.ThreadState, "stack"}, {&L.blocks, &L.ThreadState, "blocks"},
        {&L.streams, &L.ThreadState, "streams"},
        {&L.default_streams, &L.Context, "_default_streams"},
        {&L.primary, &L.Device, "_primary"}, {&L.lock, &L.Device, "_lock"},
        {&L.device_backend, &L.Device, "_backend"}, {&L.launchers, &L.Kernel, "_launchers"},
        {&L.launch_memo, &L.Kernel, "_launch_memo"},
        {&L.fast, &L.Launcher, "_fast"}, {&L.tape_keys, &L.Tape, "keys"},
        {&L.tape_values, &L.Tape, "values"}, {&L.tape_items, &L.Tape, "items"},
        {&L.tape_stream, &L.Tape, "_stream"},
        {&L.backend_native, &L.Backend, "native"}, {&L.backend_tls, &L.Backend, "tls"},
        {&L.code_loaded, &L.Code, "_loaded"},
        {&L.array_shape, &L.DeviceArray, "shape"}, {&L.array_strides, &L.DeviceArray, "strides"},
        {&L.array_alloc, &L.DeviceArray, "_alloc"}, {&L.array_owner, &L.DeviceArray, "_owner"},
        {&L.array_f, &L.DeviceArray, "_f"},
        {&L.ctx_allocations, &L.Context, "_allocations"},
        {&L.rec_streams, &L.Recording, "streams"}, {&L.rec_ctx, &L.Recording, "ctx"},
        {&L.rec_broken, &L.Recording, "broken"}, {&L.rec_arena, &L.Recording, "arena"},
        {&L.rec_allocations, &L.Recording, "allocations"},
        {&L.rec_roles, &L.Recording, "roles"}, {&L.rec_role, &L.Recording, "_role"},
        {&L.arena_slots, &L.Arena, "slots"}, {&L.arena_most, &L.Arena, "_most"},
        {&L.arena_lock, &L.Arena, "lock"}, {&L.arena_grown, &L.Arena, "_grown"},
        {&L.slot_lease, &L.Slot, "lease"}, {&L.slot_capacity, &L.Slot, "capacity"},
        {&L.ag_fn, &L.AutoGraph, "_fn"}, {&L.ag_lock, &L.AutoGraph, "_lock"},
        {&L.ag_last, &L.AutoGraph, "_last"}, {&L.ag_tally, &L.AutoGraph, "_tally"},
        {&L.ag_arena, &L.AutoGraph, "_arena"}, {&L.ag_policy, &L.AutoGraph, "_policy"},
        {&L.ag_max_bytes, &L.AutoGraph, "max_bytes"},
        {&L.e_keys, &L.Entry, "keys"}, {&L.e_compiled, &L.Entry, "compiled"},
        {&L.e_mode, &L.Entry, "mode"}, {&L.e_values, &L.Entry, "values"},
        {&L.e_patcher, &L.Entry, "patcher"}, {&L.e_seen, &L.Entry, "seen"},
        {&L.e_changes, &L.Entry, "changes"}, {&L.e_count, &L.Entry, "count"},
        {&L.e_size, &L.Entry, "size"}, {&L.e_eager_s, &L.Entry, "eager_s"},
        {&L.e_replay_s, &L.Entry, "replay_s"}, {&L.e_construct_s, &L.Entry, "construct_s"},
        {&L.e_strikes, &L.Entry, "strikes"},
        {&L.p_measured, &L.Policy, "measured"}, {&L.p_model, &L.Policy, "model"},
        {&L.p_patch_s, &L.Policy, "patch_s"}, {&L.p_whole_node_s, &L.Policy, "whole_node_s"},
        {&L.p_replay_node_s, &L.Policy, "replay_node_s"}, {&L.p_run, &L.Policy, "run"},
        {&L.p_run_entry, &L.Policy, "run_entry"},
        {&L.t_calls, &L.Tally, "calls"}, {&L.t_replays, &L.Tally, "replays"},
        {&L.t_updates, &L.Tally, "updates"}, {&L.t_recording_s, &L.Tally, "recording_s"},
        {&L.t_replay_s, &L.Tally, "replay_s"}, {&L.t_update_s, &L.Tally, "update_s"},
        {&L.t_saved_s, &L.Tally, "saved_s"}, {&L.t_patched_nodes, &L.Tally, "patched_nodes"}};
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++)
        if ((*slots[i].offset = slot_offset(*slots[i].type, slots[i].name)) < 0)
            return NULL;
    if (recording_slot_offsets() < 0 || allocation_slot_offsets() < 0)
        return NULL;
    /* Resource's slots sit at one offset in every subclass; Context, Event, DeviceArray and
     * Kernel must be Resources for the offsets read from Stream to hold for them */
    PyTypeObject *resources[] = {L.Context, L.Event, L.DeviceArray, L.Kernel};
    for (size_t i = 0; i < 4; i++)
        if (slot_offset(resources[i], "_key") != L.key
                || slot_offset(resources[i], "_backend") != L.backend)
            return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError,
                "%s's resource slots differ from Stream's", resources[i]->tp_name);
    /* Stream.__hash__ (Python) stays what `Stream.__hash__` names; the type's slot, which
     * dicts and hash() call, computes the same value in C. Subclasses would have copied the
     * old slot: there are none. */
    PyObject *subclasses = PyObject_CallMethod((PyObject *)L.Stream, "__subclasses__", NULL);
    if (subclasses == NULL)
        return NULL;
    if (PyList_GET_SIZE(subclasses) == 0) {
        L.Stream->tp_hash = stream_tp_hash;
        PyType_Modified(L.Stream);
    }
    Py_DECREF(subclasses);
    if (install_launcher_call() < 0 || install_autograph_call() < 0)
        return NULL;
    L.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(**classes and helpers): what the compiled paths read (see cuctx._native_hooks)"},
    {"kernel_node_bytes", kernel_node_bytes, METH_VARARGS,
     "kernel_node_bytes(function, kern, ctx, grid, block, shared_mem, params_address): the "
     "struct Driver.add_kernel_node passes, as bytes (its layout is checked against "
     "cuda.bindings')"},
    {"kernel_graph_nodes", (PyCFunction)(void (*)(void))kernel_graph_nodes, METH_FASTCALL,
     "kernel_graph_nodes(graph, handles, specs, keys, items, site, anchor, node_type, "
     "handle_type): the GraphNodes of a build's kernel nodes (see autograph_build.c)"},
    {"host_address", host_address, METH_O,
     "host_address(ndarray): the address of its first element (__array_interface__'s data)"},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "cuctx._native",
    "The compiled fast path of cuctx (see cuctx._native_hooks and docs/ARCHITECTURE.md).",
    -1, module_methods};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&DriverType) < 0 || PyType_Ready(&LaunchType) < 0
            || PyType_Ready(&MethodType) < 0 || PyType_Ready(&PatcherType) < 0)
        return NULL;
    struct { PyObject **s; const char *text; } names[] = {
        {&S_native, "native"}, {&S_tls, "tls"}, {&S_tls_cache, "cuctx._native thread state"},
        {&S_dict, "__dict__"}, {&S_state, "state"}, {&S_loaded, "_loaded"},
        {&S_locked, "locked"}, {&S_getPtr, "getPtr"}, {&S_active, "_active"},
        {&S_shared_mem, "shared_mem"}, {&S_stream, "stream"}, {&S_launch, "launch"},
        {&S_array_struct, "__array_struct__"}, {&S_contexts, "contexts"},
        {&S_legacy, "legacy"}, {&S_run, "_run"}, {&S_trim, "trim"}, {&S_acquire, "acquire"},
        {&S_release, "release"}, {&S_call, "__call__"}, {&S_getitem, "__getitem__"},
        {&S_defer_depth, "_defer_depth"}, {&S_orphans, "orphans"}, {&S_deferred, "_deferred"},
        {&S_defer_lock, "_defer_lock"}, {&S_SMOOTH, "SMOOTH"},
        {&S_SWITCH_AFTER, "SWITCH_AFTER"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].s = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    if ((ZERO = PyLong_FromLong(0)) == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Driver", (PyObject *)&DriverType) < 0
            || PyModule_AddObjectRef(module, "Launch", (PyObject *)&LaunchType) < 0
            || PyModule_AddObjectRef(module, "Method", (PyObject *)&MethodType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
