"""The columnar wire form of bundle records: what ``/v1/window`` answers when asked for it.

Why: the operator pulls the window of every rank of a job on a trigger; at 1,024 ranks that is
~80 MiB of ``records.jsonl`` lines, and one pydantic validation per record cost it 2.3 s. Here
each table of ``tables`` travels as one raw little-endian array per column, so the agent
encodes straight from its window's numpy tables and the operator decodes straight into them,
validating whole columns at once (bench/README.md, "Operator: hang → Diagnosed").

Media type ``application/vnd.collscope.columns.v1``, asked for with ``Accept`` (``server.py``;
anything else gets ``application/x-ndjson`` as before). Layout, all integers little-endian::

    offset 0   8 bytes  magic b"CSCOLv1\\n"
    offset 8   u32      H, the header's length in bytes (at most MAX_HEADER_BYTES)
    offset 12  H bytes  header: one UTF-8 JSON object, below
    then       0-7 zero bytes, so the data section starts at a multiple of 8
    data       the column buffers, each where the header says (offsets from the data start)

    {"schema": "collscope.window/v1",
     "comm_ids": ["0x1f3a", ...],           # communicator ids, indexed by the comm columns
     "strings": ["", "AllReduce", ...],     # names, indexed by op/dtype/algo/proto/name/...
     "tables": {"states": {"rows": 2, "columns": {"rank": {"dtype": "<i4", "offset": 0},
                                                  "ts": {"dtype": "<i8", "offset": 8}, ...}},
                "comms": ..., "ops": ..., "flows": ..., "hw": ..., "liveness": ...}}

Columns (``COLUMNS``) are those of the ``tables`` dtype of the same name, with one exception:
``states`` carries ``nflows`` (``<i8``, flows of the record) instead of ``flow_lo``/``flow_hi``,
and ``flows`` lists every state's flows in state order, so ``sum(nflows) == flows.rows``. Values
mean what the ``tables`` docstring says (-1: absent peer, kernel, unused flow count); every rule
of docs/spec/bundle-v1.md holds (non-negative counts, ``ready >= sent >= done``, ``comm_rank <
nranks``, ``end >= start``, ...). Unknown tables and columns are ignored (added, never renamed,
within v1); ``hw`` and ``liveness`` may be absent (no rows: an agent from before liveness
sends none, an operator from before it ignores it); any other missing table or column, a
dtype other than the one listed, a buffer outside the data, an index outside
``comm_ids``/``strings`` or a value the spec forbids is an error naming the field and row
(``states[12].seq``). ``liveness.state`` is a code into ``tables.LIVENESS_STATES`` (0
``running`` ... 5 ``unreachable``), ``liveness.heartbeat`` -1 when unknown.

``decode`` distrusts its input (STYLE 11) and raises ``errors.BundleFormatError``; it accepts
exactly the records that ``reader`` accepts as JSON lines, and ``BundleBuilder.add_tables`` of
what it returns builds the same tables as ``reader.load_lines`` of the same records.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import tables

MEDIA_TYPE: Final = "application/vnd.collscope.columns.v1"
SCHEMA: Final = "collscope.window/v1"
MAGIC: Final = b"CSCOLv1\n"
# A header holds the string tables: a window's few hundred names are a few KB; 64 MiB is
# not a header but a payload that must not be parsed as JSON.
MAX_HEADER_BYTES: Final = 64 << 20
_PREFIX = struct.Struct("<8sI")
_ALIGN = 8
_COMM_ID = re.compile(r"0x[0-9a-f]+")
_COMM_ID_MAX = 34  # as models.CommHex
_OP_MAX = 64  # as models.OpRecord.op


def _wire(dtype: np.dtype[Any], *, drop: tuple[str, ...] = ()) -> dict[str, np.dtype[Any]]:
    assert dtype.names is not None
    out: dict[str, np.dtype[Any]] = {}
    for name in dtype.names:
        if name not in drop:
            out[name] = dtype.fields[name][0].newbyteorder("<")  # type: ignore[index]
    return out


# The wire columns of each table and their dtypes (little-endian forms of the tables' dtypes).
COLUMNS: Final[dict[str, dict[str, np.dtype[Any]]]] = {
    "comms": _wire(tables.COMM_DTYPE),
    "ops": _wire(tables.OP_DTYPE),
    "states": {
        **_wire(tables.STATE_DTYPE, drop=("flow_lo", "flow_hi")),
        "nflows": np.dtype("<i8"),
    },
    "flows": _wire(tables.FLOW_DTYPE),
    "hw": _wire(tables.HW_DTYPE),
    "liveness": _wire(tables.LIVENESS_DTYPE),
}
_DTYPES: Final = {
    "comms": tables.COMM_DTYPE,
    "ops": tables.OP_DTYPE,
    "states": tables.STATE_DTYPE,
    "flows": tables.FLOW_DTYPE,
    "hw": tables.HW_DTYPE,
    "liveness": tables.LIVENESS_DTYPE,
}
_OPTIONAL_TABLES: Final = frozenset({"hw", "liveness"})


@dataclasses.dataclass(frozen=True)
class Part:
    """Decoded, validated tables of one answer, in the order sent (``tables.Tables``): states'
    ``flow_lo``/``flow_hi`` index ``flows``; indices refer to this part's own string tables."""

    comm_ids: tuple[str, ...]
    strings: tuple[str, ...]
    comms: tables.Table
    ops: tables.Table
    states: tables.Table
    flows: tables.Table
    hw: tables.Table
    liveness: tables.Table = dataclasses.field(default_factory=tables.no_liveness)


# -- encoding ------------------------------------------------------------------------------
def encode(part: tables.Tables) -> bytes:
    """The columnar answer for ``part`` (a ``Bundle`` cut out of the agent's window), its
    tables in their own row order. Like the writer, trusts what it is given."""
    states, flows = tables.contiguous_flows(part.states, part.flows)
    source: dict[str, tables.Table] = {
        "comms": part.comms,
        "ops": part.ops,
        "states": states,
        "flows": flows,
        "hw": part.hw,
        "liveness": part.liveness,
    }
    buffers: list[bytes] = []
    size = 0
    described: dict[str, Any] = {}
    for name, columns in COLUMNS.items():
        table = source[name]
        cols: dict[str, Any] = {}
        for col, dtype in columns.items():
            if col == "nflows":
                values: npt.NDArray[Any] = table["flow_hi"] - table["flow_lo"]
            else:
                values = table[col]
            raw = np.ascontiguousarray(values, dtype=dtype).tobytes()
            cols[col] = {"dtype": dtype.str, "offset": size}
            pad = -len(raw) % _ALIGN
            buffers += [raw, bytes(pad)] if pad else [raw]
            size += len(raw) + pad
        described[name] = {"rows": len(table), "columns": cols}
    header = json.dumps(
        {
            "schema": SCHEMA,
            "comm_ids": list(part.comm_ids),
            "strings": list(part.strings),
            "tables": described,
        },
        separators=(",", ":"),
    ).encode()
    lead = _PREFIX.size + len(header)
    return b"".join([_PREFIX.pack(MAGIC, len(header)), header, bytes(-lead % _ALIGN), *buffers])


# -- decoding ------------------------------------------------------------------------------
def decode(body: bytes, *, where: str) -> Part:
    """Validate and decode one columnar answer; ``where`` names it in errors (the URL).

    Raises ``errors.BundleFormatError`` (``where``, field such as ``flows[3].done``, reason)
    for anything ``reader`` would reject as JSON lines, and for a damaged layout.
    """
    if len(body) < _PREFIX.size:
        raise _error(where, f"{len(body)} bytes: too short for the {MAGIC!r} prefix")
    magic, hlen = _PREFIX.unpack_from(body)
    if magic != MAGIC:
        raise _error(where, f"magic {magic!r}, expected {MAGIC!r}: not {MEDIA_TYPE}")
    if hlen > MAX_HEADER_BYTES or _PREFIX.size + hlen > len(body):
        raise _error(where, f"header of {hlen} bytes does not fit in {len(body)} bytes")
    try:
        header = json.loads(body[_PREFIX.size : _PREFIX.size + hlen])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _error(where, f"header is not UTF-8 JSON: {e}", field="header") from e
    if not isinstance(header, dict):
        raise _error(where, "not a JSON object", field="header")
    if header.get("schema") != SCHEMA:
        raise _error(where, f"{header.get('schema')!r}, expected {SCHEMA!r}", field="schema")
    comm_ids = _texts(header, "comm_ids", where)
    for i, c in enumerate(comm_ids):
        if not _COMM_ID.fullmatch(c) or len(c) > _COMM_ID_MAX:
            raise _error(
                where, f"not a 0x-prefixed lowercase hex id: {c[:40]!r}", field=f"comm_ids[{i}]"
            )
    strings = _texts(header, "strings", where)
    described = header.get("tables")
    if not isinstance(described, dict):
        raise _error(where, "missing or not an object", field="tables")
    lead = _PREFIX.size + hlen
    data = memoryview(body)[lead + (-lead % _ALIGN) :]
    got = {name: _table(described, name, data, where) for name in COLUMNS}
    check = _Checker(where, len(comm_ids), strings)
    check.comms(got["comms"])
    check.ops(got["ops"])
    states, flows = check.states(got["states"], got["flows"])
    check.hw(got["hw"])
    check.liveness(got["liveness"])
    return Part(
        comm_ids, strings, got["comms"], got["ops"], states, flows, got["hw"], got["liveness"]
    )


def _texts(header: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = header.get(key)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise _error(where, "missing or not a list of strings", field=key)
    return tuple(values)


def _table(described: dict[str, Any], name: str, data: memoryview, where: str) -> tables.Table:
    """One table's columns, bounds- and dtype-checked, as a structured array of its dtype."""
    spec = described.get(name)
    out_dtype = _DTYPES[name]
    if spec is None and name in _OPTIONAL_TABLES:
        return np.zeros(0, out_dtype)
    rows = spec.get("rows") if isinstance(spec, dict) else None
    columns = spec.get("columns") if isinstance(spec, dict) else None
    if type(rows) is not int or rows < 0 or not isinstance(columns, dict):
        raise _error(where, "needs 'rows' >= 0 and 'columns'", field=f"tables.{name}")
    if rows > len(data):  # every column takes at least a byte a row: allocate nothing absurd
        raise _error(
            where, f"{rows} rows in a {len(data)}-byte data section", field=f"tables.{name}"
        )
    out = np.empty(rows, out_dtype)
    for col, dtype in COLUMNS[name].items():
        field = f"tables.{name}.{col}"
        c = columns.get(col)
        if not isinstance(c, dict):
            raise _error(where, "missing column", field=field)
        if c.get("dtype") != dtype.str:
            raise _error(where, f"dtype {c.get('dtype')!r}, expected {dtype.str!r}", field=field)
        offset = c.get("offset")
        if type(offset) is not int or offset < 0 or offset + rows * dtype.itemsize > len(data):
            raise _error(
                where,
                f"{rows} rows at offset {offset!r} overrun the {len(data)}-byte data section",
                field=field,
            )
        # states' nflows waits in flow_hi (same dtype) until _Checker.states places the flows
        into = "flow_hi" if col == "nflows" else col
        out[into] = np.frombuffer(data, dtype, count=rows, offset=offset)
    return out


class _Checker:
    """The rules of ``models`` over whole columns; the first bad row is named."""

    def __init__(self, where: str, n_comms: int, strings: tuple[str, ...]) -> None:
        self.where = where
        self.n_comms = n_comms
        self.n_strings = len(strings)
        self.op_ok = np.array([0 < len(s) <= _OP_MAX for s in strings], dtype=bool)

    def _require(
        self, table: str, col: str, ok: npt.NDArray[np.bool_], why: Callable[[int], str]
    ) -> None:
        if not ok.all():
            row = int(np.flatnonzero(~ok)[0])
            raise _error(self.where, why(row), field=f"{table}[{row}].{col}")

    def _min(self, table: str, t: tables.Table, cols: tuple[str, ...], low: int = 0) -> None:
        for col in cols:
            v = t[col]
            ok = v >= low
            if not ok.all():
                row = int(np.flatnonzero(~ok)[0])
                why = f"must be >= {low} (got {int(v[row])})"
                raise _error(self.where, why, field=f"{table}[{row}].{col}")

    def _index(self, table: str, t: tables.Table, cols: tuple[str, ...], what: str) -> None:
        size = self.n_comms if what == "comm_ids" else self.n_strings
        for col in cols:
            v = t[col]
            ok = (v >= 0) & (v < size)
            if not ok.all():
                row = int(np.flatnonzero(~ok)[0])
                why = f"index {int(v[row])} outside {what} (size {size})"
                raise _error(self.where, why, field=f"{table}[{row}].{col}")

    def _op(self, table: str, t: tables.Table) -> None:
        self._index(table, t, ("op",), "strings")
        ok = self.op_ok[t["op"]]
        self._require(table, "op", ok, lambda r: f"op name must have 1 to {_OP_MAX} characters")

    def comms(self, t: tables.Table) -> None:
        self._min("comms", t, ("rank", "ts", "comm_rank"))
        self._min("comms", t, ("nranks", "nnodes"), 1)
        self._index("comms", t, ("comm",), "comm_ids")
        self._index("comms", t, ("name",), "strings")
        cr, n = t["comm_rank"], t["nranks"]
        self._require("comms", "comm_rank", cr < n, lambda r: f"comm_rank {cr[r]} >= nranks {n[r]}")

    def ops(self, t: tables.Table) -> None:
        self._min("ops", t, ("rank", "ts", "seq", "bytes", "channels", "start", "end"))
        self._min("ops", t, ("peer",), -1)
        self._index("ops", t, ("comm",), "comm_ids")
        self._index("ops", t, ("dtype", "algo", "proto"), "strings")
        self._op("ops", t)
        s, e = t["start"], t["end"]
        self._require("ops", "end", e >= s, lambda r: f"end {e[r]} < start {s[r]}")

    def states(self, t: tables.Table, flows: tables.Table) -> tuple[tables.Table, tables.Table]:
        """Checked states with ``flow_lo``/``flow_hi`` placed (``flow_hi`` holds the wire's
        ``nflows`` until then), and their checked flows; both changed in place."""
        self._min("states", t, ("rank", "ts", "seq", "bytes", "start"))
        self._min("states", t, ("kernel_channels",), -1)
        self._index("states", t, ("comm",), "comm_ids")
        self._op("states", t)
        kc, kd = t["kernel_channels"], t["kernel_done"]
        has = kc >= 0
        self._require(
            "states",
            "kernel_done",
            ~has | ((kd >= 0) & (kd <= kc)),
            lambda r: f"need 0 <= done <= channels (got {kd[r]}, {kc[r]})",
        )
        n = t["flow_hi"].copy()
        ok = (n >= 0) & (n <= len(flows))  # no sum of absurd counts wraps to the right total
        if not ok.all():
            row = int(np.flatnonzero(~ok)[0])
            why = f"{int(n[row])} flows: not in [0, {len(flows)}], the rows of the flows table"
            raise _error(self.where, why, field=f"states[{row}].nflows")
        total = int(n.sum()) if len(n) else 0
        if total != len(flows):
            raise _error(
                self.where,
                f"states' nflows add up to {total}, flows has {len(flows)} rows",
                field="states.nflows",
            )
        kd[~has] = -1  # absent kernel object, as a JSON line read back has it
        hi = np.cumsum(n)
        t["flow_lo"], t["flow_hi"] = hi - n, hi
        return t, self.flows(flows)

    def flows(self, f: tables.Table) -> tables.Table:
        self._min("flows", f, ("channel", "peer", "total", "done", "idle_ns"))
        d = f["dir"]
        self._require(
            "flows",
            "dir",
            (d == tables.SEND) | (d == tables.RECV),
            lambda r: f"must be {tables.SEND} (send) or {tables.RECV} (recv), got {d[r]}",
        )
        send = d == tables.SEND
        rd, sn, dn, po, co = f["ready"], f["sent"], f["done"], f["posted"], f["consumed"]
        self._require(
            "flows",
            "done",
            ~send | ((rd >= sn) & (sn >= dn)),
            lambda r: f"need ready >= sent >= done (got {rd[r]}, {sn[r]}, {dn[r]})",
        )
        self._require(
            "flows",
            "done",
            send | ((po >= dn) & (dn >= co) & (co >= 0)),
            lambda r: f"need posted >= done >= consumed >= 0 (got {po[r]}, {dn[r]}, {co[r]})",
        )
        recv = ~send  # unused counts are -1, as a JSON line read back has them
        po[send], co[send], rd[recv], sn[recv] = -1, -1, -1, -1
        return f

    def hw(self, t: tables.Table) -> None:
        self._min("hw", t, ("rank", "ts"))
        self._index("hw", t, ("node", "device", "metric"), "strings")

    def liveness(self, t: tables.Table) -> None:
        self._min("liveness", t, ("rank", "ts", "state"))
        self._min("liveness", t, ("heartbeat",), -1)
        n, code = len(tables.LIVENESS_STATES), t["state"]
        self._require(
            "liveness",
            "state",
            code < n,
            lambda r: (
                f"state code {code[r]} outside 0..{n - 1} ({', '.join(tables.LIVENESS_STATES)})"
            ),
        )


def _error(where: str, reason: str, *, field: str | None = None) -> errors.BundleFormatError:
    return errors.BundleFormatError(where, reason, field=field)
