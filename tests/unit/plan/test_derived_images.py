"""The derived image count of a micro-batch follows the data path's smallest image: Bridge's Qwen-VL collate resizes
every image up to ``min_pixels``, so a micro-batch of 32768 patches holds at most 41 images of 784 patches, not 512 of
64; every slot is a static ``cu_seqlens`` segment of the vision graphs' attention."""

from __future__ import annotations

import pytest

from bridge_cudagraph.config import cuda_graph_config_from_dict
from bridge_cudagraph.plan.budgets import derive_max_segments
from bridge_cudagraph.plan.build import build_plan
from bridge_cudagraph.plan.facts import ImageFacts
from tests.unit.plan.test_build import qwen3_vl_8b

pytestmark = pytest.mark.fast

#: Bridge's Qwen-VL collate: images resized into [200704, 1003520] pixels, 784 to 3920 patches of 16 x 16.
COLLATE = ImageFacts(max_pixels=1003520, source="Bridge's collate", min_pixels=200704)


def _vision(images: ImageFacts | None):
    cfg = cuda_graph_config_from_dict({"vision": {"enabled": True}})
    plan = build_plan(qwen3_vl_8b(), cfg, world_size=8, micro_batch_size=2, global_batch_size=128, images=images)
    return plan, plan.vision


def test_the_smallest_image_sizes_the_slots():
    assert derive_max_segments([32768], 2) == 512  # images of 4x4 merged tokens
    assert derive_max_segments([32768], 2, smallest=784) == 41
    assert derive_max_segments([32768], 2, smallest=16) == 512  # never below one 4x4-merged-token image
    assert derive_max_segments([512], 2, smallest=784) == 1


def test_a_data_path_with_min_pixels_derives_fewer_slots_and_says_why():
    plan, v = _vision(COLLATE)
    assert v.images_derived and v.max_images_per_microbatch == 32768 // 784 == 41
    assert v.layout.cu_seqlens_length < _vision(None)[1].layout.cu_seqlens_length
    text = plan.describe()
    assert "max images per micro-batch 41, derived:" in text
    assert "32768 // 784 (images of >= 784 patches: min_pixels 200704 // 16**2, Bridge's collate)" in text
    assert max(map(len, text.splitlines())) <= 119


def test_without_a_floor_the_derivation_is_unchanged():
    plan, v = _vision(ImageFacts(max_pixels=1003520, source="no floor"))
    assert v.max_images_per_microbatch == 512 and v.images_source == ""
    assert "derived: 32768 // (4 x 16) (images of >= 4x4 merged tokens)" in plan.describe()


def test_a_set_count_is_kept():
    cfg = cuda_graph_config_from_dict({"vision": {"enabled": True, "max_images_per_microbatch": 8}})
    plan = build_plan(qwen3_vl_8b(), cfg, world_size=8, micro_batch_size=2, global_batch_size=128, images=COLLATE)
    assert plan.vision.max_images_per_microbatch == 8 and not plan.vision.images_derived
