"""The optional HTTP API (Cohere- and Jina-style rerank, text-embeddings-inference's /rerank, OpenAI-style
embeddings) served beside gRPC in the same process; imported only when [http] port is set."""
