"""Pure choices behind hub installs and scoring: hub ids, which graph a repository's files offer, the logit."""

from __future__ import annotations

import numpy as np
import pytest

from ragsidecar.hub_models import HubRef, pick_onnx_file
from ragsidecar.inference.models import relevance_logit
from ragsidecar.model_files import InstallError


@pytest.mark.parametrize(
    ("text", "repo", "revision"),
    [
        ("BAAI/bge-reranker-v2-m3", "BAAI/bge-reranker-v2-m3", None),
        ("cross-encoder/ms-marco-MiniLM-L6-v2@main", "cross-encoder/ms-marco-MiniLM-L6-v2", "main"),
        ("Xenova/bge-reranker-base@refs/pr/3", "Xenova/bge-reranker-base", "refs/pr/3"),
        ("org/name@" + "a" * 40, "org/name", "a" * 40),
    ],
)
def test_hub_ids_parse(text: str, repo: str, revision: str | None) -> None:
    assert HubRef.parse(text) == HubRef(repo, revision)
    assert str(HubRef.parse(text)) == text


@pytest.mark.parametrize(
    "text",
    [
        "name",
        "org/",
        "/name",
        "org/name/extra",
        "org/name@",
        "org/..@v1",
        "org/name@../x",
        "https://example.org/org/name",
        "org/name@v 1",
        "",
    ],
)
def test_what_is_not_a_hub_id(text: str) -> None:
    with pytest.raises(ValueError, match="is not a hub model id"):
        HubRef.parse(text)


OPTIMUM = [
    "config.json",
    "tokenizer.json",
    "onnx/model.onnx",
    "onnx/model_O4.onnx",
    "onnx/model_qint8_arm64.onnx",
    "onnx/model_quint8_avx2.onnx",
    "onnx/model_qint8_avx512.onnx",
]
TRANSFORMERS_JS = [
    "tokenizer.json",
    "onnx/model.onnx",
    "onnx/model_fp16.onnx",
    "onnx/model_quantized.onnx",
    "onnx/model_int8.onnx",
]


@pytest.mark.parametrize(
    ("files", "quantized", "graph"),
    [
        (OPTIMUM, False, "onnx/model.onnx"),
        (OPTIMUM, True, "onnx/model_quint8_avx2.onnx"),
        (TRANSFORMERS_JS, True, "onnx/model_quantized.onnx"),
        (["model.onnx", "model_quantized.onnx", "tokenizer.json"], True, "model_quantized.onnx"),
        (["model.onnx", "onnx/model.onnx"], False, "onnx/model.onnx"),
    ],
)
def test_the_graph_picked_from_a_repository(files: list[str], quantized: bool, graph: str) -> None:
    assert pick_onnx_file(files, quantized, "org/name@abc") == graph


def test_a_repository_without_the_wanted_graph_lists_what_it_has() -> None:
    with pytest.raises(InstallError, match="no quantized graph; it has onnx/model.onnx, onnx/model_fp16.onnx"):
        pick_onnx_file(["onnx/model.onnx", "onnx/model_fp16.onnx"], True, "org/name@abc")


@pytest.mark.parametrize(("row", "logit"), [(1.5, 1.5), ([1.5], 1.5), ([-0.25, 1.25], 1.5)])
def test_the_relevance_logit_of_each_output_shape(row: float | list[float], logit: float) -> None:
    """One output row of a [B], [B,1] or [B,2] graph."""
    assert relevance_logit(np.asarray(row, dtype=np.float32)) == pytest.approx(logit)
