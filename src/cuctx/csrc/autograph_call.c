/* cuctx._native (see native.h): an @autograph call, compiled (AutoGraph.__call__ in
 * cuctx/graphs/_autograph.py is the reference: the same steps, the same results):
 *
 *   autograph_call   record the call (a Recording as the thread's recorder, frees deferred
 *                    until its work is enqueued), then serve it: `serve`, else the Python
 *                    path's AutoGraph._run
 *   serve            a graph call of the structure served last (Entry.compiled: kernels on
 *                    one stream with a Patcher): compare the structure and the values, patch
 *                    the changed kernel nodes, launch, and the bookkeeping (the tally, the
 *                    policy's runs and measurements, the switch to eager calls)
 *
 * Whatever serve is not made for (a new structure, a build, an eager call, a whole update, a
 * capture...) it leaves to AutoGraph._run before it changed anything; errors, a function that
 * raises or breaks its recording go to the Python path's own handlers. */
#include "native.h"
#include <time.h>

/* Seconds on the clock time.perf_counter reads (CLOCK_MONOTONIC on Linux). */
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* -- slots holding numbers --------------------------------------------------------------- */

/* A float slot: 1 and *value when it holds a number, 0 when it holds None, -1 (with an
 * exception) otherwise. */
static int get_float(PyObject *obj, Py_ssize_t offset, double *value)
{
    PyObject *v = SLOT(obj, offset);
    if (v == Py_None)
        return 0;
    *value = v ? PyFloat_AsDouble(v) : -1.0;
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_AttributeError, "a slot of AutoGraph's state is unset");
    return PyErr_Occurred() ? -1 : 1;
}

static int set_object(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    if (value == NULL)
        return -1;
    Py_XSETREF(SLOT(obj, offset), value);
    return 0;
}

static int set_float(PyObject *obj, Py_ssize_t offset, double value)
{
    return set_object(obj, offset, PyFloat_FromDouble(value));
}

static int add_float(PyObject *obj, Py_ssize_t offset, double delta)
{
    double value = 0.0;
    return get_float(obj, offset, &value) < 0 ? -1 : set_float(obj, offset, value + delta);
}

static int add_int(PyObject *obj, Py_ssize_t offset, Py_ssize_t delta)
{
    Py_ssize_t value = PyLong_AsSsize_t(SLOT(obj, offset));
    if (value == -1 && PyErr_Occurred())
        return -1;
    return set_object(obj, offset, PyLong_FromSsize_t(value + delta));
}

/* A number of a module's namespace (read at every call: tests change them). */
static double setting(PyObject *namespace, const char *name, double otherwise)
{
    PyObject *value = PyDict_GetItemString(namespace, name);
    double x = value ? PyFloat_AsDouble(value) : otherwise;
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return otherwise;
    }
    return x;
}

/* _autograph_policy.mean: the running mean's new value (``None`` old: the new one). */
static int mean_into(PyObject *obj, Py_ssize_t offset, double new)
{
    double old;
    int known = get_float(obj, offset, &old);
    if (known < 0)
        return -1;
    double smooth = setting(L.policy_dict, "SMOOTH", 0.25);
    return set_float(obj, offset, known ? old + smooth * (new - old) : new);
}

/* -- the policy's estimates (Policy.eager, .replay, .whole, .patch) ----------------------- */

static double model(PyObject *policy, int field)
{
    PyObject *m = SLOT(policy, L.p_model);
    return m && PyTuple_Check(m) && PyTuple_GET_SIZE(m) > field
               ? PyFloat_AsDouble(PyTuple_GET_ITEM(m, field)) : 0.0;
}

enum { M_EAGER_OP, M_LAUNCH, M_REPLAY_NODE, M_PATCH_NODE, M_WHOLE_NODE };

typedef struct {
    double eager, replay, whole, patch;
} Estimates;

static int estimates(PyObject *policy, PyObject *entry, Estimates *e)
{
    double count = (double)PyLong_AsSsize_t(SLOT(entry, L.e_count));
    double size = (double)PyLong_AsSsize_t(SLOT(entry, L.e_size)), per_node;
    int known;
    if ((known = get_float(entry, L.e_eager_s, &e->eager)) < 0)
        return -1;
    if (!known)
        e->eager = model(policy, M_EAGER_OP) * size;
    if ((known = get_float(entry, L.e_replay_s, &e->replay)) < 0)
        return -1;
    if (!known) {
        if ((known = get_float(policy, L.p_replay_node_s, &per_node)) < 0)
            return -1;
        e->replay = known ? per_node * count
                          : model(policy, M_LAUNCH) + model(policy, M_REPLAY_NODE) * count;
    }
    if ((known = get_float(policy, L.p_whole_node_s, &per_node)) < 0)
        return -1;
    if (known)
        e->whole = per_node * count;
    else if ((known = get_float(entry, L.e_construct_s, &e->whole)) < 0)
        return -1;
    else if (!known)
        e->whole = model(policy, M_WHOLE_NODE) * count;
    if ((known = get_float(policy, L.p_patch_s, &e->patch)) < 0)
        return -1;
    if (!known)
        e->patch = model(policy, M_PATCH_NODE);
    return PyErr_Occurred() ? -1 : 0;
}

/* -- serve: a graph call of the structure served last ------------------------------------ */

/* Whether the recording's structure is the entry's (the same operations, in order). */
static int same_structure(PyObject *keys, PyObject *known)
{
    if (!PyList_CheckExact(keys) || !PyList_CheckExact(known)
            || PyList_GET_SIZE(keys) != PyList_GET_SIZE(known))
        return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        int same = PyObject_RichCompareBool(PyList_GET_ITEM(keys, i),
                                            PyList_GET_ITEM(known, i), Py_EQ);
        if (same <= 0)
            return same;
    }
    return 1;
}

/* After the decision to serve: the call's bookkeeping, patches and launch (AutoGraph._run
 * from `entry.seen += 1` on, and _graph_call). 0, or -1 with an exception. */
static int graph_call(PyObject *self, PyObject *rec, PyObject *entry, PyObject *policy,
                      const Py_ssize_t *changed, Py_ssize_t n, int measured, Estimates *e)
{
    PyObject *tally = SLOT(self, L.ag_tally), *values = SLOT(rec, L.tape_values);
    PyObject *patcher = SLOT(entry, L.e_patcher);
    PyObject *root = PyList_GET_ITEM(SLOT(rec, L.rec_streams), 0);
    if (add_int(entry, L.e_seen, 1) < 0 || add_int(policy, L.p_run, 1) < 0
            || mean_into(entry, L.e_changes, (double)n) < 0)
        return -1;
    double t0 = now();
    for (Py_ssize_t j = 0; j < n; j++) {
        if (patcher_patch(patcher, changed[j], PyList_GET_ITEM(values, changed[j])) < 0) {
            if (!PyErr_ExceptionMatches(L.CudaError))
                return -1;
            PyObject *type, *value, *tb; /* a refused update: build anew, as _graph_call */
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            PyObject *done = PyObject_CallMethod(self, "_rebuild", "OOO", entry, rec, value);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            Py_XDECREF(done);
            return done ? 0 : -1;
        }
    }
    double t1 = now();
    if (n > 0 && measured && mean_into(policy, L.p_patch_s, (t1 - t0) / n) < 0)
        return -1; /* Policy.patched */
    if (n > 0 && add_int(tally, L.t_patched_nodes, n) < 0)
        return -1;
    if (patcher_launch(patcher, root) != 0) /* (ready was checked: 1 cannot come) */
        return -1;
    double t2 = now();
    if (n ? add_int(tally, L.t_updates, 1) < 0 || add_float(tally, L.t_update_s, t1 - t0) < 0
                || add_float(tally, L.t_replay_s, t2 - t1) < 0
          : add_int(tally, L.t_replays, 1) < 0 || add_float(tally, L.t_replay_s, t2 - t0) < 0)
        return -1;
    double cost = measured ? t2 - t0 : e->replay + n * e->patch;
    if (measured) {
        double count = (double)PyLong_AsSsize_t(SLOT(entry, L.e_count));
        if (mean_into(entry, L.e_replay_s, t2 - t1) < 0 /* Policy.launched */
                || mean_into(policy, L.p_replay_node_s, (t2 - t1) / (count > 1 ? count : 1)) < 0)
            return -1;
    }
    if (set_object(entry, L.e_values, Py_NewRef(values)) < 0
            || add_float(tally, L.t_saved_s, e->eager - cost) < 0)
        return -1;
    Py_ssize_t strikes = PyLong_AsSsize_t(SLOT(entry, L.e_strikes));
    if (strikes == -1 && PyErr_Occurred())
        return -1;
    strikes = cost > e->eager ? strikes + 1 : 0;
    if (set_object(entry, L.e_strikes, PyLong_FromSsize_t(strikes)) < 0)
        return -1;
    if (strikes >= setting(L.autograph_dict, "SWITCH_AFTER", 3)) {
        PyObject *done = PyObject_CallMethod(self, "_give_way", "Oddn", entry, cost, e->eager, n);
        Py_XDECREF(done);
        return done ? 0 : -1;
    }
    return 0;
}

/* Serve a complete recording as a graph call of the last structure: 1 served, 0 not (the
 * Python path serves it; nothing was changed), -1 an exception. */
static int serve(PyObject *self, PyObject *rec)
{
    PyObject *entry = SLOT(self, L.ag_last), *policy = SLOT(self, L.ag_policy);
    if (entry == NULL || !Py_IS_TYPE(entry, L.Entry) || SLOT(entry, L.e_compiled) != Py_True
            || SLOT(entry, L.e_mode) != L.GRAPH || policy == NULL
            || SLOT(policy, L.p_run_entry) != entry || any_true(L.launch_step_aside))
        return 0; /* (a capture: the Python path sees whether it takes the call's work) */
    PyObject *measured = SLOT(policy, L.p_measured), *streams = SLOT(rec, L.rec_streams);
    PyObject *values = SLOT(rec, L.tape_values), *known = SLOT(entry, L.e_values);
    PyObject *patcher = SLOT(entry, L.e_patcher);
    if (measured == NULL || measured == Py_None || streams == NULL
            || !PyList_CheckExact(streams) || PyList_GET_SIZE(streams) != 1 || values == NULL
            || known == NULL || !PyList_CheckExact(values) || !PyList_CheckExact(known)
            || PyList_GET_SIZE(values) != PyList_GET_SIZE(known) || patcher == NULL
            || !Py_IS_TYPE(patcher, &PatcherType))
        return 0;
    int same = same_structure(SLOT(rec, L.tape_keys), SLOT(entry, L.e_keys));
    if (same <= 0)
        return same;
    int ready = patcher_ready(patcher, PyList_GET_ITEM(streams, 0));
    if (ready <= 0)
        return ready;
    Estimates e;
    if (estimates(policy, entry, &e) < 0)
        return -1;
    Py_ssize_t size = PyList_GET_SIZE(values);
    Py_ssize_t *changed = PyMem_Malloc((size ? size : 1) * sizeof(Py_ssize_t));
    if (changed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n = changed_into(values, known, changed);
    int result = n < 0 ? -1 : 1;
    /* Policy.update: k patches while they cost no more than a whole update */
    if (n > 0 && n * e.patch > e.whole)
        result = 0;
    for (Py_ssize_t j = 0; result == 1 && j < n; j++) {
        int kernel = patcher_knows(patcher, changed[j]);
        if (kernel <= 0 || !PyBytes_CheckExact(PyList_GET_ITEM(values, changed[j])))
            result = kernel < 0 ? -1 : 0;
    }
    if (result == 1 && graph_call(self, rec, entry, policy, changed, n,
                                  measured == Py_True, &e) < 0)
        result = -1;
    PyMem_Free(changed);
    return result;
}

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
    for (int i = 0; !failed && RECORDING_SLOTS[i]; i++)
        failed = (L.rec_slots[i] = slot_offset(L.Recording, RECORDING_SLOTS[i])) < 0;
    return failed ? -1 : 0;
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
