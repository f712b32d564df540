"""What `stunner selftest --target` checks media against: a Service of the cluster named
`k8s://NAMESPACE/SERVICE:PORT` (Go STUNner v2's `mediactl` addresses Services so), resolved as
a pod resolves any Service name. Pure but for `resolve` (the system's resolver)."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass

K8S_SCHEME = "k8s://"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123, as Kubernetes names
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
Resolver = Callable[[str, int], str]


@dataclass(frozen=True)
class Target:
    """A Service to check media against: `k8s://NAMESPACE/SERVICE:PORT`."""

    namespace: str
    service: str
    port: int

    def host(self, cluster_domain: str) -> str:
        return f"{self.service}.{self.namespace}.svc.{cluster_domain}"

    def __str__(self) -> str:
        return f"{K8S_SCHEME}{self.namespace}/{self.service}:{self.port}"


def parse_target(text: str) -> Target:
    """`k8s://NAMESPACE/SERVICE:PORT`, or ValueError naming what is wrong."""
    want = f"want {K8S_SCHEME}NAMESPACE/SERVICE:PORT"
    if not text.startswith(K8S_SCHEME):
        raise ValueError(f"{text!r}: {want}")
    where, colon, port_text = text[len(K8S_SCHEME) :].rpartition(":")
    if not colon:
        raise ValueError(f"{text!r}: no port ({want})")
    namespace, slash, service = where.partition("/")
    if not slash:
        raise ValueError(f"{text!r}: no namespace ({want})")
    for what, name in (("namespace", namespace), ("service", service)):
        if not DNS_LABEL.fullmatch(name):
            raise ValueError(f"{text!r}: {what} {name!r} is not a Kubernetes name")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: port {port_text!r} is not 1-65535")
    return Target(namespace, service, int(port_text))


def resolve(host: str, port: int) -> str:
    """The first address the resolver gives for a UDP peer, IPv4 first (the relay's family)."""
    answers = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    answers.sort(key=lambda answer: answer[0] != socket.AF_INET)
    return str(answers[0][4][0])
