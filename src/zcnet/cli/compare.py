"""`zcnet compare A.json B.json`: per-cell ratio of B to A with a Welch t-test verdict."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

from zcnet import __version__
from zcnet.bench import meta
from zcnet.bench.records import ComparisonEnv, ComparisonFile, ComparisonRow, ResultFile
from zcnet.cli._args import Subparsers, check_output_file
from zcnet.report import export
from zcnet.report.cells import METRICS
from zcnet.report.compare import (
    check_comparable,
    compare,
    compare_table,
    comparison_row,
    incomplete_notes,
)
from zcnet.report.export import make_console
from zcnet.report.load import load_result
from zcnet.report.tables import Table


def _handler(args: argparse.Namespace) -> int:
    for option in ("json", "csv", "markdown"):
        check_output_file(getattr(args, option), f"--{option}")
    doc_a, doc_b = load_result(args.a), load_result(args.b)
    diffs = check_comparable(doc_a, doc_b, force=args.force)
    rows = compare(doc_a, doc_b, force=args.force, metric=args.metric)
    tables = compare_table(rows, Path(args.a).name, Path(args.b).name, diffs)
    if tables:
        tables[0].notes[:0] = incomplete_notes(doc_a, doc_b)
    # Files first: whatever happens on the terminal, the comparison is kept; a file that
    # cannot be written still leaves the table on the terminal.
    results = [comparison_row(r) for r in rows]
    try:
        _write_files(args, doc_a, doc_b, diffs, results, tables)
    finally:
        export.print_tables(make_console(), tables)
    return 0


def _write_files(args: argparse.Namespace, doc_a: ResultFile, doc_b: ResultFile,
                 diffs: list[str], rows: list[ComparisonRow], tables: list[Table]) -> None:
    if args.json:
        doc = ComparisonFile(
            version=__version__, argv=sys.argv[1:], files=[args.a, args.b],
            complete=doc_a.complete is not False and doc_b.complete is not False,
            env=ComparisonEnv(a=doc_a.env, b=doc_b.env, differences=diffs), results=rows)
        try:
            meta.write_json(args.json, doc)
        except OSError as exc:
            raise export.unwritable(args.json, exc) from None
    if args.markdown:
        export.write_text(args.markdown, export.to_markdown(tables))
    if args.csv:
        export.write_text(args.csv, _csv(rows))


def _csv(rows: list[ComparisonRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["cell", "metric", "a_mean", "a_stdev", "a_n", "b_mean", "b_stdev", "b_n",
                "ratio", "pvalue", "verdict"])
    for r in rows:
        a, b = r.a, r.b
        w.writerow([r.cell_text, r.metric, a.mean if a else "", a.stdev if a else "",
                    a.n if a else "", b.mean if b else "", b.stdev if b else "",
                    b.n if b else "", "" if r.ratio is None else r.ratio,
                    "" if r.pvalue is None else r.pvalue, r.verdict])
    return buf.getvalue()


def register(sub: Subparsers) -> None:
    p = sub.add_parser("compare", help="compare two result files cell by cell (A/B)",
                       description="Per-cell ratio of B to A with a Welch t-test verdict. Refuses "
                       "runs whose kernel, CPU model or NIC differ unless --force.")
    p.add_argument("a", metavar="A.json")
    p.add_argument("b", metavar="B.json")
    p.add_argument("--force", action="store_true",
                   help="compare even if kernel, CPU model or NIC differ")
    p.add_argument("--metric", choices=tuple(METRICS),
                   help="compare this metric (default: each cell's headline metric)")
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the comparison as CSV")
    p.add_argument("--markdown", metavar="FILE", help="write the comparison as Markdown")
    p.set_defaults(func=_handler)
