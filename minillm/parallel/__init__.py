"""More than one device: one model split across ranks (tensor parallelism) over torch.distributed.

shard.py   how a layer is split: column-parallel then row-parallel matmuls, an all-reduce after each pair
runner.py  rank 0: the engine's runner, which starts the workers and hands each step's plan to them
worker.py  ranks 1 .. tp-1: the same forward on their share, nothing else
"""
