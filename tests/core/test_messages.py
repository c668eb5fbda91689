"""Bad values and the environment are one line with exit code 2, never exit 3 (issue 30): NaN/inf and
out-of-range mechanism parameters, pickled or special weight files, numbers printed as numbers, and no
advice to use an option the command lacks."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_positive_int
from tests.core.cli_errors import one_line_error


class Payload:
    """An arbitrary object: torch.load(weights_only=True) refuses to unpickle it."""


ACCOUNT = ["--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["account", "dpsgd", "--noise-multiplier", "1e-300", *ACCOUNT], "or >= 1e-06, got 1e-300"),
        (["account", "dpsgd", "--noise-multiplier", "inf", *ACCOUNT], "to be finite, got inf"),
        (["account", "calibrate", "--epsilon", "inf", *ACCOUNT], "to be finite, got inf"),
        (["train", "--algo", "dpsgd", "--epsilon", "1", "--clip", "inf"], "expected --clip to be finite, got inf"),
        (["train", "--algo", "dpsgd", "--epsilon", "inf"], "expected --epsilon to be finite, got inf"),
        (["train", "--algo", "dpsgd", "--epsilon", "1", "--delta", "0.999"], "expected --delta in (0, 0.1], got 0.999"),
        (["train", "--algo", "dpsgd", "--noise-multiplier", "1e-300"], "or >= 1e-06, got 1e-300"),
    ],
)
def test_meaningless_mechanism_values_are_refused(tmp_path, args, message):
    out = ["--out", tmp_path / "run"] if args[0] == "train" else []
    assert message in one_line_error(*args, *out)
    assert not (tmp_path / "run").exists()


def test_numbers_print_as_numbers():
    with pytest.raises(InputError, match=r"^expected delta in \(0, 1\), got 2\.0$"):
        check_in_interval(0.0, 1.0, delta=np.float64(2.0))
    with pytest.raises(InputError, match=r"^expected runs to be an integer, got 2\.5$"):
        check_positive_int(runs=np.float64(2.5))
    assert check_positive_int(runs=np.int64(3)) == 3


@pytest.fixture
def spec_file(tmp_path):
    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"kind": "logreg", "input_shape": [64], "n_classes": 10}))
    return f


def test_a_pickled_pt_gets_our_message_not_torchs_advice(tmp_path, spec_file):
    torch.save({"w": Payload()}, tmp_path / "w.pt")
    with open(tmp_path / "plain.pt", "wb") as f:
        pickle.dump({"a": 1}, f)
    for name in ("w.pt", "plain.pt"):
        line = one_line_error("import", tmp_path / name, "--model-spec", spec_file, "--out", tmp_path / "r")
        assert "dpaudit never does" in line and "weights_only" not in line, line


def test_dev_zero_as_weights_is_one_line(tmp_path, spec_file):
    link = tmp_path / "w.safetensors"
    os.symlink("/dev/zero", link)
    assert "not a regular file" in one_line_error("import", link, "--model-spec", spec_file, "--out", tmp_path / "r")


def test_audit_plan_suggests_no_option_the_cli_lacks():
    line = one_line_error("audit", "plan", "--epsilon", "30")
    assert "max_trials" not in line and "not certifiable" in line
