"""Shampoo over ``torch.distributed`` ranks: which rank owns what, the sharded step,
checkpoints, DTensor parameters, and cluster sizing (``matroot plan``)."""
