"""What each head-to-head variant runs (bench/megatron/head_to_head.py): the model, the parallel layout
per implementation, the TransformerConfig, and the checkpoint plan across G. Pure (no CUDA, no
process group): unit-tested on the CPU (h2h_test.py) with Megatron-Core's own config validation.

Implementations: "off" (GTP off: data parallel over what G would shard), "megatron" (Megatron-Core's
own GTP), "libgtp" (gtp.megatron.use_libgtp). All three keep TP, PP, VPP and EP; only G and EG differ,
so every rank holds the same TP / PP / EP slice and reads the same data in the three runs."""
from dataclasses import dataclass, field

SEQ, MICRO, MICROBATCHES, VOCAB, HIDDEN = 256, 2, 2, 4096, 512
IMPLS = ("off", "megatron", "libgtp")


@dataclass(frozen=True)
class Variant:
    """One head-to-head case. `ep` and `expert_gtp` are per world size (EP as Megatron allows there)."""
    name: str
    what: str
    config: dict = field(default_factory=dict)     # TransformerConfig overrides
    worlds: tuple = (2, 4)                         # world sizes it runs at
    tp: int = 1
    pp: int = 1
    vpp: int = None                                # virtual pipeline chunks per stage
    ep: dict = field(default_factory=dict)         # world -> expert_model_parallel_size
    expert_gtp: int = 1                            # EG (Megatron's expert_gtp_remat_size)
    layers: int = 2
    fused: bool = False                            # TE's fused wgrad into main_grad

    @property
    def moe(self):
        return bool(self.config.get("num_moe_experts"))


MOE = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_grouped_gemm": True, "moe_ffn_hidden_size": HIDDEN,
       "moe_token_dispatcher_type": "alltoall", "moe_aux_loss_coeff": 1e-2,
       "moe_router_load_balancing_type": "aux_loss"}

VARIANTS = {v.name: v for v in (
    Variant("gpt", "GPTModel, TE layer spec, BF16, no biases"),
    Variant("fused", "gpt with TE's fused wgrad into main_grad", fused=True),
    Variant("bias", "gpt with biases on every linear layer", {"add_bias_linear": True}),
    Variant("recompute", "gpt with full activation recompute (uniform, 1 layer)",
            {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}),
    Variant("fp8cs", "gpt under FP8 current scaling (tensorwise), libgtp's BF16 wire",
            {"fp8": "e4m3", "fp8_recipe": "tensorwise"}),
    Variant("moe", "4 experts in TEGroupedLinear, top-2, alltoall; expert GTP EG = 2 (EP 1 at world 2, 2 at world 4)",
            MOE, ep={2: 1, 4: 2}, expert_gtp=2),
    Variant("tp2", "gpt at TP 2 x G 2", worlds=(4,), tp=2),
    Variant("pp2vpp", "gpt at PP 2 x G 2, 2 virtual chunks per stage (interleaved schedule), 4 layers",
            worlds=(4,), pp=2, vpp=2, layers=4),
)}


def gtp_size(variant, world):
    """G: the world over TP x PP (CP 1), as Megatron's model size counts it."""
    model = variant.tp * variant.pp
    if world % model or world // model < 2:
        raise ValueError(f"variant {variant.name}: world {world} over TP {variant.tp} x PP {variant.pp} leaves "
                         f"G = {world / model:g}; run it at world {', '.join(map(str, variant.worlds))}")
    return world // model


def layout(variant, world, impl):
    """initialize_model_parallel's keyword arguments for one implementation of a variant."""
    if impl not in IMPLS:
        raise ValueError(f"impl {impl!r}: choose from {', '.join(IMPLS)}")
    if world not in variant.worlds:
        raise ValueError(f"variant {variant.name} runs at world {', '.join(map(str, variant.worlds))}, not {world}: "
                         f"use --world {variant.worlds[0]}")
    g = gtp_size(variant, world)
    on = impl != "off"
    return {"tensor_model_parallel_size": variant.tp, "pipeline_model_parallel_size": variant.pp,
            "virtual_pipeline_model_parallel_size": variant.vpp,
            "expert_model_parallel_size": variant.ep.get(world, 1),
            "gtp_remat_size": g if on else 1, "expert_gtp_remat_size": variant.expert_gtp if on else 1}


def config_kwargs(variant, world, impl):
    """TransformerConfig keyword arguments (dtypes: transformer_config adds them).
    The GTP runs carry TP x G and ETP x EG as megatron.training's arguments put them in the config
    (finalize_model_grads fences the GTP reduce-scatters on them)."""
    lay = layout(variant, world, impl)
    kwargs = dict(num_layers=variant.layers, hidden_size=HIDDEN, ffn_hidden_size=4 * HIDDEN, num_attention_heads=8,
                  hidden_dropout=0.0, attention_dropout=0.0, bf16=True, init_method_std=0.02,
                  gradient_accumulation_fusion=False, deterministic_mode=True, add_bias_linear=False,
                  tensor_model_parallel_size=variant.tp, pipeline_model_parallel_size=variant.pp,
                  virtual_pipeline_model_parallel_size=variant.vpp,
                  expert_model_parallel_size=lay["expert_model_parallel_size"],
                  tensor_parallel_num_weight_shards=variant.tp * lay["gtp_remat_size"],
                  expert_tensor_parallel_num_weight_shards=variant.tp * lay["expert_gtp_remat_size"])
    kwargs.update(variant.config)
    return kwargs


def transformer_config(variant, world, impl):
    """Megatron-Core's TransformerConfig for the variant (its own validation runs here), BF16."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
                             **config_kwargs(variant, world, impl))


def derived_sizes(variant, world, impl):
    """gtp.megatron's derivation of the sizes (what use_libgtp reads back from parallel_state)."""
    from gtp.megatron import derive_sizes
    lay = layout(variant, world, impl)
    return derive_sizes(world, tp=variant.tp, pp=variant.pp, ep=lay["expert_model_parallel_size"],
                        num_weight_shards=variant.tp * lay["gtp_remat_size"],
                        expert_num_weight_shards=variant.tp * lay["expert_gtp_remat_size"])


def data_index(rank, variant, world):
    """Which data this rank reads: its place on the data axis (DP x G; TP and PP peers read the same
    data). Megatron's orders put TP innermost, G (when on) and DP next, PP outermost, so it is the same
    for the three implementations of a variant."""
    return (rank // variant.tp) % (world // (variant.tp * variant.pp))


def chunks(variant):
    """Model chunks per rank: the virtual pipeline stages (1 without VPP)."""
    return variant.vpp or 1


def resolve(names, world):
    """The variants named on the command line (comma-separated) that run at `world`, and those that do not."""
    wanted = [n for n in names.split(",") if n]
    unknown = [n for n in wanted if n not in VARIANTS and n != "ckpt"]
    if unknown:
        raise ValueError(f"--variants {','.join(unknown)}: choose from {', '.join(list(VARIANTS) + ['ckpt'])}")
    runs = [n for n in wanted if n == "ckpt" or world in VARIANTS[n].worlds]
    skipped = {n: f"runs at world {', '.join(map(str, VARIANTS[n].worlds))}, not {world}"
               for n in wanted if n not in runs}
    return runs, skipped


# -- torch_dist checkpoints across G: each phase is one launch of `world` ranks --
CKPT_TRAIN, CKPT_CONTINUE = 3, 3  # steps before the save, steps after it (saver and loaders)


def checkpoint_plan():
    """The four launches of the checkpoint case, in order. A saver trains CKPT_TRAIN steps, saves
    (model + distributed optimizer, torch_dist), and continues CKPT_CONTINUE steps; a loader phase
    builds off, megatron and libgtp at its own world, each loads the checkpoint (with other initial
    weights first) and runs the same CKPT_CONTINUE steps. Verdicts compare the loaders with each other
    (the saver read other data at another world size, so it is no reference for them)."""
    return [
        {"phase": "save_megatron_g4", "world": 4, "role": "save", "impl": "megatron", "ckpt": "megatron_g4"},
        {"phase": "load_g2", "world": 2, "role": "load", "impls": IMPLS, "ckpt": "megatron_g4"},
        {"phase": "save_libgtp_g2", "world": 2, "role": "save", "impl": "libgtp", "ckpt": "libgtp_g2"},
        {"phase": "load_g4", "world": 4, "role": "load", "impls": IMPLS, "ckpt": "libgtp_g2"},
    ]


CKPT_VARIANT = "gpt"  # the model the checkpoint phases train


def phase_share(plan, index, seconds_left):
    """Phase `index`'s part of the seconds left: a load (three runs) weighs twice a save (one)."""
    weight = {"save": 1, "load": 2}
    return seconds_left * weight[plan[index]["role"]] / sum(weight[p["role"]] for p in plan[index:])


def phase_blocker(phase, saved, seconds):
    """Why a checkpoint phase cannot run (None when it can): a load whose checkpoint was not saved, or
    too little time for a launch (seconds: this phase's share of what is left)."""
    if phase["role"] == "load" and phase["ckpt"] not in saved:
        return f"the checkpoint {phase['ckpt']} was not saved"
    if seconds < 10:
        return f"{seconds:.0f} s left for it"
    return None
