/* cuctx._native (see native.h): the announcement of a compiled launch to the trace sinks,
 * made in C. cuctx/_trace.py's emit_launch is the reference: the same Operation, its fields
 * set the same way, handed to the same sinks. In Python it cost a launch 1.5-2 us more than
 * the sinks themselves (the user's frame found by a walk in Python, fifteen attributes set),
 * which the race checker, a sink meant to stay on, paid at every launch.
 *
 * It reads _trace's namespace (emit_launch's globals) at each announcement: `_by_kind` is
 * replaced whenever a sink comes or goes. Before Python 3.11 (no PyFrame_GetLasti) it calls
 * emit_launch itself. */
#include "native.h"

#if PY_VERSION_HEX >= 0x030B0000

enum { O_KIND, O_CONTEXT, O_STREAM, O_KERNEL, O_CONFIG, O_EVENT, O_OTHER, O_WHERE, O_THREAD,
       O_TIME, O_FIELDS, O_LAUNCH, O_ACCESSES, O_ACCESSES_OF, O_SITE, O_COUNT };
static const char *const OP_SLOTS[O_COUNT + 1] = {
    "kind", "context", "stream", "kernel", "config", "event", "other", "where", "thread",
    "time_ns", "fields", "launch", "_accesses", "_accesses_of", "_site", NULL};
static PyTypeObject *op_type_seen;
static Py_ssize_t op_slots[O_COUNT];
/* (S_launch, "launch", and S_stream, "stream", are native.c's) */
static PyObject *S_ctx, *S_kernel, *S_config, *S_modes, *S_accesses, *S_by_kind, *S_ours,
    *S_is_ours, *S_unset, *S_no_fields, *S_operation, *S_perf_counter_ns;

static int learn_names(void)
{
    if (S_perf_counter_ns != NULL) /* (made last) */
        return 0;
    struct { PyObject **name; const char *text; } names[] = {
        {&S_ctx, "_ctx"}, {&S_kernel, "kernel"},
        {&S_config, "config"}, {&S_modes, "_modes"}, {&S_accesses, "accesses"},
        {&S_by_kind, "_by_kind"}, {&S_ours, "_ours"}, {&S_is_ours, "_is_ours"},
        {&S_unset, "_UNSET"}, {&S_no_fields, "_NO_FIELDS"}, {&S_operation, "Operation"},
        {&S_perf_counter_ns, "perf_counter_ns"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL)
            return -1;
    return 0;
}

/* A name of _trace's namespace (borrowed), or NULL with an exception. */
static PyObject *traced(PyObject *globals, PyObject *name)
{
    PyObject *value = PyDict_GetItemWithError(globals, name);
    if (value == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "cuctx._trace has no %U", name);
    return value;
}

/* `_trace.user_where()` from the frame that called the launcher: (code, offset of its
 * current instruction) of the first frame outside cuctx, or None. A new reference. */
static PyObject *user_where(PyObject *globals)
{
    PyObject *ours = traced(globals, S_ours), *is_ours = traced(globals, S_is_ours);
    if (ours == NULL || is_ours == NULL)
        return NULL;
    PyFrameObject *frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        PyObject *filename = code->co_filename;
        PyObject *known = PyDict_GetItemWithError(ours, filename);
        int mine;
        if (known != NULL) {
            mine = PyObject_IsTrue(known);
        } else if (PyErr_Occurred()) {
            mine = -1;
        } else { /* decided once per file, by the reference */
            PyObject *decided = PyObject_CallOneArg(is_ours, filename);
            mine = decided == NULL ? -1 : PyObject_IsTrue(decided);
            Py_XDECREF(decided);
        }
        if (mine < 0) {
            Py_DECREF(code);
            Py_DECREF(frame);
            return NULL;
        }
        if (!mine) {
            PyObject *where = Py_BuildValue("(Ni)", (PyObject *)code, PyFrame_GetLasti(frame));
            Py_DECREF(frame);
            return where;
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_RETURN_NONE;
}

static int operation_offsets(PyTypeObject *type)
{
    if (type == op_type_seen)
        return 0;
    if (slot_offsets(type, OP_SLOTS, op_slots) < 0)
        return -1;
    op_type_seen = type;
    return 0;
}

/* The Operation emit_launch makes for ``launcher`` (its ``args``, its ``plan``); a new
 * reference, or NULL with an exception. */
static PyObject *launch_operation(PyObject *globals, PyObject *launcher, PyObject *args,
                                  PyObject *plan)
{
    PyObject *type = traced(globals, S_operation);
    if (type == NULL)
        return NULL;
    if (!PyType_Check(type) || operation_offsets((PyTypeObject *)type) < 0)
        return NULL;
    PyObject *unset = traced(globals, S_unset), *no_fields = traced(globals, S_no_fields),
             *clock = traced(globals, S_perf_counter_ns);
    if (unset == NULL || no_fields == NULL || clock == NULL)
        return NULL;
    PyObject *v[O_COUNT] = {NULL};
    PyObject *accesses = NULL, *op = NULL;
    v[O_KIND] = Py_NewRef(S_launch);
    if ((v[O_CONTEXT] = PyObject_GetAttr(launcher, S_ctx)) == NULL
            || (v[O_STREAM] = PyObject_GetAttr(launcher, S_stream)) == NULL
            || (v[O_KERNEL] = PyObject_GetAttr(launcher, S_kernel)) == NULL
            || (v[O_CONFIG] = PyObject_GetAttr(launcher, S_config)) == NULL)
        goto done;
    PyObject *modes = PyObject_CallMethodNoArgs(launcher, S_modes);
    if (modes == NULL || (accesses = PyObject_GetAttr(plan, S_accesses)) == NULL) {
        Py_XDECREF(modes);
        goto done;
    }
    v[O_ACCESSES_OF] = PyTuple_Pack(4, accesses, args, v[O_STREAM], modes);
    v[O_LAUNCH] = PyTuple_Pack(3, plan, args, modes);
    Py_DECREF(modes);
    if (v[O_ACCESSES_OF] == NULL || v[O_LAUNCH] == NULL)
        goto done;
    v[O_ACCESSES] = PyTuple_New(0);
    v[O_EVENT] = Py_NewRef(Py_None);
    v[O_OTHER] = Py_NewRef(Py_None);
    v[O_FIELDS] = Py_NewRef(no_fields);
    v[O_SITE] = Py_NewRef(unset);
    if (v[O_ACCESSES] == NULL || (v[O_WHERE] = user_where(globals)) == NULL
            || (v[O_THREAD] = PyLong_FromUnsignedLong(PyThread_get_thread_ident())) == NULL
            || (v[O_TIME] = PyObject_CallNoArgs(clock)) == NULL)
        goto done;
    op = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    if (op != NULL)
        for (int k = 0; k < O_COUNT; k++) {
            SLOT(op, op_slots[k]) = v[k]; /* (the references move to the operation) */
            v[k] = NULL;
        }
done:
    Py_XDECREF(accesses);
    for (int k = 0; k < O_COUNT; k++)
        Py_XDECREF(v[k]);
    return op;
}

PyObject *announce_compiled_launch(PyObject *launcher, PyObject *args, PyObject *plan)
{
    if (!PyFunction_Check(L.emit_launch) || learn_names() < 0) {
        if (PyErr_Occurred())
            return NULL;
        PyObject *call[] = {launcher, args, plan};
        return PyObject_Vectorcall(L.emit_launch, call, 3, NULL);
    }
    PyObject *globals = PyFunction_GetGlobals(L.emit_launch);
    PyObject *by_kind = traced(globals, S_by_kind);
    if (by_kind == NULL)
        return NULL;
    PyObject *wanted = PyDict_GetItemWithError(by_kind, S_launch);
    if (wanted == NULL && PyErr_Occurred())
        return NULL;
    if (wanted == NULL || !PyTuple_Check(wanted) || PyTuple_GET_SIZE(wanted) == 0)
        Py_RETURN_NONE; /* no sink hears launches */
    Py_INCREF(wanted); /* (a sink may register another: the tuple is replaced, not changed) */
    PyObject *op = launch_operation(globals, launcher, args, plan);
    for (Py_ssize_t i = 0; op != NULL && i < PyTuple_GET_SIZE(wanted); i++) {
        PyObject *result = PyObject_CallOneArg(PyTuple_GET_ITEM(wanted, i), op);
        if (result == NULL)
            Py_CLEAR(op);
        Py_XDECREF(result);
    }
    Py_DECREF(wanted);
    if (op == NULL)
        return NULL;
    Py_DECREF(op);
    Py_RETURN_NONE;
}

#else /* Python 3.10: the reference announces */

PyObject *announce_compiled_launch(PyObject *launcher, PyObject *args, PyObject *plan)
{
    PyObject *call[] = {launcher, args, plan};
    return PyObject_Vectorcall(L.emit_launch, call, 3, NULL);
}

#endif
