/* The native TURN-UDP relay core: tables, packet decisions, the thread. See relay.h. */
#define _GNU_SOURCE
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define COOKIE RELAY_COOKIE
#define FINGERPRINT_XOR 0x5354554Eu
#define ATTR_MESSAGE_INTEGRITY 0x0008
#define ATTR_XOR_PEER_ADDRESS 0x0012
#define ATTR_DATA 0x0013
#define ATTR_FINGERPRINT 0x8028
#define SEND_INDICATION 0x0016
#define DATA_INDICATION 0x0017
#define WAKE_TAG UINT64_MAX
#define LISTEN_TAG (UINT64_MAX - 1)
#define READS_PER_WAKEUP 8 /* recvmmsg reads per ready socket before serving the others */

const char *const relay_drop_names[DROP_COUNT] = {
    "no_permission", "forbidden", "expired", "too_big", "send_error", "queue_full", "invalid",
    "rate_limited", "unauthenticated_rate", "unauthenticated_total", "shed", "latency",
    "backpressure", "bandwidth",
};

/* --- small helpers ------------------------------------------------------------------------ */


double relay_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic() on Linux */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const uint8_t V4_MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

void relay_addr_from_sockaddr(relay_addr *a, const struct sockaddr *sa) {
    memset(a, 0, sizeof *a);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        memcpy(a->ip, V4_MAPPED, 12);
        memcpy(a->ip + 12, &in->sin_addr, 4);
        a->port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        memcpy(a->ip, &in6->sin6_addr, 16);
        a->port = ntohs(in6->sin6_port);
    }
}

static inline int addr_is_v4(const relay_addr *a) { return memcmp(a->ip, V4_MAPPED, 12) == 0; }

socklen_t relay_sockaddr_from_addr(struct sockaddr_storage *ss, int family, const relay_addr *a) {
    memset(ss, 0, sizeof *ss);
    if (family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        if (!addr_is_v4(a)) return 0; /* an IPv6 peer is unreachable from an IPv4 socket */
        in->sin_family = AF_INET;
        memcpy(&in->sin_addr, a->ip + 12, 4);
        in->sin_port = htons(a->port);
        return sizeof *in;
    }
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    in6->sin6_family = AF_INET6;
    memcpy(&in6->sin6_addr, a->ip, 16);
    in6->sin6_port = htons(a->port);
    return sizeof *in6;
}

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t relay_crc32(const uint8_t *b, size_t len) {
    pthread_once(&crc_once, crc_init);
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < len; i++) c = crc_table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint64_t rng_next(uint64_t s[2]) { /* xorshift128+ */
    uint64_t x = s[0];
    const uint64_t y = s[1];
    s[0] = y;
    x ^= x << 23;
    s[1] = x ^ y ^ (x >> 17) ^ (y >> 26);
    return s[1] + y;
}

/* --- the hash table ------------------------------------------------------------------------ */

static uint32_t hash_addr(const relay_addr *k) {
    uint64_t h = 0xcbf29ce484222325ull;
    const uint8_t *p = (const uint8_t *)k;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32));
}

static relay_entry *table_find(const relay_table *t, const relay_addr *k) {
    if (t->cap == 0) return NULL;
    uint32_t mask = t->cap - 1;
    for (uint32_t i = hash_addr(k) & mask, n = 0; n < t->cap; i = (i + 1) & mask, n++) {
        relay_entry *s = &t->slots[i];
        if (s->state == 0) return NULL;
        if (s->state == 1 && memcmp(&s->key, k, sizeof *k) == 0) return s;
    }
    return NULL;
}

static int table_resize(relay_table *t, uint32_t cap) {
    relay_entry *slots = calloc(cap, sizeof *slots);
    if (slots == NULL) return -ENOMEM;
    for (uint32_t j = 0; j < t->cap; j++) {
        relay_entry *old = &t->slots[j];
        if (old->state != 1) continue;
        uint32_t i = hash_addr(&old->key) & (cap - 1);
        while (slots[i].state) i = (i + 1) & (cap - 1);
        slots[i] = *old;
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    t->deleted = 0;
    return 0;
}

/* The entry for k, created (zeroed but for the key) if absent; NULL when out of memory. */
static relay_entry *table_put(relay_table *t, const relay_addr *k) {
    relay_entry *found = table_find(t, k);
    if (found) return found;
    if ((t->used + t->deleted + 1) * 4 > t->cap * 3) {
        uint32_t cap = t->cap ? t->cap : 4;
        while ((t->used + 1) * 2 > cap) cap *= 2;
        if (table_resize(t, cap) < 0) return NULL;
    }
    uint32_t mask = t->cap - 1;
    uint32_t i = hash_addr(k) & mask;
    while (t->slots[i].state == 1) i = (i + 1) & mask;
    relay_entry *s = &t->slots[i];
    if (s->state == 2) t->deleted--;
    memset(s, 0, sizeof *s);
    s->key = *k;
    s->state = 1;
    t->used++;
    return s;
}

static int table_del(relay_table *t, const relay_addr *k) {
    relay_entry *s = table_find(t, k);
    if (!s) return 0;
    s->state = 2;
    t->used--;
    t->deleted++;
    return 1;
}

static void table_free(relay_table *t) {
    free(t->slots);
    memset(t, 0, sizeof *t);
}

static relay_addr ip_key(const relay_addr *a) {
    relay_addr k;
    memset(&k, 0, sizeof k);
    memcpy(k.ip, a->ip, 16);
    return k;
}

static relay_addr number_key(uint16_t number) {
    relay_addr k;
    memset(&k, 0, sizeof k);
    k.port = number;
    return k;
}

/* --- engine lifecycle ---------------------------------------------------------------------- */

static int socket_family(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) return -errno;
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return -EAFNOSUPPORT;
    return ss.ss_family;
}

static int epoll_add(int epfd, int fd, uint64_t tag) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

int relay_epoll_set(relay_engine *e, int fd, uint64_t tag, uint32_t events, int op) {
    struct epoll_event ev = {.events = events, .data.u64 = tag};
    return epoll_ctl(e->epfd, op, fd, &ev) < 0 ? -errno : 0;
}

int relay_new(relay_engine *e, int listen_fd, uint32_t queue_limit, size_t queue_bytes) {
    memset(e, 0, sizeof *e);
    e->listen_fd = e->epfd = e->wake_fd = e->up_fd = -1;
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->qlock, NULL);
    if (listen_fd >= 0) { /* else an engine of TURN-TCP streams alone (stream.c) */
        int family = socket_family(listen_fd);
        if (family < 0) return family;
        e->listen_family = family;
    }
    e->latency_bound = 0.1;
    e->high_water = 512 * 1024;
    e->stream_buffer = RELAY_STREAM_BUFFER;
    e->qbytes_limit = queue_bytes;
    e->max_message = RELAY_MAX_MESSAGE;
    e->max_attributes = RELAY_MAX_ATTRIBUTES;
    e->shed_after = RELAY_SHED_AFTER;
    e->bucket_limit = RELAY_BUCKET_LIMIT;
    for (int q = 0; q < RELAY_QUEUES; q++) {
        e->queues[q].cap = queue_limit ? queue_limit : 1;
        e->queues[q].items = calloc(e->queues[q].cap, sizeof *e->queues[q].items);
    }
    e->buffers = calloc(RELAY_BATCH, RELAY_BUFFER); /* untouched pages cost no memory */
    e->msgs = calloc(RELAY_BATCH, sizeof *e->msgs);
    e->iovs = calloc(RELAY_BATCH, sizeof *e->iovs);
    e->names = calloc(RELAY_BATCH, sizeof *e->names);
    e->sends = calloc(RELAY_BATCH, sizeof *e->sends);
    e->out = calloc(RELAY_BATCH, sizeof *e->out);
    for (int q = 0; q < RELAY_QUEUES; q++)
        if (!e->queues[q].items) return -ENOMEM;
    if (!e->buffers || !e->msgs || !e->iovs || !e->names || !e->sends || !e->out) return -ENOMEM;
    if (getrandom(e->rng, sizeof e->rng, 0) != sizeof e->rng) e->rng[0] = (uint64_t)time(NULL);
    e->rng[1] |= 1;
    if (listen_fd >= 0 && (e->listen_fd = fcntl(listen_fd, F_DUPFD_CLOEXEC, 3)) < 0) return -errno;
    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->up_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->epfd < 0 || e->wake_fd < 0 || e->up_fd < 0) return -errno;
    int rc = epoll_add(e->epfd, e->wake_fd, WAKE_TAG);
    if (rc == 0 && e->listen_fd >= 0) {
        int flags = fcntl(e->listen_fd, F_GETFL);
        fcntl(e->listen_fd, F_SETFL, flags | O_NONBLOCK);
        rc = epoll_add(e->epfd, e->listen_fd, LISTEN_TAG);
    }
    return rc;
}

static void alloc_free(relay_alloc *a) {
    if (a->fd >= 0) close(a->fd);
    table_free(&a->perms);
    table_free(&a->chan_num);
    table_free(&a->chan_peer);
    free(a);
}

/* Close the descriptors of removed allocations: only the thread (or a stopped engine) does. */
static void reap(relay_engine *e) {
    pthread_mutex_lock(&e->lock);
    relay_alloc *dead = e->graveyard;
    e->graveyard = NULL;
    pthread_mutex_unlock(&e->lock);
    while (dead) {
        relay_alloc *next = dead->next_dead;
        epoll_ctl(e->epfd, EPOLL_CTL_DEL, dead->fd, NULL);
        alloc_free(dead);
        dead = next;
    }
}

static void wake(relay_engine *e) {
    uint64_t one = 1;
    if (write(e->wake_fd, &one, sizeof one) < 0) { /* already signalled */
    }
}

void relay_free(relay_engine *e) {
    relay_stop(e);
    reap(e);
    relay_stream_free_all(e);
    while (e->closed_head) {
        relay_up *next = e->closed_head->next;
        free(e->closed_head);
        e->closed_head = next;
    }
    for (uint32_t i = 0; i < e->nslots; i++)
        if (e->allocs[i]) alloc_free(e->allocs[i]);
    free(e->allocs);
    free(e->free_slots);
    table_free(&e->by_client);
    table_free(&e->verdicts);
    table_free(&e->muted);
    table_free(&e->buckets);
    table_free(&e->queued);
    relay_nonce_free(&e->nonce);
    free(e->clusters);
    for (int q = 0; q < RELAY_QUEUES; q++) {
        relay_queue *queue = &e->queues[q];
        for (uint32_t i = 0; queue->items && i < queue->len; i++)
            free(queue->items[(queue->head + i) % queue->cap]);
        free(queue->items);
    }
    free(e->buffers);
    free(e->msgs);
    free(e->iovs);
    free(e->names);
    free(e->sends);
    free(e->out);
    int fds[] = {e->listen_fd, e->epfd, e->wake_fd, e->up_fd};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0) close(fds[i]);
    pthread_mutex_destroy(&e->lock);
    pthread_mutex_destroy(&e->qlock);
    memset(e, 0, sizeof *e);
    e->listen_fd = e->epfd = e->wake_fd = e->up_fd = -1;
}

/* --- state from Python ------------------------------------------------------------------------ */

static relay_alloc *alloc_of(relay_engine *e, uint64_t handle) {
    uint32_t slot = (uint32_t)handle, gen = (uint32_t)(handle >> 32);
    if (slot >= e->nslots) return NULL;
    relay_alloc *a = e->allocs[slot];
    return a && a->gen == gen ? a : NULL;
}

relay_alloc *relay_alloc_of(relay_engine *e, uint64_t handle) { return alloc_of(e, handle); }

int relay_add_allocation(relay_engine *e, const relay_addr *client, int relay_fd, double expires,
                         uint64_t stream, uint64_t *handle) {
    int family = socket_family(relay_fd);
    if (family < 0) return family;
    relay_alloc *a = calloc(1, sizeof *a);
    if (!a) return -ENOMEM;
    a->fd = fcntl(relay_fd, F_DUPFD_CLOEXEC, 3);
    if (a->fd < 0) {
        int err = -errno;
        free(a);
        return err;
    }
    fcntl(a->fd, F_SETFL, fcntl(a->fd, F_GETFL) | O_NONBLOCK);
    a->family = family;
    a->client = *client;
    a->expires = expires;
    a->stream = stream;
    int rc = 0;
    pthread_mutex_lock(&e->lock);
    if (table_find(&e->by_client, client)) {
        rc = -EEXIST;
    } else if (e->nfree == 0) {
        uint32_t n = e->nslots ? e->nslots * 2 : 64;
        relay_alloc **allocs = realloc(e->allocs, n * sizeof *allocs);
        uint32_t *free_slots = allocs ? realloc(e->free_slots, n * sizeof *free_slots) : NULL;
        if (allocs) e->allocs = allocs;
        if (!allocs || !free_slots) {
            rc = -ENOMEM;
        } else {
            e->free_slots = free_slots;
            for (uint32_t i = e->nslots; i < n; i++) {
                e->allocs[i] = NULL;
                e->free_slots[e->nfree++] = n - 1 - (i - e->nslots);
            }
            e->nslots = n;
        }
    }
    relay_entry *entry = NULL;
    if (rc == 0 && !(entry = table_put(&e->by_client, client))) rc = -ENOMEM;
    if (rc == 0) {
        a->slot = e->free_slots[--e->nfree];
        /* 30 bits of generation: a handle stays below RELAY_STREAM_TAG (streams' tags) */
        e->next_gen = (e->next_gen + 1) & 0x3FFFFFFFu;
        a->gen = e->next_gen ? e->next_gen : (e->next_gen = 1);
        entry->value = (int32_t)a->slot;
        e->allocs[a->slot] = a;
        *handle = ((uint64_t)a->gen << 32) | a->slot;
        /* Registered under the lock: the thread never sees the socket before its allocation. */
        rc = epoll_add(e->epfd, a->fd, *handle);
        if (rc < 0) {
            table_del(&e->by_client, client);
            e->allocs[a->slot] = NULL;
            e->free_slots[e->nfree++] = a->slot;
        }
    }
    pthread_mutex_unlock(&e->lock);
    if (rc < 0) alloc_free(a);
    return rc;
}

int relay_refresh_allocation(relay_engine *e, uint64_t handle, double expires) {
    pthread_mutex_lock(&e->lock);
    relay_alloc *a = alloc_of(e, handle);
    if (a) a->expires = expires;
    pthread_mutex_unlock(&e->lock);
    return a ? 0 : -ENOENT;
}

int relay_allocation_traffic(relay_engine *e, uint64_t handle, uint64_t traffic[4]) {
    pthread_mutex_lock(&e->lock);
    relay_alloc *a = alloc_of(e, handle);
    if (a) memcpy(traffic, a->traffic, sizeof a->traffic);
    pthread_mutex_unlock(&e->lock);
    return a ? 0 : -ENOENT;
}

int relay_set_bandwidth(relay_engine *e, uint64_t handle, double rate, double burst) {
    pthread_mutex_lock(&e->lock);
    relay_alloc *a = alloc_of(e, handle);
    if (a) {
        double now = relay_now();
        a->cap_rate = rate > 0 ? rate : 0;
        a->cap_burst = burst;
        for (int i = 0; i < 2; i++) {
            a->cap_tokens[i] = burst;
            a->cap_stamp[i] = now;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return a ? 0 : -ENOENT;
}

int relay_remove_allocation(relay_engine *e, uint64_t handle) {
    pthread_mutex_lock(&e->lock);
    relay_alloc *a = alloc_of(e, handle);
    if (a) {
        table_del(&e->by_client, &a->client);
        e->allocs[a->slot] = NULL;
        e->free_slots[e->nfree++] = a->slot;
        a->next_dead = e->graveyard;
        e->graveyard = a;
    }
    pthread_mutex_unlock(&e->lock);
    if (!a) return -ENOENT;
    if (__atomic_load_n(&e->running, __ATOMIC_ACQUIRE))
        wake(e); /* the thread closes the socket */
    else
        reap(e);
    return 0;
}

int relay_set_permission(relay_engine *e, uint64_t handle, const relay_addr *peer_ip,
                         double expires) {
    relay_addr k = ip_key(peer_ip);
    int rc = -ENOENT;
    pthread_mutex_lock(&e->lock);
    relay_alloc *a = alloc_of(e, handle);
    if (a) {
        relay_entry *s = table_put(&a->perms, &k);
        rc = s ? 0 : -ENOMEM;
        if (s) s->expiry = expires;
    }
    pthread_mutex_unlock(&e->lock);
    return rc;
}

int relay_remove_permission(relay_engine *e, uint64_t handle, const relay_addr *peer_ip) {
    relay_addr k = ip_key(peer_ip);
    pthread_mutex_lock(&e->lock);
    relay_alloc *a = alloc_of(e, handle);
    if (a) table_del(&a->perms, &k);
    pthread_mutex_unlock(&e->lock);
    return a ? 0 : -ENOENT;
}

int relay_bind_channel(relay_engine *e, uint64_t handle, uint16_t number, const relay_addr *peer,
                       double expires) {
    relay_addr nk = number_key(number);
    int rc = -ENOENT;
    pthread_mutex_lock(&e->lock);
    relay_alloc *a = alloc_of(e, handle);
    if (a) {
        relay_entry *old = table_find(&a->chan_num, &nk);
        if (old && memcmp(&old->peer, peer, sizeof *peer) != 0) table_del(&a->chan_peer, &old->peer);
        relay_entry *by_peer = table_find(&a->chan_peer, peer);
        if (by_peer && by_peer->value != number) {
            relay_addr other = number_key((uint16_t)by_peer->value);
            table_del(&a->chan_num, &other);
        }
        relay_entry *n = table_put(&a->chan_num, &nk);
        relay_entry *p = n ? table_put(&a->chan_peer, peer) : NULL;
        if (n && p) {
            n->peer = *peer;
            n->expiry = p->expiry = expires;
            p->value = number;
            rc = 0;
        } else {
            if (n) table_del(&a->chan_num, &nk);
            rc = -ENOMEM;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return rc;
}

int relay_remove_channel(relay_engine *e, uint64_t handle, uint16_t number) {
    relay_addr nk = number_key(number);
    pthread_mutex_lock(&e->lock);
    relay_alloc *a = alloc_of(e, handle);
    if (a) {
        relay_entry *n = table_find(&a->chan_num, &nk);
        if (n) {
            table_del(&a->chan_peer, &n->peer);
            table_del(&a->chan_num, &nk);
        }
    }
    pthread_mutex_unlock(&e->lock);
    return a ? 0 : -ENOENT;
}

int relay_set_verdict(relay_engine *e, const relay_addr *peer, int cluster) {
    int flags = cluster >= 0 ? cluster & RELAY_VERDICT_OWN : 0;
    cluster = cluster >= 0 ? cluster & ~RELAY_VERDICT_OWN : cluster;
    if (cluster >= RELAY_MAX_CLUSTERS) return -EINVAL;
    int rc = 0;
    pthread_mutex_lock(&e->lock);
    if (cluster >= 0 && (uint32_t)cluster >= e->nclusters) {
        uint32_t n = (uint32_t)cluster + 1;
        uint64_t(*grown)[4] = realloc(e->clusters, n * sizeof *grown);
        if (grown) {
            memset(grown + e->nclusters, 0, (n - e->nclusters) * sizeof *grown);
            e->clusters = grown;
            e->nclusters = n;
        } else {
            rc = -ENOMEM;
        }
    }
    if (rc == 0 && e->verdicts.used >= RELAY_VERDICT_LIMIT) {
        table_free(&e->verdicts); /* as the router's cache: dropped and refilled */
    }
    relay_entry *s = rc == 0 ? table_put(&e->verdicts, peer) : NULL;
    if (s)
        s->value = cluster < 0 ? -1 : cluster | flags;
    else
        rc = -ENOMEM;
    pthread_mutex_unlock(&e->lock);
    return rc;
}

int relay_mute(relay_engine *e, const relay_addr *client, double until) {
    int rc = 0;
    pthread_mutex_lock(&e->lock);
    if (e->muted.used >= RELAY_MUTED_LIMIT) table_free(&e->muted); /* a spoofed flood's */
    relay_entry *s = table_put(&e->muted, client);
    if (s)
        s->expiry = until;
    else
        rc = -ENOMEM;
    pthread_mutex_unlock(&e->lock);
    return rc;
}

void relay_strangers(relay_engine *e, double rate, uint32_t ips, uint32_t per_source) {
    pthread_mutex_lock(&e->lock);
    e->stranger_rate = rate > 0 ? rate : 0;
    e->bucket_limit = ips ? ips : 1;
    table_free(&e->buckets);
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_lock(&e->qlock);
    e->per_source = per_source;
    pthread_mutex_unlock(&e->qlock);
}

void relay_clear_verdicts(relay_engine *e) {
    pthread_mutex_lock(&e->lock);
    table_free(&e->verdicts);
    pthread_mutex_unlock(&e->lock);
}

/* --- the packet path ---------------------------------------------------------------------- */

/* XOR-PEER-ADDRESS (RFC 8489 §14.2) of a Send indication; 0 if malformed. */
static int parse_xor_address(const uint8_t *v, size_t len, const uint8_t *tid, relay_addr *out) {
    if (len < 4) return 0;
    uint8_t mask[16];
    put32(mask, COOKIE);
    memcpy(mask + 4, tid, 12);
    memset(out, 0, sizeof *out);
    out->port = be16(v + 2) ^ (uint16_t)(COOKIE >> 16);
    if (v[1] == 0x01 && len == 8) {
        memcpy(out->ip, V4_MAPPED, 12);
        for (int i = 0; i < 4; i++) out->ip[12 + i] = v[4 + i] ^ mask[i];
        return 1;
    }
    if (v[1] == 0x02 && len == 20) {
        for (int i = 0; i < 16; i++) out->ip[i] = v[4 + i] ^ mask[i];
        return 1;
    }
    return 0;
}

/* The plain Send indication: XOR-PEER-ADDRESS, DATA, optionally a matching FINGERPRINT last,
 * nothing else (stunner_api.stun.parse_send_indication, byte for byte). 1 with the peer and the
 * payload, 0 for anything else. */
int relay_parse_send(const uint8_t *b, size_t len, relay_addr *peer, const uint8_t **payload,
                     size_t *plen) {
    if (len < 20) return 0;
    size_t length = be16(b + 2);
    if (be16(b) != SEND_INDICATION || be32(b + 4) != COOKIE || length % 4 || len != 20 + length)
        return 0;
    const uint8_t *tid = b + 8;
    int have_peer = 0, have_data = 0;
    size_t off = 20;
    while (off < len) {
        if (off + 4 > len) return 0;
        uint16_t type = be16(b + off);
        size_t alen = be16(b + off + 2);
        size_t start = off + 4, stop = start + alen;
        if (stop > len) return 0;
        if (type == ATTR_XOR_PEER_ADDRESS && !have_peer) {
            if (!parse_xor_address(b + start, alen, tid, peer)) return 0;
            have_peer = 1;
        } else if (type == ATTR_DATA && !have_data) {
            *payload = b + start;
            *plen = alen;
            have_data = 1;
        } else if (type == ATTR_FINGERPRINT && alen == 4 && stop == len) {
            if ((relay_crc32(b, off) ^ FINGERPRINT_XOR) != be32(b + start)) return 0;
        } else {
            return 0;
        }
        off = stop + ((4 - alen % 4) % 4);
    }
    return have_peer && have_data;
}

static relay_alloc *alloc_of_client(relay_engine *e, const relay_addr *client) {
    relay_entry *s = table_find(&e->by_client, client);
    return s ? e->allocs[s->value] : NULL;
}

relay_alloc *relay_alloc_of_client(relay_engine *e, const relay_addr *client) {
    return alloc_of_client(e, client);
}

/* The verdict for a peer: >= 0 a cluster, -1 forbidden, -2 unknown (hand the packet up). */
static int verdict_of(relay_engine *e, const relay_addr *peer) {
    relay_entry *s = table_find(&e->verdicts, peer);
    if (!s) return -2;
    int v = s->value;
    if (v >= 0 && (v & RELAY_VERDICT_OWN)) {
        v &= ~RELAY_VERDICT_OWN;
        if (e->relay_ports && e->relay_ports[peer->port]) return -1; /* stunnerd's relay socket */
    }
    return v;
}

int relay_has_integrity(const uint8_t *b, size_t len) {
    for (size_t off = 20; off + 4 <= len;) {
        if (be16(b + off) == ATTR_MESSAGE_INTEGRITY) return 1;
        size_t alen = be16(b + off + 2);
        off += 4 + alen + (4 - alen % 4) % 4;
    }
    return 0;
}

/* Whether a stranger's unauthenticated STUN message from `addr` is within its source IP's
 * budget, spending one token if so: a token bucket of 2 * rate tokens refilled at `rate` per
 * second, kept as GCRA's theoretical arrival time `tat` (the bucket is full when tat <= now;
 * each message moves tat by 1/rate; a message is admitted while tat - now <= 2 - 1/rate, the
 * time the bucket takes to refill all but one token). stunnerd.turn.limits.RateLimiter decides
 * exactly the same with (tokens, time). The table holds at most bucket_limit IPs: when it is
 * full, the full buckets are forgotten (a new one starts full: nothing is lost), and only if
 * every bucket is in use the table starts afresh (counted in bucket_resets). */
static int stranger_admitted(relay_engine *e, const relay_addr *addr, double now) {
    double interval = 1.0 / e->stranger_rate, tolerance = 2.0 - interval;
    relay_addr k = ip_key(addr);
    relay_entry *b = table_find(&e->buckets, &k);
    double tat = b && b->expiry > now ? b->expiry : now;
    if (tat - now > tolerance + 1e-9) return 0;
    if (!b) {
        relay_table *t = &e->buckets;
        if (t->used >= e->bucket_limit) {
            for (uint32_t i = 0; i < t->cap; i++) {
                relay_entry *s = &t->slots[i];
                if (s->state == 1 && s->expiry <= now) {
                    s->state = 2;
                    t->used--;
                    t->deleted++;
                }
            }
            if (t->used >= e->bucket_limit) {
                table_free(t);
                e->bucket_resets++;
            }
        }
        b = table_put(t, &k);
        if (!b) return 1; /* out of memory: admitted, as without a limit */
    }
    b->expiry = tat + interval;
    return 1;
}

static int drop(relay_engine *e, int cause) {
    e->drops[cause]++;
    return RELAY_DROPPED;
}

int relay_drop(relay_engine *e, int cause) { return drop(e, cause); }

static int permitted(relay_alloc *a, const relay_addr *peer, double now) {
    relay_addr k = ip_key(peer);
    relay_entry *p = table_find(&a->perms, &k);
    return p && p->expiry > now;
}

/* The allocation's bandwidth cap, one direction (stunner_api.bandwidth.TokenBucket): refill
 * for the time since the last packet; pass (spending `len`) unless the bucket is empty. */
static int within_cap(relay_alloc *a, int direction, size_t len, double now) {
    if (a->cap_rate <= 0) return 1;
    if (now > a->cap_stamp[direction]) {
        double tokens = a->cap_tokens[direction] + (now - a->cap_stamp[direction]) * a->cap_rate;
        a->cap_tokens[direction] = tokens < a->cap_burst ? tokens : a->cap_burst;
        a->cap_stamp[direction] = now;
    }
    if (a->cap_tokens[direction] <= 0) return 0;
    a->cap_tokens[direction] -= (double)len;
    return 1;
}

static int client_to_peer(relay_engine *e, relay_alloc *a, const relay_addr *peer,
                          uint8_t *payload, size_t plen, size_t len, double now,
                          relay_send *out) {
    int ok = permitted(a, peer, now), verdict = verdict_of(e, peer);
    if (ok && verdict == -2) return RELAY_UP; /* the router decides, then re-injects */
    e->listener[CTR_RX_PACKETS]++;
    e->listener[CTR_RX_BYTES] += len;
    if (!ok) return drop(e, DROP_NO_PERMISSION);
    if (verdict < 0) return drop(e, DROP_FORBIDDEN);
    if (!within_cap(a, RELAY_TO_PEERS, plen, now)) return drop(e, DROP_BANDWIDTH);
    out->dstlen = relay_sockaddr_from_addr(&out->dst, a->family, peer);
    if (out->dstlen == 0) return drop(e, DROP_SEND_ERROR);
    out->fd = a->fd;
    out->iov[0].iov_base = payload;
    out->iov[0].iov_len = plen;
    out->iovcnt = 1;
    out->cluster = verdict;
    out->to_client = 0;
    out->payload = out->total = (uint32_t)plen;
    a->traffic[CTR_RX_PACKETS]++;
    a->traffic[CTR_RX_BYTES] += plen;
    return RELAY_RELAYED;
}

static int peer_to_client(relay_engine *e, relay_alloc *a, const relay_addr *peer,
                          uint8_t *payload, size_t plen, double now, relay_send *out) {
    if (now >= a->expires) return drop(e, DROP_EXPIRED);
    if (!permitted(a, peer, now)) return drop(e, DROP_NO_PERMISSION);
    int verdict = verdict_of(e, peer);
    if (verdict == -2) return RELAY_UP;
    if (verdict < 0) return drop(e, DROP_FORBIDDEN);
    if (!within_cap(a, RELAY_TO_CLIENT, plen, now)) return drop(e, DROP_BANDWIDTH);
    uint8_t *h = out->header;
    relay_entry *ch = table_find(&a->chan_peer, peer);
    static const uint8_t zeros[4] = {0};
    if (ch && ch->expiry > now) { /* ChannelData, padded over TCP only (RFC 8656 §12.5) */
        if (plen > 0xFFFF) return drop(e, DROP_TOO_BIG);
        put16(h, (uint16_t)ch->value);
        put16(h + 2, (uint16_t)plen);
        out->iov[0].iov_base = h;
        out->iov[0].iov_len = 4;
        out->iovcnt = 2;
        size_t pad = a->stream ? (4 - plen % 4) % 4 : 0;
        if (pad) {
            out->iov[2].iov_base = (void *)zeros;
            out->iov[2].iov_len = pad;
            out->iovcnt = 3;
        }
    } else { /* a Data indication: XOR-PEER-ADDRESS, DATA, a fresh transaction id */
        int v4 = addr_is_v4(peer);
        size_t alen = v4 ? 8 : 20, pad = (4 - plen % 4) % 4;
        size_t length = 4 + alen + 4 + plen + pad;
        if (length > 0xFFFF) return drop(e, DROP_TOO_BIG);
        put16(h, DATA_INDICATION);
        put16(h + 2, (uint16_t)length);
        put32(h + 4, COOKIE);
        uint64_t r1 = rng_next(e->rng), r2 = rng_next(e->rng);
        memcpy(h + 8, &r1, 8);
        memcpy(h + 16, &r2, 4);
        put16(h + 20, ATTR_XOR_PEER_ADDRESS);
        put16(h + 22, (uint16_t)alen);
        h[24] = 0;
        h[25] = v4 ? 0x01 : 0x02;
        put16(h + 26, peer->port ^ (uint16_t)(COOKIE >> 16));
        uint8_t mask[16];
        put32(mask, COOKIE);
        memcpy(mask + 4, h + 8, 12);
        const uint8_t *ip = v4 ? peer->ip + 12 : peer->ip;
        for (size_t i = 0; i < alen - 4; i++) h[28 + i] = ip[i] ^ mask[i];
        uint8_t *d = h + 24 + alen;
        put16(d, ATTR_DATA);
        put16(d + 2, (uint16_t)plen);
        out->iov[0].iov_base = h;
        out->iov[0].iov_len = 20 + 4 + alen + 4;
        out->iovcnt = 2;
        if (pad) {
            out->iov[2].iov_base = (void *)zeros;
            out->iov[2].iov_len = pad;
            out->iovcnt = 3;
        }
    }
    out->iov[1].iov_base = payload;
    out->iov[1].iov_len = plen;
    out->cluster = verdict;
    out->to_client = 1;
    out->payload = (uint32_t)plen;
    out->total = 0;
    for (int i = 0; i < out->iovcnt; i++) out->total += (uint32_t)out->iov[i].iov_len;
    a->traffic[CTR_TX_PACKETS]++;
    a->traffic[CTR_TX_BYTES] += plen;
    if (a->stream) { /* TURN-TCP: queued on the client's stream (out->fd -1: nothing to send) */
        out->fd = -1;
        return relay_stream_enqueue(e, a->stream, out, now);
    }
    out->dstlen = relay_sockaddr_from_addr(&out->dst, e->listen_family, &a->client);
    if (out->dstlen == 0) return drop(e, DROP_SEND_ERROR);
    out->fd = e->listen_fd;
    return RELAY_RELAYED;
}

/* Whether a client's datagram can be a STUN message or ChannelData, judged on its first bytes
 * alone (issue 15): ChannelData (the first two bits 01, so a channel number in 0x4000-0x7FFF)
 * whose length fits the datagram; or a STUN header (the first two bits 00, the magic cookie)
 * whose length is a multiple of 4, matches the datagram and keeps it within max_message. What
 * fails is what stunnerd.turn drops unanswered (TurnServer.handle, stun.parse_message). */
static int plausible(const relay_engine *e, const uint8_t *data, size_t len) {
    if (len < 4) return 0;
    if ((data[0] & 0xC0) == 0x40) return 4 + (size_t)be16(data + 2) <= len;
    if ((data[0] & 0xC0) != 0 || len < 20 || be32(data + 4) != COOKIE) return 0;
    size_t length = be16(data + 2);
    return length % 4 == 0 && len == 20 + length && len <= e->max_message;
}

int relay_process(relay_engine *e, int source, uint64_t handle, const struct sockaddr *from,
                  uint8_t *data, size_t len, double now, relay_send *out) {
    relay_addr addr;
    relay_addr_from_sockaddr(&addr, from);
    if (source == RELAY_SRC_PEER) {
        relay_alloc *a = alloc_of(e, handle);
        if (!a) return RELAY_UP; /* removed meanwhile: Python knows what to do */
        return peer_to_client(e, a, &addr, data, len, now, out);
    }
    if (!plausible(e, data, len)) return drop(e, DROP_INVALID);
    relay_alloc *a = alloc_of_client(e, &addr);
    if ((data[0] & 0xC0) == 0x40) { /* ChannelData (RFC 8656 §12.4) */
        if (!a) return drop(e, DROP_INVALID); /* a stranger's: Python has no allocation either */
        return relay_client_frame(e, a, data, len, now, out);
    }
    if (!a) { /* a stranger's STUN message: Python's, unless its error budget is spent */
        relay_entry *m = e->muted.used ? table_find(&e->muted, &addr) : NULL;
        if (m && m->expiry > now) return drop(e, DROP_RATE_LIMITED);
        if (relay_has_integrity(data, len)) return RELAY_UP;
        /* Unsigned: dropped while the engine is behind, then its source IP's budget, then the
         * engine's (a spoofed flood comes from everywhere), then an Allocate is answered here
         * without state (stateless.c). */
        if (e->behind) return drop(e, DROP_SHED);
        if (e->stranger_rate > 0 && !stranger_admitted(e, &addr, now))
            return drop(e, DROP_UNAUTHENTICATED);
        if (e->unsigned_rate > 0 && !relay_unsigned_admitted(e, now))
            return drop(e, DROP_UNAUTHENTICATED_TOTAL);
        if (e->answering && relay_unsigned_allocate(data, len, e->max_attributes)) {
            e->listener[CTR_RX_PACKETS]++;
            e->listener[CTR_RX_BYTES] += len;
            return relay_unauthorized(e, from, &addr, data, len, out);
        }
        return RELAY_UP;
    }
    return relay_client_frame(e, a, data, len, now, out);
}

/* A client's ChannelData (length checked by the caller: 4 + its length fit `len`) or STUN
 * message (a whole one) of allocation `a`: relayed if it is ChannelData on a bound channel or
 * a plain Send indication, for a permitted peer with a verdict; else handed up. */
int relay_client_frame(relay_engine *e, relay_alloc *a, uint8_t *data, size_t len, double now,
                       relay_send *out) {
    if (now >= a->expires) return RELAY_UP;
    if ((data[0] & 0xC0) == 0x40) {
        size_t plen = be16(data + 2);
        relay_addr nk = number_key(be16(data));
        relay_entry *ch = table_find(&a->chan_num, &nk);
        if (!ch || ch->expiry <= now) return RELAY_UP;
        relay_addr peer = ch->peer;
        return client_to_peer(e, a, &peer, data + 4, plen, len, now, out);
    }
    if (data[0] != 0x00 || data[1] != SEND_INDICATION) return RELAY_UP;
    relay_addr peer;
    const uint8_t *payload;
    size_t plen;
    if (!relay_parse_send(data, len, &peer, &payload, &plen)) return RELAY_UP;
    return client_to_peer(e, a, &peer, (uint8_t *)payload, plen, len, now, out);
}

int relay_payload_to_peer(relay_engine *e, uint64_t handle, const relay_addr *peer,
                          uint8_t *payload, size_t plen, size_t len, double now,
                          relay_send *out) {
    relay_alloc *a = alloc_of(e, handle);
    if (!a || now >= a->expires) return RELAY_UP;
    return client_to_peer(e, a, peer, payload, plen, len, now, out);
}

int relay_hand_up_room(relay_engine *e, const struct sockaddr *from, size_t len) {
    relay_addr client;
    relay_addr_from_sockaddr(&client, from);
    int known = table_find(&e->by_client, &client) != NULL;
    relay_queue *queue = &e->queues[known ? RELAY_QUEUE_KNOWN : RELAY_QUEUE_STRANGERS];
    pthread_mutex_lock(&e->qlock);
    int room = queue->len < queue->cap && queue->bytes + len <= e->qbytes_limit;
    pthread_mutex_unlock(&e->qlock);
    return room;
}

static uint32_t queued_total(const relay_engine *e) {
    uint32_t n = 0;
    for (int q = 0; q < RELAY_QUEUES; q++) n += e->queues[q].len;
    return n;
}

void relay_hand_up(relay_engine *e, int source, uint64_t handle, const struct sockaddr *from,
                   socklen_t fromlen, const uint8_t *data, size_t len) {
    int known = source == RELAY_SRC_PEER, which = RELAY_QUEUE_KNOWN;
    relay_addr key;
    memset(&key, 0, sizeof key);
    if (!known) {
        relay_addr client;
        relay_addr_from_sockaddr(&client, from);
        known = table_find(&e->by_client, &client) != NULL;
        key = ip_key(&client);
        /* A stranger's request with a NONCE that verifies has a queue of its own (issue 28):
         * an unsigned flood filling the strangers' queue cannot starve it. */
        if (!known)
            which = source == RELAY_SRC_CLIENT && relay_signed(e, data, len, &client)
                        ? RELAY_QUEUE_SIGNED
                        : RELAY_QUEUE_STRANGERS;
    }
    relay_queue *queue = &e->queues[which];
    pthread_mutex_lock(&e->qlock);
    relay_up *up = NULL;
    /* A stranger's source IP holds at most per_source places in its queue: one source cannot
     * fill it for the others (issue 20). */
    relay_entry *share = !known && e->per_source ? table_find(&e->queued, &key) : NULL;
    int fair = !share || (uint32_t)share->value < e->per_source;
    if (fair && queue->len < queue->cap && queue->bytes + len <= e->qbytes_limit)
        up = malloc(sizeof *up + len);
    if (up && !known && e->per_source) {
        if (!share) share = table_put(&e->queued, &key);
        if (share) share->value++;
    }
    if (!up) {
        pthread_mutex_unlock(&e->qlock);
        e->drops[DROP_QUEUE_FULL]++;
        return;
    }
    up->source = source;
    up->handle = handle;
    memset(&up->from, 0, sizeof up->from);
    if (fromlen > sizeof up->from) fromlen = sizeof up->from;
    memcpy(&up->from, from, fromlen);
    up->fromlen = fromlen;
    up->len = (uint32_t)len;
    up->counted = share != NULL;
    memcpy(up->data, data, len);
    up->next = NULL;
    queue->items[(queue->head + queue->len) % queue->cap] = up;
    queue->bytes += len;
    queue->len++;
    if (queued_total(e) == 1 && !e->closed_head) {
        uint64_t one = 1;
        if (write(e->up_fd, &one, sizeof one) < 0) { /* already readable */
        }
    }
    pthread_mutex_unlock(&e->qlock);
    e->handed_up++;
}

/* A stream's close event is due once everything handed up before it was drained. */
static int close_due(relay_engine *e) {
    relay_up *c = e->closed_head;
    if (!c) return 0;
    for (int q = 0; q < RELAY_QUEUES; q++)
        if (e->queues[q].drained < c->after[q]) return 0;
    return 1;
}

void relay_push_closed(relay_engine *e, relay_stream *s) {
    const char *reason = s->close_reason ? s->close_reason : "closed";
    size_t len = strlen(reason);
    relay_up *up = malloc(sizeof *up + len); /* never dropped: one per stream */
    if (!up) return;
    memset(up, 0, sizeof *up);
    up->source = RELAY_SRC_CLOSED;
    up->handle = ((uint64_t)s->gen << 32) | s->slot;
    memcpy(&up->from, &s->remote_ss, sizeof up->from);
    up->fromlen = s->remote_len;
    up->len = (uint32_t)len;
    memcpy(up->data, reason, len);
    pthread_mutex_lock(&e->qlock);
    int was_empty = queued_total(e) == 0 && !e->closed_head;
    for (int q = 0; q < RELAY_QUEUES; q++) up->after[q] = e->queues[q].drained + e->queues[q].len;
    if (e->closed_tail)
        e->closed_tail->next = up;
    else
        e->closed_head = up;
    e->closed_tail = up;
    if (was_empty) {
        uint64_t one = 1;
        if (write(e->up_fd, &one, sizeof one) < 0) { /* already readable */
        }
    }
    pthread_mutex_unlock(&e->qlock);
}

uint32_t relay_drain(relay_engine *e, relay_up **out, uint32_t max) {
    pthread_mutex_lock(&e->qlock);
    uint32_t n = 0;
    for (int q = 0; q < RELAY_QUEUES; q++) { /* known clients' and peers', signed, strangers' */
        relay_queue *queue = &e->queues[q];
        while (n < max && (queue->len > 0 || close_due(e))) {
            if (close_due(e)) {
                out[n++] = e->closed_head;
                e->closed_head = e->closed_head->next;
                if (!e->closed_head) e->closed_tail = NULL;
                continue;
            }
            relay_up *up = queue->items[queue->head];
            queue->head = (queue->head + 1) % queue->cap;
            queue->len--;
            queue->drained++;
            queue->bytes -= up->len;
            out[n++] = up;
            if (up->counted) {
                relay_addr client;
                relay_addr_from_sockaddr(&client, (const struct sockaddr *)&up->from);
                relay_addr key = ip_key(&client);
                relay_entry *share = table_find(&e->queued, &key);
                if (share && --share->value <= 0) table_del(&e->queued, &key);
            }
        }
    }
    while (n < max && close_due(e)) {
        out[n++] = e->closed_head;
        e->closed_head = e->closed_head->next;
        if (!e->closed_head) e->closed_tail = NULL;
    }
    if (n > 0 && __atomic_load_n(&e->stalled, __ATOMIC_RELAXED)) wake(e); /* room for them */
    if (queued_total(e) == 0 && !e->closed_head) {
        uint64_t value;
        if (read(e->up_fd, &value, sizeof value) < 0) { /* not signalled */
        }
    }
    pthread_mutex_unlock(&e->qlock);
    return n;
}

void relay_flush(relay_engine *e, relay_send *sends, int count, struct mmsghdr *scratch) {
    int sent_ok[RELAY_BATCH], order[RELAY_BATCH];
    /* Sends grouped by socket, each socket's in the order decided (a stable insertion sort of
     * at most RELAY_BATCH): one sendmmsg per socket. What goes to clients leaves through the
     * listener socket however many relay sockets it came from; a relay socket's packets keep
     * their order, and packets of different sockets have none to keep. */
    for (int i = 0; i < count; i++) {
        int j = i;
        while (j > 0 && sends[order[j - 1]].fd > sends[i].fd) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (int start = 0; start < count;) {
        int fd = sends[order[start]].fd, end = start;
        if (fd < 0) { /* queued on a stream (stream.c), counted there */
            sent_ok[order[start++]] = 1;
            continue;
        }
        while (end < count && sends[order[end]].fd == fd) {
            relay_send *s = &sends[order[end]];
            struct msghdr *m = &scratch[end - start].msg_hdr;
            memset(m, 0, sizeof *m);
            m->msg_name = &s->dst;
            m->msg_namelen = s->dstlen;
            m->msg_iov = s->iov;
            m->msg_iovlen = (size_t)s->iovcnt;
            end++;
        }
        int done = 0;
        while (start + done < end) {
            int n = sendmmsg(fd, scratch + done, (unsigned)(end - start - done), MSG_DONTWAIT);
            __atomic_fetch_add(&e->send_calls, 1, __ATOMIC_RELAXED);
            if (n > 0) {
                for (int i = 0; i < n; i++) sent_ok[order[start + done + i]] = 1;
                done += n;
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                sent_ok[order[start + done]] = 0; /* a full buffer or an error: this one is lost */
                done++;
            }
        }
        start = end;
    }
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < count; i++) {
        relay_send *s = &sends[i];
        if (s->fd < 0) continue;
        if (!sent_ok[i]) {
            e->drops[DROP_SEND_ERROR]++;
            continue;
        }
        if (s->to_client) {
            e->listener[CTR_TX_PACKETS]++;
            e->listener[CTR_TX_BYTES] += s->total;
        }
        if (s->cluster >= 0 && (uint32_t)s->cluster < e->nclusters) {
            uint64_t *c = e->clusters[s->cluster];
            c[s->to_client ? CL_RX_PACKETS : CL_TX_PACKETS]++;
            c[s->to_client ? CL_RX_BYTES : CL_TX_BYTES] += s->payload;
        }
    }
    pthread_mutex_unlock(&e->lock);
}

void relay_flush_pending(relay_engine *e) {
    relay_flush(e, e->sends, e->pending, e->out);
    e->pending = e->batched = 0;
}

/* Read one batch from fd into the wakeup's free batch buffers and decide it (sent by
 * relay_flush_pending, with what the other ready sockets gave); 1 if the read filled the
 * room it had (fd may hold more), 0 if fd is drained. */
static int serve_batch(relay_engine *e, int fd, int source, uint64_t handle) {
    if (e->batched == RELAY_BATCH) relay_flush_pending(e);
    int base = e->batched, room = RELAY_BATCH - base;
    for (int i = base; i < RELAY_BATCH; i++) {
        e->iovs[i].iov_base = e->buffers + (size_t)i * RELAY_BUFFER;
        e->iovs[i].iov_len = RELAY_BUFFER;
        struct msghdr *m = &e->msgs[i].msg_hdr;
        memset(m, 0, sizeof *m);
        m->msg_name = &e->names[i];
        m->msg_namelen = sizeof e->names[i];
        m->msg_iov = &e->iovs[i];
        m->msg_iovlen = 1;
    }
    int n = recvmmsg(fd, e->msgs + base, (unsigned)room, MSG_DONTWAIT, NULL);
    __atomic_fetch_add(&e->recv_calls, 1, __ATOMIC_RELAXED);
    int listener = source == RELAY_SRC_CLIENT;
    if (listener && n < room) e->full_reads = 0; /* the socket is empty: caught up */
    if (n <= 0) return 0;
    e->batched += n;
    double now = relay_now();
    pthread_mutex_lock(&e->lock);
    if (listener) e->behind = e->full_reads >= (uint64_t)e->shed_after * RELAY_BATCH;
    for (int i = base; i < base + n; i++) {
        uint8_t *data = e->iovs[i].iov_base;
        size_t len = e->msgs[i].msg_len;
        const struct sockaddr *from = (const struct sockaddr *)&e->names[i];
        if (from->sa_family != AF_INET && from->sa_family != AF_INET6) continue;
        relay_send *out = &e->sends[e->pending];
        int outcome = relay_process(e, source, handle, from, data, len, now, out);
        if (outcome == RELAY_RELAYED)
            e->pending++;
        else if (outcome == RELAY_UP)
            relay_hand_up(e, source, handle, from, e->msgs[i].msg_hdr.msg_namelen, data, len);
    }
    pthread_mutex_unlock(&e->lock);
    /* A read shares the wakeup's batch with the other ready sockets, so it may have had less
     * than a batch of room: what counts is datagrams read since the socket was last empty. */
    if (listener && n == room) e->full_reads += (uint64_t)n;
    return n == room;
}

__thread int relay_in_thread;

static void *run(void *arg) {
    relay_engine *e = arg;
    relay_in_thread = 1;
    struct epoll_event events[64];
    while (!__atomic_load_n(&e->stopping, __ATOMIC_ACQUIRE)) {
        int n = epoll_wait(e->epfd, events, 64, -1);
        if (n < 0 && errno != EINTR) break;
        if (n > 0) __atomic_fetch_add(&e->wakeups, 1, __ATOMIC_RELAXED);
        for (int i = 0; i < n; i++) {
            uint64_t tag = events[i].data.u64;
            if (tag == WAKE_TAG) {
                uint64_t value;
                if (read(e->wake_fd, &value, sizeof value) < 0) { /* spurious */
                }
                continue;
            }
            if (tag & RELAY_STREAM_TAG && tag != LISTEN_TAG) {
                relay_flush_pending(e); /* a stream's frames are decided into e->sends too */
                relay_stream_event(e, tag, events[i].events);
                continue;
            }
            int fd = -1, source = RELAY_SRC_CLIENT;
            uint64_t handle = 0;
            if (tag == LISTEN_TAG) {
                fd = e->listen_fd;
            } else {
                pthread_mutex_lock(&e->lock);
                relay_alloc *a = alloc_of(e, tag);
                fd = a ? a->fd : -1; /* a removed one stays open until reap() below */
                pthread_mutex_unlock(&e->lock);
                source = RELAY_SRC_PEER;
                handle = tag;
            }
            if (fd < 0) continue;
            for (int k = 0; k < READS_PER_WAKEUP; k++)
                if (!serve_batch(e, fd, source, handle)) break;
        }
        relay_flush_pending(e); /* every ready socket's packets, one sendmmsg per socket */
        relay_stream_resume(e);  /* streams that waited for room in the hand-up queues */
        relay_stream_service(e); /* what the batch queued toward streams, and closes */
        reap(e);
        relay_stream_reap(e);
    }
    return NULL;
}

int relay_start(relay_engine *e) {
    if (__atomic_load_n(&e->running, __ATOMIC_ACQUIRE)) return 0;
    __atomic_store_n(&e->stopping, 0, __ATOMIC_RELEASE);
    int rc = pthread_create(&e->thread, NULL, run, e);
    if (rc) return -rc;
    __atomic_store_n(&e->running, 1, __ATOMIC_RELEASE);
    return 0;
}

void relay_stop(relay_engine *e) {
    if (!__atomic_load_n(&e->running, __ATOMIC_ACQUIRE)) return;
    __atomic_store_n(&e->stopping, 1, __ATOMIC_RELEASE);
    wake(e);
    pthread_join(e->thread, NULL);
    __atomic_store_n(&e->running, 0, __ATOMIC_RELEASE);
}
