"""`zcnet run SPEC.toml`: run an experiment spec (or re-render a result file with --report).

Also the shared machinery of `zcnet reproduce`: options, progress bar, report outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from zcnet.cli._args import positive
from zcnet.errors import UsageError, ZcnetError
from zcnet.report.export import make_console
from zcnet.report.spec import Spec, load_spec


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the JSON envelope (rewritten after each "
                   "cell, so an interrupted run keeps what it measured)")
    p.add_argument("--csv", metavar="FILE", help="write one line per cell: mean, stdev, min, max")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots (needs zcnet[plot])")


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", help="write NAME.json, NAME.md, NAME.csv and plots "
                   "(when matplotlib is installed) into DIR")
    p.add_argument("--repeat", type=positive(int), metavar="N",
                   help="measure every cell N times (default: the spec's)")
    p.add_argument("--duration", type=positive(float), metavar="S",
                   help="seconds per cell (default: the spec's)")
    p.add_argument("--ifname", help="run on this NIC (the real experiment, no substitutions)")
    p.add_argument("--remote", metavar="HOST[:PORT]",
                   help="with --ifname: the sending host's `zcnet server` (bench experiments) "
                        "or a UDP sink ADDR:PORT reached through the NIC (txbench experiments)")
    p.add_argument("--token-file", metavar="FILE", help="shared secret of the --remote server")
    p.add_argument("--queue", type=int, metavar="Q",
                   help="zcrx/devmem: the --ifname queue prepared with `zcnet nic setup`")
    p.add_argument("--data-port", type=int, metavar="PORT",
                   help="receive on PORT (the port `zcnet nic setup --port` steers to --queue)")
    add_output_options(p)


def _outputs(args: argparse.Namespace, name: str) -> dict[str, Path | None]:
    out = Path(args.out) if getattr(args, "out", None) else None
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ZcnetError(f"cannot create --out directory {out}: {exc.strerror or exc}",
                             "give a directory that exists or can be created") from None

    def pick(explicit: str | None, suffix: str) -> Path | None:
        if explicit:
            return Path(explicit)
        return out / f"{name}{suffix}" if out is not None else None

    return {"json": pick(args.json, ".json"), "csv": pick(args.csv, ".csv"),
            "markdown": pick(args.markdown, ".md"),
            "plots": Path(args.plots) if args.plots else out}


def report(doc: dict[str, Any], args: argparse.Namespace, console: Console,
           name: str | None = None) -> None:
    """Print the tables and write whatever report files were asked for."""
    from zcnet.report import export
    from zcnet.report.tables import experiment_tables

    name = name or (doc.get("experiment") or {}).get("name") or doc.get("kind", "zcnet")
    tables = experiment_tables(doc)
    export.print_tables(console, tables)
    outs = _outputs(args, name)
    if outs["csv"]:
        export.write_text(outs["csv"], export.to_csv(doc.get("results", [])))
    if outs["markdown"]:
        export.write_text(outs["markdown"], export.to_markdown(tables))
    if outs["plots"]:
        _plots(doc, outs["plots"], explicit=bool(args.plots), console=console)
    written = [str(p) for k, p in outs.items() if p is not None and k != "plots"]
    if written:
        console.print("wrote " + ", ".join(written), style="dim", highlight=False)


def _plots(doc: dict[str, Any], where: Path, *, explicit: bool, console: Console) -> None:
    from zcnet.report import plots

    try:
        paths = plots.plot_all(doc, where)
    except ZcnetError as exc:
        if explicit:
            raise
        # --out asks for "everything available"; a missing optional extra is a note, not a failure.
        console.print(f"plots skipped: {exc.message} ({exc.hint})", style="yellow",
                      highlight=False)
        return
    if paths:
        console.print("plots: " + ", ".join(map(str, paths)), style="dim", highlight=False)


def execute(spec: Spec, args: argparse.Namespace) -> int:
    """Run a spec with progress, print and write its reports; 130 when interrupted."""
    import dataclasses

    from zcnet.bench.experiments import Target, iter_run, plan

    if args.duration:
        spec = dataclasses.replace(spec, duration=args.duration)
    if args.remote and not args.ifname:
        raise UsageError("--remote needs --ifname", "name the NIC that faces the remote host")
    from zcnet.bench.server import read_token

    token = read_token(args.token_file) if args.token_file else None
    target = Target(ifname=args.ifname, remote=args.remote, token=token, queue=args.queue,
                    data_port=args.data_port)
    console = make_console()
    err = make_console(stderr=True)
    json_path = _outputs(args, spec.name)["json"]
    the_plan = plan(spec, target)
    for sub in the_plan.substitutions:
        err.print(f"substituted: {sub['text']}", style="yellow", highlight=False)
    doc: dict[str, Any] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
               "{task.total}"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(spec.name, total=None)

        def progress(done: int, total: int, cell: dict[str, Any]) -> None:
            text = " ".join(f"{k}={v}" for k, v in cell.items())
            bar.update(task, completed=done, total=total, description=f"{spec.name} {text}")

        try:
            for partial in iter_run(spec, target=target, repeat=args.repeat,
                                    json_path=json_path, progress=progress):
                doc = partial
        except KeyboardInterrupt:
            kept = len(doc.get("results", []))
            where = f" in {json_path}" if json_path else " (pass --out or --json to keep them)"
            print(f"zcnet: interrupted: {kept} measured rows kept{where}", file=sys.stderr)
            return 130
    report(doc, args, console, spec.name)
    return 0 if any(r.get("status") == "ok" for r in doc.get("results", [])) else 1


def load_result(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", "give a file from --json/--out") \
            from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON: {exc}", "give a file from --json/--out") from None
    if not isinstance(doc, dict) or doc.get("tool") != "zcnet" \
            or not isinstance(doc.get("results"), list):
        raise UsageError(f"{path} is not a zcnet result file", "give a file from --json/--out")
    return doc


def _handler(args: argparse.Namespace) -> int:
    if args.report:
        if args.spec:
            raise UsageError("give either SPEC or --report FILE, not both")
        doc = load_result(args.report)
        args.json = None  # re-rendering never rewrites the source file
        report(doc, args, make_console())
        return 0
    if not args.spec:
        raise UsageError("no spec given", "zcnet run SPEC.toml (copy one with "
                         "`zcnet reproduce NAME --show > my.toml`)")
    return execute(load_spec(args.spec), args)


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run an experiment spec (TOML)",
                       description="Run an experiment spec: the matrix of cells, each measured "
                       "--repeat times, reported as tables (and JSON/CSV/Markdown/plots).")
    p.add_argument("spec", nargs="?", metavar="SPEC.toml")
    p.add_argument("--report", metavar="RESULT.json",
                   help="render an existing result file instead of measuring")
    add_run_options(p)
    p.set_defaults(func=_handler)
