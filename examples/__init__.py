"""Runnable examples of auditing your own DP training with dpaudit (each module's docstring is its doc).

- :mod:`examples.opacus_pipeline`: an Opacus DP-SGD pipeline as a plug-in trainer for
  ``dpaudit audit train --trainer examples.opacus_pipeline:train``, with a planted bug (σ divided by
  the batch size) that the audit flags as a formal violation.
- :mod:`examples.numpy_dpsgd`: DP-SGD in plain NumPy (closed-form per-example gradients), with two
  planted bugs (σ / B, no clipping).
- ``examples/test_opacus_step.py``: a pytest file to copy: ``dpaudit.testing.assert_dp`` on one
  Opacus noisy step; a correct step passes, the step without noise fails. Not collected by a plain
  ``pytest`` (``testpaths = ["tests"]``); tests/examples runs it.
- ``examples/ci/github-audit.yml``: a GitHub Actions job running the audit on every pull request.

Run from the repository root. Opacus (≤ 1.6) also installs a top-level package named ``examples``;
from the root, this directory comes first on ``sys.path`` (``python -m``, ``python -c``, pytest, and
``dpaudit --trainer``, which imports from the current directory first).
"""
