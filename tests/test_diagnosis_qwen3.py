"""The diagnosis on a ninth family, a Qwen3 with `minibatch N` ranges (tests/fixtures/foreign/qwen3_blind: three
problems planted before any rule was looked at for them, captured without CPU sampling; loss_chunks: a fourth, to
try the rule then written on one of them), each against the saving of its fix measured without the profiler on the
same H100, read from the committed timings."""

from __future__ import annotations

import pytest
from test_diagnosis_foreign import (
    FOREIGN,
    agrees,
    diagnosed,  # noqa: F401 -- the fixture, found by name
    fix_saving_in,
    measured_ms,
    saving_in,
)

QWEN3 = FOREIGN / "qwen3_blind"
LOSS_CHUNKS = QWEN3 / "loss_chunks"  # a case captured to try the rule written on per_sample_loss


@pytest.fixture(scope="module")
def qwen3(request):
    """A case's findings with the run's own step times (test_diagnosis_foreign's `diagnosed`, cached per module)."""
    diagnose = request.getfixturevalue("diagnosed")
    return lambda case, source=QWEN3: diagnose(case, source=source).findings


def compiled_saving() -> float:
    """torch.compile's saving on the clean loop (measured_compiled.jsonl)."""
    times = measured_ms("qwen3_blind/measured_compiled.jsonl")
    return 100 * (1 - times["compiled"] / times["clean"])


def warned(findings) -> dict[str, float]:
    return {f.rule: f.gain_pct for f in findings if f.severity == "warning" and f.gain_pct is not None}


def test_each_qwen3_problem_was_measured():
    assert saving_in(QWEN3, "per_sample_loss") > 10 and compiled_saving() > 25
    assert saving_in(QWEN3, "causal_mask_4d") < 10
    assert fix_saving_in(QWEN3, "clip_foreach", "clip_foreach_off") < 10


def test_the_clean_loops_warnings_are_borne_out_by_torch_compile(qwen3):
    """The clean loop warns of its memory-bound kernels and its launch overhead, both of which torch.compile's
    fusion removes: it saves more than the two together say (under by about a third)."""
    warnings = warned(qwen3("clean"))
    assert set(warnings) == {"memory_bound_kernel_mix", "launch_bound"}
    assert 10 < sum(warnings.values()) < compiled_saving()


@pytest.mark.parametrize("case", ["causal_mask_4d", "clip_foreach_off"])
def test_problems_under_ten_percent_add_no_warning(qwen3, case):
    """A 4-D causal mask (3-8%) and clipping without foreach (under 3%): no warning beyond the clean loop's."""
    assert set(warned(qwen3(case))) <= set(warned(qwen3("clean")))


def test_a_per_sample_loss_loop_is_named_second_to_the_clean_loops_fusion(qwen3):
    """The loss a sample at a time: each sample's slice of the logits gets a full-size gradient, zero-filled, and
    autograd adds the eight (16% of the step, measured). sliced_gradients names it, second to the fusion finding that
    torch.compile bears out on the clean loop, within 25% of the saving; its fills and adds leave the fusion finding."""
    findings = qwen3("per_sample_loss")
    ranked = [f.rule for f in findings if f.severity == "warning" and f.gain_pct is not None]
    assert ranked[:2] == ["memory_bound_kernel_mix", "sliced_gradients"]
    sliced = next(f for f in findings if f.rule == "sliced_gradients")
    assert agrees(sliced.gain_pct, saving_in(QWEN3, "per_sample_loss")), sliced.gain_pct
    assert "torch.unbind" in sliced.recommendation


def test_a_loss_over_chunks_of_positions_is_named_too(qwen3):
    """A rule written on the per-sample loss, tried on a loss over 16 chunks of the logits' positions (captured
    after the rule's case, before the rule): named in the top two, priced under its measured saving (30%), which
    also holds the strided copies that casting each chunk to float32 makes."""
    findings = qwen3("loss_seq_chunks", LOSS_CHUNKS)
    top = {f.rule: f.gain_pct for f in findings[:2]}
    assert "sliced_gradients" in top
    measured = saving_in(LOSS_CHUNKS, "loss_seq_chunks")
    assert measured > 25 and 0.5 * measured < top["sliced_gradients"] < measured


@pytest.mark.parametrize("case", ["clean", "causal_mask_4d", "clip_foreach_off"])
def test_a_layers_own_fills_and_adds_are_not_a_sliced_tensor(qwen3, case):
    """Each layer's backward fills and adds the rotary halves' gradients, with the layer's GEMMs between: no
    sliced_gradients finding on the loops without a per-slice loss."""
    assert "sliced_gradients" not in {f.rule for f in qwen3(case)}
