"""The served ``search`` task set's pieces, on hand-made data (fast): the on-disk cache (hit,
invalidation by corpus / code, a corrupt file rebuilt), the split that stays disjoint by article
when a two-hop question takes its answer article's side, the rewording fixes, and the searching
oracle playing a two-hop question through ``DeepSearchEnvironment`` over a real BM25 index."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bm25s", reason="deep search needs bm25s")

from environments.deepsearch import task_cache  # noqa: E402
from environments.deepsearch.corpus import Passage  # noqa: E402
from environments.deepsearch.env import DeepSearchEnvironment  # noqa: E402
from environments.deepsearch.expert import SearchingOracle, result_titles  # noqa: E402
from environments.deepsearch.paraphrase import inside_proper_name, question_clause  # noqa: E402
from environments.deepsearch.qa import QAItem, hash_split  # noqa: E402
from environments.deepsearch.retriever import BM25Retriever  # noqa: E402
from environments.deepsearch.search_qa import split_by_article  # noqa: E402
from environments.registry import get_family  # noqa: E402

ITEMS = [QAItem("hop-1", "Q one?", ("Oslo",), "test", "Norway", "hop", ("Arctic", "Norway"))]


def test_cache_hit_and_invalidation(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.json"
    corpus.write_text('{"a": 1}')
    calls = []

    def build():
        calls.append(1)
        return list(ITEMS)

    load = lambda: task_cache.load_or_build("search", corpus, {"k": 3}, build, tmp_path / "cache")  # noqa: E731
    assert load() == (ITEMS, True) and len(calls) == 1
    assert load() == (ITEMS, False) and len(calls) == 1  # read back, equal items (tuples restored)
    assert task_cache.load_or_build("search", corpus, {"k": 4}, build, tmp_path / "cache")[1]  # other params
    corpus.write_text('{"a": 2}')  # another corpus
    assert load()[1] and len(calls) == 3
    assert not load()[1]
    monkeypatch.setattr(task_cache, "code_version", lambda modules=(): "edited rules")  # other code
    assert load()[1] and not load()[1] and len(calls) == 4
    for path in (tmp_path / "cache").glob("*.json"):
        path.write_text('{"layout": 1, "items": [{"id": 3}]}')  # not a file this code wrote
    assert load()[1] and len(calls) == 5
    assert not load()[1]
    assert not list((tmp_path / "cache").glob("*.tmp"))
    current = tmp_path / "cache" / f"search-{task_cache.cache_key('search', corpus, {'k': 3})}.json"
    kept = json.loads(current.read_text())
    assert kept["items"][0]["path"] == ["Arctic", "Norway"]


def test_code_version_follows_the_build_modules():
    assert task_cache.code_version() == task_cache.code_version()
    assert task_cache.code_version() != task_cache.code_version(task_cache.BUILD_MODULES[:-1])


def _titles(split: str, n: int, prefix: str) -> list[str]:
    found, i = [], 0
    while len(found) < n:
        if hash_split(f"{prefix}{i}", 3) == split:
            found.append(f"{prefix}{i}")
        i += 1
    return found


def test_split_by_article_lets_a_hop_claim_its_first_article_only_when_free():
    a_train, b_train = _titles("train", 2, "train-")
    b_test, c_test = _titles("test", 2, "test-")
    items = [
        QAItem("f1", "q1", ("x",), "train", a_train, "fact", (a_train,)),  # A used by train
        QAItem("h1", "q2", ("x",), "test", b_test, "hop", (a_train, b_test)),  # so this is dropped
        QAItem("h2", "q3", ("x",), "test", b_test, "hop", (b_train, b_test)),  # B-train is free: kept
        QAItem("h3", "q4", ("x",), "train", c_test, "hop", (b_train, c_test)),  # claimed by test: dropped
        QAItem("f2", "q5", ("x",), "test", c_test, "fact", (c_test,)),
    ]
    kept = split_by_article(items, 3)
    assert [i.id for i in kept] == ["f1", "h2", "f2"]
    train = {t for i in kept if i.split == "train" for t in i.path}
    test = {t for i in kept if i.split == "test" for t in i.path}
    assert not train & test and b_train in test


def test_rewording_never_puts_it_inside_a_proper_name():
    assert question_clause("India, officially the Republic of India, is a country in South Asia.",
                           "South Asia", "which place", ["India"]) == "It is a nation in which place"
    assert question_clause("It borders the Republic of India and China.", "China", "which place", ["India"]) is None
    assert question_clause("The Netherlands is a country in Western Europe.", "Western Europe", "which place",
                           ["Netherlands"]) == "It is a nation in which place"
    assert question_clause("Amsterdam is the capital of the Netherlands.", "Netherlands", "which place",
                           ["Amsterdam"]) == "It is the capital of which place"
    assert inside_proper_name("the Cairo Governorate lies", "Cairo") and not inside_proper_name("In Cairo it", "Cairo")


PASSAGES = [
    Passage("Zorbia", "Zorbia", "Zorbia is a mountain realm. Its capital is Quillton, on the Vell river.",
            description="Mountain realm of the far north"),
    Passage("Quillton", "Quillton", "Quillton is a city. It was founded in 1311 by the weaver Ambrel.",
            description="Capital of Zorbia"),
    Passage("Ambrel", "Ambrel", "Ambrel was a weaver who travelled widely.", description="Weaver"),
    Passage("Vell", "Vell", "The Vell is a river of the far north, cold and mountain fed.", description="River"),
]


class _Backend:
    def __init__(self, item: QAItem):
        self.retriever = BM25Retriever(PASSAGES)
        self.item = item

    def question(self, task_id):
        return self.item


def test_searching_oracle_follows_both_hops_through_the_environment():
    item = QAItem("hop-x", "Consider the first city named in the article on the mountain realm of the far north. "
                  "It was set up in which year?", ("1311",), "test", "Quillton", "hop", ("Zorbia", "Quillton"))
    backend = _Backend(item)
    env = DeepSearchEnvironment(k=2, backend_getter=lambda: backend)
    oracle = SearchingOracle(item, {p.title: p for p in PASSAGES})
    observation, actions = env.reset("hop-x").observation, []
    while True:
        actions.append(oracle.act(observation))
        step = env.step(actions[-1])
        observation = step.observation
        if step.done:
            break
    assert actions == ["<search>Mountain realm of the far north</search>", "<search>Quillton</search>", "<answer>1311</answer>"]
    assert step.reward == 1.0
    # a description that misses the article: the oracle searches its title next
    missing = QAItem("hop-y", "q", ("1311",), "test", "Quillton", "hop", ("Ambrel", "Quillton"))
    oracle = SearchingOracle(missing, {p.title: p for p in PASSAGES})
    assert oracle.act("Question: q") == "<search>Weaver</search>"
    assert oracle.act("<information>\nDoc 1 (Title: Vell) x\n</information>") == "<search>Ambrel</search>"
    assert oracle.act("<information>\nDoc 1 (Title: Ambrel) Ambrel was\n</information>") == "<search>Quillton</search>"
    assert result_titles("<information>\nDoc 1 (Title: A b) t\nDoc 2 (Title: C) u\n</information>") == ["A b", "C"]
    with pytest.raises(ValueError):
        SearchingOracle(QAItem("z", "q", ("a",), "test"), {})


def test_both_deep_search_families_are_registered():
    search, lookup = get_family("deepsearch"), get_family("deepsearch_lookup")
    assert search.expert.__name__ == "DeepSearchExpertPolicy" and lookup.expert.__name__ == "DeepSearchLookupExpertPolicy"
    assert lookup.action_example == search.action_example
