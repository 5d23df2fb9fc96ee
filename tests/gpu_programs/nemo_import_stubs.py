"""Import-only stand-ins for modules that `nemo.collections.llm` (NeMo 2.2.1) imports at load time
through its NLP, ASR-text and quantization collections but that fine-tuning a Llama never calls:
Chinese/Japanese text tools, metrics, zarr checkpoints, the modelopt quantizer. The GPU machine has
no internet and a 64 MiB carry, so these are stubbed instead of carried (jieba alone is 19 MB).

`install(names)` puts a meta-path finder LAST on sys.meta_path: a module that is really installed
is always used; only a missing one becomes a stub, whose every attribute is a placeholder class.
Any real use of a stub fails loudly (calling the placeholder raises). Loaded through a .pth line
(`import nemo_import_stubs; nemo_import_stubs.install()`) on the GPU machine.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = (
    "fabric",
    "paramiko",
    "invoke",
    "cryptography",
    "nacl",
    "bcrypt",
    "jieba",
    "pulp",
    "modelopt",
    "zarr",
    "numcodecs",
    "opencc",
    "rouge_score",
    "nltk",
    "ijson",
    "pangu",
    "asciitree",
)
USED: list[str] = []


class _Placeholder:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__module__}.{type(self).__name__} is an import-only stub (nemo_import_stubs)")

    def __init_subclass__(cls, **kwargs):
        pass


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = type(name, (_Placeholder,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        USED.append(spec.name)
        return module

    def exec_module(self, module):
        pass


def install(names=STUBBED) -> None:
    if not any(isinstance(finder, _StubFinder) for finder in sys.meta_path):
        sys.meta_path.append(_StubFinder(names))
