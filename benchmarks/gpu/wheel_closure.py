"""The packages a machine without network lacks for a requirement: ``name==version`` lines.

    python3 benchmarks/gpu/wheel_closure.py sglang==0.5.16 --present device_freeze.txt > need.txt
    PACKAGES="$(cat need.txt)" NO_MODEL=1 PART_MB=34 bash benchmarks/gpu/offline_bundle.sh pack DEST

pip resolves the requirements' whole dependency closure for the target machine (Python
``--python-version``, x86-64 Linux wheels, manylinux 2.5 to 2.39) without installing anything
(``pip install --dry-run --report``, run here where PyPI is reachable); the packages the target
already has (``--present``: the output of ``pip freeze`` or ``pip list --format=freeze`` there;
names compared as PEP 503 normalises them, versions ignored unless ``--exact``) are left out.
What is left goes to stdout, one ``name==version`` a line; a summary goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def normalise(name: str) -> str:
    """PEP 503: lowercase, runs of ``-_.`` as ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_present(path: str) -> dict[str, str]:
    """``{normalised name: version}`` from ``pip freeze`` output (``name==version`` lines;
    ``name @ url`` lines count with an empty version; comments and blanks skipped)."""
    present = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, version = line.partition("==")
            name = name.split(" @ ")[0].strip()
            present[normalise(name)] = version.strip()
    return present


def resolve(requirements: list[str], python_version: str) -> list[tuple[str, str]]:
    """``(name, version)`` of every package pip would install for ``requirements`` on the
    target (its own ``--report``)."""
    platforms = [f"manylinux_2_{v}_x86_64" for v in range(5, 40)] + [
        "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64",
        "any"]
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
               "--report", report, "--only-binary=:all:", "--python-version", python_version,
               "--implementation", "cp", "--target", os.path.join(tmp, "target")]
        for p in platforms:
            cmd += ["--platform", p]
        subprocess.run(cmd + requirements, check=True)
        with open(report) as f:
            data = json.load(f)
    return [(i["metadata"]["name"], i["metadata"]["version"]) for i in data["install"]]


def missing(resolved: list[tuple[str, str]], present: dict[str, str], exact: bool = False
            ) -> list[tuple[str, str]]:
    """The resolved packages the target lacks: not present by name (``exact``: or present in
    another version)."""
    out = []
    for name, version in resolved:
        have = present.get(normalise(name))
        if have is None or (exact and have != version):
            out.append((name, version))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("requirements", nargs="+")
    p.add_argument("--present", default=None, help="pip freeze output of the target machine")
    p.add_argument("--python-version", default="3.12")
    p.add_argument("--exact", action="store_true",
                   help="a package present in another version is needed too")
    args = p.parse_args(argv)
    resolved = resolve(args.requirements, args.python_version)
    present = read_present(args.present) if args.present else {}
    need = missing(resolved, present, args.exact)
    for name, version in need:
        print(f"{name}=={version}")
    print(f"{len(resolved)} packages in the closure, {len(resolved) - len(need)} present, "
          f"{len(need)} to carry", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
