"""Texts that the bench table, the experiment tables and the plots share."""

from __future__ import annotations

ZCRX_COPY_NOTE = ("zcrx copy mode: no NIC queue here, so the kernel copied every byte into the "
                  "zcrx area; the zcrx protocol ran for real (RECV_ZC, area offsets, refill ring),"
                  " zero copy did not")

PLACEMENT_TITLES = {
    "same": "placement same: application on the receive-softirq CPU",
    "split": "placement split: application off the receive-softirq CPU",
}
