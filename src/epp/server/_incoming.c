/* ext_proc ProcessingRequest bytes -> the session's Incoming tuple, in C (epp.server.incoming
 * says why).
 *
 * A leaf: it includes nothing of the EPP.  It decodes the shapes Envoy sends on every request
 * (request/response headers, request/response body chunks, the protocol_config of the first
 * message, and the empty metadata_context Envoy adds to every message) straight into the values
 * the session reads: a dict of lower-cased header names, the body bytes, end_of_stream and the
 * body modes.  Everything else -- trailers, metadata_context with content, attributes, a field repeated where protobuf would merge, a wire type it does not expect, any
 * malformed or invalid-UTF-8 input -- is left to the bound fallback (upb), which decodes it or
 * raises as it always did.  So this module never accepts what upb rejects, and never answers
 * differently: tests/server/test_incoming.py checks both on hypothesis input.
 *
 * Field numbers, from envoy/service/ext_proc/v3/external_processor.proto and
 * envoy/config/core/v3/base.proto:
 *
 *     ProcessingRequest: request_headers=2 response_headers=3 request_body=4 response_body=5
 *                        request_trailers=6 response_trailers=7 metadata_context=8
 *                        attributes=9 observability_mode=10 protocol_config=11
 *     HttpHeaders: headers=1 attributes=2 end_of_stream=3
 *     HttpBody: body=1 end_of_stream=2 end_of_stream_without_message=3 grpc_message_compressed=4
 *     ProtocolConfiguration: request_body_mode=1 response_body_mode=2
 *                            send_body_without_waiting_for_header_response=3
 *     HeaderMap: headers=1 (repeated)    HeaderValue: key=1 value=2 raw_value=3
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A parse either succeeds, leaves the input to the fallback, or fails with a Python error. */
enum { OK = 0, FALLBACK = 1, ERROR = -1 };

enum { VARINT = 0, FIXED64 = 1, LEN = 2, FIXED32 = 5 };

static PyTypeObject *incoming_type = NULL; /* Incoming(kind, headers, body, end_of_stream, config, metadata) */
static PyTypeObject *config_type = NULL;   /* ProtocolConfig(request_body_mode, response_body_mode, send_...) */
static PyObject *fallback = NULL;          /* bytes -> Incoming, upb's way */
static PyObject *s_lower = NULL;

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Reader;

static int read_varint(Reader *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return FALLBACK;
        unsigned char b = *r->p++;
        if (shift == 63 && b > 1) return FALLBACK; /* past 64 bits */
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return OK;
        }
    }
    return FALLBACK; /* more than 10 bytes */
}

/* The next field's number and wire type; FALLBACK at a malformed or out-of-range tag. */
static int read_tag(Reader *r, uint32_t *field, int *wire) {
    uint64_t tag;
    if (read_varint(r, &tag) != OK || tag > UINT32_MAX || (tag >> 3) == 0) return FALLBACK;
    *field = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    return OK;
}

static int read_len(Reader *r, Reader *sub) {
    uint64_t n;
    if (read_varint(r, &n) != OK || n > (uint64_t)(r->end - r->p)) return FALLBACK;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return OK;
}

/* Skip an unknown field; groups (wire types 3, 4) and invalid wire types go to the fallback. */
static int skip(Reader *r, int wire) {
    uint64_t v;
    Reader sub;
    switch (wire) {
    case VARINT:
        return read_varint(r, &v);
    case FIXED64:
        if (r->end - r->p < 8) return FALLBACK;
        r->p += 8;
        return OK;
    case LEN:
        return read_len(r, &sub);
    case FIXED32:
        if (r->end - r->p < 4) return FALLBACK;
        r->p += 4;
        return OK;
    default:
        return FALLBACK;
    }
}

/* A bool field (a varint, true when not 0). */
static int read_bool(Reader *r, int wire, int *out) {
    uint64_t v;
    if (wire != VARINT || read_varint(r, &v) != OK) return FALLBACK;
    *out = v != 0;
    return OK;
}

/* The names Envoy sends on (almost) every request and response, made once as interned strs: a
 * request's ~15 names then cost no allocation, and the director's lookups of them compare by
 * identity.  Any other name is made as it comes. */
static const char *const KNOWN_NAMES[] = {
    ":authority", ":path", ":method", ":scheme", ":status", "content-type", "content-length",
    "x-forwarded-for", "x-forwarded-proto", "x-envoy-external-address", "x-request-id",
    "user-agent", "accept", "accept-encoding", "authorization", "date", "server",
    "x-envoy-upstream-service-time", "transfer-encoding", "connection", "cache-control",
    "traceparent", "tracestate", "x-gateway-model-name", "x-gateway-inference-objective",
    "x-gateway-inference-fairness-id", "x-session-token",
};
#define N_KNOWN (sizeof(KNOWN_NAMES) / sizeof(KNOWN_NAMES[0]))
#define MAX_KNOWN 40 /* longer than any known name: not looked up */
static PyObject *known_strs[N_KNOWN];
static Py_ssize_t known_lens[N_KNOWN];

/* A header name as str.lower() makes it; NULL with *status FALLBACK for invalid UTF-8. */
static PyObject *header_name(const unsigned char *s, Py_ssize_t n, int *status) {
    int ascii = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] & 0x80) {
            ascii = 0;
            break;
        }
    }
    if (ascii) {
        unsigned char lower[MAX_KNOWN];
        if (n <= MAX_KNOWN) {
            for (Py_ssize_t i = 0; i < n; i++) {
                unsigned char c = s[i];
                lower[i] = (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
            }
            for (size_t k = 0; k < N_KNOWN; k++) {
                if (known_lens[k] == n && memcmp(KNOWN_NAMES[k], lower, (size_t)n) == 0)
                    return Py_NewRef(known_strs[k]);
            }
        }
        PyObject *out = PyUnicode_New(n, 127);
        if (out == NULL) return NULL;
        Py_UCS1 *d = PyUnicode_1BYTE_DATA(out);
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char c = s[i];
            d[i] = (c >= 'A' && c <= 'Z') ? (Py_UCS1)(c + 32) : c;
        }
        return out;
    }
    PyObject *raw = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    if (raw == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
        PyErr_Clear();
        *status = FALLBACK; /* upb rejects a string field that is not UTF-8 */
        return NULL;
    }
    PyObject *out = PyObject_CallMethodNoArgs(raw, s_lower);
    Py_DECREF(raw);
    return out;
}

/* One HeaderValue into ``out``: raw_value (invalid UTF-8 replaced) when not empty, else value. */
static int header_value(Reader *r, PyObject *out) {
    const unsigned char *key = NULL, *value = NULL, *raw = NULL;
    Py_ssize_t key_n = 0, value_n = 0, raw_n = 0;
    uint32_t field;
    int wire;
    while (r->p < r->end) {
        if (read_tag(r, &field, &wire) != OK) return FALLBACK;
        if (field >= 1 && field <= 3) {
            Reader s;
            if (wire != LEN || read_len(r, &s) != OK) return FALLBACK;
            if (field == 1) {
                if (key != NULL) return FALLBACK; /* a string field twice: upb checks each */
                key = s.p, key_n = s.end - s.p;
            } else if (field == 2) {
                if (value != NULL) return FALLBACK;
                value = s.p, value_n = s.end - s.p;
            } else {
                raw = s.p, raw_n = s.end - s.p; /* bytes: the last one wins */
            }
        } else if (skip(r, wire) != OK) {
            return FALLBACK;
        }
    }
    int status = OK;
    PyObject *name = header_name(key != NULL ? key : (const unsigned char *)"", key_n, &status);
    if (name == NULL) return status == FALLBACK ? FALLBACK : ERROR;
    PyObject *text = NULL;
    if (value != NULL) { /* a string field: upb rejects invalid UTF-8 even where raw_value wins */
        text = PyUnicode_DecodeUTF8((const char *)value, value_n, NULL);
        if (text == NULL) {
            Py_DECREF(name);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return ERROR;
            PyErr_Clear();
            return FALLBACK;
        }
    }
    if (raw_n > 0) {
        Py_XDECREF(text);
        text = PyUnicode_DecodeUTF8((const char *)raw, raw_n, NULL);
        if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            text = PyUnicode_DecodeUTF8((const char *)raw, raw_n, "replace");
        }
    } else if (text == NULL) {
        text = PyUnicode_New(0, 0);
    }
    if (text == NULL) {
        Py_DECREF(name);
        return ERROR;
    }
    int rc = PyDict_SetItem(out, name, text);
    Py_DECREF(name);
    Py_DECREF(text);
    return rc < 0 ? ERROR : OK;
}

/* A HeaderMap's headers into ``out`` (an occurrence more of the map appends, as protobuf merges). */
static int header_map(Reader *r, PyObject *out) {
    uint32_t field;
    int wire;
    while (r->p < r->end) {
        if (read_tag(r, &field, &wire) != OK) return FALLBACK;
        if (field == 1) {
            Reader s;
            if (wire != LEN || read_len(r, &s) != OK) return FALLBACK;
            int rc = header_value(&s, out);
            if (rc != OK) return rc;
        } else if (skip(r, wire) != OK) {
            return FALLBACK;
        }
    }
    return OK;
}

static int http_headers(Reader *r, PyObject *headers, int *eos) {
    uint32_t field;
    int wire;
    while (r->p < r->end) {
        if (read_tag(r, &field, &wire) != OK) return FALLBACK;
        if (field == 1) {
            Reader s;
            if (wire != LEN || read_len(r, &s) != OK) return FALLBACK;
            int rc = header_map(&s, headers);
            if (rc != OK) return rc;
        } else if (field == 2) {
            return FALLBACK; /* attributes: left to upb */
        } else if (field == 3) {
            if (read_bool(r, wire, eos) != OK) return FALLBACK;
        } else if (skip(r, wire) != OK) {
            return FALLBACK;
        }
    }
    return OK;
}

static int http_body(Reader *r, Reader *body, int *eos) {
    uint32_t field;
    int wire, ignored;
    while (r->p < r->end) {
        if (read_tag(r, &field, &wire) != OK) return FALLBACK;
        if (field == 1) {
            if (wire != LEN || read_len(r, body) != OK) return FALLBACK; /* bytes: the last wins */
        } else if (field == 2) {
            if (read_bool(r, wire, eos) != OK) return FALLBACK;
        } else if (field == 3 || field == 4) {
            if (read_bool(r, wire, &ignored) != OK) return FALLBACK;
        } else if (skip(r, wire) != OK) {
            return FALLBACK;
        }
    }
    return OK;
}

/* A tuple subclass (a NamedTuple) made from C, as tuple.__new__ would make it. */
static PyObject *named(PyTypeObject *type, Py_ssize_t n, PyObject **items) {
    PyObject *out = type->tp_alloc(type, n);
    if (out == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(out, i, items[i]); /* steals */
    return out;
}

/* The ProtocolConfig, or NULL: with an error set (ERROR), or without one (upb's to decode). */
static PyObject *protocol_config(Reader *r) {
    uint64_t request_mode = 0, response_mode = 0;
    int send_without_waiting = 0;
    uint32_t field;
    int wire;
    while (r->p < r->end) {
        if (read_tag(r, &field, &wire) != OK) return NULL;
        if (field == 1 || field == 2) {
            if (wire != VARINT || read_varint(r, field == 1 ? &request_mode : &response_mode) != OK)
                return NULL;
        } else if (field == 3) {
            if (read_bool(r, wire, &send_without_waiting) != OK) return NULL;
        } else if (skip(r, wire) != OK) {
            return NULL;
        }
    }
    /* open enums are int32: upb keeps the low 32 bits of the varint, signed */
    PyObject *items[3] = {
        PyLong_FromLong((int32_t)(uint32_t)request_mode),
        PyLong_FromLong((int32_t)(uint32_t)response_mode),
        PyBool_FromLong(send_without_waiting),
    };
    if (items[0] == NULL || items[1] == NULL) {
        for (int i = 0; i < 3; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    return named(config_type, 3, items);
}

/* The Incoming for ``data``, or NULL with *status FALLBACK (upb's to decode) or ERROR. */
static PyObject *parse(const unsigned char *data, Py_ssize_t size, int *status) {
    Reader r = {data, data + size}, msg = {NULL, NULL}, config = {NULL, NULL};
    uint32_t kind = 0, field;
    int wire, observed, empty_metadata = 0;
    *status = FALLBACK;
    if (incoming_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_incoming.bind() was not called");
        *status = ERROR;
        return NULL;
    }
    while (r.p < r.end) {
        if (read_tag(&r, &field, &wire) != OK) return NULL;
        if (field >= 2 && field <= 5) {
            if (kind != 0 || wire != LEN || read_len(&r, &msg) != OK) return NULL; /* merged, or oneof switched */
            kind = field;
        } else if (field == 11) {
            if (config.p != NULL || wire != LEN || read_len(&r, &config) != OK) return NULL;
        } else if (field == 10) {
            if (read_bool(&r, wire, &observed) != OK) return NULL;
        } else if (field == 8) { /* metadata_context: Envoy sends it empty on every message */
            Reader m;
            if (wire != LEN || read_len(&r, &m) != OK || m.p != m.end) return NULL; /* not empty: upb's */
            empty_metadata = 1;
        } else if (field >= 6 && field <= 9) {
            return NULL; /* trailers, attributes: upb's */
        } else if (skip(&r, wire) != OK) {
            return NULL;
        }
    }
    int eos = 0;
    PyObject *headers = NULL, *body = NULL, *cfg = NULL, *k = NULL, *metadata = NULL;
    if (kind == 2 || kind == 3) {
        if ((headers = PyDict_New()) == NULL || http_headers(&msg, headers, &eos) != OK) goto failed;
    } else if (kind == 4 || kind == 5) {
        Reader b = {NULL, NULL};
        if (http_body(&msg, &b, &eos) != OK) goto failed;
        body = PyBytes_FromStringAndSize((const char *)b.p, b.p == NULL ? 0 : b.end - b.p);
        if (body == NULL) goto failed;
    }
    if (config.p != NULL && (cfg = protocol_config(&config)) == NULL) goto failed;
    if (body == NULL && (body = PyBytes_FromStringAndSize(NULL, 0)) == NULL) goto failed;
    if ((k = PyLong_FromLong((long)kind)) == NULL) goto failed;
    if (empty_metadata && (metadata = PyDict_New()) == NULL) goto failed;
    if (headers == NULL) headers = Py_NewRef(Py_None);
    if (cfg == NULL) cfg = Py_NewRef(Py_None);
    if (metadata == NULL) metadata = Py_NewRef(Py_None);
    PyObject *items[6] = {k, headers, body, PyBool_FromLong(eos), cfg, metadata};
    PyObject *out = named(incoming_type, 6, items); /* steals the items, even when it fails */
    *status = out == NULL ? ERROR : OK;
    return out;
failed: /* a Python error set: ERROR; none: a shape left to upb */
    *status = PyErr_Occurred() ? ERROR : FALLBACK;
    Py_XDECREF(headers);
    Py_XDECREF(body);
    Py_XDECREF(cfg);
    Py_XDECREF(k);
    return NULL;
}

/* ``parse`` of any bytes-like object; bytes (every message the servers pass) without a buffer. */
static PyObject *parse_object(PyObject *data, int *status) {
    if (PyBytes_CheckExact(data))
        return parse((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), status);
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        *status = ERROR;
        return NULL;
    }
    PyObject *out = parse(view.buf, view.len, status);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *try_parse(PyObject *self, PyObject *data) {
    (void)self;
    int status;
    PyObject *out = parse_object(data, &status);
    if (out == NULL && status == FALLBACK) Py_RETURN_NONE;
    return out;
}

static PyObject *decode(PyObject *self, PyObject *data) {
    (void)self;
    int status;
    PyObject *out = parse_object(data, &status);
    if (out != NULL || status == ERROR) return out;
    return PyObject_CallOneArg(fallback, data);
}

/* bind(incoming_type, config_type, fallback): the NamedTuples to make, and who decodes the rest. */
static int check_named(PyObject *type, Py_ssize_t fields, const char *what) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type) ||
        ((PyTypeObject *)type)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "%s must be a NamedTuple class", what);
        return -1;
    }
    PyObject *names = PyObject_GetAttrString(type, "_fields");
    if (names == NULL) return -1;
    Py_ssize_t n = PyObject_Length(names);
    Py_DECREF(names);
    if (n != fields) {
        if (n >= 0) PyErr_Format(PyExc_TypeError, "%s must have %zd fields, not %zd", what, fields, n);
        return -1;
    }
    return 0;
}

static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "bind() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (check_named(args[0], 6, "incoming_type") < 0 || check_named(args[1], 3, "config_type") < 0) return NULL;
    if (!PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(incoming_type, (PyTypeObject *)args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(config_type, (PyTypeObject *)args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(fallback, args[2]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)decode, METH_O,
     "decode(data) -> Incoming: in C when it can, else by the bound fallback (which may raise)."},
    {"parse", (PyCFunction)try_parse, METH_O,
     "parse(data) -> Incoming | None: the C decoding alone; None where the fallback would decode."},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(incoming_type, config_type, fallback): the NamedTuples to build and the fallback decoder."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_incoming", "ext_proc requests decoded in C (see incoming.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__incoming(void) {
    if (s_lower == NULL) {
        s_lower = PyUnicode_InternFromString("lower");
        if (s_lower == NULL) return NULL;
        for (size_t k = 0; k < N_KNOWN; k++) {
            known_lens[k] = (Py_ssize_t)strlen(KNOWN_NAMES[k]);
            known_strs[k] = PyUnicode_InternFromString(KNOWN_NAMES[k]);
            if (known_strs[k] == NULL || known_lens[k] > MAX_KNOWN) return NULL;
        }
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
