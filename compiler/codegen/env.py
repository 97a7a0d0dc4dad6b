"""The one Jinja environment every code generator renders its templates with.

Kernel source text lives only in the repository's top-level ``templates/`` folder (``c/*.c.j2``,
``cuda/*.cu.j2``, ``report/``). ``templates_dir`` finds it both in a source checkout
(``<repo>/templates`` next to ``compiler/``) and in an installed wheel (the same folder shipped as
the package data ``compiler/_templates``). The environment is built once, with ``StrictUndefined``
so a misspelled context field fails the render instead of emitting an empty string, and each
render takes one frozen dataclass context (bound to the name ``ctx`` in the template). A kernel's
own name (and a CUDA kernel's comment) is not part of its context: the provider chooses it when
it assembles the model and passes it beside ``ctx`` (``fn``, ``name``, ``comment``), so kernels
whose contexts are equal are one function.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import jinja2

from runtime.errors import CompileError

__all__ = ["templates_dir", "environment", "render"]


def templates_dir() -> Path:
    """The folder holding ``c/``, ``cuda/`` and ``report/`` templates.

    In a source checkout (editable install) it is ``templates/`` beside ``compiler/``; a wheel
    installs the same folder as ``compiler/_templates`` (see pyproject.toml).
    """
    package = Path(__file__).resolve().parent.parent  # .../compiler
    for candidate in (package.parent / "templates", package / "_templates"):
        if (candidate / "c").is_dir():
            return candidate
    raise CompileError(
        f"kernel templates not found: looked for {package.parent / 'templates'} and "
        f"{package / '_templates'} (a broken install?)"
    )


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The cached environment: strict undefineds, no autoescape, stable whitespace handling."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(template: str, ctx: Any, **names: str) -> str:
    """Render ``template`` (a path relative to ``templates/``) with one frozen dataclass context
    and the identifiers ``names`` the provider chose (the kernel function's name)."""
    if not dataclasses.is_dataclass(ctx) or isinstance(ctx, type):
        raise TypeError(f"render({template!r}) takes a dataclass instance, got {type(ctx).__name__}")
    params = getattr(type(ctx), "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"render({template!r}) takes a frozen dataclass, got {type(ctx).__name__}")
    try:
        return environment().get_template(template).render(ctx=ctx, **names)
    except jinja2.TemplateError as exc:
        raise CompileError(f"rendering template {template!r} failed: {exc}") from exc
