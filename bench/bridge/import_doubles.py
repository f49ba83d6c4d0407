"""TEST DOUBLES for packages Megatron Bridge 0.6.2 imports at load but the GPU run never uses, where
the GPU machine lacks them (it has no network, and these are hundreds of MB: transformers, pandas,
pyarrow, ...). Bridge's `megatron/bridge/__init__.py` imports every model bridge (Hugging Face
conversion, registered with transformers' Auto classes at import) and its SFT / VLM data builders
(datasets, pandas); the run here (`bridge_gpu.py`: GPTModelProvider, NullTokenizer, mock data,
torch_dist checkpoints) reaches none of them after import.

install(names) puts a finder last on sys.meta_path: only a package that no real finder provides gets
a double. A double module answers any attribute or submodule with a stand-in class (subclassable,
usable in annotations and decorators) and records every touch. seal() ends the import phase: from
then on calling, instantiating or reading an attribute of a stand-in raises DoubleUsed naming the
package, so a run that finishes after seal() provably never used one. report() says which packages
were doubled and what was touched before seal()."""
import importlib.abc
import importlib.machinery
import sys
import types

# Packages Bridge 0.6.2 imports at load that the mock-data GPT pretrain never uses (see the docstring).
NAMES = ("transformers", "tokenizers", "safetensors", "huggingface_hub", "datasets", "pandas", "pyarrow",
         "diffusers", "PIL", "scipy", "sentencepiece", "tiktoken", "timm", "open_clip", "qwen_vl_utils",
         "accelerate", "peft", "wandb", "mlflow", "comet_ml", "megatron.energon")

_STATE = {"sealed": False, "doubled": set(), "touched": {}}


class DoubleUsed(RuntimeError):
    pass


def _touch(what):
    if _STATE["sealed"]:
        raise DoubleUsed(f"TEST DOUBLE {what} was used after import: the run needs the real "
                         f"{what.split('(')[0]} package (add its wheel to the bridge carry, tools/gpu/bridge_wheels.py)")
    _STATE["touched"][what] = _STATE["touched"].get(what, 0) + 1


class _StandInMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _touch(f"{cls._double_name}.{name}")
        return _stand_in(f"{cls._double_name}.{name}")

    def __call__(cls, *args, **kwargs):
        _touch(f"{cls._double_name}()")
        if len(args) == 1 and not kwargs and (isinstance(args[0], type) or callable(args[0])):
            return args[0]  # used as a decorator at import: the decorated object unchanged
        return _stand_in(f"{cls._double_name}()")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False


class _StandIn(metaclass=_StandInMeta):
    _double_name = "double"

    def __init_subclass__(cls, **kwargs):  # e.g. TypedDict-like `total=False` of the classes doubled
        pass


def _stand_in(name):
    return _StandInMeta(name.rsplit(".", 1)[-1], (_StandIn,), {"_double_name": name, "__module__": name.rsplit(".", 1)[0]})


class _DoubleModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _touch(f"{self.__name__}.{name}")
        return _stand_in(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if not any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _DoubleModule(spec.name, f"TEST DOUBLE (bench/bridge/import_doubles.py) for {spec.name}")
        module.__path__ = []
        module.__version__ = "0+test.double"
        return module

    def exec_module(self, module):
        _STATE["doubled"].add(next(n for n in self.names if module.__name__ == n or module.__name__.startswith(n + ".")))


def install(names=NAMES):
    """Doubles, among `names`, the packages no other finder provides (call before importing Bridge)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder(names))


def seal():
    _STATE["sealed"] = True


def report():
    return {"doubled": sorted(_STATE["doubled"]), "sealed": _STATE["sealed"],
            "touched_at_import": len(_STATE["touched"]),
            "touched_examples": sorted(_STATE["touched"])[:20]}
