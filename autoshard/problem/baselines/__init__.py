"""Plans people run, as choices of the same problem: Megatron-LM's tensor parallelism
(megatron.py) and torchtitan's FSDP + TP recipes (torchtitan.py)."""
