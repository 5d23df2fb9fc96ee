"""Recomputation (analysis/recompute.py): forward runs that another thread launches again in the same step, and
forward passes that no backward follows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sftprof.analysis import idle, recompute
from sftprof.pipeline import analyze_trace

FIXTURES = Path(__file__).parent / "fixtures"


def step(forward: list[int], backward: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """One step's kernels in launch order: the forward from thread 1, then the backward from thread 2."""
    tids = np.array([1] * len(forward) + [2] * len(backward))
    return tids, np.array(forward + backward, dtype=np.uint64)


def test_a_forward_run_launched_again_from_another_thread_is_marked():
    layer = list(range(100, 100 + recompute.RUN + 3))
    tids, shape = step(layer + layer + [1, 2], [7, 8] + layer + [9, 10, 11])
    marked = recompute._repeated(tids, shape)
    assert not marked[tids == 1].any()
    assert marked.sum() == len(layer)
    assert np.array_equal(np.flatnonzero(marked), np.arange(len(layer)) + 2 * len(layer) + 2 + 2)


def test_shorter_runs_and_the_same_thread_are_not_recomputation():
    layer = list(range(100, 100 + recompute.RUN))
    tids, shape = step(layer + layer, layer[:-1] + [5] + layer[1:])  # one kernel differs: no full run repeats
    assert not recompute._repeated(tids, shape).any()
    tids = np.ones(2 * len(layer), dtype=int)
    assert not recompute._repeated(tids, np.array(layer + layer, dtype=np.uint64)).any()


def test_two_processes_launching_the_same_forward_are_not_recomputation():
    """Two ranks captured in one report: each process's main thread launches the same forward in the same step;
    only a second thread of one process launching it again is recomputation."""
    layer = list(range(100, 100 + recompute.RUN))
    rank0, rank1, rank1_backward = (7 << 24) | 1, (8 << 24) | 1, (8 << 24) | 2
    tids = np.array([rank0] * len(layer) + [rank1] * len(layer) + [rank1_backward] * len(layer))
    marked = recompute._repeated(tids, np.array(layer * 3, dtype=np.uint64))
    assert marked.tolist() == [False] * 2 * len(layer) + [True] * len(layer)


def test_a_stretch_of_recomputation_is_handed_back_at_the_threads_next_launch():
    """The host's stretch of recomputation starts where the launch before the run returned and ends where the
    run's last launch returned; it is handed back where the launch after it starts (the hand-off back to the
    backward pass is the checkpoint's too), or, for a run that ends the thread's launches, where it ended."""
    tids = np.array([2, 2, 2, 2, 2, 2])
    launched = np.array([0, 100, 200, 300, 900, 1000])
    returned = launched + 10
    repeated = np.array([False, True, True, False, True, True])
    stretches = recompute._host_stretches(tids, launched, returned, repeated)
    assert stretches[["start", "end", "handed_back"]].values.tolist() == [[10, 210, 300], [310, 1010, 1010]]


def test_host_time_before_a_repeated_kernel_becomes_recomputation():
    """Pieces cut from an idle piece that ended in a recomputed kernel move to `recomputation` where the thread
    was in host overhead or host work; a synchronization there keeps its own cause, other pieces are untouched."""
    host, work, sync = (idle.CAUSE_NAMES.index(c) for c in (idle.HOST_OVERHEAD, idle.HOST_WORK, idle.SYNCHRONIZATION))
    p_start = np.array([0, 100, 200])  # three idle pieces; the second ended in a repeated kernel
    again = np.array([False, True, False])
    starts = np.array([0, 100, 140, 170, 200])  # cut by calls: the second piece into three
    causes = np.array([host, host, sync, work, host])
    pieces = idle._Pieces(np.zeros(5), causes, np.zeros(5), np.zeros(5), np.zeros(5), starts, np.full(5, 10))
    moved = pieces.recomputing(p_start, again).columns[1]
    recomputation = idle.CAUSE_NAMES.index(idle.RECOMPUTATION)
    assert moved.tolist() == [host, recomputation, sync, recomputation, host]


DROPOUT = 90  # the kernel id that stands for dropout's: a model in train mode only launches it


def passes(*parts: tuple[int, list[int]]) -> tuple[int, int, int, int]:
    """recompute._passes over one step launched in `parts` (thread, kernels) in order, each kernel taking 10 ns."""
    tids = np.concatenate([np.full(len(kernels), tid) for tid, kernels in parts])
    shape = np.concatenate([np.array(kernels, dtype=np.uint64) for _, kernels in parts])
    return recompute._passes(tids, shape, np.full(len(tids), 10), shape == DROPOUT)


LAYER = list(range(100, 100 + recompute.RUN))
FORWARD = [1, 2] + LAYER * 3 + [3, 4]  # embedding, three layers, head and loss
BACKWARD = [5] + list(range(200, 200 + recompute.RUN)) * 3 + [6]
OPTIMIZER = [7, 8, 9]


def test_a_forward_no_backward_follows_is_counted_with_its_kernels():
    """An evaluation forward after the optimizer: two forward passes for one backward; the extra pass is as many
    kernels as the first forward."""
    assert passes((1, FORWARD), (2, BACKWARD), (1, OPTIMIZER + FORWARD)) == (2, 1, len(FORWARD), 10 * len(FORWARD))


def test_accumulation_and_a_plain_step_have_no_extra_forward():
    """Two micro-batches (forward, backward, forward, backward) make two passes of each; one pass of each is a plain
    step; and a thread alone (no backward thread) is not counted."""
    assert passes((1, FORWARD), (2, BACKWARD), (1, FORWARD), (2, BACKWARD), (1, OPTIMIZER))[2:] == (0, 0)
    assert passes((1, FORWARD), (2, BACKWARD), (1, OPTIMIZER)) == (1, 1, 0, 0)
    assert passes((1, FORWARD + OPTIMIZER + FORWARD)) == (0, 0, 0, 0)


def test_a_frozen_forward_before_the_trained_one_is_a_pass_of_its_own():
    """A teacher's forward launched just before the student's: the first forward holds two passes, told apart by the
    spacing of their layers' runs (the teacher's head and the student's embedding between them). The teacher's pass
    is extra, its kernels up to the student's first; a shallower teacher (4 layers for the student's 8) too."""
    deep = [1, 2] + LAYER * 8 + [3, 4]
    assert passes((1, deep + deep), (2, BACKWARD), (1, OPTIMIZER)) == (2, 1, len(deep), 10 * len(deep))
    shallow = [1, 2] + LAYER * 4 + [3, 4]
    assert passes((1, shallow + deep), (2, BACKWARD), (1, OPTIMIZER)) == (2, 1, len(shallow), 10 * len(shallow))


def test_a_frozen_model_with_other_kernels_and_a_layer_with_two_runs_are_passes_of_their_own():
    """A teacher in eval mode runs other kernels than the trained model (no dropout): its layers' own runs repeat in
    the first forward, so it is a pass; a layer whose run comes twice, at alternating distances, is still one pass;
    and a few repeated kernels before the first layer (a mask) are none."""
    teacher = [1, 2] + list(range(300, 300 + recompute.RUN)) * 8 + [3, 4]
    deep = [1, 2] + LAYER * 8 + [3, 4]
    assert passes((1, teacher + deep), (2, BACKWARD), (1, OPTIMIZER)) == (2, 1, len(teacher), 10 * len(teacher))
    layer = LAYER + [50] + LAYER + [51, 52]
    assert passes((1, [1, 2] + layer * 3 + [3, 4]), (2, BACKWARD), (1, OPTIMIZER)) == (1, 1, 0, 0)
    assert passes((1, [9, 8] * 6 + deep), (2, BACKWARD), (1, OPTIMIZER)) == (1, 1, 0, 0)


def test_an_evaluation_in_eval_mode_repeats_the_training_forwards_layers_without_dropout():
    """The trained model runs dropout in each layer, its evaluation after the optimizer none (eval mode): with
    dropout's kernels left out, the evaluation's layers are the training forward's, and it is an extra pass."""
    trained = [1, 2] + (LAYER[:6] + [DROPOUT] + LAYER[6:] + [DROPOUT]) * 3 + [3, 4]
    assert passes((1, trained), (2, BACKWARD), (1, OPTIMIZER + FORWARD)) == (2, 1, len(FORWARD), 10 * len(FORWARD))


def test_in_sorted_finds_exact_starts():
    assert idle._in_sorted(np.array([5, 7, 12, -1]), np.array([3, 7, 12])).tolist() == [False, True, True, False]
    assert not idle._in_sorted(np.array([5]), np.zeros(0, "int64")).any()


@pytest.mark.parametrize("capture", ["h200_sft_clean", "h200_tiny_llama_bf16", "h200_sft_foreach_adamw"])
def test_captures_without_checkpointing_show_none(capture):
    result = analyze_trace(FIXTURES / f"{capture}.sqlite", None)
    assert result.tables is not None
    assert "recomputation" not in {f.rule for f in result.findings}


def test_nemo_shows_none(nemo):
    """NeMo's LoRA recipe recomputes nothing; its backward repeats runs of up to 4 of the forward's kernels
    (rotary embedding), fewer than recompute.RUN."""
    assert "recomputation" not in {f.rule for f in nemo.findings}
