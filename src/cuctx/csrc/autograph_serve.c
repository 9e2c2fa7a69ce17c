/* cuctx._native (see native.h): serving a recorded @autograph call (cuctx/graphs/
 * _autograph.py is the reference: the same steps, the same results):
 *
 *   serve     a graph call of the structure served last (Entry.compiled: kernels on one
 *             stream with a Patcher): compare the structure and the values, patch the changed
 *             kernel nodes, launch, and the bookkeeping (the tally, the policy's runs and
 *             measurements, the switch to eager calls)
 *
 *   Driver.enqueue   a call run eagerly: its recorded launches enqueued from their packed
 *                    bytes through the launchers' compiled paths (Recording.enqueue_all)
 *
 * Whatever serve is not made for (a new structure, a build, an eager call, a whole update, a
 * capture...) it leaves to AutoGraph._run before it changed anything. */
#include "native.h"

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

int add_float(PyObject *obj, Py_ssize_t offset, double delta)
{
    double value = 0.0;
    return get_float(obj, offset, &value) < 0 ? -1 : set_float(obj, offset, value + delta);
}

int add_int(PyObject *obj, Py_ssize_t offset, Py_ssize_t delta)
{
    Py_ssize_t value = PyLong_AsSsize_t(SLOT(obj, offset));
    if (value == -1 && PyErr_Occurred())
        return -1;
    return set_object(obj, offset, PyLong_FromSsize_t(value + delta));
}

/* A number of a module's namespace (read at every call: tests change them), by its interned
 * name (PyDict_GetItemString would make the name anew each time). */
static double setting(PyObject *namespace, PyObject *name, double otherwise)
{
    PyObject *value = PyDict_GetItem(namespace, name);
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
    double smooth = setting(L.policy_dict, S_SMOOTH, 0.25);
    return set_float(obj, offset, known ? old + smooth * (new - old) : new);
}

/* -- the policy's estimates (Policy.eager, .replay, .whole, .patch) ----------------------- */

static double model(PyObject *policy, int field)
{
    PyObject *m = SLOT(policy, L.p_model);
    return m && PyTuple_Check(m) && PyTuple_GET_SIZE(m) > field
               ? PyFloat_AsDouble(PyTuple_GET_ITEM(m, field)) : 0.0;
}

/* the fields of _autograph_policy.Model, in its order */
enum { M_EAGER_CALL, M_EAGER_OP, M_LAUNCH, M_REPLAY_NODE, M_PATCH_NODE, M_WHOLE_NODE };

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
        e->eager = model(policy, M_EAGER_CALL) + model(policy, M_EAGER_OP) * size;
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
    if (strikes >= setting(L.autograph_dict, S_SWITCH_AFTER, 3)) {
        PyObject *done = PyObject_CallMethod(self, "_give_way", "Oddn", entry, cost, e->eager, n);
        Py_XDECREF(done);
        return done ? 0 : -1;
    }
    return 0;
}

/* Serve a complete recording as a graph call of the last structure: 1 served, 0 not (the
 * Python path serves it; nothing was changed), -1 an exception. */
int serve(PyObject *self, PyObject *rec)
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


/* -- a call run eagerly -------------------------------------------------------------------- */

/* Driver.enqueue(keys, values, start): the recorded launches from ``start`` on, enqueued from
 * their packed bytes, up to the first operation that is not a launch with a compiled path
 * (or one whose launch the Python path must make: see launch_packed); that index. */
PyObject *Driver_enqueue(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i = nargs == 3 ? PyLong_AsSsize_t(args[2]) : -1;
    if (i < 0 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])
            || PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "enqueue(keys, values, start): two lists of one "
                                             "length and an index");
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    for (; i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *fast = Py_IS_TYPE(key, L.Launcher) ? SLOT(key, L.fast) : NULL;
        if (fast == NULL || !Py_IS_TYPE(fast, &LaunchType))
            break;
        Py_INCREF(fast); /* held while it runs, as in run_launcher */
        int done = launch_packed(fast, PyList_GET_ITEM(values, i));
        Py_DECREF(fast);
        if (done < 0)
            return NULL;
        if (!done)
            break;
    }
    return PyLong_FromSsize_t(i);
}
