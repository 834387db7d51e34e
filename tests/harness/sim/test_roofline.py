"""The roofline a simulated run records: where the cost model's own bound turns, and only at
batches the engine runs."""

from __future__ import annotations

from adapters.reference import ReferenceConfig
from harness.sim.roofline import roofline_turn


def test_the_ridge_is_where_the_models_bound_turns() -> None:
    config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", max_num_seqs=1024)
    roof = roofline_turn(config, 64)
    cost = config.cost_model()
    turn = roof["turn_batch_size"]
    assert turn is not None
    assert cost.decode_step_cost(turn, 64).bound == "compute"
    assert cost.decode_step_cost(turn - 1, 64).bound == "memory"
    # the intensity at the turn is past the recorded ridge, the batch before it is not
    assert (cost.decode_step_cost(turn - 1, 64).arithmetic_intensity
            < roof["ridge_flop_per_byte"] <= cost.decode_step_cost(turn, 64).arithmetic_intensity)
    assert roof["datasheet_ridge_flop_per_byte"] > roof["ridge_flop_per_byte"]


def test_no_batch_beyond_max_num_seqs_is_said_to_run() -> None:
    """The KV cache holds thousands of short requests, the engine runs at most 64: the turn
    the table would find past 64 is not one this engine reaches."""
    wide = roofline_turn(ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm",
                                         max_num_seqs=1024), 64)
    assert wide["turn_batch_size"] is not None and wide["turn_batch_size"] > 64
    capped = roofline_turn(ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm",
                                           max_num_seqs=64), 64)
    assert capped["max_batch_in_kv"] > 64 and capped["max_batch"] == 64
    assert capped["turn_batch_size"] is None
    cost = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm").cost_model()
    assert capped["intensity_at_max_batch"] == cost.decode_step_cost(64, 64).arithmetic_intensity
