"""gtp.torch: libgtp in PyTorch. A Context bootstrapped through a torch.distributed.Store, sharded
parameters implementing TransformerEngine's DistributedWeight protocol (gtp.torch.te.distribute puts
TE's own layers on them), gtp.torch.Linear and gtp.torch.GroupedLinear (MoE experts). See docs/python.md."""
from .context import Context, TorchStore
from .grouped_linear import GroupedLinear
from .linear import Linear
from .parameter import (ShardedParameter, finalize_weight_grads, is_distributed_weight, materialize_weight_for_backward,
                        materialize_weight_for_forward)
from .checkpoint import consolidate_state_dicts
from . import te

__all__ = ["Context", "TorchStore", "Linear", "GroupedLinear", "ShardedParameter", "consolidate_state_dicts", "is_distributed_weight",
           "materialize_weight_for_forward", "materialize_weight_for_backward", "finalize_weight_grads"]
