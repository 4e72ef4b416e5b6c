"""Reading a result file back (``zcnet compare``, ``zcnet run --report``), whatever the file is.

A report is often run on a file someone handed over, so the file is treated as hostile: it is
read as every file a user hands zcnet is (``zcnet.userfile``: a regular file only, never
blocking, at most ``MAX_BYTES``, UTF-8 only, another encoding named), and its nesting is bounded
(json's recursion would otherwise end in RecursionError, or pass and break later in a report).
Each problem is one ``UsageError`` naming the file and what to give instead. What the file holds
is read into its record (``zcnet.bench.records``), which checks every field: types, and ranges
(``zcnet.quantities``: NaN, infinite, negative figures are refused).
"""

from __future__ import annotations

import json

from zcnet.bench.records import RecordError, ResultFile, read_file
from zcnet.errors import UsageError
from zcnet.jsonvalue import JSONValue
from zcnet.userfile import decode, read_bytes

MAX_BYTES = 64 << 20   # a run of thousands of cells repeated is a few MiB
MAX_DEPTH = 32         # a result nests about 6 deep
FIX = "give a file written by --json/--out"

def depth_exceeds(doc: JSONValue, limit: int = MAX_DEPTH) -> bool:
    """Whether ``doc`` nests deeper than ``limit`` (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return False


def _nesting_error(path: str) -> UsageError:
    return UsageError(f"{path} nests more than {MAX_DEPTH} levels deep; a result file "
                      "does not", FIX)


def parse(path: str, text: str) -> JSONValue:
    try:
        doc: JSONValue = json.loads(text)
    except RecursionError:
        raise _nesting_error(path) from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON: {exc}", FIX) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise UsageError(f"{path} is not a result file: {exc}", FIX) from None
    if depth_exceeds(doc):
        raise _nesting_error(path)
    return doc


def load_result(path: str) -> ResultFile:
    """A zcnet result envelope from ``path``, checked: one-line errors for anything else."""
    text = decode(read_bytes(path, "result file", limit=MAX_BYTES, fix=FIX), path,
                  "result file", FIX)
    doc = parse(path, text)
    if not isinstance(doc, dict) or doc.get("tool") != "zcnet" \
            or not isinstance(doc.get("results"), list):
        raise UsageError(f"{path} is not a zcnet result file", FIX)
    try:
        return read_file(doc)
    except RecordError as e:
        raise UsageError(f"{path}: {e}", f"{FIX} (not edited by hand)") from None
