"""A fixed-batch DP-SGD step captured once into a CUDA graph and replayed per step (issue 26).

EXPERIMENT, NOT YET RUN ON A GPU: written and checked on a CPU-only machine (torch 2.13+cpu), where
CUDA graphs do not exist. ``tests/training/test_cuda_graph_step.py`` holds the CUDA checks
(benchmarks/gpu_check.sh runs them); until they have passed on a GPU, nothing here is known to work.

Why: on an H200 our ghost-clipping step is host-bound (the launching thread's CPU time is 80-85% of
the wall time, benchmarks/RESULTS.md, issue 26). A CUDA graph replays the step's hundreds of kernels
with one launch. The step is the DP trainer's (:func:`dpaudit.training.dpsgd.set_private_gradients`
then ``optimizer.step()``): gather the batch by an index buffer on the device, ghost clipping, noise
once on the clipped sum, divide by B, SGD update. The trainer itself is unchanged.

Constraints of capture, and how this class meets them (PyTorch docs, "CUDA Graphs" in the CUDA
semantics notes; torch/cuda/graphs.py):

* Everything is static: the batch is a fixed index buffer on the device (``idx``), so every replay
  gathers the same rows (a benchmark of the step; a training loop would copy each batch's indices
  into this buffer before the replay, which needs a fixed batch size, i.e. padded Poisson chunks).
  Shapes, the learning rate, C, σC and B are baked into the graph at capture.
* Nothing may read a value back from the device during capture (``.item()``, ``bool(t)``, a
  pageable copy). The clipper's first call builds its plan and runs its checks, which do read values
  back, so it runs eagerly BEFORE the capture. After it, the step reads nothing back
  (tests/training/test_gpu_path.py checks that under ``torch.cuda.set_sync_debug_mode("error")``).
* Warm-up on a side stream before the capture (lazy cuBLAS/cuDNN handles and workspaces, autograd's
  streams), on the same stream that then captures (one stream for both: torch's own
  make_graphed_callables does the same).
* The ghost clipper's forward hooks run during the captured forward and record tensors; that is fine
  because they record the same shapes on every call and the recorded tensors live in the graph's
  memory pool. ``torch.autograd.grad`` inside the capture is supported (the docs' whole-network
  capture runs backward in the graph).
* ``optimizer.step()`` inside the capture: plain SGD (no state, a Python-float lr) is fine; Adam needs
  ``capturable=True`` (its step counter must live on the device). Optimizers with a ``capturable``
  option set to False are refused here.
* ``p.grad`` is assigned inside the capture: the assigned tensors are allocated from the graph's
  private memory pool, and every replay rewrites them in place, so ``p.grad`` after a replay holds
  that replay's noisy gradient.
* The noise generator MUST be registered with the graph (``graph.register_generator_state(gen)``)
  before capture. The default CUDA generator is registered automatically; ours is a separate
  ``torch.Generator`` and is not. Registered, each replay advances its Philox offset, so every replay
  draws fresh noise; unregistered, torch refuses the generator during capture or the replays reuse
  one draw. The same noise on every step is a privacy bug (the noise no longer hides the sum's
  changes between steps), so the CUDA test checks that two replays draw different noise with the
  right standard deviation.
* Memory: tensors allocated during capture come from a private pool that the graph keeps for its
  lifetime (``pool_mib``: memory reserved across the capture). A replay allocates nothing, so the
  benchmark's per-step peak-memory column reports ``pool_mib`` for this row instead.
"""

from __future__ import annotations

import torch

from dpaudit.training.dpsgd import set_private_gradients


class GraphedDPStep:
    """A DP-SGD step on the fixed batch ``idx`` of (``X``, ``y``), captured once; calling it replays it.

    Building it runs ``1 + warmup`` eager steps (the clipper's first call, then the warm-up on the
    capture stream) and then restores the parameters, so the model is as it was before the first
    replay; the generator has moved on by those steps' draws (fresh draws, never reused).
    """

    def __init__(
        self,
        clipper,
        optimizer: torch.optim.Optimizer,
        X: torch.Tensor,
        y: torch.Tensor,
        idx: torch.Tensor,
        *,
        clip: float,
        noise_std: float,
        batch_size: int,
        generator: torch.Generator,
        warmup: int = 3,
    ) -> None:
        if X.device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError("needs a CUDA device (torch.cuda.CUDAGraph)")
        if any(group.get("capturable") is False for group in optimizer.param_groups):
            raise ValueError("the optimizer must be built with capturable=True to run inside a CUDA graph")
        self.clipper, self.optimizer = clipper, optimizer
        self.X, self.y = X, y
        self.idx = idx.to(X.device)  # the static index buffer: every replay gathers these rows
        self.kw = dict(clip=clip, noise_std=noise_std, batch_size=batch_size, generator=generator)
        saved = [p.detach().clone() for p in clipper.params]
        self._eager()  # the clipper's plan and checks: reads values back, so never inside the capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self._eager()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        self.graph.register_generator_state(generator)  # else every replay would reuse one noise draw
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved()
        with torch.cuda.graph(self.graph, stream=stream):
            self._eager()
        torch.cuda.synchronize()
        self.pool_mib = (torch.cuda.memory_reserved() - reserved) / 2**20
        with torch.no_grad():  # undo the eager steps' updates in place (the graph holds these addresses)
            for p, s in zip(clipper.params, saved, strict=True):
                p.copy_(s)

    def _eager(self) -> None:
        set_private_gradients(self.clipper, self.X, self.y, self.idx, max_physical_batch=None, pad=False, **self.kw)
        self.optimizer.step()

    def __call__(self) -> None:
        self.graph.replay()
