/* rxcuda's compiled parameter path (built on first use by rxcuda/cuda/_native.py; pure-Python fallback there).

   Apply(targets, lo, hi, raise_for): one parameter's hot update. ``targets``: a tuple of
   (kind, address, function, graph_exec, node, params, update, keep) tuples, one per kernel node that reads the
   parameter: ``kind`` the argument's type as a fixed-width NumPy character (f d e b h i q B H I Q ?),
   ``address`` where its value lives in the node's argument storage, ``function`` the address of
   cuGraphExecKernelNodeSetParams (0: call ``update`` instead, a Python callable returning the CUresult as an
   int: the null driver), ``graph_exec``/``node``/``params`` its arguments, ``keep`` what keeps ``address``
   alive (the storage's NumPy view). ``lo``/``hi``: a count parameter's bounds (None: none). ``apply(value)``
   writes ``value`` into every target's argument and updates its exec node, True when it did; False, having
   done nothing, for a value outside [lo, hi]. A non-zero CUresult calls ``raise_for(err)``, which raises.

   drain_one(pending, lock, params, table): the scheduler's drain of parameter values alone
   (rxcuda.engine._update), as Updater.apply_pending does it in Python: under ``pending._lock`` take the
   pending values and reset ``pending.count``; one value whose hot entry ``table[key]`` = (apply, names) has an
   ``apply`` that takes it is applied here. Returns (names, None, events) when it was; (None, params, events)
   otherwise, ``params`` the dict of values for the general path.

   Everything runs with the GIL held; no Python object outlives a call except what Apply keeps. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

static PyObject *s_params, *s_count, *s_others, *s_acquire, *s_release, *s_locked;

/* drain_one(pending, lock, params, table) -> (names, None, events) | (None, params, events), where ``lock`` and
   ``params`` are ``pending._lock`` and ``pending._params`` (read by the caller: Python's own attribute loads are
   cheaper than C's generic ones). The lock is taken only where another thread holds it: this function keeps the
   GIL from start to end and runs no Python code before it has taken what it needs (instance attributes of plain
   objects, a dict of tuple keys), so while the lock is free no other thread can be inside a section it guards,
   nor enter one, until this returns. */
static PyObject *drain_one(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "drain_one(pending, pending._lock, pending._params (a dict), table)");
        return NULL;
    }
    PyObject *pending = args[0], *lock = args[1], *params = args[2], *table = args[3];
    PyObject *held = PyObject_CallMethodNoArgs(lock, s_locked);
    if (held == NULL) return NULL;
    int acquire = PyObject_IsTrue(held);
    Py_DECREF(held);
    if (acquire < 0) return NULL;
    if (acquire) { /* a producer is inside its section: wait for it (the GIL is released while waiting) */
        PyObject *r = PyObject_CallMethodNoArgs(lock, s_acquire);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    /* (nothing below raises short of memory; the lock, when taken, is released on every path) */
    PyObject *events = PyObject_GetAttr(pending, s_count);
    PyObject *others = events ? PyObject_GetAttr(pending, s_others) : NULL;
    PyObject *key = NULL, *value = NULL, *taken = NULL;
    int failed = others == NULL || PyObject_SetAttr(pending, s_count, others) < 0;
    if (!failed && PyDict_GET_SIZE(params) == 1) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        PyDict_Next(params, &pos, &k, &v);
        key = Py_NewRef(k);
        value = Py_NewRef(v);
        failed = PyDict_DelItem(params, key) < 0;
    } else if (!failed) {
        PyObject *fresh = PyDict_New();
        failed = fresh == NULL || PyObject_SetAttr(pending, s_params, fresh) < 0;
        Py_XDECREF(fresh);
        if (!failed) taken = Py_NewRef(params);
    }
    Py_XDECREF(others);
    if (acquire) {
        PyObject *et = NULL, *ev = NULL, *tb = NULL;
        if (failed) PyErr_Fetch(&et, &ev, &tb);
        PyObject *r = PyObject_CallMethodNoArgs(lock, s_release);
        if (failed) PyErr_Restore(et, ev, tb);
        if (r == NULL) failed = 1;
        Py_XDECREF(r);
    }
    if (failed) {
        Py_XDECREF(events);
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(taken);
        return NULL;
    }
    if (taken != NULL) {
        PyObject *out = PyTuple_Pack(3, Py_None, taken, events);
        Py_DECREF(taken);
        Py_DECREF(events);
        return out;
    }
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

/* noop_set_params: the address of a function with cuGraphExecKernelNodeSetParams's signature that does nothing
   and returns 0; bench/frame.py --null measures the host's share with it. */
static int noop_set_params(void *e, void *n, void *p) {
    (void)e; (void)n; (void)p;
    return 0;
}

static PyObject *noop_address(PyObject *module, PyObject *unused) {
    return PyLong_FromVoidPtr((void *)noop_set_params);
}

static PyMethodDef methods[] = {
    {"drain_one", (PyCFunction)(void (*)(void))drain_one, METH_FASTCALL,
     "drain_one(pending, lock, params, table) -> (names, None, events) | (None, params, events)"},
    {"noop_address", noop_address, METH_NOARGS, "the address of a set-params function that does nothing"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hotpath", "rxcuda's compiled parameter path (see rxcuda/cuda/_native.py)", -1, methods,
};

PyMODINIT_FUNC PyInit__hotpath(void) {
    if (PyType_Ready(&ApplyType) < 0) return NULL;
    s_params = PyUnicode_InternFromString("_params");
    s_count = PyUnicode_InternFromString("count");
    s_others = PyUnicode_InternFromString("others");
    s_acquire = PyUnicode_InternFromString("acquire");
    s_release = PyUnicode_InternFromString("release");
    s_locked = PyUnicode_InternFromString("locked");
    if (!s_locked || !s_params || !s_count || !s_others || !s_acquire || !s_release) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&ApplyType);
    if (PyModule_AddObject(m, "Apply", (PyObject *)&ApplyType) < 0) {
        Py_DECREF(&ApplyType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
