"""Imports Megatron Bridge 0.6.2 on a machine without TransformerEngine (CI, no GPU).

Bridge imports `transformer_engine.pytorch` unconditionally in one module it loads at start,
`megatron/bridge/peft/lora_layers.py` (LoRA adapters, which these tests never build), and reads
`te.ops.Sequential` there in two annotations. TEST DOUBLE: a module with only that name stands in for
TransformerEngine while Bridge is imported, and is removed from sys.modules right after, so every
later `import transformer_engine` (Megatron-Core's guarded ones included) fails as without TE.
Megatron-Core's modules that Bridge names are imported first, without the double, so they see no
TE (HAVE_TE False, as the gtp.megatron tests run them)."""
import ast
import importlib
import importlib.util
import os
import sys
import types


class _SequentialDouble:  # what lora_layers' annotations name; never instantiated here
    pass


def _bridge_named_megatron_core_modules(bridge_root):
    names = set()
    for folder, _, files in os.walk(bridge_root):
        for file in files:
            if not file.endswith(".py"):
                continue
            with open(os.path.join(folder, file), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:
                for inner in ast.walk(node) if isinstance(node, ast.Try) else [node]:
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("megatron.core"):
                        names.add(inner.module)
                    elif isinstance(inner, ast.Import):
                        names.update(a.name for a in inner.names if a.name.startswith("megatron.core"))
    return sorted(names)


def import_bridge():
    """Imports megatron.bridge (and returns it), with the TE double only where TE is absent."""
    if importlib.util.find_spec("transformer_engine") is not None:
        return importlib.import_module("megatron.bridge")
    bridge_root = os.path.dirname(importlib.util.find_spec("megatron.bridge").origin)
    for name in _bridge_named_megatron_core_modules(bridge_root):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a module needing a package these tests do not install; Bridge guards it too or never loads it
    te = types.ModuleType("transformer_engine")
    te_pytorch = types.ModuleType("transformer_engine.pytorch")
    te_pytorch.ops = types.SimpleNamespace(Sequential=_SequentialDouble)
    te.pytorch = te_pytorch
    te.__doc__ = te_pytorch.__doc__ = "TEST DOUBLE (tests/bridge_te_double.py): TransformerEngine is not installed"
    sys.modules["transformer_engine"], sys.modules["transformer_engine.pytorch"] = te, te_pytorch
    try:
        return importlib.import_module("megatron.bridge")
    finally:
        del sys.modules["transformer_engine"], sys.modules["transformer_engine.pytorch"]
