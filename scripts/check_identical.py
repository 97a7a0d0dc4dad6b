"""Issue 30's refactor check: static artifacts byte-identical before and after a change.

Compiles the nine light-zoo models (random weights, seed 0) and the fetched real models at their
static shapes twice -- once with the code of a base revision (checked out in a temporary git
worktree), once with the working tree -- and compares the files a refactor must not change
(``plan.json``, ``model.c``, and every other generated source). Prints one line per model and exits 1
when any differs.

    python -m scripts.check_identical                 # against main
    python -m scripts.check_identical --base HEAD~3 resnet50 silero-vad-16k-op15
"""

from __future__ import annotations

import argparse
import filecmp
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from scripts.fetch_models import MODELS
from scripts.fetch_models import RegistryUnreachableError
from scripts.fetch_models import fetch
from tests.support.zoo import ZOO
from tests.support.zoo import zoo_model

ROOT = Path(__file__).resolve().parent.parent
COMPARED = ("plan.json", "*.c", "*.h", "*.cu")


def _inputs(names: list[str], into: Path) -> dict[str, tuple[Path, list[str]]]:
    """Model file and compile options of each chosen model (zoo files written into ``into``)."""
    chosen: dict[str, tuple[Path, list[str]]] = {}
    for name in ZOO:
        if not names or name in names:
            path = into / f"{name}.onnx"
            onnx.save(zoo_model(name), str(path))
            chosen[name] = (path, [])
    real = [m for m in MODELS if not names or m.name in names]
    try:
        paths = fetch(real, say=lambda msg: print(msg, file=sys.stderr)) if real else {}
    except RegistryUnreachableError as exc:
        print(f"real models left out: {exc}", file=sys.stderr)
        paths = {}
    for model in real:
        if model.name in paths:
            flags = [word for flag in model.cli_options() for word in flag.split(" ", 1)]
            chosen[model.name] = (paths[model.name], flags)
    return chosen


def _compile(tree: Path, model: Path, options: list[str], out: Path) -> str | None:
    """Compile with the code of ``tree``; the error text when it fails."""
    cmd = [sys.executable, "-m", "compiler", "compile", str(model), "-o", str(out), "-q",
           "--golden-cases", "0", *options]
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def _differences(a: Path, b: Path) -> list[str]:
    files = sorted({p.relative_to(a) for pattern in COMPARED for p in a.rglob(pattern)}
                   | {p.relative_to(b) for pattern in COMPARED for p in b.rglob(pattern)})
    return [str(f) for f in files
            if not ((a / f).is_file() and (b / f).is_file() and filecmp.cmp(a / f, b / f, shallow=False))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    parser.add_argument("models", nargs="*", help="zoo or real model names (default: all)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onnx-aot-identical-") as tmp:
        work = Path(tmp)
        base = work / "base"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), args.base],
                       cwd=ROOT, check=True)
        try:
            return _compare_all(work, base, args.models)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)


def _compare_all(work: Path, base: Path, names: list[str]) -> int:
    (work / "models").mkdir()
    chosen = _inputs(names, work / "models")
    failed = 0
    for name, (path, options) in chosen.items():
        before, after = work / "before" / name, work / "after" / name
        errors = [_compile(base, path, options, before), _compile(ROOT, path, options, after)]
        if any(errors):
            line = f"compile failed: before {errors[0] or 'ok'}; after {errors[1] or 'ok'}"
            failed += 1
        else:
            diff = _differences(before, after)
            line = "identical" if not diff else "DIFFERS: " + ", ".join(diff)
            failed += bool(diff)
        print(f"{name:32s} {line}", flush=True)
    print(f"{len(chosen) - failed} of {len(chosen)} models identical")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
