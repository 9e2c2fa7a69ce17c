/* cuctx._native (see native.h): what a copy asks of a host array, without building the
 * dict `__array_interface__` is (a few microseconds on every copy): its data address, read
 * from `__array_struct__`, NumPy's C-level array interface. */
#include "native.h"

/* The array interface's C struct, as NumPy documents it ("The array interface protocol");
 * only the fields up to the data pointer are read. */
typedef struct {
    int two; /* 2: the struct is what it claims */
    int nd;
    char typekind;
    int itemsize;
    int flags;
    Py_ssize_t *shape;
    Py_ssize_t *strides;
    void *data;
} array_interface;

PyObject *host_address(PyObject *module, PyObject *array)
{
    PyObject *capsule = PyObject_GetAttr(array, S_array_struct);
    if (capsule == NULL)
        return NULL;
    array_interface *info = NULL;
    if (PyCapsule_CheckExact(capsule))
        info = PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule));
    PyObject *address = NULL;
    if (info != NULL && info->two == 2)
        address = PyLong_FromVoidPtr(info->data);
    else if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "%.100s.__array_struct__ is not NumPy's array interface",
                     Py_TYPE(array)->tp_name);
    Py_DECREF(capsule);
    return address;
}
