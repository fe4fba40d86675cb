"""benchmarks/cluster.py, which puts every task on a host of its own in a network namespace: the
tool started, and no process and no namespace of its run left. Making namespaces needs root, ip
and tc; a test that makes them is marked needs_namespaces, and skips with the reason otherwise."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from support.examples import ROOT
from support.processes import assert_nothing_left, interruptible

CLUSTER_PY = os.path.join(ROOT, "benchmarks", "cluster.py")


def missing_for_namespaces():
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc") if not shutil.which(tool)]
    return "not found on PATH: %s" % ", ".join(missing) if missing else None


needs_namespaces = pytest.mark.skipif(missing_for_namespaces() is not None,
                                      reason=missing_for_namespaces() or "")


def namespaces_with_prefix(prefix):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split()[0] for line in out.stdout.splitlines()
            if line.startswith(prefix + "-")]


def start_tool(args, env=None):
    """cluster.py in its own session (SIGINT at its default), so a test can always stop it all."""
    return subprocess.Popen([sys.executable, CLUSTER_PY] + list(args), cwd=ROOT,
                            env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=interruptible)


def assert_run_left_nothing(proc, tmp_path):
    """No process of the run (their command lines hold tmp_path) and none of its namespaces."""
    if proc.poll() is None:  # a test that failed half-way: let the tool clean up first
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        assert_nothing_left(str(tmp_path))
    finally:
        left = namespaces_with_prefix("dtfg%d" % proc.pid)
        for name in left:  # remove them anyway, so one failure does not spoil the machine
            subprocess.run(["ip", "netns", "delete", name], timeout=10)
        assert not left, "namespaces left behind: %s" % left


def namespaces_of_runs(logs):
    """The namespaces the cluster.py runs logged in logs named (dtfg<pid>-<role>), still there."""
    prefixes = set()
    for name in (os.listdir(logs) if os.path.isdir(logs) else []):
        if name.endswith(".log"):
            with open(os.path.join(logs, name)) as f:
                prefixes.update(re.findall(r"namespace (dtfg\d+)-<role>", f.read()))
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=10).stdout.split()
    return prefixes, [n for n in listed if n.split("-")[0] in prefixes]


def assert_runs_left_nothing(tmp_path, logs):
    """No process of the test's runs and none of their namespaces (removed anyway, so that one
    failure does not spoil the machine); returns the namespace prefixes the runs used."""
    try:
        assert_nothing_left(str(tmp_path))
    finally:
        prefixes, left = namespaces_of_runs(str(logs))
        for name in left:
            subprocess.run(["ip", "netns", "delete", name], timeout=10)
    assert not left, "namespaces left behind: %s" % left
    return prefixes
