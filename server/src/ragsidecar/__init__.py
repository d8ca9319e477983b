"""ragsidecar: retrieval, reranking and chat-knowledge grounding for agent hosts, as a gRPC sidecar."""

__version__ = "0.3.0"
