/* A closed-loop UDP load for bench/native_relay_bench.py: clients -> TURN server -> echo peer
 * -> TURN server -> clients, all in one thread with recvmmsg/sendmmsg, so the generator is not
 * what limits the rate.
 *
 *   relay_load SECONDS WINDOW PAYLOAD MODE SERVER_PORT PEER_FD CLIENT_FD...
 *
 * The descriptors are inherited, each client's already holding an allocation with channel
 * 0x4000 bound to the peer (MODE "chan": ChannelData) or a permission for it (MODE "send": Send
 * indications). Each client keeps WINDOW packets in flight: one new packet per packet back.
 * Prints one JSON object: packets sent by the clients, echoed by the peer, back at the clients.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>

#define BATCH 64
#define MAX_CLIENTS 1024

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint8_t packet[2048];
static size_t packet_len;
static struct sockaddr_in server;

static long send_packets(int fd, int count) {
    struct mmsghdr msgs[BATCH];
    struct iovec iov = {.iov_base = packet, .iov_len = packet_len};
    long sent = 0;
    while (count > 0) {
        int n = count < BATCH ? count : BATCH;
        for (int i = 0; i < n; i++) {
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_name = &server;
            msgs[i].msg_hdr.msg_namelen = sizeof server;
            msgs[i].msg_hdr.msg_iov = &iov;
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int done = sendmmsg(fd, msgs, (unsigned)n, 0);
        if (done <= 0) break;
        sent += done;
        count -= done;
    }
    return sent;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: relay_load SECONDS WINDOW PAYLOAD MODE SERVER_PORT PEER_FD CLIENT_FD...\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    int window = atoi(argv[2]);
    size_t payload = (size_t)atoi(argv[3]);
    int send_mode = strcmp(argv[4], "send") == 0;
    int peer = atoi(argv[6]);
    int nclients = argc - 7;
    if (payload > 1200 || nclients > MAX_CLIENTS) return 2;
    server.sin_family = AF_INET;
    server.sin_port = htons((uint16_t)atoi(argv[5]));
    inet_pton(AF_INET, "127.0.0.1", &server.sin_addr);
    if (send_mode) { /* a Send indication: XOR-PEER-ADDRESS (IPv4) + DATA */
        struct sockaddr_in addr;
        socklen_t len = sizeof addr;
        getsockname(peer, (struct sockaddr *)&addr, &len);
        size_t padded = (payload + 3) & ~(size_t)3;
        uint8_t *b = packet;
        b[0] = 0x00, b[1] = 0x16;
        uint16_t length = (uint16_t)(12 + 4 + padded);
        b[2] = (uint8_t)(length >> 8), b[3] = (uint8_t)length;
        b[4] = 0x21, b[5] = 0x12, b[6] = 0xA4, b[7] = 0x42;
        for (int i = 0; i < 12; i++) b[8 + i] = (uint8_t)(i * 7 + 1);
        b[20] = 0x00, b[21] = 0x12, b[22] = 0, b[23] = 8, b[24] = 0, b[25] = 1;
        uint16_t port = ntohs(addr.sin_port) ^ 0x2112;
        b[26] = (uint8_t)(port >> 8), b[27] = (uint8_t)port;
        uint32_t ip = ntohl(addr.sin_addr.s_addr) ^ 0x2112A442u;
        b[28] = (uint8_t)(ip >> 24), b[29] = (uint8_t)(ip >> 16), b[30] = (uint8_t)(ip >> 8), b[31] = (uint8_t)ip;
        b[32] = 0x00, b[33] = 0x13, b[34] = (uint8_t)(payload >> 8), b[35] = (uint8_t)payload;
        memset(b + 36, 'x', padded);
        packet_len = 36 + padded;
    } else { /* ChannelData on channel 0x4000 */
        packet[0] = 0x40, packet[1] = 0x00;
        packet[2] = (uint8_t)(payload >> 8), packet[3] = (uint8_t)payload;
        memset(packet + 4, 'x', payload);
        packet_len = 4 + payload;
    }
    int epfd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    epoll_ctl(epfd, EPOLL_CTL_ADD, peer, &ev);
    int clients[MAX_CLIENTS];
    long sent = 0, echoed = 0, received = 0;
    for (int i = 0; i < nclients; i++) {
        clients[i] = atoi(argv[7 + i]);
        ev.data.u32 = (uint32_t)i;
        epoll_ctl(epfd, EPOLL_CTL_ADD, clients[i], &ev);
    }
    for (int i = 0; i < nclients; i++) sent += send_packets(clients[i], window);
    static uint8_t buffers[BATCH][2048];
    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    struct sockaddr_storage names[BATCH];
    double start = now(), deadline = start + seconds;
    struct epoll_event events[64];
    while (now() < deadline) {
        int n = epoll_wait(epfd, events, 64, 100);
        for (int e = 0; e < n; e++) {
            uint32_t tag = events[e].data.u32;
            int fd = tag == UINT32_MAX ? peer : clients[tag];
            for (int i = 0; i < BATCH; i++) {
                iovs[i].iov_base = buffers[i];
                iovs[i].iov_len = sizeof buffers[i];
                memset(&msgs[i], 0, sizeof msgs[i]);
                msgs[i].msg_hdr.msg_name = &names[i];
                msgs[i].msg_hdr.msg_namelen = sizeof names[i];
                msgs[i].msg_hdr.msg_iov = &iovs[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            int got = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
            if (got <= 0) continue;
            if (fd == peer) { /* echo each datagram to where it came from */
                for (int i = 0; i < got; i++) iovs[i].iov_len = msgs[i].msg_len;
                int done = 0;
                while (done < got) {
                    int k = sendmmsg(peer, msgs + done, (unsigned)(got - done), 0);
                    if (k <= 0) break;
                    done += k;
                }
                echoed += got;
            } else {
                received += got;
                sent += send_packets(fd, got);
            }
        }
    }
    double elapsed = now() - start;
    printf("{\"sent\": %ld, \"echoed\": %ld, \"received\": %ld, \"seconds\": %.3f}\n", sent,
           echoed, received, elapsed);
    return 0;
}
