/* stunnerd._relay: the CPython bindings of the relay core (relay.c). See stunnerd/native.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <string.h>
#include <time.h>

#include "relay.h"

typedef struct {
    PyObject_HEAD relay_engine engine;
    int ready;
    Py_buffer relay_ports; /* held while the engine reads it; .obj NULL when none */
} EngineObject;

static int engine_check(EngineObject *self) {
    if (!self->ready) {
        PyErr_SetString(PyExc_ValueError, "the relay engine is closed");
        return -1;
    }
    return 0;
}

static PyObject *raise_errno(int rc) {
    errno = -rc;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* (host, port[, flowinfo, scope_id]) -> sockaddr; -1 with an exception if not an IP address. */
static int parse_address(PyObject *tuple, struct sockaddr_storage *ss, relay_addr *out) {
    const char *host;
    int port;
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) < 2) {
        PyErr_SetString(PyExc_TypeError, "an address is a (host, port, ...) tuple");
        return -1;
    }
    PyObject *head = PyTuple_GetSlice(tuple, 0, 2);
    if (!head) return -1;
    int ok = PyArg_ParseTuple(head, "si", &host, &port);
    Py_DECREF(head);
    if (!ok) return -1;
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port %d is out of range", port);
        return -1;
    }
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
    } else {
        PyErr_Format(PyExc_ValueError, "%R is not an IP address", PyTuple_GET_ITEM(tuple, 0));
        return -1;
    }
    relay_addr_from_sockaddr(out, (struct sockaddr *)ss);
    return 0;
}

static int parse_ip(PyObject *text, relay_addr *out) {
    struct sockaddr_storage ss;
    PyObject *tuple = Py_BuildValue("(Oi)", text, 0);
    if (!tuple) return -1;
    int rc = parse_address(tuple, &ss, out);
    Py_DECREF(tuple);
    return rc;
}

/* A socket address as the socket module reports it. */
static PyObject *format_address(const struct sockaddr_storage *ss) {
    char text[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
        return Py_BuildValue("(si)", text, ntohs(in->sin_port));
    }
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    return Py_BuildValue("(siII)", text, ntohs(in6->sin6_port), ntohl(in6->sin6_flowinfo),
                         in6->sin6_scope_id);
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"listener_fd",  "queue_limit",   "queue_bytes",    "max_message",
                            "stranger_rate", "stranger_ips", "per_source",    "unsigned_rate",
                            "max_attributes", "shed_after", NULL};
    int fd;
    unsigned int queue_limit = 4096, max_message = RELAY_MAX_MESSAGE;
    unsigned int stranger_ips = RELAY_BUCKET_LIMIT, per_source = 0;
    unsigned int max_attributes = RELAY_MAX_ATTRIBUTES, shed_after = RELAY_SHED_AFTER;
    double stranger_rate = 0.0, unsigned_rate = 0.0;
    Py_ssize_t queue_bytes = 8 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|InIdIIdII", names, &fd, &queue_limit,
                                     &queue_bytes, &max_message, &stranger_rate, &stranger_ips,
                                     &per_source, &unsigned_rate, &max_attributes, &shed_after))
        return -1;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "the relay engine is already initialised");
        return -1;
    }
    if (queue_limit == 0 || queue_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "queue_limit and queue_bytes must be positive");
        return -1;
    }
    if (!(stranger_rate >= 0 && stranger_rate < 1e9) || stranger_ips == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "stranger_rate is a number >= 0 (0: no limit), stranger_ips >= 1");
        return -1;
    }
    if (!(unsigned_rate >= 0 && unsigned_rate < 1e9)) {
        PyErr_SetString(PyExc_ValueError, "unsigned_rate is a number >= 0 (0: no limit)");
        return -1;
    }
    if (max_message < 20) {
        PyErr_SetString(PyExc_ValueError, "max_message is at least a STUN header (20 bytes)");
        return -1;
    }
    int rc = relay_new(&self->engine, fd, queue_limit, (size_t)queue_bytes);
    if (rc < 0) {
        relay_free(&self->engine);
        raise_errno(rc);
        return -1;
    }
    self->engine.max_message = max_message;
    self->engine.max_attributes = max_attributes;
    self->engine.shed_after = shed_after ? shed_after : 1;
    relay_strangers(&self->engine, stranger_rate, stranger_ips, per_source);
    relay_unsigned_budget(&self->engine, unsigned_rate);
    self->ready = 1;
    return 0;
}

static PyObject *Engine_close(EngineObject *self, PyObject *unused) {
    if (self->ready) {
        Py_BEGIN_ALLOW_THREADS relay_stop(&self->engine);
        Py_END_ALLOW_THREADS relay_free(&self->engine);
        self->ready = 0;
    }
    if (self->relay_ports.obj) PyBuffer_Release(&self->relay_ports);
    Py_RETURN_NONE;
}

static void Engine_dealloc(EngineObject *self) {
    PyObject *rc = Engine_close(self, NULL);
    Py_XDECREF(rc);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Engine_start(EngineObject *self, PyObject *unused) {
    if (engine_check(self) < 0) return NULL;
    int rc = relay_start(&self->engine);
    if (rc < 0) return raise_errno(rc);
    Py_RETURN_NONE;
}

static PyObject *Engine_stop(EngineObject *self, PyObject *unused) {
    if (engine_check(self) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS relay_stop(&self->engine);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *Engine_fileno(EngineObject *self, PyObject *unused) {
    if (engine_check(self) < 0) return NULL;
    return PyLong_FromLong(self->engine.up_fd);
}

static PyObject *Engine_drain(EngineObject *self, PyObject *args) {
    unsigned int max = 256;
    if (!PyArg_ParseTuple(args, "|I", &max)) return NULL;
    if (engine_check(self) < 0) return NULL;
    if (max > 4096) max = 4096;
    relay_up *ups[4096];
    uint32_t n = relay_drain(&self->engine, ups, max);
    PyObject *list = PyList_New(n);
    for (uint32_t i = 0; i < n; i++) {
        relay_up *up = ups[i];
        if (list) {
            PyObject *addr = format_address(&up->from);
            PyObject *item = addr ? Py_BuildValue("(iKNy#)", up->source,
                                                  (unsigned long long)up->handle, addr,
                                                  (const char *)up->data, (Py_ssize_t)up->len)
                                  : NULL;
            if (!item) Py_CLEAR(list);
            else PyList_SET_ITEM(list, i, item);
        }
        free(up);
    }
    return list;
}

static PyObject *Engine_add_allocation(EngineObject *self, PyObject *args) {
    PyObject *client;
    int fd;
    double expires;
    unsigned long long stream = 0;
    if (!PyArg_ParseTuple(args, "O!id|K", &PyTuple_Type, &client, &fd, &expires, &stream))
        return NULL;
    if (engine_check(self) < 0) return NULL;
    struct sockaddr_storage ss;
    relay_addr addr;
    if (parse_address(client, &ss, &addr) < 0) return NULL;
    uint64_t handle;
    pthread_mutex_lock(&self->engine.lock);
    int known = !stream || relay_stream_of(&self->engine, stream) != NULL;
    pthread_mutex_unlock(&self->engine.lock);
    if (!known) {
        PyErr_SetString(PyExc_KeyError, "no such stream");
        return NULL;
    }
    int rc = relay_add_allocation(&self->engine, &addr, fd, expires, stream, &handle);
    if (rc == -EEXIST) {
        PyErr_Format(PyExc_ValueError, "client %R already has an allocation", client);
        return NULL;
    }
    if (rc < 0) return raise_errno(rc);
    return PyLong_FromUnsignedLongLong(handle);
}

static PyObject *result(int rc) {
    if (rc == -ENOENT) {
        PyErr_SetString(PyExc_KeyError, "no such allocation");
        return NULL;
    }
    if (rc < 0) return raise_errno(rc);
    Py_RETURN_NONE;
}

static PyObject *Engine_refresh_allocation(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    double expires;
    if (!PyArg_ParseTuple(args, "Kd", &handle, &expires) || engine_check(self) < 0) return NULL;
    return result(relay_refresh_allocation(&self->engine, handle, expires));
}

static PyObject *Engine_allocation_traffic(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    uint64_t t[4];
    if (!PyArg_ParseTuple(args, "K", &handle) || engine_check(self) < 0) return NULL;
    int rc = relay_allocation_traffic(&self->engine, handle, t);
    if (rc < 0) return raise_errno(rc);
    return Py_BuildValue("(KKKK)", (unsigned long long)t[0], (unsigned long long)t[1],
                         (unsigned long long)t[2], (unsigned long long)t[3]);
}

static PyObject *Engine_set_bandwidth(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    double rate, burst;
    if (!PyArg_ParseTuple(args, "Kdd", &handle, &rate, &burst) || engine_check(self) < 0)
        return NULL;
    return result(relay_set_bandwidth(&self->engine, handle, rate, burst));
}

static PyObject *Engine_remove_allocation(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    if (!PyArg_ParseTuple(args, "K", &handle) || engine_check(self) < 0) return NULL;
    return result(relay_remove_allocation(&self->engine, handle));
}

static PyObject *Engine_set_permission(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    PyObject *ip;
    double expires;
    relay_addr addr;
    if (!PyArg_ParseTuple(args, "KOd", &handle, &ip, &expires) || engine_check(self) < 0 ||
        parse_ip(ip, &addr) < 0)
        return NULL;
    return result(relay_set_permission(&self->engine, handle, &addr, expires));
}

static PyObject *Engine_remove_permission(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    PyObject *ip;
    relay_addr addr;
    if (!PyArg_ParseTuple(args, "KO", &handle, &ip) || engine_check(self) < 0 ||
        parse_ip(ip, &addr) < 0)
        return NULL;
    return result(relay_remove_permission(&self->engine, handle, &addr));
}

static PyObject *Engine_bind_channel(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    int number;
    PyObject *peer;
    double expires;
    struct sockaddr_storage ss;
    relay_addr addr;
    if (!PyArg_ParseTuple(args, "KiO!d", &handle, &number, &PyTuple_Type, &peer, &expires) ||
        engine_check(self) < 0 || parse_address(peer, &ss, &addr) < 0)
        return NULL;
    if (number < 0x4000 || number > 0x7FFF) {
        PyErr_Format(PyExc_ValueError, "channel number 0x%x is out of range", number);
        return NULL;
    }
    return result(relay_bind_channel(&self->engine, handle, (uint16_t)number, &addr, expires));
}

static PyObject *Engine_remove_channel(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    int number;
    if (!PyArg_ParseTuple(args, "Ki", &handle, &number) || engine_check(self) < 0) return NULL;
    if (number < 0 || number > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "channel number %d is out of range", number);
        return NULL;
    }
    return result(relay_remove_channel(&self->engine, handle, (uint16_t)number));
}

static PyObject *Engine_set_verdict(EngineObject *self, PyObject *args) {
    PyObject *peer;
    int cluster;
    struct sockaddr_storage ss;
    relay_addr addr;
    if (!PyArg_ParseTuple(args, "O!i", &PyTuple_Type, &peer, &cluster) ||
        engine_check(self) < 0 || parse_address(peer, &ss, &addr) < 0)
        return NULL;
    if ((cluster >= 0 ? cluster & ~RELAY_VERDICT_OWN : cluster) >= RELAY_MAX_CLUSTERS) {
        PyErr_Format(PyExc_ValueError, "cluster id %d is above %d", cluster,
                     RELAY_MAX_CLUSTERS - 1);
        return NULL;
    }
    return result(relay_set_verdict(&self->engine, &addr, cluster));
}

/* The relay-port map (65536 bytes, shared memory): a verdict with RELAY_VERDICT_OWN admits its
 * peer only while the map marks its port 0. Set once, before start. */
static PyObject *Engine_watch_relay_ports(EngineObject *self, PyObject *args) {
    PyObject *map;
    if (!PyArg_ParseTuple(args, "O", &map) || engine_check(self) < 0) return NULL;
    if (__atomic_load_n(&self->engine.running, __ATOMIC_ACQUIRE) || self->relay_ports.obj) {
        PyErr_SetString(PyExc_RuntimeError, "set the relay-port map once, before start()");
        return NULL;
    }
    if (PyObject_GetBuffer(map, &self->relay_ports, PyBUF_SIMPLE) < 0) return NULL;
    if (self->relay_ports.len < 65536) {
        PyBuffer_Release(&self->relay_ports);
        PyErr_SetString(PyExc_ValueError, "the relay-port map has one byte per port (65536)");
        return NULL;
    }
    self->engine.relay_ports = self->relay_ports.buf;
    Py_RETURN_NONE;
}

static PyObject *Engine_mute(EngineObject *self, PyObject *args) {
    PyObject *client;
    double until;
    struct sockaddr_storage ss;
    relay_addr addr;
    if (!PyArg_ParseTuple(args, "O!d", &PyTuple_Type, &client, &until) ||
        engine_check(self) < 0 || parse_address(client, &ss, &addr) < 0)
        return NULL;
    return result(relay_mute(&self->engine, &addr, until));
}

/* Answer strangers' unsigned Allocates in the engine (stateless.c), or stop (answer False). */
static PyObject *Engine_answering(EngineObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"answer", "secret", "lifetime", "name", "realm", NULL};
    int answer;
    Py_buffer secret = {0}, name = {0}, realm = {0};
    double lifetime = 600.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "p|y*ds*s*", names, &answer, &secret,
                                     &lifetime, &name, &realm))
        return NULL;
    PyObject *ret = NULL;
    if (engine_check(self) < 0) goto done;
    if (answer && (!secret.buf || secret.len == 0 || !(lifetime > 0) || !name.buf ||
                   name.len > RELAY_NAME_MAX || !realm.buf || realm.len > RELAY_REALM_MAX)) {
        PyErr_Format(PyExc_ValueError,
                     "answering needs a secret, a lifetime > 0, a name of at most %d bytes and "
                     "a realm of at most %d bytes",
                     RELAY_NAME_MAX, RELAY_REALM_MAX);
        goto done;
    }
    int rc = relay_answering(&self->engine, answer, secret.buf, (size_t)secret.len, lifetime,
                             name.buf, (size_t)name.len, realm.buf, (size_t)realm.len);
    ret = rc < 0 ? raise_errno(rc) : Py_NewRef(Py_None);
done:
    if (secret.obj) PyBuffer_Release(&secret);
    if (name.obj) PyBuffer_Release(&name);
    if (realm.obj) PyBuffer_Release(&realm);
    return ret;
}

static PyObject *Engine_clear_verdicts(EngineObject *self, PyObject *unused) {
    if (engine_check(self) < 0) return NULL;
    relay_clear_verdicts(&self->engine);
    Py_RETURN_NONE;
}

/* Send what was decided (outside the lock) and return the outcome. */
static PyObject *finish(relay_engine *e, int outcome, relay_send *send) {
    struct mmsghdr scratch;
    if (outcome == RELAY_RELAYED) relay_flush(e, send, 1, &scratch);
    return PyLong_FromLong(outcome);
}

static PyObject *Engine_inject(EngineObject *self, PyObject *args) {
    int source;
    unsigned long long handle;
    PyObject *from;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "iKO!y*", &source, &handle, &PyTuple_Type, &from, &data))
        return NULL;
    struct sockaddr_storage ss;
    relay_addr addr;
    PyObject *ret = NULL;
    if (engine_check(self) < 0 || parse_address(from, &ss, &addr) < 0) goto done;
    if (source != RELAY_SRC_CLIENT && source != RELAY_SRC_PEER && source != RELAY_SRC_STREAM) {
        PyErr_SetString(PyExc_ValueError, "source is SOURCE_CLIENT, SOURCE_PEER or SOURCE_STREAM");
        goto done;
    }
    relay_engine *e = &self->engine;
    relay_send send;
    pthread_mutex_lock(&e->lock);
    int outcome = source == RELAY_SRC_STREAM
                      ? relay_process_frame(e, handle, data.buf, (size_t)data.len, relay_now(),
                                            &send)
                      : relay_process(e, source, handle, (struct sockaddr *)&ss, data.buf,
                                      (size_t)data.len, relay_now(), &send);
    pthread_mutex_unlock(&e->lock);
    ret = finish(e, outcome, &send);
done:
    PyBuffer_Release(&data);
    return ret;
}

static PyObject *Engine_send_to_peer(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    PyObject *peer;
    Py_buffer payload;
    Py_ssize_t datagram_len;
    if (!PyArg_ParseTuple(args, "KO!y*n", &handle, &PyTuple_Type, &peer, &payload,
                          &datagram_len))
        return NULL;
    struct sockaddr_storage ss;
    relay_addr addr;
    PyObject *ret = NULL;
    if (engine_check(self) < 0 || parse_address(peer, &ss, &addr) < 0) goto done;
    if (datagram_len < payload.len) {
        PyErr_SetString(PyExc_ValueError, "the datagram is shorter than its payload");
        goto done;
    }
    relay_engine *e = &self->engine;
    relay_send send;
    pthread_mutex_lock(&e->lock);
    int outcome = relay_payload_to_peer(e, handle, &addr, payload.buf, (size_t)payload.len,
                                        (size_t)datagram_len, relay_now(), &send);
    pthread_mutex_unlock(&e->lock);
    ret = finish(e, outcome, &send);
done:
    PyBuffer_Release(&payload);
    return ret;
}

/* Send a payload Python decided and counted itself on the allocation's relay socket: no
 * decision, no counting (the pure-Python relay path of a native allocation). */
static PyObject *Engine_send(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    PyObject *peer;
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "KO!y*", &handle, &PyTuple_Type, &peer, &payload)) return NULL;
    struct sockaddr_storage ss, dst;
    relay_addr addr;
    PyObject *ret = NULL;
    if (engine_check(self) < 0 || parse_address(peer, &ss, &addr) < 0) goto done;
    relay_engine *e = &self->engine;
    int fd = -1;
    socklen_t dstlen = 0;
    pthread_mutex_lock(&e->lock);
    uint32_t slot = (uint32_t)handle, gen = (uint32_t)(handle >> 32);
    relay_alloc *a = slot < e->nslots ? e->allocs[slot] : NULL;
    if (a && a->gen == gen) {
        fd = a->fd; /* only the thread closes it, and only after Python removed it */
        dstlen = relay_sockaddr_from_addr(&dst, a->family, &addr);
    }
    pthread_mutex_unlock(&e->lock);
    if (fd < 0) {
        PyErr_SetString(PyExc_KeyError, "no such allocation");
        goto done;
    }
    if (dstlen == 0) {
        ret = Py_NewRef(Py_False); /* a peer of the other family: unreachable */
        goto done;
    }
    ssize_t n = sendto(fd, payload.buf, (size_t)payload.len, MSG_DONTWAIT,
                       (struct sockaddr *)&dst, dstlen);
    ret = Py_NewRef(n >= 0 ? Py_True : Py_False); /* UDP: a full buffer loses the datagram */
done:
    PyBuffer_Release(&payload);
    return ret;
}

/* --- TURN-TCP streams (stream.c) --- */

static PyObject *Engine_stream_limits(EngineObject *self, PyObject *args) {
    double latency_bound;
    Py_ssize_t high_water;
    unsigned int buffer;
    if (!PyArg_ParseTuple(args, "dnI", &latency_bound, &high_water, &buffer) ||
        engine_check(self) < 0)
        return NULL;
    if (!(latency_bound >= 0) || high_water < 0 || buffer < 20) {
        PyErr_SetString(PyExc_ValueError,
                        "latency_bound >= 0, high_water >= 0, buffer >= 20 (a STUN header)");
        return NULL;
    }
    relay_stream_limits(&self->engine, latency_bound, (size_t)high_water, buffer);
    Py_RETURN_NONE;
}

static PyObject *Engine_add_stream(EngineObject *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd) || engine_check(self) < 0) return NULL;
    uint64_t handle;
    int rc = relay_add_stream(&self->engine, fd, &handle);
    if (rc < 0) return raise_errno(rc);
    return PyLong_FromUnsignedLongLong(handle);
}

static PyObject *Engine_stream_send(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "Ky*", &handle, &data)) return NULL;
    PyObject *ret = NULL;
    if (engine_check(self) == 0) {
        int rc = relay_stream_send(&self->engine, handle, data.buf, (size_t)data.len);
        ret = Py_NewRef(rc == 0 ? Py_True : Py_False);
    }
    PyBuffer_Release(&data);
    return ret;
}

static PyObject *Engine_close_stream(EngineObject *self, PyObject *args) {
    unsigned long long handle;
    if (!PyArg_ParseTuple(args, "K", &handle) || engine_check(self) < 0) return NULL;
    return PyBool_FromLong(relay_close_stream(&self->engine, handle) == 0);
}

static PyObject *Engine_streams(EngineObject *self, PyObject *unused) {
    if (engine_check(self) < 0) return NULL;
    uint32_t max = relay_stream_count(&self->engine) + 64;
    relay_progress *rows = malloc(max * sizeof *rows);
    if (!rows) return PyErr_NoMemory();
    uint32_t n = relay_stream_progress(&self->engine, rows, max);
    PyObject *list = PyList_New(n);
    for (uint32_t i = 0; list && i < n; i++) {
        relay_progress *r = &rows[i];
        PyObject *item = Py_BuildValue("(KdiIddn)", (unsigned long long)r->handle, r->opened,
                                       r->first_done, r->buffered, r->frame_started,
                                       r->last_frame, (Py_ssize_t)r->queued);
        if (!item) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, item);
    }
    free(rows);
    return list;
}

static PyObject *Engine_counters(EngineObject *self, PyObject *unused) {
    if (engine_check(self) < 0) return NULL;
    relay_engine *e = &self->engine;
    uint64_t listener[4], drops[DROP_COUNT], handed_up, resets, answered, calls[3];
    uint32_t n, stranger_ips;
    pthread_mutex_lock(&e->lock);
    /* the thread's own words, read without its lock: a count a batch behind at worst */
    calls[0] = __atomic_load_n(&e->wakeups, __ATOMIC_RELAXED);
    calls[1] = __atomic_load_n(&e->recv_calls, __ATOMIC_RELAXED);
    calls[2] = __atomic_load_n(&e->send_calls, __ATOMIC_RELAXED);
    resets = e->bucket_resets;
    answered = e->answered;
    stranger_ips = e->buckets.used;
    memcpy(listener, e->listener, sizeof listener);
    memcpy(drops, e->drops, sizeof drops);
    handed_up = e->handed_up;
    n = e->nclusters;
    uint64_t(*clusters)[4] = n ? malloc(n * sizeof *clusters) : NULL;
    if (clusters) memcpy(clusters, e->clusters, n * sizeof *clusters);
    pthread_mutex_unlock(&e->lock);
    if (n && !clusters) return PyErr_NoMemory();
    PyObject *by_cluster = PyDict_New(), *by_cause = PyDict_New();
    for (uint32_t i = 0; by_cluster && i < n; i++) {
        uint64_t *c = clusters[i];
        if (!(c[0] | c[1] | c[2] | c[3])) continue;
        PyObject *key = PyLong_FromUnsignedLong(i);
        PyObject *value = Py_BuildValue("(KKKK)", c[0], c[1], c[2], c[3]);
        if (!key || !value || PyDict_SetItem(by_cluster, key, value) < 0) Py_CLEAR(by_cluster);
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    free(clusters);
    for (int i = 0; by_cause && i < DROP_COUNT; i++) {
        PyObject *value = PyLong_FromUnsignedLongLong(drops[i]);
        if (!value || PyDict_SetItemString(by_cause, relay_drop_names[i], value) < 0)
            Py_CLEAR(by_cause);
        Py_XDECREF(value);
    }
    if (!by_cluster || !by_cause) {
        Py_XDECREF(by_cluster);
        Py_XDECREF(by_cause);
        return NULL;
    }
    return Py_BuildValue("{s(KKKK)sNsNsKsIsKsKsKsKsK}", "listener", listener[0], listener[1],
                         listener[2], listener[3], "clusters", by_cluster, "drops", by_cause,
                         "handed_up", handed_up, "stranger_ips", stranger_ips, "bucket_resets",
                         resets, "answered", answered, "wakeups", calls[0], "recv_calls",
                         calls[1], "send_calls", calls[2]);
}

static PyObject *Engine_thread_cpu(EngineObject *self, PyObject *unused) {
    if (engine_check(self) < 0) return NULL;
    if (!__atomic_load_n(&self->engine.running, __ATOMIC_ACQUIRE)) return PyFloat_FromDouble(0.0);
    clockid_t clock;
    struct timespec ts;
    if (pthread_getcpuclockid(self->engine.thread, &clock) != 0 || clock_gettime(clock, &ts) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyFloat_FromDouble((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
}

static PyMethodDef Engine_methods[] = {
    {"start", (PyCFunction)Engine_start, METH_NOARGS, "Start the relay thread."},
    {"stop", (PyCFunction)Engine_stop, METH_NOARGS, "Stop the relay thread (tables stay)."},
    {"close", (PyCFunction)Engine_close, METH_NOARGS, "Stop and free everything."},
    {"fileno", (PyCFunction)Engine_fileno, METH_NOARGS, "Readable while packets wait in drain."},
    {"drain", (PyCFunction)Engine_drain, METH_VARARGS, "Handed-up packets, oldest first."},
    {"add_allocation", (PyCFunction)Engine_add_allocation, METH_VARARGS, "-> handle"},
    {"refresh_allocation", (PyCFunction)Engine_refresh_allocation, METH_VARARGS, NULL},
    {"allocation_traffic", (PyCFunction)Engine_allocation_traffic, METH_VARARGS,
     "-> (rx packets, rx bytes, tx packets, tx bytes)"},
    {"set_bandwidth", (PyCFunction)Engine_set_bandwidth, METH_VARARGS,
     "Cap an allocation: bytes per second (0: none) and burst bytes, each direction."},
    {"remove_allocation", (PyCFunction)Engine_remove_allocation, METH_VARARGS, NULL},
    {"set_permission", (PyCFunction)Engine_set_permission, METH_VARARGS, NULL},
    {"remove_permission", (PyCFunction)Engine_remove_permission, METH_VARARGS, NULL},
    {"bind_channel", (PyCFunction)Engine_bind_channel, METH_VARARGS, NULL},
    {"remove_channel", (PyCFunction)Engine_remove_channel, METH_VARARGS, NULL},
    {"set_verdict", (PyCFunction)Engine_set_verdict, METH_VARARGS, NULL},
    {"clear_verdicts", (PyCFunction)Engine_clear_verdicts, METH_NOARGS, NULL},
    {"mute", (PyCFunction)Engine_mute, METH_VARARGS, "Drop a stranger's STUN until a time."},
    {"answering", (PyCFunction)(void (*)(void))Engine_answering, METH_VARARGS | METH_KEYWORDS,
     "Answer strangers' unsigned Allocates here with a stateless 401 (or stop)."},
    {"watch_relay_ports", (PyCFunction)Engine_watch_relay_ports, METH_VARARGS,
     "Check own-address verdicts against this relay-port map per packet."},
    {"inject", (PyCFunction)Engine_inject, METH_VARARGS, "Decide a handed-up packet again."},
    {"send_to_peer", (PyCFunction)Engine_send_to_peer, METH_VARARGS,
     "Relay a payload Python parsed to a peer, decided as a native packet."},
    {"send", (PyCFunction)Engine_send, METH_VARARGS,
     "Send a payload Python decided and counted on an allocation's relay socket."},
    {"counters", (PyCFunction)Engine_counters, METH_NOARGS, NULL},
    {"stream_limits", (PyCFunction)Engine_stream_limits, METH_VARARGS,
     "TURN-TCP: the latency bound (s), the output high-water mark and the frame cap (bytes)."},
    {"add_stream", (PyCFunction)Engine_add_stream, METH_VARARGS,
     "Take over (a duplicate of) an accepted TURN-TCP connection -> handle."},
    {"stream_send", (PyCFunction)Engine_stream_send, METH_VARARGS,
     "Queue bytes to a stream's client; False when closed or past the high-water mark."},
    {"close_stream", (PyCFunction)Engine_close_stream, METH_VARARGS,
     "Close a stream; its close event follows."},
    {"streams", (PyCFunction)Engine_streams, METH_NOARGS,
     "[(handle, opened, first_done, buffered, frame_started, last_frame, queued)] of each."},
    {"thread_cpu", (PyCFunction)Engine_thread_cpu, METH_NOARGS, "CPU seconds of the thread."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stunnerd._relay.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The native relay engine of one TURN-UDP or TURN-TCP listener.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
};

/* How the engine frames the start of a TCP stream: (length, why not) as stream.c decides. */
static PyObject *stream_framing(PyObject *module, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    const uint8_t *b = data.buf;
    size_t len = (size_t)data.len;
    long length = relay_stream_frame_length(b, len);
    const char *why = relay_stream_framing_error(b, len);
    PyBuffer_Release(&data);
    return Py_BuildValue("(lz)", length, why);
}

/* --- the engine's nonces, on their own (tests: they match stunnerd.turn.auth.NonceManager's) --- */

static int nonce_key(relay_nonce_key *k, Py_buffer *secret, double lifetime, Py_buffer *name) {
    int rc = relay_nonce_init(k, secret->buf, (size_t)secret->len, lifetime, name->buf,
                              (size_t)name->len);
    if (rc == -EINVAL)
        PyErr_Format(PyExc_ValueError,
                     "a nonce key needs a secret, a lifetime > 0 and a name of at most %d bytes",
                     RELAY_NAME_MAX);
    else if (rc < 0)
        raise_errno(rc);
    return rc;
}

static PyObject *issue_nonce(PyObject *module, PyObject *args) {
    Py_buffer secret, name;
    double lifetime, wall;
    PyObject *client, *ret = NULL;
    if (!PyArg_ParseTuple(args, "y*ds*O!d", &secret, &lifetime, &name, &PyTuple_Type, &client,
                          &wall))
        return NULL;
    struct sockaddr_storage ss;
    relay_addr addr;
    relay_nonce_key k;
    if (parse_address(client, &ss, &addr) == 0 && nonce_key(&k, &secret, lifetime, &name) == 0) {
        char out[RELAY_NONCE_LEN];
        relay_nonce_issue(&k, &addr, wall, out);
        relay_nonce_free(&k);
        ret = PyUnicode_FromStringAndSize(out, RELAY_NONCE_LEN);
    }
    PyBuffer_Release(&secret);
    PyBuffer_Release(&name);
    return ret;
}

static PyObject *nonce_valid(PyObject *module, PyObject *args) {
    Py_buffer secret, name, nonce;
    double lifetime, wall;
    PyObject *client, *ret = NULL;
    if (!PyArg_ParseTuple(args, "y*ds*O!s*d", &secret, &lifetime, &name, &PyTuple_Type, &client,
                          &nonce, &wall))
        return NULL;
    struct sockaddr_storage ss;
    relay_addr addr;
    relay_nonce_key k;
    if (parse_address(client, &ss, &addr) == 0 && nonce_key(&k, &secret, lifetime, &name) == 0) {
        int valid = relay_nonce_valid(&k, nonce.buf, (size_t)nonce.len, &addr, wall);
        relay_nonce_free(&k);
        ret = PyBool_FromLong(valid);
    }
    PyBuffer_Release(&secret);
    PyBuffer_Release(&name);
    PyBuffer_Release(&nonce);
    return ret;
}

static PyObject *unsigned_allocate(PyObject *module, PyObject *args) {
    Py_buffer data;
    unsigned int max_attributes = RELAY_MAX_ATTRIBUTES;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &max_attributes)) return NULL;
    int yes = relay_unsigned_allocate(data.buf, (size_t)data.len, max_attributes);
    PyBuffer_Release(&data);
    return PyBool_FromLong(yes);
}

static PyMethodDef module_methods[] = {
    {"stream_framing", stream_framing, METH_VARARGS,
     "(frame length: 0 until a header, -1 for garbage; why it is garbage, or None)"},
    {"issue_nonce", issue_nonce, METH_VARARGS,
     "issue_nonce(secret, lifetime, name, client, wall) -> the engine's nonce for client."},
    {"nonce_valid", nonce_valid, METH_VARARGS,
     "nonce_valid(secret, lifetime, name, client, nonce, wall) -> whether it verifies."},
    {"unsigned_allocate", unsigned_allocate, METH_VARARGS,
     "unsigned_allocate(data, max_attributes=64) -> whether the engine answers it with 401."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "stunnerd._relay", "The native TURN-UDP relay core (relay.c).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__relay(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0 ||
        PyModule_AddIntConstant(m, "SOURCE_CLIENT", RELAY_SRC_CLIENT) < 0 ||
        PyModule_AddIntConstant(m, "SOURCE_PEER", RELAY_SRC_PEER) < 0 ||
        PyModule_AddIntConstant(m, "SOURCE_STREAM", RELAY_SRC_STREAM) < 0 ||
        PyModule_AddIntConstant(m, "SOURCE_CLOSED", RELAY_SRC_CLOSED) < 0 ||
        PyModule_AddIntConstant(m, "RELAYED", RELAY_RELAYED) < 0 ||
        PyModule_AddIntConstant(m, "DROPPED", RELAY_DROPPED) < 0 ||
        PyModule_AddIntConstant(m, "UP", RELAY_UP) < 0 ||
        PyModule_AddIntConstant(m, "VERDICT_OWN", RELAY_VERDICT_OWN) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
