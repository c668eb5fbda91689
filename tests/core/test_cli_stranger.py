"""A third new-user pass over the CLI: a privacy engineer's own data, checkpoints and numbers at their edges.
Each case was an internal error (exit 3), a wrong option blamed or a silent misreading before."""

from __future__ import annotations

import pytest

from tests.core.cli_errors import one_line_error

SCHEDULE = ["--sample-rate", "0.004", "--steps", "1000", "--delta", "1e-5"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # sigma**2 overflowed in the RDP accountant (OverflowError, exit 3); the float32 noise std in training
        (["account", "dpsgd", "--noise-multiplier", "1e200", *SCHEDULE, "--json"], None),
        (["train", "--model", "logreg", "--algo", "dpsgd", "--noise-multiplier", "1e200", "--out", "never"],
         "error: expected --noise-multiplier × --clip (the noise's standard deviation, 1e+200 × 1) <= 3.403e+38, "
         "the largest float32"),
    ],
)  # fmt: skip
def test_numbers_at_their_edges(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    if message is None:  # accepted: a finite epsilon, not an internal error
        from tests.core.cli_errors import invoke

        r = invoke(*args)
        assert r.exit_code == 0 and '"epsilon": 0.0' in r.stdout, r.output
        return
    assert one_line_error(*args) == message
    assert not (tmp_path / "never").exists()
