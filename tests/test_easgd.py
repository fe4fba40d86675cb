"""EASGD: in each synchronous round the workers and the centre pull towards each other; the
centre becomes (1 - beta) * centre + beta * mean of the workers."""
import numpy as np
import pytest

from support.checks import assert_every_worker_in_every_round
from support.examples import error_lines, load_train_module, run_train
from support.in_process import (all_at_once, assert_same, flags, sgd_step_reference, sync_workers,
                                values)

easgd = load_train_module("EASGD")


def two_workers_in_a_round(alpha, window=3):
    """Two workers, each a window of local steps on its own fixed batch, then one round together.
    Returns (centre, locals) before and after, and the global step."""
    ops, sessions = sync_workers(easgd.build_easgd, [
        flags(easgd, "--task_index", str(k), "--window", str(window), "--alpha", str(alpha))
        for k in (0, 1)])
    for s, o in zip(sessions, ops):
        for _ in range(window):
            s.run(o.local_step)
    before = (values(sessions[0], ops[0].centre),
              [values(s, o.local_params) for s, o in zip(sessions, ops)])
    all_at_once(sessions, [o.exchange for o in ops])
    after = (values(sessions[0], ops[0].centre),
             [values(s, o.local_params) for s, o in zip(sessions, ops)])
    return before, after, sessions[0].run(ops[0].global_step)


# --- The algorithm, op by op ----------------------------------------------------------------------
@pytest.mark.rule
def test_a_round_moves_the_centre_to_a_moving_average_of_the_workers():
    (centre, local), (centre_after, local_after), global_step = two_workers_in_a_round(0.3)
    beta = 2 * 0.3
    assert global_step == 1  # one round, not one per worker
    for name in centre:
        mean = (local[0][name] + local[1][name]) / 2
        assert np.abs(mean - centre[name]).max() > 1e-4, "the local steps should have moved"
        np.testing.assert_allclose(centre_after[name], (1 - beta) * centre[name] + beta * mean,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
        for k in (0, 1):  # each worker moved alpha of its distance to the centre before the round
            np.testing.assert_allclose(
                local_after[k][name], local[k][name] - 0.3 * (local[k][name] - centre[name]),
                rtol=1e-5, atol=1e-6, err_msg=name)
        # elastic symmetry: what the workers give up, the centre gains
        np.testing.assert_allclose(centre_after[name] + local_after[0][name]
                                   + local_after[1][name],
                                   centre[name] + local[0][name] + local[1][name],
                                   rtol=1e-5, atol=1e-5, err_msg=name)


def one_worker_exchange(alpha, window=3):
    """One worker alone (N = 1, so beta = alpha): a window of local steps on a fixed batch, then one
    exchange. Returns (centre, local) before and after it, and the global step."""
    [ops], [session] = sync_workers(easgd.build_easgd, [
        flags(easgd, "--window", str(window), "--alpha", str(alpha))])
    for _ in range(window):
        session.run(ops.local_step)
    before = values(session, ops.centre), values(session, ops.local_params)
    all_at_once([session], [ops.exchange])
    after = values(session, ops.centre), values(session, ops.local_params)
    return before, after, session.run(ops.global_step)


@pytest.mark.rule
@pytest.mark.parametrize("alpha", [0.3, 1.0, 0.0])
def test_an_exchange_moves_local_and_centre_alpha_of_their_difference_towards_each_other(alpha):
    (centre, local), (centre_after, local_after), global_step = one_worker_exchange(alpha)
    assert global_step == 1
    for name in centre:
        difference = local[name] - centre[name]
        assert np.abs(difference).max() > 1e-4, "the local steps should have moved %s" % name
        np.testing.assert_allclose(local_after[name], local[name] - alpha * difference,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(centre_after[name], centre[name] + alpha * difference,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    if alpha == 1.0:  # the whole difference: the two swap places
        assert_same(local_after, centre)
        assert_same(centre_after, local)
    if alpha == 0.0:  # no elastic force: the centre stays where it was, the worker trains alone
        assert_same(centre_after, centre)
        assert_same(local_after, local)


@pytest.mark.rule
def test_a_local_step_is_sgd_and_after_a_round_its_gradient_is_taken_at_the_moved_copy():
    # the one step per window where the example departs from the paper, as its docstring says
    [ops], [session] = sync_workers(easgd.build_easgd, [
        flags(easgd, "--learning_rate", "0.2", "--alpha", "0.3")])
    for _ in range(2):
        before = values(session, ops.local_params)
        session.run(ops.local_step)
        expected = sgd_step_reference(easgd, before, 0.2)
        for name, value in values(session, ops.local_params).items():
            assert np.abs(value - before[name]).max() > 1e-4, name
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
        all_at_once([session], [ops.exchange])


def test_an_alpha_that_would_carry_the_centre_past_the_mean_is_rejected():
    code, _, stderr = run_train("EASGD", ["--job_name", "worker", "--alpha", "0.6", "--ps_hosts",
                                          "localhost:1", "--worker_hosts", "localhost:2,localhost:3"])
    assert code == 2
    assert error_lines(stderr) == ["error: --alpha 0.6 with 2 workers per round moves the centre "
                                   "past their mean (beta = 1.2 > 1): use at most 0.5"]


@pytest.mark.rule
@pytest.mark.parametrize("workers,alpha", [(2, 0.3), (4, 0.15)])
def test_the_default_alpha_keeps_beta_at_0_6_for_any_number_of_workers(workers, alpha):
    args = easgd.parse_flags([], easgd.example_flags)  # --alpha not given
    easgd.settle_alpha(args, workers)  # what main does with the number of workers
    assert args.alpha == pytest.approx(alpha)


def test_backup_workers_are_refused_in_one_line():
    # a round's differences are aggregated per variable: with backups the set of workers could
    # differ from one variable to the next, and a late worker's elastic move would be lost
    code, _, stderr = run_train("EASGD", ["--job_name", "worker", "--backup_workers", "1",
                                          "--ps_hosts", "localhost:1", "--worker_hosts",
                                          "localhost:2,localhost:3,localhost:4"])
    assert code == 2 and error_lines(stderr) == ["error: " + easgd.BACKUP_WORKERS_REFUSED]
    assert "per variable" in easgd.BACKUP_WORKERS_REFUSED


# --- End to end through run.sh --------------------------------------------------------------------
def test_easgd_trains_in_rounds_of_a_window_of_steps_of_every_worker(default_runs):
    # 2000 mini-batches, 2 workers x a window of 8 a round (the bar: test_examples_end_to_end.py)
    summary = assert_every_worker_in_every_round(default_runs["EASGD"], rounds=125,
                                                 steps_per_round=8)
    assert summary["beta"] == "0.6"
