"""MiniWoB++ admissible actions (environments/miniwob/admissible.py, ``valid_actions``): the
pure candidate builder on hand-built pages; with Chromium, that every listed action is one the
environment accepts, that the rule-based expert's action is listed at every step of its
episodes, and that the HTTP server appends the list for ``list_actions`` sessions."""

from __future__ import annotations

import pytest

from environments.miniwob.actions import parse_action
from environments.miniwob.admissible import MAX_ADMISSIBLE, admissible_actions, candidate_texts
from environments.miniwob.catalog import SUPPORTED_TASKS, TEST_SEED_BASE
from environments.miniwob.dom_text import Element, render
from environments.miniwob.expert import MiniWoBExpert
from tests.test_env_miniwob import _browser_or_skip


def _el(ref: int, tag: str, text: str = "", shown: bool = True, **state) -> Element:
    return Element(ref=ref, tag=tag, text=text, shown=shown, **state)


# ------------------------------------------------------------------------------- pure function


def test_candidate_texts_quoted_case_forms_and_words():
    assert candidate_texts('Enter "Kiara" into the text field and press Submit.') == ["Kiara"]
    assert candidate_texts('Type "myron" in all upper case letters in the text input.') == ["myron", "MYRON"]
    assert candidate_texts('Type "AbC" in lower case.') == ["AbC", "abc"]
    assert candidate_texts('Type "abc" in lower case.') == ["abc"]  # no duplicate form
    assert candidate_texts('Enter the username "keneth" and the password "91YP".') == ["keneth", "91YP"]
    # nothing quoted: words that are not the first one nor common, those with a digit/capital first
    assert candidate_texts("Book the shortest flight from: LEB to: RDG on 10/10/2016") == [
        "LEB", "RDG", "10/10/2016"]
    assert candidate_texts("Focus into the 2nd input textbox.") == ["2nd"]
    assert candidate_texts("Focus into the textbox.") == []
    assert candidate_texts('Click on the "" button.') == []


def test_a_form_page_lists_typing_then_clicks_then_enter():
    elements = [
        _el(1, "body", shown=False),
        _el(6, "label", "Username"),
        _el(7, "input_text", value="keneth", focused=True),
        _el(9, "label", "Password"),
        _el(10, "input_password"),
        _el(3, "div", shown=False),  # a container without text: not shown, not listed
        _el(11, "button", "Login"),
        _el(12, "p", "Some text"),
    ]
    actions = admissible_actions(elements, 'Enter the username "keneth" and the password "91YP" and press login.')
    assert actions == [
        'type [7] "91YP"',  # "keneth" is already field 7's value: no change, not listed
        'type [10] "keneth"',
        'type [10] "91YP"',
        "click [6]",
        "click [7]",
        "click [9]",
        "click [10]",
        "click [11]",
        "press [Enter]",
        "click [12]",
    ]


def test_select_options_but_the_selected_one_and_no_click_on_the_select():
    elements = [
        _el(4, "select", options=("Ecuador", "Sudan", "Norway"), selected="Ecuador"),
        _el(5, "button", "Submit"),
    ]
    assert admissible_actions(elements, "Select Norway from the list and click Submit.") == [
        'select [4] "Sudan"', 'select [4] "Norway"', "click [5]"]


def test_pages_without_fields_list_only_clicks_in_tier_then_page_order():
    elements = [
        _el(3, "div", "Vulputate risus commodo"),
        _el(4, "span", "blandit"),
        _el(6, "a", "Tab #1"),
        _el(7, "input_checkbox"),
        _el(8, "h3", "Section"),
        _el(9, "span", "blandit"),  # same text, another element: listed too
    ]
    actions = admissible_actions(elements, 'Click on the link "blandit".')
    assert actions == ["click [6]", "click [7]", "click [3]", "click [4]", "click [8]", "click [9]"]
    assert not any(a.startswith(("type", "press")) for a in actions)


def test_quotes_and_unicode_are_escaped_so_the_parser_reads_the_text_back():
    elements = [_el(5, "textarea")]
    for text in ['say \\ hi', "确定", "a'b"]:
        actions = admissible_actions(elements, f'Enter "{text}" here.')
        typed = parse_action(actions[0])
        assert (typed.kind, typed.ref, typed.text) == ("type", 5, text)


def test_the_list_is_bounded_and_drops_the_last_tier_first():
    elements = [_el(100 + i, "span", f"word {i}") for i in range(20)]
    elements += [_el(i, "button", f"b{i}") for i in range(1, 11)]
    elements.append(_el(50, "input_text"))
    actions = admissible_actions(elements, 'Type "x" and "y".')
    assert len(actions) == MAX_ADMISSIBLE
    expected = ['type [50] "x"', 'type [50] "y"'] + [f"click [{i}]" for i in range(1, 11)]
    expected += ["click [50]", "press [Enter]"] + [f"click [{100 + i}]" for i in range(12)]
    assert actions == expected
    assert admissible_actions(elements, 'Type "x".', limit=3) == ['type [50] "x"', "click [1]", "click [2]"]
    assert admissible_actions([], "Click the button.") == []


def test_every_listed_action_parses_to_an_element_of_the_page():
    elements = [
        _el(2, "label", "apple"), _el(3, "input_radio"), _el(4, "input_text", value="q"),
        _el(5, "select", options=("a", "b"), selected=None), _el(6, "button", "OK"), _el(7, "td", "cell"),
    ]  # fmt: skip
    refs = {e.ref for e in elements}
    for action in admissible_actions(elements, 'Enter "pear" and pick "b".'):
        parsed = parse_action(action)
        assert parsed.kind in ("click", "type", "select", "press"), action
        assert parsed.kind == "press" or parsed.ref in refs, action


def test_render_keeps_each_elements_state_for_the_builder():
    dom = {
        "tag": "BODY", "ref": 1, "children": [
            {"tag": "INPUT_text", "ref": 2, "value": "hi", "focused": True, "children": []},
            {"tag": "SELECT", "ref": 3, "children": []},
            {"tag": "INPUT_checkbox", "ref": 4, "value": True, "children": []},
        ],
        "selects": {"3": {"options": ["x", "y"], "selected": "y"}},
    }  # fmt: skip
    _, elements = render(dom)
    assert (elements[2].value, elements[2].focused) == ("hi", True)
    assert (elements[3].options, elements[3].selected, elements[3].focused) == (("x", "y"), "y", False)
    assert elements[4].value == ""  # a checkbox's value is its checked state, shown as checked=
    assert admissible_actions(list(elements.values()), 'Enter "hi".') == [
        'select [3] "x"', "click [2]", "click [4]", "press [Enter]"]


# -------------------------------------------------------------------------------- with Chromium


@pytest.fixture(scope="module")
def env():
    _browser_or_skip()
    from environments.miniwob.env import MiniWoBEnvironment

    env = MiniWoBEnvironment(max_steps=15)
    yield env
    env.close()


def _expert_episode(env, task: str, seed: int) -> tuple[list[str], list[list[str]], bool]:
    """``(expert actions, listed actions before each, success)`` of one expert episode."""
    result = env.reset(f"{task}/seed={seed}")
    expert, observation = MiniWoBExpert(), result.observation
    actions, listed = [], []
    for _ in range(15):
        listed.append(env.valid_actions())
        actions.append(expert.act(task, observation))
        step = env.step(actions[-1])
        observation = step.observation
        if step.done or step.truncated:
            break
    assert env.valid_actions() is None  # between episodes
    return actions, listed, bool(step.info.get("success"))


def test_the_experts_action_is_listed_at_every_step_of_its_episodes(env):
    """A policy choosing among the listed options can solve every supported task: on a train and
    a held-out seed of each, every action of the solving expert is one of the options."""
    solved = 0
    for task in SUPPORTED_TASKS:
        for seed in (7, TEST_SEED_BASE + 7):
            actions, listed, success = _expert_episode(env, task, seed)
            for action, options in zip(actions, listed):
                assert 0 < len(options) <= MAX_ADMISSIBLE
                assert action in options, (task, seed, action, options)
            solved += success
    assert solved >= 0.9 * 2 * len(SUPPORTED_TASKS)


@pytest.mark.parametrize("task", ["click-button", "click-checkboxes", "click-tab-2", "click-widget",
                                  "click-collapsible-nodelay", "choose-list", "enter-text-2",
                                  "login-user", "unicode-test"])
def test_every_listed_action_is_accepted_at_every_step(env, task):
    """At each state of an expert episode (replayed from the reset), each listed action parses
    and steps without being flagged invalid."""
    seed = 11
    actions, _, _ = _expert_episode(env, task, seed)
    for k in range(len(actions)):
        env.reset(f"{task}/seed={seed}")
        for prefix in actions[:k]:
            env.step(prefix)
        options = env.valid_actions()
        for option in options:
            assert parse_action(option).kind != "invalid", option
            env.reset(f"{task}/seed={seed}")
            for prefix in actions[:k]:
                env.step(prefix)
            assert env.valid_actions() == options  # deterministic for one state
            step = env.step(option)
            assert not step.info["invalid_action"], (task, k, option, step.observation[:300])


async def test_the_server_appends_the_list_for_list_actions_sessions():
    _browser_or_skip()
    from agentrl_common.processes import start_env_server
    from environments.core.client import EnvClient

    with start_env_server("miniwob") as srv:
        async with EnvClient(srv.url, timeout=120, list_actions=3) as client:
            env_id, observation, info = await client.create(task_id="enter-text/seed=5")
            quoted = observation.split('"')[1]
            field = observation.split("input_text")[0].rsplit("[", 1)[1].split("]")[0]
            first = f'type [{field}] "{quoted}"'
            assert info["listed_actions"][0] == first and len(info["listed_actions"]) == 3
            assert observation.splitlines()[-1] == "Valid actions: " + ", ".join(info["listed_actions"]) + (
                " (and 1 more).")
            step = await client.step(env_id, first)
            assert not step.info["invalid_action"] and step.info["listed_actions"][0] == f"click [{field}]"
            assert step.observation.splitlines()[-1].startswith("Valid actions: click [")
            await client.close(env_id)
        async with EnvClient(srv.url, timeout=120) as client:  # not asked: nothing appended
            env_id, observation, info = await client.create(task_id="enter-text/seed=5")
            assert "Valid actions" not in observation and "listed_actions" not in info
            await client.close(env_id)
