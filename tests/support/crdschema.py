"""The CRDs' structural schemas as the fake API server checks them (what a real kube-apiserver
showed the fake lacked: it refused a Dataplane with ``replicas: -1`` by our CRD's ``minimum: 0``
that the fake stored).

The ``openAPIV3Schema`` of every served version of our CRDs (charts/stunner/crds) and Gateway
API v1.6.1's (both channels; the experimental UDPRoute's v1 is the standard one) is checked with
``jsonschema``: types, ``nullable``, ``x-kubernetes-int-or-string``, required fields, enums,
minimum and maximum, lengths, item counts and patterns. Not checked: CEL rules
(``x-kubernetes-validations``), formats, defaults and pruning; those stay the real server's
(tests/envtest/).

The refusal reads as the API server's: 422 Invalid, ``<Kind>.<group> "<name>" is invalid:
<field>: Invalid value: ...``, one cause per field.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import jsonschema

from tests.support.shared import ROOT, crd_schemas, gateway_api_crds

OUR_CRDS = ROOT / "charts" / "stunner" / "crds"


def _openapi_to_json_schema(schema: Any) -> Any:
    """OpenAPI 3.0's structural schema in JSON Schema's words."""
    if isinstance(schema, list):
        return [_openapi_to_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        key: _openapi_to_json_schema(value)
        for key, value in schema.items()
        if not key.startswith("x-kubernetes-") and key not in ("nullable", "format", "default")
    }
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    elif schema.get("nullable") and isinstance(schema.get("type"), str):
        out["type"] = [schema["type"], "null"]
    if "properties" in out:  # property names, not keywords: converted values only
        out["properties"] = {
            name: _openapi_to_json_schema(value) for name, value in schema["properties"].items()
        }
    return out


@functools.cache
def validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> the validator of that version's schema."""
    files = sorted(OUR_CRDS.glob("*.yaml")) + gateway_api_crds("standard")
    schemas = crd_schemas(gateway_api_crds("experimental")) | crd_schemas(files)
    return {
        key: jsonschema.Draft7Validator(_openapi_to_json_schema(schema))
        for key, schema in schemas.items()
    }


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".")


def _detail(error: jsonschema.ValidationError) -> str:
    """The API server's words for the common validators, else jsonschema's."""
    field = _field(error.absolute_path) or "<root>"
    value = json.dumps(error.instance) if not isinstance(error.instance, str) else error.instance
    bound = error.validator_value
    words = {
        "minimum": f"{field} in body should be greater than or equal to {bound}",
        "maximum": f"{field} in body should be less than or equal to {bound}",
        "minLength": f"{field} in body should be at least {bound} chars long",
        "maxLength": f"{field} in body may not be more than {bound} bytes",
        "minItems": f"{field} in body should have at least {bound} items",
        "maxItems": f"must have at most {bound} items",
        "pattern": f"{field} in body should match '{bound}'",
    }
    if error.validator == "enum":
        words["enum"] = "supported values: " + ", ".join(f'"{v}"' for v in bound)
    if error.validator == "required":  # "'image' is a required property"
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        return f"{_field([*error.absolute_path, missing])}: Required value"
    if error.validator == "type":
        return f"{field}: Invalid value: {value!r}: {field} in body must be of type {bound}"
    return f"{field}: Invalid value: {value}: {words.get(str(error.validator), error.message)}"


def problems(obj: dict[str, Any], *, status_only: bool = False) -> Iterator[str]:
    """What the CRD schema of obj's apiVersion and kind refuses in it (nothing for a kind no
    CRD here defines). With status_only, only status is checked (a /status write)."""
    validator = validators().get((str(obj.get("apiVersion")), str(obj.get("kind"))))
    if validator is None:
        return
    body = {k: v for k, v in obj.items() if k != "metadata"}
    for error in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path)):
        path = list(error.absolute_path)
        if (bool(path) and path[0] == "status") == status_only:
            yield _detail(error)
