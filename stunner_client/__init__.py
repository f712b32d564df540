"""stunner_client: what talks to a running STUNner from outside.

`turn` relays packets through a TURN listener with a real TURN client (aioice) and allocates;
`echo` is the UDP echo peer a route admits (asyncio-dgram); `probes` waits for a listener and
tells whether a port is free; `cds` is the one config discovery service client, shared by
stunnerd's config source and the auth service. The demos, `stunner selftest` and the tests use
them. Imports none of reconciler, webhook or stunnerd; nothing is imported here, so stunnerd
(whose image carries only `cds` and what it imports) loads no more than it uses.
"""
