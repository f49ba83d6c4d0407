"""Test doubles for driving Megatron-Core 0.19.2's optimizers and pipeline schedules on a machine without a
GPU (the gtp.megatron CPU tests): only where Megatron-Core itself puts tensors on CUDA."""
import torch


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
