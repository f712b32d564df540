/* Strangers' unsigned STUN answered without state (issue 28 #6). See relay.h.
 *
 * A flood of unsigned Allocates from spoofed sources (every packet from another address, so no
 * per-source budget catches it) used to go up to Python, which answered what its error budget
 * allowed and dropped the rest, new clients' first Allocates among them. Now the engine answers
 * them itself within its own budget: the 401 is built from the request's header, the realm and
 * a nonce that is an HMAC over its expiry and the client's address, so nothing is stored per
 * source and the signed retry verifies in any process of the stunnerd (one secret for all).
 *
 * The nonce is stunnerd.turn.auth.NonceManager's, byte for byte: hex(expiry in ms since the epoch,
 * 16 digits) followed by the first 16 bytes, in hex, of HMAC-SHA256(secret, that text, NUL,
 * the binding), where the binding is the listener's name, NUL, the client's IP as 16 bytes
 * (IPv4 as IPv4-mapped IPv6) and its port (2 bytes, big-endian): stunnerd.turn.auth.nonce_binding.
 * HMAC-SHA256 is OpenSSL's (libcrypto, which CPython's hashlib uses too): the key's inner and
 * outer digest states are computed once, each MAC copies them.
 */
#define _GNU_SOURCE
#include "relay.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define COOKIE 0x2112A442u
#define FINGERPRINT_XOR 0x5354554Eu
#define ALLOCATE_REQUEST 0x0003
#define ALLOCATE_ERROR 0x0113
#define ATTR_MESSAGE_INTEGRITY 0x0008
#define ATTR_ERROR_CODE 0x0009
#define ATTR_REALM 0x0014
#define ATTR_NONCE 0x0015
#define ATTR_FINGERPRINT 0x8028
#define SHA256_BLOCK 64
#define EXPIRY_HEX 16
#define MAC_BYTES 16

static const char REASON[] = "Unauthenticated"; /* stunner_api.stun.ERROR_REASONS[401] */


double relay_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- the nonce ------------------------------------------------------------------------------ */

void relay_nonce_free(relay_nonce_key *k) {
    EVP_MD_CTX_free(k->inner);
    EVP_MD_CTX_free(k->outer);
    EVP_MD_CTX_free(k->scratch);
    memset(k, 0, sizeof *k);
}

/* A digest state after one block of the key XOR `pad` (RFC 2104). */
static EVP_MD_CTX *keyed(const uint8_t *key, size_t len, uint8_t pad) {
    uint8_t block[SHA256_BLOCK];
    memset(block, 0, sizeof block);
    memcpy(block, key, len);
    for (size_t i = 0; i < sizeof block; i++) block[i] ^= pad;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c && (!EVP_DigestInit_ex(c, EVP_sha256(), NULL) ||
              !EVP_DigestUpdate(c, block, sizeof block))) {
        EVP_MD_CTX_free(c);
        c = NULL;
    }
    OPENSSL_cleanse(block, sizeof block);
    return c;
}

int relay_nonce_init(relay_nonce_key *k, const uint8_t *secret, size_t secret_len,
                     double lifetime, const uint8_t *name, size_t name_len) {
    memset(k, 0, sizeof *k);
    if (secret_len == 0 || name_len > RELAY_NAME_MAX || !(lifetime > 0)) return -EINVAL;
    uint8_t key[32];
    const uint8_t *raw = secret;
    if (secret_len > SHA256_BLOCK) { /* a longer key is hashed first (RFC 2104) */
        if (!EVP_Digest(secret, secret_len, key, NULL, EVP_sha256(), NULL)) return -ENOMEM;
        raw = key;
        secret_len = sizeof key;
    }
    k->inner = keyed(raw, secret_len, 0x36);
    k->outer = keyed(raw, secret_len, 0x5c);
    k->scratch = EVP_MD_CTX_new();
    OPENSSL_cleanse(key, sizeof key);
    if (!k->inner || !k->outer || !k->scratch) {
        relay_nonce_free(k);
        return -ENOMEM;
    }
    k->lifetime = lifetime;
    memcpy(k->name, name, name_len);
    k->name_len = name_len;
    return 0;
}

/* The truncated MAC of a nonce with this expiry text for `client`, in hex (2 * MAC_BYTES). */
static int nonce_mac(relay_nonce_key *k, const char *expiry_hex, const relay_addr *client,
                     char *out) {
    uint8_t text[EXPIRY_HEX + 1 + RELAY_NAME_MAX + 1 + 18], inner[32], mac[32];
    size_t n = 0;
    memcpy(text, expiry_hex, EXPIRY_HEX);
    n += EXPIRY_HEX;
    text[n++] = 0;
    memcpy(text + n, k->name, k->name_len);
    n += k->name_len;
    text[n++] = 0;
    memcpy(text + n, client->ip, 16);
    n += 16;
    put16(text + n, client->port);
    n += 2;
    EVP_MD_CTX *c = k->scratch;
    if (!c || !EVP_MD_CTX_copy_ex(c, k->inner) || !EVP_DigestUpdate(c, text, n) ||
        !EVP_DigestFinal_ex(c, inner, NULL) || !EVP_MD_CTX_copy_ex(c, k->outer) ||
        !EVP_DigestUpdate(c, inner, sizeof inner) || !EVP_DigestFinal_ex(c, mac, NULL))
        return -1;
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < MAC_BYTES; i++) {
        out[2 * i] = hex[mac[i] >> 4];
        out[2 * i + 1] = hex[mac[i] & 15];
    }
    return 0;
}

void relay_nonce_issue(relay_nonce_key *k, const relay_addr *client, double wall, char *out) {
    /* int((time.time() + lifetime) * 1000), as NonceManager.issue */
    unsigned long long expiry = (unsigned long long)((wall + k->lifetime) * 1000);
    char text[EXPIRY_HEX + 1];
    snprintf(text, sizeof text, "%016llx", expiry);
    memcpy(out, text, EXPIRY_HEX);
    if (nonce_mac(k, text, client, out + EXPIRY_HEX) < 0)
        memset(out + EXPIRY_HEX, '0', RELAY_NONCE_LEN - EXPIRY_HEX); /* never verifies */
}

int relay_nonce_valid(relay_nonce_key *k, const uint8_t *nonce, size_t len,
                      const relay_addr *client, double wall) {
    if (len != RELAY_NONCE_LEN || !k->inner) return 0;
    for (size_t i = 0; i < len; i++) /* lowercase hex only, as NonceManager's pattern */
        if (!((nonce[i] >= '0' && nonce[i] <= '9') || (nonce[i] >= 'a' && nonce[i] <= 'f')))
            return 0;
    char expiry_hex[EXPIRY_HEX + 1], mac[2 * MAC_BYTES];
    memcpy(expiry_hex, nonce, EXPIRY_HEX);
    expiry_hex[EXPIRY_HEX] = 0;
    if (nonce_mac(k, expiry_hex, client, mac) < 0) return 0;
    if (CRYPTO_memcmp(mac, nonce + EXPIRY_HEX, sizeof mac) != 0) return 0;
    return wall * 1000 < (double)strtoull(expiry_hex, NULL, 16);
}

/* --- the engine's side ------------------------------------------------------------------------ */

int relay_answering(relay_engine *e, int answer, const uint8_t *secret, size_t secret_len,
                    double lifetime, const uint8_t *name, size_t name_len, const uint8_t *realm,
                    size_t realm_len) {
    relay_nonce_key fresh;
    memset(&fresh, 0, sizeof fresh);
    if (answer) {
        if (realm_len > RELAY_REALM_MAX) return -EINVAL;
        int rc = relay_nonce_init(&fresh, secret, secret_len, lifetime, name, name_len);
        if (rc < 0) return rc;
    }
    pthread_mutex_lock(&e->lock);
    relay_nonce_key old = e->nonce;
    e->nonce = fresh;
    e->answering = answer;
    memcpy(e->realm, realm, answer ? realm_len : 0);
    e->realm_len = answer ? realm_len : 0;
    pthread_mutex_unlock(&e->lock);
    relay_nonce_free(&old);
    return 0;
}

void relay_unsigned_budget(relay_engine *e, double rate) {
    pthread_mutex_lock(&e->lock);
    e->unsigned_rate = rate > 0 ? rate : 0;
    e->unsigned_tat = 0;
    pthread_mutex_unlock(&e->lock);
}

/* GCRA as stranger_admitted (relay.c): a bucket of 2 * rate tokens refilled at `rate` per
 * second, as stunnerd.turn.limits.RateLimiter's total bucket. */
int relay_unsigned_admitted(relay_engine *e, double now) {
    double interval = 1.0 / e->unsigned_rate, tolerance = 2.0 - interval;
    double tat = e->unsigned_tat > now ? e->unsigned_tat : now;
    if (tat - now > tolerance + 1e-9) return 0;
    e->unsigned_tat = tat + interval;
    return 1;
}

int relay_unsigned_allocate(const uint8_t *b, size_t len, uint32_t max_attributes) {
    if (len < 20 || be16(b) != ALLOCATE_REQUEST || be32(b + 4) != COOKIE ||
        len != 20 + (size_t)be16(b + 2) || len % 4)
        return 0;
    uint32_t count = 0;
    for (size_t off = 20; off < len;) {
        if (max_attributes && ++count > max_attributes) return 0;
        size_t type = be16(b + off), alen = be16(b + off + 2), stop = off + 4 + alen;
        if (stop > len || type == ATTR_MESSAGE_INTEGRITY) return 0;
        if (type == ATTR_FINGERPRINT)
            return alen == 4 && stop == len &&
                   (relay_crc32(b, off) ^ FINGERPRINT_XOR) == be32(b + off + 4);
        off = stop + (4 - alen % 4) % 4;
    }
    return 1;
}

int relay_unauthorized(relay_engine *e, const struct sockaddr *from, const relay_addr *client,
                       const uint8_t *request, size_t len, relay_send *out) {
    (void)len;
    if (!e->answering || e->listen_fd < 0) return RELAY_UP;
    uint8_t *a = out->answer;
    size_t reason = sizeof REASON - 1, realm = e->realm_len;
    size_t off = 20;
    /* ERROR-CODE 401 (RFC 8489 §14.8): class 4, number 1, the reason */
    put16(a + off, ATTR_ERROR_CODE);
    put16(a + off + 2, (uint16_t)(4 + reason));
    a[off + 4] = a[off + 5] = 0;
    a[off + 6] = 4;
    a[off + 7] = 1;
    memcpy(a + off + 8, REASON, reason);
    off += 8 + reason;
    while (off % 4) a[off++] = 0;
    put16(a + off, ATTR_REALM);
    put16(a + off + 2, (uint16_t)realm);
    memcpy(a + off + 4, e->realm, realm);
    off += 4 + realm;
    while (off % 4) a[off++] = 0;
    put16(a + off, ATTR_NONCE);
    put16(a + off + 2, RELAY_NONCE_LEN);
    relay_nonce_issue(&e->nonce, client, relay_wall(), (char *)a + off + 4);
    off += 4 + RELAY_NONCE_LEN;
    put16(a, ALLOCATE_ERROR);
    put16(a + 2, (uint16_t)(off + 8 - 20)); /* FINGERPRINT counted */
    put32(a + 4, COOKIE);
    memcpy(a + 8, request + 8, 12);
    put16(a + off, ATTR_FINGERPRINT);
    put16(a + off + 2, 4);
    put32(a + off + 4, relay_crc32(a, off) ^ FINGERPRINT_XOR);
    off += 8;
    memset(&out->dst, 0, sizeof out->dst);
    out->dstlen = from->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                             : sizeof(struct sockaddr_in6);
    memcpy(&out->dst, from, out->dstlen);
    out->fd = e->listen_fd;
    out->iov[0].iov_base = a;
    out->iov[0].iov_len = off;
    out->iovcnt = 1;
    out->cluster = -1;
    out->to_client = 1;
    out->payload = 0;
    out->total = (uint32_t)off;
    e->answered++;
    return RELAY_RELAYED;
}

int relay_signed(relay_engine *e, const uint8_t *b, size_t len, const relay_addr *client) {
    if (!e->answering) return 0;
    for (size_t off = 20; off + 4 <= len;) {
        size_t type = be16(b + off), alen = be16(b + off + 2);
        if (type == ATTR_MESSAGE_INTEGRITY || off + 4 + alen > len) return 0;
        if (type == ATTR_NONCE)
            return relay_nonce_valid(&e->nonce, b + off + 4, alen, client, relay_wall());
        off += 4 + alen + (4 - alen % 4) % 4;
    }
    return 0;
}
