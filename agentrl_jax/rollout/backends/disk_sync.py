"""Weight sync to HTTP rollout servers through disk: SGLang (PyTorch) cannot receive JAX arrays,
so ``update_weights(model)`` exports a HF safetensors directory (``save_hf_directory``, in
``export_dtype``) that every server can read, then posts ``/update_weights_from_disk`` to each
server in parallel (``flush_cache`` asks each to drop its prefix cache as it loads). A mixin of
:class:`~agentrl_jax.rollout.backends.sglang.SGLangBackend` (``self.servers``, ``_post_one``,
``_forget_sessions``, ``export_dir``, ``export_dtype``, ``tokenizer``)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

from agentrl_jax.rollout.contract import RolloutError


class DiskWeightSync:
    """``update_weights`` through a safetensors export; ``self`` is an ``SGLangBackend``."""

    async def update_weights(self, params: Any = None, *, path: str | None = None,
                             version: str | None = None, tokenizer: Any = None,
                             flush_cache: bool = True, abort_all: bool = False) -> str:
        """Push new weights to every server: ``params`` (a CausalLM) is exported to a HF
        safetensors directory first; ``path`` is used as is. Returns the directory loaded."""
        if (params is None) == (path is None):
            raise ValueError("pass exactly one of params or path")
        if params is not None:
            path = await asyncio.to_thread(self._export, params, tokenizer or self.tokenizer)
        body: dict[str, Any] = {"model_path": path, "load_format": "auto",
                                "flush_cache": flush_cache, "abort_all_requests": abort_all}
        if version is not None:
            body["weight_version"] = str(version)
        results = await asyncio.gather(*[self._post_one(i, "/update_weights_from_disk", body)
                                         for i in range(len(self.servers))],
                                       return_exceptions=True)
        failed = [f"{s.url}: {r}" for s, r in zip(self.servers, results)
                  if isinstance(r, BaseException) or not (isinstance(r, dict) and r.get("success"))]
        if failed:
            raise RolloutError("update_weights_from_disk failed on " + "; ".join(failed))
        if flush_cache:  # the servers flushed their caches as they loaded (SGLang and ours)
            self._forget_sessions()
        self.weight_version = version
        return path

    def _export(self, params: Any, tokenizer: Any) -> str:
        from flax import nnx

        from agentrl_jax.models.pretrained import Pretrained
        from agentrl_jax.models.safetensors_io import save_hf_directory

        if isinstance(params, Pretrained):
            tokenizer = tokenizer or params.tokenizer
            params = params.model
        if not isinstance(params, nnx.Module):
            raise TypeError("SGLangBackend.update_weights(params) needs a CausalLM "
                            "(export goes through save_hf_directory)")
        if self.export_dir is None:
            self.export_dir = tempfile.mkdtemp(prefix="agentrl-weights-")
        directory = os.path.join(self.export_dir, "current")
        dtype = self.export_dtype or params.cfg.param_dtype
        save_hf_directory(params, directory, tokenizer=tokenizer, dtype=dtype)
        return directory


__all__ = ["DiskWeightSync"]
