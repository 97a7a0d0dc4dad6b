"""A QDQ residual Add in the requantizing store of the integer conv (compiler/passes/fuse_qconv_add.py,
templates/c/qconv_common.c.j2: ``add16``, ``store_scalar``).

The blocks are written the way onnxruntime's quantize_static writes a ResNet block: every
activation between QuantizeLinear / DequantizeLinear, the conv's output quantized (with a
BatchNormalization after it, which ``fold_qdq`` makes the conv's Lut), then an Add of it and the
shortcut (an input, or a projection conv), quantized with a zero point at the bottom of the range
(the Relu). ``fold_qdq`` makes a QLinearConv and a QBinary Add; fused, the conv computes the Add:
one step fewer, the unfused C steps' bits and those of the reference kernels on the fused graph, on
odd channel counts and strided convs, "gemm" and "depthwise", the VNNI tile (run-time, the default)
and the pmaddwd tile (ONNX_AOT_INT8_NO_VNNI), the Add's int32 and float64 AVX-512 lanes, the
portable build, 1 and 2 threads.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import compiler.passes.manager as manager
from compiler import compile_model
from compiler.driver import import_model
from compiler.ir.evaluate import evaluate
from compiler.passes import optimize
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.providers.c.qconv import qconv_add
from runtime import Session
from tests.cpu_targets import host_runs
from tests.support.qdq_models import QdqBuilder

C, H, W = 5, 13, 11


def _bn(b: QdqBuilder, x: str, c: int) -> str:
    rng = b.rng
    params = [rng.uniform(0.5, 1.5, c), rng.normal(0, 0.2, c), rng.normal(0, 0.2, c), rng.uniform(0.5, 2, c)]
    return b.node("BatchNormalization", [x, *(b.const(p.astype(np.float32), "bn") for p in params)])


def _conv(b: QdqBuilder, x: str, m: int, c: int, k: int, stride: int, group: int = 1) -> str:
    w, w_scale = b.weight((m, c // group, k, k), axis=0)
    pads = [k // 2] * 4
    return b.node("Conv", [x, w, b.bias(0.0213, w_scale)], kernel_shape=[k, k], strides=[stride, stride],
                  pads=pads, group=group)


def _block(kind: str, dtype: type) -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]]]:
    """x -> conv [-> BatchNormalization] -> Q/DQ, + the shortcut -> Q/DQ (zero point at qmin)."""
    b = QdqBuilder(seed=7, dtype=dtype)
    z = 0 if dtype == np.int8 else 128
    lo = -128 if dtype == np.int8 else 0
    x = b.qdq("x", 0.0213, z - 5)
    stride = 2 if kind in ("strided", "projection") else 1
    m = C if kind == "depthwise" else 19
    oh, ow = -(-H // stride), -(-W // stride)
    inputs = {"x": (1, C, H, W)}
    conv = _conv(b, x, m, C, 3, stride, group=C if kind == "depthwise" else 1)
    if kind == "lut":  # quantized on its own, as without quant_pre_process
        conv = _bn(b, b.qdq(conv, 0.061, z - 7), m)
    y = b.qdq(conv, 0.0457, z + 3)
    if kind == "projection":
        shortcut = b.qdq(_conv(b, x, m, C, 1, stride), 0.0388, z - 2)
    else:
        inputs["r"] = (1, m, oh, ow)
        shortcut = b.qdq("r", 3e-8 if kind == "float64" else 0.0302, z + 11)
    operands = [shortcut, y] if kind == "strided" else [y, shortcut]
    out = b.qdq(b.node("Add", operands), 0.0519, lo)
    return b.model(inputs, [out]), inputs


@pytest.fixture(autouse=True)
def _fusion_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass is off by default (compiler/passes/manager.py: FUSE_QCONV_ADD, measured slower on
    the Zen 4); these tests turn it on."""
    monkeypatch.setattr(manager, "FUSE_QCONV_ADD", True)


class _Off(Pass):
    name = "fuse_qconv_add_off"

    def run(self, graph):  # type: ignore[no-untyped-def]
        return PassResult(graph, False)


def _feeds(inputs: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s) * 2).astype(np.float32) for k, s in inputs.items()}


def _steps(art: Path) -> collections.Counter[str]:
    plan = json.loads((art / "plan.json").read_text(encoding="utf-8"))
    return collections.Counter(s["op_type"] for s in plan["steps"])


KINDS = ["plain", "strided", "lut", "depthwise", "projection", "float64"]  # float64: a ratio of 6e-7


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["s8", "u8"])
@pytest.mark.parametrize("kind", KINDS)
def test_residual_add_in_the_conv_gives_the_unfused_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         kind: str, dtype: type) -> None:
    """One step fewer (no QBinary), the bits of the unfused C steps on each tile and thread count,
    and of the reference kernels on the fused graph."""
    model, inputs = _block(kind, dtype)
    graph = optimize(import_model(model), 3, target="cpu")
    kinds = collections.Counter(node.op_type for node in graph)
    assert kinds["QBinary"] == 0 and kinds["PackedQConv"] == (2 if kind == "projection" else 1), kinds
    conv = next(node for node in graph if node.op_type == "PackedQConv" and node.input(6) is not None)
    add = qconv_add(conv)  # the AVX-512 store's int32 lanes where exact, else its float64 lanes
    assert add is not None and (add.fixed is None) == (kind == "float64"), add
    fused = compile_model(model, tmp_path / "fused", golden_cases=0)
    with monkeypatch.context() as patch:
        patch.setattr(manager, "FuseQConvAdd", _Off)
        unfused = compile_model(model, tmp_path / "unfused", golden_cases=0)
    assert (_steps(unfused)["QBinary"], _steps(fused)["QBinary"]) == (1, 0), _steps(fused)
    assert sum(_steps(unfused).values()) == sum(_steps(fused).values()) + 1
    for seed in (0, 1):
        feeds = _feeds(inputs, seed)
        want = Session(unfused, threads=1).run(None, feeds)[0]
        assert np.array_equal(evaluate(graph, feeds)[0], want), seed
        for no_vnni in (None, "1"):
            if no_vnni is None:
                monkeypatch.delenv("ONNX_AOT_INT8_NO_VNNI", raising=False)
            else:
                monkeypatch.setenv("ONNX_AOT_INT8_NO_VNNI", no_vnni)
            for threads in (1, 2):
                got = Session(fused, threads=threads).run(None, feeds)[0]
                assert np.array_equal(got, want), (seed, no_vnni, threads)


@pytest.mark.parametrize("kind", ["strided", "lut", "depthwise"])
def test_portable_build_of_the_fused_store_is_bit_exact(tmp_path: Path, kind: str) -> None:
    """The C form of the Add (``store_scalar``: an x86-64-v2 build, no AVX-512) gives the reference's bits."""
    if not host_runs("x86-64-v2"):
        pytest.skip("this host does not run x86-64-v2 code")
    model, inputs = _block(kind, np.int8)
    graph = optimize(import_model(model), 3, target="cpu")
    art = compile_model(model, tmp_path / "a", cpu="x86-64-v2", golden_cases=0)
    assert _steps(art)["QBinary"] == 0
    for seed in (0, 2):
        feeds = _feeds(inputs, seed)
        assert np.array_equal(Session(art, threads=2).run(None, feeds)[0], evaluate(graph, feeds)[0]), seed


def test_a_conv_output_with_another_use_keeps_its_add() -> None:
    """The conv's codes are also a graph output: the QBinary stays."""
    model, _ = _block("plain", np.int8)
    graph = model.graph
    conv_q = next(n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0].startswith("conv"))
    graph.output.append(onnx.helper.make_tensor_value_info(conv_q.output[0], onnx.TensorProto.INT8,
                                                                  [1, 19, H, W]))
    kinds = collections.Counter(node.op_type for node in optimize(import_model(model), 3, target="cpu"))
    assert kinds["QBinary"] == 1, kinds
