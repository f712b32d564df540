"""Fuzz the native relay core under AddressSanitizer and UndefinedBehaviorSanitizer.

The same C source as the extension (stunnerd/relaycore/relay.c, stream.c and stateless.c) is
built in a temporary directory with `-fsanitize=address,undefined` together with
relaycore/fuzz.c, a driver that feeds random and mutated datagrams through the engine's packet
path (directly, and through real loopback sockets to its thread) while the tables change under
it (the engine's answering of unsigned Allocates and its nonce key among them), and random and
mutated
TURN-TCP byte streams split at random boundaries through the stream framing (directly, and
through real loopback TCP connections), checking that valid frames are framed whole whatever
the splits. Bounded: a few seconds.
The same drive runs under ThreadSanitizer too. Skipped only when no compiler here can build
with the sanitizers.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCES = Path(__file__).resolve().parents[2] / "stunnerd" / "relaycore"
ITERATIONS = 150_000  # about a second per run under the sanitizers
FLAGS = ["-std=gnu11", "-g", "-O1", "-fno-omit-frame-pointer", "-pthread"]
MEMORY = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
THREADS = ["-fsanitize=thread"]
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    "TSAN_OPTIONS": "halt_on_error=1",
}


def _build(build: Path, name: str, sanitizers: list[str]) -> Path:
    """relay.c + fuzz.c with `sanitizers`; skips if this compiler cannot build with them."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    probe = build / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    try:
        subprocess.run(
            [compiler, *FLAGS, *sanitizers, str(probe), "-o", str(build / f"probe-{name}")],
            check=True,
            capture_output=True,
            timeout=60,
        )
        subprocess.run([str(build / f"probe-{name}")], check=True, capture_output=True, timeout=30)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"the compiler lacks {sanitizers}: {exc.stderr.decode()[-300:]}")
    binary = build / name
    sources = [str(SOURCES / name) for name in ("relay.c", "stream.c", "stateless.c", "fuzz.c")]
    result = subprocess.run(
        [compiler, *FLAGS, *sanitizers, "-Wall", "-Werror", *sources, "-o", str(binary)]
        + ["-lcrypto"],  # OpenSSL's HMAC-SHA256 for the stateless nonces (stateless.c)
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr  # the probe built: this must build too
    return binary


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("relay-fuzz"), "fuzz-memory", MEMORY)


def _run(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **SANITIZER_ENV},
    )


def _check(result: subprocess.CompletedProcess[str], seed: int) -> None:
    assert result.returncode == 0, f"seed {seed}:\n{result.stderr[-6000:]}"
    assert "Sanitizer" not in result.stderr and "runtime error" not in result.stderr
    counts = re.fullmatch(
        r"relayed (\d+) dropped (\d+) up (\d+) through-sockets (\d+) streams (\d+) closed (\d+) "
        r"answered (\d+) signed (\d+)\n",
        result.stdout,
    )
    assert counts is not None, result.stdout
    # The run reached every outcome, so the fuzzing went past the first checks: the engine
    # answered unsigned Allocates itself and handed signed ones up through their own queue.
    assert min(map(int, counts.groups())) > 0, result.stdout


def test_the_sanitizers_are_on(harness: Path) -> None:
    result = _run(harness, "canary")  # one byte read past a heap buffer
    assert result.returncode != 0
    assert "AddressSanitizer" in result.stderr or "runtime error" in result.stderr


# ids: the random seed is drawn anew in each process that collects (xdist's workers must agree);
# a failure's message names the seed.
@pytest.mark.parametrize("seed", [1, random.randrange(1, 1 << 62)], ids=["seed-1", "random"])
def test_random_and_mutated_datagrams_find_nothing(harness: Path, seed: int) -> None:
    _check(_run(harness, str(ITERATIONS), str(seed)), seed)


def test_the_engine_thread_and_the_table_updates_race_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The same drive under ThreadSanitizer: the engine's thread relays what arrives on its
    sockets while the main thread changes the tables and decides packets itself."""
    binary = _build(tmp_path_factory.mktemp("relay-tsan"), "fuzz-threads", THREADS)
    seed = random.randrange(1, 1 << 62)
    _check(_run(binary, str(ITERATIONS // 3), str(seed)), seed)
