"""The rebuilt Qwen3-VL vision encoder: explicit process groups, graphable positions and replica sync."""
