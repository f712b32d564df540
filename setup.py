"""The native pieces of stunnerd, both optional, built by `pip install` / `pip wheel`:

- the native relay core (stunnerd._relay, issue 16): a C extension. Without a compiler or
  Python headers the install goes on with a warning and stunnerd relays in Python
  (`stunnerd.transport.native.available()` says why). Linux only (epoll, recvmmsg, sendmmsg,
  eventfd, TCP_NOTSENT_LOWAT), and it links OpenSSL's libcrypto (headers: Debian's libssl-dev), the
  library CPython's hashlib and ssl use already.
- the kernel offload (issue 30): stunnerd/offload/relay.bpf.c compiled by clang's BPF target
  into stunnerd/offload/relay.bpf.o, beside the module that loads it (`OffloadBuild`). Clang
  comes from the distribution (Debian's `clang`: hack/test.sh installs it for CI, the
  Dockerfile's build stage for the images); the kernel's UAPI headers from its libc headers
  (linux-libc-dev, which gcc's libc6-dev brings). Without clang the install goes on with a
  warning and stunnerd relays as without the offload (its status says the object is missing).
  BPF_CLANG names another clang.

Everything else about the package is in pyproject.toml.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OFFLOAD_SOURCE = Path("stunnerd/offload/relay.bpf.c")
OFFLOAD_OBJECT = OFFLOAD_SOURCE.with_suffix(".o")


def multiarch_include() -> list[str]:
    """Debian keeps asm/ under /usr/include/<triplet>, which clang's BPF target does not search."""
    try:
        triplet = subprocess.run(
            ["gcc", "-print-multiarch"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return []
    include = Path("/usr/include") / triplet
    return [f"-I{include}"] if triplet and include.is_dir() else []


def compile_offload(output: Path) -> str | None:
    """Compiles the offload program into `output`; returns why not, or None."""
    clang = os.environ.get("BPF_CLANG") or shutil.which("clang")
    if not clang:
        return "no clang (Debian: apt-get install clang)"
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [
        clang,
        "-O2",
        "-target",
        "bpf",
        "-mcpu=v3",
        "-Wall",
        "-Werror",
        *multiarch_include(),
        "-c",
        str(OFFLOAD_SOURCE),
        "-o",
        str(output),
    ]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except OSError as exc:
        return str(exc)
    except subprocess.CalledProcessError as exc:
        return f"{' '.join(command)}: {exc.stderr.strip()[-2000:]}"
    return None


class OffloadBuild(build_ext):
    """build_ext, then the offload object beside its loader (in place for an editable install)."""

    def run(self) -> None:
        super().run()
        in_place = self.inplace or getattr(self, "editable_mode", False)
        output = OFFLOAD_OBJECT if in_place else Path(self.build_lib) / OFFLOAD_OBJECT
        why_not = compile_offload(output)
        if why_not:
            self.warn(f"the kernel offload was not built (stunnerd relays without it): {why_not}")
        elif not in_place:
            self._offload_outputs = [str(output)]

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), *getattr(self, "_offload_outputs", [])]


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
    setup(ext_modules=extensions, cmdclass={"build_ext": OffloadBuild})
