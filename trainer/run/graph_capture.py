"""One lock between the embedded engine's CUDA graph captures and the learner's forward/backward in one process.

The trainer runs the embedded engine and the learner in one process on one GPU, each on its own thread. Seen on an
H200 (benchmarks/gpu_check.py and tests/trainer/engines/test_engine_models.py, 2026-11-28), while the engine
captured a decode graph and another thread worked on the GPU:
- in CUDA's default (global) capture mode, that thread's allocations and syncs invalidated the capture;
- in thread-local mode, a random number drawn on that thread failed it ("Offset increment outside graph capture
  encountered unexpectedly": a capture puts the default CUDA generator into its capturing state for every thread);
- in thread-local mode with this lock held around the random numbers, allocations, copies and `.item()` outside the
  lock passed (5 of 5 runs), and a device-wide `torch.cuda.synchronize()` outside it invalidated the capture (4 of 4).

So captures run in thread-local mode holding `CAPTURE_LOCK`, and the learner holds it around each micro-batch's
forward and backward, where its random numbers are drawn (dropout, gradient checkpointing's saved RNG state). A
device-wide sync (`torch.cuda.synchronize`, `torch.cuda.empty_cache`) in the trainer's process must hold it too;
the trainer's code makes none. A capture waits at most one micro-batch, once per (batch, key-width) bucket.
"""

from __future__ import annotations

import threading

CAPTURE_LOCK = threading.Lock()
