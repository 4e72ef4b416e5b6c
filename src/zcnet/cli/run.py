"""`zcnet run SPEC.toml`: run an experiment spec (or re-render a result file with --report).

Also the shared machinery of `zcnet reproduce`: options, progress bar, report outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rich.console import Console

from zcnet.bench.authtoken import read_token
from zcnet.bench.records import AxisValue, ResultFile
from zcnet.bench.spec import Spec, load_spec
from zcnet.cli._args import Subparsers, check_ifname, check_output_dir, check_output_file, number
from zcnet.cli._progress import CellProgress
from zcnet.errors import UsageError, ZcnetError
from zcnet.report import export, plots
from zcnet.report.cells import cell_key, key_text
from zcnet.report.export import make_console, say
from zcnet.report.load import load_result
from zcnet.report.tables import experiment_tables, result_text


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the JSON envelope (rewritten after each "
                   "cell, so an interrupted run keeps what it measured) and PNG plots beside it")
    p.add_argument("--csv", metavar="FILE", help="write one line per cell: mean, stdev, min, max")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--no-plots", action="store_true",
                   help="write no plots beside --json or into --out")


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", help="write NAME.json, NAME.md, NAME.csv and plots "
                   "into DIR")
    p.add_argument("--repeat", type=number("repeat"), metavar="N",
                   help="measure every cell N times (default: the spec's)")
    p.add_argument("--duration", type=number("duration"), metavar="S",
                   help="seconds per cell (default: the spec's)")
    p.add_argument("--ifname", help="run on this NIC (the real experiment, no substitutions)")
    p.add_argument("--remote", metavar="HOST[:PORT]",
                   help="with --ifname: the sending host's `zcnet server` (bench experiments) "
                        "or a UDP sink ADDR:PORT reached through the NIC (txbench experiments)")
    p.add_argument("--token-file", metavar="FILE", help="shared secret of the --remote server")
    p.add_argument("--queue", type=number("queue"), metavar="Q",
                   help="zcrx/devmem: the --ifname queue prepared with `zcnet nic setup`")
    p.add_argument("--data-port", type=number("port"), metavar="PORT",
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
            "plots": Path(args.plots) if args.plots else
            None if getattr(args, "no_plots", False) else out}


def check_outputs(args: argparse.Namespace) -> None:
    """Every output path the user named, checked before anything is measured."""
    for option in ("json", "csv", "markdown"):
        check_output_file(getattr(args, option, None), f"--{option}")
    for option in ("plots", "out"):
        check_output_dir(getattr(args, option, None), f"--{option}")


def report(doc: ResultFile, args: argparse.Namespace, console: Console,
           name: str | None = None) -> None:
    """Write whatever report files were asked for, then print the tables.

    Files come first: a run's results must not depend on the terminal rendering them."""
    name = name or (doc.experiment.name if doc.experiment else "") or doc.kind or "zcnet"
    tables = experiment_tables(doc)
    outs = _outputs(args, name)
    failed: list[ZcnetError] = []
    for key, render in (("csv", lambda: export.to_csv(doc.results)),
                        ("markdown", lambda: export.to_markdown(tables))):
        if (path := outs[key]) is not None:
            try:
                export.write_text(path, render())
            except ZcnetError as exc:  # still show the tables, then fail
                failed.append(exc)
                outs[key] = None
    export.print_tables(console, tables)
    if failed:
        raise failed[0]
    if outs["plots"]:
        _plots(doc, outs["plots"], explicit=bool(args.plots), console=console)
    elif outs["json"] and not getattr(args, "no_plots", False):
        _plots(doc, outs["json"], explicit=False, console=console, beside=True)
    written = [str(p) for k, p in outs.items() if p is not None and k != "plots"]
    if written:
        say(console, "wrote " + ", ".join(written), "dim")


def _plots(doc: ResultFile, where: Path, *, explicit: bool, console: Console,
           beside: bool = False) -> None:
    """Plots into directory ``where``, or ``beside`` the result file ``where``."""
    try:
        paths = plots.plot_beside(doc, where) if beside else plots.plot_all(doc, where)
    except ZcnetError as exc:
        if explicit:
            raise
        # --out asks for "everything available"; a missing optional extra is a note, not a failure.
        say(console, f"plots skipped: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""),
            "yellow")
        return
    if paths:
        say(console, "plots: " + ", ".join(map(str, paths)), "dim")


def check_target(args: argparse.Namespace) -> None:
    """Options that only mean something together, checked before measuring."""
    check_ifname(args.ifname)
    if args.remote and not args.ifname:
        raise UsageError("--remote needs --ifname", "name the NIC that faces the remote host")
    for option, value in (("--queue", args.queue), ("--data-port", args.data_port)):
        if value is not None and not args.ifname:
            raise UsageError(f"{option} needs --ifname", f"name the NIC whose {option[2:]} "
                             "`zcnet nic setup` prepared, or leave it out in the lab")
    if args.token_file and not args.remote:
        raise UsageError("--token-file needs --remote", "it is the --remote server's secret")


def execute(spec: Spec, args: argparse.Namespace) -> int:
    """Run a spec with progress, write and print its reports; 130 when interrupted."""
    # Imported here, not at the top: every `zcnet` command loads this module to build its
    # parser, and only `run` and `reproduce` need the experiment runner (servers, labs, NICs).
    from zcnet.bench.experiments import ExperimentRig, iter_run, plan

    check_target(args)
    check_outputs(args)
    if args.duration:
        spec = dataclasses.replace(spec, duration=args.duration)
    token = read_token(args.token_file) if args.token_file else None
    rig = ExperimentRig(ifname=args.ifname, remote=args.remote, token=token, queue=args.queue,
                        data_port=args.data_port)
    console = make_console()
    err = make_console(stderr=True)
    json_path = _outputs(args, spec.name)["json"]
    the_plan = plan(spec, rig)
    for sub in the_plan.substitutions:
        say(err, f"substituted: {sub.text}", "yellow")
    doc: ResultFile | None = None
    total = (args.repeat or spec.repeat) * len(the_plan.cells)
    with CellProgress(err, total, spec.name) as bar:
        def progress(done: int, total: int, cell: dict[str, AxisValue]) -> None:
            if cell:
                bar.start(" ".join(f"{k}={v}" for k, v in cell.items()))

        try:
            seen = 0
            for partial in iter_run(spec, rig=rig, repeat=args.repeat,
                                    json_path=json_path, progress=progress):
                doc = partial
                rows = doc.results[seen:]
                seen = len(doc.results)
                if rows:
                    bar.done(key_text(cell_key(rows[0])), result_text(rows, spec.metric))
        except KeyboardInterrupt:
            bar.stop()
            kept = len(doc.results) if doc is not None else 0
            if doc is not None and kept:
                report(doc, args, console, spec.name)  # marked incomplete
            where = f" in {json_path}" if json_path else " (pass --out or --json to keep them)"
            print(f"zcnet: interrupted: {kept} measured rows kept{where}", file=sys.stderr)
            return 130
    assert doc is not None  # iter_run yields at least the finished document
    report(doc, args, console, spec.name)
    return 0 if any(r.ok for r in doc.results) else 1


def _handler(args: argparse.Namespace) -> int:
    if args.report:
        if args.spec:
            raise UsageError("give either SPEC or --report FILE, not both")
        args.json = None  # re-rendering never rewrites the source file
        check_outputs(args)
        doc = load_result(args.report)
        report(doc, args, make_console())
        return 0
    if not args.spec:
        raise UsageError("no spec given", "zcnet run SPEC.toml (copy one with "
                         "`zcnet reproduce NAME --show > my.toml`)")
    return execute(load_spec(args.spec), args)


def register(sub: Subparsers) -> None:
    p = sub.add_parser("run", help="run an experiment spec (TOML)",
                       description="Run an experiment spec: the matrix of cells, each measured "
                       "--repeat times, reported as tables (and JSON/CSV/Markdown/plots).")
    p.add_argument("spec", nargs="?", metavar="SPEC.toml")
    p.add_argument("--report", metavar="RESULT.json",
                   help="render an existing result file instead of measuring")
    add_run_options(p)
    p.set_defaults(func=_handler)
