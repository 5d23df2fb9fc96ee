"""The diagnosis on an eighth family, a Mixture of Experts: a Mixtral with `batch_idx N` ranges, captured with CPU
sampling and context switches on (tests/fixtures/foreign/mixtral_blind: three problems planted before any rule was
looked at for them; mixtral_untargeted: two more that try the rules written for those on problems they were not
written for), each against the saving of its fix measured without the profiler on the same H100, read from the
committed timings."""

from __future__ import annotations

import re

import pytest
from test_diagnosis_foreign import (
    FOREIGN,
    agrees,
    diagnosed,  # noqa: F401 -- the fixture, found by name
    fix_saving_in,
    measured_ms,
    paired_savings_pct,
    saving_in,
)

from sftprof.analysis import idle

MIXTRAL = FOREIGN / "mixtral_blind"
UNTARGETED = FOREIGN / "mixtral_untargeted"
GROUPED_GEMM = 'experts_implementation="grouped_mm"'


@pytest.fixture(scope="module")
def mixtral(request):
    """A case's analysis with the run's own step times, or from the capture alone (timed=False)."""
    diagnose = request.getfixturevalue("diagnosed")
    return lambda case, timed=True, source=MIXTRAL: diagnose(case, timed=timed, source=source)


def compiled_saving() -> float:
    """torch.compile's saving on the clean loop (measured_compiled.jsonl)."""
    times = measured_ms("mixtral_blind/measured_compiled.jsonl")
    return 100 * (1 - times["compiled"] / times["clean"])


def test_each_mixtral_problem_was_measured():
    assert saving_in(MIXTRAL, "experts_eager") > 40 and saving_in(MIXTRAL, "cpu_contention") > 25
    assert 0 < saving_in(MIXTRAL, "zero_grad_keep") < 10 and compiled_saving() > 25
    for case in ("experts_eager", "cpu_contention"):
        assert all(saving > 0 for saving in paired_savings_pct(case, "mixtral_blind/measured.jsonl"))


@pytest.mark.parametrize("timed", [True, False])
def test_a_loop_sharing_its_core_is_named_first_as_waiting_for_a_cpu(mixtral, timed):
    """The loop's threads pinned to one core with two busy processes: the thread that feeds the GPU is switched out
    outside any call that blocks. cpu_contention names it first, within 25% of the saving with or without the run's
    step times, where the idle was host work (remedy: move input work off the thread) before."""
    top = mixtral("cpu_contention", timed).findings[0]
    assert top.rule == idle.CPU_CONTENTION.rule and "--cpus-per-task" in top.recommendation
    rivals = re.findall(r"`pid (\d+), tid \d+` ([\d.]+) ms", top.evidence)  # the two spinning processes, by name
    assert len(rivals) >= 2 and all(float(ms) > 100 for _, ms in rivals[:2])
    assert agrees(top.gain_pct, saving_in(MIXTRAL, "cpu_contention")), top.gain_pct


def test_waiting_for_a_core_is_its_own_share_of_the_idle_and_the_shares_still_add_up(mixtral):
    result = mixtral("cpu_contention")
    causes = result.tables["idle_causes"]
    waited = causes[causes["cause"] == idle.CPU_WAIT].groupby("step")["idle_ns"].sum()
    totals = causes.groupby("step")["idle_ns"].sum()
    assert (waited > 0.5 * totals[waited.index]).all()
    clean = mixtral("clean").tables["idle_causes"]
    assert not (clean["cause"] == idle.CPU_WAIT).any() or (
        clean.loc[clean["cause"] == idle.CPU_WAIT, "idle_ns"].sum() < 0.01 * clean["idle_ns"].sum()
    )


@pytest.mark.parametrize("timed", [True, False])
def test_an_expert_loop_is_named_first_with_its_saving(mixtral, timed):
    """experts_implementation="eager": a loop over the experts, each reading its token count (a nonzero: CUB counts,
    the host reads) and launching its own small kernels. The reads' syncs and the launch overhead are one finding,
    group_loop, first, naming the grouped GEMM, within 25% of its saving; sync_in_steps keeps only the reads' own
    kernels, and launch_bound nothing."""
    findings = mixtral("experts_eager", timed).findings
    top = findings[0]
    assert top.rule == idle.GROUP_LOOP.rule and GROUPED_GEMM in top.recommendation
    assert re.match(r"\d+ GEMMs a step take their size from the data", top.recommendation)
    assert agrees(top.gain_pct, saving_in(MIXTRAL, "experts_eager")), top.gain_pct
    assert "launch_bound" not in {f.rule for f in findings}
    syncs = next(f for f in findings if f.rule == "sync_in_steps")
    assert syncs.severity == "info" and GROUPED_GEMM in syncs.recommendation


@pytest.mark.parametrize("timed", [True, False])
def test_a_sorted_expert_loop_is_named_first_as_a_loop_over_groups(mixtral, timed):
    """DeepSeek's reference loop (experts_sorted, a case the group loop was not written on): one host read of the
    experts' token counts a layer, no size read after CUB's kernels, then each expert's slice through its own GEMMs.
    The GEMMs sized by the data name the loop: group_loop first, naming the grouped GEMM, within 25% of the saving
    measured on the host that made the capture (launch_bound's CUDA graphs cannot capture past the reads)."""
    findings = mixtral("experts_sorted", timed, UNTARGETED).findings
    top = findings[0]
    assert top.rule == idle.GROUP_LOOP.rule and GROUPED_GEMM in top.recommendation
    assert agrees(top.gain_pct, saving_in(UNTARGETED, "experts_sorted")), top.gain_pct
    assert "launch_bound" not in {f.rule for f in findings}


def test_gemms_sized_by_the_data_are_found_only_in_the_expert_loops(mixtral):
    """gains.data_sized_gemms_per_step: the two loops over experts launch dozens a step, which group_loop counts; the
    grouped-GEMM loop, alone or under the other problems, none, so no finding names a loop over groups."""
    for loop in (mixtral("experts_eager"), mixtral("experts_sorted", source=UNTARGETED)):
        [counted] = [f.recommendation for f in loop.findings if f.rule == idle.GROUP_LOOP.rule]
        assert int(counted.split()[0]) >= idle.GROUP_LOOP_GEMMS
    others = [mixtral(case) for case in ("clean", "cpu_contention", "zero_grad_keep")]
    for result in [*others, mixtral("loader_few_cpus", source=UNTARGETED)]:
        assert not any(idle.GROUP_LOOP.rule == f.rule or "grouped GEMM" in f.recommendation for f in result.findings)


def test_a_loader_short_of_cores_sends_launch_bound_to_the_cores_first(mixtral):
    """Four DataLoader workers tokenising on the job's two cores (loader_few_cpus). Under nsys its steps took 270 ms
    (the clean loop's 155): the launching thread shares its cores with the workers and launches half as fast. The
    host overhead is launch_bound's, whose remedy now begins with cores of their own, since cpu_contention names the
    workers beside it. Without the profiler, the workers' cores cost little (the fix, all cores, saved a few percent,
    unevenly): the profiled run was the contended one."""
    findings = {f.rule: f for f in mixtral("loader_few_cpus", source=UNTARGETED).findings}
    assert findings["launch_bound"].recommendation.startswith(idle.CONTENDED_ADVICE)
    assert "--cpus-per-task" in findings[idle.CPU_CONTENTION.rule].recommendation
    assert 0 < fix_saving_in(UNTARGETED, "loader_all_cpus", "loader_few_cpus") < 10
    clean = {f.rule: f for f in mixtral("clean").findings}
    assert not clean["launch_bound"].recommendation.startswith(idle.CONTENDED_ADVICE)


def test_an_expert_loop_is_one_forward_pass_not_many(mixtral):
    """Each expert's GEMMs get their own cuBLAS kernel by its token count, so no layer's kernels repeat another's;
    read with GEMMs as one kind of kernel, the step holds one forward, followed by its backward."""
    assert "extra_forward" not in {f.rule for f in mixtral("experts_eager").findings}


def test_the_clean_loops_warning_is_borne_out_by_torch_compile(mixtral):
    """The grouped-GEMM loop's only warning is the fusion finding; torch.compile saves more than it says (it also
    fuses the kernels no run of two holds: the experts' masked fills between their GEMMs)."""
    findings = mixtral("clean").findings
    warnings = [f for f in findings if f.severity == "warning" and f.gain_pct is not None]
    assert [f.rule for f in warnings] == ["memory_bound_kernel_mix"]
    assert 10 < warnings[0].gain_pct < compiled_saving()


def test_zeroed_gradients_add_no_warning_of_their_own(mixtral):
    """zero_grad(set_to_none=False) costs 2-3%: nothing above the clean loop's own warning claims it."""
    clean = {f.rule for f in mixtral("clean").findings if f.severity == "warning" and f.gain_pct is not None}
    kept = {f.rule for f in mixtral("zero_grad_keep").findings if f.severity == "warning" and f.gain_pct is not None}
    assert kept <= clean
