"""onnxruntime backend: one session per model, explicit thread settings, padded or per-sequence runs."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ragsidecar.inference.tokenization import ModelInput

log = logging.getLogger(__name__)

# Two scores of the same input count as equal below this difference.
BATCH_INVARIANCE_TOLERANCE = 1e-5


class OnnxBackend:
    """Runs an encoder-style ONNX graph (input_ids, attention_mask[, token_type_ids]; int64 or int32).

    One session is shared by every worker thread: with intra_op_threads=1 each Run executes on its
    caller's thread, so `workers` runs proceed in parallel without fighting over one thread pool.
    """

    def __init__(self, model_file: Path, intra_op_threads: int, inter_op_threads: int) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = inter_op_threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning threads burn the cores that other workers and the event loop need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
        self._session: ort.InferenceSession | None = session
        inputs = {i.name: i.type for i in session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - set(inputs)
        if missing:
            raise ValueError(f"{model_file}: ONNX graph lacks inputs {sorted(missing)}")
        unknown = set(inputs) - {"input_ids", "attention_mask", "token_type_ids"}
        if unknown:
            raise ValueError(
                f"{model_file}: ONNX graph takes inputs {sorted(unknown)}; the sidecar feeds only "
                "input_ids, attention_mask and token_type_ids"
            )
        self._wants_type_ids = "token_type_ids" in inputs
        # Most exports take int64 ids; some (e.g. for mobile runtimes) take int32.
        self._input_dtypes = {name: np.int32 if kind == "tensor(int32)" else np.int64 for name, kind in inputs.items()}
        output_shape = session.get_outputs()[0].shape
        self.output_rank = len(output_shape)
        # Width of the last output axis (the embedding size of encoders); None when the graph leaves it symbolic.
        self.output_width = output_shape[-1] if isinstance(output_shape[-1], int) else None
        # Until probed, assume the worst: one sequence per run is always batch-invariant.
        self.batch_invariant_padding = False

    def release(self) -> None:
        """Drops the session (weights and memory arena) as soon as no run holds it; later runs fail."""
        self._session = None

    def run(self, inputs: list[ModelInput], pad_together: bool) -> list[np.ndarray]:
        """First output for each input, row by row, trimmed back to each input's own length."""
        if pad_together:
            return self._run_padded(inputs)
        return [row for one in inputs for row in self._run_padded([one])]

    def _run_padded(self, inputs: list[ModelInput]) -> list[np.ndarray]:
        width = max(len(i) for i in inputs)
        ids = np.zeros((len(inputs), width), dtype=np.int64)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for row, one in enumerate(inputs):
            ids[row, : len(one)] = one.ids
            types[row, : len(one)] = one.type_ids
            mask[row, : len(one)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if self._wants_type_ids:
            feed["token_type_ids"] = types
        feed = {name: array.astype(self._input_dtypes[name], copy=False) for name, array in feed.items()}
        session = self._session
        if session is None:
            raise RuntimeError("the model was unloaded")
        (output,) = session.run([session.get_outputs()[0].name], feed)
        if output.ndim == 3:  # token vectors: hand back only each input's real tokens
            return [output[row, : len(one)] for row, one in enumerate(inputs)]
        return list(output)

    def probe_batch_invariance(self, samples: list[ModelInput]) -> bool:
        """Whether padded batches give the same outputs as single runs for these samples.

        Dynamically quantized graphs (DynamicQuantizeLinear) pick their activation scale from the
        whole batch, padding included, so a pair's score moves with its batch-mates. Measuring
        the property itself, rather than reading op types, also catches other batch-dependent graphs.
        """
        alone = self.run(samples, pad_together=False)
        together = self.run(samples, pad_together=True)
        worst = max(float(np.max(np.abs(a - b))) for a, b in zip(alone, together, strict=True))
        self.batch_invariant_padding = worst <= BATCH_INVARIANCE_TOLERANCE
        log.info(
            "batch-invariance probe: max |alone - batched| = %.3g -> %s",
            worst,
            "padded batches" if self.batch_invariant_padding else "one sequence per run",
        )
        return self.batch_invariant_padding
