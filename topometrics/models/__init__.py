"""Models: our GPT, its tokenizers (characters or a byte-level BPE) and schedule, self-describing checkpoints,
and any decoder's linear layers.

Entry points: ``model.GPT`` / ``model.GPTConfig``; ``tokens.encode`` / ``tokens.load_tokens`` / ``tokens.token_bytes``;
``bpe.train_bpe`` / ``bpe.load_bpe``;
``lr_schedule.Schedule``; ``checkpoints.save_checkpoint`` / ``list_checkpoints`` / ``load_model``;
``architectures.module_layers`` / ``checkpoint_layers`` (linear layers of a Hugging Face decoder under
canonical names). Nothing here computes a feature or trains.
"""
