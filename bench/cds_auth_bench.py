#!/usr/bin/env python3
"""What the CDS's token check costs (issue 20 #5, issue 28 #8), on loopback.

    .venv/bin/python bench/cds_auth_bench.py [--requests 1000] [--strangers 300]
        [--watchers 100,500] [--hold 30] [--revoke 20]

1. GET latency of one config, sequential on one keep-alive connection, with the check off and
   with a stunnerd's token (TokenReviews through the reconciler's door to the fake API server;
   after the first, the cache answers);
2. a burst of requests with made-up tokens, all at once, half garbage (refused unasked) and half
   forged JWTs claiming our audience: how many TokenReviews reach the API server (at most
   `CONCURRENCY` at once, each refused token cached) and how long the burst takes; an honest
   request's latency during it;
3. N watchers, each a stunnerd with its own pod token, held open `--hold` seconds: the
   TokenReviews they cost per minute (each watch is asked about again as its token's answer
   runs out, every `MAX_TTL`), watches lost meanwhile (none should be) and a GET's latency;
   then `--revoke` of the tokens revoked (their pods deleted): how long until each watch is
   closed (the bound is `MAX_TTL`). The anchor, in the same run: the previous release's
   verifier (answers trusted 300 s, watches never asked about again) under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cds_bench import percentiles, say  # noqa: E402  (bench/ is on the path: run as a script)

from reconciler.cds.access import MAX_TTL, Access, TokenVerifier  # noqa: E402
from reconciler.cds.server import cds_app, serve  # noqa: E402
from reconciler.cds.store import ConfigStore  # noqa: E402
from reconciler.kube.api import Api  # noqa: E402
from stunner_api.dataplane import validate_config  # noqa: E402
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE  # noqa: E402
from tests.support.fakeapi import FakeApiServer  # noqa: E402

ID = "media/gw"


def store() -> ConfigStore:
    configs = ConfigStore()
    configs.set(
        ID,
        validate_config(
            {
                "version": "v1",
                "admin": {"name": ID},
                "auth": {
                    "type": "static",
                    "realm": "stunner.l7mp.io",
                    "credentials": {"username": "u", "password": "p"},
                },
            }
        ),
    )
    return configs


async def timed_gets(address: str, headers: dict[str, str], n: int) -> list[float]:
    samples = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            started = time.perf_counter()
            async with session.get(f"{address}/api/v1/configs/{ID}", headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status
            samples.append(time.perf_counter() - started)
    return samples


async def main(args: argparse.Namespace) -> None:
    with FakeApiServer() as fake:
        api = Api(fake.api_client())
        access = Access(
            TokenVerifier(lambda t: api.review_token(t, (CDS_TOKEN_AUDIENCE,))),
            account_of=lambda id: "default",
        )
        async with serve(cds_app(store())) as open_cds:
            off = await timed_gets(open_cds.address, {}, args.requests)
        async with serve(cds_app(store(), access=access.middleware)) as cds:
            token = fake.issue_token("media", "default", (CDS_TOKEN_AUDIENCE,))
            honest = {"Authorization": f"Bearer {token}"}
            on = await timed_gets(cds.address, honest, args.requests)
            say(f"1. GET {ID}, {args.requests} sequential requests on one connection:")
            say(f"   --cds-auth=off:      {percentiles(off)}")
            say(f"   --cds-auth=required: {percentiles(on)}")
            say(f"   TokenReviews asked: {fake.token_reviews} (one per token, then cached)")

            reviews = fake.token_reviews
            async with aiohttp.ClientSession() as session:
                real = token.split(".")

                async def stranger(i: int) -> int:
                    # Even: garbage; odd: a forged JWT claiming our audience (a real token's
                    # claims, a made-up signature), which only a TokenReview can refuse.
                    made_up = f"{real[0]}.{real[1]}.forged{i}" if i % 2 else f"made-up-{i}"
                    headers = {"Authorization": f"Bearer {made_up}"}
                    async with session.get(
                        f"{cds.address}/api/v1/configs/{ID}", headers=headers
                    ) as r:
                        return r.status

                started = time.perf_counter()
                burst = asyncio.gather(*(stranger(i) for i in range(args.strangers)))
                during = await timed_gets(cds.address, honest, 20)
                statuses = await burst
                took = time.perf_counter() - started
            say(f"2. {args.strangers} requests with made-up tokens at once (half forged JWTs):")
            say(f"   answers: {sorted(set(statuses))}; burst took {took:.2f} s")
            say(f"   TokenReviews they cost: {fake.token_reviews - reviews}")
            say(f"   an honest GET meanwhile: {percentiles(during)}")
        for n in args.watchers:
            say(f"3. {n} watchers, each with its own token, held {args.hold:g} s:")
            for label, ttl, recheck in (
                (f"this release (answers trusted {MAX_TTL:g} s)", MAX_TTL, True),
                ("previous (trusted 300 s, no re-check)", 300.0, False),
            ):
                figures = await watchers(fake, api, n, ttl, recheck, args)
                say(f"   {label}: {figures}")
        api.close()


async def watchers(
    fake: FakeApiServer,
    api: Api,
    n: int,
    ttl: float,
    recheck: bool,
    args: argparse.Namespace,
) -> str:
    """Part 3 for one verifier: reviews per minute held, watches lost, GET latency, and how long
    revoked tokens' watches stay open."""
    verifier = TokenVerifier(lambda t: api.review_token(t, (CDS_TOKEN_AUDIENCE,)), max_ttl=ttl)
    if not recheck:
        verifier.until_lapsed = _never  # type: ignore[method-assign]
    access = Access(verifier, account_of=lambda id: "gw-stunnerd")
    tokens = [fake.issue_token("media", "gw-stunnerd", (CDS_TOKEN_AUDIENCE,)) for _ in range(n)]
    closed_at: dict[int, float] = {}
    async with serve(cds_app(store(), access=access.middleware)) as cds:
        url = cds.address.replace("http://", "ws://") + f"/api/v1/configs/{ID}?watch=true"
        # No cap on connections: each watch holds one (aiohttp's default is 100).
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def watch(i: int, opened: asyncio.Event) -> None:
                headers = {"Authorization": f"Bearer {tokens[i]}"}
                async with session.ws_connect(url, headers=headers, heartbeat=None) as ws:
                    await ws.receive()  # the config
                    opened.set()
                    async for _ in ws:
                        pass
                closed_at[i] = time.perf_counter()

            openings = [asyncio.Event() for _ in range(n)]
            tasks = [asyncio.create_task(watch(i, openings[i])) for i in range(n)]
            await asyncio.gather(*(o.wait() for o in openings))
            reviews, started = fake.token_reviews, time.perf_counter()
            honest = {"Authorization": f"Bearer {tokens[0]}"}
            samples: list[float] = []
            while time.perf_counter() - started < args.hold:
                samples += await timed_gets(cds.address, honest, 1)
                await asyncio.sleep(0.25)
            held = time.perf_counter() - started
            per_minute = (fake.token_reviews - reviews) * 60 / held
            lost = len(closed_at)
            revoked = list(range(n - args.revoke, n))
            revoked_at = time.perf_counter()
            for i in revoked:
                fake.revoke_token(tokens[i])
            deadline = revoked_at + 2 * MAX_TTL
            while time.perf_counter() < deadline and not set(revoked) <= set(closed_at):
                await asyncio.sleep(0.1)
            waits = [closed_at[i] - revoked_at for i in revoked if i in closed_at]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    closes = (
        f"p50 {statistics.median(waits):.1f} s, max {max(waits):.1f} s"
        if len(waits) == len(revoked)
        else f"{len(waits)} of {len(revoked)} within {2 * MAX_TTL:g} s"
    )
    return (
        f"{per_minute:.0f} TokenReviews/min ({per_minute / n:.1f} per watcher); "
        f"{lost} watches lost; GET {percentiles(samples)}; "
        f"revoked tokens' watches closed: {closes}"
    )


async def _never(token: str, account: object) -> str:
    await asyncio.Event().wait()  # the previous release: a watch was never asked about again
    return ""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--strangers", type=int, default=300)
    parser.add_argument(
        "--watchers", type=lambda text: [int(n) for n in text.split(",")], default=[100, 500]
    )
    parser.add_argument("--hold", type=float, default=30.0, help="seconds the watchers are held")
    parser.add_argument("--revoke", type=int, default=20, help="tokens revoked after the hold")
    asyncio.run(main(parser.parse_args()))
    say(f"load average: {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")
    say("command: python bench/cds_auth_bench.py " + " ".join(sys.argv[1:]))
