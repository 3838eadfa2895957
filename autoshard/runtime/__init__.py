"""Running plans on torch.distributed: mesh process groups and autograd-correct collectives."""
