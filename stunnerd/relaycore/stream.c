/* TURN-TCP streams in the relay engine (issue 21): framing, relaying, bounded delay. See the
 * stream section of relay.h.
 *
 * Locking: a stream's tables and queues are guarded by the engine's `lock`, as the rest. Only
 * the engine's thread reads, writes and closes a stream's descriptor; unlike the datagram
 * path it writes with the lock held (a non-blocking writev of what is queued, so Python's
 * answers and relayed frames leave in the order they were queued). Python's calls only queue
 * and mark the stream dirty, and wake the thread. A closed stream leaves the table at once
 * (no call finds it) and is freed by the thread after its turn (relay_stream_reap).
 */
#define _GNU_SOURCE
#include "relay.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define READS_PER_WAKEUP 4 /* reads of one ready stream before serving the others */
#define READ_CHUNK 65536
#define MIN_ROOM 16384
#define MAX_FRAME (4 + 0xFFFF + 3) /* ChannelData padded; STUN is 20 + 0xFFFC at most */
#define WRITE_IOV 64


static uint64_t handle_of(const relay_stream *s) { return ((uint64_t)s->gen << 32) | s->slot; }

relay_stream *relay_stream_of(relay_engine *e, uint64_t handle) {
    handle &= ~RELAY_STREAM_TAG;
    uint32_t slot = (uint32_t)handle, gen = (uint32_t)(handle >> 32);
    if (slot >= e->nstream_slots) return NULL;
    relay_stream *s = e->streams[slot];
    return s && s->gen == gen ? s : NULL;
}

uint32_t relay_stream_count(relay_engine *e) {
    pthread_mutex_lock(&e->lock);
    uint32_t n = e->nstream_slots - e->nstream_free;
    pthread_mutex_unlock(&e->lock);
    return n;
}

void relay_stream_limits(relay_engine *e, double latency_bound, size_t high_water,
                         uint32_t buffer) {
    pthread_mutex_lock(&e->lock);
    e->latency_bound = latency_bound > 0 ? latency_bound : 0;
    e->high_water = high_water;
    e->stream_buffer = buffer >= 4 ? buffer : 4;
    pthread_mutex_unlock(&e->lock);
}

static int has_cookie(const uint8_t *b) {
    return ((uint32_t)b[4] << 24 | (uint32_t)b[5] << 16 | (uint32_t)b[6] << 8 | b[7]) ==
           RELAY_COOKIE;
}

long relay_stream_frame_length(const uint8_t *b, size_t len) {
    if (len < 4) return 0;
    size_t length = be16(b + 2);
    if ((b[0] & 0xC0) == 0x00)
        return length % 4 || (len >= 8 && !has_cookie(b)) ? -1 : (long)(20 + length);
    if ((b[0] & 0xC0) == 0x40) return (long)(4 + length + (4 - length % 4) % 4);
    return -1;
}

const char *relay_stream_framing_error(const uint8_t *b, size_t len) {
    if (len < 4) return NULL;
    if ((b[0] & 0xC0) == 0x40) return NULL;
    if ((b[0] & 0xC0) != 0x00) return "stream data is neither STUN nor ChannelData";
    if (be16(b + 2) % 4) return "STUN message length is not a multiple of 4";
    if (len >= 8 && !has_cookie(b))
        return "STUN message without the magic cookie: the stream is out of step "
               "(ChannelData not padded to a multiple of 4?)";
    return NULL;
}

static void wake_thread(relay_engine *e) {
    if (!relay_in_thread) { /* its own work it does after the batch; a stopped engine's later */
        uint64_t one = 1;
        if (write(e->wake_fd, &one, sizeof one) < 0) { /* already signalled */
        }
    }
}

/* What epoll watches on a stream: input unless stalled, output while some waits. */
static uint32_t stream_events(const relay_stream *s) {
    return (s->stalled ? 0 : EPOLLIN | EPOLLRDHUP) | (s->writable_wait ? EPOLLOUT : 0);
}

/* A frame to hand up found its queue full: over TCP it waits in the buffer (the client's TCP
 * window pushes back) instead of being dropped, and the stream is not read until relay_drain
 * makes room (relay_stream_resume). A stream of the fuzz harness (no descriptor) drops. */
static int stall(relay_engine *e, relay_stream *s) {
    if (s->fd < 0) return 0;
    s->stalled = 1;
    __atomic_add_fetch(&e->stalled, 1, __ATOMIC_RELAXED);
    relay_epoll_set(e, s->fd, RELAY_STREAM_TAG | handle_of(s), stream_events(s), EPOLL_CTL_MOD);
    return 1;
}

static void mark_dirty(relay_engine *e, relay_stream *s) {
    if (s->in_dirty) return;
    s->in_dirty = 1;
    s->next_dirty = e->dirty;
    e->dirty = s;
    wake_thread(e);
}

/* --- lifecycle -------------------------------------------------------------------------- */

int relay_add_stream(relay_engine *e, int fd, uint64_t *handle) {
    relay_stream *s = calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->remote_len = sizeof s->remote_ss;
    s->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    int err = 0;
    if (s->fd < 0 || getpeername(s->fd, (struct sockaddr *)&s->remote_ss, &s->remote_len) < 0)
        err = -errno;
    else if (s->remote_ss.ss_family != AF_INET && s->remote_ss.ss_family != AF_INET6)
        err = -EAFNOSUPPORT;
    if (err) {
        if (s->fd >= 0) close(s->fd);
        free(s);
        return err;
    }
    relay_addr_from_sockaddr(&s->remote, (struct sockaddr *)&s->remote_ss);
    fcntl(s->fd, F_SETFL, fcntl(s->fd, F_GETFL) | O_NONBLOCK);
    int one = 1, lowat = RELAY_STREAM_NOTSENT;
    /* The arrival time of what is read (the reading side's bound), frames out at once, and
     * little unsent data in the kernel: the queue (and its bound) stays here. */
    setsockopt(s->fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s->fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat);
    s->opened = relay_now();
    int rc = 0;
    pthread_mutex_lock(&e->lock);
    if (e->nstream_free == 0) {
        uint32_t n = e->nstream_slots ? e->nstream_slots * 2 : 64;
        relay_stream **streams = realloc(e->streams, n * sizeof *streams);
        uint32_t *free_slots = streams ? realloc(e->stream_free, n * sizeof *free_slots) : NULL;
        if (streams) e->streams = streams;
        if (!streams || !free_slots) {
            rc = -ENOMEM;
        } else {
            e->stream_free = free_slots;
            for (uint32_t i = e->nstream_slots; i < n; i++) {
                e->streams[i] = NULL;
                e->stream_free[e->nstream_free++] = n - 1 - (i - e->nstream_slots);
            }
            e->nstream_slots = n;
        }
    }
    if (rc == 0) {
        s->slot = e->stream_free[--e->nstream_free];
        e->stream_gen = (e->stream_gen + 1) & 0x3FFFFFFFu;
        s->gen = e->stream_gen ? e->stream_gen : (e->stream_gen = 1);
        e->streams[s->slot] = s;
        *handle = handle_of(s);
        rc = relay_epoll_set(e, s->fd, RELAY_STREAM_TAG | *handle, EPOLLIN | EPOLLRDHUP,
                             EPOLL_CTL_ADD);
        if (rc < 0) {
            e->streams[s->slot] = NULL;
            e->stream_free[e->nstream_free++] = s->slot;
        }
    }
    pthread_mutex_unlock(&e->lock);
    if (rc < 0) {
        close(s->fd);
        free(s);
    }
    return rc;
}

static void free_frames(relay_stream *s) {
    while (s->out_head) {
        relay_frame *next = s->out_head->next;
        free(s->out_head);
        s->out_head = next;
    }
    s->out_tail = NULL;
    s->out_bytes = 0;
    s->out_off = 0;
}

/* Close a stream (lock held; the thread, or a stopped engine): it leaves the table, its close
 * is handed up (when `tell`), and it is freed by relay_stream_reap. */
static void stream_close(relay_engine *e, relay_stream *s, const char *reason, int tell) {
    if (s->fd < 0) return;
    if (!s->close_reason) s->close_reason = reason;
    if (s->stalled) {
        s->stalled = 0;
        __atomic_sub_fetch(&e->stalled, 1, __ATOMIC_RELAXED);
    }
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->fd = -1;
    free_frames(s);
    if (e->streams[s->slot] == s) {
        e->streams[s->slot] = NULL;
        e->stream_free[e->nstream_free++] = s->slot;
    }
    if (tell) relay_push_closed(e, s);
    s->next_dead = e->stream_dead;
    e->stream_dead = s;
}

void relay_stream_reap(relay_engine *e) {
    pthread_mutex_lock(&e->lock);
    relay_stream *dead = e->stream_dead;
    e->stream_dead = NULL;
    pthread_mutex_unlock(&e->lock);
    while (dead) {
        relay_stream *next = dead->next_dead;
        free(dead->in);
        free(dead);
        dead = next;
    }
}

void relay_stream_free_all(relay_engine *e) {
    pthread_mutex_lock(&e->lock);
    for (uint32_t i = 0; i < e->nstream_slots; i++)
        if (e->streams[i]) stream_close(e, e->streams[i], "engine closed", 0);
    e->dirty = NULL;
    pthread_mutex_unlock(&e->lock);
    relay_stream_reap(e);
    free(e->streams);
    free(e->stream_free);
    e->streams = NULL;
    e->stream_free = NULL;
    e->nstream_slots = e->nstream_free = 0;
}

int relay_close_stream(relay_engine *e, uint64_t handle) {
    pthread_mutex_lock(&e->lock);
    relay_stream *s = relay_stream_of(e, handle);
    if (s) {
        s->close_asked = 1;
        if (__atomic_load_n(&e->running, __ATOMIC_ACQUIRE)) {
            mark_dirty(e, s);
        } else { /* no thread to do it: at once */
            stream_close(e, s, "closed by the server", 1);
        }
    }
    pthread_mutex_unlock(&e->lock);
    if (s && !__atomic_load_n(&e->running, __ATOMIC_ACQUIRE)) relay_stream_reap(e);
    return s ? 0 : -ENOENT;
}

uint32_t relay_stream_progress(relay_engine *e, relay_progress *out, uint32_t max) {
    uint32_t n = 0;
    pthread_mutex_lock(&e->lock);
    for (uint32_t i = 0; i < e->nstream_slots && n < max; i++) {
        relay_stream *s = e->streams[i];
        if (!s) continue;
        out[n].handle = handle_of(s);
        out[n].opened = s->opened;
        out[n].frame_started = s->frame_started;
        out[n].last_frame = s->last_frame;
        out[n].buffered = s->in_len - s->in_off;
        out[n].first_done = s->first_done;
        out[n].queued = s->out_bytes;
        n++;
    }
    pthread_mutex_unlock(&e->lock);
    return n;
}

/* --- output ----------------------------------------------------------------------------- */

static relay_frame *append_frame(relay_engine *e, relay_stream *s, size_t len, double now,
                                 int relayed) {
    if (s->out_bytes + len > e->high_water) {
        e->drops[DROP_BACKPRESSURE]++;
        return NULL;
    }
    relay_frame *f = malloc(sizeof *f + len);
    if (!f) {
        e->drops[DROP_BACKPRESSURE]++;
        return NULL;
    }
    f->next = NULL;
    f->arrival = now;
    f->len = (uint32_t)len;
    f->relayed = (uint8_t)relayed;
    if (s->out_tail)
        s->out_tail->next = f;
    else
        s->out_head = f;
    s->out_tail = f;
    s->out_bytes += len;
    return f;
}

int relay_stream_enqueue(relay_engine *e, uint64_t handle, const relay_send *out, double now) {
    relay_stream *s = relay_stream_of(e, handle);
    if (!s || s->fd < 0 || s->close_asked) return relay_drop(e, DROP_SEND_ERROR);
    relay_frame *f = append_frame(e, s, out->total, now, 1);
    if (!f) return RELAY_DROPPED;
    size_t off = 0;
    for (int i = 0; i < out->iovcnt; i++) {
        memcpy(f->data + off, out->iov[i].iov_base, out->iov[i].iov_len);
        off += out->iov[i].iov_len;
    }
    if (out->cluster >= 0 && (uint32_t)out->cluster < e->nclusters) {
        e->clusters[out->cluster][CL_RX_PACKETS]++;
        e->clusters[out->cluster][CL_RX_BYTES] += out->payload;
    }
    mark_dirty(e, s);
    return RELAY_RELAYED;
}

int relay_stream_send(relay_engine *e, uint64_t handle, const uint8_t *data, size_t len) {
    int rc = 0;
    pthread_mutex_lock(&e->lock);
    relay_stream *s = relay_stream_of(e, handle);
    if (!s || s->fd < 0 || s->close_asked) {
        rc = -ENOENT;
    } else if (len > 0) { /* nothing to send for nothing */
        relay_frame *f = append_frame(e, s, len, relay_now(), 0);
        if (f) {
            memcpy(f->data, data, len);
            mark_dirty(e, s);
        } else {
            rc = -ENOBUFS;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return rc;
}

/* Drop the relayed frames not yet begun that waited longer than the bound. Relayed frames are
 * queued in arrival order, so the first fresh one ends the walk (Python's answers, never
 * dropped, are stepped over). */
static void drop_late(relay_engine *e, relay_stream *s, double now) {
    if (e->latency_bound <= 0) return;
    relay_frame **link = &s->out_head, *prev = NULL;
    if (s->out_off > 0 && s->out_head) { /* begun: always finished */
        prev = s->out_head;
        link = &s->out_head->next;
    }
    while (*link) {
        relay_frame *f = *link;
        if (!f->relayed) {
            prev = f;
            link = &f->next;
            continue;
        }
        if (now - f->arrival <= e->latency_bound) break;
        *link = f->next;
        if (s->out_tail == f) s->out_tail = prev;
        s->out_bytes -= f->len;
        e->drops[DROP_LATENCY]++;
        free(f);
    }
}

/* Write what is queued (lock held, the thread): 0, or -1 when the stream must close. */
static int stream_write(relay_engine *e, relay_stream *s, double now) {
    while (1) {
        drop_late(e, s, now);
        if (!s->out_head) break;
        struct iovec iov[WRITE_IOV];
        int n = 0;
        size_t total = 0;
        for (relay_frame *f = s->out_head; f && n < WRITE_IOV; f = f->next, n++) {
            size_t skip = n == 0 ? s->out_off : 0;
            iov[n].iov_base = f->data + skip;
            iov[n].iov_len = f->len - skip;
            total += iov[n].iov_len;
        }
        ssize_t wrote = writev(s->fd, iov, n);
        if (wrote < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            s->close_reason = errno == ECONNRESET || errno == EPIPE ? "reset" : "write error";
            return -1;
        }
        size_t left = (size_t)wrote;
        while (s->out_head) {
            relay_frame *f = s->out_head;
            size_t rest = f->len - s->out_off;
            if (left < rest) {
                s->out_off += (uint32_t)left;
                s->out_bytes -= left;
                break;
            }
            left -= rest;
            s->out_bytes -= rest;
            s->out_off = 0;
            s->out_head = f->next;
            if (!s->out_head) s->out_tail = NULL;
            if (f->relayed) { /* answers are counted by Python, as on its own path */
                e->listener[CTR_TX_PACKETS]++;
                e->listener[CTR_TX_BYTES] += f->len;
            }
            free(f);
        }
        if ((size_t)wrote < total) break; /* the kernel holds enough unsent: wait for it */
    }
    int want = s->out_head != NULL;
    if (want != s->writable_wait && s->fd >= 0) {
        s->writable_wait = want;
        relay_epoll_set(e, s->fd, RELAY_STREAM_TAG | handle_of(s), stream_events(s),
                        EPOLL_CTL_MOD);
    }
    return 0;
}

void relay_stream_service(relay_engine *e) {
    pthread_mutex_lock(&e->lock);
    relay_stream *list = e->dirty;
    e->dirty = NULL;
    double now = relay_now();
    for (relay_stream *s = list, *next; s; s = next) {
        next = s->next_dirty;
        s->in_dirty = 0;
        if (s->fd < 0) continue;
        if (stream_write(e, s, now) < 0)
            stream_close(e, s, s->close_reason, 1);
        else if (s->close_asked)
            stream_close(e, s, "closed by the server", 1);
    }
    pthread_mutex_unlock(&e->lock);
}

/* --- input ------------------------------------------------------------------------------- */

/* Room for at least MIN_ROOM more bytes (the consumed frames moved out first); the buffer
 * holds one frame in progress (at most MAX_FRAME) and one read. 0, or -ENOMEM. */
static int make_room(relay_stream *s, size_t want) {
    if (s->in_off > 0) {
        memmove(s->in, s->in + s->in_off, s->in_len - s->in_off);
        s->in_len -= s->in_off;
        s->in_off = 0;
    }
    if (s->in_cap - s->in_len >= want) return 0;
    size_t cap = s->in_cap ? s->in_cap : MIN_ROOM;
    while (cap - s->in_len < want) cap *= 2;
    uint8_t *in = realloc(s->in, cap);
    if (!in) return -ENOMEM;
    s->in = in;
    s->in_cap = (uint32_t)cap;
    return 0;
}

int relay_stream_input(relay_engine *e, relay_stream *s, const uint8_t *data, size_t len,
                       double now, double age, relay_send *sends, int *count) {
    if (len > 0 && data != s->in + s->in_len) { /* bytes from elsewhere: copied in */
        if (make_room(s, len) < 0) {
            s->close_reason = "out of memory";
            return -1;
        }
        memcpy(s->in + s->in_len, data, len);
    }
    s->in_len += (uint32_t)len;
    int framed = 0, late = e->latency_bound > 0 && age > e->latency_bound;
    uint64_t handle = handle_of(s);
    while (1) {
        uint8_t *b = s->in + s->in_off;
        size_t avail = s->in_len - s->in_off;
        long flen = relay_stream_frame_length(b, avail);
        if (flen < 0) {
            s->close_reason = relay_stream_framing_error(b, avail);
            return -1;
        }
        if (flen > (long)e->stream_buffer) {
            s->close_reason = "a frame longer than the stream buffer";
            return -1;
        }
        if (flen == 0 || avail < (size_t)flen) break;
        if (*count >= RELAY_BATCH) return 1; /* the caller sends these, then calls again */
        s->in_off += (uint32_t)flen;
        s->first_done = 1;
        s->last_frame = now;
        framed = 1;
        relay_alloc *a = relay_alloc_of_client(e, &s->remote);
        int outcome;
        relay_send *out = &sends[*count];
        /* ChannelData or a Send indication: media, which is worthless late; whether it would
         * have been relayed (or handed up: a verdict or a channel Python still decides) */
        int media = (b[0] & 0xC0) == 0x40 || (b[0] == 0 && b[1] == 0x16);
        if ((b[0] & 0xC0) == 0x40 && !a) {
            outcome = relay_drop(e, DROP_INVALID); /* TurnServer.handle_channel_data drops it */
        } else if (a && media && late) { /* received, then dropped: it waited past the bound */
            e->listener[CTR_RX_PACKETS]++;
            e->listener[CTR_RX_BYTES] += (uint64_t)flen;
            outcome = relay_drop(e, DROP_LATENCY);
        } else if (a) {
            outcome = relay_client_frame(e, a, b, (size_t)flen, now, out);
        } else {
            outcome = RELAY_UP;
        }
        if (outcome == RELAY_RELAYED) {
            (*count)++;
        } else if (outcome == RELAY_UP) {
            const struct sockaddr *from = (const struct sockaddr *)&s->remote_ss;
            if (!relay_hand_up_room(e, from, (size_t)flen) && stall(e, s)) {
                s->in_off -= (uint32_t)flen; /* it waits in the buffer, undecided */
                break;
            }
            relay_hand_up(e, RELAY_SRC_STREAM, handle, from, s->remote_len, b, (size_t)flen);
        }
    }
    if (s->in_off == s->in_len) {
        s->in_off = s->in_len = 0;
        s->frame_started = 0;
    } else if (framed || s->frame_started == 0) {
        s->frame_started = now; /* a frame begun by this read */
    }
    return 0;
}

int relay_process_frame(relay_engine *e, uint64_t handle, uint8_t *data, size_t len, double now,
                        relay_send *out) {
    relay_stream *s = relay_stream_of(e, handle);
    if (!s || len < 4 || relay_stream_frame_length(data, len) != (long)len) return RELAY_UP;
    relay_alloc *a = relay_alloc_of_client(e, &s->remote);
    return a ? relay_client_frame(e, a, data, len, now, out) : RELAY_UP;
}

/* Frame what `s` holds (or `data`, `len` just read into it), sending what is decided between
 * batches; closes the stream when it must. Lock not held. Returns the last rc. */
static int frame_all(relay_engine *e, relay_stream *s, const uint8_t *data, size_t len,
                     double now, double age) {
    int rc;
    do {
        int count = 0;
        pthread_mutex_lock(&e->lock);
        rc = relay_stream_input(e, s, data, len, now, age, e->sends, &count);
        if (rc < 0) stream_close(e, s, s->close_reason, 1);
        pthread_mutex_unlock(&e->lock);
        relay_flush(e, e->sends, count, e->out);
        data = NULL;
        len = 0;
    } while (rc == 1);
    return rc;
}

void relay_stream_resume(relay_engine *e) {
    for (uint32_t i = 0; __atomic_load_n(&e->stalled, __ATOMIC_RELAXED); i++) {
        pthread_mutex_lock(&e->lock);
        relay_stream *s = i < e->nstream_slots ? e->streams[i] : NULL;
        int last = i >= e->nstream_slots, go = s && s->stalled && s->fd >= 0;
        if (go) {
            s->stalled = 0;
            __atomic_sub_fetch(&e->stalled, 1, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&e->lock);
        if (last) break;
        if (!go || frame_all(e, s, NULL, 0, relay_now(), 0) < 0) continue;
        pthread_mutex_lock(&e->lock);
        if (s->fd >= 0 && !s->stalled) /* read again (what came meanwhile is in the socket) */
            relay_epoll_set(e, s->fd, RELAY_STREAM_TAG | handle_of(s), stream_events(s),
                            EPOLL_CTL_MOD);
        pthread_mutex_unlock(&e->lock);
    }
}

/* Read a ready stream: frame, relay, hand up; close it on EOF, an error or bad framing. */
static void stream_read(relay_engine *e, relay_stream *s) {
    for (int k = 0; k < READS_PER_WAKEUP && !s->stalled; k++) {
        pthread_mutex_lock(&e->lock);
        int room = make_room(s, MIN_ROOM);
        pthread_mutex_unlock(&e->lock);
        if (room < 0) {
            pthread_mutex_lock(&e->lock);
            stream_close(e, s, "out of memory", 1);
            pthread_mutex_unlock(&e->lock);
            return;
        }
        size_t space = s->in_cap - s->in_len;
        if (space > READ_CHUNK) space = READ_CHUNK;
        union {
            char buf[CMSG_SPACE(sizeof(struct timespec)) * 2];
            struct cmsghdr align;
        } control;
        struct iovec iov = {.iov_base = s->in + s->in_len, .iov_len = space};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                           .msg_controllen = sizeof control.buf};
        ssize_t n = recvmsg(s->fd, &m, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
            const char *why = n == 0 ? "EOF" : errno == ECONNRESET ? "reset" : "read error";
            pthread_mutex_lock(&e->lock);
            stream_close(e, s, why, 1);
            pthread_mutex_unlock(&e->lock);
            return;
        }
        double age = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                struct timespec at, wall;
                memcpy(&at, CMSG_DATA(c), sizeof at);
                clock_gettime(CLOCK_REALTIME, &wall);
                age = (double)(wall.tv_sec - at.tv_sec) + (double)(wall.tv_nsec - at.tv_nsec) * 1e-9;
                if (age < 0 || age > 3600) age = 0; /* a clock step: no judgement */
            }
        }
        int rc = frame_all(e, s, s->in + s->in_len, (size_t)n, relay_now(), age);
        if (rc < 0 || (size_t)n < space) return;
    }
}

void relay_stream_event(relay_engine *e, uint64_t tag, uint32_t events) {
    pthread_mutex_lock(&e->lock);
    relay_stream *s = relay_stream_of(e, tag);
    int writable = s && (events & EPOLLOUT);
    if (writable && stream_write(e, s, relay_now()) < 0) {
        stream_close(e, s, s->close_reason, 1);
        s = NULL;
    }
    if (s && s->stalled && (events & (EPOLLHUP | EPOLLERR))) { /* dead while it waited */
        stream_close(e, s, "reset", 1);
        s = NULL;
    }
    pthread_mutex_unlock(&e->lock);
    if (s && s->fd >= 0 && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
        stream_read(e, s);
}
