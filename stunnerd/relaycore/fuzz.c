/* A fuzz driver for the relay core, built with -fsanitize=address,undefined by
 * tests/stunnerd/test_native_fuzz.py (never part of the extension).
 *
 *   fuzz ITERATIONS SEED
 *   fuzz canary        (reads one byte past a buffer: proves the sanitizers are on)
 *
 * Sets up an engine on a loopback listener with allocations (IPv4 and IPv6 relay sockets),
 * permissions, channels, verdicts and mutes, starts its thread, then per iteration builds a
 * datagram (a valid ChannelData or Send indication, mutated, or random bytes) in a heap buffer of
 * exactly its size (or a STUN request with random attributes, MESSAGE-INTEGRITY among them,
 * from strangers of many source IPs: their budgets, the bounded bucket table and the
 * per-source share of the strangers' queue, with tiny bounds so that they fill; unsigned
 * Allocates the engine answers itself with a stateless 401, and signed requests carrying a
 * nonce of the engine's key, valid or mutated, for the signed queue: issue 28), and either
 * decides it directly (relay_process, as a client or a peer
 * packet) or sends it through the real sockets to the thread. The tables change under it
 * meanwhile.
 *
 * TURN-TCP streams (stream.c): byte streams of several frames (ChannelData padded, Send
 * indications, STUN requests, each maybe mutated, or random bytes) are split at random
 * boundaries and fed to the framing (relay_stream_input) of a stream of a client with an
 * allocation, directly or through real loopback TCP connections the engine's thread reads;
 * a stream of unmutated frames must be framed whole whatever the splits. Peers' packets go to
 * an allocation of a stream client (queued toward it, with a tiny latency bound and high-water
 * mark so that both drop), the hand-up queues are left to fill now and then (streams then wait
 * for room), and streams are closed and replaced under the traffic. Prints the
 * outcomes; any memory or undefined-behaviour error aborts with the sanitizer's report.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay.h"

#define ALLOCS 4
#define SEEDS 8

static uint64_t state;

static uint32_t rnd(void) { /* splitmix64 */
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 16);
}

static int udp_socket(int family, const char *host) {
    int fd = socket(family, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    if (family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        in->sin_family = AF_INET;
        inet_pton(AF_INET, host, &in->sin_addr);
        len = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        in6->sin6_family = AF_INET6;
        inet_pton(AF_INET6, host, &in6->sin6_addr);
        len = sizeof *in6;
    }
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0) return -1;
    return fd;
}

static void local(int fd, struct sockaddr_storage *ss, relay_addr *a) {
    socklen_t len = sizeof *ss;
    getsockname(fd, (struct sockaddr *)ss, &len);
    relay_addr_from_sockaddr(a, (struct sockaddr *)ss);
}

static size_t put_send(uint8_t *b, const relay_addr *peer, const uint8_t *payload, size_t plen,
                       int fingerprint) {
    int v4 = peer->ip[10] == 0xff && peer->ip[0] == 0;
    size_t alen = v4 ? 8 : 20, off = 20;
    b[0] = 0x00, b[1] = 0x16;
    uint32_t cookie = htonl(0x2112A442);
    memcpy(b + 4, &cookie, 4);
    for (int i = 0; i < 12; i++) b[8 + i] = (uint8_t)rnd();
    b[off] = 0x00, b[off + 1] = 0x12, b[off + 2] = 0, b[off + 3] = (uint8_t)alen;
    b[off + 4] = 0, b[off + 5] = v4 ? 1 : 2;
    uint16_t port = peer->port ^ 0x2112;
    b[off + 6] = (uint8_t)(port >> 8), b[off + 7] = (uint8_t)port;
    const uint8_t *ip = v4 ? peer->ip + 12 : peer->ip;
    for (size_t i = 0; i < alen - 4; i++) b[off + 8 + i] = ip[i] ^ b[4 + i];
    off += 4 + alen;
    b[off] = 0x00, b[off + 1] = 0x13, b[off + 2] = (uint8_t)(plen >> 8), b[off + 3] = (uint8_t)plen;
    memcpy(b + off + 4, payload, plen);
    off += 4 + plen;
    while (off % 4) b[off++] = 0;
    size_t length = off - 20 + (fingerprint ? 8 : 0);
    b[2] = (uint8_t)(length >> 8), b[3] = (uint8_t)length;
    if (fingerprint) {
        uint32_t crc = relay_crc32(b, off) ^ 0x5354554Eu;
        b[off] = 0x80, b[off + 1] = 0x28, b[off + 2] = 0, b[off + 3] = 4;
        crc = htonl(crc);
        memcpy(b + off + 4, &crc, 4);
        off += 8;
    }
    return off;
}

/* A STUN request with up to 6 attributes of random types (MESSAGE-INTEGRITY often) and
 * lengths, their headers consistent or not. */
static size_t put_request(uint8_t *b, size_t cap) {
    b[0] = 0x00, b[1] = (uint8_t)(rnd() % 2 ? 0x03 : 0x01);
    uint32_t cookie = htonl(0x2112A442);
    memcpy(b + 4, &cookie, 4);
    for (int i = 0; i < 12; i++) b[8 + i] = (uint8_t)rnd();
    size_t off = 20;
    int n = (int)(rnd() % 7);
    for (int i = 0; i < n && off + 4 <= cap; i++) {
        uint16_t type = rnd() % 3 ? (uint16_t)(rnd() % 0x30) : 0x0008;
        size_t alen = rnd() % 4 ? rnd() % 40 : rnd() % 0x10000;
        b[off] = (uint8_t)(type >> 8), b[off + 1] = (uint8_t)type;
        b[off + 2] = (uint8_t)(alen >> 8), b[off + 3] = (uint8_t)alen;
        off += 4;
        size_t fill = alen + (4 - alen % 4) % 4;
        if (off + fill > cap || rnd() % 8 == 0) break; /* a header that overruns the message */
        for (size_t k = 0; k < fill; k++) b[off + k] = (uint8_t)rnd();
        off += fill;
    }
    size_t length = off - 20;
    b[2] = (uint8_t)(length >> 8), b[3] = (uint8_t)length;
    return off;
}

static const uint8_t SECRET[32] = "fuzz-secret-fuzz-secret-fuzz-sec";

/* A stranger's Allocate of the stateless path (stateless.c) from `from`: unsigned (maybe with
 * a FINGERPRINT), or signed with a NONCE of the engine's key for `from` (or another address)
 * and a MESSAGE-INTEGRITY of random bytes. */
static size_t put_stateless(uint8_t *b, relay_nonce_key *key, const relay_addr *from) {
    b[0] = 0x00, b[1] = 0x03;
    uint32_t cookie = htonl(0x2112A442);
    memcpy(b + 4, &cookie, 4);
    for (int i = 0; i < 12; i++) b[8 + i] = (uint8_t)rnd();
    size_t off = 20;
    b[off] = 0x00, b[off + 1] = 0x19, b[off + 2] = 0, b[off + 3] = 4; /* REQUESTED-TRANSPORT */
    b[off + 4] = 17, b[off + 5] = b[off + 6] = b[off + 7] = 0;
    off += 8;
    int signed_ = rnd() % 2;
    if (signed_) {
        relay_addr bound = *from;
        if (rnd() % 4 == 0) bound.port ^= 1; /* another address's nonce */
        b[off] = 0x00, b[off + 1] = 0x15, b[off + 2] = 0, b[off + 3] = RELAY_NONCE_LEN;
        relay_nonce_issue(key, &bound, relay_wall() + (rnd() % 8 == 0 ? -7200 : 0),
                          (char *)b + off + 4);
        off += 4 + RELAY_NONCE_LEN;
        b[off] = 0x00, b[off + 1] = 0x08, b[off + 2] = 0, b[off + 3] = 20;
        for (int i = 0; i < 20; i++) b[off + 4 + i] = (uint8_t)rnd();
        off += 24;
    }
    b[2] = 0, b[3] = (uint8_t)(off - 20 + (!signed_ && rnd() % 2 ? 8 : 0));
    if (b[3] != off - 20) { /* a FINGERPRINT, last */
        uint32_t crc = relay_crc32(b, off) ^ 0x5354554Eu;
        b[off] = 0x80, b[off + 1] = 0x28, b[off + 2] = 0, b[off + 3] = 4;
        b[off + 4] = (uint8_t)(crc >> 24), b[off + 5] = (uint8_t)(crc >> 16);
        b[off + 6] = (uint8_t)(crc >> 8), b[off + 7] = (uint8_t)crc;
        off += 8;
    }
    return off;
}

/* A connected loopback TCP pair: *client (the harness's end) and the accepted end. */
static int tcp_pair(int listener, int *client) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(listener, (struct sockaddr *)&ss, &len);
    *client = socket(AF_INET, SOCK_STREAM, 0);
    if (*client < 0 || connect(*client, (struct sockaddr *)&ss, len) < 0) return -1;
    int one = 1;
    setsockopt(*client, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof one);
    return accept(listener, NULL, NULL);
}

typedef struct {
    int client;      /* the harness's end, -1 when closed */
    uint64_t handle; /* the engine's stream */
} tcp_conn;

static void tcp_open(relay_engine *e, int listener, tcp_conn *c) {
    int accepted = tcp_pair(listener, &c->client);
    if (accepted < 0 || relay_add_stream(e, accepted, &c->handle) < 0) {
        perror("stream");
        exit(2);
    }
    close(accepted); /* the engine has its duplicate */
}

/* Frames of a byte stream over TCP, one after another: returns the length written at b. */
static size_t put_stream_frame(uint8_t *b, size_t cap, const relay_addr *peer,
                               const uint8_t *payload, int kind) {
    size_t plen = rnd() % 300, len;
    if (kind == 0) { /* ChannelData, padded */
        b[0] = 0x40, b[1] = (uint8_t)(rnd() % 3);
        b[2] = (uint8_t)(plen >> 8), b[3] = (uint8_t)plen;
        memcpy(b + 4, payload, plen);
        len = 4 + plen;
        while (len % 4) b[len++] = 0;
    } else if (kind == 1) {
        len = put_send(b, peer, payload, plen, (int)(rnd() % 2));
    } else {
        len = put_request(b, cap < 1400 ? cap : 1400);
        len &= ~(size_t)3; /* a consistent length: a whole STUN message */
        if (len < 20) len = 20;
        b[2] = (uint8_t)((len - 20) >> 8), b[3] = (uint8_t)(len - 20);
    }
    return len;
}

static size_t mutate(uint8_t *b, size_t len, size_t cap) {
    int rounds = 1 + (int)(rnd() % 4);
    for (int r = 0; r < rounds; r++) {
        switch (rnd() % 7) {
        case 0: /* flip a bit */
            if (len) b[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1: /* an interesting byte */
            if (len) b[rnd() % len] = (uint8_t[]){0, 0xff, 0x40, 0x7f, 0x80, 0x12, 0x13, 0x28}[rnd() % 8];
            break;
        case 2: /* truncate */
            len = len ? rnd() % (len + 1) : 0;
            break;
        case 3: /* extend with random bytes */
        {
            size_t extra = rnd() % 64;
            if (len + extra > cap) extra = cap - len;
            for (size_t i = 0; i < extra; i++) b[len + i] = (uint8_t)rnd();
            len += extra;
            break;
        }
        case 4: /* a length field: the message's or an attribute's */
            if (len >= 4) {
                size_t at = (rnd() % 2 || len < 24) ? 2 : 20 + 4 * (rnd() % ((len - 20) / 4));
                if (at + 1 < len) b[at] = (uint8_t)rnd(), b[at + 1] = (uint8_t)rnd();
            }
            break;
        case 5: /* an attribute type */
            if (len >= 24) {
                size_t at = 20 + 4 * (rnd() % ((len - 20) / 4));
                if (at + 1 < len) b[at] = (uint8_t)(rnd() % 2 ? 0x80 : 0), b[at + 1] = (uint8_t)rnd();
            }
            break;
        default: /* random bytes throughout */
            for (size_t i = 0; i < len; i++)
                if (rnd() % 16 == 0) b[i] = (uint8_t)rnd();
        }
    }
    return len;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "canary") == 0) {
        size_t n = strlen(argv[1]);
        char *buffer = malloc(n);
        memcpy(buffer, argv[1], n);
        int past = ((volatile char *)buffer)[n];
        free(buffer);
        return past == 'x';
    }
    long iterations = argc > 1 ? atol(argv[1]) : 100000;
    state = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    int listener = udp_socket(AF_INET, "127.0.0.1");
    int client = udp_socket(AF_INET, "127.0.0.1");
    int peer4 = udp_socket(AF_INET, "127.0.0.1");
    int peer6 = udp_socket(AF_INET6, "::1");
    if (listener < 0 || client < 0 || peer4 < 0) {
        perror("sockets");
        return 2;
    }
    relay_engine *e = calloc(1, sizeof *e);
    if (relay_new(e, listener, 256, 1 << 20) < 0) {
        perror("relay_new");
        return 2;
    }
    struct sockaddr_storage listen_ss, client_ss, peer_ss[2];
    relay_addr listen_addr, clients[ALLOCS], peers[2];
    local(listener, &listen_ss, &listen_addr);
    local(client, &client_ss, &clients[0]);
    local(peer4, &peer_ss[0], &peers[0]);
    int npeers = 1;
    if (peer6 >= 0) local(peer6, &peer_ss[1], &peers[npeers++]);
    int relays[ALLOCS];
    uint64_t handles[ALLOCS];
    double now = relay_now();
    for (int i = 0; i < ALLOCS; i++) {
        relays[i] = (i % 2 && peer6 >= 0) ? udp_socket(AF_INET6, "::1") : udp_socket(AF_INET, "127.0.0.1");
        if (i > 0) {
            clients[i] = clients[0];
            clients[i].port = (uint16_t)(clients[0].port + i);
        }
        if (relay_add_allocation(e, &clients[i], relays[i], now + 3600, 0, &handles[i]) < 0) {
            perror("relay_add_allocation");
            return 2;
        }
        for (int p = 0; p < npeers; p++) {
            relay_set_permission(e, handles[i], &peers[p], now + 3600);
            relay_bind_channel(e, handles[i], (uint16_t)(0x4000 + p), &peers[p], now + 3600);
        }
    }
    for (int p = 0; p < npeers; p++) relay_set_verdict(e, &peers[p], p);
    relay_strangers(e, 5.0, 4, 2); /* 5/s, burst 10; 4 source IPs; 2 queued per IP */
    relay_unsigned_budget(e, 200.0); /* all strangers' unsigned STUN: 200/s, burst 400 */
    relay_nonce_key key; /* the engine's nonce key, for the signed requests built here */
    if (relay_nonce_init(&key, SECRET, sizeof SECRET, 600, (const uint8_t *)"fuzz", 4) < 0 ||
        relay_answering(e, 1, SECRET, sizeof SECRET, 600, (const uint8_t *)"fuzz", 4,
                        (const uint8_t *)"realm", 5) < 0) {
        perror("relay_answering");
        return 2;
    }
    /* TURN-TCP: a listener for real connections, three of them with allocations (the first
     * one's peers' packets are queued toward it), and a stream of the harness's own that only
     * relay_stream_input feeds (never registered: no thread touches it). */
    int tcp_listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in tl = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (tcp_listener < 0 || bind(tcp_listener, (struct sockaddr *)&tl, sizeof tl) < 0 ||
        listen(tcp_listener, 64) < 0) {
        perror("tcp listener");
        return 2;
    }
    relay_stream_limits(e, 0.0005, 4096, 2048); /* tiny: late and full queues, long frames */
    enum { CONNS = 3 };
    tcp_conn conns[CONNS];
    relay_addr conn_addr[CONNS];
    int conn_relay[CONNS];
    uint64_t conn_alloc[CONNS];
    for (int i = 0; i < CONNS; i++) {
        tcp_open(e, tcp_listener, &conns[i]);
        struct sockaddr_storage css;
        local(conns[i].client, &css, &conn_addr[i]);
        conn_relay[i] = udp_socket(AF_INET, "127.0.0.1");
        if (relay_add_allocation(e, &conn_addr[i], conn_relay[i], now + 3600, conns[i].handle,
                                 &conn_alloc[i]) < 0) {
            perror("stream allocation");
            return 2;
        }
        relay_set_permission(e, conn_alloc[i], &peers[0], now + 3600);
        relay_bind_channel(e, conn_alloc[i], 0x4000, &peers[0], now + 3600);
    }
    relay_stream own; /* fed directly: its remote is clients[0] (an allocation) */
    memset(&own, 0, sizeof own);
    own.fd = -1;
    own.remote = clients[0];
    relay_sockaddr_from_addr(&own.remote_ss, AF_INET, &own.remote);
    own.remote_len = sizeof(struct sockaddr_in);
    long streamed = 0, closed = 0;
    static relay_send stream_sends[RELAY_BATCH];
    static struct mmsghdr stream_hdrs[RELAY_BATCH];
    static uint8_t stream_buf[8192];

    relay_start(e);

    long outcomes[3] = {0}, sent = 0;
    uint8_t scratch[2048];
    uint8_t payload[1200];
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)i;
    for (long it = 0; it < iterations; it++) {
        /* the tables change under the traffic */
        uint32_t change = rnd() % 64;
        int which = (int)(rnd() % ALLOCS), p = (int)(rnd() % (uint32_t)npeers);
        double t = relay_now() + ((rnd() % 4) ? 3600 : -1);
        if (change == 0) relay_clear_verdicts(e);
        else if (change == 1) relay_set_verdict(e, &peers[p], (int)(rnd() % 3) - 1);
        else if (change == 2) relay_set_permission(e, handles[which], &peers[p], t);
        else if (change == 3) relay_remove_permission(e, handles[which], &peers[p]);
        else if (change == 4) relay_bind_channel(e, handles[which], (uint16_t)(0x4000 + rnd() % 3), &peers[p], t);
        else if (change == 5) relay_remove_channel(e, handles[which], (uint16_t)(0x4000 + rnd() % 3));
        else if (change == 6) relay_refresh_allocation(e, handles[which], t);
        else if (change == 8) { /* mute a stranger (or, harmlessly, a client) */
            relay_addr muted = clients[which];
            muted.port ^= (uint16_t)(rnd() % 2);
            relay_mute(e, &muted, t);
        }
        else if (change == 9) /* the engine stops answering, or starts again */
            relay_answering(e, (int)(rnd() % 4 != 0), SECRET, sizeof SECRET, 600,
                            (const uint8_t *)"fuzz", 4, (const uint8_t *)"realm", 5);
        else if (change == 10) relay_unsigned_budget(e, rnd() % 2 ? 200.0 : 0.0);
        else if (change == 7 && which > 0) { /* replace an allocation */
            relay_remove_allocation(e, handles[which]);
            relay_add_allocation(e, &clients[which], relays[which], relay_now() + 3600, 0, &handles[which]);
            relay_set_permission(e, handles[which], &peers[p], relay_now() + 3600);
        }
        if (rnd() % 4 == 0) { /* a byte stream of frames, split at random boundaries */
            size_t len = 0;
            int frames = 1 + (int)(rnd() % 6), mutated = 0;
            for (int f = 0; f < frames && len + 1400 < sizeof stream_buf; f++) {
                size_t flen = put_stream_frame(stream_buf + len, sizeof stream_buf - len, &peers[p],
                                               payload, (int)(rnd() % 3));
                uint8_t *frame = stream_buf + len;
                if ((frame[0] & 0xC0) == 0x40 && rnd() % 8 == 0) { /* unpadded: out of step */
                    size_t unpadded = 4 + (size_t)((frame[2] << 8) | frame[3]);
                    mutated |= unpadded != flen;
                    flen = unpadded;
                } else if (rnd() % 6 == 0) {
                    flen = mutate(stream_buf + len, flen, sizeof stream_buf - len);
                    mutated = 1;
                }
                if (flen > 2048) mutated = 1; /* over the stream buffer: closes, rightly */
                len += flen;
            }
            if (rnd() % 16 == 0) { /* random bytes */
                len = rnd() % 512;
                for (size_t i = 0; i < len; i++) stream_buf[i] = (uint8_t)rnd();
                mutated = 1;
            }
            int through = rnd() % 4 == 0;
            tcp_conn *c = &conns[rnd() % CONNS];
            if (through && c->client < 0) through = 0;
            int failed = 0;
            for (size_t at = 0; at < len && !failed;) {
                size_t piece = 1 + rnd() % (rnd() % 2 ? 8 : 600);
                if (piece > len - at) piece = len - at;
                if (through) {
                    if (send(c->client, stream_buf + at, piece, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
                        failed = 1; /* closed by the engine (bad framing), or full */
                } else {
                    uint8_t *chunk = malloc(piece); /* exactly: ASan sees any over-read */
                    memcpy(chunk, stream_buf + at, piece);
                    int rc;
                    const uint8_t *data = chunk;
                    size_t dlen = piece;
                    do {
                        int count = 0;
                        pthread_mutex_lock(&e->lock);
                        rc = relay_stream_input(e, &own, data, dlen, relay_now(), rnd() % 8 ? 0 : 1.0,
                                                stream_sends, &count);
                        pthread_mutex_unlock(&e->lock);
                        relay_flush(e, stream_sends, count, stream_hdrs);
                        data = NULL, dlen = 0;
                    } while (rc == 1);
                    free(chunk);
                    if (rc < 0) { /* closed: a fresh stream */
                        if (!mutated) {
                            fprintf(stderr, "valid frames closed the stream: %s\n", own.close_reason);
                            abort();
                        }
                        free(own.in);
                        own.in = NULL;
                        own.in_off = own.in_len = own.in_cap = 0;
                        own.frame_started = 0;
                        own.close_reason = NULL;
                        failed = 1;
                        closed++;
                    }
                }
                at += piece;
            }
            if (!through && !failed && !mutated && own.in_len != own.in_off) {
                fprintf(stderr, "valid frames left %u bytes unframed\n", own.in_len - own.in_off);
                abort();
            }
            if (!through && !failed && own.in_len != own.in_off) { /* a leftover: start afresh */
                own.in_off = own.in_len = 0;
                own.frame_started = 0;
            }
            streamed++;
        }
        if (change == 9) relay_stream_send(e, conns[which % CONNS].handle, payload, rnd() % 64);
        if (change == 10) { /* a stream closed and replaced under the traffic */
            tcp_conn *c = &conns[which % CONNS];
            relay_close_stream(e, c->handle);
            if (c->client >= 0) close(c->client);
            c->client = -1;
        }
        if (change == 11) { /* a peer's packet toward a stream client, decided here */
            relay_send out;
            struct mmsghdr hdr;
            struct sockaddr_storage from;
            relay_sockaddr_from_addr(&from, AF_INET, &peers[0]);
            pthread_mutex_lock(&e->lock);
            int outcome = relay_process(e, RELAY_SRC_PEER, conn_alloc[which % CONNS],
                                        (struct sockaddr *)&from, payload, rnd() % 1200,
                                        relay_now(), &out);
            pthread_mutex_unlock(&e->lock);
            if (outcome == RELAY_RELAYED) relay_flush(e, &out, 1, &hdr);
        }
        if (it % 512 == 0) { /* through the sockets: peers to the stream clients' relays */
            for (int i = 0; i < CONNS; i++) {
                struct sockaddr_storage ss;
                socklen_t sl = sizeof ss;
                getsockname(conn_relay[i], (struct sockaddr *)&ss, &sl);
                for (int k = 0; k < 8; k++) sendto(peer4, payload, rnd() % 1200, 0, (struct sockaddr *)&ss, sl);
            }
        }

        /* a datagram */
        size_t len, plen = rnd() % 4 ? rnd() % 200 : rnd() % sizeof payload;
        uint32_t kind = rnd() % 8;
        int stranger_request = rnd() % 4 == 0, stateless = stranger_request && rnd() % 2;
        relay_addr stranger = clients[0]; /* a stranger of one of many source IPs */
        stranger.port = (uint16_t)(stranger.port + 1000 + rnd() % 64);
        stranger.ip[15] = (uint8_t)(1 + rnd() % 16);
        if (stateless) {
            len = put_stateless(scratch, &key, &stranger);
        } else if (stranger_request) {
            len = put_request(scratch, sizeof scratch);
        } else if (kind < 3) {
            scratch[0] = 0x40, scratch[1] = (uint8_t)(rnd() % 3);
            scratch[2] = (uint8_t)(plen >> 8), scratch[3] = (uint8_t)plen;
            memcpy(scratch + 4, payload, plen);
            len = 4 + plen;
        } else if (kind < 6) {
            len = put_send(scratch, &peers[p], payload, plen, (int)(rnd() % 2));
        } else if (kind < 7) {
            len = plen;
            memcpy(scratch, payload, plen);
        } else {
            len = rnd() % 64;
            for (size_t i = 0; i < len; i++) scratch[i] = (uint8_t)rnd();
        }
        if (rnd() % (stateless ? 8 : 4)) len = mutate(scratch, len, sizeof scratch);
        if (stranger_request && len >= 20 && rnd() % 2) { /* plausible: its length matches */
            len &= ~(size_t)3;
            scratch[2] = (uint8_t)((len - 20) >> 8), scratch[3] = (uint8_t)(len - 20);
        }
        uint8_t *data = malloc(len ? len : 1); /* exactly len: ASan sees any over-read */
        memcpy(data, scratch, len);
        int source = rnd() % 3 ? RELAY_SRC_CLIENT : RELAY_SRC_PEER;
        if (rnd() % 8 == 0 && !stranger_request) { /* through the sockets, to the thread */
            if (source == RELAY_SRC_CLIENT)
                sendto(client, data, len, 0, (struct sockaddr *)&listen_ss, sizeof(struct sockaddr_in));
            else {
                struct sockaddr_storage ss;
                socklen_t sl = sizeof ss;
                getsockname(relays[which], (struct sockaddr *)&ss, &sl);
                sendto(ss.ss_family == AF_INET6 ? peer6 : peer4, data, len, 0, (struct sockaddr *)&ss, sl);
            }
            sent++;
        } else {
            struct sockaddr_storage from;
            relay_addr from_addr = source == RELAY_SRC_CLIENT ? clients[rnd() % ALLOCS] : peers[p];
            if (rnd() % 8 == 0) from_addr.port ^= 1; /* a stranger */
            if (stranger_request) {
                source = RELAY_SRC_CLIENT;
                from_addr = stranger;
            }
            relay_sockaddr_from_addr(&from, rnd() % 2 ? AF_INET6 : AF_INET, &from_addr);
            if (from.ss_family == 0) relay_sockaddr_from_addr(&from, AF_INET6, &from_addr);
            uint64_t handle = handles[which] ^ (rnd() % 16 == 0 ? (uint64_t)rnd() << 20 : 0);
            relay_send out;
            struct mmsghdr hdr;
            pthread_mutex_lock(&e->lock);
            int outcome = rnd() % 16 == 0 /* a payload Python parsed, to a peer */
                              ? relay_payload_to_peer(e, handle, &peers[p], data, len, len + 36,
                                                      relay_now(), &out)
                              : relay_process(e, source, handle, (struct sockaddr *)&from, data,
                                              len, relay_now(), &out);
            if (outcome == RELAY_UP)
                relay_hand_up(e, source, handle, (struct sockaddr *)&from, sizeof from, data, len);
            pthread_mutex_unlock(&e->lock);
            if (outcome == RELAY_RELAYED) relay_flush(e, &out, 1, &hdr);
            outcomes[outcome]++;
        }
        free(data);
        if (it % 64 == 0 && (it / 2048) % 4 != 3) { /* a quarter of the time the queues fill */
            relay_up *ups[128];
            uint32_t n = relay_drain(e, ups, 128);
            for (uint32_t i = 0; i < n; i++) {
                for (int k = 0; ups[i]->source == RELAY_SRC_CLOSED && k < CONNS; k++) {
                    if (conns[k].handle != ups[i]->handle) continue;
                    closed++; /* closed by the engine or by us: a fresh connection */
                    if (conns[k].client >= 0) close(conns[k].client);
                    relay_remove_allocation(e, conn_alloc[k]);
                    tcp_open(e, tcp_listener, &conns[k]);
                    struct sockaddr_storage css;
                    local(conns[k].client, &css, &conn_addr[k]);
                    relay_add_allocation(e, &conn_addr[k], conn_relay[k], relay_now() + 3600,
                                         conns[k].handle, &conn_alloc[k]);
                    relay_set_permission(e, conn_alloc[k], &peers[0], relay_now() + 3600);
                    relay_bind_channel(e, conn_alloc[k], 0x4000, &peers[0], relay_now() + 3600);
                }
                free(ups[i]);
            }
        }
        if (it % 256 == 0) { /* keep the peers' buffers from filling */
            uint8_t sink[65536];
            while (recv(peer4, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
            while (peer6 >= 0 && recv(peer6, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
            while (recv(client, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
            for (int i = 0; i < CONNS; i++) /* read what was queued toward the stream clients */
                while (conns[i].client >= 0 && recv(conns[i].client, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
        }
    }
    usleep(100000); /* let the thread take what was sent through the sockets */
    pthread_mutex_lock(&e->lock);
    uint64_t answered = e->answered;
    pthread_mutex_unlock(&e->lock);
    uint32_t signed_up = 0; /* handed up through the signed queue, at the end */
    relay_up *rest[256];
    for (uint32_t n; (n = relay_drain(e, rest, 256)) > 0;)
        for (uint32_t i = 0; i < n; i++) free(rest[i]);
    pthread_mutex_lock(&e->qlock);
    signed_up = (uint32_t)e->queues[RELAY_QUEUE_SIGNED].drained;
    pthread_mutex_unlock(&e->qlock);
    relay_nonce_free(&key);
    relay_free(e);
    free(e);
    free(own.in);
    for (int i = 0; i < CONNS; i++) {
        if (conns[i].client >= 0) close(conns[i].client);
        close(conn_relay[i]);
    }
    close(tcp_listener);
    printf("relayed %ld dropped %ld up %ld through-sockets %ld streams %ld closed %ld "
           "answered %llu signed %u\n",
           outcomes[RELAY_RELAYED], outcomes[RELAY_DROPPED], outcomes[RELAY_UP], sent, streamed,
           closed, (unsigned long long)answered, signed_up);
    return 0;
}
