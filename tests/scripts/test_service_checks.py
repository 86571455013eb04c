"""scripts/device/service_checks.sh on this CPU (DEVICE=cpu): the steps run in order inside the call's
deadline, the ones it leaves no time for are skipped, and what comes back (the summary and the archive of
reports and logs) is written whatever happened. (The whole script, DEADLINE_S=400 and every step run, is the
dry run done before a GPU call: about 80 s here.)"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "device" / "service_checks.sh"
ROOT = SCRIPT.parents[2]


def test_a_short_deadline_skips_the_steps_it_leaves_no_time_for_and_still_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "DEADLINE_S": "45", "PY": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "no-stage"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = (out / "summary.md").read_text()
    sections = summary.split("\n## ")[1:]
    names = [s.split("\n", 1)[0] for s in sections]
    assert names[:3] == ["providers", "demo", "minilm-shaped"]
    assert "open-loop-4000" in names  # every step has its section, run or skipped
    assert "exit 0" in sections[0] and "service imports: ok" in sections[0]
    assert "exit 0" in sections[1]
    skipped = [s for s in sections if "skipped:" in s]
    assert skipped and names.index(skipped[0].split("\n", 1)[0]) >= 2
    assert all("skipped:" in s for s in sections[names.index(skipped[0].split("\n", 1)[0]) :])
    with tarfile.open(out / "checks.tar.gz") as archive:
        members = archive.getnames()
    assert "summary.md" in members
    assert "logs/providers.log" in members and "logs/demo.log" in members
