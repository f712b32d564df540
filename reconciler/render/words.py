"""The words render writes: condition types and reasons (ANCHORS §2.7), label and annotation
keys (§2.4). Until stunner_api.vocabulary declares them, they are declared here, once."""

from __future__ import annotations

from enum import StrEnum


class Severity(StrEnum):
    ERROR = "Error"
    WARNING = "Warning"


class ConditionType(StrEnum):
    ACCEPTED = "Accepted"
    PROGRAMMED = "Programmed"
    CONFLICTED = "Conflicted"
    RESOLVED_REFS = "ResolvedRefs"


class Reason(StrEnum):
    ACCEPTED = "Accepted"
    PENDING = "Pending"
    PROGRAMMED = "Programmed"
    INVALID = "Invalid"
    INVALID_PARAMETERS = "InvalidParameters"
    ADDRESS_NOT_ASSIGNED = "AddressNotAssigned"
    UNSUPPORTED_ADDRESS = "UnsupportedAddress"
    PORT_UNAVAILABLE = "PortUnavailable"
    UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"
    NO_CONFLICTS = "NoConflicts"
    PROTOCOL_CONFLICT = "ProtocolConflict"
    RESOLVED_REFS = "ResolvedRefs"
    INVALID_CERTIFICATE_REF = "InvalidCertificateRef"
    REF_NOT_PERMITTED = "RefNotPermitted"
    NOT_ALLOWED_BY_LISTENERS = "NotAllowedByListeners"
    NO_MATCHING_PARENT = "NoMatchingParent"
    INVALID_KIND = "InvalidKind"
    BACKEND_NOT_FOUND = "BackendNotFound"


OWNED_BY_LABEL = "stunner.l7mp.io/owned-by"
OWNED_BY_VALUE = "stunner"
RELATED_GATEWAY_NAME = "stunner.l7mp.io/related-gateway-name"
RELATED_GATEWAY_NAMESPACE = "stunner.l7mp.io/related-gateway-namespace"
APP_LABEL = "app"
APP_VALUE = "stunner"
