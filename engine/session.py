"""What every front end does the same way, once: opening a model pair (a target and its draft) on one engine,
judging a run against its reference run, and measuring the devices for the cost model.

`run`, `tune`, `regress` and the window load through open_pair, so each gets the same checks, the same draft
placement and the same clean-up; `run` and the window judge a run with judge_run, so the report's reference and the
history's marks agree; `plan`, `tune` and the window calibrate with calibrate_devices.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .checkpoints.checkpoint import Checkpoint
from .core.errors import EngineError
from .model import Engine, Model
from .placement.costmodel import Calibration, calibrate
from .runs.diverge import Diagnosis
from .runs.history import History, RunRecord, combined_hash, diagnose_change, outputs_key
from .runs.run import RunResult
from .runs.speculative import check_shared_vocabulary

ModelSource = str | os.PathLike | Checkpoint

# The quick calibration `plan` and `tune` make before choosing: decode steps per device and batch size, and passes
# after a warm-up pass (the window's is costmodel.calibrate's own: longer, for figures it keeps per model)
QUICK_CALIBRATION_TOKENS = 16
QUICK_CALIBRATION_REPEATS = 1


@dataclass
class ModelPair:
    """A loaded target and its draft (None: none). run_top_k is the experts per token a run asks its contexts for:
    a count above the checkpoint's own is the load's (the target is loaded with it), so the run asks for none."""

    target: Model
    draft: Model | None = None
    run_top_k: int | None = None

    def close(self) -> None:
        for model in (self.draft, self.target):
            if model is not None:
                model.close()


SELF_DRAFT = "self"  # a draft named so: the target's own multi-token-prediction module (a folder: "./self")


def is_self_draft(draft) -> bool:
    return isinstance(draft, str) and draft == SELF_DRAFT


def open_pair(engine: Engine, target: ModelSource, draft: ModelSource | None = None, *, device: str = "cpu:0",
              draft_device: str | None = None, weights: str = "auto", top_k: int | None = None,
              experts_needed: bool = False, check_weights: bool = True) -> ModelPair:  # fmt: skip
    """Load target on device and draft (when given) on draft_device (device when None), both with the weights mode
    and check_weights (Model: the weights' values checked at load, or not).

    - top_k: experts per token for the run; more than the checkpoint's own needs the target loaded with them.
    - experts_needed: a dense target (no experts to place) is refused, naming it (the window places experts).
    - The draft's routed experts are placed on the draft's own device (a GPU primary's experts start in host
      memory), and its vocabulary must be the target's (speculative.check_shared_vocabulary).
    - draft "self" (SELF_DRAFT): the target checkpoint's own multi-token-prediction module
      (Checkpoint.next_token_module), loaded as a model of its own: its experts placed like any draft's.
    Nothing stays loaded when this fails."""
    checkpoint = target if isinstance(target, Checkpoint) else Checkpoint.open(target)
    reload = top_k is not None and top_k > checkpoint.config.top_k
    more = {"top_k": top_k} if reload else {}
    pair = ModelPair(
        engine.load(checkpoint, device=device, weights=weights, check_weights=check_weights, **more),
        run_top_k=None if reload else top_k,
    )
    try:
        if experts_needed and pair.target.config.num_experts <= 0:
            raise EngineError(f"'{checkpoint.folder}' is a dense model: it has no experts to place (open an MoE "
                              "model)")  # fmt: skip
        if draft is not None:
            own = is_self_draft(draft)
            source = checkpoint.next_token_module() if own else draft
            # the module's files are the model's: held as the model's are (auto would copy the shards it shares with
            # a model too large to copy, its embeddings' and head's among them)
            held = pair.target.info["weights"] if own and weights == "auto" else weights
            pair.draft = engine.load(source, device=draft_device or device, weights=held, check_weights=check_weights,
                                     head_of=pair.target if own else None)  # fmt: skip
            if pair.draft.config.moe_layers:  # (the DeepSeek demo's draft has experts, but no MoE layer)
                pair.draft.set_placement(f"*={pair.draft.device}")
            check_shared_vocabulary(pair.target, pair.draft)
    except BaseException:
        pair.close()
        raise
    return pair


# ---- judging a run ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunJudgement:
    """A run's outputs against the reference run of its outputs key (engine.runs.history): its hash over every
    prompt's output (None when a prompt has no complete output: nothing to judge), the reference run (None: none in
    the history yet) and, where the outputs differ, why (engine.runs.diverge.Diagnosis)."""

    output_hash: str | None
    reference: RunRecord | None = None
    diagnosis: Diagnosis | None = None

    @property
    def same(self) -> bool | None:
        """True: the reference run's output; False: changed from it; None: no reference to compare with."""
        return None if self.reference is None else self.reference.output_hash == self.output_hash

    def to_dict(self) -> dict:
        """As `expertbench run --json` reports it: output_hash, and reference (null without one): its run, started,
        output_hash, whether this run gave the same, and the diagnosis (null when the same)."""
        ref = self.reference
        return {
            "output_hash": self.output_hash,
            "reference": None if ref is None else {
                "run": ref.index, "started": ref.started, "output_hash": ref.output_hash, "same": self.same,
                "diagnosis": None if self.diagnosis is None else self.diagnosis.to_dict(),
            },
        }  # fmt: skip


def judge_run(history: History, result: RunResult, prompts: Sequence, target: str, model: Model | None = None,
              prompt_ids=None) -> RunJudgement:  # fmt: skip
    """Judge a finished run (engine.runs.run.RunResult over `prompts`) against its reference run in a history (read
    only: the run is not added).

    - target: what the history's records name the target by (record_key): its fingerprint
      (engine.profiles.profile.fingerprint), or its path where it has none.
    - With the model the run decoded on and the prompts' ids, a reference that kept only ids and gaps has its logits
      re-computed where it ran with the model's settings now (engine.runs.history.diagnose_change)."""
    if not result.output_sha256 or len(result.output_sha256) != len(prompts):
        return RunJudgement(None)
    output_hash = combined_hash(result.output_sha256)
    key = outputs_key(target, list(prompts), result.tokens_per_prompt, result.precision, result.mode,
                      result.placement or "", [result.target_device], result.top_k)  # fmt: skip
    ref = history.reference(key)
    if ref is None:
        return RunJudgement(output_hash)
    return RunJudgement(output_hash, ref, diagnose_change(ref, result, model, prompt_ids))


# ---- calibrating --------------------------------------------------------------------------------------------


def calibrate_devices(model: Model, devices: list[str] | None = None, *, quick: bool = False,
                      calibrate_fn: Callable[..., Calibration] | None = None) -> Calibration:  # fmt: skip
    """The cost model's figures for a loaded model on devices (engine.placement.costmodel.calibrate; every device of
    the engine when None; the model's placement is restored after): the full measurement the window keeps per model,
    or the quick one (QUICK_CALIBRATION_TOKENS steps, QUICK_CALIBRATION_REPEATS pass, no warm-up time) `plan` and
    `tune` make before choosing. ArgumentError names a device that cannot be measured. calibrate_fn replaces
    costmodel.calibrate (tests give made-up figures)."""
    measure = calibrate_fn or calibrate
    if quick:
        return measure(model, devices, tokens=QUICK_CALIBRATION_TOKENS, repeats=QUICK_CALIBRATION_REPEATS,
                       warmup_seconds=0.0)  # fmt: skip
    return measure(model, devices)
