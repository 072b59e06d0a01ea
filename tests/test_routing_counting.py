"""Routing statistics count the workload only: decodes that measure (calibration, the cost model's measurements)
run with the counting paused, on a CPU primary and on a device primary whose one-token steps are recorded graphs
(the recordings are made again when the counting changes)."""

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.core.errors import StateError
from engine.model import Engine
from engine.placement import costmodel


@pytest.mark.parametrize("device", ["cpu:0", "hostsim:0"])
def test_paused_decodes_do_not_count_and_counting_resumes(device):
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=1, cpu_threads=1) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32", device=device)
        model.set_placement(f"*={device}")
        with model.context(32) as ctx:
            ctx.prefill([1, 2, 3])
            ctx.decode([4])
            counted, tokens = model.routing_counts()
            assert counted.sum() > 0
            with model.routing_paused():
                with model.routing_paused():  # nests
                    rows = [ctx.decode([t]) for t in (5, 6, 7)]
                rows.append(ctx.decode([8]))
                assert np.array_equal(model.routing_counts()[0], counted)
                assert np.array_equal(model.routing_counts()[1], tokens)
            ctx.decode([9])
            after, after_tokens = model.routing_counts()
            moe = [layer for layer in range(model.config.num_layers) if model.config.is_moe_layer(layer)]
            assert (after_tokens[moe] == tokens[moe] + 1).all()
            assert after.sum() == counted.sum() + len(moe) * model.config.top_k
        with model.context(32) as ctx:  # the paused decodes computed the same as counted ones
            ctx.prefill([1, 2, 3, 4])
            assert np.array_equal(np.concatenate([ctx.decode([t]) for t in (5, 6, 7, 8)]), np.concatenate(rows))
        model.close()
        with pytest.raises(StateError), model.routing_paused():
            pass


def test_calibration_leaves_the_routing_statistics_as_they_were():
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=1, cpu_threads=1) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        with model.context(32) as ctx:
            ctx.prefill([1, 2, 3, 4, 5])
        before = model.routing_counts()
        costmodel.calibrate(model, ["hostsim:0"], tokens=2, repeats=1, warmup_seconds=0)
        after = model.routing_counts()
        assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])
        model.close()
