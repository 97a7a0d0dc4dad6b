"""The provider packages register their kernels from an explicit list of modules.

Every module file of ``compiler/providers/c/`` and ``compiler/providers/cuda/`` is either a kernel
module named in its provider's ``KERNEL_MODULES`` (with its kernels in ``KERNELS``) or a support
module named in ``SUPPORT_MODULES``: a new kernel module left out of the list fails here instead
of silently never being registered.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from compiler.providers.c import provider as c_provider
from compiler.providers.c.common import CKernel as c_base
from compiler.providers.cuda import provider as cuda_provider
from compiler.providers.cuda.common import CudaKernel as cuda_base


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
    base = c_base if provider is c_provider else cuda_base
    for module in provider.KERNEL_MODULES:
        assert module.__name__.startswith(provider.__package__ + "."), module.__name__
        assert module.KERNELS and all(isinstance(k, base) for k in module.KERNELS), module.__name__
    for name in provider.SUPPORT_MODULES:
        module = importlib.import_module(f"{provider.__package__}.{name}")
        assert not hasattr(module, "KERNELS") or module is provider, name  # kernels only from the list


def test_kernel_tables_hold_every_listed_kernel() -> None:
    for provider in (c_provider, cuda_provider):
        listed = {kind for m in provider.KERNEL_MODULES for k in m.KERNELS for kind in k.kinds}
        assert provider.KERNELS.kinds() == listed
