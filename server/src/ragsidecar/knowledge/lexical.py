"""The lexical side of retrieval: BM25 over the terms of one analysis, shared by indexing and queries.

The analysis: lowercase words of two or more word characters, the language's stopwords removed, each word
reduced to its Snowball stem (PyStemmer) so that "running studies" meets "runs a study". "none" keeps the
words unstemmed with English stopwords (the analysis before languages were configurable).

Stopword lists are bm25s's (from NLTK); a language bm25s has none for keeps its stopwords, which BM25's IDF
weighs down anyway.

The index (Lexical) is incremental, for memories that change a text at a time: every score equals bm25s's
("lucene" BM25, k1 1.2, b 0.6) built afresh on the live texts, whatever adds and removes led there. A text goes
to an in-memory table (memtable) of recent texts; a full memtable becomes an immutable segment (numpy postings:
per term, the slots holding it, each with one "shape" number for the term's count and the text's length).
Segments of a similar size are merged (tiered), dropping the postings of removed and replaced texts, so scoring
visits a few segments and memory follows the live texts. Until a merge drops them, such postings stay in their
segment and are skipped: a slot's postings count only in the segment holding its current text. The collection
statistics (texts, average length, the query terms' document frequencies) are taken from the live texts at query
time, so scores never drift.
"""

from __future__ import annotations

import json
import operator
import re
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import cast

import numpy as np
import Stemmer
from bm25s import stopwords as bm25s_stopwords

from ragsidecar.knowledge.languages import LANGUAGES, NO_STEMMING
from ragsidecar.knowledge.merge_policy import SegmentSize, TieredMergePolicy

# The languages bm25s ships stopwords for, with its lists.
_STOPWORDS: dict[str, frozenset[str]] = {
    language: frozenset(getattr(bm25s_stopwords, f"STOPWORDS_{name}"))
    for language, name in {
        "english": "EN",
        "porter": "EN",
        "german": "GERMAN",
        "dutch": "DUTCH",
        "dutch_porter": "DUTCH",
        "french": "FRENCH",
        "spanish": "SPANISH",
        "portuguese": "PORTUGUESE",
        "italian": "ITALIAN",
        "russian": "RUSSIAN",
        "swedish": "SWEDISH",
        "norwegian": "NORWEGIAN",
        "turkish": "TURKISH",
        "danish": "DANISH",
        NO_STEMMING: "EN",
    }.items()
}
# Per thread: its stemmer of each language (_stemmer).
_STEMMERS = threading.local()
# bm25s's (and scikit-learn's) token pattern.
_WORD = re.compile(r"(?u)\b\w\w+\b")


def check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"unknown lexical language {language!r}; choose one of: {', '.join(LANGUAGES)}")


def terms(texts: list[str], language: str) -> list[list[str]]:
    """Each text's terms under the language's analysis, in order (repeats kept: BM25 counts them). The same terms
    as bm25s.tokenize(lower=True, the language's stopwords, its stemmer), without its per-call overhead (a
    progress bar set up and the stopword set rebuilt for every text: a third of a query's BM25 time)."""
    check_language(language)
    stopwords = _STOPWORDS.get(language, frozenset())
    words = [[w for w in _WORD.findall(text.lower()) if w not in stopwords] for text in texts]
    if language == NO_STEMMING:
        return words
    distinct = list(dict.fromkeys(chain.from_iterable(words)))
    stems = dict(zip(distinct, _stemmer(language).stemWords(distinct), strict=True))
    return [[stems[w] for w in text] for text in words]


def _stemmer(language: str) -> Stemmer.Stemmer:
    """The calling thread's stemmer for the language. PyStemmer's objects are not safe to share between threads;
    one kept per thread rather than one per call keeps its word cache (at most 10,000 words, PyStemmer's default
    bound), which makes a query's stemming about five times faster (50 against 10 microseconds)."""
    stemmers: dict[str, Stemmer.Stemmer] = _STEMMERS.__dict__
    stemmer = stemmers.get(language)
    if stemmer is None:
        stemmer = stemmers[language] = Stemmer.Stemmer(language)
    return stemmer


# BM25 as bm25s computes it (method "lucene"), which the PostgreSQL store's SQL repeats. k1 1.2 and b 0.6 rather
# than bm25s's defaults (1.5, 0.75): the one pair of the grid at or above the reference BM25 (k1 0.9, b 0.4) on
# all five development sets; at 0.75, NPL's short abstracts lost 0.017 (bench/beir.py, docs/retrieval.md).
K1 = 1.2
B = 0.6

# A memtable becomes a segment at this many texts or postings (a flush costs milliseconds, once per this many adds;
# a search converts the memtable's postings of its terms from Python lists).
FLUSH_TEXTS = 256
FLUSH_POSTINGS = 1 << 15
# Which segments merge, and when (knowledge/merge_policy.py).
MERGE_POLICY = TieredMergePolicy()
# Merges of up to this many postings run inside add() and remove() (tens of milliseconds); larger ones wait for
# merge(), which the owner runs off the request path.
INLINE_MERGE_POSTINGS = 1 << 20
# A vocabulary of this many terms or more drops those no posting holds once they are over half of it (checked each
# time merges have dropped as many postings as the segments hold).
VOCABULARY_FLOOR = 1 << 14
# Selecting the best scores (_highest): sampled scores per result wanted, and how many times that many results the
# sampled threshold aims to let through.
_SAMPLED_PER_RESULT = 64
_EXPECTED_SHARE = 3
# Estimated resident bytes of one memtable posting (a list entry and its int), a vocabulary term and a shape.
_MEMTABLE_POSTING_BYTES = 40
_TERM_BYTES = 120
_SHAPE_BYTES = 150

_FORMAT = 1
_META = "lexical.json"
_VOCABULARY = "vocabulary.json"
# Saved arrays: the segments' concatenated (shape numbers narrowed per segment in memory, saved as uint32), the
# per-slot ones and the shapes.
_SEGMENT_ARRAYS = {"terms": np.int32, "starts": np.int64, "slots": np.int32, "shapes": np.uint32, "docs": np.int32}
_SLOT_ARRAYS = {"owner": np.int32, "text_lengths": np.int32, "distinct": np.int32}
_SHAPE_ARRAYS = {"shape_tfs": np.int64, "shape_lengths": np.int64}

Postings = tuple[np.ndarray, np.ndarray]  # slots, shapes


def _narrow(shapes: np.ndarray) -> np.ndarray:
    """Shape numbers as uint16 while they fit (a posting then takes 6 bytes)."""
    return shapes.astype(np.uint16 if not len(shapes) or shapes.max() <= np.iinfo(np.uint16).max else np.uint32)


@dataclass(frozen=True, eq=False)
class _Segment:
    """Immutable postings of some texts: term ids ascending, term i's postings at starts[i]:starts[i + 1]."""

    id: int
    terms: np.ndarray  # int32 term ids
    starts: np.ndarray  # int64, len(terms) + 1
    slots: np.ndarray  # int32, the posting's text
    shapes: np.ndarray  # the posting's shape number (its tf and its text's length)
    docs: np.ndarray  # int32: the slots of its texts, those without terms included

    def postings(self, query_terms: np.ndarray) -> Iterator[tuple[int, Postings]]:
        """(index into query_terms, postings) of each query term it holds, dead postings included."""
        at = np.searchsorted(self.terms, query_terms)
        found = np.flatnonzero(at < len(self.terms))
        found = found[self.terms[at[found]] == query_terms[found]]
        starts, ends = self.starts[at[found]].tolist(), self.starts[at[found] + 1].tolist()
        for i, begin, end in zip(found.tolist(), starts, ends, strict=True):
            yield i, (self.slots[begin:end], self.shapes[begin:end])

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.terms, self.starts, self.slots, self.shapes, self.docs))


def _segment(id: int, term_of: np.ndarray, slots: np.ndarray, shapes: np.ndarray, docs: np.ndarray) -> _Segment:
    """A segment of postings given with their term, terms ascending."""
    heads = np.flatnonzero(np.diff(term_of)) + 1
    if len(term_of):
        heads = np.concatenate(([0], heads))
    starts = np.concatenate((heads, [len(term_of)])).astype(np.int64)
    return _Segment(
        id, term_of[heads].astype(np.int32), starts, slots.astype(np.int32), _narrow(shapes), docs.astype(np.int32)
    )


class _Memtable:
    """The texts added since the last flush, by local number: postings appended to per-term Python lists, each
    posting one int (local number << 32 | shape: one append per posting keeps an add cheap)."""

    def __init__(self, id: int) -> None:
        self.id = id
        self.slots = np.zeros(FLUSH_TEXTS, dtype=np.int32)  # local number -> slot
        self.alive = np.zeros(FLUSH_TEXTS, dtype=bool)  # false once removed or replaced
        self.texts = 0
        self.postings = 0
        self._local: dict[int, int] = {}  # slot -> local number of its current text
        self._terms: defaultdict[int, list[int]] = defaultdict(list)  # term id -> packed postings

    def full(self) -> bool:
        return self.texts == FLUSH_TEXTS or self.postings >= FLUSH_POSTINGS

    def add(self, slot: int, postings: Iterable[tuple[int, int]]) -> None:
        """The text at `slot`, as its (term id, shape) postings."""
        local = self.texts
        self.slots[local], self.alive[local] = slot, True
        self._local[slot] = local
        self.texts += 1
        packed = local << 32
        for term, shape in postings:
            self._terms[term].append(packed | shape)
            self.postings += 1

    def drop(self, slot: int) -> None:
        self.alive[self._local.pop(slot)] = False

    def terms(self) -> np.ndarray:
        return np.fromiter(self._terms, np.int32, len(self._terms))

    def renumber(self, renumbered: np.ndarray) -> None:
        self._terms = defaultdict(list, zip(renumbered[self.terms()].tolist(), self._terms.values(), strict=True))

    def postings_of(self, query_terms: np.ndarray) -> Iterator[tuple[int, Postings]]:
        """(index into query_terms, live postings) of each query term it holds."""
        for i, term in enumerate(query_terms.tolist()):
            if term in self._terms:
                packed = np.array(self._terms[term], dtype=np.int64)
                locals_ = packed >> 32
                keep = self.alive[locals_]
                yield i, (self.slots[locals_[keep]], (packed & 0xFFFFFFFF)[keep])

    def frozen(self) -> _Segment:
        """Its live texts as a segment of the same id."""
        terms = sorted(self._terms)
        counts = np.fromiter((len(self._terms[t]) for t in terms), np.int64, len(terms))
        packed = np.fromiter(chain.from_iterable(self._terms[t] for t in terms), np.int64, int(counts.sum()))
        keep = self.alive[packed >> 32]
        term_of = np.repeat(np.array(terms, dtype=np.int32), counts)[keep]
        packed = packed[keep]
        docs = self.slots[: self.texts][self.alive[: self.texts]]
        return _segment(self.id, term_of, self.slots[packed >> 32], packed & 0xFFFFFFFF, docs)

    def nbytes(self) -> int:
        return self.slots.nbytes + self.alive.nbytes + self.postings * _MEMTABLE_POSTING_BYTES


class Merge:
    """One merge of segments into one, dropping the postings of removed and replaced texts. `Lexical.start_merge`
    picks it (under the caller's lock); `run` computes it without the lock (it reads only immutable segments and
    which texts they still hold, which for these segments only ever goes away); `Lexical.finish_merge` installs it,
    or `Lexical.cancel_merge` gives its segments back when the run failed."""

    def __init__(self, lexical: Lexical, segments: list[_Segment], id: int) -> None:
        self._lexical = lexical
        self.segments = segments
        self.id = id
        self.result: _Segment | None = None

    def run(self) -> None:
        owner = self._lexical._owner
        pieces = []
        for s in self.segments:
            keep = owner[s.slots] == s.id
            term_of = np.repeat(s.terms, np.diff(s.starts))
            pieces.append((term_of[keep], s.slots[keep], s.shapes[keep], s.docs[owner[s.docs] == s.id]))
        term_of, slots, shapes, docs = (np.concatenate(p) for p in zip(*pieces, strict=True))
        order = np.argsort(term_of, kind="stable")  # one sorted run per segment: timsort merges them
        self.result = _segment(self.id, term_of[order], slots[order], shapes[order], docs)


class Lexical:
    """BM25 over texts addressed by integer slots (non-negative ints chosen by the caller, roughly dense: 0..n);
    add and remove cost what they change. Scores equal bm25s's built afresh on the live texts: the number of
    texts, their average length and each term's document frequency are the live texts' at query time.

    A posting's weight depends on the collection only through the number of texts and their average length, and
    on the posting only through its shape: its term count and its text's length. Distinct shapes are few (a few
    thousand for chunks of up to a few hundred terms), so a posting stores its shape's number, and a search
    weighs each shape once.

    Not thread-safe: the caller serialises calls with a lock (Merge.run excepted)."""

    def __init__(self, language: str) -> None:
        check_language(language)
        self.language = language
        self._words: list[str] = []  # term id -> term
        self._ids: dict[str, int] = {}
        self._shape_tfs: list[int] = []  # shape number -> term count
        self._shape_lengths: list[int] = []  # shape number -> text length
        self._shape_columns = np.zeros((2, 0))  # the two lists above as float64 rows, extended as shapes are added
        self._shapes: dict[int, int] = {}  # length << 32 | tf -> shape number
        self._weights = np.zeros(0)  # shape number -> its BM25 weight, idf aside
        self._weighed: tuple[int, int, int] = (0, 0, 0)  # (texts, total length, shapes) `_weights` is for
        self._owner = np.zeros(0, dtype=np.int32)  # slot -> id of the segment or memtable holding its text, or -1
        self._text_lengths = np.zeros(0, dtype=np.int32)  # slot -> its text's terms (BM25's document length)
        self._distinct = np.zeros(0, dtype=np.int32)  # slot -> its text's distinct terms (its postings)
        self._end = 0  # past the highest slot ever added
        self._live = 0
        self._total_length = 0
        self._segments: list[_Segment] = []  # oldest first
        self._dead: dict[int, int] = {}  # segment id -> its postings of texts removed or replaced since
        self._merging: set[int] = set()  # ids of the segments that started merges hold
        self._next_id = 1
        self._memtable = _Memtable(0)
        self._dropped = 0  # postings merges dropped since the vocabulary was last checked

    @classmethod
    def build(cls, texts: list[str], language: str) -> Lexical:
        """Texts at slots 0..n-1, merged as far as the tiers ask."""
        lexical = cls(language)
        lexical.add(range(len(texts)), texts)
        while lexical.merge():
            pass
        return lexical

    def __len__(self) -> int:
        return self._live

    @property
    def segments(self) -> int:
        """Immutable segments (the memtable not counted)."""
        return len(self._segments)

    @property
    def dead_postings(self) -> int:
        """Postings of removed or replaced texts that segments hold until a merge drops them."""
        return sum(self._dead.values())

    def nbytes(self) -> int:
        """Estimated resident bytes."""
        slots = self._owner.nbytes + self._text_lengths.nbytes + self._distinct.nbytes
        return (
            slots
            + sum(s.nbytes() for s in self._segments)
            + self._memtable.nbytes()
            + len(self._words) * _TERM_BYTES
            + len(self._shape_tfs) * _SHAPE_BYTES
        )

    # ---- writes ------------------------------------------------------------------------------------------

    def add(self, slots: Sequence[int], texts: Sequence[str]) -> None:
        """Index `texts[i]` at `slots[i]`; a slot already present is replaced."""
        if len(slots) != len(texts):
            raise ValueError(f"{len(slots)} slots for {len(texts)} texts")
        slots = [operator.index(s) for s in slots]
        if not slots:
            return
        if min(slots) < 0:
            raise ValueError("slots must be non-negative")
        self._reserve(max(slots) + 1)
        self._end = max(self._end, max(slots) + 1)
        for slot, words in zip(slots, terms(list(texts), self.language), strict=True):
            self._drop(slot)
            self._add(slot, words)
            if self._memtable.full():
                self._flush()
        self._merge_inline()

    def _add(self, slot: int, words: list[str]) -> None:
        counts = Counter(words)
        for word in [w for w in counts if w not in self._ids]:
            self._ids[word] = len(self._words)
            self._words.append(word)
        shapes = {tf: self._shape(tf, len(words)) for tf in set(counts.values())}
        self._memtable.add(slot, ((self._ids[word], shapes[tf]) for word, tf in counts.items()))
        self._owner[slot] = self._memtable.id
        self._text_lengths[slot], self._distinct[slot] = len(words), len(counts)
        self._live += 1
        self._total_length += len(words)

    def _shape(self, tf: int, length: int) -> int:
        key = length << 32 | tf
        found = self._shapes.get(key)
        if found is None:
            found = self._shapes[key] = len(self._shape_tfs)
            self._shape_tfs.append(tf)
            self._shape_lengths.append(length)
        return found

    def remove(self, slots: Iterable[int]) -> None:
        """Remove the texts at `slots`; absent slots are ignored."""
        for slot in slots:
            self._drop(operator.index(slot))
        self._merge_inline()

    def _reserve(self, slots: int) -> None:
        if slots > len(self._owner):
            more = max(slots, 2 * len(self._owner)) - len(self._owner)
            self._owner = np.concatenate((self._owner, np.full(more, -1, dtype=np.int32)))
            self._text_lengths = np.concatenate((self._text_lengths, np.zeros(more, dtype=np.int32)))
            self._distinct = np.concatenate((self._distinct, np.zeros(more, dtype=np.int32)))

    def _drop(self, slot: int) -> None:
        holder = int(self._owner[slot]) if 0 <= slot < len(self._owner) else -1
        if holder < 0:
            return
        if holder == self._memtable.id:
            self._memtable.drop(slot)
        else:
            self._dead[holder] += int(self._distinct[slot])
        self._owner[slot] = -1
        self._live -= 1
        self._total_length -= int(self._text_lengths[slot])

    def _flush(self) -> None:
        segment = self._memtable.frozen()
        self._memtable = _Memtable(self._new_id())
        if len(segment.docs):
            self._segments.append(segment)
            self._dead[segment.id] = 0

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # ---- merges ------------------------------------------------------------------------------------------

    def needs_merge(self) -> bool:
        """Whether merge() has work: a tier is full, or a segment mostly dead."""
        return bool(self._due())

    def merge(self) -> bool:
        """One merge step, whatever its size (up to seconds at millions of postings); returns whether anything was
        merged. To hold the caller's lock only briefly: start_merge, then Merge.run unlocked, then finish_merge (or
        cancel_merge if the run failed)."""
        merge = self.start_merge()
        if merge is None:
            return False
        self._run(merge)
        return True

    def start_merge(self, max_postings: int | None = None) -> Merge | None:
        """The next due merge (of at most `max_postings` postings), its segments reserved to it; None if none."""
        for group in self._due():
            if max_postings is None or sum(len(s.slots) for s in group) <= max_postings:
                self._merging.update(s.id for s in group)
                return Merge(self, group, self._new_id())
        return None

    def finish_merge(self, merge: Merge) -> None:
        """Installs a merge that ran: the result replaces its segments (texts removed or replaced meanwhile stay
        dead in it)."""
        if merge.result is None:
            raise ValueError("the merge has not run")
        merged = {s.id for s in merge.segments}
        self._dropped += sum(len(s.slots) for s in merge.segments) - len(merge.result.slots)
        held = np.isin(self._owner[merge.result.docs], list(merged))
        result = replace(merge.result, docs=merge.result.docs[held])
        self._owner[result.docs] = result.id
        at = min(i for i, s in enumerate(self._segments) if s.id in merged)
        kept = [s for s in self._segments if s.id not in merged]
        if len(result.docs):
            kept.insert(at, result)
            self._dead[result.id] = 0 if held.all() else int(np.count_nonzero(self._owner[result.slots] != result.id))
        self._segments = kept
        for id in merged:
            del self._dead[id]
        self._merging -= merged
        self._compact_vocabulary()

    def _compact_vocabulary(self) -> None:
        """Renumbers the terms that postings hold, dropping the others (those of texts removed and merged away)
        when they are over half the vocabulary. Never while a merge runs: its postings carry the old numbers."""
        held = sum(len(s.slots) for s in self._segments)
        if self._merging or len(self._words) < VOCABULARY_FLOOR or self._dropped < held:
            return
        self._dropped = 0
        used = np.unique(np.concatenate([s.terms for s in self._segments] + [self._memtable.terms()]))
        if 2 * len(used) > len(self._words):
            return
        renumbered = np.full(len(self._words), -1, dtype=np.int32)
        renumbered[used] = np.arange(len(used), dtype=np.int32)  # increasing: segments' terms stay sorted
        self._segments = [replace(s, terms=renumbered[s.terms]) for s in self._segments]
        self._memtable.renumber(renumbered)
        self._words = [self._words[i] for i in used.tolist()]
        self._ids = {word: i for i, word in enumerate(self._words)}

    def cancel_merge(self, merge: Merge) -> None:
        """Releases the segments of a started merge that will not be finished (its run failed)."""
        self._merging -= {s.id for s in merge.segments}

    def _run(self, merge: Merge) -> None:
        try:
            merge.run()
        except BaseException:
            self.cancel_merge(merge)
            raise
        self.finish_merge(merge)

    def _merge_inline(self) -> None:
        while (merge := self.start_merge(INLINE_MERGE_POSTINGS)) is not None:
            self._run(merge)

    def _due(self) -> list[list[_Segment]]:
        """The merges MERGE_POLICY finds due among the segments no merge holds, cheapest kind first."""
        idle = {s.id: s for s in self._segments if s.id not in self._merging}
        sizes = [SegmentSize(s.id, len(s.slots), self._dead[s.id]) for s in idle.values()]
        return [[idle[i] for i in group] for group in MERGE_POLICY.due(sizes)]

    # ---- search ------------------------------------------------------------------------------------------

    def top(self, query: str, count: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """Up to `count` (slot, score) pairs, best first (ties: slot ascending); only texts sharing a term with
        the query, and only `allowed` slots (ascending) when given (the collection's statistics stay the whole
        index's). Query terms that repeat count each time, as in bm25s."""
        slots, scores = self.top_arrays(query, count, allowed)
        return list(zip(slots.tolist(), scores.tolist(), strict=True))

    def top_arrays(self, query: str, count: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`top` as two arrays: the slots (intp) and their scores (float64), best first."""
        nothing = (np.zeros(0, dtype=np.intp), np.zeros(0))
        if count <= 0 or not self._live:
            return nothing
        repeats = Counter(self._ids[word] for word in terms([query], self.language)[0] if word in self._ids)
        if not repeats:
            return nothing  # blank, stopword-only or out-of-vocabulary query: no lexical evidence
        postings = self._postings(np.fromiter(repeats, np.int32, len(repeats)))
        df = np.array([sum(len(slots) for slots, _ in pieces) for pieces in postings])
        if not df.any():
            return nothing
        idf = np.log1p((self._live - df + 0.5) / (df + 0.5))
        factors = np.fromiter(repeats.values(), np.float64, len(repeats)) * idf
        # Every posting's weight summed in one pass (a numpy call per term and segment costs more than the
        # arithmetic), in float64: bincount's fast path (bm25s's float32 sums differ in the last float32 digit).
        pieces = [piece for term_pieces in postings for piece in term_pieces]
        slots = np.concatenate([piece[0] for piece in pieces], dtype=np.intp)
        contributions = self._shape_weights().take(np.concatenate([piece[1] for piece in pieces])) * np.repeat(
            factors, df
        )
        scores = np.bincount(slots, contributions, minlength=self._end)
        if allowed is not None:  # ascending, so a tie between kept scores still goes to the lower slot
            kept = scores[allowed]
            best = _highest(kept, count)
            return allowed[best].astype(np.intp), kept[best]
        best = _highest(scores, count)
        return best, scores[best]

    def _postings(self, query_terms: np.ndarray) -> list[list[Postings]]:
        """Each query term's live postings, in pieces: one from each segment and the memtable holding the term."""
        pieces: list[list[Postings]] = [[] for _ in range(len(query_terms))]
        for segment in self._segments:
            dead = self._dead[segment.id] > 0
            for i, (slots, shapes) in segment.postings(query_terms):
                if dead:
                    keep = self._owner[slots] == segment.id
                    slots, shapes = slots[keep], shapes[keep]
                pieces[i].append((slots, shapes))
        for i, postings in self._memtable.postings_of(query_terms):
            pieces[i].append(postings)
        return pieces

    def _shape_weights(self) -> np.ndarray:
        """Each shape's tf / (tf + k1 (1 - b + b length / average length)), for the live texts' average."""
        weighed = (self._live, self._total_length, len(self._shape_tfs))
        if weighed != self._weighed:
            tfs, lengths = self._shape_table()
            average = self._total_length / self._live
            self._weights = tfs / (tfs + K1 * (1 - B + B * lengths / average))
            self._weighed = weighed
        return self._weights

    def _shape_table(self) -> np.ndarray:
        """Each shape's term count and text length as float64 rows. Only shapes added since the last call are
        converted: weights are recomputed after every write, and converting thousands of shapes then cost more
        than the search."""
        known = self._shape_columns.shape[1]
        if known < len(self._shape_tfs):
            added = np.array([self._shape_tfs[known:], self._shape_lengths[known:]], dtype=np.float64)
            self._shape_columns = np.concatenate((self._shape_columns, added), axis=1)
        return self._shape_columns

    # ---- persistence -------------------------------------------------------------------------------------

    def save(self, folder: Path) -> None:
        """Writes the index into `folder` (created if missing), the memtable as one more segment: numpy arrays
        (the segments' concatenated, the per-slot ones, the shapes) and two small JSON files."""
        folder.mkdir(parents=True, exist_ok=True)
        segments = [s for s in (*self._segments, self._memtable.frozen()) if len(s.docs)]
        for name, dtype in _SEGMENT_ARRAYS.items():
            _write_array(
                folder / f"{name}.npy",
                np.concatenate([getattr(s, name) for s in segments] or [np.zeros(0, dtype=dtype)]).astype(dtype),
            )
        for name in _SLOT_ARRAYS:
            _write_array(folder / f"{name}.npy", getattr(self, f"_{name}"))
        for name, dtype in _SHAPE_ARRAYS.items():
            _write_array(folder / f"{name}.npy", np.array(getattr(self, f"_{name}"), dtype=dtype))
        _write_json(folder / _VOCABULARY, self._words)
        _write_json(
            folder / _META,
            {
                "format": _FORMAT,
                "language": self.language,
                "next_id": self._next_id,
                "segments": [[s.id, len(s.terms), len(s.slots), len(s.docs)] for s in segments],
                # Each segment's postings of texts removed or replaced since, so a load need not find them by
                # reading every posting (0.1 to 0.25 s at 100k texts). The memtable's frozen segment has none.
                "dead": [self._dead.get(s.id, 0) for s in segments],
            },
        )

    @classmethod
    def load(cls, folder: Path, language: str) -> Lexical:
        """The index `save` wrote; ValueError (or numpy's and json's errors) when its files are damaged."""
        meta = json.loads((folder / _META).read_text(encoding="utf-8"))
        _expect(meta.get("format") == _FORMAT, f"format {meta.get('format')!r}, expected {_FORMAT}")
        _expect(meta.get("language") == language, f"analysed as {meta.get('language')!r}, expected {language!r}")
        lexical = cls(language)
        lexical._load_vocabulary(json.loads((folder / _VOCABULARY).read_text(encoding="utf-8")))
        lexical._load_shapes(*(_read_array(folder, name, dtype) for name, dtype in _SHAPE_ARRAYS.items()))
        for name, dtype in _SLOT_ARRAYS.items():
            setattr(lexical, f"_{name}", _read_array(folder, name, dtype))
        _expect(
            len(lexical._owner) == len(lexical._text_lengths) == len(lexical._distinct), "slot arrays differ in length"
        )
        _expect(
            bool(np.all(lexical._text_lengths >= lexical._distinct) and np.all(lexical._distinct >= 0)),
            "text lengths out of range",
        )
        table = np.array(meta["segments"], dtype=np.int64).reshape(-1, 4)
        arrays = {name: _read_array(folder, name, dtype) for name, dtype in _SEGMENT_ARRAYS.items()}
        lexical._segments = _split(arrays, table, len(lexical._words), len(lexical._owner), len(lexical._shape_tfs))
        lexical._next_id = int(meta["next_id"])
        _expect(lexical._next_id > int(table[:, 0].max(initial=-1)), "segment ids run past next_id")
        lexical._memtable = _Memtable(lexical._new_id())
        dead = meta.get("dead")
        _expect(dead is None or (isinstance(dead, list) and len(dead) == len(table)), "dead postings per segment")
        lexical._count_live(dead)
        return lexical

    def _load_vocabulary(self, words: object) -> None:
        # Types taken and ids paired in C (map, zip): a loop in Python over 100k terms cost a tenth of a load.
        _expect(isinstance(words, list) and set(map(type, words)) <= {str}, "vocabulary is not a list of terms")
        vocabulary = cast(list[str], words)  # checked just above
        self._words, self._ids = vocabulary, dict(zip(vocabulary, range(len(vocabulary)), strict=True))
        _expect(len(self._ids) == len(vocabulary), "vocabulary repeats a term")

    def _load_shapes(self, tfs: np.ndarray, lengths: np.ndarray) -> None:
        _expect(
            len(tfs) == len(lengths) and bool(np.all((tfs >= 1) & (tfs <= lengths) & (lengths < 1 << 31))),
            "shapes out of range",
        )
        self._shape_tfs, self._shape_lengths = tfs.tolist(), lengths.tolist()
        pairs = zip(self._shape_tfs, self._shape_lengths, strict=True)
        self._shapes = {length << 32 | tf: i for i, (tf, length) in enumerate(pairs)}
        _expect(len(self._shapes) == len(tfs), "shapes repeat")

    def _count_live(self, dead_postings: list[int] | None) -> None:
        """Live texts, their total length and each segment's dead postings, from the slots' owners; checks that
        each live text is in the segment its owner names. `dead_postings`: the segments' as saved (the files'
        checksums vouch for them); None (saved before they were): counted from every posting, which checks each
        posting against its text's length on the way."""
        live = self._owner >= 0
        ids = np.array([s.id for s in self._segments], dtype=np.int32)
        _expect(
            bool(np.all(np.isin(self._owner[live], ids)) and np.all(self._owner >= -1)), "a slot's owner is unknown"
        )
        owned = np.concatenate([s.docs[self._owner[s.docs] == s.id] for s in self._segments] or [np.zeros(0, np.int32)])
        # Counted, not sorted (np.unique): each slot at most once.
        once = np.bincount(owned, minlength=len(self._owner)).max(initial=0) <= 1
        _expect(bool(once) and len(owned) == np.count_nonzero(live), "live texts and segments disagree")
        self._live, self._total_length = int(np.count_nonzero(live)), int(self._text_lengths[live].sum())
        self._end = int(np.flatnonzero(live).max(initial=-1)) + 1
        if dead_postings is not None:
            pairs = list(zip(self._segments, dead_postings, strict=True))
            _expect(all(type(d) is int and 0 <= d <= len(s.slots) for s, d in pairs), "dead postings out of range")
            self._dead = {s.id: d for s, d in pairs}
            return
        lengths = np.array(self._shape_lengths, dtype=np.int64)  # checked below 2**31 by _load_shapes
        # Each slot's owner and text length as one int64 (owner high, length low): a posting's owner and length
        # come in one gather over the postings, not two (those gathers were most of a 100k load's checks).
        owned_lengths = (self._owner.astype(np.int64) << 32) | self._text_lengths
        for s in self._segments:
            found = owned_lengths.take(s.slots)
            matches = found == ((s.id << 32) | lengths.take(s.shapes))
            dead = 0
            if not matches.all():  # postings of texts removed or replaced since (or damage)
                held = (found >> 32) == s.id
                dead = len(held) - int(np.count_nonzero(held))
                _expect(bool(matches[held].all()), f"segment {s.id}: postings disagree with their texts' lengths")
            self._dead[s.id] = dead


def _highest(scores: np.ndarray, count: int) -> np.ndarray:
    """The positions of the `count` highest positive scores, best first (ties: position ascending). A threshold
    taken from a sample of about _SAMPLED_PER_RESULT scores a result keeps the exact selection to the few scores
    above it (selecting among every score costs a millisecond at 100k texts); where fewer than `count` pass it,
    every positive score competes."""
    step = len(scores) // (_SAMPLED_PER_RESULT * count)
    passing = np.zeros(0, dtype=np.intp)
    if step > 1:
        sample = scores[::step]
        rank = -(-_EXPECTED_SHARE * count // step)  # sampled scores above the threshold, about that share passing
        threshold = np.partition(sample, len(sample) - rank)[len(sample) - rank]
        if threshold > 0:
            passing = np.flatnonzero(scores >= threshold)
    if len(passing) < count:
        passing = np.flatnonzero(scores)
    negated = np.negative(scores[passing])
    if len(passing) > count:
        # Everything better than the count-th score, then the first positions of those equal to it.
        last = np.partition(negated, count - 1)[count - 1]
        better = np.flatnonzero(negated < last)
        kept = np.concatenate((better, np.flatnonzero(negated == last)[: count - len(better)]))
        passing, negated = passing[kept], negated[kept]
    return passing[np.lexsort((passing, negated))]


def _split(arrays: dict[str, np.ndarray], table: np.ndarray, terms: int, slots: int, shapes: int) -> list[_Segment]:
    """The saved segments (table rows: id, terms, postings, texts), each checked."""
    sizes = {
        "terms": table[:, 1],
        "starts": table[:, 1] + 1,
        "slots": table[:, 2],
        "shapes": table[:, 2],
        "docs": table[:, 3],
    }
    bounds = {}
    for name, size in sizes.items():
        _expect(bool(np.all(size >= 0)) and int(size.sum()) == len(arrays[name]), f"{name}.npy holds the wrong count")
        bounds[name] = np.concatenate(([0], np.cumsum(size)))
    _expect(len(np.unique(table[:, 0])) == len(table) and bool(np.all(table[:, 0] >= 0)), "segment ids repeat")
    segments = []
    # Segments are copied out of the saved arrays, so a merge frees what it merged; a lone segment is the arrays
    # whole (after a merge, the usual case): no copy. Shapes are narrowed into a copy anyway.
    copied = len(table) > 1
    for i, row in enumerate(table):
        parts = {name: arrays[name][bounds[name][i] : bounds[name][i + 1]] for name in _SEGMENT_ARRAYS}
        parts = {name: part.copy() if copied and name != "shapes" else part for name, part in parts.items()}
        s = _Segment(int(row[0]), **{**parts, "shapes": _narrow(parts["shapes"])})
        _expect(
            s.starts[0] == 0 and s.starts[-1] == len(s.slots) and bool(np.all(np.diff(s.starts) > 0)),
            f"segment {s.id}: postings offsets out of order",
        )
        _expect(
            bool(np.all(np.diff(s.terms) > 0)) and _within(s.terms, terms),
            f"segment {s.id}: terms out of order or range",
        )
        _expect(
            _within(s.slots, slots) and _within(s.docs, slots),
            f"segment {s.id}: slots out of range",
        )
        _expect(_within(s.shapes, shapes), f"segment {s.id}: shapes out of range")
        segments.append(s)
    return segments


def _within(values: np.ndarray, end: int) -> bool:
    """Every value in 0..end-1: two reductions, no temporary the size of `values` (postings run to millions)."""
    return not len(values) or (int(values.min()) >= 0 and int(values.max()) < end)


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise ValueError(f"damaged lexical index: {problem}")


def _write_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


def _read_array(folder: Path, name: str, dtype: type) -> np.ndarray:
    array = np.load(folder / f"{name}.npy", allow_pickle=False)
    _expect(array.ndim == 1 and array.dtype == dtype, f"{name}.npy is {array.dtype} {array.shape}")
    return array


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
