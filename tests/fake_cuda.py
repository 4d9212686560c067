"""What the CPU tests of CUDA graph capture use (serve/cuda_graphs.py, decode_slots.py): a stand-in for the
torch.cuda calls a capture makes, to check what happens to the caller's stream when a capture fails, and a
recorder of the ops a step dispatches, to check what a capture would freeze."""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map


class Dispatched(TorchDispatchMode):
    """Records each op dispatched under it: its name (`ops`), each call with its shapes, dtypes and host-side
    (non-tensor) arguments (`calls`: what a CUDA graph capture freezes), and, in order, the names among `watch`
    that ran (`seen`)."""

    def __init__(self, watch: frozenset[str] = frozenset()):
        super().__init__()
        self.watch, self.ops, self.calls, self.seen = watch, set(), [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.add(name)
        if name in self.watch:
            self.seen.append(name)
        shown = tree_map(lambda a: ("tensor", tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else repr(a),
                         (args, kwargs or {}))
        self.calls.append((str(func), shown))
        return func(*args, **(kwargs or {}))


class FakeCuda:
    """The torch.cuda calls StepGraph makes, on the CPU. `graph` is torch.cuda.graph's order of events: enter the
    capture stream, begin; on exit `capture_end` first, which raises when the capture was invalidated (as a host
    sync inside it does), and only then leave the capture stream, so a failed capture never restores it."""

    class Stream(str):
        def wait_stream(self, other):
            pass

    def __init__(self, monkeypatch):
        from draftlab.serve import cuda_graphs

        monkeypatch.setattr(cuda_graphs, "_broken_capture", None)  # a fresh process: no capture has failed yet
        self.current = self.Stream("default")
        fake = self

        class Graph:
            def __init__(self, graph, **kwargs):
                self.previous = None

            def __enter__(self):
                self.previous, fake.current = fake.current, fake.Stream("capture")

            def __exit__(self, kind, *rest):
                if kind is not None:
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
                fake.current = self.previous

        class StreamContext:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                self.previous, fake.current = fake.current, self.stream

            def __exit__(self, *args):
                fake.current = self.previous

        class CUDAGraph:
            """What the capture recorded: nothing here (its body ran eagerly, as kernels bound for another device
            than the capture stream's do), so a replay changes nothing."""

            def replay(self):
                pass

        for name, value in {"Stream": lambda *a, **k: self.Stream("side"), "current_stream": lambda *a: fake.current,
                            "set_stream": lambda stream: setattr(fake, "current", stream),
                            "stream": StreamContext, "graph": Graph, "CUDAGraph": CUDAGraph,
                            "device": lambda device: contextlib.nullcontext(),
                            "is_available": lambda: True, "synchronize": lambda *a: None}.items():
            monkeypatch.setattr(torch.cuda, name, value, raising=False)
