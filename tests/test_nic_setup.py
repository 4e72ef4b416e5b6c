"""`setup` is a transaction on a real veth: a failure at any step, Ctrl-C, or a killed process
leaves (or lets `restore` bring back) the device exactly as it was; and the CLI around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from refusals import refusal, run_main
from zcnet.bench.spec import builtin_text
from zcnet.cli import main
from zcnet.errors import ZcnetError
from zcnet.lab import Lab
from zcnet.nic import ethtool, info, setup
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
    with pytest.raises(ZcnetError, match="already set up"):
        setup.apply(_cfg(lab), steps=_veth_steps(lab))
    setup.restore(lab.if_a, lab.ns_a)
    assert _state(lab) == before
    with pytest.raises(ZcnetError, match="nothing to restore"):
        setup.restore(lab.if_a, lab.ns_a)


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
        "version 2": edit(lambda d: d.update(version=2)),
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
