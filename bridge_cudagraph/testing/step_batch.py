"""A collated micro-batch turned into the model's keyword arguments, as Bridge's Qwen3-VL and GPT steps do it.

Bridge 0.6.2's ``qwen3_vl_step.forward_step`` owns the last part of the data path: ``get_batch`` moves the
collated batch to the GPU (the attention mask dropped: ``skip_getting_attention_mask_from_dataset`` defaults to
true), ``_pad_and_pack_qwen3_vl_step`` pads the rows and builds the ``PackedSeqParams``, and the
``enable_in_batch_packing`` branch reshapes labels and loss mask to one THD row. The GPU tests and the
useful-tokens benchmark need exactly those model inputs without Bridge's ``GlobalState``, so
:func:`qwen3_vl_step_inputs` calls the same Bridge functions in the same order, in one place.

Two forms of the same collated batch:

* ``packed=True`` (Bridge's Qwen3-VL recipes: ``enable_in_batch_packing`` with
  ``defer_in_batch_packing_to_step``): every row padded to the batch's longest (rounded up to 16), one THD
  segment per row, ``labels``/``loss_mask`` of shape ``[1, rows x width]``, ``packed_seq_params`` set;
* ``packed=False`` with ``pad_to_seq_length=True``: every row padded to ``seq_length``, BSHD, no
  ``packed_seq_params`` (what the step does without packing when it must reach the static length, as under a
  pipeline; equal to collating with ``pad_to_max_length=true``). Static BSHD graphs need this form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from bridge_cudagraph.vision import cpu_grids

__all__ = ["CPU_GRIDS", "VISUAL_KEYS", "gpt_step_inputs", "qwen3_vl_step_inputs"]

#: The visual tensors the step hands the model (``GenericVisualInputs.normalized_for_model``).
VISUAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
#: The key of a Qwen3-VL micro-batch's CPU grids as the collate made them
#: (:class:`bridge_cudagraph.micro_batch.CpuGrids`): not a model argument; the forward step puts them in its
#: micro-batch, as Bridge's loop does from the collated batch it draws.
CPU_GRIDS = "cpu_grids"


def qwen3_vl_step_inputs(
    collated: Mapping[str, Any],
    pg_collection,
    *,
    packed: bool,
    seq_length: int,
    pad_to_seq_length: bool = False,
    device: str | torch.device = "cuda",
) -> dict[str, Any]:
    """The model's keyword arguments (and ``loss_mask``) for one collated micro-batch, as the step builds them.

    Args:
        collated: What Bridge's VLM collate returns (``input_ids``, ``labels``, ``loss_mask``, ``position_ids``,
            ``visual_inputs``; ``attention_mask`` is ignored, as the step ignores it by default).
        pg_collection: The language model's process-group collection (tp and cp sizes set the padding).
        packed: The step's ``enable_in_batch_packing`` branch (THD, one segment per row).
        seq_length: The model's ``seq_length``.
        pad_to_seq_length: Pad every row to ``seq_length`` (the step's ``force_to_pad_to_seq_len``; it also
            forces it under a pipeline or expert parallelism, as here).
        device: Where the tensors go (the step moves them to CUDA).

    Returns:
        ``input_ids``, ``labels``, ``loss_mask``, ``attention_mask``, ``position_ids`` (None: the model computes
        mRoPE positions), ``packed_seq_params`` (None unless ``packed``), the visual tensors present, and their grids
        on the CPU (:data:`CPU_GRIDS`, not a model argument).
    """
    from megatron.core.utils import get_batch_on_this_cp_rank

    from bridge_cudagraph.host.compat import qwen3_vl_pad_and_pack

    def to_device(value):
        return value.to(device, non_blocking=True) if torch.is_tensor(value) else None

    tokens = collated.get("tokens")
    tokens = to_device(collated["input_ids"] if tokens is None else tokens)
    force = pad_to_seq_length or pg_collection.pp.size() > 1 or pg_collection.ep.size() > 1
    tokens, labels, loss_mask, attention_mask, position_ids, params = qwen3_vl_pad_and_pack()(
        tokens,
        to_device(collated.get("labels")),
        to_device(collated.get("loss_mask")),
        None,  # get_batch: skip_getting_attention_mask_from_dataset (Bridge's default)
        to_device(collated.get("position_ids")),
        pg_collection,
        use_fp8_padding=True,
        force_to_pad_to_seq_len=force,
        seq_length=seq_length,
    )
    args = {
        "input_ids": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }
    original_tokens = tokens.clone()
    args = get_batch_on_this_cp_rank(args, is_hybrid_cp=False, cp_group=pg_collection.cp)
    args["packed_seq_params"] = None
    args["input_ids"] = original_tokens
    args["position_ids"] = None  # the model computes mRoPE positions
    if packed:
        if args["labels"] is not None:
            args["labels"] = args["labels"].reshape(1, -1)
        args["attention_mask"] = torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
        if args["loss_mask"] is not None:
            args["loss_mask"] = args["loss_mask"].reshape(1, -1)
        args["packed_seq_params"] = params
    visual = collated.get("visual_inputs")
    tensors = visual.normalized_for_model() if visual is not None else {}
    for key in VISUAL_KEYS:
        if tensors.get(key) is not None:
            args[key] = to_device(tensors[key])
    grids = cpu_grids.from_collated(collated)
    if grids is not None:
        args[CPU_GRIDS] = grids
    return args


def gpt_step_inputs(collated: Mapping[str, Any], config: Any, pg_collection) -> dict[str, Any]:
    """The model's keyword arguments (and ``loss_mask``) for one collated GPT micro-batch, as Bridge's ``gpt_step``
    builds them: its ``get_batch`` (the batch on the GPU, boundary lengths on the CPU, the context-parallel
    split) and, for a packed batch, ``get_packed_seq_params`` (``_forward_step_common``).

    Args:
        collated: What Bridge's GPT SFT collate returns (for offline packing, one packed row: ``tokens``,
            ``labels``, ``loss_mask``, ``position_ids``, ``cu_seqlens_q``, ``max_seqlen_q``...).
        config: The run's ``ConfigContainer`` (``get_batch`` reads its model and dataset settings).
        pg_collection: The language model's process-group collection.

    Returns:
        ``input_ids``, ``labels``, ``loss_mask``, ``attention_mask``, ``position_ids`` and, for a packed batch,
        ``packed_seq_params``.
    """
    from megatron.bridge.training.gpt_step import get_batch
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    tokens, labels, loss_mask, attention_mask, position_ids, packed = get_batch(
        iter([dict(collated)]), config, pg_collection=pg_collection
    )
    args = {
        "input_ids": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }
    if packed is not None:
        args["packed_seq_params"] = get_packed_seq_params(packed)
    return args
