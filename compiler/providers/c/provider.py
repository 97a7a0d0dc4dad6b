"""The C execution provider, compile side: claims nodes, renders one C file, builds one library.

``CProvider.claims`` asks the kernel registry (filled by the modules of
``KERNEL_MODULES``) which nodes it can run; ``generate`` renders every
partition's steps from ``templates/c`` into ``kernels_dir/model.c`` and builds ``kernels_dir/model.so``.
Each kernel is one function with compile-time shapes, named ``k_<hash of its text>``: steps whose
kernels are identical (repeated blocks) call one function, and the build compiles every kernel as
its own translation unit cached by that text, so the same kernel in any other model is never
compiled again (``toolchain.build_units``).

The library's ABI (version 1), which ``runtime/providers/c.py`` relies on:

- ``int <entry>(void* const* ext, char* arena, const char* weights, double* step_seconds)`` per
  partition: ``ext[k]`` is the address of the value ``partition.ext[k]``; GenLocation("arena", off)
  is ``arena + off``, GenLocation("weights", off) is ``weights + off``, GenLocation("ext", k) is
  ``ext[k]``. Runs the steps in order; with ``step_seconds`` not NULL it stores the wall time of
  step ``local`` in ``step_seconds[local]``. Returns 0 on success (1/2/3: ext/arena/weights NULL;
  4, ``ONNX_AOT_FAULT_INDEX``: a checked step found an index outside its axis and stopped the
  partition there, before writing its output).
- ``void onnx_aot_last_fault(int64_t out[4])``: the calling thread's last fault, ``{step local,
  index value, axis size, axis}`` (thread-local: concurrent runs on other threads keep theirs).
  Added within version 1: an older library never returns 4, so a runtime looks it up only then.
- ``void onnx_aot_set_num_threads(int n)`` (n <= 0: back to OpenMP's default) and
  ``int onnx_aot_abi_version(void)`` (returns 1).
- ``const void* onnx_aot_pool(void)`` and ``int onnx_aot_use_pool(const void* pool)``: the
  library's worker pool (templates/c/workers.c.j2), and running on another library's from now on
  (returns 0, keeping its own, for a pool of another version). Added within version 1: the runtime
  hands the first library's pool to every later one, one pool per process; an older library has
  neither and keeps OpenMP's.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.codegen.env import render
from compiler.codegen.options import BuildOptions
from compiler.codegen.toolchain import CBuild
from compiler.codegen.toolchain import TargetInfo
from compiler.codegen.toolchain import build_units
from compiler.codegen.toolchain import target_info
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.providers.base import CLibraryBuild
from compiler.providers.base import GeneratedC
from compiler.providers.base import GenPartition
from compiler.providers.c import attention
from compiler.providers.c import conv
from compiler.providers.c import conv_nhwc
from compiler.providers.c import einsum
from compiler.providers.c import elementwise
from compiler.providers.c import elementwise_typed
from compiler.providers.c import gemm
from compiler.providers.c import indexing
from compiler.providers.c import movement
from compiler.providers.c import norm
from compiler.providers.c import pad
from compiler.providers.c import pool
from compiler.providers.c import pool_nhwc
from compiler.providers.c import qchannel
from compiler.providers.c import qconv
from compiler.providers.c import qgemm
from compiler.providers.c import qgemm_dynamic
from compiler.providers.c import qlstm
from compiler.providers.c import qoperator
from compiler.providers.c import recurrent
from compiler.providers.c import reduce
from compiler.providers.c import spatial
from compiler.providers.c import winograd
from compiler.providers.c import winograd_nhwc
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.kit import KernelTable
from compiler.providers.kit import comment
from runtime.errors import CompileError
from runtime.rebuild import uses_openmp

__all__ = [
    "CProvider", "ABI_VERSION", "CSource", "ModelContext", "EntryContext", "CallSite", "KERNEL_MODULES",
]

# The modules whose ``KERNELS`` the C provider runs; every other module of this package is named in
# SUPPORT_MODULES (a test checks that none is left out).
KERNEL_MODULES = (attention, conv, conv_nhwc, einsum, elementwise, elementwise_typed, gemm, indexing,
                  movement, norm, pad, pool, pool_nhwc, qchannel, qconv, qgemm, qgemm_dynamic, qlstm,
                  qoperator, recurrent, reduce, spatial, winograd, winograd_nhwc)
SUPPORT_MODULES = ("provider", "common", "dtypes", "elementwise_vector", "rundims", "resize_runtime",
                   "pad_runtime", "gemm_bf16", "conv_amx", "pool_bf16", "qlookup")
KERNELS: KernelTable[CKernel] = KernelTable("C", KERNEL_MODULES)

ABI_VERSION = 1
SOURCE_NAME = "model.c"
LIBRARY_NAME = "model.so"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Names the generated file defines itself (plus C keywords an entry could plausibly be named).
_RESERVED = re.compile(
    r"step_\d+|k_[0-9a-f]{16}|onnx_aot_(abi_version|set_num_threads|threads|last_fault|fault|fail)"
    r"|ONNX_AOT_(EXPORT|FAULT_INDEX)|fault|v(f|load|store|bcast)|main"
    r"|auto|break|case|char|const|continue|default|do|double|else|enum|extern|float|for|goto|if|inline"
    r"|int|long|register|restrict|return|short|signed|sizeof|static|struct|switch|typedef|union"
    r"|unsigned|void|volatile|while"
)


@dataclass(frozen=True)
class CallSite:
    index: int
    local: int
    comment: str
    fn: str | None  # None: the step has no code (a view onto the same bytes)
    args: tuple[Arg, ...]
    checked: bool = False  # fn returns a fault status (StepCode.checked)


@dataclass(frozen=True)
class EntryContext:
    symbol: str
    steps: tuple[CallSite, ...]
    uses_ext: bool
    uses_arena: bool
    uses_weights: bool
    checked: bool = False  # a step is checked: the entry holds a fault record


@dataclass(frozen=True)
class ModelContext:
    abi_version: int
    vector_bytes: int
    functions: tuple[str, ...]
    entries: tuple[EntryContext, ...]
    prototypes: tuple[str, ...]
    mode: str  # "model" (the whole file) | "kernel" (one function) | "entries"
    openmp: bool = False  # some function still has an OpenMP region (the entries set its team too)


@dataclass(frozen=True)
class CSource:
    """A model's C code: ``model`` is the shipped model.c, ``units`` the same code as compiled."""

    model: str
    units: tuple[str, ...]  # one per kernel function, then the entries
    entries: tuple[EntryContext, ...] = ()

    def calls(self) -> list[tuple[str, list[tuple[int, int, bool, tuple[Arg, ...], bool]]]]:
        """The entries' call sequences without kernel names: what must not differ between the
        builds of one plan (entries, steps, ext slots, arena / weights / scratch offsets)."""
        return [(e.symbol, [(c.index, c.local, c.fn is None, c.args, c.checked) for c in e.steps])
                for e in self.entries]


_PLACEHOLDER = "onnx_aot_kernel_fn"


def _prototype(name: str, text: str) -> str:
    match = re.search(rf"^(void|int) {name}\([^)]*\)", text, re.M)
    if match is None:
        raise CompileError(f"kernel {name}: no 'void|int {name}(...)' definition in its rendered text")
    return match.group(0)


class CProvider:
    """Generated C kernels for float32 CNN-style ops on the host, built with the system cc."""

    name = "c"
    memory_space = "host"
    alignment = 64

    def supports(self, node: Node) -> bool:
        """Whether a C kernel handles ``node`` with its attributes, dtypes and shapes."""
        return KERNELS.supports(node)

    def claims(self, graph: Graph) -> set[Node]:
        return KERNELS.claims(graph)

    def scratch_nbytes(self, node: Node) -> int:
        return KERNELS.scratch_nbytes(node)

    def overwritable_input(self, node: Node) -> int | None:
        """The input a step may write its output over (compiler/back_half.py asks)."""
        return KERNELS.overwritable_input(node)

    def render_source(self, partitions: list[GenPartition], target: TargetInfo) -> CSource:
        """The model's C source, whole and split into translation units for the build.

        Kernel functions are named after a hash of their text (rendered with a placeholder name),
        so identical kernels -- repeated blocks of one model, or the same kernel in
        another model -- are one function and one cached object.
        """
        functions: dict[str, str] = {}  # name -> text
        entries: list[EntryContext] = []
        seen_symbols: set[str] = set()
        seen_steps: set[int] = set()  # id(node): step indices repeat in nested schedules
        names: dict[tuple[str, Any], str] = {}  # (template, context) -> function name
        for part in partitions:
            if part.provider != self.name:
                raise CompileError(f"partition {part.index} belongs to provider {part.provider!r}, not 'c'")
            symbol = part.entry
            if not _IDENTIFIER.fullmatch(symbol) or _RESERVED.fullmatch(symbol) or symbol in seen_symbols:
                raise CompileError(
                    f"partition {part.index}: entry symbol {symbol!r} is not a free C identifier"
                )
            seen_symbols.add(symbol)
            calls: list[CallSite] = []
            for step in part.steps:
                if id(step.node) in seen_steps:
                    raise CompileError(f"step {step.index} appears twice in the C partitions")
                seen_steps.add(id(step.node))
                code: StepCode = KERNELS.kernel(step.node).build(step, target)
                fn: str | None = None
                if code.template is not None:
                    key = (code.template, code.ctx)
                    if key not in names:
                        text = render(code.template, code.ctx, fn=_PLACEHOLDER)
                        name = "k_" + hashlib.sha256(text.encode()).hexdigest()[:16]
                        functions.setdefault(name, text.replace(_PLACEHOLDER, name))
                        names[key] = name
                    fn = names[key]
                calls.append(CallSite(step.index, step.local, comment(step.node), fn, code.args,
                                      fn is not None and code.checked))
            kinds = {a.kind for c in calls for a in c.args}
            entries.append(EntryContext(symbol, tuple(calls), "ext" in kinds, "arena" in kinds,
                                        "weights" in kinds, any(c.checked for c in calls)))
        texts = tuple(functions.values())
        prototypes = tuple(_prototype(name, text) for name, text in functions.items())
        whole = ModelContext(ABI_VERSION, target.vector_bytes, texts, tuple(entries), (), "model",
                             any(uses_openmp(t) for t in texts))
        units = [render("c/model.c.j2", dataclasses.replace(whole, functions=(t,), entries=(), mode="kernel"))
                 for t in texts]
        units.append(render("c/model.c.j2", dataclasses.replace(whole, functions=(), prototypes=prototypes,
                                                                 mode="entries")))
        return CSource(render("c/model.c.j2", whole), tuple(units), tuple(entries))

    def generate(
        self, partitions: list[GenPartition], kernels_dir: Path, options: BuildOptions
    ) -> GeneratedC:
        """Render and build the model's C kernels under ``kernels_dir``, once per build.

        The primary build (``options.isa``) is ``model.c`` + ``model.so``; with
        ``options.portable_isa`` (a different ``-march``) a portable build of the same partitions
        goes to ``<portable_isa>/model.c`` + ``model.so``, built with ``portable_opt_flags``.
        Each build's source is rendered with its own ``TargetInfo`` (vector width, registers);
        their entries must make the same calls with the same operands (checked here), so either
        library runs the one plan. The builds run in parallel. Returns every build's ``isa``,
        ``flags``, ``source`` and ``library`` (relative to ``kernels_dir``), preferred first.
        """
        kernels_dir = Path(kernels_dir)
        plans: list[tuple[BuildOptions, str]] = [(options, "")]
        if options.portable_isa and options.portable_isa != options.isa:
            portable = dataclasses.replace(options, isa=options.portable_isa, portable_isa=None,
                                           opt_flags=options.portable_opt_flags)
            plans.append((portable, f"{options.portable_isa}/"))
        sources = [self.render_source(list(partitions), target_info(opts)) for opts, _ in plans]
        for (opts, _), source in zip(plans[1:], sources[1:], strict=True):
            if source.calls() != sources[0].calls():
                raise CompileError(f"the -march={opts.isa} build of the C kernels differs from the "
                                   f"-march={options.isa} build in its entries' calls or operands")
        for (_, sub), source in zip(plans, sources, strict=True):
            (kernels_dir / sub).mkdir(parents=True, exist_ok=True)
            (kernels_dir / sub / SOURCE_NAME).write_text(source.model)

        def build(k: int) -> CBuild:
            opts, sub = plans[k]
            return build_units(sources[k].units, kernels_dir / sub / LIBRARY_NAME, opts, sub + SOURCE_NAME)

        if len(plans) == 1:
            built = [build(0)]
        else:
            with concurrent.futures.ThreadPoolExecutor(len(plans)) as pool:
                built = list(pool.map(build, range(len(plans))))
        return GeneratedC(
            cc=built[0].cc,
            cc_version=built[0].cc_version,
            builds=tuple(CLibraryBuild(b.isa, b.flags, sub + SOURCE_NAME, sub + LIBRARY_NAME)
                         for (_, sub), b in zip(plans, built, strict=True)),
        )
