"""Send data paths: copy, zero-copy and batched senders.

- ``senders``: ``make_sender(kind, sock, buf)`` for TCP (copy, msgzc, sendzc, sendzc-plain);
  ``slots``: the buffer slots, hooks and counters every sender shares (``SlotSender``);
  ``zerocopy``: MSG_ZEROCOPY error-queue parsing and range coalescing; ``sendzc``: io_uring SEND_ZC.
- ``udp_modes``/``uring_send``: UDP burst senders (single, mmsg, uring, gso); ``mmsg``: ctypes
  sendmmsg/recvmmsg; ``payload``: what packets carry; ``sink``: the checking receiver process;
  ``hwcount``: perf_event instruction/cycle counters. The txbench runner, which needs the lab,
  is ``zcnet.bench.txbench``.
"""
