"""The user's own plain PyTorch training loop (no dpaudit, no DP), whose weights are then brought in
with ``dpaudit import --members``: trains ``model.resnet`` on a random half of ``DATA`` and writes
``OUT/weights.safetensors`` and ``OUT/members.txt`` (the training records' indices into DATA).

    python -m examples.byo_cifar_shaped.train_plain --data data/cifar_shaped --out plain --epochs 5
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch.nn import functional as F

from examples.byo_cifar_shaped.model import resnet


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--kwargs", default="{}", help="JSON kwargs of the factory (as in spec.json)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    X = np.load(a.data / "X.npy", mmap_mode="r")  # streamed batch by batch, as dpaudit does
    y = torch.as_tensor(np.load(a.data / "y.npy"))
    rng = np.random.default_rng(a.seed)
    members = np.sort(rng.permutation(len(y))[: len(y) // 2])
    torch.manual_seed(a.seed)
    model = resnet(**json.loads(a.kwargs)).to(a.device)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    model.train()
    for epoch in range(a.epochs):
        order = rng.permutation(members)
        for s in range(0, len(order), a.batch_size):
            idx = np.sort(order[s : s + a.batch_size])  # sorted: sequential reads from the memory map
            xb = torch.as_tensor(np.asarray(X[idx]), device=a.device)
            loss = F.cross_entropy(model(xb), y[idx].to(a.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch + 1}: last batch loss {loss.item():.3f}")
    a.out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(a.out / "weights.safetensors"))
    (a.out / "members.txt").write_text("record_index\n" + "\n".join(map(str, members.tolist())) + "\n")
    print(f"wrote {a.out}/weights.safetensors and {a.out}/members.txt ({len(members)} members)")


if __name__ == "__main__":
    main()
