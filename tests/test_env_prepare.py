"""A family's one-time ``prepare`` runs in the launcher before its servers start (issue:
deep search's first task-set build outlasted a server's start-up limit): the launcher calls it
once per family with the servers' extra arguments, before the first server, and not for a
family whose URLs are given; deep search's prepare builds its cached ``search`` task set only
when the cache file is missing and no user QA file / corpus replaces it."""

from __future__ import annotations

import contextlib

import pytest

from agentrl_jax.training.runtime import services
from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.config.sections import RunConfig
from environments.registry import FAMILIES, register_family


class _FakeServer:
    def __init__(self, name: str, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.name = name

    def stop(self) -> None:
        pass


class _FakeSupervisor:
    def __init__(self, servers, max_restarts, on_event) -> None:
        self.servers = servers

    def start(self) -> "_FakeSupervisor":
        return self

    def stop(self) -> None:
        pass


def _config(**env) -> RunConfig:
    c = base_config()
    c.env.names = "prepfam"
    for key, value in env.items():
        c.env[key] = value
    return to_run_config(c)


@pytest.fixture
def events(monkeypatch):
    import agentrl_common.processes as processes

    events: list[tuple] = []

    def fake_start(name, extra_args=(), **_):
        events.append(("start", name, list(extra_args)))
        return _FakeServer(name, 9000 + len(events))

    monkeypatch.setattr(processes, "start_env_server", fake_start)
    monkeypatch.setattr(processes, "ServerSupervisor", _FakeSupervisor)

    def prepare(server_args, say):
        events.append(("prepare", list(server_args)))
        say("prepfam: prepared")

    register_family("prepfam", env_factory=lambda: None, catalog_factory=list, prepare=prepare)
    try:
        yield events
    finally:
        FAMILIES.unregister("prepfam")


def test_prepare_runs_once_before_the_family_servers_start(events):
    said: list[str] = []
    with contextlib.ExitStack() as stack:
        urls, _ = services.start_supervised_env_services(
            _config(replicas=2, server_args={"prepfam": "--max-sessions 8"}), stack,
            say=said.append)
    assert events == [("prepare", ["--max-sessions", "8"]),
                      ("start", "prepfam", ["--max-sessions", "8"]),
                      ("start", "prepfam", ["--max-sessions", "8"])]
    assert said == ["prepfam: prepared"]
    assert len(urls["prepfam"]) == 2


def test_no_prepare_for_a_family_served_elsewhere(events):
    with contextlib.ExitStack() as stack:
        urls, supervisor = services.start_supervised_env_services(
            _config(urls={"prepfam": "http://127.0.0.1:1234"}), stack, say=print)
    assert events == [] and supervisor is None
    assert urls == {"prepfam": ["http://127.0.0.1:1234"]}


def test_deep_search_prepare_builds_the_task_set_only_when_missing(tmp_path, monkeypatch):
    pytest.importorskip("bm25s", reason="deep search needs bm25s")
    from environments.deepsearch import backend, task_cache
    from environments.deepsearch.family import FAMILY
    from environments.deepsearch.qa import QAItem

    corpus = tmp_path / "summaries.json"
    corpus.write_text('{"Oslo": "capital"}')
    monkeypatch.setattr(backend, "wiki_summaries_path", lambda: corpus)
    monkeypatch.setenv(task_cache.CACHE_ENV, str(tmp_path / "cache"))
    builds: list[int] = []
    item = QAItem("q1", "Q?", ("Oslo",), "test", "Oslo", "fact", ("Oslo",))

    def build():  # what a backend build does to the cache, without the corpus and index
        builds.append(1)
        task_cache.load_or_build("search", corpus, backend.SEARCH_PARAMS, lambda: [item])

    said: list[str] = []
    config = backend.BackendConfig()
    assert backend.prepare_search_task_set(config, said.append, build) is True
    assert len(builds) == 1 and len(said) == 2 and str(tmp_path / "cache") in said[0]
    assert backend.prepare_search_task_set(config, said.append, build) is False  # cached now
    assert len(builds) == 1 and len(said) == 2
    corpus.write_text('{"Oslo": "capital of Norway"}')  # another corpus: another cache file
    assert backend.prepare_search_task_set(config, said.append, build) is True
    for custom in (backend.BackendConfig(corpus="c.jsonl", qa=("q.jsonl",)),
                   backend.BackendConfig(qa_test=("q.jsonl",))):
        assert backend.prepare_search_task_set(custom, said.append, build) is False
    assert len(builds) == 2
    # the family entry parses the server's arguments: user QA files mean nothing to build
    corpus.write_text('{"Oslo": "a city"}')  # not cached: a plain start would build
    monkeypatch.setattr(backend, "SearchBackend", lambda *a, **k: builds.append(1))
    FAMILY.prepare(["--qa", "mine.jsonl", "--max-sessions", "8"], said.append)
    assert len(builds) == 2
    FAMILY.prepare(["--max-sessions", "8"], said.append)
    assert len(builds) == 3
