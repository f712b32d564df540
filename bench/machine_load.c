/* An open-loop UDP load at a fixed rate for bench/machine_bench.py, the same for every row:
 * through a TURN server (ChannelData on a bound channel) or straight to the peer (no relay).
 *
 *   machine_load SECONDS PPS_PER_CLIENT PAYLOAD MODE TARGET_PORT PEER_FD CLIENT_FD...
 *
 * MODE "turn": each client sends ChannelData (channel 0x4000, PAYLOAD bytes) to 127.0.0.1:
 * TARGET_PORT, the TURN server, where its inherited socket already holds an allocation with the
 * channel bound to the peer. MODE "direct": each client sends the same PAYLOAD bytes straight to
 * the peer (TARGET_PORT is then the peer's port and is only checked). The peer (PEER_FD, on
 * 127.0.0.2) echoes every datagram to where it came from, in this same thread, so the peer is
 * the same in every row too.
 *
 * Each client sends PPS_PER_CLIENT packets a second, due times computed from the start (a
 * client's phase staggered by its index), woken every millisecond by a timerfd; a late wakeup
 * sends what is due at once. The payload carries the client, a sequence number and the send
 * time; each packet back gives a round-trip time (1-us buckets up to 1 s). After SECONDS it
 * sends no more and waits 0.5 s for what is still in flight (later: lost).
 *
 * Prints one JSON object: sent, echoed (at the peer), received (back at the clients), seconds
 * (the sending window), rtt_p50_ms/rtt_p99_ms/rtt_max_ms, cpus (online), and stat_before/
 * stat_after, the first ("cpu ") line of /proc/stat read right at the start and the end of the
 * sending window (its idle time is clock-based on a NO_HZ kernel: bench/machine_figures.py).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define MAX_CLIENTS 4096
#define BUCKETS 1000000 /* 1 us each: up to 1 s */
#define STAMP 16        /* client (4), sequence (4), send time ns (8) */

static uint32_t rtt_us[BUCKETS + 1];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void read_stat(char *line, size_t size) {
    FILE *f = fopen("/proc/stat", "r");
    line[0] = 0;
    if (f == NULL) return;
    if (fgets(line, (int)size, f) == NULL) line[0] = 0;
    fclose(f);
    line[strcspn(line, "\n")] = 0;
}

static double percentile(uint64_t count, double share) {
    if (count == 0) return -1;
    uint64_t rank = (uint64_t)(share * (double)(count - 1)), seen = 0;
    for (int i = 0; i <= BUCKETS; i++) {
        seen += rtt_us[i];
        if (seen > rank) return (double)i / 1000.0;
    }
    return (double)BUCKETS / 1000.0;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: machine_load SECONDS PPS_PER_CLIENT PAYLOAD turn|direct "
                        "TARGET_PORT PEER_FD CLIENT_FD...\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    double pps = atof(argv[2]);
    size_t payload = (size_t)atoi(argv[3]);
    int turn = strcmp(argv[4], "turn") == 0;
    int peer = atoi(argv[6]);
    int nclients = argc - 7;
    size_t header = turn ? 4 : 0;
    if (payload < STAMP || payload > 1400 || nclients > MAX_CLIENTS || pps <= 0) return 2;
    struct sockaddr_in target = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[5]))};
    inet_pton(AF_INET, turn ? "127.0.0.1" : "127.0.0.2", &target.sin_addr);

    static int clients[MAX_CLIENTS];
    static uint32_t sequence[MAX_CLIENTS];
    static uint64_t sent_by[MAX_CLIENTS];
    int epfd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    epoll_ctl(epfd, EPOLL_CTL_ADD, peer, &ev);
    for (int i = 0; i < nclients; i++) {
        clients[i] = atoi(argv[7 + i]);
        ev.data.u32 = (uint32_t)i;
        epoll_ctl(epfd, EPOLL_CTL_ADD, clients[i], &ev);
    }
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct itimerspec every_ms = {.it_interval = {0, 1000000}, .it_value = {0, 1000000}};
    timerfd_settime(tfd, 0, &every_ms, NULL);
    ev.data.u32 = UINT32_MAX - 1;
    epoll_ctl(epfd, EPOLL_CTL_ADD, tfd, &ev);

    static uint8_t out[BATCH][1500];
    static uint8_t in[BATCH][2048];
    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    struct sockaddr_storage names[BATCH];
    uint64_t sent = 0, echoed = 0, received = 0, rtt_count = 0, rtt_max = 0;
    for (int i = 0; i < BATCH; i++) {
        memset(out[i], 'x', sizeof out[i]);
        if (turn) {
            out[i][0] = 0x40, out[i][1] = 0x00;
            out[i][2] = (uint8_t)(payload >> 8), out[i][3] = (uint8_t)payload;
        }
    }
    char stat_before[512], stat_after[512];
    read_stat(stat_before, sizeof stat_before);
    uint64_t start = now_ns(), stop = start + (uint64_t)(seconds * 1e9);
    uint64_t end = stop + 500000000u, window_end = 0;
    struct epoll_event events[256];
    for (;;) {
        uint64_t t = now_ns();
        if (t >= stop && window_end == 0) {
            read_stat(stat_after, sizeof stat_after);
            window_end = t;
        }
        if (t >= end) break;
        int n = epoll_wait(epfd, events, 256, 10);
        for (int e = 0; e < n; e++) {
            uint32_t tag = events[e].data.u32;
            if (tag == UINT32_MAX - 1) { /* the timer: send what is due */
                uint64_t expirations;
                if (read(tfd, &expirations, sizeof expirations) < 0) continue;
                t = now_ns();
                if (t >= stop) continue;
                for (int c = 0; c < nclients; c++) {
                    /* staggered: client c's first packet is due c/nclients of an interval in */
                    double elapsed = (double)(t - start) * 1e-9 + (double)c / nclients / pps;
                    uint64_t due = (uint64_t)(elapsed * pps);
                    while (sent_by[c] < due) {
                        int k = due - sent_by[c] < BATCH ? (int)(due - sent_by[c]) : BATCH;
                        for (int i = 0; i < k; i++) {
                            uint8_t *p = out[i] + header;
                            uint32_t seq = sequence[c]++;
                            memcpy(p, &c, 4);
                            memcpy(p + 4, &seq, 4);
                            memcpy(p + 8, &t, 8);
                            iovs[i].iov_base = out[i];
                            iovs[i].iov_len = header + payload;
                            memset(&msgs[i], 0, sizeof msgs[i]);
                            msgs[i].msg_hdr.msg_name = &target;
                            msgs[i].msg_hdr.msg_namelen = sizeof target;
                            msgs[i].msg_hdr.msg_iov = &iovs[i];
                            msgs[i].msg_hdr.msg_iovlen = 1;
                        }
                        int done = sendmmsg(clients[c], msgs, (unsigned)k, MSG_DONTWAIT);
                        /* a full socket buffer: the packets count as sent (and lost) */
                        sent_by[c] += (uint64_t)k;
                        sent += (uint64_t)k;
                        if (done < k) break;
                    }
                }
                continue;
            }
            int fd = tag == UINT32_MAX ? peer : clients[tag];
            for (int i = 0; i < BATCH; i++) {
                iovs[i].iov_base = in[i];
                iovs[i].iov_len = sizeof in[i];
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
                    int k = sendmmsg(peer, msgs + done, (unsigned)(got - done), MSG_DONTWAIT);
                    if (k <= 0) break;
                    done += k;
                }
                echoed += (uint64_t)got;
                continue;
            }
            uint64_t arrival = now_ns();
            for (int i = 0; i < got; i++) {
                if (msgs[i].msg_len < header + STAMP) continue;
                uint64_t stamp;
                memcpy(&stamp, in[i] + header + 8, 8);
                uint64_t us = (arrival - stamp) / 1000u;
                if (us > rtt_max) rtt_max = us;
                rtt_us[us < BUCKETS ? us : BUCKETS]++;
                rtt_count++;
                received++;
            }
        }
    }
    if (window_end == 0) window_end = now_ns();
    printf("{\"sent\": %lu, \"echoed\": %lu, \"received\": %lu, \"seconds\": %.4f, "
           "\"rtt_p50_ms\": %.3f, \"rtt_p99_ms\": %.3f, \"rtt_max_ms\": %.3f, "
           "\"cpus\": %ld, \"stat_before\": \"%s\", \"stat_after\": \"%s\"}\n",
           (unsigned long)sent, (unsigned long)echoed, (unsigned long)received,
           (double)(window_end - start) * 1e-9, percentile(rtt_count, 0.5),
           percentile(rtt_count, 0.99), (double)rtt_max / 1000.0, sysconf(_SC_NPROCESSORS_ONLN),
           stat_before, stat_after);
    return 0;
}
