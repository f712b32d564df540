/* The kernel offload of TURN-UDP ChannelData (issue 30): two programs over one set of maps and
 * one table of the relay logic, a TC one (tcx ingress, `relay`) and an XDP one (`relay_xdp`),
 * that relay, entirely in the kernel, what stunnerd has already decided to relay.
 *
 * - A client's ChannelData to a TURN-UDP listener, on a channel stunnerd bound (map
 *   `from_clients`: client, listener, channel -> route), leaves as the peer's datagram: the
 *   4-byte header stripped, from the allocation's relay address and port to the peer.
 * - A peer's datagram to a relay port (map `from_peers`: peer, relay -> route) leaves as
 *   ChannelData to the client, from the listener's address and port.
 * - Everything else continues up the stack untouched (TCX_NEXT, XDP_PASS): STUN, Send and Data
 *   indications, unknown channels, a route past its expiry, padded ChannelData, TCP, TLS, DTLS,
 *   fragments, IPv4 options, IPv6 extension headers, GSO packets, VLAN-tagged frames, payloads
 *   above MAX_PAYLOAD, and a family change (an IPv4 client with an IPv6 peer or the reverse).
 *
 * The shared part: `parsed` (a datagram's facts from its headers), `decide` (which route, if
 * any, takes it: the maps, the expiry, the family, where it may be delivered), `new_headers`
 * (the rewritten IP and UDP headers and the checksum's change), `account` (the counters). What
 * differs is how each hook reads and moves bytes and how a datagram leaves.
 *
 * The maps are written only by stunnerd (stunnerd/offload/); each route carries the monotonic
 * time (CLOCK_MONOTONIC, bpf_ktime_get_ns) at which the permission or the channel behind it
 * ends, so the kernel stops relaying then even if stunnerd is late to remove it.
 *
 * Delivery: a route's `ifindex` is the interface stunnerd found towards its destination (the
 * kernel's own route lookup, at bind time); 0 means a local destination. A local destination is
 * delivered by the stack when the packet came in on the loopback interface (a loopback packet
 * keeps its local route); from any other interface such a packet goes to stunnerd untouched
 * (the stack would refuse a local source there). Any other destination leaves by the kernel's
 * route and neighbour lookup for the new header: TC hands it to bpf_redirect_neigh; XDP asks
 * bpf_fib_lookup first (before anything is changed: no route, no neighbour entry yet, the
 * interface's forwarding off, or a datagram above the route's MTU, and it goes to stunnerd
 * untouched), writes the Ethernet addresses it gives and redirects (bpf_redirect).
 *
 * TC: headers stay where they are: the payload moves by 4 bytes inside the packet and the tail
 * is trimmed or grown (bpf_skb_change_tail). Moving the headers instead (bpf_skb_adjust_room)
 * would leave a CHECKSUM_PARTIAL packet's csum_start pointing at the old UDP header. The UDP
 * checksum is updated through bpf_l4_csum_replace, which knows the packet's checksum state: a
 * full checksum gets every change (pseudo-header, ports, length, the channel header), a
 * CHECKSUM_PARTIAL one (a local sender's) only the pseudo-header's.
 *
 * XDP: the payload stays where it is and the headers move by 4 bytes (bpf_xdp_adjust_head), as
 * a frame from the wire allows: its checksum is complete and gets every change. XDP cannot see
 * a checksum state, so a datagram whose UDP checksum field holds exactly its pseudo-header's
 * sum (how a local sender's CHECKSUM_PARTIAL datagram looks; a complete checksum looks so for
 * one datagram in 65535) goes to stunnerd untouched.
 *
 * Counting: per allocation (`usage`, indexed by the slot stunnerd gave the allocation) packets
 * and payload bytes each way; per outcome (`outcomes`, per CPU).
 *
 * Dual MIT/GPL: the MIT license of the project, and GPL for the kernel's GPL-only helpers.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the offload is built for little-endian BPF (bpfel)"
#endif

#define SEC(name) __attribute__((section(name), used))
#define INLINE static inline __attribute__((always_inline))
#define be16(x) ((__be16)__builtin_bswap16((__u16)(x)))
#define host16(x) ((__u16)__builtin_bswap16((__u16)(x)))
/* Keeps clang from folding a bound the verifier has to see checked. */
#define opaque(x) asm volatile("" : "+r"(x))

/* The helpers, by their numbers in the kernel's own header (no libbpf needed). */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;
static long (*bpf_skb_load_bytes)(const void *skb, __u32 off, void *to, __u32 len) =
    (void *)BPF_FUNC_skb_load_bytes;
static long (*bpf_skb_store_bytes)(void *skb, __u32 off, const void *from, __u32 len,
                                   __u64 flags) = (void *)BPF_FUNC_skb_store_bytes;
static long (*bpf_l4_csum_replace)(void *skb, __u32 off, __u64 from, __u64 to, __u64 flags) =
    (void *)BPF_FUNC_l4_csum_replace;
static __s64 (*bpf_csum_diff)(__be32 *from, __u32 from_size, __be32 *to, __u32 to_size,
                              __wsum seed) = (void *)BPF_FUNC_csum_diff;
static long (*bpf_skb_change_tail)(void *skb, __u32 len, __u64 flags) =
    (void *)BPF_FUNC_skb_change_tail;
static long (*bpf_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen,
                                  __u64 flags) = (void *)BPF_FUNC_redirect_neigh;
static long (*bpf_xdp_adjust_head)(struct xdp_md *ctx, int delta) =
    (void *)BPF_FUNC_xdp_adjust_head;
static long (*bpf_fib_lookup)(void *ctx, struct bpf_fib_lookup *params, int plen, __u32 flags) =
    (void *)BPF_FUNC_fib_lookup;
static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)BPF_FUNC_redirect;
static __u64 (*bpf_xdp_get_buff_len)(struct xdp_md *ctx) = (void *)BPF_FUNC_xdp_get_buff_len;
static long (*bpf_xdp_load_bytes)(struct xdp_md *ctx, __u32 off, void *to, __u32 len) =
    (void *)BPF_FUNC_xdp_load_bytes;
static long (*bpf_xdp_store_bytes)(struct xdp_md *ctx, __u32 off, const void *from, __u32 len) =
    (void *)BPF_FUNC_xdp_store_bytes;

/* The layout below is also stunnerd/offload/layout.py's: change both or neither (the loader
 * checks the sizes against the object's map definitions). */

/* An address and port: IPv4 as IPv4-mapped IPv6, the port in network order. */
struct endpoint {
    __u8 addr[16];
    __be16 port;
    __u16 zero;
};

struct client_key {
    struct endpoint client;   /* the datagram's source */
    struct endpoint listener; /* its destination: the TURN-UDP listener */
    __be16 channel;
    __u16 zero;
};

struct peer_key {
    struct endpoint peer;  /* the datagram's source */
    struct endpoint relay; /* its destination: the allocation's relay address */
};

/* Where a matched datagram goes: from `source` to `destination`, until `expires_ns`. */
struct route {
    struct endpoint source;
    struct endpoint destination;
    __u64 expires_ns;
    __u32 allocation; /* the slot of its counters in `usage` */
    __u32 ifindex;    /* the interface towards `destination`; 0: a local destination */
    __be16 channel;   /* from_peers: the channel number of the ChannelData header */
    __u16 zero[3];
};

struct usage {
    __u64 to_peer_packets;
    __u64 to_peer_bytes; /* payload bytes (a client's datagram is 4 bytes more) */
    __u64 to_client_packets;
    __u64 to_client_bytes; /* payload bytes (the client's datagram is 4 bytes more) */
};

enum outcome {
    RELAYED_TO_PEER,
    RELAYED_TO_CLIENT,
    PASSED_EXPIRED,    /* a route past its expiry: stunnerd decides (and removes it) */
    PASSED_NOT_LOOPBACK, /* a local destination of a datagram from another interface */
    DROPPED_FAILED,    /* a rewrite a helper refused half-way: the packet is dropped */
    PASSED_PARTIAL_CHECKSUM, /* XDP: a checksum only its pseudo-header's (a local sender's) */
    PASSED_NO_NEXT_HOP, /* XDP: bpf_fib_lookup found no way out (see Delivery above) */
    OUTCOMES
};

/* A map as this program declares it; the loader (stunnerd/offload/program.py) creates it. */
struct map_definition {
    __u32 type, key_size, value_size, max_entries, flags;
};

struct map_definition from_clients SEC("maps") = {
    .type = BPF_MAP_TYPE_HASH,
    .key_size = sizeof(struct client_key),
    .value_size = sizeof(struct route),
    .max_entries = 65536,
    .flags = BPF_F_NO_PREALLOC,
};

struct map_definition from_peers SEC("maps") = {
    .type = BPF_MAP_TYPE_HASH,
    .key_size = sizeof(struct peer_key),
    .value_size = sizeof(struct route),
    .max_entries = 65536,
    .flags = BPF_F_NO_PREALLOC,
};

struct map_definition usage SEC("maps") = {
    .type = BPF_MAP_TYPE_ARRAY,
    .key_size = sizeof(__u32),
    .value_size = sizeof(struct usage),
    .max_entries = 65536,
};

#define MAX_PAYLOAD 2048 /* payload bytes relayed in the kernel, at most */

/* Where a payload moves through (TC), where XDP asks bpf_fib_lookup (its 512-byte stack is
 * full): one buffer per CPU (a program runs to its end on one CPU). */
struct map_definition scratch SEC("maps") = {
    .type = BPF_MAP_TYPE_PERCPU_ARRAY,
    .key_size = sizeof(__u32),
    .value_size = MAX_PAYLOAD,
    .max_entries = 1,
};

struct map_definition outcomes SEC("maps") = {
    .type = BPF_MAP_TYPE_PERCPU_ARRAY,
    .key_size = sizeof(__u32),
    .value_size = sizeof(__u64),
    .max_entries = OUTCOMES,
};

#define ETH_LEN 14
#define UDP_LEN 8
#define CHANNEL_HEADER 4
#define LOOPBACK_IFINDEX 1
#define TTL 64 /* a fresh datagram's, as the relay socket's (net.ipv4.ip_default_ttl) */
#define RELAYED_LOCAL TC_ACT_OK
#define PASS TC_ACT_UNSPEC /* TCX_NEXT: the next program, then the stack */
#define FAMILY_INET 2      /* AF_INET, AF_INET6: bpf_fib_lookup's families */
#define FAMILY_INET6 10

/* What the program reads of a datagram: its headers. */
struct headers {
    __u8 eth[ETH_LEN];
    union {
        struct {
            struct iphdr ip;
            struct udphdr udp;
        } v4;
        struct {
            struct ipv6hdr ip;
            struct udphdr udp;
        } v6;
    };
};
#define IPV4_UDP_LEN (sizeof(struct iphdr) + sizeof(struct udphdr))
#define IPV6_UDP_LEN (sizeof(struct ipv6hdr) + sizeof(struct udphdr))

/* A datagram's facts, in one shape for both families. */
struct datagram {
    int v6;
    __u32 l3_len;         /* the IP header's length: 20 or 40 */
    __u32 payload_offset; /* of the UDP payload, from the Ethernet header */
    __u32 payload_len;
    struct udphdr udp;       /* copies, not pointers into `headers`: without CAP_PERFMON */
    __u8 channel_header[CHANNEL_HEADER]; /* the verifier refuses a reused pointer spill */
    struct endpoint source, destination;
};

INLINE void count(enum outcome what) {
    __u32 key = what;
    __u64 *n = bpf_map_lookup_elem(&outcomes, &key);
    if (n) *n += 1;
}

INLINE void set_v4(struct endpoint *e, __be32 addr, __be16 port) {
    __builtin_memset(e, 0, sizeof(*e));
    e->addr[10] = 0xff;
    e->addr[11] = 0xff;
    __builtin_memcpy(&e->addr[12], &addr, 4);
    e->port = port;
}

INLINE void set_v6(struct endpoint *e, const struct in6_addr *addr, __be16 port) {
    __builtin_memset(e, 0, sizeof(*e));
    __builtin_memcpy(e->addr, addr, 16);
    e->port = port;
}

INLINE int is_v4_mapped(const struct endpoint *e) {
    __u32 w[3];
    __builtin_memcpy(w, e->addr, 12);
    return w[0] == 0 && w[1] == 0 && w[2] == 0xffff0000; /* ::ffff:0:0/96, little-endian */
}

/* --- The shared part -------------------------------------------------------------------- */

INLINE __be16 ethertype(const struct headers *h) {
    __be16 proto;
    __builtin_memcpy(&proto, &h->eth[12], 2);
    return proto;
}

/* The datagram's facts from its headers (read into `h`: Ethernet, then IPv4 or IPv6 as `v6`
 * says, the caller's reading of the Ethertype, and UDP) and the frame's length, or 0 when it
 * is no UDP datagram the program can rewrite. */
INLINE int parsed(struct headers *h, __u32 frame_len, int v6, struct datagram *d) {
    if (!v6) {
        struct iphdr *ip = &h->v4.ip;
        if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP) return 0;
        if (ip->frag_off & be16(0x3fff)) return 0; /* a fragment */
        if (host16(ip->tot_len) != frame_len - ETH_LEN) return 0; /* Ethernet padding */
        d->v6 = 0;
        d->l3_len = sizeof(struct iphdr);
        d->udp = h->v4.udp;
        set_v4(&d->source, ip->saddr, d->udp.source);
        set_v4(&d->destination, ip->daddr, d->udp.dest);
    } else {
        struct ipv6hdr *ip = &h->v6.ip;
        if (ip->version != 6 || ip->nexthdr != IPPROTO_UDP) return 0;
        if (host16(ip->payload_len) != frame_len - ETH_LEN - sizeof(*ip)) return 0;
        if (h->v6.udp.check == 0) return 0; /* invalid over IPv6: the stack drops it */
        d->v6 = 1;
        d->l3_len = sizeof(struct ipv6hdr);
        d->udp = h->v6.udp;
        set_v6(&d->source, &ip->saddr, d->udp.source);
        set_v6(&d->destination, &ip->daddr, d->udp.dest);
    }
    __u32 udp_len = host16(d->udp.len);
    if (udp_len != frame_len - ETH_LEN - d->l3_len || udp_len < UDP_LEN) return 0;
    d->payload_offset = ETH_LEN + d->l3_len + UDP_LEN;
    d->payload_len = udp_len - UDP_LEN;
    __builtin_memset(d->channel_header, 0, CHANNEL_HEADER);
    return 1;
}

/* Whether a route can take this datagram now, come in on `ingress`; else it is stunnerd's. */
INLINE int usable(__u32 ingress, const struct route *r, const struct datagram *d) {
    if (bpf_ktime_get_ns() >= r->expires_ns) {
        count(PASSED_EXPIRED);
        return 0;
    }
    if (is_v4_mapped(&r->destination) == d->v6 || is_v4_mapped(&r->source) == d->v6) return 0;
    if (r->ifindex == 0 && ingress != LOOPBACK_IFINDEX) {
        count(PASSED_NOT_LOOPBACK);
        return 0;
    }
    return 1;
}

/* The route that takes the datagram, or 0: a client's ChannelData on a bound channel
 * (`*to_peer` 1, `*data_len` the ChannelData's), else a peer's datagram to a relay port
 * (`*to_peer` 0, `*data_len` the payload's). */
INLINE struct route *decide(const struct datagram *d, __u32 ingress, int *to_peer,
                            __u32 *data_len) {
    const __u8 *c = d->channel_header;
    if ((c[0] & 0xC0) == 0x40) { /* ChannelData (RFC 8656 §12.4) */
        __u32 length = ((__u32)c[2] << 8) | c[3];
        if (length + CHANNEL_HEADER == d->payload_len && length <= MAX_PAYLOAD) {
            struct client_key key = {.client = d->source, .listener = d->destination};
            __builtin_memcpy(&key.channel, c, 2);
            struct route *r = bpf_map_lookup_elem(&from_clients, &key);
            if (r && usable(ingress, r, d)) {
                *to_peer = 1;
                *data_len = length;
                return r;
            }
        }
    }
    if (d->payload_len > MAX_PAYLOAD) return 0;
    struct peer_key key = {.peer = d->source, .relay = d->destination};
    struct route *r = bpf_map_lookup_elem(&from_peers, &key);
    if (r && usable(ingress, r, d)) {
        *to_peer = 0;
        *data_len = d->payload_len;
        return r;
    }
    return 0;
}

/* The ChannelData header towards the client, as 32 bits in packet order. */
INLINE __be32 channel_header_of(const struct route *r, __u32 data_len) {
    __u8 header[CHANNEL_HEADER];
    __builtin_memcpy(header, &r->channel, 2);
    __be16 length = be16(data_len);
    __builtin_memcpy(&header[2], &length, 2);
    __be32 word;
    __builtin_memcpy(&word, header, 4);
    return word;
}

INLINE __u16 fold(__u32 sum) {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    return (__u16)~sum;
}

/* The new IP and UDP headers (addresses, ports, lengths, a fresh TTL, the IPv4 header's
 * checksum) written into `h` and `d->udp`, and the UDP checksum's change for them (`*pseudo`:
 * the pseudo-header's; `*header`: the UDP header's and `removed` -> `added`, the channel
 * header as 32 bits at the payload's start). The UDP checksum field itself is left as it was. */
INLINE int new_headers(struct headers *h, struct datagram *d, const struct route *r,
                       __u32 new_payload_len, __be32 removed, __be32 added, __u32 *pseudo,
                       __u32 *header) {
    __be16 old_len = d->udp.len, new_len = be16(UDP_LEN + new_payload_len);
    /* The pseudo-header's change; its length is a 16-bit word in its own 32 bits either way.
     * (Constant sizes and indexes per family: the verifier refuses a stack offset that depends
     * on the path to a program without CAP_PERFMON.) */
    __s64 pseudo_diff;
    if (d->v6) {
        struct ipv6hdr *ip = &h->v6.ip;
        __be32 old[9], new[9];
        __builtin_memcpy(old, &ip->saddr, 32);
        __builtin_memcpy(&ip->saddr, r->source.addr, 16);
        __builtin_memcpy(&ip->daddr, r->destination.addr, 16);
        __builtin_memcpy(new, &ip->saddr, 32);
        old[8] = (__be32)old_len << 16;
        new[8] = (__be32)new_len << 16;
        ip->payload_len = new_len;
        ip->hop_limit = TTL;
        pseudo_diff = bpf_csum_diff(old, sizeof(old), new, sizeof(new), 0);
    } else {
        struct iphdr *ip = &h->v4.ip;
        __be32 old[3] = {ip->saddr, ip->daddr, (__be32)old_len << 16}, new[3];
        __builtin_memcpy(&ip->saddr, &r->source.addr[12], 4);
        __builtin_memcpy(&ip->daddr, &r->destination.addr[12], 4);
        new[0] = ip->saddr;
        new[1] = ip->daddr;
        new[2] = (__be32)new_len << 16;
        ip->tot_len = be16(sizeof(struct iphdr) + UDP_LEN + new_payload_len);
        ip->ttl = TTL;
        ip->check = 0;
        __u16 words[10];
        __builtin_memcpy(words, ip, sizeof(words));
        __u32 sum = 0;
        for (int i = 0; i < 10; i++) sum += words[i];
        ip->check = fold(sum);
        pseudo_diff = bpf_csum_diff(old, sizeof(old), new, sizeof(new), 0);
    }

    /* The UDP header as 32-bit words, the checksum field left out (it is what changes). */
    __be32 header_old[3], header_new[3];
    __builtin_memcpy(&header_old[0], &d->udp, 4);
    header_old[1] = (__be32)old_len;
    header_old[2] = removed;
    d->udp.source = r->source.port;
    d->udp.dest = r->destination.port;
    d->udp.len = new_len;
    __builtin_memcpy(&header_new[0], &d->udp, 4);
    header_new[1] = (__be32)new_len;
    header_new[2] = added;
    __s64 header_diff = bpf_csum_diff(header_old, 12, header_new, 12, 0);
    if (pseudo_diff < 0 || header_diff < 0) return -1;
    *pseudo = (__u32)pseudo_diff;
    *header = (__u32)header_diff;
    return 0;
}

/* Counts a relayed datagram. Every field gets its add, 0 or not: a branch per direction would
 * let clang pick the field's offset per path, which the verifier refuses without CAP_PERFMON. */
INLINE void account(const struct route *r, int to_peer, __u32 data_len) {
    __u32 key = r->allocation;
    struct usage *u = bpf_map_lookup_elem(&usage, &key);
    __u64 peer = to_peer ? 1 : 0, client = 1 - peer;
    if (u) {
        __sync_fetch_and_add(&u->to_peer_packets, peer);
        __sync_fetch_and_add(&u->to_peer_bytes, peer * data_len);
        __sync_fetch_and_add(&u->to_client_packets, client);
        __sync_fetch_and_add(&u->to_client_bytes, client * data_len);
    }
    count(to_peer ? RELAYED_TO_PEER : RELAYED_TO_CLIENT);
}

/* --- TC (tcx ingress) ---------------------------------------------------------------------- */

INLINE int parse_skb(struct __sk_buff *skb, struct headers *h, struct datagram *d) {
    /* GSO (several datagrams in one), or a VLAN tag the device took off: stunnerd's. */
    if (skb->gso_size || skb->vlan_present || bpf_skb_load_bytes(skb, 0, h, ETH_LEN) < 0)
        return 0;
    __be16 proto = ethertype(h);
    int v6;
    if (proto == be16(ETH_P_IP)) {
        if (bpf_skb_load_bytes(skb, ETH_LEN, &h->v4, IPV4_UDP_LEN) < 0) return 0;
        v6 = 0;
    } else if (proto == be16(ETH_P_IPV6)) {
        if (bpf_skb_load_bytes(skb, ETH_LEN, &h->v6, IPV6_UDP_LEN) < 0) return 0;
        v6 = 1;
    } else {
        return 0;
    }
    if (!parsed(h, skb->len, v6, d)) return 0;
    /* The payload's first 4 bytes, when it has them: maybe a ChannelData header. */
    if (d->payload_len >= CHANNEL_HEADER &&
        bpf_skb_load_bytes(skb, d->payload_offset, d->channel_header, CHANNEL_HEADER) < 0)
        return 0;
    return 1;
}

/* Moves `len` payload bytes from `from` to `to`, through this CPU's scratch buffer. */
INLINE int move(struct __sk_buff *skb, __u32 from, __u32 to, __u32 len) {
    __u32 key = 0;
    __u8 *buf = bpf_map_lookup_elem(&scratch, &key);
    if (!buf) return -1;
    opaque(len);
    if (len == 0) return 0;
    if (len > MAX_PAYLOAD) return -1;
    if (bpf_skb_load_bytes(skb, from, buf, len) < 0) return -1;
    return bpf_skb_store_bytes(skb, to, buf, len, 0) < 0 ? -1 : 0;
}

/* Writes the new headers and updates the UDP checksum through the skb's checksum state. */
INLINE int rewrite(struct __sk_buff *skb, struct headers *h, struct datagram *d,
                   const struct route *r, __u32 new_payload_len, __be32 removed, __be32 added) {
    __u32 pseudo, header;
    if (new_headers(h, d, r, new_payload_len, removed, added, &pseudo, &header) < 0) return -1;
    __u32 csum_offset = ETH_LEN + d->l3_len + __builtin_offsetof(struct udphdr, check);
    /* A checksum of 0 over IPv4 (none) stays 0; a computed 0 is sent as 0xffff. */
    if (bpf_l4_csum_replace(skb, csum_offset, 0, pseudo,
                            BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0) < 0)
        return -1;
    if (bpf_l4_csum_replace(skb, csum_offset, 0, header, BPF_F_MARK_MANGLED_0) < 0) return -1;
    long stored = d->v6 ? bpf_skb_store_bytes(skb, ETH_LEN, &h->v6.ip, sizeof(h->v6.ip), 0)
                        : bpf_skb_store_bytes(skb, ETH_LEN, &h->v4.ip, sizeof(h->v4.ip), 0);
    if (stored < 0) return -1;
    return bpf_skb_store_bytes(skb, ETH_LEN + d->l3_len, &d->udp, 6, 0) < 0 ? -1 : 0;
}

/* How a rewritten datagram leaves: up the stack or out of the route's interface. */
INLINE int deliver(const struct route *r) {
    if (r->ifindex == 0) return RELAYED_LOCAL;
    return (int)bpf_redirect_neigh(r->ifindex, 0, 0, 0);
}

/* A client's ChannelData -> the peer's datagram. */
INLINE int to_peer(struct __sk_buff *skb, struct headers *h, struct datagram *d,
                   const struct route *r, __u32 data_len) {
    __be32 removed;
    __builtin_memcpy(&removed, d->channel_header, 4);
    if (rewrite(skb, h, d, r, data_len, removed, 0) < 0 ||
        move(skb, d->payload_offset + CHANNEL_HEADER, d->payload_offset, data_len) < 0 ||
        bpf_skb_change_tail(skb, skb->len - CHANNEL_HEADER, 0) < 0) {
        count(DROPPED_FAILED);
        return TC_ACT_SHOT;
    }
    account(r, 1, data_len);
    return deliver(r);
}

/* A peer's datagram -> ChannelData to the client. */
INLINE int to_client(struct __sk_buff *skb, struct headers *h, struct datagram *d,
                     const struct route *r, __u32 data_len) {
    __be32 added = channel_header_of(r, data_len);
    if (bpf_skb_change_tail(skb, skb->len + CHANNEL_HEADER, 0) < 0 ||
        move(skb, d->payload_offset, d->payload_offset + CHANNEL_HEADER, data_len) < 0 ||
        bpf_skb_store_bytes(skb, d->payload_offset, &added, CHANNEL_HEADER, 0) < 0 ||
        rewrite(skb, h, d, r, data_len + CHANNEL_HEADER, 0, added) < 0) {
        count(DROPPED_FAILED);
        return TC_ACT_SHOT;
    }
    account(r, 0, data_len);
    return deliver(r);
}

SEC("tc")
int relay(struct __sk_buff *skb) {
    struct headers h;
    struct datagram d;
    if (!parse_skb(skb, &h, &d)) return PASS;
    int peer_bound;
    __u32 data_len;
    struct route *r = decide(&d, skb->ingress_ifindex, &peer_bound, &data_len);
    if (!r) return PASS;
    return peer_bound ? to_peer(skb, &h, &d, r, data_len) : to_client(skb, &h, &d, r, data_len);
}

/* --- XDP ----------------------------------------------------------------------------------- */

/* Bytes are read and written through helpers, as TC's are: without CAP_PERFMON the verifier
 * refuses a packet pointer moved by a variable offset, and the frame's length is no number
 * there (a pointer difference); bpf_xdp_get_buff_len says it. */
INLINE int parse_xdp(struct xdp_md *ctx, struct headers *h, struct datagram *d) {
    if (bpf_xdp_load_bytes(ctx, 0, h, ETH_LEN) < 0) return 0;
    __be16 proto = ethertype(h);
    int v6;
    if (proto == be16(ETH_P_IP)) {
        if (bpf_xdp_load_bytes(ctx, ETH_LEN, &h->v4, IPV4_UDP_LEN) < 0) return 0;
        v6 = 0;
    } else if (proto == be16(ETH_P_IPV6)) {
        if (bpf_xdp_load_bytes(ctx, ETH_LEN, &h->v6, IPV6_UDP_LEN) < 0) return 0;
        v6 = 1;
    } else {
        return 0;
    }
    if (!parsed(h, (__u32)bpf_xdp_get_buff_len(ctx), v6, d)) return 0;
    if (d->payload_len >= CHANNEL_HEADER &&
        bpf_xdp_load_bytes(ctx, d->payload_offset, d->channel_header, CHANNEL_HEADER) < 0)
        return 0;
    return 1;
}

/* Whether the UDP checksum field holds exactly the pseudo-header's sum (not complemented):
 * how a local sender's datagram looks whose checksum the device was to finish. */
INLINE int partial_checksum(const struct datagram *d) {
    if (d->udp.check == 0) return 0; /* none (IPv4) */
    __u8 last[4] = {0, IPPROTO_UDP};
    __builtin_memcpy(&last[2], &d->udp.len, 2);
    __s64 sum;
    if (d->v6) {
        __be32 words[9];
        __builtin_memcpy(words, d->source.addr, 16);
        __builtin_memcpy(&words[4], d->destination.addr, 16);
        __builtin_memcpy(&words[8], last, 4);
        sum = bpf_csum_diff(0, 0, words, sizeof(words), 0);
    } else {
        __be32 words[3];
        __builtin_memcpy(words, &d->source.addr[12], 4);
        __builtin_memcpy(&words[1], &d->destination.addr[12], 4);
        __builtin_memcpy(&words[2], last, 4);
        sum = bpf_csum_diff(0, 0, words, sizeof(words), 0);
    }
    return sum >= 0 && (__u16)~fold((__u32)sum) == d->udp.check;
}

/* The UDP checksum after a change of `pseudo` + `header` (ones' complement sums). */
INLINE __u16 updated(__u16 check, __u32 pseudo, __u32 header) {
    if (check == 0) return 0; /* none (IPv4; parse refuses it over IPv6) */
    __u64 sum = (__u64)(__u16)~check + pseudo + header;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    __u16 result = (__u16)~sum;
    return result ? result : 0xffff; /* a computed 0 is sent as 0xffff */
}

/* The next hop towards the route's destination for the rewritten datagram, or 0. */
INLINE int next_hop(struct xdp_md *ctx, __u32 ingress, struct bpf_fib_lookup *fib,
                    const struct route *r, int v6, __u32 new_payload_len) {
    __builtin_memset(fib, 0, sizeof(*fib));
    fib->ifindex = ingress;
    fib->l4_protocol = IPPROTO_UDP;
    fib->sport = r->source.port;
    fib->dport = r->destination.port;
    if (v6) {
        fib->family = FAMILY_INET6;
        fib->tot_len = sizeof(struct ipv6hdr) + UDP_LEN + new_payload_len;
        __builtin_memcpy(fib->ipv6_src, r->source.addr, 16);
        __builtin_memcpy(fib->ipv6_dst, r->destination.addr, 16);
    } else {
        fib->family = FAMILY_INET;
        fib->tot_len = sizeof(struct iphdr) + UDP_LEN + new_payload_len;
        __builtin_memcpy(&fib->ipv4_src, &r->source.addr[12], 4);
        __builtin_memcpy(&fib->ipv4_dst, &r->destination.addr[12], 4);
    }
    return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0) == BPF_FIB_LKUP_RET_SUCCESS;
}

/* Both directions: the headers move by 4 bytes over the channel header (to the peer) or away
 * from the new one (to the client); the payload stays. */
SEC("xdp")
int relay_xdp(struct xdp_md *ctx) {
    struct headers h;
    struct datagram d;
    __u32 ingress = ctx->ingress_ifindex;
    opaque(ingress); /* read once: the verifier refuses a spilled pointer into the context */
    if (!parse_xdp(ctx, &h, &d)) return XDP_PASS;
    int peer_bound;
    __u32 data_len;
    struct route *r = decide(&d, ingress, &peer_bound, &data_len);
    if (!r) return XDP_PASS;
    if (partial_checksum(&d)) {
        count(PASSED_PARTIAL_CHECKSUM);
        return XDP_PASS;
    }
    __u32 new_payload_len = peer_bound ? data_len : data_len + CHANNEL_HEADER;
    __u32 zero = 0;
    struct bpf_fib_lookup *fib = bpf_map_lookup_elem(&scratch, &zero); /* off the stack */
    if (!fib) return XDP_PASS;
    if (r->ifindex != 0 && !next_hop(ctx, ingress, fib, r, d.v6, new_payload_len)) {
        count(PASSED_NO_NEXT_HOP);
        return XDP_PASS;
    }
    __be32 removed = 0, added = 0;
    if (peer_bound)
        __builtin_memcpy(&removed, d.channel_header, 4);
    else
        added = channel_header_of(r, data_len);
    __u16 check = d.udp.check;
    __u32 pseudo, header;
    if (new_headers(&h, &d, r, new_payload_len, removed, added, &pseudo, &header) < 0)
        return XDP_PASS; /* nothing written yet */
    d.udp.check = updated(check, pseudo, header);
    if (r->ifindex != 0) {
        __builtin_memcpy(h.eth, fib->dmac, 6);
        __builtin_memcpy(&h.eth[6], fib->smac, 6);
    }
    if (bpf_xdp_adjust_head(ctx, peer_bound ? CHANNEL_HEADER : -CHANNEL_HEADER) < 0)
        return XDP_PASS; /* the frame as it came */
    long stored = bpf_xdp_store_bytes(ctx, 0, h.eth, ETH_LEN);
    if (d.v6) {
        stored |= bpf_xdp_store_bytes(ctx, ETH_LEN, &h.v6.ip, sizeof(h.v6.ip));
        stored |= bpf_xdp_store_bytes(ctx, ETH_LEN + sizeof(h.v6.ip), &d.udp, UDP_LEN);
        if (!peer_bound)
            stored |= bpf_xdp_store_bytes(ctx, ETH_LEN + IPV6_UDP_LEN, &added, CHANNEL_HEADER);
    } else {
        stored |= bpf_xdp_store_bytes(ctx, ETH_LEN, &h.v4.ip, sizeof(h.v4.ip));
        stored |= bpf_xdp_store_bytes(ctx, ETH_LEN + sizeof(h.v4.ip), &d.udp, UDP_LEN);
        if (!peer_bound)
            stored |= bpf_xdp_store_bytes(ctx, ETH_LEN + IPV4_UDP_LEN, &added, CHANNEL_HEADER);
    }
    if (stored < 0) { /* unreachable: the frame held these headers and more before it moved */
        count(DROPPED_FAILED);
        return XDP_DROP;
    }
    account(r, peer_bound, data_len);
    return r->ifindex != 0 ? (int)bpf_redirect(fib->ifindex, 0) : XDP_PASS;
}

char program_license[] SEC("license") = "Dual MIT/GPL";
