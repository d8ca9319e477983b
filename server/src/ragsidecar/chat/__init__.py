"""Chat grounding: owner-aware outbound turns, live binding corpora, activity records (no gRPC here)."""
