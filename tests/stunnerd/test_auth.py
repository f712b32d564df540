"""Long-term keys, TURN REST ephemeral credentials, the Authenticator and stateless nonces."""

from __future__ import annotations

import base64
import hashlib
import hmac
import string

import pytest

from stunner_api.ice import ephemeral_password, ephemeral_username
from stunnerd.turn.auth import (
    Authenticator,
    AuthError,
    NonceManager,
    check_time_windowed_username,
    long_term_key,
)

NOW = 1_700_000_000  # a fixed "current time" for every clock in this file
REALM = "stunner.l7mp.io"

# --- long-term key and TURN REST credentials -------------------------------------------------


def test_long_term_key_is_md5_of_user_realm_password() -> None:
    assert long_term_key("user", "realm", "pass").hex() == "8493fbc53ba582fb4c044c456bdc40eb"


def test_long_term_key_matches_the_webrtc_rs_vector() -> None:
    # webrtc-rs turn auth test_generate_auth_key (a port of pion/turn's GenerateAuthKey)
    key = long_term_key("60", "webrtc.rs", "HWbnm25GwSj6jiHTEDMTO5D7aBw=")
    expected = [56, 22, 47, 139, 198, 127, 13, 188, 171, 80, 23, 29, 195, 148, 216, 224]
    assert list(key) == expected


def test_long_term_key_applies_no_saslprep() -> None:
    expected = hashlib.md5("ü:r:ß".encode(), usedforsecurity=False).digest()
    assert long_term_key("ü", "r", "ß") == expected


def test_ephemeral_password_matches_pion_turn_vector() -> None:
    # pion/turn lt_cred_test.go TestLtCredMech
    assert ephemeral_password("foobar", "1599491771") == "Tpz/nKkyvX/vMSLKvL4sbtBt8Vs="


def test_ephemeral_password_is_padded_base64_hmac_sha1() -> None:
    username = "1681486023:alice"
    mac = hmac.new(b"my-secret", username.encode(), hashlib.sha1).digest()
    password = ephemeral_password("my-secret", username)
    assert base64.b64decode(password, validate=True) == mac
    assert len(password) == 28 and password.endswith("=")


def test_ephemeral_username_keeps_trailing_colon_without_user_id() -> None:
    assert ephemeral_username(1681486023) == "1681486023:"
    assert ephemeral_username(1681486023, "alice") == "1681486023:alice"


# --- CheckTimeWindowedUsername, Go's semantics ------------------------------------------------

FUTURE = NOW + 3600
PAST = NOW - 1


@pytest.mark.parametrize(
    ("username", "user_id"),
    [
        (f"{FUTURE}", f"{FUTURE}"),  # plain timestamp: one part, so the whole username
        (f"{FUTURE}:", ""),  # the auth service's form with an empty user id
        (f"{FUTURE}:alice", "alice"),  # timestamp:userid
        (f"alice:{FUTURE}", f"alice:{FUTURE}"),  # userid:timestamp: timestamp not first
        (f"alice:{FUTURE}:junk", f"alice:{FUTURE}:junk"),  # three parts
        (f"{FUTURE}:alice:junk", f"{FUTURE}:alice:junk"),
        (f"{NOW}:alice", "alice"),  # expires this very second: still valid
        (f"+{FUTURE}:alice", "alice"),  # strconv.Atoi accepts a leading '+'
        (f"bob:{FUTURE}:1", f"bob:{FUTURE}:1"),  # the first integer wins
        (f"99999999999999999999:{FUTURE}", f"99999999999999999999:{FUTURE}"),  # > int64: skipped
    ],
)
def test_time_windowed_username_accepted(username: str, user_id: str) -> None:
    assert check_time_windowed_username(username, NOW + 0.5) == user_id


@pytest.mark.parametrize(
    ("username", "reason"),
    [
        (f"{PAST}", "expired time-windowed username"),
        (f"{PAST}:alice", "expired time-windowed username"),
        (f"alice:{PAST}", "expired time-windowed username"),
        (f"{PAST}:{FUTURE}", "expired time-windowed username"),  # first integer decides
        (f"-{FUTURE}:alice", "expired time-windowed username"),  # negative: Atoi accepts
        ("0:alice", "zero timestamp"),
        (f"0:{FUTURE}", "zero timestamp"),  # 0 is the first integer, as in Go
        ("alice", "no timestamp"),
        ("alice:bob", "no timestamp"),
        ("", "no timestamp"),
        (":", "no timestamp"),
        (f" {FUTURE}:alice", "no timestamp"),  # Atoi rejects spaces
        (f"{FUTURE}_0:alice", "no timestamp"),  # and underscores, unlike int()
        ("١٢٣٤٥٦٧٨٩٠:alice", "no timestamp"),  # and non-ASCII digits
        (f"0x{FUTURE:x}:alice", "no timestamp"),
    ],
)
def test_time_windowed_username_rejected(username: str, reason: str) -> None:
    with pytest.raises(AuthError, match=reason):
        check_time_windowed_username(username, NOW)


def test_time_windowed_username_error_names_the_username() -> None:
    with pytest.raises(AuthError) as excinfo:
        check_time_windowed_username("alice", NOW)
    assert str(excinfo.value) == "invalid time-windowed username 'alice': no timestamp"


# --- Authenticator ----------------------------------------------------------------------------


def test_static_authenticator_knows_only_its_user() -> None:
    auth = Authenticator("static", REALM, {"username": "user1", "password": "passwd1"})
    assert auth.realm == REALM
    assert (
        auth.key_for("user1")
        == hashlib.md5(f"user1:{REALM}:passwd1".encode(), usedforsecurity=False).digest()
    )
    assert auth.reason_for("user1") == ""
    assert auth.key_for("user2") is None
    assert auth.reason_for("user2") == "unknown username"
    assert auth.user_id("user1") == "user1"


@pytest.mark.parametrize("alias", ["plaintext", "STATIC", " Static "])
def test_static_aliases(alias: str) -> None:
    auth = Authenticator(alias, REALM, {"username": "u", "password": "p"})
    assert auth.auth_type == "static"
    assert auth.key_for("u") == long_term_key("u", REALM, "p")


def test_ephemeral_authenticator_accepts_a_valid_username() -> None:
    auth = Authenticator("ephemeral", REALM, {"secret": "s3cr3t"}, clock=lambda: NOW)
    username = ephemeral_username(NOW + 60, "alice")
    password = base64.b64encode(
        hmac.new(b"s3cr3t", username.encode(), hashlib.sha1).digest()
    ).decode()
    assert auth.key_for(username) == long_term_key(username, REALM, password)
    assert auth.user_id(username) == "alice"


def test_ephemeral_authenticator_follows_its_clock() -> None:
    now = [float(NOW)]
    auth = Authenticator("longterm", REALM, {"secret": "s"}, clock=lambda: now[0])
    username = ephemeral_username(NOW + 60)
    assert auth.key_for(username) is not None
    now[0] += 61
    assert auth.key_for(username) is None
    assert auth.reason_for(username).startswith("expired time-windowed username")


@pytest.mark.parametrize(
    ("username", "reason"),
    [
        (f"{NOW - 10}:alice", "expired"),
        ("alice", "no timestamp"),
        ("0:alice", "zero timestamp"),
    ],
)
def test_ephemeral_authenticator_rejects(username: str, reason: str) -> None:
    auth = Authenticator("timewindowed", REALM, {"secret": "TOPSECRET"}, clock=lambda: NOW)
    assert auth.key_for(username) is None
    assert reason in auth.reason_for(username)
    assert "TOPSECRET" not in auth.reason_for(username)


def test_none_authenticator_gives_no_key() -> None:
    auth = Authenticator("none", REALM, {})
    assert auth.key_for("anyone") is None
    assert "disabled" in auth.reason_for("anyone")


@pytest.mark.parametrize(
    ("auth_type", "credentials", "missing"),
    [
        ("static", {"password": "p"}, "'username'"),
        ("static", {"username": "u"}, "'password'"),
        ("static", {"username": "", "password": "p"}, "'username'"),
        ("ephemeral", {}, "'secret'"),
        ("ephemeral", {"username": "u", "password": "p"}, "'secret'"),
    ],
)
def test_authenticator_requires_its_credentials(
    auth_type: str, credentials: dict[str, str], missing: str
) -> None:
    with pytest.raises(AuthError, match=f"{auth_type} authentication needs .*{missing}"):
        Authenticator(auth_type, REALM, credentials)


def test_authenticator_rejects_unknown_type() -> None:
    with pytest.raises(AuthError, match="unknown authentication type 'bogus'"):
        Authenticator("bogus", REALM, {})


# --- NonceManager -----------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_nonce_is_valid_and_printable() -> None:
    nonces = NonceManager(b"k" * 32, lifetime=600, clock=Clock())
    nonce = nonces.issue()
    assert nonces.is_valid(nonce)
    assert len(nonce) < 128
    assert set(nonce) <= set(string.hexdigits.lower())  # quoted-string safe
    assert '"' not in nonce and "\\" not in nonce


def test_nonce_expires_after_its_lifetime() -> None:
    clock = Clock()
    nonces = NonceManager(b"k" * 32, lifetime=600, clock=clock)
    nonce = nonces.issue()
    clock.now += 599.9
    assert nonces.is_valid(nonce)
    clock.now += 0.1
    assert not nonces.is_valid(nonce)
    assert nonces.is_valid(nonces.issue())  # a fresh one is fine again


def test_nonces_differ_over_time() -> None:
    clock = Clock()
    nonces = NonceManager(b"k" * 32, clock=clock)
    first = nonces.issue()
    clock.now += 0.001
    assert nonces.issue() != first


def test_tampered_nonce_is_rejected_at_every_position() -> None:
    nonces = NonceManager(b"k" * 32, clock=Clock())
    nonce = nonces.issue()
    for index, char in enumerate(nonce):
        flipped = "0" if char != "0" else "1"
        tampered = nonce[:index] + flipped + nonce[index + 1 :]
        assert not nonces.is_valid(tampered), index


def test_nonce_with_extended_expiry_is_rejected() -> None:
    clock = Clock()
    nonces = NonceManager(b"k" * 32, lifetime=10, clock=clock)
    nonce = nonces.issue()
    forged_expiry = f"{(NOW + 10**6) * 1000:016x}"
    assert not nonces.is_valid(forged_expiry + nonce[16:])


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "x",
        "0" * 48,
        "g" * 48,
        "f" * 47,
        "f" * 49,
        " " * 48,
        "\x00" * 48,
        "é" * 48,
        "deadbeef",
        None,
        b"0" * 48,
        12345,
        ["a"],
    ],
)
def test_garbage_nonces_are_invalid(garbage: object) -> None:
    assert not NonceManager(b"k" * 32, clock=Clock()).is_valid(garbage)


def test_nonce_case_and_whitespace_variants_are_invalid() -> None:
    nonces = NonceManager(b"k" * 32, clock=Clock())
    nonce = nonces.issue()
    assert not nonces.is_valid(nonce.upper())
    assert not nonces.is_valid(f" {nonce}")
    assert not nonces.is_valid(f"{nonce}\n")


def test_nonce_from_a_worker_sharing_the_secret_is_valid() -> None:
    clock = Clock()
    worker_a = NonceManager(b"shared-secret", clock=clock)
    worker_b = NonceManager(b"shared-secret", clock=clock)
    stranger = NonceManager(b"other-secret", clock=clock)
    nonce = worker_a.issue()
    assert worker_b.is_valid(nonce)
    assert not stranger.is_valid(nonce)


def test_random_secrets_differ() -> None:
    clock = Clock()
    assert not NonceManager(clock=clock).is_valid(NonceManager(clock=clock).issue())


def test_nonce_manager_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="secret must not be empty"):
        NonceManager(b"")
    with pytest.raises(ValueError, match="lifetime must be positive"):
        NonceManager(lifetime=0)
