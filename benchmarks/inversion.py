"""Model inversion (MI-FACE) and attribute inference: non-private vs DP-SGD at ε = 8 and ε = 1, same run.

    .venv/bin/python benchmarks/inversion.py                # digits MLP (demo --quick recipes) + breast-cancer logreg
    .venv/bin/python benchmarks/inversion.py --epochs 60 --dp-epochs 20   # the full demo's recipes

Digits: the three models of `dpaudit demo` (MLP, non-private SGD; DP-SGD batch 128, clip 1, σ calibrated
to ε at δ = 1e-5), each inverted for all 10 classes white-box (MI-FACE defaults) and black-box
(4000 queries per class). Breast-cancer: logistic regressions (non-private; DP-SGD at ε = 8 and 1), the
hidden feature "worst perimeter" binarised at its aux median, likelihood and attack-model inference on
members and non-members. The non-private model is the baseline, trained and attacked in the same run.
Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder is sys.path[0] and its attacks.py would shadow the ``attacks`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=25, help="non-private digits MLP epochs (demo --quick: 25)")
    ap.add_argument("--dp-epochs", type=int, default=10, help="DP-SGD digits MLP epochs (demo --quick: 10)")
    ap.add_argument("--budget", type=int, default=4000, help="black-box queries per class")
    ap.add_argument("--feature", default="worst perimeter", help="breast-cancer hidden feature")
    ap.add_argument("--grid-dir", type=Path, default=None, help="write each digits model's white-box PNG grid here")
    args = ap.parse_args()

    from attacks.attribute import run_attribute
    from attacks.inversion import MIFace, member_class_means, run_inversion, save_grid
    from dpaudit.checkpoint import load_run
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.training.run import train_run

    def dp(eps: float, lr: float, epochs: int, batch: int) -> TrainConfig:
        return TrainConfig(algo="dpsgd", epochs=epochs, batch_size=batch, lr=lr, seed=0,
                           dp=DPConfig(clip=1.0, target_epsilon=eps, delta=1e-5))  # fmt: skip

    digits_models = [
        ("non-private", TrainConfig(algo="sgd", epochs=args.epochs, batch_size=32, lr=0.1, seed=0)),
        ("dp-sgd ε=8", dp(8.0, 1.0, args.dp_epochs, 128)),  # demo.py's recipes
        ("dp-sgd ε=1", dp(1.0, 0.25, args.dp_epochs, 128)),
    ]
    bc_models = [
        ("non-private", TrainConfig(algo="sgd", epochs=40, batch_size=16, lr=0.2, seed=0)),
        ("dp-sgd ε=8", dp(8.0, 1.0, 30, 32)),
        ("dp-sgd ε=1", dp(1.0, 0.5, 30, 32)),
    ]
    with tempfile.TemporaryDirectory(prefix="dpaudit-bench-inv-") as tmp:
        ds = load_dataset("digits")
        spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
        print("### Model inversion, digits MLP (10 classes; MSE/SSIM in box units vs the members' class mean)\n")
        print(
            "| model | test acc | train s | mode | identification | nearest own mean | mean MSE (members / non-members / other classes) | mean SSIM (members / non-members) | mean f_label | queries/class | attack s |"  # noqa: E501
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, cfg in digits_models:
            out = Path(tmp) / f"digits-{name}"
            t = time.perf_counter()
            meta = train_run(ds, spec, cfg, out=out)
            train_s = time.perf_counter() - t
            run = load_run(out)
            for mode in ("white-box", "black-box"):
                bb = mode == "black-box"
                t = time.perf_counter()
                r = run_inversion(run, attack=MIFace(black_box=bb, budget=args.budget if bb else None, seed=0))
                attack_s = time.perf_counter() - t
                d = r.to_dict(include_inversions=False)
                pc = d["per_class"]
                other = sum(c["mse_other"] for c in pc) / len(pc)
                conf = sum(c["confidence"] for c in pc) / len(pc)
                queries = sum(c["queries"] for c in pc) / len(pc)
                print(f"| {name} | {meta['metrics']['test_accuracy']:.3f} | {train_s:.0f} | {mode} | "
                      f"{d['identification_accuracy']:.1f} | {d['nearest_mean_accuracy']:.1f} | "
                      f"{d['mean_mse']:.4f} / {d['mean_mse_nonmembers']:.4f} / {other:.4f} | "
                      f"{d['mean_ssim']:.3f} / {d['mean_ssim_nonmembers']:.3f} | {conf:.3f} | {queries:.0f} | "
                      f"{attack_s:.1f} |")  # fmt: skip
                if not bb and args.grid_dir is not None:
                    args.grid_dir.mkdir(parents=True, exist_ok=True)
                    grid = args.grid_dir / f"inversion-{name.replace(' ', '').replace('=', '').replace('ε', 'eps')}.png"
                    save_grid(r, grid, member_means=member_class_means(run), force=True)
        print(f"\n### Attribute inference, breast-cancer logreg, hidden {args.feature!r} binarised at its aux median\n")
        print(
            "| model | test acc | method | members acc (baseline) | members adv | non-members acc (baseline) | non-members adv | leakage |"  # noqa: E501
        )
        print("|---|---|---|---|---|---|---|---|")
        bc = load_dataset("breast-cancer")
        bspec = default_spec("logreg", input_shape=bc.feature_shape, n_classes=bc.n_classes)
        for name, cfg in bc_models:
            out = Path(tmp) / f"bc-{name}"
            meta = train_run(bc, bspec, cfg, out=out)
            run = load_run(out)
            for bb in (False, True):
                d = run_attribute(run, args.feature, black_box=bb, seed=0).to_dict()
                m, n = d["members"], d["nonmembers"]
                print(f"| {name} | {meta['metrics']['test_accuracy']:.3f} | {d['method']} | "
                      f"{m['accuracy']:.3f} ({m['baseline_accuracy']:.3f}) | {m['advantage']:+.3f} | "
                      f"{n['accuracy']:.3f} ({n['baseline_accuracy']:.3f}) | {n['advantage']:+.3f} | "
                      f"{d['leakage']:+.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
