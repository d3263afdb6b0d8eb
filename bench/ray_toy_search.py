"""The anchor of bench/toy_search.py: the same toy search under Ray Tune, on this machine.

Issue 11 set det's toy-search goal from Ray Tune's figure with actor reuse (5.8 s), measured
on an earlier machine; this runs that search here, so the two are compared on one machine
and in the same minutes. The objective and the search match toy_search/train.py and
toy_search.py's config: hyperparameters x, y uniform in [-1, 1], loss
(x - 0.3)^2 + 1/sqrt(step) + 0.1 y^2 reported at each step, 200 trials, 16 at once (one
logical CPU each), ASHA (Ray's ``ASHAScheduler``: rungs at 1, 3, 9 and 27 steps, reduction
factor 3; one bracket, where det's adaptive ASHA spreads its trials over several). Printed:
the seconds of ``Tuner.fit`` and of the whole run (``ray.init`` included), the trials, and
the CPU seconds of this process and of its descendants (Ray's raylet, GCS and workers).
Figures only.

Ray is not one of det's dependencies: run this under an environment that has it, e.g.

    python3 -m venv /tmp/rayvenv && /tmp/rayvenv/bin/pip install "ray[tune]" psutil
    /tmp/rayvenv/bin/python bench/ray_toy_search.py [--trials 200] [--concurrent 16]
                                                    [--no-reuse-actors] [--class-api]
"""

import argparse
import math
import os
import tempfile
import time

import psutil
import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler

STEPS = 27


def objective(config: dict) -> None:
    """The toy trial: one report a step, as toy_search/train.py reports a training row."""
    for step in range(1, STEPS + 1):
        loss = (config["x"] - 0.3) ** 2 + 1.0 / math.sqrt(step) + 0.1 * config["y"] ** 2
        tune.report({"loss": loss, "step": step})


class ToyTrainable(tune.Trainable):
    """The same trial as a class trainable: one ``step`` a report, ``reset_config`` so a
    reused actor takes its next trial without a restart (Ray's fastest path)."""

    def setup(self, config: dict) -> None:
        self.x, self.y, self.n = config["x"], config["y"], 0

    def step(self) -> dict:
        self.n += 1
        return {"loss": (self.x - 0.3) ** 2 + 1.0 / math.sqrt(self.n) + 0.1 * self.y ** 2}

    def reset_config(self, new_config: dict) -> bool:
        self.setup(new_config)
        return True


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of ``proc``'s live descendants (Ray's daemons and workers)."""
    total = 0.0
    for child in proc.children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--no-reuse-actors", dest="reuse", action="store_false")
    ap.add_argument("--class-api", action="store_true",
                    help="a tune.Trainable class instead of a function")
    args = ap.parse_args()

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as storage:
        ray.init(num_cpus=args.concurrent, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=STEPS,
                                  grace_period=1, reduction_factor=3)
        tuner = tune.Tuner(
            tune.with_resources(ToyTrainable if args.class_api else objective, {"cpu": 1}),
            param_space={"x": tune.uniform(-1.0, 1.0), "y": tune.uniform(-1.0, 1.0)},
            tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=args.trials,
                                        max_concurrent_trials=args.concurrent,
                                        scheduler=scheduler, reuse_actors=args.reuse),
            run_config=tune.RunConfig(storage_path=storage, verbose=0))
        fit_start = time.perf_counter()
        results = tuner.fit()
        fit = time.perf_counter() - fit_start
        me = psutil.Process()
        children = tree_cpu(me)
        ray.shutdown()
    whole = time.perf_counter() - start
    own = sum(os.times()[:2])
    steps = sum(r.metrics.get("training_iteration", 0) for r in results)
    print(f"Ray {ray.__version__} toy search: {len(results)} trials, {steps} steps, "
          f"reuse_actors={args.reuse}, {'class' if args.class_api else 'function'} "
          f"trainable, {args.concurrent} at once")
    print(f"  Tuner.fit {fit:.1f} s; with ray.init and shutdown {whole:.1f} s")
    print(f"  CPU seconds: this process {own:.1f}, Ray's processes {children:.1f} "
          "(read before shutdown)")


if __name__ == "__main__":
    main()
