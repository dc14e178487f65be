"""The oracle for deep search: search with the question, answer with the gold answer if found.

It uses the golden answers (so it is an upper bound on what retrieval allows, not an agent): it
sends ``<search>question</search>``, and if a retrieved passage contains a golden answer
(normalised, whole tokens) it answers with that answer; otherwise it answers "unknown". Its
success rate is the retrieval success rate of BM25 top-k for the question text.
"""

from __future__ import annotations

from typing import Sequence

from environments.deepsearch.scoring import contains_answer


class DeepSearchOracle:
    """Two turns per episode: search, then answer."""

    def __init__(self, question: str, golden_answers: Sequence[str]) -> None:
        self.question = question
        self.golden_answers = list(golden_answers)
        self.searched = False

    def act(self, observation: str) -> str:
        if not self.searched:
            self.searched = True
            return f"<search>{self.question}</search>"
        for answer in self.golden_answers:
            if contains_answer(observation, [answer]):
                return f"<answer>{answer}</answer>"
        return "<answer>unknown</answer>"


class DeepSearchExpertPolicy:
    """The deep-search oracle for the task's question, from this process's search backend (the
    default corpus and QA set, as the server's; built on first use, in seconds; not
    interruptible)."""

    interruptible = False

    def __init__(self, task_id: str):
        from environments.deepsearch.backend import get_backend

        item = get_backend().question(task_id)
        self.oracle = DeepSearchOracle(item.question, item.golden_answers)

    def act(self, observation: str) -> str | None:
        return self.oracle.act(observation)
