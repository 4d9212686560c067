"""A stand-in for the torch.cuda calls that a CUDA graph capture makes, so the CPU tests can check what happens to
the caller's stream when a capture fails (serve/cuda_graphs.py, decode_slots.py)."""

from __future__ import annotations

import contextlib

import torch


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
