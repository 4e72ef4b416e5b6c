"""Issue 33: files the CLI reads (a spec, a token) that are not what they should be: another
encoding, binary garbage, a huge file, a device or a FIFO that never ends, a directory. Each
is one error line naming the file and the fix, in bounded memory and time, with nothing left
open."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from refusals import refusal, run_main, run_zcnet
from zcnet.bench.spec import MAX_CELLS, MAX_SPEC, builtin_text

HUGE = 16 << 30   # a sparse file: reading it whole would take seconds and 16 GiB


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """One hostile file of each kind, by name."""
    made = {"latin-1": tmp_path / "latin1.toml", "binary": tmp_path / "binary.toml",
            "utf-16": tmp_path / "utf16.toml",
            "huge": tmp_path / "huge.toml", "fifo": tmp_path / "fifo",
            "directory": tmp_path / "dir", "device": Path("/dev/zero"),
            "missing": tmp_path / "nothing-here.toml", "deep": tmp_path / "deep.toml"}
    made["latin-1"].write_bytes('[experiment]\ntitle = "café"\n'.encode("latin-1"))
    made["binary"].write_bytes(bytes(range(128, 256)) * 16)
    made["utf-16"].write_text('[experiment]\nname = "x"\n', encoding="utf-16")
    with open(made["huge"], "wb") as f:
        f.truncate(HUGE)
    os.mkfifo(made["fifo"])
    made["directory"].mkdir()
    made["deep"].write_text("a = " + "[" * 50_000 + "]" * 50_000 + "\n")
    return made


SPEC_REFUSALS = {
    "latin-1": "is not UTF-8 text (byte 0xe9 at line 2, column 13)",
    "binary": "is not UTF-8 text (byte 0x80 at line 1, column 1)",
    "utf-16": "is UTF-16 text, not UTF-8",
    "huge": "is larger than 1 MiB",
    "fifo": "is a FIFO, not a regular file",
    "directory": "is a directory, not a regular file",
    "device": "is a character device, not a regular file",
    "missing": "No such file or directory",
    "deep": "nested too deeply",
}


@pytest.mark.parametrize("kind", sorted(SPEC_REFUSALS))
def test_run_refuses_a_hostile_spec(files: dict[str, Path], kind: str) -> None:
    """A subprocess: the FIFO and the device would hang a reader that trusted them."""
    r = run_zcnet("run", str(files[kind]), timeout=60)
    line = refusal(r.returncode, r.stderr, 2, files[kind], SPEC_REFUSALS[kind])
    assert "spec" in line or kind == "deep"
    assert "zcnet: fix:" in r.stderr


def test_hostile_spec_in_process_leaks_nothing(files: dict[str, Path], no_leaks: None) -> None:
    for kind in ("latin-1", "binary", "utf-16", "huge", "directory", "deep", "missing"):
        rc, _, err = run_main("run", str(files[kind]))
        refusal(rc, err, 2, files[kind], SPEC_REFUSALS[kind])


def test_a_huge_spec_is_refused_in_bounded_memory(files: dict[str, Path]) -> None:
    tracemalloc.start()
    try:
        rc, _, err = run_main("run", str(files["huge"]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    refusal(rc, err, 2, "larger than 1 MiB")
    assert peak < 4 * MAX_SPEC, peak


def test_a_spec_at_the_size_limit_is_read(tmp_path: Path) -> None:
    """The bound refuses what is beyond it, not a spec padded with comments up to it."""
    text = builtin_text("tx-mpwqe").replace('name = "tx-mpwqe"', 'name = "padded"')
    text = text.replace("duration = 1.0", "duration = nan")   # so that nothing runs
    spec = tmp_path / "padded.toml"
    spec.write_text(text + "#" * (MAX_SPEC - len(text.encode()) - 1) + "\n")
    assert spec.stat().st_size == MAX_SPEC
    rc, _, err = run_main("run", str(spec))
    refusal(rc, err, 2, "run.duration")   # parsed, then refused for its content


def test_a_matrix_too_large_to_run_is_refused_before_planning(tmp_path: Path) -> None:
    """A few hundred KiB of spec can ask for 400 million cells: planning them took 9 GB in a
    minute (and went on). The product of the axes is checked first."""
    text = builtin_text("tx-mpwqe")
    text = text.replace("payload = [64]", f"payload = {list(range(1, 20_001))}")
    text = text.replace("burst = [32]", f"burst = {list(range(1, 5_001))}")
    spec = tmp_path / "big.toml"
    spec.write_text(text)
    tracemalloc.start()
    try:
        rc, _, err = run_main("run", str(spec), "--out", str(tmp_path / "out"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    refusal(rc, err, 2, spec, "400000000 cells (4 mode x 20000 payload x 5000 burst); at most "
            f"{MAX_CELLS}", "fewer values")
    assert peak < 64 << 20, peak
    assert not (tmp_path / "out").exists()


# --- token files ----------------------------------------------------------------------------


@pytest.fixture
def tokens(files: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    made = {k: files[k] for k in ("fifo", "directory", "device", "missing")}
    for name, body, mode in (("empty", b"", 0o600), ("readable", b"s3cret-s3cret\n", 0o644),
                             ("huge", None, 0o600)):
        path = tmp_path / f"token-{name}"
        if body is None:
            with open(path, "wb") as f:
                f.truncate(HUGE)
        else:
            path.write_bytes(body)
        path.chmod(mode)
        made[name] = path
    return made


TOKEN_REFUSALS = {
    "fifo": ("is a FIFO, not a regular file", "first line is the secret"),
    "directory": ("is a directory, not a regular file", "first line is the secret"),
    "device": ("is a character device, not a regular file", "first line is the secret"),
    "missing": ("No such file or directory", "head -c 32 /dev/urandom"),
    "empty": ("is shorter than 8 bytes", "head -c 32 /dev/urandom"),
    "readable": ("is accessible to other users (mode 0644)", "chmod 600"),
    "huge": ("is larger than 4 KiB", "first line is the secret"),
}


@pytest.mark.parametrize("kind", sorted(TOKEN_REFUSALS))
def test_server_refuses_an_unusable_token_file(tokens: dict[str, Path], kind: str) -> None:
    r = run_zcnet("server", "--listen", "127.0.0.1:0", "--token-file", str(tokens[kind]),
                  timeout=60)
    problem, fix = TOKEN_REFUSALS[kind]
    refusal(r.returncode, r.stderr, 2, tokens[kind], problem, fix)
    assert "listening" not in r.stdout


@pytest.mark.parametrize("kind", ["directory", "empty", "huge", "readable"])
def test_client_refuses_an_unusable_token_file(tokens: dict[str, Path], kind: str,
                                               no_leaks: None) -> None:
    rc, _, err = run_main("client", "-t", "1", "--token-file", str(tokens[kind]))
    refusal(rc, err, 2, tokens[kind], TOKEN_REFUSALS[kind][0])


def test_token_on_endless_stdin_is_refused_in_bounded_time() -> None:
    with open("/dev/zero", "rb") as zero:
        r = run_zcnet("server", "--listen", "127.0.0.1:0", "--token-file", "-", stdin=zero,
                      timeout=60)
    refusal(r.returncode, r.stderr, 2, "token on stdin is longer than 4096 bytes")


@pytest.mark.parametrize("make", ["directory", "file-parent"])
def test_default_token_path_that_cannot_be_used(tmp_path: Path, make: str) -> None:
    """Without --token-file the server uses $XDG_CONFIG_HOME/zcnet/token; something else in
    its place, or a file where the directory should be, is named with the way out."""
    if make == "directory":
        (tmp_path / "zcnet" / "token").mkdir(parents=True)
        (tmp_path / "zcnet").chmod(0o700)
        config, needles, code = tmp_path, ("is a directory", "remove"), 2
    else:
        (tmp_path / "plain").write_text("")
        config, needles, code = tmp_path / "plain", ("is not a directory", "XDG_CONFIG_HOME"), 1
    env = dict(os.environ, XDG_CONFIG_HOME=str(config))
    for argv in (("server", "--listen", "127.0.0.1:0"), ("client", "-t", "1")):
        r = run_zcnet(*argv, env=env)
        if make == "file-parent" and argv[0] == "client":   # the client creates nothing
            refusal(r.returncode, r.stderr, 2, "plain is not a directory", "XDG_CONFIG_HOME")
            continue
        refusal(r.returncode, r.stderr, code, *needles)
    if make == "directory":   # refused, not replaced
        assert (tmp_path / "zcnet" / "token").is_dir()
