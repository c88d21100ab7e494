/* Native nesting of intervals: host_ops.nest's stack walk (the CPU self times' parents), without a
 * Python object per op.
 *
 * nest(starts, ends, own, parent, flag): starts and ends are arrays of doubles, the intervals in
 * walk order (by start, the longer first among equal starts); own one byte per interval. Fills
 * the caller's writable arrays parent (int64) and flag (one byte each):
 *   1. walk the intervals in order with a stack of open ones: pop while the top ended by this
 *      one's start (end <= start; a NaN end is never popped, as in Python);
 *   2. parent[i] = the top of the stack then, -1 when it is empty; push i;
 *   3. flag[i] = own[i], or flag[parent[i]] when there is a parent (flags inherit down a nest).
 * The same results as the Python walk, bit for bit (tests/test_runup.py compares the two).
 * The arrays may be any contiguous buffers, aligned or not (a memoryview slice): doubles and
 * int64s are read and written through memcpy, never through a misaligned pointer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline double double_at(const unsigned char *a, Py_ssize_t i) {
    double v;
    memcpy(&v, a + i * (Py_ssize_t)sizeof v, sizeof v);
    return v;
}

PyObject *nest(PyObject *self, PyObject *a) {
    (void)self;
    Py_buffer starts = {0}, ends = {0}, own = {0}, parent = {0}, flag = {0};
    PyObject *result = NULL;
    int64_t *stack = NULL;
    if (!PyArg_ParseTuple(a, "y*y*y*w*w*", &starts, &ends, &own, &parent, &flag)) return NULL;
    Py_ssize_t n = starts.len / (Py_ssize_t)sizeof(double);
    if (starts.len % (Py_ssize_t)sizeof(double) || ends.len != starts.len || own.len != n
        || parent.len != n * (Py_ssize_t)sizeof(int64_t) || flag.len != n) {
        PyErr_SetString(PyExc_ValueError, "nest: starts and ends must be doubles, own and flag bytes, parent int64, "
                                          "all of one length");
        goto done;
    }
    const unsigned char *s = starts.buf, *e = ends.buf, *mine = own.buf;
    unsigned char *up = parent.buf, *fl = flag.buf;
    if (n && !(stack = PyMem_Malloc((size_t)n * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t depth = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double t = double_at(s, i);
        while (depth && double_at(e, stack[depth - 1]) <= t) depth--;
        int64_t top = depth ? stack[depth - 1] : -1;
        memcpy(up + i * (Py_ssize_t)sizeof top, &top, sizeof top);
        fl[i] = (unsigned char)((depth && fl[top]) || mine[i] != 0);
        stack[depth++] = i;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(stack);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&own);
    if (parent.obj) PyBuffer_Release(&parent);
    if (flag.obj) PyBuffer_Release(&flag);
    return result;
}
