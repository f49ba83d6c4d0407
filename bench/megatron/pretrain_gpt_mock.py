"""A minimal pretrain_gpt-style Megatron-LM script (megatron-core 0.19.2's `megatron.training`): its own
argument parser, a GPT with the TE layer spec, Megatron-Core's mock GPT dataset, Megatron-LM's
`pretrain`. With `--gtp-backend libgtp` the one line of docs/megatron.md (gtp.megatron.training.enable())
puts GTP on libgtp; with `--gtp-backend megatron` it is Megatron-Core's own GTP.

Run one rank per process (torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); G is
Megatron's --tensor-parallel-num-weight-shards. `--gtp-record FILE` appends, per iteration and per
evaluation, what Megatron-LM's loop reports (loss, learning rate, consumed samples) as JSON lines; the
driver bench/megatron/pretrain_gpu.py compares them between backends."""
import importlib.util
import json
import sys
from functools import partial

if importlib.util.find_spec("nvidia_resiliency_ext") is not None:
    # nvidia-resiliency-ext < 0.6.0 breaks Megatron-Core 0.19.2's checkpoint import (docs/bridge.md, trap 1).
    from gtp.bridge.install import hide_old_nvrx_async
    hide_old_nvrx_async()

import torch  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec  # noqa: E402
from megatron.training import get_args, get_tokenizer, pretrain  # noqa: E402
from megatron.training.argument_utils import core_transformer_config_from_args, pretrain_cfg_container_from_args  # noqa: E402
from megatron.training.arguments import parse_and_validate_args  # noqa: E402

import gtp.megatron  # noqa: E402


def add_arguments(parser):
    group = parser.add_argument_group("gtp bench")
    group.add_argument("--gtp-backend", choices=("megatron", "libgtp"), default="megatron",
                       help="whose GTP trains: Megatron-Core's own, or libgtp through gtp.megatron.training.enable()")
    group.add_argument("--gtp-machinery-at-g1", action="store_true",
                       help="with libgtp: put the TE layers on libgtp at G = 1 too (use_libgtp's machinery_at_g1)")
    group.add_argument("--gtp-record", default=None, help="append per-iteration / per-evaluation JSON lines here")
    return parser


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    args = get_args()
    config = config or core_transformer_config_from_args(args)
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
                    vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
                    pre_process=pre_process, post_process=post_process, vp_stage=vp_stage,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                    pg_collection=pg_collection)


def loss_func(loss_mask, output_tensor):
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}


def forward_step(data_iterator, model):
    """TP 1 and CP 1 (main() refuses others): every rank reads its own batch from its data iterator."""
    batch = {k: v.cuda(non_blocking=True) for k, v in next(data_iterator).items() if torch.is_tensor(v)}
    output = model(batch["tokens"], batch["position_ids"], batch.get("attention_mask"), labels=batch["labels"],
                   loss_mask=batch["loss_mask"])
    return output, partial(loss_func, batch["loss_mask"])


def datasets_provider(train_val_test_num_samples, vp_stage=None):
    from megatron.core import parallel_state
    args = get_args()
    config = GPTDatasetConfig(random_seed=args.seed, sequence_length=args.seq_length, blend=None,
                              blend_per_split=None, split=args.split, tokenizer=get_tokenizer(),
                              reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                              path_to_cache=args.data_cache_path, mid_level_dataset_surplus=args.mid_level_dataset_surplus)
    return BlendedMegatronDatasetBuilder(
        MockGPTDataset, train_val_test_num_samples,
        lambda: parallel_state.get_tensor_model_parallel_rank() == 0, config).build()


datasets_provider.is_distributed = True


def record_to(path):
    """Bench instrumentation: Megatron-LM's own training_log and evaluate, wrapped to append what they
    report (the values the loop computed; nothing is recomputed)."""
    from megatron.training import training

    def write(entry):
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def scalar(value):
        if torch.is_tensor(value):
            value = value.float()
            return value.item() if value.numel() == 1 else (value[0] / value[1]).item()
        return float(value)

    log, evaluate = training.training_log, training.evaluate

    def training_log(loss_dict, total_loss_dict, learning_rate, iteration, *rest, **kw):
        args = get_args()
        write({"kind": "train", "iteration": iteration, "lr": learning_rate,
               "consumed_train_samples": args.consumed_train_samples,
               "loss": {k: scalar(v) for k, v in loss_dict.items()},
               "grad_norm": None if rest[3] is None else float(rest[3])})
        return log(loss_dict, total_loss_dict, learning_rate, iteration, *rest, **kw)

    def evaluate_recorded(*a, **kw):
        result = evaluate(*a, **kw)
        args = get_args()
        write({"kind": "eval", "consumed_train_samples": args.consumed_train_samples,
               "consumed_valid_samples": args.consumed_valid_samples,
               "eval_iters": kw.get("eval_iters") or args.eval_iters,
               "loss": {k: scalar(v) for k, v in (result[0] or {}).items()}})
        return result
    training.training_log, training.evaluate = training_log, evaluate_recorded


def main():
    args = parse_and_validate_args(extra_args_provider=add_arguments)
    if args.tensor_model_parallel_size != 1 or args.context_parallel_size != 1 or args.pipeline_model_parallel_size != 1:
        raise SystemExit(f"pretrain_gpt_mock.py: TP {args.tensor_model_parallel_size}, CP {args.context_parallel_size}, "
                         f"PP {args.pipeline_model_parallel_size}: this script runs TP = CP = PP = 1 (its batches are "
                         "not broadcast or split); G comes from --tensor-parallel-num-weight-shards")
    if args.gtp_record:
        record_to(args.gtp_record)
    if args.gtp_backend == "libgtp":
        gtp.megatron.training.enable(machinery_at_g1=args.gtp_machinery_at_g1)  # the one line (docs/megatron.md)
    try:
        pretrain(pretrain_cfg_container_from_args(args), datasets_provider, ModelType.encoder_or_decoder, forward_step,
                 model_provider=model_provider)
    except SystemExit as stop:  # Megatron-LM exits at --exit-interval with sys.exit(0), after saving
        if stop.code not in (0, None):
            raise
    if args.gtp_backend == "libgtp":
        gtp.megatron.training.disable()  # closes libgtp's context (collective: every rank got here)
    return 0


if __name__ == "__main__":
    sys.exit(main())
