/* A spoofed-source flood for bench/flood_bench.py (issue 28 #6): unauthenticated 28-byte
 * Allocate requests (REQUESTED-TRANSPORT UDP, a fresh random transaction id each) to
 * 127.0.0.1:PORT, each from the next of SOURCES source addresses in turn: 127.64.0.0 + i, port
 * 1024 + i % 64000, written as whole IPv4 packets on a raw socket (IP_HDRINCL; root or
 * CAP_NET_RAW). Loopback only: every source and the destination are in 127/8.
 *
 *   spoof_flood PORT RATE SECONDS SOURCES
 *
 * Sends at most RATE datagrams per second for SECONDS seconds (sendmmsg batches of 64, paced
 * per millisecond), then stops by itself. The answers go to the spoofed addresses, where no
 * socket listens; a raw UDP socket with a classic BPF filter counts those from PORT to
 * 127.64.0.0/10 (the reflection). Prints one JSON object: sent, sent_bytes, received,
 * received_bytes, seconds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/filter.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define PAYLOAD 28
#define PACKET (sizeof(struct iphdr) + sizeof(struct udphdr) + PAYLOAD)
#define BASE 0x7F400000u /* 127.64.0.0 */
#define MAX_SOURCES (1u << 22) /* 127.64.0.0/10 */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

static void fill(uint8_t *p, uint32_t source, uint16_t port) {
    struct iphdr *ip = (struct iphdr *)p;
    struct udphdr *udp = (struct udphdr *)(p + sizeof *ip);
    uint8_t *stun = p + sizeof *ip + sizeof *udp;
    memset(p, 0, PACKET);
    ip->version = 4;
    ip->ihl = 5;
    ip->ttl = 64;
    ip->protocol = IPPROTO_UDP;
    ip->tot_len = htons((uint16_t)PACKET); /* the kernel fills the checksum (and id) */
    ip->saddr = htonl(BASE + source);
    ip->daddr = htonl(0x7F000001u);
    udp->source = htons((uint16_t)(1024 + source % 64000));
    udp->dest = htons(port);
    udp->len = htons((uint16_t)(sizeof *udp + PAYLOAD)); /* checksum 0: none (IPv4) */
    static const uint8_t header[8] = {0x00, 0x03, 0x00, 0x08, 0x21, 0x12, 0xA4, 0x42};
    memcpy(stun, header, 8);
    uint64_t a = next_random(), b = next_random();
    memcpy(stun + 8, &a, 8);
    memcpy(stun + 16, &b, 4);
    static const uint8_t transport[8] = {0x00, 0x19, 0x00, 0x04, 17, 0, 0, 0};
    memcpy(stun + 20, transport, 8);
}

/* A raw UDP socket that sees only datagrams from `port` to 127.64.0.0/10 (the answers). */
static int answers_socket(uint16_t port) {
    int fd = socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK, IPPROTO_UDP);
    if (fd < 0) return -1;
    struct sock_filter code[] = {
        /* the IPv4 destination (offset 16) within 127.64.0.0/10 */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 16),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xFFC00000u),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, BASE, 0, 4),
        /* the UDP source port, after a header of IHL words */
        BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 0),
        BPF_STMT(BPF_LD | BPF_H | BPF_IND, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, port, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, 0xFFFF),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    int size = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size);
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void count_answers(int fd, long *count, long *bytes) {
    static uint8_t buffers[BATCH][2048];
    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            iovs[i].iov_base = buffers[i];
            iovs[i].iov_len = sizeof buffers[i];
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_iov = &iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int n = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0) return;
        for (int i = 0; i < n; i++) { /* UDP payload bytes: less the IP and UDP headers */
            unsigned header = (unsigned)(buffers[i][0] & 0x0F) * 4 + 8;
            *count += 1;
            *bytes += msgs[i].msg_len > header ? (long)(msgs[i].msg_len - header) : 0;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: spoof_flood PORT RATE SECONDS SOURCES\n");
        return 2;
    }
    uint16_t port = (uint16_t)atoi(argv[1]);
    double rate = atof(argv[2]), seconds = atof(argv[3]);
    uint32_t sources = (uint32_t)atol(argv[4]);
    if (rate <= 0 || seconds <= 0 || seconds > 120 || sources == 0 || sources > MAX_SOURCES) {
        fprintf(stderr, "spoof_flood: RATE > 0, 0 < SECONDS <= 120, 0 < SOURCES <= %u\n",
                MAX_SOURCES);
        return 2;
    }
    int fd = socket(AF_INET, SOCK_RAW, IPPROTO_RAW); /* IP_HDRINCL implied */
    if (fd < 0) {
        perror("spoof_flood: raw socket (root or CAP_NET_RAW needed)");
        return 1;
    }
    int size = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size);
    int answers = answers_socket(port);
    rng ^= (uint64_t)getpid() << 32 ^ (uint64_t)(now() * 1e6);
    static uint8_t packets[BATCH][PACKET];
    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7F000001u)};
    long sent = 0, received = 0, received_bytes = 0;
    uint32_t source = 0;
    double start = now(), end = start + seconds, t;
    while ((t = now()) < end) {
        long due = (long)((t - start) * rate) + 1 - sent;
        if (due <= 0) {
            if (answers >= 0) count_answers(answers, &received, &received_bytes);
            double wait = start + (double)(sent + 1) / rate - now();
            if (wait > 0.001) wait = 0.001;
            if (wait > 0) {
                struct timespec ts = {0, (long)(wait * 1e9)};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        int n = due < BATCH ? (int)due : BATCH;
        for (int i = 0; i < n; i++) {
            fill(packets[i], source, port);
            source = (source + 1) % sources;
            iovs[i].iov_base = packets[i];
            iovs[i].iov_len = PACKET;
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_name = &to;
            msgs[i].msg_hdr.msg_namelen = sizeof to;
            msgs[i].msg_hdr.msg_iov = &iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int done = sendmmsg(fd, msgs, (unsigned)n, 0);
        if (done > 0) sent += done;
        if (answers >= 0 && (sent & 1023) < BATCH) count_answers(answers, &received, &received_bytes);
    }
    double elapsed = now() - start;
    if (answers >= 0) {
        usleep(200000); /* the last answers */
        count_answers(answers, &received, &received_bytes);
    }
    printf("{\"sent\": %ld, \"sent_bytes\": %ld, \"received\": %ld, \"received_bytes\": %ld, "
           "\"seconds\": %.3f}\n",
           sent, sent * (long)PAYLOAD, received, received_bytes, elapsed);
    return 0;
}
