"""Megatron-Core's GTP knobs as libgtp sizes: the same derivation, the same refusals, the same data
accounting (DP x G ranks read distinct data), and the check that libgtp's groups hold the ranks of
Megatron's. Pure arithmetic except `check_groups` (torch.distributed)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class MegatronSizes:
    """The parallel sizes of a Megatron-Core job as both sides name them."""
    world_size: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    gtp: int            # gtp_weight_remat_size (G)
    expert_gtp: int     # expert_gtp_weight_remat_size (EG)
    dp: int             # the replicate degree (excludes G), as parallel_state's data_parallel_size
    expert_dp: int

    @property
    def data_ranks(self):
        """Ranks that read distinct data: DP x G (Megatron-Core's full data-distribution axis)."""
        return self.dp * self.gtp

    def profile_parallel(self):
        """The `parallel` object of a libgtp profile for these sizes (docs/profiles.md)."""
        return {"world_size": self.world_size, "tensor_model_parallel_size": self.tp,
                "tensor_parallel_num_weight_shards": self.tp * self.gtp, "context_parallel_size": self.cp,
                "pipeline_model_parallel_size": self.pp, "expert_model_parallel_size": self.ep,
                "expert_tensor_parallel_size": self.etp,
                "expert_tensor_parallel_num_weight_shards": self.etp * self.expert_gtp}


def _positive(value, name):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def weight_shards_to_gtp(tp, num_weight_shards, field="tensor_parallel_num_weight_shards",
                         tp_field="tensor_model_parallel_size"):
    """G from Megatron's user-facing knob, as megatron.core.model_parallel_config derives it:
    None means GTP off (G = 1); otherwise shards >= TP and divisible by TP, G = shards / TP."""
    _positive(tp, tp_field)
    if num_weight_shards is None:
        return 1
    _positive(num_weight_shards, field)
    if num_weight_shards < tp:
        raise ValueError(f"{field} ({num_weight_shards}) must be >= {tp_field} ({tp}): set it to {tp} (GTP off) "
                         f"or to a multiple of {tp}")
    if num_weight_shards % tp:
        raise ValueError(f"{field} ({num_weight_shards}) must be divisible by {tp_field} ({tp}): use "
                         f"{num_weight_shards - num_weight_shards % tp or tp} or {num_weight_shards + tp - num_weight_shards % tp}")
    return num_weight_shards // tp


def derive_sizes(world_size, *, tp=1, pp=1, cp=1, ep=1, etp=None, num_weight_shards=None,
                 expert_num_weight_shards=None):
    """The sizes Megatron-Core's initialize_model_parallel derives from these knobs, refusing what it
    refuses (each error names the knob and a fix). etp=None follows TP, as in Megatron-Core."""
    for value, name in ((world_size, "world_size"), (tp, "tensor_model_parallel_size"),
                        (pp, "pipeline_model_parallel_size"), (cp, "context_parallel_size"),
                        (ep, "expert_model_parallel_size")):
        _positive(value, name)
    etp = tp if etp is None else _positive(etp, "expert_tensor_parallel_size")
    gtp = weight_shards_to_gtp(tp, num_weight_shards)
    expert_gtp = weight_shards_to_gtp(etp, expert_num_weight_shards, "expert_tensor_parallel_num_weight_shards",
                                      "expert_tensor_parallel_size")
    model = tp * pp * cp * gtp
    if world_size % model:
        raise ValueError(f"world_size ({world_size}) is not divisible by tensor_model_parallel_size ({tp}) x "
                         f"pipeline_model_parallel_size ({pp}) x context_parallel_size ({cp}) x "
                         f"gtp_weight_remat_size ({gtp}) = {model}: use a world size that is a multiple of {model}, "
                         "or fewer weight shards")
    expert_model = etp * ep * pp * expert_gtp
    if world_size % expert_model:
        raise ValueError(f"world_size ({world_size}) is not divisible by expert_tensor_parallel_size ({etp}) x "
                         f"expert_model_parallel_size ({ep}) x pipeline_model_parallel_size ({pp}) x "
                         f"expert_gtp_weight_remat_size ({expert_gtp}) = {expert_model}: use a world size that is a "
                         f"multiple of {expert_model}, or fewer expert weight shards")
    return MegatronSizes(world_size, tp, pp, cp, ep, etp, gtp, expert_gtp, world_size // model,
                         world_size // expert_model)


def microbatches(global_batch_size, micro_batch_size, sizes):
    """Microbatches per step as Megatron-Core counts them: global batch / (micro batch x DP x G), which
    must divide exactly (each of the DP x G data ranks reads its own microbatches)."""
    _positive(global_batch_size, "global_batch_size")
    _positive(micro_batch_size, "micro_batch_size")
    per_step = micro_batch_size * sizes.data_ranks
    if global_batch_size % per_step:
        low = global_batch_size - global_batch_size % per_step
        raise ValueError(f"global_batch_size ({global_batch_size}) is not divisible by micro_batch_size "
                         f"({micro_batch_size}) x data-parallel ranks DP ({sizes.dp}) x G ({sizes.gtp}) = {per_step}: "
                         f"use {low or per_step} or {low + per_step}")
    return global_batch_size // per_step


def consumed_samples(steps, global_batch_size):
    """Samples consumed after `steps` optimizer steps (every data rank together), as Megatron counts."""
    return steps * global_batch_size


def sizes_from_parallel_state():
    """MegatronSizes of the running job, read from megatron.core.parallel_state (initialized)."""
    import torch
    from megatron.core import parallel_state as ps
    if not ps.model_parallel_is_initialized():
        raise RuntimeError("megatron.core.parallel_state is not initialized: call "
                           "parallel_state.initialize_model_parallel(...) before gtp.megatron.use_libgtp()")
    world = torch.distributed.get_world_size()
    tp = ps.get_tensor_model_parallel_world_size()
    etp = ps.get_expert_tensor_parallel_world_size()
    gtp = ps.get_gtp_weight_remat_world_size() or 1
    egtp = ps.get_expert_gtp_weight_remat_world_size() or 1
    return derive_sizes(world, tp=tp, pp=ps.get_pipeline_model_parallel_world_size(),
                        cp=ps.get_context_parallel_world_size(), ep=ps.get_expert_model_parallel_world_size(),
                        etp=etp, num_weight_shards=tp * gtp, expert_num_weight_shards=etp * egtp)


def check_groups(context):
    """Collective over torch.distributed: every rank's libgtp positions must match Megatron's groups
    (member i of this rank's Megatron gtp_remat group is libgtp gtp_remat rank i, with the same TP rank
    and DP rank; likewise its expert gtp_remat group). Raises naming both layouts otherwise."""
    import torch
    from megatron.core import parallel_state as ps
    s = context.sizes
    mine = (s.tp_rank, s.gtp_remat_rank, s.dp_rank, s.data_parallel_index, s.expert_gtp_remat_rank)
    everyone = [None] * s.world_size
    torch.distributed.all_gather_object(everyone, mine)
    checks = [("gtp_remat", ps.get_gtp_weight_remat_group(), 1),
              ("tp", ps.get_tensor_model_parallel_group(), 0)]
    expert = ps.get_expert_gtp_weight_remat_group(check_initialized=False)
    if expert is not None:
        checks.append(("expt_gtp_remat", expert, 4))
    for name, group, index in checks:
        members = torch.distributed.get_process_group_ranks(group)
        got = [everyone[r][index] for r in members]
        if got != list(range(len(members))):
            raise RuntimeError(f"libgtp's {name} groups differ from Megatron-Core's: Megatron's group of rank "
                               f"{s.rank} is ranks {members}, whose libgtp {name} ranks are {got} (expected "
                               f"{list(range(len(members)))}); initialize Megatron with order='tp-cp-ep-dp-pp' "
                               "(its default), which libgtp's grid follows")
    # Ranks that read the same data in Megatron (its tp group) must share libgtp's data index.
    indices = {everyone[r][3] for r in torch.distributed.get_process_group_ranks(ps.get_tensor_model_parallel_group())}
    if len(indices) != 1:
        raise RuntimeError(f"libgtp gives the TP peers of rank {s.rank} different data indices {sorted(indices)}; "
                           "their data must be the same")
