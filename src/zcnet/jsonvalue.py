"""The type of data that really is arbitrary JSON: what ``json.loads`` returns, and what
``json.dumps`` takes without a custom encoder.

Use it only where nothing more is known (a NIC's ethtool sections, a server's host details read
back from a file); a structure with known fields is a record (``zcnet.bench.records``).
"""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None
JSONObject: TypeAlias = dict[str, JSONValue]
