"""The deep-search environment: answer a question using a BM25 search tool.

Each turn the agent writes text containing one tool call (the first call in the text is used):

* ``<search>query</search>``: the observation is the top-``k`` passages, formatted as in
  Search-R1: ``<information>Doc 1 (Title: ...) text ... </information>``.
* ``<answer>text</answer>``: ends the episode. Reward = normalised exact match with any golden
  answer (1.0 / 0.0, see ``scoring.py``); ``info`` has ``em``, ``f1``, ``success`` and ``score``
  (= EM).

Text with neither tag may be the short form of a listed action, a first line ``search query`` or
``answer text``; other text is a normal step with ``info["invalid_action"] = True``.
``valid_actions()`` lists at most 16 searches and 10 answers in the short form, built from what
the episode has shown (``admissible.py``: the question's key phrase, the names and years of the
returned passages; never the golden answer). After
``max_steps`` turns without an answer the episode is truncated with reward 0. The corpus, index
and QA set are shared by all instances of a process (``backend.py``).

Evidence reward (``evidence_reward`` = ``e`` in [0, 1], training-only; default 0: none): a
question of the built-in search set names the articles to read, ``QAItem.path`` (one for a
paraphrased fact, two for a two-hop question). The search step whose results first include a
path article gets reward ``e / len(path)`` for each path article it newly returns, so an episode
collects at most ``e`` (a question without a path, as in the lookup set and user files, none).
With ``evidence_articles = "answer"`` only the path's last article counts (the one that
names the answer: a fact's one article, a two-hop question's second), worth the whole ``e``.
That part of the step's reward is also ``info[SHAPING_KEY]`` (``environments/core/base.py``):
the trainer's return keeps it, the evaluation's score takes it out. ``info["score"]``,
``success`` and ``em`` stay the exact match. Every step's ``info["evidence"]`` lists the path
articles returned so far, in the order first returned.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from environments.core.base import SHAPING_KEY, ResetResult, StepResult, TextEnvironment
from environments.deepsearch.admissible import admissible_actions, after_search
from environments.deepsearch.backend import SearchBackend, get_backend
from environments.deepsearch.corpus import Passage
from environments.deepsearch.scoring import exact_match, f1_score

_TOOL_CALL = re.compile(r"<(search|answer)>(.*?)(?:</\1>|$)", re.S | re.I)
_SHORT_CALL = re.compile(r"(search|answer)\s+(\S.*)", re.I)

INSTRUCTIONS = """Answer the given question. You can use a search engine over an encyclopedia as \
many times as you need: write <search> query </search> and the top {k} results come back \
between <information> and </information>. When you know the answer, write \
<answer> your answer </answer>, for example <answer> Beijing </answer>; this ends the episode. \
Give a short answer (a name or a phrase, without explanation): it is scored by exact match \
after lowercasing and removing punctuation and the articles a/an/the. Each reply must contain \
one <search> or one <answer>; you have at most {max_steps} replies."""


def check_evidence_reward(value: object) -> float:
    """``value`` as the evidence reward: a real number in [0, 1] (``ValueError`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"evidence_reward must be a number in [0, 1], got {value!r}")
    return float(value)


#: ``evidence_articles`` -> the articles of a question's path that earn the evidence reward
COUNTED_ARTICLES: dict[str, Callable[[tuple[str, ...]], tuple[str, ...]]] = {
    "path": lambda path: path,  # every path article, a share each
    "answer": lambda path: path[-1:],  # the last one, which names the answer, all of it
}
EVIDENCE_ARTICLES = tuple(COUNTED_ARTICLES)


def check_evidence_articles(value: object) -> str:
    """``value`` as ``evidence_articles``: one of ``EVIDENCE_ARTICLES`` (``ValueError``
    otherwise)."""
    if not isinstance(value, str) or value not in COUNTED_ARTICLES:
        raise ValueError(f"evidence_articles must be one of {EVIDENCE_ARTICLES}, got {value!r}")
    return str(value)


def evidence_bonus(path: tuple[str, ...], reached: list[str], returned: list[str],
                   evidence_reward: float, articles: str = "path") -> tuple[float, list[str]]:
    """``(bonus, newly reached)`` of one search: the path articles among the ``returned`` titles
    not in ``reached`` yet (each once, in returned order), and ``bonus = evidence_reward *
    |newly & counted| / |counted|``, where ``counted`` is the whole path (``articles="path"``)
    or its last article (``"answer"``); 0 for an empty path."""
    newly: list[str] = []
    for title in returned:
        if title in path and title not in reached and title not in newly:
            newly.append(title)
    counted = COUNTED_ARTICLES[articles](path)
    hits = sum(title in counted for title in newly)
    if not counted or not hits:
        return 0.0, newly
    return evidence_reward * hits / len(counted), newly


def parse_tool_call(text: str) -> tuple[str, str] | None:
    """``("search" | "answer", argument)`` of the first tool call in ``text``: its first
    ``<search>`` / ``<answer>`` tag, else (text with no tag) the short form of the listed
    actions, a first line ``search q`` / ``answer a`` (the word, case-insensitive, then the
    argument); None when there is neither."""
    text = str(text)
    first_line = text.strip().split("\n", 1)[0].strip()
    match = _TOOL_CALL.search(text) or _SHORT_CALL.fullmatch(first_line)
    if match is None:
        return None
    return match[1].lower(), " ".join(match[2].split())


def format_passages(results) -> str:
    if not results:
        return "<information>No results.</information>"
    docs = [f"Doc {i} (Title: {p.title}) {p.text}" if p.title else f"Doc {i} {p.text}" for i, (p, _) in enumerate(results, 1)]
    return "<information>\n" + "\n".join(docs) + "\n</information>"


class DeepSearchEnvironment(TextEnvironment):
    """One question at a time; the search backend is shared.

    k: passages per search. max_steps: replies per episode before ``truncated``.
    evidence_reward: the most an episode collects for returning its question's path articles
    (module docstring; 0: none, the task reward alone). evidence_articles: ``"path"`` (every
    path article earns its share) or ``"answer"`` (the last one alone earns it all).
    """

    name = "deepsearch"

    def __init__(self, k: int = 3, max_steps: int = 30,
                 backend_getter: Callable[[], SearchBackend] = get_backend,
                 evidence_reward: float = 0.0, evidence_articles: str = "path") -> None:
        self.k = k
        self.max_steps = max_steps
        self.evidence_reward = check_evidence_reward(evidence_reward)
        self.evidence_articles = check_evidence_articles(evidence_articles)
        self._backend_getter = backend_getter
        self._item = None
        self._steps = 0
        self._searches = 0
        self._active = False
        self._searched: list[str] = []  # the queries of this episode, in order
        self._seen: list[Passage] = []  # the passages returned so far, newest search first, each once
        self._listed: list[str] | None = None  # valid_actions() of the current state, once computed
        self._evidence: list[str] = []  # the path articles returned so far, first returned first

    def reset(self, task_id: str, seed: int | None = None) -> ResetResult:
        """Start question ``task_id`` (``seed`` is unused: episodes are deterministic)."""
        backend = self._backend_getter()
        self._item = backend.question(task_id)
        self._steps = 0
        self._searches = 0
        self._active = True
        self._searched, self._seen, self._listed = [], [], None
        self._evidence = []
        info = {
            "task_id": self._item.id,
            "split": self._item.split,
            "max_steps": self.max_steps,
            "instructions": INSTRUCTIONS.format(k=self.k, max_steps=self.max_steps),
            "question": self._item.question,
        }
        return ResetResult(observation=f"Question: {self._item.question}", info=info)

    def step(self, action: str) -> StepResult:
        if not self._active or self._item is None:
            raise RuntimeError("step() before reset(), or after the episode ended")
        self._steps += 1
        info: dict[str, Any] = {"steps": self._steps, "invalid_action": False, "success": False,
                                "evidence": list(self._evidence)}
        call = parse_tool_call(action)
        if call is None or not call[1]:
            info["invalid_action"] = True
            observation = (
                "Invalid action: write <search> query </search> to search or <answer> text </answer> to answer."
                if call is None
                else f"Invalid action: the <{call[0]}> tag is empty."
            )
            return self._finish_turn(observation, info)
        tool, argument = call
        if tool == "search":
            self._searches += 1
            results = self._backend_getter().retriever.search(argument, self.k)
            self._remember(argument, [p for p, _ in results])
            info["retrieved"] = [p.title or p.id for p, _ in results]
            bonus, newly = evidence_bonus(self._item.path, self._evidence,
                                          [p.title for p, _ in results], self.evidence_reward,
                                          self.evidence_articles)
            self._evidence += newly
            info["evidence"] = list(self._evidence)
            if bonus:
                info[SHAPING_KEY] = bonus
            return self._finish_turn(format_passages(results), info, reward=bonus)
        golden = self._item.golden_answers
        em = exact_match(argument, golden)
        info.update(
            em=em, f1=f1_score(argument, golden), score=em, success=em == 1.0,
            answer=argument, golden_answers=list(golden), searches=self._searches,
        )  # fmt: skip
        self._active = False
        verdict = "correct" if em == 1.0 else "not correct"
        return StepResult(observation=f"Your answer is {verdict}.", reward=em, done=True, info=info)

    def _remember(self, query: str, returned: list[Passage]) -> None:
        """Keep what a search showed (for ``valid_actions``): newest passages first, each once."""
        self._searched, self._seen = after_search(self._searched, self._seen, query, returned)
        self._listed = None

    def valid_actions(self) -> list[str] | None:
        """The admissible actions now (``admissible.admissible_actions`` of the question, the
        queries searched and the passages returned; no retrieval), most useful first, at most 26;
        None before the first reset and after the episode."""
        if not self._active or self._item is None:
            return None
        if self._listed is None:
            self._listed = admissible_actions(self._item.question, self._searched, self._seen)
        return list(self._listed)

    def _finish_turn(self, observation: str, info: dict[str, Any],
                     reward: float = 0.0) -> StepResult:
        """A step that does not answer (``reward``: its evidence bonus); truncated (task score
        0) after ``max_steps``."""
        truncated = self._steps >= self.max_steps
        if truncated:
            self._active = False
            info.update(score=0.0, searches=self._searches)
        return StepResult(observation=observation, reward=reward, done=False, truncated=truncated,
                          info=info)

    def close(self) -> None:
        """Nothing to release per instance (the backend is shared). Idempotent."""
        self._active = False
        self._item = None
        self._searched, self._seen, self._listed = [], [], None
        self._evidence = []
