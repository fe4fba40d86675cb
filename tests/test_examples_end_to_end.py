"""Every example end to end: bash run.sh with its defaults trains to its bar, reports its progress
and its summary, and every process it started ends by itself. Then what a family of examples
shows end to end: a push a window, the chief's evaluation of what it saved, a lost worker.

Each run is the session's one default run of its example (the default_runs fixture): a test of
one example that reads the default run (a push a window, the chief's checkpoint) reads this same
run. The quick tier (python -m pytest -m quick) runs each example briefly instead
(DefaultRuns.SHORT_STEPS mini-batches): everything but the bar is checked, and the model must
have learnt something (the bar's metric better than chance by a margin)."""
import glob
import os
import re

import pytest

from support.checks import (assert_a_killed_worker_does_not_hang_the_others,
                            assert_a_lost_worker_stops_the_rounds, assert_one_push_per_window,
                            assert_the_chief_evaluated_what_it_checkpointed)
from support.examples import ACCURACY_BAR, AUC_BAR, EXAMPLES, declared_jobs, sync_shared
from support.runs import scalars

# the metric each example reports on its test set, its bar with the defaults, and in a short run
BARS = {example: ("test_accuracy", ACCURACY_BAR, 0.5) for example in EXAMPLES}
BARS.update({example: ("test_auc", AUC_BAR, 0.52)
             for example in ("Sparse-Embeddings", "Sparse-Embeddings-TF2")})
PROGRESS = re.compile(r"^\[\w+\] (local_step=\d+ )?global_step=\d+ loss=[\d.]+")


def in_quick_tier(config):
    """The session selects the quick tier (-m quick, alone or with more)."""
    selection = config.getoption("markexpr") or ""
    return re.search(r"(?<!not )\bquick\b", selection) is not None


def the_serving_tasks_end_by_themselves(example, run):
    """The tasks that only serve (a ps, the workers of one client) end once the run is over,
    each saying so: nobody had to be killed."""
    jobs = declared_jobs(example)
    if jobs == ("ps", "worker"):
        assert "[ps0] the run is over; shutting down" in run.output
    elif example in sync_shared.ONE_CLIENT:
        assert "[worker1] the run is over; shutting down" in run.output
    elif "ps" in jobs:  # TensorFlow 2's coordinator: its servers end once it is gone
        for role in ("ps0", "worker0", "worker1"):
            assert any(l.startswith("[%s] localhost:" % role) and l.endswith(
                "is gone; shutting down") for l in run.output.splitlines()), role


@pytest.mark.quick
@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_trains_to_its_bar_and_every_process_ends_by_itself(example, default_runs,
                                                                         request):
    short = in_quick_tier(request.config)
    run = default_runs.short(example) if short else default_runs[example]
    assert run.code == 0, run.output[-3000:]
    assert any(PROGRESS.match(line) for _, line in run.lines), run.output[-3000:]
    # an op built and never run is logged as an error of TensorFlow's at the end, when (and if)
    # the graph is collected: a worker's has_record, the optimizer's readiness check
    assert "Object was never used" not in run.output, run.output[-3000:]
    summary = run.summary()
    metric, bar, short_bar = BARS[example]
    assert float(summary[metric]) >= (short_bar if short else bar), summary
    if declared_jobs(example):  # run.sh started two workers, and lost none of them
        assert summary["workers"] == "2" and summary["lost_workers"] == "0", summary
        assert "[run.sh] all processes finished" in run.output
    the_serving_tasks_end_by_themselves(example, run)
    # the chief wrote checkpoints, and TensorBoard events: the test metric at each progress
    # line and at the end, the last the summary's
    names = os.listdir(run.log_dir)
    # Keras-Fit's checkpoints are BackupAndRestore's, in a folder of their own
    checkpoints = glob.glob(os.path.join(run.log_dir, "**", "checkpoint"), recursive=True)
    assert checkpoints and any(n.startswith("events.out.tfevents") for n in names)
    # (the Sparse-Embeddings examples' AUC ranks the whole test set once, at the end: a summary
    # field; their TensorBoard series is the test accuracy, a click predicted or not)
    tag = "test_accuracy" if metric == "test_auc" else metric
    written = scalars(run.log_dir)[tag]
    assert len(written) >= 2 and written[-1][2] == pytest.approx(float(summary[tag]), abs=1e-4)
    assert written[-1][1] == int(summary["global_step"]), (written[-1], summary)


# --- What a family of examples shows end to end ---------------------------------------------------
@pytest.mark.parametrize("example, window", [("DOWNPOUR", 5), ("ADAG", 5), ("DynSGD", 5),
                                             ("AEASGD", 8), ("EAMSGD", 8)])
def test_each_worker_pushes_once_per_window_of_local_steps(example, window, default_runs):
    # AEASGD's and EAMSGD's push is the elastic exchange; --steps 2000 by default
    assert_one_push_per_window(default_runs[example], window=window, steps=2000)


@pytest.mark.parametrize("example", ["Hogwild", "DOWNPOUR", "ADAG", "DynSGD", "DiLoCo",
                                     "Sync-SGD"])
def test_the_chief_evaluates_the_global_parameters_it_checkpointed(example, default_runs):
    assert_the_chief_evaluated_what_it_checkpointed(default_runs[example], example)


@pytest.mark.parametrize("example", ["EASGD", "AEASGD", "EAMSGD"])
def test_the_chief_evaluates_the_centre_not_its_own_copy(example, run_example):
    # alpha 0: the centre stays at the initial parameters while the workers train alone, so
    # the centre's accuracy and a worker's are far apart
    run = run_example(example, "--alpha", "0", "--steps", "320")
    assert run.code == 0, run.output[-3000:]
    assert assert_the_chief_evaluated_what_it_checkpointed(run, example) < 0.3, run.summary()


# The asynchronous examples' loops never wait for another worker, and the chief's wait for the
# others at the end is the plumbing's, the same in every train.py (test_boilerplate.py): a
# push-and-pull window and an elastic one stand for the others (Distributed-Setup's per-step
# push: test_distributed_setup.py; Evolution-Strategies' generations: its own test)
@pytest.mark.parametrize("example, window", [("DOWNPOUR", 5), ("AEASGD", 8)])
def test_a_worker_killed_mid_run_does_not_hang_the_others(example, window, tmp_path):
    # --steps 3000: the chief pushes on alone to the end
    assert_a_killed_worker_does_not_hang_the_others(example, tmp_path,
                                                    min_global_step=3000 // window)


@pytest.mark.parametrize("example, round_name, steps", [
    ("Sync-SGD", "synchronous step", "100000"), ("Gradient-Compression", "synchronous step",
                                                 "200000"),
    ("EASGD", "round", "200000"), ("DiLoCo", "round", "200000")])
def test_without_backup_workers_a_killed_worker_stops_the_rest_with_a_clear_error(
        example, round_name, steps, tmp_path):
    assert_a_lost_worker_stops_the_rounds(example, tmp_path, round_name, steps=steps)
