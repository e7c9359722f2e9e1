"""Starting ``accelerate launch`` subprocesses from the drivers (``scripts/multi_gpu_check.py``,
``scripts/run_variants.py``): a free rendezvous port per launch and the environment every launched process gets."""

from __future__ import annotations

import socket

__all__ = ["NO_MULTICAST", "free_port"]

# NVLink multicast stays off in every process started here (shared GPU hosts: see the device notes)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the main process's rendezvous port of one launch)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
