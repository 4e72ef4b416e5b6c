"""Receive data paths: engines and zero-copy providers with their buffer lifetimes.

- ``engine``: the contract every receive engine keeps (Engine, EngineOptions, RxStats, Consumer);
- ``copying``: the copying engines (epoll, uring, uring-mshot);
- ``zc``: zero-copy receive (providers soft, zcrx, devmem behind one chunk API) and its engines;
- ``registry``: every engine and provider by name, the list the CLI, benchmark and reports use.
"""
