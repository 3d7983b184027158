"""Stand-ins for the GPU-only modules SGLang's scheduler code imports but never calls on a CPU.

SGLang's scheduler modules import triton kernels, CUDA extension packages and vision/audio
libraries at module level (kernels are *defined* at import time, not run). The scheduling
decisions this package drives -- ``PrefillAdder``, ``Req``, the prefill budgets -- never execute
any of them. Rather than installing gigabytes of CUDA wheels, :func:`install` registers a
meta-path finder that answers imports of exactly those top-level packages with permissive
modules: any attribute is a :class:`Stub` that can be called, used as a decorator, subscripted
or iterated over, and does nothing.

Everything else -- the scheduler, the batch, the budgets, the allocator and prefix-cache base
classes -- is upstream's real code.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

#: top-level packages that only exist for GPU execution (kernels, CUDA runtimes, media decoding)
GPU_ONLY = (
    "triton",
    "sgl_kernel",
    "sglang_kernel",
    "flashinfer",
    "flash_attn",
    "deep_gemm",
    "deep_ep",
    "tilelang",
    "cuda",
    "cutlass",
    "quack",
    "torchvision",
    "torchaudio",
    "torch_memory_saver",
    "pynvml",
    "nvidia",
    "humming_kernels",
    "kernels",
    "tvm_ffi",
)
# Not torchcodec: SGLang's scheduler path imports it only where it falls back on an ImportError
# (``sglang.srt.utils.video_decoder``), and a stub in ``sys.modules`` would then answer
# transformers 5.19.0's later probe for it (``find_spec`` looks there first), whose version
# lookup fails for want of metadata.


#: what a stub answers as the real package does without a GPU: an error, not a stub
NO_DEVICE = frozenset({"triton.runtime.driver.active"})


class Stub:
    """Anything a module-level kernel definition may ask for, doing nothing."""

    def __init__(self, name: str = "stub") -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Stub:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        name = f"{self._name}.{attr}"
        if name in NO_DEVICE:
            # as the real package answers on a machine without a GPU (triton: "0 active
            # drivers"), so that code probing for a device falls back to the CPU
            raise RuntimeError(f"{name}: no GPU on this machine (policykit's GPU stub)")
        return Stub(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Used bare as a decorator (``@triton.jit``): hand the function back unchanged.
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return Stub(f"{self._name}()")

    def __getitem__(self, key: Any) -> Stub:
        return Stub(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __mro_entries__(self, bases: tuple) -> tuple:
        # ``class X(triton.Something):`` gets a plain base class
        return (object,)

    def __repr__(self) -> str:
        return f"<gpu stub {self._name}>"


def _ignore(self: object, *args: Any, **kwargs: Any) -> None:
    """The constructor of a stub class: takes anything, keeps nothing."""


class _StubModule(types.ModuleType):
    __version__: str

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        if attr[:1].isupper():
            # A class name: callers test ``isinstance(x, triton.JITFunction)`` or subclass it.
            # (``triton.Config(...)`` in a kernel's autotune list: built with any arguments)
            value: Any = type(attr, (), {"__module__": self.__name__, "__init__": _ignore})
        else:
            value = Stub(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] not in GPU_ONLY or _probing():
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _probing() -> bool:
    """Whether the lookup is a feature probe (``importlib.util.find_spec``) rather than an import.

    Libraries probe for optional GPU packages (torch for triton, transformers for torchvision)
    and then use them in earnest; to a probe the packages are absent, as they are on this machine.
    """
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _UTIL_FIND_SPEC:
            return True
        frame = frame.f_back
    return False


_UTIL_FIND_SPEC = importlib.util.find_spec.__code__
_FINDER = _Finder()


def install() -> None:
    """Answer imports of the GPU-only packages with stubs (idempotent).

    Put in front of the normal finders so that a partly installed CUDA package never shadows
    the stub with an import that needs a driver.
    """
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
