"""What Bridge's Qwen3-VL position helpers derive from an image's grid alone, derived once per image size.

Why: a graphed vision forward is host-bound before its first replay (10 ms of GPU idle per step in the vision forward
on the 2B shape). Megatron-Bridge 0.6.2's ``Qwen3VLVisionModel.fast_pos_embed_interpolate`` builds its bilinear indices
and weights on the host, image by image, as Python lists (``tolist()`` of 8 values per patch, then ``torch.tensor`` of
the lists), and ``rot_pos_emb`` launches a dozen small kernels per image. Both results depend on the image's ``(t, h,
w)`` and fixed buffers only; fine-tuning data repeats a few image sizes. So :class:`GridPositions` keeps, per image
size, the indices and weights (on the device) and the rotary table as the graphs load it, and per micro-batch
concatenates them. The learned position table is read on every step, through the same operations as Bridge's, so values
and gradients are bitwise Bridge's (``tests/unit/vision/test_positions.py`` against Bridge's own functions, and the
vision graph tests against Bridge's eager encoder).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["GridPositions", "rotary_input"]


@dataclass(frozen=True)
class _ImagePositions:
    """One image size's share: ``idx`` / ``weight`` (4 x h*w, the four bilinear neighbours of every patch, on the
    device) and ``rotary`` (t*h*w x 1 x 1 x head dim, the layout the graphs' rotary buffer has)."""

    idx: torch.Tensor
    weight: torch.Tensor
    rotary: torch.Tensor


class GridPositions:
    """Per image size, what :meth:`positions` needs; at most ``max_sizes`` sizes, least recently used out first."""

    def __init__(self, max_sizes: int = 256) -> None:
        self.max_sizes = max_sizes
        self._sizes: OrderedDict[tuple, _ImagePositions] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def _images(self, model: Any, grid: torch.Tensor) -> list[tuple[tuple[int, int, int], _ImagePositions]]:
        weight = model.pos_embed.weight
        out = []
        for t, h, w in grid.tolist():
            key = (t, h, w, weight.device, weight.dtype, model.num_grid_per_side)
            entry = self._sizes.get(key)
            if entry is None:
                self.misses += 1
                entry = self._sizes[key] = _derive(model, t, h, w)
                if len(self._sizes) > self.max_sizes:
                    self._sizes.popitem(last=False)
            else:
                self.hits += 1
                self._sizes.move_to_end(key)
            out.append(((t, h, w), entry))
        return out

    def positions(self, model: Any, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(model.fast_pos_embed_interpolate(grid), rotary_input(model.rot_pos_emb(grid)))`` for one micro-batch,
        from one lookup of its image sizes.

        The position embeddings (vision_model.py): the cached indices and weights of every image, concatenated as
        Bridge's lists are, then Bridge's operations on the learned table. The rotary input of the vision graphs:
        Bridge's rows depend on each patch's position only (``freq_table[pos_ids]``), image after image."""
        images = self._images(model, grid)
        idx = torch.cat([entry.idx for _, entry in images], dim=1)
        weight = torch.cat([entry.weight for _, entry in images], dim=1)
        pos_embeds = model.pos_embed(idx) * weight[:, :, None]
        patch_pos_embeds = pos_embeds[0] + pos_embeds[1] + pos_embeds[2] + pos_embeds[3]
        patch_pos_embeds = patch_pos_embeds.split([h * w for (_, h, w), _ in images])
        merge_size = model.config.spatial_merge_size
        permuted = []
        for pos_embed, ((t, h, w), _) in zip(patch_pos_embeds, images, strict=True):
            pos_embed = pos_embed.repeat(t, 1)
            pos_embed = (
                pos_embed.view(t, h // merge_size, merge_size, w // merge_size, merge_size, -1)
                .permute(0, 1, 3, 2, 4, 5)
                .flatten(0, 4)
            )
            permuted.append(pos_embed)
        return torch.cat(permuted), torch.cat([entry.rotary for _, entry in images])


def rotary_input(rows: torch.Tensor) -> torch.Tensor:
    """Bridge's ``rot_pos_emb`` rows (patches x head dim / 2) in the layout its eager forward feeds the layers and
    the vision graphs read: patches x 1 x 1 x head dim, the rows repeated along the last dimension."""
    return rows.reshape(rows.shape[0], 1, 1, -1).repeat(1, 1, 1, 2)


def _derive(model: Any, t: int, h: int, w: int) -> _ImagePositions:
    """One image's indices and weights, exactly as the loop body of Bridge's ``fast_pos_embed_interpolate`` makes
    them (vision_model.py, on the host, fp32, then ``torch.tensor`` of the lists in the table's dtype), and
    its rotary rows from Bridge's own ``rot_pos_emb``."""
    side = model.num_grid_per_side
    h_idxs = torch.linspace(0, side - 1, h)
    w_idxs = torch.linspace(0, side - 1, w)
    h_idxs_floor = h_idxs.int()
    w_idxs_floor = w_idxs.int()
    h_idxs_ceil = (h_idxs.int() + 1).clip(max=side - 1)
    w_idxs_ceil = (w_idxs.int() + 1).clip(max=side - 1)
    dh = h_idxs - h_idxs_floor
    dw = w_idxs - w_idxs_floor
    base_h = h_idxs_floor * side
    base_h_ceil = h_idxs_ceil * side
    indices = [
        (base_h[None].T + w_idxs_floor[None]).flatten(),
        (base_h[None].T + w_idxs_ceil[None]).flatten(),
        (base_h_ceil[None].T + w_idxs_floor[None]).flatten(),
        (base_h_ceil[None].T + w_idxs_ceil[None]).flatten(),
    ]
    weights = [
        ((1 - dh)[None].T * (1 - dw)[None]).flatten(),
        ((1 - dh)[None].T * dw[None]).flatten(),
        (dh[None].T * (1 - dw)[None]).flatten(),
        (dh[None].T * dw[None]).flatten(),
    ]
    table = model.pos_embed.weight
    idx = _upload([i.tolist() for i in indices], torch.long, table.device)
    weight = _upload([x.tolist() for x in weights], table.dtype, table.device)
    rotary = rotary_input(model.rot_pos_emb(torch.tensor([[t, h, w]])))
    return _ImagePositions(idx=idx, weight=weight, rotary=rotary)


def _upload(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` without the host waiting for the device: the same host
    tensor (the lists convert on the host either way), copied from pinned memory as the graphs' ``cu_seqlens`` is.
    Bridge's pageable upload blocks the host twice per micro-batch; one per new image size here would be 16 waits for
    eight new sizes (``test_graphed_vision_forward_waits_on_the_device_a_fixed_number_of_times``)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
