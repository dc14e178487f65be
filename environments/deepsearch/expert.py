"""The oracles for deep search (the families' experts for behaviour cloning).

Both use the golden answers, so they measure what retrieval allows, not an agent's skill.

* ``DeepSearchOracle`` (the ``lookup`` task set, and user QA files): sends
  ``<search>question</search>`` and answers with a golden answer that a retrieved passage
  contains (normalised, whole tokens), else "unknown". Two turns; its success rate is BM25's
  top-k retrieval rate for the question text.
* ``SearchingOracle`` (the ``search`` task set): follows the question's path of articles
  (``QAItem.path``) with real searches and reads each result: it searches the description that
  names article A in the question (A's title when that search does not return A), then, for a
  two-hop question, the title of the article B that A's text names, and answers with the golden
  answer found in the last result (else "unknown"). Three to four turns for a two-hop question,
  two to three for a fact.
* ``listed_oracle_solves`` (coverage of the listed actions, ``admissible.py``): whether an oracle
  restricted to the listed actions can answer a question correctly: each turn it answers with a
  listed correct answer when there is one, else takes a listed search that returns an unseen
  article of the question's path (the answer's article first), else a listed search after which
  one does (one detour), else gives up. A lower bound on what some sequence of listed actions
  reaches.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

from environments.deepsearch.corpus import Passage
from environments.deepsearch.qa import QAItem
from environments.deepsearch.scoring import contains_answer, exact_match

_RESULT_TITLE = re.compile(r"^Doc \d+ \(Title: (.*?)\) ", re.M)


def result_titles(observation: str) -> list[str]:
    """The titles of the passages in a search observation (``env.format_passages``)."""
    return _RESULT_TITLE.findall(observation)


def _answer(observation: str, golden_answers: Sequence[str]) -> str:
    for answer in golden_answers:
        if contains_answer(observation, [answer]):
            return f"<answer>{answer}</answer>"
    return "<answer>unknown</answer>"


class DeepSearchOracle:
    """Two turns per episode: search the question, then answer."""

    def __init__(self, question: str, golden_answers: Sequence[str]) -> None:
        self.question = question
        self.golden_answers = list(golden_answers)
        self.searched = False

    def act(self, observation: str) -> str:
        if not self.searched:
            self.searched = True
            return f"<search>{self.question}</search>"
        return _answer(observation, self.golden_answers)


class SearchingOracle:
    """Search A by its description (its title if that misses), then B's title (two-hop), then
    answer from the last result (module docstring). ``by_title``: the corpus's passages."""

    def __init__(self, item: QAItem, by_title: Mapping[str, Passage]) -> None:
        if not item.path or any(title not in by_title for title in item.path):
            raise ValueError(f"question {item.id!r} has no path of corpus articles to follow")
        self.item = item
        self.path = [by_title[title] for title in item.path]
        self.hop = 0  # the article on the path being looked for
        self.tried_title = False
        self.last_query: str | None = None

    def act(self, observation: str) -> str:
        if self.last_query is not None:
            if self.path[self.hop].title in result_titles(observation):
                self.hop, self.tried_title = self.hop + 1, False
            elif self.tried_title:  # neither the description nor the title finds it
                return _answer(observation, self.item.golden_answers)
            else:
                self.tried_title = True
                return self._search(self.path[self.hop].title)
        if self.hop == len(self.path):
            return _answer(observation, self.item.golden_answers)
        target = self.path[self.hop]
        if self.hop == 0 and target.description:
            return self._search(target.description)
        self.tried_title = True
        return self._search(target.title)

    def _search(self, query: str) -> str:
        self.last_query = query
        return f"<search>{query}</search>"


class DeepSearchExpertPolicy:
    """The ``deepsearch`` family's expert: ``SearchingOracle`` for the task's question (the
    ``DeepSearchOracle`` for a user question without a path), from this process's search
    backend (built on first use; not interruptible)."""

    interruptible = False
    task_set = "search"

    def __init__(self, task_id: str):
        from environments.deepsearch.backend import get_backend

        backend = get_backend(self.task_set)
        item = backend.question(task_id)
        if item.path and all(title in backend.by_title for title in item.path) and self.task_set == "search":
            self.oracle = SearchingOracle(item, backend.by_title)
        else:
            self.oracle = DeepSearchOracle(item.question, item.golden_answers)

    def act(self, observation: str) -> str | None:
        return self.oracle.act(observation)


class DeepSearchLookupExpertPolicy(DeepSearchExpertPolicy):
    """The ``deepsearch_lookup`` family's expert: ``DeepSearchOracle`` (search the question,
    answer)."""

    task_set = "lookup"



def listed_oracle_solves(question: str, golden_answers: Sequence[str], path: Sequence[str],
                         search: Callable[[str], Sequence[Passage]], max_turns: int,
                         trace: list[tuple[str, str]] | None = None) -> bool:
    """Whether the oracle restricted to the listed actions (``admissible.admissible_actions``)
    answers correctly within ``max_turns`` turns (module docstring). ``path``: the titles of
    the question's articles (the last holds the answer); ``search(query)``: the passages the
    environment returns for ``query`` (its retriever with its ``k``), asked ahead of a step (the
    oracle's privilege). Each turn, in order: a listed correct answer; else the first listed
    search that returns an unseen article of the path (the answer's article first); else the
    first listed search after which one does (one detour, looked ahead); else it gives up.
    ``trace``: when given, each action the oracle takes is appended to it, ``(tool,
    argument)`` a turn (the searches, then the correct answer when it finds one)."""
    from environments.deepsearch.admissible import admissible_actions, after_search
    from environments.deepsearch.env import parse_tool_call

    def listed(searched, seen) -> list[tuple[str, str]]:
        return [parse_tool_call(action) for action in admissible_actions(question, searched, seen)]

    def finds_path(query: str, seen_titles: set[str]) -> bool:
        return any(p.title in path and p.title not in seen_titles for p in search(query))

    searched: list[str] = []
    seen: list[Passage] = []
    for turn in range(max_turns):
        calls = listed(searched, seen)
        correct = [arg for tool, arg in calls
                   if tool == "answer" and exact_match(arg, golden_answers)]
        if correct:
            if trace is not None:
                trace.append(("answer", correct[0]))
            return True
        if turn == max_turns - 1:
            return False
        titles = {p.title for p in seen}
        queries = [arg for tool, arg in calls if tool == "search"]
        ranked = sorted((q for q in queries if finds_path(q, titles)),
                        key=lambda q: path[-1] not in {p.title for p in search(q)})
        if not ranked and turn < max_turns - 2:  # one detour: a search after which one finds it
            for query in queries:
                after = after_search(searched, seen, query, search(query))
                after_titles = {p.title for p in after[1]}
                if any(tool == "search" and finds_path(arg, after_titles) for tool, arg in listed(*after)):
                    ranked = [query]
                    break
        if not ranked:
            return False
        if trace is not None:
            trace.append(("search", ranked[0]))
        searched, seen = after_search(searched, seen, ranked[0], search(ranked[0]))
    return False
