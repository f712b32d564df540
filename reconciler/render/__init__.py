"""Render: a snapshot of the cluster's objects turned into dataplane configs, manifests and
status, purely (no I/O, no asyncio, no Kubernetes client; the clock is passed in).

    plan = render(Snapshot.from_objects(objects), RenderSettings(), datetime.now(UTC))
    plan.configs["stunner/udp-gateway"]  # the StunnerConfig its stunnerd gets over CDS

`Renderer(settings).render(snapshot, now)` is the same with a memory: each later render renders
again only the parts of the cluster whose objects or reads changed.
"""

from .core import Renderer, render
from .plan import Finding, Plan, RenderSettings, StatusUpdate

__all__ = ["Finding", "Plan", "RenderSettings", "Renderer", "StatusUpdate", "render"]
