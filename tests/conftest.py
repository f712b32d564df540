"""Settings for the whole suite.

Hypothesis: no per-example deadline and no "too slow" health check. Both time the machine, not
the code (a 200 ms deadline failed a round-trip property on a loaded 2-CPU machine), and the
suite keeps timing out of its tests: figures belong in bench/.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("stunner", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("stunner")
