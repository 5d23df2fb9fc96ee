"""The real NeMo 2.2.1 capture: LoRA fine-tuning of Llama 2 7B (random weights, megatron-core's local
layer spec) on one H200 under Nsight Systems 2025.3.1, through sftprof's launch path
(tests/fixtures/nemo/README.md). What sftprof reads from it."""

import csv
import re
import shutil

from sftprof.trace.load import load_trace

from conftest import NEMO_CAPTURE, NEMO_DEFAULT_WINDOW, as_nsys_rows, run_sftprof


def test_the_steps_of_nsys_callbacks_window_are_the_captured_ones(nemo):
    """NsysCallback was given (2, 4) for the inclusive window 2..3: the capture holds steps 2 and 3 (the
    `step N` ranges the backend writes), so the end_step + 1 it is given is right."""
    assert list(nemo.tables["steps"]["step"]) == [2, 3]


def test_a_child_process_saying_no_cuda_is_not_a_capture_without_cuda(nemo):
    """nsys writes "No CUDA/NVTX events collected" for NeMo's processes that used neither; only cuDNN,
    traced but never called here, recorded nothing."""
    notes = [f for f in nemo.findings if f.rule == "empty_trace_kind"]
    assert len(notes) == 1 and "cuDNN" in notes[0].title and "CUDA," not in notes[0].title
    assert nemo.headline["kernels"] > 10_000 and nemo.headline["nvtx_ranges"] > 100_000


def test_headline_and_mfu_from_nemos_own_metrics(nemo):
    assert nemo.headline["top_kernel"].startswith("nvjet_sm90")  # a Hopper GEMM
    assert 0 < nemo.headline["mfu_pct"] < 100
    assert nemo.headline["bound_class"] and nemo.findings[0].gain_pct is not None


def test_where_syncs_were_made_is_said_by_op_not_by_emit_nvtx_call(nemo):
    """emit_nvtx names each op's range once per call (`aten::_local_scalar_dense, op_id = 105310`): the
    finding counts the calls by op, so it names the op (.item()) that most of them came from."""
    (sync,) = [f for f in nemo.findings if f.rule == "sync_in_steps"]
    where = re.search(r"mostly in NVTX `([^`]+)` \((\d+) of (\d+)\)", sync.evidence)
    assert where and "op_id" not in where.group(1)
    assert int(where.group(2)) > int(where.group(3)) / 2


def test_emit_nvtx_ranges_are_named_by_op(nemo_sqlite):
    """Every emit_nvtx range has a name of its own (its op_id): read, they are named by op."""
    names = load_trace(nemo_sqlite).nvtx["name"]
    assert len(names.cat.categories) < len(names) / 100
    assert "aten::mm" in set(names.cat.categories) and not names.astype(str).str.contains("op_id =").any()


def test_suggest_offers_the_run_no_knob_its_stack_cannot_take(nemo_sqlite, tmp_path):
    """The capture is launch-bound, whose NeMo remedy is CUDA graphs; the run facts of the same configuration
    run again on the H200 say `layer_spec: local` (no Transformer Engine, where NeMo's graphs assert TE), so
    suggest proposes nothing and says why (tests/fixtures/nemo/README.md)."""
    window = tmp_path / "steady"
    (window / "capture").mkdir(parents=True)
    rerun = NEMO_CAPTURE.parent / "h200_nemo_lora_llama2_7b.rerun.metrics.jsonl"
    shutil.copy(rerun, window / "capture" / "profile.rank0.metrics.jsonl")
    analysis = run_sftprof("analyze", str(nemo_sqlite), "--metrics", str(rerun), "-o", str(window / "analysis"))
    assert analysis.returncode == 0, analysis.stderr
    result = run_sftprof("suggest", str(window))
    assert result.returncode == 0, result.stderr
    assert "nothing to try" in result.stdout and "variants:" not in result.stdout
    assert "# Not suggested, launch_bound: `cuda-graphs`" in result.stdout and "layer_spec local" in result.stdout


def test_the_h100_captures_kernel_and_memory_summaries_are_nsys_stats(nemo_default_window):
    """On the second NeMo capture (H100, the default window) the kernel and memory-operation summaries equal what
    nsys 2025.3.1's own `stats` printed of the same export on the GPU machine, every row and column, in its order."""
    _, analysis = nemo_default_window
    for table, report, key in (
        ("kernels_by_name", "cuda_gpu_kern_sum", "kernel"),
        ("memops", "cuda_gpu_mem_time_sum", "operation"),
    ):
        with open(NEMO_DEFAULT_WINDOW.with_name(f"{NEMO_DEFAULT_WINDOW.name}.{report}.csv")) as printed:
            theirs = [tuple(row.values()) for row in csv.DictReader(printed)]
        ours = analysis.tables[table]
        assert as_nsys_rows(ours, [key]) == set(theirs) and len(ours) == len(theirs) >= 4
        assert list(ours[key]) == [row[-1] for row in theirs]
