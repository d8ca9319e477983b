"""The retrieval quality settings' bounds: a config holding one out of range is refused at load, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragsidecar.config import ConfigError
from ragsidecar.config_loading import load_config


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("lexical_language", '"klingon"', "retrieval.lexical_language: 'klingon' is not one of none, arabic"),
        ("fusion", '"max"', "retrieval.fusion: 'max' is not one of 'rrf', 'weighted_rrf', 'convex'"),
        ("dense_weight", "1.5", "retrieval.dense_weight: must be in [0, 1], got 1.5"),
        ("dense_spread_gain", "150", "retrieval.dense_spread_gain: must be in [0, 100], got 150"),
        ("feedback_documents", "101", "retrieval.feedback_documents: must be in [0, 100], got 101"),
        ("feedback_weight", "1.5", "retrieval.feedback_weight: must be in [0, 1], got 1.5"),
        ("rerank_fusion", '"mean"', "retrieval.rerank_fusion: 'mean' is not one of 'rrf', 'interpolate'"),
        ("rerank_weight", "-0.5", "retrieval.rerank_weight: must be in [0, 1], got -0.5"),
    ],
)
def test_invalid_quality_settings_are_refused_at_config_load(
    tmp_path: Path, key: str, value: str, message: str
) -> None:
    config = tmp_path / "ragsidecar.toml"
    config.write_text(f"[retrieval]\n{key} = {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(config, environ={}, check_files=False)
    assert str(refused.value).startswith(message)
