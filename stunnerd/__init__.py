"""stunnerd: the STUNner dataplane, a TURN server (RFC 8489 STUN, RFC 8656 TURN) in asyncio."""
