"""PNG plots of result envelopes (matplotlib, a dependency of zcnet).

Every figure says in words what it shows (a title, and the machine it was measured on), what
its points and error bars are (medians with lowest..highest for ``zcnet bench``, whose table
shows the same; means with ± one standard deviation for experiments, as their tables), and
which rows of an experiment ran as substitutes. Figures have a fixed size and dpi and are saved
without tight bounding boxes, so a plot's pixel size is known in advance (``FIGSIZE`` x
``DPI``) whatever its labels hold.
"""

from __future__ import annotations

import os
import statistics
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from zcnet.bench.records import AxisValue, CpuShares, ResultFile, ResultRow
from zcnet.errors import ZcnetError
from zcnet.report.cells import METRICS, Cell, group
from zcnet.report.labels import PLACEMENT_TITLES
from zcnet.report.stats import summarize
from zcnet.report.tables import MPSTAT_COLUMNS, per_cpu_shares, report_section

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGSIZE = (11.0, 6.5)
DPI = 100
# Stacked in this order; idle fills each bar up to 100 %.
CPU_PARTS = ("usr", "nice", "sys", "irq", "soft", "steal", "guest", "iowait")
CPU_COLORS = {"usr": "tab:blue", "nice": "tab:cyan", "sys": "tab:orange", "irq": "tab:green",
              "soft": "tab:red", "steal": "tab:purple", "guest": "tab:brown",
              "iowait": "tab:olive", "idle": "0.88"}


@dataclass(frozen=True)
class Context:
    """What every figure of one result file says besides its data."""

    title: str                         # what was measured, in words
    machine: str                       # where
    substitutions: tuple[str, ...] = ()
    by_median: bool = False            # medians with min..max bars (bench), else mean ± stdev
    # (axis, value that ran, value of the seed it stands in for): "soft-zc (for zcrx)"
    stand_ins: tuple[tuple[str, str, str], ...] = ()


def context(doc: ResultFile) -> Context:
    exp, env = doc.experiment, doc.env
    where = ("a lab of two network namespaces joined by veth" if env.lab
             else "loopback" if env.lab is False and exp is None else "")
    machine = ", ".join(x for x in (
        f"Linux {env.kernel}" if env.kernel else "",
        f"{env.cpus} CPUs" if env.cpus else "", env.cpu_model or "", where,
        (env.time or "")[:16].replace("T", " ")) if x)
    title = (exp.title if exp else "") or ("zcnet bench: one TCP flow per cell"
                                           if doc.kind == "bench" else doc.kind or "zcnet results")
    subs = exp.substitutions if exp else []
    return Context(title, machine, tuple(f"substituted: {s.text}" for s in subs),
                   by_median=doc.kind == "bench",
                   stand_ins=tuple((s.axis, str(s.lab), str(s.value)) for s in subs))


def _pyplot() -> ModuleType:
    try:
        import matplotlib
    except ImportError:
        raise ZcnetError("plots need matplotlib, which is not installed (zcnet depends on it)",
                         "reinstall zcnet with its dependencies, or: pip install matplotlib") \
            from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def literal(text: str) -> str:
    """User text as matplotlib shows it literally: ``$`` would start mathtext otherwise."""
    return text.replace("$", r"\$")


def _wrap(lines: list[str], width: int = 160) -> list[str]:
    return [w for line in lines for w in textwrap.wrap(line, width) or [""]]


def _figure(plt: ModuleType, ctx: Context, what: str, notes: list[str], panels: int = 1,
            sharey: bool = True, top: float = 0.87) -> tuple[Figure, list[Axes]]:
    """A figure titled in words (``what`` of ``ctx.title``), the machine under the title, and
    ``notes`` (error bars, substitutions) in small print at the bottom."""
    fig, axes = plt.subplots(1, panels, figsize=FIGSIZE, dpi=DPI, sharey=sharey, squeeze=False)
    fig.suptitle(literal(_wrap([f"{ctx.title}: {what}"], 110)[0]), fontsize=12, y=0.985)
    if ctx.machine:
        fig.text(0.5, 0.935, literal(ctx.machine), ha="center", fontsize=8, color="0.35")
    small = _wrap([*notes, *ctx.substitutions])
    fig.text(0.01, 0.01, literal("\n".join(small)), fontsize=7.5, va="bottom", ha="left",
             color="0.2")
    fig.subplots_adjust(top=top, bottom=0.08 + 0.022 * len(small), left=0.07,
                        right=0.79, wspace=0.08)
    for ax in axes[0]:
        ax.grid(True, axis="y", alpha=0.3)
    return fig, list(axes[0])


def _save(plt: ModuleType, fig: Figure, path: Path) -> Path:
    """The PNG, atomically; its title and small print also go into its text chunks (Title,
    Description), where a reader or a test finds them without looking at the pixels."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    title = fig.get_suptitle()
    meta = {"Title": title, "Software": "zcnet",
            "Description": "\n".join(t.get_text() for t in fig.texts if t.get_text() != title)}
    try:
        fig.savefig(tmp, dpi=DPI, format="png", metadata=meta)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ZcnetError(f"cannot write plot {path}: {exc.strerror or exc}",
                         "give a writable directory") from None
    finally:
        plt.close(fig)
    return path


def _labeller(cells: list[Cell], skip: tuple[str, ...],
              ctx: Context | None = None) -> Callable[[Cell], str]:
    """Label cells by the axes that differ between them (constant axes only add clutter); a
    value standing in for the seed's says so: "soft-zc (for zcrx)"."""
    fields = dict.fromkeys(f for c in cells for f, _ in c.key)
    varying = [f for f in fields if f not in skip and f != "experiment"
               and len({c.fields.get(f) for c in cells}) > 1]
    stands = {(axis, lab): seed for axis, lab, seed in (ctx.stand_ins if ctx else ())}

    def part(f: str, v: AxisValue | None) -> str:
        text = str(v) if f in ("engine", "mode") else f"{f} {v}"
        seed = stands.get((f, str(v)))
        return f"{text} (for {seed})" if seed else text

    def label(cell: Cell) -> str:
        return " ".join(part(f, cell.fields.get(f)) for f in varying) or "all"

    return label


def _not_plotted(results: list[ResultRow], shown: list[Cell]) -> list[str]:
    """A note naming the cells that have no value to plot (did not run, or failed)."""
    keys = {c.key for c in shown}
    missing = [c for c in group(results).values() if c.key not in keys]
    if not missing:
        return []
    label = _labeller(list(group(results).values()), ())
    names = list(dict.fromkeys(
        f"{c.fields.get('engine') or c.fields.get('mode') or label(c)} ({c.status})"
        for c in missing))
    return ["not plotted (no value): " + ", ".join(names)]


def _point(cell: Cell, metric: str, by_median: bool) -> tuple[float, float, float] | None:
    """(value, error below, error above) of a cell: median and its range, or mean ± stdev."""
    vals = cell.values(metric)
    if not vals:
        return None
    if by_median:
        mid = statistics.median(vals)
        return mid, mid - min(vals), max(vals) - mid
    s = summarize(vals)
    return s.mean, s.stdev, s.stdev


def _bars_note(cells: list[Cell], metric: str, by_median: bool) -> str:
    """What the points and error bars are."""
    runs = max((len(c.values(metric)) for c in cells), default=0)
    if runs <= 1:
        return "one run per cell: no error bars"
    if by_median:
        return (f"points: median of up to {runs} runs per cell; error bars: lowest to highest "
                "run")
    return f"points: mean of up to {runs} runs per cell; error bars: ± 1 standard deviation"


def _panels(cells: list[Cell]) -> list[tuple[str, list[Cell]]]:
    """One panel per placement when the cells differ in it, else one panel."""
    places = list(dict.fromkeys(c.fields.get("placement") for c in cells))
    if len(places) < 2:
        return [("", cells)]
    return [(PLACEMENT_TITLES.get(str(p), f"placement {p}"),
             [c for c in cells if c.fields.get("placement") == p]) for p in places]


def throughput_vs_mtu(results: list[ResultRow], path: Path, metric: str = "gbps",
                      ctx: Context | None = None, peers: list[ResultRow] | None = None) -> Path:
    """One line per engine (and other axes) over the MTUs, a panel per placement; the C tools
    run in the same lab (``peers``) as dashed grey lines."""
    ctx = ctx or Context("throughput", "")
    plt = _pyplot()
    m = METRICS[metric]
    cells = [c for c in group(results).values() if c.values(metric) and "mtu" in c.fields]
    panels = _panels(cells)
    fig, axes = _figure(plt, ctx, f"{m.label} by MTU",
                        [_bars_note(cells, metric, ctx.by_median),
                         *_not_plotted(results, cells)], panels=len(panels))
    mtus = sorted({int(c.fields["mtu"]) for c in cells})
    label = _labeller(cells, ("mtu", "placement"), ctx)
    colors: dict[str, str] = {}
    for ax, (name, block) in zip(axes, panels, strict=True):
        series: dict[str, list[tuple[int, tuple[float, float, float]]]] = {}
        for cell in block:
            if (p := _point(cell, metric, ctx.by_median)) is not None:
                series.setdefault(label(cell), []).append((mtus.index(int(cell.fields["mtu"])), p))
        peer_lines = _peer_series(peers or [], {c.fields.get("placement") for c in block}, mtus,
                                  metric, ctx.by_median)
        lines = len(series) + len(peer_lines)
        for i, (s, pts) in enumerate(series.items()):
            pts.sort()
            color = colors.setdefault(s, f"C{len(colors) % 10}")
            dodge = (i - (lines - 1) / 2) * 0.04  # side by side, so error bars do not overlap
            ax.errorbar([x + dodge for x, _ in pts], [p[0] for _, p in pts],
                        yerr=[[p[1] for _, p in pts], [p[2] for _, p in pts]], marker="o",
                        capsize=4, color=color, label=literal(s))
        for i, (peer, pts) in enumerate(peer_lines.items(), start=len(series)):
            dodge = (i - (lines - 1) / 2) * 0.04
            ax.errorbar([x + dodge for x, _ in pts], [p[0] for _, p in pts],
                        yerr=[[p[1] for _, p in pts], [p[2] for _, p in pts]], marker="s",
                        linestyle="--", capsize=4, color=("0.35", "0.6")[(i - len(series)) % 2],
                        label=literal(f"{peer} (C tool, same lab)"))
        ax.set_title(literal(name), fontsize=9)
        ax.set_xticks(range(len(mtus)), [str(x) for x in mtus])
        ax.set_xlim(-0.5, len(mtus) - 0.5)
        ax.set_xlabel("MTU (bytes)")
    axes[0].set_ylabel(f"{m.label} ({m.unit})")
    axes[0].set_ylim(bottom=0)
    handles = {str(h.get_label()): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="center right", fontsize=9,
                   title="engine" if "engine" in {f for c in cells for f, _ in c.key} else None)
    return _save(plt, fig, path)


def _peer_series(peers: list[ResultRow], places: set[AxisValue | None], mtus: list[int],
                 metric: str,
                 by_median: bool) -> dict[str, list[tuple[int, tuple[float, float, float]]]]:
    """Each peer tool's points at the MTUs of the plot, in the panel's placement."""
    out: dict[str, list[tuple[int, tuple[float, float, float]]]] = {}
    for cell in group(peers).values():
        mtu, where = cell.fields.get("mtu"), cell.fields.get("placement")
        if (where not in places and where is not None) or mtu not in mtus:
            continue
        if (p := _point(cell, metric, by_median)) is not None:
            out.setdefault(str(cell.fields.get("peer")), []).append((mtus.index(int(mtu)), p))
    return {k: sorted(v) for k, v in out.items()}


def _roles(cell: Cell, cpu: str) -> list[str]:
    """What ran on ``cpu`` in a cell: the application, the sender, the receive softirq."""
    row = cell.rows[0]
    names = ((row.shares_cpu("rx"), "application"), (row.shares_cpu("tx"), "sender"),
             (row.rx_cpu_end, "softirq"))
    return [what for where, what in names if where is not None and str(where) == cpu]


def _cpu_bars(cell: Cell) -> list[tuple[str, list[str], CpuShares]]:
    """(cpu, roles, shares) per CPU the cell's rows recorded: per-CPU shares where the rows
    carry them, else the receiving and sending CPUs of a bench row (one bar when they are the
    same CPU)."""
    shares = per_cpu_shares(cell)
    if shares:
        return [(cpu, _roles(cell, cpu), s) for cpu, s in shares.items()]
    out: list[tuple[str, list[str], CpuShares]] = []
    row = cell.rows[0]
    for side, who in (("rx", "receiving"), ("tx", "sending")):
        vals = [v for r in cell.rows if (v := r.side_shares(side)) is not None and v.sampled]
        where = row.shares_cpu(side)
        cpu = str(where) if where is not None else who
        if not vals or any(c == cpu for c, _, _ in out):
            continue
        mean = CpuShares(**{k: sum(v.share(k) or 0.0 for v in vals) / len(vals)
                            for k, _ in MPSTAT_COLUMNS})
        out.append((cpu, _roles(cell, cpu) or [f"{who} side"], mean))
    return out


def _rows(labels: Iterable[str]) -> list[float]:
    """y positions, the first bar on top, a gap between one cell's CPUs and the next cell's."""
    ys: list[float] = []
    last = None
    for lab in labels:
        ys.append((ys[-1] - (1.5 if lab != last else 1.0)) if ys else 0.0)
        last = lab
    return ys


def cpu_breakdown(results: list[ResultRow], path: Path,
                  ctx: Context | None = None) -> Path:
    """Horizontal bars, one per CPU a cell used, split into %usr, %sys, %irq, %soft ... with
    %idle the rest of 100; a panel per placement. When every cell of a panel gave its CPUs the
    same jobs, the panel's title says which, else each bar does."""
    ctx = ctx or Context("CPU time", "")
    plt = _pyplot()
    cells = [c for c in group(results).values() if c.status == "ok" and _cpu_bars(c)]
    panels = _panels(cells)
    label = _labeller(cells, ("placement",), ctx)
    fig, axes = _figure(plt, ctx, "where the CPU time went",
                        ["bars: each CPU's time over the measured interval (/proc/stat), mean "
                         "over the runs of a cell; the shares add up to 100 %",
                         *_not_plotted(results, cells)],
                        panels=len(panels), sharey=False, top=0.85)
    used = set()
    for ax, (name, block) in zip(axes, panels, strict=True):
        bars = [(label(c), cpu, roles, s) for c in block for cpu, roles, s in _cpu_bars(c)]
        jobs = {(cpu, tuple(roles)) for _, cpu, roles, _ in bars}
        same_jobs = len({cpu for cpu, _ in jobs}) == len(jobs) and all(r for _, r in jobs)
        names = [f"{lab} · cpu{cpu}" if same_jobs or not roles else
                 f"{lab} · cpu{cpu} ({', '.join(roles)})" for lab, cpu, roles, _ in bars]
        ys = _rows(lab for lab, *_ in bars)
        left = [0.0] * len(bars)
        for part in (*CPU_PARTS, "idle"):
            widths = [s.share(part) or 0.0 for *_, s in bars]
            if part == "idle":
                widths = [max(0.0, 100.0 - x) for x in left]
            if not any(widths):
                continue
            used.add(part)
            ax.barh(ys, widths, left=left, color=CPU_COLORS[part], height=0.75)
            left = [a + w for a, w in zip(left, widths, strict=True)]
        ax.set_yticks(ys, [literal(n) for n in names], fontsize=7 if len(bars) > 16 else 8)
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of the CPU's time")
        title = name
        if same_jobs and jobs:
            title += ("\n" if title else "") + "; ".join(
                f"cpu{cpu}: {', '.join(roles)}" for cpu, roles in sorted(jobs))
        ax.set_title(literal(title), fontsize=8.5)
        ax.grid(True, axis="x", alpha=0.3)
        ax.grid(False, axis="y")
    handles = [plt.Rectangle((0, 0), 1, 1, color=CPU_COLORS[p]) for p in (*CPU_PARTS, "idle")
               if p in used]
    fig.legend(handles, [f"%{p}" for p in (*CPU_PARTS, "idle") if p in used],
               loc="center right", fontsize=9)
    fig.subplots_adjust(left=0.18, right=0.85, wspace=0.95 if len(panels) > 1 else 0.08)
    return _save(plt, fig, path)


def pps_per_mode(results: list[ResultRow], path: Path, metric: str = "mpps",
                 ctx: Context | None = None) -> Path:
    """A bar per send mode (and other axes), its value written on it, with error bars."""
    ctx = ctx or Context("packet rate", "")
    plt = _pyplot()
    m = METRICS[metric]
    cells = [c for c in group(results).values() if c.values(metric)]
    fig, axes = _figure(plt, ctx, f"{m.label} per send mode",
                        [_bars_note(cells, metric, ctx.by_median), *_not_plotted(results, cells)])
    ax = axes[0]
    label = _labeller(cells, (), ctx)
    points = [(label(c), p) for c in cells if (p := _point(c, metric, ctx.by_median))]
    xs = range(len(points))
    ax.bar(xs, [p[0] for _, p in points], yerr=[[p[1] for _, p in points],
                                                [p[2] for _, p in points]],
           capsize=5, color="tab:blue")
    for x, (_, p) in zip(xs, points, strict=True):
        ax.annotate(f"{p[0]:.{m.digits}f}", (x, p[0] + p[2]), textcoords="offset points",
                    xytext=(0, 4), ha="center", fontsize=8)
    ax.set_xticks(list(xs), [literal(n) for n, _ in points])
    ax.set_ylabel(f"{m.label} ({m.unit})")
    ax.set_ylim(bottom=0)
    fig.subplots_adjust(right=0.97)
    return _save(plt, fig, path)


class Plotter(Protocol):
    """One plot of a result file's rows into ``path``, in the words of ``ctx``; ``metric``
    the report's headline (a plot that shows none ignores it), ``peers`` the C tools' rows."""

    def __call__(self, results: list[ResultRow], path: Path, metric: str, ctx: Context,
                 peers: list[ResultRow]) -> Path: ...


def _throughput(results: list[ResultRow], path: Path, metric: str, ctx: Context,
                peers: list[ResultRow]) -> Path:
    return throughput_vs_mtu(results, path, metric, ctx, peers)


def _cpu(results: list[ResultRow], path: Path, metric: str, ctx: Context,
         peers: list[ResultRow]) -> Path:
    return cpu_breakdown(results, path, ctx)


def _pps(results: list[ResultRow], path: Path, metric: str, ctx: Context,
         peers: list[ResultRow]) -> Path:
    return pps_per_mode(results, path, metric, ctx)


PLOTTERS: dict[str, Plotter] = {
    "throughput-vs-mtu": _throughput,
    "cpu-breakdown": _cpu,
    "pps-per-mode": _pps,
}


def plot_all(doc: ResultFile, out_dir: str | os.PathLike[str],
             names: list[str] | None = None, stem: str | None = None) -> list[Path]:
    """The plots an envelope's report section asks for, as ``<stem>-<plot>.png``; the stem is
    the experiment's name or the command's unless given."""
    rep = report_section(doc)
    stem = stem or (doc.experiment.name if doc.experiment else "") or doc.kind or "zcnet"
    results = doc.rows()
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ZcnetError(f"cannot create plot directory {out}: {exc.strerror or exc}",
                         "give a directory that exists or can be created") from None
    ctx = context(doc)
    return [PLOTTERS[name](results, out / f"{stem}-{name}.png", rep.metric, ctx,
                           doc.rows(peers=True))
            for name in (names if names is not None else rep.plots)]


def plot_beside(doc: ResultFile, json_path: str | os.PathLike[str]) -> list[Path]:
    """The plots next to a result file: ``out/run.json`` gives ``out/run-<plot>.png``; none
    beside a device or FIFO (``--json /dev/stdout``): there is no directory of results there."""
    p = Path(json_path)
    if p.exists() and not p.is_file():
        return []
    return plot_all(doc, p.parent, stem=p.stem)
