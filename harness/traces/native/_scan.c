/* Native tabling of trace events: the collector's decode without one Python object per event.
 *
 * scan(buf, start, end, names, threads, args_base) reads buf[start:end], the comma-separated
 * events of one streamed block of a trace's traceEvents array (see decode.stream_events), and
 * returns what decode._Tables.add would have added for them, or None when anything in the block
 * is outside the narrow shape it reads (a name with an escape, a string timestamp, a pid that is
 * not an integer, malformed JSON, nesting deeper than MAX_DEPTH): the caller then decodes the
 * block with msgspec and the Python loop, so this module only ever accelerates, and is at least
 * as strict as msgspec about JSON (it also rejects invalid UTF-8 anywhere).
 *
 * Rules, identical to _Tables.add (tests/test_native_scan.py compares the two on every trace in
 * tests/data/traces and on generated events):
 *   1. only objects; `ph` "M" anywhere sets the block's metadata flag; only `ph` "X" is kept;
 *   2. a kept event has numeric `ts` and `dur` (missing: skipped) and dur >= 0; it counts, and
 *      widens the block's time extent;
 *   3. its category picks a column group (configure(): cpu ops, launches, kernels, copies);
 *      it is also a mark when its category is the annotation one or its name starts with the
 *      step prefix; events that are neither count and are dropped;
 *   4. names (group events) and (pid, tid) keys (group events and marks) are numbered in the
 *      `names` and `threads` dicts in order of first appearance, as the Python loop does;
 *   5. args.correlation (an integer, else -1); an event whose args name a collective (kernels:
 *      any of the four collective fields non-null; cpu ops: the collective name) gets the next
 *      index from args_base, and its byte span is returned for msgspec to decode its Args.
 * Side effects on failure: only names/threads entries added in file order (the Python pass
 * over the same block then assigns the same numbers). ValueError (the caller's error, never the
 * trace's): a range outside buf, or an args_base, names number or threads number outside
 * 0..INT_MAX, the C ints of the columns.
 *
 * Returns (count, first_ts, last_end, meta, columns, marks, arg_spans): columns = 4 groups x
 * (ts d, dur d, name i, thread i, corr q, extra i) as bytes; marks = [(ts, dur, name, cat,
 * thread)]; arg_spans = [(start, end)] offsets in buf.
 */
#include "_json.h"

#define GROUPS 4
#define MAX_CATS 16

static struct {
    char text[MAX_CATS][32];
    Py_ssize_t len[MAX_CATS];
    int group[MAX_CATS];
    int n;
    char mark_cat[32];
    Py_ssize_t mark_cat_len;
    char step_prefix[32];
    Py_ssize_t step_prefix_len;
    int op_group, kernel_group;
} cfg;

typedef struct {
    int has_ph, is_x, is_m;
    const unsigned char *name, *cat;
    Py_ssize_t name_len, cat_len;
    int has_ts, has_dur, has_pid, has_tid;
    double ts, dur;
    long long pid, tid, corr;
    int has_corr, collective, other_comm;  /* collective: "Collective name" non-null; other: the 3 others */
    /* fields this module does not read, by what they matter to (fall back when they do):
       odd_time: ts, dur, name or cat (any X event); odd_thread: pid or tid (group events and
       marks); odd_args: args or its correlation (group events) */
    int odd_time, odd_thread, odd_args;
    /* fall back whatever the event: an escaped ph or top-level key (it may spell "ph"), or a
       value msgspec's typed decode rejects (ts or dur neither number, string nor null; a
       number out of range; args neither object nor null): the block then takes another path */
    int unsure;
} Ev;

/* The event's args object (or null; anything else is unsure). */
static int args(Cur *c, Ev *ev) {
    const unsigned char *k, *s;
    Py_ssize_t kn;
    int escaped, integer;
    ev->has_corr = ev->collective = ev->other_comm = 0;
    if (literal(c, "null")) return 1;
    if (c->p >= c->end || *c->p != '{') {
        ev->unsure = 1;
        return skip(c, 1);
    }
    int more = open_container(c, '}');
    while (more > 0) {
        if (!member_key(c, &k, &kn, &escaped)) return 0;
        ev->odd_args |= escaped;
        int null = *c->p == 'n';
        if (key_is(k, kn, "correlation")) {
            ev->has_corr = 0;
            if (null) {
                if (!literal(c, "null")) return 0;
            } else if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9')) {
                if (!number(c, &s, &integer)) return 0;
                if (integer && to_int(s, c->p - s, &ev->corr)) ev->has_corr = 1;
                else ev->odd_args = 1;
            } else {
                ev->odd_args = 1;
                if (!skip(c, 2)) return 0;
            }
        } else {
            int coll = key_is(k, kn, "Collective name");
            int other = key_is(k, kn, "Process Group Name") || key_is(k, kn, "In msg nelems") || key_is(k, kn, "dtype");
            if (coll) ev->collective = !null;
            if (other) ev->other_comm = !null;
            if (!skip(c, 2)) return 0;
        }
        more = next_item(c, '}');
    }
    return more == 0;
}

/* One event object at c->p into ev. */
static int event(Cur *c, Ev *ev) {
    const unsigned char *k, *s;
    Py_ssize_t kn, n;
    int escaped, integer;
    memset(ev, 0, sizeof(*ev));
    ev->name = ev->cat = (const unsigned char *)"";
    if (c->p >= c->end || *c->p != '{') return 0;
    int more = open_container(c, '}');
    while (more > 0) {
        if (!member_key(c, &k, &kn, &escaped)) return 0;
        if (escaped) {  /* an escaped key might spell a field's name */
            ev->unsure = 1;
            kn = 0;
        }
        int is_ts = key_is(k, kn, "ts"), is_dur = key_is(k, kn, "dur");
        int is_pid = key_is(k, kn, "pid"), is_tid = key_is(k, kn, "tid");
        int is_name = key_is(k, kn, "name"), is_cat = key_is(k, kn, "cat");
        if (key_is(k, kn, "ph")) {
            ev->has_ph = ev->is_x = ev->is_m = 0;  /* a non-string ph is neither X nor M */
            if (*c->p == '"') {
                if (!string(c, &s, &n, &escaped)) return 0;
                ev->unsure |= escaped;
                ev->has_ph = 1;
                ev->is_x = n == 1 && *s == 'X';
                ev->is_m = n == 1 && *s == 'M';
            } else if (!skip(c, 1)) {
                return 0;
            }
        } else if ((is_name || is_cat) && *c->p == '"') {
            if (!string(c, &s, &n, &escaped)) return 0;
            ev->odd_time |= escaped;
            if (is_name) { ev->name = s; ev->name_len = n; }
            else { ev->cat = s; ev->cat_len = n; }
        } else if ((is_ts || is_dur) && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
            double v = 0;
            if (!number(c, &s, &integer)) return 0;
            if (!to_double(s, c->p - s, &v)) ev->unsure = 1;
            if (is_ts) { ev->ts = v; ev->has_ts = 1; }
            else { ev->dur = v; ev->has_dur = 1; }
        } else if ((is_pid || is_tid) && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
            long long v = 0;
            if (!number(c, &s, &integer)) return 0;
            if (!integer || !to_int(s, c->p - s, &v)) ev->odd_thread = 1;
            if (is_pid) { ev->pid = v; ev->has_pid = 1; }
            else { ev->tid = v; ev->has_tid = 1; }
        } else if (is_ts || is_dur || is_pid || is_tid || is_name || is_cat) {
            /* a string time, a null name, a string pid...: the Python loop's affair */
            if (is_pid || is_tid) ev->odd_thread = 1;
            else ev->odd_time = 1;
            if ((is_ts || is_dur) && *c->p != '"' && *c->p != 'n') ev->unsure = 1;
            if (!skip(c, 1)) return 0;
        } else if (key_is(k, kn, "args")) {
            if (!args(c, ev)) return 0;
        } else if (!skip(c, 1)) {
            return 0;
        }
        more = next_item(c, '}');
    }
    return more == 0;
}

static int group_of(const Ev *ev) {
    for (int i = 0; i < cfg.n; i++)
        if (ev->cat_len == cfg.len[i] && !memcmp(ev->cat, cfg.text[i], ev->cat_len)) return cfg.group[i];
    return -1;
}

static int is_mark(const Ev *ev) {
    if (ev->cat_len == cfg.mark_cat_len && !memcmp(ev->cat, cfg.mark_cat, ev->cat_len)) return 1;
    return ev->name_len >= cfg.step_prefix_len && !memcmp(ev->name, cfg.step_prefix, cfg.step_prefix_len);
}

/* The number of `key` in `table` (a dict numbering keys by first appearance), added if new;
 * steals nothing. -1 on error, with an exception set: also for a number outside 0..INT_MAX
 * (the columns hold C ints), which only a caller's own dict can hold. */
static long number_of(PyObject *table, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(table, key);
    Py_ssize_t n;
    if (v) {
        n = PyLong_AsSsize_t(v);
        if (n == -1 && PyErr_Occurred()) return -1;
    } else if (PyErr_Occurred()) {
        return -1;
    } else {
        n = PyDict_GET_SIZE(table);
    }
    if (n < 0 || n > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "scan: names and threads must number their keys 0..INT_MAX");
        return -1;
    }
    if (v) return (long)n;
    PyObject *num = PyLong_FromSsize_t(n);
    if (!num) return -1;
    int rc = PyDict_SetItem(table, key, num);
    Py_DECREF(num);
    return rc < 0 ? -1 : (long)n;
}

typedef struct {
    Buf col[GROUPS][6];
} Columns;

static void columns_free(Columns *cols) {
    for (int g = 0; g < GROUPS; g++)
        for (int k = 0; k < 6; k++) PyMem_Free(cols->col[g][k].data);
}

static PyObject *scan(PyObject *self, PyObject *args_in) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end, args_base;
    PyObject *names, *threads;
    if (!PyArg_ParseTuple(args_in, "y*nnO!O!n", &view, &start, &end, &PyDict_Type, &names, &PyDict_Type, &threads,
                          &args_base))
        return NULL;
    if (cfg.op_group < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "scan: call configure() first");
        return NULL;
    }
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: range outside the buffer");
        return NULL;
    }
    if (args_base < 0 || args_base > INT_MAX) { /* the extra column holds C ints */
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: args_base outside 0..INT_MAX");
        return NULL;
    }
    const unsigned char *base = view.buf;
    Cur c = {base + start, base + end};
    Columns cols;
    memset(&cols, 0, sizeof(cols));
    PyObject *marks = PyList_New(0), *spans = PyList_New(0), *result = NULL;
    PyObject *last_key = NULL;
    long last_thread = -1;
    long long last_pid = 0, last_tid = 0;
    long long count = 0;
    double first = INFINITY, last = -INFINITY;
    int meta = 0, ok = 0;
    Py_ssize_t extra_next = args_base;
    if (!marks || !spans) goto done;
    ws(&c);
    while (c.p < c.end) {
        const unsigned char *at = c.p;
        Ev ev;
        if (!event(&c, &ev)) goto fallback;
        const unsigned char *after = c.p;
        if (!next_element(&c)) goto fallback;
        if (ev.unsure || (ev.odd_time && ev.is_x)) goto fallback;  /* a field that may matter, not read here */
        if (ev.is_m) meta = 1;
        if (!ev.is_x || !ev.has_ts || !ev.has_dur || ev.dur < 0) continue;
        count++;
        if (ev.ts < first) first = ev.ts;
        if (ev.ts + ev.dur > last) last = ev.ts + ev.dur;
        int g = group_of(&ev), mark = is_mark(&ev);
        if (g < 0 && !mark) continue;
        if (!ev.has_pid || !ev.has_tid || ev.odd_thread || (g >= 0 && ev.odd_args)) goto fallback;
        if (!last_key || ev.pid != last_pid || ev.tid != last_tid) {
            PyObject *key = Py_BuildValue("(LL)", ev.pid, ev.tid);
            if (!key) goto done;
            last_thread = number_of(threads, key);
            Py_XDECREF(last_key);
            last_key = key;
            last_pid = ev.pid;
            last_tid = ev.tid;
            if (last_thread < 0) goto done;
        }
        PyObject *name = PyUnicode_DecodeUTF8((const char *)ev.name, ev.name_len, NULL);
        if (!name) goto done;
        if (mark) {
            PyObject *cat = PyUnicode_DecodeUTF8((const char *)ev.cat, ev.cat_len, NULL);
            PyObject *m = cat ? Py_BuildValue("(ddOOl)", ev.ts, ev.dur, name, cat, last_thread) : NULL;
            Py_XDECREF(cat);
            if (!m || PyList_Append(marks, m) < 0) {
                Py_XDECREF(m);
                Py_DECREF(name);
                goto done;
            }
            Py_DECREF(m);
        }
        if (g >= 0) {
            long n = number_of(names, name);
            if (n < 0) {
                Py_DECREF(name);
                goto done;
            }
            int name_i = (int)n, thread_i = (int)last_thread, extra = -1;
            long long corr = ev.has_corr ? ev.corr : -1;
            if ((g == cfg.kernel_group && (ev.collective || ev.other_comm)) || (g == cfg.op_group && ev.collective)) {
                if (extra_next > INT_MAX) {
                    PyErr_SetString(PyExc_ValueError, "scan: args numbered beyond INT_MAX");
                    Py_DECREF(name);
                    goto done;
                }
                PyObject *span = Py_BuildValue("(nn)", (Py_ssize_t)(at - base), (Py_ssize_t)(after - base));
                if (!span || PyList_Append(spans, span) < 0) {
                    Py_XDECREF(span);
                    Py_DECREF(name);
                    goto done;
                }
                Py_DECREF(span);
                extra = (int)extra_next++;
            }
            Buf *col = cols.col[g];
            if (buf_put(&col[0], &ev.ts, 8) || buf_put(&col[1], &ev.dur, 8) || buf_put(&col[2], &name_i, sizeof(int))
                || buf_put(&col[3], &thread_i, sizeof(int)) || buf_put(&col[4], &corr, 8)
                || buf_put(&col[5], &extra, sizeof(int))) {
                Py_DECREF(name);
                goto done;
            }
        }
        Py_DECREF(name);
    }
    ok = 1;
fallback:
    if (!ok) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    PyObject *groups = PyTuple_New(GROUPS);
    if (!groups) goto done;
    for (int g = 0; g < GROUPS; g++) {
        PyObject *t = PyTuple_New(6);
        if (!t) {
            Py_DECREF(groups);
            goto done;
        }
        PyTuple_SET_ITEM(groups, g, t);
        for (int k = 0; k < 6; k++) {
            PyObject *b = PyBytes_FromStringAndSize(cols.col[g][k].data ? cols.col[g][k].data : "", cols.col[g][k].len);
            if (!b) {
                Py_DECREF(groups);
                goto done;
            }
            PyTuple_SET_ITEM(t, k, b);
        }
    }
    result = Py_BuildValue("(LddNNOO)", count, first, last, PyBool_FromLong(meta), groups, marks, spans);
done:
    Py_XDECREF(last_key);
    Py_XDECREF(marks);
    Py_XDECREF(spans);
    columns_free(&cols);
    PyBuffer_Release(&view);
    return result;
}

static int copy_text(char *dst, PyObject *src, Py_ssize_t *len) {
    char *s;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(src, &s, &n) < 0) return -1;
    if (n >= 32) {
        PyErr_SetString(PyExc_ValueError, "configure: a category of 32 bytes or more");
        return -1;
    }
    memcpy(dst, s, n);
    *len = n;
    return 0;
}

/* configure(((cat bytes, group), ...), op_group, kernel_group, mark_cat bytes, step_prefix bytes) */
static PyObject *configure(PyObject *self, PyObject *a) {
    (void)self;
    PyObject *cats, *mark_cat, *prefix;
    int op_group, kernel_group;
    if (!PyArg_ParseTuple(a, "O!iiSS", &PyTuple_Type, &cats, &op_group, &kernel_group, &mark_cat, &prefix)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(cats);
    if (n > MAX_CATS) {
        PyErr_SetString(PyExc_ValueError, "configure: too many categories");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text;
        int group;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(cats, i), "Si", &text, &group)) return NULL;
        if (group < 0 || group >= GROUPS) {
            PyErr_SetString(PyExc_ValueError, "configure: group out of range");
            return NULL;
        }
        if (copy_text(cfg.text[i], text, &cfg.len[i]) < 0) return NULL;
        cfg.group[i] = group;
    }
    if (copy_text(cfg.mark_cat, mark_cat, &cfg.mark_cat_len) < 0 ||
        copy_text(cfg.step_prefix, prefix, &cfg.step_prefix_len) < 0)
        return NULL;
    cfg.n = (int)n;
    cfg.op_group = op_group;
    cfg.kernel_group = kernel_group;
    Py_RETURN_NONE;
}

PyObject *rewrite(PyObject *self, PyObject *args); /* _rewrite.c */
PyObject *nest(PyObject *self, PyObject *args); /* _nest.c */

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Table one block of trace events (see the module comment); None: fall back."},
    {"configure", configure, METH_VARARGS, "Set the category groups, the annotation category and the step prefix."},
    {"rewrite", rewrite, METH_VARARGS, "Rewrite one block of events for the merged trace (see _rewrite.c); None: fall back."},
    {"nest", nest, METH_VARARGS, "Each interval's parent in a stack walk, and inherited flags (see _nest.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scan", "Native tabling of trace events, their rewriting for the merged trace, and interval nesting.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scan(void) {
    cfg.n = 0;
    cfg.op_group = cfg.kernel_group = -1;
    return PyModule_Create(&module);
}
