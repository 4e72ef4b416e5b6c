"""devmem flows of a server session: the server binds each queue set once, and its flow
workers (one process per flow) receive on that binding.

A second bind-rx on a bound queue is EEXIST, so workers that each bound their flow's queues
would refuse each other. Instead the session (in the server process, which outlives its
workers) joins this process's binding of the flow's queues (zcnet.rx.zc.devmem_binding) for
each devmem flow it opens, and hands the worker a ``SharedBinding``: the dma-buf and the
member count page, as fds that multiprocessing passes along with SCM_RIGHTS. The worker maps
them and reads its own socket only. The membership ends when the worker is stopped (its
process and socket are gone then), and the last one unbinds.
"""

from __future__ import annotations

from collections.abc import Mapping

from zcnet.bench.proto import UNSUPPORTED_HERE, OptionValue
from zcnet.bench.worker import SessionError
from zcnet.errors import UsageError, ZcnetError
from zcnet.rx.engine import EngineOptions
from zcnet.rx.zc.devmem_binding import DevmemBinding, acquire
from zcnet.rx.zc.engines import DevmemEngine


def join(engine: str, options: Mapping[str, OptionValue], read_size: int
         ) -> DevmemBinding | None:
    """The session's membership of the binding a devmem flow with ``options`` receives on, or
    None (not devmem, or no queue named: the worker says what is missing). A refusal is the
    reply the worker would have given."""
    if engine != DevmemEngine.name:
        return None
    try:
        opts = EngineOptions.from_mapping(options, bufsize=read_size)
        queues = opts.queue_set()
        if opts.ifname is None or not queues:
            return None
        return acquire(opts.ifname, queues, opts.area_bytes(DevmemEngine.area_buffers))
    except UsageError as e:
        raise SessionError("invalid", f"engine {engine}: {e}") from None
    except ZcnetError as e:
        raise SessionError("unsupported", f"engine {engine}{UNSUPPORTED_HERE}{e}") from None
