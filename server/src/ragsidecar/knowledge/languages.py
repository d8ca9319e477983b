"""The BM25 side's analysis languages, apart from the analysis itself: the config checks a language against
them without loading the stemmers, bm25s or numpy (commands such as `ragsidecar health` read the config).

The list is PyStemmer's Snowball algorithms, written out so that checking a name loads nothing;
tests/unit/test_light_commands.py holds it equal to `Stemmer.algorithms()` of the pinned PyStemmer."""

NO_STEMMING = "none"
# Every Snowball algorithm PyStemmer holds ("porter" and "dutch_porter" are older variants of two of them).
STEMMERS: tuple[str, ...] = (
    "arabic",
    "armenian",
    "basque",
    "catalan",
    "czech",
    "danish",
    "dutch",
    "dutch_porter",
    "english",
    "esperanto",
    "estonian",
    "finnish",
    "french",
    "german",
    "greek",
    "hindi",
    "hungarian",
    "indonesian",
    "irish",
    "italian",
    "lithuanian",
    "nepali",
    "norwegian",
    "persian",
    "polish",
    "porter",
    "portuguese",
    "romanian",
    "russian",
    "serbian",
    "sesotho",
    "spanish",
    "swedish",
    "tamil",
    "turkish",
    "yiddish",
)
LANGUAGES: tuple[str, ...] = (NO_STEMMING, *STEMMERS)
