"""PNG plots of result envelopes (matplotlib, a dependency of zcnet).

Figures have a fixed size and dpi and are saved without tight bounding boxes, so a plot's pixel
size is known in advance (``FIGSIZE`` x ``DPI``) whatever its labels hold.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zcnet.errors import ZcnetError
from zcnet.report.cells import METRICS, Cell, group
from zcnet.report.tables import MPSTAT_COLUMNS, per_cpu_shares, report_section

FIGSIZE = (8.0, 5.0)
DPI = 100
CPU_PARTS = ("usr", "sys", "irq", "soft")


def _pyplot() -> Any:
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


def _figure(plt: Any, title: str, ylabel: str) -> tuple[Any, Any]:
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    fig.subplots_adjust(bottom=0.22)  # room for two-line, rotated bar labels
    ax.set_title(literal(title), fontsize=10)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    return fig, ax


def _save(plt: Any, fig: Any, path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    try:
        fig.savefig(tmp, dpi=DPI, format="png")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ZcnetError(f"cannot write plot {path}: {exc.strerror or exc}",
                         "give a writable directory") from None
    finally:
        plt.close(fig)
    return path


def _labeller(cells: list[Cell], skip: tuple[str, ...]) -> Callable[[Cell], str]:
    """Label cells by the axes that differ between them; constant axes only add clutter."""
    fields = dict.fromkeys(f for c in cells for f, _ in c.key)
    varying = [f for f in fields if f not in skip and f != "experiment"
               and len({c.fields.get(f) for c in cells}) > 1]
    def label(cell: Cell) -> str:
        parts = [str(cell.fields.get(f)) if f in ("engine", "mode") else f"{f}={cell.fields.get(f)}"
                 for f in varying]
        return " ".join(parts) or "all"

    return label


def throughput_vs_mtu(results: list[dict[str, Any]], path: Path, metric: str = "gbps",
                      title: str = "throughput vs MTU") -> Path:
    """One line per engine (and other axes), mean with stdev error bars."""
    plt = _pyplot()
    fig, ax = _figure(plt, title, f"{METRICS[metric].label} ({METRICS[metric].unit})")
    series: dict[str, list[tuple[int, float, float]]] = {}
    cells = list(group(results).values())
    label = _labeller(cells, ("mtu",))
    for cell in cells:
        s = cell.summary(metric)
        mtu = cell.fields.get("mtu")
        if s is None or mtu is None:
            continue
        series.setdefault(label(cell), []).append((int(mtu), s.mean, s.stdev))
    for name, pts in series.items():
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                    marker="o", capsize=3, label=literal(name))
    ax.set_xlabel("MTU (bytes)")
    if series:
        ax.legend()
    return _save(plt, fig, path)


def cpu_breakdown(results: list[dict[str, Any]], path: Path,
                  title: str = "CPU breakdown") -> Path:
    """Stacked %usr/%sys/%irq/%soft bars: per CPU when rows carry per-CPU shares, else rx/tx."""
    plt = _pyplot()
    fig, ax = _figure(plt, title, "% of CPU")
    bars: list[tuple[str, dict[str, float]]] = []
    cells = [c for c in group(results).values() if c.status == "ok"]
    labeller = _labeller(cells, ())
    for cell in cells:
        label = labeller(cell)
        shares = per_cpu_shares(cell)
        if shares:
            bars += [(f"{label}\ncpu{cpu}", s) for cpu, s in shares.items()]
            continue
        for side in ("rx", "tx"):
            vals = [r["cpu"][side] for r in cell.rows if (r.get("cpu") or {}).get(side)]
            if vals:
                bars.append((f"{label}\n{side}", {k: sum(v.get(k, 0.0) for v in vals) / len(vals)
                                                  for k, _ in MPSTAT_COLUMNS}))
    xs = range(len(bars))
    bottom = [0.0] * len(bars)
    for part in CPU_PARTS:
        heights = [b[1].get(part, 0.0) for b in bars]
        ax.bar(xs, heights, bottom=bottom, label=f"%{part}")
        bottom = [x + h for x, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(list(xs), [literal(b[0]) for b in bars], fontsize=7, rotation=30, ha="right")
    ax.set_ylim(0, 115)  # headroom for the legend above the 100% line
    ax.legend(ncol=len(CPU_PARTS), loc="upper center", fontsize=8)
    return _save(plt, fig, path)


def pps_per_mode(results: list[dict[str, Any]], path: Path, metric: str = "mpps",
                 title: str = "packet rate per mode") -> Path:
    plt = _pyplot()
    fig, ax = _figure(plt, title, f"{METRICS[metric].label} ({METRICS[metric].unit})")
    names, means, errs = [], [], []
    cells = list(group(results).values())
    label = _labeller(cells, ())
    for cell in cells:
        s = cell.summary(metric)
        if s is None:
            continue
        names.append(label(cell))
        means.append(s.mean)
        errs.append(s.stdev)
    ax.bar(range(len(names)), means, yerr=errs, capsize=4)
    ax.set_xticks(list(range(len(names))), names)
    return _save(plt, fig, path)


PLOTTERS: dict[str, Callable[..., Path]] = {
    "throughput-vs-mtu": throughput_vs_mtu,
    "cpu-breakdown": cpu_breakdown,
    "pps-per-mode": pps_per_mode,
}


def plot_all(doc: dict[str, Any], out_dir: str | os.PathLike[str],
             names: list[str] | None = None) -> list[Path]:
    """The plots an experiment envelope's report section asks for, as ``<name>-<plot>.png``."""
    rep = report_section(doc)
    exp = doc.get("experiment") or {}
    stem = exp.get("name") or doc.get("kind", "zcnet")
    title = exp.get("title") or stem
    results = [r for r in doc.get("results", []) if not r.get("peer")]
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ZcnetError(f"cannot create plot directory {out}: {exc.strerror or exc}",
                         "give a directory that exists or can be created") from None
    paths = []
    for name in names if names is not None else rep.get("plots", []):
        kwargs: dict[str, Any] = {"title": f"{title}: {name}" if len(title) < 40 else
                                  f"{stem}: {name}"}
        if name != "cpu-breakdown" and rep.get("metric"):
            kwargs["metric"] = rep["metric"]
        paths.append(PLOTTERS[name](results, out / f"{stem}-{name}.png", **kwargs))
    return paths
