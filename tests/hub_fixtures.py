"""Test fixtures for hub models: tiny reranker exports of each common layout, and a model hub cache laid out as
huggingface_hub lays it out (refs/, blobs/ named by content, snapshots/<commit>/ of relative symlinks).

The tiny graphs score a (query, document) input by how many "cat" tokens it holds (only the document's, when the
graph reads token_type_ids), so a Rerank of documents with more cats must come back in that order.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

WORDS = "which pet purrs cat dog bird fish the a on mat sat and".split()
CORPUS = [" ".join(WORDS), "the cat sat on the mat", "a dog and a cat", "which pet purrs", "fish bird dog cat"] * 4


@dataclass(frozen=True)
class Layout:
    """One export layout: tokenizer family, whether the graph reads token_type_ids, logits shape, id type."""

    name: str
    tokenizer: str
    type_ids: bool
    logits: str
    int32: bool = False


LAYOUTS = (
    Layout("bert-b1", "bert", type_ids=True, logits="[B,1]"),
    Layout("roberta-b", "roberta", type_ids=False, logits="[B]"),
    Layout("xlmr-b2", "xlmr", type_ids=False, logits="[B,2]", int32=True),
)


def bert_tokenizer() -> Tokenizer:
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def roberta_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tokenizer


def xlmr_tokenizer() -> Tokenizer:
    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -3.0)]
    pieces += [(f"▁{word}", -1.0) for word in WORDS]
    pieces += [(letter, -5.0) for letter in sorted(set("".join(WORDS)))]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return tokenizer


TOKENIZERS = {"bert": bert_tokenizer, "roberta": roberta_tokenizer, "xlmr": xlmr_tokenizer}


def cat_graph(tokenizer: Tokenizer, layout: Layout) -> onnx.ModelProto:
    """logit = the number of "cat" tokens among the real (masked-in) tokens, of the document segment when the
    graph reads token_type_ids; shaped as the layout says ([B,2]: -n/2 and +n/2, so only the positive class's
    column, or the difference, orders the documents right)."""
    vocab = tokenizer.get_vocab()
    weights = np.zeros(max(vocab.values()) + 1, dtype=np.float32)
    for token, i in vocab.items():
        weights[i] = float("cat" in token)
    id_type = TensorProto.INT32 if layout.int32 else TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info(name, id_type, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", *(("token_type_ids",) if layout.type_ids else ()))
    ]
    nodes = [
        helper.make_node("Gather", ["weights", "input_ids"], ["token_weights"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["token_weights", "mask"], ["masked"]),
    ]
    counted = "masked"
    if layout.type_ids:
        nodes += [
            helper.make_node("Cast", ["token_type_ids"], ["segment"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["masked", "segment"], ["in_document"]),
        ]
        counted = "in_document"
    nodes.append(helper.make_node("ReduceSum", [counted, "axis1"], ["count"], keepdims=0))
    shape = {
        "[B]": ["batch"],
        "[B,1]": ["batch", 1],
        "[B,2]": ["batch", 2],
        "[B,3]": ["batch", 3],
        "[B,T]": ["batch", "sequence"],
    }[layout.logits]
    if layout.logits == "[B]":
        nodes.append(helper.make_node("Identity", ["count"], ["logits"]))
    elif layout.logits == "[B,1]":
        nodes.append(helper.make_node("Unsqueeze", ["count", "axis1"], ["logits"]))
    elif layout.logits == "[B,T]":  # a value per token (a token-classification export): no relevance score
        nodes.append(helper.make_node("Identity", [counted], ["logits"]))
    elif layout.logits == "[B,3]":  # three classes (e.g. an NLI head): not a relevance score
        nodes += [
            helper.make_node("Unsqueeze", ["count", "axis1"], ["column"]),
            helper.make_node("Concat", ["column", "column", "column"], ["logits"], axis=1),
        ]
    else:
        nodes += [
            helper.make_node("Mul", ["count", "half"], ["positive"]),
            helper.make_node("Neg", ["positive"], ["negative"]),
            helper.make_node("Unsqueeze", ["positive", "axis1"], ["positive_column"]),
            helper.make_node("Unsqueeze", ["negative", "axis1"], ["negative_column"]),
            helper.make_node("Concat", ["negative_column", "positive_column"], ["logits"], axis=1),
        ]
    initializers = [numpy_helper.from_array(weights, "weights"), numpy_helper.from_array(np.array([1]), "axis1")]
    if layout.logits == "[B,2]":
        initializers.append(numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"))
    graph = helper.make_graph(
        nodes, layout.name, inputs, [helper.make_tensor_value_info("logits", TensorProto.FLOAT, shape)], initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_export(folder: Path, layout: Layout, pair_template: bool = True) -> Path:
    """A tiny export of the layout: model.onnx and tokenizer.json in `folder` (without the tokenizer's
    post-processor when not `pair_template`)."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = TOKENIZERS[layout.tokenizer]()
    if not pair_template:
        tokenizer.post_processor = None
    tokenizer.save(str(folder / "tokenizer.json"))
    onnx.save(cat_graph(tokenizer, layout), str(folder / "model.onnx"))
    return folder


def lay_out_repo(cache: Path, repo: str, commit: str, files: dict[str, Path], refs: tuple[str, ...] = ()) -> Path:
    """Puts `files` (path in the repository -> local file) into a hub cache as snapshot `commit`, with each of
    `refs` (branch or tag names) pointing at it; returns the snapshot folder."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    for path_in_repo, source in files.items():
        blob = root / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(source, blob)
        link = snapshot / path_in_repo
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (root / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snapshot


def commit_sha(label: str) -> str:
    """A 40-hex commit id, as the hub names snapshots."""
    return hashlib.sha1(label.encode()).hexdigest()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
