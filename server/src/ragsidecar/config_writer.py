"""The configuration written back as TOML (`ragsidecar config`): a file that loads back to the same settings."""

from __future__ import annotations

import msgspec
import tomli_w

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
    resolved = msgspec.to_builtins(msgspec.structs.replace(config, paths=paths), enc_hook=str)
    # The file's tables and [[models]]; the scalars (base_dir) are where the file was, not settings.
    return tomli_w.dumps({key: value for key, value in resolved.items() if isinstance(value, dict | list | tuple)})
