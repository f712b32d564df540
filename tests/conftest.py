"""Settings for the whole suite, and the one real control plane of layer 4.

Hypothesis: no per-example deadline and no "too slow" health check. Both time the machine, not
the code (a 200 ms deadline failed a round-trip property on a loaded 2-CPU machine), and the
suite keeps timing out of its tests: figures belong in bench/.

``control_plane``: etcd, kube-apiserver and (when the assets hold it) kube-controller-manager
from ``$KUBEBUILDER_ASSETS`` (tests/envtest/README.md), started once per session for every test
that asks for it (tests/envtest/, tests/reconciler/test_cluster_envtest.py), with our CRDs and
Gateway API v1.6.1's installed and Established; skipped without the variable.

Every test starts with the log levels it found: an in-process stunnerd applies its config's
`admin.loglevel` to its own scopes' "stunner.*" loggers (a hosted stunnerd: not the `stunner`
logger, which stunnerd's own process sets), and tests set levels through stunnerd.surface.logs;
a level left behind would hide or add records in the caplog of the tests that follow.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.envtest.cluster import OUR_CRDS, TCP_ROUTE_CRD
from tests.envtest.controlplane import ASSETS_VARIABLE, CHANNEL_VARIABLE, NO_ASSETS, ControlPlane
from tests.support.shared import gateway_api_crds

settings.register_profile("stunner", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("stunner")


@pytest.fixture(autouse=True)
def _stunner_log_levels() -> Iterator[None]:
    """The "stunner" loggers' levels as they were before the test (see the module docstring)."""
    loggers = logging.Logger.manager.loggerDict

    def levels() -> dict[str, int]:
        return {
            name: logger.level
            for name, logger in list(loggers.items())
            if isinstance(logger, logging.Logger) and name.split(".")[0] == "stunner"
        }

    before = levels()
    yield
    for name, level in levels().items():
        if level != before.get(name, logging.NOTSET):
            logging.getLogger(name).setLevel(before.get(name, logging.NOTSET))


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if not os.environ.get(ASSETS_VARIABLE):
        pytest.skip(NO_ASSETS)
    gateway_crds = gateway_api_crds(os.environ.get(CHANNEL_VARIABLE, "standard"))
    directory = tmp_path_factory.mktemp("envtest")
    assets = Path(os.environ[ASSETS_VARIABLE])
    with ControlPlane(assets, directory, controller_manager=True) as plane:
        plane.install_crds([*sorted(OUR_CRDS.glob("*.yaml")), *gateway_crds, TCP_ROUTE_CRD])
        yield plane
