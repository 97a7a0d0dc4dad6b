"""Loss reference kernels: NegativeLogLikelihoodLoss (SoftmaxCrossEntropyLoss is LogSoftmax plus
this op, see the frontend).

The loss of element (n, d...) is ``-weight[t] * X[n, t, d...]`` with ``t = target[n, d...]``;
elements whose target is ``ignore_index`` weigh 0. "mean" divides the weighted sum by the sum of
the weights that apply (so ignored elements leave the mean as well as the sum), as ONNX defines it.
float16 inputs are computed in float32.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["negative_log_likelihood"]


def negative_log_likelihood(
    xp: Any, x: Any, target: Any, weight: Any | None, reduction: str, ignore_index: int | None
) -> Any:
    """The NegativeLogLikelihoodLoss of ``x`` (N, C, d...) against ``target`` (N, d...)."""
    if x.dtype.kind == "f" and x.dtype.itemsize < 4:
        x = x.astype(xp.float32)
    classes = int(x.shape[1])
    ignored = target == ignore_index if ignore_index is not None else xp.zeros(target.shape, dtype=bool)
    if bool(xp.any(~ignored & ((target < 0) | (target >= classes)))):
        raise RuntimeKernelError(f"NegativeLogLikelihoodLoss: a target is outside [0, {classes})")
    safe = xp.where(ignored, 0, target).astype(xp.int64)
    picked = xp.take_along_axis(x, xp.expand_dims(safe, 1), axis=1)[:, 0]
    weights = xp.ones(target.shape, dtype=x.dtype) if weight is None else weight.astype(x.dtype)[safe]
    weights = xp.where(ignored, xp.zeros((), dtype=x.dtype), weights)
    loss = -weights * picked
    if reduction == "none":
        return loss
    if reduction == "sum":
        return xp.sum(loss)
    return xp.sum(loss) / xp.sum(weights)


@register("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """NegativeLogLikelihoodLoss(X, target, weight?) with ``reduction`` and ``ignore_index`` (or None)."""
    x, target, weight = fill_optional("NegativeLogLikelihoodLoss", inputs, 3)
    loss = negative_log_likelihood(xp, x, target, weight, attrs["reduction"], attrs["ignore_index"])
    return finish(xp, "NegativeLogLikelihoodLoss", [loss], outputs)
