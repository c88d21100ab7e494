/* Native rewriting of trace events for the merged trace: merged.write_rank's per-event loop
 * without decoding events into objects.
 *
 * rewrite(buf, start, end, rank, shift_us, starts, ends, tids, new_thread) reads buf[start:end],
 * the comma-separated events of one block of a rank's trace (model.Block), and returns
 * (json, kept): the events the merged trace keeps, rewritten, as b",\n" + events joined by ","
 * (b"" when none), and how many were written; or None when anything in the block is outside
 * the shape it reads (an escaped key, an escaped ph or pid, a pid that is neither an integer
 * nor a string, a flow id that is neither, malformed JSON, a time that is not an exact double):
 * the caller then decodes the block and runs the Python loop, so the output is the same either
 * way (tests/test_native_merged.py compares the two).
 *
 * Rules, identical to merged._Mover.events:
 *   1. only objects whose ph is one of COPIED ("X i I C s t f b e n"); fields other than the
 *      13 of merged._Copy are dropped, those kept are written in that order, as raw bytes
 *      except pid, tid, ts and flow ids;
 *   2. with spans (`starts`, `ends`: disjoint [lo, hi) intervals by start, arrays of doubles on
 *      the trace's own clock; None: keep all): an event without a numeric ts is dropped; one
 *      whose ts is in no span is kept only if it is an X slice reaching into the next span;
 *   3. pid becomes `rank`; tid the number `tids` holds for the original (pid, tid) key (an int
 *      or str each, as msgspec decodes them); for a key not yet there new_thread(key) is
 *      called, which adds it to `tids` and returns the thread-name event to write first;
 *   4. a numeric ts becomes ts + shift_us (the aligned clock), written as Python's repr;
 *   5. a flow event's (ph s t f b e n) id becomes the string "r<rank>-<id>".
 */
#include "_json.h"

enum { F_PH, F_CAT, F_NAME, F_PID, F_TID, F_TS, F_DUR, F_TTS, F_ID, F_BP, F_S, F_CNAME, F_ARGS, FIELDS };
static const char *const FIELD_NAME[FIELDS] = {"ph", "cat", "name", "pid", "tid", "ts", "dur",
                                               "tts", "id", "bp", "s", "cname", "args"};
static const char *const FIELD_HEAD[FIELDS] = {",\"ph\":", ",\"cat\":", ",\"name\":", ",\"pid\":", ",\"tid\":",
                                               ",\"ts\":", ",\"dur\":", ",\"tts\":", ",\"id\":", ",\"bp\":",
                                               ",\"s\":", ",\"cname\":", ",\"args\":"};
static const char COPIED[] = "XiICstfben";
static const char FLOWS[] = "stfben";
#define EXACT_INT 9007199254740992LL /* 2^53: the integers up to it are exact doubles */

typedef struct {
    const unsigned char *v[FIELDS]; /* each field's raw value, NULL when absent */
    Py_ssize_t n[FIELDS];
} Fields;

/* Which of the 13 fields a key names (-1: none), by its length and first byte. */
static int field_of(const unsigned char *k, Py_ssize_t n) {
    int i;
    switch (n) {
    case 1: i = F_S; break;
    case 2: i = *k == 'p' ? F_PH : *k == 't' ? F_TS : *k == 'i' ? F_ID : F_BP; break;
    case 3: i = *k == 'c' ? F_CAT : *k == 'p' ? F_PID : *k == 'd' ? F_DUR : k[1] == 'i' ? F_TID : F_TTS; break;
    case 4: i = *k == 'n' ? F_NAME : F_ARGS; break;
    case 5: i = F_CNAME; break;
    default: return -1;
    }
    return memcmp(k, FIELD_NAME[i], n) ? -1 : i;
}

/* One event object at c->p into f. 0: malformed, or a key this module cannot vouch for. */
static int fields(Cur *c, Fields *f) {
    const unsigned char *k;
    Py_ssize_t kn;
    int escaped;
    memset(f, 0, sizeof(*f));
    if (c->p >= c->end || *c->p != '{') return 0;
    int more = open_container(c, '}');
    while (more > 0) {
        if (!member_key(c, &k, &kn, &escaped) || escaped) return 0; /* an escaped key may spell a field */
        int which = field_of(k, kn);
        const unsigned char *v = c->p;
        if (!skip(c, 1)) return 0;
        if (which >= 0) {
            if (f->v[which]) return 0; /* a repeated field: which one msgspec keeps is its affair */
            f->v[which] = v;
            f->n[which] = c->p - v;
        }
        more = next_item(c, '}');
    }
    return more == 0;
}

/* The contents of a string value without escapes; 0 when it is not one. */
static int plain_string(const unsigned char *v, Py_ssize_t n, const unsigned char **s, Py_ssize_t *sn) {
    Cur c = {v, v + n};
    int escaped;
    if (n < 2 || *v != '"' || !string(&c, s, sn, &escaped)) return 0;
    return !escaped && c.p == v + n;
}

static int is_number(const unsigned char *v) {
    return *v == '-' || (*v >= '0' && *v <= '9');
}

/* Whether a (validated) value is a number, and whether it is an integer literal. */
static int numeric(const unsigned char *v, Py_ssize_t n, int *integer) {
    Cur c = {v, v + n};
    const unsigned char *s;
    return is_number(v) && number(&c, &s, integer);
}

/* An integer literal of at most 18 digits, as msgspec decodes it (an int). */
static int int_literal(const unsigned char *v, Py_ssize_t n, long long *out) {
    int integer;
    return numeric(v, n, &integer) && integer && to_int(v, n, out);
}

/* A numeric value as the double Python's arithmetic on it gives; 0 when that is not exact: an
 * integer beyond 2^53 (Python compares and adds such ints exactly, a double cannot), or of
 * more than 18 digits. */
static int exact_double(const unsigned char *v, Py_ssize_t n, double *out) {
    long long i;
    int integer;
    if (!numeric(v, n, &integer)) return 0;
    if (!integer) return to_double(v, n, out);
    if (!to_int(v, n, &i) || i > EXACT_INT || i < -EXACT_INT) return 0;
    *out = (double)i;
    return 1;
}

/* pid or tid as the Python object msgspec decodes: an int or a str; NULL (no error set) when
 * it is neither, or an escaped string. */
static PyObject *key_part(const unsigned char *v, Py_ssize_t n) {
    const unsigned char *s;
    Py_ssize_t sn;
    long long i;
    if (int_literal(v, n, &i)) return PyLong_FromLongLong(i);
    if (plain_string(v, n, &s, &sn)) return PyUnicode_DecodeUTF8((const char *)s, sn, NULL);
    return NULL;
}

static int put_str(Buf *b, const char *s) {
    return buf_put(b, s, (Py_ssize_t)strlen(s));
}

/* An integer in decimal (snprintf is a third of the rewrite's time when used per event). */
static int put_int(Buf *b, long long v) {
    char text[24], *p = text + sizeof text;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    return buf_put(b, p, text + sizeof text - p);
}

/* `,"name":` then the raw value. */
static int put_field(Buf *b, int i, const unsigned char *v, Py_ssize_t n) {
    return put_str(b, FIELD_HEAD[i]) || buf_put(b, v, n);
}

/* A double as JSON that reads back as the same double: the exact decimal when it has at most
 * three binary fraction digits (what epoch-microsecond times above 2^50 always are: their
 * spacing is 0.25 or more), else Python's repr (slower: a big-number shortest search). */
static int put_double(Buf *b, double x) {
    if (fabs(x) < 9e18) {
        double whole = trunc(x), frac = fabs(x - whole); /* both exact */
        if (frac * 8 == floor(frac * 8)) {                /* frac = j/8: frac * 1000 = 125 j, exact */
            int thousandths = (int)(frac * 1000);
            char digits[5] = {'.', (char)('0' + thousandths / 100), (char)('0' + thousandths / 10 % 10),
                              (char)('0' + thousandths % 10), 0};
            int n = 4;
            while (n > 2 && digits[n - 1] == '0') n--;
            return (x < 0 && whole == 0 && put_str(b, "-")) || put_int(b, (long long)whole) || buf_put(b, digits, n);
        }
    }
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!text) return -1;
    int rc = put_str(b, text);
    PyMem_Free(text);
    return rc;
}

/* Item i of an array of doubles in a buffer that may not be aligned (a memoryview slice). */
static inline double double_at(const unsigned char *a, Py_ssize_t i) {
    double v;
    memcpy(&v, a + i * (Py_ssize_t)sizeof v, sizeof v);
    return v;
}

/* The last span starting at or before t (bisect_right - 1); -1 when none does. */
static Py_ssize_t span_at(const unsigned char *starts, Py_ssize_t n, double t) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (t < double_at(starts, mid)) hi = mid;
        else lo = mid + 1;
    }
    return lo - 1;
}

typedef struct {
    long rank;
    double shift;
    const unsigned char *starts, *ends; /* arrays of doubles, read by double_at */
    Py_ssize_t spans; /* -1: no window, keep everything */
    PyObject *tids, *new_thread;
    PyObject *added; /* the keys new_thread added during this call: taken out again on a decline */
    /* the last (pid, tid) raw texts and their number: consecutive events mostly share them */
    const unsigned char *last_pid, *last_tid;
    Py_ssize_t last_pid_n, last_tid_n;
    long long last_number;
} Job;

enum { KEEP = 1, DROP = 0, DECLINE = -1, FAIL = -2 }; /* FAIL: a Python error is set */

/* Whether the event is kept by the window (rule 2); *ts_ok: ts is a number (in *ts). */
static int in_window(const Job *job, const Fields *f, int is_x, double *ts, int *ts_ok) {
    *ts_ok = 0;
    if (f->v[F_TS] && is_number(f->v[F_TS])) {
        if (!exact_double(f->v[F_TS], f->n[F_TS], ts)) return DECLINE;
        *ts_ok = 1;
    }
    if (job->spans < 0) return KEEP;
    if (!*ts_ok) return DROP;
    Py_ssize_t i = span_at(job->starts, job->spans, *ts);
    if (i >= 0 && *ts < double_at(job->ends, i)) return KEEP;
    double end = *ts, dur;
    if (is_x && f->v[F_DUR] && is_number(f->v[F_DUR])) {
        if (!exact_double(f->v[F_DUR], f->n[F_DUR], &dur)) return DECLINE;
        end = *ts + dur;
    }
    return i + 1 < job->spans && end > double_at(job->starts, i + 1) ? KEEP : DROP;
}

/* The merged tid of the event's (pid, tid); a new thread's name event goes to out first. */
static int thread_number(Job *job, const Fields *f, Buf *out, int *first, long long *number, long long *kept) {
    const unsigned char *p = f->v[F_PID], *t = f->v[F_TID];
    if (!p || !t) return DECLINE;
    if (job->last_pid && f->n[F_PID] == job->last_pid_n && f->n[F_TID] == job->last_tid_n &&
        !memcmp(p, job->last_pid, job->last_pid_n) && !memcmp(t, job->last_tid, job->last_tid_n)) {
        *number = job->last_number;
        return KEEP;
    }
    PyObject *pid = key_part(p, f->n[F_PID]), *tid = pid ? key_part(t, f->n[F_TID]) : NULL;
    if (!pid || !tid) {
        Py_XDECREF(pid);
        return PyErr_Occurred() ? FAIL : DECLINE;
    }
    PyObject *key = PyTuple_Pack(2, pid, tid);
    Py_DECREF(pid);
    Py_DECREF(tid);
    if (!key) return FAIL;
    PyObject *got = PyDict_GetItemWithError(job->tids, key);
    if (!got && !PyErr_Occurred()) {
        PyObject *meta = PyObject_CallOneArg(job->new_thread, key);
        if (!meta || PyList_Append(job->added, key) < 0) {
            Py_XDECREF(meta);
            goto fail;
        }
        char *s;
        Py_ssize_t n;
        int bad = PyBytes_AsStringAndSize(meta, &s, &n) < 0 || put_str(out, *first ? ",\n" : ",") || buf_put(out, s, n);
        Py_DECREF(meta);
        if (bad) goto fail;
        *first = 0;
        (*kept)++;
        got = PyDict_GetItemWithError(job->tids, key);
        if (!got && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "rewrite: new_thread did not add the key");
    }
    if (!got) goto fail;
    *number = PyLong_AsLongLong(got);
    if (*number == -1 && PyErr_Occurred()) goto fail;
    Py_DECREF(key);
    job->last_pid = p;
    job->last_tid = t;
    job->last_pid_n = f->n[F_PID];
    job->last_tid_n = f->n[F_TID];
    job->last_number = *number;
    return KEEP;
fail:
    Py_DECREF(key);
    return FAIL;
}

/* One event: rules 1-5, written to out when kept. */
static int one_event(Job *job, const Fields *f, Buf *out, int *first, long long *kept) {
    const unsigned char *ph, *id = NULL;
    Py_ssize_t ph_n, id_n = 0;
    if (!f->v[F_PH] || *f->v[F_PH] != '"') return DROP; /* no ph, or not a string: not copied */
    if (!plain_string(f->v[F_PH], f->n[F_PH], &ph, &ph_n)) return DECLINE;
    if (ph_n != 1 || !strchr(COPIED, *ph) || !*ph) return DROP;
    double ts = 0;
    int ts_ok, flow = strchr(FLOWS, *ph) != NULL;
    int rc = in_window(job, f, *ph == 'X', &ts, &ts_ok);
    if (rc != KEEP) return rc;
    if (ts_ok && !isfinite(ts + job->shift)) return DECLINE;
    long long id_number = 0;
    int id_is_int = flow && f->v[F_ID] && int_literal(f->v[F_ID], f->n[F_ID], &id_number);
    if (flow && f->v[F_ID] && !id_is_int && !plain_string(f->v[F_ID], f->n[F_ID], &id, &id_n))
        return DECLINE; /* an id Python would print otherwise (a float, None, True, a list) */
    long long tid;
    if ((rc = thread_number(job, f, out, first, &tid, kept)) != KEEP) return rc;
    if (put_str(out, *first ? ",\n{\"ph\":" : ",{\"ph\":") || buf_put(out, f->v[F_PH], f->n[F_PH])) return FAIL;
    *first = 0;
    for (int i = F_CAT; i <= F_NAME; i++)
        if (f->v[i] && put_field(out, i, f->v[i], f->n[i])) return FAIL;
    if (put_str(out, ",\"pid\":") || put_int(out, job->rank) || put_str(out, ",\"tid\":") || put_int(out, tid))
        return FAIL;
    if (ts_ok) {
        if (put_str(out, ",\"ts\":") || put_double(out, ts + job->shift)) return FAIL;
    } else if (f->v[F_TS] && put_field(out, F_TS, f->v[F_TS], f->n[F_TS])) {
        return FAIL;
    }
    for (int i = F_DUR; i <= F_ARGS; i++) {
        if (!f->v[i]) continue;
        if (i == F_ID && flow) {
            if (put_str(out, ",\"id\":\"r") || put_int(out, job->rank) || put_str(out, "-")
                || (id_is_int ? put_int(out, id_number) : buf_put(out, id, id_n)) || put_str(out, "\"")) /* -0 is 0 */
                return FAIL;
        } else if (put_field(out, i, f->v[i], f->n[i])) {
            return FAIL;
        }
    }
    if (put_str(out, "}")) return FAIL;
    (*kept)++;
    return KEEP;
}

PyObject *rewrite(PyObject *self, PyObject *a) {
    (void)self;
    Py_buffer view, starts = {0}, ends = {0};
    Py_ssize_t start, end;
    PyObject *starts_obj, *ends_obj;
    Job job;
    memset(&job, 0, sizeof job);
    if (!PyArg_ParseTuple(a, "y*nnldOOO!O", &view, &start, &end, &job.rank, &job.shift, &starts_obj, &ends_obj,
                          &PyDict_Type, &job.tids, &job.new_thread))
        return NULL;
    PyObject *result = NULL;
    Buf out = {0};
    if (start < 0 || end > view.len || start > end) {
        PyErr_SetString(PyExc_ValueError, "rewrite: range outside the buffer");
        goto done;
    }
    job.spans = -1;
    if (starts_obj != Py_None || ends_obj != Py_None) {
        if (PyObject_GetBuffer(starts_obj, &starts, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(ends_obj, &ends, PyBUF_SIMPLE) < 0)
            goto done;
        if (starts.len != ends.len || starts.len % sizeof(double)) {
            PyErr_SetString(PyExc_ValueError, "rewrite: starts and ends must be arrays of doubles of one length");
            goto done;
        }
        job.starts = starts.buf;
        job.ends = ends.buf;
        job.spans = starts.len / (Py_ssize_t)sizeof(double);
    }
    if (!(job.added = PyList_New(0))) goto done;
    Cur c = {(const unsigned char *)view.buf + start, (const unsigned char *)view.buf + end};
    int first = 1;
    long long kept = 0;
    ws(&c);
    while (c.p < c.end) {
        Fields f;
        if (!fields(&c, &f) || !next_element(&c)) goto decline;
        int rc = one_event(&job, &f, &out, &first, &kept);
        if (rc == DECLINE) goto decline;
        if (rc == FAIL) goto done;
    }
    result = Py_BuildValue("(y#L)", out.data ? out.data : "", out.len, kept);
    goto done;
decline:
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(job.added); i++)
        if (PyDict_DelItem(job.tids, PyList_GET_ITEM(job.added, i)) < 0) goto done;
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(job.added);
    PyMem_Free(out.data);
    if (starts.obj) PyBuffer_Release(&starts);
    if (ends.obj) PyBuffer_Release(&ends);
    PyBuffer_Release(&view);
    return result;
}
