"""A validating admission webhook called as kube-apiserver calls one, for the fake API server
(:attr:`tests.support.fakeapi.FakeApiServer.webhooks`): an AdmissionReview v1 POSTed over HTTPS
to the webhook's URL, trusted by its CA; the answer turned into the error kube-apiserver
answers a client with, worded as it words it:

- the webhook unreachable or failing (failurePolicy Fail): 500 InternalError, `Internal error
  occurred: failed calling webhook "NAME": failed to call webhook: ...`;
- the webhook refusing: its status code (400 by default) and `admission webhook "NAME" denied
  the request: MESSAGE`.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.fakeapi import ApiError, ResourceType

TIMEOUT = 10


@dataclass
class ValidatingWebhook:
    """One entry of a ValidatingWebhookConfiguration: its name, its URL and CA, the plurals it
    judges (empty: every kind)."""

    name: str
    url: str
    ca: Path
    plurals: frozenset[str] = frozenset()
    calls: list[str] = field(default_factory=list)  # the outcome of each call, in order

    def __call__(
        self, operation: str, rt: ResourceType, obj: Any, dry_run: bool
    ) -> ApiError | None:
        if self.plurals and rt.plural not in self.plurals:
            return None
        kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        meta = obj.get("metadata", {})
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": kind,
                "resource": resource,
                "requestKind": kind,
                "requestResource": resource,
                "name": meta.get("name", ""),
                "namespace": meta.get("namespace", ""),
                "operation": operation,
                "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
                "object": obj,
                "oldObject": None,
                "dryRun": dry_run,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
        url = f"{self.url}?timeout={TIMEOUT}s"
        request = urllib.request.Request(
            url,
            data=json.dumps(review).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            context = ssl.create_default_context(cafile=str(self.ca))
            with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as answer:
                response = json.loads(answer.read())["response"]
        except (OSError, ValueError, KeyError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            self.calls.append("failed")
            return ApiError(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{self.name}": failed to call '
                f'webhook: Post "{url}": {reason}',
            )
        if response.get("allowed"):
            self.calls.append("allowed")
            return None
        status = response.get("status") or {}
        self.calls.append("denied")
        return ApiError(
            int(status.get("code") or 400),
            str(status.get("reason") or "BadRequest"),
            f'admission webhook "{self.name}" denied the request: {status.get("message", "")}',
        )
