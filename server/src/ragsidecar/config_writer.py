"""The configuration written back as TOML (`ragsidecar config`): a file that loads back to the same settings."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from ragsidecar.config import Config


def to_toml(config: Config) -> str:
    """The configuration as a TOML file that loads back to the same settings, wherever it is saved.

    Paths are written resolved (absolute), since a saved copy no longer sits where they were relative to.
    """
    paths = msgspec.structs.replace(
        config.paths,
        models_dir=str(config.resolve(config.paths.models_dir)),
        data_dir=str(config.resolve(config.paths.data_dir)),
        knowledge_roots=tuple(str(root) for root in config.knowledge_roots()),
    )
    resolved = msgspec.structs.replace(config, paths=paths)
    lines: list[str] = []
    for section in config.__struct_fields__:
        value = getattr(resolved, section)
        if isinstance(value, msgspec.Struct):
            lines += ["", f"[{section}]", *_toml_pairs(value)]
        elif section == "models":
            for model in value:
                lines += ["", "[[models]]", *_toml_pairs(model)]
    return "\n".join(lines).lstrip() + "\n"


def _toml_pairs(table: msgspec.Struct) -> list[str]:
    return [f"{name} = {_toml_value(getattr(table, name))}" for name in table.__struct_fields__]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)
