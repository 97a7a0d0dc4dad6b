"""Damage an artifact the way a broken build pipeline would ship it: changed, then re-hashed so
the manifest still accepts it (only the golden self-test can notice)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

__all__ = ["rehash", "shift_library_weights"]


def rehash(art: Path, rel: str) -> None:
    """Make the manifest accept the changed file ``rel``."""
    manifest = json.loads((art / "manifest.json").read_text())
    data = (art / rel).read_bytes()
    manifest["files"][rel] = {**manifest["files"][rel], "size": len(data),
                              "sha256": hashlib.sha256(data).hexdigest()}
    manifest["files"][rel].pop("sample_sha256", None)
    (art / "manifest.json").write_text(json.dumps(manifest))


def shift_library_weights(art: Path) -> None:
    """Rebuild kernels/cpu/model.so so that its entry hands the first kernel its weights one float
    further on, and re-hash the source and the library."""
    from compiler.codegen.options import BuildOptions
    from compiler.codegen.toolchain import compile_flags

    source = (art / "kernels/cpu/model.c").read_text()
    broken, n = re.subn(r"\(weights \+ (\d+)\)", lambda m: f"(weights + {int(m.group(1)) + 4})", source,
                        count=1)
    assert n == 1, "no '(weights + N)' in the entry to shift"
    (art / "kernels/cpu/model.c").write_text(broken)
    flags = [f for f in compile_flags(BuildOptions()) if f != "-Werror"]
    subprocess.run(["cc", *flags, "model.c", "-o", "model.so", "-lm"], cwd=art / "kernels/cpu", check=True)
    rehash(art, "kernels/cpu/model.c")
    rehash(art, "kernels/cpu/model.so")
