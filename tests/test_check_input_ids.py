"""check_input_ids: the fast path for plain int lists and the general path agree with a
reference written here, and the result never aliases the caller's list."""

import numpy as np
import pytest

from agentrl_jax.rollout.contract import InvalidRequestError, check_input_ids


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
        ids[n // 2] = [True, 1.5, "3", None][(case // 4) % 4]
    want = reference(ids, 100, 30)
    if want is None:
        with pytest.raises(InvalidRequestError):
            check_input_ids(ids, 100, 30)
    else:
        got = check_input_ids(ids, 100, 30)
        assert got == want and all(type(t) is int for t in got)


def test_returns_a_copy():
    ids = [5, 6, 7]
    out = check_input_ids(ids, 10, 10)
    ids.append(8)
    assert out == [5, 6, 7]
