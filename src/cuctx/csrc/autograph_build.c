/* cuctx._native (see native.h): building an @autograph call's graph from its recording
 * (cuctx/graphs/_autograph_build.py is the reference: the same nodes, kept the same way):
 *
 *   Driver.add_kernel_node   a kernel node of a recorded launch, from its packed bytes
 *                            (a recording of several streams, or of copies and fills)
 *   Driver.add_kernel_chain  the kernel nodes of a recording of launches on one stream,
 *                            each after the one before, in one call
 *   kernel_graph_nodes       the GraphNode objects of a build's kernel nodes, in one call
 *   kernel_node_bytes        the struct they pass, for the check of its layout
 *
 * With the last two a build of launches costs about what the driver costs, not Python per
 * node (measured on an H100: 0.9 us a node to add them and make their GraphNodes, against
 * 0.8 for the driver's cuGraphAddKernelNode alone through cuda.bindings). Capturing the
 * launches instead, as the C program does, cost the same per node and a stream more. */
#include "native.h"

static int unsigned_three(PyObject *tuple, unsigned out[3])
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 3) {
        PyErr_SetString(PyExc_TypeError, "a dimension is a tuple of three ints");
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(tuple, i));
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return -1;
        out[i] = (unsigned)v;
    }
    return 0;
}

/* ``pointers[i]``: the address of parameter i in ``data`` (bytes), at ``offsets[i]``. 0, or
 * -1 with an exception. (The driver copies the parameters when it adds the node.) */
int point_at(PyObject *data, PyObject *offsets, void **pointers)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(offsets); i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, i));
        if (at < 0 || at >= PyBytes_GET_SIZE(data)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a parameter offset past the bytes");
            return -1;
        }
        pointers[i] = PyBytes_AS_STRING(data) + at;
    }
    return 0;
}

/* The struct of (function, kern, ctx, grid, block, shared_mem), its parameters pointing at
 * ``data`` by ``offsets`` (into ``pointers``, room for 512). 0, or -1 with an exception. */
int node_params(PyObject *const *args, PyObject *data, PyObject *offsets,
                kernel_node_params *p, void **pointers)
{
    memset(p, 0, sizeof(*p));
    if ((args[0] != Py_None && (p->func = address_of(args[0])) == NULL && PyErr_Occurred())
            || (args[1] != Py_None && (p->kern = address_of(args[1])) == NULL
                && PyErr_Occurred())
            || ((p->ctx = address_of(args[2])) == NULL && PyErr_Occurred())
            || unsigned_three(args[3], p->grid) < 0 || unsigned_three(args[4], p->block) < 0)
        return -1;
    unsigned long shared = PyLong_AsUnsignedLong(args[5]);
    if ((shared == (unsigned long)-1 && PyErr_Occurred()) || !PyBytes_CheckExact(data)
            || !PyTuple_Check(offsets) || PyTuple_GET_SIZE(offsets) > 512) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "the parameters: bytes and a tuple of offsets");
        return -1;
    }
    p->shared = (unsigned)shared;
    p->params = PyTuple_GET_SIZE(offsets) ? pointers : NULL;
    return point_at(data, offsets, pointers);
}

/* Driver.add_kernel_node(graph, deps, function, kern, ctx, grid, block, shared_mem, data,
 * offsets): cuGraphAddKernelNode of a kernel (``function`` a module's CUfunction, or
 * ``kern`` a library's CUkernel, the other None) with these parameter bytes, after ``deps``
 * (node handles); the new node's handle, an int. A refusal: (CUresult, None) to raise from
 * Python, as Graph.launch raises it. */
PyObject *Driver_add_kernel_node(Driver *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !self->compiled || !self->builds || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "add_kernel_node: ten arguments, deps a list, on a "
                                         "compiled driver that builds");
        return NULL;
    }
    kernel_node_params p;
    void *pointers[512], *deps[64], **dep = deps;
    void *graph = address_of(args[0]);
    if ((graph == NULL && PyErr_Occurred())
            || node_params(args + 2, args[8], args[9], &p, pointers) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[1]);
    if (n > 64 && (dep = PyMem_Malloc(n * sizeof(void *))) == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++)
        if ((dep[i] = address_of(PyList_GET_ITEM(args[1], i))) == NULL && PyErr_Occurred()) {
            if (dep != deps)
                PyMem_Free(dep);
            return NULL;
        }
    void *node = NULL;
    int err = ((add_kernel_fn)self->c[F_ADD_KERNEL])(&node, graph, dep, (size_t)n, &p);
    if (dep != deps)
        PyMem_Free(dep);
    if (err)
        return Py_BuildValue("(iO)", err, Py_None);
    return Py_BuildValue("(iN)", 0, PyLong_FromVoidPtr(node));
}

/* The slots a chain's GraphNodes are given (their offsets, read once from the type). */
enum { N_GRAPH, N_KIND, N_SITE, N_DESCRIPTION, N_HANDLE, N_KEEP, N_KERNEL, N_CONFIG, N_EXTRA,
       N_COUNT };
static const char *const NODE_SLOTS[N_COUNT + 1] = {
    "graph", "kind", "site", "description", "_handle", "_keep", "_kernel", "_config", "_extra",
    NULL};
static PyTypeObject *node_type_seen;
static Py_ssize_t node_slots[N_COUNT], launcher_kernel, launcher_config, launcher_owner;
static PyObject *S_kernel_kind;

static int chain_offsets(PyTypeObject *node_type)
{
    if (node_type == node_type_seen)
        return 0;
    if (slot_offsets(node_type, NODE_SLOTS, node_slots) < 0)
        return -1;
    if ((launcher_kernel = slot_offset(L.Launcher, "kernel")) < 0
            || (launcher_config = slot_offset(L.Launcher, "config")) < 0
            || (launcher_owner = slot_offset(L.Launcher, "_owner")) < 0)
        return -1;
    if (S_kernel_kind == NULL && (S_kernel_kind = PyUnicode_InternFromString("kernel")) == NULL)
        return -1;
    node_type_seen = node_type;
    return 0;
}

/* The arrays on leases one build anchored (borrowed: the array from the recording's items,
 * its anchor from the keep of the node that made it): a temporary used by several launches
 * (a call's scratch, in each of its kernels) is anchored once, not once a node. */
enum { ANCHORS_KEPT = 8 };
typedef struct {
    PyObject *array[ANCHORS_KEPT], *kept[ANCHORS_KEPT];
    int n;
} Anchors;

static PyObject *anchored(Anchors *seen, PyObject *anchor, PyObject *array)
{
    for (int i = 0; i < seen->n; i++)
        if (seen->array[i] == array)
            return Py_NewRef(seen->kept[i]);
    PyObject *kept = PyObject_CallOneArg(anchor, array);
    if (kept != NULL && seen->n < ANCHORS_KEPT) {
        seen->array[seen->n] = array;
        seen->kept[seen->n++] = kept;
    }
    return kept;
}

/* The GraphNode of launch ``launcher`` (its arguments ``args``) added as ``handle``: what
 * _autograph_build.kernel_node makes, its ``keep`` the kernel's library and the arguments,
 * each through ``anchor`` where it is an array on a lease (a temporary's block, not its
 * lease). A new reference, or NULL with an exception (the build then stops). */
static PyObject *chain_node(PyTypeObject *node_type, PyObject *graph, PyObject *site,
                            PyObject *description, PyObject *handle, PyObject *launcher,
                            PyObject *args, PyObject *anchor, Anchors *seen)
{
    PyObject *kernel, *config, *owner;
    if (!Py_IS_TYPE(launcher, L.Launcher) || (kernel = SLOT(launcher, launcher_kernel)) == NULL
            || (config = SLOT(launcher, launcher_config)) == NULL
            || (owner = SLOT(launcher, launcher_owner)) == NULL || !PyTuple_Check(args)) {
        PyErr_SetString(PyExc_TypeError, "kernel_graph_nodes: a launcher and its arguments");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *keep = PyTuple_New(n + 1);
    if (keep == NULL)
        return NULL;
    PyTuple_SET_ITEM(keep, 0, Py_NewRef(owner));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *arg = PyTuple_GET_ITEM(args, i), *alloc;
        PyObject *kept = Py_IS_TYPE(arg, L.DeviceArray) && (alloc = SLOT(arg, L.array_alloc))
                         && Py_IS_TYPE(alloc, L.Lease) ? anchored(seen, anchor, arg)
                                                       : Py_NewRef(arg);
        if (kept == NULL) {
            Py_DECREF(keep);
            return NULL;
        }
        PyTuple_SET_ITEM(keep, i + 1, kept);
    }
    PyObject *node = node_type->tp_alloc(node_type, 0);
    if (node == NULL) {
        Py_DECREF(keep);
        return NULL;
    }
    PyObject *values[N_COUNT] = {graph, S_kernel_kind, site, description, handle, keep, kernel,
                                 config, Py_None};
    for (int k = 0; k < N_COUNT; k++)
        SLOT(node, node_slots[k]) = k == N_KEEP ? keep : Py_NewRef(values[k]);
    return node;
}

/* The struct of spec (a NodeSpec: add_kernel_node's arguments, the parameters' offsets,
 * the description) pointing at ``data``'s bytes, into ``p`` and ``pointers``; ``*parsed``
 * the spec ``p`` was made from (a launcher's nodes share it: only the pointers change).
 * 0, or -1 with an exception. */
static int spec_params(PyObject *spec, PyObject *data, kernel_node_params *p, void **pointers,
                       PyObject **parsed)
{
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3
            || !PyTuple_Check(PyTuple_GET_ITEM(spec, 0))
            || PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 0)) != 6) {
        PyErr_SetString(PyExc_TypeError, "a build's spec is a NodeSpec");
        return -1;
    }
    PyObject *offsets = PyTuple_GET_ITEM(spec, 1);
    if (spec != *parsed) {
        if (node_params(&PyTuple_GET_ITEM(PyTuple_GET_ITEM(spec, 0), 0), data, offsets, p,
                        pointers) < 0)
            return -1;
        *parsed = spec;
        return 0;
    }
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "a build's parameters are bytes");
        return -1;
    }
    return point_at(data, offsets, pointers);
}

/* Driver.add_kernel_chain(graph, specs, values): the kernel nodes of a recording of
 * launches on one stream, each after the one before, added to the CUgraph ``graph`` in one
 * call: node i of ``specs[i]`` with the parameter bytes ``values[i]``. (0, their handles
 * as ints), or (CUresult, the index of the refused node) to raise from Python; NULL with
 * an exception for a spec that is not one. */
PyObject *Driver_add_kernel_chain(Driver *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !self->compiled || !self->builds || !PyList_CheckExact(args[1])
            || !PyList_CheckExact(args[2])
            || PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError, "add_kernel_chain: a graph and two lists of one "
                                         "length, on a compiled driver that builds");
        return NULL;
    }
    void *graph = address_of(args[0]);
    if (graph == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(args[1]);
    PyObject *handles = PyList_New(count);
    if (handles == NULL)
        return NULL;
    kernel_node_params p;
    void *pointers[512], *node = NULL;
    PyObject *parsed = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (spec_params(PyList_GET_ITEM(args[1], i), PyList_GET_ITEM(args[2], i), &p, pointers,
                        &parsed) < 0) {
            Py_DECREF(handles);
            return NULL;
        }
        void *after = node;
        int err = ((add_kernel_fn)self->c[F_ADD_KERNEL])(&node, graph, &after, i ? 1 : 0, &p);
        if (err) {
            Py_DECREF(handles);
            return Py_BuildValue("(in)", err, i);
        }
        PyObject *handle = PyLong_FromVoidPtr(node);
        if (handle == NULL) {
            Py_DECREF(handles);
            return NULL;
        }
        PyList_SET_ITEM(handles, i, handle);
    }
    return Py_BuildValue("(iN)", 0, handles);
}

/* kernel_graph_nodes(graph, handles, specs, keys, items, site, anchor, node_type,
 * handle_type): the GraphNodes of a build's kernel nodes (``handles``, ints, in the
 * recording's order): node i of launcher ``keys[i]``, its arguments ``items[i][0]``,
 * described by ``specs[i]``, its handle a ``handle_type`` (CUgraphNode), its site the
 * call's; what _autograph_build.kernel_node makes for each. */
PyObject *kernel_graph_nodes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || !L.ready || !PyType_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "kernel_graph_nodes: nine arguments, the node type "
                                         "eighth, once cuctx._native is set up");
        return NULL;
    }
    PyObject *graph = args[0], *handles = args[1], *specs = args[2], *keys = args[3],
             *items = args[4], *site = args[5], *anchor = args[6], *handle_type = args[8];
    PyTypeObject *node_type = (PyTypeObject *)args[7];
    Py_ssize_t count = PyList_Check(handles) ? PyList_GET_SIZE(handles) : -1;
    if (count < 0 || !PyList_Check(specs) || !PyList_Check(keys) || !PyList_Check(items)
            || PyList_GET_SIZE(specs) != count || PyList_GET_SIZE(keys) != count
            || PyList_GET_SIZE(items) != count) {
        PyErr_SetString(PyExc_TypeError, "kernel_graph_nodes: four lists of one length");
        return NULL;
    }
    if (chain_offsets(node_type) < 0)
        return NULL;
    PyObject *nodes = PyList_New(count);
    if (nodes == NULL)
        return NULL;
    Anchors seen = {.n = 0};
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *spec = PyList_GET_ITEM(specs, i), *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3 || !PyTuple_Check(item)
                || PyTuple_GET_SIZE(item) < 1) {
            PyErr_SetString(PyExc_TypeError, "kernel_graph_nodes: a NodeSpec and an item each");
            Py_DECREF(nodes);
            return NULL;
        }
        PyObject *handle = PyObject_CallOneArg(handle_type, PyList_GET_ITEM(handles, i));
        PyObject *made = handle == NULL ? NULL
            : chain_node(node_type, graph, site, PyTuple_GET_ITEM(spec, 2), handle,
                         PyList_GET_ITEM(keys, i), PyTuple_GET_ITEM(item, 0), anchor, &seen);
        Py_XDECREF(handle);
        if (made == NULL) {
            Py_DECREF(nodes);
            return NULL;
        }
        PyList_SET_ITEM(nodes, i, made);
    }
    return nodes;
}

/* kernel_node_bytes(function, kern, ctx, grid, block, shared_mem, params_address): the
 * bytes of the struct add_kernel_node passes, for the check of its layout against
 * cuda.bindings' CUDA_KERNEL_NODE_PARAMS (cuctx/_driver/native.py). */
PyObject *kernel_node_bytes(PyObject *module, PyObject *args)
{
    PyObject *items[7];
    if (!PyArg_UnpackTuple(args, "kernel_node_bytes", 7, 7, &items[0], &items[1], &items[2],
                           &items[3], &items[4], &items[5], &items[6]))
        return NULL;
    kernel_node_params p;
    void *pointers[1];
    PyObject *empty = PyTuple_New(0), *data = PyBytes_FromStringAndSize("", 0);
    int failed = empty == NULL || data == NULL || node_params(items, data, empty, &p, pointers);
    Py_XDECREF(empty);
    Py_XDECREF(data);
    if (failed)
        return NULL;
    p.params = address_of(items[6]);
    if (p.params == NULL && PyErr_Occurred())
        return NULL;
    return PyBytes_FromStringAndSize((const char *)&p, sizeof(p));
}
