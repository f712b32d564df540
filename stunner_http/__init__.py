"""stunner_http: one connection discipline for every aiohttp server STUNner runs (issue 20).

`server` serves an aiohttp application with a request deadline, a cap on concurrent
connections, accept errors logged at a bounded rate and client faults kept out of the ERROR log;
`websocket` is the server WebSocket for clients that only keep alive (the CDS watch). The
reconciler (CDS, auth, health, metrics), `stunner auth-server` and stunnerd's admin server use
them. aiohttp is imported by the modules, not here: stunnerd loads it only when it serves.
"""
