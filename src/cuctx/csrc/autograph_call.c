/* cuctx._native (see native.h): an @autograph call, compiled (AutoGraph.__call__ in
 * cuctx/graphs/_autograph.py is the reference: the same steps, the same results): record
 * the call (a Recording as the thread's recorder, frees deferred until its work is
 * enqueued), then serve it: `serve` (autograph_serve.c), else the Python path's
 * AutoGraph._run. A function that raises or breaks its recording goes to the Python path's
 * own handlers. */
#include "native.h"

/* -- the call ----------------------------------------------------------------------------- */

/* The slots of a new Recording(arena), as its __init__ sets them (setup checks that these
 * are all of its slots). */
static const char *const RECORDING_SLOTS[] = {
    "keys", "values", "items", "_stream", "streams", "roles", "ctx", "events", "broken",
    "arena", "allocations", "_role", NULL};

static int check_recording_slots(PyObject *names)
{
    Py_ssize_t n = 0;
    while (RECORDING_SLOTS[n])
        n++;
    int same = PyTuple_Check(names) && PyTuple_GET_SIZE(names) == n;
    for (Py_ssize_t i = 0; same && i < n; i++)
        same = PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(names, i),
                                                RECORDING_SLOTS[i]) == 0;
    if (!same)
        PyErr_SetString(PyExc_TypeError, "Recording's slots are not those cuctx/csrc/"
                                         "autograph_call.c makes: update RECORDING_SLOTS");
    return same ? 0 : -1;
}

/* The offsets of Recording's slots; its slots (Tape's, then its own) must be those above. */
int recording_slot_offsets(void)
{
    PyObject *mine = PyObject_GetAttrString((PyObject *)L.Recording, "__slots__");
    PyObject *tape = PyObject_GetAttrString((PyObject *)L.Tape, "__slots__");
    PyObject *names = mine && tape ? PySequence_Concat(tape, mine) : NULL;
    Py_XDECREF(mine);
    Py_XDECREF(tape);
    int failed = names == NULL || check_recording_slots(names) < 0;
    Py_XDECREF(names);
    return failed ? -1 : slot_offsets(L.Recording, RECORDING_SLOTS, L.rec_slots);
}

/* Recording(arena), made here (the __init__ in Python would cost more than the rest of
 * a graph call's bookkeeping). */
static PyObject *new_recording(PyObject *arena)
{
    PyObject *rec = L.Recording->tp_alloc(L.Recording, 0);
    if (rec == NULL)
        return NULL;
    PyObject *values[] = {PyList_New(0), PyList_New(0), PyList_New(0), Py_NewRef(Py_None),
                          PyList_New(0), PyDict_New(), Py_NewRef(Py_None), PyDict_New(),
                          Py_NewRef(Py_None), Py_NewRef(arena), Py_NewRef(ZERO),
                          Py_NewRef(ZERO)};
    int failed = 0;
    for (int i = 0; RECORDING_SLOTS[i]; i++) {
        failed |= values[i] == NULL;
        SLOT(rec, L.rec_slots[i]) = values[i];
    }
    if (failed) {
        Py_DECREF(rec);
        return NULL;
    }
    return rec;
}

/* `with defer_cleanup():` entered (1) or left (-1): the hold of _lifetimes, whose counter
 * is changed here while no thread holds its lock (the GIL makes the change atomic); the
 * block's own methods otherwise, and for the end of the outermost block with frees held
 * (they run then). 0, or -1 with an exception. */
static int defer(int step)
{
    PyObject *depth = PyDict_GetItemWithError(L.lifetimes_dict, S_defer_depth);
    PyObject *held = PyDict_GetItemWithError(L.lifetimes_dict, S_deferred);
    PyObject *lock = PyDict_GetItemWithError(L.lifetimes_dict, S_defer_lock);
    PyObject *locked = lock ? PyObject_CallMethodNoArgs(lock, S_locked) : NULL;
    Py_XDECREF(locked);
    long value = depth ? PyLong_AsLong(depth) : -1;
    if (locked == Py_False && value >= 0 && held && PyList_Check(held)
            && !(step < 0 && value == 1 && PyList_GET_SIZE(held) > 0)) {
        PyObject *next = PyLong_FromLong(value + step);
        int failed = next == NULL || PyDict_SetItem(L.lifetimes_dict, S_defer_depth, next) < 0;
        Py_XDECREF(next);
        return failed ? -1 : 0;
    }
    PyErr_Clear();
    PyObject *done = step > 0 ? PyObject_CallMethod(L.defer, "__enter__", NULL)
                              : PyObject_CallMethod(L.defer, "__exit__", "OOO", Py_None,
                                                    Py_None, Py_None);
    Py_XDECREF(done);
    return done ? 0 : -1;
}

/* AutoGraph._failed / _broken, with the call's start on time.perf_counter's clock. */
static PyObject *ran_eagerly(PyObject *self, const char *handler, PyObject *rec, double start,
                             PyObject *exc)
{
    PyObject *clock = PyObject_CallNoArgs(L.perf_counter);
    double python_now = clock ? PyFloat_AsDouble(clock) : 0.0;
    Py_XDECREF(clock);
    if (PyErr_Occurred())
        return NULL;
    PyObject *began = PyFloat_FromDouble(python_now - (now() - start));
    if (began == NULL)
        return NULL;
    PyObject *done = exc ? PyObject_CallMethod(self, handler, "OOO", rec, began, exc)
                         : PyObject_CallMethod(self, handler, "OO", rec, began);
    Py_DECREF(began);
    return done;
}

/* The end of the `with defer_cleanup():` block: the frees held since its start run. A
 * pending exception stays the call's. */
static int defer_exit(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int failed = defer(-1) < 0;
    if (type != NULL) {
        if (failed)
            PyErr_Clear(); /* (the call's own error wins, as Python's chaining shows it) */
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return failed ? -1 : 0;
}

/* Under the function's lock: count the call, serve it (here or in AutoGraph._run), trim the
 * arena if it grew. 0, or -1 with an exception. */
static int run_locked(PyObject *self, PyObject *rec, double recording_s)
{
    PyObject *tally = SLOT(self, L.ag_tally), *arena = SLOT(self, L.ag_arena);
    if (add_int(tally, L.t_calls, 1) < 0 || add_float(tally, L.t_recording_s, recording_s) < 0)
        return -1;
    int served = serve(self, rec);
    if (served < 0)
        return -1;
    if (!served) {
        PyObject *done = PyObject_CallMethodOneArg(self, S_run, rec);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    if (SLOT(arena, L.arena_grown) == Py_True) {
        PyObject *done = PyObject_CallMethodOneArg(arena, S_trim, SLOT(self, L.ag_max_bytes));
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    return 0;
}

PyObject *autograph_call(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1 || !Py_IS_TYPE(args[0], L.AutoGraph))
        return PYTHON_PATH;
    PyObject *self = args[0], *recorder = thread_recorder();
    if (recorder != NULL || PyErr_Occurred()) { /* inside another autograph call */
        PyErr_Clear();
        Py_XDECREF(recorder);
        return PYTHON_PATH;
    }
    PyObject *rec = new_recording(SLOT(self, L.ag_arena));
    PyObject *ident = rec ? PyLong_FromUnsignedLong(PyThread_get_thread_ident()) : NULL;
    if (ident == NULL) {
        Py_XDECREF(rec);
        return NULL;
    }
    double start = now();
    PyObject *result = NULL;
    if (defer(1) < 0)
        goto done;
    if (PyDict_SetItem(L.recording, ident, rec) < 0) { /* _record.start */
        defer_exit();
        goto done;
    }
    result = PyObject_Vectorcall(SLOT(self, L.ag_fn), args + 1, nargs - 1, kwnames);
    if (result == NULL) { /* the function raised: AutoGraph._failed, then its error */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *done = ran_eagerly(self, "_failed", rec, start, value);
        if (done == NULL) { /* its error, chained to the function's as Python chains it */
            PyObject *type2, *value2, *tb2;
            PyErr_Fetch(&type2, &value2, &tb2);
            PyErr_NormalizeException(&type2, &value2, &tb2);
            PyException_SetContext(value2, Py_NewRef(value));
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            PyErr_Restore(type2, value2, tb2);
        } else {
            Py_DECREF(done);
            PyErr_Restore(type, value, tb);
        }
        defer_exit();
        goto done;
    }
    if (SLOT(rec, L.rec_broken) != Py_None) { /* stopped by what a graph cannot hold */
        PyObject *done = ran_eagerly(self, "_broken", rec, start, NULL);
        Py_XDECREF(done);
        if (done == NULL)
            Py_CLEAR(result);
        if (defer_exit() < 0)
            Py_CLEAR(result);
        goto done;
    }
    if (PyDict_DelItem(L.recording, ident) < 0) /* _record.stop */
        PyErr_Clear();
    double recorded = now();
    PyObject *lock = SLOT(self, L.ag_lock);
    PyObject *acquired = PyObject_CallMethodNoArgs(lock, S_acquire);
    int failed = acquired == NULL;
    Py_XDECREF(acquired);
    if (!failed) {
        failed = run_locked(self, rec, recorded - start) < 0;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *released = PyObject_CallMethodNoArgs(lock, S_release);
        Py_XDECREF(released);
        if (type != NULL)
            PyErr_Restore(type, value, tb);
        failed |= released == NULL;
    }
    if (defer_exit() < 0 || failed)
        Py_CLEAR(result);
done:
    { /* the thread records no more, whichever way the call ended (the handlers stop it) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (PyDict_GetItemWithError(L.recording, ident) == rec)
            PyDict_DelItem(L.recording, ident);
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(ident);
    Py_DECREF(rec);
    return result;
}

/* An AutoGraph called: its type's call slot (as Launcher's, methods.c), which takes
 * autograph_call without looking __call__ up; the Python method for what that hands back. */
static PyObject *autograph_tp_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t n = PyTuple_GET_SIZE(args), nkw = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    PyObject *small[16], **vector = small, *kwnames = NULL, *result = PYTHON_PATH;
    if (1 + n + nkw > 16 && (vector = PyMem_Malloc((1 + n + nkw) * sizeof(PyObject *))) == NULL)
        return PyErr_NoMemory();
    vector[0] = self;
    for (Py_ssize_t i = 0; i < n; i++)
        vector[1 + i] = PyTuple_GET_ITEM(args, i);
    if (nkw && (kwnames = PyTuple_New(nkw)) != NULL) {
        Py_ssize_t at = 0, k = 0;
        PyObject *name, *value;
        while (PyDict_Next(kwargs, &at, &name, &value)) {
            PyTuple_SET_ITEM(kwnames, k, Py_NewRef(name));
            vector[1 + n + k++] = value;
        }
    }
    if (nkw && kwnames == NULL)
        result = NULL;
    else if (L.ready)
        result = autograph_call(vector, 1 + n, kwnames);
    Py_XDECREF(kwnames);
    if (vector != small)
        PyMem_Free(vector);
    if (result != PYTHON_PATH)
        return result;
    PyObject *method = PyObject_GetAttr((PyObject *)Py_TYPE(self), S_call);
    PyObject *bound = method ? PyMethod_New(method, self) : NULL;
    Py_XDECREF(method);
    result = bound ? PyObject_Call(bound, args, kwargs) : NULL;
    Py_XDECREF(bound);
    return result;
}

int install_autograph_call(void)
{
    PyObject *subclasses = PyObject_CallMethod((PyObject *)L.AutoGraph, "__subclasses__", NULL);
    if (subclasses == NULL)
        return -1;
    if (PyList_GET_SIZE(subclasses) == 0) {
        L.AutoGraph->tp_call = autograph_tp_call;
        PyType_Modified(L.AutoGraph);
    }
    Py_DECREF(subclasses);
    return 0;
}
