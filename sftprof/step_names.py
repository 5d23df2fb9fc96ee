"""How a capture's step ranges are named: shared by the configuration (checked before a run) and the analyses."""

from __future__ import annotations

import re

from sftprof.errors import SftprofError, shown

# A training step's range, as common loops name it, in any case and NVTX domain (`domain:`): `step N`
# (sftprof's trainer, NeMo's callback), `iteration N`, `iter N`, `train_step N`, `global_step N` (a space,
# `_`, `#` or nothing before the number); or the PyTorch profiler's `ProfilerStep#N` (torch.profiler's
# step()), used only where no other step range exists. Up to 18 digits: every such number fits int64; a
# longer one names no training step. `sftprof analyze --step-range REGEX` replaces it (step_pattern).
STEP_NUMBER = r"[0-9]{1,18}"  # what a step range's group must hold to be its number (a user's pattern's too)
STEP_RANGE = re.compile(
    rf"^(?:(?:.*:)?(?:train[_ ]?|global[_ ]?)?(?:step|iteration|iter)[ _#]?({STEP_NUMBER})|ProfilerStep#({STEP_NUMBER}))$",
    re.IGNORECASE,
)

# Any range named a word and a number (`minibatch 12`, `opt_step_12`, `domain:batch#3`): where no range is a known
# step range and the GPU timeline does not repeat, the family of these whose numbers count up by one, one range after
# another on a thread, is taken as the steps (cpu.numbered_steps). Letters, `_`, `-`, `.` and spaces before the
# number: an op range of emit_nvtx (`aten::mm, seq = 12`) has a comma.
NUMBERED_RANGE = re.compile(rf"^(?:.*:)?([A-Za-z][A-Za-z_ .-]{{0,40}}?)[ _#-]?({STEP_NUMBER})$")


def step_pattern(text: str | None = None) -> re.Pattern:
    """The pattern step ranges are found by: STEP_RANGE, or a user's regular expression whose first group that
    matches is the step number (`--step-range 'epoch \\d+ batch (\\d+)'`)."""
    if text is None:
        return STEP_RANGE
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise SftprofError(f"step range pattern {shown(text)}: not a regular expression ({exc})") from None
    if not pattern.groups:
        raise SftprofError(f"step range pattern {shown(text)}: needs a group, in parentheses, around the step number")
    return pattern
