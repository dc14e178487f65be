"""GiGPO advantages vs a float64 NumPy loop written from the paper's equations, hand-computed
cases, and order independence (rows in any order, trajectories assembled in any order).

All random batches share one shape ``[B, T] = [10, 40]`` with ``K = 8`` turn slots, so every
option set compiles once.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from agentrl_jax.algorithms import compute_advantages, is_turn_level

B, T, K = 10, 40, 8
TOL = dict(rtol=2e-5, atol=2e-5)


# ----------------------------------------------------------------------------- reference


def gigpo_reference(rewards, loss_mask, group_ids, turn_ids, turn_rewards, turn_anchors, *,
                    gamma, omega, norm_std, eps=1e-6, token_rewards=None):
    """Float64 loops over episodes, turns and tokens (the paper's equations)."""
    rewards = np.asarray(rewards, np.float64)
    m = np.asarray(loss_mask) != 0
    nb, nk = np.asarray(turn_anchors).shape
    valid = m.any(axis=1)
    score = rewards.copy()
    r = np.asarray(turn_rewards, np.float64).copy()
    if token_rewards is not None:
        for b in range(nb):
            for t in range(m.shape[1]):
                if m[b, t]:
                    score[b] += token_rewards[b, t]
                    if 0 <= turn_ids[b, t] < nk:
                        r[b, turn_ids[b, t]] += token_rewards[b, t]

    def norm(x, xs):
        if len(xs) < 2:
            return 0.0
        mean = sum(xs) / len(xs)
        if not norm_std:
            return x - mean
        std = (sum((v - mean) ** 2 for v in xs) / (len(xs) - 1)) ** 0.5
        return (x - mean) / (std + eps)

    groups = defaultdict(list)
    for b in range(nb):
        if valid[b]:
            groups[group_ids[b]].append(score[b])
    a_ep = [norm(score[b], groups[group_ids[b]]) if valid[b] else 0.0 for b in range(nb)]

    has = [[valid[b] and turn_anchors[b][k] >= 0 for k in range(nk)] for b in range(nb)]
    G = np.zeros((nb, nk))
    for b in range(nb):
        for k in range(nk):
            if has[b][k]:
                G[b, k] = sum(gamma ** (j - k) * r[b, j] for j in range(k, nk) if has[b][j])
    steps = defaultdict(list)
    for b in range(nb):
        for k in range(nk):
            if has[b][k]:
                steps[(group_ids[b], turn_anchors[b][k])].append(G[b, k])
    a_step = np.zeros((nb, nk))
    for b in range(nb):
        for k in range(nk):
            if has[b][k]:
                a_step[b, k] = norm(G[b, k], steps[(group_ids[b], turn_anchors[b][k])])

    adv = np.zeros(m.shape)
    for b in range(nb):
        for t in range(m.shape[1]):
            if m[b, t]:
                k = turn_ids[b, t]
                adv[b, t] = a_ep[b] + (omega * a_step[b, k] if 0 <= k < nk else 0.0)
    return adv


# ----------------------------------------------------------------------------- data


def random_batch(seed: int, token_rewards: bool = False):
    """Multi-turn rows (prompt, then generated / observation spans per turn, padding), group
    ids unsorted with a singleton, anchors from a small set (repeats within and across
    episodes), a fully masked row, turn slots beyond each episode's turns marked -1."""
    rng = np.random.default_rng(seed)
    m = np.zeros((B, T), np.float32)
    tid = np.full((B, T), -1, np.int64)
    turns = np.zeros(B, np.int64)
    for b in range(B):
        t = int(rng.integers(1, 5))
        k = 0
        while k < K and t < T - 2:
            n = int(rng.integers(1, 4))
            m[b, t:t + n] = 1
            tid[b, t:t + n] = k
            t += n
            o = int(rng.integers(1, 4))
            tid[b, t:t + o] = k  # the observation after turn k (mask 0)
            t += o
            k += 1
            if rng.random() < 0.15:
                break
        turns[b] = k
    m[:, T - 1] = 0
    tid[m.sum(1) == 0] = -1
    m[7] = 0  # a fully masked row (padding)
    anchors = np.full((B, K), -1, np.int64)
    rewards_turn = np.zeros((B, K), np.float32)
    for b in range(B):
        for k in range(turns[b]):
            anchors[b, k] = int(rng.integers(0, 4)) if k else 100  # turn 0: the task's start
            rewards_turn[b, k] = float(rng.choice([0.0, 0.0, 0.5, 1.0]))
    group_ids = np.array([42, -3, 42, 9, -3, 42, 9, 9, 5, -3])  # 5: a singleton
    out = dict(rewards=rewards_turn.sum(1), loss_mask=m, group_ids=group_ids, turn_ids=tid,
               turn_rewards=rewards_turn, turn_anchors=anchors)
    if token_rewards:
        out["token_rewards"] = rng.normal(0, 0.1, (B, T)).astype(np.float32)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma,omega,norm_std", [(0.95, 1.0, True), (1.0, 0.5, False)])
def test_matches_float64_reference(seed, gamma, omega, norm_std):
    batch = random_batch(seed)
    out = compute_advantages("gigpo", **batch, gamma=gamma, omega=omega, norm_std=norm_std)
    ref = gigpo_reference(**batch, gamma=gamma, omega=omega, norm_std=norm_std)
    np.testing.assert_allclose(np.asarray(out.advantages), ref, **TOL)
    assert np.all(np.asarray(out.advantages)[batch["loss_mask"] == 0] == 0)
    assert np.all(np.asarray(out.advantages)[7] == 0)


def test_matches_reference_with_token_rewards():
    batch = random_batch(5, token_rewards=True)
    out = compute_advantages("gigpo", **batch, gamma=0.9, omega=1.0, norm_std=True)
    ref = gigpo_reference(**batch, gamma=0.9, omega=1.0, norm_std=True)
    np.testing.assert_allclose(np.asarray(out.advantages), ref, **TOL)


def test_registered_and_turn_level():
    assert is_turn_level("gigpo") and is_turn_level("GiGPO") and not is_turn_level("grpo")
    with pytest.raises(ValueError, match="turn_ids"):
        compute_advantages("gigpo", rewards=np.zeros(2), loss_mask=np.ones((2, 3)),
                           group_ids=np.zeros(2, np.int32))


# ----------------------------------------------------------------------------- hand cases


def _two_turn_rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n rows of ``prompt | turn 0 (2 tokens) | obs | turn 1 (1 token) | obs | turn 2 (1)``."""
    m = np.zeros((n, 10), np.float32)
    tid = np.full((n, 10), -1)
    m[:, 1:3] = 1
    tid[:, 1:4] = 0
    m[:, 4] = 1
    tid[:, 4:6] = 1
    m[:, 6] = 1
    tid[:, 6:8] = 2
    return m, tid


def _per_turn(adv: np.ndarray) -> np.ndarray:
    """[n, 3]: the advantage of turns 0, 1, 2 (read at tokens 1, 4, 6)."""
    return np.asarray(adv)[:, [1, 4, 6]]


def test_hand_repeated_states():
    """Three episodes of one task. Turn 0 acts from the start state S for all three; episodes
    0 and 1 reach state X at turn 1, episode 2 reaches Y; turn 2 acts from Z in episodes 0 and
    2, from W in episode 1. Rewards only at the end: 1, 0, 1 (gamma 0.5, F = 1).

    A^E = R - 2/3 = [1/3, -2/3, 1/3].
    G (per turn): ep0 [0.25, 0.5, 1], ep1 [0, 0, 0], ep2 [0.25, 0.5, 1].
    turn 0, group S {0.25, 0, 0.25}: mean 1/6 -> A^S = [1/12, -1/6, 1/12].
    turn 1, group X {0.5, 0} (ep0, ep1): mean 0.25 -> [0.25, -0.25]; Y occurs once -> 0.
    turn 2, group Z {1 (ep0), 1 (ep2)}: mean 1 -> 0, 0; W occurs once -> 0.
    """
    m, tid = _two_turn_rows(3)
    S, X, Y, Z, W = 10, 11, 12, 13, 14
    anchors = np.array([[S, X, Z], [S, X, W], [S, Y, Z]])
    r_turn = np.array([[0, 0, 1], [0, 0, 0], [0, 0, 1]], np.float32)
    out = compute_advantages("gigpo", rewards=r_turn.sum(1), loss_mask=m,
                             group_ids=np.array([4, 4, 4]), turn_ids=tid, turn_rewards=r_turn,
                             turn_anchors=anchors, gamma=0.5, omega=1.0, norm_std=False)
    ep = np.array([1 / 3, -2 / 3, 1 / 3])
    expected = np.stack([ep + np.array([1 / 12, -1 / 6, 1 / 12]),
                         ep + np.array([0.25, -0.25, 0.0]),
                         ep + 0.0], axis=1)
    np.testing.assert_allclose(_per_turn(out.advantages), expected, rtol=1e-6, atol=1e-6)
    # both tokens of turn 0 carry turn 0's advantage; observation tokens carry nothing
    adv = np.asarray(out.advantages)
    np.testing.assert_array_equal(adv[:, 1], adv[:, 2])
    assert np.all(adv[:, [0, 3, 5, 7, 8, 9]] == 0)
    np.testing.assert_allclose(np.asarray(out.returns)[0, [1, 4, 6]], [0.25, 0.5, 1.0])


def test_hand_states_that_occur_once_and_std_normalisation():
    """Two episodes whose turns never share a state after the start: only turn 0 has a step
    group. R = [1, 0]; with std normalisation A^E = +-(0.5 / (std 0.7071 + eps)).
    Turn 0 group {G: 0.81, 0} (gamma 0.9, reward at turn 2): +-0.7071 after normalisation.
    Turns 1 and 2: singletons -> A^S = 0; omega = 2 doubles the step part."""
    m, tid = _two_turn_rows(2)
    anchors = np.array([[1, 2, 3], [1, 4, 5]])
    r_turn = np.array([[0, 0, 1], [0, 0, 0]], np.float32)
    out = compute_advantages("gigpo", rewards=r_turn.sum(1), loss_mask=m,
                             group_ids=np.array([0, 0]), turn_ids=tid, turn_rewards=r_turn,
                             turn_anchors=anchors, gamma=0.9, omega=2.0, norm_std=True)
    s = np.sqrt(0.5)  # std (ddof 1) of {1, 0}, and of {0.81, 0} scaled: 0.81 * s
    a_e = 0.5 / (s + 1e-6)
    a_s = 0.405 / (0.81 * s + 1e-6)
    expected = np.array([[a_e + 2 * a_s, a_e, a_e], [-a_e - 2 * a_s, -a_e, -a_e]])
    np.testing.assert_allclose(_per_turn(out.advantages), expected, rtol=1e-5)


def test_hand_group_where_every_episode_fails_and_other_tasks_do_not_mix():
    """Group 1: every episode fails (all rewards 0): every advantage is 0, even where its
    states repeat. Group 2 (another task) has the same anchor ids and rewards 1 / 0: its
    step groups must not include group 1's turns (otherwise group 1's zeros would shift its
    mean)."""
    m, tid = _two_turn_rows(4)
    anchors = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 9]])
    r_turn = np.array([[0, 0, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0]], np.float32)
    out = compute_advantages("gigpo", rewards=r_turn.sum(1), loss_mask=m,
                             group_ids=np.array([1, 1, 2, 2]), turn_ids=tid,
                             turn_rewards=r_turn, turn_anchors=anchors, gamma=1.0,
                             omega=1.0, norm_std=False)
    adv = _per_turn(out.advantages)
    assert np.all(adv[:2] == 0)
    # group 2: A^E = +-0.5; turns 0, 1 share states (G 1 vs 0): +-0.5; turn 2 differs: 0
    np.testing.assert_allclose(adv[2:], [[1.0, 1.0, 0.5], [-1.0, -1.0, -0.5]], atol=1e-6)


# ----------------------------------------------------------------------------- order


def test_row_order_does_not_matter():
    """The same episodes in another row order (as an asynchronous actor pool delivers them)
    and with other group id values give each episode the same advantages."""
    batch = random_batch(3)
    perm = np.random.default_rng(0).permutation(B)
    relabel = {42: 1000, -3: 7, 9: -50, 5: 3}
    shuffled = {k: np.asarray(v)[perm] for k, v in batch.items()}
    shuffled["group_ids"] = np.array([relabel[g] for g in shuffled["group_ids"]])
    kw = dict(gamma=0.95, omega=1.0, norm_std=True)
    a = np.asarray(compute_advantages("gigpo", **batch, **kw).advantages)
    b = np.asarray(compute_advantages("gigpo", **shuffled, **kw).advantages)
    np.testing.assert_allclose(b, a[perm], rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- pipeline


class SeededBackend:
    """Replies with an action chosen by the turn's sampling seed (so an episode's replies do
    not depend on timing) after a random delay (so episodes finish in a random order); one
    reply in five has no action (an invalid turn: the environment is not stepped)."""

    name = "seeded"
    REPLIES = (" turn left", " turn right", " turn left", " move forward", " ")

    def __init__(self, tokenizer, delays: bool):
        self.tokenizer = tokenizer
        self.rng = np.random.default_rng(7) if delays else None

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        import asyncio

        from agentrl_jax.rollout.contract import GenerateResult

        if self.rng is not None:
            await asyncio.sleep(float(self.rng.uniform(0, 0.02)))
        reply = self.REPLIES[sampling.seed % len(self.REPLIES)] + "\n"
        ids = self.tokenizer.encode(reply, add_special_tokens=False)
        return GenerateResult(output_ids=ids, output_logprobs=[-0.5] * len(ids),
                              finish_reason="stop", prompt_tokens=len(input_ids))


async def _collect(tokenizer, url, tasks, delays: bool, lockstep: bool):
    from agentrl_jax.agent.actor_pool import ActorPool
    from agentrl_jax.agent.chat import ChatFormatter
    from agentrl_jax.agent.parsing import parse_react
    from agentrl_jax.rollout.contract import SamplingParams
    from environments.core.client import EnvClient

    finished = []
    async with EnvClient(url) as client:
        pool = ActorPool(SeededBackend(tokenizer, delays), {"babyai": client},
                         ChatFormatter(tokenizer), SamplingParams(max_new_tokens=8, seed=3),
                         max_context=4096, max_concurrency=16, parser=parse_react,
                         prompt_style="action", response_prefix="Action:", history_turns=0,
                         history_stride=1, option_limits=False, shuffle_options=False)
        trajectories, _ = await pool.collect(tasks, n_samples=4, horizon=6, seed=11,
                                             lockstep=lockstep, progress=finished.append)
    return trajectories, finished


async def test_async_actor_pool_anchors_and_advantages_match_lockstep(tokenizer):
    """Episodes of the asynchronous pool finish in a random order; assembled in that order,
    every episode gets the anchors and GiGPO advantages it gets from a lock-step rollout
    assembled in (group, sample) order. The anchors are checked against an independent
    replay of each episode's actions on a local BabyAI instance (its state keys)."""
    from agentrl_jax.agent.actor_pool import TaskRef
    from agentrl_jax.agent.parsing import parse_react
    from agentrl_jax.agent.trajectory import anchor_state
    from agentrl_jax.training.rl.batching import assemble_batch
    from environments.babyai.env import BabyAIEnv
    from agentrl_common.processes import start_env_server

    with start_env_server("babyai") as server:
        from environments.core.client import EnvClient
        async with EnvClient(server.url) as client:
            ids = (await client.tasks("train"))[:3]
        tasks = [TaskRef("babyai", t) for t in ids]
        sync, _ = await _collect(tokenizer, server.url, tasks, delays=False, lockstep=True)
        async_, order = await _collect(tokenizer, server.url, tasks, delays=True,
                                       lockstep=False)
    key = lambda t: (t.group_id, t.sample_index)  # noqa: E731
    assert [key(t) for t in order] != sorted(key(t) for t in order)  # finished out of order
    by_key = {key(t): t for t in async_}
    for t in sync:
        assert t.ok and by_key[key(t)].turn_states == t.turn_states
        assert len(t.turn_states) == t.num_turns
        # independent replay: turn k's anchor is the state before its action
        env = BabyAIEnv()
        reset = env.reset(t.task_id)
        state, expected = anchor_state(reset.observation, reset.info), []
        for msg in t.messages[2::2]:
            expected.append(state)
            action = parse_react(msg["content"]).action
            if action is not None:
                step = env.step(action)
                state = anchor_state(step.observation, step.info)
        assert t.turn_states == expected
    assert any(len(set(t.turn_states)) < len(t.turn_states) for t in sync)  # repeats exist
    for g in range(3):  # one start state per task
        assert len({t.turn_states[0] for t in sync if t.group_id == g}) == 1

    kw = dict(gamma=0.9, omega=1.0, norm_std=True)

    def per_episode(trajectories):
        batch = assemble_batch(trajectories, pad_id=0)
        # the episodes are not rewarded within 6 random turns: give them a synthetic outcome
        # (one reward per turn reached from a state of the episode's third turn) so that the
        # advantages are not all 0
        rewards = batch.turn_rewards.copy()
        for i, t in enumerate(trajectories):
            for k, s in enumerate(t.turn_states):
                rewards[i, k] = float(int(s[:2], 16) % 3 == 0)
        out = compute_advantages("gigpo", rewards=rewards.sum(1), loss_mask=batch.loss_mask,
                                 group_ids=batch.group_id, turn_ids=batch.turn_ids,
                                 turn_rewards=rewards, turn_anchors=batch.turn_anchors,
                                 **kw)
        adv = np.asarray(out.advantages)
        return {key(t): adv[i, :len(t.token_ids)] for i, t in enumerate(trajectories)}

    a, b = per_episode(sync), per_episode(order)
    assert any(np.any(v != 0) for v in a.values())
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-6)


def test_assembled_anchor_ids():
    """Equal digests within a group share an id, ids are ranks of the group's sorted digests
    (independent of trajectory order); other groups' digests never matter; turn ids follow
    the trajectory; turn slots beyond an episode's turns are -1."""
    from agentrl_jax.agent.trajectory import Trajectory
    from agentrl_jax.training.rl.batching import assemble_batch

    def traj(group, states, rewards):
        t = Trajectory(env="x", task_id="t", group_id=group, sample_index=0)
        t.append([1, 2], generated=False, turn=-1)
        for k, _ in enumerate(states):
            t.append([5, 6], generated=True, turn=k)
            t.append([7], generated=False, turn=k)
        t.num_turns, t.turn_states, t.turn_rewards = len(states), list(states), list(rewards)
        return t

    ts = [traj(0, ["c", "a", "b"], [0, 0, 1]), traj(0, ["c", "b"], [0, 0]),
          traj(1, ["a", "z"], [0, 1])]
    batch = assemble_batch(ts, pad_id=0)
    assert batch.turn_anchors.shape == (3, 8)
    np.testing.assert_array_equal(batch.turn_anchors[:, :3], [[2, 0, 1], [2, 1, -1],
                                                                 [0, 1, -1]])
    assert np.all(batch.turn_anchors[:, 3:] == -1)
    np.testing.assert_array_equal(batch.turn_ids[0], [-1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(batch.turn_ids[2, 8:], [-1, -1, -1])
    np.testing.assert_array_equal(batch.turn_rewards[0, :4], [0, 0, 1, 0])
    rev = assemble_batch(ts[::-1], pad_id=0)
    np.testing.assert_array_equal(rev.turn_anchors, batch.turn_anchors[::-1])


def test_informative_groups_keeps_step_signal():
    """With equal episode rewards a GRPO group is flat; under GiGPO it is flat only when
    every turn reward is 0."""
    from agentrl_jax.agent.trajectory import Trajectory
    from agentrl_jax.training.rl.batching import informative_groups

    def traj(group, turn_rewards):
        t = Trajectory(env="x", task_id="t", group_id=group, sample_index=0)
        t.turn_rewards, t.reward = list(turn_rewards), float(sum(turn_rewards))
        return t

    ts = [traj(0, [0, 1]), traj(0, [0, 0, 1]), traj(1, [0, 0]), traj(1, [0])]
    kept, dropped = informative_groups(ts)
    assert dropped == 2 and kept == []
    kept, dropped = informative_groups(ts, turn_level=True)
    assert dropped == 1 and [t.group_id for t in kept] == [0, 0]


@pytest.mark.parametrize("pack_length", [0, 64])
def test_learner_update_uses_gigpo(pack_length):
    """``advantage_estimator="gigpo"`` from the learner config: the update's advantage
    statistics are those of the estimator on the batch (padded and packed paths)."""
    from agentrl_jax.learner import Learner, UpdateOptions
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.llama import init_model
    from agentrl_jax.sharding.mesh import make_mesh

    import jax

    cfg = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16)
    batch = random_batch(4)
    keep = batch["loss_mask"].sum(1) > 0
    batch = {k: np.asarray(v)[keep] for k, v in batch.items()}
    n, t = batch["loss_mask"].shape
    rng = np.random.default_rng(0)
    learner_batch = {"tokens": rng.integers(0, 128, (n, t)).astype(np.int32),
                     "attention_mask": np.ones((n, t), np.int32),
                     "loss_mask": batch["loss_mask"], "group_id": batch["group_ids"],
                     "reward": batch["rewards"], "turn_ids": batch["turn_ids"],
                     "turn_rewards": batch["turn_rewards"],
                     "turn_anchors": batch["turn_anchors"]}
    learner_batch["rollout_logprobs"] = np.zeros((n, t), np.float32)
    opts = {"omega": 0.7, "norm_std": True}
    learner = Learner(init_model(cfg, seed=0),
                      dict(advantage_estimator="gigpo", advantage_kwargs=opts, gamma=0.9,
                           dtype="float32", remat=False, micro_batch_size=2,
                           min_length_bucket=32, pack_length=pack_length, kl_coef=0.0,
                           entropy_coef=0.0),
                      mesh=make_mesh(devices=jax.devices()[:1]))
    metrics = learner.update(learner_batch, UpdateOptions(log=False))
    ref = gigpo_reference(**batch, gamma=0.9, **opts)[batch["loss_mask"] > 0]
    assert metrics["advantages/mean"] == pytest.approx(ref.mean(), abs=1e-5)
    assert metrics["advantages/min"] == pytest.approx(ref.min(), abs=1e-5)
    assert metrics["advantages/max"] == pytest.approx(ref.max(), abs=1e-5)
