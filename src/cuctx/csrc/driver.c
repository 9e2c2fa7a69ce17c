/* cuctx._native (see native.h): Driver, the driver functions the compiled paths call, in C
 * (a GPU) or the SimDriver's in Python (the sim); the drv_* calls are the only place the two
 * differ. */
#include "native.h"

static const char *const FUNCTION_NAMES[F_COUNT] = {
    "cuLaunchKernel", "cuLaunchKernelEx", "cuEventRecord", "cuStreamWaitEvent",
    "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxGetCurrent", "cuGraphExecKernelNodeSetParams",
    "cuGraphLaunch", "cuGraphAddKernelNode", "cuMemAllocAsync", "cuMemFreeAsync"};

void *key_of(PyObject *resource)
{
    PyObject *key = SLOT(resource, L.key);
    return key ? PyLong_AsVoidPtr(key) : NULL;
}

Driver *native_of(PyObject *backend)
{
    if (L.ready && Py_IS_TYPE(backend, L.Backend)) { /* the slot, read directly */
        PyObject *native = SLOT(backend, L.backend_native);
        return native && Py_IS_TYPE(native, &DriverType) ? (Driver *)native : NULL;
    }
    PyObject *native = PyObject_GetAttr(backend, S_native);
    if (native == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(native); /* the backend holds it */
    return Py_IS_TYPE(native, &DriverType) ? (Driver *)native : NULL;
}

/* The CUresult of a Python driver function's (CUresult, ...) tuple; its second item in
 * *second (a new reference) when asked for. -1: a Python exception is set. */
int py_result(PyObject *result, PyObject **second)
{
    if (result == NULL)
        return -1;
    if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) < (second ? 2 : 1)) {
        Py_DECREF(result);
        PyErr_SetString(PyExc_TypeError, "a driver function returned no (CUresult, ...) tuple");
        return -1;
    }
    long code = PyLong_AsLong(PyTuple_GET_ITEM(result, 0));
    if (second)
        *second = Py_NewRef(PyTuple_GET_ITEM(result, 1));
    Py_DECREF(result);
    if (code == -1 && PyErr_Occurred()) {
        if (second)
            Py_CLEAR(*second);
        return -1;
    }
    return (int)code;
}

int drv_current(Driver *d, void **ctx)
{
    if (d->compiled)
        return ((current_fn)d->c[F_CURRENT])(ctx);
    PyObject *handle = NULL; /* py_result leaves it unset when the call raised */
    int err = py_result(PyObject_CallNoArgs(d->py[F_CURRENT]), &handle);
    if (err) { /* no handle to read */
        Py_XDECREF(handle);
        return err;
    }
    PyObject *value = PyNumber_Long(handle);
    Py_DECREF(handle);
    if (value == NULL)
        return -1;
    *ctx = PyLong_AsVoidPtr(value);
    Py_DECREF(value);
    return err;
}

int drv_push(Driver *d, PyObject *ctx)
{
    if (d->compiled)
        return ((push_fn)d->c[F_PUSH])(key_of(ctx));
    return py_result(PyObject_CallOneArg(d->py[F_PUSH], SLOT(ctx, L.handle)), NULL);
}

/* *handle: the popped context's handle object on the sim, NULL in C (a new reference). */
int drv_pop(Driver *d, void **ctx, PyObject **handle)
{
    *handle = NULL;
    if (d->compiled)
        return ((pop_fn)d->c[F_POP])(ctx);
    int err = py_result(PyObject_CallNoArgs(d->py[F_POP]), handle);
    if (err)
        return err; /* the caller drops *handle */
    PyObject *value = PyNumber_Long(*handle);
    if (value == NULL) {
        Py_CLEAR(*handle);
        return -1;
    }
    *ctx = PyLong_AsVoidPtr(value);
    Py_DECREF(value);
    return err;
}

int drv_record(Driver *d, PyObject *event, PyObject *stream)
{
    if (d->compiled) {
        void *e = key_of(event), *s = key_of(stream);
        CUresult err;
        Py_BEGIN_ALLOW_THREADS /* it can wait for room in a full queue */
        err = ((record_fn)d->c[F_RECORD])(e, s);
        Py_END_ALLOW_THREADS
        return err;
    }
    PyObject *args[2] = {SLOT(event, L.handle), SLOT(stream, L.handle)};
    return py_result(PyObject_Vectorcall(d->py[F_RECORD], args, 2, NULL), NULL);
}

int drv_wait(Driver *d, PyObject *stream, PyObject *event)
{
    if (d->compiled) {
        void *s = key_of(stream), *e = key_of(event);
        CUresult err;
        Py_BEGIN_ALLOW_THREADS
        err = ((wait_fn)d->c[F_WAIT])(s, e, 0);
        Py_END_ALLOW_THREADS
        return err;
    }
    PyObject *args[3] = {SLOT(stream, L.handle), SLOT(event, L.handle), ZERO};
    return py_result(PyObject_Vectorcall(d->py[F_WAIT], args, 3, NULL), NULL);
}

/* A default stream's handle means "the current context's", so work on one runs with the
 * stream's context current (as Stream._bind does): push it unless it is current.
 * Returns 0 (*pushed says whether it pushed), a CUresult of the push, or -1. */
int enter_stream_context(Driver *d, PyObject *stream, PyObject *ctx, int *pushed)
{
    *pushed = 0;
    if ((size_t)key_of(stream) > 2) /* a created or adopted stream: no context needed */
        return 0;
    void *current = NULL;
    int err = drv_current(d, &current);
    if (err < 0)
        return -1;
    if (err == 0 && current == key_of(ctx))
        return 0;
    err = drv_push(d, ctx);
    *pushed = err == 0;
    return err;
}

void leave_stream_context(Driver *d, int pushed)
{
    if (!pushed)
        return;
    void *ignored;
    PyObject *handle;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* a pending error of the call stays the error */
    if (drv_pop(d, &ignored, &handle) < 0)
        PyErr_Clear();
    Py_XDECREF(handle);
    PyErr_Restore(type, value, tb);
}

/* With ``ctx`` (a Context) current: pushed unless it is current already (the common case
 * costs one cuCtxGetCurrent). 0 (*pushed says whether it pushed), or NULL's -1 with an
 * exception (a refused push raised as `fail` raises it). */
static int enter_context(Driver *d, PyObject *ctx, int *pushed, const char *operation)
{
    *pushed = 0;
    if (!L.ready || !Py_IS_TYPE(ctx, L.Context)) {
        PyErr_Format(PyExc_TypeError, "%s takes a Context first", operation);
        return -1;
    }
    if (SLOT(ctx, L.state) != L.ACTIVE) { /* pushing a destroyed context corrupts the heap */
        PyErr_Format(PyExc_ValueError, "%s: the context is not active", operation);
        return -1;
    }
    void *current = NULL;
    int err = drv_current(d, &current);
    if (err < 0)
        return -1;
    if (err == 0 && current == key_of(ctx))
        return 0;
    err = drv_push(d, ctx);
    if (err > 0)
        fail(SLOT(ctx, L.backend), err, "cuCtxPushCurrent", ctx);
    if (err)
        return -1;
    *pushed = 1;
    return 0;
}

/* Driver.call_in(ctx, fn, *args): ``fn(*args)`` with ``ctx`` (an active Context) current.
 * Stream._call's way: the driver resolves a default stream's handle, and checks a copy's
 * device pointers, against the current context, not the stream's. */
static PyObject *Driver_call_in(Driver *self, PyObject *const *args, Py_ssize_t nargs)
{
    int pushed;
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "call_in(ctx, fn, *args) takes a Context first");
        return NULL;
    }
    if (enter_context(self, args[0], &pushed, "call_in") < 0)
        return NULL;
    PyObject *result = PyObject_Vectorcall(args[1], args + 2, nargs - 2, NULL);
    leave_stream_context(self, pushed);
    return result;
}

/* cuMemAllocAsync of ``nbytes`` on ``stream`` (a Stream of the active Context ``ctx``) with
 * ``ctx`` current, as call_in calls it: the CUresult (the address, an int, in *address on
 * success), or -1 with an exception. */
int drv_mem_alloc(Driver *d, PyObject *ctx, PyObject *stream, size_t nbytes, PyObject **address)
{
    int pushed, err;
    *address = NULL;
    if (enter_context(d, ctx, &pushed, "mem_alloc") < 0)
        return -1;
    if (d->compiled) {
        unsigned long long ptr = 0;
        void *s = key_of(stream);
        Py_BEGIN_ALLOW_THREADS /* the pool may have to grow */
        err = ((mem_alloc_fn)d->c[F_MEM_ALLOC])(&ptr, nbytes, s);
        Py_END_ALLOW_THREADS
        if (err == 0 && (*address = PyLong_FromUnsignedLongLong(ptr)) == NULL)
            err = -1;
    } else {
        PyObject *size = PyLong_FromSize_t(nbytes), *handle = NULL;
        PyObject *call[2] = {size, SLOT(stream, L.handle)};
        err = size ? py_result(PyObject_Vectorcall(d->py[F_MEM_ALLOC], call, 2, NULL), &handle)
                   : -1;
        if (err == 0 && (*address = PyNumber_Long(handle)) == NULL)
            err = -1;
        Py_XDECREF(handle);
        Py_XDECREF(size);
    }
    leave_stream_context(d, pushed);
    return err;
}

/* cuMemFreeAsync of ``ptr`` (an int) on ``stream`` with ``ctx`` current (as drv_mem_alloc):
 * the CUresult, or -1 with an exception. */
int drv_mem_free(Driver *d, PyObject *ctx, PyObject *stream, PyObject *ptr)
{
    int pushed, err;
    unsigned long long address = PyLong_AsUnsignedLongLong(ptr);
    if (address == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (enter_context(d, ctx, &pushed, "mem_free") < 0)
        return -1;
    if (d->compiled) {
        void *s = key_of(stream);
        Py_BEGIN_ALLOW_THREADS
        err = ((mem_free_fn)d->c[F_MEM_FREE])(address, s);
        Py_END_ALLOW_THREADS
    } else {
        PyObject *call[2] = {ptr, SLOT(stream, L.handle)};
        err = py_result(PyObject_Vectorcall(d->py[F_MEM_FREE], call, 2, NULL), NULL);
    }
    leave_stream_context(d, pushed);
    return err;
}

/* Driver.mem_alloc(ctx, stream, nbytes): drv_mem_alloc for Python (memory._alloc.from_pool):
 * (0, the address, an int) or (CUresult, None) for Python to raise. */
static PyObject *Driver_mem_alloc(Driver *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyObject_TypeCheck(args[1], L.Stream) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "mem_alloc(ctx, stream, nbytes)");
        return NULL;
    }
    size_t nbytes = PyLong_AsSize_t(args[2]);
    if (nbytes == (size_t)-1 && PyErr_Occurred())
        return NULL;
    PyObject *address;
    int err = drv_mem_alloc(self, args[0], args[1], nbytes, &address);
    if (err < 0)
        return NULL;
    return err ? Py_BuildValue("(iO)", err, Py_None) : Py_BuildValue("(iN)", 0, address);
}

/* Driver.mem_free(ctx, stream, ptr): drv_mem_free for Python (memory._alloc._release): the
 * CUresult, an int. */
static PyObject *Driver_mem_free(Driver *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyObject_TypeCheck(args[1], L.Stream) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "mem_free(ctx, stream, ptr)");
        return NULL;
    }
    int err = drv_mem_free(self, args[0], args[1], args[2]);
    return err < 0 ? NULL : PyLong_FromLong(err);
}

/* _calls.fail(backend, CUresult(err), operation, ctx): raises; returns NULL. */
PyObject *fail(PyObject *backend, int err, const char *operation, PyObject *ctx)
{
    PyObject *code = PyObject_CallFunction(L.CUresult, "i", err);
    if (code == NULL)
        return NULL;
    PyObject *result = PyObject_CallFunction(L.fail, "OOsO", backend, code, operation, ctx);
    Py_DECREF(code);
    Py_XDECREF(result);
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_SystemError, "%s failed with %d", operation, err);
    return NULL;
}

static PyObject *Driver_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *functions;
    static char *names[] = {"functions", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!:Driver", names, &PyDict_Type,
                                     &functions))
        return NULL;
    Driver *self = (Driver *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    int ints = 0;
    for (int i = 0; i < F_COUNT; i++) {
        PyObject *f = PyDict_GetItemString(functions, FUNCTION_NAMES[i]);
        if (f == NULL) {
            PyErr_Format(PyExc_KeyError, "Driver needs %s", FUNCTION_NAMES[i]);
            goto error;
        }
        if (PyLong_Check(f)) {
            ints++;
            self->c[i] = PyLong_AsVoidPtr(f);
            if (self->c[i] == NULL) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "no address for %s", FUNCTION_NAMES[i]);
                goto error;
            }
        } else if (PyCallable_Check(f)) {
            self->py[i] = Py_NewRef(f);
        } else {
            PyErr_Format(PyExc_TypeError, "%s must be an address or a callable",
                         FUNCTION_NAMES[i]);
            goto error;
        }
    }
    if (ints != 0 && ints != F_COUNT) {
        PyErr_SetString(PyExc_TypeError, "Driver takes all addresses or all callables");
        goto error;
    }
    self->compiled = ints == F_COUNT;
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static void Driver_dealloc(Driver *self)
{
    for (int i = 0; i < F_COUNT; i++)
        Py_XDECREF(self->py[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Driver_repr(Driver *self)
{
    return PyUnicode_FromString(self->compiled
        ? "<cuctx native fast path: the driver's functions, called from C>"
        : "<cuctx native fast path: the sim's driver functions, called from C>");
}

static PyMethodDef Driver_methods[] = {
    {"call_in", (PyCFunction)(void (*)(void))Driver_call_in, METH_FASTCALL,
     "call_in(ctx, fn, *args): fn(*args) with the active Context ctx current (pushed and "
     "popped around the call unless it is current already)."},
    {"mem_alloc", (PyCFunction)(void (*)(void))Driver_mem_alloc, METH_FASTCALL,
     "mem_alloc(ctx, stream, nbytes): cuMemAllocAsync with ctx current: (0, the address) or "
     "(CUresult, None)."},
    {"mem_free", (PyCFunction)(void (*)(void))Driver_mem_free, METH_FASTCALL,
     "mem_free(ctx, stream, ptr): cuMemFreeAsync with ctx current: the CUresult."},
    {"launcher", (PyCFunction)(void (*)(void))Driver_launcher, METH_VARARGS | METH_KEYWORDS,
     "launcher(plan, ctx, owner, stream, function, grid, block, shared_mem, config, general, "
     "fail, sim_args, launcher): the compiled fast path of one launcher and one plan, or None "
     "where the plan is not one it packs (the generated Python path takes those)."},
    {"changed", (PyCFunction)(void (*)(void))Driver_changed, METH_FASTCALL,
     "changed(new, old): the indices where two lists of an autograph call's values differ."},
    {"patcher", (PyCFunction)(void (*)(void))Driver_patcher, METH_VARARGS | METH_KEYWORDS,
     "patcher(handle, ctx, streams, owners, make, refused, n, launchable): the compiled "
     "patches and launch of one AutoGraph executable."},
    {"add_kernel_node", (PyCFunction)(void (*)(void))Driver_add_kernel_node, METH_FASTCALL,
     "add_kernel_node(graph, deps, function, kern, ctx, grid, block, shared_mem, data, "
     "offsets): a kernel node of parameter bytes packed before, added in C; its handle as an "
     "int (compiled drivers whose `builds` is set only)."},
    {"add_kernel_chain", (PyCFunction)(void (*)(void))Driver_add_kernel_chain, METH_FASTCALL,
     "add_kernel_chain(graph, specs, values): the kernel nodes of a one-stream recording, "
     "each after the one before, added in C; (0, their handles as ints) or (CUresult, the "
     "index of the refused one) (compiled drivers whose `builds` is set only)."},
    {"enqueue", (PyCFunction)(void (*)(void))Driver_enqueue, METH_FASTCALL,
     "enqueue(keys, values, start): an autograph call's recorded launches from start on, "
     "enqueued from their packed bytes; the index of the first operation left to Python."},
    {NULL}};

static PyMemberDef Driver_members[] = {
    {"compiled", T_BOOL, offsetof(Driver, compiled), READONLY,
     "True: the driver's C functions; False: the sim's Python functions"},
    {"builds", T_BOOL, offsetof(Driver, builds), 0,
     "True: add_kernel_node adds kernel nodes from C (set once the layout of the struct it "
     "passes was checked against cuda.bindings')"},
    {NULL}};

PyTypeObject DriverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cuctx._native.Driver",
    .tp_doc = "The driver functions the compiled paths call: addresses from cuGetProcAddress "
              "(a GPU) or the SimDriver's functions (the sim). A backend's `native` slot.",
    .tp_basicsize = sizeof(Driver),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Driver_new,
    .tp_dealloc = (destructor)Driver_dealloc,
    .tp_repr = (reprfunc)Driver_repr,
    .tp_methods = Driver_methods,
    .tp_members = Driver_members,
};

