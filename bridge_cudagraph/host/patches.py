"""Every monkey-patch that bridge_cudagraph makes of its host (megatron-core, Megatron-Bridge, huggingface_hub, torch).

The plugin changes no host source file. Where the host gives no hook, it rebinds one module-level name for as long
as it needs to; each rebinding is here, and nowhere else, so an upgrade of the stack has one file to re-read. Each
block says what it patches, for which version, its gate and how it is undone. The *probes* that decide whether a patch
applies to the installed version are in :mod:`bridge_cudagraph.host.compat`.

Host changes, one block each (every one also gated by the proven stack,
:func:`~bridge_cudagraph.host.compat.check_proven_stack`):

Host change:
  changes: ``megatron.bridge.training.train.TECudaGraphHelper`` (:func:`rebind_bridge_helper`; the class it rebinds
    to is :mod:`bridge_cudagraph.bridge.loop`'s, passed in, so this module imports nothing of the plugin's loop)
  written for: Bridge 0.6.2
  gate: :func:`~bridge_cudagraph.host.compat.bridge_builds_language_helper_by_name`
  undo: :func:`uninstall_bridge_helper`

Host change:
  changes: ``megatron.bridge.training.pretrain.train`` (:func:`release_graphs_if_training_raises`)
  written for: Bridge 0.6.2
  gate: ``train``'s own loop
  undo: leaving the ``with`` block

Host change:
  changes: ``megatron.bridge.training.initialize.compile_helpers`` (:func:`use_prebuilt_dataset_helpers`)
  written for: megatron-core 0.19.2 wheels under Bridge 0.6.2
  gate: :func:`~bridge_cudagraph.host.compat.dataset_helpers_prebuilt_without_makefile`
  undo: :func:`restore_dataset_helpers`

Host change:
  changes: ``huggingface_hub.constants.HF_HUB_OFFLINE`` / ``HF_HUB_CACHE`` and three environment variables
    (:func:`offline_hub`)
  written for: huggingface_hub (any)
  gate: a recipe with ``hf_config`` (offline config reads)
  undo: leaving the block

Host change:
  changes: ``AutoBridge.from_hf_pretrained`` (:func:`from_hf_pretrained_hook`)
  written for: Bridge 0.6.2
  gate: a recipe with ``hf_config``
  undo: leaving the block

Host change:
  changes: ``sys.modules["megatron.bridge.recipes"]``, a bare package with its ``__init__`` unrun, while that
    package is not imported (:func:`bridge_recipes_without_init`)
  written for: Bridge 0.6.2
  gate: the package not yet imported
  undo: leaving the block

Host change:
  changes: ``torch.cuda.get_device_properties`` on machines without CUDA (:func:`cpu_device_properties`), for
    Bridge 0.6.2's MoE recipes
  written for: torch (any)
  gate: no CUDA device
  undo: leaving the block

Host change:
  changes: ``megatron.core.transformer.cuda_graphs.get_num_microbatches`` (:func:`explicit_num_microbatches`)
  written for: megatron-core 0.19.2
  gate: language graphs, around their capture
  undo: leaving the block

Host change:
  changes: ``megatron.core.distributed.finalize_model_grads.reset_model_temporary_tensors``
    (:func:`listed_reset_modules`, entered around one model's ``finalize_model_grads`` call by
    :mod:`bridge_cudagraph.host.finalize`)
  written for: megatron-core 0.19.2
  gate: :func:`~bridge_cudagraph.host.compat.finalize_walk_is_mirrored`
  undo: leaving the block

Host change:
  changes: fields of one host object, the ``ProcessGroupCollection`` Bridge 0.6.2 builds for
    ``dist.use_decentralized_pg=true``, which megatron-core 0.19.2 reads (MoE metric logging) and Bridge leaves unset
    (:func:`complete_bridge_collection`)
  written for: Bridge 0.6.2, megatron-core 0.19.2
  gate: :func:`~bridge_cudagraph.host.compat.collection_declares_gtp_remat_groups`
  undo: :func:`restore_bridge_collection` (the provider leaves them for the life of the collection)

Host change:
  changes: the class of one host object (:func:`extend_instance_class`): a subclass that puts a mixin in front, for
    the language decoder (megatron-core's ``TransformerBlock`` or Bridge 0.6.2's ``Qwen3VLTransformerBlock``: the
    ladder's replay of :class:`~bridge_cudagraph.capture.block_replay.LadderReplayBlock`), the optimizer's objects
    (:mod:`bridge_cudagraph.host.optimizer`) and
    Bridge's ``Qwen3VLModel`` and its decoder (:mod:`bridge_cudagraph.host.forward`); the host's classes are untouched
  written for: megatron-core 0.19.2, Bridge 0.6.2, Transformer Engine 2.20
  gate: each caller's own (the plan, and the gates of its module)
  undo: :func:`restore_instance_class`, which takes one mixin off an object that carries two (the decoder's ladder
    replay and deepstack merge) in either order

Every undo puts back the very object that was there before, or the absence of one (``tests/unit/host/test_patches.py``
checks identity). Each replacement carries the original under :data:`ORIGINAL`, which is how the install/uninstall
pairs find it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

from bridge_cudagraph.host import compat

__all__ = [
    "BRIDGE_RECIPES",
    "bridge_helper_installed",
    "bridge_recipes_without_init",
    "complete_bridge_collection",
    "cpu_device_properties",
    "explicit_num_microbatches",
    "extend_instance_class",
    "from_hf_pretrained_hook",
    "listed_reset_modules",
    "offline_hub",
    "rebind_bridge_helper",
    "release_graphs_if_training_raises",
    "restore_bridge_collection",
    "restore_dataset_helpers",
    "restore_instance_class",
    "uninstall_bridge_helper",
    "use_prebuilt_dataset_helpers",
]

logger = logging.getLogger("bridge_cudagraph")

#: Set on every replacement this module installs: the object it replaced (how each undo finds the original).
ORIGINAL = "_bridge_cudagraph_original"


# ------------------------------------------------------------------ Bridge's language graph helper (Bridge 0.6.2)
def rebind_bridge_helper(dispatching: Callable[[type], type]) -> None:
    """Rebind ``megatron.bridge.training.train.TECudaGraphHelper`` to ``dispatching(real)``, the class
    :func:`bridge_cudagraph.bridge.loop.dispatching_class` makes (idempotent).

    Patches: the module-level name through which Bridge 0.6.2's ``train()`` builds its language graph helper at call
    time (``train.py``; :func:`~bridge_cudagraph.host.compat.bridge_builds_language_helper_by_name` probes it).
    Why: a ``bridge_cudagraph`` provider keeps ``cuda_graph_impl="transformer_engine"`` (it routes replay to the TE
    graphs), so Bridge would capture the language layers a second time with megatron-core's helper (no mRoPE); the
    dispatching class answers for our providers with a callback-owned stand-in and builds the real helper for any
    other config (``bridge_loop``'s docstring). Undone by :func:`uninstall_bridge_helper`; the ``train`` verb leaves
    it installed for the life of the process.

    Raises:
        RuntimeError: This Bridge does not build its helper through that name, so rebinding it could not prevent a
            second capture.
    """
    train = compat.bridge_train_module()
    if bridge_helper_installed():
        return
    if not compat.bridge_builds_language_helper_by_name():
        raise RuntimeError(
            "bridge_cudagraph cannot keep Megatron-Bridge from capturing language graphs itself: this Bridge "
            f"(installed {compat.installed_version('megatron-bridge')}, "
            f"tested {compat.TESTED_STACK['megatron-bridge']}) no longer builds them through "
            "megatron.bridge.training.train.TECudaGraphHelper"
        )
    real = train.TECudaGraphHelper
    replacement = dispatching(real)
    setattr(replacement, ORIGINAL, real)
    train.TECudaGraphHelper = replacement


def bridge_helper_installed() -> bool:
    """Whether :func:`rebind_bridge_helper` is in effect."""
    return getattr(compat.bridge_train_module().TECudaGraphHelper, ORIGINAL, None) is not None


def uninstall_bridge_helper() -> None:
    """Undo :func:`rebind_bridge_helper`: Bridge's name holds megatron-core's ``TECudaGraphHelper`` again."""
    train = compat.bridge_train_module()
    original = getattr(train.TECudaGraphHelper, ORIGINAL, None)
    if original is not None:
        train.TECudaGraphHelper = original


# ---------------------------------------------------------------------- Bridge's training loop (Bridge 0.6.2)
def _bridge_pretrain_module() -> Any:
    """``megatron.bridge.training.pretrain``, whose ``_pretrain`` calls the loop by its module-level name ``train``."""
    return importlib.import_module("megatron.bridge.training.pretrain")


@contextlib.contextmanager
def release_graphs_if_training_raises(owner: Any, module: Any = None) -> Iterator[None]:
    """While active, Bridge's ``_pretrain`` runs its training loop through a wrapper that, when the loop raises
    (any ``BaseException``: an error, ``KeyboardInterrupt``, Bridge's own ``sys.exit`` of its early-exit path), calls
    ``owner.release_graphs(reason=...)`` and re-raises the same exception.

    Patches: ``megatron.bridge.training.pretrain.train`` (Bridge 0.6.2), the name ``_pretrain`` calls the loop by,
    looked up at call time. Why: ``_pretrain`` catches whatever the loop raises and aborts the process groups before
    re-raising (``pretrain.py``, ``_cleanup_after_pretrain_failure``), and no callback event fires on that
    path; graphs still alive then hold NCCL buffers across the abort. Undone when the block is left (the original
    function is put back if the name still holds the wrapper). If this Bridge no longer has that name, a warning says
    so and nothing is patched: only :func:`bridge_cudagraph.bridge.train.run`'s own ``except`` (after Bridge's
    clean-up) releases the graphs.

    Args:
        owner: Anything with ``release_graphs(reason=...)`` (a
        :class:`~bridge_cudagraph.bridge.callback.CudaGraphCallback`).
        module: The module whose ``train`` to wrap; default Bridge's ``pretrain`` module.
    """
    module = _bridge_pretrain_module() if module is None else module
    real = getattr(module, "train", None)
    if not callable(real):
        logger.warning(
            "bridge_cudagraph: %s has no training loop named 'train' to wrap; if training raises, its CUDA graphs "
            "are deleted only after Megatron-Bridge has aborted the process groups",
            getattr(module, "__name__", module),
        )
        yield
        return

    @functools.wraps(real)
    def train(*args: Any, **kwargs: Any) -> Any:
        try:
            return real(*args, **kwargs)
        except BaseException as error:
            try:
                owner.release_graphs(reason=f"training loop raised {type(error).__name__}")
            except Exception:  # the original error is what the user must see
                logger.exception("bridge_cudagraph: releasing the CUDA graphs after a training failure failed")
            raise

    setattr(train, ORIGINAL, real)
    module.train = train
    try:
        yield
    finally:
        if getattr(module, "train", None) is train:
            module.train = real


# ----------------------------------------------------- the dataset helpers (megatron-core 0.19.2 wheels, Bridge 0.6.2)
def use_prebuilt_dataset_helpers() -> bool:
    """Rebind Bridge's ``megatron.bridge.training.initialize.compile_helpers`` to an import of the prebuilt module,
    when :func:`~bridge_cudagraph.host.compat.dataset_helpers_prebuilt_without_makefile` says the install needs it.

    Why: megatron-core's PyPI wheels (0.19.2 seen) ship the compiled ``megatron.core.datasets.helpers_cpp`` but not
    the Makefile that Bridge 0.6.2's ``initialize_megatron`` runs ``make -C`` on, so every Bridge run on such an
    install ``sys.exit(1)``s during set-up ("Failed to compile the C++ dataset helper functions"). A source install
    (NGC) keeps Bridge's behaviour: nothing is patched. Undone by :func:`restore_dataset_helpers`; the ``train`` verb
    leaves it for the life of the process. Idempotent.

    Returns:
        Whether Bridge's ``compile_helpers`` is the replacement now.
    """
    from megatron.bridge.training import initialize

    if getattr(initialize.compile_helpers, ORIGINAL, None) is not None:
        return True
    if not compat.dataset_helpers_prebuilt_without_makefile():
        return False

    def compile_helpers() -> None:
        importlib.import_module("megatron.core.datasets.helpers_cpp")

    setattr(compile_helpers, ORIGINAL, initialize.compile_helpers)
    initialize.compile_helpers = compile_helpers
    return True


def restore_dataset_helpers() -> None:
    """Undo :func:`use_prebuilt_dataset_helpers`: Bridge's own ``compile_helpers`` is back."""
    from megatron.bridge.training import initialize

    original = getattr(initialize.compile_helpers, ORIGINAL, None)
    if original is not None:
        initialize.compile_helpers = original


# ------------------------------------------------------------------------------ Hugging Face Hub (huggingface_hub)
@contextlib.contextmanager
def offline_hub(cache: str | os.PathLike[str]) -> Iterator[None]:
    """``huggingface_hub`` offline, answering from the Hub-cache folder ``cache``, for the duration of the block.

    Patches: ``huggingface_hub.constants.HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` (any huggingface_hub: they are read
    once, at import, from the environment), and the environment variables ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` and
    ``MEGATRON_CONFIG_LOCK_DIR`` (for code that reads them at call time, and for child processes). Why: setting the
    environment alone is not enough, because ``megatron.bridge`` imports ``huggingface_hub`` long before a recipe
    runs; a Hub lookup then retries the unreachable Hub for ~100 s and fails. Undone when the block is left: the
    constants get their previous values and each variable its previous value or its absence.
    """
    from huggingface_hub import constants

    cache = str(cache)
    names = ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "MEGATRON_CONFIG_LOCK_DIR")
    saved_env = {k: os.environ.get(k) for k in names}
    saved = (constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE)
    os.environ.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=cache, MEGATRON_CONFIG_LOCK_DIR=cache)
    constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = True, cache
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def from_hf_pretrained_hook(before: Callable[[str, dict[str, Any]], None]) -> Iterator[None]:
    """Call ``before(path, kwargs)`` ahead of every ``AutoBridge.from_hf_pretrained(path, **kwargs)`` in the block.

    Patches: the classmethod ``megatron.bridge.models.conversion.auto_bridge.AutoBridge.from_hf_pretrained``
    (Bridge 0.6.2), which Bridge's recipe functions call with the model id (and some with a pinned ``revision``).
    Why: :func:`bridge_cudagraph.recipe.offline.offline_hf_config` must lay the committed ``config.json`` out under the
    revision the recipe asks for, and refuse another model at once, before Bridge's own loading code (unchanged)
    runs. ``before`` may raise to refuse the call. Undone when the block is left: the class gets back the very
    ``classmethod`` object from its ``__dict__``.
    """
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    original = AutoBridge.__dict__["from_hf_pretrained"]

    def from_hf_pretrained(cls, path, **kwargs):
        before(str(path), kwargs)
        return original.__func__(cls, path, **kwargs)

    wrapper = functools.wraps(original.__func__)(from_hf_pretrained)
    setattr(wrapper, ORIGINAL, original)
    AutoBridge.from_hf_pretrained = classmethod(wrapper)
    try:
        yield
    finally:
        AutoBridge.from_hf_pretrained = original


# ------------------------------------------------------------------------- Bridge's recipe package (Bridge 0.6.2)
#: The package whose ``__init__`` :func:`bridge_recipes_without_init` leaves unrun.
BRIDGE_RECIPES = "megatron.bridge.recipes"


@contextlib.contextmanager
def bridge_recipes_without_init() -> Iterator[None]:
    """Modules under ``megatron.bridge.recipes`` import in the block without running the package's ``__init__``.

    Patches: ``sys.modules["megatron.bridge.recipes"]``, only while the package is not imported yet: a package module
    made from its real spec (its ``__path__`` is the installed folder) whose ``__init__.py`` is not executed. Why:
    Megatron-Bridge 0.6.2's ``recipes/__init__.py`` star-imports every model family's recipes, and the flux and wan
    ones import ``diffusers``, which the GPU machine's image lacks; a recipe module such as
    ``megatron.bridge.recipes.qwen_vl.h100.qwen3_vl`` imports nothing of those (its own imports, ``recipes.common``
    and ``recipes.utils``, are Bridge's training stack), so Bridge's own recipe function can be imported and called
    unchanged there. Undone when the block is left: the bare package leaves ``sys.modules`` (the submodules imported
    in the block stay, so a later ordinary ``import megatron.bridge.recipes`` runs the real ``__init__`` over them).
    When the package is already imported, nothing is patched.
    """
    import importlib.util
    import sys

    if BRIDGE_RECIPES in sys.modules:
        yield
        return
    spec = importlib.util.find_spec(BRIDGE_RECIPES)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{BRIDGE_RECIPES} is not an installed package")
    bare = importlib.util.module_from_spec(spec)  # the module object with __path__ and __spec__; nothing executed
    sys.modules[BRIDGE_RECIPES] = bare
    try:
        yield
    finally:
        if sys.modules.get(BRIDGE_RECIPES) is bare:
            del sys.modules[BRIDGE_RECIPES]


# --------------------------------------------------------------------------------------------------------- torch
@contextlib.contextmanager
def cpu_device_properties() -> Iterator[None]:
    """On a machine without CUDA, ``torch.cuda.get_device_properties`` answers with a stand-in during the block.

    Patches: ``torch.cuda.get_device_properties`` (any torch; only when ``torch.cuda.is_available()`` is false). Why:
    Megatron-Bridge 0.6.2 ``apply_flex_dispatcher_backend`` (``training/flex_dispatcher_backend.py``) calls
    ``torch.cuda.get_device_properties(0)`` for every MoE model before it looks at the requested backend, so
    ``qwen3_vl_30b_a3b_sft_config`` raises "Found no NVIDIA driver" on a CPU machine. With no backend requested (all
    our recipes) the properties are only read in a branch that logs and returns. On a machine with CUDA nothing is
    patched. Undone when the block is left.
    """
    import torch

    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_properties

    def no_device(device: Any = None) -> types.SimpleNamespace:
        return types.SimpleNamespace(name="no CUDA device", major=0, minor=0, total_memory=0, multi_processor_count=0)

    setattr(no_device, ORIGINAL, original)
    torch.cuda.get_device_properties = no_device
    try:
        yield
    finally:
        torch.cuda.get_device_properties = original


# ----------------------------------------------------------------------- megatron-core's TE helper (core 0.19.2)
@contextlib.contextmanager
def explicit_num_microbatches(count: int) -> Iterator[None]:
    """Make megatron-core's TE helper see ``count`` micro-batches instead of the global calculator's.

    Patches: ``megatron.core.transformer.cuda_graphs.get_num_microbatches`` (megatron-core 0.19.2), the module-level
    name ``TECudaGraphHelper._get_cuda_graph_input_data`` calls (the process-global calculator of
    ``megatron.core.num_microbatches_calculator``) for the PP schedule and for TE's warmup-iteration count, even at
    PP=1. Why: the plugin never creates that global calculator, and the count must be the plan's. Undone when the
    block is left (the capture is over).
    """
    from megatron.core.transformer import cuda_graphs

    original = cuda_graphs.get_num_microbatches

    def get_num_microbatches() -> int:
        return count

    setattr(get_num_microbatches, ORIGINAL, original)
    cuda_graphs.get_num_microbatches = get_num_microbatches
    try:
        yield
    finally:
        cuda_graphs.get_num_microbatches = original


# ------------------------------------------------------- finalize_model_grads' module walk (megatron-core 0.19.2)
class _ListedModules:
    """Stands in for one model chunk inside ``reset_model_temporary_tensors``: its ``modules()`` are a list."""

    def __init__(self, modules: list[Any]) -> None:
        self._modules_listed = modules

    def modules(self) -> list[Any]:
        return self._modules_listed


@contextlib.contextmanager
def listed_reset_modules(chunks: list[Any], modules: list[list[Any]]) -> Iterator[None]:
    """While the block runs, megatron-core's ``reset_model_temporary_tensors`` visits ``modules[i]`` for chunk
    ``chunks[i]`` instead of walking ``chunks[i].modules()``; a call for any other model walks as before.

    Patches: ``megatron.core.distributed.finalize_model_grads.reset_model_temporary_tensors`` (megatron-core 0.19.2,
    finalize_model_grads.py), the module-level name ``finalize_model_grads`` calls at its end. Why: it
    walks every module of every chunk on every step (1,028 on Qwen3-VL-2B) while the GPU waits for the optimizer;
    :mod:`bridge_cudagraph.host.finalize` lists the modules it can act on once. The host's function still runs, on
    those modules (through :class:`_ListedModules`, which ``get_attr_wrapped_model(chunk, "modules")`` returns as it
    is). Undone when the block is left.
    """
    # The package exports the function finalize_model_grads under its module's name: the module, by its path.
    host = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    original = host.reset_model_temporary_tensors
    ids = [id(chunk) for chunk in chunks]
    listed = [_ListedModules(m) for m in modules]

    def reset_model_temporary_tensors(config: Any, model: list[Any]) -> None:
        if [id(chunk) for chunk in model] == ids:
            return original(config, listed)
        return original(config, model)

    setattr(reset_model_temporary_tensors, ORIGINAL, original)
    host.reset_model_temporary_tensors = reset_model_temporary_tensors
    try:
        yield
    finally:
        host.reset_model_temporary_tensors = original


# ------------------------------------------------- Bridge's decentralized collection (Bridge 0.6.2, core 0.19.2)
#: Set on a collection :func:`complete_bridge_collection` changed: the names of the fields it set.
COMPLETED = "_bridge_cudagraph_completed"


def complete_bridge_collection(pgc: Any, config: Any) -> tuple[str, ...]:
    """Give a ``ProcessGroupCollection`` the GTP_remat fields megatron-core reads and Bridge leaves unset, each the
    very group of its plain field (:data:`~bridge_cudagraph.host.compat.GTP_REMAT_ALIASES`: ``dp_cp_gtp_remat =
    dp_cp``, ``expt_dp_gtp_remat = expt_dp``, ``tp_ep_pp_with_egtp_remat = tp_ep_pp``). Only unset fields are set, so a
    collection built by :mod:`bridge_cudagraph.parallel.groups` (which sets them) or by a Bridge that sets them is left
    as it is; idempotent.

    Patches: fields of one object, the collection Megatron-Bridge 0.6.2 builds with ``dist.use_decentralized_pg=true``
    (``training/initialize.py``, ``_create_pg_collection``) and hands both to the model provider
    (``setup.py``) and to its training loop (``pretrain.py`` -> ``train.py`` -> ``training_log``). Why:
    for an MoE model Bridge's ``training_log`` calls megatron-core 0.19.2's ``track_moe_metrics``
    (``utils/train_utils.py``), whose ``MoEMetricsTracker._sync_metrics`` (``moe_logging.py``) averages
    over ``pg_collection.dp_cp_gtp_remat`` and, finding ``None``, asks ``parallel_state.get_data_parallel_group``,
    which under pure M4 raises "data parallel group (with GTP_remat) is not initialized" at the first training log,
    graphs or not. TE's grouped experts also read ``expt_dp_gtp_remat`` for the checkpoint's replica ids
    (``extensions/transformer_engine.py``; ``None`` there makes every expert-data-parallel rank a writer of the
    same ``_extra_state``). With GTP_remat off the aliases are exact: ``parallel_state`` builds the same aliases
    (``parallel_state.py``). Gate:
    :func:`~bridge_cudagraph.host.compat.collection_declares_gtp_remat_groups` (a core without these fields reads
    none). Undone by :func:`restore_bridge_collection`.

    Args:
        pgc: The collection (Bridge's, or any ``ProcessGroupCollection``).
        config: The model's config (the provider), for its GTP_remat sizes.

    Returns:
        The names of the fields set now (empty when there was nothing to set).

    Raises:
        RuntimeError: GTP_remat is on (``gtp_weight_remat_size`` or ``expert_gtp_weight_remat_size`` above 1) and a
            GTP_remat field is unset: the plain group would be the wrong one, and Bridge built no GTP_remat group
            (``bridge_cudagraph.plan.checks.check_decentralized`` refuses the setting before any group exists).
    """
    if not compat.collection_declares_gtp_remat_groups():
        return ()
    missing = [name for name in compat.GTP_REMAT_ALIASES if name not in vars(pgc)]
    if not missing:
        return ()
    sizes = {n: int(getattr(config, n, 1) or 1) for n in ("gtp_weight_remat_size", "expert_gtp_weight_remat_size")}
    if any(size > 1 for size in sizes.values()):
        settings = ", ".join(f"model.{n}={v}" for n, v in sizes.items())
        raise RuntimeError(
            f"the process group collection has no {', '.join(missing)} group, and with {settings} it is not "
            f"{compat.GTP_REMAT_ALIASES[missing[0]]}; Megatron-Bridge builds no GTP_remat groups under "
            "dist.use_decentralized_pg=true"
        )
    set_now = []
    for name in missing:
        group = getattr(pgc, compat.GTP_REMAT_ALIASES[name], None)
        if group is not None:  # an unset plain field: nothing to alias, the field stays unset too
            setattr(pgc, name, group)
            set_now.append(name)
    if set_now:
        setattr(pgc, COMPLETED, (*getattr(pgc, COMPLETED, ()), *set_now))
    return tuple(set_now)


def restore_bridge_collection(pgc: Any) -> None:
    """Undo :func:`complete_bridge_collection`: the fields it set are unset again (read as ``None``)."""
    for name in getattr(pgc, COMPLETED, ()):
        vars(pgc).pop(name, None)
    vars(pgc).pop(COMPLETED, None)


# ------------------------------------------------------------------ one host object's class (megatron-core 0.19.2)
_EXTENDED_CLASSES: dict[tuple[type, type], type] = {}


def extend_instance_class(obj: Any, mixin: type) -> None:
    """Give ``obj`` (one instance) a subclass of its own class with ``mixin`` in front, cached per class.

    For a host method with no hook, overridden for one object only: megatron-core 0.19.2's decoder
    (``TransformerBlock.forward``) for the packed replay, the optimizer's per-parameter walks for the host cache,
    Bridge 0.6.2's Qwen3-VL forward and deepstack merge (:mod:`bridge_cudagraph.host.forward`). The mixin must add no
    state the host saves or reads: parameters, buffers and state dicts are untouched (the optimizer cache keeps one
    private instance attribute, the forward a call counter and its embedding hook's handle, dropped on uninstall).
    Undone by :func:`restore_instance_class`.
    """
    cls = type(obj)
    if issubclass(cls, mixin):
        return
    obj.__class__ = extend_instance_class_of(cls, mixin)


def extend_instance_class_of(cls: type, mixin: type) -> type:
    """The subclass of ``cls`` with ``mixin`` in front, made once per pair."""
    key = (cls, mixin)
    if key not in _EXTENDED_CLASSES:
        _EXTENDED_CLASSES[key] = type(
            f"{mixin.__name__}{cls.__name__}", (mixin, cls), {"__module__": mixin.__module__}
        )
    return _EXTENDED_CLASSES[key]


def restore_instance_class(obj: Any, mixin: type) -> None:
    """Take ``mixin`` off ``obj``'s class (:func:`extend_instance_class`), keeping any other mixin put on it: the
    packed replay's decoder mixin and :mod:`bridge_cudagraph.host.forward`'s deepstack one share an object, and
    their owners take them off in either order."""
    cls = type(obj)
    if not issubclass(cls, mixin):
        return
    layers: list[type] = []  # the mixins on obj, outermost first
    while cls in _EXTENDED_CLASSES.values():
        outer, cls = cls.__bases__
        layers.append(outer)
    for outer in reversed(layers):
        if outer is not mixin:
            cls = extend_instance_class_of(cls, outer)
    obj.__class__ = cls
