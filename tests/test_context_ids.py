"""ContextIds: the current chunk of a trajectory as array("i"), extended turn by turn and
started again with each new chunk; always equal to ``Trajectory.context_ids``."""

from array import array

from agentrl_jax.agent.context_ids import ContextIds
from agentrl_jax.agent.trajectory import Trajectory


def test_follows_the_current_chunk_through_appends_and_new_chunks():
    traj = Trajectory(env="e", task_id="t", group_id=0, sample_index=0)
    context = ContextIds()
    traj.append([5, 6, 7], generated=False, turn=-1)
    first = context.of(traj)
    assert isinstance(first, array) and first.typecode == "i"
    assert first.tolist() == traj.context_ids() == [5, 6, 7]
    traj.append([8, 9], generated=True, turn=0, logprobs=[-0.1, -0.2])
    traj.append([10], generated=False, turn=0)
    again = context.of(traj)
    assert again is first and again.tolist() == traj.context_ids() == [5, 6, 7, 8, 9, 10]
    assert context.of(traj) is first and first.tolist() == [5, 6, 7, 8, 9, 10]  # no new ids
    traj.start_chunk([1, 2])  # a history window's new chunk: the array starts again
    fresh = context.of(traj)
    assert fresh is not first and fresh.tolist() == traj.context_ids() == [1, 2]
    assert first.tolist() == [5, 6, 7, 8, 9, 10]  # the old chunk's array is left as it was
    traj.append([3], generated=True, turn=1, logprobs=[-0.3])
    assert context.of(traj).tolist() == traj.context_ids() == [1, 2, 3]
