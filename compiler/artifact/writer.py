"""Write an artifact folder atomically: weights, kernels, plan, report, and the manifest last.

Everything goes into a temporary sibling folder first; only a complete folder is renamed into
place. Nothing written depends on time, temp paths or dict-iteration accidents, so two compiles
of the same model with the same options are byte-identical.

The manifest marks the parts a deployment can do without ``"optional": true``: the memory report,
the portable CPU build and the golden self-test cases. ``onnx-aot strip DIR`` removes them
(``runtime/strip.py``); an artifact missing them still loads and runs.
"""

from __future__ import annotations

import json
import platform
import shutil
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from typing import NamedTuple

from compiler.artifact.atomic import make_temp_dir
from compiler.artifact.atomic import replace_dir
from compiler.artifact.atomic import sweep_leftovers
from compiler.artifact.c_header import write_c_header
from compiler.artifact.cpu_target import cpu_target
from compiler.artifact.report import render_memory_html
from compiler.codegen.options import BuildOptions
from compiler.plan import CompiledPlan
from compiler.plan import attach_code
from compiler.providers.base import Generated
from compiler.providers.base import GeneratedC
from compiler.providers.base import GeneratedCuda
from compiler.providers.base import Provider
from compiler.version import __version__
from runtime.artifact import MANIFEST
from runtime.artifact import PLAN
from runtime.artifact import WEIGHTS
from runtime.artifact import sha256_file
from runtime.cli import folder_problem
from runtime.errors import CompileError
from runtime.errors import OnnxAotError
from runtime.integrity import sampled_sha256
from runtime.plan_schema import CudaModule
from runtime.plan_schema import Plan

__all__ = ["ModelSource", "write_artifact", "dump_json", "check_out_dir", "OPTIONAL_FILES"]

KERNEL_DIRS = {"host": "kernels/cpu", "cuda": "kernels/cuda"}
OPTIONAL_FILES = ("golden.json", "golden.bin", "report/memory.json", "report/memory.html")


class ModelSource(NamedTuple):
    """The manifest's ``source``: the model's file name, sha256 and size in bytes (None: no file,
    e.g. a graph built in memory; ``onnx-aot inspect`` compares the weights with it)."""

    file: str
    sha256: str
    nbytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"file": self.file, "sha256": self.sha256}
        if self.nbytes is not None:
            data["nbytes"] = self.nbytes
        return data


def check_out_dir(out: Path) -> None:
    """Refuse an artifact folder that cannot be written (a file, a path under a file, a folder
    that is not an artifact, a read-only parent): ``CompileError`` naming it, before any work."""
    problem = folder_problem(out, replaced=True)
    if problem is not None:
        raise CompileError(f"{out}: {problem}")


def dump_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def write_artifact(
    out: Path,
    compiled: CompiledPlan,
    providers: list[Provider],
    build: BuildOptions,
    source: ModelSource,
    options: dict[str, Any],
    say: Callable[[str], None],
    extra_files: Mapping[str, bytes] | None = None,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Write the artifact into a temporary sibling of ``out`` and rename it into place.

    ``extra_files`` (artifact-relative path -> bytes, e.g. the golden self-test) are written and
    hashed like the rest. ``check`` gets the complete temporary folder before the rename
    (``compiler/artifact/check.py``); when it raises, nothing is left: no temporary folder, no
    parent folder this call made, and whatever ``out`` held stays.
    """
    out = out.absolute()
    check_out_dir(out)
    made = _missing_parents(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(out)  # temp folders of killed compiles into the same place
    tmp = make_temp_dir(out)
    try:
        for rel, data in sorted((extra_files or {}).items()):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        _write_into(tmp, compiled, providers, build, source, options, say)
        if check is not None:
            check(tmp)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:  # innermost first; only while empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return out


def _missing_parents(out: Path) -> list[Path]:
    """The parent folders of ``out`` that do not exist yet, innermost first."""
    missing = []
    for parent in out.parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def _write_into(tmp: Path, compiled: CompiledPlan, providers: list[Provider], build: BuildOptions,
                source: ModelSource, options: dict[str, Any], say: Callable[[str], None]) -> None:
    (tmp / WEIGHTS).write_bytes(compiled.weights)
    plan = compiled.plan
    generated: dict[str, GeneratedC | GeneratedCuda] = {}
    for provider in providers:
        parts = [p for p in compiled.partitions if p.provider == provider.name]
        if not parts:
            continue
        rel_dir = KERNEL_DIRS.get(provider.memory_space, f"kernels/{provider.memory_space}")
        kernels_dir = tmp / rel_dir
        kernels_dir.mkdir(parents=True, exist_ok=True)
        try:
            code = provider.generate(parts, kernels_dir, build)
        except OnnxAotError:
            raise
        except Exception as exc:  # a provider bug must still surface as our error type
            raise CompileError(f"provider {provider.name!r} failed to generate code: {exc}") from exc
        if not any(kernels_dir.iterdir()):
            kernels_dir.rmdir()
            if not any(kernels_dir.parent.iterdir()):
                kernels_dir.parent.rmdir()
        plan = _attach_code(plan, provider.name, rel_dir, code)
        if code is not None:
            generated[provider.name] = code
        if isinstance(code, GeneratedC):
            say(f"built {rel_dir}/{code.library}")
    if options.get("target", "cpu") == "cpu" or any(p.runner == "c" for p in plan.partitions):
        write_c_header(tmp / KERNEL_DIRS["host"], plan)  # run from C without Python (docs/deploy.md)
    (tmp / PLAN).write_bytes(dump_json(plan.to_json()))
    report_dir = tmp / "report"
    report_dir.mkdir()
    (report_dir / "memory.json").write_bytes(dump_json(compiled.memory_report))
    (report_dir / "memory.html").write_text(render_memory_html(plan, compiled.memory_report),
                                            encoding="utf-8")
    target: dict[str, Any] = {"machine": platform.machine(),
                              "providers": {name: code.manifest() for name, code in generated.items()}}
    for code in generated.values():
        if isinstance(code, GeneratedC):  # a native CPU build
            target["cpu"] = _cpu_target(code)
    optional = set(OPTIONAL_FILES)
    for build_record in target.get("cpu", {}).get("builds", [])[1:]:  # the portable builds
        optional.update((build_record["library"], build_record["source"]))
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        rel = path.relative_to(tmp).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
        if rel == WEIGHTS:  # what the default (fast) load checks
            files[rel]["sample_sha256"] = sampled_sha256(path)
        if rel in optional:
            files[rel]["optional"] = True
    manifest = {
        "format_version": plan.format_version,  # the oldest that reads it (runtime/plan_schema.py)
        "compiler": {"name": "onnx-aot", "version": __version__},
        "source": source.to_json(),
        "options": options,
        "target": target,
        "files": files,
    }
    (tmp / MANIFEST).write_bytes(dump_json(manifest))


def _attach_code(plan: Plan, provider: str, rel_dir: str, code: Generated) -> Plan:
    """``plan`` with the code ``provider`` generated: its C library, or its CUDA module (source,
    cubins per arch, PTX) and each step's launches (in plan.json: the manifest stays small)."""
    if isinstance(code, GeneratedC):
        return attach_code(plan, provider, library=f"{rel_dir}/{code.library}")
    if isinstance(code, GeneratedCuda):
        module = CudaModule(f"{rel_dir}/{code.source}",
                            {arch: f"{rel_dir}/{name}" for arch, name in sorted(code.cubins.items())},
                            f"{rel_dir}/{code.ptx}" if code.ptx else None)
        return attach_code(plan, provider, module=module, launches=code.launches)
    return plan


def _cpu_target(code: GeneratedC) -> dict[str, Any]:
    """The manifest's ``target.cpu``: the preferred build's features and every build, preferred
    first (runtime/cpu_builds.py)."""
    first = code.builds[0]
    cpu = cpu_target(code.cc, list(first.flags), first.isa)
    rel_dir = KERNEL_DIRS["host"]
    cpu["builds"] = [
        {"library": f"{rel_dir}/{b.library}", "source": f"{rel_dir}/{b.source}", "march": b.isa,
         "flags": list(b.flags), "features": cpu_target(code.cc, list(b.flags), b.isa)["features"]}
        for b in code.builds]
    return cpu
