"""Feature extraction for the length model (pure functions, no I/O).

Who owns what: callers (the in-process :class:`~jitserve.analyzer.qrf.QRFEstimator`, the
gRPC service) hand over what a request says about itself — prompt length, application
tag, model, SLO kind and, when known, the prompt text. This module turns it into a
fixed-width ``float32`` row; :mod:`jitserve.analyzer.qrf_model` owns the forests that read it.

Two views:
- the *meta* view (prompt length, app, model, SLO kind) is all a simulated request has;
- the *text* view adds cheap text features: hashed word unigrams and bigrams of the
  instruction (the first and last :data:`EDGE_WORDS` words, so cost does not grow with
  a long pasted document), word count, question marks and the largest number mentioned
  ("list 10 ...", "in 500 words").

Categorical vocabularies (apps, models) are learned from training data and stored with
the model (:class:`FeatureSpace`); an unseen value maps to the ``other`` app / model
code ``-1`` so an unknown tag degrades to the corpus-wide distribution.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]

OTHER_APP = "other"
SLO_KINDS: tuple[str, ...] = ("latency", "deadline", "compound", "best_effort")
HASH_BUCKETS = 64
EDGE_WORDS = 48
TEXT_SCALARS = 3
"""log2 word count, question marks (capped), log1p of the largest number."""
MAX_NUMBER = 100_000

_WORD = re.compile(r"[a-z0-9']+")


@dataclass(frozen=True, slots=True)
class FeatureSpace:
    """The categorical vocabularies a model was trained with."""

    apps: tuple[str, ...]
    """Known application tags; always ends with :data:`OTHER_APP`."""
    models: tuple[str, ...]

    @staticmethod
    def build(apps: Iterable[str], models: Iterable[str]) -> FeatureSpace:
        known = sorted({a for a in apps if a != OTHER_APP})
        return FeatureSpace(apps=(*known, OTHER_APP), models=tuple(sorted(set(models))))

    @property
    def meta_width(self) -> int:
        return 2 + len(self.apps) + len(SLO_KINDS)

    @property
    def text_width(self) -> int:
        return self.meta_width + TEXT_SCALARS + HASH_BUCKETS

    def app_index(self, app: str) -> int:
        try:
            return self.apps.index(app)
        except ValueError:
            return len(self.apps) - 1

    def model_code(self, model: str) -> float:
        try:
            return float(self.models.index(model))
        except ValueError:
            return -1.0


def meta_row(space: FeatureSpace, prompt_tokens: int, app: str, model: str,
             slo_kind: str, out: FloatArray | None = None) -> FloatArray:
    """The meta view of one request (``out`` is filled in place when given)."""
    row = np.zeros(space.meta_width, dtype=np.float32) if out is None else out
    row[0] = math.log2(max(1, prompt_tokens))
    row[1] = space.model_code(model)
    row[2 + space.app_index(app)] = 1.0
    if slo_kind in SLO_KINDS:
        row[2 + len(space.apps) + SLO_KINDS.index(slo_kind)] = 1.0
    return row


def words(text: str) -> list[str]:
    """Lower-cased words of the instruction part of ``text`` (head and tail)."""
    found = _WORD.findall(text.lower())
    if len(found) <= 2 * EDGE_WORDS:
        return found
    return found[:EDGE_WORDS] + found[-EDGE_WORDS:]


_WORD_HASH: dict[str, int] = {}
_WORD_HASH_MAX = 200_000


def word_hash(word: str) -> int:
    """CRC-32 of a word (memoised; deterministic across processes, unlike ``hash``)."""
    value = _WORD_HASH.get(word)
    if value is None:
        if len(_WORD_HASH) >= _WORD_HASH_MAX:
            _WORD_HASH.clear()
        value = _WORD_HASH[word] = zlib.crc32(word.encode())
    return value


def hashed_ngrams(ws: Sequence[str]) -> set[int]:
    """Buckets of the unigrams and bigrams of ``ws`` (the hashing trick)."""
    buckets = set()
    previous = -1
    for w in ws:
        h = word_hash(w)
        buckets.add(h % HASH_BUCKETS)
        if previous >= 0:
            buckets.add(((previous * 1_000_003) ^ h) % HASH_BUCKETS)
        previous = h
    return buckets


def text_part(text: str, out: FloatArray | None = None) -> FloatArray:
    """Text scalars and hashed n-gram presence (:data:`TEXT_SCALARS` + buckets)."""
    part = np.zeros(TEXT_SCALARS + HASH_BUCKETS, dtype=np.float32) if out is None else out
    ws = words(text)
    total_words = len(_WORD.findall(text)) if len(ws) >= 2 * EDGE_WORDS else len(ws)
    part[0] = math.log2(1 + total_words)
    part[1] = min(text.count("?"), 8)
    numbers = [int(w) for w in ws if w.isdigit() and len(w) <= 6]
    part[2] = math.log1p(min(max(numbers), MAX_NUMBER)) if numbers else 0.0
    part[[TEXT_SCALARS + b for b in hashed_ngrams(ws)]] = 1.0
    return part


def text_row(space: FeatureSpace, prompt_tokens: int, app: str, model: str, slo_kind: str,
             text: str) -> FloatArray:
    """The text view of one request: meta row followed by the text part."""
    row = np.zeros(space.text_width, dtype=np.float32)
    meta_row(space, prompt_tokens, app, model, slo_kind, out=row[: space.meta_width])
    text_part(text, out=row[space.meta_width:])
    return row


def meta_matrix(space: FeatureSpace, prompt_tokens: Sequence[int], apps: Sequence[str],
                models: Sequence[str], slo_kinds: Sequence[str]) -> FloatArray:
    matrix = np.zeros((len(prompt_tokens), space.meta_width), dtype=np.float32)
    for i, (p, a, m, k) in enumerate(zip(prompt_tokens, apps, models, slo_kinds, strict=True)):
        meta_row(space, p, a, m, k, out=matrix[i])
    return matrix


def text_matrix(space: FeatureSpace, prompt_tokens: Sequence[int], apps: Sequence[str],
                models: Sequence[str], slo_kinds: Sequence[str],
                texts: Sequence[str]) -> FloatArray:
    matrix = np.zeros((len(prompt_tokens), space.text_width), dtype=np.float32)
    width = space.meta_width
    for i, (p, a, m, k, t) in enumerate(
        zip(prompt_tokens, apps, models, slo_kinds, texts, strict=True)
    ):
        meta_row(space, p, a, m, k, out=matrix[i, :width])
        text_part(t, out=matrix[i, width:])
    return matrix
