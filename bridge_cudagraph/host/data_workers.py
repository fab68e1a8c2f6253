"""DataLoader workers that deliver: Hugging Face ``tokenizers`` in processes forked from a parent that has used it.

Host change:
  changes: the environment variable ``TOKENIZERS_PARALLELISM`` (set to ``false``) for the length of a training run
    whose data loader forks workers (:func:`fork_safe_tokenizers`)
  written for: tokenizers 0.22 (transformers 5) under Bridge 0.6.2's ``DirectSFTDataset`` and Qwen-VL collate
  gate: ``dataset.num_workers > 0`` and the variable not set by the user
  undo: leaving the ``with`` block (the variable removed again)

Why: Bridge's Qwen-VL collate (``qwen2_5_collate_fn``) runs the processor, and so the fast tokenizer, in each
DataLoader worker. In a worker forked without the variable the ``tokenizers`` library encodes on its thread pool,
which does not come through the fork: the worker's first encode waits forever inside ``_encode_plus``, and no batch
ever arrives (the run ends on the loader's timeout with ``DataLoader worker ... exited unexpectedly``). Reproduced on
the CPU with a plain ``torch.utils.data.DataLoader`` over Bridge's photo dataset and two workers, and fixed by the
variable alone, set just before the workers fork. With ``TOKENIZERS_PARALLELISM=false`` every process encodes on its
own thread; the workers are the parallelism. Spawned workers would avoid it too, but Bridge's collate is a closure
(``DirectSFTDataset.__init__.<locals>._bound_collate``), which cannot be pickled into a spawned process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["TOKENIZERS_PARALLELISM", "fork_safe_tokenizers"]

TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"


@contextlib.contextmanager
def fork_safe_tokenizers(num_workers: int | None) -> Iterator[bool]:
    """While open, ``TOKENIZERS_PARALLELISM=false`` when the data loader forks ``num_workers`` workers and the user has
    not set the variable; yields whether it was set here."""
    if not num_workers or num_workers < 1 or TOKENIZERS_PARALLELISM in os.environ:
        yield False
        return
    os.environ[TOKENIZERS_PARALLELISM] = "false"
    try:
        yield True
    finally:
        os.environ.pop(TOKENIZERS_PARALLELISM, None)
