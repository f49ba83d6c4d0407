"""The two install traps of a stock Megatron Bridge 0.6.2 + Megatron-Core 0.19.2 install, each worked
around explicitly by `apply_install_workarounds()` (docs/bridge.md says what each does and costs)."""
import importlib
import importlib.metadata
import importlib.util
import os
import sys

NVRX_ASYNC_MIN = (0, 6, 0)  # megatron/core/dist_checkpointing/strategies/nvrx.py NVRX_MIN_VERSION
_APPLIED = {}


def _version_tuple(text):
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def nvrx_async_supported():
    """Whether the installed nvidia-resiliency-ext is new enough for Megatron-Core's async checkpoints."""
    try:
        return _version_tuple(importlib.metadata.version("nvidia-resiliency-ext")) >= NVRX_ASYNC_MIN
    except importlib.metadata.PackageNotFoundError:
        return False


def apply_install_workarounds():
    """Call before importing Megatron Bridge. Returns {trap: what was done} (empty when nothing was needed).

    1. nvidia-resiliency-ext older than 0.6.0 (PyPI serves 0.4.1): Megatron-Core 0.19.2's torch_dist
       strategy, at import, finds its async-checkpoint modules, then reads `__version__` (0.4.1 has
       none) and asserts >= 0.6.0, so no checkpoint code imports. The workaround hides only that
       package (`nvidia_resiliency_ext.checkpointing.async_ckpt`): Megatron-Core then takes its
       documented no-NVRx path (synchronous torch_dist saves), and gtp.bridge refuses async_save.
       Bridge still imports `nvidia_resiliency_ext.inprocess` (in-process restart, refused too).
    2. Bridge's initialize_megatron always runs Megatron-Core's compile_helpers(), which runs `make`
       in megatron/core/datasets and exits the process where the wheel ships the built helpers_cpp
       but no Makefile. The workaround replaces Bridge's reference to it by one that imports the
       shipped helpers_cpp, and runs the original compile_helpers where a Makefile exists."""
    done = hide_old_nvrx_async()
    datasets = os.path.dirname(importlib.util.find_spec("megatron.core.datasets").origin)
    if not os.path.exists(os.path.join(datasets, "Makefile")):
        importlib.import_module("megatron.core.datasets.helpers_cpp")  # raises if the wheel lacks it too
        initialize = importlib.import_module("megatron.bridge.training.initialize")
        if getattr(initialize.compile_helpers, "_gtp_prebuilt", False) is False:
            def use_prebuilt_helpers():
                """gtp.bridge: the wheel ships helpers_cpp and no Makefile; import it instead of running make."""
                importlib.import_module("megatron.core.datasets.helpers_cpp")
            use_prebuilt_helpers._gtp_prebuilt = True
            initialize.compile_helpers = use_prebuilt_helpers
        done["compile_helpers"] = "no Makefile in megatron/core/datasets: Bridge's compile_helpers imports the shipped helpers_cpp"
    _APPLIED.update(done)
    return done


def hide_old_nvrx_async():
    """Trap 1 alone (apply_install_workarounds runs it first); it must run before Megatron-Core's
    checkpoint strategies are imported, i.e. before megatron.bridge."""
    done = {}
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        raise ImportError("Megatron Bridge 0.6.2 imports nvidia_resiliency_ext.inprocess at load: pip install "
                          "nvidia-resiliency-ext (any version; gtp.bridge hides its async checkpointing if < 0.6.0)")
    if not nvrx_async_supported():
        name = "nvidia_resiliency_ext.checkpointing.async_ckpt"
        if "megatron.core.dist_checkpointing.strategies.torch" in sys.modules and not _APPLIED.get("nvrx"):
            raise RuntimeError("gtp.bridge.apply_install_workarounds() must run before Megatron-Core's checkpoint "
                               "strategies are imported (call it before importing megatron.bridge)")
        sys.modules[name] = None  # `import` of it and its submodules now raises ImportError
        done["nvrx"] = (f"nvidia-resiliency-ext {importlib.metadata.version('nvidia-resiliency-ext')} < 0.6.0: "
                        f"{name} hidden, Megatron-Core checkpoints without NVRx async (async_save refused)")
    _APPLIED.update(done)
    return done


def applied():
    return dict(_APPLIED)
