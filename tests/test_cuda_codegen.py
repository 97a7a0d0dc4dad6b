"""The CUDA provider's compile side, without a GPU: claims, generated source, nvcc builds, launches.

Every zoo model compiles for ``target="cuda"`` with its Conv / Gemm / pooling nodes claimed by
the CUDA provider, and (where nvcc is installed) its ``model.cu`` builds for sm_90 with warnings
as errors; the full arch set (sm_80 + sm_90 cubins, compute_80 PTX) is built once. Textual
checks show that a fused elementwise chain is one kernel and that FusedConv's bias / residual /
activation are inside the conv kernel; launch records are checked against the memory plan and
two compiles are byte-identical. A small transformer block covers MatMul (batched, and the
matrix-vector path), LayerNormalization, Softmax, Gelu / Erf, ReduceMean, Transpose and Concat.
Running the kernels needs a GPU and is tested with the runtime side.
"""

from __future__ import annotations

import json
import re
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
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.cuda.provider import CudaProvider
from runtime.errors import CompileError
from tests.support.zoo import ZOO
from tests.support.zoo import zoo_model

NVCC = nvcc_mod.find_nvcc(BuildOptions())
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH or /usr/local/cuda/bin)")
# Per-model builds: sm_90 only (the full arch set is built once, below).
SM90 = BuildOptions(extra={"cuda_archs": "sm_90", "cuda_ptx": ""} if NVCC else {"nvcc": "none"})
NO_NVCC = BuildOptions(extra={"nvcc": "none"})
CLAIMED_KINDS = ("Conv", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool")


def _plan(path: Path) -> dict[str, Any]:
    return json.loads((path / "plan.json").read_text())


def _source(path: Path) -> str:
    return (path / "kernels" / "cuda" / "model.cu").read_text()


def _kernel(source: str, name: str) -> str:
    """The text of ``__global__`` function ``name`` (up to the next kernel)."""
    start = source.index(f" {name}(")
    end = source.find('extern "C" __global__', start)
    return source[start : end if end >= 0 else len(source)]


def check_launches(plan: dict[str, Any], source: str) -> int:
    """Every launch is well-formed and points at its own step's operands; returns the count."""
    arena = {a["memory_space"]: a["nbytes"] for a in plan["arenas"]}
    kernels = set(re.findall(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(', source))
    count = 0
    for step in plan["steps"]:
        if step["provider"] != "cuda":
            assert "launches" not in step
            continue
        launches = step["launches"]
        if step["op_type"] == "Transfer":
            assert launches == []
        operands: dict[tuple[str, int], int] = {}
        for name in step["inputs"] + step["outputs"]:
            if name is None:
                continue
            rec = plan["values"][name]
            nbytes = int(np.prod(rec["shape"], dtype=np.int64)) * np.dtype(rec["dtype"]).itemsize
            loc = rec["location"]
            if loc[0] in ("arena", "weights"):
                operands[(loc[0], loc[1])] = nbytes
        for launch in launches:
            count += 1
            assert set(launch) == {"kernel", "grid", "block", "shared", "args"}
            assert launch["kernel"] in kernels
            grid, block = launch["grid"], launch["block"]
            assert len(grid) == 3 and len(block) == 3 and min(grid) >= 1 and min(block) >= 1
            assert block[0] * block[1] * block[2] <= 1024 and max(grid[1:]) <= 65535
            assert launch["shared"] >= 0
            for arg in launch["args"]:
                if arg[0] == "ptr":
                    space, offset = arg[1], arg[2]
                    assert space in ("arena", "weights"), arg  # a device step never reads "ext"
                    limit = arena["cuda"] if space == "arena" else plan["weights_nbytes"]
                    assert (space, offset) in operands, (step["name"], arg)
                    assert 0 <= offset and offset + operands[(space, offset)] <= limit
                    if space == "arena":
                        assert offset % 4 == 0
                else:
                    assert arg[0] in ("i32", "i64", "f32") and len(arg) == 2
    return count


# -- the zoo -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ZOO)
def test_zoo_compiles_for_cuda(name: str, tmp_path: Path) -> None:
    model = zoo_model(name)
    out = compile_model(model, tmp_path / name, target="cuda", build=SM90)
    plan = _plan(out)
    for node in model.graph.node:
        if node.op_type in CLAIMED_KINDS:
            where = plan["onnx_nodes"][node.name]
            assert where.get("provider") == "cuda", (node.name, node.op_type, where)
    source = _source(out)
    assert check_launches(plan, source) > 0
    cuda = [p for p in plan["partitions"] if p["provider"] == "cuda"]
    assert cuda and all(p["module"]["source"] == "kernels/cuda/model.cu" for p in cuda)
    manifest = json.loads((out / "manifest.json").read_text())
    facts = manifest["target"]["providers"]["cuda"]
    assert "launches" not in facts  # moved into plan.json
    if NVCC is None:
        pytest.skip("nvcc not found: generated source checked, build skipped")
    assert facts["cubins"] == {"sm_90": "model.sm_90.cubin"}
    cubin = out / "kernels" / "cuda" / "model.sm_90.cubin"
    assert cubin.is_file() and cubin.read_bytes()[:4] == b"\x7fELF"
    assert "kernels/cuda/model.sm_90.cubin" in manifest["files"]


@needs_nvcc
def test_full_arch_set_and_facts(tmp_path: Path) -> None:
    out = compile_model(zoo_model("squeezenet"), tmp_path / "sq", target="cuda")
    manifest = json.loads((out / "manifest.json").read_text())
    facts = manifest["target"]["providers"]["cuda"]
    assert facts["cubins"] == {"sm_80": "model.sm_80.cubin", "sm_90": "model.sm_90.cubin"}
    assert facts["ptx"] == "model.ptx" and facts["ptx_arch"] == "compute_80"
    version = facts["cuda_version"]
    assert re.fullmatch(r"\d+\.\d+", version) and facts["nvcc_version"].startswith(version)
    if version.startswith("13."):
        assert facts["min_driver"] == ">= 580"
    kernels = out / "kernels" / "cuda"
    ptx = (kernels / "model.ptx").read_text()
    assert ".target sm_80" in ptx
    for name in ("model.cu", "model.sm_80.cubin", "model.sm_90.cubin", "model.ptx"):
        assert f"kernels/cuda/{name}" in manifest["files"]
    module = _plan(out)["partitions"][0]["module"]
    assert module == {
        "source": "kernels/cuda/model.cu",
        "cubins": {"sm_80": "kernels/cuda/model.sm_80.cubin", "sm_90": "kernels/cuda/model.sm_90.cubin"},
        "ptx": "kernels/cuda/model.ptx",
    }
    for kernel in re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", _source(out)):
        assert f".entry {kernel}(" in ptx  # extern "C": unmangled


def test_without_nvcc_only_the_source(tmp_path: Path) -> None:
    out = compile_model(zoo_model("squeezenet"), tmp_path / "sq", target="cuda", build=NO_NVCC)
    facts = json.loads((out / "manifest.json").read_text())["target"]["providers"]["cuda"]
    assert facts["cubins"] == {} and facts["ptx"] is None and facts["nvcc_version"] is None
    assert sorted(p.name for p in (out / "kernels" / "cuda").iterdir()) == ["model.cu"]


def test_deterministic(tmp_path: Path) -> None:
    a = compile_model(zoo_model("shufflenet"), tmp_path / "a", target="cuda", build=SM90)
    b = compile_model(zoo_model("shufflenet"), tmp_path / "b", target="cuda", build=SM90)
    for rel in ("plan.json", "manifest.json", "kernels/cuda/model.cu"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


# -- generated source, textually -------------------------------------------------------------------


def test_fused_conv_epilogue_inside_the_kernel(tmp_path: Path) -> None:
    out = compile_model(zoo_model("resnet50"), tmp_path / "r", target="cuda", build=NO_NVCC)
    plan, source = _plan(out), _source(out)
    kinds = {s["op_type"] for s in plan["steps"]}
    assert not kinds & {"Add", "Relu", "Sum", "BatchNormalization"}  # all fused into the convs
    residual = [s for s in plan["steps"] if s["op_type"] == "FusedConv" and len(s["inputs"]) == 4]
    assert residual
    for step in residual:
        assert step["attrs"]["activation"] == "Relu"
        assert len(step["launches"]) == 1  # no separate launch for bias / residual / ReLU
        text = _kernel(source, step["launches"][0]["kernel"])
        assert "__global__" not in text  # one function, up to the next kernel
        assert "v += bias[oc];" in text and "v += z[idx];" in text
        assert "(v < 0.0f ? 0.0f : v)" in text
        assert "As[" in text  # the tiled implicit GEMM


def _eltwise_chain_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5, 7])
    c = numpy_helper.from_array(np.linspace(-1, 1, 3 * 5 * 7, dtype=np.float32).reshape(3, 5, 7), "c")
    d = numpy_helper.from_array(np.linspace(0.5, 1.5, 7, dtype=np.float32), "d")
    nodes = [
        helper.make_node("Add", ["x", "c"], ["t0"], name="add"),
        helper.make_node("Sigmoid", ["t0"], ["t1"], name="sig"),
        helper.make_node("Mul", ["t1", "d"], ["t2"], name="mul"),
        helper.make_node("Tanh", ["t2"], ["t3"], name="tanh"),
        helper.make_node("Sub", ["t3", "x"], ["y"], name="sub"),
    ]
    graph = helper.make_graph(nodes, "chain", [x], [y], [c, d])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_fused_elementwise_is_one_kernel(tmp_path: Path) -> None:
    out = compile_model(_eltwise_chain_model(), tmp_path / "e", target="cuda", build=SM90)
    plan, source = _plan(out), _source(out)
    compute = [s for s in plan["steps"] if s["op_type"] != "Transfer"]
    assert [s["op_type"] for s in compute] == ["FusedElementwise"]
    (launch,) = compute[0]["launches"]
    assert source.count("__global__") == 1
    text = _kernel(source, launch["kernel"])
    for piece in ("expf(", "tanhf(", " + ", " * ", " - "):
        assert piece in text
    assert len([a for a in launch["args"] if a[0] == "ptr"]) == 4  # x, c, d, y: nothing in between
    check_launches(plan, source)


# -- a transformer block: the kernels the zoo does not reach -----------------------------------------


def _transformer_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    b, s, d = 2, 8, 16

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [init("wq", d, d), init("wk", d, d), init("wv", d, d), init("gamma", d), init("beta", d),
             init("w2", 2 * d, 5), init("wt", 3, 2 * d),
             numpy_helper.from_array(np.array(0.25, np.float32), "scale"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array([s * b, 2 * d], np.int64), "flat")]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scaled"),
        helper.make_node("Softmax", ["scaled"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="o"),
        helper.make_node("Add", ["o", "x"], ["h"], name="residual"),
        helper.make_node(
            "LayerNormalization", ["h", "gamma", "beta"], ["ln"], name="ln", axis=-1, epsilon=1e-5
        ),
        helper.make_node("Gelu", ["ln"], ["g"], name="gelu"),
        helper.make_node("Erf", ["g"], ["e"], name="erf"),
        helper.make_node("Concat", ["g", "e"], ["cat"], name="cat", axis=2),
        helper.make_node("ReduceMean", ["cat", "axes"], ["mean"], name="mean", keepdims=1),
        helper.make_node("ReduceSum", ["cat"], ["total"], name="total", keepdims=0),
        helper.make_node("Reshape", ["cat", "flat"], ["rows"], name="rows"),
        helper.make_node("Gemm", ["rows", "w2"], ["fc"], name="fc"),
        helper.make_node("Gemm", ["mean2", "wt"], ["fc2"], name="fc2", transB=1),
        helper.make_node("Reshape", ["mean", "flat2"], ["mean2"], name="mean2"),
    ]
    inits.append(numpy_helper.from_array(np.array([b, 2 * d], np.int64), "flat2"))
    nodes.insert(len(nodes) - 2, nodes.pop())  # mean2 before fc2
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, d])],
        [helper.make_tensor_value_info("fc", TensorProto.FLOAT, [b * s, 5]),
         helper.make_tensor_value_info("fc2", TensorProto.FLOAT, [b, 3]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_transformer_block(tmp_path: Path) -> None:
    model = _transformer_model()
    out = compile_model(model, tmp_path / "t", target="cuda", build=SM90)
    plan, source = _plan(out), _source(out)
    for node in model.graph.node:
        where = plan["onnx_nodes"][node.name]
        assert where.get("provider") == "cuda" or "eliminated" in where, (node.name, where)
    kinds = {s["op_type"] for s in plan["steps"] if s["provider"] == "cuda"}
    assert {"MatMul", "Softmax", "LayerNormalization", "Transpose", "Concat", "ReduceMean",
            "ReduceSum", "Gemm"} <= kinds  # fmt: skip
    assert "erff(" in source  # Gelu and Erf through the shared emitter
    assert "oa_warp_sum(" in source and "oa_warp_max(" in source
    assert "gemv" in source or "part[" in source or "lane" in source
    assert check_launches(plan, source) >= 10
    if NVCC is not None:
        assert (out / "kernels" / "cuda" / "model.sm_90.cubin").is_file()


# -- the provider contract ----------------------------------------------------------------------------


def test_provider_contract() -> None:
    p = CudaProvider()
    assert (p.name, p.runner, p.memory_space, p.alignment) == ("cuda", "cuda", "cuda", 256)
    g = Graph("g")
    x = g.add_input(Value("x", np.dtype(np.float32), (1, 4, 5, 5)))
    w = g.add_constant("w", np.ones((4, 4, 3, 3, 1), np.float32))
    x64 = g.add_input(Value("x64", np.dtype(np.float64), (2, 3)))
    t = g.make_value("t", np.dtype(np.float32), (1, 4, 5, 5))
    y = g.make_value("y", np.dtype(np.float32), (1, 4, 3, 3, 1))
    z = g.make_value("z", np.dtype(np.float64), (2, 3))
    transfer = Node("Transfer", [x], [t], {"from": "host", "to": "cuda"}, domain=AOT_DOMAIN, name="tr")
    conv3d = Node(
        "Conv",
        [t, w],
        [y],
        {
            "kernel_shape": [3, 3, 1],
            "strides": [1, 1, 1],
            "pads": [0] * 6,
            "dilations": [1, 1, 1],
            "group": 1,
        },
        name="c3",
    )
    relu64 = Node("Relu", [x64], [z], {}, name="r64")
    for node in (transfer, conv3d, relu64):
        g.add_node(node)
    claimed = p.claims(g)
    assert transfer in claimed and conv3d not in claimed and relu64 not in claimed
    assert p.scratch_nbytes(transfer) == 0


@needs_nvcc
def test_nvcc_failure_is_a_compile_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNX_AOT_CACHE_DIR", str(tmp_path / "cache"))
    assert NVCC is not None
    bad = 'extern "C" __global__ void k0(float* y) { int unused = 1; y[0] = 1.0f; }\n'
    with pytest.raises(CompileError, match="nvcc for sm_90 failed"):
        nvcc_mod.build_cuda(bad, tmp_path, NO_NVCC, NVCC, ("sm_90",), None)
