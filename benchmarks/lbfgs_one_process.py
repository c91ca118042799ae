"""Full-batch L-BFGS in one process: the baseline of the lbfgs suite, as JSON.

    python -m benchmarks.lbfgs_one_process DATA.npz [--iterations 10] [--batch 6000]

The same objective as ``configs/mnist_softmax_lbfgs.toml`` (softmax regression, the mean loss over
the whole training set and its gradient), computed in this one process with all the node's cores,
and SciPy's L-BFGS-B driven by mpi_trainer's own :func:`~mpi_trainer.algorithms.lbfgs.minimize`.
Prints the median seconds per function evaluation, the evaluations, the final loss and the parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--batch", type=int, default=6000)
    args = parser.parse_args()

    from mpi_trainer.launch.runtime import configure_threads

    configure_threads(os.cpu_count() or 1)
    import keras

    from mpi_trainer.algorithms.lbfgs import LbfgsSettings, minimize
    from mpi_trainer.config import load_config
    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.models import build_model
    from mpi_trainer.models.gradients import BlockGradient
    from mpi_trainer.trainer.state import ModelState

    cfg = load_config("configs/mnist_softmax_lbfgs.toml", [f"data.source={args.data}"])
    data = load_dataset(cfg.data, seed=0)
    keras.utils.set_random_seed(0)
    model = build_model(cfg.model, data.input_shape, data.num_outputs, data.classes)
    state = ModelState(model)
    gradient = BlockGradient(model, state.trainable, batch_size=args.batch)
    x, y, n = data.x_train, data.y_train, data.num_train
    spent: list[float] = []

    def evaluate(params):  # noqa: ANN001, ANN202 - the objective minimize() calls
        started = time.perf_counter()
        state.write_trainable(params)
        loss, grad = gradient(x, y)
        spent.append(time.perf_counter() - started)
        return loss / n, grad / n

    outcome = minimize(evaluate, state.read_trainable(), LbfgsSettings(args.iterations))
    print(json.dumps({"per_evaluation": statistics.median(spent), "loss": outcome.loss,
                      "evaluations": outcome.evaluations, "params": gradient.size}))


if __name__ == "__main__":
    main()
