"""Render: a snapshot of the cluster's objects turned into dataplane configs, manifests and
status, purely (no I/O, no asyncio, no Kubernetes client; the clock is passed in).

    plan = render(Snapshot.from_objects(objects), RenderSettings(), datetime.now(UTC))
    plan.configs["stunner/udp-gateway"]  # the StunnerConfig its stunnerd gets over CDS
"""

from .core import render
from .plan import Finding, Plan, RenderSettings, StatusUpdate

__all__ = ["Finding", "Plan", "RenderSettings", "StatusUpdate", "render"]
