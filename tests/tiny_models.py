"""Tiny real ONNX models for the tests that are not about what a model does: a bag-of-words embedder and a
word-overlap cross-encoder, built with onnx.helper around the packaged models' own tokenizer.json (so token counts,
windows and truncation are the real ones) and run by the real onnxruntime backend.

Each word token has a fixed random vector (seeded, so every build is the same model). The embedder's graph gives
its word tokens' vectors and, at [CLS], their mean (rotated), so texts that share words point the same way whatever
pooling the config names: the repository's config runs unchanged on them (in the Java and TypeScript suites too). The
cross-encoder's graph sums the query's and the document's vectors apart (by token_type_ids) and scores their
cosine ([B,1], scaled): how much of their wording they share. Both load in a blink where the packaged ones take seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sidecar import MODELS

# The packaged models whose tokenizer each tiny one borrows, under the same id (so a test's requests stay as they are).
CROSS_ENCODER = "ms-marco-MiniLM-L-12-v2"
EMBEDDERS = ("bge-small-en-v1.5", "all-MiniLM-L6-v2")
# bge-small's width, so vectors, indexes and their byte accounting are the packaged embedder's size.
DIMENSIONS = 384
# Token ids share this many random vectors (id modulo BUCKETS), stored as float16: 6 MiB of weights, not 45.
BUCKETS = 8192
# The cross-encoder's logit: SCALE times the cosine of the query's and the document's summed word vectors, plus
# OFFSET, so that an unrelated document scores near sigmoid(-3) and one sharing most query words near 1.
SCALE, OFFSET = 10.0, -3.0
# BERT's vocabulary: [PAD], [unused..], [UNK], [CLS], [SEP], [MASK] below this id; they carry no meaning.
FIRST_WORD_ID = 999
# [CLS], where the embedder puts the text's mean word vector (rotated).
CLS_ID = 101


def _initializers(vocabulary: int) -> list[onnx.TensorProto]:
    random = np.random.default_rng(32)
    # A token's vector has about unit length, so a word the query and the document share adds about 1.
    table = (random.standard_normal((BUCKETS, DIMENSIONS)) / np.sqrt(DIMENSIONS)).astype(np.float16)
    is_word = (np.arange(vocabulary) >= FIRST_WORD_ID).astype(np.float32)
    return [
        numpy_helper.from_array(table, "half_table"),
        numpy_helper.from_array(np.array(SCALE, dtype=np.float32), "scale"),
        numpy_helper.from_array(np.array(OFFSET, dtype=np.float32), "offset"),
        numpy_helper.from_array(np.array(1e-6, dtype=np.float32), "epsilon"),
        numpy_helper.from_array(is_word, "is_word"),
        numpy_helper.from_array((np.arange(vocabulary) == CLS_ID).astype(np.float32), "is_cls"),
        numpy_helper.from_array(np.where(random.random(DIMENSIONS) < 0.5, -1.0, 1.0).astype(np.float32), "signs"),
        numpy_helper.from_array(np.array(BUCKETS, dtype=np.int64), "buckets"),
        numpy_helper.from_array(np.array([1]), "axis1"),
        numpy_helper.from_array(np.array([2]), "axis2"),
    ]


def _vocabulary(tokenizer_json: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).get_vocab_size()


def _weighted(prefix: str, weights: str) -> list[onnx.NodeProto]:
    """Nodes giving `<prefix>` [B,T,D]: each word token's vector times its weight ([B,T] float)."""
    return [
        helper.make_node("Mul", ["word", weights], [f"{prefix}_weights"]),
        helper.make_node("Unsqueeze", [f"{prefix}_weights", "axis2"], [f"{prefix}_column"]),
        helper.make_node("Mul", ["token_vectors", f"{prefix}_column"], [prefix]),
    ]


def _summed(prefix: str, weights: str) -> list[onnx.NodeProto]:
    """Nodes summing the word tokens' vectors weighted by `weights` into `<prefix>` [B,D]."""
    return [
        *_weighted(f"{prefix}_tokens", weights),
        helper.make_node("ReduceSum", [f"{prefix}_tokens", "axis1"], [prefix], keepdims=0),
    ]


def _model(name: str, nodes: list[onnx.NodeProto], inputs: tuple[str, ...], shape: list, vocabulary: int):
    common = [
        helper.make_node("Cast", ["half_table"], ["table"], to=TensorProto.FLOAT),
        helper.make_node("Mod", ["input_ids", "buckets"], ["bucket"]),
        helper.make_node("Gather", ["table", "bucket"], ["token_vectors"]),
        helper.make_node("Gather", ["is_word", "input_ids"], ["word"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        [*common, *nodes],
        name,
        [helper.make_tensor_value_info(i, TensorProto.INT64, ["batch", "sequence"]) for i in inputs],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
        _initializers(vocabulary),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def embedder_graph(vocabulary: int) -> onnx.ModelProto:
    """[B,T,D]: each word token's vector (zero for other special tokens and padding), and at [CLS] the text's mean
    word vector with some of its coordinates' signs flipped (a fixed rotation). Either pooling means the text's
    wording: [CLS] pooling gives the rotated mean, mean pooling mostly the mean itself; so the repository's config
    runs unchanged on them, and switching a model's pooling still changes its vectors."""
    nodes = [
        *_weighted("words", "mask"),
        helper.make_node("ReduceSum", ["words", "axis1"], ["total"], keepdims=1),
        helper.make_node("ReduceSum", ["mask", "axis1"], ["count"], keepdims=1),
        helper.make_node("Unsqueeze", ["count", "axis2"], ["count_column"]),
        helper.make_node("Div", ["total", "count_column"], ["mean"]),
        helper.make_node("Mul", ["mean", "signs"], ["rotated_mean"]),
        helper.make_node("Gather", ["is_cls", "input_ids"], ["cls"]),
        helper.make_node("Unsqueeze", ["cls", "axis2"], ["cls_column"]),
        helper.make_node("Mul", ["cls_column", "rotated_mean"], ["at_cls"]),
        helper.make_node("Add", ["words", "at_cls"], ["output"]),
    ]
    return _model(
        "tiny-embedder",
        nodes,
        ("input_ids", "attention_mask"),
        ["batch", "sequence", DIMENSIONS],
        vocabulary,
    )


def cross_encoder_graph(vocabulary: int) -> onnx.ModelProto:
    """logits [B,1]: SCALE x the cosine of the query's summed word vectors and the document's, + OFFSET."""
    nodes = [
        helper.make_node("Cast", ["token_type_ids"], ["segment"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["mask", "segment"], ["document_mask"]),
        helper.make_node("Sub", ["mask", "document_mask"], ["query_mask"]),
        *_summed("query", "query_mask"),
        *_summed("document", "document_mask"),
    ]
    products = {"dot": ("query", "document"), "qq": ("query", "query"), "dd": ("document", "document")}
    for name, (a, b) in products.items():
        nodes += [
            helper.make_node("Mul", [a, b], [f"{name}_products"]),
            helper.make_node("ReduceSum", [f"{name}_products", "axis1"], [name], keepdims=1),
        ]
    nodes += [
        helper.make_node("Mul", ["qq", "dd"], ["norms_squared"]),
        helper.make_node("Sqrt", ["norms_squared"], ["norms"]),
        helper.make_node("Add", ["norms", "epsilon"], ["divisor"]),
        helper.make_node("Div", ["dot", "divisor"], ["cosine"]),
        helper.make_node("Mul", ["cosine", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "offset"], ["output"]),
    ]
    return _model(
        "tiny-cross-encoder", nodes, ("input_ids", "attention_mask", "token_type_ids"), ["batch", 1], vocabulary
    )


def build(models_dir: Path) -> Path:
    """Writes both tiny models into `models_dir` (a folder per id, as `ragsidecar models install` lays them out)."""
    graphs = {CROSS_ENCODER: cross_encoder_graph, **{embedder: embedder_graph for embedder in EMBEDDERS}}
    for model_id, graph in graphs.items():
        folder = models_dir / model_id
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer = MODELS / model_id / "tokenizer.json"
        shutil.copyfile(tokenizer, folder / "tokenizer.json")
        onnx.save(graph(_vocabulary(tokenizer)), str(folder / "model.onnx"))
    return models_dir


if __name__ == "__main__":  # `make test` hands the Java and TypeScript suites this folder ($RAGSIDECAR_MODELS_DIR)
    from sidecar import tiny_models_dir

    print(tiny_models_dir())
