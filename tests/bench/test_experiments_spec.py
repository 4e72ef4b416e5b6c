"""Experiment specs: the built-ins load, and a bad spec names the key and the line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from zcnet.bench.spec import (
    SpecError,
    builtin_names,
    builtin_spec,
    builtin_text,
    load_spec,
    parse_spec,
)
from zcnet.cli import main

BUILTINS = ("mlx5-zcrx", "tx-mpwqe", "zcrx-refs")


def test_builtins_are_the_three_seed_experiments() -> None:
    assert builtin_names() == sorted(BUILTINS)
    seeds = {n: builtin_spec(n).seed for n in BUILTINS}
    assert seeds == {"mlx5-zcrx": "000_8a539f0f8e945ac2.txt",
                     "tx-mpwqe": "001_68f9467cbebd7478.txt",
                     "zcrx-refs": "002_1cb6b7127aebb6fb.txt"}


def test_builtin_contents() -> None:
    m = builtin_spec("mlx5-zcrx")
    assert m.tool == "bench"
    assert m.matrix == {"mtu": [1500, 4096, 9000], "engine": ["epoll", "uring", "zcrx"],
                        "placement": ["same"]}
    assert [(s.axis, s.value, s.lab) for s in m.substitutes] == [("engine", "zcrx", "soft-zc")]
    t = builtin_spec("tx-mpwqe")
    assert (t.tool, t.matrix["burst"], t.private_flag, t.baseline) == \
        ("txbench", [32], "skb_tx_mpwqe", {"mode": "single"})
    z = builtin_spec("zcrx-refs")
    assert z.per_cpu and z.matrix["consumer"] == ["same", "thread"]
    assert z.matrix["placement"] == ["same", "split"]


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# (edit old -> new in mlx5-zcrx.toml, the key the error must name, the text on its line)
BAD = [
    ("mtu = [1500, 4096, 9000]", "mtu = [1500, \"big\"]", "matrix.mtu", "mtu = [1500"),
    ("mtu = [1500, 4096, 9000]", "mtu = [1500, 70000]", "matrix.mtu", "mtu = [1500"),
    ('engine = ["epoll", "uring", "zcrx"]', 'engine = ["epoll", "bogus"]', "matrix.engine",
     'engine = ["epoll", "bogus"]'),
    ("duration = 2.0", "duration = -1", "run.duration", "duration = -1"),
    ("repeat = 1", "repeat = 1.5", "run.repeat", "repeat = 1.5"),
    ('peers = ["iperf3"]', 'peers = ["netperf"]', "run.peers", 'peers = ["netperf"]'),
    ('columns = "engine"', 'columns = "colour"', "report.columns", 'columns = "colour"'),
    ('metric = "gbps"', "metric = 3", "report.metric", "metric = 3"),
    ('unless = ["ifname", "zcrx_copy"]', 'unless = ["ifname"]\nsurprise = 1',
     "substitute[0].surprise", "surprise = 1"),
    ('unless = ["ifname", "zcrx_copy"]', 'unless = ["ifname", "nic"]', "substitute[0].unless",
     'unless = ["ifname", "nic"]'),
    ('lab = "soft-zc"', 'lab = "warp-drive"', "substitute[0].lab", 'lab = "warp-drive"'),
    ('title = "Single', 'titel = "Single', "experiment.titel", "titel ="),
    ('placement = ["same"]', 'placement = ["same"]\nflavour = ["x"]', "matrix.flavour",
     "flavour ="),
]


@pytest.mark.parametrize(("old", "new", "key", "line_text"), BAD,
                         ids=[b[2] + ":" + b[1][:20] for b in BAD])
def test_bad_spec_names_key_and_line(old: str, new: str, key: str, line_text: str) -> None:
    text = builtin_text("mlx5-zcrx")
    assert old in text
    bad = text.replace(old, new, 1)
    with pytest.raises(SpecError) as info:
        parse_spec(bad, "my.toml")
    msg = info.value.message
    assert msg.startswith(f"my.toml:{_line(bad, line_text)}: key '{key}': "), msg


def test_missing_required_key_points_at_its_table() -> None:
    text = builtin_text("mlx5-zcrx")
    bad = text.replace('tool = "bench"\n', "")
    with pytest.raises(SpecError) as info:
        parse_spec(bad, "my.toml")
    assert info.value.message.startswith(
        f"my.toml:{_line(bad, '[experiment]')}: key 'experiment.tool': missing")


def test_syntax_error_carries_tomls_line() -> None:
    bad = builtin_text("tx-mpwqe").replace("[run]", "[run")
    with pytest.raises(SpecError) as info:
        parse_spec(bad, "my.toml")
    assert f"line {_line(bad, '[run')}" in info.value.message


def test_keys_inside_multiline_strings_are_not_mistaken() -> None:
    text = builtin_text("mlx5-zcrx").replace('about = """\n',
                                              'about = """\nduration = here is prose\n')
    bad = text.replace("duration = 2.0", "duration = 0")
    with pytest.raises(SpecError) as info:
        parse_spec(bad, "x.toml")
    assert info.value.message.startswith(f"x.toml:{_line(bad, 'duration = 0')}:")


def test_show_round_trips_and_run_loads_a_copy(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "zcrx-refs", "--show"]) == 0
    copy = tmp_path / "mine.toml"
    copy.write_text(capsys.readouterr().out)
    assert load_spec(copy) == dataclasses.replace(builtin_spec("zcrx-refs"), source=str(copy))


def test_cli_lists_experiments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce"]) == 0
    out = capsys.readouterr().out
    for name in BUILTINS:
        assert name in out


def test_cli_bad_spec_is_one_line_error(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(builtin_text("mlx5-zcrx").replace("repeat = 1", "repeat = 0"))
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zcnet: error: {bad}:{_line(bad.read_text(), 'repeat = 0')}: "
                          "key 'run.repeat': must be within 1..10000, got 0")
    assert "Traceback" not in err
    assert main(["reproduce", "no-such-thing"]) == 2
    assert "choose one of: mlx5-zcrx, tx-mpwqe, zcrx-refs" in capsys.readouterr().err


SPEC = """[experiment]
name = "x"
title = "t"
tool = "bench"
[matrix]
engine = ["epoll"]
mtu = [1500]
[report]
rows = "engine"
columns = "mtu"
"""


@pytest.mark.parametrize("subs", ["substitute = [1]", 'substitute = ["epoll"]'])
def test_substitute_entries_must_be_tables(subs: str) -> None:
    with pytest.raises(SpecError, match=r"substitute\[0\]"):
        parse_spec(subs + "\n" + SPEC)
