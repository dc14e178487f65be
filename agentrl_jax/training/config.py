"""The base experiment config (ml-collections); experiment files start from ``base_config()``.

Every key can be overridden from the command line: ``--config.learner.kl_coef=0.01``.
"""

from __future__ import annotations

from ml_collections import ConfigDict


def base_config() -> ConfigDict:
    c = ConfigDict()
    c.seed = 0
    c.progress = False  # force progress bars even when stderr is not a terminal
    c.progress_seconds = 30.0  # without a terminal: a progress line this often in long phases

    c.model = ConfigDict()
    c.model.name = "smollm2"  # known name, HF directory or .gguf path
    c.model.dtype = "float32"  # rollout / forward compute dtype of the loaded model
    c.model.random_init = ConfigDict()  # non-empty: random model of this shape (smoke tests)
    c.model.pad_id = 2

    c.env = ConfigDict()
    c.env.names = "babyai"  # comma-separated environment families
    c.env.urls = ConfigDict()  # <name>: "http://host:port,..." ; empty = start servers here
    c.env.server_args = ConfigDict()  # <name>: extra server flags, e.g. "--max-sessions 512"
    c.env.task_filter = ConfigDict()  # <name>: regex a task id must fully match (train and test)
    c.env.replicas = 1
    c.env.timeout = 120.0
    c.env.max_restarts = 3  # a server started here that dies is restarted this often at most

    c.rollout = ConfigDict()
    c.rollout.backend = "embedded"  # embedded | engine_servers (a process per replica) | sglang
    c.rollout.urls = ""  # sglang servers, comma-separated
    c.rollout.api_key = ""  # sglang servers' --api-key ("": $AGENTRL_ROLLOUT_API_KEY, else none)
    c.rollout.max_batch = 64  # engine slots
    c.rollout.max_context = 4096  # tokens per episode (prompt + all turns)
    c.rollout.max_new_tokens = 24  # per turn: one action line (react needs ~128, use_react)
    c.rollout.stop = ("\n",)  # strings that end a turn: an action is one line
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = -1
    c.rollout.max_concurrency = 64  # episodes in flight
    c.rollout.engine_dtype = ""  # "" = model dtype; "bfloat16" on GPU/TPU
    c.rollout.decode_steps = 16
    # embedded engine placement: one replica per group of `tensor_parallel` local devices
    # (0 = every group: all local accelerators decode, one engine on CPU; N = the first N)
    c.rollout.engine_replicas = 0
    c.rollout.tensor_parallel = 1
    # auto (ragged_fused on GPU) | ragged_fused | ragged | dense
    c.rollout.decode_attention = "auto"
    # decode GEMMs: auto (merged q/k/v and gate/up on cuBLAS for a one-GPU engine) | xla |
    # merged | merged_cublas (EngineConfig.decode_gemm)
    c.rollout.decode_gemm = "auto"
    # free the engines' KV cache during each learner update (allocated again after the weight
    # sync; cached prefixes go): the update gets that memory on shared devices. Only without
    # overlap (train.max_staleness = 0); engine servers and SGLang get /release_memory_occupation
    # (SGLang frees memory only with --enable-memory-saver)
    c.rollout.release_kv_during_update = False
    # prefill attends over a KV-length bucket of each row: "" (off: the whole row), "auto"
    # (powers of two from 512) or a comma list of lengths; more prefill shapes to compile
    c.rollout.prefill_kv_buckets = ""
    c.rollout.parser = "react"
    # episodes in N spawned worker processes (0: in the trainer's process; docs/ROLLOUT.md);
    # with an HTTP backend (engine_servers, sglang) the workers post to the servers themselves
    # unless actor_workers_direct is False (then every request is relayed by the trainer)
    c.rollout.actor_workers = 0
    c.rollout.actor_workers_direct = True

    # Answer format. The default model (SmolLM2-135M-Instruct) cannot follow a ReAct format at
    # temperature 1 (4-6% parsable actions, most turns hit the token cap; docs/RESULTS.md,
    # benchmarks/action_format.py), so each assistant turn is opened with "Action:", the model
    # only completes the action and the turn ends at the line break. Larger models: use_react(c).
    c.agent = ConfigDict()
    c.agent.prompt_style = "action"  # action (Action only) | react (Thought + Action)
    c.agent.response_prefix = "Action:"  # text opening every assistant turn ("" for none)
    # > 0: every observation ends with up to this many of the environment's valid actions, in
    # the family's order (the servers' list_actions; ScienceWorld and BabyAI have such lists,
    # BabyAI's observations show theirs always); 0: off
    c.agent.list_valid_actions = 0

    c.horizon = ConfigDict()
    c.horizon.type = "scaling_inter"  # scaling_inter | fixed
    c.horizon.phases = (6, 13, 20)
    c.horizon.steps_per_phase = 100
    c.horizon.turns = 20  # for type=fixed

    c.train = ConfigDict()
    c.train.total_steps = 300
    c.train.tasks_per_step = 16
    c.train.samples_per_task = 8  # GRPO group size
    c.train.save_every = 25
    c.train.keep_checkpoints = 3
    c.train.eval_every = 50
    c.train.eval_before = True
    c.train.eval_after = True
    c.train.max_staleness = 0  # >= 1: next rollout overlaps the update (off-policy by <= N)
    # drop groups whose samples all scored the same (group advantages are 0 there; see
    # training/batching.py::informative_groups); for group estimators (GRPO / RLOO / Dr.GRPO)
    c.train.skip_flat_groups = False
    c.train.max_seconds = 0.0  # > 0: stop training after this many seconds (then eval_after)
    c.train.eval_tasks = 64
    c.train.eval_samples = 4  # k of Avg@k / Pass@k
    c.train.eval_horizon = 20
    # an evaluation is a result only if at least this share of its tasks was scored (a task is
    # scored when one of its episodes finished without an environment / engine error)
    c.train.eval_min_scored = 0.9
    # stop the run (exit code 3) when more than this share of the episodes of the last
    # env_error_window rollouts ended with env_error (environment servers failing)
    c.train.max_env_error_rate = 0.5
    c.train.env_error_window = 10
    # stop the run (exit code 3) after this many consecutive steps with nothing to train on
    # (every episode ended with engine_error / env_error, or was too stale); 0: never
    c.train.max_failed_steps = 3

    # LearnerConfig fields (agentrl_jax/learner/config.py); the paper's GRPO settings.
    c.learner = ConfigDict()
    c.learner.advantage_estimator = "grpo"
    c.learner.learning_rate = 1e-6
    c.learner.lr_schedule = "constant"
    c.learner.grad_clip = 1.0
    c.learner.kl_coef = 0.001
    c.learner.kl_estimator = "k3"
    c.learner.entropy_coef = 0.001
    c.learner.clip_ratio_low = 0.2
    c.learner.clip_ratio_high = 0.2
    c.learner.loss_agg_mode = "token_mean"
    c.learner.micro_batch_size = 8
    c.learner.mini_batches = 1
    c.learner.epochs = 1
    c.learner.dtype = "float32"
    c.learner.remat = True
    c.learner.mesh = ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
    return c


def use_ppo(c: ConfigDict) -> ConfigDict:
    """PPO with a critic (GAE) instead of GRPO."""
    c.learner.advantage_estimator = "gae"
    c.learner.gamma = 1.0
    c.learner.lam = 1.0
    c.learner.critic_learning_rate = 1e-5
    c.learner.value_clip = 0.5
    c.train.samples_per_task = 1
    c.train.tasks_per_step = 64
    return c


def use_react(c: ConfigDict, max_new_tokens: int = 128) -> ConfigDict:
    """ReAct answers (a ``Thought:`` line, then an ``Action:`` line) for models that follow
    that format (check a model with ``benchmarks/action_format.py --model M --styles react``);
    a turn then needs ~128 tokens. On the command line: ``--config.agent.prompt_style=react
    --config.agent.response_prefix= --config.rollout.stop="()"
    --config.rollout.max_new_tokens=128``."""
    c.agent.prompt_style = "react"
    c.agent.response_prefix = ""
    c.rollout.max_new_tokens = max_new_tokens
    c.rollout.stop = ()  # the Thought line comes first
    return c


def use_fixed_horizon(c: ConfigDict, turns: int) -> ConfigDict:
    c.horizon.type = "fixed"
    c.horizon.turns = turns
    return c


def model_label(name: str, random_init) -> str:
    """How progress lines and reports name the policy: ``name``, or for ``model.random_init``
    a random model's shape and whose tokenizer it uses, e.g. ``"random 28 layers x 3584 hidden
    (tokenizer of smollm2)"``."""
    if not random_init:
        return str(name)
    shape = dict(random_init)
    parts = [f"{shape[key]} {word}" for key, word in (("num_layers", "layers"),
                                                      ("hidden_size", "hidden")) if key in shape]
    return f"random {' x '.join(parts) or 'model'} (tokenizer of {name})"
