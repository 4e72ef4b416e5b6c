"""`setup` is a transaction on a real veth: a failure at any step, Ctrl-C, or a killed process
leaves (or lets `restore` bring back) the device exactly as it was; and the CLI around it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from refusals import refusal, run_main
from zcnet.bench.spec import builtin_text
from zcnet.cli import main
from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.lab import Lab
from zcnet.netns import in_netns
from zcnet.nic import ethtool, info, setup
from zcnet.nic.arrival import arrived_on
from zcnet.nic.device import Device

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("no_leaks")]


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(setup.STATE_DIR_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture
def lab(no_leaks, state_dir):
    with Lab() as lab:
        yield lab


def _state(lab) -> dict:
    with Device.open(lab.if_a, lab.ns_a) as dev:
        return info.config_state(dev)


def _veth_steps(lab) -> list[setup.Step]:
    """Steps veth really supports, each flipping the device away from its current state."""
    with Device.open(lab.if_a, lab.ns_a) as dev:
        ch = ethtool.channels_get(dev)
        active = ethtool.features_get(dev)["active"].value
    return [
        setup.Step("channels", {"count": 2 if ch["rx-count"] != 2 else 1}),
        setup.Step("feature", {"name": "rx-gro-list", "on": "rx-gro-list" not in active}),
        setup.Step("feature", {"name": "rx-gro", "on": "rx-gro" not in active}),
        setup.Step("feature", {"name": "rx-udp-gro-forwarding",
                               "on": "rx-udp-gro-forwarding" not in active}),
    ]


def _cfg(lab, **kw) -> setup.NicConfig:
    return setup.NicConfig(lab.if_a, kw.pop("queue", 1), kw.pop("port", 9999),
                           netns=lab.ns_a, **kw)


def test_zcrx_setup_on_veth_fails_at_hds_and_changes_nothing(lab, state_dir):
    before = _state(lab)
    with pytest.raises(setup.SetupError) as exc:
        setup.apply(_cfg(lab))
    msg = str(exc.value)
    assert exc.value.step == "tcp-data-split on"
    assert "driver veth does not support tcp-data-split" in msg
    assert "undone: channels 2" in msg  # veth starts with one RX channel
    assert _state(lab) == before
    assert not list(state_dir.iterdir())


@pytest.mark.parametrize("fail_at", range(4))
@pytest.mark.parametrize("fault", [ZcnetError("injected fault"), KeyboardInterrupt()],
                         ids=["error", "ctrl-c"])
def test_failure_at_each_step_restores_everything(lab, state_dir, fail_at, fault):
    before = _state(lab)
    steps = _veth_steps(lab)
    titles = [s.title for s in steps]

    def inject(i: int, step: setup.Step) -> None:
        if i == fail_at:
            raise fault

    expected = KeyboardInterrupt if isinstance(fault, KeyboardInterrupt) else setup.SetupError
    with pytest.raises(expected) as exc:
        setup.apply(_cfg(lab), steps=steps, before_step=inject)
    if expected is setup.SetupError:
        assert exc.value.step == titles[fail_at]
        assert "injected fault" in str(exc.value)
        for title in titles[:fail_at]:
            assert title in str(exc.value)
    assert _state(lab) == before
    assert not list(state_dir.iterdir())


def test_killed_between_steps_restore_finishes(lab, state_dir):
    before = _state(lab)
    steps = _veth_steps(lab)
    child = textwrap.dedent(f"""
        import os, signal
        from zcnet.nic import setup
        steps = [setup.Step(s["kind"], s["params"]) for s in {[{"kind": s.kind,
                 "params": s.params} for s in steps]!r}]
        def die(i, step):
            if i == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        setup.apply(setup.NicConfig({lab.if_a!r}, 1, 9999, netns={lab.ns_a!r}), steps=steps,
                    before_step=die)
    """)
    proc = subprocess.run([sys.executable, "-c", child], env=dict(os.environ), timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    saved = setup.load_state(lab.if_a, lab.ns_a)
    assert saved is not None
    assert [s["status"] for s in saved["steps"]] == ["done", "done", "applying", "pending"]
    assert _state(lab) != before
    undone = setup.restore(lab.if_a, lab.ns_a)
    assert undone == [steps[2].title, steps[1].title, steps[0].title]
    assert _state(lab) == before
    assert setup.load_state(lab.if_a, lab.ns_a) is None


def test_apply_restore_round_trip_and_guards(lab, state_dir):
    before = _state(lab)
    steps = _veth_steps(lab)
    done = setup.apply(_cfg(lab), steps=steps)
    assert [s.status for s in done] == ["done"] * len(steps)
    assert _state(lab) != before
    with pytest.raises(ZcnetError, match="already set up") as again:
        setup.apply(_cfg(lab), steps=_veth_steps(lab))
    # The hints give the command that works: the device is in a namespace.
    assert again.value.hint == f"run 'zcnet nic restore {lab.if_a} --netns {lab.ns_a}' first"
    setup.restore(lab.if_a, lab.ns_a)
    assert _state(lab) == before
    with pytest.raises(ZcnetError, match="nothing to restore") as nothing:
        setup.restore(lab.if_a, lab.ns_a)
    assert nothing.value.hint == f"'zcnet nic setup {lab.if_a} --netns {lab.ns_a} ...' writes it"


def test_zcrx_plan_on_veth(lab):
    with Device.open(lab.if_a, lab.ns_a) as dev:
        plain = setup.plan(dev, _cfg(lab))
        ctx = setup.plan(dev, _cfg(lab, rss_context=True, flows=("tcp6",)))
    assert [s.title for s in plain] == [
        "channels 2", "tcp-data-split on", "hds-thresh 0", "rx-ntuple-filter on",
        "RSS off queue 1", "tcp4 dst-port 9999 -> queue 1", "tcp6 dst-port 9999 -> queue 1"]
    assert [s.kind for s in ctx][-2:] == ["rss-context", "flow-rule"]
    assert ctx[-1].params["context_step"] == len(ctx) - 2


def test_bad_config_is_a_usage_error(lab, state_dir):
    for kw in ({"port": 0}, {"queue": -1}, {"mode": "magic"}, {"queue": 64}):
        with pytest.raises(ZcnetError):
            setup.apply(_cfg(lab, **kw))
    assert not list(state_dir.iterdir())


# ------------------------------------------------------------------------------------ CLI


def test_cli_doctor_exit_status_and_output(lab, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # keep rich from wrapping cells
    rc = main(["nic", "doctor", lab.if_a, "--netns", lab.ns_a])  # its last RX queue
    out = capsys.readouterr().out
    assert rc == 1 and "on queue 0?" in out  # the lab's veth has one RX queue
    for name in ("io_uring zcrx", "HDS on", "hds-thresh 0", "RLIMIT_MEMLOCK", "IOMMU",
                 "not ready"):
        assert name in out
    rc = main(["nic", "doctor", lab.if_a, "--netns", lab.ns_a, "--json", "--mode", "devmem"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["kind"] == "nic-doctor" and doc["ready"] is False
    assert {r["status"] for r in doc["results"]} <= {"pass", "fail", "unknown"}


def test_cli_setup_error_is_one_line(lab, state_dir, capsys):
    before = _state(lab)
    rc = main(["nic", "setup", lab.if_a, "--netns", lab.ns_a, "--queue", "1", "--port", "9999"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "setup step 'tcp-data-split on' failed: driver veth does not support tcp-data-split" \
        in err
    assert "Traceback" not in err
    assert _state(lab) == before


def test_cli_show_json_and_unknown_interface(lab, capsys):
    assert main(["nic", "show", lab.if_a, "--netns", lab.ns_a, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "nic-show" and doc["results"][0]["driver"]["driver"] == "veth"
    assert main(["nic", "show", "zz-nope", "--netns", lab.ns_a]) == 1
    assert "no network interface named 'zz-nope'" in capsys.readouterr().err
    assert main(["nic", "restore", lab.if_a, "--netns", lab.ns_a]) == 1
    assert "nothing to restore" in capsys.readouterr().err


# ------------------------------------------------------ issue 33: names, state dir, state file

BAD_NAMES = {"a" * 16: "is 16 bytes long", "é" * 8: "is 16 bytes long",
             "a b": "holds ' '", "a:b": "holds ':'", "a/b": "holds '/'", "a\xa0b": "holds",
             ".": "is not a name", "..": "is not a name", "": "is empty"}


@pytest.mark.parametrize("action", ["show", "doctor", "setup", "restore"])
def test_names_the_kernel_refuses_are_usage_errors(action: str) -> None:
    extra = ["--queue", "1", "--port", "9999"] if action == "setup" else []
    for name, why in BAD_NAMES.items():
        rc, _, err = run_main("nic", action, name, *extra)
        refusal(rc, err, 2, "is not an interface name", why)
    for netns in ("a/b", "..", "", "n" * 256):
        rc, _, err = run_main("nic", action, "lo", "--netns", netns, *extra)
        refusal(rc, err, 2, "--netns", "bad network namespace name")


def test_a_long_name_in_bytes_is_counted_in_bytes(tmp_path) -> None:
    """Fifteen bytes is the kernel's limit: seven two-byte characters are a name (just not one
    that exists here), eight are not; `run --ifname` says the same as `nic`."""
    rc, _, err = run_main("nic", "show", "é" * 7)
    refusal(rc, err, 1, "no network interface named")
    spec = tmp_path / "spec.toml"
    spec.write_text(builtin_text("tx-mpwqe"))
    rc, _, err = run_main("run", str(spec), "--ifname", "é" * 8)
    refusal(rc, err, 2, "--ifname", "is 16 bytes long")


def _unusable_dirs(tmp_path) -> dict[str, tuple[str, str]]:
    """ZCNET_STATE_DIR values that cannot hold a state file -> what the error says."""
    plain = tmp_path / "plain"
    plain.write_text("")
    return {str(plain): ("is not a directory", str(plain)),
            str(plain / "sub"): ("cannot create the state directory", "Not a directory"),
            "/sys/kernel/zcnet-state": ("cannot create the state directory",
                                        "Operation not permitted"),
            "/sys/kernel": ("cannot create state file", "Permission denied"),
            str(tmp_path / ("x" * 300)): ("cannot create the state directory",
                                          "File name too long")}


def test_unusable_state_dir_refused_before_the_device_changes(lab, tmp_path, monkeypatch):
    before = _state(lab)
    for where, needles in _unusable_dirs(tmp_path).items():
        monkeypatch.setenv(setup.STATE_DIR_ENV, where)
        rc, _, err = run_main("nic", "setup", lab.if_a, "--netns", lab.ns_a, "--queue", "1",
                              "--port", "9999")
        refusal(rc, err, 1, *needles, "fix: set ZCNET_STATE_DIR")
        assert _state(lab) == before
    assert not list(Path("/sys/kernel").glob("nic-*"))


def test_restore_from_an_unusable_state_dir(lab, tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.write_text("")
    monkeypatch.setenv(setup.STATE_DIR_ENV, str(plain))
    rc, _, err = run_main("nic", "restore", lab.if_a, "--netns", lab.ns_a)
    refusal(rc, err, 1, f"the state directory {plain} is not a directory", "ZCNET_STATE_DIR")


def test_restore_from_a_read_only_state_dir_changes_nothing(lab, state_dir):
    """Restore saves each undo as it goes: a state file it could not update would leave the
    device half-restored and the file saying otherwise. So it finds out first."""
    before = _state(lab)
    setup.apply(_cfg(lab), steps=_veth_steps(lab))
    applied = _state(lab)
    path = setup.state_path(lab.if_a, lab.ns_a)
    saved = path.read_bytes()
    ro = (f"mount --bind {state_dir} {state_dir} && mount -o remount,bind,ro {state_dir} && "
          f"exec {sys.executable} -m zcnet nic restore {lab.if_a} --netns {lab.ns_a}")
    r = subprocess.run(["unshare", "--mount", "sh", "-c", ro], capture_output=True, text=True,
                       timeout=60)
    refusal(r.returncode, r.stderr, 1, f"cannot write state file {path}", "Read-only file system",
            "fix: set ZCNET_STATE_DIR")
    assert _state(lab) == applied and path.read_bytes() == saved
    setup.restore(lab.if_a, lab.ns_a)
    assert _state(lab) == before


def _damaged(text: str) -> dict[str, bytes | None]:
    """Ways a state file (``text``, as setup wrote it) gets damaged -> the damaged bytes (None:
    something else than a file is put in its place)."""
    doc = json.loads(text)

    def edit(change) -> bytes:
        d = json.loads(text)
        change(d)
        return json.dumps(d).encode()

    first = doc["steps"][0]   # undone last: a restore that parsed as it went would undo others
    return {
        "truncated": text.encode()[: len(text) // 2],
        "binary": b"\x00\xff" * 64,
        "latin-1": text.replace('"channels"', '"chännels"').encode("latin-1"),
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "a list": b"[]",
        "version 3": edit(lambda d: d.update(version=3)),
        "another device": edit(lambda d: d.update(ifname="eth9")),
        "unknown step": edit(lambda d: d["steps"][0].update(kind="reboot")),
        "count as text": edit(lambda d: d["steps"][0]["params"].update(
            count=str(first["params"]["count"]))),
        "prior garbage": edit(lambda d: d["steps"][0]["undo"].update(prior={"rx-count": "x"})),
        "no undo": edit(lambda d: d["steps"][0].pop("undo")),
        "status": edit(lambda d: d["steps"][0].update(status="finished")),
        "extra field": edit(lambda d: d["steps"][1]["params"].update(force=True)),
        "feature name": edit(lambda d: d["steps"][1]["params"].update(name="a b")),
        "fifo": None, "directory": None,
    }


def test_damaged_state_file_is_refused_and_nothing_is_undone(lab, state_dir):
    before = _state(lab)
    setup.apply(_cfg(lab), steps=_veth_steps(lab))
    applied = _state(lab)
    path = setup.state_path(lab.if_a, lab.ns_a)
    good = path.read_text()
    for kind, data in _damaged(good).items():
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            path.mkdir()
        else:
            path.write_bytes(data)
        rc, _, err = run_main("nic", "restore", lab.if_a, "--netns", lab.ns_a)
        line = refusal(rc, err, 1, path, "put back by hand what setup changed, then remove")
        assert "state file" in line, kind
        assert _state(lab) == applied, kind   # not one step undone
        if data is not None:
            assert path.read_bytes() == data, kind   # the evidence is kept
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink()
        path.write_text(good)
    assert setup.restore(lab.if_a, lab.ns_a)
    assert _state(lab) == before


def test_setup_refuses_over_a_damaged_state_file(lab, state_dir):
    before = _state(lab)
    path = setup.state_path(lab.if_a, lab.ns_a)
    path.write_text("{")
    rc, _, err = run_main("nic", "setup", lab.if_a, "--netns", lab.ns_a, "--queue", "1",
                          "--port", "9999")
    refusal(rc, err, 1, path, "is not JSON")
    assert _state(lab) == before and path.read_text() == "{"


# ------------------------------------------------------------------- several queues (issue 36)

WIDE = "zq0"   # a veth with four RX queues: the lab's own have one per CPU


@pytest.fixture
def wide(lab):
    """(ifname, netns) of a four-queue veth in the lab's side a (gone with the namespace)."""
    subprocess.run(["ip", "-n", lab.ns_a, "link", "add", WIDE, "numrxqueues", "4",
                    "numtxqueues", "4", "type", "veth", "peer", "name", "zq1", "numrxqueues",
                    "4", "numtxqueues", "4"], check=True, timeout=30)
    subprocess.run(["ip", "-n", lab.ns_a, "link", "set", WIDE, "up"], check=True, timeout=30)
    return WIDE, lab.ns_a


def _wide_state(wide) -> dict:
    with Device.open(*wide) as dev:
        return info.config_state(dev)


def test_plan_for_several_queues_one_rule_per_port(wide):
    ifname, ns = wide
    cfg = setup.NicConfig(ifname, (1, 2), (9000, 9001, 9002), netns=ns, flows=("tcp4",))
    with Device.open(ifname, ns) as dev:
        titles = [s.title for s in setup.plan(dev, cfg)]
    # veth starts with all four channels; RSS leaves both queues; ports dealt to them in turn
    assert titles == ["tcp-data-split on", "hds-thresh 0", "rx-ntuple-filter on",
                      "RSS off queues 1,2", "tcp4 dst-port 9000 -> queue 1",
                      "tcp4 dst-port 9001 -> queue 2", "tcp4 dst-port 9002 -> queue 1"]
    assert [cfg.queue_of(p) for p in (9000, 9001, 9002, 9003)] == [1, 2, 1, None]


def test_plan_for_several_queues_through_an_rss_context(wide):
    ifname, ns = wide
    cfg = setup.NicConfig(ifname, (2, 3), 9999, rss_context=True, netns=ns)
    with Device.open(ifname, ns) as dev:
        ethtool.channels_set(dev, rx_count=2)
        steps = setup.plan(dev, cfg)
    assert [s.title for s in steps] == [
        "channels 4", "tcp-data-split on", "hds-thresh 0", "rx-ntuple-filter on",
        "RSS off queues 2,3", "RSS context for queues 2,3",
        "tcp4 dst-port 9999 -> the RSS context", "tcp6 dst-port 9999 -> the RSS context"]
    assert steps[4].params == {"queues": [2, 3], "count": 4}
    assert {s.params["context_step"] for s in steps[-2:]} == {5}
    assert cfg.queue_of(9999) is None   # the context's hash decides


def test_several_queues_need_a_channel_for_rss(wide, state_dir):
    """Queues 0..3 of a four-queue device leave none for every other flow: refused before
    anything changes, naming the count."""
    ifname, ns = wide
    before = _wide_state(wide)
    with pytest.raises(UsageError, match=r"queues 0,1,2,3 need 5 channels, .* at most 4"):
        setup.apply(setup.NicConfig(ifname, (0, 1, 2, 3), range(9000, 9004), netns=ns))
    assert _wide_state(wide) == before and not list(state_dir.iterdir())


@pytest.mark.parametrize(("queues", "ports", "kw", "needles"), [
    ((1, 2), (9999,), {}, ("2 queues and 1 port(s)", "queue 2 would get no flow",
                           "--rss-context")),
    ((1, 1), (9999, 10000), {}, ("a queue is given twice",)),
    ((1,), (9999, 9999), {}, ("a port is given twice",)),
    ((), (9999,), {}, ("no queue given",)),
    ((1,), (), {}, ("no port given",)),
    ((1,), tuple(range(9000, 9065)), {}, ("65 ports: at most 64",)),
    ((1, 2), (0, 9999), {}, ("port 0 is not a TCP port",)),
    ((1,), (9999,), {"mode": "magic"}, ("unknown mode",)),
])
def test_bad_several_queue_configs_are_usage_errors(wide, state_dir, queues, ports, kw, needles):
    ifname, ns = wide
    before = _wide_state(wide)
    with pytest.raises(UsageError) as exc:
        setup.apply(setup.NicConfig(ifname, queues, ports, netns=ns, **kw))
    for needle in needles:
        assert needle in str(exc.value)
    assert _wide_state(wide) == before and not list(state_dir.iterdir())


def test_cli_setup_several_queues_on_veth_fails_at_hds_and_changes_nothing(wide, state_dir):
    ifname, ns = wide
    before = _wide_state(wide)
    rc, _, err = run_main("nic", "setup", ifname, "--netns", ns, "--queues", "2-3", "--port",
                          "9000-9003")
    refusal(rc, err, 1, "setup step 'tcp-data-split on' failed: driver veth does not support "
            "tcp-data-split", "nothing had been changed")
    assert _wide_state(wide) == before and not list(state_dir.iterdir())


@pytest.mark.parametrize(("argv", "code", "needles"), [
    (["--queues", "2,3", "--port", "9999"], 2, ("2 queues and 1 port(s)",
                                                "fix: give a port per queue, or --rss-context")),
    (["--queue", "2", "--queues", "3", "--port", "9999"], 2, ("not allowed with",)),
    (["--port", "9999"], 2, ("one of the arguments --queue --queues is required",)),
    (["--queues", "2,2", "--port", "9999"], 2, ("given twice",)),
    (["--queues", "3-2", "--port", "9999"], 2, ("runs backwards",)),
    (["--queue", "2", "--port", "9000-9064"], 2, ("more than 64 ports",)),
])
def test_cli_setup_queue_and_port_lists_refused(wide, state_dir, argv, code, needles):
    ifname, ns = wide
    rc, _, err = run_main("nic", "setup", ifname, "--netns", ns, *argv)
    refusal(rc, err, code, *needles)
    assert not list(state_dir.iterdir())


def test_cli_doctor_several_queues(wide, capsys):
    ifname, ns = wide
    rc = main(["nic", "doctor", ifname, "--netns", ns, "--queues", "1,2", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["queues"] == [1, 2]
    checks = {r["check"]: r for r in doc["results"]}
    assert checks["channels >= 2"]["status"] == "pass"
    assert checks["channels >= 2"]["detail"] == "4 RX channels, queues 1,2 among them"
    assert checks["queues 1,2 free of providers"]["status"] == "pass"
    rc = main(["nic", "doctor", ifname, "--netns", ns, "--queues", "0-3", "--json"])
    checks = {r["check"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert checks["channels >= 2"]["status"] == "fail"   # none left for RSS
    assert checks["channels >= 2"]["detail"] == "4 RX channels, the device offers at most 4"
    rc, _, err = run_main("nic", "doctor", ifname, "--netns", ns, "--queues", "2,5,6")
    refusal(rc, err, 2, "has no RX queues 5,6 (its RX queues: 0..3)", "--queues 3")


def _version_1(doc: dict) -> dict:
    """``doc`` as the one-queue setup wrote it (state version 1): config queue and port, and
    the RSS steps' one queue. The RSS and rule steps veth cannot apply are added pending, as a
    setup interrupted before them leaves them."""
    cfg = doc["config"]
    cfg["queue"], cfg["port"] = cfg.pop("queues")[0], cfg.pop("ports")[0]
    doc["steps"] += [
        {"kind": "rss", "params": {"queue": 1, "count": 2}, "status": "pending", "undo": {}},
        {"kind": "rss-context", "params": {"queue": 1}, "status": "pending", "undo": {}},
        {"kind": "flow-rule", "params": {"flow": "tcp4", "port": 9999, "queue": 1,
                                         "context_step": len(doc["steps"]) + 1},
         "status": "pending", "undo": {}}]
    return dict(doc, version=1)


def test_a_version_1_state_file_is_read_and_restored(lab, state_dir):
    """A state file of the one-queue setup (version 1) is checked and restored as before: its
    queue and port read as one-item lists, the device comes back."""
    before = _state(lab)
    steps = _veth_steps(lab)
    setup.apply(_cfg(lab), steps=steps)
    path = setup.state_path(lab.if_a, lab.ns_a)
    v1 = json.dumps(_version_1(json.loads(path.read_text())))
    # Damage in a version 1 file is refused as in any other, naming the field.
    damaged = json.loads(v1)
    damaged["steps"][-3]["params"]["queue"] = "one"
    path.write_text(json.dumps(damaged))
    with pytest.raises(ZcnetError, match=r"steps\[4\]\.params\.queues is .*not what setup "):
        setup.load_state(lab.if_a, lab.ns_a)
    path.write_text(v1)
    saved = setup.load_state(lab.if_a, lab.ns_a)
    assert saved["version"] == 2 and saved["config"]["queues"] == [1]
    assert [s["params"]["queues"] for s in saved["steps"][-3:-1]] == [[1], [1]]
    cfg = setup.configured(lab.if_a, lab.ns_a)
    assert (cfg.queues, cfg.ports, cfg.rss_context, cfg.flows) == ((1,), (9999,), False,
                                                                   ("tcp4", "tcp6"))
    assert setup.restore(lab.if_a, lab.ns_a) == [s.title for s in reversed(steps)]
    assert _state(lab) == before and setup.configured(lab.if_a, lab.ns_a) is None


def test_arrival_on_veth_is_unknown_and_says_why(lab):
    """veth delivers without a NAPI id: the queue of a connection cannot be told, and the
    error names the connection (the netdevsim VM tests find real queues)."""
    with in_netns(lab.ns_b):
        listener = socket.create_server((lab.addr_b, 0))
    with listener:
        with in_netns(lab.ns_a):
            client = socket.create_connection((lab.addr_b, listener.getsockname()[1]))
        server, _ = listener.accept()
    with client, server:
        client.sendall(b"x" * 4096)
        assert server.recv(4096)
        port, src = server.getsockname()[1], client.getsockname()[1]
        cfg = setup.NicConfig(lab.if_b, (0, 1), port, rss_context=True, netns=lab.ns_b)
        with pytest.raises(Unsupported) as exc:
            arrived_on(server, cfg)
    assert exc.value.message.startswith(f"connection from {lab.addr_a}:{src} to port {port} "
                                        "has no NAPI id")
    assert exc.value.hint == "ask once its first bytes have arrived"
