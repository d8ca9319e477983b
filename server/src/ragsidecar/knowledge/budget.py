"""Token budgets of DIRECT knowledge, sized by the model's input window.

Tokens are counted with the embedder's tokenizer: an estimate of the host model's own count, the
same estimate everywhere (validation, Enforce, chat turns), so what validated also fits at dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragsidecar.knowledge.declarations import Llm

# Input windows of common host models, in tokens. Hosts can send the window with each request, and
# operators can add models under [retrieval.model_windows].
KNOWN_WINDOWS: dict[str, int] = {
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4-turbo": 128_000,
    "gpt-3.5-turbo": 16_385,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-3-5-haiku": 200_000,
    "gemini-1.5-pro": 2_097_152,
    "gemini-2.0-flash": 1_048_576,
    "llama3": 8_192,
    "llama3.1": 131_072,
    "mistral": 32_768,
    "qwen2.5": 32_768,
}


@dataclass(frozen=True)
class BudgetPolicy:
    fraction: float
    extra_windows: dict[str, int]

    def window(self, llm: Llm | None) -> int | None:
        """The model's input window: as given, else from the tables (exact id, then its base name)."""
        if llm is None:
            return None
        if llm.input_window_tokens:
            return llm.input_window_tokens
        table = {**KNOWN_WINDOWS, **self.extra_windows}
        if llm.model in table:
            return table[llm.model]
        base = llm.model.rsplit("/", 1)[-1].split(":")[0]
        return next((table[m] for m in sorted(table, key=len, reverse=True) if base.startswith(m)), None)

    def default_budget(self, window: int) -> int:
        """Tokens the DIRECT entries without max_tokens share."""
        return max(int(window * self.fraction), 1)
