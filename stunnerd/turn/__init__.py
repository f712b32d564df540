"""The TURN core (RFC 8656, RFC 6062): the server's methods (`server`), allocations and their
relay sockets (`allocation`, `relay_addresses`, `sockets`, `tcp_relay`), authentication (`auth`,
`stateless`), the peer policy (`router`), quotas and bounds (`ledger`, `limits`), and what they
count (`counters`). It speaks STUN through `stunner_api.stun` and knows no transport."""
