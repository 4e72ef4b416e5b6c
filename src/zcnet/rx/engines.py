"""Engine names for callers that import them from here (tests/test_open_checks.py,
tests/test_bench_engines.py, tests/closed_cases.py, benchmarks/zc_rx.py,
benchmarks/client_stream_vs_inprocess.py); code imports :mod:`zcnet.rx.engine` (the contract)
and :mod:`zcnet.rx.registry` (the names). This module goes once those do."""

from zcnet.rx.copying import EpollEngine, UringEngine, UringMultishotEngine, fast_ring
from zcnet.rx.engine import Consumer, Engine, EngineOptions, RxStats, close_engine
from zcnet.rx.registry import engine_names, make_engine

__all__ = ["Consumer", "Engine", "EngineOptions", "EpollEngine", "RxStats", "UringEngine",
           "UringMultishotEngine", "close_engine", "engine_names", "fast_ring", "make_engine"]
