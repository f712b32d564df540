"""stunner_api.bandwidth.TokenBucket.pace: a byte stream's bytes are never refused; the wait it
returns keeps what passes over a window at the cap (pure: the clock is the test's)."""

from __future__ import annotations

from stunner_api.bandwidth import TokenBucket


def test_pace_passes_everything_and_waits_the_time_the_debt_takes_to_refill() -> None:
    bucket = TokenBucket(800_000, now=0.0)  # 100,000 B/s, a burst of 20,000 B
    assert bucket.pace(10_000, 0.0) == 0.0  # within the burst
    assert bucket.pace(60_000, 0.0) == 0.5  # 50,000 B past it: half a second of the cap
    assert bucket.pace(0, 0.5) == 0.0  # the debt is refilled by then


def test_paced_over_a_window_what_passes_is_the_cap_plus_the_burst() -> None:
    bucket = TokenBucket(800_000, now=0.0)
    now, sent = 0.0, 0
    while now < 10.0:  # a sender reading 65,536 B whenever the bucket lets it
        sent += 65_536
        now += bucket.pace(65_536, now)
    assert 100_000 * now + 20_000 <= sent <= 100_000 * now + 20_000 + 65_536
