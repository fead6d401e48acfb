"""The demo: train a digits classifier on ACE3 through the SDK, with 2 processes.

Needs a running ACE3 (``ace3 up``) and ACE3_API_KEY / ACE3_BASE_URL in the environment;
``make demo`` does all of that.
"""

import sys
import tempfile
import time
from pathlib import Path

from data import write_digits

import ace3

HERE = Path(__file__).resolve().parent


def main() -> int:
    client = ace3.Client()
    with tempfile.TemporaryDirectory() as tmp:
        train_path, val_path = write_digits(Path(tmp))
        model = client.load_model(HERE / "model.py")
        train_data = client.load_dataset(train_path)
        val_data = client.load_dataset(val_path)

    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=64, learning_rate=3e-3, weight_decay=0.01, seed=0
    )
    trainer = ace3.DistributedTrainer(config)
    started = time.monotonic()
    result = trainer.train(
        model=model, train_dataset=train_data, validation_dataset=val_data, epochs=15
    )
    elapsed = time.monotonic() - started

    accuracy = result.best_val_accuracy
    if accuracy is None:
        print(f"job {result.job_id} reported no validation accuracy", file=sys.stderr)
        return 1
    print(
        f"job {result.job_id}: final validation accuracy "
        f"{result.final_metrics.get('val_accuracy', float('nan')):.4f}, best {accuracy:.4f}, "
        f"trained in {elapsed:.1f} s"
    )
    if result.checkpoints:
        print(f"checkpoints: {', '.join(c.name for c in result.checkpoints)}")
    if accuracy < 0.90:
        print("validation accuracy is below 0.90", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
