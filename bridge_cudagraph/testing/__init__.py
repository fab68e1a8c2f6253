"""Helpers for testing graphed models (as :mod:`torch.testing`): a pure-M4 GPU world and parity checks.

* :mod:`~bridge_cudagraph.testing.world`: start and close an NCCL world with our process-group collections,
  seeded RNG, and ``parallel_state`` left uninitialised (with a check that it stayed so);
* :mod:`~bridge_cudagraph.testing.parity`: graphed vs graphs-off comparisons (per-token loss, every parameter
  gradient, optimizer steps through Megatron's schedule);
* :mod:`~bridge_cudagraph.testing.step_batch`: a collated Qwen3-VL micro-batch turned into the model's inputs as
  Bridge's Qwen3-VL step does it, packed (THD) or padded to ``seq_length``.

Used by ``tests/gpu`` and the benchmark; nothing in the product imports them.
"""
