"""The repository's config file is the built-in defaults with paths for a checkout."""

from __future__ import annotations

import tomllib

from sidecar import DEFAULT_CONFIG

from ragsidecar.config_loading import BUILT_IN_CONFIG


def test_the_repository_config_is_the_built_in_defaults_with_checkout_paths() -> None:
    repo, built_in = tomllib.loads(DEFAULT_CONFIG.read_text()), tomllib.loads(BUILT_IN_CONFIG.read_text())
    assert repo.pop("paths") == {"models_dir": "../models", "data_dir": "../data", "knowledge_roots": ["../knowledge"]}
    assert built_in.pop("paths") == {"models_dir": "models", "data_dir": "data", "knowledge_roots": ["knowledge"]}
    assert repo == built_in
