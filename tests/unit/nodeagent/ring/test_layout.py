"""layout mirrors native/include/collscope_ring.h: every size, offset and constant, compiled.

A C program generated from the dtypes prints ``sizeof``/``offsetof`` of every field the reader
maps and the value of every macro it mirrors; a field the header lacks fails to compile. The
bundle names of the enumerations are compared with the name lists in the header's comments.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from collscope.nodeagent.ring import layout

ROOT = pathlib.Path(__file__).resolve().parents[4]
HEADER = ROOT / "native" / "include" / "collscope_ring.h"
# Module constants that are not header macros: the reader's own limits (the plausible-time
# window of issue 15 item 3 is the reader's rule, not part of the format the plugin writes).
NOT_MACROS = {"INT64_MAX", "TIME_SLACK_NS", "EPOCH_FLOOR_NS"}
# Python name -> macro name, where it is not "COLLSCOPE_" + the Python name.
RENAMED = {"MAGIC": "COLLSCOPE_RING_MAGIC", "VERSION": "COLLSCOPE_RING_VERSION"}
# Enumeration name tables: Python table, macro prefix, and the macro suffix of names whose
# suffix is not simply the upper-cased name ("" and the func "Unknown" are UNKNOWN).
ENUMS = {
    "FUNC_NAMES": "COLLSCOPE_FUNC_",
    "ALGO_NAMES": "COLLSCOPE_ALGO_",
    "PROTO_NAMES": "COLLSCOPE_PROTO_",
    "DTYPE_NAMES": "COLLSCOPE_DTYPE_",
}
SUFFIX = {
    "": "UNKNOWN",
    "CollNetDirect": "COLLNET_DIRECT",
    "CollNetChain": "COLLNET_CHAIN",
    "NVLSTree": "NVLS_TREE",
}


def _macros() -> dict[str, int]:
    out = {}
    for name in dir(layout):
        value = getattr(layout, name)
        if name.isupper() and isinstance(value, int) and name not in NOT_MACROS:
            out[RENAMED.get(name, f"COLLSCOPE_{name}")] = value
    for table, prefix in ENUMS.items():
        for code, label in enumerate(getattr(layout, table)):
            if label is not None:
                out[prefix + SUFFIX.get(label, label.upper())] = code
    return out


def _fields(dtype: np.dtype[np.void]) -> list[str]:
    assert dtype.names is not None
    return list(dtype.names)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """name -> value printed by a C program compiled against the header."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc or cc) on PATH: cannot compile against the ring header")
    lines = []
    for struct, dtype in layout.STRUCTS.items():
        lines.append(f'P("{struct}", sizeof({struct}));')
        for field in _fields(dtype):
            lines.append(f'P("{struct}.{field}@", offsetof({struct}, {field}));')
            lines.append(f'P("{struct}.{field}#", sizeof((({struct} *)0)->{field}));')
    lines.append('P("union collscope_event", sizeof(union collscope_event));')
    for field in ("idx", "type"):
        lines.append(f'P("event.{field}@", offsetof(union collscope_event, common.{field}));')
    for macro in _macros():
        lines.append(f'P("{macro}", (unsigned long long)({macro}));')
    source = (
        '#include <stdio.h>\n#include "collscope_ring.h"\n'
        '#define P(n, v) printf("%s %llu\\n", n, (unsigned long long)(v))\n'
        "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n"
    )
    work = tmp_path_factory.mktemp("abi")
    (work / "abi.c").write_text(source)
    build = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", f"-I{HEADER.parent}", "-o", "abi", "abi.c"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert build.returncode == 0, f"does not compile against {HEADER}:\n{build.stderr}"
    out = subprocess.run(
        [str(work / "abi")], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return {name: int(value) for name, value in (line.rsplit(" ", 1) for line in out.splitlines())}


@pytest.mark.parametrize("struct", list(layout.STRUCTS))
def test_struct_matches_header(struct: str, compiled: dict[str, int]) -> None:
    dtype = layout.STRUCTS[struct]
    assert dtype.itemsize == compiled[struct]
    for field in _fields(dtype):
        assert layout.field_offset(dtype, field) == compiled[f"{struct}.{field}@"], field
        assert layout.field_size(dtype, field) == compiled[f"{struct}.{field}#"], field


def test_event_union_matches_header(compiled: dict[str, int]) -> None:
    assert layout.EVENT.itemsize == compiled["union collscope_event"]
    for field in ("idx", "type"):
        assert layout.field_offset(layout.EVENT, field) == compiled[f"event.{field}@"]


def test_constants_match_header_macros(compiled: dict[str, int]) -> None:
    macros = _macros()
    assert len(macros) > 60  # every constant above, enumerations included
    wrong = {m: (v, compiled[m]) for m, v in macros.items() if compiled[m] != v}
    assert not wrong, f"layout value, header value: {wrong}"


def _comment_names(label: str) -> list[list[str]]:
    text = HEADER.read_text()
    return [
        re.findall(r'"([^"]*)"', body) for body in re.findall(rf"/\* {label}(.*?)\*/", text, re.S)
    ]


def test_names_match_header_comments() -> None:
    (func,) = _comment_names(r"names \(index = value\):")
    algo, proto = _comment_names("bundle names:")
    (dtype,) = _comment_names("names:")
    # Code 0 of func is "Unknown" (bundle-v1 needs a non-empty op name); 13 and 14 unassigned.
    assert ["Unknown", *func[1:13], None, None, func[15]] == list(layout.FUNC_NAMES)
    assert algo == list(layout.ALGO_NAMES)
    assert proto == list(layout.PROTO_NAMES)
    assert dtype == list(layout.DTYPE_NAMES)
