"""The smallest Bridge configs that train on one GPU with mock data: Bridge's
recipes/gpt/h100/vanilla_gpt.py (vanilla_gpt_pretrain_1gpu_h100_bf16_config: bare GPTModelProvider,
NullTokenizer, blend=None -> MockGPTDataset, BF16 mixed precision, torch_dist checkpoints) with small
sizes, and a MoE variant. Built from Bridge's config classes directly: importing
megatron.bridge.recipes pulls in diffusers."""


def tiny_gpt_config(*, moe=False, train_iters=20, global_batch_size=8, micro_batch_size=2, seq_length=128,
                    tp=1, num_weight_shards=None, expert_num_weight_shards=None, save_dir=None, load_dir=None,
                    save_interval=None, seed=1234, distributed_optimizer=False):
    """GPT of 2 layers, hidden 256, 4 heads, vocab 1024 (MoE: 4 experts, top-2, grouped GEMM).
    num_weight_shards = TP x G (None: GTP off). Overrides go on the returned ConfigContainer."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.training.config import (CheckpointConfig, ConfigContainer, DistributedInitConfig,
                                                 GPTDatasetConfig, LoggerConfig, OptimizerConfig, RNGConfig,
                                                 SchedulerConfig, TokenizerConfig, TrainingConfig, ValidationConfig)
    model = GPTModelProvider(num_layers=2, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4,
                             seq_length=seq_length,
                             tensor_model_parallel_size=tp, tensor_parallel_num_weight_shards=num_weight_shards,
                             make_vocab_size_divisible_by=128, attention_dropout=0.0, hidden_dropout=0.0)
    if moe:
        model.num_moe_experts = 4
        model.moe_router_topk = 2
        model.moe_ffn_hidden_size = 512
        model.moe_grouped_gemm = True
        model.moe_token_dispatcher_type = "alltoall"
        model.moe_aux_loss_coeff = 1e-2
        model.expert_tensor_parallel_num_weight_shards = expert_num_weight_shards
    return ConfigContainer(
        model=model,
        train=TrainingConfig(train_iters=train_iters, global_batch_size=global_batch_size,
                             micro_batch_size=micro_batch_size),
        validation=ValidationConfig(eval_interval=10, eval_iters=2),
        optimizer=OptimizerConfig(optimizer="adam", lr=3e-4, min_lr=3e-5, weight_decay=0.1, bf16=True,
                                  adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0,
                                  use_distributed_optimizer=distributed_optimizer),
        scheduler=SchedulerConfig(lr_decay_style="cosine", lr_warmup_iters=2, start_weight_decay=0.033,
                                  end_weight_decay=0.033, weight_decay_incr_style="constant"),
        ddp=DistributedDataParallelConfig(check_for_nan_in_grad=True, grad_reduce_in_fp32=True,
                                          overlap_grad_reduce=False, overlap_param_gather=False,
                                          use_distributed_optimizer=distributed_optimizer),
        dataset=GPTDatasetConfig(random_seed=seed, seq_length=seq_length, blend=None, blend_per_split=None,
                                 split="9999,8,2", dataloader_type="single", reset_position_ids=False,
                                 reset_attention_mask=False, eod_mask_loss=False, num_workers=0),
        logger=LoggerConfig(log_interval=1),
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=1024),
        checkpoint=CheckpointConfig(save=save_dir, load=load_dir, save_interval=save_interval, ckpt_format="torch_dist"),
        rng=RNGConfig(seed=seed),
        dist=DistributedInitConfig(use_gloo_process_groups=False),
        mixed_precision="bf16_mixed",
    )
