/* cuctx._native (see native.h): Launch, one launcher's compiled fast path for one plan:
 * packing the arguments by the plan, the launch (launch_plan.c reads the plan). */
#include "native.h"

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
        if (PyLong_CheckExact(value)) { /* an address: below 2**63, the quick conversion */
            int overflow = 0;
            long long quick = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (!overflow && quick >= 0) {
                memcpy(out, &quick, 8);
                return 0;
            }
            if (quick == -1 && PyErr_Occurred())
                return -1;
        }
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

/* Whether an array's dtype is one of the plan's, by identity (NumPy's builtin dtypes are
 * single objects; an equal one of another object takes the checked path, which compares
 * by value). */
static int dtype_taken(PyObject *dtype, PyObject *dtypes)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dtypes); i++)
        if (PyTuple_GET_ITEM(dtypes, i) == dtype)
            return 1;
    return 0;
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

/* `_trace.emit_launch(launcher, args, plan)` for a launch that ran (made in C: announce.c). */
static PyObject *announce_launch(Launch *l, PyObject *const *argv, Py_ssize_t n,
                                 PyObject *tuple)
{
    PyObject *args = tuple ? Py_NewRef(tuple) : PyTuple_New(n);
    if (args == NULL)
        return NULL;
    if (tuple == NULL)
        for (Py_ssize_t i = 0; i < n; i++)
            PyTuple_SET_ITEM(args, i, Py_NewRef(argv[i]));
    PyObject *result = announce_compiled_launch(l->launcher, args, l->plan);
    Py_DECREF(args);
    return result;
}

/* While some thread records an autograph call: hand the launch to this thread's recorder,
 * as the generated path does (`Recorder.launch(launcher, buffer, args, plan)`). 1: it took
 * the launch; 0: this thread does not record, or its recorder does not follow the stream. */
static int hand_to_recorder(Launch *l, const char *buffer, PyObject *const *argv,
                            Py_ssize_t n, PyObject *tuple)
{
    PyObject *recorder = thread_recorder();
    if (recorder == NULL)
        return PyErr_Occurred() ? -1 : 0; /* this thread does not record */
    PyObject *bytes = PyBytes_FromStringAndSize(buffer, l->size);
    PyObject *args = tuple ? Py_NewRef(tuple) : PyTuple_New(n);
    int took = -1;
    if (bytes != NULL && args != NULL) {
        if (tuple == NULL)
            for (Py_ssize_t i = 0; i < n; i++)
                PyTuple_SET_ITEM(args, i, Py_NewRef(argv[i]));
        took = record_launch(recorder, l->launcher, l->stream, bytes, args, l->plan);
    }
    Py_DECREF(recorder);
    Py_XDECREF(bytes);
    Py_XDECREF(args);
    return took;
}

/* The driver call of a launch whose parameters ``params`` points at, its refusal raised as
 * the checked path raises it, and (with argv, n, tuple: its arguments) its announcement to
 * the trace sinks that listen. */
static PyObject *launch_now(Launch *l, void **params, PyObject *const *argv, Py_ssize_t n,
                            PyObject *tuple, int announce)
{
    Driver *d = l->driver;
    int pushed, err = enter_stream_context(d, l->stream, l->ctx, &pushed);
    if (err < 0)
        return NULL;
    if (err > 0)
        return fail(l->backend, err, "cuCtxPushCurrent", l->ctx);
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
    if (announce && any_true(L.announce)) /* as the checked path announces it */
        return announce_launch(l, argv, n, tuple);
    Py_RETURN_NONE;
}

PyObject *launch_run(Launch *l, PyObject *const *argv, Py_ssize_t n, PyObject *tuple)
{
    if (n != l->n)
        goto general;
    for (Py_ssize_t i = 0; i < n; i++)
        if (Py_TYPE(argv[i]) != l->params[i].type)
            goto general;
    /* An unusable context, unloaded code, a host function running, a graph being captured: */
    if (SLOT(l->ctx, L.state) != L.ACTIVE || any_true(L.launch_step_aside))
        goto general;
    if (loaded(l->owner) <= 0) {
        PyErr_Clear();
        goto general;
    }

    char buffer[MAX_PARAM_BYTES];
    void *pointers[MAX_PARAMS];
    memset(buffer, 0, l->size);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Param *p = &l->params[i];
        PyObject *arg = argv[i], *value = arg, *made = NULL;
        if (p->kind == K_ARRAY) { /* the checks of cuctx.kernels._args._device_array_pointer */
            PyObject *c = SLOT(arg, L.ctx), *contiguous = SLOT(arg, L.c_contiguous);
            if (c == NULL || SLOT(c, L.state) != L.ACTIVE || SLOT(c, L.device) != l->device
                    || contiguous != Py_True || (value = SLOT(arg, L.ptr)) == NULL)
                goto general;
            /* and of _args._typed: a dtype the parameter takes */
            if (p->dtypes != NULL && !dtype_taken(SLOT(arg, L.dtype), p->dtypes))
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
    if (recording()) {
        int took = hand_to_recorder(l, buffer, argv, n, tuple);
        if (took < 0)
            return NULL;
        if (took)
            Py_RETURN_NONE;
    }

    return launch_now(l, n ? pointers : NULL, argv, n, tuple, 1);
general:
    return launch_general(l, argv, n, tuple);
}

/* A launch of parameter bytes packed before (a recorded launch run eagerly, as
 * Launcher._enqueue does it): 1 launched, 0 not (the Python path launches it: an unusable
 * context, unloaded code, a capture, a host function, a trace sink), -1 an exception. */
int launch_packed(PyObject *fast, PyObject *bytes)
{
    Launch *l = (Launch *)fast;
    if (!PyBytes_CheckExact(bytes) || PyBytes_GET_SIZE(bytes) != l->size
            || SLOT(l->ctx, L.state) != L.ACTIVE || any_true(L.launch_step_aside)
            || any_true(L.announce))
        return 0;
    if (loaded(l->owner) <= 0) {
        PyErr_Clear();
        return 0;
    }
    void *pointers[MAX_PARAMS];
    char *data = PyBytes_AS_STRING(bytes); /* (the driver copies the parameters) */
    for (Py_ssize_t i = 0; i < l->n; i++)
        pointers[i] = data + l->params[i].offset;
    PyObject *done = launch_now(l, l->n ? pointers : NULL, NULL, 0, NULL, 0);
    Py_XDECREF(done);
    return done ? 1 : -1;
}

PyObject *Launch_vectorcall(Launch *self, PyObject *const *args, size_t nargsf,
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
    Py_VISIT(self->launcher);
    Py_VISIT(self->plan);
    for (Py_ssize_t i = 0; self->params && i < self->n; i++) {
        Py_VISIT(self->params[i].type);
        Py_VISIT(self->params[i].convert);
        Py_VISIT(self->params[i].dtypes);
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
    Py_CLEAR(self->launcher);
    Py_CLEAR(self->plan);
    for (Py_ssize_t i = 0; self->params && i < self->n; i++) {
        Py_CLEAR(self->params[i].type);
        Py_CLEAR(self->params[i].convert);
        Py_CLEAR(self->params[i].dtypes);
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

PyTypeObject LaunchType = {
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
