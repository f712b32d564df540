#!/usr/bin/env python3
"""Generate charts/stunner/values.schema.json from charts/stunner/values.yaml.

    python hack/values_schema.py          # write the schema
    python hack/values_schema.py --check  # exit 1 if the schema is out of date

Types come from the defaults in values.yaml; every object refuses keys it does not document
(additionalProperties: false) except the free-form Kubernetes maps listed in FREE_FORM. What a
default cannot say (enums, ranges, the item type of an empty list) is in CONSTRAINTS and ITEMS;
the enum of loadBalancer.preset is the names of loadBalancer.presets (one table, in values.yaml).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "stunner"
SCHEMA = CHART / "values.schema.json"

PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
FAILURE_POLICY = {"type": "string", "enum": ["Fail", "Ignore"]}
PULL_POLICY = {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]}
K8S_OBJECT = {"type": "object"}
DNS_SUBDOMAIN = "^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"
NAMESPACED_NAME = "^[a-z0-9][-a-z0-9]*/[a-z0-9][-.a-z0-9]*$"
DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
CIDR_LIST = r"^ *([0-9a-fA-F.:]+(/[0-9]+)? *(, *[0-9a-fA-F.:]+(/[0-9]+)? *)*)?$"

# Kubernetes-typed maps whose keys are not ours to list.
FREE_FORM = {
    "reconciler.resources",
    "reconciler.nodeSelector",
    "reconciler.affinity",
    "auth.resources",
    "auth.nodeSelector",
    "auth.affinity",
    "webhook.resources",
    "webhook.nodeSelector",
    "webhook.affinity",
    "webhook.certificate.issuerRef",
    "dataplane.spec.resources",
    "observability.labels",
    "networkPolicy.auth.namespaceSelector",
}
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "image.repository": {"type": "string", "minLength": 1},
    "image.pullPolicy": PULL_POLICY,
    "dataplane.spec.imagePullPolicy": PULL_POLICY,
    "reconciler.replicas": {"type": "integer", "minimum": 1},
    "reconciler.throttleSeconds": {"type": "number", "exclusiveMinimum": 0},
    "reconciler.logLevel": {"type": "string", "enum": ["DEBUG", "INFO", "WARNING", "ERROR"]},
    "reconciler.cds.port": PORT,
    "reconciler.auth.port": PORT,
    "reconciler.healthPort": PORT,
    "reconciler.metricsPort": PORT,
    "auth.replicas": {"type": "integer", "minimum": 1},
    "auth.port": PORT,
    "webhook.replicas": {"type": "integer", "minimum": 1},
    "webhook.workers": {"type": "integer", "minimum": 1},
    "webhook.port": PORT,
    "webhook.failurePolicy": FAILURE_POLICY,
    "webhook.gatewayAPIFailurePolicy": FAILURE_POLICY,
    "webhook.timeoutSeconds": {"type": "integer", "minimum": 1, "maximum": 30},
    "webhook.readyCheck.timeoutSeconds": {"type": "integer", "minimum": 1, "maximum": 3600},
    "webhook.nodePortRange": {"type": "string", "pattern": "^[0-9]+-[0-9]+$"},
    # Comma-separated CIDRs (IPv4 or IPv6); the webhook checks each at start.
    "webhook.podCIDRs": {"type": "string", "pattern": CIDR_LIST},
    "webhook.serviceCIDRs": {"type": "string", "pattern": CIDR_LIST},
    "webhook.certificate.validityDays": {"type": "integer", "minimum": 1},
    "dataplane.spec.replicas": {"type": "integer", "minimum": 0},
    "dataplane.spec.terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
    "dataplane.maxAllocations": {"type": "integer", "minimum": 0},
    "dataplane.spec.enableMetricsEndpoint": {"type": ["boolean", "null"]},
    "dataplane.spec.offloadEngine": {"type": "string", "enum": ["None", "TC", "XDP", "Auto"]},
    "observability.allocationAlertRatio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "test.timeoutSeconds": {"type": "integer", "minimum": 1},
    "test.echoPort": {"type": "integer", "minimum": 1024, "maximum": 65535},  # non-root pod
    "test.clusterDomain": {"type": "string", "pattern": "^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"},
    "cdsAuth.mode": {"type": "string", "enum": ["required", "off"]},
    "cdsAuth.readerServiceAccount": {
        "type": "string",
        "pattern": "^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$",
    },
    "gatewayConfig.name": {"type": "string", "pattern": DNS_SUBDOMAIN},
    "gatewayConfig.namespace": {"type": "string", "pattern": f"^$|{DNS_LABEL}"},
    "gatewayConfig.realm": {"type": "string", "minLength": 1},
    "gatewayConfig.authSecretName": {"type": "string", "pattern": DNS_SUBDOMAIN},
    "gatewayConfig.userQuota": {"type": "integer", "minimum": 0},
    # 0 (no cap) or within stunner_api.bandwidth's bounds (the webhook says why)
    "gatewayConfig.allocationBandwidthLimit": {
        "type": "integer",
        "minimum": 0,
        "maximum": 100_000_000_000,
    },
    # Annotation values are strings (--set-string for "true" or a number).
    "loadBalancer.annotations": {"type": "object", "additionalProperties": {"type": "string"}},
}
ITEMS: dict[str, dict[str, Any]] = {
    "imagePullSecrets": K8S_OBJECT,
    "reconciler.tolerations": K8S_OBJECT,
    "reconciler.extraArgs": {"type": "string"},
    "webhook.tolerations": K8S_OBJECT,
    "auth.tolerations": K8S_OBJECT,
    "webhook.excludedNamespaces": {"type": "string"},
    "gatewayConfig.revokedUsers": {"type": "string", "minLength": 1},
    "dataplane.spec.command": {"type": "string"},
    "dataplane.spec.args": {"type": "string"},
    "dataplane.spec.env": K8S_OBJECT,
    "dataplane.spec.offloadInterfaces": {"type": "string", "minLength": 1},
    "test.gateways": {"type": "string", "pattern": "^[a-z0-9][-a-z0-9]*/[a-z0-9][-.a-z0-9]*$"},
    "test.targets": {
        "type": "string",
        "pattern": "^k8s://[a-z0-9][-a-z0-9]*/[a-z0-9][-a-z0-9]*:[0-9]{1,5}$",
    },
    "cdsAuth.extraReaders": {
        "type": "string",
        "pattern": "^[a-z0-9][-a-z0-9]*/[a-z0-9][-.a-z0-9]*$",
    },
    "networkPolicy.cds.extraFrom": K8S_OBJECT,
    "networkPolicy.auth.extraFrom": K8S_OBJECT,
}


def constraints_of(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """CONSTRAINTS plus what the defaults themselves name: the preset names."""
    presets = sorted(values["loadBalancer"]["presets"])
    if "none" in presets:
        raise SystemExit("hack/values_schema.py: loadBalancer.presets must not name 'none'")
    return CONSTRAINTS | {
        "loadBalancer.preset": {"type": "string", "enum": ["none", *presets]},
    }


def schema_of(value: Any, path: str, constraints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if path in constraints:
        return dict(constraints[path])
    if isinstance(value, dict):
        if path in FREE_FORM:
            return {"type": "object"}
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                key: schema_of(item, f"{path}.{key}" if path else key, constraints)
                for key, item in value.items()
            },
        }
    if isinstance(value, list):
        if path not in ITEMS:
            raise SystemExit(f"hack/values_schema.py: say the item type of list {path} in ITEMS")
        return {"type": "array", "items": ITEMS[path]}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    raise SystemExit(f"hack/values_schema.py: {path}: no type for {value!r}")


def render() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        **schema_of(values, "", constraints_of(values)),
    }
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    args = parser.parse_args(argv)
    wanted = render()
    if args.check:
        if not SCHEMA.is_file() or SCHEMA.read_text(encoding="utf-8") != wanted:
            print(f"{SCHEMA.relative_to(ROOT)} is out of date: run python hack/values_schema.py")
            return 1
        return 0
    SCHEMA.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
