"""Write an artifact folder atomically: weights, kernels, plan, report, and the manifest last.

Everything goes into a temporary sibling folder first; only a complete folder is renamed into
place. Nothing written depends on time, temp paths or dict-iteration accidents, so two compiles
of the same model with the same options are byte-identical.
"""

from __future__ import annotations

import json
import platform
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from compiler.artifact.atomic import make_temp_dir, replace_dir, sweep_leftovers
from compiler.artifact.c_header import write_c_header
from compiler.artifact.cpu_target import cpu_target
from compiler.artifact.report import render_memory_html
from compiler.plan import CompiledPlan, attach_code
from compiler.providers.base import BuildOptions, Provider
from compiler.version import __version__
from runtime.artifact import FORMAT_VERSION, MANIFEST, PLAN, WEIGHTS, sha256_file
from runtime.errors import CompileError, OnnxAotError
from runtime.integrity import sampled_sha256
from runtime.json_fields import Where
from runtime.plan_schema import CudaModule, KernelLaunch, Plan

__all__ = ["write_artifact", "dump_json"]

KERNEL_DIRS = {"host": "kernels/cpu", "cuda": "kernels/cuda"}


def dump_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def write_artifact(
    out: Path,
    compiled: CompiledPlan,
    providers: list[Provider],
    build: BuildOptions,
    source_name: str,
    source_sha256: str,
    options: dict[str, Any],
    say: Callable[[str], None],
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write the artifact into a temporary sibling of ``out`` and rename it into place.

    ``extra_files`` (artifact-relative path -> bytes, e.g. the golden self-test) are written and
    hashed like the rest.
    """
    out = out.absolute()
    if out.exists() and not out.is_dir():
        raise CompileError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise CompileError(f"{out}: folder exists, is not empty and holds no artifact; not overwriting it")
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(out)  # temp folders of killed compiles into the same place
    tmp = make_temp_dir(out)
    try:
        for rel, data in sorted((extra_files or {}).items()):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        _write_into(tmp, compiled, providers, build, source_name, source_sha256, options, say)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_into(tmp: Path, compiled: CompiledPlan, providers: list[Provider], build: BuildOptions,
                source_name: str, source_sha256: str, options: dict[str, Any],
                say: Callable[[str], None]) -> None:
    (tmp / WEIGHTS).write_bytes(compiled.weights)
    plan = compiled.plan
    provider_facts: dict[str, Any] = {}
    for provider in providers:
        parts = [p for p in compiled.partitions if p.provider == provider.name]
        if not parts:
            continue
        rel_dir = KERNEL_DIRS.get(provider.memory_space, f"kernels/{provider.memory_space}")
        kernels_dir = tmp / rel_dir
        kernels_dir.mkdir(parents=True, exist_ok=True)
        try:
            facts = dict(provider.generate(parts, kernels_dir, build))
        except OnnxAotError:
            raise
        except Exception as exc:  # a provider bug must still surface as our error type
            raise CompileError(f"provider {provider.name!r} failed to generate code: {exc}") from exc
        if not any(kernels_dir.iterdir()):
            kernels_dir.rmdir()
            if not any(kernels_dir.parent.iterdir()):
                kernels_dir.parent.rmdir()
        plan = _attach_facts(plan, provider.name, rel_dir, facts)
        if facts:
            provider_facts[provider.name] = facts
        if facts.get("library"):
            say(f"built {rel_dir}/{facts['library']}")
    if options.get("target", "cpu") == "cpu" or any(p.runner == "c" for p in plan.partitions):
        write_c_header(tmp / KERNEL_DIRS["host"], plan)  # run from C without Python (docs/deploy.md)
    (tmp / PLAN).write_bytes(dump_json(plan.to_json()))
    report_dir = tmp / "report"
    report_dir.mkdir()
    (report_dir / "memory.json").write_bytes(dump_json(compiled.memory_report))
    (report_dir / "memory.html").write_text(render_memory_html(plan, compiled.memory_report),
                                            encoding="utf-8")
    files = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        rel = path.relative_to(tmp).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
        if rel == WEIGHTS:  # what the default (fast) load checks
            files[rel]["sample_sha256"] = sampled_sha256(path)
    target: dict[str, Any] = {"machine": platform.machine(), "providers": provider_facts}
    for facts in provider_facts.values():
        if "isa" in facts and "flags" in facts and "library" in facts:  # a native CPU build
            cpu = cpu_target(str(facts["cc"]), list(facts["flags"]), str(facts["isa"]))
            if facts.get("builds"):  # every build, preferred first (runtime/cpu_builds.py)
                rel_dir = KERNEL_DIRS["host"]
                cpu["builds"] = [
                    {"library": f"{rel_dir}/{b['library']}", "source": f"{rel_dir}/{b['source']}",
                     "march": str(b["isa"]), "flags": list(b["flags"]),
                     "features": cpu_target(str(facts["cc"]), list(b["flags"]), str(b["isa"]))["features"]}
                    for b in facts["builds"]]
            target["cpu"] = cpu
    manifest = {
        "format_version": FORMAT_VERSION,
        "compiler": {"name": "onnx-aot", "version": __version__},
        "source": {"file": source_name, "sha256": source_sha256},
        "options": options,
        "target": target,
        "files": files,
    }
    (tmp / MANIFEST).write_bytes(dump_json(manifest))


def _attach_facts(plan: Plan, provider: str, rel_dir: str, facts: dict[str, Any]) -> Plan:
    """``plan`` with the code ``provider`` generated: its C ``library``, its CUDA module (source,
    cubins per arch, PTX) and each step's ``launches`` (moved out of ``facts``: the manifest
    stays small)."""
    launches = facts.pop("launches", None)
    module = None
    if "cubins" in facts:
        cubins = facts["cubins"]
        assert isinstance(cubins, dict)
        module = CudaModule(f"{rel_dir}/{facts['source']}",
                            {arch: f"{rel_dir}/{name}" for arch, name in sorted(cubins.items())},
                            f"{rel_dir}/{facts['ptx']}" if facts.get("ptx") else None)
    where = Where(f"launches of provider {provider!r}")
    by_step = {int(key): tuple(KernelLaunch.from_json(launch, where.item(key).item(k))
                               for k, launch in enumerate(records))
               for key, records in (launches or {}).items()}
    library = facts.get("library")
    return attach_code(plan, provider, library=f"{rel_dir}/{library}" if library else None, module=module,
                       launches=by_step)
