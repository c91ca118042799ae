"""Plain Keras on one process, the baseline the throughput and scaling suites compare against.

    python -m benchmarks.plain_keras --epochs 6 [--model mlp] [--threads 0]

Builds the same model on the same data as ``configs/quickstart.toml`` (mpi_trainer's own loaders,
so both sides see identical arrays), calls ``model.fit`` with ``validation_data`` = the test split
(scored every epoch, as a round is), and prints one JSON line of figures.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


class EpochClock:
    """Seconds of each epoch, its scoring included (what a round's wall time is compared with)."""

    def __init__(self) -> None:
        import keras

        self.seconds: list[float] = []
        clock = self

        class Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                clock.started = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                clock.seconds.append(time.perf_counter() - clock.started)

        self.callback = Callback()


def measure(epochs: int, model_name: str, threads: int) -> dict[str, float]:
    import keras

    from mpi_trainer.config import load_config
    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.launch.runtime import configure_threads
    from mpi_trainer.models import build_model

    if threads:
        configure_threads(threads)
    cfg = load_config("configs/quickstart.toml", [f"model.name={model_name}"])
    data = load_dataset(cfg.data, cfg.train.seed)
    keras.utils.set_random_seed(cfg.train.seed)
    model, _ = build_model(cfg.model, data.input_shape, data.num_outputs, data.classes)
    clock = EpochClock()
    history = model.fit(data.x_train, data.y_train, batch_size=cfg.train.batch_size, epochs=epochs, verbose=0,
                        validation_data=(data.x_test, data.y_test), callbacks=[clock.callback])
    steady = clock.seconds[1:] or clock.seconds
    per_epoch = sum(steady) / len(steady)
    return {"samples_per_second": len(data.x_train) / per_epoch, "seconds_per_epoch": per_epoch,
            "final_test_accuracy": float(history.history.get("val_accuracy", [float("nan")])[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--threads", type=int, default=0, help="0 = the backend's default pools")
    args = parser.parse_args()
    print(json.dumps(measure(args.epochs, args.model, args.threads)))


if __name__ == "__main__":
    main()
