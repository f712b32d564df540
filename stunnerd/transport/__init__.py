"""Listeners and how packets reach the TURN core: a listener and its transport registry
(`listener`), one transport per protocol (`transports`, `dtls`, `certificates`), and the native
C engine's side (`native`, the one importer of the extension; `native_glue`, `native_udp`,
`native_tcp`, `offloaded`)."""
