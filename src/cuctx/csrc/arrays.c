/* cuctx._native (see native.h): cuctx.empty, compiled: the array is made here (its dims,
 * dtype, strides and contiguity as DeviceArray._make sets them), of memory that
 *   - inside an @autograph call: the k-th allocation of the call borrows the lease of its
 *     arena slot (k, stream) while nothing else holds that lease
 *     (cuctx/graphs/_autograph_arena.py, whose `lend` is the reference);
 *   - otherwise: memory._alloc.from_pool allocates on the stream, as the Python path's
 *     `allocate` does once it has checked what is checked here (its errors are raised as
 *     they are there).
 * Every other case (a pool or device given, a shape or dtype not seen in this form, an
 * empty shape, a slot lent or missing, another thread recording, a capture, a host
 * function...) takes the Python path. */
#include "native.h"

/* The dims of an int or a tuple of ints (exact ints >= 0: anything else, and bools, are the
 * Python path's, which names what is wrong), as a tuple (a new reference) and their
 * product in *count; NULL without an exception where the Python path must decide. */
static PyObject *dims_of(PyObject *shape, unsigned long long *count)
{
    PyObject *dims;
    if (PyLong_CheckExact(shape))
        dims = PyTuple_Pack(1, shape);
    else if (PyTuple_CheckExact(shape))
        dims = Py_NewRef(shape);
    else
        return NULL;
    if (dims == NULL)
        return NULL;
    unsigned long long product = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dims); i++) {
        PyObject *d = PyTuple_GET_ITEM(dims, i);
        long long n = PyLong_CheckExact(d) ? PyLong_AsLongLong(d) : -1;
        if (n < 0 || __builtin_mul_overflow(product, (unsigned long long)n, &product)) {
            PyErr_Clear();
            Py_DECREF(dims);
            return NULL;
        }
    }
    *count = product;
    return dims;
}

/* C-order strides of ``dims`` (a new tuple) and whether such an array is also Fortran-
 * contiguous (at most one axis longer than 1, as NumPy decides for a non-empty array). */
static PyObject *c_strides(PyObject *dims, Py_ssize_t itemsize, int *fortran)
{
    Py_ssize_t n = PyTuple_GET_SIZE(dims), step = itemsize, longer = 0;
    PyObject *strides = PyTuple_New(n);
    if (strides == NULL)
        return NULL;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        PyObject *s = PyLong_FromSsize_t(step);
        if (s == NULL) {
            Py_DECREF(strides);
            return NULL;
        }
        PyTuple_SET_ITEM(strides, i, s);
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(dims, i));
        longer += d != 1;
        step *= d > 1 ? d : 1;
    }
    *fortran = longer <= 1;
    return strides;
}

/* The slot's lease of ``arena`` for allocation ``index`` of ``nbytes`` on ``stream``, as
 * Arena.lend gives it when the slot's lease is idle and fits (borrowed); NULL (no exception)
 * for every other case, which Arena.lend handles. The slot becomes the most recently lent. */
static PyObject *idle_lease(PyObject *arena, Py_ssize_t index, unsigned long long nbytes,
                            PyObject *stream)
{
    PyObject *slots = SLOT(arena, L.arena_slots), *most = SLOT(arena, L.arena_most);
    PyObject *lock = SLOT(arena, L.arena_lock);
    if (slots == NULL || !PyDict_CheckExact(slots) || most == NULL || lock == NULL
            || PyLong_AsSsize_t(most) <= index) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *locked = PyObject_CallMethodNoArgs(lock, S_locked); /* a Python lend under way */
    Py_XDECREF(locked);
    if (locked != Py_False) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *number = PyLong_FromSsize_t(index);
    PyObject *key = number ? PyTuple_Pack(2, number, stream) : NULL;
    Py_XDECREF(number);
    PyObject *slot = key ? PyDict_GetItemWithError(slots, key) : NULL, *lease = NULL;
    if (slot != NULL && Py_IS_TYPE(slot, L.Slot)) {
        PyObject *candidate = SLOT(slot, L.slot_lease), *capacity = SLOT(slot, L.slot_capacity);
        PyObject *recorded = candidate && Py_IS_TYPE(candidate, L.Lease)
                                 ? SLOT(candidate, L.alloc_recorded) : NULL;
        if (recorded != NULL && PyList_CheckExact(recorded) && PyList_GET_SIZE(recorded) == 0
                && Py_REFCNT(candidate) == 1 /* the slot's only: idle */
                && capacity != NULL && PyLong_AsUnsignedLongLong(capacity) >= nbytes
                && SLOT(candidate, L.alloc_stream) == stream) {
            Py_INCREF(slot); /* to the end of the dict, as `lend` moves it */
            if (PyDict_DelItem(slots, key) == 0 && PyDict_SetItem(slots, key, slot) == 0)
                lease = candidate;
            Py_DECREF(slot);
        }
    }
    PyErr_Clear();
    Py_XDECREF(key);
    return lease;
}

/* A DeviceArray of ``alloc``'s memory (an Allocation, a Lease included), as
 * DeviceArray._make makes one (a new reference). */
static PyObject *array_of(PyObject *ctx, PyObject *dims, PyObject *dtype, Py_ssize_t itemsize,
                          PyObject *alloc)
{
    int fortran;
    PyObject *strides = c_strides(dims, itemsize, &fortran);
    if (strides == NULL)
        return NULL;
    PyObject *array = L.DeviceArray->tp_alloc(L.DeviceArray, 0);
    if (array == NULL) {
        Py_DECREF(strides);
        return NULL;
    }
    PyObject *ptr = SLOT(alloc, L.alloc_ptr);
    struct { Py_ssize_t offset; PyObject *value; } values[] = {
        {L.array_shape, dims}, {L.dtype, dtype}, {L.array_strides, strides}, {L.ptr, ptr},
        {L.handle, ptr}, {L.key, ptr}, {L.ctx, ctx}, {L.backend, SLOT(ctx, L.backend)},
        {L.array_alloc, alloc}, {L.array_owner, Py_None}, {L.c_contiguous, Py_True},
        {L.array_f, fortran ? Py_True : Py_False}};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++)
        SLOT(array, values[i].offset) = Py_NewRef(values[i].value);
    Py_DECREF(strides);
    return array;
}

/* cuctx.empty(shape, dtype=float64, *, stream=None, device=None, pool=None), as cuctx.full,
 * zeros and to_device call it too */
PyObject *array_empty(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1 || nargs > 2 || any_true(L.launch_step_aside))
        return PYTHON_PATH; /* (a capture: its own rules; a host function: refused) */
    PyObject *dtype_arg = nargs == 2 ? args[1] : L.default_dtype, *stream = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(name, "stream") == 0)
            stream = args[nargs + i];
        else if (PyUnicode_CompareWithASCIIString(name, "dtype") == 0 && nargs == 1)
            dtype_arg = args[nargs + i];
        else if (args[nargs + i] != Py_None /* a device or pool given: the Python path */
                 || (PyUnicode_CompareWithASCIIString(name, "device") != 0
                     && PyUnicode_CompareWithASCIIString(name, "pool") != 0))
            return PYTHON_PATH;
    }
    PyObject *known = PyDict_GetItemWithError(L.known_dtypes, dtype_arg);
    if (known == NULL || !PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 2) {
        PyErr_Clear(); /* (an unhashable argument) */
        return PYTHON_PATH;
    }
    PyObject *dtype = PyTuple_GET_ITEM(known, 0);
    Py_ssize_t itemsize = PyLong_AsSsize_t(PyTuple_GET_ITEM(known, 1));
    PyObject *recorder = NULL;
    if (recording() && ((recorder = thread_recorder()) == NULL
                        || !Py_IS_TYPE(recorder, L.Recording))) {
        PyErr_Clear(); /* (another thread records, or another kind of recorder) */
        Py_XDECREF(recorder);
        return PYTHON_PATH;
    }
    if (itemsize <= 0) {
        Py_XDECREF(recorder);
        return PYTHON_PATH;
    }
    PyObject *result = PYTHON_PATH, *dims = NULL;
    unsigned long long count, nbytes;
    if (stream == Py_None) { /* resolve_stream(None, device=None): the current device's */
        PyObject *backend = PyDict_GetItemWithError(L.driver_dict, S_active);
        stream = backend && backend != Py_None ? current_stream(backend, NULL, 1) : NULL;
    } else if (!Py_IS_TYPE(stream, L.Stream)) {
        stream = NULL;
    }
    if (stream == NULL || native_of(SLOT(stream, L.backend)) == NULL /* CUCTX_NATIVE=0 */
            || (dims = dims_of(args[0], &count)) == NULL || count == 0
            || __builtin_mul_overflow(count, (unsigned long long)itemsize, &nbytes)
            || nbytes > PY_SSIZE_T_MAX)
        goto done;
    Py_INCREF(stream);
    PyObject *ctx = SLOT(stream, L.ctx);
    if (SLOT(ctx, L.state) != L.ACTIVE) { /* the Python path raises what fits */
    } else if (recorder == NULL) { /* eager: from_pool allocates, or raises as it does there */
        Py_INCREF(dtype); /* (from_pool runs Python: another thread may replace the entry) */
        PyObject *alloc = PyObject_CallFunction(L.from_pool, "KO", nbytes, stream);
        PyObject *array = alloc ? array_of(ctx, dims, dtype, itemsize, alloc) : NULL;
        Py_XDECREF(alloc); /* (array NULL: an error raised; the allocation freed with alloc) */
        Py_DECREF(dtype);
        Py_DECREF(stream);
        Py_DECREF(dims);
        return array;
    } else {
        PyObject *arena = SLOT(recorder, L.rec_arena), *made = SLOT(recorder, L.rec_allocations);
        Py_ssize_t index = made ? PyLong_AsSsize_t(made) : -1;
        PyObject *lease = index >= 0 && arena ? idle_lease(arena, index, nbytes, stream) : NULL;
        PyObject *array = lease ? array_of(ctx, dims, dtype, itemsize, lease) : NULL;
        PyObject *next = array ? PyLong_FromSsize_t(index + 1) : NULL;
        if (next != NULL) { /* Recording.allocate: the call's allocations so far */
            Py_XSETREF(SLOT(recorder, L.rec_allocations), next);
            result = array;
        } else { /* (a memory error at most: the Python path meets it again and reports it) */
            Py_XDECREF(array);
        }
    }
    Py_DECREF(stream);
done:
    PyErr_Clear();
    Py_XDECREF(dims);
    Py_XDECREF(recorder);
    return result;
}
