/* cuctx._native (see native.h): Method, the compiled path standing in for a Python method
 * or function, and the launcher lookups it runs: kernel[...], cuctx.launch,
 * Launcher.__call__. */
#include "native.h"

/* -- kernel[...], cuctx.launch, Launcher.__call__ --------------------------------------- */

/* Whether a configuration value is the one the memo holds: the same object, or an equal
 * int (a grid computed each call is a new int object); anything else takes the dict. */
static int same_value(PyObject *a, PyObject *b)
{
    return a == b || (PyLong_CheckExact(a) && PyLong_CheckExact(b)
                      && PyObject_RichCompareBool(a, b, Py_EQ) == 1);
}

/* The cached launcher of make_launcher's key (a new reference), NULL when there is none.
 * The kernel's memo (grid, block, shared, stream, launcher) answers a configuration asked for
 * again without building and hashing the key. */
static PyObject *cached_launcher(PyObject *kernel, PyObject *grid, PyObject *block,
                                 PyObject *shared, PyObject *stream)
{
    PyObject *cache = SLOT(kernel, L.launchers), *memo = SLOT(kernel, L.launch_memo);
    if (cache == NULL || !PyDict_CheckExact(cache) || native_of(SLOT(kernel, L.backend)) == NULL)
        return NULL;
    if (memo != NULL && PyTuple_CheckExact(memo) && PyTuple_GET_SIZE(memo) == 5
            && PyTuple_GET_ITEM(memo, 3) == stream && same_value(PyTuple_GET_ITEM(memo, 0), grid)
            && same_value(PyTuple_GET_ITEM(memo, 1), block)
            && same_value(PyTuple_GET_ITEM(memo, 2), shared))
        return Py_NewRef(PyTuple_GET_ITEM(memo, 4));
    PyObject *key = PyTuple_Pack(9, grid, block, shared, stream, Py_None, Py_False,
                                 (PyObject *)Py_TYPE(grid), (PyObject *)Py_TYPE(block),
                                 (PyObject *)Py_TYPE(shared));
    if (key == NULL)
        return NULL;
    PyObject *launcher = Py_XNewRef(PyDict_GetItemWithError(cache, key));
    Py_DECREF(key);
    if (launcher == NULL) {
        PyErr_Clear(); /* an unhashable configuration: make_launcher does not cache it */
        return NULL;
    }
    PyObject *remember = PyTuple_Pack(5, grid, block, shared, stream, launcher);
    if (remember == NULL)
        PyErr_Clear();
    else
        Py_XSETREF(SLOT(kernel, L.launch_memo), remember);
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

/* The stream a launch of ``kernel`` on ``stream`` runs on: make_launcher's
 * resolve_stream(None, kernel._ctx or context_for()) for None (a new reference); NULL: the
 * Python path resolves it. */
static PyObject *stream_of(PyObject *kernel, PyObject *stream)
{
    if (stream != Py_None) /* a Stream; anything else make_launcher adopts */
        return Py_IS_TYPE(stream, L.Stream) ? Py_NewRef(stream) : NULL;
    PyObject *ctx = SLOT(kernel, L.ctx); /* a Module's kernel: its context; a Library's: None */
    return Py_XNewRef(current_stream(SLOT(kernel, L.backend), ctx == Py_None ? NULL : ctx, 0));
}

/* kernel[grid, block], kernel[grid, block, shared_mem], kernel[grid, block, shared_mem,
 * stream]: the cached launcher, the current stream resolved here when none is given. */
static PyObject *kernel_getitem(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyObject_TypeCheck(args[0], L.Kernel) || !PyTuple_CheckExact(args[1]))
        return PYTHON_PATH;
    PyObject *config = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(config);
    if (n < 2 || n > 4)
        return PYTHON_PATH;
    PyObject *stream = stream_of(args[0], n == 4 ? PyTuple_GET_ITEM(config, 3) : Py_None);
    if (stream == NULL)
        return PYTHON_PATH;
    PyObject *launcher = cached_launcher(args[0], PyTuple_GET_ITEM(config, 0),
                                        PyTuple_GET_ITEM(config, 1),
                                        n > 2 ? PyTuple_GET_ITEM(config, 2) : ZERO, stream);
    Py_DECREF(stream);
    return launcher ? launcher : PYTHON_PATH;
}

/* cuctx.current_stream(): resolve_stream(None), as current_stream finds it for the current
 * context of the active backend (a device given, none current, a host function running:
 * the Python path). PyTorch-style code asks for it in its loops (record_stream, wait_stream):
 * the checked path takes about 2 us on an H100, mostly its driver query through cuda.bindings. */
static PyObject *current_stream_of_thread(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 0)
        return PYTHON_PATH;
    PyObject *backend = PyDict_GetItemWithError(L.driver_dict, S_active);
    PyObject *stream = backend && backend != Py_None ? current_stream(backend, NULL, 1) : NULL;
    if (stream == NULL) {
        PyErr_Clear();
        return PYTHON_PATH;
    }
    return Py_NewRef(stream);
}

static int same_name(PyObject *name, PyObject *interned)
{
    return name == interned || PyUnicode_Compare(name, interned) == 0;
}

static PyObject *launch(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 3 || !PyObject_TypeCheck(args[0], L.Kernel))
        return PYTHON_PATH;
    PyObject *shared = ZERO, *stream = Py_None;
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
    if ((stream = stream_of(args[0], stream)) == NULL)
        return PYTHON_PATH;
    PyObject *launcher = cached_launcher(args[0], args[1], args[2], shared, stream);
    Py_DECREF(stream);
    if (launcher == NULL)
        return PYTHON_PATH;
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

/* A Launcher called: its type's call slot (see install_launcher_call), which takes the
 * compiled launch without looking __call__ up. Anything else: the method in the class. */
static PyObject *launcher_tp_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *fast = SLOT(self, L.fast);
    if ((kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0) && fast != NULL
            && Py_IS_TYPE(fast, &LaunchType) && L.ready) {
        Py_INCREF(fast); /* held while it runs, as in run_launcher */
        PyObject *result = launch_run((Launch *)fast, &PyTuple_GET_ITEM(args, 0),
                                      PyTuple_GET_SIZE(args), args);
        Py_DECREF(fast);
        return result;
    }
    PyObject *method = PyObject_GetAttr((PyObject *)Py_TYPE(self), S_call);
    if (method == NULL)
        return NULL;
    PyObject *bound = PyMethod_New(method, self);
    Py_DECREF(method);
    if (bound == NULL)
        return NULL;
    PyObject *result = PyObject_Call(bound, args, kwargs);
    Py_DECREF(bound);
    return result;
}

/* kernel[...]: Kernel's subscript slot (see install_launcher_call), which takes
 * kernel_getitem without looking __getitem__ up. Anything else: the method in the class. */
static PyObject *kernel_mp_subscript(PyObject *self, PyObject *config)
{
    PyObject *args[2] = {self, config};
    PyObject *result = L.ready ? kernel_getitem(args, 2) : PYTHON_PATH;
    if (result != PYTHON_PATH)
        return result;
    PyObject *method = PyObject_GetAttr((PyObject *)Py_TYPE(self), S_getitem);
    if (method == NULL)
        return NULL;
    result = PyObject_CallFunctionObjArgs(method, self, config, NULL);
    Py_DECREF(method);
    return result;
}

/* Whether ``type`` has no subclasses (they copied its slots when they were made). */
static int alone(PyTypeObject *type)
{
    PyObject *subclasses = PyObject_CallMethod((PyObject *)type, "__subclasses__", NULL);
    if (subclasses == NULL)
        return -1;
    int none = PyList_GET_SIZE(subclasses) == 0;
    Py_DECREF(subclasses);
    return none;
}

/* Give Launcher a call slot and Kernel a subscript slot in C (one of each per launch in
 * kernel[...](...)), as setup gives Stream a hash slot. Assigning the Python method again
 * puts Python's slot back; a class with subclasses keeps it. */
int install_launcher_call(void)
{
    int launcher = alone(L.Launcher), kernel = launcher < 0 ? -1 : alone(L.Kernel);
    if (kernel < 0)
        return -1;
    if (launcher) {
        L.Launcher->tp_call = launcher_tp_call;
        PyType_Modified(L.Launcher);
    }
    if (kernel && L.Kernel->tp_as_mapping != NULL) {
        L.Kernel->tp_as_mapping->mp_subscript = kernel_mp_subscript;
        PyType_Modified(L.Kernel);
    }
    return 0;
}

/* -- Method: a compiled method standing in for a Python one ---------------------------- */

typedef PyObject *(*impl_fn)(PyObject *const *args, Py_ssize_t nargs);
typedef PyObject *(*impl_kw_fn)(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* Each compiled path by the name of what it stands in for; only cuctx.launch, cuctx.empty
 * and an autograph call take keywords (a call with keywords to any other goes to the
 * checked path). */
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
    {"launch", NULL, launch}, {"empty", NULL, array_empty},
    {"current_stream", current_stream_of_thread},
    {"AutoGraph.__call__", NULL, autograph_call}, {"Allocation.__del__", allocation_del},
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

PyTypeObject MethodType = {
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
