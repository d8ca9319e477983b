"""The lexical side of retrieval: BM25 (bm25s) over the terms of one analysis, shared by indexing and queries.

The analysis: lowercase words of two or more word characters, the language's stopwords removed, each word
reduced to its Snowball stem (PyStemmer) so that "running studies" meets "runs a study". "none" keeps the
words unstemmed with English stopwords (the analysis before languages were configurable).

Stopword lists are bm25s's (from NLTK); a language bm25s has none for keeps its stopwords, which BM25's IDF
weighs down anyway.
"""

from __future__ import annotations

from pathlib import Path

import bm25s
import numpy as np
import Stemmer

NO_STEMMING = "none"
# Every Snowball algorithm PyStemmer holds ("porter" and "dutch_porter" are older variants of two of them).
LANGUAGES: tuple[str, ...] = (NO_STEMMING, *sorted(Stemmer.algorithms()))

# Languages bm25s ships stopwords for, under the name its tokenizer takes.
_STOPWORDS = {"english": "en", "porter": "en", "german": "de", "dutch": "nl", "dutch_porter": "nl",
              "french": "fr", "spanish": "es", "portuguese": "pt", "italian": "it", "russian": "ru",
              "swedish": "sv", "norwegian": "no", "turkish": "tr", "danish": "da", NO_STEMMING: "en"}

# A term no analysis yields (words are word characters only): stands in for an empty vocabulary.
_NO_TERM = "\x00"


def check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"unknown lexical language {language!r}; choose one of: {', '.join(LANGUAGES)}")


def terms(texts: list[str], language: str) -> list[list[str]]:
    """Each text's terms under the language's analysis, in order (repeats kept: BM25 counts them)."""
    check_language(language)
    # A stemmer per call: PyStemmer's objects are not safe to share between threads, and cost microseconds.
    stemmer = None if language == NO_STEMMING else Stemmer.Stemmer(language)
    stopwords = _STOPWORDS.get(language, [])
    return bm25s.tokenize(texts, lower=True, stopwords=stopwords, stemmer=stemmer, return_ids=False,
                          show_progress=False)


class Lexical:
    """BM25 over a list of texts, addressed by position; immutable once built."""

    def __init__(self, model: bm25s.BM25 | None, language: str) -> None:
        self._model = model  # None when there are no texts: bm25s cannot index an empty corpus
        self.language = language

    @classmethod
    def build(cls, texts: list[str], language: str) -> Lexical:
        if not texts:
            return cls(None, language)
        tokens = terms(texts, language)
        if not any(tokens):
            # bm25s cannot index an empty vocabulary (texts of stopwords or symbols only): a term no query can
            # hold keeps the document count and matches nothing.
            tokens = [[_NO_TERM] for _ in texts]
        model = bm25s.BM25()
        model.index(tokens, show_progress=False)
        return cls(model, language)

    def top(self, query: str, count: int) -> list[tuple[int, float]]:
        """Up to `count` (position, score) pairs, best first; only texts sharing a term with the query."""
        if self._model is None or count <= 0:
            return []
        ids = self._model.get_tokens_ids(terms([query], self.language)[0])
        if not ids:
            return []  # blank, stopword-only or out-of-vocabulary query: no lexical evidence
        scores = self._model.get_scores_from_ids(ids)
        count = min(count, len(scores))
        best = np.argpartition(-scores, count - 1)[:count]
        best = best[scores[best] > 0]
        best = best[np.lexsort((best, -scores[best]))]  # score desc, position asc: deterministic ties
        return [(int(i), float(scores[i])) for i in best]

    def save(self, folder: Path) -> None:
        if self._model is not None:
            self._model.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder: Path, count: int, language: str) -> Lexical:
        if count == 0:
            return cls(None, language)
        model = bm25s.BM25.load(str(folder), mmap=False, show_progress=False, verbosity=0)
        if model.scores["num_docs"] != count:
            raise ValueError(f"BM25 holds {model.scores['num_docs']} documents, manifest says {count}")
        return cls(model, language)
