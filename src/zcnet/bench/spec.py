"""Experiment specs: TOML files that say what to measure and how to show it.

Users copy a built-in spec (``zcnet reproduce NAME --show``), edit it and run it with
``zcnet run FILE``, so a mistake must be easy to find: every error names the key and the line.
tomllib keeps no positions, so the line is found again by scanning the text for the key inside its
table (see ``_line_of``); TOML syntax errors already carry tomllib's own line and column.
"""

from __future__ import annotations

import datetime
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from zcnet import quantities
from zcnet.bench.metrics import METRICS
from zcnet.bench.records import AxisValue
from zcnet.errors import UsageError
from zcnet.rx.registry import engine_names
from zcnet.userfile import FileProblem, read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

# What a TOML document holds (tomllib's types).
TomlValue: TypeAlias = (str | int | float | bool | datetime.datetime | datetime.date
                        | datetime.time | list["TomlValue"] | dict[str, "TomlValue"])
TomlTable: TypeAlias = dict[str, TomlValue]
Path_ = tuple[str | int, ...]  # a key's place in the document: tables, array indexes, the key
T = TypeVar("T")

TOOLS = ("bench", "txbench")
# The built-in specs are a few KiB; a file far larger than any spec is a wrong path.
MAX_SPEC = 1 << 20
# Cells of one matrix (the product of its axes' lengths). The built-in ones have at most a few
# dozen; a run of this many would take hours, and a matrix of millions of cells would not even
# be planned in memory.
MAX_CELLS = 10_000
ENGINES = engine_names()
TX_MODES = ("single", "mmsg", "uring", "gso")
TABLES = ("grid", "ab", "mpstat")
PLOTS = ("throughput-vs-mtu", "cpu-breakdown", "pps-per-mode")

# The values a matrix axis may take, and the table each one's values are checked against.
AXES: dict[str, tuple[type[str] | type[int], tuple[AxisValue, ...] | None]] = {
    "mtu": (int, None),
    "engine": (str, ENGINES),
    "placement": (str, ("same", "split")),
    "consumer": (str, ("same", "thread")),
    "mode": (str, TX_MODES),
    "payload": (int, None),
    "burst": (int, None),
    "tx": (str, ("copy", "sendzc", "msgzc")),
}


# What a substitution's ``unless`` may name (bench.experiments.ExperimentRig.has answers each).
UNLESS = ("ifname", "remote", "zcrx_copy")


class SpecError(UsageError):
    """A spec that cannot run; the message names file, line and key."""


@dataclass(frozen=True)
class Substitution:
    """In the lab, ``axis=value`` runs as ``axis=lab`` unless one of ``unless`` holds: an option
    that was given (ifname, remote) or what the kernel offers (zcrx_copy: zcrx's copy mode)."""

    axis: str
    value: AxisValue
    lab: AxisValue
    why: str
    unless: tuple[str, ...] = ("ifname",)


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    tool: str
    matrix: dict[str, list[AxisValue]]
    duration: float = 2.0
    repeat: int = 1
    peers: tuple[str, ...] = ()
    seed: str = ""
    about: str = ""
    substitutes: tuple[Substitution, ...] = ()
    private_flag: str = ""
    table: str = "grid"
    rows: str = ""
    columns: str = ""
    metric: str = "gbps"
    extra: tuple[str, ...] = ()
    baseline: dict[str, AxisValue] = field(default_factory=dict)
    per_cpu: bool = False
    plots: tuple[str, ...] = ()
    source: str = ""


# --- finding a key's line ------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\"'.]+)\s*=")


def _line_of(text: str, path: tuple[str | int, ...]) -> int:
    """1-based line of ``path`` (table names, array-of-table indexes, key); 0 if not found.

    Falls back to the line of the nearest enclosing table when the key itself is absent (a missing
    required key is reported at its table's header).
    """
    table: tuple[str | int, ...] = ()
    counts: dict[tuple[str | int, ...], int] = {}
    best = 0
    in_string = False  # inside a multi-line string, nothing is a key or a header
    for no, line in enumerate(text.splitlines(), 1):
        quotes = line.count('"""') + line.count("'''")
        if in_string or line.lstrip().startswith("#"):
            in_string ^= quotes % 2 == 1
            continue
        in_string = quotes % 2 == 1
        if m := _HEADER.match(line):
            names: tuple[str | int, ...] = tuple(p.strip().strip("\"'")
                                                 for p in m.group(2).split("."))
            if m.group(1) == "[[":
                counts[names] = idx = counts.get(names, -1) + 1
                names = (*names, idx)
            table = names
            if path[: len(table)] == table:
                best = no
        elif m := _KEY.match(line):
            full = (*table, *(k.strip("\"'") for k in m.group(1).split(".")))
            if full == path:
                return no
            if path[: len(full)] == full:
                best = no
    return best


# --- validation ----------------------------------------------------------------------------------


class _Checker:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source

    def fail(self, path: Path_, problem: str, hint: str | None = None) -> SpecError:
        line = _line_of(self.text, path)
        where = f"{self.source}:{line}" if line else self.source
        dotted = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path)
        dotted = dotted.replace(".[", "[")
        return SpecError(f"{where}: key '{dotted}': {problem}", hint)

    def table(self, doc: TomlTable, name: str, *, required: bool) -> TomlTable:
        val = doc.get(name)
        if val is None:
            if required:
                raise self.fail((name,), f"missing table [{name}]")
            return {}
        if not isinstance(val, dict):
            raise self.fail((name,), "must be a table")
        return val

    def unknown(self, tbl: TomlTable, path: Path_, allowed: set[str]) -> None:
        for key in tbl:
            if key not in allowed:
                raise self.fail((*path, key), "unknown key",
                                "allowed here: " + ", ".join(sorted(allowed)))

    def typed(self, val: TomlValue, path: Path_, kinds: tuple[type, ...]) -> None:
        """Refuse ``val`` unless it is of one of ``kinds`` (true is not a number here)."""
        if not isinstance(val, kinds) or (isinstance(val, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(path, f"expected {names}, got {type(val).__name__} {val!r}")

    def need(self, tbl: TomlTable, path: Path_, kind: type[T],
             check: Callable[[T], str | None] | None = None) -> T:
        """The value at ``path``, which must be there and of ``kind``."""
        if path[-1] not in tbl:
            raise self.fail(path, "missing")
        return self._checked(tbl[str(path[-1])], path, kind, check)

    def get(self, tbl: TomlTable, path: Path_, kind: type[T], default: T,
            check: Callable[[T], str | None] | None = None) -> T:
        """The value at ``path`` of ``kind`` (``default`` where the key is left out)."""
        if path[-1] not in tbl:
            return default
        return self._checked(tbl[str(path[-1])], path, kind, check)

    def _checked(self, val: TomlValue, path: Path_, kind: type[T],
                 check: Callable[[T], str | None] | None) -> T:
        if not isinstance(val, kind) or (isinstance(val, bool) and kind is not bool):
            raise self.fail(path, f"expected {kind.__name__}, got {type(val).__name__} {val!r}")
        if check and (problem := check(val)):
            raise self.fail(path, problem)
        return val

    def number(self, tbl: TomlTable, path: Path_, default: float,
               check: Callable[[float], str | None] | None = None) -> float:
        """A number (an integer or a float) at ``path``, as a float."""
        val = tbl.get(str(path[-1]), default)
        self.typed(val, path, (int, float))
        assert isinstance(val, (int, float))
        if check and (problem := check(val)):
            raise self.fail(path, problem)
        return float(val)

    def axis_value(self, tbl: TomlTable, path: Path_, kind: type[str] | type[int],
                   check: Callable[[AxisValue], str | None] | None = None) -> AxisValue:
        """A value of a matrix axis (``kind`` as ``AXES`` says), which must be there."""
        if path[-1] not in tbl:
            raise self.fail(path, "missing")
        val = tbl[str(path[-1])]
        self.typed(val, path, (kind,))
        assert isinstance(val, (str, int))
        if check and (problem := check(val)):
            raise self.fail(path, problem)
        return val

    def str_list(self, tbl: TomlTable, path: Path_,
                 choices: tuple[str, ...]) -> tuple[str, ...]:
        vals = self.get(tbl, path, list, [])
        for v in vals:
            if not isinstance(v, str) or v not in choices:
                raise self.fail(path, f"{v!r} is not one of: {', '.join(choices)}")
        if len(set(vals)) != len(vals):
            raise self.fail(path, "values repeat", "give each once")
        return tuple(vals)


def _one_of(choices: tuple[AxisValue, ...]) -> Callable[[AxisValue], str | None]:
    return lambda v: None if v in choices else \
        f"{v!r} is not one of: {', '.join(map(str, choices))}"


def _quantity(name: str) -> Callable[[float], str | None]:
    """The one range of quantity ``name`` (``zcnet.quantities``), as a spec check."""
    return lambda v: quantities.problem(name, v)


# Matrix axes that are amounts of a quantity.
AXIS_QUANTITIES = {"mtu": "mtu", "payload": "payload", "burst": "burst"}


def _axis_values(ck: _Checker, axis: str, vals: TomlValue) -> list[AxisValue]:
    path = ("matrix", axis)
    if axis not in AXES:
        raise ck.fail(path, "unknown matrix axis", "axes: " + ", ".join(AXES))
    if not isinstance(vals, list) or not vals:
        raise ck.fail(path, "expected a non-empty list")
    kind, choices = AXES[axis]
    out: list[AxisValue] = []
    for v in vals:
        if not isinstance(v, kind) or isinstance(v, bool):
            raise ck.fail(path, f"expected a list of {kind.__name__}, found {v!r}")
        if choices is not None and v not in choices:
            raise ck.fail(path, f"{v!r} is not one of: {', '.join(map(str, choices))}")
        if axis in AXIS_QUANTITIES and (why := quantities.problem(AXIS_QUANTITIES[axis], v)):
            raise ck.fail(path, why)
        out.append(v)
    if len(set(out)) != len(out):
        raise ck.fail(path, "values repeat")
    return out


def parse_spec(text: str, source: str = "<spec>") -> Spec:
    try:
        doc: TomlTable = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML: {exc}", "fix the syntax at that line") from None
    except RecursionError:   # tomllib recurses per nested array or inline table
        raise SpecError(f"{source}: arrays or tables nested too deeply",
                        "a spec nests a few levels at most") from None
    ck = _Checker(text, source)
    ck.unknown(doc, (), {"experiment", "matrix", "run", "substitute", "nic", "report"})

    exp = ck.table(doc, "experiment", required=True)
    ck.unknown(exp, ("experiment",), {"name", "title", "tool", "seed", "about"})
    name = ck.need(exp, ("experiment", "name"), str,
                   check=lambda v: None if re.fullmatch(r"[a-z0-9][a-z0-9\-]*", v)
                   else "use lowercase letters, digits and '-'")
    title = ck.need(exp, ("experiment", "title"), str)
    tool = ck.need(exp, ("experiment", "tool"), str, check=_one_of(TOOLS))

    mat = ck.table(doc, "matrix", required=True)
    matrix = {axis: _axis_values(ck, axis, vals) for axis, vals in mat.items()}
    if not matrix:
        raise ck.fail(("matrix",), "needs at least one axis")
    needed = ("engine",) if tool == "bench" else ("mode",)
    for axis in needed:
        if axis not in matrix:
            raise ck.fail(("matrix", axis), f"missing (a {tool} experiment needs it)")
    if (cells := math.prod(len(v) for v in matrix.values())) > MAX_CELLS:
        sizes = " x ".join(f"{len(v)} {axis}" for axis, v in matrix.items())
        raise ck.fail(("matrix",), f"{cells} cells ({sizes}); at most {MAX_CELLS}",
                      "give the axes fewer values, or split the matrix into several specs")

    run = ck.table(doc, "run", required=False)
    ck.unknown(run, ("run",), {"duration", "repeat", "peers"})
    duration = ck.number(run, ("run", "duration"), 2.0, check=_quantity("duration"))
    repeat = ck.get(run, ("run", "repeat"), int, 1, check=_quantity("repeat"))
    peers = ck.str_list(run, ("run", "peers"), ("iperf3", "sockperf"))

    subs = []
    raw_subs = doc.get("substitute", [])
    if not isinstance(raw_subs, list):
        raise ck.fail(("substitute",), "must be an array of tables: [[substitute]]")
    for i, s in enumerate(raw_subs):
        p: tuple[str | int, ...] = ("substitute", i)
        if not isinstance(s, dict):
            raise ck.fail(p, f"expected a table, got {type(s).__name__} {s!r}",
                          "write each substitution as a [[substitute]] table")
        ck.unknown(s, p, {"axis", "value", "lab", "why", "unless"})
        axis = ck.need(s, (*p, "axis"), str,
                       check=lambda v: None if v in matrix else "not an axis of [matrix]")
        kind, choices = AXES[axis]
        value = ck.axis_value(s, (*p, "value"), kind)
        lab = ck.axis_value(s, (*p, "lab"), kind, check=_one_of(choices) if choices else None)
        why = ck.need(s, (*p, "why"), str)
        given = s.get("unless", "ifname")
        ck.typed(given, (*p, "unless"), (str, list))
        unless = ck.str_list({"unless": [given] if isinstance(given, str) else given},
                             (*p, "unless"), UNLESS)
        subs.append(Substitution(axis, value, lab, why, unless))

    nic = ck.table(doc, "nic", required=False)
    ck.unknown(nic, ("nic",), {"private_flag"})
    private_flag = ck.get(nic, ("nic", "private_flag"), str, "")

    rep = ck.table(doc, "report", required=False)
    ck.unknown(rep, ("report",), {"table", "rows", "columns", "metric", "extra", "baseline",
                                  "per_cpu", "plots"})
    metric_names = tuple(METRICS)
    table = ck.get(rep, ("report", "table"), str, "grid", check=_one_of(TABLES))
    axis_names = tuple(matrix)
    rows = ck.get(rep, ("report", "rows"), str, "", check=_one_of(axis_names))
    columns = ck.get(rep, ("report", "columns"), str, "", check=_one_of(axis_names))
    if table == "grid" and not (rows and columns):
        raise ck.fail(("report", "rows" if not rows else "columns"),
                      "a grid table needs both rows and columns")
    metric = ck.get(rep, ("report", "metric"), str, "gbps", check=_one_of(metric_names))
    extra = ck.str_list(rep, ("report", "extra"), metric_names)
    baseline: dict[str, AxisValue] = {}
    for axis, val in ck.get(rep, ("report", "baseline"), dict, {}).items():
        if axis not in matrix or not isinstance(val, (str, int)) or val not in matrix[axis]:
            raise ck.fail(("report", "baseline"), f"{axis}={val!r} is not in [matrix]")
        baseline[axis] = val
    if table == "ab" and not baseline:
        raise ck.fail(("report", "baseline"), "an ab table needs a baseline")
    per_cpu = ck.get(rep, ("report", "per_cpu"), bool, False)
    plots = ck.str_list(rep, ("report", "plots"), PLOTS)

    return Spec(name=name, title=title, tool=tool, matrix=matrix, duration=duration,
                repeat=repeat, peers=peers, seed=ck.get(exp, ("experiment", "seed"), str, ""),
                about=ck.get(exp, ("experiment", "about"), str, ""), substitutes=tuple(subs),
                private_flag=private_flag, table=table, rows=rows, columns=columns,
                metric=metric, extra=extra, baseline=dict(baseline), per_cpu=per_cpu,
                plots=plots, source=source)


def load_spec(path: str | Path) -> Spec:
    """The spec in file ``path``: a regular UTF-8 file of at most ``MAX_SPEC`` bytes."""
    try:
        text = read_text(path, "spec", limit=MAX_SPEC,
                         fix="give the path of a UTF-8 .toml spec, or a name from "
                             "`zcnet reproduce`")
    except FileProblem as exc:
        raise SpecError(exc.message, exc.hint) from None
    return parse_spec(text, str(path))


# --- built-in specs ------------------------------------------------------------------------------


def _builtin_dir() -> Traversable:
    return resources.files("zcnet") / "experiments"


def builtin_names() -> list[str]:
    return sorted(e.name[: -len(".toml")] for e in _builtin_dir().iterdir()
                  if e.name.endswith(".toml"))


def builtin_text(name: str) -> str:
    entry = _builtin_dir() / f"{name}.toml"
    if not entry.is_file():
        raise UsageError(f"no built-in experiment {name!r}",
                         "choose one of: " + ", ".join(builtin_names()))
    return entry.read_text()


def builtin_spec(name: str) -> Spec:
    return parse_spec(builtin_text(name), f"{name}.toml")
