"""Successive halving vs random search without pruning: best objective and training epochs spent.

Both searches use the same space, the same seed and the random sampler, so they propose the same
configurations; the only difference is that successive halving stops the unpromising ones early.
Trials train the digits MLP on digits upsampled with noise (so an epoch takes a few seconds, long
against the ~2 s it takes a prune decision to stop a trial), validated on the untouched split.

    .venv/bin/python benchmarks/search.py [--trials 12] [--epochs 9] [--parallel 2]

Uses ACE3_BASE_URL/ACE3_API_KEY when set, else starts ``ace3 up`` in a temporary directory.
Goal (issue 5): the same best objective (within 0.5 points of accuracy) with at most a third of
the epochs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import ace3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "digits"))
sys.path.insert(0, str(REPO))

from data import write_digits  # noqa: E402

from benchmarks.stack import service  # noqa: E402

UPSAMPLE = 80


def write_data(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Digits training data repeated UPSAMPLE times with pixel noise; the validation split as is."""
    train_path, val_path = write_digits(directory, seed=seed)
    with np.load(train_path) as arrays:
        inputs, targets = arrays["inputs"], arrays["targets"]
    rng = np.random.default_rng(seed)
    big_inputs = np.concatenate(
        [inputs + rng.normal(0, 0.05, inputs.shape).astype(np.float32) for _ in range(UPSAMPLE)]
    )
    big_targets = np.concatenate([targets] * UPSAMPLE)
    big_path = directory / "digits-train-upsampled.npz"
    np.savez(big_path, inputs=big_inputs, targets=big_targets)
    return big_path, val_path


def run_search(
    client: ace3.Client,
    model: ace3.ModelRef,
    train: ace3.DatasetRef,
    val: ace3.DatasetRef,
    pruner: str,
    args: argparse.Namespace,
) -> dict[str, float]:
    config = ace3.HPConfig(
        search_space={
            "learning_rate": ace3.hp.loguniform(1e-5, 3e-2),
            "weight_decay": ace3.hp.uniform(0.0, 0.1),
            "model.hidden": ace3.hp.choice([16, 64, 128]),
        },
        algorithm="random",
        max_trials=args.trials,
        parallel_trials=args.parallel,
        objective="val_accuracy",
        direction="maximize",
        pruner=pruner,
        reduction_factor=3,
        seed=args.seed,
        base_config=ace3.TrainingConfig(epochs=args.epochs, batch_size=64, seed=0),
    )
    started = time.monotonic()
    best = ace3.hyperparameter_search(
        model=model,
        dataset=train,
        validation_dataset=val,
        config=config,
        client=client,
        name=f"benchmark-{pruner}",
        show_progress=False,
    )
    result = best.result
    return {
        "best": float(result.best_value),
        "epochs": float(result.epochs_run),
        "pruned": float(sum(1 for t in result.trials if t.state == "pruned")),
        "wall_s": time.monotonic() - started,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    env = {
        "ACE3_HEARTBEAT_SECONDS": "1",
        "ACE3_SEARCH_TICK_SECONDS": "0.5",
        "ACE3_WORKER_SLOTS": str(args.parallel),
    }
    with (
        service(env) as (base_url, key),
        ace3.Client(api_key=key, base_url=base_url) as client,
        tempfile.TemporaryDirectory() as tmp,
    ):
        train_path, val_path = write_data(Path(tmp))
        model = client.load_model(REPO / "examples" / "digits" / "model.py")
        train, val = client.load_dataset(train_path), client.load_dataset(val_path)
        rows = {
            pruner: run_search(client, model, train, val, pruner, args)
            for pruner in ("none", "successive_halving")
        }
    plain, halving = rows["none"], rows["successive_halving"]
    print(
        f"{args.trials} trials x {args.epochs} epochs, random sampler seed {args.seed}, "
        f"{args.parallel} at a time, digits x{UPSAMPLE} (1 process per trial)"
    )
    print(
        f"{'search':<22}{'best val_accuracy':>18}{'epochs spent':>14}{'pruned':>8}{'wall (s)':>10}"
    )
    for name, row in (("random, no pruning", plain), ("successive halving", halving)):
        print(
            f"{name:<22}{row['best']:>18.4f}{row['epochs']:>14.0f}{row['pruned']:>8.0f}{row['wall_s']:>10.1f}"
        )
    gap_points = 100 * (plain["best"] - halving["best"])
    ratio = halving["epochs"] / plain["epochs"]
    print(
        f"best objective gap: {gap_points:+.2f} points (goal: within 0.5); "
        f"epochs ratio: {ratio:.2f} (goal: at most 0.33)"
    )
    return 0 if abs(gap_points) <= 0.5 and ratio <= 1 / 3 else 1


if __name__ == "__main__":
    sys.exit(main())
