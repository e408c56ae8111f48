/* The fused scheduler plan's scoring in C (epp.scheduling.kernel says why and when).
 *
 * A leaf: it includes nothing of the EPP.  ``Plan(ops)`` compiles a profile's scorers once;
 * ``Plan.totals(...)`` computes, for one request, the weighted totals ``FusedPlan.totals``
 * computes in Python, with the same float operations in the same order, so the floats are
 * bit-identical (tests/scheduling/test_kernel.py compares them on hypothesis input):
 *
 *   op CACHED  (slot j, weight w): the score cache's list j, ``x * w``;
 *   op PREFIX  (weight w): prefix-cache-scorer, ``match_blocks / total_blocks`` (0.0 without an
 *              info or without blocks), times w (``add_weighted_scores``, matchLengthWeight 0);
 *   op TOKEN   (weight w, cap): token-load-scorer, ``1.0 - (t if t < cap else cap) / cap``, 1.0
 *              when ``t <= 0`` or no load;
 *   op PREFILL (weight w): prefill-load-scorer, estimates ``max(prompt - cached, 0) + backlog``
 *              min-max normalised as ``(hi - v) / float(hi - lo)``, 1.0 each when all equal.
 *
 * Per endpoint the total starts from the cache's ``partial`` (or from the first weighted score)
 * and each op adds its weighted score left to right, as ``combine`` and ``add_weighted_scores``
 * do: ``((p + a*wa) + b*wb) + ...``.  Contraction into fused multiply-adds would round once
 * where Python rounds twice, so it is off (the pragma below, and -ffp-contract=off from
 * hatch_build.py).
 *
 * Python ints are unbounded; here they are ``long long`` and an int→double conversion is exact
 * only up to 2**53.  A value outside what is computed exactly (a token count or prefix length
 * above 2**53, an estimate overflowing ``long long``, a non-int attribute, a score that is not a
 * float, a container that is not a plain list/tuple/dict) makes ``totals`` return None, having
 * changed nothing: the caller then runs the Python path, which gives the exact answer (or the
 * error).  Errors the Python path raises on the same inputs (a missing attribute, a short cached
 * list) are raised here with the same type.
 *
 * Reference counting: an endpoint, its info or load, and the names read from them are held by a
 * strong reference while used (an attribute read or a dict lookup may run Python code).
 */
/* Before any include, so that Python.h's inline functions are compiled with the same options
 * as ours (GCC does not inline across differing optimize options). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <structmember.h> /* T_OBJECT_EX, PY_AUDIT_READ */

enum { OP_CACHED = 0, OP_PREFIX = 1, OP_TOKEN = 2, OP_PREFILL = 3, OP_KINDS = 4 };

#define EXACT_INT_MAX (1LL << 53) /* ints up to this magnitude convert to double exactly */
#define STACK_N 64                /* endpoints handled without a heap buffer */

typedef struct {
    int kind;
    Py_ssize_t slot; /* OP_CACHED: the score cache's list */
    double weight;
    double cap; /* OP_TOKEN: queueThresholdTokens, a float */
} Op;

typedef struct {
    PyObject_HEAD
    Py_ssize_t nops;
    Op *ops;
} Plan;

/* An attribute read by name (interned), and where the last type it was read from keeps it.
 *
 * ``obj.name`` is a generic attribute lookup: the type's MRO (``_PyType_Lookup``, through the
 * method cache), then the data descriptor found there called.  For a ``__slots__`` member (the
 * frozen slots dataclasses PrefixMatchInfo, InFlightLoad and EndpointMetadata, the Endpoint
 * class) that descriptor reads a pointer at a fixed offset of the instance (``member_get``, a
 * ``T_OBJECT_EX`` member: AttributeError when unset).  So once a type's lookup found such a
 * member, its reads are that pointer read, as long as the lookup would find the same thing:
 *
 *   - the instance's type is the one looked up (``Py_TYPE(obj) == type``), whose attribute
 *     lookup is the generic one (``tp_getattro == PyObject_GenericGetAttr``: no
 *     ``__getattribute__`` or ``__getattr__``), and
 *   - neither it nor a base changed since: its version tag is the one taken at the lookup and
 *     still valid (CPython invalidates a type's tag, and its subclasses', whenever an attribute
 *     of it is set or deleted, or its bases change; tags are never reused), and
 *   - a data descriptor wins over the instance ``__dict__`` (and slots types have none).
 *
 * Otherwise (or for an unset slot, to raise the same AttributeError) the generic lookup runs,
 * and the cache follows the new type.  tests/scheduling/test_kernel.py changes a class under
 * the kernel. */
typedef struct {
    PyObject *name;     /* interned */
    PyTypeObject *type; /* borrowed: only compared, with its tag (a new type never gets an old tag) */
    unsigned int tag;
    Py_ssize_t offset;
} Attr;

static Attr a_match_blocks, a_total_blocks, a_block_size_tokens, a_tokens, a_metadata, a_name;

static void attr_learn(PyTypeObject *tp, Attr *a) {
    a->type = NULL;
    if (tp->tp_getattro != PyObject_GenericGetAttr) return;
    PyObject *descr = _PyType_Lookup(tp, a->name); /* borrowed; gives the type a valid tag */
    if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) return;
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & PY_AUDIT_READ)) return;
    if (!(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return;
    a->type = tp;
    a->tag = tp->tp_version_tag;
    a->offset = m->offset;
}

/* ``obj.<a->name>``, a new reference (NULL: raised). */
static inline PyObject *attr_get(PyObject *obj, Attr *a) {
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == a->type && tp->tp_version_tag == a->tag && (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        PyObject *v = *(PyObject **)((char *)obj + a->offset);
        if (v != NULL) return Py_NewRef(v);
    } else {
        attr_learn(tp, a);
    }
    return PyObject_GetAttr(obj, a->name);
}

/* The outcome of reading one value: OK, NOFIT (the Python path must decide), ERR (raised). */
enum { OK = 0, NOFIT = 1, ERR = -1 };

/* An exact int as a long long; NOFIT for anything else or an int that does not fit.  The ints
 * here are small: one or no digit is read directly (the layout of the interpreter compiled for). */
static inline int as_ll(PyObject *v, long long *out) {
    if (!PyLong_CheckExact(v)) return NOFIT;
#if PY_VERSION_HEX < 0x030C0000
    Py_ssize_t size = Py_SIZE(v);
    if (size == 0 || size == 1 || size == -1) {
        *out = size * (long long)((PyLongObject *)v)->ob_digit[0];
        return OK;
    }
#else
    if (PyUnstable_Long_IsCompact((PyLongObject *)v)) {
        *out = (long long)PyUnstable_Long_CompactValue((PyLongObject *)v);
        return OK;
    }
#endif
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) return NOFIT;
    if (x == -1 && PyErr_Occurred()) return ERR;
    *out = x;
    return OK;
}

/* ``obj.name`` as a long long; NOFIT when it is not an exact int or does not fit. */
static inline int get_ll(PyObject *obj, Attr *name, long long *out) {
    PyObject *v = attr_get(obj, name);
    if (v == NULL) return ERR;
    int rc = as_ll(v, out);
    Py_DECREF(v);
    return rc;
}

static inline int exact_double(long long x) { return x <= EXACT_INT_MAX && x >= -EXACT_INT_MAX; }

/* One float of a cached list (or ``partial``): list or tuple of exact floats, at least n long. */
static int check_floats(PyObject *seq, Py_ssize_t n, PyObject ***items) {
    Py_ssize_t size;
    if (PyList_CheckExact(seq)) {
        size = PyList_GET_SIZE(seq);
        *items = ((PyListObject *)seq)->ob_item;
    } else if (PyTuple_CheckExact(seq)) {
        size = PyTuple_GET_SIZE(seq);
        *items = ((PyTupleObject *)seq)->ob_item;
    } else {
        return NOFIT;
    }
    if (size < n) { /* ``combine`` indexes range(n): a short list raises there too */
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return ERR;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyFloat_CheckExact((*items)[i])) return NOFIT;
    }
    return OK;
}

/* prefix-cache-scorer's score of each endpoint (matchLengthWeight 0). */
static int prefix_scores(PyObject **eps, const Py_hash_t *hashes, Py_ssize_t n, PyObject *infos, double *out) {
    if (PyDict_GET_SIZE(infos) == 0) {
        for (Py_ssize_t i = 0; i < n; i++) out[i] = 0.0;
        return OK;
    }
    PyObject *last = NULL; /* the producer shares one info among endpoints: score it once */
    double last_score = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ep = eps[i];
        Py_INCREF(ep);
        PyObject *info = _PyDict_GetItem_KnownHash(infos, ep, hashes[i]);
        Py_DECREF(ep);
        if (info == NULL) {
            if (PyErr_Occurred()) return ERR;
            out[i] = 0.0;
            continue;
        }
        if (info == last) { /* still alive: ``last`` holds it */
            out[i] = last_score;
            continue;
        }
        Py_INCREF(info);
        long long total, match;
        int rc = get_ll(info, &a_total_blocks, &total);
        double s = 0.0;
        if (rc == OK && total > 0) {
            rc = get_ll(info, &a_match_blocks, &match);
            if (rc == OK) {
                if (!exact_double(total) || !exact_double(match)) {
                    rc = NOFIT;
                } else {
                    s = (double)match / (double)total; /* Python's int / int for these: the same */
                }
            }
        }
        if (rc != OK) {
            Py_DECREF(info);
            Py_XDECREF(last);
            return rc;
        }
        Py_XDECREF(last);
        last = info; /* keeps the reference */
        last_score = s;
        out[i] = s;
    }
    Py_XDECREF(last);
    return OK;
}

/* token-load-scorer's score of each endpoint. */
static int token_scores(PyObject **eps, const Py_hash_t *hashes, Py_ssize_t n, PyObject *loads, double cap,
                        double *out) {
    if (PyDict_GET_SIZE(loads) == 0) {
        for (Py_ssize_t i = 0; i < n; i++) out[i] = 1.0;
        return OK;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ep = eps[i];
        Py_INCREF(ep);
        PyObject *load = _PyDict_GetItem_KnownHash(loads, ep, hashes[i]);
        Py_DECREF(ep);
        if (load == NULL) {
            if (PyErr_Occurred()) return ERR;
            out[i] = 1.0;
            continue;
        }
        Py_INCREF(load);
        long long t;
        int rc = get_ll(load, &a_tokens, &t);
        Py_DECREF(load);
        if (rc != OK) return rc;
        if (t <= 0) {
            out[i] = 1.0;
            continue;
        }
        if (!exact_double(t)) return NOFIT; /* ``t < cap`` and ``t / cap`` exact only below 2**53 */
        double td = (double)t;
        out[i] = 1.0 - (td < cap ? td : cap) / cap;
    }
    return OK;
}

/* One endpoint's prefill estimate, ``max(prompt - cached, 0) + backlog``; the caller holds ``ep``. */
static int prefill_estimate(PyObject *ep, Py_hash_t hash, PyObject *infos, PyObject *backlog, int pending,
                            long long prompt, long long *out) {
    PyObject *info = PyDict_GET_SIZE(infos) ? _PyDict_GetItem_KnownHash(infos, ep, hash) : NULL;
    long long u = prompt;
    if (info == NULL) {
        if (PyErr_Occurred()) return ERR;
    } else {
        Py_INCREF(info);
        long long match, size, cached;
        int rc = get_ll(info, &a_match_blocks, &match);
        if (rc == OK) rc = get_ll(info, &a_block_size_tokens, &size);
        Py_DECREF(info);
        if (rc != OK) return rc;
        if (__builtin_mul_overflow(match, size, &cached) || __builtin_sub_overflow(prompt, cached, &u)) return NOFIT;
    }
    long long e = u > 0 ? u : 0;
    if (pending) { /* ``backlog.get(ep.metadata.name, 0)`` */
        PyObject *meta = attr_get(ep, &a_metadata);
        if (meta == NULL) return ERR;
        PyObject *name = attr_get(meta, &a_name);
        Py_DECREF(meta);
        if (name == NULL) return ERR;
        PyObject *b = PyDict_GetItemWithError(backlog, name);
        Py_DECREF(name);
        if (b == NULL) {
            if (PyErr_Occurred()) return ERR;
        } else {
            long long x;
            int rc = as_ll(b, &x); /* ``b`` is the dict's: no Python code runs until it is read */
            if (rc != OK) return rc;
            if (__builtin_add_overflow(e, x, &e)) return NOFIT;
        }
    }
    *out = e;
    return OK;
}

/* prefill-load-scorer's score of each endpoint. */
static int prefill_scores(PyObject **eps, const Py_hash_t *hashes, Py_ssize_t n, PyObject *infos,
                          PyObject *backlog, long long prompt, long long *est, double *out) {
    int pending = PyDict_GET_SIZE(backlog) != 0;
    long long lo = -1, hi = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ep = eps[i];
        long long e;
        Py_INCREF(ep);
        int rc = prefill_estimate(ep, hashes[i], infos, backlog, pending, prompt, &e);
        Py_DECREF(ep);
        if (rc != OK) return rc;
        est[i] = e;
        if (e > hi) hi = e; /* the Python loop's bounds, ``lo = hi = -1`` start included */
        if (e < lo || lo < 0) lo = e;
    }
    if (hi == lo) {
        for (Py_ssize_t i = 0; i < n; i++) out[i] = 1.0;
        return OK;
    }
    long long span_i;
    if (__builtin_sub_overflow(hi, lo, &span_i)) return NOFIT;
    /* ``float(int)`` and ``int / float`` round the int to the nearest double, as C's conversion
     * does in the default rounding mode: exact or not, the same double */
    double span = (double)span_i;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long d;
        if (__builtin_sub_overflow(hi, est[i], &d)) return NOFIT;
        out[i] = (double)d / span;
    }
    return OK;
}

/* Plan.totals(eps, partial, cached, prefix_infos, loads, precise_infos, backlog, prompt): the
 * prefill scorer reads ``precise_infos`` when it is not empty, else ``prefix_infos`` (its
 * ``attributes(PRECISE_PREFIX_MATCH) or attributes(PREFIX_MATCH)``). */
static PyObject *plan_totals(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "totals() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *seq = args[0], *partial = args[1], *cached = args[2], *prefix = args[3], *loads = args[4],
             *prefill = args[5], *backlog = args[6], *prompt_obj = args[7];
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n == 0) Py_RETURN_NONE; /* the caller raised already; never scored here */
    PyObject **partial_items = NULL;
    if (partial != Py_None) {
        int rc = check_floats(partial, n, &partial_items);
        if (rc == ERR) return NULL;
        if (rc == NOFIT) Py_RETURN_NONE;
    }
    long long prompt = 0;
    int needs[OP_KINDS] = {0, 0, 0, 0};
    for (Py_ssize_t k = 0; k < self->nops; k++) needs[self->ops[k].kind] = 1;
    if (needs[OP_CACHED] && !PyList_CheckExact(cached) && !PyTuple_CheckExact(cached)) Py_RETURN_NONE;
    if (needs[OP_PREFIX] && !PyDict_CheckExact(prefix)) Py_RETURN_NONE;
    if (needs[OP_TOKEN] && !PyDict_CheckExact(loads)) Py_RETURN_NONE;
    if (needs[OP_PREFILL]) {
        if (!PyDict_CheckExact(prefill) || !PyDict_CheckExact(prefix) || !PyDict_CheckExact(backlog) ||
            !PyLong_CheckExact(prompt_obj))
            Py_RETURN_NONE;
        if (PyDict_GET_SIZE(prefill) == 0) prefill = prefix; /* ``precise or approximate`` */
        int rc = as_ll(prompt_obj, &prompt);
        if (rc == ERR) return NULL;
        if (rc == NOFIT) Py_RETURN_NONE;
    }

    double stack_acc[STACK_N], stack_s[STACK_N];
    long long stack_est[STACK_N];
    Py_hash_t stack_hashes[STACK_N];
    double *acc = stack_acc, *s = stack_s;
    long long *est = stack_est;
    Py_hash_t *hashes = stack_hashes;
    void *heap = NULL;
    PyObject *result = NULL;
    int status = OK;
    if (n > STACK_N) {
        heap = PyMem_Malloc((size_t)n * (2 * sizeof(double) + sizeof(long long) + sizeof(Py_hash_t)));
        if (heap == NULL) return PyErr_NoMemory();
        acc = (double *)heap;
        s = acc + n;
        est = (long long *)(s + n);
        hashes = (Py_hash_t *)(est + n);
    }
    /* ``partial`` read first: from here on Python code may run (an allocation's collection) */
    int have = partial_items != NULL;
    if (have) {
        for (Py_ssize_t i = 0; i < n; i++) acc[i] = PyFloat_AS_DOUBLE(partial_items[i]);
    }
    /* A list of endpoints is copied (a tuple is held): an attribute read or a lookup that ran
     * Python code could change a list under the loop. */
    seq = PyList_CheckExact(seq) ? PyList_AsTuple(seq) : Py_NewRef(seq);
    if (seq == NULL) {
        PyMem_Free(heap);
        return NULL;
    }
    PyObject **eps = ((PyTupleObject *)seq)->ob_item;
    /* Each endpoint hashed once for the three dicts keyed by it (``dict.get`` hashes per call:
     * the same value, an identity hash for ``Endpoint``). */
    if (needs[OP_PREFIX] || needs[OP_TOKEN] || needs[OP_PREFILL]) {
        for (Py_ssize_t i = 0; i < n; i++) {
            hashes[i] = PyObject_Hash(eps[i]);
            if (hashes[i] == -1) {
                status = ERR;
                break;
            }
        }
    }
    for (Py_ssize_t k = 0; k < self->nops && status == OK; k++) {
        const Op *op = &self->ops[k];
        switch (op->kind) {
        case OP_CACHED: {
            Py_ssize_t size = PyList_CheckExact(cached) ? PyList_GET_SIZE(cached) : PyTuple_GET_SIZE(cached);
            if (op->slot >= size) {
                PyErr_SetString(PyExc_IndexError, "list index out of range");
                status = ERR;
                break;
            }
            PyObject *list = PyList_CheckExact(cached) ? PyList_GET_ITEM(cached, op->slot)
                                                       : PyTuple_GET_ITEM(cached, op->slot);
            PyObject **items;
            status = check_floats(list, n, &items);
            if (status != OK) break;
            for (Py_ssize_t i = 0; i < n; i++) s[i] = PyFloat_AS_DOUBLE(items[i]);
            break;
        }
        case OP_PREFIX:
            status = prefix_scores(eps, hashes, n, prefix, s);
            break;
        case OP_TOKEN:
            status = token_scores(eps, hashes, n, loads, op->cap, s);
            break;
        case OP_PREFILL:
            status = prefill_scores(eps, hashes, n, prefill, backlog, prompt, est, s);
            break;
        }
        if (status != OK) break;
        double w = op->weight;
        if (have) {
            for (Py_ssize_t i = 0; i < n; i++) {
                double x = s[i] * w;
                acc[i] = acc[i] + x;
            }
        } else {
            for (Py_ssize_t i = 0; i < n; i++) acc[i] = s[i] * w;
            have = 1;
        }
    }
    if (status == OK) {
        result = PyList_New(n);
        if (result != NULL) {
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *f = PyFloat_FromDouble(have ? acc[i] : 0.0);
                if (f == NULL) {
                    Py_CLEAR(result);
                    break;
                }
                PyList_SET_ITEM(result, i, f);
            }
        }
    } else if (status == NOFIT) {
        result = Py_NewRef(Py_None);
    }
    PyMem_Free(heap);
    Py_DECREF(seq);
    return result;
}

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *ops_arg;
    static char *kwlist[] = {"ops", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Plan", kwlist, &ops_arg)) return NULL;
    PyObject *ops = PySequence_Tuple(ops_arg);
    if (ops == NULL) return NULL;
    Py_ssize_t nops = PyTuple_GET_SIZE(ops);
    Plan *self = (Plan *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(ops);
        return NULL;
    }
    self->ops = PyMem_Calloc(nops ? (size_t)nops : 1, sizeof(Op));
    if (self->ops == NULL) {
        Py_DECREF(ops);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < nops; k++) {
        Op *op = &self->ops[k];
        int kind;
        Py_ssize_t slot;
        double weight, cap;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(ops, k), "indd:Plan op", &kind, &slot, &weight, &cap)) {
            Py_DECREF(ops);
            Py_DECREF(self);
            return NULL;
        }
        if (kind < 0 || kind >= OP_KINDS || slot < 0 || (kind == OP_TOKEN && !(cap > 0.0))) {
            PyErr_Format(PyExc_ValueError, "Plan op %zd: kind in 0..3, slot >= 0, cap > 0 for a token op", k);
            Py_DECREF(ops);
            Py_DECREF(self);
            return NULL;
        }
        op->kind = kind;
        op->slot = slot;
        op->weight = weight;
        op->cap = cap;
    }
    self->nops = nops;
    Py_DECREF(ops);
    return (PyObject *)self;
}

static void plan_dealloc(Plan *self) {
    PyMem_Free(self->ops);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *plan_len(Plan *self, PyObject *Py_UNUSED(ignored)) { return PyLong_FromSsize_t(self->nops); }

static PyMethodDef plan_methods[] = {
    {"totals", (PyCFunction)(void (*)(void))plan_totals, METH_FASTCALL,
     "totals(eps, partial, cached, prefix_infos, loads, precise_infos, backlog, prompt) -> list[float] | None:\n"
     "every endpoint's weighted total, or None when the Python path must decide."},
    {"ops", (PyCFunction)plan_len, METH_NOARGS, "ops() -> int: how many ops the plan runs."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "epp.scheduling._kernel.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(ops): a profile's scorers as ops (kind, slot, weight, cap), compiled once.",
    .tp_methods = plan_methods,
    .tp_new = plan_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernel", "The fused plan's scoring in C (see kernel.py).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernel(void) {
    struct {
        Attr *attr;
        const char *text;
    } names[] = {
        {&a_match_blocks, "match_blocks"}, {&a_total_blocks, "total_blocks"},
        {&a_block_size_tokens, "block_size_tokens"}, {&a_tokens, "tokens"},
        {&a_metadata, "metadata"}, {&a_name, "name"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (names[i].attr->name == NULL) {
            names[i].attr->name = PyUnicode_InternFromString(names[i].text);
            if (names[i].attr->name == NULL) return NULL;
        }
    }
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0 ||
        PyModule_AddIntConstant(m, "CACHED", OP_CACHED) < 0 || PyModule_AddIntConstant(m, "PREFIX", OP_PREFIX) < 0 ||
        PyModule_AddIntConstant(m, "TOKEN", OP_TOKEN) < 0 || PyModule_AddIntConstant(m, "PREFILL", OP_PREFILL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef EPP_NATIVE_SOURCE_SHA256
    if (PyModule_AddStringConstant(m, "SOURCE_SHA256", EPP_NATIVE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
