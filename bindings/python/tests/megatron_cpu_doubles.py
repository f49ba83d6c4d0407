"""Test doubles for driving Megatron-Core 0.19.2's layers, checkpoints, DDP, optimizers and pipeline
schedules on a machine without a GPU (the gtp.megatron CPU tests): only where Megatron-Core itself
reaches for CUDA. init_megatron starts a test rank with the ones every test needs."""
import os

import torch


def init_megatron(rank, world, store_dir, **parallel):
    """A gloo process group over a FileStore in store_dir and Megatron-Core's parallel state with the
    given sizes (initialize_model_parallel's keywords); returns parallel_state."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    if not torch.cuda.is_available():
        # Megatron-Core's torch_dist writer calls torch.cuda.synchronize() and puts its one status flag
        # on torch.cuda.current_device() unconditionally (p2p_communication allocates what it receives
        # there too); with no GPU there is no device work to wait for and the tensors go to the CPU
        # (gloo): these two stand-ins are all that is replaced here.
        torch.cuda.synchronize = lambda *args, **kwargs: None
        torch.cuda.current_device = lambda: "cpu"
    store = torch.distributed.FileStore(os.path.join(store_dir, "store"), world)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(create_gloo_process_groups=False, **parallel)
    return ps


def without_cuda_streams():
    """DDP's grad sync asks for torch.cuda.current_stream() only to wait on CUDA-graph events (none
    here): it gets nothing."""
    torch.cuda.current_stream = lambda *args, **kwargs: None


class CudaTensorsOnCpu(torch.overrides.TorchFunctionMode):
    """Test double, only around the optimizer's construction and step (and the pipeline schedules, which
    count tokens in tensors made with device='cuda'): Megatron-Core's mixed-precision
    and distributed optimizers create their small bookkeeping tensors with device='cuda' (unit scale,
    grad-norm accumulator) and accept parameters by their CUDA type names ('torch.cuda.BFloat16Tensor').
    On a machine without a GPU those tensors go to the CPU and a CPU tensor answers its CUDA name."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)
