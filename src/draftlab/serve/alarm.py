"""Predicted vs deployed acceptance: the check that turns a silent serving failure into a loud one.

Training predicts tau from teacher-forced validation (`val/predicted_tau`, eagle3-training.md section 6);
the bench measures it with the draft served the way SGLang loads it. Two thresholds (`bench.*`):
- `bench/tau` <= `bench.tau_fail`: the draft contributes nothing (accept length ~1). That is almost never a
  training problem but a serving one, so a `DraftAlarm` is raised listing what to check instead of
  reporting a number that would be averaged into a sweep as if it were real.
  Unless training itself predicted about as little (predicted tau within WEAK_MARGIN of the threshold) and the
  draft loads cleanly: then the draft is weak, not broken, and the answer is more data, said in a warning.
- `bench/tau_ratio_hi` = tau_hi / predicted < `bench.tau_ratio_warn`, tau_hi the upper end of the first set's 95%
  interval: a warning naming the usual causes of a gap between teacher-forced prediction and deployment. The
  upper end, so that a small sample whose interval still reaches the prediction's neighbourhood does not warn;
  `bench/tau_ratio` (the point value) is reported beside it. Without an interval the point value is used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.util.fsutil import read_json

log = logging.getLogger("draftlab")

# A prediction this close to bench.tau_fail means training already knew the draft accepts almost nothing.
WEAK_MARGIN = 0.1

# Preference order: the exported draft is the best epoch's, so its own prediction comes first.
PREDICTED_KEYS = ("best/predicted_tau", "val/predicted_tau")

WARN_CAUSES = (
    "teacher forcing: training feeds data tokens, serving feeds the draft's own tokens (regenerate the data "
    "with the target, greedy, so data tokens equal the target's choices)",
    "prompts differ: bench prompts, chat template or system prompt differ from the training data",
    "temperature: bench.temperature > 0 accepts with min(1, p/q), not a top-1 match",
    "draft vocabulary coverage: target tokens outside the draft vocab can never be accepted "
    "(see train out_of_vocab_frac; raise draft.vocab_size)",
    "TTT steps vs serve steps: serve.num_steps beyond train.ttt_steps drafts from states never trained",
    "numerics: bf16 serving kernels vs the fp32/autocast training forward",
    "definition: predicted tau starts a chain at every position, deployment only where the last one ended, so "
    "hard stretches weigh more (bench/<set>/tf_tau against walk_tau: the same answers counted both ways)",
)

FAIL_CHECKS = (
    "weights not loaded: SGLang drops unknown keys silently; run `python -m draftlab check-draft <draft dir>`",
    "features from other layers: eagle_config.eagle_aux_hidden_state_layer_ids must be the layers the draft "
    "was trained on (output of decoder layer k = HF hidden_states[k+1]; vLLM counts one lower)",
    "vocabulary map: d2t missing or misnamed, so draft ids are read as target ids",
    "wrong algorithm: an EAGLE-3 draft needs --speculative-algorithm EAGLE3 (EAGLE feeds one layer, no fc)",
    "tie_word_embeddings: true in config.json makes SGLang use embedding rows as the head",
)


class DraftAlarm(RuntimeError):
    """The deployed draft contributes nothing: measured tau at or below bench.tau_fail."""

    def __init__(self, message: str, details: dict):
        super().__init__(message)
        self.details = details


@dataclass
class AlarmResult:
    metrics: dict[str, float]
    warnings: list[str] = field(default_factory=list)


def read_predicted_tau(train_folder: Path | None) -> tuple[float | None, str | None]:
    """(predicted tau, the metrics key it came from) from `<train folder>/metrics.json`, or (None, None)."""
    if train_folder is None:
        return None, None
    metrics = read_json(Path(train_folder) / "metrics.json") or {}
    for key in PREDICTED_KEYS:
        if metrics.get(key) is not None:
            return float(metrics[key]), key
    return None, None


def check(tau: float, predicted: float | None, bench_cfg, draft_problems: list[str] | None = None,
          context: dict | None = None, accept_length: float | None = None,
          tau_hi: float | None = None) -> AlarmResult:
    """Applies both thresholds; returns the ratio metrics and warnings, raises DraftAlarm on failure.

    `accept_length` (tokens per verify step without the prefill's token, when known) guards the fail test
    on short outputs: SGLang's tau counts the prefill token, so with 8 new tokens a draft that is never
    accepted still shows tau = 8/7 = 1.14."""
    problems = list(draft_problems or [])
    details = {"bench/tau": tau, "accept_length": accept_length, "predicted_tau": predicted,
               "tau_fail": bench_cfg.tau_fail, "draft_problems": problems, **(context or {})}
    known = accept_length is not None and accept_length == accept_length  # None or NaN: not measured
    measured = min(tau, accept_length) if known else tau
    if measured != measured:  # NaN: no verification step ran at all
        measured = 0.0
    weak = predicted is not None and predicted <= bench_cfg.tau_fail + WEAK_MARGIN and not problems
    if measured <= bench_cfg.tau_fail and weak:
        log.warning("bench: tau %.3f: the draft accepts almost nothing, as training predicted (%.3f): it is weak, "
                    "not broken; train it on more data (data.samples), or longer if it hit its cap (train.max_steps)",
                    tau, predicted)
    elif measured <= bench_cfg.tau_fail:
        shown = f"bench/tau = {tau:.3f}" + (f", accept length {accept_length:.3f}" if known else "")
        lines = [f"deployed draft contributes nothing: {shown} <= bench.tau_fail = "
                 f"{bench_cfg.tau_fail} (1.0 = no draft token ever accepted)"
                 + (f"; training predicted {predicted:.2f}" if predicted is not None else "")]
        if problems:
            lines.append("the draft as SGLang would load it has these problems:")
            lines += [f"  - {p}" for p in problems]
        lines.append("check:")
        lines += [f"  - {c}" for c in FAIL_CHECKS]
        raise DraftAlarm("\n".join(lines), details)

    result = AlarmResult(metrics={})
    if predicted is None or predicted <= 0:
        result.warnings.append("no val/predicted_tau in the train stage's metrics.json: tau_ratio not computed")
    else:
        ratio = tau / predicted
        result.metrics["bench/tau_ratio"] = ratio
        upper = tau_hi if tau_hi is not None and tau_hi == tau_hi else tau  # None or NaN: no interval
        ratio_hi = upper / predicted
        result.metrics["bench/tau_ratio_hi"] = ratio_hi
        if ratio_hi < bench_cfg.tau_ratio_warn:
            shown = f"deployed tau {tau:.2f}" + (f" (95% interval up to {upper:.2f})" if upper != tau else "")
            result.warnings.append(
                f"{shown} is {ratio_hi:.0%} of the predicted {predicted:.2f} at most (below "
                f"bench.tau_ratio_warn = {bench_cfg.tau_ratio_warn}); usual causes:\n"
                + "\n".join(f"  - {c}" for c in WARN_CAUSES))
    if problems:
        result.warnings.append("the draft as SGLang would load it has problems:\n"
                               + "\n".join(f"  - {p}" for p in problems))
    for warning in result.warnings:
        log.warning("bench: %s", warning)
    return result
