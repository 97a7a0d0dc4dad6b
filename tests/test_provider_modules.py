"""The provider packages register their kernels from an explicit list of modules.

Every module file of ``compiler/providers/c/`` and ``compiler/providers/cuda/`` is either a kernel
module named in its provider's ``KERNEL_MODULES`` or a support module named in
``SUPPORT_MODULES``: a new kernel module left out of the list fails here instead of silently
never being registered.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from compiler.providers.c import provider as c_provider
from compiler.providers.cuda import provider as cuda_provider


@pytest.mark.parametrize("provider", [c_provider, cuda_provider], ids=["c", "cuda"])
def test_every_module_of_a_provider_package_is_listed(provider: ModuleType) -> None:
    package = Path(provider.__file__).parent
    files = {p.stem for p in package.glob("*.py")} - {"__init__"}
    kernels = [m.__name__.rsplit(".", 1)[-1] for m in provider.KERNEL_MODULES]
    assert len(kernels) == len(set(kernels))
    assert not set(kernels) & set(provider.SUPPORT_MODULES)
    assert files == set(kernels) | set(provider.SUPPORT_MODULES), (
        "a module of the package is in neither KERNEL_MODULES nor SUPPORT_MODULES "
        f"(or a listed one is missing): {sorted(files ^ (set(kernels) | set(provider.SUPPORT_MODULES)))}"
    )
    for module in provider.KERNEL_MODULES:
        assert module.__name__.startswith(provider.__package__ + "."), module.__name__
