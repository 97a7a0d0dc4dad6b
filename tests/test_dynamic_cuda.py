"""CUDA kernels with run-time dims (issue 17 item 3, the CUDA half), without a GPU.

Models with ``dim_param``s compiled once for target cuda with ranges (``dims=`` / ``shapes=``):
an elementwise chain with broadcasting, matrix products (MatMul by a 2-D B, batched and broadcast
MatMul, Gemm with transB / alpha / bias), Softmax along a run-time and a static axis,
LayerNormalization, Concat along a run-time axis, Transpose, the global pools and BatchNorm, a
BERT-style encoder layer, and a small conv net (direct, depthwise with a fused residual, and
implicit-GEMM convolutions, max and average pools). Each is run at several bindings -- the range
ends and sizes that leave partial blocks and tiles -- by the host execution of the generated CUDA
(tests/support/cuda_host: every CUDA step against its reference kernel, on guarded memory; blocks
and threads in ascending order, and in descending order at one binding), and its outputs are
compared with onnxruntime (rtol 1e-3 / atol 1e-4). A ``Session`` runs one of them end to end on a
simulated cupy whose kernels are the host-compiled ones (bindings cached, partitions bound per
binding, the module loaded once), and an ``--opt-shape`` variant's static CUDA artifact beside it.
With nvcc the sources build for sm_80 / sm_90; with cupy and a GPU the same artifacts run on the
device.
"""

from __future__ import annotations

import json
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.codegen import nvcc as nvcc_mod
from compiler.codegen.options import BuildOptions
from runtime.errors import InputError
from tests.support.cuda_host.build import HostModule
from tests.support.cuda_host.runner import HostRun
from tests.support.dynamic_models import bert_model
from tests.support.models import ort_run

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")

RTOL, ATOL = 1e-3, 1e-4
F = TensorProto.FLOAT
NVCC = nvcc_mod.find_nvcc(BuildOptions())
BUILD = BuildOptions(extra={"cuda_archs": "sm_80,sm_90", "cuda_ptx": ""} if NVCC else {"nvcc": "none"})


@pytest.fixture(autouse=True)
def _host_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    if "ONNX_AOT_CUDA_HOST_CACHE" not in os.environ:
        monkeypatch.setenv("ONNX_AOT_CUDA_HOST_CACHE", str(tmp_path_factory.getbasetemp() / "cuda_host"))


# -- models ---------------------------------------------------------------------------------------------
def _model(nodes: list[onnx.NodeProto], inputs: dict[str, list[Any]], outputs: dict[str, list[Any]],
           weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "dyn", [helper.make_tensor_value_info(k, F, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, F, v) for k, v in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _w(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def eltwise_model() -> onnx.ModelProto:
    """x (n, t, 37) + b (37,) -> Relu -> * y (n, 1, 37) -> Sigmoid * x: broadcasts both ways."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("Add", ["x", "b"], ["a"]), n("Relu", ["a"], ["r"]), n("Mul", ["r", "y"], ["m"]),
             n("Sigmoid", ["m"], ["s"]), n("Mul", ["s", "x"], ["out"]), n("Sub", ["y", "x"], ["d"])]
    return _model(nodes, {"x": ["n", "t", 37], "y": ["n", 1, 37]},
                  {"out": ["n", "t", 37], "d": ["n", "t", 37]}, {"b": _w(rng, 37)})


def products_model() -> onnx.ModelProto:
    """MatMul by a 2-D B (rows b*s), + bias, the (b, s, s) product of it with its transpose
    (batched, run-time m / n / k), a head-broadcast batched MatMul, Gemm transB with alpha / beta
    and a bias row."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["t"]), n("Add", ["t", "bias"], ["t2"]),
             n("Transpose", ["t2"], ["tt"], perm=[0, 2, 1]), n("MatMul", ["t2", "tt"], ["gram"]),
             n("MatMul", ["q", "kv"], ["heads"]),
             n("Gemm", ["g", "w2", "c"], ["gemm"], transB=1, alpha=0.5, beta=2.0)]
    inputs = {"x": ["b", "s", 24], "q": ["b", 3, "s", 20], "kv": ["b", 1, 20, "s"], "g": ["s", 40]}
    outputs = {"t2": ["b", "s", 70], "gram": ["b", "s", "s"], "heads": ["b", 3, "s", "s"], "gemm": ["s", 33]}
    weights = {"w": _w(rng, 24, 70), "bias": _w(rng, 70), "w2": _w(rng, 33, 40), "c": _w(rng, 1, 33)}
    return _model(nodes, inputs, outputs, weights)


def rows_model() -> onnx.ModelProto:
    """Softmax along the run-time axis and along a static one with a run-time stride, LogSoftmax,
    LayerNormalization, Concat along a run-time axis, Transpose of a run-time dim, GlobalAveragePool
    / GlobalMaxPool over run-time planes, BatchNormalization, ReduceMean over a run-time axis and
    ReduceSum over a static and a run-time one."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [n("Softmax", ["x"], ["sm"], axis=-1), n("Softmax", ["x"], ["sm1"], axis=1),
             n("LogSoftmax", ["x"], ["lsm"], axis=-1),
             n("LayerNormalization", ["z", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
             n("Concat", ["x", "sm"], ["cat"], axis=2), n("Transpose", ["cat"], ["catt"], perm=[2, 0, 1]),
             n("GlobalAveragePool", ["img"], ["gap"]), n("GlobalMaxPool", ["img"], ["gmp"]),
             n("ReduceMean", ["z"], ["rm"], axes=[1], keepdims=0),
             n("ReduceSum", ["img", "rs_axes"], ["rs"]),
             n("BatchNormalization", ["img", "bs", "bb", "bm", "bv"], ["bn"], epsilon=1e-3)]
    weights = {"gamma": _w(rng, 45), "beta": _w(rng, 45), "bs": _w(rng, 5), "bb": _w(rng, 5),
               "bm": _w(rng, 5), "bv": np.abs(_w(rng, 5)) + 0.5, "rs_axes": np.array([1, 3], np.int64)}
    return _model(nodes, {"x": ["n", 6, "t"], "z": ["n", "t", 45], "img": ["n", 5, "h", "t"]},
                  {"sm1": ["n", 6, "t"], "lsm": ["n", 6, "t"], "ln": ["n", "t", 45], "catt": [None, None, 6],
                   "gap": ["n", 5, 1, 1], "gmp": ["n", 5, 1, 1], "bn": ["n", 5, "h", "t"], "rm": ["n", 45],
                   "rs": ["n", 1, "h", 1]}, weights)


def convnet_model() -> onnx.ModelProto:
    """Conv + bias + Relu (the direct kernel: 8 output channels), a depthwise conv whose residual
    Add fuses into it, MaxPool, a strided Conv to 16 channels (the implicit GEMM on the tile),
    AveragePool with pads (counted and not), GlobalAveragePool, Flatten, Gemm: run-time batch and
    size."""
    rng = np.random.default_rng(4)
    n = helper.make_node
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [n("Conv", ["img", "c1", "c1b"], ["a"], **conv), n("Relu", ["a"], ["r"]),
             n("Conv", ["r", "dw"], ["d"], group=8, **conv), n("Add", ["d", "r"], ["res"]),
             n("MaxPool", ["res"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p", "c2", "c2b"], ["c"], strides=[2, 2], **conv),
             n("AveragePool", ["c"], ["ap"], count_include_pad=0, **conv),
             n("AveragePool", ["c"], ["ap2"], count_include_pad=1, **conv), n("Add", ["ap", "ap2"], ["s"]),
             n("GlobalAveragePool", ["s"], ["g"]), n("Flatten", ["g"], ["f"]),
             n("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1)]
    weights = {"c1": _w(rng, 8, 3, 3, 3), "c1b": _w(rng, 8), "dw": _w(rng, 8, 1, 3, 3),
               "c2": _w(rng, 16, 8, 3, 3), "c2b": _w(rng, 16), "fc": _w(rng, 10, 16), "fcb": _w(rng, 10)}
    outputs = {"logits": ["n", 10], "c": ["n", 16, None, None]}
    return _model(nodes, {"img": ["n", 3, "h", "h"]}, outputs, weights)


# name -> (model, compile options, bindings: symbol -> size; the range ends and partial blocks / tiles)
CASES: dict[str, tuple[Callable[[], onnx.ModelProto], dict[str, Any], list[dict[str, int]]]] = {
    "eltwise": (eltwise_model, {"dims": {"n": (1, 4), "t": (1, 300)}},
                [{"n": 1, "t": 1}, {"n": 4, "t": 300}, {"n": 3, "t": 7}, {"n": 2, "t": 255}]),
    "products": (products_model, {"dims": {"b": (1, 3), "s": (1, 70)}},
                 [{"b": 1, "s": 1}, {"b": 3, "s": 70}, {"b": 2, "s": 33}, {"b": 1, "s": 64},
                  {"b": 2, "s": 17}]),
    "rows": (rows_model, {"dims": {"n": (1, 3), "t": (1, 80), "h": (1, 9)}},
             [{"n": 1, "t": 1, "h": 1}, {"n": 3, "t": 80, "h": 9}, {"n": 2, "t": 33, "h": 4},
              {"n": 1, "t": 9, "h": 7}]),
    "bert": (bert_model, {"dims": {"batch": (1, 3), "seq": (1, 40)}},
             [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 40}, {"batch": 2, "seq": 33}]),
    "convnet": (convnet_model, {"shapes": {"img": [(1, 2), 3, (8, 24), (8, 24)]}},
                [{"n": 1, "h": 8}, {"n": 2, "h": 24}, {"n": 2, "h": 13}]),
}


def _feeds(model: onnx.ModelProto, binding: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        shape = [binding[d.dim_param] if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == TensorProto.INT64:  # bert's attention mask
            feeds[vi.name] = (rng.random(shape) < 0.8).astype(np.int64)
            feeds[vi.name][..., 0] = 1
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dyncuda")
    return {name: compile_model(make(), root / name, target="cuda", build=BUILD, golden_cases=0, **options)
            for name, (make, options, _) in CASES.items()}


def _convnet_feeds(binding: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"img": rng.standard_normal((binding["n"], 3, binding["h"], binding["h"])).astype(np.float32)}


def _close(got: dict[str, np.ndarray], want: list[np.ndarray], names: list[str]) -> None:
    for name, w in zip(names, want, strict=True):
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=RTOL, atol=ATOL, err_msg=name)


# -- the host execution of every CUDA step at each binding --------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_cuda_step_matches_at_every_binding(case: str, artifacts: dict[str, Path]) -> None:
    make, _, bindings = CASES[case]
    model = make()
    run = HostRun(artifacts[case])
    names = [o.name for o in model.graph.output]
    for k, binding in enumerate(bindings):
        feeds = _convnet_feeds(binding) if case == "convnet" else _feeds(model, binding)
        run.module.reverse = k == len(bindings) - 1  # type: ignore[union-attr]  # the last: descending order
        checks = run.run(feeds)
        bad = [c.describe() for c in checks if not c.ok]
        assert not bad, (binding, bad)
        assert run.plan.symbols == ()  # the bound plan
        _close(run.outputs, ort_run(model, feeds), names)


def _providers(path: Path) -> dict[str, str]:
    plan = json.loads((path / "plan.json").read_text())
    return {s["name"]: (s["op_type"], s["provider"]) for s in plan["steps"]}


def test_the_kernels_run_on_cuda_with_launches_of_the_symbols(artifacts: dict[str, Path]) -> None:
    for case in ("eltwise", "products", "rows", "bert", "convnet"):
        steps = _providers(artifacts[case])
        off = {n: s for n, s in steps.items() if s[1] != "cuda" and s[0] != "Cast"}  # (int64 mask: host)
        assert not off, (case, off)  # every step of these models has a CUDA kernel with run-time dims
    plan = json.loads((artifacts["products"] / "plan.json").read_text())
    assert [s["name"] for s in plan["symbols"]] == ["b", "s"]
    launches = [ln for s in plan["steps"] for ln in s.get("launches") or []]
    assert any(isinstance(g, str) for ln in launches for g in ln["grid"])  # grids over the symbols
    assert any(a[0] == "i32" and isinstance(a[1], str) for ln in launches for a in ln["args"])
    assert all(isinstance(a[2], str) and a[2].startswith("_b") for ln in launches for a in ln["args"]
               if a[0] == "ptr" and a[1] == "arena")  # arena pointers: the runtime's placement
    source = (artifacts["products"] / "kernels/cuda/model.cu").read_text()
    assert "const int rd0" in source
    conv = {op for op, _ in _providers(artifacts["convnet"]).values()}
    assert {"FusedConv", "MaxPool", "AveragePool", "Gemm"} <= conv


def test_the_device_arena_is_planned_per_binding_near_its_bound(artifacts: dict[str, Path]) -> None:
    """report/memory.json: the device arena at the min, middle and max bindings is within 1.10x of
    that binding's lower bound (the runtime's placement, as for the host arena)."""
    for case, path in artifacts.items():
        report = json.loads((path / "report" / "memory.json").read_text())
        for label, entry in report["dynamic"]["bindings"].items():
            arena = entry["arenas"]["cuda"]
            assert arena["arena_nbytes"] <= 1.10 * arena["lower_bound_nbytes"], (case, label, arena)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the generated source is checked, not built")
def test_the_dynamic_sources_build_with_nvcc(artifacts: dict[str, Path]) -> None:
    for case, path in artifacts.items():
        manifest = json.loads((path / "manifest.json").read_text())
        cubins = [f for f in manifest["files"] if f.endswith(".cubin")]
        assert sorted(Path(f).name for f in cubins) == ["model.sm_80.cubin", "model.sm_90.cubin"], case


def test_static_nodes_render_as_before(tmp_path: Path) -> None:
    """The same graph compiled static: no run-time dim parameter anywhere in its source."""
    model = products_model()
    static = compile_model(model, tmp_path / "static", target="cuda", golden_cases=0, dims={"b": 2, "s": 33},
                           build=BuildOptions(extra={"nvcc": "none"}))
    source = (static / "kernels/cuda/model.cu").read_text()
    assert "rd0" not in source and "const int" in source
    plan = json.loads((static / "plan.json").read_text())
    grids = [g for s in plan["steps"] for ln in s.get("launches") or [] for g in ln["grid"]]
    assert plan["symbols"] == [] and grids and all(isinstance(g, int) for g in grids)


def test_an_int64_product_is_left_to_the_reference_kernels(tmp_path: Path) -> None:
    """The float kernels claim float32 nodes only, at run-time dims too (an int64 MatMul was once
    claimed by the tiled float kernel)."""
    x = helper.make_tensor_value_info("x", TensorProto.INT64, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, ["n", 3])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "int", [x], [y],
                              [numpy_helper.from_array(np.arange(12, dtype=np.int64).reshape(4, 3), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "int", target="cuda", dims={"n": (1, 5)}, golden_cases=0,
                        build=BuildOptions(extra={"nvcc": "none"}))
    assert _providers(out)["MatMul_0"] == ("MatMul", "reference@cuda")


def test_ppocr_rec_one_cuda_artifact_every_width(tmp_path: Path) -> None:
    """PP-OCRv4 rec (issue 17's model) compiled once for cuda with ``x=1x3x48x32..2048``: every step
    but its Slices (no CUDA kernel, static or dynamic) on CUDA, each matching its reference kernel
    on the host at W = 33 and 160, the output onnxruntime's."""
    from tests.support.fetched import fetched_model

    path = fetched_model("ppocrv4-rec")
    out = compile_model(path, tmp_path / "rec", target="cuda", shapes={"x": (1, 3, 48, (32, 2048))},
                        golden_cases=0, build=BuildOptions(extra={"nvcc": "none"}))
    off = {op for op, provider in _providers(out).values() if provider != "cuda"}
    assert off <= {"Slice"}, off
    model = onnx.load(path)
    run = HostRun(out)
    for width in (33, 160):
        x = np.random.default_rng(width).standard_normal((1, 3, 48, width)).astype(np.float32)
        bad = [c.describe() for c in run.run({"x": x}) if not c.ok]
        assert not bad, (width, bad)
        (got,) = run.outputs.values()
        np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=RTOL, atol=ATOL)


# -- a Session on a simulated cupy whose kernels are the host-compiled ones --------------------------
class _HostFunction:
    """One kernel of a host build, called the way the runtime calls a cupy RawKernel."""

    max_threads_per_block = 1024
    max_dynamic_shared_size_bytes = 48 * 1024

    def __init__(self, cupy: _HostCupy, module: HostModule, name: str) -> None:
        self.cupy, self.module, self.name = cupy, module, name

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
                 shared_mem: int = 0) -> None:
        self.cupy.launches.append((self.name, tuple(grid)))
        self.module.launch(self.name, grid, block, shared_mem, args)


class _HostCupy:
    """What ``runtime/providers/cuda*.py`` uses of cupy: device memory is host memory (the
    simulated cupy of tests/test_cuda_runtime.py), and a module loaded is the host build of its
    source: a cubin's artifact's model.cu, or (NVRTC's path, where ``nvrtc`` "compiles" a source
    into itself) the source in the file."""

    uint8 = np.uint8

    def __init__(self) -> None:
        from tests.test_cuda_runtime import FakeCupy
        from tests.test_cuda_runtime import _fake_nvrtc

        fake = FakeCupy(driver=13000)
        self.modules: dict[str, HostModule] = {}
        self.launches: list[tuple[str, tuple[int, ...]]] = []
        self.loaded: list[str] = []
        self.cuda, self.empty, self.asarray = fake.cuda, fake.empty, fake.asarray
        self.ndarray = type(fake.empty(1, np.uint8))
        self.nvrtc = _fake_nvrtc([])
        self.nvrtc.getCUBIN = lambda source: source.encode()

    def RawModule(self, path: str) -> Any:  # noqa: N802  (cupy's name)
        data = Path(path).read_bytes()
        source = data.decode() if b"__global__" in data else (Path(path).parent / "model.cu").read_text()
        self.loaded.append(Path(path).name)
        if source not in self.modules:
            self.modules[source] = HostModule(source)
        module = self.modules[source]
        return types.SimpleNamespace(get_function=lambda name: _HostFunction(self, module, name))

    def install(self, monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
        import runtime.providers.cuda as cuda

        monkeypatch.setattr(cuda, "_CUPY", self)
        monkeypatch.setitem(sys.modules, "cupy", self)
        monkeypatch.setitem(sys.modules, "cupy.cuda", types.SimpleNamespace(nvrtc=self.nvrtc))
        monkeypatch.setenv("ONNX_AOT_CUDA_CACHE", str(cache))


def test_a_session_runs_the_dynamic_cuda_artifact(artifacts: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    from runtime.session import Session

    cp = _HostCupy()
    cp.install(monkeypatch, tmp_path / "cache")
    session = Session(artifacts["products"])
    model = products_model()
    assert session.inputs[0].shape == (None, None, 24)
    for binding in ({"b": 1, "s": 70}, {"b": 3, "s": 5}, {"b": 1, "s": 70}, {"b": 2, "s": 64}):
        feeds = _feeds(model, binding, seed=binding["s"])
        got = session.run(None, feeds)
        for g, w in zip(got, ort_run(model, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
    assert len(cp.loaded) == 1  # one module for every binding
    grids = {grid for name, grid in cp.launches}
    assert len(grids) > 3  # the grids follow the bindings
    with pytest.raises(InputError, match="outside its range"):
        session.run(None, _feeds(model, {"b": 1, "s": 71}))


def test_an_opt_shape_variant_of_a_cuda_artifact(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--opt-shape`` for target cuda: the run at that binding takes the static variant opt/0 (its
    own module), any other the dynamic plan; both match onnxruntime."""
    from runtime.session import Session

    model = eltwise_model()
    out = compile_model(model, tmp_path / "opt", target="cuda", dims={"n": (1, 4), "t": (1, 300)},
                        opt_shapes=[{"x": (2, 7, 37), "y": (2, 1, 37)}], golden_cases=2,
                        build=BuildOptions(extra={"nvcc": "none"}))
    cp = _HostCupy()
    cp.install(monkeypatch, tmp_path / "cache")
    session = Session(out)
    for binding in ({"n": 2, "t": 7}, {"n": 3, "t": 100}, {"n": 2, "t": 7}):
        feeds = _feeds(model, binding)
        for g, w in zip(session.run(None, feeds), ort_run(model, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
    assert len(cp.modules) == 2  # the variant's module and the dynamic plan's
    report = session.verify()  # the golden cases: at the min and the middle binding
    assert report.verified and report.cases == 2, report
    static = json.loads((out / "opt/0/plan.json").read_text())
    assert static["symbols"] == [] and {s["provider"] for s in static["steps"]} == {"cuda"}


# -- on a GPU ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_on_a_gpu_the_dynamic_artifact_matches_onnxruntime(case: str, artifacts: dict[str, Path]) -> None:
    from runtime.session import Session
    from tests.test_cuda_runtime import _gpu

    _gpu()
    make, _, bindings = CASES[case]
    model = make()
    session = Session(artifacts[case])
    for binding in bindings:
        feeds = _convnet_feeds(binding) if case == "convnet" else _feeds(model, binding)
        for g, w in zip(session.run(None, feeds), ort_run(model, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
