"""examples/byo_cifar_shaped/run.sh at a small size (2,000 records of 3 x 16 x 16): the user's own
residual CNN with GroupNorm, by factory, on a memory-mapped directory of .npy files, trained with DP-SGD
by dpaudit and by a plain torch loop (imported with its members), attacked with loss and LiRA (4
reference models through the same factory), audited and reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 72-87 s: the whole script; its pieces have fast tests (tests/core/test_byo.py)
def test_run_sh_small(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHON": sys.executable,
        "WORK": str(tmp_path),
        "N": "2000",
        "SIZE": "16",
        "WIDTHS": "4,8",
        "EPOCHS": "1",
        "OMP_NUM_THREADS": "1",
    }
    script = ROOT / "examples" / "byo_cifar_shaped" / "run.sh"
    r = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    dp = json.loads((tmp_path / "dp" / "checkpoint.json").read_text())
    assert dp["model"]["kind"] == "python" and dp["model"]["factory"] == "examples.byo_cifar_shaped.model:resnet"
    assert dp["data"]["memory_mapped"] is True and dp["data"]["feature_shape"] == [3, 16, 16]
    assert dp["privacy"]["epsilon"] <= 4
    plain = json.loads((tmp_path / "plain_run" / "checkpoint.json").read_text())
    assert plain["import"]["members"] == "user" and plain["model"] == {**dp["model"]}
    for report in ("report_dp", "report_plain"):
        entry = json.loads((tmp_path / report / "report.json").read_text())["models"][0]
        assert [a["attack"] for a in entry["attacks"]["membership"]] == ["loss", "lira"]
    assert r.stdout.count("lira ") >= 2  # the LiRA rows of both attack tables
