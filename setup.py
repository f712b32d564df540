"""The native relay core (stunnerd._relay, issue 16): an optional C extension.

Everything else about the package is in pyproject.toml. The extension is optional: without a
compiler or Python headers the install goes on with a warning and stunnerd relays in Python
(`stunnerd.native.available()` says why). Linux only (epoll, recvmmsg, sendmmsg, eventfd,
TCP_NOTSENT_LOWAT), and it links OpenSSL's libcrypto (headers: Debian's libssl-dev), the library
CPython's hashlib and ssl use already.
"""

import sys

from setuptools import Extension, setup

extensions = []
if sys.platform.startswith("linux"):
    extensions.append(
        Extension(
            "stunnerd._relay",
            sources=[
                "stunnerd/relaycore/relay.c",
                "stunnerd/relaycore/stream.c",
                "stunnerd/relaycore/stateless.c",
                "stunnerd/relaycore/pymodule.c",
            ],
            depends=["stunnerd/relaycore/relay.h"],
            extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"],
            extra_link_args=["-pthread"],
            libraries=["crypto"],  # OpenSSL's HMAC-SHA256 for the stateless nonces
            optional=True,
        )
    )

if __name__ == "__main__":  # as setuptools runs it; tests import `extensions` alone
    setup(ext_modules=extensions)
