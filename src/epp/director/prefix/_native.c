/* The approximate prefix index's per-request loops in C (epp.director.prefix.native says why).
 *
 * A leaf: it includes nothing of the EPP and works on the Python containers the index already
 * keeps (the reverse index and intern dicts, the per-server OrderedDicts), so every other user of
 * them is unchanged.  Each function is the same as its pure-Python twin in native.py; the tests
 * in tests/director/prefix/test_native.py compare the two (and the hash with the xxhash package).
 *
 * Reference counting: every object used across a call that can allocate (and so run a garbage
 * collection, and so a finaliser) is held by a strong reference.  Hashes must be exact ints,
 * whose hashing and comparison run no Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* XXH64, from the public specification (xxhash doc/xxhash_spec.md, "XXH64 Algorithm"). */
#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t read32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xround(uint64_t acc, uint64_t lane) {
    acc += lane * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t xmerge(uint64_t acc, uint64_t val) {
    acc ^= xround(0, val);
    return acc * P1 + P4;
}

static uint64_t xxh64(const unsigned char *p, size_t len, uint64_t seed) {
    const unsigned char *end = p + len;
    uint64_t h;
    if (len >= 32) {
        const unsigned char *limit = end - 32;
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        do {
            v1 = xround(v1, read64(p));
            v2 = xround(v2, read64(p + 8));
            v3 = xround(v3, read64(p + 16));
            v4 = xround(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xmerge(h, v1);
        h = xmerge(h, v2);
        h = xmerge(h, v3);
        h = xmerge(h, v4);
    } else {
        h = seed + P5;
    }
    h += (uint64_t)len;
    while (end - p >= 8) {
        h ^= xround(0, read64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (end - p >= 4) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* The same TypeError as a Python function called with the wrong number of arguments. */
static int check_nargs(const char *name, Py_ssize_t want, Py_ssize_t nargs) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
    return -1;
}

/* An int argument as a Py_ssize_t, saturated: the chain only compares it with lengths. */
static int arg_size(PyObject *o, const char *name, Py_ssize_t *out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", name, Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow > 0 || v > PY_SSIZE_T_MAX) v = PY_SSIZE_T_MAX;
    else if (overflow < 0 || v < -PY_SSIZE_T_MAX) v = -PY_SSIZE_T_MAX;
    *out = (Py_ssize_t)v;
    return 0;
}

static PyObject *chain_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs("chain_hashes", 4, nargs) < 0) return NULL;
    Py_ssize_t block, max_blocks;
    if (arg_size(args[1], "block_bytes", &block) < 0 || arg_size(args[2], "max_blocks", &max_blocks) < 0)
        return NULL;
    if (!PyLong_Check(args[3])) {
        PyErr_Format(PyExc_TypeError, "seed must be int, not %.100s", Py_TYPE(args[3])->tp_name);
        return NULL;
    }
    uint64_t prev = PyLong_AsUnsignedLongLongMask(args[3]); /* mod 2**64, as xxhash's seed */
    if (prev == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "data must be a bytes-like object, not %.100s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    Py_ssize_t n = view.len;
    if (block <= 0 || n < block || max_blocks <= 0) {
        PyBuffer_Release(&view);
        return PyList_New(0);
    }
    if (max_blocks < n / block + (n % block != 0)) n = block * max_blocks; /* the product is < n */
    Py_ssize_t full = n / block, tail = n % block;
    PyObject *out = PyList_New(full + (tail > 0));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    for (Py_ssize_t i = 0; i < full; i++, p += block) {
        prev = xxh64(p, (size_t)block, prev);
        PyObject *v = PyLong_FromUnsignedLongLong(prev);
        if (v == NULL) goto fail;
        PyList_SET_ITEM(out, i, v);
    }
    if (tail > 0) {
        PyObject *v = PyLong_FromUnsignedLongLong(xxh64(p, (size_t)tail, prev));
        if (v == NULL) goto fail;
        PyList_SET_ITEM(out, full, v);
    }
    PyBuffer_Release(&view);
    return out;
fail:
    PyBuffer_Release(&view);
    Py_DECREF(out); /* unset items are NULL, which list dealloc skips */
    return NULL;
}

/* Hashes as a list or tuple (a new reference; another sequence is copied into a list), or NULL.
 * The length of a list is read again at each step. */
static PyObject *as_hashes(PyObject *hashes) {
    if (PyList_Check(hashes) || PyTuple_Check(hashes)) {
        Py_INCREF(hashes);
        return hashes;
    }
    if (!PySequence_Check(hashes)) {
        PyErr_Format(PyExc_TypeError, "hashes must be a sequence of int, not %.100s", Py_TYPE(hashes)->tp_name);
        return NULL;
    }
    return PySequence_List(hashes);
}

static inline Py_ssize_t seq_len(PyObject *s) {
    return PyList_Check(s) ? PyList_GET_SIZE(s) : PyTuple_GET_SIZE(s);
}

/* hashes[i] as a new reference, or NULL with TypeError when it is not an exact int. */
static PyObject *hash_at(PyObject *s, Py_ssize_t i) {
    PyObject *h = PyList_Check(s) ? PyList_GET_ITEM(s, i) : PyTuple_GET_ITEM(s, i);
    if (!PyLong_CheckExact(h)) {
        PyErr_Format(PyExc_TypeError, "hashes[%zd] must be int, not %.100s", i, Py_TYPE(h)->tp_name);
        return NULL;
    }
    Py_INCREF(h);
    return h;
}

static int check_dict(PyObject *o, const char *name) {
    if (PyDict_CheckExact(o)) return 0;
    PyErr_Format(PyExc_TypeError, "%s must be a dict, not %.100s", name, Py_TYPE(o)->tp_name);
    return -1;
}

static int check_lru(PyObject *o) {
    if (PyODict_CheckExact(o)) return 0;
    PyErr_Format(PyExc_TypeError, "lru must be a collections.OrderedDict, not %.100s", Py_TYPE(o)->tp_name);
    return -1;
}

static PyObject *zero; /* the int 0, made at import */

/* A holder mask (a non-negative int of any size) added ``run`` times to per-slot counts. */
typedef struct {
    Py_ssize_t *c;
    Py_ssize_t top; /* slots [0, top) are valid */
    Py_ssize_t cap;
    Py_ssize_t stack[64];
} Counts;

static int counts_add_word(Counts *cs, uint64_t word, Py_ssize_t base, Py_ssize_t run) {
    while (word) {
        Py_ssize_t slot = base + __builtin_ctzll(word);
        word &= word - 1;
        if (slot >= cs->top) {
            if (slot >= cs->cap) {
                Py_ssize_t cap = (slot + 64) & ~(Py_ssize_t)63;
                Py_ssize_t *c = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
                if (c == NULL) {
                    PyErr_NoMemory();
                    return -1;
                }
                memcpy(c, cs->c, (size_t)cs->top * sizeof(Py_ssize_t));
                if (cs->c != cs->stack) PyMem_Free(cs->c);
                cs->c = c;
                cs->cap = cap;
            }
            memset(cs->c + cs->top, 0, (size_t)(slot + 1 - cs->top) * sizeof(Py_ssize_t));
            cs->top = slot + 1;
        }
        cs->c[slot] += run;
    }
    return 0;
}

static int counts_add(Counts *cs, PyObject *mask, Py_ssize_t run) {
    if (!PyLong_CheckExact(mask)) {
        PyErr_Format(PyExc_TypeError, "index values must be int masks, not %.100s", Py_TYPE(mask)->tp_name);
        return -1;
    }
    uint64_t word = PyLong_AsUnsignedLongLong(mask);
    if (!(word == (uint64_t)-1 && PyErr_Occurred())) return counts_add_word(cs, word, 0, run);
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear(); /* more than 64 slots (or negative): 64 bits at a time */
    int negative = PyObject_RichCompareBool(mask, zero, Py_LT);
    if (negative != 0) {
        if (negative > 0) PyErr_SetString(PyExc_ValueError, "index values must be non-negative masks");
        return -1;
    }
    PyObject *shift = PyLong_FromLong(64);
    if (shift == NULL) return -1;
    Py_INCREF(mask);
    int rc = 0;
    for (Py_ssize_t base = 0; rc == 0 && PyObject_IsTrue(mask); base += 64) {
        word = PyLong_AsUnsignedLongLongMask(mask);
        PyObject *rest = PyNumber_Rshift(mask, shift);
        Py_SETREF(mask, rest);
        rc = (mask == NULL || (word == (uint64_t)-1 && PyErr_Occurred())) ? -1 : counts_add_word(cs, word, base, run);
    }
    Py_XDECREF(mask);
    Py_DECREF(shift);
    return rc;
}

static PyObject *match(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs("match", 2, nargs) < 0) return NULL;
    PyObject *index = args[0], *hashes;
    if (check_dict(index, "index") < 0 || (hashes = as_hashes(args[1])) == NULL) return NULL;
    Counts cs;
    cs.c = cs.stack;
    cs.top = 0;
    cs.cap = 64;
    PyObject *out = NULL, *prev = NULL; /* prev: the current run's mask, a strong reference */
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < seq_len(hashes); i++) {
        PyObject *h = hash_at(hashes, i);
        if (h == NULL) goto done;
        PyObject *mask = PyDict_GetItemWithError(index, h);
        Py_DECREF(h);
        if (mask == NULL) {
            if (PyErr_Occurred()) goto done;
            break; /* the first block nobody holds ends the walk */
        }
        if (mask == prev) { /* masks are interned: a run of one holder set is one object */
            run++;
            continue;
        }
        Py_INCREF(mask);
        if (prev != NULL && counts_add(&cs, prev, run) < 0) {
            Py_DECREF(mask);
            goto done;
        }
        Py_XSETREF(prev, mask);
        run = 1;
    }
    if (prev != NULL && counts_add(&cs, prev, run) < 0) goto done;
    out = PyDict_New();
    if (out == NULL) goto done;
    for (Py_ssize_t slot = 0; slot < cs.top; slot++) {
        if (cs.c[slot] == 0) continue;
        PyObject *k = PyLong_FromSsize_t(slot), *v = PyLong_FromSsize_t(cs.c[slot]);
        int rc = (k == NULL || v == NULL) ? -1 : PyDict_SetItem(out, k, v);
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    Py_XDECREF(prev);
    Py_DECREF(hashes);
    if (cs.c != cs.stack) PyMem_Free(cs.c);
    return out;
}

static PyObject *move_to_end; /* OrderedDict.move_to_end and .popitem, unbound: no C API exists */
static PyObject *popitem;

/* Drop ``count`` least recently used hashes of the server whose bit ``clear`` does not have. */
static int evict_n(PyObject *index, PyObject *intern, PyObject *lru, PyObject *clear, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *call[2] = {lru, Py_False};
        PyObject *item = PyObject_Vectorcall(popitem, call, 2, NULL);
        if (item == NULL) return -1;
        PyObject *h = PyTuple_GET_ITEM(item, 0);
        Py_INCREF(h);
        Py_DECREF(item);
        PyObject *old = PyDict_GetItemWithError(index, h);
        if (old == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, h);
            Py_DECREF(h);
            return -1;
        }
        PyObject *mask = PyNumber_And(old, clear);
        if (mask == NULL) {
            Py_DECREF(h);
            return -1;
        }
        int rc, keep = PyObject_IsTrue(mask);
        if (keep > 0) {
            PyObject *interned = PyDict_SetDefault(intern, mask, mask);
            Py_XINCREF(interned);
            rc = interned == NULL ? -1 : PyDict_SetItem(index, h, interned);
            Py_XDECREF(interned);
        } else {
            rc = keep < 0 ? -1 : PyDict_DelItem(index, h);
        }
        Py_DECREF(mask);
        Py_DECREF(h);
        if (rc < 0) return -1;
    }
    return 0;
}

static int check_bit(PyObject *bit) {
    if (!PyLong_CheckExact(bit)) {
        PyErr_Format(PyExc_TypeError, "bit must be int, not %.100s", Py_TYPE(bit)->tp_name);
        return -1;
    }
    int positive = PyObject_RichCompareBool(bit, zero, Py_GT);
    if (positive == 0) PyErr_SetString(PyExc_ValueError, "bit must be positive");
    return positive > 0 ? 0 : -1;
}

static PyObject *evict(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs("evict", 5, nargs) < 0) return NULL;
    Py_ssize_t count;
    if (check_dict(args[0], "index") < 0 || check_dict(args[1], "intern") < 0 || check_lru(args[2]) < 0 ||
        check_bit(args[3]) < 0 || arg_size(args[4], "count", &count) < 0)
        return NULL;
    PyObject *clear = PyNumber_Invert(args[3]);
    if (clear == NULL) return NULL;
    int rc = evict_n(args[0], args[1], args[2], clear, count);
    Py_DECREF(clear);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* The insertion loop of add: the number of hashes newly inserted, or -1. */
static Py_ssize_t insert(PyObject *index, PyObject *intern, PyObject *lru, PyObject *hashes, PyObject *bit) {
    Py_ssize_t added = 0;
    for (Py_ssize_t i = 0; i < seq_len(hashes); i++) {
        PyObject *h = hash_at(hashes, i);
        if (h == NULL) return -1;
        int held = PyDict_Contains(lru, h); /* an OrderedDict keeps its keys in its dict */
        if (held != 0) {
            PyObject *res = NULL;
            if (held > 0) {
                PyObject *call[2] = {lru, h};
                res = PyObject_Vectorcall(move_to_end, call, 2, NULL);
            }
            Py_DECREF(h);
            if (res == NULL) return -1;
            Py_DECREF(res);
            continue;
        }
        if (PyODict_SetItem(lru, h, Py_None) < 0) {
            Py_DECREF(h);
            return -1;
        }
        added++;
        PyObject *old = PyDict_GetItemWithError(index, h), *mask;
        if (old != NULL) {
            mask = PyNumber_Or(old, bit);
        } else if (PyErr_Occurred()) {
            mask = NULL;
        } else {
            mask = bit;
            Py_INCREF(mask);
        }
        PyObject *interned = mask == NULL ? NULL : PyDict_SetDefault(intern, mask, mask);
        Py_XINCREF(interned);
        int rc = interned == NULL ? -1 : PyDict_SetItem(index, h, interned);
        Py_XDECREF(interned);
        Py_XDECREF(mask);
        Py_DECREF(h);
        if (rc < 0) return -1;
    }
    return added;
}

static PyObject *add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs("add", 6, nargs) < 0) return NULL;
    PyObject *index = args[0], *intern = args[1], *lru = args[2], *bit = args[4], *hashes;
    Py_ssize_t capacity;
    if (check_dict(index, "index") < 0 || check_dict(intern, "intern") < 0 || check_lru(lru) < 0 ||
        check_bit(bit) < 0 || arg_size(args[5], "capacity", &capacity) < 0 ||
        (hashes = as_hashes(args[3])) == NULL)
        return NULL;
    Py_ssize_t before = PyDict_GET_SIZE(lru);
    Py_ssize_t added = insert(index, intern, lru, hashes, bit);
    Py_DECREF(hashes);
    if (added < 0) return NULL;
    Py_ssize_t over = PyDict_GET_SIZE(lru) - capacity;
    if (over > 0) {
        PyObject *clear = PyNumber_Invert(bit);
        if (clear == NULL) return NULL;
        int rc = evict_n(index, intern, lru, clear, over);
        Py_DECREF(clear);
        if (rc < 0) return NULL;
    }
    return PyLong_FromSsize_t(PyDict_GET_SIZE(lru) - before);
}

static PyObject *s_role, *s_content, *s_system, *s_get; /* interned at import */
/* {"role": None, "content": None} and {"content": None}: a kept message is a copy of one with
 * its values replaced (a small dict's copy clones its key table: cheaper than two inserts). */
static PyObject *with_role, *without_role;

/* m.get(key) as a new reference: a plain dict read directly, a subclass through its own get. */
static PyObject *get_field(PyObject *m, PyObject *key) {
    if (!PyDict_CheckExact(m)) return PyObject_CallMethodOneArg(m, s_get, key);
    PyObject *v = PyDict_GetItemWithError(m, key);
    if (v == NULL) {
        if (PyErr_Occurred()) return NULL;
        v = Py_None;
    }
    Py_INCREF(v);
    return v;
}

/* One kept message: {"role": role, "content": content} when role is true, else {"content": ...}. */
static PyObject *kept_message(PyObject *m) {
    PyObject *role = get_field(m, s_role);
    if (role == NULL) return NULL;
    PyObject *d = NULL, *content = NULL;
    int truth = PyObject_IsTrue(role);
    if (truth < 0 || (d = PyDict_Copy(truth ? with_role : without_role)) == NULL) goto fail;
    if (truth && PyDict_SetItem(d, s_role, role) < 0) goto fail;
    if ((content = get_field(m, s_content)) == NULL || PyDict_SetItem(d, s_content, content) < 0) goto fail;
    Py_DECREF(role);
    Py_DECREF(content);
    return d;
fail:
    Py_DECREF(role);
    Py_XDECREF(content);
    Py_XDECREF(d);
    return NULL;
}

static PyObject *kept_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs("kept_messages", 2, nargs) < 0) return NULL;
    PyObject *messages = args[0], *system = args[1], *d;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    if (system != Py_None) {
        if ((d = PyDict_New()) == NULL) goto fail;
        int rc = (PyDict_SetItem(d, s_role, s_system) < 0 || PyDict_SetItem(d, s_content, system) < 0 ||
                  PyList_Append(out, d) < 0);
        Py_DECREF(d);
        if (rc) goto fail;
    }
    if (PyList_CheckExact(messages)) { /* as parsed: no iterator; its length read at each step */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(messages); i++) {
            PyObject *m = PyList_GET_ITEM(messages, i);
            if (!PyDict_Check(m)) continue;
            Py_INCREF(m);
            d = kept_message(m);
            Py_DECREF(m);
            int rc = d == NULL ? -1 : PyList_Append(out, d);
            Py_XDECREF(d);
            if (rc < 0) goto fail;
        }
        return out;
    }
    if (!PyList_Check(messages)) return out;
    PyObject *it = PyObject_GetIter(messages), *m; /* a list subclass: its own iterator */
    if (it == NULL) goto fail;
    while ((m = PyIter_Next(it)) != NULL) {
        if (!PyDict_Check(m)) {
            Py_DECREF(m);
            continue;
        }
        d = kept_message(m);
        Py_DECREF(m);
        int rc = d == NULL ? -1 : PyList_Append(out, d);
        Py_XDECREF(d);
        if (rc < 0) {
            Py_DECREF(it);
            goto fail;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"kept_messages", (PyCFunction)(void (*)(void))kept_messages, METH_FASTCALL,
     "kept_messages(messages, system) -> list[dict]: the messages as the prefix cache sees them."},
    {"chain_hashes", (PyCFunction)(void (*)(void))chain_hashes, METH_FASTCALL,
     "chain_hashes(data, block_bytes, max_blocks, seed) -> list[int]: the chained XXH64 block hashes."},
    {"match", (PyCFunction)(void (*)(void))match, METH_FASTCALL,
     "match(index, hashes) -> dict[int, int]: slot -> blocks held, walking to the first miss."},
    {"add", (PyCFunction)(void (*)(void))add, METH_FASTCALL,
     "add(index, intern, lru, hashes, bit, capacity) -> int: insert, evict to capacity; the change "
     "in lru's size."},
    {"evict", (PyCFunction)(void (*)(void))evict, METH_FASTCALL,
     "evict(index, intern, lru, bit, count) -> None: drop lru's count least recently used hashes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The prefix index's loops in C (see native.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (zero == NULL) {
        zero = PyLong_FromLong(0);
        if (zero == NULL) return NULL;
    }
    if (move_to_end == NULL) {
        move_to_end = PyObject_GetAttrString((PyObject *)&PyODict_Type, "move_to_end");
        if (move_to_end == NULL) return NULL;
    }
    if (popitem == NULL) {
        popitem = PyObject_GetAttrString((PyObject *)&PyODict_Type, "popitem");
        if (popitem == NULL) return NULL;
    }
    if (s_role == NULL) {
        s_role = PyUnicode_InternFromString("role");
        s_content = PyUnicode_InternFromString("content");
        s_system = PyUnicode_InternFromString("system");
        s_get = PyUnicode_InternFromString("get");
        if (s_role == NULL || s_content == NULL || s_system == NULL || s_get == NULL) return NULL;
        with_role = PyDict_New();
        without_role = PyDict_New();
        if (with_role == NULL || without_role == NULL || PyDict_SetItem(with_role, s_role, Py_None) < 0 ||
            PyDict_SetItem(with_role, s_content, Py_None) < 0 || PyDict_SetItem(without_role, s_content, Py_None) < 0)
            return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
#ifdef EPP_NATIVE_SOURCE_SHA256
    if (PyModule_AddStringConstant(m, "SOURCE_SHA256", EPP_NATIVE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
