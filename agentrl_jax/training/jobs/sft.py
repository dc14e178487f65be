"""Behaviour cloning (SFT) on recorded expert episodes, with the RL learner and checkpoints.

    python launch/record_experts.py --env babyai --episodes 2000 --out runs/experts \
        --config experiments/babyai.py:sft
    python launch/sft.py --config experiments/babyai.py:sft --workdir runs/babyai_sft
    python launch/run.py --config experiments/babyai.py:grpo_gpu \
        --config.model.name=runs/babyai_sft/model          # RL from the SFT policy

Data: the trajectories ``launch/record_experts.py`` wrote (``sft.data``: a directory holding
``<env>.jsonl`` for every environment of ``env.names``, or comma-separated ``.jsonl`` files),
recorded through the RL rollout path, so their token ids are exactly the layout RL trains on.
Data recorded with another tokenizer or answer format is refused (``<env>.meta.json``).
``sft.only_success`` keeps the successful episodes.

Loss: the learner's ``sft`` policy loss (``learner.policy_loss="sft"``,
``algorithms.losses.sft_policy_loss``) with ``advantages = loss_mask``: the NLL of the
assistant tokens only (prompt, observation and response-prefix tokens have mask 0), per token
with ``loss_agg_mode="token_mean"``. Each step is one ``Learner.update`` on ``sft.batch_size``
episodes (packed rows with ``learner.pack_length``), in a seeded order that is reshuffled every
epoch and is a function of the step, so a resumed run sees the same batches.

Outputs in the workdir: ``checkpoints/`` (the learner's orbax format; the same command resumes
from the latest), ``metrics.jsonl`` / ``tensorboard/`` (``actor/nll`` per step), ``model/`` (a
HF safetensors directory with the tokenizer: what ``--config.model.name=`` of ``launch/run.py``
and ``launch/eval.py`` load), ``trajectories_eval.jsonl.gz`` (the held-out evaluation after
training, ``jobs/evaluate.py``) and ``summary.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any, Sequence

import numpy as np

from agentrl_jax import compile_notice
from agentrl_jax.learner.batch import UpdateOptions
from agentrl_jax.training.config.experiment import config_json, model_label
from agentrl_jax.training.config.sections import RunConfig
from agentrl_jax.training.jobs.record_experts import META_SUFFIX, answer_format, tokenizer_fingerprint
from agentrl_jax.training.outputs.progress import (BAR, LINES, EpisodeProgress, format_seconds,
                                           say_line, timed)

EXPORT_DIR = "model"


def data_files(data: str, envs: Sequence[str]) -> list[str]:
    """The ``.jsonl`` files of ``sft.data``: a directory (``<env>.jsonl`` per environment) or
    comma-separated files."""
    paths = [p.strip() for p in str(data).split(",") if p.strip()]
    if not paths:
        raise ValueError("sft.data names no expert data (record it with "
                         "launch/record_experts.py)")
    files = []
    for p in paths:
        if os.path.isdir(p):
            for env in envs:
                f = os.path.join(p, f"{env}.jsonl")
                if not os.path.exists(f):
                    raise FileNotFoundError(
                        f"no {env} expert data in {p}: python launch/record_experts.py --env "
                        f"{env} --out {p} --config <this SFT config>")
                files.append(f)
        elif os.path.exists(p):
            files.append(p)
        else:
            raise FileNotFoundError(f"expert data {p} not found")
    return files


def sft_problems(config: RunConfig, workdir: str) -> list[str]:
    """What keeps ``launch/sft.py`` from running, one line each, before anything is loaded or
    written: expert data that ``sft.data`` does not name or that is missing
    (:func:`data_files`), and a workdir that cannot be created."""
    from agentrl_jax.training.runtime import services
    from agentrl_jax.training.preflight.validate import workdir_problem

    problems = []
    try:
        data_files(config.sft.data, services.env_names(config))
    except (OSError, ValueError) as e:
        problems.append(f"sft.data: {e}")
    line = workdir_problem(workdir)
    if line:
        problems.append(f"--workdir: {line}")
    return problems


#: what a recording whose meta record predates these keys was made with (the recorder then
#: always parsed with ``react`` and kept the whole history; a window then dropped one turn at
#: a time)
_RECORDED_BEFORE = {"parser": "react", "history_turns": 0, "history_stride": 1}


def check_meta(path: str, fingerprint: str, fmt: dict[str, Any]) -> None:
    """Raise unless ``path`` was recorded with this tokenizer and answer format."""
    meta_path = path[:-len(".jsonl")] + META_SUFFIX if path.endswith(".jsonl") else None
    if meta_path is None or not os.path.exists(meta_path):
        raise FileNotFoundError(f"{path} has no {META_SUFFIX} next to it: record the data with "
                                "launch/record_experts.py")
    with open(meta_path) as f:
        meta = json.load(f)
    problems = []
    if meta.get("tokenizer") != fingerprint:
        problems.append(f"tokenizer {meta.get('tokenizer')} (model {meta.get('model')}) != "
                        f"{fingerprint}")
    for key in ("prompt_style", "response_prefix", "stop"):
        if meta.get(key) != fmt[key]:
            problems.append(f"{key} {meta.get(key)!r} != {fmt[key]!r}")
    for key, recorded_before in _RECORDED_BEFORE.items():
        if meta.get(key, recorded_before) != fmt[key]:
            problems.append(f"{key} {meta.get(key, recorded_before)!r} != {fmt[key]!r}")
    if problems:
        raise ValueError(f"{path} was recorded with another token layout than this config's "
                         f"({'; '.join(problems)}); record it again with this config")


def load_expert_data(files: Sequence[str], fingerprint: str, fmt: dict[str, Any],
                     only_success: bool = True, max_length: int | None = None
                     ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Trainable rows ``{"token_ids", "loss_mask", "env", "task_id"}`` (one per episode; one
    per chunk of a windowed episode) and counts of episodes (read, kept, failed, error,
    too_long, empty)."""
    items: list[dict[str, Any]] = []
    counts = dict(read=0, kept=0, failed=0, error=0, too_long=0, empty=0)
    for path in files:
        check_meta(path, fingerprint, fmt)
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                t = json.loads(line)
                counts["read"] += 1
                if t["status"] in ("env_error", "engine_error"):
                    counts["error"] += 1
                    continue
                if only_success and not (t.get("success") or float(t.get("reward", 0)) > 0):
                    counts["failed"] += 1
                    continue
                if not any(t["loss_mask"]):
                    counts["empty"] += 1
                    continue
                # a windowed episode (agent.history_turns) is several chunks, each the context
                # its turns were generated in: one row each, as in RL (Trajectory.chunk_starts)
                starts = list(t.get("chunk_starts") or [0])
                bounds = list(zip(starts, starts[1:] + [len(t["token_ids"])]))
                if max_length is not None and any(b - a > max_length for a, b in bounds):
                    counts["too_long"] += 1
                    continue
                counts["kept"] += 1
                items += [{"token_ids": np.asarray(t["token_ids"][a:b], np.int32),
                           "loss_mask": np.asarray(t["loss_mask"][a:b], np.float32),
                           "env": t["env"], "task_id": t["task_id"]}
                          for a, b in bounds if any(t["loss_mask"][a:b])]
    return items, counts


def sft_batch(items: Sequence[dict[str, Any]], pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded learner batch; ``advantages = loss_mask`` (the ``sft`` loss weights);
    ``pad_id``: ``model.pad_id``."""
    length = max(len(it["token_ids"]) for it in items)
    b = len(items)
    tokens = np.full((b, length), pad_id, np.int32)
    mask = np.zeros((b, length), np.float32)
    attn = np.zeros((b, length), np.int32)
    for i, it in enumerate(items):
        n = len(it["token_ids"])
        tokens[i, :n] = it["token_ids"]
        mask[i, :n] = it["loss_mask"]
        attn[i, :n] = 1
    return {"tokens": tokens, "loss_mask": mask, "attention_mask": attn, "advantages": mask}


def batch_rows(step: int, n: int, batch_size: int, seed: int) -> np.ndarray:
    """The episodes of SFT step ``step``: epoch ``e = step // ceil(n / batch_size)`` walks a
    permutation seeded by ``(seed, e)``."""
    per_epoch = -(-n // batch_size)
    epoch, j = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[j * batch_size:(j + 1) * batch_size]


class SFTRun:
    """One behaviour-cloning run (see the module docstring); ``run()`` returns the summary."""

    def __init__(self, config: RunConfig, workdir: str, progress: bool = True):
        self.config = config
        self.workdir = os.path.abspath(workdir)
        self.progress_mode = (BAR if progress and (sys.stderr.isatty() or config.progress)
                              else LINES)
        self.export_dir = os.path.join(self.workdir, EXPORT_DIR)
        os.makedirs(self.workdir, exist_ok=True)

    def _say(self, message: str, end: str = "\n") -> None:
        say_line(message, end=end)

    def run(self) -> dict[str, Any]:
        compile_notice.set_announcer(self._say)  # a new length bucket's compile gets a line
        try:
            return asyncio.run(self._run())
        finally:
            compile_notice.set_announcer(None)

    def total_steps(self, n: int) -> int:
        s = self.config.sft
        return s.steps or s.epochs * -(-n // s.batch_size)

    async def _run(self) -> dict[str, Any]:
        from agentrl_jax.learner.learner import Learner
        from agentrl_jax.training.runtime import services
        from agentrl_jax.training.runtime.policy import load_policy
        from agentrl_jax.training.outputs.code_version import code_version
        from agentrl_jax.training.outputs.summary import write_json_atomic

        cfg, s = self.config, self.config.sft
        with open(os.path.join(self.workdir, "config.json"), "w") as f:
            json.dump(config_json(cfg), f, indent=2)
        with timed(self._say, "loading model "
                   + model_label(cfg.model.name, cfg.model.random_init)):
            model, tokenizer, _ = load_policy(cfg)
        pack = cfg.learner.pack_length
        files = data_files(s.data, services.env_names(cfg))
        items, counts = load_expert_data(files, tokenizer_fingerprint(tokenizer),
                                         answer_format(cfg), s.only_success,
                                         max_length=pack or None)
        if not items:
            raise ValueError(f"no trainable expert episode in {files} ({counts})")
        total = self.total_steps(len(items))
        tokens = sum(int(it["loss_mask"].sum()) for it in items)
        self._say(f"expert data: {counts['kept']} episodes ({tokens} assistant tokens) from "
                  f"{', '.join(files)}; dropped {counts['failed']} failed, {counts['error']} "
                  f"errors, {counts['too_long']} longer than {pack}, {counts['empty']} empty; "
                  f"{total} steps of {int(s.batch_size)} episodes")
        learner = Learner(model, cfg.learner,
                          checkpoint_dir=os.path.join(self.workdir, "checkpoints"),
                          max_to_keep=s.keep_checkpoints,
                          log_dir=os.path.join(self.workdir, "tensorboard"),
                          metrics_jsonl=os.path.join(self.workdir, "metrics.jsonl"))
        try:
            start, trained_before = 0, 0.0
            if learner.checkpointer.latest_step() is not None:
                with timed(self._say, "restoring the latest checkpoint"):
                    extras = learner.restore_latest() or {}
                start = int(extras.get("step", 0))
                trained_before = float(extras.get("train_seconds", 0.0))
                self._say(f"resumed at step {start} ({trained_before:.1f} s trained before)")
            last, trained = await self._train(learner, items, start, total, cfg.model.pad_id,
                                              trained_before)
            if last > start or not os.path.exists(os.path.join(self.export_dir, "config.json")):
                learner.wait()
                with timed(self._say, f"exporting the policy to {self.export_dir}"):
                    from agentrl_jax.training.jobs.export import export_policy

                    export_policy(learner.policy_model(), tokenizer, self.export_dir,
                                  dtype="float32")
        finally:
            learner.close()
        evals = {}
        if s.eval_after and cfg.train.eval_tasks:
            evals[last] = await self._evaluate(last)
        summary = {"workdir": self.workdir, "final_step": last, "total_steps": total,
                   "data": counts, "data_files": files, "assistant_tokens": tokens,
                   "model": self.export_dir, "evals": evals,
                   "train_seconds": round(trained, 3), "code": code_version()}
        if last >= total:
            summary["finished_step"] = last
        write_json_atomic(os.path.join(self.workdir, "summary.json"), summary)
        self._say(f"SFT finished: step {last}/{total}; policy in {self.export_dir}"
                  + "".join(f"; eval @ step {k}: avg@{v['k']}={v['avg_at_k']:.3f} (mean score) "
                            f"pass@{v['k']}={v['pass_at_k']:.3f} success="
                            f"{v.get('success_rate') or 0:.3f} ({v['num_tasks']} tasks)"
                            for k, v in evals.items()))
        return summary

    async def _train(self, learner: Any, items: list[dict[str, Any]], start: int, total: int,
                     pad_id: int, trained_before: float = 0.0) -> tuple[int, float]:
        """Steps ``start .. total``, or until ``sft.max_seconds`` of training over every session
        of the run (``trained_before``: the earlier sessions', from the checkpoint; the session's
        first update, its compile, counts only with ``sft.count_first_update``); returns the
        last step and the seconds trained over all sessions."""
        s = self.config.sft
        bs, seed = int(s.batch_size), int(self.config.seed)
        max_seconds, save_every, log_every = s.max_seconds, s.save_every, s.log_every
        per_epoch = -(-len(items) // bs)
        t_start = time.monotonic()
        step = start
        spent = trained_before  # seconds trained over all sessions, as of the last step
        uncounted = 0.0  # the first update's seconds, left out of the budget
        if max_seconds and trained_before >= max_seconds and step < total:
            self._say(f"time budget of {max_seconds:.0f} s already spent ({trained_before:.1f} s "
                      f"trained): no step to train")
            return step, spent
        async with EpisodeProgress(total - start, "sft", self.progress_mode,
                                   self.config.progress_seconds, self._say,
                                   unit="steps") as bar:
            compiled = False
            no_log = UpdateOptions(log=False)  # this loop writes the step's metrics itself
            while step < total:
                t0 = time.monotonic()
                rows = batch_rows(step, len(items), bs, seed)
                batch = sft_batch([items[i] for i in rows], pad_id)
                if compiled:
                    metrics = await asyncio.to_thread(learner.update, batch, no_log)
                else:
                    with timed(self._say, "first update (compiles the train step)"):
                        metrics = await asyncio.to_thread(compile_notice.quietly,
                                                          learner.update, batch, no_log)
                    compiled = True
                    if not s.count_first_update:
                        uncounted = time.monotonic() - t0
                step += 1
                metrics.update({"sft/epoch": step / per_epoch, "sft/episodes": float(len(rows)),
                                "train/step_seconds": time.monotonic() - t0})
                learner.writer.write(step, metrics)
                bar.update()
                if step % log_every == 0 or step == total:
                    self._say(f"[sft step {step}/{total}] nll={metrics.get('actor/nll', 0):.4f} "
                              f"epoch={metrics['sft/epoch']:.2f} "
                              f"grad_norm={metrics.get('actor/grad_norm', 0):.3f} "
                              f"({metrics['train/step_seconds']:.2f} s)")
                spent = trained_before + time.monotonic() - t_start - uncounted
                out_of_time = bool(max_seconds) and spent > max_seconds
                if (save_every and step % save_every == 0) or step == total or out_of_time:
                    learner.save({"step": step, "train_seconds": round(spent, 3)},
                                 step=step, force=True)
                if out_of_time:
                    self._say(f"time budget of {max_seconds:.0f} s reached after step {step}")
                    break
        self._say(f"trained {step - start} steps in "
                  f"{format_seconds(time.monotonic() - t_start)}")
        return step, spent

    async def _evaluate(self, step: int) -> dict[str, Any]:
        """The exported policy on the held-out split (``jobs/evaluate.py``, the RL evaluation's tasks
        and sampling); episodes go to ``trajectories_eval.jsonl.gz`` at ``step``."""
        import dataclasses

        from agentrl_jax.training.jobs.evaluate import run_evaluation

        cfg = self.config.replace(model=self.config.model.replace(name=self.export_dir,
                                                                   random_init={}))
        trajectories: list = []
        t = self.config.train
        result = await run_evaluation(cfg, k=int(t.eval_samples), num_tasks=int(t.eval_tasks),
                                      horizon=int(t.eval_horizon), say=self._say,
                                      progress=self.progress_mode,
                                      trajectories_out=trajectories)
        from agentrl_jax.training.outputs.trajectory_log import TrajectoryLog

        TrajectoryLog(self.workdir, compress=t.compress_trajectories).write(step, trajectories,
                                                                              "eval")
        from agentrl_jax.learner.metrics import MetricsWriter

        writer = MetricsWriter(None, os.path.join(self.workdir, "metrics.jsonl"))
        writer.write(step, result.as_metrics())
        writer.close()
        return dataclasses.asdict(result)


def finished_step(workdir: str) -> int | None:
    """The final step of a finished SFT run in ``workdir`` (its policy exported), else None."""
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    step = summary.get("finished_step")
    exported = os.path.exists(os.path.join(workdir, EXPORT_DIR, "config.json"))
    return step if isinstance(step, int) and exported else None
