"""Answer scoring as in SQuAD / Search-R1: normalised exact match and token F1."""

from __future__ import annotations

import collections
import re
import string
from typing import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golden_answers: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised golden answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golden_answers))


def f1_score(prediction: str, golden_answers: Iterable[str]) -> float:
    """The best token-level F1 between the prediction and a golden answer."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for golden in golden_answers:
        gold_tokens = normalize_answer(golden).split()
        common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision = overlap / len(pred_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def contains_answer(passage: str, golden_answers: Iterable[str]) -> bool:
    """True when a normalised golden answer occurs in the normalised passage (as whole tokens)."""
    text = f" {normalize_answer(passage)} "
    return any(f" {normalize_answer(g)} " in text for g in golden_answers if normalize_answer(g))
