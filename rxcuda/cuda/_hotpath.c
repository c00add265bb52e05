/* rxcuda's compiled parameter path: the extension module rxcuda.cuda._hotpath, built with the package (setup.py);
   loaded by rxcuda/cuda/_native.py, which keeps the pure-Python path where it was not built.

   Apply(targets, lo, hi, raise_for): one parameter's hot update. ``targets``: a tuple of
   (kind, address, function, graph_exec, node, params, update, keep) tuples, one per kernel node that reads the
   parameter: ``kind`` the argument's type as a fixed-width NumPy character (f d e b h i q B H I Q ?),
   ``address`` where its value lives in the node's argument storage, ``function`` the address of
   cuGraphExecKernelNodeSetParams (0: call ``update`` instead, a Python callable returning the CUresult as an
   int: the null driver), ``graph_exec``/``node``/``params`` its arguments, ``keep`` what keeps ``address``
   alive (the storage's NumPy view). ``lo``/``hi``: a count parameter's bounds (None: none). ``apply(value)``
   writes ``value`` into every target's argument and updates its exec node, True when it did; False, having
   done nothing, for a value outside [lo, hi]. A non-zero CUresult calls ``raise_for(err)``, which raises.

   The Python classes these types serve hand their own names over: this file knows none of their fields. The C
   side keeps each field in a slot of its own struct; ``param_base(fields, names)`` and ``pending_base(fields,
   names)`` (called once, by rxcuda.blocks._params and rxcuda.engine._runtime) make the types ready with the
   attribute names they are given, in the order each function's comment lists, and return them.

   drain_one(pending, table[, updates]): the scheduler's drain of parameter values alone
   (rxcuda.engine._update), as its _drain_one does it in Python: ``pending`` a PendingBase; under its lock take the
   pending values and reset its count; one value whose hot entry ``table[key]`` = (apply, names) has an ``apply``
   that takes it is applied here. Returns (names, None, events) when it was; (None, params, events) otherwise,
   ``params`` the dict of values for the general path.

   PendingBase (made by pending_base): the pending plan's hot fields in C (its lock, its dict of values, the count
   of changes since the last drain and of those not values, the values ever folded, its observers of parameter
   changes, the type of such a change), a base of the engine's PendingPlan (rxcuda.engine._runtime), and its
   ``set_value(key, value)``: the setter's fold, as PendingPlan.set_value does it in Python (one dict store and a
   count, under the lock where another thread holds it); where someone observes parameter changes it then publishes
   the change (made here where the event type is a tuple subclass, else by the object's publishing method).

   ParamBase (made by param_base): a parameter's fields (name, dtype, value, block, check, min, max, step, plain, lo,
   hi), the base of rxcuda.blocks.Parameter, and its value property's setter, as the Python one does it: a value of
   exactly type ``plain`` within [``lo``, ``hi``] is kept as it is, any other goes through ``check(value)`` (which
   converts it or raises); then, where the block is in an engine (its sink not None), the sink's fold method with
   ((block id, name), value) -- PendingBase's in C.

   SOURCE: the SHA-256 (hex) of this file as setup.py read it when it built the module (RXCUDA_HOTPATH_SOURCE; absent
   from a module built otherwise). rxcuda/cuda/_native.py takes a module only where no _hotpath.c lies beside it (an
   installed wheel) or that file has this digest: a module built in place from an older source is not used.

   Everything runs with the GIL held; no Python object outlives a call except what Apply keeps. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _WIN32
#include <windows.h>
#endif

typedef int (*set_params_fn)(void *, void *, void *);

typedef struct {
    char kind;
    void *address;
    set_params_fn function;
    void *graph_exec, *node, *params;
    PyObject *update; /* used when function is NULL */
} Target;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    Target *targets;
    PyObject *lo, *hi; /* NULL: no bounds */
    PyObject *raise_for;
    PyObject *keep; /* the targets tuple: keeps views and callables alive */
    vectorcallfunc vectorcall;
} ApplyObject;

static PyTypeObject ApplyType;

static int write_value(char kind, void *address, PyObject *value) {
    switch (kind) {
    case 'f': {
        double d = PyFloat_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        float f = (float)d;
        memcpy(address, &f, 4);
        return 0;
    }
    case 'd': {
        double d = PyFloat_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        memcpy(address, &d, 8);
        return 0;
    }
    case 'e': {
        double d = PyFloat_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        return PyFloat_Pack2(d, (char *)address, 1);
    }
    case 'b': case 'h': case 'i': case 'q': {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (kind == 'b') { int8_t x = (int8_t)v; memcpy(address, &x, 1); }
        else if (kind == 'h') { int16_t x = (int16_t)v; memcpy(address, &x, 2); }
        else if (kind == 'i') { int32_t x = (int32_t)v; memcpy(address, &x, 4); }
        else { int64_t x = (int64_t)v; memcpy(address, &x, 8); }
        return 0;
    }
    case 'B': case 'H': case 'I': case 'Q': case '?': {
        unsigned long long v;
        if (kind == '?') {
            int t = PyObject_IsTrue(value);
            if (t < 0) return -1;
            v = (unsigned long long)t;
        } else {
            v = PyLong_AsUnsignedLongLong(value);
            if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        }
        if (kind == 'B' || kind == '?') { uint8_t x = (uint8_t)v; memcpy(address, &x, 1); }
        else if (kind == 'H') { uint16_t x = (uint16_t)v; memcpy(address, &x, 2); }
        else if (kind == 'I') { uint32_t x = (uint32_t)v; memcpy(address, &x, 4); }
        else { uint64_t x = (uint64_t)v; memcpy(address, &x, 8); }
        return 0;
    }
    }
    PyErr_Format(PyExc_TypeError, "rxcuda native path: no argument type '%c'", kind);
    return -1;
}

static int kind_known(char kind) {
    return kind != 0 && strchr("fdebhiqBHIQ?", kind) != NULL;
}

/* apply(value): True when written and updated, False when outside [lo, hi]; NULL with an exception set. */
static PyObject *apply_value(ApplyObject *self, PyObject *value) {
    if (self->lo != NULL) {
        int ok = PyObject_RichCompareBool(self->lo, value, Py_LE);
        if (ok < 0) return NULL;
        if (ok) ok = PyObject_RichCompareBool(value, self->hi, Py_LE);
        if (ok < 0) return NULL;
        if (!ok) Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Target *t = &self->targets[i];
        if (write_value(t->kind, t->address, value) < 0) return NULL;
        long err;
        if (t->function != NULL) {
            err = t->function(t->graph_exec, t->node, t->params);
        } else {
            PyObject *r = PyObject_CallNoArgs(t->update);
            if (r == NULL) return NULL;
            err = PyLong_AsLong(r);
            Py_DECREF(r);
            if (err == -1 && PyErr_Occurred()) return NULL;
        }
        if (err) {
            PyObject *r = PyObject_CallFunction(self->raise_for, "l", err);
            if (r == NULL) return NULL; /* what raise_for is for */
            Py_DECREF(r);
            PyErr_Format(PyExc_RuntimeError, "cuGraphExecKernelNodeSetParams returned %ld", err);
            return NULL;
        }
    }
    Py_RETURN_TRUE;
}

static PyObject *apply_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "apply(value) takes one value");
        return NULL;
    }
    return apply_value((ApplyObject *)self, args[0]);
}

static void *address_of(PyObject *o) {
    void *p = PyLong_AsVoidPtr(o);
    return p;
}

static PyObject *apply_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *targets, *lo, *hi, *raise_for;
    if (!PyArg_ParseTuple(args, "O!OOO:Apply", &PyTuple_Type, &targets, &lo, &hi, &raise_for)) return NULL;
    if (!PyCallable_Check(raise_for)) {
        PyErr_SetString(PyExc_TypeError, "Apply: raise_for must be callable");
        return NULL;
    }
    if ((lo == Py_None) != (hi == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "Apply: lo and hi are both None or both bounds");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(targets);
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "Apply: at least one target");
        return NULL;
    }
    ApplyObject *self = (ApplyObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->targets = PyMem_Calloc((size_t)n, sizeof(Target));
    if (self->targets == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(targets, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 8) {
            PyErr_SetString(PyExc_TypeError, "Apply: each target is (kind, address, function, graph_exec, node, "
                                             "params, update, keep)");
            Py_DECREF(self);
            return NULL;
        }
        PyObject *kind = PyTuple_GET_ITEM(t, 0);
        Py_ssize_t klen = 0;
        const char *k = PyUnicode_Check(kind) ? PyUnicode_AsUTF8AndSize(kind, &klen) : NULL;
        if (k == NULL || klen != 1 || !kind_known(k[0])) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "Apply: no argument type %R", kind);
            Py_DECREF(self);
            return NULL;
        }
        Target *tg = &self->targets[i];
        tg->kind = k[0];
        tg->address = address_of(PyTuple_GET_ITEM(t, 1));
        tg->function = (set_params_fn)address_of(PyTuple_GET_ITEM(t, 2));
        tg->graph_exec = address_of(PyTuple_GET_ITEM(t, 3));
        tg->node = address_of(PyTuple_GET_ITEM(t, 4));
        tg->params = address_of(PyTuple_GET_ITEM(t, 5));
        tg->update = PyTuple_GET_ITEM(t, 6);
        if (PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
        if (tg->address == NULL) {
            PyErr_SetString(PyExc_ValueError, "Apply: a target's address is 0");
            Py_DECREF(self);
            return NULL;
        }
        if (tg->function == NULL && !PyCallable_Check(tg->update)) {
            PyErr_SetString(PyExc_TypeError, "Apply: a target without a function address needs a callable update");
            Py_DECREF(self);
            return NULL;
        }
    }
    Py_INCREF(targets);
    self->keep = targets;
    if (lo != Py_None) {
        Py_INCREF(lo);
        Py_INCREF(hi);
        self->lo = lo;
        self->hi = hi;
    }
    Py_INCREF(raise_for);
    self->raise_for = raise_for;
    self->vectorcall = apply_vectorcall;
    return (PyObject *)self;
}

static int apply_traverse(ApplyObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->keep);
    Py_VISIT(self->lo);
    Py_VISIT(self->hi);
    Py_VISIT(self->raise_for);
    return 0;
}

static int apply_clear(ApplyObject *self) {
    Py_CLEAR(self->keep);
    Py_CLEAR(self->lo);
    Py_CLEAR(self->hi);
    Py_CLEAR(self->raise_for);
    return 0;
}

static void apply_dealloc(ApplyObject *self) {
    PyObject_GC_UnTrack(self);
    apply_clear(self);
    PyMem_Free(self->targets);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ApplyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rxcuda.cuda._hotpath.Apply",
    .tp_basicsize = sizeof(ApplyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "apply(value) -> bool: one parameter's hot update (see the module's docstring)",
    .tp_new = apply_new,
    .tp_dealloc = (destructor)apply_dealloc,
    .tp_traverse = (traverseproc)apply_traverse,
    .tp_clear = (inquiry)apply_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ApplyObject, vectorcall),
};

static PyObject *s_acquire, *s_release, *s_locked;
static PyTypeObject PendingType;
static PyObject *drain_pending(PyObject *pending, PyObject *table);

static PyObject *s_on_next, *s_failed;

/* Hand ``item`` to each of ``observers`` (a tuple) as Broadcast.emit does: an observer's Exception goes to
   ``broadcast.failed(err, item)`` (``broadcast``: ``owner`` itself when ``attr`` is NULL, else its attribute
   ``attr``, looked up only then), which re-raises it where nobody handles it. 0, or -1 with an exception set. */
static int emit(PyObject *observers, PyObject *item, PyObject *owner, PyObject *attr) {
    Py_INCREF(observers); /* (a subscription made by a callback replaces the tuple, not this one) */
    int rc = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(observers) && rc == 0; i++) {
        PyObject *r = PyObject_CallMethodOneArg(PyTuple_GET_ITEM(observers, i), s_on_next, item);
        if (r != NULL) {
            Py_DECREF(r);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            rc = -1;
            break;
        }
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        if (tb != NULL) PyException_SetTraceback(ev, tb);
        PyObject *broadcast = attr == NULL ? Py_NewRef(owner) : PyObject_GetAttr(owner, attr);
        PyObject *done = broadcast != NULL ? PyObject_CallMethodObjArgs(broadcast, s_failed, ev, item, NULL) : NULL;
        Py_XDECREF(broadcast);
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        if (done == NULL) rc = -1;
        Py_XDECREF(done);
    }
    Py_DECREF(observers);
    return rc;
}

static PyObject *apply_one(PyObject *table, PyObject *key, PyObject *value, PyObject *events);

static double now_seconds(void) {
#ifdef _WIN32
    return (double)GetTickCount64() / 1e3;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
#endif
}

static PyObject *drain(PyObject *pending, PyObject *table);

/* Record(type) -> make: make(fields) is type's instance holding the tuple ``fields`` (as tuple.__new__(type, fields)
   makes it, without the Python-level __new__ of a named tuple): rxcuda.engine._records.applied_update, the one maker
   of an AppliedUpdate, which drain_one fills in directly. */
typedef struct {
    PyObject_HEAD
    PyTypeObject *type;
    Py_ssize_t n;
    vectorcallfunc vectorcall;
} RecordObject;

static PyTypeObject RecordType;

static PyObject *record_fill(RecordObject *self, PyObject *const *items) {
    PyObject *r = self->type->tp_alloc(self->type, self->n);
    if (r == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->n; i++) PyTuple_SET_ITEM(r, i, Py_NewRef(items[i]));
    return r;
}

static PyObject *record_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    RecordObject *rec = (RecordObject *)self;
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))
        || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != rec->n) {
        PyErr_Format(PyExc_TypeError, "make(fields): a tuple of %zd fields", rec->n);
        return NULL;
    }
    return record_fill(rec, &PyTuple_GET_ITEM(args[0], 0));
}

static PyObject *record_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *of;
    if (!PyArg_ParseTuple(args, "O!:Record", &PyType_Type, &of)) return NULL;
    PyObject *fields = PyType_IsSubtype((PyTypeObject *)of, &PyTuple_Type) ? PyObject_GetAttrString(of, "_fields")
                                                                          : NULL;
    if (fields == NULL || !PyTuple_Check(fields)) {
        Py_XDECREF(fields);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "Record takes a named tuple type (got %R)", of);
        return NULL;
    }
    RecordObject *self = (RecordObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->type = (PyTypeObject *)Py_NewRef(of);
        self->n = PyTuple_GET_SIZE(fields);
        self->vectorcall = record_vectorcall;
    }
    Py_DECREF(fields);
    return (PyObject *)self;
}

static void record_dealloc(RecordObject *self) {
    Py_XDECREF(self->type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rxcuda.cuda._hotpath.Record",
    .tp_basicsize = sizeof(RecordObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Record(type) -> make: make(fields) is type's instance (see the C file)",
    .tp_new = record_new,
    .tp_dealloc = (destructor)record_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RecordObject, vectorcall),
};

/* drain_one(pending, table[, updates]) -> (names, None, events) | (None, params, events): see the top of this
   file. ``updates``, where someone observes applied updates: (observers, make, frame, tiers, broadcast); a value the
   hot entry applied is then published here as make((frame, tiers, names, seconds, events)) (seconds: this call's
   time; ``make``: rxcuda.engine._records.applied_update, the one maker of an AppliedUpdate), as Broadcast.emit does
   it. */
static PyObject *drain_one(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *updates = nargs == 3 ? args[2] : Py_None;
    if ((nargs != 2 && nargs != 3)
        || (updates != Py_None && (!PyTuple_Check(updates) || PyTuple_GET_SIZE(updates) != 5
                                   || !PyTuple_Check(PyTuple_GET_ITEM(updates, 0))
                                   || !PyCallable_Check(PyTuple_GET_ITEM(updates, 1))))) {
        PyErr_SetString(PyExc_TypeError, "drain_one(pending, table[, (observers, make, frame, tiers, broadcast) "
                                         "or None])");
        return NULL;
    }
    if (updates == Py_None) return drain(args[0], args[1]);
    double t0 = now_seconds();
    PyObject *out = drain(args[0], args[1]);
    if (out == NULL || PyTuple_GET_ITEM(out, 0) == Py_None) return out;
    PyObject *seconds = PyFloat_FromDouble(now_seconds() - t0);
    if (seconds == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *make = PyTuple_GET_ITEM(updates, 1);
    PyObject *items[5] = {PyTuple_GET_ITEM(updates, 2), PyTuple_GET_ITEM(updates, 3), PyTuple_GET_ITEM(out, 0),
                          seconds, PyTuple_GET_ITEM(out, 2)};
    PyObject *record;
    if (Py_IS_TYPE(make, &RecordType) && ((RecordObject *)make)->n == 5) {
        record = record_fill((RecordObject *)make, items); /* (no Python call: the maker's own fill) */
    } else {
        PyObject *fields = PyTuple_New(5);
        for (Py_ssize_t i = 0; fields != NULL && i < 5; i++) PyTuple_SET_ITEM(fields, i, Py_NewRef(items[i]));
        record = fields != NULL ? PyObject_CallOneArg(make, fields) : NULL;
        Py_XDECREF(fields);
    }
    Py_DECREF(seconds);
    int rc = record != NULL ? emit(PyTuple_GET_ITEM(updates, 0), record, PyTuple_GET_ITEM(updates, 4), NULL) : -1;
    Py_XDECREF(record);
    if (rc < 0) Py_CLEAR(out);
    return out;
}

/* The drain of ``pending``, a PendingBase (its fields, in C). The lock is taken only where another thread holds it:
   this function keeps the GIL from start to end and runs no Python code before it has taken what it needs, so while
   the lock is free no other thread can be inside a section it guards, nor enter one, until this returns. */
static PyObject *drain(PyObject *pending, PyObject *table) {
    if (!(PendingType.tp_flags & Py_TPFLAGS_READY) || !PyObject_TypeCheck(pending, &PendingType)) {
        PyErr_SetString(PyExc_TypeError, "drain_one: the pending plan is not a PendingBase (see pending_base)");
        return NULL;
    }
    return drain_pending(pending, table);
}

/* The drain's end for one value (references to key, value and events are stolen): its hot entry applies it ->
   (names, None, events); else (None, {key: value}, events). */
static PyObject *apply_one(PyObject *table, PyObject *key, PyObject *value, PyObject *events) {
    PyObject *entry = PyObject_GetItem(table, key); /* a dict subclass: __missing__ makes the entry */
    PyObject *names = NULL, *out = NULL;
    int applied = 0;
    if (entry != NULL && PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2) {
        PyObject *apply = PyTuple_GET_ITEM(entry, 0);
        names = PyTuple_GET_ITEM(entry, 1);
        if (apply != Py_None) {
            PyObject *ok = Py_IS_TYPE(apply, &ApplyType) ? apply_value((ApplyObject *)apply, value)
                                                         : PyObject_CallOneArg(apply, value);
            applied = ok == NULL ? -1 : PyObject_IsTrue(ok);
            Py_XDECREF(ok);
        }
    } else if (entry != NULL) {
        PyErr_SetString(PyExc_TypeError, "drain_one: a hot entry is (apply, names)");
    }
    if (entry == NULL || applied < 0 || PyErr_Occurred()) {
        out = NULL;
    } else if (applied) {
        out = PyTuple_Pack(3, names, Py_None, events);
    } else {
        PyObject *one = PyDict_New();
        if (one != NULL && PyDict_SetItem(one, key, value) == 0) out = PyTuple_Pack(3, Py_None, one, events);
        Py_XDECREF(one);
    }
    Py_XDECREF(entry);
    Py_DECREF(events);
    Py_DECREF(key);
    Py_DECREF(value);
    return out;
}

/* ---- the setter's side: PendingBase and ParamBase (see the top of this file) ---- */

typedef struct {
    PyObject_HEAD
    PyObject *lock, *locked; /* _lock and its bound ``locked`` (made once, when _lock is set) */
    PyObject *params;        /* _params */
    Py_ssize_t count, others;
    Py_ssize_t values;       /* value_folds: parameter values (and launches, folded in Python) ever folded */
    PyObject *observed;      /* _observed */
    PyObject *event_type;    /* _event_type: ParameterChanged (NULL: _publish_value, in Python, publishes) */
} PendingObject;

/* the names the Python classes hand over (param_base, pending_base; NULL until then) */
static PyObject *s_publish_value, *s_sink, *s_id, *s_set_value, *s_changes;

/* A value just folded, as a ParameterChanged(block, name, value) to the observers of parameter changes. */
static int publish_value(PendingObject *self, PyObject *key, PyObject *value) {
    PyTypeObject *type = (PyTypeObject *)self->event_type;
    if (type == NULL || !PyType_Check(type) || !PyType_IsSubtype(type, &PyTuple_Type) || !PyTuple_Check(key)
        || PyTuple_GET_SIZE(key) != 2) {
        PyObject *r = PyObject_CallMethodObjArgs((PyObject *)self, s_publish_value, key, value, NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *event = type->tp_alloc(type, 3); /* (as tuple.__new__ makes a subclass's instance) */
    if (event == NULL) return -1;
    PyTuple_SET_ITEM(event, 0, Py_NewRef(PyTuple_GET_ITEM(key, 0)));
    PyTuple_SET_ITEM(event, 1, Py_NewRef(PyTuple_GET_ITEM(key, 1)));
    PyTuple_SET_ITEM(event, 2, Py_NewRef(value));
    int rc = emit(self->observed, event, (PyObject *)self, s_changes);
    Py_DECREF(event);
    return rc;
}

/* Take the pending plan's lock where another thread holds it (1), or go on without it (0: with the GIL held
   throughout, no other thread can enter a section it guards before this returns); -1 on error. */
static int lock_if_held(PyObject *lock, PyObject *locked) {
    PyObject *held = PyObject_CallNoArgs(locked);
    if (held == NULL) return -1;
    int acquire = PyObject_IsTrue(held);
    Py_DECREF(held);
    if (acquire <= 0) return acquire;
    PyObject *r = PyObject_CallMethodNoArgs(lock, s_acquire); /* (the GIL is released while it waits) */
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 1;
}

static int unlock(PyObject *lock) {
    PyObject *et = NULL, *ev = NULL, *tb = NULL;
    int failed = PyErr_Occurred() != NULL;
    if (failed) PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallMethodNoArgs(lock, s_release);
    if (failed) PyErr_Restore(et, ev, tb);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return failed ? -1 : 0;
}

static int pending_fold(PendingObject *self, PyObject *key, PyObject *value) {
    if (self->lock == NULL || self->params == NULL || self->observed == NULL) {
        PyErr_SetString(PyExc_AttributeError, "PendingBase: its lock, values and observers are set by __init__");
        return -1;
    }
    int taken = lock_if_held(self->lock, self->locked);
    if (taken < 0) return -1;
    PyObject *params = self->params;
    int failed = !PyDict_Check(params);
    if (failed) PyErr_SetString(PyExc_TypeError, "PendingBase: its values are a dict");
    else failed = PyDict_SetItem(params, key, value) < 0;
    if (!failed) {
        self->count++;
        self->values++;
    }
    if (taken && unlock(self->lock) < 0) return -1;
    if (failed) return -1;
    if (PyTuple_Check(self->observed) && PyTuple_GET_SIZE(self->observed)) return publish_value(self, key, value);
    return 0;
}

static PyObject *pending_set_value(PendingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_value(key, value) takes two arguments");
        return NULL;
    }
    if (pending_fold(self, args[0], args[1]) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *pending_get_lock(PendingObject *self, void *closure) {
    if (self->lock == NULL) {
        PyErr_SetString(PyExc_AttributeError, "PendingBase: its lock is not set");
        return NULL;
    }
    return Py_NewRef(self->lock);
}

static int pending_set_lock(PendingObject *self, PyObject *lock, void *closure) {
    if (lock == NULL) {
        PyErr_SetString(PyExc_AttributeError, "PendingBase: its lock cannot be deleted");
        return -1;
    }
    PyObject *locked = PyObject_GetAttr(lock, s_locked);
    if (locked == NULL) return -1;
    Py_XSETREF(self->locked, locked);
    Py_XSETREF(self->lock, Py_NewRef(lock));
    return 0;
}

static int pending_traverse(PendingObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->locked);
    Py_VISIT(self->params);
    Py_VISIT(self->observed);
    Py_VISIT(self->event_type);
    return 0;
}

static int pending_clear(PendingObject *self) {
    Py_CLEAR(self->lock);
    Py_CLEAR(self->locked);
    Py_CLEAR(self->params);
    Py_CLEAR(self->observed);
    Py_CLEAR(self->event_type);
    return 0;
}

static void pending_dealloc(PendingObject *self) { /* (a Python subclass's dealloc holds its type's reference) */
    PyObject_GC_UnTrack(self);
    pending_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The names of these fields are the pending plan's (rxcuda.streams.PendingPlan): pending_base hands them over, in this
   order, before the type is made ready; the placeholders here are never seen. */
#define PENDING_FIELDS 7 /* _lock (a getset, first), then the members */
static PyMemberDef pending_members[] = {
    {"params", T_OBJECT_EX, offsetof(PendingObject, params), 0, "the pending values: (block id, name) -> value"},
    {"count", T_PYSSIZET, offsetof(PendingObject, count), 0, "changes folded since the last drain"},
    {"others", T_PYSSIZET, offsetof(PendingObject, others), 0, "... of which not parameter values"},
    {"value_folds", T_PYSSIZET, offsetof(PendingObject, values), 0,
     "parameter values and launches ever folded (never reset: see Runtime._entries)"},
    {"observed", T_OBJECT_EX, offsetof(PendingObject, observed), 0, "who observes parameter changes (a tuple)"},
    {"event_type", T_OBJECT, offsetof(PendingObject, event_type), 0, "the type of a parameter change's event"},
    {NULL},
};

static PyGetSetDef pending_getset[] = {
    {"lock", (getter)pending_get_lock, (setter)pending_set_lock, "the lock producers fold under", NULL},
    {NULL},
};

static PyMethodDef pending_methods[] = {
    {"set_value", (PyCFunction)(void (*)(void))pending_set_value, METH_FASTCALL,
     "set_value(key, value): fold a parameter's value (see the module's docstring)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PendingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rxcuda.cuda._hotpath.PendingBase",
    .tp_basicsize = sizeof(PendingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "the pending plan's hot fields and its set_value in C (see the module's docstring)",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)pending_dealloc,
    .tp_traverse = (traverseproc)pending_traverse,
    .tp_clear = (inquiry)pending_clear,
    .tp_members = pending_members,
    .tp_getset = pending_getset,
    .tp_methods = pending_methods,
};

/* drain_one for a PendingBase: the same, reading and writing its fields directly */
static PyObject *drain_pending(PyObject *pending, PyObject *table) {
    PendingObject *self = (PendingObject *)pending;
    if (self->lock == NULL || self->params == NULL || !PyDict_CheckExact(self->params)) {
        PyErr_SetString(PyExc_TypeError, "drain_one: the pending plan's lock and values (a dict) are not set");
        return NULL;
    }
    int taken = lock_if_held(self->lock, self->locked);
    if (taken < 0) return NULL;
    PyObject *params = self->params, *key = NULL, *value = NULL, *taken_params = NULL;
    PyObject *events = PyLong_FromSsize_t(self->count);
    int failed = events == NULL;
    if (!failed) {
        self->count = self->others; /* 0 unless a change of another kind just arrived (drained next time) */
        if (PyDict_GET_SIZE(params) == 1) {
            Py_ssize_t pos = 0;
            PyObject *k, *v;
            PyDict_Next(params, &pos, &k, &v);
            key = Py_NewRef(k);
            value = Py_NewRef(v);
            failed = PyDict_DelItem(params, key) < 0; /* (its dict stays: no new one made and the old one freed) */
        } else {
            PyObject *fresh = PyDict_New();
            failed = fresh == NULL;
            if (!failed) {
                taken_params = params; /* (the field's reference, handed to the caller) */
                self->params = fresh;
            }
        }
    }
    if (taken && unlock(self->lock) < 0) failed = 1;
    if (failed) {
        Py_XDECREF(events);
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(taken_params);
        return NULL;
    }
    if (taken_params != NULL) {
        PyObject *out = PyTuple_Pack(3, Py_None, taken_params, events);
        Py_DECREF(taken_params);
        Py_DECREF(events);
        return out;
    }
    return apply_one(table, key, value, events);
}

typedef struct {
    PyObject_HEAD
    PyObject *name, *dtype, *value, *block, *check, *min, *max, *step, *plain, *lo, *hi;
} ParamObject;

/* numpy.float64 (a subclass of float), registered by rxcuda.blocks._params through set_float64: a value of that exact
   type passes a float parameter's fast test as float(value) does, and is kept as that float (what _check returns) */
static PyObject *float64_type = NULL;

static PyObject *set_float64(PyObject *module, PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyFloat_Type)) {
        PyErr_SetString(PyExc_TypeError, "set_float64 takes a subclass of float (numpy.float64)");
        return NULL;
    }
    Py_XSETREF(float64_type, Py_NewRef(type));
    Py_RETURN_NONE;
}

/* 1: ``v`` passes the fast test unchanged (exactly type _plain, within [_lo, _hi]); 2: ``v`` is a numpy.float64 for
   a float parameter and float(v) passes it; 0: it needs _check; -1: error */
static int param_fast(ParamObject *self, PyObject *v) {
    if (self->plain == NULL || self->lo == NULL || self->hi == NULL) return 0;
    if ((PyObject *)Py_TYPE(v) != self->plain) {
        if (self->plain == (PyObject *)&PyFloat_Type && float64_type != NULL && (PyObject *)Py_TYPE(v) == float64_type
            && PyFloat_CheckExact(self->lo) && PyFloat_CheckExact(self->hi)) {
            double d = PyFloat_AS_DOUBLE(v);
            return PyFloat_AS_DOUBLE(self->lo) <= d && d <= PyFloat_AS_DOUBLE(self->hi) ? 2 : 0;
        }
        return 0;
    }
    if (PyFloat_CheckExact(v) && PyFloat_CheckExact(self->lo) && PyFloat_CheckExact(self->hi)) {
        double d = PyFloat_AS_DOUBLE(v); /* NaN fails both comparisons, as in Python */
        return PyFloat_AS_DOUBLE(self->lo) <= d && d <= PyFloat_AS_DOUBLE(self->hi);
    }
    int ok = PyObject_RichCompareBool(self->lo, v, Py_LE);
    if (ok > 0) ok = PyObject_RichCompareBool(v, self->hi, Py_LE);
    return ok;
}

static PyObject *param_get_value(ParamObject *self, void *closure) {
    if (self->value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "value");
        return NULL;
    }
    return Py_NewRef(self->value);
}

static int param_set_value(ParamObject *self, PyObject *v, void *closure) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a parameter's value cannot be deleted");
        return -1;
    }
    int fast = param_fast(self, v);
    if (fast < 0) return -1;
    PyObject *value;
    if (fast == 2) {
        value = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v));
        if (value == NULL) return -1;
    } else if (fast) {
        value = Py_NewRef(v);
    } else {
        if (self->check == NULL) {
            PyErr_SetString(PyExc_AttributeError, "ParamBase: its check is not set");
            return -1;
        }
        value = PyObject_CallOneArg(self->check, v);
        if (value == NULL) return -1;
    }
    Py_XSETREF(self->value, value);
    if (self->block == NULL || self->name == NULL) {
        PyErr_SetString(PyExc_AttributeError, "ParamBase: its block is not set");
        return -1;
    }
    PyObject *sink = PyObject_GetAttr(self->block, s_sink);
    if (sink == NULL) return -1;
    int rc = 0;
    if (sink != Py_None) {
        PyObject *id = PyObject_GetAttr(self->block, s_id);
        PyObject *key = id != NULL ? PyTuple_Pack(2, id, self->name) : NULL;
        Py_XDECREF(id);
        if (key == NULL) {
            rc = -1;
        } else if (PyObject_TypeCheck(sink, &PendingType)) {
            rc = pending_fold((PendingObject *)sink, key, value);
        } else {
            PyObject *r = PyObject_CallMethodObjArgs(sink, s_set_value, key, value, NULL);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        Py_XDECREF(key);
    }
    Py_DECREF(sink);
    return rc;
}

static int param_traverse(ParamObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->name);
    Py_VISIT(self->dtype);
    Py_VISIT(self->value);
    Py_VISIT(self->block);
    Py_VISIT(self->check);
    Py_VISIT(self->min);
    Py_VISIT(self->max);
    Py_VISIT(self->step);
    Py_VISIT(self->plain);
    Py_VISIT(self->lo);
    Py_VISIT(self->hi);
    return 0;
}

static int param_clear(ParamObject *self) {
    Py_CLEAR(self->name);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->value);
    Py_CLEAR(self->block);
    Py_CLEAR(self->check);
    Py_CLEAR(self->min);
    Py_CLEAR(self->max);
    Py_CLEAR(self->step);
    Py_CLEAR(self->plain);
    Py_CLEAR(self->lo);
    Py_CLEAR(self->hi);
    return 0;
}

static void param_dealloc(ParamObject *self) { /* (a Python subclass's dealloc holds its type's reference) */
    PyObject_GC_UnTrack(self);
    param_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The names of these fields are the parameter's (rxcuda.blocks.Parameter): param_base hands them over, in this order,
   before the type is made ready; the placeholders here are never seen. */
#define PARAM_FIELDS 11
#define PARAM_FIELD(name, field) {name, T_OBJECT_EX, offsetof(ParamObject, field), 0, NULL}
static PyMemberDef param_members[] = {
    PARAM_FIELD("name", name), PARAM_FIELD("dtype", dtype), PARAM_FIELD("value", value),
    PARAM_FIELD("block", block), PARAM_FIELD("check", check), PARAM_FIELD("min", min), PARAM_FIELD("max", max),
    PARAM_FIELD("step", step), PARAM_FIELD("plain", plain), PARAM_FIELD("lo", lo), PARAM_FIELD("hi", hi),
    {NULL},
};

static PyGetSetDef param_getset[] = {
    {"value", (getter)param_get_value, (setter)param_set_value,
     "The parameter's value. Setting it checks the value (its type, range and, for a count, the buffers it "
     "counts) and folds it into the engine's pending plan: the next frame runs with it.", NULL},
    {NULL},
};

static PyTypeObject ParamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rxcuda.cuda._hotpath.ParamBase",
    .tp_basicsize = sizeof(ParamObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "a parameter's fields and its value setter in C (see the module's docstring)",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)param_dealloc,
    .tp_traverse = (traverseproc)param_traverse,
    .tp_clear = (inquiry)param_clear,
    .tp_members = param_members,
    .tp_getset = param_getset,
};

/* noop_set_params: the address of a function with cuGraphExecKernelNodeSetParams's signature that does nothing
   and returns 0; bench/frame.py --null measures the host's share with it. */
static int noop_set_params(void *e, void *n, void *p) {
    (void)e; (void)n; (void)p;
    return 0;
}

static PyObject *noop_address(PyObject *module, PyObject *unused) {
    return PyLong_FromVoidPtr((void *)noop_set_params);
}

/* add_kernel_nodes(function, graph, params, counts, deps, out, n) -> (index, err): a graph build's kernel nodes in one
   call (rxcuda.cuda._fast.FastDriver.add_kernel_nodes). ``function``: the address of cuGraphAddKernelNode_v2;
   ``graph``: the CUgraph; ``params``, ``counts``, ``deps``, ``out``: addresses of arrays of ``n`` uint64 struct
   addresses (CUDA_KERNEL_NODE_PARAMS), ``n`` int64 dependency counts, their int64 node indices one after another,
   each below its own node's, and ``n`` uint64 node handles, written here. Node i is added after the nodes its
   indices name, in order; the first failure stops: (its index, the CUresult), else (-1, 0). A dependency index
   that does not name an earlier node gives (its node's index, -1) before any driver call for it. The GIL is
   released meanwhile: nothing here touches a Python object. */
typedef int (*add_kernel_node_fn)(void **node, void *graph, void *const *deps, size_t n, const void *params);

static PyObject *add_kernel_nodes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "add_kernel_nodes takes 7 arguments");
        return NULL;
    }
    void *addr[6];
    for (int i = 0; i < 6; i++) {
        addr[i] = PyLong_AsVoidPtr(args[i]);
        if (addr[i] == NULL && PyErr_Occurred()) return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[6]);
    if (n < 0 && PyErr_Occurred()) return NULL;
    add_kernel_node_fn add = (add_kernel_node_fn)addr[0];
    void *graph = addr[1];
    const uint64_t *params = (const uint64_t *)addr[2];
    const int64_t *counts = (const int64_t *)addr[3];
    const int64_t *deps = (const int64_t *)addr[4];
    void **out = (void **)addr[5];
    void *local[32];
    void **buf = local;
    int64_t cap = 32;
    Py_ssize_t failed = -1;
    int err = 0;
    int64_t j = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t c = counts[i];
        if (c > cap) {
            void **grown = (void **)malloc(sizeof(void *) * (size_t)c);
            if (grown == NULL) { failed = i; err = -2; break; }
            if (buf != local) free(buf);
            buf = grown;
            cap = c;
        }
        for (int64_t k = 0; k < c; k++) {
            int64_t d = deps[j + k];
            if (d < 0 || d >= i) { failed = i; err = -1; break; }
            buf[k] = out[d];
        }
        if (err) break;
        j += c;
        err = add(&out[i], graph, buf, (size_t)c, (const void *)(uintptr_t)params[i]);
        if (err) { failed = i; break; }
    }
    if (buf != local) free(buf);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(ni)", failed, err);
}

/* ---- the names: handed over by the Python classes that own them (one definition of each contract) ---- */

static PyObject *param_names, *pending_names; /* what param_base and pending_base were given (kept: the members'
                                                 names point into these strings) */

/* ``names``: a tuple of ``n`` str; each interned into ``out`` (NULL: skipped). 0, or -1 with an exception set. */
static int take_names(const char *who, PyObject *names, Py_ssize_t n, PyObject **out[]) {
    if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != n) {
        PyErr_Format(PyExc_TypeError, "%s: a tuple of %zd names", who, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(name) || PyUnicode_GET_LENGTH(name) == 0) {
            PyErr_Format(PyExc_TypeError, "%s: the names are non-empty str (got %R)", who, name);
            return -1;
        }
        if (out != NULL && out[i] != NULL) {
            Py_INCREF(name);
            PyUnicode_InternInPlace(&name);
            Py_XSETREF(*out[i], name);
        }
    }
    return 0;
}

/* Made ready once, with ``given``'s names; a second call with the same names returns the same type. */
static PyObject *ready_once(const char *who, PyTypeObject *type, PyObject **kept, PyObject *given) {
    if (*kept != NULL) {
        int same = PyObject_RichCompareBool(*kept, given, Py_EQ);
        if (same < 0) return NULL;
        if (!same) {
            PyErr_Format(PyExc_ValueError, "%s was made with the names %R already (asked for %R)", who, *kept, given);
            return NULL;
        }
        return Py_NewRef((PyObject *)type);
    }
    if (PyType_Ready(type) < 0) return NULL;
    *kept = Py_NewRef(given);
    return Py_NewRef((PyObject *)type);
}

/* The base ``type`` made ready with the names ``args`` = (fields, names) give (``who``: its maker, for messages):
   ``fields[i]`` becomes the attribute name ``*field_slots[i]`` points at, ``names[i]`` the one ``*name_slots[i]``
   points at (NULL: none) and is interned into ``*outs[i]`` (NULL: not kept); ``kept`` holds what it was made with. */
static PyObject *make_base(const char *who, PyTypeObject *type, PyObject **kept, PyObject *const *args,
                           Py_ssize_t nargs, Py_ssize_t nfields, const char **field_slots[], Py_ssize_t nnames,
                           const char **name_slots[], PyObject **outs[]) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(fields, names)", who);
        return NULL;
    }
    if (take_names(who, args[0], nfields, NULL) < 0 || take_names(who, args[1], nnames, NULL) < 0) return NULL;
    PyObject *given = PyTuple_Pack(2, args[0], args[1]);
    if (given == NULL) return NULL;
    PyObject *out = NULL;
    if (*kept != NULL || take_names(who, args[1], nnames, outs) == 0) {
        if (*kept == NULL) {
            for (Py_ssize_t i = 0; i < nfields; i++) *field_slots[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(args[0], i));
            for (Py_ssize_t i = 0; i < nnames; i++)
                if (name_slots[i] != NULL) *name_slots[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(args[1], i));
        }
        out = ready_once(who, type, kept, given);
    }
    Py_DECREF(given);
    return out;
}

/* param_base(fields, names) -> ParamBase: ``fields``, the parameter's 11 fields (name, dtype, value, block, check,
   min, max, step, plain, lo, hi: rxcuda.blocks._params._Fields.__slots__); ``names``: (its value property, the block's
   sink attribute, the block's id attribute, the sink's fold method). */
static PyObject *param_base(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    const char **fields[PARAM_FIELDS];
    for (Py_ssize_t i = 0; i < PARAM_FIELDS; i++) fields[i] = &param_members[i].name;
    const char **names[] = {&param_getset[0].name, NULL, NULL, NULL};
    PyObject **outs[] = {NULL, &s_sink, &s_id, &s_set_value};
    return make_base("param_base", &ParamType, &param_names, args, nargs, PARAM_FIELDS, fields, 4, names, outs);
}

/* pending_base(fields, names) -> PendingBase: ``fields``, the pending plan's 7 hot fields (lock, params, count, others,
   value_folds, observed, event_type: rxcuda.streams.PendingPlan.HOT_FIELDS); ``names``: (its method that publishes a
   folded value, its attribute with the Broadcast of changes). */
static PyObject *pending_base(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    const char **fields[PENDING_FIELDS];
    fields[0] = &pending_getset[0].name;
    for (Py_ssize_t i = 1; i < PENDING_FIELDS; i++) fields[i] = &pending_members[i - 1].name;
    const char **names[] = {NULL, NULL};
    PyObject **outs[] = {&s_publish_value, &s_changes};
    return make_base("pending_base", &PendingType, &pending_names, args, nargs, PENDING_FIELDS, fields, 2, names, outs);
}

static PyMethodDef methods[] = {
    {"drain_one", (PyCFunction)(void (*)(void))drain_one, METH_FASTCALL,
     "drain_one(pending, table[, updates]) -> (names, None, events) | (None, params, events)"},
    {"noop_address", noop_address, METH_NOARGS, "the address of a set-params function that does nothing"},
    {"set_float64", set_float64, METH_O, "set_float64(numpy.float64): the float subclass a float parameter takes fast"},
    {"param_base", (PyCFunction)(void (*)(void))param_base, METH_FASTCALL,
     "param_base(fields, names) -> ParamBase, made with the parameter's names (see the C file)"},
    {"pending_base", (PyCFunction)(void (*)(void))pending_base, METH_FASTCALL,
     "pending_base(fields, names) -> PendingBase, made with the pending plan's names (see the C file)"},
    {"add_kernel_nodes", (PyCFunction)(void (*)(void))add_kernel_nodes, METH_FASTCALL,
     "add_kernel_nodes(function, graph, params, counts, deps, out, n) -> (index, err)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hotpath", "rxcuda's compiled parameter path (see rxcuda/cuda/_native.py)", -1, methods,
};

PyMODINIT_FUNC PyInit__hotpath(void) {
    /* (PendingBase and ParamBase are made ready by pending_base and param_base, with the names of their owners) */
    if (PyType_Ready(&ApplyType) < 0 || PyType_Ready(&RecordType) < 0) return NULL;
    s_acquire = PyUnicode_InternFromString("acquire"); /* (threading.Lock's) */
    s_release = PyUnicode_InternFromString("release");
    s_locked = PyUnicode_InternFromString("locked");
    s_on_next = PyUnicode_InternFromString("on_next"); /* (an Rx observer's) */
    s_failed = PyUnicode_InternFromString("failed");   /* (rxcuda.streams.Broadcast's) */
    if (!s_locked || !s_acquire || !s_release || !s_on_next || !s_failed) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Apply", (PyObject *)&ApplyType) < 0
        || PyModule_AddObjectRef(m, "Record", (PyObject *)&RecordType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef RXCUDA_HOTPATH_SOURCE
    if (PyModule_AddStringConstant(m, "SOURCE", RXCUDA_HOTPATH_SOURCE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
