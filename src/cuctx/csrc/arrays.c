/* cuctx._native (see native.h): cuctx.empty, compiled: the array is made here (its dims,
 * dtype, strides and contiguity as DeviceArray._make sets them), of memory that
 *   - inside an @autograph call: the k-th allocation of the call borrows the lease of its
 *     arena slot (k, stream) while nothing else holds that lease, and comes from the pool,
 *     as below, while something does (an output of an earlier call the caller kept)
 *     (cuctx/graphs/_autograph_arena.py, whose `lend` is the reference);
 *   - otherwise: the device's default pool gives, on the stream: cuMemAllocAsync called
 *     here and the Allocation made here, as memory._alloc.from_pool (the reference) makes
 *     them when it has nothing to do first; else from_pool itself (finalizers held, the
 *     device's orphans to free, a trace sink, the context's first allocation, an
 *     out-of-memory answer).
 * Every other case (a pool or device given, a shape or dtype not seen in this form, an
 * empty shape, a slot missing or idle but unfit, another thread recording, a capture, a
 * host function...) takes the Python path.
 *
 * Also here: Allocation.__del__, compiled (the free of the pool's memory when the last
 * array using it goes), with the Python method as the path of every uncommon case. */
#include "native.h"

#define CU_OUT_OF_MEMORY 2 /* CUDA_ERROR_OUT_OF_MEMORY */

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
 * otherwise, with *held set where Arena.lend answers None because something still holds the
 * lease (an output of an earlier call the caller kept: the memory comes from the pool), and
 * left 0 for every other case, which Arena.lend handles. Lent or held, the slot becomes the
 * most recently lent, as Arena.lend moves it. */
static PyObject *idle_lease(PyObject *arena, Py_ssize_t index, unsigned long long nbytes,
                            PyObject *stream, int *held)
{
    *held = 0;
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
        int idle = recorded != NULL && PyList_CheckExact(recorded)
                   && PyList_GET_SIZE(recorded) == 0
                   && Py_REFCNT(candidate) == 1 /* the slot's only */
                   && capacity != NULL && PyLong_AsUnsignedLongLong(capacity) >= nbytes
                   && SLOT(candidate, L.alloc_stream) == stream;
        int kept = recorded != NULL && Py_REFCNT(candidate) > 1;
        if (idle || kept) {
            Py_INCREF(slot); /* to the end of the dict, as `lend` moves it */
            if (PyDict_DelItem(slots, key) == 0 && PyDict_SetItem(slots, key, slot) == 0) {
                lease = idle ? candidate : NULL;
                *held = kept;
            }
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

/* -- an allocation of the default pool, and its free -------------------------------------- */

/* The slots of an Allocation, as its __init__ sets them (setup checks that these and
 * __weakref__, which is no member, are its __slots__). */
static const char *const ALLOCATION_SLOTS[] = {
    "ptr", "nbytes", "stream", "recorded", "pool", "shared", "_free", NULL};
enum { A_PTR, A_NBYTES, A_STREAM, A_RECORDED, A_POOL, A_SHARED, A_FREE, A_COUNT };
_Static_assert(A_COUNT == sizeof(L.alloc_slots) / sizeof(L.alloc_slots[0]),
               "native.h's alloc_slots holds one offset per ALLOCATION_SLOTS name");

/* The offsets of Allocation's slots (a Lease, its subclass, has them at the same places). */
int allocation_slot_offsets(void)
{
    PyObject *names = PyObject_GetAttrString((PyObject *)L.Allocation, "__slots__");
    int same = names != NULL && PyTuple_Check(names) && PyTuple_GET_SIZE(names) == A_COUNT + 1
               && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(names, A_COUNT),
                                                   "__weakref__") == 0;
    for (int i = 0; same && i < A_COUNT; i++)
        same = PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(names, i),
                                                ALLOCATION_SLOTS[i]) == 0;
    Py_XDECREF(names);
    if (!same || !PyType_IsSubtype(L.Lease, L.Allocation)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Allocation's slots are not those cuctx/csrc/"
                            "arrays.c makes (update ALLOCATION_SLOTS), or Lease is no "
                            "Allocation");
        return -1;
    }
    if (slot_offsets(L.Allocation, ALLOCATION_SLOTS, L.alloc_slots) < 0)
        return -1;
    L.alloc_ptr = L.alloc_slots[A_PTR];
    L.alloc_stream = L.alloc_slots[A_STREAM];
    L.alloc_recorded = L.alloc_slots[A_RECORDED];
    L.alloc_free = L.alloc_slots[A_FREE];
    return 0;
}

/* Allocation(ptr, nbytes, stream) of the device's default pool, made as its __init__ makes
 * one, without running it: its pending free [_release, ptr, nbytes, stream, recorded, None]
 * filed in ``live`` (its context's _allocations) by the list's id. A new reference, or NULL
 * with an exception; ``ptr`` is stolen. */
static PyObject *new_allocation(PyObject *live, PyObject *stream, PyObject *ptr,
                                unsigned long long nbytes)
{
    PyObject *size = PyLong_FromUnsignedLongLong(nbytes), *recorded = PyList_New(0);
    PyObject *free = size && recorded ? PyList_New(6) : NULL;
    PyObject *alloc = free ? L.Allocation->tp_alloc(L.Allocation, 0) : NULL;
    if (alloc != NULL) {
        PyObject *items[] = {L.release, ptr, size, stream, recorded, Py_None};
        for (Py_ssize_t i = 0; i < 6; i++)
            PyList_SET_ITEM(free, i, Py_NewRef(items[i]));
        PyObject *values[A_COUNT] = {ptr, size, stream, recorded, Py_None, Py_None, free};
        for (int i = 0; i < A_COUNT; i++)
            SLOT(alloc, L.alloc_slots[i]) = Py_NewRef(values[i]);
        PyObject *key = PyLong_FromVoidPtr(free);
        if (key == NULL || PyDict_SetItem(live, key, free) < 0) /* (its __del__: nothing) */
            Py_CLEAR(alloc);
        Py_XDECREF(key);
    }
    Py_DECREF(ptr);
    Py_XDECREF(size);
    Py_XDECREF(recorded);
    Py_XDECREF(free);
    return alloc;
}

/* Whether ``ctx``'s device has orphaned frees (_lifetimes.orphans: from_pool frees them
 * first). Another device's do not concern this allocation. */
static int has_orphans(PyObject *ctx)
{
    PyObject *orphans = PyDict_GetItemWithError(L.lifetimes_dict, S_orphans);
    if (orphans == NULL || !PyDict_CheckExact(orphans)) {
        PyErr_Clear();
        return 1; /* (replaced by something else: from_pool knows what to do) */
    }
    if (PyDict_GET_SIZE(orphans) == 0)
        return 0;
    PyObject *device = SLOT(ctx, L.device);
    PyObject *ptrs = device ? PyDict_GetItemWithError(orphans, device) : NULL;
    PyErr_Clear();
    return ptrs != NULL && PyObject_IsTrue(ptrs) != 0;
}

/* from_pool(nbytes, stream) for an active context whose allocations are filed already (its
 * first allocation registers its teardown), with nothing to do first (finalizers held, a
 * trace sink to tell: `alloc_step_aside`; its device's orphans): cuMemAllocAsync here and
 * the Allocation made here. A new reference; NULL with from_pool's exception for a refusal;
 * or PYTHON_PATH (nothing allocated) for from_pool: every other case, and out of memory, which
 * it asks again after a synchronize and reports with its hint. */
static PyObject *pool_allocation(PyObject *ctx, PyObject *stream, unsigned long long nbytes)
{
    Driver *d = native_of(SLOT(stream, L.backend));
    PyObject *live = SLOT(ctx, L.ctx_allocations), *ptr;
    if (d == NULL || !Py_IS_TYPE(ctx, L.Context) || live == NULL || !PyDict_CheckExact(live)
            || any_true(L.alloc_step_aside) || has_orphans(ctx))
        return PYTHON_PATH;
    int err = drv_mem_alloc(d, ctx, stream, (size_t)nbytes, &ptr);
    if (err == CU_OUT_OF_MEMORY)
        return PYTHON_PATH;
    if (err)
        return err < 0 ? NULL : fail(SLOT(stream, L.backend), err, "cuMemAllocAsync", ctx);
    live = SLOT(ctx, L.ctx_allocations); /* (the call may have run Python: a teardown) */
    if (live != NULL && PyDict_CheckExact(live))
        return new_allocation(live, stream, ptr, nbytes);
    PyObject *alloc = PyObject_CallFunction((PyObject *)L.Allocation, "OKO", ptr, nbytes, stream);
    Py_DECREF(ptr);
    return alloc;
}

/* Allocation.__del__ (memory._alloc's is the reference): its pending free taken out of its
 * context's _allocations, unless a teardown took it first, and then free_or_defer's and
 * _release's common case done here: cuMemFreeAsync on its stream (a refusal, which nobody
 * is there to hear at a collection, is ignored as _release's is). PYTHON_PATH, before
 * anything changed, for the rest: a defer_cleanup block holding frees, finalizers held, a
 * host function, a capture, a trace sink (`free_step_aside`), streams recorded, a context
 * not active, a MemoryPool's memory (its bookkeeping is _release's), another release (an
 * imported allocation's), no compiled path. `_defer_depth` is read without `_defer_lock`
 * (the GIL is held): a block another thread is entering or leaving gets the free before or
 * after it, as in Python. */
PyObject *allocation_del(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyObject_TypeCheck(args[0], L.Allocation))
        return PYTHON_PATH;
    PyObject *self = args[0], *free = SLOT(self, L.alloc_free);
    PyObject *exiting = PyList_GET_SIZE(L.exiting) == 1 ? PyList_GET_ITEM(L.exiting, 0) : NULL;
    if (free == Py_None || (free != NULL && exiting == Py_True))
        Py_RETURN_NONE; /* run or taken already (a Lease's is its block's); the exit's */
    PyObject *stream = SLOT(self, L.alloc_stream);
    if (free == NULL || exiting != Py_False || !PyList_CheckExact(free)
            || PyList_GET_SIZE(free) != 6 || PyList_GET_ITEM(free, 0) != L.release
            || PyList_GET_ITEM(free, 5) != Py_None /* the default pool's */
            || stream == NULL || PyList_GET_ITEM(free, 3) != stream
            || !Py_IS_TYPE(stream, L.Stream))
        return PYTHON_PATH;
    PyObject *recorded = PyList_GET_ITEM(free, 4), *ctx = SLOT(stream, L.ctx);
    PyObject *live = ctx && Py_IS_TYPE(ctx, L.Context) ? SLOT(ctx, L.ctx_allocations) : NULL;
    Driver *d = native_of(SLOT(stream, L.backend));
    if (live == NULL || !PyDict_CheckExact(live) || SLOT(ctx, L.state) != L.ACTIVE
            || !PyList_CheckExact(recorded) || PyList_GET_SIZE(recorded) != 0 || d == NULL
            || any_true(L.free_step_aside))
        return PYTHON_PATH;
    PyObject *key = PyLong_FromVoidPtr(free);
    if (key == NULL)
        return NULL;
    Py_INCREF(free); /* (held while the driver call runs: it holds the stream) */
    Py_SETREF(SLOT(self, L.alloc_free), Py_NewRef(Py_None));
    PyObject *filed = PyDict_GetItemWithError(live, key);
    int err = filed == NULL ? (PyErr_Occurred() ? -1 : 0) : PyDict_DelItem(live, key);
    if (filed != NULL && err == 0)
        err = drv_mem_free(d, ctx, stream, PyList_GET_ITEM(free, 1));
    Py_DECREF(key);
    Py_DECREF(free);
    if (err < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* -- cuctx.empty ------------------------------------------------------------------------ */

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
    int pooled = 0; /* of the pool, here or in from_pool */
    if (SLOT(ctx, L.state) != L.ACTIVE) { /* the Python path raises what fits */
    } else if (recorder == NULL) { /* eager */
        pooled = 1;
    } else {
        PyObject *arena = SLOT(recorder, L.rec_arena), *made = SLOT(recorder, L.rec_allocations);
        Py_ssize_t index = made ? PyLong_AsSsize_t(made) : -1;
        int held = 0;
        PyObject *lease = index >= 0 && arena ? idle_lease(arena, index, nbytes, stream, &held)
                                              : NULL;
        PyObject *next = lease || held ? PyLong_FromSsize_t(index + 1) : NULL;
        if (next == NULL) { /* (a memory error at most: the Python path meets it again) */
            PyErr_Clear();
        } else if (lease != NULL) {
            PyObject *array = array_of(ctx, dims, dtype, itemsize, lease);
            if (array != NULL) { /* Recording.allocate: the call's allocations so far */
                Py_XSETREF(SLOT(recorder, L.rec_allocations), next);
                result = array;
            } else {
                Py_DECREF(next);
            }
        } else { /* its slot's lease is kept: of the pool, counted as Recording.allocate
                  * counts it before from_pool runs */
            Py_XSETREF(SLOT(recorder, L.rec_allocations), next);
            pooled = 1;
        }
    }
    if (pooled) {
        Py_INCREF(dtype); /* (Python may run: another thread may replace the entry) */
        PyObject *alloc = pool_allocation(ctx, stream, nbytes);
        if (alloc == PYTHON_PATH) /* from_pool allocates, or raises as it does there */
            alloc = PyObject_CallFunction(L.from_pool, "KO", nbytes, stream);
        result = alloc ? array_of(ctx, dims, dtype, itemsize, alloc) : NULL;
        Py_XDECREF(alloc); /* (result NULL: an error raised; the allocation freed with alloc) */
        Py_DECREF(dtype);
        Py_DECREF(stream);
        Py_DECREF(dims);
        Py_XDECREF(recorder);
        return result;
    }
    Py_DECREF(stream);
done:
    PyErr_Clear();
    Py_XDECREF(dims);
    Py_XDECREF(recorder);
    return result;
}
