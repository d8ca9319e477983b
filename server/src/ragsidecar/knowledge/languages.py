"""The BM25 side's analysis languages, apart from the analysis itself: the config checks a language against
them without loading bm25s and numpy (commands such as `ragsidecar health` read the config)."""

import Stemmer

NO_STEMMING = "none"
# Every Snowball algorithm PyStemmer holds ("porter" and "dutch_porter" are older variants of two of them).
LANGUAGES: tuple[str, ...] = (NO_STEMMING, *sorted(Stemmer.algorithms()))
