"""The retrieval domain: knowledge declarations and their validation, sources read into units and chunks, the hybrid
index (dense and BM25, fused), the catalog of loaded sources, ranking, DIRECT and SEQUENTIAL use, and the runtime
that serves a dispatch from them."""
