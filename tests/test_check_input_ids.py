"""check_input_ids: the C-level path and the element-by-element one agree with a reference
written here (ints and numpy ints in [0, vocab), bools, floats, strings and None refused),
the result is a new int32 array that never aliases the caller's list."""

import numpy as np
import pytest

from agentrl_jax.rollout.contract import InvalidRequestError
from agentrl_jax.rollout.engine.prompt_ids import check_input_ids


def reference(ids, vocab, max_length):
    """Element by element: ints (numpy ints converted, bools refused) in [0, vocab), shorter
    than max_length; None when invalid."""
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            return None
        out.append(int(t))
    if not out or any(not 0 <= t < vocab for t in out) or len(out) >= max_length:
        return None
    return out


@pytest.mark.parametrize("case", range(200))
def test_agrees_with_the_reference(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(1, 40))
    ids = rng.integers(-2, 102, size=n).tolist()
    kind = case % 4
    if kind == 1:
        ids = [np.int64(t) for t in ids]
    elif kind == 2:
        ids = tuple(ids)
    elif kind == 3 and n > 2:
        ids[n // 2] = [True, 1.5, "3", None, np.True_, np.float64(2.0), False,
                       np.int32(7)][(case // 4) % 8]
    want = reference(ids, 100, 30)
    if want is None:
        with pytest.raises(InvalidRequestError):
            check_input_ids(ids, 100, 30)
    else:
        got = check_input_ids(ids, 100, 30)
        assert isinstance(got, np.ndarray) and got.dtype == np.int32 and got.tolist() == want


def test_returns_a_copy():
    ids = [5, 6, 7]
    out = check_input_ids(ids, 10, 10)
    ids[0] = 9
    ids.append(8)
    assert out.tolist() == [5, 6, 7]


def test_ids_past_int64_and_past_int32_are_refused_with_their_values():
    """An int past int64 cannot be converted; without a vocabulary the ids must still fit the
    int32 prompt array (no silent wrap-around)."""
    with pytest.raises(InvalidRequestError, match=r"1 token ids outside .* e.g. \[" + str(2**70)):
        check_input_ids([1, 2, 2**70], 100, 30)
    with pytest.raises(InvalidRequestError, match=r"outside the vocabulary \[0, 2147483648\)"):
        check_input_ids([1, 2**31], None, None)
    with pytest.raises(InvalidRequestError, match=r"e.g. \[-1\]"):
        check_input_ids([-1, 3], None, None)
    assert check_input_ids([2**31 - 1, 0], None, None).tolist() == [2**31 - 1, 0]
    with pytest.raises(InvalidRequestError, match="only integers, found str"):
        check_input_ids([2**70, "x"], 100, 30)  # the type is named, not a crash


@pytest.mark.parametrize("code", ["b", "h", "i", "l", "q", "B", "H", "I", "L", "Q"])
def test_integer_arrays_are_read_in_place_and_agree_with_their_list(code):
    import array

    rng = np.random.default_rng(ord(code))
    for case in range(30):
        n = int(rng.integers(1, 40))
        low = 0 if code.isupper() else -2  # unsigned codes hold no negative ids
        values = rng.integers(low, 102, size=n).tolist()
        for container in (array.array(code, values), np.asarray(values, np.dtype(code))):
            want = reference(values, 100, 30)
            if want is None:
                with pytest.raises(InvalidRequestError):
                    check_input_ids(container, 100, 30)
                continue
            got = check_input_ids(container, 100, 30)
            assert got.dtype == np.int32 and got.tolist() == want
            container[0] = 99  # the result is a copy, never a view
            assert got[0] == want[0]


def test_arrays_of_other_kinds_are_refused():
    import array

    for bad in (array.array("d", [1.0, 2.0]), array.array("u", "ab"), np.array([True, False]),
                np.array([1.0, 2.0]), np.zeros((2, 2), np.int32), array.array("i"),
                np.zeros((0,), np.int64)):
        with pytest.raises(InvalidRequestError):
            check_input_ids(bad, 100, 30)
