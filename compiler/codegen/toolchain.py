"""The C toolchain: compile generated C into a shared library, with a build cache.

``build_units`` compiles a model's translation units -- one per kernel function plus the entries --
into objects and links them into one shared library. Each unit is compiled under a name made of
its hash in a fresh temporary folder, so neither the folder's path nor a timestamp can reach the
binary: two builds of one source are byte-identical (the GNU build-id is a hash of the content).
Objects and libraries are cached by sha256(text, flags, compiler identity, resolved ``-march``) in
the build cache (``compiler.codegen.build_cache``), so an identical kernel is never compiled twice.
A unit is compiled with ``-fopenmp`` only when its text uses OpenMP (``runtime.rebuild.uses_openmp``),
and the library linked against libgomp only when one of them does: kernels on the worker pool
(templates/c/workers.c.j2) need plain pthreads.
``target_info`` tells code generators what the chosen ``-march`` provides (vector width,
register count) so they can size register tiles.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from compiler.codegen.build_cache import BuildCache
from compiler.codegen.build_cache import c_cache_dir
from compiler.codegen.build_cache import content_key
from compiler.codegen.build_cache import copy_atomic
from compiler.codegen.build_cache import trim_output
from compiler.codegen.options import BuildOptions
from runtime.errors import CompileError
from runtime.rebuild import uses_openmp

__all__ = [
    "TargetInfo", "CBuild", "build_units", "compile_flags", "compiler_version", "target_info",
]

SOURCE_NAME = "model.c"
LIBRARY_NAME = "model.so"

# Not -ffast-math: kernels must keep NaN/Inf semantics. -ffp-contract=fast lets gcc form FMAs
# (ISO C mode turns it off); -fno-math-errno lets sqrtf and friends inline; hidden visibility
# keeps the step functions out of the dynamic symbol table (entries are exported explicitly);
# -fopenmp-simd honours `#pragma omp simd` without OpenMP's runtime (libgomp).
_BASE_FLAGS = (
    "-pthread",
    "-fPIC",
    "-shared",
    "-std=c11",
    "-Wall",
    "-Werror",
    "-Wno-psabi",
    "-ffp-contract=fast",
    "-fno-math-errno",
    "-fvisibility=hidden",
    "-fopenmp-simd",
)


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    """What the target ISA offers a kernel generator."""

    march: str  # the resolved -march value ("native" expanded where the compiler says)
    vector_bytes: int  # widest float vector register: 64 (AVX-512), 32 (AVX), 16 otherwise
    vector_registers: int  # architectural vector registers: 32 with AVX-512, else 16
    # the int8 dot product the integer GEMM uses (templates/c/qgemm_tile.c.j2): "avx512vnni",
    # "avxvnni", "avx512bw", "avx2" or "portable"
    int8_dot: str = "portable"
    bf16_dot: bool = False  # AVX512_BF16's vdpbf16ps (bf16 pairs, fp32 sums): --precision auto's bf16
    amx_bf16: bool = False  # AMX-BF16's tiles (compiler/precision.py: bf16_engine)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CompileError(f"cannot run C compiler {argv[0]!r}: {exc}") from exc


@functools.cache
def compiler_version(cc: str) -> str:
    """The first line of ``cc --version`` (names vendor and version)."""
    proc = _run([cc, "--version"])
    if proc.returncode != 0 or not proc.stdout.strip():
        raise CompileError(f"C compiler {cc!r} does not answer --version: {proc.stderr.strip()[:500]}")
    return proc.stdout.strip().splitlines()[0]


@functools.cache
def _resolved_march(cc: str, isa: str) -> str:
    """``-march=native`` as the compiler expands it (the cache key must differ between machines)."""
    if isa != "native":
        return isa
    proc = _run([cc, "-march=native", "-###", "-x", "c", "-c", os.devnull, "-o", os.devnull])
    found = re.findall(r"-march=([\w.+-]+)", proc.stderr)
    resolved = [m for m in found if m != "native"]
    if not resolved:
        return "native"
    # The expanded command line lists every -m feature flag too; hash them so "native" on two
    # machines with the same -march name but different features never share a cache entry.
    features = sorted(set(re.findall(r"(-m[\w.=+-]+|[\w-]+-size=\d+)", proc.stderr)))
    digest = hashlib.sha256("\n".join(features).encode()).hexdigest()[:12]
    return f"{resolved[-1]}+{digest}"


@functools.cache
def _target_macros(cc: str, isa: str) -> frozenset[str]:
    proc = _run([cc, f"-march={isa}", "-dM", "-E", "-x", "c", os.devnull])
    if proc.returncode != 0:
        raise CompileError(f"{cc} rejects -march={isa}: {trim_output(proc.stderr)}")
    return frozenset(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#define "))


def target_info(options: BuildOptions) -> TargetInfo:
    """Vector width and register count of ``options.isa`` as the compiler sees it."""
    macros = _target_macros(options.cc, options.isa)
    if "__AVX512F__" in macros:
        vector_bytes, registers = 64, 32
    elif "__AVX__" in macros:
        vector_bytes, registers = 32, 16
    else:
        vector_bytes, registers = 16, 16 if "__x86_64__" in macros else 32
    return TargetInfo(_resolved_march(options.cc, options.isa), vector_bytes, registers, _int8_dot(macros),
                      "__AVX512BF16__" in macros, "__AMX_BF16__" in macros)


def _int8_dot(macros: frozenset[str]) -> str:
    """The best int8 dot product ``macros`` (a target's predefined macros) allow."""
    if {"__AVX512VNNI__", "__AVX512BW__"} <= macros:
        return "avx512vnni"
    if "__AVXVNNI__" in macros:
        return "avxvnni"
    if "__AVX512BW__" in macros:
        return "avx512bw"
    return "avx2" if "__AVX2__" in macros else "portable"


def compile_flags(options: BuildOptions, openmp: bool = True) -> list[str]:
    """The full, ordered flag list (recorded in the manifest and part of the cache key); with
    ``-fopenmp`` where ``openmp`` (the code uses OpenMP: ``uses_openmp``)."""
    flags = [*options.opt_flags, f"-march={options.isa}", *(["-fopenmp"] if openmp else []), *_BASE_FLAGS]
    if "cflags" in options.extra:
        flags.extend(shlex.split(options.extra["cflags"]))
    return flags


@dataclasses.dataclass(frozen=True)
class CBuild:
    """One library built (or taken from the cache): what the manifest records about it."""

    cc: str
    cc_version: str  # the first line of ``cc --version``
    flags: tuple[str, ...]  # compile_flags(options)
    isa: str  # the resolved -march
    cached: bool  # the library came from the cache
    units: int = 1  # translation units
    units_compiled: int = 0  # of those, compiled by this build (the rest came from the cache)


def _identity(options: BuildOptions, openmp: bool) -> tuple[list[str], str, str]:
    """(flags, compiler version, resolved -march): what every cache key of a build holds."""
    march = _resolved_march(options.cc, options.isa)
    return compile_flags(options, openmp), compiler_version(options.cc), march


def _unit_key(text: str, flags: list[str], version: str, march: str) -> str:
    return content_key(source=text, flags=flags, cc=version, march=march)


def build_units(units: Sequence[str], out_path: Path, options: BuildOptions,
                source_name: str = SOURCE_NAME) -> CBuild:
    """Compile each translation unit in ``units`` to an object and link them into ``out_path``.

    Objects are cached by sha256(unit, flags, compiler, ``-march``) like whole libraries, so a unit
    seen in any earlier build (the same kernel in another model) is never compiled again; missing
    ones are compiled in parallel, one ``cc`` per core. Each unit is compiled as ``u_<hash>.c``, so
    an object -- and the library linked from them -- depends on nothing but the unit texts. The
    linked library is cached too. ``source_name`` (the shipped source, kept next to
    ``out_path``) is what a CompileError names.
    """
    out_path = Path(out_path)
    openmp = [uses_openmp(unit) for unit in units]
    flags, version, march = _identity(options, any(openmp))  # the library's, as recorded
    unit_flags = {False: compile_flags(options, False), True: compile_flags(options, True)}
    keys = [_unit_key(unit, unit_flags[omp], version, march) for unit, omp in zip(units, openmp, strict=True)]
    cache = BuildCache(c_cache_dir())
    build = CBuild(options.cc, version, tuple(flags), march, cached=True, units=len(units))
    library_key = content_key(units=keys)
    if cache.fetch(library_key, ".so", out_path):
        return build
    with tempfile.TemporaryDirectory(prefix="onnx-aot-cc-") as tmp:
        work = Path(tmp)
        todo: dict[str, list[str]] = {}  # unit key -> its compile flags
        for unit, key, omp in zip(units, keys, openmp, strict=True):
            if key not in todo and not cache.fetch(key, ".o", work / f"u_{key[:24]}.o"):
                (work / f"u_{key[:24]}.c").write_text(unit)
                todo[key] = [f for f in unit_flags[omp] if f != "-shared"]
        _compile_objects(todo, work, options.cc, out_path.parent / source_name)
        for key in todo:
            cache.store(work / f"u_{key[:24]}.o", key, ".o")
        objects = [f"u_{key[:24]}.o" for key in dict.fromkeys(keys)]
        argv = [options.cc, "-shared", *(["-fopenmp"] if any(openmp) else []), "-pthread", "-fPIC",
                *objects, "-o", LIBRARY_NAME, "-lm"]
        proc = _run_in(argv, work)
        if proc.returncode != 0:
            raise CompileError(f"linking {out_path} failed ({shlex.join(argv)}):\n"
                               f"{trim_output(proc.stderr or proc.stdout)}")
        cache.store(work / LIBRARY_NAME, library_key, ".so")
        copy_atomic(work / LIBRARY_NAME, out_path)
    return dataclasses.replace(build, cached=False, units_compiled=len(todo))


def _compile_objects(todo: dict[str, list[str]], work: Path, cc: str, source: Path) -> None:
    """Compile ``u_<key>.c`` to ``u_<key>.o`` in ``work`` with its flags (``todo``: key -> flags),
    one ``cc`` per core."""
    keys = list(todo)
    workers = max(1, min(len(keys), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda key: _compile_object(cc, todo[key], work, key), keys))
    failed = [(key, proc) for key, proc in zip(keys, results, strict=True) if proc.returncode != 0]
    if failed:
        key, proc = failed[0]
        function = _first_function(work / f"u_{key[:24]}.c")
        raise CompileError(
            f"C compilation of {source} failed in {function} "
            f"({len(failed)} of {len(keys)} unit(s) failed):\n{trim_output(proc.stderr or proc.stdout)}"
        )


def _run_in(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)


def _compile_object(cc: str, flags: list[str], work: Path, key: str) -> subprocess.CompletedProcess[str]:
    name = f"u_{key[:24]}"
    return _run_in([cc, *flags, "-c", f"{name}.c", "-o", f"{name}.o"], work)


def _first_function(path: Path) -> str:
    """The kernel function a unit defines (for error messages)."""
    match = re.search(r"^void (\w+)\(", path.read_text(), re.M)
    return f"kernel {match.group(1)}" if match else "the entry unit"
