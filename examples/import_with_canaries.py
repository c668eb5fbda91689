"""Canaries for a model trained outside dpaudit, end to end: make, insert, train, import, audit.

1. ``dpaudit canaries make --data digits --members members.txt --count 200 --canary-kind mislabeled --out canaries/``
   writes ``canaries/insert.npz`` (the records to add: the included half) and the secret design;
2. your own training on the members plus ``insert.npz`` (here: a small torch MLP, not private);
3. ``dpaudit import model.safetensors --model-spec spec.json --data digits --members members.txt
   --epsilon 1 --delta 1e-5 --canaries canaries/ --out run/`` registers them;
4. ``dpaudit audit checkpoint run/ --attacks none --fail-on-violation``: the formal one-run audit.

The training here is not private, so a claim of ε = 1 is refuted (exit 1): the canaries it memorised
are recognisable. A DP training with the same two extra lines would be audited the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

MODEL_SPEC = {"kind": "mlp", "input_shape": [1, 8, 8], "n_classes": 10, "hidden": [64]}
MEMBERS = 600


def train_own_model(members_X: np.ndarray, members_y: np.ndarray, insert: Path, out: Path, seed: int = 0) -> Path:
    """Your own (non-private) training on the members plus the canaries to insert; saves safetensors."""
    import torch
    from safetensors.torch import save_file

    from dpaudit.models import build_model, model_spec_from_dict

    with np.load(insert, allow_pickle=False) as z:
        X = np.concatenate([members_X, z["X"]]).astype(np.float32)
        y = np.concatenate([members_y, z["y"]]).astype(np.int64)
    torch.manual_seed(seed)
    model = build_model(model_spec_from_dict(MODEL_SPEC), seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    for _ in range(400):  # full batch, until the mislabeled canaries are memorised
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(Xt), yt).backward()
        opt.step()
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(out))
    return out


def run(workdir: Path, invoke) -> dict:
    """The four steps in ``workdir``; ``invoke(args) -> (exit_code, stdout)`` runs a dpaudit command."""
    from dpaudit.data import load_dataset

    workdir.mkdir(parents=True, exist_ok=True)
    ds = load_dataset("digits")
    members = np.random.default_rng(0).choice(len(ds), size=MEMBERS, replace=False)
    (workdir / "members.txt").write_text("\n".join(map(str, members)) + "\n")
    (workdir / "spec.json").write_text(json.dumps(MODEL_SPEC))
    code, _ = invoke(["canaries", "make", "--data", "digits", "--members", str(workdir / "members.txt"),
                      "--count", "200", "--canary-kind", "mislabeled", "--out", str(workdir / "canaries")])  # fmt: skip
    assert code == 0
    X = ds.X[members].reshape(MEMBERS, 1, 8, 8)
    train_own_model(X, ds.y[members], workdir / "canaries" / "insert.npz", workdir / "model.safetensors")
    args = [
        "import",
        str(workdir / "model.safetensors"),
        "--model-spec",
        str(workdir / "spec.json"),
        "--data",
        "digits",
    ]
    args += ["--members", str(workdir / "members.txt"), "--epsilon", "1", "--delta", "1e-5"]
    code, _ = invoke([*args, "--canaries", str(workdir / "canaries"), "--out", str(workdir / "run")])
    assert code == 0
    code, out = invoke(["--json", "audit", "checkpoint", str(workdir / "run"), "--attacks", "none",
                        "--fail-on-violation"])  # fmt: skip
    return {"exit_code": code, **json.loads(out)}
