"""benchmarks/compare.py: the examples it runs (every one by default), one table and two plots,
nothing left running; over a network (compare.py --bandwidth, benchmarks/bandwidth.py) and the
window sweep (benchmarks/window_sweep.py): their tables, ranks, plots and refusals."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support.examples import EXAMPLES, ROOT
from support.namespaces import assert_runs_left_nothing, namespaces_of_runs, needs_namespaces
from support.processes import assert_nothing_left, interruptible
from support.runs import read_until

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_compare_quick_writes_a_table_and_plots_of_the_examples_it_ran(tmp_path):
    # two real runs (the baseline always runs); every example gets the same flags from
    # example_runs.run_example, which each example's end-to-end test takes too
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"),
                           "--quick", "--examples", "DOWNPOUR", "--out", str(out)],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "[1/2]" in proc.stderr and "[2/2]" in proc.stderr  # progress: which run, how many
    table = (out / "results.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| example")]
    assert rows == ["Non-Distributed-Setup", "DOWNPOUR"], table
    for name in ("accuracy.png", "scaling.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10000, name
    # each run's metrics, read from the chief's summary line and its TensorBoard events: an
    # evaluation every 20 of the chief's steps and the end's, on a clock that moves forward
    metrics = json.loads((out / "logs" / "DOWNPOUR-w2-r0.json").read_text())
    history = metrics["history"]
    assert len(history) >= 3 and history[-1][1] == metrics["global_step"], history
    assert history[-1][2] == pytest.approx(metrics["test_accuracy"], abs=1e-5)
    seconds = [row[0] for row in history]
    assert 0 < seconds[0] and seconds == sorted(seconds), history
    assert_nothing_left(str(tmp_path))


def test_compare_runs_every_example_on_the_digits_by_default_the_baseline_first():
    # all but those with a problem of their own (Sparse-Embeddings)
    names = example_runs.select_examples("")
    assert names[0] == "Non-Distributed-Setup" and len(set(names)) == len(names)
    assert set(names) == {e for e in EXAMPLES if example_runs.on_the_digits(e)}
    assert "Sparse-Embeddings" not in names and "DOWNPOUR" in names


def test_compare_names_the_failed_example_and_its_log(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"),
                           "--quick", "--out", str(out), "--batch_size", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "compare: Non-Distributed-Setup with 1 worker(s) failed" in proc.stderr
    logs = os.path.join(str(out), "logs", "Non-Distributed-Setup-w1-r0")
    # a failed run runs once more (a rare transient can end one), its first log kept
    assert proc.stderr.count("running it once more") == 1 and os.path.isfile(logs + "-failed.log")
    assert proc.stderr.strip().splitlines()[-1].endswith("see %s.log" % logs), proc.stderr
    assert_nothing_left(str(tmp_path))


# ==================================================================================================
# The network axis (bandwidth.py, behind compare.py --bandwidth) and the window sweep: their
# tables, ranks and plots from given metrics, and their refusals, without training
# ==================================================================================================
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bandwidth  # noqa: E402  (benchmarks/ is not a package)
import command_line  # noqa: E402
import compare  # noqa: E402
import decision_table  # noqa: E402
import example_runs  # noqa: E402
import ps_sweep  # noqa: E402
import scaling  # noqa: E402
import window_sweep  # noqa: E402


def fake_metrics(rate, reach=None, accuracy=0.97, workers=2, global_step=600, fraction=None,
                 kb=20.0):
    """A chief's metrics as example_runs.metrics_of reads them: rate mini-batches/s, 0.95 first
    reached at reach s."""
    history = [[1.0, 100, 0.90], [2.0, 200, 0.93]]
    if reach is not None:
        history.append([reach, 300, 0.96])
    metrics = {"test_accuracy": accuracy, "steps_per_sec": rate, "workers": workers,
               "global_step": global_step, "history": history}
    if fraction is not None or kb is not None:
        metrics["cluster"] = {"bytes_per_mini_batch": kb * 1e3}
        if fraction is not None:
            metrics["cluster"]["fraction_of_bound"] = fraction
    return metrics


RATES = [("unlimited", None), ("100mbit", 10 ** 8), ("20mbit", 2 * 10 ** 7)]
SETTINGS = dict(command="sudo python benchmarks/compare.py --bandwidth unlimited,100mbit,20mbit",
                workers=2, steps=3000, batch_size=64)


def bandwidth_results():
    """Three examples at RATES: (mini-batches/s, seconds to 0.95, fraction of the bound) each.
    At 20 Mbit/s B and C reach 0.95 at the same time, A never; C is the fastest."""
    def example(kb, *by_rate):
        return {label: fake_metrics(rate, reach, fraction=fraction, kb=kb)
                for (label, _), (rate, reach, fraction) in zip(RATES, by_rate)}
    return {"A": example(84.0, (900, 3.0, None), (500, 4.0, 0.5), (50, None, 0.91)),
            "B": example(17.0, (600, 2.0, None), (590, 2.0, 0.2), (250, 6.0, 0.7)),
            "C": example(11.0, (700, 2.5, None), (650, 2.5, 0.3), (300, 6.0, 0.85))}


def test_rates_are_read_fastest_first_each_once_and_a_bad_one_is_named():
    assert command_line.parse_rates("20mbit,unlimited, 1gbit,100mbit,20mbit") == [
        ("unlimited", None), ("1gbit", 10 ** 9), ("100mbit", 10 ** 8), ("20mbit", 2 * 10 ** 7)]
    with pytest.raises(ValueError, match=r"--bandwidth: '20mbps' is not a rate"):
        command_line.parse_rates("unlimited,20mbps")
    with pytest.raises(ValueError, match="at least one rate"):
        command_line.parse_rates(" , ")


def test_ranks_share_ties_and_an_example_that_never_reached_the_bar_has_none():
    times = {"a": 1.0, "b": 2.0, "c": 2.0, "d": None, "e": 3.0}
    assert bandwidth.rank(times, higher_is_better=False) == {"a": 1, "b": 2, "c": 2, "d": None,
                                                            "e": 4}
    speeds = {"a": 10.0, "b": 30.0, "c": 20.0}
    assert bandwidth.rank(speeds, higher_is_better=True) == {"a": 3, "b": 1, "c": 2}


def table_rows(text):
    """{first cell: [cells]} of a markdown table's body rows."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| example")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_the_bandwidth_table_ranks_the_examples_at_the_slowest_rate(tmp_path):
    path = tmp_path / "bandwidth.md"
    baseline = fake_metrics(2000, 0.4, workers=1, kb=None)
    text = bandwidth.write_table(str(path), bandwidth_results(), baseline, RATES, SETTINGS)
    assert path.read_text() == text + "\n"
    lines = text.splitlines()
    assert lines[0] == ("| example | mini-batches/s, unlimited | mini-batches/s, 100 Mbit/s "
                        "| mini-batches/s, 20 Mbit/s | kB per mini-batch | fraction of the "
                        "bound, 20 Mbit/s | seconds to 0.95, 20 Mbit/s | rank by time to 0.95, "
                        "20 Mbit/s | rank by mini-batches/s, 20 Mbit/s |")
    rows = table_rows(text)
    # the baseline first, as the reference; then by time to 0.95 (a tie by mini-batches/s),
    # and the one that never reached it last
    assert list(rows) == ["Non-Distributed-Setup (one process)", "C", "B", "A"]
    assert rows["Non-Distributed-Setup (one process)"] == [
        "2000", "2000", "2000", "none", "n/a", "0.4", "reference", "reference"]
    assert rows["C"] == ["700", "650", "300", "11.0", "0.85", "6.0", "1", "1"]
    assert rows["B"] == ["600", "590", "250", "17.0", "0.70", "6.0", "1", "2"]
    assert rows["A"] == ["900", "500", "50.0", "84.0", "0.91", "not reached", "-", "3"]
    assert lines[-1] == (
        "`sudo python benchmarks/compare.py --bandwidth unlimited,100mbit,20mbit`: 2 workers "
        "(and 1 ps where the example has one, and ParameterServerStrategy's coordinator), 3000 "
        "mini-batches of 64 examples each, every task a host of its own on one machine with %d "
        "CPU core(s)." % os.cpu_count())


def test_bytes_per_mini_batch_is_the_median_over_the_rates(tmp_path):
    results = bandwidth_results()
    results["B"]["unlimited"]["cluster"]["bytes_per_mini_batch"] = 16e3
    results["B"]["100mbit"]["cluster"]["bytes_per_mini_batch"] = 99e3
    text = bandwidth.write_table(str(tmp_path / "b.md"), results, fake_metrics(2000, 0.4),
                                 RATES, SETTINGS)
    assert table_rows(text)["B"][3] == "17.0"  # the median of 16, 99 and 17 kB


def test_unlimited_sits_a_decade_beyond_the_fastest_limited_rate_on_the_plot():
    assert bandwidth.plot_positions(RATES) == [10 ** 9, 10 ** 8, 2 * 10 ** 7]
    assert bandwidth.plot_positions([("unlimited", None)]) == [10 ** 10]


def test_the_bandwidth_plots_are_drawn_from_the_metrics(tmp_path):
    baseline = fake_metrics(2000, 0.4, workers=1, kb=None)
    for name, draw in (("bandwidth.png", lambda p: bandwidth.plot_bandwidth(
            p, bandwidth_results(), baseline, RATES)), ("slow.png", lambda p: (
            bandwidth.plot_accuracy(p, bandwidth_results(), baseline, RATES[-1])))):
        draw(str(tmp_path / name))
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10000, name


def test_the_window_sweep_table_has_a_row_per_example_and_window(tmp_path):
    results = {"DOWNPOUR": {1: fake_metrics(100, 5.0, workers=4, global_step=3000, kb=None),
                            32: fake_metrics(400, None, 0.81, workers=4, global_step=94,
                                             kb=None)},
               "ADAG": {1: fake_metrics(120, 4.5, workers=4, global_step=3000, kb=None),
                        32: fake_metrics(450, 9.0, workers=4, global_step=94, kb=None)}}
    settings = dict(command="python benchmarks/window_sweep.py", workers=4, learning_rate=0.1,
                    steps=3000, batch_size=64, bandwidth=None)
    text = window_sweep.write_table(str(tmp_path / "w.md"), results, [1, 32], settings)
    lines = text.splitlines()
    assert lines[0] == ("| example | window | final test accuracy | seconds to 0.95 "
                        "| mini-batches/s | pushes per worker |")
    assert lines[2:6] == ["| DOWNPOUR | 1 | 0.970 | 5.0 | 100 | 750 |",
                          "| DOWNPOUR | 32 | 0.810 | not reached | 400 | 24 |",
                          "| ADAG | 1 | 0.970 | 4.5 | 120 | 750 |",
                          "| ADAG | 32 | 0.970 | 9.0 | 450 | 24 |"]
    assert lines[-1].startswith("`python benchmarks/window_sweep.py`: 4 workers and 1 ps, on "
                                "localhost; learning rate 0.1 for both")
    for example in results:  # over a network, the bytes a mini-batch as well
        for m in results[example].values():
            m["cluster"] = {"bytes_per_mini_batch": 2500.0}
    networked = window_sweep.write_table(str(tmp_path / "w.md"), results, [1, 32],
                                         dict(settings, bandwidth="20 Mbit/s"))
    assert networked.splitlines()[0].endswith("| pushes per worker | kB per mini-batch |")
    assert networked.splitlines()[2].endswith("| 750 | 2.5 |")
    assert "every task a host of its own, links at 20 Mbit/s" in networked


def test_a_round_of_easgd_or_diloco_counts_one_push_from_every_worker_it_aggregates():
    # the global step of a synchronous round counts rounds; an asynchronous one counts pushes
    rounds = dict(global_step=125, workers=4, replicas_to_aggregate=4)
    assert window_sweep.pushes_per_worker(rounds) == 125
    assert window_sweep.pushes_per_worker(dict(global_step=503, workers=4)) == 125.75


def test_downpour_gets_an_sgd_ps_at_the_workers_rate_and_adag_only_the_window():
    assert window_sweep.train_args("DOWNPOUR", 8, 0.1) == [
        "--window", "8", "--learning_rate", "0.1", "--ps_optimizer", "sgd",
        "--ps_learning_rate", "0.1"]
    assert window_sweep.train_args("ADAG", 8, 0.1) == ["--window", "8", "--learning_rate", "0.1"]


def test_the_window_sweep_gives_the_elastic_examples_and_diloco_only_their_window(
        monkeypatch, capsys, tmp_path):
    assert window_sweep.train_args("EASGD", 16, 0.5) == ["--window", "16"]
    assert window_sweep.train_args("DiLoCo", 4, 0.5) == ["--window", "4"]
    no_runs(monkeypatch)
    assert exit_code(window_sweep.main, ["--examples", "DOWNPOUR,Hogwild",
                                         "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: --examples: choose from DOWNPOUR,ADAG,")


def test_the_workers_table_shows_accuracy_and_staleness_at_each_count(tmp_path):
    one, four = fake_metrics(100, accuracy=0.58), fake_metrics(90, accuracy=0.51)
    four["mean_staleness"] = 2.5
    text = compare.write_workers_table(str(tmp_path / "w.md"), {"Hogwild": {1: one, 4: four},
                                                                "EASGD": {4: one}}, [1, 4])
    assert text.splitlines()[0] == "| example | 1 worker(s) | 4 worker(s) |"
    assert table_rows(text) == {"Hogwild": ["0.580", "0.510 (2.50)"], "EASGD": ["", "0.580"]}


def test_the_compare_table_gives_examples_a_second_as_mini_batches_a_second_times_the_batch(
        tmp_path):
    args = argparse_namespace(target=0.95, batch_size=32, repeats=2, seed=0, steps=3000,
                              problem="digits")
    runs = {"Hogwild": [fake_metrics(100, reach=3.0), fake_metrics(300, reach=5.0)]}
    rows = table_rows(compare.write_table(str(tmp_path / "t.md"), runs, args))
    # seconds to 0.95 from the histories, the rates the repeats' medians
    assert rows["Hogwild"][2:5] == ["4.0", "200", "6400"]


# ==================================================================================================
# What a run left, read: the chief's summary line and its TensorBoard events
# (example_runs.metrics_of, what every benchmark and cluster.py --metrics_file read)
# ==================================================================================================
def test_a_summary_line_is_read_as_numbers_and_lists_and_the_clusters_own_is_not_the_chiefs():
    output = "\n".join([
        "[worker0] local_step=50 global_step=99 loss=0.3 test_accuracy=0.9 steps_per_sec=80.1",
        "[worker0] summary example=Sync-SGD test_accuracy=0.972222 global_step=1500 workers=1 "
        "ps=1 lost_workers=0 local_steps=3000 updates=1500 steps_per_sec=341.2 "
        "compressor=topk",
        "[cluster] summary exit=0 bandwidth=unlimited mini_batches=3000"])
    fields = example_runs.summary_fields(output)
    assert fields == {"example": "Sync-SGD", "test_accuracy": 0.972222, "global_step": 1500,
                      "workers": 1, "ps": 1, "lost_workers": 0, "local_steps": [3000],
                      "updates": 1500, "steps_per_sec": 341.2, "compressor": "topk"}
    assert example_runs.summary_fields("[local] summary local_steps=7,-1")["local_steps"] == [7, -1]
    assert example_runs.summary_fields("[worker0] local_step=50 loss=0.3\n") is None
    assert example_runs.metrics_of("Traceback (most recent call last):\n", "/nonexistent") is None


def write_events(folder, events, tensors):
    """An event file in folder, one event per (wall time, step, {tag: value}) of events: each
    value a simple_value as tf.compat.v1 writes it, or with tensors a scalar tensor, one event
    per tag, as TensorFlow 2's tf.summary.scalar writes it."""
    import tensorflow as tf
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "events.out.tfevents.%d.host" % len(os.listdir(folder)))
    with tf.io.TFRecordWriter(path) as writer:
        for wall_time, step, values in events:
            if tensors:
                summaries = [tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
                    tag=tag, tensor=tf.make_tensor_proto(value, tf.float32))])
                    for tag, value in values.items()]
            else:
                summaries = [tf.compat.v1.Summary(value=[
                    tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                    for tag, value in values.items()])]
            for summary in summaries:
                writer.write(tf.compat.v1.Event(wall_time=wall_time, step=step,
                                                summary=summary).SerializeToString())


@pytest.mark.parametrize("tensors", [False, True], ids=["tf.compat.v1", "tensorflow 2"])
def test_the_history_is_read_from_the_chiefs_events_on_the_clock_of_its_first_update(
        tmp_path, tensors):
    # a synchronous run resumed at global step 100: 2 mini-batches a global step, so its
    # steps_per_sec of 20 mini-batches is 10 global steps a second; an evaluation at steps
    # 110, 120 and 130, the end's at 130, and an earlier run's evaluation at step 90
    log_dir = str(tmp_path / "logs")
    write_events(log_dir, [(900.0, 90, {"test_accuracy": 0.5, "test_loss": 2.0})], tensors)
    evaluations = [(1001.0 + k, 110 + 10 * k, {"test_loss": 1.0 - 0.1 * k, "loss": 1.5,
                                               "test_accuracy": 0.9 + 0.01 * k})
                   for k in range(3)] + [(1003.5, 130, {"test_loss": 0.8, "test_accuracy": 0.92})]
    write_events(os.path.join(log_dir, "train"), evaluations, tensors)  # a subfolder too
    output = ("[worker0] summary example=Sync-SGD test_accuracy=0.92 test_loss=0.8 "
              "global_step=130 updates=30 steps_per_sec=20 replicas_to_aggregate=2\n")
    metrics = example_runs.metrics_of(output, log_dir)
    assert metrics["replicas_to_aggregate"] == 2 and metrics["test_accuracy"] == 0.92
    # the clock starts 10 global steps (1 s) before the first evaluation, at 1000 s; the
    # metrics in the summary's order; the earlier run's row and the loss left out
    history = [[round(seconds, 3), step] + [round(v, 4) for v in values]
               for seconds, step, *values in metrics["history"]]
    assert history == [[1.0, 110, 0.9, 1.0], [2.0, 120, 0.91, 0.9], [3.0, 130, 0.92, 0.8],
                       [3.5, 130, 0.92, 0.8]]
    assert example_runs.timed_seconds(metrics) == 3.5
    assert example_runs.examples_per_sec(metrics, 64) == 20 * 64
    assert example_runs.time_to_target(metrics, 0.91) == 2.0


def test_a_run_with_only_the_ends_evaluation_is_timed_at_its_summarys_pace(tmp_path):
    write_events(str(tmp_path), [(1002.0, 100, {"test_accuracy": 0.97})], tensors=False)
    output = "[local] summary test_accuracy=0.97 global_step=100 updates=100 steps_per_sec=50\n"
    [(seconds, step, accuracy)] = example_runs.metrics_of(output, str(tmp_path))["history"]
    assert (seconds, step, accuracy) == (2.0, 100, pytest.approx(0.97))  # 100 steps at 50 a s
    # no events at all: the summary's figures, an empty history
    assert example_runs.metrics_of(output, str(tmp_path / "none"))["history"] == []


def test_a_recorded_run_is_what_a_redraw_reads_back(tmp_path):
    log, metrics_path = tmp_path / "run.log", tmp_path / "run.json"
    log.write_text("$ bash run.sh\n[local] summary test_accuracy=0.5 global_step=3 updates=3 "
                   "steps_per_sec=1\n")
    recorded = example_runs.recorded_metrics(str(log), str(tmp_path / "none"), str(metrics_path))
    assert example_runs.read_metrics(str(metrics_path)) == recorded
    assert recorded["test_accuracy"] == 0.5
    log.write_text("$ bash run.sh\nerror: no such flag\n")  # a failed run writes nothing
    metrics_path.unlink()
    assert example_runs.recorded_metrics(str(log), str(tmp_path), str(metrics_path)) is None
    assert not metrics_path.exists()


def mnist1d_metrics(reach):
    """A chief's metrics on MNIST-1D that first reach 0.55 at reach seconds (None: never)."""
    history = [[1.0, 10, 0.40], [2.0, 20, 0.50]] + ([[reach, 30, 0.56]] if reach else [])
    return {"test_accuracy": 0.56 if reach else 0.50, "history": history, "steps_per_sec": 100.0}


def decision_run(label, rate, reach, final=0.60, rate_per_sec=100.0, busiest=None, both=None,
                 mini_batches=900):
    """One run's record as decision_table.record keeps it: it first reaches 0.55 at reach
    seconds (None: never; "overran": it overran its timeout)."""
    bits = {None: None, "unlimited": None, "100mbit": 10 ** 8, "20mbit": 2 * 10 ** 7}[rate]
    row = decision_table.Row(label, label, (), None)
    if reach == "overran":
        return decision_table.record(row, rate, bits, 0, 0, 0.1, None)
    metrics = mnist1d_metrics(reach)
    metrics.update(test_accuracy=final, steps_per_sec=rate_per_sec,
                   cluster={"mini_batches": mini_batches,
                            "busiest_link": {"bytes": busiest or 0},
                            "hosts": {"ps0": {"sent_bytes": both or 0, "received_bytes": 0}}})
    return decision_table.record(row, rate, bits, 0, 0, 0.1, metrics)


DECISION_SETTINGS = dict(command="sudo python benchmarks/decision_table.py", targets=[(0.8, 0.55)],
                         repeats=2, problem="mnist1d", workers=3, cpus=0.4, batch_size=512,
                         steps=900, cores=2)


def test_the_target_is_97_percent_of_the_one_process_sgd_runs_median_final_accuracy():
    runs = [decision_run(decision_table.ONE_SGD, None, 5.0, final=f) for f in (0.58, 0.60, 0.61)]
    runs.append(decision_run(decision_table.ONE_ADAMW, None, 5.0, final=0.70))  # not its rule
    assert decision_table.target_of(runs, 0.97) == 0.582  # 0.97 * 0.60, down to a thousandth
    assert decision_table.target_of(runs, 0.80) == 0.48
    with pytest.raises(ValueError, match="one process, SGD"):
        decision_table.target_of(runs[3:], 0.97)


def test_the_decision_table_gives_each_rate_the_median_and_range_or_what_was_not_reached(
        tmp_path):
    sgd, adamw = decision_table.ONE_SGD, decision_table.ONE_ADAMW
    runs = [decision_run(sgd, None, 40.0), decision_run(sgd, None, 44.0),
            decision_run(adamw, None, 10.0), decision_run(adamw, None, None),
            decision_run("DOWNPOUR", "unlimited", 10.0),
            decision_run("DOWNPOUR", "unlimited", 14.0),
            decision_run("DOWNPOUR", "20mbit", 30.0),
            decision_run("DOWNPOUR", "20mbit", "overran"),
            decision_run("Sync-SGD", "unlimited", 20.0),
            decision_run("Sync-SGD", "unlimited", 22.0),
            decision_run("Sync-SGD", "20mbit", None), decision_run("Sync-SGD", "20mbit", None)]
    text = decision_table.write_table(str(tmp_path / "d.md"), runs, DECISION_SETTINGS)
    assert text.splitlines()[0] == ("| row | learning rate | s to 0.550, unlimited "
                                    "| s to 0.550, 20 Mbit/s |")
    rows = table_rows(text)
    assert rows[sgd] == ["0.1"] + ["42.0 (40.0-44.0)"] * 2  # the same runs in every column
    assert rows[adamw] == ["0.1"] + ["1 of 2: 10.0"] * 2
    assert rows["DOWNPOUR"] == ["0.1", "12.0 (10.0-14.0)", "1 of 2: 30.0"]
    assert rows["Sync-SGD"] == ["0.1", "21.0 (20.0-22.0)", "not reached"]
    assert ("Targets: 0.550, 80% of the median final test accuracy of the one-process SGD runs"
            in text)
    assert "from the run's first update" in text
    decision_table.plot(str(tmp_path / "d.png"), runs, dict(DECISION_SETTINGS, targets=[
        (0.97, 0.56), (0.8, 0.55)]))
    assert (tmp_path / "d.png").read_bytes().startswith(PNG_SIGNATURE)


def test_which_scheme_names_each_speed_up_against_the_baseline_its_workers_step_like():
    sgd, adamw = decision_table.ONE_SGD, decision_table.ONE_ADAMW
    rows = decision_table.table_rows(["DOWNPOUR", "DiLoCo", "Sync-SGD"])
    runs = [decision_run(sgd, None, 40.0), decision_run(sgd, None, 44.0),
            decision_run(adamw, None, 10.0), decision_run(adamw, None, 10.0)]
    for label, unlimited, slow in [("DOWNPOUR", (10.0, 14.0), (30.0, None)),
                                   ("DiLoCo", (2.0, 3.0), (50.0, 50.0)),
                                   ("Local SGD", (8.0, 8.0), (20.0, 20.0)),
                                   ("Sync-SGD", (20.0, 22.0), (None, None))]:
        runs += [decision_run(label, "unlimited", s) for s in unlimited]
        runs += [decision_run(label, "20mbit", s) for s in slow]
    text = decision_table.which_scheme(runs, rows, DECISION_SETTINGS)
    cells = {row[1]: row[2:] for row in (line.strip("|").split(" | ")
                                           for line in text.splitlines()
                                           if line.startswith("| 0.550 (80%) |"))}
    # DiLoCo steps with AdamW: its speed-up is against one process with AdamW, not with SGD
    assert [c.strip() for c in cells["unlimited"]] == [
        "DiLoCo 2.5 s (4.0x against one process, AdamW); Local SGD 8.0 s (5.2x against one "
        "process, SGD); DOWNPOUR 12.0 s (3.5x against one process, SGD)", "none", "none"]
    # a cell where some runs missed comes after those where all reached it, however fast
    assert [c.strip() for c in cells["20 Mbit/s"]] == [
        "Local SGD 20.0 s (2.1x against one process, SGD); DiLoCo 50.0 s (0.2x against one "
        "process, AdamW); DOWNPOUR 30.0 s, 1 of 2 runs", "DiLoCo",
        "DOWNPOUR (1 of 2), Sync-SGD (0 of 2)"]
    assert "- **To 0.550 (80%), one process** takes 42.0 s with SGD and 10.0 s with AdamW." in text
    assert ("DiLoCo takes 2.5 s (4.0x against one process with AdamW), Local SGD (the same "
            "rounds with SGD inside) 8.0 s (5.2x against one process with SGD)") in text
    assert "- **To 0.550 (80%), 20 Mbit/s links:** Local SGD beats its one-process baseline." \
        in text
    # a target no scheme reaches says so
    strict = decision_table.which_scheme(runs, rows, dict(DECISION_SETTINGS,
                                                          targets=[(0.97, 0.9)]))
    assert ("**To 0.900 (97%), unlimited links:** no scheme beats its one-process baseline; none "
            "reaches the target in its mini-batches.") in strict


def test_tuning_scores_every_rate_of_the_grid_on_the_validation_split_never_the_test_set(
        monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(decision_table.cluster, "check_machine", lambda needs_tc: None)
    monkeypatch.setattr(decision_table.cluster, "check_cpus", lambda hosts, cpus: None)

    def run_baseline(args, who, tag, seed, workload):
        seen.append((args.data_path, workload[-1]))
        lr = float(workload[-1])
        return mnist1d_metrics(10.0 if lr == 0.1 else None)  # the default rate learns best

    def run_example(example, workers, args, tag, **kw):
        lr = float(kw["train_args"][-1])
        seen.append((args.data_path, "%g" % lr))
        return mnist1d_metrics(10.0 if lr > 0.1 else None)  # the largest rate learns best
    monkeypatch.setattr(decision_table.scaling, "run_baseline", run_baseline)
    monkeypatch.setattr(decision_table.example_runs, "run_example", run_example)
    assert decision_table.main(["--tune", "--examples", "DOWNPOUR", "--out", str(tmp_path)]) == 0
    assert {path for path, _ in seen} == {decision_table.problems.validation_path("mnist1d")}
    tuned = json.loads((tmp_path / decision_table.TUNING).read_text())
    assert tuned["rows"]["one process, SGD"]["learning_rate"] == 0.1
    assert sorted(tuned["rows"]["one process, SGD"]["scores"]) == ["0.0333", "0.1", "0.3"]
    # a best at the grid's edge is no optimum: one more rate beyond it, twice at most
    assert tuned["rows"]["DOWNPOUR"]["scores"].keys() == {"0.0333", "0.1", "0.3", "0.9"}
    assert tuned["rows"]["DOWNPOUR"]["learning_rate"] == 0.3
    assert tuned["rows"]["one process, AdamW"]["scores"].keys() == {
        "3.7e-05", "0.000111", "0.000333", "0.001", "0.003"}  # a tie: the smallest, each time
    assert tuned["budget"]["runs"] == 12
    rows = table_rows((tmp_path / "decision_table_tuning.md").read_text())
    assert rows["DOWNPOUR"][1] == "0.3"
    assert rows["one process, AdamW"][1] == "3.7e-05, the smallest tried"  # still at an edge
    # and the table then runs every row at its chosen rate, on the test set
    seen.clear()
    assert decision_table.main(["--examples", "DOWNPOUR", "--bandwidth", "unlimited",
                                "--repeats", "1", "--out", str(tmp_path)]) == 0
    assert seen == [(decision_table.problems.data_path("mnist1d"), "0.1"),
                    (decision_table.problems.data_path("mnist1d"), "3.7e-05"),
                    (decision_table.problems.data_path("mnist1d"), "0.3")]


def test_the_table_without_a_tuning_run_stops_in_one_line(monkeypatch, capsys, tmp_path):
    no_runs(monkeypatch)
    assert exit_code(decision_table.main, ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no tuned learning rate for every row") and err.count("\n") == 1
    assert "run it with --tune first" in err


def test_a_decision_table_run_that_overruns_is_not_reached_and_not_run_again(
        monkeypatch, capsys, tmp_path):
    starts = []

    class Overruns:  # a run that never ends by itself
        pid = 0

        def __init__(self, command, **kwargs):
            starts.append(command)
    monkeypatch.setattr(example_runs.subprocess, "Popen", Overruns)
    monkeypatch.setattr(example_runs, "wait_or_stop", lambda proc, timeout: None)
    args = argparse_namespace(out=str(tmp_path), from_logs=False, steps=10, batch_size=64,
                              eval_every=5, seed=0, timeout=1, data_path="")
    assert example_runs.run_example("Sync-SGD", 3, args, "t", timeout_is_a_result=True) is None
    assert len(starts) == 1 and "overran" in capsys.readouterr().err
    args.from_logs = True  # a redraw counts it as not reached too
    assert example_runs.run_example("Sync-SGD", 3, args, "t", timeout_is_a_result=True) is None
    # but a run that never ran is no result: a redraw stops in one line, naming it
    with pytest.raises(SystemExit) as stop:
        example_runs.run_example("DOWNPOUR", 3, args, "never", timeout_is_a_result=True)
    assert "DOWNPOUR has no run never" in str(stop.value) and "run it first" in str(stop.value)


def test_a_rerun_of_the_one_host_reference_trains_from_scratch_not_from_the_last_checkpoint(
        monkeypatch, tmp_path):
    # the decision table runs the reference once per call; a second call (another rate) found
    # the first's checkpoint at its last step, resumed there and trained nothing
    tensorboard = tmp_path / "logs" / "ref-tensorboard"
    tensorboard.mkdir(parents=True)
    (tensorboard / "checkpoint").write_text("model_checkpoint_path: \"model.ckpt-900\"\n")
    (tmp_path / "logs" / "ref.json").write_text('{"test_accuracy": 0.5}')
    seen = []

    class NoQuotas:
        def __init__(self, *args):
            pass
        create = remove = lambda self: None
        join_command = lambda self, task: []

    def call(command, stdout, **kwargs):  # the baseline's run: its summary line, no events
        seen.append((tensorboard.exists(), (tmp_path / "logs" / "ref.json").exists()))
        stdout.write("[local] summary example=Non-Distributed-Setup test_accuracy=0.6 "
                     "global_step=10 updates=10 steps_per_sec=5\n")
        return 0
    monkeypatch.setattr(scaling.cluster, "CpuQuotas", NoQuotas)
    monkeypatch.setattr(scaling.subprocess, "call", call)
    args = argparse_namespace(out=str(tmp_path), from_logs=False, steps=10, batch_size=64,
                              eval_every=5, seed=0, timeout=1, data_path="", cpus=0.4)
    assert scaling.run_baseline(args, "t", tag="ref")["test_accuracy"] == 0.6
    assert seen == [(False, False)]
    # what a redraw (--from_logs) reads back: the metrics read from the run's output
    assert json.loads((tmp_path / "logs" / "ref.json").read_text())["test_accuracy"] == 0.6


def test_only_a_full_run_into_the_default_folder_publishes(tmp_path):
    default = argparse_namespace(out=os.path.join(ROOT, "benchmarks", "results"))
    assert example_runs.publishing(default, quick=False)
    assert not example_runs.publishing(default, quick=True)
    assert not example_runs.publishing(argparse_namespace(out=str(tmp_path)), quick=False)


def argparse_namespace(**values):
    return argparse.Namespace(**values)


def exit_code(main, argv):
    """main's exit status, whether it returns it or exits with it (argparse's errors)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def no_runs(monkeypatch):
    """Make any attempt to start a run fail the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a run was started: %s" % (args,))
    monkeypatch.setattr(example_runs.subprocess, "Popen", refuse)


@pytest.mark.parametrize("main,argv", [
    (compare.main, ["--bandwidth", "unlimited,20mbit"]),
    (bandwidth.main, []),
    (window_sweep.main, ["--bandwidth", "20mbit"])],
    ids=["compare.py --bandwidth", "bandwidth.py", "window_sweep.py --bandwidth"])
def test_without_root_a_network_run_is_refused_in_one_line_before_any_run(
        main, argv, monkeypatch, capsys, tmp_path):
    no_runs(monkeypatch)
    monkeypatch.setattr(bandwidth.cluster.os, "geteuid", lambda: 1000)
    assert exit_code(main, argv + ["--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["error: creating network namespaces needs root: run it with sudo"]
    assert not (tmp_path / "out").exists()


def test_without_tc_a_limited_rate_is_refused_in_one_line(tmp_path):
    # PATH holds only an empty folder: neither ip nor tc (as root, ip is missed first)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"),
                           "--bandwidth", "unlimited,20mbit", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PATH=str(empty)))
    assert proc.returncode == 2 and proc.stdout == ""
    expected = ("error: `ip` (iproute2) was not found on PATH" if os.geteuid() == 0
                else "error: creating network namespaces needs root: run it with sudo")
    assert proc.stderr.splitlines() == [expected]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,message", [
    (["--bandwidth", "unlimited,20mbps"], "error: --bandwidth: '20mbps' is not a rate"),
    (["--bandwidth", "20mbit", "--examples", "DOWNPOUR,Nope"],
     "error: --examples: no example named Nope; choose from ADAG,"),
    (["--bandwidth", "20mbit", "--repeats", "3"],
     "error: unrecognized arguments: --repeats 3 (see python benchmarks/bandwidth.py --help)")])
def test_compare_with_bad_network_input_says_what_is_wrong_in_one_line(argv, message, monkeypatch,
                                                                       capsys, tmp_path):
    no_runs(monkeypatch)
    assert exit_code(compare.main, argv + ["--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(message), err


def write_fake_logs(out, tags_and_metrics):
    logs = out / "logs"
    logs.mkdir(parents=True)
    for tag, metrics in tags_and_metrics.items():
        (logs / (tag + ".json")).write_text(json.dumps(metrics))


def test_from_logs_redraws_the_network_comparison_without_training_or_root(
        monkeypatch, tmp_path):
    no_runs(monkeypatch)
    monkeypatch.setattr(bandwidth.cluster.os, "geteuid", lambda: 1000)  # nothing needs root
    out = tmp_path / "out"
    results = bandwidth_results()["B"]
    write_fake_logs(out, {"bandwidth-Non-Distributed-Setup": fake_metrics(2000, 0.4, kb=None),
                          "bandwidth-DOWNPOUR-unlimited": results["unlimited"],
                          "bandwidth-DOWNPOUR-20mbit": results["20mbit"]})
    assert compare.main(["--bandwidth", "unlimited,20mbit", "--examples", "DOWNPOUR",
                         "--from_logs", "--out", str(out)]) == 0
    text = (out / "bandwidth.md").read_text()
    assert table_rows(text)["DOWNPOUR"] == ["600", "250", "17.0", "0.70", "6.0", "1", "1"]
    assert text.splitlines()[-1].startswith(  # the command that measured it, not the redraw
        "`sudo python benchmarks/compare.py --bandwidth unlimited,20mbit --examples DOWNPOUR "
        "--out ")
    for name in ("bandwidth.png", "accuracy_slow_network.png"):
        assert (out / name).read_bytes().startswith(PNG_SIGNATURE), name


def test_from_logs_redraws_the_window_sweep_without_training(monkeypatch, tmp_path):
    no_runs(monkeypatch)
    out = tmp_path / "out"
    write_fake_logs(out, {"window_sweep-%s-window%d" % (e, w): fake_metrics(100 * w, 2.0 * w,
                                                                             workers=4, kb=None)
                          for e in ("DOWNPOUR", "ADAG") for w in (1, 4)})
    assert window_sweep.main(["--windows", "4,1", "--from_logs", "--out", str(out)]) == 0
    text = (out / "window_sweep.md").read_text()
    assert "| DOWNPOUR | 4 | 0.970 | 8.0 | 400 | 150 |" in text
    assert (out / "window_sweep.png").read_bytes().startswith(PNG_SIGNATURE)


# ==================================================================================================
# Short real runs (marked benchmark: deselected by default; see benchmarks/README.md)
# ==================================================================================================
def run_benchmark(argv, timeout):
    """A benchmark script in a session of its own; past timeout it gets SIGINT (it stops its
    run, and cluster.py its namespaces), then SIGKILL. Returns (exit status, output)."""
    proc = subprocess.Popen([sys.executable] + argv, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=interruptible)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail("%s did not finish within %d s:\n%s" % (argv[0], timeout, output[-3000:]))
    return proc.returncode, output


@pytest.mark.benchmark
@pytest.mark.cluster
@pytest.mark.timeout(600)
@needs_namespaces
def test_compare_over_the_network_ranks_an_example_against_the_baseline(tmp_path):
    out = tmp_path / "results"
    code, output = run_benchmark([os.path.join(ROOT, "benchmarks", "compare.py"),
                                  "--bandwidth", "unlimited,20mbit", "--examples", "DOWNPOUR",
                                  "--quick", "--out", str(out)], timeout=480)
    try:
        assert code == 0, output[-3000:]
        assert "[3/3] DOWNPOUR, 2 workers, links 20mbit" in output
        rows = table_rows((out / "bandwidth.md").read_text())
        assert list(rows) == ["Non-Distributed-Setup (one process)", "DOWNPOUR"]
        unlimited, slow, kb, fraction, reach, by_time, by_speed = rows["DOWNPOUR"]
        assert float(slow) < float(unlimited)  # 20 Mbit/s costs DOWNPOUR throughput
        assert 1 < float(kb) < 100  # a window's push and pull, per mini-batch (about 17 kB)
        assert 0.1 < float(fraction) <= 1.2, fraction  # a real bound, roughly met or under
        assert by_speed == "1" and by_time in ("1", "-")
        for name in ("bandwidth.png", "accuracy_slow_network.png"):
            data = (out / name).read_bytes()
            assert data.startswith(PNG_SIGNATURE) and len(data) > 10000, name
        with open(out / "logs" / "bandwidth-DOWNPOUR-20mbit.json") as f:
            assert json.load(f)["cluster"]["bandwidth_bits_per_sec"] == 20 * 10 ** 6
    finally:
        prefixes = assert_runs_left_nothing(tmp_path, out / "logs")
    assert len(prefixes) == 2, prefixes  # two cluster.py runs, both gone


@pytest.mark.benchmark
@pytest.mark.cluster
@pytest.mark.timeout(300)
@needs_namespaces
def test_ctrl_c_during_a_network_comparison_stops_the_run_and_removes_its_namespaces(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"),
                             "--bandwidth", "20mbit", "--examples", "Hogwild", "--out", str(out),
                             "--steps", "3000"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=interruptible)
    log = out / "logs" / "bandwidth-Hogwild-20mbit.log"
    try:
        read_until(proc, "[2/2] Hogwild, 2 workers, links 20mbit", timeout=120)
        deadline = time.time() + 120  # until cluster.py has made its hosts and started training
        while "[worker1] local_step=" not in (log.read_text() if log.exists() else ""):
            assert time.time() < deadline and proc.poll() is None, "the run did not start"
            time.sleep(0.2)  # the pace of the checks
        assert namespaces_of_runs(str(out / "logs"))[1]  # its hosts exist now
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C reaches compare.py, and only compare.py
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        prefixes = assert_runs_left_nothing(tmp_path, out / "logs")
    assert proc.returncode == 128 + signal.SIGINT, output[-3000:]
    assert "compare: interrupted: stopped Hogwild's run (its log: %s)" % log in output
    assert "[cluster] interrupted by SIGINT: stopping every task" in log.read_text()
    assert len(prefixes) == 1, prefixes


@pytest.mark.benchmark
@pytest.mark.timeout(600)
def test_the_window_sweep_runs_both_examples_at_each_window(tmp_path):
    out = tmp_path / "results"
    code, output = run_benchmark([os.path.join(ROOT, "benchmarks", "window_sweep.py"),
                                  "--quick", "--windows", "1,4", "--workers", "2",
                                  "--out", str(out)], timeout=480)
    try:
        assert code == 0, output[-3000:]
        rows = [[c.strip() for c in line.strip("|").split("|")]
                for line in (out / "window_sweep.md").read_text().splitlines()
                if line.startswith(("| DOWNPOUR |", "| ADAG |"))]
        assert [r[:2] for r in rows] == [["DOWNPOUR", "1"], ["DOWNPOUR", "4"], ["ADAG", "1"],
                                         ["ADAG", "4"]]
        pushes = {(r[0], int(r[1])): float(r[5]) for r in rows}
        # 300 mini-batches over 2 workers: 150 pushes each at window 1, about 38 at window 4
        assert pushes["DOWNPOUR", 1] == pytest.approx(150, abs=2)
        assert pushes["ADAG", 4] == pytest.approx(150 / 4, abs=2)
        assert (out / "window_sweep.png").read_bytes().startswith(PNG_SIGNATURE)
    finally:
        assert_nothing_left(str(tmp_path))


# --- scaling.py: hosts with CPU of their own -------------------------------------------------------
def test_the_scaling_table_gives_speed_up_and_efficiency_against_one_host(tmp_path):
    baseline = fake_metrics(40.0, reach=10.0, workers=1)
    results = {("DOWNPOUR", 1, "unlimited"): fake_metrics(36.0, reach=12.0),
               ("DOWNPOUR", 3, "unlimited"): fake_metrics(108.0, reach=4.0),
               ("Sync-SGD", 3, "1gbit"): fake_metrics(60.0)}
    text = scaling.write_table(str(tmp_path / "scaling.md"), results, baseline,
                               dict(command="sudo python benchmarks/scaling.py", cpus=0.4,
                                    steps=900, batch_size=512))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| example")]
    assert rows[0] == ["Non-Distributed-Setup (one process)", "1", "none", "40.0", "1.00", "1.00",
                       "10.0", "1.00"]
    assert rows[1] == ["DOWNPOUR", "1", "unlimited", "36.0", "0.90", "0.90", "12.0", "0.83"]
    assert rows[2] == ["DOWNPOUR", "3", "unlimited", "108.0", "2.70", "0.90", "4.0", "2.50"]
    assert rows[3] == ["Sync-SGD", "3", "1gbit", "60.0", "1.50", "0.50", "n/a", "n/a"]
    assert "With 3 workers, links unlimited: 2.70 to 2.70 times one host, median 2.70." in text
    assert "With 3 workers, links 1gbit: 1.50 to 1.50 times one host, median 1.50." in text
    assert "Every host 0.4 core(s)" in text and "sudo python benchmarks/scaling.py" in text
    assert (tmp_path / "scaling.md").read_text() == text


def test_the_scaling_table_timed_alone_leaves_out_the_seconds_to_the_target(tmp_path):
    # --eval_every 0, the default: nothing evaluated before the end, so no time to an accuracy
    results = {("DOWNPOUR", 3, "unlimited"): fake_metrics(108.0, reach=4.0)}
    text = scaling.write_table(str(tmp_path / "scaling.md"), results, fake_metrics(
        40.0, reach=10.0, workers=1), dict(command="sudo python benchmarks/scaling.py", cpus=0.4,
                                           steps=900, batch_size=512, eval_every=0))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]
    assert rows[0] == ["example", "workers", "links", "mini-batches/s", "speed-up", "efficiency"]
    assert rows[3] == ["DOWNPOUR", "3", "unlimited", "108.0", "2.70", "0.90"]
    assert scaling.parser("scaling.py").parse_args([]).eval_every == 0


def test_the_scaling_table_gives_each_cells_median_and_range_over_its_runs(tmp_path):
    """Three runs a cell: the speed-ups are each run's rate over the median of one host's (40),
    and the table, the bounds and the README's sentence give the median and the range."""
    baseline = [fake_metrics(r, workers=1) for r in (38.0, 40.0, 44.0)]
    results = {("DOWNPOUR", 3, "unlimited"): [fake_metrics(r, kb=k) for r, k in
                                              ((100.0, 500.0), (108.0, 520.0), (96.0, 510.0))]}
    text = scaling.write_table(str(tmp_path / "scaling.md"), results, baseline,
                               dict(command="sudo python benchmarks/scaling.py", cpus=0.4,
                                    steps=900, batch_size=512))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| example")]
    assert rows[0][3] == "40.0 (38.0-44.0)"
    assert rows[1][3:6] == ["100.0 (96.0-108.0)", "2.50 (2.40-2.70)", "0.83 (0.80-0.90)"]
    assert "With 3 workers, links unlimited: 2.50 to 2.50 times one host, median 2.50." in text
    assert "medians of 3 runs a cell, the range in brackets" in text
    bounds = [[c.strip() for c in line.strip("|").split("|")]
              for line in scaling.bounds_table(results, baseline).splitlines()[2:]]
    assert bounds == [["DOWNPOUR", "unlimited", "0.83 (0.80-0.90)", "510", "n/a", "n/a"]]
    section = scaling.example_sections(results, baseline, dict(
        command="sudo python benchmarks/scaling.py", cpus=0.4, steps=900, batch_size=512))
    assert ("2.50 (2.40-2.70) times its mini-batches/s at unlimited links (efficiency 0.83; the "
            "median of 3 runs, the range in brackets)") in section["DOWNPOUR"]
    scaling.plot_speed_up(str(tmp_path / "speed_up.png"), results, baseline,
                          [("unlimited", None)], [3])
    assert (tmp_path / "speed_up.png").read_bytes().startswith(PNG_SIGNATURE)


def test_scaling_runs_a_cell_at_a_limited_rate_in_the_first_rounds_only_and_says_so(tmp_path):
    cells = [("DOWNPOUR", 3, "unlimited"), ("DOWNPOUR", 3, "1gbit")]
    assert scaling.rounds(cells, 3, 1) == [cells, cells[:1], cells[:1]]
    assert scaling.rounds(cells, 2, 2) == [cells, cells]
    baseline = [fake_metrics(r, workers=1) for r in (38.0, 40.0, 44.0)]
    results = {cells[0]: [fake_metrics(r) for r in (100.0, 108.0, 96.0)],
               cells[1]: [fake_metrics(90.0)]}
    text = scaling.write_table(str(tmp_path / "scaling.md"), results, baseline,
                               dict(command="sudo python benchmarks/scaling.py", cpus=0.4,
                                    steps=900, batch_size=512))
    assert "medians of 3 runs a cell (1 at 1gbit), the range in brackets" in text
    assert "| DOWNPOUR | 3 | 1gbit | 90.0 | 2.25 | 0.75 |" in text
    section = scaling.example_sections(results, baseline, dict(
        command="sudo python benchmarks/scaling.py", cpus=0.4, steps=900, batch_size=512))
    assert ("range in brackets) and 2.25 times at 1 Gbit/s (efficiency 0.75)."
            in section["DOWNPOUR"])
    assert scaling.main(["--limited_repeats", "4"]) == 2  # more than --repeats: one line
    assert scaling.main(["--limited_workers", "4"]) == 2  # not among --workers
    scaling.plot_speed_up(str(tmp_path / "speed_up.png"), results, baseline,
                          [("unlimited", None), ("1gbit", 1e9)], [1, 3])  # 1gbit: 3 workers
    assert (tmp_path / "speed_up.png").read_bytes().startswith(PNG_SIGNATURE)


def test_scaling_repeats_keep_the_first_runs_tag_so_earlier_logs_redraw():
    assert scaling.repeat_tag("scaling-DOWNPOUR-3-unlimited", 1) == "scaling-DOWNPOUR-3-unlimited"
    assert scaling.repeat_tag("scaling-DOWNPOUR-3-unlimited", 2) == (
        "scaling-DOWNPOUR-3-unlimited-r2")


def test_scaling_writes_each_example_its_own_speed_up_and_what_bounds_it():
    baseline = fake_metrics(40.0, workers=1)
    results = {("DOWNPOUR", 1, "unlimited"): fake_metrics(36.0),
               ("DOWNPOUR", 3, "unlimited"): fake_metrics(108.0),
               ("DOWNPOUR", 3, "1gbit"): fake_metrics(96.0, fraction=0.25, kb=500.0),
               ("Sync-SGD", 3, "1gbit"): fake_metrics(60.0, fraction=0.5, kb=2500.0)}
    results[("Sync-SGD", 3, "1gbit")]["cluster"].update(cpu_seconds_ps0=8.0, cpu_seconds_worker0=9.0)
    sections = scaling.example_sections(results, baseline, dict(
        command="sudo python benchmarks/scaling.py", cpus=0.4, steps=900, batch_size=512))
    assert sorted(sections) == ["DOWNPOUR", "Sync-SGD"]
    assert ("2.70 times its mini-batches/s at unlimited links (efficiency 0.90) and 2.40 times at "
            "1 Gbit/s (efficiency 0.80)") in sections["DOWNPOUR"]
    assert "1.50 times its mini-batches/s at 1 Gbit/s (efficiency 0.50)" in sections["Sync-SGD"]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in scaling.bounds_table(results, baseline).splitlines()[2:]]
    assert rows == [["DOWNPOUR", "unlimited", "0.90", "20", "n/a", "n/a"],
                    ["DOWNPOUR", "1gbit", "0.80", "500", "0.25", "n/a"],
                    ["Sync-SGD", "1gbit", "0.50", "2500", "0.50", "8.0"]]


def test_the_ps_sweep_runs_one_ps_once_and_more_ps_whole_and_in_slices():
    assert ps_sweep.plan_runs(["Sync-SGD"], [1, 3], ["1gbit"]) == [
        ("Sync-SGD", 1, False, "1gbit"), ("Sync-SGD", 3, False, "1gbit"),
        ("Sync-SGD", 3, True, "1gbit")]


def test_the_ps_sweep_table_gives_each_ps_links_bytes_and_the_gain_over_one_ps(tmp_path):
    def run(rate, *ps_bytes):
        metrics = fake_metrics(rate, fraction=0.5)
        metrics["cluster"].update(mini_batches=100, hosts={
            "ps%d" % i: {"sent_bytes": b / 2, "received_bytes": b / 2}
            for i, b in enumerate(ps_bytes)})
        metrics["cluster"].update({"cpu_seconds_ps%d" % i: 5.0 + i for i in range(len(ps_bytes))})
        return metrics
    results = {("Distributed-Setup", 1, False, "1gbit"): run(40.0, 250e6),
               ("Distributed-Setup", 3, False, "1gbit"): run(44.0, 30e6, 210e6, 10e6),
               ("Distributed-Setup", 3, True, "1gbit"): run(100.0, 84e6, 83e6, 83e6)}
    text = ps_sweep.write_table(str(tmp_path / "ps_sweep.md"), results, dict(
        command="sudo python benchmarks/ps_sweep.py", cpus=0.33, steps=600, batch_size=512,
        workers=3))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| Distributed-Setup")]
    assert rows == [
        ["Distributed-Setup", "1gbit", "1", "whole", "40.0", "1.00", "2500", "0.50", "5.0"],
        ["Distributed-Setup", "1gbit", "3", "whole", "44.0", "1.10", "300 / 2100 / 100", "0.50",
         "5.0 / 6.0 / 7.0"],
        ["Distributed-Setup", "1gbit", "3", "a slice per ps", "100.0", "2.50", "840 / 830 / 830",
         "0.50", "5.0 / 6.0 / 7.0"]]
    assert "every host 0.33 core(s)" in text and "sudo python benchmarks/ps_sweep.py" in text


@pytest.mark.parametrize("repeat_from", ["2", "-1"])
def test_the_decision_table_refuses_a_first_run_outside_its_repeats_in_one_line(
        repeat_from, monkeypatch, capsys, tmp_path):
    no_runs(monkeypatch)
    assert exit_code(decision_table.main, ["--repeats", "2", "--repeat_from", repeat_from,
                                           "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --repeat_from %s: give a run from 0 to --repeats - 1 (1)" % repeat_from]


def test_a_decision_table_measured_in_parts_runs_only_the_runs_asked_and_redraws_them_all(
        monkeypatch, capsys, tmp_path):
    ran = []
    monkeypatch.setattr(decision_table.cluster, "check_machine", lambda needs_tc: None)
    monkeypatch.setattr(decision_table.cluster, "check_cpus", lambda hosts, cpus: None)
    monkeypatch.setattr(decision_table.scaling, "run_baseline",
                        lambda args, who, tag, seed, workload: ran.append((tag, seed)) or
                        mnist1d_metrics(40.0))
    monkeypatch.setattr(decision_table.example_runs, "run_example",
                        lambda example, workers, args, tag, **kw: ran.append((tag, kw["seed"]))
                        or mnist1d_metrics(10.0))
    (tmp_path / decision_table.TUNING).write_text(json.dumps({"rows": {
        label: {"learning_rate": 0.1} for label in ("one process, SGD", "one process, AdamW",
                                                    "DOWNPOUR")}}))
    argv = ["--examples", "DOWNPOUR", "--bandwidth", "unlimited", "--repeats", "2",
            "--out", str(tmp_path)]
    assert decision_table.main(argv + ["--repeat_from", "1"]) == 0
    assert ran == [("decision-one-process-SGD-one-host-r1", 1),
                   ("decision-one-process-AdamW-one-host-r1", 1),
                   ("decision-DOWNPOUR-unlimited-r1", 1)]
    assert "over 1 run(s)" in (tmp_path / "decision_table.md").read_text()
    ran.clear()
    assert decision_table.main(argv + ["--from_logs"]) == 0  # a redraw reads run 0 as well
    assert [tag for tag, _ in ran] == ["decision-one-process-SGD-one-host-r0",
                                       "decision-one-process-AdamW-one-host-r0",
                                       "decision-one-process-SGD-one-host-r1",
                                       "decision-one-process-AdamW-one-host-r1",
                                       "decision-DOWNPOUR-unlimited-r0",
                                       "decision-DOWNPOUR-unlimited-r1"]
    assert "over 2 run(s)" in (tmp_path / "decision_table.md").read_text()


def test_the_ps_sweep_refuses_an_example_without_slices_in_one_line():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ps_sweep.py"),
                           "--examples", "DOWNPOUR", "--out", "/nonexistent"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["error: --examples: choose from Distributed-Setup,Sync-SGD "
                                        "(the examples with --shard_variables)"]


def test_scaling_refuses_more_hosts_than_the_cores_allow_in_one_line():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "scaling.py"),
                           "--workers", "1,2,3,4,5", "--cpus", "0.4", "--out", "/nonexistent"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["error: 7 hosts x 0.4 cores = 2.8 cores, more than this "
                                        "machine's %d: give --cpus %g or less"
                                        % (os.cpu_count(), os.cpu_count() / 7)]


@pytest.mark.benchmark
@pytest.mark.cluster
@pytest.mark.timeout(900)
@needs_namespaces
def test_the_scaling_smoke_run_measures_one_and_two_workers_on_capped_hosts(tmp_path):
    out = tmp_path / "results"
    code, output = run_benchmark([os.path.join(ROOT, "benchmarks", "scaling.py"), "--quick",
                                  "--bandwidth", "unlimited", "--examples", "Hogwild",
                                  "--out", str(out)], timeout=800)
    try:
        assert code == 0, output[-3000:]
        rows = [line for line in (out / "scaling.md").read_text().splitlines()
                if line.startswith("| Hogwild |")]
        assert [r.split("|")[2].strip() for r in rows] == ["1", "2"]
        metrics = json.loads((out / "logs" / "scaling-Hogwild-2-unlimited.json").read_text())
        assert metrics["cluster"]["cpus_per_host"] == 0.4
        assert (out / "speed_up.png").exists()
    finally:
        assert_nothing_left(str(tmp_path))


import step_time_model  # noqa: E402


def test_the_step_time_model_predicts_each_cell_from_the_unlimited_runs_one_host_and_one_rate():
    sgd = decision_table.ONE_SGD
    # one host: 100 mini-batches/s, so c = 10 ms; DOWNPOUR on unlimited links: 200 a second,
    # so p = 5 ms - 10 ms / 3; it reaches the target at 4 s: N = 800 mini-batches; its
    # busiest link carries 90 MB in its busier direction and 180 MB in both over 900
    # mini-batches: b = 200 kB (and 100 kB by the earlier rule)
    runs = [decision_run(sgd, None, 9.0, rate_per_sec=100.0),
            decision_run("DOWNPOUR", "unlimited", 4.0, rate_per_sec=200.0, busiest=9e7,
                         both=1.8e8),
            # 50 a second at 100 Mbit/s: it waits 20 ms - 5 ms = 15 ms a mini-batch on the
            # wire, where all of b would take 16 ms: s = 15 / 16
            decision_run("DOWNPOUR", "100mbit", 11.0, rate_per_sec=50.0, busiest=9e7),
            # Sync-SGD's reads and writes take turns: the earlier rule counted both directions
            decision_run("Sync-SGD", "unlimited", 4.0, rate_per_sec=200.0, busiest=9e7,
                         both=1.8e8)]
    c, fitted = step_time_model.fit(runs, 0.55, 3)
    step_time_model.fit_waiting(runs, fitted)
    assert c == pytest.approx(0.01)
    downpour = fitted["DOWNPOUR"]
    assert downpour["p"] == pytest.approx(0.005 - 0.01 / 3)
    assert downpour["N"] == pytest.approx(800)
    assert (downpour["b"], downpour["counted"]) == (pytest.approx(2e5), pytest.approx(1e5))
    assert fitted["Sync-SGD"]["counted"] == pytest.approx(2e5)
    assert downpour["s"] == pytest.approx(15 / 16)
    assert fitted["Sync-SGD"]["s"] is None  # not run at 100 Mbit/s: nothing to measure s from
    # unlimited: its own seconds back; 20 Mbit/s: 800 * (5 ms + 5 * 15 ms) = 64 s, where the
    # earlier rule said 800 * (5 ms + 40 ms) = 36 s
    assert step_time_model.predict(c, downpour, 3, None) == pytest.approx(4.0)
    assert step_time_model.predict(c, downpour, 3, 10 ** 8) == pytest.approx(16.0)
    assert step_time_model.predict(c, downpour, 3, 2 * 10 ** 7) == pytest.approx(64.0)
    assert step_time_model.predict(c, downpour, 3, 2 * 10 ** 7, "counted") == pytest.approx(36.0)
    assert step_time_model.predict(c, fitted["Sync-SGD"], 3, 2 * 10 ** 7) is None
    settings = dict(DECISION_SETTINGS, workers=3, targets=[(None, 0.55)])
    text, fits = step_time_model.evaluate(runs, settings, [("1gbit", 10 ** 9)])
    assert "| DOWNPOUR | 0.550 | 2 | 200.0 | 0.94 | 800 | 4.0 / 4.0 (+0%) | 16.0 / 11.0 (+45%) " \
           "| 5.2 |" in text
    assert "| Sync-SGD | 0.550 | 2 | 200.0 | - | 800 | 4.0 / 4.0 (+0%) | - / not run | - |" in text
    # held out: a 20 Mbit/s column (the 3-worker fit), and 2 workers, whose own unlimited runs
    # give N = 600 and p = 1/150 - 5 ms, with s carried over: 600 * (5 + 1.67 + 15) ms = 13 s
    rate20 = [decision_run(sgd, None, 9.0),
              decision_run("DOWNPOUR", "20mbit", 60.0, rate_per_sec=12.5)]
    lines, judged, right, right_before = step_time_model.evaluate_held_out(
        fits, settings, rate20, dict(settings, workers=3), "rate20")
    assert (judged, right, right_before) == (1, 1, 0)
    # its runs took 60 s at 12.5 a second: 750 mini-batches, where N was 800
    assert lines == ["| DOWNPOUR | 0.550 | 3 | 20 Mbit/s | 60.0 | 64.0 (+7%) | 36.0 (-40%) "
                     "| 750 (+7%) |"]
    workers2 = [decision_run(sgd, None, 9.0, rate_per_sec=100.0),
                decision_run("DOWNPOUR", "unlimited", 4.0, rate_per_sec=150.0, busiest=9e7,
                             both=1.8e8),
                decision_run("DOWNPOUR", "100mbit", 12.0)]
    lines, judged, right, _ = step_time_model.evaluate_held_out(
        fits, settings, workers2, dict(settings, workers=2), "workers2")
    assert (judged, right) == (1, 1)
    assert lines[0].startswith("| DOWNPOUR | 0.550 | 2 | 100 Mbit/s | 12.0 | 13.0 (+8%) |")
    with pytest.raises(ValueError, match="2 workers and no unlimited runs"):
        step_time_model.evaluate_held_out(fits, settings, workers2[2:], dict(settings, workers=2),
                                          "workers2")


def test_the_step_time_model_without_the_decision_tables_runs_stops_in_one_line(capsys, tmp_path):
    assert step_time_model.main(["--runs", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run benchmarks/decision_table.py first" in err


def test_a_decision_table_cut_short_goes_on_with_resume_and_runs_only_what_is_missing(
        monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(decision_table.cluster, "check_machine", lambda needs_tc: None)
    monkeypatch.setattr(decision_table.cluster, "check_cpus", lambda hosts, cpus: None)

    def run(tag, args):
        ran.append(tag)
        (tmp_path / "logs" / (tag + ".json")).write_text(json.dumps(mnist1d_metrics(10.0)))
        return mnist1d_metrics(10.0)
    monkeypatch.setattr(decision_table.scaling, "run_baseline",
                        lambda args, who, tag, seed, workload: run(tag, args))
    monkeypatch.setattr(decision_table.example_runs, "run_example",
                        lambda example, workers, args, tag, **kw: run(tag, args))
    argv = ["--tune", "--examples", "DOWNPOUR", "--out", str(tmp_path)]
    assert decision_table.main(argv) == 0
    first = list(ran)
    (tmp_path / "logs" / (first[-1] + ".json")).unlink()  # the last run never ended
    ran.clear()
    assert decision_table.main(argv + ["--resume"]) == 0
    assert ran == [first[-1]]
    assert (tmp_path / "logs" / (first[0] + ".wall")).exists()  # its wall time, for the budget


def test_a_benchmarks_help_gives_the_defaults_it_runs_with(capsys):
    # the decision table runs MNIST-1D at batch 512 with 900 s a run, not the shared defaults
    with pytest.raises(SystemExit):
        decision_table.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: mnist1d)" in text and "(default: digits)" not in text
    assert "seconds a run may take (default: 900)" in text
    assert "--batch_size BATCH_SIZE (default: 512)" in text


def step_time_files(tmp_path, held_out_runs, workers=2):
    """A runs file to fit the model on (3 workers, as the first test's) and a held-out one."""
    sgd = decision_table.ONE_SGD
    fitted_on = [decision_run(sgd, None, 9.0, rate_per_sec=100.0),
                 decision_run("DOWNPOUR", "unlimited", 4.0, rate_per_sec=200.0, busiest=9e7,
                              both=1.8e8),
                 decision_run("DOWNPOUR", "100mbit", 11.0, rate_per_sec=50.0, busiest=9e7)]
    settings = dict(DECISION_SETTINGS, workers=3, targets=[(None, 0.55)])
    paths = []
    for name, runs, n in (("fitted", fitted_on, 3), ("held_out", held_out_runs, workers)):
        path = tmp_path / name / decision_table.RUNS
        path.parent.mkdir()
        path.write_text(json.dumps(dict(settings=dict(settings, workers=n), rows=[], runs=runs)))
        paths.append(str(path))
    return paths


def test_the_step_time_model_leaves_out_the_held_out_runs_its_rule_saw_and_says_so(
        tmp_path, monkeypatch):
    # 2 workers: the first 100 Mbit/s run (repeat 0) was measured before the rule and is far
    # off (30 s); the run after it took 12 s, which the model's 13 s predicts within 25%
    seen, after = (decision_run("DOWNPOUR", "100mbit", s) for s in (30.0, 12.0))
    after["repeat"] = 1
    fitted_on, held_out = step_time_files(tmp_path, [
        decision_run(decision_table.ONE_SGD, None, 9.0, rate_per_sec=100.0),
        decision_run("DOWNPOUR", "unlimited", 4.0, rate_per_sec=150.0, busiest=9e7, both=1.8e8),
        seen, after])
    every_run = step_time_model.report(fitted_on, "", [held_out])
    assert "| 2 | 100 Mbit/s | 21.0 | 13.0 (-38%) |" in every_run  # the median of both
    assert ": 0 of 1 within 25%" in every_run and "Left out" not in every_run
    monkeypatch.setattr(step_time_model, "SEEN_BY_THE_RULE", {held_out: dict(
        rate="100mbit", repeat=0, rows=("DOWNPOUR",))})
    unseen = step_time_model.report(fitted_on, "", [held_out])
    assert "| 2 | 100 Mbit/s | 12.0 | 13.0 (+8%) |" in unseen
    assert (": 1 of 1 within 25% of the measured median (100%); the earlier rule, 0 of 1. Left "
            "out: 1 run(s) measured before the rule was committed, which prompted it (the first "
            "100 Mbit/s run of DOWNPOUR, 2 workers)") in unseen


def test_the_step_time_model_given_a_held_out_file_without_one_process_runs_stops_in_one_line(
        tmp_path, capsys):
    fitted_on, held_out = step_time_files(tmp_path, [
        decision_run("DOWNPOUR", "unlimited", 4.0, rate_per_sec=150.0, busiest=9e7, both=1.8e8),
        decision_run("DOWNPOUR", "100mbit", 12.0)])
    assert step_time_model.main(["--runs", fitted_on, "--held_out", held_out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--held_out %s: no 'one process, SGD' runs to measure c" % (
        held_out) in err, err
