"""benchmarks/cluster.py: every task a host of its own, in a network namespace, set up by TF_CONFIG.

The tests that make namespaces need root, ip and tc; they skip with the reason otherwise, and are
marked `cluster` (deselect them with -m "not cluster and not benchmark and not restarts": a -m
given replaces pytest.ini's). Every test bounds its waits and checks that no process and no namespace of its
run is left.
"""
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from support.examples import ACCURACY_BAR, ROOT
from support.namespaces import (CLUSTER_PY, assert_run_left_nothing, namespaces_with_prefix,
                                needs_namespaces, start_tool)
from support.processes import assert_nothing_left
from support.runs import finish, read_until, summary_of

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import cluster as cluster_tool  # noqa: E402  (benchmarks/ is not a package)


def started_pids(output):
    """{role: pid} from the tool's `[cluster] started ROLE pid=N` lines."""
    return {role: int(pid) for role, pid in re.findall(r"\[cluster\] started (\w+) pid=(\d+)",
                                                       output)}


# ==================================================================================================
# Every task on its own host: what the tool reports (each family, asynchronous, windowed and
# synchronous, trains to the bar on its own hosts in the restart runs below)
# ==================================================================================================
@pytest.mark.cluster
@needs_namespaces
@pytest.mark.parametrize("example", ["DOWNPOUR"])
def test_a_run_on_hosts_of_their_own_trains_to_the_bar_and_reports_each_hosts_bytes(
        example, tmp_path):
    metrics_file = tmp_path / "metrics.json"
    proc = start_tool([example, "--ps", "1", "--workers", "2", "--timeout", "150",
                       "--log_dir", str(tmp_path / "logs"), "--metrics_file", str(metrics_file)])
    try:
        run = finish(proc, timeout=180)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 0, run.output[-3000:]
    chief = summary_of(run.output, "worker0")
    assert float(chief["test_accuracy"]) >= ACCURACY_BAR, chief
    assert chief["workers"] == "2" and chief["lost_workers"] == "0", chief
    # the ps learnt its own address from TF_CONFIG: an address of the tool's subnet, not localhost
    assert "[ps0] serving 2 worker(s) at 10.77.0.1:2222" in run.output
    assert "[ps0] the run is over; shutting down" in run.output
    assert "[cluster] all processes finished" in run.output

    report = summary_of(run.output, "cluster")
    assert report["exit"] == "0" and report["bandwidth"] == "unlimited"
    mini_batches = sum(int(s) for s in chief["local_steps"].split(","))
    assert int(report["mini_batches"]) == mini_batches
    # every mini-batch moves at least one copy of the model's parameters (64x128 + 128 + 128x10
    # + 10 floats: 38 kB) across the wire: a pull, a push or both, or a window's share of them
    model_bytes = 4 * (64 * 128 + 128 + 128 * 10 + 10)
    assert float(report["bytes_per_mini_batch"]) > model_bytes / 10, report
    with open(metrics_file) as f:
        metrics = json.load(f)
    # the chief's summary line and the history of its TensorBoard events, as read by
    # benchmarks/example_runs.py (train.py writes no file for the benchmarks)
    assert metrics["test_accuracy"] == pytest.approx(float(chief["test_accuracy"]), abs=1e-5)
    assert metrics["local_steps"] == [int(s) for s in chief["local_steps"].split(",")]
    history = metrics["history"]
    assert len(history) >= 2 and history[-1][1] == metrics["global_step"], history
    assert history[-1][2] == pytest.approx(metrics["test_accuracy"], abs=1e-5)
    assert [row[0] for row in history] == sorted(row[0] for row in history) and history[0][0] > 0
    hosts = metrics["cluster"]["hosts"]
    assert sorted(hosts) == ["ps0", "worker0", "worker1"]
    assert all(h["sent_bytes"] > 0 and h["received_bytes"] > 0 for h in hosts.values()), hosts
    # the ps carries every worker's traffic: it is the busiest link
    assert metrics["cluster"]["busiest_link"]["host"] == "ps0"


# On a real cluster tasks start apart, and one may die and come back at the same address, as a
# restart policy would bring it. Each run below starts its tasks apart first: a late ps or a late
# worker, for an asynchronous, a windowed and a synchronous example (the seeds of --stagger put
# the named task last: seed 0, ps0; seed 7, worker1), and the run checks that order; then it
# restarts tasks, one after another: the chief (it goes on from the ps's variables), a worker,
# and the ps (the chief restores the variables from its last checkpoint, and every worker takes
# up the run again on a new session). Each restart comes at a global step (ROLE@stepN), not at a
# time, so that it falls inside the run and the run still has steps to do after it however fast
# or slow this machine trains; the steps between restarts leave the restarted task time to load
# and rejoin before the next one. Now and then TensorFlow leaves a step of a worker hanging after
# a restart ("The same RunGraph (Worker) request was received twice", benchmarks/README.md): its
# watchdog ends it and --restart_failed starts it again, as a restart policy would.
WATCHDOG = 60  # seconds without a step before a worker exits (train.py's --watchdog)


@pytest.mark.cluster
@needs_namespaces
@pytest.mark.timeout(340)
@pytest.mark.parametrize("example,seed,last,restarts,train_args", [
    # the other worker trains on while the chief restarts: 3000 steps leave the chief time to
    # rejoin before the ps goes; after it the run goes on from the chief's last checkpoint
    ("Hogwild", 0, "ps0", ["worker0@step2000", "ps0@step5000"], ["--steps", "8000"]),
    # DOWNPOUR's global step counts pushes, a window of 5 mini-batches each: 2400 in all
    ("DOWNPOUR", 7, "worker1", ["worker1@step1000"], ["--steps", "12000"]),
    # Sync-SGD's counts rounds, a mini-batch of each worker each: 4000 in all. A round waits
    # --step_timeout for a restarted worker, which may take a while to load (no round passes
    # meanwhile); the restarted chief drops the round its predecessor may have left half done,
    # and starts the token thread again
    ("Sync-SGD", 7, "worker1", ["worker1@step1000", "worker0@step2000", "ps0@step3000"],
     ["--steps", "8000", "--step_timeout", "120"]),
])
def test_tasks_that_restart_rejoin_and_the_run_trains_to_the_bar(
        example, seed, last, restarts, train_args, tmp_path):
    restart_flags = [flag for text in restarts for flag in ("--restart", text)]
    proc = start_tool([example, "--stagger", "10", "--seed", str(seed)] + restart_flags +
                      ["--restart_failed", "2", "--timeout", "280",
                       "--log_dir", str(tmp_path / "logs"), "--", "--log_every", "500",
                       "--watchdog", str(WATCHDOG)] + train_args)
    try:
        run = finish(proc, timeout=310)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 0, run.output[-3000:]
    roles = [text.split("@")[0] for text in restarts]
    # a worker that the watchdog ended is started again; nothing else may fail
    again = re.findall(r"\[cluster\] (\w+) \(exit 2\) failed: starting it again", run.output)
    watchdog = re.findall(r"\[(\w+)\] error: \w+ completed no step for %g s \(--watchdog\)"
                          % WATCHDOG, run.output)
    assert sorted(again) == sorted(watchdog), run.output[-3000:]
    order = re.findall(r"\[cluster\] started (\w+) pid=", run.output)
    assert order[2] == last, order  # the late task, then the restarts
    assert sorted(order[3:]) == sorted(roles + again), order
    for text, role in zip(restarts, roles):
        assert "[cluster] restart %s at global step %s (+" % (role, text.split("@step")[1]) \
            in run.output, run.output[-3000:]
    chief = summary_of(run.output, "worker0")
    assert float(chief["test_accuracy"]) >= ACCURACY_BAR, chief
    assert chief["lost_workers"] == "0", chief  # every restarted worker came back and finished
    if "worker0" in roles:  # not rolled back to its checkpoint: the ps kept the variables
        assert "[worker0] resuming at global step" in run.output
        if example == "Sync-SGD":  # and it dropped the round that its restart interrupted
            assert re.search(r"\[worker0\] the round at global step \d+ is dropped", run.output)
    if "ps0" in roles:  # the chief restored the variables, and every worker took the run up
        assert "[worker0] resuming from the checkpoint at global step" in run.output
        for worker in ("worker0", "worker1"):
            assert "[%s] lost a step to a restart" % worker in run.output, run.output[-3000:]
    assert run.output.count("[ps0] the run is over; shutting down") == 1


@pytest.mark.cluster
@needs_namespaces
@pytest.mark.parametrize("example,chief,hosts", [
    ("ParameterServerStrategy", "chief0", ["chief0", "ps0", "worker0", "worker1"]),
    ("MultiWorkerMirroredStrategy", "worker0", ["worker0", "worker1"])])
def test_tensorflow_2s_strategies_run_with_their_own_tasks_each_on_its_own_host(
        example, chief, hosts, tmp_path):
    metrics_file = tmp_path / "metrics.json"
    proc = start_tool([example, "--workers", "2", "--timeout", "150",
                       "--log_dir", str(tmp_path / "logs"), "--metrics_file", str(metrics_file)])
    try:
        run = finish(proc, timeout=180)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 0, run.output[-3000:]
    assert sorted(started_pids(run.output)) == hosts
    summary = summary_of(run.output, chief)  # the coordinator reports, or worker 0
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR, summary
    assert summary["workers"] == "2" and summary["lost_workers"] == "0", summary
    if chief == "chief0":  # the coordinator is the last host; its servers end once it has
        for role in ("ps0", "worker0", "worker1"):
            assert "[%s] 10.77.0.4:2222 is gone; shutting down" % role in run.output, role
    assert "[cluster] all processes finished" in run.output

    report = summary_of(run.output, "cluster")
    assert report["exit"] == "0"
    assert int(report["mini_batches"]) == sum(int(s) for s in summary["local_steps"].split(","))
    with open(metrics_file) as f:
        metrics = json.load(f)
    assert metrics["example"] == example
    assert sorted(metrics["cluster"]["hosts"]) == hosts
    assert all(h["sent_bytes"] > 0 and h["received_bytes"] > 0
               for h in metrics["cluster"]["hosts"].values()), metrics["cluster"]["hosts"]


# ==================================================================================================
# The bandwidth limit, on a network made without a training run
# ==================================================================================================
RECEIVER = """
import socket, sys
server = socket.socket()
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen(1)
server.settimeout(20)
print("ready", flush=True)
connection, _ = server.accept()
connection.settimeout(20)
received = 0
while True:
    data = connection.recv(1 << 16)
    if not data:
        break
    received += len(data)
connection.sendall(b"k")  # all of it arrived: the sender's clock stops
print(received, flush=True)
"""

SENDER = """
import socket, sys, time
size = int(sys.argv[3])
started = time.time()
connection = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
connection.sendall(b"x" * size)
connection.shutdown(socket.SHUT_WR)
assert connection.recv(1) == b"k"
print(size * 8 / (time.time() - started), flush=True)
"""


def transfer_rate(network, source, destination, size, marker):
    """Send size bytes from one host of the network to another; return the rate in bit/s."""
    address, port = network.address(destination), 5001
    run_in = lambda host, script, *args: [
        "ip", "netns", "exec", network.namespace(host), sys.executable, "-c", script,
        address, str(port)] + list(args) + [marker]
    receiver = subprocess.Popen(run_in(destination, RECEIVER), stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([receiver.stdout], [], [], 20)  # bounded: a hung receiver
        assert ready and receiver.stdout.readline().strip() == "ready"
        sent = subprocess.run(run_in(source, SENDER, str(size)), capture_output=True, text=True,
                              timeout=30)
        assert sent.returncode == 0, sent.stderr
        assert receiver.wait(timeout=10) == 0
        assert int(receiver.stdout.read()) == size
        return float(sent.stdout)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


@pytest.mark.cluster
@needs_namespaces
def test_a_bandwidth_limit_holds_each_way_of_a_link_and_is_gone_without_it(tmp_path):
    prefix, limit, size = "dtfgtest%d" % os.getpid(), 20 * 10 ** 6, 4 * 10 ** 6
    try:
        with cluster_tool.Network(prefix, ["a", "b"], rate=limit) as network:
            shown = subprocess.run(["tc", "-n", network.namespace("a"), "qdisc", "show", "dev",
                                    "eth0"], capture_output=True, text=True, timeout=10).stdout
            assert "tbf" in shown and "rate 20Mbit" in shown, shown
            both_limits = transfer_rate(network, "a", "b", size, str(tmp_path))
            back = transfer_rate(network, "b", "a", size, str(tmp_path))
            # without a's own egress limit, b's port in the switch still limits what b receives
            subprocess.run(["tc", "-n", network.namespace("a"), "qdisc", "del", "dev", "eth0",
                            "root"], check=True, timeout=10)
            receive_limit_only = transfer_rate(network, "a", "b", size, str(tmp_path))
        assert not namespaces_with_prefix(prefix)
        with cluster_tool.Network(prefix, ["a", "b"], rate=None) as network:
            unlimited = transfer_rate(network, "a", "b", size, str(tmp_path))
    finally:
        assert_nothing_left(str(tmp_path))
        left = namespaces_with_prefix(prefix)
        for name in left:
            subprocess.run(["ip", "netns", "delete", name], timeout=10)
    assert not left, left
    for rate in (both_limits, back, receive_limit_only):
        assert 0.5 * limit <= rate <= 1.2 * limit, (both_limits, back, receive_limit_only)
    assert unlimited > 5 * limit, unlimited


def test_a_staggered_start_is_seeded_within_its_bound_and_a_restart_comes_after_the_starts():
    roles = ["ps0", "worker0", "worker1"]
    schedule = cluster_tool.start_schedule(roles, 10, 0, ["worker0@30"])
    assert schedule == cluster_tool.start_schedule(roles, 10, 0, ["worker0@30"])  # seeded
    assert schedule != cluster_tool.start_schedule(roles, 10, 1, ["worker0@30"])
    starts = [(at, role) for at, kind, role in schedule if kind == "start"]
    assert sorted(role for _, role in starts) == roles and all(0 <= at <= 10 for at, _ in starts)
    assert schedule[-1] == (30.0, "restart", "worker0")
    assert [at for at, _, _ in schedule] == sorted(at for at, _, _ in schedule)
    assert cluster_tool.start_schedule(roles, 0, 5, []) == [(0.0, "start", r) for r in roles]


def test_restarts_at_a_global_step_come_in_order_of_step_and_apart_from_the_timed_ones():
    roles = ["ps0", "worker0", "worker1"]
    restarts = ["ps0@step9000", "worker1@20", "worker0@step3000"]
    assert cluster_tool.step_schedule(roles, restarts) == [(3000, "worker0"), (9000, "ps0")]
    timed = cluster_tool.start_schedule(roles, 0, 0, restarts)
    assert [(at, kind, role) for at, kind, role in timed if kind == "restart"] == [
        (20.0, "restart", "worker1")]


@pytest.mark.parametrize("restart", ["worker5@30", "worker0", "worker0@soon", "chief0@3",
                                     "worker0@step", "worker0@step0", "ps0@step-5"])
def test_a_restart_of_no_task_of_the_run_is_refused_in_one_line(restart):
    proc = subprocess.run([sys.executable, CLUSTER_PY, "Hogwild", "--restart", restart],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: --restart %s: give ROLE@SECONDS or ROLE@stepN with ROLE one of ps0, worker0, "
        "worker1, such as worker0@60 or worker0@step2000" % restart]


def test_tbf_sizes_are_sane_at_low_and_high_rates():
    for rate in (10 ** 6, 20 * 10 ** 6, 100 * 10 ** 6, 10 ** 9, 10 ** 10):
        burst, limit = cluster_tool.tbf_sizes(rate)
        assert burst >= 20 * 1500  # some full-size packets at any rate
        assert burst >= rate / 8 * 0.004  # a 4 ms timer tick's worth of tokens at high rates
        assert limit > burst and (limit - burst) / (rate / 8) == pytest.approx(0.05, abs=1e-3)
    assert cluster_tool.parse_rate("20mbit") == 20 * 10 ** 6
    assert cluster_tool.parse_rate("1gbit") == 10 ** 9
    assert cluster_tool.parse_rate("unlimited") is None


def test_the_bound_is_the_busiest_direction_of_the_busiest_link_over_its_rate():
    roles = ["ps0", "worker0", "worker1"]
    before = {r: (1000, 1000) for r in roles}  # counters before the run are taken off
    after = {"ps0": (1000 + 4 * 10 ** 6, 1000 + 5 * 10 ** 6),
             "worker0": (1000 + 2 * 10 ** 6, 1000 + 2 * 10 ** 6),
             "worker1": (1000 + 3 * 10 ** 6, 1000 + 2 * 10 ** 6)}
    summary = {"local_steps": [60, 40, -1], "steps_per_sec": 4.0}  # -1: a lost worker
    report = cluster_tool.traffic_report(roles, before, after, summary, 8 * 10 ** 6)
    assert report["total_bytes"] == 9 * 10 ** 6
    assert report["busiest_link"] == {"host": "ps0", "direction": "received", "bytes": 5 * 10 ** 6}
    assert report["mini_batches"] == 100 and report["bytes_per_mini_batch"] == 9 * 10 ** 4
    # 5 MB at 8 Mbit/s (1 MB/s) take at least 5 s: at most 100 / 5 = 20 mini-batches/s
    assert report["bound_seconds"] == pytest.approx(5.0)
    assert report["bound_mini_batches_per_sec"] == pytest.approx(20.0)
    assert report["fraction_of_bound"] == pytest.approx(0.2)
    unlimited = cluster_tool.traffic_report(roles, before, after, summary, None)
    assert "bound_mini_batches_per_sec" not in unlimited and "fraction_of_bound" not in unlimited
    coordinated = cluster_tool.traffic_report(  # a coordinator's summary: no count per worker
        roles, before, after, {"mini_batches": 90, "steps_per_sec": 4.0}, 8 * 10 ** 6)
    assert coordinated["bytes_per_mini_batch"] == 10 ** 5
    assert coordinated["fraction_of_bound"] == pytest.approx(4.0 / 18)


# ==================================================================================================
# Interruptions and failures leave nothing behind
# ==================================================================================================
@pytest.mark.cluster
@needs_namespaces
def test_ctrl_c_mid_run_stops_every_task_and_removes_every_namespace(tmp_path):
    proc = start_tool(["Hogwild", "--log_dir", str(tmp_path / "logs"), "--timeout", "120",
                       "--", "--steps", "1000000", "--log_every", "50"])
    try:
        seen = read_until(proc, "[worker1] local_step=", timeout=120)
        pids = started_pids(seen)
        assert sorted(pids) == ["ps0", "worker0", "worker1"]
        assert len(namespaces_with_prefix("dtfg%d" % proc.pid)) == 4  # 3 hosts and the switch
        own_net = os.readlink("/proc/self/ns/net")
        nets = {os.readlink("/proc/%d/ns/net" % pid) for pid in pids.values()}
        assert len(nets) == 3 and own_net not in nets  # three hosts, none of them this one's
        for role, pid in pids.items():  # set up by TF_CONFIG alone, no cluster flags
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            task = json.loads(env[b"TF_CONFIG"])["task"]
            assert "%s%d" % (task["type"], task["index"]) == role
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                assert b"--job_name" not in f.read()
        os.killpg(proc.pid, signal.SIGINT)
        run = finish(proc, timeout=60)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 128 + signal.SIGINT, run.output[-3000:]
    assert "[cluster] interrupted by SIGINT: stopping every task" in run.output
    for pid in pids.values():
        assert not os.path.exists("/proc/%d" % pid)


@pytest.mark.cluster
@needs_namespaces
def test_ctrl_c_while_the_namespaces_are_made_removes_the_ones_made_so_far(tmp_path):
    proc = start_tool(["Hogwild", "--bandwidth", "20mbit", "--log_dir", str(tmp_path / "logs")])
    try:
        read_until(proc, "[cluster] 1 ps + 2 worker(s)", timeout=30)  # printed just before
        os.killpg(proc.pid, signal.SIGINT)
        run = finish(proc, timeout=60)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 128 + signal.SIGINT, run.output[-3000:]
    assert "[cluster] interrupted by SIGINT: stopping every task" in run.output
    assert "error:" not in run.output  # the signal is reported, not the command it cut short


@pytest.mark.cluster
@needs_namespaces
def test_a_worker_killed_mid_run_fails_the_run_and_leaves_nothing(tmp_path):
    proc = start_tool(["Hogwild", "--log_dir", str(tmp_path / "logs"), "--timeout", "120",
                       "--", "--steps", "1000000", "--log_every", "50"])
    try:
        seen = read_until(proc, "[worker1] local_step=", timeout=120)
        os.kill(started_pids(seen)["worker1"], signal.SIGKILL)
        killed_at = time.time()
        run = finish(proc, timeout=60)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 1, run.output[-3000:]
    assert "[cluster] failed: worker1 (killed by SIGKILL); stopping the cluster" in run.output
    assert time.time() - killed_at < 30  # stopped at once, not after the training budget
    # the bytes are reported for a failed run too, without figures per mini-batch
    assert summary_of(run.output, "cluster")["exit"] == "1"


@pytest.mark.cluster
@needs_namespaces
def test_a_bad_train_flag_fails_the_run_and_leaves_nothing(tmp_path):
    # --restart_failed 2: the first two tasks that fail start again (and fail again), as a
    # restart policy would start them; the next failure ends the run
    proc = start_tool(["DOWNPOUR", "--log_dir", str(tmp_path / "logs"), "--timeout", "60",
                       "--restart_failed", "2", "--", "--steps", "0"])
    try:
        run = finish(proc, timeout=90)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 1, run.output[-3000:]
    assert "error: --steps must be positive, got 0" in run.output
    again = re.findall(r"\[cluster\] \w+ \(exit 2\) failed: starting it again "
                       r"\(--restart_failed: (\d) more\)", run.output)
    assert again == ["1", "0"], run.output[-3000:]
    assert "[cluster] failed: " in run.output


# ==================================================================================================
# A machine that cannot: one line, exit 2, nothing made
# ==================================================================================================
def run_tool_briefly(command, env=None):
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd="/", env=env)
    return done.returncode, done.stdout, done.stderr


def test_without_ip_on_path_one_error_line_and_exit_2(tmp_path):
    # PATH holds only an empty folder: the tool cannot find `ip` (nor anything else)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    code, out, err = run_tool_briefly([sys.executable, CLUSTER_PY, "Hogwild"],
                                      env=dict(os.environ, PATH=str(empty)))
    assert code == 2 and out == ""
    expected = ("error: `ip` (iproute2) was not found on PATH" if os.geteuid() == 0
                else "error: creating network namespaces needs root: run it with sudo")
    assert err.splitlines() == [expected]


def test_an_example_without_parameter_servers_refuses_ps_in_one_line():
    code, out, err = run_tool_briefly([sys.executable, CLUSTER_PY, "MultiWorkerMirroredStrategy",
                                       "--ps", "1"])
    assert code == 2 and out == ""
    assert err.splitlines() == ["error: MultiWorkerMirroredStrategy has no parameter servers: "
                                "leave out --ps"]


def test_the_baseline_is_refused_in_one_line():
    code, out, err = run_tool_briefly([sys.executable, CLUSTER_PY, "Non-Distributed-Setup"])
    assert code == 2 and out == ""
    assert err.splitlines() == ["error: Non-Distributed-Setup/train.py is not distributed: it "
                                "does not read TF_CONFIG"]


def test_without_root_one_error_line_and_exit_2(monkeypatch, capsys):
    # The tool's own check, in this process, as a user other than root would meet it. (Running
    # it as a real other user fails earlier where the virtual environment is private to root,
    # as it is in a fresh CI clone.)
    spec = importlib.util.spec_from_file_location("cluster_tool", CLUSTER_PY)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(tool.os, "geteuid", lambda: 1000)
    assert tool.main(["Hogwild", "--bandwidth", "20mbit"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["error: creating network namespaces needs root: run it with sudo"]


# ==================================================================================================
# --cpus: every host capped at C cores by a cgroup CPU quota of its own
# ==================================================================================================
def cgroups_with_prefix(prefix):
    found = []
    for root in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup"):
        if os.path.isdir(root):
            found += [os.path.join(root, d) for d in os.listdir(root) if d.startswith(prefix)]
    return found


def missing_for_quotas():
    if os.geteuid() != 0:
        return "cgroups need root"
    if os.path.isfile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):  # v1
        return None
    v2 = cluster_tool.read_text("/sys/fs/cgroup/cgroup.controllers").split()
    return None if "cpu" in v2 else "no cgroup cpu controller (v1 or v2) on this machine"


needs_quotas = pytest.mark.skipif(missing_for_quotas() is not None,
                                  reason=missing_for_quotas() or "")


@needs_quotas
def test_a_busy_task_capped_at_a_quarter_core_uses_at_most_about_a_quarter_core():
    prefix = "dtfgq%d" % os.getpid()
    quotas = cluster_tool.CpuQuotas(prefix, ["busy"], 0.25)
    try:
        quotas.create()
        busy = "import time\nend = time.time() + 3\nwhile time.time() < end:\n    pass\n"
        started = time.time()
        subprocess.run(quotas.join_command("busy") + [sys.executable, "-c", busy], timeout=60,
                       check=True)
        wall = time.time() - started
        used = quotas.cpu_seconds("busy")  # read from the group: it counts only its processes
    finally:
        problems = quotas.remove()
    assert used / wall <= 0.3, "%.2f CPU seconds in %.2f s" % (used, wall)
    assert used / wall > 0.05, "the loop did not run in its group"  # uncapped it takes a core
    assert problems == [] and cgroups_with_prefix(prefix) == []


def test_more_cores_than_the_machine_has_are_refused_before_anything_is_made():
    cores = os.cpu_count()  # three hosts of all its cores each
    code, out, err = run_tool_briefly([sys.executable, CLUSTER_PY, "Hogwild", "--cpus",
                                       str(cores)])
    assert code == 2 and out == ""
    assert err.splitlines() == ["error: 3 hosts x %d cores = %d cores, more than this machine's "
                                "%d: give --cpus %g or less" % (cores, 3 * cores, cores,
                                                                cores / 3)]


@pytest.mark.cluster
@needs_namespaces
@needs_quotas
def test_hosts_with_a_cpu_quota_train_and_leave_no_cgroup(tmp_path):
    proc = start_tool(["Distributed-Setup", "--cpus", "0.5", "--timeout", "150",
                       "--log_dir", str(tmp_path / "logs"), "--", "--steps", "300"])
    try:
        run = finish(proc, timeout=180)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 0, run.output[-3000:]
    assert "CPU 0.5 core(s) per host (a cgroup CPU quota of its own)" in run.output
    report = summary_of(run.output, "cluster")
    assert report["cpus_per_host"] == "0.5"
    used = re.search(r"CPU seconds used, per host \(each capped at 0.5 cores\): ps0 ([\d.]+), "
                     r"worker0 ([\d.]+), worker1 ([\d.]+)", run.output)
    assert used, run.output[-2000:]
    assert all(float(seconds) <= 0.5 * run.seconds + 1 for seconds in used.groups()), used
    assert all(float(seconds) > 0 for seconds in used.groups()), used
    assert cgroups_with_prefix("dtfg%d-" % proc.pid) == []
