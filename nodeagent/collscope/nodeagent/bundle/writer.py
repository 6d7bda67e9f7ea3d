"""Writes a ``Bundle`` as a trace bundle (docs/spec/bundle-v1.md): a directory or a ``.tar.gz``.

Layout written::

    OUT/                          or  OUT.tar.gz holding OUT/ (the archive name minus suffix)
      job.json                    Job.model_dump_json(by_alias=True, exclude_none=True)
      records.jsonl.gz            (records.jsonl with compress=False)
      flows.jsonl.gz              net_flows, when given (flows.jsonl with compress=False)
      liveness.jsonl.gz           the bundle's liveness rows, when it has any
      truth.json ...              extra_files, verbatim

``records.jsonl`` holds comms, then ops, states and hw, each table in its (rank, time) order, one
compact JSON object per line: the same objects as ``Bundle.iter_records()`` dumped with
``exclude_none`` (``peer`` only for point-to-point ops, ``kernel`` only when known), but
formatted straight from the numpy rows a block at a time, which is about ten times faster than
building a pydantic model per record and never holds more than one block of text.

The writer trusts the ``Bundle``: rows that break the spec (``sent > ready`` from a buggy
producer) are written as they are, and ``reader.load`` then rejects them naming file and line.

Crash safety: everything is written under a hidden ``.NAME.XXXX.partial`` name beside ``out``,
flushed to disk, and renamed into place last, so ``out`` is either absent, or the old file, or
the whole new bundle, even after a power loss.
"""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import pathlib
import secrets
import shutil
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pydantic

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import models, tables

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
JOB = "job.json"
RECORDS = "records.jsonl"
NET_FLOWS = "flows.jsonl"
LIVENESS = "liveness.jsonl"
# zlib level on records.jsonl, measured on state records with 8 flows: level 6 (gzip's default)
# shrinks 12.4x at ~120 MB/s, under half the time spent formatting; level 1 shrinks 9.4x at
# ~300 MB/s (bundles 32% bigger, for bug reports too); level 9 13.1x at ~60 MB/s.
GZIP_LEVEL = 6
# The .tar.gz around an already gzipped records file: deflating it again gains nothing, so spend
# as little time on it as zlib allows.
GZIP_LEVEL_PACKED = 1
# Rows formatted per block: ~4 MB of text for state records with 8 flows, few enough Python
# objects alive at once, many enough to amortise each numpy -> list conversion.
_BLOCK_ROWS = 4096


def write(
    bundle: tables.Bundle,
    out: str | os.PathLike[str],
    *,
    compress: bool = True,
    extra_files: Mapping[str, str] | None = None,
    net_flows: Iterable[models.NetFlow] | None = None,
) -> pathlib.Path:
    """Write ``bundle`` to ``out`` and return the path written (``out`` itself).

    ``out`` ending in ``.tar.gz``/``.tgz`` makes an archive (replacing a file of that name);
    anything else a directory, which may exist only if empty or holding a previous bundle
    (regular files, ``job.json`` among them), which is then replaced; otherwise
    ``FileExistsError``, so a mistyped ``out`` never deletes anything else. ``compress`` gzips
    ``records.jsonl`` (also inside an archive). ``extra_files`` maps plain file names to text
    written verbatim beside ``job.json`` (``{"truth.json": ...}``). ``net_flows`` (streamed,
    never held whole) become ``flows.jsonl``, gzipped like the records.
    """
    target = pathlib.Path(out)
    extras = _checked_extras(
        extra_files or {}, flows=net_flows is not None, liveness=len(bundle.liveness) > 0
    )
    job_text = _job_json(bundle.job)
    archive = target.name.endswith(ARCHIVE_SUFFIXES)
    check_target(target)
    staging = _partial(target)
    os.mkdir(staging)
    packed = staging.with_name(staging.name + ".tar.gz")
    try:
        names = _write_dir(
            staging, bundle, job_text, compress=compress, extras=extras, net_flows=net_flows
        )
        if archive:
            _write_tar(
                staging,
                names,
                packed,
                root=_archive_stem(target.name),
                level=GZIP_LEVEL_PACKED if compress else GZIP_LEVEL,
            )
            _fsync(packed)
            os.replace(packed, target)
        else:
            for name in names:
                _fsync(staging / name)
            _fsync(staging)
            _publish_dir(staging, target)
        _fsync(target.parent)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
        packed.unlink(missing_ok=True)
    return target


def _write_dir(
    root: pathlib.Path,
    bundle: tables.Bundle,
    job_text: str,
    *,
    compress: bool,
    extras: Mapping[str, str],
    net_flows: Iterable[models.NetFlow] | None = None,
) -> list[str]:
    """Write the bundle's files into ``root``; returns their names, job.json first."""
    (root / JOB).write_bytes(job_text.encode("utf-8") + b"\n")
    names = [JOB, _write_lines(root, RECORDS, record_blocks(bundle), compress=compress)]
    if net_flows is not None:
        names.append(_write_lines(root, NET_FLOWS, net_flow_blocks(net_flows), compress=compress))
    if len(bundle.liveness):
        names.append(_write_lines(root, LIVENESS, liveness_blocks(bundle), compress=compress))
    for name, text in extras.items():
        (root / name).write_bytes(text.encode("utf-8"))  # verbatim: no newline translation
    return [*names, *extras]


def _write_lines(root: pathlib.Path, stem: str, blocks: Iterable[str], *, compress: bool) -> str:
    """Write text ``blocks`` to ``stem`` (``stem.gz`` when compressing); returns the name."""
    name = stem + ".gz" if compress else stem
    with open(root / name, "wb") as raw:
        if compress:
            # mtime=0: the same bundle gives the same bytes (diffable, cacheable).
            with gzip.GzipFile(
                filename=stem, mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0
            ) as packed:
                for block in blocks:
                    packed.write(block.encode("utf-8"))
        else:
            for block in blocks:
                raw.write(block.encode("utf-8"))
    return name


def net_flow_blocks(flows: Iterable[models.NetFlow]) -> Iterator[str]:
    """``flows.jsonl`` as text blocks of up to ``_BLOCK_ROWS`` lines, each line ending ``\\n``."""
    quoted: dict[str, str] = {}  # endpoint and switch names repeat: quote each once

    def q(text: str) -> str:
        out = quoted.get(text)
        if out is None:
            out = quoted[text] = json.dumps(text)
        return out

    lines: list[str] = []
    for f in flows:
        lines.append(
            f'{{"ts":{f.ts},"src":{q(f.src)},"dst":{q(f.dst)},"bytes":{f.bytes},'
            f'"duration":{f.duration},"switches":[{",".join(map(q, f.switches))}]}}\n'
        )
        if len(lines) >= _BLOCK_ROWS:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)


def liveness_blocks(bundle: tables.Bundle) -> Iterator[str]:
    """``liveness.jsonl`` as one text block (a few lines per rank), ``heartbeat`` when known."""
    lines = [rec.model_dump_json(exclude_none=True) + "\n" for rec in bundle.iter_liveness()]
    if lines:
        yield "".join(lines)


def _write_tar(
    staging: pathlib.Path, names: list[str], dest: pathlib.Path, *, root: str, level: int
) -> None:
    """A tar.gz of the files ``names`` in ``staging``, inside one top-level directory ``root``."""
    with tarfile.open(dest, "w:gz", compresslevel=level) as tar:
        tar.add(staging, arcname=root, recursive=False)
        for name in names:
            tar.add(staging / name, arcname=f"{root}/{name}", recursive=False)


def record_blocks(bundle: tables.Bundle) -> Iterator[str]:
    """``records.jsonl`` as text blocks of up to ``_BLOCK_ROWS`` lines, each line ending ``\\n``.

    Comms, ops, states, hw: the order of ``Bundle.iter_records()``.
    """
    ids = [json.dumps(c) for c in bundle.comm_ids]
    s = [json.dumps(t) for t in bundle.strings]
    for rows in _blocks(bundle.comms):
        yield "".join(
            [
                f'{{"type":"comm","rank":{r},"ts":{ts},"comm":{ids[c]},"comm_rank":{cr},'
                f'"nranks":{n},"nnodes":{nn},"name":{s[name]}}}\n'
                for r, ts, c, cr, n, nn, name in rows
            ]
        )
    for rows in _blocks(bundle.ops):
        yield "".join(
            [
                f'{{"type":"op","rank":{r},"ts":{ts},"comm":{ids[c]},"seq":{seq},"op":{s[op]},'
                f'"bytes":{nb},"dtype":{s[dt]},"algo":{s[al]},"proto":{s[pr]},"channels":{ch},'
                f'"start":{st},"end":{en}{_peer(p)}}}\n'
                for r, ts, c, seq, op, nb, dt, al, pr, ch, p, st, en in rows
            ]
        )
    for lo in range(0, len(bundle.states), _BLOCK_ROWS):
        yield _state_block(bundle.states[lo : lo + _BLOCK_ROWS], bundle.flows, ids, s)
    for rows in _blocks(bundle.hw):
        yield "".join(
            [
                f'{{"type":"hw","rank":{r},"ts":{ts},"node":{s[n]},"device":{s[d]},'
                f'"metric":{s[m]},"value":{_float(v)}}}\n'
                for r, ts, n, d, m, v in rows
            ]
        )


def _state_block(states: tables.Table, flows: tables.Table, ids: list[str], s: list[str]) -> str:
    lo, hi = states["flow_lo"], states["flow_hi"]
    lengths = (hi - lo).tolist()
    if len(states) and np.array_equal(lo[1:], hi[:-1]):  # the usual case: one contiguous run
        flow_rows = flows[int(lo[0]) : int(hi[-1])].tolist()
    else:
        take = np.arange(int(np.sum(hi - lo)), dtype=np.int64)
        take += np.repeat(lo - (np.cumsum(hi - lo) - (hi - lo)), hi - lo)
        flow_rows = flows[take.astype(np.intp)].tolist()
    text = [
        f'{{"channel":{c},"peer":{p},"dir":"send","total":{t},"ready":{rd},"sent":{sn},'
        f'"done":{dn},"idle_ns":{i}}}'
        if d == tables.SEND
        else f'{{"channel":{c},"peer":{p},"dir":"recv","total":{t},"posted":{po},"done":{dn},'
        f'"consumed":{co},"idle_ns":{i}}}'
        for c, p, d, t, rd, sn, po, dn, co, i in flow_rows
    ]
    out = []
    pos = 0
    for (r, ts, c, seq, op, nb, st, kc, kd, _, _), n in zip(states.tolist(), lengths, strict=True):
        kernel = f',"kernel":{{"channels":{kc},"done":{kd}}}' if kc >= 0 else ""
        out.append(
            f'{{"type":"state","rank":{r},"ts":{ts},"comm":{ids[c]},"seq":{seq},'
            f'"op":{s[op]},"bytes":{nb},"start":{st},'
            f'"flows":[{",".join(text[pos : pos + n])}]{kernel}}}\n'
        )
        pos += n
    return "".join(out)


def _blocks(table: tables.Table) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``table`` as lists of plain tuples (ints, floats), a block at a time."""
    for lo in range(0, len(table), _BLOCK_ROWS):
        rows: list[tuple[Any, ...]] = table[lo : lo + _BLOCK_ROWS].tolist()
        yield rows


def _peer(p: int) -> str:
    """The ``peer`` member of an op line: present for point-to-point ops only (-1 in the row)."""
    return f',"peer":{p}' if p >= 0 else ""


def _float(v: float) -> str:
    """JSON text of a float; non-finite values as the NaN/Infinity tokens pydantic reads back."""
    if math.isfinite(v):
        return repr(v)
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def _job_json(job: models.Job) -> str:
    """job.json text, checked to read back as the same job."""
    text = job.model_dump_json(by_alias=True, exclude_none=True)
    try:
        again = models.Job.model_validate_json(text)
    except pydantic.ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise errors.BundleError(f"job.json would not read back: {where}: {first['msg']}") from e
    if again != job:
        raise errors.BundleError("job.json would not read back as the same job")
    return text


def _checked_extras(
    extra_files: Mapping[str, str], *, flows: bool, liveness: bool = False
) -> dict[str, str]:
    reserved = {JOB, RECORDS, RECORDS + ".gz"}
    if liveness:
        reserved |= {LIVENESS, LIVENESS + ".gz"}
    if flows:  # without net_flows, a ready-made flows.jsonl may come as an extra file
        reserved |= {NET_FLOWS, NET_FLOWS + ".gz"}
    for name in extra_files:
        if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
            raise ValueError(f"extra file name must be a plain file name (got {name!r})")
        if name in reserved:
            raise ValueError(f"extra file {name!r} would replace a file the writer makes")
    return dict(extra_files)


def _publish_dir(staging: pathlib.Path, target: pathlib.Path) -> None:
    """Rename ``staging`` to ``target``, moving a previous bundle there out of the way first.

    rename() replaces only an empty directory, so a previous bundle goes to a hidden name for
    the instant between the two renames (a crash then leaves no bundle, never half of one).
    """
    old = None
    if target.is_dir() and any(target.iterdir()):
        old = _partial(target)
        os.rename(target, old)
    try:
        os.rename(staging, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_target(out: str | os.PathLike[str]) -> None:
    """``FileExistsError`` when ``write`` would refuse ``out`` (see there): lets a command say
    so before it spends time making the bundle."""
    target = pathlib.Path(out)
    if target.name.endswith(ARCHIVE_SUFFIXES):
        return
    if (target.is_symlink() or target.exists()) and not _replaceable(target):
        raise FileExistsError(
            errno.EEXIST, "exists and is neither empty nor a bundle directory", str(target)
        )


def _replaceable(path: pathlib.Path) -> bool:
    """An empty directory, or one holding only regular files with job.json among them."""
    if path.is_symlink() or not path.is_dir():
        return False
    with os.scandir(path) as entries:
        found = {e.name: e.is_file(follow_symlinks=False) for e in entries}
    return not found or (all(found.values()) and JOB in found)


def _fsync(path: pathlib.Path) -> None:
    """Flush a file's or directory's data to disk, so that the rename that publishes it is
    never seen after a power loss without the data: the agent runs on nodes that do crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise  # some file systems cannot fsync a directory; a file must be flushed
    finally:
        os.close(fd)


def _partial(target: pathlib.Path) -> pathlib.Path:
    """A fresh hidden name beside ``target`` for work in progress."""
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")


def _archive_stem(name: str) -> str:
    for suffix in ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] or "bundle"
    return name
