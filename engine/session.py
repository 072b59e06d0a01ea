"""Opening a model pair (a target and its draft) on one engine, once for every front end: `run`, `tune`, `regress`
and the window load through here, so each gets the same checks, the same draft placement and the same clean-up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .checkpoints.checkpoint import Checkpoint
from .core.errors import EngineError
from .core.model import Engine, Model
from .runs.speculative import check_shared_vocabulary

ModelSource = str | os.PathLike | Checkpoint


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


def open_pair(engine: Engine, target: ModelSource, draft: ModelSource | None = None, *, device: str = "cpu:0",
              draft_device: str | None = None, weights: str = "auto", top_k: int | None = None,
              experts_needed: bool = False, check_weights: bool = True) -> ModelPair:  # fmt: skip
    """Load target on device and draft (when given) on draft_device (device when None), both with the weights mode
    and check_weights (Model: the weights' values checked at load, or not).

    - top_k: experts per token for the run; more than the checkpoint's own needs the target loaded with them.
    - experts_needed: a dense target (no experts to place) is refused, naming it (the window places experts).
    - The draft's routed experts are placed on the draft's own device (a GPU primary's experts start in host
      memory), and its vocabulary must be the target's (speculative.check_shared_vocabulary).
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
            pair.draft = engine.load(draft, device=draft_device or device, weights=weights, check_weights=check_weights)
            if pair.draft.config.moe_layers:  # (the DeepSeek demo's draft has experts, but no MoE layer)
                pair.draft.set_placement(f"*={pair.draft.device}")
            check_shared_vocabulary(pair.target, pair.draft)
    except BaseException:
        pair.close()
        raise
    return pair
