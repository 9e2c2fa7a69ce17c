/* cuctx._native (see native.h): Stream.record, Event.record and Stream.wait, and Stream's
 * hash slot. */
#include "native.h"

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

PyObject *stream_record(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !Py_IS_TYPE(args[0], L.Stream) || !Py_IS_TYPE(args[1], L.Event))
        return PYTHON_PATH;
    return record(args[0], args[1]);
}

PyObject *event_record(PyObject *const *args, Py_ssize_t nargs)
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

PyObject *stream_wait(PyObject *const *args, Py_ssize_t nargs)
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
Py_hash_t stream_tp_hash(PyObject *stream)
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

