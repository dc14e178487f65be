"""agentrl_common.registry: eager and lazy entries, unknown names with a did-you-mean, duplicates."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from agentrl_common.registry import (
    DuplicateNameError,
    Registry,
    UnknownNameError,
    did_you_mean,
    snake_case,
)


def test_register_as_call_and_as_decorator():
    reg: Registry = Registry("widget")

    @reg.register("alpha")
    def alpha():
        return 1

    def beta():
        return 2

    assert reg.register("beta", beta) is beta  # returns the object
    assert alpha() == 1  # the decorator hands the function back unchanged
    assert reg.get("alpha") is alpha and reg["beta"] is beta
    assert reg.names() == ["alpha", "beta"] and list(reg) == ["alpha", "beta"] and len(reg) == 2
    assert "alpha" in reg and "gamma" not in reg and 3 not in reg


def test_unknown_name_message_lists_known_names_and_suggests_the_closest():
    reg: Registry = Registry("advantage estimator")
    for name in ("gae", "grpo", "rloo"):
        reg.register(name, object())
    with pytest.raises(UnknownNameError) as info:
        reg.get("grop")
    assert str(info.value) == "unknown advantage estimator 'grop'; known: gae, grpo, rloo; did you mean 'grpo'?"
    assert isinstance(info.value, ValueError) and info.value.known == ["gae", "grpo", "rloo"]
    # nothing close: no suggestion, but still the list
    with pytest.raises(UnknownNameError, match=r"^unknown advantage estimator 'zzzz'; known: gae, grpo, rloo$"):
        reg.get("zzzz")
    # an empty registry says so
    with pytest.raises(UnknownNameError, match=r"known: \(none registered\)"):
        Registry("parser").get("json")
    # non-string names are unknown, not a crash
    with pytest.raises(UnknownNameError):
        reg.get(None)  # type: ignore[arg-type]


def test_did_you_mean_helper():
    assert did_you_mean("textcraf", ["babyai", "textcraft"]) == "; did you mean 'textcraft'?"
    assert did_you_mean("TEXTCRAFT", ["babyai", "textcraft"]) == "; did you mean 'textcraft'?"
    assert did_you_mean("xyz", ["babyai", "textcraft"]) == ""


def test_duplicate_registration_is_an_error_unless_same_object_or_replace():
    reg: Registry = Registry("policy loss")
    a, b = object(), object()
    reg.register("ppo", a)
    reg.register("ppo", a)  # the same object again (a re-import) is harmless
    with pytest.raises(DuplicateNameError, match="policy loss 'ppo' is already registered"):
        reg.register("ppo", b)
    with pytest.raises(DuplicateNameError):
        reg.register_lazy("ppo", "json:dumps")
    assert reg.get("ppo") is a
    reg.register("ppo", b, replace=True)
    assert reg.get("ppo") is b
    reg.unregister("ppo")
    assert "ppo" not in reg
    with pytest.raises(UnknownNameError):
        reg.unregister("ppo")


def test_snake_case_normalisation():
    reg: Registry = Registry("loss aggregation", normalize=snake_case)
    fn = reg.register("seq-mean-token-sum", object())
    assert reg.names() == ["seq_mean_token_sum"]
    assert reg.get("Seq-Mean-Token-Sum") is fn and " seq_mean_token_sum " in reg
    with pytest.raises(DuplicateNameError):
        reg.register("SEQ_MEAN_TOKEN_SUM", object())
    # without normalisation, case matters
    plain: Registry = Registry("thing")
    plain.register("Foo", 1)
    assert "Foo" in plain and "foo" not in plain


def test_bad_names_and_targets_are_rejected():
    reg: Registry = Registry("thing")
    with pytest.raises(ValueError, match="must not be empty"):
        reg.register("  ", 1)
    with pytest.raises(TypeError, match="must be a string"):
        reg.register(3, 1)  # type: ignore[arg-type]
    for target in ("json", "json:", ":dumps", ""):
        with pytest.raises(ValueError, match="module:attribute"):
            reg.register_lazy("x", target)
    assert reg.names() == []


def test_lazy_entry_imports_on_first_get_and_caches():
    import json

    reg: Registry = Registry("codec")
    reg.register_lazy("dumps", "json:dumps")
    reg.register_lazy("decoder", "json:JSONDecoder.decode")  # dotted attribute
    assert reg.names() == ["decoder", "dumps"] and "dumps" in reg
    assert not reg.is_loaded("dumps") and reg.target("dumps") == "json:dumps"
    assert reg.get("dumps") is json.dumps
    assert reg.is_loaded("dumps") and reg.target("dumps") is None
    assert reg.get("decoder") is json.JSONDecoder.decode
    # registering the same lazy target twice is harmless; a different one is a duplicate
    reg2: Registry = Registry("codec")
    reg2.register_lazy("dumps", "json:dumps")
    reg2.register_lazy("dumps", "json:dumps")
    with pytest.raises(DuplicateNameError):
        reg2.register_lazy("dumps", "json:loads")


def test_lazy_entry_really_defers_the_import(tmp_path):
    """Listing names must not import the module; ``get`` must."""
    (tmp_path / "heavy_mod_for_registry_test.py").write_text("VALUE = 42\n")
    code = textwrap.dedent(
        """
        import sys
        from agentrl_common.registry import Registry
        reg = Registry("heavy thing")
        reg.register_lazy("heavy", "heavy_mod_for_registry_test:VALUE")
        reg.names(); "heavy" in reg
        before = "heavy_mod_for_registry_test" in sys.modules
        value = reg.get("heavy")
        print(before, "heavy_mod_for_registry_test" in sys.modules, value)
        """
    )
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False", "True", "42"]


def test_lazy_entry_import_failures_name_the_entry():
    reg: Registry = Registry("rollout backend")
    reg.register_lazy("ghost", "no_such_module_xyz_123:Backend")
    with pytest.raises(ModuleNotFoundError, match="rollout backend 'ghost' needs module 'no_such_module_xyz_123'") as info:
        reg.get("ghost")
    assert info.value.name == "no_such_module_xyz_123"
    reg.register_lazy("typo", "json:dumpz")
    with pytest.raises(ImportError, match=r"rollout backend 'typo': json:dumpz does not exist"):
        reg.get("typo")
    # a failed import leaves the entry lazy (a later install can still succeed)
    assert reg.target("ghost") == "no_such_module_xyz_123:Backend"


def test_expected_type_is_checked_for_eager_and_lazy_entries():
    reg: Registry = Registry("codec", expected=type)
    reg.register("decoder", dict)
    with pytest.raises(TypeError, match="codec 'n' is a int, expected type"):
        reg.register("n", 3)
    reg.register_lazy("dumps", "json:dumps")
    with pytest.raises(TypeError, match=r"codec 'dumps' \(json:dumps\) is a function, expected type"):
        reg.get("dumps")
