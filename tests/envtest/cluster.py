"""What the envtest layer installs on a real control plane, read from where it is declared: the
CRDs (ours and Gateway API's), the webhook's ClusterRole (the README's), its registration (the
kinds and versions of stunner_api.vocabulary), and the spec's examples (the YAML blocks of
tests/data/spec/*.md, the spec's documents kept as test data)."""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from stunner_api.vocabulary import JUDGED_KINDS, STUNNER_GROUP, KindInfo
from tests.support.docs import documentation_text
from tests.support.shared import ROOT, SPEC

OUR_CRDS = ROOT / "charts" / "stunner" / "crds"
# Gateway API's TCPRoute is of its experimental channel, which the chart does not ship: the tests'
# own minimal CRD stands in for it (tests/data/crds: any object, as v1alpha2).
TCP_ROUTE_CRD = ROOT / "tests" / "data" / "crds" / "tcproutes.yaml"

WEBHOOK_USER = "stunner-webhook"
VALIDATE = "validate.stunner.l7mp.io"
VALIDATE_GATEWAYS = "gateways.validate.stunner.l7mp.io"
MUTATE = "mutate.stunner.l7mp.io"
MUTATE_GATEWAYS = "gateways.mutate.stunner.l7mp.io"


# --- the spec's examples ----------------------------------------------------------------------

YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Example:
    source: str  # "GATEWAY-REFERENCE.md#3"
    obj: dict[str, Any]

    @property
    def id(self) -> str:
        meta = self.obj.get("metadata", {})
        return f"{self.source}:{self.obj['apiVersion']}/{self.obj['kind']}/{meta.get('name')}"


def spec_examples() -> list[Example]:
    """Every Kubernetes object in a ```yaml block of the spec (tests/data/spec/*.md), in order.

    A block with elided lines ("...") illustrates a status and is no example; an "EOF" line,
    the end of a shell here-document a block was cut from, is dropped."""
    out: list[Example] = []
    for path in sorted(SPEC.glob("*.md")):
        for number, block in enumerate(YAML_BLOCK.findall(path.read_text()), 1):
            lines = [line for line in block.splitlines() if line.strip() != "EOF"]
            if any(line.strip() == "..." for line in lines):
                continue
            for doc in yaml.safe_load_all("\n".join(lines)):
                if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                    out.append(Example(f"{path.name}#{number}", doc))
    return out


# The order a hierarchy is applied in: what others refer to first.
KIND_ORDER = ("Dataplane", "GatewayConfig", "GatewayClass", "Gateway", "StaticService", "UDPRoute")


def apply_order(example: Example) -> tuple[int, str]:
    kind = str(example.obj["kind"])
    rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return rank, example.source


def namespaces_of(objs: list[dict[str, Any]]) -> set[str]:
    """The namespaces objects live in or refer to (parentRefs, backendRefs, secret refs...)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            ns = value.get("namespace")
            if isinstance(ns, str) and ns:
                found.add(ns)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for obj in objs:
        walk(obj)
    return found


def with_string_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """obj with its label and annotation values written as the strings Kubernetes requires
    (YAML's true -> "true")."""
    out = copy.deepcopy(obj)
    for key in ("labels", "annotations"):
        values = out.get("metadata", {}).get(key)
        if isinstance(values, dict):
            for name, value in values.items():
                if not isinstance(value, str):
                    values[name] = json.dumps(value)
    return out


# --- CRD schemas -------------------------------------------------------------------------------


def unknown_fields(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """The fields of value its structural schema does not define: ``kubectl apply`` (strict
    field validation, its default) refuses an object with any; other clients get them pruned."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None:
                if key not in props:
                    out.append(f"{path}.{key}".lstrip("."))
                else:
                    out += unknown_fields(props[key], item, f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(extra, item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += unknown_fields(schema.get("items", {}), item, f"{path}[{i}]")
    return out


def without_fields(obj: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """A copy of obj without the dotted top-level-object fields named (``spec.x``)."""
    out = copy.deepcopy(obj)
    for field in fields:
        *parents, last = field.split(".")
        node = out
        for parent in parents:
            node = node[parent]
        del node[last]
    return out


# --- the webhook's RBAC and registration ------------------------------------------------------


def readme_cluster_role() -> dict[str, Any]:
    """The ClusterRole the documentation's webhook section says the webhook needs."""
    text = documentation_text()
    for block in YAML_BLOCK.findall(text):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "ClusterRole":
                if doc.get("metadata", {}).get("name") == WEBHOOK_USER:
                    return doc
    raise LookupError("the documentation has no ClusterRole stunner-webhook in a yaml block")


def webhook_rbac() -> list[dict[str, Any]]:
    """The README's ClusterRole, bound to the webhook's user."""
    role = readme_cluster_role()
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": WEBHOOK_USER},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": WEBHOOK_USER}
        ],
    }
    return [role, binding]


def _rule(kind: KindInfo, operations: list[str]) -> dict[str, Any]:
    return {
        "apiGroups": [kind.group],
        "apiVersions": list(kind.versions),
        "operations": operations,
        "resources": [kind.plural],
        "scope": "Namespaced" if kind.namespaced else "Cluster",
    }


def _entry(name: str, url: str, ca: bytes, rules: list[dict[str, Any]], policy: str) -> Any:
    return {
        "name": name,
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
        "rules": rules,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "timeoutSeconds": 10,
        "failurePolicy": policy,
        "matchPolicy": "Equivalent",
    }


def registrations(base_url: str, ca: bytes) -> list[dict[str, Any]]:
    """The Validating- and MutatingWebhookConfiguration for every judged kind, each with every
    version stunner_api.vocabulary lists (the versions it judges), by URL. The Gateway API kinds
    have entries of their own with failurePolicy Ignore (the README's registration)."""
    others = [k for k in JUDGED_KINDS if k.group == STUNNER_GROUP]
    gateway_api = [k for k in JUDGED_KINDS if k.group != STUNNER_GROUP]
    validating = [
        _rule(
            k, ["CREATE", "UPDATE", "DELETE"] if k.group == STUNNER_GROUP else ["CREATE", "UPDATE"]
        )
        for k in others
    ]
    mutating = [_rule(k, ["CREATE", "UPDATE"]) for k in others]
    gateways = [_rule(k, ["CREATE", "UPDATE"]) for k in gateway_api]
    url = {"Validating": f"{base_url}/validate", "Mutating": f"{base_url}/mutate"}
    names = {"Validating": (VALIDATE, VALIDATE_GATEWAYS), "Mutating": (MUTATE, MUTATE_GATEWAYS)}
    rules = {"Validating": validating, "Mutating": mutating}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": f"{which}WebhookConfiguration",
            "metadata": {"name": "stunner-webhook"},
            "webhooks": [
                _entry(names[which][0], url[which], ca, rules[which], "Fail"),
                _entry(names[which][1], url[which], ca, gateways, "Ignore"),
            ],
        }
        for which in ("Validating", "Mutating")
    ]


def registered_versions(configs: list[dict[str, Any]]) -> Iterator[tuple[str, str, str]]:
    """(group, version, resource) of every validating rule."""
    for config in configs:
        if config["kind"] != "ValidatingWebhookConfiguration":
            continue
        for webhook in config["webhooks"]:
            for rule in webhook["rules"]:
                for group in rule["apiGroups"]:
                    for version in rule["apiVersions"]:
                        for resource in rule["resources"]:
                            yield group, version, resource
