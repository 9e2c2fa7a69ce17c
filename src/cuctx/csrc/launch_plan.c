/* cuctx._native (see native.h): Driver.launcher, which reads a launch plan
 * (cuctx.kernels._plan.Plan) into a Launch, one launcher's compiled fast path for that plan
 * (launch.c packs and launches by it). */
#include "native.h"

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

PyObject *Driver_launcher(Driver *self, PyObject *args, PyObject *kwargs)
{
    PyObject *plan, *ctx, *owner, *stream, *function, *grid, *block, *shared, *config,
        *general, *failer, *sim_args, *launcher;
    static char *names[] = {"plan", "ctx", "owner", "stream", "function", "grid", "block",
                            "shared_mem", "config", "general", "fail", "sim_args", "launcher",
                            NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOOO!O:launcher", names, &plan,
                                     &ctx, &owner, &stream, &function, &grid, &block, &shared,
                                     &config, &general, &failer, &PyTuple_Type, &sim_args,
                                     &launcher))
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
    l->launcher = Py_NewRef(launcher);
    l->plan = Py_NewRef(plan);
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
        PyObject *kind, *code, *convert, *dtypes;
        if (!PyArg_ParseTuple(param, "nnOOOO", &p->offset, &p->size, &code, &kind, &convert,
                              &dtypes) || !PyType_Check(type))
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
            if (dtypes != Py_None) {
                if (!PyTuple_Check(dtypes))
                    goto error;
                p->dtypes = Py_NewRef(dtypes);
            }
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
