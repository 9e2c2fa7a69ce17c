/* cuctx._native (see native.h): the context switches: ctx.push(), Context.pop(), ctx.pop(),
 * `with ctx:` and `with device:`, mirrored on the thread's shadow stack. */
#include "native.h"

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
PyObject *thread_state(PyObject *backend)
{
    PyObject *tls = Py_IS_TYPE(backend, L.Backend) ? Py_XNewRef(SLOT(backend, L.backend_tls))
                                                    : PyObject_GetAttr(backend, S_tls);
    PyObject *dict, *state = NULL;
    if (tls != NULL && (dict = local_dict(tls)) != NULL)
        state = PyDict_GetItemWithError(dict, S_state);
    Py_XDECREF(tls); /* `dict` holds the state, and the thread's dict holds `dict` */
    if (state == NULL || !Py_IS_TYPE(state, L.ThreadState)) {
        PyErr_Clear();
        return NULL;
    }
    return Py_NewRef(state);
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

PyObject *context_push(PyObject *const *args, Py_ssize_t nargs)
{
    return nargs == 1 ? push(args[0], 0) : PYTHON_PATH;
}

PyObject *context_enter(PyObject *const *args, Py_ssize_t nargs)
{
    return nargs == 1 ? push(args[0], 1) : PYTHON_PATH;
}

/* Pop the driver's current context and the shadow stack's top. A failed pop changed
 * nothing: the checked path repeats it and raises with its hint. ``block``: leave the
 * innermost `with` block, which pushed exactly one context that is still on top.
 * ``named``: ctx.pop(), popping only that context, on top of both stacks (anything else,
 * another context on top or an empty stack, takes the checked path, which raises). */
static PyObject *pop(PyObject *backend, int block, PyObject *named)
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
    if (named != NULL) {
        int err = n > 0 && PyList_GET_ITEM(stack, n - 1) == named
            ? drv_current(d, &popped) : 0;
        if (err || popped == NULL || popped != key_of(named)) {
            Py_DECREF(state);
            return err < 0 ? NULL : PYTHON_PATH;
        }
    }
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

PyObject *context_pop(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1) /* ctx.pop() */
        return Py_IS_TYPE(args[0], L.Context) ? pop(SLOT(args[0], L.backend), 0, args[0])
                                              : PYTHON_PATH;
    PyObject *backend = nargs == 0 ? PyDict_GetItemWithError(L.driver_dict, S_active) : NULL;
    if (backend == NULL || backend == Py_None) {
        PyErr_Clear();
        return PYTHON_PATH;
    }
    return pop(backend, 0, NULL);
}

PyObject *context_exit(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !Py_IS_TYPE(args[0], L.Context))
        return PYTHON_PATH;
    return pop(SLOT(args[0], L.backend), 1, NULL);
}

PyObject *device_enter(PyObject *const *args, Py_ssize_t nargs)
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

PyObject *device_exit(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !Py_IS_TYPE(args[0], L.Device))
        return PYTHON_PATH;
    return pop(SLOT(args[0], L.device_backend), 1, NULL);
}


/* -- the current stream, as resolve_stream(None, ctx) finds it ---------------------------- */

/* A weak reference to the context whose handle the driver called current last time: most
 * programs work in one context, so the handle -> Context lookup (a WeakValueDictionary in
 * Python) is made once. Weak, so that it keeps no context alive (a primary context is
 * released when its last Context goes). Verified by handle, backend and state at every
 * use: a context made after one was destroyed may get its handle (a device's primary
 * context after a reset does), and is then looked up again. */
static PyObject *known_ctx;

/* The calling thread's current context of ``backend`` (borrowed, valid until Python code
 * runs), as cuctx.context.live_current finds it; NULL (no exception) where the Python path
 * must find it: none current, one cuctx does not know yet, one not ACTIVE. */
static PyObject *current_context(PyObject *backend, Driver *d)
{
    void *current = NULL;
    int err = drv_current(d, &current);
    if (err) {
        if (err < 0)
            PyErr_Clear();
        return NULL;
    }
    if (current == NULL)
        return NULL;
    PyObject *ctx = known_ctx ? PyWeakref_GetObject(known_ctx) : NULL;
    if (ctx == NULL || !Py_IS_TYPE(ctx, L.Context) || key_of(ctx) != current
            || SLOT(ctx, L.backend) != backend || SLOT(ctx, L.state) != L.ACTIVE) {
        PyObject *contexts = PyObject_GetAttr(backend, S_contexts);
        PyObject *key = PyLong_FromVoidPtr(current);
        ctx = contexts && key ? PyObject_GetItem(contexts, key) : NULL;
        Py_XDECREF(contexts);
        Py_XDECREF(key);
        PyObject *ref = ctx && Py_IS_TYPE(ctx, L.Context) ? PyWeakref_NewRef(ctx, NULL) : NULL;
        Py_XDECREF(ctx); /* (what made it current holds it; code may run: check again) */
        if (ref == NULL) {
            PyErr_Clear();
            return NULL;
        }
        Py_XSETREF(known_ctx, ref);
        ctx = PyWeakref_GetObject(ref);
        if (!Py_IS_TYPE(ctx, L.Context) || key_of(ctx) != current)
            return NULL;
    }
    return SLOT(ctx, L.state) == L.ACTIVE ? ctx : NULL;
}

/* The stream resolve_stream(None, ctx) gives (ctx: the given one, or NULL for the current
 * context of ``backend``), borrowed: this thread's innermost ``with stream:`` of the context's
 * device when it is of that context (of any context: ``any_context``, the rule of
 * resolve_stream(None) without a context, for the current device), else the context's
 * legacy default stream. NULL (no exception) where the Python path resolves it (a host
 * function running, no context current, a default stream not made yet, ...). */
PyObject *current_stream(PyObject *backend, PyObject *ctx, int any_context)
{
    Driver *d = native_of(backend);
    if (d == NULL)
        return NULL;
    if (ctx == NULL && (ctx = current_context(backend, d)) == NULL)
        return NULL;
    if (SLOT(ctx, L.state) != L.ACTIVE)
        return NULL;
    PyObject *state = thread_state(backend), *stream = NULL;
    if (state == NULL)
        return NULL;
    PyObject *streams = SLOT(state, L.streams);
    Py_DECREF(state); /* the thread's local dict holds it */
    if (streams == NULL || !PyDict_CheckExact(streams))
        return NULL;
    PyObject *stack = PyDict_GetItemWithError(streams, SLOT(ctx, L.device));
    if (stack != NULL && PyList_CheckExact(stack) && PyList_GET_SIZE(stack) > 0) {
        PyObject *top = PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
        if (!Py_IS_TYPE(top, L.Stream))
            return NULL; /* a subclass's block: the Python path (not the default stream) */
        if (any_context || SLOT(top, L.ctx) == ctx)
            return top;
    }
    PyObject *defaults = SLOT(ctx, L.default_streams);
    if (defaults != NULL && PyDict_CheckExact(defaults))
        stream = PyDict_GetItemWithError(defaults, S_legacy);
    if (stream == NULL || !Py_IS_TYPE(stream, L.Stream)) {
        PyErr_Clear();
        return NULL;
    }
    return stream;
}
