#!/usr/bin/env python3
"""What the CDS's token check costs (issue 20 #5), on loopback.

    .venv/bin/python bench/cds_auth_bench.py [--requests 1000] [--strangers 300]

1. GET latency of one config, sequential on one keep-alive connection, with the check off and
   with a stunnerd's token (TokenReviews through the reconciler's door to the fake API server;
   after the first, the cache answers);
2. a burst of requests with made-up tokens, all at once, half garbage (refused unasked) and half
   forged JWTs claiming our audience: how many TokenReviews reach the API server (at most
   `CONCURRENCY` at once, each refused token cached) and how long the burst takes; an honest
   request's latency during it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cds_bench import percentiles, say  # noqa: E402  (bench/ is on the path: run as a script)

from reconciler.cds import cds_app, serve  # noqa: E402
from reconciler.cds_access import Access, TokenVerifier  # noqa: E402
from reconciler.cds_store import ConfigStore  # noqa: E402
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
            api.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--strangers", type=int, default=300)
    asyncio.run(main(parser.parse_args()))
    say(f"load average: {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")
    say("command: python bench/cds_auth_bench.py " + " ".join(sys.argv[1:]))
