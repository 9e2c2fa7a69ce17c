/* cuctx._native: the compiled fast path (docs/ARCHITECTURE.md, "The compiled fast path").
 *
 * The common case of a launch, an event record, a stream wait and a context push/pop, in C:
 * the same guards as the checked Python paths (exact types, context states, a host function
 * running, a trace sink listening), packing by the same launch plan (cuctx._plan.Plan), then
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030B0000
#define PyFloat_Pack2 _PyFloat_Pack2
#define PyFloat_Pack4 _PyFloat_Pack4
#define PyFloat_Pack8 _PyFloat_Pack8
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

enum { F_LAUNCH, F_LAUNCH_EX, F_RECORD, F_WAIT, F_PUSH, F_POP, F_CURRENT, F_COUNT };
static const char *const FUNCTION_NAMES[F_COUNT] = {
    "cuLaunchKernel", "cuLaunchKernelEx", "cuEventRecord", "cuStreamWaitEvent",
    "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxGetCurrent"};

/* The most parameter bytes and parameters a compiled launch packs on its stack; a kernel
 * with more takes the generated Python fast path. */
#define MAX_PARAM_BYTES 4096
#define MAX_PARAMS 512

/* -- what setup() learnt about the classes -------------------------------------------- */

static struct {
    int ready;
    PyTypeObject *Context, *Stream, *Event, *DeviceArray, *ThreadState, *Device, *Kernel,
        *Launcher;
    PyObject *ACTIVE;      /* cuctx._resource.ACTIVE: a context state, compared by identity */
    PyObject *CUresult;    /* makes the code of a failed call the enum fail() expects */
    PyObject *CUcontext;   /* a popped context's handle, for object_for */
    PyObject *fail;        /* cuctx.context.fail */
    PyObject *object_for;  /* cuctx.context._object_for */
    PyObject *driver_dict; /* cuctx._driver's namespace: `_active` */
    PyObject *step_aside;  /* ((namespace, name), ...): step aside while any value is true */
    /* slot offsets */
    Py_ssize_t backend, ctx, handle, key;          /* Resource */
    Py_ssize_t state, device;                      /* Context */
    Py_ssize_t sync_event, recorded;               /* Stream, Event */
    Py_ssize_t ptr, c_contiguous;                  /* DeviceArray */
    Py_ssize_t stack, blocks;                      /* ThreadState */
    Py_ssize_t primary, lock, device_backend;      /* Device */
    Py_ssize_t launchers, fast;                    /* Kernel, Launcher */
} L;

static PyObject *S_native, *S_tls, *S_tls_cache, *S_dict, *S_state, *S_loaded, *S_locked, *S_getPtr, *S_active,
    *S_shared_mem, *S_stream, *ZERO;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* The sentinel an implementation returns to hand the call to the checked Python path. */
static PyObject python_path_marker;
#define PYTHON_PATH (&python_path_marker)

static Py_ssize_t slot_offset(PyTypeObject *type, const char *name)
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

static void *key_of(PyObject *resource)
{
    PyObject *key = SLOT(resource, L.key);
    return key ? PyLong_AsVoidPtr(key) : NULL;
}

/* True while a trace sink listens, a host function runs, ...: the checked paths announce
 * or refuse what these paths would do silently. */
static int step_aside(void)
{
    Py_ssize_t n = PyTuple_GET_SIZE(L.step_aside);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(L.step_aside, i);
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

/* -- Driver: the driver functions, in C or (the sim) in Python ------------------------ */

typedef struct {
    PyObject_HEAD
    int compiled;
    void *c[F_COUNT];
    PyObject *py[F_COUNT];
} Driver;

static PyTypeObject DriverType;

static Driver *native_of(PyObject *backend)
{
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
static int py_result(PyObject *result, PyObject **second)
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

static int drv_current(Driver *d, void **ctx)
{
    if (d->compiled)
        return ((current_fn)d->c[F_CURRENT])(ctx);
    PyObject *handle;
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

static int drv_push(Driver *d, PyObject *ctx)
{
    if (d->compiled)
        return ((push_fn)d->c[F_PUSH])(key_of(ctx));
    return py_result(PyObject_CallOneArg(d->py[F_PUSH], SLOT(ctx, L.handle)), NULL);
}

/* *handle: the popped context's handle object on the sim, NULL in C (a new reference). */
static int drv_pop(Driver *d, void **ctx, PyObject **handle)
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

static int drv_record(Driver *d, PyObject *event, PyObject *stream)
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

static int drv_wait(Driver *d, PyObject *stream, PyObject *event)
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
static int enter_stream_context(Driver *d, PyObject *stream, PyObject *ctx, int *pushed)
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

static void leave_stream_context(Driver *d, int pushed)
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

/* context.fail(backend, CUresult(err), operation, ctx): raises; returns NULL. */
static PyObject *fail(PyObject *backend, int err, const char *operation, PyObject *ctx)
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

/* This thread's dict of the threading.local ``tls`` (a borrowed reference). Reading an
 * attribute of a threading.local costs more than the rest of a push, so each thread keeps
 * (tls, its dict) of the last one it read in its own thread-state dict, which the
 * interpreter clears when the thread ends. The local's dict of a thread is one object for
 * the thread's life, and the kept reference to ``tls`` keeps its address from being reused. */
static PyObject *local_dict(PyObject *tls)
{
    PyObject *thread = PyThreadState_GetDict();
    PyObject *kept = thread ? PyDict_GetItemWithError(thread, S_tls_cache) : NULL;
    if (kept != NULL && PyTuple_GET_ITEM(kept, 0) == tls)
        return PyTuple_GET_ITEM(kept, 1);
    PyObject *dict = PyObject_GetAttr(tls, S_dict); /* threading.local: this thread's */
    if (dict == NULL || !PyDict_Check(dict) || thread == NULL) {
        Py_XDECREF(dict);
        return NULL;
    }
    kept = PyTuple_Pack(2, tls, dict);
    Py_DECREF(dict);
    if (kept == NULL || PyDict_SetItem(thread, S_tls_cache, kept) < 0) {
        Py_XDECREF(kept);
        return NULL;
    }
    Py_DECREF(kept); /* the thread's dict holds it, and with it `dict` */
    return dict;
}

/* backend.tls.state, when it is a ThreadState (a new reference); NULL otherwise (inside a
 * host function it is the guard whose attributes raise: the checked path raises that). */
static PyObject *thread_state(PyObject *backend)
{
    PyObject *tls = PyObject_GetAttr(backend, S_tls), *dict, *state = NULL;
    if (tls != NULL && (dict = local_dict(tls)) != NULL)
        state = PyDict_GetItemWithError(dict, S_state);
    Py_XDECREF(tls); /* `dict` holds the state, and the thread's dict holds `dict` */
    if (state == NULL || !Py_IS_TYPE(state, L.ThreadState)) {
        PyErr_Clear();
        return NULL;
    }
    return Py_NewRef(state);
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

static PyObject *Driver_launcher(Driver *self, PyObject *args, PyObject *kwargs);

static PyMethodDef Driver_methods[] = {
    {"launcher", (PyCFunction)(void (*)(void))Driver_launcher, METH_VARARGS | METH_KEYWORDS,
     "launcher(plan, ctx, owner, stream, function, grid, block, shared_mem, config, general, "
     "fail, sim_args): the compiled fast path of one launcher and one plan, or None where "
     "the plan is not one it packs (the generated Python path takes those)."},
    {NULL}};

static PyMemberDef Driver_members[] = {
    {"compiled", T_BOOL, offsetof(Driver, compiled), READONLY,
     "True: the driver's C functions; False: the sim's Python functions"},
    {NULL}};

static PyTypeObject DriverType = {
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

/* -- Launch: one launcher's compiled fast path for one plan --------------------------- */

enum { K_VALUE, K_ARRAY, K_CONVERT };

typedef struct {
    Py_ssize_t offset, size;
    char code; /* b h i q e f d Q s */
    int kind;
    PyTypeObject *type; /* the guard: exactly this type */
    PyObject *convert;  /* (arg, stream) -> value, or NULL */
} Param;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Driver *driver;
    PyObject *ctx, *owner, *device, *stream, *backend, *general, *fail, *config, *sim_args;
    void *function, *config_ptr;
    unsigned grid[3], block[3], shared;
    Py_ssize_t n, size;
    Param *params;
} Launch;

static PyTypeObject LaunchType;

static int pack(const Param *p, char *out, PyObject *value)
{
    switch (p->code) {
    case 'b': case 'h': case 'i': case 'q': {
        int overflow = 0;
        long long x;
        if (PyLong_Check(value)) {
            x = PyLong_AsLongLongAndOverflow(value, &overflow);
        } else {
            PyObject *index = PyNumber_Index(value);
            if (index == NULL)
                return -1;
            x = PyLong_AsLongLongAndOverflow(index, &overflow);
            Py_DECREF(index);
        }
        if (overflow || (x == -1 && PyErr_Occurred()))
            return -1;
        /* the signed range of the code, as struct checks it (the checked path packs the
         * rest: values up to the unsigned maximum, or the error naming the parameter) */
        int bits = (int)p->size * 8;
        if (bits < 64 && (x < -(1LL << (bits - 1)) || x >= (1LL << (bits - 1))))
            return -1;
        memcpy(out, &x, p->size); /* the low bytes: little-endian hosts only (setup checks) */
        return 0;
    }
    case 'e': case 'f': case 'd': {
        double x = PyFloat_AsDouble(value);
        if (x == -1.0 && PyErr_Occurred())
            return -1;
        if (p->code == 'e')
            return PyFloat_Pack2(x, out, 1);
        return p->code == 'f' ? PyFloat_Pack4(x, out, 1) : PyFloat_Pack8(x, out, 1);
    }
    case 'Q': {
        unsigned long long x;
        if (PyLong_Check(value)) {
            x = PyLong_AsUnsignedLongLong(value);
        } else {
            PyObject *index = PyNumber_Index(value);
            if (index == NULL)
                return -1;
            x = PyLong_AsUnsignedLongLong(index);
            Py_DECREF(index);
        }
        if (x == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        memcpy(out, &x, 8);
        return 0;
    }
    case 's': {
        char *data;
        Py_ssize_t length;
        if (PyBytes_Check(value)) {
            data = PyBytes_AS_STRING(value);
            length = PyBytes_GET_SIZE(value);
        } else if (PyByteArray_Check(value)) {
            data = PyByteArray_AS_STRING(value);
            length = PyByteArray_GET_SIZE(value);
        } else {
            PyErr_SetString(PyExc_TypeError, "not bytes");
            return -1;
        }
        memcpy(out, data, length < p->size ? length : p->size); /* the rest stays zero */
        return 0;
    }
    }
    PyErr_SetString(PyExc_SystemError, "unknown struct code");
    return -1;
}

/* The launcher's checked path, general(args), with args as a tuple. */
static PyObject *launch_general(Launch *l, PyObject *const *argv, Py_ssize_t n, PyObject *tuple)
{
    if (tuple != NULL)
        return PyObject_CallOneArg(l->general, tuple);
    tuple = PyTuple_New(n);
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(argv[i]));
    PyObject *result = PyObject_CallOneArg(l->general, tuple);
    Py_DECREF(tuple);
    return result;
}

static PyObject *launch_run(Launch *l, PyObject *const *argv, Py_ssize_t n, PyObject *tuple)
{
    if (n != l->n)
        goto general;
    for (Py_ssize_t i = 0; i < n; i++)
        if (Py_TYPE(argv[i]) != l->params[i].type)
            goto general;
    /* An unusable context, unloaded code, a host function running, a trace sink listening: */
    if (SLOT(l->ctx, L.state) != L.ACTIVE || step_aside())
        goto general;
    PyObject *loaded = PyObject_GetAttr(l->owner, S_loaded);
    if (loaded == NULL) {
        PyErr_Clear();
        goto general;
    }
    Py_DECREF(loaded);
    if (loaded != Py_True)
        goto general;

    char buffer[MAX_PARAM_BYTES];
    void *pointers[MAX_PARAMS];
    memset(buffer, 0, l->size);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Param *p = &l->params[i];
        PyObject *arg = argv[i], *value = arg, *made = NULL;
        if (p->kind == K_ARRAY) { /* the checks of cuctx._args._device_array_pointer */
            PyObject *c = SLOT(arg, L.ctx), *contiguous = SLOT(arg, L.c_contiguous);
            if (c == NULL || SLOT(c, L.state) != L.ACTIVE || SLOT(c, L.device) != l->device
                    || contiguous != Py_True || (value = SLOT(arg, L.ptr)) == NULL)
                goto general;
        } else if (p->kind == K_CONVERT) {
            PyObject *call[2] = {arg, l->stream};
            value = made = PyObject_Vectorcall(p->convert, call, 2, NULL);
            if (value == NULL)
                return NULL; /* its error, as the checked path would raise it */
        }
        int packed = pack(p, buffer + p->offset, value);
        Py_XDECREF(made);
        if (packed < 0) { /* a value its code cannot hold: the checked path packs or names it */
            PyErr_Clear();
            goto general;
        }
        pointers[i] = buffer + p->offset;
    }

    Driver *d = l->driver;
    int pushed, err = enter_stream_context(d, l->stream, l->ctx, &pushed);
    if (err < 0)
        return NULL;
    if (err > 0)
        return fail(l->backend, err, "cuCtxPushCurrent", l->ctx);
    void **params = n ? pointers : NULL;
    if (d->compiled) {
        Py_BEGIN_ALLOW_THREADS /* a full launch queue waits for the GPU */
        if (l->config_ptr)
            err = ((launch_ex_fn)d->c[F_LAUNCH_EX])(l->config_ptr, l->function, params, NULL);
        else
            err = ((launch_fn)d->c[F_LAUNCH])(l->function, l->grid[0], l->grid[1], l->grid[2],
                                              l->block[0], l->block[1], l->block[2], l->shared,
                                              key_of(l->stream), params, NULL);
        Py_END_ALLOW_THREADS
    } else {
        /* the sim: sim_args + (kernelParams as an int address, extra) */
        Py_ssize_t k = PyTuple_GET_SIZE(l->sim_args);
        PyObject *call[16];
        for (Py_ssize_t i = 0; i < k; i++)
            call[i] = PyTuple_GET_ITEM(l->sim_args, i);
        PyObject *address = PyLong_FromVoidPtr(params);
        if (address == NULL) {
            leave_stream_context(d, pushed);
            return NULL;
        }
        call[k] = address;
        call[k + 1] = ZERO;
        err = py_result(PyObject_Vectorcall(d->py[l->config_ptr ? F_LAUNCH_EX : F_LAUNCH],
                                            call, k + 2, NULL), NULL);
        Py_DECREF(address);
    }
    leave_stream_context(d, pushed);
    if (err < 0)
        return NULL;
    if (err > 0) {
        PyObject *code = PyObject_CallFunction(L.CUresult, "i", err);
        if (code == NULL)
            return NULL;
        PyObject *result = PyObject_CallOneArg(l->fail, code);
        Py_DECREF(code);
        return result; /* NULL: fail raised */
    }
    Py_RETURN_NONE;
general:
    return launch_general(l, argv, n, tuple);
}

static PyObject *Launch_vectorcall(Launch *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames)
{
    /* launch(args): how Launcher's Python __call__ calls a fast path */
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "a compiled launch takes one tuple of arguments");
        return NULL;
    }
    PyObject *tuple = args[0];
    return launch_run(self, &PyTuple_GET_ITEM(tuple, 0), PyTuple_GET_SIZE(tuple), tuple);
}

static int Launch_traverse(Launch *self, visitproc visit, void *arg)
{
    Py_VISIT(self->driver);
    Py_VISIT(self->ctx);
    Py_VISIT(self->owner);
    Py_VISIT(self->device);
    Py_VISIT(self->stream);
    Py_VISIT(self->backend);
    Py_VISIT(self->general);
    Py_VISIT(self->fail);
    Py_VISIT(self->config);
    Py_VISIT(self->sim_args);
    for (Py_ssize_t i = 0; self->params && i < self->n; i++) {
        Py_VISIT(self->params[i].type);
        Py_VISIT(self->params[i].convert);
    }
    return 0;
}

static int Launch_clear(Launch *self)
{
    Py_CLEAR(self->driver);
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->device);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->backend);
    Py_CLEAR(self->general);
    Py_CLEAR(self->fail);
    Py_CLEAR(self->config);
    Py_CLEAR(self->sim_args);
    for (Py_ssize_t i = 0; self->params && i < self->n; i++) {
        Py_CLEAR(self->params[i].type);
        Py_CLEAR(self->params[i].convert);
    }
    return 0;
}

static void Launch_dealloc(Launch *self)
{
    PyObject_GC_UnTrack(self);
    Launch_clear(self);
    PyMem_Free(self->params);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cuctx._native.Launch",
    .tp_doc = "A launcher's compiled fast path for one plan: call it with the tuple of "
              "arguments; anything it was not made for goes to the launcher's checked path.",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Launch, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)Launch_traverse,
    .tp_clear = (inquiry)Launch_clear,
    .tp_dealloc = (destructor)Launch_dealloc,
};

static int unsigned_triple(PyObject *seq, unsigned out[3])
{
    PyObject *items = PySequence_Tuple(seq);
    if (items == NULL)
        return -1;
    int ok = PyTuple_GET_SIZE(items) == 3;
    for (int i = 0; ok && i < 3; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(items, i));
        ok = !(v == (unsigned long)-1 && PyErr_Occurred()) && v <= 0xFFFFFFFFUL;
        out[i] = (unsigned)v;
    }
    Py_DECREF(items);
    if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "a dimension is three unsigned ints");
    return ok ? 0 : -1;
}

/* Param codes the compiled path packs; 0: one it leaves to the generated path. */
static char param_code(PyObject *code, Py_ssize_t size)
{
    const char *text = PyUnicode_AsUTF8(code);
    if (text == NULL) {
        PyErr_Clear();
        return 0;
    }
    size_t length = strlen(text);
    if (length == 1) {
        const char *codes = "bhiqefdQ";
        const int sizes[] = {1, 2, 4, 8, 2, 4, 8, 8};
        const char *at = strchr(codes, text[0]);
        return at && sizes[at - codes] == size ? text[0] : 0;
    }
    if (length > 1 && text[length - 1] == 's' && atol(text) == size)
        return 's';
    return 0;
}

static PyObject *Driver_launcher(Driver *self, PyObject *args, PyObject *kwargs)
{
    PyObject *plan, *ctx, *owner, *stream, *function, *grid, *block, *shared, *config,
        *general, *failer, *sim_args;
    static char *names[] = {"plan", "ctx", "owner", "stream", "function", "grid", "block",
                            "shared_mem", "config", "general", "fail", "sim_args", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOOO!:launcher", names, &plan,
                                     &ctx, &owner, &stream, &function, &grid, &block, &shared,
                                     &config, &general, &failer, &PyTuple_Type, &sim_args))
        return NULL;
    if (!L.ready || PyTuple_GET_SIZE(sim_args) > 14)
        Py_RETURN_NONE;
    PyObject *types = PyObject_GetAttrString(plan, "types");
    PyObject *params = PyObject_GetAttrString(plan, "params");
    Launch *l = NULL;
    if (types == NULL || params == NULL || !PyTuple_Check(types) || !PyTuple_Check(params)
            || PyTuple_GET_SIZE(types) != PyTuple_GET_SIZE(params))
        goto error;
    Py_ssize_t n = PyTuple_GET_SIZE(params);
    if (n > MAX_PARAMS)
        goto none;
    l = PyObject_GC_New(Launch, &LaunchType);
    if (l == NULL)
        goto error;
    l->vectorcall = (vectorcallfunc)Launch_vectorcall;
    l->driver = (Driver *)Py_NewRef(self);
    l->ctx = Py_NewRef(ctx);
    l->owner = Py_NewRef(owner);
    l->stream = Py_NewRef(stream);
    l->device = Py_XNewRef(SLOT(ctx, L.device));
    l->backend = Py_XNewRef(SLOT(ctx, L.backend));
    l->general = Py_NewRef(general);
    l->fail = Py_NewRef(failer);
    l->config = Py_NewRef(config);
    l->sim_args = Py_NewRef(sim_args);
    l->n = n;
    l->size = 0;
    l->config_ptr = NULL;
    l->params = PyMem_Calloc(n ? n : 1, sizeof(Param));
    PyObject_GC_Track(l);
    if (l->params == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Param *p = &l->params[i];
        PyObject *param = PyTuple_GET_ITEM(params, i), *type = PyTuple_GET_ITEM(types, i);
        PyObject *kind, *code, *convert;
        if (!PyArg_ParseTuple(param, "nnOOO", &p->offset, &p->size, &code, &kind, &convert)
                || !PyType_Check(type))
            goto error;
        p->type = (PyTypeObject *)Py_NewRef(type);
        p->code = param_code(code, p->size);
        if (!p->code || p->offset < 0 || p->offset + p->size > MAX_PARAM_BYTES)
            goto none;
        if (p->offset + p->size > l->size)
            l->size = p->offset + p->size;
        if (PyUnicode_CompareWithASCIIString(kind, "value") == 0) {
            p->kind = K_VALUE;
        } else if (PyUnicode_CompareWithASCIIString(kind, "array") == 0) {
            p->kind = K_ARRAY;
            if (!PyType_IsSubtype(p->type, L.DeviceArray) || p->code != 'Q')
                goto none;
        } else { /* "pointer" and "convert": the plan's conversion gives the value */
            p->kind = K_CONVERT;
            if (convert == Py_None)
                goto none;
            p->convert = Py_NewRef(convert);
        }
    }
    if (unsigned_triple(grid, l->grid) < 0 || unsigned_triple(block, l->block) < 0)
        goto error;
    unsigned long s = PyLong_AsUnsignedLong(shared);
    if (s == (unsigned long)-1 && PyErr_Occurred())
        goto error;
    l->shared = (unsigned)s;
    PyObject *f = PyNumber_Long(function);
    if (f == NULL)
        goto error;
    l->function = PyLong_AsVoidPtr(f);
    Py_DECREF(f);
    if (config != Py_None) { /* a cluster or cooperative launch: cuLaunchKernelEx */
        PyObject *address = PyObject_CallMethodNoArgs(config, S_getPtr);
        if (address == NULL)
            goto error;
        l->config_ptr = PyLong_AsVoidPtr(address);
        Py_DECREF(address);
        if (l->config_ptr == NULL)
            goto error;
    }
    Py_DECREF(types);
    Py_DECREF(params);
    return (PyObject *)l;
none:
    Py_XDECREF(types);
    Py_XDECREF(params);
    Py_XDECREF(l);
    Py_RETURN_NONE;
error:
    Py_XDECREF(types);
    Py_XDECREF(params);
    Py_XDECREF(l);
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "launcher(): not a launch plan");
    return NULL;
}

/* -- records, waits, context switches ------------------------------------------------- */

/* Record ``event`` on ``stream`` (of ``ctx``), with the stream's context current where it
 * needs it; the caller holds ``d`` while the call runs without the GIL. */
static PyObject *record_with(Driver *d, PyObject *backend, PyObject *stream, PyObject *ctx,
                             PyObject *event)
{
    int pushed, err = enter_stream_context(d, stream, ctx, &pushed);
    if (err < 0)
        return NULL;
    if (err > 0)
        return fail(backend, err, "cuCtxPushCurrent", ctx);
    err = drv_record(d, event, stream);
    leave_stream_context(d, pushed);
    if (err < 0)
        return NULL;
    if (err > 0)
        return fail(backend, err, "cuEventRecord", ctx);
    Py_RETURN_NONE;
}

/* Stream.record(event) / Event.record(stream), both exactly of their classes. */
static PyObject *record(PyObject *stream, PyObject *event)
{
    PyObject *ctx = SLOT(stream, L.ctx);
    if (ctx == NULL || SLOT(event, L.ctx) != ctx || SLOT(ctx, L.state) != L.ACTIVE
            || step_aside())
        return PYTHON_PATH;
    PyObject *backend = SLOT(stream, L.backend);
    Driver *d = native_of(backend);
    if (d == NULL)
        return PYTHON_PATH;
    Py_INCREF(d);
    PyObject *done = record_with(d, backend, stream, ctx, event);
    Py_DECREF(d);
    if (done == NULL)
        return NULL;
    Py_DECREF(done);
    PyObject **recorded = &SLOT(event, L.recorded), *old = *recorded;
    *recorded = Py_NewRef(Py_True);
    Py_XDECREF(old);
    return Py_NewRef(event);
}

static PyObject *stream_record(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !Py_IS_TYPE(args[0], L.Stream) || !Py_IS_TYPE(args[1], L.Event))
        return PYTHON_PATH;
    return record(args[0], args[1]);
}

static PyObject *event_record(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !Py_IS_TYPE(args[0], L.Event) || !Py_IS_TYPE(args[1], L.Stream))
        return PYTHON_PATH;
    return record(args[1], args[0]);
}

/* The wait of ``stream`` on ``event``; with ``other`` (a stream), first the record of
 * ``event`` (its sync event) on it. */
static PyObject *wait_with(Driver *d, PyObject *backend, PyObject *stream, PyObject *ctx,
                           PyObject *event, PyObject *other, PyObject *other_ctx)
{
    if (other != NULL) {
        PyObject *done = record_with(d, backend, other, other_ctx, event);
        if (done == NULL)
            return NULL;
        Py_DECREF(done);
    }
    int pushed, err = enter_stream_context(d, stream, ctx, &pushed);
    if (err < 0)
        return NULL;
    if (err > 0)
        return fail(backend, err, "cuCtxPushCurrent", ctx);
    err = drv_wait(d, stream, event);
    leave_stream_context(d, pushed);
    if (err < 0)
        return NULL;
    if (err > 0)
        return fail(backend, err, "cuStreamWaitEvent", ctx);
    Py_RETURN_NONE;
}

static PyObject *stream_wait(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !Py_IS_TYPE(args[0], L.Stream))
        return PYTHON_PATH;
    PyObject *stream = args[0], *other = args[1], *ctx = SLOT(stream, L.ctx);
    if (ctx == NULL || SLOT(ctx, L.state) != L.ACTIVE || step_aside())
        return PYTHON_PATH;
    PyObject *backend = SLOT(stream, L.backend), *event, *other_ctx;
    Driver *d = native_of(backend);
    if (d == NULL || !(Py_IS_TYPE(other, L.Event) || Py_IS_TYPE(other, L.Stream))
            || SLOT(other, L.backend) != backend)
        return PYTHON_PATH;
    other_ctx = SLOT(other, L.ctx);
    if (other_ctx == NULL || SLOT(other_ctx, L.state) != L.ACTIVE)
        return PYTHON_PATH;
    if (Py_IS_TYPE(other, L.Event)) {
        if (SLOT(other, L.recorded) != Py_True)
            return PYTHON_PATH;
        event = other;
        other = NULL;
    } else { /* a stream: record its sync event, wait on that */
        if (other == stream)
            Py_RETURN_NONE;
        event = SLOT(other, L.sync_event);
        if (event == NULL || event == Py_None) /* the first wait on it makes the event */
            return PYTHON_PATH;
    }
    Py_INCREF(d);
    Py_INCREF(event);
    PyObject *result = wait_with(d, backend, stream, ctx, event, other, other_ctx);
    Py_DECREF(event);
    Py_DECREF(d);
    return result;
}

/* Stream's tp_hash: Stream.__hash__'s value, hash((ctx._key, _key)), without a call into
 * Python; streams are keys of every launcher cache lookup (kernel[...], cuctx.launch). */
static Py_hash_t stream_tp_hash(PyObject *stream)
{
    PyObject *ctx = SLOT(stream, L.ctx), *key = SLOT(stream, L.key);
    if (ctx == NULL || key == NULL || SLOT(ctx, L.key) == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a Stream without its context or handle");
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, SLOT(ctx, L.key), key);
    if (pair == NULL)
        return -1;
    Py_hash_t hash = PyObject_Hash(pair);
    Py_DECREF(pair);
    return hash;
}

/* Push ``ctx`` and mirror it on the shadow stack; a `with` block also notes its depth. */
static PyObject *push(PyObject *ctx, int block)
{
    if (!Py_IS_TYPE(ctx, L.Context) || SLOT(ctx, L.state) != L.ACTIVE)
        return PYTHON_PATH;
    PyObject *backend = SLOT(ctx, L.backend);
    Driver *d = native_of(backend);
    PyObject *state = d ? thread_state(backend) : NULL;
    if (state == NULL)
        return PYTHON_PATH;
    PyObject *stack = SLOT(state, L.stack), *blocks = SLOT(state, L.blocks);
    if (stack == NULL || !PyList_CheckExact(stack) || blocks == NULL
            || !PyList_CheckExact(blocks)) {
        Py_DECREF(state);
        return PYTHON_PATH;
    }
    int err = drv_push(d, ctx);
    PyObject *result = NULL;
    if (err > 0) {
        fail(backend, err, "cuCtxPushCurrent", ctx);
    } else if (err == 0) {
        PyObject *depth = block ? PyLong_FromSsize_t(PyList_GET_SIZE(stack)) : NULL;
        if ((!block || (depth && PyList_Append(blocks, depth) == 0))
                && PyList_Append(stack, ctx) == 0)
            result = Py_NewRef(block ? ctx : Py_None);
        Py_XDECREF(depth);
    }
    Py_DECREF(state);
    return result;
}

static PyObject *context_push(PyObject *const *args, Py_ssize_t nargs)
{
    return nargs == 1 ? push(args[0], 0) : PYTHON_PATH;
}

static PyObject *context_enter(PyObject *const *args, Py_ssize_t nargs)
{
    return nargs == 1 ? push(args[0], 1) : PYTHON_PATH;
}

/* Pop the driver's current context and the shadow stack's top. A failed pop changed
 * nothing: the checked path repeats it and raises with its hint. ``block``: leave the
 * innermost `with` block, which pushed exactly one context that is still on top. */
static PyObject *pop(PyObject *backend, int block)
{
    Driver *d = native_of(backend);
    PyObject *state = d ? thread_state(backend) : NULL;
    if (state == NULL)
        return PYTHON_PATH;
    PyObject *stack = SLOT(state, L.stack), *blocks = SLOT(state, L.blocks), *result = NULL;
    if (stack == NULL || !PyList_CheckExact(stack) || blocks == NULL
            || !PyList_CheckExact(blocks)) {
        Py_DECREF(state);
        return PYTHON_PATH;
    }
    Py_ssize_t n = PyList_GET_SIZE(stack), nblocks = PyList_GET_SIZE(blocks);
    if (block) { /* the shadow stack must be one deeper than at the block's entry */
        Py_ssize_t depth = nblocks ? PyLong_AsSsize_t(PyList_GET_ITEM(blocks, nblocks - 1)) : -1;
        if (depth == -1 && PyErr_Occurred())
            PyErr_Clear();
        if (depth < 0 || n != depth + 1) {
            Py_DECREF(state);
            return PYTHON_PATH;
        }
    }
    void *popped = NULL;
    PyObject *handle;
    int err = drv_pop(d, &popped, &handle);
    if (err) {
        Py_XDECREF(handle);
        Py_DECREF(state);
        return err < 0 ? NULL : PYTHON_PATH;
    }
    if (block) {
        if (PyList_SetSlice(blocks, nblocks - 1, nblocks, NULL) == 0
                && PyList_SetSlice(stack, n - 1, n, NULL) == 0)
            result = Py_NewRef(Py_None);
    } else {
        PyObject *top = n ? PyList_GET_ITEM(stack, n - 1) : NULL;
        if (top && PyObject_TypeCheck(top, L.Context) && key_of(top) == popped) {
            result = Py_NewRef(top);
            if (PyList_SetSlice(stack, n - 1, n, NULL) < 0)
                Py_CLEAR(result);
        } else { /* pushed by other code than cuctx */
            if (handle == NULL) {
                PyObject *address = PyLong_FromVoidPtr(popped);
                handle = address ? PyObject_CallOneArg(L.CUcontext, address) : NULL;
                Py_XDECREF(address);
            }
            if (handle != NULL)
                result = PyObject_CallFunctionObjArgs(L.object_for, backend, handle, NULL);
        }
    }
    Py_XDECREF(handle);
    Py_DECREF(state);
    return result;
}

static PyObject *context_pop(PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *backend = nargs == 0 ? PyDict_GetItemWithError(L.driver_dict, S_active) : NULL;
    if (backend == NULL || backend == Py_None) {
        PyErr_Clear();
        return PYTHON_PATH;
    }
    return pop(backend, 0);
}

static PyObject *context_exit(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !Py_IS_TYPE(args[0], L.Context))
        return PYTHON_PATH;
    return pop(SLOT(args[0], L.backend), 1);
}

static PyObject *device_enter(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !Py_IS_TYPE(args[0], L.Device))
        return PYTHON_PATH;
    PyObject *ref = SLOT(args[0], L.primary), *lock = SLOT(args[0], L.lock);
    if (ref == NULL || !PyWeakref_CheckRef(ref) || lock == NULL)
        return PYTHON_PATH;
    PyObject *ctx = PyWeakref_GetObject(ref);
    if (!Py_IS_TYPE(ctx, L.Context) || SLOT(ctx, L.state) != L.ACTIVE)
        return PYTHON_PATH; /* none yet, or one to retain again: primary_context does it */
    /* primary_context reads it under the device's lock: while another thread holds that
     * lock (a reset, a retain), the checked path waits for it */
    PyObject *locked = PyObject_CallMethodNoArgs(lock, S_locked);
    if (locked == NULL)
        return NULL;
    Py_DECREF(locked);
    if (locked != Py_False)
        return PYTHON_PATH;
    Py_INCREF(ctx);
    PyObject *result = push(ctx, 1);
    Py_DECREF(ctx);
    return result;
}

static PyObject *device_exit(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !Py_IS_TYPE(args[0], L.Device))
        return PYTHON_PATH;
    return pop(SLOT(args[0], L.device_backend), 1);
}

/* -- kernel[...], cuctx.launch, Launcher.__call__ --------------------------------------- */

/* The cached launcher of make_launcher's key (borrowed), NULL when there is none. */
static PyObject *cached_launcher(PyObject *kernel, PyObject *grid, PyObject *block,
                                 PyObject *shared, PyObject *stream)
{
    PyObject *cache = SLOT(kernel, L.launchers);
    if (cache == NULL || !PyDict_CheckExact(cache) || native_of(SLOT(kernel, L.backend)) == NULL)
        return NULL;
    PyObject *key = PyTuple_Pack(9, grid, block, shared, stream, Py_None, Py_False,
                                 (PyObject *)Py_TYPE(grid), (PyObject *)Py_TYPE(block),
                                 (PyObject *)Py_TYPE(shared));
    if (key == NULL)
        return NULL;
    PyObject *launcher = PyDict_GetItemWithError(cache, key);
    Py_DECREF(key);
    if (launcher == NULL)
        PyErr_Clear(); /* an unhashable configuration: make_launcher does not cache it */
    return launcher;
}

static PyObject *run_launcher(PyObject *launcher, PyObject *const *argv, Py_ssize_t n)
{
    PyObject *fast = Py_IS_TYPE(launcher, L.Launcher) ? SLOT(launcher, L.fast) : NULL;
    if (fast == NULL || !Py_IS_TYPE(fast, &LaunchType))
        return PyObject_Vectorcall(launcher, argv, n, NULL);
    /* held while it runs: another thread may give the launcher another fast path meanwhile */
    Py_INCREF(fast);
    PyObject *result = launch_run((Launch *)fast, argv, n, NULL);
    Py_DECREF(fast);
    return result;
}

static PyObject *kernel_getitem(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyObject_TypeCheck(args[0], L.Kernel) || !PyTuple_CheckExact(args[1])
            || PyTuple_GET_SIZE(args[1]) != 4)
        return PYTHON_PATH;
    PyObject *config = args[1];
    PyObject *stream = PyTuple_GET_ITEM(config, 3);
    if (!Py_IS_TYPE(stream, L.Stream)) /* None and other streams: make_launcher resolves it */
        return PYTHON_PATH;
    PyObject *launcher = cached_launcher(args[0], PyTuple_GET_ITEM(config, 0),
                                        PyTuple_GET_ITEM(config, 1),
                                        PyTuple_GET_ITEM(config, 2), stream);
    return launcher ? Py_NewRef(launcher) : PYTHON_PATH;
}

static int same_name(PyObject *name, PyObject *interned)
{
    return name == interned || PyUnicode_Compare(name, interned) == 0;
}

static PyObject *launch(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 3 || !PyObject_TypeCheck(args[0], L.Kernel))
        return PYTHON_PATH;
    PyObject *shared = ZERO, *stream = NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (same_name(name, S_shared_mem))
            shared = args[nargs + i];
        else if (same_name(name, S_stream))
            stream = args[nargs + i];
        else /* cluster, cooperative, or a mistake */
            return PYTHON_PATH;
    }
    if (stream == NULL || !Py_IS_TYPE(stream, L.Stream))
        return PYTHON_PATH;
    PyObject *launcher = cached_launcher(args[0], args[1], args[2], shared, stream);
    if (launcher == NULL)
        return PYTHON_PATH;
    Py_INCREF(launcher);
    PyObject *result = run_launcher(launcher, args + 3, nargs - 3);
    Py_DECREF(launcher);
    return result;
}

static PyObject *launcher_call(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || !Py_IS_TYPE(args[0], L.Launcher))
        return PYTHON_PATH;
    PyObject *fast = SLOT(args[0], L.fast);
    if (fast == NULL || !Py_IS_TYPE(fast, &LaunchType))
        return PYTHON_PATH;
    Py_INCREF(fast); /* held while it runs, as in run_launcher */
    PyObject *result = launch_run((Launch *)fast, args + 1, nargs - 1, NULL);
    Py_DECREF(fast);
    return result;
}

/* -- Method: a compiled method standing in for a Python one ---------------------------- */

typedef PyObject *(*impl_fn)(PyObject *const *args, Py_ssize_t nargs);
typedef PyObject *(*impl_kw_fn)(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* Each compiled path by the name of what it stands in for; only cuctx.launch takes
 * keywords (a call with keywords to any other goes to the checked path). */
static const struct {
    const char *name;
    impl_fn impl;
    impl_kw_fn impl_kw;
} IMPLS[] = {
    {"Stream.record", stream_record}, {"Stream.wait", stream_wait},
    {"Event.record", event_record},
    {"Context.push", context_push}, {"Context.pop", context_pop},
    {"Context.__enter__", context_enter}, {"Context.__exit__", context_exit},
    {"Device.__enter__", device_enter}, {"Device.__exit__", device_exit},
    {"Kernel.__getitem__", kernel_getitem}, {"Launcher.__call__", launcher_call},
    {"launch", NULL, launch},
    {NULL}};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    impl_fn impl;
    impl_kw_fn impl_kw;
    PyObject *python; /* the checked path: the Python function it stands in for */
} Method;

static PyObject *Method_vectorcall(Method *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *result = PYTHON_PATH;
    if (L.ready) {
        if (self->impl_kw != NULL)
            result = self->impl_kw(args, nargs, kwnames);
        else if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0)
            result = self->impl(args, nargs);
    }
    if (result != PYTHON_PATH)
        return result;
    return PyObject_Vectorcall(self->python, args, nargsf, kwnames);
}

static PyObject *Method_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    const char *name;
    PyObject *python;
    if (!PyArg_ParseTuple(args, "sO:Method", &name, &python))
        return NULL;
    int i = 0;
    while (IMPLS[i].name && strcmp(IMPLS[i].name, name) != 0)
        i++;
    if (IMPLS[i].name == NULL)
        return PyErr_Format(PyExc_ValueError, "no compiled path named %s", name);
    if (!PyCallable_Check(python))
        return PyErr_Format(PyExc_TypeError, "%s: the checked path must be callable", name);
    Method *self = (Method *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)Method_vectorcall;
    self->impl = IMPLS[i].impl;
    self->impl_kw = IMPLS[i].impl_kw;
    self->python = Py_NewRef(python);
    return (PyObject *)self;
}

static PyObject *Method_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static int Method_traverse(Method *self, visitproc visit, void *arg)
{
    Py_VISIT(self->python);
    return 0;
}

static int Method_clear(Method *self)
{
    Py_CLEAR(self->python);
    return 0;
}

static void Method_dealloc(Method *self)
{
    PyObject_GC_UnTrack(self);
    Method_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* help(), inspect.signature and inspect.getsource see the Python function: its names
 * and docstring are this object's, and __wrapped__ leads to it. */
static PyObject *Method_getattro(Method *self, PyObject *name)
{
    static const char *const delegated[] = {"__doc__", "__name__", "__qualname__",
                                            "__module__", NULL};
    for (int i = 0; delegated[i]; i++)
        if (PyUnicode_CompareWithASCIIString(name, delegated[i]) == 0)
            return PyObject_GetAttr(self->python, name);
    PyObject *found = PyObject_GenericGetAttr((PyObject *)self, name);
    if (found != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return found;
    PyErr_Clear();
    return PyObject_GetAttr(self->python, name);
}

static PyObject *Method_repr(Method *self)
{
    return PyUnicode_FromFormat("<compiled fast path of %R>", self->python);
}

static PyMemberDef Method_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Method, python), READONLY,
     "the checked Python path this compiled path stands in for"},
    {NULL}};

static PyTypeObject MethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cuctx._native.Method",
    .tp_doc = "Method(name, python): the compiled path `name` of a cuctx method or function, "
              "handing every case it was not made for to `python`, the checked path.",
    .tp_basicsize = sizeof(Method),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_METHOD_DESCRIPTOR
                | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Method_new,
    .tp_vectorcall_offset = offsetof(Method, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = Method_get,
    .tp_getattro = (getattrofunc)Method_getattro,
    .tp_repr = (reprfunc)Method_repr,
    .tp_traverse = (traverseproc)Method_traverse,
    .tp_clear = (inquiry)Method_clear,
    .tp_dealloc = (destructor)Method_dealloc,
    .tp_members = Method_members,
};

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
            || take_type(kwargs, "Launcher", &L.Launcher)
            || take(kwargs, "ACTIVE", &L.ACTIVE) || take(kwargs, "CUresult", &L.CUresult)
            || take(kwargs, "CUcontext", &L.CUcontext) || take(kwargs, "fail", &L.fail)
            || take(kwargs, "object_for", &L.object_for)
            || take(kwargs, "driver_namespace", &L.driver_dict)
            || take(kwargs, "step_aside", &L.step_aside))
        return NULL;
    if (!PyDict_Check(L.driver_dict) || !PyTuple_Check(L.step_aside))
        return PyErr_Format(PyExc_TypeError, "driver_namespace: a dict; step_aside: a tuple");
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(L.step_aside); i++) {
        PyObject *pair = PyTuple_GET_ITEM(L.step_aside, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
                || !PyDict_Check(PyTuple_GET_ITEM(pair, 0)))
            return PyErr_Format(PyExc_TypeError, "step_aside holds (namespace, name) pairs");
    }
    struct { Py_ssize_t *offset; PyTypeObject **type; const char *name; } slots[] = {
        {&L.backend, &L.Stream, "_backend"}, {&L.ctx, &L.Stream, "_ctx"},
        {&L.handle, &L.Stream, "_handle"}, {&L.key, &L.Stream, "_key"},
        {&L.state, &L.Context, "_state"}, {&L.device, &L.Context, "_device"},
        {&L.sync_event, &L.Stream, "_sync_event"}, {&L.recorded, &L.Event, "_recorded"},
        {&L.ptr, &L.DeviceArray, "ptr"}, {&L.c_contiguous, &L.DeviceArray, "_c"},
        {&L.stack, &L.ThreadState, "stack"}, {&L.blocks, &L.ThreadState, "blocks"},
        {&L.primary, &L.Device, "_primary"}, {&L.lock, &L.Device, "_lock"},
        {&L.device_backend, &L.Device, "_backend"}, {&L.launchers, &L.Kernel, "_launchers"},
        {&L.fast, &L.Launcher, "_fast"}};
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++)
        if ((*slots[i].offset = slot_offset(*slots[i].type, slots[i].name)) < 0)
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
    L.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(**classes and helpers): what the compiled paths read (see cuctx._native_hooks)"},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "cuctx._native",
    "The compiled fast path of cuctx (see cuctx._native_hooks and docs/ARCHITECTURE.md).",
    -1, module_methods};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&DriverType) < 0 || PyType_Ready(&LaunchType) < 0
            || PyType_Ready(&MethodType) < 0)
        return NULL;
    struct { PyObject **s; const char *text; } names[] = {
        {&S_native, "native"}, {&S_tls, "tls"}, {&S_tls_cache, "cuctx._native thread state"},
        {&S_dict, "__dict__"}, {&S_state, "state"}, {&S_loaded, "_loaded"},
        {&S_locked, "locked"}, {&S_getPtr, "getPtr"}, {&S_active, "_active"},
        {&S_shared_mem, "shared_mem"}, {&S_stream, "stream"}};
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
