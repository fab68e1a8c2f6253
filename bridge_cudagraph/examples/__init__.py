"""Self-contained examples (as Lightning's demos): the tiny models, synthetic data and the tiny recipe.

* :mod:`~bridge_cudagraph.examples.tiny`: tiny GPT and Qwen3-VL (dense and MoE) providers, random weights, every
  feature the graphs must respect (RoPE, mRoPE, deepstack, the vision encoder's 2-D RoPE and per-image attention);
* :mod:`~bridge_cudagraph.examples.data`: synthetic micro-batches made in-process from a seed;
* :mod:`~bridge_cudagraph.examples.tiny_recipe`: a complete Bridge recipe on them
  (``recipes/tiny_qwen3_vl.yaml``), which trains on one GPU with nothing to download.

They are what the README's main job, the tests and the benchmark run, and a starting point for a recipe of one's
own; nothing in the product imports them.
"""
