"""Reads a trace bundle (docs/spec/bundle-v1.md), a directory or its ``.tar.gz``, into a ``Bundle``.

``records.jsonl[.gz]`` is streamed line by line (bytes, never the whole file) and each line is
validated by the pydantic models of ``models`` (pydantic-core parses the JSON in Rust); records
outside the requested window are dropped before they reach the ``BundleBuilder``, so memory
follows what is kept, in numpy form. Sample line::

    {"type": "state", "rank": 3, "ts": 1732001234100000000, "comm": "0x1f3a", "seq": 881,
     "op": "AllReduce", "bytes": 4194304, "start": 1732001233990000000,
     "flows": [{"channel": 3, "peer": 17, "dir": "send", "total": 64, "ready": 40,
                "sent": 40, "done": 31, "idle_ns": 2100000000}]}

This module is the one boundary where ``OSError``, JSON, UTF-8, pydantic, tar, gzip and zlib
errors become ``errors.BundleFormatError`` (file, line, dotted field such as ``flows[2].done``,
reason), always ``from`` the original. The ground-truth file of simulated bundles is never
opened: the spec says readers ignore it, and analysis must not see it.

Why one module: it is that boundary. The two sources (a directory, a ``.tar.gz`` read without
extracting it), the line streaming and the translation of every failure into a
``BundleFormatError`` with file, line and field (``_raise_invalid``, ``_dotted``) serve one
reading and share its error vocabulary; split, the boundary would have several doors.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Collection, Generator, Iterable, Iterator
from typing import IO, Any, NoReturn, TypeVar

import pydantic

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import models, tables

JOB = "job.json"
RECORDS = "records.jsonl"
NET_FLOWS = "flows.jsonl"
FUNCTIONS = "functions.jsonl"
LIVENESS = "liveness.jsonl"

# A state record with 10,000 flows is about 1.1 MB; a "line" 60 times longer is not a record but
# a file without newlines, which must not be read into memory whole.
MAX_LINE_BYTES = 64 * 2**20
# job.json of a 100,000-rank job with every rank located is about 10 MB.
MAX_JOB_BYTES = 256 * 2**20
# Any file of a bundle (records are streamed; this bounds the time a read can take): a
# 10-minute window of a 16,384-rank job is a few GB of gzipped records.
MAX_FILE_BYTES = 64 * 2**30

AnyRecord = models.CommRecord | models.OpRecord | models.StateRecord | models.HwRecord
_RECORD: pydantic.TypeAdapter[AnyRecord] = pydantic.TypeAdapter(models.Record)
# Tags of the discriminated unions: pydantic puts them in an error's location, the dotted field
# name leaves them out (``("state", "flows", 2, "send", "done")`` -> ``flows[2].done``).
_RECORD_TAGS = frozenset({"comm", "op", "state", "hw"})
_FLOW_TAGS = frozenset({"send", "recv"})
# Decompression and archive errors: the data ends early or is damaged.
_CORRUPT = (EOFError, zlib.error, gzip.BadGzipFile, tarfile.TarError)
_TIME_MAX = 2**63  # above any int64 time: "no upper bound"

_M = TypeVar("_M", bound=pydantic.BaseModel)


def load(
    path: str | os.PathLike[str],
    *,
    since_ns: int | None = None,
    until_ns: int | None = None,
    ranks: Collection[int] | None = None,
) -> tables.Bundle:
    """Read the bundle at ``path`` (directory, ``.tar.gz`` or ``.tgz``) into a ``Bundle``.

    Keeps a record when ``since_ns <= ts <= until_ns`` (ns, bounds inclusive, ``None`` = open)
    and its rank is in ``ranks`` (``None`` = all); ``comm`` records of the kept ranks are kept
    whatever their time, since analysis needs communicator membership. ``liveness.jsonl[.gz]``,
    when present, is read the same way (bundles without it have no liveness rows). Every line
    is validated, kept or not. Raises ``errors.BundleFormatError`` for any defect.
    """
    label = os.fspath(path)
    keep = None if ranks is None else frozenset(ranks)
    lo = -1 if since_ns is None else since_ns
    hi = _TIME_MAX if until_ns is None else until_ns
    with _opened(label) as src:
        builder = tables.BundleBuilder(_read_job(src), source=label)
        name = _find(src, RECORDS)
        if name is None:
            raise _error(src.where(RECORDS), f"missing: a bundle needs {RECORDS} or {RECORDS}.gz")
        with contextlib.closing(_lines(src, name)) as lines:
            _add_records(builder, src.where(name), lines, keep=keep, lo=lo, hi=hi)
        name = _find(src, LIVENESS)
        if name is not None:
            with contextlib.closing(_lines(src, name)) as lines:
                _add_liveness(builder, src.where(name), lines, keep=keep, lo=lo, hi=hi)
    return builder.build()


def load_lines(
    job: models.Job, sources: Iterable[tuple[str, Iterable[bytes]]], *, label: str = "<lines>"
) -> tables.Bundle:
    """A ``Bundle`` of ``job`` from ``records.jsonl`` lines held in memory, e.g. what the node
    agents' ``/v1/window`` streamed: ``sources`` = ``(where, lines)`` pairs, ``where`` naming
    the origin in errors (``http://node-3:9464/v1/window``). Validated like ``load``; every
    record is kept."""
    builder = tables.BundleBuilder(job, source=label)
    for where, lines in sources:
        add_lines(builder, where, lines)
    return builder.build()


def add_lines(builder: tables.BundleBuilder, where: str, lines: Iterable[bytes]) -> None:
    """Validate ``records.jsonl`` lines held in memory and add them to ``builder`` (blank
    lines skipped); ``where`` names their origin in errors. Rows added before a bad line stay
    in ``builder``: on an error, start a new one."""
    numbered = ((i, raw) for i, raw in enumerate(lines, 1) if raw.strip())
    _add_records(builder, where, numbered)


def _add_records(
    builder: tables.BundleBuilder,
    where: str,
    lines: Iterable[tuple[int, bytes]],
    *,
    keep: frozenset[int] | None = None,
    lo: int = -1,
    hi: int = _TIME_MAX,
) -> None:
    validate = _RECORD.validate_json
    add = builder.add_record
    for lineno, raw in lines:
        try:
            rec = validate(raw)
        except pydantic.ValidationError as e:
            _raise_invalid(e, raw, where, lineno, record=True)
        if keep is not None and rec.rank not in keep:
            continue
        if not lo <= rec.ts <= hi and rec.type != "comm":
            continue
        add(rec)


def _add_liveness(
    builder: tables.BundleBuilder,
    where: str,
    lines: Iterable[tuple[int, bytes]],
    *,
    keep: frozenset[int] | None,
    lo: int,
    hi: int,
) -> None:
    validate = models.LivenessRecord.model_validate_json
    for lineno, raw in lines:
        try:
            rec = validate(raw)
        except pydantic.ValidationError as e:
            _raise_invalid(e, raw, where, lineno, record=False)
        if (keep is None or rec.rank in keep) and lo <= rec.ts <= hi:
            builder.add_liveness(rank=rec.rank, ts=rec.ts, state=rec.state, heartbeat=rec.heartbeat)


def iter_net_flows(path: str | os.PathLike[str]) -> Iterator[models.NetFlow]:
    """Every line of ``flows.jsonl[.gz]`` (black-box input), streamed; none when absent."""
    return _iter_models(os.fspath(path), NET_FLOWS, models.NetFlow)


def iter_functions(path: str | os.PathLike[str]) -> Iterator[models.FunctionPattern]:
    """Every line of ``functions.jsonl[.gz]`` (profiling input), streamed; none when absent."""
    return _iter_models(os.fspath(path), FUNCTIONS, models.FunctionPattern)


def _iter_models(label: str, stem: str, model: type[_M]) -> Iterator[_M]:
    with _opened(label) as src:
        name = _find(src, stem)
        if name is None:
            return
        where = src.where(name)
        with contextlib.closing(_lines(src, name)) as lines:
            for lineno, raw in lines:
                try:
                    item = model.model_validate_json(raw)
                except pydantic.ValidationError as e:
                    _raise_invalid(e, raw, where, lineno, record=False)
                yield item


class _Source:
    """The files of one bundle by name (``job.json``, ``records.jsonl.gz``...)."""

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def open(self, name: str) -> IO[bytes]:
        """The file's raw bytes (still gzip-compressed for ``.gz`` names)."""
        raise NotImplementedError

    def where(self, name: str) -> str:
        """How error messages name the file."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source holds open."""


class _DirSource(_Source):
    def __init__(self, root: str) -> None:
        self.root = root

    def has(self, name: str) -> bool:
        return os.path.lexists(self.where(name))

    def open(self, name: str) -> IO[bytes]:
        return _open_regular(self.where(name))  # closed by the caller

    def where(self, name: str) -> str:
        return os.path.join(self.root, name)


def _open_regular(path: str, *, follow: bool = False) -> IO[bytes]:
    """``path`` opened for reading only if it is a regular file of at most ``MAX_FILE_BYTES``,
    not through a symbolic link (unless ``follow``: the archive the caller named), without
    blocking (a FIFO would hang the reader): a bundle's files may come from a tenant (issue 15
    item 2). ``BundleFormatError`` names what is wrong."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            why = "is a symbolic link: bundle files are read only as regular files"
            raise _error(path, why) from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _error(path, f"is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > MAX_FILE_BYTES:
            raise _error(path, f"is {st.st_size} bytes, larger than {MAX_FILE_BYTES}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class _TarSource(_Source):
    """A tar archive (any compression ``tarfile`` knows) holding the files at its top level or
    inside one top-level directory, located by where ``job.json`` is."""

    def __init__(self, label: str) -> None:
        self.label = label
        raw = _open_regular(label, follow=True)
        try:
            self.tar = tarfile.open(fileobj=raw, mode="r:*")  # noqa: SIM115 (closed by close())
        except BaseException:
            raw.close()
            raise
        self._raw = raw
        try:
            self.files = self._index(self.tar.getmembers())
        except BaseException:
            self.close()
            raise

    def _index(self, members: list[tarfile.TarInfo]) -> dict[str, tarfile.TarInfo]:
        files: dict[str, tarfile.TarInfo] = {}
        for m in members:
            if m.isfile():
                name = m.name
                while name.startswith("./"):
                    name = name[2:]
                files[name] = m  # a name stored twice: the later copy wins, as tar extracts it
        if JOB in files:
            prefix = ""
        else:
            tops = sorted(
                n.split("/")[0] for n in files if n.count("/") == 1 and n.endswith("/" + JOB)
            )
            if len(tops) != 1:
                why = (
                    f"{JOB} in several top-level directories: {', '.join(tops)}"
                    if tops
                    else f"no {JOB} at the top level or inside one top-level directory"
                )
                raise _error(self.label, why)
            prefix = tops[0] + "/"
        return {
            n[len(prefix) :]: m
            for n, m in files.items()
            if n.startswith(prefix) and "/" not in n[len(prefix) :]
        }

    def has(self, name: str) -> bool:
        return name in self.files

    def open(self, name: str) -> IO[bytes]:
        stream = self.tar.extractfile(self.files[name])
        assert stream is not None  # regular members always have a stream
        return stream

    def where(self, name: str) -> str:
        info = self.files.get(name)
        return f"{self.label}/{name if info is None else info.name}"

    def close(self) -> None:
        self.tar.close()  # does not close a file object it was given
        self._raw.close()


@contextlib.contextmanager
def _opened(label: str) -> Iterator[_Source]:
    """The bundle at ``label`` as a ``_Source``, closed on exit."""
    src: _Source
    try:
        if os.path.isdir(label):
            src = _DirSource(label)
        elif os.path.exists(label):
            src = _TarSource(label)
        else:
            raise _error(label, "no such file or directory")
    except _CORRUPT as e:
        raise _error(label, f"not a bundle directory or a readable .tar.gz: {_why(e)}") from e
    except OSError as e:
        raise _error(label, f"cannot open: {_why(e)}") from e
    try:
        yield src
    finally:
        src.close()


def _find(src: _Source, stem: str) -> str | None:
    """``stem`` or ``stem.gz``, whichever the bundle holds, or None; both at once is an error."""
    plain, packed = src.has(stem), src.has(stem + ".gz")
    if plain and packed:
        raise _error(src.where(stem), f"both {stem} and {stem}.gz present; keep one")
    if plain or packed:
        return stem if plain else stem + ".gz"
    return None


def _read_job(src: _Source) -> models.Job:
    where = src.where(JOB)
    if not src.has(JOB):
        raise _error(where, "missing: a bundle needs job.json")
    parts: list[bytes] = []
    size = 0
    try:
        with src.open(JOB) as f:
            # In pieces: read(MAX_JOB_BYTES + 1) would allocate the whole limit up front.
            while size <= MAX_JOB_BYTES and (part := f.read(2**20)):
                parts.append(part)
                size += len(part)
    except _CORRUPT as e:
        raise _error(where, f"truncated or corrupt archive: {_why(e)}") from e
    except OSError as e:
        raise _error(where, f"cannot read: {_why(e)}") from e
    if size > MAX_JOB_BYTES:
        raise _error(where, f"larger than {MAX_JOB_BYTES} bytes")
    data = b"".join(parts)
    try:
        return models.Job.model_validate_json(data)
    except pydantic.ValidationError as e:
        _raise_invalid(e, data, where, None, record=False)


def _lines(src: _Source, name: str) -> Generator[tuple[int, bytes], None, None]:
    """(line number from 1, raw bytes) of every non-blank line, gunzipped for ``.gz`` names."""
    where = src.where(name)
    lineno = 0
    try:
        with contextlib.ExitStack() as stack:
            stream: IO[bytes] | gzip.GzipFile = stack.enter_context(src.open(name))
            if name.endswith(".gz"):
                stream = stack.enter_context(gzip.GzipFile(fileobj=stream, mode="rb"))
            readline = stream.readline
            while line := readline(MAX_LINE_BYTES):
                lineno += 1
                if len(line) == MAX_LINE_BYTES and not line.endswith(b"\n"):
                    raise _error(where, f"line longer than {MAX_LINE_BYTES} bytes", line=lineno)
                if not line.isspace():
                    yield lineno, line
    except (*_CORRUPT, OSError) as e:
        # The caller validated lines 1..lineno before asking for the next one: the last good line.
        after = f"after line {lineno} (the last good line)" if lineno else "before the first line"
        what = "truncated or corrupt data" if isinstance(e, _CORRUPT) else "cannot read"
        raise _error(where, f"{what} {after}: {_why(e)}", line=lineno or None) from e


def _raise_invalid(
    exc: pydantic.ValidationError, raw: bytes, where: str, line: int | None, *, record: bool
) -> NoReturn:
    """Raise the ``BundleFormatError`` for the first defect pydantic found in ``raw``.

    ``line`` is None for whole-file JSON (job.json), whose line then comes from the error.
    """
    first = exc.errors(include_url=False)[0]
    kind = first["type"]
    if kind == "json_invalid":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as u:
            col = u.start - (raw.rfind(b"\n", 0, u.start) + 1) + 1
            at = line if line is not None else raw.count(b"\n", 0, u.start) + 1
            raise _error(
                where, f"not valid UTF-8: byte 0x{raw[u.start]:02x} at column {col}", line=at
            ) from u
        detail = str(first.get("ctx", {}).get("error", first["msg"]))
        found = re.search(r" at line (\d+) column (\d+)$", detail)
        if found:
            detail = detail[: found.start()] + f" at column {found.group(2)}"
            if line is None:
                line = int(found.group(1))
        raise _error(where, f"bad JSON: {detail}", line=line) from exc
    field = _dotted(first["loc"], record=record)
    ctx: dict[str, Any] = first.get("ctx") or {}
    if kind in ("dict_type", "model_type") and not field:
        reason = f"not a JSON object (got {_json_type(first['input'])})"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        key = str(ctx.get("discriminator", "")).strip("'")
        field = f"{field}.{key}" if field else key
        reason = (
            "Field required"
            if kind == "union_tag_not_found"
            else f"unknown {key} {ctx.get('tag')!r} (expected {ctx.get('expected_tags')})"
        )
    else:
        reason = first["msg"].removeprefix("Value error, ")
        value = first.get("input")
        if kind != "missing" and (value is None or isinstance(value, int | float | str)):
            reason += f" (got {_short(repr(value))})"
    if exc.error_count() > 1:
        reason += f" (and {exc.error_count() - 1} more)"
    raise _error(where, reason, line=line, field=field or None) from exc


def _dotted(loc: tuple[int | str, ...], *, record: bool) -> str:
    """pydantic's error location as a dotted path without union tags: ``flows[2].done``."""
    parts = list(loc)
    if record and parts and parts[0] in _RECORD_TAGS:
        parts = parts[1:]
    out = ""
    prev: int | str | None = None
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (isinstance(prev, int) and part in _FLOW_TAGS):
            out += f".{part}" if out else part
        prev = part
    return out


def _json_type(value: object) -> str:
    names = {
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, gzip.BadGzipFile):
        return exc.strerror
    return str(exc) or type(exc).__name__


def _error(
    file: str, reason: str, *, line: int | None = None, field: str | None = None
) -> errors.BundleFormatError:
    """A ``BundleFormatError`` whose ``str()`` is one line whatever the file name or reason."""

    def flat(text: str) -> str:
        return text.replace("\r", "\\r").replace("\n", "\\n")

    return errors.BundleFormatError(
        flat(file), flat(reason), line=line, field=None if field is None else flat(field)
    )
