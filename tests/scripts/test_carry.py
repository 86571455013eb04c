"""scripts/device/carry.py: files cut into call-sized parts come back whole, in any order of calls, and a
part that changed on the way is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "device" / "carry.py"


def _carry(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, check=False
    )


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    made = []
    for name, size in (("a.whl", 300_000), ("b.gguf", 1_100_000), ("c.txt", 17)):
        path = tmp_path / "in" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(os.urandom(size))
        made.append(path)
    return made


def test_parts_joined_in_any_order_give_back_every_file(files: list[Path], tmp_path: Path) -> None:
    out, stage = tmp_path / "out", tmp_path / "stage"
    split = _carry("split", *files, "--out", out, "--part-mib", 0.5)
    assert split.returncode == 0, split.stderr
    calls = sorted(out.iterdir())
    assert [c.name for c in calls] == ["call1", "call2", "call3"]
    assert all(p.stat().st_size <= 0.5 * 2**20 for c in calls for p in c.glob("bundle.part*"))
    for call, still in ((calls[2], "call1, call2"), (calls[0], "call2"), (calls[0], "call2")):
        landed = _carry("join", call, stage)  # out of order, and one part twice
        assert landed.returncode == 0, landed.stderr
        assert landed.stdout.endswith(f"still to carry: {still}\n")
        assert not (stage / "complete").exists()
    last = _carry("join", calls[1], stage)
    assert last.returncode == 0, last.stderr
    assert (stage / "complete").read_text().split() == [f.name for f in files]
    for f in files:
        assert (stage / "files" / f.name).read_bytes() == f.read_bytes()
    assert not (stage / "parts").exists()


def test_a_part_changed_on_the_way_is_refused(files: list[Path], tmp_path: Path) -> None:
    out, stage = tmp_path / "out", tmp_path / "stage"
    assert _carry("split", *files, "--out", out, "--part-mib", 0.5).returncode == 0
    part = out / "call2" / "bundle.part2"
    data = bytearray(part.read_bytes())
    data[1000] ^= 0xFF
    part.write_bytes(bytes(data))
    landed = _carry("join", out / "call2", stage)
    assert landed.returncode != 0
    assert "does not match its checksum" in landed.stderr
    assert not (stage / "parts" / "bundle.part2").exists()


def test_parts_of_another_bundle_do_not_mix(files: list[Path], tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    assert _carry("split", *files, "--out", tmp_path / "one", "--part-mib", 0.5).returncode == 0
    assert _carry("split", files[0], "--out", tmp_path / "two").returncode == 0
    assert _carry("join", tmp_path / "one" / "call1", stage).returncode == 0
    mixed = _carry("join", tmp_path / "two" / "call1", stage)
    assert mixed.returncode != 0
    assert "another bundle" in mixed.stderr


def test_one_small_file_is_one_part_joined_at_once(files: list[Path], tmp_path: Path) -> None:
    out, stage = tmp_path / "out", tmp_path / "stage"
    assert _carry("split", files[2], "--out", out).returncode == 0
    assert [c.name for c in out.iterdir()] == ["call1"]
    assert _carry("join", out / "call1", stage).returncode == 0
    assert (stage / "files" / "c.txt").read_bytes() == files[2].read_bytes()


def test_two_files_of_one_name_are_refused(files: list[Path], tmp_path: Path) -> None:
    twin = tmp_path / "twin" / files[0].name
    twin.parent.mkdir()
    twin.write_bytes(b"x")
    refused = _carry("split", files[0], twin, "--out", tmp_path / "out")
    assert refused.returncode != 0
    assert "share a name" in refused.stderr
