/* The native TURN-UDP relay core of stunnerd (issue 16): no Python in here.
 *
 * One engine owns the packet path of one TURN-UDP listener socket and the relay sockets of its
 * allocations. Its thread (relay_start) waits in epoll, reads batches with recvmmsg, decides
 * every packet from tables the Python server fills (allocations, permissions, channels, peer
 * verdicts), writes with sendmmsg, and hands every packet it does not own up through one of
 * three bounded queues (relay_drain; up_fd is readable while any holds packets).
 *
 * Under a flood (issue 15): a client datagram that cannot be a STUN message or ChannelData is
 * dropped on its first bytes, before any copy (counted as DROP_INVALID), and what is handed up
 * from a client with an allocation here, or from a peer, goes to the priority queue, which
 * relay_drain empties first: strangers filling the other queue cannot starve established
 * clients' requests. A stranger's STUN message without MESSAGE-INTEGRITY spends a token of its
 * source IP's bucket first (issue 20, relay_strangers), and is dropped (DROP_UNAUTHENTICATED)
 * past it; one source IP holds at most a share of the strangers' queue.
 *
 * Under a spoofed-source flood (issue 28 #6, stateless.c): a stranger's unsigned message then
 * spends a token of the engine's own bucket (relay_unsigned_budget; DROP_UNAUTHENTICATED_TOTAL
 * past it), and an unsigned Allocate is answered here with a 401 whose NONCE is an HMAC over
 * its expiry and the client's address (no state), which Python and every other engine of the
 * stunnerd verify with the same secret; a stranger's request whose NONCE verifies goes up
 * through a queue of its own (RELAY_QUEUE_SIGNED), drained before the strangers' queue.
 *
 * Locking: `lock` guards the tables and counters; the thread holds it only while deciding a
 * batch (never during a syscall). `qlock` guards the hand-up queues and nests inside `lock`.
 * Only the engine's thread closes relay descriptors (removed allocations wait in a graveyard),
 * so a descriptor is never reused under a read in progress.
 */
#ifndef STUNNER_RELAY_H
#define STUNNER_RELAY_H

#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* An address as a table key: IPv4 as IPv4-mapped IPv6, port in host order, zero padding. */
typedef struct {
    uint8_t ip[16];
    uint16_t port;
    uint16_t zero;
} relay_addr;

typedef struct {
    relay_addr key;
    uint8_t state; /* 0 empty, 1 used, 2 deleted */
    int32_t value; /* cluster id, channel number or allocation slot */
    double expiry;
    relay_addr peer; /* a channel's peer */
} relay_entry;

typedef struct {
    relay_entry *slots;
    uint32_t cap, used, deleted;
} relay_table;

typedef struct relay_alloc {
    uint32_t slot, gen;
    int fd, family; /* the relay socket (a duplicate the engine owns) and its family */
    relay_addr client;
    double expires;
    relay_table perms;     /* peer IP (port 0) -> expiry */
    relay_table chan_num;  /* channel number (in .port) -> peer, expiry */
    relay_table chan_peer; /* peer address -> channel number, expiry */
    uint64_t stream;       /* TURN-TCP: the handle of its client's stream; 0 over UDP */
    /* What the engine relayed for it (sessions, issue 29): CTR_RX_* from the client to its
     * peers, CTR_TX_* from its peers to the client (payload bytes), as decided */
    uint64_t traffic[4];
    /* Its bandwidth cap (auth.allocation_bandwidth_limit, issue 29; stunner_api.bandwidth's
     * rule): bytes per second (0: none), the burst, and a bucket per direction (RELAY_TO_PEERS,
     * RELAY_TO_CLIENT): its tokens and when they were last refilled */
    double cap_rate, cap_burst, cap_tokens[2], cap_stamp[2];
    struct relay_alloc *next_dead;
} relay_alloc;

/* Where a handed-up packet comes from: the UDP listener socket, a relay socket, a TURN-TCP
 * stream (one whole frame), or the close of a stream (no data but the reason). */
enum { RELAY_SRC_CLIENT = 0, RELAY_SRC_PEER = 1, RELAY_SRC_STREAM = 2, RELAY_SRC_CLOSED = 3 };

enum relay_outcome {
    RELAY_RELAYED = 0,
    RELAY_DROPPED = 1,
    RELAY_UP = 2, /* not ours: the caller hands it up (or, for inject, reports it) */
};

enum relay_drop {
    DROP_NO_PERMISSION,
    DROP_FORBIDDEN,
    DROP_EXPIRED,
    DROP_TOO_BIG,
    DROP_SEND_ERROR,
    DROP_QUEUE_FULL,
    DROP_INVALID,      /* cannot be STUN or ChannelData, or a stranger's ChannelData */
    DROP_RATE_LIMITED, /* a stranger over its error-answer budget (relay_mute) */
    DROP_UNAUTHENTICATED, /* a stranger's STUN without MESSAGE-INTEGRITY past its IP's budget */
    DROP_UNAUTHENTICATED_TOTAL, /* ... past the engine's budget for all of them (stateless.c) */
    DROP_SHED, /* ... while the engine is behind (shed_after full reads in a row) */
    DROP_LATENCY,      /* TURN-TCP: older than the latency bound (stream.c) */
    DROP_BACKPRESSURE, /* TURN-TCP: past the high-water mark of the client's output queue */
    DROP_BANDWIDTH,    /* past its allocation's bandwidth cap (relay_set_bandwidth) */
    DROP_COUNT
};
extern const char *const relay_drop_names[DROP_COUNT];

enum { CTR_RX_PACKETS, CTR_RX_BYTES, CTR_TX_PACKETS, CTR_TX_BYTES };          /* listener */
enum { RELAY_TO_PEERS, RELAY_TO_CLIENT };                      /* a bandwidth cap's buckets */
enum { CL_TX_PACKETS, CL_TX_BYTES, CL_RX_PACKETS, CL_RX_BYTES };               /* cluster */

#define RELAY_MAX_CLUSTERS 4096
/* A verdict for one of stunnerd's own addresses: admitted only while its port is not a relay
 * port (relay_ports, one byte per port, shared by every process; checked per packet). */
#define RELAY_VERDICT_OWN 0x40000000
#define RELAY_VERDICT_LIMIT 65536
#define RELAY_MUTED_LIMIT 65536
#define RELAY_BUCKET_LIMIT 65536 /* source IPs with a stranger's budget in use (relay_strangers) */
#define RELAY_BATCH 32
#define RELAY_BUFFER 65536
#define RELAY_MAX_MESSAGE 4096 /* STUN over UDP, by default (stunnerd.turn.limits.max_udp_message) */
#define RELAY_COOKIE 0x2112A442u /* STUN's magic cookie (RFC 8489 §5) */
#define RELAY_MAX_ATTRIBUTES 64 /* stunnerd.turn.limits.max_attributes, by default */
/* Batches' worth of datagrams read from the listener socket with it never found empty, after
 * which the engine is behind, by default (32 x 32): strangers' unsigned messages are then
 * dropped (DROP_SHED) until a read finds the socket empty, as the Python path sheds them
 * (stunnerd.transport.transports.SHED_AFTER), so a flood the thread cannot answer in full costs a read
 * each and established clients' packets behind it are not kept waiting. */
#define RELAY_SHED_AFTER 32
#define RELAY_ANSWER_MAX 256    /* a 401 the engine answers itself (stateless.c) */
#define RELAY_REALM_MAX 128     /* the longest realm the engine answers with (else Python does) */
#define RELAY_NAME_MAX 512      /* the longest listener name a nonce binds */
#define RELAY_NONCE_LEN 48      /* hex: 16 of the expiry in ms, 32 of the truncated HMAC */

/* Known clients' and peers' packets, then strangers' requests whose NONCE verifies (issue 28),
 * then the other strangers' packets: relay_drain empties them in this order. */
enum { RELAY_QUEUE_KNOWN = 0, RELAY_QUEUE_SIGNED = 1, RELAY_QUEUE_STRANGERS = 2, RELAY_QUEUES = 3 };

/* Network byte order, for every file of the engine (relay.c, stream.c, stateless.c). */
static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}
static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* One packet handed up: where it came from and its bytes, exactly as received. */
typedef struct relay_up {
    int source;      /* RELAY_SRC_CLIENT (listener socket) or RELAY_SRC_PEER (a relay socket) */
    uint64_t handle; /* the allocation of a peer packet; 0 for a client packet */
    struct sockaddr_storage from;
    socklen_t fromlen;
    uint32_t len;
    int counted; /* counted in `queued` (a stranger's packet) */
    uint64_t after[RELAY_QUEUES]; /* a close event: due once this many of each were drained */
    struct relay_up *next; /* in the list of close events */
    uint8_t data[];
} relay_up;

/* A bounded FIFO of handed-up packets. */
typedef struct {
    relay_up **items;
    uint32_t cap, head, len;
    size_t bytes;
    uint64_t drained; /* items taken out so far (close events wait for their turn) */
} relay_queue;

/* The key of the engine's stateless nonces (stateless.c): HMAC-SHA256 with the stunnerd's
 * secret, as stunnerd.turn.auth.NonceManager computes it, bound to one listener (its name) and one
 * client address. The digest states are OpenSSL's (opaque here); NULL: no key. */
typedef struct {
    void *inner, *outer, *scratch; /* EVP_MD_CTX: after the key's ipad and opad blocks */
    double lifetime;               /* seconds */
    uint8_t name[RELAY_NAME_MAX];
    size_t name_len;
} relay_nonce_key;

/* One send decided for a received packet. */
typedef struct {
    int fd;
    struct sockaddr_storage dst;
    socklen_t dstlen;
    struct iovec iov[3];
    int iovcnt;
    uint8_t header[48];
    uint8_t answer[RELAY_ANSWER_MAX]; /* a 401 answered in the engine (stateless.c) */
    int cluster;      /* the cluster counted, or -1 */
    int to_client;    /* 1: peer -> client, counted on the listener's tx */
    uint32_t payload; /* bytes counted on the cluster */
    uint32_t total;   /* bytes sent */
} relay_send;

typedef struct relay_engine {
    int listen_fd, listen_family, epfd, wake_fd, up_fd;
    pthread_mutex_t lock;
    relay_alloc **allocs;
    uint32_t nslots, *free_slots, nfree, next_gen;
    relay_table by_client; /* client address -> allocation slot */
    relay_table verdicts;  /* peer address -> cluster id (>= 0, maybe | OWN) or forbidden (-1) */
    relay_table muted;     /* stranger's address -> until when its STUN is dropped (expiry) */
    /* Unauthenticated STUN from strangers (issue 20): a token bucket per source IP (port 0),
     * `stranger_rate` per second with a burst of twice that, kept as the bucket's theoretical
     * arrival time (GCRA) in `expiry`; at most `bucket_limit` IPs (relay_strangers). */
    relay_table buckets;
    double stranger_rate;  /* 0: no limit */
    uint32_t bucket_limit;
    uint64_t bucket_resets; /* times the table was full of live buckets and started afresh */
    /* Strangers' unsigned STUN in total (issue 28, stateless.c): `unsigned_rate` per second, a
     * burst of twice that (GCRA's arrival time in unsigned_tat; 0: no limit); with `answering`,
     * an unsigned Allocate among them is answered here (a 401 with `realm` and a nonce of
     * `nonce`'s), and a stranger's request whose NONCE verifies goes to RELAY_QUEUE_SIGNED. */
    double unsigned_rate, unsigned_tat;
    int answering;
    relay_nonce_key nonce;
    uint8_t realm[RELAY_REALM_MAX];
    size_t realm_len;
    uint64_t answered; /* 401s sent by the engine */
    /* datagrams read from the listener by reads that filled their room, since a read last
     * found it empty (a read shares the wakeup's batch with the other ready sockets, so its
     * room may be less than a batch); the thread's own */
    uint64_t full_reads;
    uint32_t shed_after; /* RELAY_SHED_AFTER, or what Python set (tests) */
    int behind; /* full_reads reached shed_after batches: unsigned strangers are shed */
    const volatile uint8_t *relay_ports; /* 65536 bytes or NULL (Python keeps it alive) */
    uint64_t listener[4];
    uint64_t (*clusters)[4];
    uint32_t nclusters;
    uint64_t drops[DROP_COUNT];
    uint64_t handed_up;
    /* the thread's syscalls, for the bench (relayed packets per wakeup and per call): epoll
     * returns with events, recvmmsg and sendmmsg calls */
    uint64_t wakeups, recv_calls, send_calls;
    uint32_t max_message; /* a client's STUN message above this is dropped (DROP_INVALID) */
    uint32_t max_attributes; /* an unsigned Allocate with more is not answered here (0: any) */
    relay_alloc *graveyard;
    uint64_t rng[2];
    /* the hand-up queues: known clients' and peers' packets, then strangers' (each bounded) */
    pthread_mutex_t qlock;
    relay_queue queues[RELAY_QUEUES];
    size_t qbytes_limit;
    relay_table queued;   /* a stranger's IP (port 0) -> its packets in the strangers' queue */
    uint32_t per_source;  /* at most this many of them per IP (0: no cap) */
    /* TURN-TCP streams (stream.c): an engine without a UDP listener (listen_fd -1) serves the
     * client connections Python accepted and handed over. */
    struct relay_stream **streams;
    uint32_t nstream_slots, *stream_free, nstream_free, stream_gen;
    struct relay_stream *dirty;       /* output to write, or a close Python asked for */
    struct relay_stream *stream_dead; /* closed, freed by the thread */
    relay_up *closed_head, *closed_tail; /* close events, in order with the queues */
    double latency_bound;   /* seconds; 0: none */
    size_t high_water;      /* bytes queued toward one client before drops */
    uint32_t stream_buffer; /* a frame longer than this closes its connection */
    uint32_t stalled;       /* streams waiting for room in the hand-up queues (atomic reads) */
    /* the thread */
    pthread_t thread;
    int running;  /* set by relay_start/relay_stop (which runs without the GIL): atomic */
    int stopping;
    /* batch buffers (the thread's own): one wakeup's reads from every ready socket fill them
     * in turn (`batched` of RELAY_BATCH used, `pending` sends decided), and are sent together
     * once the wakeup is served or they are full (relay_flush_pending) */
    int batched, pending;
    uint8_t *buffers;
    struct mmsghdr *msgs;
    struct iovec *iovs;
    struct sockaddr_storage *names;
    relay_send *sends;
    struct mmsghdr *out;
} relay_engine;

/* Lifecycle. relay_new duplicates listen_fd; 0 on success, else -errno. queue_limit and
 * queue_bytes bound each of the three hand-up queues. */
int relay_new(relay_engine *e, int listen_fd, uint32_t queue_limit, size_t queue_bytes);
int relay_start(relay_engine *e);
void relay_stop(relay_engine *e);
void relay_free(relay_engine *e);

/* State Python decides (call with `lock` not held). Handles are 64-bit: generation << 32 | slot.
 * relay_add_allocation duplicates relay_fd; returns 0 and sets *handle, or -errno. `stream`:
 * the handle of the client's TURN-TCP stream (its peers' packets go there), 0 over UDP. */
int relay_add_allocation(relay_engine *e, const relay_addr *client, int relay_fd, double expires,
                         uint64_t stream, uint64_t *handle);
int relay_refresh_allocation(relay_engine *e, uint64_t handle, double expires);
int relay_allocation_traffic(relay_engine *e, uint64_t handle, uint64_t traffic[4]);
/* Cap what an allocation relays, each direction: `rate` bytes per second, `burst` bytes
 * (rate 0: no cap); both buckets start full. stunner_api.bandwidth's rule, checked per packet. */
int relay_set_bandwidth(relay_engine *e, uint64_t handle, double rate, double burst);
int relay_remove_allocation(relay_engine *e, uint64_t handle);
int relay_set_permission(relay_engine *e, uint64_t handle, const relay_addr *peer_ip,
                         double expires);
int relay_remove_permission(relay_engine *e, uint64_t handle, const relay_addr *peer_ip);
int relay_bind_channel(relay_engine *e, uint64_t handle, uint16_t number, const relay_addr *peer,
                       double expires);
int relay_remove_channel(relay_engine *e, uint64_t handle, uint16_t number);
int relay_set_verdict(relay_engine *e, const relay_addr *peer, int cluster);
void relay_clear_verdicts(relay_engine *e);
/* Drop a stranger's (a client without an allocation here) STUN messages until `until`
 * (relay_now's clock), counted as DROP_RATE_LIMITED: Python's error-answer budget for it is
 * spent, and Python would drop them unparsed. */
int relay_mute(relay_engine *e, const relay_addr *client, double until);
/* The budget of strangers' unauthenticated STUN (issue 20): `rate` messages per second per
 * source IP, a burst of twice that (0: no limit), for at most `ips` source IPs at a time; and
 * at most `per_source` packets of one source IP in the strangers' queue (0: no cap). */
void relay_strangers(relay_engine *e, double rate, uint32_t ips, uint32_t per_source);

/* The packet path. relay_process decides one packet (lock held) and fills *out on RELAYED;
 * relay_flush sends decided packets (scratch: `count` headers of the caller's) and counts
 * them (takes the lock itself). */
int relay_process(relay_engine *e, int source, uint64_t handle, const struct sockaddr *from,
                  uint8_t *data, size_t len, double now, relay_send *out);
/* The shared decisions (lock held): a client's ChannelData or plain Send indication of
 * allocation `a` to its peer. */
int relay_client_frame(relay_engine *e, relay_alloc *a, uint8_t *data, size_t len, double now,
                       relay_send *out);
relay_alloc *relay_alloc_of(relay_engine *e, uint64_t handle);
relay_alloc *relay_alloc_of_client(relay_engine *e, const relay_addr *client);
int relay_drop(relay_engine *e, int cause);
int relay_epoll_set(relay_engine *e, int fd, uint64_t tag, uint32_t events, int op);
void relay_flush(relay_engine *e, relay_send *sends, int count, struct mmsghdr *scratch);
/* The thread's decided sends of this wakeup (e->sends), sent and the batch buffers freed. */
void relay_flush_pending(relay_engine *e);
/* A payload Python parsed from a client's message (a Send indication of another shape) for
 * the allocation's peer: decided and counted as relay_process would (lock held). */
int relay_payload_to_peer(relay_engine *e, uint64_t handle, const relay_addr *peer,
                          uint8_t *payload, size_t plen, size_t len, double now,
                          relay_send *out);
/* Whether relay_hand_up would queue (not drop) a packet of `len` bytes from `from`: TURN-TCP
 * waits for room instead of dropping (only the thread queues, so the answer holds). */
int relay_hand_up_room(relay_engine *e, const struct sockaddr *from, size_t len);
/* Hand one packet up: to the priority queue when it comes from a peer or from a client with an
 * allocation, to the signed queue when a stranger's request carries a NONCE that verifies
 * (relay_signed), else to the strangers' queue; dropped (counted) when that queue is full.
 * Call with `lock` held. */
void relay_hand_up(relay_engine *e, int source, uint64_t handle, const struct sockaddr *from,
                   socklen_t fromlen, const uint8_t *data, size_t len);
/* Up to `max` queued packets, the priority queue's first, then the signed queue's, each queue
 * oldest first; the caller frees each. Returns the count. */
uint32_t relay_drain(relay_engine *e, relay_up **out, uint32_t max);

/* --- TURN-TCP streams (stream.c) ------------------------------------------------------------
 *
 * A stream is one client's TCP connection, accepted by Python (which keeps admission), then
 * owned by the engine: its thread reads it, frames it (RFC 8656 §12.5: STUN by the header's
 * length, ChannelData by its length padded to 4), relays what it can, hands every other frame
 * up whole (RELAY_SRC_STREAM with the stream's handle), and writes to it: relayed frames and
 * what Python sends (relay_stream_send), in one queue, so their order is kept. Only the thread
 * reads, writes or closes a stream's descriptor; Python's calls queue and wake it.
 *
 * Bounded delay (issue 21): every queued frame carries its arrival time, and a relayed frame
 * not yet begun that is older than latency_bound when the socket can take it is dropped
 * (DROP_LATENCY; one partly written is always finished); TCP_NOTSENT_LOWAT keeps what the
 * kernel holds unsent small; high_water bounds the queue (DROP_BACKPRESSURE). Reading side:
 * the arrival time of the data read (SO_TIMESTAMPNS) older than the bound drops the relayed
 * frames it completes (DROP_LATENCY); STUN messages are never dropped for latency. A frame to
 * hand up that finds its queue full waits in the buffer and the stream is not read until
 * relay_drain makes room (a TCP client does not resend a lost request). A framing
 * error, a frame longer than stream_buffer, EOF and errors close the stream; its close is
 * handed up (RELAY_SRC_CLOSED) after every frame it handed up before. */
typedef struct relay_frame {
    struct relay_frame *next;
    double arrival; /* relay_now() when it arrived */
    uint32_t len;
    uint8_t relayed; /* relayed from a peer: counted when written, dropped when late */
    uint8_t data[];
} relay_frame;

typedef struct relay_stream {
    uint32_t slot, gen;
    int fd;
    relay_addr remote;
    struct sockaddr_storage remote_ss;
    socklen_t remote_len;
    uint8_t *in;
    uint32_t in_off, in_len, in_cap; /* framed up to in_off; bytes up to in_len */
    relay_frame *out_head, *out_tail;
    uint32_t out_off;  /* bytes of out_head written */
    size_t out_bytes;  /* bytes queued, unwritten */
    double opened, frame_started, last_frame; /* relay_now(); frame_started 0: none begun */
    int first_done;    /* a whole frame came */
    int writable_wait; /* EPOLLOUT armed */
    int stalled;       /* a frame to hand up found its queue full: not read until it drains */
    int in_dirty, close_asked;
    const char *close_reason;
    struct relay_stream *next_dirty, *next_dead;
} relay_stream;

#define RELAY_STREAM_BUFFER (4 * 65536) /* stunnerd.transport.transports.MAX_STREAM_BUFFER */
#define RELAY_STREAM_NOTSENT 16384      /* TCP_NOTSENT_LOWAT of a stream */
#define RELAY_STREAM_TAG (1ull << 62)   /* epoll tags of streams; allocations' stay below */

/* Set the bounds of streams (before start, or at any time). */
void relay_stream_limits(relay_engine *e, double latency_bound, size_t high_water,
                         uint32_t buffer);
/* Take over an accepted connection (duplicated; the caller closes its own); 0 and *handle,
 * or -errno. */
int relay_add_stream(relay_engine *e, int fd, uint64_t *handle);
/* Queue bytes Python sends to the stream's client (an answer: never dropped for latency).
 * 0 queued; -ENOENT closed; -ENOBUFS past the high-water mark (counted). */
int relay_stream_send(relay_engine *e, uint64_t handle, const uint8_t *data, size_t len);
/* Close the stream (what is queued is tried once more); its close event follows. */
int relay_close_stream(relay_engine *e, uint64_t handle);
/* The length of the frame that begins `b` (of `len` bytes buffered): 0 until its 4-byte
 * header is there, -1 if it is neither STUN (length a multiple of 4, the magic cookie once 8
 * bytes are there) nor ChannelData (padded to 4) (stunner_api.stun.stream_frame_length, byte for
 * byte: an unpadded ChannelData message puts the stream out of step, found at the next STUN
 * header). relay_stream_framing_error says why, in stunner_api.stun's words. */
long relay_stream_frame_length(const uint8_t *b, size_t len);
const char *relay_stream_framing_error(const uint8_t *b, size_t len);
/* Bytes read from a stream at `now` (age: how long they waited in the socket, seconds): framed,
 * relayed, handed up. Returns 0, or -1 when the stream must close (s->close_reason). Called
 * by the thread with `lock` held; sends decided go into `sends` (count in *count, at most
 * RELAY_BATCH: the caller flushes them). */
int relay_stream_input(relay_engine *e, relay_stream *s, const uint8_t *data, size_t len,
                       double now, double age, relay_send *sends, int *count);
/* Decide one whole frame from a stream again (after Python installed a verdict). */
int relay_process_frame(relay_engine *e, uint64_t handle, uint8_t *data, size_t len, double now,
                        relay_send *out);
/* Progress of every stream, for Python's deadlines: up to `max` entries of handle, opened,
 * first_done, bytes of a frame begun, when it began, when the last frame ended. */
typedef struct {
    uint64_t handle;
    double opened, frame_started, last_frame;
    uint32_t buffered;
    int first_done;
    size_t queued; /* bytes queued toward the client, unwritten */
} relay_progress;
uint32_t relay_stream_progress(relay_engine *e, relay_progress *out, uint32_t max);
uint32_t relay_stream_count(relay_engine *e);
/* The thread's side (relay.c calls these). */
void relay_stream_event(relay_engine *e, uint64_t tag, uint32_t events);
void relay_stream_service(relay_engine *e); /* dirty streams: write, close */
void relay_stream_resume(relay_engine *e);  /* stalled streams, once the queues have room */
void relay_stream_reap(relay_engine *e);
void relay_stream_free_all(relay_engine *e);
relay_stream *relay_stream_of(relay_engine *e, uint64_t handle);
/* Queue a decided peer -> client packet on its allocation's stream (lock held). */
int relay_stream_enqueue(relay_engine *e, uint64_t handle, const relay_send *out, double now);
void relay_push_closed(relay_engine *e, relay_stream *s);

/* Set in an engine's thread (only it reads and writes it): stream.c's calls wake the thread
 * only when made from another one. */
extern __thread int relay_in_thread;

/* Helpers shared with the bindings and the fuzz harness. */
double relay_now(void);
void relay_addr_from_sockaddr(relay_addr *a, const struct sockaddr *sa);
socklen_t relay_sockaddr_from_addr(struct sockaddr_storage *ss, int family, const relay_addr *a);
int relay_parse_send(const uint8_t *b, size_t len, relay_addr *peer, const uint8_t **payload,
                     size_t *plen);
uint32_t relay_crc32(const uint8_t *b, size_t len);
/* Whether a STUN message carries MESSAGE-INTEGRITY: its attributes walked by their lengths
 * (padded to 4) from the header on, while a whole attribute header fits; nothing is verified. */
int relay_has_integrity(const uint8_t *b, size_t len);

/* --- strangers' unsigned STUN, answered without state (stateless.c, issue 28 #6) ------------
 *
 * relay_process takes a stranger's message without MESSAGE-INTEGRITY past its source IP's
 * bucket and then the engine's (relay_unsigned_admitted); if it is an Allocate request of the
 * shape Python would answer with 401 (relay_unsigned_allocate) and the engine answers
 * (relay_answering), it builds the 401 (relay_unauthorized) and sends it on the listener
 * socket: nothing is stored, nothing goes up. relay_hand_up puts a stranger's request whose
 * NONCE verifies (relay_signed) in RELAY_QUEUE_SIGNED. */
double relay_wall(void); /* CLOCK_REALTIME (time.time()): nonces carry a wall-clock expiry */
/* Set the key (a copy of `secret`), the lifetime of its nonces and the listener's name; 0 or
 * -errno (-EINVAL: empty secret or a name above RELAY_NAME_MAX; -ENOMEM). */
int relay_nonce_init(relay_nonce_key *k, const uint8_t *secret, size_t secret_len,
                     double lifetime, const uint8_t *name, size_t name_len);
void relay_nonce_free(relay_nonce_key *k);
/* A nonce for `client` at wall-clock time `wall`: RELAY_NONCE_LEN characters (no NUL). */
void relay_nonce_issue(relay_nonce_key *k, const relay_addr *client, double wall, char *out);
/* Whether `nonce` (`len` bytes) was issued with this key for `client` and has not expired. */
int relay_nonce_valid(relay_nonce_key *k, const uint8_t *nonce, size_t len,
                      const relay_addr *client, double wall);
/* Answer strangers' unsigned Allocates in the engine with `realm` and this key (answer 0:
 * stop: they go up to Python, as in STUN-only mode); 0 or -errno. Takes the lock. */
int relay_answering(relay_engine *e, int answer, const uint8_t *secret, size_t secret_len,
                    double lifetime, const uint8_t *name, size_t name_len, const uint8_t *realm,
                    size_t realm_len);
/* The engine's budget for strangers' unsigned STUN: `rate` per second, a burst of twice that
 * (0: no limit). Takes the lock. */
void relay_unsigned_budget(relay_engine *e, double rate);
/* Whether the engine's budget has a token, spending it (lock held). */
int relay_unsigned_admitted(relay_engine *e, double now);
/* Whether `b` is an Allocate request Python answers with 401 at once: no MESSAGE-INTEGRITY,
 * attributes that tile the message exactly, at most `max_attributes` of them (0: any number),
 * FINGERPRINT (if any) last and matching (stunnerd.unsigned.unsigned_allocate, byte for byte). */
int relay_unsigned_allocate(const uint8_t *b, size_t len, uint32_t max_attributes);
/* Build the 401 to the Allocate `request` from `from` into out->answer, and address it (lock
 * held): RELAY_RELAYED, or RELAY_UP when the engine does not answer. */
int relay_unauthorized(relay_engine *e, const struct sockaddr *from, const relay_addr *client,
                       const uint8_t *request, size_t len, relay_send *out);
/* Whether a stranger's message carries a NONCE (before any MESSAGE-INTEGRITY) that verifies for
 * `client` with the engine's key (lock held). */
int relay_signed(relay_engine *e, const uint8_t *b, size_t len, const relay_addr *client);

#endif
