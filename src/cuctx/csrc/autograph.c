/* cuctx._native (see native.h): the compiled per-call path of an @autograph function
 * (cuctx/graphs/_autograph*.py, whose Python is the reference: the same steps, the same
 * results, with CUCTX_NATIVE=0):
 *
 *   record_launch     a compiled launch appended to the thread's recording (a Tape)
 *   Driver.changed    the indices of the values that differ from those an executable holds
 *   Patcher.patch     the executable's kernel nodes given the recorded parameter bytes
 *   Patcher.launch    the executable launched
 *
 * Every case these are not made for (a node that is not a kernel's, a trace sink, a host
 * function running, unloaded code...) goes back to the Python path; a refusal raises what
 * that path raises. */
#include "native.h"

/* -- recording ------------------------------------------------------------------------- */

/* The calling thread's recorder (a new reference), or NULL: none (no exception set) or an
 * exception. cuctx._record.threads maps the id of each recording thread to its recorder. */
PyObject *thread_recorder(void)
{
    if (PyDict_GET_SIZE(L.recording) == 1) { /* one thread records: this one? (no key made) */
        Py_ssize_t at = 0;
        PyObject *key, *recorder;
        if (PyDict_Next(L.recording, &at, &key, &recorder) && PyLong_CheckExact(key)) {
            unsigned long id = PyLong_AsUnsignedLong(key);
            if (!(id == (unsigned long)-1 && PyErr_Occurred()))
                return id == PyThread_get_thread_ident() ? Py_NewRef(recorder) : NULL;
            PyErr_Clear();
        }
    }
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (ident == NULL)
        return NULL;
    PyObject *recorder = PyDict_GetItemWithError(L.recording, ident);
    Py_DECREF(ident);
    return Py_XNewRef(recorder);
}

/* Undo the appends of a failed record: the three lists stay the same length. */
static void truncate_to(PyObject *list, Py_ssize_t length)
{
    if (PyList_GET_SIZE(list) > length)
        PyList_SetSlice(list, length, PyList_GET_SIZE(list), NULL);
}

/* Recording._follow(stream) for a call's first operation (no context, no stream yet): the
 * stream's context becomes the call's and the stream role 0, so that the first launch is
 * recorded here too. Any other recorder or moment: nothing (0). -1: an exception. */
static int follow_first(PyObject *recorder, PyObject *stream)
{
    if (!Py_IS_TYPE(recorder, L.Recording) || SLOT(recorder, L.tape_stream) != Py_None
            || SLOT(recorder, L.rec_ctx) != Py_None || !Py_IS_TYPE(stream, L.Stream))
        return 0;
    PyObject *streams = SLOT(recorder, L.rec_streams), *ctx = SLOT(stream, L.ctx),
             *roles = SLOT(recorder, L.rec_roles), *key = SLOT(stream, L.key);
    if (streams == NULL || !PyList_CheckExact(streams) || PyList_GET_SIZE(streams) != 0
            || roles == NULL || !PyDict_CheckExact(roles) || PyDict_GET_SIZE(roles) != 0
            || ctx == NULL || key == NULL)
        return 0;
    if (PyDict_SetItem(roles, key, ZERO) < 0)
        return -1;
    if (PyList_Append(streams, stream) < 0) {
        PyDict_Clear(roles);
        return -1;
    }
    Py_SETREF(SLOT(recorder, L.rec_ctx), Py_NewRef(ctx));
    Py_SETREF(SLOT(recorder, L.tape_stream), Py_NewRef(stream));
    Py_XSETREF(SLOT(recorder, L.rec_role), Py_NewRef(ZERO));
    return 0;
}

/* The launch of ``launcher`` on ``stream`` with these parameter bytes and arguments, handed
 * to ``recorder``: a Tape whose latest stream is ``stream`` gets the three appends here;
 * any other recorder's ``launch(launcher, bytes, args, plan)`` is called. 1: recorded;
 * 0: not (the recorder does not follow the stream); -1: an exception. */
int record_launch(PyObject *recorder, PyObject *launcher, PyObject *stream, PyObject *bytes,
                  PyObject *args, PyObject *plan)
{
    if (follow_first(recorder, stream) < 0)
        return -1;
    if (L.Tape != NULL && PyObject_TypeCheck(recorder, L.Tape)
            && SLOT(recorder, L.tape_stream) == stream) {
        PyObject *keys = SLOT(recorder, L.tape_keys), *values = SLOT(recorder, L.tape_values),
                 *items = SLOT(recorder, L.tape_items);
        if (keys && values && items && PyList_CheckExact(keys) && PyList_CheckExact(values)
                && PyList_CheckExact(items)) {
            Py_ssize_t n = PyList_GET_SIZE(keys);
            PyObject *item = PyTuple_Pack(2, args, plan);
            if (item == NULL)
                return -1;
            int failed = PyList_Append(keys, launcher) < 0 || PyList_Append(values, bytes) < 0
                         || PyList_Append(items, item) < 0;
            Py_DECREF(item);
            if (failed) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                truncate_to(keys, n);
                truncate_to(values, n);
                truncate_to(items, n);
                PyErr_Restore(type, value, tb);
                return -1;
            }
            return 1;
        }
    }
    PyObject *call[] = {recorder, launcher, bytes, args, plan};
    PyObject *took = PyObject_VectorcallMethod(S_launch, call,
                                               5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (took == NULL)
        return -1;
    int truth = PyObject_IsTrue(took);
    Py_DECREF(took);
    return truth;
}

/* -- comparing ------------------------------------------------------------------------- */

/* The indices where two lists of values differ (bytes compared by content, anything else by
 * !=), as `_autograph.AutoGraph._changed` finds them, into ``out`` (room for every index);
 * their number, or -1 with an exception. */
Py_ssize_t changed_into(PyObject *new, PyObject *old, Py_ssize_t *out)
{
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(new); i++) {
        PyObject *a = PyList_GET_ITEM(new, i), *b = PyList_GET_ITEM(old, i);
        if (a == b)
            continue;
        int differs;
        if (PyBytes_CheckExact(a) && PyBytes_CheckExact(b))
            differs = PyBytes_GET_SIZE(a) != PyBytes_GET_SIZE(b)
                      || memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b),
                                PyBytes_GET_SIZE(a)) != 0;
        else
            differs = PyObject_RichCompareBool(a, b, Py_NE);
        if (differs < 0)
            return -1;
        if (differs)
            out[k++] = i;
    }
    return k;
}

/* Driver.changed(new, old): changed_into as a list of ints. */
PyObject *Driver_changed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])
            || PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "changed(new, old) takes two lists of one length");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    Py_ssize_t *indices = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t));
    if (indices == NULL)
        return PyErr_NoMemory();
    Py_ssize_t k = changed_into(args[0], args[1], indices);
    PyObject *result = k < 0 ? NULL : PyList_New(k);
    for (Py_ssize_t j = 0; result && j < k; j++) {
        PyObject *index = PyLong_FromSsize_t(indices[j]);
        if (index == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, j, index);
    }
    PyMem_Free(indices);
    return result;
}

/* -- Patcher: one executable's kernel nodes patched from bytes, and its launch ---------- */

typedef struct {
    PyObject *node, *params, *buffer; /* NULL: not asked yet; node Py_None: not a kernel node */
    void *c_node, *c_params;          /* the handles in C (a GPU) */
    kernel_node_params *own;          /* or the struct kept here (a GPU: see learn) */
    PyObject *offsets;                /* and its parameters' offsets in the recorded bytes */
} Node;

typedef struct {
    PyObject_HEAD
    Driver *driver;
    PyObject *handle, *ctx, *streams, *owners, *make, *refused;
    void *c_handle;
    int launchable;
    Py_ssize_t n;
    Node *nodes;
} Patcher;

/* A handle (an int or a cuda.bindings object) as an address; NULL for 0 or with an
 * exception. */
void *address_of(PyObject *handle)
{
    PyObject *value = PyNumber_Long(handle);
    if (value == NULL)
        return NULL;
    void *address = PyLong_AsVoidPtr(value);
    Py_DECREF(value);
    return address;
}

/* Operation i's kernel node of (node handle, (function, kern, ctx, grid, block, shared_mem),
 * the parameters' offsets): its struct kept here, whose parameters point at the recorded
 * bytes of each patch (the driver copies them). 0, or -1 with an exception. */
static int learn_own(Node *node, PyObject *made)
{
    PyObject *call = PyTuple_GET_ITEM(made, 1), *offsets = PyTuple_GET_ITEM(made, 2);
    PyObject *none = PyTuple_New(0), *empty = PyBytes_FromStringAndSize("", 0);
    void *unused[1];
    kernel_node_params *own = PyMem_Malloc(sizeof(kernel_node_params));
    int failed = none == NULL || empty == NULL || own == NULL || PyTuple_GET_SIZE(call) != 6
                 || !PyTuple_Check(offsets) || PyTuple_GET_SIZE(offsets) > MAX_PARAMS
                 || node_params(&PyTuple_GET_ITEM(call, 0), empty, none, own, unused) < 0
                 || (node->c_node = address_of(PyTuple_GET_ITEM(made, 0))) == NULL;
    Py_XDECREF(none);
    Py_XDECREF(empty);
    if (failed) {
        PyMem_Free(own);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "make(i): (node, call, offsets) with a node, six "
                                              "call items and at most 512 offsets");
        return -1;
    }
    node->own = own;
    node->offsets = Py_NewRef(offsets);
    node->node = Py_NewRef(PyTuple_GET_ITEM(made, 0));
    return 0;
}

/* What make(i) says of operation i: None (no kernel node), or its kernel node as (node
 * handle, CUDA_KERNEL_NODE_PARAMS, its parameter buffer), or on a compiled driver that
 * builds as (node handle, add_kernel_node's call, offsets) (learn_own). 0, or -1 with an
 * exception. */
static int learn(Patcher *self, Py_ssize_t i)
{
    Node *node = &self->nodes[i];
    PyObject *index = PyLong_FromSsize_t(i);
    if (index == NULL)
        return -1;
    PyObject *made = PyObject_CallOneArg(self->make, index);
    Py_DECREF(index);
    if (made == NULL)
        return -1;
    if (made == Py_None) {
        node->node = made;
        return 0;
    }
    if (self->driver->compiled && self->driver->builds && PyTuple_Check(made)
            && PyTuple_GET_SIZE(made) == 3 && PyTuple_Check(PyTuple_GET_ITEM(made, 1))) {
        int failed = learn_own(node, made);
        Py_DECREF(made);
        return failed;
    }
    PyObject *handle, *params, *buffer;
    if (!PyTuple_Check(made) || !PyArg_ParseTuple(made, "OOO!", &handle, &params,
                                                  &PyByteArray_Type, &buffer)) {
        Py_DECREF(made);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "make(i): (node, params, bytearray) or None");
        return -1;
    }
    if (self->driver->compiled) {
        PyObject *address = PyObject_CallMethodNoArgs(params, S_getPtr);
        node->c_params = address ? PyLong_AsVoidPtr(address) : NULL;
        Py_XDECREF(address);
        node->c_node = node->c_params ? address_of(handle) : NULL;
        if (node->c_node == NULL) {
            Py_DECREF(made);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "make(i): a null handle");
            return -1;
        }
    }
    node->node = Py_NewRef(handle);
    node->params = Py_NewRef(params);
    node->buffer = Py_NewRef(buffer);
    Py_DECREF(made);
    return 0;
}

static int drv_set_kernel(Patcher *self, Node *node)
{
    Driver *d = self->driver;
    if (d->compiled)
        return ((set_kernel_fn)d->c[F_SET_KERNEL])(self->c_handle, node->c_node,
                                                    node->own ? node->own : node->c_params);
    PyObject *args[3] = {self->handle, node->node, node->params};
    return py_result(PyObject_Vectorcall(d->py[F_SET_KERNEL], args, 3, NULL), NULL);
}

/* refused(err, i): the error a refusal of operation i's patch (-1: of the launch) raises on
 * the Python path. */
static void refuse(Patcher *self, int err, Py_ssize_t i)
{
    PyObject *result = PyObject_CallFunction(self->refused, "in", err, i);
    Py_XDECREF(result);
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_SystemError, "a driver call of the executable failed with %d", err);
}

static int append_index(PyObject *list, Py_ssize_t i)
{
    PyObject *index = PyLong_FromSsize_t(i);
    int failed = index == NULL || PyList_Append(list, index) < 0;
    Py_XDECREF(index);
    return failed ? -1 : 0;
}

/* Learn what operation i's node is (once): 1 a kernel node the patcher patches, 0 another,
 * -1 an exception. */
int patcher_knows(PyObject *patcher, Py_ssize_t i)
{
    Patcher *self = (Patcher *)patcher;
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "patch: an index out of range");
        return -1;
    }
    Node *node = &self->nodes[i];
    if (node->node == NULL && learn(self, i) < 0)
        return -1;
    return node->node != Py_None;
}

/* Give operation i's kernel node (patcher_knows said 1) the bytes ``value``: 0, or -1 with
 * the exception GraphExec.update_node raises for a refusal. */
int patcher_patch(PyObject *patcher, Py_ssize_t i, PyObject *value)
{
    Patcher *self = (Patcher *)patcher;
    Node *node = &self->nodes[i];
    void *pointers[MAX_PARAMS];
    if (node->own != NULL) { /* its parameters at the recorded bytes */
        if (point_at(value, node->offsets, pointers) < 0)
            return -1;
        node->own->params = PyTuple_GET_SIZE(node->offsets) ? pointers : NULL;
    } else {
        Py_ssize_t size = PyBytes_GET_SIZE(value);
        if (size > PyByteArray_GET_SIZE(node->buffer))
            size = PyByteArray_GET_SIZE(node->buffer);
        memcpy(PyByteArray_AS_STRING(node->buffer), PyBytes_AS_STRING(value), size);
    }
    int err = drv_set_kernel(self, node);
    if (node->own != NULL)
        node->own->params = NULL; /* (the bytes are the caller's) */
    if (err > 0)
        refuse(self, err, i); /* raises what GraphExec.update_node raises */
    return err ? -1 : 0;
}

/* patch(changed, values): give each changed kernel node its recorded bytes; the indices
 * left to the Python path (other nodes, or none). A refusal raises as on that path. */
static PyObject *Patcher_patch(Patcher *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])
            || PyList_GET_SIZE(args[1]) != self->n) {
        PyErr_SetString(PyExc_TypeError, "patch(changed, values): two lists, values of "
                                         "every operation");
        return NULL;
    }
    PyObject *changed = args[0], *values = args[1], *left = PyList_New(0);
    if (left == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(changed); j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(changed, j));
        if (i == -1 && PyErr_Occurred())
            goto error;
        int kernel = patcher_knows((PyObject *)self, i);
        if (kernel < 0)
            goto error;
        PyObject *value = PyList_GET_ITEM(values, i);
        if (!kernel || !PyBytes_CheckExact(value)) {
            if (append_index(left, i) < 0)
                goto error;
            continue;
        }
        if (patcher_patch((PyObject *)self, i, value) < 0)
            goto error;
    }
    return left;
error:
    Py_DECREF(left);
    return NULL;
}

/* Whether patcher_launch can launch the executable on ``stream``: 1, or 0 where the Python
 * path launches it (host or event nodes, another context's stream, unloaded code, a trace
 * sink, a host function running), or -1 with an exception. */
int patcher_ready(PyObject *patcher, PyObject *stream)
{
    Patcher *self = (Patcher *)patcher;
    PyObject *ctx = self->ctx;
    if (!self->launchable || !L.ready || SLOT(ctx, L.state) != L.ACTIVE
            || step_aside_unless_recording() || !Py_IS_TYPE(stream, L.Stream)
            || SLOT(stream, L.ctx) != ctx)
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->owners); i++) {
        int is = loaded(PyTuple_GET_ITEM(self->owners, i));
        if (is <= 0)
            return is;
    }
    return 1;
}

/* The executable launched on ``stream`` (patcher_ready said 1): 0, or -1 with the exception
 * GraphExec.launch raises; 1: not launched after all (the stream's context could not be
 * made current: the Python path launches it). */
int patcher_launch(PyObject *patcher, PyObject *stream)
{
    Patcher *self = (Patcher *)patcher;
    Driver *d = self->driver;
    int pushed, err = enter_stream_context(d, stream, self->ctx, &pushed);
    if (err)
        return err < 0 ? -1 : 1;
    if (d->compiled) {
        void *s = key_of(stream);
        Py_BEGIN_ALLOW_THREADS /* a full queue waits for the GPU */
        err = ((graph_launch_fn)d->c[F_GRAPH_LAUNCH])(self->c_handle, s);
        Py_END_ALLOW_THREADS
    } else {
        PyObject *call[2] = {self->handle, SLOT(stream, L.handle)};
        err = py_result(PyObject_Vectorcall(d->py[F_GRAPH_LAUNCH], call, 2, NULL), NULL);
    }
    leave_stream_context(d, pushed);
    if (err > 0)
        refuse(self, err, -1);
    if (err)
        return -1;
    /* the executable's: they keep what it uses */
    return PySet_Add(self->streams, stream) < 0 ? -1 : 0;
}

/* launch(stream): the executable launched on ``stream``: True, or False where the Python
 * path launches it (see patcher_ready). A refusal raises as GraphExec.launch raises it. */
static PyObject *Patcher_launch(Patcher *self, PyObject *stream)
{
    int ready = patcher_ready((PyObject *)self, stream);
    if (ready <= 0)
        return ready < 0 ? NULL : Py_NewRef(Py_False);
    int err = patcher_launch((PyObject *)self, stream);
    if (err < 0)
        return NULL;
    return Py_NewRef(err ? Py_False : Py_True);
}

static int Patcher_traverse(Patcher *self, visitproc visit, void *arg)
{
    Py_VISIT(self->driver);
    Py_VISIT(self->handle);
    Py_VISIT(self->ctx);
    Py_VISIT(self->streams);
    Py_VISIT(self->owners);
    Py_VISIT(self->make);
    Py_VISIT(self->refused);
    for (Py_ssize_t i = 0; self->nodes && i < self->n; i++) {
        Py_VISIT(self->nodes[i].node);
        Py_VISIT(self->nodes[i].params);
        Py_VISIT(self->nodes[i].buffer);
        Py_VISIT(self->nodes[i].offsets);
    }
    return 0;
}

static int Patcher_clear(Patcher *self)
{
    Py_CLEAR(self->driver);
    Py_CLEAR(self->handle);
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->streams);
    Py_CLEAR(self->owners);
    Py_CLEAR(self->make);
    Py_CLEAR(self->refused);
    for (Py_ssize_t i = 0; self->nodes && i < self->n; i++) {
        Py_CLEAR(self->nodes[i].node);
        Py_CLEAR(self->nodes[i].params);
        Py_CLEAR(self->nodes[i].buffer);
        Py_CLEAR(self->nodes[i].offsets);
    }
    return 0;
}

static void Patcher_dealloc(Patcher *self)
{
    PyObject_GC_UnTrack(self);
    Patcher_clear(self);
    for (Py_ssize_t i = 0; self->nodes && i < self->n; i++)
        PyMem_Free(self->nodes[i].own);
    PyMem_Free(self->nodes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Patcher_methods[] = {
    {"patch", (PyCFunction)(void (*)(void))Patcher_patch, METH_FASTCALL,
     "patch(changed, values): each changed kernel node given its recorded bytes; returns "
     "the indices left to the Python path."},
    {"launch", (PyCFunction)Patcher_launch, METH_O,
     "launch(stream): True once launched; False: launch it through GraphExec.launch."},
    {NULL}};

PyTypeObject PatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cuctx._native.Patcher",
    .tp_doc = "One AutoGraph executable's compiled patches and launch (Driver.patcher).",
    .tp_basicsize = sizeof(Patcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Patcher_traverse,
    .tp_clear = (inquiry)Patcher_clear,
    .tp_dealloc = (destructor)Patcher_dealloc,
    .tp_methods = Patcher_methods,
};

/* Driver.patcher(handle, ctx, streams, owners, make, refused, n, launchable) */
PyObject *Driver_patcher(Driver *self, PyObject *args, PyObject *kwargs)
{
    PyObject *handle, *ctx, *streams, *owners, *make, *refused;
    Py_ssize_t n;
    int launchable;
    static char *names[] = {"handle", "ctx", "streams", "owners", "make", "refused", "n",
                            "launchable", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!OOnp:patcher", names, &handle, &ctx,
                                     &PySet_Type, &streams, &PyTuple_Type, &owners, &make,
                                     &refused, &n, &launchable))
        return NULL;
    if (!L.ready || n < 0 || !PyObject_TypeCheck(ctx, L.Context))
        return PyErr_Format(PyExc_TypeError, "patcher(): a Context and a count >= 0");
    void *c_handle = NULL;
    if (self->compiled && (c_handle = address_of(handle)) == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "a null executable");
    Patcher *p = PyObject_GC_New(Patcher, &PatcherType);
    if (p == NULL)
        return NULL;
    p->nodes = PyMem_Calloc(n ? n : 1, sizeof(Node));
    p->n = p->nodes ? n : 0;
    p->driver = (Driver *)Py_NewRef(self);
    p->handle = Py_NewRef(handle);
    p->ctx = Py_NewRef(ctx);
    p->streams = Py_NewRef(streams);
    p->owners = Py_NewRef(owners);
    p->make = Py_NewRef(make);
    p->refused = Py_NewRef(refused);
    p->c_handle = c_handle;
    p->launchable = launchable;
    PyObject_GC_Track(p);
    if (p->nodes == NULL) {
        Py_DECREF(p);
        return PyErr_NoMemory();
    }
    return (PyObject *)p;
}
