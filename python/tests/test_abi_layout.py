# SPDX-License-Identifier: Apache-2.0
"""The ctypes structures of oomb._lib lay out as the C headers' structs do (python/csrc/oomb_c.h and
oomb_cuda.h): every field at the C compiler's offset and every struct at its size. A field out of
place would not fail a call: it would hand the library another field's bytes (the GPU path's
structs are only exercised on a GPU), so this compiles the headers on the CPU and compares."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from oomb import _lib

CSRC = Path(__file__).resolve().parents[1] / "csrc"

STRUCTS = [  # (the ctypes class, the C type of the same layout)
    (_lib.StoreConfig, "oomb_store_config"),
    (_lib.ResidencyStats, "oomb_residency_stats"),
    (_lib.StoreStats, "oomb_store_stats"),
    (_lib.AttentionArgs, "oomb_attention_args"),
    (_lib.CudaAttentionArgs, "oomb_cuda_attention_args"),
    (_lib.PagedConfig, "oomb_paged_config"),
    (_lib.PagedStats, "oomb_paged_stats"),
    (_lib.CudaPagedConfig, "oomb_cuda_paged_config"),
    (_lib.PagedStats, "oomb_cuda_paged_stats"),
]


def c_layout(tmp_path):
    """{C type: (size, {field: offset})} as the C compiler lays them out."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "oomb_cuda.h"', "int main(void) {"]
    for cls, ctype in STRUCTS:
        lines.append(f'  printf("{ctype} size %zu\\n", sizeof({ctype}));')
        for name, _ in cls._fields_:
            lines.append(f'  printf("{ctype} {name} %zu\\n", offsetof({ctype}, {name}));')
    lines += ["  return 0;", "}"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c99", "-I", str(CSRC), str(src), "-o", str(exe)], check=True, capture_output=True)
    out = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        ctype, name, value = line.split()
        size, fields = out.setdefault(ctype, (None, {}))
        if name == "size":
            out[ctype] = (int(value), fields)
        else:
            fields[name] = int(value)
    return out


def test_ctypes_structs_match_the_c_headers(tmp_path):
    layout = c_layout(tmp_path)
    for cls, ctype in STRUCTS:
        size, fields = layout[ctype]
        assert ctypes.sizeof(cls) == size, f"{cls.__name__}: {ctypes.sizeof(cls)} bytes, {ctype}: {size}"
        for name, _ in cls._fields_:
            assert getattr(cls, name).offset == fields[name], \
                f"{cls.__name__}.{name} at {getattr(cls, name).offset}, {ctype}.{name} at {fields[name]}"
