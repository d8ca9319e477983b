"""Model inference: tokenization, onnxruntime backends, the batching queue and the loaded model set."""
