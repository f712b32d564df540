"""Reading a dataplane config from text: YAML or JSON, with Go's environment substitution.

- `load_config(text, env)` parses YAML or JSON the way `pkg/config/client.ParseConfig` does:
  `os.ExpandEnv` over the whole text except `auth.credentials` (l7mp/stunner#102), with
  `STUNNER_PORT` defaulted first, then validates it into a `dataplane.StunnerConfig`.
- `load_config_checked` also returns what a valid config most likely got wrong: unknown keys,
  routes to undefined clusters, unset variables in a listener address.

Every problem raises `dataplane.ConfigError`; a parse error never quotes the text (it may hold
a password).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from .dataplane import (
    DEFAULT_PORT,
    AdminConfig,
    AuthConfig,
    ClusterConfig,
    ConfigError,
    LicenseConfig,
    ListenerConfig,
    StunnerConfig,
    go_quote,
    validate_config,
)

ENV_PORT = "STUNNER_PORT"
ENV_PUBLIC_PORT = "STUNNER_PUBLIC_PORT"

_SHELL_SPECIAL = frozenset("*#$@!?-0123456789")
_SHELL_NAME = re.compile(r"[A-Za-z0-9_]*")


def _shell_name(text: str) -> tuple[str, int]:
    """Go's os.getShellName: the variable name after a '$' and how many characters it spans."""
    if text[0] == "{":
        if len(text) > 2 and text[1] in _SHELL_SPECIAL and text[2] == "}":
            return text[1], 3
        closing = text.find("}", 1)
        if closing == 1:
            return "", 2  # bad syntax: "${}" is eaten
        if closing < 0:
            return "", 1  # bad syntax: "${" is eaten
        return text[1:closing], closing + 1
    if text[0] in _SHELL_SPECIAL:
        return text[0], 1
    name = _SHELL_NAME.match(text)
    length = name.end() if name else 0
    return text[:length], length


def expand_env(text: str, env: Mapping[str, str]) -> str:
    """Go's os.ExpandEnv: replace $VAR and ${VAR} from `env`; unset variables become ""."""
    out: list[str] = []
    start = index = 0
    while index < len(text):
        if text[index] == "$" and index + 1 < len(text):
            out.append(text[start:index])
            name, width = _shell_name(text[index + 1 :])
            if name:
                out.append(env.get(name, ""))
            elif width == 0:
                out.append("$")  # not followed by a name: the dollar stays
            index += width
            start = index + 1
        index += 1
    out.append(text[start:])
    return "".join(out)


def _with_default_port(env: Mapping[str, str]) -> dict[str, str]:
    """STUNNER_PORT, unless set to digits, becomes STUNNER_PUBLIC_PORT if numeric, else 3478."""
    resolved = dict(env)
    if not re.fullmatch(r"[0-9]+", resolved.get(ENV_PORT, "")):
        port = DEFAULT_PORT
        public = resolved.get(ENV_PUBLIC_PORT, "")
        if re.fullmatch(r"[+-]?[0-9]+", public):  # strconv.Atoi
            port = int(public)
        resolved[ENV_PORT] = str(port)
    return resolved


def _yaml_reason(error: yaml.YAMLError) -> str:
    """Where and what, without quoting the text (it may hold a password)."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return " ".join(str(error).split())
    parts = []
    for text, mark in ((error.problem, error.problem_mark), (error.context, error.context_mark)):
        if text and mark is not None:
            parts.append(f"line {mark.line + 1}, column {mark.column + 1}: {text}")
        elif text:
            parts.append(text)
    return "; ".join(parts) or type(error).__name__


def _parse_document(text: str) -> dict[str, Any]:
    """YAML, or JSON if YAML fails (sigs.k8s.io/yaml then encoding/json, as Go does).

    A document that looks like a JSON object (what the config discovery service sends) is read
    as JSON first: the same result Go's YAML-to-JSON path gives, at a fraction of PyYAML's cost.
    """
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            pass  # YAML flow style, or broken: YAML decides and words the error
        else:
            return _as_mapping(data)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as yaml_error:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            # Only YAML's error: JSON is (nearly) a subset of YAML, so its error adds noise.
            raise ConfigError(
                f"could not parse config: YAML parse error: {_yaml_reason(yaml_error)}"
            ) from None
    return _as_mapping(data)


def _as_mapping(data: object) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"could not parse config: expected a mapping, got {type(data).__name__}")
    return data


def _credentials_of(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    auth = data.get("auth")
    credentials = auth.get("credentials") if isinstance(auth, Mapping) else None
    return credentials if isinstance(credentials, Mapping) else None


def _unknown_keys(data: object, model: type[BaseModel], path: str) -> Iterator[str]:
    if not isinstance(data, Mapping):
        return
    known = list(model.model_fields)
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {go_quote(close[0])}?)" if close else ""
            yield f"{path}{key}: unknown key, ignored{hint}"


def config_warnings(data: Mapping[str, Any], config: StunnerConfig) -> list[str]:
    """What a valid config most likely got wrong, as `path: message` lines: keys that no field
    has (Go STUNner ignores them, and so do we, for wire compatibility with its operator), each
    with the closest known key, and routes naming a cluster the config does not define."""
    warnings = list(_unknown_keys(data, StunnerConfig, ""))
    sections: tuple[tuple[str, type[BaseModel]], ...] = (
        ("admin", AdminConfig),
        ("auth", AuthConfig),
    )
    for key, model in sections:
        warnings += _unknown_keys(data.get(key), model, f"{key}.")
    admin = data.get("admin")
    if isinstance(admin, Mapping):
        warnings += _unknown_keys(
            admin.get("license_config"), LicenseConfig, "admin.license_config."
        )
    lists: tuple[tuple[str, type[BaseModel]], ...] = (
        ("listeners", ListenerConfig),
        ("clusters", ClusterConfig),
    )
    for key, model in lists:
        items = data.get(key)
        for index, item in enumerate(items if isinstance(items, list) else []):
            warnings += _unknown_keys(item, model, f"{key}[{index}].")
    clusters = {cluster.name for cluster in config.clusters}
    for index, listener in enumerate(config.listeners):
        for route in listener.routes:
            if route not in clusters:
                warnings.append(
                    f"listeners[{index}].routes: cluster {go_quote(route)} is not defined "
                    "(its peers are unreachable)"
                )
    return warnings


def load_config(text: str | bytes, env: Mapping[str, str] | None = None) -> StunnerConfig:
    """Parse, env-substitute, validate and normalise a YAML or JSON config.

    `env` (default: os.environ) feeds $VAR and ${VAR} everywhere except the values of
    `auth.credentials`, which are kept verbatim so that passwords may contain '$'. STUNNER_PORT
    is defaulted first (see `_with_default_port`); `env` itself is not changed.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"could not parse config: not UTF-8: {exc}") from None
    variables = _with_default_port(os.environ if env is None else env)
    raw_credentials = _credentials_of(_parse_document(text))
    data = _parse_document(expand_env(text, variables))
    credentials = _credentials_of(data)
    if raw_credentials is not None and credentials is not None:
        data["auth"]["credentials"] = {**credentials, **raw_credentials}
    return validate_config(data)


def _variable_names(text: str) -> list[str]:
    """The names `expand_env` would look up in `text`."""
    names = []
    index = text.find("$")
    while 0 <= index < len(text) - 1:
        name, width = _shell_name(text[index + 1 :])
        if name:
            names.append(name)
        index = text.find("$", index + 1 + width)
    return names


def _unset_address_variables(
    raw: Mapping[str, Any], variables: Mapping[str, str], config: StunnerConfig
) -> Iterator[str]:
    """An unset variable in a listener address (the usual $STUNNER_ADDR) silently gives
    clients the relay address 0.0.0.0: name it."""
    listeners = raw.get("listeners")
    for index, item in enumerate(listeners if isinstance(listeners, list) else []):
        for key in ("address", "public_address"):
            value = item.get(key) if isinstance(item, Mapping) else None
            if not isinstance(value, str) or index >= len(config.listeners):
                continue
            for name in dict.fromkeys(_variable_names(value)):
                if name not in variables:
                    now = getattr(config.listeners[index], key) or '""'
                    yield (f"listeners[{index}].{key}: ${name} is not set, so the {key} is {now}")


def load_config_checked(
    text: str | bytes, env: Mapping[str, str] | None = None
) -> tuple[StunnerConfig, list[str]]:
    """`load_config`, and its `config_warnings` (and any unset variable in an address)."""
    config = load_config(text, env)
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # load_config succeeded, so it decodes
    variables = _with_default_port(os.environ if env is None else env)
    data = _parse_document(expand_env(text, variables))
    unset = list(_unset_address_variables(_parse_document(text), variables, config))
    return config, unset + config_warnings(data, config)
