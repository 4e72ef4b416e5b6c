"""Typed records of what zcnet measures, from a flow worker to a report, and their one JSON
form: ``flow`` (one flow end and its pieces), ``rows`` (a result row, one schema for every
command), ``envelope`` (the result file and its summaries), ``codec`` (to and from JSON, with
the checks of everything read back)."""

from __future__ import annotations

from zcnet.bench.records.codec import RecordError, meta, parse, parse_as, to_json
from zcnet.bench.records.envelope import (
    FORMAT,
    CellSummary,
    ClientSummary,
    ComparisonEnv,
    ComparisonFile,
    ComparisonRow,
    Env,
    ExperimentInfo,
    Machine,
    MeanSd,
    ModeSummary,
    NicFile,
    ReportSection,
    ResultFile,
    Spread,
    Stats,
    Substitution,
    Summary,
    upgrade,
)
from zcnet.bench.records.flow import (
    SHARE_NAMES,
    CpuPair,
    CpuShares,
    EngineStat,
    FlowEnd,
    Intervals,
    Latency,
    RoleShares,
    RunResults,
    TcpDelta,
    Verify,
)
from zcnet.bench.records.rows import KEY_FIELDS, STATUSES, AxisValue, ResultRow
from zcnet.jsonvalue import JSONValue


def read_file(data: JSONValue) -> ResultFile:
    """A result file's JSON (of this format or format 1) as its record; RecordError names the
    first field that is not what a zcnet result holds."""
    if not isinstance(data, dict):
        raise RecordError("(top)", data, "must be an object")
    return parse(ResultFile, upgrade(data))


__all__ = [
    "FORMAT", "KEY_FIELDS", "SHARE_NAMES", "STATUSES", "AxisValue", "CellSummary",
    "ClientSummary", "ComparisonEnv", "ComparisonFile", "ComparisonRow", "CpuPair",
    "CpuShares", "EngineStat", "Env", "ExperimentInfo", "FlowEnd", "Intervals", "Latency",
    "Machine", "MeanSd", "ModeSummary", "NicFile", "RecordError", "ReportSection",
    "ResultFile", "ResultRow", "RoleShares", "RunResults", "Spread", "Stats", "Substitution",
    "Summary", "TcpDelta", "Verify", "meta", "parse", "parse_as", "read_file", "to_json",
    "upgrade",
]
